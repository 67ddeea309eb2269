/* test_ckpt_quantize.c - cpu suite for `rw-ckpt quantize` (tools/ckpt/quantize.c, linked in):
 * the tiny fixture quantized to mxfp8 with the last layer in bf16 and to fp8-block, read back
 * with the safetensors reader: dtypes, shapes, scale shapes, the config's quantization_config,
 * codes equal to the CPU quantizer's, dequantized values within the per-element bound of the
 * bf16 originals, untouched tensors byte-identical; a sharded checkpoint with fused expert
 * tensors; and the refusals (usage, bad counts, non-empty or same output, already quantized). */
#include "quant_util.h"
#include "rw_quant.h"

#include <dirent.h>
#include <jansson.h>
#include <sys/stat.h>
#include <unistd.h>

int rw_ckpt_quantize_main(int argc, char **argv);

/* Temporary directories made by the test, removed (flat, files only) at the end. */
static char g_tmp[256];

static void rm_flat_dir(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return;
    struct dirent *de;
    char p[1024];
    while ((de = readdir(d))) {
        if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, "..")) continue;
        snprintf(p, sizeof p, "%s/%s", dir, de->d_name);
        struct stat sb;
        if (stat(p, &sb) == 0 && S_ISDIR(sb.st_mode))
            rm_flat_dir(p);
        else
            unlink(p);
    }
    closedir(d);
    rmdir(dir);
}

static const char *tmp_path(char *buf, size_t cap, const char *name) {
    snprintf(buf, cap, "%s/%s", g_tmp, name);
    return buf;
}

static int run_quantize(const char *format, const char *last_n, const char *in, const char *out) {
    char *argv[8];
    int argc = 0;
    argv[argc++] = "quantize";
    if (format) {
        argv[argc++] = "--format";
        argv[argc++] = (char *)format;
    }
    if (last_n) {
        argv[argc++] = "--last-n-bf16";
        argv[argc++] = (char *)last_n;
    }
    if (in) argv[argc++] = (char *)in;
    if (out) argv[argc++] = (char *)out;
    argv[argc] = NULL;
    return rw_ckpt_quantize_main(argc, argv);
}

static const char *fixture(void) {
    static char buf[1024];
    return rw_test_path(buf, sizeof buf, RW_TEST_FIXTURE);
}

/* Checks OUT against IN for `fmt` with the last `last_n` layers kept in bf16. When `fused_in` is
 * true, IN holds fused expert tensors and OUT per-expert ones for the quantized layers. Returns
 * the number of quantized matrices. */
