/* gemm.cu - the dense GEMM of the CUDA backend: Y [M, N] fp32 = (x + x_lo) [M, K] . W [N, K]^T with
 * bf16 inputs, tensor cores (mma.sync m16n8k16, fp32 accumulate) and the same bits for a token's
 * row whatever batch it is computed in. Contract: gemm.h; CPU reference: gemm_ref.c.
 *
 * One CTA computes a tile of BN weight rows times TN tokens over one K slice (all of K unless the
 * shape splits K, below). The weight rows are the mma's M side (16-row fragments) and the tokens
 * its N side (8-column fragments), so a decode step of one token wastes at most 7 of 8 columns,
 * not 15 of 16 rows. K is streamed through a cp.async pipeline of 2-6 stages of KC blocks of 64
 * columns; shared-memory tiles are [rows][8 x 16-byte chunks] per 64-column block with chunk c of
 * row r stored at c ^ (r & 7), so ldmatrix reads are free of bank conflicts (the layout of
 * moe/expert_gemm.cu). Rows n >= N, tokens m >= M and columns past the slice are zero-filled by
 * cp.async with a source size of 0.
 *
 * K split. A weight of few rows (o_proj 2048 x 4096, q/k/v 5120 x 2048) gives too few tiles to keep
 * every SM streaming at small M, so its K range is cut into S slices (rw_k_gemm_splits: a function
 * of N and K alone, slice boundaries at multiples of 64 columns). At M <= 8 each slice gets a CTA:
 * it writes its partial tile to the workspace, and the last of a tile's S CTAs to finish (a counter
 * per tile) adds the S partials in slice order, ((p0 + p1) + p2) + ..., and writes Y. (On sm_90a
 * builds gemv.cu takes these launches: the same slices and sums, its S CTAs a thread-block cluster
 * adding the partials in shared memory.) At larger M the tiles alone fill the GPU and one CTA folds
 * the slices instead (gemm_kernel's FOLD): it walks them in turn, each from a zeroed accumulator,
 * and adds each finished slice's sum to a running total in registers, in the same order and with
 * the same roundings as the split over CTAs. Measured on an H200 (docs/BENCHMARKS.md): slices over
 * CTAs at M = 256 were up to 1.8 x slower than no split (partials' traffic, smaller tiles); a
 * running total stored in Y and read back 1.5 x; the total's registers in every instantiation
 * slowed unsplit wide tiles by up to 1.15 x, hence FOLD only where S > 1.
 *
 * Batch invariance. Element (m, n) of slice s is accumulated by one thread in one fp32 register:
 * starting from 0, one mma per k16 step for k0 = begin(s), begin(s) + 16, ... < end(s) in
 * increasing order (with x_lo: the x mma then the x_lo mma of the same step), and the slices are
 * added in slice order; nothing else ever adds into it: no atomics on values, no reduction whose
 * order depends on the launch. k16 steps wholly beyond the slice are skipped rather than run on
 * zero padding, so the sequence of operations is the same for every tile configuration (KC,
 * stages) and S depends on the weight's shape only. Weight row n always sits in row n % 16 of its
 * mma fragment (BN is a multiple of 16 and tiles start at multiples of BN). What the batch changes
 * is the token tile width TN, the weight tile height BN, the fragment column a token lands in
 * (m % 8 within the batch) and which of a tile's CTAs finishes last. An mma's output element
 * (i, j) is c_ij + sum_k a_ik b_kj over its own row of A and column of B: the columns of B are
 * independent of each other and computed the same way in every column position, so the tile
 * shape may be chosen from M, N and the SM count for speed without changing any bit.
 * tests/worker/test_gemm_gpu.c checks rows computed alone and inside batches of several sizes
 * byte for byte, split shapes among them.
 *
 * wgmma. On builds for sm_90a (RW_WGMMA) the three wide tiles (128 x 128, 128 x 64, 64 x 64, the
 * tiles of M > 32; and two wgmma-only tiles, pick_tile: 128 x 96 for one-wave grids, 128 x 256
 * for many waves of one bf16 input) run as wgmma twins where every K slice is whole stages: the
 * same tiles in the same shared-memory layout (the 128-byte swizzle above is wgmma's), the same k16
 * steps in the same order, but each warpgroup multiplies 64 weight rows by all TN tokens with one
 * asynchronous instruction per k16 step, reading both operands from shared memory, and keeps one
 * stage's group in flight while the next stage's loads are issued. wgmma m64nNk16 and a chain of
 * mma.sync m16n8k16 give the same bits for the same k16 steps (measured on an H200 on random and
 * wide-exponent data, with and without the lo half; docs/BENCHMARKS.md), so a row computed on a
 * wgmma tile equals the same row computed alone on an 8-token mma.sync tile: the invariance tests
 * compare exactly these. The twins load their stages with tensor copies (core/tma.cuh): one
 * thread issues a stage's boxes (W, x, x_lo; zeros past N, M and K), which complete on the
 * stage's shared-memory barrier, in the layout the cp.async form wrote. The cp.async form spent
 * about 350 instructions a warp on each stage's addresses against 8 wgmma (ncu, 128 x 128 tile
 * at M = 256); with the copies q/k/v at M = 256 went from 39.2 to 28.4 us and o_proj from 30.1 to
 * 23.1 us on an H200 (docs/BENCHMARKS.md). Where the driver cannot encode the tensor maps the
 * launcher keeps the mma.sync tiles. */
#include <cuda_runtime.h>
#include <limits.h>
#include <stdint.h>

#include "cuda_check.h"
#include "gemm.h"
#include "gemv.cuh"
#include "launch.cuh"
#include "mma.cuh"
#include "tma.cuh"

