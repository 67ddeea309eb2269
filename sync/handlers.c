/* handlers.c - the worker side of the sync commands over decoded requests: argument parsing with
 * unknown-field refusal, the session calls, and the reply bodies (docs/PROTOCOL.md). */
#include "sync_internal.h"

#include <inttypes.h>
#include <stdlib.h>

static const char *const sync_cmds[] = {
    "init_weights_update_group", "begin_update",  "update_weights",
    "update_weights_from_disk",  "commit_update", "abort_update",
    "get_weight_version",        "get_weights",   "checksum",
};

bool rw_sync_is_command(const char *cmd) {
    for (size_t i = 0; i < sizeof sync_cmds / sizeof *sync_cmds; i++)
        if (!strcmp(cmd, sync_cmds[i])) return true;
    return false;
}

typedef struct hctx {
    rw_sync_session *s;
    int local_rank;
    const rw_request *req;
    const rw_sync_frames *in;
    rw_mw *w;
    rw_sync_out_frame *out;
} hctx;

static void kv_str(rw_mw *w, const char *k, const char *v) {
    rw_mw_str(w, k);
    rw_mw_str(w, v);
}
static void kv_u64(rw_mw *w, const char *k, uint64_t v) {
    rw_mw_str(w, k);
    rw_mw_u64(w, v);
}

static rw_status no_frames(const hctx *h, rw_err *err) {
    if (h->in && h->in->n)
        RW_FAIL(err, RW_E_PROTOCOL, "%s: takes no data frames, got %zu", h->req->cmd, h->in->n);
    return RW_OK;
}

/* --- init_weights_update_group ------------------------------------------------------------- */
static rw_status h_init_group(hctx *h, rw_err *err) {
    rw_mfields f;
    RW_CHECK(rw_mfields_init(&f, h->req->args, "args", err));
    char hex[2 * RW_NCCL_ID_BYTES + 1], name[64];
    uint64_t world, offset;
    double timeout;
    const rw_mobj *v;
    RW_CHECK(rw_mfields_req(&f, "unique_id", &v, err));
    RW_CHECK(rw_mobj_strcpy(v, "args.unique_id", hex, sizeof hex, err));
    RW_CHECK(rw_mfields_req(&f, "world_size", &v, err));
    RW_CHECK(rw_mobj_u64(v, "args.world_size", &world, err));
    RW_CHECK(rw_mfields_req(&f, "rank_offset", &v, err));
    RW_CHECK(rw_mobj_u64(v, "args.rank_offset", &offset, err));
    RW_CHECK(rw_mfields_str(&f, "group_name", "weights", name, sizeof name, err));
    RW_CHECK(rw_mfields_f64(&f, "timeout_s", 120, &timeout, err));
    RW_CHECK(rw_mfields_done(&f, err));
    RW_CHECK(no_frames(h, err));
    uint8_t id[RW_NCCL_ID_BYTES];
    RW_CHECK(rw_hex_decode(hex, strlen(hex), id, sizeof id, "args.unique_id", err));
    if (world < 2 || world > 65536)
        RW_FAIL(err, RW_E_RANGE, "args.world_size: %" PRIu64 " outside [2, 65536]", world);
    uint64_t rank = offset + (uint64_t)h->local_rank;
    if (offset < 1 || rank >= world)
        RW_FAIL(err, RW_E_RANGE,
                "args.rank_offset: %" PRIu64 " puts this rank at %" PRIu64
                " (must be in [1, world_size %" PRIu64 "); rank 0 is the trainer)",
                offset, rank, world);
    if (timeout <= 0 || timeout > 3600)
        RW_FAIL(err, RW_E_RANGE, "args.timeout_s: %g outside (0, 3600]", timeout);
    RW_CHECK(rw_sync_session_init_group(h->s, id, (int)world, (int)rank, name, timeout, err));
    rw_mw_reply_ok(h->w, h->req->id);
    rw_mw_map(h->w, 3);
    kv_str(h->w, "group_name", name);
    kv_u64(h->w, "rank", rank);
    kv_u64(h->w, "world_size", world);
    return RW_OK;
}

