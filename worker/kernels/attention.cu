/* attention.cu - paged causal attention (attention.h): the segment kernel, the combine kernel of
 * the key split and their launcher; reference in attention_ref.c. */
#include <cuda_runtime.h>
#include <stdint.h>

#include "attention.h"
#include "device.cuh"
#include "mma.cuh"

/* Paged attention. CTA = (tile, kv head, split); 4 warps = 8 half-warps; query row r = (token i
 * of the tile, q head h of the group) goes to half-warp r % 8. Keys in tiles of 16 positions
 * (inside one KV block since bs % 16 == 0), double-buffered in shared memory with cp.async.
 * For one row and one key tile, lane j of the half-warp scores key j (full dot product over hd
 * from shared memory), the half-warp shares max and sum, and lane j accumulates output dims
 * [j*hd/16, (j+1)*hd/16) with online softmax.
 *
 * Segments (attention.h): key tiles [T s, T s + T), T = RW_ATTN_SEG / 16, form segment s.
 * Every segment starts from (max -inf, sum 0, output 0) and walks its key tiles in order;
 * segments are merged in order by seg_merge, here (nsplit 0) or in attn_combine_kernel
 * (nsplit >= 1), with the same arithmetic (no fused multiply-adds: __fmul_rn / __fadd_rn), so
 * both give the same bits. A key tile past
 * a row's position (the tile's last token is further on) is fully masked for that row and
 * leaves its (max, sum, output) unchanged exactly: correction exp(0) = 1, weight exp(-inf) = 0. */
#define ATT_THREADS 128
#define ATT_KT 16
#define ATT_SEG_TILES (RW_ATTN_SEG / ATT_KT)

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
            rw_cp_async16_full(kd + r * KROW + cc * 16,
                               (const uint8_t *)ks + (size_t)r * HD * 2 + cc * 16);
            rw_cp_async16_full(vd + r * KROW + cc * 16,
                               (const uint8_t *)vs + (size_t)r * HD * 2 + cc * 16);
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
        rw_cp_async_commit();
        for (int kt = kt0; kt < kt1; kt++) {
            const int buf = (kt - kt0) & 1;
            if (kt + 1 < kt1) load(buf ^ 1, kt + 1);
            rw_cp_async_commit();
            rw_cp_async_wait<1>();
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
        rw_cp_async_wait<0>();
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
            rw_k_store_split(__fdiv_rn(O[a][d], L[a]), out_hi, out_lo,
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
        rw_k_store_split(__fdiv_rn(O, L), out_hi, out_lo, th * hd + d);
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

extern "C" rw_status rw_k_attention(const float *q, const uint16_t *kcache, const uint16_t *vcache,
                                    const rw_attn_tile *tiles, int ntiles, int qt,
                                    const int32_t *pos, const int32_t *bt, int bt_stride,
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
