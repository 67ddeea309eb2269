/* attention_tile.cuh - the per-row arithmetic of the attention kernels (attention.cu), shared by
 * the prefill kernel (attention_prefill.cuh) and the decode kernel (attention_decode.cuh): key
 * staging, the q pair, one softmax block (atc_block; its decode forms are atc_block_t and, for
 * at most 8 rows, atc_block's PACK form), the merge of segments (attention_merge.cuh's) and the
 * stores. CUDA C++, included by attention.cu only.
 *
 * Rows. For a KV head g, a query row is (token, q head of g's group). A CTA (4 warps) takes a tile
 * of consecutive tokens of one sequence and that tile's rows, cut into 16-row MMA fragments. Keys
 * are staged in shared memory and reduced in softmax blocks of ATC_SB = 32 aligned positions, four
 * to a segment of RW_ATTN_SEG = 128.
 *
 * The arithmetic of one row (atc_block; the same instructions for every row, wherever it sits):
 *   q' = q * (1/sqrt(hd)) * log2(e) in fp32, as a bf16 pair qh = bf16(q'), ql = bf16(q' - qh);
 *   per segment s, from (m, l, o) = (-inf, 0, 0), per softmax block of 32 keys in order:
 *     S = fl(qh.K^T) + fl(ql.K^T) (mma.sync m16n8k16, fp32 accumulate, head-dim k16 steps in
 *         order); keys after the row's position -> -inf;
 *     mn = max(m, the row's 32 scores); c = 2^(m - mn), p = 2^(S - mn) (mn = -inf: c = p = 0);
 *     l = l*c + sum(p) (a fixed shuffle tree); o = o*c + bf16(p).V (key k16 steps in order;
 *         one bf16 per weight: its error, at most 2^-9 of each term, moved no routing decision
 *         on either fixture in the CPU emulation, docs/BENCHMARKS.md);
 *   segments merged in segment order by rw_attn_merge_ml (in the kernel, or in the combine kernel
 *   when segments are spread over CTAs: the same function, so the same bits); out = o / l.
 * An MMA computes each output element from its own row of A and column of B, so a row's result
 * does not depend on the other rows of its fragment (other tokens of a prefill tile, padding rows
 * of a decode tile) nor on which warp or CTA computes it. A key block past a row's position
 * leaves (m, l, o) unchanged exactly (c = 1, p = 0); keys past the tile's last position are
 * loaded as zeros, never read, so no stale non-finite value can reach a product. The q pair
 * keeps the scores to ~2^-16 relative (near-fp32) and doubles the QK tensor-core work, which
 * decode (memory-bound) does not notice and prefill pays (docs/BENCHMARKS.md); the weights are
 * one bf16 each.
 *
 * The high-precision mode (KP: the cache has low halves, attention.h) keeps that sequence and adds
 * to it: the keys and values are the pairs K + K_lo, V + V_lo, staged as two more planes of the
 * same layout (lo bytes `lo` after their hi plane), and the weights are a pair ph + pl as q is:
 *   S = fl(qh.K^T) + fl(ql.K^T + qh.K_lo^T) (in each k16 step ql.K then qh.K_lo into the lo sums);
 *   o = o*c + ph.V + pl.V + ph.V_lo (in each key k16 step, in that order).
 * The lo x lo products are left out (2^-16 of 2^-16). */
#ifndef RW_WORKER_KERNELS_ATTENTION_TILE_CUH
#define RW_WORKER_KERNELS_ATTENTION_TILE_CUH

#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>

#include "attention.h"
#include "attention_merge.cuh"
#include "device.cuh"
#include "mma.cuh"

#define ATC_THREADS 128
#define ATC_ROWS 64 /* rows per CTA: 4 warps x 16 */
#define ATC_KB 64   /* keys per staged block (shared memory) */
#define ATC_SB 32   /* keys per softmax block */
#define ATC_SEG RW_ATTN_SEG

/* Byte offset of 16-byte chunk c of key row r in a [64][HD] bf16 block, swizzled so that the 8
 * rows an ldmatrix reads at one chunk fall in 8 different bank groups. */
