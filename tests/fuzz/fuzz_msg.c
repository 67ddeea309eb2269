/* fuzz_msg.c - the control-message decoders over arbitrary bytes: rw_msg_decode_request,
 * rw_msg_decode_reply and rw_msg_decode_value, then every accessor of the object view, the field
 * reader, JSON conversion and re-encoding on what they accepted.
 *
 * Contract checked (rw_sync.h):
 * - a refusal carries its status and message and returns no message handle;
 * - "*out owns the memory that req/rep point into": the input is a private copy that is
 *   overwritten and freed before anything decoded is read (ASan reports a borrowed pointer);
 * - accessors agree with rw_mobj_type (a UINT reads as u64, a STR's bytes are rw_mobj_len long,
 *   strcpy refuses exactly the too-long and NUL-holding strings, ...);
 * - rw_mfields_init refuses exactly the maps with more than RW_MSG_MAX_KEYS keys, a non-string
 *   key or a duplicate key; rw_mfields_done refuses exactly the maps with a key never read;
 * - re-encoding an accepted value (rw_mw_obj) decodes again and is stable on the second pass;
 *   JSON conversion, when it succeeds, is stable through rw_mw_json and back;
 * - an accepted request / reply rebuilt with the writer decodes to the same id, command, status
 *   and message; an error message that is not valid UTF-8 comes back repaired (valid UTF-8, each
 *   bad byte U+FFFD: protocol 2 replies are valid UTF-8 everywhere);
 * - rw_msg_peek_id, on any bytes, finds either nothing or the id the reply decoder reads;
 * - a generate result part (`more: true`, protocol 2) joins with the client's joiner into JSON
 *   that parses, with no `more` key left. */
#include "fuzz_util.h"

#include <math.h>
#include <string.h>

#include <jansson.h>

#include "client_internal.h" /* the client's joiner of generate parts */
#include "rw_sync.h"

static void *dup_bytes(const void *p, size_t n) {
    void *b = malloc(n ? n : 1);
    FUZZ_CHECK(b != NULL, "out of memory");
    if (n) memcpy(b, p, n);
    return b;
}

/* Frees a private input copy after scribbling over it, so stale reads see garbage too. */
static void burn(void *copy, size_t n) {
    if (n) memset(copy, 0xa5, n);
    free(copy);
}

static void check_map_fields(const rw_mobj *o) {
    size_t n = rw_mobj_len(o);
    bool str_keys = true, dup = false;
    for (size_t i = 0; i < n; i++) {
        const rw_mobj *k = rw_mobj_key_at(o, i);
        if (rw_mobj_type(k) != RW_M_STR) {
            str_keys = false;
            continue;
        }
        const char *kp;
        size_t kl;
        FUZZ_CHECK(rw_mobj_str(k, "key", &kp, &kl, NULL) == RW_OK, "a string key is unreadable");
        for (size_t j = 0; j < i; j++) {
            const rw_mobj *q = rw_mobj_key_at(o, j);
            const char *qp;
            size_t ql;
            if (rw_mobj_type(q) == RW_M_STR && rw_mobj_str(q, "key", &qp, &ql, NULL) == RW_OK &&
                ql == kl && (kl == 0 || !memcmp(qp, kp, kl)))
                dup = true;
        }
    }
    rw_mfields f;
    rw_err e;
    memset(&e, 0, sizeof e);
    rw_status st = rw_mfields_init(&f, o, "fuzz", &e);
    bool want_ok = n <= RW_MSG_MAX_KEYS && str_keys && !dup;
    FUZZ_CHECK((st == RW_OK) == want_ok, "rw_mfields_init: %s for %zu keys (strings %d, dup %d)",
               rw_status_str(st), n, str_keys, dup);
    if (st != RW_OK) {
        FUZZ_CHECK_REFUSAL(st, e);
        return;
    }
    /* nothing read yet: done refuses a non-empty map */
    st = rw_mfields_done(&f, &e);
    FUZZ_CHECK((st == RW_OK) == (n == 0), "done with no key read: %s", rw_status_str(st));
    /* read every key (C strings stop at a NUL: such keys stay unread) */
    bool all_read = true;
    for (size_t i = 0; i < n; i++) {
        const char *kp;
        size_t kl;
        rw_mobj_str(rw_mobj_key_at(o, i), "key", &kp, &kl, NULL);
        char key[300];
        if (kl >= sizeof key || (kl && memchr(kp, 0, kl))) {
            all_read = false;
            continue;
        }
        if (kl) memcpy(key, kp, kl);
        key[kl] = 0;
        const rw_mobj *v = rw_mfields_get(&f, key);
        const rw_mobj *raw = rw_mobj_val_at(o, i);
        FUZZ_CHECK(v == (rw_mobj_type(raw) == RW_M_NIL ? NULL : raw),
                   "rw_mfields_get('%s') returned another value", key);
        FUZZ_CHECK(rw_mobj_get(o, key) == raw, "rw_mobj_get('%s') returned another value", key);
    }
    st = rw_mfields_done(&f, &e);
    FUZZ_CHECK((st == RW_OK) == all_read, "done after reading every key: %s", rw_status_str(st));
}

