/* http_sglang.c - the SGLang-compatible routes: POST /generate (input_ids or text,
 * sampling_params, return_logprob, streaming as server-sent events), GET /health,
 * GET /get_weight_version, GET /get_model_info, /flush_cache, /pause_generation,
 * /continue_generation, /update_weights_from_disk, /release_memory_occupation,
 * /resume_memory_occupation, /abort_request. Field names and reply shapes are SGLang's; rw adds
 * fields (weight_versions spans, its own status fields), never renames. Each route is one call
 * of the control protocol (docs/PROTOCOL.md section 6.2 maps them). */
#include "http_internal.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------------------------------------ */
/* POST /generate                                                                               */
/* ------------------------------------------------------------------------------------------ */
typedef struct sgl_gen {
    rw_hgen g;
    rw_tok_ids *prompts;
    size_t np;
    bool batch; /* a list input, or n > 1: the reply is a list */
    bool logprob, logprob_text;
    json_t *rids; /* the request's rid (string or list), or NULL */
    json_t *body; /* the request (stop strings point into it) */
    int64_t max_new;
} sgl_gen;

static void sgl_free(void *arg) {
    sgl_gen *q = arg;
    rw_hgen_free(&q->g);
    rw_hids_free(q->prompts, q->np);
    json_decref(q->rids);
    json_decref(q->body);
    free(q);
}

static json_t *rid_of(const sgl_gen *q, const rw_hreq *r, int k) {
    if (json_is_string(q->rids)) {
        if (!q->batch) return json_incref(q->rids);
        char b[320];
        snprintf(b, sizeof b, "%s-%d", json_string_value(q->rids), k);
        return json_string(b);
    }
    if (json_is_array(q->rids) &&
        json_is_string(json_array_get(q->rids, (size_t)k / (size_t)q->g.p.n)))
        return json_incref(json_array_get(q->rids, (size_t)k / (size_t)q->g.p.n));
    char b[64];
    if (q->batch)
        snprintf(b, sizeof b, "rw-%" PRIu64 "-%d", r->num, k);
    else
        snprintf(b, sizeof b, "rw-%" PRIu64, r->num);
    return json_string(b);
}

/* [[logprob, id, text or null], ...] of ids [0, n) of output k. */
static json_t *token_logprobs(const sgl_gen *q, const rw_hreq *r, int k, int n) {
    const rw_hgen_out *o = &q->g.out[k];
    json_t *a = json_array();
    for (int i = 0; i < n; i++)
        json_array_append_new(
            a, json_pack("[o, i, o]", rw_hj_logprob(o->lps[i]), (int)o->ids[i],
                         q->logprob_text ? rw_hgen_token_str(r->h, o->ids[i]) : json_null()));
    return a;
}

static json_t *finish_reason(const sgl_gen *q, int k, int n) {
    const rw_hgen_out *o = &q->g.out[k];
    if (!o->finish) return json_null();
    if (!strcmp(o->finish, "length"))
        return json_pack("{s:s, s:I}", "type", "length", "length", (json_int_t)q->max_new);
    if (!strcmp(o->finish, "stop")) {
        if (o->cut)
            return json_pack("{s:s, s:s}", "type", "stop", "matched",
                             q->g.p.stop_strs[o->matched_str]);
        return json_pack("{s:s, s:i}", "type", "stop", "matched", n ? (int)o->ids[n - 1] : -1);
    }
    return json_pack("{s:s, s:s}", "type", "abort", "message",
                     "aborted (abort, pause with mode abort, shutdown or a lost rank)");
}

