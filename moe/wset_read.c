/* wset_read.c - canonical readback of the weight set: a rank's unpadded slice of any tensor read
 * back through the inverse of the layout maps (what a trainer's slice of the same name holds, or
 * its quantized form), and the xxh3-64 checksums that updates are verified with. */
#include "wset_internal.h"

#include <stdlib.h>

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
    RW_CHECK(wset_unit_geom(ws, uid, &g, err));
    int64_t rows, cols;
    wset_unit_extent(&g, &rows, &cols);
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
                    RW_CHECK(read_unit(ws, wset_uid_of(ws, &gw), 0, S, o, err));
                    o += (size_t)(S * H) * es;
                    RW_CHECK(read_unit(ws, wset_uid_of(ws, &uw), 0, S, o, err));
                    o += (size_t)(S * H) * es;
                } else {
                    rw_wname dw = {RW_W_EXP_DOWN, w.layer, (int)e, false};
                    RW_CHECK(read_unit(ws, wset_uid_of(ws, &dw), 0, H, o, err));
                    o += (size_t)(H * S) * es;
                }
            }
        }
    } else {
        size_t uid = wset_uid_of(ws, &w);
        geom g;
        RW_CHECK(wset_unit_geom(ws, uid, &g, err));
        int64_t rows, cols;
        wset_unit_extent(&g, &rows, &cols);
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
