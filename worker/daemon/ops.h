/* ops.h - rank operations (ops.c): the ordered stream of operations rank 0 sends every other
 * rank (a "follower"), their framing on the op socket, and rank 0's side of sending them and
 * gathering the answers.
 *
 * Rank model: rank 0 owns the control ROUTER socket and a second ROUTER socket ("peer socket")
 * to which every follower connects with a DEALER whose routing id is "rank<R>". Rank 0 turns each
 * client command into an ordered stream of rank operations (ops) and sends the same stream to
 * every follower, so every rank's engine sees the same calls in the same order and therefore
 * schedules the same batches (the engine is deterministic in its calls). Engine steps are ops
 * too: a follower steps exactly when rank 0 does, which is what the tensor-parallel collectives
 * inside a step require. */
#ifndef RW_DAEMON_OPS_H
#define RW_DAEMON_OPS_H

#include <pthread.h>
#include <sys/types.h>

#include "options.h"
#include "rw_msg.h"
#include "rw_worker.h"
#include "watch.h"

#ifdef __cplusplus
extern "C" {
#endif

#define RW_OP_MAGIC 0x5057524fu /* "ORWP" little-endian */
#define RW_OP_VERSION 1

typedef enum rw_op {
    RW_OP_HELLO = 1, /* follower -> 0: a = rank, b = tp; 0 -> follower: payload NCCL id */
    RW_OP_READY = 2, /* follower -> 0: status, payload = message */
    RW_OP_STEP = 3,  /* one engine step */
    RW_OP_ADD = 4,   /* a = engine id; payload = msgpack [prompt, sampling, request options] */
    RW_OP_ABORT = 5, /* a = engine id */
    RW_OP_ABORT_ALL = 6,
    RW_OP_PAUSE = 7, /* a = rw_pause_mode */
    RW_OP_RESUME = 8,
    RW_OP_FLUSH = 9,        /* replies */
    RW_OP_MEM = 10,         /* a = RW_MEM_* flags; replies */
    RW_OP_SYNC = 11,        /* payload = the client's request envelope as it came, then its data
                               frames; a = RW_OPK_* fields the follower takes out of its args;
                               replies with the reply envelope (+ a readback frame) */
    RW_OP_SET_VERSION = 12, /* a = engine weight version index */
    RW_OP_NEW_SESSION = 13, /* payload = version tag; replies */
    RW_OP_QUIT = 14,
    RW_OP_SETTLE = 15, /* abort an open update session; replies with a = rw_sync_wstate */
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
/* The same with the request's options (rw_engine_add_ex; NULL when encoding: none). */
rw_status rw_op_add_ex_encode(rw_mw *w, const int32_t *prompt, int n, const rw_sampling *sp,
                              const rw_request_opts *ro, rw_err *err);
rw_status rw_op_add_ex_decode(const void *buf, size_t len, int32_t **prompt, int *n,
                              rw_sampling *sp, rw_request_opts *ro, rw_err *err);

/* Fields of a client request's args that the daemon reads itself and a sync handler must not
 * see: rank 0 takes them out of its own view of the request (rw_request_take_args) and relays the
 * request as it came, with RW_OP_SYNC's `a` naming the ones each follower takes out too. */
#define RW_OPK_AUTH 1u       /* "auth": the token (checked by rank 0) */
#define RW_OPK_PAUSE_MODE 2u /* "pause_mode" of begin_update / update_weights_from_disk */
#define RW_OPK_RANK 4u       /* "rank" of get_weights */
/* The field names of `mask` into keys[3]; returns how many. */
size_t rw_op_keys(uint64_t mask, const char **keys);

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

#ifdef __cplusplus
}
#endif

#endif