template <int HD> __host__ __device__ __forceinline__ constexpr int atc_swz_term(int r) {
    return HD == 32 ? (r >> 1) & 3 : r & 7;
}
template <int HD> __host__ __device__ __forceinline__ constexpr int atc_swz(int r, int c) {
    return r * (HD * 2) + ((c ^ atc_swz_term<HD>(r)) << 4);
}

/* atc_load_group's whole-group copies: the offset of chunk k of a thread whose first chunk is
 * column cc of row rl (c0 = cc ^ term(rl)), its rows RS apart, from that row's start */
template <int HD, int RS> __host__ __device__ constexpr int atc_swz_step(int c0, int k) {
    return k * RS * (HD * 2) + ((c0 ^ atc_swz_term<HD>(k * RS)) << 4);
}

/* Whether those copies put every chunk where atc_swz does: for row r0 + rl + k RS (r0 a multiple
 * of 16, rl < RS = NT / HD * 8, a power of two) the swizzle term is term(rl) XOR term(k RS).
 * Checked at compile time for each (HD, NT) the kernels use. */
template <int HD, int NT> __host__ __device__ constexpr bool atc_swz_steps_ok() {
    constexpr int CH = HD / 8, RS = NT / CH, RB = HD * 2;
    for (int r0 = 0; r0 < 64; r0 += 16)
        for (int rl = 0; rl < RS; rl++)
            for (int cc = 0; cc < CH; cc++)
                for (int k = 0; k < 16 / RS; k++) {
                    const int r = r0 + rl + k * RS;
                    const int step =
                        (r0 + rl) * RB + atc_swz_step<HD, RS>(cc ^ atc_swz_term<HD>(rl), k);
                    if (atc_swz<HD>(r, cc) != step) return false;
                }
    return true;
}


/* (x0, x1) as the bf16 pair registers hi = (bf16(x0), bf16(x1)), lo = (bf16(x0 - hi0),
 * bf16(x1 - hi1)), round to nearest even (the differences are exact in fp32). */
__device__ __forceinline__ void atc_split2(float x0, float x1, uint32_t &hi, uint32_t &lo) {
    hi = rw_pack_bf16x2(x0, x1);
    lo = rw_pack_bf16x2(__fsub_rn(x0, __uint_as_float(hi << 16)),
                        __fsub_rn(x1, __uint_as_float(hi & 0xffff0000u)));
}

/* The (token, head) index of row r of a tile's KV head g: the rows are the tile's tokens times
 * the group's query heads, token-major (token tok0 + r / group, head g * group + r % group). */
__device__ __forceinline__ int64_t atc_row_th(const rw_attn_tile &tl, int g, int group, int nh,
                                              int r) {
    return (int64_t)(tl.tok0 + r / group) * nh + g * group + r % group;
}

/* An output element: out_hi[at] = bf16(v) and, with out_lo, out_lo[at] = bf16(v - that). */
__device__ __forceinline__ void atc_put_out(uint16_t *__restrict__ out_hi,
                                            uint16_t *__restrict__ out_lo, int64_t at, float v) {
    const uint16_t hv = rw_f32_to_bf16(v);
    out_hi[at] = hv;
    if (out_lo) out_lo[at] = rw_bf16_split_lo(v, hv);
}

/* Two adjacent output elements (at even): atc_put_out's values, a 4-byte store each half. */
__device__ __forceinline__ void atc_put_out2(uint16_t *__restrict__ out_hi,
                                             uint16_t *__restrict__ out_lo, int64_t at, float v0,
                                             float v1) {
    const uint16_t h0 = rw_f32_to_bf16(v0), h1 = rw_f32_to_bf16(v1);
    *(uint32_t *)(out_hi + at) = (uint32_t)h0 | (uint32_t)h1 << 16;
    if (out_lo)
        *(uint32_t *)(out_lo + at) =
            (uint32_t)rw_bf16_split_lo(v0, h0) | (uint32_t)rw_bf16_split_lo(v1, h1) << 16;
}

/* A warp's q fragments for rows r0 = base + lane / 4 and r1 = r0 + 8 of the tile (zeros past
 * nrows), head-dim columns 16 ks + 2 (lane % 4) + {0, 1} (+ 8): q' = q * qscale as a bf16 pair
 * (qh, ql), and the rows' positions (INT_MAX past nrows: padding rows mask nothing, so they never
 * force the mask test; their results are never stored). */
