/* test_msg.c - the control envelope and manifests: round trips, the object view and field
 * reader, JSON conversion, and refusal of malformed input (truncated at every length, wrong
 * types, unknown fields, wrong protocol version, lying lengths, deep nesting, oversized,
 * random bytes and mutations). */
#include "rw_test.h"

#include "rw_sync.h"

#include <msgpack.h>

static rw_mw *mw_new(void) {
    rw_mw *w;
    rw_err e;
    RW_ASSERT_OK(rw_mw_create(&w, &e), &e);
    return w;
}

static void mw_bytes(rw_mw *w, const void **p, size_t *n) {
    rw_err e;
    RW_ASSERT_OK(rw_mw_finish(w, p, n, &e), &e);
}

/* A JSON text through the writer and the decoder: one value, owned by *m. */
static const rw_mobj *json_value(const char *json, rw_msg **m) {
    rw_mw *w = mw_new();
    rw_err e;
    RW_ASSERT_OK(rw_mw_json(w, json, &e), &e);
    const void *p;
    size_t n;
    mw_bytes(w, &p, &n);
    const rw_mobj *v;
    RW_ASSERT_OK(rw_msg_decode_value(p, n, m, &v, &e), &e);
    rw_mw_destroy(w); /* the message holds its own copy of the bytes */
    return v;
}

/* A request with args of every type. */
static void write_sample_request(rw_mw *w, uint64_t id) {
    rw_mw_request(w, id, "generate");
    rw_mw_map(w, 7);
    rw_mw_str(w, "a");
    rw_mw_u64(w, 18446744073709551615ull);
    rw_mw_str(w, "b");
    rw_mw_str(w, "text");
    rw_mw_str(w, "c");
    rw_mw_array(w, 3);
    rw_mw_i64(w, 1);
    rw_mw_i64(w, -2);
    rw_mw_i64(w, 3);
    rw_mw_str(w, "d");
    rw_mw_map(w, 1);
    rw_mw_str(w, "e");
    rw_mw_bool(w, true);
    rw_mw_str(w, "f");
    rw_mw_i64(w, -5);
    rw_mw_str(w, "g");
    rw_mw_f64(w, 1.5);
    rw_mw_str(w, "h");
    rw_mw_nil(w);
}

static void test_request_round_trip(void **state) {
    (void)state;
    rw_mw *w = mw_new();
    write_sample_request(w, 42);
    const void *p;
    size_t n;
    mw_bytes(w, &p, &n);
    rw_msg *m;
    rw_request r;
    rw_err e;
    RW_ASSERT_OK(rw_msg_decode_request(p, n, &m, &r, &e), &e);
    assert_int_equal(r.id, 42);
    assert_true(r.has_id);
    assert_string_equal(r.cmd, "generate");
    rw_mfields f;
    RW_ASSERT_OK(rw_mfields_init(&f, r.args, "args", &e), &e);
    uint64_t a;
    RW_ASSERT_OK(rw_mfields_u64(&f, "a", 0, &a, &e), &e);
    assert_true(a == 18446744073709551615ull);
    char b[8];
    RW_ASSERT_OK(rw_mfields_str(&f, "b", NULL, b, sizeof b, &e), &e);
    assert_string_equal(b, "text");
    int64_t c[4];
    size_t nc;
    RW_ASSERT_OK(rw_mobj_i64_array(rw_mfields_get(&f, "c"), "c", -10, 10, c, 4, &nc, &e), &e);
    assert_int_equal(nc, 3);
    assert_int_equal(c[1], -2);
    bool ev;
    RW_ASSERT_OK(rw_mobj_bool(rw_mobj_get(rw_mfields_get(&f, "d"), "e"), "d.e", &ev, &e), &e);
    assert_true(ev);
    int64_t fv;
    RW_ASSERT_OK(rw_mobj_i64(rw_mfields_get(&f, "f"), "f", &fv, &e), &e);
    assert_int_equal(fv, -5);
    double g;
    RW_ASSERT_OK(rw_mfields_f64(&f, "g", 0, &g, &e), &e);
    assert_true(g == 1.5);
    /* nil reads as absent: the default applies */
    uint64_t h;
    RW_ASSERT_OK(rw_mfields_u64(&f, "h", 77, &h, &e), &e);
    assert_int_equal(h, 77);
    RW_ASSERT_OK(rw_mfields_done(&f, &e), &e);
    rw_msg_free(m);
    rw_mw_destroy(w);
}

