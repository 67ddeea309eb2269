/* test_gemm_gpu.c - the dense GEMM of the CUDA backend (worker/kernels/gemm.h) on random inputs
 * (gpu suite): against the double-precision reference within the fp32 accumulation bound, split
 * hi/lo activations against the reference on the fp32 activations (and the unsplit product shown
 * to miss that bound), rows bit for bit the same whatever batch they are computed in, the same
 * bits from a captured graph, the K-split workspace's counters left zero, and the status of bad
 * arguments. Shapes whose K is split (rw_k_gemm_splits > 1) are among all of them. */
#include <math.h>

#include "rw_test.h"
#include "rw_test_cuda.h"
#include "kernels/gemm.h"

/* Error bounds, relative to S = sum_k |w x| of the element. The products of bf16 values are exact
 * in fp32; summing n of them in fp32 errs by at most n u S, u = 2^-24 with round-to-nearest and
 * 2^-23 if the tensor cores truncate, so the bound takes u = 2^-23 and one extra k16 step; the
 * reference's own rounding to fp32 adds 2^-24 |y|. */
#define U23 (1.0 / 8388608.0)
#define U24 (1.0 / 16777216.0)
/* hi = bf16(a), lo = bf16(a - hi) (the subtraction is exact): |a - hi - lo| <= 2^-8 |a - hi| <=
 * 2^-16 |a| with bf16's 8-bit significand */
#define SPLIT_REL (1.0 / 65536.0)

/* hi = bf16(a), lo = bf16(a - hi) */
static void split(const float *a, size_t n, uint16_t *hi, uint16_t *lo) {
    for (size_t i = 0; i < n; i++) {
        hi[i] = rw_f32_to_bf16(a[i]);
        if (lo) lo[i] = rw_bf16_split_lo(a[i], hi[i]);
    }
}

/* One workspace for every call (gemm.h: counters zeroed once, left zero by each call). */
#define WS_BYTES ((size_t)64 << 20)
static void *g_ws;
static void *ws_for(int64_t N, int64_t K, int64_t M) {
    if (rw_k_gemm_ws_bytes(N, K, M) > WS_BYTES)
        fail_msg("N %lld K %lld M %lld needs %zu workspace bytes, the test has %zu", (long long)N,
                 (long long)K, (long long)M, rw_k_gemm_ws_bytes(N, K, M), WS_BYTES);
    if (!g_ws) {
        g_ws = rw_tdev_alloc(WS_BYTES);
        RW_TCK(cudaMemset(g_ws, 0, WS_BYTES));
    }
    return g_ws;
}
#define GEMM(W, N, K, x, lo, M, Y, st, err)                                                        \
    rw_k_gemm(W, N, K, x, lo, M, Y, ws_for(N, K, M), WS_BYTES, st, err)

/* Y = gemm on the device; host arrays in and out */
static void run_gemm(const uint16_t *W, int64_t N, int64_t K, const uint16_t *x, const uint16_t *lo,
                     int64_t M, float *Y) {
    uint16_t *dW = rw_tdev_put(W, 2 * (size_t)(N * K)), *dx = rw_tdev_put(x, 2 * (size_t)(M * K));
    uint16_t *dl = lo ? rw_tdev_put(lo, 2 * (size_t)(M * K)) : NULL;
    float *dY = rw_tdev_alloc(4 * (size_t)(M * N));
    rw_err err = {0};
    RW_ASSERT_OK(GEMM(dW, N, K, dx, dl, M, dY, NULL, &err), &err);
    rw_tdev_get(Y, dY, 4 * (size_t)(M * N));
    cudaFree(dW);
    cudaFree(dx);
    cudaFree(dl);
    cudaFree(dY);
}

typedef struct shape {
    int64_t N, K, M;
} shape;

/* Partial weight tiles (N not a multiple of 16 or of the tile), K not a multiple of 16 or 64, and
 * M from one token to several token tiles; {2048, 4096} and {5120, 2048} are the model's o_proj
 * and q/k/v. K is split (rw_k_gemm_splits) in 4 (q/k/v; {200, 1032}: the last slice 72
 * columns, ending in half a k16 step; {200, 2056}, which 8 slices would leave empty) and 8
 * (o_proj, {64, 4096}; {64, 8192}: slices of 1024 columns, longer than gemv.cu's ring);
 * at M <= 8 the slices go to separate CTAs, at larger M each CTA folds them. */
