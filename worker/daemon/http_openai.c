/* http_openai.c - the OpenAI-compatible routes: GET /v1/models, POST /v1/completions and
 * POST /v1/chat/completions (the Qwen3 chat format rendered by rw_tok_chat_qwen3), with n,
 * logprobs, stop strings, seed, max_tokens and streaming as server-sent events. rw adds to each
 * choice the generated `token_ids` and the `weight_version` that made them (clients ignore
 * fields they do not know). Parameters rw does not implement are accepted at their defaults
 * only (a clear 400 otherwise). docs/PROTOCOL.md section 6.3. */
#include "http_internal.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef struct oai_gen {
    rw_hgen g;
    rw_tok_ids *prompts;
    size_t np;
    bool chat;
    int logprobs; /* completions: top count (0: token logprobs only); -1: none */
    bool include_usage;
    bool role_sent; /* chat streams: the first chunk of every choice carried the role */
    char id[64];
    char model[256];
    long created;
    json_t *body; /* the request (stop strings point into it) */
} oai_gen;

static void oai_free(void *arg) {
    oai_gen *q = arg;
    rw_hgen_free(&q->g);
    rw_hids_free(q->prompts, q->np);
    json_decref(q->body);
    free(q);
}

static json_t *usage(const oai_gen *q) {
    json_int_t pt = 0, ct = 0;
    for (int k = 0; k < q->g.nout; k++) {
        if (k % q->g.p.n == 0) pt += q->g.out[k].prompt_tokens;
        ct += rw_hgen_nids(&q->g, k);
    }
    return json_pack("{s:I, s:I, s:I}", "prompt_tokens", pt, "completion_tokens", ct,
                     "total_tokens", pt + ct);
}

static json_t *bytes_of(const rw_http *h, int32_t id) {
    const char *b;
    size_t n;
    json_t *a = json_array();
    if (h->o.tok && rw_tok_token(h->o.tok, id, &b, &n, NULL) == RW_OK)
        for (size_t i = 0; i < n; i++)
            json_array_append_new(a, json_integer((unsigned char)b[i]));
    return a;
}

/* Logprobs of ids [from, to) of output k, in the completions or the chat shape. */
static json_t *logprobs_obj(const oai_gen *q, const rw_hreq *r, int k, int from, int to) {
    const rw_hgen_out *o = &q->g.out[k];
    if (q->chat) {
        json_t *content = json_array();
        for (int i = from; i < to; i++) {
            json_t *top = json_array();
            for (int t = 0; t < o->top_n && o->top_ids; t++) {
                const size_t at = (size_t)i * o->top_n + t;
                json_array_append_new(top, json_pack("{s:o, s:o, s:o}", "token",
                                                     rw_hgen_token_str(r->h, o->top_ids[at]),
                                                     "logprob", rw_hj_logprob(o->top_lps[at]),
                                                     "bytes", bytes_of(r->h, o->top_ids[at])));
            }
            json_array_append_new(content,
                                  json_pack("{s:o, s:o, s:o, s:o}", "token",
                                            rw_hgen_token_str(r->h, o->ids[i]), "logprob",
                                            rw_hj_logprob(o->lps[i]), "bytes",
                                            bytes_of(r->h, o->ids[i]), "top_logprobs", top));
        }
        return json_pack("{s:o}", "content", content);
    }
    json_t *tokens = json_array(), *lps = json_array(), *offs = json_array();
    json_t *tops = q->logprobs > 0 ? json_array() : json_null();
    json_int_t off = 0;
    for (int i = 0; i < from; i++) { /* offsets continue across stream chunks */
        json_t *s = rw_hgen_token_str(r->h, o->ids[i]);
        off += (json_int_t)json_string_length(s);
        json_decref(s);
    }
    for (int i = from; i < to; i++) {
        json_t *s = rw_hgen_token_str(r->h, o->ids[i]);
        json_array_append_new(offs, json_integer(off));
        off += (json_int_t)json_string_length(s);
        json_array_append_new(tokens, s);
        json_array_append_new(lps, rw_hj_logprob(o->lps[i]));
        if (q->logprobs > 0) {
            json_t *m = json_object();
            for (int t = 0; t < o->top_n && o->top_ids; t++) {
                const size_t at = (size_t)i * o->top_n + t;
                json_t *ts = rw_hgen_token_str(r->h, o->top_ids[at]);
                const char *key = json_string_value(ts);
                if (key && !json_object_get(m, key))
                    json_object_set_new(m, key, rw_hj_logprob(o->top_lps[at]));
                json_decref(ts);
            }
            json_array_append_new(tops, m);
        }
    }
    return json_pack("{s:o, s:o, s:o, s:o}", "tokens", tokens, "token_logprobs", lps,
                     "top_logprobs", tops, "text_offset", offs);
}

