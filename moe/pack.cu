/* pack.cu - CUDA side of the packed MoE layout: the fused scatter that runs every COPY / MXQ op
 * of a batch in one launch (canonical slice or piece -> padded packed layout, quantizing to
 * mxfp8 on the way), the fp8 128x128 block quantizer, whole-matrix pack / unpack, and the small
 * device helpers the weight set uses. The CPU references are rw_moe_ops_run_ref and
 * rw_moe_pack_ref / rw_moe_unpack_ref in pack.c; results are byte-identical.
 *
 * Scatter work decomposition: a unit is one row x one 64-column chunk of an op's destination
 * (units of op d are [unit_begin[d], unit_begin[d+1]), row-major over (row, chunk)). Eight
 * threads take a unit, eight elements each: bf16 moves as one 16-byte load and store (a packed
 * bf16 K block row is 128 contiguous bytes), e4m3 as 8 bytes; for MXQ the four threads of a
 * 32-element block reduce the block amax with warp shuffles. A thread block takes 128
 * consecutive units, so it finds its ops with one binary search and reads source rows in
 * contiguous 512-byte runs per warp. */
#include "moe_layout.h"

#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>

#include "cuda_check.h"

#define UPB 128      /* units per thread block */
#define NTHREADS 256 /* 32 groups of 8 threads */

/* Largest d in [lo, hi] with ub[d] <= u. */
__device__ __forceinline__ int find_op(const int64_t *__restrict__ ub, int lo, int hi, int64_t u) {
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        if (ub[mid] <= u)
            lo = mid;
        else
            hi = mid - 1;
    }
    return lo;
}

__device__ __forceinline__ int64_t map_row(const rw_moe_tgt &t, int64_t r) {
    return t.rowmap == RW_MOE_RM_W13    ? rw_moe_w13_row_map(r, t.P)
           : t.rowmap == RW_MOE_RM_SHUF ? rw_moe_row_shuffle(r)
                                        : r;
}

__device__ __forceinline__ int64_t addr_of(const rw_moe_tgt &t, int64_t n, int64_t k) {
    if (t.addr == RW_MOE_AD_KBLOCK) return rw_moe_kblock_offset(n, k, t.ld);
    if (t.addr == RW_MOE_AD_SWZ) return rw_moe_scale_swizzle(n, k, t.ld);
    return n * t.ld + k;
}

__device__ __forceinline__ float load_f(const uint8_t *p, int es, int64_t i) {
    if (es == 2) return rw_bf16_to_f32(((const uint16_t *)p)[i]);
    return ((const float *)p)[i];
}

/* COPY of 8 elements of ES bytes: dst cols [k0, k0 + 8), valid ones in [c0, c1). */
template <int ES>
__device__ __forceinline__ void copy8(const rw_moe_op &o, const uint8_t *srow, int64_t n,
                                      int64_t k0, int64_t c0, int64_t c1) {
    uint8_t *dst = (uint8_t *)(uintptr_t)o.dst.base;
    bool full = k0 >= c0 && k0 + 8 <= c1;
    if (full && o.dst.addr != RW_MOE_AD_SWZ) {
        /* 8 consecutive columns of one row are contiguous in ROWS and KBLOCK layouts */
        const uint8_t *s = srow + (k0 - c0) * ES;
        uint8_t *d = dst + addr_of(o.dst, n, k0) * ES;
        if ((((uintptr_t)s | (uintptr_t)d) & (8 * ES > 16 ? 15 : 8 * ES - 1)) == 0) {
            if (ES == 1) {
                *(uint2 *)d = *(const uint2 *)s;
            } else if (ES == 2) {
                *(uint4 *)d = *(const uint4 *)s;
            } else {
                ((uint4 *)d)[0] = ((const uint4 *)s)[0];
                ((uint4 *)d)[1] = ((const uint4 *)s)[1];
            }
            return;
        }
    }
    for (int j = 0; j < 8; j++) {
        int64_t k = k0 + j;
        if (k < c0 || k >= c1) continue;
        const uint8_t *s = srow + (k - c0) * ES;
        uint8_t *d = dst + addr_of(o.dst, n, k) * ES;
        if (ES == 1)
            *d = *s;
        else if (ES == 2)
            *(uint16_t *)d = *(const uint16_t *)s;
        else
            *(uint32_t *)d = *(const uint32_t *)s;
    }
}

