/* fuzz_config.c - the config.json parser over arbitrary bytes (rw_config_parse), and what runs on
 * an accepted config: rw_config_to_json / parse round trip, rw_config_copy, the canonical weight
 * enumeration with name format -> parse round trips, weight shapes and the precision policy.
 *
 * Contract checked (rw_core.h, rw_quant.h): a refusal carries its status and a message and leaves
 * nothing to free; an accepted config has positive dimensions with nH % nKV == 0, top_k <= E and
 * an even head_dim; its JSON form parses back to the same config; every canonical name formats
 * and parses back to itself and has a shape with positive dims; the policy returns a known
 * format. */
#include "fuzz_util.h"

#include <string.h>

#include "rw_core.h"
#include "rw_quant.h"

/* Fields that the JSON form carries (the quantization strings are normalised on output). */
static void same_config(const rw_config *a, const rw_config *b) {
    FUZZ_CHECK(a->vocab_size == b->vocab_size && a->hidden_size == b->hidden_size &&
                   a->num_layers == b->num_layers && a->num_heads == b->num_heads &&
                   a->num_kv_heads == b->num_kv_heads && a->head_dim == b->head_dim &&
                   a->num_experts == b->num_experts && a->top_k == b->top_k &&
                   a->moe_intermediate == b->moe_intermediate && a->max_position == b->max_position,
               "dimensions changed in the round trip");
    FUZZ_CHECK(a->rope_theta == b->rope_theta && a->rms_eps == b->rms_eps,
               "rope_theta %.17g -> %.17g, rms_eps %.17g -> %.17g", a->rope_theta, b->rope_theta,
               a->rms_eps, b->rms_eps);
    FUZZ_CHECK(a->norm_topk_prob == b->norm_topk_prob &&
                   a->tie_word_embeddings == b->tie_word_embeddings,
               "flags changed in the round trip");
    FUZZ_CHECK(a->quant.method == b->quant.method && a->quant.block[0] == b->quant.block[0] &&
                   a->quant.block[1] == b->quant.block[1] &&
                   a->quant.n_not_convert == b->quant.n_not_convert,
               "quantization_config changed in the round trip (method %d -> %d)",
               (int)a->quant.method, (int)b->quant.method);
    for (int i = 0; i < a->quant.n_not_convert; i++)
        FUZZ_CHECK(!strcmp(a->quant.not_convert[i], b->quant.not_convert[i]),
                   "modules_to_not_convert[%d] changed", i);
}

typedef struct walk {
    const rw_config *cfg;
    size_t count;
} walk;

static rw_status each_weight(const rw_wname *w, void *ctx) {
    walk *k = ctx;
    k->count++;
    char name[256];
    int n = rw_name_format(w, name, sizeof name);
    FUZZ_CHECK(n > 0 && (size_t)n < sizeof name, "name of length %d", n);
    rw_wname back;
    rw_err e;
    memset(&e, 0, sizeof e);
    rw_status st = rw_name_parse(name, k->cfg, &back, &e);
    FUZZ_CHECK(st == RW_OK, "'%s' does not parse back: %s", name, e.msg);
    FUZZ_CHECK(back.kind == w->kind && back.layer == w->layer && back.expert == w->expert &&
                   back.scale == w->scale,
               "'%s' parses to a different weight", name);
    int nd = 0;
    int64_t shape[RW_MAX_DIMS];
    st = rw_config_weight_shape(k->cfg, w, &nd, shape, &e);
    FUZZ_CHECK(st == RW_OK, "'%s': no shape: %s", name, e.msg);
    FUZZ_CHECK(nd >= 1 && nd <= RW_MAX_DIMS, "'%s': ndim %d", name, nd);
    for (int d = 0; d < nd; d++)
        FUZZ_CHECK(shape[d] >= 1, "'%s': shape[%d] = %lld", name, d, (long long)shape[d]);
    rw_wfmt f = rw_quant_policy(k->cfg, w);
    FUZZ_CHECK(f == RW_WFMT_BF16 || f == RW_WFMT_MXFP8 || f == RW_WFMT_FP8_BLOCK, "'%s': policy %d",
               name, (int)f);
    if (k->cfg->quant.method == RW_QMETHOD_NONE)
        FUZZ_CHECK(f == RW_WFMT_BF16, "'%s': quantized without a quantization_config", name);
    return RW_OK;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    rw_config c;
    rw_err e;
    memset(&e, 0, sizeof e);
    rw_status st = rw_config_parse((const char *)data, size, &c, &e);
    if (st != RW_OK) {
        FUZZ_CHECK_REFUSAL(st, e);
        FUZZ_CHECK(c.quant.n_not_convert == 0, "a refused config kept %d strings",
                   c.quant.n_not_convert);
        return 0;
    }
    FUZZ_CHECK(c.vocab_size > 0 && c.hidden_size > 0 && c.num_layers > 0 && c.num_heads > 0 &&
                   c.num_kv_heads > 0 && c.head_dim > 0 && c.num_experts > 0 && c.top_k > 0 &&
                   c.moe_intermediate > 0,
               "a non-positive dimension was accepted");
    FUZZ_CHECK(c.num_heads % c.num_kv_heads == 0, "nH %d, nKV %d", c.num_heads, c.num_kv_heads);
    FUZZ_CHECK(c.top_k <= c.num_experts, "top_k %d > E %d", c.top_k, c.num_experts);
    FUZZ_CHECK(c.head_dim % 2 == 0, "odd head_dim %d", c.head_dim);
    FUZZ_CHECK(c.rms_eps > 0 && c.rope_theta > 0, "eps %g theta %g", c.rms_eps, c.rope_theta);
    FUZZ_CHECK(c.quant.n_not_convert >= 0 && c.quant.n_not_convert <= RW_MAX_NOT_CONVERT,
               "%d not_convert entries", c.quant.n_not_convert);

    /* JSON round trip */
    char *json = NULL;
    st = rw_config_to_json(&c, &json, &e);
    FUZZ_CHECK(st == RW_OK && json, "to_json failed: %s", e.msg);
    rw_config back;
    st = rw_config_parse(json, strlen(json), &back, &e);
    FUZZ_CHECK(st == RW_OK, "the JSON form of an accepted config is refused: %s", e.msg);
    same_config(&c, &back);
    char *json2 = NULL;
    st = rw_config_to_json(&back, &json2, &e);
    FUZZ_CHECK(st == RW_OK && !strcmp(json, json2), "to_json is not stable");
    free(json);
    free(json2);
    rw_config_free(&back);

    rw_config copy;
    st = rw_config_copy(&c, &copy, &e);
    FUZZ_CHECK(st == RW_OK, "copy failed: %s", e.msg);
    same_config(&c, &copy);
    rw_config_free(&copy);

    /* the canonical weight set, when small enough to walk per input */
    size_t nw = rw_config_weight_count(&c);
    if (nw <= 20000) {
        walk k = {.cfg = &c};
        st = rw_config_for_each_weight(&c, each_weight, &k);
        FUZZ_CHECK(st == RW_OK, "enumeration failed");
        FUZZ_CHECK(k.count == nw, "enumerated %zu weights, rw_config_weight_count says %zu",
                   k.count, nw);
    }
    rw_config_free(&c);
    return 0;
}
