/* rw_msg.h - the control protocol's message layer, shared by every command of the worker and by
 * every client: the versioned msgpack envelope, a bounded decoder with a typed object view and a
 * field reader that refuses unknown fields, the writer, the one table of command names, and the
 * ZeroMQ framing of a message with its bulk data frames.
 *
 * Wire schema: docs/PROTOCOL.md. Nothing here knows what a command does: the sync module
 * (rw_sync.h) and the worker daemon read and write their commands' fields through this layer.
 *
 * Conventions: every fallible function returns rw_status and takes `rw_err *` last; free / destroy
 * of NULL is a no-op; ownership of every pointer is stated beside it. */
#ifndef RW_MSG_H
#define RW_MSG_H

#include "rw_core.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------------------------------ */
/* Envelope and limits                                                                          */
/* ------------------------------------------------------------------------------------------ */
/* 2: update sessions belong to the client that opened them (begin_update returns a token the
 * session's later commands carry as args.session); generate's final result may come in parts.
 * A side refuses every other version (docs/PROTOCOL.md). */
#define RW_PROTOCOL_VERSION 2
/* The control address a worker binds and a client connects to when told none. */
#define RW_DEFAULT_CONTROL "tcp://127.0.0.1:5557"
#define RW_MSG_MAX_BYTES                                                                           \
    (64u << 20)                   /* one msgpack envelope (bulk bytes travel in other frames)      \
                                   */
#define RW_MSG_MAX_DEPTH 16       /* nesting of arrays / maps */
#define RW_MSG_MAX_STR (1u << 20) /* one string or bin value */
#define RW_MSG_MAX_CMD 63         /* command name length */
#define RW_MSG_MAX_KEYS 256       /* keys in one map read through rw_mfields */
#define RW_MSG_MAX_FRAMES 4       /* data frames after one envelope */

/* A read-only msgpack value inside a decoded message (msgpack-c's msgpack_object; include
 * <msgpack.h> to look inside, or use the rw_mobj_* accessors). Borrowed from its rw_msg. */
typedef struct msgpack_object rw_mobj;
/* A decoded message: owns the memory every rw_mobj of it points into. */
typedef struct rw_msg rw_msg;
void rw_msg_free(rw_msg *m);

/* A request: {protocol: RW_PROTOCOL_VERSION, id: u64, cmd: str, args: map}. `args` is an empty
 * map when absent. */
typedef struct rw_request {
    uint64_t id;
    bool has_id; /* the id was read (also set when decoding failed later, for the error reply) */
    char cmd[RW_MSG_MAX_CMD + 1];
    const rw_mobj *args; /* borrowed from the rw_msg */
} rw_request;

/* A reply: {protocol, id, ok: true, result: any} or {protocol, id, ok: false,
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
/* The `id` of an envelope that may be too large or too broken to decode: read from the top-level
 * map's fields before the first one that is not protocol / id / cmd / ok (every writer puts the
 * id there). False when it is not found. For a client that must answer the request whose reply
 * it could not read, instead of waiting for a reply that will never be readable. */
bool rw_msg_peek_id(const void *buf, size_t len, uint64_t *id);
/* Decodes any single msgpack value with the same bounds (no envelope). */
rw_status rw_msg_decode_value(const void *buf, size_t len, rw_msg **out, const rw_mobj **val,
                              rw_err *err);

/* Takes the fields named keys[0..n) out of req->args without re-encoding anything: afterwards
 * req->args is a view of the same map without them (memory owned by `m`, the message req was
 * decoded into). For the fields a server reads itself (a token, its own options) before it hands
 * the request to a handler that refuses unknown fields. *taken (may be NULL) gets how many
 * fields were removed. */
rw_status rw_request_take_args(rw_msg *m, rw_request *req, const char *const *keys, size_t n,
                               size_t *taken, rw_err *err);

/* ------------------------------------------------------------------------------------------ */
/* Commands: the one table of command names (docs/PROTOCOL.md), in the order the protocol      */
/* lists them. The daemon dispatches on it, the sync module serves the RW_CMDF_SYNC ones, the   */
/* clients and rw-ctl name commands through it; the Python client keeps a copy that a test     */
/* compares with this table. Numbers are table indices: append-only.                           */
/* ------------------------------------------------------------------------------------------ */
typedef enum rw_cmd {
    RW_CMD_NONE = 0, /* not a command of the protocol */
    RW_CMD_GENERATE = 1,
    RW_CMD_ABORT = 2,
    RW_CMD_PAUSE = 3,
    RW_CMD_RESUME = 4,
    RW_CMD_FLUSH_CACHE = 5,
    RW_CMD_INIT_WEIGHTS_UPDATE_GROUP = 6,
    RW_CMD_BEGIN_UPDATE = 7,
    RW_CMD_UPDATE_WEIGHTS = 8,
    RW_CMD_UPDATE_WEIGHTS_FROM_DISK = 9,
    RW_CMD_COMMIT_UPDATE = 10,
    RW_CMD_ABORT_UPDATE = 11,
    RW_CMD_GET_WEIGHT_VERSION = 12,
    RW_CMD_GET_WEIGHTS = 13,
    RW_CMD_CHECKSUM = 14,
    RW_CMD_RELEASE_MEMORY = 15,
    RW_CMD_RESUME_MEMORY = 16,
    RW_CMD_HEALTH = 17,
    RW_CMD_STATS = 18,
    RW_CMD_SHUTDOWN = 19,
    RW_CMD_SCORE = 20,
} rw_cmd;
#define RW_CMD_COUNT 21 /* RW_CMD_NONE included: every rw_cmd is below this */

