/* engine.c - the generation engine: request queue, admission control over the paged KV blocks
 * (kv_blocks.c allocates them), continuous batching (requests join and leave the running batch
 * every step, decodes and chunked prefills in one forward pass), sampling through the backend,
 * finish rules, pause / resume (abort, retract, in place), KV release, weight-version stamps and
 * stats.
 *
 * Scheduling is deterministic (it depends only on the sequence of calls), so every TP rank that
 * receives the same calls runs the same batches. A request's tokens depend only on its prompt,
 * its sampling parameters and the weights: the uniform draw of each token comes from (seed,
 * position), and the CPU backend is batch and chunk invariant. */
#include <math.h>
#include <stdlib.h>

#include "internal.h"

typedef struct req {
    uint64_t id;
    rw_sampling sp;
    int n_prompt;
    int32_t *toks; /* [cap]: prompt then generated tokens */
    int ntok, cap;
    float *lps;       /* [cap - n_prompt] logprob of each generated token */
    int32_t *top_ids; /* [cap - n_prompt, top_logprobs] */
    float *top_lps;
    rw_version_span *spans;
    int n_spans, cap_spans;
    int32_t *blocks; /* KV block table */
    int nblocks, cap_blocks;
    int n_cached; /* tokens [0, n_cached) have their KV in the cache */
    int chunk;    /* tokens scheduled in the current step */
    bool running;
    double t_submit, t_first;
} req;

/* Requests by id: open addressing, tombstones on removal. */
typedef struct idmap {
    uint64_t *keys;
    req **vals; /* NULL = empty, TOMB = removed */
    size_t cap, used;
} idmap;
static req tomb_;
#define TOMB (&tomb_)

struct rw_engine {
    rw_model *m;
    rw_engine_opts o;
    rw_kv *kv;
    rw_kv_blocks kvb; /* which blocks of kv are free */
    req **waiting;    /* FIFO: [whead, wtail) */
    int64_t whead, wtail, wcap;
    req **running; /* admission order */
    int nrun, cap_run;
    rw_output **outq; /* finished, FIFO */
    int64_t ohead, otail, ocap;
    idmap ids;
    bool paused, kv_released;
    uint64_t version;
    /* per-step scratch */
    int32_t *btok;
    rw_fwd_seq *bseq;
    rw_sample_req *sreq;
    rw_sample_res *sres;
    req **sreq_of;
    int64_t cap_btok;
    int cap_bseq;
    /* stats */
    int64_t steps, prompt_tokens, gen_tokens, preemptions;
    double rate_t[16];
    int64_t rate_n[16];
    int rate_i;
};

/* ------------------------------------------------------------------------------------------ */
static uint64_t hash64(uint64_t x) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    return x;
}

static req *idmap_get(const idmap *m, uint64_t id) {
    if (!m->cap) return NULL;
    for (size_t i = hash64(id) & (m->cap - 1), n = 0; n < m->cap; i = (i + 1) & (m->cap - 1), n++) {
        if (!m->vals[i]) return NULL;
        if (m->vals[i] != TOMB && m->keys[i] == id) return m->vals[i];
    }
    return NULL;
}

static bool idmap_put(idmap *m, uint64_t id, req *r) {
    if ((m->used + 1) * 2 > m->cap) {
        /* rehash, dropping tombstones; size for the live entries */
        size_t live = 0;
        for (size_t i = 0; i < m->cap; i++)
            live += m->vals[i] && m->vals[i] != TOMB;
        size_t nc = 64;
        while ((live + 1) * 4 > nc)
            nc *= 2;
        uint64_t *k = calloc(nc, sizeof *k);
        req **v = calloc(nc, sizeof *v);
        if (!k || !v) {
            free(k);
            free(v);
            return false;
        }
        idmap n = {k, v, nc, 0};
        for (size_t i = 0; i < m->cap; i++)
            if (m->vals[i] && m->vals[i] != TOMB) idmap_put(&n, m->keys[i], m->vals[i]);
        free(m->keys);
        free(m->vals);
        *m = n;
    }
    size_t i = hash64(id) & (m->cap - 1);
    while (m->vals[i] && m->vals[i] != TOMB)
        i = (i + 1) & (m->cap - 1);
    m->keys[i] = id;
    m->vals[i] = r;
    m->used++;
    return true;
}

