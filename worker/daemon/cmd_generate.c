/* cmd_generate.c - the generate command (batches of prompts, n samples each sharing their
 * prompt's KV, many commands in flight, streaming, routed experts) and its bookkeeping on rank 0:
 * requests added to every rank's engine, finished outputs collected into final replies stamped
 * with the weight versions that made them, partial replies for streaming commands; and the abort
 * command. The score command (cmd_rollout.c) shares the bookkeeping. */
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

void rw_srv_put_logprobs(rw_mw *w, const rw_output *o, bool top_only) {
    if (!top_only) {
        rw_mw_str(w, "logprobs");
        rw_mw_array(w, (uint32_t)o->n);
        for (int i = 0; i < o->n; i++)
            rw_srv_lp(w, o->logprobs[i]);
    }
    if (o->top_n <= 0) return;
    rw_mw_str(w, "top_logprobs");
    rw_mw_array(w, (uint32_t)o->n);
    for (int i = 0; i < o->n; i++) {
        rw_mw_array(w, (uint32_t)o->top_n);
        for (int j = 0; j < o->top_n; j++) {
            rw_mw_array(w, 2);
            rw_mw_i64(w, o->top_ids[(size_t)i * o->top_n + j]);
            rw_srv_lp(w, o->top_logprobs[(size_t)i * o->top_n + j]);
        }
    }
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
        rw_srv_metrics_request(&s->metrics, g->t_recv, o->t_first, o->t_done, o->n);
        if (g->done == g->n) {
            if (g->score)
                rw_srv_score_reply(s, g);
            else
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
                    rw_srv_lp(w, s->peek_lp[i]);
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

rw_status rw_srv_read_tokens(rw_server *s, const rw_mobj *p, const char *what, int *n,
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

rw_status rw_srv_read_dist(rw_mfields *f, rw_sampling *sp, rw_err *err) {
    uint64_t u;
    double d;
    RW_CHECK(rw_mfields_f64(f, "temperature", 0.0, &d, err));
    if (!(d >= 0 && d <= 1e6)) RW_FAIL(err, RW_E_RANGE, "args.temperature: %g outside [0, 1e6]", d);
    sp->temperature = (float)d;
    RW_CHECK(rw_mfields_f64(f, "top_p", 1.0, &d, err));
    if (!(d > 0 && d <= 1)) RW_FAIL(err, RW_E_RANGE, "args.top_p: %g outside (0, 1]", d);
    sp->top_p = (float)d;
    RW_CHECK(rw_mfields_u64(f, "top_k", 0, &u, err));
    if (u > (1u << 30)) RW_FAIL(err, RW_E_RANGE, "args.top_k: %" PRIu64 " too large", u);
    sp->top_k = (int)u;
    RW_CHECK(rw_mfields_u64(f, "top_logprobs", 0, &u, err));
    if (u > RW_MAX_TOP_LOGPROBS)
        RW_FAIL(err, RW_E_RANGE, "args.top_logprobs: %" PRIu64 " (at most %d)", u,
                RW_MAX_TOP_LOGPROBS);
    sp->top_logprobs = (int)u;
    return RW_OK;
}

/* Parses the sampling fields shared by every request of the command. */
static rw_status read_sampling(rw_mfields *f, rw_sampling *sp, rw_err *err) {
    *sp = rw_sampling_default();
    uint64_t u;
    RW_CHECK(rw_mfields_u64(f, "max_new_tokens", (uint64_t)sp->max_new_tokens, &u, err));
    if (u < 1 || u > (1u << 24))
        RW_FAIL(err, RW_E_RANGE, "args.max_new_tokens: %" PRIu64 " outside [1, 2^24]", u);
    sp->max_new_tokens = (int)u;
    RW_CHECK(rw_srv_read_dist(f, sp, err));
    RW_CHECK(rw_mfields_u64(f, "seed", 0, &sp->seed, err));
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

rw_gen *rw_srv_gen_new(rw_server *s, const rw_srv_call *c, int n, int per_prompt) {
    rw_gen *g = calloc(1, sizeof *g);
    if (!g) return NULL;
    g->outs = calloc((size_t)n, sizeof *g->outs);
    g->sent = calloc((size_t)n, sizeof *g->sent);
    if (!g->outs || !g->sent) {
        rw_srv_gen_free(g);
        return NULL;
    }
    g->n = n;
    g->per_prompt = per_prompt;
    g->base = s->next_eid;
    g->req_id = c->req->id;
    g->t_recv = rw_now();
    const void *peer = rw_zmq_msg_peer(c->zm, &g->peer_len);
    if (g->peer_len > sizeof g->peer) g->peer_len = sizeof g->peer;
    memcpy(g->peer, peer, g->peer_len);
    return g;
}

void rw_srv_relay_add(rw_server *s, uint64_t eid, const int32_t *tokens, int n,
                      const rw_sampling *sp, const rw_request_opts *ro) {
    if (!s->peers->n) return;
    rw_err pe;
    if (rw_op_add_ex_encode(s->w2, tokens, n, sp, ro, &pe) != RW_OK) {
        RW_LOGE("add: %s", pe.msg);
        s->fatal = s->shutdown = true;
        return;
    }
    const void *pl;
    size_t plen;
    rw_mw_finish(s->w2, &pl, &plen, NULL);
    rw_srv_relay(s, RW_OP_ADD, eid, pl, plen);
}

rw_status rw_srv_gen_register(rw_server *s, rw_srv_call *c, rw_gen *g, rw_err *err) {
    s->next_eid += (uint64_t)g->n;
    s->n_requests += (uint64_t)g->n;
    if (s->ngens == s->capgens) {
        int nc = s->capgens ? 2 * s->capgens : 64;
        rw_gen **p = realloc(s->gens, sizeof *p * (size_t)nc);
        if (!p) {
            /* registered nowhere: take the requests back everywhere */
            for (int k = 0; k < g->n; k++) {
                rw_engine_abort(s->r->eng, g->base + (uint64_t)k, NULL);
                rw_srv_relay(s, RW_OP_ABORT, g->base + (uint64_t)k, NULL, 0);
            }
            rw_srv_collect_outputs(s);
            rw_srv_gen_free(g);
            RW_FAIL(err, RW_E_OOM, "%s: command table", c->req->cmd);
        }
        s->gens = p;
        s->capgens = nc;
    }
    g->zm = c->zm;
    s->gens[s->ngens++] = g;
    if (c->client) { /* released by rw_srv_gen_remove */
        c->client->requests += (uint64_t)g->n;
        c->client->tokens += g->tokens;
    }
    c->kept = true;
    return RW_OK;
}

typedef struct prompt_src prompt_src;
static rw_status generate(rw_server *s, rw_srv_call *c, prompt_src *ps, rw_err *err);

/* Where the prompts of a generate command come from: token ids (args.prompt / args.prompts) or
 * text (args.text, one string or an array) encoded with the worker's tokenizer. */
struct prompt_src {
    const rw_mobj *prompts, *prompt;
    rw_tok_ids *texts; /* [np] when the command gave text */
    size_t np;
};

static void prompt_src_free(prompt_src *ps) {
    if (ps->texts)
        for (size_t i = 0; i < ps->np; i++)
            rw_tok_ids_free(&ps->texts[i]);
    free(ps->texts);
}

/* Encodes args.text (a string or an array of strings) into ps->texts. */
static rw_status encode_texts(rw_server *s, const rw_mobj *text, prompt_src *ps, rw_err *err) {
    if (!s->tokenizer)
        RW_FAIL(err, RW_E_UNSUPPORTED,
                "generate: args.text needs a tokenizer (start rw-worker with --tokenizer DIR, or "
                "a --model directory that has tokenizer.json)");
    const bool one = rw_mobj_type(text) == RW_M_STR;
    if (!one && rw_mobj_type(text) != RW_M_ARRAY)
        RW_FAIL(err, RW_E_PROTOCOL, "args.text: expected a string or an array of strings, got %s",
                rw_mtype_str(rw_mobj_type(text)));
    ps->np = one ? 1 : rw_mobj_len(text);
    if (ps->np == 0) RW_FAIL(err, RW_E_INVALID_ARG, "args.text: empty batch");
    if (ps->np > MAX_PROMPTS_PER_CMD)
        RW_FAIL(err, RW_E_RANGE, "args.text: %zu prompts (at most %d)", ps->np,
                MAX_PROMPTS_PER_CMD);
    ps->texts = calloc(ps->np, sizeof *ps->texts);
    if (!ps->texts) RW_FAIL(err, RW_E_OOM, "generate: %zu texts", ps->np);
    for (size_t i = 0; i < ps->np; i++) {
        char what[48];
        snprintf(what, sizeof what, one ? "args.text" : "args.text[%zu]", i);
        const char *p;
        size_t n;
        RW_CHECK(rw_mobj_str(one ? text : rw_mobj_at(text, i), what, &p, &n, err));
        rw_status st = rw_tok_encode(s->tokenizer, p, n, 0, &ps->texts[i], err);
        if (st != RW_OK) {
            rw_err_prefix(err, "%s", what);
            return st;
        }
    }
    return RW_OK;
}

/* Prompt pi of the command into s->tok[0..*n). */
static rw_status load_prompt(rw_server *s, const prompt_src *ps, size_t pi, const char *what,
                             int *n, rw_err *err) {
    if (!ps->texts)
        return rw_srv_read_tokens(s, ps->prompts ? rw_mobj_at(ps->prompts, pi) : ps->prompt, what,
                                  n, err);
    const rw_tok_ids *v = &ps->texts[pi];
    if (v->n == 0) RW_FAIL(err, RW_E_INVALID_ARG, "%s: empty prompt (the text has no tokens)", what);
    RW_CHECK(grow_tokens(s, v->n, err));
    const int64_t V = s->r->cfg.vocab_size;
    for (size_t i = 0; i < v->n; i++) {
        if (v->ids[i] >= V)
            RW_FAIL(err, RW_E_RANGE,
                    "%s: the text encodes to token id %d (token %zu), outside the model's "
                    "vocabulary [0, %" PRId64 ")",
                    what, (int)v->ids[i], i, V);
        s->tok[i] = v->ids[i];
    }
    *n = (int)v->n;
    return RW_OK;
}

/* Reads which prompts the command gives (exactly one of prompt, prompts, text). */
static rw_status read_prompts(rw_server *s, rw_mfields *f, prompt_src *ps, rw_err *err) {
    ps->prompts = rw_mfields_get(f, "prompts");
    ps->prompt = rw_mfields_get(f, "prompt");
    const rw_mobj *text = rw_mfields_get(f, "text");
    if ((ps->prompts != NULL) + (ps->prompt != NULL) + (text != NULL) != 1)
        RW_FAIL(err, RW_E_PROTOCOL,
                "generate: give exactly one of args.prompt (one prompt), args.prompts (a batch) "
                "and args.text (a string or an array of strings)");
    if (text) return encode_texts(s, text, ps, err);
    if (ps->prompts && rw_mobj_type(ps->prompts) != RW_M_ARRAY)
        RW_FAIL(err, RW_E_PROTOCOL, "args.prompts: expected an array of prompts, got %s",
                rw_mtype_str(rw_mobj_type(ps->prompts)));
    ps->np = ps->prompts ? rw_mobj_len(ps->prompts) : 1;
    if (ps->np == 0) RW_FAIL(err, RW_E_INVALID_ARG, "args.prompts: empty batch");
    return RW_OK;
}

/* The per-client limits (--max-client-requests, --max-client-tokens): one client (a ZeroMQ
 * connection) may not queue more, so that it cannot take the worker's memory for itself. A
 * client that left before its message was read gets no work either. */
rw_status rw_srv_client_room(rw_server *s, const rw_srv_call *c, uint64_t requests,
                             uint64_t tokens, rw_err *err) {
    if (!s->clients) return RW_OK;
    char who[160];
    rw_client_rec *r = c->client;
    if (!r)
        RW_FAIL(err, RW_E_BUSY,
                "%s: the worker tracks %d clients with work in flight; no room for another",
                c->req->cmd, RW_CLIENTS_MAX);
    if (r->gone) RW_FAIL(err, RW_E_ABORTED, "%s: the client disconnected", c->req->cmd);
    const uint64_t max_r = s->o->max_client_requests, max_t = s->o->max_client_tokens;
    rw_status st = RW_OK;
    if (r->requests + requests > max_r)
        st = RW_ERR(err, RW_E_BUSY,
                    "%s: this client has %llu requests in flight and asks for %llu more: "
                    "past the per-client limit of %llu (--max-client-requests); wait for replies "
                    "or abort some",
                    c->req->cmd, (unsigned long long)r->requests, (unsigned long long)requests,
                    (unsigned long long)max_r);
    else if (r->tokens + tokens > max_t)
        st = RW_ERR(err, RW_E_BUSY,
                    "%s: this client has %llu tokens (prompt + max_new_tokens) in flight "
                    "and asks for %llu more: past the per-client limit of %llu "
                    "(--max-client-tokens); wait for replies or abort some",
                    c->req->cmd, (unsigned long long)r->tokens, (unsigned long long)tokens,
                    (unsigned long long)max_t);
    if (st != RW_OK)
        rw_oplog_limited(&s->rl_busy, "client_busy", "%s requests=%llu tokens=%llu",
                         rw_srv_peer_desc(c->zm, who, sizeof who), (unsigned long long)r->requests,
                         (unsigned long long)r->tokens);
    return st;
}

/* Handles generate. On success the command is registered (its message kept). */
rw_status rw_srv_generate(rw_server *s, rw_srv_call *c, rw_err *err) {
    prompt_src ps = {0};
    rw_status st = generate(s, c, &ps, err);
    prompt_src_free(&ps);
    return st;
}

static rw_status generate(rw_server *s, rw_srv_call *c, prompt_src *ps, rw_err *err) {
    const rw_request *req = c->req;
    RW_CHECK(gen_gate(s, err));
    rw_mfields f;
    RW_CHECK(rw_mfields_init(&f, req->args, "args", err));
    RW_CHECK(read_prompts(s, &f, ps, err));
    const size_t np = ps->np;
    uint64_t per;
    RW_CHECK(rw_mfields_u64(&f, "n", 1, &per, err));
    if (per < 1 || per > 1024)
        RW_FAIL(err, RW_E_RANGE, "args.n: %" PRIu64 " outside [1, 1024]", per);
    if (np * per > MAX_PROMPTS_PER_CMD)
        RW_FAIL(err, RW_E_RANGE, "generate: %zu prompts x n %" PRIu64 " requests (at most %d)", np,
                per, MAX_PROMPTS_PER_CMD);
    rw_sampling sp;
    RW_CHECK(read_sampling(&f, &sp, err));
    rw_request_opts ro;
    RW_CHECK(rw_srv_rollout_args(&f, &sp, &ro, err));
    bool stream, logprobs, return_text, skip_special;
    RW_CHECK(rw_mfields_bool(&f, "stream", false, &stream, err));
    RW_CHECK(rw_mfields_bool(&f, "logprobs", true, &logprobs, err));
    RW_CHECK(rw_mfields_bool(&f, "return_text", ps->texts != NULL, &return_text, err));
    RW_CHECK(rw_mfields_bool(&f, "skip_special_tokens", true, &skip_special, err));
    RW_CHECK(rw_mfields_done(&f, err));
    if (return_text && !s->tokenizer)
        RW_FAIL(err, RW_E_UNSUPPORTED,
                "generate: args.return_text needs a tokenizer (start rw-worker with --tokenizer "
                "DIR)");

    const int total = (int)(np * per);
    uint64_t tokens = 0; /* charged to the client while the command runs */
    for (size_t pi = 0; pi < np; pi++) {
        const size_t len = ps->texts ? ps->texts[pi].n
                                     : rw_mobj_len(ps->prompts ? rw_mobj_at(ps->prompts, pi)
                                                               : ps->prompt);
        tokens += ((uint64_t)len + (uint64_t)sp.max_new_tokens) * per;
    }
    RW_CHECK(rw_srv_client_room(s, c, (uint64_t)total, tokens, err));
    rw_gen *g = rw_srv_gen_new(s, c, total, (int)per);
    if (!g) RW_FAIL(err, RW_E_OOM, "generate: %d requests", total);
    g->tokens = tokens;
    g->stream = stream;
    g->logprobs = logprobs;
    g->routes = ro.routed_experts;
    g->weights = ro.routing_weights;
    g->return_text = return_text;
    g->skip_special = skip_special;

    /* add every prompt's n samples on rank 0 first (request k = prompt k / n, sample k % n,
     * seed + k: the engine gives sample i of a prompt its first seed + i); any refusal rolls the
     * command back before a follower heard of it */
    const rw_mobj *prompts = ps->prompts;
    rw_status st = RW_OK;
    size_t added = 0;
    const uint64_t seed0 = sp.seed;
    ro.n_samples = (int)per;
    for (size_t pi = 0; pi < np && st == RW_OK; pi++) {
        char what[48];
        if (ps->texts)
            snprintf(what, sizeof what, np > 1 ? "args.text[%zu]" : "args.text", pi);
        else
            snprintf(what, sizeof what, prompts ? "args.prompts[%zu]" : "args.prompt", pi);
        int n = 0;
        st = load_prompt(s, ps, pi, what, &n, err);
        if (st != RW_OK) break;
        sp.seed = seed0 + (uint64_t)(pi * per);
        st = rw_engine_add_ex(s->r->eng, g->base + pi * per, s->tok, n, &sp, &ro, err);
        if (st != RW_OK) {
            rw_err_prefix(err, "%s", what);
            break;
        }
        added++;
    }
    if (st != RW_OK) {
        for (size_t k = 0; k < added * per; k++)
            rw_engine_abort(s->r->eng, g->base + (uint64_t)k, NULL);
        rw_srv_collect_outputs(
            s); /* drops the rolled-back outputs: the command is not registered */
        rw_srv_gen_free(g);
        return st;
    }
    /* the same adds on every other rank */
    for (size_t pi = 0; pi < np && s->peers->n; pi++) {
        int n = 0;
        rw_err pe;
        if (load_prompt(s, ps, pi, "prompt", &n, &pe) != RW_OK)
            break; /* cannot happen: the same read succeeded above */
        sp.seed = seed0 + (uint64_t)(pi * per);
        rw_srv_relay_add(s, g->base + pi * per, s->tok, n, &sp, &ro);
    }
    return rw_srv_gen_register(s, c, g, err);
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
