/* rollout.c - `rw-bench rollout`: R1 of docs/TARGETS.md, an RL-shaped rollout through the engine
 * API on the CUDA backend (TP1, the config's shape with random weights, like the other engine
 * modes): P prompts x N samples, prompt lengths uniform in [pmin, pmax], response lengths
 * log-normal (median, sigma) capped, drawn from --seed; temperature 1 over the full vocabulary;
 * each sample stops at its drawn length (rw_request_opts.sample_max_new). All requests are queued
 * at once, the n samples of a prompt as one group; the KV cache is what the GPU has. Run with
 * prefix sharing on and off (--rollout-sharing).
 *
 * Reported per run: wall time from the first add to the last output, generated tokens per
 * second, the tail (the time after 90% of the sequences had finished), the peak KV memory held,
 * prefill tokens computed, the prefix-sharing counters, and the ratio R1 is judged on: the sum
 * over engine steps of each step's floor, divided by the wall time. A step's floor is the larger
 * of its memory floor (the bytes it must read: the weights of attention, router, norms and
 * lm_head, the embedding rows, the experts its tokens touch in expectation under uniform top-k
 * routing, and every sequence's KV up to its context, over the HBM copy bandwidth measured in the
 * same run) and its compute floor (2 x active parameters x tokens, the logits rows' lm_head, and
 * 4 x layers x heads x head_dim per attended (query, key) pair, over a cuBLASLt bf16 8192^3 GEMM
 * measured in the same run). Host time between steps, prefill inefficiency and the tail's small
 * batches all count against the ratio.
 *
 * The line also carries a time series (at most every --rollout-dt seconds): sequences running and
 * waiting, KV tokens held, generated tokens per second; tools/bench/plot_rollout.py draws it. */
#include "bench.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#ifdef RWB_HAVE_WORKER
#include "engine.h"

typedef struct series {
    double *t, *tok_s;
    int64_t *running, *waiting, *kv_tokens;
    int n, cap;
} series;

static void series_free(series *s) {
    free(s->t);
    free(s->tok_s);
    free(s->running);
    free(s->waiting);
    free(s->kv_tokens);
}

static bool series_add(series *s, double t, double tok_s, const rw_engine_stats *st) {
    if (s->n == s->cap) {
        const int nc = s->cap ? 2 * s->cap : 256;
        double *a = realloc(s->t, sizeof *a * (size_t)nc);
        if (a) s->t = a;
        double *b = realloc(s->tok_s, sizeof *b * (size_t)nc);
        if (b) s->tok_s = b;
        int64_t *c = realloc(s->running, sizeof *c * (size_t)nc);
        if (c) s->running = c;
        int64_t *d = realloc(s->waiting, sizeof *d * (size_t)nc);
        if (d) s->waiting = d;
        int64_t *e = realloc(s->kv_tokens, sizeof *e * (size_t)nc);
        if (e) s->kv_tokens = e;
        if (!a || !b || !c || !d || !e) return false;
        s->cap = nc;
    }
    s->t[s->n] = t;
    s->tok_s[s->n] = tok_s;
    s->running[s->n] = st->running;
    s->waiting[s->n] = st->waiting;
    s->kv_tokens[s->n] = st->kv_blocks_used * st->kv_block_size;
    s->n++;
    return true;
}

static json_t *jarr_d(const double *v, int n) {
    json_t *a = json_array();
    for (int i = 0; i < n; i++)
        json_array_append_new(a, json_real(round(v[i] * 1000.0) / 1000.0));
    return a;
}

static json_t *jarr_i(const int64_t *v, int n) {
    json_t *a = json_array();
    for (int i = 0; i < n; i++)
        json_array_append_new(a, json_integer(v[i]));
    return a;
}

/* What a step must at least cost (see the top of the file). */
typedef struct step_floor {
    rwb_floor mem;
    double flops_per_token; /* 2 x active parameters of a token (attention, router, k experts) */
    double flops_per_row;   /* 2 x lm_head parameters per logits row */
    double flops_per_pair;  /* attention: 4 x layers x heads x head_dim per (query, key) */
    double bw, peak;        /* bytes/s, FLOP/s */
} step_floor;

