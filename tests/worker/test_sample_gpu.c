/* test_sample_gpu.c - the CUDA backend's sampling (worker/kernels/sample.cu) against its plain-C
 * reference (gpu suite): greedy, logprobs and top-n exactly or within 1e-5, sampled tokens equal
 * to the reference's for nearly every row, and bit-identical reruns; processed logprobs and given
 * tokens (scoring) within 1e-4 of the reference. */
#include <math.h>

#include "rw_test.h"
#include "rw_test_cuda.h"
#include "kernels/sample.h"
#include "rw_worker.h"

/* The sampling kernel on n requests p over logits l [rows, V]: the results into got, after
 * checking that a second run gives the same bytes. */
static void sample_gpu(const float *l, int64_t rows, int64_t n, int64_t V,
                       const rw_k_sample_param *p, rw_k_sample_out *got, const char *what) {
    rw_k_sample_out *again = calloc((size_t)n, sizeof *again);
    float *dl = rw_tdev_put(l, 4 * rows * V);
    rw_k_sample_param *dp = rw_tdev_put(p, sizeof *p * n);
    rw_k_sample_out *dout;
    RW_TCK(cudaMalloc((void **)&dout, sizeof *dout * n));
    const size_t wb = rw_k_sample_ws_bytes(n, V);
    void *ws;
    RW_TCK(cudaMalloc(&ws, wb));
    rw_err err = {0};
    /* a workspace too small is refused, naming the size it needs */
    const rw_status bad = rw_k_sample(dl, n, V, dp, dout, ws, wb - 1, NULL, &err);
    assert_int_equal(bad, RW_E_INVALID_ARG);
    assert_non_null(strstr(err.msg, "workspace"));
    RW_ASSERT_OK(rw_k_sample(dl, n, V, dp, dout, ws, wb, NULL, &err), &err);
    rw_tdev_get(got, dout, sizeof *got * n);
    RW_ASSERT_OK(rw_k_sample(dl, n, V, dp, dout, ws, wb, NULL, &err), &err);
    rw_tdev_get(again, dout, sizeof *again * n);
    rw_assert_bytes_equal(got, again, sizeof *got * n, what);
    /* each request alone (its row first in a batch of one): the same bytes as in the batch */
    for (int64_t i = 0; i < n; i += 37) {
        rw_k_sample_out one;
        RW_ASSERT_OK(rw_k_sample(dl, 1, V, dp + i, dout, ws, wb, NULL, &err), &err);
        rw_tdev_get(&one, dout, sizeof one);
        const int tn = p[i].top_n < 20 ? p[i].top_n : 20;
        if (one.token != got[i].token || memcmp(&one.logprob, &got[i].logprob, 4) ||
            memcmp(one.top_ids, got[i].top_ids, 4 * (size_t)tn) ||
            memcmp(one.top_lps, got[i].top_lps, 4 * (size_t)tn))
            fail_msg("%s: request %lld alone gives token %d (%a), batched %d (%a)", what,
                     (long long)i, one.token, one.logprob, got[i].token, got[i].logprob);
    }
    cudaFree(dl);
    cudaFree(dp);
    cudaFree(dout);
    cudaFree(ws);
    free(again);
}

/* n requests over a vocabulary of V: draws, greedy rows, top-k and top-p limits, top-n lists,
 * against the reference. */
static void sample_case(int64_t n, int64_t V) {
    float *l = malloc(4 * n * V);
    rw_test_fill_f32(l, (size_t)(n * V), 16, 3.0f);
    rw_k_sample_param *p = calloc((size_t)n, sizeof *p);
    for (int i = 0; i < n; i++) {
        p[i].row = (int32_t)(n - 1 - i); /* rows in another order than requests */
        p[i].forced = -1;                /* draws (given tokens: test_sample_processed) */
        p[i].seed = 1000 + (uint64_t)i;
        p[i].position = 17 + i;
        p[i].top_p = 1.0f;
        p[i].top_n = i % 5 == 0 ? 20 : i % 7;
        switch (i % 4) {
        case 0: break; /* greedy */
        case 1: p[i].temperature = 1.0f; break;
        case 2:
            p[i].temperature = 0.7f;
            p[i].top_k = 50;
            break;
        case 3:
            p[i].temperature = 1.2f;
            p[i].top_p = 0.8f;
            p[i].top_k = i % 8 == 3 ? 0 : 500;
            break;
        }
    }
    rw_k_sample_out *ref = calloc((size_t)n, sizeof *ref), *got = calloc((size_t)n, sizeof *got);
    rw_k_sample_ref(l, n, V, p, ref);
    sample_gpu(l, n, n, V, p, got, "sampling rerun");
    int same = 0, sampled = 0;
    for (int i = 0; i < n; i++) {
        const float *row = l + (int64_t)p[i].row * V;
        if (p[i].temperature == 0.0f) {
            assert_int_equal(got[i].token, ref[i].token);
        } else {
            sampled++;
            same += got[i].token == ref[i].token;
        }
        assert_true(got[i].token >= 0 && got[i].token < V);
        /* logprob = raw logit - logsumexp, the normaliser in double here (the reference sums
         * exp in fp32 in index order: over 151,936 ids that alone drifts past 1e-4) */
        double mx = row[0], se = 0.0;
        for (int64_t v = 1; v < V; v++)
            mx = row[v] > mx ? row[v] : mx;
        for (int64_t v = 0; v < V; v++)
            se += exp(row[v] - mx);
        const double lse = mx + log(se);
        if (!(fabs(got[i].logprob - (row[got[i].token] - lse)) < 1e-4))
            fail_msg("V %lld request %d: logprob %.7g, logit - lse %.7g (reference %.7g)",
                     (long long)V, i, got[i].logprob, row[got[i].token] - lse, ref[i].logprob);
        for (int j = 0; j < p[i].top_n; j++) {
            assert_int_equal(got[i].top_ids[j], ref[i].top_ids[j]);
            assert_true(fabs(got[i].top_lps[j] - (row[got[i].top_ids[j]] - lse)) < 1e-4);
        }
        if (p[i].top_k > 0) { /* the token is inside the top-k */
            int above = 0;
            for (int64_t v = 0; v < V; v++)
                above += row[v] > row[got[i].token];
            assert_true(above < p[i].top_k);
        }
    }
    print_message("V %lld: sampled rows: %d of %d draw the reference's token\n", (long long)V, same,
                  sampled);
    /* only exp() rounding differs from the reference: boundary cases are rare */
    assert_true(same >= sampled - 2);
    free(l);
    free(p);
    free(ref);
    free(got);
}

