/* test_daemon.c - every control command of rw-worker over a real loopback socket, against a
 * worker process on the CPU backend serving the tiny fixture: generate (reference tokens, batched,
 * many in flight, streaming, sampling options), abort, pause in each mode with requests in flight,
 * resume, flush_cache, release / resume memory, readback and checksums, bad input, auth,
 * shutdown and SIGTERM with requests in flight. */
#include <math.h>
#include <zmq.h>

#include "daemon_util.h"

#define LONG_TOKENS 400 /* a request long enough to be caught in flight (prompt 0 + 400 < 512) */

typedef struct st {
    dt_worker w;
    rw_client *c;
    dt_ref ref;
    int32_t uninterrupted[LONG_TOKENS]; /* greedy tokens of prompt 0, never paused */
    char p0[512];                       /* prompt 0 as JSON */
} st;

static int setup(void **state) {
    st *s = calloc(1, sizeof *s);
    dt_ref_load(&s->ref);
    char model[4096];
    rw_test_path(model, sizeof model, RW_TEST_FIXTURE);
    const char *args[] = {"--model",           model, "--device", "cpu", "--control",
                          "tcp://127.0.0.1:*", NULL};
    dt_start(&s->w, args);
    s->c = dt_connect(&s->w);
    dt_prompt_json(s->ref.prompt[0], s->ref.n_prompt[0], s->p0, sizeof s->p0);
    char a[1024];
    snprintf(a, sizeof a, "{\"prompt\":%s,\"max_new_tokens\":%d}", s->p0, LONG_TOKENS);
    json_t *r = dt_ok(s->c, "generate", a);
    assert_int_equal(
        dt_ints(json_object_get(dt_output(r, 0), "tokens"), s->uninterrupted, LONG_TOKENS),
        LONG_TOKENS);
    json_decref(r);
    *state = s;
    return 0;
}

static int teardown(void **state) {
    st *s = *state;
    dt_shutdown(&s->w, s->c, 30);
    free(s);
    return 0;
}

/* ------------------------------------------------------------------------------------------ */
static void test_health_stats(void **state) {
    st *s = *state;
    json_t *h = dt_ok(s->c, "health", NULL);
    assert_string_equal(dt_str(h, "status", NULL), "ok");
    assert_string_equal(dt_str(h, "state", NULL), "serving");
    assert_int_equal(dt_int(h, "tp", NULL), 1);
    assert_string_equal(dt_str(h, "device", NULL), "cpu");
    assert_string_equal(dt_str(h, "precision", NULL), "standard");
    assert_non_null(strstr(dt_str(h, "version", NULL), "qwen3-moe-tiny"));
    json_decref(h);
    json_t *t = dt_ok(s->c, "stats", NULL);
    assert_int_equal(dt_int(t, "queue", "running"), 0);
    assert_true(dt_int(t, "throughput", "generated_tokens") >= LONG_TOKENS);
    /* the steps' wall time and the model's share of it (the rest is the engine's own work) */
    const double step_s = dt_real(t, "throughput", "step_seconds");
    const double model_s = dt_real(t, "throughput", "model_seconds");
    assert_true(model_s > 0 && model_s <= step_s);
    assert_true(step_s <= dt_real(t, "uptime_s", NULL));
    assert_true(dt_int(t, "memory", "weights_bytes") > 2000000);
    assert_true(dt_int(t, "memory", "kv_blocks_total") > 0);
    assert_string_equal(dt_str(t, "weights", "state"), "ready");
    json_decref(t);
    /* unknown arguments are refused by name */
    char msg[512];
    dt_refused(s->c, "stats", "{\"verbose\":true}", RW_E_PROTOCOL, msg, sizeof msg);
    assert_non_null(strstr(msg, "verbose"));
}

/* Each reference prompt alone reproduces the transformers greedy tokens and logprobs. */
static void test_generate_reference(void **state) {
    st *s = *state;
    for (int i = 0; i < DT_NREF; i++) {
        char p[1024], a[1200];
        dt_prompt_json(s->ref.prompt[i], s->ref.n_prompt[i], p, sizeof p);
        snprintf(a, sizeof a, "{\"prompt\":%s,\"max_new_tokens\":%d}", p, DT_REF_TOKENS);
        json_t *r = dt_ok(s->c, "generate", a);
        json_t *o = dt_output(r, 0);
        dt_assert_greedy(&s->ref, i, o, DT_REF_TOKENS);
        assert_string_equal(dt_str(o, "finish", NULL), "length");
        assert_int_equal(dt_int(o, "prompt_tokens", NULL), s->ref.n_prompt[i]);
        json_t *lp = json_object_get(o, "logprobs");
        assert_int_equal(json_array_size(lp), DT_REF_TOKENS);
        for (int j = 0; j < DT_REF_TOKENS; j++) {
            double d = json_real_value(json_array_get(lp, j));
            if (fabs(d - s->ref.greedy_lp[i][j]) > 2e-3)
                fail_msg("prompt %d token %d: logprob %g, reference %g", i, j, d,
                         s->ref.greedy_lp[i][j]);
        }
        /* one version span over every token */
        json_t *sp = json_object_get(o, "version_spans");
        assert_int_equal(json_array_size(sp), 1);
        assert_int_equal(dt_int(json_array_get(sp, 0), "end", NULL), DT_REF_TOKENS);
        json_decref(r);
    }
}

