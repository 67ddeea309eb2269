/* test_rw_ckpt.c - the rw-ckpt program: `inspect` on the fixture, on broken, quantized (mxfp8 and
 * fp8 block) and fused-expert checkpoints, and `random` on a scaled-down config forced into
 * several files (full tensor set accepted by inspect, deterministic per seed, the value
 * distributions, small peak memory). The path of rw-ckpt is argv[1] (meson passes it). */
#include "rw_test.h"

#include <fcntl.h>
#include <ftw.h>
#include <math.h>
#include <spawn.h>
#include <stdio.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

extern char **environ;
static const char *rw_ckpt_path;

/* ---- helpers ------------------------------------------------------------------------------- */

/* Runs rw-ckpt with `args` (NULL-terminated); returns the exit status, output (stdout + stderr)
 * in *out (caller frees). */
static int run_tool(const char *const *args, char **out) {
    char log[] = "/tmp/rw_test_ckpt_out_XXXXXX";
    int fd = mkstemp(log);
    assert_true(fd >= 0);
    const char *argv[32];
    int n = 0;
    argv[n++] = rw_ckpt_path;
    for (; args[n - 1] && n < 31; n++)
        argv[n] = args[n - 1];
    argv[n] = NULL;
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, fd, 1);
    posix_spawn_file_actions_adddup2(&fa, fd, 2);
    pid_t pid;
    int rc = posix_spawn(&pid, rw_ckpt_path, &fa, NULL, (char *const *)argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    if (rc != 0) fail_msg("cannot run %s: %s", rw_ckpt_path, strerror(rc));
    int status = 0;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    close(fd);
    size_t len;
    rw_err e = {0};
    RW_ASSERT_OK(rw_read_file(log, out, &len, &e), &e);
    unlink(log);
    if (!WIFEXITED(status)) fail_msg("rw-ckpt died (status %d); output:\n%s", status, *out);
    return WEXITSTATUS(status);
}

/* True if some output line starts with `label` and contains every needle. */
static bool has_line(const char *out, const char *label, const char *n1, const char *n2) {
    const char *p = out;
    while (*p) {
        const char *e = strchr(p, '\n');
        size_t len = e ? (size_t)(e - p) : strlen(p);
        char line[2048];
        snprintf(line, sizeof line, "%.*s", (int)len, p);
        if (!strncmp(line, label, strlen(label)) && strstr(line, n1) && (!n2 || strstr(line, n2)))
            return true;
        p += len + (e ? 1 : 0);
    }
    return false;
}

#define EXPECT_LINE(out, label, n1, n2)                                                            \
    do {                                                                                           \
        if (!has_line((out), (label), (n1), (n2)))                                                 \
            fail_msg("no '%s' line with '%s'%s%s in:\n%s", (label), (n1), (n2) ? " and " : "",     \
                     (n2) ? (const char *)(n2) : "", (out));                                       \
    } while (0)

typedef struct {
    char name[160];
    rw_dtype dtype;
    int ndim;
    int64_t shape[RW_MAX_DIMS];
    const void *data; /* NULL: random bytes */
} spec;

typedef struct {
    spec *s;
    size_t n, cap;
} spec_list;

static spec *spec_add(spec_list *l, const char *name, rw_dtype dt, int ndim, const int64_t *shape,
                      const void *data) {
    if (l->n == l->cap) {
        l->cap = l->cap ? 2 * l->cap : 256;
        l->s = realloc(l->s, l->cap * sizeof *l->s);
        assert_non_null(l->s);
    }
    spec *s = &l->s[l->n++];
    memset(s, 0, sizeof *s);
    snprintf(s->name, sizeof s->name, "%s", name);
    s->dtype = dt;
    s->ndim = ndim;
    memcpy(s->shape, shape, (size_t)ndim * sizeof *shape);
    s->data = data;
    return s;
}

static void spec_remove(spec_list *l, const char *name) {
    for (size_t i = 0; i < l->n; i++) {
        if (!strcmp(l->s[i].name, name)) {
            memmove(&l->s[i], &l->s[i + 1], (l->n - i - 1) * sizeof *l->s);
            l->n--;
            return;
        }
    }
    fail_msg("no tensor %s to remove", name);
}

