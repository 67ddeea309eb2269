/* msg_write.c - writing msgpack messages: the envelope heads, values and key / value pairs with a
 * sticky error, the msgpack form of a JSON text (the client's JSON entry points), and the hex
 * encoding of ids and checksums. */
#include "sync_internal.h"

#include <inttypes.h>
#include <jansson.h>
#include <msgpack.h>
#include <stdlib.h>

/* ------------------------------------------------------------------------------------------ */
/* Writer                                                                                       */
/* ------------------------------------------------------------------------------------------ */
struct rw_mw {
    msgpack_sbuffer sb;
    msgpack_packer pk;
    bool failed;
};

rw_status rw_mw_create(rw_mw **out, rw_err *err) {
    rw_mw *w = calloc(1, sizeof *w);
    if (!w) RW_FAIL(err, RW_E_OOM, "msgpack writer: out of memory");
    msgpack_sbuffer_init(&w->sb);
    msgpack_packer_init(&w->pk, &w->sb, msgpack_sbuffer_write);
    *out = w;
    return RW_OK;
}

void rw_mw_destroy(rw_mw *w) {
    if (!w) return;
    msgpack_sbuffer_destroy(&w->sb);
    free(w);
}

void rw_mw_reset(rw_mw *w) {
    msgpack_sbuffer_clear(&w->sb);
    w->failed = false;
}

#define MW(w, call)                                                                                \
    do {                                                                                           \
        if (call) (w)->failed = true;                                                              \
    } while (0)

void rw_mw_map(rw_mw *w, uint32_t n) {
    MW(w, msgpack_pack_map(&w->pk, n));
}
void rw_mw_array(rw_mw *w, uint32_t n) {
    MW(w, msgpack_pack_array(&w->pk, n));
}
void rw_mw_nil(rw_mw *w) {
    MW(w, msgpack_pack_nil(&w->pk));
}
void rw_mw_bool(rw_mw *w, bool v) {
    MW(w, v ? msgpack_pack_true(&w->pk) : msgpack_pack_false(&w->pk));
}
void rw_mw_u64(rw_mw *w, uint64_t v) {
    MW(w, msgpack_pack_uint64(&w->pk, v));
}
void rw_mw_i64(rw_mw *w, int64_t v) {
    MW(w, msgpack_pack_int64(&w->pk, v));
}
void rw_mw_f64(rw_mw *w, double v) {
    MW(w, msgpack_pack_double(&w->pk, v));
}
/* msgpack lengths are 32-bit: a longer value fails the writer. */
static bool length_ok(rw_mw *w, size_t n) {
    if (n > UINT32_MAX) w->failed = true;
    return n <= UINT32_MAX;
}
void rw_mw_strn(rw_mw *w, const char *s, size_t n) {
    if (!length_ok(w, n)) return;
    MW(w, msgpack_pack_str(&w->pk, n));
    MW(w, msgpack_pack_str_body(&w->pk, s, n));
}
void rw_mw_str(rw_mw *w, const char *s) {
    rw_mw_strn(w, s ? s : "", s ? strlen(s) : 0);
}
void rw_mw_bin(rw_mw *w, const void *p, size_t n) {
    if (!length_ok(w, n)) return;
    MW(w, msgpack_pack_bin(&w->pk, n));
    MW(w, msgpack_pack_bin_body(&w->pk, p, n));
}
void rw_mw_hex64(rw_mw *w, uint64_t v) {
    char buf[17];
    snprintf(buf, sizeof buf, "%016" PRIx64, v);
    rw_mw_strn(w, buf, 16);
}
void rw_mw_raw(rw_mw *w, const void *p, size_t n) {
    if (n && msgpack_sbuffer_write(&w->sb, p, n)) w->failed = true;
}
void rw_mw_obj(rw_mw *w, const rw_mobj *o) {
    MW(w, msgpack_pack_object(&w->pk, *o));
}

/* The key / value writers: the key as a string, then the value. */
#define KV(name, type, write)                                                                      \
    void rw_mw_kv_##name(rw_mw *w, const char *key, type v) {                                      \
        rw_mw_str(w, key);                                                                         \
        write(w, v);                                                                               \
    }
KV(str, const char *, rw_mw_str)
KV(u64, uint64_t, rw_mw_u64)
KV(i64, int64_t, rw_mw_i64)
KV(f64, double, rw_mw_f64)
KV(bool, bool, rw_mw_bool)
#undef KV

/* The start of every envelope: a map of four whose first fields are protocol and id. */
static void envelope_head(rw_mw *w, uint64_t id) {
    rw_mw_map(w, 4);
    rw_mw_kv_u64(w, "protocol", RW_PROTOCOL_VERSION);
    rw_mw_kv_u64(w, "id", id);
}

void rw_mw_request(rw_mw *w, uint64_t id, const char *cmd) {
    envelope_head(w, id);
    rw_mw_str(w, "cmd");
    rw_mw_str(w, cmd);
    rw_mw_str(w, "args");
}

void rw_mw_reply_ok(rw_mw *w, uint64_t id) {
    envelope_head(w, id);
    rw_mw_str(w, "ok");
    rw_mw_bool(w, true);
    rw_mw_str(w, "result");
}