/* A vocabulary of 2 chunks (the second of 907 ids) and the 30B-A3B one (38 chunks). */
static void test_sample(void **state) {
    (void)state;
    sample_case(240, 5003);
    sample_case(24, 151936);
}

/* More requests than one launch of the chunk passes takes (65535): requests i and i + 100 sample
 * the same row with the same parameters, so every request must equal request i % 100, across
 * the launches' boundary; and those match the reference. */
static void test_sample_many(void **state) {
    (void)state;
    const int64_t rows = 100, n = 65535 + 300, V = 5003;
    float *l = malloc(4 * rows * V);
    rw_test_fill_f32(l, (size_t)(rows * V), 41, 3.0f);
    rw_k_sample_param *p = calloc((size_t)n, sizeof *p);
    for (int64_t i = 0; i < n; i++) {
        const int r = (int)(i % rows);
        p[i].row = r;
        p[i].forced = -1;
        p[i].seed = 7000 + (uint64_t)r;
        p[i].position = 5 + r;
        p[i].top_p = 1.0f;
        p[i].top_n = r % 3;
        p[i].temperature = r % 2 ? 1.0f : 0.0f;
    }
    rw_k_sample_out *got = calloc((size_t)n, sizeof *got), *ref = calloc((size_t)rows, sizeof *ref);
    sample_gpu(l, rows, n, V, p, got, "many requests rerun");
    rw_k_sample_ref(l, rows, V, p, ref);
    for (int64_t i = 0; i < n; i++) {
        const rw_k_sample_out *a = &got[i], *b = &got[i % rows];
        const int tn = p[i].top_n;
        if (a->token != b->token || memcmp(&a->logprob, &b->logprob, 4) ||
            memcmp(a->top_ids, b->top_ids, 4 * (size_t)tn))
            fail_msg("request %lld: token %d (%a), request %lld: %d (%a)", (long long)i, a->token,
                     a->logprob, (long long)(i % rows), b->token, b->logprob);
    }
    int same = 0;
    for (int64_t r = 0; r < rows; r++) {
        if (p[r].temperature == 0.0f) assert_int_equal(got[r].token, ref[r].token);
        same += got[r].token == ref[r].token;
    }
    assert_true(same >= rows - 2);
    free(l);
    free(p);
    free(got);
    free(ref);
}

/* Processed logprobs (mode 1) and given tokens (forced >= 0) against the reference: given tokens
 * exactly; logprobs and top-n within 1e-4 (the kernel sums the kept mass in a fixed tree, the
 * reference in index order), -inf exactly where the reference has it; greedy rows 0 / -inf;
 * a drawn token's processed logprob equals the one of the same token given; bit-identical
 * reruns. */