/* ------------------------------------------------------------------------------------------ */
/* tile configuration                                                                           */
/* ------------------------------------------------------------------------------------------ */
/* BN weight rows x TN tokens per CTA, WM x WN warps (each BN/WM rows x TN/WN tokens). A stage
 * holds KC 64-column blocks, KC = min(128 / BN, 128 / TN): 16 KB of weights whenever BN >= TN (a
 * narrow decode tile streams 512 columns of 16 rows per stage, so every CTA keeps 32-48 KB of
 * weights in flight) and at most 16 KB of each activation operand. STG: the pipeline depth, 0 for
 * the default (4 stages up to 32 KB a stage, else 3); GEMM_DEEP for as many as fit 200 KB, at most
 * 6 (rw_k_gemm says when). */
#define GEMM_DEEP (-1)
/* WG: the wgmma twin (each warpgroup 64 weight rows by all TN tokens), which keeps one stage's
 * group in flight across the next stage's barrier and loads: as many stages as fit 200 KB, 4 to
 * 6, loads 2 fewer ahead (one bf16 input on 128 x 128 tiles, the lm_head's: 6 stages, so 64 KB of
 * weights in flight a CTA instead of 32 KB; measured on an H100, docs/BENCHMARKS.md, twenty-sixth
 * session: the lm_head at 256 tokens 413 -> 335 us against 4 stages). */
template <int BN, int TN, int WM, int WN, bool SPLIT, int STG = 0, bool WG = false>
struct gemm_cfg {
    static constexpr int THREADS = 32 * WM * WN;
    /* (at least one block: the 256-token wgmma tile takes 64 columns a stage) */
    static constexpr int KC0 = (128 / BN) < (128 / TN) ? (128 / BN) : (128 / TN);
    static constexpr int KC = KC0 > 0 ? KC0 : 1;
    static constexpr int KB = 64 * KC; /* columns per stage */
    static constexpr int A_BYTES = BN * KC * 128;
    static constexpr int B_BYTES = TN * KC * 128;
    static constexpr int STAGE = A_BYTES + B_BYTES * (SPLIT ? 2 : 1);
    static constexpr int DEFAULT_STAGES = STAGE <= 32768 ? 4 : 3;
    static constexpr int DEEP_STAGES = 200 * 1024 / STAGE < 6 ? 200 * 1024 / STAGE : 6;
    static constexpr int STAGES = WG        ? (DEEP_STAGES > 4 ? DEEP_STAGES : 4)
                                  : STG > 0 ? STG
                                            : (STG == GEMM_DEEP && DEEP_STAGES > DEFAULT_STAGES
                                                   ? DEEP_STAGES
                                                   : DEFAULT_STAGES);
    /* stages loaded ahead of the one computed: the stage a wgmma group still in flight reads is
     * not overwritten */
    static constexpr int AHEAD = WG ? STAGES - 2 : STAGES - 1;
    static constexpr int SMEM = STAGES * STAGE + (WG ? RW_WGMMA_SMEM_SLACK : 0);
    static constexpr int MT = BN / WM / 16; /* m16 fragments per warp */
    static constexpr int NT = TN / WN / 8;  /* n8 fragments per warp */
    static_assert(BN % (16 * WM) == 0 && TN % (8 * WN) == 0, "warp tile");
    static_assert(NT == 1 || NT % 2 == 0, "B fragments are loaded in pairs");
    static_assert(STAGES >= 2, "a pipeline needs two stages");
    static_assert(!WG || (WM == BN / 16 && WN == 1 &&
                          (TN == 64 || TN == 96 || TN == 128 || (TN == 256 && !SPLIT))),
                  "wgmma tiles: each warpgroup 64 weight rows by every token of the tile");
};

/* m-tiles per group of the CTA order: consecutive CTAs walk the weight tiles for GROUP_M token
 * tiles, so a weight tile read from memory serves several token tiles from L2 when W is larger
 * than L2 (lm_head prefill) */
#define GROUP_M 8

/* One launch's operands. */
typedef struct gemm_args {
    const uint16_t *W, *x, *xlo;
    int64_t N, K, M;
    float *Y;
    float *part;        /* [S, M, N] partial tiles (slices over CTAs) */
    unsigned *counters; /* [tiles] (slices over CTAs): the workspace's tile counters */
    int S;              /* K slices */
    bool fold;          /* one CTA per tile walks every slice (else one CTA per slice) */
    int64_t span;       /* columns per slice (rw_k_gemm_slice_cols); the last slice ends at K */
} gemm_args;
/* wgmma tiles: the tensor maps of W (boxes of 64 columns by BN rows), x and x_lo (by TN). A
 * parameter of its own: in gemm_args (as a __grid_constant__ parameter) it changed the registers
 * of every tile. */
typedef struct gemm_maps {
    CUtensorMap tw, tx, txlo;
} gemm_maps;

template <int BN, int TN, int WM, int WN, bool SPLIT, int STG = 0, bool FOLD = false,
          bool WG = false>