static step_floor floor_model(rw_model *m, double gbps, double tflops) {
    const rw_config *cfg = rw_model_config(m);
    step_floor f;
    f.mem = rwb_floor_of(m);
    const double H = cfg->hidden_size, hd = cfg->head_dim, L = cfg->num_layers;
    const double qd = cfg->num_heads * hd, kd = cfg->num_kv_heads * hd;
    const double attn = H * qd + 2 * H * kd + qd * H, router = (double)cfg->num_experts * H;
    const double expert = 3.0 * H * cfg->moe_intermediate;
    f.flops_per_token = 2.0 * L * (attn + router + cfg->top_k * expert);
    f.flops_per_row = 2.0 * (double)cfg->vocab_size * H;
    f.flops_per_pair = 4.0 * L * cfg->num_heads * hd;
    f.bw = gbps * 1e9;
    f.peak = tflops * 1e12;
    return f;
}

static double step_floor_s(const step_floor *f, const rw_engine_stats *st) {
    const double T = (double)st->last_tokens, E = f->mem.E, k = f->mem.k;
    const double experts = E * (1.0 - pow(1.0 - k / E, T));
    const double bytes = f->mem.fixed + f->mem.per_row * T + f->mem.per_expert * experts +
                         f->mem.kv_per_token * (double)st->last_ctx;
    const double flops = f->flops_per_token * T + f->flops_per_row * (double)st->last_logits +
                         f->flops_per_pair * (double)st->last_attn;
    const double tm = bytes / f->bw, tc = f->peak > 0 ? flops / f->peak : 0;
    return tm > tc ? tm : tc;
}

