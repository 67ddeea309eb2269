/* expert_sort.cu - the expert layer's sort of assignments by expert and its tile schedule
 * (experts_internal.cuh: moe_sort_launch); the pipeline is described in experts.cu. */
#include <cuda_runtime.h>
#include <stdint.h>

#include "cuda_check.h"
#include "experts_internal.cuh"
#include "launch.cuh"
#include "sort.cuh"

__global__ void __launch_bounds__(1024)
    sort_kernel(const int32_t *__restrict__ ids, int64_t A, int E, int tn,
                int32_t *__restrict__ off, int2 *__restrict__ tiles, int32_t *__restrict__ ntiles,
                int32_t *__restrict__ perm, int32_t *__restrict__ inv) {
    rw_pdl_begin();
    __shared__ int32_t wc[SORT_WC]; /* [pw][E]: counts, then bases, then cursors */
    __shared__ int32_t eoff[1024];  /* first sorted row of each expert */
    rw_moe_sort_cta(ids, A, E, tn, off, tiles, ntiles, perm, inv, wc, eoff);
}

rw_status moe_sort_launch(const int32_t *ids, int64_t A, int E, int tn, int32_t *off, int2 *tiles,
                          int32_t *ntiles, int32_t *perm, int32_t *inv, cudaStream_t st,
                          rw_err *err) {
    (void)rw_launch_pdl(sort_kernel, dim3(1), 1024, 0, st, ids, A, E, tn, off, tiles, ntiles, perm,
                        inv);
    return RW_LAUNCH_CHECK((rw_stream)st, "moe sort", err);
}