/* --- begin_update -------------------------------------------------------------------------- */
static rw_status read_begin(rw_mfields *f, rw_sync_begin_args *b, char *ver, size_t cap,
                            bool version_required, rw_err *err) {
    memset(b, 0, sizeof *b);
    const rw_mobj *v = rw_mfields_get(f, "version");
    if (!v && version_required) RW_FAIL(err, RW_E_PROTOCOL, "args.version: missing");
    ver[0] = 0;
    if (v) RW_CHECK(rw_mobj_strcpy(v, "args.version", ver, cap, err));
    b->version = ver;
    RW_CHECK(rw_mfields_bool(f, "flush_cache", false, &b->flush_cache, err));
    RW_CHECK(rw_mfields_u64(f, "bucket_bytes", RW_SYNC_DEFAULT_BUCKET, &b->bucket_bytes, err));
    RW_CHECK(rw_mfields_f64(f, "timeout_s", 300, &b->timeout_s, err));
    if (b->bucket_bytes < 1 || b->bucket_bytes > (64ull << 30))
        RW_FAIL(err, RW_E_RANGE, "args.bucket_bytes: %" PRIu64 " outside [1, 64 GiB]",
                b->bucket_bytes);
    if (b->timeout_s <= 0 || b->timeout_s > 86400)
        RW_FAIL(err, RW_E_RANGE, "args.timeout_s: %g outside (0, 86400]", b->timeout_s);
    return RW_OK;
}

static rw_status h_begin(hctx *h, rw_err *err) {
    rw_mfields f;
    RW_CHECK(rw_mfields_init(&f, h->req->args, "args", err));
    rw_sync_begin_args b;
    char ver[RW_SYNC_MAX_VERSION + 2];
    RW_CHECK(read_begin(&f, &b, ver, sizeof ver, true, err));
    RW_CHECK(rw_mfields_done(&f, err));
    RW_CHECK(no_frames(h, err));
    RW_CHECK(rw_sync_session_begin(h->s, &b, err));
    rw_sync_info info;
    rw_sync_session_info(h->s, &info);
    rw_mw_reply_ok(h->w, h->req->id);
    rw_mw_map(h->w, 4);
    kv_str(h->w, "version", b.version);
    kv_str(h->w, "previous_version", info.version);
    kv_str(h->w, "state", rw_sync_wstate_str(info.state));
    kv_u64(h->w, "bucket_bytes", b.bucket_bytes);
    return RW_OK;
}

/* --- update_weights ------------------------------------------------------------------------ */
static rw_status h_update(hctx *h, rw_sync_manifest *m, rw_err *err) {
    rw_mfields f;
    RW_CHECK(rw_mfields_init(&f, h->req->args, "args", err));
    char transport[16], group[64];
    const rw_mobj *mv;
    RW_CHECK(rw_mfields_str(&f, "transport", "zmq", transport, sizeof transport, err));
    RW_CHECK(rw_mfields_str(&f, "group_name", "", group, sizeof group, err));
    RW_CHECK(rw_mfields_req(&f, "manifest", &mv, err));
    RW_CHECK(rw_mfields_done(&f, err));
    RW_CHECK(rw_sync_manifest_read(mv, "args.manifest", m, err));
    rw_sync_source src;
    size_t nf = h->in ? h->in->n : 0;
    if (!strcmp(transport, "zmq")) {
        if (nf != 1)
            RW_FAIL(err, RW_E_PROTOCOL,
                    "update_weights: transport zmq needs exactly one data frame, got %zu", nf);
        src = rw_sync_source_host("zmq", h->in->data[0], h->in->len[0]);
    } else if (!strcmp(transport, "nccl")) {
        if (nf) RW_FAIL(err, RW_E_PROTOCOL, "update_weights: transport nccl takes no data frames");
        rw_sync_group *g = rw_sync_session_group(h->s, group);
        if (!g)
            RW_FAIL(err, RW_E_STATE,
                    "update_weights: no NCCL group%s%s (init_weights_update_group first)",
                    group[0] ? " named " : "", group);
        if (!rw_sync_group_ok(g))
            RW_FAIL(err, RW_E_STATE,
                    "update_weights: NCCL group '%s' was aborted; re-create it with "
                    "init_weights_update_group",
                    rw_sync_group_name(g));
        src = rw_sync_source_nccl(g, rw_sync_manifest_bytes(m));
    } else {
        RW_FAIL(err, RW_E_PROTOCOL, "args.transport: unknown transport '%s' (zmq, nccl)",
                transport);
    }
    rw_sync_bucket_result r;
    RW_CHECK(rw_sync_session_apply(h->s, m, &src, &r, err));
    rw_mw_reply_ok(h->w, h->req->id);
    rw_mw_map(h->w, 4);
    kv_u64(h->w, "bucket", r.index);
    kv_u64(h->w, "tensors", r.tensors);
    kv_u64(h->w, "bytes", r.bytes);
    rw_mw_str(h->w, "applied");
    rw_mw_bool(h->w, r.applied);
    return RW_OK;
}

