/* sampler.c - the sampling rule (CPU reference): greedy, temperature, top-k, top-p, a uniform draw
 * that depends only on (seed, position), the logprob of the sampled token under the raw
 * distribution, and the top-n logprobs. The rule is documented at rw_sampling in rw_worker.h; the
 * CUDA sampler (kernels/sample.cu) implements the same one with fixed-point masses. */
#include <math.h>
#include <stdlib.h>

#include "internal.h"
#include "kernels/sample.h"

rw_sampling rw_sampling_default(void) {
    return (rw_sampling){.temperature = 0.0f, .top_p = 1.0f, .top_k = 0, .max_new_tokens = 16};
}

float rw_sample_uniform(uint64_t seed, int64_t position) {
    return rw_sample_uniform_dev(seed, position);
}

rw_status rw_sample_row_ref(const float *logits, int V, const rw_sampling *sp, int64_t position,
                            void *scratch, int32_t *token, float *logprob, int32_t *top_ids,
                            float *top_lps, rw_err *err) {
    if (!logits || !sp || !token || V <= 0)
        RW_FAIL(err, RW_E_INVALID_ARG, "sample: NULL argument or V = %d", V);
    /* log-softmax normaliser of the raw logits */
    float mx = -INFINITY;
    int32_t arg = 0;
    for (int i = 0; i < V; i++)
        if (logits[i] > mx) {
            mx = logits[i];
            arg = i;
        }
    if (!isfinite(mx)) RW_FAIL(err, RW_E_RANGE, "sample: logits are not finite (max %g)", mx);
    double se = 0.0;
    for (int i = 0; i < V; i++)
        se += exp((double)logits[i] - mx);
    const float lse = mx + (float)log(se);

    int32_t tok = arg;
    /* 0: greedy, also for a temperature too small to invert (sample.h) */
    const float inv_t = rw_sample_inv_temperature(sp->temperature, sp->top_k, mx);
    if (inv_t > 0.0f) {
        if (!scratch) RW_FAIL(err, RW_E_INVALID_ARG, "sample: NULL scratch");
        rw_sample_zid *s = scratch;
        const float zmax = mx * inv_t;
        float thr;
        const int nk = (int)rw_sample_sort_top_k(logits, V, inv_t, sp->top_k, s, &thr);
        if (sp->top_p < 1.0f) {
            double tot = 0.0;
            for (int i = 0; i < nk; i++)
                tot += exp((double)s[i].z - zmax);
            double cum = 0.0;
            for (int i = 0; i < nk; i++) {
                cum += exp((double)s[i].z - zmax);
                if (cum >= (double)sp->top_p * tot) {
                    if (s[i].z > thr) thr = s[i].z;
                    break;
                }
            }
        }
        /* draw over the kept set in ascending id order */
        double tot = 0.0;
        for (int i = 0; i < V; i++) {
            const float z = logits[i] * inv_t;
            if (z >= thr) tot += exp((double)z - zmax);
        }
        const double target = (double)rw_sample_uniform(sp->seed, position) * tot;
        double cum = 0.0;
        tok = -1;
        for (int i = 0; i < V; i++) {
            const float z = logits[i] * inv_t;
            if (z < thr) continue;
            cum += exp((double)z - zmax);
            tok = i;
            if (cum > target) break;
        }
        if (tok < 0) tok = arg;
    }
    *token = tok;
    if (logprob) *logprob = logits[tok] - lse;
    if (sp->top_logprobs > 0 && top_ids && top_lps) {
        const int n = sp->top_logprobs < V ? sp->top_logprobs : V;
        rw_sample_top_n(logits, V, n, lse, top_ids, top_lps);
    }
    return RW_OK;
}
