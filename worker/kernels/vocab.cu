/* vocab.cu - the embedding lookup and the logits gather (vocab.h); references in vocab_ref.c. */
#include <cuda_runtime.h>
#include <stdint.h>

#include "device.cuh"
#include "launch.cuh"
#include "vocab.h"

__global__ void embed_kernel(const int32_t *tok, int64_t n, const uint16_t *emb, int64_t v_begin,
                             int64_t v_local, int64_t H, float *x) {
    rw_pdl_begin();
    const int64_t t = blockIdx.x;
    const int64_t r = (int64_t)tok[t] - v_begin;
    const bool mine = r >= 0 && r < v_local;
    for (int64_t i = threadIdx.x; i < H; i += blockDim.x)
        x[t * H + i] = mine ? b2f(emb[r * H + i]) : 0.0f;
}

extern "C" rw_status rw_k_embed(const int32_t *tok, int64_t n, const uint16_t *emb, int64_t v_begin,
                                int64_t v_local, int64_t H, float *x, rw_stream s, rw_err *err) {
    if (n <= 0) return RW_OK;
    (void)rw_launch_pdl(embed_kernel, dim3((unsigned)n), 256, 0, (cudaStream_t)s, tok, n, emb,
                        v_begin, v_local, H, x);
    return LAUNCH_CHECK(s, "embed");
}

__global__ void logits_gather_kernel(const float *g, int64_t n, int64_t vl, int64_t V, float *out) {
    rw_pdl_begin();
    const int64_t r = blockIdx.y;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < V;
         i += (int64_t)gridDim.x * blockDim.x)
        out[r * V + i] = g[((i / vl) * n + r) * vl + i % vl];
}

extern "C" rw_status rw_k_logits_gather(const float *g, int T, int64_t n, int64_t vl, int64_t V,
                                        float *out, rw_stream s, rw_err *err) {
    if (n <= 0) return RW_OK;
    if (V > (int64_t)T * vl)
        RW_FAIL(err, RW_E_SHAPE, "logits gather: V %lld > %d x %lld", (long long)V, T,
                (long long)vl);
    dim3 grid(64, (unsigned)n);
    (void)rw_launch_pdl(logits_gather_kernel, grid, 256, 0, (cudaStream_t)s, g, n, vl, V, out);
    return LAUNCH_CHECK(s, "logits gather");
}
