/* router.cu - the router logits kernel, alone or with the routing (router.h); reference in
 * router_ref.c and moe's rw_moe_route_ref. */
#include <cuda_runtime.h>
#include <stdint.h>

#include "device.cuh"
#include "launch.cuh"
#include "route.cuh"
#include "router.h"

/* Router logits: y [n, E] = x [n, H] . w[E, H]^T in fp32. A warp computes RT_EW experts for the
 * RT_TT tokens of its CTA: lane l accumulates columns [c + 8l, c + 8l + 8) of every 256-column
 * chunk c in order (one 16-byte load of 8 bf16 weights per expert, two of x per token), then a
 * fixed xor tree adds the lanes. The summation order of an output depends on H only, so a token's
 * logits are the same bits in any batch; a decode batch is spread over E / (RT_WARPS * RT_EW)
 * CTAs per RT_TT tokens instead of one CTA walking H in 64 dependent steps. */
#define RT_WARPS 8
#define RT_EW 2
#define RT_TT RW_K_ROUTER_GROUP
static_assert(RT_WARPS >= RT_TT, "router: the last CTA routes one token per warp");

/* ROUTE: the CTA that completes a token group's logits (the last of its gridDim.y CTAs to bump
 * the group's counter, which it then resets) routes the group's tokens, one per warp
 * (route.cuh): the same bits as rw_moe_route_cuda on the same logits, without a second launch
 * and its wait at batch 1. Token groups (TT = RT_TT) run two CTAs per SM: 128 registers hold the
 * loads of a chunk for all TT tokens; a lone token (TT = 1) four, in 64. E <= 256 fits with at
 * most a word spilled. */
