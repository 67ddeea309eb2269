/* client.c - the trainer-side client: a DEALER socket to a worker's control address, request ids
 * with replies matched out of order, JSON and msgpack entry points, typed calls for the sync
 * commands, zero-copy bucket frames, checksum replies, and the trainer's end of the NCCL group. */
#include "client_internal.h"

#include <inttypes.h>
#include <jansson.h>
#include <msgpack.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <time.h>
#include <zmq.h>

/* Zero-copy frames still owned by ZeroMQ point at this, not at the client, so the callback stays
 * valid if the client is closed first. Freed by whichever side lets go last. */
typedef struct zc_state {
    atomic_uint_fast64_t released;
    atomic_int refs;
} zc_state;

static void zc_unref(zc_state *z) {
    if (atomic_fetch_sub(&z->refs, 1) == 1) free(z);
}

static void zc_free_cb(void *data, void *hint) {
    (void)data; /* the caller's buffer: not ours to free */
    zc_state *z = hint;
    atomic_fetch_add(&z->released, 1);
    zc_unref(z);
}

typedef struct pending {
    uint64_t id;
    void *env, *frame;
    size_t env_len, frame_len;
    rw_status st; /* a reply that could not be read: its error (env NULL) */
    char *msg;
} pending;

#define MAX_PENDING 1024

struct rw_client {
    void *ctx;
    bool own_ctx;
    void *sock;
    uint64_t next_id;
    zc_state *zc;
    uint64_t zc_sent;
    pending pend[MAX_PENDING];
    size_t npend;
    rw_mw *w;
    char *auth; /* args.auth of every request, or NULL */
    /* the update session this client opened (protocol 2): the token of the last begin_update
     * reply, sent as args.session by the session's commands; the request id of a begin_update
     * whose reply is awaited; the worker's largest frame, from that reply (0: unknown) */
    char session[RW_SYNC_TOKEN_LEN + 1];
    uint64_t begin_id;
    uint64_t max_frame;
    char last_error[512];
};

rw_status rw_client_note(rw_client *c, rw_status st, rw_err *err) {
    if (st == RW_OK)
        c->last_error[0] = 0;
    else
        rw_sync_strlcpy(c->last_error, err ? err->msg : rw_status_str(st), sizeof c->last_error);
    return st;
}

const char *rw_client_last_error(const rw_client *c) {
    return c ? c->last_error : "";
}
void rw_client_free(void *p) {
    free(p);
}

rw_status rw_client_connect(const char *addr, void *zctx, rw_client **out, rw_err *err) {
    *out = NULL;
    if (!addr || !addr[0]) RW_FAIL(err, RW_E_INVALID_ARG, "client: empty address");
    rw_client *c = calloc(1, sizeof *c);
    if (!c) RW_FAIL(err, RW_E_OOM, "client: out of memory");
    rw_status st;
    c->next_id = 1;
    c->zc = calloc(1, sizeof *c->zc);
    if (!c->zc) {
        free(c);
        RW_FAIL(err, RW_E_OOM, "client: out of memory");
    }
    atomic_init(&c->zc->refs, 1);
    RW_CHECKGOTO(rw_mw_create(&c->w, err), st, fail);
    c->ctx = zctx;
    if (!c->ctx) {
        c->ctx = zmq_ctx_new();
        c->own_ctx = true;
        if (!c->ctx) {
            st = RW_ZMQ_FAIL(err, "zmq_ctx_new");
            goto fail;
        }
    }
    c->sock = zmq_socket(c->ctx, ZMQ_DEALER);
    if (!c->sock) {
        st = RW_ZMQ_FAIL(err, "zmq_socket(DEALER)");
        goto fail;
    }
    int linger = 0, sndtimeo = 60000;
    zmq_setsockopt(c->sock, ZMQ_LINGER, &linger, sizeof linger);
    zmq_setsockopt(c->sock, ZMQ_SNDTIMEO, &sndtimeo, sizeof sndtimeo);
    if (zmq_connect(c->sock, addr) != 0) {
        st = RW_ERR(err, RW_E_ZMQ, "client: connect %s: %s", addr, zmq_strerror(errno));
        goto fail;
    }
    RW_CHECKGOTO(rw_client_set_auth(c, getenv("RW_AUTH_TOKEN"), err), st, fail);
    *out = c;
    return RW_OK;
fail:
    rw_client_close(c);
    return st;
}

