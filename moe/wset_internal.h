/* wset_internal.h - private to the weight set (wset*.c): the units it tracks, their geometry, the
 * per-unit staging of partly covered quantization blocks, and the build of one batch's scatter
 * ops. Not part of the moe module's API; the files that share it are
 *   wset.c        create, geometry of a unit, coverage, accessors, completeness
 *   wset_apply.c  piece validation, cutting a piece into scatter ops
 *   wset_stage.c  host staging of partly covered quantization blocks and their flush
 *   wset_batch.c  batch prepare / launch (the op table, host or device execution)
 *   wset_read.c   canonical readback and checksums
 */
#ifndef RW_WSET_INTERNAL_H
#define RW_WSET_INTERNAL_H

#include "moe_layout.h"

/* ------------------------------------------------------------------------------------------ */
/* Units                                                                                        */
/* ------------------------------------------------------------------------------------------ */
/* Unit ids: 0 embed, 1 lm_head, 2 final norm, then per layer NSLOT fixed slots followed by six
 * per expert (gate, up, down, and their scales). */
enum { U_EMBED = 0, U_LM_HEAD = 1, U_FINAL_NORM = 2, U_GLOBAL = 3 };
enum {
    SL_IN_NORM,
    SL_POST_NORM,
    SL_Q_NORM,
    SL_K_NORM,
    SL_ROUTER,
    SL_Q,
    SL_K,
    SL_V,
    SL_O,
    SL_QS,
    SL_KS,
    SL_VS,
    SL_OS,
    NSLOT
};
enum { X_GATE, X_UP, X_DOWN, X_GATE_S, X_UP_S, X_DOWN_S, NX };

typedef struct rect {
    int64_t r0, r1, c0, c1;
} rect;

/* Host staging of a weight unit whose quantization blocks arrive in parts. Local coordinates of
 * the unit's unpadded slice [rows, cols]. Buffers are allocated on first use: an fp8 checkpoint
 * waiting for its scales holds 1 byte per element, bf16 parts 4. */
typedef struct stage {
    int64_t rows, cols;
    float *val;     /* [rows, cols] values known (bf16 widened, or dequantized) */
    uint64_t *have; /* bitmap over val */
    uint8_t *raw;   /* [rows, cols] e4m3 of an fp8 checkpoint waiting for its scale */
    uint64_t *have_raw;
    float *gs; /* canonical fp8 scale blocks [gs_r0, +gs_rows) x [gs_c0, +gs_cols) */
    uint64_t *have_gs;
    int64_t gs_r0, gs_c0, gs_rows, gs_cols;
    rect dirty; /* region touched since the last flush */
    bool is_dirty;
} stage;

typedef struct unit {
    rect *cov; /* written rectangles, local coords (scale units: scale coords) */
    uint32_t ncov, capcov;
    stage *st;
} unit;

typedef struct opvec {
    rw_moe_op *v;
    size_t n, cap;
} opvec;

struct rw_wset {
    rw_config cfg;
    rw_tp_dims d;
    rw_place place;
    int device;
    rw_arena *arena;
    rw_layer_weights *layers; /* [L] */
    rw_tensor embed, lm_head, final_norm;
    size_t nunits;
    unit *units;
    rw_moe_host_slot slots[2];
    int slot_next;
    struct rw_wset_batch *own; /* rw_wset_apply_batch's batch (its memory is reused) */
    uint64_t gen;              /* rw_wset_generation */
};

static inline size_t wset_per_layer(const rw_wset *ws) {
    return NSLOT + NX * (size_t)ws->cfg.num_experts;
}

static inline int64_t wset_cdiv(int64_t a, int64_t b) {
    return (a + b - 1) / b;
}

/* Geometry of a unit: the canonical weight as a matrix, this rank's slice of it, and where the
 * local elements live. */
typedef struct geom {
    rw_wname w; /* the weight (scale = false) */
    bool scale; /* the unit is the weight's quantization scale */
    bool present;
    rw_wfmt fmt;
    int64_t R, C; /* canonical weight matrix (1-D tensors as 1 x n) */
    int sdim;     /* sliced matrix dim: 0 rows, 1 cols, -1 none */
    int64_t s0, s1;
    int64_t vr, vc; /* local unpadded extent of the weight */
    int64_t dst_r0; /* logical target row of local row 0 (P for a gate half) */
    rw_moe_tgt data, scl;
    uint64_t data_base, scl_base; /* memory of the target (for readback) */
    size_t data_bytes, scl_bytes;
    bool aligned; /* fp8: local 128x128 blocks coincide with the canonical ones */
} geom;

/* What a validated piece is. */
typedef struct pinfo {
    rw_wname w;
    rw_wfmt fmt; /* storage format of the tensor on this rank */
    int ndim;
    int64_t shape[RW_MAX_DIMS]; /* canonical shape of the named tensor (scale shape for scales) */
} pinfo;

