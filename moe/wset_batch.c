/* wset_batch.c - one batch of pieces through the weight set: prepare (validate every piece, cut
 * them into ops, stage and flush partial quantization blocks: host work only) and launch (the op
 * table image into pinned memory, one copy to the device and a handful of kernel launches; on a
 * host set the CPU reference runs the same table). rw_wset_apply_batch and rw_wset_apply are the
 * two phases back to back. */
#include "wset_internal.h"

#include <stdlib.h>

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
        st = wset_check_piece(ws, &pieces[i], &pi[i], err);
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
        st = wset_emit_piece(b, &pieces[i], &pi[i], &pb[i], err);
        if (st != RW_OK && !b->needs_reads) rw_err_prefix(err, "tensor '%s'", pieces[i].name);
    }
    for (size_t i = 0; st == RW_OK && i < b->ntouched; i++)
        st = wset_flush_unit(b, b->touched[i], err);
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
    ws->gen++;
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
    ws->gen++;
    /* 4. run (host bytes were gathered into the table upload on a device set) */
    if (ws->place == RW_PLACE_DEVICE) return run_device(&bt->b, &bt->t, err);
    return run_host(&bt->b, err);
}

rw_status rw_wset_apply(rw_wset *ws, const rw_piece *p, rw_stream s, rw_err *err) {
    if (!p) RW_FAIL(err, RW_E_INVALID_ARG, "apply: NULL piece");
    return rw_wset_apply_batch(ws, p, 1, s, err);
}
