/* test_config.c - config.json parsing (both spellings, quantization_config, refusals with the
 * right status), the shipped model configs, and canonical tensor names (every kind, formatting
 * round trip, unknown names and out-of-range indices) with their canonical shapes. */
#include "rw_test.h"

#include <stdio.h>

static void load_fixture(rw_config *c) {
    char p[1024];
    rw_err e = {0};
    RW_ASSERT_OK(rw_config_load(rw_test_path(p, sizeof p, RW_TEST_FIXTURE "/config.json"), c, &e),
                 &e);
}

/* The fixture spells num_local_experts and rope_parameters.rope_theta. */
static void test_config_fixture(void **state) {
    (void)state;
    rw_config c;
    load_fixture(&c);
    assert_int_equal(c.vocab_size, 512);
    assert_int_equal(c.hidden_size, 128);
    assert_int_equal(c.num_layers, 3);
    assert_int_equal(c.num_heads, 4);
    assert_int_equal(c.num_kv_heads, 2);
    assert_int_equal(c.head_dim, 32);
    assert_int_equal(c.num_experts, 8);
    assert_int_equal(c.top_k, 2);
    assert_int_equal(c.moe_intermediate, 96);
    assert_int_equal(c.max_position, 512);
    assert_true(c.rope_theta == 1e6);
    assert_true(c.rms_eps == 1e-6);
    assert_true(c.norm_topk_prob);
    assert_false(c.tie_word_embeddings);
    assert_int_equal(c.quant.method, RW_QMETHOD_NONE);
    rw_config_free(&c);
}

/* The other spelling: num_experts and a top-level rope_theta. */
static const char *TOP_LEVEL =
    "{\"model_type\":\"qwen3_moe\",\"vocab_size\":1000,\"hidden_size\":64,\"num_hidden_layers\":2,"
    "\"num_attention_heads\":4,\"num_key_value_heads\":1,\"head_dim\":16,\"num_experts\":6,"
    "\"num_experts_per_tok\":3,\"moe_intermediate_size\":32,\"max_position_embeddings\":4096,"
    "\"rope_theta\":5000.0,\"rms_norm_eps\":1e-5,\"norm_topk_prob\":false,"
    "\"tie_word_embeddings\":true}";

static void test_config_top_level_spelling(void **state) {
    (void)state;
    rw_config c;
    rw_err e = {0};
    RW_ASSERT_OK(rw_config_parse(TOP_LEVEL, strlen(TOP_LEVEL), &c, &e), &e);
    assert_int_equal(c.num_experts, 6);
    assert_int_equal(c.top_k, 3);
    assert_int_equal(c.num_kv_heads, 1);
    assert_true(c.rope_theta == 5000.0);
    assert_true(c.rms_eps == 1e-5);
    assert_false(c.norm_topk_prob);
    assert_true(c.tie_word_embeddings);
    /* tied: no lm_head in the tensor set */
    assert_int_equal(rw_config_weight_count(&c), 1 + 2 * (9 + 3 * 6) + 1);
    /* to_json -> parse gives the same config */
    char *js = NULL;
    RW_ASSERT_OK(rw_config_to_json(&c, &js, &e), &e);
    rw_config d;
    RW_ASSERT_OK(rw_config_parse(js, strlen(js), &d, &e), &e);
    assert_memory_equal(&c, &d, offsetof(rw_config, quant));
    free(js);
    rw_config_free(&c);
    rw_config_free(&d);
}

static void test_config_shipped_models(void **state) {
    (void)state;
    static const struct {
        const char *file;
        int L, H, E, I, nH;
    } m[] = {{"tools/configs/qwen3-30b-a3b.json", 48, 2048, 128, 768, 32},
             {"tools/configs/qwen3-235b-a22b.json", 94, 4096, 128, 1536, 64}};
    for (size_t i = 0; i < 2; i++) {
        char p[1024];
        rw_config c;
        rw_err e = {0};
        RW_ASSERT_OK(rw_config_load(rw_test_path(p, sizeof p, m[i].file), &c, &e), &e);
        assert_int_equal(c.num_layers, m[i].L);
        assert_int_equal(c.hidden_size, m[i].H);
        assert_int_equal(c.num_experts, m[i].E);
        assert_int_equal(c.moe_intermediate, m[i].I);
        assert_int_equal(c.num_heads, m[i].nH);
        assert_int_equal(c.num_kv_heads, 4);
        assert_int_equal(c.head_dim, 128);
        assert_int_equal(c.top_k, 8);
        assert_int_equal(c.vocab_size, 151936);
        assert_int_equal(c.max_position, 40960);
        assert_true(c.rope_theta == 1e6 && c.rms_eps == 1e-6);
        assert_true(c.norm_topk_prob);
        assert_false(c.tie_word_embeddings);
        rw_config_free(&c);
    }
}