static spec *spec_find(spec_list *l, const char *name) {
    for (size_t i = 0; i < l->n; i++)
        if (!strcmp(l->s[i].name, name)) return &l->s[i];
    fail_msg("no tensor %s", name);
    return NULL;
}

/* The fixture's tensors as a spec list (borrowing the open checkpoint's bytes). */
static void fixture_specs(const rw_ckpt *ck, spec_list *l) {
    for (size_t i = 0; i < rw_ckpt_count(ck); i++) {
        const rw_st_entry *e = rw_ckpt_at(ck, i);
        spec_add(l, e->name, e->dtype, e->ndim, e->shape, e->data);
    }
}

static void write_ckpt(const char *dir, const spec_list *l, const char *config_text) {
    rw_st_decl *d = calloc(l->n, sizeof *d);
    assert_non_null(d);
    size_t total = 0;
    for (size_t i = 0; i < l->n; i++) {
        d[i] = (rw_st_decl){l->s[i].name, l->s[i].dtype, l->s[i].ndim, {0}};
        memcpy(d[i].shape, l->s[i].shape, sizeof d[i].shape);
        total += (size_t)rw_shape_numel(d[i].ndim, d[i].shape) * rw_dtype_size(d[i].dtype);
    }
    char path[600];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    rw_err e = {0};
    rw_st_writer *w = NULL;
    RW_ASSERT_OK(rw_st_writer_create(path, d, l->n, NULL, &w, &e), &e);
    rw_rng r;
    rw_rng_seed(&r, total);
    for (size_t i = 0; i < l->n; i++) {
        size_t nb = (size_t)rw_shape_numel(d[i].ndim, d[i].shape) * rw_dtype_size(d[i].dtype);
        uint8_t *buf = malloc(nb ? nb : 1);
        assert_non_null(buf);
        if (l->s[i].data)
            memcpy(buf, l->s[i].data, nb);
        else
            for (size_t k = 0; k < nb; k++)
                buf[k] = (uint8_t)(rw_rng_u64(&r) >> 56);
        RW_ASSERT_OK(rw_st_writer_write(w, buf, nb, &e), &e);
        free(buf);
    }
    RW_ASSERT_OK(rw_st_writer_close(w, &e), &e);
    free(d);
    snprintf(path, sizeof path, "%s/config.json", dir);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(config_text, f);
    fclose(f);
}

static char *fixture_config_text(void) {
    char p[1024], *text = NULL;
    size_t len;
    rw_err e = {0};
    RW_ASSERT_OK(
        rw_read_file(rw_test_path(p, sizeof p, RW_TEST_FIXTURE "/config.json"), &text, &len, &e),
        &e);
    return text;
}

/* The fixture config with a quantization_config object inserted. */
static char *with_quant(const char *base, const char *qcfg) {
    const char *brace = strchr(base, '{');
    size_t n = strlen(base) + strlen(qcfg) + 64;
    char *s = malloc(n);
    snprintf(s, n, "{\"quantization_config\": %s,%s", qcfg, brace + 1);
    return s;
}

static rw_ckpt *open_fixture(void) {
    char p[1024];
    rw_err e = {0};
    rw_ckpt *ck = NULL;
    RW_ASSERT_OK(rw_ckpt_open(rw_test_path(p, sizeof p, RW_TEST_FIXTURE), &ck, &e), &e);
    return ck;
}

/* ---- inspect ------------------------------------------------------------------------------- */

static void test_inspect_fixture(void **state) {
    (void)state;
    char p[1024], *out = NULL;
    const char *args[] = {"inspect", rw_test_path(p, sizeof p, RW_TEST_FIXTURE), NULL};
    int rc = run_tool(args, &out);
    if (rc != 0) fail_msg("inspect fixture exited %d:\n%s", rc, out);
    EXPECT_LINE(out, "config", "layers 3,", "experts 8,");
    EXPECT_LINE(out, "config", "top-k 2,", "heads 4 q / 2 kv x 32");
    EXPECT_LINE(out, "config", "vocab 512", "moe_intermediate 96");
    EXPECT_LINE(out, "quantization", "none", NULL);
    EXPECT_LINE(out, "tensors", "102,", NULL);
    EXPECT_LINE(out, "  bf16", "102 tensors", NULL);
    EXPECT_LINE(out, "check", "all 102 tensors recognised", "none missing");
    free(out);
}

