/* http.c - rank 0's HTTP server: libmicrohttpd with a thread per connection, request bodies
 * bounded, the bearer token, the route tables of http_sglang.c and http_openai.c plus GET
 * /metrics, replies, server-sent event streams, and the call into the daemon: every request
 * talks to the control ROUTER over a DEALER on its in-process endpoint with the protocol of
 * docs/PROTOCOL.md (http.h says why). */
#include "http_internal.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <zmq.h>

#include "rw_msg.h"

#define WAIT_SLICE_MS 200 /* how often a waiting request looks at its client and at shutdown */

/* ------------------------------------------------------------------------------------------ */
/* Replies                                                                                      */
/* ------------------------------------------------------------------------------------------ */
enum MHD_Result rw_hreply(rw_hreq *r, unsigned status, const char *ctype, const char *body,
                          size_t len) {
    struct MHD_Response *resp =
        MHD_create_response_from_buffer(len, (void *)body, MHD_RESPMEM_MUST_COPY);
    if (!resp) return MHD_NO;
    if (ctype) MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, ctype);
    if (status == MHD_HTTP_UNAUTHORIZED)
        MHD_add_response_header(resp, MHD_HTTP_HEADER_WWW_AUTHENTICATE, "Bearer");
    enum MHD_Result ret = MHD_queue_response(r->conn, status, resp);
    MHD_destroy_response(resp);
    r->answered = true;
    return ret;
}

enum MHD_Result rw_hreply_json(rw_hreq *r, unsigned status, json_t *j) {
    char *s = j ? json_dumps(j, JSON_COMPACT | JSON_ENCODE_ANY) : NULL;
    json_decref(j);
    if (!s) return rw_hreply(r, 500, "text/plain", "out of memory\n", 14);
    enum MHD_Result ret = rw_hreply(r, status, "application/json", s, strlen(s));
    free(s);
    return ret;
}

static const char *error_type(unsigned status) {
    switch (status) {
    case 401: return "authentication_error";
    case 404: return "not_found_error";
    case 405: return "method_not_allowed";
    case 409: return "conflict_error";
    case 413: return "request_too_large";
    case 501: return "not_implemented";
    case 503: return "service_unavailable";
    case 504: return "timeout";
    default: return status >= 500 ? "server_error" : "invalid_request_error";
    }
}

enum MHD_Result rw_hreply_error(rw_hreq *r, unsigned status, const char *fmt, ...) {
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    /* messages quote the client's own input: keep the reply valid JSON whatever it held */
    json_t *m = json_string(msg);
    if (!m) m = json_string("(the error message is not valid UTF-8)");
    json_t *e = json_pack("{s:o, s:s, s:n, s:i}", "message", m, "type", error_type(status), "param",
                          "code", (int)status);
    return rw_hreply_json(r, status, json_pack("{s:o}", "error", e));
}

unsigned rw_http_status(rw_status st) {
    switch (st) {
    case RW_OK: return 200;
    case RW_E_AUTH: return 401;
    case RW_E_STATE:
    case RW_E_BUSY:
    case RW_E_WEIGHTS_INCOMPLETE: return 409;
    case RW_E_UNSUPPORTED: return 501;
    case RW_E_TIMEOUT: return 504;
    case RW_E_OOM:
    case RW_E_ABORTED: return 503;
    case RW_E_IO:
    case RW_E_CUDA:
    case RW_E_NCCL:
    case RW_E_ZMQ:
    case RW_E_INTERNAL:
    case RW_E_NO_DEVICE: return 500;
    default: return 400; /* invalid_arg, format, protocol, range, shape, dtype, not_found */
    }
}

enum MHD_Result rw_hreply_status(rw_hreq *r, rw_status st, const char *msg) {
    return rw_hreply_error(r, rw_http_status(st), "%s: %s", rw_status_str(st), msg);
}

