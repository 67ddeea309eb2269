/* norm_rope.cu - RMSNorm fused with the residual add, and the per-head q/k norm + RoPE + paged KV
 * write (norm_rope.h); references in norm_rope_ref.c. */
#include <cuda_runtime.h>
#include <stdint.h>

#include "device.cuh"
#include "launch.cuh"
#include "norm_rope.h"
#include "norm_row.cuh"
#include "stamps.cuh"

RW_STAMPS_UNIT(nr, "norm", "cnorm", "rope")

/* A normed row's element i of row t: the bf16 pair, and the fp32 value where wanted. */
static __device__ __forceinline__ void norm_put(int64_t t, int64_t H, uint16_t *out_hi,
                                                uint16_t *out_lo, float *out_f32, int64_t i,
                                                float o) {
    rw_k_store_split(o, out_hi, out_lo, t * H + i);
    if (out_f32) out_f32[t * H + i] = o;
}

template <int PER>
__global__ void add_rmsnorm_kernel(float *x, const float *y, const uint16_t *w, int64_t H,
                                   float eps, uint16_t *out_hi, uint16_t *out_lo, float *out_f32,
                                   const int32_t *rows) {
    float v[PER], yv[PER], wv[PER];
    norm_weights<PER>(wv, w, H);
    RW_STAMP(t_entry);
    rw_pdl_begin();
    RW_STAMP(t_wait);
    __shared__ float sh[33];
    const int64_t t = blockIdx.x;
    const int64_t src = rows ? rows[t] : t;
    float *xt = x + src * H;
#pragma unroll
    for (int j = 0; j < PER; j++) {
        const int64_t i = threadIdx.x + (int64_t)j * NORM_THREADS;
        v[j] = i < H ? xt[i] : 0.0f;
        yv[j] = y && i < H ? y[src * H + i] : 0.0f;
    }
    if (y)
#pragma unroll
        for (int j = 0; j < PER; j++) {
            const int64_t i = threadIdx.x + (int64_t)j * NORM_THREADS;
            if (i < H) {
                v[j] += yv[j];
                xt[i] = v[j];
            }
        }
    norm_row<PER>(v, wv, H, eps, sh,
                  [&](int64_t i, float o) { norm_put(t, H, out_hi, out_lo, out_f32, i, o); });
    RW_STAMP_PUT(nr, 0, blockIdx.x, t_entry, t_wait, 0);
}

/* The combine of the experts' rows into x, then the norm: every slot's row of y is loaded before
 * the first fmaf (a loop that loaded a slot's row and then summed it waited out one memory round
 * trip per slot: 10.2 us for a one-token step on an H200, against 6.7 us for the combine and the
 * norm apart), and each element's sum is the combine's (fmaf over the slots in order from 0, then
 * one add to x). KMAX: the slots a CTA keeps, k <= KMAX. */
template <int PER, int KMAX>
__global__ void combine_rmsnorm_kernel(float *__restrict__ x, const float *__restrict__ y,
                                       const int32_t *__restrict__ inv,
                                       const float *__restrict__ wts, int k,
                                       const uint16_t *__restrict__ w, int64_t H, float eps,
                                       uint16_t *out_hi, uint16_t *out_lo, float *out_f32) {
    float v[PER], wv[PER], yv[KMAX][PER];
    norm_weights<PER>(wv, w, H);
    __shared__ float sh[33];
    __shared__ int32_t rows[KMAX];
    __shared__ float ws[KMAX];
    const int64_t t = blockIdx.x;
    /* the token's rows and weights before the PDL wait, as in moe's combine: the sort and the
     * router wrote them two or more kernels back (launch.cuh), read through L2 */
    if (threadIdx.x < KMAX) {
        rows[threadIdx.x] = threadIdx.x < k ? __ldcg(inv + t * k + threadIdx.x) : -1;
        ws[threadIdx.x] = threadIdx.x < k ? __ldcg(wts + t * k + threadIdx.x) : 0.0f;
    }
    RW_STAMP(t_entry);
    rw_pdl_begin();
    RW_STAMP(t_wait);
    __syncthreads();
    float *xt = x + t * H;
#pragma unroll
    for (int j = 0; j < PER; j++) {
        const int64_t i = threadIdx.x + (int64_t)j * NORM_THREADS;
        v[j] = i < H ? xt[i] : 0.0f;
    }
#pragma unroll
    for (int q = 0; q < KMAX; q++)
#pragma unroll
        for (int j = 0; j < PER; j++) {
            const int64_t i = threadIdx.x + (int64_t)j * NORM_THREADS;
            yv[q][j] = rows[q] >= 0 && i < H ? y[(int64_t)rows[q] * H + i] : 0.0f;
        }
#pragma unroll
    for (int j = 0; j < PER; j++) {
        float acc = 0.0f;
#pragma unroll
        for (int q = 0; q < KMAX; q++)
            if (rows[q] >= 0) acc = fmaf(ws[q], yv[q][j], acc);
        if (threadIdx.x + (int64_t)j * NORM_THREADS < H) {
            v[j] += acc;
            xt[threadIdx.x + (int64_t)j * NORM_THREADS] = v[j];
        }
    }
    norm_row<PER>(v, wv, H, eps, sh,
                  [&](int64_t i, float o) { norm_put(t, H, out_hi, out_lo, out_f32, i, o); });
    RW_STAMP_PUT(nr, 1, blockIdx.x, t_entry, t_wait, 0);
}

