/* test_bench_forward_gpu.c - rw-bench's forward-level benchmarks (tools/bench/forward.h) and their
 * per-phase profiler on the fixture's small model (gpu suite): with RW_BENCH_BREAKDOWN=1, decode
 * and prefill print their result lines and their breakdown lines (decode: "mode": "graph" when the
 * events recorded inside the captured graph could be timed, "eager" when it fell back). */
#include "worker_util.h"
#include "forward.h"

static void test_breakdown(void **state) {
    rw_reference *fx = *state;
    setenv("RW_BENCH_BREAKDOWN", "1", 1);
    rwb_fwd_opts o = rwb_fwd_opts_default();
    o.cfg = &fx->cfg;
    o.batch = 4;
    o.ctx = 40;
    o.steps = 3;
    o.nprompt = 2;
    o.plen = 64;
    char *buf = NULL;
    size_t len = 0;
    FILE *out = open_memstream(&buf, &len);
    assert_non_null(out);
    rw_err err = {0};
    const rw_status a = rwb_fwd_decode(&o, out, &err);
    const rw_status b = a == RW_OK ? rwb_fwd_prefill(&o, out, &err) : a;
    fclose(out);
    unsetenv("RW_BENCH_BREAKDOWN");
    RW_ASSERT_OK(b, &err);
    print_message("%s", buf);
    assert_non_null(strstr(buf, "\"bench\": \"decode_breakdown\""));
    assert_non_null(strstr(buf, "\"bench\": \"prefill_breakdown\""));
    free(buf);
}

static int setup(void **state) {
    return rw_reference_setup(state, RW_TEST_FIXTURE, 0, 0);
}
static int teardown(void **state) {
    return rw_reference_teardown(state);
}

int main(void) {
    rw_test_require_gpu(1);
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_breakdown)};
    return cmocka_run_group_tests(tests, setup, teardown);
}