static int check_output(const char *in_dir, const char *out_dir, rw_wfmt fmt, int last_n) {
    rw_err err = {0};
    rw_ckpt *in = NULL, *out = NULL;
    RW_ASSERT_OK(rw_ckpt_open(in_dir, &in, &err), &err);
    RW_ASSERT_OK(rw_ckpt_open(out_dir, &out, &err), &err);
    char path[1024];
    snprintf(path, sizeof path, "%s/config.json", out_dir);
    rw_config cfg;
    RW_ASSERT_OK(rw_config_load(path, &cfg, &err), &err);
    assert_int_equal(cfg.quant.method,
                     fmt == RW_WFMT_MXFP8 ? RW_QMETHOD_MXFP8 : RW_QMETHOD_FP8_BLOCK);
    assert_int_equal(cfg.quant.n_not_convert, last_n);
    for (int i = 0; i < last_n; i++) {
        char want[48];
        snprintf(want, sizeof want, "model.layers.%d.", cfg.num_layers - last_n + i);
        assert_string_equal(cfg.quant.not_convert[i], want);
    }
    int nq = 0;
    size_t matched = 0;
    for (size_t i = 0; i < rw_ckpt_count(in); i++) {
        const rw_st_entry *e = rw_ckpt_at(in, i);
        rw_wname w;
        RW_ASSERT_OK(rw_name_parse(e->name, &cfg, &w, &err), &err);
        rw_wfmt f = rw_quant_policy(&cfg, &w);
        if (f == RW_WFMT_BF16) {
            const rw_st_entry *o = rw_ckpt_find(out, e->name);
            if (!o) fail_msg("%s: missing in the output", e->name);
            assert_int_equal(o->dtype, e->dtype);
            assert_int_equal(o->ndim, e->ndim);
            assert_memory_equal(o->shape, e->shape, sizeof(int64_t) * (size_t)e->ndim);
            assert_int_equal(o->end - o->begin, e->end - e->begin);
            rw_assert_bytes_equal(o->data, e->data, (size_t)(e->end - e->begin), e->name);
            char sn[600];
            snprintf(sn, sizeof sn, "%.*s_scale_inv", (int)strlen(e->name), e->name);
            assert_null(rw_ckpt_find(out, sn));
            matched++;
            continue;
        }
        assert_int_equal(f, fmt);
        assert_int_equal(e->dtype, RW_DTYPE_BF16);
        /* The input's matrices: one for a 2-D weight, 2E or E for the fused expert tensors. */
        int64_t E = e->ndim == 3 ? e->shape[0] : 1;
        int parts = w.kind == RW_W_EXP_GATE_UP ? 2 : 1;
        int64_t rows = (e->ndim == 3 ? e->shape[1] : e->shape[0]) / parts;
        int64_t cols = e->shape[e->ndim - 1];
        for (int64_t x = 0; x < E; x++) {
            for (int p = 0; p < parts; p++) {
                rw_wname m = w;
                if (w.kind == RW_W_EXP_GATE_UP) m.kind = p ? RW_W_EXP_UP : RW_W_EXP_GATE;
                if (w.kind == RW_W_EXP_DOWN_ALL) m.kind = RW_W_EXP_DOWN;
                if (e->ndim == 3) m.expert = (int)x;
                char qn[600], sn[600];
                m.scale = false;
                rw_name_format(&m, qn, sizeof qn);
                m.scale = true;
                rw_name_format(&m, sn, sizeof sn);
                const rw_st_entry *qo = rw_ckpt_find(out, qn), *so = rw_ckpt_find(out, sn);
                if (!qo || !so) fail_msg("%s or its scale is missing in the output", qn);
                assert_int_equal(qo->dtype, RW_DTYPE_E4M3);
                assert_int_equal(qo->ndim, 2);
                assert_true(qo->shape[0] == rows && qo->shape[1] == cols);
                int64_t ss[2];
                rw_quant_scale_shape(fmt, rows, cols, ss);
                assert_int_equal(so->dtype, rw_quant_scale_dtype(fmt));
                assert_int_equal(so->ndim, 2);
                if (so->shape[0] != ss[0] || so->shape[1] != ss[1])
                    fail_msg("%s: scale shape [%lld, %lld], expected [%lld, %lld]", sn,
                             (long long)so->shape[0], (long long)so->shape[1], (long long)ss[0],
                             (long long)ss[1]);
                /* The input matrix (copied: the mapping need not be 2-byte aligned). */
                size_t n = (size_t)(rows * cols);
                uint16_t *xb = malloc(n * 2);
                uint8_t *q = malloc(n), *s = malloc((size_t)(so->end - so->begin));
                float *d = malloc(n * sizeof(float));
                assert_true(xb && q && s && d);
                memcpy(xb, (const uint8_t *)e->data + (size_t)((x * parts + p) * rows * cols) * 2,
                       n * 2);
                /* Codes and scales are those of the CPU quantizer... */
                if (fmt == RW_WFMT_MXFP8)
                    RW_ASSERT_OK(rw_quant_mxfp8_ref(xb, rows, cols, q, s, &err), &err);
                else
                    RW_ASSERT_OK(rw_quant_fp8_block_ref(xb, rows, cols, q, (float *)s, &err), &err);
                rw_assert_bytes_equal(qo->data, q, n, qn);
                rw_assert_bytes_equal(so->data, s, (size_t)(so->end - so->begin), sn);
                /* ...and dequantizing what was written stays within the per-element bound. */
                memcpy(q, qo->data, n);
                memcpy(s, so->data, (size_t)(so->end - so->begin));
                if (fmt == RW_WFMT_MXFP8)
                    rw_dequant_mxfp8_ref(q, s, rows, cols, d);
                else
                    rw_dequant_fp8_block_ref(q, (const float *)s, rows, cols, d);
                for (size_t k = 0; k < n; k++) {
                    double xv = rw_bf16_to_f32(xb[k]);
                    int64_t r = (int64_t)k / cols, c = (int64_t)k % cols;
                    double bound;
                    if (fmt == RW_WFMT_MXFP8) {
                        double sc = rw_ue8m0_to_f32(s[r * (cols / 32) + c / 32]);
                        bound = qt_e4m3_half_ulp(fabs(xv) / sc) * sc;
                    } else {
                        float sc = ((float *)s)[(r / 128) * ((cols + 127) / 128) + c / 128];
                        bound = qt_fp8_block_bound(xv, sc);
                    }
                    if (!(fabs(d[k] - xv) <= bound))
                        fail_msg("%s (%lld, %lld): %.9g dequantizes to %.9g, bound %.3g", qn,
                                 (long long)r, (long long)c, xv, d[k], bound);
                }
                free(xb);
                free(q);
                free(s);
                free(d);
                nq++;
                matched += 2;
            }
        }
    }
    /* Nothing else was written. */
    assert_int_equal(rw_ckpt_count(out), matched);
    rw_config_free(&cfg);
    rw_ckpt_close(in);
    rw_ckpt_close(out);
    return nq;
}