__global__ void __launch_bounds__(32 * WM * WN, 1)
    gemm_kernel(const gemm_args g, const __grid_constant__ gemm_maps t) {
    rw_pdl_begin();
    typedef gemm_cfg<BN, TN, WM, WN, SPLIT, STG, WG> C;
    extern __shared__ __align__(128) uint8_t smem_raw[];
    uint8_t *const smem = WG ? rw_smem_align1024(smem_raw) : smem_raw;
    __shared__ int last_cta;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int wm = warp % WM, wn = warp / WM;
    const int64_t N = g.N, K = g.K, M = g.M;
    const uint16_t *__restrict__ W = g.W;
    const uint16_t *__restrict__ x = g.x;
    const uint16_t *__restrict__ xlo = g.xlo;

    /* CTA -> (K slice, token tile, weight tile); a tile's slices are consecutive CTAs, tiles are
     * grouped by GROUP_M token tiles. Folding, one CTA per tile walks every slice. */
    const int per_tile = FOLD ? 1 : g.S;
    const int64_t ntn = (N + BN - 1) / BN, ntm = (M + TN - 1) / TN;
    const int64_t tile = blockIdx.x / per_tile, per_group = (int64_t)GROUP_M * ntn;
    const int slice = (int)(blockIdx.x % per_tile);
    const int64_t first_m = (tile / per_group) * GROUP_M;
    const int64_t gsz = ntm - first_m < GROUP_M ? ntm - first_m : GROUP_M;
    const int64_t in = tile % per_group;
    const int m0 = (int)((first_m + in % gsz) * TN), n0 = (int)((in / gsz) * BN);
    /* stages of KB columns: nps per slice, nlast in the last one (which ends at K) */
    const int nps = (int)((g.span + C::KB - 1) / C::KB);
    const int nlast = (int)((K - (int64_t)(g.S - 1) * g.span + C::KB - 1) / C::KB);
    const int nkb = FOLD ? (g.S - 1) * nps + nlast : (slice == g.S - 1 ? nlast : nps);
    /* a position in the walk: slice, stage within it */
    struct walk {
        int s, j;
    };
    auto next = [&](walk &w) {
        if (++w.j == (w.s == g.S - 1 ? nlast : nps)) {
            w.s++;
            w.j = 0;
        }
    };
    /* 32-bit column arithmetic (K < 2^31 / 2, checked by rw_k_gemm): fewer registers live
     * across the mma loop */
    const int span = (int)g.span, Ki = (int)K;
    auto k_first = [&](const walk &w) { return w.s * span + w.j * C::KB; };
    auto k_end = [&](const walk &w) {
        const int e = (w.s + 1) * span;
        return e < Ki ? e : Ki;
    };

    auto load_stage = [&](int st, const walk &w) {
        uint8_t *sa = smem + st * C::STAGE;
        uint8_t *sb = sa + C::A_BYTES;
        const int k0 = k_first(w), kend = k_end(w);
        /* chunk q = row r, chunk cc of the stage's KC * 8 (contiguous in global memory) ->
         * block cc / 8, chunk cc % 8 */
#pragma unroll
        for (int i = 0; i < (C::A_BYTES / 16 + C::THREADS - 1) / C::THREADS; i++) {
            const int q = i * C::THREADS + tid;
            if (C::A_BYTES / 16 % C::THREADS != 0 && q >= C::A_BYTES / 16) break;
            const int r = q / (C::KC * 8), cc = q % (C::KC * 8);
            const int n = n0 + r, k = k0 + cc * 8;
            const bool ok = n < N && k < kend;
            rw_cp_async16(sa + (cc >> 3) * (BN * 128) + rw_swz128(r, cc & 7),
                          ok ? W + (int64_t)n * K + k : W, ok ? 16 : 0);
        }
#pragma unroll
        for (int i = 0; i < (C::B_BYTES / 16 + C::THREADS - 1) / C::THREADS; i++) {
            const int q = i * C::THREADS + tid;
            if (C::B_BYTES / 16 % C::THREADS != 0 && q >= C::B_BYTES / 16) break;
            const int r = q / (C::KC * 8), cc = q % (C::KC * 8);
            const int m = m0 + r, k = k0 + cc * 8;
            const bool ok = m < M && k < kend;
            const int off = (cc >> 3) * (TN * 128) + rw_swz128(r, cc & 7);
            const int64_t xo = (int64_t)m * K + k;
            rw_cp_async16(sb + off, ok ? x + xo : x, ok ? 16 : 0);
            if (SPLIT) rw_cp_async16(sb + C::B_BYTES + off, ok ? xlo + xo : xlo, ok ? 16 : 0);
        }
    };

    float acc[C::MT][C::NT][4];
    /* FOLD: the finished slices' sum, ((p0 + p1) + p2) + ... (its own instantiation: these
     * registers cost the wide tiles up to 1.15 x where nothing is folded) */
    float tot[FOLD ? C::MT : 1][FOLD ? C::NT : 1][4];
#pragma unroll
    for (int a = 0; a < C::MT; a++)
#pragma unroll
        for (int b = 0; b < C::NT; b++)
#pragma unroll
            for (int c = 0; c < 4; c++)
                acc[a][b][c] = 0.0f;

    /* FOLD: a slice finished; add its sum to the total of the earlier ones (the first slice's
     * sum is the total), then accumulate the next slice from 0 */
    auto fold = [&](bool first) {
#pragma unroll
        for (int a = 0; a < C::MT; a++)
#pragma unroll
            for (int b = 0; b < C::NT; b++)
#pragma unroll
                for (int c = 0; c < 4; c++) {
                    tot[a][b][c] = first ? acc[a][b][c] : tot[a][b][c] + acc[a][b][c];
                    acc[a][b][c] = 0.0f;
                }
    };

    /* C fragment: rows gq, gq + 8 (weight rows n), columns 2 cq, 2 cq + 1 (tokens m); a warp's
     * store covers 8 consecutive floats of 4 token rows. The last CTA's sum below walks the same
     * elements; it is not folded into one iterator with this: that raised the 128 x 128 tile from
     * 150 to 168 registers. */
    const int gq = lane >> 2, cq = lane & 3;
    auto store = [&](float *dst_) {
        /* dst and N through an opaque move: the addresses are computed here, not hoisted out of
         * the main loop (where they would hold 2 registers per element across every mma) */
        float *dst;
        int64_t ldn;
        asm volatile("mov.b64 %0, %2;\n\tmov.b64 %1, %3;"
                     : "=l"(dst), "=l"(ldn)
                     : "l"(dst_), "l"(N));
#pragma unroll
        for (int mt = 0; mt < C::MT; mt++)
#pragma unroll
            for (int nt = 0; nt < C::NT; nt++)
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    const int64_t m = m0 + (wn * C::NT + nt) * 8 + cq * 2 + h;
                    if (m >= M) continue;
#pragma unroll
                    for (int half = 0; half < 2; half++) {
                        const int64_t n = n0 + (wm * C::MT + mt) * 16 + gq + half * 8;
                        if (n < N) dst[m * ldn + n] = acc[mt][nt][half * 2 + h];
                    }
                }
    };

    walk lw = {slice, 0}; /* the next stage to load */
    /* wgmma tiles load their stages with tensor copies, one thread a stage, completing on the
     * stage's barrier (tma.cuh); the others with cp.async groups */
    __shared__ __align__(8) uint64_t full[WG ? C::STAGES : 1];
    auto tma_stage = [&](int st, const walk &w) {
        uint8_t *sa = smem + st * C::STAGE;
        uint8_t *sb = sa + C::A_BYTES;
        const int k0 = k_first(w);
        rw_mbar_expect_tx(&full[st], C::STAGE);
#pragma unroll
        for (int kc = 0; kc < C::KC; kc++) {
            rw_tma_load_2d(sa + kc * (BN * 128), &t.tw, &full[st], k0 + kc * 64, n0);
            rw_tma_load_2d(sb + kc * (TN * 128), &t.tx, &full[st], k0 + kc * 64, m0);
            if (SPLIT)
                rw_tma_load_2d(sb + C::B_BYTES + kc * (TN * 128), &t.txlo, &full[st], k0 + kc * 64,
                               m0);
        }
    };
    if constexpr (WG) {
        if (tid == 0) {
#pragma unroll
            for (int st = 0; st < C::STAGES; st++)
                rw_mbar_init(&full[st], 1);
            rw_mbar_init_fence();
        }
        __syncthreads();
    }
