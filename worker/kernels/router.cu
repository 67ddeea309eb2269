/* router.cu - the router logits kernel, alone or with the routing (router.h); reference in
 * router_ref.c and moe's rw_moe_route_ref. */
#include <cooperative_groups.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include "cuda_check.h"
#include "device.cuh"
#include "launch.cuh"
#include "mma.cuh"
#include "norm_row.cuh"
#include "route.cuh"
#include "router.h"
#include "sort.cuh"
#include "stamps.cuh"

/* Router logits on tensor cores: y [n, E] = x [n, H] fp32 . w [E, H]^T, bf16 weights.
 *
 * The weights are the A operand of mma.m16n8k16 (16 experts a tile) and the tokens the B operand
 * (8 a tile). x is fp32, so each value is cut into three bf16 parts, x = hi + mid + lo exactly
 * (each part the top 8 significant bits of what the previous ones left), and every product of a
 * part with a bf16 weight is exact in fp32: the logits lose only the accumulation's rounding, as
 * the fp32 dot product they replace did. hi goes to one accumulator and mid + lo to a second, so
 * the small parts are not added into the large sum term by term.
 *
 * A CTA's RT_KS warps take fixed slices of H (RT_CHUNK columns a chunk, H / RT_CHUNK / RT_KS
 * chunks a warp), each slice in chunk order, then one thread a logit adds the warps' sums in warp
 * order. Every step depends on H only, never on n or on where a token sits in its tile (each mma
 * output is its own dot product), so a token's logits are the same bits in any batch and with any
 * tile shape; the tile shape (MT expert tiles by NT token tiles a warp) is picked by n for reuse.
 *
 * In a chunk, lane (g = lane / 4, q = lane % 4) reads 8 consecutive columns 8q..8q+7 of its rows
 * (one 16-byte load of weights a row, two of x a token) and feeds them as the fragment columns
 * 2q, 2q+1, 2q+8, 2q+9 of two k16 steps: a permutation of H that A and B share (both index k by
 * lane % 4), so the sum is the same dot product with wide loads instead of 4-byte ones. */
namespace cg = cooperative_groups;

/* the stamps build (stamps.cuh): every CTA as "router", mid = its logits written; the CTA that
 * routes as "route" instead, its end after the routing and the sort */
RW_STAMPS_UNIT(rt, "router", "route")

#define RT_KS 8     /* warps a CTA: slices of H */
#define RT_CHUNK 32 /* columns of H a chunk: two k16 steps */

/* x = hi + mid + lo for two fp32 values, packed as bf16 pairs (a in the low half): truncation
 * keeps the sign and leaves an exact remainder with at most 16, then 8, significant bits (exact
 * for every normal x; activations never come near the fp32 subnormals). */
struct rt_parts {
    uint32_t hi, mid, lo;
};
static __device__ __forceinline__ rt_parts rt_split(float a, float b) {
    const uint32_t ha = __float_as_uint(a) & 0xffff0000u, hb = __float_as_uint(b) & 0xffff0000u;
    const float ra = a - __uint_as_float(ha), rb = b - __uint_as_float(hb);
    const uint32_t ma = __float_as_uint(ra) & 0xffff0000u, mb = __float_as_uint(rb) & 0xffff0000u;
    const uint32_t la = __float_as_uint(ra - __uint_as_float(ma));
    const uint32_t lb = __float_as_uint(rb - __uint_as_float(mb));
    return {(ha >> 16) | hb, (ma >> 16) | mb, (la >> 16) | (lb & 0xffff0000u)};
}

/* A CTA: NT token tiles (8 NT tokens) by MT expert tiles of which ER rows are used (16, or 8 for
 * the one-group steps: MT ER experts), BATCH chunks of each warp's slice loaded at a time.
 * ROUTE: the CTA that completes a token group's logits (the last of its gridDim.y CTAs to bump
 * the group's counter, which it then resets) routes the group's tokens, one per warp at a time
 * (route.cuh): the same bits as rw_moe_route_cuda on the same logits, without a second launch and
 * its wait at batch 1. */
/* SORT (ROUTE, one token group): that CTA then sorts the group's assignments by expert
 * (sort.cuh) into sd's places, the expert layer's sort without its launch. */
