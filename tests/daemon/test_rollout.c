/* test_rollout.c - the daemon's rollout features over loopback (cpu suite), with the fixture
 * model on the CPU backend, through the C client's typed calls and rw-ctl:
 * - generate with n samples, processed logprobs and routed experts (ids and weights in the
 *   reply's data frame, one row per prompt and generated token); score of every output's
 *   continuation returns the same logprobs and routes; the samples shared their prompt's KV
 *   (stats prefix_cache); a worker with --no-prefix-cache gives the same outputs without sharing;
 * - the same on a CPU TP2 worker (the request options reach every rank): greedy samples equal
 *   the fixture's reference;
 * - bad input for the new fields is refused naming them; rw-ctl generate / score with the new
 *   options, the frame written by --out. */
#include "daemon_util.h"

#define NEW_TOKENS 10

static void start_fixture(dt_worker *w, const char *extra0, const char *extra1) {
    char model[4096];
    rw_test_path(model, sizeof model, RW_TEST_FIXTURE);
    const char *args[] = {"--model",           model,  "--device", "cpu", "--control",
                          "tcp://127.0.0.1:*", extra0, extra1,     NULL};
    dt_start(w, args);
}

/* A generate / score through the typed calls: the result (json_decref) and the frame. */
static json_t *call_frame(rw_client *c, bool score, const char *args, void **frame, size_t *flen) {
    char *res = NULL;
    rw_err e;
    rw_err_clear(&e);
    rw_status st = score ? rw_client_score(c, args, DT_TIMEOUT_MS, &res, frame, flen, &e)
                         : rw_client_generate(c, args, DT_TIMEOUT_MS, &res, frame, flen, &e);
    if (st != RW_OK)
        fail_msg("%s %s: %s: %s", score ? "score" : "generate", args, rw_status_str(st), e.msg);
    json_error_t je;
    json_t *r = json_loads(res, 0, &je);
    assert_non_null(r);
    rw_client_free(res);
    return r;
}

/* Every output's routes: the shape [prompt + generated, L, k], ids below E, weights summing to 1
 * per token and layer (norm_topk_prob). Returns the routes of output i. */
static rw_client_routes routes_of(json_t *r, size_t i, const void *frame, size_t flen, int ntok) {
    char *text = json_dumps(r, JSON_COMPACT);
    rw_client_routes rt;
    rw_err e;
    RW_ASSERT_OK(rw_client_routes_of(text, i, frame, flen, &rt, &e), &e);
    free(text);
    assert_int_equal(rt.tokens, ntok);
    assert_int_equal(rt.layers, 3); /* the fixture: 3 layers, top-2 of 8 experts */
    assert_int_equal(rt.k, 2);
    assert_int_equal(rt.id_bytes, 1);
    assert_non_null(rt.weights);
    const uint8_t *ids = rt.ids;
    for (int64_t t = 0; t < rt.tokens * rt.layers; t++) {
        assert_true(ids[2 * t] < 8 && ids[2 * t + 1] < 8 && ids[2 * t] != ids[2 * t + 1]);
        assert_true(fabsf(rt.weights[2 * t] + rt.weights[2 * t + 1] - 1.0f) < 1e-5f);
        assert_true(rt.weights[2 * t] >= rt.weights[2 * t + 1]);
    }
    return rt;
}

/* Prompts 0..2 of the fixture x n 4, sampled, processed logprobs, routes; then each output's
 * continuation scored with the same distribution. Returns the generate result; *forked gets the
 * stats' forked samples. */