#pragma unroll
    for (int st = 0; st < C::AHEAD; st++) {
        if constexpr (WG) {
            if (tid == 0 && st < nkb) tma_stage(st, lw);
        } else {
            if (st < nkb) load_stage(st, lw);
            rw_cp_async_commit();
        }
        next(lw);
    }
    if constexpr (WG) {
        /* wgmma with one group in flight: stage kb's group runs while the barrier and the loads
         * of the next iteration go ahead; its wait<1> there retires group kb - 1, so the
         * stage the loads overwrite (kb - 2 + STAGES) is no longer read. Slices are the outer
         * loop so that the fold below follows a wait for everything (a fold inside the stage
         * loop made the compiler serialize every wgmma). Every stage is whole (launch_wg). */
        int kb = 0;
        for (int sl = FOLD ? 0 : slice; sl < (FOLD ? g.S : slice + 1); sl++) {
            const int n = sl == g.S - 1 ? nlast : nps;
            for (int j = 0; j < n; j++, kb++) {
                /* stage kb has landed; the barrier then says every warp has retired group
                 * kb - 2, whose stage the next copy refills */
                rw_mbar_wait(&full[kb % C::STAGES], (uint32_t)(kb / C::STAGES) & 1u);
                __syncthreads();
                if (tid == 0 && kb + C::AHEAD < nkb) tma_stage((kb + C::AHEAD) % C::STAGES, lw);
                next(lw);
                const uint8_t *sa = smem + (kb % C::STAGES) * C::STAGE;
                const uint8_t *sb = sa + C::A_BYTES;
                /* one descriptor for each operand tile, the slices as offsets (rw_wgmma_desc_at) */
                const uint64_t dsa = rw_wgmma_desc(sa + (warp >> 2) * (64 * 128));
                const uint64_t dsb = rw_wgmma_desc(sb);
                rw_wgmma_fence();
#pragma unroll
                for (int i = 0; i < C::KC * 4; i++) {
                    const uint32_t ao = (i >> 2) * (BN * 128) + (i & 3) * 32;
                    const uint32_t bo = (i >> 2) * (TN * 128) + (i & 3) * 32;
                    const uint64_t da = rw_wgmma_desc_at(dsa, ao);
                    rw_wgmma_bf16<TN>(&acc[0][0][0], da, rw_wgmma_desc_at(dsb, bo));
                    if (SPLIT)
                        rw_wgmma_bf16<TN>(&acc[0][0][0], da,
                                          rw_wgmma_desc_at(dsb, C::B_BYTES + bo));
                }
                rw_wgmma_commit();
                rw_wgmma_wait<1>();
            }
            rw_wgmma_wait<0>();
            if constexpr (FOLD) fold(sl == 0);
        }
    } else {
        walk cw = {slice, 0}; /* the stage to compute */
        for (int kb = 0; kb < nkb; kb++) {
            rw_cp_async_wait<C::AHEAD - 1>();
            __syncthreads(); /* stage kb landed for everyone; stage kb - 1 is no longer read */
            if (kb + C::AHEAD < nkb) load_stage((kb + C::AHEAD) % C::STAGES, lw);
            next(lw);
            rw_cp_async_commit();
            const uint8_t *sa = smem + (kb % C::STAGES) * C::STAGE;
            const uint8_t *sb = sa + C::A_BYTES;
            const int k0 = k_first(cw), kend = k_end(cw);
#pragma unroll
            for (int kc = 0; kc < C::KC; kc++) {
                const uint8_t *ab = sa + kc * (BN * 128);
                const uint8_t *bb = sb + kc * (TN * 128);
#pragma unroll
                for (int ks = 0; ks < 4; ks++) {
                    /* k16 steps past the slice are skipped, not run on zeros: the same steps in
                     * every configuration (see the top of the file) */
                    if (k0 + kc * 64 + ks * 16 >= kend) continue;
                    uint32_t a[C::MT][4];
#pragma unroll
                    for (int mt = 0; mt < C::MT; mt++) {
                        const int r = (wm * C::MT + mt) * 16 + (lane & 7) + ((lane >> 3) & 1) * 8;
                        const int c = ks * 2 + (lane >> 4);
                        rw_ldsm_x4(a[mt][0], a[mt][1], a[mt][2], a[mt][3], ab + rw_swz128(r, c));
                    }
                    if constexpr (C::NT == 1) {
                        const int r = wn * 8 + (lane & 7);
                        const int c = ks * 2 + ((lane >> 3) & 1);
                        uint32_t b0, b1, l0 = 0, l1 = 0;
                        rw_ldsm_x2(b0, b1, bb + rw_swz128(r, c));
                        if (SPLIT) rw_ldsm_x2(l0, l1, bb + C::B_BYTES + rw_swz128(r, c));
#pragma unroll
                        for (int mt = 0; mt < C::MT; mt++) {
                            rw_mma_bf16_16816(acc[mt][0], a[mt], b0, b1);
                            if (SPLIT) rw_mma_bf16_16816(acc[mt][0], a[mt], l0, l1);
                        }
                    } else {
#pragma unroll
                        for (int nt = 0; nt < C::NT; nt += 2) {
                            const int r = (wn * C::NT + nt) * 8 + ((lane >> 4) << 3) + (lane & 7);
                            const int c = ks * 2 + ((lane >> 3) & 1);
                            uint32_t b0, b1, b2, b3, l0 = 0, l1 = 0, l2 = 0, l3 = 0;
                            rw_ldsm_x4(b0, b1, b2, b3, bb + rw_swz128(r, c));
                            if (SPLIT)
                                rw_ldsm_x4(l0, l1, l2, l3, bb + C::B_BYTES + rw_swz128(r, c));
#pragma unroll
                            for (int mt = 0; mt < C::MT; mt++) {
                                rw_mma_bf16_16816(acc[mt][nt], a[mt], b0, b1);
                                if (SPLIT) rw_mma_bf16_16816(acc[mt][nt], a[mt], l0, l1);
                                rw_mma_bf16_16816(acc[mt][nt + 1], a[mt], b2, b3);
                                if (SPLIT) rw_mma_bf16_16816(acc[mt][nt + 1], a[mt], l2, l3);
                            }
                        }
                    }
                }
            }
            const int done_slice = cw.s;
            next(cw);
            if constexpr (FOLD)
                if (cw.s != done_slice) fold(done_slice == 0);
        }
    }
    rw_cp_async_wait<0>();
    if constexpr (FOLD) {
#pragma unroll
        for (int a = 0; a < C::MT; a++)
#pragma unroll
            for (int b = 0; b < C::NT; b++)
#pragma unroll
                for (int c = 0; c < 4; c++)
                    acc[a][b][c] = tot[a][b][c];
        store(g.Y);
        return;
    }

    /* Unsplit: straight to Y. Split: to this slice's partial; then the tile's last CTA sums the
     * slices in order into Y. */
    if (g.S == 1) {
        store(g.Y);
        return;
    }
    store(g.part + (int64_t)slice * M * N);
    /* publish this slice's partial before counting it (the pattern of a last-block reduction:
     * stores, fence, then the counter) */
    __threadfence();
    __syncthreads();
    if (tid == 0) {
        const unsigned done = atomicAdd(&g.counters[tile], 1u);
        last_cta = done == (unsigned)g.S - 1;
        if (last_cta) g.counters[tile] = 0; /* ready for the next call */
    }
    __syncthreads();
    if (!last_cta) return;
    __threadfence();