struct rt_sort {
    int32_t *off, *ntiles, *perm, *inv;
    int2 *tiles;
    int tn;
};
/* NORM (with SORT): the input is not x but the post-attention norm of nm.x + nm.add, computed by
 * every CTA into its shared memory with norm_row.cuh, the arithmetic of norm_rope.cu's
 * add_rmsnorm (RT_KS * 32 == NORM_THREADS threads, RT_NORM_PER elements each), so the same bits
 * without the norm's launch and its wait at batch 1. The sums go to shared memory too; the
 * routing CTA writes them to nm.x and the normed rows as bf16 pairs to nm.hi / nm.lo (what the
 * expert layer reads) after every CTA has counted (or, in the cluster form, passed the
 * cluster's barrier), that is after every CTA has read nm.x: the
 * update in place races no read. */
struct rt_norm {
    float *x;
    const float *add;
    const uint16_t *w;
    float eps;
    uint16_t *hi, *lo;
};
#define RT_NORM_PER 8
/* a token's row in the shared sums and normed rows: padded by 4 floats so the 8 token rows of a
 * fragment's loads fall in different banks */
__host__ __device__ constexpr int64_t rt_norm_stride(int64_t H) {
    return H + 4;
}
/* CL (with SORT, at most RT_CL_E experts): the group's CTAs are one thread-block cluster along x,
 * 16 experts each. Each writes its logits into the shared memory of the cluster's first CTA as
 * well as to y, and after the cluster's barrier that CTA routes from its shared memory: no fence,
 * no counter, no read back through L2 (globaltimer stamps of a b1 step on an H200: 0.9-1.2 us
 * from the logits to the routing CTA's start, then the routing's first loads; docs/BENCHMARKS.md,
 * nineteenth session). The logits and everything after them are the same bits. Measured with
 * the one-token sort (moe/sort.cuh) and the metadata read before the attention's wait, same run
 * on an H200: b1 step 3.210-3.218 -> 3.090-3.118 ms (docs/BENCHMARKS.md, twentieth session). */
#define RT_CL_E 128 /* 8 CTAs of 16 experts: the portable cluster size */

/* Part p of np of the NORM form's sums (to nm.x) and normed rows (to nm.hi / nm.lo) for the nt
 * tokens from t0, a float4 of a row in turn, from this CTA's shared memory; every CTA of the
 * group has read nm.x before any calls it. */
static __device__ __forceinline__ void rt_norm_out(const rt_norm &nm, const float *xsum,
                                                   const float *xs, int nt, int64_t t0, int64_t H,
                                                   int p, int np) {
    const int64_t HS = rt_norm_stride(H);
    for (int t = 0; t < nt; t++)
        for (int64_t i = 4 * ((int64_t)threadIdx.x * np + p); i < H; i += 4 * RT_KS * 32 * np) {
            const int64_t g = (t0 + t) * H + i;
            *(float4 *)(nm.x + g) = *(const float4 *)(xsum + t * HS + i);
#pragma unroll
            for (int c = 0; c < 4; c++)
                rw_k_store_split(xs[t * HS + i + c], nm.hi, nm.lo, g + c);
        }
}
template <bool ROUTE, int EPL, int MT, int NT, int BATCH, int ER = 16, bool SORT = false,
          bool NORM = false, bool CL = false>
