/* rw_sync.h - the sync module's public contract: the versioned msgpack control envelope (shared
 * by every command of the worker), a bounded msgpack decoder with an object view, bucket
 * manifests, the update session (begin -> buckets -> commit | abort) with its invariants, the
 * transports (ZeroMQ frames, safetensors on disk, NCCL broadcast) behind one byte-source
 * interface, the trainer-side client library (also built as librw_client.so), trainer-side
 * checksums and checkpoint push, and the weight-sync benchmark entry points.
 *
 * Wire schema: docs/PROTOCOL.md. Requirements: spec/protocol.md. What an update writes:
 * spec/layout.md (through rw_wset_validate_piece / rw_wset_apply of moe/).
 *
 * Conventions: every fallible function returns rw_status and takes `rw_err *` last;
 * destroy(NULL) is a no-op; ownership of every pointer is stated beside it. The client part of
 * this header uses only plain C types (opaque handles, char *, integers, caller-owned buffers) so
 * that a ctypes wrapper can call it.
 */
#ifndef RW_SYNC_H
#define RW_SYNC_H

#include "rw_core.h"
#include "rw_moe.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------------------------------ */
/* Envelope and limits                                                                          */
/* ------------------------------------------------------------------------------------------ */
#define RW_PROTOCOL_VERSION 1
#define RW_MSG_MAX_BYTES (64u << 20) /* one msgpack envelope (bulk bytes travel in other frames)   \
                                      */
#define RW_MSG_MAX_DEPTH 16          /* nesting of arrays / maps */
#define RW_MSG_MAX_STR (1u << 20)    /* one string or bin value */
#define RW_MSG_MAX_CMD 63            /* command name length */
#define RW_MSG_MAX_KEYS 256          /* keys in one map read through rw_mfields */
#define RW_SYNC_MAX_VERSION 127      /* weight version tag length */

/* A read-only msgpack value inside a decoded message (msgpack-c's msgpack_object; include
 * <msgpack.h> to look inside, or use the rw_mobj_* accessors). Borrowed from its rw_msg. */
typedef struct msgpack_object rw_mobj;
/* A decoded message: owns the memory every rw_mobj of it points into. */
typedef struct rw_msg rw_msg;
void rw_msg_free(rw_msg *m);

/* A request: {protocol: 1, id: u64, cmd: str, args: map}. `args` is an empty map when absent. */
typedef struct rw_request {
    uint64_t id;
    bool has_id; /* the id was read (also set when decoding failed later, for the error reply) */
    char cmd[RW_MSG_MAX_CMD + 1];
    const rw_mobj *args; /* borrowed from the rw_msg */
} rw_request;

/* A reply: {protocol: 1, id, ok: true, result: any} or {protocol: 1, id, ok: false,
 * error: {status: <rw_status name>, code: <int>, message: str}}. */
typedef struct rw_reply {
    uint64_t id;
    bool ok;
    const rw_mobj *result; /* when ok (nil when the command returns nothing) */
    rw_status status;      /* when !ok */
    char message[512];     /* when !ok */
} rw_reply;

/* Decoders: never trust the bytes. Refused with RW_E_FORMAT: empty, truncated, trailing bytes,
 * nesting deeper than RW_MSG_MAX_DEPTH, an array/map/str/bin longer than the bytes left or than
 * RW_MSG_MAX_STR, ext types; RW_E_RANGE: more than RW_MSG_MAX_BYTES; RW_E_PROTOCOL: not a map,
 * missing or mistyped envelope field, unknown envelope field, `protocol` other than
 * RW_PROTOCOL_VERSION (the message names both versions). On success *out owns the memory that
 * req/rep point into. */
rw_status rw_msg_decode_request(const void *buf, size_t len, rw_msg **out, rw_request *req,
                                rw_err *err);
rw_status rw_msg_decode_reply(const void *buf, size_t len, rw_msg **out, rw_reply *rep,
                              rw_err *err);
/* Decodes any single msgpack value with the same bounds (no envelope). */
rw_status rw_msg_decode_value(const void *buf, size_t len, rw_msg **out, const rw_mobj **val,
                              rw_err *err);

