/* watch.h - the rank watchdog (watch.c). */
#ifndef RW_DAEMON_WATCH_H
#define RW_DAEMON_WATCH_H

#include <signal.h>
#include <sys/types.h>

#include "rw_worker.h"

#ifdef __cplusplus
extern "C" {
#endif

/* A thread beside a rank's serving thread that notices a lost peer and unsticks the serving
 * thread when it waits for that peer inside a collective, which nothing else would end:
 * - a follower process this rank started has exited (waitid, without reaping it);
 * - a connection of the rank op socket dropped (a ZeroMQ monitor; heartbeats on the op sockets
 *   make a silent host drop too): rank 0 sees a follower go, a follower sees rank 0 go;
 * - (followers) a signal asked the process to stop.
 * Once one happened and the serving thread has stayed inside one op (rw_watch_enter .. leave)
 * for abort_after_s, the tensor-parallel communicator is aborted (rw_comm_abort) so the op
 * returns. If it still has not returned last_resort_after_s later, `last_resort` runs on the
 * watchdog thread while the serving thread is known to be inside the op: it may use what the
 * serving thread only uses outside ops, and does not return (it ends the process). */
typedef struct rw_watch rw_watch;

typedef struct rw_watch_opts {
    int rank;          /* this rank (messages) */
    void *zctx;        /* the op socket's context */
    void *sock;        /* the op socket to monitor (rank 0's ROUTER, a follower's
                          DEALER); NULL: none (in-process thread ranks) */
    const pid_t *pids; /* pids[r], 1 <= r < npids: follower processes of this
                          launcher (0: not ours); NULL: none */
    int npids;
    rw_comm *comm;               /* this rank's tensor-parallel communicator (borrowed) */
    volatile sig_atomic_t *stop; /* followers: set by SIGTERM / SIGINT; NULL: ignored */
    double abort_after_s;        /* default 2 */
    double last_resort_after_s;  /* default 10 */
    void (*last_resort)(void *arg, const char *why); /* NULL: none */
    void *arg;
} rw_watch_opts;

/* Starts the watchdog; call from the serving thread, which owns o->sock and from here on holds
 * the serving lock outside ops. */
rw_status rw_watch_start(const rw_watch_opts *o, rw_watch **out, rw_err *err);
/* Stops and joins it, from the serving thread (outside an op); NULL is a no-op. */
void rw_watch_stop(rw_watch *w);
/* The serving thread brackets the ops that may wait inside a collective for the other ranks
 * (rank 0: engine steps; a follower: every op it executes). NULL is a no-op. */
void rw_watch_enter(rw_watch *w);
void rw_watch_leave(rw_watch *w);
/* 0 while no peer was lost; else the lost rank (>= 1, or -1 when it is not known which: a
 * dropped connection; on a follower, rank 0 is reported as -1 too) with a message in why. */
int rw_watch_lost(rw_watch *w, char *why, size_t cap);
/* True once the watchdog aborted the communicator. */
bool rw_watch_aborted(rw_watch *w);

/* Heartbeats on a rank op socket (set before bind / connect): ZeroMQ's I/O thread answers them
 * even while the rank's serving thread is busy, so only a dead process or host goes silent. */
void rw_op_socket_heartbeats(void *sock);

#ifdef __cplusplus
}
#endif

#endif
