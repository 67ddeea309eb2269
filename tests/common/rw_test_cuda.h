/* rw_test_cuda.h - helpers for gpu-suite tests that call the CUDA runtime directly (include after
 * rw_test.h; CUDA builds only): RW_TCK(call) fails the running cmocka test with the call as written
 * and the CUDA error string (library calls that return rw_status use RW_ASSERT_OK from rw_test.h),
 * and host <-> device copies of test data. */
#ifndef RW_TEST_CUDA_H
#define RW_TEST_CUDA_H

#include <cuda_runtime_api.h>

#include "rw_test.h"

/* Fails the test when a CUDA runtime call does not return cudaSuccess. */
#define RW_TCK(x)                                                                                  \
    do {                                                                                           \
        cudaError_t rw_tck_ = (x);                                                                 \
        if (rw_tck_ != cudaSuccess) fail_msg("%s: %s", #x, cudaGetErrorString(rw_tck_));           \
    } while (0)

/* n bytes of device memory (at least 16), and a device copy of host h[0..n). */
static inline void *rw_tdev_alloc(size_t n) {
    void *d = NULL;
    RW_TCK(cudaMalloc(&d, n ? n : 16));
    return d;
}
static inline void *rw_tdev_put(const void *h, size_t n) {
    void *d = rw_tdev_alloc(n);
    if (n) RW_TCK(cudaMemcpy(d, h, n, cudaMemcpyHostToDevice));
    return d;
}
/* h[0..n) = device d after the device finished all work. */
static inline void rw_tdev_get(void *h, const void *d, size_t n) {
    RW_TCK(cudaDeviceSynchronize());
    RW_TCK(cudaMemcpy(h, d, n, cudaMemcpyDeviceToHost));
}

#endif
