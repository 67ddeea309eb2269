/* attention.cu - paged causal attention on tensor cores (attention.h): one per-row arithmetic for
 * prefill and decode, two ways of spreading the work (row fragments over warps for prefill tiles,
 * key segments over warps for decode tiles, whose MMAs put the keys on the M side: atc_block_t),
 * the combine kernel of the key split, and the launcher; reference in attention_ref.c.
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
 * one bf16 each. */
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>

#include "attention.h"
#include "cuda_check.h"
#include "device.cuh"
#include "launch.cuh"
#include "mma.cuh"

#define ATC_THREADS 128
#define ATC_ROWS 64 /* rows per CTA: 4 warps x 16 */
#define ATC_KB 64   /* keys per staged block (shared memory) */
#define ATC_SB 32   /* keys per softmax block */
#define ATC_SEG RW_ATTN_SEG

/* Byte offset of 16-byte chunk c of key row r in a [64][HD] bf16 block, swizzled so that the 8
 * rows an ldmatrix reads at one chunk fall in 8 different bank groups. */
template <int HD> __device__ __forceinline__ int atc_swz(int r, int c) {
    constexpr int RB = HD * 2;
    if constexpr (HD == 32)
        return r * RB + ((c ^ ((r >> 1) & 3)) << 4);
    else
        return r * RB + ((c ^ (r & 7)) << 4);
}


/* 2^x in one instruction (ex2.approx.ftz: results below 2^-126 flush to zero); exact at 0
 * (1.0) and -inf (+0.0), the two values the masking and merging rules rely on. */
__device__ __forceinline__ float atc_exp2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

/* (x0, x1) as the bf16 pair registers hi = (bf16(x0), bf16(x1)), lo = (bf16(x0 - hi0),
 * bf16(x1 - hi1)), round to nearest even (the differences are exact in fp32). */
__device__ __forceinline__ void atc_split2(float x0, float x1, uint32_t &hi, uint32_t &lo) {
    hi = rw_pack_bf16x2(x0, x1);
    lo = rw_pack_bf16x2(__fsub_rn(x0, __uint_as_float(hi << 16)),
                        __fsub_rn(x1, __uint_as_float(hi & 0xffff0000u)));
}

/* (M, L, O) <- (M, L, O) merged with a segment's (m, l, o), log2 domain; a segment without keys
 * for the row (l == 0) is skipped. From (-inf, 0, 0) the first merge is an exact copy. No fused
 * multiply-adds, so every caller gets the same bits. */
