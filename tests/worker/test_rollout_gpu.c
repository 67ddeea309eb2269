/* test_rollout_gpu.c - the rollout features on the CUDA backend (gpu suite), on the tiny fixture
 * and the head_dim-128 one:
 * - routed experts: the GPU's exported ids equal the CPU backend's for the same tokens wherever
 *   the choice is not a near tie. The CUDA backend's rounding (bf16 KV, hi + lo GEMM inputs)
 *   moves router logits by about 1e-3, so a (token, layer) is compared when the CPU router's
 *   k-th and (k+1)-th logits differ by more than RW_ROUTE_TIE_TOL = 0.01 and no earlier layer of
 *   this or an earlier token was a near tie (past one, the GPU's hidden states may legitimately
 *   differ); the top-k sets are compared (the order inside the set too when its own gaps exceed
 *   the tolerance); at least 40% of all pairs must be compared (about 60% are on the fixtures);
 * - sharing invariance: n samples sharing their prompt's KV (full blocks shared, the partial one
 *   copied by ops->kv_copy on the device), a multi-turn conversation on the prefix cache, and a
 *   tiny KV budget (eviction, retraction, forks that fall back) give exactly the tokens,
 *   logprob bits and routes of the same requests run alone without sharing;
 * - score equals generate bit for bit, raw and processed. */
#include "cuda_emul.h"
#include "rollout_util.h"

#define RW_ROUTE_TIE_TOL 0.01
/* the backend under test (a CPU build of this file checks the test's own logic) */
#ifndef RW_ROLLOUT_BACKEND
#define RW_ROLLOUT_BACKEND RW_BACKEND_CUDA
#endif

static rw_engine *engine(rw_model *m, int budget, size_t kv_bytes) {
    rw_err err = {0};
    rw_engine_opts o = rw_engine_opts_default();
    o.max_batch_tokens = budget;
    o.kv_bytes = kv_bytes ? kv_bytes : (size_t)256 << 20;
    rw_engine *e;
    RW_ASSERT_OK(rw_engine_create(m, &o, &e, &err), &err);
    return e;
}

