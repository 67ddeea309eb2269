/* test_routes.c - routed-expert export on the CPU backend with the fixture model:
 * - for every fixture prompt and the tokens generated from it, the exported ids (and weights)
 *   of every token and layer equal the top-k of the reference router (tests/common/cuda_emul.h
 *   with no rounding: an independent fp32 forward with double-accumulated GEMMs, its router
 *   logits through rw_moe_route_ref); every prompt and generated token has its row;
 * - routes are the same bits whether the KV came from a sibling sample, the prefix cache (stored
 *   with the blocks) or was computed; a cached prefix without stored routes is recomputed for a
 *   request that wants them; score requests report the same routes as generation. */
#include "cuda_emul.h"
#include "rollout_util.h"

typedef struct ctx {
    rw_reference *fx;
    rw_model *m;
} ctx;

static int setup(void **state) {
    ctx *c = calloc(1, sizeof *c);
    c->fx = rw_reference_load(RW_TEST_FIXTURE);
    c->m = rw_test_load_model(&c->fx->cfg, RW_BACKEND_CPU, c->fx->dir);
    *state = c;
    return 0;
}

static int teardown(void **state) {
    ctx *c = *state;
    rw_model_destroy(c->m);
    rw_reference_free(c->fx);
    free(c);
    return 0;
}

static void test_routes_vs_reference(void **state) {
    ctx *c = *state;
    const rw_config *cfg = &c->fx->cfg;
    const int L = cfg->num_layers, K = cfg->top_k, E = cfg->num_experts, V = cfg->vocab_size;
    rw_err err = {0};
    rw_engine *e;
    RW_ASSERT_OK(rw_engine_create(c->m, NULL, &e, &err), &err);
    rw_sampling sp = rw_sampling_default();
    sp.max_new_tokens = 9;
    sp.temperature = 0.9f;
    sp.seed = 3;
    rw_request_opts ro = {.routed_experts = true, .routing_weights = true};
    for (int i = 0; i < c->fx->nprompt; i++)
        RW_ASSERT_OK(
            rw_engine_add_ex(e, (uint64_t)i, c->fx->prompt[i], c->fx->plen[i], &sp, &ro, &err),
            &err);
    RW_ASSERT_OK(rw_engine_run(e, &err), &err);
    int checked = 0, min_gap_bad = 0;
    double min_gap = 1e30, worst_w = 0;
    rw_output *o;
    while ((o = rw_engine_pop_output(e))) {
        const int i = (int)o->id, P = c->fx->plen[i], N = P + o->n;
        assert_int_equal(o->n_routed, N);
        assert_int_equal(o->route_layers, L);
        assert_int_equal(o->route_k, K);
        assert_non_null(o->routed_weights);
        int32_t *seq = malloc(sizeof(int32_t) * (size_t)N);
        memcpy(seq, c->fx->prompt[i], sizeof(int32_t) * (size_t)P);
        memcpy(seq + P, o->tokens, sizeof(int32_t) * (size_t)o->n);
        float *lg = malloc(sizeof(float) * (size_t)N * V);
        int32_t *rid = malloc(sizeof(int32_t) * (size_t)L * N * K);
        float *rl = malloc(sizeof(float) * (size_t)L * N * E);
        int32_t *ids = malloc(sizeof(int32_t) * (size_t)K);
        float *w = malloc(sizeof(float) * (size_t)K);
        RW_ASSERT_OK(rw_cuda_emul_score(rw_model_wset(c->m), seq, N, 0, lg, rid, rl, &err), &err);
        for (int t = 0; t < N; t++)
            for (int l = 0; l < L; l++) {
                const float *lt = rl + ((size_t)l * N + t) * E;
                rw_moe_route_ref(lt, 1, E, K, cfg->norm_topk_prob, ids, w);
                /* the gap between the k-th and the (k+1)-th logit: how close to a tie */
                double kth = 1e30, next = -1e30;
                for (int j = 0; j < K; j++)
                    kth = fmin(kth, lt[ids[j]]);
                for (int x = 0; x < E; x++) {
                    bool in = false;
                    for (int j = 0; j < K; j++)
                        in |= ids[j] == x;
                    if (!in) next = fmax(next, lt[x]);
                }
                if (K < E) min_gap = fmin(min_gap, kth - next);
                const uint16_t *got = o->routed_ids + ((size_t)t * L + l) * K;
                const float *gw = o->routed_weights + ((size_t)t * L + l) * K;
                for (int j = 0; j < K; j++) {
                    if (got[j] != ids[j] || ids[j] != rid[((size_t)l * N + t) * K + j])
                        fail_msg("prompt %d token %d layer %d: expert %d of the top-%d is %d, "
                                 "reference %d (gap to the next %.3g)",
                                 i, t, l, j, K, got[j], ids[j], kth - next);
                    worst_w = fmax(worst_w, fabs(gw[j] - w[j]));
                }
                min_gap_bad += kth - next < 1e-5;
                checked++;
            }
        free(seq);
        free(lg);
        free(rid);
        free(rl);
        free(ids);
        free(w);
        rw_output_free(o);
    }
    print_message("routed experts: %d (token, layer) pairs equal to the reference; smallest "
                  "k-th / (k+1)-th logit gap %.3g; max |weight error| %.3g\n",
                  checked, min_gap, worst_w);
    assert_true(worst_w < 1e-5);
    assert_true(checked > 100);
    rw_engine_destroy(e);
}

