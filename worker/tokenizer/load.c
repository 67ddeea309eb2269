/* load.c - reads tokenizer.json (+ tokenizer_config.json) into the tables of internal.h, and the
 * small read-only accessors of a loaded rw_tok.
 *
 * Every refusal names the file and the field ("tokenizer.json: model.merges[17]: ..."), because
 * the person reading it has a 11 MB file in front of them. Components rw does not implement are
 * RW_E_UNSUPPORTED rather than silently ignored: a tokenizer that quietly differs from the
 * trainer's is worse than none.
 */
#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "internal.h"

/* The ByteLevel alphabet (GPT-2's bytes_to_unicode): printable Latin-1 bytes stand for
 * themselves, the other 68 bytes for U+0100 + k in byte order. */
static void byte_level_alphabet(uint32_t byte_cp[256]) {
    int k = 0;
    for (int b = 0; b < 256; b++) {
        bool printable = (b >= '!' && b <= '~') || (b >= 0xa1 && b <= 0xac) || (b >= 0xae);
        byte_cp[b] = printable ? (uint32_t)b : 0x100u + (uint32_t)k++;
    }
}

typedef struct load_ctx {
    rw_tok *t;
    const char *file; /* short name for messages: "tokenizer.json" */
    const char *path;
    int16_t cp_byte[0x144]; /* inverse of the alphabet; -1 = not a byte-level character */
} load_ctx;

/* Appends s[0..n) to the pool; *off = where it starts. */
static bool pool_put(rw_tok *t, const void *s, size_t n, uint32_t *off) {
    if (t->pool.n + n >= UINT32_MAX) return false;
    *off = (uint32_t)t->pool.n;
    return tok_buf_put(&t->pool, s, n);
}

static size_t pow2_at_least(size_t n) {
    size_t c = 16;
    while (c < n)
        c *= 2;
    return c;
}

int32_t tok_vocab_find(const rw_tok *t, const char *s, size_t n) {
    if (!t->vocab) return -1;
    uint64_t h = tok_hash(s, n);
    size_t mask = t->vocab_cap - 1;
    for (size_t i = (size_t)h & mask;; i = (i + 1) & mask) {
        const tok_str_slot *sl = &t->vocab[i];
        if (sl->id < 0) return -1;
        if (sl->hash == h && t->len[sl->id] == n && !memcmp(t->pool.p + t->off[sl->id], s, n))
            return sl->id;
    }
}

static void vocab_insert(rw_tok *t, int32_t id) {
    const char *s = t->pool.p + t->off[id];
    size_t n = t->len[id];
    uint64_t h = tok_hash(s, n);
    size_t mask = t->vocab_cap - 1;
    size_t i = (size_t)h & mask;
    while (t->vocab[i].id >= 0)
        i = (i + 1) & mask;
    t->vocab[i].hash = h;
    t->vocab[i].id = id;
}

static void merge_insert(rw_tok *t, int32_t a, int32_t b, uint32_t rank, int32_t id) {
    uint64_t key = (((uint64_t)(uint32_t)a << 32) | (uint32_t)b) + 1;
    size_t mask = t->merges_cap - 1;
    size_t i = (size_t)(key * 0x9e3779b97f4a7c15ull >> 20) & mask;
    while (t->merges[i].key && t->merges[i].key != key)
        i = (i + 1) & mask;
    /* a repeated pair keeps its last rank, as both reference implementations do */
    t->merges[i].key = key;
    t->merges[i].rank = rank;
    t->merges[i].id = id;
}

/* Byte-level characters of a vocab string -> bytes, into buf (cap >= strlen). */
static rw_status byte_level_decode(load_ctx *c, const char *s, size_t n, char *buf, size_t *out,
                                   const char *field, rw_err *err) {
    size_t k = 0;
    for (size_t i = 0; i < n;) {
        uint32_t cp = 0;
        size_t l = tok_utf8_valid_len((const uint8_t *)s + i, n - i, &cp);
        if (!l) RW_FAIL(err, RW_E_FORMAT, "%s: %s: \"%s\" is not valid UTF-8", c->path, field, s);
        if (cp >= 0x144 || c->cp_byte[cp] < 0)
            RW_FAIL(err, RW_E_FORMAT,
                    "%s: %s: \"%s\" holds U+%04X, which is not a ByteLevel character (is the "
                    "model byte-level BPE?)",
                    c->path, field, s, cp);
        buf[k++] = (char)c->cp_byte[cp];
        i += l;
    }
    *out = k;
    return RW_OK;
}

