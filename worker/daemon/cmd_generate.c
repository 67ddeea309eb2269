/* cmd_generate.c - the generate command (batches of prompts, n samples each, many commands in
 * flight, streaming) and its bookkeeping on rank 0: requests added to every rank's engine, finished
 * outputs collected into final replies stamped with the weight versions that made them, partial
 * replies for streaming commands; and the abort command. */
#include "server_internal.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_PROMPTS_PER_CMD 65536 /* requests (prompts x n) in one generate command */

static rw_gen *gen_find(rw_server *s, uint64_t eid, int *pos) {
    int lo = 0, hi = s->ngens - 1, at = -1;
    while (lo <= hi) {
        int mid = (lo + hi) / 2;
        if (s->gens[mid]->base <= eid) {
            at = mid;
            lo = mid + 1;
        } else {
            hi = mid - 1;
        }
    }
    if (at < 0 || eid >= s->gens[at]->base + (uint64_t)s->gens[at]->n) return NULL;
    if (pos) *pos = at;
    return s->gens[at];
}

void rw_srv_gen_free(rw_gen *g) {
    if (!g) return;
    if (g->outs)
        for (int i = 0; i < g->n; i++)
            rw_output_free(g->outs[i]);
    free(g->outs);
    free(g->sent);
    rw_zmq_msg_free(g->zm);
    free(g);
}

int64_t rw_srv_requests_in_flight(const rw_server *s) {
    int64_t n = 0;
    for (int i = 0; i < s->ngens; i++)
        n += s->gens[i]->n - s->gens[i]->done;
    return n;
}

/* The head of a generate reply in s->w, up to its array of n outputs: {stream, outputs: [...]}. */
static rw_mw *gen_head(rw_server *s, const rw_gen *g, bool stream, uint32_t n) {
    rw_mw *w = s->w;
    rw_mw_reset(w);
    rw_mw_reply_ok(w, g->req_id);
    rw_mw_map(w, 2);
    rw_mw_kv_bool(w, "stream", stream);
    rw_mw_str(w, "outputs");
    rw_mw_array(w, n);
    return w;
}

void rw_srv_gen_remove(rw_server *s, int pos) {
    rw_gen *g = s->gens[pos];
    memmove(s->gens + pos, s->gens + pos + 1, sizeof(rw_gen *) * (size_t)(s->ngens - pos - 1));
    s->ngens--;
    /* its requests no longer count against its client's limits */
    rw_client_rec *c = rw_clients_find(s->clients, g->peer, g->peer_len);
    if (c) {
        c->requests -= (uint64_t)g->n <= c->requests ? (uint64_t)g->n : c->requests;
        c->tokens -= g->tokens <= c->tokens ? g->tokens : c->tokens;
    }
    rw_srv_gen_free(g);
}

/* Aborts the unfinished requests of command g on every rank (an abort gives back a request's KV
 * blocks at once); returns how many. Their outputs are collected by the caller. */
static int64_t abort_gen(rw_server *s, const rw_gen *g) {
    int64_t n = 0;
    for (int k = 0; k < g->n; k++) {
        if (g->outs[k]) continue;
        const uint64_t eid = g->base + (uint64_t)k;
        if (rw_engine_abort(s->r->eng, eid, NULL) == RW_OK) {
            rw_srv_relay(s, RW_OP_ABORT, eid, NULL, 0);
            n++;
        }
    }
    return n;
}

void rw_srv_client_gone(void *server, rw_client_rec *rec) {
    rw_server *s = server;
    int64_t n_req = 0, n_cmds = 0;
    for (int gi = 0; gi < s->ngens; gi++) {
        rw_gen *g = s->gens[gi];
        if (g->peer_len != rec->id_len || memcmp(g->peer, rec->id, rec->id_len)) continue;
        n_cmds++;
        n_req += abort_gen(s, g);
    }
    char id[40];
    rw_oplog("client_gone", "peer=%s commands=%lld requests_aborted=%lld",
             rw_oplog_hex(rec->id, rec->id_len, id, sizeof id), (long long)n_cmds,
             (long long)n_req);
    if (n_cmds) rw_srv_collect_outputs(s); /* their final replies go nowhere; counts released */
}

