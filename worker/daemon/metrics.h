/* metrics.h - the worker's latency histograms and their two renderings: recorded by rank 0's
 * server loop (one thread: no locks), written into the `stats` reply (msgpack), and turned into
 * the Prometheus text exposition format by the HTTP server from that reply (GET /metrics), so
 * every number /metrics shows is one the control protocol shows too.
 *
 * A histogram here is Prometheus' kind: fixed upper bounds `le` (ascending), a count per bucket,
 * the count of observations and their sum. On the wire (stats): {le: [f64], counts: [u64]
 * (cumulative, one per bound, the last bound is +Inf implicitly = count), count: u64, sum: f64}. */
#ifndef RW_DAEMON_METRICS_H
#define RW_DAEMON_METRICS_H

#include <stddef.h>
#include <stdint.h>

#include "rw_msg.h"

#ifdef __cplusplus
extern "C" {
#endif

#define RW_HIST_MAX 32

typedef struct rw_hist {
    int n;                         /* bounds */
    double le[RW_HIST_MAX];        /* upper bounds, ascending; +Inf is implicit */
    uint64_t cnt[RW_HIST_MAX + 1]; /* per bucket (not cumulative); [n] above the last bound */
    uint64_t count;
    double sum;
} rw_hist;

/* The histograms and counters of rank 0's server (server_internal.h holds one). */
typedef struct rw_srv_metrics {
    rw_hist ttft;     /* seconds from a generate command's arrival to a request's first token */
    rw_hist itl;      /* seconds between two tokens of a request (its mean gap, once per gap) */
    rw_hist e2e;      /* seconds from arrival to the request's end */
    rw_hist update_s; /* seconds of each committed weight update (begin -> weights ready) */
    uint64_t update_bytes_total; /* bytes of every committed update */
} rw_srv_metrics;

void rw_srv_metrics_init(rw_srv_metrics *m);
/* One finished request: arrival, first token and end stamps (rw_now), tokens made. */
void rw_srv_metrics_request(rw_srv_metrics *m, double t_arrival, double t_first, double t_done,
                            int ntok);
void rw_srv_metrics_update(rw_srv_metrics *m, double seconds, uint64_t bytes);

void rw_hist_observe(rw_hist *h, double v, uint64_t times);
/* Writes one histogram as a msgpack map (the wire form above). */
void rw_hist_write(rw_mw *w, const rw_hist *h);

/* A growable text buffer (for the exposition text); errors are sticky (failed). */
typedef struct rw_tbuf {
    char *p;
    size_t n, cap;
    int failed;
} rw_tbuf;
void rw_tbuf_printf(rw_tbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void rw_tbuf_put(rw_tbuf *b, const char *s, size_t n);
void rw_tbuf_free(rw_tbuf *b);

/* Renders the Prometheus text format (version 0.0.4) from a `stats` result given as JSON text
 * (docs/PROTOCOL.md 4.7) into *out (malloc'd, NUL-terminated, caller frees). `model` labels
 * nothing: it goes into rw_info. RW_E_FORMAT when the stats lack a field (message names it). */
rw_status rw_metrics_render(const char *stats_json, const char *model, char **out, rw_err *err);

#ifdef __cplusplus
}
#endif

#endif
