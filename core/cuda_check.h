/* cuda_check.h - the one way rw turns a failed CUDA runtime, NCCL or cuBLAS call into an rw_status.
 *
 * Every module that calls a foreign GPU library includes this header instead of writing its own
 * check, so that the same failure is reported the same way everywhere:
 *   - a failed allocation (cudaErrorMemoryAllocation, ncclSystemError from a failed allocation
 *     cannot be told apart and stays RW_E_NCCL) is RW_E_OOM; any other runtime failure RW_E_CUDA,
 *     NCCL RW_E_NCCL, cuBLAS RW_E_CUDA;
 *   - the message is "<the call as written>: <the library's error string>" at file:line;
 *   - the CUDA runtime's per-thread last error is cleared after a failure, so the next launch check
 *     (RW_LAUNCH_CHECK, which reads cudaGetLastError) does not report this failure as its own. A
 *     sticky error (a kernel fault) cannot be cleared: every later call reports it, which is right.
 *
 * Forms (err is an rw_err * or NULL):
 *   RW_CUDA_CHECK(err, call)                  return the status on failure
 *   RW_CUDA_CHECKGOTO(err, call, st, label)   store it in st and goto label (one cleanup label)
 *   rw_cuda_fail(err, e, file, line, what)     the mapping itself, for calls whose failure needs
 *                                              context of its own (returns the status)
 * and the same three for NCCL (RW_NCCL_CHECK...) and cuBLAS (RW_CUBLAS_CHECK...), defined when
 * nccl.h / cublasLt.h was included before this header.
 *
 * C and CUDA C++; include only in builds with CUDA (RW_HAVE_CUDA). */
#ifndef RW_CUDA_CHECK_H
#define RW_CUDA_CHECK_H

#include <cuda_runtime.h>

#include "rw_core.h"

#ifdef __cplusplus
extern "C" {
#endif

static inline rw_status rw_cuda_fail(rw_err *err, cudaError_t e, const char *file, int line,
                                     const char *what) {
    (void)cudaGetLastError();
    return rw_err_set(err, e == cudaErrorMemoryAllocation ? RW_E_OOM : RW_E_CUDA, file, line,
                      "%s: %s", what, cudaGetErrorString(e));
}

#define RW_CUDA_CHECK(err, call)                                                                   \
    do {                                                                                           \
        cudaError_t rw_ce_ = (call);                                                               \
        if (rw_ce_ != cudaSuccess) return rw_cuda_fail((err), rw_ce_, __FILE__, __LINE__, #call);  \
    } while (0)

#define RW_CUDA_CHECKGOTO(err, call, st, label)                                                    \
    do {                                                                                           \
        cudaError_t rw_ce_ = (call);                                                               \
        if (rw_ce_ != cudaSuccess) {                                                               \
            (st) = rw_cuda_fail((err), rw_ce_, __FILE__, __LINE__, #call);                         \
            goto label;                                                                            \
        }                                                                                          \
    } while (0)

#if defined(NCCL_MAJOR)
static inline rw_status rw_nccl_fail(rw_err *err, ncclResult_t r, const char *file, int line,
                                     const char *what) {
    return rw_err_set(err, RW_E_NCCL, file, line, "%s: %s", what, ncclGetErrorString(r));
}
#define RW_NCCL_CHECK(err, call)                                                                   \
    do {                                                                                           \
        ncclResult_t rw_nr_ = (call);                                                              \
        if (rw_nr_ != ncclSuccess) return rw_nccl_fail((err), rw_nr_, __FILE__, __LINE__, #call);  \
    } while (0)
#define RW_NCCL_CHECKGOTO(err, call, st, label)                                                    \
    do {                                                                                           \
        ncclResult_t rw_nr_ = (call);                                                              \
        if (rw_nr_ != ncclSuccess) {                                                               \
            (st) = rw_nccl_fail((err), rw_nr_, __FILE__, __LINE__, #call);                         \
            goto label;                                                                            \
        }                                                                                          \
    } while (0)
#endif

#if defined(CUBLAS_VER_MAJOR)
static inline rw_status rw_cublas_fail(rw_err *err, cublasStatus_t s, const char *file, int line,
                                       const char *what) {
    (void)cudaGetLastError();
    return rw_err_set(err, s == CUBLAS_STATUS_ALLOC_FAILED ? RW_E_OOM : RW_E_CUDA, file, line,
                      "%s: cuBLAS status %d", what, (int)s);
}
#define RW_CUBLAS_CHECK(err, call)                                                                 \
    do {                                                                                           \
        cublasStatus_t rw_bs_ = (call);                                                            \
        if (rw_bs_ != CUBLAS_STATUS_SUCCESS)                                                       \
            return rw_cublas_fail((err), rw_bs_, __FILE__, __LINE__, #call);                       \
    } while (0)
#define RW_CUBLAS_CHECKGOTO(err, call, st, label)                                                  \
    do {                                                                                           \
        cublasStatus_t rw_bs_ = (call);                                                            \
        if (rw_bs_ != CUBLAS_STATUS_SUCCESS) {                                                     \
            (st) = rw_cublas_fail((err), rw_bs_, __FILE__, __LINE__, #call);                       \
            goto label;                                                                            \
        }                                                                                          \
    } while (0)
#endif

#ifdef __cplusplus
}
#endif

#endif /* RW_CUDA_CHECK_H */