static json_t *load_json(const char *dir, const char *name) {
    char p[1024];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    json_error_t je;
    json_t *j = json_load_file(p, 0, &je);
    if (!j) fail_msg("%s: %s", p, je.text);
    return j;
}

static void test_tiny_mxfp8_last1(void **state) {
    (void)state;
    char out[512];
    tmp_path(out, sizeof out, "mxfp8-last1");
    assert_int_equal(run_quantize("mxfp8", "1", fixture(), out), 0);

    /* The check, spelled out. */
    rw_err err = {0};
    rw_ckpt *c = NULL;
    RW_ASSERT_OK(rw_ckpt_open(out, &c, &err), &err);
    for (int l = 0; l < 3; l++) {
        for (int x = 0; x < 8; x++) {
            const char *k[] = {"gate_proj", "up_proj", "down_proj"};
            for (int j = 0; j < 3; j++) {
                char n[128], sn[160];
                snprintf(n, sizeof n, "model.layers.%d.mlp.experts.%d.%s.weight", l, x, k[j]);
                snprintf(sn, sizeof sn, "%s_scale_inv", n);
                const rw_st_entry *e = rw_ckpt_find(c, n), *s = rw_ckpt_find(c, sn);
                assert_non_null(e);
                int64_t r = j < 2 ? 96 : 128, cc = j < 2 ? 128 : 96;
                assert_true(e->shape[0] == r && e->shape[1] == cc);
                if (l < 2) {
                    assert_int_equal(e->dtype, RW_DTYPE_E4M3);
                    assert_non_null(s);
                    assert_int_equal(s->dtype, RW_DTYPE_U8);
                    assert_true(s->shape[0] == r && s->shape[1] == cc / 32);
                } else {
                    assert_int_equal(e->dtype, RW_DTYPE_BF16);
                    assert_null(s);
                }
            }
        }
    }
    const rw_st_entry *router = rw_ckpt_find(c, "model.layers.0.mlp.gate.weight");
    assert_non_null(router);
    assert_int_equal(router->dtype, RW_DTYPE_BF16);
    rw_ckpt_close(c);

    /* config.json: the conventional quantization_config, the input's other fields kept. */
    json_t *j = load_json(out, "config.json");
    json_t *q = json_object_get(j, "quantization_config");
    assert_non_null(q);
    assert_string_equal(json_string_value(json_object_get(q, "quant_method")), "mxfp8");
    assert_string_equal(json_string_value(json_object_get(q, "fmt")), "e4m3");
    assert_string_equal(json_string_value(json_object_get(q, "scale_fmt")), "ue8m0");
    assert_string_equal(json_string_value(json_object_get(q, "activation_scheme")), "dynamic");
    json_t *bs = json_object_get(q, "weight_block_size");
    assert_int_equal(json_array_size(bs), 2);
    assert_int_equal(json_integer_value(json_array_get(bs, 0)), 1);
    assert_int_equal(json_integer_value(json_array_get(bs, 1)), 32);
    json_t *nc = json_object_get(q, "modules_to_not_convert");
    assert_int_equal(json_array_size(nc), 1);
    assert_string_equal(json_string_value(json_array_get(nc, 0)), "model.layers.2.");
    assert_string_equal(json_string_value(json_object_get(j, "transformers_version")), "5.17.0");
    assert_non_null(json_object_get(json_object_get(j, "rope_parameters"), "rope_theta"));
    json_decref(j);

    /* Layers 0-1: q, k, v, o and 8 x 3 experts each. */
    assert_int_equal(check_output(fixture(), out, RW_WFMT_MXFP8, 1), 2 * (4 + 24));
}

