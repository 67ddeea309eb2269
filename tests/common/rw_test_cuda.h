/* rw_test_cuda.h - the CUDA assertion of the GPU tests: RW_TCK(call) fails the running cmocka test
 * with the call as written and the CUDA error string. Include after rw_test.h, in CUDA builds. */
#ifndef RW_TEST_CUDA_H
#define RW_TEST_CUDA_H

#include <cuda_runtime.h>

#include "rw_test.h"

#define RW_TCK(x)                                                                                  \
    do {                                                                                           \
        cudaError_t rw_tck_ = (x);                                                                 \
        if (rw_tck_ != cudaSuccess)                                                                \
            fail_msg("%s: %s (%s:%d)", #x, cudaGetErrorString(rw_tck_), __FILE__, __LINE__);      \
    } while (0)

#endif
