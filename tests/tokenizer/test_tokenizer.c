/* test_tokenizer.c - the tokenizer without node or npm: errors that name the file and the field
 * (missing, malformed, unsupported tokenizer.json), decode of ids out of range, UTF-8 repair,
 * the incremental decoder on split characters, added-token flags (lstrip, rstrip, single_word,
 * normalized, special), and the Qwen3 chat format against chats.json (rendered from the real
 * template by chat_ref.py). Tokenizers are small tokenizer.json files the test writes.
 */
#include <jansson.h>
#include <sys/stat.h>
#include <unistd.h>

#include "rw_test.h"
#include "rw_tokenizer.h"

static char g_dir[256];

/* GPT-2's bytes_to_unicode, written here again so the test does not borrow the library's. */
static void byte_char(int b, char out[4]) {
    int k = 0, cp = -1;
    for (int x = 0; x < 256; x++) {
        bool printable = (x >= '!' && x <= '~') || (x >= 0xa1 && x <= 0xac) || x >= 0xae;
        int c = printable ? x : 256 + k++;
        if (x == b) cp = c;
    }
    if (cp < 0x80) {
        out[0] = (char)cp;
        out[1] = 0;
    } else {
        out[0] = (char)(0xc0 | (cp >> 6));
        out[1] = (char)(0x80 | (cp & 0x3f));
        out[2] = 0;
    }
}

/* Bytes -> byte-level string. */
static void bl(const char *bytes, char *out) {
    out[0] = 0;
    for (const unsigned char *p = (const unsigned char *)bytes; *p; p++) {
        char c[4];
        byte_char(*p, c);
        strcat(out, c);
    }
}

/* A tiny byte-level BPE: ids 0..255 the bytes, 256 "he", 257 "hel", 258 "hell", 259 "hello",
 * 260 " w", then added tokens 300.. (with gaps 261..299: ids without a token). */
static json_t *tiny_json(void) {
    json_t *vocab = json_object();
    char s[64], t[64];
    for (int b = 0; b < 256; b++) {
        byte_char(b, s);
        json_object_set_new(vocab, s, json_integer(b));
    }
    const char *words[] = {"he", "hel", "hell", "hello", " w"};
    for (int i = 0; i < 5; i++) {
        bl(words[i], s);
        json_object_set_new(vocab, s, json_integer(256 + i));
    }
    json_t *merges = json_array();
    const char *pairs[][2] = {{"h", "e"}, {"he", "l"}, {"hel", "l"}, {"hell", "o"}, {" ", "w"}};
    for (int i = 0; i < 5; i++) {
        bl(pairs[i][0], s);
        bl(pairs[i][1], t);
        json_array_append_new(merges, json_pack("[s,s]", s, t));
    }
    json_t *added = json_array();
    struct {
        int id;
        const char *c;
        int special, lstrip, rstrip, single, norm;
    } ad[] = {
        {300, "<|s|>", 1, 0, 0, 0, 0},
        {301, "<L>", 0, 1, 0, 0, 0},
        {302, "<R>", 0, 0, 1, 0, 0},
        {303, "<W>", 0, 0, 0, 1, 0},
        {304, "\xc3\xa9t\xc3\xa9", 0, 0, 0, 0, 1}, /* été */
        {305, "<|s|>x", 1, 0, 0, 0, 0},            /* longer match wins */
    };
    for (size_t i = 0; i < sizeof ad / sizeof ad[0]; i++)
        json_array_append_new(
            added, json_pack("{s:i,s:s,s:b,s:b,s:b,s:b,s:b}", "id", ad[i].id, "content", ad[i].c,
                             "special", ad[i].special, "lstrip", ad[i].lstrip, "rstrip",
                             ad[i].rstrip, "single_word", ad[i].single, "normalized", ad[i].norm));
    const char *rx =
        "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";
    return json_pack("{s:s,s:o,s:{s:s},s:{s:s,s:[{s:s,s:{s:s},s:s,s:b},{s:s,s:b,s:b,s:b}]},"
                     "s:{s:s},s:{s:s,s:o,s:o,s:n,s:n}}",
                     "version", "1.0", "added_tokens", added, "normalizer", "type", "NFC",
                     "pre_tokenizer", "type", "Sequence", "pretokenizers", "type", "Split",
                     "pattern", "Regex", rx, "behavior", "Isolated", "invert", 0, "type",
                     "ByteLevel", "add_prefix_space", 0, "trim_offsets", 0, "use_regex", 0,
                     "decoder", "type", "ByteLevel", "model", "type", "BPE", "vocab", vocab,
                     "merges", merges, "dropout", "unk_token");
}