#pragma unroll
    for (int mt = 0; mt < C::MT; mt++)
#pragma unroll
        for (int nt = 0; nt < C::NT; nt++)
#pragma unroll
            for (int h = 0; h < 2; h++) {
                const int64_t m = m0 + (wn * C::NT + nt) * 8 + cq * 2 + h;
                if (m >= M) continue;
#pragma unroll
                for (int half = 0; half < 2; half++) {
                    const int64_t n = n0 + (wm * C::MT + mt) * 16 + gq + half * 8;
                    if (n >= N) continue;
                    /* L2 reads (.cg): the other slices were written by other SMs */
                    float v = __ldcg(g.part + m * N + n);
                    for (int s = 1; s < g.S; s++)
                        v += __ldcg(g.part + (int64_t)s * M * N + m * N + n);
                    g.Y[m * N + n] = v;
                }
            }
}

/* ------------------------------------------------------------------------------------------ */
/* launcher                                                                                     */
/* ------------------------------------------------------------------------------------------ */
template <int BN, int TN, int WM, int WN, bool SPLIT, int STG = 0, bool FOLD = false,
          bool WG = false>
static rw_status launch(const gemm_args &g, int64_t ctas, rw_stream s, rw_err *err,
                        const gemm_maps *maps = NULL) {
    typedef gemm_cfg<BN, TN, WM, WN, SPLIT, STG, WG> C;
    /* a configuration's shared memory does not depend on the shape: the attribute set here is
     * the most any call of this kernel needs, so captured graphs stay launchable */
    RW_CUDA_CHECK(err, cudaFuncSetAttribute(gemm_kernel<BN, TN, WM, WN, SPLIT, STG, FOLD, WG>,
                                            cudaFuncAttributeMaxDynamicSharedMemorySize, C::SMEM));
    const gemm_maps none = {};
    (void)rw_launch_pdl(gemm_kernel<BN, TN, WM, WN, SPLIT, STG, FOLD, WG>, dim3((unsigned)ctas),
                        C::THREADS, C::SMEM, (cudaStream_t)s, g, maps ? *maps : none);
    return RW_LAUNCH_CHECK(s, "gemm", err);
}

/* Tile candidates, best first (tile area, then the squarer tile: fewer shared-memory reads per
 * mma), with their warp layouts. */
#define GEMM_TILES(X)                                                                              \
    X(128, 128, 4, 2)                                                                              \
    X(128, 64, 4, 2)                                                                               \
    X(64, 64, 2, 2)                                                                                \
    X(128, 32, 4, 1)                                                                               \
    X(64, 32, 2, 2)                                                                                \
    X(128, 16, 4, 1)                                                                               \
    X(32, 32, 2, 2)                                                                                \
    X(64, 16, 4, 1)                                                                                \
    X(128, 8, 4, 1)                                                                                \
    X(32, 16, 2, 2)                                                                                \
    X(64, 8, 4, 1)                                                                                 \
    X(16, 16, 1, 2)                                                                                \
    X(32, 8, 2, 1)                                                                                 \
    X(16, 8, 1, 1)

