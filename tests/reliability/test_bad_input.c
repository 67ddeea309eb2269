/* test_bad_input.c - bad input over the control socket of a live rw-worker (CPU backend, the tiny
 * fixture): malformed msgpack, wrong types, unknown commands and fields, a wrong protocol
 * version, truncated / missing / extra frames, manifests whose sizes, dtypes, shapes or names do
 * not fit the model, token ids out of range, absurd max_new_tokens and batch sizes, a bucket
 * larger than announced, and more. Each gets an error reply with its status and a distinctive
 * part of its message (and the request's id when it could be read); a refused bucket ends its
 * session with the previous version serving. Meanwhile another client's generate completes;
 * afterwards every weight checksum is unchanged and generation reproduces the fixture's greedy
 * tokens. */
#include <math.h>

#include "reliability_util.h"

typedef enum pre {
    PRE_NONE = 0,
    PRE_BEGIN = 1,       /* a valid begin_update first (bucket_bytes 4 MiB) */
    PRE_BEGIN_SMALL = 2, /* begin_update announcing 1024-byte buckets */
} pre;

typedef struct bad {
    char what[96];
    pre pre;
    void *frame[6]; /* frame[0]: the envelope (or whatever stands in its place); malloc'd */
    size_t len[6];
    int n;
    rw_status want;
    char sub[128];    /* a distinctive part of the message */
    uint64_t want_id; /* the id the reply must carry (0: the request's id was unreadable) */
    bool abort_after; /* the case leaves a session open: abort it */
    /* a request of the session its begin opens: its envelope is rebuilt with args.session, the
     * token of that begin (protocol 2) */
    char *cmd, *args;
} bad;

#define MAX_CASES 128
static bad cases[MAX_CASES];
static int ncases;
static rw_mw *W;

static bad *add_case(const char *what, pre p, rw_status want, const char *sub, uint64_t id) {
    assert_true(ncases < MAX_CASES);
    bad *b = &cases[ncases++];
    memset(b, 0, sizeof *b);
    snprintf(b->what, sizeof b->what, "%s", what);
    b->pre = p;
    b->want = want;
    snprintf(b->sub, sizeof b->sub, "%s", sub);
    b->want_id = id;
    return b;
}

static void add_frame(bad *b, const void *p, size_t n) {
    assert_true(b->n < 6);
    b->frame[b->n] = malloc(n ? n : 1);
    assert_non_null(b->frame[b->n]);
    if (n) memcpy(b->frame[b->n], p, n);
    b->len[b->n++] = n;
}

/* A case whose envelope is {protocol 1, id, cmd, args: <json>}, plus optional data frames. */
static bad *env_case(const char *what, pre p, const char *cmd, const char *args, rw_status want,
                     const char *sub) {
    uint64_t id = 1000 + (uint64_t)ncases;
    bad *b = add_case(what, p, want, sub, id);
    size_t n;
    void *env = rl_env(id, cmd, args, &n);
    add_frame(b, env, n);
    free(env);
    if (p != PRE_NONE) {
        b->cmd = strdup(cmd);
        b->args = strdup(args ? args : "{}");
    }
    return b;
}

/* After the case's begin_update: its envelope again, with the session's token in its args. */
static void with_session(bad *b, const char *token) {
    const rw_cmd c = b->cmd ? rw_cmd_parse(b->cmd) : RW_CMD_NONE;
    if (c != RW_CMD_UPDATE_WEIGHTS && c != RW_CMD_UPDATE_WEIGHTS_FROM_DISK &&
        c != RW_CMD_COMMIT_UPDATE && c != RW_CMD_ABORT_UPDATE)
        return;
    json_error_t je;
    json_t *a = json_loads(b->args, 0, &je);
    assert_non_null(a);
    json_object_set_new(a, "session", json_string(token));
    char *text = json_dumps(a, JSON_COMPACT);
    json_decref(a);
    size_t n;
    void *env = rl_env(b->want_id, b->cmd, text, &n);
    free(text);
    free(b->frame[0]);
    b->frame[0] = env;
    b->len[0] = n;
}

/* Cases that are one request with no data frame: {what, pre, cmd, args, want, sub}. */
typedef struct env_row {
    const char *what;
    pre pre;
    const char *cmd, *args;
    rw_status want;
    const char *sub;
} env_row;

static void env_rows(const env_row *r, size_t n) {
    for (size_t i = 0; i < n; i++)
        env_case(r[i].what, r[i].pre, r[i].cmd, r[i].args, r[i].want, r[i].sub);
}
#define ENV_ROWS(t) env_rows(t, sizeof t / sizeof *t)