static void test_reply_round_trip(void **state) {
    (void)state;
    rw_mw *w = mw_new();
    rw_mw_reply_ok(w, 7);
    rw_mw_map(w, 1);
    rw_mw_str(w, "version");
    rw_mw_str(w, "step-3");
    const void *p;
    size_t n;
    mw_bytes(w, &p, &n);
    rw_msg *m;
    rw_reply r;
    rw_err e;
    RW_ASSERT_OK(rw_msg_decode_reply(p, n, &m, &r, &e), &e);
    assert_int_equal(r.id, 7);
    assert_true(r.ok);
    char v[16];
    RW_ASSERT_OK(rw_mobj_strcpy(rw_mobj_get(r.result, "version"), "v", v, sizeof v, &e), &e);
    assert_string_equal(v, "step-3");
    rw_msg_free(m);

    rw_mw_reset(w);
    rw_mw_reply_err(w, 9, RW_E_WEIGHTS_INCOMPLETE, "tensor x missing");
    mw_bytes(w, &p, &n);
    RW_ASSERT_OK(rw_msg_decode_reply(p, n, &m, &r, &e), &e);
    assert_false(r.ok);
    assert_int_equal(r.id, 9);
    assert_int_equal(r.status, RW_E_WEIGHTS_INCOMPLETE);
    assert_string_equal(r.message, "tensor x missing");
    /* the status name travels beside the code */
    msgpack_unpacked up;
    msgpack_unpacked_init(&up);
    assert_int_equal(msgpack_unpack_next(&up, p, n, NULL), MSGPACK_UNPACK_SUCCESS);
    const rw_mobj *err = rw_mobj_get(&up.data, "error");
    char sname[32];
    RW_ASSERT_OK(rw_mobj_strcpy(rw_mobj_get(err, "status"), "s", sname, sizeof sname, &e), &e);
    assert_string_equal(sname, "weights_incomplete");
    msgpack_unpacked_destroy(&up);
    rw_msg_free(m);
    rw_mw_destroy(w);
}

/* Builds an envelope map with the given fields through msgpack directly. */
static void *raw_envelope(size_t *len, int protocol, bool with_id, const char *cmd_key,
                          int cmd_as_int, const char *extra_key, bool args_array) {
    msgpack_sbuffer sb;
    msgpack_packer pk;
    msgpack_sbuffer_init(&sb);
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    int n = 1 + (protocol >= 0) + (with_id ? 1 : 0) + (extra_key ? 1 : 0) + 1;
    msgpack_pack_map(&pk, (size_t)n);
    if (protocol >= 0) {
        msgpack_pack_str_with_body(&pk, "protocol", 8);
        msgpack_pack_int(&pk, protocol);
    }
    if (with_id) {
        msgpack_pack_str_with_body(&pk, "id", 2);
        msgpack_pack_uint64(&pk, 5);
    }
    msgpack_pack_str_with_body(&pk, cmd_key, strlen(cmd_key));
    if (cmd_as_int)
        msgpack_pack_int(&pk, 3);
    else
        msgpack_pack_str_with_body(&pk, "health", 6);
    if (extra_key) {
        msgpack_pack_str_with_body(&pk, extra_key, strlen(extra_key));
        msgpack_pack_nil(&pk);
    }
    msgpack_pack_str_with_body(&pk, "args", 4);
    if (args_array)
        msgpack_pack_array(&pk, 0);
    else
        msgpack_pack_map(&pk, 0);
    *len = sb.size;
    return msgpack_sbuffer_release(&sb);
}