__global__ void __launch_bounds__(RT_KS * 32, BATCH *(MT + NT) > 8 ? 1 : 2)
    router_kernel(const float *__restrict__ x, const uint16_t *__restrict__ w, int64_t n, int64_t E,
                  int64_t H, float *__restrict__ y, int k, bool renorm, int32_t *__restrict__ ids,
                  float *__restrict__ wts, int32_t *__restrict__ cnt, rt_sort sd, rt_norm nm) {
    static_assert(!NORM || (SORT && RT_KS * 32 == NORM_THREADS), "the norm runs with the sort");
    static_assert(!CL || (SORT && MT * ER == 16 && NT == 1),
                  "the cluster form: one group, 16 experts a CTA");
    __shared__ float red[RT_KS][MT * 16][NT * 8 + 1];
    __shared__ int last, sorted1;
    __shared__ int32_t swc[SORT ? SORT_WC : 1], seoff[SORT ? 1024 : 1];
    __shared__ float nsh[NORM ? 33 : 1];
    extern __shared__ float4 rt_dyn[]; /* NORM: sums [nt][HS], then normed rows [nt][HS] */
    __shared__ float lg[CL ? 8 * RT_CL_E : 1]; /* CL: the group's logits [token][expert] */
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, q = lane & 3;
    const int64_t t0 = CL ? 0 : (int64_t)blockIdx.x * NT * 8;
    const int64_t e0 = (int64_t)(CL ? blockIdx.x : blockIdx.y) * MT * ER;
    const int64_t nch = (H + RT_CHUNK - 1) / RT_CHUNK, cpw = (nch + RT_KS - 1) / RT_KS;
    const int64_t cbeg = warp * cpw, cend = cbeg + cpw < nch ? cbeg + cpw : nch;
    float ah[MT][NT][4], al[MT][NT][4];
#pragma unroll
    for (int m = 0; m < MT; m++)
#pragma unroll
        for (int t = 0; t < NT; t++)
#pragma unroll
            for (int i = 0; i < 4; i++)
                ah[m][t][i] = al[m][t][i] = 0.0f;
    /* BATCH chunks' loads in flight: the weights of chunks cb.. (issued a batch ahead, the first
     * batch before the wait for the previous kernel: no kernel of a forward pass writes them,
     * launch.cuh), then x's */
    uint4 wv[BATCH][MT][2];
    auto load_w = [&](int64_t cb) {
#pragma unroll
        for (int b = 0; b < BATCH; b++) {
            const int64_t col = (cb + b) * RT_CHUNK + 8 * q;
            const bool in = cb + b < cend && col < H;
#pragma unroll
            for (int m = 0; m < MT; m++)
#pragma unroll
                for (int r = 0; r < 2; r++) {
                    const int rr = m * 16 + r * 8 + g; /* ER = 8: rows 8..15 stay zero */
                    const int64_t e = e0 + rr;
                    wv[b][m][r] = in && rr < MT * ER && e < E
                                      ? __ldg((const uint4 *)(w + e * H + col))
                                      : make_uint4(0, 0, 0, 0);
                }
        }
    };
    load_w(cbeg);
    float nwv[NORM ? RT_NORM_PER : 1];
    if constexpr (NORM) norm_weights<RT_NORM_PER>(nwv, nm.w, H);
    RW_STAMP(t_entry);
    rw_pdl_begin();
    RW_STAMP(t_wait);
    const int nt = (int)(n - t0 < NT * 8 ? n - t0 : NT * 8);
    const int64_t HS = rt_norm_stride(H);
    float *const xsum = (float *)rt_dyn, *const xs = xsum + nt * HS;
    if constexpr (NORM) {
        /* every token's sum x + add into shared memory (no division in the index: a 64-bit
         * divide a float4 cost more than the norm's launch), then each row's norm (norm_row's
         * reduction is the CTA's) */
        for (int t = 0; t < nt; t++)
#pragma unroll 2
            for (int64_t i = 4 * threadIdx.x; i < H; i += 4 * RT_KS * 32) {
                const int64_t g = (t0 + t) * H + i;
                const float4 a = *(const float4 *)(nm.x + g), b = *(const float4 *)(nm.add + g);
                *(float4 *)(xsum + t * HS + i) =
                    make_float4(a.x + b.x, a.y + b.y, a.z + b.z, a.w + b.w);
            }
        __syncthreads();
        for (int t = 0; t < nt; t++) {
            float v[RT_NORM_PER];
#pragma unroll
            for (int j = 0; j < RT_NORM_PER; j++) {
                const int64_t i = threadIdx.x + (int64_t)j * NORM_THREADS;
                v[j] = i < H ? xsum[t * HS + i] : 0.0f;
            }
            norm_row<RT_NORM_PER>(v, nwv, H, nm.eps, nsh,
                                  [&](int64_t i, float o) { xs[t * HS + i] = o; });
        }
        __syncthreads();
    }
    for (int64_t cb = cbeg; cb < cend; cb += BATCH) {
        float4 xv[BATCH][NT][2];
#pragma unroll
        for (int b = 0; b < BATCH; b++) {
            const int64_t col = (cb + b) * RT_CHUNK + 8 * q;
            const bool in = cb + b < cend && col < H;
#pragma unroll
            for (int t = 0; t < NT; t++) {
                const int64_t tok = t0 + t * 8 + g;
                const float4 z = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
                if constexpr (NORM) {
                    const float *r = xs + (tok - t0) * HS + col;
                    xv[b][t][0] = in && tok < n ? *(const float4 *)r : z;
                    xv[b][t][1] = in && tok < n ? *(const float4 *)(r + 4) : z;
                } else {
                    xv[b][t][0] = in && tok < n ? __ldg((const float4 *)(x + tok * H + col)) : z;
                    xv[b][t][1] =
                        in && tok < n ? __ldg((const float4 *)(x + tok * H + col + 4)) : z;
                }
            }
        }
#pragma unroll
        for (int b = 0; b < BATCH; b++)
#pragma unroll
            for (int s = 0; s < 2; s++) {
                rt_parts b0[NT], b1[NT];
#pragma unroll
                for (int t = 0; t < NT; t++) {
                    b0[t] = rt_split(xv[b][t][s].x, xv[b][t][s].y);
                    b1[t] = rt_split(xv[b][t][s].z, xv[b][t][s].w);
                }
#pragma unroll
                for (int m = 0; m < MT; m++) {
                    const uint32_t *w0 = (const uint32_t *)&wv[b][m][0];
                    const uint32_t *w1 = (const uint32_t *)&wv[b][m][1];
                    const uint32_t a[4] = {w0[2 * s], w1[2 * s], w0[2 * s + 1], w1[2 * s + 1]};
#pragma unroll
                    for (int t = 0; t < NT; t++) {
                        rw_mma_bf16_16816(ah[m][t], a, b0[t].hi, b1[t].hi);
                        rw_mma_bf16_16816(al[m][t], a, b0[t].mid, b1[t].mid);
                        rw_mma_bf16_16816(al[m][t], a, b0[t].lo, b1[t].lo);
                    }
                }
            }
        if (cb + BATCH < cend) load_w(cb + BATCH);
    }
#pragma unroll
    for (int m = 0; m < MT; m++)
#pragma unroll
        for (int t = 0; t < NT; t++)
#pragma unroll
            for (int i = 0; i < 4; i++)
                red[warp][m * 16 + g + 8 * (i >> 1)][t * 8 + 2 * q + (i & 1)] =
                    ah[m][t][i] + al[m][t][i];
    __syncthreads();
    for (int o = threadIdx.x; o < MT * 16 * NT * 8; o += RT_KS * 32) {
        const int r = o % (MT * 16), c = o / (MT * 16);
        float v = red[0][r][c];
#pragma unroll
        for (int j = 1; j < RT_KS; j++)
            v += red[j][r][c];
        if (c < nt && r < MT * ER && e0 + r < E) {
            y[(t0 + c) * E + e0 + r] = v;
            if constexpr (CL) *cg::this_cluster().map_shared_rank(lg + c * E + e0 + r, 0) = v;
        }
    }
    RW_STAMP(t_logits);
    if constexpr (CL) {
        cg::cluster_group cl = cg::this_cluster();
        cl.sync(); /* every CTA's logits are in the first CTA's lg, and every CTA has read nm.x */
        /* the sums and normed rows out from the other CTAs (each norms the rows in its shared
         * memory with the same code, so the same bytes) while the first one routes: about 0.6 us
         * of stores off the routing CTA's path a layer. On an H100, same run, b1 x 1k engine
         * steps 3.299-3.310 -> 3.278-3.293 ms, b1 x 4k 3.604-3.611 -> 3.583-3.596
         * (docs/BENCHMARKS.md, thirty-sixth session). */
        const int nb = (int)cl.num_blocks(), rk = (int)cl.block_rank();
        if constexpr (NORM)
            if (nb == 1 || rk > 0)
                rt_norm_out(nm, xsum, xs, nt, t0, H, nb > 1 ? rk - 1 : 0, nb > 1 ? nb - 1 : 1);
        if (rk != 0) {
            RW_STAMP_PUT(rt, 0, RW_STAMP_CTA, t_entry, t_wait, t_logits);
            return;
        }
    }
    if (!ROUTE) {
        RW_STAMP_PUT(rt, 0, RW_STAMP_CTA, t_entry, t_wait, t_logits);
        return;
    }
    if constexpr (!CL) {
        __threadfence(); /* this CTA's logits before its count */
        __syncthreads();
        if (threadIdx.x == 0) {
            last = atomicAdd(&cnt[blockIdx.x], 1) == (int)gridDim.y - 1;
            if (last) cnt[blockIdx.x] = 0; /* every CTA of the group has counted */
        }
        __syncthreads();
        if (!last) {
            RW_STAMP_PUT(rt, 0, RW_STAMP_CTA, t_entry, t_wait, t_logits);
            return;
        }
        __threadfence(); /* the other CTAs' logits after their counts */
    }
    if constexpr (NORM && !CL) /* every CTA has read nm.x (before its count): the sums and
                                * rows out */
        rt_norm_out(nm, xsum, xs, nt, t0, H, 0, 1);
    int32_t pick = -1; /* a one-token step: warp 0's lane j holds pick j */
    for (int t = warp; t < nt; t += RT_KS)
        pick = CL ? rw_moe_route_warp<EPL, true>(lg + t * E, (int)E, k, renorm, ids + t * k,
                                                 wts + t * k)
                  : rw_moe_route_warp<EPL>(y + (t0 + t) * E, (int)E, k, renorm, ids + (t0 + t) * k,
                                           wts + (t0 + t) * k);
    if constexpr (SORT) {
        /* one token: its distinct picks sorted from warp 0's registers (sort.cuh), no round
         * trip through the ids and no barriers of the general sort */
        if (n == 1) {
            if (warp == 0) {
                const bool ok = rw_moe_sort_one_token_warp(pick, k, (int)E, sd.off, sd.tiles,
                                                           sd.ntiles, sd.perm, sd.inv, swc);
                if (threadIdx.x == 0) sorted1 = ok;
            }
            __syncthreads();
            if (sorted1) {
                RW_STAMP_PUT(rt, 1, RW_STAMP_CTA, t_entry, t_wait, t_logits);
                return;
            }
        }
        __syncthreads(); /* every warp's ids, written above, before the sort reads them */
        rw_moe_sort_cta(ids, n * k, (int)E, sd.tn, sd.off, sd.tiles, sd.ntiles, sd.perm, sd.inv,
                        swc, seoff);
    }
    RW_STAMP_PUT(rt, 1, RW_STAMP_CTA, t_entry, t_wait, t_logits);
}

