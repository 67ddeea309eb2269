/* route.c - MoE routing reference: fp32 softmax over all router logits, top-k (ties to the lower
 * expert index), renormalisation of the selected weights when norm_topk_prob is set. The CUDA
 * routing (route.cuh, in route.cu and the worker's router) follows the same rules. */
#include <math.h>

#include "rw_moe.h"

/* logits [ntok, E] fp32 -> ids [ntok, k] (descending probability), weights [ntok, k] fp32.
 * The softmax is computed over all E logits before the top-k, as Hugging Face Qwen3-MoE does
 * (softmax, topk, then optional renormalisation), so without renormalisation the weights are the
 * full-softmax probabilities. */
void rw_moe_route_ref(const float *logits, int64_t ntok, int E, int k, bool renorm, int32_t *ids,
                      float *weights) {
    float prob[1024];
    for (int64_t t = 0; t < ntok; t++) {
        const float *l = logits + t * E;
        int32_t *id = ids + t * k;
        float *w = weights + t * k;
        /* E > 1024 is not a Qwen3-MoE shape; process it in the same way with a slower path that
         * recomputes probabilities instead of caching them. */
        float mx = -INFINITY;
        for (int e = 0; e < E; e++)
            mx = l[e] > mx ? l[e] : mx;
        float sum = 0.0f;
        for (int e = 0; e < E; e++)
            sum += expf(l[e] - mx);
        for (int e = 0; e < E && e < 1024; e++)
            prob[e] = expf(l[e] - mx) / sum;
        for (int j = 0; j < k; j++) {
            int best = -1;
            float bp = 0.0f;
            for (int e = 0; e < E; e++) {
                float p = e < 1024 ? prob[e] : expf(l[e] - mx) / sum;
                bool taken = false;
                for (int q = 0; q < j; q++)
                    taken |= id[q] == e;
                if (taken) continue;
                /* strict '>' keeps the lower index on ties; NaN never wins over a number */
                if (best < 0 || p > bp) {
                    best = e;
                    bp = p;
                }
            }
            id[j] = best;
            w[j] = bp;
        }
        if (renorm) {
            float s = 0.0f;
            for (int j = 0; j < k; j++)
                s += w[j];
            for (int j = 0; j < k; j++)
                w[j] = w[j] / s;
        }
    }
}
