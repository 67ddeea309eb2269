/* push.c - the trainer side of an update: expected per-rank checksums computed from canonical
 * bytes exactly as a worker reports them, emulation of Megatron-style trainer shards (each
 * TP-sharded tensor cut into K pieces along its TP dim, expert gate/up as fused gate_up shards),
 * bucket packing, and pushing a checkpoint to workers over ZeroMQ or NCCL. */
#include "client_internal.h"

#include <inttypes.h>
#include <regex.h>
#include <stdlib.h>
#include <time.h>

#ifdef RW_HAVE_CUDA
#include "cuda_check.h"
#endif

/* Copies elements [b, b + len) along `dim` of a contiguous row-major tensor into dst
 * (contiguous). esize in bytes. */
static void slice_copy(const uint8_t *src, size_t esize, int ndim, const int64_t *shape, int dim,
                       int64_t b, int64_t len, uint8_t *dst) {
    if (dim < 0) {
        int64_t n = 1;
        for (int d = 0; d < ndim; d++)
            n *= shape[d];
        memcpy(dst, src, (size_t)n * esize);
        return;
    }
    int64_t outer = 1, inner = 1;
    for (int d = 0; d < dim; d++)
        outer *= shape[d];
    for (int d = dim + 1; d < ndim; d++)
        inner *= shape[d];
    size_t row = (size_t)inner * esize, D = (size_t)shape[dim];
    for (int64_t o = 0; o < outer; o++)
        memcpy(dst + (size_t)o * (size_t)len * row, src + ((size_t)o * D + (size_t)b) * row,
               (size_t)len * row);
}

/* ------------------------------------------------------------------------------------------ */
/* Expected checksums                                                                           */
/* ------------------------------------------------------------------------------------------ */
rw_status rw_sync_expected_checksum(const rw_config *cfg, int tp, int rank, const char *name,
                                    const void *src, rw_dtype src_dtype, uint64_t *out,
                                    rw_err *err) {
    rw_wname w;
    RW_CHECK(rw_name_parse(name, cfg, &w, err));
    if (src_dtype != RW_DTYPE_BF16)
        RW_FAIL(err, RW_E_UNSUPPORTED, "expected checksum: %s: source dtype %s (bf16 only)", name,
                rw_dtype_name(src_dtype));
    rw_wname plain = w;
    plain.scale = false;
    if (plain.kind == RW_W_EXP_GATE_UP || plain.kind == RW_W_EXP_DOWN_ALL)
        RW_FAIL(err, RW_E_UNSUPPORTED,
                "expected checksum: %s: fused expert tensors are checked per expert", name);
    rw_shard_plan p;
    RW_CHECK(rw_moe_plan_tensor(cfg, tp, rank, &plain, &p, err));
    rw_wfmt fmt = rw_quant_policy(cfg, &plain);
    int64_t sl[RW_MAX_DIMS];
    memcpy(sl, p.canon_shape, sizeof sl);
    if (p.dim >= 0) sl[p.dim] = p.src_end - p.src_begin;
    int64_t n = rw_shape_numel(p.ndim, sl);
    uint16_t *buf = malloc((size_t)(n ? n : 1) * 2);
    if (!buf) RW_FAIL(err, RW_E_OOM, "expected checksum: %s: out of memory", name);
    slice_copy(src, 2, p.ndim, p.canon_shape, p.dim, p.src_begin, p.src_end - p.src_begin,
               (uint8_t *)buf);
    rw_status st = RW_OK;
    if (fmt == RW_WFMT_BF16) {
        if (w.scale)
            st =
                RW_ERR(err, RW_E_NOT_FOUND, "expected checksum: %s: layer is bf16, no scale", name);
        else
            *out = rw_checksum64(buf, (size_t)n * 2, 0);
    } else if (fmt == RW_WFMT_MXFP8) {
        /* per-row blocks of 32 along K: quantizing the slice equals slicing the quantized
         * canonical tensor (K slices start at multiples of 32, docs/LAYOUT.md section 5) */
        int64_t cols = sl[p.ndim - 1], rows = n / cols;
        uint8_t *q = malloc((size_t)n), *sc = malloc((size_t)(rows * (cols / 32) + 1));
        if (!q || !sc)
            st = RW_ERR(err, RW_E_OOM, "expected checksum: %s: out of memory", name);
        else
            st = rw_quant_mxfp8_ref(buf, rows, cols, q, sc, err);
        if (st == RW_OK)
            *out = w.scale ? rw_checksum64(sc, (size_t)(rows * (cols / 32)), 0)
                           : rw_checksum64(q, (size_t)n, 0);
        free(q);
        free(sc);
    } else {
        st = RW_ERR(err, RW_E_UNSUPPORTED,
                    "expected checksum: %s: fp8-block layers are re-quantized per rank", name);
    }
    free(buf);
    return st;
}