static rw_status router_check(const float *x, const uint16_t *w, int64_t H, rw_err *err) {
    if (H % 8 || ((uintptr_t)x | (uintptr_t)w) % 16)
        RW_FAIL(err, RW_E_UNSUPPORTED, "router: H = %lld (needs %% 8) or unaligned inputs",
                (long long)H);
    return RW_OK;
}

/* Tile shapes by batch: one expert tile by one token tile a warp for decode batches (more CTAs
 * to spread the loads over), two by two for prefill (half the re-reads of x and w). A warp has
 * BATCH chunks' loads in flight, 64 registers of them with two CTAs an SM. A step of at most one
 * token group is bound by the latency of the weights' loads: its CTAs take 8 experts each (the
 * tile's other 8 rows zero), twice the CTAs to spread E x H over, one an SM, and 8 chunks at once
 * (H = 2048: a warp's whole slice, one memory round trip instead of two). The shape changes which
 * CTA computes a logit and when its loads are issued, not its bits. */
struct rt_shape {
    int nt, mt, er, batch; /* router_kernel's NT, MT, ER and BATCH */
};
static rt_shape router_shape(int64_t n) {
    return n <= 8 ? rt_shape{1, 1, 8, 8} : n <= 256 ? rt_shape{1, 1, 16, 4} : rt_shape{2, 2, 16, 2};
}
/* the instance of shape sh (one of router_shape's three); with the sort (SORT, and the norm with
 * it), only the first: the sort runs for steps of one token group (NULL for the others) */
