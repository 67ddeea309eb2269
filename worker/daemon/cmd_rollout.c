/* cmd_rollout.c - what RL trainers need from the daemon beyond plain generation: the options that
 * generate and score share (logprob_mode, routed experts), the data frame that carries routed
 * experts (bulk bytes never travel inside msgpack: docs/PROTOCOL.md 4.1), and the score command
 * (logprobs of given continuations, one prefill each, no sampling; answered through the same
 * bookkeeping as generate: cmd_generate.c). */
#include "server_internal.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_SCORES_PER_CMD 65536
/* Half the element count a client's decoder accepts in one message (msg.c). */
#define RW_SCORE_MAX_ELEMS (1u << 20)

rw_status rw_srv_rollout_args(rw_mfields *f, rw_sampling *sp, rw_request_opts *ro, rw_err *err) {
    memset(ro, 0, sizeof *ro);
    char mode[16];
    RW_CHECK(rw_mfields_str(f, "logprob_mode", "raw", mode, sizeof mode, err));
    if (!strcmp(mode, "raw"))
        sp->logprob_mode = RW_LOGPROB_RAW;
    else if (!strcmp(mode, "processed"))
        sp->logprob_mode = RW_LOGPROB_PROCESSED;
    else
        RW_FAIL(err, RW_E_INVALID_ARG, "args.logprob_mode: '%s' (raw or processed)", mode);
    RW_CHECK(rw_mfields_bool(f, "return_routed_experts", false, &ro->routed_experts, err));
    RW_CHECK(rw_mfields_bool(f, "return_routing_weights", false, &ro->routing_weights, err));
    if (ro->routing_weights && !ro->routed_experts)
        RW_FAIL(err, RW_E_INVALID_ARG,
                "args.return_routing_weights needs args.return_routed_experts: true");
    return RW_OK;
}

/* ------------------------------------------------------------------------------------------ */
/* Routed experts in the reply's data frame                                                     */
/* ------------------------------------------------------------------------------------------ */
static size_t id_bytes(const rw_server *s) {
    return s->r->cfg.num_experts <= 256 ? 1 : 2;
}

static size_t align8(size_t x) {
    return (x + 7) & ~(size_t)7;
}

rw_status rw_srv_routes_frame(const rw_server *s, const rw_gen *g, int k0, int k1, size_t *offs,
                              rw_sync_out_frame *of, rw_err *err) {
    of->data = NULL;
    of->len = 0;
    if (!g->routes || k0 >= k1) return RW_OK;
    const size_t eb = id_bytes(s);
    size_t at = 0;
    for (int k = k0; k < k1; k++) {
        const rw_output *o = g->outs[k];
        const size_t cells = (size_t)o->n_routed * o->route_layers * o->route_k;
        offs[2 * k] = at;
        at = align8(at + cells * eb);
        offs[2 * k + 1] = at;
        if (g->weights) at = align8(at + cells * sizeof(float));
    }
    uint8_t *buf = malloc(at ? at : 1);
    if (!buf) RW_FAIL(err, RW_E_OOM, "routes: %zu bytes", at);
    memset(buf, 0, at);
    for (int k = k0; k < k1; k++) {
        const rw_output *o = g->outs[k];
        const size_t cells = (size_t)o->n_routed * o->route_layers * o->route_k;
        if (!o->routed_ids) continue;
        uint8_t *ids = buf + offs[2 * k];
        if (eb == 1)
            for (size_t i = 0; i < cells; i++)
                ids[i] = (uint8_t)o->routed_ids[i];
        else
            memcpy(ids, o->routed_ids, cells * 2); /* uint16, little-endian hosts */
        if (g->weights && o->routed_weights)
            memcpy(buf + offs[2 * k + 1], o->routed_weights, cells * sizeof(float));
    }
    of->data = buf;
    of->len = at;
    return RW_OK;
}

int rw_srv_routes_nfields(const rw_gen *g) {
    return (g->routes ? 1 : 0) + (g->weights ? 1 : 0);
}