void rw_srv_collect_outputs(rw_server *s) {
    rw_output *o;
    while ((o = rw_engine_pop_output(s->r->eng))) {
        int pos;
        rw_gen *g = gen_find(s, o->id, &pos);
        if (!g || g->outs[o->id - g->base]) {
            rw_output_free(o); /* a request rolled back before it was registered */
            continue;
        }
        g->outs[o->id - g->base] = o;
        g->done++;
        s->n_finished++;
        if (g->done == g->n) {
            rw_srv_gen_final(s, g);
            rw_srv_gen_remove(s, pos);
        }
    }
}

void rw_srv_stream_partials(rw_server *s) {
    for (int gi = 0; gi < s->ngens; gi++) {
        rw_gen *g = s->gens[gi];
        if (!g->stream) continue;
        int nchunks = 0;
        for (int k = 0; k < g->n; k++) {
            if (g->outs[k]) continue;
            int p = rw_engine_progress(s->r->eng, g->base + (uint64_t)k);
            if (p > g->sent[k]) nchunks++;
        }
        if (!nchunks) continue;
        rw_mw *w = gen_head(s, g, true, (uint32_t)nchunks);
        for (int k = 0; k < g->n; k++) {
            if (g->outs[k]) continue;
            const uint64_t eid = g->base + (uint64_t)k;
            int p = rw_engine_progress(s->r->eng, eid);
            if (p <= g->sent[k]) continue;
            int want = p - g->sent[k];
            if ((size_t)want > s->peekcap) {
                int32_t *t = realloc(s->peek_tok, sizeof(int32_t) * (size_t)want);
                if (t) s->peek_tok = t;
                float *l = realloc(s->peek_lp, sizeof(float) * (size_t)want);
                if (l) s->peek_lp = l;
                if (!t || !l) return; /* try again after the next step */
                s->peekcap = (size_t)want;
            }
            int got = 0;
            rw_err e;
            if (rw_engine_peek(s->r->eng, eid, g->sent[k], s->peek_tok, s->peek_lp, want, &got,
                               &e) != RW_OK)
                got = 0;
            rw_mw_map(w, g->logprobs ? 4 : 3);
            rw_mw_kv_u64(w, "index", (uint64_t)k);
            rw_mw_kv_u64(w, "offset", (uint64_t)g->sent[k]);
            rw_mw_str(w, "tokens");
            rw_mw_array(w, (uint32_t)got);
            for (int i = 0; i < got; i++)
                rw_mw_i64(w, s->peek_tok[i]);
            if (g->logprobs) {
                rw_mw_str(w, "logprobs");
                rw_mw_array(w, (uint32_t)got);
                for (int i = 0; i < got; i++)
                    rw_mw_f64(w, s->peek_lp[i]);
            }
            g->sent[k] += got;
        }
        rw_srv_send(s, g->zm, w, NULL);
    }
}

void rw_srv_abort_everything(rw_server *s) {
    rw_engine_abort_all(s->r->eng);
    rw_srv_relay(s, RW_OP_ABORT_ALL, 0, NULL, 0);
    rw_srv_collect_outputs(s);
}

/* ------------------------------------------------------------------------------------------ */
/* generate                                                                                     */
/* ------------------------------------------------------------------------------------------ */
static rw_status grow_tokens(rw_server *s, size_t n, rw_err *err) {
    if (n <= s->tmpcap) return RW_OK;
    int64_t *a = realloc(s->tmp, sizeof *a * n);
    if (a) s->tmp = a;
    int32_t *b = realloc(s->tok, sizeof *b * n);
    if (b) s->tok = b;
    if (!a || !b) RW_FAIL(err, RW_E_OOM, "generate: prompt of %zu tokens", n);
    s->tmpcap = n;
    return RW_OK;
}

