/* follower.c - a rank other than rank 0: it connects to rank 0's peer socket, says hello,
 * receives the NCCL id of the tensor-parallel communicator, opens its rank, and then executes the
 * op stream rank 0 sends until QUIT, answering the ops that ask for an answer. */
#include "follower.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zmq.h>

#include "ops.h"
#include "rank.h"
#include "watch.h"

static void drain_outputs(rw_rank *r) {
    rw_output *o;
    while ((o = rw_engine_pop_output(r->eng)))
        rw_output_free(o);
}

static rw_status reply(void *sock, const rw_op_msg *m, rw_status st, uint64_t a,
                       const void *payload, size_t plen, const rw_sync_frames *frames,
                       rw_err *err) {
    rw_op_hdr h = rw_op_make((rw_op)m->h.op, m->h.seq, a, 0, 0);
    h.status = st;
    return rw_op_send(sock, NULL, 0, &h, payload, plen, frames, err);
}

/* Executes one op on the follower's rank; answers it when rank 0 asked for an answer. */
static void follower_exec(rw_rank *r, void *sock, const rw_op_msg *m) {
    rw_err e;
    rw_err_clear(&e);
    rw_status st = RW_OK;
    size_t plen;
    const void *payload = rw_op_payload(m, &plen);
    const void *rpay = NULL;
    size_t rlen = 0;
    rw_sync_frames rframes = {0};
    rw_sync_outcome out;
    memset(&out, 0, sizeof out);
    uint64_t ra = 0; /* the answer's `a` */
    rw_msg *req_msg = NULL;
    switch ((rw_op)m->h.op) {
    case RW_OP_STEP: st = rw_engine_step(r->eng, &e); break;
    case RW_OP_ADD: {
        int32_t *prompt = NULL;
        int n = 0;
        rw_sampling sp;
        rw_request_opts ro;
        st = rw_op_add_ex_decode(payload, plen, &prompt, &n, &sp, &ro, &e);
        if (st == RW_OK) st = rw_engine_add_ex(r->eng, m->h.a, prompt, n, &sp, &ro, &e);
        free(prompt);
        break;
    }
    case RW_OP_ABORT:
        st = rw_engine_abort(r->eng, m->h.a, &e);
        if (st == RW_E_NOT_FOUND) st = RW_OK; /* finished here in the same step as on rank 0 */
        break;
    case RW_OP_ABORT_ALL: rw_engine_abort_all(r->eng); break;
    case RW_OP_PAUSE: st = rw_engine_pause(r->eng, (rw_pause_mode)m->h.a, &e); break;
    case RW_OP_RESUME: st = rw_engine_resume(r->eng, &e); break;
    case RW_OP_FLUSH: st = rw_engine_flush_cache(r->eng, &e); break;
    case RW_OP_MEM: st = rw_rank_memory(r, (unsigned)m->h.a, &e); break;
    case RW_OP_SET_VERSION: rw_engine_set_weight_version(r->eng, m->h.a); break;
    case RW_OP_NEW_SESSION: {
        char tag[RW_SYNC_MAX_VERSION + 1];
        size_t n = plen < RW_SYNC_MAX_VERSION ? plen : RW_SYNC_MAX_VERSION;
        memcpy(tag, payload ? payload : "", n);
        tag[n] = 0;
        st = rw_rank_reset_session(r, tag, &e);
        break;
    }
    case RW_OP_SYNC: {
        rw_request req;
        const char *keys[3];
        st = rw_msg_decode_request(payload, plen, &req_msg, &req, &e);
        if (st == RW_OK)
            st = rw_request_take_args(req_msg, &req, keys, rw_op_keys(m->h.a, keys), NULL, &e);
        if (st != RW_OK) {
            rw_mw_reset(r->w);
            rw_mw_reply_err(r->w, req.has_id ? req.id : 0, st, e.msg);
        } else {
            rw_sync_frames in;
            rw_op_frames(m, &in);
            st = rw_rank_sync(r, &req, &in, &out, &e);
        }
        rw_err fe;
        if (rw_mw_finish(r->w, &rpay, &rlen, &fe) != RW_OK) {
            st = fe.status;
            e = fe;
            rpay = NULL;
            rlen = 0;
        }
        if (out.frame.data) {
            rframes.n = 1;
            rframes.data[0] = out.frame.data;
            rframes.len[0] = out.frame.len;
        }
        break;
    }
    case RW_OP_SETTLE: {
        rw_sync_wstate ws;
        st = rw_rank_settle(r, &ws, &e);
        ra = (uint64_t)ws;
        break;
    }
    default: st = RW_ERR(&e, RW_E_PROTOCOL, "rank %d: unknown op %u", r->rank, m->h.op); break;
    }
    drain_outputs(r);
    if (st != RW_OK && !(m->h.flags & RW_OPF_REPLY))
        RW_LOGE("rank %d: op %u (seq %" PRIu64 ") failed: %s: %s", r->rank, m->h.op, m->h.seq,
                rw_status_str(st), e.msg);
    if (m->h.flags & RW_OPF_REPLY) {
        if (!rpay && st != RW_OK) {
            rpay = e.msg;
            rlen = strlen(e.msg);
        }
        rw_err se;
        if (reply(sock, m, st, ra, rpay, rlen, rframes.n ? &rframes : NULL, &se) != RW_OK)
            RW_LOGE("rank %d: reply to op %u not sent: %s", r->rank, m->h.op, se.msg);
    }
    rw_sync_outcome_free(&out);
    rw_msg_free(req_msg);
}