static void expect_refused(const void *p, size_t n, rw_status want, const char *needle) {
    rw_msg *m = (rw_msg *)1;
    rw_request r;
    rw_err e;
    rw_err_clear(&e);
    rw_assert_status(rw_msg_decode_request(p, n, &m, &r, &e), want, &e, needle,
                     "a refused request");
    assert_null(m);
}

static void test_envelope_refusals(void **state) {
    (void)state;
    size_t n;
    /* a version this side does not speak (the next one) */
    void *p = raw_envelope(&n, RW_PROTOCOL_VERSION + 1, true, "cmd", 0, NULL, false);
    char want[64];
    snprintf(want, sizeof want, "protocol version %d", RW_PROTOCOL_VERSION + 1);
    expect_refused(p, n, RW_E_PROTOCOL, want);
    {
        rw_msg *m;
        rw_request r;
        rw_err e;
        assert_int_equal(rw_msg_decode_request(p, n, &m, &r, &e), RW_E_PROTOCOL);
        assert_true(r.has_id); /* the error reply can still carry the id */
        assert_int_equal(r.id, 5);
        snprintf(want, sizeof want, "speaks %d", RW_PROTOCOL_VERSION);
        assert_non_null(strstr(e.msg, want));
    }
    free(p);
    p = raw_envelope(&n, -1, true, "cmd", 0, NULL, false);
    expect_refused(p, n, RW_E_PROTOCOL, "missing field 'protocol'");
    free(p);
    p = raw_envelope(&n, RW_PROTOCOL_VERSION, false, "cmd", 0, NULL, false);
    expect_refused(p, n, RW_E_PROTOCOL, "'id'");
    free(p);
    p = raw_envelope(&n, RW_PROTOCOL_VERSION, true, "cmd", 1, NULL, false);
    expect_refused(p, n, RW_E_PROTOCOL, "envelope.cmd: expected a string");
    free(p);
    p = raw_envelope(&n, RW_PROTOCOL_VERSION, true, "command", 0, NULL, false);
    expect_refused(p, n, RW_E_PROTOCOL, "cmd: missing");
    free(p);
    p = raw_envelope(&n, RW_PROTOCOL_VERSION, true, "cmd", 0, "priority", false);
    expect_refused(p, n, RW_E_PROTOCOL, "unknown field 'priority'");
    free(p);
    p = raw_envelope(&n, RW_PROTOCOL_VERSION, true, "cmd", 0, NULL, true);
    expect_refused(p, n, RW_E_PROTOCOL, "args: expected a map");
    free(p);
    /* not a map at all */
    const uint8_t arr[] = {0x91, 0x01};
    expect_refused(arr, sizeof arr, RW_E_PROTOCOL, "expected a map");
    /* duplicate keys */
    uint8_t dup[] = {0x83, 0xa8, 'p', 'r', 'o',  't',  'o', 'c', 'o', 'l',
                     0x00, 0xa2, 'i', 'd', 0x01, 0xa2, 'i', 'd', 0x02};
    dup[10] = RW_PROTOCOL_VERSION; /* a positive fixint */
    expect_refused(dup, sizeof dup, RW_E_PROTOCOL, "duplicate key 'id'");
}

