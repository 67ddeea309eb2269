/* experts.cu - MoE routing and the expert computation on the packed layout, on the device.
 * CPU references: rw_moe_route_ref (route.c) and rw_moe_experts_ref (experts.c).
 *
 * Pipeline of rw_moe_experts_cuda for a chunk of nt tokens (A = nt * k assignments):
 *   1-3. sort:   counts per local expert, offsets, tile list of TN-row tiles per expert, and a
 *                stable sort of the assignments by expert -> perm (sorted row -> assignment) and
 *                inv (assignment -> sorted row); same order on every run     (1 CTA)
 *   4. w13 GEMM: for each (tile, 128 packed rows of w13): acc = W13 x^T with tensor cores
 *                (mma.sync m16n8k16 bf16, fp32 accumulate); the packed row order puts up_j in
 *                rows 0-7 and gate_j in rows 8-15 of every 16-row group, so one thread holds
 *                both halves: act[row][j] = bf16(silu(gate) * up)              (grid tiles x
 * 2P/128)
 *   5. w2 GEMM:  y[row][h] = W2 act^T, rows un-shuffled to canonical h       (grid tiles x H/128)
 *   6. combine:  out[t] += sum_j w[t, j] * y[inv[t*k + j]] in slot order      (deterministic)
 * mxfp8 and fp8-block layers run weight-only: the e4m3 tile is dequantized to bf16 in shared
 * memory (exactly: e4m3 times a power of two, or times the fp32 block scale rounded to bf16 for
 * fp8-block) and the math is bf16. Every output element is computed by one thread in a fixed
 * order, so results do not depend on the run or on atomics.
 *
 * Split activations (x_lo != NULL): the GEMM inputs carry about 16 significant bits as a pair of
 * bf16 arrays, x ~= hi + lo (hi = bf16(x), lo = bf16(x - hi)). Each k16 step of both GEMMs then
 * runs two mma into the same fp32 accumulators, acc += W hi, then acc += W lo (always in that
 * order), and the w13 epilogue writes act as such a pair too. Rounding the activations to bf16
 * is what flips near-tied routing decisions of later layers; the weights are unchanged (the
 * products stay exact in fp32), only the B tile doubles.
 *
 * Shared-memory tiles are [rows][8 x 16-byte chunks] with chunk c of row r stored at c ^ (r & 7)
 * (rw_swz128) so ldmatrix reads are free of bank conflicts; the PTX wrappers are core/mma.cuh. */
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include "cuda_check.h"
#include "launch.cuh"
#include "mma.cuh"
#include "route.cuh"
#include "rw_moe.h"

/* Warps of a CTA: 4 along the 128 weight rows (32 each) times MOE_WN(TN) along the TN tokens.
 * Wide (prefill) tiles split their tokens over 2 warp columns: 8 warps per SM instead of 4 hide the
 * ldmatrix -> mma latency that one warp per scheduler leaves exposed, and halve the accumulators
 * per thread. Narrow (decode) tiles keep 4 warps: 8 warps of 16 rows each measured slower from
 * 16 tokens up on an H200 (docs/BENCHMARKS.md); with 16 rows a warp loads the same B fragments
 * for half as many MMAs. Which warp computes an output does not change how: one thread, one
 * k16 order. */
#define MOE_WN(TN) ((TN) >= 128 ? 2 : 1)
#define MOE_THREADS_FOR(TN) (128 * MOE_WN(TN))
#define MOE_BM 128
/* cp.async pipeline depth: narrow (decode) tiles are pure weight streaming and keep one more
 * 16 KB weight block in flight */
#define MOE_STAGES_FOR(TN) ((TN) <= 32 ? 4 : 3)
/* A decode grid of at most one wave (a one-token step: 8 x 12 and 8 x 16 CTAs) has few CTAs to
 * share the memory system, so each keeps more weight blocks in flight: 6 stages. Larger grids
 * keep 4, which leaves room for 2 CTAs per SM. */
#define MOE_DEEP_STAGES 6
/* The narrowest tile, for batches of at most one assignment per expert on average (a decode step
 * of up to E / k tokens): most experts then hold one or two tokens, and 16 columns instead of 32
 * halve the mma work and the activation bytes of a CTA that streams the same weights. The B
 * fragments are loaded in pairs of n8 tiles, so 16 is the least. */
#define MOE_TN_MIN 16
#define MAX_TOPK RW_MOE_MAX_TOPK

/* ------------------------------------------------------------------------------------------ */
/* routing                                                                                      */
/* ------------------------------------------------------------------------------------------ */
/* One warp per token (route.cuh). */
template <int EPL>
__global__ void route_kernel(const float *__restrict__ logits, int64_t ntok, int E, int k,
                             bool renorm, int32_t *__restrict__ ids, float *__restrict__ wts) {
    rw_pdl_begin();
    const int64_t t = (int64_t)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    if (t >= ntok) return;
    rw_moe_route_warp<EPL>(logits + t * E, E, k, renorm, ids + t * k, wts + t * k);
}

