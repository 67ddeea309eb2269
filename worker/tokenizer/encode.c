/* encode.c - text -> ids: added tokens first, then NFC, the split regex (PCRE2 JIT), and BPE by
 * merge rank, with a cache of merged pieces. The order of steps is the contract in
 * rw_tokenizer.h; this file explains the how.
 *
 * BPE. A piece's bytes start as the ids of single bytes; the adjacent pair with the lowest merge
 * rank is merged (the leftmost of equal ranks, which only happens for the same pair twice) until
 * no pair has a rank. Short pieces (almost all of them) keep a rank per adjacent pair in an array
 * and rescan it: a few dozen integer compares beat a heap. Long pieces (a run of 10k spaces or
 * letters) use a binary heap of (rank, position) with lazy deletion, O(n log n), as `tokenizers`
 * does; the two give the same merges because both pick (lowest rank, leftmost position).
 *
 * Cache. Natural text repeats its pieces (" the", " of", "\n"), so a piece's ids are cached by
 * its bytes in a sharded table (internal.h): one hash and one short lock per piece.
 */
#include <stdlib.h>
#include <string.h>

#include "internal.h"

/* Pieces up to this many bytes use the rescan; longer ones the heap. */
#define BPE_SCAN_MAX 128

/* ------------------------------------------------------------------------------------------ */
/* Merge lookup                                                                                 */
/* ------------------------------------------------------------------------------------------ */
static inline bool merge_get(const rw_tok *t, int32_t a, int32_t b, uint32_t *rank, int32_t *id) {
    uint64_t key = (((uint64_t)(uint32_t)a << 32) | (uint32_t)b) + 1;
    size_t mask = t->merges_cap - 1;
    for (size_t i = (size_t)(key * 0x9e3779b97f4a7c15ull >> 20) & mask;; i = (i + 1) & mask) {
        const tok_merge_slot *s = &t->merges[i];
        if (s->key == key) {
            *rank = s->rank;
            *id = s->id;
            return true;
        }
        if (!s->key) return false;
    }
}

/* ------------------------------------------------------------------------------------------ */
/* Per-call scratch                                                                             */
/* ------------------------------------------------------------------------------------------ */
typedef struct enc_ctx {
    const rw_tok *t;
    uint32_t flags;
    rw_tok_ids *out;
    tok_buf norm; /* the NFC of the current section */
    pcre2_match_data *md;
    pcre2_match_context *mctx; /* with a heap JIT stack, made on first need */
    pcre2_jit_stack *jstack;
    int32_t *sym; /* BPE work arrays for long pieces */
    uint32_t *rk;
    int32_t *prev, *next;
    uint64_t *heap;
    size_t cap; /* of the arrays above, in elements */
    rw_err *err;
} enc_ctx;

static bool ids_push(rw_tok_ids *v, const int32_t *ids, size_t n) {
    if (v->n + n > v->cap) {
        size_t cap = v->cap ? v->cap : 256;
        while (cap < v->n + n)
            cap *= 2;
        int32_t *p = realloc(v->ids, cap * sizeof *p);
        if (!p) return false;
        v->ids = p;
        v->cap = cap;
    }
    memcpy(v->ids + v->n, ids, n * sizeof *ids);
    v->n += n;
    return true;
}

void rw_tok_ids_free(rw_tok_ids *v) {
    if (!v) return;
    free(v->ids);
    memset(v, 0, sizeof *v);
}

/* ------------------------------------------------------------------------------------------ */
/* Cache                                                                                        */
/* ------------------------------------------------------------------------------------------ */
void tok_cache_init(rw_tok *t) {
    for (int i = 0; i < TOK_CACHE_SHARDS; i++)
        pthread_mutex_init(&t->cache[i].mu, NULL);
}

static void shard_clear(tok_cache_shard *sh) {
    if (!sh->slots) return;
    for (size_t i = 0; i < TOK_CACHE_SLOTS; i++) {
        free(sh->slots[i]);
        sh->slots[i] = NULL;
    }
    sh->fill = 0;
}

void tok_cache_free(rw_tok *t) {
    for (int i = 0; i < TOK_CACHE_SHARDS; i++) {
        shard_clear(&t->cache[i]);
        free(t->cache[i].slots);
        pthread_mutex_destroy(&t->cache[i].mu);
    }
}