/* Replaces `from` with `to` in TOP_LEVEL and expects `want` with `needle` in the message. */
static void expect_bad(const char *from, const char *to, rw_status want, const char *needle) {
    char buf[2048];
    const char *at = strstr(TOP_LEVEL, from);
    if (!at) fail_msg("'%s' is not in the base config", from);
    snprintf(buf, sizeof buf, "%.*s%s%s", (int)(at - TOP_LEVEL), TOP_LEVEL, to, at + strlen(from));
    rw_config c;
    rw_err e = {0};
    rw_status st = rw_config_parse(buf, strlen(buf), &c, &e);
    if (st != want)
        fail_msg("config with %s: got %s (%s), want %s", to, rw_status_str(st), e.msg,
                 rw_status_str(want));
    if (!strstr(e.msg, needle))
        fail_msg("config with %s: message '%s' lacks '%s'", to, e.msg, needle);
}

static void test_config_rejects(void **state) {
    (void)state;
    expect_bad("\"hidden_size\":64,", "", RW_E_FORMAT, "hidden_size");
    expect_bad("\"hidden_size\":64", "\"hidden_size\":\"64\"", RW_E_FORMAT, "hidden_size");
    expect_bad("\"hidden_size\":64", "\"hidden_size\":-64", RW_E_RANGE, "hidden_size");
    expect_bad("\"hidden_size\":64", "\"hidden_size\":0", RW_E_RANGE, "hidden_size");
    expect_bad("\"num_experts\":6,", "", RW_E_FORMAT, "num_local_experts");
    expect_bad("\"num_experts_per_tok\":3", "\"num_experts_per_tok\":7", RW_E_RANGE,
               "num_experts_per_tok");
    expect_bad("\"num_key_value_heads\":1", "\"num_key_value_heads\":3", RW_E_RANGE,
               "num_key_value_heads");
    expect_bad("\"head_dim\":16", "\"head_dim\":15", RW_E_RANGE, "head_dim");
    expect_bad("qwen3_moe", "llama", RW_E_UNSUPPORTED, "model_type");
    expect_bad("\"tie_word_embeddings\":true",
               "\"tie_word_embeddings\":true,\"attention_bias\":true", RW_E_UNSUPPORTED,
               "attention_bias");
    expect_bad("\"tie_word_embeddings\":true",
               "\"tie_word_embeddings\":true,\"mlp_only_layers\":[1]", RW_E_UNSUPPORTED,
               "mlp_only_layers");
    expect_bad("\"tie_word_embeddings\":true",
               "\"tie_word_embeddings\":true,\"decoder_sparse_step\":2", RW_E_UNSUPPORTED,
               "decoder_sparse_step");
    expect_bad("\"tie_word_embeddings\":true",
               "\"tie_word_embeddings\":true,\"rope_scaling\":{\"type\":\"yarn\"}",
               RW_E_UNSUPPORTED, "rope_scaling");
    expect_bad("\"norm_topk_prob\":false", "\"norm_topk_prob\":1", RW_E_FORMAT, "norm_topk_prob");
    expect_bad("\"rms_norm_eps\":1e-5", "\"rms_norm_eps\":0", RW_E_RANGE, "rms_norm_eps");
    expect_bad("\"rope_theta\":5000.0", "\"rope_theta\":\"big\"", RW_E_FORMAT, "rope_theta");
    expect_bad("\"tie_word_embeddings\":true",
               "\"tie_word_embeddings\":true,\"quantization_config\":{\"quant_method\":\"awq\"}",
               RW_E_UNSUPPORTED, "awq");
    expect_bad("\"tie_word_embeddings\":true",
               "\"tie_word_embeddings\":true,\"quantization_config\":{\"quant_method\":\"mxfp8\","
               "\"weight_block_size\":[128,128]}",
               RW_E_UNSUPPORTED, "[1, 32]");
    expect_bad("\"tie_word_embeddings\":true",
               "\"tie_word_embeddings\":true,\"quantization_config\":{\"quant_method\":\"fp8\","
               "\"fmt\":\"e5m2\"}",
               RW_E_UNSUPPORTED, "e5m2");
    expect_bad("\"tie_word_embeddings\":true",
               "\"tie_word_embeddings\":true,\"quantization_config\":{\"fmt\":\"e4m3\"}",
               RW_E_FORMAT, "quant_method");
    expect_bad("\"vocab_size\":1000", "\"vocab_size\":1000,\"vocab_size\":1000", RW_E_FORMAT,
               "invalid JSON");
    expect_bad("}", "", RW_E_FORMAT, "invalid JSON");
    rw_config c;
    rw_err e = {0};
    assert_int_equal(rw_config_parse("[1,2]", 5, &c, &e), RW_E_FORMAT);
    assert_non_null(strstr(e.msg, "not a JSON object"));
    assert_int_equal(rw_config_load("/nonexistent/config.json", &c, &e), RW_E_IO);
    assert_non_null(strstr(e.msg, "/nonexistent/config.json"));
}