/* ------------------------------------------------------------------------------------------ */
/* Pieces to send                                                                               */
/* ------------------------------------------------------------------------------------------ */
typedef struct item {
    rw_sync_tensor t;       /* name, dtype, shape, shard; offset / nbytes set when packed */
    const rw_st_entry *src; /* plain slice of one entry */
    int layer;              /* gate_up: the layer whose experts are fused */
} item;

typedef struct items {
    item *v;
    size_t n, cap;
} items;

static rw_status items_push(items *l, const item *it, rw_err *err) {
    if (l->n == l->cap) {
        size_t cap = l->cap ? 2 * l->cap : 256;
        item *p = realloc(l->v, cap * sizeof *p);
        if (!p) RW_FAIL(err, RW_E_OOM, "push: out of memory");
        l->v = p;
        l->cap = cap;
    }
    l->v[l->n++] = *it;
    return RW_OK;
}

/* The dim a Megatron-style trainer shards a canonical tensor along (-1: replicated). */
static int tp_dim(rw_wkind k) {
    switch (k) {
    case RW_W_EMBED:
    case RW_W_LM_HEAD:
    case RW_W_Q:
    case RW_W_K:
    case RW_W_V:
    case RW_W_EXP_GATE:
    case RW_W_EXP_UP: return 0;
    case RW_W_O:
    case RW_W_EXP_DOWN: return 1;
    case RW_W_EXP_GATE_UP: return 1;
    case RW_W_EXP_DOWN_ALL: return 2;
    default: return -1;
    }
}

static rw_sync_tensor base_tensor(const rw_st_entry *e) {
    rw_sync_tensor t;
    memset(&t, 0, sizeof t);
    rw_sync_strlcpy(t.name, e->name, sizeof t.name);
    t.dtype = e->dtype;
    t.ndim = e->ndim;
    memcpy(t.shape, e->shape, sizeof t.shape);
    t.shard_dim = -1;
    return t;
}

