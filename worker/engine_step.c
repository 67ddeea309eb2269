/* engine_step.c - one scheduler iteration of the engine (rw_engine_step): decodes, chunked
 * prefills and admissions into one forward pass under the token budget and the KV blocks; the
 * prefix cache at admission (the longest cached prefix of a request's tokens is reused, block by
 * block, and computation starts at the block boundary after it); registration of every block a
 * request has filled; the n samples of a prompt started from the first one's prefill (its full
 * blocks shared, its partly filled last block copied, their first tokens drawn from its logits
 * row); scoring rows; the router's choices copied out for the requests that asked; sampling; the
 * finish rules.
 *
 * Why outputs stay exact: a request reuses KV only when it is bit-identical to the KV it would
 * compute itself. The backends compute a token's KV from the token's own row of arithmetic (batch
 * and chunk invariance), so KV depends only on the tokens before it and the weights: a cached
 * block matches on the whole token chain and the weight version (kv_blocks.h), a sibling shares
 * exactly the prompt, and reuse ends on a block boundary with at least the last token (the one
 * whose logits are needed) computed by the request itself. */
#include <math.h>
#include <stdlib.h>

#include "engine_internal.h"

/* The first position a request must compute itself: the first whose logits it needs. */
static int first_needed(const req *r) {
    if (!r->score) return r->ntok - 1;
    return r->prompt_lps ? 0 : r->n_prompt - 1;
}

/* Logits rows the chunk [p0, p0 + c) of r needs, always a suffix of the chunk: generation its
 * last token when the chunk ends the tokens; a score every position from the first needed one
 * (the last position's row is not used: one spare row keeps the rows a suffix). */
static int rows_for(const req *r, int p0, int c) {
    const int end = p0 + c;
    if (!r->score) return end == r->ntok ? 1 : 0;
    const int a = first_needed(r) > p0 ? first_needed(r) : p0;
    return end > a ? end - a : 0;
}

/* The chunk length (<= c) whose rows fit rows_left. */
static int fit_rows(const req *r, int p0, int c, int rows_left) {
    if (rows_for(r, p0, c) <= rows_left) return c;
    if (!r->score) return c - 1; /* stop one short of the token that needs a row */
    const int a = first_needed(r) > p0 ? first_needed(r) : p0;
    return a + rows_left - p0;
}

static bool take_blocks(rw_engine *e, req *r, int upto) {
    return rw_kv_blocks_take(&e->kvb, &r->blocks, &r->nblocks, &r->cap_blocks, upto);
}

/* Copies the routes of cached block b into r's rows of chain position i. */
static void routes_from_block(rw_engine *e, req *r, int i, int32_t b) {
    const size_t row = (size_t)e->kvb.route_row, n = row * (size_t)e->o.kv_block_size;
    const size_t at = (size_t)i * n;
    memcpy(r->rids + at, e->kvb.rids[b], sizeof(uint16_t) * n);
    if (r->rec_wts) memcpy(r->rwts + at, e->kvb.rwts[b], sizeof(float) * n);
}