/* Both norms: every row, or the rows `rows` (out_f32 NULL then). */
static rw_status norm_launch(float *x, const float *y, const uint16_t *w, int64_t n, int64_t H,
                             float eps, uint16_t *out_hi, uint16_t *out_lo, float *out_f32,
                             const int32_t *rows, rw_stream s, const char *what, rw_err *err) {
    if (n <= 0) return RW_OK;
    if (H > NORM_THREADS * NORM_MAXPER)
        RW_FAIL(err, RW_E_UNSUPPORTED, "rmsnorm: H = %lld > %d", (long long)H,
                NORM_THREADS * NORM_MAXPER);
    auto kern = H <= NORM_THREADS * 8    ? add_rmsnorm_kernel<8>
                : H <= NORM_THREADS * 16 ? add_rmsnorm_kernel<16>
                                         : add_rmsnorm_kernel<NORM_MAXPER>;
    RW_STAMPS_REGISTER(nr);
    (void)rw_launch_pdl(kern, dim3((unsigned)n), NORM_THREADS, 0, (cudaStream_t)s, x, y, w, H, eps,
                        out_hi, out_lo, out_f32, rows);
    return LAUNCH_CHECK(s, what);
}

extern "C" rw_status rw_k_add_rmsnorm(float *x, const float *y, const uint16_t *w, int64_t n,
                                      int64_t H, float eps, uint16_t *out_hi, uint16_t *out_lo,
                                      float *out_f32, rw_stream s, rw_err *err) {
    return norm_launch(x, y, w, n, H, eps, out_hi, out_lo, out_f32, NULL, s, "add_rmsnorm", err);
}

extern "C" rw_status rw_k_combine_rmsnorm(float *x, const float *y, const int32_t *inv,
                                          const float *wts, int k, const uint16_t *w, int64_t n,
                                          int64_t H, float eps, uint16_t *out_hi,
                                          uint16_t *out_lo, float *out_f32, rw_stream s,
                                          rw_err *err) {
    if (n <= 0) return RW_OK;
    static_assert(RW_K_COMBINE_MAX_H % NORM_THREADS == 0, "combine_rmsnorm: whole rows a CTA");
    if (H > RW_K_COMBINE_MAX_H || k < 1 || k > RW_K_COMBINE_MAX_K)
        RW_FAIL(err, RW_E_UNSUPPORTED, "combine_rmsnorm: H = %lld (at most %d), k = %d (1..%d)",
                (long long)H, RW_K_COMBINE_MAX_H, k, RW_K_COMBINE_MAX_K);
    RW_STAMPS_REGISTER(nr);
    (void)rw_launch_pdl(
        combine_rmsnorm_kernel<RW_K_COMBINE_MAX_H / NORM_THREADS, RW_K_COMBINE_MAX_K>,
        dim3((unsigned)n), NORM_THREADS, 0, (cudaStream_t)s, x, y, inv, wts, k, w, H, eps, out_hi,
        out_lo, out_f32);
    return LAUNCH_CHECK(s, "combine_rmsnorm");
}

