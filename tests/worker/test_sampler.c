/* test_sampler.c - the sampling rule (rw_sample_row_ref, rw_sample_uniform) and the thread
 * communicator: greedy and its logprob, top-n logprobs, determinism from (seed, position),
 * frequencies against the softmax, top-k / top-p support, bad parameters; all-reduce and
 * all-gather over thread ranks. */
#include <math.h>
#include <pthread.h>

#include "rw_test.h"
#include "kernels/sample.h"
#include "rw_worker.h"

static void random_logits(float *l, int V, uint64_t seed, float scale) {
    rw_rng r;
    rw_rng_seed(&r, seed);
    for (int i = 0; i < V; i++)
        l[i] = scale * rw_rng_normal(&r);
}

static double lse(const float *l, int V) {
    double mx = -1e300, s = 0;
    for (int i = 0; i < V; i++)
        mx = fmax(mx, l[i]);
    for (int i = 0; i < V; i++)
        s += exp(l[i] - mx);
    return mx + log(s);
}

static void test_greedy_and_logprobs(void **state) {
    (void)state;
    enum { V = 1000 };
    float l[V];
    random_logits(l, V, 1, 3.0f);
    l[17] = 20.0f;
    l[400] = 20.0f; /* tie: the lower id wins */
    static uint8_t scratch[V * 12];
    rw_sampling sp = rw_sampling_default();
    sp.top_logprobs = 5;
    int32_t tok, ids[5];
    float lp, lps[5];
    rw_err err = {0};
    RW_ASSERT_OK(rw_sample_row_ref(l, V, &sp, 3, scratch, &tok, &lp, ids, lps, &err), &err);
    assert_int_equal(tok, 17);
    const double z = lse(l, V);
    assert_true(fabs(lp - (l[17] - z)) < 1e-5);
    assert_int_equal(ids[0], 17);
    assert_int_equal(ids[1], 400);
    for (int j = 0; j < 5; j++) {
        assert_true(fabs(lps[j] - (l[ids[j]] - z)) < 1e-5);
        if (j) assert_true(lps[j] <= lps[j - 1]);
        for (int i = 0; i < V; i++) /* nothing outside the top-n beats the n-th */
            if (l[i] > l[ids[4]]) {
                bool in = false;
                for (int q = 0; q < 5; q++)
                    in |= ids[q] == i;
                assert_true(in);
            }
    }
    /* top_k == 1 is greedy even with a temperature */
    sp.temperature = 1.5f;
    sp.top_k = 1;
    RW_ASSERT_OK(rw_sample_row_ref(l, V, &sp, 99, scratch, &tok, &lp, NULL, NULL, &err), &err);
    assert_int_equal(tok, 17);
}

/* Temperatures too small to invert in float (1/T, or the largest logit / T, not finite) sample
 * greedily, on the CPU sampler (rw_sample_row_ref) and on the CUDA kernel's reference
 * (rw_k_sample_ref) alike: the argmax, for every seed, top-k and top-p. Before, 1/T overflowed,
 * every mass was NaN and both returned the last id of the vocabulary. Temperatures that can be
 * inverted still sample. */
