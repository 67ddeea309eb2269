/* names.c - canonical Hugging Face tensor names of Qwen3-MoE <-> (kind, layer, expert), the
 * canonical shapes, and the enumeration of a model's tensor set. */
#include "rw_core.h"

#include <stdio.h>
#include <stdlib.h>

/* Suffixes after "model.layers.N." that name a per-layer tensor (".weight" form). */
static const struct {
    rw_wkind kind;
    const char *suffix; /* without the trailing ".weight" */
    bool linear;        /* may carry a .weight_scale_inv */
} layer_kinds[] = {
    {RW_W_INPUT_NORM, "input_layernorm", false},
    {RW_W_POST_NORM, "post_attention_layernorm", false},
    {RW_W_Q, "self_attn.q_proj", true},
    {RW_W_K, "self_attn.k_proj", true},
    {RW_W_V, "self_attn.v_proj", true},
    {RW_W_O, "self_attn.o_proj", true},
    {RW_W_Q_NORM, "self_attn.q_norm", false},
    {RW_W_K_NORM, "self_attn.k_norm", false},
    {RW_W_ROUTER, "mlp.gate", false},
};
#define NLK (sizeof layer_kinds / sizeof layer_kinds[0])

static const char *expert_suffix(rw_wkind k) {
    switch (k) {
    case RW_W_EXP_GATE: return "gate_proj";
    case RW_W_EXP_UP: return "up_proj";
    case RW_W_EXP_DOWN: return "down_proj";
    default: return NULL;
    }
}

const char *rw_wkind_str(rw_wkind k) {
    switch (k) {
    case RW_W_EMBED: return "embed_tokens";
    case RW_W_LM_HEAD: return "lm_head";
    case RW_W_FINAL_NORM: return "norm";
    case RW_W_INPUT_NORM: return "input_layernorm";
    case RW_W_POST_NORM: return "post_attention_layernorm";
    case RW_W_Q: return "q_proj";
    case RW_W_K: return "k_proj";
    case RW_W_V: return "v_proj";
    case RW_W_O: return "o_proj";
    case RW_W_Q_NORM: return "q_norm";
    case RW_W_K_NORM: return "k_norm";
    case RW_W_ROUTER: return "router";
    case RW_W_EXP_GATE: return "expert.gate_proj";
    case RW_W_EXP_UP: return "expert.up_proj";
    case RW_W_EXP_DOWN: return "expert.down_proj";
    case RW_W_EXP_GATE_UP: return "experts.gate_up_proj";
    case RW_W_EXP_DOWN_ALL: return "experts.down_proj";
    default: return "invalid";
    }
}

bool rw_wkind_is_expert(rw_wkind k) {
    return k == RW_W_EXP_GATE || k == RW_W_EXP_UP || k == RW_W_EXP_DOWN ||
           k == RW_W_EXP_GATE_UP || k == RW_W_EXP_DOWN_ALL;
}

/* Parses a non-negative decimal index without sign or leading zeros; advances *p. */
static bool parse_index(const char **p, int *out) {
    const char *s = *p;
    if (*s < '0' || *s > '9') return false;
    if (*s == '0' && s[1] >= '0' && s[1] <= '9') return false;
    long v = 0;
    while (*s >= '0' && *s <= '9') {
        v = v * 10 + (*s - '0');
        if (v > 1000000) return false;
        s++;
    }
    *out = (int)v;
    *p = s;
    return true;
}

/* Matches "<stem>.weight" or "<stem>.weight_scale_inv" (scale only when allowed). */
static bool match_weight(const char *rest, const char *stem, bool allow_scale, bool *scale) {
    size_t n = strlen(stem);
    if (strncmp(rest, stem, n)) return false;
    rest += n;
    if (!strcmp(rest, ".weight")) {
        *scale = false;
        return true;
    }
    if (allow_scale && !strcmp(rest, ".weight_scale_inv")) {
        *scale = true;
        return true;
    }
    return false;
}

