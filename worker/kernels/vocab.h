/* vocab.h - the vocabulary-parallel ends of the model: the embedding lookup (each rank holds rows
 * [v_begin, v_begin + v_local) of the embedding) and the gather of the lm_head's per-rank logits
 * into full rows. Launchers in vocab.cu, references in vocab_ref.c; conventions in common.h. */
#ifndef RW_WORKER_KERNELS_VOCAB_H
#define RW_WORKER_KERNELS_VOCAB_H

#include "common.h"

#ifdef __cplusplus
extern "C" {
#endif

/* x [n, H] fp32 = emb [v_local, H] bf16 row (tok - v_begin), or zeros when the token belongs to
 * another rank's vocabulary rows. */
void rw_k_embed_ref(const int32_t *tok, int64_t n, const uint16_t *emb, int64_t v_begin,
                    int64_t v_local, int64_t H, float *x);
rw_status rw_k_embed(const int32_t *tok, int64_t n, const uint16_t *emb, int64_t v_begin,
                     int64_t v_local, int64_t H, float *x, rw_stream s, rw_err *err);

/* Logits from the vocab-parallel lm_head: g [T, n, vl] (rank-major, as all-gathered) ->
 * out [n, V] (V <= T * vl; the zero rows past V are dropped). */
void rw_k_logits_gather_ref(const float *g, int T, int64_t n, int64_t vl, int64_t V, float *out);
rw_status rw_k_logits_gather(const float *g, int T, int64_t n, int64_t vl, int64_t V, float *out,
                             rw_stream s, rw_err *err);

#ifdef __cplusplus
}
#endif

#endif