static void test_tiny_fp8_block(void **state) {
    (void)state;
    char out[512];
    tmp_path(out, sizeof out, "fp8-block");
    assert_int_equal(run_quantize("fp8-block", NULL, fixture(), out), 0);
    json_t *j = load_json(out, "config.json");
    json_t *q = json_object_get(j, "quantization_config");
    assert_string_equal(json_string_value(json_object_get(q, "quant_method")), "fp8");
    assert_string_equal(json_string_value(json_object_get(q, "fmt")), "e4m3");
    assert_null(json_object_get(q, "scale_fmt"));
    json_t *bs = json_object_get(q, "weight_block_size");
    assert_int_equal(json_integer_value(json_array_get(bs, 0)), 128);
    assert_int_equal(json_integer_value(json_array_get(bs, 1)), 128);
    assert_int_equal(json_array_size(json_object_get(q, "modules_to_not_convert")), 0);
    json_decref(j);
    rw_err err = {0};
    rw_ckpt *c = NULL;
    RW_ASSERT_OK(rw_ckpt_open(out, &c, &err), &err);
    const rw_st_entry *s =
        rw_ckpt_find(c, "model.layers.2.mlp.experts.7.down_proj.weight_scale_inv");
    assert_non_null(s);
    assert_int_equal(s->dtype, RW_DTYPE_F32);
    assert_true(s->ndim == 2 && s->shape[0] == 1 && s->shape[1] == 1);
    rw_ckpt_close(c);
    assert_int_equal(check_output(fixture(), out, RW_WFMT_FP8_BLOCK, 0), 3 * (4 + 24));
}

/* A copy of the fixture in two shards with an index, each layer's experts fused
 * (gate_up_proj [E, 2I, H] = [gate; up] per expert, down_proj [E, H, I]). */
