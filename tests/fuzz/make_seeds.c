/* make_seeds.c - writes the seed inputs of the fuzz targets: valid and near-valid inputs made by
 * the project's own writers (safetensors writer, config files of the repository, the msgpack
 * writer and manifest builder), so the fuzzers start from what real peers send.
 *
 * usage: fuzz_make_seeds SOURCE_ROOT OUT_DIR
 * writes OUT_DIR/<target>/<name> for safetensors, config and, when built with the sync module,
 * msg and manifest. The committed corpora (tests/fuzz/corpus/) started from these and were then
 * grown and minimized by the fuzzers (libFuzzer -merge=1). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "rw_core.h"
#ifdef RW_FUZZ_HAVE_SYNC
#include "rw_sync.h"
#endif

static const char *out_dir;
static int n_written;

static void die(const char *what, const rw_err *e) {
    fprintf(stderr, "make_seeds: %s: %s\n", what, e ? e->msg : strerror(errno));
    exit(1);
}

static void mkdir_p(const char *d) {
    if (mkdir(d, 0755) != 0 && errno != EEXIST) die(d, NULL);
}

static void put(const char *target, const char *name, const void *p, size_t n) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", out_dir, target);
    mkdir_p(path);
    snprintf(path, sizeof path, "%s/%s/%s", out_dir, target, name);
    FILE *f = fopen(path, "wb");
    if (!f || (n && fwrite(p, 1, n, f) != n) || fclose(f) != 0) die(path, NULL);
    n_written++;
}

static void put_str(const char *target, const char *name, const char *s) {
    put(target, name, s, strlen(s));
}

static void fill(uint8_t *p, size_t n, uint64_t seed) {
    rw_rng r;
    rw_rng_seed(&r, seed);
    for (size_t i = 0; i < n; i++)
        p[i] = (uint8_t)(rw_rng_u64(&r) >> 56);
}

/* ---- safetensors ---------------------------------------------------------------------------- */

/* Writes a file with the streaming writer and returns its bytes. */
static uint8_t *st_image(const rw_st_decl *d, size_t n, const char *const *meta, size_t *len) {
    char path[] = "/tmp/rw_fuzz_seed_XXXXXX";
    int fd = mkstemp(path);
    if (fd < 0) die("mkstemp", NULL);
    close(fd);
    rw_err e;
    rw_st_writer *w;
    if (rw_st_writer_create(path, d, n, meta, &w, &e) != RW_OK) die("st writer", &e);
    for (size_t i = 0; i < n; i++) {
        size_t b = (size_t)rw_shape_numel(d[i].ndim, d[i].shape) * rw_dtype_size(d[i].dtype);
        uint8_t *buf = malloc(b ? b : 1);
        fill(buf, b, i + 1);
        if (rw_st_writer_write(w, buf, b, &e) != RW_OK) die("st write", &e);
        free(buf);
    }
    if (rw_st_writer_close(w, &e) != RW_OK) die("st close", &e);
    char *text;
    if (rw_read_file(path, &text, len, &e) != RW_OK) die("read back", &e);
    unlink(path);
    return (uint8_t *)text;
}

/* A file from a literal header and `data_len` bytes of data. */
static void st_raw(const char *name, uint64_t hlen_field, const char *hdr, size_t data_len) {
    size_t hl = strlen(hdr), n = 8 + hl + data_len;
    uint8_t *b = malloc(n);
    for (int i = 0; i < 8; i++)
        b[i] = (uint8_t)(hlen_field >> (8 * i));
    memcpy(b + 8, hdr, hl);
    fill(b + 8 + hl, data_len, 7);
    put("safetensors", name, b, n);
    free(b);
}

