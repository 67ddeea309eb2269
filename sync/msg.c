/* msg.c - reading the versioned msgpack control envelope: a bounded pre-scan that refuses hostile
 * input before msgpack-c allocates anything, request / reply decoders, the object view with typed
 * field readers that report unknown fields, and the JSON rendering of a value for clients. The
 * writer is msg_write.c. */
#include "sync_internal.h"

#include <inttypes.h>
#include <jansson.h>
#include <math.h>
#include <msgpack.h>
#include <stdlib.h>

/* Total array / map elements in one message. msgpack-c allocates one object (24 bytes, 48 per
 * map pair) per element, so this bounds the decoder's memory at about 100 MiB whatever the
 * bytes claim. */
#define RW_MSG_MAX_ELEMS (2u << 20)

/* msgpack-c's strings and bins point into the bytes they were decoded from, so a message keeps
 * its own copy of them. */
struct rw_msg {
    msgpack_unpacked up;
    void *bytes;
};

/* True when `k` is the string `key`. */
static bool key_is(const rw_mobj *k, const char *key) {
    size_t n = strlen(key);
    /* an empty string may come with a NULL pointer: memcmp must not see it */
    return k->type == MSGPACK_OBJECT_STR && k->via.str.size == n &&
           (n == 0 || memcmp(k->via.str.ptr, key, n) == 0);
}

void rw_msg_free(rw_msg *m) {
    if (!m) return;
    msgpack_unpacked_destroy(&m->up);
    free(m->bytes);
    free(m);
}

/* ------------------------------------------------------------------------------------------ */
/* Pre-scan                                                                                     */
/* ------------------------------------------------------------------------------------------ */
typedef struct scan_state {
    const uint8_t *p, *end;
    uint64_t elems;
    rw_err *err;
} scan_state;

static uint64_t be_read(const uint8_t *p, int n) {
    uint64_t v = 0;
    for (int i = 0; i < n; i++)
        v = (v << 8) | p[i];
    return v;
}

/* Consumes one value. Truncation is RW_E_FORMAT ("truncated") like every other defect: a
 * message arrives whole in one ZeroMQ frame, so there is no "need more" state. */
static rw_status scan_value(scan_state *s, int depth) {
    if (depth > RW_MSG_MAX_DEPTH)
        RW_FAIL(s->err, RW_E_FORMAT, "msgpack: nesting deeper than %d", RW_MSG_MAX_DEPTH);
    if (s->p >= s->end) RW_FAIL(s->err, RW_E_FORMAT, "msgpack: truncated (value expected)");
    uint8_t b = *s->p++;
    size_t left = (size_t)(s->end - s->p);
    uint64_t n = 0;
    int hdr = 0;
    enum { SCALAR, STR, ARR, MAP } kind = SCALAR;
    if (b <= 0x7f || b >= 0xe0 || b == 0xc0 || b == 0xc2 || b == 0xc3) return RW_OK;
    if (b >= 0x80 && b <= 0x8f) {
        kind = MAP;
        n = b & 0x0f;
    } else if (b >= 0x90 && b <= 0x9f) {
        kind = ARR;
        n = b & 0x0f;
    } else if (b >= 0xa0 && b <= 0xbf) {
        kind = STR;
        n = b & 0x1f;
    } else {
        switch (b) {
        case 0xc4:
        case 0xd9:
            kind = STR;
            hdr = 1;
            break;
        case 0xc5:
        case 0xda:
            kind = STR;
            hdr = 2;
            break;
        case 0xc6:
        case 0xdb:
            kind = STR;
            hdr = 4;
            break;
        case 0xca: hdr = -4; break;
        case 0xcb: hdr = -8; break;
        case 0xcc:
        case 0xd0: hdr = -1; break;
        case 0xcd:
        case 0xd1: hdr = -2; break;
        case 0xce:
        case 0xd2: hdr = -4; break;
        case 0xcf:
        case 0xd3: hdr = -8; break;
        case 0xdc:
            kind = ARR;
            hdr = 2;
            break;
        case 0xdd:
            kind = ARR;
            hdr = 4;
            break;
        case 0xde:
            kind = MAP;
            hdr = 2;
            break;
        case 0xdf:
            kind = MAP;
            hdr = 4;
            break;
        case 0xc1: RW_FAIL(s->err, RW_E_FORMAT, "msgpack: byte 0xc1 is never used");
        default: RW_FAIL(s->err, RW_E_FORMAT, "msgpack: ext types (0x%02x) are not accepted", b);
        }
    }
    if (hdr < 0) { /* fixed-size scalar payload */
        if (left < (size_t)-hdr) RW_FAIL(s->err, RW_E_FORMAT, "msgpack: truncated number");
        s->p += -hdr;
        return RW_OK;
    }
    if (hdr > 0) {
        if (left < (size_t)hdr) RW_FAIL(s->err, RW_E_FORMAT, "msgpack: truncated length");
        n = be_read(s->p, hdr);
        s->p += hdr;
        left -= (size_t)hdr;
    }
    if (kind == STR) {
        if (n > RW_MSG_MAX_STR)
            RW_FAIL(s->err, RW_E_FORMAT, "msgpack: string of %" PRIu64 " bytes (limit %u)", n,
                    RW_MSG_MAX_STR);
        if (n > left)
            RW_FAIL(s->err, RW_E_FORMAT,
                    "msgpack: truncated string (%" PRIu64 " bytes declared, %zu left)", n, left);
        s->p += n;
        return RW_OK;
    }
    uint64_t items = kind == MAP ? 2 * n : n;
    /* every element takes at least one byte: a count past the bytes left is a lie */
    if (items > left)
        RW_FAIL(s->err, RW_E_FORMAT,
                "msgpack: truncated %s (%" PRIu64 " elements declared, %zu bytes left)",
                kind == MAP ? "map" : "array", n, left);
    s->elems += n;
    if (s->elems > RW_MSG_MAX_ELEMS)
        RW_FAIL(s->err, RW_E_FORMAT, "msgpack: more than %u array/map elements in one message",
                RW_MSG_MAX_ELEMS);
    for (uint64_t i = 0; i < items; i++)
        RW_CHECK(scan_value(s, depth + 1));
    return RW_OK;
}

