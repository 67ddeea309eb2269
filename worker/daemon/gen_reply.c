/* gen_reply.c - the final reply of a generate command (docs/PROTOCOL.md 4.1): every output with
 * its tokens, logprobs, top logprobs and version spans, in one message when it fits, else in
 * parts. A message must fit what a client's decoder accepts (RW_MSG_MAX_BYTES, and a bound on
 * array / map elements), and a large RL batch easily makes a result past both: 540 prompts x
 * 500 tokens with top_logprobs 20 is about 70 MB and 17M elements. So the reply is cut into
 * parts of at most --max-reply-bytes bytes and PART_MAX_ELEMS elements:
 *
 *   {stream: false, more: true, outputs: [...]}  ...  {stream: false, outputs: [...]}
 *
 * outputs in index order; an output too large for the room left goes on in the next part with
 * the same `index` and an `offset` (its first token's position) on every piece, its other fields
 * (prompt_index, sample, finish, ...) in its last piece only. A result that fits one message is
 * written exactly as before. Sizes are bounded from above per token before anything is written,
 * so no part passes the budget. Routed experts travel in data frames, outside the budget: each
 * message carries the routes of the outputs whose last piece it holds, at offsets from the start
 * of its own frame. */
#include "server_internal.h"

#include <stdlib.h>

/* Half the decoder's element limit (msg.c): a part stays far from it. */
#define PART_MAX_ELEMS (1u << 20)
/* {stream, more, outputs: [n]} and the envelope around it. */
#define HEAD_BYTES 96u
#define HEAD_ELEMS 8u

/* One piece of one output in a part: tokens [b, e) of output k. */
typedef struct piece {
    int k, b, e;
    bool last;  /* the output's last piece: carries its other fields */
    bool split; /* the output has more than one piece: every piece carries `offset` */
} piece;

/* Upper bounds of one token's bytes and elements: an id (int32: <= 5 bytes, 1 element) and its
 * logprob fields (rw_srv_logprob_bound). */
static void per_token(const rw_gen *g, const rw_output *o, uint64_t *bytes, uint64_t *elems) {
    rw_srv_logprob_bound(g->logprobs, (uint64_t)o->top_n, bytes, elems);
    *bytes += 5;
    *elems += 1;
}

/* Upper bounds of a piece without its tokens: keys, numbers, version tags (<= 127 bytes each),
 * spans. */
static void piece_fixed(const rw_output *o, bool last, size_t text_len, uint64_t *bytes,
                        uint64_t *elems) {
    *bytes = 96; /* map header, index, offset, the token arrays' headers and keys */
    *elems = 8;
    if (last) {
        *bytes += 256 + (RW_SYNC_MAX_VERSION + 5) +
                  (uint64_t)o->n_spans * (64 + RW_SYNC_MAX_VERSION) + (text_len + 16) +
                  2 * 160; /* routes fields: {offset, nbytes, shape, dtype} each */
        *elems += 22 + 4 * (uint64_t)o->n_spans;
    }
}

/* What the reply writes besides the outputs: their decoded texts (when asked) and the routes'
 * data frame with its offsets (when asked). */
typedef struct reply_extra {
    char **text; /* [n] or NULL */
    size_t *text_len;
    size_t *offs; /* [2n] or NULL */
} reply_extra;