/* MXQ of 8 elements: the 4 threads of a 32-column block (lanes 4g..4g+3 of the warp) share its
 * amax. The op's columns are whole blocks, so a block is all valid or all outside. */
__device__ __forceinline__ void mxq8(const rw_moe_op &o, const uint8_t *srow, int64_t r, int64_t n,
                                     int64_t k0, int64_t c0, int64_t c1) {
    int64_t kb = k0 & ~(int64_t)31;
    if (kb < c0 || kb + 32 > c1) return; /* whole block outside: the 4 lanes agree */
    int lane = threadIdx.x & 31;
    unsigned mask = 0xfu << (lane & ~3);
    float v[8];
    uint32_t m = 0;
    if (o.esize == 2) {
        const uint16_t *s = (const uint16_t *)srow + (k0 - c0);
        if (((uintptr_t)s & 15) == 0) {
            uint4 q = *(const uint4 *)s;
            uint32_t w[4] = {q.x, q.y, q.z, q.w};
            for (int j = 0; j < 4; j++) {
                v[2 * j] = rw_bf16_to_f32((uint16_t)(w[j] & 0xffffu));
                v[2 * j + 1] = rw_bf16_to_f32((uint16_t)(w[j] >> 16));
            }
        } else {
            for (int j = 0; j < 8; j++)
                v[j] = rw_bf16_to_f32(s[j]);
        }
    } else {
        const float *s = (const float *)srow + (k0 - c0);
        for (int j = 0; j < 8; j++)
            v[j] = s[j];
    }
    for (int j = 0; j < 8; j++) {
        uint32_t a = rw_f32_bits(v[j]) & 0x7fffffffu;
        m = a > m ? a : m;
    }
    uint32_t x = __shfl_xor_sync(mask, m, 1);
    m = x > m ? x : m;
    x = __shfl_xor_sync(mask, m, 2);
    m = x > m ? x : m;
    uint8_t sb = rw_mxfp8_scale_from_amax(rw_bits_f32(m));
    if ((lane & 3) == 0) {
        uint8_t *scl = (uint8_t *)(uintptr_t)o.scl.base;
        scl[addr_of(o.scl, map_row(o.scl, r), kb / 32)] = sb;
    }
    uint8_t q[8];
    for (int j = 0; j < 8; j++)
        q[j] = rw_mxfp8_quantize_elem(v[j], sb);
    uint8_t *d = (uint8_t *)(uintptr_t)o.dst.base + addr_of(o.dst, n, k0);
    if (((uintptr_t)d & 7) == 0 && o.dst.addr != RW_MOE_AD_SWZ) {
        uint2 w;
        w.x = q[0] | (q[1] << 8) | (q[2] << 16) | ((uint32_t)q[3] << 24);
        w.y = q[4] | (q[5] << 8) | (q[6] << 16) | ((uint32_t)q[7] << 24);
        *(uint2 *)d = w;
    } else {
        uint8_t *base = (uint8_t *)(uintptr_t)o.dst.base;
        for (int j = 0; j < 8; j++)
            base[addr_of(o.dst, n, k0 + j)] = q[j];
    }
}

#define OPCACHE 8 /* ops a thread block keeps in shared memory (a block usually spans 1-2) */