/* All prompts in one command, each twice (n = 2, greedy): the same tokens as alone. */
static void test_generate_batched(void **state) {
    st *s = *state;
    char a[8192];
    size_t k = (size_t)snprintf(a, sizeof a, "{\"n\":2,\"max_new_tokens\":%d,\"prompts\":[",
                                DT_REF_TOKENS);
    for (int i = 0; i < DT_NREF; i++) {
        char p[1024];
        k += (size_t)snprintf(a + k, sizeof a - k, "%s%s", i ? "," : "",
                              dt_prompt_json(s->ref.prompt[i], s->ref.n_prompt[i], p, sizeof p));
    }
    snprintf(a + k, sizeof a - k, "]}");
    json_t *r = dt_ok(s->c, "generate", a);
    assert_int_equal(json_array_size(json_object_get(r, "outputs")), 2 * DT_NREF);
    for (int i = 0; i < 2 * DT_NREF; i++) {
        json_t *o = dt_output(r, (size_t)i);
        assert_int_equal(dt_int(o, "index", NULL), i);
        assert_int_equal(dt_int(o, "prompt_index", NULL), i / 2);
        assert_int_equal(dt_int(o, "sample", NULL), i % 2);
        dt_assert_greedy(&s->ref, i / 2, o, DT_REF_TOKENS);
    }
    json_decref(r);
}

/* Many commands in flight at once, answered by request id in any order. */
static void test_many_in_flight(void **state) {
    st *s = *state;
    uint64_t ids[2 * DT_NREF];
    for (int rep = 0; rep < 2; rep++)
        for (int i = 0; i < DT_NREF; i++) {
            char p[1024], a[1200];
            dt_prompt_json(s->ref.prompt[i], s->ref.n_prompt[i], p, sizeof p);
            snprintf(a, sizeof a, "{\"prompt\":%s,\"max_new_tokens\":%d}", p, DT_REF_TOKENS);
            ids[rep * DT_NREF + i] = dt_send(s->c, "generate", a);
        }
    /* the worker has them all before the first answer is read */
    for (int k = 2 * DT_NREF - 1; k >= 0; k--) {
        json_t *r = dt_wait_gen(s->c, ids[k], NULL);
        dt_assert_greedy(&s->ref, k % DT_NREF, dt_output(r, 0), DT_REF_TOKENS);
        json_decref(r);
    }
}

/* Streaming: partial replies carry consecutive slices of the final tokens. */
static void test_streaming(void **state) {
    st *s = *state;
    char p[1024], a[1200];
    dt_prompt_json(s->ref.prompt[1], s->ref.n_prompt[1], p, sizeof p);
    snprintf(a, sizeof a, "{\"prompts\":[%s,%s],\"max_new_tokens\":%d,\"stream\":true}", p, s->p0,
             DT_REF_TOKENS);
    uint64_t id = dt_send(s->c, "generate", a);
    json_t *parts = json_array();
    json_t *r = dt_wait_gen(s->c, id, parts);
    assert_true(json_array_size(parts) > 0);
    int32_t fin[2][DT_REF_TOKENS];
    for (int i = 0; i < 2; i++)
        assert_int_equal(
            dt_ints(json_object_get(dt_output(r, (size_t)i), "tokens"), fin[i], DT_REF_TOKENS),
            DT_REF_TOKENS);
    dt_assert_greedy(&s->ref, 1, dt_output(r, 0), DT_REF_TOKENS);
    dt_assert_greedy(&s->ref, 0, dt_output(r, 1), DT_REF_TOKENS);
    int streamed = 0;
    for (size_t k = 0; k < json_array_size(parts); k++) {
        json_t *outs = json_object_get(json_array_get(parts, k), "outputs");
        for (size_t j = 0; j < json_array_size(outs); j++) {
            json_t *o = json_array_get(outs, j);
            int idx = (int)dt_int(o, "index", NULL), off = (int)dt_int(o, "offset", NULL);
            assert_true(idx == 0 || idx == 1);
            int32_t t[DT_REF_TOKENS];
            int n = dt_ints(json_object_get(o, "tokens"), t, DT_REF_TOKENS);
            assert_true(n >= 1 && off + n <= DT_REF_TOKENS);
            assert_int_equal(json_array_size(json_object_get(o, "logprobs")), n);
            for (int q = 0; q < n; q++)
                assert_int_equal(t[q], fin[idx][off + q]);
            streamed += n;
        }
    }
    assert_true(streamed > 0);
    json_decref(parts);
    json_decref(r);
}