/* --- update_weights_from_disk -------------------------------------------------------------- */
static rw_status h_disk(hctx *h, rw_err *err) {
    rw_mfields f;
    RW_CHECK(rw_mfields_init(&f, h->req->args, "args", err));
    char path[4096], only[1024];
    const rw_mobj *v;
    RW_CHECK(rw_mfields_req(&f, "path", &v, err));
    RW_CHECK(rw_mobj_strcpy(v, "args.path", path, sizeof path, err));
    RW_CHECK(rw_mfields_str(&f, "only", "", only, sizeof only, err));
    rw_sync_begin_args b;
    char ver[RW_SYNC_MAX_VERSION + 2];
    RW_CHECK(read_begin(&f, &b, ver, sizeof ver, false, err));
    RW_CHECK(rw_mfields_done(&f, err));
    RW_CHECK(no_frames(h, err));
    rw_sync_info before;
    rw_sync_session_info(h->s, &before);
    bool implicit = before.state != RW_SYNC_UPDATING;
    uint64_t nt, nb;
    RW_CHECK(rw_sync_session_apply_disk(h->s, path, only[0] ? only : NULL, &b, &nt, &nb, err));
    rw_sync_info info;
    rw_sync_session_info(h->s, &info);
    rw_mw_reply_ok(h->w, h->req->id);
    rw_mw_map(h->w, 4);
    kv_u64(h->w, "tensors", nt);
    kv_u64(h->w, "bytes", nb);
    rw_mw_str(h->w, "committed");
    rw_mw_bool(h->w, implicit);
    kv_str(h->w, "version", implicit ? info.version : info.new_version);
    return RW_OK;
}

/* --- commit / abort / version -------------------------------------------------------------- */
static rw_status h_commit(hctx *h, rw_err *err) {
    rw_mfields f;
    RW_CHECK(rw_mfields_init(&f, h->req->args, "args", err));
    RW_CHECK(rw_mfields_done(&f, err));
    RW_CHECK(no_frames(h, err));
    rw_sync_commit_result r;
    RW_CHECK(rw_sync_session_commit(h->s, &r, err));
    rw_mw_reply_ok(h->w, h->req->id);
    rw_mw_map(h->w, 5);
    kv_str(h->w, "version", r.version);
    rw_mw_str(h->w, "flush_cache");
    rw_mw_bool(h->w, r.flush_cache);
    kv_u64(h->w, "buckets", r.buckets);
    kv_u64(h->w, "bytes", r.bytes);
    rw_mw_str(h->w, "seconds");
    rw_mw_f64(h->w, r.seconds);
    return RW_OK;
}

static rw_status h_abort(hctx *h, rw_err *err) {
    rw_mfields f;
    RW_CHECK(rw_mfields_init(&f, h->req->args, "args", err));
    RW_CHECK(rw_mfields_done(&f, err));
    RW_CHECK(no_frames(h, err));
    bool intact;
    RW_CHECK(rw_sync_session_abort(h->s, &intact, err));
    rw_sync_info info;
    rw_sync_session_info(h->s, &info);
    rw_mw_reply_ok(h->w, h->req->id);
    rw_mw_map(h->w, 3);
    rw_mw_str(h->w, "intact");
    rw_mw_bool(h->w, intact);
    kv_str(h->w, "state", rw_sync_wstate_str(info.state));
    kv_str(h->w, "version", info.version);
    return RW_OK;
}

static rw_status h_version(hctx *h, rw_err *err) {
    rw_mfields f;
    RW_CHECK(rw_mfields_init(&f, h->req->args, "args", err));
    RW_CHECK(rw_mfields_done(&f, err));
    RW_CHECK(no_frames(h, err));
    rw_sync_info i;
    rw_sync_session_info(h->s, &i);
    rw_mw_reply_ok(h->w, h->req->id);
    rw_mw_map(h->w, 6);
    kv_str(h->w, "version", i.version);
    kv_str(h->w, "state", rw_sync_wstate_str(i.state));
    kv_str(h->w, "updating_to", i.new_version);
    kv_u64(h->w, "updates", i.sessions_committed);
    rw_mw_str(h->w, "last_update_s");
    rw_mw_f64(h->w, i.last_update_s);
    rw_mw_str(h->w, "last_update_gbps");
    rw_mw_f64(h->w, i.last_update_gbps);
    return RW_OK;
}

