/* rw_client.h - the trainer side of the control protocol (librw_client.so): a client of one
 * worker's control socket with typed calls for the update commands, the checksums a worker
 * reports, the trainer's end of the NCCL weight-update group, the checksums a worker should
 * report for a checkpoint, and the checkpoint push (one update session over ZeroMQ or NCCL).
 *
 * Wire schema: docs/PROTOCOL.md. This header uses only plain C types (opaque handles, char *,
 * integers, caller-owned buffers) and the manifests of rw_sync.h, so that a ctypes wrapper
 * (python/rw_client) can call it. Conventions as in rw_sync.h. */
#ifndef RW_CLIENT_H
#define RW_CLIENT_H

#include "rw_sync.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct rw_client rw_client;
/* Connects a DEALER socket to a worker's control address (e.g. "tcp://127.0.0.1:5557"). `zctx`
 * may be NULL (a context of its own). Connecting does not wait for the peer. */
rw_status rw_client_connect(const char *addr, void *zctx, rw_client **out, rw_err *err);
void rw_client_close(rw_client *c);
/* Whether anything listens at `addr` (ZeroMQ connects lazily and would wait in silence):
 * tcp:// tries a TCP connection for at most timeout_ms, ipc:// looks for the socket file;
 * other transports are assumed up. RW_E_ZMQ with a message that names the address and the
 * reason (refused, timed out, no such file) otherwise. (probe.c) */
rw_status rw_client_probe(const char *addr, int timeout_ms, rw_err *err);
/* The detailed message of the last failed call on this handle ("" after a success). */
const char *rw_client_last_error(const rw_client *c);
/* Authentication for workers that require a shared token (a control socket bound to a
 * non-loopback address; docs/OPERATIONS.md): every request sent from now on carries
 * args.auth = token, unless its args already hold an "auth" field. rw_client_connect takes the
 * token from the environment variable RW_AUTH_TOKEN when it is set. NULL or "" stops sending
 * one. The token is copied. */
rw_status rw_client_set_auth(rw_client *c, const char *token, rw_err *err);

/* Update sessions belong to the client that opened them (protocol 2): the client keeps the
 * session token of its last begin_update reply and adds it as args.session to update_weights,
 * update_weights_from_disk, commit_update and abort_update (unless the args hold "session"
 * already), so callers need not handle it. rw_client_session gives it ("" before any session;
 * borrowed); rw_client_set_session sets it (a token from elsewhere: another process that began
 * the session; NULL or "" clears it). The begin_update reply's max_frame_bytes is kept too: a
 * data frame larger than that is refused with RW_E_RANGE before it is sent (the worker would drop
 * the connection and the reply would never come). */
const char *rw_client_session(const rw_client *c);
rw_status rw_client_set_session(rw_client *c, const char *token, rw_err *err);

/* Sends any command: `args_json` is a JSON object (NULL: {}), `frames` optional data frames
 * (borrowed: copied before the call returns). `*id` gets the request id. */
rw_status rw_client_send_json(rw_client *c, const char *cmd, const char *args_json,
                              const void *const *frames, const size_t *frame_lens, size_t nframes,
                              uint64_t *id, rw_err *err);
/* Waits for the reply to `id` (replies to other ids are kept for their own wait). On an error
 * reply returns its status with its message in err. `result_json` (may be NULL) gets the result
 * as JSON text (free with rw_client_free); `frame` (may be NULL) the reply's data frame (free
 * with rw_client_free). RW_E_TIMEOUT after timeout_ms (for each message). A generate result that
 * came in parts (docs/PROTOCOL.md 4.1: `more: true`) is waited for whole and returned joined, as
 * the one-message result it stands for. A reply this side cannot decode (too large, corrupt) is
 * that request's error (its status, e.g. RW_E_RANGE), never a timeout. */
rw_status rw_client_wait_json(rw_client *c, uint64_t id, int timeout_ms, char **result_json,
                              void **frame, size_t *frame_len, rw_err *err);
/* send + wait. */
rw_status rw_client_call_json(rw_client *c, const char *cmd, const char *args_json, int timeout_ms,
                              char **result_json, rw_err *err);
void rw_client_free(void *p);

/* The same with msgpack: write the args value into `args` (a writer from rw_mw_create; may be
 * NULL for {}), then send. The reply is decoded into rep/msg (free msg with rw_msg_free); the
 * parts of a generate result come one by one (wait again while result.more is true). */
rw_status rw_client_send(rw_client *c, const char *cmd, rw_mw *args, const void *frame,
                         size_t frame_len, bool zero_copy, uint64_t *id, rw_err *err);
rw_status rw_client_wait(rw_client *c, uint64_t id, int timeout_ms, rw_msg **msg, rw_reply *rep,
                         void **frame, size_t *frame_len, rw_err *err);