static void seeds_safetensors(void) {
    rw_st_decl d[] = {
        {"model.norm.weight", RW_DTYPE_BF16, 1, {16}},
        {"model.layers.0.self_attn.q_proj.weight", RW_DTYPE_E4M3, 2, {8, 32}},
        {"model.layers.0.self_attn.q_proj.weight_scale_inv", RW_DTYPE_U8, 2, {8, 1}},
        {"f32", RW_DTYPE_F32, 3, {2, 2, 3}},
        {"i32", RW_DTYPE_I32, 1, {5}},
        {"f16", RW_DTYPE_F16, 2, {3, 1}},
        {"i64", RW_DTYPE_I64, 1, {2}},
        {"scalar", RW_DTYPE_F64, 0, {0}},
        {"empty", RW_DTYPE_BF16, 2, {0, 4}},
        {"scale_f32", RW_DTYPE_F32, 2, {1, 1}},
        {"mask", RW_DTYPE_BOOL, 1, {3}},
    };
    const char *meta[] = {"format", "pt", "producer", "rw", NULL};
    size_t len;
    uint8_t *b = st_image(d, sizeof d / sizeof d[0], meta, &len);
    put("safetensors", "valid_many_dtypes", b, len);
    /* near-valid: cut inside the data, inside the header, off by one */
    put("safetensors", "truncated_data", b, len - 5);
    uint64_t hl = 0;
    for (int i = 0; i < 8; i++)
        hl |= (uint64_t)b[i] << (8 * i);
    put("safetensors", "truncated_header", b, 8 + hl / 2);
    b[0]++;
    put("safetensors", "header_len_plus_one", b, len);
    free(b);
    b = st_image(d, 1, NULL, &len);
    put("safetensors", "valid_one_tensor", b, len);
    free(b);
    b = st_image(d, 0, NULL, &len);
    put("safetensors", "valid_empty", b, len);
    free(b);

    /* headers that are refused (or, last, accepted with padding): name, JSON, data bytes */
    static const struct {
        const char *name, *header;
        uint64_t data;
    } raw[] = {
        {"overlap",
         "{\"a\":{\"dtype\":\"BF16\",\"shape\":[2],\"data_offsets\":[0,4]},"
         "\"b\":{\"dtype\":\"BF16\",\"shape\":[2],\"data_offsets\":[2,6]}}",
         6},
        {"size_mismatch", "{\"a\":{\"dtype\":\"BF16\",\"shape\":[3],\"data_offsets\":[0,4]}}", 4},
        {"torch_dtype_name",
         "{\"a\":{\"dtype\":\"bfloat16\",\"shape\":[2],\"data_offsets\":[0,4]}}", 4},
        {"shape_overflow",
         "{\"a\":{\"dtype\":\"F32\",\"shape\":[4611686018427387904,4],\"data_offsets\":[0,0]}}", 0},
        {"metadata_nonstring_7dims",
         "{\"__metadata__\":{\"format\":\"pt\",\"n\":1},\"a\":{\"dtype\":\"U8\","
         "\"shape\":[1,1,1,1,1,1,1],\"data_offsets\":[0,1]}}",
         1},
        {"duplicate_name",
         "{\"a\":{\"dtype\":\"I8\",\"shape\":[2],\"data_offsets\":[0,2]},"
         "\"a\":{\"dtype\":\"I8\",\"shape\":[2],\"data_offsets\":[2,4]}}",
         4},
        {"reversed_offsets", "{\"a\":{\"dtype\":\"I16\",\"shape\":[2],\"data_offsets\":[8,4]}}", 8},
        {"header_padding", "{\"a\":{\"dtype\":\"F8_E4M3\",\"shape\":[2],\"data_offsets\":[0,2]}}  ",
         2},
    };
    for (size_t i = 0; i < sizeof raw / sizeof *raw; i++)
        st_raw(raw[i].name, strlen(raw[i].header), raw[i].header, raw[i].data);
    const char *h2 = raw[1].header;
    st_raw("huge_header_len", UINT64_C(1) << 40, h2, 4);
}

/* ---- config -----------------------------------------------------------------------------------
 */

static char *read_text(const char *root, const char *rel, size_t *len) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", root, rel);
    char *t;
    rw_err e;
    if (rw_read_file(path, &t, len, &e) != RW_OK) die(path, &e);
    return t;
}

/* The fixture config with the text `add` inserted after its opening brace. */
static void config_variant(const char *fixture, const char *name, const char *add) {
    size_t n = strlen(fixture) + strlen(add) + 2;
    char *b = malloc(n);
    const char *brace = strchr(fixture, '{');
    snprintf(b, n, "{%s%s", add, brace + 1);
    put_str("config", name, b);
    free(b);
}

