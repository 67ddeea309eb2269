/* moe_layout.h - the moe module's op-level interface, below rw_moe.h: targets (how a logical
 * matrix is addressed in its final layout) and scatter ops (one rectangle of source elements -> one
 * target, copying or quantizing), executed by the CPU reference (rw_moe_ops_run_ref) or the CUDA
 * scatter (pack.cu) with byte-identical results. The weight set turns every incoming piece into a
 * list of ops; the whole-matrix pack kernels are one op per expert matrix. Outside the module
 * only the layout tests and rw-bench's pack benchmark (tools/bench/pack.c, which times the
 * scatter on ops of its own) include it; the other modules use rw_moe.h.
 *
 * Compiles as C11 and as CUDA C++.
 */
#ifndef RW_MOE_LAYOUT_H
#define RW_MOE_LAYOUT_H

#include "rw_moe.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Row maps applied to a target's logical row r before addressing (docs/LAYOUT.md section 3). */
enum {
    RW_MOE_RM_IDENT = 0, /* n = r */
    RW_MOE_RM_W13 = 1,   /* n = rw_moe_w13_row_map(r, P): up-first interleave + 32-row shuffle */
    RW_MOE_RM_SHUF = 2,  /* n = rw_moe_row_shuffle(r): w2 (and its scale rows) */
};

/* Address modes: element offset of (mapped row n, column k). */
enum {
    RW_MOE_AD_ROWS = 0,   /* n * ld + k (row-major, ld elements per row) */
    RW_MOE_AD_KBLOCK = 1, /* ((k / 64) * ld + n) * 64 + k % 64 (ld = M rows): bf16 K blocks */
    RW_MOE_AD_SWZ = 2,    /* rw_moe_scale_swizzle(n, k, ld) (ld = Kt): 128x4 scale swizzle */
};

/* A target matrix: where logical element (r, k) lives. `base` is a host or device address. */
typedef struct rw_moe_tgt {
    uint64_t base;
    int64_t ld; /* ROWS: row length; KBLOCK: M; SWZ: Kt = ceil(scale cols / 4) */
    int64_t P;  /* W13 row map only */
    int32_t rowmap, addr;
} rw_moe_tgt;

RW_HD int64_t rw_moe_tgt_offset(const rw_moe_tgt *t, int64_t r, int64_t k) {
    int64_t n = t->rowmap == RW_MOE_RM_W13    ? rw_moe_w13_row_map(r, t->P)
                : t->rowmap == RW_MOE_RM_SHUF ? rw_moe_row_shuffle(r)
                                              : r;
    if (t->addr == RW_MOE_AD_KBLOCK) return rw_moe_kblock_offset(n, k, t->ld);
    if (t->addr == RW_MOE_AD_SWZ) return rw_moe_scale_swizzle(n, k, t->ld);
    return n * t->ld + k;
}

/* Op kinds. */
enum {
    RW_MOE_OP_COPY = 0, /* dst(r0 + i, c0 + j) = src[i, j]; elements of esize 1, 2 or 4 bytes */
    RW_MOE_OP_MXQ = 1,  /* bf16 (esize 2) or f32 (esize 4) -> e4m3 at dst, UE8M0 per 32 columns at
                           scl (r0 + i, (c0 + j) / 32); c0 and cols are multiples of 32 */
    RW_MOE_OP_FP8Q = 2, /* one 128x128 block: rows, cols <= 128 (its valid part), bf16 or f32 ->
                           e4m3 at dst, one f32 scale at scl (r0 / 128, c0 / 128) */
};

/* One scatter op: a rows x cols rectangle of source elements (row stride src_ld elements) that
 * lands at logical (dst_r0, dst_c0) of the target. Plain data, copied to the device as is. */