static void test_tiny_temperature(void **state) {
    (void)state;
    enum { V = 777, NT = 9 };
    static const float temps[NT] = {1.4e-45f, 1e-44f, 1e-42f, 1e-40f, 1e-39f,
                                    2.9e-39f, 3e-39f, 1e-38f, 1e-37f};
    static uint8_t scratch[V * 12];
    float l[V];
    rw_k_sample_param kp[3 * NT];
    rw_k_sample_out ko[3 * NT];
    float *rows = malloc(sizeof(float) * V * 3 * NT);
    for (int i = 0; i < 3 * NT; i++) {
        /* scale 50: the largest logit / T overflows for every T here but 1e-37 at some rows */
        random_logits(rows + (size_t)i * V, V, 500 + (uint64_t)i, i % 2 ? 50.0f : 0.3f);
        kp[i] = (rw_k_sample_param){.temperature = temps[i % NT],
                                    .top_p = i / NT == 1 ? 0.3f : 1.0f,
                                    .top_k = i / NT == 2 ? 25 : 0,
                                    .top_n = 2,
                                    .seed = 9 + (uint64_t)i,
                                    .position = i,
                                    .forced = -1, /* draw (not a given token) */
                                    .row = i};
    }
    rw_k_sample_ref(rows, 3 * NT, V, kp, ko);
    int checked = 0;
    for (int i = 0; i < 3 * NT; i++) {
        const float *r = rows + (size_t)i * V;
        int32_t arg = 0;
        for (int v = 1; v < V; v++)
            if (r[v] > r[arg]) arg = v;
        const float inv_t = rw_sample_inv_temperature(kp[i].temperature, kp[i].top_k, r[arg]);
        memcpy(l, r, sizeof l);
        rw_sampling sp = rw_sampling_default();
        sp.temperature = kp[i].temperature;
        sp.top_p = kp[i].top_p;
        sp.top_k = kp[i].top_k;
        sp.seed = kp[i].seed;
        int32_t tok;
        float lp;
        rw_err err = {0};
        RW_ASSERT_OK(
            rw_sample_row_ref(l, V, &sp, kp[i].position, scratch, &tok, &lp, NULL, NULL, &err),
            &err);
        if (inv_t == 0.0f || kp[i].temperature < 1e-38f) {
            if (tok != arg || ko[i].token != arg)
                fail_msg("T %g (row %d): CPU sampler %d, kernel reference %d, argmax %d",
                         (double)kp[i].temperature, i, tok, ko[i].token, arg);
            checked++;
        }
        assert_true(tok >= 0 && tok < V && ko[i].token >= 0 && ko[i].token < V);
        assert_true(isfinite(lp) && isfinite(ko[i].logprob));
    }
    assert_true(checked >= 3 * (NT - 2));
    /* the rule itself: greedy exactly when 1/T or max * (1/T) is not finite */
    assert_true(rw_sample_inv_temperature(1e-40f, 0, 1.0f) == 0.0f);
    assert_true(rw_sample_inv_temperature(3e-39f, 0, 0.5f) > 0.0f);
    assert_true(rw_sample_inv_temperature(3e-39f, 0, 2.0f) == 0.0f);
    assert_true(rw_sample_inv_temperature(3e-39f, 0, -2.0f) == 0.0f);
    assert_true(rw_sample_inv_temperature(0.7f, 0, 30.0f) == 1.0f / 0.7f);
    assert_true(rw_sample_inv_temperature(0.7f, 1, 30.0f) == 0.0f);
    assert_true(rw_sample_inv_temperature(0.0f, 0, 30.0f) == 0.0f);
    /* a temperature that can be inverted still samples: not always the argmax */
    random_logits(l, V, 4, 0.5f);
    rw_sampling sp = rw_sampling_default();
    sp.temperature = 1.0f;
    int differ = 0;
    int32_t arg = 0;
    for (int v = 1; v < V; v++)
        if (l[v] > l[arg]) arg = v;
    for (int pos = 0; pos < 50; pos++) {
        int32_t tok;
        rw_err err = {0};
        RW_ASSERT_OK(rw_sample_row_ref(l, V, &sp, pos, scratch, &tok, NULL, NULL, NULL, &err),
                     &err);
        differ += tok != arg;
    }
    assert_true(differ > 10);
    free(rows);
}

static void test_uniform(void **state) {
    (void)state;
    /* depends only on (seed, position) and is spread over [0, 1) */
    double sum = 0;
    int distinct = 0;
    float prev = -1;
    for (int p = 0; p < 10000; p++) {
        const float u = rw_sample_uniform(42, p);
        assert_true(u >= 0.0f && u < 1.0f);
        assert_true(u == rw_sample_uniform(42, p));
        sum += u;
        distinct += u != prev;
        prev = u;
    }
    assert_true(fabs(sum / 10000 - 0.5) < 0.02);
    assert_true(distinct > 9990);
    assert_true(rw_sample_uniform(42, 5) != rw_sample_uniform(43, 5));
}

static void test_frequencies(void **state) {
    (void)state;
    enum { V = 6, N = 60000 };
    const float l[V] = {1.0f, 0.5f, -1.0f, 2.0f, 0.0f, 1.5f};
    rw_sampling sp = rw_sampling_default();
    sp.temperature = 0.7f;
    sp.seed = 1234;
    static uint8_t scratch[V * 12];
    int cnt[V] = {0};
    rw_err err = {0};
    for (int p = 0; p < N; p++) {
        int32_t tok;
        float lp;
        RW_ASSERT_OK(rw_sample_row_ref(l, V, &sp, p, scratch, &tok, &lp, NULL, NULL, &err), &err);
        assert_true(tok >= 0 && tok < V);
        cnt[tok]++;
        /* the logprob is of the raw (temperature-free) distribution */
        assert_true(fabs(lp - (l[tok] - lse(l, V))) < 1e-5);
    }
    double z = 0, p[V];
    for (int i = 0; i < V; i++)
        z += exp(l[i] / 0.7);
    for (int i = 0; i < V; i++) {
        p[i] = exp(l[i] / 0.7) / z;
        const double sd = sqrt(N * p[i] * (1 - p[i]));
        if (fabs(cnt[i] - N * p[i]) > 5 * sd + 1)
            fail_msg("token %d: %d draws, expected %.1f (sd %.1f)", i, cnt[i], N * p[i], sd);
    }
}