static void idmap_del(idmap *m, uint64_t id) {
    if (!m->cap) return;
    for (size_t i = hash64(id) & (m->cap - 1), n = 0; n < m->cap; i = (i + 1) & (m->cap - 1), n++) {
        if (!m->vals[i]) return;
        if (m->vals[i] != TOMB && m->keys[i] == id) {
            m->vals[i] = TOMB; /* counts toward `used` until the next rehash */
            return;
        }
    }
}

/* ------------------------------------------------------------------------------------------ */
rw_engine_opts rw_engine_opts_default(void) {
    return (rw_engine_opts){
        .max_running = 256,
        .max_batch_tokens = 2048,
        .kv_block_size = 16,
        .kv_bytes = 0,
        .kv_fraction = 0.9,
        .max_seq_len = 0,
    };
}

const char *rw_finish_str(rw_finish f) {
    switch (f) {
    case RW_FINISH_NONE: return "running";
    case RW_FINISH_LENGTH: return "length";
    case RW_FINISH_STOP: return "stop";
    case RW_FINISH_ABORT: return "abort";
    }
    return "invalid";
}

void rw_output_free(rw_output *o) {
    if (!o) return;
    free(o->tokens);
    free(o->logprobs);
    free(o->top_ids);
    free(o->top_logprobs);
    free(o->spans);
    free(o);
}

static void req_free(req *r) {
    if (!r) return;
    free(r->toks);
    free(r->lps);
    free(r->top_ids);
    free(r->top_lps);
    free(r->spans);
    free(r->blocks);
    free(r);
}

static rw_status kv_alloc_all(rw_engine *e, rw_err *err) {
    RW_CHECK(e->m->ops->kv_create(e->m, e->kvb.nblocks, e->o.kv_block_size, &e->kv, err));
    rw_kv_blocks_reset(&e->kvb);
    return RW_OK;
}

rw_status rw_engine_create(rw_model *m, const rw_engine_opts *o, rw_engine **out, rw_err *err) {
    if (!m || !out) RW_FAIL(err, RW_E_INVALID_ARG, "engine: NULL argument");
    rw_engine_opts opt = o ? *o : rw_engine_opts_default();
    if (opt.max_running < 1 || opt.max_batch_tokens < 1 || opt.kv_block_size < 1 ||
        opt.kv_fraction <= 0 || opt.kv_fraction > 1)
        RW_FAIL(err, RW_E_INVALID_ARG,
                "engine: max_running %d, max_batch_tokens %d, kv_block_size %d must be >= 1 and "
                "kv_fraction %g in (0, 1]",
                opt.max_running, opt.max_batch_tokens, opt.kv_block_size, opt.kv_fraction);
    if (opt.max_seq_len <= 0) opt.max_seq_len = m->cfg.max_position;
    if (opt.max_seq_len <= 0) opt.max_seq_len = 4096;
    if (m->ops->reserve) RW_CHECK(m->ops->reserve(m, opt.max_batch_tokens, opt.max_running, err));
    size_t budget = opt.kv_bytes;
    if (budget == 0) RW_CHECK(m->ops->kv_budget(m, opt.kv_fraction, &budget, err));
    const size_t bb = m->ops->kv_block_bytes(m, opt.kv_block_size);
    const int64_t nb = (int64_t)(budget / bb);
    if (nb < 1)
        RW_FAIL(err, RW_E_OOM, "engine: KV budget of %zu bytes holds no block of %zu bytes", budget,
                bb);
    if (nb > INT32_MAX) RW_FAIL(err, RW_E_RANGE, "engine: %lld KV blocks", (long long)nb);
    rw_engine *e = calloc(1, sizeof *e);
    if (!e) RW_FAIL(err, RW_E_OOM, "engine");
    e->m = m;
    e->o = opt;
    rw_status st;
    RW_CHECKGOTO(rw_kv_blocks_init(&e->kvb, nb, opt.kv_block_size, err), st, fail);
    RW_CHECKGOTO(kv_alloc_all(e, err), st, fail);
    *out = e;
    return RW_OK;
fail:
    rw_kv_blocks_fini(&e->kvb);
    free(e);
    return st;
}