static void test_config_quantization(void **state) {
    (void)state;
    char buf[2048];
    rw_err e = {0};
    rw_config c;
    snprintf(buf, sizeof buf,
             "%.*s,\"quantization_config\":{\"quant_method\":\"mxfp8\",\"fmt\":\"e4m3\","
             "\"activation_scheme\":\"dynamic\",\"weight_block_size\":[1,32],\"scale_fmt\":"
             "\"ue8m0\",\"modules_to_not_convert\":[\"model.layers.1.\",\"lm_head\"]}}",
             (int)strlen(TOP_LEVEL) - 1, TOP_LEVEL);
    RW_ASSERT_OK(rw_config_parse(buf, strlen(buf), &c, &e), &e);
    assert_int_equal(c.quant.method, RW_QMETHOD_MXFP8);
    assert_int_equal(c.quant.block[0], 1);
    assert_int_equal(c.quant.block[1], 32);
    assert_string_equal(c.quant.scale_fmt, "ue8m0");
    assert_string_equal(c.quant.activation_scheme, "dynamic");
    assert_int_equal(c.quant.n_not_convert, 2);
    assert_string_equal(c.quant.not_convert[0], "model.layers.1.");
    assert_string_equal(c.quant.not_convert[1], "lm_head");
    /* copy is deep; to_json keeps the quantization config */
    rw_config d;
    RW_ASSERT_OK(rw_config_copy(&c, &d, &e), &e);
    assert_ptr_not_equal(d.quant.not_convert[0], c.quant.not_convert[0]);
    rw_config_free(&c);
    assert_string_equal(d.quant.not_convert[1], "lm_head");
    char *js = NULL;
    RW_ASSERT_OK(rw_config_to_json(&d, &js, &e), &e);
    rw_config r;
    RW_ASSERT_OK(rw_config_parse(js, strlen(js), &r, &e), &e);
    assert_int_equal(r.quant.method, RW_QMETHOD_MXFP8);
    assert_int_equal(r.quant.n_not_convert, 2);
    assert_string_equal(r.quant.not_convert[0], "model.layers.1.");
    free(js);
    rw_config_free(&d);
    rw_config_free(&r);
    /* fp8 block */
    snprintf(buf, sizeof buf,
             "%.*s,\"quantization_config\":{\"quant_method\":\"fp8\",\"fmt\":\"e4m3\","
             "\"weight_block_size\":[128,128]}}",
             (int)strlen(TOP_LEVEL) - 1, TOP_LEVEL);
    RW_ASSERT_OK(rw_config_parse(buf, strlen(buf), &c, &e), &e);
    assert_int_equal(c.quant.method, RW_QMETHOD_FP8_BLOCK);
    assert_int_equal(c.quant.block[0], 128);
    assert_int_equal(c.quant.n_not_convert, 0);
    rw_config_free(&c);
}

/* ---- names --------------------------------------------------------------------------------- */

static void expect_name(const rw_config *cfg, const char *name, rw_wkind kind, int layer,
                        int expert, bool scale) {
    rw_wname w;
    rw_err e = {0};
    rw_status st = rw_name_parse(name, cfg, &w, &e);
    if (st != RW_OK) fail_msg("'%s' not parsed: %s", name, e.msg);
    if (w.kind != kind || w.layer != layer || w.expert != expert || w.scale != scale)
        fail_msg("'%s' parsed as kind %d layer %d expert %d scale %d", name, w.kind, w.layer,
                 w.expert, w.scale);
    char back[600];
    rw_name_format(&w, back, sizeof back);
    assert_string_equal(back, name);
}

