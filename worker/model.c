/* model.c - the Qwen3-MoE model of one rank: config, TP dims, the weight set on the backend's
 * place, loading (checkpoint directory, or seeded random weights through the backend's
 * load_random: model_random.c), the batch check every backend runs, and teacher-forced scoring for
 * tests. The forward pass itself is the backend's (cpu.c, cuda_*.c). */
#include <math.h>
#include <stdlib.h>

#include "internal.h"

const char *rw_backend_str(rw_backend b) {
    switch (b) {
    case RW_BACKEND_CPU: return "cpu";
    case RW_BACKEND_CUDA: return "cuda";
    }
    return "invalid";
}

rw_status rw_backend_parse(const char *s, rw_backend *out, rw_err *err) {
    if (s && strcmp(s, "cpu") == 0) {
        *out = RW_BACKEND_CPU;
        return RW_OK;
    }
    if (s && strcmp(s, "cuda") == 0) {
        *out = RW_BACKEND_CUDA;
        return RW_OK;
    }
    RW_FAIL(err, RW_E_INVALID_ARG, "unknown backend '%s' (cpu or cuda)", s ? s : "(null)");
}

rw_status rw_model_create(const rw_config *cfg, const rw_model_opts *o, rw_model **out,
                          rw_err *err) {
    if (!cfg || !o || !out) RW_FAIL(err, RW_E_INVALID_ARG, "model: NULL argument");
    *out = NULL;
    const int tp = o->comm ? rw_comm_size(o->comm) : 1;
    const int rank = o->comm ? rw_comm_rank(o->comm) : 0;
    if (o->tp != 0 && o->tp != tp)
        RW_FAIL(err, RW_E_INVALID_ARG, "model: tp %d but the communicator has %d ranks", o->tp, tp);
    if (o->comm && o->rank != rank)
        RW_FAIL(err, RW_E_INVALID_ARG, "model: rank %d but the communicator says %d", o->rank,
                rank);
    if (cfg->head_dim % 2 != 0 || cfg->num_heads % cfg->num_kv_heads != 0 || cfg->top_k < 1 ||
        cfg->top_k > cfg->num_experts)
        RW_FAIL(err, RW_E_UNSUPPORTED,
                "model: head_dim %d must be even, heads %d a multiple of kv heads %d, top_k %d in "
                "1..%d",
                cfg->head_dim, cfg->num_heads, cfg->num_kv_heads, cfg->top_k, cfg->num_experts);
    if (cfg->hidden_size % 64 != 0)
        RW_FAIL(err, RW_E_UNSUPPORTED, "model: hidden_size %d must be a multiple of 64",
                cfg->hidden_size);
    rw_model *m = calloc(1, sizeof *m);
    if (!m) RW_FAIL(err, RW_E_OOM, "model");
    rw_status st;
    RW_CHECKGOTO(rw_config_copy(cfg, &m->cfg, err), st, fail_cfg);
    RW_CHECKGOTO(rw_tp_dims_make(cfg, tp, rank, &m->d, err), st, fail);
    m->kind = o->backend;
    m->device = o->device;
    if (o->comm) {
        m->comm = o->comm;
    } else {
        RW_CHECKGOTO(rw_comm_create_single(&m->comm, err), st, fail);
        m->own_comm = true;
    }
    const rw_place place = o->backend == RW_BACKEND_CUDA ? RW_PLACE_DEVICE : RW_PLACE_HOST;
    if (place == RW_PLACE_DEVICE) RW_CHECKGOTO(rw_cuda_set_device(o->device, err), st, fail);
    RW_CHECKGOTO(rw_wset_create(cfg, tp, rank, place, o->device, &m->ws, err), st, fail);
    if (o->backend == RW_BACKEND_CPU)
        RW_CHECKGOTO(rw_cpu_backend_init(m, err), st, fail);
    else
        RW_CHECKGOTO(rw_cuda_backend_init(m, err), st, fail);
    *out = m;
    return RW_OK;
fail:
    rw_config_free(&m->cfg);
fail_cfg:
    rw_wset_destroy(m->ws);
    if (m->own_comm) rw_comm_destroy(m->comm);
    free(m);
    return st;
}

void rw_model_destroy(rw_model *m) {
    if (!m) return;
    if (m->ops && m->ops->destroy) m->ops->destroy(m);
    rw_wset_destroy(m->ws);
    if (m->own_comm) rw_comm_destroy(m->comm);
    rw_config_free(&m->cfg);
    free(m);
}

const rw_config *rw_model_config(const rw_model *m) {
    return &m->cfg;
}
const rw_tp_dims *rw_model_dims(const rw_model *m) {
    return &m->d;
}
rw_backend rw_model_backend(const rw_model *m) {
    return m->kind;
}
rw_wset *rw_model_wset(rw_model *m) {
    return m->ws;
}

