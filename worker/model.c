/* model.c - the Qwen3-MoE model of one rank: config, TP dims, the weight set on the backend's
 * place, loading (checkpoint directory or seeded random weights, both through rw_wset_apply), and
 * teacher-forced scoring for tests. The forward pass itself is the backend's (cpu.c, cuda_*). */
#include <math.h>
#include <stdlib.h>

#include "internal.h"
#include "kernels.h"

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

/* Rows of tensor e per piece: all of them when it fits in `limit` or cannot be cut. */
static uint64_t load_rows_step(const rw_st_entry *e, uint64_t limit) {
    uint64_t bytes = e->end - e->begin;
    uint64_t rows = e->ndim >= 1 ? (uint64_t)e->shape[0] : 1;
    if (bytes <= limit || rows < 2) return rows;
    uint64_t step = limit / (bytes / rows);
    if (step >= 128) step = step / 128 * 128;
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
            const uint64_t nr = whole ? rows : (rows - r < step ? rows - r : step);
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

typedef struct rand_ctx {
    rw_model *m;
    uint64_t seed;
    float std;
    uint16_t *buf;
    size_t cap;
    rw_err *err;
} rand_ctx;

void rw_model_rand_params(const rw_wname *w, const char *name, uint64_t seed, float std,
                          uint64_t *tensor_seed, float *mean, float *sd) {
    const bool norm = w->kind == RW_W_INPUT_NORM || w->kind == RW_W_POST_NORM ||
                      w->kind == RW_W_FINAL_NORM || w->kind == RW_W_Q_NORM ||
                      w->kind == RW_W_K_NORM;
    *tensor_seed = seed ^ rw_checksum64(name, strlen(name), 0x5eed);
    *mean = norm ? 1.0f : 0.0f;
    *sd = norm ? 0.1f : std;
}

static rw_status rand_one(const rw_wname *w, void *vctx) {
    rand_ctx *c = vctx;
    rw_err *err = c->err;
    char name[256];
    rw_name_format(w, name, sizeof name);
    rw_piece p;
    memset(&p, 0, sizeof p);
    RW_CHECK(rw_config_weight_shape(&c->m->cfg, w, &p.ndim, p.shape, err));
    const size_t n = (size_t)rw_shape_numel(p.ndim, p.shape);
    if (n > c->cap) {
        uint16_t *nb = realloc(c->buf, n * sizeof(uint16_t));
        if (!nb) RW_FAIL(err, RW_E_OOM, "random weights: %zu elements for %s", n, name);
        c->buf = nb;
        c->cap = n;
    }
    /* each tensor depends only on (seed, name): the same on every rank, TP degree and backend */
    uint64_t ts;
    float mean, sd;
    rw_model_rand_params(w, name, c->seed, c->std, &ts, &mean, &sd);
    for (size_t i = 0; i < n; i++)
        c->buf[i] = rw_rand_bf16_at(ts, i, mean, sd);
    p.name = name;
    p.dtype = RW_DTYPE_BF16;
    p.shard_dim = -1;
    p.layout = RW_PIECE_PLAIN;
    p.data = c->buf;
    p.place = RW_PLACE_HOST;
    return rw_wset_apply(c->m->ws, &p, NULL, err);
}

rw_status rw_model_load_random(rw_model *m, uint64_t seed, float std, rw_err *err) {
    if (m->kind == RW_BACKEND_CUDA) {
        /* same values, generated on the device (a 30B model in seconds, not minutes) */
        rw_wset_mark_clear(m->ws);
        RW_CHECK(rw_cuda_be_load_random(m, seed, std > 0 ? std : 0.02f, err));
        return check_complete(m, "random weights", err);
    }
    rand_ctx c = {m, seed, std > 0 ? std : 0.02f, NULL, 0, err};
    rw_wset_mark_clear(m->ws);
    rw_status st = rw_config_for_each_weight(&m->cfg, rand_one, &c);
    free(c.buf);
    RW_CHECK(st);
    return check_complete(m, "random weights", err);
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
rw_status rw_cuda_be_load_random(rw_model *m, uint64_t seed, float std, rw_err *err) {
    RW_FAIL(err, RW_E_NO_DEVICE, "CUDA backend: this build has no CUDA");
}
#endif
