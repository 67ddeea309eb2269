/* pack.c - the padded MoE layout of docs/LAYOUT.md section 3 on the host: packed sizes, the
 * whole-matrix pack / unpack references written straight from the spec's formulas, the targets
 * of one expert matrix, and the CPU reference of the scatter ops (moe_layout.h) that the CUDA
 * scatter in pack.cu must match byte for byte. */
#include "moe_layout.h"

#include <stdlib.h>

size_t rw_moe_packed_bytes(rw_wfmt f, rw_moe_mat m, int64_t P, int64_t H) {
    size_t n = (size_t)(m == RW_MOE_W13 ? 2 * P : P) * (size_t)H;
    return f == RW_WFMT_BF16 ? 2 * n : n;
}

size_t rw_moe_packed_scale_bytes(rw_wfmt f, rw_moe_mat m, int64_t P, int64_t H) {
    int64_t rows = m == RW_MOE_W13 ? 2 * P : H, cols = m == RW_MOE_W13 ? H : P;
    switch (f) {
    case RW_WFMT_MXFP8: /* [roundup(rows, 128), roundup(cols / 32, 4)] bytes, swizzled */
        return (size_t)rw_roundup(rows, 128) * (size_t)rw_roundup(cols / RW_MXFP8_BLOCK, 4);
    case RW_WFMT_FP8_BLOCK: /* fp32 [ceil(rows / 128), ceil(cols / 128)] */
        return 4 * (size_t)((rows + RW_FP8_BLOCK - 1) / RW_FP8_BLOCK) *
               (size_t)((cols + RW_FP8_BLOCK - 1) / RW_FP8_BLOCK);
    default: return 0;
    }
}

void rw_moe_pack_ref(rw_wfmt f, rw_moe_mat m, int64_t P, int64_t H, const void *logical,
                     const void *logical_scale, void *packed, void *packed_scale) {
    int64_t rows = m == RW_MOE_W13 ? 2 * P : H, cols = m == RW_MOE_W13 ? H : P;
    if (f == RW_WFMT_FP8_BLOCK) {
        memcpy(packed, logical, rw_moe_packed_bytes(f, m, P, H));
        memcpy(packed_scale, logical_scale, rw_moe_packed_scale_bytes(f, m, P, H));
        return;
    }
    for (int64_t r = 0; r < rows; r++) {
        int64_t n = m == RW_MOE_W13 ? rw_moe_w13_row_map(r, P) : rw_moe_row_shuffle(r);
        if (f == RW_WFMT_BF16) {
            const uint16_t *x = (const uint16_t *)logical + r * cols;
            uint16_t *y = packed;
            for (int64_t k = 0; k < cols; k++)
                y[rw_moe_kblock_offset(n, k, rows)] = x[k];
        } else {
            memcpy((uint8_t *)packed + n * cols, (const uint8_t *)logical + r * cols, (size_t)cols);
        }
    }
    if (f == RW_WFMT_MXFP8) {
        int64_t sc = cols / RW_MXFP8_BLOCK, Kt = (sc + 3) / 4;
        memset(packed_scale, 0, rw_moe_packed_scale_bytes(f, m, P, H)); /* swizzle padding */
        const uint8_t *s = logical_scale;
        uint8_t *d = packed_scale;
        for (int64_t r = 0; r < rows; r++) {
            int64_t n = m == RW_MOE_W13 ? rw_moe_w13_row_map(r, P) : rw_moe_row_shuffle(r);
            for (int64_t j = 0; j < sc; j++)
                d[rw_moe_scale_swizzle(n, j, Kt)] = s[r * sc + j];
        }
    }
}