void rw_client_close(rw_client *c) {
    if (!c) return;
    if (c->sock) zmq_close(c->sock);
    if (c->own_ctx && c->ctx) zmq_ctx_term(c->ctx);
    for (size_t i = 0; i < c->npend; i++) {
        free(c->pend[i].env);
        free(c->pend[i].frame);
        free(c->pend[i].msg);
    }
    rw_mw_destroy(c->w);
    if (c->zc) zc_unref(c->zc);
    free(c->auth);
    free(c);
}

rw_status rw_client_set_auth(rw_client *c, const char *token, rw_err *err) {
    char *t = NULL;
    if (token && token[0] && !(t = strdup(token)))
        RW_FAIL(err, RW_E_OOM, "client: out of memory for the auth token");
    free(c->auth);
    c->auth = t;
    return RW_OK;
}

const char *rw_client_session(const rw_client *c) {
    return c ? c->session : "";
}

rw_status rw_client_set_session(rw_client *c, const char *token, rw_err *err) {
    if (token && strlen(token) > RW_SYNC_TOKEN_LEN)
        RW_FAIL(err, RW_E_INVALID_ARG, "client: a session token has %d hex digits",
                RW_SYNC_TOKEN_LEN);
    rw_sync_strlcpy(c->session, token ? token : "", sizeof c->session);
    return RW_OK;
}

/* The commands of an update session that carry its token (rw_sync_check_owner). */
static bool session_cmd(const char *cmd) {
    const rw_cmd k = rw_cmd_parse(cmd);
    return k == RW_CMD_UPDATE_WEIGHTS || k == RW_CMD_UPDATE_WEIGHTS_FROM_DISK ||
           k == RW_CMD_COMMIT_UPDATE || k == RW_CMD_ABORT_UPDATE;
}

/* Notes what a reply means for the client's session: the token (and the worker's frame limit)
 * of the begin_update it answers. */
static void note_reply(rw_client *c, const rw_reply *r) {
    if (!c->begin_id || r->id != c->begin_id) return;
    c->begin_id = 0;
    if (!r->ok) return;
    const rw_mobj *t = rw_mobj_get(r->result, "session");
    if (t) rw_mobj_strcpy(t, "result.session", c->session, sizeof c->session, NULL);
    uint64_t mf = 0;
    const rw_mobj *f = rw_mobj_get(r->result, "max_frame_bytes");
    if (f && rw_mobj_u64(f, "result.max_frame_bytes", &mf, NULL) == RW_OK) c->max_frame = mf;
}

/* A data frame larger than the worker reads would drop the connection (the reply never comes):
 * refused here instead. */
static rw_status frame_fits(const rw_client *c, size_t len, rw_err *err) {
    if (c->max_frame && len > c->max_frame)
        RW_FAIL(
            err, RW_E_RANGE,
            "client: a data frame of %zu bytes is larger than the worker reads (max_frame_bytes "
            "%llu, its --max-frame-bytes): use smaller buckets",
            len, (unsigned long long)c->max_frame);
    return RW_OK;
}

/* ------------------------------------------------------------------------------------------ */
/* Send / wait                                                                                  */
/* ------------------------------------------------------------------------------------------ */
static rw_status send_env(rw_client *c, const void *env, size_t len, size_t nframes, rw_err *err) {
    if (zmq_send(c->sock, env, len, nframes ? ZMQ_SNDMORE : 0) < 0)
        return RW_ZMQ_FAIL(err, "client: send");
    return RW_OK;
}