template <bool ROUTE, int EPL, bool SORT = false, bool NORM = false>
static auto router_pick(rt_shape sh) -> decltype(&router_kernel<ROUTE, EPL, 1, 1, 4>) {
    if (sh.er == 8) return router_kernel<ROUTE, EPL, 1, 1, 8, 8, SORT, NORM>;
    if constexpr (SORT)
        return NULL;
    else
        return sh.mt == 1 ? router_kernel<ROUTE, EPL, 1, 1, 4> : router_kernel<ROUTE, EPL, 2, 2, 2>;
}
static dim3 router_grid(rt_shape sh, int64_t n, int64_t E) {
    const int64_t tokens = 8 * sh.nt, experts = (int64_t)sh.mt * sh.er;
    return dim3((unsigned)((n + tokens - 1) / tokens), (unsigned)((E + experts - 1) / experts));
}
/* The routing instance for EPL logits a lane (rw_moe_route_epl), with or without the sort (and
 * the norm). */
template <bool SORT, bool NORM = false>
static auto router_topk_kernel(int epl, rt_shape sh) -> decltype(&router_kernel<true, 4, 1, 1, 4>) {
    return epl == 4    ? router_pick<true, 4, SORT, NORM>(sh)
           : epl == 8  ? router_pick<true, 8, SORT, NORM>(sh)
           : epl == 16 ? router_pick<true, 16, SORT, NORM>(sh)
                       : router_pick<true, 32, SORT, NORM>(sh);
}
/* the NORM instances' shared sums and normed rows: one token group of the widest row */
static constexpr size_t RT_NORM_SMEM =
    2 * RW_K_ROUTER_GROUP * (size_t)rt_norm_stride(RW_K_ROUTER_NORM_MAX_H) * sizeof(float);