/* ------------------------------------------------------------------------------------------ */
/* sort by expert and tile schedule                                                             */
/* ------------------------------------------------------------------------------------------ */
/* One CTA. The assignments are cut into SORT_PW(E) contiguous chunks, one per placement warp:
 *   1. each placement warp counts its chunk's assignments per expert (__match_any_sync groups
 *      the lanes routed to the same expert; the group's first lane adds) into wc[warp][e];
 *   2. one thread per expert turns wc[.][e] into exclusive per-warp bases (warp order) and the
 *      expert's count; warp 0 scans the counts and the tile counts over the experts (each lane a
 *      contiguous run of experts, then a warp scan) -> off[e], the tile list, ntiles;
 *   3. each placement warp walks its chunk in order and places assignment a of expert e at
 *      off[e] + (its warp base) + (earlier ones of its chunk).
 * The result is the stable order (by assignment index within each expert) on every run, found
 * in A / (32 * SORT_PW) steps instead of A / 32. perm: sorted row -> assignment; inv: assignment
 * -> sorted row, -1 for ids outside [0, E) (not a local expert). E <= 1024. */
#define SORT_WC 4096 /* wc entries: placement warps x experts */
#define SORT_PW(E) ((E)*32 <= SORT_WC ? 32 : (SORT_WC / (E) > 0 ? SORT_WC / (E) : 1))
__global__ void __launch_bounds__(1024)
    sort_kernel(const int32_t *__restrict__ ids, int64_t A, int E, int tn,
                int32_t *__restrict__ off, int2 *__restrict__ tiles, int32_t *__restrict__ ntiles,
                int32_t *__restrict__ perm, int32_t *__restrict__ inv) {
    rw_pdl_begin();
    __shared__ int32_t wc[SORT_WC]; /* [pw][E]: counts, then bases, then cursors */
    __shared__ int32_t eoff[1024];  /* first sorted row of each expert */
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int pw = SORT_PW(E);
    const int64_t chunk = (A + pw - 1) / pw;
    for (int i = tid; i < pw * E; i += blockDim.x)
        wc[i] = 0;
    __syncthreads();
    if (warp < pw) {
        const int64_t a0 = (int64_t)warp * chunk, a1 = min(A, a0 + chunk);
        int32_t *mine = wc + warp * E;
        for (int64_t b = a0; b < a1; b += 32) {
            const int64_t a = b + lane;
            const int32_t e = a < a1 ? ids[a] : -1;
            const bool valid = a < a1 && e >= 0 && e < E;
            if (a < a1 && !valid) inv[a] = -1;
            const unsigned mask = __match_any_sync(0xffffffffu, valid ? e : -1);
            if (valid && lane == __ffs(mask) - 1) mine[e] += __popc(mask);
            __syncwarp();
        }
    }
    __syncthreads();
    for (int e = tid; e < E; e += blockDim.x) { /* per-warp bases; the total into eoff for now */
        int32_t run = 0;
        for (int w = 0; w < pw; w++) {
            const int32_t c = wc[w * E + e];
            wc[w * E + e] = run;
            run += c;
        }
        eoff[e] = run;
    }
    __syncthreads();
    if (warp == 0) {
        /* lane l owns experts [l * per, (l + 1) * per): local sums, warp exclusive scan */
        const int per = (E + 31) / 32;
        const int e0 = min(E, lane * per), e1 = min(E, e0 + per);
        int32_t rows = 0, nt = 0;
        for (int e = e0; e < e1; e++) {
            rows += eoff[e];
            nt += (eoff[e] + tn - 1) / tn;
        }
        int32_t rows_x = rows, nt_x = nt; /* inclusive scans */
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
            const int32_t r = __shfl_up_sync(0xffffffffu, rows_x, o);
            const int32_t q = __shfl_up_sync(0xffffffffu, nt_x, o);
            if (lane >= o) {
                rows_x += r;
                nt_x += q;
            }
        }
        int32_t o = rows_x - rows, t = nt_x - nt;
        for (int e = e0; e < e1; e++) {
            const int32_t c = eoff[e];
            off[e] = o;
            eoff[e] = o;
            for (int r = 0; r < c; r += tn)
                tiles[t++] = make_int2(e, o + r);
            o += c;
        }
        if (lane == 31) {
            off[E] = rows_x;
            *ntiles = nt_x;
        }
    }
    __syncthreads();
    if (warp < pw) {
        const int64_t a0 = (int64_t)warp * chunk, a1 = min(A, a0 + chunk);
        int32_t *cur = wc + warp * E;
        for (int64_t b = a0; b < a1; b += 32) {
            const int64_t a = b + lane;
            const int32_t e = a < a1 ? ids[a] : -1;
            const bool valid = a < a1 && e >= 0 && e < E;
            const unsigned mask = __match_any_sync(0xffffffffu, valid ? e : -1);
            const int base = valid ? eoff[e] + cur[e] : 0;
            __syncwarp();
            if (valid && lane == __ffs(mask) - 1) cur[e] += __popc(mask);
            __syncwarp();
            if (valid) {
                const int p = base + __popc(mask & ((1u << lane) - 1u));
                perm[p] = (int32_t)a;
                inv[a] = p;
            }
        }
    }
}