template <int HD>
__device__ __forceinline__ void atc_load_q(const float *__restrict__ q,
                                           const int32_t *__restrict__ pos, const rw_attn_tile &tl,
                                           int g, int group, int nh, int nrows, int r0, int r1,
                                           float qscale, uint32_t (&qh)[HD / 16][4],
                                           uint32_t (&ql)[HD / 16][4], int32_t &qp0,
                                           int32_t &qp1) {
    const int lane = threadIdx.x & 31, c0 = 2 * (lane & 3);
    const float *q0 = nullptr, *q1 = nullptr;
    qp0 = qp1 = 0x7fffffff;
    if (r0 < nrows) {
        q0 = q + atc_row_th(tl, g, group, nh, r0) * HD;
        qp0 = pos[tl.tok0 + r0 / group];
    }
    if (r1 < nrows) {
        q1 = q + atc_row_th(tl, g, group, nh, r1) * HD;
        qp1 = pos[tl.tok0 + r1 / group];
    }
#pragma unroll
    for (int ks = 0; ks < HD / 16; ks++) {
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const float *qr = (i & 1) ? q1 : q0;
            const int col = ks * 16 + c0 + ((i & 2) ? 8 : 0);
            float v0 = 0.0f, v1 = 0.0f;
            if (qr) {
                const float2 v = *(const float2 *)(qr + col);
                v0 = __fmul_rn(v.x, qscale);
                v1 = __fmul_rn(v.y, qscale);
            }
            atc_split2(v0, v1, qh[ks][i], ql[ks][i]);
        }
    }
}

/* The key split's partials in L2. A split launch streams its keys once and writes partials
 * that the combine, the next kernel, reads once: the keys' copies are evict_first and the partial
 * o stores evict_last, so the partials wait in L2 while the keys pass through, and the combine
 * drops each line after reading it (rw_l2_discard128), so it is never written back. Cache hints
 * only: the same bits. At 32 x 8k on an H100 (Nsight Compute) the split kernel wrote 34.9 -> 10.8
 * MB and the combine read 32.5 -> 4.6 MB from DRAM; the pair 210 -> 199-200 us, b8 x 8k engine
 * steps 2.3% faster (docs/BENCHMARKS.md, forty-fourth session). */

/* Writes a warp's segment partial (m, l, o of rows r0, r1) for segment sg to part_o / part_ml
 * ([segment][token][head] (x hd)), the combine kernel's input. */
template <int HD>
__device__ __forceinline__ void atc_write_part(float *__restrict__ part_o,
                                               float2 *__restrict__ part_ml, const rw_attn_tile &tl,
                                               int g, int group, int nh, int nrows, int r0,
                                               int r1, int sg, int64_t ntok, float m0, float m1,
                                               float l0, float l1, const float (&o)[HD / 8][4]) {
    const int lane = threadIdx.x & 31;
    const uint64_t keep = rw_l2_evict_last();
#pragma unroll
    for (int rr = 0; rr < 2; rr++) {
        const int r = rr ? r1 : r0;
        if (r >= nrows) continue;
        const int64_t base = (int64_t)sg * ntok * nh + atc_row_th(tl, g, group, nh, r);
#pragma unroll
        for (int d = 0; d < HD / 8; d++) {
            const int col = d * 8 + 2 * (lane & 3);
            rw_st_f32x2_pol(part_o + base * HD + col, o[d][2 * rr], o[d][2 * rr + 1], keep);
        }
        if ((lane & 3) == 0) part_ml[base] = rr ? make_float2(m1, l1) : make_float2(m0, l0);
    }
}

/* The softmax step of a key block for rows r0 (i < 2) and, with NI = 4, r1 (i >= 2) of the
 * scores s[n][i] (keys key_abs + 8 n + 2 (lane % 4) + (i & 1)), the one place it is written:
 *   keys past the row's position -> -inf (a block with no such key for any row skips the test:
 *     masking a key at or before the position changes nothing);
 *   mn = max(m, max of the row's S); c = 2^(m - mn), p = 2^(S - mn) (mn = -inf: 0, 0);
 *   l = l*c + sum(p) (each lane's values in order, then the quad: xor 1, xor 2).
 * s becomes p; m and l are updated; c0 / c1 are the factors o is to be multiplied by. */
