/* daemon_rank.c - rank operations: the framing of the messages rank 0 sends to the other ranks
 * (a fixed header, an optional payload, optional bulk frames), the ADD payload codec, rank 0's
 * send / gather helpers, and the follower loop that executes the op stream on its own rank. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zmq.h>

#include "daemon_internal.h"

#define OP_MAX_PARTS 5 /* payload + 4 frames */

rw_op_hdr rw_op_make(rw_op op, uint64_t seq, uint64_t a, uint64_t b, uint32_t flags) {
    rw_op_hdr h;
    memset(&h, 0, sizeof h);
    h.magic = RW_OP_MAGIC;
    h.version = RW_OP_VERSION;
    h.op = (uint16_t)op;
    h.seq = seq;
    h.a = a;
    h.b = b;
    h.flags = flags;
    return h;
}

rw_status rw_op_send(void *sock, const void *route, size_t route_len, const rw_op_hdr *h,
                     const void *payload, size_t plen, const rw_sync_frames *frames, rw_err *err) {
    size_t nf = frames ? frames->n : 0;
    bool has_payload = payload || nf;
    if (route && zmq_send(sock, route, route_len, ZMQ_SNDMORE) < 0)
        RW_FAIL(err, RW_E_ZMQ, "rank op send (route): %s", zmq_strerror(errno));
    if (zmq_send(sock, h, sizeof *h, has_payload ? ZMQ_SNDMORE : 0) < 0)
        RW_FAIL(err, RW_E_ZMQ, "rank op send: %s", zmq_strerror(errno));
    if (has_payload &&
        zmq_send(sock, payload ? payload : "", payload ? plen : 0, nf ? ZMQ_SNDMORE : 0) < 0)
        RW_FAIL(err, RW_E_ZMQ, "rank op send (payload): %s", zmq_strerror(errno));
    for (size_t i = 0; i < nf; i++)
        if (zmq_send(sock, frames->data[i], frames->len[i], i + 1 < nf ? ZMQ_SNDMORE : 0) < 0)
            RW_FAIL(err, RW_E_ZMQ, "rank op send (frame %zu): %s", i, zmq_strerror(errno));
    return RW_OK;
}

void rw_op_msg_free(rw_op_msg *m) {
    if (!m) return;
    zmq_msg_t *p = m->parts;
    for (int i = 0; i < m->nparts; i++)
        zmq_msg_close(&p[i]);
    free(m->parts);
    memset(m, 0, sizeof *m);
}

rw_status rw_op_recv(void *sock, bool router, int timeout_ms, rw_op_msg *m, rw_err *err) {
    memset(m, 0, sizeof *m);
    zmq_pollitem_t pi = {.socket = sock, .events = ZMQ_POLLIN};
    int rc = zmq_poll(&pi, 1, timeout_ms);
    if (rc < 0) RW_FAIL(err, RW_E_ZMQ, "rank op poll: %s", zmq_strerror(errno));
    if (rc == 0) RW_FAIL(err, RW_E_TIMEOUT, "no rank message within %d ms", timeout_ms);
    zmq_msg_t *parts = calloc(OP_MAX_PARTS, sizeof *parts);
    if (!parts) RW_FAIL(err, RW_E_OOM, "rank op receive");
    m->parts = parts;
    int idx = 0, more = 1;
    bool bad = false;
    char why[96] = "";
    while (more) {
        zmq_msg_t t;
        zmq_msg_init(&t);
        if (zmq_msg_recv(&t, sock, 0) < 0) {
            zmq_msg_close(&t);
            rw_op_msg_free(m);
            RW_FAIL(err, RW_E_ZMQ, "rank op receive: %s", zmq_strerror(errno));
        }
        more = zmq_msg_more(&t);
        size_t n = zmq_msg_size(&t);
        if (router && idx == 0) {
            if (n > sizeof m->route) {
                bad = true;
                snprintf(why, sizeof why, "routing id of %zu bytes", n);
            } else {
                memcpy(m->route, zmq_msg_data(&t), n);
                m->route_len = n;
            }
            zmq_msg_close(&t);
        } else if (idx == (router ? 1 : 0)) {
            if (n != sizeof m->h) {
                bad = true;
                snprintf(why, sizeof why, "header of %zu bytes", n);
            } else {
                memcpy(&m->h, zmq_msg_data(&t), n);
                if (m->h.magic != RW_OP_MAGIC || m->h.version != RW_OP_VERSION) {
                    bad = true;
                    snprintf(why, sizeof why, "header magic %08x version %u", m->h.magic,
                             m->h.version);
                }
            }
            zmq_msg_close(&t);
        } else if (m->nparts < OP_MAX_PARTS) {
            zmq_msg_init(&parts[m->nparts]);
            zmq_msg_move(&parts[m->nparts], &t);
            zmq_msg_close(&t);
            m->nparts++;
        } else {
            bad = true;
            snprintf(why, sizeof why, "more than %d parts", OP_MAX_PARTS);
            zmq_msg_close(&t);
        }
        idx++;
    }
    if (idx < (router ? 2 : 1)) {
        bad = true;
        snprintf(why, sizeof why, "no header");
    }
    if (bad) {
        rw_op_msg_free(m);
        RW_FAIL(err, RW_E_PROTOCOL, "malformed rank message: %s", why);
    }
    return RW_OK;
}