static rw_status check_complete(rw_model *m, const char *what, rw_err *err) {
    char missing[256];
    if (!rw_wset_complete(m->ws, missing, sizeof missing))
        RW_FAIL(err, RW_E_WEIGHTS_INCOMPLETE, "%s: weights not fully written (missing %s)", what,
                missing);
    return RW_OK;
}

/* Checkpoint tensors are read with pread (rw_st_read) into a host buffer and applied from there,
 * never through the files' mappings: a file truncated while it is loaded then fails the load
 * with "file shrank while loading" (naming the file, the tensor and the byte) instead of killing
 * the process with SIGBUS. A tensor larger than LOAD_PIECE bytes goes as row pieces along dim 0
 * (a multiple of 128 rows each when that many fit: whole fp8 / mxfp8 blocks), so the buffer
 * stays that size; RW_LOAD_PIECE_BYTES (>= 4096) sets another size (tests use small ones). */
#define LOAD_PIECE (256ull << 20)

static uint64_t load_piece_bytes(void) {
    const char *v = getenv("RW_LOAD_PIECE_BYTES");
    if (v && v[0]) {
        long long n = atoll(v);
        if (n >= 4096) return (uint64_t)n;
    }
    return LOAD_PIECE;
}

/* Rows of tensor e per piece: all of them when it fits in `limit` or cannot be cut; else the cut
 * of rw_split_step, and one row when a single row is larger than the limit. */
static uint64_t load_rows_step(const rw_st_entry *e, uint64_t limit) {
    uint64_t bytes = e->end - e->begin;
    uint64_t rows = e->ndim >= 1 ? (uint64_t)e->shape[0] : 1;
    if (bytes <= limit || rows < 2) return rows;
    const uint64_t step = rw_split_step(bytes / rows, limit);
    return step ? step : 1;
}

rw_status rw_model_load_ckpt(rw_model *m, const char *dir, rw_err *err) {
    rw_ckpt *ck = NULL;
    RW_CHECK(rw_ckpt_open(dir, &ck, err));
    rw_status st = RW_OK;
    const size_t n = rw_ckpt_count(ck);
    const uint64_t limit = load_piece_bytes();
    /* the host buffer: the largest piece (rw_wset_apply gathers host pieces into its own
     * staging before it returns, so one buffer serves every piece in turn) */
    uint64_t cap = 1;
    for (size_t i = 0; i < n; i++) {
        const rw_st_entry *e = rw_ckpt_at(ck, i);
        uint64_t bytes = e->end - e->begin, rows = e->ndim >= 1 ? (uint64_t)e->shape[0] : 1;
        uint64_t piece = rows ? bytes / rows * load_rows_step(e, limit) : bytes;
        if (piece > cap) cap = piece;
    }
    void *buf = malloc((size_t)cap);
    if (!buf) {
        rw_ckpt_close(ck);
        RW_FAIL(err, RW_E_OOM, "loading %s: out of memory for a %llu-byte read buffer", dir,
                (unsigned long long)cap);
    }
    rw_wset_mark_clear(m->ws);
    for (size_t i = 0; i < n && st == RW_OK; i++) {
        const rw_st_entry *e = rw_ckpt_at(ck, i);
        const rw_st_file *f = rw_ckpt_file(ck, (size_t)e->file_index);
        const uint64_t bytes = e->end - e->begin;
        const uint64_t rows = e->ndim >= 1 ? (uint64_t)e->shape[0] : 1;
        const uint64_t step = load_rows_step(e, limit);
        const bool whole = step >= rows;
        const uint64_t row = rows ? bytes / rows : 0;
        uint64_t r = 0;
        do {
            const uint64_t nr = whole ? rows : rw_split_end(r, rows, step) - r;
            const uint64_t off = whole ? 0 : r * row, len = whole ? bytes : nr * row;
            rw_piece p;
            memset(&p, 0, sizeof p);
            p.name = e->name;
            p.dtype = e->dtype;
            p.ndim = e->ndim;
            memcpy(p.shape, e->shape, sizeof p.shape);
            p.shard_dim = whole ? -1 : 0;
            p.shard_begin = whole ? 0 : (int64_t)r;
            p.shard_len = whole ? 0 : (int64_t)nr;
            p.layout = RW_PIECE_PLAIN;
            p.data = buf;
            p.place = RW_PLACE_HOST;
            st = rw_st_read(f, e->begin + off, buf, (size_t)len, err);
            /* host pieces are copied before rw_wset_apply returns: buf is free again after it */
            if (st == RW_OK) st = rw_wset_apply(m->ws, &p, NULL, err);
            if (st != RW_OK) rw_err_prefix(err, "loading %s", dir);
            r += nr;
        } while (st == RW_OK && !whole && r < rows);
    }
    if (st == RW_OK && m->kind == RW_BACKEND_CUDA) st = rw_stream_sync(NULL, err);
    if (st == RW_OK) st = check_complete(m, dir, err);
    free(buf);
    rw_ckpt_close(ck);
    return st;
}