static rw_status read_prompt(rw_server *s, const rw_mobj *p, const char *what, int *n,
                             rw_err *err) {
    if (rw_mobj_type(p) != RW_M_ARRAY)
        RW_FAIL(err, RW_E_PROTOCOL, "%s: expected an array of token ids, got %s", what,
                rw_mtype_str(rw_mobj_type(p)));
    size_t len = rw_mobj_len(p);
    if (len == 0) RW_FAIL(err, RW_E_INVALID_ARG, "%s: empty prompt", what);
    if (len > (size_t)INT32_MAX) RW_FAIL(err, RW_E_RANGE, "%s: %zu tokens", what, len);
    RW_CHECK(grow_tokens(s, len, err));
    size_t got;
    const int64_t V = s->r->cfg.vocab_size;
    RW_CHECK(rw_mobj_i64_array(p, what, INT64_MIN, INT64_MAX, s->tmp, len, &got, err));
    for (size_t i = 0; i < got; i++) {
        if (s->tmp[i] < 0 || s->tmp[i] >= V)
            RW_FAIL(err, RW_E_RANGE, "%s[%zu]: token id %" PRId64 " outside [0, %" PRId64 ")", what,
                    i, s->tmp[i], V);
        s->tok[i] = (int32_t)s->tmp[i];
    }
    *n = (int)got;
    return RW_OK;
}

/* Parses the sampling fields shared by every request of the command. */
static rw_status read_sampling(rw_mfields *f, rw_sampling *sp, rw_err *err) {
    *sp = rw_sampling_default();
    uint64_t u;
    double d;
    RW_CHECK(rw_mfields_u64(f, "max_new_tokens", (uint64_t)sp->max_new_tokens, &u, err));
    if (u < 1 || u > (1u << 24))
        RW_FAIL(err, RW_E_RANGE, "args.max_new_tokens: %" PRIu64 " outside [1, 2^24]", u);
    sp->max_new_tokens = (int)u;
    RW_CHECK(rw_mfields_f64(f, "temperature", 0.0, &d, err));
    if (!(d >= 0 && d <= 1e6)) RW_FAIL(err, RW_E_RANGE, "args.temperature: %g outside [0, 1e6]", d);
    sp->temperature = (float)d;
    RW_CHECK(rw_mfields_f64(f, "top_p", 1.0, &d, err));
    if (!(d > 0 && d <= 1)) RW_FAIL(err, RW_E_RANGE, "args.top_p: %g outside (0, 1]", d);
    sp->top_p = (float)d;
    RW_CHECK(rw_mfields_u64(f, "top_k", 0, &u, err));
    if (u > (1u << 30)) RW_FAIL(err, RW_E_RANGE, "args.top_k: %" PRIu64 " too large", u);
    sp->top_k = (int)u;
    RW_CHECK(rw_mfields_u64(f, "seed", 0, &sp->seed, err));
    RW_CHECK(rw_mfields_u64(f, "top_logprobs", 0, &u, err));
    if (u > RW_MAX_TOP_LOGPROBS)
        RW_FAIL(err, RW_E_RANGE, "args.top_logprobs: %" PRIu64 " (at most %d)", u,
                RW_MAX_TOP_LOGPROBS);
    sp->top_logprobs = (int)u;
    const rw_mobj *stop = rw_mfields_get(f, "stop");
    if (stop) {
        int64_t ids[RW_MAX_STOP];
        size_t n;
        if (rw_mobj_type(stop) == RW_M_ARRAY && rw_mobj_len(stop) > RW_MAX_STOP)
            RW_FAIL(err, RW_E_RANGE, "args.stop: %zu stop ids (at most %d)", rw_mobj_len(stop),
                    RW_MAX_STOP);
        RW_CHECK(rw_mobj_i64_array(stop, "args.stop", 0, INT32_MAX, ids, RW_MAX_STOP, &n, err));
        sp->n_stop = (int)n;
        for (size_t i = 0; i < n; i++)
            sp->stop_ids[i] = (int32_t)ids[i];
    }
    return RW_OK;
}

