/* watch.c - the rank watchdog (watch.h): a thread beside a rank's serving thread
 * that notices a lost peer rank (a follower process of this launcher that exited, a dropped
 * op-socket connection, a stop signal on a follower) and, when the serving thread stays inside
 * an op that waits for that peer in a collective (which nothing else would end), aborts the
 * tensor-parallel communicator so that the op returns; a last resort runs when even that does
 * not free it.
 *
 * Serving lock: the serving thread holds it except between rw_watch_enter and rw_watch_leave.
 * The watchdog takes it only for the last resort, and only gets it while the serving thread is
 * inside an op, so the last resort may use what the serving thread uses outside ops. */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <zmq.h>

#include "options.h"
#include "watch.h"

#define WATCH_PERIOD_MS 50
/* a dropped connection waits this long for an exited child to say which rank it was */
#define NAME_GRACE_S 1.0
/* how long the watchdog waits at its end for an abort in progress before leaving it running */
#define ABORT_JOIN_S 10.0

/* The communicator abort runs on a thread of its own, so that an abort that never returns does
 * not keep the watchdog from its last resort. Freed by whoever sees `done` last. */
typedef struct aborter {
    rw_comm *comm;
    atomic_bool done;
    pthread_t thread;
} aborter;

struct rw_watch {
    rw_watch_opts o;
    pid_t pids[RW_DAEMON_MAX_TP]; /* the watchdog's copy; cleared once reported */
    int npids;
    void *mon; /* PAIR receiving the monitor events of o.sock (used by the watchdog thread) */
    pthread_t thread;
    pthread_mutex_t serving;
    atomic_bool quit;
    atomic_bool in_op;
    atomic_uint_fast64_t op_seq;
    atomic_int lost;
    char why[256]; /* written before `lost` is stored */
    atomic_bool aborted;
    aborter *ab; /* watchdog thread only */
};

