/* test_experts_gpu.c - CUDA routing and experts against the CPU references (gpu suite):
 * rw_moe_route_cuda == rw_moe_route_ref (ids exact, weights within 1e-6); rw_moe_experts_cuda vs
 * rw_moe_experts_ref on the same packed bytes for bf16, mxfp8 and fp8-block, padded and unpadded
 * shards, decode-sized (narrow tiles) and prefill-sized (wide tiles, several passes) batches;
 * runs are bit-identical and token-by-token equals the whole batch bit for bit. */
#include <cuda_runtime_api.h>

#include "test_experts_util.h"

/* The kernel rounds silu(gate) * up to bf16 (and fp8-block weights to bf16) where the reference
 * keeps fp32: relative to the largest output, errors stay well below this. */
#define CUDA_EXPERTS_TOL 1.5e-2

#define CK(x)                                                                                      \
    do {                                                                                           \
        cudaError_t e_ = (x);                                                                      \
        if (e_ != cudaSuccess) fail_msg("%s: %s", #x, cudaGetErrorString(e_));                     \
    } while (0)

static void *to_dev(const void *h, size_t n) {
    void *d = NULL;
    CK(cudaMalloc(&d, n ? n : 16));
    if (n) CK(cudaMemcpy(d, h, n, cudaMemcpyHostToDevice));
    return d;
}

static rw_tensor dev_view(const rw_tensor *t, void *d) {
    rw_tensor v = *t;
    v.data = d;
    v.place = RW_PLACE_DEVICE;
    return v;
}

static void test_route(void **state) {
    (void)state;
    const int E = 128, k = 8, T = 333;
    float *l = malloc(sizeof(float) * T * E);
    rw_rng r;
    rw_rng_seed(&r, 3);
    for (int i = 0; i < T * E; i++)
        l[i] = 1.5f * rw_rng_normal(&r);
    l[7 * E + 3] = l[7 * E + 100] = 9.0f; /* a tie */
    int32_t *ids = malloc(sizeof(int32_t) * T * k), *gids = malloc(sizeof(int32_t) * T * k);
    float *w = malloc(sizeof(float) * T * k), *gw = malloc(sizeof(float) * T * k);
    float *dl = to_dev(l, sizeof(float) * T * E);
    int32_t *did;
    float *dw;
    CK(cudaMalloc((void **)&did, sizeof(int32_t) * T * k));
    CK(cudaMalloc((void **)&dw, sizeof(float) * T * k));
    for (int renorm = 0; renorm < 2; renorm++) {
        rw_err err = {0};
        rw_moe_route_ref(l, T, E, k, renorm, ids, w);
        RW_ASSERT_OK(rw_moe_route_cuda(dl, T, E, k, renorm, did, dw, NULL, &err), &err);
        CK(cudaMemcpy(gids, did, sizeof(int32_t) * T * k, cudaMemcpyDeviceToHost));
        CK(cudaMemcpy(gw, dw, sizeof(float) * T * k, cudaMemcpyDeviceToHost));
        rw_assert_bytes_equal(gids, ids, sizeof(int32_t) * T * k, "route ids");
        for (int i = 0; i < T * k; i++)
            if (fabsf(gw[i] - w[i]) > 1e-6f) fail_msg("route weight %d: %g vs %g", i, gw[i], w[i]);
    }
    rw_err err = {0};
    assert_int_equal(rw_moe_route_cuda(dl, T, 2000, k, true, did, dw, NULL, &err),
                     RW_E_UNSUPPORTED);
    cudaFree(dl);
    cudaFree(did);
    cudaFree(dw);
    free(l);
    free(ids);
    free(gids);
    free(w);
    free(gw);
}

static void check(rw_wfmt fmt, int E, int I, int H, int T, int r, int k, int ntok, uint64_t seed) {
    canon c;
    canon_random(&c, E, I, H, seed);
    packed_layer pl;
    build_rank(&c, fmt, T, r, &pl);
    rw_layer_weights lw = pl.lw;
    lw.w13 = dev_view(&pl.lw.w13, to_dev(pl.w13, rw_tensor_nbytes(&pl.lw.w13)));
    lw.w2 = dev_view(&pl.lw.w2, to_dev(pl.w2, rw_tensor_nbytes(&pl.lw.w2)));
    if (fmt != RW_WFMT_BF16) {
        lw.w13_scale =
            dev_view(&pl.lw.w13_scale, to_dev(pl.s13, rw_tensor_nbytes(&pl.lw.w13_scale)));
        lw.w2_scale = dev_view(&pl.lw.w2_scale, to_dev(pl.s2, rw_tensor_nbytes(&pl.lw.w2_scale)));
    }
    /* inputs: bf16 activations (the kernel's input type), the reference sees the same values */
    uint16_t *xb = malloc(sizeof(uint16_t) * (size_t)ntok * H);
    float *xf = malloc(sizeof(float) * (size_t)ntok * H);
    float *lg = malloc(sizeof(float) * (size_t)ntok * E);
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)ntok * k);
    float *w = malloc(sizeof(float) * (size_t)ntok * k);
    rw_rng rng;
    rw_rng_seed(&rng, seed + 9);
    for (int64_t i = 0; i < (int64_t)ntok * H; i++) {
        xb[i] = rw_f32_to_bf16(rw_rng_normal(&rng));
        xf[i] = rw_bf16_to_f32(xb[i]);
    }
    for (int64_t i = 0; i < (int64_t)ntok * E; i++)
        lg[i] = rw_rng_normal(&rng);
    rw_moe_route_ref(lg, ntok, E, k, true, ids, w);
    if (ntok > 3) ids[3 * k] = -1; /* not a local expert */
    float *ref = calloc((size_t)ntok * H, sizeof(float));
    rw_err err = {0};
    const size_t nws = rw_moe_experts_ref_workspace(E, pl.d.P, H, k);
    void *ws = malloc(nws);
    RW_ASSERT_OK(rw_moe_experts_ref_ws(&pl.lw, &pl.d, H, xf, ntok, ids, w, k, ref, ws, nws, &err),
                 &err);
    free(ws);

    uint16_t *dx = to_dev(xb, sizeof(uint16_t) * (size_t)ntok * H);
    int32_t *did = to_dev(ids, sizeof(int32_t) * (size_t)ntok * k);
    float *dw = to_dev(w, sizeof(float) * (size_t)ntok * k);
    float *dout;
    CK(cudaMalloc((void **)&dout, sizeof(float) * (size_t)ntok * H));
    const size_t gws = rw_moe_experts_cuda_workspace(E, pl.d.P, H, ntok, k);
    void *dws;
    CK(cudaMalloc(&dws, gws));
    float *got = malloc(sizeof(float) * (size_t)ntok * H);
    float *again = malloc(sizeof(float) * (size_t)ntok * H);
    /* out accumulates: start from 0.5 */
    float *half = malloc(sizeof(float) * (size_t)ntok * H);
    for (int64_t i = 0; i < (int64_t)ntok * H; i++)
        half[i] = 0.5f;
    for (int run = 0; run < 2; run++) {
        CK(cudaMemcpy(dout, half, sizeof(float) * (size_t)ntok * H, cudaMemcpyHostToDevice));
        RW_ASSERT_OK(
            rw_moe_experts_cuda(&lw, &pl.d, H, dx, ntok, did, dw, k, dout, dws, gws, NULL, &err),
            &err);
        CK(cudaDeviceSynchronize());
        CK(cudaMemcpy(run ? again : got, dout, sizeof(float) * (size_t)ntok * H,
                      cudaMemcpyDeviceToHost));
    }
    rw_assert_bytes_equal(got, again, sizeof(float) * (size_t)ntok * H, "rerun");
    double mx = 0, worst = 0;
    int64_t wi = 0;
    for (int64_t i = 0; i < (int64_t)ntok * H; i++)
        mx = fmax(mx, fabs(ref[i]));
    for (int64_t i = 0; i < (int64_t)ntok * H; i++) {
        const double e = fabs((got[i] - 0.5) - ref[i]);
        if (e > worst) worst = e, wi = i;
    }
    print_message("%s E=%d I=%d H=%d T=%d r=%d ntok=%d: max |err| %.3g of max |out| %.3g\n",
                  fmt == RW_WFMT_BF16    ? "bf16"
                  : fmt == RW_WFMT_MXFP8 ? "mxfp8"
                                         : "fp8-block",
                  E, I, H, T, r, ntok, worst, mx);
    assert_true(mx > 1e-3);
    if (worst > CUDA_EXPERTS_TOL * mx)
        fail_msg("max error %g at %lld (got %g, want %g), tolerance %g", worst, (long long)wi,
                 got[wi] - 0.5, ref[wi], CUDA_EXPERTS_TOL * mx);
    /* batch invariance: each output element is one thread's fixed-order sum */
    if (ntok <= 64) {
        for (int t = 0; t < ntok; t++) {
            CK(cudaMemset(dout, 0, sizeof(float) * H));
            RW_ASSERT_OK(rw_moe_experts_cuda(&lw, &pl.d, H, dx + (size_t)t * H, 1, did + t * k,
                                             dw + t * k, k, dout, dws, gws, NULL, &err),
                         &err);
            float *one = malloc(sizeof(float) * H);
            CK(cudaMemcpy(one, dout, sizeof(float) * H, cudaMemcpyDeviceToHost));
            for (int h = 0; h < H; h++)
                one[h] += 0.5f;
            rw_assert_bytes_equal(one, got + (size_t)t * H, sizeof(float) * H, "token alone");
            free(one);
        }
    }
    cudaFree((void *)lw.w13.data);
    cudaFree((void *)lw.w2.data);
    if (fmt != RW_WFMT_BF16) {
        cudaFree((void *)lw.w13_scale.data);
        cudaFree((void *)lw.w2_scale.data);
    }
    cudaFree(dx);
    cudaFree(did);
    cudaFree(dw);
    cudaFree(dout);
    cudaFree(dws);
    free(xb);
    free(xf);
    free(lg);
    free(ids);
    free(w);
    free(ref);
    free(got);
    free(again);
    free(half);
    free_rank(&pl);
    canon_free(&c);
}

static void test_bf16(void **s) {
    (void)s;
    check(RW_WFMT_BF16, 8, 96, 128, 2, 1, 2, 37, 1);    /* padded, narrow tiles */
    check(RW_WFMT_BF16, 8, 256, 256, 2, 0, 2, 600, 2);  /* unpadded, wide tiles */
    check(RW_WFMT_BF16, 4, 256, 128, 1, 0, 2, 4500, 3); /* more than one 4096-token pass */
}
static void test_mxfp8(void **s) {
    (void)s;
    check(RW_WFMT_MXFP8, 8, 96, 128, 1, 0, 2, 37, 4);
    check(RW_WFMT_MXFP8, 8, 256, 256, 2, 1, 2, 600, 5);
}
static void test_fp8_block(void **s) {
    (void)s;
    check(RW_WFMT_FP8_BLOCK, 8, 96, 128, 2, 0, 2, 37, 6);
    check(RW_WFMT_FP8_BLOCK, 8, 256, 256, 1, 0, 3, 600, 7);
}

int main(void) {
    rw_test_require_gpu(1);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_route),
        cmocka_unit_test(test_bf16),
        cmocka_unit_test(test_mxfp8),
        cmocka_unit_test(test_fp8_block),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