/* packed row -> canonical local row (w13: interleave + shuffle inverse; w2: shuffle inverse) */
__device__ __forceinline__ int64_t canon13(int64_t n, int64_t P) {
    const int64_t i = 32 * (n / 32) + 4 * (n % 8) + (n % 32) / 8;
    return (i % 2 == 0) ? i / 2 : P + i / 2;
}
__device__ __forceinline__ int64_t unshuffle(int64_t n) {
    return 32 * (n / 32) + 4 * (n % 8) + (n % 32) / 8;
}

enum { FMT_BF16 = 0, FMT_MX = 1, FMT_FP8B = 2 };

struct gemm_args {
    const void *w;      /* packed weights of the layer, all local experts */
    const void *wscale; /* packed scales (quantized formats) */
    int64_t w_expert;   /* bytes per expert of w */
    int64_t s_expert;   /* bytes per expert of wscale */
    int64_t M, K;       /* rows (2P or H) and reduction length (H or P) of one expert */
    int64_t P, H;
    int64_t scale_cols;          /* fp8-block: column blocks; mxfp8: Kt (swizzle) */
    const __nv_bfloat16 *xin;    /* w13: x [ntok, H] gathered through perm; w2: act [A, P] */
    const __nv_bfloat16 *xin_lo; /* split mode: low halves of xin, same layout */
    const int32_t *perm, *off;
    const int2 *tiles;
    const int32_t *ntiles;
    int k;                 /* top-k (w13 gathers token perm[row] / k) */
    __nv_bfloat16 *act;    /* w13 output [A, P] */
    __nv_bfloat16 *act_lo; /* split mode: act_lo = bf16(v - act) */
    float *y;              /* w2 output [A, H] */
};

/* One CTA: 128 weight rows [m0, m0+128) of expert e times TN sorted rows [r0, r0+TN) of its
 * tokens, K in steps of 64. SPLIT: the B operand is the pair xin + xin_lo (two B tiles per stage)
 * and the w13 epilogue writes act + act_lo. */