static void test_malformed_bytes(void **state) {
    (void)state;
    /* every truncation of a valid message is refused */
    rw_mw *w = mw_new();
    write_sample_request(w, 3);
    const void *p;
    size_t n;
    mw_bytes(w, &p, &n);
    for (size_t k = 0; k < n; k++) {
        rw_msg *m;
        rw_request r;
        rw_err e;
        rw_status st = rw_msg_decode_request(p, k, &m, &r, &e);
        if (st == RW_OK) fail_msg("truncation at %zu of %zu accepted", k, n);
        assert_int_equal(st, RW_E_FORMAT);
    }
    /* trailing bytes */
    uint8_t *q = malloc(n + 1);
    memcpy(q, p, n);
    q[n] = 0xc0;
    expect_refused(q, n + 1, RW_E_FORMAT, "trailing");
    free(q);
    rw_mw_destroy(w);
    /* lying lengths */
    const uint8_t big_arr[] = {0xdd, 0xff, 0xff, 0xff, 0xff, 0x01};
    expect_refused(big_arr, sizeof big_arr, RW_E_FORMAT, "truncated array");
    const uint8_t big_map[] = {0xdf, 0x00, 0x10, 0x00, 0x00, 0x01, 0x02};
    expect_refused(big_map, sizeof big_map, RW_E_FORMAT, "truncated map");
    const uint8_t big_str[] = {0xdb, 0x00, 0x00, 0x10, 0x00, 'a'};
    expect_refused(big_str, sizeof big_str, RW_E_FORMAT, "truncated string");
    const uint8_t huge_str[] = {0xdb, 0x7f, 0xff, 0xff, 0xff, 'a'};
    expect_refused(huge_str, sizeof huge_str, RW_E_FORMAT, "limit");
    const uint8_t ext[] = {0xd4, 0x01, 0x02};
    expect_refused(ext, sizeof ext, RW_E_FORMAT, "ext");
    const uint8_t never[] = {0xc1};
    expect_refused(never, sizeof never, RW_E_FORMAT, "0xc1");
    expect_refused("", 0, RW_E_FORMAT, "empty");
    /* deep nesting */
    uint8_t deep[200];
    for (int i = 0; i < 199; i++)
        deep[i] = 0x91;
    deep[199] = 0xc0;
    expect_refused(deep, sizeof deep, RW_E_FORMAT, "nesting");
    /* oversized: refused on the length alone */
    size_t big = (size_t)RW_MSG_MAX_BYTES + 1;
    uint8_t *huge = calloc(1, big);
    assert_non_null(huge);
    expect_refused(huge, big, RW_E_RANGE, "limit");
    free(huge);
}

static void test_fuzz(void **state) {
    (void)state;
    rw_rng rng;
    rw_rng_seed(&rng, 1234);
    rw_mw *w = mw_new();
    write_sample_request(w, 11);
    const void *p;
    size_t n;
    mw_bytes(w, &p, &n);
    uint8_t buf[512];
    int accepted = 0;
    for (int it = 0; it < 20000; it++) {
        size_t len;
        if (it % 2) { /* random bytes */
            len = rw_rng_u64(&rng) % 64;
            for (size_t i = 0; i < len; i++)
                buf[i] = (uint8_t)rw_rng_u64(&rng);
        } else { /* mutations of a valid message */
            len = n;
            memcpy(buf, p, n);
            int flips = 1 + (int)(rw_rng_u64(&rng) % 4);
            for (int f = 0; f < flips; f++)
                buf[rw_rng_u64(&rng) % n] = (uint8_t)rw_rng_u64(&rng);
        }
        rw_msg *m;
        rw_request r;
        rw_err e;
        rw_status st = rw_msg_decode_request(buf, len, &m, &r, &e);
        if (st == RW_OK) {
            accepted++;
            /* whatever was accepted is a well-formed envelope */
            assert_true(rw_mobj_type(r.args) == RW_M_MAP);
            assert_true(r.cmd[0] != 0);
            rw_msg_free(m);
        } else {
            assert_true(st == RW_E_FORMAT || st == RW_E_PROTOCOL || st == RW_E_RANGE);
            assert_null(m);
            assert_true(e.msg[0] != 0);
        }
    }
    assert_true(accepted < 20000);
    rw_mw_destroy(w);
}

