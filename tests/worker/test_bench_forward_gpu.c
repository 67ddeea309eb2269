/* test_bench_forward_gpu.c - rw-bench's forward-level benchmarks (tools/bench/forward.h) and their
 * per-phase profiler on the fixture's small model (gpu suite): with RW_BENCH_BREAKDOWN=1, decode
 * and prefill print their result lines and their breakdown lines (decode: "mode": "graph" when the
 * events recorded inside the captured graph could be timed, "eager" when it fell back); the
 * kernel benchmarks print a timed line per shape. */
#include "worker_util.h"
#include "forward.h"

typedef rw_status (*bench_fn)(const rwb_fwd_opts *, FILE *, rw_err *);

/* Runs a, then b (when given), with their lines captured; asserts both succeeded and returns the
 * text (the caller frees it). */
static char *run_captured(const rwb_fwd_opts *o, bench_fn a, bench_fn b) {
    char *buf = NULL;
    size_t len = 0;
    FILE *out = open_memstream(&buf, &len);
    assert_non_null(out);
    rw_err err = {0};
    rw_status st = a(o, out, &err);
    if (st == RW_OK && b) st = b(o, out, &err);
    fclose(out);
    RW_ASSERT_OK(st, &err);
    print_message("%s", buf);
    return buf;
}

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
    char *buf = run_captured(&o, rwb_fwd_decode, rwb_fwd_prefill);
    unsetenv("RW_BENCH_BREAKDOWN");
    assert_non_null(strstr(buf, "\"bench\": \"decode_breakdown\""));
    assert_non_null(strstr(buf, "\"bench\": \"prefill_breakdown\""));
    free(buf);
}

/* rw-bench kernels (G6/G7's rw side) on the fixture: one line per attention shape, two per
 * expert token count (the hi + lo pair and bf16 alone), three per dense token count (q/k/v,
 * o_proj, lm_head) and two per small-kernel token count (RoPE + KV write, combine + norm), each
 * with a positive time. */
static void test_kernels(void **state) {
    rw_reference *fx = *state;
    rwb_fwd_opts o = rwb_fwd_opts_default();
    o.cfg = &fx->cfg;
    o.kernel_layers = 2;
    o.attn[0] = (rwb_attn_shape){4, 40, false};
    o.attn[1] = (rwb_attn_shape){2, 33, true};
    o.nattn = 2;
    o.expert_tokens[0] = 1;
    o.expert_tokens[1] = 300;
    o.nexpert_tokens = 2;
    o.dense_tokens[0] = 1;
    o.dense_tokens[1] = 300;
    o.ndense_tokens = 2;
    o.small_tokens[0] = 1;
    o.small_tokens[1] = 300;
    o.nsmall_tokens = 2;
    char *buf = run_captured(&o, rwb_fwd_kernels, NULL);
    int lines = 0;
    for (const char *p = buf; (p = strstr(p, "\"bench\": \"kernel\"")); p++) {
        const char *sec = strstr(p, "\"seconds\": ");
        assert_non_null(sec);
        assert_true(strtod(sec + 11, NULL) > 0);
        lines++;
    }
    assert_int_equal(lines, 2 + 2 * 2 + 3 * 2 + 2 * 2);
    assert_non_null(strstr(buf, "\"what\": \"attention_decode\""));
    assert_non_null(strstr(buf, "\"what\": \"attention_prefill\""));
    assert_non_null(strstr(buf, "\"what\": \"experts_bf16_input\", \"tokens\": 300"));
    assert_non_null(strstr(buf, "\"what\": \"dense_qkv\", \"tokens\": 1,"));
    assert_non_null(strstr(buf, "\"what\": \"dense_lm_head\", \"tokens\": 300,"));
    assert_non_null(strstr(buf, "\"what\": \"qk_rope_kv\", \"tokens\": 300,"));
    assert_non_null(strstr(buf, "\"what\": \"combine_rmsnorm\", \"tokens\": 1,"));
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
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_breakdown),
                                       cmocka_unit_test(test_kernels)};
    return cmocka_run_group_tests(tests, setup, teardown);
}