static void test_inspect_broken(void **state) {
    (void)state;
    rw_ckpt *ck = open_fixture();
    spec_list l = {0};
    fixture_specs(ck, &l);
    spec_remove(&l, "model.layers.1.self_attn.k_proj.weight");
    spec_remove(&l, "model.layers.2.mlp.experts.5.down_proj.weight");
    spec_remove(&l, "model.norm.weight");
    int64_t s1[] = {64, 128}, s2[] = {96, 64}, s3[] = {128}, s4[] = {4};
    spec_add(&l, "model.layers.0.mlp.shared_expert.up_proj.weight", RW_DTYPE_BF16, 2, s1, NULL);
    spec_add(&l, "model.layers.7.input_layernorm.weight", RW_DTYPE_BF16, 1, s3, NULL);
    spec_add(&l, "model.layers.0.mlp.experts.8.up_proj.weight", RW_DTYPE_BF16, 2, s2, NULL);
    spec *up = spec_find(&l, "model.layers.1.mlp.experts.3.up_proj.weight");
    up->shape[1] = 64;
    up->data = NULL;
    spec *qn = spec_find(&l, "model.layers.0.self_attn.q_norm.weight");
    qn->dtype = RW_DTYPE_I16;
    spec *kn = spec_find(&l, "model.layers.0.self_attn.k_norm.weight");
    kn->dtype = RW_DTYPE_E4M3;
    kn->shape[0] = 32;
    spec_add(&l, "model.layers.1.self_attn.o_proj.weight_scale_inv", RW_DTYPE_U8, 1, s4, NULL);
    char *dir = rw_test_tmpdir("rw_test_ckpt_"), *cfg = fixture_config_text();
    write_ckpt(dir, &l, cfg);
    char *out = NULL;
    const char *args[] = {"inspect", dir, NULL};
    int rc = run_tool(args, &out);
    if (rc != 1) fail_msg("broken checkpoint: exit %d, want 1:\n%s", rc, out);
    EXPECT_LINE(out, "missing", "model.layers.1.self_attn.k_proj.weight", NULL);
    EXPECT_LINE(out, "missing", "model.layers.2.mlp.experts.5.down_proj.weight", NULL);
    EXPECT_LINE(out, "missing", "model.norm.weight", NULL);
    EXPECT_LINE(out, "unknown", "model.layers.0.mlp.shared_expert.up_proj.weight", NULL);
    EXPECT_LINE(out, "unknown", "model.layers.7.input_layernorm.weight", "3 layers");
    EXPECT_LINE(out, "unknown", "model.layers.0.mlp.experts.8.up_proj.weight", "8 experts");
    EXPECT_LINE(out, "mis-shaped", "model.layers.1.mlp.experts.3.up_proj.weight: [96, 64] bf16",
                "expected [96, 128]");
    EXPECT_LINE(out, "bad dtype", "model.layers.0.self_attn.q_norm.weight: i16", NULL);
    EXPECT_LINE(out, "bad dtype", "model.layers.0.self_attn.k_norm.weight: e4m3",
                "never quantized");
    EXPECT_LINE(out, "unexpected", "model.layers.1.self_attn.o_proj.weight_scale_inv",
                "without an e4m3 weight");
    EXPECT_LINE(out, "check", "100 of 103 tensors recognised",
                "3 unknown, 3 missing, 1 mis-shaped");
    EXPECT_LINE(out, "FAILED", "10 problems", NULL);
    free(out);
    /* the fixture alone, but its config says the embeddings are tied: lm_head is unexpected */
    l.n = 0;
    fixture_specs(ck, &l);
    char *tied = strdup(cfg);
    char *t = strstr(tied, "\"tie_word_embeddings\": false");
    assert_non_null(t);
    memcpy(t, "\"tie_word_embeddings\": true ", strlen("\"tie_word_embeddings\": true "));
    write_ckpt(dir, &l, tied);
    rc = run_tool(args, &out);
    assert_int_equal(rc, 1);
    EXPECT_LINE(out, "unexpected", "lm_head.weight", "tie_word_embeddings");
    free(out);
    free(tied);
    free(cfg);
    free(l.s);
    rw_test_rm_rf(dir);
    free(dir);
    rw_ckpt_close(ck);
}