/* A case whose envelope is whatever W holds. */
static bad *raw_case(const char *what, pre p, rw_status want, const char *sub, uint64_t id) {
    bad *b = add_case(what, p, want, sub, id);
    size_t n;
    void *env = rl_take(W, &n);
    add_frame(b, env, n);
    free(env);
    return b;
}

/* {protocol: 1, id, cmd, args: {x: <the caller writes one value>}}: returns after "x". */
static void head_x(uint64_t id, const char *cmd) {
    rw_mw_request(W, id, cmd);
    rw_mw_map(W, 1);
    rw_mw_str(W, "x");
}

/* A one-tensor manifest as JSON: name, dtype, shape text, offset, nbytes, bucket size, extra
 * entry fields (e.g. ", \"shard\": {...}"). */
static const char *manifest1(char *buf, size_t cap, const char *name, const char *dtype,
                             const char *shape, uint64_t off, uint64_t nbytes, uint64_t bucket,
                             const char *extra) {
    snprintf(buf, cap,
             "{\"transport\": \"zmq\", \"manifest\": {\"nbytes\": %llu, \"tensors\": [{\"name\": "
             "\"%s\", \"dtype\": \"%s\", \"shape\": %s, \"offset\": %llu, \"nbytes\": "
             "%llu%s}]}}",
             (unsigned long long)bucket, name, dtype, shape, (unsigned long long)off,
             (unsigned long long)nbytes, extra ? extra : "");
    return buf;
}

/* update_weights cases on a one-tensor bucket: the manifest entry (manifest1's fields), the size
 * of the data frame sent with it, and the refusal. */
typedef struct bucket_row {
    const char *what;
    pre pre;
    const char *name, *dtype, *shape;
    uint64_t off, nbytes, bucket;
    const char *extra;
    size_t frame;
    rw_status want;
    const char *sub;
} bucket_row;

#define NORM "model.norm.weight"
static const bucket_row bucket_rows[] = {
    {"frame shorter than the manifest", PRE_BEGIN, NORM, "bf16", "[128]", 0, 256, 256, NULL, 200,
     RW_E_SHAPE, "describes 256 bytes but the zmq transport delivered 200"},
    {"frame longer than the manifest", PRE_BEGIN, NORM, "bf16", "[128]", 0, 256, 256, NULL, 300,
     RW_E_SHAPE, "describes 256 bytes but the zmq transport delivered 300"},
    {"bucket larger than announced", PRE_BEGIN_SMALL, "model.layers.0.mlp.gate.weight", "bf16",
     "[8, 128]", 0, 2048, 2048, NULL, 2048, RW_E_RANGE,
     "bucket of 2048 bytes is larger than announced"},
    {"unknown tensor name", PRE_BEGIN, "model.layers.0.mlp.shared_expert.weight", "bf16", "[128]",
     0, 256, 256, NULL, 256, RW_E_NOT_FOUND, "model.layers.0.mlp.shared_expert.weight"},
    {"wrong full shape", PRE_BEGIN, "model.layers.0.self_attn.o_proj.weight", "bf16", "[128, 8]", 0,
     2048, 2048, NULL, 2048, RW_E_SHAPE, "full shape [128, 8], expected [128, 128]"},
    {"dtype the layer does not take", PRE_BEGIN, NORM, "f32", "[128]", 0, 512, 512, NULL, 512,
     RW_E_DTYPE, "dtype f32, expected bf16"},
    {"layer beyond the model", PRE_BEGIN, "model.layers.3.input_layernorm.weight", "bf16", "[128]",
     0, 256, 256, NULL, 256, RW_E_RANGE, "layer 3 but the model has 3 layers"},
    {"expert beyond the model", PRE_BEGIN, "model.layers.0.mlp.experts.8.down_proj.weight", "bf16",
     "[128, 8]", 0, 2048, 2048, NULL, 2048, RW_E_RANGE, "expert 8 but the model has 8 experts"},
    {"nbytes not dtype x shape", PRE_BEGIN, NORM, "bf16", "[128]", 0, 254, 256, NULL, 256,
     RW_E_SHAPE, "nbytes 254 but dtype bf16 x shape of the piece is 256"},
    {"piece outside the bucket", PRE_BEGIN, NORM, "bf16", "[128]", 128, 256, 256, NULL, 256,
     RW_E_RANGE, "bytes [128, 384) outside the bucket of 256 bytes"},
    {"shard outside the tensor", PRE_BEGIN, "model.layers.0.self_attn.k_proj.weight", "bf16",
     "[64, 128]", 0, 4096, 4096, ", \"shard\": {\"dim\": 0, \"begin\": 60, \"len\": 16}", 4096,
     RW_E_SHAPE, "shard [60, +16) outside [0, 64) along dim 0"},
    {"unknown field in a manifest entry", PRE_BEGIN, NORM, "bf16", "[128]", 0, 256, 256,
     ", \"checksum\": \"00\"", 256, RW_E_PROTOCOL, "unknown field 'checksum'"},
    {"unknown layout", PRE_BEGIN, NORM, "bf16", "[128]", 0, 256, 256,
     ", \"layout\": \"interleaved\"", 256, RW_E_PROTOCOL, "unknown layout 'interleaved'"},
    {"offset not aligned to the dtype", PRE_BEGIN, NORM, "bf16", "[128]", 1, 256, 258, NULL, 258,
     RW_E_INVALID_ARG, "offset 1 not aligned to 2 bytes"},
    {"dimension 0 in a shape", PRE_BEGIN, NORM, "bf16", "[0]", 0, 0, 0, NULL, 0, RW_E_RANGE,
     "shape[0]: 0 outside [1, 1099511627776]"},
    {"non-printable tensor name", PRE_BEGIN, "model.norm weight", "bf16", "[128]", 0, 256, 256,
     NULL, 256, RW_E_INVALID_ARG, "empty or non-printable name"},
};