/* ------------------------------------------------------------------------------------------ */
/* The call into the daemon                                                                     */
/* ------------------------------------------------------------------------------------------ */
rw_status rw_hcall_send(rw_hreq *r, const char *cmd, json_t *args, uint64_t *id, rw_err *err) {
    rw_http *h = r->h;
    if (!r->sock) {
        r->sock = zmq_socket(h->o.zctx, ZMQ_DEALER);
        if (!r->sock) RW_FAIL(err, RW_E_ZMQ, "HTTP: zmq_socket: %s", zmq_strerror(errno));
        int linger = 1000; /* an abort sent as the client leaves still gets through */
        zmq_setsockopt(r->sock, ZMQ_LINGER, &linger, sizeof linger);
        if (zmq_connect(r->sock, h->inproc) != 0)
            RW_FAIL(err, RW_E_ZMQ, "HTTP: connect %s: %s", h->inproc, zmq_strerror(errno));
    }
    json_t *a = args ? json_deep_copy(args) : json_object();
    if (h->token) json_object_set_new(a, "auth", json_string(h->token));
    char *text = json_dumps(a, JSON_COMPACT);
    json_decref(a);
    if (!text) RW_FAIL(err, RW_E_OOM, "HTTP: %s arguments", cmd);
    rw_mw *w = NULL;
    rw_status st = rw_mw_create(&w, err);
    const void *env = NULL;
    size_t len = 0;
    *id = ++r->next_id;
    if (st == RW_OK) {
        rw_mw_request(w, *id, cmd);
        st = rw_mw_json(w, text, err);
    }
    if (st == RW_OK) st = rw_mw_finish(w, &env, &len, err);
    if (st == RW_OK && zmq_send(r->sock, env, len, 0) < 0)
        st = rw_err_set(err, RW_E_ZMQ, __FILE__, __LINE__, "HTTP: send %s: %s", cmd,
                        zmq_strerror(errno));
    rw_mw_destroy(w);
    free(text);
    return st;
}

/* True when the HTTP client closed its connection (a readable socket with nothing to read). */
static bool client_closed(rw_hreq *r, short revents) {
    if (revents & (POLLHUP | POLLERR)) return true;
    char c;
    ssize_t k = recv(r->client_fd, &c, 1, MSG_PEEK | MSG_DONTWAIT);
    if (k == 0) return true;
    if (k < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) return true;
    /* data: a pipelined request; stop watching (it would stay readable) */
    r->client_fd = -1;
    return false;
}