static const shape k_shapes[] = {
    {256, 128, 37}, {128, 128, 1},    {512, 128, 300}, {128, 64, 9},     {64, 32, 130},
    {200, 40, 65},  {1000, 104, 513}, {2048, 4096, 3}, {5120, 2048, 16}, {200, 1032, 37},
    {200, 1032, 5}, {64, 4096, 600},  {5120, 2048, 1}, {200, 2056, 3},   {200, 2056, 40},
    {64, 8192, 3},
};

/* (a) no split: Y vs the reference on the same bf16 activations */
static void test_nosplit(void **state) {
    (void)state;
    for (size_t si = 0; si < sizeof k_shapes / sizeof k_shapes[0]; si++) {
        const int64_t N = k_shapes[si].N, K = k_shapes[si].K, M = k_shapes[si].M;
        uint16_t *W = malloc(2 * (size_t)(N * K)), *x = malloc(2 * (size_t)(M * K));
        float *a = malloc(4 * (size_t)(M * K));
        float *Y = malloc(4 * (size_t)(M * N)), *R = malloc(4 * (size_t)(M * N));
        rw_test_fill_bf16(W, (size_t)(N * K), 100 + si, 1.0f);
        rw_test_fill_f32(a, (size_t)(M * K), 200 + si, 1.0f);
        split(a, (size_t)(M * K), x, NULL);
        run_gemm(W, N, K, x, NULL, M, Y);
        rw_k_gemm_ref(W, N, K, x, NULL, M, R);
        double worst = 0.0; /* largest error / bound */
        for (int64_t m = 0; m < M; m++)
            for (int64_t n = 0; n < N; n++) {
                double S = 0.0;
                for (int64_t k = 0; k < K; k++)
                    S += fabs((double)rw_bf16_to_f32(W[n * K + k]) * rw_bf16_to_f32(x[m * K + k]));
                const double r = R[m * N + n], y = Y[m * N + n];
                const double tol = S * (double)(K + 16) * U23 + fabs(r) * U24 + 1e-30;
                if (!(fabs(y - r) <= tol))
                    fail_msg("N %lld K %lld M %lld: Y[%lld, %lld] = %.9g vs reference %.9g "
                             "(bound %.3g)",
                             (long long)N, (long long)K, (long long)M, (long long)m, (long long)n,
                             y, r, tol);
                if (fabs(y - r) / tol > worst) worst = fabs(y - r) / tol;
            }
        print_message("no split N %lld K %lld M %lld: largest error %.3f of the bound\n",
                      (long long)N, (long long)K, (long long)M, worst);
        free(W);
        free(x);
        free(a);
        free(Y);
        free(R);
    }
}

/* (b) split: Y(hi, lo) vs the reference on the fp32 activations; for K <= 128 the bound is tight
 * enough that the unsplit Y(hi) must miss it somewhere */