void rw_moe_unpack_ref(rw_wfmt f, rw_moe_mat m, int64_t P, int64_t H, const void *packed,
                       const void *packed_scale, void *logical, void *logical_scale) {
    int64_t rows = m == RW_MOE_W13 ? 2 * P : H, cols = m == RW_MOE_W13 ? H : P;
    if (f == RW_WFMT_FP8_BLOCK) {
        memcpy(logical, packed, rw_moe_packed_bytes(f, m, P, H));
        memcpy(logical_scale, packed_scale, rw_moe_packed_scale_bytes(f, m, P, H));
        return;
    }
    for (int64_t r = 0; r < rows; r++) {
        int64_t n = m == RW_MOE_W13 ? rw_moe_w13_row_map(r, P) : rw_moe_row_shuffle(r);
        if (f == RW_WFMT_BF16) {
            const uint16_t *y = packed;
            uint16_t *x = (uint16_t *)logical + r * cols;
            for (int64_t k = 0; k < cols; k++)
                x[k] = y[rw_moe_kblock_offset(n, k, rows)];
        } else {
            memcpy((uint8_t *)logical + r * cols, (const uint8_t *)packed + n * cols, (size_t)cols);
        }
    }
    if (f == RW_WFMT_MXFP8) {
        int64_t sc = cols / RW_MXFP8_BLOCK, Kt = (sc + 3) / 4;
        const uint8_t *s = packed_scale;
        uint8_t *d = logical_scale;
        for (int64_t r = 0; r < rows; r++) {
            int64_t n = m == RW_MOE_W13 ? rw_moe_w13_row_map(r, P) : rw_moe_row_shuffle(r);
            for (int64_t j = 0; j < sc; j++)
                d[r * sc + j] = s[rw_moe_scale_swizzle(n, j, Kt)];
        }
    }
}

void rw_moe_expert_tgt(rw_wfmt f, rw_moe_mat m, int64_t P, int64_t H, void *packed,
                       void *packed_scale, rw_moe_tgt *data, rw_moe_tgt *scale) {
    bool w13 = m == RW_MOE_W13;
    int64_t rows = w13 ? 2 * P : H, cols = w13 ? H : P;
    int32_t rm = w13 ? RW_MOE_RM_W13 : RW_MOE_RM_SHUF;
    memset(data, 0, sizeof *data);
    memset(scale, 0, sizeof *scale);
    data->base = (uint64_t)(uintptr_t)packed;
    data->P = P;
    scale->base = (uint64_t)(uintptr_t)packed_scale;
    scale->P = P;
    switch (f) {
    case RW_WFMT_BF16:
        data->rowmap = rm;
        data->addr = RW_MOE_AD_KBLOCK;
        data->ld = rows;
        break;
    case RW_WFMT_MXFP8:
        data->rowmap = rm;
        data->addr = RW_MOE_AD_ROWS;
        data->ld = cols;
        scale->rowmap = rm;
        scale->addr = RW_MOE_AD_SWZ;
        scale->ld = (cols / RW_MXFP8_BLOCK + 3) / 4;
        break;
    case RW_WFMT_FP8_BLOCK:
        data->rowmap = RW_MOE_RM_IDENT;
        data->addr = RW_MOE_AD_ROWS;
        data->ld = cols;
        scale->rowmap = RW_MOE_RM_IDENT;
        scale->addr = RW_MOE_AD_ROWS;
        scale->ld = (cols + RW_FP8_BLOCK - 1) / RW_FP8_BLOCK;
        break;
    }
}

/* --- CPU reference of the scatter ops -------------------------------------------------------- */

/* Source element idx as fp32: bf16 (esize 2) widened exactly, or fp32 (esize 4). */
static float load_f32(const uint8_t *src, int esize, int64_t idx) {
    if (esize == 2) {
        uint16_t h;
        memcpy(&h, src + 2 * idx, 2);
        return rw_bf16_to_f32(h);
    }
    float v;
    memcpy(&v, src + 4 * idx, 4);
    return v;
}

/* Block amax on the magnitude bits (NaN above inf above every finite value), as quant.c does. */
static uint32_t mag_bits(float v) {
    return rw_f32_bits(v) & 0x7fffffffu;
}

