/* kernels.cu - the CUDA backend's own kernels: embedding, RMSNorm (fused with the residual add),
 * per-head q/k norm + RoPE + paged KV write, paged causal attention (prefill and decode, with a
 * split over the keys for few sequences), fp32 router logits, logits gather and sampling.
 * Contracts and CPU references: kernels.h / kernels_ref.c. Reductions use fixed per-thread
 * orders and fixed trees, so results are the same on every run. */
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include "kernels.h"

typedef __nv_bfloat16 bf16;

__device__ __forceinline__ float b2f(uint16_t b) {
    return __uint_as_float((uint32_t)b << 16);
}
__device__ __forceinline__ uint16_t f2b(float f) {
    return rw_f32_to_bf16(f);
}
/* v as a hi + lo bf16 pair (kernels.h); lo == NULL stores hi alone */
__device__ __forceinline__ void store_split(float v, uint16_t *hi, uint16_t *lo, int64_t i) {
    const uint16_t h = f2b(v);
    hi[i] = h;
    if (lo) lo[i] = rw_bf16_split_lo(v, h);
}

/* Block-wide sum with a fixed tree (blockDim.x a multiple of 32, <= 1024). */
__device__ float block_sum(float v, float *sh) {
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    __syncthreads();
    if (lane == 0) sh[w] = v;
    __syncthreads();
    if (w == 0) {
        v = lane < nw ? sh[lane] : 0.0f;
#pragma unroll
        for (int o = 16; o > 0; o >>= 1)
            v += __shfl_xor_sync(0xffffffffu, v, o);
        if (lane == 0) sh[32] = v;
    }
    __syncthreads();
    return sh[32];
}

#define LAUNCH_CHECK(s, what) RW_LAUNCH_CHECK(s, what, err)

/* ------------------------------------------------------------------------------------------ */
__global__ void embed_kernel(const int32_t *tok, int64_t n, const uint16_t *emb, int64_t v_begin,
                             int64_t v_local, int64_t H, float *x) {
    const int64_t t = blockIdx.x;
    const int64_t r = (int64_t)tok[t] - v_begin;
    const bool mine = r >= 0 && r < v_local;
    for (int64_t i = threadIdx.x; i < H; i += blockDim.x)
        x[t * H + i] = mine ? b2f(emb[r * H + i]) : 0.0f;
}

extern "C" rw_status rw_k_embed(const int32_t *tok, int64_t n, const uint16_t *emb, int64_t v_begin,
                                int64_t v_local, int64_t H, float *x, rw_stream s, rw_err *err) {
    if (n <= 0) return RW_OK;
    embed_kernel<<<(unsigned)n, 256, 0, (cudaStream_t)s>>>(tok, n, emb, v_begin, v_local, H, x);
    return LAUNCH_CHECK(s, "embed");
}

/* ------------------------------------------------------------------------------------------ */
/* One CTA per row; each thread keeps its elements (H <= 256 * 32) in registers between the two
 * passes. */
#define NORM_THREADS 256
#define NORM_MAXPER 32

__global__ void add_rmsnorm_kernel(float *x, const float *y, const uint16_t *w, int64_t H,
                                   float eps, uint16_t *out_hi, uint16_t *out_lo, float *out_f32,
                                   const int32_t *rows) {
    __shared__ float sh[33];
    const int64_t t = blockIdx.x;
    const int64_t src = rows ? rows[t] : t;
    float *xt = x + src * H;
    float v[NORM_MAXPER];
    float ss = 0.0f;
#pragma unroll
    for (int j = 0; j < NORM_MAXPER; j++) {
        const int64_t i = threadIdx.x + (int64_t)j * NORM_THREADS;
        v[j] = 0.0f;
        if (i < H) {
            float a = xt[i];
            if (y) {
                a += y[src * H + i];
                xt[i] = a;
            }
            v[j] = a;
            ss += a * a;
        }
    }
    const float r = rsqrtf(block_sum(ss, sh) / (float)H + eps);
#pragma unroll
    for (int j = 0; j < NORM_MAXPER; j++) {
        const int64_t i = threadIdx.x + (int64_t)j * NORM_THREADS;
        if (i < H) {
            const float o = b2f(w[i]) * (v[j] * r);
            store_split(o, out_hi, out_lo, t * H + i);
            if (out_f32) out_f32[t * H + i] = o;
        }
    }
}