rw_status rw_name_parse(const char *name, const rw_config *cfg, rw_wname *out, rw_err *err) {
    memset(out, 0, sizeof *out);
    out->layer = -1;
    out->expert = -1;
    if (!name) RW_FAIL(err, RW_E_INVALID_ARG, "tensor name is NULL");
    size_t len = strnlen(name, RW_ST_MAX_NAME + 1);
    if (len > RW_ST_MAX_NAME) RW_FAIL(err, RW_E_NOT_FOUND, "tensor name longer than %d bytes", RW_ST_MAX_NAME);
    bool scale = false;
    if (!strcmp(name, "model.embed_tokens.weight")) {
        out->kind = RW_W_EMBED;
        return RW_OK;
    }
    if (match_weight(name, "lm_head", false, &scale)) {
        out->kind = RW_W_LM_HEAD;
        return RW_OK;
    }
    if (!strcmp(name, "model.norm.weight")) {
        out->kind = RW_W_FINAL_NORM;
        return RW_OK;
    }
    const char *pre = "model.layers.";
    if (strncmp(name, pre, strlen(pre))) goto unknown;
    const char *p = name + strlen(pre);
    int layer;
    if (!parse_index(&p, &layer) || *p != '.') goto unknown;
    p++;
    out->layer = layer;
    for (size_t i = 0; i < NLK; i++) {
        if (match_weight(p, layer_kinds[i].suffix, layer_kinds[i].linear, &scale)) {
            out->kind = layer_kinds[i].kind;
            out->scale = scale;
            goto check;
        }
    }
    if (!strcmp(p, "mlp.experts.gate_up_proj")) {
        out->kind = RW_W_EXP_GATE_UP;
        goto check;
    }
    if (!strcmp(p, "mlp.experts.down_proj")) {
        out->kind = RW_W_EXP_DOWN_ALL;
        goto check;
    }
    const char *ep = "mlp.experts.";
    if (strncmp(p, ep, strlen(ep))) goto unknown;
    p += strlen(ep);
    int expert;
    if (!parse_index(&p, &expert) || *p != '.') goto unknown;
    p++;
    for (rw_wkind k = RW_W_EXP_GATE; k <= RW_W_EXP_DOWN; k++) {
        if (match_weight(p, expert_suffix(k), true, &scale)) {
            out->kind = k;
            out->expert = expert;
            out->scale = scale;
            goto check;
        }
    }
unknown:
    out->kind = RW_W_INVALID;
    RW_FAIL(err, RW_E_NOT_FOUND, "unknown tensor name '%.*s'", 200, name);
check:
    if (cfg) {
        if (out->layer >= cfg->num_layers)
            RW_FAIL(err, RW_E_RANGE, "tensor '%.*s': layer %d but the model has %d layers", 200, name,
                    out->layer, cfg->num_layers);
        if (out->expert >= cfg->num_experts)
            RW_FAIL(err, RW_E_RANGE, "tensor '%.*s': expert %d but the model has %d experts", 200,
                    name, out->expert, cfg->num_experts);
    }
    return RW_OK;
}

int rw_name_format(const rw_wname *w, char *buf, size_t cap) {
    const char *sfx = w->scale ? ".weight_scale_inv" : ".weight";
    switch (w->kind) {
    case RW_W_EMBED: return snprintf(buf, cap, "model.embed_tokens.weight");
    case RW_W_LM_HEAD: return snprintf(buf, cap, "lm_head%s", sfx);
    case RW_W_FINAL_NORM: return snprintf(buf, cap, "model.norm.weight");
    case RW_W_EXP_GATE:
    case RW_W_EXP_UP:
    case RW_W_EXP_DOWN:
        return snprintf(buf, cap, "model.layers.%d.mlp.experts.%d.%s%s", w->layer, w->expert,
                        expert_suffix(w->kind), sfx);
    case RW_W_EXP_GATE_UP:
        return snprintf(buf, cap, "model.layers.%d.mlp.experts.gate_up_proj", w->layer);
    case RW_W_EXP_DOWN_ALL:
        return snprintf(buf, cap, "model.layers.%d.mlp.experts.down_proj", w->layer);
    default:
        for (size_t i = 0; i < NLK; i++)
            if (layer_kinds[i].kind == w->kind)
                return snprintf(buf, cap, "model.layers.%d.%s%s", w->layer, layer_kinds[i].suffix,
                                sfx);
    }
    return snprintf(buf, cap, "invalid");
}