rw_status rw_hcall_recv(rw_hreq *r, uint64_t id, json_t **result, rw_err *err) {
    *result = NULL;
    for (;;) {
        zmq_pollitem_t it[2] = {{r->sock, 0, ZMQ_POLLIN, 0}, {NULL, r->client_fd, ZMQ_POLLIN, 0}};
        int n = zmq_poll(it, r->client_fd >= 0 ? 2 : 1, WAIT_SLICE_MS);
        if (n < 0 && errno != EINTR) RW_FAIL(err, RW_E_ZMQ, "HTTP: poll: %s", zmq_strerror(errno));
        /* a reply that is there is still taken (the daemon answers everything in flight before
         * it stops) */
        if (!(it[0].revents & ZMQ_POLLIN) && atomic_load(&r->h->stopping))
            RW_FAIL(err, RW_E_ABORTED, "the worker is shutting down");
        if (r->client_fd >= 0 && (it[1].revents & (ZMQ_POLLIN | ZMQ_POLLERR)) &&
            client_closed(r, (short)((it[1].revents & ZMQ_POLLERR) ? POLLERR : 0))) {
            r->client_gone = true;
            RW_FAIL(err, RW_E_ABORTED, "the HTTP client went away");
        }
        if (!(it[0].revents & ZMQ_POLLIN)) continue;
        zmq_msg_t m;
        zmq_msg_init(&m);
        if (zmq_msg_recv(&m, r->sock, 0) < 0) {
            zmq_msg_close(&m);
            RW_FAIL(err, RW_E_ZMQ, "HTTP: receive: %s", zmq_strerror(errno));
        }
        bool more = zmq_msg_more(&m);
        rw_msg *msg = NULL;
        rw_reply rep;
        rw_status st = rw_msg_decode_reply(zmq_msg_data(&m), zmq_msg_size(&m), &msg, &rep, err);
        zmq_msg_close(&m);
        while (more) { /* a data frame (get_weights): not used over HTTP */
            zmq_msg_init(&m);
            zmq_msg_recv(&m, r->sock, 0);
            more = zmq_msg_more(&m);
            zmq_msg_close(&m);
        }
        if (st != RW_OK) return st;
        if (rep.id != id) { /* the reply to an earlier abort */
            rw_msg_free(msg);
            continue;
        }
        if (!rep.ok) {
            st = rw_err_set(err, rep.status, __FILE__, __LINE__, "%s", rep.message);
            rw_msg_free(msg);
            return st;
        }
        char *text = NULL;
        st = rep.result ? rw_mobj_to_json(rep.result, &text, err) : RW_OK;
        rw_msg_free(msg);
        if (st != RW_OK) return st;
        json_error_t je;
        *result = text ? json_loads(text, JSON_DECODE_ANY, &je) : json_null();
        free(text);
        if (!*result) RW_FAIL(err, RW_E_INTERNAL, "HTTP: reply not JSON: %s", je.text);
        return RW_OK;
    }
}

rw_status rw_hcall(rw_hreq *r, const char *cmd, json_t *args, json_t **result, rw_err *err) {
    uint64_t id;
    RW_CHECK(rw_hcall_send(r, cmd, args, &id, err));
    return rw_hcall_recv(r, id, result, err);
}

/* ------------------------------------------------------------------------------------------ */
/* Streams                                                                                      */
/* ------------------------------------------------------------------------------------------ */
struct rw_hstream {
    rw_hreq *r;
    rw_hpump pump;
    void (*done)(void *);
    void *arg;
    rw_tbuf out;
    size_t off;
    bool ended;
};

void rw_sse_json(rw_tbuf *out, json_t *j) {
    char *s = j ? json_dumps(j, JSON_COMPACT | JSON_ENCODE_ANY) : NULL;
    json_decref(j);
    if (!s) {
        out->failed = 1;
        return;
    }
    rw_tbuf_put(out, "data: ", 6);
    rw_tbuf_put(out, s, strlen(s));
    rw_tbuf_put(out, "\n\n", 2);
    free(s);
}

void rw_sse_done(rw_tbuf *out) {
    static const char done[] = "data: [DONE]\n\n";
    rw_tbuf_put(out, done, sizeof done - 1);
}

static void req_release(rw_hreq *r);

static ssize_t stream_read(void *cls, uint64_t pos, char *buf, size_t max) {
    (void)pos;
    rw_hstream *st = cls;
    while (st->off >= st->out.n) {
        if (st->ended || st->out.failed) return MHD_CONTENT_READER_END_OF_STREAM;
        st->out.n = st->off = 0;
        if (!st->pump(st->arg, st->r, &st->out)) st->ended = true;
        if (st->r->client_gone) return MHD_CONTENT_READER_END_WITH_ERROR;
    }
    size_t k = st->out.n - st->off;
    if (k > max) k = max;
    memcpy(buf, st->out.p + st->off, k);
    st->off += k;
    return (ssize_t)k;
}

static void stream_free(void *cls) {
    rw_hstream *st = cls;
    if (st->done) st->done(st->arg);
    rw_tbuf_free(&st->out);
    rw_hreq *r = st->r;
    r->stream = NULL;
    free(st);
    req_release(r);
}

