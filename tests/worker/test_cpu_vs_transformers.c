/* test_cpu_vs_transformers.c - the CPU backend reproduces the transformers reference of
 * tests/fixtures/qwen3-moe-tiny (target F1, docs/TARGETS.md): teacher-forced logits of every prompt
 * within RW_TOL_F32_REF (1e-3 max abs), the 24 greedy tokens exactly and their logprobs within
 * RW_TOL_F32_REF; each prompt alone, then all batched together; at TP1 and at TP2 (two ranks on
 * threads with the in-process communicator). tests/tp/test_tp_cpu.c runs every TP degree on a
 * fixture made for them. */
#include <math.h>

#include "worker_util.h"

#define NPROMPT 4
#define NGEN 24

static int setup(void **state) {
    return rw_reference_setup(state, RW_TEST_FIXTURE, NPROMPT, NGEN);
}
static int teardown(void **state) {
    return rw_reference_teardown(state);
}

static void test_tp1(void **state) {
    rw_fid_run_tp(*state, 1, NPROMPT, NGEN, true);
}

static void test_tp2_threads(void **state) {
    rw_fid_run_tp(*state, 2, NPROMPT, NGEN, true);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tp1),
        cmocka_unit_test(test_tp2_threads),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