extern "C" rw_status rw_k_add_rmsnorm(float *x, const float *y, const uint16_t *w, int64_t n,
                                      int64_t H, float eps, uint16_t *out_hi, uint16_t *out_lo,
                                      float *out_f32, rw_stream s, rw_err *err) {
    if (n <= 0) return RW_OK;
    if (H > NORM_THREADS * NORM_MAXPER)
        RW_FAIL(err, RW_E_UNSUPPORTED, "rmsnorm: H = %lld > %d", (long long)H,
                NORM_THREADS * NORM_MAXPER);
    add_rmsnorm_kernel<<<(unsigned)n, NORM_THREADS, 0, (cudaStream_t)s>>>(x, y, w, H, eps, out_hi,
                                                                          out_lo, out_f32, NULL);
    return LAUNCH_CHECK(s, "add_rmsnorm");
}

extern "C" rw_status rw_k_rmsnorm_rows(float *x, const float *y, const int32_t *rows, int64_t n,
                                       const uint16_t *w, int64_t H, float eps, uint16_t *out_hi,
                                       uint16_t *out_lo, rw_stream s, rw_err *err) {
    if (n <= 0) return RW_OK;
    if (H > NORM_THREADS * NORM_MAXPER)
        RW_FAIL(err, RW_E_UNSUPPORTED, "rmsnorm: H = %lld > %d", (long long)H,
                NORM_THREADS * NORM_MAXPER);
    add_rmsnorm_kernel<<<(unsigned)n, NORM_THREADS, 0, (cudaStream_t)s>>>(x, y, w, H, eps, out_hi,
                                                                          out_lo, NULL, rows);
    return LAUNCH_CHECK(s, "rmsnorm_rows");
}

/* ------------------------------------------------------------------------------------------ */
/* One warp per (token, head), q heads then k heads of a token in consecutive warps: every head
 * of a decode batch runs at once. The head goes through shared memory so any even hd <= 1024
 * works. */
#define ROPE_WARPS 8

__global__ void __launch_bounds__(ROPE_WARPS * 32)
    qk_rope_kv_kernel(const float *q, const float *k, const float *v, int64_t ldq, int64_t ldkv,
                      const uint16_t *qn, const uint16_t *kn, const int32_t *pos,
                      const int32_t *slot, int64_t n, int nh, int nkv, int hd, int bs,
                      const float *inv_freq, float eps, float *q_out, uint16_t *kcache,
                      uint16_t *vcache) {
    extern __shared__ float hbuf[]; /* [warps][hd] */
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    const int nhk = nh + nkv;
    const int64_t gw = (int64_t)blockIdx.x * ROPE_WARPS + w;
    if (gw >= n * nhk) return; /* whole warps; the kernel has no block-wide barrier */
    const int64_t t = gw / nhk;
    const int h = (int)(gw % nhk);
    float *buf = hbuf + (int64_t)w * hd;
    const int32_t p = pos[t];
    const int32_t sl = slot[t];
    const int half = hd / 2;
    const bool isq = h < nh;
    if (!isq && sl < 0) return;
    const int g = h - nh;
    const float *src = isq ? q + t * ldq + (int64_t)h * hd : k + t * ldkv + (int64_t)g * hd;
    const uint16_t *nwt = isq ? qn : kn;
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
    /* q stays fp32 (the attention reads it so); k goes to the bf16 cache */
    float *qdst = isq ? q_out + (t * nh + h) * hd : NULL;
    uint16_t *kdst = NULL;
    if (!isq) {
        const int64_t blk = sl / bs, off = sl % bs;
        kdst = kcache + ((blk * nkv + g) * bs + off) * hd;
    }
    for (int i = lane; i < half; i += 32) {
        const float a = b2f(nwt[i]) * (buf[i] * r);
        const float b = b2f(nwt[i + half]) * (buf[i + half] * r);
        float sn, cs;
        sincosf((float)p * inv_freq[i], &sn, &cs);
        const float o0 = a * cs - b * sn, o1 = b * cs + a * sn;
        if (isq) {
            qdst[i] = o0;
            qdst[i + half] = o1;
        } else {
            kdst[i] = f2b(o0);
            kdst[i + half] = f2b(o1);
        }
    }
    if (!isq) {
        const int64_t blk = sl / bs, off = sl % bs;
        uint16_t *vd = vcache + ((blk * nkv + g) * bs + off) * hd;
        const float *vs = v + t * ldkv + (int64_t)g * hd;
        for (int i = lane; i < hd; i += 32)
            vd[i] = f2b(vs[i]);
    }
}