static void test_split(void **state) {
    (void)state;
    for (size_t si = 0; si < sizeof k_shapes / sizeof k_shapes[0]; si++) {
        const int64_t N = k_shapes[si].N, K = k_shapes[si].K, M = k_shapes[si].M;
        uint16_t *W = malloc(2 * (size_t)(N * K)), *hi = malloc(2 * (size_t)(M * K)),
                 *lo = malloc(2 * (size_t)(M * K));
        float *a = malloc(4 * (size_t)(M * K));
        float *Y = malloc(4 * (size_t)(M * N)), *Y1 = malloc(4 * (size_t)(M * N));
        rw_test_fill_bf16(W, (size_t)(N * K), 300 + si, 1.0f);
        rw_test_fill_f32(a, (size_t)(M * K), 400 + si, 1.0f);
        split(a, (size_t)(M * K), hi, lo);
        run_gemm(W, N, K, hi, lo, M, Y);
        run_gemm(W, N, K, hi, NULL, M, Y1);
        double worst = 0.0, worst1 = 0.0;
        int64_t miss1 = 0;
        for (int64_t m = 0; m < M; m++)
            for (int64_t n = 0; n < N; n++) {
                double r = 0.0, S = 0.0, S2 = 0.0;
                for (int64_t k = 0; k < K; k++) {
                    const double w = rw_bf16_to_f32(W[n * K + k]);
                    r += w * a[m * K + k];
                    S += fabs(w * a[m * K + k]);
                    S2 += fabs(w) * (fabs(rw_bf16_to_f32(hi[m * K + k])) +
                                     fabs(rw_bf16_to_f32(lo[m * K + k])));
                }
                /* activation error, then 2K exact products summed in fp32 */
                const double tol = S * SPLIT_REL + S2 * (double)(2 * K + 16) * U23 + 1e-30;
                const double y = Y[m * N + n], e1 = fabs(Y1[m * N + n] - r);
                if (!(fabs(y - r) <= tol))
                    fail_msg("split N %lld K %lld M %lld: Y[%lld, %lld] = %.9g vs fp32-activation "
                             "reference %.9g (bound %.3g)",
                             (long long)N, (long long)K, (long long)M, (long long)m, (long long)n,
                             y, r, tol);
                if (fabs(y - r) / tol > worst) worst = fabs(y - r) / tol;
                if (e1 / tol > worst1) worst1 = e1 / tol;
                miss1 += e1 > tol;
            }
        print_message("split N %lld K %lld M %lld: largest error %.3f of the bound; without lo "
                      "%.1f of it, %lld of %lld elements outside\n",
                      (long long)N, (long long)K, (long long)M, worst, worst1, (long long)miss1,
                      (long long)(M * N));
        if (K <= 128 && miss1 == 0)
            fail_msg("split N %lld K %lld M %lld: the unsplit product meets the split bound "
                     "everywhere (the bound does not measure the split)",
                     (long long)N, (long long)K, (long long)M);
        free(W);
        free(hi);
        free(lo);
        free(a);
        free(Y);
        free(Y1);
    }
}

/* (c) batch invariance: every row of batches of 1, 2, 7, 16, 33, 64, 100, 129 and 256 rows (each
 * sample row at a different position, the other rows drawn from elsewhere in the batch) is
 * byte-identical to the same row of one batch of 300 rows; a second run of the 300 rows too.
 * Where K is split, batches of up to 7 rows give the slices separate CTAs (on sm_90a builds
 * gemv.cu's clusters) and the others fold them. On sm_90a builds the batches of 16 to 300 rows
 * run on the wgmma tiles wherever K's slices are whole stages (the model's shapes among them:
 * 16 to 100 rows on the 64-token tiles, 128 x 64 or 64 x 64; q/k/v's 256 rows on the 128 x 96
 * tile of one-wave grids, on a GPU of at least 120 SMs), and the batches of 1, 2 and 7 on
 * mma.sync tiles: this is where the two instructions are held to the same bits. */