static bool json_flag(json_t *o, const char *key, bool dflt) {
    json_t *v = json_object_get(o, key);
    return json_is_boolean(v) ? json_is_true(v) : dflt;
}

/* A field that must be null, absent, or one of the harmless values. */
static rw_status want_null_or(load_ctx *c, json_t *o, const char *obj, const char *key,
                              const char *allowed_str, rw_err *err) {
    json_t *v = json_object_get(o, key);
    if (!v || json_is_null(v)) return RW_OK;
    if (json_is_false(v) && !allowed_str) return RW_OK;
    if (allowed_str && json_is_string(v) && !strcmp(json_string_value(v), allowed_str))
        return RW_OK;
    char *txt = json_dumps(v, JSON_ENCODE_ANY | JSON_COMPACT);
    rw_err_set(err, RW_E_UNSUPPORTED, __FILE__, __LINE__, "%s: %s.%s = %s is not supported",
               c->path, obj, key, txt ? txt : "?");
    free(txt);
    return RW_E_UNSUPPORTED;
}

static rw_status load_model(load_ctx *c, json_t *root, rw_err *err) {
    rw_tok *t = c->t;
    json_t *model = json_object_get(root, "model");
    if (!json_is_object(model))
        RW_FAIL(err, RW_E_FORMAT, "%s: model: missing or not an object", c->path);
    json_t *type = json_object_get(model, "type");
    if (type && (!json_is_string(type) || strcmp(json_string_value(type), "BPE")))
        RW_FAIL(err, RW_E_UNSUPPORTED, "%s: model.type = %s: only BPE is supported", c->path,
                json_is_string(type) ? json_string_value(type) : "(not a string)");
    RW_CHECK(want_null_or(c, model, "model", "dropout", NULL, err));
    RW_CHECK(want_null_or(c, model, "model", "unk_token", NULL, err));
    RW_CHECK(want_null_or(c, model, "model", "byte_fallback", NULL, err));
    RW_CHECK(want_null_or(c, model, "model", "continuing_subword_prefix", "", err));
    RW_CHECK(want_null_or(c, model, "model", "end_of_word_suffix", "", err));
    t->ignore_merges = json_flag(model, "ignore_merges", false);

    json_t *vocab = json_object_get(model, "vocab");
    if (!json_is_object(vocab))
        RW_FAIL(err, RW_E_FORMAT, "%s: model.vocab: missing or not an object", c->path);
    json_t *merges = json_object_get(model, "merges");
    if (!json_is_array(merges))
        RW_FAIL(err, RW_E_FORMAT, "%s: model.merges: missing or not an array", c->path);
    json_t *added = json_object_get(root, "added_tokens");
    if (added && !json_is_array(added) && !json_is_null(added))
        RW_FAIL(err, RW_E_FORMAT, "%s: added_tokens: not an array", c->path);

    /* id space: the largest id of the vocab and of the added tokens */
    int64_t max_id = -1;
    const char *key;
    json_t *v;
    json_object_foreach(vocab, key, v) {
        if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) >= (1 << 24))
            RW_FAIL(err, RW_E_FORMAT, "%s: model.vocab[\"%s\"]: id must be an integer in [0, 2^24)",
                    c->path, key);
        if (json_integer_value(v) > max_id) max_id = json_integer_value(v);
    }
    size_t nadd = added ? json_array_size(added) : 0;
    for (size_t i = 0; i < nadd; i++) {
        json_t *a = json_array_get(added, i);
        json_t *id = json_object_get(a, "id"), *content = json_object_get(a, "content");
        if (!json_is_object(a) || !json_is_integer(id) || json_integer_value(id) < 0 ||
            json_integer_value(id) >= (1 << 24))
            RW_FAIL(err, RW_E_FORMAT,
                    "%s: added_tokens[%zu].id: missing or not an integer in [0, 2^24)", c->path, i);
        if (!json_is_string(content) || json_string_length(content) == 0)
            RW_FAIL(err, RW_E_FORMAT, "%s: added_tokens[%zu].content: missing or empty", c->path,
                    i);
        if (json_integer_value(id) > max_id) max_id = json_integer_value(id);
    }
    if (max_id < 0) RW_FAIL(err, RW_E_FORMAT, "%s: model.vocab: empty", c->path);
    t->n_ids = (int32_t)(max_id + 1);
    t->kind = calloc((size_t)t->n_ids, 1);
    t->off = calloc((size_t)t->n_ids, sizeof *t->off);
    t->len = calloc((size_t)t->n_ids, sizeof *t->len);
    size_t nvocab = json_object_size(vocab);
    t->vocab_cap = pow2_at_least(nvocab * 2);
    t->vocab = malloc(t->vocab_cap * sizeof *t->vocab);
    if (!t->kind || !t->off || !t->len || !t->vocab) RW_FAIL(err, RW_E_OOM, "tokenizer tables");
    for (size_t i = 0; i < t->vocab_cap; i++)
        t->vocab[i].id = -1;

    char buf[1024];
    json_object_foreach(vocab, key, v) {
        int32_t id = (int32_t)json_integer_value(v);
        size_t klen = strlen(key), blen;
        if (klen >= sizeof buf)
            RW_FAIL(err, RW_E_FORMAT, "%s: model.vocab: token of %zu bytes is too long", c->path,
                    klen);
        char field[64];
        snprintf(field, sizeof field, "model.vocab (id %d)", id);
        RW_CHECK(byte_level_decode(c, key, klen, buf, &blen, field, err));
        if (t->kind[id] != TK_NONE)
            RW_FAIL(err, RW_E_FORMAT, "%s: model.vocab: id %d is given to two tokens", c->path, id);
        if (tok_vocab_find(t, buf, blen) >= 0)
            RW_FAIL(err, RW_E_FORMAT, "%s: model.vocab: \"%s\" appears twice", c->path, key);
        if (!pool_put(t, buf, blen, &t->off[id])) RW_FAIL(err, RW_E_OOM, "tokenizer pool");
        t->len[id] = (uint32_t)blen;
        t->kind[id] = TK_BPE;
        vocab_insert(t, id);
    }
    for (int b = 0; b < 256; b++) {
        char ch = (char)b;
        t->byte_id[b] = tok_vocab_find(t, &ch, 1);
        if (t->byte_id[b] < 0)
            RW_FAIL(err, RW_E_FORMAT,
                    "%s: model.vocab: no token for byte 0x%02x (a byte-level BPE needs all 256)",
                    c->path, b);
    }

    size_t nm = json_array_size(merges);
    t->merges_cap = pow2_at_least(nm * 2 + 2);
    t->merges = calloc(t->merges_cap, sizeof *t->merges);
    if (!t->merges) RW_FAIL(err, RW_E_OOM, "merge table");
    char bb[1024];
    for (size_t i = 0; i < nm; i++) {
        json_t *m = json_array_get(merges, i);
        const char *l = NULL, *r = NULL;
        size_t ll = 0, rl = 0;
        if (json_is_string(m)) { /* "a b" (tokenizers < 0.20) */
            const char *s = json_string_value(m);
            const char *sp = strchr(s, ' ');
            if (sp && sp != s && sp[1] && !strchr(sp + 1, ' ')) {
                l = s;
                ll = (size_t)(sp - s);
                r = sp + 1;
                rl = strlen(r);
            }
        } else if (json_is_array(m) && json_array_size(m) == 2 &&
                   json_is_string(json_array_get(m, 0)) && json_is_string(json_array_get(m, 1))) {
            l = json_string_value(json_array_get(m, 0));
            ll = json_string_length(json_array_get(m, 0));
            r = json_string_value(json_array_get(m, 1));
            rl = json_string_length(json_array_get(m, 1));
        }
        if (!l || !ll || !rl || ll >= sizeof buf / 2 || rl >= sizeof buf / 2)
            RW_FAIL(err, RW_E_FORMAT, "%s: model.merges[%zu]: not a pair of tokens", c->path, i);
        char field[64];
        snprintf(field, sizeof field, "model.merges[%zu]", i);
        size_t la, lb;
        RW_CHECK(byte_level_decode(c, l, ll, buf, &la, field, err));
        RW_CHECK(byte_level_decode(c, r, rl, bb, &lb, field, err));
        int32_t a = tok_vocab_find(t, buf, la), b = tok_vocab_find(t, bb, lb);
        memcpy(buf + la, bb, lb);
        int32_t ab = tok_vocab_find(t, buf, la + lb);
        if (a < 0 || b < 0 || ab < 0)
            RW_FAIL(err, RW_E_FORMAT,
                    "%s: model.merges[%zu]: \"%.*s\" + \"%.*s\": %s is not in model.vocab", c->path,
                    i, (int)ll, l, (int)rl, r,
                    a < 0   ? "the left token"
                    : b < 0 ? "the right token"
                            : "the merged token");
        merge_insert(t, a, b, (uint32_t)i, ab);
    }

    /* added tokens: content verbatim for decode; matched before the BPE */
    t->added = calloc(nadd ? nadd : 1, sizeof *t->added);
    if (!t->added) RW_FAIL(err, RW_E_OOM, "added tokens");
    for (size_t i = 0; i < nadd; i++) {
        json_t *a = json_array_get(added, i);
        int32_t id = (int32_t)json_integer_value(json_object_get(a, "id"));
        json_t *content = json_object_get(a, "content");
        const char *s = json_string_value(content);
        size_t n = json_string_length(content);
        if (!tok_utf8_is_valid((const uint8_t *)s, n) || memchr(s, 0, n))
            RW_FAIL(err, RW_E_FORMAT, "%s: added_tokens[%zu].content: not valid UTF-8 text",
                    c->path, i);
        tok_added *ad = &t->added[t->n_added];
        for (int k = 0; k < t->n_added; k++)
            if (t->added[k].id == id)
                RW_FAIL(err, RW_E_FORMAT, "%s: added_tokens[%zu]: id %d appears twice", c->path, i,
                        id);
        ad->id = id;
        ad->special = json_flag(a, "special", false);
        ad->lstrip = json_flag(a, "lstrip", false);
        ad->rstrip = json_flag(a, "rstrip", false);
        ad->single_word = json_flag(a, "single_word", false);
        /* `tokenizers` defaults normalized to !special */
        ad->normalized = json_flag(a, "normalized", !ad->special);
        if (t->kind[id] == TK_BPE) {
            /* an added token that is also a BPE token: fine when both decode to the same bytes
             * (the BPE lookup tables keep working), otherwise the id would mean two things */
            if (t->len[id] != n || memcmp(t->pool.p + t->off[id], s, n))
                RW_FAIL(err, RW_E_UNSUPPORTED,
                        "%s: added_tokens[%zu]: id %d is also the BPE token of other bytes",
                        c->path, i, id);
        } else if (!pool_put(t, s, n, &t->off[id])) {
            RW_FAIL(err, RW_E_OOM, "tokenizer pool");
        }
        t->len[id] = (uint32_t)n;
        t->kind[id] = ad->special ? TK_SPECIAL : TK_ADDED;
        ad->off = t->off[id];
        ad->len = t->len[id];
        if (ad->normalized && t->nfc) { /* matched in normalized text: normalize it too */
            tok_buf nb = {0};
            rw_status st = tok_nfc_append(&nb, s, n, err);
            if (st == RW_OK && !pool_put(t, nb.p, nb.n, &ad->off))
                st = RW_ERR(err, RW_E_OOM, "pool");
            ad->len = (uint32_t)nb.n;
            tok_buf_free(&nb);
            RW_CHECK(st);
        }
        t->added_first[(uint8_t)t->pool.p[ad->off]] |= ad->normalized ? 2 : 1;
        t->any_normalized_added |= ad->normalized;
        t->n_added++;
    }
    return RW_OK;
}

