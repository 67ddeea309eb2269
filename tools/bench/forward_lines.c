/* forward_lines.c - the forward-level lines of `rw-bench decode` and `rw-bench prefill`: runs the
 * forward-level benchmarks (forward.h) with their output captured and re-emits each result in
 * rw-bench's line format (decode_forward_*, prefill_forward_bf16, with the benchmark's own
 * object as "raw"), judged against the targets' forward-pass rows; RW_BENCH_BREAKDOWN=1 lines
 * follow as bench "breakdown". Built with the worker module only. */
#include "bench.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "forward.h"

/* ------------------------------------------------------------------------------------------ */
/* The forward-level benchmarks (forward.h), re-emitted in rw-bench's line format              */
/* ------------------------------------------------------------------------------------------ */
typedef rw_status (*worker_bench_fn)(const rwb_fwd_opts *, FILE *, rw_err *);

/* Runs an entry point with its output captured; returns the JSON objects it printed, also when it
 * failed after printing some (*st then says how; NULL only when nothing could be captured). */
static json_t *capture_all(worker_bench_fn fn, const rwb_fwd_opts *bo, rw_status *st, rw_err *err) {
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    if (!f) {
        *st = RW_ERR(err, RW_E_OOM, "open_memstream failed");
        return NULL;
    }
    *st = fn(bo, f, err);
    fclose(f);
    json_t *arr = json_array();
    for (char *save = NULL, *ln = strtok_r(buf, "\n", &save); ln;
         ln = strtok_r(NULL, "\n", &save)) {
        json_t *o = json_loads(ln, 0, NULL);
        if (json_is_object(o))
            json_array_append_new(arr, o);
        else
            json_decref(o);
    }
    free(buf);
    return arr;
}

/* capture_all, all or nothing: NULL and err set when the entry point failed. */
static json_t *capture(worker_bench_fn fn, const rwb_fwd_opts *bo, rw_err *err) {
    rw_status st;
    json_t *arr = capture_all(fn, bo, &st, err);
    if (arr && st != RW_OK) {
        json_decref(arr);
        return NULL;
    }
    return arr;
}

/* A per-phase breakdown line of a forward-level benchmark (RW_BENCH_BREAKDOWN=1, bench
 * "decode_breakdown" / "prefill_breakdown"), re-emitted as bench "breakdown" (which the report's
 * tables leave out) under `what` with the object as "raw"; false for any other line. */
static bool emit_breakdown(rwb_ctx *c, const char *bench, const char *what, json_t *o) {
    const json_t *b = json_object_get(o, "bench");
    char want[64];
    snprintf(want, sizeof want, "%s_breakdown", bench);
    if (!json_is_string(b) || strcmp(json_string_value(b), want) != 0) return false;
    json_t *j = rwb_line(c, "breakdown", what);
    json_object_set(j, "raw", o);
    rwb_emit(j);
    return true;
}

static double jnum(const json_t *o, const char *key) {
    const json_t *v = json_object_get(o, key);
    return json_is_number(v) ? json_number_value(v) : NAN;
}