static bool linear_name(const char *name) {
    return strstr(name, "_proj.weight") != NULL; /* q/k/v/o and the experts' gate/up/down */
}

/* Builds the fixture as a quantized checkpoint: linear weights of layers 0-1 in e4m3 with scales
 * of the method's shape; layer 2 kept in bf16 (listed in modules_to_not_convert). */
static void quantized_specs(const rw_ckpt *ck, bool mx, spec_list *l) {
    for (size_t i = 0; i < rw_ckpt_count(ck); i++) {
        const rw_st_entry *e = rw_ckpt_at(ck, i);
        bool q = linear_name(e->name) && strncmp(e->name, "model.layers.2.", 15);
        if (!q) {
            spec_add(l, e->name, e->dtype, e->ndim, e->shape, e->data);
            continue;
        }
        spec_add(l, e->name, RW_DTYPE_E4M3, e->ndim, e->shape, NULL);
        char sname[200];
        snprintf(sname, sizeof sname, "%.*s.weight_scale_inv", (int)strlen(e->name) - 7, e->name);
        int64_t ss[2];
        if (mx) {
            ss[0] = e->shape[0];
            ss[1] = e->shape[1] / 32;
        } else {
            ss[0] = (e->shape[0] + 127) / 128;
            ss[1] = (e->shape[1] + 127) / 128;
        }
        spec_add(l, sname, mx ? RW_DTYPE_U8 : RW_DTYPE_F32, 2, ss, NULL);
    }
}