static rw_status load_normalizer(load_ctx *c, json_t *root, rw_err *err) {
    json_t *n = json_object_get(root, "normalizer");
    if (!n || json_is_null(n)) return RW_OK;
    const char *type = json_string_value(json_object_get(n, "type"));
    if (type && !strcmp(type, "NFC")) {
        c->t->nfc = true;
        return RW_OK;
    }
    if (type && !strcmp(type, "Sequence")) {
        json_t *list = json_object_get(n, "normalizers");
        size_t k = json_array_size(list);
        if (k == 0) return RW_OK;
        const char *t0 = json_string_value(json_object_get(json_array_get(list, 0), "type"));
        if (k == 1 && t0 && !strcmp(t0, "NFC")) {
            c->t->nfc = true;
            return RW_OK;
        }
    }
    RW_FAIL(err, RW_E_UNSUPPORTED, "%s: normalizer.type = %s: only NFC (or none) is supported",
            c->path, type ? type : "(missing)");
}

/* GPT-2's split, used by a ByteLevel pre-tokenizer with use_regex=true. */
static const char GPT2_SPLIT[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

static rw_status compile_regex(load_ctx *c, const char *pattern, const char *field, rw_err *err) {
    int ec;
    PCRE2_SIZE eo;
    /* UTF + UCP: \s, \p{L}, \p{N} mean what they mean in Unicode. NO_UTF_CHECK at match time:
     * encode only hands valid UTF-8 to the regex. */
    pcre2_code *re = pcre2_compile((PCRE2_SPTR)pattern, PCRE2_ZERO_TERMINATED,
                                   PCRE2_UTF | PCRE2_UCP, &ec, &eo, NULL);
    if (!re) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(ec, msg, sizeof msg);
        RW_FAIL(err, RW_E_UNSUPPORTED, "%s: %s: PCRE2 cannot compile it at offset %zu: %s", c->path,
                field, (size_t)eo, (const char *)msg);
    }
    c->t->re = re;
    c->t->jit = pcre2_jit_compile(re, PCRE2_JIT_COMPLETE) == 0;
    if (!c->t->jit) RW_LOGW("tokenizer: PCRE2 JIT unavailable, the split regex runs interpreted");
    return RW_OK;
}