/* Starts the envelope of request `id` in c->w and appends the args value. */
static rw_status build(rw_client *c, const char *cmd, rw_mw *args, uint64_t *id, const void **env,
                       size_t *len, rw_err *err) {
    if (!cmd || !cmd[0] || strlen(cmd) > RW_MSG_MAX_CMD)
        RW_FAIL(err, RW_E_INVALID_ARG, "client: command name empty or too long");
    *id = c->next_id++;
    rw_mw_reset(c->w);
    rw_mw_request(c->w, *id, cmd);
    const void *a = NULL;
    size_t alen = 0;
    if (args) {
        RW_CHECK(rw_mw_finish(args, &a, &alen, err));
        if (!alen) RW_FAIL(err, RW_E_INVALID_ARG, "client: empty args writer");
    }
    /* fields the client adds unless the caller gave them: the worker's token, and on the
     * commands of this client's update session the session's token */
    const char *ikey[2], *ival[2];
    int ni = 0;
    if (c->auth) {
        ikey[ni] = "auth";
        ival[ni++] = c->auth;
    }
    if (c->session[0] && session_cmd(cmd)) {
        ikey[ni] = "session";
        ival[ni++] = c->session;
    }
    if (!strcmp(cmd, "begin_update")) c->begin_id = *id;
    if (ni) {
        /* the args map again with those fields first (kept as they are when the caller gave
         * them) */
        rw_msg *m = NULL;
        const rw_mobj *v = NULL;
        if (a) RW_CHECK(rw_msg_decode_value(a, alen, &m, &v, err));
        if (v && rw_mobj_type(v) != RW_M_MAP) {
            rw_msg_free(m);
            RW_FAIL(err, RW_E_INVALID_ARG, "client: args must be a map");
        }
        int add = 0;
        bool want[2];
        for (int i = 0; i < ni; i++) {
            want[i] = !v || !rw_mobj_get(v, ikey[i]);
            add += want[i];
        }
        if (add) {
            size_t n = v ? rw_mobj_len(v) : 0;
            rw_mw_map(c->w, (uint32_t)(n + (size_t)add));
            for (int i = 0; i < ni; i++)
                if (want[i]) rw_mw_kv_str(c->w, ikey[i], ival[i]);
            for (size_t i = 0; i < n; i++) {
                rw_mw_obj(c->w, rw_mobj_key_at(v, i));
                rw_mw_obj(c->w, rw_mobj_val_at(v, i));
            }
            a = NULL;
        }
        rw_msg_free(m);
        if (!a) return rw_mw_finish(c->w, env, len, err);
    }
    if (a)
        rw_mw_raw(c->w, a, alen);
    else
        rw_mw_map(c->w, 0);
    return rw_mw_finish(c->w, env, len, err);
}

rw_status rw_client_send(rw_client *c, const char *cmd, rw_mw *args, const void *frame,
                         size_t frame_len, bool zero_copy, uint64_t *id, rw_err *err) {
    const void *env;
    size_t len;
    rw_status st = frame ? frame_fits(c, frame_len, err) : RW_OK;
    if (st == RW_OK) st = build(c, cmd, args, id, &env, &len, err);
    if (st == RW_OK) st = send_env(c, env, len, frame ? 1 : 0, err);
    if (st == RW_OK && frame) {
        if (zero_copy) {
            zmq_msg_t m;
            atomic_fetch_add(&c->zc->refs, 1);
            if (zmq_msg_init_data(&m, (void *)frame, frame_len, zc_free_cb, c->zc)) {
                zc_unref(c->zc);
                st = RW_ZMQ_FAIL(err, "client: zmq_msg_init_data");
            } else {
                c->zc_sent++;
                if (zmq_msg_send(&m, c->sock, 0) < 0) {
                    st = RW_ZMQ_FAIL(err, "client: send frame");
                    zmq_msg_close(&m); /* runs the callback */
                }
            }
        } else if (zmq_send(c->sock, frame, frame_len, 0) < 0) {
            st = RW_ZMQ_FAIL(err, "client: send frame");
        }
    }
    return rw_client_note(c, st, err);
}