static void nap_ms(int ms) {
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

void rw_op_socket_heartbeats(void *sock) {
    /* every 2 s; a connection that brings nothing in for 60 s after a ping is closed (a rank
     * whose host died without closing its sockets). A ping waits behind a message being sent,
     * and so does the answer to the other side's ping: the bound leaves a large relayed bucket
     * on a slow link the time to pass. */
    int ivl = 2000, timeout = 60000;
    zmq_setsockopt(sock, ZMQ_HEARTBEAT_IVL, &ivl, sizeof ivl);
    zmq_setsockopt(sock, ZMQ_HEARTBEAT_TIMEOUT, &timeout, sizeof timeout);
}

/* Records the loss once; `why` first, then the rank (release), so a reader of `lost` sees it. */
static void declare(rw_watch *w, int rank, const char *why) {
    snprintf(w->why, sizeof w->why, "%s", why);
    atomic_store(&w->lost, rank);
    RW_LOGE("rank %d: %s", w->o.rank, why);
}

/* A follower process of this launcher that has exited (left unreaped for the launcher), with
 * how it ended in desc; 0 when none. */
static int exited_child(rw_watch *w, char *desc, size_t cap) {
    for (int r = 1; r < w->npids; r++) {
        if (w->pids[r] <= 0) continue;
        siginfo_t si;
        memset(&si, 0, sizeof si);
        int rc = waitid(P_PID, (id_t)w->pids[r], &si, WEXITED | WNOHANG | WNOWAIT);
        if (rc == 0 && si.si_pid == w->pids[r]) {
            if (si.si_code == CLD_EXITED)
                snprintf(desc, cap, "process %d exited with status %d", (int)w->pids[r],
                         si.si_status);
            else
                snprintf(desc, cap, "process %d was killed by signal %d, %s", (int)w->pids[r],
                         si.si_status, strsignal(si.si_status));
        } else if (rc < 0 && errno == ECHILD) {
            snprintf(desc, cap, "process %d is gone", (int)w->pids[r]);
        } else {
            continue;
        }
        w->pids[r] = 0;
        return r;
    }
    return 0;
}

/* Reads every pending monitor event; true when a connection dropped. */
static bool drain_events(rw_watch *w) {
    bool dropped = false;
    for (;;) {
        zmq_msg_t m;
        zmq_msg_init(&m);
        if (zmq_msg_recv(&m, w->mon, ZMQ_DONTWAIT) < 0) {
            zmq_msg_close(&m);
            return dropped;
        }
        /* frame 1: event (u16) and value (u32); frame 2: the endpoint */
        if (zmq_msg_size(&m) >= 2) {
            uint16_t ev;
            memcpy(&ev, zmq_msg_data(&m), 2);
            if (ev == ZMQ_EVENT_DISCONNECTED) dropped = true;
        }
        int more = zmq_msg_more(&m);
        zmq_msg_close(&m);
        while (more) {
            zmq_msg_init(&m);
            if (zmq_msg_recv(&m, w->mon, 0) < 0)
                more = 0;
            else
                more = zmq_msg_more(&m);
            zmq_msg_close(&m);
        }
    }
}

static void *abort_main(void *p) {
    aborter *a = p;
    rw_comm_abort(a->comm);
    atomic_store(&a->done, true);
    return NULL;
}

static void start_abort(rw_watch *w, const char *why) {
    RW_LOGE("rank %d: stuck in a collective since %s: aborting the tensor-parallel communicator",
            w->o.rank, why);
    atomic_store(&w->aborted, true);
    aborter *a = calloc(1, sizeof *a);
    if (!a) {
        rw_comm_abort(w->o.comm);
        return;
    }
    a->comm = w->o.comm;
    atomic_init(&a->done, false);
    if (pthread_create(&a->thread, NULL, abort_main, a) != 0) {
        free(a);
        rw_comm_abort(w->o.comm);
        return;
    }
    w->ab = a;
}

/* At the watchdog's end: joins the aborter, or leaves it running (and its state allocated) when
 * it does not finish in time. */
static void end_abort(rw_watch *w) {
    aborter *a = w->ab;
    if (!a) return;
    w->ab = NULL;
    const double end = rw_now() + ABORT_JOIN_S;
    while (!atomic_load(&a->done) && rw_now() < end)
        nap_ms(5);
    if (atomic_load(&a->done)) {
        pthread_join(a->thread, NULL);
        free(a);
    } else {
        RW_LOGE("rank %d: the communicator abort did not return", w->o.rank);
        pthread_detach(a->thread);
    }
}

static void *watch_main(void *p) {
    rw_watch *w = p;
    const double abort_after = w->o.abort_after_s > 0 ? w->o.abort_after_s : 2.0;
    const double resort_after = w->o.last_resort_after_s > 0 ? w->o.last_resort_after_s : 10.0;
    double t_drop = 0;    /* a dropped connection seen, not yet put down to a rank */
    double t_trouble = 0; /* a peer lost or a stop asked for */
    double t_abort = 0;
    double seen_at = 0; /* when the current op was first seen */
    uint64_t seen_seq = 0;
    bool seen = false, resorted = false;
    while (!atomic_load(&w->quit)) {
        if (w->mon) {
            zmq_pollitem_t pi = {w->mon, 0, ZMQ_POLLIN, 0};
            if (zmq_poll(&pi, 1, WATCH_PERIOD_MS) > 0 && drain_events(w) && t_drop == 0)
                t_drop = rw_now();
        } else {
            nap_ms(WATCH_PERIOD_MS);
        }
        const double now = rw_now();
        if (!atomic_load(&w->lost)) {
            char desc[160], why[256];
            int r = exited_child(w, desc, sizeof desc);
            if (r > 0) {
                snprintf(why, sizeof why, "rank %d died (%s)", r, desc);
                declare(w, r, why);
            } else if (t_drop > 0 && (w->npids <= 1 || now - t_drop >= NAME_GRACE_S)) {
                declare(w, -1,
                        w->o.rank == 0 ? "the connection of a rank to rank 0 dropped (its process "
                                         "died or its host stopped answering)"
                                       : "rank 0 went away (its connection dropped)");
            }
        }
        const bool stop = w->o.stop && *w->o.stop;
        if ((atomic_load(&w->lost) || stop) && t_trouble == 0) t_trouble = now;
        if (!atomic_load(&w->in_op)) {
            seen = false;
            continue;
        }
        const uint64_t seq = atomic_load(&w->op_seq);
        if (!seen || seq != seen_seq) {
            seen = true;
            seen_seq = seq;
            seen_at = now;
        }
        if (t_trouble == 0 || !w->o.comm) continue;
        const double since = seen_at > t_trouble ? seen_at : t_trouble;
        if (!atomic_load(&w->aborted)) {
            if (now - since >= abort_after)
                start_abort(w, atomic_load(&w->lost) ? w->why : "a stop signal");
            if (atomic_load(&w->aborted)) t_abort = now;
            continue;
        }
        const double since_abort = seen_at > t_abort ? seen_at : t_abort;
        if (resorted || !w->o.last_resort || now - since_abort < resort_after) continue;
        /* got only while the serving thread is inside an op (it holds the lock elsewhere) */
        if (pthread_mutex_trylock(&w->serving) != 0) continue;
        resorted = true;
        if (atomic_load(&w->in_op)) {
            RW_LOGE("rank %d: still stuck %.0f s after the communicator abort", w->o.rank,
                    now - since_abort);
            w->o.last_resort(w->o.arg, atomic_load(&w->lost) ? w->why : "a stop signal");
        }
        pthread_mutex_unlock(&w->serving);
    }
    end_abort(w);
    return NULL;
}

rw_status rw_watch_start(const rw_watch_opts *o, rw_watch **out, rw_err *err) {
    *out = NULL;
    rw_watch *w = calloc(1, sizeof *w);
    if (!w) RW_FAIL(err, RW_E_OOM, "watchdog");
    w->o = *o;
    if (o->pids) {
        w->npids = o->npids < RW_DAEMON_MAX_TP ? o->npids : RW_DAEMON_MAX_TP;
        memcpy(w->pids, o->pids, sizeof(pid_t) * (size_t)w->npids);
    }
    atomic_init(&w->quit, false);
    atomic_init(&w->in_op, false);
    atomic_init(&w->op_seq, 0);
    atomic_init(&w->lost, 0);
    atomic_init(&w->aborted, false);
    if (pthread_mutex_init(&w->serving, NULL) != 0) {
        free(w);
        RW_FAIL(err, RW_E_INTERNAL, "watchdog: pthread_mutex_init failed");
    }
    rw_status st = RW_OK;
    if (o->sock) {
        char ep[96];
        snprintf(ep, sizeof ep, "inproc://rw-watch-%d-%p", o->rank, (void *)w);
        if (zmq_socket_monitor(o->sock, ep, ZMQ_EVENT_DISCONNECTED) != 0) {
            st = RW_ERR(err, RW_E_ZMQ, "watchdog: zmq_socket_monitor: %s", zmq_strerror(errno));
            goto fail;
        }
        w->mon = zmq_socket(o->zctx, ZMQ_PAIR);
        int linger = 0;
        if (w->mon) zmq_setsockopt(w->mon, ZMQ_LINGER, &linger, sizeof linger);
        if (!w->mon || zmq_connect(w->mon, ep) != 0) {
            st = RW_ERR(err, RW_E_ZMQ, "watchdog: monitor socket: %s", zmq_strerror(errno));
            zmq_socket_monitor(o->sock, NULL, 0);
            goto fail;
        }
    }
    pthread_mutex_lock(&w->serving);
    if (pthread_create(&w->thread, NULL, watch_main, w) != 0) {
        pthread_mutex_unlock(&w->serving);
        st = RW_ERR(err, RW_E_INTERNAL, "watchdog: cannot start its thread");
        if (o->sock) zmq_socket_monitor(o->sock, NULL, 0);
        goto fail;
    }
    *out = w;
    return RW_OK;
fail:
    if (w->mon) zmq_close(w->mon);
    pthread_mutex_destroy(&w->serving);
    free(w);
    return st;
}

void rw_watch_stop(rw_watch *w) {
    if (!w) return;
    atomic_store(&w->quit, true);
    pthread_join(w->thread, NULL);
    if (w->o.sock) zmq_socket_monitor(w->o.sock, NULL, 0);
    if (w->mon) zmq_close(w->mon);
    pthread_mutex_unlock(&w->serving);
    pthread_mutex_destroy(&w->serving);
    free(w);
}

void rw_watch_enter(rw_watch *w) {
    if (!w) return;
    atomic_fetch_add(&w->op_seq, 1);
    atomic_store(&w->in_op, true);
    pthread_mutex_unlock(&w->serving);
}

void rw_watch_leave(rw_watch *w) {
    if (!w) return;
    pthread_mutex_lock(&w->serving);
    atomic_store(&w->in_op, false);
}

int rw_watch_lost(rw_watch *w, char *why, size_t cap) {
    if (!w) return 0;
    int r = atomic_load(&w->lost);
    if (r && why && cap) snprintf(why, cap, "%s", w->why);
    return r;
}

bool rw_watch_aborted(rw_watch *w) {
    return w && atomic_load(&w->aborted);
}