static rw_status load_byte_level(load_ctx *c, json_t *p, const char *field, bool first,
                                 rw_err *err) {
    char f[96];
    snprintf(f, sizeof f, "%s", field);
    if (json_flag(p, "add_prefix_space", false))
        RW_FAIL(err, RW_E_UNSUPPORTED, "%s: %s.add_prefix_space = true is not supported", c->path,
                f);
    if (json_flag(p, "use_regex", true)) {
        if (!first || c->t->re)
            RW_FAIL(err, RW_E_UNSUPPORTED, "%s: %s.use_regex = true after a Split is not supported",
                    c->path, f);
        snprintf(f, sizeof f, "%s (GPT-2 split)", field);
        return compile_regex(c, GPT2_SPLIT, f, err);
    }
    return RW_OK;
}

static rw_status load_pre_tokenizer(load_ctx *c, json_t *root, rw_err *err) {
    json_t *p = json_object_get(root, "pre_tokenizer");
    if (!json_is_object(p))
        RW_FAIL(err, RW_E_UNSUPPORTED,
                "%s: pre_tokenizer: missing (a byte-level BPE needs ByteLevel)", c->path);
    const char *type = json_string_value(json_object_get(p, "type"));
    if (type && !strcmp(type, "ByteLevel"))
        return load_byte_level(c, p, "pre_tokenizer", true, err);
    if (!type || strcmp(type, "Sequence"))
        RW_FAIL(err, RW_E_UNSUPPORTED, "%s: pre_tokenizer.type = %s is not supported", c->path,
                type ? type : "(missing)");
    json_t *list = json_object_get(p, "pretokenizers");
    size_t n = json_array_size(list);
    bool have_bl = false;
    for (size_t i = 0; i < n; i++) {
        json_t *e = json_array_get(list, i);
        const char *et = json_string_value(json_object_get(e, "type"));
        char field[64];
        snprintf(field, sizeof field, "pre_tokenizer.pretokenizers[%zu]", i);
        if (et && !strcmp(et, "ByteLevel")) {
            if (i + 1 != n)
                RW_FAIL(err, RW_E_UNSUPPORTED, "%s: %s: ByteLevel must come last", c->path, field);
            RW_CHECK(load_byte_level(c, e, field, i == 0, err));
            have_bl = true;
        } else if (et && !strcmp(et, "Split")) {
            if (c->t->re)
                RW_FAIL(err, RW_E_UNSUPPORTED, "%s: %s: only one Split is supported", c->path,
                        field);
            const char *rx =
                json_string_value(json_object_get(json_object_get(e, "pattern"), "Regex"));
            if (!rx)
                RW_FAIL(err, RW_E_UNSUPPORTED, "%s: %s.pattern: only {\"Regex\": ...} is supported",
                        c->path, field);
            const char *beh = json_string_value(json_object_get(e, "behavior"));
            if (!beh || (strcmp(beh, "Isolated") && strcmp(beh, "Removed")))
                RW_FAIL(err, RW_E_UNSUPPORTED, "%s: %s.behavior = %s: Isolated or Removed only",
                        c->path, field, beh ? beh : "(missing)");
            if (json_flag(e, "invert", false))
                RW_FAIL(err, RW_E_UNSUPPORTED, "%s: %s.invert = true is not supported", c->path,
                        field);
            char f2[96];
            snprintf(f2, sizeof f2, "%s.pattern.Regex", field);
            RW_CHECK(compile_regex(c, rx, f2, err));
            c->t->re_removed = !strcmp(beh, "Removed");
        } else {
            RW_FAIL(err, RW_E_UNSUPPORTED, "%s: %s.type = %s is not supported", c->path, field,
                    et ? et : "(missing)");
        }
    }
    if (!have_bl)
        RW_FAIL(err, RW_E_UNSUPPORTED,
                "%s: pre_tokenizer: no ByteLevel step (only byte-level BPE is supported)", c->path);
    return RW_OK;
}

