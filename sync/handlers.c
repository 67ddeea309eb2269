/* handlers.c - the worker side of the sync commands over decoded requests: argument parsing with
 * unknown-field refusal, the session calls, the reply bodies (docs/PROTOCOL.md), and the typed
 * outcome the serving daemon acts on (rw_sync_outcome). */
#include "sync_internal.h"

#include <inttypes.h>
#include <stdlib.h>

typedef struct hctx {
    rw_sync_session *s;
    int local_rank;
    const rw_request *req;
    const rw_sync_frames *in;
    rw_mw *w;
    rw_sync_outcome *out;
} hctx;

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
    /* the name comes back in replies and logs: printable ASCII only */
    for (const char *q = name; *q; q++)
        if (*q < 0x20 || *q > 0x7e)
            RW_FAIL(err, RW_E_INVALID_ARG, "args.group_name: not printable ASCII");
    RW_CHECK(rw_sync_session_init_group(h->s, id, (int)world, (int)rank, name, timeout, err));
    rw_mw_reply_ok(h->w, h->req->id);
    rw_mw_map(h->w, 3);
    rw_mw_kv_str(h->w, "group_name", name);
    rw_mw_kv_u64(h->w, "rank", rank);
    rw_mw_kv_u64(h->w, "world_size", world);
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
    const uint64_t frame_limit = rw_sync_session_frame_limit(h->s);
    rw_mw_reply_ok(h->w, h->req->id);
    rw_mw_map(h->w, 5 + (frame_limit ? 1 : 0));
    rw_mw_kv_str(h->w, "version", b.version);
    rw_mw_kv_str(h->w, "previous_version", info.version);
    rw_mw_kv_str(h->w, "state", rw_sync_wstate_str(info.state));
    rw_mw_kv_u64(h->w, "bucket_bytes", b.bucket_bytes);
    /* the session's owner token: the later commands of the session must carry it */
    rw_mw_kv_str(h->w, "session", rw_sync_session_token(h->s));
    if (frame_limit) rw_mw_kv_u64(h->w, "max_frame_bytes", frame_limit);
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
    rw_mfields_get(&f, "session"); /* checked by rw_sync_check_owner */
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
    rw_mw_kv_u64(h->w, "bucket", r.index);
    rw_mw_kv_u64(h->w, "tensors", r.tensors);
    rw_mw_kv_u64(h->w, "bytes", r.bytes);
    rw_mw_kv_bool(h->w, "applied", r.applied);
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
    rw_mfields_get(&f, "session"); /* checked by rw_sync_check_owner (inside a session) */
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
    if (implicit) {
        h->out->committed = true;
        h->out->flush_cache = info.flush_cache;
    }
    rw_mw_reply_ok(h->w, h->req->id);
    rw_mw_map(h->w, 4);
    rw_mw_kv_u64(h->w, "tensors", nt);
    rw_mw_kv_u64(h->w, "bytes", nb);
    rw_mw_kv_bool(h->w, "committed", implicit);
    rw_mw_kv_str(h->w, "version", implicit ? info.version : info.new_version);
    return RW_OK;
}

/* --- commit / abort / version -------------------------------------------------------------- */
/* args of commit_update / abort_update: `session` (checked by rw_sync_check_owner) and, for
 * abort_update, `force`. */
static rw_status session_args(hctx *h, bool with_force, rw_err *err) {
    rw_mfields f;
    RW_CHECK(rw_mfields_init(&f, h->req->args, "args", err));
    rw_mfields_get(&f, "session");
    bool force;
    if (with_force) RW_CHECK(rw_mfields_bool(&f, "force", false, &force, err));
    return rw_mfields_done(&f, err);
}