/* One output object {text, output_ids, meta_info} (cumulative, as SGLang streams it too). */
static json_t *output_obj(const sgl_gen *q, const rw_hreq *r, int k, size_t text_end) {
    const rw_hgen_out *o = &q->g.out[k];
    const int n = rw_hgen_nids(&q->g, k);
    json_t *ids = json_array();
    for (int i = 0; i < n; i++)
        json_array_append_new(ids, json_integer(o->ids[i]));
    json_t *m = json_object();
    json_object_set_new(m, "id", rid_of(q, r, k));
    json_object_set_new(m, "finish_reason", finish_reason(q, k, n));
    json_object_set_new(m, "prompt_tokens", json_integer(o->prompt_tokens));
    json_object_set_new(m, "completion_tokens", json_integer(n));
    json_object_set_new(m, "cached_tokens", json_integer(0));
    if (o->final) {
        json_object_set(m, "weight_version", json_object_get(o->final, "weight_version"));
        /* SGLang's spans are {version, start, end}; rw's version_spans say begin */
        json_t *spans = json_array();
        size_t i;
        json_t *sp;
        json_array_foreach(json_object_get(o->final, "version_spans"), i, sp) {
            json_int_t b = json_integer_value(json_object_get(sp, "begin"));
            json_int_t e = json_integer_value(json_object_get(sp, "end"));
            if (b >= n && b > 0) break;
            json_array_append_new(spans, json_pack("{s:O, s:I, s:I}", "version",
                                                   json_object_get(sp, "version"), "start", b,
                                                   "end", e < n ? e : (json_int_t)n));
        }
        json_object_set_new(m, "weight_versions", spans);
        json_object_set(m, "first_token_s", json_object_get(o->final, "first_token_s"));
        json_object_set_new(m, "e2e_latency", json_real(rw_now() - q->g.t0));
    }
    if (q->logprob) {
        json_object_set_new(m, "output_token_logprobs", token_logprobs(q, r, k, n));
        if (o->top_n) {
            json_t *top = json_array();
            for (int i = 0; i < n; i++) {
                json_t *row = json_array();
                for (int t = 0; t < o->top_n; t++) {
                    const size_t at = (size_t)i * o->top_n + t;
                    json_array_append_new(
                        row,
                        json_pack("[o, i, o]", rw_hj_logprob(o->top_lps[at]), (int)o->top_ids[at],
                                  q->logprob_text ? rw_hgen_token_str(r->h, o->top_ids[at])
                                                  : json_null()));
                }
                json_array_append_new(top, row);
            }
            json_object_set_new(m, "output_top_logprobs", top);
        }
    }
    json_t *text = json_stringn(o->text.p ? o->text.p : "", text_end);
    return json_pack("{s:o, s:o, s:o}", "text", text ? text : json_string(""), "output_ids", ids,
                     "meta_info", m);
}

/* SSE events for every output that has news; the final events, then [DONE]. */
static bool sgl_pump(void *arg, rw_hreq *r, rw_tbuf *out) {
    sgl_gen *q = arg;
    for (;;) {
        for (int k = 0; k < q->g.nout; k++) {
            rw_hgen_out *o = &q->g.out[k];
            const size_t end = rw_hgen_avail(&q->g, k);
            const int n = rw_hgen_nids(&q->g, k);
            const bool fin = q->g.final;
            if (end == o->emitted && n == o->ids_emitted && !fin) continue;
            if (fin && o->ids_emitted < 0) continue; /* its final event went out */
            json_t *obj = output_obj(q, r, k, end);
            if (q->batch) json_object_set_new(obj, "index", json_integer(k));
            rw_sse_json(out, obj);
            o->emitted = end;
            o->ids_emitted = fin ? -1 : n;
        }
        if (q->g.final) {
            rw_sse_done(out);
            return false;
        }
        if (out->n) return true;
        rw_err e;
        rw_status st = rw_hgen_next(&q->g, &e);
        if (st != RW_OK) {
            if (!r->client_gone)
                rw_sse_json(out, json_pack("{s:{s:s, s:s}}", "error", "message", e.msg, "status",
                                           rw_status_str(st)));
            rw_sse_done(out);
            return false;
        }
    }
}