/* {offset, nbytes, shape: [tokens, layers, k], dtype} of one array in the frame. */
static void frame_array(rw_mw *w, const char *key, const rw_output *o, size_t off, size_t elem,
                        const char *dtype) {
    const size_t cells = (size_t)o->n_routed * o->route_layers * o->route_k;
    rw_mw_str(w, key);
    rw_mw_map(w, 4);
    rw_mw_kv_u64(w, "offset", off);
    rw_mw_kv_u64(w, "nbytes", cells * elem);
    rw_mw_str(w, "shape");
    rw_mw_array(w, 3);
    rw_mw_i64(w, o->n_routed);
    rw_mw_i64(w, o->route_layers);
    rw_mw_i64(w, o->route_k);
    rw_mw_kv_str(w, "dtype", dtype);
}

void rw_srv_routes_fields(rw_mw *w, const rw_server *s, const rw_gen *g, int k,
                          const size_t *offs) {
    if (!g->routes) return;
    const rw_output *o = g->outs[k];
    const size_t eb = id_bytes(s);
    frame_array(w, "routed_experts", o, offs[2 * k], eb, eb == 1 ? "u8" : "u16");
    if (g->weights) frame_array(w, "routing_weights", o, offs[2 * k + 1], sizeof(float), "f32");
}

/* ------------------------------------------------------------------------------------------ */
/* score                                                                                        */
/* ------------------------------------------------------------------------------------------ */
/* The i-th of `many` (or the single `one`), named for errors. */
static const rw_mobj *nth(const rw_mobj *many, const rw_mobj *one, size_t i, const char *many_name,
                          const char *one_name, char *what, size_t cap) {
    if (many) {
        snprintf(what, cap, "args.%s[%zu]", many_name, i);
        return rw_mobj_at(many, i);
    }
    snprintf(what, cap, "args.%s", one_name);
    return one;
}

/* prompt i followed by continuation i into *seq (grown); *np, *nc their lengths. */
static rw_status read_pair(rw_server *s, const rw_mobj *ps, const rw_mobj *p, const rw_mobj *cs,
                           const rw_mobj *cn, size_t i, int32_t **seq, size_t *cap, int *np,
                           int *nc, rw_err *err) {
    char what[48];
    const rw_mobj *po = nth(ps, p, i, "prompts", "prompt", what, sizeof what);
    RW_CHECK(rw_srv_read_tokens(s, po, what, np, err));
    const size_t need = (size_t)*np;
    if (need > *cap) {
        int32_t *q = realloc(*seq, sizeof(int32_t) * need);
        if (!q) RW_FAIL(err, RW_E_OOM, "score: %zu tokens", need);
        *seq = q;
        *cap = need;
    }
    memcpy(*seq, s->tok, sizeof(int32_t) * (size_t)*np);
    const rw_mobj *co = nth(cs, cn, i, "continuations", "continuation", what, sizeof what);
    RW_CHECK(rw_srv_read_tokens(s, co, what, nc, err));
    const size_t total = (size_t)*np + (size_t)*nc;
    if (total > (size_t)INT32_MAX) RW_FAIL(err, RW_E_RANGE, "%s: %zu tokens", what, total);
    if (total > *cap) {
        int32_t *q = realloc(*seq, sizeof(int32_t) * total);
        if (!q) RW_FAIL(err, RW_E_OOM, "score: %zu tokens", total);
        *seq = q;
        *cap = total;
    }
    memcpy(*seq + *np, s->tok, sizeof(int32_t) * (size_t)*nc);
    return RW_OK;
}