#define INV_M 300
static void check_invariance(int64_t N, int64_t K, bool with_lo, uint64_t seed) {
    static const int32_t samples[] = {0, 1, 5, 8, 63, 100, 128, 255, 299};
    static const int64_t batches[] = {1, 2, 7, 16, 33, 64, 100, 129, 256};
    const int64_t M = INV_M, maxb = 256;
    uint16_t *W = malloc(2 * (size_t)(N * K)), *hi = malloc(2 * (size_t)(M * K)),
             *lo = malloc(2 * (size_t)(M * K));
    float *a = malloc(4 * (size_t)(M * K));
    float *Y = malloc(4 * (size_t)(M * N)), *Y2 = malloc(4 * (size_t)(M * N));
    float *Yb = malloc(4 * (size_t)(maxb * N));
    rw_test_fill_bf16(W, (size_t)(N * K), seed, 1.0f);
    rw_test_fill_f32(a, (size_t)(M * K), seed + 1, 1.0f);
    split(a, (size_t)(M * K), hi, lo);
    uint16_t *dW = rw_tdev_put(W, 2 * (size_t)(N * K)), *dx = rw_tdev_put(hi, 2 * (size_t)(M * K));
    uint16_t *dl = with_lo ? rw_tdev_put(lo, 2 * (size_t)(M * K)) : NULL;
    uint16_t *dxb = rw_tdev_alloc(2 * (size_t)(maxb * K)),
             *dlb = rw_tdev_alloc(2 * (size_t)(maxb * K));
    float *dY = rw_tdev_alloc(4 * (size_t)(M * N)), *dYb = rw_tdev_alloc(4 * (size_t)(maxb * N));
    rw_err err = {0};
    RW_ASSERT_OK(GEMM(dW, N, K, dx, dl, M, dY, NULL, &err), &err);
    rw_tdev_get(Y, dY, 4 * (size_t)(M * N));
    RW_TCK(cudaMemset(dY, 0xff, 4 * (size_t)(M * N)));
    RW_ASSERT_OK(GEMM(dW, N, K, dx, dl, M, dY, NULL, &err), &err);
    rw_tdev_get(Y2, dY, 4 * (size_t)(M * N));
    rw_assert_bytes_equal(Y2, Y, 4 * (size_t)(M * N), "rerun of the 300-row batch");
    int32_t src[256];
    char what[160];
    for (size_t si = 0; si < sizeof samples / sizeof samples[0]; si++)
        for (size_t bi = 0; bi < sizeof batches / sizeof batches[0]; bi++) {
            const int64_t mb = batches[bi], r = samples[si];
            const int64_t p = (r + mb / 2) % mb; /* where the sample row sits */
            for (int64_t j = 0; j < mb; j++) {
                src[j] = (int32_t)(((r + (j - p) * 37) % M + M) % M);
                RW_TCK(cudaMemcpy(dxb + j * K, dx + (int64_t)src[j] * K, 2 * (size_t)K,
                                  cudaMemcpyDeviceToDevice));
                if (with_lo)
                    RW_TCK(cudaMemcpy(dlb + j * K, dl + (int64_t)src[j] * K, 2 * (size_t)K,
                                      cudaMemcpyDeviceToDevice));
            }
            RW_TCK(cudaMemset(dYb, 0xff, 4 * (size_t)(mb * N)));
            RW_ASSERT_OK(GEMM(dW, N, K, dxb, with_lo ? dlb : NULL, mb, dYb, NULL, &err), &err);
            rw_tdev_get(Yb, dYb, 4 * (size_t)(mb * N));
            for (int64_t j = 0; j < mb; j++) {
                snprintf(what, sizeof what,
                         "N %lld K %lld%s: row %d at %lld of a batch of %lld vs the batch of 300",
                         (long long)N, (long long)K, with_lo ? " split" : "", (int)src[j],
                         (long long)j, (long long)mb);
                rw_assert_bytes_equal(Yb + j * N, Y + (int64_t)src[j] * N, 4 * (size_t)N, what);
            }
        }
    cudaFree(dW);
    cudaFree(dx);
    cudaFree(dl);
    cudaFree(dxb);
    cudaFree(dlb);
    cudaFree(dY);
    cudaFree(dYb);
    free(W);
    free(hi);
    free(lo);
    free(a);
    free(Y);
    free(Y2);
    free(Yb);
}

static void test_batch_invariance(void **state) {
    (void)state;
    /* partial weight tiles (72, 200, 1000), K = 40 (a partial 64-column block and a half k16
     * step), the model's shapes, whose tile choice differs between the batch sizes, and 266
     * weight tiles of 128 rows (two per SM of a 132-SM GPU and more: with one bf16 input, the
     * lm_head's form, the batches of 129 and 256 rows run on 128 x 256 tiles, the 300 rows on
     * 128 x 128) */
    static const int64_t nk[][2] = {{256, 128}, {72, 40},     {200, 40},    {1000, 104},
                                    {128, 64},  {5120, 2048}, {2048, 4096}, {200, 1032},
                                    {64, 4096}, {64, 8192},   {34048, 64}};
    for (size_t i = 0; i < sizeof nk / sizeof nk[0]; i++) {
        check_invariance(nk[i][0], nk[i][1], false, 500 + 2 * i);
        check_invariance(nk[i][0], nk[i][1], true, 501 + 2 * i);
    }
}

/* (e) a captured graph gives the bits of the direct call (nothing in the launcher breaks a
 * capture in the strictest mode) */