template <int NI>
__device__ __forceinline__ void atc_softmax(float (&s)[4][4], int key_abs, int32_t qp0,
                                            int32_t qp1, float &m0, float &m1, float &l0,
                                            float &l1, float &c0, float &c1) {
    const int lane = threadIdx.x & 31;
    const int kbase = key_abs + 2 * (lane & 3);
    if (__any_sync(0xffffffffu, key_abs + ATC_SB - 1 > min(qp0, qp1))) {
#pragma unroll
        for (int n = 0; n < 4; n++)
#pragma unroll
            for (int i = 0; i < NI; i++)
                if (kbase + n * 8 + (i & 1) > ((i & 2) ? qp1 : qp0)) s[n][i] = -INFINITY;
    }
    float bm0 = fmaxf(fmaxf(s[0][0], s[0][1]), fmaxf(s[1][0], s[1][1]));
    bm0 = fmaxf(bm0, fmaxf(fmaxf(s[2][0], s[2][1]), fmaxf(s[3][0], s[3][1])));
    bm0 = fmaxf(bm0, __shfl_xor_sync(0xffffffffu, bm0, 1));
    bm0 = fmaxf(bm0, __shfl_xor_sync(0xffffffffu, bm0, 2));
    float bm1 = -INFINITY;
    if constexpr (NI == 4) {
        bm1 = fmaxf(fmaxf(s[0][2], s[0][3]), fmaxf(s[1][2], s[1][3]));
        bm1 = fmaxf(bm1, fmaxf(fmaxf(s[2][2], s[2][3]), fmaxf(s[3][2], s[3][3])));
        bm1 = fmaxf(bm1, __shfl_xor_sync(0xffffffffu, bm1, 1));
        bm1 = fmaxf(bm1, __shfl_xor_sync(0xffffffffu, bm1, 2));
    }
    const float mn0 = fmaxf(m0, bm0), mn1 = fmaxf(m1, bm1);
    const float mu0 = mn0 == -INFINITY ? 0.0f : mn0;
    const float mu1 = mn1 == -INFINITY ? 0.0f : mn1;
    c0 = atc_exp2(__fsub_rn(m0, mu0));
    c1 = atc_exp2(__fsub_rn(m1, mu1));
    float ps0 = 0.0f, ps1 = 0.0f;
#pragma unroll
    for (int n = 0; n < 4; n++)
#pragma unroll
        for (int i = 0; i < NI; i++) {
            const float pv = atc_exp2(__fsub_rn(s[n][i], (i & 2) ? mu1 : mu0));
            s[n][i] = pv;
            if (i & 2)
                ps1 = __fadd_rn(ps1, pv);
            else
                ps0 = __fadd_rn(ps0, pv);
        }
    ps0 = __fadd_rn(ps0, __shfl_xor_sync(0xffffffffu, ps0, 1));
    ps0 = __fadd_rn(ps0, __shfl_xor_sync(0xffffffffu, ps0, 2));
    ps1 = __fadd_rn(ps1, __shfl_xor_sync(0xffffffffu, ps1, 1));
    ps1 = __fadd_rn(ps1, __shfl_xor_sync(0xffffffffu, ps1, 2));
    l0 = __fadd_rn(__fmul_rn(l0, c0), ps0);
    l1 = __fadd_rn(__fmul_rn(l1, c1), ps1);
    m0 = mn0;
    m1 = mn1;
}

/* The hook of atc_block / atc_block_t between the last read of K and the first of V: by default
 * nothing; the decode kernel refills the K slot and waits for V there (attention_decode.cuh). */
struct atc_no_hook {
    __device__ __forceinline__ void operator()() const {}
};

/* atc_block's q'.K^T products: sh = qh.K^T, sl = ql.K^T (KP: + qh.K_lo^T), in k16 steps in
 * order; PACK: row r0's qh and ql in one A fragment (atc_block's comment). */
