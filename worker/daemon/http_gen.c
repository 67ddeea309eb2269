/* http_gen.c - one generation of an HTTP request, driven through the daemon's `generate`
 * command: the parameters checked against the model, partial replies folded into each output's
 * ids and logprobs, the ids decoded into text as they come (rw_tok_stream: emitted text is
 * final), stop strings found in that text (the text ends before the match; the command is
 * aborted once every output has stopped), and the final reply taken as the truth for ids,
 * logprobs, top logprobs, finish and versions. Both HTTP APIs (SGLang, OpenAI) format from it. */
#include "http_internal.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

json_t *rw_hj_logprob(double v) {
    if (isnan(v)) return json_null();
    if (isinf(v)) return json_real(v < 0 ? -9999.0 : 9999.0);
    return json_real(v);
}

json_t *rw_hgen_token_str(const rw_http *h, int32_t id) {
    char *s = NULL;
    size_t n = 0;
    if (!h->o.tok ||
        rw_tok_decode(h->o.tok, &id, 1, RW_TOK_DECODE_SKIP_UNKNOWN, &s, &n, NULL) != RW_OK)
        return json_null();
    json_t *j = json_stringn(s, n);
    free(s);
    return j ? j : json_null();
}

static rw_status grow(rw_hgen_out *o, int n, rw_err *err) {
    if (n <= o->cap) return RW_OK;
    int nc = o->cap ? o->cap : 64;
    while (nc < n)
        nc *= 2;
    int32_t *ids = realloc(o->ids, sizeof *ids * (size_t)nc);
    if (ids) o->ids = ids;
    double *lps = realloc(o->lps, sizeof *lps * (size_t)nc);
    if (lps) o->lps = lps;
    if (!ids || !lps) RW_FAIL(err, RW_E_OOM, "HTTP: output of %d tokens", n);
    o->cap = nc;
    return RW_OK;
}

rw_status rw_hgen_start(rw_hgen *g, rw_hreq *r, const rw_hgen_params *p, rw_err *err) {
    memset(g, 0, sizeof *g);
    g->r = r;
    g->p = *p;
    g->t0 = rw_now();
    const rw_http *h = r->h;
    size_t maxp = 0;
    for (size_t i = 0; i < p->np; i++) {
        if (p->prompts[i].n == 0)
            RW_FAIL(err, RW_E_INVALID_ARG, "prompt %zu is empty (no tokens)", i);
        if (p->prompts[i].n > maxp) maxp = p->prompts[i].n;
    }
    if ((int64_t)maxp >= h->o.max_seq_len)
        RW_FAIL(err, RW_E_RANGE,
                "a prompt of %zu tokens leaves no room to generate (this worker takes at most %lld "
                "tokens of prompt + generation)",
                maxp, (long long)h->o.max_seq_len);
    int64_t mnt = p->max_new_tokens;
    if (mnt <= 0) mnt = h->o.max_seq_len - (int64_t)maxp; /* as many as fit */
    if (mnt > (1 << 24)) mnt = 1 << 24;
    g->p.max_new_tokens = mnt;
    for (int i = 0; i < p->n_stop_strs; i++) {
        size_t n = strlen(p->stop_strs[i]);
        if (n == 0) RW_FAIL(err, RW_E_INVALID_ARG, "stop[%d]: an empty stop string", i);
        if (n > RW_HGEN_MAX_STOP_LEN)
            RW_FAIL(err, RW_E_RANGE, "stop[%d]: %zu bytes (at most %d)", i, n,
                    RW_HGEN_MAX_STOP_LEN);
        if (n - 1 > g->hold) g->hold = n - 1;
    }
    if (p->n_stop_strs && !h->o.tok)
        RW_FAIL(err, RW_E_UNSUPPORTED, "stop strings need a tokenizer (rw-worker --tokenizer DIR)");
    g->nout = (int)p->np * p->n;
    g->out = calloc((size_t)g->nout, sizeof *g->out);
    if (!g->out) RW_FAIL(err, RW_E_OOM, "HTTP: %d outputs", g->nout);
    const uint32_t fl =
        RW_TOK_DECODE_SKIP_UNKNOWN | (p->skip_special ? RW_TOK_DECODE_SKIP_SPECIAL : 0);
    for (int k = 0; k < g->nout; k++) {
        g->out[k].matched_str = -1;
        g->out[k].prompt_tokens = (int)p->prompts[k / p->n].n;
        if (h->o.tok) RW_CHECK(rw_tok_stream_create(h->o.tok, fl, &g->out[k].ts, err));
    }
    /* the command: ids and sampling as docs/PROTOCOL.md 4.1 */
    json_t *a = json_object();
    json_t *ps = json_array();
    for (size_t i = 0; i < p->np; i++) {
        json_t *one = json_array();
        for (size_t j = 0; j < p->prompts[i].n; j++)
            json_array_append_new(one, json_integer(p->prompts[i].ids[j]));
        json_array_append_new(ps, one);
    }
    json_object_set_new(a, "prompts", ps);
    json_object_set_new(a, "n", json_integer(p->n));
    json_object_set_new(a, "max_new_tokens", json_integer(mnt));
    json_object_set_new(a, "temperature", json_real(p->temperature));
    json_object_set_new(a, "top_p", json_real(p->top_p));
    json_object_set_new(a, "top_k", json_integer(p->top_k));
    json_object_set_new(a, "seed", json_integer((json_int_t)p->seed));
    json_t *st = json_array();
    for (int i = 0; i < p->n_stop; i++)
        json_array_append_new(st, json_integer(p->stop_ids[i]));
    json_object_set_new(a, "stop", st);
    json_object_set_new(a, "logprobs", json_boolean(p->logprobs));
    json_object_set_new(a, "top_logprobs", json_integer(p->top_logprobs));
    json_object_set_new(a, "stream", json_boolean(p->stream));
    rw_status s = rw_hcall_send(r, "generate", a, &g->id, err);
    json_decref(a);
    return s;
}