/* Rollouts (docs/PROTOCOL.md 4.1 generate, 4.9 score): sends the command with its JSON
 * arguments and waits for its final reply (a streaming generate's partial replies are skipped):
 * result_json (free with rw_client_free) and the reply's data frame (routed experts; NULL when
 * none; free with rw_client_free). */
rw_status rw_client_generate(rw_client *c, const char *args_json, int timeout_ms,
                             char **result_json, void **frame, size_t *frame_len, rw_err *err);
rw_status rw_client_score(rw_client *c, const char *args_json, int timeout_ms, char **result_json,
                          void **frame, size_t *frame_len, rw_err *err);
/* Output i's routed experts inside the frame of a generate / score reply (borrowed from frame):
 * ids [tokens, layers, k] of id_bytes each (1: uint8 when the model has <= 256 experts, else 2:
 * uint16, little-endian), weights [tokens, layers, k] fp32 or NULL. RW_E_NOT_FOUND when the
 * output has none; RW_E_PROTOCOL when they lie outside the frame. */
typedef struct rw_client_routes {
    int64_t tokens, layers, k;
    int id_bytes;
    const void *ids;
    const float *weights;
} rw_client_routes;
rw_status rw_client_routes_of(const char *result_json, size_t i, const void *frame,
                              size_t frame_len, rw_client_routes *out, rw_err *err);

/* Typed calls. */
rw_status rw_client_begin_update(rw_client *c, const char *version, bool flush_cache,
                                 uint64_t bucket_bytes, double timeout_s, int timeout_ms,
                                 rw_err *err);
/* Sends one bucket over ZeroMQ without waiting for the reply (rw_client_wait on *id): the manifest
 * in the envelope, `len` bytes at `data` as its frame (len is normally the manifest's byte count),
 * sent zero-copy when asked (then `data` must stay valid until ZeroMQ releases it). */
rw_status rw_client_send_bucket(rw_client *c, const rw_sync_manifest *m, const void *data,
                                size_t len, bool zero_copy, uint64_t *id, rw_err *err);
/* Sends the update_weights request of one bucket that group `group` will broadcast, without
 * waiting for the reply (the worker replies once its receive is posted). The trainer broadcasts
 * separately (rw_client_update_weights_nccl does both for a whole group). */
rw_status rw_client_send_bucket_nccl(rw_client *c, const rw_sync_manifest *m, const char *group,
                                     uint64_t *id, rw_err *err);
/* One bucket over ZeroMQ: the manifest in the envelope, `data` (nbytes) as one frame sent
 * zero-copy (zmq_msg_init_data). Returns after the worker's reply, and once ZeroMQ has
 * released `data` (so the caller may reuse it); if that does not happen within timeout_ms the
 * call fails with RW_E_TIMEOUT and `data` stays owned by the socket until rw_client_close. */
rw_status rw_client_update_weights_zmq(rw_client *c, const rw_sync_manifest *m, const void *data,
                                       int timeout_ms, rw_err *err);
rw_status rw_client_commit_update(rw_client *c, int timeout_ms, char *version, size_t cap,
                                  rw_err *err);
/* `intact` (may be NULL) gets whether the worker kept its previous version. */
rw_status rw_client_abort_update(rw_client *c, int timeout_ms, bool *intact, rw_err *err);
rw_status rw_client_update_from_disk(rw_client *c, const char *dir, const char *version,
                                     int timeout_ms, rw_err *err);
/* version: cap >= RW_SYNC_MAX_VERSION + 1. `state` (may be NULL) gets rw_sync_wstate. */
rw_status rw_client_get_weight_version(rw_client *c, int timeout_ms, char *version, size_t cap,
                                       int *state, rw_err *err);
/* Canonical readback of this worker rank's slice of `name` into dst[cap]; *len gets the byte
 * count (RW_E_RANGE if cap is too small). */
rw_status rw_client_get_weights(rw_client *c, const char *name, int rank, void *dst, size_t cap,
                                size_t *len, int timeout_ms, rw_err *err);

/* Checksums a worker reports, per rank. */
typedef struct rw_client_sums rw_client_sums;
/* names: NULL or n names (NULL: every canonical tensor). */
rw_status rw_client_checksum(rw_client *c, const char *const *names, size_t n, int timeout_ms,
                             rw_client_sums **out, rw_err *err);
void rw_client_sums_free(rw_client_sums *s);
int rw_client_sums_tp(const rw_client_sums *s);
int rw_client_sums_ranks(const rw_client_sums *s);       /* rank entries in the reply */
int rw_client_sums_rank(const rw_client_sums *s, int i); /* rank of entry i */
size_t rw_client_sums_count(const rw_client_sums *s, int i);
/* Name and value of checksum j of rank entry i (name borrowed). */
const char *rw_client_sums_at(const rw_client_sums *s, int i, size_t j, uint64_t *value);
/* Looks a name up in rank entry i: RW_E_NOT_FOUND when absent. */
rw_status rw_client_sums_find(const rw_client_sums *s, int i, const char *name, uint64_t *value,
                              rw_err *err);