static void test_inspect_quantized(void **state) {
    (void)state;
    rw_ckpt *ck = open_fixture();
    char *base = fixture_config_text(), *dir = rw_test_tmpdir("rw_test_ckpt_"), *out = NULL;
    const char *args[] = {"inspect", dir, NULL};
    char *mx_cfg = with_quant(base, "{\"quant_method\": \"mxfp8\", \"fmt\": \"e4m3\", "
                                    "\"weight_block_size\": [1, 32], \"scale_fmt\": \"ue8m0\", "
                                    "\"activation_scheme\": \"dynamic\", "
                                    "\"modules_to_not_convert\": [\"model.layers.2.\"]}");
    spec_list l = {0};
    quantized_specs(ck, true, &l);
    assert_int_equal(l.n, 102 + 2 * (4 + 24));
    write_ckpt(dir, &l, mx_cfg);
    int rc = run_tool(args, &out);
    if (rc != 0) fail_msg("mxfp8 checkpoint: exit %d:\n%s", rc, out);
    EXPECT_LINE(out, "quantization", "mxfp8", "1 module prefixes kept unquantized");
    EXPECT_LINE(out, "  e4m3", "56 tensors", NULL);
    EXPECT_LINE(out, "  u8", "56 tensors", NULL);
    EXPECT_LINE(out, "check", "all 158 tensors recognised", NULL);
    free(out);

    /* a wrong scale shape, a missing scale, a wrong scale dtype, and layer 2 quantized although
     * it is in modules_to_not_convert */
    spec_find(&l, "model.layers.0.mlp.experts.1.up_proj.weight_scale_inv")->shape[1] = 3;
    spec_remove(&l, "model.layers.1.self_attn.q_proj.weight_scale_inv");
    spec_find(&l, "model.layers.1.mlp.experts.0.down_proj.weight_scale_inv")->dtype = RW_DTYPE_I8;
    spec_find(&l, "model.layers.2.mlp.experts.2.gate_proj.weight")->dtype = RW_DTYPE_E4M3;
    spec_find(&l, "model.layers.2.mlp.experts.2.gate_proj.weight")->data = NULL;
    int64_t s[] = {96, 4};
    spec_add(&l, "model.layers.2.mlp.experts.2.gate_proj.weight_scale_inv", RW_DTYPE_U8, 2, s,
             NULL);
    write_ckpt(dir, &l, mx_cfg);
    rc = run_tool(args, &out);
    if (rc != 1) fail_msg("bad mxfp8 checkpoint: exit %d:\n%s", rc, out);
    EXPECT_LINE(out, "mis-shaped", "model.layers.0.mlp.experts.1.up_proj.weight_scale_inv: [96, 3]",
                "expected [96, 4]");
    EXPECT_LINE(out, "missing", "model.layers.1.self_attn.q_proj.weight_scale_inv",
                "scale of e4m3 weight");
    EXPECT_LINE(out, "bad dtype", "model.layers.1.mlp.experts.0.down_proj.weight_scale_inv: i8",
                "expected u8");
    EXPECT_LINE(out, "bad dtype", "model.layers.2.mlp.experts.2.gate_proj.weight",
                "modules_to_not_convert");
    free(out);

    /* e4m3 weights with a config that has no quantization_config */
    l.n = 0;
    quantized_specs(ck, true, &l);
    write_ckpt(dir, &l, base);
    rc = run_tool(args, &out);
    assert_int_equal(rc, 1);
    EXPECT_LINE(out, "bad dtype", "model.layers.0.self_attn.q_proj.weight",
                "no quantization_config");
    free(out);

    /* fp8 128x128 blocks: f32 scales [ceil(rows/128), ceil(cols/128)] */
    char *fp8_cfg = with_quant(base, "{\"quant_method\": \"fp8\", \"fmt\": \"e4m3\", "
                                     "\"weight_block_size\": [128, 128], "
                                     "\"activation_scheme\": \"dynamic\", "
                                     "\"modules_to_not_convert\": [\"model.layers.2.\"]}");
    l.n = 0;
    quantized_specs(ck, false, &l);
    write_ckpt(dir, &l, fp8_cfg);
    rc = run_tool(args, &out);
    if (rc != 0) fail_msg("fp8-block checkpoint: exit %d:\n%s", rc, out);
    EXPECT_LINE(out, "quantization", "fp8 block", NULL);
    EXPECT_LINE(out, "  f32", "56 tensors", NULL);
    free(out);
    /* mxfp8-shaped scales under an fp8-block config are refused */
    l.n = 0;
    quantized_specs(ck, true, &l);
    write_ckpt(dir, &l, fp8_cfg);
    rc = run_tool(args, &out);
    assert_int_equal(rc, 1);
    EXPECT_LINE(out, "mis-shaped", "model.layers.0.self_attn.q_proj.weight_scale_inv: [128, 4]",
                "expected [1, 1]");
    EXPECT_LINE(out, "bad dtype", "model.layers.0.self_attn.q_proj.weight_scale_inv: u8",
                "expected f32");
    free(out);
    free(fp8_cfg);
    free(mx_cfg);
    free(base);
    free(l.s);
    rw_test_rm_rf(dir);
    free(dir);
    rw_ckpt_close(ck);
}