void rw_engine_destroy(rw_engine *e) {
    if (!e) return;
    for (int64_t i = e->whead; i < e->wtail; i++)
        req_free(e->waiting[i]);
    for (int i = 0; i < e->nrun; i++)
        req_free(e->running[i]);
    for (int64_t i = e->ohead; i < e->otail; i++)
        rw_output_free(e->outq[i]);
    if (e->kv) e->m->ops->kv_destroy(e->m, e->kv);
    free(e->waiting);
    free(e->running);
    free(e->outq);
    free(e->ids.keys);
    free(e->ids.vals);
    rw_kv_blocks_fini(&e->kvb);
    free(e->btok);
    free(e->bseq);
    free(e->sreq);
    free(e->sres);
    free(e->sreq_of);
    free(e);
}

/* ------------------------------------------------------------------------------------------ */
static bool push_waiting(rw_engine *e, req *r, bool front) {
    if (front && e->whead > 0) {
        e->waiting[--e->whead] = r;
        return true;
    }
    if (e->wtail - e->whead + 1 > e->wcap || (!front && e->wtail == e->wcap) || front) {
        /* recentre (one free slot at the front) and grow when needed */
        int64_t n = e->wtail - e->whead;
        int64_t nc = e->wcap < 64 ? 64 : e->wcap;
        while (n + 2 > nc)
            nc *= 2;
        if (n + 2 > nc / 2) nc *= 2;
        req **w = malloc(sizeof(req *) * (size_t)nc);
        if (!w) return false;
        const int64_t start = 1;
        if (n) memcpy(w + start, e->waiting + e->whead, sizeof(req *) * (size_t)n);
        free(e->waiting);
        e->waiting = w;
        e->wcap = nc;
        e->whead = start;
        e->wtail = start + n;
    }
    if (front)
        e->waiting[--e->whead] = r;
    else
        e->waiting[e->wtail++] = r;
    return true;
}

static void free_kv_of(rw_engine *e, req *r) {
    rw_kv_blocks_give(&e->kvb, r->blocks, r->nblocks);
    r->nblocks = 0;
    r->n_cached = 0;
}

/* Blocks needed so positions [0, upto) are covered. */
static int blocks_for(const rw_engine *e, int upto) {
    return rw_kv_blocks_for(&e->kvb, upto);
}

static bool take_blocks(rw_engine *e, req *r, int upto) {
    return rw_kv_blocks_take(&e->kvb, &r->blocks, &r->nblocks, &r->cap_blocks, upto);
}

static bool outq_push(rw_engine *e, rw_output *o) {
    if (e->otail == e->ocap) {
        const int64_t n = e->otail - e->ohead;
        if (e->ohead > 0 && n < e->ocap / 2) {
            memmove(e->outq, e->outq + e->ohead, sizeof(rw_output *) * (size_t)n);
        } else {
            const int64_t nc = e->ocap ? e->ocap * 2 : 64;
            rw_output **q = malloc(sizeof(rw_output *) * (size_t)nc);
            if (!q) return false;
            if (n) memcpy(q, e->outq + e->ohead, sizeof(rw_output *) * (size_t)n);
            free(e->outq);
            e->outq = q;
            e->ocap = nc;
        }
        e->ohead = 0;
        e->otail = n;
    }
    e->outq[e->otail++] = o;
    return true;
}

/* Moves a request's results into an output, queues it, and frees the request (its KV first). */
static rw_status retire(rw_engine *e, req *r, rw_finish why, rw_err *err) {
    free_kv_of(e, r);
    rw_output *o = calloc(1, sizeof *o);
    if (!o) RW_FAIL(err, RW_E_OOM, "engine output");
    const int n = r->ntok - r->n_prompt;
    o->id = r->id;
    o->n_prompt = r->n_prompt;
    o->n = n;
    o->tokens = malloc(sizeof(int32_t) * (size_t)(n ? n : 1));
    o->logprobs = malloc(sizeof(float) * (size_t)(n ? n : 1));
    if (o->tokens) memcpy(o->tokens, r->toks + r->n_prompt, sizeof(int32_t) * (size_t)n);
    if (o->logprobs) memcpy(o->logprobs, r->lps, sizeof(float) * (size_t)n);
    o->top_n = r->sp.top_logprobs;
    if (o->top_n) {
        o->top_ids = r->top_ids;
        o->top_logprobs = r->top_lps;
        r->top_ids = NULL;
        r->top_lps = NULL;
    }
    o->finish = why;
    o->n_spans = r->n_spans;
    o->spans = r->spans;
    r->spans = NULL;
    o->t_submit = r->t_submit;
    o->t_first = r->t_first;
    o->t_done = rw_now();
    idmap_del(&e->ids, r->id);
    req_free(r);
    if (!o->tokens || !o->logprobs || !outq_push(e, o)) {
        rw_output_free(o);
        RW_FAIL(err, RW_E_OOM, "engine output");
    }
    return RW_OK;
}