enum MHD_Result rw_hreply_stream(rw_hreq *r, rw_hpump pump, void (*done)(void *), void *arg) {
    rw_hstream *st = calloc(1, sizeof *st);
    if (!st) {
        if (done) done(arg);
        return rw_hreply_error(r, 503, "out of memory");
    }
    st->r = r;
    st->pump = pump;
    st->done = done;
    st->arg = arg;
    struct MHD_Response *resp =
        MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16 << 10, stream_read, st, stream_free);
    if (!resp) {
        stream_free(st);
        return MHD_NO;
    }
    r->stream = st;
    r->refs++; /* the stream uses the request (its socket) until stream_free */
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, "text/event-stream");
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CACHE_CONTROL, "no-cache");
    enum MHD_Result ret = MHD_queue_response(r->conn, 200, resp);
    MHD_destroy_response(resp);
    r->answered = true;
    return ret;
}

/* ------------------------------------------------------------------------------------------ */
/* Requests                                                                                     */
/* ------------------------------------------------------------------------------------------ */
static void req_release(rw_hreq *r) {
    if (--r->refs > 0) return;
    if (r->sock) zmq_close(r->sock);
    rw_tbuf_free(&r->body);
    free(r);
}

static void on_completed(void *cls, struct MHD_Connection *conn, void **con_cls,
                         enum MHD_RequestTerminationCode toe) {
    (void)cls;
    (void)conn;
    (void)toe;
    rw_hreq *r = *con_cls;
    if (r) req_release(r);
    *con_cls = NULL;
}

static bool token_ok(const char *want, const char *got) {
    size_t wn = strlen(want), n = strlen(got);
    unsigned diff = (unsigned)(wn ^ n);
    for (size_t i = 0; i < wn; i++)
        diff |= (unsigned)want[i] ^ (unsigned)(i < n ? got[i] : 0);
    return diff == 0;
}

static bool authorized(rw_hreq *r) {
    if (!r->h->token) return true;
    const char *a =
        MHD_lookup_connection_value(r->conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_AUTHORIZATION);
    if (!a || strncasecmp(a, "Bearer ", 7)) return false;
    a += 7;
    while (*a == ' ')
        a++;
    return token_ok(r->h->token, a);
}

/* GET /metrics: the `stats` reply in the Prometheus text format (metrics.c). */
static enum MHD_Result route_metrics(rw_hreq *r) {
    json_t *res;
    rw_err e;
    rw_status st = rw_hcall(r, "stats", NULL, &res, &e);
    if (st != RW_OK) return rw_hreply_status(r, st, e.msg);
    char *stats = json_dumps(res, JSON_COMPACT);
    json_decref(res);
    char *text = NULL;
    st = stats ? rw_metrics_render(stats, r->h->model_name, &text, &e)
               : rw_err_set(&e, RW_E_OOM, __FILE__, __LINE__, "metrics");
    free(stats);
    if (st != RW_OK) return rw_hreply_status(r, st, e.msg);
    enum MHD_Result ret =
        rw_hreply(r, 200, "text/plain; version=0.0.4; charset=utf-8", text, strlen(text));
    free(text);
    return ret;
}