template <int TN, int FMT, bool W13, bool SPLIT, int MOE_STAGES = MOE_STAGES_FOR(TN)>
__global__ void __launch_bounds__(MOE_THREADS_FOR(TN)) moe_gemm_kernel(gemm_args g) {
    rw_pdl_begin();
    constexpr int MOE_THREADS = MOE_THREADS_FOR(TN), NTW = TN / MOE_WN(TN); /* tokens per warp */
    extern __shared__ __align__(128) uint8_t smem[];
    const int tile = blockIdx.x;
    if (tile >= *g.ntiles) return;
    const int2 td = g.tiles[tile];
    const int e = td.x, r0 = td.y;
    const int rend = g.off[e + 1];
    const int64_t m0 = (int64_t)blockIdx.y * MOE_BM;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int wm = warp & 3, wn = warp >> 2; /* 32 weight rows, NTW tokens */
    const int nkb = (int)(g.K / 64);

    /* layout: [stage][A 16 KB | B TN*128 B] for bf16; quantized: [stage][A8 8 KB | B], then one
     * bf16 A tile the stage is dequantized into. SPLIT: B is followed by the B_lo tile. */
    constexpr int A_BYTES = MOE_BM * 128;
    constexpr int A8_BYTES = MOE_BM * 64;
    constexpr int B_BYTES = TN * 128;
    constexpr int STAGE = (FMT == FMT_BF16 ? A_BYTES : A8_BYTES) + (SPLIT ? 2 : 1) * B_BYTES;
    uint8_t *deq = smem + MOE_STAGES * STAGE; /* quantized formats only */
    /* mxfp8: the UE8M0 scales of the CTA's 128 rows over all of K, one contiguous swizzled run of
     * scale_cols * 512 bytes (rw_moe_scale_swizzle with m / 128 fixed), loaded with the first
     * stage so the K loop never waits on a global load for its scales */
    uint8_t *ssc = deq + MOE_BM * 128;
    __shared__ int64_t brow_src[TN];    /* element offset of each B row, -1 = zero row */
    __shared__ float rscale[MOE_BM][2]; /* per-row scales of the current 64-column block */

    for (int r = tid; r < TN; r += MOE_THREADS) {
        const int sr = r0 + r;
        int64_t src = -1;
        if (sr < rend) src = W13 ? (int64_t)(g.perm[sr] / g.k) * g.H : (int64_t)sr * g.P;
        brow_src[r] = src;
    }
    __syncthreads();

    const uint8_t *wexp = (const uint8_t *)g.w + (int64_t)e * g.w_expert;
    auto load_stage = [&](int st, int kb) {
        uint8_t *sa = smem + st * STAGE;
        uint8_t *sb = sa + (FMT == FMT_BF16 ? A_BYTES : A8_BYTES);
        if (FMT == FMT_BF16) {
            /* [K/64, M, 64]: rows m0.. of block kb are 16 KB contiguous */
            const uint8_t *src = wexp + ((int64_t)kb * g.M + m0) * 128;
#pragma unroll
            for (int i = 0; i < A_BYTES / 16 / MOE_THREADS; i++) {
                const int q = i * MOE_THREADS + tid, r = q >> 3, c = q & 7;
                rw_cp_async16(sa + rw_swz128(r, c), src + (int64_t)q * 16, 16);
            }
        } else {
            /* e4m3 [M, K]: 64 bytes of row n at n*K + kb*64; fp8-block rows are in canonical
             * order and read through the packed->canonical map so the epilogue is shared */
#pragma unroll
            for (int i = 0; i < A8_BYTES / 16 / MOE_THREADS; i++) {
                const int q = i * MOE_THREADS + tid, r = q >> 2, c = q & 3;
                int64_t n = m0 + r;
                if (FMT == FMT_FP8B && W13) n = canon13(n, g.P);
                rw_cp_async16(sa + r * 64 + c * 16, wexp + n * g.K + (int64_t)kb * 64 + c * 16, 16);
            }
        }
        const int chunks = TN * 8;
        for (int q = tid; q < chunks; q += MOE_THREADS) {
            const int r = q >> 3, c = q & 7;
            const int64_t s = brow_src[r];
            const int64_t o = (s < 0 ? 0 : s) + (int64_t)kb * 64 + c * 8;
            rw_cp_async16(sb + rw_swz128(r, c), g.xin + o, s < 0 ? 0 : 16);
            if (SPLIT) rw_cp_async16(sb + B_BYTES + rw_swz128(r, c), g.xin_lo + o, s < 0 ? 0 : 16);
        }
    };

    float acc[2][NTW / 8][4];
#pragma unroll
    for (int a = 0; a < 2; a++)
#pragma unroll
        for (int b = 0; b < NTW / 8; b++)
#pragma unroll
            for (int c = 0; c < 4; c++)
                acc[a][b][c] = 0.0f;

    if (FMT == FMT_MX) { /* joins the first stage's commit group */
        const uint8_t *src =
            (const uint8_t *)g.wscale + (int64_t)e * g.s_expert + (m0 / 128) * g.scale_cols * 512;
        for (int64_t q = tid; q < g.scale_cols * 32; q += MOE_THREADS)
            rw_cp_async16(ssc + q * 16, src + q * 16, 16);
    }
#pragma unroll
    for (int s = 0; s < MOE_STAGES - 1; s++) {
        if (s < nkb) load_stage(s, s);
        rw_cp_async_commit();
    }
    for (int kb = 0; kb < nkb; kb++) {
        rw_cp_async_wait<MOE_STAGES - 2>();
        __syncthreads();
        const int st = kb % MOE_STAGES;
        uint8_t *sa = smem + st * STAGE;
        uint8_t *sb = sa + (FMT == FMT_BF16 ? A_BYTES : A8_BYTES);
        if (FMT != FMT_BF16) {
            /* per-row scales of this 64-column block, then dequantize row tid into the bf16
             * tile */
            const uint8_t *sexp = (const uint8_t *)g.wscale + (int64_t)e * g.s_expert;
            if (tid < MOE_BM) {
                const int r = tid;
                const int64_t n = m0 + r;
                if (FMT == FMT_MX) {
                    const int64_t kc = (int64_t)kb * 2; /* row r of the CTA's 128: m % 128 = r */
                    rscale[r][0] = rw_ue8m0_to_f32(ssc[rw_moe_scale_swizzle(r, kc, g.scale_cols)]);
                    rscale[r][1] =
                        rw_ue8m0_to_f32(ssc[rw_moe_scale_swizzle(r, kc + 1, g.scale_cols)]);
                } else {
                    const int64_t cn = W13 ? canon13(n, g.P) : n;
                    const float s =
                        ((const float *)sexp)[(cn / 128) * g.scale_cols + ((int64_t)kb * 64) / 128];
                    rscale[r][0] = rscale[r][1] = s;
                }
                const uint8_t *q = sa + r * 64;
#pragma unroll
                for (int c = 0; c < 8; c++) {
                    /* hardware e4m3x2 -> half2 (exact), times the scale, to bf16x2 */
                    const uint2 raw = *(const uint2 *)(q + c * 8);
                    const float sc = rscale[r][c >> 2];
                    __align__(16) __nv_bfloat162 v[4];
                    const uint32_t w[2] = {raw.x, raw.y};
#pragma unroll
                    for (int i = 0; i < 4; i++) {
                        const __nv_fp8x2_storage_t pr =
                            (__nv_fp8x2_storage_t)((w[i >> 1] >> ((i & 1) * 16)) & 0xffffu);
                        const __half2 h2 = __half2(__nv_cvt_fp8x2_to_halfraw2(pr, __NV_E4M3));
                        const float2 f = __half22float2(h2);
                        v[i] = __floats2bfloat162_rn(f.x * sc, f.y * sc);
                    }
                    *(uint4 *)(deq + rw_swz128(r, c)) = *(const uint4 *)v;
                }
            }
            __syncthreads();
            sa = deq;
        }
        {
            const int nk = kb + MOE_STAGES - 1;
            if (nk < nkb) load_stage(nk % MOE_STAGES, nk);
            rw_cp_async_commit();
        }
#pragma unroll
        for (int ks = 0; ks < 4; ks++) {
            uint32_t a[2][4];
#pragma unroll
            for (int mt = 0; mt < 2; mt++) {
                const int r = wm * 32 + mt * 16 + (lane & 7) + ((lane >> 3) & 1) * 8;
                const int c = ks * 2 + (lane >> 4);
                rw_ldsm_x4(a[mt][0], a[mt][1], a[mt][2], a[mt][3], sa + rw_swz128(r, c));
            }
#pragma unroll
            for (int nt = 0; nt < NTW / 8; nt += 2) {
                uint32_t b0, b1, b2, b3;
                const int r = wn * NTW + nt * 8 + ((lane >> 4) << 3) + (lane & 7);
                const int c = ks * 2 + ((lane >> 3) & 1);
                rw_ldsm_x4(b0, b1, b2, b3, sb + rw_swz128(r, c));
#pragma unroll
                for (int mt = 0; mt < 2; mt++) {
                    rw_mma_bf16_16816(acc[mt][nt], a[mt], b0, b1);
                    rw_mma_bf16_16816(acc[mt][nt + 1], a[mt], b2, b3);
                }
                if (SPLIT) {
                    /* the low halves, after the high halves of the same k16 step: a fixed
                     * order per accumulator, independent of TN and of the other columns */
                    rw_ldsm_x4(b0, b1, b2, b3, sb + B_BYTES + rw_swz128(r, c));
#pragma unroll
                    for (int mt = 0; mt < 2; mt++) {
                        rw_mma_bf16_16816(acc[mt][nt], a[mt], b0, b1);
                        rw_mma_bf16_16816(acc[mt][nt + 1], a[mt], b2, b3);
                    }
                }
            }
        }
    }
    rw_cp_async_wait<0>();

    /* epilogue: C fragment rows g, g+8 (weight rows), columns 2c, 2c+1 (tokens) */
    const int gq = lane >> 2, cq = lane & 3;
#pragma unroll
    for (int mt = 0; mt < 2; mt++) {
        const int64_t mrow = m0 + wm * 32 + mt * 16; /* first packed row of this m16 tile */
#pragma unroll
        for (int nt = 0; nt < NTW / 8; nt++)
#pragma unroll
            for (int h = 0; h < 2; h++) {
                const int col = wn * NTW + nt * 8 + cq * 2 + h;
                const int sr = r0 + col;
                if (sr >= rend) continue;
                if (W13) {
                    const int64_t j = 16 * (mrow / 32) + 2 * gq + ((mrow % 32) == 16 ? 1 : 0);
                    const float up = acc[mt][nt][h], gate = acc[mt][nt][2 + h];
                    const float v = gate / (1.0f + expf(-gate)) * up;
                    const __nv_bfloat16 hi = __float2bfloat16(v); /* round to nearest even */
                    g.act[(int64_t)sr * g.P + j] = hi;
                    /* v - hi is exact in fp32; its rounding leaves |v - hi - lo| <= 2^-16 |v| */
                    if (SPLIT)
                        g.act_lo[(int64_t)sr * g.P + j] =
                            __float2bfloat16(v - __bfloat162float(hi));
                } else {
#pragma unroll
                    for (int half = 0; half < 2; half++) {
                        const int64_t n = mrow + gq + half * 8;
                        const int64_t hrow = FMT == FMT_FP8B ? n : unshuffle(n);
                        g.y[(int64_t)sr * g.H + hrow] = acc[mt][nt][half * 2 + h];
                    }
                }
            }
    }
}