static_assert(RW_K_ROUTER_NORM_MAX_H <= RT_NORM_PER * NORM_THREADS, "a row in registers");

extern "C" rw_status rw_k_router(const float *x, const uint16_t *w, int64_t n, int64_t E, int64_t H,
                                 float *y, rw_stream s, rw_err *err) {
    if (n <= 0) return RW_OK;
    RW_CHECK(router_check(x, w, H, err));
    const rt_shape sh = router_shape(n);
    RW_STAMPS_REGISTER(rt);
    (void)rw_launch_pdl(router_pick<false, 4>(sh), router_grid(sh, n, E), RT_KS * 32, 0,
                        (cudaStream_t)s, x, w, n, E, H, y, 0, false, (int32_t *)NULL, (float *)NULL,
                        (int32_t *)NULL, rt_sort{}, rt_norm{});
    return LAUNCH_CHECK(s, "router");
}

static rw_status router_topk(const float *x, const uint16_t *w, int64_t n, int64_t E, int64_t H,
                             int k, bool renorm, float *y, int32_t *ids, float *wts, int32_t *cnt,
                             int64_t ncnt, const rw_moe_sort_dest *sort, const rt_norm *nm,
                             rw_stream s, rw_err *err) {
    if (n <= 0) return RW_OK;
    RW_CHECK(router_check(nm ? nm->x : x, w, H, err));
    if (!rw_moe_route_supported(E, k))
        RW_FAIL(err, RW_E_UNSUPPORTED, "router: E = %lld (1..%d), k = %d (1..%d)", (long long)E,
                RW_MOE_MAX_E, k, RW_MOE_MAX_TOPK);
    rt_sort sd{};
    if (sort) {
        if (n > RW_K_ROUTER_GROUP || !sort->off || !sort->tiles || !sort->ntiles || !sort->perm ||
            !sort->inv || sort->tn < 1)
            RW_FAIL(err, RW_E_INVALID_ARG,
                    "router: the sort runs for steps of at most %d tokens (n = %lld), into five "
                    "places and tiles of at least one row",
                    RW_K_ROUTER_GROUP, (long long)n);
        sd = rt_sort{sort->off, sort->ntiles, sort->perm, sort->inv, (int2 *)sort->tiles, sort->tn};
    }
    if (!cnt || ncnt < rw_k_router_counters(n))
        RW_FAIL(err, RW_E_INVALID_ARG, "router: %lld counters for %lld tokens (needs %lld)",
                (long long)(cnt ? ncnt : 0), (long long)n, (long long)rw_k_router_counters(n));
    const rt_shape sh = router_shape(n);
    const int epl = rw_moe_route_epl((int)E);
    /* a sorting step of at most RT_CL_E experts: the cluster form, 16 experts a CTA (E <= 128:
     * 4 logits a lane in the routing) */
    const bool clf = sort && E <= RT_CL_E;
    auto kern = !sort ? router_topk_kernel<false>(epl, sh)
                : clf ? (nm ? router_kernel<true, 4, 1, 1, 8, 16, true, true, true>
                            : router_kernel<true, 4, 1, 1, 8, 16, true, false, true>)
                : nm  ? router_topk_kernel<true, true>(epl, sh)
                      : router_topk_kernel<true>(epl, sh);
    const dim3 grid = clf ? dim3((unsigned)((E + 15) / 16)) : router_grid(sh, n, E);
    /* (n <= RW_K_ROUTER_GROUP: one CTA row of n tokens) */
    const size_t smem = nm ? 2 * (size_t)n * (size_t)rt_norm_stride(H) * sizeof(float) : 0;
    if (nm) /* the instance's fixed need, not this launch's: a captured graph stays launchable */
        RW_CUDA_CHECK(err, cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                (int)RT_NORM_SMEM));
    RW_STAMPS_REGISTER(rt);
    (void)rw_launch_pdl_cluster(kern, grid, RT_KS * 32, smem, (cudaStream_t)s, clf ? grid.x : 1u, x,
                                w, n, E, H, y, k, renorm, ids, wts, cnt, sd, nm ? *nm : rt_norm{});
    return LAUNCH_CHECK(s, "router");
}