static json_t *ids_array(const rw_hgen_out *o, int from, int to) {
    json_t *a = json_array();
    for (int i = from; i < to; i++)
        json_array_append_new(a, json_integer(o->ids[i]));
    return a;
}

static json_t *envelope(const oai_gen *q, bool chunk, json_t *choices) {
    return json_pack("{s:s, s:s, s:I, s:s, s:o}", "id", q->id, "object",
                     q->chat ? (chunk ? "chat.completion.chunk" : "chat.completion")
                             : "text_completion",
                     "created", (json_int_t)q->created, "model", q->model, "choices", choices);
}

static json_t *weight_version(const rw_hgen_out *o) {
    const json_t *v = o->final ? json_object_get(o->final, "weight_version") : NULL;
    return v ? json_incref((json_t *)v) : json_null();
}

/* The non-streamed response. */
static json_t *response(const oai_gen *q, const rw_hreq *r) {
    json_t *choices = json_array();
    for (int k = 0; k < q->g.nout; k++) {
        const rw_hgen_out *o = &q->g.out[k];
        const int n = rw_hgen_nids(&q->g, k);
        json_t *text = json_stringn(o->text.p ? o->text.p : "", o->text.n);
        json_t *lp = q->logprobs >= 0 ? logprobs_obj(q, r, k, 0, n) : json_null();
        json_t *c = q->chat
                        ? json_pack("{s:i, s:{s:s, s:o}, s:o, s:s}", "index", k, "message", "role",
                                    "assistant", "content", text ? text : json_string(""),
                                    "logprobs", lp, "finish_reason", o->finish)
                        : json_pack("{s:i, s:o, s:o, s:s}", "index", k, "text",
                                    text ? text : json_string(""), "logprobs", lp, "finish_reason",
                                    o->finish);
        json_object_set_new(c, "token_ids", ids_array(o, 0, n));
        json_object_set_new(c, "weight_version", weight_version(o));
        json_array_append_new(choices, c);
    }
    json_t *j = envelope(q, false, choices);
    json_object_set_new(j, "usage", usage(q));
    return j;
}

/* Streamed chunks: each choice's new text (and ids, logprobs), its finish, usage, [DONE]. */
static bool oai_pump(void *arg, rw_hreq *r, rw_tbuf *out) {
    oai_gen *q = arg;
    for (;;) {
        for (int k = 0; k < q->g.nout; k++) {
            rw_hgen_out *o = &q->g.out[k];
            if (o->ids_emitted < 0) continue; /* finished and said so */
            const size_t end = rw_hgen_avail(&q->g, k);
            const int n = rw_hgen_nids(&q->g, k);
            const bool fin = q->g.final;
            const bool role = q->chat && !q->role_sent;
            if (end == o->emitted && n == o->ids_emitted && !fin && !role) continue;
            json_t *text = json_stringn(o->text.p ? o->text.p + o->emitted : "", end - o->emitted);
            if (!text) text = json_string("");
            json_t *lp = q->logprobs >= 0 && n > o->ids_emitted
                             ? logprobs_obj(q, r, k, o->ids_emitted, n)
                             : json_null();
            json_t *c;
            if (q->chat) {
                json_t *delta = json_object();
                if (role) json_object_set_new(delta, "role", json_string("assistant"));
                if (json_string_length(text) || !fin) json_object_set(delta, "content", text);
                json_decref(text);
                c = json_pack("{s:i, s:o, s:o, s:o}", "index", k, "delta", delta, "logprobs", lp,
                              "finish_reason", fin ? json_string(o->finish) : json_null());
            } else {
                c = json_pack("{s:i, s:o, s:o, s:o}", "index", k, "text", text, "logprobs", lp,
                              "finish_reason", fin ? json_string(o->finish) : json_null());
            }
            json_object_set_new(c, "token_ids", ids_array(o, o->ids_emitted, n));
            if (fin) json_object_set_new(c, "weight_version", weight_version(o));
            rw_sse_json(out, envelope(q, true, json_pack("[o]", c)));
            o->emitted = end;
            o->ids_emitted = fin ? -1 : n;
        }
        q->role_sent = true;
        if (q->g.final) {
            if (q->include_usage) {
                json_t *j = envelope(q, true, json_array());
                json_object_set_new(j, "usage", usage(q));
                rw_sse_json(out, j);
            }
            rw_sse_done(out);
            return false;
        }
        if (out->n) return true;
        rw_err e;
        rw_status st = rw_hgen_next(&q->g, &e);
        if (st != RW_OK) {
            if (!r->client_gone)
                rw_sse_json(
                    out,
                    json_pack("{s:{s:s, s:s, s:n, s:i}}", "error", "message", e.msg, "type",
                              rw_http_status(st) >= 500 ? "server_error" : "invalid_request_error",
                              "param", "code", (int)rw_http_status(st)));
            rw_sse_done(out);
            return false;
        }
    }
}