template <bool ROUTE, int EPL, int TT>
__global__ void __launch_bounds__(RT_WARPS * 32, TT == 1 ? 4 : 2)
    router_kernel(const float *__restrict__ x, const uint16_t *__restrict__ w, int64_t n, int64_t E,
                  int64_t H, float *__restrict__ y, int k, bool renorm, int32_t *__restrict__ ids,
                  float *__restrict__ wts, int32_t *__restrict__ cnt) {
    rw_pdl_begin();
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int64_t t0 = (int64_t)blockIdx.x * TT;
    const int64_t e0 = ((int64_t)blockIdx.y * RT_WARPS + warp) * RT_EW;
    const int nt = (int)(n - t0 < TT ? n - t0 : TT);
    if (e0 < E) { /* whole warps */
        float acc[RT_EW][TT];
#pragma unroll
        for (int a = 0; a < RT_EW; a++)
#pragma unroll
            for (int b = 0; b < TT; b++)
                acc[a][b] = 0.0f;
        /* one token: unrolled so a warp has several chunks' loads in flight (H = 2048 is 8
         * chunks); a group already has the loads of its TT tokens in flight */
#pragma unroll(TT == 1 ? 4 : 1)
        for (int64_t c = (int64_t)lane * 8; c < H; c += 256) {
            float wv[RT_EW][8];
#pragma unroll
            for (int a = 0; a < RT_EW; a++) {
                uint4 u = make_uint4(0, 0, 0, 0);
                if (e0 + a < E) u = __ldg((const uint4 *)(w + (e0 + a) * H + c));
                const uint32_t uw[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
                for (int i = 0; i < 4; i++) {
                    wv[a][2 * i] = __uint_as_float(uw[i] << 16);
                    wv[a][2 * i + 1] = __uint_as_float(uw[i] & 0xffff0000u);
                }
            }
#pragma unroll
            for (int b = 0; b < TT; b++) {
                /* a predicated load, not a break at nt: with the break, each token's loads waited
                 * for the previous token's FMAs, a memory round trip per token and chunk (23 us a
                 * layer for a 256-token step, ncu on an H200). The sums of the missing tokens
                 * (zeros) are never stored. */
                float4 p0 = make_float4(0.0f, 0.0f, 0.0f, 0.0f), p1 = p0;
                if (b < nt) {
                    p0 = __ldg((const float4 *)(x + (t0 + b) * H + c));
                    p1 = __ldg((const float4 *)(x + (t0 + b) * H + c + 4));
                }
                const float xv[8] = {p0.x, p0.y, p0.z, p0.w, p1.x, p1.y, p1.z, p1.w};
#pragma unroll
                for (int a = 0; a < RT_EW; a++) {
                    float sum = acc[a][b];
#pragma unroll
                    for (int i = 0; i < 8; i++)
                        sum = fmaf(xv[i], wv[a][i], sum);
                    acc[a][b] = sum;
                }
            }
        }
#pragma unroll
        for (int a = 0; a < RT_EW; a++)
#pragma unroll
            for (int b = 0; b < TT; b++) {
                float v = acc[a][b];
#pragma unroll
                for (int o = 16; o > 0; o >>= 1)
                    v += __shfl_xor_sync(0xffffffffu, v, o);
                if (lane == 0 && b < nt && e0 + a < E) y[(t0 + b) * E + e0 + a] = v;
            }
    }
    if (!ROUTE) return;
    __shared__ int last;
    __threadfence(); /* this CTA's logits before its count */
    __syncthreads();
    if (threadIdx.x == 0) {
        last = atomicAdd(&cnt[blockIdx.x], 1) == (int)gridDim.y - 1;
        if (last) cnt[blockIdx.x] = 0; /* every CTA of the group has counted */
    }
    __syncthreads();
    if (!last) return;
    __threadfence(); /* the other CTAs' logits after their counts */
    if (warp < nt)
        rw_moe_route_warp<EPL>(y + (t0 + warp) * E, (int)E, k, renorm, ids + (t0 + warp) * k,
                               wts + (t0 + warp) * k);
}

static rw_status router_check(const float *x, const uint16_t *w, int64_t H, rw_err *err) {
    if (H % 8 || ((uintptr_t)x | (uintptr_t)w) % 16)
        RW_FAIL(err, RW_E_UNSUPPORTED, "router: H = %lld (needs %% 8) or unaligned inputs",
                (long long)H);
    return RW_OK;
}

/* Tokens a CTA takes for n tokens: a one-token step takes CTAs of one token (TT = 1), which keep
 * four chunks' loads in flight in 64 registers; larger batches groups of RT_TT tokens (one group
 * per counter either way). */
static int router_tt(int64_t n) {
    return n == 1 ? 1 : RT_TT;
}
static dim3 router_grid(int64_t n, int64_t E) {
    const int tt = router_tt(n);
    return dim3((unsigned)((n + tt - 1) / tt),
                (unsigned)((E + RT_WARPS * RT_EW - 1) / (RT_WARPS * RT_EW)));
}
/* The routing instance for EPL logits a lane (rw_moe_route_epl) and TT tokens a CTA. */
template <int TT> static auto router_topk_kernel(int epl) -> decltype(&router_kernel<true, 4, TT>) {
    return epl == 4    ? router_kernel<true, 4, TT>
           : epl == 8  ? router_kernel<true, 8, TT>
           : epl == 16 ? router_kernel<true, 16, TT>
                       : router_kernel<true, 32, TT>;
}

extern "C" rw_status rw_k_router(const float *x, const uint16_t *w, int64_t n, int64_t E, int64_t H,
                                 float *y, rw_stream s, rw_err *err) {
    if (n <= 0) return RW_OK;
    RW_CHECK(router_check(x, w, H, err));
    (void)rw_launch_pdl(router_tt(n) == 1 ? router_kernel<false, 4, 1>
                                          : router_kernel<false, 4, RT_TT>,
                        router_grid(n, E), RT_WARPS * 32, 0, (cudaStream_t)s, x, w, n, E, H, y, 0,
                        false, (int32_t *)NULL, (float *)NULL, (int32_t *)NULL);
    return LAUNCH_CHECK(s, "router");
}

extern "C" rw_status rw_k_router_topk(const float *x, const uint16_t *w, int64_t n, int64_t E,
                                      int64_t H, int k, bool renorm, float *y, int32_t *ids,
                                      float *wts, int32_t *cnt, int64_t ncnt, rw_stream s,
                                      rw_err *err) {
    if (n <= 0) return RW_OK;
    RW_CHECK(router_check(x, w, H, err));
    if (!rw_moe_route_supported(E, k))
        RW_FAIL(err, RW_E_UNSUPPORTED, "router: E = %lld (1..%d), k = %d (1..%d)", (long long)E,
                RW_MOE_MAX_E, k, RW_MOE_MAX_TOPK);
    if (!cnt || ncnt < rw_k_router_counters(n))
        RW_FAIL(err, RW_E_INVALID_ARG, "router: %lld counters for %lld tokens (needs %lld)",
                (long long)(cnt ? ncnt : 0), (long long)n, (long long)rw_k_router_counters(n));
    const int epl = rw_moe_route_epl((int)E);
    auto kern = router_tt(n) == 1 ? router_topk_kernel<1>(epl) : router_topk_kernel<RT_TT>(epl);
    (void)rw_launch_pdl(kern, router_grid(n, E), RT_WARPS * 32, 0, (cudaStream_t)s, x, w, n, E, H,
                        y, k, renorm, ids, wts, cnt);
    return LAUNCH_CHECK(s, "router");
}