static inline const char *entry_key(const tok_cache_entry *e) {
    return (const char *)(e + 1);
}
static inline int32_t *entry_ids(tok_cache_entry *e) {
    return (int32_t *)((char *)(e + 1) + ((e->klen + 3u) & ~3u));
}

/* Appends the cached ids of piece s[0..n) to out; false on a miss (or OOM: *oom set). */
static bool cache_get(const rw_tok *t, const char *s, size_t n, uint64_t h, rw_tok_ids *out,
                      bool *oom) {
    tok_cache_shard *sh = (tok_cache_shard *)&t->cache[h >> 58]; /* the cache is the mutable part */
    bool hit = false;
    pthread_mutex_lock(&sh->mu);
    if (sh->slots) {
        for (size_t i = (size_t)h & (TOK_CACHE_SLOTS - 1);; i = (i + 1) & (TOK_CACHE_SLOTS - 1)) {
            tok_cache_entry *e = sh->slots[i];
            if (!e) break;
            if (e->hash == h && e->klen == n && !memcmp(entry_key(e), s, n)) {
                hit = true;
                if (!ids_push(out, entry_ids(e), e->nids)) *oom = true;
                break;
            }
        }
    }
    pthread_mutex_unlock(&sh->mu);
    return hit;
}

/* Best effort: a failed allocation just skips caching. */
static void cache_put(const rw_tok *t, const char *s, size_t n, uint64_t h, const int32_t *ids,
                      size_t nids) {
    tok_cache_shard *sh = (tok_cache_shard *)&t->cache[h >> 58];
    size_t kpad = (n + 3) & ~(size_t)3;
    tok_cache_entry *e = malloc(sizeof *e + kpad + nids * sizeof(int32_t));
    if (!e) return;
    e->hash = h;
    e->klen = (uint16_t)n;
    e->nids = (uint16_t)nids;
    memcpy((char *)(e + 1), s, n);
    memcpy(entry_ids(e), ids, nids * sizeof(int32_t));
    pthread_mutex_lock(&sh->mu);
    if (!sh->slots) sh->slots = calloc(TOK_CACHE_SLOTS, sizeof *sh->slots);
    if (!sh->slots) {
        pthread_mutex_unlock(&sh->mu);
        free(e);
        return;
    }
    if (sh->fill >= TOK_CACHE_MAX_FILL) shard_clear(sh);
    size_t i = (size_t)h & (TOK_CACHE_SLOTS - 1);
    for (;; i = (i + 1) & (TOK_CACHE_SLOTS - 1)) {
        tok_cache_entry *o = sh->slots[i];
        if (!o) break;
        if (o->hash == h && o->klen == n && !memcmp(entry_key(o), s, n)) { /* another thread won */
            pthread_mutex_unlock(&sh->mu);
            free(e);
            return;
        }
    }
    sh->slots[i] = e;
    sh->fill++;
    pthread_mutex_unlock(&sh->mu);
}

/* ------------------------------------------------------------------------------------------ */
/* BPE                                                                                          */
/* ------------------------------------------------------------------------------------------ */

/* Short pieces: ranks of adjacent pairs in rk[0..m-1), rescanned for the minimum. */
static size_t bpe_scan(const rw_tok *t, int32_t *sym, size_t m) {
    uint32_t rk[BPE_SCAN_MAX];
    int32_t nid[BPE_SCAN_MAX];
    for (size_t i = 0; i + 1 < m; i++)
        if (!merge_get(t, sym[i], sym[i + 1], &rk[i], &nid[i])) rk[i] = UINT32_MAX;
    while (m > 1) {
        uint32_t best = UINT32_MAX;
        size_t bi = 0;
        for (size_t i = 0; i + 1 < m; i++)
            if (rk[i] < best) {
                best = rk[i];
                bi = i;
            }
        if (best == UINT32_MAX) break;
        sym[bi] = nid[bi];
        /* drop symbol bi+1 and pair bi+1 */
        memmove(sym + bi + 1, sym + bi + 2, (m - bi - 2) * sizeof *sym);
        size_t npairs = bi + 3 <= m ? m - bi - 3 : 0; /* pairs after pair bi+1 */
        memmove(rk + bi + 1, rk + bi + 2, npairs * sizeof *rk);
        memmove(nid + bi + 1, nid + bi + 2, npairs * sizeof *nid);
        m--;
        if (bi > 0 && !merge_get(t, sym[bi - 1], sym[bi], &rk[bi - 1], &nid[bi - 1]))
            rk[bi - 1] = UINT32_MAX;
        if (bi + 1 < m && !merge_get(t, sym[bi], sym[bi + 1], &rk[bi], &nid[bi]))
            rk[bi] = UINT32_MAX;
    }
    return m;
}

