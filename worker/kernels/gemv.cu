/* gemv.cu - the dense GEMM of a few tokens (M <= 8) for weights whose K is split (q/k/v, o_proj):
 * rw_k_gemm's decode form on sm_90a builds (gemm.cu picks it; gemv.cuh). Same contract and the
 * same bits as gemm.cu's 64 x 8 split tiles, which it replaces where it applies.
 *
 * Why a form of its own. At M = 1 the weight is the whole cost: q/k/v reads 21 MB and o_proj
 * 17 MB a layer. gemm.cu's split tiles stream a 512-column slice in 2 stages, so a CTA has one
 * 16 KB stage in flight at a time and walks its slice in four memory round trips, then adds the
 * slices through global memory (a fifth and sixth): 11.7 and 11.2 us a layer on an H200, 0.42 and
 * 0.35 of the copy rate (cuBLASLt takes 10-13 us for the same q/k/v product). Here, 10.4 and
 * 9.9 us alone and a batch-1 step 0.1 ms faster (docs/BENCHMARKS.md):
 *   - shared memory holds weights and only the M real token rows of x (gemm.cu's 8-row tile is
 *     7/8 zeros at M = 1), so a CTA keeps 4 stages (32 KB) of weights in flight, all issued at
 *     its start, and the next stage's copy goes out as each one is used. x's rows are read once
 *     into shared memory and each lane takes its B fragment from there (token lane / 4, the
 *     pairs at columns 2 (lane % 4) and 2 (lane % 4) + 8 of each k16 step; zeros for tokens past
 *     M);
 *   - the weight copies are tensor copies issued before the kernel waits for the kernel ahead of
 *     it (launch.cuh's PDL wait): no kernel of a forward pass writes a weight, so they run while
 *     the previous kernel (the norm, the attention combine) finishes;
 *   - the S slices of a tile are the S CTAs of one thread-block cluster, and their partial tiles
 *     are added through distributed shared memory instead of a workspace and a tile counter.
 *
 * The arithmetic is gemm.cu's, step for step: weight row n in row n % 16 of its mma fragment
 * (A loaded by ldmatrix from the same swizzled layout, which the tensor copy writes), token m in
 * column m of the 8-column B fragment, one mma.m16n8k16 per k16 step in increasing k over the
 * slice (with x_lo: the x mma, then the x_lo mma), columns past the slice read as zeros and k16
 * steps wholly past it skipped, and the slice sums added in slice order, ((p0 + p1) + p2) + ...
 * So a row is the same bits here, on gemm.cu's tiles and on its wgmma tiles (test_gemm_gpu
 * compares rows computed alone, which take this form, with the same rows inside larger batches). */
#include <cooperative_groups.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include "cuda_check.h"
#include "gemv.cuh"
#include "launch.cuh"
#include "mma.cuh"
#include "stamps.cuh"
#include "tma.cuh"

namespace cg = cooperative_groups;

RW_STAMPS_UNIT(gv, "gemv")

#define GV_BN 64               /* weight rows a CTA: 4 warps of 16 */
#define GV_THREADS 128
/* 64-column stages in flight at most: 4. Measured on an H200 at M = 1 (rw-bench kernels, us,
 * q/k/v and o_proj): 4 stages 10.4 and 9.9, the whole 512-column slice at once (8) 11.9 and 10.7 */
#define GV_RING 4
#define GV_STAGE (GV_BN * 128) /* one stage: 64 rows of 128 bytes */
/* the launches this form takes: 1 <= M <= GV_M_MAX tokens, 2 <= S <= GV_S_MAX slices (the
 * portable cluster size) */
#define GV_M_MAX 8
#define GV_S_MAX 8
/* Outputs a CTA sums: the tile's M x 64 spread over the S CTAs of its cluster GV_THREADS at a
 * time, so ceil(M 64 / (S GV_THREADS)) GV_THREADS of them, each with S partials; at most
 * 1024 (S 2 and M 8: 2 x 256; S 8: 8 x 128) */
#define GV_RED 1024
static __host__ __device__ constexpr int gv_red_cap(int M, int S) {
    return (M * GV_BN + S * GV_THREADS - 1) / (S * GV_THREADS) * GV_THREADS;
}
/* whether every launch's S runs fit GV_RED (cap grows with M, so M = GV_M_MAX bounds it) */
static constexpr bool gv_red_fits() {
    for (int S = 2; S <= GV_S_MAX; S++)
        if (S * gv_red_cap(GV_M_MAX, S) > GV_RED) return false;
    return true;
}
static_assert(gv_red_fits(), "gemv: the slices' partials past the summing CTA's runs");
/* output e's place in its summing CTA's runs (that CTA: (e / GV_THREADS) % S) */
static __device__ __forceinline__ int gv_red_at(int e, int S) {
    return (e / (S * GV_THREADS)) * GV_THREADS + e % GV_THREADS;
}
/* the most dynamic shared memory a launch takes (the model's slices: 4 stages and 8 tokens' x
 * pair of 512 columns, 50 KB); larger slices of many tokens take gemm.cu's tiles */
