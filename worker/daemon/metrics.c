/* metrics.c - latency histograms of rank 0's server (recorded in its loop, written into `stats`)
 * and the Prometheus text exposition of a `stats` reply (GET /metrics). The metric names follow
 * Prometheus' conventions (base units, _total for counters, _seconds / _bytes) under the prefix
 * rw_; docs/PROTOCOL.md section 6.5 lists them. */
#include "metrics.h"

#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------------------------------------ */
/* Histograms                                                                                   */
/* ------------------------------------------------------------------------------------------ */
static void hist_init(rw_hist *h, const double *le, int n) {
    memset(h, 0, sizeof *h);
    h->n = n < RW_HIST_MAX ? n : RW_HIST_MAX;
    memcpy(h->le, le, sizeof(double) * (size_t)h->n);
}

void rw_srv_metrics_init(rw_srv_metrics *m) {
    /* bounds for a rollout worker: first tokens from milliseconds (tiny models, warm batch) to a
     * minute (long prompts queued behind a paused update), gaps from a millisecond to seconds */
    static const double ttft[] = {0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5,
                                  0.75,  1,     2.5,  5,    7.5,  10,   15,   20,  30,   60};
    static const double itl[] = {0.001, 0.002, 0.005, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05,
                                 0.075, 0.1,   0.15,  0.2,  0.3,   0.4,  0.5,   0.75, 1,    2.5};
    static const double e2e[] = {0.1, 0.25, 0.5, 1,  2.5, 5,   10,  15,  20,
                                 30,  40,   50,  60, 120, 300, 600, 1200};
    static const double upd[] = {0.01, 0.05, 0.1, 0.25, 0.5, 1,   2,  5,
                                 10,   20,   30,  60,   120, 300, 600};
    memset(m, 0, sizeof *m);
    hist_init(&m->ttft, ttft, (int)(sizeof ttft / sizeof *ttft));
    hist_init(&m->itl, itl, (int)(sizeof itl / sizeof *itl));
    hist_init(&m->e2e, e2e, (int)(sizeof e2e / sizeof *e2e));
    hist_init(&m->update_s, upd, (int)(sizeof upd / sizeof *upd));
}

void rw_hist_observe(rw_hist *h, double v, uint64_t times) {
    if (!times || !isfinite(v)) return;
    if (v < 0) v = 0;
    int b = 0;
    while (b < h->n && v > h->le[b])
        b++;
    h->cnt[b] += times;
    h->count += times;
    h->sum += v * (double)times;
}

void rw_srv_metrics_request(rw_srv_metrics *m, double t_arrival, double t_first, double t_done,
                            int ntok) {
    rw_hist_observe(&m->e2e, t_done - t_arrival, 1);
    if (ntok < 1 || t_first <= 0) return;
    rw_hist_observe(&m->ttft, t_first - t_arrival, 1);
    /* the engine stamps the first and the last token only: each of the ntok - 1 gaps is counted
     * with the request's mean gap */
    if (ntok > 1) rw_hist_observe(&m->itl, (t_done - t_first) / (ntok - 1), (uint64_t)(ntok - 1));
}

void rw_srv_metrics_update(rw_srv_metrics *m, double seconds, uint64_t bytes) {
    rw_hist_observe(&m->update_s, seconds, 1);
    m->update_bytes_total += bytes;
}

void rw_hist_write(rw_mw *w, const rw_hist *h) {
    rw_mw_map(w, 4);
    rw_mw_str(w, "le");
    rw_mw_array(w, (uint32_t)h->n);
    for (int i = 0; i < h->n; i++)
        rw_mw_f64(w, h->le[i]);
    rw_mw_str(w, "counts");
    rw_mw_array(w, (uint32_t)h->n);
    uint64_t c = 0;
    for (int i = 0; i < h->n; i++) {
        c += h->cnt[i];
        rw_mw_u64(w, c);
    }
    rw_mw_kv_u64(w, "count", h->count);
    rw_mw_kv_f64(w, "sum", h->sum);
}