/* --- get_weights / checksum ----------------------------------------------------------------- */
static rw_status h_get_weights(hctx *h, rw_err *err) {
    rw_mfields f;
    RW_CHECK(rw_mfields_init(&f, h->req->args, "args", err));
    char name[RW_SYNC_MAX_NAME];
    const rw_mobj *v;
    RW_CHECK(rw_mfields_req(&f, "name", &v, err));
    RW_CHECK(rw_mobj_strcpy(v, "args.name", name, sizeof name, err));
    RW_CHECK(rw_mfields_done(&f, err));
    RW_CHECK(no_frames(h, err));
    rw_wset *ws = rw_sync_session_wset(h->s);
    size_t len = 0;
    int nd = 0;
    int64_t shape[RW_MAX_DIMS];
    RW_CHECK(rw_wset_readback(ws, name, NULL, 0, &len, &nd, shape, err));
    void *buf = malloc(len ? len : 1);
    if (!buf) RW_FAIL(err, RW_E_OOM, "get_weights: %s: %zu bytes", name, len);
    rw_status st = rw_wset_readback(ws, name, buf, len, &len, &nd, shape, err);
    if (st != RW_OK) {
        free(buf);
        return st;
    }
    const rw_tp_dims *d = rw_wset_dims(ws);
    rw_wname wn;
    rw_dtype dt = RW_DTYPE_BF16;
    if (rw_name_parse(name, rw_wset_config(ws), &wn, NULL) == RW_OK) {
        rw_wfmt fmt = rw_quant_policy(rw_wset_config(ws), &wn);
        if (wn.scale)
            dt = rw_quant_scale_dtype(fmt);
        else if (fmt != RW_WFMT_BF16)
            dt = RW_DTYPE_E4M3;
    }
    h->out->data = buf;
    h->out->len = len;
    rw_mw_reply_ok(h->w, h->req->id);
    rw_mw_map(h->w, 6);
    kv_str(h->w, "name", name);
    kv_str(h->w, "dtype", rw_dtype_name(dt));
    rw_mw_str(h->w, "shape");
    rw_mw_array(h->w, (uint32_t)nd);
    for (int i = 0; i < nd; i++)
        rw_mw_i64(h->w, shape[i]);
    kv_u64(h->w, "tp", (uint64_t)d->tp);
    kv_u64(h->w, "rank", (uint64_t)d->rank);
    kv_u64(h->w, "nbytes", len);
    return RW_OK;
}

/* Every canonical name of the model, with the scale names of quantized weights. */
typedef struct name_list {
    char (*names)[RW_SYNC_MAX_NAME];
    size_t n, cap;
    const rw_config *cfg;
} name_list;

static rw_status add_name(name_list *l, const rw_wname *w) {
    for (int pass = 0; pass < 2; pass++) {
        rw_wname x = *w;
        x.scale = pass == 1;
        if (x.scale && rw_quant_policy(l->cfg, w) == RW_WFMT_BF16) break;
        if (l->n == l->cap) {
            size_t cap = l->cap ? 2 * l->cap : 1024;
            void *p = realloc(l->names, cap * sizeof *l->names);
            if (!p) return RW_E_OOM;
            l->names = p;
            l->cap = cap;
        }
        rw_name_format(&x, l->names[l->n++], RW_SYNC_MAX_NAME);
    }
    return RW_OK;
}

static rw_status weight_cb(const rw_wname *w, void *ctx) {
    return add_name(ctx, w);
}

