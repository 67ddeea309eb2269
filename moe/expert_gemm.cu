/* expert_gemm.cu - the expert layer's grouped GEMM passes on the packed layout: w13 with SiLU and
 * w2, bf16 / mxfp8 / fp8-block weights, one input or the hi + lo pair (experts_internal.cuh:
 * moe_gemm_pass); the pipeline, the layouts and the arithmetic are described in experts.cu. */
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include "cuda_check.h"
#include "e4m3.cuh"
#include "experts_internal.cuh"
#include "launch.cuh"
#include "mma.cuh"
#include "mx_fragments.cuh"
#include "stamps.cuh"
#include "tma.cuh"

RW_STAMPS_UNIT(eg, "w13", "w2")

/* Warps of a CTA: 4 along the 128 weight rows (32 each) times MOE_WN(TN) along the TN tokens.
 * Wide (prefill) tiles split their tokens over 2 warp columns: 8 warps per SM instead of 4 hide the
 * ldmatrix -> mma latency that one warp per scheduler leaves exposed, and halve the accumulators
 * per thread. Narrow (decode) tiles keep 4 warps: 8 warps of 16 rows each measured slower from
 * 16 tokens up on an H200 (docs/BENCHMARKS.md); with 16 rows a warp loads the same B fragments
 * for half as many MMAs. Which warp computes an output does not change how: one thread, one
 * k16 order. */
#define MOE_WN(TN) ((TN) >= 128 ? 2 : 1)
/* Threads of a CTA. The 32-token tiles on wgmma of mxfp8 (register fragments) and bf16 take two
 * warpgroups of one m64 block each: twice the warps an SM to cover the wait for each block's
 * MMAs, and for mxfp8 each thread converts half as many codes. Measured on an H200, b256 decode
 * forward: mxfp8 1.006 -> 1.018 x bf16; bf16 26.17-26.25 -> 26.09-26.10 ms a step. */
#define MOE_TWG(TN, FMT, WG) ((WG) && (TN) == 32 && ((FMT) == FMT_MX || (FMT) == FMT_BF16))
#define MOE_THREADS_FOR(TN, FMT, WG) (128 * ((TN) >= 128 || MOE_TWG(TN, FMT, WG) ? 2 : 1))
/* cp.async pipeline depth: narrow (decode) tiles are pure weight streaming and keep one more
 * 16 KB weight block in flight */
#define MOE_STAGES_FOR(TN) ((TN) <= 32 ? 4 : 3)
/* A decode grid of at most one wave (a one-token step: 8 x 12 and 8 x 16 CTAs) has few CTAs to
 * share the memory system, so each keeps more weight blocks in flight: 8 stages (6 before: a
 * one-token engine step 3.540-3.546 -> 3.446-3.452 ms on an H200, same run; 8 and 32 sequences
 * unchanged). Larger grids keep 4, which leaves room for 2 CTAs per SM. */
#define MOE_DEEP_STAGES 8
/* The stages of the two-warpgroup mxfp8 tiles of a multi-wave decode grid (launch_pass) */
#define MOE_MX_WG_STAGES 5
/* The L2 fetch a quantized tile's weight copy asks for (rw_cp_async16_sa_pf): a stage reads 64
 * bytes of each of its 128 rows, the rows K bytes apart ([M, K], not K-blocked: docs/LAYOUT.md),
 * so without a hint each row's next blocks come from DRAM in pieces of their own. With 256 bytes
 * a row's first copy brings its next three blocks into L2: mxfp8-last-8 b256 x 1k 29.95-30.01 ->
 * 27.55-27.67 ms on an H100 (128 bytes: 27.82-27.92; docs/BENCHMARKS.md, forty-first session). */
#define MOE_QUANT_L2_PF 256
/* The least stages of a pipelined wgmma tile (the kernel's PIPE): one stage's group in flight and
 * two stages of loads ahead of it. */
#define MOE_PIPE_STAGES 4
/* packed row -> canonical local row (w13: interleave + shuffle inverse; w2: shuffle inverse) */
__device__ __forceinline__ int64_t canon13(int64_t n, int64_t P) {
    const int64_t i = 32 * (n / 32) + 4 * (n % 8) + (n % 32) / 8;
    return (i % 2 == 0) ? i / 2 : P + i / 2;
}
__device__ __forceinline__ int64_t unshuffle(int64_t n) {
    return 32 * (n / 32) + 4 * (n % 8) + (n % 32) / 8;
}

/* Whether a tile loads its stages' weight tiles with one tensor copy each (tw: the layer's
 * weights as [E][K / 64][M][64], core/tma.cuh) completing on the stage's barrier, the gathered
 * token rows staying cp.async: the bf16 wgmma tiles of 128 tokens (prefill), where the copies'
 * address arithmetic competed with the MMAs (16,384 routed tokens: 7.13 -> 6.96 ms on an H200).
 * The narrow decode tiles are bound by latency, not issue, and measured slower with it (one
 * token: 32.5 -> 35.8 us; 256 tokens: unchanged). */
__host__ __device__ constexpr bool moe_tma(int tn, int fmt, bool wg) {
    return wg && fmt == FMT_BF16 && tn == 128;
}
/* Whether a tile converts its weights straight into wgmma's A registers, with no bf16 tile in
 * shared memory (the kernel's RS, below): the quantized tiles on wgmma. */
__host__ __device__ constexpr bool moe_rs(int fmt, bool wg) {
    return wg && fmt != FMT_BF16;
}

/* One CTA: BM weight rows [m0, m0+BM) of expert e times TN sorted rows [r0, r0+TN) of its
 * tokens, K in steps of 64. SPLIT: the B operand is the pair xin + xin_lo (two B tiles per stage)
 * and the w13 epilogue writes act + act_lo where act_lo is given.
 *
 * WG (every tile on builds for sm_90a: RW_WGMMA): each warpgroup multiplies its m64 blocks of
 * the weight rows (one each of two warpgroups at TN = 128, both blocks of the one warpgroup at
 * TN = 16 and 32) by all TN tokens with wgmma from the same shared-memory tiles, one
 * instruction per block and k16 step (and one more for the lo half), instead of each warp's
 * ldmatrix and mma.sync. wgmma and mma.sync give the same bits for the same k16 steps in the same
 * order (measured on an H200, docs/BENCHMARKS.md; moe_experts_gpu compares tokens computed on wide
 * tiles with the same tokens alone on 16-token tiles), and warp w of a warpgroup holds rows
 * 16 (w % 4) .. + 15 of each of its blocks: the m16 fragments of gate / up pairs, as the epilogue
 * needs. */