rw_status rw_client_send_json(rw_client *c, const char *cmd, const char *args_json,
                              const void *const *frames, const size_t *frame_lens, size_t nframes,
                              uint64_t *id, rw_err *err) {
    rw_mw *a = NULL;
    rw_status st = rw_mw_create(&a, err);
    if (st == RW_OK) st = rw_mw_json(a, args_json && args_json[0] ? args_json : "{}", err);
    for (size_t i = 0; st == RW_OK && i < nframes; i++)
        st = frame_fits(c, frame_lens[i], err);
    const void *env;
    size_t len;
    if (st == RW_OK) st = build(c, cmd, a, id, &env, &len, err);
    if (st == RW_OK) st = send_env(c, env, len, nframes, err);
    for (size_t i = 0; st == RW_OK && i < nframes; i++)
        if (zmq_send(c->sock, frames[i], frame_lens[i], i + 1 < nframes ? ZMQ_SNDMORE : 0) < 0)
            st = RW_ZMQ_FAIL(err, "client: send frame");
    rw_mw_destroy(a);
    return rw_client_note(c, st, err);
}

/* Receives one multipart reply into malloc'd copies of the envelope and the first data frame. */
static rw_status recv_one(rw_client *c, int timeout_ms, pending *p, rw_err *err) {
    memset(p, 0, sizeof *p);
    zmq_pollitem_t pi = {.socket = c->sock, .events = ZMQ_POLLIN};
    int rc = zmq_poll(&pi, 1, timeout_ms);
    if (rc < 0) return RW_ZMQ_FAIL(err, "client: zmq_poll");
    if (rc == 0) RW_FAIL(err, RW_E_TIMEOUT, "client: no reply within %d ms", timeout_ms);
    int part = 0, more = 1;
    rw_status st = RW_OK;
    while (more) {
        zmq_msg_t m;
        zmq_msg_init(&m);
        if (zmq_msg_recv(&m, c->sock, 0) < 0) {
            zmq_msg_close(&m);
            st = RW_ZMQ_FAIL(err, "client: receive");
            break;
        }
        more = zmq_msg_more(&m);
        if (part < 2 && st == RW_OK) {
            size_t n = zmq_msg_size(&m);
            void *b = malloc(n ? n : 1);
            if (!b) {
                st = RW_ERR(err, RW_E_OOM, "client: reply of %zu bytes", n);
            } else {
                memcpy(b, zmq_msg_data(&m), n);
                if (part == 0) {
                    p->env = b;
                    p->env_len = n;
                } else {
                    p->frame = b;
                    p->frame_len = n;
                }
            }
        }
        part++;
        zmq_msg_close(&m);
    }
    if (st != RW_OK) {
        free(p->env);
        free(p->frame);
        memset(p, 0, sizeof *p);
    }
    return st;
}

static double now_ms(void) {
    return rw_now() * 1e3;
}