/* Stop ids, top logprobs, seeded sampling. */
static void test_sampling_options(void **state) {
    st *s = *state;
    /* stop: the first occurrence of the reference's 4th token ends generation there */
    const int32_t stop = s->ref.greedy[0][3];
    int first = 0;
    while (s->ref.greedy[0][first] != stop)
        first++;
    char a[1200];
    snprintf(a, sizeof a, "{\"prompt\":%s,\"max_new_tokens\":%d,\"stop\":[%d]}", s->p0,
             DT_REF_TOKENS, stop);
    json_t *r = dt_ok(s->c, "generate", a);
    dt_assert_greedy(&s->ref, 0, dt_output(r, 0), first + 1);
    assert_string_equal(dt_str(dt_output(r, 0), "finish", NULL), "stop");
    json_decref(r);
    /* top logprobs: sorted, and the greedy token is the best one */
    snprintf(a, sizeof a, "{\"prompt\":%s,\"max_new_tokens\":8,\"top_logprobs\":3}", s->p0);
    r = dt_ok(s->c, "generate", a);
    json_t *o = dt_output(r, 0);
    json_t *top = json_object_get(o, "top_logprobs");
    assert_int_equal(json_array_size(top), 8);
    for (int j = 0; j < 8; j++) {
        json_t *row = json_array_get(top, (size_t)j);
        assert_int_equal(json_array_size(row), 3);
        assert_int_equal(json_integer_value(json_array_get(json_array_get(row, 0), 0)),
                         s->ref.greedy[0][j]);
        double lp = json_real_value(json_array_get(json_object_get(o, "logprobs"), (size_t)j));
        assert_true(fabs(json_real_value(json_array_get(json_array_get(row, 0), 1)) - lp) < 1e-6);
        for (int q = 1; q < 3; q++)
            assert_true(json_real_value(json_array_get(json_array_get(row, q), 1)) <=
                        json_real_value(json_array_get(json_array_get(row, q - 1), 1)));
    }
    json_decref(r);
    /* sampling: deterministic from the seed; the n samples of a command use different seeds */
    snprintf(a, sizeof a,
             "{\"prompt\":%s,\"max_new_tokens\":16,\"temperature\":1.0,\"seed\":11,\"n\":3}",
             s->p0);
    json_t *r1 = dt_ok(s->c, "generate", a);
    json_t *r2 = dt_ok(s->c, "generate", a);
    int32_t t1[3][16], t2[3][16];
    for (int i = 0; i < 3; i++) {
        assert_int_equal(dt_ints(json_object_get(dt_output(r1, (size_t)i), "tokens"), t1[i], 16),
                         16);
        assert_int_equal(dt_ints(json_object_get(dt_output(r2, (size_t)i), "tokens"), t2[i], 16),
                         16);
        assert_memory_equal(t1[i], t2[i], sizeof t1[i]);
    }
    assert_true(memcmp(t1[0], t1[1], sizeof t1[0]) || memcmp(t1[1], t1[2], sizeof t1[1]));
    json_decref(r1);
    json_decref(r2);
    /* sampling parameters out of range are refused by name */
    char msg[512];
    snprintf(a, sizeof a, "{\"prompt\":%s,\"top_p\":1.5}", s->p0);
    dt_refused(s->c, "generate", a, RW_E_RANGE, msg, sizeof msg);
    assert_non_null(strstr(msg, "top_p"));
    snprintf(a, sizeof a, "{\"prompt\":%s,\"max_new_tokens\":600}", s->p0);
    dt_refused(s->c, "generate", a, RW_E_RANGE, msg, sizeof msg);
    assert_non_null(strstr(msg, "max_seq_len"));
}

/* ------------------------------------------------------------------------------------------ */
/* In-flight control                                                                            */
/* ------------------------------------------------------------------------------------------ */
/* Starts the long request (streaming) and returns once its first tokens were produced. */
static uint64_t start_long(st *s, json_t *parts) {
    char a[1200];
    snprintf(a, sizeof a, "{\"prompt\":%s,\"max_new_tokens\":%d,\"stream\":true}", s->p0,
             LONG_TOKENS);
    uint64_t id = dt_send(s->c, "generate", a);
    char *res = NULL;
    rw_err e;
    RW_ASSERT_OK(rw_client_wait_json(s->c, id, DT_TIMEOUT_MS, &res, NULL, NULL, &e), &e);
    json_error_t je;
    json_t *r = json_loads(res, 0, &je);
    rw_client_free(res);
    assert_true(json_is_true(json_object_get(r, "stream")));
    json_array_append_new(parts, r);
    return id;
}

/* The tokens of a final output equal the uninterrupted run's first n. */
static int assert_prefix(st *s, json_t *o) {
    int32_t t[LONG_TOKENS];
    int n = dt_ints(json_object_get(o, "tokens"), t, LONG_TOKENS);
    for (int j = 0; j < n; j++)
        if (t[j] != s->uninterrupted[j])
            fail_msg("token %d is %d, the uninterrupted run has %d", j, t[j], s->uninterrupted[j]);
    return n;
}

static int64_t gen_tokens_now(st *s) {
    json_t *t = dt_ok(s->c, "stats", NULL);
    int64_t n = dt_int(t, "throughput", "generated_tokens");
    json_decref(t);
    return n;
}