const void *rw_op_payload(const rw_op_msg *m, size_t *len) {
    if (m->nparts < 1) {
        *len = 0;
        return NULL;
    }
    zmq_msg_t *p = m->parts;
    *len = zmq_msg_size(&p[0]);
    return zmq_msg_data(&p[0]);
}

void rw_op_frames(const rw_op_msg *m, rw_sync_frames *out) {
    memset(out, 0, sizeof *out);
    zmq_msg_t *p = m->parts;
    for (int i = 1; i < m->nparts && out->n < 4; i++) {
        out->data[out->n] = zmq_msg_data(&p[i]);
        out->len[out->n] = zmq_msg_size(&p[i]);
        out->n++;
    }
}

/* ------------------------------------------------------------------------------------------ */
/* ADD payload: [prompt ids], temperature, top_p, top_k, seed, max_new_tokens, [stop ids],     */
/* top_logprobs (a msgpack array; floats as f64, which round-trips a float exactly).            */
/* ------------------------------------------------------------------------------------------ */
rw_status rw_op_add_encode(rw_mw *w, const int32_t *prompt, int n, const rw_sampling *sp,
                           rw_err *err) {
    rw_mw_reset(w);
    rw_mw_array(w, 8);
    rw_mw_array(w, (uint32_t)n);
    for (int i = 0; i < n; i++)
        rw_mw_i64(w, prompt[i]);
    rw_mw_f64(w, sp->temperature);
    rw_mw_f64(w, sp->top_p);
    rw_mw_i64(w, sp->top_k);
    rw_mw_u64(w, sp->seed);
    rw_mw_i64(w, sp->max_new_tokens);
    rw_mw_array(w, (uint32_t)sp->n_stop);
    for (int i = 0; i < sp->n_stop; i++)
        rw_mw_i64(w, sp->stop_ids[i]);
    rw_mw_i64(w, sp->top_logprobs);
    const void *d;
    size_t len;
    return rw_mw_finish(w, &d, &len, err);
}

