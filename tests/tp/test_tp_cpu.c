/* test_tp_cpu.c - tensor parallelism on the CPU backend at TP 1, 2, 4 and 8 (one thread per rank,
 * the in-process communicator): every degree reproduces the transformers reference of
 * tests/fixtures/qwen3-moe-tp8 (8 q / 4 kv heads, moe_intermediate 256: at TP8 the kv heads are
 * replicated and each rank holds an expert shard of S = 32 rows padded to P = 128). Teacher-forced
 * logits within RW_TOL_F32_REF (1e-3), the 16 greedy tokens exactly, their logprobs within it. */
#include "worker_util.h"

#define NPROMPT 2
#define NGEN 16
#define FIXTURE "tests/fixtures/qwen3-moe-tp8"

typedef rw_reference fixture;

static int setup(void **state) {
    return rw_reference_setup(state, FIXTURE, NPROMPT, NGEN);
}
static int teardown(void **state) {
    return rw_reference_teardown(state);
}

/* Both prompts decoded in one batch at each degree (worker_util.h). */
static void run_tp(const fixture *fx, int tp) {
    rw_fid_run_tp(fx, tp, NPROMPT, NGEN, false);
}

static void test_tp1(void **state) { run_tp(*state, 1); }
static void test_tp2(void **state) { run_tp(*state, 2); }
static void test_tp4(void **state) { run_tp(*state, 4); }
static void test_tp8(void **state) { run_tp(*state, 8); }

/* The fixture really exercises what TP4/TP8 change: kv heads replicated at TP8 (T > nKV), the
 * expert shard padded (S < P), vocab rows split. */
static void test_fixture_shape(void **state) {
    const fixture *fx = *state;
    rw_err err = {0};
    rw_tp_dims d;
    RW_ASSERT_OK(rw_tp_dims_make(&fx->cfg, 8, 5, &d, &err), &err);
    assert_true(fx->cfg.num_kv_heads < 8);
    assert_int_equal(d.nkv_local, 1);
    assert_int_equal(d.kv_head0, 5 / (8 / fx->cfg.num_kv_heads));
    assert_int_equal(d.S, 32);
    assert_int_equal(d.P, 128);
    assert_int_equal(d.nh_local, 1);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fixture_shape), cmocka_unit_test(test_tp1),
        cmocka_unit_test(test_tp2),           cmocka_unit_test(test_tp4),
        cmocka_unit_test(test_tp8),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