/* Forward-level decode at one point (its own model, built and freed inside the call). */
void rwb_fwd_decode_lines(rwb_ctx *c, bool quant, int batch, int ctx, const char *target_id,
                          double *tok_s) {
    rw_err err = {0};
    const char *what = quant ? "decode_forward_mxfp8" : "decode_forward_bf16";
    rwb_fwd_opts bo = rwb_fwd_opts_default();
    bo.cfg = quant ? &c->cfg_q : &c->cfg;
    bo.device = c->o.gpu0;
    bo.precision = c->o.precision;
    bo.batch = batch;
    bo.ctx = ctx;
    bo.steps = c->o.steps;
    bo.seed = c->o.seed;
    fprintf(stderr, "rw-bench: decode: rwb_fwd_decode %s batch %d ctx %d\n",
            quant ? "mxfp8" : "bf16", batch, ctx);
    json_t *arr = capture(rwb_fwd_decode, &bo, &err);
    if (!arr) {
        rwb_emit_error(c, "decode", what, &err);
        return;
    }
    size_t i;
    json_t *o;
    int found = 0;
    json_array_foreach(arr, i, o) {
        if (emit_breakdown(
                c, "decode",
                quant ? "decode_forward_breakdown_mxfp8" : "decode_forward_breakdown_bf16", o))
            continue;
        if (!json_is_string(json_object_get(o, "bench")) ||
            strcmp(json_string_value(json_object_get(o, "bench")), "decode") != 0)
            continue;
        const double med = jnum(o, "step_ms_median") * 1e-3;
        const double ach = jnum(o, "tokens_per_s"), fl = jnum(o, "floor_tokens_per_s");
        json_t *j = rwb_line(c, "decode", what);
        rwb_set_str(j, "source", "rwb_fwd_decode (one forward + sample on a synthetic KV cache)");
        rwb_set_int(j, "batch", batch);
        rwb_set_int(j, "ctx", ctx);
        rwb_set_int(j, "tokens", (int64_t)batch * bo.steps);
        rwb_set_num(j, "median_s", med);
        json_object_set_new(j, "p10_s", json_null());
        json_object_set_new(j, "p90_s", json_null());
        rwb_set_num(j, "min_s", jnum(o, "step_ms_min") * 1e-3);
        rwb_set_num(j, "max_s", jnum(o, "step_ms_max") * 1e-3);
        rwb_set_int(j, "reps", bo.steps);
        rwb_set_num(j, "ms_per_step", jnum(o, "step_ms_median"));
        rwb_line_rate(j, ach, "tok/s", fl,
                      "memory floor computed inside the entry point (HBM copy in the same call)");
        rwb_set_num(j, "floor_s", jnum(o, "floor_ms") * 1e-3);
        rwb_set_num(j, "hbm_gbps", jnum(o, "hbm_gbs_measured"));
        json_object_set(j, "raw", o);
        int met = -1;
        /* the thresholds of docs/TARGETS.md; fl is this model's own floor in tok/s */
        if (target_id && !strcmp(target_id, "G1/forward"))
            met = isfinite(ach / fl) ? ach >= 0.85 * fl : -1;
        if (target_id && !strcmp(target_id, "G2/forward"))
            met = isfinite(med) && isfinite(ach / fl) ? med <= 2.5e-3 && ach >= 0.6 * fl : -1;
        if (target_id && !strcmp(target_id, "G3/forward") && tok_s && *tok_s > 0) {
            rwb_set_num(j, "vs_bf16", ach / *tok_s);
            met = isfinite(ach / fl) ? ach >= 1.25 * *tok_s && ach >= 0.75 * fl : -1;
        }
        rwb_line_target(j, target_id,
                        target_id ? "forward pass only, see the target row above" : NULL, met);
        if (tok_s && !quant) *tok_s = ach;
        rwb_emit(j);
        found++;
    }
    json_decref(arr);
    if (!found) {
        RW_ERR(&err, RW_E_FORMAT, "rwb_fwd_decode printed no decode result line");
        rwb_emit_error(c, "decode", what, &err);
    }
}

/* Forward-level prefill (rwb_fwd_prefill) against the GEMM ceiling of this run. */
void rwb_fwd_prefill_lines(rwb_ctx *c, double ceil_8192) {
    rw_err err = {0};
    rwb_fwd_opts bo = rwb_fwd_opts_default();
    bo.cfg = &c->cfg;
    bo.device = c->o.gpu0;
    bo.precision = c->o.precision;
    bo.nprompt = c->o.nprompt;
    bo.plen = c->o.plen;
    bo.seed = c->o.seed;
    fprintf(stderr, "rw-bench: prefill: rwb_fwd_prefill %d x %d\n", bo.nprompt, bo.plen);
    json_t *arr = capture(rwb_fwd_prefill, &bo, &err);
    if (!arr) {
        rwb_emit_error(c, "prefill", "prefill_forward_bf16", &err);
        return;
    }
    size_t i;
    json_t *o;
    int found = 0;
    json_array_foreach(arr, i, o) {
        if (emit_breakdown(c, "prefill", "prefill_forward_breakdown_bf16", o)) continue;
        const json_t *b = json_object_get(o, "bench");
        if (!json_is_string(b) || strcmp(json_string_value(b), "prefill") != 0) continue;
        const double fwd = jnum(o, "forward_ms") * 1e-3, tf = jnum(o, "gemm_tflop_per_forward");
        const double ta = jnum(o, "attention_tflop_per_forward");
        const double ach = (tf + ta) / fwd; /* G4 counts GEMMs and attention, each once */
        json_t *j = rwb_line(c, "prefill", "prefill_forward_bf16");
        rwb_set_str(j, "source", "rwb_fwd_prefill (one forward pass, median of 3)");
        rwb_set_int(j, "tokens", (int64_t)bo.nprompt * bo.plen);
        rwb_set_int(j, "nprompt", bo.nprompt);
        rwb_set_int(j, "plen", bo.plen);
        rwb_set_num(j, "gemm_flops", tf * 1e12);
        rwb_set_num(j, "attention_flops", ta * 1e12);
        rwb_set_num(j, "median_s", fwd);
        json_object_set_new(j, "p10_s", json_null());
        json_object_set_new(j, "p90_s", json_null());
        rwb_set_int(j, "reps", 3);
        rwb_line_rate(j, ach, "TFLOP/s", ceil_8192,
                      "cuBLASLt bf16 GEMM 8192^3 (same run); FLOPs of the model's GEMMs and "
                      "attention, each once");
        rwb_set_num(j, "achieved_gemm_only", tf / fwd);
        rwb_set_num(j, "tok_per_s", jnum(o, "tokens_per_s"));
        json_object_set(j, "raw", o);
        rwb_line_target(j, "G4/forward", "forward pass only, see the target row above",
                        ceil_8192 > 0 && isfinite(ach) ? ach >= 0.45 * ceil_8192 : -1);
        rwb_emit(j);
        found++;
    }
    json_decref(arr);
    if (!found) {
        RW_ERR(&err, RW_E_FORMAT, "rwb_fwd_prefill printed no prefill result line");
        rwb_emit_error(c, "prefill", "prefill_forward_bf16", &err);
    }
}