static rw_status load_decoder_post(load_ctx *c, json_t *root, rw_err *err) {
    static const char *keys[] = {"decoder", "post_processor"};
    for (int k = 0; k < 2; k++) {
        json_t *d = json_object_get(root, keys[k]);
        if (!d || json_is_null(d)) continue;
        const char *type = json_string_value(json_object_get(d, "type"));
        if (!type || strcmp(type, "ByteLevel"))
            RW_FAIL(err, RW_E_UNSUPPORTED,
                    "%s: %s.type = %s: only ByteLevel (or none) is supported", c->path, keys[k],
                    type ? type : "(missing)");
    }
    return RW_OK;
}

static rw_status read_json(const char *path, json_t **out, rw_err *err) {
    json_error_t je;
    json_t *j = json_load_file(path, 0, &je);
    if (!j) {
        struct stat st;
        if (stat(path, &st) != 0)
            RW_FAIL(err, RW_E_IO, "%s: cannot open: %s", path, strerror(errno));
        RW_FAIL(err, RW_E_FORMAT, "%s: not valid JSON: line %d column %d: %s", path, je.line,
                je.column, je.text);
    }
    if (!json_is_object(j)) {
        json_decref(j);
        RW_FAIL(err, RW_E_FORMAT, "%s: the top level is not a JSON object", path);
    }
    *out = j;
    return RW_OK;
}