rw_status rw_model_load_random(rw_model *m, uint64_t seed, float std, rw_err *err) {
    rw_wset_mark_clear(m->ws);
    RW_CHECK(m->ops->load_random(m, seed, std > 0 ? std : 0.02f, err));
    return check_complete(m, "random weights", err);
}

rw_status rw_fwd_batch_check(const rw_model *m, const rw_fwd_batch *b, int64_t nblocks, int bs,
                             int64_t *max_ctx, int *max_blocks, rw_err *err) {
    if (!b || b->ntok < 1 || b->nseq < 1 || !b->tokens || !b->seq)
        RW_FAIL(err, RW_E_INVALID_ARG, "forward: empty batch");
    if (b->all_logits && b->nlogits != b->ntok)
        RW_FAIL(err, RW_E_INVALID_ARG, "forward: all_logits needs nlogits == ntok");
    int64_t tok = 0, mc = 0;
    int maxb = 1, nrows_set = 0;
    for (int s = 0; s < b->nseq; s++) {
        const rw_fwd_seq *q = &b->seq[s];
        if (q->tok0 != tok || q->ntok < 1 || q->pos0 < 0 || !q->blocks)
            RW_FAIL(err, RW_E_INVALID_ARG, "forward: sequence %d malformed (tok0 %d, ntok %d)", s,
                    q->tok0, q->ntok);
        tok += q->ntok;
        const int64_t end = (int64_t)q->pos0 + q->ntok;
        const int64_t nb = (end + bs - 1) / bs;
        if (end > mc) mc = end;
        if (nb > maxb) maxb = (int)nb;
        for (int64_t i = 0; i < nb; i++)
            if (q->blocks[i] < 0 || q->blocks[i] >= nblocks)
                RW_FAIL(err, RW_E_RANGE, "forward: sequence %d block %lld = %d outside [0, %lld)",
                        s, (long long)i, q->blocks[i], (long long)nblocks);
        if (!b->all_logits && q->logits_row >= b->nlogits)
            RW_FAIL(err, RW_E_RANGE, "forward: logits row %d of %d", q->logits_row, b->nlogits);
        nrows_set += !b->all_logits && q->logits_row >= 0;
    }
    /* every logits row must name a token (rows are distinct by construction of the engine) */
    if (!b->all_logits && nrows_set != b->nlogits)
        RW_FAIL(err, RW_E_INVALID_ARG, "forward: %d sequences ask for logits, nlogits is %d",
                nrows_set, b->nlogits);
    if (tok != b->ntok)
        RW_FAIL(err, RW_E_INVALID_ARG, "forward: sequences cover %lld of %d tokens", (long long)tok,
                b->ntok);
    for (int32_t t = 0; t < b->ntok; t++)
        if (b->tokens[t] < 0 || b->tokens[t] >= m->cfg.vocab_size)
            RW_FAIL(err, RW_E_RANGE, "forward: token %d outside [0, %d)", b->tokens[t],
                    m->cfg.vocab_size);
    *max_ctx = mc;
    *max_blocks = maxb;
    return RW_OK;
}

rw_status rw_model_score(rw_model *m, const int32_t *tokens, int n, float *logits, rw_err *err) {
    if (!m || !tokens || !logits || n <= 0)
        RW_FAIL(err, RW_E_INVALID_ARG, "score: NULL argument or n = %d", n);
    for (int i = 0; i < n; i++)
        if (tokens[i] < 0 || tokens[i] >= m->cfg.vocab_size)
            RW_FAIL(err, RW_E_RANGE, "score: token %d at %d outside [0, %d)", tokens[i], i,
                    m->cfg.vocab_size);
    const int bs = 16;
    const int nb = (n + bs - 1) / bs;
    int32_t *blocks = malloc(sizeof(int32_t) * (size_t)nb);
    if (!blocks) RW_FAIL(err, RW_E_OOM, "score: block table");
    for (int i = 0; i < nb; i++)
        blocks[i] = i;
    rw_kv *kv = NULL;
    rw_status st;
    RW_CHECKGOTO(m->ops->kv_create(m, nb, bs, &kv, err), st, done);
    rw_fwd_seq seq = {0, n, 0, blocks, n - 1};
    rw_fwd_batch b = {1, &seq, n, tokens, n, true};
    RW_CHECKGOTO(m->ops->forward(m, kv, &b, err), st, done);
    RW_CHECKGOTO(m->ops->logits_host(m, 0, n, logits, err), st, done);
done:
    if (kv) m->ops->kv_destroy(m, kv);
    free(blocks);
    return st;
}

#ifndef RW_CUDA_BACKEND
rw_status rw_cuda_backend_init(rw_model *m, rw_err *err) {
    RW_FAIL(err, RW_E_NO_DEVICE, "CUDA backend: this build has no CUDA (configure with CUDA)");
}
#endif
