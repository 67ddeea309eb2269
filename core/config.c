/* config.c - Qwen3-MoE config.json: both spellings (num_experts / num_local_experts, rope_theta at
 * top level or in rope_parameters) and quantization_config. */
#include "rw_core.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>

static rw_status get_int(json_t *root, const char *key, bool required, int def, int *out,
                         rw_err *err) {
    json_t *v = json_object_get(root, key);
    if (!v || json_is_null(v)) {
        if (required) RW_FAIL(err, RW_E_FORMAT, "config: missing integer field '%s'", key);
        *out = def;
        return RW_OK;
    }
    if (!json_is_integer(v)) RW_FAIL(err, RW_E_FORMAT, "config: field '%s' must be an integer", key);
    json_int_t x = json_integer_value(v);
    if (x < 0 || x > 0x7fffffff) RW_FAIL(err, RW_E_RANGE, "config: field '%s' = %lld out of range", key, (long long)x);
    *out = (int)x;
    return RW_OK;
}

static rw_status get_num(json_t *obj, const char *key, bool *found, double *out, rw_err *err) {
    json_t *v = json_object_get(obj, key);
    *found = false;
    if (!v || json_is_null(v)) return RW_OK;
    if (!json_is_number(v)) RW_FAIL(err, RW_E_FORMAT, "config: field '%s' must be a number", key);
    *out = json_number_value(v);
    *found = true;
    return RW_OK;
}

static rw_status get_bool(json_t *root, const char *key, bool def, bool *out, rw_err *err) {
    json_t *v = json_object_get(root, key);
    if (!v || json_is_null(v)) {
        *out = def;
        return RW_OK;
    }
    if (!json_is_boolean(v)) RW_FAIL(err, RW_E_FORMAT, "config: field '%s' must be true or false", key);
    *out = json_is_true(v);
    return RW_OK;
}

static void copy_str(char *dst, size_t cap, json_t *v) {
    dst[0] = 0;
    if (json_is_string(v)) snprintf(dst, cap, "%s", json_string_value(v));
}

static rw_status parse_quant(json_t *q, rw_quant_config *out, rw_err *err) {
    memset(out, 0, sizeof *out);
    if (!q || json_is_null(q)) return RW_OK;
    if (!json_is_object(q)) RW_FAIL(err, RW_E_FORMAT, "config: quantization_config must be an object");
    json_t *m = json_object_get(q, "quant_method");
    if (!json_is_string(m)) RW_FAIL(err, RW_E_FORMAT, "config: quantization_config.quant_method missing");
    const char *method = json_string_value(m);
    copy_str(out->fmt, sizeof out->fmt, json_object_get(q, "fmt"));
    copy_str(out->scale_fmt, sizeof out->scale_fmt, json_object_get(q, "scale_fmt"));
    copy_str(out->activation_scheme, sizeof out->activation_scheme,
             json_object_get(q, "activation_scheme"));
    json_t *bs = json_object_get(q, "weight_block_size");
    out->block[0] = out->block[1] = 0;
    if (bs) {
        if (!json_is_array(bs) || json_array_size(bs) != 2 ||
            !json_is_integer(json_array_get(bs, 0)) || !json_is_integer(json_array_get(bs, 1)))
            RW_FAIL(err, RW_E_FORMAT, "config: weight_block_size must be two integers");
        out->block[0] = (int)json_integer_value(json_array_get(bs, 0));
        out->block[1] = (int)json_integer_value(json_array_get(bs, 1));
    }
    if (out->fmt[0] && strcmp(out->fmt, "e4m3") && strcmp(out->fmt, "float8_e4m3fn"))
        RW_FAIL(err, RW_E_UNSUPPORTED, "config: quantization fmt '%s' (only e4m3)", out->fmt);
    if (!strcmp(method, "mxfp8")) {
        out->method = RW_QMETHOD_MXFP8;
        if (!out->block[0]) out->block[0] = 1, out->block[1] = 32;
    } else if (!strcmp(method, "fp8")) {
        if (out->block[0] == 1 && out->block[1] == 32 && !strcmp(out->scale_fmt, "ue8m0"))
            out->method = RW_QMETHOD_MXFP8;
        else
            out->method = RW_QMETHOD_FP8_BLOCK;
        if (!out->block[0]) out->block[0] = out->block[1] = 128;
    } else {
        RW_FAIL(err, RW_E_UNSUPPORTED, "config: quant_method '%s' (mxfp8 and fp8 are supported)", method);
    }
    if (out->method == RW_QMETHOD_MXFP8 && (out->block[0] != 1 || out->block[1] != 32))
        RW_FAIL(err, RW_E_UNSUPPORTED, "config: mxfp8 needs weight_block_size [1, 32], got [%d, %d]",
                out->block[0], out->block[1]);
    if (out->method == RW_QMETHOD_FP8_BLOCK && (out->block[0] != 128 || out->block[1] != 128))
        RW_FAIL(err, RW_E_UNSUPPORTED, "config: fp8 block needs weight_block_size [128, 128], got [%d, %d]",
                out->block[0], out->block[1]);
    json_t *nc = json_object_get(q, "modules_to_not_convert");
    if (!nc) nc = json_object_get(q, "ignored_layers");
    if (nc && !json_is_null(nc)) {
        if (!json_is_array(nc)) RW_FAIL(err, RW_E_FORMAT, "config: modules_to_not_convert must be a list");
        size_t n = json_array_size(nc);
        if (n > RW_MAX_NOT_CONVERT)
            RW_FAIL(err, RW_E_RANGE, "config: %zu modules_to_not_convert (at most %d)", n, RW_MAX_NOT_CONVERT);
        for (size_t i = 0; i < n; i++) {
            json_t *s = json_array_get(nc, i);
            if (!json_is_string(s)) RW_FAIL(err, RW_E_FORMAT, "config: modules_to_not_convert[%zu] is not a string", i);
            out->not_convert[i] = strdup(json_string_value(s));
            if (!out->not_convert[i]) RW_FAIL(err, RW_E_OOM, "out of memory");
            out->n_not_convert = (int)i + 1;
        }
    }
    return RW_OK;
}