static void seeds_config(const char *root) {
    size_t len;
    char *fx = read_text(root, "tests/fixtures/qwen3-moe-tiny/config.json", &len);
    put_str("config", "fixture", fx);
    const char *mx = "\"quantization_config\": {\"quant_method\": \"mxfp8\", \"weight_block_size\":"
                     " [1, 32], \"fmt\": \"e4m3\", \"scale_fmt\": \"ue8m0\","
                     " \"activation_scheme\": \"dynamic\", \"modules_to_not_convert\":"
                     " [\"model.layers.2.\", \"lm_head\"]},";
    config_variant(fx, "fixture_mxfp8", mx);
    config_variant(fx, "fixture_fp8_block",
                   "\"quantization_config\": {\"quant_method\": \"fp8\", \"weight_block_size\":"
                   " [128, 128], \"ignored_layers\": [\"model.layers.0.\"]},");
    config_variant(fx, "fixture_fp8_ue8m0",
                   "\"quantization_config\": {\"quant_method\": \"fp8\", \"weight_block_size\":"
                   " [1, 32], \"scale_fmt\": \"ue8m0\"},");
    config_variant(fx, "bad_block",
                   "\"quantization_config\": {\"quant_method\": \"mxfp8\","
                   " \"weight_block_size\": [128, 128]},");
    config_variant(fx, "dense_layers", "\"mlp_only_layers\": [1],");
    config_variant(fx, "num_experts_spelling", "\"num_experts\": 4,");
    config_variant(fx, "rope_scaling", "\"rope_scaling\": {\"type\": \"yarn\"},");
    free(fx);
    char *c30 = read_text(root, "tools/configs/qwen3-30b-a3b.json", &len);
    put_str("config", "qwen3_30b_a3b", c30);
    free(c30);
    char *c235 = read_text(root, "tools/configs/qwen3-235b-a22b.json", &len);
    put_str("config", "qwen3_235b_a22b", c235);
    free(c235);
    put_str("config", "minimal",
            "{\"vocab_size\":64,\"hidden_size\":64,\"num_hidden_layers\":1,"
            "\"num_attention_heads\":2,\"num_local_experts\":2,\"num_experts_per_tok\":1,"
            "\"moe_intermediate_size\":32,\"rope_theta\":10000,\"tie_word_embeddings\":true}");
    put_str("config", "kv_not_divisor",
            "{\"vocab_size\":64,\"hidden_size\":64,\"num_hidden_layers\":1,"
            "\"num_attention_heads\":3,\"num_key_value_heads\":2,\"num_experts\":2,"
            "\"num_experts_per_tok\":3,\"moe_intermediate_size\":32}");
}

#ifdef RW_FUZZ_HAVE_SYNC
/* ---- msg
 * ------------------------------------------------------------------------------------------ */

static rw_mw *W;

static void emit(const char *target, const char *name) {
    const void *p;
    size_t n;
    rw_err e;
    if (rw_mw_finish(W, &p, &n, &e) != RW_OK) die(name, &e);
    put(target, name, p, n);
    rw_mw_reset(W);
}

static void request_json(const char *name, const char *cmd, const char *args) {
    rw_err e;
    rw_mw_request(W, 17, cmd);
    if (rw_mw_json(W, args, &e) != RW_OK) die(name, &e);
    emit("msg", name);
}

/* The message forms of protocol 2: session tokens on an update session's commands, a forced
 * abort, begin_update's reply with its token, a generate result in parts, and text that is not
 * UTF-8 (an unknown command's name, an error message to repair). */