static void write_file(const char *name, const char *text) {
    char p[512];
    snprintf(p, sizeof p, "%s/%s", g_dir, name);
    FILE *f = fopen(p, "wb");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

static void write_json(const char *name, json_t *j) {
    char *s = json_dumps(j, JSON_COMPACT);
    write_file(name, s);
    free(s);
    json_decref(j);
}

static void remove_files(void) {
    char p[512];
    snprintf(p, sizeof p, "%s/tokenizer.json", g_dir);
    unlink(p);
    snprintf(p, sizeof p, "%s/tokenizer_config.json", g_dir);
    unlink(p);
}

/* Loads g_dir expecting status `want` and every `needle` in the message. */
static void expect_load_error(rw_status want, const char *n1, const char *n2) {
    rw_tok *t = NULL;
    rw_err err = {0};
    rw_status s = rw_tok_load(g_dir, &t, &err);
    if (s != want)
        fail_msg("load: %s (%s), want %s", rw_status_str(s), err.msg, rw_status_str(want));
    assert_null(t);
    if (n1 && !strstr(err.msg, n1)) fail_msg("message \"%s\" lacks \"%s\"", err.msg, n1);
    if (n2 && !strstr(err.msg, n2)) fail_msg("message \"%s\" lacks \"%s\"", err.msg, n2);
}

static rw_tok *load_tiny(void) {
    remove_files();
    write_json("tokenizer.json", tiny_json());
    write_file("tokenizer_config.json", "{\"eos_token\": \"<|s|>\", \"pad_token\": {\"content\": "
                                        "\"<R>\"}, \"bos_token\": null, \"chat_template\": \"x\"}");
    rw_tok *t = NULL;
    rw_err err = {0};
    RW_ASSERT_OK(rw_tok_load(g_dir, &t, &err), &err);
    return t;
}

static void encode_expect(rw_tok *t, const char *text, size_t len, uint32_t flags,
                          const int32_t *want, size_t nwant) {
    rw_tok_ids ids = {0};
    rw_err err = {0};
    RW_ASSERT_OK(rw_tok_encode(t, text, len, flags, &ids, &err), &err);
    if (ids.n != nwant || (nwant && memcmp(ids.ids, want, nwant * sizeof *want))) {
        fprintf(stderr, "encode(\"%.*s\") gave", (int)len, text);
        for (size_t i = 0; i < ids.n; i++)
            fprintf(stderr, " %d", ids.ids[i]);
        fprintf(stderr, "\n");
        fail_msg("ids differ");
    }
    rw_tok_ids_free(&ids);
}

/* ---------------------------------------------------------------------------------------- */

static void load_errors(void **state) {
    (void)state;
    remove_files();
    expect_load_error(RW_E_IO, "tokenizer.json", "cannot open");
    /* whole files that are wrong */
    static const struct {
        const char *json;
        rw_status want;
        const char *n1, *n2;
    } files[] = {
        {"{\"model\": {\"type\": \"BPE\", \"vocab\": {", RW_E_FORMAT, "tokenizer.json",
         "not valid JSON"},
        {"[1, 2]", RW_E_FORMAT, "tokenizer.json", "top level"},
        {"{\"model\": {\"type\": \"BPE\", \"merges\": []}}", RW_E_FORMAT, "tokenizer.json",
         "model.vocab"},
        {"{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}}}", RW_E_FORMAT, "model.merges",
         "missing"},
        {"{\"model\": {\"type\": \"Unigram\", \"vocab\": []}}", RW_E_UNSUPPORTED, "model.type",
         "Unigram"},
        {"{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": -1}, \"merges\": []}}", RW_E_FORMAT,
         "model.vocab[\"a\"]", "id"},
        {"{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": []}}", RW_E_FORMAT,
         "model.vocab", "byte 0x00"},
        {"{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a b\": 0}, \"merges\": []}}", RW_E_FORMAT,
         "model.vocab", "U+0020"},
    };
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        write_file("tokenizer.json", files[i].json);
        expect_load_error(files[i].want, files[i].n1, files[i].n2);
    }

    /* from the valid tiny file, one field broken at a time */
    json_t *j = tiny_json();
    json_array_append_new(json_object_get(json_object_get(j, "model"), "merges"),
                          json_pack("[s,s]", "q", "z"));
    write_json("tokenizer.json", j);
    expect_load_error(RW_E_FORMAT, "model.merges[5]", "merged token");
    j = tiny_json();
    json_array_append_new(json_object_get(json_object_get(j, "model"), "merges"),
                          json_string("hq"));
    write_json("tokenizer.json", j);
    expect_load_error(RW_E_FORMAT, "model.merges[5]", "not a pair");
    j = tiny_json();
    json_object_set_new(j, "normalizer", json_pack("{s:s}", "type", "NFKC"));
    write_json("tokenizer.json", j);
    expect_load_error(RW_E_UNSUPPORTED, "normalizer.type", "NFKC");
    j = tiny_json();
    json_object_set_new(
        json_array_get(json_object_get(json_object_get(j, "pre_tokenizer"), "pretokenizers"), 0),
        "behavior", json_string("MergedWithNext"));
    write_json("tokenizer.json", j);
    expect_load_error(RW_E_UNSUPPORTED, "pre_tokenizer.pretokenizers[0].behavior",
                      "MergedWithNext");
    j = tiny_json();
    json_object_set_new(
        json_object_get(
            json_array_get(json_object_get(json_object_get(j, "pre_tokenizer"), "pretokenizers"),
                           0),
            "pattern"),
        "Regex", json_string("(unclosed"));
    write_json("tokenizer.json", j);
    expect_load_error(RW_E_UNSUPPORTED, "pattern.Regex", "PCRE2");
    j = tiny_json();
    json_object_set_new(json_object_get(j, "model"), "byte_fallback", json_true());
    write_json("tokenizer.json", j);
    expect_load_error(RW_E_UNSUPPORTED, "model.byte_fallback", "true");
    j = tiny_json();
    json_object_set_new(json_array_get(json_object_get(j, "added_tokens"), 0), "content",
                        json_string(""));
    write_json("tokenizer.json", j);
    expect_load_error(RW_E_FORMAT, "added_tokens[0].content", NULL);
    j = tiny_json();
    json_object_set_new(j, "decoder", json_pack("{s:s}", "type", "WordPiece"));
    write_json("tokenizer.json", j);
    expect_load_error(RW_E_UNSUPPORTED, "decoder.type", "WordPiece");

    /* tokenizer_config.json: malformed, and an eos_token that is no token */
    write_json("tokenizer.json", tiny_json());
    write_file("tokenizer_config.json", "{\"eos_token\": ");
    expect_load_error(RW_E_FORMAT, "tokenizer_config.json", "not valid JSON");
    write_file("tokenizer_config.json", "{\"eos_token\": \"<nope>\"}");
    expect_load_error(RW_E_FORMAT, "tokenizer_config.json", "eos_token");
    write_file("tokenizer_config.json", "{\"eos_token\": 7}");
    expect_load_error(RW_E_FORMAT, "tokenizer_config.json", "eos_token");
    remove_files();

    rw_tok *t = (rw_tok *)1;
    rw_err err = {0};
    assert_int_equal(rw_tok_load(NULL, &t, &err), RW_E_INVALID_ARG);
    rw_tok_destroy(NULL);
}

