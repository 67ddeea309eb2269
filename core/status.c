/* status.c - status names, detailed errors, logging, clocks, file reading, PRNG and checksums. */
#include "rw_core.h"
#include "rand.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <xxhash.h>

const char *rw_status_str(rw_status s) {
    switch (s) {
    case RW_OK: return "ok";
    case RW_E_INVALID_ARG: return "invalid_arg";
    case RW_E_OOM: return "out_of_memory";
    case RW_E_IO: return "io";
    case RW_E_FORMAT: return "format";
    case RW_E_UNSUPPORTED: return "unsupported";
    case RW_E_NOT_FOUND: return "not_found";
    case RW_E_SHAPE: return "shape";
    case RW_E_DTYPE: return "dtype";
    case RW_E_CUDA: return "cuda";
    case RW_E_NCCL: return "nccl";
    case RW_E_ZMQ: return "zmq";
    case RW_E_TIMEOUT: return "timeout";
    case RW_E_STATE: return "state";
    case RW_E_PROTOCOL: return "protocol";
    case RW_E_BUSY: return "busy";
    case RW_E_WEIGHTS_INCOMPLETE: return "weights_incomplete";
    case RW_E_ABORTED: return "aborted";
    case RW_E_INTERNAL: return "internal";
    case RW_E_AUTH: return "auth";
    case RW_E_NO_DEVICE: return "no_device";
    case RW_E_RANGE: return "range";
    }
    return "unknown_status";
}

rw_status rw_err_set(rw_err *e, rw_status s, const char *file, int line, const char *fmt, ...) {
    if (!e) return s;
    e->status = s;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->msg, sizeof e->msg, fmt, ap);
    va_end(ap);
    const char *base = file ? strrchr(file, '/') : NULL;
    snprintf(e->where, sizeof e->where, "%s:%d", base ? base + 1 : (file ? file : "?"), line);
    if (rw_log_enabled(RW_LOG_DEBUG))
        rw_log(RW_LOG_DEBUG, "error %s at %s: %s", rw_status_str(s), e->where, e->msg);
    return s;
}

rw_status rw_err_prefix(rw_err *e, const char *fmt, ...) {
    if (!e) return RW_OK;
    char pre[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(pre, sizeof pre, fmt, ap);
    va_end(ap);
    char old[sizeof e->msg];
    memcpy(old, e->msg, sizeof old);
    snprintf(e->msg, sizeof e->msg, "%s: %s", pre, old);
    return e->status;
}

void rw_err_clear(rw_err *e) {
    if (!e) return;
    e->status = RW_OK;
    e->msg[0] = 0;
    e->where[0] = 0;
}

/* The level is configuration read from the environment on each call: getenv is cheap next to
 * formatting a line, and no process-wide state has to be initialised or kept. */
static int log_level_from_env(void) {
    const char *v = getenv("RW_LOG");
    if (!v || !*v) return RW_LOG_INFO;
    if (!strcmp(v, "error")) return RW_LOG_ERROR;
    if (!strcmp(v, "warn")) return RW_LOG_WARN;
    if (!strcmp(v, "info")) return RW_LOG_INFO;
    if (!strcmp(v, "debug")) return RW_LOG_DEBUG;
    if (!strcmp(v, "trace")) return RW_LOG_TRACE;
    if (v[0] >= '0' && v[0] <= '4' && !v[1]) return v[0] - '0';
    return RW_LOG_INFO;
}

bool rw_log_enabled(rw_log_level lvl) { return (int)lvl <= log_level_from_env(); }

void rw_log(rw_log_level lvl, const char *fmt, ...) {
    if (!rw_log_enabled(lvl)) return;
    static const char *tags[] = {"E", "W", "I", "D", "T"};
    char line[2048];
    const char *pre = getenv("RW_LOG_PREFIX");
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    struct tm tm;
    gmtime_r(&ts.tv_sec, &tm);
    int n = snprintf(line, sizeof line, "[rw %s %02d:%02d:%02d.%03ld%s%s] ", tags[lvl], tm.tm_hour,
                     tm.tm_min, tm.tm_sec, ts.tv_nsec / 1000000, pre ? " " : "", pre ? pre : "");
    va_list ap;
    va_start(ap, fmt);
    if (n > 0 && (size_t)n < sizeof line) vsnprintf(line + n, sizeof line - (size_t)n, fmt, ap);
    va_end(ap);
    /* messages quote what clients sent: no control byte reaches the log as it is (one line per
     * event, no terminal escapes) */
    for (char *p = line; *p; p++)
        if ((unsigned char)*p < 0x20 || *p == 0x7f) *p = '?';
    fprintf(stderr, "%s\n", line);
}

double rw_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

rw_status rw_read_file(const char *path, char **out, size_t *len, rw_err *err) {
    *out = NULL;
    FILE *f = fopen(path, "rb");
    if (!f) RW_FAIL(err, RW_E_IO, "cannot open %s: %s", path, strerror(errno));
    size_t cap = 4096, n = 0;
    char *buf = malloc(cap);
    if (!buf) {
        fclose(f);
        RW_FAIL(err, RW_E_OOM, "out of memory reading %s", path);
    }
    for (;;) {
        if (n + 1 >= cap) {
            char *nb = realloc(buf, cap * 2);
            if (!nb) {
                free(buf);
                fclose(f);
                RW_FAIL(err, RW_E_OOM, "out of memory reading %s", path);
            }
            buf = nb;
            cap *= 2;
        }
        size_t got = fread(buf + n, 1, cap - n - 1, f);
        n += got;
        if (got == 0) break;
    }
    int bad = ferror(f);
    fclose(f);
    if (bad) {
        free(buf);
        RW_FAIL(err, RW_E_IO, "read error on %s", path);
    }
    buf[n] = 0;
    *out = buf;
    if (len) *len = n;
    return RW_OK;
}

bool rw_secret_equal(const char *want, const void *got, size_t n) {
    const unsigned char *g = got;
    size_t wn = strlen(want);
    unsigned diff = (unsigned)(wn ^ n);
    for (size_t i = 0; i < wn; i++)
        diff |= (unsigned)(unsigned char)want[i] ^ (unsigned)(i < n ? g[i] : 0);
    return diff == 0;
}

void rw_rng_seed(rw_rng *r, uint64_t seed) {
    /* the splitmix64 stream seed + g, seed + 2g, ...: the seeding xoshiro's authors recommend */
    for (int i = 0; i < 4; i++) r->s[i] = rw_splitmix64(seed + (uint64_t)i * 0x9e3779b97f4a7c15ull);
}

uint64_t rw_rng_u64(rw_rng *r) {
    return rw_rng_next(r);
}

double rw_rng_uniform(rw_rng *r) { return (double)(rw_rng_u64(r) >> 11) * 0x1.0p-53; }

float rw_rng_normal(rw_rng *r) {
    double u1 = rw_rng_uniform(r), u2 = rw_rng_uniform(r);
    if (u1 < 1e-300) u1 = 1e-300;
    return (float)(sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
}

uint64_t rw_checksum64(const void *bytes, size_t len, uint64_t seed) {
    return (uint64_t)XXH3_64bits_withSeed(bytes, len, (XXH64_hash_t)seed);
}