static void walk(const rw_mobj *o, int depth) {
    FUZZ_CHECK(depth <= RW_MSG_MAX_DEPTH + 1, "value nested %d deep", depth);
    rw_mtype t = rw_mobj_type(o);
    FUZZ_CHECK(t != RW_M_OTHER, "a value of type 'other' was accepted (ext types are refused)");
    uint64_t u;
    int64_t i;
    double d;
    bool b;
    const char *sp;
    const void *bp;
    size_t len;
    FUZZ_CHECK((rw_mobj_u64(o, "v", &u, NULL) == RW_OK) == (t == RW_M_UINT), "u64 on %s",
               rw_mtype_str(t));
    if (t == RW_M_INT) FUZZ_CHECK(rw_mobj_i64(o, "v", &i, NULL) == RW_OK && i < 0, "negative");
    if (t == RW_M_UINT)
        FUZZ_CHECK((rw_mobj_i64(o, "v", &i, NULL) == RW_OK) == (u <= (uint64_t)INT64_MAX),
                   "i64 of %llu", (unsigned long long)u);
    FUZZ_CHECK((rw_mobj_f64(o, "v", &d, NULL) == RW_OK) ==
                   (t == RW_M_UINT || t == RW_M_INT || t == RW_M_FLOAT),
               "f64 on %s", rw_mtype_str(t));
    FUZZ_CHECK((rw_mobj_bool(o, "v", &b, NULL) == RW_OK) == (t == RW_M_BOOL), "bool on %s",
               rw_mtype_str(t));
    FUZZ_CHECK((rw_mobj_bin(o, "v", &bp, &len, NULL) == RW_OK) == (t == RW_M_BIN), "bin on %s",
               rw_mtype_str(t));
    uint64_t sum = 0;
    if (t == RW_M_BIN) {
        FUZZ_CHECK(len == rw_mobj_len(o) && len <= RW_MSG_MAX_STR, "bin of %zu bytes", len);
        for (size_t k = 0; k < len; k++)
            sum += ((const uint8_t *)bp)[k];
    }
    FUZZ_CHECK((rw_mobj_str(o, "v", &sp, &len, NULL) == RW_OK) == (t == RW_M_STR), "str on %s",
               rw_mtype_str(t));
    if (t == RW_M_STR) {
        FUZZ_CHECK(len == rw_mobj_len(o) && len <= RW_MSG_MAX_STR, "str of %zu bytes", len);
        for (size_t k = 0; k < len; k++)
            sum += (uint8_t)sp[k];
        char small[64];
        rw_err e;
        memset(&e, 0, sizeof e);
        rw_status st = rw_mobj_strcpy(o, "v", small, sizeof small, &e);
        bool want = len < sizeof small && (len == 0 || !memchr(sp, 0, len));
        FUZZ_CHECK((st == RW_OK) == want, "strcpy of %zu bytes: %s", len, rw_status_str(st));
        if (st == RW_OK)
            FUZZ_CHECK(strlen(small) == len && (len == 0 || !memcmp(small, sp, len)),
                       "strcpy copied wrong");
        else
            FUZZ_CHECK_REFUSAL(st, e);
    }
    volatile uint64_t sink = sum;
    (void)sink;
    if (t == RW_M_ARRAY) {
        size_t n = rw_mobj_len(o);
        for (size_t k = 0; k < n; k++)
            walk(rw_mobj_at(o, k), depth + 1);
        FUZZ_CHECK(rw_mobj_at(o, n) == NULL, "rw_mobj_at past the end");
        /* the integer-array reader agrees with the elements */
        int64_t ints[8];
        size_t got = 0;
        rw_status st = rw_mobj_i64_array(o, "a", INT64_MIN, INT64_MAX, ints, 8, &got, NULL);
        bool want = n <= 8;
        for (size_t k = 0; want && k < n; k++)
            want = rw_mobj_i64(rw_mobj_at(o, k), "e", &i, NULL) == RW_OK;
        FUZZ_CHECK((st == RW_OK) == want, "i64_array over %zu elements: %s", n, rw_status_str(st));
        if (st == RW_OK) FUZZ_CHECK(got == n, "i64_array read %zu of %zu", got, n);
    } else if (t == RW_M_MAP) {
        size_t n = rw_mobj_len(o);
        for (size_t k = 0; k < n; k++) {
            walk(rw_mobj_key_at(o, k), depth + 1);
            walk(rw_mobj_val_at(o, k), depth + 1);
        }
        FUZZ_CHECK(rw_mobj_key_at(o, n) == NULL && rw_mobj_val_at(o, n) == NULL,
                   "map access past the end");
        check_map_fields(o);
    } else {
        FUZZ_CHECK(rw_mobj_at(o, 0) == NULL && rw_mobj_get(o, "id") == NULL,
                   "element access on a %s", rw_mtype_str(t));
    }
}