/* ------------------------------------------------------------------------------------------ */
static rw_status check_sampling(const rw_sampling *sp, rw_err *err) {
    if (!(sp->top_p > 0.0f && sp->top_p <= 1.0f))
        RW_FAIL(err, RW_E_INVALID_ARG, "sampling: top_p %g outside (0, 1]", sp->top_p);
    if (sp->top_k < 0) RW_FAIL(err, RW_E_INVALID_ARG, "sampling: top_k %d < 0", sp->top_k);
    if (!(sp->temperature >= 0.0f) || !isfinite(sp->temperature))
        RW_FAIL(err, RW_E_INVALID_ARG, "sampling: temperature %g", sp->temperature);
    if (sp->max_new_tokens < 1)
        RW_FAIL(err, RW_E_INVALID_ARG, "sampling: max_new_tokens %d < 1", sp->max_new_tokens);
    if (sp->n_stop < 0 || sp->n_stop > RW_MAX_STOP)
        RW_FAIL(err, RW_E_INVALID_ARG, "sampling: %d stop ids (at most %d)", sp->n_stop,
                RW_MAX_STOP);
    if (sp->top_logprobs < 0 || sp->top_logprobs > RW_MAX_TOP_LOGPROBS)
        RW_FAIL(err, RW_E_INVALID_ARG, "sampling: top_logprobs %d outside 0..%d", sp->top_logprobs,
                RW_MAX_TOP_LOGPROBS);
    return RW_OK;
}

rw_status rw_engine_add(rw_engine *e, uint64_t id, const int32_t *prompt, int n,
                        const rw_sampling *sp, rw_err *err) {
    if (!e || !prompt || !sp) RW_FAIL(err, RW_E_INVALID_ARG, "add: NULL argument");
    if (n < 1) RW_FAIL(err, RW_E_INVALID_ARG, "add %llu: empty prompt", (unsigned long long)id);
    RW_CHECK(check_sampling(sp, err));
    const int V = e->m->cfg.vocab_size;
    for (int i = 0; i < n; i++)
        if (prompt[i] < 0 || prompt[i] >= V)
            RW_FAIL(err, RW_E_RANGE, "add %llu: token %d at %d outside [0, %d)",
                    (unsigned long long)id, prompt[i], i, V);
    const int64_t total = (int64_t)n + sp->max_new_tokens;
    if (total > e->o.max_seq_len)
        RW_FAIL(err, RW_E_RANGE, "add %llu: prompt %d + max_new_tokens %d > max_seq_len %d",
                (unsigned long long)id, n, sp->max_new_tokens, e->o.max_seq_len);
    if ((total + e->o.kv_block_size - 1) / e->o.kv_block_size > e->kvb.nblocks)
        RW_FAIL(err, RW_E_RANGE, "add %llu: %lld tokens exceed the whole KV cache (%lld tokens)",
                (unsigned long long)id, (long long)total,
                (long long)e->kvb.nblocks * e->o.kv_block_size);
    if (idmap_get(&e->ids, id))
        RW_FAIL(err, RW_E_INVALID_ARG, "add: request id %llu already exists",
                (unsigned long long)id);
    req *r = calloc(1, sizeof *r);
    if (!r) RW_FAIL(err, RW_E_OOM, "request");
    r->id = id;
    r->sp = *sp;
    r->n_prompt = n;
    r->cap = (int)total;
    r->toks = malloc(sizeof(int32_t) * (size_t)total);
    r->lps = malloc(sizeof(float) * (size_t)sp->max_new_tokens);
    if (sp->top_logprobs) {
        r->top_ids = malloc(sizeof(int32_t) * (size_t)sp->max_new_tokens * sp->top_logprobs);
        r->top_lps = malloc(sizeof(float) * (size_t)sp->max_new_tokens * sp->top_logprobs);
    }
    if (!r->toks || !r->lps || (sp->top_logprobs && (!r->top_ids || !r->top_lps)) ||
        !idmap_put(&e->ids, id, r)) {
        req_free(r);
        RW_FAIL(err, RW_E_OOM, "request of %lld tokens", (long long)total);
    }
    memcpy(r->toks, prompt, sizeof(int32_t) * (size_t)n);
    r->ntok = n;
    r->t_submit = rw_now();
    if (!push_waiting(e, r, false)) {
        idmap_del(&e->ids, id);
        req_free(r);
        RW_FAIL(err, RW_E_OOM, "waiting queue");
    }
    return RW_OK;
}

