/* wset.c - the weight set of one rank: every local weight in its final layout in one arena
 * (host for the CPU backend, device for CUDA), and the piece-apply path that updates call.
 *
 * An incoming piece (a whole canonical tensor, a trainer shard along any dim, a fused expert
 * tensor, a Megatron gate_up shard, or a quantized checkpoint's e4m3 / scale tensor) is cut into
 * rectangles of canonical 2-D matrices ("units": one per local weight and one per quantization
 * scale). Each rectangle is intersected with this rank's slice (unpadded offsets) and becomes
 * scatter ops (moe_layout.h): copy into the packed layout, or quantize (mxfp8 1x32, fp8 128x128
 * local blocks) and pack in the same pass. Parts of a quantization block that a piece covers only
 * partly wait on the host in a per-unit stage until the block is complete. The ops of a whole
 * batch run through the CPU reference (host set) or a few CUDA launches (device set).
 *
 * Completeness: each unit keeps the rectangles written since rw_wset_mark_clear(), merged.
 */
#include "moe_layout.h"

#include <stdio.h>
#include <stdlib.h>

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
};

static size_t per_layer(const rw_wset *ws) {
    return NSLOT + NX * (size_t)ws->cfg.num_experts;
}

/* The unit of a canonical per-tensor name; SIZE_MAX for fused names (they span many units). */
static size_t uid_of(const rw_wset *ws, const rw_wname *w) {
    size_t base = U_GLOBAL + (size_t)(w->layer < 0 ? 0 : w->layer) * per_layer(ws);
    int sc = w->scale ? 1 : 0;
    switch (w->kind) {
    case RW_W_EMBED: return U_EMBED;
    case RW_W_LM_HEAD: return U_LM_HEAD;
    case RW_W_FINAL_NORM: return U_FINAL_NORM;
    case RW_W_INPUT_NORM: return base + SL_IN_NORM;
    case RW_W_POST_NORM: return base + SL_POST_NORM;
    case RW_W_Q_NORM: return base + SL_Q_NORM;
    case RW_W_K_NORM: return base + SL_K_NORM;
    case RW_W_ROUTER: return base + SL_ROUTER;
    case RW_W_Q: return base + (sc ? SL_QS : SL_Q);
    case RW_W_K: return base + (sc ? SL_KS : SL_K);
    case RW_W_V: return base + (sc ? SL_VS : SL_V);
    case RW_W_O: return base + (sc ? SL_OS : SL_O);
    case RW_W_EXP_GATE:
    case RW_W_EXP_UP:
    case RW_W_EXP_DOWN:
        return base + NSLOT + (size_t)w->expert * NX + (size_t)(w->kind - RW_W_EXP_GATE) +
               (sc ? 3 : 0);
    default: return SIZE_MAX;
    }
}

