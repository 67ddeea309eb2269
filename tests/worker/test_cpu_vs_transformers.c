/* test_cpu_vs_transformers.c - the CPU backend reproduces the transformers reference of
 * tests/fixtures/qwen3-moe-tiny and of tests/fixtures/qwen3-moe-hd128 (head_dim 128, GQA 4,
 * expert width 160, a 300-token prompt) (target F1, docs/TARGETS.md): teacher-forced logits of every prompt
 * within RW_TOL_F32_REF (1e-3 max abs), the 24 greedy tokens exactly and their logprobs within
 * RW_TOL_F32_REF; each prompt alone, then all batched together; at TP1 and at TP2 (two ranks on
 * threads with the in-process communicator). tests/tp/test_tp_cpu.c runs every TP degree on a
 * fixture made for them. */
#include <math.h>

#include "worker_util.h"

#define NGEN 24

static int setup_tiny(void **state) {
    return rw_reference_setup(state, RW_TEST_FIXTURE, 4, NGEN);
}
static int setup_hd128(void **state) {
    return rw_reference_setup(state, "tests/fixtures/qwen3-moe-hd128", 3, NGEN);
}
static int teardown(void **state) {
    return rw_reference_teardown(state);
}

static void test_tp1(void **state) {
    const rw_reference *f = *state;
    rw_fid_run_tp(*state, 1, f->nprompt, NGEN, true);
}

static void test_tp2_threads(void **state) {
    const rw_reference *f = *state;
    rw_fid_run_tp(*state, 2, f->nprompt, NGEN, true);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_tp1, setup_tiny, teardown),
        cmocka_unit_test_setup_teardown(test_tp2_threads, setup_tiny, teardown),
        cmocka_unit_test_setup_teardown(test_tp1, setup_hd128, teardown),
        cmocka_unit_test_setup_teardown(test_tp2_threads, setup_hd128, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