__device__ __forceinline__ bool rw_attn_merge_ml(float &M, float &L, float m, float l, float &a,
                                                 float &b) {
    if (!(l > 0.0f)) return false;
    const float mn = fmaxf(M, m);
    a = atc_exp2(__fsub_rn(M, mn));
    b = atc_exp2(__fsub_rn(m, mn));
    L = __fadd_rn(__fmul_rn(L, a), __fmul_rn(l, b));
    M = mn;
    return true;
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
        q0 = q + ((int64_t)(tl.tok0 + r0 / group) * nh + g * group + r0 % group) * HD;
        qp0 = pos[tl.tok0 + r0 / group];
    }
    if (r1 < nrows) {
        q1 = q + ((int64_t)(tl.tok0 + r1 / group) * nh + g * group + r1 % group) * HD;
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

/* Writes a warp's segment partial (m, l, o of rows r0, r1) for segment sg to part_o / part_ml
 * ([segment][token][head] (x hd)), the combine kernel's input. */
template <int HD>
__device__ __forceinline__ void atc_write_part(float *__restrict__ part_o,
                                               float2 *__restrict__ part_ml, const rw_attn_tile &tl,
                                               int g, int group, int nh, int nrows, int r0,
                                               int r1, int sg, int64_t ntok, float m0, float m1,
                                               float l0, float l1, const float (&o)[HD / 8][4]) {
    const int lane = threadIdx.x & 31;
#pragma unroll
    for (int rr = 0; rr < 2; rr++) {
        const int r = rr ? r1 : r0;
        if (r >= nrows) continue;
        const int64_t t = tl.tok0 + r / group;
        const int h = g * group + r % group;
        const int64_t base = ((int64_t)sg * ntok + t) * nh + h;
#pragma unroll
        for (int d = 0; d < HD / 8; d++) {
            const int col = d * 8 + 2 * (lane & 3);
            *(float2 *)(part_o + base * HD + col) = make_float2(o[d][2 * rr], o[d][2 * rr + 1]);
        }
        if ((lane & 3) == 0) part_ml[base] = rr ? make_float2(m1, l1) : make_float2(m0, l0);
    }
}

/* out = o / l of the element at fragment register i (0..HD/2-1, = 4 * n8 fragment + c) of this
 * lane, rows r0 / r1, as a hi + lo pair. */
template <int HD>
__device__ __forceinline__ void atc_store_out(uint16_t *__restrict__ out_hi,
                                              uint16_t *__restrict__ out_lo, const rw_attn_tile &tl,
                                              int g, int group, int nh, int nrows, int r0, int r1,
                                              int i, float o, float L0, float L1) {
    const int lane = threadIdx.x & 31;
    const int rr = (i & 2) ? 1 : 0;
    const int r = rr ? r1 : r0;
    if (r >= nrows) return;
    const int64_t t = tl.tok0 + r / group;
    const int h = g * group + r % group;
    const float v = __fdiv_rn(o, rr ? L1 : L0);
    const int64_t at = (t * nh + h) * HD + (i >> 2) * 8 + 2 * (lane & 3) + (i & 1);
    const uint16_t hv = rw_f32_to_bf16(v);
    out_hi[at] = hv;
    if (out_lo) out_lo[at] = rw_bf16_split_lo(v, hv);
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
 *   o = o*c (skipped when every row's c is 1: exact) + bf16(p).V in key k16 steps. */
template <int HD>
__device__ __forceinline__ void atc_block(const uint8_t *kd, const uint8_t *vd, int key_abs,
                                          const uint32_t (&qh)[HD / 16][4],
                                          const uint32_t (&ql)[HD / 16][4], int32_t qp0,
                                          int32_t qp1, float &m0, float &m1, float &l0, float &l1,
                                          float (&o)[HD / 8][4]) {
    constexpr int KS = HD / 16, DN = HD / 8;
    const int lane = threadIdx.x & 31;
    float sh[4][4], sl[4][4];
#pragma unroll
    for (int n = 0; n < 4; n++)
#pragma unroll
        for (int i = 0; i < 4; i++)
            sh[n][i] = sl[n][i] = 0.0f;
#pragma unroll
    for (int ks = 0; ks < KS; ks++) {
#pragma unroll
        for (int j = 0; j < 2; j++) {
            /* keys 16j..16j+15 of the block, head-dim chunks 2ks, 2ks+1 */
            const int kr = 16 * j + (lane & 7) + ((lane & 16) ? 8 : 0);
            const int kcidx = 2 * ks + ((lane & 8) ? 1 : 0);
            uint32_t b0, b1, b2, b3;
            rw_ldsm_x4(b0, b1, b2, b3, kd + atc_swz<HD>(kr, kcidx));
            rw_mma_bf16_16816(sh[2 * j], qh[ks], b0, b1);
            rw_mma_bf16_16816(sh[2 * j + 1], qh[ks], b2, b3);
            rw_mma_bf16_16816(sl[2 * j], ql[ks], b0, b1);
            rw_mma_bf16_16816(sl[2 * j + 1], ql[ks], b2, b3);
        }
    }
    float s[4][4];
#pragma unroll
    for (int n = 0; n < 4; n++)
#pragma unroll
        for (int i = 0; i < 4; i++)
            s[n][i] = __fadd_rn(sh[n][i], sl[n][i]);
    float c0, c1;
    atc_softmax<4>(s, key_abs, qp0, qp1, m0, m1, l0, l1, c0, c1);
    if (__any_sync(0xffffffffu, c0 != 1.0f || c1 != 1.0f)) {
#pragma unroll
        for (int d = 0; d < DN; d++) {
            o[d][0] = __fmul_rn(o[d][0], c0);
            o[d][1] = __fmul_rn(o[d][1], c0);
            o[d][2] = __fmul_rn(o[d][2], c1);
            o[d][3] = __fmul_rn(o[d][3], c1);
        }
    }
    /* o += P.V, keys in k16 steps: A fragment regs (row r0 keys +0..7, row r1 keys +0..7, row r0
     * keys +8..15, row r1 keys +8..15) = s[2j][0,1], s[2j][2,3], s[2j+1][0,1], s[2j+1][2,3] */
#pragma unroll
    for (int j = 0; j < 2; j++) {
        const uint32_t ph[4] = {rw_pack_bf16x2(s[2 * j][0], s[2 * j][1]),
                                rw_pack_bf16x2(s[2 * j][2], s[2 * j][3]),
                                rw_pack_bf16x2(s[2 * j + 1][0], s[2 * j + 1][1]),
                                rw_pack_bf16x2(s[2 * j + 1][2], s[2 * j + 1][3])};
#pragma unroll
        for (int dn = 0; dn < DN / 2; dn++) {
            const int vr = 16 * j + (lane & 7) + ((lane & 8) ? 8 : 0);
            const int vcidx = 2 * dn + ((lane & 16) ? 1 : 0);
            uint32_t b0, b1, b2, b3;
            rw_ldsm_x4_trans(b0, b1, b2, b3, vd + atc_swz<HD>(vr, vcidx));
            rw_mma_bf16_16816(o[2 * dn], ph, b0, b1);
            rw_mma_bf16_16816(o[2 * dn + 1], ph, b2, b3);
        }
    }
}

/* Stages keys [key0, key0 + nkeys) of one sequence and KV head into kd / vd (rows 0.., swizzled
 * as atc_swz): NT threads, this one number t. Keys come in 16-position groups, each inside one KV
 * block (bs % 16 == 0), so the block table is read once per group; keys past plast are written
 * as zeros without a read. */
template <int HD, int NT>
__device__ __forceinline__ void atc_load_keys(uint8_t *kd, uint8_t *vd,
                                              const uint16_t *__restrict__ kc,
                                              const uint16_t *__restrict__ vc,
                                              const int32_t *__restrict__ blocks, int key0,
                                              int nkeys, int plast, int nkv, int g, int bs, int t) {
    constexpr int CH = HD / 8;
    for (int gi = 0; gi < nkeys / 16; gi++) {
        const int kp0 = key0 + 16 * gi;
        int64_t base = 0;
        if (kp0 <= plast) base = (((int64_t)blocks[kp0 / bs] * nkv + g) * bs + kp0 % bs) * HD;
#pragma unroll
        for (int c = t; c < 16 * CH; c += NT) {
            const int r = c / CH, cc = c % CH;
            const bool ok = kp0 + r <= plast;
            const int64_t at = ok ? base + (int64_t)r * HD + cc * 8 : 0;
            const int dst = atc_swz<HD>(16 * gi + r, cc);
            rw_cp_async16(kd + dst, kc + at, ok ? 16 : 0);
            rw_cp_async16(vd + dst, vc + at, ok ? 16 : 0);
        }
    }
}

template <int HD>
__global__ void __launch_bounds__(ATC_THREADS, 2)
    atc_kernel(const float *__restrict__ q, const uint16_t *__restrict__ kc,
               const uint16_t *__restrict__ vc, const rw_attn_tile *__restrict__ tiles,
               const int32_t *__restrict__ pos, const int32_t *__restrict__ bt, int bt_stride,
               int nh, int nkv, int bs, int nsplit, float qscale, uint16_t *__restrict__ out_hi,
               uint16_t *__restrict__ out_lo, float *__restrict__ part_o,
               float2 *__restrict__ part_ml, int64_t ntok, int seg_cap) {
    rw_pdl_begin();
    constexpr int BLK = ATC_KB * HD * 2;       /* bytes of K (or V) per block */
    constexpr int KS = HD / 16;                /* head-dim k16 steps */
    constexpr int DN = HD / 8;                 /* output n8 fragments */
    extern __shared__ __align__(128) uint8_t sm[];
    uint8_t *stage = sm;                                     /* 2 x (K, V) blocks */
    float *oacc = (float *)(sm + 4 * BLK);                   /* [4 warps][HD/2][32] merged o */

    const rw_attn_tile tl = tiles[blockIdx.x];
    const int g = blockIdx.y, split = blockIdx.z;
    const int group = nh / nkv;
    const int nrows = tl.ntok * group;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int r0 = warp * 16 + (lane >> 2), r1 = r0 + 8; /* this lane's two rows */
    const bool active = warp * 16 < nrows;
    const int32_t plast = pos[tl.tok0 + tl.ntok - 1];
    const int nblk = plast / ATC_KB + 1;
    const int nseg = plast / ATC_SEG + 1;
    const int32_t *blocks = bt + (int64_t)tl.seq * bt_stride;

    uint32_t qh[KS][4], ql[KS][4];
    int32_t qp0, qp1;
    atc_load_q<HD>(q, pos, tl, g, group, nh, nrows, r0, r1, qscale, qh, ql, qp0, qp1);

    /* the blocks this CTA walks: segments split, split + nsplit, ..., two blocks each */
    const int sstep = nsplit > 0 ? nsplit : 1;
    const int sfirst = nsplit > 0 ? split : 0;
    auto block_of = [&](int idx) -> int { /* idx-th block of this CTA, or -1 */
        const int sg = sfirst + (idx >> 1) * sstep;
        const int b = sg * 2 + (idx & 1);
        return (sg < nseg && b < nblk) ? b : -1;
    };
    auto load = [&](int buf, int b) {
        uint8_t *kd = stage + (size_t)buf * 2 * BLK;
        atc_load_keys<HD, ATC_THREADS>(kd, kd + BLK, kc, vc, blocks, b * ATC_KB, ATC_KB, plast,
                                       nkv, g, bs, tid);
    };

    /* merged result (nsplit 0) */
    float Mt0 = -INFINITY, Mt1 = -INFINITY, Lt0 = 0.0f, Lt1 = 0.0f;
    float *oa = oacc + (size_t)warp * (HD / 2) * 32;
    if (nsplit == 0 && active)
        for (int i = 0; i < HD / 2; i++)
            oa[i * 32 + lane] = 0.0f;

    /* per-segment state */
    float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.0f, l1 = 0.0f;
    float o[DN][4];
#pragma unroll
    for (int d = 0; d < DN; d++)
#pragma unroll
        for (int i = 0; i < 4; i++)
            o[d][i] = 0.0f;

    int cur = block_of(0);
    if (cur >= 0) load(0, cur);
    rw_cp_async_commit();
    for (int idx = 0; cur >= 0; idx++) {
        const int nxt = block_of(idx + 1);
        if (nxt >= 0) load((idx + 1) & 1, nxt);
        rw_cp_async_commit();
        rw_cp_async_wait<1>();
        __syncthreads();
        const uint8_t *kd = stage + (size_t)(idx & 1) * 2 * BLK;
        const uint8_t *vd = kd + BLK;
        if (active) {
#pragma unroll 1
            for (int sub = 0; sub < ATC_KB / ATC_SB; sub++)
                atc_block<HD>(kd + sub * ATC_SB * HD * 2, vd + sub * ATC_SB * HD * 2,
                              cur * ATC_KB + sub * ATC_SB, qh, ql, qp0, qp1, m0, m1, l0, l1, o);
        }
        /* end of a segment: merge (nsplit 0) or write the partial */
        const int nb = block_of(idx + 1);
        const bool seg_end = nb < 0 || (nb >> 1) != (cur >> 1);
        if (seg_end && active) {
            const int sg = cur >> 1;
            if (nsplit == 0) {
                float a0 = 0.0f, b0 = 0.0f, a1 = 0.0f, b1 = 0.0f;
                const bool u0 = rw_attn_merge_ml(Mt0, Lt0, m0, l0, a0, b0);
                const bool u1 = rw_attn_merge_ml(Mt1, Lt1, m1, l1, a1, b1);
#pragma unroll
                for (int d = 0; d < DN; d++)
#pragma unroll
                    for (int i = 0; i < 4; i++) {
                        const bool hi = i & 2;
                        if (hi ? !u1 : !u0) continue;
                        float &O = oa[(d * 4 + i) * 32 + lane];
                        O = __fadd_rn(__fmul_rn(O, hi ? a1 : a0), __fmul_rn(o[d][i], hi ? b1 : b0));
                    }
            } else if (sg < seg_cap) {
                atc_write_part<HD>(part_o, part_ml, tl, g, group, nh, nrows, r0, r1, sg, ntok, m0,
                                   m1, l0, l1, o);
            }
            m0 = m1 = -INFINITY;
            l0 = l1 = 0.0f;
#pragma unroll
            for (int d = 0; d < DN; d++)
#pragma unroll
                for (int i = 0; i < 4; i++)
                    o[d][i] = 0.0f;
        }
        __syncthreads(); /* the buffer is reloaded by the next iteration's prefetch */
        cur = nb;
    }
    rw_cp_async_wait<0>();
    if (nsplit != 0 || !active) return;
    for (int i = 0; i < HD / 2; i++)
        atc_store_out<HD>(out_hi, out_lo, tl, g, group, nh, nrows, r0, r1, i, oa[i * 32 + lane],
                          Lt0, Lt1);
}

/* Decode tiles (at most 16 rows: one token of a group of <= 16 heads) are one fragment, so the
 * ATC_DW warps of a CTA take ATC_DW segments at a time instead of row fragments. Each warp streams
 * its segment's 32-key blocks through its own two shared-memory stages; after each round of ATC_DW
 * segments the partials are merged in segment order (nsplit 0) with the same merge as everywhere
 * else, or written for the combine kernel. The rounds' merges make one left fold over the segments
 * whatever ATC_DW is.
 *
 * The MMAs run with the operands' roles swapped (atc_block_t): the keys are the M side and the
 * tile's rows the N side, S^T = K q'^T and o^T += V^T P^T, in NF n8 fragments of rows (NF = 1 for
 * at most 8 rows). A one-token tile of the 30B-A3B shape has 8 rows, which filled half of a
 * 16-row fragment with the rows as the M side; here it fills one n8 fragment exactly, which
 * halves the MMAs and the o registers of each key block. Every output element is still the sum
 * of the same products over the same k16 steps in the same order (the head-dim steps of q'.K, hi
 * then lo; the key steps of P.V), one MMA per step whichever side of the instruction its row sits
 * on, and the scores are moved into atc_block's register layout before the softmax, which is
 * atc_block's code: the same bits as the prefill kernel (tests/worker/test_kernels_gpu.c compares
 * rows computed both ways byte for byte).
 *
 * Why 2 warps: the kernel is bound by each warp's chain of dependent instructions, not by bytes
 * in flight (docs/BENCHMARKS.md: at 4 warps, 170 KB of shared memory held an SM to one CTA, one
 * warp per scheduler issuing every 3.6 cycles; a deeper key ring changed nothing). A CTA of 2 warps
 * needs 73 KB (a round's partials go to the stage each warp has just consumed), so 3 CTAs, 6
 * warps, share an SM. */
#define ATC_DW 2

/* One softmax block of ATC_SB keys for a warp's rows r0 = lane / 4 and (NF = 2) r1 = r0 + 8,
 * atc_block's arithmetic with the keys as the MMA's M side. qb / qlb: the B fragments of q'^T
 * (hi, lo) for row fragment nf (atc_load_q's registers 0, 2 of row r0 and 1, 3 of row r1);
 * ot[f][nf]: o^T for head-dim rows 16 f .. 16 f + 15 by the fragment's rows (columns). */
template <int HD, int NF>
__device__ __forceinline__ void atc_block_t(const uint8_t *kd, const uint8_t *vd, int key_abs,
                                            const uint32_t (&qb)[HD / 16][NF][2],
                                            const uint32_t (&qlb)[HD / 16][NF][2], int32_t qp0,
                                            int32_t qp1, float &m0, float &m1, float &l0,
                                            float &l1, float (&ot)[HD / 16][NF][4]) {
    constexpr int KS = HD / 16, NI = 2 * NF; /* s[n][i]: i < 2 row r0, i >= 2 row r1 */
    const int lane = threadIdx.x & 31, cq = lane & 3;
    float th[2][NF][4], tl[2][NF][4];
#pragma unroll
    for (int j = 0; j < 2; j++)
#pragma unroll
        for (int nf = 0; nf < NF; nf++)
#pragma unroll
            for (int i = 0; i < 4; i++)
                th[j][nf][i] = tl[j][nf][i] = 0.0f;
#pragma unroll
    for (int ks = 0; ks < KS; ks++) {
#pragma unroll
        for (int j = 0; j < 2; j++) {
            /* keys 16 j .. + 15 as A rows, head-dim chunks 2 ks, 2 ks + 1 */
            const int kr = 16 * j + (lane & 7) + ((lane >> 3) & 1) * 8;
            const int kc = 2 * ks + (lane >> 4);
            uint32_t a[4];
            rw_ldsm_x4(a[0], a[1], a[2], a[3], kd + atc_swz<HD>(kr, kc));
#pragma unroll
            for (int nf = 0; nf < NF; nf++) {
                rw_mma_bf16_16816(th[j][nf], a, qb[ks][nf][0], qb[ks][nf][1]);
                rw_mma_bf16_16816(tl[j][nf], a, qlb[ks][nf][0], qlb[ks][nf][1]);
            }
        }
    }
    /* S[r][key], key = 8 n + 2 cq + (i & 1), row r0 / r1 by i / 2: element (key % 16 / 8, r % 2)
     * of fragment (key / 16, r / 8) in lane 4 (key % 8) + (r % 8) / 2 */
    float s[4][4];
#pragma unroll
    for (int n = 0; n < 4; n++)
#pragma unroll
        for (int i = 0; i < NI; i++) {
            const int src = 8 * cq + 4 * (i & 1) + (lane >> 3);
            const int j = n >> 1, h = n & 1, nf = i >> 1;
            const float v0 = __fadd_rn(th[j][nf][2 * h], tl[j][nf][2 * h]);
            const float v1 = __fadd_rn(th[j][nf][2 * h + 1], tl[j][nf][2 * h + 1]);
            const float w0 = __shfl_sync(0xffffffffu, v0, src);
            const float w1 = __shfl_sync(0xffffffffu, v1, src);
            s[n][i] = ((lane >> 2) & 1) ? w1 : w0;
        }
    float c0, c1;
    atc_softmax<NI>(s, key_abs, qp0, qp1, m0, m1, l0, l1, c0, c1);
    /* o^T's columns in fragment nf are rows 8 nf + 2 cq and + 1: their factors from lanes 8 cq
     * and 8 cq + 4 */
    float ca[NF], cb[NF];
#pragma unroll
    for (int nf = 0; nf < NF; nf++) {
        ca[nf] = __shfl_sync(0xffffffffu, nf ? c1 : c0, 8 * cq);
        cb[nf] = __shfl_sync(0xffffffffu, nf ? c1 : c0, 8 * cq + 4);
    }
    if (__any_sync(0xffffffffu, c0 != 1.0f || (NF == 2 && c1 != 1.0f))) {
#pragma unroll
        for (int f = 0; f < KS; f++)
#pragma unroll
            for (int nf = 0; nf < NF; nf++) {
                ot[f][nf][0] = __fmul_rn(ot[f][nf][0], ca[nf]);
                ot[f][nf][1] = __fmul_rn(ot[f][nf][1], cb[nf]);
                ot[f][nf][2] = __fmul_rn(ot[f][nf][2], ca[nf]);
                ot[f][nf][3] = __fmul_rn(ot[f][nf][3], cb[nf]);
            }
    }
    /* o^T += V^T P^T in key steps: P^T's B fragment for row fragment nf is atc_block's A
     * fragment registers (0, 2) of row r0 or (1, 3) of row r1; V^T's A fragment is the
     * transposed key rows, head-dim rows 16 f .. + 15 */
#pragma unroll
    for (int j = 0; j < 2; j++) {
        uint32_t b0[NF], b1[NF];
#pragma unroll
        for (int nf = 0; nf < NF; nf++) {
            b0[nf] = rw_pack_bf16x2(s[2 * j][2 * nf], s[2 * j][2 * nf + 1]);
            b1[nf] = rw_pack_bf16x2(s[2 * j + 1][2 * nf], s[2 * j + 1][2 * nf + 1]);
        }
#pragma unroll
        for (int f = 0; f < KS; f++) {
            const int vr = 16 * j + (lane & 7) + ((lane >> 4) & 1) * 8;
            const int vc = 2 * f + ((lane >> 3) & 1);
            uint32_t a[4];
            rw_ldsm_x4_trans(a[0], a[1], a[2], a[3], vd + atc_swz<HD>(vr, vc));
#pragma unroll
            for (int nf = 0; nf < NF; nf++)
                rw_mma_bf16_16816(ot[f][nf], a, b0[nf], b1[nf]);
        }
    }
}

/* A lane's o registers and the rows they belong to, in the two MMA forms of the decode kernel.
 * T (atc_block_t, NF row fragments): register i = 4 (NF f + nf) + c holds head-dim row
 * 16 f + lane / 4 (+ 8 for c >= 2) of tile row 8 nf + 2 (lane % 4) + c % 2. Rows on the M side
 * (atc_block, one 16-row fragment): register i = 4 d + c holds head-dim 8 d + 2 (lane % 4) + c % 2
 * of row lane / 4 (+ 8 for c >= 2). A lane's registers cover ATC_SLOTS rows, its slots. */
template <bool T, int NF> struct atc_regs {
    static constexpr int SLOTS = T ? 2 * NF : 2;
    static __device__ __forceinline__ int slot(int i) {
        return T ? 2 * ((i >> 2) % NF) + (i & 1) : (i >> 1) & 1;
    }
    static __device__ __forceinline__ int row(int k) {
        const int lane = threadIdx.x & 31;
        return T ? 8 * (k >> 1) + 2 * (lane & 3) + (k & 1) : (lane >> 2) + 8 * k;
    }
    static __device__ __forceinline__ int dim(int i) {
        const int lane = threadIdx.x & 31;
        return T ? 16 * ((i >> 2) / NF) + (lane >> 2) + ((i & 2) ? 8 : 0)
                 : 8 * (i >> 2) + 2 * (lane & 3) + (i & 1);
    }
};

/* x[k] for a k known only at run time, by selects (an indexed register array would go to local
 * memory) */
template <typename V, int K> __device__ __forceinline__ V atc_pick(const V (&x)[K], int k) {
    V v = x[0];
#pragma unroll
    for (int j = 1; j < K; j++)
        if (k == j) v = x[j];
    return v;
}

/* T: the MMAs in atc_block_t's form with NF row fragments, for unsplit launches (the segments
 * merged here); otherwise atc_block's (NF = 2: the 16 rows of one fragment), which also writes
 * the partials of split launches. */
template <int HD, bool T, int NF>
__global__ void __launch_bounds__(ATC_DW * 32, 1)
    atc_decode_kernel(const float *__restrict__ q, const uint16_t *__restrict__ kc,
                      const uint16_t *__restrict__ vc, const rw_attn_tile *__restrict__ tiles,
                      const int32_t *__restrict__ pos, const int32_t *__restrict__ bt,
                      int bt_stride, int nh, int nkv, int bs, int nsplit, float qscale,
                      uint16_t *__restrict__ out_hi, uint16_t *__restrict__ out_lo,
                      float *__restrict__ part_o, float2 *__restrict__ part_ml, int64_t ntok,
                      int seg_cap) {
    rw_pdl_begin();
    typedef atc_regs<T, NF> R;
    static_assert(T || NF == 2, "atc_block's form takes one 16-row fragment");
    constexpr int SBLK = ATC_SB * HD * 2;  /* bytes of K (or V) per softmax block */
    constexpr int NR = HD / 4 * NF;        /* o registers per lane */
    static_assert(NR * 32 * 4 <= 2 * SBLK, "a warp's partial fits the stage it has consumed");
    extern __shared__ __align__(128) uint8_t sm[];
    __shared__ int pbuf[ATC_DW]; /* the stage holding each warp's partial of the round */
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    uint8_t *stage = sm + (size_t)warp * 4 * SBLK;   /* this warp's 2 x (K, V) */
    float *pml = (float *)(sm + ATC_DW * 4 * SBLK); /* [warps][4][32]: m0 m1 l0 l1 */
    float *oacc = pml + ATC_DW * 4 * 32;            /* [NR][32] merged o */

    const rw_attn_tile tl = tiles[blockIdx.x];
    const int g = blockIdx.y, split = blockIdx.z;
    const int group = nh / nkv;
    const int nrows = tl.ntok * group;
    /* the launcher picks NF for the tile's rows, and T only for unsplit launches */
    if (nrows > 8 * NF || (T && nsplit > 0)) __trap();
    const int r0 = lane >> 2, r1 = r0 + 8;
    const int32_t plast = pos[tl.tok0 + tl.ntok - 1];
    const int nseg = plast / ATC_SEG + 1;
    const int32_t *blocks = bt + (int64_t)tl.seq * bt_stride;
    uint32_t qh[HD / 16][4], ql[HD / 16][4];
    int32_t qp0, qp1;
    atc_load_q<HD>(q, pos, tl, g, group, nh, nrows, r0, r1, qscale, qh, ql, qp0, qp1);
    /* T: q'^T's B fragments, registers (0, 2) of row r0 and (1, 3) of row r1 */
    uint32_t qb[HD / 16][NF][2], qlb[HD / 16][NF][2];
#pragma unroll
    for (int ks = 0; ks < HD / 16; ks++)
#pragma unroll
        for (int nf = 0; nf < NF; nf++) {
            qb[ks][nf][0] = qh[ks][nf];
            qb[ks][nf][1] = qh[ks][nf + 2];
            qlb[ks][nf][0] = ql[ks][nf];
            qlb[ks][nf][1] = ql[ks][nf + 2];
        }

    /* CTA-local segment li is global segment sfirst + li * sstep; warp w takes li = ATC_DW r + w */
    const int sstep = nsplit > 0 ? nsplit : 1;
    const int sfirst = nsplit > 0 ? split : 0;
    const int nloc = sfirst < nseg ? (nseg - sfirst + sstep - 1) / sstep : 0;
    const int nround = (nloc + ATC_DW - 1) / ATC_DW;
    auto seg_of = [&](int round) -> int {
        const int li = round * ATC_DW + warp;
        return li < nloc ? sfirst + li * sstep : -1;
    };
    auto nblocks_of = [&](int sg) -> int { /* 32-key blocks of segment sg up to plast */
        const int left = plast - sg * ATC_SEG;
        return min(ATC_SEG / ATC_SB, left / ATC_SB + 1);
    };
    auto load = [&](int buf, int sg, int j) {
        uint8_t *kd = stage + (size_t)buf * 2 * SBLK;
        atc_load_keys<HD, 32>(kd, kd + SBLK, kc, vc, blocks, sg * ATC_SEG + j * ATC_SB, ATC_SB,
                              plast, nkv, g, bs, lane);
    };

    /* the merged state of this lane's rows (its slots) */
    float Mt[R::SLOTS], Lt[R::SLOTS];
#pragma unroll
    for (int k = 0; k < R::SLOTS; k++) {
        Mt[k] = -INFINITY;
        Lt[k] = 0.0f;
    }
    /* this thread's share of the merged o: registers [warp * NR / ATC_DW, (warp + 1) * NR /
     * ATC_DW) of its lane (every warp's lane holds the same rows and columns) */
    const int i0 = warp * (NR / ATC_DW), i1 = i0 + NR / ATC_DW;
    if (nsplit == 0)
        for (int i = i0; i < i1; i++)
            oacc[i * 32 + lane] = 0.0f;

    int buf = 0;
    {
        const int sg = seg_of(0);
        if (sg >= 0) load(0, sg, 0);
        rw_cp_async_commit();
    }
    for (int round = 0; round < nround; round++) {
        const int sg = seg_of(round);
        float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.0f, l1 = 0.0f;
        float ov[NR]; /* T: [HD / 16][NF][4]; otherwise [HD / 8][4] */
#pragma unroll
        for (int i = 0; i < NR; i++)
            ov[i] = 0.0f;
        if (sg >= 0) {
            const int nb = nblocks_of(sg);
            for (int j = 0; j < nb; j++) {
                if (j + 1 < nb) {
                    load(buf ^ 1, sg, j + 1);
                } else {
                    const int sn = seg_of(round + 1);
                    if (sn >= 0) load(buf ^ 1, sn, 0);
                }
                rw_cp_async_commit();
                rw_cp_async_wait<1>();
                __syncwarp();
                const uint8_t *kd = stage + (size_t)buf * 2 * SBLK;
                const int key = sg * ATC_SEG + j * ATC_SB;
                if constexpr (T)
                    atc_block_t<HD, NF>(kd, kd + SBLK, key, qb, qlb, qp0, qp1, m0, m1, l0, l1,
                                        *reinterpret_cast<float(*)[HD / 16][NF][4]>(ov));
                else
                    atc_block<HD>(kd, kd + SBLK, key, qh, ql, qp0, qp1, m0, m1, l0, l1,
                                  *reinterpret_cast<float(*)[HD / 8][4]>(ov));
                __syncwarp(); /* the stage is refilled by the next prefetch */
                buf ^= 1;
            }
        }
        if (nsplit > 0) {
            if constexpr (!T) /* (T is never split) */
                if (sg >= 0 && sg < seg_cap)
                    atc_write_part<HD>(part_o, part_ml, tl, g, group, nh, nrows, r0, r1, sg, ntok,
                                       m0, m1, l0, l1, *reinterpret_cast<float(*)[HD / 8][4]>(ov));
            continue;
        }
        /* merge the round's segments in order. buf holds the block prefetched for the next
         * round (if any); buf ^ 1 was consumed last and is refilled only after the barrier at
         * the end of this merge, so until then it holds this warp's partial. */
        float *pw = (float *)(stage + (size_t)(buf ^ 1) * 2 * SBLK);
#pragma unroll
        for (int i = 0; i < NR; i++)
            pw[i * 32 + lane] = ov[i];
        float *mw = pml + (size_t)warp * 4 * 32;
        mw[0 * 32 + lane] = m0;
        mw[1 * 32 + lane] = m1;
        mw[2 * 32 + lane] = l0;
        mw[3 * 32 + lane] = l1;
        if (lane == 0) pbuf[warp] = warp * 2 + (buf ^ 1);
        __syncthreads();
        for (int w = 0; w < ATC_DW && round * ATC_DW + w < nloc; w++) {
            /* row r's (m, l) sit in lanes 4 (r % 8) .. + 3, in slots r / 8 and 2 + r / 8 */
            const float *mv = pml + (size_t)w * 4 * 32;
            float a[R::SLOTS], b[R::SLOTS];
            bool u[R::SLOTS];
#pragma unroll
            for (int k = 0; k < R::SLOTS; k++) {
                const int r = R::row(k), at = 4 * (r % 8);
                a[k] = b[k] = 0.0f;
                u[k] = rw_attn_merge_ml(Mt[k], Lt[k], mv[(r / 8) * 32 + at],
                                        mv[(2 + r / 8) * 32 + at], a[k], b[k]);
            }
            const float *pv = (const float *)(sm + (size_t)pbuf[w] * 2 * SBLK);
            for (int i = i0; i < i1; i++) {
                const int k = R::slot(i);
                if (!atc_pick(u, k)) continue;
                float &O = oacc[i * 32 + lane];
                O = __fadd_rn(__fmul_rn(O, atc_pick(a, k)),
                              __fmul_rn(pv[i * 32 + lane], atc_pick(b, k)));
            }
        }
        __syncthreads(); /* the partial slots are rewritten next round */
    }
    rw_cp_async_wait<0>();
    if (nsplit != 0) return;
    for (int i = i0; i < i1; i++) {
        const int k = R::slot(i), r = R::row(k);
        if (r >= nrows) continue;
        const int64_t at = ((tl.tok0 + r / group) * nh + g * group + r % group) * HD + R::dim(i);
        const float v = __fdiv_rn(oacc[i * 32 + lane], atc_pick(Lt, k));
        const uint16_t hv = rw_f32_to_bf16(v);
        out_hi[at] = hv;
        if (out_lo) out_lo[at] = rw_bf16_split_lo(v, hv);
    }
}

/* Merges the segments of every (token, head) in order, with the kernel's merge. */
__global__ void atc_combine_kernel(const float *__restrict__ part_o,
                                   const float2 *__restrict__ part_ml,
                                   const int32_t *__restrict__ pos, int64_t ntok, int nh, int hd,
                                   uint16_t *__restrict__ out_hi, uint16_t *__restrict__ out_lo) {
    rw_pdl_begin();
    const int64_t th = blockIdx.x; /* token * nh + head */
    const int nseg = pos[th / nh] / ATC_SEG + 1;
    for (int d = threadIdx.x; d < hd; d += blockDim.x) {
        float M = -INFINITY, L = 0.0f, O = 0.0f;
        for (int s = 0; s < nseg; s++) {
            const int64_t b = (int64_t)s * ntok * nh + th;
            const float2 ml = part_ml[b];
            float a, bb;
            if (!rw_attn_merge_ml(M, L, ml.x, ml.y, a, bb)) continue;
            O = __fadd_rn(__fmul_rn(O, a), __fmul_rn(part_o[b * hd + d], bb));
        }
        const float v = __fdiv_rn(O, L);
        const uint16_t hv = rw_f32_to_bf16(v);
        out_hi[th * hd + d] = hv;
        if (out_lo) out_lo[th * hd + d] = rw_bf16_split_lo(v, hv);
    }
}

template <int HD> static constexpr size_t atc_smem() {
    return (size_t)4 * ATC_KB * HD * 2 + (size_t)4 * (HD / 2) * 32 * 4;
}
template <int HD> static constexpr size_t atc_decode_smem() {
    return (size_t)ATC_DW * 4 * ATC_SB * HD * 2 + (size_t)ATC_DW * 4 * 32 * 4 +
           (size_t)(HD / 2) * 32 * 4;
}

/* ------------------------------------------------------------------------------------------ */
/* launcher                                                                                     */
/* ------------------------------------------------------------------------------------------ */
extern "C" size_t rw_k_attention_part_bytes(int64_t ntok, int nh, int hd, int segments) {
    if (segments < 1 || ntok < 1) return 0;
    return (size_t)segments * (size_t)ntok * (size_t)nh * ((size_t)hd * 4 + 8) + 256;
}

extern "C" int rw_k_attention_tile_tokens(int nh, int nkv) {
    const int group = nkv > 0 ? nh / nkv : 1;
    const int t = group > 0 ? ATC_ROWS / group : 1;
    return t < 1 ? 1 : t > RW_ATTN_QT ? RW_ATTN_QT : t;
}

template <int HD>
static rw_status atc_launch(const float *q, const uint16_t *kc, const uint16_t *vc,
                            const rw_attn_tile *tiles, int ntiles, int qt, const int32_t *pos,
                            const int32_t *bt, int bt_stride, int64_t ntok, int nh, int nkv,
                            int bs, int nsplit, void *part, size_t part_bytes, uint16_t *out_hi,
                            uint16_t *out_lo, rw_stream s, rw_err *err) {
    const int group = nh / nkv;
    float *po = NULL;
    float2 *pml = NULL;
    int seg_cap = 0;
    if (nsplit > 0) {
        const size_t per = (size_t)ntok * nh * ((size_t)HD * 4 + 8);
        seg_cap = part_bytes > 256 ? (int)((part_bytes - 256) / per) : 0;
        if (seg_cap < 1)
            RW_FAIL(err, RW_E_INVALID_ARG, "attention: %zu bytes of scratch hold no segment",
                    part_bytes);
        po = (float *)part;
        pml = (float2 *)((uint8_t *)part + (size_t)seg_cap * ntok * nh * HD * 4);
    }
    dim3 grid((unsigned)ntiles, (unsigned)nkv, (unsigned)(nsplit > 0 ? nsplit : 1));
    const float qscale = (float)(1.4426950408889634 / sqrt((double)HD));
    cudaStream_t st = (cudaStream_t)s;
    /* tiles of one fragment (decode) spread key segments over the warps; larger tiles spread
     * their row fragments; the smem attributes are the kernels' fixed needs, so captured graphs
     * stay launchable whatever is launched in between */
    if (qt * group <= 16) {
        /* unsplit: the keys on the MMA's M side (atc_block_t), in one row fragment for up to 8
         * rows (a b256 step: 160.1 -> 140.9 us a layer for 256 x 1k keys on an H200); split:
         * the rows on the M side (atc_block), which measured faster when few CTAs share the
         * GPU (32 x 8k in 2 splits: 178 vs 208 us; a b1 step 11.9 vs 14.3 us). Both give the
         * same bits (docs/BENCHMARKS.md, fifth session). */
        const size_t sm = atc_decode_smem<HD>();
        auto kern = nsplit > 0          ? atc_decode_kernel<HD, false, 2>
                    : qt * group <= 8 ? atc_decode_kernel<HD, true, 1>
                                      : atc_decode_kernel<HD, true, 2>;
        RW_CUDA_CHECK(err, cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                (int)sm));
        (void)rw_launch_pdl(kern, grid, ATC_DW * 32, sm, st, q, kc, vc, tiles, pos, bt, bt_stride,
                            nh, nkv, bs, nsplit, qscale, out_hi, out_lo, po, pml, ntok, seg_cap);
    } else {
        const size_t sm = atc_smem<HD>();
        RW_CUDA_CHECK(err, cudaFuncSetAttribute(atc_kernel<HD>,
                                                cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                (int)sm));
        (void)rw_launch_pdl(atc_kernel<HD>, grid, ATC_THREADS, sm, st, q, kc, vc, tiles, pos, bt,
                            bt_stride, nh, nkv, bs, nsplit, qscale, out_hi, out_lo, po, pml, ntok,
                            seg_cap);
    }
    RW_CHECK(LAUNCH_CHECK(s, "attention"));
    if (nsplit > 0) {
        (void)rw_launch_pdl(atc_combine_kernel, dim3((unsigned)(ntok * nh)), 128, 0, st, po, pml,
                            pos, ntok, nh, HD, out_hi, out_lo);
        RW_CHECK(LAUNCH_CHECK(s, "attention combine"));
    }
    return RW_OK;
}

extern "C" rw_status rw_k_attention(const float *q, const uint16_t *kcache,
                                    const uint16_t *vcache, const rw_attn_tile *tiles, int ntiles,
                                    int qt, const int32_t *pos, const int32_t *bt, int bt_stride,
                                    int64_t ntok, int nh, int nkv, int hd, int bs, int nsplit,
                                    void *part, size_t part_bytes, uint16_t *out_hi,
                                    uint16_t *out_lo, rw_stream s, rw_err *err) {
    if (ntiles <= 0) return RW_OK;
    if (nkv < 1 || nh % nkv)
        RW_FAIL(err, RW_E_UNSUPPORTED, "attention: %d heads over %d kv heads", nh, nkv);
    if (nh / nkv > 16)
        RW_FAIL(err, RW_E_UNSUPPORTED, "attention: %d q heads per kv head (at most 16)", nh / nkv);
    if (qt < 1 || qt > RW_ATTN_QT || qt * (nh / nkv) > ATC_ROWS)
        RW_FAIL(err, RW_E_INVALID_ARG,
                "attention: tiles of up to %d tokens of %d heads (1..%d tokens, at most %d rows)",
                qt, nh / nkv, RW_ATTN_QT, ATC_ROWS);
    if (bs % 16 != 0) RW_FAIL(err, RW_E_UNSUPPORTED, "attention: block size %d %% 16", bs);
    if (nsplit < 0 || (nsplit > 0 && !part))
        RW_FAIL(err, RW_E_INVALID_ARG, "attention: nsplit %d without scratch", nsplit);
    switch (hd) {
    case 32:
        return atc_launch<32>(q, kcache, vcache, tiles, ntiles, qt, pos, bt, bt_stride, ntok, nh,
                              nkv, bs, nsplit, part, part_bytes, out_hi, out_lo, s, err);
    case 64:
        return atc_launch<64>(q, kcache, vcache, tiles, ntiles, qt, pos, bt, bt_stride, ntok, nh,
                              nkv, bs, nsplit, part, part_bytes, out_hi, out_lo, s, err);
    case 128:
        return atc_launch<128>(q, kcache, vcache, tiles, ntiles, qt, pos, bt, bt_stride, ntok, nh,
                               nkv, bs, nsplit, part, part_bytes, out_hi, out_lo, s, err);
    default: RW_FAIL(err, RW_E_UNSUPPORTED, "attention: head_dim %d (32, 64 or 128)", hd);
    }
}