extern "C" rw_status rw_k_router_topk(const float *x, const uint16_t *w, int64_t n, int64_t E,
                                      int64_t H, int k, bool renorm, float *y, int32_t *ids,
                                      float *wts, int32_t *cnt, int64_t ncnt, rw_stream s,
                                      rw_err *err) {
    return router_topk(x, w, n, E, H, k, renorm, y, ids, wts, cnt, ncnt, NULL, NULL, s, err);
}

extern "C" rw_status rw_k_router_topk_sort(const float *x, const uint16_t *w, int64_t n, int64_t E,
                                           int64_t H, int k, bool renorm, float *y, int32_t *ids,
                                           float *wts, int32_t *cnt, int64_t ncnt,
                                           const rw_moe_sort_dest *sort, rw_stream s, rw_err *err) {
    if (!sort) RW_FAIL(err, RW_E_INVALID_ARG, "router: no places for the sort");
    return router_topk(x, w, n, E, H, k, renorm, y, ids, wts, cnt, ncnt, sort, NULL, s, err);
}

extern "C" rw_status
rw_k_add_rmsnorm_router_topk_sort(float *x, const float *add, const uint16_t *nw, float eps,
                                  uint16_t *out_hi, uint16_t *out_lo, const uint16_t *w, int64_t n,
                                  int64_t E, int64_t H, int k, bool renorm, float *y, int32_t *ids,
                                  float *wts, int32_t *cnt, int64_t ncnt,
                                  const rw_moe_sort_dest *sort, rw_stream s, rw_err *err) {
    if (!sort) RW_FAIL(err, RW_E_INVALID_ARG, "router: no places for the sort");
    if (!x || !add || !nw || !out_hi)
        RW_FAIL(err, RW_E_INVALID_ARG,
                "router: the norm needs x, the added rows, its weights and "
                "a bf16 output");
    if (!rw_k_router_norm_fits(H) || ((uintptr_t)add % 16))
        RW_FAIL(err, RW_E_UNSUPPORTED,
                "router: the norm in the router takes rows of at most %d (H = %lld, a multiple of "
                "4, 16-byte aligned)",
                RW_K_ROUTER_NORM_MAX_H, (long long)H);
    const rt_norm nm{x, add, nw, eps, out_hi, out_lo};
    return router_topk(NULL, w, n, E, H, k, renorm, y, ids, wts, cnt, ncnt, sort, &nm, s, err);
}