static int64_t map_row(const rw_moe_tgt *t, int64_t r) {
    return t->rowmap == RW_MOE_RM_W13    ? rw_moe_w13_row_map(r, t->P)
           : t->rowmap == RW_MOE_RM_SHUF ? rw_moe_row_shuffle(r)
                                         : r;
}

static int64_t addr_of(const rw_moe_tgt *t, int64_t n, int64_t k) {
    if (t->addr == RW_MOE_AD_KBLOCK) return rw_moe_kblock_offset(n, k, t->ld);
    if (t->addr == RW_MOE_AD_SWZ) return rw_moe_scale_swizzle(n, k, t->ld);
    return n * t->ld + k;
}

static void run_copy(const rw_moe_op *o) {
    const uint8_t *src = (const uint8_t *)(uintptr_t)o->src;
    uint8_t *dst = (uint8_t *)(uintptr_t)o->dst.base;
    size_t es = (size_t)o->esize;
    for (int64_t i = 0; i < o->rows; i++) {
        int64_t n = map_row(&o->dst, o->dst_r0 + i);
        const uint8_t *s = src + (size_t)(i * o->src_ld) * es;
        for (int64_t j = 0; j < o->cols;) {
            int64_t k = o->dst_c0 + j;
            /* columns stay contiguous to the end of the row (ROWS), of the 64-element K block
             * (KBLOCK), or of the group of 4 (SWZ) */
            int64_t run = o->dst.addr == RW_MOE_AD_ROWS     ? o->cols - j
                          : o->dst.addr == RW_MOE_AD_KBLOCK ? 64 - k % 64
                                                            : 4 - k % 4;
            if (run > o->cols - j) run = o->cols - j;
            memcpy(dst + (size_t)addr_of(&o->dst, n, k) * es, s + (size_t)j * es, (size_t)run * es);
            j += run;
        }
    }
}

static void run_mxq(const rw_moe_op *o) {
    const uint8_t *src = (const uint8_t *)(uintptr_t)o->src;
    uint8_t *dst = (uint8_t *)(uintptr_t)o->dst.base, *scl = (uint8_t *)(uintptr_t)o->scl.base;
    for (int64_t i = 0; i < o->rows; i++) {
        for (int64_t b = 0; b < o->cols / RW_MXFP8_BLOCK; b++) {
            int64_t j0 = b * RW_MXFP8_BLOCK;
            uint32_t m = 0;
            for (int64_t j = j0; j < j0 + RW_MXFP8_BLOCK; j++) {
                uint32_t a = mag_bits(load_f32(src, o->esize, i * o->src_ld + j));
                if (a > m) m = a;
            }
            uint8_t s = rw_mxfp8_scale_from_amax(rw_bits_f32(m));
            int64_t r = o->dst_r0 + i;
            scl[addr_of(&o->scl, map_row(&o->scl, r), (o->dst_c0 + j0) / RW_MXFP8_BLOCK)] = s;
            int64_t n = map_row(&o->dst, r);
            for (int64_t j = j0; j < j0 + RW_MXFP8_BLOCK; j++)
                dst[addr_of(&o->dst, n, o->dst_c0 + j)] =
                    rw_mxfp8_quantize_elem(load_f32(src, o->esize, i * o->src_ld + j), s);
        }
    }
}

static void run_fp8q(const rw_moe_op *o) {
    const uint8_t *src = (const uint8_t *)(uintptr_t)o->src;
    uint8_t *dst = (uint8_t *)(uintptr_t)o->dst.base;
    uint32_t m = 0;
    for (int64_t i = 0; i < o->rows; i++)
        for (int64_t j = 0; j < o->cols; j++) {
            uint32_t a = mag_bits(load_f32(src, o->esize, i * o->src_ld + j));
            if (a > m) m = a;
        }
    float s = rw_fp8_block_scale_from_amax(rw_bits_f32(m));
    float *scl = (float *)(uintptr_t)o->scl.base;
    scl[rw_moe_tgt_offset(&o->scl, o->dst_r0 / RW_FP8_BLOCK, o->dst_c0 / RW_FP8_BLOCK)] = s;
    for (int64_t i = 0; i < o->rows; i++)
        for (int64_t j = 0; j < o->cols; j++)
            dst[rw_moe_tgt_offset(&o->dst, o->dst_r0 + i, o->dst_c0 + j)] =
                rw_fp8_block_quantize_elem(load_f32(src, o->esize, i * o->src_ld + j), s);
}

