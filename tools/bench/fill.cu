/* fill.cu - random bf16 data on the device for rw-bench (weights, GEMM inputs, copy sources):
 * benchmarks never time zeros. Values are hashed from (seed, index), so a fill is reproducible. */
#include <cuda_runtime.h>
#include <stdint.h>

#include "rand.h"
#include "rw_core.h"

/* Element i = rw_rand_bf16_at(seed, i, mean, std) (core/rand.h): the one random-fill rule, a
 * bounded near-normal value (|g| < 3.47) that keeps random weights finite in any format. */
__global__ void rwb_fill_bf16_kernel(uint16_t *dst, uint64_t n, uint64_t seed, float mean,
                                     float stdv) {
    const uint64_t stride = (uint64_t)gridDim.x * blockDim.x;
    for (uint64_t i = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
        dst[i] = rw_rand_bf16_at(seed, i, mean, stdv);
}

extern "C" cudaError_t rwb_fill_bf16_launch(void *dst, uint64_t n, uint64_t seed, float mean,
                                            float stdv, cudaStream_t s) {
    if (n == 0) return cudaSuccess;
    int dev = 0, sms = 0;
    cudaError_t e = cudaGetDevice(&dev);
    if (e == cudaSuccess) e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
    if (e != cudaSuccess) return e;
    uint64_t want = (n + 255) / 256;
    uint64_t cap = (uint64_t)sms * 16;
    unsigned blocks = (unsigned)(want < cap ? want : cap);
    rwb_fill_bf16_kernel<<<blocks, 256, 0, s>>>((uint16_t *)dst, n, seed, mean, stdv);
    return cudaGetLastError();
}