bool rw_eng_admit_prefix(rw_engine *e, req *r) {
    const int bs = e->o.kv_block_size;
    int m = 0;
    uint64_t key = 0;
    const int maxb = e->o.prefix_sharing ? first_needed(r) / bs : 0;
    if (maxb > 0 && maxb > r->cap_blocks) {
        int32_t *nb = realloc(r->blocks, sizeof(int32_t) * (size_t)maxb);
        if (nb) {
            r->blocks = nb;
            r->cap_blocks = maxb;
        }
    }
    if (maxb > 0 && maxb <= r->cap_blocks)
        m = rw_kv_blocks_lookup(&e->kvb, e->version, r->toks, maxb, r->rec_routes, r->rec_wts,
                                r->blocks, &key);
    if (m > 0 && r->rec_routes && !rw_eng_route_rows(e, r, m * bs)) m = 0;
    /* the rest must fit what new blocks can come from (matched idle blocks are not available) */
    int64_t idle = 0;
    for (int i = 0; i < m; i++)
        idle += e->kvb.ref[r->blocks[i]] == 0;
    if (rw_kv_blocks_for(&e->kvb, r->ntok) - m > rw_kv_blocks_avail(&e->kvb) - idle) return false;
    for (int i = 0; i < m; i++) {
        rw_kv_blocks_hold(&e->kvb, r->blocks[i]);
        if (r->rec_routes) routes_from_block(e, r, i, r->blocks[i]);
    }
    r->nblocks = m;
    r->n_cached = m * bs;
    r->n_reg = m;
    r->reg_key = key;
    r->kv_version = e->version;
    r->kv_valid = true;
    if (m > 0) {
        const int saved = m * bs;
        e->prefix_hits++;
        e->tokens_saved += saved;
        const int p = saved < r->n_prompt ? saved : r->n_prompt;
        if (p > r->n_reused) r->n_reused = p;
    }
    return true;
}

/* Registers the blocks r has filled since the last step; a block equal to one already cached is
 * replaced by that one in r's table (the same bits), so duplicates are freed at once. */
static void register_blocks(rw_engine *e, req *r) {
    if (!e->o.prefix_sharing || !r->kv_valid || r->kv_version != e->version) return;
    const int bs = e->o.kv_block_size;
    const size_t rn = (size_t)e->kvb.route_row * (size_t)bs;
    const int full = r->n_cached / bs;
    while (r->n_reg < full) {
        const int i = r->n_reg;
        const int32_t b = r->blocks[i];
        const int32_t parent = i ? r->blocks[i - 1] : -1;
        uint64_t key;
        const int32_t got = rw_kv_blocks_register(
            &e->kvb, b, parent, r->reg_key, e->version, r->toks + (size_t)i * bs,
            r->rec_routes ? r->rids + (size_t)i * rn : NULL,
            r->rec_wts ? r->rwts + (size_t)i * rn : NULL, &key);
        if (got < 0) return; /* out of memory: stays uncached for now */
        if (got != b) {
            rw_kv_blocks_hold(&e->kvb, got);
            rw_kv_blocks_give(&e->kvb, &b, 1);
            r->blocks[i] = got;
        }
        r->reg_key = key;
        r->n_reg++;
    }
}

static rw_status ensure_scratch(rw_engine *e, int64_t ntok, int nseq, rw_err *err) {
    if (ntok > e->cap_btok) {
        int32_t *p = realloc(e->btok, sizeof(int32_t) * (size_t)ntok);
        if (!p) RW_FAIL(err, RW_E_OOM, "step tokens");
        e->btok = p;
        e->cap_btok = ntok;
    }
    if (nseq > e->cap_bseq) {
        rw_fwd_seq *s = realloc(e->bseq, sizeof *s * (size_t)nseq);
        if (!s) RW_FAIL(err, RW_E_OOM, "step scratch");
        e->bseq = s;
        e->cap_bseq = nseq;
    }
    const int ns = e->max_rows;
    if (ns > e->cap_sreq) {
        rw_sample_req *q = realloc(e->sreq, sizeof *q * (size_t)ns);
        if (q) e->sreq = q;
        rw_sample_res *r = realloc(e->sres, sizeof *r * (size_t)ns);
        if (r) e->sres = r;
        req **o = realloc(e->sreq_of, sizeof *o * (size_t)ns);
        if (o) e->sreq_of = o;
        int *p = realloc(e->sreq_pos, sizeof *p * (size_t)ns);
        if (p) e->sreq_pos = p;
        int32_t *cs = realloc(e->cp_src, sizeof *cs * (size_t)ns);
        if (cs) e->cp_src = cs;
        int32_t *cd = realloc(e->cp_dst, sizeof *cd * (size_t)ns);
        if (cd) e->cp_dst = cd;
        if (!q || !r || !o || !p || !cs || !cd) RW_FAIL(err, RW_E_OOM, "step scratch");
        e->cap_sreq = ns;
    }
    return RW_OK;
}