static void heap_push(uint64_t *h, size_t *n, uint64_t v) {
    size_t i = (*n)++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (h[p] <= v) break;
        h[i] = h[p];
        i = p;
    }
    h[i] = v;
}

static uint64_t heap_pop(uint64_t *h, size_t *n) {
    uint64_t top = h[0], v = h[--(*n)];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= *n) break;
        if (c + 1 < *n && h[c + 1] < h[c]) c++;
        if (h[c] >= v) break;
        h[i] = h[c];
        i = c;
    }
    if (*n) h[i] = v;
    return top;
}

static bool enc_reserve(enc_ctx *c, size_t m) {
    if (m <= c->cap) return true;
    size_t cap = c->cap ? c->cap : 1024;
    while (cap < m)
        cap *= 2;
    int32_t *sym = realloc(c->sym, cap * sizeof *sym);
    if (sym) c->sym = sym;
    int32_t *pv = realloc(c->prev, cap * sizeof *pv);
    if (pv) c->prev = pv;
    int32_t *nx = realloc(c->next, cap * sizeof *nx);
    if (nx) c->next = nx;
    uint64_t *hp = realloc(c->heap, 2 * cap * sizeof *hp);
    if (hp) c->heap = hp;
    if (!sym || !pv || !nx || !hp) return false;
    c->cap = cap;
    return true;
}

/* Long pieces: linked list + heap of (rank << 32 | position); stale entries are skipped when the
 * pair at that position no longer has that rank. Result compacted into sym[0..return). */
static size_t bpe_heap(const rw_tok *t, enc_ctx *c, size_t m) {
    int32_t *sym = c->sym, *prev = c->prev, *next = c->next;
    uint64_t *h = c->heap;
    size_t hn = 0;
    for (size_t i = 0; i < m; i++) {
        prev[i] = (int32_t)i - 1;
        next[i] = i + 1 < m ? (int32_t)i + 1 : -1;
    }
    uint32_t r;
    int32_t id;
    for (size_t i = 0; i + 1 < m; i++)
        if (merge_get(t, sym[i], sym[i + 1], &r, &id)) heap_push(h, &hn, ((uint64_t)r << 32) | i);
    while (hn) {
        uint64_t top = heap_pop(h, &hn);
        uint32_t rank = (uint32_t)(top >> 32);
        int32_t pos = (int32_t)(top & 0xffffffffu);
        if (sym[pos] < 0 || next[pos] < 0) continue;
        int32_t nx = next[pos];
        if (!merge_get(t, sym[pos], sym[nx], &r, &id) || r != rank) continue; /* stale */
        sym[pos] = id;
        sym[nx] = -1;
        next[pos] = next[nx];
        if (next[nx] >= 0) prev[next[nx]] = pos;
        if (prev[pos] >= 0 && merge_get(t, sym[prev[pos]], sym[pos], &r, &id))
            heap_push(h, &hn, ((uint64_t)r << 32) | (uint32_t)prev[pos]);
        if (next[pos] >= 0 && merge_get(t, sym[pos], sym[next[pos]], &r, &id))
            heap_push(h, &hn, ((uint64_t)r << 32) | (uint32_t)pos);
    }
    size_t k = 0;
    for (int32_t i = 0; i >= 0; i = next[i])
        sym[k++] = sym[i];
    return k;
}