typedef struct gemm_tile {
    int bn, tn, warps;
} gemm_tile;
#define GEMM_TILE_ENTRY(BN_, TN_, WM_, WN_) {BN_, TN_, (WM_) * (WN_)},
static const gemm_tile k_tiles[] = {GEMM_TILES(GEMM_TILE_ENTRY)};
#define GEMM_NTILES (sizeof k_tiles / sizeof k_tiles[0])

/* The tile and the form of the K split for M rows.
 *
 * M <= 8 (decode of a few sequences): an 8-token tile of 4 warps, K's slices over CTAs (S per
 * tile): the first tile whose grid gives every SM 1.5 CTAs, else the one with the most. A weight
 * tile is then streamed by S CTAs at once. Measured on an H200 at M = 1 (split activations,
 * us): o_proj 2048 x 4096 29.3 unsplit, 11.6 in 8 slices on 64 x 8 tiles (15.4 on 128 x 8);
 * q/k/v 5120 x 2048 14.6 unsplit, 10.4 in 4 slices on 64 x 8 of 2 stages (launch_tile);
 * lm_head (not split) 154 on 128 x 8 against 164 on 64 x 8.
 *
 * M > 8: the first candidate of at least 4 warps (fewer cannot keep enough weight bytes in
 * flight) with token tiles no wider than M needs (16 at least) whose tiles give half the SMs a
 * CTA; when none does (small N and M), the one with the most tiles. Each CTA folds the slices
 * (no partials to write and read back).
 *
 * 8 < M <= 128 on the wgmma form (sm_90a, K's slices whole stages): the wgmma tiles of 64 tokens
 * instead, however few tokens (the padding costs tensor-core work, which is not what bounds these
 * GEMMs): 128 x 64 where a quarter of the SMs get a CTA, else 64 x 64; and where 128 x 128 tiles
 * already give every SM one (the lm_head), 128 x 128 beyond 64 tokens. Measured on an H100
 * (docs/BENCHMARKS.md, twenty-seventh session: every tile forced in turn), us: o_proj at 16 /
 * 32 / 64 / 128 tokens 27.5 / 26.9 / 31.3 / 37.5 with the rule above -> 20.0 / 19.3 / 19.3 /
 * 19.4 on 64 x 64; q/k/v 18.1 / 20.0 / 12.3 / 15.0 -> 14.5 / 14.0 / 13.9 / 14.1 on 128 x 64;
 * the lm_head at 16 / 32 tokens 225 / 241 -> 219 / 223. The mma.sync tiles' grids of half the
 * SMs were the fastest of those tiles, but a wgmma CTA streams its weights well enough that
 * fewer, larger CTAs win.
 *
 * The choice changes the speed, never a bit of the result (see the top of the file). */
/* The first candidate of at least 4 warps with tn_lo <= TN <= tn_hi whose grid (tiles times
 * per_tile CTAs) has at least `target` CTAs; when none has, the one with the most. */
static gemm_tile first_reaching(int64_t N, int64_t M, int64_t per_tile, int tn_lo, int64_t tn_hi,
                                int64_t target) {
    gemm_tile most = k_tiles[GEMM_NTILES - 1];
    int64_t most_ctas = -1;
    for (size_t i = 0; i < GEMM_NTILES; i++) {
        const gemm_tile t = k_tiles[i];
        if (t.tn < tn_lo || t.tn > tn_hi || t.warps < 4) continue;
        const int64_t ctas = ((N + t.bn - 1) / t.bn) * ((M + t.tn - 1) / t.tn) * per_tile;
        if (ctas >= target) return t;
        if (ctas > most_ctas) {
            most_ctas = ctas;
            most = t;
        }
    }
    return most;
}

#if RW_WGMMA
/* The table's entry for a tile (its warps). */
static gemm_tile tile_of(int bn, int tn) {
    for (size_t i = 0; i < GEMM_NTILES; i++)
        if (k_tiles[i].bn == bn && k_tiles[i].tn == tn) return k_tiles[i];
    return gemm_tile{bn, tn, 8};
}
#endif

/* wg: the wgmma form applies to every wide tile (K's slices whole stages: wg_whole). */
static gemm_tile pick_tile(int64_t N, int64_t M, int S, int sms, bool wg, bool *fold) {
    *fold = M > 8;
    if (M <= 8) return first_reaching(N, M, S, 8, 8, (3 * (int64_t)sms + 1) / 2);
#if RW_WGMMA
    if (wg && M <= 128) {
        const int64_t rows = (N + 127) / 128;
        if (rows * ((M + 127) / 128) >= sms) return M > 64 ? tile_of(128, 128) : tile_of(128, 64);
        return rows * ((M + 63) / 64) >= sms / 4 ? tile_of(128, 64) : tile_of(64, 64);
    }
#else
    (void)wg;
#endif
    int64_t tn_max = 16;
    while (tn_max < M && tn_max < 128)
        tn_max *= 2;
    const gemm_tile t = first_reaching(N, M, 1, 1, tn_max, sms / 2);
#if RW_WGMMA
    /* A one-wave grid of 128 x 128 tiles that leaves SMs idle (q/k/v at M = 256: 80 CTAs on an
     * H200's 132) takes 128 x 96 tiles where they give more CTAs and still one wave (120): the
     * longest CTA then streams the same weight rows for three quarters of the tokens. Only on
     * the wgmma form (launch_tile), which has this tile. */
    if (t.bn == 128 && t.tn == 128) {
        const int64_t rows = (N + 127) / 128;
        const int64_t c128 = rows * ((M + 127) / 128), c96 = rows * ((M + 95) / 96);
        if (c128 <= sms && c96 > c128 && c96 <= sms) return gemm_tile{128, 96, 8};
        /* Many waves of them over one K slice (the lm_head beyond 128 tokens) take 128 x 256
         * tiles where those pad no more token rows than 128 x 128 ones: each weight tile is then
         * read once for up to 256 tokens, not once for every 128, on half the CTAs (one bf16
         * input only: launch_tile). Measured on an H100 (docs/BENCHMARKS.md, twenty-sixth
         * session), the lm_head 128 x 128 -> 128 x 256 at 129 tokens 493 -> 416 us, 192: 395 ->
         * 319, 512: 616 -> 573, 2048: 2.43 -> 2.03 ms; at 384 tokens (two 256-token tiles, one
         * half empty) 467 -> 640 us, which the padding rule keeps on 128 x 128; at 256 about 3%
         * slower (335 -> 345 us), left to the simple rule. */
        const bool no_more_pad = (M + 255) / 256 * 2 == (M + 127) / 128;
        if (S == 1 && M > 128 && rows >= 2 * (int64_t)sms && no_more_pad)
            return gemm_tile{128, 256, 8};
    }
#endif
    return t;
}