/* ------------------------------------------------------------------------------------------ */
/* Object view: typed access to decoded values. `what` names the field in error messages       */
/* (e.g. "args.tensors[3].shape"), so every refusal says what was wrong.                         */
/* ------------------------------------------------------------------------------------------ */
typedef enum rw_mtype {
    RW_M_NIL = 0,
    RW_M_BOOL = 1,
    RW_M_UINT = 2, /* non-negative integer */
    RW_M_INT = 3,  /* negative integer */
    RW_M_FLOAT = 4,
    RW_M_STR = 5,
    RW_M_BIN = 6,
    RW_M_ARRAY = 7,
    RW_M_MAP = 8,
    RW_M_OTHER = 9,
} rw_mtype;

rw_mtype rw_mobj_type(const rw_mobj *o);
const char *rw_mtype_str(rw_mtype t);
size_t rw_mobj_len(const rw_mobj *o); /* elements of an array / pairs of a map / bytes of str */
const rw_mobj *rw_mobj_at(const rw_mobj *arr, size_t i);     /* NULL when out of range */
const rw_mobj *rw_mobj_key_at(const rw_mobj *map, size_t i); /* NULL when out of range */
const rw_mobj *rw_mobj_val_at(const rw_mobj *map, size_t i);
const rw_mobj *rw_mobj_get(const rw_mobj *map, const char *key); /* NULL: absent / not a map */

rw_status rw_mobj_u64(const rw_mobj *o, const char *what, uint64_t *out, rw_err *err);
rw_status rw_mobj_i64(const rw_mobj *o, const char *what, int64_t *out, rw_err *err);
/* Any number (integers are converted). */
rw_status rw_mobj_f64(const rw_mobj *o, const char *what, double *out, rw_err *err);
rw_status rw_mobj_bool(const rw_mobj *o, const char *what, bool *out, rw_err *err);
/* Borrowed string bytes (not NUL-terminated). */
rw_status rw_mobj_str(const rw_mobj *o, const char *what, const char **ptr, size_t *len,
                      rw_err *err);
/* Copies a string NUL-terminated; refuses one with an embedded NUL or longer than cap - 1. */
rw_status rw_mobj_strcpy(const rw_mobj *o, const char *what, char *dst, size_t cap, rw_err *err);
/* Borrowed bin bytes. */
rw_status rw_mobj_bin(const rw_mobj *o, const char *what, const void **ptr, size_t *len,
                      rw_err *err);
/* An array of integers into dst[cap]: refuses a longer array and non-integer / out-of-range
 * elements (each must lie in [lo, hi]). */
rw_status rw_mobj_i64_array(const rw_mobj *o, const char *what, int64_t lo, int64_t hi,
                            int64_t *dst, size_t cap, size_t *n, rw_err *err);
/* Renders a value as JSON text (malloc'd, caller frees). Integers beyond int64 and bin values are
 * refused (the protocol sends 64-bit checksums and NCCL ids as hex strings for this reason). */
rw_status rw_mobj_to_json(const rw_mobj *o, char **out, rw_err *err);

/* Reads the fields of a map and reports the unknown ones: get/req mark a key as read;
 * rw_mfields_done refuses the first key that was never read (RW_E_PROTOCOL). Duplicate keys and
 * non-string keys are refused by init. Lives on the caller's stack. */
typedef struct rw_mfields {
    const rw_mobj *map;
    char what[64];
    uint64_t used[RW_MSG_MAX_KEYS / 64];
} rw_mfields;
rw_status rw_mfields_init(rw_mfields *f, const rw_mobj *map, const char *what, rw_err *err);
/* The value of `key`, or NULL when absent or nil. */
const rw_mobj *rw_mfields_get(rw_mfields *f, const char *key);
/* Like get, but a missing field is RW_E_PROTOCOL ("args.version: missing"). */
rw_status rw_mfields_req(rw_mfields *f, const char *key, const rw_mobj **out, rw_err *err);
/* Typed optional fields: `def` when absent. */
rw_status rw_mfields_u64(rw_mfields *f, const char *key, uint64_t def, uint64_t *out, rw_err *err);
rw_status rw_mfields_f64(rw_mfields *f, const char *key, double def, double *out, rw_err *err);
rw_status rw_mfields_bool(rw_mfields *f, const char *key, bool def, bool *out, rw_err *err);
/* `def` may be NULL (then an absent field gives ""). */
rw_status rw_mfields_str(rw_mfields *f, const char *key, const char *def, char *dst, size_t cap,
                         rw_err *err);
