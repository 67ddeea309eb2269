/* wset_apply.c - the first half of the piece-apply path: validates a piece against the model and
 * cuts it into per-unit matrix rectangles, each intersected with this rank's slice (unpadded
 * offsets) and turned into scatter ops (moe_layout.h): a copy into the final layout, or quantize
 * (mxfp8 1x32, fp8 128x128 local blocks) and pack in the same pass. Parts of a quantization block
 * the piece covers only partly go to the unit's stage (wset_stage.c). The ops are run per batch
 * by wset_batch.c. */
#include "wset_internal.h"

#include <stdlib.h>

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

rw_status wset_check_piece(const rw_wset *ws, const rw_piece *p, pinfo *pi, rw_err *err) {
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
    return wset_check_piece(ws, p, &pi, err);
}

/* ------------------------------------------------------------------------------------------ */
/* Building ops                                                                                 */
/* ------------------------------------------------------------------------------------------ */
rw_status wset_opvec_push(opvec *o, const rw_moe_op *op, rw_err *err) {
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

/* ------------------------------------------------------------------------------------------ */
/* Building ops                                                                                 */
/* ------------------------------------------------------------------------------------------ */

/* Queues op `o` reading the rectangle at byte `off` of the piece (row stride ld elements of
 * o->esize bytes): directly from the executor's copy, or from a gathered upload. */
static rw_status put_op(build *b, bool fp8q, rw_moe_op o, const pbase *pb, size_t off, int64_t ld,
                        rw_err *err) {
    opvec *v = fp8q ? &b->fp8q : &b->direct;
    if (!pb->upload) {
        o.src = (uint64_t)(uintptr_t)(pb->exec + off);
        o.src_ld = ld;
        return wset_opvec_push(v, &o, err);
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
    return wset_opvec_push(v, &o, err);
}

/* A scale piece's rectangle (mx: [R, C/32] entries; fp8: canonical blocks). */
static rw_status emit_scale(build *b, const geom *g, const pbase *pb, const mrect *m, rw_err *err) {
    rw_wname sw = g->w;
    sw.scale = true;
    unit *su = &b->ws->units[wset_uid_of(b->ws, &sw)];
    if (g->fmt == RW_WFMT_FP8_BLOCK && !g->aligned)
        return wset_stage_scales(b, m->uid, g, pb, m, err);
    /* slice in scale coordinates */
    int64_t q = g->fmt == RW_WFMT_MXFP8 ? RW_MXFP8_BLOCK : RW_FP8_BLOCK;
    int64_t sr0 = 0, sr1, sc0 = 0, sc1;
    int64_t srows, scols;
    if (g->fmt == RW_WFMT_MXFP8) {
        srows = g->R;
        scols = g->C / q;
    } else {
        srows = wset_cdiv(g->R, q);
        scols = wset_cdiv(g->C, q);
    }
    sr1 = srows;
    sc1 = scols;
    if (g->sdim == 0) {
        sr0 = g->fmt == RW_WFMT_MXFP8 ? g->s0 : g->s0 / q;
        sr1 = g->fmt == RW_WFMT_MXFP8 ? g->s1 : wset_cdiv(g->s1, q);
    } else if (g->sdim == 1) {
        sc0 = g->s0 / q;
        sc1 = g->fmt == RW_WFMT_MXFP8 ? g->s1 / q : wset_cdiv(g->s1, q);
    }
    rect x = {m->r0 > sr0 ? m->r0 : sr0, m->r1 < sr1 ? m->r1 : sr1, m->c0 > sc0 ? m->c0 : sc0,
              m->c1 < sc1 ? m->c1 : sc1};
    if (x.r0 >= x.r1 || x.c0 >= x.c1) return RW_OK;
    int es = g->fmt == RW_WFMT_MXFP8 ? 1 : 4;
    size_t off = m->off + (size_t)((x.r0 - m->r0) * m->ld + (x.c0 - m->c0)) * (size_t)es;
    int64_t r0 = g->fmt == RW_WFMT_MXFP8 ? g->dst_r0 : g->dst_r0 / RW_FP8_BLOCK;
    rw_moe_op o = wset_op_new(RW_MOE_OP_COPY, es, 0, m->ld, &g->scl, r0 + x.r0 - sr0, x.c0 - sc0,
                              x.r1 - x.r0, x.c1 - x.c0);
    RW_CHECK(put_op(b, false, o, pb, off, m->ld, err));
    rect lr = {x.r0 - sr0, x.r1 - sr0, x.c0 - sc0, x.c1 - sc0};
    return wset_cov_add(su, lr, err);
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
    size_t suid = wset_uid_of(ws, &sw);
    bool bf16 = pb->dtype == RW_DTYPE_BF16;

    if (g->fmt == RW_WFMT_BF16 || !bf16) {
        if (g->fmt == RW_WFMT_FP8_BLOCK && !g->aligned) /* e4m3 needing re-quantization */
            return wset_stage_weight(b, m->uid, g, pb, off, m->ld, lr, err);
        rw_moe_op o = wset_op_new(RW_MOE_OP_COPY, es, 0, m->ld, &g->data, g->dst_r0 + lr.r0, lr.c0,
                                  rows, lr.c1 - lr.c0);
        RW_CHECK(put_op(b, false, o, pb, off, m->ld, err));
        wset_stage_forget(u, lr);
        return wset_cov_add(u, lr, err);
    }
    if (g->fmt == RW_WFMT_MXFP8) {
        /* whole 1x32 blocks along K go straight through; the edges are staged */
        int64_t A = rw_roundup(lr.c0, RW_MXFP8_BLOCK), B = lr.c1 / RW_MXFP8_BLOCK * RW_MXFP8_BLOCK;
        if (A < B) {
            size_t o2 = off + (size_t)(A - lr.c0) * 2;
            rw_moe_op o = wset_op_new(RW_MOE_OP_MXQ, 2, 0, m->ld, &g->data, g->dst_r0 + lr.r0, A,
                                      rows, B - A);
            o.scl = g->scl;
            RW_CHECK(put_op(b, false, o, pb, o2, m->ld, err));
            rect full = {lr.r0, lr.r1, A, B};
            wset_stage_forget(u, full);
            RW_CHECK(wset_cov_add(u, full, err));
            rect sr = {lr.r0, lr.r1, A / RW_MXFP8_BLOCK, B / RW_MXFP8_BLOCK};
            RW_CHECK(wset_cov_add(&ws->units[suid], sr, err));
            rect left = {lr.r0, lr.r1, lr.c0, A}, right = {lr.r0, lr.r1, B, lr.c1};
            RW_CHECK(wset_stage_weight(b, m->uid, g, pb, off, m->ld, left, err));
            return wset_stage_weight(b, m->uid, g, pb, off + (size_t)(B - lr.c0) * 2, m->ld, right,
                                     err);
        }
        return wset_stage_weight(b, m->uid, g, pb, off, m->ld, lr, err);
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
            if (wset_rect_contains(&in, &blk)) {
                rw_moe_op o = wset_op_new(RW_MOE_OP_FP8Q, 2, 0, m->ld, &g->data, g->dst_r0 + blk.r0,
                                          blk.c0, blk.r1 - blk.r0, blk.c1 - blk.c0);
                o.scl = g->scl;
                RW_CHECK(put_op(b, true, o, pb, o2, m->ld, err));
                wset_stage_forget(u, blk);
                RW_CHECK(wset_cov_add(u, blk, err));
                rect sr = {bi, bi + 1, bj, bj + 1};
                RW_CHECK(wset_cov_add(&ws->units[suid], sr, err));
            } else {
                RW_CHECK(wset_stage_weight(b, m->uid, g, pb, o2, m->ld, in, err));
            }
        }
    }
    return RW_OK;
}

static rw_status emit(build *b, const pbase *pb, const mrect *m, rw_err *err) {
    geom g;
    RW_CHECK(wset_unit_geom(b->ws, m->uid, &g, err));
    return m->scale ? emit_scale(b, &g, pb, m, err) : emit_weight(b, &g, pb, m, err);
}

/* Cuts a validated piece into per-unit matrix rectangles and emits each. */
rw_status wset_emit_piece(build *b, const rw_piece *p, const pinfo *pi, const pbase *pb,
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
                mrect mg = {wset_uid_of(ws, &gw), false, lo, hi, 0, C, eb, C};
                mrect mu = {wset_uid_of(ws, &uw),        false, lo, hi, 0, C,
                            eb + (size_t)(len * C) * es, C};
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
                mrect m = {wset_uid_of(ws, &w), false, fr0, fr1, fc0, fc1, eb, ld};
                RW_CHECK(emit(b, pb, &m, err));
                continue;
            }
            /* gate = fused rows [0, I), up = fused rows [I, 2I) */
            for (int half = 0; half < 2; half++) {
                int64_t h0 = half ? I : 0, a = fr0 > h0 ? fr0 : h0;
                int64_t z = fr1 < h0 + I ? fr1 : h0 + I;
                if (a >= z) continue;
                rw_wname w = {half ? RW_W_EXP_UP : RW_W_EXP_GATE, pi->w.layer, (int)e, false};
                mrect m = {wset_uid_of(ws, &w),
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
    mrect m = {wset_uid_of(ws, &w), scale, 0, R, 0, C, 0, C};
    if (md == 0) m.r0 = lo, m.r1 = hi;
    if (md == 1) m.c0 = lo, m.c1 = hi, m.ld = hi - lo;
    return emit(b, pb, &m, err);
}
