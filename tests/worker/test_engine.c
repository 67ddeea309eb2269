/* test_engine.c - the generation engine on the CPU backend with the fixture model:
 * - continuous batching: 64 requests of mixed prompt lengths and sampling settings, arriving over
 *   time into a small token budget (chunked prefill) and a small KV cache (admission waits and
 *   retraction), produce exactly the tokens, logprobs and top logprobs each produces alone;
 * - pause / resume in every mode, KV release / resume, flush refusal, abort, stop ids, weight
 *   version spans, request validation. */
#include <math.h>

#include "rollout_util.h"

typedef rw_fixture_model ctx;

/* The batched output must reproduce the one alone. */
static void same_output(const rw_output *a, const rw_output *b, int i) {
    char what[48];
    snprintf(what, sizeof what, "request %d (batched vs alone)", i);
    rw_out_same(a, b, what);
}

static rw_output *run_alone(rw_model *m, const rw_req_spec *s, rw_err *err) {
    rw_engine *e = NULL;
    rw_engine_opts o = rw_engine_opts_default();
    if (rw_engine_create(m, &o, &e, err) != RW_OK) return NULL;
    rw_output *out = NULL;
    if (rw_engine_add(e, 1, s->prompt, s->n, &s->sp, err) == RW_OK &&
        rw_engine_run(e, err) == RW_OK)
        out = rw_engine_pop_output(e);
    rw_engine_destroy(e);
    return out;
}

static void test_continuous_batching(void **state) {
    ctx *c = *state;
    enum { N = 64 };
    static rw_req_spec s[N];
    rw_req_specs(s, N, c->cfg.vocab_size, 77, true);
    rw_output *alone[N];
    rw_err err = {0};
    int greedy = 0, sampled = 0, stopped = 0;
    for (int i = 0; i < N; i++) {
        alone[i] = run_alone(c->m, &s[i], &err);
        if (!alone[i]) fail_msg("request %d alone: %s", i, err.msg);
        if (s[i].sp.temperature > 0)
            sampled++;
        else
            greedy++;
        stopped += alone[i]->finish == RW_FINISH_STOP;
    }
    assert_true(greedy >= 16 && sampled >= 16);

    /* batched: 48 tokens per step (prompts of 60+ are chunked), 16 running, KV for 40 blocks of
     * 16 tokens (640 tokens, less than the running set needs: admission waits and decodes
     * retract the newest requests) */
    rw_engine_opts o = rw_engine_opts_default();
    o.max_batch_tokens = 48;
    o.max_running = 16;
    o.kv_block_size = 16;
    rw_engine *probe;
    RW_ASSERT_OK(rw_engine_create(c->m, &o, &probe, &err), &err);
    rw_engine_stats st;
    rw_engine_stats_get(probe, &st);
    const size_t block_bytes = st.kv_bytes / (size_t)st.kv_blocks_total;
    rw_engine_destroy(probe);
    o.kv_bytes = 40 * block_bytes;
    rw_engine *e;
    RW_ASSERT_OK(rw_engine_create(c->m, &o, &e, &err), &err);
    rw_engine_stats_get(e, &st);
    assert_int_equal(st.kv_blocks_total, 40);
    rw_output *batched[N] = {0};
    int added = 0, done = 0, max_running = 0;
    int64_t max_used = 0;
    double wall = 0; /* seconds inside rw_engine_step */
    for (int step = 0; done < N; step++) {
        for (int i = 0; i < N; i++)
            if (s[i].arrive == step) {
                RW_ASSERT_OK(rw_engine_add(e, (uint64_t)i, s[i].prompt, s[i].n, &s[i].sp, &err),
                             &err);
                added++;
            }
        const double t0 = rw_now();
        RW_ASSERT_OK(rw_engine_step(e, &err), &err);
        wall += rw_now() - t0;
        rw_engine_stats_get(e, &st);
        if (st.running > max_running) max_running = st.running;
        if (st.kv_blocks_used > max_used) max_used = st.kv_blocks_used;
        assert_true(st.kv_blocks_used <= 40);
        rw_output *out;
        while ((out = rw_engine_pop_output(e))) {
            assert_true(out->id < N);
            assert_null(batched[out->id]);
            batched[out->id] = out;
            done++;
        }
        if (step > 100000) fail_msg("no progress: %d of %d done", done, N);
    }
    assert_int_equal(added, N);
    for (int i = 0; i < N; i++)
        same_output(batched[i], alone[i], i);
    rw_engine_stats_get(e, &st);
    print_message("64 requests: %d greedy, %d sampled, %d stopped early; %lld steps, max running "
                  "%d, max KV blocks %lld of 40, %lld retractions\n",
                  greedy, sampled, stopped, (long long)st.steps, max_running, (long long)max_used,
                  (long long)st.preemptions);
    /* the test must have exercised batching and KV pressure */
    assert_true(max_running >= 8);
    assert_true(st.preemptions > 0);
    assert_int_equal(st.kv_blocks_used, 0);
    /* the time split: inside the calls' wall time, the model's share inside the steps' */
    assert_true(st.model_s > 0 && st.model_s <= st.step_s && st.step_s <= wall);
    print_message("steps %.3f s, of which model %.3f s, engine %.3f s\n", st.step_s, st.model_s,
                  st.step_s - st.model_s);
    for (int i = 0; i < N; i++) {
        rw_output_free(alone[i]);
        rw_output_free(batched[i]);
    }
    rw_engine_destroy(e);
}