extern "C" rw_status rw_k_rmsnorm_rows(float *x, const float *y, const int32_t *rows, int64_t n,
                                       const uint16_t *w, int64_t H, float eps, uint16_t *out_hi,
                                       uint16_t *out_lo, rw_stream s, rw_err *err) {
    return norm_launch(x, y, w, n, H, eps, out_hi, out_lo, NULL, rows, s, "rmsnorm_rows", err);
}

/* ------------------------------------------------------------------------------------------ */
/* One warp per (token, head), q heads then k heads of a token in consecutive warps: every head
 * of a decode batch runs at once. The head goes through shared memory so any even hd <= 1024
 * works. The outputs never alias the inputs (__restrict__): without that the compiler kept each
 * element's loads behind the previous element's stores, a memory round trip per 32 elements. */
#define ROPE_WARPS 8
#define ROPE_PRE 4                      /* elements a lane rotates, prepared before the PDL wait */
#define ROPE_PRE_HD (2 * 32 * ROPE_PRE) /* the widest head they cover: 256 */

__global__ void __launch_bounds__(ROPE_WARPS * 32)
    qk_rope_kv_kernel(const float *__restrict__ q, const float *__restrict__ k,
                      const float *__restrict__ v, int64_t ldq, int64_t ldkv,
                      const uint16_t *__restrict__ qn, const uint16_t *__restrict__ kn,
                      const int32_t *__restrict__ pos, const int32_t *__restrict__ slot, int64_t n,
                      int nh, int nkv, int hd, int bs, const float *__restrict__ inv_freq,
                      float eps, float *__restrict__ q_out, uint16_t *__restrict__ kcache,
                      uint16_t *__restrict__ vcache, uint16_t *__restrict__ kcache_lo,
                      uint16_t *__restrict__ vcache_lo) {
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    const int nhk = nh + nkv;
    const int64_t gw = (int64_t)blockIdx.x * ROPE_WARPS + w;
    const int h = (int)(gw % nhk);
    const uint16_t *nwt = h < nh ? qn : kn; /* the head's norm weights */
    /* a head wider than ROPE_PRE_HD: its norm weights and the rotation frequencies into L1
     * before the PDL wait (launch.cuh: no forward pass writes them), 128-byte lines. Narrower
     * heads load their lanes' values before the wait below, and prefetching them as well only
     * cost: on an H200, same run, a b256 step 25.89-25.92 -> 25.56-25.66 ms and an 8 x 1k
     * prefill 241.5-241.8 -> 233.5-236.0 ms without it (docs/BENCHMARKS.md, twenty-first
     * session). */
    if (hd > ROPE_PRE_HD) {
        for (int i = lane * 64; i < hd; i += 32 * 64)
            asm volatile("prefetch.global.L1 [%0];" ::"l"(nwt + i));
        for (int i = lane * 32; i < hd / 2; i += 32 * 32)
            asm volatile("prefetch.global.L1 [%0];" ::"l"(inv_freq + i));
    }
    /* the token's position and slot, which the host uploads before the forward pass
     * (launch.cuh), and for heads of up to ROPE_PRE_HD the rotation and the norm weights of
     * the lane's elements, before the wait too: after it only the head's own values remain */
    const bool in = gw < n * nhk;
    const int64_t t = in ? gw / nhk : 0;
    const int32_t p = in ? pos[t] : 0;
    const int32_t sl = in ? slot[t] : -1;
    const int half = hd / 2;
    const bool pre = hd <= ROPE_PRE_HD;
    float psn[ROPE_PRE], pcs[ROPE_PRE], pwa[ROPE_PRE], pwb[ROPE_PRE];
#pragma unroll
    for (int j = 0; j < ROPE_PRE; j++) {
        const int i = lane + 32 * j;
        psn[j] = pcs[j] = pwa[j] = pwb[j] = 0.0f;
        if (in && pre && i < half) {
            sincosf((float)p * inv_freq[i], &psn[j], &pcs[j]);
            pwa[j] = b2f(nwt[i]);
            pwb[j] = b2f(nwt[i + half]);
        }
    }
    RW_STAMP(t_entry);
    rw_pdl_begin();
    RW_STAMP(t_wait);
    extern __shared__ float hbuf[]; /* [warps][hd] */
    if (!in) return;                /* whole warps; the kernel has no block-wide barrier */
    float *buf = hbuf + (int64_t)w * hd;
    const bool isq = h < nh;
    if (!isq && sl < 0) return;
    const int g = h - nh;
    const float *src = isq ? q + t * ldq + (int64_t)h * hd : k + t * ldkv + (int64_t)g * hd;
    float ss = 0.0f;
    for (int i = lane; i < hd; i += 32) {
        const float a = src[i];
        buf[i] = a;
        ss += a * a;
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
        ss += __shfl_xor_sync(0xffffffffu, ss, o);
    const float r = rsqrtf(ss / (float)hd + eps);
    __syncwarp();
    /* q stays fp32 (the attention reads it so); k goes to the bf16 cache (a hi + lo pair with
     * the low halves' cache) */
    float *qdst = isq ? q_out + (t * nh + h) * hd : NULL;
    int64_t kvat = 0; /* the slot's first element in the caches */
    if (!isq) {
        const int64_t blk = sl / bs, off = sl % bs;
        kvat = ((blk * nkv + g) * bs + off) * hd;
    }
    /* element i's rotation: a, b normed, then o0 = a cos - b sin, o1 = b cos + a sin (one
     * function for both paths, so the same bits) */
    auto put = [&](int i, float wa, float wb, float sn, float cs) {
        const float a = wa * (buf[i] * r);
        const float b = wb * (buf[i + half] * r);
        const float o0 = a * cs - b * sn, o1 = b * cs + a * sn;
        if (isq) {
            qdst[i] = o0;
            qdst[i + half] = o1;
        } else {
            rw_k_store_split(o0, kcache, kcache_lo, kvat + i);
            rw_k_store_split(o1, kcache, kcache_lo, kvat + i + half);
        }
    };
    if (pre) {
#pragma unroll
        for (int j = 0; j < ROPE_PRE; j++)
            if (lane + 32 * j < half) put(lane + 32 * j, pwa[j], pwb[j], psn[j], pcs[j]);
    } else {
        for (int i = lane; i < half; i += 32) {
            float sn, cs;
            sincosf((float)p * inv_freq[i], &sn, &cs);
            put(i, b2f(nwt[i]), b2f(nwt[i + half]), sn, cs);
        }
    }
    if (!isq) {
        const float *vs = v + t * ldkv + (int64_t)g * hd;
        for (int i = lane; i < hd; i += 32)
            rw_k_store_split(vs[i], vcache, vcache_lo, kvat + i);
    }
    RW_STAMP_PUT(nr, 2, blockIdx.x, t_entry, t_wait, 0); /* (if thread 0's warp had a head) */
}

extern "C" rw_status rw_k_qk_rope_kv(const float *q, const float *k, const float *v, int64_t ldq,
                                     int64_t ldkv, const uint16_t *qn, const uint16_t *kn,
                                     const int32_t *pos, const int32_t *slot, int64_t n, int nh,
                                     int nkv, int hd, int bs, const float *inv_freq, float eps,
                                     float *q_out, rw_kv_planes kv, rw_stream s, rw_err *err) {
    if (n <= 0) return RW_OK;
    if (hd % 2 || hd > 1024) RW_FAIL(err, RW_E_UNSUPPORTED, "rope: head_dim %d", hd);
    if (!kv.k_lo != !kv.v_lo)
        RW_FAIL(err, RW_E_INVALID_ARG, "rope: the low halves of K without those of V, or back");
    const int64_t warps = n * (nh + nkv);
    RW_STAMPS_REGISTER(nr);
    (void)rw_launch_pdl(qk_rope_kv_kernel, dim3((unsigned)((warps + ROPE_WARPS - 1) / ROPE_WARPS)),
                        ROPE_WARPS * 32, sizeof(float) * ROPE_WARPS * hd, (cudaStream_t)s, q, k, v,
                        ldq, ldkv, qn, kn, pos, slot, n, nh, nkv, hd, bs, inv_freq, eps, q_out,
                        kv.k, kv.v, kv.k_lo, kv.v_lo);
    return LAUNCH_CHECK(s, "qk_rope_kv");
}