static rw_status build_items(const rw_ckpt *ck, const rw_config *cfg, int K, regex_t *re,
                             items *out, rw_err *err) {
    size_t n = rw_ckpt_count(ck);
    int L = cfg->num_layers, E = cfg->num_experts;
    /* per layer: how many of the 2E expert gate/up tensors are selected (and bf16) */
    int *gu = calloc((size_t)L, sizeof *gu);
    if (!gu) RW_FAIL(err, RW_E_OOM, "push: out of memory");
    rw_status st = RW_OK;
    for (size_t i = 0; i < n; i++) {
        const rw_st_entry *e = rw_ckpt_at(ck, i);
        if (re && regexec(re, e->name, 0, NULL, 0)) continue;
        rw_wname w;
        if (rw_name_parse(e->name, cfg, &w, NULL) == RW_OK && !w.scale &&
            (w.kind == RW_W_EXP_GATE || w.kind == RW_W_EXP_UP) && e->dtype == RW_DTYPE_BF16)
            gu[w.layer]++;
    }
    for (size_t i = 0; i < n && st == RW_OK; i++) {
        const rw_st_entry *e = rw_ckpt_at(ck, i);
        if (re && regexec(re, e->name, 0, NULL, 0)) continue;
        rw_wname w;
        st = rw_name_parse(e->name, cfg, &w, err);
        if (st != RW_OK) break;
        item it = {.t = base_tensor(e), .src = e, .layer = -1};
        int dim = tp_dim(w.kind);
        if (K == 1 || w.scale || e->dtype != RW_DTYPE_BF16 || dim < 0) {
            st = items_push(out, &it, err);
            continue;
        }
        if ((w.kind == RW_W_EXP_GATE || w.kind == RW_W_EXP_UP) && gu[w.layer] == 2 * E) {
            /* fused Megatron gate_up shards of the whole layer, emitted once at expert 0 gate */
            if (w.kind != RW_W_EXP_GATE || w.expert != 0) continue;
            int64_t I = e->shape[0], H = e->shape[1];
            for (int k = 0; k < K && st == RW_OK; k++) {
                int64_t b = k * I / K, l = (k + 1) * I / K - b;
                item g = {.src = NULL, .layer = w.layer};
                memset(&g.t, 0, sizeof g.t);
                snprintf(g.t.name, sizeof g.t.name, "model.layers.%d.mlp.experts.gate_up_proj",
                         w.layer);
                g.t.dtype = RW_DTYPE_BF16;
                g.t.ndim = 3;
                g.t.shape[0] = E;
                g.t.shape[1] = 2 * I;
                g.t.shape[2] = H;
                g.t.shard_dim = 1;
                g.t.shard_begin = b;
                g.t.shard_len = l;
                g.t.layout = RW_PIECE_GATE_UP;
                st = items_push(out, &g, err);
            }
            continue;
        }
        int64_t D = e->shape[dim];
        for (int k = 0; k < K && st == RW_OK; k++) {
            /* K pieces covering [0, D) exactly (the last ones one row shorter when K does not
             * divide D) */
            int64_t b = k * D / K, l = (k + 1) * D / K - b;
            if (l <= 0) continue;
            item s = it;
            s.t.shard_dim = dim;
            s.t.shard_begin = b;
            s.t.shard_len = l;
            st = items_push(out, &s, err);
        }
    }
    free(gu);
    return st;
}

/* Replaces every item whose piece exceeds `bucket` bytes by pieces that fit: a whole tensor by
 * row pieces (shard dim 0), a shard (fused gate_up included) by sub-ranges of its shard range
 * along the same dim; cuts at multiples of rw_split_step indices. The 30B-A3B embedding and
 * lm_head (151936 x 2048 bf16, 622 MB) exceed the default 512 MiB bucket. */
static rw_status split_items(items *l, uint64_t bucket, rw_err *err) {
    items out = {0};
    rw_status st = RW_OK;
    for (size_t i = 0; i < l->n && st == RW_OK; i++) {
        const item *it = &l->v[i];
        uint64_t nb = rw_sync_piece_bytes(&it->t);
        if (nb <= bucket) {
            st = items_push(&out, it, err);
            continue;
        }
        int dim = it->t.shard_dim >= 0 ? it->t.shard_dim : 0;
        uint64_t b = it->t.shard_dim >= 0 ? (uint64_t)it->t.shard_begin : 0;
        uint64_t len = it->t.shard_dim >= 0 ? (uint64_t)it->t.shard_len : (uint64_t)it->t.shape[0];
        uint64_t step = len ? rw_split_step(nb / len, bucket) : 0;
        if (!step) {
            st = RW_ERR(err, RW_E_RANGE,
                        "push: %s: one index of dim %d is %" PRIu64 " bytes, more than the "
                        "bucket size %" PRIu64 " (raise the bucket size)",
                        it->t.name, dim, len ? nb / len : nb, bucket);
            break;
        }
        for (uint64_t at = b; at < b + len && st == RW_OK;) {
            uint64_t end = rw_split_end(at, b + len, step);
            item p = *it;
            p.t.shard_dim = dim;
            p.t.shard_begin = (int64_t)at;
            p.t.shard_len = (int64_t)(end - at);
            st = items_push(&out, &p, err);
            at = end;
        }
    }
    if (st != RW_OK) {
        free(out.v);
        return st;
    }
    free(l->v);
    *l = out;
    return RW_OK;
}