static rw_status bpe_piece(enc_ctx *c, const char *s, size_t n) {
    const rw_tok *t = c->t;
    const uint8_t *u = (const uint8_t *)s;
    if (n == 1) {
        if (!ids_push(c->out, &t->byte_id[u[0]], 1)) RW_FAIL(c->err, RW_E_OOM, "encode");
        return RW_OK;
    }
    if (t->ignore_merges) {
        int32_t id = tok_vocab_find(t, s, n);
        if (id >= 0) {
            if (!ids_push(c->out, &id, 1)) RW_FAIL(c->err, RW_E_OOM, "encode");
            return RW_OK;
        }
    }
    uint64_t h = 0;
    bool cacheable = n <= TOK_CACHE_MAX_PIECE, oom = false;
    if (cacheable) {
        h = tok_hash(s, n);
        if (cache_get(t, s, n, h, c->out, &oom)) {
            if (oom) RW_FAIL(c->err, RW_E_OOM, "encode");
            return RW_OK;
        }
    }
    size_t m;
    int32_t small[BPE_SCAN_MAX];
    int32_t *sym = small;
    if (n <= BPE_SCAN_MAX) {
        for (size_t i = 0; i < n; i++)
            small[i] = t->byte_id[u[i]];
        m = bpe_scan(t, small, n);
    } else {
        if (!enc_reserve(c, n)) RW_FAIL(c->err, RW_E_OOM, "encode: BPE of a %zu-byte piece", n);
        for (size_t i = 0; i < n; i++)
            c->sym[i] = t->byte_id[u[i]];
        m = bpe_heap(t, c, n);
        sym = c->sym;
    }
    if (!ids_push(c->out, sym, m)) RW_FAIL(c->err, RW_E_OOM, "encode");
    if (cacheable) cache_put(t, s, n, h, sym, m);
    return RW_OK;
}

/* ------------------------------------------------------------------------------------------ */
/* Pre-tokenization                                                                             */
/* ------------------------------------------------------------------------------------------ */
static int regex_match(enc_ctx *c, const char *s, size_t n, size_t from) {
    const rw_tok *t = c->t;
    int rc = pcre2_match(t->re, (PCRE2_SPTR)s, n, from, PCRE2_NO_UTF_CHECK, c->md, c->mctx);
    if (rc == PCRE2_ERROR_JIT_STACKLIMIT && !c->jstack) {
        /* the 32 KiB default machine stack was not enough: retry with a heap one */
        c->jstack = pcre2_jit_stack_create(64 * 1024, 64 * 1024 * 1024, NULL);
        c->mctx = pcre2_match_context_create(NULL);
        if (!c->jstack || !c->mctx) return PCRE2_ERROR_NOMEMORY;
        pcre2_jit_stack_assign(c->mctx, NULL, c->jstack);
        rc = pcre2_match(t->re, (PCRE2_SPTR)s, n, from, PCRE2_NO_UTF_CHECK, c->md, c->mctx);
    }
    return rc;
}

static rw_status split_and_bpe(enc_ctx *c, const char *s, size_t n) {
    const rw_tok *t = c->t;
    if (n == 0) return RW_OK;
    if (!t->re) return bpe_piece(c, s, n);
    size_t pos = 0, gap = 0; /* s[gap..) not yet emitted */
    while (pos < n) {
        int rc = regex_match(c, s, n, pos);
        if (rc == PCRE2_ERROR_NOMATCH) break;
        if (rc < 0) {
            PCRE2_UCHAR msg[256];
            pcre2_get_error_message(rc, msg, sizeof msg);
            RW_FAIL(c->err, rc == PCRE2_ERROR_NOMEMORY ? RW_E_OOM : RW_E_INTERNAL,
                    "encode: the split regex failed at byte %zu: %s", pos, (const char *)msg);
        }
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(c->md);
        size_t ms = ov[0], me = ov[1];
        if (me == ms) { /* an empty match splits nothing: step over one character */
            size_t l = tok_utf8_valid_len((const uint8_t *)s + me, n - me, NULL);
            pos = me + (l ? l : 1);
            continue;
        }
        if (ms > gap) RW_CHECK(bpe_piece(c, s + gap, ms - gap));
        if (!t->re_removed) RW_CHECK(bpe_piece(c, s + ms, me - ms));
        gap = pos = me;
    }
    if (gap < n) RW_CHECK(bpe_piece(c, s + gap, n - gap));
    return RW_OK;
}

/* ------------------------------------------------------------------------------------------ */
/* Added tokens                                                                                 */
/* ------------------------------------------------------------------------------------------ */

/* The next added token (kind mask 1 = raw-matched, 2 = normalized-matched) in s[from..n),
 * leftmost then longest, with its span widened by lstrip/rstrip (never left of `floor`). Returns
 * false when there is none. */
