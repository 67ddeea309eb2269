/* wset.c - the weight set of one rank: every local weight in its final layout in one arena (host
 * for the CPU backend, device for CUDA): creation and allocation, the geometry of each tracked
 * unit, coverage, accessors and completeness. The piece-apply path that updates call is in
 * wset_apply.c (pieces -> scatter ops), wset_stage.c (partly covered quantization blocks),
 * wset_batch.c (one batch's table and launches); readback in wset_read.c.
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
#include "wset_internal.h"

#include <stdio.h>
#include <stdlib.h>

/* The unit of a canonical per-tensor name; SIZE_MAX for fused names (they span many units). */
size_t wset_uid_of(const rw_wset *ws, const rw_wname *w) {
    size_t base = U_GLOBAL + (size_t)(w->layer < 0 ? 0 : w->layer) * wset_per_layer(ws);
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
    size_t x = uid - U_GLOBAL, pl = wset_per_layer(ws);
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

static void tgt_rows(rw_moe_tgt *t, const void *base, int64_t ld) {
    memset(t, 0, sizeof *t);
    t->base = (uint64_t)(uintptr_t)base;
    t->ld = ld;
    t->rowmap = RW_MOE_RM_IDENT;
    t->addr = RW_MOE_AD_ROWS;
}

rw_status wset_unit_geom(const rw_wset *ws, size_t uid, geom *g, rw_err *err) {
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
void wset_unit_extent(const geom *g, int64_t *rows, int64_t *cols) {
    if (!g->scale) {
        *rows = g->vr;
        *cols = g->vc;
    } else if (g->fmt == RW_WFMT_MXFP8) {
        *rows = g->vr;
        *cols = g->vc / RW_MXFP8_BLOCK;
    } else {
        *rows = wset_cdiv(g->vr, RW_FP8_BLOCK);
        *cols = wset_cdiv(g->vc, RW_FP8_BLOCK);
    }
}

/* ------------------------------------------------------------------------------------------ */
/* Coverage                                                                                     */
/* ------------------------------------------------------------------------------------------ */
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

rw_status wset_cov_add(unit *u, rect r, rw_err *err) {
    if (r.r0 >= r.r1 || r.c0 >= r.c1) return RW_OK;
    /* absorb every rectangle that r contains or merges with, until none is left */
    for (bool changed = true; changed;) {
        changed = false;
        for (uint32_t i = 0; i < u->ncov; i++) {
            if (wset_rect_contains(&u->cov[i], &r)) return RW_OK;
            rect t = r;
            if (wset_rect_contains(&r, &u->cov[i]) || rect_merge(&t, &u->cov[i])) {
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
bool wset_cov_complete(const unit *u, int64_t rows, int64_t cols) {
    if (rows <= 0 || cols <= 0) return true;
    rect full = {0, rows, 0, cols};
    for (uint32_t i = 0; i < u->ncov; i++)
        if (wset_rect_contains(&u->cov[i], &full)) return true;
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
                hit = wset_rect_contains(&u->cov[i], &cell);
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

/* q [nq, H], k and v [nkv, H] as views of the layer's fused bf16 qkv [nq + 2 nkv, H] (the order
 * rw_layer_weights promises); nothing to do while only measuring (no memory yet). */
static void qkv_views(rw_layer_weights *lw, int64_t nq, int64_t nkv, int64_t H) {
    uint8_t *base = lw->qkv.data;
    if (!base) return;
    size_t row = (size_t)H * rw_dtype_size(lw->qkv.dtype);
    rw_place pl = lw->qkv.place;
    int dev = lw->qkv.device;
    lw->q = rw_tensor_view(base, lw->qkv.dtype, 2, SHP(nq, H), pl, dev);
    lw->k = rw_tensor_view(base + (size_t)nq * row, lw->qkv.dtype, 2, SHP(nkv, H), pl, dev);
    lw->v = rw_tensor_view(base + (size_t)(nq + nkv) * row, lw->qkv.dtype, 2, SHP(nkv, H), pl, dev);
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
        if (af == RW_WFMT_BF16) {
            /* one allocation, q, k, v rows back to back: the backend runs one GEMM over them */
            RW_CHECK(take(ac, wd, 2, SHP(nq + 2 * nkv, H), &lw->qkv, err));
            qkv_views(lw, nq, nkv, H);
        } else {
            RW_CHECK(take(ac, wd, 2, SHP(nq, H), &lw->q, err));
            RW_CHECK(take(ac, wd, 2, SHP(nkv, H), &lw->k, err));
            RW_CHECK(take(ac, wd, 2, SHP(nkv, H), &lw->v, err));
        }
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
                RW_CHECK(take(ac, RW_DTYPE_F32, 3, SHP(E, 2 * P / 128, wset_cdiv(H, 128)),
                              &lw->w13_scale, err));
                RW_CHECK(take(ac, RW_DTYPE_F32, 3, SHP(E, wset_cdiv(H, 128), P / 128),
                              &lw->w2_scale, err));
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
    ws->nunits = U_GLOBAL + (size_t)cfg->num_layers * wset_per_layer(ws);
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

void rw_wset_destroy(rw_wset *ws) {
    if (!ws) return;
    if (ws->units)
        for (size_t i = 0; i < ws->nunits; i++) {
            free(ws->units[i].cov);
            wset_stage_free(ws->units[i].st);
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

uint64_t rw_wset_generation(const rw_wset *ws) {
    return ws->gen;
}

/* ------------------------------------------------------------------------------------------ */
/* Completeness                                                                                 */
/* ------------------------------------------------------------------------------------------ */
void rw_wset_mark_clear(rw_wset *ws) {
    if (!ws) return;
    for (size_t i = 0; i < ws->nunits; i++) {
        ws->units[i].ncov = 0;
        wset_stage_free(ws->units[i].st);
        ws->units[i].st = NULL;
    }
}

bool rw_wset_complete(const rw_wset *ws, char *missing, size_t cap) {
    if (missing && cap) missing[0] = 0;
    if (!ws) return false;
    size_t nmiss = 0, len = 0;
    for (size_t i = 0; i < ws->nunits; i++) {
        geom g;
        if (wset_unit_geom(ws, i, &g, NULL) != RW_OK || !g.present) continue;
        int64_t rows, cols;
        wset_unit_extent(&g, &rows, &cols);
        if (wset_cov_complete(&ws->units[i], rows, cols)) continue;
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
