/* test_experts_gpu.c - CUDA routing and experts against the CPU references (gpu suite):
 * rw_moe_route_cuda == rw_moe_route_ref (ids exact, weights within 1e-6); rw_moe_experts_cuda vs
 * rw_moe_experts_ref on the same packed bytes for bf16, mxfp8 and fp8-block, padded and unpadded
 * shards, decode-sized (narrow tiles) and prefill-sized (wide tiles, several passes) batches;
 * runs are bit-identical and token-by-token equals the whole batch bit for bit. The same for the
 * split input (x_lo != NULL) against the reference on fp32 x: with silu(g)*u a pair too, with a
 * tolerance for ~16-bit activations that the bf16-input path must fail; with silu(g)*u one bf16
 * (what the CUDA backend runs), with that rounding added to the tolerance. */
#include "moe_experts_util.h"
#include "rw_test_cuda.h"

/* The kernel rounds silu(gate) * up to bf16 (and fp8-block weights to bf16) where the reference
 * keeps fp32: relative to the largest output, errors stay well below this. */
#define CUDA_EXPERTS_TOL 1.5e-2

static void *to_dev(const void *h, size_t n) {
    void *d = NULL;
    RW_TCK(cudaMalloc(&d, n ? n : 16));
    if (n) RW_TCK(cudaMemcpy(d, h, n, cudaMemcpyHostToDevice));
    return d;
}

static rw_tensor dev_view(const rw_tensor *t, void *d) {
    rw_tensor v = *t;
    v.data = d;
    v.place = RW_PLACE_DEVICE;
    return v;
}

/* The packed layer with its weights (and scales) copied to the device; layer_free_dev frees them. */
static rw_layer_weights layer_to_dev(const packed_layer *pl) {
    rw_layer_weights lw = pl->lw;
    lw.w13 = dev_view(&pl->lw.w13, to_dev(pl->w13, rw_tensor_nbytes(&pl->lw.w13)));
    lw.w2 = dev_view(&pl->lw.w2, to_dev(pl->w2, rw_tensor_nbytes(&pl->lw.w2)));
    if (pl->lw.moe_fmt != RW_WFMT_BF16) {
        lw.w13_scale =
            dev_view(&pl->lw.w13_scale, to_dev(pl->s13, rw_tensor_nbytes(&pl->lw.w13_scale)));
        lw.w2_scale =
            dev_view(&pl->lw.w2_scale, to_dev(pl->s2, rw_tensor_nbytes(&pl->lw.w2_scale)));
    }
    return lw;
}

static void layer_free_dev(const rw_layer_weights *lw) {
    cudaFree((void *)lw->w13.data);
    cudaFree((void *)lw->w2.data);
    if (lw->moe_fmt != RW_WFMT_BF16) {
        cudaFree((void *)lw->w13_scale.data);
        cudaFree((void *)lw->w2_scale.data);
    }
}