/* ------------------------------------------------------------------------------------------ */
/* Requests                                                                                     */
/* ------------------------------------------------------------------------------------------ */
/* The parameters both routes share (OpenAI defaults: temperature 1, top_p 1, n 1). */
static rw_status read_common(rw_hreq *r, const json_t *b, rw_hgen_params *p, bool *stream,
                             oai_gen *q, rw_err *err) {
    int64_t x = 0;
    double d;
    RW_CHECK(rw_hj_num(b, "", "temperature", 1.0, 0, 2, &p->temperature, err));
    RW_CHECK(rw_hj_num(b, "", "top_p", 1.0, 1e-9, 1, &p->top_p, err));
    RW_CHECK(rw_hj_int(b, "", "top_k", -1, -1, 1 << 30, &x, err));
    p->top_k = x < 0 ? 0 : x;
    RW_CHECK(rw_hj_int(b, "", "n", 1, 1, 128, &x, err));
    p->n = (int)x;
    RW_CHECK(rw_hj_int(b, "", "seed", 0, 0, INT64_MAX, &x, err));
    p->seed = (uint64_t)x;
    RW_CHECK(rw_hj_bool(b, "", "stream", false, stream, err));
    RW_CHECK(rw_hj_bool(b, "", "skip_special_tokens", true, &p->skip_special, err));
    RW_CHECK(rw_hj_strs(json_object_get(b, "stop"), "stop", p->stop_strs, RW_HGEN_MAX_STOP_STR,
                        &p->n_stop_strs, err));
    bool ignore_eos;
    RW_CHECK(rw_hj_bool(b, "", "ignore_eos", false, &ignore_eos, err));
    const json_t *sti = json_object_get(b, "stop_token_ids");
    if (sti && !json_is_null(sti)) {
        rw_tok_ids v = {0};
        rw_status st = rw_hj_ids(sti, "stop_token_ids", INT32_MAX, &v, err);
        if (st == RW_OK && v.n > RW_MAX_STOP)
            st = rw_err_set(err, RW_E_RANGE, __FILE__, __LINE__,
                            "stop_token_ids: %zu ids (at most %d)", v.n, RW_MAX_STOP);
        for (size_t i = 0; st == RW_OK && i < v.n; i++)
            p->stop_ids[p->n_stop++] = v.ids[i];
        rw_tok_ids_free(&v);
        RW_CHECK(st);
    }
    for (int i = 0; !ignore_eos && i < r->h->o.n_eos && p->n_stop < RW_MAX_STOP; i++)
        p->stop_ids[p->n_stop++] = r->h->o.eos[i];
    /* accepted at their defaults only */
    RW_CHECK(rw_hj_num(b, "", "presence_penalty", 0, 0, 0, &d, err));
    RW_CHECK(rw_hj_num(b, "", "frequency_penalty", 0, 0, 0, &d, err));
    RW_CHECK(rw_hj_num(b, "", "repetition_penalty", 1, 1, 1, &d, err));
    RW_CHECK(rw_hj_num(b, "", "min_p", 0, 0, 0, &d, err));
    const json_t *lb = json_object_get(b, "logit_bias");
    if (lb && !json_is_null(lb) && !(json_is_object(lb) && json_object_size(lb) == 0))
        RW_FAIL(err, RW_E_UNSUPPORTED, "logit_bias: not supported by rw");
    const json_t *so = json_object_get(b, "stream_options");
    if (so && !json_is_null(so)) {
        if (!json_is_object(so))
            RW_FAIL(err, RW_E_INVALID_ARG, "stream_options: expected an object");
        static const char *const ok[] = {"include_usage", "continuous_usage_stats", NULL};
        RW_CHECK(rw_hj_only(so, "stream_options", ok, err));
        RW_CHECK(rw_hj_bool(so, "stream_options", "include_usage", false, &q->include_usage, err));
    }
    const char *model = NULL;
    RW_CHECK(rw_hj_str(b, "", "model", &model, err));
    snprintf(q->model, sizeof q->model, "%s", r->h->model_name); /* any name is served */
    const char *user;
    RW_CHECK(rw_hj_str(b, "", "user", &user, err));
    return RW_OK;
}