static void write_fused_fixture(const char *dir) {
    rw_err err = {0};
    rw_ckpt *c = NULL;
    RW_ASSERT_OK(rw_ckpt_open(fixture(), &c, &err), &err);
    assert_int_equal(mkdir(dir, 0755), 0);
    char src[1024], dst[1024];
    char *text = NULL;
    size_t len = 0;
    RW_ASSERT_OK(rw_read_file(rw_test_path(src, sizeof src, RW_TEST_FIXTURE "/config.json"), &text,
                              &len, &err),
                 &err);
    snprintf(dst, sizeof dst, "%s/config.json", dir);
    FILE *f = fopen(dst, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(text, 1, len, f), len);
    fclose(f);
    free(text);
    rw_config cfg;
    RW_ASSERT_OK(rw_config_load(dst, &cfg, &err), &err);
    int64_t E = cfg.num_experts, I = cfg.moe_intermediate, H = cfg.hidden_size;

    json_t *wm = json_object();
    for (int shard = 0; shard < 2; shard++) {
        /* Shard 0: non-layer tensors and layer 0; shard 1: layers 1.. */
        rw_st_decl decls[256];
        const rw_st_entry *srcs[256];
        int kinds[256]; /* 0 copy, 1 fused gate_up of layer, 2 fused down of layer */
        int layer_of[256];
        size_t n = 0;
        for (size_t i = 0; i < rw_ckpt_count(c); i++) {
            const rw_st_entry *e = rw_ckpt_at(c, i);
            rw_wname w;
            RW_ASSERT_OK(rw_name_parse(e->name, &cfg, &w, &err), &err);
            if ((w.layer <= 0) != (shard == 0)) continue;
            if (rw_wkind_is_expert(w.kind)) continue;
            assert_true(n < 256);
            decls[n] = (rw_st_decl){.name = e->name, .dtype = e->dtype, .ndim = e->ndim};
            memcpy(decls[n].shape, e->shape, sizeof decls[n].shape);
            srcs[n] = e;
            kinds[n] = 0;
            layer_of[n] = w.layer;
            n++;
        }
        static char names[16][96];
        for (int l = 0; l < cfg.num_layers; l++) {
            if ((l == 0) != (shard == 0)) continue;
            for (int k = 1; k <= 2; k++) {
                char *nm = names[2 * l + k - 1];
                snprintf(nm, 96, "model.layers.%d.mlp.experts.%s", l,
                         k == 1 ? "gate_up_proj" : "down_proj");
                decls[n] = (rw_st_decl){.name = nm, .dtype = RW_DTYPE_BF16, .ndim = 3};
                decls[n].shape[0] = E;
                decls[n].shape[1] = k == 1 ? 2 * I : H;
                decls[n].shape[2] = k == 1 ? H : I;
                srcs[n] = NULL;
                kinds[n] = k;
                layer_of[n] = l;
                n++;
            }
        }
        char fname[64];
        snprintf(fname, sizeof fname, "model-%05d-of-00002.safetensors", shard + 1);
        snprintf(dst, sizeof dst, "%s/%s", dir, fname);
        rw_st_writer *wr = NULL;
        RW_ASSERT_OK(rw_st_writer_create(dst, decls, n, NULL, &wr, &err), &err);
        for (size_t i = 0; i < n; i++) {
            json_object_set_new(wm, decls[i].name, json_string(fname));
            if (kinds[i] == 0) {
                RW_ASSERT_OK(rw_st_writer_write(wr, srcs[i]->data,
                                                (size_t)(srcs[i]->end - srcs[i]->begin), &err),
                             &err);
                continue;
            }
            for (int64_t x = 0; x < E; x++) {
                const char *parts[2] = {kinds[i] == 1 ? "gate_proj" : "down_proj", "up_proj"};
                for (int p = 0; p < (kinds[i] == 1 ? 2 : 1); p++) {
                    char en[128];
                    snprintf(en, sizeof en, "model.layers.%d.mlp.experts.%lld.%s.weight",
                             layer_of[i], (long long)x, parts[p]);
                    const rw_st_entry *e = rw_ckpt_find(c, en);
                    assert_non_null(e);
                    RW_ASSERT_OK(rw_st_writer_write(wr, e->data, (size_t)(e->end - e->begin), &err),
                                 &err);
                }
            }
        }
        RW_ASSERT_OK(rw_st_writer_close(wr, &err), &err);
    }
    json_t *idx = json_object();
    json_object_set_new(idx, "metadata", json_object());
    json_object_set_new(idx, "weight_map", wm);
    snprintf(dst, sizeof dst, "%s/model.safetensors.index.json", dir);
    assert_int_equal(json_dump_file(idx, dst, JSON_INDENT(2)), 0);
    json_decref(idx);
    rw_config_free(&cfg);
    rw_ckpt_close(c);
}