static json_t *generate_and_score(rw_client *c, const dt_ref *ref, int64_t *forked) {
    char p[3][512], args[2400];
    for (int i = 0; i < 3; i++)
        dt_prompt_json(ref->prompt[i], ref->n_prompt[i], p[i], sizeof p[i]);
    snprintf(args, sizeof args,
             "{\"prompts\":[%s,%s,%s],\"n\":4,\"max_new_tokens\":%d,\"temperature\":1.0,"
             "\"top_k\":40,\"seed\":7,\"logprob_mode\":\"processed\",\"top_logprobs\":2,"
             "\"return_routed_experts\":true,\"return_routing_weights\":true}",
             p[0], p[1], p[2], NEW_TOKENS);
    void *frame = NULL;
    size_t flen = 0;
    json_t *g = call_frame(c, false, args, &frame, &flen);
    assert_non_null(frame);
    for (size_t k = 0; k < 12; k++) {
        json_t *o = dt_output(g, k);
        const int pi = (int)k / 4, n = (int)json_array_size(json_object_get(o, "tokens"));
        assert_int_equal(n, NEW_TOKENS);
        rw_client_routes gr = routes_of(g, k, frame, flen, ref->n_prompt[pi] + n);
        /* score the continuation */
        char cont[512], sargs[1400];
        int32_t toks[64];
        dt_ints(json_object_get(o, "tokens"), toks, 64);
        dt_prompt_json(toks, n, cont, sizeof cont);
        snprintf(sargs, sizeof sargs,
                 "{\"prompt\":%s,\"continuation\":%s,\"temperature\":1.0,\"top_k\":40,"
                 "\"logprob_mode\":\"processed\",\"top_logprobs\":2,\"prompt_logprobs\":true,"
                 "\"return_routed_experts\":true,\"return_routing_weights\":true}",
                 p[pi], cont);
        void *sf = NULL;
        size_t sflen = 0;
        json_t *s = call_frame(c, true, sargs, &sf, &sflen);
        json_t *so = dt_output(s, 0);
        assert_int_equal(dt_int(so, "continuation_tokens", NULL), n);
        assert_int_equal(dt_int(so, "prompt_tokens", NULL), ref->n_prompt[pi]);
        json_t *glp = json_object_get(o, "logprobs"), *slp = json_object_get(so, "logprobs");
        for (int j = 0; j < n; j++) {
            const double a = json_real_value(json_array_get(glp, (size_t)j)),
                         b = json_real_value(json_array_get(slp, (size_t)j));
            if (a != b) fail_msg("output %zu token %d: generate %.9g, score %.9g", k, j, a, b);
        }
        assert_true(
            json_equal(json_object_get(o, "top_logprobs"), json_object_get(so, "top_logprobs")));
        json_t *plp = json_object_get(so, "prompt_logprobs");
        assert_int_equal(json_array_size(plp), ref->n_prompt[pi]);
        assert_true(json_is_null(json_array_get(plp, 0)));
        rw_client_routes sr = routes_of(s, 0, sf, sflen, ref->n_prompt[pi] + n);
        rw_assert_bytes_equal(sr.ids, gr.ids, (size_t)(sr.tokens * sr.layers * sr.k), "ids");
        rw_assert_bytes_equal(sr.weights, gr.weights, sizeof(float) * (size_t)(sr.tokens * 6),
                              "weights");
        rw_client_free(sf);
        json_decref(s);
    }
    rw_client_free(frame);
    json_t *st = dt_ok(c, "stats", NULL);
    *forked = dt_int(st, "prefix_cache", "forked_samples");
    assert_true(dt_int(st, "prefix_cache", "score_tokens") >= 12 * NEW_TOKENS);
    json_decref(st);
    return g;
}

static void test_generate_score_routes(void **state) {
    (void)state;
    dt_ref ref;
    dt_ref_load(&ref);
    dt_worker w, w2;
    start_fixture(&w, NULL, NULL);
    start_fixture(&w2, "--no-prefix-cache", NULL);
    rw_client *c = dt_connect(&w), *c2 = dt_connect(&w2);
    int64_t forked, forked2;
    json_t *g = generate_and_score(c, &ref, &forked);
    json_t *g2 = generate_and_score(c2, &ref, &forked2);
    assert_int_equal(forked, 9); /* 3 prompts x (4 - 1) samples */
    assert_int_equal(forked2, 0);
    /* the same tokens and logprobs with and without sharing */
    for (size_t k = 0; k < 12; k++) {
        json_t *a = dt_output(g, k), *b = dt_output(g2, k);
        assert_true(json_equal(json_object_get(a, "tokens"), json_object_get(b, "tokens")));
        assert_true(json_equal(json_object_get(a, "logprobs"), json_object_get(b, "logprobs")));
    }
    json_t *st = dt_ok(c2, "stats", NULL);
    assert_false(json_is_true(json_object_get(json_object_get(st, "prefix_cache"), "enabled")));
    json_decref(st);
    json_decref(g);
    json_decref(g2);
    dt_shutdown(&w, c, 30);
    dt_shutdown(&w2, c2, 30);
}