extern "C" rw_status rw_k_qk_rope_kv(const float *q, const float *k, const float *v, int64_t ldq,
                                     int64_t ldkv, const uint16_t *qn, const uint16_t *kn,
                                     const int32_t *pos, const int32_t *slot, int64_t n, int nh,
                                     int nkv, int hd, int bs, const float *inv_freq, float eps,
                                     float *q_out, uint16_t *kcache, uint16_t *vcache, rw_stream s,
                                     rw_err *err) {
    if (n <= 0) return RW_OK;
    if (hd % 2 || hd > 1024) RW_FAIL(err, RW_E_UNSUPPORTED, "rope: head_dim %d", hd);
    const int64_t warps = n * (nh + nkv);
    qk_rope_kv_kernel<<<(unsigned)((warps + ROPE_WARPS - 1) / ROPE_WARPS), ROPE_WARPS * 32,
                        sizeof(float) * ROPE_WARPS * hd, (cudaStream_t)s>>>(
        q, k, v, ldq, ldkv, qn, kn, pos, slot, n, nh, nkv, hd, bs, inv_freq, eps, q_out, kcache,
        vcache);
    return LAUNCH_CHECK(s, "qk_rope_kv");
}

/* ------------------------------------------------------------------------------------------ */
/* Paged attention. CTA = (tile, kv head, split); 4 warps = 8 half-warps; query row r = (token i
 * of the tile, q head h of the group) goes to half-warp r % 8. Keys in tiles of 16 positions
 * (inside one KV block since bs % 16 == 0), double-buffered in shared memory with cp.async.
 * For one row and one key tile, lane j of the half-warp scores key j (full dot product over hd
 * from shared memory), the half-warp shares max and sum, and lane j accumulates output dims
 * [j*hd/16, (j+1)*hd/16) with online softmax.
 *
 * Segments (kernels.h): key tiles [T s, T s + T), T = RW_ATTN_SEG / 16, form segment s. Every segment starts from
 * (max -inf, sum 0, output 0) and walks its key tiles in order; segments are merged in order by
 * seg_merge, here (nsplit 0) or in attn_combine_kernel (nsplit >= 1), with the same arithmetic
 * (no fused multiply-adds: __fmul_rn / __fadd_rn), so both give the same bits. A key tile past
 * a row's position (the tile's last token is further on) is fully masked for that row and
 * leaves its (max, sum, output) unchanged exactly: correction exp(0) = 1, weight exp(-inf) = 0. */
#define ATT_THREADS 128
#define ATT_KT 16
#define ATT_SEG_TILES (RW_ATTN_SEG / ATT_KT)

__device__ __forceinline__ uint32_t smem_addr(const void *p) {
    return (uint32_t)__cvta_generic_to_shared(p);
}
__device__ __forceinline__ void cpa16(void *dst, const void *src) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(smem_addr(dst)), "l"(src));
}
__device__ __forceinline__ void cpa_commit() {
    asm volatile("cp.async.commit_group;\n" ::);
}
__device__ __forceinline__ void cpa_wait0() {
    asm volatile("cp.async.wait_group 0;\n" ::);
}
__device__ __forceinline__ void cpa_wait1() {
    asm volatile("cp.async.wait_group 1;\n" ::);
}