static void test_abort_one_and_all(void **state) {
    st *s = *state;
    json_t *parts = json_array();
    uint64_t id = start_long(s, parts);
    /* abort names the command by its request id */
    char a[64];
    snprintf(a, sizeof a, "{\"request_id\":%" PRIu64 "}", id);
    json_t *r = dt_ok(s->c, "abort", a);
    assert_int_equal(dt_int(r, "aborted", NULL), 1);
    json_decref(r);
    json_t *g = dt_wait_gen(s->c, id, NULL);
    json_t *o = dt_output(g, 0);
    assert_string_equal(dt_str(o, "finish", NULL), "abort");
    int n = assert_prefix(s, o);
    assert_true(n >= 1 && n < LONG_TOKENS);
    json_decref(g);
    /* nothing left to abort under that id */
    dt_refused(s->c, "abort", a, RW_E_NOT_FOUND, NULL, 0);
    /* abort all: two commands, three requests */
    uint64_t id1 = start_long(s, parts);
    char b[1200];
    snprintf(b, sizeof b, "{\"prompts\":[%s,%s],\"max_new_tokens\":%d}", s->p0, s->p0, LONG_TOKENS);
    uint64_t id2 = dt_send(s->c, "generate", b);
    r = dt_ok(s->c, "abort", "{\"all\":true}");
    assert_int_equal(dt_int(r, "aborted", NULL), 3);
    assert_int_equal(dt_int(r, "commands", NULL), 2);
    json_decref(r);
    g = dt_wait_gen(s->c, id1, NULL);
    assert_string_equal(dt_str(dt_output(g, 0), "finish", NULL), "abort");
    assert_prefix(s, dt_output(g, 0));
    json_decref(g);
    g = dt_wait_gen(s->c, id2, NULL);
    for (int i = 0; i < 2; i++) {
        assert_string_equal(dt_str(dt_output(g, (size_t)i), "finish", NULL), "abort");
        assert_prefix(s, dt_output(g, (size_t)i));
    }
    json_decref(g);
    dt_refused(s->c, "abort", "{}", RW_E_PROTOCOL, NULL, 0);
    json_decref(parts);
}

/* pause(abort): in-flight requests end with their partial tokens; new ones wait for resume. */
static void test_pause_abort(void **state) {
    st *s = *state;
    json_t *parts = json_array();
    uint64_t id = start_long(s, parts);
    json_t *p = dt_ok(s->c, "pause", "{\"mode\":\"abort\"}");
    assert_true(json_is_true(json_object_get(p, "paused")));
    assert_int_equal(dt_int(p, "aborted", NULL), 1);
    assert_int_equal(dt_int(p, "running", NULL), 0);
    json_decref(p);
    json_t *g = dt_wait_gen(s->c, id, NULL);
    assert_string_equal(dt_str(dt_output(g, 0), "finish", NULL), "abort");
    int n = assert_prefix(s, dt_output(g, 0));
    assert_true(n >= 1 && n < LONG_TOKENS);
    json_decref(g);
    /* while paused a new request is queued, not run */
    char a[1200];
    snprintf(a, sizeof a, "{\"prompt\":%s,\"max_new_tokens\":%d}", s->p0, DT_REF_TOKENS);
    uint64_t id2 = dt_send(s->c, "generate", a);
    int64_t before = gen_tokens_now(s);
    usleep(100000);
    json_t *t = dt_ok(s->c, "stats", NULL);
    assert_int_equal(dt_int(t, "queue", "waiting"), 1);
    assert_int_equal(dt_int(t, "throughput", "generated_tokens"), before);
    assert_string_equal(dt_str(t, "state", NULL), "paused");
    json_decref(t);
    json_decref(dt_ok(s->c, "resume", NULL));
    g = dt_wait_gen(s->c, id2, NULL);
    dt_assert_greedy(&s->ref, 0, dt_output(g, 0), DT_REF_TOKENS);
    json_decref(g);
    json_decref(parts);
}

/* Records the prefill tokens and preemptions so far, starts a long request (its id in *id, its
 * partial replies into parts) and pauses the worker with `args`. Returns the pause reply
 * (json_decref it). */
static json_t *pause_long(st *s, const char *args, int64_t *prefill0, int64_t *preempt0,
                          json_t *parts, uint64_t *id) {
    json_t *t0 = dt_ok(s->c, "stats", NULL);
    *prefill0 = dt_int(t0, "throughput", "prefill_tokens");
    *preempt0 = dt_int(t0, "throughput", "preemptions");
    json_decref(t0);
    *id = start_long(s, parts);
    return dt_ok(s->c, "pause", args);
}

/* While paused no token is made: the stats 100 ms later (json_decref them) count as many
 * generated tokens as now. */
static json_t *stats_frozen(st *s) {
    const int64_t frozen = gen_tokens_now(s);
    usleep(100000);
    json_t *t = dt_ok(s->c, "stats", NULL);
    assert_int_equal(dt_int(t, "throughput", "generated_tokens"), frozen);
    return t;
}

/* pause(retract): requests are requeued without KV; after resume they finish with the tokens of
 * an uninterrupted run, their KV recomputed. */
