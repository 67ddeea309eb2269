/* launch.c - starting the ranks of a worker: one rank alone; N ranks as threads of this process
 * (CPU backend: the in-process thread communicator); N ranks as processes, one per GPU, re-running
 * this executable with --rank (CUDA backend: NCCL); or one rank of a set an external launcher
 * started. Rank 0 binds the peer socket, waits for every other rank's hello (answering with the
 * NCCL unique id of the tensor-parallel communicator) and ready, then serves; at the end it sends
 * QUIT and reaps what it started. */
#include "launch.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zmq.h>

#include "follower.h"
#include "ops.h"
#include "rank.h"
#include "server.h"

/* ------------------------------------------------------------------------------------------ */
/* Rendezvous, rank 0 side                                                                      */
/* ------------------------------------------------------------------------------------------ */
/* A follower process we started that has exited (its pid is cleared), or -1. */
static int dead_child(rw_peers *p) {
    for (int r = 1; r <= p->n; r++) {
        if (p->pids[r] <= 0) continue;
        int status;
        if (waitpid(p->pids[r], &status, WNOHANG) == p->pids[r]) {
            p->pids[r] = 0;
            return r;
        }
    }
    return -1;
}

static rw_status wait_all(rw_peers *p, rw_op op, const uint8_t *nccl_id, double timeout_s,
                          rw_err *err) {
    bool seen[RW_DAEMON_MAX_TP] = {false};
    int got = 0;
    double deadline = rw_now() + timeout_s;
    while (got < p->n) {
        if (rw_now() > deadline)
            RW_FAIL(err, RW_E_TIMEOUT, "%d of %d ranks did not %s within %.0f s", p->n - got, p->n,
                    op == RW_OP_HELLO ? "connect" : "start", timeout_s);
        int dead = dead_child(p);
        if (dead > 0) RW_FAIL(err, RW_E_STATE, "rank %d exited during start-up", dead);
        rw_op_msg m;
        rw_err e;
        rw_status st = rw_op_recv(p->sock, true, 200, &m, &e);
        if (st == RW_E_TIMEOUT) continue;
        if (st != RW_OK) {
            RW_LOGW("rank 0: during start-up: %s", e.msg);
            continue;
        }
        int r = (int)m.h.a;
        char route[16];
        int rn = snprintf(route, sizeof route, "rank%d", r);
        if (m.h.op != op || r < 1 || r > p->n || seen[r] || (size_t)rn != m.route_len ||
            memcmp(route, m.route, m.route_len)) {
            RW_LOGW("rank 0: unexpected start-up message (op %u from rank %d)", m.h.op, r);
            rw_op_msg_free(&m);
            continue;
        }
        if (op == RW_OP_HELLO && (int)m.h.b != p->n + 1) {
            rw_op_msg_free(&m);
            RW_FAIL(err, RW_E_INVALID_ARG, "rank %d was started with --tp %d, rank 0 with --tp %d",
                    r, (int)m.h.b, p->n + 1);
        }
        if (op == RW_OP_READY && m.h.status != RW_OK) {
            size_t len;
            const char *msg = rw_op_payload(&m, &len);
            rw_err_set(err, (rw_status)m.h.status, __FILE__, __LINE__, "rank %d: %.*s", r, (int)len,
                       msg ? msg : "");
            rw_op_msg_free(&m);
            return err ? err->status : RW_E_STATE;
        }
        if (op == RW_OP_HELLO) {
            rw_op_hdr h = rw_op_make(RW_OP_HELLO, 0, 0, 0, 0);
            st = rw_op_send(p->sock, route, (size_t)rn, &h, nccl_id, nccl_id ? RW_NCCL_ID_BYTES : 0,
                            NULL, err);
            if (st != RW_OK) {
                rw_op_msg_free(&m);
                return st;
            }
        }
        rw_op_msg_free(&m);
        seen[r] = true;
        got++;
    }
    return RW_OK;
}