/* Whether generation may be queued now (an open session only delays it). */
static rw_status gen_gate(const rw_server *s, rw_err *err) {
    if (s->r->weights_released)
        RW_FAIL(err, RW_E_STATE,
                "generate: the weights' memory is released (resume_memory, then push or reload "
                "the weights)");
    if (s->r->kv_released)
        RW_FAIL(err, RW_E_STATE, "generate: the KV cache's memory is released (resume_memory)");
    rw_err e;
    rw_status st = rw_sync_session_ready(s->r->sess, NULL, 0, &e);
    if (st == RW_E_WEIGHTS_INCOMPLETE || (st == RW_OK && s->followers_incomplete))
        RW_FAIL(err, RW_E_WEIGHTS_INCOMPLETE,
                "generate: the weights are incomplete (a failed or aborted update, a start "
                "without weights, or released memory); a full update or update_weights_from_disk "
                "must succeed first");
    return RW_OK;
}

/* The per-client limits (--max-client-requests, --max-client-tokens): one client (a ZeroMQ
 * connection) may not queue more, so that it cannot take the worker's memory for itself. A
 * client that left before its message was read gets no work either. */
static rw_status client_room(rw_server *s, const rw_srv_call *c, uint64_t requests, uint64_t tokens,
                             rw_err *err) {
    if (!s->clients) return RW_OK;
    char who[160];
    rw_client_rec *r = c->client;
    if (!r)
        RW_FAIL(err, RW_E_BUSY,
                "generate: the worker tracks %d clients with work in flight; no room for another",
                RW_CLIENTS_MAX);
    if (r->gone) RW_FAIL(err, RW_E_ABORTED, "generate: the client disconnected");
    const uint64_t max_r = s->o->max_client_requests, max_t = s->o->max_client_tokens;
    rw_status st = RW_OK;
    if (r->requests + requests > max_r)
        st = RW_ERR(err, RW_E_BUSY,
                    "generate: this client has %llu requests in flight and asks for %llu more: "
                    "past the per-client limit of %llu (--max-client-requests); wait for replies "
                    "or abort some",
                    (unsigned long long)r->requests, (unsigned long long)requests,
                    (unsigned long long)max_r);
    else if (r->tokens + tokens > max_t)
        st = RW_ERR(err, RW_E_BUSY,
                    "generate: this client has %llu tokens (prompt + max_new_tokens) in flight "
                    "and asks for %llu more: past the per-client limit of %llu "
                    "(--max-client-tokens); wait for replies or abort some",
                    (unsigned long long)r->tokens, (unsigned long long)tokens,
                    (unsigned long long)max_t);
    if (st != RW_OK)
        rw_oplog_limited(&s->rl_busy, "client_busy", "%s requests=%llu tokens=%llu",
                         rw_srv_peer_desc(c->zm, who, sizeof who), (unsigned long long)r->requests,
                         (unsigned long long)r->tokens);
    return st;
}