static rw_status parse_root(json_t *root, rw_config *c, rw_err *err) {
    memset(c, 0, sizeof *c);
    if (!json_is_object(root)) RW_FAIL(err, RW_E_FORMAT, "config: top level is not a JSON object");
    json_t *mt = json_object_get(root, "model_type");
    if (mt && json_is_string(mt) && strcmp(json_string_value(mt), "qwen3_moe"))
        RW_FAIL(err, RW_E_UNSUPPORTED, "config: model_type '%s' (only qwen3_moe)", json_string_value(mt));
    RW_CHECK(get_int(root, "vocab_size", true, 0, &c->vocab_size, err));
    RW_CHECK(get_int(root, "hidden_size", true, 0, &c->hidden_size, err));
    RW_CHECK(get_int(root, "num_hidden_layers", true, 0, &c->num_layers, err));
    RW_CHECK(get_int(root, "num_attention_heads", true, 0, &c->num_heads, err));
    RW_CHECK(get_int(root, "num_key_value_heads", false, c->num_heads, &c->num_kv_heads, err));
    RW_CHECK(get_int(root, "head_dim", false, c->num_heads ? c->hidden_size / c->num_heads : 0,
                     &c->head_dim, err));
    json_t *ne = json_object_get(root, "num_experts");
    RW_CHECK(get_int(root, ne && !json_is_null(ne) ? "num_experts" : "num_local_experts", true, 0,
                     &c->num_experts, err));
    RW_CHECK(get_int(root, "num_experts_per_tok", true, 0, &c->top_k, err));
    RW_CHECK(get_int(root, "moe_intermediate_size", true, 0, &c->moe_intermediate, err));
    RW_CHECK(get_int(root, "max_position_embeddings", false, 32768, &c->max_position, err));
    bool found = false;
    json_t *rp = json_object_get(root, "rope_parameters");
    if (rp && json_is_object(rp)) {
        RW_CHECK(get_num(rp, "rope_theta", &found, &c->rope_theta, err));
        json_t *rt = json_object_get(rp, "rope_type");
        if (rt && json_is_string(rt) && strcmp(json_string_value(rt), "default"))
            RW_FAIL(err, RW_E_UNSUPPORTED, "config: rope_type '%s' (only default)", json_string_value(rt));
    }
    if (!found) RW_CHECK(get_num(root, "rope_theta", &found, &c->rope_theta, err));
    if (!found) c->rope_theta = 10000.0;
    json_t *rs = json_object_get(root, "rope_scaling");
    if (rs && !json_is_null(rs)) RW_FAIL(err, RW_E_UNSUPPORTED, "config: rope_scaling is not supported");
    RW_CHECK(get_num(root, "rms_norm_eps", &found, &c->rms_eps, err));
    if (!found) c->rms_eps = 1e-6;
    RW_CHECK(get_bool(root, "norm_topk_prob", false, &c->norm_topk_prob, err));
    RW_CHECK(get_bool(root, "tie_word_embeddings", false, &c->tie_word_embeddings, err));
    bool attn_bias = false;
    RW_CHECK(get_bool(root, "attention_bias", false, &attn_bias, err));
    if (attn_bias) RW_FAIL(err, RW_E_UNSUPPORTED, "config: attention_bias = true is not supported");
    json_t *mol = json_object_get(root, "mlp_only_layers");
    if (mol && !json_is_null(mol) && (!json_is_array(mol) || json_array_size(mol) > 0))
        RW_FAIL(err, RW_E_UNSUPPORTED, "config: dense mlp_only_layers are not supported");
    int step = 1;
    RW_CHECK(get_int(root, "decoder_sparse_step", false, 1, &step, err));
    if (step != 1) RW_FAIL(err, RW_E_UNSUPPORTED, "config: decoder_sparse_step = %d (only 1)", step);
    struct { const char *n; int v; } pos[] = {
        {"vocab_size", c->vocab_size}, {"hidden_size", c->hidden_size},
        {"num_hidden_layers", c->num_layers}, {"num_attention_heads", c->num_heads},
        {"num_key_value_heads", c->num_kv_heads}, {"head_dim", c->head_dim},
        {"num_experts", c->num_experts}, {"num_experts_per_tok", c->top_k},
        {"moe_intermediate_size", c->moe_intermediate}};
    for (size_t i = 0; i < sizeof pos / sizeof pos[0]; i++)
        if (pos[i].v <= 0) RW_FAIL(err, RW_E_RANGE, "config: %s must be positive", pos[i].n);
    if (c->num_heads % c->num_kv_heads)
        RW_FAIL(err, RW_E_RANGE, "config: num_attention_heads %d is not a multiple of num_key_value_heads %d",
                c->num_heads, c->num_kv_heads);
    if (c->top_k > c->num_experts)
        RW_FAIL(err, RW_E_RANGE, "config: num_experts_per_tok %d > num_experts %d", c->top_k, c->num_experts);
    if (c->head_dim % 2) RW_FAIL(err, RW_E_RANGE, "config: head_dim %d must be even (RoPE)", c->head_dim);
    if (c->hidden_size > (1 << 20) || c->vocab_size > (1 << 24) || c->num_layers > 4096 ||
        c->num_experts > 4096 || c->moe_intermediate > (1 << 20) || c->head_dim > 1024 ||
        c->num_heads > 1024)
        RW_FAIL(err, RW_E_RANGE, "config: a dimension is larger than rw accepts");
    if (!(c->rms_eps > 0) || !(c->rope_theta > 0))
        RW_FAIL(err, RW_E_RANGE, "config: rms_norm_eps and rope_theta must be positive");
    rw_status st = parse_quant(json_object_get(root, "quantization_config"), &c->quant, err);
    if (st != RW_OK) rw_config_free(c);
    return st;
}

