/* test_score.c - logprobs a trainer can compare, on the CPU backend with the fixture model:
 * - logprob_mode processed: the logprob of every generated token (and the top logprobs) equals a
 *   reference computed here from the raw logits (teacher-forced through rw_model_score), the
 *   temperature, top-k and top-p: the log-probability under the renormalised kept set; greedy
 *   gives 0;
 * - score (rw_request_opts.n_score): the logprobs of a given continuation equal, bit for bit, the
 *   ones generate reported for the tokens it produced, raw and processed, with top logprobs,
 *   whether scored alone, in a batch with other requests, chunked, or on a cached prefix; prompt
 *   logprobs equal log_softmax of the teacher-forced logits. */
#include "rollout_util.h"

typedef rw_fixture_model ctx;

/* Sampling settings covered: greedy, temperature only, top-k, top-p, both. */
static rw_sampling setting(int k) {
    rw_sampling sp = rw_sampling_default();
    sp.max_new_tokens = 12;
    sp.seed = 100 + (uint64_t)k;
    switch (k % 5) {
    case 0: break;
    case 1: sp.temperature = 0.8f; break;
    case 2:
        sp.temperature = 1.3f;
        sp.top_k = 20;
        break;
    case 3:
        sp.temperature = 0.7f;
        sp.top_p = 0.9f;
        break;
    case 4:
        sp.temperature = 1.0f;
        sp.top_k = 50;
        sp.top_p = 0.8f;
        break;
    }
    return sp;
}

/* The processed log-probability of `tok` under logits [V], written from the rule's text:
 * z = logits / T; the top_k largest z kept (ties at the boundary kept); then the smallest set of
 * the largest z whose softmax mass reaches top_p (ties kept); log softmax over the kept set. */
static double ref_processed(const float *l, int V, const rw_sampling *sp, int tok) {
    if (sp->temperature <= 0 || sp->top_k == 1) {
        int arg = 0;
        for (int i = 1; i < V; i++)
            if (l[i] > l[arg]) arg = i;
        return tok == arg ? 0.0 : -INFINITY;
    }
    const float inv_t = 1.0f / sp->temperature;
    float *z = calloc((size_t)V, sizeof(float)), *sorted = calloc((size_t)V, sizeof(float));
    assert_true(V > 0 && z && sorted);
    for (int i = 0; i < V; i++)
        z[i] = sorted[i] = l[i] * inv_t;
    /* descending order of z (insertion sort: V is small) */
    for (int i = 1; i < V; i++)
        for (int j = i; j > 0 && sorted[j] > sorted[j - 1]; j--) {
            const float x = sorted[j];
            sorted[j] = sorted[j - 1];
            sorted[j - 1] = x;
        }
    float thr = -INFINITY;
    int nk = V;
    if (sp->top_k > 0 && sp->top_k < V) {
        thr = sorted[sp->top_k - 1];
        while (nk > 0 && sorted[nk - 1] < thr)
            nk--;
    }
    if (sp->top_p < 1.0f) {
        double tot = 0, cum = 0;
        for (int i = 0; i < nk; i++)
            tot += exp((double)sorted[i] - sorted[0]);
        for (int i = 0; i < nk; i++) {
            cum += exp((double)sorted[i] - sorted[0]);
            if (cum >= (double)sp->top_p * tot) {
                if (sorted[i] > thr) thr = sorted[i];
                break;
            }
        }
    }
    double s = 0;
    for (int i = 0; i < V; i++)
        if (z[i] >= thr) s += exp((double)z[i] - sorted[0]);
    const double lp = z[tok] >= thr ? (double)z[tok] - sorted[0] - log(s) : -INFINITY;
    free(z);
    free(sorted);
    return lp;
}