static rw_status h_commit(hctx *h, rw_err *err) {
    RW_CHECK(session_args(h, false, err));
    RW_CHECK(no_frames(h, err));
    rw_sync_commit_result r;
    RW_CHECK(rw_sync_session_commit(h->s, &r, err));
    h->out->committed = true;
    h->out->flush_cache = r.flush_cache;
    rw_mw_reply_ok(h->w, h->req->id);
    rw_mw_map(h->w, 5);
    rw_mw_kv_str(h->w, "version", r.version);
    rw_mw_kv_bool(h->w, "flush_cache", r.flush_cache);
    rw_mw_kv_u64(h->w, "buckets", r.buckets);
    rw_mw_kv_u64(h->w, "bytes", r.bytes);
    rw_mw_kv_f64(h->w, "seconds", r.seconds);
    return RW_OK;
}

static rw_status h_abort(hctx *h, rw_err *err) {
    RW_CHECK(session_args(h, true, err));
    RW_CHECK(no_frames(h, err));
    bool intact;
    RW_CHECK(rw_sync_session_abort(h->s, &intact, err));
    rw_sync_info info;
    rw_sync_session_info(h->s, &info);
    rw_mw_reply_ok(h->w, h->req->id);
    rw_mw_map(h->w, 3);
    rw_mw_kv_bool(h->w, "intact", intact);
    rw_mw_kv_str(h->w, "state", rw_sync_wstate_str(info.state));
    rw_mw_kv_str(h->w, "version", info.version);
    return RW_OK;
}

static rw_status h_version(hctx *h, rw_err *err) {
    RW_CHECK(rw_mfields_none(h->req->args, "args", err));
    RW_CHECK(no_frames(h, err));
    rw_sync_info i;
    rw_sync_session_info(h->s, &i);
    rw_mw_reply_ok(h->w, h->req->id);
    rw_mw_map(h->w, 6);
    rw_mw_kv_str(h->w, "version", i.version);
    rw_mw_kv_str(h->w, "state", rw_sync_wstate_str(i.state));
    rw_mw_kv_str(h->w, "updating_to", i.new_version);
    rw_mw_kv_u64(h->w, "updates", i.sessions_committed);
    rw_mw_kv_f64(h->w, "last_update_s", i.last_update_s);
    rw_mw_kv_f64(h->w, "last_update_gbps", i.last_update_gbps);
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
    h->out->frame.data = buf;
    h->out->frame.len = len;
    rw_mw_reply_ok(h->w, h->req->id);
    rw_mw_map(h->w, 6);
    rw_mw_kv_str(h->w, "name", name);
    rw_mw_kv_str(h->w, "dtype", rw_dtype_name(dt));
    rw_mw_str(h->w, "shape");
    rw_mw_array(h->w, (uint32_t)nd);
    for (int i = 0; i < nd; i++)
        rw_mw_i64(h->w, shape[i]);
    rw_mw_kv_u64(h->w, "tp", (uint64_t)d->tp);
    rw_mw_kv_u64(h->w, "rank", (uint64_t)d->rank);
    rw_mw_kv_u64(h->w, "nbytes", len);
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

/* The checksum reply: this rank's entry, then other ranks' entries copied as they are. */
static void write_checksums(rw_mw *w, uint64_t id, const rw_config *cfg, const rw_sync_sums *mine,
                            const rw_reply *others, size_t n) {
    size_t total = 1;
    for (size_t r = 0; r < n; r++)
        total += rw_mobj_len(rw_mobj_get(others[r].result, "ranks"));
    rw_mw_reply_ok(w, id);
    rw_mw_map(w, 3);
    rw_mw_kv_u64(w, "tp", (uint64_t)mine->tp);
    rw_mw_str(w, "quant");
    rw_mw_map(w, 2);
    rw_mw_kv_str(w, "method",
                 cfg->quant.method == RW_QMETHOD_MXFP8       ? "mxfp8"
                 : cfg->quant.method == RW_QMETHOD_FP8_BLOCK ? "fp8"
                                                             : "none");
    rw_mw_str(w, "not_convert");
    rw_mw_array(w, (uint32_t)cfg->quant.n_not_convert);
    for (int i = 0; i < cfg->quant.n_not_convert; i++)
        rw_mw_str(w, cfg->quant.not_convert[i]);
    rw_mw_str(w, "ranks");
    rw_mw_array(w, (uint32_t)total);
    rw_mw_map(w, 2);
    rw_mw_kv_u64(w, "rank", (uint64_t)mine->rank);
    rw_mw_str(w, "checksums");
    rw_mw_map(w, (uint32_t)mine->n);
    for (size_t i = 0; i < mine->n; i++) {
        rw_mw_str(w, mine->names[i]);
        rw_mw_hex64(w, mine->values[i]);
    }
    for (size_t r = 0; r < n; r++) {
        const rw_mobj *ra = rw_mobj_get(others[r].result, "ranks");
        for (size_t j = 0; j < rw_mobj_len(ra); j++)
            rw_mw_obj(w, rw_mobj_at(ra, j));
    }
}

static void sums_free(rw_sync_sums *s) {
    if (!s) return;
    free(s->names);
    free(s->values);
    free(s);
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
                         st, fail);
        }
        l.n = n;
    } else {
        st = rw_config_for_each_weight(cfg, weight_cb, &l);
        if (st != RW_OK) {
            RW_ERR(err, st, "checksum: listing the model's tensors failed");
            goto fail;
        }
    }
    /* checksums first (any failure is reported before the reply is started) */
    rw_sync_sums *s = calloc(1, sizeof *s);
    uint64_t *sums = malloc((l.n ? l.n : 1) * sizeof *sums);
    if (!s || !sums) {
        free(s);
        free(sums);
        st = RW_ERR(err, RW_E_OOM, "checksum: out of memory");
        goto fail;
    }
    const rw_tp_dims *d = rw_wset_dims(ws);
    *s = (rw_sync_sums){.tp = d->tp, .rank = d->rank, .n = l.n, .names = l.names, .values = sums};
    h->out->sums = s; /* owns the names from here */
    for (size_t i = 0; i < l.n; i++)
        RW_CHECK(rw_wset_checksum(ws, l.names[i], &sums[i], err));
    write_checksums(h->w, h->req->id, cfg, s, NULL, 0);
    return RW_OK;