static void check_graph(int64_t N, int64_t K, int64_t M) {
    uint16_t *W = malloc(2 * N * K), *hi = malloc(2 * M * K), *lo = malloc(2 * M * K);
    float *a = malloc(4 * M * K), *Y = malloc(4 * M * N), *Yg = malloc(4 * M * N);
    rw_test_fill_bf16(W, (size_t)(N * K), 700, 1.0f);
    rw_test_fill_f32(a, (size_t)(M * K), 701, 1.0f);
    split(a, (size_t)(M * K), hi, lo);
    uint16_t *dW = rw_tdev_put(W, 2 * N * K), *dx = rw_tdev_put(hi, 2 * M * K),
             *dl = rw_tdev_put(lo, 2 * M * K);
    float *dY = rw_tdev_alloc(4 * M * N), *dYg = rw_tdev_alloc(4 * M * N);
    rw_err err = {0};
    RW_ASSERT_OK(GEMM(dW, N, K, dx, dl, M, dY, NULL, &err), &err);
    rw_tdev_get(Y, dY, 4 * M * N);
    cudaStream_t st;
    RW_TCK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    cudaGraph_t g;
    cudaGraphExec_t ge;
    RW_TCK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
    const rw_status s1 = GEMM(dW, N, K, dx, dl, M, dYg, st, &err);
    RW_TCK(cudaStreamEndCapture(st, &g));
    RW_ASSERT_OK(s1, &err);
    RW_TCK(cudaGraphInstantiate(&ge, g, 0));
    char what[96];
    for (int rep = 0; rep < 2; rep++) { /* the split's counters are ready again for a replay */
        RW_TCK(cudaMemset(dYg, 0xff, 4 * M * N));
        RW_TCK(cudaGraphLaunch(ge, st));
        RW_TCK(cudaStreamSynchronize(st));
        rw_tdev_get(Yg, dYg, 4 * M * N);
        snprintf(what, sizeof what, "N %lld K %lld M %lld: graph replay %d vs direct call",
                 (long long)N, (long long)K, (long long)M, rep);
        rw_assert_bytes_equal(Yg, Y, 4 * M * N, what);
    }
    RW_TCK(cudaGraphExecDestroy(ge));
    RW_TCK(cudaGraphDestroy(g));
    RW_TCK(cudaStreamDestroy(st));
    cudaFree(dW);
    cudaFree(dx);
    cudaFree(dl);
    cudaFree(dY);
    cudaFree(dYg);
    free(W);
    free(hi);
    free(lo);
    free(a);
    free(Y);
    free(Yg);
}

static void test_graph(void **state) {
    (void)state;
    check_graph(1000, 104, 7);
    check_graph(2048, 4096, 7); /* K split in 8 */
}

/* (f) the K split's counters: zero after every call of the tests before (each call's last CTA of
 * a tile resets that tile's counter) */
static void test_counters_left_zero(void **state) {
    (void)state;
    unsigned *c = malloc(RW_K_GEMM_COUNTERS * sizeof(unsigned));
    RW_TCK(cudaDeviceSynchronize());
    rw_tdev_get(c, ws_for(1, 8, 1), RW_K_GEMM_COUNTERS * sizeof(unsigned));
    for (int i = 0; i < RW_K_GEMM_COUNTERS; i++)
        if (c[i]) fail_msg("workspace counter %d is %u after the calls, not 0", i, c[i]);
    free(c);
    /* the documented shapes split as the header says; a split shape asks for a workspace */
    assert_int_equal(rw_k_gemm_splits(2048, 4096), 8);
    assert_int_equal(rw_k_gemm_splits(200, 1032), 4);
    assert_int_equal(rw_k_gemm_splits(5120, 2048), 4);
    assert_int_equal(rw_k_gemm_splits(151936, 2048), 1);
    assert_true(rw_k_gemm_ws_bytes(151936, 2048, 256) == 0);
    assert_true(rw_k_gemm_ws_bytes(2048, 4096, 1) > 0);
    /* past RW_K_GEMM_SPLIT_ROWS rows the slices fold in one CTA: no more workspace */
    assert_true(rw_k_gemm_ws_bytes(2048, 4096, 256) == rw_k_gemm_ws_bytes(2048, 4096, 8));
}