/* Handles generate. On success the command is registered (its message kept). */
rw_status rw_srv_generate(rw_server *s, rw_srv_call *c, rw_err *err) {
    const rw_request *req = c->req;
    rw_zmq_msg *zm = c->zm;
    RW_CHECK(gen_gate(s, err));
    rw_mfields f;
    RW_CHECK(rw_mfields_init(&f, req->args, "args", err));
    const rw_mobj *prompts = rw_mfields_get(&f, "prompts");
    const rw_mobj *prompt = rw_mfields_get(&f, "prompt");
    if (!prompts == !prompt)
        RW_FAIL(err, RW_E_PROTOCOL,
                "generate: give exactly one of args.prompt (one prompt) and "
                "args.prompts (a batch)");
    if (prompts && rw_mobj_type(prompts) != RW_M_ARRAY)
        RW_FAIL(err, RW_E_PROTOCOL, "args.prompts: expected an array of prompts, got %s",
                rw_mtype_str(rw_mobj_type(prompts)));
    size_t np = prompts ? rw_mobj_len(prompts) : 1;
    if (np == 0) RW_FAIL(err, RW_E_INVALID_ARG, "args.prompts: empty batch");
    uint64_t per;
    RW_CHECK(rw_mfields_u64(&f, "n", 1, &per, err));
    if (per < 1 || per > 1024)
        RW_FAIL(err, RW_E_RANGE, "args.n: %" PRIu64 " outside [1, 1024]", per);
    if (np * per > MAX_PROMPTS_PER_CMD)
        RW_FAIL(err, RW_E_RANGE, "generate: %zu prompts x n %" PRIu64 " requests (at most %d)", np,
                per, MAX_PROMPTS_PER_CMD);
    rw_sampling sp;
    RW_CHECK(read_sampling(&f, &sp, err));
    bool stream, logprobs;
    RW_CHECK(rw_mfields_bool(&f, "stream", false, &stream, err));
    RW_CHECK(rw_mfields_bool(&f, "logprobs", true, &logprobs, err));
    RW_CHECK(rw_mfields_done(&f, err));

    const int total = (int)(np * per);
    uint64_t tokens = 0;
    for (size_t pi = 0; pi < np; pi++)
        tokens += ((uint64_t)rw_mobj_len(prompts ? rw_mobj_at(prompts, pi) : prompt) +
                   (uint64_t)sp.max_new_tokens) *
                  per;
    RW_CHECK(client_room(s, c, (uint64_t)total, tokens, err));
    rw_gen *g = calloc(1, sizeof *g);
    if (!g) RW_FAIL(err, RW_E_OOM, "generate");
    g->outs = calloc((size_t)total, sizeof *g->outs);
    g->sent = calloc((size_t)total, sizeof *g->sent);
    if (!g->outs || !g->sent) {
        rw_srv_gen_free(g);
        RW_FAIL(err, RW_E_OOM, "generate: %d requests", total);
    }
    g->n = total;
    g->per_prompt = (int)per;
    g->base = s->next_eid;
    g->req_id = req->id;
    g->stream = stream;
    g->logprobs = logprobs;
    g->t_recv = rw_now();
    const void *peer = rw_zmq_msg_peer(zm, &g->peer_len);
    if (g->peer_len > sizeof g->peer) g->peer_len = sizeof g->peer;
    memcpy(g->peer, peer, g->peer_len);

    /* add every request on rank 0 first; any refusal rolls the command back before a follower
     * heard of it */
    rw_status st = RW_OK;
    int added = 0;
    const uint64_t seed0 = sp.seed;
    for (int k = 0; k < total && st == RW_OK; k++) {
        const size_t pi = (size_t)k / per;
        char what[48];
        snprintf(what, sizeof what, prompts ? "args.prompts[%zu]" : "args.prompt", pi);
        int n = 0;
        st = read_prompt(s, prompts ? rw_mobj_at(prompts, pi) : prompt, what, &n, err);
        if (st != RW_OK) break;
        sp.seed = seed0 + (uint64_t)k;
        st = rw_engine_add(s->r->eng, g->base + (uint64_t)k, s->tok, n, &sp, err);
        if (st != RW_OK) {
            rw_err_prefix(err, "%s", what);
            break;
        }
        added++;
    }
    if (st != RW_OK) {
        for (int k = 0; k < added; k++)
            rw_engine_abort(s->r->eng, g->base + (uint64_t)k, NULL);
        rw_srv_collect_outputs(
            s); /* drops the rolled-back outputs: the command is not registered */
        rw_srv_gen_free(g);
        return st;
    }
    /* the same adds on every other rank */
    for (int k = 0; k < total && s->peers->n; k++) {
        const size_t pi = (size_t)k / per;
        int n = 0;
        rw_err pe;
        if (read_prompt(s, prompts ? rw_mobj_at(prompts, pi) : prompt, "prompt", &n, &pe) != RW_OK)
            break; /* cannot happen: the same read succeeded above */
        sp.seed = seed0 + (uint64_t)k;
        if (rw_op_add_encode(s->w2, s->tok, n, &sp, &pe) != RW_OK) {
            RW_LOGE("generate: %s", pe.msg);
            s->fatal = s->shutdown = true;
            break;
        }
        const void *pl;
        size_t plen;
        rw_mw_finish(s->w2, &pl, &plen, NULL);
        rw_srv_relay(s, RW_OP_ADD, g->base + (uint64_t)k, pl, plen);
    }
    s->next_eid += (uint64_t)total;
    s->n_requests += (uint64_t)total;
    if (s->ngens == s->capgens) {
        int nc = s->capgens ? 2 * s->capgens : 64;
        rw_gen **p = realloc(s->gens, sizeof *p * (size_t)nc);
        if (!p) {
            /* registered nowhere: take the requests back everywhere */
            for (int k = 0; k < total; k++) {
                rw_engine_abort(s->r->eng, g->base + (uint64_t)k, NULL);
                rw_srv_relay(s, RW_OP_ABORT, g->base + (uint64_t)k, NULL, 0);
            }
            rw_srv_collect_outputs(s);
            rw_srv_gen_free(g);
            RW_FAIL(err, RW_E_OOM, "generate: command table");
        }
        s->gens = p;
        s->capgens = nc;
    }
    g->zm = zm;
    g->tokens = tokens;
    s->gens[s->ngens++] = g;
    if (c->client) {
        c->client->requests += (uint64_t)total;
        c->client->tokens += tokens;
    }
    c->kept = true;
    return RW_OK;
}

