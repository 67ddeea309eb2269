/* oplog.h - the operator log of the control server (oplog.c): one line per event an operator
 * audits, in one format, at info level (docs/OPERATIONS.md lists every event and its keys):
 *
 *     [rw I 12:00:00.000] <event> key=value key="text" ...
 *
 * Events a peer can trigger at will (authentication failures, refused messages, refused work)
 * go through a rate limit: at most RW_OPLOG_BURST lines per RW_OPLOG_WINDOW_S seconds per limit,
 * the others counted and reported as suppressed=N on the next line that passes. Text values are
 * quoted with every byte outside printable ASCII escaped, so nothing a client sends can forge a
 * line or reach the terminal raw. */
#ifndef RW_DAEMON_OPLOG_H
#define RW_DAEMON_OPLOG_H

#include "rw_core.h"

#ifdef __cplusplus
extern "C" {
#endif

#define RW_OPLOG_BURST 10
#define RW_OPLOG_WINDOW_S 10.0

/* The state of one rate limit (the caller's; zero-initialised). */
typedef struct rw_oplog_rate {
    double t0;           /* start of the current window */
    int n;               /* lines in the window */
    uint64_t suppressed; /* lines dropped since the last one written */
} rw_oplog_rate;

/* Writes one event line; `fmt` (printf) gives the key=value part (NULL: none). */
void rw_oplog(const char *event, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* The same through the rate limit `r`. */
void rw_oplog_limited(rw_oplog_rate *r, const char *event, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* s[0..n) as a quoted value into buf[cap] ("..." with \", \\ and \xNN escapes; cut with ... to
 * fit). Returns buf. */
const char *rw_oplog_quote(const char *s, size_t n, char *buf, size_t cap);
/* A peer's ZeroMQ routing id as hex (its first 16 bytes). Returns buf. */
const char *rw_oplog_hex(const void *id, size_t n, char *buf, size_t cap);

#ifdef __cplusplus
}
#endif

#endif