/* NCCL from the trainer (rank 0 of the group). Each worker w joins at rank offset
 * 1 + sum of worker_ranks[0..w), with worker_ranks[w] of its ranks (its TP degree). The command
 * goes to every worker first, then the trainer joins; returns when all have joined. */
typedef struct rw_client_group rw_client_group;
rw_status rw_client_group_create(rw_client *const *workers, const int *worker_ranks, int n,
                                 const char *name, int device, double timeout_s,
                                 rw_client_group **out, rw_err *err);
void rw_client_group_destroy(rw_client_group *g);
/* One bucket over NCCL: update_weights goes to every worker; after every worker accepted the
 * manifest (its receive is posted) the trainer broadcasts `dev_data` (device memory on the
 * group's device) on `stream` (a cudaStream_t; NULL: the group's own). Returns once the
 * broadcast is enqueued; rw_client_group_sync waits for it. */
rw_status rw_client_update_weights_nccl(rw_client_group *g, const rw_sync_manifest *m,
                                        const void *dev_data, void *stream, int timeout_ms,
                                        rw_err *err);
/* Waits for the trainer's enqueued broadcasts (bounded; aborts the communicator on timeout). */
rw_status rw_client_group_sync(rw_client_group *g, void *stream, double timeout_s, rw_err *err);
/* A raw broadcast of the same bytes without any protocol (the ceiling the benchmarks compare
 * to); the workers must post the matching receive (rw_sync_group_bcast). */
rw_sync_group *rw_client_group_comm(rw_client_group *g);

/* ------------------------------------------------------------------------------------------ */
/* Trainer side: expected checksums and checkpoint push                                        */
/* ------------------------------------------------------------------------------------------ */
/* The checksum a worker rank (tp, rank) reports for canonical tensor `name` whose full canonical
 * bytes (bf16) are `src`: the rank's slice (rw_moe_plan_tensor; unpadded), quantized with the
 * worker's format when `cfg` quantizes that layer (mxfp8; `.weight_scale_inv` names give the
 * scale's checksum), hashed with rw_checksum64 (seed 0). fp8-block layers: RW_E_UNSUPPORTED. */
rw_status rw_sync_expected_checksum(const rw_config *cfg, int tp, int rank, const char *name,
                                    const void *src, rw_dtype src_dtype, uint64_t *out,
                                    rw_err *err);

typedef struct rw_push_opts {
    const char *transport; /* "zmq" (default) or "nccl" */
    int trainer_tp;        /* K >= 1: emulate Megatron shards (see rw-trainer) */
    uint64_t bucket_bytes; /* bytes per bucket; 0: 512 MiB. A piece larger than this goes as
                              several (rows along dim 0, or sub-ranges of its shard range) */
    const char *version;   /* NULL: "push-<time>" */
    const char *only;      /* POSIX extended regex on names, or NULL */
    bool flush_cache;
    bool verify;          /* compare worker checksums with expected ones after commit */
    int timeout_ms;       /* per reply; 0: 60000 */
    int device;           /* nccl: the trainer's CUDA device */
    int nccl_world_extra; /* unused; 0 */
} rw_push_opts;

typedef struct rw_push_summary {
    uint64_t bytes, tensors, pieces, buckets;
    double seconds, gbps; /* begin -> commit reply */
    char version[RW_SYNC_MAX_VERSION + 1];
    bool verified; /* checksums were compared */
    uint64_t checked, mismatches;
    char first_mismatch[RW_SYNC_MAX_NAME + 64];
} rw_push_summary;

/* Pushes the checkpoint at model_dir to n workers as one update session: begin, buckets (over
 * ZeroMQ, or NCCL through `group`), commit; then verifies checksums when asked. `worker_ranks`
 * (per worker TP degree) may be NULL for all-1. On any failure the session is aborted on every
 * worker. */
rw_status rw_sync_push_ckpt(rw_client *const *workers, int n, rw_client_group *group,
                            const char *model_dir, const rw_push_opts *o, rw_push_summary *out,
                            rw_err *err);
/* Checks worker checksums against the checkpoint (names selected by `only`). */
rw_status rw_sync_verify_ckpt(rw_client *const *workers, int n, const char *model_dir,
                              const char *only, int timeout_ms, uint64_t *checked,
                              uint64_t *mismatches, char *first_mismatch, size_t cap, rw_err *err);

#ifdef __cplusplus
}
#endif

#endif /* RW_CLIENT_H */