/* ------------------------------------------------------------------------------------------ */
/* kernels: G6 / G7's rw side                                                                  */
/* ------------------------------------------------------------------------------------------ */
int rwb_print_routing(const rw_config *cfg, uint64_t seed, long tokens) {
    int32_t row[64];
    const int k = cfg->top_k < 64 ? cfg->top_k : 64;
    printf("[");
    for (long t = 0; t < tokens; t++) {
        printf(t ? ", [" : "[");
        for (int j = 0; j < k; j++) {
            row[j] = rwb_route_expert(seed, t, j, cfg->num_experts, row);
            printf(j ? ", %d" : "%d", row[j]);
        }
        printf("]");
    }
    printf("]\n");
    return 0;
}

/* A dense GEMM of rwb_fwd_dense as an rw-bench line: against the HBM copy bandwidth of this run
 * (the bytes it must move) and cuBLASLt on the same shape (bf16 input alone, bf16 output: less
 * work than rw's hi + lo pair where the line's "pair" is true, and than its fp32 output), timed
 * here; no target of its own (G1, G2 and G4 judge the whole step). */
static void dense_line(rwb_ctx *c, const json_t *o, double copy_gbs, rwb_gemm *g) {
    char what[96];
    snprintf(what, sizeof what, "%s_m%d", json_string_value(json_object_get(o, "what")),
             (int)jnum(o, "tokens"));
    json_t *j = rwb_line(c, "kernels", what);
    const double sec = jnum(o, "seconds");
    rwb_set_num(j, "median_s", sec);
    rwb_set_int(j, "reps", 5);
    rwb_line_rate(j, jnum(o, "gbs"), "GB/s", copy_gbs,
                  "HBM device-to-device copy (read + write), same run");
    double t = 0;
    rw_err err = {0};
    if (g && rwb_measure_gemm(c, g, "kernels", what, (int64_t)jnum(o, "n"), (int64_t)jnum(o, "tokens"),
                              (int64_t)jnum(o, "k"), 1, false, &t, &err) == RW_OK &&
        t > 0) {
        rwb_set_num(j, "cublaslt_s", t);
        rwb_set_num(j, "vs_cublaslt", t / sec); /* > 1: rw is faster */
    } else if (g) {
        rwb_set_str(j, "cublaslt_error", err.msg);
    }
    json_object_set(j, "raw", (json_t *)o);
    rwb_emit(j);
}

/* Whether an attention shape is one of G6's points (docs/TARGETS.md): prefill, and decode at
 * 256 x 1024 and 32 x 8192. Other shapes (the batch-1 point) are measured for the per-phase table
 * and carry no target. */
static bool g6_point(bool prefill, int seqs, int kv) {
    return prefill || (seqs == 256 && kv == 1024) || (seqs == 32 && kv == 8192);
}

/* One kernel result of rwb_fwd_kernels as an rw-bench line: decode attention, the experts and
 * the small kernels against the HBM copy bandwidth of this run (bytes they must move), prefill
 * attention in TFLOP/s (its ceiling is the peer's, tools/peer/torch_kernels.py). */