static rw_status decode_any(const void *buf, size_t len, rw_msg **out, rw_err *err) {
    *out = NULL;
    if (!buf || len == 0) RW_FAIL(err, RW_E_FORMAT, "msgpack: empty message");
    if (len > RW_MSG_MAX_BYTES)
        RW_FAIL(err, RW_E_RANGE, "msgpack: message of %zu bytes (limit %u)", len, RW_MSG_MAX_BYTES);
    scan_state s = {.p = buf, .end = (const uint8_t *)buf + len, .err = err};
    RW_CHECK(scan_value(&s, 0));
    if (s.p != s.end)
        RW_FAIL(err, RW_E_FORMAT, "msgpack: %zu trailing bytes after the message",
                (size_t)(s.end - s.p));
    rw_msg *m = calloc(1, sizeof *m);
    void *copy = malloc(len);
    if (!m || !copy) {
        free(m);
        free(copy);
        RW_FAIL(err, RW_E_OOM, "msgpack: out of memory");
    }
    memcpy(copy, buf, len);
    m->bytes = copy;
    msgpack_unpacked_init(&m->up);
    size_t off = 0;
    msgpack_unpack_return r = msgpack_unpack_next(&m->up, copy, len, &off);
    if (r != MSGPACK_UNPACK_SUCCESS || off != len) {
        rw_msg_free(m);
        RW_FAIL(err, r == MSGPACK_UNPACK_NOMEM_ERROR ? RW_E_OOM : RW_E_FORMAT,
                "msgpack: decoder refused the message (code %d)", (int)r);
    }
    *out = m;
    return RW_OK;
}

/* Reads a msgpack unsigned integer at p (fixint, uint8..64); its byte count, 0 when it is not
 * one. */
static size_t peek_uint(const uint8_t *p, size_t left, uint64_t *v) {
    if (!left) return 0;
    if (p[0] <= 0x7f) {
        *v = p[0];
        return 1;
    }
    static const int w[4] = {1, 2, 4, 8};
    if (p[0] < 0xcc || p[0] > 0xcf) return 0;
    const int n = w[p[0] - 0xcc];
    if (left < (size_t)n + 1) return 0;
    *v = be_read(p + 1, n);
    return (size_t)n + 1;
}