/* Reads the prompts: text (string or list) or input_ids (list or list of lists). */
static rw_status read_inputs(rw_hreq *r, const json_t *b, sgl_gen *q, rw_err *err) {
    const json_t *text = json_object_get(b, "text"), *ids = json_object_get(b, "input_ids");
    if (json_is_null(text)) text = NULL;
    if (json_is_null(ids)) ids = NULL;
    if (!text == !ids) RW_FAIL(err, RW_E_INVALID_ARG, "give exactly one of 'text' and 'input_ids'");
    if (text) {
        if (!r->h->o.tok)
            RW_FAIL(err, RW_E_UNSUPPORTED,
                    "'text' needs a tokenizer: start rw-worker with --tokenizer DIR (or send "
                    "input_ids)");
        const bool one = json_is_string(text);
        if (!one && !json_is_array(text))
            RW_FAIL(err, RW_E_INVALID_ARG, "text: expected a string or a list of strings");
        q->np = one ? 1 : json_array_size(text);
        q->batch = !one;
        if (!q->np) RW_FAIL(err, RW_E_INVALID_ARG, "text: an empty list");
        q->prompts = calloc(q->np, sizeof *q->prompts);
        if (!q->prompts) RW_FAIL(err, RW_E_OOM, "prompts");
        for (size_t i = 0; i < q->np; i++) {
            const json_t *s = one ? text : json_array_get(text, i);
            if (!json_is_string(s))
                RW_FAIL(err, RW_E_INVALID_ARG, "text[%zu]: expected a string", i);
            RW_CHECK(rw_tok_encode(r->h->o.tok, json_string_value(s), json_string_length(s), 0,
                                   &q->prompts[i], err));
            for (size_t j = 0; j < q->prompts[i].n; j++)
                if (q->prompts[i].ids[j] >= r->h->o.vocab_size)
                    RW_FAIL(err, RW_E_RANGE,
                            "text[%zu]: encodes to token id %d, outside the model's vocabulary [0, "
                            "%lld)",
                            i, (int)q->prompts[i].ids[j], (long long)r->h->o.vocab_size);
        }
        return RW_OK;
    }
    if (!json_is_array(ids) || !json_array_size(ids))
        RW_FAIL(err, RW_E_INVALID_ARG,
                "input_ids: expected a non-empty list of token ids or of lists");
    q->batch = json_is_array(json_array_get(ids, 0));
    q->np = q->batch ? json_array_size(ids) : 1;
    q->prompts = calloc(q->np, sizeof *q->prompts);
    if (!q->prompts) RW_FAIL(err, RW_E_OOM, "prompts");
    for (size_t i = 0; i < q->np; i++) {
        char what[48];
        snprintf(what, sizeof what, q->batch ? "input_ids[%zu]" : "input_ids", i);
        RW_CHECK(rw_hj_ids(q->batch ? json_array_get(ids, i) : ids, what, r->h->o.vocab_size,
                           &q->prompts[i], err));
    }
    return RW_OK;
}