/* Writes item `it`'s bytes at dst. */
static rw_status gather(const rw_ckpt *ck, const rw_config *cfg, const item *it, uint8_t *dst,
                        rw_err *err) {
    const rw_sync_tensor *t = &it->t;
    if (it->src) {
        slice_copy(it->src->data, rw_dtype_size(t->dtype), t->ndim, t->shape, t->shard_dim,
                   t->shard_begin, t->shard_len, dst);
        return RW_OK;
    }
    /* gate_up [E, 2*len, H]: per expert, gate rows [b, b+len) then up rows [b, b+len) */
    int64_t I = t->shape[1] / 2, H = t->shape[2], b = t->shard_begin, l = t->shard_len;
    size_t row = (size_t)H * 2;
    for (int e = 0; e < cfg->num_experts; e++) {
        for (int half = 0; half < 2; half++) {
            char name[RW_SYNC_MAX_NAME];
            snprintf(name, sizeof name, "model.layers.%d.mlp.experts.%d.%s.weight", it->layer, e,
                     half ? "up_proj" : "gate_proj");
            const rw_st_entry *s = rw_ckpt_find(ck, name);
            if (!s || s->dtype != RW_DTYPE_BF16 || s->ndim != 2 || s->shape[0] != I ||
                s->shape[1] != H)
                RW_FAIL(err, RW_E_NOT_FOUND,
                        "push: %s missing or not bf16 [%" PRId64 ", %" PRId64 "]", name, I, H);
            memcpy(dst + ((size_t)e * 2 * (size_t)l + (size_t)half * (size_t)l) * row,
                   (const uint8_t *)s->data + (size_t)b * row, (size_t)l * row);
        }
    }
    return RW_OK;
}

/* ------------------------------------------------------------------------------------------ */
/* NCCL staging on the trainer (CUDA builds)                                                    */
/* ------------------------------------------------------------------------------------------ */
#ifdef RW_HAVE_CUDA
typedef struct tstage {
    void *dev[2];
    cudaStream_t copy;
    cudaEvent_t copied[2], sent[2];
    bool used[2];
} tstage;

static void tstage_free(tstage *t) {
    for (int i = 0; i < 2; i++) {
        if (t->dev[i]) cudaFree(t->dev[i]);
        if (t->copied[i]) cudaEventDestroy(t->copied[i]);
        if (t->sent[i]) cudaEventDestroy(t->sent[i]);
    }
    if (t->copy) cudaStreamDestroy(t->copy);
}

static rw_status tstage_init(tstage *t, int device, uint64_t bytes, rw_err *err) {
    memset(t, 0, sizeof *t);
    RW_CUDA_CHECK(err, cudaSetDevice(device));
    RW_CUDA_CHECK(err, cudaStreamCreateWithFlags(&t->copy, cudaStreamNonBlocking));
    for (int i = 0; i < 2; i++) {
        RW_CUDA_CHECK(err, cudaMalloc(&t->dev[i], bytes));
        RW_CUDA_CHECK(err, cudaEventCreateWithFlags(&t->copied[i], cudaEventDisableTiming));
        RW_CUDA_CHECK(err, cudaEventCreateWithFlags(&t->sent[i], cudaEventDisableTiming));
    }
    return RW_OK;
}

/* Host bucket -> device slot, then the protocol message and the broadcast. The host buffer is
 * free again when this returns (the copy is waited for). */
static rw_status tstage_send(tstage *t, rw_client_group *g, int slot, const void *host,
                             const rw_sync_manifest *m, int timeout_ms, rw_err *err) {
    cudaStream_t bs = (cudaStream_t)rw_client_group_stream(g);
    if (t->used[slot]) RW_CUDA_CHECK(err, cudaStreamWaitEvent(t->copy, t->sent[slot], 0));
    RW_CUDA_CHECK(err, cudaMemcpyAsync(t->dev[slot], host, rw_sync_manifest_bytes(m),
                                       cudaMemcpyHostToDevice, t->copy));
    RW_CUDA_CHECK(err, cudaEventRecord(t->copied[slot], t->copy));
    /* bounded: the copy may wait behind the broadcast two buckets back */
    double deadline = rw_now() + timeout_ms / 1e3;
    for (;;) {
        cudaError_t e = cudaEventQuery(t->copied[slot]);
        if (e == cudaSuccess) break;
        if (e != cudaErrorNotReady)
            return rw_cuda_fail(err, e, __FILE__, __LINE__, "push: host -> device copy");
        if (rw_now() > deadline) {
            rw_sync_group_abort(rw_client_group_comm(g));
            RW_FAIL(err, RW_E_TIMEOUT, "push: trainer staging copy stalled (broadcast stuck?)");
        }
        rw_sync_nap();
    }
    RW_CUDA_CHECK(err, cudaStreamWaitEvent(bs, t->copied[slot], 0));
    RW_CHECK(rw_client_update_weights_nccl(g, m, t->dev[slot], bs, timeout_ms, err));
    RW_CUDA_CHECK(err, cudaEventRecord(t->sent[slot], bs));
    t->used[slot] = true;
    return RW_OK;
}
#endif

