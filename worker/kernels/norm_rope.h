/* norm_rope.h - the normalisations of the forward pass: RMSNorm of the residual stream (fused with
 * the residual add, writing the next GEMM's hi + lo input pair) and, per attention head, the q/k
 * RMSNorm, RoPE and the write of K and V into the paged cache. Launchers in norm_rope.cu,
 * references in norm_rope_ref.c; conventions and the hi + lo pair in common.h.
 *
 * Every output row is computed by one CTA (norms) or one warp (heads) in an order fixed by H or
 * hd alone, so a token's values do not depend on the rest of the batch. */
#ifndef RW_WORKER_KERNELS_NORM_ROPE_H
#define RW_WORKER_KERNELS_NORM_ROPE_H

#include "common.h"

#ifdef __cplusplus
extern "C" {
#endif

/* When y != NULL: x += y first (x is updated). Then v = w * (x * rsqrt(mean(x^2) + eps)) goes to
 * out_hi / out_lo as a hi + lo pair and, when out_f32 != NULL, in fp32. x, y [n, H] fp32; w [H]
 * bf16. */
void rw_k_add_rmsnorm_ref(float *x, const float *y, const uint16_t *w, int64_t n, int64_t H,
                          float eps, uint16_t *out_hi, uint16_t *out_lo, float *out_f32);
rw_status rw_k_add_rmsnorm(float *x, const float *y, const uint16_t *w, int64_t n, int64_t H,
                           float eps, uint16_t *out_hi, uint16_t *out_lo, float *out_f32,
                           rw_stream s, rw_err *err);

/* The experts' combine of the previous layer fused into this norm: x[t] += sum_j wts[t k + j] *
 * y[inv[t k + j]] (j in order, one fmaf each from 0, rows inv < 0 skipped: the combine of
 * rw_moe_experts_cuda, the same bits), then rw_k_add_rmsnorm(x, NULL, ...). y [rows, H] fp32,
 * inv and wts [n, k]. H <= RW_K_COMBINE_MAX_H, k <= RW_K_COMBINE_MAX_K. */
#define RW_K_COMBINE_MAX_H 2048
#define RW_K_COMBINE_MAX_K 8
void rw_k_combine_rmsnorm_ref(float *x, const float *y, const int32_t *inv, const float *wts, int k,
                              const uint16_t *w, int64_t n, int64_t H, float eps,
                              uint16_t *out_hi, uint16_t *out_lo, float *out_f32);
rw_status rw_k_combine_rmsnorm(float *x, const float *y, const int32_t *inv, const float *wts,
                               int k, const uint16_t *w, int64_t n, int64_t H, float eps,
                               uint16_t *out_hi, uint16_t *out_lo, float *out_f32, rw_stream s,
                               rw_err *err);

/* out_hi / out_lo [n, H]: row i = rmsnorm(x[rows[i]] (+ y[rows[i]] when y != NULL, written back
 * to x)). Rows must be distinct. */
void rw_k_rmsnorm_rows_ref(float *x, const float *y, const int32_t *rows, int64_t n,
                           const uint16_t *w, int64_t H, float eps, uint16_t *out_hi,
                           uint16_t *out_lo);
rw_status rw_k_rmsnorm_rows(float *x, const float *y, const int32_t *rows, int64_t n,
                            const uint16_t *w, int64_t H, float eps, uint16_t *out_hi,
                            uint16_t *out_lo, rw_stream s, rw_err *err);

/* Per-head RMSNorm of q and k (weights qn, kn [hd] bf16), RoPE (rotate-half, angle = pos *
 * inv_freq[i], inv_freq [hd/2] fp32), then q_out fp32 [n, nh, hd] and the K, V cache slots (bf16,
 * and the low halves of each pair where kv has them): slot[t] = block * bs + offset (negative:
 * not stored). q rows of nh*hd fp32 at row stride ldq;
 * k, v rows of nkv*hd at row stride ldkv (one fused [n, q|k|v] GEMM output works with
 * ldq = ldkv = (nh + 2 nkv) hd). */
void rw_k_qk_rope_kv_ref(const float *q, const float *k, const float *v, int64_t ldq, int64_t ldkv,
                         const uint16_t *qn, const uint16_t *kn, const int32_t *pos,
                         const int32_t *slot, int64_t n, int nh, int nkv, int hd, int bs,
                         const float *inv_freq, float eps, float *q_out, rw_kv_planes kv);
rw_status rw_k_qk_rope_kv(const float *q, const float *k, const float *v, int64_t ldq, int64_t ldkv,
                          const uint16_t *qn, const uint16_t *kn, const int32_t *pos,
                          const int32_t *slot, int64_t n, int nh, int nkv, int hd, int bs,
                          const float *inv_freq, float eps, float *q_out, rw_kv_planes kv,
                          rw_stream s, rw_err *err);

/* The references' building blocks, for the tests' emulation of the whole forward pass
 * (tests/common/cuda_emul.h): 1 / sqrt(mean(x[0..H)^2) + eps) summed in index order, and one
 * head's norm + RoPE (x [hd] fp32 -> out [hd], hd <= 1024, position pos). */
float rw_k_rms_scale_ref(const float *x, int64_t H, float eps);
void rw_k_head_norm_rope_ref(const float *x, const uint16_t *nw, int hd, float eps, int32_t pos,
                             const float *inv_freq, float *out);

#ifdef __cplusplus
}
#endif

#endif