/* sampling_params into p (SGLang's defaults: temperature 1, max_new_tokens 128). */
static rw_status read_sampling(rw_hreq *r, const json_t *sp, rw_hgen_params *p, sgl_gen *q,
                               rw_err *err) {
    // clang-format off
    static const char *const allowed[] = {
        "max_new_tokens", "temperature", "top_p", "top_k", "min_p", "stop", "stop_token_ids", "n",
        "ignore_eos", "skip_special_tokens", "sampling_seed", "seed", "frequency_penalty",
        "presence_penalty", "repetition_penalty", "min_new_tokens", "no_stop_trim",
        "spaces_between_special_tokens", "json_schema", "regex", "ebnf", "structural_tag",
        "custom_params", "stream_interval", "logit_bias", NULL};
    // clang-format on
    const char *W = "sampling_params";
    if (sp && !json_is_null(sp) && !json_is_object(sp))
        RW_FAIL(err, RW_E_INVALID_ARG, "sampling_params: expected an object");
    json_t *empty = json_object();
    if (!sp || json_is_null(sp)) sp = empty;
    rw_status st = rw_hj_only(sp, W, allowed, err);
    int64_t x = 0;
    double d;
    bool b = false;
    if (st == RW_OK)
        st = rw_hj_int(sp, W, "max_new_tokens", 128, 0, 1 << 24, &p->max_new_tokens, err);
    if (st == RW_OK && p->max_new_tokens == 0)
        st = rw_err_set(err, RW_E_RANGE, __FILE__, __LINE__,
                        "sampling_params.max_new_tokens: 0 (at least 1)");
    if (st == RW_OK) st = rw_hj_num(sp, W, "temperature", 1.0, 0, 1e6, &p->temperature, err);
    if (st == RW_OK) st = rw_hj_num(sp, W, "top_p", 1.0, 1e-9, 1, &p->top_p, err);
    if (st == RW_OK) st = rw_hj_int(sp, W, "top_k", -1, -1, 1 << 30, &x, err);
    p->top_k = x < 0 ? 0 : x;
    if (st == RW_OK) st = rw_hj_int(sp, W, "n", 1, 1, 1024, &x, err);
    p->n = (int)x;
    uint64_t seed = 0;
    if (st == RW_OK) st = rw_hj_int(sp, W, "sampling_seed", 0, 0, INT64_MAX, &x, err);
    seed = (uint64_t)x;
    if (st == RW_OK) st = rw_hj_int(sp, W, "seed", (int64_t)seed, 0, INT64_MAX, &x, err);
    p->seed = (uint64_t)x;
    if (st == RW_OK) st = rw_hj_bool(sp, W, "skip_special_tokens", true, &p->skip_special, err);
    bool ignore_eos = false;
    if (st == RW_OK) st = rw_hj_bool(sp, W, "ignore_eos", false, &ignore_eos, err);
    if (st == RW_OK)
        st = rw_hj_strs(json_object_get(sp, "stop"), "sampling_params.stop", p->stop_strs,
                        RW_HGEN_MAX_STOP_STR, &p->n_stop_strs, err);
    const json_t *sti = json_object_get(sp, "stop_token_ids");
    if (st == RW_OK && sti && !json_is_null(sti)) {
        rw_tok_ids v = {0};
        st = rw_hj_ids(sti, "sampling_params.stop_token_ids", INT32_MAX, &v, err);
        if (st == RW_OK && v.n > RW_MAX_STOP)
            st = rw_err_set(err, RW_E_RANGE, __FILE__, __LINE__,
                            "sampling_params.stop_token_ids: %zu ids (at most %d)", v.n,
                            RW_MAX_STOP);
        for (size_t i = 0; st == RW_OK && i < v.n; i++)
            p->stop_ids[p->n_stop++] = v.ids[i];
        rw_tok_ids_free(&v);
    }
    /* accepted at their defaults only: rw does not implement them */
    if (st == RW_OK) st = rw_hj_num(sp, W, "min_p", 0, 0, 0, &d, err);
    if (st == RW_OK) st = rw_hj_num(sp, W, "frequency_penalty", 0, 0, 0, &d, err);
    if (st == RW_OK) st = rw_hj_num(sp, W, "presence_penalty", 0, 0, 0, &d, err);
    if (st == RW_OK) st = rw_hj_num(sp, W, "repetition_penalty", 1, 1, 1, &d, err);
    if (st == RW_OK) st = rw_hj_int(sp, W, "min_new_tokens", 0, 0, 0, &x, err);
    if (st == RW_OK) st = rw_hj_bool(sp, W, "no_stop_trim", false, &b, err);
    if (st == RW_OK && b)
        st = rw_err_set(err, RW_E_UNSUPPORTED, __FILE__, __LINE__,
                        "sampling_params.no_stop_trim: only false");
    // clang-format off
    static const char *const nulls[] = {
        "json_schema", "regex", "ebnf", "structural_tag", "logit_bias", NULL};
    // clang-format on
    for (int i = 0; st == RW_OK && nulls[i]; i++) {
        const json_t *v = json_object_get(sp, nulls[i]);
        if (v && !json_is_null(v))
            st = rw_err_set(err, RW_E_UNSUPPORTED, __FILE__, __LINE__,
                            "sampling_params.%s: not supported by rw", nulls[i]);
    }
    json_decref(empty);
    RW_CHECK(st);
    for (int i = 0; !ignore_eos && i < r->h->o.n_eos && p->n_stop < RW_MAX_STOP; i++)
        p->stop_ids[p->n_stop++] = r->h->o.eos[i];
    q->max_new = p->max_new_tokens;
    if (p->n > 1) q->batch = true;
    return RW_OK;
}