/* Command flags. */
#define RW_CMDF_SYNC 1u   /* served by the sync module (rw_sync_handle); the others by the daemon */
#define RW_CMDF_UPDATE 2u /* writes weights: part of an update session */

/* The wire name of `c` ("generate"); NULL for RW_CMD_NONE or a number outside the table. */
const char *rw_cmd_name(rw_cmd c);
/* The command named `name`, or RW_CMD_NONE. */
rw_cmd rw_cmd_parse(const char *name);
/* RW_CMDF_* of `c` (0 for RW_CMD_NONE). */
unsigned rw_cmd_flags(rw_cmd c);
/* Every command name in table order, ", "-separated, into dst[cap] (truncated to fit); returns
 * dst. For messages that list the commands. */
const char *rw_cmd_list(char *dst, size_t cap);

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
/* True when `o` is a string equal to `s`. */
bool rw_mobj_is_str(const rw_mobj *o, const char *s);

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
/* init + done: a map that must have no fields (commands without arguments). */
rw_status rw_mfields_none(const rw_mobj *map, const char *what, rw_err *err);

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
/* One key / value pair of a map being written (the key is a string). */
void rw_mw_kv_str(rw_mw *w, const char *key, const char *v);
void rw_mw_kv_u64(rw_mw *w, const char *key, uint64_t v);
void rw_mw_kv_i64(rw_mw *w, const char *key, int64_t v);
void rw_mw_kv_f64(rw_mw *w, const char *key, double v);
void rw_mw_kv_bool(rw_mw *w, const char *key, bool v);
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
/* Data frames and their ZeroMQ framing (worker side)                                          */
/* ------------------------------------------------------------------------------------------ */
/* Bulk frames that came with a request (borrowed from the received message), and the one a
 * reply may carry (get_weights). */
typedef struct rw_sync_frames {
    size_t n;
    const void *data[RW_MSG_MAX_FRAMES];
    size_t len[RW_MSG_MAX_FRAMES];
} rw_sync_frames;

typedef struct rw_sync_out_frame {
    void *data; /* malloc'd; ownership passes to the caller (free()) */
    size_t len;
} rw_sync_out_frame;

/* One multipart message received from a ROUTER socket without copying: the routing id, an
 * optional empty delimiter (REQ peers), the envelope, then up to RW_MSG_MAX_FRAMES data
 * frames. */
typedef struct rw_zmq_msg rw_zmq_msg;
/* Receives one message, waiting up to timeout_ms (-1: forever). RW_E_TIMEOUT when none came;
 * RW_E_FORMAT for a message with no envelope or too many data frames (the message is consumed
 * and *out still receives it, so the caller can send an error reply). */
rw_status rw_zmq_recv(void *router, int timeout_ms, rw_zmq_msg **out, rw_err *err);
void rw_zmq_msg_free(rw_zmq_msg *m);
const void *rw_zmq_msg_envelope(const rw_zmq_msg *m, size_t *len);
void rw_zmq_msg_frames(const rw_zmq_msg *m, rw_sync_frames *out);
/* The sender's routing id (borrowed from the message): tells the clients of one ROUTER apart. */
const void *rw_zmq_msg_peer(const rw_zmq_msg *m, size_t *len);
/* The file descriptor of the connection the message came from (ZMQ_SRCFD; -1 over inproc or
 * when unknown): matched with a socket monitor's events to see a client's connection close. */
int rw_zmq_msg_srcfd(const rw_zmq_msg *m);
/* The sender's IP address as ZeroMQ reports it ("Peer-Address"; "" when unknown), for logs. */
const char *rw_zmq_msg_peer_addr(const rw_zmq_msg *m);
/* Sends a reply to the peer of `to`: routing id (+ delimiter), envelope (copied), and an
 * optional data frame whose ownership passes to ZeroMQ (freed with free()). */
rw_status rw_zmq_reply(void *router, const rw_zmq_msg *to, const void *env, size_t env_len,
                       rw_sync_out_frame *frame, rw_err *err);

#ifdef __cplusplus
}
#endif

#endif /* RW_MSG_H */