static void remove_running(rw_engine *e, int i) {
    memmove(e->running + i, e->running + i + 1, sizeof(req *) * (size_t)(e->nrun - i - 1));
    e->nrun--;
}

rw_status rw_engine_abort(rw_engine *e, uint64_t id, rw_err *err) {
    req *r = idmap_get(&e->ids, id);
    if (!r) RW_FAIL(err, RW_E_NOT_FOUND, "abort: no request %llu", (unsigned long long)id);
    if (r->running) {
        for (int i = 0; i < e->nrun; i++)
            if (e->running[i] == r) {
                remove_running(e, i);
                break;
            }
    } else {
        for (int64_t i = e->whead; i < e->wtail; i++)
            if (e->waiting[i] == r) {
                memmove(e->waiting + i, e->waiting + i + 1,
                        sizeof(req *) * (size_t)(e->wtail - i - 1));
                e->wtail--;
                break;
            }
    }
    return retire(e, r, RW_FINISH_ABORT, err);
}

void rw_engine_abort_all(rw_engine *e) {
    while (e->nrun > 0) {
        req *r = e->running[e->nrun - 1];
        e->nrun--;
        retire(e, r, RW_FINISH_ABORT, NULL);
    }
    for (int64_t i = e->whead; i < e->wtail; i++)
        retire(e, e->waiting[i], RW_FINISH_ABORT, NULL);
    e->whead = e->wtail = 0;
}

/* Retracts the most recently admitted running request: drops its KV, requeues it first. */
static void preempt_newest(rw_engine *e) {
    req *r = e->running[e->nrun - 1];
    e->nrun--;
    free_kv_of(e, r);
    r->running = false;
    r->chunk = 0;
    push_waiting(e, r, true);
    e->preemptions++;
}

static rw_status ensure_step_scratch(rw_engine *e, int64_t ntok, int nseq, rw_err *err) {
    if (ntok > e->cap_btok) {
        int32_t *p = realloc(e->btok, sizeof(int32_t) * (size_t)ntok);
        if (!p) RW_FAIL(err, RW_E_OOM, "step tokens");
        e->btok = p;
        e->cap_btok = ntok;
    }
    if (nseq > e->cap_bseq) {
        rw_fwd_seq *s = realloc(e->bseq, sizeof *s * (size_t)nseq);
        if (s) e->bseq = s;
        rw_sample_req *q = realloc(e->sreq, sizeof *q * (size_t)nseq);
        if (q) e->sreq = q;
        rw_sample_res *r = realloc(e->sres, sizeof *r * (size_t)nseq);
        if (r) e->sres = r;
        req **o = realloc(e->sreq_of, sizeof *o * (size_t)nseq);
        if (o) e->sreq_of = o;
        if (!s || !q || !r || !o) RW_FAIL(err, RW_E_OOM, "step scratch");
        e->cap_bseq = nseq;
    }
    return RW_OK;
}

static bool is_stop(const req *r, int32_t tok) {
    for (int i = 0; i < r->sp.n_stop; i++)
        if (r->sp.stop_ids[i] == tok) return true;
    return false;
}