static rw_status encode(rw_hreq *r, const char *s, size_t n, const char *what, rw_tok_ids *out,
                        rw_err *err) {
    if (!r->h->o.tok)
        RW_FAIL(
            err, RW_E_UNSUPPORTED,
            "%s: text needs a tokenizer (start rw-worker with --tokenizer DIR, or send token ids)",
            what);
    RW_CHECK(rw_tok_encode(r->h->o.tok, s, n, 0, out, err));
    for (size_t j = 0; j < out->n; j++)
        if (out->ids[j] >= r->h->o.vocab_size)
            RW_FAIL(err, RW_E_RANGE,
                    "%s: encodes to token id %d, outside the model's vocabulary [0, %lld)", what,
                    (int)out->ids[j], (long long)r->h->o.vocab_size);
    return RW_OK;
}

/* prompt: a string, a list of strings, a list of ids, or a list of lists of ids. */
static rw_status read_prompt(rw_hreq *r, const json_t *pr, oai_gen *q, rw_err *err) {
    if (!pr || json_is_null(pr)) RW_FAIL(err, RW_E_INVALID_ARG, "prompt: missing");
    const bool one =
        json_is_string(pr) || (json_is_array(pr) && json_is_integer(json_array_get(pr, 0)));
    if (!one && !json_is_array(pr))
        RW_FAIL(
            err, RW_E_INVALID_ARG,
            "prompt: expected a string, a list of strings, a list of token ids or a list of lists");
    q->np = one ? 1 : json_array_size(pr);
    if (!q->np) RW_FAIL(err, RW_E_INVALID_ARG, "prompt: an empty list");
    q->prompts = calloc(q->np, sizeof *q->prompts);
    if (!q->prompts) RW_FAIL(err, RW_E_OOM, "prompts");
    for (size_t i = 0; i < q->np; i++) {
        const json_t *e = one ? pr : json_array_get(pr, i);
        char what[48];
        snprintf(what, sizeof what, one ? "prompt" : "prompt[%zu]", i);
        if (json_is_string(e))
            RW_CHECK(
                encode(r, json_string_value(e), json_string_length(e), what, &q->prompts[i], err));
        else
            RW_CHECK(rw_hj_ids(e, what, r->h->o.vocab_size, &q->prompts[i], err));
    }
    return RW_OK;
}

/* A message's content: a string, or a list of {"type": "text", "text": ...} parts (joined). */
static rw_status content_of(const json_t *c, const char *what, rw_tbuf *out, rw_err *err) {
    if (json_is_string(c)) {
        rw_tbuf_put(out, json_string_value(c), json_string_length(c));
    } else if (json_is_array(c)) {
        size_t i;
        json_t *part;
        json_array_foreach(c, i, part) {
            const char *type = json_string_value(json_object_get(part, "type"));
            const json_t *t = json_object_get(part, "text");
            if (!type || strcmp(type, "text") || !json_is_string(t))
                RW_FAIL(err, RW_E_UNSUPPORTED,
                        "%s[%zu]: only {\"type\": \"text\", \"text\": ...} parts are supported",
                        what, i);
            rw_tbuf_put(out, json_string_value(t), json_string_length(t));
        }
    } else if (!json_is_null(c)) {
        RW_FAIL(err, RW_E_INVALID_ARG, "%s: expected a string or a list of text parts", what);
    }
    rw_tbuf_put(out, "", 0); /* allocates: an empty content is "" */
    if (out->failed) RW_FAIL(err, RW_E_OOM, "%s", what);
    return RW_OK;
}

