/* model.c - the Qwen3-MoE model of one rank: config, TP dims, the weight set on the backend's
 * place, loading (checkpoint directory, or seeded random weights through the backend's
 * load_random: model_random.c), the batch check every backend runs, and teacher-forced scoring for
 * tests. The forward pass itself is the backend's (cpu.c, cuda_*.c). */
#include <math.h>
#include <stdlib.h>

#include "internal.h"
#include "rw_sync.h"

/* The names of the two-valued option enums (values 0 and 1, in the order of their names), one
 * lookup and one parser for both. */
static const char *const k_backend_names[2] = {"cpu", "cuda"};
static const char *const k_precision_names[2] = {"standard", "high"};

static const char *name_of(const char *const names[2], int v) {
    return v == 0 || v == 1 ? names[v] : "invalid";
}

static rw_status parse_name(const char *s, const char *what, const char *const names[2], int *out,
                            rw_err *err) {
    for (int v = 0; v < 2; v++)
        if (s && strcmp(s, names[v]) == 0) {
            *out = v;
            return RW_OK;
        }
    RW_FAIL(err, RW_E_INVALID_ARG, "unknown %s '%s' (%s or %s)", what, s ? s : "(null)", names[0],
            names[1]);
}

const char *rw_backend_str(rw_backend b) {
    return name_of(k_backend_names, (int)b);
}

rw_status rw_backend_parse(const char *s, rw_backend *out, rw_err *err) {
    int v = 0;
    RW_CHECK(parse_name(s, "backend", k_backend_names, &v, err));
    *out = (rw_backend)v;
    return RW_OK;
}

const char *rw_precision_str(rw_precision p) {
    return name_of(k_precision_names, (int)p);
}

rw_status rw_precision_parse(const char *s, rw_precision *out, rw_err *err) {
    int v = 0;
    RW_CHECK(parse_name(s, "precision", k_precision_names, &v, err));
    *out = (rw_precision)v;
    return RW_OK;
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
    if (o->precision != RW_PRECISION_STANDARD && o->precision != RW_PRECISION_HIGH)
        RW_FAIL(err, RW_E_INVALID_ARG, "model: precision %d (standard or high)", (int)o->precision);
    rw_model *m = calloc(1, sizeof *m);
    if (!m) RW_FAIL(err, RW_E_OOM, "model");
    rw_status st;
    RW_CHECKGOTO(rw_config_copy(cfg, &m->cfg, err), st, fail_cfg);
    RW_CHECKGOTO(rw_tp_dims_make(cfg, tp, rank, &m->d, err), st, fail);
    m->kind = o->backend;
    m->device = o->device;
    m->precision = o->precision;
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
void rw_model_release_derived(rw_model *m) {
    if (m && m->ops && m->ops->release_derived) m->ops->release_derived(m);
}

static rw_status check_complete(rw_model *m, const char *what, rw_err *err) {
    char missing[256];
    if (!rw_wset_complete(m->ws, missing, sizeof missing))
        RW_FAIL(err, RW_E_WEIGHTS_INCOMPLETE, "%s: weights not fully written (missing %s)", what,
                missing);
    return RW_OK;
}

/* The checkpoint is cut into pieces by the sync module's one cutter (rw_sync_load_ckpt: pread
 * into a bounded host buffer, row pieces for large tensors), the same as an update from disk. */
rw_status rw_model_load_ckpt(rw_model *m, const char *dir, rw_err *err) {
    RW_CHECK(rw_sync_load_ckpt(m->ws, dir, 0, err)); /* 0: RW_LOAD_PIECE_BYTES or 256 MiB */
    if (m->kind == RW_BACKEND_CUDA) RW_CHECK(rw_stream_sync(NULL, err));
    return check_complete(m, dir, err);
}

rw_status rw_model_load_random(rw_model *m, uint64_t seed, float std, rw_err *err) {
    rw_wset_mark_clear(m->ws);
    RW_CHECK(m->ops->load_random(m, seed, std > 0 ? std : 0.02f, err));
    return check_complete(m, "random weights", err);
}

void rw_rope_inv_freq(const rw_config *c, float *out) {
    const int64_t hd = c->head_dim;
    for (int64_t i = 0; i < hd / 2; i++)
        out[i] = (float)(1.0 / pow(c->rope_theta, (double)(2 * i) / (double)hd));
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
        const int32_t rows = rw_fwd_seq_rows(q);
        if (!b->all_logits && (q->logits_row >= b->nlogits || rows > q->ntok ||
                               (int64_t)q->logits_row + rows > b->nlogits))
            RW_FAIL(err, RW_E_RANGE, "forward: logits rows [%d, +%d) of %d for %d tokens",
                    q->logits_row, rows, b->nlogits, q->ntok);
        if (!b->all_logits) nrows_set += rows;
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