/* Layers may hold their experts fused ([E, 2I, H] gate_up_proj, [E, H, I] down_proj). */
static void test_inspect_fused(void **state) {
    (void)state;
    rw_ckpt *ck = open_fixture();
    char *cfg = fixture_config_text(), *dir = rw_test_tmpdir("rw_test_ckpt_"), *out = NULL;
    const char *args[] = {"inspect", dir, NULL};
    spec_list l = {0};
    for (size_t i = 0; i < rw_ckpt_count(ck); i++) {
        const rw_st_entry *e = rw_ckpt_at(ck, i);
        if (strstr(e->name, "model.layers.1.mlp.experts.")) continue;
        spec_add(&l, e->name, e->dtype, e->ndim, e->shape, e->data);
    }
    int64_t gu[] = {8, 192, 128}, dn[] = {8, 128, 96};
    spec_add(&l, "model.layers.1.mlp.experts.gate_up_proj", RW_DTYPE_BF16, 3, gu, NULL);
    spec_add(&l, "model.layers.1.mlp.experts.down_proj", RW_DTYPE_BF16, 3, dn, NULL);
    write_ckpt(dir, &l, cfg);
    int rc = run_tool(args, &out);
    if (rc != 0) fail_msg("fused checkpoint: exit %d:\n%s", rc, out);
    EXPECT_LINE(out, "check", "all 80 tensors recognised", NULL);
    free(out);
    /* mis-shaped fused tensor, and layer 0 holding both forms of gate/up */
    spec_find(&l, "model.layers.1.mlp.experts.down_proj")->shape[2] = 192;
    spec_add(&l, "model.layers.0.mlp.experts.gate_up_proj", RW_DTYPE_BF16, 3, gu, NULL);
    write_ckpt(dir, &l, cfg);
    rc = run_tool(args, &out);
    assert_int_equal(rc, 1);
    EXPECT_LINE(out, "mis-shaped", "model.layers.1.mlp.experts.down_proj: [8, 128, 192]",
                "expected [8, 128, 96]");
    EXPECT_LINE(out, "unexpected", "layer 0 holds expert.gate_proj both per expert and fused",
                NULL);
    EXPECT_LINE(out, "unexpected", "layer 0 holds expert.up_proj both per expert and fused", NULL);
    free(out);
    free(cfg);
    free(l.s);
    rw_test_rm_rf(dir);
    free(dir);
    rw_ckpt_close(ck);
}

/* ---- random -------------------------------------------------------------------------------- */

static const char *SMALL_CONFIG =
    "{\"model_type\": \"qwen3_moe\", \"vocab_size\": 256, \"hidden_size\": 64,\n"
    " \"num_hidden_layers\": 2, \"num_attention_heads\": 4, \"num_key_value_heads\": 2,\n"
    " \"head_dim\": 16, \"num_experts\": 4, \"num_experts_per_tok\": 2,\n"
    " \"moe_intermediate_size\": 32, \"rope_theta\": 1000000.0, \"rms_norm_eps\": 1e-06,\n"
    " \"norm_topk_prob\": true, \"tie_word_embeddings\": false}\n";

static void stats(const rw_st_entry *e, double *mean, double *sd) {
    size_t n = (size_t)rw_shape_numel(e->ndim, e->shape);
    const uint16_t *v = e->data;
    double s = 0, s2 = 0;
    for (size_t i = 0; i < n; i++) {
        double x = rw_bf16_to_f32(v[i]);
        s += x;
        s2 += x * x;
    }
    *mean = s / (double)n;
    *sd = sqrt(s2 / (double)n - *mean * *mean);
}