bool rw_msg_peek_id(const void *buf, size_t len, uint64_t *id) {
    const uint8_t *p = buf, *end = p + len;
    if (!buf || !len) return false;
    uint64_t pairs;
    if (*p >= 0x80 && *p <= 0x8f) {
        pairs = *p & 0x0f;
        p++;
    } else if (*p == 0xde && len >= 3) {
        pairs = be_read(p + 1, 2);
        p += 3;
    } else if (*p == 0xdf && len >= 5) {
        pairs = be_read(p + 1, 4);
        p += 5;
    } else {
        return false;
    }
    /* the small leading fields only: a value that is not a short string or a scalar ends it */
    for (uint64_t i = 0; i < pairs && i < 4 && p < end; i++) {
        if (*p < 0xa0 || *p > 0xbf) return false; /* keys: fixstr */
        const size_t kl = *p & 0x1f;
        if ((size_t)(end - p) < 1 + kl) return false;
        const bool is_id = kl == 2 && !memcmp(p + 1, "id", 2);
        p += 1 + kl;
        uint64_t v;
        size_t n = peek_uint(p, (size_t)(end - p), &v);
        if (is_id) {
            if (!n) return false;
            *id = v;
            return true;
        }
        if (n) {
            p += n;
        } else if (p < end && (*p == 0xc2 || *p == 0xc3)) {
            p++; /* ok: true / false */
        } else if (p < end && *p >= 0xa0 && *p <= 0xbf && (size_t)(end - p) > (size_t)(*p & 0x1f)) {
            p += 1 + (*p & 0x1f); /* cmd */
        } else {
            return false;
        }
    }
    return false;
}

rw_status rw_msg_decode_value(const void *buf, size_t len, rw_msg **out, const rw_mobj **val,
                              rw_err *err) {
    RW_CHECK(decode_any(buf, len, out, err));
    *val = &(*out)->up.data;
    return RW_OK;
}

static const msgpack_object empty_map = {.type = MSGPACK_OBJECT_MAP};

/* Reads `protocol` and `id` first (so error replies can carry the id) and checks the version. */
static rw_status envelope_common(const rw_mobj *root, uint64_t *id, bool *has_id, rw_err *err) {
    if (root->type != MSGPACK_OBJECT_MAP)
        RW_FAIL(err, RW_E_PROTOCOL, "envelope: expected a map, got %s",
                rw_mtype_str(rw_mobj_type(root)));
    const rw_mobj *idv = rw_mobj_get(root, "id");
    if (idv && idv->type == MSGPACK_OBJECT_POSITIVE_INTEGER) {
        *id = idv->via.u64;
        *has_id = true;
    }
    const rw_mobj *pv = rw_mobj_get(root, "protocol");
    if (!pv) RW_FAIL(err, RW_E_PROTOCOL, "envelope: missing field 'protocol'");
    uint64_t ver;
    RW_CHECK(rw_mobj_u64(pv, "envelope.protocol", &ver, err));
    if (ver != RW_PROTOCOL_VERSION)
        RW_FAIL(err, RW_E_PROTOCOL,
                "envelope: protocol version %" PRIu64 " is not supported (this side speaks %d)",
                ver, RW_PROTOCOL_VERSION);
    if (!idv) RW_FAIL(err, RW_E_PROTOCOL, "envelope: missing field 'id'");
    RW_CHECK(rw_mobj_u64(idv, "envelope.id", id, err));
    return RW_OK;
}

rw_status rw_msg_decode_request(const void *buf, size_t len, rw_msg **out, rw_request *req,
                                rw_err *err) {
    memset(req, 0, sizeof *req);
    *out = NULL;
    rw_msg *m;
    RW_CHECK(decode_any(buf, len, &m, err));
    const rw_mobj *root = &m->up.data;
    rw_status st;
    rw_mfields f;
    RW_CHECKGOTO(envelope_common(root, &req->id, &req->has_id, err), st, fail);
    RW_CHECKGOTO(rw_mfields_init(&f, root, "envelope", err), st, fail);
    rw_mfields_get(&f, "protocol");
    rw_mfields_get(&f, "id");
    const rw_mobj *cmd;
    RW_CHECKGOTO(rw_mfields_req(&f, "cmd", &cmd, err), st, fail);
    RW_CHECKGOTO(rw_mobj_strcpy(cmd, "envelope.cmd", req->cmd, sizeof req->cmd, err), st, fail);
    if (!req->cmd[0]) {
        st = RW_ERR(err, RW_E_PROTOCOL, "envelope.cmd: empty command name");
        goto fail;
    }
    const rw_mobj *args = rw_mfields_get(&f, "args");
    if (args && args->type != MSGPACK_OBJECT_MAP) {
        st = RW_ERR(err, RW_E_PROTOCOL, "envelope.args: expected a map, got %s",
                    rw_mtype_str(rw_mobj_type(args)));
        goto fail;
    }
    req->args = args ? args : &empty_map;
    RW_CHECKGOTO(rw_mfields_done(&f, err), st, fail);
    *out = m;
    return RW_OK;
fail:
    rw_msg_free(m);
    req->args = NULL;
    return st;
}