__global__ void __launch_bounds__(NTHREADS)
    scatter_kernel(const rw_moe_op *__restrict__ ops, const int64_t *__restrict__ ub, int nops,
                   int64_t total) {
    __shared__ int s_d0, s_d1;
    __shared__ rw_moe_op s_ops[OPCACHE];
    __shared__ int64_t s_ub[OPCACHE + 1];
    int64_t u0 = (int64_t)blockIdx.x * UPB;
    if (threadIdx.x == 0) {
        int64_t ul = u0 + UPB < total ? u0 + UPB - 1 : total - 1;
        s_d0 = find_op(ub, 0, nops - 1, u0);
        s_d1 = find_op(ub, s_d0, nops - 1, ul);
    }
    __syncthreads();
    int d0 = s_d0, nc = s_d1 - s_d0 + 1;
    bool cached = nc <= OPCACHE;
    if (cached) {
        /* copy the block's ops (as 8-byte words) and their unit offsets to shared memory */
        const uint64_t *g = (const uint64_t *)(ops + d0);
        uint64_t *w = (uint64_t *)s_ops;
        int words = nc * (int)(sizeof(rw_moe_op) / 8);
        for (int i = threadIdx.x; i < words; i += NTHREADS)
            w[i] = g[i];
        for (int i = threadIdx.x; i <= nc; i += NTHREADS)
            s_ub[i] = ub[d0 + i];
    }
    __syncthreads();
    int g = threadIdx.x >> 3, l8 = threadIdx.x & 7;
    for (int it = 0; it < UPB / 32; it++) {
        int64_t u = u0 + it * 32 + g;
        if (u >= total) return;
        const rw_moe_op *op;
        int64_t base;
        if (cached) {
            int j = 0;
            while (j + 1 < nc && s_ub[j + 1] <= u)
                j++;
            op = &s_ops[j];
            base = s_ub[j];
        } else {
            int d = find_op(ub, d0, s_d1, u);
            op = &ops[d];
            base = ub[d];
        }
        const rw_moe_op &o = *op;
        int64_t c0 = o.dst_c0, c1 = o.dst_c0 + o.cols;
        int64_t ch0 = c0 / 64, nch = (c1 - 1) / 64 - ch0 + 1;
        int64_t lu = u - base, row, ch;
        if (lu < 0xffffffffll && nch < 0xffffffffll) { /* 32-bit division where it fits */
            uint32_t a = (uint32_t)lu, b = (uint32_t)nch;
            row = a / b;
            ch = a % b;
        } else {
            row = lu / nch;
            ch = lu % nch;
        }
        int64_t k0 = (ch0 + ch) * 64 + l8 * 8;
        int64_t r = o.dst_r0 + row;
        int64_t n = map_row(o.dst, r);
        const uint8_t *srow = (const uint8_t *)(uintptr_t)o.src + row * o.src_ld * o.esize;
        if (o.kind == RW_MOE_OP_MXQ) {
            mxq8(o, srow, r, n, k0, c0, c1);
        } else if (o.esize == 2) {
            copy8<2>(o, srow, n, k0, c0, c1);
        } else if (o.esize == 1) {
            copy8<1>(o, srow, n, k0, c0, c1);
        } else {
            copy8<4>(o, srow, n, k0, c0, c1);
        }
    }
}