static void write_piece(rw_server *s, rw_mw *w, const rw_gen *g, const reply_extra *x,
                        const piece *p) {
    const rw_output *o = g->outs[p->k];
    const bool top = o->top_n > 0;
    const int n = p->e - p->b;
    const uint32_t last_fields = 8 + (x->text ? 1 : 0) + (uint32_t)rw_srv_routes_nfields(g);
    rw_mw_map(w, 2 + (p->split ? 1 : 0) + (g->logprobs ? 1 : 0) + (top ? 1 : 0) +
                     (p->last ? last_fields : 0));
    rw_mw_kv_u64(w, "index", (uint64_t)p->k);
    if (p->last) {
        rw_mw_kv_u64(w, "prompt_index", (uint64_t)(p->k / g->per_prompt));
        rw_mw_kv_u64(w, "sample", (uint64_t)(p->k % g->per_prompt));
    }
    if (p->split) rw_mw_kv_u64(w, "offset", (uint64_t)p->b);
    rw_mw_str(w, "tokens");
    rw_mw_array(w, (uint32_t)n);
    for (int i = p->b; i < p->e; i++)
        rw_mw_i64(w, o->tokens[i]);
    if (g->logprobs) {
        rw_mw_str(w, "logprobs");
        rw_mw_array(w, (uint32_t)n);
        for (int i = p->b; i < p->e; i++)
            rw_srv_lp(w, o->logprobs[i]);
    }
    if (top) {
        rw_mw_str(w, "top_logprobs");
        rw_mw_array(w, (uint32_t)n);
        for (int i = p->b; i < p->e; i++) {
            rw_mw_array(w, (uint32_t)o->top_n);
            for (int j = 0; j < o->top_n; j++) {
                rw_mw_array(w, 2);
                rw_mw_i64(w, o->top_ids[(size_t)i * o->top_n + j]);
                rw_srv_lp(w, o->top_logprobs[(size_t)i * o->top_n + j]);
            }
        }
    }
    if (!p->last) return;
    if (x->text) {
        rw_mw_str(w, "text");
        rw_mw_strn(w, x->text[p->k] ? x->text[p->k] : "", x->text_len[p->k]);
    }
    rw_mw_kv_str(w, "finish", rw_finish_str(o->finish));
    rw_mw_kv_u64(w, "prompt_tokens", (uint64_t)o->n_prompt);
    /* the version that produced the last token (the serving one when nothing was made) */
    uint64_t lastv = o->n_spans ? o->spans[o->n_spans - 1].version : (s->ntags ? s->ntags - 1 : 0);
    rw_mw_kv_str(w, "weight_version", rw_srv_tag_of(s, lastv));
    rw_mw_str(w, "version_spans");
    rw_mw_array(w, (uint32_t)o->n_spans);
    for (int i = 0; i < o->n_spans; i++) {
        rw_mw_map(w, 3);
        rw_mw_kv_str(w, "version", rw_srv_tag_of(s, o->spans[i].version));
        rw_mw_kv_i64(w, "begin", o->spans[i].begin);
        rw_mw_kv_i64(w, "end", o->spans[i].end);
    }
    /* seconds from the command's arrival */
    rw_mw_kv_f64(w, "first_token_s", o->t_first > 0 ? o->t_first - g->t_recv : -1);
    rw_mw_kv_f64(w, "total_s", o->t_done - g->t_recv);
    rw_srv_routes_fields(w, s, g, p->k, x->offs);
}

/* Fills pl[] with the next part's pieces from (*k, *t) on (output *k from token *t); returns how
 * many. Every call makes progress: a part that starts empty takes at least one token or one
 * output's last piece (alone, should its fixed fields pass the budget). */
static int plan_part(const rw_gen *g, const reply_extra *x, uint64_t budget, int *k, int *t,
                     piece *pl) {
    int np = 0;
    uint64_t bytes = HEAD_BYTES, elems = HEAD_ELEMS;
    while (*k < g->n) {
        const rw_output *o = g->outs[*k];
        uint64_t tb, te, fb, fe;
        per_token(g, o, &tb, &te);
        piece_fixed(o, true, x->text ? x->text_len[*k] : 0, &fb, &fe);
        const uint64_t left = (uint64_t)(o->n - *t);
        const uint64_t wb = fb + left * tb, we = fe + left * te;
        if (bytes + wb <= budget && elems + we <= PART_MAX_ELEMS) { /* the rest of it fits */
            pl[np++] = (piece){*k, *t, o->n, true, *t > 0};
            bytes += wb;
            elems += we;
            (*k)++;
            *t = 0;
            continue;
        }
        /* a whole output that fits an empty part goes there rather than being cut */
        if (np > 0 && *t == 0 && HEAD_BYTES + wb <= budget && HEAD_ELEMS + we <= PART_MAX_ELEMS)
            break;
        /* tokens of it that fit without its fixed fields, keeping at least one for its last
         * piece */
        uint64_t pb, pe;
        piece_fixed(o, false, 0, &pb, &pe);
        int64_t m = 0;
        if (bytes + pb < budget && elems + pe < PART_MAX_ELEMS) {
            const uint64_t mb = (budget - bytes - pb) / tb, me = (PART_MAX_ELEMS - elems - pe) / te;
            m = (int64_t)(mb < me ? mb : me);
        }
        if (m > (int64_t)left - 1) m = (int64_t)left - 1;
        if (m <= 0) {
            if (np > 0) break;                              /* the next part starts with it */
            pl[np++] = (piece){*k, *t, o->n, true, *t > 0}; /* too large for any part: alone */
            (*k)++;
            *t = 0;
            break;
        }
        pl[np++] = (piece){*k, *t, *t + (int)m, false, true};
        *t += (int)m;
        break;
    }
    return np;
}