rw_status rw_srv_score(rw_server *s, rw_srv_call *c, rw_err *err) {
    const rw_request *req = c->req;
    if (s->r->weights_released || s->r->kv_released)
        RW_FAIL(err, RW_E_STATE, "score: the %s memory is released (resume_memory)",
                s->r->weights_released ? "weights'" : "KV cache's");
    rw_mfields f;
    RW_CHECK(rw_mfields_init(&f, req->args, "args", err));
    const rw_mobj *ps = rw_mfields_get(&f, "prompts"), *p = rw_mfields_get(&f, "prompt");
    const rw_mobj *cs = rw_mfields_get(&f, "continuations"),
                  *cn = rw_mfields_get(&f, "continuation");
    if (!ps == !p || !cs == !cn || !ps != !cs)
        RW_FAIL(err, RW_E_PROTOCOL,
                "score: give args.prompt with args.continuation (one pair) or args.prompts with "
                "args.continuations (a batch)");
    if (ps && (rw_mobj_type(ps) != RW_M_ARRAY || rw_mobj_type(cs) != RW_M_ARRAY))
        RW_FAIL(err, RW_E_PROTOCOL, "args.prompts / args.continuations: expected arrays");
    const size_t np = ps ? rw_mobj_len(ps) : 1;
    if (np == 0) RW_FAIL(err, RW_E_INVALID_ARG, "args.prompts: empty batch");
    if (ps && rw_mobj_len(cs) != np)
        RW_FAIL(err, RW_E_INVALID_ARG, "score: %zu prompts but %zu continuations", np,
                rw_mobj_len(cs));
    if (np > MAX_SCORES_PER_CMD)
        RW_FAIL(err, RW_E_RANGE, "score: %zu pairs (at most %d)", np, MAX_SCORES_PER_CMD);
    rw_sampling sp = rw_sampling_default();
    RW_CHECK(rw_srv_read_dist(&f, &sp, err));
    rw_request_opts ro;
    RW_CHECK(rw_srv_rollout_args(&f, &sp, &ro, err));
    RW_CHECK(rw_mfields_bool(&f, "prompt_logprobs", false, &ro.prompt_logprobs, err));
    RW_CHECK(rw_mfields_done(&f, err));
    /* the weights must be complete, as for generate */
    rw_err e;
    rw_status ready = rw_sync_session_ready(s->r->sess, NULL, 0, &e);
    if (ready == RW_E_WEIGHTS_INCOMPLETE || (ready == RW_OK && s->followers_incomplete))
        RW_FAIL(err, RW_E_WEIGHTS_INCOMPLETE,
                "score: the weights are incomplete; a full update or update_weights_from_disk "
                "must succeed first");

    /* the reply is one message: bounded here, before any work (docs/PROTOCOL.md 4.9), from
     * above per token - a continuation token's logprob and top pairs, a prompt token's logprob
     * (rw_srv_logprob_bound) - and per pair (its other fields) */
    uint64_t cont_b, cont_e, prompt_b, prompt_e;
    rw_srv_logprob_bound(true, (uint64_t)sp.top_logprobs, &cont_b, &cont_e);
    rw_srv_logprob_bound(ro.prompt_logprobs, 0, &prompt_b, &prompt_e);
    uint64_t tokens = 0, bytes = 64, elems = 8; /* tokens: charged to the client meanwhile */
    for (size_t i = 0; i < np; i++) {
        const uint64_t pl = rw_mobj_len(ps ? rw_mobj_at(ps, i) : p),
                       cl = rw_mobj_len(cs ? rw_mobj_at(cs, i) : cn);
        tokens += pl + cl;
        bytes += 640 + cl * cont_b + pl * prompt_b;
        elems += 40 + cl * cont_e + pl * prompt_e;
    }
    if (bytes > RW_MSG_MAX_BYTES || elems > RW_SCORE_MAX_ELEMS)
        RW_FAIL(err, RW_E_RANGE,
                "score: the reply could reach %" PRIu64 " bytes and %" PRIu64
                " elements, past one message (%u bytes, %u elements); split the pairs over "
                "several commands or ask for fewer top_logprobs / no prompt_logprobs",
                bytes, elems, (unsigned)RW_MSG_MAX_BYTES, (unsigned)RW_SCORE_MAX_ELEMS);
    RW_CHECK(rw_srv_client_room(s, c, (uint64_t)np, tokens, err));
    rw_gen *g = rw_srv_gen_new(s, c, (int)np, 1);
    if (!g) RW_FAIL(err, RW_E_OOM, "score: %zu pairs", np);
    g->tokens = tokens;
    g->score = true;
    g->logprobs = true;
    g->routes = ro.routed_experts;
    g->weights = ro.routing_weights;
    int32_t *seq = NULL;
    size_t cap = 0;
    rw_status st = RW_OK;
    size_t added = 0;
    for (size_t i = 0; i < np && st == RW_OK; i++) {
        int npl = 0, ncl = 0;
        st = read_pair(s, ps, p, cs, cn, i, &seq, &cap, &npl, &ncl, err);
        if (st != RW_OK) break;
        ro.n_score = ncl;
        st = rw_engine_add_ex(s->r->eng, g->base + i, seq, npl + ncl, &sp, &ro, err);
        if (st != RW_OK) {
            rw_err_prefix(err, ps ? "args.prompts[%zu]" : "args.prompt", i);
            break;
        }
        added++;
    }
    if (st != RW_OK) {
        for (size_t k = 0; k < added; k++)
            rw_engine_abort(s->r->eng, g->base + k, NULL);
        rw_srv_collect_outputs(s);
        rw_srv_gen_free(g);
        free(seq);
        return st;
    }
    for (size_t i = 0; i < np && s->peers->n; i++) {
        int npl = 0, ncl = 0;
        rw_err pe;
        if (read_pair(s, ps, p, cs, cn, i, &seq, &cap, &npl, &ncl, &pe) != RW_OK) break;
        ro.n_score = ncl;
        rw_srv_relay_add(s, g->base + i, seq, npl + ncl, &sp, &ro);
    }
    free(seq);
    return rw_srv_gen_register(s, c, g, err);
}