/* The wgmma twin of a wide tile (builds for sm_90a): the same tile and the same k16 steps, each
 * warpgroup 64 weight rows by every token of the tile. Taken where every slice is whole stages
 * of its KB columns (the kernel's wgmma path has no partial stage), which the model's K of 2048
 * and 4096 always are. The twin changes no bit: tests/worker/test_gemm_gpu.c compares rows of
 * these tiles with the same rows computed alone on mma.sync decode tiles. */
template <int BN, int TN> static bool wg_whole(const gemm_args &g) {
    const int64_t kb = gemm_cfg<BN, TN, BN / 16, 1, false, 0, true>::KB;
    return g.K % kb == 0 && (g.S == 1 || g.span % kb == 0);
}
/* The twin's tensor maps (tma.cuh): false where the driver cannot make them, and the caller keeps
 * the mma.sync tile. */
template <int BN, int TN> static bool wg_maps(const gemm_args &g, gemm_maps *t) {
    return rw_tma_map_bf16(&t->tw, g.W, (uint64_t)g.N, (uint64_t)g.K, BN) &&
           rw_tma_map_bf16(&t->tx, g.x, (uint64_t)g.M, (uint64_t)g.K, TN) &&
           (!g.xlo || rw_tma_map_bf16(&t->txlo, g.xlo, (uint64_t)g.M, (uint64_t)g.K, TN));
}
template <int BN, int TN>
static rw_status launch_wg(const gemm_args &g, const gemm_maps &t, int64_t ctas, rw_stream s,
                           rw_err *err) {
    if constexpr (TN == 256) { /* one K slice, one bf16 input (pick_tile, launch_tile) */
        if (g.xlo || g.S > 1)
            RW_FAIL(err, RW_E_INTERNAL, "gemm: the 256-token tile takes one input and one slice");
        return launch<BN, TN, BN / 16, 1, false, 0, false, true>(g, ctas, s, err, &t);
    } else {
        if (g.fold && g.S > 1)
            return g.xlo ? launch<BN, TN, BN / 16, 1, true, 0, true, true>(g, ctas, s, err, &t)
                         : launch<BN, TN, BN / 16, 1, false, 0, true, true>(g, ctas, s, err, &t);
        return g.xlo ? launch<BN, TN, BN / 16, 1, true, 0, false, true>(g, ctas, s, err, &t)
                     : launch<BN, TN, BN / 16, 1, false, 0, false, true>(g, ctas, s, err, &t);
    }
}

/* A tile that only the wgmma form has (pick_tile's 128 x 96 and 128 x 256): launched, its status
 * in *st, where that form applies to g (whole stages, tensor maps, and for 256 tokens one bf16
 * input); false otherwise, and the caller takes 128 x 128 instead. pick_tile does not see
 * whether x_lo is present, so the one-input test is made here. */
template <int TN>
static bool wg_only(const gemm_args &g, int64_t ctas, rw_stream s, rw_err *err, rw_status *st) {
    gemm_maps maps;
    if ((TN == 256 && g.xlo) || !wg_whole<128, TN>(g) || !wg_maps<128, TN>(g, &maps)) return false;
    *st = launch_wg<128, TN>(g, maps, ctas, s, err);
    return true;
}

/* One launch of tile t over g. Narrow (decode) tiles in grids of at most one wave
 * stream with deep pipelines (gemm_cfg's GEMM_DEEP): each CTA must keep more weight bytes in
 * flight when few CTAs share the memory system (measured on an H200 at M = 1..7: q/k/v on 64 x 8
 * tiles 17.6 -> 15.6 us, o_proj on 32 x 16 tiles 28.8 -> 25.3 us); with more CTAs than SMs the
 * larger shared memory costs occupancy instead (lm_head at M = 1: 161 us with 4 stages, 202 us
 * with 6). K slices over CTAs in more than one wave go further, to 2 stages: five 64 x 8 CTAs
 * fit an SM instead of two (q/k/v in 4 slices at M = 1: 14.0 us with 4 stages, 10.4 with 2;
 * o_proj in 8 slices 9.9 us either way). */
