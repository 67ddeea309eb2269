/* rw_test_cuda.h - the one assertion for CUDA runtime calls made directly by gpu tests:
 * RW_TCK(call) fails the running cmocka test with the call as written and the CUDA error string.
 * (Library calls that return rw_status use RW_ASSERT_OK from rw_test.h.) Include only in tests
 * built with CUDA. */
#ifndef RW_TEST_CUDA_H
#define RW_TEST_CUDA_H

#include <cuda_runtime_api.h>

#include "rw_test.h"

#define RW_TCK(x)                                                                                  \
    do {                                                                                           \
        cudaError_t rw_tck_e_ = (x);                                                               \
        if (rw_tck_e_ != cudaSuccess) fail_msg("%s: %s", #x, cudaGetErrorString(rw_tck_e_));      \
    } while (0)

#endif /* RW_TEST_CUDA_H */
