/* test_plan.c - shard planner (docs/LAYOUT.md section 2): the seed regression, tiling of [0, I)
 * by the unpadded slices for every T and I of docs/LAYOUT.md section 6, fused gate_up halves,
 * attention and vocab slices, and the JSON form rw-layout prints. */
#include "moe_util.h"

static const int TPS[] = {1, 2, 4, 8};
static const int64_t IS[] = {768, 1536, 96, 160};

static rw_shard_plan plan_of(const rw_config *c, int tp, int r, rw_wkind k, int layer, int e) {
    rw_wname w = {k, layer, e, false};
    rw_shard_plan p;
    rw_err err = {0};
    RW_ASSERT_OK(rw_moe_plan_tensor(c, tp, r, &w, &p, &err), &err);
    return p;
}

/* I = 768, T = 8, r = 3: S = 96, P = 128, rank 3 reads [288, 384) for gate, up, down and both
 * halves of the fused form, never the padded offset [384, 512). */
static void test_seed_regression(void **state) {
    (void)state;
    rw_config c;
    moe_test_config(&c, 256, 4, 768, 1, RW_QMETHOD_NONE, 0);
    rw_tp_dims d;
    rw_err err = {0};
    RW_ASSERT_OK(rw_tp_dims_make(&c, 8, 3, &d, &err), &err);
    assert_int_equal(d.S, 96);
    assert_int_equal(d.P, 128);
    rw_shard_plan g = plan_of(&c, 8, 3, RW_W_EXP_GATE, 0, 2);
    rw_shard_plan u = plan_of(&c, 8, 3, RW_W_EXP_UP, 0, 2);
    rw_shard_plan dn = plan_of(&c, 8, 3, RW_W_EXP_DOWN, 0, 2);
    rw_shard_plan f = plan_of(&c, 8, 3, RW_W_EXP_GATE_UP, 0, -1);
    rw_shard_plan fd = plan_of(&c, 8, 3, RW_W_EXP_DOWN_ALL, 0, -1);
    assert_int_equal(g.dim, 0);
    assert_int_equal(g.src_begin, 288);
    assert_int_equal(g.src_end, 384);
    assert_int_equal(u.dim, 0);
    assert_int_equal(u.src_begin, 288);
    assert_int_equal(u.src_end, 384);
    assert_int_equal(dn.dim, 1);
    assert_int_equal(dn.src_begin, 288);
    assert_int_equal(dn.src_end, 384);
    assert_int_equal(f.dim, 1);
    assert_int_equal(f.src_begin, 288); /* gate half */
    assert_int_equal(f.src_end, 384);
    assert_int_equal(f.src2_begin, 768 + 288); /* up half, sliced on its own */
    assert_int_equal(f.src2_end, 768 + 384);
    assert_int_equal(fd.dim, 2);
    assert_int_equal(fd.src_begin, 288);
    assert_int_equal(fd.src_end, 384);
    /* destination shapes are padded to P */
    assert_int_equal(g.dst_shape[0], 128);
    assert_int_equal(g.dst_shape[1], 256);
    assert_true(g.padded);
    assert_int_equal(dn.dst_shape[0], 256);
    assert_int_equal(dn.dst_shape[1], 128);
    assert_int_equal(f.dst_shape[0], 4);
    assert_int_equal(f.dst_shape[1], 256);
    assert_int_equal(f.dst_shape[2], 256);
    rw_config_free(&c);
}

/* Every rank's slices tile [0, I) exactly once, for every T and I of section 6, for gate, up,
 * down and the fused forms; the local shape is P = roundup(I/T, 128). */
static void test_tiling(void **state) {
    (void)state;
    for (size_t ii = 0; ii < 4; ii++) {
        rw_config c;
        moe_test_config(&c, 256, 4, IS[ii], 1, RW_QMETHOD_NONE, 0);
        int64_t I = IS[ii];
        for (size_t ti = 0; ti < 4; ti++) {
            int T = TPS[ti];
            for (rw_wkind k = RW_W_EXP_GATE; k <= RW_W_EXP_DOWN_ALL; k++) {
                int64_t span = k == RW_W_EXP_GATE_UP ? 2 * I : I;
                unsigned char *hits = calloc((size_t)span, 1);
                for (int r = 0; r < T; r++) {
                    int e = (k == RW_W_EXP_GATE_UP || k == RW_W_EXP_DOWN_ALL) ? -1 : 1;
                    rw_shard_plan p = plan_of(&c, T, r, k, 0, e);
                    int64_t S = I / T, P = rw_roundup(S, 128);
                    assert_int_equal(p.src_begin, r * S);
                    assert_int_equal(p.src_end, (r + 1) * S);
                    assert_int_equal(p.padded, P > S);
                    for (int64_t x = p.src_begin; x < p.src_end; x++)
                        hits[x]++;
                    if (k == RW_W_EXP_GATE_UP) {
                        assert_int_equal(p.src2_end - p.src2_begin, S);
                        for (int64_t x = p.src2_begin; x < p.src2_end; x++)
                            hits[x]++;
                        assert_int_equal(p.dst_shape[1], 2 * P);
                    } else {
                        assert_int_equal(p.dst_shape[p.dim], P);
                    }
                }
                for (int64_t x = 0; x < span; x++)
                    if (hits[x] != 1)
                        fail_msg("I=%lld T=%d %s: index %lld covered %d times", (long long)I, T,
                                 rw_wkind_str(k), (long long)x, hits[x]);
                free(hits);
            }
        }
        rw_config_free(&c);
    }
}