rw_status rw_config_parse(const char *text, size_t len, rw_config *out, rw_err *err) {
    json_error_t je;
    memset(out, 0, sizeof *out);
    json_t *root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &je);
    if (!root) RW_FAIL(err, RW_E_FORMAT, "config: invalid JSON at line %d: %s", je.line, je.text);
    rw_status st = parse_root(root, out, err);
    json_decref(root);
    return st;
}

rw_status rw_config_load(const char *path, rw_config *out, rw_err *err) {
    char *text = NULL;
    size_t len = 0;
    memset(out, 0, sizeof *out);
    RW_CHECK(rw_read_file(path, &text, &len, err));
    rw_status st = rw_config_parse(text, len, out, err);
    free(text);
    if (st != RW_OK) rw_err_prefix(err, "%s", path);
    return st;
}

void rw_config_free(rw_config *c) {
    if (!c) return;
    for (int i = 0; i < c->quant.n_not_convert; i++) free(c->quant.not_convert[i]);
    c->quant.n_not_convert = 0;
}

rw_status rw_config_copy(const rw_config *src, rw_config *dst, rw_err *err) {
    *dst = *src;
    for (int i = 0; i < src->quant.n_not_convert; i++) {
        dst->quant.not_convert[i] = strdup(src->quant.not_convert[i]);
        if (!dst->quant.not_convert[i]) {
            dst->quant.n_not_convert = i;
            rw_config_free(dst);
            RW_FAIL(err, RW_E_OOM, "out of memory");
        }
    }
    return RW_OK;
}

