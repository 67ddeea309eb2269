/* gemv.cuh - rw_k_gemm's form for a few tokens (M <= 8) on weights whose K is split (gemv.cu):
 * internal to the dense GEMM (gemm.cu calls it, CUDA C++ only). */
#ifndef RW_WORKER_GEMV_CUH
#define RW_WORKER_GEMV_CUH

#include <stdbool.h>
#include <stdint.h>

#include "rw_core.h"

/* Y [M, N] = (x + x_lo) [M, K] . W [N, K]^T with K cut into S slices of `span` columns (the
 * slicing rw_k_gemm_splits and rw_k_gemm_slice_cols give), the same bits as rw_k_gemm's other
 * forms. Operands as rw_k_gemm checks them (gemm.h); no workspace. Launches and sets *done when
 * it applies: a build for sm_90a, 1 <= M <= 8, 2 <= S <= 8 (one thread-block cluster a tile) and
 * a weight the driver can describe for tensor copies; otherwise *done = false, nothing is
 * launched and the caller takes another form. */
rw_status rw_gemv_launch(const uint16_t *W, int64_t N, int64_t K, const uint16_t *x,
                         const uint16_t *x_lo, int64_t M, float *Y, int S, int64_t span,
                         rw_stream s, bool *done, rw_err *err);

#endif