/* ------------------------------------------------------------------------------------------ */
/* Push                                                                                         */
/* ------------------------------------------------------------------------------------------ */
static void abort_all(rw_client *const *w, int n, int timeout_ms) {
    for (int i = 0; i < n; i++) {
        rw_err e;
        if (rw_client_abort_update(w[i], timeout_ms, NULL, &e) != RW_OK)
            RW_LOGW("push: abort_update on worker %d: %s", i, e.msg);
    }
}

static rw_status load_cfg(const char *dir, rw_config *cfg, rw_err *err) {
    char path[4096];
    snprintf(path, sizeof path, "%s/config.json", dir);
    return rw_config_load(path, cfg, err);
}

rw_status rw_sync_push_ckpt(rw_client *const *workers, int n, rw_client_group *group,
                            const char *model_dir, const rw_push_opts *o, rw_push_summary *out,
                            rw_err *err) {
    memset(out, 0, sizeof *out);
    if (n < 1) RW_FAIL(err, RW_E_INVALID_ARG, "push: no workers");
    const char *transport = o->transport ? o->transport : "zmq";
    bool nccl = !strcmp(transport, "nccl");
    if (!nccl && strcmp(transport, "zmq"))
        RW_FAIL(err, RW_E_INVALID_ARG, "push: transport '%s' (zmq or nccl)", transport);
    if (nccl && !group) RW_FAIL(err, RW_E_INVALID_ARG, "push: nccl transport without a group");
#ifndef RW_HAVE_CUDA
    if (nccl) RW_FAIL(err, RW_E_NO_DEVICE, "push: nccl transport in a build without CUDA");
#endif
    int K = o->trainer_tp > 0 ? o->trainer_tp : 1;
    uint64_t bucket = o->bucket_bytes ? o->bucket_bytes : RW_SYNC_DEFAULT_BUCKET;
    int tmo = o->timeout_ms > 0 ? o->timeout_ms : 60000;
    char ver[RW_SYNC_MAX_VERSION + 1];
    if (o->version && o->version[0])
        rw_sync_strlcpy(ver, o->version, sizeof ver);
    else
        snprintf(ver, sizeof ver, "push-%lld", (long long)time(NULL));
    RW_CHECK(rw_sync_check_version_tag(ver, err));

    rw_config cfg;
    memset(&cfg, 0, sizeof cfg);
    rw_ckpt *ck = NULL;
    regex_t re;
    bool have_re = false;
    items its = {0};
    rw_sync_manifest *m = NULL;
    uint8_t *host = NULL;
    bool pinned = false, begun = false;
    rw_status st;
#ifdef RW_HAVE_CUDA
    tstage ts;
    memset(&ts, 0, sizeof ts);
#endif
    RW_CHECKGOTO(load_cfg(model_dir, &cfg, err), st, done);
    RW_CHECKGOTO(rw_ckpt_open(model_dir, &ck, err), st, done);
    if (o->only && o->only[0]) {
        int rc = regcomp(&re, o->only, REG_EXTENDED | REG_NOSUB);
        if (rc) {
            char msg[128];
            regerror(rc, &re, msg, sizeof msg);
            st = RW_ERR(err, RW_E_INVALID_ARG, "push: --only '%s': %s", o->only, msg);
            goto done;
        }
        have_re = true;
    }
    RW_CHECKGOTO(build_items(ck, &cfg, K, have_re ? &re : NULL, &its, err), st, done);
    if (its.n == 0) {
        st = RW_ERR(err, RW_E_NOT_FOUND, "push: no tensor of %s selected", model_dir);
        goto done;
    }
    RW_CHECKGOTO(split_items(&its, bucket, err), st, done);
    {
        /* a small model needs no bucket larger than itself: every piece, aligned, in one (the
         * buffers and the workers' staging are allocated at the bucket size) */
        uint64_t need = 0;
        for (size_t i = 0; i < its.n; i++)
            need += (rw_sync_piece_bytes(&its.v[i].t) + RW_SYNC_ALIGN - 1) / RW_SYNC_ALIGN *
                    RW_SYNC_ALIGN;
        if (need > 0 && need < bucket) bucket = need;
    }
#ifdef RW_HAVE_CUDA
    if (nccl) {
        RW_CHECKGOTO(rw_host_malloc_pinned(bucket, (void **)&host, err), st, done);
        pinned = true;
        RW_CHECKGOTO(
            tstage_init(&ts, rw_sync_group_device(rw_client_group_comm(group)), bucket, err), st,
            done);
    }
#endif
    if (!host) {
        host = malloc(bucket);
        if (!host) {
            st = RW_ERR(err, RW_E_OOM, "push: bucket buffer of %" PRIu64 " bytes", bucket);
            goto done;
        }
    }
    RW_CHECKGOTO(rw_sync_manifest_create(&m, err), st, done);

    double t0 = rw_now();
    for (int i = 0; i < n; i++) {
        st = rw_client_begin_update(workers[i], ver, o->flush_cache, bucket, 0, tmo, err);
        if (st != RW_OK) {
            rw_err_prefix(err, "push: worker %d", i);
            abort_all(workers, i, tmo);
            goto done;
        }
    }
    begun = true;
#ifdef RW_HAVE_CUDA
    int slot = 0;
#endif
    for (size_t i = 0; i < its.n;) {
        rw_sync_manifest_clear(m);
        size_t j = i;
        while (j < its.n) {
            uint64_t nb = rw_sync_piece_bytes(&its.v[j].t);
            uint64_t at =
                (rw_sync_manifest_bytes(m) + RW_SYNC_ALIGN - 1) / RW_SYNC_ALIGN * RW_SYNC_ALIGN;
            if (j > i && at + nb > bucket) break;
            const rw_sync_tensor *t = &its.v[j].t;
            uint64_t off;
            RW_CHECKGOTO(rw_sync_manifest_add(m, t->name, t->dtype, t->ndim, t->shape, t->shard_dim,
                                              t->shard_begin, t->shard_len, t->layout, &off, err),
                         st, done);
            RW_CHECKGOTO(gather(ck, &cfg, &its.v[j], host + off, err), st, done);
            out->bytes += nb;
            j++;
        }
        out->pieces += j - i;
        out->buckets++;
        if (nccl) {
#ifdef RW_HAVE_CUDA
            st = tstage_send(&ts, group, slot, host, m, tmo, err);
            slot ^= 1;
#endif
        } else {
            for (int w = 0; w < n && st == RW_OK; w++) {
                st = rw_client_update_weights_zmq(workers[w], m, host, tmo, err);
                if (st != RW_OK)
                    rw_err_prefix(err, "push: worker %d, bucket %" PRIu64, w, out->buckets - 1);
            }
        }
        if (st != RW_OK) goto done;
        i = j;
    }
    for (int i = 0; i < n; i++) {
        st = rw_client_commit_update(workers[i], tmo, out->version, sizeof out->version, err);
        if (st != RW_OK) {
            rw_err_prefix(err, "push: commit on worker %d", i);
            goto done;
        }
    }
    begun = false;
    out->seconds = rw_now() - t0;
    out->gbps = out->seconds > 0 ? (double)out->bytes / out->seconds / 1e9 : 0;
    /* distinct canonical tensors sent: count each at its first piece */
    for (size_t i = 0; i < its.n; i++)
        if (its.v[i].t.shard_dim < 0 || its.v[i].t.shard_begin == 0)
            out->tensors += its.v[i].src ? 1 : 2 * (uint64_t)cfg.num_experts;
    if (o->verify) {
        out->verified = true;
        st = rw_sync_verify_ckpt(workers, n, model_dir, o->only, tmo, &out->checked,
                                 &out->mismatches, out->first_mismatch, sizeof out->first_mismatch,
                                 err);
    }
done:
    if (begun) abort_all(workers, n, tmo);
#ifdef RW_HAVE_CUDA
    if (nccl && group) {
        rw_err e2;
        rw_client_group_sync(group, NULL, tmo / 1e3, &e2);
    }
    tstage_free(&ts);
    if (pinned) rw_host_free_pinned(host);
#endif
    if (!pinned) free(host);
    rw_sync_manifest_destroy(m);
    free(its.v);
    if (have_re) regfree(&re);
    rw_ckpt_close(ck);
    rw_config_free(&cfg);
    return st;
}