/* eos_token etc.: a string or an AddedToken object {"content": ...}; null or absent -> -1. */
static rw_status config_token(load_ctx *c, json_t *cfg, const char *key, int32_t *out,
                              rw_err *err) {
    *out = -1;
    json_t *v = json_object_get(cfg, key);
    if (!v || json_is_null(v)) return RW_OK;
    if (json_is_object(v)) v = json_object_get(v, "content");
    if (!json_is_string(v))
        RW_FAIL(err, RW_E_FORMAT, "%s: %s: not a string or {\"content\": string}", c->path, key);
    if (rw_tok_token_id(c->t, json_string_value(v), json_string_length(v), out, NULL) != RW_OK)
        RW_FAIL(err, RW_E_FORMAT, "%s: %s = \"%s\" is not a token of tokenizer.json", c->path, key,
                json_string_value(v));
    return RW_OK;
}

rw_status rw_tok_load_files(const char *tokenizer_json, const char *config_json, rw_tok **out,
                            rw_err *err) {
    if (!tokenizer_json || !out) RW_FAIL(err, RW_E_INVALID_ARG, "rw_tok_load_files: NULL argument");
    *out = NULL;
    rw_tok *t = calloc(1, sizeof *t);
    if (!t) RW_FAIL(err, RW_E_OOM, "rw_tok");
    tok_cache_init(t);
    t->eos_id = t->pad_id = t->bos_id = -1;
    load_ctx c = {.t = t, .path = tokenizer_json};
    uint32_t byte_cp[256];
    byte_level_alphabet(byte_cp);
    memset(c.cp_byte, 0xff, sizeof c.cp_byte);
    for (int b = 0; b < 256; b++)
        c.cp_byte[byte_cp[b]] = (int16_t)b;

    json_t *root = NULL, *cfg = NULL;
    rw_status st;
    RW_CHECKGOTO(read_json(tokenizer_json, &root, err), st, fail);
    /* the normalizer first: normalized added tokens are stored normalized */
    RW_CHECKGOTO(load_normalizer(&c, root, err), st, fail);
    RW_CHECKGOTO(load_model(&c, root, err), st, fail);
    RW_CHECKGOTO(load_pre_tokenizer(&c, root, err), st, fail);
    RW_CHECKGOTO(load_decoder_post(&c, root, err), st, fail);
    json_decref(root);
    root = NULL;
    if (config_json) {
        c.path = config_json;
        RW_CHECKGOTO(read_json(config_json, &cfg, err), st, fail);
        RW_CHECKGOTO(config_token(&c, cfg, "eos_token", &t->eos_id, err), st, fail);
        RW_CHECKGOTO(config_token(&c, cfg, "pad_token", &t->pad_id, err), st, fail);
        RW_CHECKGOTO(config_token(&c, cfg, "bos_token", &t->bos_id, err), st, fail);
        json_t *ct = json_object_get(cfg, "chat_template");
        t->has_chat_template = json_is_string(ct) || (json_is_array(ct) && json_array_size(ct));
        json_decref(cfg);
    }
    *out = t;
    return RW_OK;
fail:
    json_decref(root);
    json_decref(cfg);
    rw_tok_destroy(t);
    return st;
}