static enum MHD_Result route_generate(rw_hreq *r) {
    // clang-format off
    static const char *const allowed[] = {
        "text", "input_ids", "sampling_params", "return_logprob", "top_logprobs_num", "stream",
        "rid", "logprob_start_len", "return_text_in_logprobs", "log_metrics", "lora_path",
        "image_data", "token_ids_logprob", "return_hidden_states", "custom_logit_processor",
        "input_embeds", "session_params", NULL};
    // clang-format on
    json_t *b = NULL;
    rw_err e;
    rw_status st = rw_hj_request(r, allowed, false, &b, &e);
    if (st != RW_OK) return rw_hreply_status(r, st, e.msg);
    sgl_gen *q = calloc(1, sizeof *q);
    if (!q) {
        json_decref(b);
        return rw_hreply_error(r, 503, "out of memory");
    }
    rw_hgen_params p = {0};
    bool stream = false;
    int64_t top = 0, x = 0;
    // clang-format off
    static const char *const nulls[] = {
        "lora_path", "image_data", "token_ids_logprob", "custom_logit_processor", "input_embeds",
        "session_params", NULL};
    // clang-format on
    for (int i = 0; st == RW_OK && nulls[i]; i++) {
        const json_t *v = json_object_get(b, nulls[i]);
        if (v && !json_is_null(v))
            st = rw_err_set(&e, RW_E_UNSUPPORTED, __FILE__, __LINE__, "%s: not supported by rw",
                            nulls[i]);
    }
    bool hidden = false;
    if (st == RW_OK) st = rw_hj_bool(b, "", "return_hidden_states", false, &hidden, &e);
    if (st == RW_OK && hidden)
        st = rw_err_set(&e, RW_E_UNSUPPORTED, __FILE__, __LINE__,
                        "return_hidden_states: not supported by rw");
    if (st == RW_OK) st = read_inputs(r, b, q, &e);
    if (st == RW_OK) st = read_sampling(r, json_object_get(b, "sampling_params"), &p, q, &e);
    if (st == RW_OK) st = rw_hj_bool(b, "", "return_logprob", false, &q->logprob, &e);
    if (st == RW_OK) st = rw_hj_int(b, "", "top_logprobs_num", 0, 0, RW_MAX_TOP_LOGPROBS, &top, &e);
    if (st == RW_OK) st = rw_hj_int(b, "", "logprob_start_len", -1, -1, INT32_MAX, &x, &e);
    if (st == RW_OK) st = rw_hj_bool(b, "", "return_text_in_logprobs", false, &q->logprob_text, &e);
    if (st == RW_OK) st = rw_hj_bool(b, "", "stream", false, &stream, &e);
    const json_t *rid = json_object_get(b, "rid");
    if (st == RW_OK && rid && !json_is_null(rid)) {
        if (!json_is_string(rid) && !json_is_array(rid))
            st = rw_err_set(&e, RW_E_INVALID_ARG, __FILE__, __LINE__,
                            "rid: expected a string or a list of strings");
        else
            q->rids = json_incref((json_t *)rid);
    }
    q->body = b;
    if (st != RW_OK) {
        sgl_free(q);
        return rw_hreply_status(r, st, e.msg);
    }
    p.prompts = q->prompts;
    p.np = q->np;
    p.logprobs = q->logprob;
    p.top_logprobs = q->logprob ? (int)top : 0;
    p.stream = stream || p.n_stop_strs > 0;
    st = rw_hgen_begin(&q->g, r, &p, stream, &e);
    if (st != RW_OK) {
        sgl_free(q);
        return rw_hreply_status(r, st, e.msg);
    }
    if (stream) return rw_hreply_stream(r, sgl_pump, sgl_free, q);
    json_t *res = q->batch ? json_array() : NULL;
    for (int k = 0; k < q->g.nout; k++) {
        json_t *o = output_obj(q, r, k, q->g.out[k].text.n);
        if (res)
            json_array_append_new(res, o);
        else
            res = o;
    }
    sgl_free(q);
    return rw_hreply_json(r, 200, res);
}

