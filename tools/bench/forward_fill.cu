/* forward_fill.cu - device kernels of the forward-level benchmarks (forward.c, profile.c): fills
 * of quantized weights (e4m3 values, fp32 block scales) so the benchmarks never time zeros, and a
 * spin kernel the per-phase profiler queues a step behind. Each filled element depends only on
 * (seed, index), by core/rand.h's rule. */
#include <cuda_runtime.h>
#include <stdint.h>

#include "forward.h"
#include "rand.h"
#include "stamps.cuh"

__global__ void fill_e4m3_kernel(uint8_t *p, int64_t n, uint64_t seed) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x) {
        const uint64_t r = rw_rand_u64_at(seed, (uint64_t)i);
        /* sign, exponent field 1..6 (magnitudes 2^-6 .. < 1), any mantissa: never NaN */
        p[i] = (uint8_t)((r & 0x80u) | ((1u + (uint32_t)((r >> 8) % 6u)) << 3) | ((r >> 16) & 7u));
    }
}
__global__ void fill_f32_kernel(float *p, int64_t n, float v) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x)
        p[i] = v;
}
__global__ void fill_f32_rand_kernel(float *p, int64_t n, uint64_t seed) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x)
        p[i] = 2.0f * rw_rand_unit_at(seed, (uint64_t)i) - 1.0f;
}
__global__ void spin_kernel(uint64_t ns) {
    const uint64_t t0 = rw_stamp_now();
    while (rw_stamp_now() - t0 < ns) {
    }
}

extern "C" rw_status rwb_k_fill_e4m3(uint8_t *p, int64_t n, uint64_t seed, rw_stream s,
                                     rw_err *err) {
    if (n <= 0) return RW_OK;
    fill_e4m3_kernel<<<2048, 256, 0, (cudaStream_t)s>>>(p, n, seed);
    return RW_LAUNCH_CHECK(s, "fill e4m3", err);
}

extern "C" rw_status rwb_k_fill_f32(float *p, int64_t n, float value, rw_stream s, rw_err *err) {
    if (n <= 0) return RW_OK;
    fill_f32_kernel<<<2048, 256, 0, (cudaStream_t)s>>>(p, n, value);
    return RW_LAUNCH_CHECK(s, "fill f32", err);
}

extern "C" rw_status rwb_k_spin(uint64_t ns, rw_stream s, rw_err *err) {
    spin_kernel<<<1, 1, 0, (cudaStream_t)s>>>(ns);
    return RW_LAUNCH_CHECK(s, "spin", err);
}

extern "C" rw_status rwb_k_fill_f32_rand(float *p, int64_t n, uint64_t seed, rw_stream s,
                                         rw_err *err) {
    if (n <= 0) return RW_OK;
    fill_f32_rand_kernel<<<2048, 256, 0, (cudaStream_t)s>>>(p, n, seed);
    return RW_LAUNCH_CHECK(s, "fill f32 random", err);
}