static void test_pause_retract(void **state) {
    st *s = *state;
    int64_t pre0, pe0;
    json_t *parts = json_array();
    uint64_t id;
    json_t *p = pause_long(s, "{\"mode\":\"retract\"}", &pre0, &pe0, parts, &id);
    assert_int_equal(dt_int(p, "running", NULL), 0);
    assert_int_equal(dt_int(p, "waiting", NULL), 1);
    assert_int_equal(dt_int(p, "aborted", NULL), 0);
    json_decref(p);
    json_t *t = stats_frozen(s);
    assert_int_equal(dt_int(t, "throughput", "preemptions"), pe0 + 1);
    assert_int_equal(dt_int(t, "memory", "kv_blocks_used"), 0); /* its KV is gone */
    json_decref(t);
    json_decref(dt_ok(s->c, "resume", NULL));
    json_t *g = dt_wait_gen(s->c, id, NULL);
    json_t *o = dt_output(g, 0);
    assert_string_equal(dt_str(o, "finish", NULL), "length");
    assert_int_equal(assert_prefix(s, o), LONG_TOKENS);
    json_decref(g);
    t = dt_ok(s->c, "stats", NULL);
    /* the prompt, then the prompt and the tokens made before the pause, again */
    assert_true(dt_int(t, "throughput", "prefill_tokens") - pre0 > s->ref.n_prompt[0]);
    json_decref(t);
    json_decref(parts);
}

/* pause(in_place): requests stay in the batch with their KV; nothing is recomputed. */
static void test_pause_in_place(void **state) {
    st *s = *state;
    int64_t pre0, pe0;
    json_t *parts = json_array();
    uint64_t id;
    json_t *p = pause_long(s, "{\"mode\":\"in_place\"}", &pre0, &pe0, parts, &id);
    assert_int_equal(dt_int(p, "running", NULL), 1);
    assert_int_equal(dt_int(p, "aborted", NULL), 0);
    json_decref(p);
    json_t *t = stats_frozen(s);
    assert_true(dt_int(t, "memory", "kv_blocks_used") > 0); /* KV kept */
    json_decref(t);
    /* flush_cache is refused while a request holds KV */
    dt_refused(s->c, "flush_cache", NULL, RW_E_BUSY, NULL, 0);
    json_decref(dt_ok(s->c, "resume", NULL));
    json_t *g = dt_wait_gen(s->c, id, NULL);
    assert_int_equal(assert_prefix(s, dt_output(g, 0)), LONG_TOKENS);
    json_decref(g);
    t = dt_ok(s->c, "stats", NULL);
    assert_int_equal(dt_int(t, "throughput", "prefill_tokens") - pre0, s->ref.n_prompt[0]);
    assert_int_equal(dt_int(t, "throughput", "preemptions"), pe0);
    json_decref(t);
    json_decref(parts);
}

static void test_flush_cache(void **state) {
    st *s = *state;
    json_t *parts = json_array();
    uint64_t id = start_long(s, parts);
    char msg[512];
    dt_refused(s->c, "flush_cache", NULL, RW_E_BUSY, msg, sizeof msg);
    assert_non_null(strstr(msg, "running"));
    json_decref(dt_ok(s->c, "abort", "{\"all\":true}"));
    json_decref(dt_wait_gen(s->c, id, NULL));
    json_t *r = dt_ok(s->c, "flush_cache", NULL);
    assert_true(json_is_true(json_object_get(r, "flushed")));
    json_decref(r);
    json_decref(parts);
}

/* release / resume memory: KV and weights; after the weights come back, generation waits for
 * a reload. */
