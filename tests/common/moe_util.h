/* moe_util.h - helpers shared by the moe module's tests (tests/moe): small Qwen3-MoE configs built
 * in memory, random bf16 tensors and bytes, and the logical scale sizes of the packed layout. */
#ifndef RW_TEST_MOE_UTIL_H
#define RW_TEST_MOE_UTIL_H

#include "rw_test.h"
#include "rw_moe.h"

#include <stdlib.h>

/* A small model: H hidden, E experts, I moe_intermediate, L layers; attention 8 heads of 32,
 * 4 kv heads, vocab 200 (padded to 256 so TP 8 divides it). `method` picks the quantization;
 * `last_n_bf16` layers at the end stay bf16 through modules_to_not_convert. */
static inline void moe_test_config(rw_config *c, int64_t H, int E, int64_t I, int L,
                                   rw_qmethod method, int last_n_bf16) {
    memset(c, 0, sizeof *c);
    c->vocab_size = 200;
    c->hidden_size = (int)H;
    c->num_layers = L;
    c->num_heads = 8;
    c->num_kv_heads = 4;
    c->head_dim = 32;
    c->num_experts = E;
    c->top_k = 2;
    c->moe_intermediate = (int)I;
    c->max_position = 512;
    c->rope_theta = 1e6;
    c->rms_eps = 1e-6;
    c->norm_topk_prob = true;
    c->tie_word_embeddings = false;
    c->quant.method = method;
    if (method == RW_QMETHOD_MXFP8) {
        c->quant.block[0] = 1;
        c->quant.block[1] = 32;
        strcpy(c->quant.scale_fmt, "ue8m0");
    } else if (method == RW_QMETHOD_FP8_BLOCK) {
        c->quant.block[0] = 128;
        c->quant.block[1] = 128;
    }
    strcpy(c->quant.fmt, "e4m3");
    for (int i = 0; i < last_n_bf16 && i < L; i++) {
        char buf[64];
        snprintf(buf, sizeof buf, "model.layers.%d.", L - 1 - i);
        c->quant.not_convert[c->quant.n_not_convert++] = strdup(buf);
    }
}

/* Random bf16 values, normal with the given std (never all zeros). Caller frees. */
static inline uint16_t *moe_test_rand_bf16(size_t n, uint64_t seed, float std) {
    uint16_t *p = malloc(n * sizeof *p + 16);
    assert_non_null(p);
    rw_test_fill_bf16(p, n, seed, std);
    return p;
}

static inline void *moe_test_rand_bytes(size_t n, uint64_t seed) {
    uint8_t *p = malloc(n + 16);
    assert_non_null(p);
    rw_rng r;
    rw_rng_seed(&r, seed);
    for (size_t i = 0; i < n; i++)
        p[i] = (uint8_t)rw_rng_u64(&r);
    return p;
}

/* Logical scale bytes of one expert matrix: mxfp8 [rows, cols/32] u8, fp8 like the packed. */
static inline size_t moe_test_logical_scale_bytes(rw_wfmt f, rw_moe_mat m, int64_t P, int64_t H) {
    int64_t rows = m == RW_MOE_W13 ? 2 * P : H, cols = m == RW_MOE_W13 ? H : P;
    if (f == RW_WFMT_MXFP8) return (size_t)(rows * (cols / 32));
    return rw_moe_packed_scale_bytes(f, m, P, H);
}

#endif