template <int TN, int FMT, bool W13, bool SPLIT, int MOE_STAGES = MOE_STAGES_FOR(TN),
          bool WG = false, int BM = MOE_BM>
__global__ void __launch_bounds__(MOE_THREADS_FOR(TN, FMT, WG))
    moe_gemm_kernel(gemm_args g, const __grid_constant__ CUtensorMap tw) {
    /* EARLY: the down projection (w2) issues its first stages' weight loads before its PDL wait.
     * What it reads before the wait is constant in a forward pass (the weights and their scales)
     * or written by the expert sort, two kernels back, which completed before the w13 pass ahead
     * of it passed its own wait (launch.cuh); the activations, the w13 pass's output, are loaded
     * after the wait. On an H200, same run: engine steps of 1 token 3.405-3.419 -> 3.336-3.369
     * ms, of 8 tokens 8.764-8.774 -> 8.641-8.681 ms (docs/BENCHMARKS.md, eighteenth session). */
    constexpr bool EARLY = !W13 && !moe_tma(TN, FMT, WG);
    RW_STAMP(t_entry);
    RW_STAMP_DECL(t_wait);
    RW_STAMP_DECL(t_first);
    if constexpr (!EARLY) {
        rw_pdl_begin();
        RW_STAMP_SET(t_wait);
    }
    constexpr int MOE_THREADS = MOE_THREADS_FOR(TN, FMT, WG);
    constexpr int NTW = TN / MOE_WN(TN); /* tokens per warp */
    /* wgmma: NWG warpgroups, each BM / NWG weight rows in m64 blocks by all TN tokens */
    constexpr int NWG = MOE_THREADS / 128;
    static_assert(!WG || (BM % (64 * NWG) == 0), "wgmma: whole m64 blocks per warpgroup");
    static_assert(WG || BM == 128, "mma.sync tiles: 4 warps of 32 rows");
    static_assert(!WG || NWG == 1 || BM / 64 / NWG == 1,
                  "wgmma: one block per warpgroup or one warpgroup (the epilogue's rows)");
    /* accumulators per warp: mma.sync 2 m16 fragments x NTW tokens; wgmma one m16 fragment of
     * each of the warpgroup's m64 blocks x TN */
    constexpr int AM = WG ? BM / 64 / NWG : 2, AN = WG ? TN / 8 : NTW / 8;
    /* PIPE: wgmma keeps one stage's group in flight across the next stage's barrier and loads, as
     * the dense GEMM's twins do; the loads then run STAGES - 2 ahead, so the stage they overwrite
     * is one whose group has retired. With at least MOE_PIPE_STAGES stages (launch_gemm gives
     * them to the split bf16 tiles; the 3-stage unsplit 128-token tile keeps two CTAs per SM
     * instead and waits for its group). Quantized tiles on wgmma take the RS form below instead;
     * without wgmma they dequantize into one bf16 tile. */
    /* RS: mxfp8 and fp8-block on wgmma dequantize each K block straight into the A fragments,
     * in registers (fp8-block through fp32: its scales are not powers of two), instead of into a
     * bf16 tile in shared memory (the "RS" wgmma form, A from registers): no bf16 tile and one
     * barrier a block instead of two. The MMAs are the same k16 steps in the
     * same order on the same bf16 values as the shared-memory form, so the same bits. A group
     * reads its A registers asynchronously, and nothing stops the compiler from giving the next
     * block's fragments the same registers, so each block's group is retired before the next
     * block's conversion (wait<0>; keeping it in flight, as PIPE does, gave wrong and
     * run-to-run different outputs on an H200; with two pinned sets of fragments it was right
     * but slower: core/mma.cuh). The loads then run STAGES - 1 ahead: the stage they overwrite
     * was last read before the barrier. Other warpgroups on the SM fill the wait. */
    constexpr bool RS = moe_rs(FMT, WG);
    /* DEC: the two-warpgroup register-fragment tiles (mxfp8 at 32 tokens, and both quantized
     * formats at 128) pass no CTA barrier in the K loop. Each stage has a full barrier, on which
     * every thread's copies of the stage arrive as they land (cp.async's arrive-on), and an empty
     * one, on which each warp arrives once its MMAs of the stage have retired; a thread waits on
     * the stage's full barrier before reading it and on its empty barrier before copying into it
     * again. With one CTA barrier a block both warpgroups converted, then both waited for their
     * MMAs, at once (Nsight Compute on an H100: a fifth of the stall samples on that barrier and
     * that wait, issue slots 47% busy; docs/BENCHMARKS.md, thirty-ninth session); now one may
     * convert block kb + 1 while the other waits for block kb. The loads into a stage wait for both
     * warpgroups (the token tile is shared), so the two stay within a block of each other. The bits
     * are those of the barrier form: each row's k16 steps in the same order. On an H100, same run,
     * three rounds: mxfp8-last-8 b256 x 1k steps 30.054-30.056 -> 29.89-29.93 ms. The bf16 32-token
     * tiles (A from shared memory, each warp releasing a stage once the group that read it retired)
     * measured 0.3% slower so and keep the barrier (docs/BENCHMARKS.md, fortieth session). */
    constexpr bool DEC = RS && NWG == 2;
    constexpr bool PIPE = WG && !RS && MOE_STAGES >= MOE_PIPE_STAGES;
    constexpr int AHEAD = PIPE ? MOE_STAGES - 2 : MOE_STAGES - 1;
    constexpr bool TMA = moe_tma(TN, FMT, WG);
    static_assert(AHEAD >= 1, "moe gemm: a pipeline needs a stage loaded ahead");
    extern __shared__ __align__(128) uint8_t smem_raw[];
    uint8_t *const smem = WG ? rw_smem_align1024(smem_raw) : smem_raw;
    const int tile = blockIdx.y; /* the grid's order: launch_gemm */
    /* through L2 (ld.global.cg): before the wait (EARLY) no stale line of an earlier layer's sort
     * may come from L1. The tile's entry is loaded with the count, not after its test: the
     * launch's grid is at most the tile list's capacity (experts.cu), so the entry is in bounds
     * whatever the count (AFIRST, below). */
    const int ntl = __ldcg(g.ntiles);
    const int2 td = __ldcg(g.tiles + tile);
    if (tile >= ntl) return;
    const int e = td.x, r0 = td.y;
    const int rend = __ldcg(g.off + e + 1);
    const int64_t m0 = (int64_t)blockIdx.x * BM;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int wm = warp & 3, wn = warp >> 2; /* 32 weight rows, NTW tokens */
    const int nkb = (int)(g.K / 64);

    /* layout: [stage][A BM*128 B | B TN*128 B] for bf16; quantized: [stage][A8 8 KB | B], then one
     * bf16 A tile the stage is dequantized into. SPLIT: B is followed by the B_lo tile. */
    constexpr int A_BYTES = BM * 128;
    constexpr int A8_BYTES = BM * 64;
    constexpr int B_BYTES = TN * 128;
    constexpr int STAGE = (FMT == FMT_BF16 ? A_BYTES : A8_BYTES) + (SPLIT ? 2 : 1) * B_BYTES;
    uint8_t *deq = smem + MOE_STAGES * STAGE; /* quantized formats only: NDEQ tiles */
    constexpr int NDEQ = RS ? 0 : PIPE ? 2 : 1;
    /* mxfp8: the UE8M0 scales of the CTA's 128 rows over all of K, one contiguous swizzled run of
     * scale_cols * 512 bytes (rw_moe_scale_swizzle with m / 128 fixed), loaded with the first
     * stage so the K loop never waits on a global load for its scales */
    uint8_t *ssc = deq + NDEQ * BM * 128;
    __shared__ __align__(8) uint64_t full[TMA || DEC ? MOE_STAGES : 1];
    __shared__ __align__(8) uint64_t empty[DEC ? MOE_STAGES : 1];
    if constexpr (TMA || DEC) {
        if (tid == 0) {
#pragma unroll
            for (int st = 0; st < MOE_STAGES; st++) {
                /* TMA: one arrival with the copy's bytes; DEC: every thread's copies */
                rw_mbar_init(&full[st], TMA ? 1 : MOE_THREADS);
                if constexpr (DEC) rw_mbar_init(&empty[st], MOE_THREADS / 32);
            }
            rw_mbar_init_fence();
        }
        __syncthreads();
    }

    /* Every address a stage's loads use is fixed per thread but for the K block: it is worked
     * out here once, and a stage adds kb * 64 elements (the block's columns) to it. (Worked out
     * per stage, the 64-bit row arithmetic of these copies was about a third of the quantized
     * tiles' instructions.) B: the TN x 64 token tile is TN * 8 chunks of 16 bytes, BCH per
     * thread; chunk q = tid + MOE_THREADS j is chunk q % 8 of token row q / 8, which reads its
     * token's input row (w13: the token's hidden state; w2: the sorted row's activations) or
     * zeros past the expert's rows. */
    constexpr int BCH = TN * 8 / MOE_THREADS;
    static_assert(TN * 8 % MOE_THREADS == 0, "moe gemm: whole B chunks per thread");
    const __nv_bfloat16 *bsrc[BCH], *bsrc_lo[SPLIT ? BCH : 1];
    uint32_t bdst[BCH], bsz[BCH];
    /* (set up after the first weight loads are out where AFIRST, below: w13 reads its rows
     * through perm, a memory round trip after the expert's row count) */
    auto setup_b = [&]() {
#pragma unroll
        for (int j = 0; j < BCH; j++) {
            const int q = tid + j * MOE_THREADS, r = q >> 3, c = q & 7, sr = r0 + r;
            int64_t src = 0;
            bsz[j] = 0;
            if (sr < rend) {
                src = W13 ? (int64_t)(g.perm[sr] / g.k) * g.H : (int64_t)sr * g.P;
                bsz[j] = 16;
            }
            bsrc[j] = g.xin + src + c * 8;
            if (SPLIT) bsrc_lo[j] = g.xin_lo + src + c * 8; /* the same rows of the low halves */
            bdst[j] = rw_swz128(r, c);
        }
    };
    /* A, quantized: the stage's 128 x 64 e4m3 tile is 512 chunks of 16 bytes, QR per thread;
     * chunk q = tid + MOE_THREADS i is chunk q % 4 of weight row q / 4, at byte q * 16 of the
     * stage, and the thread dequantizes the chunks it copied (below). Per such row: its e4m3
     * source, and its scales: mxfp8, the byte offset in the staged run of column block
     * 2 kb + cq / 2 (rw_moe_scale_swizzle: (k / 4) 512 + (r % 32) 16 + (r / 32) 4 + k % 4)
     * without the K block's part; fp8-block, the row's 128 x 128 block scales. fp8-block rows
     * are in canonical order and read through the packed -> canonical map, so the epilogue is
     * shared. */
    constexpr int QR = FMT == FMT_BF16 ? 1 : A8_BYTES / 16 / MOE_THREADS;
    static_assert(FMT == FMT_BF16 || QR * MOE_THREADS / 4 == BM, "moe gemm: whole A rows");
    const uint8_t *wexp = (const uint8_t *)g.w + (int64_t)e * g.w_expert;
    /* fp8-block: the block scales of canonical row n, one float a 128-column block */
    auto scale_row = [&](int64_t n) {
        return (const float *)((const uint8_t *)g.wscale + (int64_t)e * g.s_expert) +
               (n / 128) * g.scale_cols;
    };
    const uint8_t *asrc[QR];
    int soff[QR];
    const float *srow[QR];
#pragma unroll
    for (int i = 0; i < QR; i++) {
        const int q = i * MOE_THREADS + tid, r = q >> 2;
        int64_t n = m0 + r;
        if (FMT == FMT_FP8B && W13) n = canon13(n, g.P);
        asrc[i] = wexp + n * g.K + (q & 3) * 16;
        soff[i] = (r % 32) * 16 + (r / 32) * 4 + ((q & 3) >> 1);
        srow[i] = scale_row(n);
    }
    /* RS: where the thread reads its fragments (mx_fragments.cuh); fp8-block: its rows' block
     * scales (canonical rows, as above) */
    const mx_frag_at rs_at = mx_frag_setup<NWG>(warp, lane);
    constexpr int RSF = RS && FMT == FMT_FP8B ? 2 * AM : 1;
    const float *rs_srow[RSF];
#pragma unroll
    for (int i = 0; i < RSF; i++) {
        int64_t n = m0 + rs_at.r + mx_row(i);
        if (W13) n = canon13(n, g.P);
        rs_srow[i] = scale_row(n);
    }
    /* a stage's loads: the weights (A), the token rows (B), or both */
    auto load_stage = [&](int st, int kb, bool a = true, bool b = true) {
        uint8_t *sa = smem + st * STAGE;
        uint8_t *sb = sa + (FMT == FMT_BF16 ? A_BYTES : A8_BYTES);
        if (!a) {
            /* B alone: the EARLY prologue issued this stage's weights before the wait */
        } else if constexpr (TMA) {
            if (tid == 0) {
                rw_mbar_expect_tx(&full[st], A_BYTES);
                rw_tma_load_4d(sa, &tw, &full[st], 0, (int)m0, kb, e);
            }
        } else if (FMT == FMT_BF16) {
            /* [K/64, M, 64]: rows m0.. of block kb are BM x 128 bytes contiguous. Thread tid copies
             * chunk tid % 8 of rows tid / 8 + 16 i (MOE_THREADS is a multiple of 128): one source
             * and one shared address, the rows' swizzle the same (rows 16 apart), the steps
             * constant */
            static_assert(MOE_THREADS % 128 == 0, "moe gemm: A rows a step keep their swizzle");
            const uint8_t *src = wexp + ((int64_t)kb * g.M + m0) * 128 + tid * 16;
            const uint32_t dst = rw_smem_u32(sa + rw_swz128(tid >> 3, tid & 7));
#pragma unroll
            for (int i = 0; i < A_BYTES / 16 / MOE_THREADS; i++)
                rw_cp_async16_sa(dst + i * MOE_THREADS * 16, src + i * MOE_THREADS * 16);
        } else {
            /* e4m3 [M, K]: the 64 bytes of row n for block kb at n * K + kb * 64. RS: chunk c of
             * row r at c ^ ((r / 2) % 4), so that the eight rows a warp reads a k16 step of
             * (below) fall on all banks; r / 2 % 4 is the same for all of a thread's rows. */
            const uint32_t dst =
                rw_smem_u32(sa) +
                (RS ? (tid >> 2) * 64 + (((tid & 3) ^ ((tid >> 3) & 3)) << 4) : tid * 16);
#pragma unroll
            for (int i = 0; i < QR; i++)
                rw_cp_async16_sa_pf<MOE_QUANT_L2_PF>(dst + i * MOE_THREADS * 16, asrc[i] + kb * 64);
        }
        if (!b) return;
        const uint32_t bs = rw_smem_u32(sb);
#pragma unroll
        for (int j = 0; j < BCH; j++) {
            rw_cp_async16_zfill_sa(bs + bdst[j], bsrc[j] + kb * 64, bsz[j]);
            if (SPLIT) rw_cp_async16_zfill_sa(bs + B_BYTES + bdst[j], bsrc_lo[j] + kb * 64, bsz[j]);
        }
    };

    float acc[AM][AN][4];
#pragma unroll
    for (int a = 0; a < AM; a++)
#pragma unroll
        for (int b = 0; b < AN; b++)
#pragma unroll
            for (int c = 0; c < 4; c++)
                acc[a][b][c] = 0.0f;

    if (FMT == FMT_MX) { /* joins the first stage's commit group */
        const uint8_t *src =
            (const uint8_t *)g.wscale + (int64_t)e * g.s_expert + (m0 / 128) * g.scale_cols * 512;
        for (int64_t q = tid; q < g.scale_cols * 32; q += MOE_THREADS)
            rw_cp_async16(ssc + q * 16, src + q * 16, 16);
    }
    /* AFIRST: the first stages' weights are issued before the token rows' addresses are worked
     * out (EARLY: before the wait as well); the first commit group holds them all. With the
     * tile's entry loaded beside the count (above), a one-token w13 pass issues its weights one
     * memory round trip after its wait instead of four (count, entry, row count, perm): on an
     * H100, same run, b1 x 1k engine steps 3.295-3.307 -> 3.279-3.294 ms, b1 x 4k
     * 3.603-3.625 -> 3.521-3.572, b8 and b256 level (docs/BENCHMARKS.md, thirty-sixth
     * session). */
    constexpr bool AFIRST = !TMA;
    if constexpr (AFIRST) {
#pragma unroll
        for (int s = 0; s < AHEAD; s++)
            if (s < nkb) load_stage(s, s, true, false);
    }
    setup_b();
    if constexpr (EARLY) {
        rw_pdl_begin();
        RW_STAMP_SET(t_wait);
    }
#pragma unroll
    for (int s = 0; s < AHEAD; s++) {
        if (s < nkb) load_stage(s, s, !AFIRST, true);
        rw_cp_async_commit();
        if constexpr (DEC)
            if (s < nkb) rw_cp_async_mbar_arrive(&full[s]);
    }
    /* RS: whether the tile's scales all take the fast conversion, once the first commit group
     * (the scales and stage 0) has landed: a CTA-wide answer, so the K loop branches uniformly */
    bool rs_fast = false;
    if constexpr (RS && FMT == FMT_MX) {
        rw_cp_async_wait<AHEAD - 1>();
        __syncthreads();
        rs_fast = mx_scales_fast(ssc, g.scale_cols * 512, tid, MOE_THREADS);
    }
    for (int kb = 0; kb < nkb; kb++) {
        /* fp8-block RS: the block's scales, loaded before the wait so their latency overlaps it */
        float rs_f[RSF];
        if constexpr (RS && FMT == FMT_FP8B)
#pragma unroll
            for (int i = 0; i < RSF; i++)
                rs_f[i] = rs_srow[i][kb >> 1];
        const int st = kb % MOE_STAGES;
        if constexpr (DEC) {
            /* every thread's copies of the stage have landed; wgmma reads them through the
             * async proxy */
            rw_mbar_wait(&full[st], (uint32_t)(kb / MOE_STAGES) & 1u);
            rw_fence_proxy_async();
        } else {
            rw_cp_async_wait<AHEAD - 1>();
            /* wgmma reads through the async proxy: each thread's copies are made visible to
             * it before the barrier that publishes them */
            if constexpr (WG) rw_fence_proxy_async();
            __syncthreads();
        }
        if constexpr (TMA) rw_mbar_wait(&full[st], (uint32_t)(kb / MOE_STAGES) & 1u);
        if (kb == 0) RW_STAMP_SET(t_first); /* the stamps build's mid: the first stage is in */
        uint8_t *sa = smem + st * STAGE;
        uint8_t *sb = sa + (FMT == FMT_BF16 ? A_BYTES : A8_BYTES);
        /* the next loads go out now, before a quantized stage's dequantization. The stage they
         * fill was last read by the MMAs of block kb + AHEAD - STAGES (kb - 1; kb - 2 with
         * PIPE), which have retired: without PIPE each block waits for its group, with PIPE the
         * wait after block kb - 1 leaves only that block's group in flight. A quantized stage's
         * e4m3 tile was read by its dequantization, before the barrier above. */
        if constexpr (!DEC) {
            const int nk = kb + AHEAD;
            if (nk < nkb) load_stage(nk % MOE_STAGES, nk);
            rw_cp_async_commit();
        }
        if (FMT != FMT_BF16 && !RS) {
            /* the e4m3 stage into the bf16 tile. Thread tid takes the chunks it copied: 16-byte
             * chunk cq = tid % 4 of rows tid / 4 + (MOE_THREADS / 4) i. A warp reads 8 whole
             * 64-byte rows, 512 contiguous bytes (one thread a row, 8 bytes at a time, put 16
             * threads on one bank pair), and writes each chunk's 16 values as bf16 chunks 2 cq
             * and 2 cq + 1 of its row, which the swizzle spreads over all banks for rows r ..
             * r + 7. The scale: the row's block of 32 columns (mxfp8, from the CTA's staged run)
             * or of 128 x 128 (fp8-block, canonical rows); where each thread's are is worked
             * out before the K loop. */
            const int cq = tid & 3;
            uint8_t *const dq = deq + (PIPE ? (kb & 1) * (BM * 128) : 0);
            /* all of the thread's chunks and scales first: one shared-load latency a block, not
             * one a chunk (loaded chunk by chunk, the conversions waited on each: mxfp8 decode
             * at b256 0.960 -> 0.982 x bf16 on an H200) */
            uint4 raw[QR];
            float scl[QR];
            uint32_t sbyte[QR];
#pragma unroll
            for (int i = 0; i < QR; i++) {
                raw[i] = *(const uint4 *)(sa + (i * MOE_THREADS + tid) * 16);
                if (FMT == FMT_MX)
                    sbyte[i] = ssc[soff[i] + (kb >> 1) * 512 + (kb & 1) * 2];
                else
                    scl[i] = srow[i][kb >> 1];
            }
#pragma unroll
            for (int i = 0; i < QR; i++) {
                const int r = (tid >> 2) + i * (MOE_THREADS / 4);
                const uint32_t w[4] = {raw[i].x, raw[i].y, raw[i].z, raw[i].w};
                __align__(16) uint32_t v[8];
                if (FMT == FMT_MX && sbyte[i] <= RW_E4M3_FAST_SCALE_MAX) {
                    /* four instructions a pair of codes (e4m3.cuh); the scale's power of two
                     * is a bf16 multiplier */
                    const uint32_t mul = rw_ue8m0_bf16x2_mul(sbyte[i]);
#pragma unroll
                    for (int j = 0; j < 4; j++) {
                        const uint2 b = rw_e4m3x4_to_bf16x4(w[j], mul);
                        v[2 * j] = b.x;
                        v[2 * j + 1] = b.y;
                    }
                } else {
                    /* fp8-block, and mxfp8 scales past 2^127 x 2^-120 (rw's quantizer writes
                     * them only for blocks holding an inf or a NaN): through half and fp32 */
                    const float sc = FMT == FMT_MX ? rw_ue8m0_to_f32((uint8_t)sbyte[i]) : scl[i];
#pragma unroll
                    for (int i2 = 0; i2 < 8; i2++) {
                        const __nv_bfloat162 b =
                            rw_e4m3x2_to_bf16x2(w[i2 >> 1] >> ((i2 & 1) * 16), sc);
                        v[i2] = *(const uint32_t *)&b;
                    }
                }
                *(uint4 *)(dq + rw_swz128(r, 2 * cq)) = *(const uint4 *)&v[0];
                *(uint4 *)(dq + rw_swz128(r, 2 * cq + 1)) = *(const uint4 *)&v[4];
            }
            if constexpr (WG) rw_fence_proxy_async();
            __syncthreads();
            sa = dq;
        }
        if constexpr (RS) {
            uint32_t af[AM][4][4];
            if constexpr (FMT == FMT_FP8B)
                fp8b_fragments<AM>(af, sa, rs_at, rs_f, lane);
            else if (rs_fast)
                mx_fragments<AM, true>(af, sa, ssc, rs_at, kb, lane);
            else
                mx_fragments<AM, false>(af, sa, ssc, rs_at, kb, lane);
            const uint64_t dsb = rw_wgmma_desc(sb);
            rw_wgmma_pin(&acc[0][0][0], AM * TN / 2);
            rw_wgmma_fence();
#pragma unroll
            for (int ks = 0; ks < 4; ks++)
#pragma unroll
                for (int mt = 0; mt < AM; mt++) {
                    rw_wgmma_bf16_rs<TN>(&acc[mt][0][0], af[mt][ks],
                                         rw_wgmma_desc_at(dsb, ks * 32));
                    if (SPLIT)
                        rw_wgmma_bf16_rs<TN>(&acc[mt][0][0], af[mt][ks],
                                             rw_wgmma_desc_at(dsb, B_BYTES + ks * 32));
                }
            rw_wgmma_commit();
            if constexpr (DEC) {
                /* the next loads, under this block's MMAs: into the stage of block kb - 1,
                 * once every warp has retired that block's MMAs */
                const int nk = kb + AHEAD, ns = nk % MOE_STAGES;
                if (nk < nkb) {
                    if (nk >= MOE_STAGES)
                        rw_mbar_wait(&empty[ns], (uint32_t)(nk / MOE_STAGES - 1) & 1u);
                    load_stage(ns, nk);
                    rw_cp_async_mbar_arrive(&full[ns]);
                }
            }
            rw_wgmma_wait<0>();
            rw_wgmma_pin(&acc[0][0][0], AM * TN / 2);
            if constexpr (DEC) {
                /* the fragments stay live up to the wait: the group reads them asynchronously,
                 * and without this the copies' address work above could be given their
                 * registers (core/mma.cuh) */
                rw_wgmma_pin_frag(&af[0][0][0], AM * 4 * 4);
                /* this warp is done with the stage: its fragments were read before its MMAs,
                 * which have retired */
                __syncwarp();
                if (lane == 0) rw_mbar_arrive(&empty[st]);
            }
        } else if constexpr (WG) {
            /* warpgroup warp / 4: its AM m64 blocks of weight rows by all TN tokens. Per
             * accumulator the k16 steps in order, hi then lo, as below. The group is retired
             * before a later barrier lets the loads overwrite this stage: PIPE at the next stage
             * (wait<1> leaves only that stage's group in flight), otherwise here. */
            /* (one warpgroup: no warp term, so the descriptors stay uniform across the CTA) */
            const uint8_t *ab = NWG == 1 ? sa : sa + (warp >> 2) * (AM * 64 * 128);
            /* one descriptor for each operand tile, the slices as offsets (rw_wgmma_desc_at) */
            const uint64_t dab = rw_wgmma_desc(ab), dsb = rw_wgmma_desc(sb);
            /* (a pin while a group is in flight would define its registers: only without PIPE) */
            if constexpr (!PIPE) rw_wgmma_pin(&acc[0][0][0], AM * TN / 2);
            rw_wgmma_fence();
#pragma unroll
            for (int ks = 0; ks < 4; ks++)
#pragma unroll
                for (int mt = 0; mt < AM; mt++) {
                    const uint64_t da = rw_wgmma_desc_at(dab, mt * (64 * 128) + ks * 32);
                    rw_wgmma_bf16<TN>(&acc[mt][0][0], da, rw_wgmma_desc_at(dsb, ks * 32));
                    if (SPLIT)
                        rw_wgmma_bf16<TN>(&acc[mt][0][0], da,
                                          rw_wgmma_desc_at(dsb, B_BYTES + ks * 32));
                }
            rw_wgmma_commit();
            if constexpr (PIPE) {
                rw_wgmma_wait<1>();
            } else {
                rw_wgmma_wait<0>();
                rw_wgmma_pin(&acc[0][0][0], AM * TN / 2);
            }
        } else {
#pragma unroll
            for (int ks = 0; ks < 4; ks++) {
                uint32_t a[AM][4];
#pragma unroll
                for (int mt = 0; mt < AM; mt++) {
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
                    for (int mt = 0; mt < AM; mt++) {
                        rw_mma_bf16_16816(acc[mt][nt], a[mt], b0, b1);
                        rw_mma_bf16_16816(acc[mt][nt + 1], a[mt], b2, b3);
                    }
                    if (SPLIT) {
                        /* the low halves, after the high halves of the same k16 step: a fixed
                         * order per accumulator, independent of TN and of the other columns */
                        rw_ldsm_x4(b0, b1, b2, b3, sb + B_BYTES + rw_swz128(r, c));
#pragma unroll
                        for (int mt = 0; mt < AM; mt++) {
                            rw_mma_bf16_16816(acc[mt][nt], a[mt], b0, b1);
                            rw_mma_bf16_16816(acc[mt][nt + 1], a[mt], b2, b3);
                        }
                    }
                }
            }
        }
    }
    rw_cp_async_wait<0>();
    if constexpr (PIPE) {
        rw_wgmma_wait<0>();
        rw_wgmma_pin(&acc[0][0][0], AM * TN / 2);
    }

    /* epilogue: C fragment rows g, g+8 (weight rows), columns 2c, 2c+1 (tokens) */
    const int gq = lane >> 2, cq = lane & 3;
#pragma unroll
    for (int mt = 0; mt < AM; mt++) {
        /* first packed row of this m16 tile; wgmma: warp w's m16 slice of block mt of its
         * warpgroup, 64 ((w / 4) AM + mt) + 16 (w % 4), which is 64 mt + 16 w for the tiles
         * built (one block per warpgroup, or one warpgroup). Written so: with the warpgroup
         * term ptxas serialized the pipelined wgmma of the 128-token tiles (C7515). */
        const int64_t mrow = WG ? m0 + mt * 64 + warp * 16 : m0 + wm * 32 + mt * 16;
#pragma unroll
        for (int nt = 0; nt < AN; nt++)
#pragma unroll
            for (int h = 0; h < 2; h++) {
                const int col = (WG ? 0 : wn * NTW) + nt * 8 + cq * 2 + h;
                const int sr = r0 + col;
                if (sr >= rend) continue;
                if (W13) {
                    const int64_t j = 16 * (mrow / 32) + 2 * gq + ((mrow % 32) == 16 ? 1 : 0);
                    const float up = acc[mt][nt][h], gate = acc[mt][nt][2 + h];
                    const float v = gate / (1.0f + expf(-gate)) * up;
                    const __nv_bfloat16 hi = __float2bfloat16(v); /* round to nearest even */
                    g.act[(int64_t)sr * g.P + j] = hi;
                    /* v - hi is exact in fp32; its rounding leaves |v - hi - lo| <= 2^-16 |v|
                     * (act pairs only: g.act_lo is NULL when w2 takes one bf16) */
                    if (SPLIT && g.act_lo)
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
    RW_STAMP_PUT(eg, W13 ? 0 : 1, RW_STAMP_CTA, t_entry, t_wait, t_first);
}

/* Dynamic shared memory of one moe_gemm_kernel instance (the layout in the kernel). The largest,
 * TN = 128 split with mxfp8 scales for K = MOE_MX_MAX_K, is 3 * (8 + 32) + 16 + 32 = 168 KB; bf16
 * TN = 128 split on wgmma is 4 * (16 + 32) = 192 KB; the deep 32-token mxfp8 split tile, which
 * pipes with two bf16 tiles, 6 * (8 + 8) + 2 * 16 + 32 = 160 KB: all within sm_90's 227 KB. */
template <int TN, int FMT, bool SPLIT, int ST = MOE_STAGES_FOR(TN), bool WG = false,
          int BM = MOE_BM>
static constexpr size_t gemm_smem(int64_t scale_cols) {
    return (WG ? RW_WGMMA_SMEM_SLACK : 0) +
           (size_t)ST * ((FMT == FMT_BF16 ? BM * 128 : BM * 64) + (SPLIT ? 2 : 1) * TN * 128) +
           (FMT == FMT_BF16 || moe_rs(FMT, WG) ? 0
                                               : (WG && ST >= MOE_PIPE_STAGES ? 2 : 1) * BM * 128) +
           (FMT == FMT_MX ? (size_t)scale_cols * 512 : 0);
}
static_assert(gemm_smem<128, FMT_MX, true, MOE_STAGES_FOR(128), true>(MOE_MX_MAX_K / 128) +
                      2 * 1024 <=
                  227 * 1024,
              "moe gemm: split-mode tiles exceed the shared memory of sm_90");
static_assert(gemm_smem<128, FMT_BF16, true, MOE_PIPE_STAGES, true>(0) + 2 * 1024 <= 227 * 1024,
              "moe gemm: split-mode tiles exceed the shared memory of sm_90");
static_assert(gemm_smem<32, FMT_MX, true, MOE_DEEP_STAGES, true>(MOE_MX_MAX_K / 128) + 2 * 1024 <=
                  227 * 1024,
              "moe gemm: deep decode tiles exceed the shared memory of sm_90");

/* Every tile runs on wgmma on builds for sm_90a. Measured on an H200 (docs/BENCHMARKS.md): the
 * 32-token tiles took the b256 step's experts from 17.69 to 17.14 ms; the 16-token tiles of a
 * one-token step were slower on wgmma (1.92 -> 1.99 ms) until the pipelined form, which keeps
 * one group in flight (PIPE), took them to 1.79 ms against 1.91 on mma.sync. */
template <int TN, int FMT, bool W13, bool SPLIT, int ST = MOE_STAGES_FOR(TN), int BM = MOE_BM>
static rw_status launch_gemm(const gemm_args &g, int64_t grid_x, rw_stream s, rw_err *err) {
    constexpr bool WG = RW_WGMMA;
    /* the pipelined wgmma form (bf16) loads STAGES - 2 ahead: split 3-stage tiles take a fourth
     * stage so that two stay in flight. (The unsplit 128-token tile measured slower so: 4 stages of
     * 32 KB leave one CTA per SM where 3 leave two; docs/BENCHMARKS.md.) */
    constexpr int STG =
        WG && SPLIT && FMT == FMT_BF16 && ST < MOE_PIPE_STAGES ? MOE_PIPE_STAGES : ST;
    const size_t sm = gemm_smem<TN, FMT, SPLIT, STG, WG, BM>(g.scale_cols);
    /* the attribute is the largest any K can ask for, so graphs captured for another model (K)
     * stay launchable */
    const size_t sm_max = gemm_smem<TN, FMT, SPLIT, STG, WG, BM>(MOE_MX_MAX_K / 128);
    RW_CUDA_CHECK(err,
                  cudaFuncSetAttribute(moe_gemm_kernel<TN, FMT, W13, SPLIT, STG, WG, BM>,
                                       cudaFuncAttributeMaxDynamicSharedMemorySize, (int)sm_max));
    /* the weights as [E][K / 64][M][64] for the tensor copies of 128-row boxes */
    CUtensorMap tw = {};
    if (moe_tma(TN, FMT, WG)) {
        const uint64_t dims[4] = {64, (uint64_t)g.M, (uint64_t)(g.K / 64), (uint64_t)g.E};
        const uint64_t stride[3] = {128, (uint64_t)g.M * 128, (uint64_t)g.w_expert};
        const uint32_t box[4] = {64, MOE_BM, 1, 1};
        if (!rw_tma_map_bf16_nd(&tw, g.w, 4, dims, stride, box))
            RW_FAIL(err, RW_E_UNSUPPORTED,
                    "moe gemm: the driver cannot encode the tensor map of %lld experts of %lld x "
                    "%lld bf16 weights",
                    (long long)g.E, (long long)g.M, (long long)g.K);
    }
    /* The weight row blocks along x, the token tiles along y: the CTAs that run at once hold a
     * few token tiles by every row block, so each tile's token rows are read from memory once for
     * all of its row blocks, and an expert's weights once for its adjacent tiles. With the tiles
     * along x a wave held one row block of a hundred-odd tiles, whose gathered rows and weights
     * did not fit L2 together: at 16,384 tokens the w13 pass read 1.95 GB from DRAM for 0.8 GB
     * of weights, and the w2 pass ran at 85% of DRAM bandwidth (Nsight Compute). Same bits:
     * only which CTA runs when. On an H100, same run: the expert layer at 16,384 tokens
     * 6.67-6.75 -> 5.67-5.81 ms, at 2048 1.00 -> 0.89 ms, at 256 0.445 -> 0.424 ms; the 8 x 2k
     * prefill 529.8 -> 490.1 ms; a b256 x 512 decode step 30.07 -> 29.06 ms (docs/BENCHMARKS.md,
     * forty-eighth session). (grid_x, at most a chunk's tiles, is far below y's 65,535.) */
    const dim3 grid((unsigned)(g.M / BM), (unsigned)grid_x);
    RW_STAMPS_REGISTER(eg);
    (void)rw_launch_pdl(moe_gemm_kernel<TN, FMT, W13, SPLIT, STG, WG, BM>, grid,
                        MOE_THREADS_FOR(TN, FMT, WG), sm, (cudaStream_t)s, g, tw);
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

/* bf16 16-token tiles of 64 weight rows (launch_pass) */
template <bool W13, int ST>
static rw_status launch_bf16_half(bool split, const gemm_args &g, int64_t grid_x, rw_stream s,
                                  rw_err *err) {
    if (split) return launch_gemm<16, FMT_BF16, W13, true, ST, 64>(g, grid_x, s, err);
    return launch_gemm<16, FMT_BF16, W13, false, ST, 64>(g, grid_x, s, err);
}

/* One GEMM pass (w13 or w2) with tiles of tn tokens; narrow tiles in a grid of at most one wave
 * keep MOE_DEEP_STAGES blocks in flight. */
template <bool W13>
static rw_status launch_pass(int tn, int fmt, bool split, const gemm_args &g, int64_t grid_x,
                             int sms, rw_stream s, rw_err *err) {
    if (tn == 128) return launch_fmt<128, W13>(fmt, split, g, grid_x, s, err);
    const bool one_wave = grid_x * (g.M / MOE_BM) <= sms;
    if (tn == 16) {
#if RW_WGMMA
        /* bf16 tiles of 64 weight rows, one m64 block (BM): a one-token step's w13 grid is 8 x
         * 12 CTAs of 128 rows, which leaves 36 of an H200's 132 SMs idle while each CTA's
         * 32 blocks are one warpgroup's chain of dependent waits, barriers and wgmma
         * (docs/BENCHMARKS.md, twentieth session: a quarter of its stall samples on the
         * block barrier, its loads ahead of it). With 64 rows, 192 CTAs, two on some SMs, so
         * more chains run at once. A row's arithmetic does not depend on the tile's height.
         * Same run on an H200, b1 x 1k: engine 3.088-3.115 -> 3.039-3.060 ms, forward
         * 3.065-3.076 -> 3.011-3.022 (w13 alone 3.042-3.048 and 3.027-3.061; w2 alone no
         * change); 4k 3.344-3.372 -> 3.311-3.315. A multi-wave grid of 16-token tiles (a few
         * sequences, a short prompt) takes them too, at the usual stages: 8 sequences, same run,
         * three rounds, 1k 8.462-8.474 -> 8.343-8.369 ms, 4k 9.219-9.224 -> 9.122-9.186 (with
         * 6 stages 8.316-8.344 and 9.089-9.138, but a 16-token prompt's step 1% slower in two
         * runs). */
        if (fmt == FMT_BF16 && g.M % 64 == 0) {
            if (one_wave) return launch_bf16_half<W13, MOE_DEEP_STAGES>(split, g, grid_x, s, err);
            return launch_bf16_half<W13, MOE_STAGES_FOR(16)>(split, g, grid_x, s, err);
        }
#endif
        if (one_wave) return launch_fmt<16, W13, MOE_DEEP_STAGES>(fmt, split, g, grid_x, s, err);
        return launch_fmt<16, W13>(fmt, split, g, grid_x, s, err);
    }
    if (one_wave) return launch_fmt<32, W13, MOE_DEEP_STAGES>(fmt, split, g, grid_x, s, err);
    /* mxfp8 of a multi-wave decode grid on wgmma: two warpgroups a CTA (MOE_THREADS_FOR) and
     * MOE_MX_WG_STAGES stages. A b256 forward on an H200 (docs/BENCHMARKS.md, 2026-12-04,
     * seventeenth session), same-run pairs: 4 stages 25.09-25.14 ms, 5 24.78-24.81, 6
     * 24.93-24.95; in another run 3 stages 25.37-25.42 against 4 25.11-25.13. (On one warpgroup
     * a CTA 4 had been best, 5 and 6 slower.) Five stages of 16 KB leave two CTAs an SM. */
#if RW_WGMMA
    if (fmt == FMT_MX) return launch_fmt<32, W13, MOE_MX_WG_STAGES>(fmt, split, g, grid_x, s, err);
#endif
    /* the bf16 down projection of a multi-wave decode grid: 3 stages of 20 KB leave room for
     * three CTAs an SM, whose ramps overlap, where 4 stages (the pipelined form) fit two: a b256
     * step's experts 333.0 -> 328.1 us a layer on an H200 (5 stages 329.2, 6 stages 352; w13,
     * whose stages are 24 KB, 333.3 with 3 and 375 with 5) */
    if (!W13 && fmt == FMT_BF16 && !split)
        return launch_gemm<32, FMT_BF16, false, false, 3>(g, grid_x, s, err);
    return launch_fmt<32, W13>(fmt, split, g, grid_x, s, err);
}

rw_status moe_gemm_pass(bool w13, int tn, int fmt, bool split, const gemm_args &g, int64_t grid_x,
                        int sms, rw_stream s, rw_err *err) {
    return w13 ? launch_pass<true>(tn, fmt, split, g, grid_x, sms, s, err)
               : launch_pass<false>(tn, fmt, split, g, grid_x, sms, s, err);
}