rw_status rw_config_weight_shape(const rw_config *c, const rw_wname *w, int *ndim, int64_t *shape,
                                 rw_err *err) {
    int64_t V = c->vocab_size, H = c->hidden_size, I = c->moe_intermediate, E = c->num_experts;
    int64_t q = (int64_t)c->num_heads * c->head_dim, kv = (int64_t)c->num_kv_heads * c->head_dim;
    int64_t hd = c->head_dim;
#define SET1(a) (*ndim = 1, shape[0] = (a))
#define SET2(a, b) (*ndim = 2, shape[0] = (a), shape[1] = (b))
#define SET3(a, b, d) (*ndim = 3, shape[0] = (a), shape[1] = (b), shape[2] = (d))
    switch (w->kind) {
    case RW_W_EMBED:
    case RW_W_LM_HEAD: SET2(V, H); break;
    case RW_W_FINAL_NORM:
    case RW_W_INPUT_NORM:
    case RW_W_POST_NORM: SET1(H); break;
    case RW_W_Q: SET2(q, H); break;
    case RW_W_K:
    case RW_W_V: SET2(kv, H); break;
    case RW_W_O: SET2(H, q); break;
    case RW_W_Q_NORM:
    case RW_W_K_NORM: SET1(hd); break;
    case RW_W_ROUTER: SET2(E, H); break;
    case RW_W_EXP_GATE:
    case RW_W_EXP_UP: SET2(I, H); break;
    case RW_W_EXP_DOWN: SET2(H, I); break;
    case RW_W_EXP_GATE_UP: SET3(E, 2 * I, H); break;
    case RW_W_EXP_DOWN_ALL: SET3(E, H, I); break;
    default: RW_FAIL(err, RW_E_INVALID_ARG, "no shape for tensor kind %d", (int)w->kind);
    }
#undef SET1
#undef SET2
#undef SET3
    return RW_OK;
}

rw_status rw_config_for_each_weight(const rw_config *c, rw_weight_fn fn, void *ctx) {
    rw_wname w = {RW_W_EMBED, -1, -1, false};
    RW_CHECK(fn(&w, ctx));
    static const rw_wkind per_layer[] = {RW_W_INPUT_NORM, RW_W_Q,      RW_W_K,
                                         RW_W_V,          RW_W_O,      RW_W_Q_NORM,
                                         RW_W_K_NORM,     RW_W_POST_NORM, RW_W_ROUTER};
    for (int l = 0; l < c->num_layers; l++) {
        for (size_t i = 0; i < sizeof per_layer / sizeof per_layer[0]; i++) {
            rw_wname x = {per_layer[i], l, -1, false};
            RW_CHECK(fn(&x, ctx));
        }
        for (int e = 0; e < c->num_experts; e++) {
            for (rw_wkind k = RW_W_EXP_GATE; k <= RW_W_EXP_DOWN; k++) {
                rw_wname x = {k, l, e, false};
                RW_CHECK(fn(&x, ctx));
            }
        }
    }
    rw_wname n = {RW_W_FINAL_NORM, -1, -1, false};
    RW_CHECK(fn(&n, ctx));
    if (!c->tie_word_embeddings) {
        rw_wname h = {RW_W_LM_HEAD, -1, -1, false};
        RW_CHECK(fn(&h, ctx));
    }
    return RW_OK;
}

size_t rw_config_weight_count(const rw_config *c) {
    return 1 + (size_t)c->num_layers * (9 + 3 * (size_t)c->num_experts) + 1 +
           (c->tie_word_embeddings ? 0 : 1);
}