typedef struct rw_moe_op {
    uint64_t src;
    int64_t src_ld;
    rw_moe_tgt dst;
    rw_moe_tgt scl;
    int64_t dst_r0, dst_c0;
    int32_t kind, esize;
    int32_t rows, cols;
} rw_moe_op;
/* The CUDA scatter copies ops to shared memory as 8-byte words; the layout is fixed. */
#ifdef __cplusplus
static_assert(sizeof(rw_moe_op) == 112, "rw_moe_op layout");
#else
_Static_assert(sizeof(rw_moe_op) == 112, "rw_moe_op layout");
#endif

/* Work units of a scatter op on the device: one unit = one row x one 64-column chunk of the
 * destination (the chunks the op's columns [c0, c0 + cols) touch). FP8Q ops are one block each
 * and run in their own kernel. */
static inline int64_t rw_moe_op_units(const rw_moe_op *o) {
    if (o->rows <= 0 || o->cols <= 0) return 0;
    int64_t c0 = o->dst_c0, c1 = o->dst_c0 + o->cols - 1;
    return (int64_t)o->rows * (c1 / 64 - c0 / 64 + 1);
}

/* CPU reference of the scatter and FP8Q kernels: runs the ops in order on host memory. */
void rw_moe_ops_run_ref(const rw_moe_op *ops, size_t n);

/* The targets of one expert's matrix in a packed layer buffer: `data` at `packed` (expert
 * base), `scale` at `packed_scale` (expert base; unused for bf16). Formats per docs/LAYOUT.md
 * section 3. */
void rw_moe_expert_tgt(rw_wfmt f, rw_moe_mat m, int64_t P, int64_t H, void *packed,
                       void *packed_scale, rw_moe_tgt *data, rw_moe_tgt *scale);

/* --- device side (pack.cu; RW_E_NO_DEVICE without CUDA) ------------------------------------ */

/* Runs the COPY / MXQ ops `d_ops[0..n)` (device memory) with `d_unit_begin[0..n]` the exclusive
 * prefix sum of rw_moe_op_units (device memory, d_unit_begin[n] = total units). */
rw_status rw_moe_scatter_cuda(const rw_moe_op *d_ops, const int64_t *d_unit_begin, size_t n,
                              int64_t total_units, rw_stream s, rw_err *err);
/* Runs FP8Q ops (device memory), one thread block per op. */
rw_status rw_moe_fp8q_cuda(const rw_moe_op *d_ops, size_t n, rw_stream s, rw_err *err);
/* Loads the scatter / fp8q / gather kernels (see pack.cu); RW_E_NO_DEVICE without CUDA. */
rw_status rw_moe_cuda_preload(int device, rw_err *err);
/* 2-D copy between any places: `rows` rows of `width` bytes, pitches in bytes, async on s. */
rw_status rw_moe_copy2d(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width,
                        size_t rows, rw_stream s, rw_err *err);
rw_status rw_moe_memset_dev(void *dst, int value, size_t bytes, rw_stream s, rw_err *err);

/* Stream-ordered device allocation (cudaMallocAsync / cudaFreeAsync): memory for one batch's
 * tables and uploads that is freed on the stream after the kernels that read it. */
rw_status rw_moe_dev_alloc_async(size_t bytes, rw_stream s, void **out, rw_err *err);
void rw_moe_dev_free_async(void *p, rw_stream s);

/* A pinned host buffer guarded by an event: before the host rewrites it, it waits until the
 * device has consumed its previous contents (the copy that read it was queued before the event).
 * The weight set alternates two slots so the host rarely waits. */
typedef struct rw_moe_host_slot {
    void *host; /* pinned */
    size_t cap;
    void *event; /* cudaEvent_t; NULL before first use */
} rw_moe_host_slot;
rw_status rw_moe_slot_acquire(rw_moe_host_slot *sl, size_t bytes, rw_err *err);
rw_status rw_moe_slot_release(rw_moe_host_slot *sl, rw_stream s, rw_err *err);
void rw_moe_slot_free(rw_moe_host_slot *sl);

#ifdef __cplusplus
}
#endif

#endif /* RW_MOE_LAYOUT_H */
