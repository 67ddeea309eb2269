/* out.c - rw-bench result lines (one JSON object per line on stdout), order statistics, run
 * metadata (commit, device, date, command), and small model helpers shared by the modes. */
#include "bench.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench_version.h"
#include "order.h"
#include "rand.h"

/* ------------------------------------------------------------------------------------------ */
/* Statistics                                                                                   */
/* ------------------------------------------------------------------------------------------ */
/* Linear interpolation between order statistics (the "R-7" rule numpy uses by default). */
static double pct(const double *s, int n, double q) {
    if (n == 1) return s[0];
    double h = (n - 1) * q;
    int lo = (int)floor(h);
    int hi = lo + 1 < n ? lo + 1 : n - 1;
    return s[lo] + (h - lo) * (s[hi] - s[lo]);
}

rwb_stats rwb_stats_of(const double *x, int n) {
    rwb_stats r;
    memset(&r, 0, sizeof r);
    if (n <= 0) return r;
    double *s = malloc(sizeof(double) * (size_t)n);
    if (!s) return r;
    memcpy(s, x, sizeof(double) * (size_t)n);
    qsort(s, (size_t)n, sizeof(double), rwb_cmp_double);
    r.n = n;
    r.median = pct(s, n, 0.5);
    r.p10 = pct(s, n, 0.1);
    r.p90 = pct(s, n, 0.9);
    r.min = s[0];
    r.max = s[n - 1];
    free(s);
    return r;
}

/* ------------------------------------------------------------------------------------------ */
/* Lines                                                                                        */
/* ------------------------------------------------------------------------------------------ */
void rwb_set_num(json_t *j, const char *key, double v) {
    json_object_set_new(j, key, isfinite(v) ? json_real(v) : json_null());
}
void rwb_set_int(json_t *j, const char *key, int64_t v) {
    json_object_set_new(j, key, json_integer((json_int_t)v));
}
void rwb_set_str(json_t *j, const char *key, const char *v) {
    json_object_set_new(j, key, v ? json_string(v) : json_null());
}

json_t *rwb_line(const rwb_ctx *c, const char *bench, const char *what) {
    json_t *j = json_object();
    if (!j) return NULL;
    rwb_set_str(j, "bench", bench);
    rwb_set_str(j, "what", what);
    rwb_set_str(j, "commit", c->meta.commit);
    rwb_set_str(j, "device", c->meta.device);
    rwb_set_str(j, "date", c->meta.date);
    rwb_set_str(j, "cmd", c->meta.cmd);
    return j;
}

void rwb_line_stats(json_t *j, const rwb_stats *s) {
    rwb_set_num(j, "median_s", s->median);
    rwb_set_num(j, "p10_s", s->p10);
    rwb_set_num(j, "p90_s", s->p90);
    rwb_set_num(j, "min_s", s->min);
    rwb_set_num(j, "max_s", s->max);
    rwb_set_int(j, "reps", s->n);
}

void rwb_line_rate(json_t *j, double achieved, const char *unit, double ceiling,
                   const char *ceiling_what) {
    rwb_set_num(j, "achieved", achieved);
    rwb_set_str(j, "unit", unit);
    if (ceiling > 0 && isfinite(ceiling)) {
        rwb_set_num(j, "ceiling", ceiling);
        rwb_set_num(j, "ratio", achieved / ceiling);
    } else {
        json_object_set_new(j, "ceiling", json_null());
        json_object_set_new(j, "ratio", json_null());
    }
    rwb_set_str(j, "ceiling_what", ceiling_what);
}

void rwb_line_target(json_t *j, const char *id, const char *text, int met) {
    rwb_set_str(j, "target_id", id);
    rwb_set_str(j, "target", text);
    json_object_set_new(j, "met", met < 0 ? json_null() : json_boolean(met));
}

void rwb_emit(json_t *j) {
    if (!j) return;
    char *s = json_dumps(j, JSON_COMPACT | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(7));
    if (s) {
        fputs(s, stdout);
        fputc('\n', stdout);
        fflush(stdout);
        free(s);
    }
    json_decref(j);
}

void rwb_emit_error(rwb_ctx *c, const char *bench, const char *what, const rw_err *err) {
    json_t *j = rwb_line(c, bench, what);
    rwb_set_str(j, "error", err && err->msg[0] ? err->msg : "unknown error");
    rwb_set_str(j, "status", err ? rw_status_str(err->status) : "internal");
    fprintf(stderr, "rw-bench: %s %s: %s\n", bench, what, err && err->msg[0] ? err->msg : "?");
    rwb_emit(j);
    c->failures++;
}