static void test_tp2(void **state) {
    (void)state;
    dt_ref ref;
    dt_ref_load(&ref);
    dt_worker w;
    start_fixture(&w, "--tp", "2");
    rw_client *c = dt_connect(&w);
    char p[512], args[1200];
    dt_prompt_json(ref.prompt[1], ref.n_prompt[1], p, sizeof p);
    snprintf(args, sizeof args,
             "{\"prompt\":%s,\"n\":3,\"max_new_tokens\":%d,\"return_routed_experts\":true}", p,
             DT_REF_TOKENS);
    void *frame = NULL;
    size_t flen = 0;
    json_t *g = call_frame(c, false, args, &frame, &flen);
    for (size_t k = 0; k < 3; k++) {
        json_t *o = dt_output(g, k);
        dt_assert_greedy(&ref, 1, o, DT_REF_TOKENS);
        char *text = json_dumps(g, JSON_COMPACT);
        rw_client_routes rt;
        rw_err e;
        RW_ASSERT_OK(rw_client_routes_of(text, k, frame, flen, &rt, &e), &e);
        assert_int_equal(rt.tokens, ref.n_prompt[1] + DT_REF_TOKENS);
        assert_null(rt.weights);
        free(text);
    }
    /* a score on both ranks */
    char cont[512], sargs[1400];
    int32_t toks[64];
    dt_ints(json_object_get(dt_output(g, 0), "tokens"), toks, 64);
    dt_prompt_json(toks, DT_REF_TOKENS, cont, sizeof cont);
    snprintf(sargs, sizeof sargs, "{\"prompts\":[%s],\"continuations\":[%s]}", p, cont);
    json_t *s = dt_ok(c, "score", sargs);
    assert_true(json_equal(json_object_get(dt_output(s, 0), "logprobs"),
                           json_object_get(dt_output(g, 0), "logprobs")));
    json_t *st = dt_ok(c, "stats", NULL);
    assert_int_equal(dt_int(st, "prefix_cache", "forked_samples"), 2);
    json_decref(st);
    json_decref(s);
    json_decref(g);
    rw_client_free(frame);
    dt_shutdown(&w, c, 30);
}