/* out[t, h] += sum_j w[t, j] * y[inv[t*k + j], h], slots in order. A CTA takes one token and
 * COMBINE_COLS columns: the token's k rows and weights are read once, and each thread issues its k
 * loads of y before the first add. (One CTA per token walking all H columns waited on k dependent
 * loads per column: 31 us for a one-token decode step, measured with ncu on an H200, against 5 us
 * for the sort and 45 us for both GEMMs.) The sum is the same expression in the same slot order. */
#define COMBINE_COLS 256
__global__ void __launch_bounds__(COMBINE_COLS)
    combine_kernel(const float *__restrict__ y, const int32_t *__restrict__ inv,
                   const float *__restrict__ wts, int64_t nt, int k, int64_t H,
                   float *__restrict__ out) {
    rw_pdl_begin();
    __shared__ int32_t rows[MAX_TOPK];
    __shared__ float ws[MAX_TOPK];
    const int64_t t = blockIdx.x;
    if (threadIdx.x < k) {
        rows[threadIdx.x] = inv[t * k + threadIdx.x];
        ws[threadIdx.x] = wts[t * k + threadIdx.x];
    }
    __syncthreads();
    const int64_t h = (int64_t)blockIdx.y * COMBINE_COLS + threadIdx.x;
    if (h >= H) return;
    float yv[MAX_TOPK];
#pragma unroll
    for (int j = 0; j < MAX_TOPK; j++)
        yv[j] = j < k && rows[j] >= 0 ? y[(int64_t)rows[j] * H + h] : 0.0f;
    float s = 0.0f;
#pragma unroll
    for (int j = 0; j < MAX_TOPK; j++)
        if (j < k && rows[j] >= 0) s += ws[j] * yv[j];
    out[t * H + h] += s;
}

