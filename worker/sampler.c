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

/* The rule of rw_sampling for one row: draws a token (force false) or takes `token` (force
 * true), then its logprob in sp->logprob_mode and the top-n. */
static rw_status sample_row(const float *logits, int V, const rw_sampling *sp, int64_t position,
                            void *scratch, bool force, int32_t *token, float *logprob,
                            int32_t *top_ids, float *top_lps, rw_err *err) {
    if (!logits || !sp || !token || V <= 0)
        RW_FAIL(err, RW_E_INVALID_ARG, "sample: NULL argument or V = %d", V);
    if (force && (*token < 0 || *token >= V))
        RW_FAIL(err, RW_E_RANGE, "sample: token %d outside [0, %d)", *token, V);
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

    int32_t tok = force ? *token : arg;
    /* inv_t 0: greedy, also for a temperature too small to invert (sample.h) */
    const float inv_ts = rw_sample_inv_temperature(sp->temperature, sp->top_k, mx);
    const bool greedy = inv_ts == 0.0f;
    const bool processed = sp->logprob_mode == RW_LOGPROB_PROCESSED;
    float inv_t = 1.0f, thr = -INFINITY;
    double kept = 1.0; /* sum of exp(z - zmax) over the kept set */
    if (!greedy && (!force || processed)) {
        if (!scratch) RW_FAIL(err, RW_E_INVALID_ARG, "sample: NULL scratch");
        rw_sample_zid *s = scratch;
        inv_t = inv_ts;
        const float zmax = mx * inv_t;
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
        /* the kept set's mass, in ascending id order (the draw walks the same order) */
        kept = 0.0;
        for (int i = 0; i < V; i++) {
            const float z = logits[i] * inv_t;
            if (z >= thr) kept += exp((double)z - zmax);
        }
        if (!force) {
            const double target = (double)rw_sample_uniform(sp->seed, position) * kept;
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
    }
    /* processed: the log-probability under the distribution the draw used (greedy: all mass on
     * the argmax); raw: log_softmax of the logits */
#define PROCESSED_LP(id)                                                                           \
    (greedy ? ((id) == arg ? 0.0f : -INFINITY)                                                     \
            : (logits[id] * inv_t >= thr                                                           \
                   ? (float)((double)(logits[id] * inv_t) - (double)(mx * inv_t) - log(kept))      \
                   : -INFINITY))
    *token = tok;
    if (logprob) *logprob = processed ? PROCESSED_LP(tok) : logits[tok] - lse;
    if (sp->top_logprobs > 0 && top_ids && top_lps) {
        const int n = sp->top_logprobs < V ? sp->top_logprobs : V;
        rw_sample_top_n(logits, V, n, lse, top_ids, top_lps);
        if (processed)
            for (int j = 0; j < n; j++)
                top_lps[j] = PROCESSED_LP(top_ids[j]);
    }
#undef PROCESSED_LP
    return RW_OK;
}

rw_status rw_sample_row_ref(const float *logits, int V, const rw_sampling *sp, int64_t position,
                            void *scratch, int32_t *token, float *logprob, int32_t *top_ids,
                            float *top_lps, rw_err *err) {
    return sample_row(logits, V, sp, position, scratch, false, token, logprob, top_ids, top_lps,
                      err);
}

rw_status rw_logprob_row_ref(const float *logits, int V, const rw_sampling *sp, int32_t token,
                             void *scratch, float *logprob, int32_t *top_ids, float *top_lps,
                             rw_err *err) {
    int32_t t = token;
    return sample_row(logits, V, sp, 0, scratch, true, &t, logprob, top_ids, top_lps, err);
}