/* PER consecutive bf16 of shared memory (PER * 2 bytes, aligned to that) to fp32. */
template <int PER> __device__ __forceinline__ void lds_bf16(const uint16_t *p, float *f) {
    if constexpr (PER == 8) {
        const uint4 u = *(const uint4 *)p;
        const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
        for (int i = 0; i < 4; i++) {
            f[2 * i] = __uint_as_float(w[i] << 16);
            f[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
        }
    } else if constexpr (PER == 4) {
        const uint2 u = *(const uint2 *)p;
        f[0] = __uint_as_float(u.x << 16);
        f[1] = __uint_as_float(u.x & 0xffff0000u);
        f[2] = __uint_as_float(u.y << 16);
        f[3] = __uint_as_float(u.y & 0xffff0000u);
    } else {
        static_assert(PER == 2, "head_dim 32, 64 or 128");
        const uint32_t u = *(const uint32_t *)p;
        f[0] = __uint_as_float(u << 16);
        f[1] = __uint_as_float(u & 0xffff0000u);
    }
}

/* (M, L, O[N]) <- (M, L, O) merged with one segment's (m, l, o[N]); a segment without keys for
 * the row (l == 0) is skipped. From (-inf, 0, 0) the first merge gives (m, l, o) exactly. */
template <int N>
__device__ __forceinline__ void seg_merge(float &M, float &L, float *O, float m, float l,
                                          const float *o) {
    if (!(l > 0.0f)) return;
    const float mn = fmaxf(M, m);
    const float a = expf(M - mn), b = expf(m - mn);
    L = __fadd_rn(__fmul_rn(L, a), __fmul_rn(l, b));
#pragma unroll
    for (int d = 0; d < N; d++)
        O[d] = __fadd_rn(__fmul_rn(O[d], a), __fmul_rn(o[d], b));
    M = mn;
}

template <int HD, int ROWS>
__global__ void __launch_bounds__(ATT_THREADS)
    attn_kernel(const float *__restrict__ q, const uint16_t *__restrict__ kc,
                const uint16_t *__restrict__ vc, const rw_attn_tile *__restrict__ tiles,
                const int32_t *__restrict__ pos, const int32_t *__restrict__ bt, int bt_stride,
                int nh, int nkv, int bs, int nsplit, int qt, float scale,
                uint16_t *__restrict__ out_hi, uint16_t *__restrict__ out_lo,
                float *__restrict__ part_o, float2 *__restrict__ part_ml, int64_t ntok,
                int seg_cap) {
    constexpr int KROW = HD * 2 + 16; /* padded smem row (bytes) against bank conflicts */
    constexpr int PER = HD / 16;      /* output dims per lane */
    extern __shared__ __align__(16) uint8_t sm[];
    float *qs = (float *)sm; /* [qt * group][HD] scaled q */
    const int group = nh / nkv;
    uint8_t *kvs = sm + (size_t)qt * group * HD * 4; /* 2 x (K, V) [16][KROW] */
    const rw_attn_tile tl = tiles[blockIdx.x];
    if (tl.ntok > qt) __trap(); /* the launch sized shared memory and ROWS for qt tokens */
    const int g = blockIdx.y, split = blockIdx.z;
    const int nrows = tl.ntok * group;
    const int tid = threadIdx.x, lane = tid & 31, hw = tid >> 4, j = lane & 15;
    const unsigned hmask = (lane < 16) ? 0x0000ffffu : 0xffff0000u;

    for (int idx = tid; idx < nrows * HD; idx += ATT_THREADS) {
        const int r = idx / HD, d = idx % HD;
        const int i = r / group, h = g * group + r % group;
        qs[idx] = q[((int64_t)(tl.tok0 + i) * nh + h) * HD + d] * scale;
    }
    const int32_t plast = pos[tl.tok0 + tl.ntok - 1];
    const int nkt = plast / ATT_KT + 1; /* key tiles the last query needs */
    const int nseg = (nkt + ATT_SEG_TILES - 1) / ATT_SEG_TILES;
    const int32_t *blocks = bt + (int64_t)tl.seq * bt_stride;

    auto load = [&](int buf, int kt) {
        const int p0 = kt * ATT_KT;
        const int64_t blk = blocks[p0 / bs], off = p0 % bs;
        const uint16_t *ks = kc + ((blk * nkv + g) * bs + off) * HD;
        const uint16_t *vs = vc + ((blk * nkv + g) * bs + off) * HD;
        uint8_t *kd = kvs + (size_t)buf * 2 * ATT_KT * KROW;
        uint8_t *vd = kd + ATT_KT * KROW;
        constexpr int CH = HD * 2 / 16; /* 16-byte chunks per row */
        for (int c = tid; c < ATT_KT * CH; c += ATT_THREADS) {
            const int r = c / CH, cc = c % CH;
            cpa16(kd + r * KROW + cc * 16, (const uint8_t *)ks + (size_t)r * HD * 2 + cc * 16);
            cpa16(vd + r * KROW + cc * 16, (const uint8_t *)vs + (size_t)r * HD * 2 + cc * 16);
        }
    };

    int32_t qp[ROWS];
    float M[ROWS], L[ROWS], O[ROWS][PER]; /* the merged segments (nsplit 0) */
#pragma unroll
    for (int a = 0; a < ROWS; a++) {
        const int r = hw + a * 8;
        qp[a] = r < nrows ? pos[tl.tok0 + r / group] : -1;
        M[a] = -INFINITY;
        L[a] = 0.0f;
#pragma unroll
        for (int d = 0; d < PER; d++)
            O[a][d] = 0.0f;
    }
    const int sstep = nsplit > 0 ? nsplit : 1;
    for (int sg = nsplit > 0 ? split : 0; sg < nseg; sg += sstep) {
        const int kt0 = sg * ATT_SEG_TILES;
        const int kt1 = min(nkt, kt0 + ATT_SEG_TILES);
        float m[ROWS], l[ROWS], o[ROWS][PER];
#pragma unroll
        for (int a = 0; a < ROWS; a++) {
            m[a] = -INFINITY;
            l[a] = 0.0f;
#pragma unroll
            for (int d = 0; d < PER; d++)
                o[a][d] = 0.0f;
        }
        __syncthreads(); /* q in shared memory; the previous segment's buffers are free */
        load(0, kt0);
        cpa_commit();
        for (int kt = kt0; kt < kt1; kt++) {
            const int buf = (kt - kt0) & 1;
            if (kt + 1 < kt1) load(buf ^ 1, kt + 1);
            cpa_commit();
            cpa_wait1();
            __syncthreads();
            const uint8_t *kd = kvs + (size_t)buf * 2 * ATT_KT * KROW;
            const uint8_t *vd = kd + ATT_KT * KROW;
            const int kp = kt * ATT_KT + j; /* this lane's key position */
#pragma unroll
            for (int a = 0; a < ROWS; a++) {
                const int r = hw + a * 8;
                if (r >= nrows) continue; /* uniform within the half-warp */
                const float *qr = qs + r * HD;
                float sc = 0.0f;
                const uint4 *kr = (const uint4 *)(kd + j * KROW);
#pragma unroll
                for (int c = 0; c < HD / 8; c++) {
                    const uint4 kk = kr[c];
                    const float4 q0 = *(const float4 *)(qr + c * 8);
                    const float4 q1 = *(const float4 *)(qr + c * 8 + 4);
                    sc += q0.x * __uint_as_float(kk.x << 16) +
                          q0.y * __uint_as_float(kk.x & 0xffff0000u);
                    sc += q0.z * __uint_as_float(kk.y << 16) +
                          q0.w * __uint_as_float(kk.y & 0xffff0000u);
                    sc += q1.x * __uint_as_float(kk.z << 16) +
                          q1.y * __uint_as_float(kk.z & 0xffff0000u);
                    sc += q1.z * __uint_as_float(kk.w << 16) +
                          q1.w * __uint_as_float(kk.w & 0xffff0000u);
                }
                if (kp > qp[a]) sc = -INFINITY;
                float tmax = sc;
#pragma unroll
                for (int off = 8; off > 0; off >>= 1)
                    tmax = fmaxf(tmax, __shfl_xor_sync(hmask, tmax, off, 16));
                const float mnew = fmaxf(m[a], tmax);
                if (mnew == -INFINITY) continue; /* every key so far masked for this row */
                const float corr = expf(m[a] - mnew);
                const float pj = expf(sc - mnew);
                float ps = pj;
#pragma unroll
                for (int off = 8; off > 0; off >>= 1)
                    ps += __shfl_xor_sync(hmask, ps, off, 16);
                l[a] = l[a] * corr + ps;
                m[a] = mnew;
#pragma unroll
                for (int d = 0; d < PER; d++)
                    o[a][d] *= corr;
#pragma unroll
                for (int jj = 0; jj < ATT_KT; jj++) {
                    const float pjj = __shfl_sync(hmask, pj, jj, 16);
                    float vf[PER];
                    lds_bf16<PER>((const uint16_t *)(vd + jj * KROW) + j * PER, vf);
#pragma unroll
                    for (int d = 0; d < PER; d++)
                        o[a][d] += pjj * vf[d];
                }
            }
            __syncthreads(); /* the buffer is reloaded two iterations later */
        }
        cpa_wait0();
#pragma unroll
        for (int a = 0; a < ROWS; a++) {
            const int r = hw + a * 8;
            if (r >= nrows) continue;
            if (nsplit == 0) {
                seg_merge<PER>(M[a], L[a], O[a], m[a], l[a], o[a]);
            } else if (sg < seg_cap) {
                const int64_t t = tl.tok0 + r / group;
                const int h = g * group + r % group;
                const int64_t base = ((int64_t)sg * ntok + t) * nh + h;
#pragma unroll
                for (int d = 0; d < PER; d++)
                    part_o[base * HD + j * PER + d] = o[a][d];
                if (j == 0) part_ml[base] = make_float2(m[a], l[a]);
            }
        }
    }
    if (nsplit != 0) return;
#pragma unroll
    for (int a = 0; a < ROWS; a++) {
        const int r = hw + a * 8;
        if (r >= nrows) continue;
        const int64_t t = tl.tok0 + r / group;
        const int h = g * group + r % group;
#pragma unroll
        for (int d = 0; d < PER; d++)
            store_split(__fdiv_rn(O[a][d], L[a]), out_hi, out_lo,
                        (t * nh + h) * HD + j * PER + d);
    }
}

/* Merges the segments of every (token, head) in order, as attn_kernel does with nsplit 0. */
__global__ void attn_combine_kernel(const float *__restrict__ part_o,
                                    const float2 *__restrict__ part_ml,
                                    const int32_t *__restrict__ pos, int64_t ntok, int nh, int hd,
                                    uint16_t *__restrict__ out_hi, uint16_t *__restrict__ out_lo) {
    const int64_t th = blockIdx.x; /* token * nh + head */
    const int nseg = pos[th / nh] / RW_ATTN_SEG + 1;
    for (int d = threadIdx.x; d < hd; d += blockDim.x) {
        float M = -INFINITY, L = 0.0f, O = 0.0f;
        for (int s = 0; s < nseg; s++) {
            const int64_t b = (int64_t)s * ntok * nh + th;
            const float2 ml = part_ml[b];
            const float o = part_o[b * hd + d];
            seg_merge<1>(M, L, &O, ml.x, ml.y, &o);
        }
        store_split(__fdiv_rn(O, L), out_hi, out_lo, th * hd + d);
    }
}

extern "C" size_t rw_k_attention_part_bytes(int64_t ntok, int nh, int hd, int segments) {
    if (segments < 1 || ntok < 1) return 0;
    return (size_t)segments * (size_t)ntok * (size_t)nh * ((size_t)hd * 4 + 8) + 256;
}

template <int HD>
static rw_status attn_launch(const float *q, const uint16_t *kc, const uint16_t *vc,
                             const rw_attn_tile *tiles, int ntiles, int qt, const int32_t *pos,
                             const int32_t *bt, int bt_stride, int64_t ntok, int nh, int nkv,
                             int bs, int nsplit, void *part, size_t part_bytes, uint16_t *out_hi,
                             uint16_t *out_lo, rw_stream s, rw_err *err) {
    const int group = nh / nkv;
    /* rows per half-warp and the q buffer for tiles of at most qt tokens: a decode batch (qt 1)
     * keeps 1/8 of the registers and shared memory of a prefill one, so more CTAs fit an SM */
    const int rows = (qt * group + 7) / 8;
    const size_t sm = (size_t)qt * group * HD * 4 + 2 * 2 * ATT_KT * (HD * 2 + 16);
    /* the attribute allows the largest qt, so a graph captured with a smaller launch stays valid
     * whatever is launched eagerly in between */
    const size_t sm_max = (size_t)RW_ATTN_QT * group * HD * 4 + 2 * 2 * ATT_KT * (HD * 2 + 16);
    float *po = NULL;
    float2 *pml = NULL;
    int seg_cap = 0;
    if (nsplit > 0) {
        const size_t per = (size_t)ntok * nh * ((size_t)HD * 4 + 8);
        seg_cap = part_bytes > 256 ? (int)((part_bytes - 256) / per) : 0;
        if (seg_cap < 1)
            RW_FAIL(err, RW_E_INVALID_ARG, "attention: %zu bytes of scratch hold no segment",
                    part_bytes);
        po = (float *)part;
        pml = (float2 *)((uint8_t *)part + (size_t)seg_cap * ntok * nh * HD * 4);
    }
    dim3 grid((unsigned)ntiles, (unsigned)nkv, (unsigned)(nsplit > 0 ? nsplit : 1));
    const float scale = 1.0f / sqrtf((float)HD);
    cudaStream_t st = (cudaStream_t)s;
#define ATT_CASE(R)                                                                                \
    if (rows <= R) {                                                                               \
        cudaFuncSetAttribute(attn_kernel<HD, R>, cudaFuncAttributeMaxDynamicSharedMemorySize,      \
                             (int)sm_max);                                                         \
        attn_kernel<HD, R><<<grid, ATT_THREADS, sm, st>>>(q, kc, vc, tiles, pos, bt, bt_stride,    \
                                                          nh, nkv, bs, nsplit, qt, scale, out_hi,  \
                                                          out_lo, po, pml, ntok, seg_cap);         \
    } else
    ATT_CASE(1) ATT_CASE(2) ATT_CASE(4) ATT_CASE(8) ATT_CASE(16) {
        RW_FAIL(err, RW_E_UNSUPPORTED, "attention: %d q heads per kv head (at most 16)", group);
    }
#undef ATT_CASE
    RW_CHECK(LAUNCH_CHECK(s, "attention"));
    if (nsplit > 0) {
        attn_combine_kernel<<<(unsigned)(ntok * nh), 128, 0, st>>>(po, pml, pos, ntok, nh, HD,
                                                                   out_hi, out_lo);
        RW_CHECK(LAUNCH_CHECK(s, "attention combine"));
    }
    return RW_OK;
}

extern "C" rw_status rw_k_attention(const float *q, const uint16_t *kcache,
                                    const uint16_t *vcache, const rw_attn_tile *tiles, int ntiles,
                                    int qt, const int32_t *pos, const int32_t *bt, int bt_stride,
                                    int64_t ntok, int nh, int nkv, int hd, int bs, int nsplit,
                                    void *part, size_t part_bytes, uint16_t *out_hi,
                                    uint16_t *out_lo, rw_stream s, rw_err *err) {
    if (ntiles <= 0) return RW_OK;
    if (qt < 1 || qt > RW_ATTN_QT)
        RW_FAIL(err, RW_E_INVALID_ARG, "attention: tiles of up to %d tokens (1..%d)", qt,
                RW_ATTN_QT);
    if (bs % ATT_KT != 0) RW_FAIL(err, RW_E_UNSUPPORTED, "attention: block size %d %% 16", bs);
    if (nsplit < 0 || (nsplit > 0 && !part))
        RW_FAIL(err, RW_E_INVALID_ARG, "attention: nsplit %d without scratch", nsplit);
    if (nkv < 1 || nh % nkv)
        RW_FAIL(err, RW_E_UNSUPPORTED, "attention: %d heads over %d kv heads", nh, nkv);
    switch (hd) {
    case 32:
        return attn_launch<32>(q, kcache, vcache, tiles, ntiles, qt, pos, bt, bt_stride, ntok, nh,
                               nkv, bs, nsplit, part, part_bytes, out_hi, out_lo, s, err);
    case 64:
        return attn_launch<64>(q, kcache, vcache, tiles, ntiles, qt, pos, bt, bt_stride, ntok, nh,
                               nkv, bs, nsplit, part, part_bytes, out_hi, out_lo, s, err);
    case 128:
        return attn_launch<128>(q, kcache, vcache, tiles, ntiles, qt, pos, bt, bt_stride, ntok, nh,
                                nkv, bs, nsplit, part, part_bytes, out_hi, out_lo, s, err);
    default: RW_FAIL(err, RW_E_UNSUPPORTED, "attention: head_dim %d (32, 64 or 128)", hd);
    }
}

/* ------------------------------------------------------------------------------------------ */
/* Router logits: y [n, E] = x [n, H] . w[E, H]^T in fp32. A warp computes RT_EW experts for the
 * RT_TT tokens of its CTA: lane l accumulates columns [c + 8l, c + 8l + 8) of every 256-column
 * chunk c in order (one 16-byte load of 8 bf16 weights per expert, two of x per token), then a
 * fixed xor tree adds the lanes. The summation order of an output depends on H only, so a token's
 * logits are the same bits in any batch; a decode batch is spread over E / (RT_WARPS * RT_EW)
 * CTAs per RT_TT tokens instead of one CTA walking H in 64 dependent steps. */
#define RT_WARPS 8
#define RT_EW 2
#define RT_TT 8
__global__ void __launch_bounds__(RT_WARPS * 32)
    router_kernel(const float *__restrict__ x, const uint16_t *__restrict__ w, int64_t n, int64_t E,
                  int64_t H, float *__restrict__ y) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int64_t t0 = (int64_t)blockIdx.x * RT_TT;
    const int64_t e0 = ((int64_t)blockIdx.y * RT_WARPS + warp) * RT_EW;
    if (e0 >= E) return; /* whole warps; no block-wide barrier below */
    const int nt = (int)(n - t0 < RT_TT ? n - t0 : RT_TT);
    float acc[RT_EW][RT_TT];
#pragma unroll
    for (int a = 0; a < RT_EW; a++)
#pragma unroll
        for (int b = 0; b < RT_TT; b++)
            acc[a][b] = 0.0f;
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
        for (int b = 0; b < RT_TT; b++) {
            if (b >= nt) break; /* uniform over the warp */
            const float4 p0 = *(const float4 *)(x + (t0 + b) * H + c);
            const float4 p1 = *(const float4 *)(x + (t0 + b) * H + c + 4);
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
        for (int b = 0; b < RT_TT; b++) {
            float v = acc[a][b];
#pragma unroll
            for (int o = 16; o > 0; o >>= 1)
                v += __shfl_xor_sync(0xffffffffu, v, o);
            if (lane == 0 && b < nt && e0 + a < E) y[(t0 + b) * E + e0 + a] = v;
        }
}

extern "C" rw_status rw_k_router(const float *x, const uint16_t *w, int64_t n, int64_t E, int64_t H,
                                 float *y, rw_stream s, rw_err *err) {
    if (n <= 0) return RW_OK;
    if (H % 8 || ((uintptr_t)x | (uintptr_t)w) % 16)
        RW_FAIL(err, RW_E_UNSUPPORTED, "router: H = %lld (needs %% 8) or unaligned inputs",
                (long long)H);
    dim3 grid((unsigned)((n + RT_TT - 1) / RT_TT),
              (unsigned)((E + RT_WARPS * RT_EW - 1) / (RT_WARPS * RT_EW)));
    router_kernel<<<grid, RT_WARPS * 32, 0, (cudaStream_t)s>>>(x, w, n, E, H, y);
    return LAUNCH_CHECK(s, "router");
}

/* ------------------------------------------------------------------------------------------ */
__global__ void logits_gather_kernel(const float *g, int64_t n, int64_t vl, int64_t V, float *out) {
    const int64_t r = blockIdx.y;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < V;
         i += (int64_t)gridDim.x * blockDim.x)
        out[r * V + i] = g[((i / vl) * n + r) * vl + i % vl];
}