/* moe's route kernel against rw_moe_route_ref: E experts, top-k, T tokens, one tie. */
static void route_case(int E, int k, int T) {
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
    RW_TCK(cudaMalloc((void **)&did, sizeof(int32_t) * T * k));
    RW_TCK(cudaMalloc((void **)&dw, sizeof(float) * T * k));
    for (int renorm = 0; renorm < 2; renorm++) {
        rw_err err = {0};
        rw_moe_route_ref(l, T, E, k, renorm, ids, w);
        RW_ASSERT_OK(rw_moe_route_cuda(dl, T, E, k, renorm, did, dw, NULL, &err), &err);
        RW_TCK(cudaMemcpy(gids, did, sizeof(int32_t) * T * k, cudaMemcpyDeviceToHost));
        RW_TCK(cudaMemcpy(gw, dw, sizeof(float) * T * k, cudaMemcpyDeviceToHost));
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

/* Every width of the routing's logits per lane (route.cuh: 4, 8, 16, 32 for E up to 128, 256,
 * 512, 1024). */
static void test_route(void **state) {
    (void)state;
    route_case(128, 8, 333);
    route_case(200, 8, 41);
    route_case(512, 16, 17);
    route_case(1000, 32, 9);
}

/* Random routing of the batch (one assignment made non-local) and the CPU reference of the layer
 * on fp32 x: a new zeroed [ntok, H] the reference accumulates into. */
static float *route_and_ref(const packed_layer *pl, rw_rng *rng, int E, int H, int k, int ntok,
                            const float *xf, float *lg, int32_t *ids, float *w) {
    route_random(rng, ntok, E, k, lg, ids, w);
    if (ntok > 3) ids[3 * k] = -1; /* not a local expert */
    float *ref = calloc((size_t)ntok * H, sizeof(float));
    rw_err err = {0};
    const size_t nws = rw_moe_experts_ref_workspace(E, pl->d.P, H, k);
    void *ws = malloc(nws);
    RW_ASSERT_OK(
        rw_moe_experts_ref_ws(&pl->lw, &pl->d, H, xf, ntok, ids, w, k, ref, ws, nws, &err), &err);
    free(ws);
    return ref;
}

/* When set, check() multiplies the first 32 gate weights of the first 8 rows of expert 0 by 2^24
 * before quantizing: mxfp8 then gives those blocks scale bytes past RW_E4M3_FAST_SCALE_MAX, which
 * the expert tiles convert through fp32 (mx_fragments.cuh), in the tiles holding those rows
 * only. The tokens that pick expert 0 then carry outputs of about 1e7, so the tolerance, relative
 * to the largest output, is about theirs. */
static bool big_scales;

static void check(rw_wfmt fmt, int E, int I, int H, int T, int r, int k, int ntok, uint64_t seed) {
    canon c;
    canon_random(&c, E, I, H, seed);
    if (big_scales)
        for (int j = 0; j < 8; j++)
            for (int h = 0; h < 32; h++)
                c.gate[(size_t)j * H + h] *= 16777216.0f;
    packed_layer pl;
    build_rank(&c, fmt, T, r, &pl);
    if (big_scales) { /* the blocks did get such scales (expert 0's part of the w13 scales) */
        const int64_t P = pl.d.P, sbytes = rw_roundup(2 * P, 128) * ((H / 32 + 3) / 4) * 4;
        int big = 0;
        for (int64_t i = 0; i < sbytes; i++)
            big += ((const uint8_t *)pl.s13)[i] > RW_E4M3_FAST_SCALE_MAX;
        assert_int_equal(big, 8);
    }
    rw_layer_weights lw = layer_to_dev(&pl);
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
    float *ref = route_and_ref(&pl, &rng, E, H, k, ntok, xf, lg, ids, w);
    rw_err err = {0};

    uint16_t *dx = to_dev(xb, sizeof(uint16_t) * (size_t)ntok * H);
    int32_t *did = to_dev(ids, sizeof(int32_t) * (size_t)ntok * k);
    float *dw = to_dev(w, sizeof(float) * (size_t)ntok * k);
    float *dbuf;
    RW_TCK(cudaMalloc((void **)&dbuf, sizeof(float) * ((size_t)ntok * H + 1)));
    const size_t gws = rw_moe_experts_cuda_workspace(E, pl.d.P, H, ntok, k);
    void *dws;
    RW_TCK(cudaMalloc(&dws, gws));
    float *got = malloc(sizeof(float) * (size_t)ntok * H);
    float *again = malloc(sizeof(float) * (size_t)ntok * H);
    /* out accumulates: start from 0.5 */
    float *half = malloc(sizeof(float) * (size_t)ntok * H);
    for (int64_t i = 0; i < (int64_t)ntok * H; i++)
        half[i] = 0.5f;
    /* the rerun writes out one float past a 16-byte boundary, where the combine reads and writes
     * a column a thread instead of four: the same bits either way */
    for (int run = 0; run < 2; run++) {
        float *dout = dbuf + run;
        RW_TCK(cudaMemcpy(dout, half, sizeof(float) * (size_t)ntok * H, cudaMemcpyHostToDevice));
        RW_ASSERT_OK(rw_moe_experts_cuda(&lw, &pl.d, H, dx, NULL, false, ntok, did, dw, k, dout,
                                         dws, gws, NULL, &err),
                     &err);
        RW_TCK(cudaDeviceSynchronize());
        RW_TCK(cudaMemcpy(run ? again : got, dout, sizeof(float) * (size_t)ntok * H,
                          cudaMemcpyDeviceToHost));
    }
    rw_assert_bytes_equal(got, again, sizeof(float) * (size_t)ntok * H,
                          "rerun with out unaligned (one column a thread in the combine)");
    /* out = NULL (one pass of tokens): the expert rows stay in the workspace where
     * rw_moe_experts_cuda_rows says; summed as the combine sums them (fmaf over the slots in
     * order from 0, then one add to out: what the worker's fused norm does) they give its bits */
    if (ntok <= RW_MOE_CUDA_CHUNK) {
        const int64_t El = lw.w13.shape[0], A = (int64_t)ntok * k;
        RW_ASSERT_OK(rw_moe_experts_cuda(&lw, &pl.d, H, dx, NULL, false, ntok, did, dw, k, NULL,
                                         dws, gws, NULL, &err),
                     &err);
        RW_TCK(cudaDeviceSynchronize());
        const float *dy = NULL;
        const int32_t *dinv = NULL;
        rw_moe_experts_cuda_rows(dws, El, pl.d.P, H, ntok, k, &dy, &dinv);
        float *y = malloc(sizeof(float) * (size_t)(A * H));
        int32_t *inv = malloc(sizeof(int32_t) * (size_t)A);
        float *sum = malloc(sizeof(float) * (size_t)ntok * H);
        RW_TCK(cudaMemcpy(y, dy, sizeof(float) * (size_t)(A * H), cudaMemcpyDeviceToHost));
        RW_TCK(cudaMemcpy(inv, dinv, sizeof(int32_t) * (size_t)A, cudaMemcpyDeviceToHost));
        for (int64_t t = 0; t < ntok; t++)
            for (int64_t h = 0; h < H; h++) {
                float acc = 0.0f;
                for (int j = 0; j < k; j++) {
                    const int32_t row = inv[t * k + j];
                    if (row >= 0) acc = fmaf(w[t * k + j], y[(int64_t)row * H + h], acc);
                }
                sum[t * H + h] = half[t * H + h] + acc;
            }
        rw_assert_bytes_equal(sum, got, sizeof(float) * (size_t)ntok * H,
                              "rows left in the workspace (out = NULL), combined on the host");
        free(y);
        free(inv);
        free(sum);
    }
    double mx = 0, worst = 0;
    int64_t wi = 0;
    for (int64_t i = 0; i < (int64_t)ntok * H; i++)
        mx = fmax(mx, fabs(ref[i]));
    for (int64_t i = 0; i < (int64_t)ntok * H; i++) {
        const double e = fabs((got[i] - 0.5) - ref[i]);
        if (e > worst) worst = e, wi = i;
    }
    print_message("%s E=%d I=%d H=%d T=%d r=%d ntok=%d: max |err| %.3g of max |out| %.3g\n",
                  rw_wfmt_str(fmt), E, I, H, T, r, ntok, worst, mx);
    assert_true(mx > 1e-3);
    if (worst > CUDA_EXPERTS_TOL * mx)
        fail_msg("max error %g at %lld (got %g, want %g), tolerance %g", worst, (long long)wi,
                 got[wi] - 0.5, ref[wi], CUDA_EXPERTS_TOL * mx);
    /* batch invariance: each output element is one thread's fixed-order sum */
    if (ntok <= 64) {
        for (int t = 0; t < ntok; t++) {
            RW_TCK(cudaMemset(dbuf, 0, sizeof(float) * H));
            RW_ASSERT_OK(rw_moe_experts_cuda(&lw, &pl.d, H, dx + (size_t)t * H, NULL, false, 1,
                                             did + t * k, dw + t * k, k, dbuf, dws, gws, NULL,
                                             &err),
                         &err);
            float *one = malloc(sizeof(float) * H);
            RW_TCK(cudaMemcpy(one, dbuf, sizeof(float) * H, cudaMemcpyDeviceToHost));
            for (int h = 0; h < H; h++)
                one[h] += 0.5f;
            rw_assert_bytes_equal(one, got + (size_t)t * H, sizeof(float) * H, "token alone");
            free(one);
        }
    }
    layer_free_dev(&lw);
    cudaFree(dx);
    cudaFree(did);
    cudaFree(dw);
    cudaFree(dbuf);
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

/* --- split input: x = hi + lo ------------------------------------------------------------ */
/* Tolerance of the split path. Each product term of a dot product carries a relative rounding
 * error of at most U_SPLIT = 2^-16: the input pair (|x - hi - lo| <= 2^-8 |x - hi| <= 2^-16 |x|)
 * and the act pair alike; the products themselves are exact in fp32. Treating these errors as
 * independent with that size gives, per output element, a scale sigma propagated through the
 * layer (split_sigma). Rounding errors are uniform and mostly below the bound, and fp32
 * accumulation over 2K / 16 mma steps adds at most about 2^-18 of the partial sums: an fp32
 * model of the kernel's arithmetic on these cases stays near 0.15 sigma on average and under
 * 1 sigma at worst, so SPLIT_KAPPA sigma leaves a wide margin. The bf16-input path rounds x and
 * act to 2^-8 (about 90 sigma on average, its worst element 40-55 times the tolerance in the same
 * model) and must fail it, which the test checks. */
#define U_SPLIT 0x1p-16
#define SPLIT_KAPPA 10.0

/* fp8-block weights are e4m3 times an fp32 block scale, a product the kernel rounds to bf16 (a
 * weight error the split input cannot remove). Power-of-two scales make that product exact, so
 * the tight check sees only the activations: rewrite the layer's scales to the power of two at
 * or below them and put the values the bytes now stand for back into the canonical tensors. */
static void fp8b_pow2_scales(canon *c, packed_layer *pl) {
    const int64_t E = c->E, I = c->I, H = c->H, S = pl->d.S, P = pl->d.P, r = pl->d.rank;
    const int64_t cb13 = (H + 127) / 128, cb2 = P / 128;
    const int64_t n13 = (2 * P / 128) * cb13, n2 = ((H + 127) / 128) * cb2;
    for (int64_t i = 0; i < E * n13; i++) {
        int ex;
        frexpf(((float *)pl->s13)[i], &ex);
        ((float *)pl->s13)[i] = ldexpf(0.5f, ex);
    }
    for (int64_t i = 0; i < E * n2; i++) {
        int ex;
        frexpf(((float *)pl->s2)[i], &ex);
        ((float *)pl->s2)[i] = ldexpf(0.5f, ex);
    }
    for (int64_t e = 0; e < E; e++) {
        const uint8_t *q13 = (const uint8_t *)pl->w13 + e * 2 * P * H;
        const uint8_t *q2 = (const uint8_t *)pl->w2 + e * H * P;
        const float *s13 = (const float *)pl->s13 + e * n13, *s2 = (const float *)pl->s2 + e * n2;
        for (int64_t j = 0; j < S; j++)
            for (int64_t i = 0; i < H; i++) {
                c->up[(e * I + r * S + j) * H + i] =
                    rw_e4m3_to_f32(q13[j * H + i]) * s13[(j / 128) * cb13 + i / 128];
                c->gate[(e * I + r * S + j) * H + i] =
                    rw_e4m3_to_f32(q13[(P + j) * H + i]) * s13[((P + j) / 128) * cb13 + i / 128];
            }
        for (int64_t h = 0; h < H; h++)
            for (int64_t j = 0; j < S; j++)
                c->down[(e * H + h) * I + r * S + j] =
                    rw_e4m3_to_f32(q2[h * P + j]) * s2[(h / 128) * cb2 + j / 128];
    }
}

/* sigma[t, h] (see U_SPLIT): the rounding scale of out[t, h] in double, from the canonical
 * weights of rank r's slice. Relative errors: u_x on each input term (the pair), u_w on each
 * weight term (fp8-block scales the kernel rounds), u_act on act (u_x for its pair, 2^-8 for
 * one bf16):
 *   var g_p   = (u_x^2 + u_w^2) sum_i (G_pi x_i)^2, var u_p likewise with U
 *   var act_p = (silu'(g_p) u_p)^2 var g_p + silu(g_p)^2 var u_p + u_act^2 act_p^2
 *   var y_h   = sum_p D_hp^2 var act_p + u_w^2 sum_p (D_hp act_p)^2
 *   var out   = sum_j w_j^2 var y_h(j) */
static void split_sigma(const canon *c, const rw_tp_dims *d, const float *x, int64_t ntok,
                        const int32_t *ids, const float *w, int k, double u_x, double u_w,
                        double u_act, double *sigma) {
    const int64_t I = c->I, H = c->H, S = d->S, r = d->rank;
    const double ui2 = u_x * u_x + u_w * u_w;
    double *act = malloc(sizeof(double) * (size_t)S), *vact = malloc(sizeof(double) * (size_t)S);
    for (int64_t i = 0; i < ntok * H; i++)
        sigma[i] = 0.0;
    for (int64_t t = 0; t < ntok; t++) {
        const float *xt = x + t * H;
        for (int j = 0; j < k; j++) {
            const int64_t e = ids[t * k + j];
            if (e < 0 || e >= c->E) continue;
            for (int64_t p = 0; p < S; p++) {
                const float *gr = c->gate + (e * I + r * S + p) * H;
                const float *ur = c->up + (e * I + r * S + p) * H;
                double g = 0, u = 0, sg = 0, su = 0;
                for (int64_t i = 0; i < H; i++) {
                    const double a = (double)gr[i] * xt[i], b = (double)ur[i] * xt[i];
                    g += a;
                    u += b;
                    sg += a * a;
                    su += b * b;
                }
                const double sig = 1.0 / (1.0 + exp(-g)), silu = g * sig;
                const double dsilu = sig * (1.0 + g * (1.0 - sig));
                act[p] = silu * u;
                vact[p] = dsilu * u * dsilu * u * ui2 * sg + silu * silu * ui2 * su +
                          u_act * u_act * act[p] * act[p];
            }
            const double ww = (double)w[t * k + j] * w[t * k + j];
            for (int64_t h = 0; h < H; h++) {
                const float *dr = c->down + (e * H + h) * I + r * S;
                double v = 0, m = 0;
                for (int64_t p = 0; p < S; p++) {
                    v += (double)dr[p] * dr[p] * vact[p];
                    m += (double)dr[p] * dr[p] * act[p] * act[p];
                }
                sigma[t * H + h] += ww * (v + u_w * u_w * m);
            }
        }
    }
    for (int64_t i = 0; i < ntok * H; i++)
        sigma[i] = sqrt(sigma[i]);
    free(act);
    free(vact);
}

/* Largest |got - 0.5 - ref| / tol over all elements (out starts at 0.5); *at gets its index.
 * tol = SPLIT_KAPPA sigma, plus a few fp32 ulps of the final add into 0.5. */
static double worst_ratio(const float *got, const float *ref, const double *sigma, int64_t n,
                          int64_t *at) {
    double worst = 0;
    for (int64_t i = 0; i < n; i++) {
        const double tol = SPLIT_KAPPA * sigma[i] + 0x1p-22 * (1.0 + fabs(ref[i]));
        const double q = fabs(((double)got[i] - 0.5) - ref[i]) / tol;
        if (q > worst) worst = q, *at = i;
    }
    return worst;
}

/* One run of the CUDA experts from out = 0.5 (x_lo may be NULL), result to host `got`. */
static void run_cuda(const rw_layer_weights *lw, const rw_tp_dims *d, int H, const uint16_t *dx,
                     const uint16_t *dxl, bool act_pair, int64_t ntok, const int32_t *did,
                     const float *dw, int k, float *dout, void *dws, size_t gws, float *got) {
    float *half = malloc(sizeof(float) * (size_t)(ntok * H));
    for (int64_t i = 0; i < ntok * H; i++)
        half[i] = 0.5f;
    RW_TCK(cudaMemcpy(dout, half, sizeof(float) * (size_t)(ntok * H), cudaMemcpyHostToDevice));
    rw_err err = {0};
    RW_ASSERT_OK(
        rw_moe_experts_cuda(lw, d, H, dx, dxl, act_pair, ntok, did, dw, k, dout, dws, gws, NULL,
                            &err),
        &err);
    RW_TCK(cudaDeviceSynchronize());
    RW_TCK(cudaMemcpy(got, dout, sizeof(float) * (size_t)(ntok * H), cudaMemcpyDeviceToHost));
    free(half);
}

/* Split mode on fp32 x: hi = bf16(x), lo = bf16(x - hi). pow2: fp8-block scales made powers of
 * two (exact bf16 weights in the kernel); otherwise fp8-block weights add their bf16 rounding to
 * sigma and the bf16-input path is not expected to fail. act_pair: silu(g)*u a pair too; else one
 * bf16, whose rounding (2^-8) is as large as the input's and hides it, so the bf16-input path is
 * not expected to fail either. */
static void check_split(rw_wfmt fmt, int E, int I, int H, int T, int r, int k, int ntok,
                        uint64_t seed, bool pow2, bool act_pair) {
    canon c;
    canon_random(&c, E, I, H, seed);
    packed_layer pl;
    build_rank(&c, fmt, T, r, &pl);
    if (fmt == RW_WFMT_FP8_BLOCK && pow2) fp8b_pow2_scales(&c, &pl);
    const double u_w = fmt == RW_WFMT_FP8_BLOCK && !pow2 ? 0x1p-8 : 0.0;
    rw_layer_weights lw = layer_to_dev(&pl);
    const size_t nx = (size_t)ntok * H;
    float *xf = malloc(sizeof(float) * nx);
    uint16_t *xh = malloc(sizeof(uint16_t) * nx), *xl = malloc(sizeof(uint16_t) * nx);
    float *lg = malloc(sizeof(float) * (size_t)ntok * E);
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)ntok * k);
    float *w = malloc(sizeof(float) * (size_t)ntok * k);
    rw_rng rng;
    rw_rng_seed(&rng, seed + 19);
    for (size_t i = 0; i < nx; i++) {
        xf[i] = rw_rng_normal(&rng);
        xh[i] = rw_f32_to_bf16(xf[i]);
        xl[i] = rw_bf16_split_lo(xf[i], xh[i]);
    }
    float *ref = route_and_ref(&pl, &rng, E, H, k, ntok, xf, lg, ids, w);
    double *sigma = malloc(sizeof(double) * nx);
    split_sigma(&c, &pl.d, xf, ntok, ids, w, k, U_SPLIT, u_w, act_pair ? U_SPLIT : 0x1p-8, sigma);

    uint16_t *dx = to_dev(xh, sizeof(uint16_t) * nx), *dxl = to_dev(xl, sizeof(uint16_t) * nx);
    int32_t *did = to_dev(ids, sizeof(int32_t) * (size_t)ntok * k);
    float *dw = to_dev(w, sizeof(float) * (size_t)ntok * k);
    float *dout;
    RW_TCK(cudaMalloc((void **)&dout, sizeof(float) * nx));
    const size_t gws = rw_moe_experts_cuda_workspace(E, pl.d.P, H, ntok, k);
    void *dws;
    RW_TCK(cudaMalloc(&dws, gws));
    float *got = malloc(sizeof(float) * nx), *again = malloc(sizeof(float) * nx);
    run_cuda(&lw, &pl.d, H, dx, dxl, act_pair, ntok, did, dw, k, dout, dws, gws, got);
    run_cuda(&lw, &pl.d, H, dx, dxl, act_pair, ntok, did, dw, k, dout, dws, gws, again);
    rw_assert_bytes_equal(got, again, sizeof(float) * nx, "split rerun");
    int64_t wi = 0, wn = 0;
    const double q = worst_ratio(got, ref, sigma, (int64_t)nx, &wi);
    /* the bf16-input path on the same data: hi alone */
    run_cuda(&lw, &pl.d, H, dx, NULL, false, ntok, did, dw, k, dout, dws, gws, again);
    const double qn = worst_ratio(again, ref, sigma, (int64_t)nx, &wn);
    print_message("split %s%s%s E=%d I=%d H=%d T=%d r=%d ntok=%d: max |err| / tol %.3g (bf16 "
                  "input %.3g), sigma at worst %.3g\n",
                  rw_wfmt_str(fmt), act_pair ? "" : " (one bf16 act)",
                  fmt == RW_WFMT_FP8_BLOCK ? (pow2 ? " (2^n scales)" : " (fp32 scales)") : "", E, I,
                  H, T, r, ntok, q, qn, sigma[wi]);
    if (q > 1.0)
        fail_msg("split: error %g at %lld (got %g, want %g), tolerance %g (%g sigma)",
                 fabs((got[wi] - 0.5) - ref[wi]), (long long)wi, got[wi] - 0.5, ref[wi],
                 SPLIT_KAPPA * sigma[wi] + 0x1p-22 * (1.0 + fabs(ref[wi])), SPLIT_KAPPA);
    /* the tolerance has to tell the two inputs apart */
    if (u_w == 0.0 && act_pair && qn <= 1.0)
        fail_msg("split tolerance too loose: the bf16-input path passes it (%g)", qn);
    /* batch invariance: every token alone (a strided sample, first and last included, for large
     * batches: those reach the second pass of RW_MOE_CUDA_CHUNK tokens and the wide tiles) */
    const int stride = ntok <= 1024 ? 1 : ntok / 64;
    float *one = malloc(sizeof(float) * (size_t)H);
    for (int t = 0;; t = t + stride < ntok ? t + stride : ntok - 1) {
        run_cuda(&lw, &pl.d, H, dx + (size_t)t * H, dxl + (size_t)t * H, act_pair, 1, did + t * k,
                 dw + t * k, k, dout, dws, gws, one);
        rw_assert_bytes_equal(one, got + (size_t)t * H, sizeof(float) * H, "split token alone");
        if (t == ntok - 1) break;
    }
    free(one);
    layer_free_dev(&lw);
    cudaFree(dx);
    cudaFree(dxl);
    cudaFree(did);
    cudaFree(dw);
    cudaFree(dout);
    cudaFree(dws);
    free(xf);
    free(xh);
    free(xl);
    free(lg);
    free(ids);
    free(w);
    free(ref);
    free(sigma);
    free(got);
    free(again);
    free_rank(&pl);
    canon_free(&c);
}

static void test_bf16(void **s) {
    (void)s;
    check(RW_WFMT_BF16, 8, 96, 128, 2, 1, 2, 37, 1);    /* padded, narrow tiles */
    check(RW_WFMT_BF16, 8, 256, 256, 2, 0, 2, 600, 2);  /* unpadded, wide tiles */
    /* more than one pass of RW_MOE_CUDA_CHUNK tokens */
    check(RW_WFMT_BF16, 4, 256, 128, 1, 0, 2, RW_MOE_CUDA_CHUNK + 404, 3);
    check(RW_WFMT_BF16, 16, 96, 128, 1, 0, 10, 37, 8);  /* top-10: the combine's 32 slots */
    /* decode-width tiles in grids of more than one wave (4-stage pipelines, 3 for the unsplit
     * down projection), each token then alone in a one-wave grid (6 stages), at the model's K of
     * 6-32 blocks */
    check(RW_WFMT_BF16, 32, 768, 512, 1, 0, 8, 64, 21);  /* 32-token tiles */
    check(RW_WFMT_BF16, 128, 384, 384, 1, 0, 8, 16, 22); /* 16-token tiles */
}
static void test_mxfp8(void **s) {
    (void)s;
    check(RW_WFMT_MXFP8, 8, 96, 128, 1, 0, 2, 37, 4);
    check(RW_WFMT_MXFP8, 8, 256, 256, 2, 1, 2, 600, 5);
    /* a multi-wave decode grid of 32-token tiles (w13 on 3 stages), each token alone in a
     * one-wave grid */
    check(RW_WFMT_MXFP8, 32, 768, 512, 1, 0, 8, 64, 25);
}
/* blocks whose scale bytes take the fp32 conversion, among tiles that take the fast one: narrow
 * and wide tiles, and the multi-wave decode grid, each token alone byte for byte */
static void test_mxfp8_large_scales(void **s) {
    (void)s;
    big_scales = true;
    check(RW_WFMT_MXFP8, 8, 96, 128, 1, 0, 2, 37, 41);
    check(RW_WFMT_MXFP8, 8, 256, 256, 1, 0, 2, 600, 42);
    check(RW_WFMT_MXFP8, 32, 768, 512, 1, 0, 8, 64, 43);
    big_scales = false;
}
static void test_fp8_block(void **s) {
    (void)s;
    check(RW_WFMT_FP8_BLOCK, 8, 96, 128, 2, 0, 2, 37, 6);
    check(RW_WFMT_FP8_BLOCK, 8, 256, 256, 1, 0, 3, 600, 7);
    check(RW_WFMT_FP8_BLOCK, 32, 768, 512, 1, 0, 8, 64, 26); /* multi-wave decode grid */
}
static void test_split_bf16(void **s) {
    (void)s;
    /* padded, narrow tiles; unpadded, wide tiles; two passes */
    check_split(RW_WFMT_BF16, 8, 96, 128, 2, 1, 2, 37, 11, false, true);
    check_split(RW_WFMT_BF16, 8, 256, 256, 2, 0, 2, 600, 12, false, true);
    check_split(RW_WFMT_BF16, 4, 256, 128, 1, 0, 2, 4500, 13, false, true);
    /* multi-wave decode grids, as in test_bf16 */
    check_split(RW_WFMT_BF16, 32, 768, 512, 1, 0, 8, 64, 23, false, true);
    check_split(RW_WFMT_BF16, 128, 384, 384, 1, 0, 8, 16, 24, false, true);
}
/* the backend's form: the input a pair, silu(g)*u one bf16 (narrow, wide, two passes, multi-wave
 * decode grids; each token alone byte for byte) */
static void test_split_one_act(void **s) {
    (void)s;
    check_split(RW_WFMT_BF16, 8, 96, 128, 2, 1, 2, 37, 31, false, false);
    check_split(RW_WFMT_BF16, 8, 256, 256, 2, 0, 2, 600, 32, false, false);
    check_split(RW_WFMT_BF16, 4, 256, 128, 1, 0, 2, 4500, 33, false, false);
    check_split(RW_WFMT_BF16, 32, 768, 512, 1, 0, 8, 64, 34, false, false);
    check_split(RW_WFMT_BF16, 128, 384, 384, 1, 0, 8, 16, 35, false, false);
    check_split(RW_WFMT_MXFP8, 8, 256, 256, 2, 1, 2, 600, 36, false, false);
    check_split(RW_WFMT_MXFP8, 32, 768, 512, 1, 0, 8, 64, 38, false, false); /* b256's grid */
    check_split(RW_WFMT_FP8_BLOCK, 8, 256, 256, 1, 0, 3, 600, 37, true, false);
}
static void test_split_mxfp8(void **s) {
    (void)s;
    check_split(RW_WFMT_MXFP8, 8, 96, 128, 1, 0, 2, 37, 14, false, true);
    check_split(RW_WFMT_MXFP8, 8, 256, 256, 2, 1, 2, 600, 15, false, true);
}
static void test_split_fp8_block(void **s) {
    (void)s;
    check_split(RW_WFMT_FP8_BLOCK, 8, 96, 128, 2, 0, 2, 37, 16, true, true);
    check_split(RW_WFMT_FP8_BLOCK, 8, 256, 256, 1, 0, 3, 600, 17, true, true);
    check_split(RW_WFMT_FP8_BLOCK, 8, 256, 256, 2, 1, 2, 600, 18, false, true);
}

int main(void) {
    rw_test_require_gpu(1);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_route),
        cmocka_unit_test(test_bf16),
        cmocka_unit_test(test_mxfp8),
        cmocka_unit_test(test_mxfp8_large_scales),
        cmocka_unit_test(test_fp8_block),
        cmocka_unit_test(test_split_bf16),
        cmocka_unit_test(test_split_mxfp8),
        cmocka_unit_test(test_split_fp8_block),
        cmocka_unit_test(test_split_one_act),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
