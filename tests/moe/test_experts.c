/* test_experts.c - routing and the expert computation on the packed layout (docs/LAYOUT.md
 * section 6, last check): a reference MoE (silu(gate) * up, then down, weighted by routing) on
 * UNPACKED canonical weights equals rw_moe_experts_ref on packed weights, for padded and unpadded
 * shards, summed over ranks, for bf16, mxfp8 and fp8-block experts. Also: routing against a
 * brute-force sort, batch invariance (bit-exact), and non-local expert ids contributing nothing. */
#include <math.h>

#include "moe_experts_util.h"

/* fp32 kernel vs fp64 reference on O(1) values with K <= 512: accumulated rounding stays well
 * below this. */
#define TOL_F32 2e-5

static double silu(double g) {
    return g / (1.0 + exp(-g));
}

/* --- routing --------------------------------------------------------------------------- */
static void test_route_matches_sort(void **state) {
    (void)state;
    const int E = 16, k = 4, T = 50;
    float logits[50 * 16];
    rw_rng r;
    rw_rng_seed(&r, 7);
    for (int i = 0; i < T * E; i++)
        logits[i] = 2.0f * rw_rng_normal(&r);
    logits[3 * E + 5] = logits[3 * E + 9] = 10.0f; /* a tie: the lower index must come first */
    int32_t ids[50 * 4];
    float w[50 * 4];
    for (int renorm = 0; renorm < 2; renorm++) {
        rw_moe_route_ref(logits, T, E, k, renorm, ids, w);
        for (int t = 0; t < T; t++) {
            double mx = -1e30, sum = 0, p[16];
            for (int e = 0; e < E; e++)
                mx = fmax(mx, logits[t * E + e]);
            for (int e = 0; e < E; e++)
                sum += exp(logits[t * E + e] - mx);
            for (int e = 0; e < E; e++)
                p[e] = exp(logits[t * E + e] - mx) / sum;
            int order[16];
            for (int e = 0; e < E; e++)
                order[e] = e;
            for (int a = 0; a < E; a++) /* stable selection sort, descending */
                for (int b = a + 1; b < E; b++)
                    if (p[order[b]] > p[order[a]] ||
                        (p[order[b]] == p[order[a]] && order[b] < order[a])) {
                        int x = order[a];
                        order[a] = order[b];
                        order[b] = x;
                    }
            double s = 0;
            for (int j = 0; j < k; j++)
                s += p[order[j]];
            for (int j = 0; j < k; j++) {
                assert_int_equal(ids[t * k + j], order[j]);
                double want = renorm ? p[order[j]] / s : p[order[j]];
                if (fabs(w[t * k + j] - want) > 1e-6)
                    fail_msg("token %d slot %d: weight %g, want %g", t, j, w[t * k + j], want);
            }
        }
        assert_int_equal(ids[3 * k + 0], 5);
        assert_int_equal(ids[3 * k + 1], 9);
    }
}

/* fp64 reference MoE on canonical (unpacked, unsharded) weights. */
static void moe_reference(const canon *c, const float *x, int ntok, const int32_t *ids,
                          const float *w, int k, double *out) {
    const int H = c->H, I = c->I;
    double *act = malloc(sizeof(double) * (size_t)I);
    for (int t = 0; t < ntok; t++)
        for (int h = 0; h < H; h++)
            out[t * H + h] = 0;
    for (int t = 0; t < ntok; t++)
        for (int j = 0; j < k; j++) {
            const int e = ids[t * k + j];
            if (e < 0 || e >= c->E) continue;
            for (int i = 0; i < I; i++) {
                double g = 0, u = 0;
                for (int q = 0; q < H; q++) {
                    g += (double)c->gate[((size_t)e * I + i) * H + q] * x[t * H + q];
                    u += (double)c->up[((size_t)e * I + i) * H + q] * x[t * H + q];
                }
                act[i] = silu(g) * u;
            }
            for (int h = 0; h < H; h++) {
                double s = 0;
                for (int i = 0; i < I; i++)
                    s += (double)c->down[((size_t)e * H + h) * I + i] * act[i];
                out[t * H + h] += w[t * k + j] * s;
            }
        }
    free(act);
}