static bool add_span(req *r, uint64_t version, int idx) {
    if (r->n_spans > 0 && r->spans[r->n_spans - 1].version == version) {
        r->spans[r->n_spans - 1].end = idx + 1;
        return true;
    }
    if (r->n_spans == r->cap_spans) {
        const int nc = r->cap_spans ? r->cap_spans * 2 : 2;
        rw_version_span *s = realloc(r->spans, sizeof *s * (size_t)nc);
        if (!s) return false;
        r->spans = s;
        r->cap_spans = nc;
    }
    r->spans[r->n_spans++] = (rw_version_span){version, idx, idx + 1};
    return true;
}

rw_status rw_engine_step(rw_engine *e, rw_err *err) {
    if (!e) RW_FAIL(err, RW_E_INVALID_ARG, "step: NULL engine");
    if (e->paused || e->kv_released) return RW_OK;
    int budget = e->o.max_batch_tokens;
    const int bs = e->o.kv_block_size;
    for (int i = 0; i < e->nrun; i++)
        e->running[i]->chunk = 0;
    /* 1. decodes (one token each), oldest first; a decode that needs a block when none is free
     *    retracts the newest request (possibly itself) */
    for (int i = 0; i < e->nrun; i++) {
        req *r = e->running[i];
        if (r->ntok - r->n_cached != 1) continue;
        while (!take_blocks(e, r, r->ntok)) {
            const bool self = e->running[e->nrun - 1] == r;
            preempt_newest(e);
            if (self) break;
        }
        if (i >= e->nrun || e->running[i] != r) break; /* r itself was retracted */
        if (budget > 0) {
            r->chunk = 1;
            budget--;
        }
    }
    /* 2. prefills already running (chunked), in admission order; one that cannot get a block
     *    retracts newer requests, so the oldest request always makes progress */
    for (int i = 0; i < e->nrun && budget > 0; i++) {
        req *r = e->running[i];
        const int rem = r->ntok - r->n_cached;
        if (rem <= 1 || r->chunk) continue;
        int c = rem < budget ? rem : budget;
        int fit = (r->nblocks + (int)e->kvb.nfree) * bs - r->n_cached;
        while (fit < 1 && e->running[e->nrun - 1] != r) {
            preempt_newest(e);
            fit = (r->nblocks + (int)e->kvb.nfree) * bs - r->n_cached;
        }
        if (c > fit) c = fit;
        if (c < 1) continue;
        if (!take_blocks(e, r, r->n_cached + c)) RW_FAIL(err, RW_E_OOM, "block table");
        r->chunk = c;
        budget -= c;
    }
    /* 3. admit waiting requests in order while the token budget, the batch size and the KV cache
     *    allow: the whole remaining prompt must fit in the free blocks (so admitted prefills
     *    rarely need retraction), the first chunk takes its blocks now */
    while (budget > 0 && e->nrun < e->o.max_running && e->whead < e->wtail) {
        req *r = e->waiting[e->whead];
        const int rem = r->ntok - r->n_cached;
        if (blocks_for(e, r->ntok) - r->nblocks > e->kvb.nfree) break; /* head of line waits */
        const int c = rem < budget ? rem : budget;
        if (e->nrun == e->cap_run) {
            const int nc = e->cap_run ? e->cap_run * 2 : 64;
            req **p = realloc(e->running, sizeof(req *) * (size_t)nc);
            if (!p) RW_FAIL(err, RW_E_OOM, "running list");
            e->running = p;
            e->cap_run = nc;
        }
        if (!take_blocks(e, r, r->n_cached + c)) RW_FAIL(err, RW_E_OOM, "block table");
        e->whead++;
        r->running = true;
        r->chunk = c;
        e->running[e->nrun++] = r;
        budget -= c;
    }
    /* 4. the batch: every running request with a chunk */
    int64_t ntok = 0;
    int nseq = 0;
    for (int i = 0; i < e->nrun; i++)
        if (e->running[i]->chunk > 0) {
            ntok += e->running[i]->chunk;
            nseq++;
        }
    if (nseq == 0) return RW_OK;
    RW_CHECK(ensure_step_scratch(e, ntok, nseq, err));
    int s = 0, nlog = 0;
    int64_t t = 0;
    for (int i = 0; i < e->nrun; i++) {
        req *r = e->running[i];
        if (r->chunk == 0) continue;
        rw_fwd_seq *q = &e->bseq[s];
        q->tok0 = (int32_t)t;
        q->ntok = r->chunk;
        q->pos0 = r->n_cached;
        q->blocks = r->blocks;
        memcpy(e->btok + t, r->toks + r->n_cached, sizeof(int32_t) * (size_t)r->chunk);
        t += r->chunk;
        if (r->n_cached + r->chunk == r->ntok) {
            q->logits_row = nlog;
            e->sreq[nlog].sp = &r->sp;
            e->sreq[nlog].position = r->ntok;
            e->sreq[nlog].row = nlog;
            e->sreq_of[nlog] = r;
            nlog++;
        } else {
            q->logits_row = -1;
        }
        s++;
    }
    rw_fwd_batch b = {nseq, e->bseq, (int32_t)ntok, e->btok, nlog, false};
    RW_CHECK(e->m->ops->forward(e->m, e->kv, &b, err));
    if (nlog) RW_CHECK(e->m->ops->sample(e->m, nlog, e->sreq, e->sres, err));
    for (int i = 0; i < e->nrun; i++) {
        req *r = e->running[i];
        if (r->ntok - r->n_cached > 1) e->prompt_tokens += r->chunk; /* a prefill chunk */
        r->n_cached += r->chunk;
    }
    /* 5. append sampled tokens, retire finished requests */
    const double now = rw_now();
    for (int j = 0; j < nlog; j++) {
        req *r = e->sreq_of[j];
        const rw_sample_res *res = &e->sres[j];
        const int g = r->ntok - r->n_prompt; /* index of this generated token */
        r->toks[r->ntok++] = res->token;
        r->lps[g] = res->logprob;
        if (r->sp.top_logprobs) {
            memcpy(r->top_ids + (size_t)g * r->sp.top_logprobs, res->top_ids,
                   sizeof(int32_t) * (size_t)r->sp.top_logprobs);
            memcpy(r->top_lps + (size_t)g * r->sp.top_logprobs, res->top_lps,
                   sizeof(float) * (size_t)r->sp.top_logprobs);
        }
        if (!add_span(r, e->version, g)) RW_FAIL(err, RW_E_OOM, "version spans");
        if (g == 0) r->t_first = now;
        e->gen_tokens++;
    }
    for (int i = 0; i < e->nrun;) {
        req *r = e->running[i];
        const int g = r->ntok - r->n_prompt;
        rw_finish why = RW_FINISH_NONE;
        if (g > 0 && r->n_cached == r->ntok - 1) {
            if (is_stop(r, r->toks[r->ntok - 1]))
                why = RW_FINISH_STOP;
            else if (g >= r->sp.max_new_tokens || r->ntok >= e->o.max_seq_len)
                why = RW_FINISH_LENGTH;
        }
        if (why != RW_FINISH_NONE) {
            remove_running(e, i);
            RW_CHECK(retire(e, r, why, err));
        } else {
            i++;
        }
    }
    e->steps++;
    e->rate_i = (e->rate_i + 1) % 16;
    e->rate_t[e->rate_i] = now;
    e->rate_n[e->rate_i] = e->gen_tokens;
    return RW_OK;
}