/* Feeds output k's new ids to its decoder and looks for a stop string in the new text. */
static rw_status feed(rw_hgen *g, int k, bool ending, rw_err *err) {
    rw_hgen_out *o = &g->out[k];
    if (!o->ts || o->cut) return RW_OK;
    while (o->ndec < o->n) {
        const char *piece;
        size_t len;
        RW_CHECK(rw_tok_stream_push(o->ts, o->ids[o->ndec], &piece, &len, err));
        size_t from = o->text.n > g->hold ? o->text.n - g->hold : 0;
        rw_tbuf_put(&o->text, piece, len);
        o->ndec++;
        for (int i = 0; i < g->p.n_stop_strs && o->text.p; i++) {
            const char *m = strstr(o->text.p + from, g->p.stop_strs[i]);
            if (m && (!o->cut || (size_t)(m - o->text.p) < o->text.n)) {
                o->text.n = (size_t)(m - o->text.p); /* the text ends before the match */
                o->text.p[o->text.n] = 0;
                o->cut = true;
                o->matched_str = i;
            }
        }
        if (o->cut) return RW_OK;
    }
    if (ending) {
        const char *piece;
        size_t len;
        RW_CHECK(rw_tok_stream_finish(o->ts, &piece, &len, err));
        rw_tbuf_put(&o->text, piece, len);
    }
    if (o->text.failed) RW_FAIL(err, RW_E_OOM, "HTTP: output text");
    return RW_OK;
}

/* The output a reply's entry is about (its "index"), or NULL. */
static rw_hgen_out *output_of(rw_hgen *g, const json_t *e, int *k) {
    const json_int_t i = json_integer_value(json_object_get(e, "index"));
    if (i < 0 || i >= g->nout) return NULL;
    *k = (int)i;
    return &g->out[i];
}

/* Copies entries [from, n) of a reply piece's tokens and logprobs (n: its token count; its
 * first token is at position off of the output) into o, grown to hold them. */
static rw_status take_tokens(rw_hgen_out *o, const json_t *e, int off, int from, rw_err *err) {
    const json_t *tk = json_object_get(e, "tokens"), *lp = json_object_get(e, "logprobs");
    const int n = (int)json_array_size(tk);
    RW_CHECK(grow(o, off + n, err));
    for (int j = from; j < n; j++) {
        o->ids[off + j] = (int32_t)json_integer_value(json_array_get(tk, (size_t)j));
        o->lps[off + j] = lp ? json_number_value(json_array_get(lp, (size_t)j)) : 0;
    }
    return RW_OK;
}

/* A partial reply: {stream: true, outputs: [{index, offset, tokens, logprobs}]}. */
static rw_status apply_partial(rw_hgen *g, const json_t *outs, rw_err *err) {
    size_t i;
    json_t *e;
    int k;
    json_array_foreach(outs, i, e) {
        rw_hgen_out *o = output_of(g, e, &k);
        if (!o) continue;
        const json_int_t off = json_integer_value(json_object_get(e, "offset"));
        const int n = (int)json_array_size(json_object_get(e, "tokens"));
        if (off > o->n || off + n <= o->n) continue; /* a gap or nothing new */
        RW_CHECK(take_tokens(o, e, (int)off, o->n - (int)off, err));
        o->n = (int)off + n;
        RW_CHECK(feed(g, k, false, err));
    }
    return RW_OK;
}

/* The final reply, or one of its parts (docs/PROTOCOL.md 4.1): every output's ids, logprobs and
 * top logprobs, from its `offset` when the output was cut into pieces; its finish and versions
 * come with its last piece, which completes it. */