static bool is_stop(const req *r, int32_t tok) {
    for (int i = 0; i < r->sp.n_stop; i++)
        if (r->sp.stop_ids[i] == tok) return true;
    return false;
}

/* The router's choices of this step into the rows of the requests that record them. */
static rw_status fetch_routes(rw_engine *e, int64_t ntok, rw_err *err) {
    bool any = false, wts = false;
    for (int i = 0; i < e->nrun; i++) {
        const req *r = e->running[i];
        any |= r->chunk > 0 && r->rec_routes;
        wts |= r->chunk > 0 && r->rec_wts;
    }
    if (!any) return RW_OK;
    const int L = e->route_layers, K = e->route_k;
    const int64_t need = (int64_t)L * ntok * K;
    if (need > e->cap_rt) {
        int32_t *ids = realloc(e->rt_ids, sizeof(int32_t) * (size_t)need);
        if (ids) e->rt_ids = ids;
        float *w = realloc(e->rt_wts, sizeof(float) * (size_t)need);
        if (w) e->rt_wts = w;
        if (!ids || !w) RW_FAIL(err, RW_E_OOM, "routes of %lld tokens", (long long)ntok);
        e->cap_rt = need;
    }
    RW_CHECK(e->m->ops->routes(e->m, ntok, e->rt_ids, wts ? e->rt_wts : NULL, err));
    int64_t t = 0;
    for (int i = 0; i < e->nrun; i++) {
        req *r = e->running[i];
        if (r->chunk == 0) continue;
        const int64_t t0 = t;
        t += r->chunk;
        if (!r->rec_routes) continue;
        if (!rw_eng_route_rows(e, r, r->n_cached + r->chunk))
            RW_FAIL(err, RW_E_OOM, "routes of request %llu", (unsigned long long)r->id);
        for (int c = 0; c < r->chunk; c++) {
            const size_t row = (size_t)(r->n_cached + c) * (size_t)L * K;
            for (int l = 0; l < L; l++) {
                const size_t src = ((size_t)l * (size_t)ntok + (size_t)(t0 + c)) * K;
                for (int j = 0; j < K; j++) {
                    r->rids[row + (size_t)l * K + j] = (uint16_t)e->rt_ids[src + j];
                    if (r->rec_wts) r->rwts[row + (size_t)l * K + j] = e->rt_wts[src + j];
                }
            }
        }
    }
    return RW_OK;
}

/* Starts the followers of leader l, whose prefill just ended, from its KV and logits row: its
 * full blocks are shared, its partly filled last block copied (one pair per follower in
 * cp_src / cp_dst), a draw for each queued after *ns. Followers that do not fit (running slots,
 * sampling rows, one block each) go to the waiting queue and run on their own. */