template <int HD, bool KP, bool PACK>
__device__ __forceinline__ void atc_qk(const uint8_t *kd, int lo, const uint32_t (&qh)[HD / 16][4],
                                       const uint32_t (&ql)[HD / 16][4], float (&sh)[4][4],
                                       float (&sl)[4][4]) {
    static_assert(!(PACK && KP), "the packed form has no room for qh.K_lo");
    constexpr int KS = HD / 16;
    const int lane = threadIdx.x & 31;
#pragma unroll
    for (int n = 0; n < 4; n++)
#pragma unroll
        for (int i = 0; i < 4; i++)
            sh[n][i] = sl[n][i] = 0.0f;
#pragma unroll
    for (int ks = 0; ks < KS; ks++) {
        /* PACK: A fragment (row g, k 0-7), (row g + 8, k 0-7), (row g, k 8-15), (row g + 8,
         * k 8-15) of row r0's qh and ql */
        const uint32_t qp[4] = {qh[ks][0], ql[ks][0], qh[ks][2], ql[ks][2]};
#pragma unroll
        for (int j = 0; j < 2; j++) {
            /* keys 16j..16j+15 of the block, head-dim chunks 2ks, 2ks+1 */
            const int kr = 16 * j + (lane & 7) + ((lane & 16) ? 8 : 0);
            const int kcidx = 2 * ks + ((lane & 8) ? 1 : 0);
            uint32_t b0, b1, b2, b3;
            rw_ldsm_x4(b0, b1, b2, b3, kd + atc_swz<HD>(kr, kcidx));
            if constexpr (PACK) { /* sh[n][0, 1]: qh.K of row r0; sh[n][2, 3]: its ql.K */
                rw_mma_bf16_16816(sh[2 * j], qp, b0, b1);
                rw_mma_bf16_16816(sh[2 * j + 1], qp, b2, b3);
                continue;
            }
            rw_mma_bf16_16816(sh[2 * j], qh[ks], b0, b1);
            rw_mma_bf16_16816(sh[2 * j + 1], qh[ks], b2, b3);
            rw_mma_bf16_16816(sl[2 * j], ql[ks], b0, b1);
            rw_mma_bf16_16816(sl[2 * j + 1], ql[ks], b2, b3);
            if constexpr (KP) { /* the keys' low halves: qh . K_lo into the lo sums */
                rw_ldsm_x4(b0, b1, b2, b3, kd + lo + atc_swz<HD>(kr, kcidx));
                rw_mma_bf16_16816(sl[2 * j], qh[ks], b0, b1);
                rw_mma_bf16_16816(sl[2 * j + 1], qh[ks], b2, b3);
            }
        }
    }
}

/* S = fl(qh.K^T) + fl(ql.K^T) from atc_qk's sums (PACK: row r0's, rows r1 zero) */
template <bool PACK>
__device__ __forceinline__ void atc_sum_scores(const float (&sh)[4][4], const float (&sl)[4][4],
                                               float (&s)[4][4]) {
#pragma unroll
    for (int n = 0; n < 4; n++)
#pragma unroll
        for (int i = 0; i < 4; i++)
            s[n][i] = PACK ? (i < 2 ? __fadd_rn(sh[n][i], sh[n][i + 2]) : 0.0f)
                           : __fadd_rn(sh[n][i], sl[n][i]);
}

/* The rest of atc_block from the scores S of its keys (key_abs on), in two steps:
 * atc_softmax_scale (the softmax step, S becomes P, then o = o*c) and atc_pv (o += bf16(p).V;
 * KP: with the lo planes, lo bytes after vd); atc_softmax_pv is both. A kernel may issue another
 * block's q'.K^T products between the two: they read neither this block's P nor o. */