rw_status rw_request_take_args(rw_msg *m, rw_request *req, const char *const *keys, size_t n,
                               size_t *taken, rw_err *err) {
    if (taken) *taken = 0;
    const rw_mobj *a = req->args;
    if (!a || a->type != MSGPACK_OBJECT_MAP || !n) return RW_OK;
    uint32_t size = a->via.map.size, keep = 0;
    for (uint32_t i = 0; i < size; i++) {
        bool drop = false;
        for (size_t j = 0; j < n && !drop; j++)
            drop = key_is(&a->via.map.ptr[i].key, keys[j]);
        keep += !drop;
    }
    if (keep == size) return RW_OK;
    /* a new map object over the same keys and values, in the message's own zone */
    msgpack_object *view = msgpack_zone_malloc(m->up.zone, sizeof *view);
    msgpack_object_kv *kv =
        keep ? msgpack_zone_malloc(m->up.zone, sizeof *kv * (size_t)keep) : NULL;
    if (!view || (keep && !kv)) RW_FAIL(err, RW_E_OOM, "request: out of memory");
    uint32_t k = 0;
    for (uint32_t i = 0; i < size; i++) {
        bool drop = false;
        for (size_t j = 0; j < n && !drop; j++)
            drop = key_is(&a->via.map.ptr[i].key, keys[j]);
        if (!drop) kv[k++] = a->via.map.ptr[i];
    }
    view->type = MSGPACK_OBJECT_MAP;
    view->via.map.size = keep;
    view->via.map.ptr = kv;
    req->args = view;
    if (taken) *taken = size - keep;
    return RW_OK;
}

rw_status rw_msg_decode_reply(const void *buf, size_t len, rw_msg **out, rw_reply *rep,
                              rw_err *err) {
    memset(rep, 0, sizeof *rep);
    *out = NULL;
    rw_msg *m;
    RW_CHECK(decode_any(buf, len, &m, err));
    const rw_mobj *root = &m->up.data;
    rw_status st;
    bool has_id = false;
    rw_mfields f;
    RW_CHECKGOTO(envelope_common(root, &rep->id, &has_id, err), st, fail);
    RW_CHECKGOTO(rw_mfields_init(&f, root, "reply", err), st, fail);
    rw_mfields_get(&f, "protocol");
    rw_mfields_get(&f, "id");
    const rw_mobj *ok;
    RW_CHECKGOTO(rw_mfields_req(&f, "ok", &ok, err), st, fail);
    RW_CHECKGOTO(rw_mobj_bool(ok, "reply.ok", &rep->ok, err), st, fail);
    if (rep->ok) {
        static const msgpack_object nil = {.type = MSGPACK_OBJECT_NIL};
        const rw_mobj *res = rw_mfields_get(&f, "result");
        rep->result = res ? res : &nil;
    } else {
        const rw_mobj *e;
        RW_CHECKGOTO(rw_mfields_req(&f, "error", &e, err), st, fail);
        rw_mfields ef;
        RW_CHECKGOTO(rw_mfields_init(&ef, e, "reply.error", err), st, fail);
        uint64_t code;
        char name[64];
        const rw_mobj *cv;
        RW_CHECKGOTO(rw_mfields_req(&ef, "code", &cv, err), st, fail);
        RW_CHECKGOTO(rw_mobj_u64(cv, "reply.error.code", &code, err), st, fail);
        RW_CHECKGOTO(rw_mfields_str(&ef, "status", "", name, sizeof name, err), st, fail);
        RW_CHECKGOTO(rw_mfields_str(&ef, "message", "", rep->message, sizeof rep->message, err), st,
                     fail);
        RW_CHECKGOTO(rw_mfields_done(&ef, err), st, fail);
        if (code == 0) {
            st = RW_ERR(err, RW_E_PROTOCOL, "reply.error.code: 0 (ok) in an error reply");
            goto fail;
        }
        /* a code this side does not know (a newer peer) keeps its name in the message */
        if (code > RW_E_RANGE) {
            char tmp[sizeof rep->message];
            snprintf(tmp, sizeof tmp, "[%s %" PRIu64 "] %s", name, code, rep->message);
            memcpy(rep->message, tmp, sizeof tmp);
            rep->status = RW_E_PROTOCOL;
        } else {
            rep->status = (rw_status)code;
        }
    }
    RW_CHECKGOTO(rw_mfields_done(&f, err), st, fail);
    *out = m;
    return RW_OK;
fail:
    rw_msg_free(m);
    return st;
}