static void test_bad_input(void **state) {
    (void)state;
    dt_worker w;
    start_fixture(&w, NULL, NULL);
    rw_client *c = dt_connect(&w);
    const struct {
        const char *cmd, *args;
        rw_status want;
        const char *needle;
    } cases[] = {
        {"generate", "{\"prompt\":[1,2],\"logprob_mode\":\"cooked\"}", RW_E_INVALID_ARG,
         "logprob_mode"},
        {"generate", "{\"prompt\":[1,2],\"logprob_mode\":3}", RW_E_PROTOCOL, "logprob_mode"},
        {"generate", "{\"prompt\":[1,2],\"return_routing_weights\":true}", RW_E_INVALID_ARG,
         "return_routed_experts"},
        {"generate", "{\"prompt\":[1,2],\"return_routed_experts\":1}", RW_E_PROTOCOL,
         "return_routed_experts"},
        {"score", "{\"prompt\":[1,2]}", RW_E_PROTOCOL, "continuation"},
        {"score", "{\"prompt\":[1,2],\"continuations\":[[3]]}", RW_E_PROTOCOL, "continuation"},
        {"score", "{\"prompts\":[[1,2]],\"continuations\":[[3],[4]]}", RW_E_INVALID_ARG,
         "2 continuations"},
        {"score", "{\"prompt\":[1,2],\"continuation\":[]}", RW_E_INVALID_ARG, "continuation"},
        {"score", "{\"prompt\":[1,2],\"continuation\":[9999]}", RW_E_RANGE, "continuation"},
        {"score", "{\"prompt\":[1,2],\"continuation\":[3],\"max_new_tokens\":4}", RW_E_PROTOCOL,
         "max_new_tokens"},
        {"score", "{\"prompt\":[1,2],\"continuation\":[3],\"top_p\":0}", RW_E_RANGE, "top_p"},
        {"score", "{\"prompts\":[],\"continuations\":[]}", RW_E_INVALID_ARG, "empty"},
        {"score", "{\"prompt\":[1,2],\"continuation\":[3],\"n\":2}", RW_E_PROTOCOL, "n"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char msg[512];
        dt_refused(c, cases[i].cmd, cases[i].args, cases[i].want, msg, sizeof msg);
        if (!strstr(msg, cases[i].needle))
            fail_msg("%s %s: message '%s' does not name %s", cases[i].cmd, cases[i].args, msg,
                     cases[i].needle);
    }
    /* a score whose one-message reply could pass 64 MiB (1100 pairs x 250 tokens with 20 top
     * logprobs: about 86 MB) is refused before any work, naming the bound */
    {
        enum { PAIRS = 1100, CONT = 250 };
        size_t cap = (size_t)PAIRS * (CONT * 4 + 16) + 256, k = 0;
        char *a = malloc(cap);
        k += (size_t)snprintf(a + k, cap - k, "{\"prompts\":[");
        for (int i = 0; i < PAIRS; i++)
            k += (size_t)snprintf(a + k, cap - k, "%s[1,2]", i ? "," : "");
        k += (size_t)snprintf(a + k, cap - k, "],\"continuations\":[");
        for (int i = 0; i < PAIRS; i++) {
            k += (size_t)snprintf(a + k, cap - k, "%s[", i ? "," : "");
            for (int j = 0; j < CONT; j++)
                k += (size_t)snprintf(a + k, cap - k, "%s%d", j ? "," : "", 3 + j % 100);
            k += (size_t)snprintf(a + k, cap - k, "]");
        }
        snprintf(a + k, cap - k, "],\"top_logprobs\":20}");
        char msg[512];
        dt_refused(c, "score", a, RW_E_RANGE, msg, sizeof msg);
        if (!strstr(msg, "past one message") || !strstr(msg, "split the pairs"))
            fail_msg("a score past one message: '%s'", msg);
        free(a);
    }
    /* still serving */
    json_decref(dt_ok(c, "score", "{\"prompt\":[1,2],\"continuation\":[3]}"));
    dt_shutdown(&w, c, 30);
}

static void test_rw_ctl(void **state) {
    (void)state;
    dt_worker w;
    start_fixture(&w, NULL, NULL);
    char *tmp = rw_test_tmpdir("rw-rollout-");
    char file[512], out[65536];
    snprintf(file, sizeof file, "%s/routes.bin", tmp);
    const char *gen[] = {"--to",
                         w.ep,
                         "generate",
                         "--prompt",
                         "1,2,3,4",
                         "--n",
                         "2",
                         "--max-new-tokens",
                         "5",
                         "--temperature",
                         "1",
                         "--logprob-mode",
                         "processed",
                         "--return-routed-experts",
                         "--return-routing-weights",
                         "--out",
                         file,
                         NULL};
    assert_int_equal(dt_run_tool("tools/ctl/rw-ctl", gen, out, sizeof out, 60), 0);
    json_error_t je;
    json_t *r = json_loads(out, 0, &je);
    assert_non_null(r);
    json_t *re = json_object_get(dt_output(r, 1), "routed_experts");
    assert_int_equal(json_integer_value(json_array_get(json_object_get(re, "shape"), 0)), 4 + 5);
    assert_string_equal(dt_str(re, "dtype", NULL), "u8");
    struct stat sb;
    assert_int_equal(stat(file, &sb), 0);
    assert_int_equal(sb.st_size, dt_int(r, "data_bytes", NULL));
    /* 2 outputs x (9 x 3 x 2 ids at 1 byte, padded to 8) + (9 x 3 x 2 fp32) */
    assert_int_equal(sb.st_size, 2 * (56 + 216));
    json_decref(r);
    const char *sc[] = {"--to", w.ep,       "score", "--prompt",       "1,2,3", "--continuation",
                        "4,5",  "--prompt", "7,8",   "--continuation", "9",     "--prompt-logprobs",
                        NULL};
    assert_int_equal(dt_run_tool("tools/ctl/rw-ctl", sc, out, sizeof out, 60), 0);
    r = json_loads(out, 0, &je);
    assert_non_null(r);
    assert_int_equal(json_array_size(json_object_get(dt_output(r, 0), "logprobs")), 2);
    assert_int_equal(json_array_size(json_object_get(dt_output(r, 1), "prompt_logprobs")), 2);
    json_decref(r);
    const char *bad[] = {"--to", w.ep, "score", "--continuation", "4", NULL};
    assert_int_equal(dt_run_tool("tools/ctl/rw-ctl", bad, out, sizeof out, 60), 2);
    rw_test_rm_rf(tmp);
    free(tmp);
    rw_client *c = dt_connect(&w);
    dt_shutdown(&w, c, 30);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_generate_score_routes),
        cmocka_unit_test(test_tp2),
        cmocka_unit_test(test_bad_input),
        cmocka_unit_test(test_rw_ctl),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
