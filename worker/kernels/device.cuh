/* device.cuh - device helpers shared by the kernel families of worker/kernels/ (CUDA C++ only):
 * bf16 <-> fp32 of one value, the fixed-tree block sum, and the launch check every launcher
 * ends with. The PTX wrappers (cp.async, ldmatrix, mma) are core/mma.cuh. */
#ifndef RW_WORKER_KERNELS_DEVICE_CUH
#define RW_WORKER_KERNELS_DEVICE_CUH

#include <cuda_runtime.h>
#include <stdint.h>

#include "common.h"

static __device__ __forceinline__ float b2f(uint16_t b) {
    return __uint_as_float((uint32_t)b << 16);
}
static __device__ __forceinline__ uint16_t f2b(float f) {
    return rw_f32_to_bf16(f);
}

/* Block-wide sum with a fixed tree (blockDim.x a multiple of 32, <= 1024); sh holds 33 floats. */
static __device__ float block_sum(float v, float *sh) {
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    __syncthreads();
    if (lane == 0) sh[w] = v;
    __syncthreads();
    if (w == 0) {
        v = lane < nw ? sh[lane] : 0.0f;
#pragma unroll
        for (int o = 16; o > 0; o >>= 1)
            v += __shfl_xor_sync(0xffffffffu, v, o);
        if (lane == 0) sh[32] = v;
    }
    __syncthreads();
    return sh[32];
}

/* Every launcher's last line: cudaGetLastError (and a synchronize under RW_CUDA_SYNC=1). */
#define LAUNCH_CHECK(s, what) RW_LAUNCH_CHECK(s, what, err)

#endif
