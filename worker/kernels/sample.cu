/* sample.cu - the sampling kernels (sample.h): row reductions in chunks of RW_K_SAMPLE_CHUNK ids
 * over many CTAs (smp_max_kernel, smp_mass_kernel), then one CTA of 1024 threads per request
 * (sample_kernel): radix selects for top-k / top-p over order-preserving keys, fixed-point masses;
 * reference in sample_ref.c.
 *
 * Why chunks: one CTA per request read the whole row five times over (argmax, normaliser, draw),
 * 144 us for one request of a 151,936-id vocabulary on an H200, as long as 1/30 of the decode step;
 * the chunk passes spread that over the GPU. */
#include <cuda_runtime.h>
#include <limits.h>
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
/* The 32.32 mass of z. The subtraction is rounded on its own (never fused with the product that
 * made z), so the chunk pass and the request's walk compute the same masses. */
__device__ __forceinline__ uint64_t fmass(float z, float zmax) {
    return (uint64_t)((double)expf(__fsub_rn(z, zmax)) * 4294967296.0);
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

/* Exclusive prefix sum of v over the threads of the block in thread order, and the total in
 * *tot; sh holds 33 values. Integer sums: exact, whatever the tree. */
__device__ uint64_t block_excl_scan_u64(uint64_t v, uint64_t *sh, uint64_t *tot) {
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    uint64_t x = v;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        const uint64_t y = __shfl_up_sync(0xffffffffu, x, o);
        if (lane >= o) x += y;
    }
    __syncthreads();
    if (lane == 31) sh[w] = x;
    __syncthreads();
    if (w == 0) {
        uint64_t t = lane < nw ? sh[lane] : 0;
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
            const uint64_t y = __shfl_up_sync(0xffffffffu, t, o);
            if (lane >= o) t += y;
        }
        if (lane < nw) sh[lane] = t; /* inclusive over warps */
        if (lane == 31) sh[32] = t;
    }
    __syncthreads();
    *tot = sh[32];
    return (w ? sh[w - 1] : 0) + x - v;
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

/* The chunk passes: CTA (c, r) reduces ids [c * RW_K_SAMPLE_CHUNK, ...) of request r's row;
 * thread t takes ids t, t + SMP_CHUNK_THREADS, ... of the chunk, SMP_PER of them, and loads them
 * all before it reduces any: the loads of a chunk are then in flight together, where a loop that
 * loaded each id before using it waited for them one after another. */
#define SMP_CHUNK_THREADS 256
#define SMP_PER (RW_K_SAMPLE_CHUNK / SMP_CHUNK_THREADS)
static_assert(SMP_PER * SMP_CHUNK_THREADS == RW_K_SAMPLE_CHUNK, "whole chunks a thread");
/* The id of this thread's j-th value of the chunk starting at c0. */
__device__ __forceinline__ int64_t smp_id(int64_t c0, int j) {
    return c0 + threadIdx.x + (int64_t)j * SMP_CHUNK_THREADS;
}
/* This thread's ids of chunk [c0, c1) of row l, in its order; returns how many of v are ids
 * (v[j] for j >= the count lie past c1: 0, not used). Every pass tests j against that count. */
__device__ __forceinline__ int smp_load(const float *l, int64_t c0, int64_t c1,
                                        float (&v)[SMP_PER]) {
    const int nv = (int)((c1 - c0 - threadIdx.x + SMP_CHUNK_THREADS - 1) / SMP_CHUNK_THREADS);
#pragma unroll
    for (int j = 0; j < SMP_PER; j++)
        v[j] = j < nv ? l[smp_id(c0, j)] : 0.0f;
    return nv;
}

/* true when request p keeps every id (no top-k or top-p limit): its kept masses are chunk sums */
__device__ __forceinline__ bool smp_plain(const rw_k_sample_param &p, int64_t V) {
    return !(p.top_k > 0 && p.top_k < V) && !(p.top_p < 1.0f);
}

/* The chunk's argmax (ties to the lower id). */
__global__ void __launch_bounds__(SMP_CHUNK_THREADS)
    smp_max_kernel(const float *logits, int64_t V, const rw_k_sample_param *params,
                   rw_k_sample_part *parts) {
    rw_pdl_begin();
    __shared__ amax sha[33];
    const int64_t c0 = (int64_t)blockIdx.x * RW_K_SAMPLE_CHUNK;
    const int64_t c1 = min(V, c0 + RW_K_SAMPLE_CHUNK);
    const float *l = logits + (int64_t)params[blockIdx.y].row * V;
    float v[SMP_PER];
    const int nv = smp_load(l, c0, c1, v);
    amax a = {0.0f, -1};
#pragma unroll
    for (int j = 0; j < SMP_PER; j++)
        if (j < nv) a = amax_pick(a, amax{v[j], (int32_t)smp_id(c0, j)});
    a = block_amax(a, sha);
    if (threadIdx.x == 0) {
        rw_k_sample_part *pt = parts + (int64_t)blockIdx.y * gridDim.x + blockIdx.x;
        pt->v = a.v;
        pt->i = a.i;
    }
}