static void seeds_msg_protocol2(void) {
    static const char tok[] = "\"0123456789abcdef0123456789abcdef\"";
    char a[512];
    snprintf(a, sizeof a, "{\"session\": %s}", tok);
    request_json("commit_session", "commit_update", a);
    request_json("abort_session", "abort_update", a);
    request_json("abort_force", "abort_update", "{\"force\": true}");
    snprintf(a, sizeof a, "{\"session\": %s, \"path\": \"/data/ckpt/step-13\"}", tok);
    request_json("from_disk_session", "update_weights_from_disk", a);
    snprintf(a, sizeof a,
             "{\"session\": %s, \"transport\": \"zmq\", \"manifest\": {\"nbytes\": 256, "
             "\"tensors\": [{\"name\": \"model.norm.weight\", \"dtype\": \"bf16\", "
             "\"shape\": [128], \"offset\": 0, \"nbytes\": 256}]}}",
             tok);
    request_json("update_weights_session", "update_weights", a);
    request_json("session_not_a_string", "commit_update", "{\"session\": 7}");
    rw_err e;
    rw_mw_reply_ok(W, 5);
    snprintf(a, sizeof a,
             "{\"version\": \"step-13\", \"previous_version\": \"step-12\", \"state\": "
             "\"updating\", \"bucket_bytes\": 4194304, \"session\": %s, "
             "\"max_frame_bytes\": 1073741824}",
             tok);
    if (rw_mw_json(W, a, &e) != RW_OK) die("reply_begin_session", &e);
    emit("msg", "reply_begin_session");
    rw_mw_reply_ok(W, 21);
    if (rw_mw_json(W,
                   "{\"stream\": false, \"more\": true, \"outputs\": [{\"index\": 0, "
                   "\"prompt_index\": 0, \"sample\": 0, \"tokens\": [3, 4], \"logprobs\": [-0.5, "
                   "-0.25], \"finish\": \"stop\", \"prompt_tokens\": 3, \"weight_version\": "
                   "\"v1\", \"version_spans\": [{\"version\": \"v1\", \"begin\": 0, \"end\": 2}], "
                   "\"first_token_s\": 0.01, \"total_s\": 0.02}, {\"index\": 1, \"offset\": 0, "
                   "\"tokens\": [7], \"logprobs\": [-1.5], \"top_logprobs\": [[[7, -1.5], [2, "
                   "-2.0]]]}]}",
                   &e) != RW_OK)
        die("reply_generate_part", &e);
    emit("msg", "reply_generate_part");
    rw_mw_reply_ok(W, 21);
    if (rw_mw_json(W,
                   "{\"stream\": false, \"outputs\": [{\"index\": 1, \"offset\": 1, "
                   "\"prompt_index\": 1, \"sample\": 0, \"tokens\": [8], \"logprobs\": [-0.75], "
                   "\"top_logprobs\": [[[8, -0.75], [1, -3.0]]], \"finish\": \"length\", "
                   "\"prompt_tokens\": 2, \"weight_version\": \"v2\", \"version_spans\": "
                   "[{\"version\": \"v1\", \"begin\": 0, \"end\": 1}, {\"version\": \"v2\", "
                   "\"begin\": 1, \"end\": 2}], \"first_token_s\": 0.01, \"total_s\": 0.5}]}",
                   &e) != RW_OK)
        die("reply_generate_last_part", &e);
    emit("msg", "reply_generate_last_part");
    /* an unknown command whose name is not UTF-8, an error message that is not either */
    rw_mw_request(W, 23, "gen\xff\xfe\xc3");
    rw_mw_map(W, 0);
    emit("msg", "unknown_command_not_utf8");
    rw_mw_map(W, 4);
    rw_mw_kv_u64(W, "protocol", RW_PROTOCOL_VERSION);
    rw_mw_kv_u64(W, "id", 23);
    rw_mw_kv_bool(W, "ok", false);
    rw_mw_str(W, "error");
    rw_mw_map(W, 3);
    rw_mw_kv_str(W, "status", "protocol");
    rw_mw_kv_u64(W, "code", RW_E_PROTOCOL);
    rw_mw_kv_str(W, "message", "unknown command 'gen\xff\xfe\xc3'");
    emit("msg", "reply_error_not_utf8");
}