fail:
    free(l.names);
    return st;
}

rw_status rw_sync_checksum_reply(rw_sync_session *s, uint64_t id, const rw_sync_outcome *mine,
                                 const rw_reply *others, size_t n, rw_mw *w, rw_err *err) {
    if (!mine->sums)
        RW_FAIL(err, RW_E_INVALID_ARG, "checksum reply: this rank's outcome holds no checksums");
    rw_mw_reset(w);
    write_checksums(w, id, rw_wset_config(rw_sync_session_wset(s)), mine->sums, others, n);
    return RW_OK;
}

void rw_sync_outcome_free(rw_sync_outcome *o) {
    if (!o) return;
    free(o->frame.data);
    sums_free(o->sums);
    memset(o, 0, sizeof *o);
}

/* --- session ownership ---------------------------------------------------------------------- */
rw_status rw_sync_check_owner(const rw_sync_session *s, const rw_request *req, bool *forced,
                              rw_err *err) {
    if (forced) *forced = false;
    const rw_cmd cmd = rw_cmd_parse(req->cmd);
    if (cmd != RW_CMD_UPDATE_WEIGHTS && cmd != RW_CMD_UPDATE_WEIGHTS_FROM_DISK &&
        cmd != RW_CMD_COMMIT_UPDATE && cmd != RW_CMD_ABORT_UPDATE)
        return RW_OK;
    rw_sync_info info;
    rw_sync_session_info(s, &info);
    if (info.state != RW_SYNC_UPDATING) return RW_OK; /* the command reports it (or opens one) */
    const rw_mobj *f = rw_mobj_get(req->args, "force");
    if (cmd == RW_CMD_ABORT_UPDATE && f && rw_mobj_type(f) == RW_M_BOOL) {
        bool yes = false;
        rw_mobj_bool(f, "args.force", &yes, NULL);
        if (yes) {
            if (forced) *forced = true;
            return RW_OK;
        }
    }
    if (!rw_sync_session_checks_owner(s)) return RW_OK;
    const rw_mobj *v = rw_mobj_get(req->args, "session");
    if (!v || rw_mobj_type(v) == RW_M_NIL)
        RW_FAIL(err, RW_E_AUTH,
                "%s: args.session: missing: the open update session (to '%s') belongs to the "
                "client that opened it, and its commands must carry the token begin_update "
                "returned (an operator ends a stuck session with abort_update {force: true})",
                req->cmd, info.new_version);
    const char *p;
    size_t n;
    RW_CHECK(rw_mobj_str(v, "args.session", &p, &n, err));
    if (!rw_sync_session_owner_ok(s, p, n))
        RW_FAIL(err, RW_E_AUTH,
                "%s: args.session is not the token of the open update session (to '%s'): it "
                "belongs to another client (an operator ends a stuck session with abort_update "
                "{force: true})",
                req->cmd, info.new_version);
    return RW_OK;
}