/* ------------------------------------------------------------------------------------------ */
/* Control routes                                                                               */
/* ------------------------------------------------------------------------------------------ */
static enum MHD_Result route_health(rw_hreq *r) {
    json_t *res;
    rw_err e;
    rw_status st = rw_hcall(r, "health", NULL, &res, &e);
    if (st != RW_OK) return rw_hreply_status(r, st, e.msg);
    const char *state = json_string_value(json_object_get(res, "state"));
    /* a worker that cannot generate is not healthy for a router */
    const bool ok =
        state && strcmp(state, "weights_incomplete") && strcmp(state, "weights_released");
    return rw_hreply_json(r, ok ? 200 : 503, res);
}

static enum MHD_Result route_weight_version(rw_hreq *r) {
    json_t *res;
    rw_err e;
    rw_status st = rw_hcall(r, "get_weight_version", NULL, &res, &e);
    if (st != RW_OK) return rw_hreply_status(r, st, e.msg);
    json_object_set(res, "weight_version", json_object_get(res, "version"));
    return rw_hreply_json(r, 200, res);
}

static enum MHD_Result route_model_info(rw_hreq *r) {
    json_t *res;
    rw_err e;
    rw_status st = rw_hcall(r, "get_weight_version", NULL, &res, &e);
    if (st != RW_OK) return rw_hreply_status(r, st, e.msg);
    const rw_http *h = r->h;
    json_t *j = json_pack("{s:s?, s:s?, s:b, s:n, s:O, s:s, s:I}", "model_path", h->model_path,
                          "tokenizer_path", h->tokenizer_path, "is_generation", 1,
                          "preferred_sampling_params", "weight_version",
                          json_object_get(res, "version"), "served_model_name", h->model_name,
                          "max_total_num_tokens", (json_int_t)h->o.max_seq_len);
    json_decref(res);
    return rw_hreply_json(r, 200, j);
}

static enum MHD_Result route_flush(rw_hreq *r) {
    json_t *res;
    rw_err e;
    rw_status st = rw_hcall(r, "flush_cache", NULL, &res, &e);
    if (st != RW_OK) return rw_hreply_status(r, st, e.msg);
    json_decref(res);
    static const char msg[] = "Cache flushed.\n";
    return rw_hreply(r, 200, "text/plain; charset=utf-8", msg, sizeof msg - 1);
}

static enum MHD_Result route_pause(rw_hreq *r) {
    // clang-format off
    static const char *const allowed[] = {
        "mode", NULL};
    // clang-format on
    json_t *b, *res;
    rw_err e;
    rw_status st = rw_hj_request(r, allowed, true, &b, &e);
    const char *mode = NULL;
    if (st == RW_OK) st = rw_hj_str(b, "", "mode", &mode, &e);
    json_t *a = json_pack("{s:s}", "mode", mode ? mode : "abort");
    json_decref(b);
    if (st == RW_OK) st = rw_hcall(r, "pause", a, &res, &e);
    json_decref(a);
    if (st != RW_OK) return rw_hreply_status(r, st, e.msg);
    json_object_set_new(res, "message", json_string("Generation paused successfully."));
    json_object_set_new(res, "status", json_string("ok"));
    return rw_hreply_json(r, 200, res);
}

static enum MHD_Result route_continue(rw_hreq *r) {
    json_t *res;
    rw_err e;
    rw_status st = rw_hcall(r, "resume", NULL, &res, &e);
    if (st != RW_OK) return rw_hreply_status(r, st, e.msg);
    json_object_set_new(res, "message", json_string("Generation continued successfully."));
    json_object_set_new(res, "status", json_string("ok"));
    return rw_hreply_json(r, 200, res);
}