static void seeds_msg(void) {
    request_json("generate", "generate",
                 "{\"requests\": [{\"rid\": \"a\", \"prompt\": [1, 2, 3, 4], \"max_new_tokens\": 8,"
                 " \"temperature\": 0.7, \"top_p\": 0.9, \"top_k\": 20, \"seed\": 12345,"
                 " \"stop\": [0, 5], \"logprobs\": true, \"top_logprobs\": 2}]}");
    request_json("generate_greedy", "generate",
                 "{\"requests\": [{\"prompt\": [7], \"max_new_tokens\": 1}], \"stream\": false}");
    request_json("abort_one", "abort", "{\"rid\": \"a\"}");
    request_json("abort_all", "abort", "{\"all\": true}");
    request_json("pause", "pause", "{\"mode\": \"retract\"}");
    request_json("resume", "resume", "{}");
    request_json("flush_cache", "flush_cache", "{}");
    request_json("health", "health", "{}");
    request_json("begin_update", "begin_update",
                 "{\"version\": \"step-12\", \"flush_cache\": true, \"bucket_bytes\": 536870912,"
                 " \"timeout_s\": 30.5}");
    request_json("commit_update", "commit_update", "{}");
    request_json("init_group", "init_weights_update_group",
                 "{\"unique_id\": \"00112233445566778899aabbccddeeff00112233445566778899aabbccdd"
                 "eeff00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff001122334455"
                 "66778899aabbccddeeff00112233445566778899aabbccddeeff00112233445566778899aabbccdd"
                 "eeff00112233445566778899aabbccddeeff\", \"world_size\": 3, \"rank_offset\": 1,"
                 " \"group_name\": \"weights\", \"timeout_s\": 60}");
    request_json("from_disk", "update_weights_from_disk",
                 "{\"path\": \"/data/ckpt/step-12\", \"only\": \"^model\\\\.layers\\\\.0\\\\.\","
                 " \"version\": \"disk-12\"}");
    request_json("checksum", "checksum",
                 "{\"names\": [\"model.norm.weight\", \"lm_head.weight\"]}");
    request_json("get_weights", "get_weights", "{\"name\": \"model.embed_tokens.weight\"}");
    request_json("release_memory", "release_memory", "{\"weights\": true, \"kv_cache\": false}");

    /* an update_weights envelope with a real manifest */
    rw_sync_manifest *m;
    rw_err e;
    if (rw_sync_manifest_create(&m, &e) != RW_OK) die("manifest", &e);
    int64_t s1[1] = {128}, s2[3] = {8, 192, 128};
    rw_sync_manifest_add(m, "model.norm.weight", RW_DTYPE_BF16, 1, s1, -1, 0, 0, RW_PIECE_PLAIN,
                         NULL, &e);
    rw_sync_manifest_add(m, "model.layers.0.mlp.experts.gate_up_proj", RW_DTYPE_BF16, 3, s2, 1, 0,
                         48, RW_PIECE_GATE_UP, NULL, &e);
    rw_mw_request(W, 3, "update_weights");
    rw_mw_map(W, 2);
    rw_mw_str(W, "transport");
    rw_mw_str(W, "zmq");
    rw_mw_str(W, "manifest");
    rw_sync_manifest_write(m, W);
    emit("msg", "update_weights");
    rw_sync_manifest_destroy(m);

    /* near-valid envelopes */
    request_json("unknown_command", "generate_all_the_things", "{}");
    rw_mw_map(W, 3);
    rw_mw_str(W, "protocol");
    rw_mw_u64(W, RW_PROTOCOL_VERSION + 1);
    rw_mw_str(W, "id");
    rw_mw_u64(W, 1);
    rw_mw_str(W, "cmd");
    rw_mw_str(W, "health");
    emit("msg", "protocol_next");
    rw_mw_map(W, 3);
    rw_mw_str(W, "protocol");
    rw_mw_u64(W, 1); /* the version before session tokens */
    rw_mw_str(W, "id");
    rw_mw_u64(W, 1);
    rw_mw_str(W, "cmd");
    rw_mw_str(W, "health");
    emit("msg", "protocol_1");
    rw_mw_map(W, 3);
    rw_mw_str(W, "protocol");
    rw_mw_u64(W, RW_PROTOCOL_VERSION);
    rw_mw_str(W, "id");
    rw_mw_i64(W, -1);
    rw_mw_str(W, "cmd");
    rw_mw_bin(W, "health", 6);
    emit("msg", "negative_id_bin_cmd");
    rw_mw_array(W, 2);
    rw_mw_f64(W, 1.5);
    rw_mw_nil(W);
    emit("msg", "not_a_map");

    /* replies */
    rw_mw_reply_ok(W, 17);
    rw_mw_json(W,
               "{\"results\": [{\"rid\": \"a\", \"tokens\": [5, 6], \"logprobs\": [-0.5, -1.25],"
               " \"finish\": \"length\", \"versions\": [{\"version\": 3, \"begin\": 0, "
               "\"end\": 2}]}]}",
               &e);
    emit("msg", "reply_generate");
    rw_mw_reply_err(W, 9, RW_E_WEIGHTS_INCOMPLETE,
                    "weights: a failed or aborted update left them partly written");
    emit("msg", "reply_error");
    rw_mw_map(W, 4);
    rw_mw_str(W, "protocol");
    rw_mw_u64(W, RW_PROTOCOL_VERSION);
    rw_mw_str(W, "id");
    rw_mw_u64(W, 9);
    rw_mw_str(W, "ok");
    rw_mw_bool(W, false);
    rw_mw_str(W, "error");
    rw_mw_map(W, 3);
    rw_mw_str(W, "status");
    rw_mw_str(W, "from_the_future");
    rw_mw_str(W, "code");
    rw_mw_u64(W, 99);
    rw_mw_str(W, "message");
    rw_mw_str(W, "a newer peer");
    emit("msg", "reply_unknown_code");
    rw_mw_reply_ok(W, 1);
    rw_mw_nil(W);
    emit("msg", "reply_nil");
    seeds_msg_protocol2();
}

