/* router.h - the MoE router's logits in fp32, alone or followed by the routing (top-k and the
 * routing weights, the bits of moe's rw_moe_route_cuda) in the same launch. Launchers in router.cu,
 * reference in router_ref.c (and rw_moe_route_ref for the routing); conventions in common.h. */
#ifndef RW_WORKER_KERNELS_ROUTER_H
#define RW_WORKER_KERNELS_ROUTER_H

#include "common.h"
#include "rw_moe.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Router logits in fp32: y [n, E] = x [n, H] fp32 . w [E, H] bf16 (upcast exactly), every
 * product exact and the sums in an order fixed by H. H % 8 == 0, x and w 16-byte aligned. A
 * token's logits do not depend on the rest of the batch (bit for bit). */
void rw_k_router_ref(const float *x, const uint16_t *w, int64_t n, int64_t E, int64_t H, float *y);
rw_status rw_k_router(const float *x, const uint16_t *w, int64_t n, int64_t E, int64_t H, float *y,
                      rw_stream s, rw_err *err);

/* rw_k_router, then the routing of every token from its logits y: ids [n, k] and wts [n, k] as
 * rw_moe_route_cuda(y, n, E, k, renorm, ...) writes them, bit for bit. cnt: ncnt >=
 * rw_k_router_counters(n) int32 counters, zero before the call and zero after it (the routing
 * runs in the CTA that finishes a group of tokens). E <= 1024, k <= 32. */
#define RW_K_ROUTER_GROUP 8 /* the fewest tokens a group (one counter each) */
int64_t rw_k_router_counters(int64_t max_n);
rw_status rw_k_router_topk(const float *x, const uint16_t *w, int64_t n, int64_t E, int64_t H,
                           int k, bool renorm, float *y, int32_t *ids, float *wts, int32_t *cnt,
                           int64_t ncnt, rw_stream s, rw_err *err);
/* rw_k_router_topk for a step of one token group (n <= RW_K_ROUTER_GROUP), which also sorts the
 * n k assignments by expert into sort's places (rw_moe_experts_cuda_sort_dest for E experts, n
 * tokens and k), in the CTA that routes them: the expert layer then runs presorted
 * (rw_moe_experts_cuda_presorted) and the step has one launch less a layer. The sort is moe's
 * (sort.cuh), so the same off, tiles, perm and inv as the expert layer's own sort. */
rw_status rw_k_router_topk_sort(const float *x, const uint16_t *w, int64_t n, int64_t E, int64_t H,
                                int k, bool renorm, float *y, int32_t *ids, float *wts,
                                int32_t *cnt, int64_t ncnt, const rw_moe_sort_dest *sort,
                                rw_stream s, rw_err *err);
/* rw_k_add_rmsnorm(x, add, nw, n, H, eps, out_hi, out_lo, NULL) (norm_rope.h) and then
 * rw_k_router_topk_sort on its normed rows, in one launch: every CTA norms the rows itself with
 * the norm kernel's arithmetic, so x, out_hi, out_lo, y, ids, wts and the sort are the same bits
 * as the two calls write (the normed rows are not written in fp32). A batch-1 step waits for one
 * launch less a layer. H <= RW_K_ROUTER_NORM_MAX_H, a multiple of 4; add 16-byte aligned. */
#define RW_K_ROUTER_NORM_MAX_H 2048
/* Whether rw_k_add_rmsnorm_router_topk_sort takes rows of H (the launcher's shape check). */
static inline bool rw_k_router_norm_fits(int64_t H) {
    return H <= RW_K_ROUTER_NORM_MAX_H && H % 4 == 0;
}
rw_status rw_k_add_rmsnorm_router_topk_sort(float *x, const float *add, const uint16_t *nw,
                                            float eps, uint16_t *out_hi, uint16_t *out_lo,
                                            const uint16_t *w, int64_t n, int64_t E, int64_t H,
                                            int k, bool renorm, float *y, int32_t *ids, float *wts,
                                            int32_t *cnt, int64_t ncnt,
                                            const rw_moe_sort_dest *sort, rw_stream s, rw_err *err);

#ifdef __cplusplus
}
#endif

#endif
