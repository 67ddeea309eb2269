/* test_invariance_gpu.c - batch invariance of the CUDA backend through the engine (gpu suite), on
 * the head_dim-128 fixture (GQA 4; its 300-token prompt spans three 128-key attention segments):
 * a probe request must give the same tokens and the same logprob bits
 * - under every prefill chunking: engine token budgets 32, 96, 128, 200, 256 and 2048 cut the
 *   prompt at different places (and pack it with other requests' tokens);
 * - at every decode batch size: alone, and decoding beside 6, 63 and 255 other requests
 *   (decode graphs of different padded sizes, different attention splits);
 * - whether a position's logprob comes from a decode step or from a prefill: the probe's
 *   generated tokens fed back as a prompt give the same logprob bits for the next token.
 * Greedy and seeded T = 1 sampling both. The outputs of the CUDA backend are compared with
 * themselves, bit for bit; the fixture's reference is test_cuda_vs_transformers_gpu.c's job. */
#include "worker_util.h"

#define FIXTURE "tests/fixtures/qwen3-moe-hd128"
#define NEW 32

typedef rw_reference fx;

static int setup(void **state) {
    return rw_reference_setup(state, FIXTURE, 0, 0);
}
static int teardown(void **state) {
    return rw_reference_teardown(state);
}

static rw_sampling probe_sampling(bool sampled) {
    rw_sampling sp = rw_sampling_default();
    sp.max_new_tokens = NEW;
    if (sampled) {
        sp.temperature = 1.0f;
        sp.seed = 1234;
    }
    return sp;
}

/* The probe (id 0) alone or with `others` more requests (ids 1..others: short prompts, greedy,
 * enough new tokens to keep decoding while the probe does) in an engine with the given token
 * budget. Returns the probe's output. */
static rw_output *run_probe(rw_model *m, const fx *f, int budget, int others, bool sampled) {
    rw_err err = {0};
    rw_engine_opts o = rw_engine_opts_default();
    o.max_batch_tokens = budget;
    o.max_running = 256;
    o.kv_bytes = (size_t)512 << 20;
    rw_engine *e;
    RW_ASSERT_OK(rw_engine_create(m, &o, &e, &err), &err);
    const int V = f->cfg.vocab_size;
    for (int i = 1; i <= others; i++) {
        int32_t p[24];
        const int n = 1 + i % 23;
        for (int j = 0; j < n; j++)
            p[j] = (i * 131 + j * 17) % V;
        rw_sampling sp = rw_sampling_default();
        sp.max_new_tokens = NEW + 8;
        RW_ASSERT_OK(rw_engine_add(e, (uint64_t)i, p, n, &sp, &err), &err);
    }
    const rw_sampling sp = probe_sampling(sampled);
    RW_ASSERT_OK(rw_engine_add(e, 0, f->prompt[2], f->plen[2], &sp, &err), &err);
    RW_ASSERT_OK(rw_engine_run(e, &err), &err);
    rw_output *probe = NULL, *o2;
    while ((o2 = rw_engine_pop_output(e))) {
        if (o2->id == 0)
            probe = o2;
        else
            rw_output_free(o2);
    }
    assert_non_null(probe);
    assert_int_equal(probe->n, NEW);
    rw_engine_destroy(e);
    return probe;
}

/* Tokens and logprob bits equal; the first difference is printed. */
static void assert_same(const rw_output *a, const rw_output *b, const char *what) {
    assert_int_equal(a->n, b->n);
    for (int i = 0; i < a->n; i++)
        if (a->tokens[i] != b->tokens[i] ||
            memcmp(&a->logprobs[i], &b->logprobs[i], sizeof(float)) != 0)
            fail_msg("%s: token %d differs: %d (logprob %.9g) vs %d (logprob %.9g)", what, i,
                     a->tokens[i], a->logprobs[i], b->tokens[i], b->logprobs[i]);
}