static void test_random_small(void **state) {
    (void)state;
    char *dir = rw_test_tmpdir("rw_test_ckpt_"), cfg_path[600], out1[600], out2[600], out3[600];
    snprintf(cfg_path, sizeof cfg_path, "%s/small.json", dir);
    snprintf(out1, sizeof out1, "%s/a", dir);
    snprintf(out2, sizeof out2, "%s/b", dir);
    snprintf(out3, sizeof out3, "%s/c", dir);
    FILE *f = fopen(cfg_path, "w");
    assert_non_null(f);
    fputs(SMALL_CONFIG, f);
    fclose(f);
    char *out = NULL;
    const char *gen[] = {"random", "--config", cfg_path,           "--out", out1,
                         "--seed", "7",        "--max-file-bytes", "40000", NULL};
    int rc = run_tool(gen, &out);
    if (rc != 0) fail_msg("random exited %d:\n%s", rc, out);
    assert_non_null(strstr(out, "wrote 45 tensors"));
    free(out);
    struct rusage ru;
    assert_int_equal(getrusage(RUSAGE_CHILDREN, &ru), 0);
    assert_true(ru.ru_maxrss < 128 * 1024); /* KiB: the tool stays small */

    const char *insp[] = {"inspect", out1, NULL};
    rc = run_tool(insp, &out);
    if (rc != 0) fail_msg("inspect of the random checkpoint exited %d:\n%s", rc, out);
    EXPECT_LINE(out, "check", "all 45 tensors recognised", NULL);
    free(out);

    rw_err e = {0};
    rw_config cfg;
    RW_ASSERT_OK(rw_config_parse(SMALL_CONFIG, strlen(SMALL_CONFIG), &cfg, &e), &e);
    rw_ckpt *ck = NULL;
    RW_ASSERT_OK(rw_ckpt_open(out1, &ck, &e), &e);
    assert_int_equal(rw_ckpt_count(ck), rw_config_weight_count(&cfg));
    assert_true(rw_ckpt_file_count(ck) >= 3);
    for (size_t i = 0; i < rw_ckpt_file_count(ck); i++) {
        struct stat sb;
        assert_int_equal(stat(rw_ckpt_file_path(ck, i), &sb), 0);
        assert_true(sb.st_size <= 40000);
        char want[64];
        snprintf(want, sizeof want, "model-%05zu-of-%05zu.safetensors", i + 1,
                 rw_ckpt_file_count(ck));
        assert_non_null(strstr(rw_ckpt_file_path(ck, i), want));
        rw_st_file *sf = NULL;
        RW_ASSERT_OK(rw_st_open(rw_ckpt_file_path(ck, i), &sf, &e), &e);
        assert_string_equal(rw_st_metadata(sf, "format"), "pt");
        rw_st_close(sf);
    }
    for (size_t i = 0; i < rw_ckpt_count(ck); i++)
        assert_int_equal(rw_ckpt_at(ck, i)->dtype, RW_DTYPE_BF16);
    /* values: norms about 1 +- 0.1, the rest about 0 +- 0.02 */
    double m, sd;
    stats(rw_ckpt_find(ck, "model.embed_tokens.weight"), &m, &sd);
    assert_true(fabs(m) < 0.001 && fabs(sd - 0.02) < 0.001);
    stats(rw_ckpt_find(ck, "model.layers.1.mlp.experts.2.down_proj.weight"), &m, &sd);
    assert_true(fabs(m) < 0.002 && fabs(sd - 0.02) < 0.002);
    stats(rw_ckpt_find(ck, "model.norm.weight"), &m, &sd);
    assert_true(fabs(m - 1.0) < 0.05 && fabs(sd - 0.1) < 0.04);
    stats(rw_ckpt_find(ck, "model.layers.0.self_attn.q_norm.weight"), &m, &sd);
    assert_true(fabs(m - 1.0) < 0.1 && sd > 0.03);
    /* two tensors of one kind differ (each tensor has its own stream) */
    const rw_st_entry *a = rw_ckpt_find(ck, "model.layers.0.mlp.experts.0.up_proj.weight");
    const rw_st_entry *b = rw_ckpt_find(ck, "model.layers.0.mlp.experts.1.up_proj.weight");
    assert_true(memcmp(a->data, b->data, a->end - a->begin) != 0);

    /* the same seed in one file gives the same tensors; another seed does not */
    const char *gen2[] = {"random", "--config", cfg_path, "--out", out2, "--seed", "7", NULL};
    rc = run_tool(gen2, &out);
    assert_int_equal(rc, 0);
    free(out);
    const char *gen3[] = {"random", "--config", cfg_path, "--out", out3, "--seed", "8", NULL};
    rc = run_tool(gen3, &out);
    assert_int_equal(rc, 0);
    free(out);
    rw_ckpt *ck2 = NULL, *ck3 = NULL;
    RW_ASSERT_OK(rw_ckpt_open(out2, &ck2, &e), &e);
    RW_ASSERT_OK(rw_ckpt_open(out3, &ck3, &e), &e);
    assert_int_equal(rw_ckpt_file_count(ck2), 1);
    size_t differ = 0;
    for (size_t i = 0; i < rw_ckpt_count(ck); i++) {
        const rw_st_entry *x = rw_ckpt_at(ck, i), *y = rw_ckpt_find(ck2, x->name),
                          *z = rw_ckpt_find(ck3, x->name);
        assert_non_null(y);
        assert_non_null(z);
        rw_assert_bytes_equal(x->data, y->data, x->end - x->begin, x->name);
        differ += memcmp(x->data, z->data, x->end - x->begin) != 0;
    }
    assert_int_equal(differ, rw_ckpt_count(ck));
    char copied[700];
    snprintf(copied, sizeof copied, "%s/config.json", out1);
    char *text = NULL;
    size_t len;
    RW_ASSERT_OK(rw_read_file(copied, &text, &len, &e), &e);
    assert_string_equal(text, SMALL_CONFIG);
    free(text);
    rw_ckpt_close(ck);
    rw_ckpt_close(ck2);
    rw_ckpt_close(ck3);
    rw_config_free(&cfg);

    /* writing a one-file checkpoint over a sharded one removes the stale index */
    const char *gen4[] = {"random", "--config", cfg_path, "--out", out1, NULL};
    rc = run_tool(gen4, &out);
    assert_int_equal(rc, 0);
    free(out);
    RW_ASSERT_OK(rw_ckpt_open(out1, &ck, &e), &e);
    assert_int_equal(rw_ckpt_file_count(ck), 1);
    rw_ckpt_close(ck);
    rw_test_rm_rf(dir);
    free(dir);
}