static rw_status launch_tile(const gemm_args &g, gemm_tile t, int sms, rw_stream s, rw_err *err) {
    const int64_t ctas = ((g.N + t.bn - 1) / t.bn) * ((g.M + t.tn - 1) / t.tn) * (g.fold ? 1 : g.S);
    if (ctas > INT_MAX)
        RW_FAIL(err, RW_E_UNSUPPORTED, "gemm: M = %lld, N = %lld need %lld CTAs (at most %d)",
                (long long)g.M, (long long)g.N, (long long)ctas, INT_MAX);
    const bool one_wave = ctas <= sms;
    const bool fold = g.fold && g.S > 1;
#if RW_WGMMA
    if (t.bn == 128 && (t.tn == 256 || t.tn == 96)) { /* pick_tile's wgmma-only tiles */
        rw_status st;
        if (t.tn == 256 ? wg_only<256>(g, ctas, s, err, &st) : wg_only<96>(g, ctas, s, err, &st))
            return st;
        return launch_tile(g, gemm_tile{128, 128, 8}, sms, s, err);
    }
    gemm_maps maps;
    if (t.bn == 128 && t.tn == 128 && wg_whole<128, 128>(g) && wg_maps<128, 128>(g, &maps))
        return launch_wg<128, 128>(g, maps, ctas, s, err);
    if (t.bn == 128 && t.tn == 64 && wg_whole<128, 64>(g) && wg_maps<128, 64>(g, &maps))
        return launch_wg<128, 64>(g, maps, ctas, s, err);
    if (t.bn == 64 && t.tn == 64 && wg_whole<64, 64>(g) && wg_maps<64, 64>(g, &maps))
        return launch_wg<64, 64>(g, maps, ctas, s, err);
#endif
#define GEMM_DISPATCH(BN_, TN_, WM_, WN_)                                                          \
    if (t.bn == BN_ && t.tn == TN_) {                                                              \
        if (fold)                                                                                  \
            return g.xlo ? launch<BN_, TN_, WM_, WN_, true, 0, true>(g, ctas, s, err)              \
                         : launch<BN_, TN_, WM_, WN_, false, 0, true>(g, ctas, s, err);            \
        if constexpr (TN_ == 8)                                                                    \
            if (!one_wave && g.S > 1)                                                              \
                return g.xlo ? launch<BN_, TN_, WM_, WN_, true, 2>(g, ctas, s, err)                \
                             : launch<BN_, TN_, WM_, WN_, false, 2>(g, ctas, s, err);              \
        if constexpr (TN_ <= 16)                                                                   \
            if (one_wave)                                                                          \
                return g.xlo ? launch<BN_, TN_, WM_, WN_, true, GEMM_DEEP>(g, ctas, s, err)        \
                             : launch<BN_, TN_, WM_, WN_, false, GEMM_DEEP>(g, ctas, s, err);      \
        return g.xlo ? launch<BN_, TN_, WM_, WN_, true>(g, ctas, s, err)                           \
                     : launch<BN_, TN_, WM_, WN_, false>(g, ctas, s, err);                         \
    }
    GEMM_TILES(GEMM_DISPATCH)
#undef GEMM_DISPATCH
    RW_FAIL(err, RW_E_INTERNAL, "gemm: no kernel for tile %d x %d", t.bn, t.tn);
}

extern "C" rw_status rw_k_gemm(const uint16_t *W, int64_t N, int64_t K, const uint16_t *x,
                               const uint16_t *x_lo, int64_t M, float *Y, void *ws, size_t ws_bytes,
                               rw_stream s, rw_err *err) {
    if (M < 0) RW_FAIL(err, RW_E_INVALID_ARG, "gemm: M = %lld (must be >= 0)", (long long)M);
    if (M == 0) return RW_OK;
    if (N < 1 || K < 1)
        RW_FAIL(err, RW_E_INVALID_ARG, "gemm: N = %lld, K = %lld (both must be >= 1)", (long long)N,
                (long long)K);
    if (K % 8 != 0)
        RW_FAIL(err, RW_E_UNSUPPORTED, "gemm: K = %lld is not a multiple of 8 (16-byte rows)",
                (long long)K);
    if (K > INT_MAX / 2 || N > INT_MAX / 2 || M > INT_MAX / 2)
        RW_FAIL(err, RW_E_UNSUPPORTED, "gemm: M = %lld, N = %lld, K = %lld (each at most %d)",
                (long long)M, (long long)N, (long long)K, INT_MAX / 2);
    if (!W || !x || !Y) RW_FAIL(err, RW_E_INVALID_ARG, "gemm: NULL W, x or Y");
    if ((uintptr_t)W % 16 || (uintptr_t)x % 16 || (x_lo && (uintptr_t)x_lo % 16))
        RW_FAIL(err, RW_E_INVALID_ARG, "gemm: W = %p, x = %p, x_lo = %p must be 16-byte aligned",
                (const void *)W, (const void *)x, (const void *)x_lo);
    if ((uintptr_t)Y % 4)
        RW_FAIL(err, RW_E_INVALID_ARG, "gemm: Y = %p is not 4-byte aligned", (void *)Y);

    int sms = 0;
    RW_CHECK(rw_cuda_sm_count(&sms, err));
    const int S = rw_k_gemm_splits(N, K);
    gemm_args g = {W, x, x_lo, N, K, M, Y, NULL, NULL, S, true, rw_k_gemm_slice_cols(K, S)};
    const bool wg = wg_whole<128, 64>(g) && wg_whole<64, 64>(g) && wg_whole<128, 128>(g);
    const gemm_tile t = pick_tile(N, M, S, sms, wg, &g.fold);
    if (g.S > 1 && !g.fold) {
        const size_t need = rw_k_gemm_ws_bytes(N, K, M);
        if (!ws || ws_bytes < need || (uintptr_t)ws % 16)
            RW_FAIL(err, RW_E_INVALID_ARG,
                    "gemm: N = %lld, K = %lld splits K in %d and needs a 16-byte aligned "
                    "workspace of %zu bytes for M = %lld (have %p, %zu bytes)",
                    (long long)N, (long long)K, g.S, need, (long long)M, ws, ws_bytes);
        if ((N + t.bn - 1) / t.bn > RW_K_GEMM_COUNTERS)
            RW_FAIL(err, RW_E_INTERNAL, "gemm: N = %lld needs %lld tile counters (have %d)",
                    (long long)N, (long long)((N + t.bn - 1) / t.bn), RW_K_GEMM_COUNTERS);
        g.counters = (unsigned *)ws;
        g.part = (float *)((uint8_t *)ws + RW_K_GEMM_COUNTERS * sizeof(unsigned));
        /* a few tokens on a split weight: gemv.cu's form where it applies (the same bits) */
        bool done = false;
        RW_CHECK(rw_gemv_launch(W, N, K, x, x_lo, M, Y, g.S, g.span, s, &done, err));
        if (done) return RW_OK;
    }
    return launch_tile(g, t, sms, s, err);
}