static bool find_added(enc_ctx *c, const char *s, size_t n, size_t from, size_t floor, int mask,
                       size_t *ms, size_t *me, int32_t *id) {
    const rw_tok *t = c->t;
    const uint8_t *u = (const uint8_t *)s;
    for (size_t i = from; i < n; i++) {
        if (!(t->added_first[u[i]] & mask)) continue;
        const tok_added *best = NULL;
        for (int k = 0; k < t->n_added; k++) {
            const tok_added *a = &t->added[k];
            if ((a->normalized ? 2 : 1) != mask) continue;
            if (a->special && (c->flags & RW_TOK_ENCODE_SPLIT_SPECIAL)) continue;
            if (a->len > n - i || (best && a->len <= best->len)) continue;
            if (memcmp(t->pool.p + a->off, s + i, a->len)) continue;
            best = a;
        }
        if (!best) continue;
        size_t st = i, en = i + best->len;
        if (best->single_word) {
            /* a word character right before or after: not this token; `tokenizers` then resumes
             * the search after it */
            size_t l;
            bool wb = st > 0 && tok_is_word_char(tok_utf8_last_cp(u, st, &l));
            bool wa = en < n && tok_is_word_char(tok_utf8_first_cp(u + en, n - en, &l));
            if (wb || wa) {
                i = en - 1;
                continue;
            }
        }
        if (best->lstrip)
            while (st > floor) {
                size_t l;
                uint32_t cp = tok_utf8_last_cp(u + floor, st - floor, &l);
                if (!tok_is_white_space(cp)) break;
                st -= l;
            }
        if (best->rstrip)
            while (en < n) {
                size_t l;
                uint32_t cp = tok_utf8_first_cp(u + en, n - en, &l);
                if (!l || !tok_is_white_space(cp)) break;
                en += l;
            }
        *ms = st;
        *me = en;
        *id = best->id;
        return true;
    }
    return false;
}

/* Text between raw-matched added tokens: NFC, then normalized added tokens, then split + BPE. */
static rw_status encode_section(enc_ctx *c, const char *s, size_t n) {
    const rw_tok *t = c->t;
    if (n == 0) return RW_OK;
    if (t->nfc) {
        c->norm.n = 0;
        RW_CHECK(tok_nfc_append(&c->norm, s, n, c->err));
        s = c->norm.p;
        n = c->norm.n;
    }
    if (!t->any_normalized_added) return split_and_bpe(c, s, n);
    size_t from = 0, ms, me;
    int32_t id;
    while (find_added(c, s, n, from, from, 2, &ms, &me, &id)) {
        RW_CHECK(split_and_bpe(c, s + from, ms - from));
        if (!ids_push(c->out, &id, 1)) RW_FAIL(c->err, RW_E_OOM, "encode");
        from = me;
    }
    return split_and_bpe(c, s + from, n - from);
}

rw_status rw_tok_encode(const rw_tok *t, const char *text, size_t len, uint32_t flags,
                        rw_tok_ids *out, rw_err *err) {
    if (!t || (!text && len) || !out)
        RW_FAIL(err, RW_E_INVALID_ARG, "rw_tok_encode: NULL argument");
    size_t n0 = out->n;
    enc_ctx c = {.t = t, .flags = flags, .out = out, .err = err};
    tok_buf fixed = {0};
    rw_status st = RW_OK;
    if (len && !tok_utf8_is_valid((const uint8_t *)text, len)) {
        if (!tok_utf8_lossy(&fixed, (const uint8_t *)text, len)) {
            st = RW_ERR(err, RW_E_OOM, "encode: repairing %zu bytes", len);
            goto done;
        }
        text = fixed.p;
        len = fixed.n;
    }
    if (t->re) {
        c.md = pcre2_match_data_create_from_pattern(t->re, NULL);
        if (!c.md) {
            st = RW_ERR(err, RW_E_OOM, "encode: regex match data");
            goto done;
        }
    }
    size_t from = 0, ms, me;
    int32_t id;
    while (find_added(&c, text, len, from, from, 1, &ms, &me, &id)) {
        RW_CHECKGOTO(encode_section(&c, text + from, ms - from), st, done);
        if (!ids_push(out, &id, 1)) {
            st = RW_ERR(err, RW_E_OOM, "encode");
            goto done;
        }
        from = me;
    }
    st = encode_section(&c, text + from, len - from);
done:
    if (st != RW_OK) out->n = n0;
    tok_buf_free(&fixed);
    tok_buf_free(&c.norm);
    if (c.md) pcre2_match_data_free(c.md);
    if (c.mctx) pcre2_match_context_free(c.mctx);
    if (c.jstack) pcre2_jit_stack_free(c.jstack);
    free(c.sym);
    free(c.prev);
    free(c.next);
    free(c.heap);
    return st;
}