static void encode_basics(void **state) {
    (void)state;
    rw_tok *t = load_tiny();
    assert_int_equal(rw_tok_id_end(t), 306);
    assert_int_equal(rw_tok_eos_id(t), 300);
    assert_int_equal(rw_tok_pad_id(t), 302);
    assert_int_equal(rw_tok_bos_id(t), -1);
    assert_true(rw_tok_has_chat_template(t));
    assert_true(rw_tok_is_special(t, 300));
    assert_false(rw_tok_is_special(t, 301));
    assert_false(rw_tok_is_special(t, 259));
    int32_t id;
    RW_ASSERT_OK(rw_tok_token_id(t, "hello", 5, &id, NULL), &(rw_err){0});
    assert_int_equal(id, 259);
    assert_int_equal(rw_tok_token_id(t, "nope!", 5, &id, NULL), RW_E_NOT_FOUND);

    encode_expect(t, "", 0, 0, NULL, 0);
    encode_expect(t, "hello", 5, 0, (int32_t[]){259}, 1);
    encode_expect(t, "hello world", 11, 0, (int32_t[]){259, 260, 'o', 'r', 'l', 'd'}, 6);
    /* one piece: h+e merges at both ends first (rank 0, leftmost first), then he+l, then hel+l */
    encode_expect(t, "hellhe", 6, 0, (int32_t[]){258, 256}, 2);
    /* invalid UTF-8 is repaired before anything: \xff == U+FFFD */
    rw_tok_ids a = {0}, b = {0};
    RW_ASSERT_OK(rw_tok_encode(t,
                               "a\xff"
                               "b",
                               3, 0, &a, NULL),
                 &(rw_err){0});
    RW_ASSERT_OK(rw_tok_encode(t,
                               "a\xef\xbf\xbd"
                               "b",
                               5, 0, &b, NULL),
                 &(rw_err){0});
    assert_int_equal(a.n, b.n);
    assert_memory_equal(a.ids, b.ids, a.n * sizeof *a.ids);
    /* encode appends */
    RW_ASSERT_OK(rw_tok_encode(t, "hello", 5, 0, &a, NULL), &(rw_err){0});
    assert_int_equal(a.ids[a.n - 1], 259);
    rw_tok_ids_free(&a);
    rw_tok_ids_free(&b);
    rw_tok_ids_free(NULL);
    assert_int_equal(rw_tok_encode(t, NULL, 3, 0, &a, NULL), RW_E_INVALID_ARG);
    rw_tok_destroy(t);
}