#define GV_SMEM_MAX (70 * 1024)

typedef struct gv_args {
    const uint16_t *x, *xlo;
    float *Y;
    int N, K, M, S, span; /* span: columns a slice (the last one ends at K) */
    int slots;            /* ring stages (gv_layout_of; passed in, not recomputed per thread) */
} gv_args;

/* Shared memory of a launch: the stage ring (1024-byte aligned for the swizzle), then x's rows
 * of the slice (and x_lo's), each xcols + 8 elements apart (the 16-byte pad puts the 8 rows a
 * warp reads in different banks). */
typedef struct gv_layout {
    int slots, xcols, xstride, bytes;
} gv_layout;
/* (unused in builds without wgmma, where no launch instantiates the kernel) */
[[maybe_unused]] static __host__ __device__ gv_layout gv_layout_of(int M, int span, bool split) {
    gv_layout l;
    const int nkb = (span + 63) / 64;
    l.xcols = nkb * 64;
    l.xstride = l.xcols + 8;
    const int xbytes = M * l.xstride * 2 * (split ? 2 : 1);
    l.slots = nkb < GV_RING ? nkb : GV_RING;
    l.bytes = RW_WGMMA_SMEM_SLACK + l.slots * GV_STAGE + xbytes;
    return l;
}

template <bool SPLIT>
__global__ void __launch_bounds__(GV_THREADS, 3)
    gemv_kernel(const gv_args g, const __grid_constant__ CUtensorMap tw) {
    extern __shared__ __align__(128) uint8_t smem_raw[];
    uint8_t *const ring = rw_smem_align1024(smem_raw);
    __shared__ __align__(8) uint64_t full[GV_RING];
    /* the partials of the outputs this CTA sums, [slice][output], written by every slice's CTA */
    __shared__ float part[GV_RED];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, gq = lane >> 2, cq = lane & 3;
    const int slice = (int)(blockIdx.x % g.S), n0 = (int)(blockIdx.x / g.S) * GV_BN;
    const int kbeg = slice * g.span, kend = kbeg + g.span < g.K ? kbeg + g.span : g.K;
    const int nkb = (kend - kbeg + 63) / 64, slots = g.slots;
    const gv_layout L = gv_layout_of(g.M, g.span, SPLIT);
    auto issue = [&](int j) { /* stage j of the slice into its ring slot (one thread) */
        uint64_t *bar = &full[j % slots];
        rw_mbar_expect_tx(bar, GV_STAGE);
        rw_tma_load_2d(ring + (j % slots) * GV_STAGE, &tw, bar, kbeg + j * 64, n0);
    };
    if (tid == 0) {
        for (int i = 0; i < slots; i++)
            rw_mbar_init(&full[i], 1);
        rw_mbar_init_fence();
        for (int j = 0; j < nkb && j < slots; j++)
            issue(j);
    }
    /* a CTA writes another's shared memory only once that one has started: each says so here
     * (no ordering asked) and waits for the others' word before its first remote store */
    asm volatile("barrier.cluster.arrive.relaxed.aligned;" ::: "memory");
    /* the weight copies are out; x is the previous kernel's output */
    RW_STAMP(t_entry);
    rw_pdl_begin();
    RW_STAMP(t_wait);

    /* x's M rows of the slice (and x_lo's) into shared memory, 16 bytes a thread, zeros past
     * the slice (what gemm.cu's zero-filled tile holds there) */
    uint16_t *const sx = (uint16_t *)(ring + slots * GV_STAGE);
    const int per_row = L.xcols / 8, nchunk = g.M * per_row;
    for (int c = tid; c < (SPLIT ? 2 : 1) * nchunk; c += GV_THREADS) {
        const int h = c / nchunk, r = c % nchunk, m = r / per_row, k = (r % per_row) * 8;
        const uint16_t *src = (h ? g.xlo : g.x) + (int64_t)m * g.K + kbeg + k;
        const uint4 v = kbeg + k < kend ? __ldg((const uint4 *)src) : make_uint4(0, 0, 0, 0);
        *(uint4 *)(sx + (h * g.M + m) * L.xstride + k) = v;
    }
    __syncthreads(); /* x's rows, and the barriers' initialization, before anyone reads them */

    const bool tok = gq < g.M;
    const uint16_t *xr = sx + (tok ? gq : 0) * L.xstride + 2 * cq;
    const uint16_t *xlr = xr + g.M * L.xstride;
    float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    const int ar = warp * 16 + (lane & 7) + ((lane >> 3) & 1) * 8; /* ldmatrix row of this lane */
    for (int j = 0; j < nkb; j++) {
        rw_mbar_wait(&full[j % slots], (uint32_t)(j / slots) & 1u);
        const uint8_t *sa = ring + (j % slots) * GV_STAGE;
#pragma unroll
        for (int ks = 0; ks < 4; ks++) {
            const int k = j * 64 + ks * 16;
            if (kbeg + k >= kend) break; /* steps past the slice are skipped */
            uint32_t a[4];
            rw_ldsm_x4(a[0], a[1], a[2], a[3], sa + rw_swz128(ar, ks * 2 + (lane >> 4)));
            const uint32_t b0 = tok ? *(const uint32_t *)(xr + k) : 0u;
            const uint32_t b1 = tok ? *(const uint32_t *)(xr + k + 8) : 0u;
            rw_mma_bf16_16816(acc, a, b0, b1);
            if (SPLIT) {
                const uint32_t l0 = tok ? *(const uint32_t *)(xlr + k) : 0u;
                const uint32_t l1 = tok ? *(const uint32_t *)(xlr + k + 8) : 0u;
                rw_mma_bf16_16816(acc, a, l0, l1);
            }
        }
        if (j + slots < nkb) { /* a slice longer than the ring: refill the slot just read */
            __syncthreads();
            if (tid == 0) issue(j + slots);
        }
    }

    /* acc[i]: weight row warp * 16 + gq + 8 (i / 2), token 2 cq + i % 2. Output e = token * 64 +
     * row is summed by the cluster's CTA (e / GV_THREADS) % S, at gv_red_at(e) of the run each
     * slice writes there: every slice stores its partial straight into that CTA's
     * shared memory, so after one cluster barrier the sums read local memory only and no CTA
     * reads another's (which also makes a second barrier before leaving unneeded). Pulling the
     * partials through the cluster instead took 2.0 us from the last slice's end to the
     * kernel's, this 1.5 (globaltimer stamps, medians); on an H100 a b1 x 1k engine step
     * 3.383-3.394 -> 3.353-3.356 ms (docs/BENCHMARKS.md, thirty-fifth session). */
    cg::cluster_group cl = cg::this_cluster();
    const int cap = gv_red_cap(g.M, g.S);
    /* every CTA of the cluster has started */
    asm volatile("barrier.cluster.wait.aligned;" ::: "memory");
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const int m = 2 * cq + (i & 1);
        if (m >= g.M) continue;
        const int e = m * GV_BN + warp * 16 + gq + 8 * (i >> 1);
        const int owner = (e / GV_THREADS) % g.S;
        *cl.map_shared_rank(part + slice * cap + gv_red_at(e, g.S), owner) = acc[i];
    }
    cl.sync(); /* every slice's partials are in the CTAs that sum them */
    /* the M x 64 outputs of the tile, spread over the cluster's CTAs; each adds the S partials
     * in slice order, ((p0 + p1) + p2) + ... */
    for (int e = slice * GV_THREADS + tid; e < g.M * GV_BN; e += g.S * GV_THREADS) {
        const int m = e / GV_BN, n = n0 + e % GV_BN;
        const int at = gv_red_at(e, g.S);
        float v = part[at];
        for (int s = 1; s < g.S; s++)
            v += part[s * cap + at];
        if (n < g.N) g.Y[(int64_t)m * g.N + n] = v;
    }
    RW_STAMP_PUT(gv, 0, blockIdx.x, t_entry, t_wait, 0);
}

