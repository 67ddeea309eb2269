/* route.cu - moe's routing kernel on the device (rw_moe.h: rw_moe_route_cuda): one warp per
 * token runs route.cuh's routing; the CPU reference is rw_moe_route_ref (route.c). */
#include <cuda_runtime.h>
#include <stdint.h>

#include "cuda_check.h"
#include "launch.cuh"
#include "route.cuh"
#include "rw_moe.h"

/* One warp per token (route.cuh). */
template <int EPL>
__global__ void route_kernel(const float *__restrict__ logits, int64_t ntok, int E, int k,
                             bool renorm, int32_t *__restrict__ ids, float *__restrict__ wts) {
    rw_pdl_begin();
    const int64_t t = (int64_t)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    if (t >= ntok) return;
    rw_moe_route_warp<EPL>(logits + t * E, E, k, renorm, ids + t * k, wts + t * k);
}

extern "C" rw_status rw_moe_route_cuda(const float *logits, int64_t ntok, int E, int k, bool renorm,
                                       int32_t *ids, float *weights, rw_stream s, rw_err *err) {
    if (ntok <= 0) return RW_OK;
    if (!rw_moe_route_supported(E, k))
        return rw_err_set(err, RW_E_UNSUPPORTED, __FILE__, __LINE__,
                          "moe route (cuda): E = %d (1..%d), k = %d (1..%d)", E, RW_MOE_MAX_E, k,
                          RW_MOE_MAX_TOPK);
    const int wpb = 8;
    const dim3 grid((unsigned)((ntok + wpb - 1) / wpb));
    const int epl = rw_moe_route_epl(E);
    auto kern = epl == 4    ? route_kernel<4>
                : epl == 8  ? route_kernel<8>
                : epl == 16 ? route_kernel<16>
                            : route_kernel<32>;
    (void)rw_launch_pdl(kern, grid, wpb * 32, 0, (cudaStream_t)s, logits, ntok, E, k, renorm, ids,
                        weights);
    return RW_LAUNCH_CHECK(s, "moe route", err);
}