static void test_view_errors(void **state) {
    (void)state;
    rw_mw *w = mw_new();
    rw_mw_map(w, 5);
    rw_mw_str(w, "neg");
    rw_mw_i64(w, -1);
    rw_mw_str(w, "big");
    rw_mw_u64(w, (uint64_t)INT64_MAX + 1);
    rw_mw_str(w, "nul");
    rw_mw_strn(w, "a\0b", 3);
    rw_mw_str(w, "long");
    rw_mw_str(w, "abcdefghij");
    rw_mw_str(w, "arr");
    rw_mw_array(w, 2);
    rw_mw_i64(w, 5);
    rw_mw_str(w, "x");
    const void *p;
    size_t n;
    mw_bytes(w, &p, &n);
    rw_msg *m;
    const rw_mobj *v;
    rw_err e;
    RW_ASSERT_OK(rw_msg_decode_value(p, n, &m, &v, &e), &e);
    uint64_t u;
    int64_t i;
    char s[8];
    int64_t a[4];
    size_t na;
    assert_int_equal(rw_mobj_u64(rw_mobj_get(v, "neg"), "args.neg", &u, &e), RW_E_RANGE);
    assert_non_null(strstr(e.msg, "args.neg"));
    assert_int_equal(rw_mobj_i64(rw_mobj_get(v, "big"), "args.big", &i, &e), RW_E_RANGE);
    assert_int_equal(rw_mobj_strcpy(rw_mobj_get(v, "nul"), "args.nul", s, sizeof s, &e),
                     RW_E_PROTOCOL);
    assert_int_equal(rw_mobj_strcpy(rw_mobj_get(v, "long"), "args.long", s, sizeof s, &e),
                     RW_E_RANGE);
    assert_int_equal(rw_mobj_i64_array(rw_mobj_get(v, "arr"), "args.arr", 0, 9, a, 4, &na, &e),
                     RW_E_PROTOCOL);
    assert_non_null(strstr(e.msg, "args.arr[1]"));
    assert_int_equal(rw_mobj_i64_array(rw_mobj_get(v, "arr"), "args.arr", 0, 9, a, 1, &na, &e),
                     RW_E_RANGE);
    assert_int_equal(rw_mobj_u64(rw_mobj_get(v, "nul"), "args.nul", &u, &e), RW_E_PROTOCOL);
    assert_non_null(strstr(e.msg, "expected an unsigned integer, got string"));
    /* field reader: required, unknown */
    rw_mfields f;
    RW_ASSERT_OK(rw_mfields_init(&f, v, "args", &e), &e);
    const rw_mobj *x;
    assert_int_equal(rw_mfields_req(&f, "missing", &x, &e), RW_E_PROTOCOL);
    assert_non_null(strstr(e.msg, "args.missing: missing"));
    rw_mfields_get(&f, "neg");
    rw_mfields_get(&f, "big");
    rw_mfields_get(&f, "nul");
    rw_mfields_get(&f, "arr");
    assert_int_equal(rw_mfields_done(&f, &e), RW_E_PROTOCOL);
    assert_non_null(strstr(e.msg, "unknown field 'long'"));
    rw_mfields_get(&f, "long");
    RW_ASSERT_OK(rw_mfields_done(&f, &e), &e);
    /* JSON of a value with a u64 past int64 is refused */
    char *js;
    assert_int_equal(rw_mobj_to_json(v, &js, &e), RW_E_RANGE);
    rw_msg_free(m);
    rw_mw_destroy(w);
}

static void test_json(void **state) {
    (void)state;
    const char *in = "{\"prompt\": [1, 2, 3], \"temperature\": 0.5, \"stop\": null, "
                     "\"stream\": false, \"name\": \"x\\\"y\", \"nested\": {\"k\": [-4, {}]}}";
    rw_err e;
    rw_msg *m;
    const rw_mobj *v = json_value(in, &m);
    char *out;
    RW_ASSERT_OK(rw_mobj_to_json(v, &out, &e), &e);
    assert_string_equal(out, "{\"prompt\":[1,2,3],\"temperature\":0.5,\"stop\":null,\"stream\":"
                             "false,\"name\":\"x\\\"y\",\"nested\":{\"k\":[-4,{}]}}");
    free(out);
    rw_msg_free(m);
    rw_mw *w = mw_new();
    assert_int_equal(rw_mw_json(w, "{\"a\": 1, \"a\": 2}", &e), RW_E_FORMAT);
    assert_int_equal(rw_mw_json(w, "{\"a\": ", &e), RW_E_FORMAT);
    rw_mw_destroy(w);
}