static void added_token_flags(void **state) {
    (void)state;
    rw_tok *t = load_tiny();
    /* special, longest match first: "<|s|>x" (305) beats "<|s|>" (300) */
    encode_expect(t, "he<|s|>he", 9, 0, (int32_t[]){256, 300, 256}, 3);
    encode_expect(t, "<|s|>x", 6, 0, (int32_t[]){305}, 1);
    /* split_special: the special text is plain text */
    encode_expect(t, "<|s|>", 5, RW_TOK_ENCODE_SPLIT_SPECIAL, (int32_t[]){'<', '|', 's', '|', '>'},
                  5);
    /* lstrip: <L> swallows the whitespace on its left, not on its right */
    encode_expect(t, "he  \t<L> he", 11, 0, (int32_t[]){256, 301, ' ', 256}, 4);
    /* rstrip: <R> swallows the whitespace on its right */
    encode_expect(t, "he <R>  \nhe", 11, 0, (int32_t[]){256, ' ', 302, 256}, 4);
    /* single_word: not inside a word */
    encode_expect(t, "x<W> <W>", 8, 0, (int32_t[]){'x', '<', 'W', '>', ' ', 303}, 6);
    /* normalized=true: matched after NFC, so the decomposed spelling matches too */
    encode_expect(t, "\xc3\xa9t\xc3\xa9", 5, 0, (int32_t[]){304}, 1);
    encode_expect(t, "e\xcc\x81te\xcc\x81", 7, 0, (int32_t[]){304}, 1);
    rw_tok_destroy(t);
}

