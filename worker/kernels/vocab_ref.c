/* vocab_ref.c - plain-C references of the embedding lookup and the logits gather (vocab.h). */
#include "vocab.h"

void rw_k_embed_ref(const int32_t *tok, int64_t n, const uint16_t *emb, int64_t v_begin,
                    int64_t v_local, int64_t H, float *x) {
    for (int64_t t = 0; t < n; t++) {
        const int64_t r = (int64_t)tok[t] - v_begin;
        for (int64_t i = 0; i < H; i++)
            x[t * H + i] = (r >= 0 && r < v_local) ? rw_bf16_to_f32(emb[r * H + i]) : 0.0f;
    }
}

void rw_k_logits_gather_ref(const float *g, int T, int64_t n, int64_t vl, int64_t V, float *out) {
    for (int64_t r = 0; r < n; r++)
        for (int64_t i = 0; i < V; i++)
            out[r * V + i] = g[((i / vl) * n + r) * vl + i % vl];
    (void)T;
}