static void test_release_resume_memory(void **state) {
    st *s = *state;
    char a[1200], msg[512];
    snprintf(a, sizeof a, "{\"prompt\":%s,\"max_new_tokens\":%d}", s->p0, DT_REF_TOKENS);
    /* refused while a request runs */
    json_t *parts = json_array();
    uint64_t id = start_long(s, parts);
    dt_refused(s->c, "release_memory", NULL, RW_E_BUSY, NULL, 0);
    json_decref(dt_ok(s->c, "abort", "{\"all\":true}"));
    json_decref(dt_wait_gen(s->c, id, NULL));
    /* KV only */
    json_t *r = dt_ok(s->c, "release_memory", "{\"weights\":false,\"kv_cache\":true}");
    assert_true(json_is_true(json_object_get(r, "kv_released")));
    assert_false(json_is_true(json_object_get(r, "weights_released")));
    assert_true(dt_int(r, "released_bytes", NULL) > 0);
    json_decref(r);
    dt_refused(s->c, "generate", a, RW_E_STATE, msg, sizeof msg);
    assert_non_null(strstr(msg, "KV"));
    json_decref(dt_ok(s->c, "resume_memory", "{\"weights\":false}"));
    r = dt_ok(s->c, "generate", a);
    dt_assert_greedy(&s->ref, 0, dt_output(r, 0), DT_REF_TOKENS);
    json_decref(r);
    /* both */
    r = dt_ok(s->c, "release_memory", NULL);
    assert_true(json_is_true(json_object_get(r, "weights_released")));
    assert_string_equal(dt_str(r, "state", NULL), "weights_released");
    json_decref(r);
    json_t *t = dt_ok(s->c, "stats", NULL);
    assert_true(json_is_true(json_object_get(json_object_get(t, "memory"), "weights_released")));
    assert_true(json_is_true(json_object_get(json_object_get(t, "memory"), "kv_released")));
    json_decref(t);
    dt_refused(s->c, "generate", a, RW_E_STATE, NULL, 0);
    dt_refused(s->c, "checksum", NULL, RW_E_STATE, NULL, 0);
    json_decref(dt_ok(s->c, "resume_memory", NULL));
    /* the bytes did not survive: refused until the weights are loaded again */
    dt_refused(s->c, "generate", a, RW_E_WEIGHTS_INCOMPLETE, NULL, 0);
    json_t *h = dt_ok(s->c, "health", NULL);
    assert_string_equal(dt_str(h, "state", NULL), "weights_incomplete");
    json_decref(h);
    /* a partial reload is not enough */
    char model[4096], d[8192];
    rw_test_path(model, sizeof model, RW_TEST_FIXTURE);
    snprintf(d, sizeof d, "{\"path\":\"%s\",\"only\":\"^model\\\\.norm\"}", model);
    dt_refused(s->c, "update_weights_from_disk", d, RW_E_WEIGHTS_INCOMPLETE, NULL, 0);
    dt_refused(s->c, "generate", a, RW_E_WEIGHTS_INCOMPLETE, NULL, 0);
    snprintf(d, sizeof d, "{\"path\":\"%s\",\"version\":\"reloaded\"}", model);
    r = dt_ok(s->c, "update_weights_from_disk", d);
    json_decref(r);
    r = dt_ok(s->c, "generate", a);
    dt_assert_greedy(&s->ref, 0, dt_output(r, 0), DT_REF_TOKENS);
    assert_string_equal(dt_str(dt_output(r, 0), "weight_version", NULL), "reloaded");
    json_decref(r);
    json_decref(parts);
}

/* get_weight_version, get_weights and checksum against the fixture's bytes. */
static void test_readback(void **state) {
    st *s = *state;
    json_t *v = dt_ok(s->c, "get_weight_version", NULL);
    assert_string_equal(dt_str(v, "state", NULL), "ready");
    json_decref(v);
    char model[4096];
    rw_test_path(model, sizeof model, RW_TEST_FIXTURE);
    rw_ckpt *ck = NULL;
    rw_err e;
    RW_ASSERT_OK(rw_ckpt_open(model, &ck, &e), &e);
    rw_client_sums *sums = NULL;
    RW_ASSERT_OK(rw_client_checksum(s->c, NULL, 0, DT_TIMEOUT_MS, &sums, &e), &e);
    assert_int_equal(rw_client_sums_ranks(sums), 1);
    assert_int_equal(rw_client_sums_count(sums, 0), rw_ckpt_count(ck));
    size_t cap = 1 << 20;
    void *buf = malloc(cap);
    for (size_t i = 0; i < rw_ckpt_count(ck); i++) {
        const rw_st_entry *t = rw_ckpt_at(ck, i);
        const size_t n = t->end - t->begin;
        uint64_t got;
        RW_ASSERT_OK(rw_client_sums_find(sums, 0, t->name, &got, &e), &e);
        assert_true(got == rw_checksum64(t->data, n, 0));
        if (i % 16 == 0) { /* readback of a sample of tensors */
            size_t len = 0;
            RW_ASSERT_OK(rw_client_get_weights(s->c, t->name, 0, buf, cap, &len, DT_TIMEOUT_MS, &e),
                         &e);
            assert_int_equal(len, n);
            rw_assert_bytes_equal(buf, t->data, n, t->name);
        }
    }
    free(buf);
    rw_client_sums_free(sums);
    rw_ckpt_close(ck);
    char msg[512];
    dt_refused(s->c, "get_weights", "{\"name\":\"model.layers.99.mlp.gate.weight\"}", RW_E_RANGE,
               msg, sizeof msg);
    dt_refused(s->c, "get_weights", "{\"name\":\"model.norm.weight\",\"rank\":1}", RW_E_RANGE, msg,
               sizeof msg);
    assert_non_null(strstr(msg, "rank"));
}

