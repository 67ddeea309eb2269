/* decode.c - ids -> text, whole or incrementally.
 *
 * A run of BPE tokens stands for bytes that may split a UTF-8 character anywhere (Qwen3 has
 * tokens for single bytes of a Chinese character or an emoji), so bytes are collected over the
 * run and read as UTF-8 once; an added token ends the run and contributes its content verbatim.
 * The incremental decoder holds back only the last incomplete-but-valid prefix of a character
 * (at most 3 bytes), so every byte it emits is final and its output concatenates to exactly what
 * rw_tok_decode returns for the same ids: a prefix that turns out invalid yields the same U+FFFD
 * either way (utf8.c decides both).
 */
#include <stdlib.h>
#include <string.h>

#include "internal.h"

/* 0: an id to decode; 1: skip it; -1: an error (err set). */
static int classify(const rw_tok *t, int32_t id, uint32_t flags, size_t pos, rw_err *err) {
    if (id < 0 || id >= t->n_ids || t->kind[id] == TK_NONE) {
        if (flags & RW_TOK_DECODE_SKIP_UNKNOWN) return 1;
        rw_err_set(err, RW_E_RANGE, __FILE__, __LINE__,
                   "decode: ids[%zu] = %d has no token (the tokenizer's ids are 0..%d)", pos, id,
                   t->n_ids - 1);
        return -1;
    }
    if (t->kind[id] == TK_SPECIAL && (flags & RW_TOK_DECODE_SKIP_SPECIAL)) return 1;
    return 0;
}

rw_status rw_tok_decode(const rw_tok *t, const int32_t *ids, size_t n, uint32_t flags, char **out,
                        size_t *out_len, rw_err *err) {
    if (!t || (!ids && n) || !out) RW_FAIL(err, RW_E_INVALID_ARG, "rw_tok_decode: NULL argument");
    *out = NULL;
    tok_buf b = {0}, run = {0};
    rw_status st = RW_OK;
    if (!tok_buf_reserve(&b, n * 4)) goto oom;
    for (size_t i = 0; i < n; i++) {
        int k = classify(t, ids[i], flags, i, err);
        if (k < 0) {
            st = RW_E_RANGE;
            goto done;
        }
        if (k) continue;
        int32_t id = ids[i];
        const char *p = t->pool.p + t->off[id];
        if (t->kind[id] == TK_BPE) {
            if (!tok_buf_put(&run, p, t->len[id])) goto oom;
            continue;
        }
        if (!tok_utf8_lossy(&b, (const uint8_t *)run.p, run.n)) goto oom;
        run.n = 0;
        if (!tok_buf_put(&b, p, t->len[id])) goto oom;
    }
    if (!tok_utf8_lossy(&b, (const uint8_t *)run.p, run.n)) goto oom;
    if (!tok_buf_reserve(&b, 0)) goto oom; /* NUL room even for n == 0 */
    b.p[b.n] = 0;
    *out = b.p;
    if (out_len) *out_len = b.n;
    b.p = NULL;
    goto done;
oom:
    st = RW_ERR(err, RW_E_OOM, "decode: %zu ids", n);
done:
    tok_buf_free(&b);
    tok_buf_free(&run);
    return st;
}

struct rw_tok_stream {
    const rw_tok *t;
    uint32_t flags;
    uint8_t pend[4]; /* incomplete character held back */
    size_t npend;
    tok_buf in;    /* pend + the new token's bytes */
    tok_buf out;   /* what the last call yields */
    size_t pushed; /* ids fed since the last finish (for messages) */
};

rw_status rw_tok_stream_create(const rw_tok *t, uint32_t flags, rw_tok_stream **out, rw_err *err) {
    if (!t || !out) RW_FAIL(err, RW_E_INVALID_ARG, "rw_tok_stream_create: NULL argument");
    rw_tok_stream *s = calloc(1, sizeof *s);
    if (!s) RW_FAIL(err, RW_E_OOM, "rw_tok_stream");
    s->t = t;
    s->flags = flags;
    *out = s;
    return RW_OK;
}

void rw_tok_stream_destroy(rw_tok_stream *s) {
    if (!s) return;
    tok_buf_free(&s->in);
    tok_buf_free(&s->out);
    free(s);
}

size_t rw_tok_stream_pending(const rw_tok_stream *s) {
    return s ? s->npend : 0;
}

static rw_status yield(rw_tok_stream *s, const char **text, size_t *len, rw_err *err) {
    if (!tok_buf_reserve(&s->out, 0)) RW_FAIL(err, RW_E_OOM, "stream decode");
    s->out.p[s->out.n] = 0;
    *text = s->out.p;
    *len = s->out.n;
    return RW_OK;
}

rw_status rw_tok_stream_push(rw_tok_stream *s, int32_t id, const char **text, size_t *len,
                             rw_err *err) {
    if (!s || !text || !len) RW_FAIL(err, RW_E_INVALID_ARG, "rw_tok_stream_push: NULL argument");
    const rw_tok *t = s->t;
    s->out.n = 0;
    int k = classify(t, id, s->flags, s->pushed, err);
    if (k < 0) return RW_E_RANGE;
    s->pushed++;
    if (k) return yield(s, text, len, err);
    const char *p = t->pool.p + t->off[id];
    if (t->kind[id] == TK_BPE) {
        s->in.n = 0;
        if (!tok_buf_put(&s->in, s->pend, s->npend) || !tok_buf_put(&s->in, p, t->len[id]))
            RW_FAIL(err, RW_E_OOM, "stream decode");
        size_t used = 0;
        if (!tok_utf8_lossy_ex(&s->out, (const uint8_t *)s->in.p, s->in.n, false, &used))
            RW_FAIL(err, RW_E_OOM, "stream decode");
        s->npend = s->in.n - used; /* <= 3: a valid prefix is shorter than a character */
        memcpy(s->pend, s->in.p + used, s->npend);
    } else {
        if (!tok_utf8_lossy(&s->out, s->pend, s->npend) || !tok_buf_put(&s->out, p, t->len[id]))
            RW_FAIL(err, RW_E_OOM, "stream decode");
        s->npend = 0;
    }
    return yield(s, text, len, err);
}

rw_status rw_tok_stream_finish(rw_tok_stream *s, const char **text, size_t *len, rw_err *err) {
    if (!s || !text || !len) RW_FAIL(err, RW_E_INVALID_ARG, "rw_tok_stream_finish: NULL argument");
    s->out.n = 0;
    if (!tok_utf8_lossy(&s->out, s->pend, s->npend)) RW_FAIL(err, RW_E_OOM, "stream decode");
    s->npend = 0;
    s->pushed = 0;
    return yield(s, text, len, err);
}