static void build_cases(void) {
    rw_err e;
    RW_ASSERT_OK(rw_mw_create(&W, &e), &e);
    static uint8_t bucket[4096];
    for (size_t i = 0; i < sizeof bucket; i += 2) {
        bucket[i] = 0x80; /* bf16 1.0 = 0x3f80, little endian */
        bucket[i + 1] = 0x3f;
    }
    char a[2048];
    bad *b;

    /* ---- msgpack and envelope ---- */
    static const uint8_t c1[] = {0xc1};
    add_frame(add_case("byte 0xc1", PRE_NONE, RW_E_FORMAT, "0xc1 is never used", 0), c1, 1);
    static const uint8_t trunc[] = {0x84, 0xa8, 'p', 'r', 'o'};
    add_frame(add_case("truncated map", PRE_NONE, RW_E_FORMAT, "truncated", 0), trunc,
              sizeof trunc);
    {
        size_t n;
        void *env = rl_env(1, "health", NULL, &n);
        uint8_t *t = malloc(n + 1);
        memcpy(t, env, n);
        t[n] = 0xc0;
        add_frame(add_case("trailing byte", PRE_NONE, RW_E_FORMAT, "1 trailing bytes", 0), t,
                  n + 1);
        free(t);
        free(env);
    }
    head_x(2, "health");
    for (int i = 0; i < 20; i++)
        rw_mw_array(W, 1);
    rw_mw_nil(W);
    raw_case("nesting 22 deep", PRE_NONE, RW_E_FORMAT, "nesting deeper than 16", 0);
    head_x(3, "health");
    static const uint8_t ext[] = {0xd4, 0x01, 0x00};
    rw_mw_raw(W, ext, sizeof ext);
    raw_case("ext type", PRE_NONE, RW_E_FORMAT, "ext types (0xd4) are not accepted", 0);
    head_x(4, "health");
    static const uint8_t lie[] = {0xdd, 0xff, 0xff, 0xff, 0xff, 0xc0};
    rw_mw_raw(W, lie, sizeof lie);
    raw_case("array count larger than the message", PRE_NONE, RW_E_FORMAT,
             "4294967295 elements declared", 0);
    {
        head_x(5, "health");
        size_t n = (2u << 20);
        char *big = malloc(n);
        memset(big, 'a', n);
        rw_mw_strn(W, big, n);
        free(big);
        raw_case("string of 2 MiB", PRE_NONE, RW_E_FORMAT, "(limit 1048576)", 0);
    }
    {
        size_t n = (65u << 20);
        uint8_t *huge = calloc(1, n);
        add_frame(add_case("message of 65 MiB", PRE_NONE, RW_E_RANGE, "(limit 67108864)", 0), huge,
                  n);
        free(huge);
    }
    rw_mw_array(W, 2);
    rw_mw_u64(W, 1);
    rw_mw_u64(W, 2);
    raw_case("envelope is an array", PRE_NONE, RW_E_PROTOCOL, "expected a map, got array", 0);
    rw_mw_map(W, 2);
    rw_mw_str(W, "id");
    rw_mw_u64(W, 6);
    rw_mw_str(W, "cmd");
    rw_mw_str(W, "health");
    raw_case("no protocol field", PRE_NONE, RW_E_PROTOCOL, "missing field 'protocol'", 6);
    rw_mw_map(W, 3);
    rw_mw_str(W, "protocol");
    rw_mw_u64(W, RW_PROTOCOL_VERSION + 1); /* the next version */
    rw_mw_str(W, "id");
    rw_mw_u64(W, 7);
    rw_mw_str(W, "cmd");
    rw_mw_str(W, "health");
    {
        char want[96];
        snprintf(want, sizeof want, "protocol version %d is not supported (this side speaks %d)",
                 RW_PROTOCOL_VERSION + 1, RW_PROTOCOL_VERSION);
        raw_case("next protocol version", PRE_NONE, RW_E_PROTOCOL, want, 7);
    }
    rw_mw_map(W, 3);
    rw_mw_str(W, "protocol");
    rw_mw_str(W, "1");
    rw_mw_str(W, "id");
    rw_mw_u64(W, 8);
    rw_mw_str(W, "cmd");
    rw_mw_str(W, "health");
    raw_case("protocol as a string", PRE_NONE, RW_E_PROTOCOL,
             "envelope.protocol: expected an unsigned integer, got string", 8);
    rw_mw_map(W, 2);
    rw_mw_str(W, "protocol");
    rw_mw_u64(W, RW_PROTOCOL_VERSION);
    rw_mw_str(W, "cmd");
    rw_mw_str(W, "health");
    raw_case("no id", PRE_NONE, RW_E_PROTOCOL, "missing field 'id'", 0);
    rw_mw_map(W, 3);
    rw_mw_str(W, "protocol");
    rw_mw_u64(W, RW_PROTOCOL_VERSION);
    rw_mw_str(W, "id");
    rw_mw_i64(W, -5);
    rw_mw_str(W, "cmd");
    rw_mw_str(W, "health");
    raw_case("negative id", PRE_NONE, RW_E_RANGE, "envelope.id: -5 is negative", 0);
    rw_mw_map(W, 3);
    rw_mw_str(W, "protocol");
    rw_mw_u64(W, RW_PROTOCOL_VERSION);
    rw_mw_str(W, "id");
    rw_mw_f64(W, 9.5);
    rw_mw_str(W, "cmd");
    rw_mw_str(W, "health");
    raw_case("id as a float", PRE_NONE, RW_E_PROTOCOL,
             "envelope.id: expected an unsigned integer, got float", 0);
    rw_mw_map(W, 2);
    rw_mw_str(W, "protocol");
    rw_mw_u64(W, RW_PROTOCOL_VERSION);
    rw_mw_str(W, "id");
    rw_mw_u64(W, 10);
    raw_case("no cmd", PRE_NONE, RW_E_PROTOCOL, "envelope.cmd: missing", 10);
    rw_mw_map(W, 3);
    rw_mw_str(W, "protocol");
    rw_mw_u64(W, RW_PROTOCOL_VERSION);
    rw_mw_str(W, "id");
    rw_mw_u64(W, 11);
    rw_mw_str(W, "cmd");
    rw_mw_u64(W, 3);
    raw_case("cmd as an integer", PRE_NONE, RW_E_PROTOCOL,
             "envelope.cmd: expected a string, got unsigned integer", 11);
    rw_mw_request(W, 12, "");
    rw_mw_map(W, 0);
    raw_case("empty cmd", PRE_NONE, RW_E_PROTOCOL, "empty command name", 12);
    {
        char longcmd[101];
        memset(longcmd, 'g', 100);
        longcmd[100] = 0;
        rw_mw_map(W, 3);
        rw_mw_str(W, "protocol");
        rw_mw_u64(W, RW_PROTOCOL_VERSION);
        rw_mw_str(W, "id");
        rw_mw_u64(W, 13);
        rw_mw_str(W, "cmd");
        rw_mw_str(W, longcmd);
        raw_case("cmd of 100 bytes", PRE_NONE, RW_E_RANGE, "string of 100 bytes (limit 63)", 13);
    }
    rw_mw_map(W, 4);
    rw_mw_str(W, "protocol");
    rw_mw_u64(W, RW_PROTOCOL_VERSION);
    rw_mw_str(W, "id");
    rw_mw_u64(W, 14);
    rw_mw_str(W, "cmd");
    rw_mw_str(W, "health");
    rw_mw_str(W, "priority");
    rw_mw_u64(W, 9);
    raw_case("unknown envelope field", PRE_NONE, RW_E_PROTOCOL, "unknown field 'priority'", 14);
    rw_mw_map(W, 4);
    rw_mw_str(W, "protocol");
    rw_mw_u64(W, RW_PROTOCOL_VERSION);
    rw_mw_str(W, "id");
    rw_mw_u64(W, 15);
    rw_mw_str(W, "cmd");
    rw_mw_str(W, "health");
    rw_mw_str(W, "id");
    rw_mw_u64(W, 16);
    raw_case("duplicate envelope key", PRE_NONE, RW_E_PROTOCOL, "duplicate key 'id'", 15);
    rw_mw_request(W, 17, "health");
    rw_mw_array(W, 0);
    raw_case("args as an array", PRE_NONE, RW_E_PROTOCOL, "envelope.args: expected a map", 17);
    rw_mw_request(W, 18, "health");
    rw_mw_map(W, 1);
    rw_mw_u64(W, 1);
    rw_mw_u64(W, 2);
    raw_case("integer key in args", PRE_NONE, RW_E_PROTOCOL, "(keys are strings)", 18);
    env_case("unknown command", PRE_NONE, "fly", NULL, RW_E_PROTOCOL, "unknown command 'fly'");
    rw_mw_request(W, 19, "generate");
    rw_mw_map(W, 2);
    rw_mw_str(W, "prompt");
    rw_mw_array(W, 1);
    rw_mw_u64(W, 1);
    rw_mw_str(W, "top_p");
    rw_mw_f64(W, NAN);
    raw_case("top_p NaN", PRE_NONE, RW_E_RANGE, "args.top_p: not a finite number", 19);

    /* ---- frames ---- */
    b = env_case("five data frames", PRE_NONE, "health", NULL, RW_E_FORMAT,
                 "more than 4 data frames");
    for (int i = 0; i < 5; i++)
        add_frame(b, "x", 1);
    b->want_id = 0; /* refused before the envelope is read */
    b = env_case("health with a data frame", PRE_NONE, "health", NULL, RW_E_PROTOCOL,
                 "health: takes no data frames, got 1");
    add_frame(b, "x", 1);
    add_frame(add_case("a delimiter and no envelope", PRE_NONE, RW_E_FORMAT,
                       "without an envelope frame", 0),
              "", 0);

    /* ---- updates: every refused bucket ends its session, nothing written ---- */
    static char norm_buf[512];
    const char *norm_ok = manifest1(norm_buf, sizeof norm_buf, "model.norm.weight", "bf16", "[128]",
                                    0, 256, 256, NULL);
    env_case("update_weights without a frame", PRE_BEGIN, "update_weights", norm_ok, RW_E_PROTOCOL,
             "transport zmq needs exactly one data frame, got 0");
    b = env_case("update_weights with two frames", PRE_BEGIN, "update_weights", norm_ok,
                 RW_E_PROTOCOL, "exactly one data frame, got 2");
    add_frame(b, bucket, 128);
    add_frame(b, bucket, 128);
    for (size_t i = 0; i < sizeof bucket_rows / sizeof *bucket_rows; i++) {
        const bucket_row *r = &bucket_rows[i];
        b = env_case(r->what, r->pre, "update_weights",
                     manifest1(a, sizeof a, r->name, r->dtype, r->shape, r->off, r->nbytes,
                               r->bucket, r->extra),
                     r->want, r->sub);
        add_frame(b, bucket, r->frame);
    }
    snprintf(a, sizeof a,
             "{\"transport\": \"zmq\", \"manifest\": {\"nbytes\": 512, \"tensors\": ["
             "{\"name\": \"model.norm.weight\", \"dtype\": \"bf16\", \"shape\": [128], "
             "\"offset\": 0, \"nbytes\": 256},"
             "{\"name\": \"model.layers.0.input_layernorm.weight\", \"dtype\": \"bf16\", "
             "\"shape\": [128], \"offset\": 128, \"nbytes\": 256}]}}");
    b = env_case("overlapping pieces", PRE_BEGIN, "update_weights", a, RW_E_RANGE, "overlap");
    add_frame(b, bucket, 512);
    b = env_case("manifest not a map", PRE_BEGIN, "update_weights",
                 "{\"transport\": \"zmq\", \"manifest\": [1, 2]}", RW_E_PROTOCOL,
                 "args.manifest: expected a map, got array");
    add_frame(b, bucket, 256);
    b = env_case("unknown transport", PRE_BEGIN, "update_weights",
                 "{\"transport\": \"carrier-pigeon\", \"manifest\": {\"nbytes\": 0, "
                 "\"tensors\": []}}",
                 RW_E_PROTOCOL, "unknown transport 'carrier-pigeon'");
    env_case("nccl transport without a group", PRE_BEGIN, "update_weights",
             "{\"transport\": \"nccl\", \"manifest\": {\"nbytes\": 0, \"tensors\": []}}",
             RW_E_STATE, "no NCCL group");
    {
        /* 70000 entries: more than one bucket may hold */
        size_t cap = 70000 * 96 + 256, k = 0;
        char *big = malloc(cap);
        k += (size_t)snprintf(big + k, cap - k, "{\"manifest\": {\"nbytes\": 256, \"tensors\": [");
        for (int i = 0; i < 70000; i++)
            k += (size_t)snprintf(big + k, cap - k,
                                  "%s{\"name\":\"t%d\",\"dtype\":\"u8\",\"shape\":[1],"
                                  "\"offset\":0,\"nbytes\":1}",
                                  i ? "," : "", i);
        snprintf(big + k, cap - k, "]}}");
        b = env_case("70000 tensors in one bucket", PRE_BEGIN, "update_weights", big, RW_E_RANGE,
                     "70000 tensors (limit 65536)");
        add_frame(b, bucket, 256);
        free(big);
    }
    b = env_case("update_weights with no session", PRE_NONE, "update_weights", norm_ok, RW_E_STATE,
                 "no update session is open");
    add_frame(b, bucket, 256);
    env_case("commit_update with no session", PRE_NONE, "commit_update", NULL, RW_E_STATE,
             "no update session is open");
    env_case("abort_update with no session", PRE_NONE, "abort_update", NULL, RW_E_STATE,
             "no update session is open");
    b = env_case("begin_update while one is open", PRE_BEGIN, "begin_update",
                 "{\"version\": \"second\"}", RW_E_STATE, "already open");
    b->abort_after = true;
    static const env_row session_rows[] = {
        {"empty version tag", PRE_NONE, "begin_update", "{\"version\": \"\"}", RW_E_INVALID_ARG,
         "version: empty tag"},
        {"version tag with a control character", PRE_NONE, "begin_update",
         "{\"version\": \"v\\u0007\"}", RW_E_INVALID_ARG, "is not printable ASCII"},
        {"bucket_bytes 0", PRE_NONE, "begin_update", "{\"version\": \"v\", \"bucket_bytes\": 0}",
         RW_E_RANGE, "args.bucket_bytes: 0 outside [1, 64 GiB]"},
        {"bucket_bytes of 1 TiB", PRE_NONE, "begin_update",
         "{\"version\": \"v\", \"bucket_bytes\": 1099511627776}", RW_E_RANGE,
         "outside [1, 64 GiB]"},
        {"negative timeout", PRE_NONE, "begin_update", "{\"version\": \"v\", \"timeout_s\": -1}",
         RW_E_RANGE, "args.timeout_s: -1"},
        {"checkpoint directory that does not exist", PRE_NONE, "update_weights_from_disk",
         "{\"path\": \"/nonexistent/rw-ckpt\"}", RW_E_NOT_FOUND, "/nonexistent/rw-ckpt"},
    };
    ENV_ROWS(session_rows);
    {
        char model[4096], args[4300];
        rw_test_path(model, sizeof model, RW_TEST_FIXTURE);
        snprintf(args, sizeof args, "{\"path\": \"%s\", \"only\": \"(unclosed\"}", model);
        env_case("invalid regex", PRE_NONE, "update_weights_from_disk", args, RW_E_INVALID_ARG,
                 "regex '(unclosed'");
    }
    static const env_row readback_rows[] = {
        {"get_weights of an unknown tensor", PRE_NONE, "get_weights",
         "{\"name\": \"model.layers.0.mlp.router.weight\"}", RW_E_NOT_FOUND,
         "model.layers.0.mlp.router.weight"},
        {"checksum names not an array", PRE_NONE, "checksum", "{\"names\": \"all\"}", RW_E_PROTOCOL,
         "args.names: expected an array, got string"},
        {"NCCL unique id that is not hex", PRE_NONE, "init_weights_update_group",
         "{\"unique_id\": \"zz\", \"world_size\": 2, \"rank_offset\": 1}", RW_E_PROTOCOL,
         "args.unique_id: expected 256 hex digits, got 2"},
    };
    ENV_ROWS(readback_rows);

    /* ---- generate ---- */
    static const env_row generate_rows[] = {
        {"token id = vocab size", PRE_NONE, "generate", "{\"prompt\": [1, 512]}", RW_E_RANGE,
         "args.prompt[1]: token id 512 outside [0, 512)"},
        {"negative token id", PRE_NONE, "generate", "{\"prompt\": [-1]}", RW_E_RANGE,
         "token id -1 outside [0, 512)"},
        {"token id as a string", PRE_NONE, "generate", "{\"prompt\": [\"7\"]}", RW_E_PROTOCOL,
         "args.prompt[0]: expected an integer, got string"},
        {"prompt as a string", PRE_NONE, "generate", "{\"prompt\": \"hello\"}", RW_E_PROTOCOL,
         "expected an array of token ids, got string"},
        {"empty prompt", PRE_NONE, "generate", "{\"prompt\": []}", RW_E_INVALID_ARG,
         "empty prompt"},
        {"prompt and prompts", PRE_NONE, "generate", "{\"prompt\": [1], \"prompts\": [[1]]}",
         RW_E_PROTOCOL, "give exactly one of args.prompt"},
        {"empty batch", PRE_NONE, "generate", "{\"prompts\": []}", RW_E_INVALID_ARG, "empty batch"},
        {"max_new_tokens 10^9", PRE_NONE, "generate",
         "{\"prompt\": [1], \"max_new_tokens\": 1000000000}", RW_E_RANGE,
         "args.max_new_tokens: 1000000000 outside [1, 2^24]"},
        {"max_new_tokens 0", PRE_NONE, "generate", "{\"prompt\": [1], \"max_new_tokens\": 0}",
         RW_E_RANGE, "args.max_new_tokens: 0 outside"},
        {"prompt + max_new_tokens past max_seq_len", PRE_NONE, "generate",
         "{\"prompt\": [1, 2, 3], \"max_new_tokens\": 600}", RW_E_RANGE,
         "prompt 3 + max_new_tokens 600 > max_seq_len 512"},
        {"max_new_tokens as a string", PRE_NONE, "generate",
         "{\"prompt\": [1], \"max_new_tokens\": \"8\"}", RW_E_PROTOCOL,
         "args.max_new_tokens: expected an unsigned integer, got string"},
        {"n of 5000 samples", PRE_NONE, "generate", "{\"prompt\": [1], \"n\": 5000}", RW_E_RANGE,
         "args.n: 5000 outside [1, 1024]"},
    };
    ENV_ROWS(generate_rows);
    {
        size_t cap = 70000 * 4 + 64, k = 0;
        char *big = malloc(cap);
        k += (size_t)snprintf(big, cap, "{\"prompts\": [");
        for (int i = 0; i < 70000; i++)
            k += (size_t)snprintf(big + k, cap - k, "%s[1]", i ? "," : "");
        snprintf(big + k, cap - k, "]}");
        env_case("batch of 70000 prompts", PRE_NONE, "generate", big, RW_E_RANGE,
                 "70000 prompts x n 1 requests (at most 65536)");
        free(big);
    }
    static const env_row sampling_rows[] = {
        {"negative temperature", PRE_NONE, "generate", "{\"prompt\": [1], \"temperature\": -0.5}",
         RW_E_RANGE, "args.temperature: -0.5"},
        {"top_p 0", PRE_NONE, "generate", "{\"prompt\": [1], \"top_p\": 0}", RW_E_RANGE,
         "args.top_p: 0 outside (0, 1]"},
        {"top_logprobs 50", PRE_NONE, "generate", "{\"prompt\": [1], \"top_logprobs\": 50}",
         RW_E_RANGE, "args.top_logprobs: 50 (at most 20)"},
        {"17 stop ids", PRE_NONE, "generate",
         "{\"prompt\": [1], \"stop\": [1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17]}", RW_E_RANGE,
         "args.stop: 17 stop ids (at most 16)"},
        {"misspelt field", PRE_NONE, "generate", "{\"prompt\": [1], \"temprature\": 0.5}",
         RW_E_PROTOCOL, "unknown field 'temprature'"},
    };
    ENV_ROWS(sampling_rows);

    /* ---- other commands ---- */
    static const env_row other_rows[] = {
        {"pause with an unknown mode", PRE_NONE, "pause", "{\"mode\": \"sleep\"}", RW_E_INVALID_ARG,
         "unknown mode 'sleep'"},
        {"abort naming nothing", PRE_NONE, "abort", NULL, RW_E_PROTOCOL, "give args.request_id"},
        {"abort of an unknown request", PRE_NONE, "abort", "{\"request_id\": 424242}",
         RW_E_NOT_FOUND, "no generate command with id 424242"},
        {"flush_cache with a field", PRE_NONE, "flush_cache", "{\"hard\": true}", RW_E_PROTOCOL,
         "unknown field 'hard'"},
        {"release_memory of nothing", PRE_NONE, "release_memory",
         "{\"weights\": false, \"kv_cache\": false}", RW_E_INVALID_ARG, "nothing selected"},
        {"shutdown with a field", PRE_NONE, "shutdown", "{\"now\": true}", RW_E_PROTOCOL,
         "unknown field 'now'"},
    };
    ENV_ROWS(other_rows);
    rw_mw_destroy(W);
}

