/* policy.c - the per-layer precision policy: which canonical weights are stored quantized under a
 * config's quantization_config (docs/LAYOUT.md section 5), modules_to_not_convert matching on
 * dotted boundaries, and the shape / dtype of the scale tensor beside a quantized weight. */
#include "rw_quant.h"

#include <stdio.h>

const char *rw_wfmt_str(rw_wfmt f) {
    switch (f) {
    case RW_WFMT_BF16: return "bf16";
    case RW_WFMT_MXFP8: return "mxfp8";
    case RW_WFMT_FP8_BLOCK: return "fp8-block";
    }
    return "invalid";
}

/* An entry matches `name` when it is a prefix of it that ends on a dotted boundary: the entry
 * ends with '.', or the name continues with '.' or ends right after it. So "model.layers.4." and
 * "model.layers.4" both match "model.layers.4.mlp.experts.0.up_proj.weight", neither matches
 * "model.layers.40.mlp...", and "model.layers.3.self_attn.q_proj" matches
 * "model.layers.3.self_attn.q_proj.weight" (and its .weight_scale_inv). */
static bool entry_matches(const char *entry, const char *name) {
    size_t n = strlen(entry);
    if (n == 0 || strncmp(entry, name, n) != 0) return false;
    return entry[n - 1] == '.' || name[n] == '.' || name[n] == '\0';
}

bool rw_quant_not_convert_match(const rw_quant_config *q, const char *name) {
    if (!q || !name) return false;
    for (int i = 0; i < q->n_not_convert; i++)
        if (q->not_convert[i] && entry_matches(q->not_convert[i], name)) return true;
    return false;
}

static rw_wfmt method_fmt(rw_qmethod m) {
    switch (m) {
    case RW_QMETHOD_MXFP8: return RW_WFMT_MXFP8;
    case RW_QMETHOD_FP8_BLOCK: return RW_WFMT_FP8_BLOCK;
    default: return RW_WFMT_BF16;
    }
}

/* The experts of one layer share one format, because the packed MoE layout of a layer is either
 * all bf16 or all quantized. They are quantized only when both K dims (H for gate/up, I for down)
 * are multiples of 32 and the module "model.layers.L.mlp.experts" is not excluded by an entry at
 * or above it ("model.layers.L.", "model.layers.L.mlp", "model.layers.L.mlp.experts"). An entry
 * naming one expert does not change the layer: that expert is quantized on load like any bf16
 * input for a quantized layer. */
static rw_wfmt experts_fmt(const rw_config *cfg, int layer) {
    rw_wfmt f = method_fmt(cfg->quant.method);
    if (f == RW_WFMT_BF16) return f;
    if (cfg->hidden_size % RW_MXFP8_BLOCK || cfg->moe_intermediate % RW_MXFP8_BLOCK)
        return RW_WFMT_BF16;
    char mod[64];
    snprintf(mod, sizeof mod, "model.layers.%d.mlp.experts", layer);
    return rw_quant_not_convert_match(&cfg->quant, mod) ? RW_WFMT_BF16 : f;
}

rw_wfmt rw_quant_policy(const rw_config *cfg, const rw_wname *w) {
    if (!cfg || !w) return RW_WFMT_BF16;
    rw_wfmt f = method_fmt(cfg->quant.method);
    if (f == RW_WFMT_BF16) return f;
    switch (w->kind) {
    case RW_W_Q:
    case RW_W_K:
    case RW_W_V:
    case RW_W_O: break;
    case RW_W_EXP_GATE:
    case RW_W_EXP_UP:
    case RW_W_EXP_DOWN:
    case RW_W_EXP_GATE_UP:
    case RW_W_EXP_DOWN_ALL: return experts_fmt(cfg, w->layer);
    default: return RW_WFMT_BF16; /* norms, embeddings, router, lm_head, unknown */
    }
    /* Attention projections: K is the last dim of [out, in]. */
    int nd = 0;
    int64_t shape[RW_MAX_DIMS];
    rw_wname plain = *w;
    plain.scale = false;
    if (rw_config_weight_shape(cfg, &plain, &nd, shape, NULL) != RW_OK || nd < 1)
        return RW_WFMT_BF16;
    if (shape[nd - 1] % RW_MXFP8_BLOCK) return RW_WFMT_BF16;
    char name[128];
    rw_name_format(&plain, name, sizeof name);
    return rw_quant_not_convert_match(&cfg->quant, name) ? RW_WFMT_BF16 : f;
}

void rw_quant_scale_shape(rw_wfmt f, int64_t rows, int64_t cols, int64_t out_shape[2]) {
    switch (f) {
    case RW_WFMT_MXFP8:
        out_shape[0] = rows;
        out_shape[1] = cols / RW_MXFP8_BLOCK;
        return;
    case RW_WFMT_FP8_BLOCK:
        out_shape[0] = (rows + RW_FP8_BLOCK - 1) / RW_FP8_BLOCK;
        out_shape[1] = (cols + RW_FP8_BLOCK - 1) / RW_FP8_BLOCK;
        return;
    default: out_shape[0] = out_shape[1] = 0; return;
    }
}

rw_dtype rw_quant_scale_dtype(rw_wfmt f) {
    switch (f) {
    case RW_WFMT_MXFP8: return RW_DTYPE_U8;
    case RW_WFMT_FP8_BLOCK: return RW_DTYPE_F32;
    default: return RW_DTYPE_INVALID;
    }
}