rw_status rw_client_wait(rw_client *c, uint64_t id, int timeout_ms, rw_msg **msg, rw_reply *rep,
                         void **frame, size_t *frame_len, rw_err *err) {
    *msg = NULL;
    if (frame) *frame = NULL;
    if (frame_len) *frame_len = 0;
    pending got;
    bool found = false;
    for (size_t i = 0; i < c->npend; i++)
        if (c->pend[i].id == id) {
            got = c->pend[i];
            c->pend[i] = c->pend[--c->npend];
            found = true;
            break;
        }
    double deadline = now_ms() + (timeout_ms < 0 ? 1e15 : timeout_ms);
    while (!found) {
        double left = deadline - now_ms();
        if (left < 0) left = 0;
        rw_status st = recv_one(c, (int)left, &got, err);
        if (st == RW_E_TIMEOUT)
            return rw_client_note(c,
                                  RW_ERR(err, RW_E_TIMEOUT,
                                         "client: no reply to request %" PRIu64 " within %d ms", id,
                                         timeout_ms),
                                  err);
        if (st != RW_OK) return rw_client_note(c, st, err);
        rw_msg *m;
        rw_reply r;
        rw_err de;
        uint64_t rid = 0;
        if (rw_msg_decode_reply(got.env, got.env_len, &m, &r, &de) != RW_OK) {
            /* a reply this side cannot read (too large, too many elements, corrupt) is that
             * request's error, not a wait until the timeout: its id is read from the head of
             * the envelope, where every writer puts it */
            if (!rw_msg_peek_id(got.env, got.env_len, &rid)) {
                RW_LOGW("client: dropped an undecodable reply without a readable id: %s", de.msg);
                free(got.env);
                free(got.frame);
                continue;
            }
            const size_t elen = got.env_len;
            free(got.env);
            free(got.frame);
            memset(&got, 0, sizeof got);
            got.st = de.status;
            char msg[600];
            snprintf(msg, sizeof msg,
                     "client: the reply of %zu bytes to request %" PRIu64 " cannot be read: %s",
                     elen, rid, de.msg);
            got.msg = strdup(msg);
        } else {
            rid = r.id;
            note_reply(c, &r);
            rw_msg_free(m);
        }
        if (rid == id) {
            found = true;
            break;
        }
        if (c->npend == MAX_PENDING) {
            RW_LOGW("client: too many unclaimed replies; dropping the one to request %" PRIu64,
                    c->pend[0].id);
            free(c->pend[0].env);
            free(c->pend[0].frame);
            free(c->pend[0].msg);
            c->pend[0] = c->pend[--c->npend];
        }
        got.id = rid;
        c->pend[c->npend++] = got;
    }
    if (!got.env) { /* a reply that could not be read */
        rw_status est = rw_err_set(err, got.st ? got.st : RW_E_FORMAT, __FILE__, __LINE__, "%s",
                                   got.msg ? got.msg : "client: unreadable reply");
        free(got.msg);
        return rw_client_note(c, est, err);
    }
    rw_status st = rw_msg_decode_reply(got.env, got.env_len, msg, rep, err);
    free(got.env);
    if (st != RW_OK) {
        free(got.frame);
        return rw_client_note(c, st, err);
    }
    if (frame) {
        *frame = got.frame;
        if (frame_len) *frame_len = got.frame_len;
    } else {
        free(got.frame);
    }
    if (!rep->ok) {
        st = rw_err_set(err, rep->status, __FILE__, __LINE__, "%s", rep->message);
        rw_msg_free(*msg);
        *msg = NULL;
        if (frame) {
            free(*frame);
            *frame = NULL;
        }
        return rw_client_note(c, st, err);
    }
    return rw_client_note(c, RW_OK, err);
}

/* Appends a part's data frame f (taken) to the joined one at an offset aligned to 8, the offset
 * its routes fields are moved by (*base). */
static rw_status append_frame(uint8_t **buf, size_t *len, void *f, size_t flen, uint64_t *base,
                              rw_err *err) {
    *base = 0;
    if (!f || !flen) { /* no routes, or only empty ones (offset 0, 0 bytes) */
        free(f);
        return RW_OK;
    }
    *base = (*len + 7) & ~(size_t)7;
    uint8_t *nb = realloc(*buf, *base + flen);
    if (!nb) {
        free(f);
        RW_FAIL(err, RW_E_OOM, "client: %zu bytes of routed experts", (size_t)(*base + flen));
    }
    memset(nb + *len, 0, *base - *len);
    memcpy(nb + *base, f, flen);
    free(f);
    *buf = nb;
    *len = *base + flen;
    return RW_OK;
}