void rwb_emit_skip(rwb_ctx *c, const char *bench, const char *what, const char *why,
                   json_t *params) {
    json_t *j = rwb_line(c, bench, what);
    if (params) {
        json_object_update(j, params);
        json_decref(params);
    }
    rwb_set_str(j, "skipped", why);
    fprintf(stderr, "rw-bench: %s %s skipped: %s\n", bench, what, why);
    rwb_emit(j);
}

bool rwb_out_of_time(const rwb_ctx *c) { return c->t_deadline > 0 && rw_now() > c->t_deadline; }

/* ------------------------------------------------------------------------------------------ */
/* Metadata                                                                                     */
/* ------------------------------------------------------------------------------------------ */
void rwb_meta_init(rwb_meta *m, const rwb_opts *o, int argc, char **argv) {
    (void)o;
    memset(m, 0, sizeof *m);
    const char *env = getenv("RW_COMMIT");
    snprintf(m->commit, sizeof m->commit, "%s", env && *env ? env : RWB_BUILD_COMMIT);
    rwb_device_desc(m->device, sizeof m->device);
    time_t t = time(NULL);
    struct tm tm;
    gmtime_r(&t, &tm);
    strftime(m->date, sizeof m->date, "%Y-%m-%dT%H:%M:%SZ", &tm);
    size_t len = 1;
    for (int i = 0; i < argc; i++) len += strlen(argv[i]) + 1;
    m->cmd = malloc(len + 16);
    if (!m->cmd) return;
    m->cmd[0] = 0;
    for (int i = 0; i < argc; i++) {
        const char *a = i == 0 ? "rw-bench" : argv[i]; /* the build path says nothing useful */
        if (i) strcat(m->cmd, " ");
        strcat(m->cmd, a);
    }
}

void rwb_meta_free(rwb_meta *m) {
    free(m->cmd);
    m->cmd = NULL;
}

/* ------------------------------------------------------------------------------------------ */
/* Model helpers                                                                                */
/* ------------------------------------------------------------------------------------------ */
typedef struct bytes_ctx {
    const rw_config *cfg;
    uint64_t bytes, largest;
} bytes_ctx;

static rw_status add_bytes(const rw_wname *w, void *vctx) {
    bytes_ctx *b = vctx;
    int nd;
    int64_t shape[RW_MAX_DIMS];
    RW_CHECK(rw_config_weight_shape(b->cfg, w, &nd, shape, NULL));
    uint64_t n = (uint64_t)rw_shape_numel(nd, shape) * 2u;
    b->bytes += n;
    if (n > b->largest) b->largest = n;
    return RW_OK;
}

uint64_t rwb_model_bf16_bytes(const rw_config *cfg) {
    bytes_ctx b = {cfg, 0, 0};
    if (rw_config_for_each_weight(cfg, add_bytes, &b) != RW_OK) return 0;
    return b.bytes;
}

uint64_t rwb_model_largest_tensor(const rw_config *cfg) {
    bytes_ctx b = {cfg, 0, 0};
    if (rw_config_for_each_weight(cfg, add_bytes, &b) != RW_OK) return 0;
    return b.largest;
}

rw_status rwb_config_mxfp8_last(const rw_config *src, int last_n, rw_config *out, rw_err *err) {
    RW_CHECK(rw_config_copy(src, out, err));
    rw_config_free(out); /* drop any not_convert list copied from src; scalars stay */
    memset(&out->quant, 0, sizeof out->quant);
    if (last_n < 0 || last_n > out->num_layers || last_n > RW_MAX_NOT_CONVERT)
        RW_FAIL(err, RW_E_RANGE, "last %d bf16 layers: the model has %d", last_n, out->num_layers);
    out->quant.method = RW_QMETHOD_MXFP8;
    out->quant.block[0] = 1;
    out->quant.block[1] = 32;
    snprintf(out->quant.fmt, sizeof out->quant.fmt, "e4m3");
    snprintf(out->quant.scale_fmt, sizeof out->quant.scale_fmt, "ue8m0");
    snprintf(out->quant.activation_scheme, sizeof out->quant.activation_scheme, "dynamic");
    for (int k = out->num_layers - last_n; k < out->num_layers; k++) {
        char p[48];
        snprintf(p, sizeof p, "model.layers.%d.", k);
        char *d = strdup(p);
        if (!d) {
            rw_config_free(out);
            RW_FAIL(err, RW_E_OOM, "out of memory");
        }
        out->quant.not_convert[out->quant.n_not_convert++] = d;
    }
    return RW_OK;
}

int32_t rwb_prompt_token(uint64_t seed, int seq, int pos, int vocab) {
    const uint64_t z = seed ^ ((uint64_t)(uint32_t)seq << 32) ^ (uint64_t)(uint32_t)pos;
    return (int32_t)(rw_splitmix64(z) % (uint64_t)vocab);
}