/* The route of (method, path): GET /metrics here, the two APIs' tables, or an error reply. */
static enum MHD_Result dispatch(rw_hreq *r) {
    bool known = false, k2 = false;
    rw_hroute fn = NULL;
    if (!strcmp(r->url, "/metrics")) {
        known = true;
        if (!strcmp(r->method, "GET")) fn = route_metrics;
    }
    if (!fn && !known) fn = rw_http_sglang_route(r->method, r->url, &known);
    if (!fn && !known) {
        fn = rw_http_openai_route(r->method, r->url, &k2);
        known = k2;
    }
    if (fn) return fn(r);
    if (known) return rw_hreply_error(r, 405, "%s %s: method not allowed", r->method, r->url);
    return rw_hreply_error(r, 404,
                           "unknown path '%s' (routes: /generate, /health, /get_weight_version, "
                           "/get_model_info, /flush_cache, /pause_generation, "
                           "/continue_generation, /update_weights_from_disk, "
                           "/release_memory_occupation, /resume_memory_occupation, "
                           "/abort_request, /metrics, /v1/models, /v1/completions, "
                           "/v1/chat/completions)",
                           r->url);
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *conn, const char *url,
                                  const char *method, const char *version, const char *upload_data,
                                  size_t *upload_data_size, void **con_cls) {
    (void)version;
    rw_http *h = cls;
    rw_hreq *r = *con_cls;
    if (!r) { /* headers are in: decide what can be decided before the body */
        r = calloc(1, sizeof *r);
        if (!r) return MHD_NO;
        *con_cls = r;
        r->refs = 1;
        r->h = h;
        r->conn = conn;
        r->url = url;
        r->method = method;
        r->num = atomic_fetch_add(&h->seq, 1) + 1;
        r->openai = !strncmp(url, "/v1/", 4);
        const union MHD_ConnectionInfo *ci =
            MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CONNECTION_FD);
        r->client_fd = ci ? ci->connect_fd : -1;
        const bool open_route =
            !strcmp(method, "GET") && (!strcmp(url, "/health") || !strcmp(url, "/metrics"));
        if (!open_route && !authorized(r))
            return rw_hreply_error(r, 401,
                                   "authentication failed: send 'Authorization: Bearer <token>' "
                                   "with this worker's token");
        const char *cl =
            MHD_lookup_connection_value(conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
        if (cl && strtoull(cl, NULL, 10) > RW_HTTP_MAX_BODY) {
            r->too_large = true;
            return rw_hreply_error(r, 413, "request body of %s bytes (at most %u)", cl,
                                   RW_HTTP_MAX_BODY);
        }
        return MHD_YES;
    }
    if (*upload_data_size) {
        /* libmicrohttpd takes no response before the body is read: a body over the limit is
         * read and dropped (memory stays bounded) and answered 413 at its end; one that goes on
         * past four times the limit is cut off */
        if (!r->answered && !r->too_large && r->body.n + *upload_data_size > RW_HTTP_MAX_BODY) {
            r->too_large = true;
            rw_tbuf_free(&r->body);
        }
        if (r->too_large) {
            r->dropped += *upload_data_size;
            *upload_data_size = 0;
            return r->dropped > 4ull * RW_HTTP_MAX_BODY ? MHD_NO : MHD_YES;
        }
        if (!r->answered) rw_tbuf_put(&r->body, upload_data, *upload_data_size);
        *upload_data_size = 0;
        return MHD_YES;
    }
    if (r->too_large && !r->answered)
        return rw_hreply_error(r, 413, "request body longer than %u bytes", RW_HTTP_MAX_BODY);
    if (r->answered) return MHD_YES;
    if (r->body.failed) return rw_hreply_error(r, 503, "out of memory for the request body");
    return dispatch(r);
}

static void on_log(void *cls, const char *fmt, va_list ap) {
    (void)cls;
    char msg[512];
    vsnprintf(msg, sizeof msg, fmt, ap);
    size_t n = strlen(msg);
    while (n && msg[n - 1] == '\n')
        msg[--n] = 0;
    RW_LOGD("http: %s", msg);
}

/* ------------------------------------------------------------------------------------------ */
/* Start / stop                                                                                 */
/* ------------------------------------------------------------------------------------------ */
static char *dup_or_null(const char *s) {
    return s ? strdup(s) : NULL;
}