rw_status rw_client_join_rest(rw_client *c, uint64_t id, int timeout_ms, rw_msg *m, rw_reply *r,
                              char **result_json, void **frame, size_t *frame_len, rw_err *err) {
    struct json_t *acc = NULL;
    uint8_t *buf = NULL;
    size_t len = 0;
    void *f = frame ? *frame : NULL;
    size_t flen = frame && frame_len ? *frame_len : 0;
    if (frame) *frame = NULL;
    if (frame_len) *frame_len = 0;
    rw_status st;
    bool framed = false; /* some part had a data frame */
    for (;;) {
        const bool more = rw_client_is_part(r->result);
        uint64_t base = 0;
        framed |= f != NULL;
        st = append_frame(&buf, &len, f, flen, &base, err);
        f = NULL;
        if (st == RW_OK) st = rw_client_join_part(&acc, r->result, base, err);
        rw_msg_free(m);
        m = NULL;
        if (st != RW_OK || !more) break;
        st = rw_client_wait(c, id, timeout_ms, &m, r, frame ? &f : NULL, &flen, err);
        if (st != RW_OK) break;
    }
    if (st == RW_OK) st = rw_client_parts_done(acc, result_json, err);
    json_decref(acc);
    if (st == RW_OK && frame && framed && !buf && !(buf = malloc(1)))
        st = RW_ERR(err, RW_E_OOM, "client: routed experts");
    if (st == RW_OK && frame) {
        *frame = buf;
        if (frame_len) *frame_len = len;
    } else {
        free(buf);
    }
    return st;
}

rw_status rw_client_wait_json(rw_client *c, uint64_t id, int timeout_ms, char **result_json,
                              void **frame, size_t *frame_len, rw_err *err) {
    if (result_json) *result_json = NULL;
    rw_msg *m;
    rw_reply r;
    RW_CHECK(rw_client_wait(c, id, timeout_ms, &m, &r, frame, frame_len, err));
    rw_status st = RW_OK;
    if (result_json && rw_client_is_part(r.result)) {
        st = rw_client_join_rest(c, id, timeout_ms, m, &r, result_json, frame, frame_len, err);
        m = NULL;
    } else if (result_json) {
        st = rw_mobj_to_json(r.result, result_json, err);
    }
    rw_msg_free(m);
    if (st != RW_OK && frame) {
        free(*frame);
        *frame = NULL;
    }
    return rw_client_note(c, st, err);
}

rw_status rw_client_call_json(rw_client *c, const char *cmd, const char *args_json, int timeout_ms,
                              char **result_json, rw_err *err) {
    uint64_t id;
    RW_CHECK(rw_client_send_json(c, cmd, args_json, NULL, NULL, 0, &id, err));
    return rw_client_wait_json(c, id, timeout_ms, result_json, NULL, NULL, err);
}

rw_status rw_client_call(rw_client *c, const char *cmd, rw_mw *args, int timeout_ms, rw_msg **m,
                         rw_reply *r, rw_err *err) {
    uint64_t id;
    RW_CHECK(rw_client_send(c, cmd, args, NULL, 0, false, &id, err));
    return rw_client_wait(c, id, timeout_ms, m, r, NULL, NULL, err);
}

/* ------------------------------------------------------------------------------------------ */
/* Typed calls                                                                                  */
/* ------------------------------------------------------------------------------------------ */
/* rw_client_call for a command whose result the caller does not need; destroys the writer. */
static rw_status call_args(rw_client *c, const char *cmd, rw_mw *a, int timeout_ms, rw_err *err) {
    rw_msg *m = NULL;
    rw_reply r;
    rw_status st = rw_client_call(c, cmd, a, timeout_ms, &m, &r, err);
    rw_msg_free(m);
    rw_mw_destroy(a);
    return st;
}

