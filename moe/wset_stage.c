/* wset_stage.c - host staging of quantization blocks that pieces cover only partly: a quantized
 * target fed bf16 (or an fp8 checkpoint's e4m3 whose canonical blocks do not coincide with the
 * rank's local blocks) cannot be quantized until its whole 1x32 / 128x128 local block is known,
 * so the known part waits here, per unit, and is quantized and placed by a flush once the block
 * is complete. Buffers are allocated on first use and freed when nothing waits any more. */
#include "wset_internal.h"

#include <stdlib.h>

void wset_stage_free(stage *s) {
    if (!s) return;
    free(s->val);
    free(s->have);
    free(s->raw);
    free(s->have_raw);
    free(s->gs);
    free(s->have_gs);
    free(s);
}

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
            wset_stage_free(s);
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
rw_status wset_stage_weight(build *b, size_t uid, const geom *g, const pbase *pb, size_t off,
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
rw_status wset_stage_scales(build *b, size_t uid, const geom *g, const pbase *pb, const mrect *m,
                            rw_err *err) {
    stage *s;
    RW_CHECK(stage_get(b, uid, g, &s, err));
    if (!s->gs) {
        /* canonical blocks the slice touches */
        int64_t cr0 = g->sdim == 0 ? g->s0 : 0, cr1 = g->sdim == 0 ? g->s1 : g->R;
        int64_t cc0 = g->sdim == 1 ? g->s0 : 0, cc1 = g->sdim == 1 ? g->s1 : g->C;
        s->gs_r0 = cr0 / RW_FP8_BLOCK;
        s->gs_rows = wset_cdiv(cr1, RW_FP8_BLOCK) - s->gs_r0;
        s->gs_c0 = cc0 / RW_FP8_BLOCK;
        s->gs_cols = wset_cdiv(cc1, RW_FP8_BLOCK) - s->gs_c0;
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
void wset_stage_forget(unit *u, rect lr) {
    stage *s = u->st;
    if (!s) return;
    for (int64_t r = lr.r0; r < lr.r1; r++)
        for (int64_t c = lr.c0; c < lr.c1; c++) {
            size_t i = (size_t)(r * s->cols + c);
            bit_clr(s->have, i);
            if (s->have_raw) bit_clr(s->have_raw, i);
        }
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
rw_status wset_flush_unit(build *b, size_t uid, rw_err *err) {
    rw_wset *ws = b->ws;
    unit *u = &ws->units[uid];
    stage *s = u->st;
    if (!s || !s->is_dirty) return RW_OK;
    s->is_dirty = false;
    geom g;
    RW_CHECK(wset_unit_geom(ws, uid, &g, err));
    rw_wname sw = g.w;
    sw.scale = true;
    unit *su = &ws->units[wset_uid_of(ws, &sw)];
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
            size_t qoff = 0, soff = 0; /* set by flush_reserve (its failure returns first) */
            RW_CHECK(flush_reserve(b, (size_t)(nr * nc), &qoff, err));
            RW_CHECK(flush_reserve(b, 4, &soff, err));
            uint8_t *q = b->flushbuf + qoff;
            rw_moe_op od, os;
            if (g.fmt == RW_WFMT_MXFP8) {
                uint8_t sc = rw_mxfp8_scale_from_amax(rw_bits_f32(m));
                b->flushbuf[soff] = sc;
                for (int64_t c = blk.c0; c < blk.c1; c++)
                    q[c - blk.c0] = rw_mxfp8_quantize_elem(stage_value(s, &g, blk.r0, c), sc);
                os = wset_op_new(RW_MOE_OP_COPY, 1, soff, 1, &g.scl, g.dst_r0 + blk.r0, bj, 1, 1);
            } else {
                float sc = rw_fp8_block_scale_from_amax(rw_bits_f32(m));
                memcpy(b->flushbuf + soff, &sc, 4);
                for (int64_t r = blk.r0; r < blk.r1; r++)
                    for (int64_t c = blk.c0; c < blk.c1; c++)
                        q[(r - blk.r0) * nc + (c - blk.c0)] =
                            rw_fp8_block_quantize_elem(stage_value(s, &g, r, c), sc);
                os = wset_op_new(RW_MOE_OP_COPY, 4, soff, 1, &g.scl, g.dst_r0 / RW_FP8_BLOCK + bi,
                                 bj, 1, 1);
            }
            od = wset_op_new(RW_MOE_OP_COPY, 1, qoff, nc, &g.data, g.dst_r0 + blk.r0, blk.c0, nr,
                             nc);
            RW_CHECK(wset_opvec_push(&b->flush, &od, err));
            RW_CHECK(wset_opvec_push(&b->flush, &os, err));
            RW_CHECK(wset_cov_add(u, blk, err));
            rect sr = {bi, bi + 1, bj, bj + 1};
            RW_CHECK(wset_cov_add(su, sr, err));
            stage_drop_block(s, blk);
        }
    }
    /* Keep canonical scales while local blocks still wait for them. */
    if (stage_empty(s) && (!s->gs || wset_cov_complete(u, g.vr, g.vc))) {
        wset_stage_free(s);
        u->st = NULL;
    }
    return RW_OK;
}