/* ------------------------------------------------------------------------------------------ */
/* Object view                                                                                  */
/* ------------------------------------------------------------------------------------------ */
rw_mtype rw_mobj_type(const rw_mobj *o) {
    if (!o) return RW_M_NIL;
    switch (o->type) {
    case MSGPACK_OBJECT_NIL: return RW_M_NIL;
    case MSGPACK_OBJECT_BOOLEAN: return RW_M_BOOL;
    case MSGPACK_OBJECT_POSITIVE_INTEGER: return RW_M_UINT;
    case MSGPACK_OBJECT_NEGATIVE_INTEGER: return RW_M_INT;
    case MSGPACK_OBJECT_FLOAT32:
    case MSGPACK_OBJECT_FLOAT64: return RW_M_FLOAT;
    case MSGPACK_OBJECT_STR: return RW_M_STR;
    case MSGPACK_OBJECT_BIN: return RW_M_BIN;
    case MSGPACK_OBJECT_ARRAY: return RW_M_ARRAY;
    case MSGPACK_OBJECT_MAP: return RW_M_MAP;
    default: return RW_M_OTHER;
    }
}

const char *rw_mtype_str(rw_mtype t) {
    switch (t) {
    case RW_M_NIL: return "nil";
    case RW_M_BOOL: return "bool";
    case RW_M_UINT: return "unsigned integer";
    case RW_M_INT: return "negative integer";
    case RW_M_FLOAT: return "float";
    case RW_M_STR: return "string";
    case RW_M_BIN: return "bin";
    case RW_M_ARRAY: return "array";
    case RW_M_MAP: return "map";
    default: return "other";
    }
}

size_t rw_mobj_len(const rw_mobj *o) {
    if (!o) return 0;
    switch (o->type) {
    case MSGPACK_OBJECT_ARRAY: return o->via.array.size;
    case MSGPACK_OBJECT_MAP: return o->via.map.size;
    case MSGPACK_OBJECT_STR: return o->via.str.size;
    case MSGPACK_OBJECT_BIN: return o->via.bin.size;
    default: return 0;
    }
}

const rw_mobj *rw_mobj_at(const rw_mobj *a, size_t i) {
    if (!a || a->type != MSGPACK_OBJECT_ARRAY || i >= a->via.array.size) return NULL;
    return &a->via.array.ptr[i];
}
const rw_mobj *rw_mobj_key_at(const rw_mobj *m, size_t i) {
    if (!m || m->type != MSGPACK_OBJECT_MAP || i >= m->via.map.size) return NULL;
    return &m->via.map.ptr[i].key;
}
const rw_mobj *rw_mobj_val_at(const rw_mobj *m, size_t i) {
    if (!m || m->type != MSGPACK_OBJECT_MAP || i >= m->via.map.size) return NULL;
    return &m->via.map.ptr[i].val;
}

const rw_mobj *rw_mobj_get(const rw_mobj *m, const char *key) {
    if (!m || m->type != MSGPACK_OBJECT_MAP) return NULL;
    for (uint32_t i = 0; i < m->via.map.size; i++)
        if (key_is(&m->via.map.ptr[i].key, key)) return &m->via.map.ptr[i].val;
    return NULL;
}

bool rw_mobj_is_str(const rw_mobj *o, const char *s) {
    return o && key_is(o, s);
}

#define TYPE_FAIL(err, what, want, o)                                                              \
    RW_FAIL(err, RW_E_PROTOCOL, "%s: expected %s, got %s", (what), (want),                         \
            rw_mtype_str(rw_mobj_type(o)))

rw_status rw_mobj_u64(const rw_mobj *o, const char *what, uint64_t *out, rw_err *err) {
    if (!o) RW_FAIL(err, RW_E_PROTOCOL, "%s: missing", what);
    if (o->type == MSGPACK_OBJECT_NEGATIVE_INTEGER)
        RW_FAIL(err, RW_E_RANGE, "%s: %" PRId64 " is negative", what, o->via.i64);
    if (o->type != MSGPACK_OBJECT_POSITIVE_INTEGER) TYPE_FAIL(err, what, "an unsigned integer", o);
    *out = o->via.u64;
    return RW_OK;
}

rw_status rw_mobj_i64(const rw_mobj *o, const char *what, int64_t *out, rw_err *err) {
    if (!o) RW_FAIL(err, RW_E_PROTOCOL, "%s: missing", what);
    if (o->type == MSGPACK_OBJECT_NEGATIVE_INTEGER) {
        *out = o->via.i64;
        return RW_OK;
    }
    if (o->type != MSGPACK_OBJECT_POSITIVE_INTEGER) TYPE_FAIL(err, what, "an integer", o);
    if (o->via.u64 > (uint64_t)INT64_MAX)
        RW_FAIL(err, RW_E_RANGE, "%s: %" PRIu64 " does not fit int64", what, o->via.u64);
    *out = (int64_t)o->via.u64;
    return RW_OK;
}