static const rw_req_spec *one_spec(void) {
    static rw_req_spec s;
    memset(&s, 0, sizeof s);
    s.n = 20;
    for (int j = 0; j < s.n; j++)
        s.prompt[j] = (int32_t)((j * 37 + 11) % 512);
    s.sp = rw_sampling_default();
    s.sp.max_new_tokens = 20;
    s.sp.temperature = 0.8f;
    s.sp.seed = 99;
    return &s;
}

static void test_pause_modes(void **state) {
    ctx *c = *state;
    rw_err err = {0};
    const rw_req_spec *s = one_spec();
    rw_output *ref = run_alone(c->m, s, &err);
    assert_non_null(ref);
    for (int mode = 0; mode < 3; mode++) {
        rw_engine *e;
        RW_ASSERT_OK(rw_engine_create(c->m, NULL, &e, &err), &err);
        RW_ASSERT_OK(rw_engine_add(e, 5, s->prompt, s->n, &s->sp, &err), &err);
        for (int k = 0; k < 6; k++)
            RW_ASSERT_OK(rw_engine_step(e, &err), &err);
        const int before = rw_engine_progress(e, 5);
        assert_int_equal(before, 6); /* one prefill step then one token per step */
        RW_ASSERT_OK(rw_engine_pause(e, (rw_pause_mode)mode, &err), &err);
        assert_true(rw_engine_paused(e));
        rw_engine_stats st;
        rw_engine_stats_get(e, &st);
        if (mode == RW_PAUSE_ABORT) {
            rw_output *o = rw_engine_pop_output(e);
            assert_non_null(o);
            assert_int_equal(o->finish, RW_FINISH_ABORT);
            assert_int_equal(o->n, 6);
            rw_assert_bytes_equal(o->tokens, ref->tokens, sizeof(int32_t) * 6, "partial tokens");
            rw_output_free(o);
            assert_int_equal(st.running + st.waiting, 0);
            RW_ASSERT_OK(rw_engine_resume(e, &err), &err);
            assert_true(rw_engine_idle(e));
            rw_engine_destroy(e);
            continue;
        }
        RW_ASSERT_OK(rw_engine_step(e, &err), &err); /* paused: nothing happens */
        assert_int_equal(rw_engine_progress(e, 5), before);
        if (mode == RW_PAUSE_RETRACT) {
            assert_int_equal(st.running, 0);
            assert_int_equal(st.waiting, 1);
            assert_int_equal(st.kv_blocks_used, 0);
            RW_ASSERT_OK(rw_engine_flush_cache(e, &err), &err);
            RW_ASSERT_OK(rw_engine_release_kv(e, &err), &err);
            rw_engine_stats_get(e, &st);
            assert_true(st.kv_released);
            RW_ASSERT_OK(rw_engine_resume(e, &err), &err);
            RW_ASSERT_OK(rw_engine_step(e, &err), &err); /* released: nothing happens */
            assert_int_equal(rw_engine_progress(e, 5), before);
            RW_ASSERT_OK(rw_engine_resume_kv(e, &err), &err);
        } else {
            assert_int_equal(st.running, 1);
            assert_true(st.kv_blocks_used > 0);
            assert_int_equal(rw_engine_flush_cache(e, &err), RW_E_BUSY);
            assert_int_equal(rw_engine_release_kv(e, &err), RW_E_BUSY);
            RW_ASSERT_OK(rw_engine_resume(e, &err), &err);
        }
        RW_ASSERT_OK(rw_engine_run(e, &err), &err);
        rw_output *o = rw_engine_pop_output(e);
        assert_non_null(o);
        same_output(o, ref, mode);
        rw_output_free(o);
        rw_engine_destroy(e);
    }
    rw_output_free(ref);
}

