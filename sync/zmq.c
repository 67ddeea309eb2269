/* zmq.c - the ZeroMQ framing of a message, worker side (rw_msg.h): multipart receive from a ROUTER
 * socket without copying the frames (a bucket's bytes are read where ZeroMQ received them),
 * replies with an optional zero-copy data frame. */
#include "sync_internal.h"

#include <inttypes.h>
#include <stdlib.h>
#include <zmq.h>

/* ------------------------------------------------------------------------------------------ */
/* Multipart messages                                                                           */
/* ------------------------------------------------------------------------------------------ */
#define MAX_PARTS (3 + RW_MSG_MAX_FRAMES) /* routing id, delimiter, envelope, data frames */

struct rw_zmq_msg {
    zmq_msg_t part[MAX_PARTS];
    int nparts;
    int env;    /* index of the envelope, -1 when missing */
    bool delim; /* an empty delimiter followed the routing id (REQ peer) */
};

void rw_zmq_msg_free(rw_zmq_msg *m) {
    if (!m) return;
    for (int i = 0; i < m->nparts; i++)
        zmq_msg_close(&m->part[i]);
    free(m);
}

const void *rw_zmq_msg_envelope(const rw_zmq_msg *m, size_t *len) {
    if (m->env < 0) {
        *len = 0;
        return NULL;
    }
    *len = zmq_msg_size((zmq_msg_t *)&m->part[m->env]);
    return zmq_msg_data((zmq_msg_t *)&m->part[m->env]);
}

void rw_zmq_msg_frames(const rw_zmq_msg *m, rw_sync_frames *out) {
    memset(out, 0, sizeof *out);
    if (m->env < 0) return;
    for (int i = m->env + 1; i < m->nparts && out->n < RW_MSG_MAX_FRAMES; i++) {
        out->data[out->n] = zmq_msg_data((zmq_msg_t *)&m->part[i]);
        out->len[out->n] = zmq_msg_size((zmq_msg_t *)&m->part[i]);
        out->n++;
    }
}

const void *rw_zmq_msg_peer(const rw_zmq_msg *m, size_t *len) {
    if (m->nparts < 1) {
        *len = 0;
        return NULL;
    }
    *len = zmq_msg_size((zmq_msg_t *)&m->part[0]);
    return zmq_msg_data((zmq_msg_t *)&m->part[0]);
}

/* The frame that carries the connection's metadata: any frame read from the wire (the routing
 * id is made up by the ROUTER and carries none). */
static zmq_msg_t *wire_part(const rw_zmq_msg *m) {
    return m->nparts > 1 ? (zmq_msg_t *)&m->part[m->nparts - 1] : NULL;
}

int rw_zmq_msg_srcfd(const rw_zmq_msg *m) {
    zmq_msg_t *p = wire_part(m);
    return p ? zmq_msg_get(p, ZMQ_SRCFD) : -1;
}

const char *rw_zmq_msg_peer_addr(const rw_zmq_msg *m) {
    zmq_msg_t *p = wire_part(m);
    const char *a = p ? zmq_msg_gets(p, "Peer-Address") : NULL;
    return a ? a : "";
}

rw_status rw_zmq_recv(void *router, int timeout_ms, rw_zmq_msg **out, rw_err *err) {
    *out = NULL;
    zmq_pollitem_t pi = {.socket = router, .events = ZMQ_POLLIN};
    int rc = zmq_poll(&pi, 1, timeout_ms);
    if (rc < 0) return RW_ZMQ_FAIL(err, "zmq_poll");
    if (rc == 0) RW_FAIL(err, RW_E_TIMEOUT, "no message within %d ms", timeout_ms);
    rw_zmq_msg *m = calloc(1, sizeof *m);
    if (!m) RW_FAIL(err, RW_E_OOM, "zmq receive: out of memory");
    m->env = -1;
    bool too_many = false;
    int more = 1;
    while (more) {
        zmq_msg_t tmp, *dst = m->nparts < MAX_PARTS ? &m->part[m->nparts] : &tmp;
        zmq_msg_init(dst);
        if (zmq_msg_recv(dst, router, 0) < 0) {
            zmq_msg_close(dst);
            rw_zmq_msg_free(m);
            return RW_ZMQ_FAIL(err, "zmq_msg_recv");
        }
        more = zmq_msg_more(dst);
        if (dst == &tmp) {
            too_many = true; /* drained and dropped */
            zmq_msg_close(&tmp);
        } else {
            m->nparts++;
        }
    }
    /* part 0 is the routing id; an empty part 1 is a REQ delimiter */
    int i = 1;
    if (m->nparts > 1 && zmq_msg_size(&m->part[1]) == 0) {
        m->delim = true;
        i = 2;
    }
    if (i < m->nparts) m->env = i;
    /* without a delimiter the slot kept for one holds a fifth data frame */
    if (m->env >= 0 && m->nparts - m->env - 1 > RW_MSG_MAX_FRAMES) too_many = true;
    *out = m;
    if (m->env < 0) RW_FAIL(err, RW_E_FORMAT, "zmq receive: a message without an envelope frame");
    if (too_many)
        RW_FAIL(err, RW_E_FORMAT, "zmq receive: more than 4 data frames after the envelope");
    return RW_OK;
}

static void free_cb(void *data, void *hint) {
    (void)hint;
    free(data);
}

rw_status rw_zmq_reply(void *router, const rw_zmq_msg *to, const void *env, size_t env_len,
                       rw_sync_out_frame *frame, rw_err *err) {
    bool has_frame = frame && frame->data;
    zmq_msg_t id;
    if (zmq_msg_init(&id) || zmq_msg_copy(&id, (zmq_msg_t *)&to->part[0]))
        return RW_ZMQ_FAIL(err, "zmq_msg_copy (routing id)");
    if (zmq_msg_send(&id, router, ZMQ_SNDMORE) < 0) {
        zmq_msg_close(&id);
        goto fail;
    }
    if (to->delim && zmq_send(router, "", 0, ZMQ_SNDMORE) < 0) goto fail;
    if (zmq_send(router, env, env_len, has_frame ? ZMQ_SNDMORE : 0) < 0) goto fail;
    if (has_frame) {
        zmq_msg_t d;
        if (zmq_msg_init_data(&d, frame->data, frame->len, free_cb, NULL)) goto fail;
        frame->data = NULL; /* owned by ZeroMQ now */
        if (zmq_msg_send(&d, router, 0) < 0) {
            zmq_msg_close(&d);
            goto fail;
        }
    }
    return RW_OK;
fail:
    /* a peer that went away is not an error of ours: ROUTER drops unroutable messages */
    if (has_frame && frame->data) {
        free(frame->data);
        frame->data = NULL;
    }
    return RW_ZMQ_FAIL(err, "zmq reply");
}