static void test_hex_and_version(void **state) {
    (void)state;
    uint8_t id[RW_NCCL_ID_BYTES], back[RW_NCCL_ID_BYTES];
    rw_rng r;
    rw_rng_seed(&r, 5);
    for (int i = 0; i < RW_NCCL_ID_BYTES; i++)
        id[i] = (uint8_t)rw_rng_u64(&r);
    char hex[2 * RW_NCCL_ID_BYTES + 1];
    rw_hex_encode(id, sizeof id, hex);
    rw_err e;
    RW_ASSERT_OK(rw_hex_decode(hex, strlen(hex), back, sizeof back, "id", &e), &e);
    rw_assert_bytes_equal(id, back, sizeof id, "hex round trip");
    hex[17] = 'g';
    assert_int_equal(rw_hex_decode(hex, strlen(hex), back, sizeof back, "id", &e), RW_E_PROTOCOL);
    assert_non_null(strstr(e.msg, "position 17"));
    assert_int_equal(rw_hex_decode("abc", 3, back, 2, "id", &e), RW_E_PROTOCOL);
}

/* --- manifests ----------------------------------------------------------------------------- */
static rw_sync_manifest *sample_manifest(void) {
    rw_sync_manifest *m;
    rw_err e;
    RW_ASSERT_OK(rw_sync_manifest_create(&m, &e), &e);
    int64_t s1[2] = {96, 128}, s2[3] = {8, 192, 128}, s3[1] = {128};
    RW_ASSERT_OK(rw_sync_manifest_add(m, "model.layers.0.mlp.experts.1.gate_proj.weight",
                                      RW_DTYPE_BF16, 2, s1, 0, 48, 48, RW_PIECE_PLAIN, NULL, &e),
                 &e);
    RW_ASSERT_OK(rw_sync_manifest_add(m, "model.layers.0.mlp.experts.gate_up_proj", RW_DTYPE_BF16,
                                      3, s2, 1, 0, 48, RW_PIECE_GATE_UP, NULL, &e),
                 &e);
    RW_ASSERT_OK(rw_sync_manifest_add(m, "model.norm.weight", RW_DTYPE_BF16, 1, s3, -1, 0, 0,
                                      RW_PIECE_PLAIN, NULL, &e),
                 &e);
    return m;
}

static void test_manifest_round_trip(void **state) {
    (void)state;
    rw_sync_manifest *m = sample_manifest(), *back;
    rw_err e;
    assert_int_equal(rw_sync_manifest_count(m), 3);
    const rw_sync_tensor *t1 = rw_sync_manifest_at(m, 1);
    assert_int_equal(t1->nbytes, 8 * 96 * 128 * 2); /* gate_up piece: [E, 2*len, H] */
    assert_int_equal(t1->offset % RW_SYNC_ALIGN, 0);
    RW_ASSERT_OK(rw_sync_manifest_check(m, &e), &e);
    rw_mw *w = mw_new();
    rw_sync_manifest_write(m, w);
    const void *p;
    size_t n;
    mw_bytes(w, &p, &n);
    rw_msg *msg;
    const rw_mobj *v;
    RW_ASSERT_OK(rw_msg_decode_value(p, n, &msg, &v, &e), &e);
    RW_ASSERT_OK(rw_sync_manifest_create(&back, &e), &e);
    RW_ASSERT_OK(rw_sync_manifest_read(v, "manifest", back, &e), &e);
    assert_int_equal(rw_sync_manifest_count(back), 3);
    assert_int_equal(rw_sync_manifest_bytes(back), rw_sync_manifest_bytes(m));
    for (size_t i = 0; i < 3; i++)
        assert_memory_equal(rw_sync_manifest_at(back, i), rw_sync_manifest_at(m, i),
                            sizeof(rw_sync_tensor));
    rw_msg_free(msg);
    rw_mw_destroy(w);
    rw_sync_manifest_destroy(back);
    rw_sync_manifest_destroy(m);
}