/* ------------------------------------------------------------------------------------------ */
static void test_routes_reused(void **state) {
    ctx *c = *state;
    const int V = c->fx->cfg.vocab_size;
    rw_err err = {0};
    int32_t conv[300];
    const int P = 45;
    rw_random_prompt(conv, P, V, 71);
    rw_sampling sp = rw_sampling_default();
    sp.max_new_tokens = 8;
    sp.temperature = 1.0f;
    sp.seed = 50;
    rw_request_opts ro = {.routed_experts = true, .routing_weights = true, .n_samples = 4};
    rw_engine *e;
    RW_ASSERT_OK(rw_engine_create(c->m, NULL, &e, &err), &err);
    /* a first request without routes caches the prompt's blocks without them */
    RW_ASSERT_OK(rw_engine_add(e, 900, conv, P, &sp, &err), &err);
    RW_ASSERT_OK(rw_engine_run(e, &err), &err);
    rw_output_free(rw_engine_pop_output(e));
    /* 4 samples with routes: the first recomputes the prompt (no routes in the cache), the
     * others fork from it */
    RW_ASSERT_OK(rw_engine_add_ex(e, 10, conv, P, &sp, &ro, &err), &err);
    RW_ASSERT_OK(rw_engine_run(e, &err), &err);
    rw_output *first = NULL;
    for (int k = 0; k < 4; k++) {
        rw_output *o = rw_engine_pop_output(e);
        rw_sampling s = sp;
        s.seed += o->id - 10;
        rw_output *ref = rw_run_alone(
            c->m, conv, P, &s, &(rw_request_opts){.routed_experts = true, .routing_weights = true});
        assert_int_equal(o->n_routed, P + o->n);
        rw_out_same(o, ref, o->id == 10 ? "first sample" : "forked sample");
        if (o->id == 10) {
            assert_int_equal(o->n_reused, 0); /* the cached blocks carried no routes */
            first = o;
        } else {
            assert_int_equal(o->n_reused, P);
            rw_output_free(o);
        }
        rw_output_free(ref);
    }
    /* the next turn reuses the first sample's blocks with their routes */
    int len = P;
    memcpy(conv + len, first->tokens, sizeof(int32_t) * (size_t)first->n);
    len += first->n;
    rw_random_prompt(conv + len, 20, V, 72);
    len += 20;
    ro.n_samples = 1;
    RW_ASSERT_OK(rw_engine_add_ex(e, 20, conv, len, &sp, &ro, &err), &err);
    RW_ASSERT_OK(rw_engine_run(e, &err), &err);
    rw_output *t2 = rw_engine_pop_output(e);
    assert_true(t2->n_reused >= 48);
    rw_output *ref = rw_run_alone(c->m, conv, len, &sp, &ro);
    rw_out_same(t2, ref, "second turn");
    /* scoring the same tokens reports the same routes (and logprobs) */
    const rw_request_opts so = {.n_score = t2->n, .routed_experts = true, .routing_weights = true};
    memcpy(conv + len, t2->tokens, sizeof(int32_t) * (size_t)t2->n);
    RW_ASSERT_OK(rw_engine_add_ex(e, 30, conv, len + t2->n, &sp, &so, &err), &err);
    RW_ASSERT_OK(rw_engine_run(e, &err), &err);
    rw_output *sc = rw_engine_pop_output(e);
    assert_int_equal(sc->n_routed, len + t2->n);
    rw_out_same(sc, t2, "score vs generate");
    rw_output_free(sc);
    rw_output_free(t2);
    rw_output_free(ref);
    rw_output_free(first);
    rw_engine_destroy(e);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_routes_vs_reference),
        cmocka_unit_test(test_routes_reused),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