/* ------------------------------------------------------------------------------------------ */
/* launchers                                                                                    */
/* ------------------------------------------------------------------------------------------ */
extern "C" rw_status rw_moe_route_cuda(const float *logits, int64_t ntok, int E, int k, bool renorm,
                                       int32_t *ids, float *weights, rw_stream s, rw_err *err) {
    if (ntok <= 0) return RW_OK;
    if (E < 1 || E > 1024 || k < 1 || k > MAX_TOPK || k > E)
        return rw_err_set(err, RW_E_UNSUPPORTED, __FILE__, __LINE__,
                          "moe route (cuda): E = %d (1..1024), k = %d (1..%d)", E, k, MAX_TOPK);
    const int wpb = 8;
    const dim3 grid((unsigned)((ntok + wpb - 1) / wpb));
    const int epl = rw_moe_route_epl(E);
    auto kern = epl == 4 ? route_kernel<4> : epl == 8 ? route_kernel<8>
                                          : epl == 16 ? route_kernel<16> : route_kernel<32>;
    (void)rw_launch_pdl(kern, grid, wpb * 32, 0, (cudaStream_t)s, logits, ntok, E, k, renorm, ids,
                        weights);
    return RW_LAUNCH_CHECK(s, "moe route", err);
}

/* Workspace carve-up for a chunk of up to max_tok tokens. */
typedef struct moe_ws {
    int32_t *off, *perm, *inv, *ntiles;
    int2 *tiles;
    __nv_bfloat16 *act, *act_lo;
    float *y;
    size_t bytes;
} moe_ws;

static int64_t max_tiles(int64_t A, int64_t E, int tn) {
    return (A + tn - 1) / tn + E;
}

static moe_ws ws_layout(void *base, int64_t E, int64_t P, int64_t H, int64_t max_tok, int k) {
    moe_ws w;
    uint8_t *p = (uint8_t *)base;
    size_t o = 0;
    const int64_t A = max_tok * k;
#define TAKE(field, type, n)                                                                       \
    w.field = (type *)(p ? p + o : NULL);                                                          \
    o += ((size_t)(n) * sizeof(type) + 255) & ~(size_t)255;
    TAKE(off, int32_t, E + 1);
    TAKE(perm, int32_t, A);
    TAKE(inv, int32_t, A);
    TAKE(ntiles, int32_t, 1);
    TAKE(tiles, int2, max_tiles(A, E, MOE_TN_MIN));
    TAKE(act, __nv_bfloat16, A * P);
    TAKE(act_lo, __nv_bfloat16, A * P); /* split mode only; reserved always */
    TAKE(y, float, A *H);
#undef TAKE
    w.bytes = o;
    return w;
}

/* Tokens per pass: bounds the y buffer ([chunk * k, H] fp32). */
#define MOE_CHUNK 4096

extern "C" size_t rw_moe_experts_cuda_workspace(int64_t E, int64_t P, int64_t H, int64_t max_tok,
                                                int k) {
    const int64_t chunk = max_tok < MOE_CHUNK ? max_tok : MOE_CHUNK;
    return ws_layout(NULL, E, P, H, chunk < 1 ? 1 : chunk, k).bytes;
}

/* mxfp8 scales kept in shared memory: scale_cols * 512 bytes = 4 K bytes, K <= MOE_MX_MAX_K */
#define MOE_MX_MAX_K 8192

/* Dynamic shared memory of one moe_gemm_kernel instance (the layout in the kernel). The largest,
 * TN = 128 split with mxfp8 scales for K = MOE_MX_MAX_K, is 3 * (8 + 32) + 16 + 32 = 168 KB; bf16
 * TN = 128 split is 3 * (16 + 32) = 144 KB: all within sm_90's 227 KB with the same stages. */
template <int TN, int FMT, bool SPLIT, int ST = MOE_STAGES_FOR(TN)>
static constexpr size_t gemm_smem(int64_t scale_cols) {
    return (size_t)ST *
               ((FMT == FMT_BF16 ? MOE_BM * 128 : MOE_BM * 64) + (SPLIT ? 2 : 1) * TN * 128) +
           (FMT == FMT_BF16 ? 0 : MOE_BM * 128) + (FMT == FMT_MX ? (size_t)scale_cols * 512 : 0);
}
static_assert(gemm_smem<128, FMT_MX, true>(MOE_MX_MAX_K / 128) + 2 * 1024 <= 227 * 1024,
              "moe gemm: split-mode tiles exceed the shared memory of sm_90");