template <int HD, bool KP, bool PACK>
__device__ __forceinline__ void atc_softmax_scale(int key_abs, float (&s)[4][4], int32_t qp0,
                                                  int32_t qp1, float &m0, float &m1, float &l0,
                                                  float &l1, float (&o)[HD / 8][4]) {
    constexpr int DN = HD / 8;
    float c0, c1;
    if constexpr (PACK) { /* row r0 alone: the caller's m1, l1 untouched, c1 not used */
        float pm1 = -INFINITY, pl1 = 0.0f;
        atc_softmax<2>(s, key_abs, qp0, 0x7fffffff, m0, pm1, l0, pl1, c0, c1);
    } else {
        atc_softmax<4>(s, key_abs, qp0, qp1, m0, m1, l0, l1, c0, c1);
    }
    if (__any_sync(0xffffffffu, c0 != 1.0f || (!PACK && c1 != 1.0f))) {
#pragma unroll
        for (int d = 0; d < DN; d++) {
            o[d][0] = __fmul_rn(o[d][0], c0);
            o[d][1] = __fmul_rn(o[d][1], c0);
            if constexpr (!PACK) {
                o[d][2] = __fmul_rn(o[d][2], c1);
                o[d][3] = __fmul_rn(o[d][3], c1);
            }
        }
    }
}
template <int HD, bool KP, bool PACK>
__device__ __forceinline__ void atc_pv(const uint8_t *vd, int lo, float (&s)[4][4],
                                       float (&o)[HD / 8][4]) {
    constexpr int DN = HD / 8;
    const int lane = threadIdx.x & 31;
    /* o += P.V, keys in k16 steps: A fragment regs (row r0 keys +0..7, row r1 keys +0..7, row r0
     * keys +8..15, row r1 keys +8..15) = s[2j][0,1], s[2j][2,3], s[2j+1][0,1], s[2j+1][2,3] */
#pragma unroll
    for (int j = 0; j < 2; j++) {
        uint32_t ph[4], pl[4];
        if constexpr (PACK) { /* row r1's weights zero: its o registers stay zero */
            ph[0] = rw_pack_bf16x2(s[2 * j][0], s[2 * j][1]);
            ph[1] = 0u;
            ph[2] = rw_pack_bf16x2(s[2 * j + 1][0], s[2 * j + 1][1]);
            ph[3] = 0u;
        } else {
            atc_split2(s[2 * j][0], s[2 * j][1], ph[0], pl[0]);
            atc_split2(s[2 * j][2], s[2 * j][3], ph[1], pl[1]);
            atc_split2(s[2 * j + 1][0], s[2 * j + 1][1], ph[2], pl[2]);
            atc_split2(s[2 * j + 1][2], s[2 * j + 1][3], ph[3], pl[3]);
        }
#pragma unroll
        for (int dn = 0; dn < DN / 2; dn++) {
            const int vr = 16 * j + (lane & 7) + ((lane & 8) ? 8 : 0);
            const int vcidx = 2 * dn + ((lane & 16) ? 1 : 0);
            uint32_t b0, b1, b2, b3;
            rw_ldsm_x4_trans(b0, b1, b2, b3, vd + atc_swz<HD>(vr, vcidx));
            rw_mma_bf16_16816(o[2 * dn], ph, b0, b1);
            rw_mma_bf16_16816(o[2 * dn + 1], ph, b2, b3);
            if constexpr (KP) { /* P_lo . V, then P_hi . V_lo */
                rw_mma_bf16_16816(o[2 * dn], pl, b0, b1);
                rw_mma_bf16_16816(o[2 * dn + 1], pl, b2, b3);
                rw_ldsm_x4_trans(b0, b1, b2, b3, vd + lo + atc_swz<HD>(vr, vcidx));
                rw_mma_bf16_16816(o[2 * dn], ph, b0, b1);
                rw_mma_bf16_16816(o[2 * dn + 1], ph, b2, b3);
            }
        }
    }
}

template <int HD, bool KP, bool PACK>
__device__ __forceinline__ void
atc_softmax_pv(const uint8_t *vd, int lo, int key_abs, float (&s)[4][4], int32_t qp0, int32_t qp1,
               float &m0, float &m1, float &l0, float &l1, float (&o)[HD / 8][4]) {
    atc_softmax_scale<HD, KP, PACK>(key_abs, s, qp0, qp1, m0, m1, l0, l1, o);
    atc_pv<HD, KP, PACK>(vd, lo, s, o);
}

