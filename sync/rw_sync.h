/* rw_sync.h - the sync module's public contract, worker side: bucket manifests, the transports
 * (ZeroMQ frames, safetensors on disk, NCCL broadcast) behind one byte-source interface, the NCCL
 * weight-update group, the update session (begin -> buckets -> commit | abort) with its
 * invariants, the checkpoint cutter (disk loads in pieces), the handlers of the sync commands
 * with their typed outcome, and a minimal server for them. The trainer side is
 * client/rw_client.h; the message layer every command uses is rw_msg.h.
 *
 * Wire schema and requirements: docs/PROTOCOL.md. What an update writes: docs/LAYOUT.md
 * (through rw_wset_validate_piece / rw_wset_apply of moe/).
 *
 * Conventions: every fallible function returns rw_status and takes `rw_err *` last;
 * destroy(NULL) is a no-op; ownership of every pointer is stated beside it. */
#ifndef RW_SYNC_H
#define RW_SYNC_H

#include "rw_core.h"
#include "rw_moe.h"
#include "rw_msg.h"

#ifdef __cplusplus
extern "C" {
#endif

#define RW_SYNC_MAX_VERSION 127 /* weight version tag length */
/* A version tag: 1..RW_SYNC_MAX_VERSION printable ASCII characters. */
rw_status rw_sync_check_version_tag(const char *v, rw_err *err);

/* ------------------------------------------------------------------------------------------ */
/* Bucket manifests                                                                             */
/* ------------------------------------------------------------------------------------------ */
#define RW_SYNC_MAX_NAME 256
#define RW_SYNC_ALIGN 256         /* rw_sync_manifest_add aligns tensor offsets to this */
#define RW_SYNC_MAX_TENSORS 65536 /* tensors in one bucket */
#define RW_SYNC_DEFAULT_BUCKET (512ull << 20)

/* One tensor (or shard of one) in a bucket. */
typedef struct rw_sync_tensor {
    char name[RW_SYNC_MAX_NAME]; /* canonical name */
    rw_dtype dtype;
    int ndim;
    int64_t shape[RW_MAX_DIMS]; /* FULL canonical shape of the tensor */
    int shard_dim;              /* -1: the piece is the whole tensor */
    int64_t shard_begin, shard_len;
    rw_piece_layout layout; /* RW_PIECE_GATE_UP: Megatron fused gate_up shard, see rw_moe.h */
    uint64_t offset;        /* byte offset of the piece within the bucket */
    uint64_t nbytes;        /* byte count of the piece */
} rw_sync_tensor;

typedef struct rw_sync_manifest rw_sync_manifest;
rw_status rw_sync_manifest_create(rw_sync_manifest **out, rw_err *err);
void rw_sync_manifest_destroy(rw_sync_manifest *m);
void rw_sync_manifest_clear(rw_sync_manifest *m);
size_t rw_sync_manifest_count(const rw_sync_manifest *m);
const rw_sync_tensor *rw_sync_manifest_at(const rw_sync_manifest *m, size_t i);
/* Bucket size: the end of the last tensor (after rw_sync_manifest_add), or as decoded. */
uint64_t rw_sync_manifest_bytes(const rw_sync_manifest *m);
void rw_sync_manifest_set_bytes(rw_sync_manifest *m, uint64_t bucket_bytes);
/* Appends a piece at the next RW_SYNC_ALIGN-aligned offset; computes nbytes from the shape
 * (the shard dim counts shard_len; 2 * shard_len for RW_PIECE_GATE_UP). `*offset` (may be NULL)
 * gets its byte offset. The bucket size grows to its end. */
rw_status rw_sync_manifest_add(rw_sync_manifest *m, const char *name, rw_dtype dtype, int ndim,
                               const int64_t *shape, int shard_dim, int64_t shard_begin,
                               int64_t shard_len, rw_piece_layout layout, uint64_t *offset,
                               rw_err *err);
/* Appends an entry exactly as given (offset and nbytes included); no checks (tests, relays). */
rw_status rw_sync_manifest_push(rw_sync_manifest *m, const rw_sync_tensor *t, rw_err *err);
/* Byte count a piece must have: dims x dtype size, with the shard rule above. 0 if invalid. */
uint64_t rw_sync_piece_bytes(const rw_sync_tensor *t);
/* Structural checks, before the model is consulted: names non-empty and printable, dtype known,
 * 1 <= ndim <= RW_MAX_DIMS, every dim >= 1, shard dim/range inside the shape, nbytes equal to
 * rw_sync_piece_bytes, offset aligned to the dtype size, every range inside the bucket, no two
 * ranges overlapping, no two pieces of one tensor overlapping. Errors name the tensor. */
rw_status rw_sync_manifest_check(const rw_sync_manifest *m, rw_err *err);
/* Wire form: {nbytes: u64, tensors: [{name, dtype, shape, offset, nbytes[, shard: {dim, begin,
 * len}][, layout: "gate_up"]}...]} as one map value. */
void rw_sync_manifest_write(const rw_sync_manifest *m, rw_mw *w);
/* Decodes the wire form (as written above; `what` names it in errors) and runs
 * rw_sync_manifest_check. `m` is cleared first. */
rw_status rw_sync_manifest_read(const rw_mobj *o, const char *what, rw_sync_manifest *m,
                                rw_err *err);
/* The piece of entry `t` over bucket bytes at `base` (rw_piece borrows t->name). */
rw_piece rw_sync_tensor_piece(const rw_sync_tensor *t, const void *base, rw_place place);

/* ------------------------------------------------------------------------------------------ */
/* Byte sources: what a transport hands the apply path for one bucket (style.md's rio).         */
/* ------------------------------------------------------------------------------------------ */
/* How a source delivers its bytes; the apply path picks its route by the kind. Every source
 * implements `read` (memcpy / pread / broadcast). */
typedef enum rw_sync_source_kind {
    RW_SYNC_SRC_HOST = 1, /* the bytes are in host memory at `host` (a ZeroMQ frame) */
    RW_SYNC_SRC_FILE = 2, /* `read_at` copies byte ranges of them to the host on request (a file
                             of the disk transport, read with pread so that a file that shrinks
                             gives an error, not a signal) */
    RW_SYNC_SRC_NCCL = 3, /* only `read` delivers them, into a device buffer on a stream (NCCL
                             broadcast into device staging) */
} rw_sync_source_kind;

typedef struct rw_sync_source rw_sync_source;
struct rw_sync_source {
    rw_sync_source_kind kind;
    const char *name; /* "zmq", "disk", "nccl", "mem" */
    const void *host; /* RW_SYNC_SRC_HOST: the bytes (borrowed; valid while the source is) */
    uint64_t nbytes;  /* bytes available (a host frame's length); checked against the manifest */
    /* Writes the first `nbytes` bytes of the bucket to dst (host or device) on `s` (async when a
     * device is involved). */
    rw_status (*read)(rw_sync_source *src, void *dst, rw_place place, uint64_t nbytes, rw_stream s,
                      rw_err *err);
    void *ctx;
    /* RW_SYNC_SRC_FILE: copies bytes [off, off + len) of the bucket to host memory at dst and
     * returns once they are there. Thread-safe: several threads may read disjoint ranges at
     * once. NULL for the other kinds. */
    rw_status (*read_at)(const rw_sync_source *src, void *dst, uint64_t off, size_t len,
                         rw_err *err);
    uint64_t base; /* RW_SYNC_SRC_FILE: where the bucket starts in what ctx reads */
};
/* A source over host bytes (borrowed). `name` is a static string. */
rw_sync_source rw_sync_source_host(const char *name, const void *bytes, uint64_t nbytes);
/* A "disk" source over data-section bytes [begin, begin + nbytes) of a safetensors file (borrowed;
 * must outlive the source): `read_at` and `read` (host destinations, or device ones through a
 * host buffer) use rw_st_read, never the mapping; `host` is NULL. */
rw_sync_source rw_sync_source_file(const rw_st_file *f, uint64_t begin, uint64_t nbytes);
/* The disk transport's bucket: entries e[0..n) of safetensors file `f` in increasing offset order
 * (whole tensors) become a manifest with offsets relative to e[0]->begin (m is cleared first) and
 * a file source (rw_sync_source_file) over that byte range. Every tensor must sit at an offset
 * aligned to its dtype size relative to e[0]. */
rw_status rw_sync_bucket_from_entries(const rw_st_file *f, const rw_st_entry *const *e, size_t n,
                                      rw_sync_manifest *m, rw_sync_source *src, rw_err *err);

/* ------------------------------------------------------------------------------------------ */
/* NCCL weight-update group (both sides). Available only in CUDA builds; elsewhere every call  */
/* reports RW_E_NO_DEVICE.                                                                      */
/* ------------------------------------------------------------------------------------------ */
typedef struct rw_sync_group rw_sync_group;
/* A fresh unique id (trainer side, rank 0). */
rw_status rw_sync_group_unique_id(uint8_t id[RW_NCCL_ID_BYTES], rw_err *err);
/* Joins the group as `rank` of `world` on CUDA device `device` with a non-blocking communicator
 * (NCCL_NVLS stays as the environment sets it; the project never enables it). Waits up to
 * timeout_s for every rank to join, polling ncclCommGetAsyncError; then every rank runs the
 * group's first collectives (broadcasts from rank 0 of 16 bytes and of 8 MiB, checked), which
 * connect the channels, within max(timeout_s, 60 s). Collective: every rank of the group must
 * call this at the same time (from its own thread or process). Afterwards rw_sync_group_bcast
 * only enqueues locally and never waits for a peer. On timeout or error the communicator is
 * aborted and RW_E_TIMEOUT / RW_E_NCCL is returned naming the group. `device` is current on the
 * calling thread afterwards (so is the group's device after bcast / wait). */
rw_status rw_sync_group_create(const uint8_t id[RW_NCCL_ID_BYTES], int world, int rank,
                               const char *name, int device, double timeout_s, rw_sync_group **out,
                               rw_err *err);
/* Aborts a live communicator (ncclCommAbort) and frees. NULL is a no-op. */
void rw_sync_group_destroy(rw_sync_group *g);
const char *rw_sync_group_name(const rw_sync_group *g);
int rw_sync_group_rank(const rw_sync_group *g);
int rw_sync_group_world(const rw_sync_group *g);
int rw_sync_group_device(const rw_sync_group *g);
bool rw_sync_group_ok(const rw_sync_group *g); /* false once aborted or failed */
/* Enqueues one broadcast from rank 0 of `nbytes` at `buf` (device memory on the group's device)
 * on stream `s` (a stream of the group's device; NULL: the group's own). Returns once enqueued
 * (bounded by the create timeout; the enqueue needs no peer); completion is observed through
 * rw_sync_group_wait or an event on `s`. Ranks may call it in any order: the receive may be
 * posted before or after rank 0 broadcasts. */
rw_status rw_sync_group_bcast(rw_sync_group *g, void *buf, uint64_t nbytes, rw_stream s,
                              rw_err *err);
/* Waits until all work enqueued on `s` is done, up to timeout_s, polling the communicator's
 * async error; on timeout or error the communicator is aborted (the group must be re-created). */
rw_status rw_sync_group_wait(rw_sync_group *g, rw_stream s, double timeout_s, rw_err *err);
/* A source whose `read` receives the bucket by broadcast from rank 0. */
rw_sync_source rw_sync_source_nccl(rw_sync_group *g, uint64_t nbytes);
/* The group's own stream (a cudaStream_t) used when callers pass none. */
void *rw_sync_group_stream(rw_sync_group *g);
/* Checks an NCCL-related error state without waiting: RW_OK, or RW_E_NCCL after an async
 * error (then the communicator is aborted). */
rw_status rw_sync_group_check(rw_sync_group *g, rw_err *err);
/* Aborts the communicator now (a wait elsewhere timed out). */
void rw_sync_group_abort(rw_sync_group *g);

/* ------------------------------------------------------------------------------------------ */
/* Update session: one per worker rank, bound to its weight set for its lifetime.              */
/* ------------------------------------------------------------------------------------------ */
/* States the weights can be in (what generation may rely on). */
typedef enum rw_sync_wstate {
    RW_SYNC_READY = 0,      /* complete weights of `version` */
    RW_SYNC_UPDATING = 1,   /* a session is open: generation must be paused */
    RW_SYNC_INCOMPLETE = 2, /* a failed / aborted session wrote some bytes: refuse generate */
} rw_sync_wstate;
const char *rw_sync_wstate_str(rw_sync_wstate s);

typedef struct rw_sync_session rw_sync_session;

typedef struct rw_sync_info {
    rw_sync_wstate state;
    char version[RW_SYNC_MAX_VERSION + 1];     /* current (READY) or last complete version */
    char new_version[RW_SYNC_MAX_VERSION + 1]; /* while UPDATING */
    bool flush_cache;                          /* requested by the open / last committed session */
    uint64_t sessions_committed, sessions_aborted;
    uint64_t buckets, bytes; /* of the open session, or the last finished one */
    double last_update_s;    /* duration (begin -> commit) of the last committed update */
    double last_update_gbps; /* bytes / duration of the last committed update */
    double last_commit_time; /* rw_now() at the last commit (0 if none) */
    size_t staging_bytes;    /* device staging held now (2 buffers) */
    double session_s;        /* seconds the open session has been open, else how long the last
                                one lasted (committed or not) */
    bool has_group;          /* an NCCL update group is live */
    char group[64];
} rw_sync_info;

/* Binds a session to `ws` (borrowed; must outlive the session). `version` tags the weights the
 * set holds now (e.g. "random" or "disk:<dir>"); `incomplete` says they are not usable yet. */
rw_status rw_sync_session_create(rw_wset *ws, const char *version, bool incomplete,
                                 rw_sync_session **out, rw_err *err);
/* Aborts an open session and destroys the group and staging. NULL is a no-op. */
void rw_sync_session_destroy(rw_sync_session *s);
rw_wset *rw_sync_session_wset(rw_sync_session *s);
/* Thread-safe snapshot (generation threads may call it while the control thread updates). */
void rw_sync_session_info(const rw_sync_session *s, rw_sync_info *out);
/* Thread-safe: RW_OK when generation may run; RW_E_BUSY while a session is open;
 * RW_E_WEIGHTS_INCOMPLETE after a session left weights partly written. `version` (may be NULL,
 * cap >= RW_SYNC_MAX_VERSION + 1) gets the serving version. */
rw_status rw_sync_session_ready(const rw_sync_session *s, char *version, size_t cap, rw_err *err);

typedef struct rw_sync_begin_args {
    const char *version;   /* the tag of the new weights: 1..RW_SYNC_MAX_VERSION printable chars */
    bool flush_cache;      /* the daemon flushes prefix / KV caches at commit */
    uint64_t bucket_bytes; /* largest bucket the trainer sends (device staging size); 0: 512 MiB */
    double timeout_s;      /* bound on every wait, and idle time before the session is aborted;
                              0: 300 s */
} rw_sync_begin_args;

/* Opens a session. RW_E_STATE when one is open already. Device weight sets allocate two staging
 * buffers of bucket_bytes here (kept between sessions; freed by rw_sync_session_release). */
rw_status rw_sync_session_begin(rw_sync_session *s, const rw_sync_begin_args *a, rw_err *err);

/* What one bucket did. */
typedef struct rw_sync_bucket_result {
    uint64_t index; /* bucket number within the session, from 0 */
    uint64_t tensors, bytes;
    bool applied; /* written already (host), or still in flight on the device streams */
} rw_sync_bucket_result;

/* Applies one bucket: validates the whole manifest against the model (rw_sync_manifest_check,
 * the source's byte count, then rw_wset_validate_piece for every entry) before anything is
 * written; then delivers the bytes and applies each piece. Device weight sets pipeline: the
 * bytes go to one of two staging buffers on the comm stream while the previous bucket is
 * applied on the compute stream (CUDA events order them); at most two buckets are in flight.
 * A host source or a file source (disk) reaches device staging through pinned chunks that a few
 * threads fill (memcpy, or read_at of one share each; RW_SYNC_COPY_THREADS, default up to 8)
 * while earlier chunks are copied to the device; its bytes are no longer read once this returns.
 * Host weight sets apply straight from a host source's bytes (no copy), or from a host buffer of
 * the session that a file source's read_at fills first (a read error then fails the bucket
 * before it writes anything); an NCCL source needs a device weight set.
 * Any failure ends (aborts) the session: the error message says whether the previous version is
 * intact (nothing written yet) or the weights are now incomplete. RW_E_STATE when no session
 * is open. */
rw_status rw_sync_session_apply(rw_sync_session *s, const rw_sync_manifest *m, rw_sync_source *src,
                                rw_sync_bucket_result *out, rw_err *err);
typedef struct rw_sync_commit_result {
    char version[RW_SYNC_MAX_VERSION + 1];
    bool flush_cache;
    uint64_t buckets, bytes;
    double seconds; /* begin -> weights ready */
} rw_sync_commit_result;
/* Waits (bounded) for every in-flight bucket, checks for device / NCCL errors, requires complete
 * weights when the session started from incomplete ones (rw_wset_complete names a missing
 * tensor otherwise), then sets the new version: from generation's point of view the switch is
 * atomic (rw_sync_session_ready never reports a mix). On failure the session is aborted as in
 * rw_sync_session_apply. */
rw_status rw_sync_session_commit(rw_sync_session *s, rw_sync_commit_result *out, rw_err *err);
/* Session ownership (protocol 2): every session opened by rw_sync_session_begin draws a token
 * of RW_SYNC_TOKEN_LEN lowercase hex digits (128 random bits from getrandom) that begin_update
 * returns to the client that opened it; update_weights, update_weights_from_disk inside the
 * session, commit_update and abort_update must carry it as args.session (rw_sync_check_owner),
 * so no other client can write into, commit or abort that session. The in-process calls below do
 * not check it: ownership is a property of the protocol, checked where requests come in. */
#define RW_SYNC_TOKEN_LEN 32
/* The open session's token ("" when none is open). Borrowed until the next begin. */
const char *rw_sync_session_token(const rw_sync_session *s);
/* Whether rw_sync_check_owner checks this session's token (default true). A worker's follower
 * ranks turn it off: rank 0 checked the request before relaying it, and each rank's session draws
 * its own token. */
void rw_sync_session_set_owner_check(rw_sync_session *s, bool on);
/* The largest data frame the server in front of this session reads (0: not known; the daemon
 * sets its --max-frame-bytes): begin_update reports it as max_frame_bytes, so that a client
 * refuses a ZeroMQ bucket larger than that instead of sending a frame the socket drops. */
void rw_sync_session_set_frame_limit(rw_sync_session *s, uint64_t bytes);
/* Ends the open session without a new version. `*intact` gets true when nothing was written (the
 * previous version still serves), false when the weights are now incomplete. RW_E_STATE when no
 * session is open. */
rw_status rw_sync_session_abort(rw_sync_session *s, bool *intact, rw_err *err);
/* Call periodically from the control loop (every ~100 ms): aborts a session idle for longer
 * than its timeout, and one whose device / NCCL work is stuck past it (the communicator is
 * aborted too). Returns RW_E_TIMEOUT / RW_E_NCCL describing what it aborted, RW_OK otherwise. */
rw_status rw_sync_session_poll(rw_sync_session *s, rw_err *err);
/* Frees the device staging buffers and the pinned host chunks (release_memory); RW_E_STATE while
 * a session is open. */
rw_status rw_sync_session_release(rw_sync_session *s, rw_err *err);

/* The NCCL group of this rank: joined for init_weights_update_group (replacing an older one).
 * `rank` is the rank of this worker rank in the group (rank offset + local rank). */
rw_status rw_sync_session_init_group(rw_sync_session *s, const uint8_t id[RW_NCCL_ID_BYTES],
                                     int world, int rank, const char *name, double timeout_s,
                                     rw_err *err);
rw_sync_group *rw_sync_session_group(rw_sync_session *s, const char *name);

/* Where an update session's control thread is and what its buckets cost on the host: progress
 * lines, watchdogs and metrics read it from another thread (rw_sync_session_stats). */
typedef enum rw_sync_phase {
    RW_SYNC_PH_IDLE = 0,
    RW_SYNC_PH_VALIDATE = 1, /* manifest and pieces against the model */
    RW_SYNC_PH_WAIT = 2,     /* for the bucket NFLIGHT before (its record is reused) */
    RW_SYNC_PH_PREPARE = 3,  /* ops and op table on the host */
    RW_SYNC_PH_BUFFERS = 4,  /* growing a record's op table buffers */
    RW_SYNC_PH_RECV = 5,     /* posting the receive (NCCL enqueue / host upload) */
    RW_SYNC_PH_LAUNCH = 6,   /* table copy and kernel launches */
    RW_SYNC_PH_DEFERRED = 7, /* applying a deferred bucket */
    RW_SYNC_PH_COMMIT = 8,   /* commit: waiting for the buckets in flight */
} rw_sync_phase;
const char *rw_sync_phase_str(rw_sync_phase p);

typedef struct rw_sync_sstats {
    rw_sync_phase phase;
    double phase_since;                 /* rw_now() when the phase began */
    uint64_t bucket;                    /* index of the bucket being handled (or last handled) */
    uint64_t buckets, pieces, deferred; /* of the open (or last) session */
    /* host seconds summed over the session's buckets, per phase */
    double validate_s, wait_s, prepare_s, buffers_s, recv_s, launch_s, deferred_s;
    double apply_s;     /* whole rw_sync_session_apply calls */
    double max_apply_s; /* the longest one */
    double commit_wait_s;
} rw_sync_sstats;
/* Thread-safe snapshot. */
void rw_sync_session_stats(rw_sync_session *s, rw_sync_sstats *out);

/* ------------------------------------------------------------------------------------------ */
/* Checkpoints on disk: the one cutter, for updates from disk and for the start-up load         */
/* ------------------------------------------------------------------------------------------ */
/* The checkpoint cutter: rows (along dim 0; a 0-d tensor has one) of checkpoint tensor `e` per
 * piece of at most `limit` bytes: all of them when the tensor fits, else rw_sync_split_step of
 * its row size (rw_split_step, rw_core.h), so every piece is a multiple of 128 rows when that many fit; 0 when a single row
 * is larger than `limit`. */
uint64_t rw_sync_ckpt_rows(const rw_st_entry *e, uint64_t limit);

/* Applies a safetensors checkpoint directory (HF layout) through the same path: every entry is
 * validated first, then files are cut into buckets of consecutive tensors (each a byte range of
 * one file, read with pread through a file source: a file cut short during the load fails the
 * session with "file shrank while loading" instead of a signal); a tensor larger than the
 * bucket (staging; 64 MiB at most on a host weight set) size goes as row pieces along dim 0,
 * one bucket each. With no session open, opens one with `a` (version defaults to "disk:<dir>")
 * and commits it at the end; with one open, adds to it (a may be NULL). `only` (may be NULL) is a
 * POSIX extended regex selecting tensor names. */
rw_status rw_sync_session_apply_disk(rw_sync_session *s, const char *dir, const char *only,
                                     const rw_sync_begin_args *a, uint64_t *tensors,
                                     uint64_t *bytes, rw_err *err);

/* Loads every tensor of a checkpoint directory straight into `ws` (the start-up load: no
 * session). Tensors are read with pread (rw_st_read) into one host buffer and applied from there
 * with rw_wset_apply, never through the files' mappings: a file truncated while it is loaded then
 * fails the load with "file shrank while loading" (naming the file, the tensor and the byte)
 * instead of killing the process with SIGBUS. Pieces follow rw_sync_ckpt_rows with a limit of
 * `piece_bytes` (0: RW_LOAD_PIECE_BYTES from the environment when set (>= 4096; tests use small
 * ones), else 256 MiB); a single row larger than that goes alone (the buffer grows to it). Errors
 * are prefixed "loading <dir>". The written regions of `ws` are cleared first; the caller checks
 * completeness (rw_wset_complete) and, on a device set, waits for the writes. */
rw_status rw_sync_load_ckpt(rw_wset *ws, const char *dir, uint64_t piece_bytes, rw_err *err);

/* ------------------------------------------------------------------------------------------ */
/* Command handlers: the worker side of the sync commands (RW_CMDF_SYNC), over decoded requests */
/* ------------------------------------------------------------------------------------------ */
/* One rank's checksums (the checksum command). */
typedef struct rw_sync_sums {
    int tp, rank;
    size_t n;
    char (*names)[RW_SYNC_MAX_NAME]; /* [n] canonical names */
    uint64_t *values;                /* [n] rw_wset_checksum of each */
} rw_sync_sums;

/* What a sync command did, typed, for the server that ran it: the daemon decides pausing,
 * version stamps, cache flushes and settling from it, and never reads its own reply back. */
typedef struct rw_sync_outcome {
    rw_cmd cmd;
    rw_sync_wstate state; /* this rank's weight state after the command (also after a failure) */
    bool committed;       /* a new version serves now: commit_update, or update_weights_from_disk
                             that opened and committed its own session */
    bool flush_cache;     /* committed: the session asked for the caches to be flushed */
    char version[RW_SYNC_MAX_VERSION + 1]; /* the serving version after the command */
    rw_sync_out_frame frame; /* get_weights: the readback (malloc'd; taken by the caller, or
                                freed by rw_sync_outcome_free) */
    rw_sync_sums *sums;      /* checksum: this rank's checksums (owned by the outcome) */
} rw_sync_outcome;
/* Frees the frame and the checksums of an outcome and clears it; NULL is a no-op. */
void rw_sync_outcome_free(rw_sync_outcome *o);

/* Handles one sync command: writes a complete reply (ok or error) into `reply`, fills `out`
 * (may be NULL) and returns the command's status. `local_rank` is this rank's index within the
 * worker (added to the group's rank offset). A failed update_weights or update_weights_from_disk
 * ends the open session. RW_E_NOT_FOUND (with an error reply) when cmd is not a sync command. */
rw_status rw_sync_handle(rw_sync_session *s, int local_rank, const rw_request *req,
                         const rw_sync_frames *in, rw_mw *reply, rw_sync_outcome *out, rw_err *err);
/* The ownership check of a request on session `s` (a request of any command may be given):
 * RW_OK unless req is update_weights, update_weights_from_disk, commit_update or abort_update
 * while a session is open and args.session is missing or not that session's token
 * (RW_E_AUTH, naming the field and the session's version; RW_E_PROTOCOL when it is not a
 * string). abort_update with args.force = true passes without the token: *forced (may be NULL)
 * is then set, for the caller to log. Nothing is changed; a refused request leaves the session
 * as it was (it is not one of the failures that end a session). rw_sync_handle calls it first;
 * a server that relays requests to other ranks calls it before relaying. */
rw_status rw_sync_check_owner(const rw_sync_session *s, const rw_request *req, bool *forced,
                              rw_err *err);
/* The reply of a checksum command run on several ranks of one worker: this rank's result
 * (`mine`, from rw_sync_handle on session `s`) with the "ranks" entries of the other ranks'
 * checksum replies others[0..n) appended in order. */
rw_status rw_sync_checksum_reply(rw_sync_session *s, uint64_t id, const rw_sync_outcome *mine,
                                 const rw_reply *others, size_t n, rw_mw *w, rw_err *err);

/* ------------------------------------------------------------------------------------------ */
/* A minimal server for the sync commands (tests, benchmarks, and the shape the daemon's        */
/* control loop follows).                                                                       */
/* ------------------------------------------------------------------------------------------ */
typedef struct rw_sync_server rw_sync_server;
/* Binds a ROUTER socket at `addr` ("tcp://127.0.0.1:*" picks a free port) in context `zctx`
 * (NULL: a context of its own) and serves the sync commands of `s` (borrowed) from a thread of
 * its own until destroyed. Other commands get an RW_E_PROTOCOL error reply ("unknown command"). */
rw_status rw_sync_server_start(rw_sync_session *s, void *zctx, const char *addr,
                               rw_sync_server **out, rw_err *err);
const char *rw_sync_server_endpoint(const rw_sync_server *srv); /* the bound address */
uint64_t rw_sync_server_handled(const rw_sync_server *srv);     /* requests answered */
void rw_sync_server_stop(rw_sync_server *srv);                  /* joins; NULL is a no-op */

#ifdef __cplusplus
}
#endif

#endif /* RW_SYNC_H */
