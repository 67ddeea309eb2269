/* route.cuh - the MoE routing of one token by one warp, as device code for every kernel that
 * routes: moe's route kernel (rw_moe_route_cuda) and the worker's router, which routes in the
 * CTA that finishes a token group's logits. One function, so both give the same bits.
 *
 * softmax over the E logits (max, exp, sum, divide, in a fixed lane/xor order), then the k
 * largest probabilities, ties to the lower expert id, optionally renormalised by their sum;
 * the reference is rw_moe_route_ref (route.c). E <= 1024 (up to 32 logits per lane in registers),
 * k <= RW_MOE_MAX_TOPK. The logits are read with ld.global.cg: a caller may route logits that
 * other CTAs of its grid wrote (after a fence and a counter), which this SM's L1 must not serve. */
#ifndef RW_MOE_ROUTE_CUH
#define RW_MOE_ROUTE_CUH

#include <stdint.h>

#define RW_MOE_MAX_TOPK 32
#define RW_MOE_MAX_E 1024

/* Whether the routing supports E experts and top-k (the launchers' argument check). */
static inline bool rw_moe_route_supported(int64_t E, int k) {
    return E >= 1 && E <= RW_MOE_MAX_E && k >= 1 && k <= RW_MOE_MAX_TOPK && k <= E;
}

/* Routes the token whose logits are l[0..E); lanes 0..k-1 write ids[j] and wts[j] of pick j,
 * and return ids[j] (the other lanes return -1), for a caller that sorts the picks next.
 * EPL: logits per lane, E <= 32 EPL (rw_moe_route_epl); a smaller EPL only drops entries that are
 * -inf (max) and 0 (sum, exact) for every E it admits, so every EPL gives the same bits. Every
 * lane of the warp calls it. SHARED: l is in shared memory (read plainly, not through L2). */
template <int EPL, bool SHARED = false>
static __device__ __forceinline__ int32_t rw_moe_route_warp(const float *l, int E, int k,
                                                            bool renorm, int32_t *ids, float *wts) {
    const int lane = threadIdx.x & 31;
    float v[EPL];
    float mx = -INFINITY;
#pragma unroll
    for (int i = 0; i < EPL; i++) {
        const int e = i * 32 + lane;
        v[i] = e < E ? (SHARED ? l[e] : __ldcg(l + e)) : -INFINITY;
        mx = fmaxf(mx, v[i]);
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
    float s = 0.0f;
#pragma unroll
    for (int i = 0; i < EPL; i++) {
        const int e = i * 32 + lane;
        v[i] = e < E ? expf(v[i] - mx) : 0.0f;
        s += v[i];
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
        s += __shfl_xor_sync(0xffffffffu, s, o);
#pragma unroll
    for (int i = 0; i < EPL; i++)
        v[i] = i * 32 + lane < E ? v[i] / s : -1.0f;
    /* pick j is kept by lane j (k <= 32): no per-thread array, so no local memory. Each pick
     * is the warp's largest probability, ties to the lower expert id, found with two warp
     * reductions (redux.sync) instead of five rounds of shuffles and compares: the largest key,
     * then the least id among the lanes whose best has that key. The key orders as the float
     * compare does: a probability p >= 0 is its bits + 2 (monotone for non-negative floats, and
     * equal keys are equal floats: p is never -0), a taken or absent entry (-1) is 1, and NaN
     * is 0, which never wins, as NaN never passes the compare. On an H200, same run, a b1
     * forward step 3.281-3.287 -> 3.254-3.271 ms (docs/BENCHMARKS.md, nineteenth session). */
    auto key_of = [](float p) -> unsigned {
        return p >= 0.0f ? __float_as_uint(p) + 2u : p == -1.0f ? 1u : 0u;
    };
    int32_t myid = 0;
    float myw = 0.0f, sum = 0.0f;
    for (int j = 0; j < k; j++) {
        unsigned bk = 0u;
        int be = 0x7fffffff;
#pragma unroll
        for (int i = 0; i < EPL; i++) { /* ascending expert id per lane: '>' keeps the lower id */
            const unsigned ki = key_of(v[i]);
            if (ki > bk) {
                bk = ki;
                be = i * 32 + lane;
            }
        }
        const unsigned wk = __reduce_max_sync(0xffffffffu, bk);
        be = (int)__reduce_min_sync(0xffffffffu, bk == wk ? (unsigned)be : 0x7fffffffu);
        /* no key above 0: every entry NaN, the compare's start value stays (-2, no id) */
        const float bp = wk == 0u ? -2.0f : wk == 1u ? -1.0f : __uint_as_float(wk - 2u);
        if (wk == 0u) be = 0x7fffffff;
#pragma unroll
        for (int i = 0; i < EPL; i++)
            if (i * 32 + lane == be) v[i] = -1.0f; /* taken */
        if (lane == j) {
            myid = be;
            myw = bp;
        }
        sum += bp; /* the same sum, in pick order, in every lane */
    }
    if (lane < k) {
        ids[lane] = myid;
        wts[lane] = renorm ? myw / sum : myw;
    }
    return lane < k ? myid : -1;
}

/* Logits per lane for E experts: the least of 4, 8, 16, 32 that holds them (E <= 1024). */
static inline int rw_moe_route_epl(int E) {
    return E <= 128 ? 4 : E <= 256 ? 8 : E <= 512 ? 16 : 32;
}

#endif