/* Encodes `o` with the writer into a malloc'd buffer. */
static void *encode(const rw_mobj *o, size_t *len) {
    rw_mw *w;
    FUZZ_CHECK(rw_mw_create(&w, NULL) == RW_OK, "writer");
    rw_mw_obj(w, o);
    void *p;
    FUZZ_CHECK(rw_mw_take(w, &p, len, NULL) == RW_OK, "writer failed");
    rw_mw_destroy(w);
    return p;
}

/* True when a string (value or key) anywhere in `o` holds a NUL byte: JSON text can carry it as
 * \u0000, but rw_mw_json refuses that escape (JSON_ALLOW_NUL is off on purpose). */
static bool has_nul(const rw_mobj *o) {
    const char *p;
    size_t n;
    if (rw_mobj_str(o, "v", &p, &n, NULL) == RW_OK) return n && memchr(p, 0, n);
    size_t len = rw_mobj_len(o);
    if (rw_mobj_type(o) == RW_M_ARRAY)
        for (size_t i = 0; i < len; i++)
            if (has_nul(rw_mobj_at(o, i))) return true;
    if (rw_mobj_type(o) == RW_M_MAP)
        for (size_t i = 0; i < len; i++)
            if (has_nul(rw_mobj_key_at(o, i)) || has_nul(rw_mobj_val_at(o, i))) return true;
    return false;
}

/* Re-encoding and JSON conversion of an accepted value. */
static void round_trips(const rw_mobj *o) {
    size_t l1, l2;
    void *b1 = encode(o, &l1);
    rw_msg *m1;
    const rw_mobj *v1;
    rw_err e;
    memset(&e, 0, sizeof e);
    rw_status st = rw_msg_decode_value(b1, l1, &m1, &v1, &e);
    FUZZ_CHECK(st == RW_OK, "a re-encoded value is refused: %s", e.msg);
    void *b2 = encode(v1, &l2);
    FUZZ_CHECK(l1 == l2 && !memcmp(b1, b2, l1), "re-encoding is not stable (%zu vs %zu bytes)", l1,
               l2);
    free(b2);
    free(b1);

    char *j1 = NULL;
    st = rw_mobj_to_json(v1, &j1, &e);
    if (st == RW_OK) {
        rw_mw *w;
        FUZZ_CHECK(rw_mw_create(&w, NULL) == RW_OK, "writer");
        st = rw_mw_json(w, j1, &e);
        if (st != RW_OK) {
            FUZZ_CHECK(has_nul(v1), "the JSON form does not load back: %s (%s)", e.msg, j1);
            FUZZ_CHECK_REFUSAL(st, e);
            rw_mw_destroy(w);
            free(j1);
            rw_msg_free(m1);
            return;
        }
        const void *p;
        size_t n;
        FUZZ_CHECK(rw_mw_finish(w, &p, &n, NULL) == RW_OK, "writer failed");
        rw_msg *m2;
        const rw_mobj *v2;
        st = rw_msg_decode_value(p, n, &m2, &v2, &e);
        FUZZ_CHECK(st == RW_OK, "JSON -> msgpack is refused: %s (%s)", e.msg, j1);
        char *j2 = NULL;
        FUZZ_CHECK(rw_mobj_to_json(v2, &j2, &e) == RW_OK, "JSON -> msgpack -> JSON: %s", e.msg);
        FUZZ_CHECK(!strcmp(j1, j2), "JSON conversion is not stable:\n%s\n%s", j1, j2);
        free(j2);
        rw_msg_free(m2);
        rw_mw_destroy(w);
        free(j1);
    } else {
        FUZZ_CHECK_REFUSAL(st, e);
        /* nothing here runs out of memory: an OOM status would name the wrong cause */
        FUZZ_CHECK(st != RW_E_OOM, "to JSON reported out of memory: %s", e.msg);
        FUZZ_CHECK(j1 == NULL, "a failed conversion returned text");
    }
    rw_msg_free(m1);
}