/* messages -> the Qwen3 chat prompt (with the generation prompt) -> ids. */
static rw_status read_messages(rw_hreq *r, const json_t *b, oai_gen *q, rw_err *err) {
    const json_t *msgs = json_object_get(b, "messages");
    if (!json_is_array(msgs) || !json_array_size(msgs))
        RW_FAIL(err, RW_E_INVALID_ARG, "messages: expected a non-empty list");
    if (!r->h->o.tok)
        RW_FAIL(err, RW_E_UNSUPPORTED,
                "chat needs a tokenizer: start rw-worker with --tokenizer DIR");
    const size_t n = json_array_size(msgs);
    if (n > 4096) RW_FAIL(err, RW_E_RANGE, "messages: %zu messages (at most 4096)", n);
    rw_chat_msg *cm = calloc(n, sizeof *cm);
    rw_tbuf *texts = calloc(n, sizeof *texts), *reas = calloc(n, sizeof *reas);
    rw_status st =
        cm && texts && reas ? RW_OK : rw_err_set(err, RW_E_OOM, __FILE__, __LINE__, "messages");
    for (size_t i = 0; st == RW_OK && i < n; i++) {
        const json_t *m = json_array_get(msgs, i);
        char what[64];
        snprintf(what, sizeof what, "messages[%zu]", i);
        static const char *const ok[] = {"role",       "content",      "name", "reasoning_content",
                                         "tool_calls", "tool_call_id", NULL};
        if (!json_is_object(m)) {
            st = rw_err_set(err, RW_E_INVALID_ARG, __FILE__, __LINE__, "%s: expected an object",
                            what);
            break;
        }
        st = rw_hj_only(m, what, ok, err);
        const char *role = NULL;
        if (st == RW_OK) st = rw_hj_str(m, what, "role", &role, err);
        if (st != RW_OK) break;
        if (!role)
            st = rw_err_set(err, RW_E_INVALID_ARG, __FILE__, __LINE__, "%s.role: missing", what);
        else if (!strcmp(role, "system") || !strcmp(role, "developer"))
            cm[i].role = RW_CHAT_SYSTEM;
        else if (!strcmp(role, "user"))
            cm[i].role = RW_CHAT_USER;
        else if (!strcmp(role, "assistant"))
            cm[i].role = RW_CHAT_ASSISTANT;
        else if (!strcmp(role, "tool"))
            cm[i].role = RW_CHAT_TOOL;
        else
            st = rw_err_set(err, RW_E_INVALID_ARG, __FILE__, __LINE__,
                            "%s.role: '%s' (system, user, assistant, tool)", what, role);
        const json_t *tc = json_object_get(m, "tool_calls");
        if (st == RW_OK && tc && !json_is_null(tc) && !(json_is_array(tc) && !json_array_size(tc)))
            st = rw_err_set(err, RW_E_UNSUPPORTED, __FILE__, __LINE__,
                            "%s.tool_calls: tool calls are not supported by rw", what);
        char cw[80];
        snprintf(cw, sizeof cw, "%s.content", what);
        if (st == RW_OK) st = content_of(json_object_get(m, "content"), cw, &texts[i], err);
        cm[i].content = texts[i].p ? texts[i].p : "";
        const json_t *rc = json_object_get(m, "reasoning_content");
        if (st == RW_OK && rc && !json_is_null(rc)) {
            snprintf(cw, sizeof cw, "%s.reasoning_content", what);
            st = content_of(rc, cw, &reas[i], err);
            cm[i].reasoning = reas[i].p ? reas[i].p : "";
        }
    }
    bool thinking = true;
    const json_t *kw = json_object_get(b, "chat_template_kwargs");
    if (st == RW_OK && kw && !json_is_null(kw)) {
        static const char *const ok[] = {"enable_thinking", NULL};
        if (!json_is_object(kw))
            st = rw_err_set(err, RW_E_INVALID_ARG, __FILE__, __LINE__,
                            "chat_template_kwargs: expected an object");
        if (st == RW_OK) st = rw_hj_only(kw, "chat_template_kwargs", ok, err);
        if (st == RW_OK)
            st = rw_hj_bool(kw, "chat_template_kwargs", "enable_thinking", true, &thinking, err);
    }
    char *prompt = NULL;
    size_t plen = 0;
    rw_chat_opts co = {.add_generation_prompt = true, .disable_thinking = !thinking};
    if (st == RW_OK) st = rw_tok_chat_qwen3(cm, n, &co, &prompt, &plen, err);
    for (size_t i = 0; texts && reas && i < n; i++) {
        rw_tbuf_free(&texts[i]);
        rw_tbuf_free(&reas[i]);
    }
    free(cm);
    free(texts);
    free(reas);
    if (st == RW_OK) {
        q->np = 1;
        q->prompts = calloc(1, sizeof *q->prompts);
        st = q->prompts ? encode(r, prompt, plen, "messages", &q->prompts[0], err)
                        : rw_err_set(err, RW_E_OOM, __FILE__, __LINE__, "prompt");
    }
    free(prompt);
    return st;
}