static rw_status h_checksum(hctx *h, rw_err *err) {
    rw_mfields f;
    RW_CHECK(rw_mfields_init(&f, h->req->args, "args", err));
    const rw_mobj *names = rw_mfields_get(&f, "names");
    RW_CHECK(rw_mfields_done(&f, err));
    RW_CHECK(no_frames(h, err));
    rw_wset *ws = rw_sync_session_wset(h->s);
    const rw_config *cfg = rw_wset_config(ws);
    name_list l = {.cfg = cfg};
    rw_status st = RW_OK;
    if (names) {
        if (rw_mobj_type(names) != RW_M_ARRAY)
            RW_FAIL(err, RW_E_PROTOCOL, "args.names: expected an array, got %s",
                    rw_mtype_str(rw_mobj_type(names)));
        size_t n = rw_mobj_len(names);
        if (n > 1u << 20) RW_FAIL(err, RW_E_RANGE, "args.names: %zu names (limit 2^20)", n);
        l.names = malloc((n ? n : 1) * sizeof *l.names);
        if (!l.names) RW_FAIL(err, RW_E_OOM, "checksum: out of memory");
        for (size_t i = 0; i < n; i++) {
            char w[48];
            snprintf(w, sizeof w, "args.names[%zu]", i);
            RW_CHECKGOTO(rw_mobj_strcpy(rw_mobj_at(names, i), w, l.names[i], RW_SYNC_MAX_NAME, err),
                         st, out);
        }
        l.n = n;
    } else {
        st = rw_config_for_each_weight(cfg, weight_cb, &l);
        if (st != RW_OK) {
            RW_ERR(err, st, "checksum: listing the model's tensors failed");
            goto out;
        }
    }
    /* checksums first (any failure is reported before the reply is started) */
    uint64_t *sums = malloc((l.n ? l.n : 1) * sizeof *sums);
    if (!sums) {
        st = RW_ERR(err, RW_E_OOM, "checksum: out of memory");
        goto out;
    }
    for (size_t i = 0; i < l.n; i++) {
        st = rw_wset_checksum(ws, l.names[i], &sums[i], err);
        if (st != RW_OK) {
            free(sums);
            goto out;
        }
    }
    const rw_tp_dims *d = rw_wset_dims(ws);
    rw_mw_reply_ok(h->w, h->req->id);
    rw_mw_map(h->w, 3);
    kv_u64(h->w, "tp", (uint64_t)d->tp);
    rw_mw_str(h->w, "quant");
    rw_mw_map(h->w, 2);
    kv_str(h->w, "method",
           cfg->quant.method == RW_QMETHOD_MXFP8       ? "mxfp8"
           : cfg->quant.method == RW_QMETHOD_FP8_BLOCK ? "fp8"
                                                       : "none");
    rw_mw_str(h->w, "not_convert");
    rw_mw_array(h->w, (uint32_t)cfg->quant.n_not_convert);
    for (int i = 0; i < cfg->quant.n_not_convert; i++)
        rw_mw_str(h->w, cfg->quant.not_convert[i]);
    rw_mw_str(h->w, "ranks");
    rw_mw_array(h->w, 1);
    rw_mw_map(h->w, 2);
    kv_u64(h->w, "rank", (uint64_t)d->rank);
    rw_mw_str(h->w, "checksums");
    rw_mw_map(h->w, (uint32_t)l.n);
    for (size_t i = 0; i < l.n; i++) {
        rw_mw_str(h->w, l.names[i]);
        rw_mw_hex64(h->w, sums[i]);
    }
    free(sums);
out:
    free(l.names);
    return st;
}

rw_status rw_sync_handle(rw_sync_session *s, int local_rank, const rw_request *req,
                         const rw_sync_frames *in, rw_mw *reply, rw_sync_out_frame *out,
                         rw_err *err) {
    rw_sync_out_frame dummy;
    if (!out) out = &dummy;
    memset(out, 0, sizeof *out);
    hctx h = {.s = s, .local_rank = local_rank, .req = req, .in = in, .w = reply, .out = out};
    rw_mw_reset(reply);
    rw_status st;
    const char *c = req->cmd;
    rw_sync_manifest *m = NULL;
    if (!strcmp(c, "init_weights_update_group"))
        st = h_init_group(&h, err);
    else if (!strcmp(c, "begin_update"))
        st = h_begin(&h, err);
    else if (!strcmp(c, "update_weights")) {
        st = rw_sync_manifest_create(&m, err);
        if (st == RW_OK) st = h_update(&h, m, err);
        rw_sync_manifest_destroy(m);
        /* a bucket refused before the session saw it (bad args, bad manifest) ends the open
         * session all the same: every failed update_weights aborts */
        st = rw_sync_session_fail(s, st, err);
    } else if (!strcmp(c, "update_weights_from_disk")) {
        st = h_disk(&h, err);
        /* inside an open session too, a refused checkpoint (unreadable, truncated) ends it */
        st = rw_sync_session_fail(s, st, err);
    } else if (!strcmp(c, "commit_update"))
        st = h_commit(&h, err);
    else if (!strcmp(c, "abort_update"))
        st = h_abort(&h, err);
    else if (!strcmp(c, "get_weight_version"))
        st = h_version(&h, err);
    else if (!strcmp(c, "get_weights"))
        st = h_get_weights(&h, err);
    else if (!strcmp(c, "checksum"))
        st = h_checksum(&h, err);
    else
        st = RW_ERR(err, RW_E_NOT_FOUND, "unknown command '%s'", c);
    if (st != RW_OK) {
        /* a handler may have started an ok reply before failing: replace it */
        rw_mw_reset(reply);
        free(out->data);
        out->data = NULL;
        out->len = 0;
        rw_mw_reply_err(reply, req->id, st, err ? err->msg : rw_status_str(st));
    }
    return st;
}