/* Mutates entry i of the sample, checks the manifest is refused with `want` naming `needle`. */
static void check_bad(void (*mut)(rw_sync_tensor *t, rw_sync_manifest *m), size_t i, rw_status want,
                      const char *needle) {
    rw_sync_manifest *m = sample_manifest(), *c;
    rw_err e;
    RW_ASSERT_OK(rw_sync_manifest_create(&c, &e), &e);
    for (size_t k = 0; k < rw_sync_manifest_count(m); k++) {
        rw_sync_tensor t = *rw_sync_manifest_at(m, k);
        if (k == i) mut(&t, c);
        RW_ASSERT_OK(rw_sync_manifest_push(c, &t, &e), &e);
    }
    rw_sync_manifest_set_bytes(c, rw_sync_manifest_bytes(m));
    rw_assert_status(rw_sync_manifest_check(c, &e), want, &e, needle, "a refused manifest");
    rw_sync_manifest_destroy(c);
    rw_sync_manifest_destroy(m);
}

static void m_overlap(rw_sync_tensor *t, rw_sync_manifest *m) {
    (void)m;
    t->offset -= 256;
}
static void m_outside(rw_sync_tensor *t, rw_sync_manifest *m) {
    (void)m;
    t->offset += 1u << 30;
}
static void m_nbytes(rw_sync_tensor *t, rw_sync_manifest *m) {
    (void)m;
    t->nbytes -= 2;
}
static void m_align(rw_sync_tensor *t, rw_sync_manifest *m) {
    (void)m;
    t->offset += 1;
}
static void m_shard(rw_sync_tensor *t, rw_sync_manifest *m) {
    (void)m;
    t->shard_begin = 60; /* 60 + 48 > 96 */
}
static void m_dtype(rw_sync_tensor *t, rw_sync_manifest *m) {
    (void)m;
    t->dtype = RW_DTYPE_INVALID;
}
static void m_shape(rw_sync_tensor *t, rw_sync_manifest *m) {
    (void)m;
    t->shape[0] = 0;
}
static void m_name(rw_sync_tensor *t, rw_sync_manifest *m) {
    (void)m;
    t->name[0] = 0;
}
static void m_dup(rw_sync_tensor *t, rw_sync_manifest *m) {
    (void)m;
    /* the norm entry becomes a second whole piece of the expert tensor */
    strcpy(t->name, "model.layers.0.mlp.experts.1.gate_proj.weight");
    t->ndim = 2;
    t->shape[0] = 1;
    t->shape[1] = 128;
}
static void m_odd(rw_sync_tensor *t, rw_sync_manifest *m) {
    (void)m;
    t->shape[1] = 193;
}

static void test_manifest_refusals(void **state) {
    (void)state;
    check_bad(m_overlap, 1, RW_E_RANGE, "overlap");
    check_bad(m_outside, 2, RW_E_RANGE, "model.norm.weight: bytes");
    check_bad(m_nbytes, 0, RW_E_SHAPE, "experts.1.gate_proj.weight: nbytes");
    check_bad(m_align, 2, RW_E_INVALID_ARG, "not aligned");
    check_bad(m_shard, 0, RW_E_SHAPE, "shard [60, +48) outside [0, 96)");
    check_bad(m_dtype, 2, RW_E_DTYPE, "unknown dtype");
    check_bad(m_shape, 2, RW_E_SHAPE, "shape[0] = 0");
    check_bad(m_name, 2, RW_E_INVALID_ARG, "tensor 2");
    check_bad(m_dup, 2, RW_E_INVALID_ARG, "same elements");
    check_bad(m_odd, 1, RW_E_SHAPE, "odd size");
}

/* rw_sync_manifest_read of a manifest given as JSON. */
static rw_status read_json_manifest(const char *json, rw_err *e) {
    rw_msg *msg;
    const rw_mobj *v = json_value(json, &msg);
    rw_sync_manifest *m;
    RW_ASSERT_OK(rw_sync_manifest_create(&m, e), e);
    rw_status st = rw_sync_manifest_read(v, "args.manifest", m, e);
    rw_sync_manifest_destroy(m);
    rw_msg_free(msg);
    return st;
}