/* ------------------------------------------------------------------------------------------ */
static void routes_case(const char *fixture) {
    rw_reference *fx = rw_reference_load(fixture);
    const rw_config *cfg = &fx->cfg;
    const int L = cfg->num_layers, K = cfg->top_k, E = cfg->num_experts, V = cfg->vocab_size;
    rw_model *gpu = rw_test_load_model(cfg, RW_ROLLOUT_BACKEND, fx->dir);
    rw_model *cpu = rw_test_load_model(cfg, RW_BACKEND_CPU, fx->dir);
    rw_err err = {0};
    rw_engine *eg = engine(gpu, 2048, 0), *ec = engine(cpu, 2048, (size_t)64 << 20);
    rw_sampling sp = rw_sampling_default();
    sp.max_new_tokens = 16;
    rw_request_opts ro = {.routed_experts = true, .routing_weights = true};
    long checked = 0, pairs = 0, set_diff = 0;
    for (int i = 0; i < fx->nprompt; i++) {
        RW_ASSERT_OK(rw_engine_add_ex(eg, 1, fx->prompt[i], fx->plen[i], &sp, &ro, &err), &err);
        RW_ASSERT_OK(rw_engine_run(eg, &err), &err);
        rw_output *g = rw_engine_pop_output(eg);
        const int P = fx->plen[i], N = P + g->n;
        assert_int_equal(g->n_routed, N);
        int32_t *seq = malloc(sizeof(int32_t) * (size_t)N);
        memcpy(seq, fx->prompt[i], sizeof(int32_t) * (size_t)P);
        memcpy(seq + P, g->tokens, sizeof(int32_t) * (size_t)g->n);
        /* the CPU backend's routes of the same tokens (a score), and the reference router
         * logits for the gaps */
        rw_request_opts so = ro;
        so.n_score = g->n;
        RW_ASSERT_OK(rw_engine_add_ex(ec, 2, seq, N, &sp, &so, &err), &err);
        RW_ASSERT_OK(rw_engine_run(ec, &err), &err);
        rw_output *c = rw_engine_pop_output(ec);
        assert_int_equal(c->n_routed, N);
        float *lg = malloc(sizeof(float) * (size_t)N * V);
        float *rl = malloc(sizeof(float) * (size_t)L * N * E);
        RW_ASSERT_OK(rw_cuda_emul_score(rw_model_wset(cpu), seq, N, 0, lg, NULL, rl, &err), &err);
        int first_tie = N; /* tokens at or after it are past a near tie of an earlier layer */
        for (int l = 0; l < L; l++) {
            int tie_here = N;
            for (int t = 0; t < N; t++) {
                pairs++;
                const float *lt = rl + ((size_t)l * N + t) * E;
                const uint16_t *gi = g->routed_ids + ((size_t)t * L + l) * K;
                const uint16_t *ci = c->routed_ids + ((size_t)t * L + l) * K;
                /* the gaps of the CPU's choice: k-th to (k+1)-th, and inside the set */
                double kth = 1e30, next = -1e30, inner = 1e30;
                for (int j = 0; j < K; j++) {
                    kth = fmin(kth, lt[ci[j]]);
                    if (j) inner = fmin(inner, lt[ci[j - 1]] - lt[ci[j]]);
                }
                for (int x = 0; x < E; x++) {
                    bool in = false;
                    for (int j = 0; j < K; j++)
                        in |= ci[j] == x;
                    if (!in) next = fmax(next, lt[x]);
                }
                const bool tie = K < E && kth - next <= RW_ROUTE_TIE_TOL;
                if (tie && t < tie_here) tie_here = t;
                if (tie || t >= first_tie) continue;
                checked++;
                for (int j = 0; j < K; j++) {
                    bool in = false;
                    for (int q = 0; q < K; q++)
                        in |= gi[q] == ci[j];
                    if (!in) {
                        set_diff++;
                        fail_msg("%s prompt %d token %d layer %d: the GPU's top-%d lacks expert "
                                 "%d of the CPU's (gap to the next %.4f)",
                                 fixture, i, t, l, K, ci[j], kth - next);
                    }
                    if (inner > RW_ROUTE_TIE_TOL && gi[j] != ci[j])
                        fail_msg("%s prompt %d token %d layer %d: order %d: GPU %d, CPU %d",
                                 fixture, i, t, l, j, gi[j], ci[j]);
                }
            }
            if (tie_here < first_tie) first_tie = tie_here;
        }
        free(lg);
        free(rl);
        free(seq);
        rw_output_free(g);
        rw_output_free(c);
    }
    print_message("%s: GPU routes equal the CPU's at %ld of %ld (token, layer) pairs (the rest "
                  "within %.2g of a tie, or after one)\n",
                  fixture, checked, pairs, RW_ROUTE_TIE_TOL);
    assert_int_equal(set_diff, 0);
    assert_true(checked * 5 >= pairs * 2);
    rw_engine_destroy(eg);
    rw_engine_destroy(ec);
    rw_model_destroy(gpu);
    rw_model_destroy(cpu);
    rw_reference_free(fx);
}

static void test_routes_vs_cpu(void **state) {
    (void)state;
    routes_case(RW_TEST_FIXTURE);
    routes_case("tests/fixtures/qwen3-moe-hd128");
}

/* ------------------------------------------------------------------------------------------ */
static void samples_vs_alone(rw_model *m, const int32_t *prompt, int P, int nsamp,
                             const rw_sampling *sp, const rw_request_opts *ro, int budget,
                             size_t kv, const char *what) {
    rw_err err = {0};
    rw_engine *e = engine(m, budget, kv);
    rw_request_opts r = *ro;
    r.n_samples = nsamp;
    RW_ASSERT_OK(rw_engine_add_ex(e, 100, prompt, P, sp, &r, &err), &err);
    RW_ASSERT_OK(rw_engine_run(e, &err), &err);
    rw_engine_stats st;
    rw_engine_stats_get(e, &st);
    rw_output *o;
    int got = 0;
    while ((o = rw_engine_pop_output(e))) {
        rw_sampling s = *sp;
        s.seed += o->id - 100;
        rw_output *ref = rw_run_alone(m, prompt, P, &s, ro);
        char w[128];
        snprintf(w, sizeof w, "%s: sample %d", what, (int)(o->id - 100));
        rw_out_same(o, ref, w);
        rw_output_free(ref);
        rw_output_free(o);
        got++;
    }
    assert_int_equal(got, nsamp);
    print_message("%s: %d samples exact (%lld forked, %lld prefill tokens)\n", what, nsamp,
                  (long long)st.forked_samples, (long long)st.prompt_tokens);
    rw_engine_destroy(e);
}