void rw_moe_ops_run_ref(const rw_moe_op *ops, size_t n) {
    for (size_t i = 0; i < n; i++) {
        switch (ops[i].kind) {
        case RW_MOE_OP_COPY: run_copy(&ops[i]); break;
        case RW_MOE_OP_MXQ: run_mxq(&ops[i]); break;
        case RW_MOE_OP_FP8Q: run_fp8q(&ops[i]); break;
        }
    }
}

#ifndef RW_HAVE_CUDA
rw_status rw_moe_cuda_preload(int device, rw_err *err) {
    (void)device;
    RW_FAIL(err, RW_E_NO_DEVICE, "moe kernels: built without CUDA");
}
rw_status rw_moe_scatter_cuda(const rw_moe_op *d_ops, const int64_t *d_unit_begin, size_t n,
                              int64_t total_units, rw_stream s, rw_err *err) {
    RW_FAIL(err, RW_E_NO_DEVICE, "moe scatter: built without CUDA");
}
rw_status rw_moe_fp8q_cuda(const rw_moe_op *d_ops, size_t n, rw_stream s, rw_err *err) {
    RW_FAIL(err, RW_E_NO_DEVICE, "moe fp8 block quantize: built without CUDA");
}
rw_status rw_moe_copy2d(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width,
                        size_t rows, rw_stream s, rw_err *err) {
    RW_FAIL(err, RW_E_NO_DEVICE, "moe 2-D copy: built without CUDA");
}
rw_status rw_moe_memset_dev(void *dst, int value, size_t bytes, rw_stream s, rw_err *err) {
    RW_FAIL(err, RW_E_NO_DEVICE, "moe device memset: built without CUDA");
}
rw_status rw_moe_dev_alloc_async(size_t bytes, rw_stream s, void **out, rw_err *err) {
    *out = NULL;
    RW_FAIL(err, RW_E_NO_DEVICE, "moe device allocation of %zu bytes: built without CUDA", bytes);
}
void rw_moe_dev_free_async(void *p, rw_stream s) {
    (void)p;
    (void)s;
}
rw_status rw_moe_slot_acquire(rw_moe_host_slot *sl, size_t bytes, rw_err *err) {
    RW_FAIL(err, RW_E_NO_DEVICE, "moe pinned scratch: built without CUDA");
}
rw_status rw_moe_slot_release(rw_moe_host_slot *sl, rw_stream s, rw_err *err) {
    RW_FAIL(err, RW_E_NO_DEVICE, "moe pinned scratch: built without CUDA");
}
void rw_moe_slot_free(rw_moe_host_slot *sl) {
    (void)sl;
}
rw_status rw_moe_pack_cuda(rw_wfmt f, rw_moe_mat m, int64_t P, int64_t H, int64_t n_experts,
                           const void *logical, const void *logical_scale, void *packed,
                           void *packed_scale, rw_stream s, rw_err *err) {
    RW_FAIL(err, RW_E_NO_DEVICE, "rw_moe_pack_cuda: built without CUDA");
}
rw_status rw_moe_unpack_cuda(rw_wfmt f, rw_moe_mat m, int64_t P, int64_t H, int64_t n_experts,
                             const void *packed, const void *packed_scale, void *logical,
                             void *logical_scale, rw_stream s, rw_err *err) {
    RW_FAIL(err, RW_E_NO_DEVICE, "rw_moe_unpack_cuda: built without CUDA");
}
#endif
