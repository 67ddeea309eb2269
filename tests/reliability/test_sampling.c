/* test_sampling.c - sampling parameters at the edge of what float arithmetic can do, issue 17
 * finding 4, against a live rw-worker (CPU backend, the tiny fixture): temperatures that pass
 * validation but are too small to invert (1/T, or the largest logit / T, is not finite; 1.4e-45
 * up to about 3e-39) sample greedily - the T -> 0 limit of softmax(logits / T) - so the fixture's
 * four prompts give exactly their greedy reference tokens, whatever the seed, top_k or top_p
 * (before, every mass was NaN and every token came out as the last id of the vocabulary, 511).
 * An ordinary temperature still samples (its tokens differ from the greedy ones). The same rule
 * on the CUDA sampler: tests/worker/test_sample_gpu.c (test_sample_tiny_temperature), and on
 * both CPU paths: tests/worker/test_sampler.c. */
#include "reliability_util.h"

static dt_worker W;

static int teardown(void **state) {
    (void)state;
    dt_kill(&W);
    return 0;
}

static void test_tiny_temperatures_are_greedy(void **state) {
    (void)state;
    dt_ref ref;
    dt_ref_load(&ref);
    rl_start_fixture(&W, NULL, NULL);
    rw_client *c = dt_connect(&W);
    static const char *const temps[] = {"1.4e-45", "1e-44", "1e-40", "1e-39", "2.9e-39"};
    static const char *const extra[] = {"", ", \"top_p\": 0.9", ", \"top_k\": 50",
                                        ", \"top_p\": 0.5, \"top_k\": 3"};
    int checked = 0;
    for (size_t t = 0; t < sizeof temps / sizeof *temps; t++) {
        for (int i = 0; i < DT_NREF; i++) {
            char p[1024], a[1400];
            dt_prompt_json(ref.prompt[i], ref.n_prompt[i], p, sizeof p);
            snprintf(a, sizeof a,
                     "{\"prompt\": %s, \"max_new_tokens\": %d, \"temperature\": %s, \"seed\": "
                     "%zu%s}",
                     p, DT_REF_TOKENS, temps[t], 1000 + 7 * t + (size_t)i, extra[(t + i) % 4]);
            json_t *r = dt_ok(c, "generate", a);
            json_t *o = dt_output(r, 0);
            int32_t got[DT_REF_TOKENS];
            dt_ints(json_object_get(o, "tokens"), got, DT_REF_TOKENS);
            for (int j = 0; j < DT_REF_TOKENS; j++)
                if (got[j] != ref.greedy[i][j])
                    fail_msg("temperature %s, prompt %d: token %d is %d, greedy gives %d", temps[t],
                             i, j, got[j], ref.greedy[i][j]);
            /* the logprobs are the raw distribution's, as for greedy */
            json_t *lp = json_object_get(o, "logprobs");
            for (int j = 0; j < DT_REF_TOKENS; j++)
                assert_true(fabs(json_real_value(json_array_get(lp, j)) - ref.greedy_lp[i][j]) <
                            1e-4);
            json_decref(r);
            checked++;
        }
    }
    printf("%d generations at temperatures down to 1.4e-45: the greedy reference\n", checked);
    /* a temperature of 1 samples: not the greedy tokens */
    char p[1024], a[1400];
    dt_prompt_json(ref.prompt[0], ref.n_prompt[0], p, sizeof p);
    snprintf(a, sizeof a,
             "{\"prompt\": %s, \"max_new_tokens\": %d, \"temperature\": 1.0, \"seed\": 3}", p,
             DT_REF_TOKENS);
    json_t *r = dt_ok(c, "generate", a);
    int32_t got[DT_REF_TOKENS];
    dt_ints(json_object_get(dt_output(r, 0), "tokens"), got, DT_REF_TOKENS);
    json_decref(r);
    assert_true(memcmp(got, ref.greedy[0], sizeof got) != 0);
    dt_shutdown(&W, c, 30);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_teardown(test_tiny_temperatures_are_greedy, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