static void test_names_every_kind(void **state) {
    (void)state;
    rw_config c;
    load_fixture(&c);
    expect_name(&c, "model.embed_tokens.weight", RW_W_EMBED, -1, -1, false);
    expect_name(&c, "lm_head.weight", RW_W_LM_HEAD, -1, -1, false);
    expect_name(&c, "model.norm.weight", RW_W_FINAL_NORM, -1, -1, false);
    expect_name(&c, "model.layers.0.input_layernorm.weight", RW_W_INPUT_NORM, 0, -1, false);
    expect_name(&c, "model.layers.2.post_attention_layernorm.weight", RW_W_POST_NORM, 2, -1, false);
    expect_name(&c, "model.layers.1.self_attn.q_proj.weight", RW_W_Q, 1, -1, false);
    expect_name(&c, "model.layers.1.self_attn.k_proj.weight", RW_W_K, 1, -1, false);
    expect_name(&c, "model.layers.1.self_attn.v_proj.weight", RW_W_V, 1, -1, false);
    expect_name(&c, "model.layers.1.self_attn.o_proj.weight", RW_W_O, 1, -1, false);
    expect_name(&c, "model.layers.1.self_attn.o_proj.weight_scale_inv", RW_W_O, 1, -1, true);
    expect_name(&c, "model.layers.1.self_attn.q_norm.weight", RW_W_Q_NORM, 1, -1, false);
    expect_name(&c, "model.layers.1.self_attn.k_norm.weight", RW_W_K_NORM, 1, -1, false);
    expect_name(&c, "model.layers.2.mlp.gate.weight", RW_W_ROUTER, 2, -1, false);
    expect_name(&c, "model.layers.2.mlp.experts.7.gate_proj.weight", RW_W_EXP_GATE, 2, 7, false);
    expect_name(&c, "model.layers.0.mlp.experts.0.up_proj.weight", RW_W_EXP_UP, 0, 0, false);
    expect_name(&c, "model.layers.0.mlp.experts.5.down_proj.weight", RW_W_EXP_DOWN, 0, 5, false);
    expect_name(&c, "model.layers.0.mlp.experts.5.down_proj.weight_scale_inv", RW_W_EXP_DOWN, 0, 5,
                true);
    expect_name(&c, "model.layers.1.mlp.experts.gate_up_proj", RW_W_EXP_GATE_UP, 1, -1, false);
    expect_name(&c, "model.layers.1.mlp.experts.down_proj", RW_W_EXP_DOWN_ALL, 1, -1, false);
    /* without a config, any index is accepted */
    expect_name(NULL, "model.layers.4095.mlp.experts.1000.up_proj.weight", RW_W_EXP_UP, 4095, 1000,
                false);
    assert_true(rw_wkind_is_expert(RW_W_EXP_GATE_UP));
    assert_false(rw_wkind_is_expert(RW_W_ROUTER));
    assert_string_equal(rw_wkind_str(RW_W_ROUTER), "router");
    rw_config_free(&c);
}

static void test_names_rejected(void **state) {
    (void)state;
    rw_config c;
    load_fixture(&c);
    static const char *unknown[] = {
        "foo",
        "",
        "model.layers.0.mlp.experts.0.gate_proj.bias",
        "model.layers.01.input_layernorm.weight", /* leading zero */
        "model.layers.-1.input_layernorm.weight",
        "model.layers.0.input_layernorm.weight_scale_inv", /* norms are never quantized */
        "model.layers.0.mlp.gate.weight_scale_inv",
        "model.embed_tokens.weight_scale_inv",
        "model.layers.0.self_attn.q_proj.weight.extra",
        "model.layers.0.mlp.experts.0.weight",
        "model.layers.0.mlp.experts.x.up_proj.weight",
        "model.layers.0.mlp.shared_expert.up_proj.weight",
        "model.layers..input_layernorm.weight",
        "model.layers.0",
    };
    for (size_t i = 0; i < sizeof unknown / sizeof unknown[0]; i++) {
        rw_wname w;
        rw_err e = {0};
        rw_status st = rw_name_parse(unknown[i], &c, &w, &e);
        if (st != RW_E_NOT_FOUND)
            fail_msg("'%s': got %s, want not_found", unknown[i], rw_status_str(st));
        if (!strstr(e.msg, unknown[i]))
            fail_msg("'%s': message '%s' does not name it", unknown[i], e.msg);
        assert_int_equal(w.kind, RW_W_INVALID);
    }
    static const char *range[] = {
        "model.layers.3.input_layernorm.weight",
        "model.layers.0.mlp.experts.8.up_proj.weight",
        "model.layers.9.mlp.experts.gate_up_proj",
    };
    for (size_t i = 0; i < sizeof range / sizeof range[0]; i++) {
        rw_wname w;
        rw_err e = {0};
        rw_status st = rw_name_parse(range[i], &c, &w, &e);
        if (st != RW_E_RANGE) fail_msg("'%s': got %s, want range", range[i], rw_status_str(st));
        if (!strstr(e.msg, range[i]))
            fail_msg("'%s': message '%s' does not name it", range[i], e.msg);
    }
    rw_wname w;
    rw_err e = {0};
    assert_int_equal(rw_name_parse(NULL, &c, &w, &e), RW_E_INVALID_ARG);
    char longname[700];
    memset(longname, 'a', sizeof longname - 1);
    longname[sizeof longname - 1] = 0;
    assert_int_equal(rw_name_parse(longname, &c, &w, &e), RW_E_NOT_FOUND);
    rw_config_free(&c);
}

