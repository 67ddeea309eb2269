/* fill.cu - CUDA version of the benchmark fill (reference: fill.c, same element rule in fill.h):
 * a grid-stride kernel writing bf16 values generated from the element index. The grid is
 * bounded (at most 65536 blocks of 256 threads), so any element count (the 61 GB model is
 * 3e10 elements) launches the same grid and each thread strides over the rest; indices are
 * 64-bit. */
#include "rw_sync.h"

#include "fill.h"

#include <cuda_runtime.h>

__global__ void rw_sync_fill_bf16_kernel(uint16_t *dst, uint64_t n, uint64_t seed, float scale) {
    uint64_t stride = (uint64_t)gridDim.x * blockDim.x;
    for (uint64_t i = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
        dst[i] = rw_sync_fill_elem(seed, i, scale);
}

extern "C" rw_status rw_sync_fill_bf16_cuda(uint16_t *dst, uint64_t n, uint64_t seed, float std,
                                            rw_stream s, rw_err *err) {
    if (n == 0) return RW_OK;
    uint64_t blocks = (n + 255) / 256;
    if (blocks > 65536) blocks = 65536;
    /* the launch check reads the thread's last error: one left by an earlier failed call (already
     * reported by that call) must not be taken for this launch's */
    cudaGetLastError();
    rw_sync_fill_bf16_kernel<<<(unsigned)blocks, 256, 0, (cudaStream_t)s>>>(
        dst, n, seed, rw_sync_fill_scale(std));
    return RW_LAUNCH_CHECK(s, "rw_sync_fill_bf16_kernel", err);
}