bool rw_engine_idle(const rw_engine *e) {
    if (e->whead == e->wtail && e->nrun == 0) return true;
    return e->paused || e->kv_released;
}

rw_status rw_engine_run(rw_engine *e, rw_err *err) {
    while (!rw_engine_idle(e))
        RW_CHECK(rw_engine_step(e, err));
    return RW_OK;
}

rw_output *rw_engine_pop_output(rw_engine *e) {
    if (e->ohead == e->otail) return NULL;
    return e->outq[e->ohead++];
}

int rw_engine_progress(const rw_engine *e, uint64_t id) {
    const req *r = idmap_get(&e->ids, id);
    return r ? r->ntok - r->n_prompt : -1;
}

rw_status rw_engine_peek(const rw_engine *e, uint64_t id, int from, int32_t *tokens,
                         float *logprobs, int cap, int *n, rw_err *err) {
    *n = 0;
    const req *r = idmap_get(&e->ids, id);
    if (!r) RW_FAIL(err, RW_E_NOT_FOUND, "peek: no request %llu", (unsigned long long)id);
    const int g = r->ntok - r->n_prompt;
    if (from < 0 || from > g)
        RW_FAIL(err, RW_E_RANGE, "peek %llu: from %d outside [0, %d]", (unsigned long long)id, from,
                g);
    const int k = g - from < cap ? g - from : cap;
    if (k > 0) {
        memcpy(tokens, r->toks + r->n_prompt + from, sizeof(int32_t) * (size_t)k);
        if (logprobs) memcpy(logprobs, r->lps + from, sizeof(float) * (size_t)k);
    }
    *n = k > 0 ? k : 0;
    return RW_OK;
}