rw_status rw_client_begin_update(rw_client *c, const char *version, bool flush_cache,
                                 uint64_t bucket_bytes, double timeout_s, int timeout_ms,
                                 rw_err *err) {
    rw_mw *a;
    RW_CHECK(rw_mw_create(&a, err));
    rw_mw_map(a, 2 + (bucket_bytes ? 1 : 0) + (timeout_s > 0 ? 1 : 0));
    rw_mw_kv_str(a, "version", version);
    rw_mw_kv_bool(a, "flush_cache", flush_cache);
    if (bucket_bytes) rw_mw_kv_u64(a, "bucket_bytes", bucket_bytes);
    if (timeout_s > 0) rw_mw_kv_f64(a, "timeout_s", timeout_s);
    return call_args(c, "begin_update", a, timeout_ms, err);
}

/* The args of update_weights: {transport, [group_name,] manifest}. */
static rw_status bucket_args(const char *transport, const char *group, const rw_sync_manifest *m,
                             rw_mw **out, rw_err *err) {
    RW_CHECK(rw_mw_create(out, err));
    rw_mw *a = *out;
    rw_mw_map(a, group ? 3 : 2);
    rw_mw_kv_str(a, "transport", transport);
    if (group) rw_mw_kv_str(a, "group_name", group);
    rw_mw_str(a, "manifest");
    rw_sync_manifest_write(m, a);
    return RW_OK;
}

rw_status rw_client_send_bucket(rw_client *c, const rw_sync_manifest *man, const void *data,
                                size_t len, bool zero_copy, uint64_t *id, rw_err *err) {
    rw_mw *a;
    RW_CHECK(bucket_args("zmq", NULL, man, &a, err));
    /* a zero-byte frame still needs a valid pointer */
    static const char empty = 0;
    rw_status st =
        rw_client_send(c, "update_weights", a, data ? data : &empty, len, zero_copy, id, err);
    rw_mw_destroy(a);
    return st;
}

rw_status rw_client_send_bucket_nccl(rw_client *c, const rw_sync_manifest *man, const char *group,
                                     uint64_t *id, rw_err *err) {
    rw_mw *a;
    RW_CHECK(bucket_args("nccl", group, man, &a, err));
    rw_status st = rw_client_send(c, "update_weights", a, NULL, 0, false, id, err);
    rw_mw_destroy(a);
    return st;
}

rw_status rw_client_update_weights_zmq(rw_client *c, const rw_sync_manifest *man, const void *data,
                                       int timeout_ms, rw_err *err) {
    uint64_t id, nb = rw_sync_manifest_bytes(man);
    uint64_t target = c->zc_sent + 1;
    RW_CHECK(rw_client_send_bucket(c, man, data, nb, true, &id, err));
    rw_msg *m = NULL;
    rw_reply r;
    rw_err werr;
    rw_status wst = rw_client_wait(c, id, timeout_ms, &m, &r, NULL, NULL, &werr);
    rw_msg_free(m);
    /* the frame is released once fully sent; the reply implies the worker had it, so this is
     * normally immediate */
    double deadline = now_ms() + (timeout_ms < 0 ? 60000 : timeout_ms);
    while (atomic_load(&c->zc->released) < target && now_ms() < deadline) {
        struct timespec ts = {0, 50000};
        nanosleep(&ts, NULL);
    }
    if (wst != RW_OK) {
        if (err) *err = werr;
        return rw_client_note(c, wst, err);
    }
    if (atomic_load(&c->zc->released) < target)
        return rw_client_note(
            c,
            RW_ERR(err, RW_E_TIMEOUT,
                   "client: ZeroMQ still holds the bucket buffer after %d ms (close the "
                   "client before reusing it)",
                   timeout_ms),
            err);
    return RW_OK;
}