/* The command's handler. */
static rw_status run_handler(hctx *h, rw_cmd cmd, rw_err *err) {
    rw_status st;
    rw_sync_manifest *m = NULL;
    switch (cmd) {
    case RW_CMD_INIT_WEIGHTS_UPDATE_GROUP: return h_init_group(h, err);
    case RW_CMD_BEGIN_UPDATE: return h_begin(h, err);
    case RW_CMD_UPDATE_WEIGHTS:
        st = rw_sync_manifest_create(&m, err);
        if (st == RW_OK) st = h_update(h, m, err);
        rw_sync_manifest_destroy(m);
        /* a bucket refused before the session saw it (bad args, bad manifest) ends the open
         * session all the same: every failed update_weights aborts */
        return rw_sync_session_fail(h->s, st, err);
    case RW_CMD_UPDATE_WEIGHTS_FROM_DISK:
        st = h_disk(h, err);
        /* inside an open session too, a refused checkpoint (unreadable, truncated) ends it */
        return rw_sync_session_fail(h->s, st, err);
    case RW_CMD_COMMIT_UPDATE: return h_commit(h, err);
    case RW_CMD_ABORT_UPDATE: return h_abort(h, err);
    case RW_CMD_GET_WEIGHT_VERSION: return h_version(h, err);
    case RW_CMD_GET_WEIGHTS: return h_get_weights(h, err);
    case RW_CMD_CHECKSUM: return h_checksum(h, err);
    default: return RW_ERR(err, RW_E_NOT_FOUND, "unknown command '%s'", h->req->cmd);
    }
}

rw_status rw_sync_handle(rw_sync_session *s, int local_rank, const rw_request *req,
                         const rw_sync_frames *in, rw_mw *reply, rw_sync_outcome *out,
                         rw_err *err) {
    rw_sync_outcome mine;
    if (!out) out = &mine;
    memset(out, 0, sizeof *out);
    const rw_cmd cmd = rw_cmd_parse(req->cmd);
    out->cmd = cmd;
    hctx h = {.s = s, .local_rank = local_rank, .req = req, .in = in, .w = reply, .out = out};
    rw_mw_reset(reply);
    /* a request that does not own the open session changes nothing (it does not end it) */
    rw_status st = rw_sync_check_owner(s, req, NULL, err);
    if (st == RW_OK) st = run_handler(&h, cmd, err);
    if (st != RW_OK) {
        /* a handler may have started an ok reply (or a result) before failing: replace it */
        rw_mw_reset(reply);
        rw_sync_outcome_free(out);
        out->cmd = cmd;
        rw_mw_reply_err(reply, req->id, st, err ? err->msg : rw_status_str(st));
    }
    rw_sync_info info;
    rw_sync_session_info(s, &info);
    out->state = info.state;
    memcpy(out->version, info.version, sizeof out->version);
    if (out == &mine) rw_sync_outcome_free(&mine);
    return st;
}