rw_status rw_mobj_f64(const rw_mobj *o, const char *what, double *out, rw_err *err) {
    if (!o) RW_FAIL(err, RW_E_PROTOCOL, "%s: missing", what);
    switch (o->type) {
    case MSGPACK_OBJECT_FLOAT32:
    case MSGPACK_OBJECT_FLOAT64: *out = o->via.f64; return RW_OK;
    case MSGPACK_OBJECT_POSITIVE_INTEGER: *out = (double)o->via.u64; return RW_OK;
    case MSGPACK_OBJECT_NEGATIVE_INTEGER: *out = (double)o->via.i64; return RW_OK;
    default: TYPE_FAIL(err, what, "a number", o);
    }
}

rw_status rw_mobj_bool(const rw_mobj *o, const char *what, bool *out, rw_err *err) {
    if (!o) RW_FAIL(err, RW_E_PROTOCOL, "%s: missing", what);
    if (o->type != MSGPACK_OBJECT_BOOLEAN) TYPE_FAIL(err, what, "a bool", o);
    *out = o->via.boolean;
    return RW_OK;
}

rw_status rw_mobj_str(const rw_mobj *o, const char *what, const char **ptr, size_t *len,
                      rw_err *err) {
    if (!o) RW_FAIL(err, RW_E_PROTOCOL, "%s: missing", what);
    if (o->type != MSGPACK_OBJECT_STR) TYPE_FAIL(err, what, "a string", o);
    *ptr = o->via.str.ptr;
    *len = o->via.str.size;
    return RW_OK;
}

rw_status rw_mobj_strcpy(const rw_mobj *o, const char *what, char *dst, size_t cap, rw_err *err) {
    const char *p;
    size_t n;
    RW_CHECK(rw_mobj_str(o, what, &p, &n, err));
    if (n >= cap) RW_FAIL(err, RW_E_RANGE, "%s: string of %zu bytes (limit %zu)", what, n, cap - 1);
    if (n && memchr(p, 0, n)) RW_FAIL(err, RW_E_PROTOCOL, "%s: string contains a NUL byte", what);
    if (n) memcpy(dst, p, n);
    dst[n] = 0;
    return RW_OK;
}

rw_status rw_mobj_bin(const rw_mobj *o, const char *what, const void **ptr, size_t *len,
                      rw_err *err) {
    if (!o) RW_FAIL(err, RW_E_PROTOCOL, "%s: missing", what);
    if (o->type != MSGPACK_OBJECT_BIN) TYPE_FAIL(err, what, "bin", o);
    *ptr = o->via.bin.ptr;
    *len = o->via.bin.size;
    return RW_OK;
}

rw_status rw_mobj_i64_array(const rw_mobj *o, const char *what, int64_t lo, int64_t hi,
                            int64_t *dst, size_t cap, size_t *n, rw_err *err) {
    if (!o) RW_FAIL(err, RW_E_PROTOCOL, "%s: missing", what);
    if (o->type != MSGPACK_OBJECT_ARRAY) TYPE_FAIL(err, what, "an array", o);
    size_t len = o->via.array.size;
    if (len > cap) RW_FAIL(err, RW_E_RANGE, "%s: %zu elements (limit %zu)", what, len, cap);
    for (size_t i = 0; i < len; i++) {
        char w[128];
        snprintf(w, sizeof w, "%s[%zu]", what, i);
        int64_t v;
        RW_CHECK(rw_mobj_i64(&o->via.array.ptr[i], w, &v, err));
        if (v < lo || v > hi)
            RW_FAIL(err, RW_E_RANGE, "%s: %" PRId64 " outside [%" PRId64 ", %" PRId64 "]", w, v, lo,
                    hi);
        dst[i] = v;
    }
    *n = len;
    return RW_OK;
}