static_assert(gemm_smem<128, FMT_BF16, true>(0) + 2 * 1024 <= 227 * 1024,
              "moe gemm: split-mode tiles exceed the shared memory of sm_90");
static_assert(gemm_smem<32, FMT_MX, true, MOE_DEEP_STAGES>(MOE_MX_MAX_K / 128) + 2 * 1024 <=
                  227 * 1024,
              "moe gemm: deep decode tiles exceed the shared memory of sm_90");

template <int TN, int FMT, bool W13, bool SPLIT, int ST = MOE_STAGES_FOR(TN)>
static rw_status launch_gemm(const gemm_args &g, int64_t grid_x, rw_stream s, rw_err *err) {
    const size_t sm = gemm_smem<TN, FMT, SPLIT, ST>(g.scale_cols);
    /* the attribute is the largest any K can ask for, so graphs captured for another model (K)
     * stay launchable */
    const size_t sm_max = gemm_smem<TN, FMT, SPLIT, ST>(MOE_MX_MAX_K / 128);
    RW_CUDA_CHECK(err,
                  cudaFuncSetAttribute(moe_gemm_kernel<TN, FMT, W13, SPLIT, ST>,
                                       cudaFuncAttributeMaxDynamicSharedMemorySize, (int)sm_max));
    dim3 grid((unsigned)grid_x, (unsigned)(g.M / MOE_BM));
    (void)rw_launch_pdl(moe_gemm_kernel<TN, FMT, W13, SPLIT, ST>, grid, MOE_THREADS_FOR(TN), sm,
                        (cudaStream_t)s, g);
    return RW_LAUNCH_CHECK(s, W13 ? "moe w13 gemm" : "moe w2 gemm", err);
}

template <int TN, bool W13, int ST = MOE_STAGES_FOR(TN)>
static rw_status launch_fmt(int fmt, bool split, const gemm_args &g, int64_t grid_x, rw_stream s,
                            rw_err *err) {
    if (split) {
        if (fmt == FMT_BF16) return launch_gemm<TN, FMT_BF16, W13, true, ST>(g, grid_x, s, err);
        if (fmt == FMT_MX) return launch_gemm<TN, FMT_MX, W13, true, ST>(g, grid_x, s, err);
        return launch_gemm<TN, FMT_FP8B, W13, true, ST>(g, grid_x, s, err);
    }
    if (fmt == FMT_BF16) return launch_gemm<TN, FMT_BF16, W13, false, ST>(g, grid_x, s, err);
    if (fmt == FMT_MX) return launch_gemm<TN, FMT_MX, W13, false, ST>(g, grid_x, s, err);
    return launch_gemm<TN, FMT_FP8B, W13, false, ST>(g, grid_x, s, err);
}

/* One GEMM pass (w13 or w2) with tiles of tn tokens; narrow tiles in a grid of at most one wave
 * keep MOE_DEEP_STAGES blocks in flight. */
template <bool W13>
static rw_status launch_pass(int tn, int fmt, bool split, const gemm_args &g, int64_t grid_x,
                             int sms, rw_stream s, rw_err *err) {
    if (tn == 128) return launch_fmt<128, W13>(fmt, split, g, grid_x, s, err);
    if (tn == 16) {
        if (grid_x * (g.M / MOE_BM) <= sms)
            return launch_fmt<16, W13, MOE_DEEP_STAGES>(fmt, split, g, grid_x, s, err);
        return launch_fmt<16, W13>(fmt, split, g, grid_x, s, err);
    }
    if (grid_x * (g.M / MOE_BM) <= sms)
        return launch_fmt<32, W13, MOE_DEEP_STAGES>(fmt, split, g, grid_x, s, err);
    return launch_fmt<32, W13>(fmt, split, g, grid_x, s, err);
}

