/* http.h - rank 0's HTTP server (libmicrohttpd): SGLang-compatible routes (http_sglang.c),
 * OpenAI-compatible routes (http_openai.c) and GET /metrics, beside the ZeroMQ control socket.
 *
 * Design: the HTTP server never touches the engine. Each HTTP request is served on a thread of
 * its own connection, which opens a ZeroMQ DEALER on the daemon's in-process endpoint (the
 * control ROUTER binds it too) and speaks the control protocol of docs/PROTOCOL.md, exactly as a
 * remote client would: every HTTP generation goes through the same admission, the same rank
 * relay and the same engine path as a ZeroMQ `generate`, and the server loop is never blocked by
 * a slow HTTP client. Text is turned into ids and back on the connection's thread with the
 * worker's tokenizer (read-only, thread-safe: rw_tokenizer.h).
 *
 * Limits (docs/OPERATIONS.md section 6): request bodies of at most RW_HTTP_MAX_BODY bytes
 * (413 beyond, also without Content-Length), at most RW_HTTP_MAX_CONN connections (503 beyond),
 * a connection idle for `timeout_s` is closed (slow clients cannot hold threads), a client that
 * goes away while its generation runs has it aborted. */
#ifndef RW_DAEMON_HTTP_H
#define RW_DAEMON_HTTP_H

#include <stddef.h>
#include <stdint.h>

#include "rw_core.h"
#include "rw_tokenizer.h"

#ifdef __cplusplus
extern "C" {
#endif

#define RW_HTTP_MAX_BODY (32u << 20) /* bytes of one request body */
#define RW_HTTP_MAX_CONN 64          /* connections served at once */
#define RW_HTTP_MAX_EOS 4

typedef struct rw_http rw_http;

typedef struct rw_http_opts {
    const char *addr;       /* "PORT" (binds 127.0.0.1) or "HOST:PORT" (IPv4 or [IPv6]); 0: any */
    void *zctx;             /* the daemon's ZeroMQ context (borrowed) */
    const char *inproc;     /* the control ROUTER's in-process endpoint */
    const char *token;      /* bearer token required on every route but GET /health and
                               GET /metrics; NULL: none. Copied. */
    const rw_tok *tok;      /* tokenizer (borrowed, outlives the server); NULL: ids only */
    const char *model_name; /* OpenAI "model" (copied) */
    const char *model_path, *tokenizer_path; /* reported by /get_model_info (copied; may be NULL) */
    int64_t max_seq_len;                     /* prompt + generated tokens the engine takes */
    int64_t vocab_size;
    int32_t eos[RW_HTTP_MAX_EOS]; /* ids that end a generation unless ignore_eos */
    int n_eos;
    double timeout_s; /* idle connection timeout */
} rw_http_opts;

/* Starts the server (its own threads). `bound` (cap bytes) gets "http://HOST:PORT" with the
 * port actually bound. RW_E_INVALID_ARG for a malformed address, RW_E_IO when it cannot bind. */
rw_status rw_http_start(const rw_http_opts *o, rw_http **out, char *bound, size_t cap, rw_err *err);
/* Stops accepting, wakes and joins every connection thread. NULL is a no-op. Call before the
 * control socket closes (connection threads may still be waiting for replies). */
void rw_http_stop(rw_http *h);

#ifdef __cplusplus
}
#endif

#endif