rw_status rw_op_add_decode(const void *buf, size_t len, int32_t **prompt, int *n, rw_sampling *sp,
                           rw_err *err) {
    *prompt = NULL;
    rw_msg *m = NULL;
    const rw_mobj *v;
    RW_CHECK(rw_msg_decode_value(buf, len, &m, &v, err));
    rw_status st = RW_OK;
    int64_t *tmp = NULL;
    if (rw_mobj_type(v) != RW_M_ARRAY || rw_mobj_len(v) != 8) {
        st = RW_ERR(err, RW_E_PROTOCOL, "rank op add: expected an array of 8");
        goto out;
    }
    const rw_mobj *pa = rw_mobj_at(v, 0);
    size_t np = rw_mobj_len(pa);
    tmp = malloc(sizeof *tmp * (np ? np : 1));
    *prompt = malloc(sizeof(int32_t) * (np ? np : 1));
    if (!tmp || !*prompt) {
        st = RW_ERR(err, RW_E_OOM, "rank op add: prompt of %zu", np);
        goto out;
    }
    size_t got;
    RW_CHECKGOTO(rw_mobj_i64_array(pa, "prompt", INT32_MIN, INT32_MAX, tmp, np, &got, err), st,
                 out);
    for (size_t i = 0; i < got; i++)
        (*prompt)[i] = (int32_t)tmp[i];
    *n = (int)got;
    *sp = rw_sampling_default();
    double d;
    int64_t x;
    uint64_t u;
    RW_CHECKGOTO(rw_mobj_f64(rw_mobj_at(v, 1), "temperature", &d, err), st, out);
    sp->temperature = (float)d;
    RW_CHECKGOTO(rw_mobj_f64(rw_mobj_at(v, 2), "top_p", &d, err), st, out);
    sp->top_p = (float)d;
    RW_CHECKGOTO(rw_mobj_i64(rw_mobj_at(v, 3), "top_k", &x, err), st, out);
    sp->top_k = (int)x;
    RW_CHECKGOTO(rw_mobj_u64(rw_mobj_at(v, 4), "seed", &u, err), st, out);
    sp->seed = u;
    RW_CHECKGOTO(rw_mobj_i64(rw_mobj_at(v, 5), "max_new_tokens", &x, err), st, out);
    sp->max_new_tokens = (int)x;
    int64_t stops[RW_MAX_STOP];
    RW_CHECKGOTO(rw_mobj_i64_array(rw_mobj_at(v, 6), "stop", INT32_MIN, INT32_MAX, stops,
                                   RW_MAX_STOP, &got, err),
                 st, out);
    sp->n_stop = (int)got;
    for (size_t i = 0; i < got; i++)
        sp->stop_ids[i] = (int32_t)stops[i];
    RW_CHECKGOTO(rw_mobj_i64(rw_mobj_at(v, 7), "top_logprobs", &x, err), st, out);
    sp->top_logprobs = (int)x;
out:
    free(tmp);
    if (st != RW_OK) {
        free(*prompt);
        *prompt = NULL;
    }
    rw_msg_free(m);
    return st;
}

/* ------------------------------------------------------------------------------------------ */
/* Rank 0: send to / gather from the followers                                                  */
/* ------------------------------------------------------------------------------------------ */
static int route_rank(const rw_op_msg *m) {
    char buf[40];
    if (m->route_len < 5 || m->route_len >= sizeof buf) return -1;
    memcpy(buf, m->route, m->route_len);
    buf[m->route_len] = 0;
    int r;
    if (sscanf(buf, "rank%d", &r) != 1) return -1;
    return r;
}

rw_status rw_peers_send(rw_peers *p, int only_rank, const rw_op_hdr *h, const void *payload,
                        size_t plen, const rw_sync_frames *frames, rw_err *err) {
    for (int r = 1; r <= p->n; r++) {
        if (only_rank >= 0 && r != only_rank) continue;
        char route[16];
        int n = snprintf(route, sizeof route, "rank%d", r);
        rw_status st = rw_op_send(p->sock, route, (size_t)n, h, payload, plen, frames, err);
        if (st != RW_OK) return rw_err_prefix(err, "to rank %d", r);
    }
    return RW_OK;
}

