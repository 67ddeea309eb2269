/* gemm.cu - the dense GEMM of the CUDA backend: Y [M, N] fp32 = (x + x_lo) [M, K] . W [N, K]^T with
 * bf16 inputs, tensor cores (mma.sync m16n8k16, fp32 accumulate) and the same bits for a token's
 * row whatever batch it is computed in. Contract: gemm.h; CPU reference: gemm_ref.c.
 *
 * One CTA computes a tile of BN weight rows times TN tokens over all of K. The weight rows are the
 * mma's M side (16-row fragments) and the tokens its N side (8-column fragments), so a decode step
 * of one token wastes at most 7 of 8 columns, not 15 of 16 rows. K is streamed through a
 * cp.async pipeline of 3-4 stages of KC blocks of 64 columns; shared-memory tiles are
 * [rows][8 x 16-byte chunks] per 64-column block with chunk c of row r stored at c ^ (r & 7), so
 * ldmatrix reads are free of bank conflicts (the layout of moe/experts.cu). Rows n >= N, tokens
 * m >= M and columns k >= K are zero-filled by cp.async with a source size of 0.
 *
 * Batch invariance. Element (m, n) is accumulated by one thread in one fp32 register: starting
 * from 0, one mma per k16 step for k0 = 0, 16, 32, ... < K in increasing order (with x_lo: the x
 * mma then the x_lo mma of the same step). Nothing else ever adds into it: no split-K, no atomics,
 * no reduction across threads, and k16 steps wholly beyond K are skipped rather than run on zero
 * padding, so the sequence of operations is the same for every tile configuration (KC, stages).
 * Weight row n always sits in row n % 16 of its mma fragment (BN is a multiple of 16 and tiles
 * start at multiples of BN). What the batch changes is the token tile width TN, the weight tile
 * height BN and the fragment column a token lands in (m % 8 within the batch). An mma's output
 * element (i, j) is c_ij + sum_k a_ik b_kj over its own row of A and column of B: the columns of
 * B are independent of each other and computed the same way in every column position, so the
 * tile shape may be chosen from M, N and the SM count for speed without changing any bit.
 * tests/worker/test_gemm_gpu.c checks rows computed alone and inside batches of several sizes
 * byte for byte. */
#include <cuda_runtime.h>
#include <limits.h>
#include <stdint.h>

#include "cuda_check.h"
#include "gemm.h"
#include "mma.cuh"

/* ------------------------------------------------------------------------------------------ */
/* tile configuration                                                                           */
/* ------------------------------------------------------------------------------------------ */
/* BN weight rows x TN tokens per CTA, WM x WN warps (each BN/WM rows x TN/WN tokens). A stage
 * holds KC 64-column blocks, KC = min(128 / BN, 128 / TN): 16 KB of weights whenever BN >= TN (a
 * narrow decode tile streams 512 columns of 16 rows per stage, so every CTA keeps 32-48 KB of
 * weights in flight) and at most 16 KB of each activation operand. */
template <int BN, int TN, int WM, int WN, bool SPLIT, bool DEEP = false> struct gemm_cfg {
    /* DEEP: up to 6 stages in 200 KB of shared memory (rw_k_gemm says when) */
    static constexpr int THREADS = 32 * WM * WN;
    static constexpr int KC = (128 / BN) < (128 / TN) ? (128 / BN) : (128 / TN);
    static constexpr int KB = 64 * KC; /* columns per stage */
    static constexpr int A_BYTES = BN * KC * 128;
    static constexpr int B_BYTES = TN * KC * 128;
    static constexpr int STAGE = A_BYTES + B_BYTES * (SPLIT ? 2 : 1);
    static constexpr int DEFAULT_STAGES = STAGE <= 32768 ? 4 : 3;
    static constexpr int DEEP_STAGES = 200 * 1024 / STAGE < 6 ? 200 * 1024 / STAGE : 6;
    static constexpr int STAGES =
        DEEP && DEEP_STAGES > DEFAULT_STAGES ? DEEP_STAGES : DEFAULT_STAGES;
    static constexpr int SMEM = STAGES * STAGE;
    static constexpr int MT = BN / WM / 16; /* m16 fragments per warp */
    static constexpr int NT = TN / WN / 8;  /* n8 fragments per warp */
    static_assert(BN % (16 * WM) == 0 && TN % (8 * WN) == 0, "warp tile");
    static_assert(NT == 1 || NT % 2 == 0, "B fragments are loaded in pairs");
};