/* Decodes every output's tokens into x->text (ids the tokenizer has no token for, beyond its
 * vocabulary in the model's embedding, are dropped); an output that fails to decode gets "". */
static rw_status decode_texts(rw_server *s, const rw_gen *g, reply_extra *x) {
    x->text = calloc((size_t)g->n, sizeof *x->text);
    x->text_len = calloc((size_t)g->n, sizeof *x->text_len);
    if (!x->text || !x->text_len) return RW_E_OOM;
    const uint32_t fl =
        RW_TOK_DECODE_SKIP_UNKNOWN | (g->skip_special ? RW_TOK_DECODE_SKIP_SPECIAL : 0);
    for (int k = 0; k < g->n; k++) {
        const rw_output *o = g->outs[k];
        rw_err e;
        if (rw_tok_decode(s->tokenizer, o->tokens, (size_t)o->n, fl, &x->text[k],
                          &x->text_len[k], &e) != RW_OK) {
            RW_LOGW("generate: decoding output %d: %s", k, e.msg);
            free(x->text[k]);
            x->text[k] = NULL;
            x->text_len[k] = 0;
        }
    }
    return RW_OK;
}

static void extra_free(reply_extra *x, int n) {
    if (x->text)
        for (int k = 0; k < n; k++)
            free(x->text[k]);
    free(x->text);
    free(x->text_len);
    free(x->offs);
}

void rw_srv_gen_final(rw_server *s, rw_gen *g) {
    uint64_t budget = s->o->max_reply_bytes ? s->o->max_reply_bytes : RW_MSG_MAX_BYTES / 2;
    if (budget > RW_MSG_MAX_BYTES) budget = RW_MSG_MAX_BYTES;
    reply_extra x = {0};
    piece *pl = malloc(sizeof *pl * ((size_t)g->n + 1));
    bool ok = pl != NULL;
    if (ok && g->return_text) ok = decode_texts(s, g, &x) == RW_OK;
    if (ok && g->routes) ok = (x.offs = calloc((size_t)g->n * 2, sizeof *x.offs)) != NULL;
    if (!ok) {
        rw_srv_reply_err(s, g->zm, g->req_id, RW_E_OOM, "generate: out of memory for the reply");
        goto out;
    }
    int k = 0, t = 0, parts = 0;
    do {
        const int np = plan_part(g, &x, budget, &k, &t, pl);
        const bool more = k < g->n;
        /* the routes of the outputs whose last piece is in this part (consecutive outputs) */
        int r0 = -1, r1 = -1;
        for (int i = 0; i < np; i++)
            if (pl[i].last) {
                if (r0 < 0) r0 = pl[i].k;
                r1 = pl[i].k + 1;
            }
        rw_sync_out_frame of = {0};
        rw_err e;
        if (rw_srv_routes_frame(s, g, r0, r1, x.offs, &of, &e) != RW_OK) {
            rw_srv_reply_err(s, g->zm, g->req_id, RW_E_OOM,
                             "generate: out of memory for the routes");
            goto out;
        }
        /* a result that fits one message keeps the one-message shape: {stream, outputs} */
        rw_mw *w = s->w;
        rw_mw_reset(w);
        rw_mw_reply_ok(w, g->req_id);
        rw_mw_map(w, more ? 3 : 2);
        rw_mw_kv_bool(w, "stream", false);
        if (more) rw_mw_kv_bool(w, "more", true);
        rw_mw_str(w, "outputs");
        rw_mw_array(w, (uint32_t)np);
        for (int i = 0; i < np; i++)
            write_piece(s, w, g, &x, &pl[i]);
        rw_srv_send(s, g->zm, w, of.data ? &of : NULL);
        free(of.data); /* NULL unless the send failed before ZeroMQ took it */
        parts++;
    } while (k < g->n);
    if (parts > 1)
        RW_LOGD("generate %llu: final reply in %d parts", (unsigned long long)g->req_id, parts);
out:
    free(pl);
    extra_free(&x, g->n);
}
