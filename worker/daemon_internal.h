/* daemon_internal.h - internals of the rw-worker daemon shared by daemon.c (options, rank
 * setup, entry), launch.c (rank processes and threads, the rank rendezvous), daemon_rank.c (what
 * every rank executes, the follower loop) and server.c (rank 0's control server). Not part of
 * any public contract.
 *
 * Rank model: rank 0 owns the control ROUTER socket and a second ROUTER socket ("peer socket")
 * to which every other rank (a "follower") connects with a DEALER whose routing id is "rank<R>".
 * Rank 0 turns each client command into an ordered stream of rank operations (ops) and sends the
 * same stream to every follower, so every rank's engine sees the same calls in the same order and
 * therefore schedules the same batches (the engine is deterministic in its calls). Engine steps
 * are ops too: a follower steps exactly when rank 0 does, which is what the tensor-parallel
 * collectives inside a step require.
 */
#ifndef RW_WORKER_DAEMON_INTERNAL_H
#define RW_WORKER_DAEMON_INTERNAL_H

#include <pthread.h>
#include <signal.h>
#include <sys/types.h>

#include "daemon.h"
#include "rw_sync.h"
#include "rw_worker.h"

#ifdef __cplusplus
extern "C" {
#endif

#define RW_DAEMON_DEFAULT_CONTROL "tcp://127.0.0.1:5557"
#define RW_DAEMON_MAX_TP 64

/* ------------------------------------------------------------------------------------------ */
/* Options                                                                                      */
/* ------------------------------------------------------------------------------------------ */
typedef struct rw_dopts {
    const char *model_dir;   /* --model DIR (config.json + safetensors) */
    const char *config_path; /* --config FILE */
    bool random_weights;     /* --random-weights: seeded random bf16 (with --config) */
    uint64_t seed;           /* --seed (weights) */
    int tp;                  /* --tp N */
    int rank;                /* --rank R; -1 when this process launches the ranks itself */
    const char *peer;        /* --peer ADDR: rank rendezvous (rank 0 binds, others connect) */
    const char *control;     /* --control ADDR */
    const char *auth_token;  /* --auth-token T (or RW_AUTH_TOKEN) */
    rw_backend backend;      /* --device */
    int gpu;                 /* --gpu G: CUDA ordinal of this rank (launcher: of rank 0) */
    bool gpu_given;
    double kv_fraction;       /* --kv-fraction */
    double kv_mb;             /* --kv-mb: KV budget in MiB (0: engine default) */
    int max_batch;            /* --max-batch: requests in the running batch */
    int max_batch_tokens;     /* --max-batch-tokens */
    const char *ready_file;   /* --ready-file PATH: the bound control endpoint is written there */
    double startup_timeout_s; /* --startup-timeout: rendezvous / rank start-up bound */
    double rank_timeout_s;    /* --rank-timeout: bound on a follower's answer to an op */
    const char *self_exe;     /* this executable (launcher mode re-executes it per rank) */
} rw_dopts;

/* Parses argv (after the program name). Returns 0 on success, 2 on a usage error (message
 * printed on stderr). */
int rw_dopts_parse(int argc, char **argv, rw_dopts *o);
/* True for addresses that only local processes can reach (loopback tcp, ipc, inproc). */
bool rw_daemon_addr_is_local(const char *addr);

/* ------------------------------------------------------------------------------------------ */
/* One rank: model, engine and update session                                                  */
/* ------------------------------------------------------------------------------------------ */
typedef struct rw_rank {
    int rank, tp;
    rw_config cfg;
    rw_comm *comm; /* owned */
    rw_model *model;
    rw_engine *eng;
    rw_sync_session *sess;
    char version0[RW_SYNC_MAX_VERSION + 1]; /* tag of the weights loaded at start */
    bool weights_released;                  /* the weight arena's memory is given back */
    bool kv_released;
    rw_mw *w; /* reply writer (sync ops) */
} rw_rank;

/* Loads the config, creates the model on `comm` (ownership passes to the rank, also on
 * failure), loads the weights (checkpoint, random, or none: incomplete until pushed), creates
 * the engine and the update session. */
rw_status rw_rank_open(const rw_dopts *o, int rank, rw_comm *comm, rw_rank **out, rw_err *err);
void rw_rank_close(rw_rank *r);

/* Rank-level actions, run identically on every rank. */
/* Memory flags of OP_MEM. */
#define RW_MEM_RELEASE_WEIGHTS 1u
#define RW_MEM_RELEASE_KV 2u
#define RW_MEM_RESUME_WEIGHTS 4u
#define RW_MEM_RESUME_KV 8u
rw_status rw_rank_memory(rw_rank *r, unsigned flags, rw_err *err);
/* Replaces the update session by a fresh one whose weights are incomplete (after the weight
 * memory was given back and re-taken: the bytes are gone, a full update or reload must follow).
 * The NCCL update group of the old session is destroyed with it. */
rw_status rw_rank_reset_session(rw_rank *r, const char *version, rw_err *err);
/* Runs one sync command (rw_sync_handle) on this rank: the reply goes to r->w, a readback
 * frame to *out. */
rw_status rw_rank_sync(rw_rank *r, const rw_request *req, const rw_sync_frames *in,
                       rw_sync_out_frame *out, rw_err *err);

/* ------------------------------------------------------------------------------------------ */
/* Watchdog (daemon_watch.c)                                                                    */
/* ------------------------------------------------------------------------------------------ */
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

/* ------------------------------------------------------------------------------------------ */
/* Rank operations (rank 0 -> followers)                                                       */
/* ------------------------------------------------------------------------------------------ */
#define RW_OP_MAGIC 0x5057524fu /* "ORWP" little-endian */
#define RW_OP_VERSION 1

typedef enum rw_op {
    RW_OP_HELLO = 1, /* follower -> 0: a = rank, b = tp; 0 -> follower: payload NCCL id */
    RW_OP_READY = 2, /* follower -> 0: status, payload = message */
    RW_OP_STEP = 3,  /* one engine step */
    RW_OP_ADD = 4,   /* a = engine id; payload = msgpack {prompt, sampling} */
    RW_OP_ABORT = 5, /* a = engine id */
    RW_OP_ABORT_ALL = 6,
    RW_OP_PAUSE = 7, /* a = rw_pause_mode */
    RW_OP_RESUME = 8,
    RW_OP_FLUSH = 9,        /* replies */
    RW_OP_MEM = 10,         /* a = RW_MEM_* flags; replies */
    RW_OP_SYNC = 11,        /* payload = request envelope, then its data frames; replies with the
                               reply envelope (+ a readback frame) */
    RW_OP_SET_VERSION = 12, /* a = engine weight version index */
    RW_OP_NEW_SESSION = 13, /* payload = version tag; replies */
    RW_OP_QUIT = 14,
} rw_op;

/* First frame of every rank message. Ranks run the same build, so the struct travels as is. */
typedef struct rw_op_hdr {
    uint32_t magic;
    uint16_t version;
    uint16_t op;
    uint64_t seq; /* rank 0's op counter; a reply carries the seq of its op */
    uint64_t a, b;
    int32_t status; /* replies: rw_status */
    uint32_t flags; /* RW_OPF_* */
} rw_op_hdr;
#define RW_OPF_REPLY 1u /* the follower answers this op */

/* Sends one rank message: header, optional payload, optional extra frames (copied). */
rw_status rw_op_send(void *sock, const void *route, size_t route_len, const rw_op_hdr *h,
                     const void *payload, size_t plen, const rw_sync_frames *frames, rw_err *err);

/* A received rank message: header, payload and frames (owned until rw_op_msg_free). On a ROUTER
 * socket the first frame is the sender's routing id (kept in `route`). */
typedef struct rw_op_msg {
    rw_op_hdr h;
    char route[32];
    size_t route_len;
    int nparts;
    void *parts; /* zmq_msg_t[], payload then frames */
} rw_op_msg;
/* Receives one rank message, waiting up to timeout_ms (-1 forever). `router`: the socket is a
 * ROUTER (routing id first). RW_E_TIMEOUT when none came; RW_E_PROTOCOL for a malformed one
 * (consumed). */
rw_status rw_op_recv(void *sock, bool router, int timeout_ms, rw_op_msg *m, rw_err *err);
void rw_op_msg_free(rw_op_msg *m);
const void *rw_op_payload(const rw_op_msg *m, size_t *len); /* NULL, 0 when absent */
void rw_op_frames(const rw_op_msg *m, rw_sync_frames *out); /* the frames after the payload */
rw_op_hdr rw_op_make(rw_op op, uint64_t seq, uint64_t a, uint64_t b, uint32_t flags);

/* ADD payload: the prompt and sampling parameters as decided by rank 0. */
rw_status rw_op_add_encode(rw_mw *w, const int32_t *prompt, int n, const rw_sampling *sp,
                           rw_err *err);
/* Decodes into a malloc'd prompt (*prompt, free()) and *sp. */
rw_status rw_op_add_decode(const void *buf, size_t len, int32_t **prompt, int *n, rw_sampling *sp,
                           rw_err *err);

/* CUDA ordinal of `rank` under the options (launcher: --gpu + rank; external launcher: --gpu,
 * else rank modulo the device count). */
int rw_dopts_device(const rw_dopts *o, int rank);

/* The follower loop: connects to `peer` in `zctx`, says hello, receives the NCCL id when the
 * backend is CUDA and tp > 1 (`group` is the in-process group of CPU thread ranks, else NULL),
 * opens its rank, reports ready, then executes ops until QUIT. A process follower (stop
 * non-NULL) also ends when a signal set *stop and rank 0 stayed silent for a grace period.
 * Returns the exit status. */
int rw_follower_main(const rw_dopts *o, int rank, void *zctx, const char *peer,
                     rw_comm_group *group, volatile sig_atomic_t *stop);

/* ------------------------------------------------------------------------------------------ */
/* Rank 0                                                                                        */
/* ------------------------------------------------------------------------------------------ */
/* The set of followers seen from rank 0 after the rendezvous. */
typedef struct rw_peers {
    void *sock;                   /* ROUTER the followers are connected to; NULL when tp == 1 */
    int n;                        /* followers (tp - 1) */
    pid_t pids[RW_DAEMON_MAX_TP]; /* launcher mode: the follower processes (0: not ours) */
    pthread_t threads[RW_DAEMON_MAX_TP];
    int nthreads;    /* CPU thread ranks */
    rw_watch *watch; /* rank 0's watchdog while serving (NULL otherwise); gathers end early when
                        it reports a lost rank */
    bool lost;       /* a follower was lost while serving: the communicator is aborted, not
                        destroyed, and the other followers are not waited for long */
} rw_peers;

/* Sends one op to every follower (only_rank < 0) or to follower `only_rank`. */
rw_status rw_peers_send(rw_peers *p, int only_rank, const rw_op_hdr *h, const void *payload,
                        size_t plen, const rw_sync_frames *frames, rw_err *err);
/* Collects the replies to op `seq` from every follower (only_rank < 0) or from `only_rank`
 * into replies[rank] (entries of other ranks are left empty: nparts 0, h.magic 0). Stale
 * replies to older ops are dropped. RW_E_TIMEOUT naming the silent ranks after timeout_s, and
 * RW_E_ABORTED as soon as p->watch reports a lost rank; the replies already received are kept
 * (free them with rw_op_msg_free in every case). */
rw_status rw_peers_gather(rw_peers *p, int only_rank, uint64_t seq, double timeout_s,
                          rw_op_msg *replies, rw_err *err);

/* Rank-0 side of the rendezvous: waits for every follower's hello (sending the NCCL id of the
 * tensor-parallel communicator when `nccl_id` is non-NULL), then, after rank 0 opened its own
 * rank, for every follower's ready. */
rw_status rw_peers_hello(rw_peers *p, int tp, const uint8_t *nccl_id, double timeout_s,
                         rw_err *err);
rw_status rw_peers_ready(rw_peers *p, double timeout_s, rw_err *err);

/* Serves the control socket until shutdown. `stop` is set by the signal handler. Returns the
 * exit status. */
int rw_server_run(const rw_dopts *o, rw_rank *r0, void *zctx, rw_peers *peers,
                  volatile sig_atomic_t *stop);

/* Launcher (launch.c): starts the other ranks of `o` (threads for the CPU backend, processes
 * of self_exe for CUDA), runs rank 0 in this thread, and reaps them. Returns the exit status. */
int rw_launch_main(const rw_dopts *o, volatile sig_atomic_t *stop);

#ifdef __cplusplus
}
#endif

#endif