rw_status rw_mfields_done(const rw_mfields *f, rw_err *err);

/* ------------------------------------------------------------------------------------------ */
/* Writer: builds one msgpack message. Errors are sticky (checked once by rw_mw_finish).        */
/* ------------------------------------------------------------------------------------------ */
typedef struct rw_mw rw_mw;
rw_status rw_mw_create(rw_mw **out, rw_err *err);
void rw_mw_destroy(rw_mw *w);
void rw_mw_reset(rw_mw *w);
/* Envelope heads: each is followed by exactly one value written by the caller (the args map,
 * or the result value). */
void rw_mw_request(rw_mw *w, uint64_t id, const char *cmd);
void rw_mw_reply_ok(rw_mw *w, uint64_t id);
/* A complete error reply. */
void rw_mw_reply_err(rw_mw *w, uint64_t id, rw_status st, const char *message);
void rw_mw_map(rw_mw *w, uint32_t n);
void rw_mw_array(rw_mw *w, uint32_t n);
void rw_mw_nil(rw_mw *w);
void rw_mw_bool(rw_mw *w, bool v);
void rw_mw_u64(rw_mw *w, uint64_t v);
void rw_mw_i64(rw_mw *w, int64_t v);
void rw_mw_f64(rw_mw *w, double v);
void rw_mw_str(rw_mw *w, const char *s);
void rw_mw_strn(rw_mw *w, const char *s, size_t n);
void rw_mw_bin(rw_mw *w, const void *p, size_t n);
void rw_mw_hex64(rw_mw *w, uint64_t v);     /* 16 lowercase hex digits as a string */
void rw_mw_obj(rw_mw *w, const rw_mobj *o); /* copies a decoded value (relay) */
/* Appends bytes that already are msgpack (one or more complete values, e.g. another writer's). */
void rw_mw_raw(rw_mw *w, const void *p, size_t n);
/* Appends the msgpack form of a JSON text (one value; objects become maps). */
rw_status rw_mw_json(rw_mw *w, const char *json, rw_err *err);
/* The bytes written so far: borrowed until the next write / reset / destroy. Fails with the
 * sticky error (RW_E_OOM) if any write failed. */
rw_status rw_mw_finish(rw_mw *w, const void **data, size_t *len, rw_err *err);
/* Like finish, but hands the malloc'd buffer to the caller (free with free()); the writer is
 * left empty. */
rw_status rw_mw_take(rw_mw *w, void **data, size_t *len, rw_err *err);

/* Hex helpers for ids and checksums on the wire. */
void rw_hex_encode(const void *bytes, size_t n, char *dst); /* dst holds 2n + 1 */
rw_status rw_hex_decode(const char *hex, size_t hexlen, void *dst, size_t n, const char *what,
                        rw_err *err);

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
/* Three kinds: the bucket's bytes are already in host memory (`host` non-NULL: a ZeroMQ frame);
 * or a host-side reader copies byte ranges of them on request (`read_at` non-NULL: a file of the
 * disk transport, read with pread so that a file that shrinks gives an error, not a signal); or
 * only `read` delivers them into a destination buffer on a stream (NCCL broadcast into device
 * staging). Every source implements `read` (memcpy / pread / H2D copy / broadcast). */