static int cmp_double(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* One rollout with sharing on or off. */
static void run_rollout(rwb_ctx *c, rw_model *m, bool sharing, const step_floor *fl) {
    const rwb_opts *o = &c->o;
    const char *what = sharing ? "rollout_sharing" : "rollout_no_sharing";
    const rw_config *cfg = rw_model_config(m);
    const int P = o->ro_prompts, N = o->ro_n, total = P * N;
    rw_err err = {0};
    rw_status st_ = RW_OK;
    rw_engine *e = NULL;
    int *plen = malloc(sizeof(int) * (size_t)P), *rlen = malloc(sizeof(int) * (size_t)total);
    int32_t *toks = malloc(sizeof(int32_t) * (size_t)o->ro_pmax);
    double *done_t = malloc(sizeof(double) * (size_t)total);
    series ser = {0};
    if (!plen || !rlen || !toks || !done_t) {
        RW_ERR(&err, RW_E_OOM, "rollout: out of memory");
        goto fail;
    }
    /* the draws: the same for sharing on and off */
    rw_rng rng;
    rw_rng_seed(&rng, o->seed * 1000003ull + 16);
    int64_t want_tokens = 0, prompt_tokens = 0;
    const double mu = log((double)o->ro_median);
    for (int i = 0; i < P; i++) {
        plen[i] = o->ro_pmin + (int)(rw_rng_u64(&rng) % (uint64_t)(o->ro_pmax - o->ro_pmin + 1));
        prompt_tokens += plen[i];
    }
    for (int i = 0; i < total; i++) {
        const double x = exp(mu + o->ro_sigma * (double)rw_rng_normal(&rng));
        rlen[i] = x < 1 ? 1 : x > o->ro_cap ? o->ro_cap : (int)llround(x);
        want_tokens += rlen[i];
    }
    rw_engine_opts eo = rw_engine_opts_default();
    eo.max_running = o->ro_max_running;
    eo.max_batch_tokens = o->ro_max_batch_tokens;
    eo.max_seq_len = o->ro_pmax + o->ro_cap + 16;
    eo.prefix_sharing = sharing;
    RW_CHECKGOTO(rw_engine_create(m, &eo, &e, &err), st_, fail);
    rw_engine_stats st;
    rw_engine_stats_get(e, &st);
    const size_t block_bytes = st.kv_bytes / (size_t)(st.kv_blocks_total ? st.kv_blocks_total : 1);
    fprintf(
        stderr,
        "rw-bench: %s: %d prompts x %d, %lld response tokens drawn, KV %.1f GiB (%lld blocks)\n",
        what, P, N, (long long)want_tokens, (double)st.kv_bytes / RWB_GIB,
        (long long)st.kv_blocks_total);
    const double t0 = rw_now();
    for (int i = 0; i < P; i++) {
        for (int t = 0; t < plen[i]; t++)
            toks[t] = rwb_prompt_token(o->seed, i, t, cfg->vocab_size);
        rw_sampling sp = rw_sampling_default();
        sp.temperature = 1.0f;
        sp.seed = o->seed * 7919ull + (uint64_t)i * (uint64_t)N;
        sp.max_new_tokens = o->ro_cap;
        const rw_request_opts ro = {.n_samples = N, .sample_max_new = rlen + (size_t)i * N};
        RW_CHECKGOTO(rw_engine_add_ex(e, (uint64_t)i * N, toks, plen[i], &sp, &ro, &err), st_,
                     fail);
    }
    double sum_floor = 0, last_t = t0, last_progress = t0;
    int64_t last_gen = 0, peak_blocks = 0, peak_running = 0, steps = 0;
    int finished = 0;
    bool truncated = false;
    while (!rw_engine_idle(e)) {
        /* the step ends with sampling, which waits for the GPU: host time is GPU time */
        RW_CHECKGOTO(rw_engine_step(e, &err), st_, fail);
        const double now = rw_now();
        rw_engine_stats_get(e, &st);
        steps++;
        sum_floor += step_floor_s(fl, &st);
        if (st.kv_blocks_used > peak_blocks) peak_blocks = st.kv_blocks_used;
        if (st.running > peak_running) peak_running = st.running;
        rw_output *out;
        while ((out = rw_engine_pop_output(e))) {
            if (finished < total) done_t[finished++] = out->t_done - t0;
            rw_output_free(out);
        }
        if (now - last_t >= o->ro_dt || rw_engine_idle(e)) {
            const double rate = (double)(st.generated_tokens - last_gen) / (now - last_t);
            if (!series_add(&ser, now - t0, rate, &st)) {
                RW_ERR(&err, RW_E_OOM, "rollout: time series");
                goto fail;
            }
            last_t = now;
            last_gen = st.generated_tokens;
        }
        if (now - last_progress >= 30.0) { /* a long run says where it is */
            fprintf(stderr,
                    "rw-bench: %s: %.0f s, %d of %d sequences finished, %lld tokens, %lld "
                    "running\n",
                    what, now - t0, finished, total, (long long)st.generated_tokens,
                    (long long)st.running);
            last_progress = now;
        }
        if (rwb_out_of_time(c)) {
            truncated = true;
            break;
        }
    }
    const double wall = rw_now() - t0;
    rw_engine_stats_get(e, &st);
    if (truncated) {
        rw_engine_abort_all(e);
        rwb_free_outputs(e);
    }
    qsort(done_t, (size_t)finished, sizeof *done_t, cmp_double);
    const int k90 = (int)ceil(0.9 * total) - 1;
    const double t90 = finished > k90 && k90 >= 0 ? done_t[k90] : wall;
    json_t *j = rwb_line(c, "rollout", what);
    rwb_set_int(j, "prompts", P);
    rwb_set_int(j, "samples", N);
    rwb_set_int(j, "sequences", total);
    rwb_set_int(j, "finished", finished);
    rwb_set_int(j, "prompt_len_min", o->ro_pmin);
    rwb_set_int(j, "prompt_len_max", o->ro_pmax);
    rwb_set_int(j, "prompt_tokens", prompt_tokens);
    rwb_set_int(j, "response_median", o->ro_median);
    rwb_set_num(j, "response_sigma", o->ro_sigma);
    rwb_set_int(j, "response_cap", o->ro_cap);
    rwb_set_int(j, "tokens", want_tokens);
    rwb_set_int(j, "generated_tokens", st.generated_tokens);
    rwb_set_num(j, "wall_s", wall);
    rwb_set_num(j, "tok_per_s", (double)st.generated_tokens / wall);
    rwb_set_num(j, "tail_s", wall - t90);
    rwb_set_num(j, "t90_s", t90);
    rwb_set_int(j, "steps", steps);
    rwb_set_num(j, "floor_sum_s", sum_floor);
    rwb_set_int(j, "prefill_tokens", st.prompt_tokens);
    rwb_set_int(j, "kv_blocks_peak", peak_blocks);
    rwb_set_num(j, "kv_used_gib", (double)peak_blocks * (double)block_bytes / RWB_GIB);
    rwb_set_num(j, "kv_total_gib", (double)st.kv_bytes / RWB_GIB);
    rwb_set_int(j, "running_peak", peak_running);
    rwb_set_int(j, "max_running", o->ro_max_running);
    rwb_set_int(j, "max_batch_tokens", o->ro_max_batch_tokens);
    rwb_set_int(j, "preemptions", st.preemptions);
    rwb_set_int(j, "forked_samples", st.forked_samples);
    rwb_set_int(j, "prefix_hits", st.prefix_hits);
    rwb_set_int(j, "prefix_tokens_saved", st.prefix_tokens_saved);
    rwb_set_num(j, "hbm_gbps", fl->bw / 1e9);
    rwb_set_num(j, "gemm_tflops", fl->peak / 1e12);
    rwb_set_str(j, "sharing", sharing ? "on" : "off");
    rwb_set_str(j, "sampling",
                "temperature 1, full vocabulary; each sample stops at its drawn "
                "length");
    const double wall_stats[1] = {wall};
    rwb_stats ws = rwb_stats_of(wall_stats, 1);
    rwb_line_stats(j, &ws);
    /* achieved tok/s against the tok/s of running every step at its floor: the ratio is
     * floor_sum_s / wall_s */
    rwb_line_rate(j, (double)st.generated_tokens / wall, "tok/s",
                  sum_floor > 0 ? (double)st.generated_tokens / sum_floor : 0,
                  "every engine step at its floor: max(bytes / HBM bandwidth, FLOPs / bf16 GEMM "
                  "rate), summed (same run)");
    if (sharing)
        rwb_line_target(j, "R1", "rollout: sum of per-step floors / wall time >= 0.65",
                        truncated ? -1 : sum_floor / wall >= 0.65);
    if (truncated) rwb_set_str(j, "warning", "time limit reached: the rollout was cut short");
    json_t *sj = json_object();
    json_object_set_new(sj, "t_s", jarr_d(ser.t, ser.n));
    json_object_set_new(sj, "running", jarr_i(ser.running, ser.n));
    json_object_set_new(sj, "waiting", jarr_i(ser.waiting, ser.n));
    json_object_set_new(sj, "kv_tokens", jarr_i(ser.kv_tokens, ser.n));
    json_object_set_new(sj, "tok_per_s", jarr_d(ser.tok_s, ser.n));
    json_object_set_new(j, "series", sj);
    rwb_emit(j);
    goto out;
fail:
    rwb_emit_error(c, "rollout", what, &err);
    if (e) {
        rw_engine_abort_all(e);
        rwb_free_outputs(e);
    }
out:
    rw_engine_destroy(e);
    series_free(&ser);
    free(plen);
    free(rlen);
    free(toks);
    free(done_t);
}

void rwb_mode_rollout(rwb_ctx *c) {
    rw_err err = {0};
    double gbps = 0, t8192 = 0;
    if (rwb_engine_hbm(c, "rollout", &gbps, &err) != RW_OK) {
        rwb_emit_error(c, "rollout", "hbm_copy", &err);
        return;
    }
    rwb_gemm *g = NULL;
    if (rwb_gemm_create(c->o.gpu0, &g, &err) != RW_OK ||
        rwb_measure_gemm(c, g, "rollout", "gemm_bf16_8192", 8192, 8192, 8192, 1, true, &t8192,
                         &err) != RW_OK) {
        rwb_emit_error(c, "rollout", "gemm_bf16_8192", &err);
        t8192 = 0;
    }
    rwb_gemm_destroy(g);
    const double tflops = t8192 > 0 ? 2.0 * 8192.0 * 8192.0 * 8192.0 / t8192 / 1e12 : 0;
    rw_model *m = NULL;
    if (rwb_engine_model(c, false, &m, &err) != RW_OK) {
        rwb_emit_error(c, "rollout", "rollout_sharing", &err);
        return;
    }
    const step_floor fl = floor_model(m, gbps, tflops);
    for (int share = 1; share >= 0; share--) {
        if ((share && c->o.ro_sharing == 0) || (!share && c->o.ro_sharing == 1)) continue;
        if (rwb_out_of_time(c)) {
            rwb_emit_skip(c, "rollout", share ? "rollout_sharing" : "rollout_no_sharing",
                          "time limit reached", NULL);
            continue;
        }
        run_rollout(c, m, share, &fl);
    }
}

#else /* no worker module in this build */

void rwb_mode_rollout(rwb_ctx *c) {
    rw_err err = {0};
    RW_ERR(&err, RW_E_UNSUPPORTED, "the worker module (engine API) is not in this build");
    rwb_emit_error(c, "rollout", "rollout_sharing", &err);
}
#endif