/* One softmax block of ATC_SB keys for a warp's 16 rows: kd / vd point at the block's first key
 * row in shared memory (ATC_SB rows, swizzled as atc_swz), key_abs is its first position. Updates
 * the rows' segment state (m, l, o). The per-row arithmetic (atc_block_t is its decode form, the
 * softmax step is atc_softmax):
 *   S = fl(qh.K^T) + fl(ql.K^T), each product accumulated over the head dimension in k16 steps in
 *     order (two accumulators, so the tensor cores get independent chains);
 *   keys past the row's position -> -inf (a block with no such key for any row skips the test:
 *     masking a key at or before the position changes nothing);
 *   mn = max(m, max of the row's S); c = 2^(m - mn), p = 2^(S - mn) (mn = -inf: 0, 0);
 *   l = l*c + sum(p) (each lane's 8 values in order, then the quad: xor 1, xor 2);
 *   o = o*c (skipped when every row's c is 1: exact) + bf16(p).V in key k16 steps.
 * KP: the K_lo / V_lo planes lie lo bytes after kd / vd, and the products of the file comment's
 * high-precision sequence are added in its order.
 *
 * PACK (without KP): the form for tiles of at most 8 rows (one decode token of up to 8 query
 * heads), the split decode kernel's. There rows 8-15 of the fragment (r1) are padding, so half
 * of each QK MMA went to rows nobody reads. Packed, the A fragment carries row r0's qh in rows
 * 0-7 and its ql in rows 8-15, and one MMA a key step gives both products: qh.K in a lane's
 * registers 0-1 of sh, ql.K in 2-3, for the same keys. Each output element of an MMA is its own
 * row's dot product over the same k16 steps in the same order whatever the other rows hold (the
 * file comment), so S = fl(qh.K^T) + fl(ql.K^T) is the same bits with half the QK MMAs; the
 * softmax runs for row r0 alone (NI = 2; m1, l1 untouched) and P.V takes row r1's weights as
 * zero, so its o registers 2-3 stay zero. (With KP the lo sums take qh.K_lo too: no room.) On
 * an H200 the split kernel 1 x 4k 10.5 -> 9.5 us, 32 x 8k 156.1 -> 154.0 (thirtieth session).
 * P.V with the keys on the M side behind it (atc_block_t's, whose B fragment of P^T would then
 * be the lane's own weights, no shuffles) measured slower in every split shape (1 x 4k 9.5 ->
 * 12.7 us, 32 x 8k 154.0 -> 166.5), and in the unsplit ring the same as atc_block_t (256 x 512:
 * 74.5 -> 74.3 us). */
template <int HD, bool KP, bool PACK = false, typename H = atc_no_hook>
__device__ __forceinline__ void atc_block(const uint8_t *kd, const uint8_t *vd, int lo, int key_abs,
                                          const uint32_t (&qh)[HD / 16][4],
                                          const uint32_t (&ql)[HD / 16][4], int32_t qp0,
                                          int32_t qp1, float &m0, float &m1, float &l0, float &l1,
                                          float (&o)[HD / 8][4], H after_k = H()) {
    float sh[4][4], sl[4][4], s[4][4];
    atc_qk<HD, KP, PACK>(kd, lo, qh, ql, sh, sl);
    after_k();
    atc_sum_scores<PACK>(sh, sl, s);
    atc_softmax_pv<HD, KP, PACK>(vd, lo, key_abs, s, qp0, qp1, m0, m1, l0, l1, o);
}

/* The cache offset of key kp0's 16-key group (kp0 % 16 == 0) of one sequence (block table
 * blocks) and KV head g: the group lies inside one KV block (bs % 16 == 0). 0 past plast (a group
 * of zeros, never read from the cache). */
__device__ __forceinline__ int64_t atc_group_base(const int32_t *__restrict__ blocks, int kp0,
                                                  int plast, int nkv, int g, int bs, int hd) {
    if (kp0 > plast) return 0;
    /* the default block size without a division (a group starts its 16-key block) */
    if (bs == 16) return ((int64_t)blocks[kp0 >> 4] * nkv + g) * 16 * hd;
    return (((int64_t)blocks[kp0 / bs] * nkv + g) * bs + kp0 % bs) * hd;
}

/* atc_group_base in two steps for the kernels whose copies walk whole segments (the split decode
 * kernel's warps, the prefill kernel's CTA): each lane reads the block id of one 16-key group of a
 * segment (one load a segment instead of one a group, issued a segment ahead of the copies that
 * use it), and a copy takes its group's id from that lane by a shuffle. Why: Nsight Compute put a
 * fifth of the unsplit decode kernel's stall samples on a block table lookup that the next
 * instruction used; for the split form, reading the ids ahead measured faster, for the unsplit
 * one not (docs/BENCHMARKS.md, twenty-ninth session); the prefill kernel has them as part of its
 * forty-seventh-session cut. atc_seg_ids: lane i's id is group i's of segment sg (-1 past plast,
 * for lanes past the segment's groups and for sg < 0: nothing is read for those). */