static rw_status apply_final(rw_hgen *g, const json_t *outs, rw_err *err) {
    size_t i;
    json_t *e;
    int k;
    json_array_foreach(outs, i, e) {
        rw_hgen_out *o = output_of(g, e, &k);
        if (!o) continue;
        const json_t *top = json_object_get(e, "top_logprobs");
        const json_int_t off = json_integer_value(json_object_get(e, "offset"));
        const int n = (int)json_array_size(json_object_get(e, "tokens"));
        if (off < 0 || off > INT32_MAX - n) RW_FAIL(err, RW_E_PROTOCOL, "HTTP: a piece's offset");
        const int end = (int)off + n;
        RW_CHECK(take_tokens(o, e, (int)off, 0, err));
        if (!o->cut) o->n = end; /* a stop string kept the ids up to its match */
        if (json_is_array(top) && json_array_size(top) == (size_t)n && n > 0) {
            const int t = (int)json_array_size(json_array_get(top, 0));
            const size_t cells = (size_t)end * (size_t)(t ? t : 1);
            int32_t *ti = realloc(o->top_ids, cells * sizeof *ti);
            if (ti) o->top_ids = ti;
            double *tl = realloc(o->top_lps, cells * sizeof *tl);
            if (tl) o->top_lps = tl;
            if (!ti || !tl) RW_FAIL(err, RW_E_OOM, "HTTP: top logprobs");
            o->top_n = t;
            for (int j = 0; j < n; j++)
                for (int q = 0; q < t; q++) {
                    const json_t *pair = json_array_get(json_array_get(top, (size_t)j), (size_t)q);
                    const size_t at = ((size_t)off + (size_t)j) * (size_t)t + (size_t)q;
                    o->top_ids[at] = (int32_t)json_integer_value(json_array_get(pair, 0));
                    o->top_lps[at] = json_number_value(json_array_get(pair, 1));
                }
        }
        const char *fin = json_string_value(json_object_get(e, "finish"));
        if (!fin) continue; /* not its last piece: the next part goes on with it */
        o->finish = o->cut                   ? "stop"
                    : !strcmp(fin, "length") ? "length"
                    : !strcmp(fin, "stop")   ? "stop"
                                             : "abort";
        o->final = json_incref(e);
        RW_CHECK(feed(g, k, true, err));
    }
    return RW_OK;
}

rw_status rw_hgen_next(rw_hgen *g, rw_err *err) {
    if (g->final) return RW_OK;
    json_t *res = NULL;
    RW_CHECK(rw_hcall_recv(g->r, g->id, &res, err));
    const json_t *outs = json_object_get(res, "outputs");
    rw_status st;
    if (json_is_true(json_object_get(res, "stream"))) {
        st = apply_partial(g, outs, err);
    } else {
        st = apply_final(g, outs, err);
        /* a result in parts is final with its last part */
        if (!json_is_true(json_object_get(res, "more"))) g->final = true;
    }
    json_decref(res);
    RW_CHECK(st);
    if (!g->final && !g->abort_sent && g->p.n_stop_strs) {
        /* every output stopped by a string: the requests need not run on */
        bool all = true;
        for (int k = 0; k < g->nout && all; k++)
            all = g->out[k].cut;
        if (all) {
            json_t *a = json_pack("{s:I}", "request_id", (json_int_t)g->id);
            uint64_t aid;
            rw_status s2 = rw_hcall_send(g->r, "abort", a, &aid, err);
            json_decref(a);
            RW_CHECK(s2);
            g->abort_sent = true;
        }
    }
    return RW_OK;
}

rw_status rw_hgen_begin(rw_hgen *g, rw_hreq *r, const rw_hgen_params *p, bool stream, rw_err *err) {
    RW_CHECK(rw_hgen_start(g, r, p, err));
    return stream ? rw_hgen_next(g, err) : rw_hgen_run(g, err);
}

rw_status rw_hgen_run(rw_hgen *g, rw_err *err) {
    while (!g->final)
        RW_CHECK(rw_hgen_next(g, err));
    return RW_OK;
}

size_t rw_hgen_avail(const rw_hgen *g, int k) {
    const rw_hgen_out *o = &g->out[k];
    if (o->cut || o->final) return o->text.n;
    size_t end = o->text.n > g->hold ? o->text.n - g->hold : 0;
    if (end < o->emitted) return o->emitted;
    /* never split a UTF-8 character when holding bytes back */
    while (end > o->emitted && ((unsigned char)o->text.p[end] & 0xC0) == 0x80)
        end--;
    return end;
}

int rw_hgen_nids(const rw_hgen *g, int k) {
    const rw_hgen_out *o = &g->out[k];
    return o->cut ? o->ndec : o->n;
}

void rw_hids_free(rw_tok_ids *v, size_t n) {
    for (size_t i = 0; v && i < n; i++)
        rw_tok_ids_free(&v[i]);
    free(v);
}

void rw_hgen_free(rw_hgen *g) {
    if (!g) return;
    if (g->r && g->id && !g->final && !g->abort_sent && g->r->sock) {
        /* the client left or the request failed: its generation need not run on */
        json_t *a = json_pack("{s:I}", "request_id", (json_int_t)g->id);
        uint64_t aid;
        rw_err e;
        rw_hcall_send(g->r, "abort", a, &aid, &e);
        json_decref(a);
    }
    for (int k = 0; k < g->nout && g->out; k++) {
        rw_hgen_out *o = &g->out[k];
        free(o->ids);
        free(o->lps);
        free(o->top_ids);
        free(o->top_lps);
        rw_tok_stream_destroy(o->ts);
        rw_tbuf_free(&o->text);
        json_decref(o->final);
    }
    free(g->out);
    memset(g, 0, sizeof *g);
}
