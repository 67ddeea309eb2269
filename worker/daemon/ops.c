/* ops.c - rank operations (ops.h): the framing of the messages rank 0 sends to the other ranks
 * (a fixed header, an optional payload, optional bulk frames), the ADD payload codec, the fields
 * a relayed request loses, and rank 0's send / gather helpers. */
#include "ops.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zmq.h>

#define OP_MAX_PARTS (1 + RW_MSG_MAX_FRAMES) /* payload + data frames */

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
    for (int i = 1; i < m->nparts && out->n < RW_MSG_MAX_FRAMES; i++) {
        out->data[out->n] = zmq_msg_data(&p[i]);
        out->len[out->n] = zmq_msg_size(&p[i]);
        out->n++;
    }
}

/* ------------------------------------------------------------------------------------------ */
/* ADD payload: [prompt ids], temperature, top_p, top_k, seed, max_new_tokens, [stop ids],     */
/* top_logprobs, logprob_mode, then the request options n_samples, n_score, prompt_logprobs,   */
/* routed_experts, routing_weights (a msgpack array; floats as f64, which round-trips a float   */
/* exactly).                                                                                    */
/* ------------------------------------------------------------------------------------------ */
#define ADD_FIELDS 14

rw_status rw_op_add_encode(rw_mw *w, const int32_t *prompt, int n, const rw_sampling *sp,
                           rw_err *err) {
    return rw_op_add_ex_encode(w, prompt, n, sp, NULL, err);
}

rw_status rw_op_add_ex_encode(rw_mw *w, const int32_t *prompt, int n, const rw_sampling *sp,
                              const rw_request_opts *ro, rw_err *err) {
    const rw_request_opts none = {0};
    if (!ro) ro = &none;
    rw_mw_reset(w);
    rw_mw_array(w, ADD_FIELDS);
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
    rw_mw_i64(w, sp->logprob_mode);
    rw_mw_i64(w, ro->n_samples);
    rw_mw_i64(w, ro->n_score);
    rw_mw_bool(w, ro->prompt_logprobs);
    rw_mw_bool(w, ro->routed_experts);
    rw_mw_bool(w, ro->routing_weights);
    const void *d;
    size_t len;
    return rw_mw_finish(w, &d, &len, err);
}

rw_status rw_op_add_decode(const void *buf, size_t len, int32_t **prompt, int *n, rw_sampling *sp,
                           rw_err *err) {
    rw_request_opts ro;
    return rw_op_add_ex_decode(buf, len, prompt, n, sp, &ro, err);
}

rw_status rw_op_add_ex_decode(const void *buf, size_t len, int32_t **prompt, int *n,
                              rw_sampling *sp, rw_request_opts *ro, rw_err *err) {
    memset(ro, 0, sizeof *ro);
    *prompt = NULL;
    rw_msg *m = NULL;
    const rw_mobj *v;
    RW_CHECK(rw_msg_decode_value(buf, len, &m, &v, err));
    rw_status st = RW_OK;
    int64_t *tmp = NULL;
    if (rw_mobj_type(v) != RW_M_ARRAY || rw_mobj_len(v) != ADD_FIELDS) {
        st = RW_ERR(err, RW_E_PROTOCOL, "rank op add: expected an array of %d", ADD_FIELDS);
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
    RW_CHECKGOTO(rw_mobj_i64(rw_mobj_at(v, 8), "logprob_mode", &x, err), st, out);
    sp->logprob_mode = (int)x;
    RW_CHECKGOTO(rw_mobj_i64(rw_mobj_at(v, 9), "n_samples", &x, err), st, out);
    ro->n_samples = (int)x;
    RW_CHECKGOTO(rw_mobj_i64(rw_mobj_at(v, 10), "n_score", &x, err), st, out);
    ro->n_score = (int)x;
    RW_CHECKGOTO(rw_mobj_bool(rw_mobj_at(v, 11), "prompt_logprobs", &ro->prompt_logprobs, err), st,
                 out);
    RW_CHECKGOTO(rw_mobj_bool(rw_mobj_at(v, 12), "routed_experts", &ro->routed_experts, err), st,
                 out);
    RW_CHECKGOTO(rw_mobj_bool(rw_mobj_at(v, 13), "routing_weights", &ro->routing_weights, err), st,
                 out);
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

size_t rw_op_keys(uint64_t mask, const char **keys) {
    static const char *const names[] = {"auth", "pause_mode", "rank"};
    size_t n = 0;
    for (size_t i = 0; i < sizeof names / sizeof *names; i++)
        if (mask & (1u << i)) keys[n++] = names[i];
    return n;
}
