/* gemm.h - the CUDA backend's dense GEMM (gemm.cu) for the q/k/v, o_proj and lm_head projections,
 * and its plain-C reference (gemm_ref.c). Internal to the worker module.
 *
 * Why an own kernel: cuBLASLt picks its algorithm (tile shape, split-K) from the batch size, so a
 * token's logits change with the number of tokens it is batched with. This GEMM is batch
 * invariant: the bits of output row m depend only on input row m and on the weight. */
#ifndef RW_WORKER_GEMM_H
#define RW_WORKER_GEMM_H

#include "rw_core.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Y [M, N] fp32 row-major = (x + x_lo) [M, K] . W [N, K]^T on the device.
 *
 *   W     bf16 [N, K] row-major (a PyTorch Linear weight), 16-byte aligned;
 *   x     bf16 [M, K] row-major, 16-byte aligned;
 *   x_lo  bf16 [M, K] row-major, 16-byte aligned, or NULL: the low half of split activations
 *         (x = bf16(a), x_lo = bf16(a - x) carries an fp32 activation a to ~2^-16 relative);
 *         every k16 step then adds W.x and W.x_lo into the same fp32 accumulators, in that order;
 *   Y     fp32 [M, N] row-major, 4-byte aligned; must not overlap the inputs;
 *   ws    device workspace of ws_bytes >= rw_k_gemm_ws_bytes(N, K, M), 16-byte aligned, or NULL
 *         when that is 0. Its first RW_K_GEMM_COUNTERS 32-bit words must be zero before its first
 *         use (cudaMemset once after allocating it); every call leaves them zero, so the same
 *         workspace serves any number of calls in stream order. Calls that run concurrently need
 *         workspaces of their own.
 *
 * Shapes: M >= 0 (M == 0 returns RW_OK and touches nothing), N >= 1, K >= 8 and a multiple of 8.
 * Bad values -> RW_E_INVALID_ARG (NULL or misaligned pointer, M < 0, N < 1, K < 1, a missing or
 * short workspace) or RW_E_UNSUPPORTED (K not a multiple of 8, a grid too large), with a message
 * naming the value.
 *
 * Numerics: bf16 products are exact in fp32 and accumulate in fp32 (tensor cores). K is cut into
 * rw_k_gemm_splits(N, K) slices of whole 64-column blocks; each output element's slice sums are
 * accumulated by one thread over k in increasing order, and the slice sums are added in slice
 * order. No atomics on values. The result for row m is the same bits whatever M is, wherever row m
 * sits in the batch, and on every run.
 *
 * Asynchronous on stream s; no allocation and no host synchronisation, so it can be captured in
 * a CUDA graph. Without CUDA it returns RW_E_NO_DEVICE. */
rw_status rw_k_gemm(const uint16_t *W, int64_t N, int64_t K, const uint16_t *x,
                    const uint16_t *x_lo, int64_t M, float *Y, void *ws, size_t ws_bytes,
                    rw_stream s, rw_err *err);

/* The number of K slices of an [N, K] weight (1: K is not split): a function of N and K alone,
 * > 1 only for weights of fewer than 256 x 64 rows (o_proj, q/k/v), whose tiles alone cannot keep
 * every SM busy at small M. */
int rw_k_gemm_splits(int64_t N, int64_t K);

/* Columns of each of the S slices of K (a multiple of 64; K itself for S = 1); slice s covers
 * [s c, min((s + 1) c, K)), and every slice rw_k_gemm_splits chooses is non-empty. */
int64_t rw_k_gemm_slice_cols(int64_t K, int S);

/* Workspace bytes rw_k_gemm needs for an [N, K] weight and any number of rows up to M: 0 when K
 * is not split; otherwise the tile counters and the partials of min(M, RW_K_GEMM_SPLIT_ROWS)
 * rows (K's slices go to separate CTAs only up to that many rows; larger M needs none of it). */
size_t rw_k_gemm_ws_bytes(int64_t N, int64_t K, int64_t M);
#define RW_K_GEMM_COUNTERS 1024
#define RW_K_GEMM_SPLIT_ROWS 8

/* The same product on the host, accumulated in double and rounded once to fp32 (host pointers,
 * same layouts; x_lo may be NULL). A reference for tests, not an emulation of the kernel's
 * rounding. */
void rw_k_gemm_ref(const uint16_t *W, int64_t N, int64_t K, const uint16_t *x, const uint16_t *x_lo,
                   int64_t M, float *Y);

#ifdef __cplusplus
}
#endif

#endif