/* (d) bad arguments */
static void test_bad_args(void **state) {
    (void)state;
    uint16_t *dW = rw_tdev_alloc(2 * 64 * 64), *dx = rw_tdev_alloc(2 * 64 * 64);
    float *dY = rw_tdev_alloc(4 * 64 * 64);
    rw_err err = {0};
    rw_assert_status(rw_k_gemm(NULL, 0, 0, NULL, NULL, 0, NULL, NULL, 0, NULL, &err), RW_OK, &err,
                     NULL, "M = 0");
    rw_assert_status(rw_k_gemm(dW, 64, 64, dx, NULL, -1, dY, NULL, 0, NULL, &err), RW_E_INVALID_ARG,
                     &err, "-1", "M = -1");
    rw_assert_status(rw_k_gemm(dW, 0, 64, dx, NULL, 4, dY, NULL, 0, NULL, &err), RW_E_INVALID_ARG,
                     &err, "N = 0", "N = 0");
    rw_assert_status(rw_k_gemm(dW, 64, 0, dx, NULL, 4, dY, NULL, 0, NULL, &err), RW_E_INVALID_ARG,
                     &err, "K = 0", "K = 0");
    rw_assert_status(rw_k_gemm(dW, 64, 12, dx, NULL, 4, dY, NULL, 0, NULL, &err), RW_E_UNSUPPORTED,
                     &err, "K = 12", "K = 12");
    rw_assert_status(rw_k_gemm(NULL, 64, 64, dx, NULL, 4, dY, NULL, 0, NULL, &err),
                     RW_E_INVALID_ARG, &err, "NULL", "W NULL");
    rw_assert_status(rw_k_gemm(dW, 64, 64, NULL, NULL, 4, dY, NULL, 0, NULL, &err),
                     RW_E_INVALID_ARG, &err, "NULL", "x NULL");
    rw_assert_status(rw_k_gemm(dW, 64, 64, dx, NULL, 4, NULL, NULL, 0, NULL, &err),
                     RW_E_INVALID_ARG, &err, "NULL", "Y NULL");
    rw_assert_status(rw_k_gemm(dW + 1, 64, 64, dx, NULL, 4, dY, NULL, 0, NULL, &err),
                     RW_E_INVALID_ARG, &err, "aligned", "W misaligned");
    rw_assert_status(rw_k_gemm(dW, 64, 64, dx + 4, NULL, 4, dY, NULL, 0, NULL, &err),
                     RW_E_INVALID_ARG, &err, "aligned", "x misaligned");
    rw_assert_status(rw_k_gemm(dW, 64, 64, dx, dx + 1, 4, dY, NULL, 0, NULL, &err),
                     RW_E_INVALID_ARG, &err, "aligned", "x_lo misaligned");
    rw_assert_status(
        rw_k_gemm(dW, 64, 64, dx, NULL, 4, (float *)((char *)dY + 2), NULL, 0, NULL, &err),
        RW_E_INVALID_ARG, &err, "aligned", "Y misaligned");
    /* a float offset of Y (a column slice of a wider output) is fine */
    rw_assert_status(rw_k_gemm(dW, 32, 64, dx, NULL, 4, dY + 1, NULL, 0, NULL, &err), RW_OK, &err,
                     NULL, "Y at a 4-byte offset");
    /* a shape whose K is split, without a workspace or with too small a one */
    uint16_t *dW2 = rw_tdev_alloc(2 * 64 * 4096), *dx2 = rw_tdev_alloc(2 * 4 * 4096);
    const size_t need = rw_k_gemm_ws_bytes(64, 4096, 4);
    rw_assert_status(rw_k_gemm(dW2, 64, 4096, dx2, NULL, 4, dY, NULL, 0, NULL, &err),
                     RW_E_INVALID_ARG, &err, "workspace", "split K without a workspace");
    rw_assert_status(
        rw_k_gemm(dW2, 64, 4096, dx2, NULL, 4, dY, ws_for(64, 4096, 4), need - 4, NULL, &err),
        RW_E_INVALID_ARG, &err, "workspace", "split K with a short workspace");
    RW_TCK(cudaDeviceSynchronize());
    cudaFree(dW);
    cudaFree(dx);
    cudaFree(dY);
    cudaFree(dW2);
    cudaFree(dx2);
}

int main(void) {
    rw_test_require_gpu(1);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_nosplit),          cmocka_unit_test(test_split),
        cmocka_unit_test(test_batch_invariance), cmocka_unit_test(test_graph),
        cmocka_unit_test(test_bad_args),         cmocka_unit_test(test_counters_left_zero),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