/* --- JSON conversion ------------------------------------------------------------------------ */
static rw_status to_json(const rw_mobj *o, json_t **out, int depth, rw_err *err) {
    *out = NULL;
    if (depth > RW_MSG_MAX_DEPTH) RW_FAIL(err, RW_E_FORMAT, "to JSON: nesting too deep");
    json_t *j = NULL;
    switch (o->type) {
    case MSGPACK_OBJECT_NIL: j = json_null(); break;
    case MSGPACK_OBJECT_BOOLEAN: j = json_boolean(o->via.boolean); break;
    case MSGPACK_OBJECT_POSITIVE_INTEGER:
        if (o->via.u64 > (uint64_t)INT64_MAX)
            RW_FAIL(err, RW_E_RANGE, "to JSON: integer %" PRIu64 " does not fit int64", o->via.u64);
        j = json_integer((json_int_t)o->via.u64);
        break;
    case MSGPACK_OBJECT_NEGATIVE_INTEGER: j = json_integer((json_int_t)o->via.i64); break;
    case MSGPACK_OBJECT_FLOAT32:
    case MSGPACK_OBJECT_FLOAT64:
        if (!isfinite(o->via.f64))
            RW_FAIL(err, RW_E_RANGE, "to JSON: non-finite number %g", o->via.f64);
        j = json_real(o->via.f64);
        break;
    case MSGPACK_OBJECT_STR:
        /* JSON text is UTF-8: jansson refuses other bytes (json_dumps would fail later and the
         * failure would read as out of memory) */
        /* msgpack-c may give an empty string a NULL pointer, which jansson refuses */
        j = o->via.str.size ? json_stringn(o->via.str.ptr, o->via.str.size) : json_string("");
        if (!j) RW_FAIL(err, RW_E_FORMAT, "to JSON: a string is not valid UTF-8");
        break;
    case MSGPACK_OBJECT_ARRAY:
        j = json_array();
        for (uint32_t i = 0; j && i < o->via.array.size; i++) {
            json_t *e;
            rw_status st = to_json(&o->via.array.ptr[i], &e, depth + 1, err);
            if (st != RW_OK) {
                json_decref(j);
                return st;
            }
            json_array_append_new(j, e);
        }
        break;
    case MSGPACK_OBJECT_MAP:
        j = json_object();
        for (uint32_t i = 0; j && i < o->via.map.size; i++) {
            const msgpack_object *k = &o->via.map.ptr[i].key;
            if (k->type != MSGPACK_OBJECT_STR) {
                json_decref(j);
                RW_FAIL(err, RW_E_PROTOCOL, "to JSON: map key of type %s (strings only)",
                        rw_mtype_str(rw_mobj_type(k)));
            }
            char key[256];
            if (k->via.str.size >= sizeof key ||
                (k->via.str.size && memchr(k->via.str.ptr, 0, k->via.str.size))) {
                json_decref(j);
                RW_FAIL(err, RW_E_PROTOCOL, "to JSON: map key too long or with a NUL byte");
            }
            if (k->via.str.size) memcpy(key, k->via.str.ptr, k->via.str.size);
            key[k->via.str.size] = 0;
            json_t *e;
            rw_status st = to_json(&o->via.map.ptr[i].val, &e, depth + 1, err);
            if (st != RW_OK) {
                json_decref(j);
                return st;
            }
            if (json_object_set_new(j, key, e) != 0) {
                json_decref(j);
                RW_FAIL(err, RW_E_FORMAT, "to JSON: a map key is not valid UTF-8");
            }
        }
        break;
    default:
        RW_FAIL(err, RW_E_PROTOCOL, "to JSON: %s values cannot be shown as JSON",
                rw_mtype_str(rw_mobj_type(o)));
    }
    if (!j) RW_FAIL(err, RW_E_OOM, "to JSON: out of memory");
    *out = j;
    return RW_OK;
}

rw_status rw_mobj_to_jansson(const rw_mobj *o, json_t **out, rw_err *err) {
    return to_json(o, out, 0, err);
}

rw_status rw_mobj_to_json(const rw_mobj *o, char **out, rw_err *err) {
    *out = NULL;
    json_t *j;
    RW_CHECK(to_json(o, &j, 0, err));
    *out = json_dumps(j, JSON_COMPACT | JSON_ENCODE_ANY);
    json_decref(j);
    if (!*out) RW_FAIL(err, RW_E_OOM, "to JSON: out of memory");
    return RW_OK;
}