/* Rank-0 side of the rendezvous: waits for every follower's hello (sending the NCCL id of the
 * tensor-parallel communicator when `nccl_id` is non-NULL), then, after rank 0 opened its own
 * rank, for every follower's ready. */
static rw_status peers_hello(rw_peers *p, const uint8_t *nccl_id, double timeout_s, rw_err *err) {
    return wait_all(p, RW_OP_HELLO, nccl_id, timeout_s, err);
}

static rw_status peers_ready(rw_peers *p, double timeout_s, rw_err *err) {
    return wait_all(p, RW_OP_READY, NULL, timeout_s, err);
}

/* ------------------------------------------------------------------------------------------ */
/* Starting followers                                                                           */
/* ------------------------------------------------------------------------------------------ */
typedef struct thread_arg {
    const rw_dopts *o;
    int rank;
    void *zctx;
    const char *peer;
    rw_comm_group *group;
    int rc;
} thread_arg;

static void *thread_main(void *p) {
    thread_arg *a = p;
    a->rc = rw_follower_main(a->o, a->rank, a->zctx, a->peer, a->group, NULL);
    return NULL;
}

/* Runs this executable as rank `r` (CUDA launcher). */
static pid_t spawn_rank(const rw_dopts *o, int r, const char *peer) {
    char rank_s[16], tp_s[16], gpu_s[16], seed_s[32], kvf_s[32], kvmb_s[32], mb_s[16], mbt_s[16],
        st_s[32], rt_s[32];
    snprintf(rank_s, sizeof rank_s, "%d", r);
    snprintf(tp_s, sizeof tp_s, "%d", o->tp);
    snprintf(gpu_s, sizeof gpu_s, "%d", rw_dopts_device(o, r));
    snprintf(seed_s, sizeof seed_s, "%llu", (unsigned long long)o->seed);
    snprintf(kvf_s, sizeof kvf_s, "%.17g", o->kv_fraction);
    snprintf(kvmb_s, sizeof kvmb_s, "%.17g", o->kv_mb);
    snprintf(mb_s, sizeof mb_s, "%d", o->max_batch);
    snprintf(mbt_s, sizeof mbt_s, "%d", o->max_batch_tokens);
    snprintf(st_s, sizeof st_s, "%.17g", o->startup_timeout_s);
    snprintf(rt_s, sizeof rt_s, "%.17g", o->rank_timeout_s);
    const char *av[40];
    int k = 0;
    av[k++] = o->self_exe;
    av[k++] = "--rank";
    av[k++] = rank_s;
    av[k++] = "--tp";
    av[k++] = tp_s;
    av[k++] = "--peer";
    av[k++] = peer;
    av[k++] = "--device";
    av[k++] = rw_backend_str(o->backend);
    av[k++] = "--precision";
    av[k++] = rw_precision_str(o->precision);
    av[k++] = "--gpu";
    av[k++] = gpu_s;
    if (o->model_dir) {
        av[k++] = "--model";
        av[k++] = o->model_dir;
    } else {
        av[k++] = "--config";
        av[k++] = o->config_path;
    }
    if (o->random_weights) av[k++] = "--random-weights";
    av[k++] = "--seed";
    av[k++] = seed_s;
    av[k++] = "--kv-fraction";
    av[k++] = kvf_s;
    if (o->kv_mb > 0) {
        av[k++] = "--kv-mb";
        av[k++] = kvmb_s;
    }
    if (o->max_batch > 0) {
        av[k++] = "--max-batch";
        av[k++] = mb_s;
    }
    if (o->max_batch_tokens > 0) {
        av[k++] = "--max-batch-tokens";
        av[k++] = mbt_s;
    }
    av[k++] = "--startup-timeout";
    av[k++] = st_s;
    av[k++] = "--rank-timeout";
    av[k++] = rt_s;
    av[k] = NULL;
    pid_t pid = fork();
    if (pid == 0) {
        /* the rank must not outlive its launcher */
        prctl(PR_SET_PDEATHSIG, SIGTERM);
        char pre[32];
        snprintf(pre, sizeof pre, "rank%d", r);
        setenv("RW_LOG_PREFIX", pre, 1);
        execv(o->self_exe, (char *const *)av);
        fprintf(stderr, "rw-worker: exec %s for rank %d: %s\n", o->self_exe, r, strerror(errno));
        _exit(127);
    }
    return pid;
}