static void decode_ranges(void **state) {
    (void)state;
    rw_tok *t = load_tiny();
    char *s = NULL;
    size_t n = 0;
    rw_err err = {0};
    const int32_t ok[] = {259, 300, 260};
    RW_ASSERT_OK(rw_tok_decode(t, ok, 3, 0, &s, &n, &err), &err);
    assert_string_equal(s, "hello<|s|> w");
    free(s);
    RW_ASSERT_OK(rw_tok_decode(t, ok, 3, RW_TOK_DECODE_SKIP_SPECIAL, &s, &n, &err), &err);
    assert_string_equal(s, "hello w");
    free(s);
    RW_ASSERT_OK(rw_tok_decode(t, NULL, 0, 0, &s, &n, &err), &err);
    assert_string_equal(s, "");
    assert_int_equal(n, 0);
    free(s);
    const int32_t bad[][3] = {{259, -1, 0}, {259, 306, 0}, {259, 280, 0}, {259, 151936, 0}};
    for (int k = 0; k < 4; k++) {
        s = (char *)1;
        assert_int_equal(rw_tok_decode(t, bad[k], 3, 0, &s, &n, &err), RW_E_RANGE);
        assert_null(s);
        assert_non_null(strstr(err.msg, "ids[1]"));
        RW_ASSERT_OK(rw_tok_decode(t, bad[k], 3, RW_TOK_DECODE_SKIP_UNKNOWN, &s, &n, &err), &err);
        assert_string_equal(s, "hello\x00");
        free(s);
    }
    const char *p;
    size_t l;
    assert_int_equal(rw_tok_token(t, 280, &p, &l, &err), RW_E_RANGE);
    assert_int_equal(rw_tok_token(t, -5, &p, &l, &err), RW_E_RANGE);
    RW_ASSERT_OK(rw_tok_token(t, 260, &p, &l, &err), &err);
    assert_int_equal(l, 2);
    assert_memory_equal(p, " w", 2);
    rw_tok_destroy(t);
}

/* Byte tokens that split characters: the stream holds them back; whole decode repairs them. */
static void stream_split_utf8(void **state) {
    (void)state;
    rw_tok *t = load_tiny();
    rw_err err = {0};
    /* "€" = E2 82 AC, then "😀" = F0 9F 98 80 cut after 2 bytes by a special token, then a stray
     * continuation byte and a truncated 3-byte prefix at the end */
    const int32_t ids[] = {'a', 0xe2, 0x82, 0xac, 0xf0, 0x9f, 300, 0x80, 'b', 0xe4, 0xbd};
    const size_t n = sizeof ids / sizeof ids[0];
    char *whole = NULL;
    size_t wl = 0;
    RW_ASSERT_OK(rw_tok_decode(t, ids, n, 0, &whole, &wl, &err), &err);
    assert_string_equal(whole, "a\xe2\x82\xac\xef\xbf\xbd<|s|>\xef\xbf\xbd"
                               "b\xef\xbf\xbd");
    const char *want[] = {"a", "", "", "\xe2\x82\xac", "", "", "\xef\xbf\xbd<|s|>", "\xef\xbf\xbd",
                          "b", "", ""};
    rw_tok_stream *st = NULL;
    RW_ASSERT_OK(rw_tok_stream_create(t, 0, &st, &err), &err);
    for (size_t i = 0; i < n; i++) {
        const char *p;
        size_t l;
        RW_ASSERT_OK(rw_tok_stream_push(st, ids[i], &p, &l, &err), &err);
        if (l != strlen(want[i]) || memcmp(p, want[i], l))
            fail_msg("push %zu: got \"%.*s\", want \"%s\"", i, (int)l, p, want[i]);
    }
    assert_int_equal(rw_tok_stream_pending(st), 2);
    /* a bad id leaves the stream as it was */
    const char *p;
    size_t l;
    assert_int_equal(rw_tok_stream_push(st, 9999, &p, &l, &err), RW_E_RANGE);
    assert_int_equal(rw_tok_stream_pending(st), 2);
    RW_ASSERT_OK(rw_tok_stream_finish(st, &p, &l, &err), &err);
    assert_int_equal(l, 3);
    assert_memory_equal(p, "\xef\xbf\xbd", 3);
    assert_int_equal(rw_tok_stream_pending(st), 0);
    /* reusable after finish */
    RW_ASSERT_OK(rw_tok_stream_push(st, 259, &p, &l, &err), &err);
    assert_int_equal(l, 5);
    rw_tok_stream_destroy(st);
    rw_tok_stream_destroy(NULL);
    /* skip flags on a stream */
    RW_ASSERT_OK(
        rw_tok_stream_create(t, RW_TOK_DECODE_SKIP_SPECIAL | RW_TOK_DECODE_SKIP_UNKNOWN, &st, &err),
        &err);
    RW_ASSERT_OK(rw_tok_stream_push(st, 300, &p, &l, &err), &err);
    assert_int_equal(l, 0);
    RW_ASSERT_OK(rw_tok_stream_push(st, -3, &p, &l, &err), &err);
    assert_int_equal(l, 0);
    rw_tok_stream_destroy(st);
    free(whole);
    rw_tok_destroy(t);
}