rw_status rw_tok_load(const char *dir, rw_tok **out, rw_err *err) {
    if (!dir || !out) RW_FAIL(err, RW_E_INVALID_ARG, "rw_tok_load: NULL argument");
    size_t n = strlen(dir) + 32;
    char *tj = malloc(n), *cj = malloc(n);
    if (!tj || !cj) {
        free(tj);
        free(cj);
        RW_FAIL(err, RW_E_OOM, "paths");
    }
    snprintf(tj, n, "%s/tokenizer.json", dir);
    snprintf(cj, n, "%s/tokenizer_config.json", dir);
    struct stat st;
    bool have_cfg = stat(cj, &st) == 0;
    rw_status s = rw_tok_load_files(tj, have_cfg ? cj : NULL, out, err);
    free(tj);
    free(cj);
    return s;
}

void rw_tok_destroy(rw_tok *t) {
    if (!t) return;
    tok_cache_free(t);
    free(t->kind);
    free(t->off);
    free(t->len);
    tok_buf_free(&t->pool);
    free(t->vocab);
    free(t->merges);
    free(t->added);
    if (t->re) pcre2_code_free(t->re);
    free(t);
}

int32_t rw_tok_id_end(const rw_tok *t) {
    return t ? t->n_ids : 0;
}

rw_status rw_tok_token(const rw_tok *t, int32_t id, const char **bytes, size_t *len, rw_err *err) {
    if (!t || !bytes || !len) RW_FAIL(err, RW_E_INVALID_ARG, "rw_tok_token: NULL argument");
    if (id < 0 || id >= t->n_ids || t->kind[id] == TK_NONE)
        RW_FAIL(err, RW_E_RANGE, "token id %d has no token (ids are 0..%d)", id, t->n_ids - 1);
    *bytes = t->pool.p + t->off[id];
    *len = t->len[id];
    return RW_OK;
}

rw_status rw_tok_token_id(const rw_tok *t, const char *bytes, size_t len, int32_t *id,
                          rw_err *err) {
    if (!t || (!bytes && len) || !id)
        RW_FAIL(err, RW_E_INVALID_ARG, "rw_tok_token_id: NULL argument");
    for (int k = 0; k < t->n_added; k++) {
        int32_t a = t->added[k].id;
        if (t->len[a] == len && !memcmp(t->pool.p + t->off[a], bytes, len)) {
            *id = a;
            return RW_OK;
        }
    }
    int32_t v = tok_vocab_find(t, bytes, len);
    if (v < 0 || t->kind[v] != TK_BPE)
        RW_FAIL(err, RW_E_NOT_FOUND, "no token \"%.*s\"", (int)(len > 64 ? 64 : len), bytes);
    *id = v;
    return RW_OK;
}

bool rw_tok_is_special(const rw_tok *t, int32_t id) {
    return t && id >= 0 && id < t->n_ids && t->kind[id] == TK_SPECIAL;
}
int32_t rw_tok_eos_id(const rw_tok *t) {
    return t ? t->eos_id : -1;
}
int32_t rw_tok_pad_id(const rw_tok *t) {
    return t ? t->pad_id : -1;
}
int32_t rw_tok_bos_id(const rw_tok *t) {
    return t ? t->bos_id : -1;
}
bool rw_tok_has_chat_template(const rw_tok *t) {
    return t && t->has_chat_template;
}