static void test_processed_logprobs(void **state) {
    ctx *c = *state;
    const int V = c->cfg.vocab_size;
    rw_err err = {0};
    int32_t seq[128];
    const int P = 30;
    rw_random_prompt(seq, P, V, 11);
    double worst = 0;
    int inf_seen = 0;
    for (int k = 0; k < 5; k++) {
        rw_sampling sp = setting(k);
        sp.logprob_mode = RW_LOGPROB_PROCESSED;
        sp.top_logprobs = 6;
        rw_output *o = rw_run_alone(c->m, seq, P, &sp, NULL);
        const int N = P + o->n;
        memcpy(seq + P, o->tokens, sizeof(int32_t) * (size_t)o->n);
        float *lg = malloc(sizeof(float) * (size_t)N * V);
        RW_ASSERT_OK(rw_model_score(c->m, seq, N, lg, &err), &err);
        for (int j = 0; j < o->n; j++) {
            const float *row = lg + (size_t)(P - 1 + j) * V; /* the logits token j was drawn from */
            const double want = ref_processed(row, V, &sp, o->tokens[j]);
            if (sp.temperature <= 0) {
                assert_true(o->logprobs[j] == 0.0f);
            } else {
                assert_true(isfinite(want) && isfinite(o->logprobs[j]));
                worst = fmax(worst, fabs(o->logprobs[j] - want));
                if (fabs(o->logprobs[j] - want) > 1e-5)
                    fail_msg("setting %d token %d: processed logprob %.9g, reference %.9g", k, j,
                             o->logprobs[j], want);
            }
            for (int q = 0; q < o->top_n; q++) {
                const int id = o->top_ids[(size_t)j * o->top_n + q];
                const float got = o->top_logprobs[(size_t)j * o->top_n + q];
                const double w = ref_processed(row, V, &sp, id);
                if (isinf(w)) {
                    assert_true(isinf(got) && got < 0);
                    inf_seen++;
                } else if (fabs(got - w) > 1e-5) {
                    fail_msg("setting %d token %d top %d (id %d): %.9g, reference %.9g", k, j, q,
                             id, got, w);
                }
            }
        }
        free(lg);
        rw_output_free(o);
    }
    print_message("processed logprobs within %.3g of the reference (%d top ids outside the kept "
                  "set: -inf)\n",
                  worst, inf_seen);
    assert_true(inf_seen > 0); /* top-k / top-p / greedy settings cut some of the top 6 */
}

/* ------------------------------------------------------------------------------------------ */
/* Generates with each setting (raw and processed, n samples), then scores every output's
 * continuation in one engine run with other traffic; the bits must agree. */
