/* test_cuda_oom_gpu.c - a device allocation that fails is RW_E_OOM on every worker path that
 * allocates device memory (core/cuda_check.h), and leaves no error behind for the next call (gpu
 * suite; exits 77 without a device):
 * - a plain device allocation (rw_dev_malloc) larger than any GPU;
 * - the model's weight arena: a Qwen3-235B-A22B model on one GPU;
 * - the CUDA backend's activation buffers: an engine whose token budget needs more than the GPU;
 * - the KV cache: an engine asked for a 1 TiB KV budget.
 * After each failure the fixture model still creates an engine and generates. */
#include "worker_util.h"

static void expect_oom(rw_status st, const rw_err *err, const char *what) {
    if (st != RW_E_OOM)
        fail_msg("%s: %s (%s), expected RW_E_OOM", what, rw_status_str(st), err->msg);
    print_message("%s: RW_E_OOM: %s\n", what, err->msg);
}

/* The fixture model generates a few tokens: no error was left behind by the failure before. */
static void still_works(rw_model *m) {
    rw_err err = {0};
    rw_engine *e = NULL;
    RW_ASSERT_OK(rw_engine_create(m, NULL, &e, &err), &err);
    const int32_t prompt[3] = {1, 2, 3};
    rw_sampling sp = rw_sampling_default();
    sp.max_new_tokens = 4;
    RW_ASSERT_OK(rw_engine_add(e, 1, prompt, 3, &sp, &err), &err);
    RW_ASSERT_OK(rw_engine_run(e, &err), &err);
    rw_output *o = rw_engine_pop_output(e);
    assert_non_null(o);
    assert_int_equal(o->n, 4);
    rw_output_free(o);
    rw_engine_destroy(e);
}

static int setup(void **state) {
    return rw_reference_setup(state, RW_TEST_FIXTURE, 0, 0);
}
static int teardown(void **state) {
    return rw_reference_teardown(state);
}

static void test_dev_malloc(void **state) {
    (void)state;
    rw_err err = {0};
    void *p = NULL;
    expect_oom(rw_dev_malloc((size_t)1 << 50, &p, &err), &err, "rw_dev_malloc(1 PiB)");
    assert_null(p);
    RW_ASSERT_OK(rw_dev_malloc(4096, &p, &err), &err);
    rw_dev_free(p);
}

static void test_weight_arena(void **state) {
    const rw_reference *fx = *state;
    rw_err err = {0};
    rw_config big;
    char path[1024];
    RW_ASSERT_OK(
        rw_config_load(rw_test_path(path, sizeof path, "tools/configs/qwen3-235b-a22b.json"), &big,
                       &err),
        &err);
    rw_model *m = NULL;
    rw_model_opts mo = {RW_BACKEND_CUDA, 0, 1, 0, NULL};
    expect_oom(rw_model_create(&big, &mo, &m, &err), &err, "Qwen3-235B-A22B weights on one GPU");
    assert_null(m);
    rw_config_free(&big);
    m = rw_test_load_model(&fx->cfg, RW_BACKEND_CUDA, fx->dir);
    still_works(m);
    rw_model_destroy(m);
}

/* An engine of the fixture model with options that need more device memory than there is. */
static void engine_oom(const rw_reference *fx, const rw_engine_opts *o, const char *what) {
    rw_model *m = rw_test_load_model(&fx->cfg, RW_BACKEND_CUDA, fx->dir);
    rw_err err = {0};
    rw_engine *e = NULL;
    expect_oom(rw_engine_create(m, o, &e, &err), &err, what);
    assert_null(e);
    still_works(m);
    rw_model_destroy(m);
}

static void test_backend_buffers(void **state) {
    rw_engine_opts o = rw_engine_opts_default();
    o.max_batch_tokens = 1 << 30; /* activations of 2^30 tokens: hundreds of GB */
    engine_oom(*state, &o, "activations for 2^30 tokens");
}

static void test_kv_cache(void **state) {
    rw_engine_opts o = rw_engine_opts_default();
    o.kv_bytes = (size_t)1 << 40;
    engine_oom(*state, &o, "a 1 TiB KV cache");
}

int main(void) {
    rw_test_require_gpu(1);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_dev_malloc),
        cmocka_unit_test(test_weight_arena),
        cmocka_unit_test(test_backend_buffers),
        cmocka_unit_test(test_kv_cache),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