/* The row's argmax from its chunks' (the same id as one pass over the row: the largest value,
 * ties to the lower id). */
__device__ __forceinline__ amax smp_row_max(const rw_k_sample_part *pr, int nc) {
    amax a = {0.0f, -1};
    for (int c = 0; c < nc; c++)
        a = amax_pick(a, amax{pr[c].v, pr[c].i});
    return a;
}

/* A row's chunk parts that a CTA reads over and over (every thread walks them in chunk order)
 * are first copied into its shared memory, one part a thread, up to SMP_STAGE of them (a
 * vocabulary of SMP_STAGE chunks); each thread's walk then waits on no memory round trips. The
 * same parts in the same order: the same results. */
#define SMP_STAGE 256
/* The CTA's copy of pr[0 .. nc) in sh, or pr itself when nc > SMP_STAGE (every thread; nc is
 * uniform over the CTA). */
__device__ __forceinline__ const rw_k_sample_part *smp_stage(const rw_k_sample_part *pr, int nc,
                                                             rw_k_sample_part *sh) {
    if (nc > SMP_STAGE) return pr;
    for (int c = threadIdx.x; c < nc; c += blockDim.x)
        sh[c] = pr[c];
    __syncthreads();
    return sh;
}

/* The chunk's sums under the row's maximum: exp(l - max), and for a request without limits that
 * draws or reports processed logprobs, its 32.32 masses / exp(z - zmax). */
__global__ void __launch_bounds__(SMP_CHUNK_THREADS)
    smp_mass_kernel(const float *logits, int64_t V, const rw_k_sample_param *params,
                    rw_k_sample_part *parts) {
    rw_pdl_begin();
    __shared__ float shf[33];
    __shared__ uint64_t shu[33];
    __shared__ rw_k_sample_part sp[SMP_STAGE];
    const rw_k_sample_param p = params[blockIdx.y];
    const int64_t c0 = (int64_t)blockIdx.x * RW_K_SAMPLE_CHUNK;
    const int64_t c1 = min(V, c0 + RW_K_SAMPLE_CHUNK);
    const float *l = logits + (int64_t)p.row * V;
    rw_k_sample_part *pr = parts + (int64_t)blockIdx.y * gridDim.x;
    /* the chunk once, its loads under the read of the row's maximum; the three sums below walk
     * the registers in the order the loops over memory walked the ids */
    float v[SMP_PER];
    const int nv = smp_load(l, c0, c1, v);
    const float mx = smp_row_max(smp_stage(pr, (int)gridDim.x, sp), (int)gridDim.x).v;
    float se = 0.0f;
#pragma unroll
    for (int j = 0; j < SMP_PER; j++)
        if (j < nv) se += expf(v[j] - mx);
    se = block_sum(se, shf);
    const float inv_t = rw_sample_inv_temperature(p.temperature, p.top_k, mx);
    const bool kept = inv_t != 0.0f && smp_plain(p, V);
    const float zmax = mx * inv_t;
    uint64_t w = 0;
    float sk = 0.0f;
    if (kept && p.forced < 0) { /* uniform over the CTA */
#pragma unroll
        for (int j = 0; j < SMP_PER; j++)
            if (j < nv) w += fmass(__fmul_rn(v[j], inv_t), zmax);
        w = block_sum_u64(w, shu);
    }
    if (kept && p.mode == 1) {
#pragma unroll
        for (int j = 0; j < SMP_PER; j++)
            if (j < nv) sk += expf(__fsub_rn(v[j] * inv_t, zmax));
        sk = block_sum(sk, shf);
    }
    if (threadIdx.x == 0) {
        pr[blockIdx.x].se = se;
        pr[blockIdx.x].w = w;
        pr[blockIdx.x].sk = sk;
    }
}

/* Per request: the token (drawn, greedy or given), its logprob and the top-n, from the chunk
 * sums and, where a limit needs it, passes over the whole row. */