rw_status rw_engine_pause(rw_engine *e, rw_pause_mode mode, rw_err *err) {
    switch (mode) {
    case RW_PAUSE_ABORT: rw_engine_abort_all(e); break;
    case RW_PAUSE_RETRACT:
        /* newest first to the queue front, so the queue keeps admission order */
        while (e->nrun > 0)
            preempt_newest(e);
        break;
    case RW_PAUSE_IN_PLACE: break;
    default: RW_FAIL(err, RW_E_INVALID_ARG, "pause: unknown mode %d", (int)mode);
    }
    e->paused = true;
    return RW_OK;
}

rw_status rw_engine_resume(rw_engine *e, rw_err *err) {
    e->paused = false;
    return RW_OK;
}

bool rw_engine_paused(const rw_engine *e) {
    return e->paused;
}

static bool holds_kv(const rw_engine *e) {
    for (int i = 0; i < e->nrun; i++)
        if (e->running[i]->nblocks > 0) return true;
    return false;
}

rw_status rw_engine_flush_cache(rw_engine *e, rw_err *err) {
    if (holds_kv(e))
        RW_FAIL(err, RW_E_BUSY,
                "flush_cache: %d requests hold KV (pause with retract or abort first)", e->nrun);
    /* no prefix cache is kept: every block not held by a request is already free */
    return RW_OK;
}

rw_status rw_engine_release_kv(rw_engine *e, rw_err *err) {
    if (e->kv_released) return RW_OK;
    if (holds_kv(e))
        RW_FAIL(err, RW_E_BUSY,
                "release_kv: %d requests hold KV (pause with retract or abort first)", e->nrun);
    e->m->ops->kv_destroy(e->m, e->kv);
    e->kv = NULL;
    e->kv_released = true;
    return RW_OK;
}

rw_status rw_engine_resume_kv(rw_engine *e, rw_err *err) {
    if (!e->kv_released) return RW_OK;
    RW_CHECK(kv_alloc_all(e, err));
    e->kv_released = false;
    return RW_OK;
}

void rw_engine_set_weight_version(rw_engine *e, uint64_t version) {
    e->version = version;
}

void rw_engine_stats_get(const rw_engine *e, rw_engine_stats *out) {
    memset(out, 0, sizeof *out);
    out->waiting = (int)(e->wtail - e->whead);
    out->running = e->nrun;
    out->paused = e->paused;
    out->steps = e->steps;
    out->prompt_tokens = e->prompt_tokens;
    out->generated_tokens = e->gen_tokens;
    out->preemptions = e->preemptions;
    /* rate over the last (up to 16) steps */
    const int newest = e->rate_i, oldest = (e->rate_i + 1) % 16;
    const int o = e->rate_t[oldest] > 0 ? oldest : (e->steps > 0 ? 0 : newest);
    const double dt = e->rate_t[newest] - e->rate_t[o];
    if (dt > 0) out->gen_tokens_per_s = (double)(e->rate_n[newest] - e->rate_n[o]) / dt;
    out->kv_blocks_total = e->kvb.nblocks;
    out->kv_blocks_used = e->kv_released ? 0 : e->kvb.nblocks - e->kvb.nfree;
    out->kv_block_size = e->o.kv_block_size;
    out->kv_bytes = e->m->ops->kv_block_bytes(e->m, e->o.kv_block_size) * (size_t)e->kvb.nblocks;
    out->kv_released = e->kv_released;
    out->weight_version = e->version;
}