static rw_chat_role role_of(const char *r) {
    if (!strcmp(r, "system")) return RW_CHAT_SYSTEM;
    if (!strcmp(r, "user")) return RW_CHAT_USER;
    if (!strcmp(r, "assistant")) return RW_CHAT_ASSISTANT;
    if (!strcmp(r, "tool")) return RW_CHAT_TOOL;
    fail_msg("unknown role %s", r);
    return RW_CHAT_USER;
}

/* Every case of chats.json (rendered from the real template with Jinja2 by chat_ref.py). */
static void chat_qwen3(void **state) {
    (void)state;
    char path[1024];
    json_error_t je;
    json_t *doc =
        json_load_file(rw_test_path(path, sizeof path, "tests/tokenizer/chats.json"), 0, &je);
    if (!doc) fail_msg("%s: %s", path, je.text);
    json_t *cases = json_object_get(doc, "cases");
    assert_true(json_array_size(cases) > 10);
    for (size_t i = 0; i < json_array_size(cases); i++) {
        json_t *c = json_array_get(cases, i), *msgs = json_object_get(c, "messages");
        size_t n = json_array_size(msgs);
        rw_chat_msg m[16];
        assert_true(n <= 16);
        for (size_t k = 0; k < n; k++) {
            json_t *x = json_array_get(msgs, k);
            m[k].role = role_of(json_string_value(json_object_get(x, "role")));
            m[k].content = json_string_value(json_object_get(x, "content"));
            json_t *r = json_object_get(x, "reasoning_content");
            m[k].reasoning = json_is_string(r) ? json_string_value(r) : NULL;
        }
        json_t *th = json_object_get(c, "enable_thinking");
        rw_chat_opts o = {.add_generation_prompt =
                              json_is_true(json_object_get(c, "add_generation_prompt")),
                          .disable_thinking = json_is_false(th)};
        char *out = NULL;
        size_t len = 0;
        rw_err err = {0};
        RW_ASSERT_OK(rw_tok_chat_qwen3(m, n, &o, &out, &len, &err), &err);
        const char *want = json_string_value(json_object_get(c, "expect"));
        if (strcmp(out, want))
            fail_msg("chat case %s:\n  rw:   %s\n  want: %s",
                     json_string_value(json_object_get(c, "name")), out, want);
        assert_int_equal(len, strlen(want));
        free(out);
    }
    json_decref(doc);
    /* argument errors */
    char *out = NULL;
    rw_err err = {0};
    assert_int_equal(rw_tok_chat_qwen3(NULL, 0, NULL, &out, NULL, &err), RW_E_INVALID_ARG);
    rw_chat_msg bad = {.role = (rw_chat_role)9, .content = "x"};
    assert_int_equal(rw_tok_chat_qwen3(&bad, 1, NULL, &out, NULL, &err), RW_E_INVALID_ARG);
    assert_non_null(strstr(err.msg, "messages[0].role"));
    rw_chat_msg nul = {.role = RW_CHAT_USER, .content = NULL};
    assert_int_equal(rw_tok_chat_qwen3(&nul, 1, NULL, &out, NULL, &err), RW_E_INVALID_ARG);
    assert_null(out);
}

int main(void) {
    snprintf(g_dir, sizeof g_dir, "%s/rw-tok-test-XXXXXX",
             getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
    if (!mkdtemp(g_dir)) {
        perror("mkdtemp");
        return 1;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(load_errors),       cmocka_unit_test(encode_basics),
        cmocka_unit_test(added_token_flags), cmocka_unit_test(decode_ranges),
        cmocka_unit_test(stream_split_utf8), cmocka_unit_test(chat_qwen3),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    remove_files();
    rmdir(g_dir);
    return rc;
}