typedef struct build {
    rw_wset *ws;
    rw_stream s;
    opvec direct, fp8q, flush; /* flush ops hold offsets into flushbuf until rebased */
    uint8_t *flushbuf;
    size_t flush_len, flush_cap;
    size_t *touched; /* units whose stage changed in this batch */
    size_t ntouched, captouched;
    /* host pieces of a device set: the rectangles the ops read, gathered into the pinned table
     * upload (only this rank's part of each piece crosses to the device) */
    struct upl {
        const uint8_t *host;
        int64_t rows, cols, ld;
        int es;
        size_t off; /* in the upload area */
        bool fp8q;  /* the op is in fp8q (else direct) */
        size_t idx; /* its index there */
    } * up;
    size_t nup, capup, up_bytes;
    /* the bytes of device pieces may not be read yet (they arrive on a stream after the host
     * work): a part that would have to be copied to the host stops the build (needs_reads) */
    bool no_dev_reads, needs_reads;
} build;

/* A piece's part of one canonical matrix: rows [r0, r1) x cols [c0, c1) of the weight (or, for
 * a scale piece, of the scale matrix). Element (r0, c0) is at byte `off` of the piece. */
typedef struct mrect {
    size_t uid; /* the weight's unit */
    bool scale;
    int64_t r0, r1, c0, c1;
    size_t off;
    int64_t ld; /* source elements per row */
} mrect;

/* Where a piece's bytes are: `exec` is readable by the executor (host memory for a host set,
 * device memory for a device set); `host` is a host copy or NULL. */
typedef struct pbase {
    const uint8_t *exec, *host;
    int esize;
    rw_dtype dtype;
    bool upload; /* host bytes for a device set: ops read gathered copies (exec is NULL) */
} pbase;

static inline bool wset_rect_contains(const rect *a, const rect *b) {
    return a->r0 <= b->r0 && a->r1 >= b->r1 && a->c0 <= b->c0 && a->c1 >= b->c1;
}

static inline rw_moe_op wset_op_new(int kind, int esize, uint64_t src, int64_t ld,
                                    const rw_moe_tgt *dst, int64_t r0, int64_t c0, int64_t rows,
                                    int64_t cols) {
    rw_moe_op o;
    memset(&o, 0, sizeof o);
    o.kind = kind;
    o.esize = esize;
    o.src = src;
    o.src_ld = ld;
    o.dst = *dst;
    o.dst_r0 = r0;
    o.dst_c0 = c0;
    o.rows = (int32_t)rows;
    o.cols = (int32_t)cols;
    return o;
}

/* --- wset.c ------------------------------------------------------------------------------- */
/* The unit of a canonical per-tensor name; SIZE_MAX for fused names (they span many units). */
size_t wset_uid_of(const rw_wset *ws, const rw_wname *w);
rw_status wset_unit_geom(const rw_wset *ws, size_t uid, geom *g, rw_err *err);
/* Extent of a unit in its own coordinates (weights: elements; scales: scale entries). */
void wset_unit_extent(const geom *g, int64_t *rows, int64_t *cols);
/* Records rectangle r (unit coordinates) as written, merged with what is recorded. */
rw_status wset_cov_add(unit *u, rect r, rw_err *err);
/* Whether the unit's written rectangles cover [0, rows) x [0, cols). */
bool wset_cov_complete(const unit *u, int64_t rows, int64_t cols);

/* --- wset_apply.c ------------------------------------------------------------------------- */
/* Validates a piece against the model (rw_wset_validate_piece) and says what it is. */
rw_status wset_check_piece(const rw_wset *ws, const rw_piece *p, pinfo *pi, rw_err *err);
rw_status wset_opvec_push(opvec *o, const rw_moe_op *op, rw_err *err);
/* Cuts a validated piece into per-unit matrix rectangles and queues their ops (or stages them). */
rw_status wset_emit_piece(build *b, const rw_piece *p, const pinfo *pi, const pbase *pb,
                          rw_err *err);

/* --- wset_stage.c ------------------------------------------------------------------------- */
void wset_stage_free(stage *s);
/* Stages values (bf16) or raw e4m3 of local rect lr of unit uid; the piece's part starts at byte
 * `off`, row stride ld elements. */
rw_status wset_stage_weight(build *b, size_t uid, const geom *g, const pbase *pb, size_t off,
                            int64_t ld, rect lr, rw_err *err);
/* Stages canonical fp8 scale blocks (scale-matrix rect m) needed by unit uid's slice. */
rw_status wset_stage_scales(build *b, size_t uid, const geom *g, const pbase *pb, const mrect *m,
                            rw_err *err);
/* Forgets staged parts of a region that a direct write has just covered in full. */
void wset_stage_forget(unit *u, rect lr);
/* Quantizes the unit's staged blocks that are now complete and queues the copies placing them. */
rw_status wset_flush_unit(build *b, size_t uid, rw_err *err);

#endif /* RW_WSET_INTERNAL_H */