__global__ void __launch_bounds__(SMP_THREADS)
    sample_kernel(const float *logits, int64_t V, const rw_k_sample_param *params,
                  rw_k_sample_out *outs, const rw_k_sample_part *parts, int nc) {
    rw_pdl_begin();
    __shared__ float shf[33];
    __shared__ amax sha[33];
    __shared__ uint64_t shu[33];
    __shared__ unsigned long long hist[256];
    __shared__ rw_k_sample_part sp[SMP_STAGE];
    const rw_k_sample_param p = params[blockIdx.x];
    const float *l = logits + (int64_t)p.row * V;
    rw_k_sample_out *o = outs + blockIdx.x;
    const rw_k_sample_part *pr = smp_stage(parts + (int64_t)blockIdx.x * nc, nc, sp);

    const amax best = smp_row_max(pr, nc);
    const float mx = best.v;
    float se = 0.0f;
    for (int c = 0; c < nc; c++)
        se += pr[c].se;
    const float lse = mx + logf(se);

    /* forced >= 0 scores a given token: no draw. The kept set (thr) is needed for a draw and for
     * processed logprobs. Every branch below is uniform over the CTA (p is). inv_t 0: greedy,
     * also for a temperature too small to invert (sample.h). */
    int32_t tok = p.forced >= 0 ? p.forced : best.i;
    const float inv_ts = rw_sample_inv_temperature(p.temperature, p.top_k, mx);
    const bool greedy = inv_ts == 0.0f;
    const bool processed = p.mode == 1;
    const bool plain = smp_plain(p, V); /* the chunk passes summed its kept masses */
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
        /* draw: the first kept id whose running mass (ids in order) passes the target. Without
         * limits the chunk sums locate the chunk and only that chunk is read. */
        int64_t r0 = 0, r1 = V;
        uint64_t before = 0, target = 0;
        const uint64_t u = (uint64_t)(rw_sample_uniform_dev(p.seed, p.position) * 16777216.0f);
        auto target_of = [&](uint64_t tw) {
            return (tw >> 24) * u + (((tw & 0xffffffull) * u) >> 24);
        };
        if (plain) {
            uint64_t W = 0;
            for (int c = 0; c < nc; c++)
                W += pr[c].w;
            target = target_of(W);
            int c = 0;
            while (c < nc - 1 && before + pr[c].w <= target)
                before += pr[c++].w;
            r0 = (int64_t)c * RW_K_SAMPLE_CHUNK;
            r1 = min(V, r0 + RW_K_SAMPLE_CHUNK);
        }
        /* contiguous id ranges per thread, exclusive scan of their kept masses */
        const int64_t per = (r1 - r0 + blockDim.x - 1) / blockDim.x;
        const int64_t i0 = min(r1, r0 + threadIdx.x * per), i1 = min(r1, i0 + per);
        uint64_t mine = 0;
        for (int64_t i = i0; i < i1; i++) {
            const float z = l[i] * inv_t;
            if (okey(z) >= thr) mine += fmass(z, zmax);
        }
        uint64_t total;
        const uint64_t start = before + block_excl_scan_u64(mine, shu, &total);
        if (!plain) target = target_of(total);
        __shared__ int32_t pick;
        if (threadIdx.x == 0) pick = -1;
        __syncthreads();
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
        if (plain) {
            for (int c = 0; c < nc; c++)
                sk += pr[c].sk;
        } else {
            for (int64_t i = threadIdx.x; i < V; i += blockDim.x) {
                const float z = l[i] * inv_t;
                if (okey(z) >= thr) sk += expf(z - zmax);
            }
            sk = block_sum(sk, shf);
        }
        lkept = logf(sk);
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
                                 const rw_k_sample_param *p, rw_k_sample_out *out, void *ws,
                                 size_t ws_bytes, rw_stream s, rw_err *err) {
    if (n <= 0) return RW_OK;
    const int64_t nc = (V + RW_K_SAMPLE_CHUNK - 1) / RW_K_SAMPLE_CHUNK;
    if (V < 1 || n > INT_MAX)
        RW_FAIL(err, RW_E_UNSUPPORTED, "sample: V = %lld, %lld requests (at most %d)", (long long)V,
                (long long)n, INT_MAX);
    if (!ws || ws_bytes < rw_k_sample_ws_bytes(n, V) || (uintptr_t)ws % 16)
        RW_FAIL(err, RW_E_INVALID_ARG,
                "sample: %lld requests over V = %lld need a 16-byte aligned workspace of %zu "
                "bytes (have %p, %zu bytes)",
                (long long)n, (long long)V, rw_k_sample_ws_bytes(n, V), ws, ws_bytes);
    rw_k_sample_part *parts = (rw_k_sample_part *)ws;
    cudaStream_t st = (cudaStream_t)s;
    /* chunks on x, requests on y: at most 65535 requests a launch (a grid's y limit), so larger
     * batches take several, each on its requests' rows of params and parts */
    for (int64_t r0 = 0; r0 < n; r0 += 65535) {
        const dim3 chunks((unsigned)nc, (unsigned)(n - r0 < 65535 ? n - r0 : 65535));
        rw_k_sample_part *pr = parts + r0 * nc;
        (void)rw_launch_pdl(smp_max_kernel, chunks, SMP_CHUNK_THREADS, 0, st, logits, V, p + r0,
                            pr);
        RW_CHECK(LAUNCH_CHECK(s, "sample (chunk maxima)"));
        (void)rw_launch_pdl(smp_mass_kernel, chunks, SMP_CHUNK_THREADS, 0, st, logits, V, p + r0,
                            pr);
        RW_CHECK(LAUNCH_CHECK(s, "sample (chunk sums)"));
    }
    (void)rw_launch_pdl(sample_kernel, dim3((unsigned)n), SMP_THREADS, 0, st, logits, V, p, out,
                        (const rw_k_sample_part *)parts, (int)nc);
    return LAUNCH_CHECK(s, "sample");
}