/* Waits for the followers to end (bounded: 15 s, 2 s after a rank was lost, as the others may
 * be stuck in a collective with it), then stops the ones that did not. */
static void reap(rw_peers *p) {
    for (int i = 0; i < p->nthreads; i++)
        pthread_join(p->threads[i], NULL);
    double deadline = rw_now() + (p->lost ? 2 : 15);
    for (;;) {
        int left = 0;
        for (int r = 1; r <= p->n; r++) {
            if (p->pids[r] <= 0) continue;
            int status;
            if (waitpid(p->pids[r], &status, WNOHANG) == p->pids[r])
                p->pids[r] = 0;
            else
                left++;
        }
        if (!left) return;
        if (rw_now() > deadline) break;
        usleep(20000);
    }
    for (int r = 1; r <= p->n; r++)
        if (p->pids[r] > 0) {
            RW_LOGW("rank %d did not stop; terminating it", r);
            kill(p->pids[r], SIGTERM);
        }
    deadline = rw_now() + 5;
    for (int r = 1; r <= p->n; r++) {
        while (p->pids[r] > 0) {
            int status;
            if (waitpid(p->pids[r], &status, WNOHANG) == p->pids[r]) {
                p->pids[r] = 0;
            } else if (rw_now() > deadline) {
                kill(p->pids[r], SIGKILL);
                waitpid(p->pids[r], &status, 0);
                p->pids[r] = 0;
            } else {
                usleep(20000);
            }
        }
    }
}

static void send_quit(rw_peers *p) {
    if (!p->sock) return;
    rw_op_hdr h = rw_op_make(RW_OP_QUIT, 0, 0, 0, 0);
    rw_err e;
    if (rw_peers_send(p, -1, &h, NULL, 0, NULL, &e) != RW_OK) RW_LOGW("rank 0: quit: %s", e.msg);
}

