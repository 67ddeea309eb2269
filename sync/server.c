/* server.c - a minimal ZeroMQ server for the sync commands: a ROUTER socket served from its own
 * thread (receive, decode, rw_sync_handle, reply; rw_sync_session_poll while idle). Used by the
 * tests and benchmarks; the worker daemon's control loop has the same shape with more commands. */
#include "sync_internal.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <zmq.h>

/* ------------------------------------------------------------------------------------------ */
/* Minimal server                                                                               */
/* ------------------------------------------------------------------------------------------ */
struct rw_sync_server {
    rw_sync_session *sess;
    void *ctx;
    bool own_ctx;
    void *sock;
    char endpoint[256];
    pthread_t thread;
    atomic_bool stop;
    atomic_uint_fast64_t handled;
};

/* Answers one received message. */
static void serve_one(rw_sync_server *srv, rw_zmq_msg *zm, rw_status recv_st, rw_err *rerr,
                      rw_mw *w) {
    rw_mw_reset(w);
    rw_sync_outcome out;
    memset(&out, 0, sizeof out);
    rw_msg *msg = NULL;
    rw_request req;
    memset(&req, 0, sizeof req);
    rw_err e;
    rw_err_clear(&e);
    if (recv_st != RW_OK) {
        rw_mw_reply_err(w, 0, recv_st, rerr->msg);
    } else {
        size_t len;
        const void *env = rw_zmq_msg_envelope(zm, &len);
        rw_status st = rw_msg_decode_request(env, len, &msg, &req, &e);
        if (st != RW_OK) {
            rw_mw_reply_err(w, req.has_id ? req.id : 0, st, e.msg);
        } else if (!(rw_cmd_flags(rw_cmd_parse(req.cmd)) & RW_CMDF_SYNC)) {
            char m[160];
            snprintf(m, sizeof m, "unknown command '%s'", req.cmd);
            rw_mw_reply_err(w, req.id, RW_E_PROTOCOL, m);
        } else {
            rw_sync_frames fr;
            rw_zmq_msg_frames(zm, &fr);
            rw_sync_handle(srv->sess, 0, &req, &fr, w, &out, &e);
        }
    }
    const void *data;
    size_t len;
    rw_err we;
    if (rw_mw_finish(w, &data, &len, &we) == RW_OK) {
        if (rw_zmq_reply(srv->sock, zm, data, len, &out.frame, &we) != RW_OK)
            RW_LOGW("sync server: reply not sent: %s", we.msg);
    }
    rw_sync_outcome_free(&out);
    rw_msg_free(msg);
    atomic_fetch_add(&srv->handled, 1);
}

static void *server_main(void *arg) {
    rw_sync_server *srv = arg;
    rw_mw *w = NULL;
    if (rw_mw_create(&w, NULL) != RW_OK) return NULL;
    while (!atomic_load(&srv->stop)) {
        rw_zmq_msg *zm = NULL;
        rw_err e;
        rw_status st = rw_zmq_recv(srv->sock, 50, &zm, &e);
        if (st == RW_E_TIMEOUT && !zm) {
            rw_err pe;
            if (rw_sync_session_poll(srv->sess, &pe) != RW_OK) RW_LOGW("sync server: %s", pe.msg);
            continue;
        }
        if (!zm) {
            RW_LOGW("sync server: %s", e.msg);
            continue;
        }
        serve_one(srv, zm, st, &e, w);
        rw_zmq_msg_free(zm);
    }
    rw_mw_destroy(w);
    return NULL;
}

rw_status rw_sync_server_start(rw_sync_session *s, void *zctx, const char *addr,
                               rw_sync_server **out, rw_err *err) {
    *out = NULL;
    rw_sync_server *srv = calloc(1, sizeof *srv);
    if (!srv) RW_FAIL(err, RW_E_OOM, "sync server: out of memory");
    srv->sess = s;
    srv->ctx = zctx;
    rw_status st;
    if (!srv->ctx) {
        srv->ctx = zmq_ctx_new();
        srv->own_ctx = true;
        if (!srv->ctx) {
            st = RW_ZMQ_FAIL(err, "zmq_ctx_new");
            goto fail;
        }
    }
    srv->sock = zmq_socket(srv->ctx, ZMQ_ROUTER);
    if (!srv->sock) {
        st = RW_ZMQ_FAIL(err, "zmq_socket(ROUTER)");
        goto fail;
    }
    int linger = 0;
    zmq_setsockopt(srv->sock, ZMQ_LINGER, &linger, sizeof linger);
    if (zmq_bind(srv->sock, addr) != 0) {
        st = RW_ERR(err, RW_E_ZMQ, "sync server: bind %s: %s", addr, zmq_strerror(errno));
        goto fail;
    }
    size_t len = sizeof srv->endpoint;
    zmq_getsockopt(srv->sock, ZMQ_LAST_ENDPOINT, srv->endpoint, &len);
    if (pthread_create(&srv->thread, NULL, server_main, srv)) {
        st = RW_ERR(err, RW_E_INTERNAL, "sync server: pthread_create failed");
        goto fail;
    }
    *out = srv;
    return RW_OK;
fail:
    if (srv->sock) zmq_close(srv->sock);
    if (srv->own_ctx && srv->ctx) zmq_ctx_term(srv->ctx);
    free(srv);
    return st;
}

const char *rw_sync_server_endpoint(const rw_sync_server *srv) {
    return srv->endpoint;
}
uint64_t rw_sync_server_handled(const rw_sync_server *srv) {
    return atomic_load(&((rw_sync_server *)srv)->handled);
}

void rw_sync_server_stop(rw_sync_server *srv) {
    if (!srv) return;
    atomic_store(&srv->stop, true);
    pthread_join(srv->thread, NULL);
    zmq_close(srv->sock);
    if (srv->own_ctx) zmq_ctx_term(srv->ctx);
    free(srv);
}