rw_status rw_peers_gather(rw_peers *p, int only_rank, uint64_t seq, double timeout_s,
                          rw_op_msg *replies, rw_err *err) {
    int want = only_rank >= 0 ? 1 : p->n, got = 0;
    for (int r = 0; r <= p->n; r++)
        memset(&replies[r], 0, sizeof replies[r]);
    double deadline = rw_now() + timeout_s;
    while (got < want) {
        char why[256];
        if (rw_watch_lost(p->watch, why, sizeof why))
            RW_FAIL(err, RW_E_ABORTED, "op %" PRIu64 ": %s", seq, why);
        double left = deadline - rw_now();
        if (left <= 0) {
            char who[256] = "";
            size_t k = 0;
            for (int r = 1; r <= p->n && k + 8 < sizeof who; r++)
                if ((only_rank < 0 || r == only_rank) && replies[r].h.magic == 0)
                    k += (size_t)snprintf(who + k, sizeof who - k, "%s%d", k ? ", " : "", r);
            RW_FAIL(err, RW_E_TIMEOUT, "rank(s) %s did not answer op %" PRIu64 " within %.0f s",
                    who, seq, timeout_s);
        }
        rw_op_msg m;
        rw_err e;
        /* short waits: a lost rank ends the gather without waiting for the timeout */
        const int wait_ms = p->watch && left > 0.2 ? 200 : (int)(left * 1000) + 1;
        rw_status st = rw_op_recv(p->sock, true, wait_ms, &m, &e);
        if (st == RW_E_TIMEOUT) continue;
        if (st != RW_OK) {
            RW_LOGW("rank 0: %s", e.msg);
            continue;
        }
        int r = route_rank(&m);
        if (r < 1 || r > p->n || m.h.seq != seq || (only_rank >= 0 && r != only_rank) ||
            replies[r].h.magic != 0) {
            RW_LOGW("rank 0: dropped a stale or unexpected rank message (op %u, seq %" PRIu64
                    ", from rank %d) while waiting for op %" PRIu64,
                    m.h.op, m.h.seq, r, seq);
            rw_op_msg_free(&m);
            continue;
        }
        replies[r] = m;
        got++;
    }
    return RW_OK;
}

/* ------------------------------------------------------------------------------------------ */
/* Follower                                                                                      */
/* ------------------------------------------------------------------------------------------ */
static void drain_outputs(rw_rank *r) {
    rw_output *o;
    while ((o = rw_engine_pop_output(r->eng)))
        rw_output_free(o);
}

static rw_status reply(void *sock, const rw_op_msg *m, rw_status st, const void *payload,
                       size_t plen, const rw_sync_frames *frames, rw_err *err) {
    rw_op_hdr h = rw_op_make((rw_op)m->h.op, m->h.seq, 0, 0, 0);
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
    rw_sync_out_frame of = {0};
    rw_msg *req_msg = NULL;
    switch ((rw_op)m->h.op) {
    case RW_OP_STEP: st = rw_engine_step(r->eng, &e); break;
    case RW_OP_ADD: {
        int32_t *prompt = NULL;
        int n = 0;
        rw_sampling sp;
        st = rw_op_add_decode(payload, plen, &prompt, &n, &sp, &e);
        if (st == RW_OK) st = rw_engine_add(r->eng, m->h.a, prompt, n, &sp, &e);
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
        st = rw_msg_decode_request(payload, plen, &req_msg, &req, &e);
        if (st != RW_OK) {
            rw_mw_reset(r->w);
            rw_mw_reply_err(r->w, req.has_id ? req.id : 0, st, e.msg);
        } else {
            rw_sync_frames in;
            rw_op_frames(m, &in);
            st = rw_rank_sync(r, &req, &in, &of, &e);
        }
        rw_err fe;
        if (rw_mw_finish(r->w, &rpay, &rlen, &fe) != RW_OK) {
            st = fe.status;
            e = fe;
            rpay = NULL;
            rlen = 0;
        }
        if (of.data) {
            rframes.n = 1;
            rframes.data[0] = of.data;
            rframes.len[0] = of.len;
        }
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
        if (reply(sock, m, st, rpay, rlen, rframes.n ? &rframes : NULL, &se) != RW_OK)
            RW_LOGE("rank %d: reply to op %u not sent: %s", r->rank, m->h.op, se.msg);
    }
    free(of.data);
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