static rw_status fork_followers(rw_engine *e, req *l, int *ns, int *ncp, rw_err *err) {
    const int bs = e->o.kv_block_size, P = l->ntok, full = P / bs;
    const bool part = P % bs != 0;
    while (l->nfollow > 0) {
        if (e->nrun >= e->o.max_running || *ns >= e->max_rows) break;
        if (part && rw_kv_blocks_avail(&e->kvb) < 1) break;
        req *f = l->follow[0];
        if (f->rec_routes && !rw_eng_route_rows(e, f, P)) break;
        const int want = full + (part ? 1 : 0);
        if (want > f->cap_blocks) {
            int32_t *nb = realloc(f->blocks, sizeof(int32_t) * (size_t)(want > 4 ? want : 4));
            if (!nb) break;
            f->blocks = nb;
            f->cap_blocks = want > 4 ? want : 4;
        }
        for (int i = 0; i < full; i++) {
            rw_kv_blocks_hold(&e->kvb, l->blocks[i]);
            f->blocks[i] = l->blocks[i];
        }
        f->nblocks = full;
        if (part) {
            if (!take_blocks(e, f, P)) RW_FAIL(err, RW_E_INTERNAL, "fork: block count");
            e->cp_src[*ncp] = l->blocks[full];
            e->cp_dst[*ncp] = f->blocks[full];
            (*ncp)++;
        }
        f->n_cached = P;
        f->n_reg = l->n_reg;
        f->reg_key = l->reg_key;
        f->kv_version = l->kv_version;
        f->kv_valid = l->kv_valid;
        f->n_reused = P;
        if (f->rec_routes) {
            const size_t n = (size_t)P * (size_t)e->kvb.route_row;
            memcpy(f->rids, l->rids, sizeof(uint16_t) * n);
            if (f->rec_wts) memcpy(f->rwts, l->rwts, sizeof(float) * n);
        }
        /* off the leader's list, into the batch */
        memmove(l->follow, l->follow + 1, sizeof(req *) * (size_t)(l->nfollow - 1));
        l->nfollow--;
        f->leader = NULL;
        e->nattached--;
        RW_CHECK(rw_eng_run_append(e, f, err));
        e->sreq[*ns] = (rw_sample_req){.sp = &f->sp, .position = P, .row = l->row0 + l->nrows - 1};
        e->sreq_of[*ns] = f;
        e->sreq_pos[*ns] = -1;
        (*ns)++;
        e->forks++;
        e->tokens_saved += P;
    }
    rw_eng_release_followers(e, l);
    return RW_OK;
}

/* Stores the results of the step's sampling requests. */
static rw_status apply_samples(rw_engine *e, int ns, rw_err *err) {
    const double now = rw_now();
    for (int j = 0; j < ns; j++) {
        req *r = e->sreq_of[j];
        const rw_sample_res *res = &e->sres[j];
        const int tn = r->sp.top_logprobs;
        const int pos = e->sreq_pos[j];
        if (pos >= 0) { /* a scored token */
            e->score_tokens++;
            if (pos < r->n_prompt) {
                r->plps[pos] = res->logprob;
                continue;
            }
            const int g = pos - r->n_prompt;
            r->lps[g] = res->logprob;
            if (tn) {
                memcpy(r->top_ids + (size_t)g * tn, res->top_ids, sizeof(int32_t) * (size_t)tn);
                memcpy(r->top_lps + (size_t)g * tn, res->top_lps, sizeof(float) * (size_t)tn);
            }
            if (!rw_eng_add_span(r, e->version, g)) RW_FAIL(err, RW_E_OOM, "version spans");
            continue;
        }
        const int g = r->ntok - r->n_prompt; /* index of this generated token */
        r->toks[r->ntok++] = res->token;
        r->lps[g] = res->logprob;
        if (tn) {
            memcpy(r->top_ids + (size_t)g * tn, res->top_ids, sizeof(int32_t) * (size_t)tn);
            memcpy(r->top_lps + (size_t)g * tn, res->top_lps, sizeof(float) * (size_t)tn);
        }
        if (!rw_eng_add_span(r, e->version, g)) RW_FAIL(err, RW_E_OOM, "version spans");
        if (g == 0) r->t_first = now;
        r->decoding = true;
        e->gen_tokens++;
    }
    return RW_OK;
}

/* Why r is done after this step (RW_FINISH_NONE: not yet). A generation that records routes
 * first runs its last token through the model (finishing). */
static rw_finish done_why(const rw_engine *e, req *r) {
    if (r->score) return r->n_cached == r->ntok ? RW_FINISH_LENGTH : RW_FINISH_NONE;
    if (r->finishing != RW_FINISH_NONE)
        return r->n_cached == r->ntok ? r->finishing : RW_FINISH_NONE;
    const int g = r->ntok - r->n_prompt;
    rw_finish why = RW_FINISH_NONE;
    if (g > 0 && r->n_cached == r->ntok - 1) {
        if (is_stop(r, r->toks[r->ntok - 1]))
            why = RW_FINISH_STOP;
        else if (g >= r->sp.max_new_tokens || r->ntok >= e->o.max_seq_len)
            why = RW_FINISH_LENGTH;
    }
    if (why != RW_FINISH_NONE && r->rec_routes) {
        r->finishing = why;
        return RW_FINISH_NONE;
    }
    return why;
}