/* ------------------------------------------------------------------------------------------ */
int rw_launch_main(const rw_dopts *o, volatile sig_atomic_t *stop) {
    if (o->rank >= 1) {
        char pre[32];
        snprintf(pre, sizeof pre, "rank%d", o->rank);
        setenv("RW_LOG_PREFIX", pre, 0);
        return rw_follower_main(o, o->rank, NULL, o->peer, NULL, stop);
    }
    int rc = 1;
    rw_err e;
    rw_err_clear(&e);
    rw_peers peers;
    memset(&peers, 0, sizeof peers);
    peers.n = o->tp - 1;
    rw_comm_group *group = NULL;
    rw_rank *r0 = NULL;
    thread_arg targs[RW_DAEMON_MAX_TP];
    void *zctx = zmq_ctx_new();
    if (!zctx) {
        fprintf(stderr, "rw-worker: zmq_ctx_new failed\n");
        return 1;
    }
    const bool threads = o->backend == RW_BACKEND_CPU && o->rank < 0;
    const bool nccl = o->backend == RW_BACKEND_CUDA && o->tp > 1;
    uint8_t nccl_id[RW_NCCL_ID_BYTES];
    rw_status st = RW_OK;
    rw_comm *comm = NULL;
    if (o->tp > 1) {
        peers.sock = zmq_socket(zctx, ZMQ_ROUTER);
        /* the op stream must never lose a message (a lost step desynchronises the ranks): no
         * high-water mark, and a send to a rank that is gone fails instead of being dropped */
        int linger = 2000, hwm = 0, mandatory = 1;
        if (peers.sock) {
            zmq_setsockopt(peers.sock, ZMQ_LINGER, &linger, sizeof linger);
            zmq_setsockopt(peers.sock, ZMQ_SNDHWM, &hwm, sizeof hwm);
            zmq_setsockopt(peers.sock, ZMQ_RCVHWM, &hwm, sizeof hwm);
            zmq_setsockopt(peers.sock, ZMQ_ROUTER_MANDATORY, &mandatory, sizeof mandatory);
            if (!threads) rw_op_socket_heartbeats(peers.sock);
        }
        char ep[256];
        const char *bind_addr =
            threads ? "inproc://rw-peers" : (o->peer ? o->peer : "tcp://127.0.0.1:*");
        if (!peers.sock || zmq_bind(peers.sock, bind_addr) != 0) {
            st = RW_ERR(&e, RW_E_ZMQ, "peer socket: bind %s: %s", bind_addr, zmq_strerror(errno));
            goto out;
        }
        size_t len = sizeof ep;
        zmq_getsockopt(peers.sock, ZMQ_LAST_ENDPOINT, ep, &len);
        if (threads) {
            RW_CHECKGOTO(rw_comm_group_create(o->tp, &group, &e), st, out);
            for (int r = 1; r < o->tp; r++) {
                targs[r] = (thread_arg){o, r, zctx, "inproc://rw-peers", group, 1};
                if (pthread_create(&peers.threads[peers.nthreads], NULL, thread_main, &targs[r])) {
                    st = RW_ERR(&e, RW_E_INTERNAL, "cannot start the thread of rank %d", r);
                    goto out;
                }
                peers.nthreads++;
            }
        } else if (o->rank < 0) {
            if (!o->self_exe) {
                st = RW_ERR(&e, RW_E_STATE, "cannot find this executable to start the ranks");
                goto out;
            }
            for (int r = 1; r < o->tp; r++) {
                peers.pids[r] = spawn_rank(o, r, ep);
                if (peers.pids[r] < 0) {
                    st = RW_ERR(&e, RW_E_INTERNAL, "fork for rank %d: %s", r, strerror(errno));
                    goto out;
                }
            }
        }
        if (nccl) RW_CHECKGOTO(rw_comm_nccl_unique_id(nccl_id, &e), st, out);
        RW_LOGI("rank 0: waiting for %d rank(s) at %s", peers.n, ep);
        RW_CHECKGOTO(peers_hello(&peers, nccl ? nccl_id : NULL, o->startup_timeout_s, &e), st, out);
    }
    if (group)
        st = rw_comm_create_thread(group, 0, &comm, &e);
    else if (nccl)
        st = rw_comm_create_nccl(nccl_id, o->tp, 0, rw_dopts_device(o, 0), &comm, &e);
    else
        st = rw_comm_create_single(&comm, &e);
    if (st != RW_OK) goto out;
    RW_CHECKGOTO(rw_rank_open(o, 0, comm, &r0, &e), st, out);
    if (o->tp > 1) RW_CHECKGOTO(peers_ready(&peers, o->startup_timeout_s, &e), st, out);
    rc = rw_server_run(o, r0, zctx, &peers, stop);
    /* destroying a communicator waits for its peers; one of them is gone */
    if (peers.lost) rw_comm_abort(r0->comm);
out:
    if (st != RW_OK) fprintf(stderr, "rw-worker: %s: %s\n", rw_status_str(st), e.msg);
    send_quit(&peers);
    reap(&peers);
    for (int i = 0; i < peers.nthreads; i++)
        if (targs[i + 1].rc != 0 && rc == 0) rc = 1;
    rw_rank_close(r0);
    if (peers.sock) zmq_close(peers.sock);
    rw_comm_group_destroy(group);
    zmq_ctx_term(zctx);
    return rc;
}
