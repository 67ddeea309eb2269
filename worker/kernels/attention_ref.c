/* attention_ref.c - plain-C reference of the paged causal attention (attention.h): every key of
 * every query in one pass, fp32 math on the cache's values (hi + lo where it has the low halves),
 * the kernel's hi + lo output pair. */
#include <math.h>
#include <stdlib.h>

#include "attention.h"

/* Element i of a cache array and, when there is one, of its low halves: the value it stands for. */
static float kv_at(const uint16_t *hi, const uint16_t *lo, int64_t i) {
    return rw_bf16_to_f32(hi[i]) + (lo ? rw_bf16_to_f32(lo[i]) : 0.0f);
}

void rw_k_attention_ref(const float *q, rw_kv_planes kv, const rw_attn_tile *tiles, int ntiles,
                        const int32_t *pos, const int32_t *bt, int bt_stride, int nh, int nkv,
                        int hd, int bs, uint16_t *out_hi, uint16_t *out_lo) {
    const int group = nh / nkv;
    const float scale = 1.0f / sqrtf((float)hd);
    for (int ti = 0; ti < ntiles; ti++) {
        const rw_attn_tile *tl = &tiles[ti];
        const int32_t *blocks = bt + (int64_t)tl->seq * bt_stride;
        for (int i = 0; i < tl->ntok; i++) {
            const int64_t t = tl->tok0 + i;
            const int32_t p = pos[t];
            float *sc = malloc(sizeof(float) * (size_t)(p + 1));
            for (int h = 0; h < nh; h++) {
                const int g = h / group;
                float mx = -INFINITY;
                for (int32_t j = 0; j <= p; j++) {
                    const int64_t at = (((int64_t)blocks[j / bs] * nkv + g) * bs + j % bs) * hd;
                    float d = 0.0f;
                    for (int e = 0; e < hd; e++)
                        d += q[(t * nh + h) * hd + e] * kv_at(kv.k, kv.k_lo, at + e);
                    sc[j] = d * scale;
                    mx = sc[j] > mx ? sc[j] : mx;
                }
                float l = 0.0f;
                for (int32_t j = 0; j <= p; j++) {
                    sc[j] = expf(sc[j] - mx);
                    l += sc[j];
                }
                for (int e = 0; e < hd; e++) {
                    float o = 0.0f;
                    for (int32_t j = 0; j <= p; j++) {
                        const int64_t at = (((int64_t)blocks[j / bs] * nkv + g) * bs + j % bs) * hd;
                        o += sc[j] * kv_at(kv.v, kv.v_lo, at + e);
                    }
                    rw_k_store_split(o / l, out_hi, out_lo, (t * nh + h) * hd + e);
                }
            }
            free(sc);
        }
    }
}
