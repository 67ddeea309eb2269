/* router.h - the MoE router's logits in fp32 (top-k and the routing weights are moe's
 * rw_moe_route_cuda). Launcher in router.cu, reference in router_ref.c; conventions in common.h. */
#ifndef RW_WORKER_KERNELS_ROUTER_H
#define RW_WORKER_KERNELS_ROUTER_H

#include "common.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Router logits in fp32: y [n, E] = x [n, H] fp32 . w [E, H] bf16 (upcast exactly). H % 8 == 0,
 * x and w 16-byte aligned. A token's logits do not depend on the rest of the batch (bit for bit).
 */
void rw_k_router_ref(const float *x, const uint16_t *w, int64_t n, int64_t E, int64_t H, float *y);
rw_status rw_k_router(const float *x, const uint16_t *w, int64_t n, int64_t E, int64_t H, float *y,
                      rw_stream s, rw_err *err);

#ifdef __cplusplus
}
#endif

#endif