static rw_status empty_call(rw_client *c, const char *cmd, int timeout_ms, rw_msg **m, rw_reply *r,
                            rw_err *err) {
    return rw_client_call(c, cmd, NULL, timeout_ms, m, r, err);
}

rw_status rw_client_commit_update(rw_client *c, int timeout_ms, char *version, size_t cap,
                                  rw_err *err) {
    rw_msg *m;
    rw_reply r;
    RW_CHECK(empty_call(c, "commit_update", timeout_ms, &m, &r, err));
    rw_status st = RW_OK;
    if (version && cap)
        st = rw_mobj_strcpy(rw_mobj_get(r.result, "version"), "result.version", version, cap, err);
    rw_msg_free(m);
    return rw_client_note(c, st, err);
}

rw_status rw_client_abort_update(rw_client *c, int timeout_ms, bool *intact, rw_err *err) {
    rw_msg *m;
    rw_reply r;
    RW_CHECK(empty_call(c, "abort_update", timeout_ms, &m, &r, err));
    rw_status st = RW_OK;
    if (intact) st = rw_mobj_bool(rw_mobj_get(r.result, "intact"), "result.intact", intact, err);
    rw_msg_free(m);
    return rw_client_note(c, st, err);
}

rw_status rw_client_update_from_disk(rw_client *c, const char *dir, const char *version,
                                     int timeout_ms, rw_err *err) {
    rw_mw *a;
    RW_CHECK(rw_mw_create(&a, err));
    rw_mw_map(a, version && version[0] ? 2 : 1);
    rw_mw_kv_str(a, "path", dir);
    if (version && version[0]) rw_mw_kv_str(a, "version", version);
    return call_args(c, "update_weights_from_disk", a, timeout_ms, err);
}

rw_status rw_client_get_weight_version(rw_client *c, int timeout_ms, char *version, size_t cap,
                                       int *state, rw_err *err) {
    rw_msg *m;
    rw_reply r;
    RW_CHECK(empty_call(c, "get_weight_version", timeout_ms, &m, &r, err));
    rw_status st =
        rw_mobj_strcpy(rw_mobj_get(r.result, "version"), "result.version", version, cap, err);
    if (st == RW_OK && state) {
        char s[32];
        st = rw_mobj_strcpy(rw_mobj_get(r.result, "state"), "result.state", s, sizeof s, err);
        *state = !strcmp(s, "ready")      ? RW_SYNC_READY
                 : !strcmp(s, "updating") ? RW_SYNC_UPDATING
                                          : RW_SYNC_INCOMPLETE;
    }
    rw_msg_free(m);
    return rw_client_note(c, st, err);
}

rw_status rw_client_get_weights(rw_client *c, const char *name, int rank, void *dst, size_t cap,
                                size_t *len, int timeout_ms, rw_err *err) {
    (void)rank; /* one rank per control endpoint here; the daemon adds a rank argument */
    rw_mw *a;
    RW_CHECK(rw_mw_create(&a, err));
    rw_mw_map(a, 1);
    rw_mw_str(a, "name");
    rw_mw_str(a, name);
    uint64_t id;
    rw_status st = rw_client_send(c, "get_weights", a, NULL, 0, false, &id, err);
    rw_mw_destroy(a);
    if (st != RW_OK) return st;
    rw_msg *m;
    rw_reply r;
    void *frame;
    size_t flen;
    RW_CHECK(rw_client_wait(c, id, timeout_ms, &m, &r, &frame, &flen, err));
    rw_msg_free(m);
    *len = flen;
    if (!frame)
        st = RW_ERR(err, RW_E_PROTOCOL, "get_weights: reply without a data frame");
    else if (flen > cap)
        st = RW_ERR(err, RW_E_RANGE, "get_weights: %s has %zu bytes, buffer holds %zu", name, flen,
                    cap);
    else
        memcpy(dst, frame, flen);
    free(frame);
    return rw_client_note(c, st, err);
}