/* Wire-level manifest errors: wrong types, unknown fields, unknown dtype / layout. */
static void expect_read_fail(const char *json, rw_status want, const char *needle) {
    rw_err e;
    rw_assert_status(read_json_manifest(json, &e), want, &e, needle, json);
}

static void test_manifest_wire_refusals(void **state) {
    (void)state;
    const char *ok = "{\"nbytes\": 256, \"tensors\": [{\"name\": \"model.norm.weight\", \"dtype\": "
                     "\"bf16\", \"shape\": [128], \"offset\": 0, \"nbytes\": 256}]}";
    {
        rw_err e;
        RW_ASSERT_OK(read_json_manifest(ok, &e), &e);
    }
    expect_read_fail("{\"nbytes\": 256, \"tensors\": [{\"name\": \"model.norm.weight\", \"dtype\": "
                     "\"bf17\", \"shape\": [128], \"offset\": 0, \"nbytes\": 256}]}",
                     RW_E_DTYPE, "unknown dtype 'bf17'");
    expect_read_fail("{\"nbytes\": 256, \"tensors\": [{\"name\": \"model.norm.weight\", \"dtype\": "
                     "\"bf16\", \"shape\": [128], \"offset\": 0, \"nbytes\": 256, \"crc\": 1}]}",
                     RW_E_PROTOCOL, "unknown field 'crc'");
    expect_read_fail("{\"nbytes\": 256, \"tensors\": [{\"name\": \"model.norm.weight\", \"dtype\": "
                     "\"bf16\", \"shape\": [-128], \"offset\": 0, \"nbytes\": 256}]}",
                     RW_E_RANGE, "shape[0]");
    expect_read_fail("{\"nbytes\": 256, \"tensors\": [{\"name\": \"model.norm.weight\", \"dtype\": "
                     "\"bf16\", \"shape\": [128], \"offset\": \"0\", \"nbytes\": 256}]}",
                     RW_E_PROTOCOL, "model.norm.weight.offset");
    expect_read_fail("{\"nbytes\": 256, \"tensors\": [{\"name\": \"model.norm.weight\", \"dtype\": "
                     "\"bf16\", \"shape\": [128], \"nbytes\": 256}]}",
                     RW_E_PROTOCOL, "model.norm.weight.offset: missing");
    expect_read_fail("{\"nbytes\": 256, \"tensors\": [{\"name\": \"model.norm.weight\", \"dtype\": "
                     "\"bf16\", \"shape\": [128], \"offset\": 0, \"nbytes\": 256, \"layout\": "
                     "\"zigzag\"}]}",
                     RW_E_PROTOCOL, "unknown layout 'zigzag'");
    expect_read_fail("{\"nbytes\": 100, \"tensors\": [{\"name\": \"model.norm.weight\", \"dtype\": "
                     "\"bf16\", \"shape\": [128], \"offset\": 0, \"nbytes\": 256}]}",
                     RW_E_RANGE, "outside the bucket of 100 bytes");
    expect_read_fail("{\"nbytes\": 256, \"tensors\": {}}", RW_E_PROTOCOL,
                     "args.manifest.tensors: expected an array");
    expect_read_fail("{\"nbytes\": 256, \"tensors\": [], \"extra\": 1}", RW_E_PROTOCOL,
                     "unknown field 'extra'");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_request_round_trip),
        cmocka_unit_test(test_reply_round_trip),
        cmocka_unit_test(test_envelope_refusals),
        cmocka_unit_test(test_malformed_bytes),
        cmocka_unit_test(test_fuzz),
        cmocka_unit_test(test_view_errors),
        cmocka_unit_test(test_json),
        cmocka_unit_test(test_hex_and_version),
        cmocka_unit_test(test_manifest_round_trip),
        cmocka_unit_test(test_manifest_refusals),
        cmocka_unit_test(test_manifest_wire_refusals),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