/* m-tiles per group of the CTA order: consecutive CTAs walk the weight tiles for GROUP_M token
 * tiles, so a weight tile read from memory serves several token tiles from L2 when W is larger
 * than L2 (lm_head prefill) */
#define GROUP_M 8

template <int BN, int TN, int WM, int WN, bool SPLIT, bool DEEP = false>
__global__ void __launch_bounds__(32 * WM * WN)
    gemm_kernel(const uint16_t *__restrict__ W, int64_t N, int64_t K,
                const uint16_t *__restrict__ x, const uint16_t *__restrict__ xlo, int64_t M,
                float *__restrict__ Y) {
    typedef gemm_cfg<BN, TN, WM, WN, SPLIT, DEEP> C;
    extern __shared__ __align__(128) uint8_t smem[];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int wm = warp % WM, wn = warp / WM;

    /* CTA -> (token tile, weight tile), grouped by GROUP_M token tiles */
    const int64_t ntn = (N + BN - 1) / BN, ntm = (M + TN - 1) / TN;
    const int64_t bid = blockIdx.x, per_group = (int64_t)GROUP_M * ntn;
    const int64_t first_m = (bid / per_group) * GROUP_M;
    const int64_t gsz = ntm - first_m < GROUP_M ? ntm - first_m : GROUP_M;
    const int64_t in = bid % per_group;
    const int64_t m0 = (first_m + in % gsz) * TN, n0 = (in / gsz) * BN;
    const int nkb = (int)((K + C::KB - 1) / C::KB);

    auto load_stage = [&](int st, int kb) {
        uint8_t *sa = smem + st * C::STAGE;
        uint8_t *sb = sa + C::A_BYTES;
        const int64_t k0 = (int64_t)kb * C::KB;
        /* chunk q = row r, chunk cc of the stage's KC * 8 (contiguous in global memory) ->
         * block cc / 8, chunk cc % 8 */
#pragma unroll
        for (int i = 0; i < (C::A_BYTES / 16 + C::THREADS - 1) / C::THREADS; i++) {
            const int q = i * C::THREADS + tid;
            if (C::A_BYTES / 16 % C::THREADS != 0 && q >= C::A_BYTES / 16) break;
            const int r = q / (C::KC * 8), cc = q % (C::KC * 8);
            const int64_t n = n0 + r, k = k0 + cc * 8;
            const bool ok = n < N && k < K;
            rw_cp_async16(sa + (cc >> 3) * (BN * 128) + rw_swz128(r, cc & 7),
                          ok ? W + n * K + k : W, ok ? 16 : 0);
        }
#pragma unroll
        for (int i = 0; i < (C::B_BYTES / 16 + C::THREADS - 1) / C::THREADS; i++) {
            const int q = i * C::THREADS + tid;
            if (C::B_BYTES / 16 % C::THREADS != 0 && q >= C::B_BYTES / 16) break;
            const int r = q / (C::KC * 8), cc = q % (C::KC * 8);
            const int64_t m = m0 + r, k = k0 + cc * 8;
            const bool ok = m < M && k < K;
            const int off = (cc >> 3) * (TN * 128) + rw_swz128(r, cc & 7);
            rw_cp_async16(sb + off, ok ? x + m * K + k : x, ok ? 16 : 0);
            if (SPLIT)
                rw_cp_async16(sb + C::B_BYTES + off, ok ? xlo + m * K + k : xlo, ok ? 16 : 0);
        }
    };

    float acc[C::MT][C::NT][4];
#pragma unroll
    for (int a = 0; a < C::MT; a++)
#pragma unroll
        for (int b = 0; b < C::NT; b++)
#pragma unroll
            for (int c = 0; c < 4; c++)
                acc[a][b][c] = 0.0f;

#pragma unroll
    for (int s = 0; s < C::STAGES - 1; s++) {
        if (s < nkb) load_stage(s, s);
        rw_cp_async_commit();
    }
    for (int kb = 0; kb < nkb; kb++) {
        rw_cp_async_wait<C::STAGES - 2>();
        __syncthreads(); /* stage kb landed for everyone; stage kb - 1 is no longer read */
        {
            const int nk = kb + C::STAGES - 1;
            if (nk < nkb) load_stage(nk % C::STAGES, nk);
            rw_cp_async_commit();
        }
        const uint8_t *sa = smem + (kb % C::STAGES) * C::STAGE;
        const uint8_t *sb = sa + C::A_BYTES;
#pragma unroll
        for (int kc = 0; kc < C::KC; kc++) {
            const uint8_t *ab = sa + kc * (BN * 128);
            const uint8_t *bb = sb + kc * (TN * 128);
#pragma unroll
            for (int ks = 0; ks < 4; ks++) {
                /* k16 steps past K are skipped, not run on zeros: the same steps in every
                 * configuration (see the top of the file) */
                if ((int64_t)kb * C::KB + kc * 64 + ks * 16 >= K) continue;
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
                        if (SPLIT) rw_ldsm_x4(l0, l1, l2, l3, bb + C::B_BYTES + rw_swz128(r, c));
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
    }
    rw_cp_async_wait<0>();

    /* C fragment: rows gq, gq + 8 (weight rows n), columns 2 cq, 2 cq + 1 (tokens m); a warp's
     * store covers 8 consecutive floats of 4 token rows */
    const int gq = lane >> 2, cq = lane & 3;
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
                    if (n < N) Y[m * N + n] = acc[mt][nt][half * 2 + h];
                }
            }
}