/* "PORT" or "HOST:PORT" ("[v6]:PORT") into an address to bind. */
static rw_status parse_addr(const char *a, struct sockaddr_storage *ss, bool *v6, rw_err *err) {
    char host[256] = "127.0.0.1";
    const char *port = a;
    const char *colon = strrchr(a, ':');
    if (colon) {
        size_t n = (size_t)(colon - a);
        if (n >= sizeof host) RW_FAIL(err, RW_E_INVALID_ARG, "host name too long");
        memcpy(host, a, n);
        host[n] = 0;
        if (host[0] == '[' && n > 1 && host[n - 1] == ']') {
            memmove(host, host + 1, n - 2);
            host[n - 2] = 0;
        }
        if (!strcmp(host, "*") || !host[0]) snprintf(host, sizeof host, "0.0.0.0");
        port = colon + 1;
    }
    char *end;
    long p = strtol(port, &end, 10);
    if (end == port || *end || p < 0 || p > 65535)
        RW_FAIL(err, RW_E_INVALID_ARG, "'%s': expected PORT or HOST:PORT (port 0..65535)", a);
    struct addrinfo hints = {.ai_family = AF_UNSPEC,
                             .ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_PASSIVE | AI_NUMERICSERV};
    struct addrinfo *res = NULL;
    int rc = getaddrinfo(host, port, &hints, &res);
    if (rc || !res)
        RW_FAIL(err, RW_E_INVALID_ARG, "'%s': host '%s': %s", a, host, gai_strerror(rc));
    memcpy(ss, res->ai_addr, res->ai_addrlen);
    *v6 = res->ai_family == AF_INET6;
    freeaddrinfo(res);
    return RW_OK;
}

rw_status rw_http_start(const rw_http_opts *o, rw_http **out, char *bound, size_t cap,
                        rw_err *err) {
    *out = NULL;
    struct sockaddr_storage ss;
    bool v6 = false;
    RW_CHECK(parse_addr(o->addr, &ss, &v6, err));
    rw_http *h = calloc(1, sizeof *h);
    if (!h) RW_FAIL(err, RW_E_OOM, "HTTP server");
    h->o = *o;
    h->token = dup_or_null(o->token);
    h->model_name = dup_or_null(o->model_name ? o->model_name : "rw");
    h->model_path = dup_or_null(o->model_path);
    h->tokenizer_path = dup_or_null(o->tokenizer_path);
    h->inproc = dup_or_null(o->inproc);
    h->t_start = rw_now();
    unsigned timeout = (unsigned)(o->timeout_s + 0.999);
    if (timeout < 1) timeout = 1;
    unsigned flags = MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD |
                     MHD_USE_POLL | MHD_USE_ERROR_LOG | (v6 ? MHD_USE_IPv6 : 0);
    h->d =
        MHD_start_daemon(flags, 0, NULL, NULL, on_request, h, MHD_OPTION_EXTERNAL_LOGGER, on_log, h,
                         MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&ss, MHD_OPTION_CONNECTION_LIMIT,
                         (unsigned)RW_HTTP_MAX_CONN, MHD_OPTION_CONNECTION_TIMEOUT, timeout,
                         MHD_OPTION_NOTIFY_COMPLETED, on_completed, h, MHD_OPTION_END);
    if (!h->d) {
        rw_http_stop(h);
        RW_FAIL(err, RW_E_IO, "cannot serve HTTP on '%s' (address in use, or not this host's?)",
                o->addr);
    }
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(h->d, MHD_DAEMON_INFO_BIND_PORT);
    char host[INET6_ADDRSTRLEN] = "?";
    if (v6)
        inet_ntop(AF_INET6, &((struct sockaddr_in6 *)&ss)->sin6_addr, host, sizeof host);
    else
        inet_ntop(AF_INET, &((struct sockaddr_in *)&ss)->sin_addr, host, sizeof host);
    snprintf(bound, cap, v6 ? "http://[%s]:%u" : "http://%s:%u", host,
             di ? (unsigned)di->port : 0u);
    *out = h;
    return RW_OK;
}

void rw_http_stop(rw_http *h) {
    if (!h) return;
    atomic_store(&h->stopping, 1);
    if (h->d) MHD_stop_daemon(h->d);
    free(h->token);
    free(h->model_name);
    free(h->model_path);
    free(h->tokenizer_path);
    free(h->inproc);
    free(h);
}