/* One case: E experts of intermediate I, hidden H, at TP degree T, format fmt. */
static void check_case(rw_wfmt fmt, int E, int I, int H, int T, int k, uint64_t seed) {
    canon c;
    canon_random(&c, E, I, H, seed);
    packed_layer *pl = calloc((size_t)T, sizeof *pl);
    for (int r = 0; r < T; r++)
        build_rank(&c, fmt, T, r, &pl[r]);
    const int ntok = 37;
    float *x = malloc(sizeof(float) * (size_t)ntok * H);
    float *logits = malloc(sizeof(float) * (size_t)ntok * E);
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)ntok * k);
    float *w = malloc(sizeof(float) * (size_t)ntok * k);
    rw_rng rng;
    rw_rng_seed(&rng, seed + 1);
    for (int i = 0; i < ntok * H; i++)
        x[i] = rw_rng_normal(&rng);
    route_random(&rng, ntok, E, k, logits, ids, w);
    ids[5 * k + 1] = -1; /* not a local expert: contributes nothing */
    ids[6 * k + 0] = E;

    double *ref = malloc(sizeof(double) * (size_t)ntok * H);
    moe_reference(&c, x, ntok, ids, w, k, ref);
    float *sum = calloc((size_t)ntok * H, sizeof(float));
    float *part = malloc(sizeof(float) * (size_t)ntok * H);
    for (int r = 0; r < T; r++) {
        /* out accumulates (+=): start from a known non-zero value and subtract it afterwards */
        for (int i = 0; i < ntok * H; i++)
            part[i] = 1.0f;
        rw_err err = {0};
        size_t nws = rw_moe_experts_ref_workspace(E, pl[r].d.P, H, k);
        void *ws = malloc(nws);
        RW_ASSERT_OK(
            rw_moe_experts_ref_ws(&pl[r].lw, &pl[r].d, H, x, ntok, ids, w, k, part, ws, nws, &err),
            &err);
        free(ws);
        for (int i = 0; i < ntok * H; i++)
            sum[i] += part[i] - 1.0f;
    }
    double worst = 0;
    int wi = -1;
    for (int i = 0; i < ntok * H; i++) {
        double e = fabs(sum[i] - ref[i]) / (1.0 + fabs(ref[i]));
        if (e > worst) worst = e, wi = i;
    }
    /* the subtraction of 1.0 above costs up to 2^-24 per rank */
    if (worst > TOL_F32 + T * 1.2e-7)
        fail_msg("%s E=%d I=%d H=%d T=%d: max rel error %g at %d (got %g, want %g)",
                 rw_wfmt_str(fmt), E, I, H, T, worst, wi, sum[wi], ref[wi]);
    double mag = 0;
    for (int i = 0; i < ntok * H; i++)
        mag = fmax(mag, fabs(ref[i]));
    assert_true(mag > 1e-3); /* the reference is not trivially zero */

    /* batch invariance: token by token gives the same bits as the whole batch (rank 0) */
    float *one = malloc(sizeof(float) * (size_t)H);
    float *all = calloc((size_t)ntok * H, sizeof(float));
    rw_moe_experts_ref(&pl[0].lw, &pl[0].d, H, x, ntok, ids, w, k, all);
    for (int t = 0; t < ntok; t++) {
        memset(one, 0, sizeof(float) * (size_t)H);
        rw_moe_experts_ref(&pl[0].lw, &pl[0].d, H, x + t * H, 1, ids + t * k, w + t * k, k, one);
        rw_assert_bytes_equal(one, all + t * H, sizeof(float) * (size_t)H, "batch invariance");
    }
    free(one);
    free(all);
    for (int r = 0; r < T; r++)
        free_rank(&pl[r]);
    free(pl);
    free(x);
    free(logits);
    free(ids);
    free(w);
    free(ref);
    free(sum);
    free(part);
    canon_free(&c);
}

/* I = 96: T=1 gives P=128 (padded), T=2 S=48 P=128 (padded), T=4 S=24 (mxfp8 needs S % 32 == 0,
 * so bf16 and fp8-block only). I = 256: T=2 S=128 = P (unpadded). */
static void test_bf16_padded_t1(void **s) {
    (void)s;
    check_case(RW_WFMT_BF16, 8, 96, 128, 1, 2, 11);
}
static void test_bf16_padded_t2(void **s) {
    (void)s;
    check_case(RW_WFMT_BF16, 8, 96, 128, 2, 2, 12);
}
static void test_bf16_padded_t4(void **s) {
    (void)s;
    check_case(RW_WFMT_BF16, 6, 96, 192, 4, 3, 13);
}
static void test_bf16_unpadded_t2(void **s) {
    (void)s;
    check_case(RW_WFMT_BF16, 4, 256, 128, 2, 2, 14);
}
static void test_mxfp8_padded_t2(void **s) {
    (void)s;
    check_case(RW_WFMT_MXFP8, 8, 96, 128, 2, 2, 15);
}
static void test_mxfp8_unpadded_t2(void **s) {
    (void)s;
    check_case(RW_WFMT_MXFP8, 4, 256, 256, 2, 2, 16);
}
static void test_fp8_block_padded_t2(void **s) {
    (void)s;
    check_case(RW_WFMT_FP8_BLOCK, 8, 96, 128, 2, 2, 17);
}
static void test_fp8_block_unpadded_t1(void **s) {
    (void)s;
    check_case(RW_WFMT_FP8_BLOCK, 4, 256, 192, 1, 2, 18);
}

static void test_bad_args(void **s) {
    (void)s;
    rw_layer_weights lw = {0};
    rw_tp_dims d = {0};
    d.P = 100; /* not a multiple of 128 */
    int64_t sh[4] = {1, 2, 200, 64};
    lw.w13 = rw_tensor_view(NULL, RW_DTYPE_BF16, 4, sh, RW_PLACE_HOST, 0);
    float x[128] = {1}, out[128] = {0}, w = 1;
    int32_t id = 0;
    char ws[16];
    rw_err err = {0};
    assert_int_equal(
        rw_moe_experts_ref_ws(&lw, &d, 128, x, 1, &id, &w, 1, out, ws, sizeof ws, &err),
        RW_E_SHAPE);
    assert_non_null(strstr(err.msg, "P = 100"));
    d.P = 128;
    assert_int_equal(
        rw_moe_experts_ref_ws(&lw, &d, 128, x, 1, &id, &w, 1, out, ws, sizeof ws, &err),
        RW_E_INVALID_ARG);
    assert_non_null(strstr(err.msg, "workspace"));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_route_matches_sort),    cmocka_unit_test(test_bf16_padded_t1),
        cmocka_unit_test(test_bf16_padded_t2),        cmocka_unit_test(test_bf16_padded_t4),
        cmocka_unit_test(test_bf16_unpadded_t2),      cmocka_unit_test(test_mxfp8_padded_t2),
        cmocka_unit_test(test_mxfp8_unpadded_t2),     cmocka_unit_test(test_fp8_block_padded_t2),
        cmocka_unit_test(test_fp8_block_unpadded_t1), cmocka_unit_test(test_bad_args),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