/* The envelope decoders behind one signature. */
typedef rw_status (*decode_fn)(const void *buf, size_t len, rw_msg **out, void *env, rw_err *err);
static rw_status decode_request(const void *buf, size_t len, rw_msg **out, void *env, rw_err *err) {
    return rw_msg_decode_request(buf, len, out, env, err);
}
static rw_status decode_reply(const void *buf, size_t len, rw_msg **out, void *env, rw_err *err) {
    return rw_msg_decode_reply(buf, len, out, env, err);
}

/* Decodes a copy of the input with `decode`, then burns the copy (nothing decoded may point into
 * it). Returns the message, or NULL after checking that a refusal returned no handle and a
 * status of a refusal. */
static rw_msg *decode_copy(const uint8_t *data, size_t size, decode_fn decode, void *env,
                           const char *what) {
    void *copy = dup_bytes(data, size);
    rw_msg *m = (rw_msg *)&m; /* poisoned: must be set to NULL or a handle */
    rw_err e;
    memset(&e, 0, sizeof e);
    rw_status st = decode(copy, size, &m, env, &e);
    burn(copy, size);
    if (st == RW_OK) {
        FUZZ_CHECK(m != NULL, "an accepted %s without a handle", what);
        return m;
    }
    FUZZ_CHECK(m == NULL, "a refused %s returned a handle", what);
    FUZZ_CHECK_REFUSAL(st, e);
    return NULL;
}

static void fuzz_request(const uint8_t *data, size_t size) {
    rw_request rq;
    rw_msg *m = decode_copy(data, size, decode_request, &rq, "request");
    if (!m) return;
    rw_err e;
    rw_status st;
    FUZZ_CHECK(rq.has_id && rq.args, "accepted without id / args");
    size_t cl = strlen(rq.cmd);
    FUZZ_CHECK(cl >= 1 && cl <= RW_MSG_MAX_CMD, "command name of %zu bytes", cl);
    FUZZ_CHECK(rw_mobj_type(rq.args) == RW_M_MAP, "args is a %s",
               rw_mtype_str(rw_mobj_type(rq.args)));
    walk(rq.args, 1);
    round_trips(rq.args);
    /* rebuilt with the writer, the request decodes to the same envelope */
    rw_mw *w;
    FUZZ_CHECK(rw_mw_create(&w, NULL) == RW_OK, "writer");
    rw_mw_request(w, rq.id, rq.cmd);
    rw_mw_obj(w, rq.args);
    const void *p;
    size_t n;
    FUZZ_CHECK(rw_mw_finish(w, &p, &n, NULL) == RW_OK, "writer failed");
    rw_msg *m2;
    rw_request r2;
    st = rw_msg_decode_request(p, n, &m2, &r2, &e);
    FUZZ_CHECK(st == RW_OK, "a rebuilt request is refused: %s", e.msg);
    FUZZ_CHECK(r2.id == rq.id && !strcmp(r2.cmd, rq.cmd), "rebuilt request differs");
    FUZZ_CHECK(rw_mobj_len(r2.args) == rw_mobj_len(rq.args), "rebuilt args differ");
    rw_msg_free(m2);
    rw_mw_destroy(w);
    rw_msg_free(m);
}