static void test_abort_stop_versions(void **state) {
    ctx *c = *state;
    rw_err err = {0};
    rw_req_spec s = *one_spec();
    s.sp.temperature = 0.0f;
    rw_output *ref = run_alone(c->m, &s, &err);
    assert_non_null(ref);
    assert_int_equal(ref->n, 20);
    rw_engine *e;
    RW_ASSERT_OK(rw_engine_create(c->m, NULL, &e, &err), &err);
    /* abort: queued and running requests, partial output kept */
    RW_ASSERT_OK(rw_engine_add(e, 1, s.prompt, s.n, &s.sp, &err), &err);
    for (int k = 0; k < 4; k++)
        RW_ASSERT_OK(rw_engine_step(e, &err), &err);
    RW_ASSERT_OK(rw_engine_add(e, 2, s.prompt, s.n, &s.sp, &err), &err);
    RW_ASSERT_OK(rw_engine_abort(e, 1, &err), &err);
    RW_ASSERT_OK(rw_engine_abort(e, 2, &err), &err);
    assert_int_equal(rw_engine_abort(e, 1, &err), RW_E_NOT_FOUND);
    rw_output *o = rw_engine_pop_output(e);
    assert_int_equal(o->id, 1);
    assert_int_equal(o->finish, RW_FINISH_ABORT);
    assert_int_equal(o->n, 4);
    rw_assert_bytes_equal(o->tokens, ref->tokens, 16, "aborted prefix");
    rw_output_free(o);
    o = rw_engine_pop_output(e);
    assert_int_equal(o->id, 2);
    assert_int_equal(o->n, 0);
    rw_output_free(o);
    rw_engine_stats st;
    rw_engine_stats_get(e, &st);
    assert_int_equal(st.kv_blocks_used, 0);
    /* stop ids: the first token that did not occur earlier in the greedy output */
    int j = 3;
    for (;; j++) {
        bool seen = false;
        for (int q = 0; q < j; q++)
            seen |= ref->tokens[q] == ref->tokens[j];
        if (!seen) break;
    }
    assert_true(j < 20);
    rw_req_spec t = s;
    t.sp.n_stop = 2;
    t.sp.stop_ids[0] = 100000; /* never sampled */
    t.sp.stop_ids[1] = ref->tokens[j];
    RW_ASSERT_OK(rw_engine_add(e, 3, t.prompt, t.n, &t.sp, &err), &err);
    RW_ASSERT_OK(rw_engine_run(e, &err), &err);
    o = rw_engine_pop_output(e);
    assert_int_equal(o->finish, RW_FINISH_STOP);
    assert_int_equal(o->n, j + 1);
    rw_output_free(o);
    /* weight versions: tokens 0..2 under version 7, the rest under 8 */
    rw_engine_set_weight_version(e, 7);
    RW_ASSERT_OK(rw_engine_add(e, 4, s.prompt, s.n, &s.sp, &err), &err);
    while (rw_engine_progress(e, 4) < 3)
        RW_ASSERT_OK(rw_engine_step(e, &err), &err);
    rw_engine_set_weight_version(e, 8);
    RW_ASSERT_OK(rw_engine_run(e, &err), &err);
    o = rw_engine_pop_output(e);
    assert_int_equal(o->n_spans, 2);
    assert_int_equal(o->spans[0].version, 7);
    assert_int_equal(o->spans[0].begin, 0);
    assert_int_equal(o->spans[0].end, 3);
    assert_int_equal(o->spans[1].version, 8);
    assert_int_equal(o->spans[1].begin, 3);
    assert_int_equal(o->spans[1].end, 20);
    same_output(o, ref, 4);
    rw_output_free(o);
    rw_engine_stats_get(e, &st);
    assert_int_equal(st.weight_version, 8);
    assert_true(st.generated_tokens >= 20 + 4 + j + 1);
    rw_engine_destroy(e);
    rw_output_free(ref);
}

static void test_add_validation(void **state) {
    ctx *c = *state;
    rw_err err = {0};
    rw_engine *e;
    rw_engine_opts o = rw_engine_opts_default();
    o.max_seq_len = 100;
    RW_ASSERT_OK(rw_engine_create(c->m, &o, &e, &err), &err);
    rw_sampling sp = rw_sampling_default();
    int32_t p[3] = {1, 2, 3};
    RW_ASSERT_OK(rw_engine_add(e, 1, p, 3, &sp, &err), &err);
    assert_int_equal(rw_engine_add(e, 1, p, 3, &sp, &err), RW_E_INVALID_ARG);
    assert_non_null(strstr(err.msg, "already exists"));
    int32_t bad[2] = {1, 512};
    assert_int_equal(rw_engine_add(e, 2, bad, 2, &sp, &err), RW_E_RANGE);
    assert_non_null(strstr(err.msg, "512"));
    sp.max_new_tokens = 98;
    assert_int_equal(rw_engine_add(e, 3, p, 3, &sp, &err), RW_E_RANGE);
    assert_non_null(strstr(err.msg, "max_seq_len"));
    sp.max_new_tokens = 4;
    sp.top_p = 0.0f;
    assert_int_equal(rw_engine_add(e, 4, p, 3, &sp, &err), RW_E_INVALID_ARG);
    sp.top_p = 1.0f;
    sp.top_logprobs = RW_MAX_TOP_LOGPROBS + 1;
    assert_int_equal(rw_engine_add(e, 5, p, 3, &sp, &err), RW_E_INVALID_ARG);
    assert_int_equal(rw_engine_add(e, 6, p, 0, &sp, &err), RW_E_INVALID_ARG);
    assert_int_equal(rw_engine_pause(e, (rw_pause_mode)9, &err), RW_E_INVALID_ARG);
    rw_engine_destroy(e);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_add_validation),
        cmocka_unit_test(test_abort_stop_versions),
        cmocka_unit_test(test_pause_modes),
        cmocka_unit_test(test_continuous_batching),
    };
    return cmocka_run_group_tests(tests, rw_fixture_model_setup, rw_fixture_model_teardown);
}