rw_status rw_engine_step(rw_engine *e, rw_err *err) {
    if (!e) RW_FAIL(err, RW_E_INVALID_ARG, "step: NULL engine");
    if (e->paused || e->kv_released) return RW_OK;
    const double t_step = rw_now();
    int budget = e->o.max_batch_tokens, rows_left = e->max_rows;
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
            rw_eng_preempt_newest(e);
            if (self) break;
        }
        if (i >= e->nrun || e->running[i] != r) break; /* r itself was retracted */
        if (budget > 0 && rows_left >= rows_for(r, r->n_cached, 1)) {
            r->chunk = 1;
            budget--;
            rows_left -= rows_for(r, r->n_cached, 1);
        }
    }
    /* 2. prefills already running (chunked), in admission order; one that cannot get a block
     *    retracts newer requests, so the oldest request always makes progress */
    for (int i = 0; i < e->nrun && budget > 0; i++) {
        req *r = e->running[i];
        const int rem = r->ntok - r->n_cached;
        if (rem <= 1 || r->chunk) continue;
        int c = rem < budget ? rem : budget;
        int64_t fit = (r->nblocks + rw_kv_blocks_avail(&e->kvb)) * bs - r->n_cached;
        while (fit < 1 && e->running[e->nrun - 1] != r) {
            rw_eng_preempt_newest(e);
            fit = (r->nblocks + rw_kv_blocks_avail(&e->kvb)) * bs - r->n_cached;
        }
        if (c > fit) c = (int)fit;
        c = fit_rows(r, r->n_cached, c, rows_left);
        if (c < 1) continue;
        if (!take_blocks(e, r, r->n_cached + c)) RW_FAIL(err, RW_E_OOM, "block table");
        r->chunk = c;
        budget -= c;
        rows_left -= rows_for(r, r->n_cached, c);
    }
    /* 3. admit waiting requests in order while the token budget, the batch size and the KV cache
     *    allow: after the cached prefix is reused, the whole remaining prompt must fit in the
     *    available blocks (so admitted prefills rarely need retraction), the first chunk takes
     *    its blocks now */
    while (budget > 0 && rows_left > 0 && e->nrun < e->o.max_running && e->whead < e->wtail) {
        req *r = e->waiting[e->whead];
        if (!rw_eng_admit_prefix(e, r)) break; /* head of line waits */
        const int rem = r->ntok - r->n_cached;
        const int c = fit_rows(r, r->n_cached, rem < budget ? rem : budget, rows_left);
        if (c < 1) {
            rw_eng_free_kv(e, r);
            break;
        }
        if (!take_blocks(e, r, r->n_cached + c)) RW_FAIL(err, RW_E_OOM, "block table");
        e->whead++;
        RW_CHECK(rw_eng_run_append(e, r, err));
        r->chunk = c;
        budget -= c;
        rows_left -= rows_for(r, r->n_cached, c);
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
    RW_CHECK(ensure_scratch(e, ntok, nseq, err));
    int s = 0, nlog = 0;
    int64_t t = 0;
    for (int i = 0; i < e->nrun; i++) {
        req *r = e->running[i];
        r->nrows = 0;
        if (r->chunk == 0) continue;
        rw_fwd_seq *q = &e->bseq[s++];
        q->tok0 = (int32_t)t;
        q->ntok = r->chunk;
        q->pos0 = r->n_cached;
        q->blocks = r->blocks;
        memcpy(e->btok + t, r->toks + r->n_cached, sizeof(int32_t) * (size_t)r->chunk);
        t += r->chunk;
        const int rows = rows_for(r, r->n_cached, r->chunk);
        q->logits_row = rows ? nlog : -1;
        q->logits_n = rows;
        r->row0 = nlog;
        r->nrows = rows;
        nlog += rows;
    }
    rw_fwd_batch b = {nseq, e->bseq, (int32_t)ntok, e->btok, nlog, false};
    e->last_tokens = ntok;
    e->last_seqs = nseq;
    e->last_logits = nlog;
    e->last_ctx = e->last_attn = 0;
    for (int i = 0; i < nseq; i++) {
        const int64_t p0 = e->bseq[i].pos0, n = e->bseq[i].ntok;
        e->last_ctx += p0 + n;
        e->last_attn += n * p0 + n * (n + 1) / 2;
    }
    double t_model = rw_now();
    RW_CHECK(e->m->ops->forward(e->m, e->kv, &b, err));
    RW_CHECK(fetch_routes(e, ntok, err));
    e->model_s += rw_now() - t_model;
    const int nrun0 = e->nrun; /* forks append below */
    for (int i = 0; i < nrun0; i++) {
        req *r = e->running[i];
        if (r->chunk == 0) continue;
        /* every computed token but a decode's (the token the request sampled last step) */
        if (!(r->chunk == 1 && r->decoding)) e->prompt_tokens += r->chunk;
        r->n_cached += r->chunk;
        register_blocks(e, r);
    }
    /* 5. sampling requests: generation draws, scored tokens, then the forks of leaders whose
     *    prefill just ended */
    int ns = 0, ncp = 0;
    for (int i = 0; i < nrun0; i++) {
        req *r = e->running[i];
        if (r->chunk == 0 || r->nrows == 0) continue;
        if (!r->score) {
            if (r->n_cached != r->ntok || r->finishing != RW_FINISH_NONE) continue;
            e->sreq[ns] =
                (rw_sample_req){.sp = &r->sp, .position = r->ntok, .row = r->row0 + r->nrows - 1};
            e->sreq_of[ns] = r;
            e->sreq_pos[ns++] = -1;
            continue;
        }
        const int first = r->n_cached - r->nrows; /* position of the first row */
        for (int k = 0; k < r->nrows; k++) {
            const int pos = first + k;
            if (pos > r->ntok - 2) break;
            e->sreq[ns] = (rw_sample_req){.sp = &r->sp,
                                          .position = pos + 1,
                                          .row = r->row0 + k,
                                          .force = true,
                                          .token = r->toks[pos + 1]};
            e->sreq_of[ns] = r;
            e->sreq_pos[ns++] = pos + 1;
        }
    }
    for (int i = 0; i < nrun0; i++) {
        req *r = e->running[i];
        if (r->nfollow > 0 && r->chunk > 0 && r->nrows > 0 && r->n_cached == r->ntok &&
            r->ntok == r->n_prompt)
            RW_CHECK(fork_followers(e, r, &ns, &ncp, err));
    }
    t_model = rw_now();
    if (ncp) RW_CHECK(e->m->ops->kv_copy(e->m, e->kv, e->cp_src, e->cp_dst, ncp, err));
    if (ns) RW_CHECK(e->m->ops->sample(e->m, ns, e->sreq, e->sres, err));
    e->model_s += rw_now() - t_model;
    RW_CHECK(apply_samples(e, ns, err));
    /* 6. retire finished requests */
    for (int i = 0; i < e->nrun;) {
        req *r = e->running[i];
        const rw_finish why = done_why(e, r);
        if (why != RW_FINISH_NONE) {
            rw_eng_remove_running(e, i);
            RW_CHECK(rw_eng_retire(e, r, why, err));
        } else {
            i++;
        }
    }
    e->steps++;
    e->rate_i = (e->rate_i + 1) % 16;
    e->rate_t[e->rate_i] = rw_now();
    e->step_s += e->rate_t[e->rate_i] - t_step;
    e->rate_n[e->rate_i] = e->gen_tokens;
    return RW_OK;
}