/* The final reply of a score command: per pair its continuation's logprobs (and the prompt's),
 * routes in the data frame as for generate. */
void rw_srv_score_reply(rw_server *s, rw_gen *g) {
    size_t *offs = g->routes ? calloc((size_t)g->n * 2, sizeof *offs) : NULL;
    rw_sync_out_frame of = {0};
    rw_err e;
    if (g->routes && (!offs || rw_srv_routes_frame(s, g, 0, g->n, offs, &of, &e) != RW_OK)) {
        rw_srv_reply_err(s, g->zm, g->req_id, RW_E_OOM, "score: out of memory for the routes");
        free(offs);
        return;
    }
    rw_mw *w = s->w;
    rw_mw_reset(w);
    rw_mw_reply_ok(w, g->req_id);
    rw_mw_map(w, 1);
    rw_mw_str(w, "outputs");
    rw_mw_array(w, (uint32_t)g->n);
    for (int k = 0; k < g->n; k++) {
        const rw_output *o = g->outs[k];
        const bool top = o->top_n > 0, plp = o->prompt_logprobs != NULL;
        rw_mw_map(w, 8 + (top ? 1 : 0) + (plp ? 1 : 0) + rw_srv_routes_nfields(g));
        rw_mw_kv_u64(w, "index", (uint64_t)k);
        rw_srv_put_logprobs(w, o, false);
        if (plp) { /* entry 0 (no token before it) is nil */
            rw_mw_str(w, "prompt_logprobs");
            rw_mw_array(w, (uint32_t)o->n_prompt);
            for (int i = 0; i < o->n_prompt; i++)
                rw_srv_lp(w, o->prompt_logprobs[i]);
        }
        rw_mw_kv_str(w, "finish", rw_finish_str(o->finish));
        rw_mw_kv_u64(w, "prompt_tokens", (uint64_t)o->n_prompt);
        rw_mw_kv_u64(w, "continuation_tokens", (uint64_t)o->n);
        rw_mw_kv_u64(w, "reused_tokens", (uint64_t)o->n_reused);
        const uint64_t last =
            o->n_spans ? o->spans[o->n_spans - 1].version : (s->ntags ? s->ntags - 1 : 0);
        rw_mw_kv_str(w, "weight_version", rw_srv_tag_of(s, last));
        rw_srv_routes_fields(w, s, g, k, offs);
        rw_mw_kv_f64(w, "total_s", o->t_done - g->t_recv);
    }
    rw_srv_send(s, g->zm, w, of.data ? &of : NULL);
    free(offs);
}