static void test_top_k_top_p(void **state) {
    (void)state;
    enum { V = 300 };
    float l[V];
    random_logits(l, V, 9, 2.0f);
    static uint8_t scratch[V * 12];
    rw_err err = {0};
    /* the k-th largest logit */
    float sorted[V];
    memcpy(sorted, l, sizeof l);
    for (int i = 0; i < V; i++)
        for (int j = i + 1; j < V; j++)
            if (sorted[j] > sorted[i]) {
                float t = sorted[i];
                sorted[i] = sorted[j];
                sorted[j] = t;
            }
    rw_sampling sp = rw_sampling_default();
    sp.temperature = 1.0f;
    sp.top_k = 7;
    sp.seed = 5;
    int seen_k = 0;
    bool hit[V] = {0};
    for (int p = 0; p < 3000; p++) {
        int32_t tok;
        RW_ASSERT_OK(rw_sample_row_ref(l, V, &sp, p, scratch, &tok, NULL, NULL, NULL, &err), &err);
        assert_true(l[tok] >= sorted[6]);
        if (!hit[tok]) seen_k++;
        hit[tok] = true;
    }
    assert_int_equal(seen_k, 7); /* all seven are reachable */
    /* top-p: the nucleus is the shortest descending prefix with mass >= p */
    sp.top_k = 0;
    sp.top_p = 0.5f;
    double z = 0;
    for (int i = 0; i < V; i++)
        z += exp(l[i] - sorted[0]);
    double cum = 0;
    float thr = sorted[0];
    for (int i = 0; i < V; i++) {
        cum += exp(sorted[i] - sorted[0]) / z;
        if (cum >= 0.5) {
            thr = sorted[i];
            break;
        }
    }
    memset(hit, 0, sizeof hit);
    int seen_p = 0, nucleus = 0;
    for (int i = 0; i < V; i++)
        nucleus += l[i] >= thr;
    for (int p = 0; p < 5000; p++) {
        int32_t tok;
        RW_ASSERT_OK(rw_sample_row_ref(l, V, &sp, p, scratch, &tok, NULL, NULL, NULL, &err), &err);
        assert_true(l[tok] >= thr);
        if (!hit[tok]) seen_p++;
        hit[tok] = true;
    }
    assert_true(nucleus > 1);
    assert_int_equal(seen_p, nucleus);
    /* non-finite logits are refused with a clear error */
    float bad[3] = {NAN, NAN, NAN};
    int32_t tok;
    assert_int_equal(rw_sample_row_ref(bad, 3, &sp, 0, scratch, &tok, NULL, NULL, NULL, &err),
                     RW_E_RANGE);
}

/* --- thread communicator ------------------------------------------------------------------ */
typedef struct comm_args {
    rw_comm *c;
    int rank, size;
    int ok;
} comm_args;

static void *comm_rank(void *p) {
    comm_args *a = p;
    enum { N = 1000 };
    float buf[N], want[N];
    rw_err err = {0};
    a->ok = 1;
    for (int i = 0; i < N; i++)
        buf[i] = (float)(a->rank + 1) * 0.25f + (float)i;
    for (int i = 0; i < N; i++) {
        float s = 0;
        for (int r = 0; r < a->size; r++)
            s += (float)(r + 1) * 0.25f + (float)i;
        want[i] = s;
    }
    if (rw_comm_allreduce_f32(a->c, buf, N, NULL, &err) != RW_OK) a->ok = 0;
    for (int i = 0; i < N; i++)
        if (buf[i] != want[i]) a->ok = 0;
    int32_t send[3] = {a->rank, a->rank * 10, -a->rank}, recv[3 * 8];
    if (rw_comm_allgather(a->c, send, recv, sizeof send, NULL, &err) != RW_OK) a->ok = 0;
    for (int r = 0; r < a->size; r++)
        if (recv[3 * r] != r || recv[3 * r + 1] != 10 * r || recv[3 * r + 2] != -r) a->ok = 0;
    /* mismatched sizes are reported on every rank instead of corrupting memory */
    if (a->size > 1 &&
        rw_comm_allreduce_f32(a->c, buf, a->rank == 0 ? 10 : 11, NULL, &err) != RW_E_INVALID_ARG)
        a->ok = 0;
    return NULL;
}

/* Processed logprobs and given tokens: the drawn token's logprob is the same bits whether drawn
 * or given (rw_logprob_row_ref); the kept set's probabilities sum to 1; an id outside it is
 * -inf; greedy puts all mass on the argmax; a raw given token is log_softmax. */