static enum MHD_Result route_update_disk(rw_hreq *r) {
    // clang-format off
    static const char *const allowed[] = {
        "model_path", "load_format", "flush_cache", "abort_all_requests", "weight_version",
        "is_async", "torch_empty_cache", "keep_pause", "recapture_cuda_graph", "token_step", NULL};
    // clang-format on
    json_t *b, *res = NULL, *h = NULL;
    rw_err e;
    rw_status st = rw_hj_request(r, allowed, true, &b, &e);
    const char *path = NULL, *fmt = NULL, *version = NULL;
    bool flush = true, abort_all = false;
    if (st == RW_OK) st = rw_hj_str(b, "", "model_path", &path, &e);
    if (st == RW_OK && !path)
        st = rw_err_set(&e, RW_E_INVALID_ARG, __FILE__, __LINE__, "model_path: missing");
    if (st == RW_OK) st = rw_hj_str(b, "", "load_format", &fmt, &e);
    if (st == RW_OK && fmt && strcmp(fmt, "auto") && strcmp(fmt, "safetensors"))
        st = rw_err_set(&e, RW_E_UNSUPPORTED, __FILE__, __LINE__,
                        "load_format '%s': rw reads safetensors ('auto' or 'safetensors')", fmt);
    if (st == RW_OK) st = rw_hj_bool(b, "", "flush_cache", true, &flush, &e);
    if (st == RW_OK) st = rw_hj_bool(b, "", "abort_all_requests", false, &abort_all, &e);
    if (st == RW_OK) st = rw_hj_str(b, "", "weight_version", &version, &e);
    json_t *a = NULL;
    if (st == RW_OK) {
        a = json_pack("{s:s, s:b, s:s}", "path", path, "flush_cache", flush, "pause_mode",
                      abort_all ? "abort" : "retract");
        if (version) json_object_set_new(a, "version", json_string(version));
    }
    json_decref(b);
    if (st != RW_OK) return rw_hreply_status(r, st, e.msg);
    json_int_t paused = 0;
    if (rw_hcall(r, "health", NULL, &h, &e) == RW_OK)
        paused = json_integer_value(json_object_get(h, "requests_in_flight"));
    json_decref(h);
    st = rw_hcall(r, "update_weights_from_disk", a, &res, &e);
    json_decref(a);
    if (st != RW_OK) {
        char msg[600];
        snprintf(msg, sizeof msg, "%s: %s", rw_status_str(st), e.msg);
        return rw_hreply_json(r, rw_http_status(st),
                              json_pack("{s:b, s:s, s:I, s:s}", "success", 0, "message", msg,
                                        "num_paused_requests", paused, "status",
                                        rw_status_str(st)));
    }
    char msg[300];
    snprintf(msg, sizeof msg, "Succeeded to update model weights. Weight version updated to %s.",
             json_string_value(json_object_get(res, "version"))
                 ? json_string_value(json_object_get(res, "version"))
                 : "?");
    json_object_set_new(res, "success", json_true());
    json_object_set_new(res, "message", json_string(msg));
    json_object_set_new(res, "num_paused_requests", json_integer(paused));
    return rw_hreply_json(r, 200, res);
}