/* ------------------------------------------------------------------------------------------ */
/* Text buffer                                                                                  */
/* ------------------------------------------------------------------------------------------ */
void rw_tbuf_put(rw_tbuf *b, const char *s, size_t n) {
    if (b->failed) return;
    if (b->n + n + 1 > b->cap) {
        size_t nc = b->cap ? b->cap : 4096;
        while (nc < b->n + n + 1)
            nc *= 2;
        char *p = realloc(b->p, nc);
        if (!p) {
            b->failed = 1;
            return;
        }
        b->p = p;
        b->cap = nc;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
}

void rw_tbuf_printf(rw_tbuf *b, const char *fmt, ...) {
    char small[512];
    va_list ap;
    va_start(ap, fmt);
    int k = vsnprintf(small, sizeof small, fmt, ap);
    va_end(ap);
    if (k < 0) {
        b->failed = 1;
        return;
    }
    if ((size_t)k < sizeof small) {
        rw_tbuf_put(b, small, (size_t)k);
        return;
    }
    char *big = malloc((size_t)k + 1);
    if (!big) {
        b->failed = 1;
        return;
    }
    va_start(ap, fmt);
    vsnprintf(big, (size_t)k + 1, fmt, ap);
    va_end(ap);
    rw_tbuf_put(b, big, (size_t)k);
    free(big);
}

void rw_tbuf_free(rw_tbuf *b) {
    free(b->p);
    memset(b, 0, sizeof *b);
}

/* ------------------------------------------------------------------------------------------ */
/* Prometheus text                                                                              */
/* ------------------------------------------------------------------------------------------ */
typedef struct render {
    rw_tbuf b;
    const json_t *root;
    char missing[96]; /* the first field that was not there */
} render;

/* The value at a dotted path ("queue.running"), or NULL (recorded as missing). */
static const json_t *at(render *r, const char *path) {
    const json_t *j = r->root;
    char key[64];
    const char *p = path;
    while (j && *p) {
        const char *dot = strchr(p, '.');
        size_t n = dot ? (size_t)(dot - p) : strlen(p);
        snprintf(key, sizeof key, "%.*s", (int)n, p);
        j = json_object_get(j, key);
        p += n + (dot ? 1 : 0);
    }
    if (!j && !r->missing[0]) snprintf(r->missing, sizeof r->missing, "%s", path);
    return j;
}

static double num(render *r, const char *path) {
    const json_t *j = at(r, path);
    if (json_is_boolean(j)) return json_is_true(j) ? 1 : 0;
    if (!json_is_number(j)) {
        if (!r->missing[0]) snprintf(r->missing, sizeof r->missing, "%s", path);
        return 0;
    }
    return json_number_value(j);
}

static void head(render *r, const char *name, const char *type, const char *help) {
    rw_tbuf_printf(&r->b, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

static void sample(render *r, const char *name, double v) {
    if (v == floor(v) && fabs(v) < 9e15)
        rw_tbuf_printf(&r->b, "%s %.0f\n", name, v);
    else
        rw_tbuf_printf(&r->b, "%s %.17g\n", name, v);
}

static void metric(render *r, const char *name, const char *type, const char *help,
                   const char *path) {
    head(r, name, type, help);
    sample(r, name, num(r, path));
}

/* A label value with \, " and newline escaped, as the text format requires. */
static void label_value(rw_tbuf *b, const char *s) {
    for (; *s; s++) {
        if (*s == '\\')
            rw_tbuf_put(b, "\\\\", 2);
        else if (*s == '"')
            rw_tbuf_put(b, "\\\"", 2);
        else if (*s == '\n')
            rw_tbuf_put(b, "\\n", 2);
        else
            rw_tbuf_put(b, s, 1);
    }
}

static void histogram(render *r, const char *name, const char *help, const char *path) {
    const json_t *h = at(r, path);
    const json_t *le = json_object_get(h, "le"), *cnt = json_object_get(h, "counts");
    if (!json_is_array(le) || !json_is_array(cnt) || json_array_size(le) != json_array_size(cnt)) {
        if (!r->missing[0]) snprintf(r->missing, sizeof r->missing, "%s", path);
        return;
    }
    head(r, name, "histogram", help);
    for (size_t i = 0; i < json_array_size(le); i++)
        rw_tbuf_printf(&r->b, "%s_bucket{le=\"%.17g\"} %.0f\n", name,
                       json_number_value(json_array_get(le, i)),
                       json_number_value(json_array_get(cnt, i)));
    const double count = json_number_value(json_object_get(h, "count"));
    rw_tbuf_printf(&r->b, "%s_bucket{le=\"+Inf\"} %.0f\n", name, count);
    rw_tbuf_printf(&r->b, "%s_sum %.17g\n", name, json_number_value(json_object_get(h, "sum")));
    rw_tbuf_printf(&r->b, "%s_count %.0f\n", name, count);
}

static const char *str(render *r, const char *path) {
    const json_t *j = at(r, path);
    return json_is_string(j) ? json_string_value(j) : "";
}

rw_status rw_metrics_render(const char *stats_json, const char *model, char **out, rw_err *err) {
    *out = NULL;
    json_error_t je;
    json_t *root = json_loads(stats_json, 0, &je);
    if (!json_is_object(root)) {
        json_decref(root);
        RW_FAIL(err, RW_E_FORMAT, "metrics: the stats reply is not a JSON object (%s)", je.text);
    }
    render rr = {.root = root};
    render *r = &rr;
    head(r, "rw_info", "gauge", "Constant 1, labelled with what this worker serves.");
    rw_tbuf_put(&r->b, "rw_info{version=\"", 17);
    label_value(&r->b, RW_VERSION);
    rw_tbuf_put(&r->b, "\",model=\"", 9);
    label_value(&r->b, model ? model : "");
    rw_tbuf_put(&r->b, "\",device=\"", 10);
    label_value(&r->b, str(r, "device"));
    rw_tbuf_printf(&r->b, "\",tp=\"%.0f\"} 1\n", num(r, "tp"));
    head(r, "rw_worker_state", "gauge",
         "1 for the worker's current state (serving, paused, updating, weights_incomplete, "
         "weights_released).");
    static const char *const states[] = {"serving", "paused", "updating", "weights_incomplete",
                                         "weights_released"};
    const char *state = str(r, "state");
    for (size_t i = 0; i < sizeof states / sizeof *states; i++)
        rw_tbuf_printf(&r->b, "rw_worker_state{state=\"%s\"} %d\n", states[i],
                       !strcmp(state, states[i]));
    metric(r, "rw_uptime_seconds", "gauge", "Seconds since the worker started.", "uptime_s");
    metric(r, "rw_num_requests_running", "gauge", "Requests in the running batch.",
           "queue.running");
    metric(r, "rw_num_requests_waiting", "gauge", "Requests queued (not yet admitted).",
           "queue.waiting");
    metric(r, "rw_generation_paused", "gauge", "1 while generation is paused.", "queue.paused");
    metric(r, "rw_requests_total", "counter", "Requests received (prompts x n).",
           "throughput.requests");
    metric(r, "rw_requests_finished_total", "counter", "Requests finished (any finish reason).",
           "throughput.requests_finished");
    metric(r, "rw_generation_tokens_total", "counter", "Tokens generated.",
           "throughput.generated_tokens");
    metric(r, "rw_prompt_tokens_total", "counter",
           "Tokens run through prefill (recomputation after a retraction included).",
           "throughput.prefill_tokens");
    metric(r, "rw_preemptions_total", "counter", "Requests retracted to free KV cache.",
           "throughput.preemptions");
    metric(r, "rw_engine_steps_total", "counter", "Engine steps (forward passes).",
           "throughput.steps");
    metric(r, "rw_engine_step_seconds_total", "counter",
           "Wall seconds of the engine steps that ran a forward pass.", "throughput.step_seconds");
    metric(r, "rw_engine_model_seconds_total", "counter",
           "Of those, seconds in the model's calls (forward, KV copies, sampling; the device's "
           "time included).",
           "throughput.model_seconds");
    metric(r, "rw_generation_tokens_per_second", "gauge",
           "Generation throughput over the last steps.", "throughput.generated_tokens_per_s");
    metric(r, "rw_commands_total", "counter", "Control commands received.", "throughput.commands");
    metric(r, "rw_error_replies_total", "counter", "Error replies sent.", "errors");
    const double used = num(r, "memory.kv_blocks_used"), total = num(r, "memory.kv_blocks_total");
    head(r, "rw_kv_cache_usage_ratio", "gauge", "Fraction of the KV cache's blocks in use.");
    sample(r, "rw_kv_cache_usage_ratio", total > 0 ? used / total : 0);
    metric(r, "rw_kv_cache_blocks_used", "gauge", "KV cache blocks in use.",
           "memory.kv_blocks_used");
    metric(r, "rw_kv_cache_capacity_blocks", "gauge", "KV cache blocks in all.",
           "memory.kv_blocks_total");
    metric(r, "rw_kv_cache_bytes", "gauge", "Bytes of the KV cache (rank 0).", "memory.kv_bytes");
    metric(r, "rw_weights_bytes", "gauge", "Bytes of rank 0's weights.", "memory.weights_bytes");
    histogram(r, "rw_time_to_first_token_seconds",
              "Seconds from a generate command's arrival to a request's first token.",
              "latency.ttft");
    histogram(r, "rw_inter_token_latency_seconds",
              "Seconds between two generated tokens of a request (its mean gap, once per gap).",
              "latency.itl");
    histogram(r, "rw_e2e_request_latency_seconds",
              "Seconds from a generate command's arrival to a request's end.", "latency.e2e");
    head(r, "rw_weight_version_info", "gauge", "1, labelled with the weight version served.");
    rw_tbuf_put(&r->b, "rw_weight_version_info{version=\"", 32);
    label_value(&r->b, str(r, "weights.version"));
    rw_tbuf_put(&r->b, "\"} 1\n", 5);
    metric(r, "rw_weight_versions_served", "gauge", "Weight versions stamped since start.",
           "weights.versions_served");
    metric(r, "rw_weight_updates_total", "counter", "Committed weight updates.", "weights.updates");
    metric(r, "rw_weight_updates_aborted_total", "counter", "Weight update sessions aborted.",
           "weights.updates_aborted");
    metric(r, "rw_weight_update_bytes_total", "counter", "Bytes of every committed update.",
           "weights.update_bytes_total");
    metric(r, "rw_weight_update_last_seconds", "gauge",
           "Seconds of the last committed update (begin to weights ready).",
           "weights.last_update_s");
    metric(r, "rw_weight_update_last_bytes", "gauge", "Bytes of the last committed update.",
           "weights.last_update_bytes");
    histogram(r, "rw_weight_update_duration_seconds",
              "Seconds of each committed weight update (begin to weights ready).",
              "weights.update_seconds");
    json_decref(root);
    if (r->missing[0]) {
        rw_tbuf_free(&r->b);
        RW_FAIL(err, RW_E_FORMAT, "metrics: the stats reply has no field '%s'", r->missing);
    }
    if (r->b.failed) {
        rw_tbuf_free(&r->b);
        RW_FAIL(err, RW_E_OOM, "metrics: out of memory");
    }
    *out = r->b.p;
    return RW_OK;
}