static void test_processed_and_given(void **state) {
    (void)state;
    enum { V = 700 };
    float l[V];
    static uint8_t scratch[V * 12];
    rw_err err = {0};
    const struct {
        float t, p;
        int k;
    } cases[] = {{0.9f, 1.0f, 0}, {1.3f, 1.0f, 40}, {0.6f, 0.85f, 0}, {1.0f, 0.7f, 90}};
    for (int c = 0; c < 4; c++) {
        random_logits(l, V, 50 + (uint64_t)c, 2.5f);
        rw_sampling sp = rw_sampling_default();
        sp.temperature = cases[c].t;
        sp.top_p = cases[c].p;
        sp.top_k = cases[c].k;
        sp.logprob_mode = RW_LOGPROB_PROCESSED;
        sp.seed = 9;
        double mass = 0;
        int kept = 0;
        for (int i = 0; i < V; i++) {
            float lp;
            RW_ASSERT_OK(rw_logprob_row_ref(l, V, &sp, i, scratch, &lp, NULL, NULL, &err), &err);
            if (isinf(lp)) continue;
            mass += exp(lp);
            kept++;
        }
        assert_true(fabs(mass - 1.0) < 1e-5);
        if (cases[c].k) assert_true(kept <= cases[c].k);
        if (cases[c].p < 1.0f || cases[c].k) assert_true(kept < V);
        for (int pos = 0; pos < 20; pos++) {
            int32_t tok;
            float lp, lp2;
            RW_ASSERT_OK(rw_sample_row_ref(l, V, &sp, pos, scratch, &tok, &lp, NULL, NULL, &err),
                         &err);
            RW_ASSERT_OK(rw_logprob_row_ref(l, V, &sp, tok, scratch, &lp2, NULL, NULL, &err), &err);
            assert_true(isfinite(lp));
            rw_assert_bytes_equal(&lp, &lp2, 4, "drawn vs given token's logprob");
        }
    }
    /* greedy: 0 for the argmax, -inf elsewhere; raw given tokens: log_softmax */
    random_logits(l, V, 7, 3.0f);
    rw_sampling g = rw_sampling_default();
    g.logprob_mode = RW_LOGPROB_PROCESSED;
    int arg = 0;
    for (int i = 1; i < V; i++)
        if (l[i] > l[arg]) arg = i;
    float lp;
    RW_ASSERT_OK(rw_logprob_row_ref(l, V, &g, arg, scratch, &lp, NULL, NULL, &err), &err);
    assert_true(lp == 0.0f);
    RW_ASSERT_OK(rw_logprob_row_ref(l, V, &g, (arg + 1) % V, scratch, &lp, NULL, NULL, &err), &err);
    assert_true(isinf(lp) && lp < 0);
    g.logprob_mode = RW_LOGPROB_RAW;
    RW_ASSERT_OK(rw_logprob_row_ref(l, V, &g, 5, scratch, &lp, NULL, NULL, &err), &err);
    assert_true(fabs(lp - (l[5] - lse(l, V))) < 1e-5);
    assert_int_equal(rw_logprob_row_ref(l, V, &g, V, scratch, &lp, NULL, NULL, &err), RW_E_RANGE);
}

static void test_thread_comm(void **state) {
    (void)state;
    for (int size = 1; size <= 4; size++) {
        rw_err err = {0};
        rw_comm_group *g;
        RW_ASSERT_OK(rw_comm_group_create(size, &g, &err), &err);
        comm_args a[4];
        pthread_t th[4];
        for (int r = 0; r < size; r++) {
            a[r] = (comm_args){NULL, r, size, 0};
            RW_ASSERT_OK(rw_comm_create_thread(g, r, &a[r].c, &err), &err);
        }
        for (int r = 0; r < size; r++)
            pthread_create(&th[r], NULL, comm_rank, &a[r]);
        for (int r = 0; r < size; r++)
            pthread_join(th[r], NULL);
        for (int r = 0; r < size; r++) {
            assert_int_equal(a[r].ok, 1);
            rw_comm_destroy(a[r].c);
        }
        rw_comm_group_destroy(g);
    }
    rw_err err = {0};
    rw_comm_group *g;
    assert_int_equal(rw_comm_group_create(0, &g, &err), RW_E_RANGE);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_greedy_and_logprobs), cmocka_unit_test(test_uniform),
        cmocka_unit_test(test_tiny_temperature),    cmocka_unit_test(test_frequencies),
        cmocka_unit_test(test_top_k_top_p),         cmocka_unit_test(test_thread_comm),
        cmocka_unit_test(test_processed_and_given),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