extern "C" rw_status rw_k_logits_gather(const float *g, int T, int64_t n, int64_t vl, int64_t V,
                                        float *out, rw_stream s, rw_err *err) {
    if (n <= 0) return RW_OK;
    if (V > (int64_t)T * vl)
        RW_FAIL(err, RW_E_SHAPE, "logits gather: V %lld > %d x %lld", (long long)V, T,
                (long long)vl);
    dim3 grid(64, (unsigned)n);
    logits_gather_kernel<<<grid, 256, 0, (cudaStream_t)s>>>(g, n, vl, V, out);
    return LAUNCH_CHECK(s, "logits gather");
}

/* ------------------------------------------------------------------------------------------ */
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

    int32_t tok = best.i;
    if (p.temperature > 0.0f && p.top_k != 1) {
        const float inv_t = 1.0f / p.temperature;
        const float zmax = mx * inv_t;
        uint32_t thr = 0; /* keep ids with key >= thr */
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
            o->top_lps[jn] = l[b.i] - lse;
        }
        pv = l[b.i];
        pid = b.i;
    }
    if (threadIdx.x == 0) {
        o->token = tok;
        o->logprob = l[tok] - lse;
    }
}

extern "C" rw_status rw_k_sample(const float *logits, int64_t n, int64_t V,
                                 const rw_k_sample_param *p, rw_k_sample_out *out, rw_stream s,
                                 rw_err *err) {
    if (n <= 0) return RW_OK;
    sample_kernel<<<(unsigned)n, SMP_THREADS, 0, (cudaStream_t)s>>>(logits, V, p, out);
    return LAUNCH_CHECK(s, "sample");
}