/* Bad input gets an error reply; the worker keeps serving. */
static void test_bad_input(void **state) {
    st *s = *state;
    char msg[512], a[1200];
    /* raw bytes on a socket of our own */
    void *ctx = zmq_ctx_new();
    void *sock = zmq_socket(ctx, ZMQ_DEALER);
    int linger = 0, rcvtimeo = 10000;
    zmq_setsockopt(sock, ZMQ_LINGER, &linger, sizeof linger);
    zmq_setsockopt(sock, ZMQ_RCVTIMEO, &rcvtimeo, sizeof rcvtimeo);
    assert_int_equal(zmq_connect(sock, s->w.ep), 0);
    typedef struct bad_case {
        const char *what;
        const void *bytes;
        size_t len;
        rw_status want;
    } bad_case;
    bad_case cases[4];
    static const uint8_t garbage[] = {0xc1, 0xff, 0x00, 0x12};
    static const uint8_t truncated[] = {0x84, 0xa8, 'p', 'r', 'o'};
    rw_mw *w = NULL;
    rw_err e;
    RW_ASSERT_OK(rw_mw_create(&w, &e), &e);
    rw_mw_map(w, 4);
    rw_mw_str(w, "protocol");
    rw_mw_u64(w, 99);
    rw_mw_str(w, "id");
    rw_mw_u64(w, 5);
    rw_mw_str(w, "cmd");
    rw_mw_str(w, "health");
    rw_mw_str(w, "args");
    rw_mw_map(w, 0);
    const void *badver;
    size_t badver_len;
    RW_ASSERT_OK(rw_mw_finish(w, &badver, &badver_len, &e), &e);
    cases[0] = (bad_case){"garbage", garbage, sizeof garbage, RW_E_FORMAT};
    cases[1] = (bad_case){"truncated", truncated, sizeof truncated, RW_E_FORMAT};
    cases[2] = (bad_case){"protocol 99", badver, badver_len, RW_E_PROTOCOL};
    cases[3] = (bad_case){"empty", "", 0, RW_E_FORMAT};
    for (int i = 0; i < 4; i++) {
        assert_true(zmq_send(sock, cases[i].bytes, cases[i].len, 0) >= 0);
        /* the reply's last frame is the envelope (an empty message reads as a REQ peer's
         * delimiter, so its reply comes back with one) */
        char buf[2048];
        int n, more = 1;
        do {
            n = zmq_recv(sock, buf, sizeof buf, 0);
            if (n < 0) fail_msg("%s: no reply", cases[i].what);
            size_t ml = sizeof more;
            zmq_getsockopt(sock, ZMQ_RCVMORE, &more, &ml);
        } while (more);
        rw_msg *m = NULL;
        rw_reply rp;
        RW_ASSERT_OK(rw_msg_decode_reply(buf, (size_t)n, &m, &rp, &e), &e);
        assert_false(rp.ok);
        if (rp.status != cases[i].want)
            fail_msg("%s: status %s (%s)", cases[i].what, rw_status_str(rp.status), rp.message);
        if (i == 2) {
            assert_int_equal(rp.id, 5);
            assert_non_null(strstr(rp.message, "99"));
        }
        rw_msg_free(m);
    }
    /* a command that takes no data frames, sent with one */
    rw_mw_reset(w);
    rw_mw_request(w, 7, "health");
    rw_mw_map(w, 0);
    const void *env;
    size_t env_len;
    RW_ASSERT_OK(rw_mw_finish(w, &env, &env_len, &e), &e);
    assert_true(zmq_send(sock, env, env_len, ZMQ_SNDMORE) >= 0);
    assert_true(zmq_send(sock, "xyz", 3, 0) >= 0);
    char buf[2048];
    int n = zmq_recv(sock, buf, sizeof buf, 0);
    assert_true(n > 0);
    rw_msg *m = NULL;
    rw_reply rp;
    RW_ASSERT_OK(rw_msg_decode_reply(buf, (size_t)n, &m, &rp, &e), &e);
    assert_false(rp.ok);
    assert_int_equal(rp.status, RW_E_PROTOCOL);
    rw_msg_free(m);
    rw_mw_destroy(w);
    zmq_close(sock);
    zmq_ctx_term(ctx);
    /* wrong types, out-of-range ids, unknown fields and commands */
    dt_refused(s->c, "generate", "{\"prompt\":\"abc\"}", RW_E_PROTOCOL, msg, sizeof msg);
    assert_non_null(strstr(msg, "args.prompt"));
    dt_refused(s->c, "generate", "{\"prompt\":[1,100000,3]}", RW_E_RANGE, msg, sizeof msg);
    assert_non_null(strstr(msg, "args.prompt[1]"));
    dt_refused(s->c, "generate", "{\"prompts\":[[1,2],[3,-4]]}", RW_E_RANGE, msg, sizeof msg);
    assert_non_null(strstr(msg, "args.prompts[1][1]"));
    dt_refused(s->c, "generate", "{\"prompt\":[]}", RW_E_INVALID_ARG, NULL, 0);
    dt_refused(s->c, "generate", "{\"prompt\":[1],\"prompts\":[[1]]}", RW_E_PROTOCOL, NULL, 0);
    dt_refused(s->c, "generate", "{\"prompt\":[1],\"temprature\":1}", RW_E_PROTOCOL, msg,
               sizeof msg);
    assert_non_null(strstr(msg, "temprature"));
    dt_refused(s->c, "pause", "{\"mode\":\"later\"}", RW_E_INVALID_ARG, msg, sizeof msg);
    assert_non_null(strstr(msg, "later"));
    dt_refused(s->c, "launch_rockets", NULL, RW_E_PROTOCOL, msg, sizeof msg);
    assert_non_null(strstr(msg, "launch_rockets"));
    dt_refused(s->c, "update_weights", "{\"manifest\":{\"nbytes\":0,\"tensors\":[]}}",
               RW_E_PROTOCOL, msg, sizeof msg); /* no bucket frame */
    assert_non_null(strstr(msg, "frame"));
    dt_refused(s->c, "commit_update", NULL, RW_E_STATE, NULL, 0);
    /* still serving, and nothing was disturbed */
    json_t *h = dt_ok(s->c, "health", NULL);
    assert_string_equal(dt_str(h, "state", NULL), "serving");
    json_decref(h);
    snprintf(a, sizeof a, "{\"prompt\":%s,\"max_new_tokens\":%d}", s->p0, DT_REF_TOKENS);
    json_t *r = dt_ok(s->c, "generate", a);
    dt_assert_greedy(&s->ref, 0, dt_output(r, 0), DT_REF_TOKENS);
    json_decref(r);
}