static void test_prefill_chunking(void **state) {
    fx *f = *state;
    assert_true(f->plen[2] > 256);
    rw_model *m = rw_test_load_model(&f->cfg, RW_BACKEND_CUDA, f->dir);
    static const int budgets[] = {2048, 32, 96, 128, 200, 256};
    for (int sampled = 0; sampled < 2; sampled++) {
        rw_output *base = run_probe(m, f, budgets[0], 0, sampled);
        for (size_t i = 1; i < sizeof budgets / sizeof budgets[0]; i++) {
            char what[96];
            snprintf(what, sizeof what, "%s probe, token budget %d vs %d",
                     sampled ? "sampled" : "greedy", budgets[i], budgets[0]);
            rw_output *o = run_probe(m, f, budgets[i], 0, sampled);
            assert_same(o, base, what);
            rw_output_free(o);
            /* the same budget with other requests' tokens packed around the chunks */
            snprintf(what, sizeof what, "%s probe, token budget %d beside 9 others vs alone",
                     sampled ? "sampled" : "greedy", budgets[i]);
            o = run_probe(m, f, budgets[i], 9, sampled);
            assert_same(o, base, what);
            rw_output_free(o);
        }
        print_message("%s probe: identical under token budgets 32, 96, 128, 200, 256, 2048, "
                      "alone and beside other requests\n",
                      sampled ? "sampled" : "greedy");
        rw_output_free(base);
    }
    rw_model_destroy(m);
}

static void test_decode_batch_sizes(void **state) {
    fx *f = *state;
    rw_model *m = rw_test_load_model(&f->cfg, RW_BACKEND_CUDA, f->dir);
    static const int others[] = {0, 6, 63, 255};
    for (int sampled = 0; sampled < 2; sampled++) {
        rw_output *base = run_probe(m, f, 4096, 0, sampled);
        for (size_t i = 1; i < sizeof others / sizeof others[0]; i++) {
            char what[96];
            snprintf(what, sizeof what, "%s probe decoding in a batch of %d vs alone",
                     sampled ? "sampled" : "greedy", others[i] + 1);
            rw_output *o = run_probe(m, f, 4096, others[i], sampled);
            assert_same(o, base, what);
            rw_output_free(o);
        }
        print_message("%s probe: identical at decode batch sizes 1, 7, 64, 256\n",
                      sampled ? "sampled" : "greedy");
        rw_output_free(base);
    }
    rw_model_destroy(m);
}

/* The logprob of generated token k comes from a decode step; the same token after the prompt +
 * the first k generated tokens as a prompt comes from a prefill row. Both must be the same bits
 * (greedy, so the token is the argmax both ways; a sampled probe's draw depends on the position,
 * which is the same too). */
static void test_prefill_vs_decode(void **state) {
    fx *f = *state;
    rw_model *m = rw_test_load_model(&f->cfg, RW_BACKEND_CUDA, f->dir);
    rw_err err = {0};
    for (int sampled = 0; sampled < 2; sampled++) {
        rw_output *gen = run_probe(m, f, 2048, 0, sampled);
        const int L = f->plen[2];
        static const int ks[] = {1, 5, 17, NEW - 1};
        for (size_t i = 0; i < sizeof ks / sizeof ks[0]; i++) {
            const int k = ks[i];
            int32_t *p = malloc(sizeof(int32_t) * (size_t)(L + k));
            memcpy(p, f->prompt[2], sizeof(int32_t) * (size_t)L);
            memcpy(p + L, gen->tokens, sizeof(int32_t) * (size_t)k);
            rw_engine *e;
            RW_ASSERT_OK(rw_engine_create(m, NULL, &e, &err), &err);
            rw_sampling sp = probe_sampling(sampled);
            sp.max_new_tokens = 1;
            RW_ASSERT_OK(rw_engine_add(e, 0, p, L + k, &sp, &err), &err);
            RW_ASSERT_OK(rw_engine_run(e, &err), &err);
            rw_output *o = rw_engine_pop_output(e);
            assert_non_null(o);
            if (o->tokens[0] != gen->tokens[k] ||
                memcmp(&o->logprobs[0], &gen->logprobs[k], sizeof(float)) != 0)
                fail_msg("%s: generated token %d: decode gave %d (logprob %.9g), a prefill of "
                         "the same prefix %d (logprob %.9g)",
                         sampled ? "sampled" : "greedy", k, gen->tokens[k], gen->logprobs[k],
                         o->tokens[0], o->logprobs[0]);
            rw_output_free(o);
            rw_engine_destroy(e);
            free(p);
        }
        rw_output_free(gen);
    }
    print_message("logprobs of generated tokens 1, 5, 17, %d: decode == prefill, greedy and "
                  "sampled\n",
                  NEW - 1);
    rw_model_destroy(m);
}

int main(void) {
    rw_test_require_gpu(1);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_prefill_chunking),
        cmocka_unit_test(test_decode_batch_sizes),
        cmocka_unit_test(test_prefill_vs_decode),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