#define ATC_SEG_GROUPS (ATC_SEG / 16)
static_assert(ATC_SEG % 16 == 0 && ATC_SEG_GROUPS <= 32, "a segment's groups fit a warp's lanes");
__device__ __forceinline__ int32_t atc_seg_ids(const int32_t *__restrict__ blocks, int sg,
                                               int plast, int bs, int lane) {
    const int kp0 = sg * ATC_SEG + 16 * lane;
    if (sg < 0 || lane >= ATC_SEG_GROUPS || kp0 > plast) return -1;
    return bs == 16 ? blocks[kp0 >> 4] : blocks[kp0 / bs];
}
/* the cache offset of group gi of the segment whose ids a warp holds (atc_seg_ids), as
 * atc_group_base gives it; every lane of the warp calls it with the same gi */
__device__ __forceinline__ int64_t atc_seg_base(int32_t ids, int gi, int kp0, int nkv, int g,
                                                int bs, int hd) {
    const int32_t b = __shfl_sync(0xffffffffu, ids, gi);
    if (b < 0) return 0;
    if (bs == 16) return ((int64_t)b * nkv + g) * 16 * hd;
    return (((int64_t)b * nkv + g) * bs + kp0 % bs) * hd;
}

/* Stages one 16-key group (keys kp0.., cache offset base) from NC caches into rows r0.. of
 * dst[0..NC) (swizzled as atc_swz): NT threads, this one number t; keys past plast are written as
 * zeros without a read. EF: the whole groups' copies evict_first (the key split's, above). */
template <int HD, int NT, int NC, bool EF = false>
__device__ __forceinline__ void atc_load_group(uint8_t *const *dst, const uint16_t *const *src,
                                               int r0, int kp0, int64_t base, int plast, int t) {
    constexpr int CH = HD / 8;
    /* A group with every key at or before plast (all but a sequence's last): thread t copies
     * column cc of rows rl, rl + RS, ... (RS = NT / CH rows apart, rl < RS). With r0 % 16 == 0
     * and RS a power of two, row rl + k RS's swizzle term is rl's XOR k RS's, so the thread's
     * chunks sit at one source address and one shared offset plus constants: one copy
     * instruction a chunk instead of the division, selects and 64-bit products of the loop
     * below (Nsight Compute at 8 x 4k: that loop was 40% of the split decode kernel's
     * instructions). The same bytes land in the same places. */
    constexpr int RS = NT / CH;
    if constexpr (NT % CH == 0 && RS <= 16 && (RS & (RS - 1)) == 0) {
        static_assert(atc_swz_steps_ok<HD, NT>(), "atc_load_group: the stepped swizzle differs");
        if (kp0 + 15 <= plast) {
            constexpr int NK = 16 / RS;
            const int rl = t / CH, cc = t % CH;
            const int c0 = cc ^ atc_swz_term<HD>(rl);
            const uint16_t *sp[NC];
            uint32_t sa[NC];
            const uint64_t once = EF ? rw_l2_evict_first() : 0;
#pragma unroll
            for (int h = 0; h < NC; h++) {
                sp[h] = src[h] + base + rl * HD + cc * 8;
                sa[h] = rw_smem_u32(dst[h]) + (uint32_t)((r0 + rl) * (HD * 2));
            }
#pragma unroll
            for (int k = 0; k < NK; k++) {
                const uint32_t off = atc_swz_step<HD, RS>(c0, k);
#pragma unroll
                for (int h = 0; h < NC; h++)
                    if constexpr (EF)
                        rw_cp_async16_sa_pol(sa[h] + off, sp[h] + k * RS * HD, once);
                    else
                        rw_cp_async16_sa(sa[h] + off, sp[h] + k * RS * HD);
            }
            return;
        }
    }
#pragma unroll
    for (int c = t; c < 16 * CH; c += NT) {
        const int r = c / CH, cc = c % CH;
        const bool ok = kp0 + r <= plast;
        const int64_t at = ok ? base + (int64_t)r * HD + cc * 8 : 0;
        const int d = atc_swz<HD>(r0 + r, cc);
#pragma unroll
        for (int h = 0; h < NC; h++)
            rw_cp_async16(dst[h] + d, src[h] + at, ok ? 16 : 0);
    }
}

#endif
