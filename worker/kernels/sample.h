/* sample.h - sampling on the device: n rows of logits -> token, logprob and top-n logprobs per
 * request, by the rule of rw_sampling (rw_worker.h) with fixed-point masses. Launcher in
 * sample.cu, reference in sample_ref.c (the CPU backend's own sampler is sampler.c). */
#ifndef RW_WORKER_KERNELS_SAMPLE_H
#define RW_WORKER_KERNELS_SAMPLE_H

#include <math.h>

#include "common.h"
#include "rand.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The sampler's uniform draw, shared by host and device: rw_rand_unit_at(seed, position) (rand.h).
 * rw_sample_uniform (rw_worker.h) is this function. */
RW_HD float rw_sample_uniform_dev(uint64_t seed, int64_t position) {
    return rw_rand_unit_at(seed, (uint64_t)position);
}

/* 1/T of a sampled draw, or 0 when the draw is greedy: temperature <= 0, top_k == 1, or a
 * temperature too small to invert in float arithmetic - 1/T, or the largest logit times it, is not
 * finite (about T < 3e-39, and above that for large logits). Such a T would turn every z =
 * logit / T into +-inf and every mass into NaN (the draw then ran off the end of the vocabulary);
 * softmax(logits / T) tends to the argmax as T -> 0, so greedy is its limit. One rule for the
 * CPU sampler (sampler.c), the kernel (sample.cu) and its reference (sample_ref.c). */
RW_HD float rw_sample_inv_temperature(float temperature, int32_t top_k, float max_logit) {
    if (!(temperature > 0.0f) || top_k == 1) return 0.0f;
    const float inv_t = 1.0f / temperature;
    if (!isfinite(inv_t) || !isfinite(max_logit * inv_t)) return 0.0f;
    return inv_t;
}

/* Sampling of n rows of logits [n, V] fp32 on the device, the rule of
 * rw_sampling (rw_worker.h) with one documented difference: probability masses are summed as
 * 32.32 fixed point (exp(z - zmax) * 2^32, truncated) in uint64, which makes the sums exact and
 * independent of the reduction order (so reruns give the same tokens); an id whose mass rounds
 * to zero is never drawn.
 * forced >= 0: no draw, the token is `forced` (scoring a given continuation).
 * mode 1 (processed logprobs, RW_LOGPROB_PROCESSED): the logprob of the token and the top-n are
 * z - zmax - log(S) over the kept set (z = logit / temperature; S = sum of exp(z - zmax) over the
 * kept ids, an fp32 fixed-tree block sum, so a row gives the same bits in any batch), -inf
 * outside it; greedy: 0 for the argmax, -inf elsewhere. The reference sums S in index order, so
 * they agree to rounding, not bits. */
typedef struct rw_k_sample_param {
    float temperature, top_p;
    int32_t top_k, top_n;
    uint64_t seed;
    int64_t position;
    int32_t row;    /* row of `logits` this request samples from */
    int32_t mode;   /* 0 raw, 1 processed logprobs */
    int32_t forced; /* >= 0: the token (no draw); -1: draw */
    int32_t pad;
} rw_k_sample_param;
typedef struct rw_k_sample_out {
    int32_t token;
    float logprob;
    int32_t top_ids[20];
    float top_lps[20];
} rw_k_sample_out;
/* n requests; request i samples row p[i].row of logits [rows, V] into out[i].
 *
 * The device version reduces each row in chunks of RW_K_SAMPLE_CHUNK ids, one CTA per (request,
 * chunk), before one CTA per request picks the token: the argmax, the normaliser sum
 * S = sum exp(l - max) (fp32, a fixed tree per chunk, the chunks added in order) and, for a
 * request without top-k / top-p limits, the kept masses (the draw's 32.32 fixed-point sum, exact;
 * the processed logprobs' fp32 sum, as S). The chunks are fixed by V alone, so a row gives the
 * same bits in any batch. A draw then walks only the chunk its target falls in. Requests with a
 * top-k or top-p limit (the threshold needs the whole row) and top-n lists read the whole row in
 * their request's CTA.
 *   ws: device workspace of at least rw_k_sample_ws_bytes(n, V) bytes, 16-byte aligned.
 * Asynchronous on s; no allocation. */
#define RW_K_SAMPLE_CHUNK 4096
typedef struct rw_k_sample_part { /* one (request, chunk) reduction, internal to sample.cu */
    float v;                      /* the chunk's largest logit, id i (ties to the lower id) */
    int32_t i;
    float se;             /* sum of exp(l - max) over the chunk, max over the row */
    float sk;             /* processed: sum of exp(z - zmax) */
    unsigned long long w; /* draw: sum of the 32.32 masses */
} rw_k_sample_part;
size_t rw_k_sample_ws_bytes(int64_t n, int64_t V);
void rw_k_sample_ref(const float *logits, int64_t n, int64_t V, const rw_k_sample_param *p,
                     rw_k_sample_out *out);
rw_status rw_k_sample(const float *logits, int64_t n, int64_t V, const rw_k_sample_param *p,
                      rw_k_sample_out *out, void *ws, size_t ws_bytes, rw_stream s, rw_err *err);

/* The CPU side shared by both sampling rules (sampler.c and sample_ref.c):
 * - (z, id) pairs ordered by descending z, ties to the lower id (a qsort comparator);
 * - s[0..V) = (logits[i] * inv_t, i) in that order, *thr = the top_k-th largest z (-inf when
 *   top_k is 0 or >= V), and the count of leading entries >= *thr (ties at the boundary kept);
 * - the top-n logprobs of a row: n passes, each taking the best entry after the previous one in
 *   the order (descending logit, ascending id); ids[j] and lps[j] = logits[id] - lse. */
typedef struct rw_sample_zid {
    float z;
    int32_t id;
} rw_sample_zid;
int rw_sample_zid_cmp(const void *a, const void *b);
int64_t rw_sample_sort_top_k(const float *logits, int64_t V, float inv_t, int top_k,
                             rw_sample_zid *s, float *thr);
void rw_sample_top_n(const float *logits, int64_t V, int n, float lse, int32_t *ids, float *lps);

#ifdef __cplusplus
}
#endif

#endif