typedef struct rw_sync_source rw_sync_source;
struct rw_sync_source {
    const char *name; /* "zmq", "disk", "nccl", "mem" */
    const void *host; /* borrowed; valid while the source is */
    uint64_t nbytes;  /* bytes available (a host frame's length); checked against the manifest */
    /* Writes the first `nbytes` bytes of the bucket to dst (host or device) on `s` (async when a
     * device is involved). */
    rw_status (*read)(rw_sync_source *src, void *dst, rw_place place, uint64_t nbytes, rw_stream s,
                      rw_err *err);
    void *ctx;
    /* NULL, or copies bytes [off, off + len) of the bucket to host memory at dst and returns
     * once they are there. Thread-safe: several threads may read disjoint ranges at once. */
    rw_status (*read_at)(const rw_sync_source *src, void *dst, uint64_t off, size_t len,
                         rw_err *err);
    uint64_t base; /* read_at sources: where the bucket starts in what ctx reads */
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
#define RW_NCCL_ID_BYTES 128
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
 * A host source (`src->host`) or a reader source (`src->read_at`: disk) reaches device staging
 * through pinned chunks that a few threads fill (memcpy, or read_at of one share each;
 * RW_SYNC_COPY_THREADS, default up to 8) while earlier chunks are copied to the device; its
 * bytes are no longer read once this returns. Host weight sets apply straight from `src->host`
 * (no copy), or from a host buffer of the session that read_at fills first (a read error then
 * fails the bucket before it writes anything).
 * Any failure ends (aborts) the session: the error message says whether the previous version is
 * intact (nothing written yet) or the weights are now incomplete. RW_E_STATE when no session
 * is open. */
rw_status rw_sync_session_apply(rw_sync_session *s, const rw_sync_manifest *m, rw_sync_source *src,
                                rw_sync_bucket_result *out, rw_err *err);
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

/* ------------------------------------------------------------------------------------------ */
/* Command handlers: the worker side of the sync commands, over decoded requests.               */
/* ------------------------------------------------------------------------------------------ */
/* Bulk frames that came with a request, and the one a reply may carry (get_weights). */
typedef struct rw_sync_frames {
    size_t n;
    const void *data[4];
    size_t len[4];
} rw_sync_frames;

typedef struct rw_sync_out_frame {
    void *data; /* malloc'd; ownership passes to the caller (free()) */
    size_t len;
} rw_sync_out_frame;

/* Commands this module serves: init_weights_update_group, begin_update, update_weights,
 * update_weights_from_disk, commit_update, abort_update, get_weight_version, get_weights,
 * checksum. */
bool rw_sync_is_command(const char *cmd);
/* Handles one sync command: writes a complete reply (ok or error) into `reply` and returns the
 * command's status. `local_rank` is this rank's index within the worker (added to the group's
 * rank offset). RW_E_NOT_FOUND (with an error reply) when cmd is not a sync command. */
rw_status rw_sync_handle(rw_sync_session *s, int local_rank, const rw_request *req,
                         const rw_sync_frames *in, rw_mw *reply, rw_sync_out_frame *out,
                         rw_err *err);

/* ------------------------------------------------------------------------------------------ */
/* ZeroMQ helpers and a minimal server for the sync commands (tests, benchmarks, and the shape  */
/* the daemon's control loop follows).                                                          */
/* ------------------------------------------------------------------------------------------ */
/* One multipart message received from a ROUTER socket without copying: the routing id, an
 * optional empty delimiter (REQ peers), the envelope, then up to 4 data frames. */
typedef struct rw_zmq_msg rw_zmq_msg;
/* Receives one message, waiting up to timeout_ms (-1: forever). RW_E_TIMEOUT when none came;
 * RW_E_FORMAT for a message with no envelope or more than 4 data frames (the message is
 * consumed and *out still receives it, so the caller can send an error reply). */
rw_status rw_zmq_recv(void *router, int timeout_ms, rw_zmq_msg **out, rw_err *err);
void rw_zmq_msg_free(rw_zmq_msg *m);
const void *rw_zmq_msg_envelope(const rw_zmq_msg *m, size_t *len);
void rw_zmq_msg_frames(const rw_zmq_msg *m, rw_sync_frames *out);
/* The sender's routing id (borrowed from the message): tells the clients of one ROUTER apart. */
const void *rw_zmq_msg_peer(const rw_zmq_msg *m, size_t *len);
/* Sends a reply to the peer of `to`: routing id (+ delimiter), envelope (copied), and an
 * optional data frame whose ownership passes to ZeroMQ (freed with free()). */
rw_status rw_zmq_reply(void *router, const rw_zmq_msg *to, const void *env, size_t env_len,
                       rw_sync_out_frame *frame, rw_err *err);

typedef struct rw_sync_server rw_sync_server;
/* Binds a ROUTER socket at `addr` ("tcp://127.0.0.1:*" picks a free port) in context `zctx`
 * (NULL: a context of its own) and serves the sync commands of `s` (borrowed) from a thread of
 * its own until destroyed. Other commands get an RW_E_PROTOCOL error reply ("unknown command"). */
rw_status rw_sync_server_start(rw_sync_session *s, void *zctx, const char *addr,
                               rw_sync_server **out, rw_err *err);
const char *rw_sync_server_endpoint(const rw_sync_server *srv); /* the bound address */
uint64_t rw_sync_server_handled(const rw_sync_server *srv);     /* requests answered */
void rw_sync_server_stop(rw_sync_server *srv);                  /* joins; NULL is a no-op */

/* ------------------------------------------------------------------------------------------ */
/* Trainer-side client (librw_client.so).                                                       */
/* ------------------------------------------------------------------------------------------ */
typedef struct rw_client rw_client;
/* Connects a DEALER socket to a worker's control address (e.g. "tcp://127.0.0.1:5557"). `zctx`
 * may be NULL (a context of its own). Connecting does not wait for the peer. */
rw_status rw_client_connect(const char *addr, void *zctx, rw_client **out, rw_err *err);
void rw_client_close(rw_client *c);
/* The detailed message of the last failed call on this handle ("" after a success). */
const char *rw_client_last_error(const rw_client *c);
/* Authentication for workers that require a shared token (a control socket bound to a
 * non-loopback address; docs/OPERATIONS.md): every request sent from now on carries
 * args.auth = token, unless its args already hold an "auth" field. rw_client_connect takes the
 * token from the environment variable RW_AUTH_TOKEN when it is set. NULL or "" stops sending
 * one. The token is copied. */
rw_status rw_client_set_auth(rw_client *c, const char *token, rw_err *err);

/* Sends any command: `args_json` is a JSON object (NULL: {}), `frames` optional data frames
 * (borrowed: copied before the call returns). `*id` gets the request id. */
rw_status rw_client_send_json(rw_client *c, const char *cmd, const char *args_json,
                              const void *const *frames, const size_t *frame_lens, size_t nframes,
                              uint64_t *id, rw_err *err);
/* Waits for the reply to `id` (replies to other ids are kept for their own wait). On an error
 * reply returns its status with its message in err. `result_json` (may be NULL) gets the result
 * as JSON text (free with rw_client_free); `frame` (may be NULL) the reply's data frame (free
 * with rw_client_free). RW_E_TIMEOUT after timeout_ms. */
rw_status rw_client_wait_json(rw_client *c, uint64_t id, int timeout_ms, char **result_json,
                              void **frame, size_t *frame_len, rw_err *err);
/* send + wait. */
rw_status rw_client_call_json(rw_client *c, const char *cmd, const char *args_json, int timeout_ms,
                              char **result_json, rw_err *err);
void rw_client_free(void *p);

/* The same with msgpack: write the args value into `args` (a writer from rw_mw_create; may be
 * NULL for {}), then send. The reply is decoded into rep/msg (free msg with rw_msg_free). */
rw_status rw_client_send(rw_client *c, const char *cmd, rw_mw *args, const void *frame,
                         size_t frame_len, bool zero_copy, uint64_t *id, rw_err *err);
rw_status rw_client_wait(rw_client *c, uint64_t id, int timeout_ms, rw_msg **msg, rw_reply *rep,
                         void **frame, size_t *frame_len, rw_err *err);

/* Typed calls. */
rw_status rw_client_begin_update(rw_client *c, const char *version, bool flush_cache,
                                 uint64_t bucket_bytes, double timeout_s, int timeout_ms,
                                 rw_err *err);
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

/* ------------------------------------------------------------------------------------------ */
/* Benchmarks (CUDA builds; RW_E_NO_DEVICE otherwise): called by rw-bench for S1, S2, S4, S5.  */
/* ------------------------------------------------------------------------------------------ */
typedef struct rw_sync_bench_opts {
    const rw_config *cfg;  /* the worker's model (its quantization decides S1 vs S2) */
    int trainer_device;    /* S1/S2: GPU holding the trainer's random bf16 weights */
    int worker_device;     /* GPU of the TP1 worker rank */
    uint64_t bucket_bytes; /* 0: 512 MiB */
    int repeats;           /* timed runs after one warm-up; 0: 3 */
    double timeout_s;      /* 0: 120 */
    const char *disk_dir;  /* S4: a safetensors checkpoint of cfg's shape */
    /* 0: none. The call (setup, warm-up, repeats, ceiling, cleanup) aims to end within this many
     * seconds: repeats are cut to what fits (the result's note says so; when no timed repeat
     * fits, the warm-up is reported as the only sample), every wait is bounded by the time left,
     * and an update still running at the limit is abandoned with RW_E_TIMEOUT naming the repeat,
     * the bucket and where the worker was. */
    double time_limit_s;
    /* Progress on stderr: setup steps with their times, per-bucket times of the first buckets,
     * running means per bucket (trainer call, worker host phases), each repeat's time, and every
     * 5 s a watchdog line saying where both sides are. */
    bool verbose;
} rw_sync_bench_opts;

#define RW_SYNC_BENCH_MAX_REPEATS 16
typedef struct rw_sync_bench_result {
    uint64_t bytes, tensors, buckets;
    int repeats;
    double update_s[RW_SYNC_BENCH_MAX_REPEATS];  /* first byte -> ready to generate */
    double ceiling_s[RW_SYNC_BENCH_MAX_REPEATS]; /* raw broadcast / pinned H2D of the bytes */
    double update_median_s, ceiling_median_s;
    double update_gbps, ceiling_gbps, ratio; /* ratio = update / ceiling (lower is better) */
    size_t worker_weights_bytes;             /* the weight set */
    size_t worker_staging_bytes;             /* 2 buckets */
    size_t worker_peak_bytes;                /* device memory used on the worker GPU at peak,
                                                over the level before the weight set existed */
    /* diagnostics (S1/S2; the last timed repeat, or the warm-up when none ran) */
    uint64_t pieces;           /* pieces sent per update (tensors plus row pieces) */
    int ceiling_repeats;       /* raw broadcast repeats (may be fewer than repeats when cut) */
    double setup_s;            /* weight set, trainer weights, group: before the warm-up */
    double warmup_s;           /* the untimed first update */
    double first_bucket_s[4];  /* trainer call (request -> reply -> broadcast enqueued) */
    double bucket_mean_s;      /* the same, mean over the buckets */
    double bucket_max_s;       /* and the longest */
    double commit_s;           /* commit request -> reply (the wait for the last buckets) */
    double worker_apply_s;     /* worker host time per bucket in its apply call */
    double worker_wait_s;      /* of which waiting for a bucket record to drain */
    double worker_prepare_s;   /* of which building the ops and the op table */
    uint64_t worker_deferred;  /* buckets whose apply waited for their bytes */
    char note[256];            /* what was cut for time, or "" */
} rw_sync_bench_result;
/* S1 / S2 / S5: trainer on trainer_device generates random canonical bf16 weights, pushes them
 * as a full update over NCCL through the real protocol (a sync server on loopback) to a TP1
 * worker on worker_device; the raw ncclBroadcast of the same buckets runs in the same process.
 * Tensors larger than a bucket go as row pieces, as rw_sync_push_ckpt sends them. */
rw_status rw_sync_bench_nccl(const rw_sync_bench_opts *o, rw_sync_bench_result *out, rw_err *err);
/* S4: update_weights_from_disk of disk_dir into a worker on worker_device; the ceiling is a
 * pinned host -> device copy of the same byte count. */
rw_status rw_sync_bench_disk(const rw_sync_bench_opts *o, rw_sync_bench_result *out, rw_err *err);
/* The result as one JSON object (malloc'd). */
rw_status rw_sync_bench_json(const rw_sync_bench_result *r, const char *name, char **out,
                             rw_err *err);

/* Deterministic pseudo-random bf16 fill used by the benchmark: element i gets
 * bf16(std * sqrt(3) * (u24(hash(seed, i)) - 2^23) / 2^23), a uniform value of the given std.
 * The CUDA version matches the reference byte for byte. */
void rw_sync_fill_bf16_ref(uint16_t *dst, uint64_t n, uint64_t seed, float std);
rw_status rw_sync_fill_bf16_cuda(uint16_t *dst, uint64_t n, uint64_t seed, float std, rw_stream s,
                                 rw_err *err);

#ifdef __cplusplus
}
#endif

#endif /* RW_SYNC_H */
