/* sample.cu - the sampling kernel (sample.h): one CTA of 1024 threads per request, radix selects
 * for top-k / top-p over order-preserving keys, fixed-point masses; reference in sample_ref.c. */
#include <cuda_runtime.h>
#include <stdint.h>

#include "device.cuh"
#include "launch.cuh"
#include "sample.h"

/* Sampling: one CTA of 1024 threads per row. */
#define SMP_THREADS 1024

__device__ __forceinline__ uint32_t okey(float f) { /* order-preserving float -> uint32 */
    const uint32_t b = __float_as_uint(f);
    return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}
__device__ __forceinline__ uint64_t fmass(float z, float zmax) {
    return (uint64_t)((double)expf(z - zmax) * 4294967296.0);
}

/* argmax (ties to the lower id) over ids passing `ok` */
struct amax {
    float v;
    int32_t i;
};
__device__ __forceinline__ amax amax_pick(amax a, amax b) {
    if (b.i < 0) return a;
    if (a.i < 0) return b;
    if (b.v > a.v || (b.v == a.v && b.i < a.i)) return b;
    return a;
}
__device__ amax block_amax(amax a, amax *sh) {
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        amax b;
        b.v = __shfl_xor_sync(0xffffffffu, a.v, o);
        b.i = __shfl_xor_sync(0xffffffffu, a.i, o);
        a = amax_pick(a, b);
    }
    __syncthreads();
    if (lane == 0) sh[w] = a;
    __syncthreads();
    if (w == 0) {
        a = lane < (int)(blockDim.x >> 5) ? sh[lane] : amax{0.0f, -1};
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
            amax b;
            b.v = __shfl_xor_sync(0xffffffffu, a.v, o);
            b.i = __shfl_xor_sync(0xffffffffu, a.i, o);
            a = amax_pick(a, b);
        }
        if (lane == 0) sh[32] = a;
    }
    __syncthreads();
    return sh[32];
}
__device__ uint64_t block_sum_u64(uint64_t v, uint64_t *sh) {
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    __syncthreads();
    if (lane == 0) sh[w] = v;
    __syncthreads();
    if (w == 0) {
        v = lane < (int)(blockDim.x >> 5) ? sh[lane] : 0;
#pragma unroll
        for (int o = 16; o > 0; o >>= 1)
            v += __shfl_xor_sync(0xffffffffu, v, o);
        if (lane == 0) sh[32] = v;
    }
    __syncthreads();
    return sh[32];
}

/* Largest key v (over ids with key >= lo_key) such that the count (by_mass false) or the mass
 * (by_mass true) of {key >= v} reaches `target`: 4 passes of 8-bit digits from the top. Counts
 * and masses are integers, so the result does not depend on the order of the atomics. */
__device__ uint32_t radix_select(const float *l, int64_t V, float inv_t, float zmax,
                                 uint32_t lo_key, bool by_mass, uint64_t target,
                                 unsigned long long *hist) {
    uint32_t prefix = 0, pmask = 0;
    uint64_t above = 0; /* count / mass of keys strictly above the current prefix range */
    for (int shift = 24; shift >= 0; shift -= 8) {
        for (int b = threadIdx.x; b < 256; b += blockDim.x)
            hist[b] = 0;
        __syncthreads();
        for (int64_t i = threadIdx.x; i < V; i += blockDim.x) {
            const float z = l[i] * inv_t;
            const uint32_t kk = okey(z);
            if (kk < lo_key || (kk & pmask) != prefix) continue;
            atomicAdd(&hist[(kk >> shift) & 0xffu],
                      by_mass ? (unsigned long long)fmass(z, zmax) : 1ull);
        }
        __syncthreads();
        __shared__ uint32_t sel;
        __shared__ uint64_t sel_above;
        if (threadIdx.x == 0) {
            uint64_t acc = above;
            int b = 255;
            for (; b > 0; b--) {
                if (acc + hist[b] >= target) break;
                acc += hist[b];
            }
            sel = (uint32_t)b;
            sel_above = acc;
        }
        __syncthreads();
        prefix |= sel << shift;
        pmask |= 0xffu << shift;
        above = sel_above;
        __syncthreads();
    }
    return prefix;
}