static void test_fused_sharded_input(void **state) {
    (void)state;
    char in[512], out[512], ref[512];
    tmp_path(in, sizeof in, "fused-in");
    tmp_path(out, sizeof out, "fused-out");
    tmp_path(ref, sizeof ref, "fused-ref");
    write_fused_fixture(in);
    assert_int_equal(run_quantize("mxfp8", "1", in, out), 0);
    /* Fused tensors of layers 0-1 became per-expert codes and scales; layer 2's were copied. */
    assert_int_equal(check_output(in, out, RW_WFMT_MXFP8, 1), 2 * (4 + 24));
    /* Two shards with the input's file names, and an index naming every output tensor. */
    json_t *idx = load_json(out, "model.safetensors.index.json");
    json_t *wm = json_object_get(idx, "weight_map");
    assert_string_equal(json_string_value(json_object_get(
                            wm, "model.layers.1.mlp.experts.5.up_proj.weight_scale_inv")),
                        "model-00002-of-00002.safetensors");
    assert_string_equal(
        json_string_value(json_object_get(wm, "model.layers.0.mlp.experts.0.gate_proj.weight")),
        "model-00001-of-00002.safetensors");
    assert_non_null(json_object_get(wm, "model.layers.2.mlp.experts.gate_up_proj"));
    rw_err err = {0};
    rw_ckpt *c = NULL;
    RW_ASSERT_OK(rw_ckpt_open(out, &c, &err), &err);
    assert_int_equal(json_object_size(wm), rw_ckpt_count(c));
    assert_int_equal(rw_ckpt_file_count(c), 2);
    rw_ckpt_close(c);
    json_decref(idx);

    /* The per-expert tensors equal those from the unfused fixture. */
    assert_int_equal(run_quantize("mxfp8", "1", fixture(), ref), 0);
    rw_ckpt *a = NULL, *b = NULL;
    RW_ASSERT_OK(rw_ckpt_open(out, &a, &err), &err);
    RW_ASSERT_OK(rw_ckpt_open(ref, &b, &err), &err);
    size_t same = 0;
    for (size_t i = 0; i < rw_ckpt_count(a); i++) {
        const rw_st_entry *x = rw_ckpt_at(a, i), *y = rw_ckpt_find(b, x->name);
        if (strstr(x->name, "model.layers.2.mlp.experts.")) {
            assert_null(y); /* fused in `out`, per-expert in `ref` */
            continue;
        }
        if (!y) fail_msg("%s is not in the unfused output", x->name);
        assert_int_equal(x->dtype, y->dtype);
        assert_int_equal(x->end - x->begin, y->end - y->begin);
        rw_assert_bytes_equal(x->data, y->data, (size_t)(x->end - x->begin), x->name);
        same++;
    }
    assert_true(same > 100);
    rw_ckpt_close(a);
    rw_ckpt_close(b);
}

static void test_refusals(void **state) {
    (void)state;
    char out[512], p[512];
    const char *fx = fixture();
    /* Usage errors: 2. */
    assert_int_equal(run_quantize(NULL, NULL, fx, tmp_path(out, sizeof out, "u1")), 2);
    assert_int_equal(run_quantize("mxfp4", NULL, fx, tmp_path(out, sizeof out, "u2")), 2);
    assert_int_equal(run_quantize("mxfp8", "x", fx, tmp_path(out, sizeof out, "u3")), 2);
    assert_int_equal(run_quantize("mxfp8", "-1", fx, tmp_path(out, sizeof out, "u4")), 2);
    assert_int_equal(run_quantize("mxfp8", NULL, fx, NULL), 2);
    char *argv[] = {"quantize", "--format", "mxfp8", "--bogus", (char *)fx, out, NULL};
    assert_int_equal(rw_ckpt_quantize_main(6, argv), 2);
    /* More bf16 layers than the model has. */
    assert_int_equal(run_quantize("mxfp8", "4", fx, tmp_path(out, sizeof out, "r1")), 1);
    assert_int_equal(access(out, F_OK), -1); /* refused before creating anything */
    /* A non-empty output directory, and the input as output. */
    tmp_path(out, sizeof out, "r2");
    assert_int_equal(mkdir(out, 0755), 0);
    FILE *f = fopen(tmp_path(p, sizeof p, "r2/keep"), "w");
    assert_non_null(f);
    fclose(f);
    assert_int_equal(run_quantize("mxfp8", NULL, fx, out), 1);
    assert_int_equal(run_quantize("mxfp8", NULL, fx, fx), 1);
    /* An already quantized checkpoint. */
    char q1[512];
    tmp_path(q1, sizeof q1, "r3");
    assert_int_equal(run_quantize("fp8-block", "3", fx, q1), 0); /* all layers bf16 */
    assert_int_equal(run_quantize("mxfp8", NULL, q1, tmp_path(out, sizeof out, "r4")), 1);
    /* --last-n-bf16 = L: nothing quantized, every tensor copied. */
    assert_int_equal(check_output(fx, q1, RW_WFMT_FP8_BLOCK, 3), 0);
}

int main(void) {
    const char *t = getenv("TMPDIR");
    snprintf(g_tmp, sizeof g_tmp, "%s/rw-test-quant-XXXXXX", t && *t ? t : "/tmp");
    if (!mkdtemp(g_tmp)) {
        perror("mkdtemp");
        return 1;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tiny_mxfp8_last1),
        cmocka_unit_test(test_tiny_fp8_block),
        cmocka_unit_test(test_fused_sharded_input),
        cmocka_unit_test(test_refusals),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    rm_flat_dir(g_tmp);
    return rc;
}