typedef struct {
    const rw_config *cfg;
    const rw_ckpt *ck;
    size_t n;
} walk_ctx;

/* Every enumerated weight exists in the fixture with its canonical shape. */
static rw_status check_one(const rw_wname *w, void *ctx) {
    walk_ctx *x = ctx;
    char name[600];
    rw_name_format(w, name, sizeof name);
    const rw_st_entry *en = rw_ckpt_find(x->ck, name);
    if (!en) fail_msg("fixture lacks %s", name);
    int nd = 0;
    int64_t shape[RW_MAX_DIMS];
    rw_err e = {0};
    RW_ASSERT_OK(rw_config_weight_shape(x->cfg, w, &nd, shape, &e), &e);
    assert_int_equal(nd, en->ndim);
    for (int i = 0; i < nd; i++)
        if (shape[i] != en->shape[i])
            fail_msg("%s: dim %d is %lld, canonical %lld", name, i, (long long)en->shape[i],
                     (long long)shape[i]);
    x->n++;
    return RW_OK;
}

static rw_status stop_at_ten(const rw_wname *w, void *ctx) {
    (void)w;
    return ++*(int *)ctx == 10 ? RW_E_ABORTED : RW_OK;
}

static void test_names_fixture_tensor_set(void **state) {
    (void)state;
    rw_config c;
    load_fixture(&c);
    char p[1024];
    rw_err e = {0};
    rw_ckpt *ck = NULL;
    RW_ASSERT_OK(rw_ckpt_open(rw_test_path(p, sizeof p, RW_TEST_FIXTURE), &ck, &e), &e);
    walk_ctx x = {&c, ck, 0};
    RW_ASSERT_OK(rw_config_for_each_weight(&c, check_one, &x), &e);
    assert_int_equal(x.n, rw_config_weight_count(&c));
    assert_int_equal(x.n, rw_ckpt_count(ck)); /* and nothing else is in the fixture */
    assert_int_equal(x.n, 102);
    /* every fixture tensor parses against the config */
    for (size_t i = 0; i < rw_ckpt_count(ck); i++) {
        rw_wname w;
        RW_ASSERT_OK(rw_name_parse(rw_ckpt_at(ck, i)->name, &c, &w, &e), &e);
    }
    int count = 0;
    assert_int_equal(rw_config_for_each_weight(&c, stop_at_ten, &count), RW_E_ABORTED);
    assert_int_equal(count, 10);
    /* shapes of the fused forms and a kind without one */
    rw_wname gu = {RW_W_EXP_GATE_UP, 0, -1, false}, dn = {RW_W_EXP_DOWN_ALL, 0, -1, false};
    int nd;
    int64_t s[RW_MAX_DIMS];
    RW_ASSERT_OK(rw_config_weight_shape(&c, &gu, &nd, s, &e), &e);
    assert_int_equal(nd, 3);
    assert_true(s[0] == 8 && s[1] == 192 && s[2] == 128);
    RW_ASSERT_OK(rw_config_weight_shape(&c, &dn, &nd, s, &e), &e);
    assert_true(nd == 3 && s[0] == 8 && s[1] == 128 && s[2] == 96);
    rw_wname bad = {RW_W_INVALID, 0, -1, false};
    assert_int_equal(rw_config_weight_shape(&c, &bad, &nd, s, &e), RW_E_INVALID_ARG);
    rw_ckpt_close(ck);
    rw_config_free(&c);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_config_fixture),
        cmocka_unit_test(test_config_top_level_spelling),
        cmocka_unit_test(test_config_shipped_models),
        cmocka_unit_test(test_config_rejects),
        cmocka_unit_test(test_config_quantization),
        cmocka_unit_test(test_names_every_kind),
        cmocka_unit_test(test_names_rejected),
        cmocka_unit_test(test_names_fixture_tensor_set),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