static void test_sample_processed(void **state) {
    (void)state;
    const int64_t n = 200, V = 4099;
    float *l = malloc(4 * n * V);
    rw_test_fill_f32(l, (size_t)(n * V), 23, 2.5f);
    rw_k_sample_param *p = calloc((size_t)n, sizeof *p);
    for (int i = 0; i < n; i++) {
        p[i].row = (int32_t)((i * 7) % n);
        p[i].seed = 500 + (uint64_t)i;
        p[i].position = 3 + i;
        p[i].top_p = 1.0f;
        p[i].top_n = i % 3 ? 6 : 0;
        p[i].mode = i % 5 == 4 ? 0 : 1;          /* mostly processed, some raw given tokens */
        p[i].forced = i % 2 ? (int32_t)((i * 131) % V) : -1;
        switch (i % 4) {
        case 0: break; /* greedy */
        case 1: p[i].temperature = 0.9f; break;
        case 2:
            p[i].temperature = 1.1f;
            p[i].top_k = 60;
            break;
        case 3:
            p[i].temperature = 0.8f;
            p[i].top_p = 0.85f;
            p[i].top_k = i % 8 == 3 ? 0 : 300;
            break;
        }
    }
    rw_k_sample_out *ref = calloc((size_t)n, sizeof *ref), *got = calloc((size_t)n, sizeof *got),
                    *again = calloc((size_t)n, sizeof *again);
    rw_k_sample_ref(l, n, V, p, ref);
    sample_gpu(l, n, n, V, p, got, "processed sampling rerun");
    int inf = 0, same = 0, drawn = 0;
    for (int i = 0; i < n; i++) {
        if (p[i].forced >= 0) assert_int_equal(got[i].token, p[i].forced);
        if (p[i].temperature == 0.0f) assert_int_equal(got[i].token, ref[i].token);
        const bool tok_same = got[i].token == ref[i].token;
        if (p[i].forced < 0 && p[i].temperature > 0.0f) {
            drawn++;
            same += tok_same;
        }
        if (tok_same) {
            if (isinf(ref[i].logprob)) {
                assert_true(isinf(got[i].logprob) && got[i].logprob < 0);
                inf++;
            } else if (!(fabsf(got[i].logprob - ref[i].logprob) < 1e-4f)) {
                fail_msg("row %d: logprob %.7g, reference %.7g (mode %d, forced %d)", i,
                         got[i].logprob, ref[i].logprob, p[i].mode, p[i].forced);
            }
        }
        for (int j = 0; j < p[i].top_n; j++) {
            assert_int_equal(got[i].top_ids[j], ref[i].top_ids[j]);
            if (isinf(ref[i].top_lps[j]))
                assert_true(isinf(got[i].top_lps[j]) && got[i].top_lps[j] < 0);
            else
                assert_true(fabsf(got[i].top_lps[j] - ref[i].top_lps[j]) < 1e-4f);
        }
        if (p[i].mode == 1 && p[i].temperature == 0.0f && p[i].forced < 0)
            assert_true(got[i].logprob == 0.0f);
    }
    /* a drawn token given back: the same processed logprob bits */
    for (int i = 0; i < n; i++)
        if (p[i].forced < 0) p[i].forced = got[i].token;
    sample_gpu(l, n, n, V, p, again, "given tokens rerun");
    for (int i = 0; i < n; i++)
        rw_assert_bytes_equal(&again[i].logprob, &got[i].logprob, 4, "drawn vs given logprob");
    print_message("processed / given: %d of %d draws equal the reference's token, %d -inf\n",
                  same, drawn, inf);
    assert_true(same >= drawn - 2);
    assert_true(inf > 0);
    free(l);
    free(p);
    free(ref);
    free(got);
    free(again);
}

/* Temperatures too small to invert (1/T or max logit / T not finite in float) sample greedily on
 * the device as in the reference: the argmax of each row, whatever the seed, top-k or top-p
 * (before, every mass was NaN and the draw returned the last id of the vocabulary). */
static void test_sample_tiny_temperature(void **state) {
    (void)state;
    static const float temps[] = {1.4e-45f, 1e-42f, 1e-40f, 1e-39f, 2.9e-39f, 3e-39f, 1e-38f};
    const int nt = (int)(sizeof temps / sizeof *temps);
    const int64_t n = 4 * nt, V = 5003;
    float *l = malloc(4 * n * V);
    rw_test_fill_f32(l, (size_t)(n * V), 23, 40.0f); /* large logits: max / T overflows */
    rw_k_sample_param *p = calloc((size_t)n, sizeof *p);
    for (int i = 0; i < n; i++) {
        p[i].row = i;
        p[i].seed = 77 + (uint64_t)i;
        p[i].position = i;
        p[i].temperature = temps[i % nt];
        p[i].top_p = i / nt == 1 ? 0.5f : 1.0f;
        p[i].top_k = i / nt == 2 ? 40 : 0;
        p[i].top_n = 3;
        p[i].forced = -1; /* draw (not a given token) */
    }
    rw_k_sample_out *ref = calloc((size_t)n, sizeof *ref), *got = calloc((size_t)n, sizeof *got);
    rw_k_sample_ref(l, n, V, p, ref);
    sample_gpu(l, n, n, V, p, got, "tiny temperature rerun");
    for (int i = 0; i < n; i++) {
        const float *row = l + (int64_t)i * V;
        int32_t arg = 0;
        for (int64_t v = 1; v < V; v++)
            if (row[v] > row[arg]) arg = (int32_t)v;
        if (got[i].token != arg || ref[i].token != arg)
            fail_msg("row %d (T %g): device %d, reference %d, argmax %d", i,
                     (double)p[i].temperature, got[i].token, ref[i].token, arg);
    }
    free(l);
    free(p);
    free(ref);
    free(got);
}

int main(void) {
    rw_test_require_gpu(1);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sample),
        cmocka_unit_test(test_sample_many),
        cmocka_unit_test(test_sample_processed),
        cmocka_unit_test(test_sample_tiny_temperature),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