/* ---- manifest ---------------------------------------------------------------------------------
 */
/* Input layout of fuzz_manifest: [selector][u32 manifest length][manifest][bucket bytes]. */

static void manifest_seed(const char *name, uint8_t sel, const rw_sync_manifest *m,
                          uint64_t nbytes_delta, size_t frame_delta, uint64_t seed) {
    rw_mw_reset(W);
    rw_sync_manifest *c;
    rw_err e;
    if (rw_sync_manifest_create(&c, &e) != RW_OK) die("manifest", &e);
    for (size_t i = 0; i < rw_sync_manifest_count(m); i++)
        rw_sync_manifest_push(c, rw_sync_manifest_at(m, i), &e);
    rw_sync_manifest_set_bytes(c, rw_sync_manifest_bytes(m) + nbytes_delta);
    rw_sync_manifest_write(c, W);
    rw_sync_manifest_destroy(c);
    const void *p;
    size_t n;
    if (rw_mw_finish(W, &p, &n, &e) != RW_OK) die(name, &e);
    size_t frame = (size_t)rw_sync_manifest_bytes(m) + frame_delta;
    /* bit 0x20: the tail is a pattern the fuzz target repeats to the manifest's size */
    if (sel & 0x20) frame = frame < 512 ? frame : 512;
    size_t total = 5 + n + frame;
    uint8_t *b = malloc(total);
    b[0] = sel;
    for (int i = 0; i < 4; i++)
        b[1 + i] = (uint8_t)(n >> (8 * i));
    memcpy(b + 5, p, n);
    /* bf16 values of normal(0, 0.05): finite weights, as a trainer sends */
    rw_rng r;
    rw_rng_seed(&r, seed);
    uint16_t *v = malloc(frame + 2);
    for (size_t i = 0; i < frame / 2 + 1; i++)
        v[i] = rw_f32_to_bf16(0.05f * rw_rng_normal(&r));
    memcpy(b + 5 + n, v, frame);
    free(v);
    put("manifest", name, b, total);
    free(b);
    rw_mw_reset(W);
}

static void add(rw_sync_manifest *m, const char *name, rw_dtype dt, int nd, const int64_t *shape,
                int sd, int64_t sb, int64_t sl, rw_piece_layout lay) {
    rw_err e;
    if (rw_sync_manifest_add(m, name, dt, nd, shape, sd, sb, sl, lay, NULL, &e) != RW_OK)
        die(name, &e);
}

/* The tiny model of fuzz_manifest (the shape of tests/fixtures/qwen3-moe-tiny). */
static rw_config tiny;

static rw_status add_whole(const rw_wname *w, void *ctx) {
    char name[RW_SYNC_MAX_NAME];
    rw_name_format(w, name, sizeof name);
    int nd;
    int64_t shape[RW_MAX_DIMS];
    rw_err e;
    if (rw_config_weight_shape(&tiny, w, &nd, shape, &e) != RW_OK) die(name, &e);
    add(ctx, name, RW_DTYPE_BF16, nd, shape, -1, 0, 0, RW_PIECE_PLAIN);
    return RW_OK;
}

