/* clients.h - the control socket's clients as rank 0 sees them (clients.c): one record per
 * ZeroMQ connection (its routing id), what it has in flight against the per-client limits, and
 * whether its connection closed. Connections are watched through a socket monitor on the ROUTER:
 * its accept and disconnect events carry the connection's file descriptor, which is matched with
 * the descriptor each received message came from (ZMQ_SRCFD). Descriptors are reused, so each
 * carries an epoch (accepts seen) and the monitor is drained before a message's sender is noted:
 * the accept of a connection is queued before any of its messages can be read.
 *
 * A connection over inproc:// has no descriptor: its client is never seen to leave. A message
 * read after its connection closed and its descriptor was reused by a newer one is taken for the
 * newer connection's (the race is narrow: the older client's requests are then aborted when the
 * newer connection closes, or finish on their own). */
#ifndef RW_DAEMON_CLIENTS_H
#define RW_DAEMON_CLIENTS_H

#include "rw_msg.h"

#ifdef __cplusplus
extern "C" {
#endif

#define RW_CLIENTS_MAX 65536 /* records kept at once (idle ones are evicted first) */

typedef struct rw_client_rec {
    char id[256]; /* routing id */
    size_t id_len;
    int fd;            /* the connection's descriptor (-1: unknown, inproc) */
    uint64_t epoch;    /* the descriptor's epoch when the client was last seen */
    bool gone;         /* its connection closed */
    bool reported;     /* the owner was told (the gone callback ran) */
    uint64_t requests; /* generate requests in flight */
    uint64_t tokens;   /* prompt + max_new_tokens of those requests */
    double t_seen;     /* rw_now() of its last message */
} rw_client_rec;

typedef struct rw_clients rw_clients;
/* Called once for every client whose connection closed (rec stays valid during the call). */
typedef void (*rw_clients_gone_fn)(void *arg, rw_client_rec *rec);

/* Starts the monitor of `router` (a ROUTER socket of context zctx, before it binds). */
rw_status rw_clients_create(void *zctx, void *router, rw_clients_gone_fn gone, void *arg,
                            rw_clients **out, rw_err *err);
void rw_clients_destroy(rw_clients *c); /* NULL: no-op */
/* Handles every pending monitor event (non-blocking): calls `gone` for clients whose connection
 * closed, and forgets gone clients with nothing in flight. */
void rw_clients_poll(rw_clients *c);
/* The record of the sender of `zm`, created at first sight, after the monitor was drained; its
 * `gone` is set when the connection had closed before the message was read. NULL when the table
 * is full of clients with work in flight. */
rw_client_rec *rw_clients_seen(rw_clients *c, const rw_zmq_msg *zm);
/* The record of routing id id[n], or NULL. */
rw_client_rec *rw_clients_find(rw_clients *c, const void *id, size_t n);
/* Records held now (stats). */
size_t rw_clients_count(const rw_clients *c);

#ifdef __cplusplus
}
#endif

#endif