rw_status rw_config_to_json(const rw_config *c, char **out, rw_err *err) {
    *out = NULL;
    json_t *r = json_object();
    json_t *arch = json_array();
    json_array_append_new(arch, json_string("Qwen3MoeForCausalLM"));
    json_object_set_new(r, "architectures", arch);
    json_object_set_new(r, "model_type", json_string("qwen3_moe"));
    json_object_set_new(r, "vocab_size", json_integer(c->vocab_size));
    json_object_set_new(r, "hidden_size", json_integer(c->hidden_size));
    json_object_set_new(r, "num_hidden_layers", json_integer(c->num_layers));
    json_object_set_new(r, "num_attention_heads", json_integer(c->num_heads));
    json_object_set_new(r, "num_key_value_heads", json_integer(c->num_kv_heads));
    json_object_set_new(r, "head_dim", json_integer(c->head_dim));
    json_object_set_new(r, "num_experts", json_integer(c->num_experts));
    json_object_set_new(r, "num_experts_per_tok", json_integer(c->top_k));
    json_object_set_new(r, "moe_intermediate_size", json_integer(c->moe_intermediate));
    json_object_set_new(r, "max_position_embeddings", json_integer(c->max_position));
    json_object_set_new(r, "rope_theta", json_real(c->rope_theta));
    json_object_set_new(r, "rms_norm_eps", json_real(c->rms_eps));
    json_object_set_new(r, "norm_topk_prob", json_boolean(c->norm_topk_prob));
    json_object_set_new(r, "tie_word_embeddings", json_boolean(c->tie_word_embeddings));
    json_object_set_new(r, "hidden_act", json_string("silu"));
    json_object_set_new(r, "decoder_sparse_step", json_integer(1));
    json_object_set_new(r, "mlp_only_layers", json_array());
    json_object_set_new(r, "attention_bias", json_false());
    json_object_set_new(r, "torch_dtype", json_string("bfloat16"));
    if (c->quant.method != RW_QMETHOD_NONE) {
        json_t *q = json_object();
        bool mx = c->quant.method == RW_QMETHOD_MXFP8;
        json_object_set_new(q, "quant_method", json_string(mx ? "mxfp8" : "fp8"));
        json_object_set_new(q, "fmt", json_string("e4m3"));
        json_object_set_new(q, "activation_scheme", json_string("dynamic"));
        json_t *bs = json_array();
        json_array_append_new(bs, json_integer(mx ? 1 : 128));
        json_array_append_new(bs, json_integer(mx ? 32 : 128));
        json_object_set_new(q, "weight_block_size", bs);
        if (mx) json_object_set_new(q, "scale_fmt", json_string("ue8m0"));
        json_t *nc = json_array();
        for (int i = 0; i < c->quant.n_not_convert; i++)
            json_array_append_new(nc, json_string(c->quant.not_convert[i]));
        json_object_set_new(q, "modules_to_not_convert", nc);
        json_object_set_new(r, "quantization_config", q);
    }
    char *s = json_dumps(r, JSON_INDENT(2) | JSON_SORT_KEYS | JSON_REAL_PRECISION(17));
    json_decref(r);
    if (!s) RW_FAIL(err, RW_E_OOM, "out of memory writing config JSON");
    *out = s;
    return RW_OK;
}