/* ------------------------------------------------------------------------------------------ */
/* Verify                                                                                       */
/* ------------------------------------------------------------------------------------------ */
rw_status rw_sync_verify_ckpt(rw_client *const *workers, int n, const char *model_dir,
                              const char *only, int timeout_ms, uint64_t *checked,
                              uint64_t *mismatches, char *first_mismatch, size_t cap, rw_err *err) {
    *checked = *mismatches = 0;
    if (first_mismatch && cap) first_mismatch[0] = 0;
    rw_config cfg;
    memset(&cfg, 0, sizeof cfg);
    rw_ckpt *ck = NULL;
    regex_t re;
    bool have_re = false;
    const char **names = NULL;
    const rw_st_entry **ents = NULL;
    rw_client_sums *sums = NULL;
    rw_status st;
    RW_CHECKGOTO(load_cfg(model_dir, &cfg, err), st, done);
    RW_CHECKGOTO(rw_ckpt_open(model_dir, &ck, err), st, done);
    if (only && only[0]) {
        if (regcomp(&re, only, REG_EXTENDED | REG_NOSUB)) {
            st = RW_ERR(err, RW_E_INVALID_ARG, "verify: bad regex '%s'", only);
            goto done;
        }
        have_re = true;
    }
    size_t total = rw_ckpt_count(ck), k = 0;
    names = calloc(total + 1, sizeof *names);
    ents = calloc(total + 1, sizeof *ents);
    if (!names || !ents) {
        st = RW_ERR(err, RW_E_OOM, "verify: out of memory");
        goto done;
    }
    for (size_t i = 0; i < total; i++) {
        const rw_st_entry *e = rw_ckpt_at(ck, i);
        if (have_re && regexec(&re, e->name, 0, NULL, 0)) continue;
        if (e->dtype != RW_DTYPE_BF16) continue; /* pre-quantized tensors: not recomputed */
        names[k] = e->name;
        ents[k++] = e;
    }
    for (int w = 0; w < n; w++) {
        rw_client_sums_free(sums);
        sums = NULL;
        RW_CHECKGOTO(rw_client_checksum(workers[w], names, k, timeout_ms, &sums, err), st, done);
        rw_config wc = cfg;
        RW_CHECKGOTO(rw_client_sums_quant(sums, &wc.quant, err), st, done);
        int tp = rw_client_sums_tp(sums);
        for (int r = 0; r < rw_client_sums_ranks(sums); r++) {
            int rank = rw_client_sums_rank(sums, r);
            for (size_t i = 0; i < k; i++) {
                uint64_t want, got;
                RW_CHECKGOTO(rw_client_sums_find(sums, r, names[i], &got, err), st, done);
                RW_CHECKGOTO(rw_sync_expected_checksum(&wc, tp, rank, names[i], ents[i]->data,
                                                       ents[i]->dtype, &want, err),
                             st, done);
                (*checked)++;
                if (want != got) {
                    if (!*mismatches && first_mismatch && cap)
                        snprintf(first_mismatch, cap, "worker %d rank %d %s", w, rank, names[i]);
                    (*mismatches)++;
                }
            }
        }
    }
    st = RW_OK;
done:
    rw_client_sums_free(sums);
    free(names);
    free(ents);
    if (have_re) regfree(&re);
    rw_ckpt_close(ck);
    rw_config_free(&cfg);
    return st;
}