/* A token is required when asked for; a non-loopback bind without one is refused. */
static void test_auth(void **state) {
    (void)state;
    char model[4096];
    rw_test_path(model, sizeof model, RW_TEST_FIXTURE);
    char exe[4096];
    dt_exe(exe, sizeof exe, "worker/rw-worker");
    const char *bad[] = {exe,         "--model",         model, "--device", "cpu",
                         "--control", "tcp://0.0.0.0:*", NULL};
    assert_int_equal(dt_run(bad, NULL, 0, 30), 2);
    dt_worker w;
    const char *args[] = {"--model",           model,          "--device", "cpu", "--control",
                          "tcp://127.0.0.1:*", "--auth-token", "s3cret",   NULL};
    dt_start(&w, args);
    rw_client *c = dt_connect(&w);
    dt_refused(c, "health", NULL, RW_E_AUTH, NULL, 0);
    dt_refused(c, "health", "{\"auth\":\"wrong\"}", RW_E_AUTH, NULL, 0);
    json_t *h = dt_ok(c, "health", "{\"auth\":\"s3cret\"}");
    assert_string_equal(dt_str(h, "status", NULL), "ok");
    json_decref(h);
    json_t *r =
        dt_ok(c, "generate", "{\"auth\":\"s3cret\",\"prompt\":[1,2,3],\"max_new_tokens\":2}");
    assert_int_equal(json_array_size(json_object_get(dt_output(r, 0), "tokens")), 2);
    json_decref(r);
    dt_refused(c, "shutdown", NULL, RW_E_AUTH, NULL, 0);
    json_decref(dt_ok(c, "shutdown", "{\"auth\":\"s3cret\"}"));
    assert_int_equal(dt_wait_exit(&w, 30), 0);
    rw_client_close(c);
}

/* shutdown and SIGTERM with requests in flight: they are answered with their partial tokens. */
static void test_shutdown_and_sigterm(void **state) {
    st *s0 = *state;
    char model[4096];
    rw_test_path(model, sizeof model, RW_TEST_FIXTURE);
    const char *args[] = {"--model",           model, "--device", "cpu", "--control",
                          "tcp://127.0.0.1:*", NULL};
    for (int how = 0; how < 2; how++) {
        st s;
        memset(&s, 0, sizeof s);
        memcpy(s.uninterrupted, s0->uninterrupted, sizeof s.uninterrupted);
        memcpy(s.p0, s0->p0, sizeof s.p0);
        dt_start(&s.w, args);
        s.c = dt_connect(&s.w);
        json_t *parts = json_array();
        uint64_t id = start_long(&s, parts);
        uint64_t sid = 0;
        if (how == 0)
            sid = dt_send(s.c, "shutdown", NULL);
        else
            kill(s.w.pid, SIGTERM);
        json_t *g = dt_wait_gen(s.c, id, NULL);
        assert_string_equal(dt_str(dt_output(g, 0), "finish", NULL), "abort");
        int n = assert_prefix(&s, dt_output(g, 0));
        assert_true(n >= 1 && n < LONG_TOKENS);
        json_decref(g);
        if (how == 0) {
            char *res = NULL;
            rw_err e;
            RW_ASSERT_OK(rw_client_wait_json(s.c, sid, DT_TIMEOUT_MS, &res, NULL, NULL, &e), &e);
            json_error_t je;
            json_t *sr = json_loads(res, 0, &je);
            rw_client_free(res);
            assert_int_equal(dt_int(sr, "aborted", NULL), 1);
            json_decref(sr);
        }
        assert_int_equal(dt_wait_exit(&s.w, 30), 0);
        rw_client_close(s.c);
        json_decref(parts);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_health_stats),
        cmocka_unit_test(test_generate_reference),
        cmocka_unit_test(test_generate_batched),
        cmocka_unit_test(test_many_in_flight),
        cmocka_unit_test(test_streaming),
        cmocka_unit_test(test_sampling_options),
        cmocka_unit_test(test_abort_one_and_all),
        cmocka_unit_test(test_pause_abort),
        cmocka_unit_test(test_pause_retract),
        cmocka_unit_test(test_pause_in_place),
        cmocka_unit_test(test_flush_cache),
        cmocka_unit_test(test_readback),
        cmocka_unit_test(test_bad_input),
        cmocka_unit_test(test_release_resume_memory),
        cmocka_unit_test(test_auth),
        cmocka_unit_test(test_shutdown_and_sigterm),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