static void test_score_equals_generate(void **state) {
    ctx *c = *state;
    const int V = c->cfg.vocab_size;
    rw_err err = {0};
    enum { NS = 10, NSAMP = 2 };
    int32_t prompt[NS][80];
    int plen[NS];
    rw_sampling sp[NS];
    rw_output *gen[NS][NSAMP];
    rw_engine_opts o = rw_engine_opts_default();
    rw_engine *e;
    RW_ASSERT_OK(rw_engine_create(c->m, &o, &e, &err), &err);
    for (int k = 0; k < NS; k++) {
        plen[k] = 5 + 7 * k;
        rw_random_prompt(prompt[k], plen[k], V, 200 + (uint64_t)k);
        sp[k] = setting(k);
        sp[k].logprob_mode = k >= 5 ? RW_LOGPROB_PROCESSED : RW_LOGPROB_RAW;
        sp[k].top_logprobs = k % 3 ? 4 : 0;
        rw_request_opts ro = {.n_samples = NSAMP};
        RW_ASSERT_OK(rw_engine_add_ex(e, (uint64_t)k * 10, prompt[k], plen[k], &sp[k], &ro, &err),
                     &err);
    }
    RW_ASSERT_OK(rw_engine_run(e, &err), &err);
    rw_output *out;
    while ((out = rw_engine_pop_output(e)))
        gen[out->id / 10][out->id % 10] = out;
    /* score on a second engine: small token budget (chunked), the scores mixed with generation
     * requests, and a second round on the now cached prefixes */
    rw_engine_opts so = rw_engine_opts_default();
    so.max_batch_tokens = 23;
    rw_engine *e2;
    RW_ASSERT_OK(rw_engine_create(c->m, &so, &e2, &err), &err);
    int scored = 0;
    for (int round = 0; round < 2; round++) {
        for (int k = 0; k < NS; k++)
            for (int s = 0; s < NSAMP; s++) {
                const rw_output *g = gen[k][s];
                int32_t seq[160];
                memcpy(seq, prompt[k], sizeof(int32_t) * (size_t)plen[k]);
                memcpy(seq + plen[k], g->tokens, sizeof(int32_t) * (size_t)g->n);
                rw_request_opts ro = {.n_score = g->n, .prompt_logprobs = round == 1 && s == 0};
                RW_ASSERT_OK(rw_engine_add_ex(e2, (uint64_t)(round * 1000 + k * 10 + s), seq,
                                              plen[k] + g->n, &sp[k], &ro, &err),
                             &err);
                if (k % 4 == 0) { /* other traffic in the same batches */
                    rw_sampling t = setting(k + 1);
                    RW_ASSERT_OK(rw_engine_add(e2, (uint64_t)(50000 + round * 100 + k * 10 + s),
                                               seq, plen[k], &t, &err),
                                 &err);
                }
            }
        RW_ASSERT_OK(rw_engine_run(e2, &err), &err);
        while ((out = rw_engine_pop_output(e2))) {
            if (out->id >= 50000) {
                rw_output_free(out);
                continue;
            }
            const int k = (int)(out->id % 1000) / 10, s = (int)(out->id % 10);
            const rw_output *g = gen[k][s];
            char what[64];
            snprintf(what, sizeof what, "round %d setting %d sample %d", round, k, s);
            assert_int_equal(out->n_prompt, plen[k]);
            rw_out_same(out, g, what);
            assert_int_equal(out->finish, RW_FINISH_LENGTH);
            if (out->prompt_logprobs) {
                /* the teacher-forced logits through the CPU sampler's rule for the given token */
                assert_true(isnan(out->prompt_logprobs[0]));
                float *lg = malloc(sizeof(float) * (size_t)plen[k] * V);
                RW_ASSERT_OK(rw_model_score(c->m, prompt[k], plen[k], lg, &err), &err);
                for (int j = 1; j < plen[k]; j++) {
                    float lp;
                    int32_t ti[RW_MAX_TOP_LOGPROBS];
                    float tl[RW_MAX_TOP_LOGPROBS];
                    uint8_t scratch[512 * 8];
                    RW_ASSERT_OK(rw_logprob_row_ref(lg + (size_t)(j - 1) * V, V, &sp[k],
                                                    prompt[k][j], scratch, &lp, ti, tl, &err),
                                 &err);
                    if (memcmp(&lp, &out->prompt_logprobs[j], 4) != 0)
                        fail_msg("%s prompt token %d: %.9g, teacher-forced %.9g", what, j,
                                 out->prompt_logprobs[j], lp);
                }
                free(lg);
            } else {
                assert_null(out->prompt_logprobs);
            }
            scored++;
            rw_output_free(out);
        }
    }
    rw_engine_stats st;
    rw_engine_stats_get(e2, &st);
    print_message("%d scores equal generate's logprobs bit for bit; %lld tokens scored, %lld "
                  "prefix hits\n",
                  scored, (long long)st.score_tokens, (long long)st.prefix_hits);
    assert_int_equal(scored, 2 * NS * NSAMP);
    assert_true(st.prefix_hits > 0);
    for (int k = 0; k < NS; k++)
        for (int s = 0; s < NSAMP; s++)
            rw_output_free(gen[k][s]);
    rw_engine_destroy(e2);
    rw_engine_destroy(e);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_processed_logprobs),
        cmocka_unit_test(test_score_equals_generate),
    };
    return cmocka_run_group_tests(tests, rw_fixture_model_setup, rw_fixture_model_teardown);
}