void rw_mw_reply_err(rw_mw *w, uint64_t id, rw_status st, const char *message) {
    envelope_head(w, id);
    rw_mw_str(w, "ok");
    rw_mw_bool(w, false);
    rw_mw_str(w, "error");
    rw_mw_map(w, 3);
    rw_mw_str(w, "status");
    rw_mw_str(w, rw_status_str(st));
    rw_mw_str(w, "code");
    rw_mw_u64(w, (uint64_t)st);
    rw_mw_str(w, "message");
    /* messages quote what clients sent (names, keys), and a strict client cannot decode a str
     * that is not UTF-8: invalid bytes become U+FFFD */
    const char *m = message ? message : "";
    const size_t n = strlen(m);
    if (rw_utf8_valid(m, n)) {
        rw_mw_strn(w, m, n);
    } else {
        char fixed[3 * 1024 + 1];
        rw_mw_strn(w, fixed, rw_utf8_repair(m, n < 1024 ? n : 1024, fixed, sizeof fixed));
    }
}

static rw_status from_json(rw_mw *w, const json_t *j, int depth, rw_err *err) {
    if (depth > RW_MSG_MAX_DEPTH)
        RW_FAIL(err, RW_E_FORMAT, "JSON: nesting deeper than %d", RW_MSG_MAX_DEPTH);
    switch (json_typeof(j)) {
    case JSON_NULL: rw_mw_nil(w); break;
    case JSON_TRUE: rw_mw_bool(w, true); break;
    case JSON_FALSE: rw_mw_bool(w, false); break;
    case JSON_INTEGER: {
        json_int_t v = json_integer_value(j);
        if (v >= 0)
            rw_mw_u64(w, (uint64_t)v);
        else
            rw_mw_i64(w, (int64_t)v);
        break;
    }
    case JSON_REAL: rw_mw_f64(w, json_real_value(j)); break;
    case JSON_STRING: rw_mw_strn(w, json_string_value(j), json_string_length(j)); break;
    case JSON_ARRAY: {
        size_t n = json_array_size(j);
        rw_mw_array(w, (uint32_t)n);
        for (size_t i = 0; i < n; i++)
            RW_CHECK(from_json(w, json_array_get(j, i), depth + 1, err));
        break;
    }
    case JSON_OBJECT: {
        rw_mw_map(w, (uint32_t)json_object_size(j));
        const char *k;
        json_t *v;
        json_object_foreach((json_t *)j, k, v) {
            rw_mw_str(w, k);
            RW_CHECK(from_json(w, v, depth + 1, err));
        }
        break;
    }
    }
    return RW_OK;
}

rw_status rw_mw_json(rw_mw *w, const char *json, rw_err *err) {
    json_error_t je;
    json_t *j = json_loads(json, JSON_DECODE_ANY | JSON_REJECT_DUPLICATES, &je);
    if (!j) RW_FAIL(err, RW_E_FORMAT, "JSON: %s (line %d, column %d)", je.text, je.line, je.column);
    rw_status st = from_json(w, j, 0, err);
    json_decref(j);
    return st;
}

rw_status rw_mw_finish(rw_mw *w, const void **data, size_t *len, rw_err *err) {
    if (w->failed) RW_FAIL(err, RW_E_OOM, "msgpack writer: a write failed (out of memory)");
    *data = w->sb.data;
    *len = w->sb.size;
    return RW_OK;
}

rw_status rw_mw_take(rw_mw *w, void **data, size_t *len, rw_err *err) {
    if (w->failed) RW_FAIL(err, RW_E_OOM, "msgpack writer: a write failed (out of memory)");
    *len = w->sb.size;
    *data = msgpack_sbuffer_release(&w->sb);
    if (!*data) {
        *data = malloc(1);
        if (!*data) RW_FAIL(err, RW_E_OOM, "msgpack writer: out of memory");
    }
    return RW_OK;
}

/* ------------------------------------------------------------------------------------------ */
/* Hex                                                                                          */
/* ------------------------------------------------------------------------------------------ */
void rw_hex_encode(const void *bytes, size_t n, char *dst) {
    static const char d[] = "0123456789abcdef";
    const uint8_t *b = bytes;
    for (size_t i = 0; i < n; i++) {
        dst[2 * i] = d[b[i] >> 4];
        dst[2 * i + 1] = d[b[i] & 15];
    }
    dst[2 * n] = 0;
}

static int hexval(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

rw_status rw_hex_decode(const char *hex, size_t hexlen, void *dst, size_t n, const char *what,
                        rw_err *err) {
    if (hexlen != 2 * n)
        RW_FAIL(err, RW_E_PROTOCOL, "%s: expected %zu hex digits, got %zu", what, 2 * n, hexlen);
    uint8_t *o = dst;
    for (size_t i = 0; i < n; i++) {
        int hi = hexval(hex[2 * i]), lo = hexval(hex[2 * i + 1]);
        if (hi < 0 || lo < 0)
            RW_FAIL(err, RW_E_PROTOCOL, "%s: not a hex digit at position %zu", what,
                    hi < 0 ? 2 * i : 2 * i + 1);
        o[i] = (uint8_t)(hi << 4 | lo);
    }
    return RW_OK;
}