/* ------------------------------------------------------------------------------------------ */
/* abort                                                                                        */
/* ------------------------------------------------------------------------------------------ */
rw_status rw_srv_abort(rw_server *s, rw_srv_call *c, rw_err *err) {
    const rw_request *req = c->req;
    const rw_zmq_msg *zm = c->zm;
    rw_mfields f;
    RW_CHECK(rw_mfields_init(&f, req->args, "args", err));
    const rw_mobj *rid = rw_mfields_get(&f, "request_id");
    bool all;
    RW_CHECK(rw_mfields_bool(&f, "all", false, &all, err));
    RW_CHECK(rw_mfields_done(&f, err));
    if (!rid == !all)
        RW_FAIL(
            err, RW_E_PROTOCOL,
            "abort: give args.request_id (a generate command of this client) or args.all: true");
    int64_t n_aborted = 0, n_cmds = 0;
    if (all) {
        n_aborted = rw_srv_requests_in_flight(s);
        n_cmds = s->ngens;
        rw_srv_abort_everything(s);
    } else {
        uint64_t id;
        RW_CHECK(rw_mobj_u64(rid, "args.request_id", &id, err));
        size_t plen;
        const void *peer = rw_zmq_msg_peer(zm, &plen);
        for (int gi = 0; gi < s->ngens; gi++) {
            rw_gen *g = s->gens[gi];
            if (g->req_id != id || g->peer_len != plen || memcmp(g->peer, peer, plen)) continue;
            n_cmds++;
            n_aborted += abort_gen(s, g);
        }
        if (!n_cmds)
            RW_FAIL(err, RW_E_NOT_FOUND,
                    "abort: no generate command with id %" PRIu64 " from this client is in flight",
                    id);
        rw_srv_collect_outputs(s);
    }
    rw_mw_reset(s->w);
    rw_mw_reply_ok(s->w, req->id);
    rw_mw_map(s->w, 2);
    rw_mw_kv_i64(s->w, "aborted", n_aborted);
    rw_mw_kv_i64(s->w, "commands", n_cmds);
    return RW_OK;
}
