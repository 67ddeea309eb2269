/* engine.c - the generation engine's public API and request bookkeeping: the request queue,
 * adding requests (plain, n samples of one prompt, scoring), abort, outputs, pause / resume
 * (abort, retract, in place), KV release, flush, weight-version stamps and stats. The scheduler
 * step itself (admission over the paged KV blocks, continuous batching, prefix reuse, sampling)
 * is engine_step.c; the KV blocks and the prefix cache are kv_blocks.c.
 *
 * Scheduling is deterministic (it depends only on the sequence of calls), so every TP rank that
 * receives the same calls runs the same batches. A request's tokens depend only on its prompt,
 * its sampling parameters and the weights: the uniform draw of each token comes from (seed,
 * position), and the backends are batch and chunk invariant, which also makes KV computed for
 * one request (a cached prefix, a sibling sample's prompt) bit-identical to the KV the request
 * would compute itself. */
#include <math.h>
#include <stdlib.h>

#include "engine_internal.h"

static req tomb_;
#define TOMB (&tomb_)

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
        .prefix_sharing = true,
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
    free(o->prompt_logprobs);
    free(o->routed_ids);
    free(o->routed_weights);
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
    free(r->plps);
    free(r->rids);
    free(r->rwts);
    free(r->follow);
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
    e->route_layers = m->cfg.num_layers;
    e->route_k = m->cfg.top_k;
    /* the backends size their logits and sampling buffers for at least max(max_running, 256)
     * rows (ops->reserve); score requests use rows up to that, generation one per request */
    e->max_rows = opt.max_running > 256 ? opt.max_running : 256;
    rw_status st;
    RW_CHECKGOTO(
        rw_kv_blocks_init(&e->kvb, nb, opt.kv_block_size, e->route_layers * e->route_k, err), st,
        fail);
    RW_CHECKGOTO(kv_alloc_all(e, err), st, fail);
    *out = e;
    return RW_OK;
fail:
    rw_kv_blocks_fini(&e->kvb);
    free(e);
    return st;
}

static void free_all_followers(req *r) {
    for (int i = 0; i < r->nfollow; i++)
        req_free(r->follow[i]);
    r->nfollow = 0;
}

void rw_engine_destroy(rw_engine *e) {
    if (!e) return;
    for (int64_t i = e->whead; i < e->wtail; i++) {
        free_all_followers(e->waiting[i]);
        req_free(e->waiting[i]);
    }
    for (int i = 0; i < e->nrun; i++) {
        free_all_followers(e->running[i]);
        req_free(e->running[i]);
    }
    for (int64_t i = e->ohead; i < e->otail; i++)
        rw_output_free(e->outq[i]);
    if (e->kv) e->m->ops->kv_destroy(e->m, e->kv);
    free(e->waiting);
    free(e->running);
    free(e->outq);
    free(e->ids.keys);
    free(e->ids.vals);
    rw_kv_blocks_fini(&e->kvb);
    void *scratch[] = {e->btok,     e->bseq,   e->sreq,   e->sres,   e->sreq_of,
                       e->sreq_pos, e->rt_ids, e->rt_wts, e->cp_src, e->cp_dst};
    for (size_t i = 0; i < sizeof scratch / sizeof scratch[0]; i++)
        free(scratch[i]);
    free(e);
}