/* The worker's weight state and version. */
static void state_of(rl_sock *s, char *state, char *version, size_t cap) {
    rl_reply r;
    rl_ok(s, 1, "get_weight_version", NULL, &r);
    rl_result_str(&r, "state", state, cap);
    rl_result_str(&r, "version", version, cap);
    rl_reply_free(&r);
}

static dt_worker w; /* killed by the teardown when a failed check left it running */

static int teardown(void **st) {
    (void)st;
    dt_kill(&w);
    return 0;
}

static void test_bad_input(void **st) {
    (void)st;
    dt_ref ref;
    dt_ref_load(&ref);
    rl_start_fixture(&w, NULL, NULL);
    rw_client *c = dt_connect(&w);
    char *sums0 = rl_checksums(c);
    rl_sock s;
    rl_open(&s, w.ep);
    char state0[RW_SYNC_MAX_VERSION + 1], version0[RW_SYNC_MAX_VERSION + 1];
    state_of(&s, state0, version0, sizeof state0);
    assert_string_equal(state0, "ready");

    /* another client's request, in flight while the bad input arrives */
    char p[1024], a[1200];
    dt_prompt_json(ref.prompt[3], ref.n_prompt[3], p, sizeof p);
    snprintf(a, sizeof a, "{\"prompt\":%s,\"max_new_tokens\":%d}", p, DT_REF_TOKENS);
    uint64_t other = dt_send(c, "generate", a);

    build_cases();
    assert_true(ncases >= 40);
    for (int i = 0; i < ncases; i++) {
        bad *b = &cases[i];
        rl_reply r;
        char token[64] = ""; /* of the case's session */
        if (b->pre != PRE_NONE) {
            rl_ok(&s, 2, "begin_update",
                  b->pre == PRE_BEGIN ? "{\"version\": \"bad\", \"bucket_bytes\": 4194304}"
                                      : "{\"version\": \"bad\", \"bucket_bytes\": 1024}",
                  &r);
            with_session(b, rl_result_str(&r, "session", token, sizeof token));
            rl_reply_free(&r);
        }
        rl_send(&s, (const void *const *)b->frame, b->len, (size_t)b->n);
        if (!rl_recv(&s, DT_TIMEOUT_MS, &r)) fail_msg("case '%s': no reply", b->what);
        if (r.rep.ok) fail_msg("case '%s': accepted", b->what);
        fprintf(stderr, "case %d (%s): %s: %s\n", i, b->what, rw_status_str(r.rep.status),
                r.rep.message);
        if (r.rep.status != b->want)
            fail_msg("case '%s': status %s, expected %s (%s)", b->what, rw_status_str(r.rep.status),
                     rw_status_str(b->want), r.rep.message);
        if (!strstr(r.rep.message, b->sub))
            fail_msg("case '%s': message '%s' lacks '%s'", b->what, r.rep.message, b->sub);
        if (r.rep.id != b->want_id)
            fail_msg("case '%s': reply id %llu, expected %llu", b->what,
                     (unsigned long long)r.rep.id, (unsigned long long)b->want_id);
        if (b->pre != PRE_NONE && !b->abort_after &&
            !strstr(r.rep.message, "nothing was written, the previous version still serves"))
            fail_msg("case '%s': a refused bucket does not say the previous version serves: %s",
                     b->what, r.rep.message);
        rl_reply_free(&r);
        if (b->abort_after) {
            char a[128];
            snprintf(a, sizeof a, "{\"session\": \"%s\"}", token);
            rl_ok(&s, 3, "abort_update", a, &r);
            rl_reply_free(&r);
        }
        /* the session (if any) has ended; the old weights serve */
        char st_now[RW_SYNC_MAX_VERSION + 1], v_now[RW_SYNC_MAX_VERSION + 1];
        state_of(&s, st_now, v_now, sizeof st_now);
        if (strcmp(st_now, "ready") || strcmp(v_now, version0))
            fail_msg("after case '%s': state %s, version '%s'", b->what, st_now, v_now);
        for (int k = 0; k < b->n; k++)
            free(b->frame[k]);
        free(b->cmd);
        free(b->args);
    }
    printf("%d malformed requests refused as expected\n", ncases);

    /* nothing else came back: one reply per request */
    rl_reply extra;
    if (rl_recv(&s, 200, &extra))
        fail_msg("an unexpected extra reply (id %llu)", (unsigned long long)extra.rep.id);

    json_t *r = dt_wait_gen(c, other, NULL);
    dt_assert_greedy(&ref, 3, dt_output(r, 0), DT_REF_TOKENS);
    json_decref(r);

    char *sums1 = rl_checksums(c);
    assert_string_equal(sums0, sums1);
    free(sums0);
    free(sums1);
    rl_assert_reference(c, &ref);
    json_t *stats = dt_ok(c, "stats", NULL);
    assert_true(dt_int(stats, "errors", NULL) >= ncases);
    assert_int_equal(dt_int(stats, "weights", "updates"), 0);
    json_decref(stats);

    rl_close(&s);
    dt_shutdown(&w, c, 30);
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test_teardown(test_bad_input, teardown)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