__global__ void __launch_bounds__(SMP_THREADS)
    sample_kernel(const float *logits, int64_t V, const rw_k_sample_param *params,
                  rw_k_sample_out *outs) {
    rw_pdl_begin();
    __shared__ float shf[33];
    __shared__ amax sha[33];
    __shared__ uint64_t shu[33];
    __shared__ unsigned long long hist[256];
    __shared__ uint64_t scan[SMP_THREADS];
    const rw_k_sample_param p = params[blockIdx.x];
    const float *l = logits + (int64_t)p.row * V;
    rw_k_sample_out *o = outs + blockIdx.x;

    amax a = {0.0f, -1};
    for (int64_t i = threadIdx.x; i < V; i += blockDim.x)
        a = amax_pick(a, amax{l[i], (int32_t)i});
    const amax best = block_amax(a, sha);
    const float mx = best.v;
    float se = 0.0f;
    for (int64_t i = threadIdx.x; i < V; i += blockDim.x)
        se += expf(l[i] - mx);
    const float lse = mx + logf(block_sum(se, shf));

    /* forced >= 0 scores a given token: no draw. The kept set (thr) is needed for a draw and for
     * processed logprobs. Every branch below is uniform over the CTA (p is). inv_t 0: greedy,
     * also for a temperature too small to invert (sample.h). */
    int32_t tok = p.forced >= 0 ? p.forced : best.i;
    const float inv_ts = rw_sample_inv_temperature(p.temperature, p.top_k, mx);
    const bool greedy = inv_ts == 0.0f;
    const bool processed = p.mode == 1;
    float inv_t = 1.0f, zmax = 0.0f, lkept = 0.0f;
    uint32_t thr = 0; /* keep ids with key >= thr */
    if (!greedy && (p.forced < 0 || processed)) {
        inv_t = inv_ts;
        zmax = mx * inv_t;
        if (p.top_k > 0 && p.top_k < V)
            thr = radix_select(l, V, inv_t, zmax, 0, false, (uint64_t)p.top_k, hist);
        if (p.top_p < 1.0f) {
            uint64_t tot = 0;
            for (int64_t i = threadIdx.x; i < V; i += blockDim.x) {
                const float z = l[i] * inv_t;
                if (okey(z) >= thr) tot += fmass(z, zmax);
            }
            tot = block_sum_u64(tot, shu);
            const uint64_t target = (uint64_t)((double)p.top_p * (double)tot);
            const uint32_t tp = radix_select(l, V, inv_t, zmax, thr, true, target, hist);
            thr = tp > thr ? tp : thr;
        }
    }
    if (!greedy && p.forced < 0) {
        /* draw: contiguous id ranges per thread, exclusive scan of their kept masses */
        const int64_t per = (V + blockDim.x - 1) / blockDim.x;
        const int64_t i0 = threadIdx.x * per, i1 = min(V, i0 + per);
        uint64_t mine = 0;
        for (int64_t i = i0; i < i1; i++) {
            const float z = l[i] * inv_t;
            if (okey(z) >= thr) mine += fmass(z, zmax);
        }
        scan[threadIdx.x] = mine;
        __syncthreads();
        if (threadIdx.x == 0) { /* 1024 entries: a sequential exclusive scan is fine here */
            uint64_t c = 0;
            for (int i = 0; i < (int)blockDim.x; i++) {
                const uint64_t v = scan[i];
                scan[i] = c;
                c += v;
            }
            shu[32] = c;
        }
        __syncthreads();
        const uint64_t W = shu[32];
        const uint64_t u = (uint64_t)(rw_sample_uniform_dev(p.seed, p.position) * 16777216.0f);
        const uint64_t target = (W >> 24) * u + (((W & 0xffffffull) * u) >> 24);
        __shared__ int32_t pick;
        if (threadIdx.x == 0) pick = -1;
        __syncthreads();
        const uint64_t start = scan[threadIdx.x];
        if (mine > 0 && start <= target && target < start + mine) {
            uint64_t c = start;
            for (int64_t i = i0; i < i1; i++) {
                const float z = l[i] * inv_t;
                if (okey(z) < thr) continue;
                const uint64_t w = fmass(z, zmax);
                if (w == 0) continue;
                c += w;
                if (c > target) {
                    pick = (int32_t)i;
                    break;
                }
            }
        }
        __syncthreads();
        if (pick >= 0) tok = pick;
    }
    if (processed && !greedy) {
        /* log of the kept set's mass, an fp32 fixed-tree sum (the same bits in any batch) */
        float sk = 0.0f;
        for (int64_t i = threadIdx.x; i < V; i += blockDim.x) {
            const float z = l[i] * inv_t;
            if (okey(z) >= thr) sk += expf(z - zmax);
        }
        lkept = logf(block_sum(sk, shf));
    }
    /* the logprob of id in the requested mode (processed: under the distribution drawn from) */
    auto lp_of = [&](int32_t id) -> float {
        if (!processed) return l[id] - lse;
        if (greedy) return id == best.i ? 0.0f : -INFINITY;
        const float z = l[id] * inv_t;
        return okey(z) >= thr ? (z - zmax) - lkept : -INFINITY;
    };
    /* top-n logprobs: n rounds of argmax below the previous pick */
    float pv = INFINITY;
    int32_t pid = -1;
    const int tn = p.top_n < 20 ? p.top_n : 20;
    for (int jn = 0; jn < tn; jn++) {
        amax b = {0.0f, -1};
        for (int64_t i = threadIdx.x; i < V; i += blockDim.x) {
            const float x = l[i];
            if (x > pv || (x == pv && i <= pid)) continue;
            b = amax_pick(b, amax{x, (int32_t)i});
        }
        b = block_amax(b, sha);
        if (b.i < 0) b.i = 0;
        if (threadIdx.x == 0) {
            o->top_ids[jn] = b.i;
            o->top_lps[jn] = lp_of(b.i);
        }
        pv = l[b.i];
        pid = b.i;
    }
    if (threadIdx.x == 0) {
        o->token = tok;
        o->logprob = lp_of(tok);
    }
}

extern "C" rw_status rw_k_sample(const float *logits, int64_t n, int64_t V,
                                 const rw_k_sample_param *p, rw_k_sample_out *out, rw_stream s,
                                 rw_err *err) {
    if (n <= 0) return RW_OK;
    (void)rw_launch_pdl(sample_kernel, dim3((unsigned)n), SMP_THREADS, 0, (cudaStream_t)s, logits,
                        V, p, out);
    return LAUNCH_CHECK(s, "sample");
}