/* ------------------------------------------------------------------------------------------ */
bool rw_eng_push_waiting(rw_engine *e, req *r, bool front) {
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

void rw_eng_free_kv(rw_engine *e, req *r) {
    rw_kv_blocks_give(&e->kvb, r->blocks, r->nblocks);
    r->nblocks = 0;
    r->n_cached = 0;
    r->n_reg = 0;
    r->reg_key = 0;
    r->kv_valid = true;
    r->decoding = false;
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

/* The routes of an output: token-major rows [0, n_cached) moved out of the request. */
static void retire_routes(rw_engine *e, req *r, rw_output *o) {
    if (!r->rec_routes) return;
    o->route_layers = e->route_layers;
    o->route_k = e->route_k;
    o->n_routed = r->rids ? r->n_cached : 0;
    o->routed_ids = r->rids;
    r->rids = NULL;
    if (r->rec_wts) {
        o->routed_weights = r->rwts;
        r->rwts = NULL;
    }
}

rw_status rw_eng_retire(rw_engine *e, req *r, rw_finish why, rw_err *err) {
    rw_output *o = calloc(1, sizeof *o);
    if (o) retire_routes(e, r, o); /* before the KV: n_cached is the routed rows */
    rw_eng_free_kv(e, r);
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
    o->prompt_logprobs = r->plps;
    r->plps = NULL;
    o->n_reused = r->n_reused;
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
static rw_status check_sampling(const rw_sampling *sp, bool score, rw_err *err) {
    if (!(sp->top_p > 0.0f && sp->top_p <= 1.0f))
        RW_FAIL(err, RW_E_INVALID_ARG, "sampling: top_p %g outside (0, 1]", sp->top_p);
    if (sp->top_k < 0) RW_FAIL(err, RW_E_INVALID_ARG, "sampling: top_k %d < 0", sp->top_k);
    if (!(sp->temperature >= 0.0f) || !isfinite(sp->temperature))
        RW_FAIL(err, RW_E_INVALID_ARG, "sampling: temperature %g", sp->temperature);
    if (!score && sp->max_new_tokens < 1)
        RW_FAIL(err, RW_E_INVALID_ARG, "sampling: max_new_tokens %d < 1", sp->max_new_tokens);
    if (sp->n_stop < 0 || sp->n_stop > RW_MAX_STOP)
        RW_FAIL(err, RW_E_INVALID_ARG, "sampling: %d stop ids (at most %d)", sp->n_stop,
                RW_MAX_STOP);
    if (sp->top_logprobs < 0 || sp->top_logprobs > RW_MAX_TOP_LOGPROBS)
        RW_FAIL(err, RW_E_INVALID_ARG, "sampling: top_logprobs %d outside 0..%d", sp->top_logprobs,
                RW_MAX_TOP_LOGPROBS);
    if (sp->logprob_mode != RW_LOGPROB_RAW && sp->logprob_mode != RW_LOGPROB_PROCESSED)
        RW_FAIL(err, RW_E_INVALID_ARG, "sampling: logprob_mode %d (0 raw, 1 processed)",
                sp->logprob_mode);
    return RW_OK;
}

/* A new request of `total` token slots holding tokens[0..n); NULL when out of memory. */
static req *req_new(uint64_t id, const int32_t *tokens, int n, int n_prompt, int64_t total,
                    const rw_sampling *sp, const rw_request_opts *o) {
    req *r = calloc(1, sizeof *r);
    if (!r) return NULL;
    r->id = id;
    r->sp = *sp;
    r->n_prompt = n_prompt;
    r->cap = (int)total;
    r->score = o->n_score > 0;
    r->prompt_lps = r->score && o->prompt_logprobs;
    r->rec_routes = o->routed_experts;
    r->rec_wts = o->routed_experts && o->routing_weights;
    r->kv_valid = true;
    const int gen = (int)(total - n_prompt);
    r->toks = malloc(sizeof(int32_t) * (size_t)total);
    r->lps = malloc(sizeof(float) * (size_t)(gen ? gen : 1));
    bool ok = r->toks && r->lps;
    if (sp->top_logprobs) {
        r->top_ids = malloc(sizeof(int32_t) * (size_t)gen * sp->top_logprobs);
        r->top_lps = malloc(sizeof(float) * (size_t)gen * sp->top_logprobs);
        ok = ok && r->top_ids && r->top_lps;
    }
    if (r->prompt_lps) {
        r->plps = malloc(sizeof(float) * (size_t)n_prompt);
        ok = ok && r->plps;
        if (r->plps) r->plps[0] = NAN;
    }
    if (!ok) {
        req_free(r);
        return NULL;
    }
    memcpy(r->toks, tokens, sizeof(int32_t) * (size_t)n);
    r->ntok = n;
    r->t_submit = rw_now();
    return r;
}

static void detach(rw_engine *e, req *f);

/* Forgets a request that was just queued (it holds nothing and has no output yet). */
static void drop_queued(rw_engine *e, req *r) {
    if (!r) return;
    if (r->leader) {
        detach(e, r);
    } else {
        for (int64_t i = e->wtail - 1; i >= e->whead; i--)
            if (e->waiting[i] == r) {
                memmove(e->waiting + i, e->waiting + i + 1,
                        sizeof(req *) * (size_t)(e->wtail - i - 1));
                e->wtail--;
                break;
            }
    }
    idmap_del(&e->ids, r->id);
    req_free(r);
}

rw_status rw_engine_add_ex(rw_engine *e, uint64_t id, const int32_t *tokens, int n,
                           const rw_sampling *sp, const rw_request_opts *opts, rw_err *err) {
    if (!e || !tokens || !sp) RW_FAIL(err, RW_E_INVALID_ARG, "add: NULL argument");
    const rw_request_opts none = {0};
    const rw_request_opts *o = opts ? opts : &none;
    const unsigned long long uid = (unsigned long long)id;
    if (n < 1) RW_FAIL(err, RW_E_INVALID_ARG, "add %llu: empty prompt", uid);
    const int ns = o->n_samples > 0 ? o->n_samples : 1;
    const bool score = o->n_score > 0;
    if (ns > 65536)
        RW_FAIL(err, RW_E_INVALID_ARG, "add %llu: n_samples %d outside 1..65536", uid, ns);
    if (o->n_score < 0 || o->n_score >= n)
        RW_FAIL(err, RW_E_INVALID_ARG,
                "add %llu: n_score %d outside [0, %d) (the prompt needs at least one token)", uid,
                o->n_score, n);
    if (score && ns > 1)
        RW_FAIL(err, RW_E_INVALID_ARG, "add %llu: n_samples %d with a score request", uid, ns);
    if (o->routing_weights && !o->routed_experts)
        RW_FAIL(err, RW_E_INVALID_ARG, "add %llu: routing_weights needs routed_experts", uid);
    if (o->prompt_logprobs && !score)
        RW_FAIL(err, RW_E_INVALID_ARG, "add %llu: prompt_logprobs is for score requests", uid);
    RW_CHECK(check_sampling(sp, score, err));
    const int V = e->m->cfg.vocab_size;
    for (int i = 0; i < n; i++)
        if (tokens[i] < 0 || tokens[i] >= V)
            RW_FAIL(err, RW_E_RANGE, "add %llu: token %d at %d outside [0, %d)", uid, tokens[i], i,
                    V);
    const int n_prompt = n - o->n_score;
    const int64_t total = score ? (int64_t)n : (int64_t)n + sp->max_new_tokens;
    if (total > e->o.max_seq_len)
        RW_FAIL(err, RW_E_RANGE, "add %llu: %s %d + %s %d > max_seq_len %d", uid, "prompt",
                n_prompt, score ? "continuation" : "max_new_tokens",
                score ? o->n_score : sp->max_new_tokens, e->o.max_seq_len);
    if ((total + e->o.kv_block_size - 1) / e->o.kv_block_size > e->kvb.nblocks)
        RW_FAIL(err, RW_E_RANGE, "add %llu: %lld tokens exceed the whole KV cache (%lld tokens)",
                uid, (long long)total, (long long)e->kvb.nblocks * e->o.kv_block_size);
    for (int i = 0; i < ns; i++) {
        if (idmap_get(&e->ids, id + (uint64_t)i))
            RW_FAIL(err, RW_E_INVALID_ARG, "add: request id %llu already exists",
                    (unsigned long long)(id + (uint64_t)i));
        if (o->sample_max_new && !score &&
            (o->sample_max_new[i] < 1 || o->sample_max_new[i] > sp->max_new_tokens))
            RW_FAIL(err, RW_E_INVALID_ARG, "add %llu: sample_max_new[%d] %d outside [1, %d]", uid,
                    i, o->sample_max_new[i], sp->max_new_tokens);
    }
    /* the samples: the first is queued; with sharing on the others wait attached to it */
    req *lead = NULL;
    for (int i = 0; i < ns; i++) {
        rw_sampling s = *sp;
        if (i) s.seed = sp->seed + (uint64_t)i;
        int64_t cap = total;
        if (o->sample_max_new && !score) {
            s.max_new_tokens = o->sample_max_new[i];
            cap = (int64_t)n + s.max_new_tokens;
        }
        req *r = req_new(id + (uint64_t)i, tokens, n, n_prompt, cap, &s, o);
        bool ok = r && idmap_put(&e->ids, r->id, r);
        if (ok && lead && e->o.prefix_sharing) {
            if (lead->nfollow == lead->cap_follow) {
                const int nc = lead->cap_follow ? 2 * lead->cap_follow : 4;
                req **f = realloc(lead->follow, sizeof *f * (size_t)nc);
                if (f) {
                    lead->follow = f;
                    lead->cap_follow = nc;
                }
            }
            ok = lead->nfollow < lead->cap_follow;
            if (ok) {
                r->leader = lead;
                lead->follow[lead->nfollow++] = r;
                e->nattached++;
            }
        } else if (ok) {
            ok = rw_eng_push_waiting(e, r, false);
        }
        if (!ok) {
            if (r) idmap_del(&e->ids, r->id);
            req_free(r);
            /* take back the samples already queued: the call adds all or nothing */
            for (int k = i - 1; k >= 0; k--)
                drop_queued(e, idmap_get(&e->ids, id + (uint64_t)k));
            RW_FAIL(err, RW_E_OOM, "request of %lld tokens", (long long)total);
        }
        if (!lead) lead = r;
    }
    return RW_OK;
}

rw_status rw_engine_add(rw_engine *e, uint64_t id, const int32_t *prompt, int n,
                        const rw_sampling *sp, rw_err *err) {
    return rw_engine_add_ex(e, id, prompt, n, sp, NULL, err);
}

void rw_eng_remove_running(rw_engine *e, int i) {
    memmove(e->running + i, e->running + i + 1, sizeof(req *) * (size_t)(e->nrun - i - 1));
    e->nrun--;
}

static void detach(rw_engine *e, req *f) {
    req *l = f->leader;
    for (int i = 0; i < l->nfollow; i++)
        if (l->follow[i] == f) {
            memmove(l->follow + i, l->follow + i + 1, sizeof(req *) * (size_t)(l->nfollow - i - 1));
            l->nfollow--;
            break;
        }
    f->leader = NULL;
    e->nattached--;
}

void rw_eng_release_followers(rw_engine *e, req *r) {
    /* newest first to the front keeps their order */
    while (r->nfollow > 0) {
        req *f = r->follow[r->nfollow - 1];
        detach(e, f);
        if (!rw_eng_push_waiting(e, f, true)) {
            /* cannot queue it: finish it (it holds nothing); the output says abort */
            rw_eng_retire(e, f, RW_FINISH_ABORT, NULL);
        }
    }
}

rw_status rw_engine_abort(rw_engine *e, uint64_t id, rw_err *err) {
    req *r = idmap_get(&e->ids, id);
    if (!r) RW_FAIL(err, RW_E_NOT_FOUND, "abort: no request %llu", (unsigned long long)id);
    if (r->leader) {
        detach(e, r);
    } else if (r->running) {
        for (int i = 0; i < e->nrun; i++)
            if (e->running[i] == r) {
                rw_eng_remove_running(e, i);
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
    if (r->nfollow) {
        /* its siblings run on their own: queued where it was (the front is close enough) */
        rw_eng_release_followers(e, r);
    }
    return rw_eng_retire(e, r, RW_FINISH_ABORT, err);
}

/* Retires r and every follower attached to it. */
static void retire_with_followers(rw_engine *e, req *r) {
    while (r->nfollow > 0) {
        req *f = r->follow[0];
        detach(e, f);
        rw_eng_retire(e, f, RW_FINISH_ABORT, NULL);
    }
    rw_eng_retire(e, r, RW_FINISH_ABORT, NULL);
}

void rw_engine_abort_all(rw_engine *e) {
    while (e->nrun > 0) {
        req *r = e->running[e->nrun - 1];
        e->nrun--;
        retire_with_followers(e, r);
    }
    for (int64_t i = e->whead; i < e->wtail; i++)
        retire_with_followers(e, e->waiting[i]);
    e->whead = e->wtail = 0;
}

void rw_eng_preempt_newest(rw_engine *e) {
    req *r = e->running[e->nrun - 1];
    e->nrun--;
    rw_eng_free_kv(e, r);
    r->running = false;
    r->chunk = 0;
    if (r->score) r->n_spans = 0; /* its logprobs are computed again */
    rw_eng_push_waiting(e, r, true);
    e->preemptions++;
}

rw_status rw_eng_run_append(rw_engine *e, req *r, rw_err *err) {
    if (e->nrun == e->cap_run) {
        const int nc = e->cap_run ? e->cap_run * 2 : 64;
        req **p = realloc(e->running, sizeof(req *) * (size_t)nc);
        if (!p) RW_FAIL(err, RW_E_OOM, "running list");
        e->running = p;
        e->cap_run = nc;
    }
    r->running = true;
    e->running[e->nrun++] = r;
    return RW_OK;
}

bool rw_eng_route_rows(rw_engine *e, req *r, int upto) {
    if (upto <= r->rcap) return true;
    int nc = r->rcap ? r->rcap : 64;
    while (nc < upto)
        nc *= 2;
    if (nc > r->cap) nc = r->cap;
    const size_t row = (size_t)e->route_layers * (size_t)e->route_k;
    uint16_t *ids = realloc(r->rids, sizeof(uint16_t) * row * (size_t)nc);
    if (!ids) return false;
    r->rids = ids;
    if (r->rec_wts) {
        float *w = realloc(r->rwts, sizeof(float) * row * (size_t)nc);
        if (!w) return false;
        r->rwts = w;
    }
    r->rcap = nc;
    return true;
}

bool rw_eng_add_span(req *r, uint64_t version, int idx) {
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
    if (!r) return -1;
    return r->score ? 0 : r->ntok - r->n_prompt;
}

rw_status rw_engine_peek(const rw_engine *e, uint64_t id, int from, int32_t *tokens,
                         float *logprobs, int cap, int *n, rw_err *err) {
    *n = 0;
    const req *r = idmap_get(&e->ids, id);
    if (!r) RW_FAIL(err, RW_E_NOT_FOUND, "peek: no request %llu", (unsigned long long)id);
    const int g = r->score ? 0 : r->ntok - r->n_prompt;
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
            rw_eng_preempt_newest(e);
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
    rw_kv_blocks_uncache_all(&e->kvb);
    return RW_OK;
}

rw_status rw_engine_release_kv(rw_engine *e, rw_err *err) {
    if (e->kv_released) return RW_OK;
    if (holds_kv(e))
        RW_FAIL(err, RW_E_BUSY,
                "release_kv: %d requests hold KV (pause with retract or abort first)", e->nrun);
    e->m->ops->kv_destroy(e->m, e->kv);
    e->kv = NULL;
    rw_kv_blocks_reset(&e->kvb); /* the cached blocks' bytes are gone */
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
    if (version != e->version) {
        /* KV of other weights is never reused: the cache empties, and what requests hold now
         * (frozen in place across an update) is never cached */
        rw_kv_blocks_uncache_all(&e->kvb);
        for (int i = 0; i < e->nrun; i++)
            if (e->running[i]->nblocks > 0) e->running[i]->kv_valid = false;
    }
    e->version = version;
}

void rw_engine_stats_get(const rw_engine *e, rw_engine_stats *out) {
    memset(out, 0, sizeof *out);
    out->waiting = (int)(e->wtail - e->whead) + e->nattached;
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
    out->kv_blocks_used = e->kv_released ? 0 : rw_kv_blocks_held(&e->kvb);
    out->kv_block_size = e->o.kv_block_size;
    out->kv_bytes = e->m->ops->kv_block_bytes(e->m, e->o.kv_block_size) * (size_t)e->kvb.nblocks;
    out->kv_released = e->kv_released;
    out->weight_version = e->version;
    out->kv_blocks_cached = e->kvb.ncached;
    out->kv_blocks_allocated = e->kvb.allocated;
    out->kv_blocks_evicted = e->kvb.evicted;
    out->prefix_hits = e->prefix_hits;
    out->prefix_tokens_saved = e->tokens_saved;
    out->forked_samples = e->forks;
    out->score_tokens = e->score_tokens;
    out->last_tokens = e->last_tokens;
    out->last_seqs = e->last_seqs;
    out->last_logits = e->last_logits;
    out->last_ctx = e->last_ctx;
    out->last_attn = e->last_attn;
    out->step_s = e->step_s;
    out->model_s = e->model_s;
}
