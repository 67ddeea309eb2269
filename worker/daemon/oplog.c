/* oplog.c - the operator log lines of the control server (oplog.h): formatting, quoting of text
 * that came from clients, and the rate limit of events a peer can trigger at will. */
#include "oplog.h"

#include "rw_msg.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>

static void emit(const char *event, uint64_t suppressed, const char *fmt, va_list ap) {
    char body[1200];
    body[0] = 0;
    if (fmt) vsnprintf(body, sizeof body, fmt, ap);
    if (suppressed)
        RW_LOGI("%s %s%ssuppressed=%" PRIu64, event, body, body[0] ? " " : "", suppressed);
    else
        RW_LOGI("%s%s%s", event, body[0] ? " " : "", body);
}

void rw_oplog(const char *event, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    emit(event, 0, fmt, ap);
    va_end(ap);
}

void rw_oplog_limited(rw_oplog_rate *r, const char *event, const char *fmt, ...) {
    const double now = rw_now();
    if (now - r->t0 >= RW_OPLOG_WINDOW_S) {
        r->t0 = now;
        r->n = 0;
    }
    if (r->n >= RW_OPLOG_BURST) {
        r->suppressed++;
        return;
    }
    r->n++;
    va_list ap;
    va_start(ap, fmt);
    emit(event, r->suppressed, fmt, ap);
    va_end(ap);
    r->suppressed = 0;
}

const char *rw_oplog_quote(const char *s, size_t n, char *buf, size_t cap) {
    if (cap < 3) {
        if (cap) buf[0] = 0;
        return buf;
    }
    buf[0] = '"';
    rw_escape(s, n, buf + 1, cap - 2);
    strcat(buf, "\"");
    return buf;
}

const char *rw_oplog_hex(const void *id, size_t n, char *buf, size_t cap) {
    const size_t m = n > 16 ? 16 : n;
    if (!cap) return buf;
    if (2 * m + 1 > cap) {
        buf[0] = 0;
        return buf;
    }
    rw_hex_encode(id, m, buf);
    return buf;
}
