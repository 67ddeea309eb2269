/* rollout_util.h - helpers of the rollout tests (prefix sharing, routed experts, scoring; CPU and
 * GPU suites): exact comparison of two outputs (tokens, logprob bits, top logprobs, routes), a
 * request run alone on a fresh engine without sharing, and a prompt made of seeded random ids.
 * Include after worker_util.h. */
#ifndef RW_TEST_ROLLOUT_UTIL_H
#define RW_TEST_ROLLOUT_UTIL_H

#include "worker_util.h"

/* A cmocka group's state: the tiny fixture's config, its directory and its model on the CPU
 * backend (rw_fixture_model_setup / _teardown). */
typedef struct rw_fixture_model {
    rw_config cfg;
    rw_model *m;
    char dir[1024];
} rw_fixture_model;

static inline int rw_fixture_model_setup(void **state) {
    rw_fixture_model *c = calloc(1, sizeof *c);
    char path[1100];
    rw_err err = {0};
    rw_test_path(c->dir, sizeof c->dir, RW_TEST_FIXTURE);
    snprintf(path, sizeof path, "%s/config.json", c->dir);
    RW_ASSERT_OK(rw_config_load(path, &c->cfg, &err), &err);
    c->m = rw_test_load_model(&c->cfg, RW_BACKEND_CPU, c->dir);
    *state = c;
    return 0;
}

static inline int rw_fixture_model_teardown(void **state) {
    rw_fixture_model *c = *state;
    rw_model_destroy(c->m);
    rw_config_free(&c->cfg);
    free(c);
    return 0;
}

/* Fails unless b reproduces a: tokens, logprob bits, finish, top logprobs, and the routes (ids and
 * weights, bit for bit) when both recorded them. */
static inline void rw_out_same(const rw_output *a, const rw_output *b, const char *what) {
    if (a->n != b->n || a->finish != b->finish)
        fail_msg("%s: %d tokens (%s) vs %d (%s)", what, a->n, rw_finish_str(a->finish), b->n,
                 rw_finish_str(b->finish));
    for (int j = 0; j < a->n; j++)
        if (a->tokens[j] != b->tokens[j] || memcmp(&a->logprobs[j], &b->logprobs[j], 4) != 0)
            fail_msg("%s token %d: %d (%.9g) vs %d (%.9g)", what, j, a->tokens[j], a->logprobs[j],
                     b->tokens[j], b->logprobs[j]);
    assert_int_equal(a->top_n, b->top_n);
    if (a->top_n) {
        rw_assert_bytes_equal(a->top_ids, b->top_ids, sizeof(int32_t) * (size_t)(a->n * a->top_n),
                              "top ids");
        rw_assert_bytes_equal(a->top_logprobs, b->top_logprobs,
                              sizeof(float) * (size_t)(a->n * a->top_n), "top logprobs");
    }
    if (a->routed_ids && b->routed_ids) {
        if (a->n_routed != b->n_routed)
            fail_msg("%s: %d vs %d routed tokens", what, a->n_routed, b->n_routed);
        const size_t n = (size_t)a->n_routed * a->route_layers * a->route_k;
        rw_assert_bytes_equal(a->routed_ids, b->routed_ids, n * sizeof(uint16_t), "routed ids");
        if (a->routed_weights && b->routed_weights)
            rw_assert_bytes_equal(a->routed_weights, b->routed_weights, n * sizeof(float),
                                  "routing weights");
    }
}

/* The request alone on a fresh engine (default options but a 64 MiB KV cache, prefix sharing
 * off): the reference a shared, cached or batched run must reproduce. One output. */
static inline rw_output *rw_run_alone(rw_model *m, const int32_t *tokens, int n,
                                      const rw_sampling *sp, const rw_request_opts *ro) {
    rw_err err = {0};
    rw_engine_opts o = rw_engine_opts_default();
    o.prefix_sharing = false;
    o.kv_bytes = (size_t)64 << 20;
    rw_engine *e = NULL;
    RW_ASSERT_OK(rw_engine_create(m, &o, &e, &err), &err);
    rw_request_opts one = ro ? *ro : (rw_request_opts){0};
    one.n_samples = 1;
    RW_ASSERT_OK(rw_engine_add_ex(e, 1, tokens, n, sp, &one, &err), &err);
    RW_ASSERT_OK(rw_engine_run(e, &err), &err);
    rw_output *out = rw_engine_pop_output(e);
    assert_non_null(out);
    rw_engine_destroy(e);
    return out;
}

/* n seeded random token ids in [0, V). */
static inline void rw_random_prompt(int32_t *p, int n, int V, uint64_t seed) {
    rw_rng r;
    rw_rng_seed(&r, seed);
    for (int i = 0; i < n; i++)
        p[i] = (int32_t)(rw_rng_u64(&r) % (uint64_t)V);
}

/* Bytes of one KV block of an engine on m (block size bs). */
static inline size_t rw_block_bytes(rw_model *m, int bs) {
    rw_err err = {0};
    rw_engine_opts o = rw_engine_opts_default();
    o.kv_block_size = bs;
    o.kv_bytes = (size_t)64 << 20;
    rw_engine *e = NULL;
    RW_ASSERT_OK(rw_engine_create(m, &o, &e, &err), &err);
    rw_engine_stats st;
    rw_engine_stats_get(e, &st);
    rw_engine_destroy(e);
    return st.kv_bytes / (size_t)st.kv_blocks_total;
}

#endif