static enum MHD_Result completions(rw_hreq *r, bool chat) {
    // clang-format off
    static const char *const allowed_c[] = {
        "model", "prompt", "max_tokens", "temperature", "top_p", "n", "stream", "stream_options",
        "logprobs", "echo", "stop", "presence_penalty", "frequency_penalty", "best_of",
        "logit_bias", "user", "seed", "suffix", "top_k", "min_p", "ignore_eos",
        "skip_special_tokens", "stop_token_ids", "repetition_penalty", NULL};
    // clang-format on
    // clang-format off
    static const char *const allowed_chat[] = {
        "model", "messages", "max_tokens", "max_completion_tokens", "temperature", "top_p", "n",
        "stream", "stream_options", "logprobs", "top_logprobs", "stop", "presence_penalty",
        "frequency_penalty", "logit_bias", "user", "seed", "tools", "tool_choice",
        "parallel_tool_calls", "response_format", "chat_template_kwargs", "top_k", "min_p",
        "ignore_eos", "skip_special_tokens", "stop_token_ids", "repetition_penalty", NULL};
    // clang-format on
    json_t *b = NULL;
    rw_err e;
    rw_status st = rw_hj_request(r, chat ? allowed_chat : allowed_c, false, &b, &e);
    if (st != RW_OK) return rw_hreply_status(r, st, e.msg);
    oai_gen *q = calloc(1, sizeof *q);
    if (!q) {
        json_decref(b);
        return rw_hreply_error(r, 503, "out of memory");
    }
    q->chat = chat;
    q->created = (long)time(NULL);
    snprintf(q->id, sizeof q->id, "%s-rw-%" PRIu64, chat ? "chatcmpl" : "cmpl", r->num);
    rw_hgen_params p = {0};
    bool stream = false;
    int64_t x = 0;
    st = read_common(r, b, &p, &stream, q, &e);
    if (chat) {
        bool lp = false;
        if (st == RW_OK)
            st = rw_hj_int(b, "", "max_completion_tokens", 0, 1, 1 << 24, &p.max_new_tokens, &e);
        if (st == RW_OK)
            st =
                rw_hj_int(b, "", "max_tokens", p.max_new_tokens, 1, 1 << 24, &p.max_new_tokens, &e);
        if (st == RW_OK) st = rw_hj_bool(b, "", "logprobs", false, &lp, &e);
        if (st == RW_OK) st = rw_hj_int(b, "", "top_logprobs", 0, 0, RW_MAX_TOP_LOGPROBS, &x, &e);
        q->logprobs = lp ? (int)x : -1;
        if (st == RW_OK && !lp && x > 0)
            st = rw_err_set(&e, RW_E_INVALID_ARG, __FILE__, __LINE__,
                            "top_logprobs needs logprobs: true");
        const json_t *tools = json_object_get(b, "tools");
        if (st == RW_OK && tools && !json_is_null(tools) &&
            !(json_is_array(tools) && !json_array_size(tools)))
            st = rw_err_set(&e, RW_E_UNSUPPORTED, __FILE__, __LINE__,
                            "tools: tool calling is not supported by rw");
        const json_t *tcs = json_object_get(b, "tool_choice");
        if (st == RW_OK && tcs && !json_is_null(tcs) &&
            !(json_is_string(tcs) && !strcmp(json_string_value(tcs), "none")))
            st = rw_err_set(&e, RW_E_UNSUPPORTED, __FILE__, __LINE__, "tool_choice: only \"none\"");
        const json_t *rf = json_object_get(b, "response_format");
        if (st == RW_OK && rf && !json_is_null(rf) &&
            strcmp(json_string_value(json_object_get(rf, "type"))
                       ? json_string_value(json_object_get(rf, "type"))
                       : "",
                   "text"))
            st = rw_err_set(&e, RW_E_UNSUPPORTED, __FILE__, __LINE__,
                            "response_format: only {\"type\": \"text\"}");
        if (st == RW_OK) st = read_messages(r, b, q, &e);
    } else {
        bool echo = false;
        const char *suffix = NULL;
        if (st == RW_OK) st = rw_hj_int(b, "", "max_tokens", 16, 1, 1 << 24, &p.max_new_tokens, &e);
        if (st == RW_OK) st = rw_hj_int(b, "", "logprobs", -1, 0, RW_MAX_TOP_LOGPROBS, &x, &e);
        q->logprobs = (int)x;
        if (st == RW_OK) st = rw_hj_bool(b, "", "echo", false, &echo, &e);
        if (st == RW_OK && echo)
            st = rw_err_set(&e, RW_E_UNSUPPORTED, __FILE__, __LINE__, "echo: not supported by rw");
        if (st == RW_OK) st = rw_hj_int(b, "", "best_of", 1, 1, 1, &x, &e);
        if (st == RW_OK) st = rw_hj_str(b, "", "suffix", &suffix, &e);
        if (st == RW_OK && suffix)
            st =
                rw_err_set(&e, RW_E_UNSUPPORTED, __FILE__, __LINE__, "suffix: not supported by rw");
        if (st == RW_OK) st = read_prompt(r, json_object_get(b, "prompt"), q, &e);
    }
    q->body = b;
    if (st == RW_OK && (int64_t)q->np * p.n > 4096)
        st = rw_err_set(&e, RW_E_RANGE, __FILE__, __LINE__,
                        "%zu prompts x n %d (at most 4096 choices)", q->np, p.n);
    if (st != RW_OK) {
        oai_free(q);
        return rw_hreply_status(r, st, e.msg);
    }
    p.prompts = q->prompts;
    p.np = q->np;
    p.logprobs = q->logprobs >= 0;
    p.top_logprobs = q->logprobs > 0 ? q->logprobs : 0;
    /* top logprobs come with the final reply only: such a stream sends its tokens at the end */
    p.stream = (stream && p.top_logprobs == 0) || p.n_stop_strs > 0;
    st = rw_hgen_begin(&q->g, r, &p, stream, &e);
    if (st != RW_OK) {
        oai_free(q);
        return rw_hreply_status(r, st, e.msg);
    }
    if (stream) return rw_hreply_stream(r, oai_pump, oai_free, q);
    json_t *res = response(q, r);
    oai_free(q);
    return rw_hreply_json(r, 200, res);
}

static enum MHD_Result route_completions(rw_hreq *r) {
    return completions(r, false);
}

static enum MHD_Result route_chat(rw_hreq *r) {
    return completions(r, true);
}

static enum MHD_Result route_models(rw_hreq *r) {
    const rw_http *h = r->h;
    json_t *m = json_pack("{s:s, s:s, s:I, s:s, s:s, s:I}", "id", h->model_name, "object", "model",
                          "created", (json_int_t)h->t_start, "owned_by", "rw", "root",
                          h->model_name, "max_model_len", (json_int_t)h->o.max_seq_len);
    return rw_hreply_json(r, 200, json_pack("{s:s, s:[o]}", "object", "list", "data", m));
}

rw_hroute rw_http_openai_route(const char *method, const char *path, bool *known_path) {
    *known_path = true;
    const bool get = !strcmp(method, "GET"), post = !strcmp(method, "POST");
    if (!strcmp(path, "/v1/models")) return get ? route_models : NULL;
    if (!strcmp(path, "/v1/completions")) return post ? route_completions : NULL;
    if (!strcmp(path, "/v1/chat/completions")) return post ? route_chat : NULL;
    *known_path = false;
    return NULL;
}