/* ------------------------------------------------------------------------------------------ */
/* Benchmark fills: counter-based, each element from (seed, index) only. */
__device__ __forceinline__ uint64_t mix64(uint64_t x) {
    return rw_splitmix64(x);
}

__global__ void fill_bf16_kernel(uint16_t *p, int64_t n, uint64_t seed, float mean, float std) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x)
        p[i] = rw_rand_bf16_at(seed, (uint64_t)i, mean, std);
}
__global__ void fill_e4m3_kernel(uint8_t *p, int64_t n, uint64_t seed) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x) {
        const uint64_t r = mix64(seed ^ mix64((uint64_t)i));
        /* sign, exponent field 1..6 (magnitudes 2^-6 .. < 1), any mantissa: never NaN */
        p[i] = (uint8_t)((r & 0x80u) | ((1u + (uint32_t)((r >> 8) % 6u)) << 3) | ((r >> 16) & 7u));
    }
}
__global__ void fill_f32_kernel(float *p, int64_t n, float v) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x)
        p[i] = v;
}

extern "C" rw_status rw_k_fill_bf16(uint16_t *p, int64_t n, uint64_t seed, float mean, float std,
                                    rw_stream s, rw_err *err) {
    if (n <= 0) return RW_OK;
    fill_bf16_kernel<<<2048, 256, 0, (cudaStream_t)s>>>(p, n, seed, mean, std);
    return LAUNCH_CHECK(s, "fill bf16");
}
extern "C" rw_status rw_k_fill_e4m3(uint8_t *p, int64_t n, uint64_t seed, rw_stream s,
                                    rw_err *err) {
    if (n <= 0) return RW_OK;
    fill_e4m3_kernel<<<2048, 256, 0, (cudaStream_t)s>>>(p, n, seed);
    return LAUNCH_CHECK(s, "fill e4m3");
}
__global__ void spin_kernel(uint64_t ns) {
    uint64_t t0, t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    do {
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    } while (t - t0 < ns);
}

extern "C" rw_status rw_k_spin(uint64_t ns, rw_stream s, rw_err *err) {
    spin_kernel<<<1, 1, 0, (cudaStream_t)s>>>(ns);
    return LAUNCH_CHECK(s, "spin");
}

extern "C" rw_status rw_k_fill_f32(float *p, int64_t n, float value, rw_stream s, rw_err *err) {
    if (n <= 0) return RW_OK;
    fill_f32_kernel<<<2048, 256, 0, (cudaStream_t)s>>>(p, n, value);
    return LAUNCH_CHECK(s, "fill f32");
}