/* One 128x128 block per thread block: amax over the valid part, one fp32 scale, e4m3 values. */
__global__ void __launch_bounds__(NTHREADS) fp8q_kernel(const rw_moe_op *__restrict__ ops) {
    const rw_moe_op &o = ops[blockIdx.x];
    __shared__ uint32_t s_max[NTHREADS / 32];
    const uint8_t *src = (const uint8_t *)(uintptr_t)o.src;
    int rows = o.rows, cols = o.cols, n = rows * cols;
    uint32_t m = 0;
    for (int i = threadIdx.x; i < n; i += NTHREADS) {
        int r = i / cols, c = i % cols;
        uint32_t a = rw_f32_bits(load_f(src, o.esize, (int64_t)r * o.src_ld + c)) & 0x7fffffffu;
        m = a > m ? a : m;
    }
    for (int off = 16; off; off >>= 1) {
        uint32_t x = __shfl_xor_sync(0xffffffffu, m, off);
        m = x > m ? x : m;
    }
    if ((threadIdx.x & 31) == 0) s_max[threadIdx.x >> 5] = m;
    __syncthreads();
    m = 0;
    for (int w = 0; w < NTHREADS / 32; w++)
        m = s_max[w] > m ? s_max[w] : m;
    float s = rw_fp8_block_scale_from_amax(rw_bits_f32(m));
    if (threadIdx.x == 0) {
        float *scl = (float *)(uintptr_t)o.scl.base;
        scl[addr_of(o.scl, map_row(o.scl, o.dst_r0 / RW_FP8_BLOCK), o.dst_c0 / RW_FP8_BLOCK)] = s;
    }
    uint8_t *dst = (uint8_t *)(uintptr_t)o.dst.base;
    for (int i = threadIdx.x; i < n; i += NTHREADS) {
        int r = i / cols, c = i % cols;
        float v = load_f(src, o.esize, (int64_t)r * o.src_ld + c);
        dst[addr_of(o.dst, map_row(o.dst, o.dst_r0 + r), o.dst_c0 + c)] =
            rw_fp8_block_quantize_elem(v, s);
    }
}

/* Inverse of a COPY op: plain rectangle at o.src (row stride src_ld) <- target o.dst. */
__global__ void __launch_bounds__(NTHREADS)
    gather_kernel(const rw_moe_op *__restrict__ ops, const int64_t *__restrict__ ub, int nops,
                  int64_t total) {
    int64_t u = ((int64_t)blockIdx.x * NTHREADS + threadIdx.x) >> 3;
    int l8 = threadIdx.x & 7;
    if (u >= total) return;
    int d = find_op(ub, 0, nops - 1, u);
    const rw_moe_op &o = ops[d];
    int64_t c0 = o.dst_c0, c1 = o.dst_c0 + o.cols;
    int64_t ch0 = c0 / 64, nch = (c1 - 1) / 64 - ch0 + 1;
    int64_t lu = u - ub[d];
    int64_t row = lu / nch, k0 = (ch0 + lu % nch) * 64 + l8 * 8;
    int64_t n = map_row(o.dst, o.dst_r0 + row);
    uint8_t *orow = (uint8_t *)(uintptr_t)o.src + row * o.src_ld * o.esize;
    const uint8_t *pk = (const uint8_t *)(uintptr_t)o.dst.base;
    for (int j = 0; j < 8; j++) {
        int64_t k = k0 + j;
        if (k < c0 || k >= c1) continue;
        for (int b = 0; b < o.esize; b++)
            orow[(k - c0) * o.esize + b] = pk[addr_of(o.dst, n, k) * o.esize + b];
    }
}