static void fuzz_reply(const uint8_t *data, size_t size) {
    rw_reply rp;
    rw_msg *m = decode_copy(data, size, decode_reply, &rp, "reply");
    if (!m) return;
    rw_err e;
    rw_status st;
    rw_mw *w;
    FUZZ_CHECK(rw_mw_create(&w, NULL) == RW_OK, "writer");
    if (rp.ok) {
        FUZZ_CHECK(rp.result != NULL, "ok reply without a result value");
        walk(rp.result, 1);
        round_trips(rp.result);
        rw_mw_reply_ok(w, rp.id);
        rw_mw_obj(w, rp.result);
    } else {
        FUZZ_CHECK(rp.status != RW_OK && rp.status <= RW_E_RANGE, "error reply with status %d",
                   (int)rp.status);
        FUZZ_CHECK(memchr(rp.message, 0, sizeof rp.message) != NULL, "message not terminated");
        rw_mw_reply_err(w, rp.id, rp.status, rp.message);
    }
    const void *p;
    size_t n;
    FUZZ_CHECK(rw_mw_finish(w, &p, &n, NULL) == RW_OK, "writer failed");
    rw_msg *m2;
    rw_reply r2;
    st = rw_msg_decode_reply(p, n, &m2, &r2, &e);
    FUZZ_CHECK(st == RW_OK, "a rebuilt reply is refused: %s", e.msg);
    FUZZ_CHECK(r2.id == rp.id && r2.ok == rp.ok, "rebuilt reply differs");
    if (!rp.ok) {
        const size_t ml = strlen(rp.message);
        char fixed[3 * sizeof rp.message + 1];
        if (rw_utf8_valid(rp.message, ml))
            memcpy(fixed, rp.message, ml + 1);
        else
            rw_utf8_repair(rp.message, ml, fixed, sizeof fixed);
        FUZZ_CHECK(r2.status == rp.status && !strncmp(r2.message, fixed, sizeof r2.message - 1),
                   "rebuilt error differs: %d '%s' vs %d '%s'", (int)r2.status, r2.message,
                   (int)rp.status, fixed);
        FUZZ_CHECK(rw_utf8_valid(r2.message, strlen(r2.message)) ||
                       strlen(fixed) >= sizeof r2.message - 1, /* cut inside a character */
                   "an error reply that is not UTF-8: '%s'", r2.message);
    }
    uint64_t peek = 0;
    if (rw_msg_peek_id(data, size, &peek))
        FUZZ_CHECK(peek == rp.id, "peek_id %llu, the decoder read %llu", (unsigned long long)peek,
                   (unsigned long long)rp.id);
    if (rp.ok && rw_client_is_part(rp.result)) {
        /* joined with itself: the pieces of the same index concatenate (the second as if its
         * data frame came after one of 16 bytes: its routes offsets move) */
        struct json_t *acc = NULL;
        char *out = NULL;
        st = rw_client_join_part(&acc, rp.result, 0, &e);
        if (st == RW_OK) st = rw_client_join_part(&acc, rp.result, 16, &e);
        if (st == RW_OK) st = rw_client_parts_done(acc, &out, &e);
        if (st == RW_OK && !has_nul(rp.result)) { /* JSON text with \u0000 does not parse back */
            FUZZ_CHECK(out && !strstr(out, "\"more\":"), "a joined result keeps 'more': %s", out);
            rw_mw *jw;
            FUZZ_CHECK(rw_mw_create(&jw, NULL) == RW_OK, "writer");
            FUZZ_CHECK(rw_mw_json(jw, out, &e) == RW_OK, "a joined result does not parse: %s",
                       e.msg);
            rw_mw_destroy(jw);
        } else if (st != RW_OK) {
            FUZZ_CHECK_REFUSAL(st, e);
        }
        free(out);
        json_decref(acc);
    }
    rw_msg_free(m2);
    rw_mw_destroy(w);
    rw_msg_free(m);
}

/* Reading an id from the head of any bytes never reads past them (ASan). */
static void fuzz_peek(const uint8_t *data, size_t size) {
    void *copy = dup_bytes(data, size);
    uint64_t id;
    rw_msg_peek_id(copy, size, &id);
    burn(copy, size);
}

static void fuzz_value(const uint8_t *data, size_t size) {
    void *copy = dup_bytes(data, size);
    rw_msg *m = (rw_msg *)&m;
    const rw_mobj *v = NULL;
    rw_err e;
    memset(&e, 0, sizeof e);
    rw_status st = rw_msg_decode_value(copy, size, &m, &v, &e);
    burn(copy, size);
    if (st != RW_OK) {
        FUZZ_CHECK(m == NULL, "a refused value returned a handle");
        FUZZ_CHECK_REFUSAL(st, e);
        return;
    }
    FUZZ_CHECK(m != NULL && v != NULL, "accepted without a handle");
    walk(v, 0);
    round_trips(v);
    rw_msg_free(m);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fuzz_request(data, size);
    fuzz_reply(data, size);
    fuzz_value(data, size);
    fuzz_peek(data, size);
    return 0;
}