static void seeds_manifest(const char *root) {
    char path[4096];
    snprintf(path, sizeof path, "%s/tests/fixtures/qwen3-moe-tiny/config.json", root);
    rw_err ce;
    if (rw_config_load(path, &tiny, &ce) != RW_OK) die(path, &ce);
    rw_sync_manifest *m;
    rw_err e;
    if (rw_sync_manifest_create(&m, &e) != RW_OK) die("manifest", &e);
    int64_t H[1] = {128}, hd[1] = {32}, router[2] = {8, 128}, q[2] = {128, 128}, kv[2] = {64, 128},
            gate[2] = {96, 128}, down[2] = {128, 96}, gu[3] = {8, 192, 128}, emb[2] = {512, 128};
    /* bf16 TP1: whole tensors of several kinds */
    add(m, "model.norm.weight", RW_DTYPE_BF16, 1, H, -1, 0, 0, RW_PIECE_PLAIN);
    add(m, "model.layers.0.input_layernorm.weight", RW_DTYPE_BF16, 1, H, -1, 0, 0, RW_PIECE_PLAIN);
    add(m, "model.layers.1.self_attn.k_norm.weight", RW_DTYPE_BF16, 1, hd, -1, 0, 0,
        RW_PIECE_PLAIN);
    add(m, "model.layers.2.mlp.gate.weight", RW_DTYPE_BF16, 2, router, -1, 0, 0, RW_PIECE_PLAIN);
    manifest_seed("bf16_norms_router", 0x10, m, 0, 0, 1);
    manifest_seed("bf16_norms_router_tp2", 0x11, m, 0, 0, 2);
    manifest_seed("bf16_abort", 0x00, m, 0, 0, 3);
    manifest_seed("frame_short", 0x10, m, 0, (size_t)-2, 4);
    manifest_seed("frame_long", 0x10, m, 0, 64, 5);
    manifest_seed("bucket_larger_than_frame", 0x10, m, 256, 0, 6);
    manifest_seed("no_frame", 0x14, m, 0, 0, 7);
    manifest_seed("two_frames", 0x18, m, 0, 0, 8);
    manifest_seed("nccl_without_group", 0x1c, m, 0, 0, 9);
    /* protocol 2: update_weights without the session's token (bits 6-7 = 3; which wrong token
     * follows from the manifest's length) */
    manifest_seed("session_token_wrong_a", 0xf0, m, 0, 0, 31);
    manifest_seed("session_token_wrong_b", 0xe0, m, 0, 0, 32);
    rw_sync_manifest_clear(m);
    add(m, "model.layers.0.self_attn.q_proj.weight", RW_DTYPE_BF16, 2, q, -1, 0, 0, RW_PIECE_PLAIN);
    add(m, "model.layers.0.self_attn.k_proj.weight", RW_DTYPE_BF16, 2, kv, 0, 0, 32,
        RW_PIECE_PLAIN);
    add(m, "model.layers.0.self_attn.k_proj.weight", RW_DTYPE_BF16, 2, kv, 0, 32, 32,
        RW_PIECE_PLAIN);
    manifest_seed("attn_whole_and_shards", 0x30, m, 0, 0, 10);
    manifest_seed("attn_mxfp8_bf16_in", 0x32, m, 0, 0, 11);
    manifest_seed("attn_fp8_block_tp2", 0x33, m, 0, 0, 12);
    manifest_seed("session_token_wrong_c", 0xf3, m, 0, 0, 33);
    rw_sync_manifest_clear(m);
    add(m, "model.layers.1.mlp.experts.3.gate_proj.weight", RW_DTYPE_BF16, 2, gate, -1, 0, 0,
        RW_PIECE_PLAIN);
    add(m, "model.layers.1.mlp.experts.3.down_proj.weight", RW_DTYPE_BF16, 2, down, 1, 48, 48,
        RW_PIECE_PLAIN);
    manifest_seed("expert_whole_and_shard", 0x30, m, 0, 0, 13);
    manifest_seed("expert_tp2", 0x31, m, 0, 0, 14);
    manifest_seed("expert_mxfp8", 0x32, m, 0, 0, 15);
    manifest_seed("session_token_wrong_d", 0xd2, m, 0, 0, 34);
    rw_sync_manifest_clear(m);
    add(m, "model.layers.0.mlp.experts.gate_up_proj", RW_DTYPE_BF16, 3, gu, 1, 48, 48,
        RW_PIECE_GATE_UP);
    manifest_seed("fused_gate_up_shard", 0x30, m, 0, 0, 16);
    manifest_seed("fused_gate_up_shard_tp2", 0x31, m, 0, 0, 17);
    manifest_seed("session_token_wrong_e", 0xf0, m, 0, 0, 35);
    rw_sync_manifest_clear(m);
    /* pre-quantized mxfp8: e4m3 weight + UE8M0 scale [N, K/32] */
    int64_t qs[2] = {128, 4};
    add(m, "model.layers.1.self_attn.q_proj.weight", RW_DTYPE_E4M3, 2, q, -1, 0, 0, RW_PIECE_PLAIN);
    add(m, "model.layers.1.self_attn.q_proj.weight_scale_inv", RW_DTYPE_U8, 2, qs, -1, 0, 0,
        RW_PIECE_PLAIN);
    manifest_seed("prequantized_mxfp8", 0x32, m, 0, 0, 18);
    manifest_seed("prequantized_into_bf16", 0x30, m, 0, 0, 19);
    rw_sync_manifest_clear(m);
    /* does not fit the model */
    int64_t wrong[2] = {128, 64};
    add(m, "model.layers.0.self_attn.o_proj.weight", RW_DTYPE_BF16, 2, wrong, -1, 0, 0,
        RW_PIECE_PLAIN);
    manifest_seed("wrong_shape", 0x30, m, 0, 0, 20);
    rw_sync_manifest_clear(m);
    add(m, "model.layers.3.input_layernorm.weight", RW_DTYPE_BF16, 1, H, -1, 0, 0, RW_PIECE_PLAIN);
    manifest_seed("layer_out_of_range", 0x30, m, 0, 0, 21);
    rw_sync_manifest_clear(m);
    add(m, "model.norm.weight", RW_DTYPE_F32, 1, H, -1, 0, 0, RW_PIECE_PLAIN);
    manifest_seed("wrong_dtype", 0x30, m, 0, 0, 22);
    rw_sync_manifest_clear(m);
    add(m, "model.layers.0.mlp.experts.8.up_proj.weight", RW_DTYPE_BF16, 2, gate, -1, 0, 0,
        RW_PIECE_PLAIN);
    manifest_seed("expert_out_of_range", 0x30, m, 0, 0, 23);
    rw_sync_manifest_clear(m);
    add(m, "model.embed_tokens.weight", RW_DTYPE_BF16, 2, emb, 0, 256, 64, RW_PIECE_PLAIN);
    add(m, "lm_head.weight", RW_DTYPE_BF16, 2, emb, 0, 0, 32, RW_PIECE_PLAIN);
    manifest_seed("vocab_shards", 0x30, m, 0, 0, 24);
    manifest_seed("vocab_shards_tp2", 0x31, m, 0, 0, 25);
    manifest_seed("session_token_wrong_f", 0xf0, m, 0, 0, 36);
    rw_sync_manifest_clear(m);
    manifest_seed("empty_bucket", 0x30, m, 0, 0, 26);
    /* every weight of the model in one bucket (the frame is the repeated pattern) */
    if (rw_config_for_each_weight(&tiny, add_whole, m) != RW_OK) die("weights", NULL);
    manifest_seed("whole_model_commit", 0x30, m, 0, 0, 27);
    manifest_seed("whole_model_tp2", 0x31, m, 0, 0, 28);
    manifest_seed("whole_model_mxfp8", 0x32, m, 0, 0, 29);
    manifest_seed("whole_model_fp8_block", 0x33, m, 0, 0, 30);
    rw_sync_manifest_destroy(m);
    rw_config_free(&tiny);
}
#endif

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: %s SOURCE_ROOT OUT_DIR\n", argv[0]);
        return 2;
    }
    out_dir = argv[2];
    mkdir_p(out_dir);
    seeds_safetensors();
    seeds_config(argv[1]);
#ifdef RW_FUZZ_HAVE_SYNC
    rw_err e;
    if (rw_mw_create(&W, &e) != RW_OK) die("writer", &e);
    seeds_msg();
    seeds_manifest(argv[1]);
    rw_mw_destroy(W);
#endif
    printf("wrote %d seed inputs under %s\n", n_written, out_dir);
    return 0;
}