static void kernel_line(rwb_ctx *c, const json_t *o, double copy_gbs) {
    const char *w = json_string_value(json_object_get(o, "what"));
    char what[96];
    const bool attn = !strncmp(w, "attention", 9), prefill = !strcmp(w, "attention_prefill");
    const bool experts = !strncmp(w, "experts", 7); /* else a small kernel: no target */
    if (attn)
        snprintf(what, sizeof what, "%s_%dx%d", w, (int)jnum(o, "seqs"), (int)jnum(o, "kv"));
    else
        snprintf(what, sizeof what, "%s_t%d", w, (int)jnum(o, "tokens"));
    json_t *j = rwb_line(c, "kernels", what);
    const double sec = jnum(o, "seconds");
    rwb_set_num(j, "median_s", sec);
    rwb_set_int(j, "reps", 5);
    if (prefill)
        rwb_line_rate(j, jnum(o, "tflops"), "TFLOP/s", NAN,
                      "torch SDPA on the same shape (tools/peer/torch_kernels.py)");
    else
        rwb_line_rate(j, jnum(o, "gbs"), "GB/s", copy_gbs,
                      "HBM device-to-device copy (read + write), same run");
    json_object_set(j, "raw", (json_t *)o);
    if (experts || (attn && g6_point(prefill, (int)jnum(o, "seqs"), (int)jnum(o, "kv"))))
        rwb_line_target(j, attn ? "G6/rw" : "G7/rw",
                        "rw side; the ratio to torch comes from tools/peer/torch_kernels.py", -1);
    else
        rwb_set_str(j, "role", "info");
    rwb_emit(j);
}

void rwb_mode_kernels(rwb_ctx *c) {
    rw_err err = {0};
    double gbs = NAN;
    if (rwb_measure_hbm(c, c->o.gpu0, "kernels", &gbs, &err) != RW_OK)
        rwb_emit_error(c, "kernels", "hbm_copy", &err);
    rwb_fwd_opts bo = rwb_fwd_opts_default();
    bo.cfg = &c->cfg;
    bo.device = c->o.gpu0;
    bo.precision = c->o.precision;
    bo.seed = c->o.seed;
    bo.kernel_layers = c->o.kernel_layers;
    _Static_assert(RWB_MAX_LIST <= RWB_FWD_MAX_SHAPES, "rw-bench lists fit the kernel options");
    memcpy(bo.attn, c->o.kattn, sizeof c->o.kattn);
    bo.nattn = c->o.nkattn;
    memcpy(bo.expert_tokens, c->o.ktokens, sizeof c->o.ktokens);
    bo.nexpert_tokens = c->o.nktokens;
    /* the dense GEMMs (default: the token counts the GEMM tests use) */
    memcpy(bo.dense_tokens, c->o.dtokens, sizeof c->o.dtokens);
    bo.ndense_tokens = c->o.ndtokens;
    memcpy(bo.small_tokens, c->o.stokens, sizeof c->o.stokens);
    bo.nsmall_tokens = c->o.nstokens;
    rw_status st;
    json_t *arr = capture_all(rwb_fwd_kernels, &bo, &st, &err);
    if (!arr) {
        rwb_emit_error(c, "kernels", "kernels", &err);
        return;
    }
    /* cuBLASLt for the dense lines, created after the kernels ran (their model is freed) */
    size_t i;
    json_t *o;
    bool dense = false;
    json_array_foreach(arr, i, o) {
        const json_t *w = json_object_get(o, "what");
        dense |= json_is_string(w) && !strncmp(json_string_value(w), "dense_", 6);
    }
    rwb_gemm *g = NULL;
    rw_err gerr = {0};
    if (dense && rwb_gemm_create(c->o.gpu0, &g, &gerr) != RW_OK) {
        rwb_emit_error(c, "kernels", "cublaslt", &gerr);
        g = NULL;
    }
    json_array_foreach(arr, i, o) {
        const json_t *b = json_object_get(o, "bench");
        const json_t *w = json_object_get(o, "what");
        if (!json_is_string(b) || strcmp(json_string_value(b), "kernel") || !json_is_string(w))
            continue;
        if (!strncmp(json_string_value(w), "dense_", 6))
            dense_line(c, o, gbs, g);
        else
            kernel_line(c, o, gbs);
    }
    rwb_gemm_destroy(g);
    json_decref(arr);
    if (st != RW_OK) rwb_emit_error(c, "kernels", "kernels", &err);
}