extern "C" rw_status rw_moe_experts_cuda(const rw_layer_weights *lw, const rw_tp_dims *d, int64_t H,
                                         const uint16_t *x, const uint16_t *x_lo, int64_t ntok,
                                         const int32_t *ids, const float *weights, int k,
                                         float *out, void *ws, size_t ws_bytes, rw_stream s,
                                         rw_err *err) {
    if (ntok <= 0) return RW_OK;
    if (!lw || !d || !x || !ids || !weights || !out || !ws || k < 1)
        return rw_err_set(err, RW_E_INVALID_ARG, __FILE__, __LINE__,
                          "moe experts (cuda): NULL argument or k = %d", k);
    const int64_t P = d->P, E = lw->w13.shape[0];
    if (E > 1024)
        return rw_err_set(err, RW_E_UNSUPPORTED, __FILE__, __LINE__,
                          "moe experts (cuda): %lld local experts (at most 1024)", (long long)E);
    if (H % 128 != 0 || P % 128 != 0)
        return rw_err_set(err, RW_E_UNSUPPORTED, __FILE__, __LINE__,
                          "moe experts (cuda): H = %lld and P = %lld must be multiples of 128",
                          (long long)H, (long long)P);
    if (lw->moe_fmt == RW_WFMT_MXFP8 && (H > MOE_MX_MAX_K || P > MOE_MX_MAX_K))
        return rw_err_set(err, RW_E_UNSUPPORTED, __FILE__, __LINE__,
                          "moe experts (cuda): mxfp8 with H = %lld, P = %lld (at most %d)",
                          (long long)H, (long long)P, MOE_MX_MAX_K);
    const int64_t chunk = ntok < MOE_CHUNK ? ntok : MOE_CHUNK;
    const size_t need = rw_moe_experts_cuda_workspace(E, P, H, chunk, k);
    if (ws_bytes < need)
        return rw_err_set(err, RW_E_INVALID_ARG, __FILE__, __LINE__,
                          "moe experts (cuda): workspace %zu bytes, needs %zu", ws_bytes, need);
    const moe_ws w = ws_layout(ws, E, P, H, chunk, k);
    const int fmt = lw->moe_fmt == RW_WFMT_BF16    ? FMT_BF16
                    : lw->moe_fmt == RW_WFMT_MXFP8 ? FMT_MX
                                                   : FMT_FP8B;
    const bool split = x_lo != NULL;
    cudaStream_t st = (cudaStream_t)s;
    int sms = 0;
    RW_CHECK(rw_cuda_sm_count(&sms, err));
    for (int64_t t0 = 0; t0 < ntok; t0 += chunk) {
        const int64_t nt = ntok - t0 < chunk ? ntok - t0 : chunk;
        const int64_t A = nt * k;
        const int32_t *cid = ids + t0 * k;
        /* tokens per expert decide the tile width: narrow tiles for decode-sized batches */
        const int tn = A <= E ? MOE_TN_MIN : A / E <= 48 ? 32 : 128;
        (void)rw_launch_pdl(sort_kernel, dim3(1), 1024, 0, st, cid, A, (int)E, tn, w.off, w.tiles,
                            w.ntiles, w.perm, w.inv);
        RW_CHECK(RW_LAUNCH_CHECK(s, "moe sort", err));

        gemm_args g;
        memset(&g, 0, sizeof g);
        g.P = P;
        g.H = H;
        g.perm = w.perm;
        g.off = w.off;
        g.tiles = w.tiles;
        g.ntiles = w.ntiles;
        g.k = k;
        g.act = w.act;
        g.act_lo = w.act_lo;
        g.y = w.y;
        /* tiles: at most one per tn rows plus one partial per expert, and never more than the
         * assignments (a decode step of A = 8 launches 8 columns of CTAs, not E + 1) */
        const int64_t grid_x = max_tiles(A, E, tn) < A ? max_tiles(A, E, tn) : A;
        /* w13: M = 2P rows, K = H */
        g.w = lw->w13.data;
        g.wscale = lw->w13_scale.data;
        g.w_expert = (int64_t)(rw_tensor_nbytes(&lw->w13) / (size_t)E);
        g.s_expert = fmt == FMT_BF16 ? 0 : (int64_t)(rw_tensor_nbytes(&lw->w13_scale) / (size_t)E);
        g.M = 2 * P;
        g.K = H;
        g.scale_cols = fmt == FMT_MX ? (H / 32 + 3) / 4 : (H + 127) / 128;
        g.xin = (const __nv_bfloat16 *)(x + t0 * H);
        g.xin_lo = split ? (const __nv_bfloat16 *)(x_lo + t0 * H) : NULL;
        RW_CHECK(launch_pass<true>(tn, fmt, split, g, grid_x, sms, s, err));
        /* w2: M = H rows, K = P, input act rows in sorted order */
        g.w = lw->w2.data;
        g.wscale = lw->w2_scale.data;
        g.w_expert = (int64_t)(rw_tensor_nbytes(&lw->w2) / (size_t)E);
        g.s_expert = fmt == FMT_BF16 ? 0 : (int64_t)(rw_tensor_nbytes(&lw->w2_scale) / (size_t)E);
        g.M = H;
        g.K = P;
        g.scale_cols = fmt == FMT_MX ? (P / 32 + 3) / 4 : (P + 127) / 128;
        g.xin = w.act;
        g.xin_lo = split ? w.act_lo : NULL;
        RW_CHECK(launch_pass<false>(tn, fmt, split, g, grid_x, sms, s, err));
        (void)rw_launch_pdl(combine_kernel,
                            dim3((unsigned)nt, (unsigned)((H + COMBINE_COLS - 1) / COMBINE_COLS)),
                            COMBINE_COLS, 0, st, w.y, w.inv, weights + t0 * k, nt, k, H,
                            out + t0 * H);
        RW_CHECK(RW_LAUNCH_CHECK(s, "moe combine", err));
    }
    return RW_OK;
}