/* Attention, vocab and replicated tensors. 8 heads of 32, 4 kv heads, vocab 200 (Vp 256). */
static void test_attention_and_vocab(void **state) {
    (void)state;
    rw_config c;
    moe_test_config(&c, 256, 4, 768, 2, RW_QMETHOD_NONE, 0);
    /* T = 8 > nKV = 4: ranks 2r and 2r+1 hold kv head r, replicated. */
    for (int r = 0; r < 8; r++) {
        rw_shard_plan q = plan_of(&c, 8, r, RW_W_Q, 1, -1);
        assert_int_equal(q.dim, 0);
        assert_int_equal(q.src_begin, r * 32);
        assert_int_equal(q.src_end, (r + 1) * 32);
        rw_shard_plan k = plan_of(&c, 8, r, RW_W_K, 1, -1);
        assert_int_equal(k.src_begin, (r / 2) * 32);
        assert_int_equal(k.src_end, (r / 2) * 32 + 32);
        rw_shard_plan o = plan_of(&c, 8, r, RW_W_O, 1, -1);
        assert_int_equal(o.dim, 1);
        assert_int_equal(o.src_begin, r * 32);
        assert_int_equal(o.dst_shape[0], 256);
        assert_int_equal(o.dst_shape[1], 32);
        rw_shard_plan em = plan_of(&c, 8, r, RW_W_EMBED, -1, -1);
        /* Vp = 256, 32 rows per rank; rows past V = 200 are padding */
        int64_t b = r * 32 < 200 ? r * 32 : 200, e = (r + 1) * 32 < 200 ? (r + 1) * 32 : 200;
        assert_int_equal(em.src_begin, b);
        assert_int_equal(em.src_end, e);
        assert_int_equal(em.dst_shape[0], 32);
        assert_int_equal(em.padded, e - b < 32);
        rw_shard_plan rt = plan_of(&c, 8, r, RW_W_ROUTER, 0, -1);
        assert_int_equal(rt.dim, -1);
        assert_int_equal(rt.dst_shape[0], 4);
        assert_int_equal(rt.dst_shape[1], 256);
    }
    /* T = 2 <= nKV: two kv heads per rank */
    rw_shard_plan k1 = plan_of(&c, 2, 1, RW_W_V, 0, -1);
    assert_int_equal(k1.src_begin, 64);
    assert_int_equal(k1.src_end, 128);
    rw_config_free(&c);
}

static void test_bad_dims(void **state) {
    (void)state;
    rw_config c;
    moe_test_config(&c, 256, 4, 96, 1, RW_QMETHOD_NONE, 0);
    rw_tp_dims d;
    rw_err err = {0};
    assert_int_equal(rw_tp_dims_make(&c, 0, 0, &d, &err), RW_E_RANGE);
    assert_int_equal(rw_tp_dims_make(&c, 2, 2, &d, &err), RW_E_RANGE);
    assert_int_equal(rw_tp_dims_make(&c, 3, 0, &d, &err), RW_E_SHAPE); /* 8 heads */
    assert_non_null(strstr(err.msg, "num_attention_heads"));
    c.moe_intermediate = 100;
    assert_int_equal(rw_tp_dims_make(&c, 8, 0, &d, &err), RW_E_SHAPE);
    assert_non_null(strstr(err.msg, "moe_intermediate"));
    c.moe_intermediate = 96;
    c.num_kv_heads = 3;
    assert_int_equal(rw_tp_dims_make(&c, 2, 0, &d, &err), RW_E_SHAPE);
    rw_config_free(&c);
}

static void test_json(void **state) {
    (void)state;
    rw_config c;
    moe_test_config(&c, 256, 4, 768, 1, RW_QMETHOD_NONE, 0);
    rw_shard_plan p = plan_of(&c, 8, 3, RW_W_EXP_UP, 0, 0);
    char *js = NULL;
    rw_err err = {0};
    RW_ASSERT_OK(rw_moe_plan_json(&p, &js, &err), &err);
    assert_string_equal(js, "{\"tensor\": \"model.layers.0.mlp.experts.0.up_proj.weight\", "
                            "\"kind\": \"expert.up_proj\", \"dim\": 0, \"canon_shape\": [768, "
                            "256], \"src_begin\": 288, \"src_end\": 384, \"dst_shape\": [128, "
                            "256], \"padded\": true}");
    free(js);
    rw_shard_plan n = plan_of(&c, 8, 3, RW_W_INPUT_NORM, 0, -1);
    RW_ASSERT_OK(rw_moe_plan_json(&n, &js, &err), &err);
    assert_non_null(strstr(js, "\"dim\": null"));
    assert_non_null(strstr(js, "\"padded\": false"));
    free(js);
    rw_config_free(&c);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_seed_regression),
        cmocka_unit_test(test_tiling),
        cmocka_unit_test(test_attention_and_vocab),
        cmocka_unit_test(test_bad_dims),
        cmocka_unit_test(test_json),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