static void test_cli_errors(void **state) {
    (void)state;
    char *out = NULL;
    const char *none[] = {NULL};
    assert_int_equal(run_tool(none, &out), 2);
    assert_non_null(strstr(out, "usage: rw-ckpt"));
    free(out);
    const char *help[] = {"--help", NULL};
    assert_int_equal(run_tool(help, &out), 0);
    assert_non_null(strstr(out, "inspect DIR"));
    free(out);
    const char *bad[] = {"frobnicate", NULL};
    assert_int_equal(run_tool(bad, &out), 2);
    assert_non_null(strstr(out, "unknown command 'frobnicate'"));
    free(out);
    const char *ih[] = {"inspect", "--help", NULL};
    assert_int_equal(run_tool(ih, &out), 0);
    assert_non_null(strstr(out, "exit status"));
    free(out);
    const char *nodir[] = {"inspect", "/nonexistent/ckpt", NULL};
    assert_int_equal(run_tool(nodir, &out), 2);
    assert_non_null(strstr(out, "/nonexistent/ckpt/config.json"));
    free(out);
    const char *rnocfg[] = {"random", "--out", "/tmp/x", NULL};
    assert_int_equal(run_tool(rnocfg, &out), 2);
    assert_non_null(strstr(out, "--config and --out are required"));
    free(out);
    const char *rbaddt[] = {"random", "--config", "c", "--out", "o", "--dtype", "e4m3", NULL};
    assert_int_equal(run_tool(rbaddt, &out), 2);
    assert_non_null(strstr(out, "--dtype e4m3"));
    free(out);
    const char *rbadseed[] = {"random", "--config", "c", "--out", "o", "--seed", "x1", NULL};
    assert_int_equal(run_tool(rbadseed, &out), 2);
    free(out);
    const char *rmissing[] = {"random", "--config", "/nonexistent.json", "--out", "/tmp/x", NULL};
    assert_int_equal(run_tool(rmissing, &out), 2);
    assert_non_null(strstr(out, "/nonexistent.json"));
    free(out);
#ifndef RW_CKPT_HAVE_QUANTIZE
    const char *q[] = {"quantize", "--format", "mxfp8", "a", "b", NULL};
    assert_int_equal(run_tool(q, &out), 2);
    assert_non_null(strstr(out, "not built"));
    free(out);
#endif
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: %s PATH_TO_RW_CKPT\n", argv[0]);
        return 2;
    }
    rw_ckpt_path = argv[1];
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_inspect_fixture),   cmocka_unit_test(test_inspect_broken),
        cmocka_unit_test(test_inspect_quantized), cmocka_unit_test(test_inspect_fused),
        cmocka_unit_test(test_random_small),      cmocka_unit_test(test_cli_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