/* ------------------------------------------------------------------------------------------ */
/* launcher                                                                                     */
/* ------------------------------------------------------------------------------------------ */
template <int BN, int TN, int WM, int WN, bool SPLIT, bool DEEP = false>
static rw_status launch(const uint16_t *W, int64_t N, int64_t K, const uint16_t *x,
                        const uint16_t *xlo, int64_t M, float *Y, int64_t ctas, rw_stream s,
                        rw_err *err) {
    typedef gemm_cfg<BN, TN, WM, WN, SPLIT, DEEP> C;
    /* a configuration's shared memory does not depend on the shape: the attribute set here is
     * the most any call of this kernel needs, so captured graphs stay launchable */
    RW_CUDA_CHECK(err, cudaFuncSetAttribute(gemm_kernel<BN, TN, WM, WN, SPLIT, DEEP>,
                                            cudaFuncAttributeMaxDynamicSharedMemorySize, C::SMEM));
    gemm_kernel<BN, TN, WM, WN, SPLIT, DEEP>
        <<<(unsigned)ctas, C::THREADS, C::SMEM, (cudaStream_t)s>>>(W, N, K, x, xlo, M, Y);
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

/* The first candidate of at least 4 warps (fewer cannot keep enough weight bytes in flight) with
 * token tiles no wider than M needs (16 at least) whose grid gives half the SMs a CTA; when none
 * does (small N and M), the one with the most CTAs. For M <= 8 an 8-token tile that gives half
 * the SMs a CTA comes first (q/k/v at M = 1: 15.6 us against 18.1 us for 16 tokens, lm_head 154
 * against 161 us; o_proj has none and keeps its 32 x 16 tile). Measured on an H200 over the tile
 * list at the 30B-A3B shapes (q/k/v 5120 x 2048, o_proj 2048 x 4096, lm_head 151936 x 2048;
 * M 1..2048), this picks the fastest tile or one within a few percent of it at every point; the
 * rule it replaces (any warp count, a grid for 7/8 of the SMs) ran o_proj at M 1 on one-warp 16 x 8
 * tiles, 1.4 x slower, and q/k/v at M 256 on 128 x 64 tiles, 1.3 x slower. The choice changes the
 * speed, never a bit of the result (see the top of the file). */
static gemm_tile pick_tile(int64_t N, int64_t M, int sms) {
    const int64_t target = sms / 2;
    if (M <= 8)
        for (size_t i = 0; i < sizeof k_tiles / sizeof k_tiles[0]; i++) {
            const gemm_tile t = k_tiles[i];
            if (t.tn == 8 && t.warps >= 4 && (N + t.bn - 1) / t.bn >= target) return t;
        }
    int64_t tn_max = 16;
    while (tn_max < M && tn_max < 128)
        tn_max *= 2;
    gemm_tile best = k_tiles[sizeof k_tiles / sizeof k_tiles[0] - 1];
    int64_t best_ctas = -1;
    for (size_t i = 0; i < sizeof k_tiles / sizeof k_tiles[0]; i++) {
        const gemm_tile t = k_tiles[i];
        if (t.tn > tn_max || t.warps < 4) continue;
        const int64_t ctas = ((N + t.bn - 1) / t.bn) * ((M + t.tn - 1) / t.tn);
        if (ctas >= target) return t;
        if (ctas > best_ctas) {
            best_ctas = ctas;
            best = t;
        }
    }
    return best;
}

extern "C" rw_status rw_k_gemm(const uint16_t *W, int64_t N, int64_t K, const uint16_t *x,
                               const uint16_t *x_lo, int64_t M, float *Y, rw_stream s,
                               rw_err *err) {
    if (M < 0) RW_FAIL(err, RW_E_INVALID_ARG, "gemm: M = %lld (must be >= 0)", (long long)M);
    if (M == 0) return RW_OK;
    if (N < 1 || K < 1)
        RW_FAIL(err, RW_E_INVALID_ARG, "gemm: N = %lld, K = %lld (both must be >= 1)", (long long)N,
                (long long)K);
    if (K % 8 != 0)
        RW_FAIL(err, RW_E_UNSUPPORTED, "gemm: K = %lld is not a multiple of 8 (16-byte rows)",
                (long long)K);
    if (!W || !x || !Y) RW_FAIL(err, RW_E_INVALID_ARG, "gemm: NULL W, x or Y");
    if ((uintptr_t)W % 16 || (uintptr_t)x % 16 || (x_lo && (uintptr_t)x_lo % 16))
        RW_FAIL(err, RW_E_INVALID_ARG, "gemm: W = %p, x = %p, x_lo = %p must be 16-byte aligned",
                (const void *)W, (const void *)x, (const void *)x_lo);
    if ((uintptr_t)Y % 4)
        RW_FAIL(err, RW_E_INVALID_ARG, "gemm: Y = %p is not 4-byte aligned", (void *)Y);

    int sms = 0;
    RW_CHECK(rw_cuda_sm_count(&sms, err));
    const gemm_tile t = pick_tile(N, M, sms);
    const int64_t ctas = ((N + t.bn - 1) / t.bn) * ((M + t.tn - 1) / t.tn);
    if (ctas > INT_MAX)
        RW_FAIL(err, RW_E_UNSUPPORTED, "gemm: M = %lld, N = %lld need %lld CTAs (at most %d)",
                (long long)M, (long long)N, (long long)ctas, INT_MAX);
    /* Narrow (decode) tiles in grids of at most one wave stream with deep pipelines (gemm_cfg's
     * DEEP): each CTA must keep more weight bytes in flight when few CTAs share the memory
     * system (measured on an H200 at M = 1..7: q/k/v on 64 x 8 tiles 17.6 -> 15.6 us, o_proj on
     * 32 x 16 tiles 28.8 -> 25.3 us); with more CTAs than SMs the larger shared memory costs
     * occupancy instead (lm_head at M = 1: 161 us with 4 stages, 202 us with 6). */
    const bool one_wave = ctas <= sms;
#define GEMM_DISPATCH(BN_, TN_, WM_, WN_)                                                          \
    if (t.bn == BN_ && t.tn == TN_) {                                                              \
        if constexpr (TN_ <= 16)                                                                   \
            if (one_wave)                                                                          \
                return x_lo ? launch<BN_, TN_, WM_, WN_, true, true>(W, N, K, x, x_lo, M, Y, ctas, \
                                                                     s, err)                       \
                            : launch<BN_, TN_, WM_, WN_, false, true>(W, N, K, x, x_lo, M, Y,      \
                                                                      ctas, s, err);               \
        return x_lo ? launch<BN_, TN_, WM_, WN_, true>(W, N, K, x, x_lo, M, Y, ctas, s, err)       \
                    : launch<BN_, TN_, WM_, WN_, false>(W, N, K, x, x_lo, M, Y, ctas, s, err);     \
    }
    GEMM_TILES(GEMM_DISPATCH)
#undef GEMM_DISPATCH
    RW_FAIL(err, RW_E_INTERNAL, "gemm: no kernel for tile %d x %d", t.bn, t.tn);
}