static rw_wname uid_name(const rw_wset *ws, size_t uid) {
    rw_wname w = {RW_W_INVALID, -1, -1, false};
    if (uid < U_GLOBAL) {
        w.kind = uid == U_EMBED ? RW_W_EMBED : uid == U_LM_HEAD ? RW_W_LM_HEAD : RW_W_FINAL_NORM;
        return w;
    }
    size_t x = uid - U_GLOBAL, pl = per_layer(ws);
    w.layer = (int)(x / pl);
    x %= pl;
    static const rw_wkind slot_kind[NSLOT] = {
        RW_W_INPUT_NORM, RW_W_POST_NORM, RW_W_Q_NORM, RW_W_K_NORM, RW_W_ROUTER, RW_W_Q, RW_W_K,
        RW_W_V,          RW_W_O,         RW_W_Q,      RW_W_K,      RW_W_V,      RW_W_O};
    if (x < NSLOT) {
        w.kind = slot_kind[x];
        w.scale = x >= SL_QS;
        return w;
    }
    x -= NSLOT;
    w.expert = (int)(x / NX);
    x %= NX;
    w.kind = (rw_wkind)(RW_W_EXP_GATE + (int)(x % 3));
    w.scale = x >= 3;
    return w;
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

static void tgt_rows(rw_moe_tgt *t, const void *base, int64_t ld) {
    memset(t, 0, sizeof *t);
    t->base = (uint64_t)(uintptr_t)base;
    t->ld = ld;
    t->rowmap = RW_MOE_RM_IDENT;
    t->addr = RW_MOE_AD_ROWS;
}

static int64_t cdiv(int64_t a, int64_t b) {
    return (a + b - 1) / b;
}

static rw_status unit_geom(const rw_wset *ws, size_t uid, geom *g, rw_err *err) {
    memset(g, 0, sizeof *g);
    rw_wname w = uid_name(ws, uid);
    g->scale = w.scale;
    w.scale = false;
    g->w = w;
    rw_shard_plan p;
    RW_CHECK(rw_moe_plan_tensor(&ws->cfg, ws->d.tp, ws->d.rank, &w, &p, err));
    g->fmt = rw_quant_policy(&ws->cfg, &w);
    if (p.ndim == 1) {
        g->R = 1;
        g->C = p.canon_shape[0];
        g->sdim = p.dim == 0 ? 1 : -1;
    } else {
        g->R = p.canon_shape[0];
        g->C = p.canon_shape[1];
        g->sdim = p.dim;
    }
    g->s0 = p.src_begin;
    g->s1 = p.src_end;
    g->vr = g->sdim == 0 ? g->s1 - g->s0 : g->R;
    g->vc = g->sdim == 1 ? g->s1 - g->s0 : g->C;
    g->present = !(g->scale && g->fmt == RW_WFMT_BF16) &&
                 !(w.kind == RW_W_LM_HEAD && ws->cfg.tie_word_embeddings);
    g->aligned = g->sdim < 0 || (g->s0 % RW_FP8_BLOCK == 0 &&
                                 (g->s1 % RW_FP8_BLOCK == 0 || g->s1 == (g->sdim ? g->C : g->R)));
    const rw_layer_weights *lw = w.layer >= 0 ? &ws->layers[w.layer] : NULL;
    const rw_tensor *t = NULL, *ts = NULL;
    switch (w.kind) {
    case RW_W_EMBED: t = &ws->embed; break;
    case RW_W_LM_HEAD: t = &ws->lm_head; break;
    case RW_W_FINAL_NORM: t = &ws->final_norm; break;
    case RW_W_INPUT_NORM: t = &lw->input_norm; break;
    case RW_W_POST_NORM: t = &lw->post_norm; break;
    case RW_W_Q_NORM: t = &lw->q_norm; break;
    case RW_W_K_NORM: t = &lw->k_norm; break;
    case RW_W_ROUTER: t = &lw->router; break;
    case RW_W_Q: t = &lw->q, ts = &lw->q_scale; break;
    case RW_W_K: t = &lw->k, ts = &lw->k_scale; break;
    case RW_W_V: t = &lw->v, ts = &lw->v_scale; break;
    case RW_W_O: t = &lw->o, ts = &lw->o_scale; break;
    default: break;
    }
    if (t) {
        /* plain row-major local [rows, cols] (1-D as one row) */
        int64_t ld = t->ndim == 1 ? t->shape[0] : t->shape[1];
        tgt_rows(&g->data, t->data, ld);
        g->data_base = (uint64_t)(uintptr_t)t->data;
        g->data_bytes = rw_tensor_nbytes(t);
        if (ts && ts->data) {
            tgt_rows(&g->scl, ts->data, ts->shape[1]);
            g->scl_base = (uint64_t)(uintptr_t)ts->data;
            g->scl_bytes = rw_tensor_nbytes(ts);
        }
        return RW_OK;
    }
    /* experts: one expert's block of the layer's packed buffers */
    int64_t P = ws->d.P, H = ws->cfg.hidden_size;
    rw_moe_mat m = w.kind == RW_W_EXP_DOWN ? RW_MOE_W2 : RW_MOE_W13;
    const rw_tensor *pt = m == RW_MOE_W13 ? &lw->w13 : &lw->w2;
    const rw_tensor *ps = m == RW_MOE_W13 ? &lw->w13_scale : &lw->w2_scale;
    size_t pb = rw_moe_packed_bytes(lw->moe_fmt, m, P, H);
    size_t psb = rw_moe_packed_scale_bytes(lw->moe_fmt, m, P, H);
    uint8_t *db = (uint8_t *)pt->data + (size_t)w.expert * pb;
    uint8_t *sb = ps->data ? (uint8_t *)ps->data + (size_t)w.expert * psb : NULL;
    rw_moe_expert_tgt(lw->moe_fmt, m, P, H, db, sb, &g->data, &g->scl);
    g->data_base = (uint64_t)(uintptr_t)db;
    g->data_bytes = pb;
    g->scl_base = (uint64_t)(uintptr_t)sb;
    g->scl_bytes = psb;
    g->dst_r0 = w.kind == RW_W_EXP_GATE ? P : 0;
    return RW_OK;
}

/* Extent of a unit in its own coordinates (weights: elements; scales: scale entries). */
static void unit_extent(const geom *g, int64_t *rows, int64_t *cols) {
    if (!g->scale) {
        *rows = g->vr;
        *cols = g->vc;
    } else if (g->fmt == RW_WFMT_MXFP8) {
        *rows = g->vr;
        *cols = g->vc / RW_MXFP8_BLOCK;
    } else {
        *rows = cdiv(g->vr, RW_FP8_BLOCK);
        *cols = cdiv(g->vc, RW_FP8_BLOCK);
    }
}

/* ------------------------------------------------------------------------------------------ */
/* Coverage                                                                                     */
/* ------------------------------------------------------------------------------------------ */
static bool rect_contains(const rect *a, const rect *b) {
    return a->r0 <= b->r0 && a->r1 >= b->r1 && a->c0 <= b->c0 && a->c1 >= b->c1;
}

/* Union of a and b when it is itself a rectangle (same span along one axis, touching along
 * the other). */
static bool rect_merge(rect *a, const rect *b) {
    if (a->r0 == b->r0 && a->r1 == b->r1 && b->c0 <= a->c1 && a->c0 <= b->c1) {
        a->c0 = a->c0 < b->c0 ? a->c0 : b->c0;
        a->c1 = a->c1 > b->c1 ? a->c1 : b->c1;
        return true;
    }
    if (a->c0 == b->c0 && a->c1 == b->c1 && b->r0 <= a->r1 && a->r0 <= b->r1) {
        a->r0 = a->r0 < b->r0 ? a->r0 : b->r0;
        a->r1 = a->r1 > b->r1 ? a->r1 : b->r1;
        return true;
    }
    return false;
}

static rw_status cov_add(unit *u, rect r, rw_err *err) {
    if (r.r0 >= r.r1 || r.c0 >= r.c1) return RW_OK;
    /* absorb every rectangle that r contains or merges with, until none is left */
    for (bool changed = true; changed;) {
        changed = false;
        for (uint32_t i = 0; i < u->ncov; i++) {
            if (rect_contains(&u->cov[i], &r)) return RW_OK;
            rect t = r;
            if (rect_contains(&r, &u->cov[i]) || rect_merge(&t, &u->cov[i])) {
                r = t;
                u->cov[i] = u->cov[--u->ncov];
                changed = true;
                break;
            }
        }
    }
    if (u->ncov == u->capcov) {
        uint32_t cap = u->capcov ? 2 * u->capcov : 2;
        rect *v = realloc(u->cov, cap * sizeof *v);
        if (!v) RW_FAIL(err, RW_E_OOM, "out of memory tracking written regions");
        u->cov = v;
        u->capcov = cap;
    }
    u->cov[u->ncov++] = r;
    return RW_OK;
}

static int cmp_i64(const void *a, const void *b) {
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return x < y ? -1 : x > y;
}

/* Whether the union of the unit's rectangles covers [0, rows) x [0, cols): exact, by coordinate
 * compression (the merged lists are short). */
static bool cov_complete(const unit *u, int64_t rows, int64_t cols) {
    if (rows <= 0 || cols <= 0) return true;
    rect full = {0, rows, 0, cols};
    for (uint32_t i = 0; i < u->ncov; i++)
        if (rect_contains(&u->cov[i], &full)) return true;
    if (u->ncov < 2 || u->ncov > 256) return false;
    size_t n = u->ncov;
    int64_t *ys = malloc(sizeof(int64_t) * (2 * n + 2)),
            *xs = malloc(sizeof(int64_t) * (2 * n + 2));
    if (!ys || !xs) {
        free(ys);
        free(xs);
        return false;
    }
    size_t ny = 0, nx = 0;
    ys[ny++] = 0;
    ys[ny++] = rows;
    xs[nx++] = 0;
    xs[nx++] = cols;
    for (size_t i = 0; i < n; i++) {
        ys[ny++] = u->cov[i].r0, ys[ny++] = u->cov[i].r1;
        xs[nx++] = u->cov[i].c0, xs[nx++] = u->cov[i].c1;
    }
    qsort(ys, ny, sizeof *ys, cmp_i64);
    qsort(xs, nx, sizeof *xs, cmp_i64);
    bool ok = true;
    for (size_t a = 0; ok && a + 1 < ny; a++) {
        if (ys[a] == ys[a + 1] || ys[a] < 0 || ys[a + 1] > rows) continue;
        for (size_t b = 0; ok && b + 1 < nx; b++) {
            if (xs[b] == xs[b + 1] || xs[b] < 0 || xs[b + 1] > cols) continue;
            rect cell = {ys[a], ys[a + 1], xs[b], xs[b + 1]};
            bool hit = false;
            for (size_t i = 0; i < n && !hit; i++)
                hit = rect_contains(&u->cov[i], &cell);
            ok = hit;
        }
    }
    free(ys);
    free(xs);
    return ok;
}

/* ------------------------------------------------------------------------------------------ */
/* Creation                                                                                     */
/* ------------------------------------------------------------------------------------------ */
/* One pass over every local tensor: with a == NULL only adds up the bytes. */
typedef struct alloc_ctx {
    rw_arena *a;
    size_t bytes;
} alloc_ctx;

static rw_status take(alloc_ctx *c, rw_dtype dt, int ndim, const int64_t *shape, rw_tensor *out,
                      rw_err *err) {
    size_t n = (size_t)rw_shape_numel(ndim, shape) * rw_dtype_size(dt);
    c->bytes += (n + 255) / 256 * 256;
    if (!c->a) {
        memset(out, 0, sizeof *out);
        return RW_OK;
    }
    return rw_arena_tensor(c->a, dt, ndim, shape, out, err);
}

#define SHP(...) ((const int64_t[]){__VA_ARGS__})

static rw_status layer_formats(const rw_wset *ws, int l, rw_wfmt *attn, rw_wfmt *moe, rw_err *err) {
    const rw_config *c = &ws->cfg;
    rw_wname q = {RW_W_Q, l, -1, false}, k = {RW_W_K, l, -1, false}, v = {RW_W_V, l, -1, false},
             o = {RW_W_O, l, -1, false};
    *attn = rw_quant_policy(c, &q);
    if (rw_quant_policy(c, &k) != *attn || rw_quant_policy(c, &v) != *attn ||
        rw_quant_policy(c, &o) != *attn)
        RW_FAIL(err, RW_E_UNSUPPORTED,
                "layer %d: q/k/v/o projections would get different storage formats (%s, %s, %s, "
                "%s); one format per layer's attention is supported",
                l, rw_wfmt_str(*attn), rw_wfmt_str(rw_quant_policy(c, &k)),
                rw_wfmt_str(rw_quant_policy(c, &v)), rw_wfmt_str(rw_quant_policy(c, &o)));
    rw_wname g = {RW_W_EXP_GATE, l, 0, false}, u = {RW_W_EXP_UP, l, 0, false},
             dn = {RW_W_EXP_DOWN, l, 0, false};
    *moe = rw_quant_policy(c, &g);
    if (rw_quant_policy(c, &u) != *moe || rw_quant_policy(c, &dn) != *moe)
        RW_FAIL(err, RW_E_UNSUPPORTED, "layer %d: expert gate/up/down get different formats", l);
    if (*moe == RW_WFMT_MXFP8 && ws->d.S % RW_MXFP8_BLOCK)
        RW_FAIL(err, RW_E_UNSUPPORTED,
                "layer %d: mxfp8 experts need the shard I/T = %lld to be a multiple of 32 (the "
                "down projection's scale columns are sliced per rank)",
                l, (long long)ws->d.S);
    int64_t ol = (int64_t)ws->d.nh_local * c->head_dim;
    if (*attn == RW_WFMT_MXFP8 && ol % RW_MXFP8_BLOCK)
        RW_FAIL(err, RW_E_UNSUPPORTED,
                "layer %d: mxfp8 o_proj needs its local K = %lld to be a multiple of 32", l,
                (long long)ol);
    return RW_OK;
}

static rw_status alloc_all(rw_wset *ws, alloc_ctx *ac, rw_err *err) {
    const rw_config *c = &ws->cfg;
    const rw_tp_dims *d = &ws->d;
    int64_t H = c->hidden_size, hd = c->head_dim, E = c->num_experts, P = d->P;
    int64_t nq = (int64_t)d->nh_local * hd, nkv = (int64_t)d->nkv_local * hd;
    RW_CHECK(take(ac, RW_DTYPE_BF16, 2, SHP(d->v_local, H), &ws->embed, err));
    if (!c->tie_word_embeddings)
        RW_CHECK(take(ac, RW_DTYPE_BF16, 2, SHP(d->v_local, H), &ws->lm_head, err));
    RW_CHECK(take(ac, RW_DTYPE_BF16, 1, SHP(H), &ws->final_norm, err));
    for (int l = 0; l < c->num_layers; l++) {
        rw_layer_weights *lw = &ws->layers[l];
        rw_wfmt af = RW_WFMT_BF16, mf = RW_WFMT_BF16;
        RW_CHECK(layer_formats(ws, l, &af, &mf, err));
        lw->attn_fmt = af;
        lw->moe_fmt = mf;
        RW_CHECK(take(ac, RW_DTYPE_BF16, 1, SHP(H), &lw->input_norm, err));
        RW_CHECK(take(ac, RW_DTYPE_BF16, 1, SHP(H), &lw->post_norm, err));
        RW_CHECK(take(ac, RW_DTYPE_BF16, 1, SHP(hd), &lw->q_norm, err));
        RW_CHECK(take(ac, RW_DTYPE_BF16, 1, SHP(hd), &lw->k_norm, err));
        rw_dtype wd = af == RW_WFMT_BF16 ? RW_DTYPE_BF16 : RW_DTYPE_E4M3;
        RW_CHECK(take(ac, wd, 2, SHP(nq, H), &lw->q, err));
        RW_CHECK(take(ac, wd, 2, SHP(nkv, H), &lw->k, err));
        RW_CHECK(take(ac, wd, 2, SHP(nkv, H), &lw->v, err));
        RW_CHECK(take(ac, wd, 2, SHP(H, nq), &lw->o, err));
        if (af != RW_WFMT_BF16) {
            rw_dtype sd = rw_quant_scale_dtype(af);
            int64_t s[2];
            rw_quant_scale_shape(af, nq, H, s);
            RW_CHECK(take(ac, sd, 2, s, &lw->q_scale, err));
            rw_quant_scale_shape(af, nkv, H, s);
            RW_CHECK(take(ac, sd, 2, s, &lw->k_scale, err));
            RW_CHECK(take(ac, sd, 2, s, &lw->v_scale, err));
            rw_quant_scale_shape(af, H, nq, s);
            RW_CHECK(take(ac, sd, 2, s, &lw->o_scale, err));
        }
        RW_CHECK(take(ac, RW_DTYPE_BF16, 2, SHP(E, H), &lw->router, err));
        if (mf == RW_WFMT_BF16) {
            RW_CHECK(take(ac, RW_DTYPE_BF16, 4, SHP(E, H / 64, 2 * P, 64), &lw->w13, err));
            RW_CHECK(take(ac, RW_DTYPE_BF16, 4, SHP(E, P / 64, H, 64), &lw->w2, err));
        } else {
            RW_CHECK(take(ac, RW_DTYPE_E4M3, 3, SHP(E, 2 * P, H), &lw->w13, err));
            RW_CHECK(take(ac, RW_DTYPE_E4M3, 3, SHP(E, H, P), &lw->w2, err));
            if (mf == RW_WFMT_MXFP8) {
                RW_CHECK(take(ac, RW_DTYPE_U8, 3, SHP(E, 2 * P, rw_roundup(H / RW_MXFP8_BLOCK, 4)),
                              &lw->w13_scale, err));
                RW_CHECK(take(ac, RW_DTYPE_U8, 3,
                              SHP(E, rw_roundup(H, 128), rw_roundup(P / RW_MXFP8_BLOCK, 4)),
                              &lw->w2_scale, err));
            } else {
                RW_CHECK(take(ac, RW_DTYPE_F32, 3, SHP(E, 2 * P / 128, cdiv(H, 128)),
                              &lw->w13_scale, err));
                RW_CHECK(
                    take(ac, RW_DTYPE_F32, 3, SHP(E, cdiv(H, 128), P / 128), &lw->w2_scale, err));
            }
        }
    }
    return RW_OK;
}

rw_status rw_wset_create(const rw_config *cfg, int tp, int rank, rw_place place, int device,
                         rw_wset **out, rw_err *err) {
    if (!cfg || !out) RW_FAIL(err, RW_E_INVALID_ARG, "wset: NULL config or output");
    *out = NULL;
    if (place != RW_PLACE_HOST && place != RW_PLACE_DEVICE)
        RW_FAIL(err, RW_E_INVALID_ARG, "wset: unknown place %d", (int)place);
    rw_tp_dims d;
    RW_CHECK(rw_tp_dims_make(cfg, tp, rank, &d, err));
    if (cfg->hidden_size % 64)
        RW_FAIL(err, RW_E_UNSUPPORTED,
                "wset: hidden_size %d is not a multiple of 64 (packed K blocks of 64 elements)",
                cfg->hidden_size);
    if (cfg->num_layers <= 0 || cfg->num_experts <= 0)
        RW_FAIL(err, RW_E_SHAPE, "wset: config has %d layers and %d experts", cfg->num_layers,
                cfg->num_experts);
    rw_wset *ws = calloc(1, sizeof *ws);
    if (!ws) RW_FAIL(err, RW_E_OOM, "wset: out of memory");
    rw_status st = RW_OK;
    RW_CHECKGOTO(rw_config_copy(cfg, &ws->cfg, err), st, fail);
    ws->d = d;
    ws->place = place;
    ws->device = device;
    ws->layers = calloc((size_t)cfg->num_layers, sizeof *ws->layers);
    ws->nunits = U_GLOBAL + (size_t)cfg->num_layers * per_layer(ws);
    ws->units = calloc(ws->nunits, sizeof *ws->units);
    if (!ws->layers || !ws->units) {
        st = RW_ERR(err, RW_E_OOM, "wset: out of memory for %zu units", ws->nunits);
        goto fail;
    }
    alloc_ctx measure = {NULL, 0};
    RW_CHECKGOTO(alloc_all(ws, &measure, err), st, fail);
    RW_CHECKGOTO(rw_arena_create(place, device, measure.bytes + 256, &ws->arena, err), st, fail);
    /* a device set's update kernels are loaded before any receive can be posted (pack.cu) */
    if (place == RW_PLACE_DEVICE) RW_CHECKGOTO(rw_moe_cuda_preload(device, err), st, fail);
    alloc_ctx real = {ws->arena, 0};
    RW_CHECKGOTO(alloc_all(ws, &real, err), st, fail);
    if (cfg->tie_word_embeddings) ws->lm_head = ws->embed;
    *out = ws;
    return RW_OK;
fail:
    rw_wset_destroy(ws);
    return st;
}

static void stage_free(stage *s) {
    if (!s) return;
    free(s->val);
    free(s->have);
    free(s->raw);
    free(s->have_raw);
    free(s->gs);
    free(s->have_gs);
    free(s);
}

void rw_wset_destroy(rw_wset *ws) {
    if (!ws) return;
    if (ws->units)
        for (size_t i = 0; i < ws->nunits; i++) {
            free(ws->units[i].cov);
            stage_free(ws->units[i].st);
        }
    free(ws->units);
    rw_wset_batch_destroy(ws->own);
    for (int i = 0; i < 2; i++)
        rw_moe_slot_free(&ws->slots[i]);
    rw_arena_destroy(ws->arena);
    free(ws->layers);
    rw_config_free(&ws->cfg);
    free(ws);
}

const rw_config *rw_wset_config(const rw_wset *ws) {
    return &ws->cfg;
}
const rw_tp_dims *rw_wset_dims(const rw_wset *ws) {
    return &ws->d;
}
const rw_layer_weights *rw_wset_layer(const rw_wset *ws, int layer) {
    if (!ws || layer < 0 || layer >= ws->cfg.num_layers) return NULL;
    return &ws->layers[layer];
}
rw_tensor rw_wset_embed(const rw_wset *ws) {
    return ws->embed;
}
rw_tensor rw_wset_lm_head(const rw_wset *ws) {
    return ws->lm_head;
}
rw_tensor rw_wset_final_norm(const rw_wset *ws) {
    return ws->final_norm;
}
rw_arena *rw_wset_arena(rw_wset *ws) {
    return ws->arena;
}
size_t rw_wset_bytes(const rw_wset *ws) {
    return rw_arena_used(ws->arena);
}

/* ------------------------------------------------------------------------------------------ */
/* Validation                                                                                   */
/* ------------------------------------------------------------------------------------------ */
size_t rw_piece_nbytes(const rw_piece *p) {
    if (!p || p->ndim < 0 || p->ndim > RW_MAX_DIMS) return 0;
    size_t n = rw_dtype_size(p->dtype);
    for (int i = 0; i < p->ndim; i++) {
        int64_t s = p->shape[i];
        if (i == p->shard_dim) s = p->layout == RW_PIECE_GATE_UP ? 2 * p->shard_len : p->shard_len;
        if (s < 0) return 0;
        n *= (size_t)s;
    }
    return n;
}

/* What a validated piece is. */
typedef struct pinfo {
    rw_wname w;
    rw_wfmt fmt; /* storage format of the tensor on this rank */
    int ndim;
    int64_t shape[RW_MAX_DIMS]; /* canonical shape of the named tensor (scale shape for scales) */
} pinfo;

static rw_status check_piece(const rw_wset *ws, const rw_piece *p, pinfo *pi, rw_err *err) {
    if (!p) RW_FAIL(err, RW_E_INVALID_ARG, "piece is NULL");
    if (!p->name) RW_FAIL(err, RW_E_INVALID_ARG, "piece without a tensor name");
    const char *nm = p->name;
    RW_CHECK(rw_name_parse(nm, &ws->cfg, &pi->w, err));
    rw_wname plain = pi->w;
    plain.scale = false;
    if (pi->w.kind == RW_W_LM_HEAD && ws->cfg.tie_word_embeddings)
        RW_FAIL(err, RW_E_NOT_FOUND,
                "tensor '%s': the model ties lm_head to embed_tokens; send the embedding", nm);
    RW_CHECK(rw_config_weight_shape(&ws->cfg, &plain, &pi->ndim, pi->shape, err));
    pi->fmt = rw_quant_policy(&ws->cfg, &plain);
    bool fused = pi->w.kind == RW_W_EXP_GATE_UP || pi->w.kind == RW_W_EXP_DOWN_ALL;
    if (pi->w.scale) {
        if (pi->fmt == RW_WFMT_BF16)
            RW_FAIL(err, RW_E_NOT_FOUND,
                    "tensor '%s': this model stores the weight in bf16, it has no scale", nm);
        int64_t s[2];
        rw_quant_scale_shape(pi->fmt, pi->shape[0], pi->shape[1], s);
        pi->shape[0] = s[0];
        pi->shape[1] = s[1];
        rw_dtype want = rw_quant_scale_dtype(pi->fmt);
        bool ok = p->dtype == want || (want == RW_DTYPE_U8 && p->dtype == RW_DTYPE_UE8M0);
        if (!ok)
            RW_FAIL(err, RW_E_DTYPE, "tensor '%s': scale dtype %s, expected %s (%s)", nm,
                    rw_dtype_name(p->dtype), rw_dtype_name(want), rw_wfmt_str(pi->fmt));
    } else if (fused || pi->fmt == RW_WFMT_BF16) {
        if (p->dtype != RW_DTYPE_BF16)
            RW_FAIL(err, RW_E_DTYPE, "tensor '%s': dtype %s, expected bf16%s", nm,
                    rw_dtype_name(p->dtype), fused ? " (fused expert tensors are bf16)" : "");
    } else if (p->dtype != RW_DTYPE_BF16 && p->dtype != RW_DTYPE_E4M3) {
        RW_FAIL(err, RW_E_DTYPE, "tensor '%s': dtype %s, expected bf16 or e4m3 (stored %s)", nm,
                rw_dtype_name(p->dtype), rw_wfmt_str(pi->fmt));
    }
    char a[96], b[96];
    bool same = p->ndim == pi->ndim;
    for (int i = 0; same && i < p->ndim; i++)
        same = p->shape[i] == pi->shape[i];
    if (!same)
        RW_FAIL(err, RW_E_SHAPE, "tensor '%s': full shape %s, expected %s", nm,
                rw_shape_str(p->ndim < 0             ? 0
                             : p->ndim > RW_MAX_DIMS ? RW_MAX_DIMS
                                                     : p->ndim,
                             p->shape, a, sizeof a),
                rw_shape_str(pi->ndim, pi->shape, b, sizeof b));
    if (p->shard_dim < -1 || p->shard_dim >= p->ndim)
        RW_FAIL(err, RW_E_RANGE, "tensor '%s': shard dim %d outside -1..%d", nm, p->shard_dim,
                p->ndim - 1);
    if (p->layout != RW_PIECE_PLAIN && p->layout != RW_PIECE_GATE_UP)
        RW_FAIL(err, RW_E_INVALID_ARG, "tensor '%s': unknown piece layout %d", nm, (int)p->layout);
    if (p->shard_dim >= 0) {
        int64_t ext = p->shape[p->shard_dim];
        if (p->layout == RW_PIECE_GATE_UP) {
            if (pi->w.kind != RW_W_EXP_GATE_UP || p->shard_dim != 1)
                RW_FAIL(err, RW_E_INVALID_ARG,
                        "tensor '%s': the gate_up piece layout applies to mlp.experts.gate_up_proj "
                        "shards along dim 1 only",
                        nm);
            ext = ws->cfg.moe_intermediate;
        }
        if (p->shard_begin < 0 || p->shard_len < 1 || p->shard_begin > ext - p->shard_len)
            RW_FAIL(err, RW_E_RANGE,
                    "tensor '%s': shard [%lld, %lld) along dim %d outside [0, %lld)", nm,
                    (long long)p->shard_begin, (long long)(p->shard_begin + p->shard_len),
                    p->shard_dim, (long long)ext);
    } else if (p->layout != RW_PIECE_PLAIN) {
        RW_FAIL(err, RW_E_INVALID_ARG, "tensor '%s': a whole-tensor piece must be plain", nm);
    }
    size_t nb = rw_piece_nbytes(p);
    if (p->nbytes && p->nbytes != nb)
        RW_FAIL(err, RW_E_SHAPE, "tensor '%s': %zu bytes delivered, the piece's shape needs %zu",
                nm, p->nbytes, nb);
    if (!p->data && nb) RW_FAIL(err, RW_E_INVALID_ARG, "tensor '%s': NULL piece data", nm);
    if (p->place != RW_PLACE_HOST && p->place != RW_PLACE_DEVICE)
        RW_FAIL(err, RW_E_INVALID_ARG, "tensor '%s': unknown piece place %d", nm, (int)p->place);
    if (p->place == RW_PLACE_DEVICE && !rw_cuda_built())
        RW_FAIL(err, RW_E_NO_DEVICE, "tensor '%s': device piece, but built without CUDA", nm);
    return RW_OK;
}

rw_status rw_wset_validate_piece(const rw_wset *ws, const rw_piece *p, rw_err *err) {
    if (!ws) RW_FAIL(err, RW_E_INVALID_ARG, "wset is NULL");
    pinfo pi;
    return check_piece(ws, p, &pi, err);
}

/* ------------------------------------------------------------------------------------------ */
/* Building ops                                                                                 */
/* ------------------------------------------------------------------------------------------ */
static rw_status opvec_push(opvec *o, const rw_moe_op *op, rw_err *err) {
    if (o->n == o->cap) {
        size_t cap = o->cap ? 2 * o->cap : 256;
        rw_moe_op *v = realloc(o->v, cap * sizeof *v);
        if (!v) RW_FAIL(err, RW_E_OOM, "out of memory for %zu scatter ops", cap);
        o->v = v;
        o->cap = cap;
    }
    o->v[o->n++] = *op;
    return RW_OK;
}

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

static rw_status stage_get(build *b, size_t uid, const geom *g, stage **out, rw_err *err) {
    unit *u = &b->ws->units[uid];
    if (!u->st) {
        stage *s = calloc(1, sizeof *s);
        if (!s) RW_FAIL(err, RW_E_OOM, "out of memory for a staging area");
        s->rows = g->vr;
        s->cols = g->vc;
        size_t n = (size_t)(g->vr * g->vc), words = (n + 63) / 64;
        s->have = calloc(words + 1, sizeof(uint64_t)); /* values: allocated on first use */
        if (!s->have) {
            stage_free(s);
            RW_FAIL(err, RW_E_OOM, "out of memory for a staging area of %zu elements", n);
        }
        u->st = s;
    }
    stage *s = u->st;
    if (!s->is_dirty) {
        if (b->ntouched == b->captouched) {
            size_t cap = b->captouched ? 2 * b->captouched : 64;
            size_t *v = realloc(b->touched, cap * sizeof *v);
            if (!v) RW_FAIL(err, RW_E_OOM, "out of memory");
            b->touched = v;
            b->captouched = cap;
        }
        b->touched[b->ntouched++] = uid;
    }
    *out = s;
    return RW_OK;
}

static void dirty_add(stage *s, rect r) {
    if (!s->is_dirty) {
        s->dirty = r;
        s->is_dirty = true;
        return;
    }
    if (r.r0 < s->dirty.r0) s->dirty.r0 = r.r0;
    if (r.r1 > s->dirty.r1) s->dirty.r1 = r.r1;
    if (r.c0 < s->dirty.c0) s->dirty.c0 = r.c0;
    if (r.c1 > s->dirty.c1) s->dirty.c1 = r.c1;
}

static inline void bit_set(uint64_t *m, size_t i) {
    m[i >> 6] |= 1ull << (i & 63);
}
static inline void bit_clr(uint64_t *m, size_t i) {
    m[i >> 6] &= ~(1ull << (i & 63));
}
static inline bool bit_get(const uint64_t *m, size_t i) {
    return (m[i >> 6] >> (i & 63)) & 1;
}

/* Host copy of a rectangle of a piece (rows x cols elements of esize, row stride ld): a view
 * into the host bytes when there are some, else a 2-D copy from the device into *tmp. */
static rw_status host_rect(build *b, const pbase *pb, size_t off, int64_t rows, int64_t cols,
                           int64_t ld, const uint8_t **out, int64_t *out_ld, uint8_t **tmp,
                           rw_err *err) {
    *tmp = NULL;
    if (pb->host) {
        *out = pb->host + off;
        *out_ld = ld;
        return RW_OK;
    }
    if (b->no_dev_reads) {
        b->needs_reads = true;
        return RW_E_BUSY; /* not an error: rw_wset_batch_prepare reports *needs_reads */
    }
    size_t es = (size_t)pb->esize;
    uint8_t *t = malloc((size_t)(rows * cols) * es + 1);
    if (!t) RW_FAIL(err, RW_E_OOM, "out of memory copying a piece part to the host");
    rw_status st = rw_moe_copy2d(t, (size_t)cols * es, pb->exec + off, (size_t)ld * es,
                                 (size_t)cols * es, (size_t)rows, b->s, err);
    if (st == RW_OK) st = rw_stream_sync(b->s, err);
    if (st != RW_OK) {
        free(t);
        return st;
    }
    *tmp = t;
    *out = t;
    *out_ld = cols;
    return RW_OK;
}

/* Stages values (bf16) or raw e4m3 of local rect lr of unit uid. */
static rw_status stage_weight(build *b, size_t uid, const geom *g, const pbase *pb, size_t off,
                              int64_t ld, rect lr, rw_err *err) {
    if (lr.r0 >= lr.r1 || lr.c0 >= lr.c1) return RW_OK;
    stage *s;
    RW_CHECK(stage_get(b, uid, g, &s, err));
    const uint8_t *src;
    int64_t sld;
    uint8_t *tmp;
    RW_CHECK(host_rect(b, pb, off, lr.r1 - lr.r0, lr.c1 - lr.c0, ld, &src, &sld, &tmp, err));
    bool raw = pb->dtype == RW_DTYPE_E4M3;
    if (!raw && !s->val && !(s->val = malloc((size_t)(s->rows * s->cols) * sizeof(float) + 1))) {
        free(tmp);
        RW_FAIL(err, RW_E_OOM, "out of memory for a staging area");
    }
    if (raw && !s->raw) {
        size_t n = (size_t)(s->rows * s->cols);
        s->raw = malloc(n + 1);
        s->have_raw = calloc((n + 63) / 64 + 1, sizeof(uint64_t));
        if (!s->raw || !s->have_raw) {
            free(tmp);
            RW_FAIL(err, RW_E_OOM, "out of memory for a staging area");
        }
    }
    for (int64_t r = lr.r0; r < lr.r1; r++) {
        const uint8_t *row = src + (size_t)((r - lr.r0) * sld) * (size_t)pb->esize;
        for (int64_t c = lr.c0; c < lr.c1; c++) {
            size_t i = (size_t)(r * s->cols + c);
            if (raw) {
                s->raw[i] = row[c - lr.c0];
                bit_set(s->have_raw, i);
                bit_clr(s->have, i);
            } else {
                uint16_t h;
                memcpy(&h, row + 2 * (c - lr.c0), 2);
                s->val[i] = rw_bf16_to_f32(h);
                bit_set(s->have, i);
                if (s->have_raw) bit_clr(s->have_raw, i);
            }
        }
    }
    free(tmp);
    dirty_add(s, lr);
    return RW_OK;
}

/* Stages canonical fp8 scale blocks (scale-matrix rect m) needed by unit uid's slice. */
static rw_status stage_scales(build *b, size_t uid, const geom *g, const pbase *pb, const mrect *m,
                              rw_err *err) {
    stage *s;
    RW_CHECK(stage_get(b, uid, g, &s, err));
    if (!s->gs) {
        /* canonical blocks the slice touches */
        int64_t cr0 = g->sdim == 0 ? g->s0 : 0, cr1 = g->sdim == 0 ? g->s1 : g->R;
        int64_t cc0 = g->sdim == 1 ? g->s0 : 0, cc1 = g->sdim == 1 ? g->s1 : g->C;
        s->gs_r0 = cr0 / RW_FP8_BLOCK;
        s->gs_rows = cdiv(cr1, RW_FP8_BLOCK) - s->gs_r0;
        s->gs_c0 = cc0 / RW_FP8_BLOCK;
        s->gs_cols = cdiv(cc1, RW_FP8_BLOCK) - s->gs_c0;
        size_t n = (size_t)(s->gs_rows * s->gs_cols);
        s->gs = malloc(n * sizeof(float) + 1);
        s->have_gs = calloc((n + 63) / 64 + 1, sizeof(uint64_t));
        if (!s->gs || !s->have_gs) RW_FAIL(err, RW_E_OOM, "out of memory for staged scales");
    }
    rect want = {s->gs_r0, s->gs_r0 + s->gs_rows, s->gs_c0, s->gs_c0 + s->gs_cols};
    rect x = {m->r0 > want.r0 ? m->r0 : want.r0, m->r1 < want.r1 ? m->r1 : want.r1,
              m->c0 > want.c0 ? m->c0 : want.c0, m->c1 < want.c1 ? m->c1 : want.c1};
    if (x.r0 >= x.r1 || x.c0 >= x.c1) return RW_OK;
    size_t off = m->off + (size_t)((x.r0 - m->r0) * m->ld + (x.c0 - m->c0)) * 4;
    const uint8_t *src;
    int64_t sld;
    uint8_t *tmp;
    RW_CHECK(host_rect(b, pb, off, x.r1 - x.r0, x.c1 - x.c0, m->ld, &src, &sld, &tmp, err));
    for (int64_t r = x.r0; r < x.r1; r++)
        for (int64_t c = x.c0; c < x.c1; c++) {
            size_t i = (size_t)((r - s->gs_r0) * s->gs_cols + (c - s->gs_c0));
            memcpy(&s->gs[i], src + (size_t)((r - x.r0) * sld + (c - x.c0)) * 4, 4);
            bit_set(s->have_gs, i);
        }
    free(tmp);
    /* every local element under these canonical blocks may have become ready */
    int64_t lr0 = x.r0 * RW_FP8_BLOCK, lr1 = x.r1 * RW_FP8_BLOCK;
    int64_t lc0 = x.c0 * RW_FP8_BLOCK, lc1 = x.c1 * RW_FP8_BLOCK;
    if (g->sdim == 0) lr0 -= g->s0, lr1 -= g->s0;
    if (g->sdim == 1) lc0 -= g->s0, lc1 -= g->s0;
    rect d = {lr0 < 0 ? 0 : lr0, lr1 > s->rows ? s->rows : lr1, lc0 < 0 ? 0 : lc0,
              lc1 > s->cols ? s->cols : lc1};
    if (d.r0 < d.r1 && d.c0 < d.c1) dirty_add(s, d);
    return RW_OK;
}

/* Forgets staged parts of a region that a direct write has just covered in full. */
static void stage_forget(unit *u, rect lr) {
    stage *s = u->st;
    if (!s) return;
    for (int64_t r = lr.r0; r < lr.r1; r++)
        for (int64_t c = lr.c0; c < lr.c1; c++) {
            size_t i = (size_t)(r * s->cols + c);
            bit_clr(s->have, i);
            if (s->have_raw) bit_clr(s->have_raw, i);
        }
}

static rw_moe_op op_new(int kind, int esize, uint64_t src, int64_t ld, const rw_moe_tgt *dst,
                        int64_t r0, int64_t c0, int64_t rows, int64_t cols) {
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

/* Queues op `o` reading the rectangle at byte `off` of the piece (row stride ld elements of
 * o->esize bytes): directly from the executor's copy, or from a gathered upload. */
static rw_status put_op(build *b, bool fp8q, rw_moe_op o, const pbase *pb, size_t off, int64_t ld,
                        rw_err *err) {
    opvec *v = fp8q ? &b->fp8q : &b->direct;
    if (!pb->upload) {
        o.src = (uint64_t)(uintptr_t)(pb->exec + off);
        o.src_ld = ld;
        return opvec_push(v, &o, err);
    }
    if (b->nup == b->capup) {
        size_t cap = b->capup ? 2 * b->capup : 256;
        struct upl *u = realloc(b->up, cap * sizeof *u);
        if (!u) RW_FAIL(err, RW_E_OOM, "out of memory for upload records");
        b->up = u;
        b->capup = cap;
    }
    size_t bytes = (size_t)o.rows * (size_t)o.cols * (size_t)o.esize;
    struct upl *u = &b->up[b->nup++];
    u->host = pb->host + off;
    u->rows = o.rows;
    u->cols = o.cols;
    u->ld = ld;
    u->es = o.esize;
    u->off = b->up_bytes;
    u->fp8q = fp8q;
    u->idx = v->n;
    b->up_bytes += (bytes + 15) & ~(size_t)15;
    o.src = u->off; /* rebased to the device copy in run_device */
    o.src_ld = o.cols;
    return opvec_push(v, &o, err);
}

/* A scale piece's rectangle (mx: [R, C/32] entries; fp8: canonical blocks). */
static rw_status emit_scale(build *b, const geom *g, const pbase *pb, const mrect *m, rw_err *err) {
    rw_wname sw = g->w;
    sw.scale = true;
    unit *su = &b->ws->units[uid_of(b->ws, &sw)];
    if (g->fmt == RW_WFMT_FP8_BLOCK && !g->aligned) return stage_scales(b, m->uid, g, pb, m, err);
    /* slice in scale coordinates */
    int64_t q = g->fmt == RW_WFMT_MXFP8 ? RW_MXFP8_BLOCK : RW_FP8_BLOCK;
    int64_t sr0 = 0, sr1, sc0 = 0, sc1;
    int64_t srows, scols;
    if (g->fmt == RW_WFMT_MXFP8) {
        srows = g->R;
        scols = g->C / q;
    } else {
        srows = cdiv(g->R, q);
        scols = cdiv(g->C, q);
    }
    sr1 = srows;
    sc1 = scols;
    if (g->sdim == 0) {
        sr0 = g->fmt == RW_WFMT_MXFP8 ? g->s0 : g->s0 / q;
        sr1 = g->fmt == RW_WFMT_MXFP8 ? g->s1 : cdiv(g->s1, q);
    } else if (g->sdim == 1) {
        sc0 = g->s0 / q;
        sc1 = g->fmt == RW_WFMT_MXFP8 ? g->s1 / q : cdiv(g->s1, q);
    }
    rect x = {m->r0 > sr0 ? m->r0 : sr0, m->r1 < sr1 ? m->r1 : sr1, m->c0 > sc0 ? m->c0 : sc0,
              m->c1 < sc1 ? m->c1 : sc1};
    if (x.r0 >= x.r1 || x.c0 >= x.c1) return RW_OK;
    int es = g->fmt == RW_WFMT_MXFP8 ? 1 : 4;
    size_t off = m->off + (size_t)((x.r0 - m->r0) * m->ld + (x.c0 - m->c0)) * (size_t)es;
    int64_t r0 = g->fmt == RW_WFMT_MXFP8 ? g->dst_r0 : g->dst_r0 / RW_FP8_BLOCK;
    rw_moe_op o = op_new(RW_MOE_OP_COPY, es, 0, m->ld, &g->scl, r0 + x.r0 - sr0, x.c0 - sc0,
                         x.r1 - x.r0, x.c1 - x.c0);
    RW_CHECK(put_op(b, false, o, pb, off, m->ld, err));
    rect lr = {x.r0 - sr0, x.r1 - sr0, x.c0 - sc0, x.c1 - sc0};
    return cov_add(su, lr, err);
}

static rw_status emit_weight(build *b, const geom *g, const pbase *pb, const mrect *m,
                             rw_err *err) {
    rw_wset *ws = b->ws;
    unit *u = &ws->units[m->uid];
    /* slice in canonical coordinates, then local */
    int64_t sr0 = g->sdim == 0 ? g->s0 : 0, sr1 = g->sdim == 0 ? g->s1 : g->R;
    int64_t sc0 = g->sdim == 1 ? g->s0 : 0, sc1 = g->sdim == 1 ? g->s1 : g->C;
    rect x = {m->r0 > sr0 ? m->r0 : sr0, m->r1 < sr1 ? m->r1 : sr1, m->c0 > sc0 ? m->c0 : sc0,
              m->c1 < sc1 ? m->c1 : sc1};
    if (x.r0 >= x.r1 || x.c0 >= x.c1) return RW_OK;
    int es = pb->esize;
    size_t off = m->off + (size_t)((x.r0 - m->r0) * m->ld + (x.c0 - m->c0)) * (size_t)es;
    rect lr = {x.r0 - sr0, x.r1 - sr0, x.c0 - sc0, x.c1 - sc0};
    int64_t rows = lr.r1 - lr.r0;
    rw_wname sw = g->w;
    sw.scale = true;
    size_t suid = uid_of(ws, &sw);
    bool bf16 = pb->dtype == RW_DTYPE_BF16;

    if (g->fmt == RW_WFMT_BF16 || !bf16) {
        if (g->fmt == RW_WFMT_FP8_BLOCK && !g->aligned) /* e4m3 needing re-quantization */
            return stage_weight(b, m->uid, g, pb, off, m->ld, lr, err);
        rw_moe_op o = op_new(RW_MOE_OP_COPY, es, 0, m->ld, &g->data, g->dst_r0 + lr.r0, lr.c0, rows,
                             lr.c1 - lr.c0);
        RW_CHECK(put_op(b, false, o, pb, off, m->ld, err));
        stage_forget(u, lr);
        return cov_add(u, lr, err);
    }
    if (g->fmt == RW_WFMT_MXFP8) {
        /* whole 1x32 blocks along K go straight through; the edges are staged */
        int64_t A = rw_roundup(lr.c0, RW_MXFP8_BLOCK), B = lr.c1 / RW_MXFP8_BLOCK * RW_MXFP8_BLOCK;
        if (A < B) {
            size_t o2 = off + (size_t)(A - lr.c0) * 2;
            rw_moe_op o =
                op_new(RW_MOE_OP_MXQ, 2, 0, m->ld, &g->data, g->dst_r0 + lr.r0, A, rows, B - A);
            o.scl = g->scl;
            RW_CHECK(put_op(b, false, o, pb, o2, m->ld, err));
            rect full = {lr.r0, lr.r1, A, B};
            stage_forget(u, full);
            RW_CHECK(cov_add(u, full, err));
            rect sr = {lr.r0, lr.r1, A / RW_MXFP8_BLOCK, B / RW_MXFP8_BLOCK};
            RW_CHECK(cov_add(&ws->units[suid], sr, err));
            rect left = {lr.r0, lr.r1, lr.c0, A}, right = {lr.r0, lr.r1, B, lr.c1};
            RW_CHECK(stage_weight(b, m->uid, g, pb, off, m->ld, left, err));
            return stage_weight(b, m->uid, g, pb, off + (size_t)(B - lr.c0) * 2, m->ld, right, err);
        }
        return stage_weight(b, m->uid, g, pb, off, m->ld, lr, err);
    }
    /* fp8 block from bf16: local 128x128 blocks whose valid part the piece covers go straight
     * through; the others are staged */
    const int64_t Q = RW_FP8_BLOCK;
    for (int64_t bi = lr.r0 / Q; bi * Q < lr.r1; bi++) {
        for (int64_t bj = lr.c0 / Q; bj * Q < lr.c1; bj++) {
            rect blk = {bi * Q, (bi + 1) * Q < g->vr ? (bi + 1) * Q : g->vr, bj * Q,
                        (bj + 1) * Q < g->vc ? (bj + 1) * Q : g->vc};
            rect in = {blk.r0 > lr.r0 ? blk.r0 : lr.r0, blk.r1 < lr.r1 ? blk.r1 : lr.r1,
                       blk.c0 > lr.c0 ? blk.c0 : lr.c0, blk.c1 < lr.c1 ? blk.c1 : lr.c1};
            size_t o2 = off + (size_t)((in.r0 - lr.r0) * m->ld + (in.c0 - lr.c0)) * 2;
            if (rect_contains(&in, &blk)) {
                rw_moe_op o = op_new(RW_MOE_OP_FP8Q, 2, 0, m->ld, &g->data, g->dst_r0 + blk.r0,
                                     blk.c0, blk.r1 - blk.r0, blk.c1 - blk.c0);
                o.scl = g->scl;
                RW_CHECK(put_op(b, true, o, pb, o2, m->ld, err));
                stage_forget(u, blk);
                RW_CHECK(cov_add(u, blk, err));
                rect sr = {bi, bi + 1, bj, bj + 1};
                RW_CHECK(cov_add(&ws->units[suid], sr, err));
            } else {
                RW_CHECK(stage_weight(b, m->uid, g, pb, o2, m->ld, in, err));
            }
        }
    }
    return RW_OK;
}

static rw_status emit(build *b, const pbase *pb, const mrect *m, rw_err *err) {
    geom g;
    RW_CHECK(unit_geom(b->ws, m->uid, &g, err));
    return m->scale ? emit_scale(b, &g, pb, m, err) : emit_weight(b, &g, pb, m, err);
}

/* Cuts a validated piece into per-unit matrix rectangles and emits each. */
static rw_status emit_piece(build *b, const rw_piece *p, const pinfo *pi, const pbase *pb,
                            rw_err *err) {
    rw_wset *ws = b->ws;
    int d = p->shard_dim;
    int64_t lo = p->shard_begin, hi = p->shard_begin + p->shard_len;
    size_t es = (size_t)pb->esize;
    if (pi->w.kind == RW_W_EXP_GATE_UP || pi->w.kind == RW_W_EXP_DOWN_ALL) {
        bool gu = pi->w.kind == RW_W_EXP_GATE_UP;
        int64_t E = pi->shape[0], R = pi->shape[1], C = pi->shape[2], I = ws->cfg.moe_intermediate;
        int64_t e0 = d == 0 ? lo : 0, e1 = d == 0 ? hi : E;
        if (p->layout == RW_PIECE_GATE_UP) {
            /* [E, 2 len, H]: gate rows [lo, hi) then up rows [lo, hi) per expert */
            int64_t len = p->shard_len;
            for (int64_t e = 0; e < E; e++) {
                size_t eb = (size_t)(e * 2 * len * C) * es;
                rw_wname gw = {RW_W_EXP_GATE, pi->w.layer, (int)e, false};
                rw_wname uw = {RW_W_EXP_UP, pi->w.layer, (int)e, false};
                mrect mg = {uid_of(ws, &gw), false, lo, hi, 0, C, eb, C};
                mrect mu = {uid_of(ws, &uw), false, lo, hi, 0, C, eb + (size_t)(len * C) * es, C};
                RW_CHECK(emit(b, pb, &mg, err));
                RW_CHECK(emit(b, pb, &mu, err));
            }
            return RW_OK;
        }
        int64_t fr0 = d == 1 ? lo : 0, fr1 = d == 1 ? hi : R;
        int64_t fc0 = d == 2 ? lo : 0, fc1 = d == 2 ? hi : C;
        int64_t ld = fc1 - fc0;
        for (int64_t e = e0; e < e1; e++) {
            size_t eb = (size_t)((e - e0) * (fr1 - fr0) * ld) * es;
            if (!gu) {
                rw_wname w = {RW_W_EXP_DOWN, pi->w.layer, (int)e, false};
                mrect m = {uid_of(ws, &w), false, fr0, fr1, fc0, fc1, eb, ld};
                RW_CHECK(emit(b, pb, &m, err));
                continue;
            }
            /* gate = fused rows [0, I), up = fused rows [I, 2I) */
            for (int half = 0; half < 2; half++) {
                int64_t h0 = half ? I : 0, a = fr0 > h0 ? fr0 : h0;
                int64_t z = fr1 < h0 + I ? fr1 : h0 + I;
                if (a >= z) continue;
                rw_wname w = {half ? RW_W_EXP_UP : RW_W_EXP_GATE, pi->w.layer, (int)e, false};
                mrect m = {uid_of(ws, &w),
                           false,
                           a - h0,
                           z - h0,
                           fc0,
                           fc1,
                           eb + (size_t)((a - fr0) * ld) * es,
                           ld};
                RW_CHECK(emit(b, pb, &m, err));
            }
        }
        return RW_OK;
    }
    /* one canonical matrix (1-D tensors as one row) */
    rw_wname w = pi->w;
    bool scale = w.scale;
    w.scale = false;
    int64_t R = pi->ndim == 1 ? 1 : pi->shape[0], C = pi->ndim == 1 ? pi->shape[0] : pi->shape[1];
    int md = pi->ndim == 1 ? (d == 0 ? 1 : -1) : d; /* sliced matrix dim */
    mrect m = {uid_of(ws, &w), scale, 0, R, 0, C, 0, C};
    if (md == 0) m.r0 = lo, m.r1 = hi;
    if (md == 1) m.c0 = lo, m.c1 = hi, m.ld = hi - lo;
    return emit(b, pb, &m, err);
}

/* ------------------------------------------------------------------------------------------ */
/* Flushing staged blocks                                                                       */
/* ------------------------------------------------------------------------------------------ */
static rw_status flush_reserve(build *b, size_t bytes, size_t *off, rw_err *err) {
    size_t o = (b->flush_len + 15) & ~(size_t)15;
    if (o + bytes > b->flush_cap) {
        size_t cap = b->flush_cap ? b->flush_cap : 4096;
        while (cap < o + bytes)
            cap *= 2;
        uint8_t *v = realloc(b->flushbuf, cap);
        if (!v) RW_FAIL(err, RW_E_OOM, "out of memory for staged results");
        b->flushbuf = v;
        b->flush_cap = cap;
    }
    *off = o;
    b->flush_len = o + bytes;
    return RW_OK;
}

/* Element (r, c) of a stage ready as a value: known, or raw e4m3 with its canonical scale. */
static bool stage_ready(const stage *s, const geom *g, int64_t r, int64_t c) {
    size_t i = (size_t)(r * s->cols + c);
    if (bit_get(s->have, i)) return true;
    if (!s->have_raw || !bit_get(s->have_raw, i) || !s->gs) return false;
    int64_t cr = r + (g->sdim == 0 ? g->s0 : 0), cc = c + (g->sdim == 1 ? g->s0 : 0);
    int64_t gr = cr / RW_FP8_BLOCK - s->gs_r0, gc = cc / RW_FP8_BLOCK - s->gs_c0;
    return bit_get(s->have_gs, (size_t)(gr * s->gs_cols + gc));
}

static float stage_value(const stage *s, const geom *g, int64_t r, int64_t c) {
    size_t i = (size_t)(r * s->cols + c);
    if (bit_get(s->have, i)) return s->val[i];
    int64_t cr = r + (g->sdim == 0 ? g->s0 : 0), cc = c + (g->sdim == 1 ? g->s0 : 0);
    int64_t gr = cr / RW_FP8_BLOCK - s->gs_r0, gc = cc / RW_FP8_BLOCK - s->gs_c0;
    return rw_e4m3_to_f32(s->raw[i]) * s->gs[gr * s->gs_cols + gc];
}

static void stage_drop_block(stage *s, rect blk) {
    for (int64_t r = blk.r0; r < blk.r1; r++)
        for (int64_t c = blk.c0; c < blk.c1; c++) {
            size_t i = (size_t)(r * s->cols + c);
            bit_clr(s->have, i);
            if (s->have_raw) bit_clr(s->have_raw, i);
        }
}

static bool stage_empty(const stage *s) {
    size_t words = ((size_t)(s->rows * s->cols) + 63) / 64;
    for (size_t i = 0; i < words; i++)
        if (s->have[i] || (s->have_raw && s->have_raw[i])) return false;
    return true;
}

/* Quantizes every staged block in the stage's dirty region that is now complete, into the flush
 * buffer, and queues the copies that place the results. */
static rw_status flush_unit(build *b, size_t uid, rw_err *err) {
    rw_wset *ws = b->ws;
    unit *u = &ws->units[uid];
    stage *s = u->st;
    if (!s || !s->is_dirty) return RW_OK;
    s->is_dirty = false;
    geom g;
    RW_CHECK(unit_geom(ws, uid, &g, err));
    rw_wname sw = g.w;
    sw.scale = true;
    unit *su = &ws->units[uid_of(ws, &sw)];
    int64_t qr = g.fmt == RW_WFMT_MXFP8 ? 1 : RW_FP8_BLOCK;
    int64_t qc = g.fmt == RW_WFMT_MXFP8 ? RW_MXFP8_BLOCK : RW_FP8_BLOCK;
    rect dr = s->dirty;
    for (int64_t bi = dr.r0 / qr; bi * qr < dr.r1; bi++) {
        for (int64_t bj = dr.c0 / qc; bj * qc < dr.c1; bj++) {
            rect blk = {bi * qr, (bi + 1) * qr < s->rows ? (bi + 1) * qr : s->rows, bj * qc,
                        (bj + 1) * qc < s->cols ? (bj + 1) * qc : s->cols};
            bool any = false, ready = true;
            for (int64_t r = blk.r0; r < blk.r1 && ready; r++)
                for (int64_t c = blk.c0; c < blk.c1 && ready; c++) {
                    size_t i = (size_t)(r * s->cols + c);
                    any |= bit_get(s->have, i) || (s->have_raw && bit_get(s->have_raw, i));
                    ready = stage_ready(s, &g, r, c);
                }
            if (!any || !ready) continue;
            int64_t nr = blk.r1 - blk.r0, nc = blk.c1 - blk.c0;
            uint32_t m = 0;
            for (int64_t r = blk.r0; r < blk.r1; r++)
                for (int64_t c = blk.c0; c < blk.c1; c++) {
                    uint32_t a = rw_f32_bits(stage_value(s, &g, r, c)) & 0x7fffffffu;
                    if (a > m) m = a;
                }
            size_t qoff, soff;
            RW_CHECK(flush_reserve(b, (size_t)(nr * nc), &qoff, err));
            RW_CHECK(flush_reserve(b, 4, &soff, err));
            uint8_t *q = b->flushbuf + qoff;
            rw_moe_op od, os;
            if (g.fmt == RW_WFMT_MXFP8) {
                uint8_t sc = rw_mxfp8_scale_from_amax(rw_bits_f32(m));
                b->flushbuf[soff] = sc;
                for (int64_t c = blk.c0; c < blk.c1; c++)
                    q[c - blk.c0] = rw_mxfp8_quantize_elem(stage_value(s, &g, blk.r0, c), sc);
                os = op_new(RW_MOE_OP_COPY, 1, soff, 1, &g.scl, g.dst_r0 + blk.r0, bj, 1, 1);
            } else {
                float sc = rw_fp8_block_scale_from_amax(rw_bits_f32(m));
                memcpy(b->flushbuf + soff, &sc, 4);
                for (int64_t r = blk.r0; r < blk.r1; r++)
                    for (int64_t c = blk.c0; c < blk.c1; c++)
                        q[(r - blk.r0) * nc + (c - blk.c0)] =
                            rw_fp8_block_quantize_elem(stage_value(s, &g, r, c), sc);
                os = op_new(RW_MOE_OP_COPY, 4, soff, 1, &g.scl, g.dst_r0 / RW_FP8_BLOCK + bi, bj, 1,
                            1);
            }
            od = op_new(RW_MOE_OP_COPY, 1, qoff, nc, &g.data, g.dst_r0 + blk.r0, blk.c0, nr, nc);
            RW_CHECK(opvec_push(&b->flush, &od, err));
            RW_CHECK(opvec_push(&b->flush, &os, err));
            RW_CHECK(cov_add(u, blk, err));
            rect sr = {bi, bi + 1, bj, bj + 1};
            RW_CHECK(cov_add(su, sr, err));
            stage_drop_block(s, blk);
        }
    }
    /* Keep canonical scales while local blocks still wait for them. */
    if (stage_empty(s) && (!s->gs || cov_complete(u, g.vr, g.vc))) {
        stage_free(s);
        u->st = NULL;
    }
    return RW_OK;
}

/* ------------------------------------------------------------------------------------------ */
/* Apply                                                                                        */
/* ------------------------------------------------------------------------------------------ */
/* Empties the build for the next batch; its vectors and buffers keep their memory. */
static void build_reset(build *b) {
    b->direct.n = b->fp8q.n = b->flush.n = 0;
    b->flush_len = 0;
    b->ntouched = 0;
    b->nup = 0;
    b->up_bytes = 0;
    b->needs_reads = false;
}

static void build_release(build *b) {
    free(b->direct.v);
    free(b->fp8q.v);
    free(b->flush.v);
    free(b->flushbuf);
    free(b->touched);
    free(b->up);
    memset(b, 0, sizeof *b);
}

/* After a build that stopped part-way: units it staged into stay staged, but their dirty marks
 * are dropped so that the next build that touches them lists them again (a stage marked dirty
 * is not added to a build's touched list; one left dirty would never be flushed). */
static void build_undirty(build *b) {
    for (size_t i = 0; i < b->ntouched; i++) {
        stage *s = b->ws->units[b->touched[i]].st;
        if (s) s->is_dirty = false;
    }
    b->ntouched = 0;
}

/* The table image of a batch: [direct ops | their unit prefix | fp8 ops | flush ops | their unit
 * prefix | flush results | gathered host parts], at offsets the executor reads. */
typedef struct table {
    size_t off_du, off_q, off_f, off_fu, off_fb, off_up, total;
    int64_t dunits, funits;
} table;

static table table_layout(const build *b) {
    table t;
    size_t osz = sizeof(rw_moe_op), nd = b->direct.n, nq = b->fp8q.n, nf = b->flush.n;
    t.off_du = nd * osz;
    t.off_q = t.off_du + (nd + 1) * 8;
    t.off_f = t.off_q + nq * osz;
    t.off_fu = t.off_f + nf * osz;
    t.off_fb = (t.off_fu + (nf + 1) * 8 + 255) & ~(size_t)255;
    t.off_up = (t.off_fb + b->flush_len + 255) & ~(size_t)255;
    t.total = t.off_up + b->up_bytes;
    t.dunits = t.funits = 0;
    return t;
}

/* Writes the table image into h; `base` is the address the executor will see it at (the device
 * copy, or h itself on the host): flush ops and ops reading gathered host parts point there. */
static void table_fill(const build *b, table *t, uint8_t *h, uint64_t base) {
    size_t osz = sizeof(rw_moe_op), nd = b->direct.n, nq = b->fp8q.n, nf = b->flush.n;
    if (nd) memcpy(h, b->direct.v, nd * osz);
    int64_t *du = (int64_t *)(void *)(h + t->off_du), acc = 0;
    for (size_t i = 0; i < nd; i++) {
        du[i] = acc;
        acc += rw_moe_op_units(&b->direct.v[i]);
    }
    du[nd] = acc;
    t->dunits = acc;
    if (nq) memcpy(h + t->off_q, b->fp8q.v, nq * osz);
    rw_moe_op *fo = (rw_moe_op *)(void *)(h + t->off_f);
    if (nf) memcpy(fo, b->flush.v, nf * osz);
    int64_t *fu = (int64_t *)(void *)(h + t->off_fu);
    acc = 0;
    for (size_t i = 0; i < nf; i++) {
        fo[i].src += base + t->off_fb; /* offsets into the flush results -> addresses */
        fu[i] = acc;
        acc += rw_moe_op_units(&fo[i]);
    }
    fu[nf] = acc;
    t->funits = acc;
    if (b->flush_len) memcpy(h + t->off_fb, b->flushbuf, b->flush_len);
    /* the parts of host pieces the ops read, gathered row by row; ops re-pointed at them */
    for (size_t i = 0; i < b->nup; i++) {
        const struct upl *u = &b->up[i];
        size_t rb = (size_t)u->cols * (size_t)u->es;
        for (int64_t r = 0; r < u->rows; r++)
            memcpy(h + t->off_up + u->off + (size_t)r * rb,
                   u->host + (size_t)(r * u->ld) * (size_t)u->es, rb);
        rw_moe_op *o = u->fp8q ? (rw_moe_op *)(void *)(h + t->off_q) + u->idx
                               : (rw_moe_op *)(void *)h + u->idx;
        o->src += base + t->off_up;
    }
}

/* Fills the table image into host memory `h` (pinned), copies it to `d` (device) on b->s and
 * launches the direct scatter, the fp8 block quantizer and the scatter of staged results. */
static rw_status launch_device(build *b, table *t, uint8_t *h, uint8_t *d, rw_err *err) {
    size_t nd = b->direct.n, nq = b->fp8q.n, nf = b->flush.n;
    table_fill(b, t, h, (uint64_t)(uintptr_t)d);
    rw_status st = rw_memcpy(d, RW_PLACE_DEVICE, h, RW_PLACE_HOST, t->total, b->s, err);
    if (st == RW_OK && nd)
        st =
            rw_moe_scatter_cuda((const rw_moe_op *)(void *)d,
                                (const int64_t *)(void *)(d + t->off_du), nd, t->dunits, b->s, err);
    if (st == RW_OK && nq)
        st = rw_moe_fp8q_cuda((const rw_moe_op *)(void *)(d + t->off_q), nq, b->s, err);
    if (st == RW_OK && nf)
        st =
            rw_moe_scatter_cuda((const rw_moe_op *)(void *)(d + t->off_f),
                                (const int64_t *)(void *)(d + t->off_fu), nf, t->funits, b->s, err);
    return st;
}

/* rw_wset_apply_batch on a device set: the table through one of the set's two pinned slots
 * (alternating, each guarded by an event) into stream-ordered device memory. */
static rw_status run_device(build *b, table *t, rw_err *err) {
    rw_wset *ws = b->ws;
    if (b->direct.n + b->fp8q.n + b->flush.n == 0) return RW_OK;
    rw_moe_host_slot *sl = &ws->slots[ws->slot_next];
    ws->slot_next ^= 1;
    RW_CHECK(rw_moe_slot_acquire(sl, t->total, err));
    void *dtab = NULL;
    RW_CHECK(rw_moe_dev_alloc_async(t->total, b->s, &dtab, err));
    rw_status st = launch_device(b, t, sl->host, dtab, err);
    rw_moe_dev_free_async(dtab, b->s);
    rw_status st2 = rw_moe_slot_release(sl, b->s, st == RW_OK ? err : NULL);
    return st != RW_OK ? st : st2;
}

/* The same table image on the host, run by the CPU reference in the same order. */
static rw_status run_host(build *b, rw_err *err) {
    size_t nd = b->direct.n, nq = b->fp8q.n, nf = b->flush.n;
    if (nd + nq + nf == 0) return RW_OK;
    table t = table_layout(b);
    uint8_t *h = malloc(t.total);
    if (!h) RW_FAIL(err, RW_E_OOM, "apply: out of memory for a table of %zu bytes", t.total);
    table_fill(b, &t, h, (uint64_t)(uintptr_t)h);
    rw_moe_ops_run_ref((const rw_moe_op *)(void *)h, nd);
    rw_moe_ops_run_ref((const rw_moe_op *)(void *)(h + t.off_q), nq);
    rw_moe_ops_run_ref((const rw_moe_op *)(void *)(h + t.off_f), nf);
    free(h);
    return RW_OK;
}

/* A prepared batch: the build (ops, staged results, gathered host parts) and the per-piece
 * arrays, all kept between batches so that steady-state preparation does not allocate. */
struct rw_wset_batch {
    build b;
    pinfo *pi;
    pbase *pb;
    size_t cap;        /* pieces pi / pb hold */
    uint8_t *hostcopy; /* device pieces of a host set, copied down */
    size_t hostcopy_cap;
    table t;    /* layout of the prepared table image */
    bool ready; /* prepared and not launched yet */
};

rw_status rw_wset_batch_create(rw_wset_batch **out, rw_err *err) {
    *out = calloc(1, sizeof **out);
    if (!*out) RW_FAIL(err, RW_E_OOM, "apply: out of memory for a batch");
    return RW_OK;
}

void rw_wset_batch_destroy(rw_wset_batch *bt) {
    if (!bt) return;
    build_release(&bt->b);
    free(bt->pi);
    free(bt->pb);
    free(bt->hostcopy);
    free(bt);
}

rw_status rw_wset_batch_prepare(rw_wset *ws, const rw_piece *pieces, size_t n, bool no_device_reads,
                                rw_stream s, rw_wset_batch *bt, bool *needs_reads, rw_err *err) {
    if (needs_reads) *needs_reads = false;
    if (!ws) RW_FAIL(err, RW_E_INVALID_ARG, "wset is NULL");
    if (!bt) RW_FAIL(err, RW_E_INVALID_ARG, "apply: NULL batch");
    if (n && !pieces) RW_FAIL(err, RW_E_INVALID_ARG, "apply: NULL piece array");
    bt->ready = false;
    if (rw_arena_is_released(ws->arena))
        RW_FAIL(err, RW_E_STATE, "apply: the weight memory is released");
    build *b = &bt->b;
    b->ws = ws;
    b->s = s;
    build_reset(b);
    b->no_dev_reads = no_device_reads;
    if (n > bt->cap) {
        pinfo *pi = realloc(bt->pi, n * sizeof *pi);
        if (pi) bt->pi = pi;
        pbase *pb = realloc(bt->pb, n * sizeof *pb);
        if (pb) bt->pb = pb;
        if (!pi || !pb) RW_FAIL(err, RW_E_OOM, "apply: out of memory for %zu pieces", n);
        bt->cap = n;
    }
    pinfo *pi = bt->pi;
    pbase *pb = bt->pb;
    if (n) {
        memset(pi, 0, n * sizeof *pi);
        memset(pb, 0, n * sizeof *pb);
    }
    rw_status st = RW_OK;
    /* 1. validate everything before touching anything */
    for (size_t i = 0; i < n; i++) {
        st = check_piece(ws, &pieces[i], &pi[i], err);
        if (st != RW_OK) {
            if (n > 1) rw_err_prefix(err, "piece %zu of %zu", i, n);
            return st;
        }
    }
    /* 2. where the executor reads each piece: a device set reads device pieces in place and
     * gets the parts of host pieces its ops need gathered into the table upload; a host set
     * copies device pieces down first */
    bool dev = ws->place == RW_PLACE_DEVICE;
    size_t xfer = 0;
    for (size_t i = 0; i < n; i++)
        if (!dev && pieces[i].place == RW_PLACE_DEVICE)
            xfer += (rw_piece_nbytes(&pieces[i]) + 255) & ~(size_t)255;
    if (xfer && no_device_reads) {
        if (needs_reads) *needs_reads = true;
        return RW_OK;
    }
    if (xfer > bt->hostcopy_cap) {
        uint8_t *h = realloc(bt->hostcopy, xfer);
        if (!h) RW_FAIL(err, RW_E_OOM, "apply: out of memory for %zu bytes of device pieces", xfer);
        bt->hostcopy = h;
        bt->hostcopy_cap = xfer;
    }
    size_t at = 0;
    for (size_t i = 0; i < n; i++) {
        const rw_piece *p = &pieces[i];
        size_t nb = rw_piece_nbytes(p);
        pb[i].esize = (int)rw_dtype_size(p->dtype);
        pb[i].dtype = p->dtype;
        if (p->place == RW_PLACE_HOST) {
            pb[i].host = p->data;
            pb[i].exec = dev ? NULL : p->data;
            pb[i].upload = dev;
        } else if (dev) {
            pb[i].exec = p->data;
        } else {
            RW_CHECK(
                rw_memcpy(bt->hostcopy + at, RW_PLACE_HOST, p->data, RW_PLACE_DEVICE, nb, s, err));
            pb[i].exec = pb[i].host = bt->hostcopy + at;
            at += (nb + 255) & ~(size_t)255;
        }
    }
    if (xfer) RW_CHECK(rw_stream_sync(s, err));
    /* 3. ops for every piece, staging partial quantization blocks */
    for (size_t i = 0; i < n && st == RW_OK; i++) {
        st = emit_piece(b, &pieces[i], &pi[i], &pb[i], err);
        if (st != RW_OK && !b->needs_reads) rw_err_prefix(err, "tensor '%s'", pieces[i].name);
    }
    for (size_t i = 0; st == RW_OK && i < b->ntouched; i++)
        st = flush_unit(b, b->touched[i], err);
    if (st != RW_OK) {
        bool again = b->needs_reads;
        build_undirty(b);
        build_reset(b);
        if (!again) return st;
        /* what was emitted is emitted again by the next prepare of these pieces (coverage and
         * staged values are idempotent), and nothing ran */
        if (needs_reads) *needs_reads = true;
        return RW_OK;
    }
    bt->t = table_layout(b);
    bt->ready = true;
    return RW_OK;
}

size_t rw_wset_batch_table_bytes(const rw_wset_batch *bt) {
    if (!bt || !bt->ready) return 0;
    if (bt->b.direct.n + bt->b.fp8q.n + bt->b.flush.n == 0) return 0;
    return bt->t.total;
}

rw_status rw_wset_batch_launch(rw_wset *ws, rw_wset_batch *bt, void *host_table, void *dev_table,
                               rw_stream s, rw_err *err) {
    if (!ws || !bt) RW_FAIL(err, RW_E_INVALID_ARG, "apply: NULL weight set or batch");
    if (!bt->ready || bt->b.ws != ws)
        RW_FAIL(err, RW_E_STATE, "apply: the batch is not prepared for this weight set");
    bt->ready = false;
    build *b = &bt->b;
    b->s = s;
    if (b->direct.n + b->fp8q.n + b->flush.n == 0) return RW_OK;
    if (ws->place != RW_PLACE_DEVICE) return run_host(b, err);
    if (!host_table || !dev_table)
        RW_FAIL(err, RW_E_INVALID_ARG, "apply: a device launch needs host and device tables");
    return launch_device(b, &bt->t, host_table, dev_table, err);
}

rw_status rw_wset_apply_batch(rw_wset *ws, const rw_piece *pieces, size_t n, rw_stream s,
                              rw_err *err) {
    if (!ws) RW_FAIL(err, RW_E_INVALID_ARG, "wset is NULL");
    if (n && !pieces) RW_FAIL(err, RW_E_INVALID_ARG, "apply: NULL piece array");
    if (rw_arena_is_released(ws->arena))
        RW_FAIL(err, RW_E_STATE, "apply: the weight memory is released");
    if (n == 0) return RW_OK;
    if (!ws->own) RW_CHECK(rw_wset_batch_create(&ws->own, err));
    rw_wset_batch *bt = ws->own;
    RW_CHECK(rw_wset_batch_prepare(ws, pieces, n, false, s, bt, NULL, err));
    bt->ready = false;
    /* 4. run (host bytes were gathered into the table upload on a device set) */
    if (ws->place == RW_PLACE_DEVICE) return run_device(&bt->b, &bt->t, err);
    return run_host(&bt->b, err);
}

rw_status rw_wset_apply(rw_wset *ws, const rw_piece *p, rw_stream s, rw_err *err) {
    if (!p) RW_FAIL(err, RW_E_INVALID_ARG, "apply: NULL piece");
    return rw_wset_apply_batch(ws, p, 1, s, err);
}

/* ------------------------------------------------------------------------------------------ */
/* Completeness                                                                                 */
/* ------------------------------------------------------------------------------------------ */
void rw_wset_mark_clear(rw_wset *ws) {
    if (!ws) return;
    for (size_t i = 0; i < ws->nunits; i++) {
        ws->units[i].ncov = 0;
        stage_free(ws->units[i].st);
        ws->units[i].st = NULL;
    }
}

bool rw_wset_complete(const rw_wset *ws, char *missing, size_t cap) {
    if (missing && cap) missing[0] = 0;
    if (!ws) return false;
    size_t nmiss = 0, len = 0;
    for (size_t i = 0; i < ws->nunits; i++) {
        geom g;
        if (unit_geom(ws, i, &g, NULL) != RW_OK || !g.present) continue;
        int64_t rows, cols;
        unit_extent(&g, &rows, &cols);
        if (cov_complete(&ws->units[i], rows, cols)) continue;
        if (missing && cap && nmiss < 8) {
            rw_wname w = g.w;
            w.scale = g.scale;
            char nm[192];
            rw_name_format(&w, nm, sizeof nm);
            int k = snprintf(missing + len, cap - len, "%s%s%s", nmiss ? ", " : "", nm,
                             ws->units[i].ncov ? " (partly)" : "");
            if (k > 0) len = len + (size_t)k < cap ? len + (size_t)k : cap - 1;
        }
        nmiss++;
    }
    if (missing && cap && nmiss > 8) snprintf(missing + len, cap - len, " and %zu more", nmiss - 8);
    return nmiss == 0;
}

/* ------------------------------------------------------------------------------------------ */
/* Readback                                                                                     */
/* ------------------------------------------------------------------------------------------ */
/* Host view of a unit's target memory (data or scale): the arena itself on a host set, a copy
 * on a device set (*tmp, to free). */
static rw_status host_view(const rw_wset *ws, uint64_t base, size_t bytes, uint64_t *out,
                           void **tmp, rw_err *err) {
    *tmp = NULL;
    if (ws->place == RW_PLACE_HOST) {
        *out = base;
        return RW_OK;
    }
    void *t = malloc(bytes ? bytes : 1);
    if (!t) RW_FAIL(err, RW_E_OOM, "readback: out of memory for %zu bytes", bytes);
    rw_status st = rw_memcpy(t, RW_PLACE_HOST, (const void *)(uintptr_t)base, RW_PLACE_DEVICE,
                             bytes, NULL, err);
    if (st == RW_OK) st = rw_stream_sync(NULL, err);
    if (st != RW_OK) {
        free(t);
        return st;
    }
    *tmp = t;
    *out = (uint64_t)(uintptr_t)t;
    return RW_OK;
}

/* Reads local rows [r0, r1) of unit uid (all its columns) into dst, row-major. */
static rw_status read_unit(const rw_wset *ws, size_t uid, int64_t r0, int64_t r1, uint8_t *dst,
                           rw_err *err) {
    geom g;
    RW_CHECK(unit_geom(ws, uid, &g, err));
    int64_t rows, cols;
    unit_extent(&g, &rows, &cols);
    rw_moe_tgt t = g.scale ? g.scl : g.data;
    uint64_t hb = 0;
    void *tmp = NULL;
    RW_CHECK(host_view(ws, g.scale ? g.scl_base : g.data_base, g.scale ? g.scl_bytes : g.data_bytes,
                       &hb, &tmp, err));
    t.base = hb;
    size_t es = g.scale ? (g.fmt == RW_WFMT_MXFP8 ? 1 : 4) : (g.fmt == RW_WFMT_BF16 ? 2 : 1);
    int64_t row0 = g.scale && g.fmt == RW_WFMT_FP8_BLOCK ? g.dst_r0 / RW_FP8_BLOCK : g.dst_r0;
    for (int64_t r = r0; r < r1; r++)
        for (int64_t c = 0; c < cols; c++)
            memcpy(dst + (size_t)((r - r0) * cols + c) * es,
                   (const uint8_t *)(uintptr_t)hb + (size_t)rw_moe_tgt_offset(&t, row0 + r, c) * es,
                   es);
    free(tmp);
    (void)rows;
    return RW_OK;
}

/* Shapes: a weight's unpadded local slice ([rows, cols], 1-D tensors [n]); mxfp8 scales the
 * matching [rows, cols / 32] slice; fp8-block scales the rank's own local blocks
 * [ceil(rows / 128), ceil(cols / 128)] (equal to the canonical blocks only when the slice is
 * block-aligned); fused names [E, 2S, H] (gate slice then up slice per expert) and [E, H, S].
 * On a device set the caller first synchronizes the stream its applies were queued on. */
rw_status rw_wset_readback(const rw_wset *ws, const char *name, void *dst, size_t cap, size_t *len,
                           int *ndim, int64_t *shape, rw_err *err) {
    if (!ws || !name || !len) RW_FAIL(err, RW_E_INVALID_ARG, "readback: NULL argument");
    rw_wname w;
    RW_CHECK(rw_name_parse(name, &ws->cfg, &w, err));
    rw_wname plain = w;
    plain.scale = false;
    rw_wfmt fmt = rw_quant_policy(&ws->cfg, &plain);
    if (w.scale && fmt == RW_WFMT_BF16)
        RW_FAIL(err, RW_E_NOT_FOUND, "readback '%s': the weight is stored in bf16, no scale", name);
    if (w.kind == RW_W_LM_HEAD && ws->cfg.tie_word_embeddings)
        RW_FAIL(err, RW_E_NOT_FOUND, "readback '%s': lm_head is tied to embed_tokens", name);
    int nd;
    int64_t shp[RW_MAX_DIMS];
    size_t total;
    if (w.kind == RW_W_EXP_GATE_UP || w.kind == RW_W_EXP_DOWN_ALL) {
        /* fused: [E, 2S, H] (gate slice then up slice per expert) or [E, H, S] */
        int64_t E = ws->cfg.num_experts, H = ws->cfg.hidden_size, S = ws->d.S;
        size_t es = fmt == RW_WFMT_BF16 ? 2 : 1;
        nd = 3;
        shp[0] = E;
        shp[1] = w.kind == RW_W_EXP_GATE_UP ? 2 * S : H;
        shp[2] = w.kind == RW_W_EXP_GATE_UP ? H : S;
        total = (size_t)(shp[0] * shp[1] * shp[2]) * es;
        if (dst) {
            if (cap < total)
                RW_FAIL(err, RW_E_RANGE, "readback '%s': %zu bytes needed, buffer holds %zu", name,
                        total, cap);
            uint8_t *o = dst;
            for (int64_t e = 0; e < E; e++) {
                if (w.kind == RW_W_EXP_GATE_UP) {
                    rw_wname gw = {RW_W_EXP_GATE, w.layer, (int)e, false};
                    rw_wname uw = {RW_W_EXP_UP, w.layer, (int)e, false};
                    RW_CHECK(read_unit(ws, uid_of(ws, &gw), 0, S, o, err));
                    o += (size_t)(S * H) * es;
                    RW_CHECK(read_unit(ws, uid_of(ws, &uw), 0, S, o, err));
                    o += (size_t)(S * H) * es;
                } else {
                    rw_wname dw = {RW_W_EXP_DOWN, w.layer, (int)e, false};
                    RW_CHECK(read_unit(ws, uid_of(ws, &dw), 0, H, o, err));
                    o += (size_t)(H * S) * es;
                }
            }
        }
    } else {
        size_t uid = uid_of(ws, &w);
        geom g;
        RW_CHECK(unit_geom(ws, uid, &g, err));
        int64_t rows, cols;
        unit_extent(&g, &rows, &cols);
        size_t es = w.scale ? (fmt == RW_WFMT_MXFP8 ? 1 : 4) : (fmt == RW_WFMT_BF16 ? 2 : 1);
        rw_shard_plan p;
        RW_CHECK(rw_moe_plan_tensor(&ws->cfg, ws->d.tp, ws->d.rank, &plain, &p, err));
        if (p.ndim == 1 && !w.scale) {
            nd = 1;
            shp[0] = cols;
        } else {
            nd = 2;
            shp[0] = rows;
            shp[1] = cols;
        }
        total = (size_t)(rows * cols) * es;
        if (dst) {
            if (cap < total)
                RW_FAIL(err, RW_E_RANGE, "readback '%s': %zu bytes needed, buffer holds %zu", name,
                        total, cap);
            RW_CHECK(read_unit(ws, uid, 0, rows, dst, err));
        }
    }
    *len = total;
    if (ndim) *ndim = nd;
    if (shape)
        for (int i = 0; i < nd; i++)
            shape[i] = shp[i];
    return RW_OK;
}

rw_status rw_wset_checksum(const rw_wset *ws, const char *name, uint64_t *out, rw_err *err) {
    if (!out) RW_FAIL(err, RW_E_INVALID_ARG, "checksum: NULL output");
    size_t len;
    RW_CHECK(rw_wset_readback(ws, name, NULL, 0, &len, NULL, NULL, err));
    void *buf = malloc(len ? len : 1);
    if (!buf) RW_FAIL(err, RW_E_OOM, "checksum '%s': out of memory for %zu bytes", name, len);
    rw_status st = rw_wset_readback(ws, name, buf, len, &len, NULL, NULL, err);
    if (st == RW_OK) *out = rw_checksum64(buf, len, 0);
    free(buf);
    return st;
}