/* The watchdog's last resort on a follower: stuck in a collective after the communicator abort,
 * with rank 0 gone or a stop asked for; nothing can unwind the thread, so the process ends. */
static void follower_last_resort(void *arg, const char *why) {
    (void)arg;
    fprintf(stderr, "rw-worker: %s, and this rank stays stuck in a collective: exiting\n", why);
    _exit(1);
}

int rw_follower_main(const rw_dopts *o, int rank, void *zctx, const char *peer,
                     rw_comm_group *group, volatile sig_atomic_t *stop) {
    int rc = 1;
    bool own_ctx = !zctx;
    void *sock = NULL;
    rw_rank *r = NULL;
    rw_watch *watch = NULL;
    bool peers_gone = false; /* ending without rank 0's QUIT */
    rw_err e;
    rw_err_clear(&e);
    if (own_ctx) zctx = zmq_ctx_new();
    if (!zctx) {
        RW_LOGE("rank %d: zmq_ctx_new failed", rank);
        return 1;
    }
    sock = zmq_socket(zctx, ZMQ_DEALER);
    if (!sock) {
        RW_LOGE("rank %d: zmq_socket: %s", rank, zmq_strerror(errno));
        goto out;
    }
    char id[16];
    int idn = snprintf(id, sizeof id, "rank%d", rank);
    int linger = 2000, hwm = 0; /* no op may be dropped (see the peer socket in launch.c) */
    zmq_setsockopt(sock, ZMQ_ROUTING_ID, id, (size_t)idn);
    zmq_setsockopt(sock, ZMQ_LINGER, &linger, sizeof linger);
    zmq_setsockopt(sock, ZMQ_SNDHWM, &hwm, sizeof hwm);
    zmq_setsockopt(sock, ZMQ_RCVHWM, &hwm, sizeof hwm);
    if (stop) rw_op_socket_heartbeats(sock);
    if (zmq_connect(sock, peer) != 0) {
        RW_LOGE("rank %d: connect %s: %s", rank, peer, zmq_strerror(errno));
        goto out;
    }
    rw_op_hdr h = rw_op_make(RW_OP_HELLO, 0, (uint64_t)rank, (uint64_t)o->tp, 0);
    if (rw_op_send(sock, NULL, 0, &h, NULL, 0, NULL, &e) != RW_OK) {
        RW_LOGE("rank %d: hello: %s", rank, e.msg);
        goto out;
    }
    rw_op_msg m;
    rw_status hs = RW_E_TIMEOUT;
    const double deadline = rw_now() + o->startup_timeout_s;
    while (hs == RW_E_TIMEOUT && rw_now() < deadline && !(stop && *stop))
        hs = rw_op_recv(sock, false, 500, &m, &e);
    if (hs != RW_OK || m.h.op != RW_OP_HELLO) {
        RW_LOGE("rank %d: no answer from rank 0 at %s: %s", rank, peer,
                hs != RW_OK ? e.msg : "unexpected message");
        if (hs == RW_OK) rw_op_msg_free(&m);
        goto out;
    }
    rw_status st;
    rw_comm *comm = NULL;
    if (group) {
        st = rw_comm_create_thread(group, rank, &comm, &e);
    } else if (o->backend == RW_BACKEND_CUDA && o->tp > 1) {
        size_t len;
        const void *nid = rw_op_payload(&m, &len);
        if (len != RW_NCCL_ID_BYTES)
            st = RW_ERR(&e, RW_E_PROTOCOL, "rank %d: NCCL id of %zu bytes from rank 0", rank, len);
        else
            st = rw_comm_create_nccl(nid, o->tp, rank, rw_dopts_device(o, rank), &comm, &e);
    } else {
        st = rw_comm_create_single(&comm, &e);
    }
    rw_op_msg_free(&m);
    if (st == RW_OK) st = rw_rank_open(o, rank, comm, &r, &e);
    h = rw_op_make(RW_OP_READY, 0, (uint64_t)rank, 0, 0);
    h.status = st;
    rw_err se;
    if (rw_op_send(sock, NULL, 0, &h, st ? e.msg : NULL, st ? strlen(e.msg) : 0, NULL, &se) !=
        RW_OK)
        RW_LOGE("rank %d: ready: %s", rank, se.msg);
    if (st != RW_OK) {
        RW_LOGE("rank %d: start-up failed: %s: %s", rank, rw_status_str(st), e.msg);
        goto out;
    }
    RW_LOGI("rank %d: ready", rank);
    if (stop) {
        /* a process rank: rank 0 may die, or a signal may come while this rank waits in a
         * collective for a rank that died */
        rw_watch_opts wo = {.rank = rank,
                            .zctx = zctx,
                            .sock = sock,
                            .comm = r->comm,
                            .stop = stop,
                            .last_resort = follower_last_resort};
        if (rw_watch_start(&wo, &watch, &e) != RW_OK)
            RW_LOGW("rank %d: no watchdog (%s)", rank, e.msg);
    }
    double quiet_since = 0;
    for (;;) {
        st = rw_op_recv(sock, false, 500, &m, &e);
        if (st == RW_E_TIMEOUT) {
            char why[256];
            if (rw_watch_lost(watch, why, sizeof why)) {
                /* everything rank 0 sent before it went is done (a QUIT would have ended this) */
                RW_LOGE("rank %d: %s; stopping", rank, why);
                peers_gone = true;
                break;
            }
            /* rank 0 normally sends QUIT; a signal to this process alone (or a rank 0 that
             * died) must still end it */
            if (stop && *stop) {
                if (quiet_since == 0) quiet_since = rw_now();
                if (rw_now() - quiet_since > 10) {
                    RW_LOGW("rank %d: stopping on a signal (no word from rank 0)", rank);
                    rc = 0;
                    peers_gone = true;
                    break;
                }
            }
            continue;
        }
        if (st != RW_OK) {
            RW_LOGE("rank %d: %s", rank, e.msg);
            continue;
        }
        quiet_since = 0;
        if (m.h.op == RW_OP_QUIT) {
            rw_op_msg_free(&m);
            rc = 0;
            break;
        }
        rw_watch_enter(watch);
        follower_exec(r, sock, &m);
        rw_watch_leave(watch);
        rw_op_msg_free(&m);
    }
out:
    rw_watch_stop(watch);
    /* destroying a communicator waits for its peers, which may be gone */
    if (r && peers_gone) rw_comm_abort(r->comm);
    rw_rank_close(r);
    if (sock) zmq_close(sock);
    if (own_ctx) zmq_ctx_term(zctx);
    return rc;
}