static void test_sharing_invariance(void **state) {
    (void)state;
    rw_reference *fx = rw_reference_load("tests/fixtures/qwen3-moe-hd128");
    rw_model *m = rw_test_load_model(&fx->cfg, RW_ROLLOUT_BACKEND, fx->dir);
    const int V = fx->cfg.vocab_size;
    rw_err err = {0};
    rw_sampling sp = rw_sampling_default();
    sp.max_new_tokens = 24;
    sp.temperature = 1.0f;
    sp.seed = 77;
    rw_request_opts routes = {.routed_experts = true, .routing_weights = true}, none = {0};
    const int P = fx->plen[2]; /* 300 tokens: 18 full blocks and a partial one */
    samples_vs_alone(m, fx->prompt[2], P, 8, &sp, &routes, 2048, 0, "n samples, routes");
    samples_vs_alone(m, fx->prompt[2], 288, 4, &sp, &none, 100, 0, "block-aligned, chunked");
    /* a tiny KV cache: forks fall back to the prefix cache, retraction, eviction */
    const size_t bb = rw_block_bytes(m, 16);
    samples_vs_alone(m, fx->prompt[2], P, 6, &sp, &none, 64, 22 * bb, "tiny KV budget");

    /* multi-turn on the prefix cache */
    rw_engine *e = engine(m, 256, 0);
    int32_t conv[1200];
    int len = P;
    memcpy(conv, fx->prompt[2], sizeof(int32_t) * (size_t)P);
    for (int k = 0; k < 4; k++) {
        rw_sampling s = sp;
        s.seed = 500 + (uint64_t)k;
        s.temperature = k % 2 ? 1.0f : 0.0f;
        RW_ASSERT_OK(rw_engine_add_ex(e, (uint64_t)k, conv, len, &s, &routes, &err), &err);
        RW_ASSERT_OK(rw_engine_run(e, &err), &err);
        rw_output *o = rw_engine_pop_output(e);
        rw_output *ref = rw_run_alone(m, conv, len, &s, &routes);
        char w[64];
        snprintf(w, sizeof w, "turn %d", k);
        rw_out_same(o, ref, w);
        if (k) assert_true(o->n_reused > 0);
        /* score of the turn's output: the same bits, raw or processed */
        memcpy(conv + len, o->tokens, sizeof(int32_t) * (size_t)o->n);
        for (int mode = 0; mode < 2; mode++) {
            rw_sampling q = s;
            q.logprob_mode = mode;
            rw_output *gen = mode ? rw_run_alone(m, conv, len, &q, &routes) : NULL;
            const rw_output *want = mode ? gen : o;
            rw_request_opts so = routes;
            so.n_score = want->n;
            memcpy(conv + len, want->tokens, sizeof(int32_t) * (size_t)want->n);
            RW_ASSERT_OK(
                rw_engine_add_ex(e, 1000 + (uint64_t)k, conv, len + want->n, &q, &so, &err), &err);
            RW_ASSERT_OK(rw_engine_run(e, &err), &err);
            rw_output *sc = rw_engine_pop_output(e);
            snprintf(w, sizeof w, "turn %d score (%s)", k, mode ? "processed" : "raw");
            rw_out_same(sc, want, w);
            rw_output_free(sc);
            rw_output_free(gen);
        }
        memcpy(conv + len, o->tokens, sizeof(int32_t) * (size_t)o->n);
        len += o->n;
        int32_t more[40];
        rw_random_prompt(more, 40, V, 900 + (uint64_t)k);
        memcpy(conv + len, more, sizeof more);
        len += 40;
        rw_output_free(o);
        rw_output_free(ref);
    }
    rw_engine_stats st;
    rw_engine_stats_get(e, &st);
    print_message("4 turns and their scores exact on the prefix cache: %lld hits, %lld tokens "
                  "reused\n",
                  (long long)st.prefix_hits, (long long)st.prefix_tokens_saved);
    rw_engine_destroy(e);
    rw_model_destroy(m);
    rw_reference_free(fx);
}

int main(void) {
    if (RW_ROLLOUT_BACKEND == RW_BACKEND_CUDA) rw_test_require_gpu(1);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_routes_vs_cpu),
        cmocka_unit_test(test_sharing_invariance),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