/* release / resume_memory_occupation: tags "weights", "kv_cache" ("cuda_graph": nothing to do). */
static enum MHD_Result memory(rw_hreq *r, const char *cmd) {
    // clang-format off
    static const char *const allowed[] = {
        "tags", NULL};
    // clang-format on
    json_t *b, *res;
    rw_err e;
    rw_status st = rw_hj_request(r, allowed, true, &b, &e);
    bool weights = true, kv = true;
    const json_t *tags = b ? json_object_get(b, "tags") : NULL;
    if (st == RW_OK && tags && !json_is_null(tags)) {
        weights = kv = false;
        const char *t[8];
        int n = 0;
        st = rw_hj_strs(tags, "tags", t, 8, &n, &e);
        for (int i = 0; st == RW_OK && i < n; i++) {
            if (!strcmp(t[i], "weights"))
                weights = true;
            else if (!strcmp(t[i], "kv_cache"))
                kv = true;
            else if (strcmp(t[i], "cuda_graph"))
                st = rw_err_set(&e, RW_E_INVALID_ARG, __FILE__, __LINE__,
                                "tags[%d]: unknown tag '%s' (weights, kv_cache, cuda_graph)", i,
                                t[i]);
        }
        if (st == RW_OK && !weights && !kv) {
            json_decref(b);
            return rw_hreply_json(r, 200, json_pack("{s:b, s:b}", "weights", 0, "kv_cache", 0));
        }
    }
    json_decref(b);
    if (st != RW_OK) return rw_hreply_status(r, st, e.msg);
    json_t *a = json_pack("{s:b, s:b}", "weights", weights, "kv_cache", kv);
    st = rw_hcall(r, cmd, a, &res, &e);
    json_decref(a);
    if (st != RW_OK) return rw_hreply_status(r, st, e.msg);
    return rw_hreply_json(r, 200, res);
}

static enum MHD_Result route_release(rw_hreq *r) {
    return memory(r, "release_memory");
}

static enum MHD_Result route_resume(rw_hreq *r) {
    return memory(r, "resume_memory");
}

static enum MHD_Result route_abort(rw_hreq *r) {
    // clang-format off
    static const char *const allowed[] = {
        "rid", "abort_all", NULL};
    // clang-format on
    json_t *b, *res;
    rw_err e;
    rw_status st = rw_hj_request(r, allowed, true, &b, &e);
    bool all = false;
    if (st == RW_OK) st = rw_hj_bool(b, "", "abort_all", false, &all, &e);
    json_decref(b);
    if (st == RW_OK && !all)
        st = rw_err_set(&e, RW_E_UNSUPPORTED, __FILE__, __LINE__,
                        "abort_request: only abort_all is supported (a request is aborted when its "
                        "HTTP client disconnects)");
    if (st != RW_OK) return rw_hreply_status(r, st, e.msg);
    json_t *a = json_pack("{s:b}", "all", 1);
    st = rw_hcall(r, "abort", a, &res, &e);
    json_decref(a);
    if (st != RW_OK) return rw_hreply_status(r, st, e.msg);
    return rw_hreply_json(r, 200, res);
}

/* ------------------------------------------------------------------------------------------ */
/* Table                                                                                        */
/* ------------------------------------------------------------------------------------------ */
typedef struct route {
    const char *path;
    const char *methods; /* space-separated */
    rw_hroute fn;
} route;

static const route routes[] = {
    {"/generate", "POST PUT", route_generate},
    {"/health", "GET", route_health},
    {"/health_generate", "GET", route_health},
    {"/get_weight_version", "GET", route_weight_version},
    {"/get_model_info", "GET", route_model_info},
    {"/flush_cache", "GET POST", route_flush},
    {"/pause_generation", "POST", route_pause},
    {"/continue_generation", "POST", route_continue},
    {"/update_weights_from_disk", "POST", route_update_disk},
    {"/release_memory_occupation", "GET POST", route_release},
    {"/resume_memory_occupation", "GET POST", route_resume},
    {"/abort_request", "POST", route_abort},
};

rw_hroute rw_http_sglang_route(const char *method, const char *path, bool *known_path) {
    for (size_t i = 0; i < sizeof routes / sizeof *routes; i++) {
        if (strcmp(path, routes[i].path)) continue;
        *known_path = true;
        const size_t n = strlen(method);
        for (const char *m = routes[i].methods; *m;) {
            const char *sp = strchr(m, ' ');
            size_t len = sp ? (size_t)(sp - m) : strlen(m);
            if (len == n && !strncmp(m, method, n)) return routes[i].fn;
            m += len + (sp ? 1 : 0);
        }
        return NULL;
    }
    return NULL;
}
