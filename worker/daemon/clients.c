/* clients.c - the control socket's clients (clients.h): the ROUTER's socket monitor (accept and
 * disconnect events by file descriptor), the descriptor epochs that tell a reused descriptor's
 * connections apart, and the table of client records. */
#include "clients.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <zmq.h>

struct rw_clients {
    void *mon; /* PAIR connected to the ROUTER's monitor endpoint */
    rw_clients_gone_fn gone;
    void *arg;
    /* per descriptor: accepts seen (epoch) and whether its current connection closed */
    uint64_t *epoch;
    bool *dead;
    size_t nfd;
    rw_client_rec **recs;
    size_t n, cap;
};

rw_status rw_clients_create(void *zctx, void *router, rw_clients_gone_fn gone, void *arg,
                            rw_clients **out, rw_err *err) {
    *out = NULL;
    rw_clients *c = calloc(1, sizeof *c);
    if (!c) RW_FAIL(err, RW_E_OOM, "clients: out of memory");
    c->gone = gone;
    c->arg = arg;
    char ep[64];
    snprintf(ep, sizeof ep, "inproc://rw-control-monitor-%p", (void *)c);
    if (zmq_socket_monitor(router, ep, ZMQ_EVENT_ACCEPTED | ZMQ_EVENT_DISCONNECTED) != 0) {
        free(c);
        RW_FAIL(err, RW_E_ZMQ, "zmq_socket_monitor: %s", zmq_strerror(errno));
    }
    c->mon = zmq_socket(zctx, ZMQ_PAIR);
    if (!c->mon || zmq_connect(c->mon, ep) != 0) {
        rw_status st =
            RW_ERR(err, RW_E_ZMQ, "connecting the socket monitor: %s", zmq_strerror(errno));
        rw_clients_destroy(c);
        return st;
    }
    int linger = 0;
    zmq_setsockopt(c->mon, ZMQ_LINGER, &linger, sizeof linger);
    *out = c;
    return RW_OK;
}

void rw_clients_destroy(rw_clients *c) {
    if (!c) return;
    if (c->mon) zmq_close(c->mon);
    for (size_t i = 0; i < c->n; i++)
        free(c->recs[i]);
    free(c->recs);
    free(c->epoch);
    free(c->dead);
    free(c);
}

size_t rw_clients_count(const rw_clients *c) {
    return c ? c->n : 0;
}

/* Grows the descriptor tables to hold fd; false when out of memory. */
static bool fd_room(rw_clients *c, int fd) {
    if (fd < 0) return false;
    if ((size_t)fd < c->nfd) return true;
    size_t n = c->nfd ? c->nfd : 256;
    while (n <= (size_t)fd)
        n *= 2;
    uint64_t *e = realloc(c->epoch, n * sizeof *e);
    if (!e) return false;
    c->epoch = e;
    bool *d = realloc(c->dead, n * sizeof *d);
    if (!d) return false;
    c->dead = d;
    memset(c->epoch + c->nfd, 0, (n - c->nfd) * sizeof *e);
    memset(c->dead + c->nfd, 0, (n - c->nfd) * sizeof *d);
    c->nfd = n;
    return true;
}

static void drop(rw_clients *c, size_t i) {
    free(c->recs[i]);
    c->recs[i] = c->recs[--c->n];
}

/* A closed connection: its clients are told once; the idle ones are forgotten. */
static void closed(rw_clients *c, int fd) {
    if (!fd_room(c, fd)) return;
    c->dead[fd] = true;
    for (size_t i = 0; i < c->n;) {
        rw_client_rec *r = c->recs[i];
        if (r->fd == fd && r->epoch == c->epoch[fd] && !r->gone) {
            r->gone = true;
            if (c->gone && !r->reported) c->gone(c->arg, r);
            r->reported = true;
        }
        if (r->gone && !r->requests)
            drop(c, i);
        else
            i++;
    }
}

void rw_clients_poll(rw_clients *c) {
    if (!c) return;
    for (;;) {
        zmq_msg_t ev, addr;
        zmq_msg_init(&ev);
        if (zmq_msg_recv(&ev, c->mon, ZMQ_DONTWAIT) < 0) {
            zmq_msg_close(&ev);
            break;
        }
        /* frame 1: u16 event, u32 value (the descriptor); frame 2: the endpoint */
        uint16_t event = 0;
        uint32_t value = 0;
        if (zmq_msg_size(&ev) >= 6) {
            memcpy(&event, zmq_msg_data(&ev), 2);
            memcpy(&value, (const char *)zmq_msg_data(&ev) + 2, 4);
        }
        const bool more = zmq_msg_more(&ev);
        zmq_msg_close(&ev);
        if (more) {
            zmq_msg_init(&addr);
            zmq_msg_recv(&addr, c->mon, 0);
            zmq_msg_close(&addr);
        }
        const int fd = (int)value;
        if (event == ZMQ_EVENT_ACCEPTED && fd_room(c, fd)) {
            c->epoch[fd]++;
            c->dead[fd] = false;
        } else if (event == ZMQ_EVENT_DISCONNECTED) {
            closed(c, fd);
        }
    }
    /* clients that went away while work was in flight are forgotten once it is done */
    for (size_t i = 0; i < c->n;) {
        if (c->recs[i]->gone && !c->recs[i]->requests)
            drop(c, i);
        else
            i++;
    }
}

rw_client_rec *rw_clients_find(rw_clients *c, const void *id, size_t n) {
    for (size_t i = 0; c && i < c->n; i++)
        if (c->recs[i]->id_len == n && !memcmp(c->recs[i]->id, id, n)) return c->recs[i];
    return NULL;
}

/* Room for one more record: grows the table, or evicts the longest idle client that has nothing
 * in flight. */
static bool room(rw_clients *c) {
    if (c->n < c->cap) return true;
    if (c->cap < RW_CLIENTS_MAX) {
        size_t nc = c->cap ? 2 * c->cap : 64;
        rw_client_rec **p = realloc(c->recs, nc * sizeof *p);
        if (!p) return false;
        c->recs = p;
        c->cap = nc;
        return true;
    }
    size_t best = c->n;
    for (size_t i = 0; i < c->n; i++)
        if (!c->recs[i]->requests && (best == c->n || c->recs[i]->t_seen < c->recs[best]->t_seen))
            best = i;
    if (best == c->n) return false;
    drop(c, best);
    return true;
}

rw_client_rec *rw_clients_seen(rw_clients *c, const rw_zmq_msg *zm) {
    if (!c) return NULL;
    /* every accept queued before this message was read is known after this */
    rw_clients_poll(c);
    size_t n;
    const void *id = rw_zmq_msg_peer(zm, &n);
    if (n > sizeof c->recs[0]->id) n = sizeof c->recs[0]->id;
    rw_client_rec *r = rw_clients_find(c, id, n);
    if (!r) {
        if (!room(c)) return NULL;
        r = calloc(1, sizeof *r);
        if (!r) return NULL;
        memcpy(r->id, id, n);
        r->id_len = n;
        r->fd = -1;
        c->recs[c->n++] = r;
    }
    const int fd = rw_zmq_msg_srcfd(zm);
    if (fd >= 0 && fd_room(c, fd)) {
        r->fd = fd;
        r->epoch = c->epoch[fd];
        if (c->dead[fd]) r->gone = true; /* it closed before its message was read */
    }
    r->t_seen = rw_now();
    return r;
}
