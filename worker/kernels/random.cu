/* random.cu - the device generator of seeded random bf16 tensors (random.h). */
#include <cuda_runtime.h>
#include <stdint.h>

#include "device.cuh"
#include "rand.h"
#include "random.h"

__global__ void fill_bf16_kernel(uint16_t *p, int64_t n, uint64_t seed, float mean, float std) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x)
        p[i] = rw_rand_bf16_at(seed, (uint64_t)i, mean, std);
}

extern "C" rw_status rw_k_fill_bf16(uint16_t *p, int64_t n, uint64_t seed, float mean, float std,
                                    rw_stream s, rw_err *err) {
    if (n <= 0) return RW_OK;
    fill_bf16_kernel<<<2048, 256, 0, (cudaStream_t)s>>>(p, n, seed, mean, std);
    return LAUNCH_CHECK(s, "fill bf16");
}