/* ------------------------------------------------------------------------------------------ */
/* Field reader                                                                                 */
/* ------------------------------------------------------------------------------------------ */
rw_status rw_mfields_init(rw_mfields *f, const rw_mobj *map, const char *what, rw_err *err) {
    memset(f, 0, sizeof *f);
    rw_sync_strlcpy(f->what, what, sizeof f->what);
    if (!map || map->type != MSGPACK_OBJECT_MAP)
        RW_FAIL(err, RW_E_PROTOCOL, "%s: expected a map, got %s", what,
                rw_mtype_str(rw_mobj_type(map)));
    uint32_t n = map->via.map.size;
    if (n > RW_MSG_MAX_KEYS)
        RW_FAIL(err, RW_E_PROTOCOL, "%s: %u keys (limit %d)", what, n, RW_MSG_MAX_KEYS);
    for (uint32_t i = 0; i < n; i++) {
        const msgpack_object *k = &map->via.map.ptr[i].key;
        if (k->type != MSGPACK_OBJECT_STR)
            RW_FAIL(err, RW_E_PROTOCOL, "%s: key %u is a %s (keys are strings)", what, i,
                    rw_mtype_str(rw_mobj_type(k)));
        for (uint32_t j = 0; j < i; j++) {
            const msgpack_object *q = &map->via.map.ptr[j].key;
            if (q->via.str.size == k->via.str.size &&
                (k->via.str.size == 0 ||
                 memcmp(q->via.str.ptr, k->via.str.ptr, k->via.str.size) == 0))
                RW_FAIL(err, RW_E_PROTOCOL, "%s: duplicate key '%.*s'", what,
                        (int)(k->via.str.size > 64 ? 64 : k->via.str.size), k->via.str.ptr);
        }
    }
    f->map = map;
    return RW_OK;
}

const rw_mobj *rw_mfields_get(rw_mfields *f, const char *key) {
    if (!f->map) return NULL;
    for (uint32_t i = 0; i < f->map->via.map.size; i++)
        if (key_is(&f->map->via.map.ptr[i].key, key)) {
            f->used[i / 64] |= 1ull << (i % 64);
            const rw_mobj *v = &f->map->via.map.ptr[i].val;
            return v->type == MSGPACK_OBJECT_NIL ? NULL : v;
        }
    return NULL;
}

rw_status rw_mfields_req(rw_mfields *f, const char *key, const rw_mobj **out, rw_err *err) {
    *out = rw_mfields_get(f, key);
    if (!*out) RW_FAIL(err, RW_E_PROTOCOL, "%s.%s: missing", f->what, key);
    return RW_OK;
}

static void field_name(const rw_mfields *f, const char *key, char *buf, size_t cap) {
    snprintf(buf, cap, "%s.%s", f->what, key);
}

rw_status rw_mfields_u64(rw_mfields *f, const char *key, uint64_t def, uint64_t *out, rw_err *err) {
    const rw_mobj *v = rw_mfields_get(f, key);
    if (!v) {
        *out = def;
        return RW_OK;
    }
    char w[128];
    field_name(f, key, w, sizeof w);
    return rw_mobj_u64(v, w, out, err);
}

rw_status rw_mfields_f64(rw_mfields *f, const char *key, double def, double *out, rw_err *err) {
    const rw_mobj *v = rw_mfields_get(f, key);
    if (!v) {
        *out = def;
        return RW_OK;
    }
    char w[128];
    field_name(f, key, w, sizeof w);
    RW_CHECK(rw_mobj_f64(v, w, out, err));
    if (!isfinite(*out)) RW_FAIL(err, RW_E_RANGE, "%s: not a finite number", w);
    return RW_OK;
}

rw_status rw_mfields_bool(rw_mfields *f, const char *key, bool def, bool *out, rw_err *err) {
    const rw_mobj *v = rw_mfields_get(f, key);
    if (!v) {
        *out = def;
        return RW_OK;
    }
    char w[128];
    field_name(f, key, w, sizeof w);
    return rw_mobj_bool(v, w, out, err);
}

rw_status rw_mfields_str(rw_mfields *f, const char *key, const char *def, char *dst, size_t cap,
                         rw_err *err) {
    const rw_mobj *v = rw_mfields_get(f, key);
    if (!v) {
        rw_sync_strlcpy(dst, def ? def : "", cap);
        return RW_OK;
    }
    char w[128];
    field_name(f, key, w, sizeof w);
    return rw_mobj_strcpy(v, w, dst, cap, err);
}

rw_status rw_mfields_done(const rw_mfields *f, rw_err *err) {
    if (!f->map) return RW_OK;
    for (uint32_t i = 0; i < f->map->via.map.size; i++)
        if (!(f->used[i / 64] & (1ull << (i % 64)))) {
            const msgpack_object *k = &f->map->via.map.ptr[i].key;
            RW_FAIL(err, RW_E_PROTOCOL, "%s: unknown field '%.*s'", f->what,
                    (int)(k->via.str.size > 64 ? 64 : k->via.str.size), k->via.str.ptr);
        }
    return RW_OK;
}

rw_status rw_mfields_none(const rw_mobj *map, const char *what, rw_err *err) {
    rw_mfields f;
    RW_CHECK(rw_mfields_init(&f, map, what, err));
    return rw_mfields_done(&f, err);
}