rw_status rw_gemv_launch(const uint16_t *W, int64_t N, int64_t K, const uint16_t *x,
                         const uint16_t *x_lo, int64_t M, float *Y, int S,
                         int64_t span, rw_stream s, bool *done, rw_err *err) {
    *done = false;
#if RW_WGMMA
    if (M < 1 || M > GV_M_MAX || S < 2 || S > GV_S_MAX) return RW_OK;
    if (span > 8192) return RW_OK; /* x's rows of a slice in shared memory */
    const gv_layout L = gv_layout_of((int)M, (int)span, x_lo != NULL);
    if (L.bytes > GV_SMEM_MAX) return RW_OK;
    CUtensorMap tw;
    if (!rw_tma_map_bf16(&tw, W, (uint64_t)N, (uint64_t)K, GV_BN)) return RW_OK;
    const gv_args g = {x, x_lo, Y, (int)N, (int)K, (int)M, S, (int)span, L.slots};
    const int64_t ctas = (N + GV_BN - 1) / GV_BN * S;
    auto kern = x_lo ? gemv_kernel<true> : gemv_kernel<false>;
    RW_STAMPS_REGISTER(gv);
    /* the most any launch takes, so captured graphs stay launchable */
    RW_CUDA_CHECK(err, cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                            GV_SMEM_MAX));
    (void)rw_launch_pdl_cluster(kern, dim3((unsigned)ctas), GV_THREADS, (size_t)L.bytes,
                                (cudaStream_t)s, (unsigned)S, g, tw);
    RW_CHECK(RW_LAUNCH_CHECK(s, "gemv", err));
    *done = true;
#else
    (void)W, (void)N, (void)K, (void)x, (void)x_lo, (void)M, (void)Y, (void)S, (void)span, (void)s,
        (void)err;
#endif
    return RW_OK;
}