extern "C" {

/* Loads the update kernels' module now. With lazy module loading (the CUDA default) the first
 * launch of a kernel loads its module, and a load waits for the device: during an NCCL update the
 * broadcast kernel of the bucket spins until the trainer sends it, which the trainer does only
 * after this rank replied, so a first scatter launch there would never return. The weight set
 * calls this when it is created on a device, before any receive can be posted. */
rw_status rw_moe_cuda_preload(int device, rw_err *err) {
    const void *fns[] = {(const void *)scatter_kernel, (const void *)fp8q_kernel,
                         (const void *)gather_kernel};
    int prev = 0;
    cudaError_t e = cudaGetDevice(&prev);
    if (e == cudaSuccess) e = cudaSetDevice(device);
    for (size_t i = 0; e == cudaSuccess && i < sizeof fns / sizeof fns[0]; i++) {
        cudaFuncAttributes a;
        e = cudaFuncGetAttributes(&a, fns[i]);
    }
    cudaSetDevice(prev);
    if (e != cudaSuccess) {
        char what[64];
        snprintf(what, sizeof what, "loading the layout kernels on device %d", device);
        return rw_cuda_fail(err, e, __FILE__, __LINE__, what);
    }
    return RW_OK;
}

rw_status rw_moe_scatter_cuda(const rw_moe_op *d_ops, const int64_t *d_unit_begin, size_t n,
                              int64_t total_units, rw_stream s, rw_err *err) {
    if (n == 0 || total_units == 0) return RW_OK;
    if (n > 0x7fffffff) RW_FAIL(err, RW_E_RANGE, "moe scatter: %zu ops in one launch", n);
    int64_t blocks = (total_units + UPB - 1) / UPB;
    if (blocks > 0x7fffffff)
        RW_FAIL(err, RW_E_RANGE, "moe scatter: %lld units", (long long)total_units);
    scatter_kernel<<<(unsigned)blocks, NTHREADS, 0, (cudaStream_t)s>>>(d_ops, d_unit_begin, (int)n,
                                                                       total_units);
    return RW_LAUNCH_CHECK(s, "moe scatter", err);
}

rw_status rw_moe_fp8q_cuda(const rw_moe_op *d_ops, size_t n, rw_stream s, rw_err *err) {
    if (n == 0) return RW_OK;
    if (n > 0x7fffffff) RW_FAIL(err, RW_E_RANGE, "moe fp8 quantize: %zu blocks", n);
    fp8q_kernel<<<(unsigned)n, NTHREADS, 0, (cudaStream_t)s>>>(d_ops);
    return RW_LAUNCH_CHECK(s, "moe fp8 block quantize", err);
}

rw_status rw_moe_copy2d(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width,
                        size_t rows, rw_stream s, rw_err *err) {
    if (!rows || !width) return RW_OK;
    RW_CUDA_CHECK(err, cudaMemcpy2DAsync(dst, dpitch, src, spitch, width, rows, cudaMemcpyDefault,
                                         (cudaStream_t)s));
    return RW_OK;
}

rw_status rw_moe_memset_dev(void *dst, int value, size_t bytes, rw_stream s, rw_err *err) {
    if (!bytes) return RW_OK;
    RW_CUDA_CHECK(err, cudaMemsetAsync(dst, value, bytes, (cudaStream_t)s));
    return RW_OK;
}

rw_status rw_moe_dev_alloc_async(size_t bytes, rw_stream s, void **out, rw_err *err) {
    *out = NULL;
    cudaError_t e = cudaMallocAsync(out, bytes ? bytes : 1, (cudaStream_t)s);
    if (e != cudaSuccess) {
        char what[64];
        snprintf(what, sizeof what, "cudaMallocAsync(%zu bytes)", bytes);
        return rw_cuda_fail(err, e, __FILE__, __LINE__, what);
    }
    return RW_OK;
}

void rw_moe_dev_free_async(void *p, rw_stream s) {
    if (p) cudaFreeAsync(p, (cudaStream_t)s);
}

rw_status rw_moe_slot_acquire(rw_moe_host_slot *sl, size_t bytes, rw_err *err) {
    if (sl->event) RW_CUDA_CHECK(err, cudaEventSynchronize((cudaEvent_t)sl->event));
    if (sl->cap < bytes) {
        size_t cap = sl->cap ? sl->cap : 1 << 16;
        while (cap < bytes)
            cap *= 2;
        if (sl->host) cudaFreeHost(sl->host);
        sl->host = NULL;
        sl->cap = 0;
        cudaError_t e = cudaMallocHost(&sl->host, cap);
        if (e != cudaSuccess) {
            sl->host = NULL;
            char what[64];
            snprintf(what, sizeof what, "cudaMallocHost(%zu bytes)", cap);
            return rw_cuda_fail(err, e, __FILE__, __LINE__, what);
        }
        sl->cap = cap;
    }
    return RW_OK;
}

rw_status rw_moe_slot_release(rw_moe_host_slot *sl, rw_stream s, rw_err *err) {
    if (!sl->event) {
        cudaEvent_t ev;
        RW_CUDA_CHECK(err, cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
        sl->event = ev;
    }
    RW_CUDA_CHECK(err, cudaEventRecord((cudaEvent_t)sl->event, (cudaStream_t)s));
    return RW_OK;
}

void rw_moe_slot_free(rw_moe_host_slot *sl) {
    if (!sl) return;
    if (sl->event) {
        cudaEventSynchronize((cudaEvent_t)sl->event);
        cudaEventDestroy((cudaEvent_t)sl->event);
    }
    if (sl->host) cudaFreeHost(sl->host);
    memset(sl, 0, sizeof *sl);
}

/* Uploads `n` ops with their unit prefix and runs the scatter (gather = false) or its inverse.
 * The host table is freed only after the stream has consumed it. */
static rw_status run_table(const rw_moe_op *ops, size_t n, bool gather, rw_stream s, rw_err *err) {
    size_t osz = sizeof(rw_moe_op), tb = n * osz + (n + 1) * 8;
    uint8_t *h = (uint8_t *)malloc(tb);
    if (!h) RW_FAIL(err, RW_E_OOM, "out of memory for %zu ops", n);
    memcpy(h, ops, n * osz);
    int64_t *ub = (int64_t *)(h + n * osz), acc = 0;
    for (size_t i = 0; i < n; i++) {
        ub[i] = acc;
        acc += rw_moe_op_units(&ops[i]);
    }
    ub[n] = acc;
    void *d = NULL;
    rw_status st = rw_moe_dev_alloc_async(tb, s, &d, err);
    if (st == RW_OK) {
        cudaError_t e = cudaMemcpyAsync(d, h, tb, cudaMemcpyHostToDevice, (cudaStream_t)s);
        if (e != cudaSuccess)
            st = rw_cuda_fail(err, e, __FILE__, __LINE__, "cudaMemcpyAsync (op table)");
    }
    if (st == RW_OK) {
        const rw_moe_op *dops = (const rw_moe_op *)d;
        const int64_t *dub = (const int64_t *)((uint8_t *)d + n * osz);
        if (!gather) {
            st = rw_moe_scatter_cuda(dops, dub, n, acc, s, err);
        } else if (acc) {
            int64_t blocks = (acc * 8 + NTHREADS - 1) / NTHREADS;
            gather_kernel<<<(unsigned)blocks, NTHREADS, 0, (cudaStream_t)s>>>(dops, dub, (int)n,
                                                                              acc);
            st = RW_LAUNCH_CHECK(s, "moe unpack gather", err);
        }
    }
    if (d) rw_moe_dev_free_async(d, s);
    cudaError_t e = cudaStreamSynchronize((cudaStream_t)s); /* h is read by the async copy */
    free(h);
    if (st == RW_OK && e != cudaSuccess) st = rw_cuda_fail(err, e, __FILE__, __LINE__, "moe pack");
    return st;
}

/* One COPY op per expert matrix (and one for its mxfp8 scales). */
static rw_status pack_ops(rw_wfmt f, rw_moe_mat m, int64_t P, int64_t H, int64_t ne,
                          const void *logical, const void *logical_scale, void *packed,
                          void *packed_scale, bool gather, rw_stream s, rw_err *err) {
    int64_t rows = m == RW_MOE_W13 ? 2 * P : H, cols = m == RW_MOE_W13 ? H : P;
    size_t pb = rw_moe_packed_bytes(f, m, P, H), psb = rw_moe_packed_scale_bytes(f, m, P, H);
    size_t lsb = f == RW_WFMT_MXFP8 ? (size_t)(rows * (cols / RW_MXFP8_BLOCK)) : 0;
    int es = f == RW_WFMT_BF16 ? 2 : 1;
    size_t per = f == RW_WFMT_MXFP8 ? 2 : 1;
    rw_moe_op *ops = (rw_moe_op *)calloc((size_t)ne * per + 1, sizeof *ops);
    if (!ops) RW_FAIL(err, RW_E_OOM, "out of memory for pack ops");
    size_t n = 0;
    for (int64_t e = 0; e < ne; e++) {
        rw_moe_tgt td, ts;
        rw_moe_expert_tgt(f, m, P, H, (uint8_t *)packed + e * pb,
                          packed_scale ? (uint8_t *)packed_scale + e * psb : NULL, &td, &ts);
        rw_moe_op *o = &ops[n++];
        o->kind = RW_MOE_OP_COPY;
        o->esize = es;
        o->src = (uint64_t)(uintptr_t)((const uint8_t *)logical + e * pb);
        o->src_ld = cols;
        o->dst = td;
        o->rows = (int32_t)rows;
        o->cols = (int32_t)cols;
        if (f == RW_WFMT_MXFP8) {
            o = &ops[n++];
            o->kind = RW_MOE_OP_COPY;
            o->esize = 1;
            o->src = (uint64_t)(uintptr_t)((const uint8_t *)logical_scale + e * lsb);
            o->src_ld = cols / RW_MXFP8_BLOCK;
            o->dst = ts;
            o->rows = (int32_t)rows;
            o->cols = (int32_t)(cols / RW_MXFP8_BLOCK);
        }
    }
    rw_status st = run_table(ops, n, gather, s, err);
    free(ops);
    return st;
}

rw_status rw_moe_pack_cuda(rw_wfmt f, rw_moe_mat m, int64_t P, int64_t H, int64_t n_experts,
                           const void *logical, const void *logical_scale, void *packed,
                           void *packed_scale, rw_stream s, rw_err *err) {
    if (P % 128 || H % 64 || P <= 0 || H <= 0 || n_experts < 0)
        RW_FAIL(err, RW_E_SHAPE, "moe pack: P = %lld (multiple of 128), H = %lld (of 64)",
                (long long)P, (long long)H);
    size_t pb = rw_moe_packed_bytes(f, m, P, H), psb = rw_moe_packed_scale_bytes(f, m, P, H);
    if (f == RW_WFMT_FP8_BLOCK) {
        RW_CUDA_CHECK(err, cudaMemcpyAsync(packed, logical, pb * (size_t)n_experts,
                                           cudaMemcpyDeviceToDevice, (cudaStream_t)s));
        RW_CUDA_CHECK(err, cudaMemcpyAsync(packed_scale, logical_scale, psb * (size_t)n_experts,
                                           cudaMemcpyDeviceToDevice, (cudaStream_t)s));
        return RW_OK;
    }
    if (f == RW_WFMT_MXFP8) /* the swizzle padding is zero */
        RW_CHECK(rw_moe_memset_dev(packed_scale, 0, psb * (size_t)n_experts, s, err));
    return pack_ops(f, m, P, H, n_experts, logical, logical_scale, packed, packed_scale, false, s,
                    err);
}

rw_status rw_moe_unpack_cuda(rw_wfmt f, rw_moe_mat m, int64_t P, int64_t H, int64_t n_experts,
                             const void *packed, const void *packed_scale, void *logical,
                             void *logical_scale, rw_stream s, rw_err *err) {
    if (P % 128 || H % 64 || P <= 0 || H <= 0 || n_experts < 0)
        RW_FAIL(err, RW_E_SHAPE, "moe unpack: P = %lld (multiple of 128), H = %lld (of 64)",
                (long long)P, (long long)H);
    size_t pb = rw_moe_packed_bytes(f, m, P, H), psb = rw_moe_packed_scale_bytes(f, m, P, H);
    if (f == RW_WFMT_FP8_BLOCK) {
        RW_CUDA_CHECK(err, cudaMemcpyAsync(logical, packed, pb * (size_t)n_experts,
                                           cudaMemcpyDeviceToDevice, (cudaStream_t)s));
        RW_CUDA_CHECK(err, cudaMemcpyAsync(logical_scale, packed_scale, psb * (size_t)n_experts,
                                           cudaMemcpyDeviceToDevice, (cudaStream_t)s));
        return RW_OK;
    }
    /* the gather reads the packed side through the op's target and writes the plain side */
    return pack_ops(f, m, P, H, n_experts, logical, logical_scale, (void *)packed,
                    (void *)packed_scale, true, s, err);
}

} /* extern "C" */
