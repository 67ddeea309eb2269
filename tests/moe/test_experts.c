/* test_experts.c - routing and the expert computation on the packed layout (spec/layout.md
 * section 6, last check): a reference MoE (silu(gate) * up, then down, weighted by routing) on
 * UNPACKED canonical weights equals rw_moe_experts_ref on packed weights, for padded and unpadded
 * shards, summed over ranks, for bf16, mxfp8 and fp8-block experts. Also: routing against a
 * brute-force sort, batch invariance (bit-exact), and non-local expert ids contributing nothing. */
#include <math.h>

#include "rw_test.h"
#include "rw_moe.h"
#include "rw_quant.h"

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

/* --- packing helpers (straight from the index maps of rw_moe.h) ---------------------------- */
typedef struct canon {
    int E, I, H;
    float *gate, *up; /* [E, I, H] */
    float *down;      /* [E, H, I] */
} canon;

typedef struct packed_layer {
    rw_layer_weights lw;
    rw_tp_dims d;
    void *w13, *w2, *s13, *s2;
} packed_layer;

static void mxfp8_quant_row(const float *x, int64_t K, uint8_t *q, uint8_t *s) {
    for (int64_t b = 0; b < K / 32; b++) {
        float amax = 0;
        for (int c = 0; c < 32; c++)
            amax = fmaxf(amax, fabsf(x[b * 32 + c]));
        s[b] = rw_mxfp8_scale_from_amax(amax);
        for (int c = 0; c < 32; c++)
            q[b * 32 + c] = rw_mxfp8_quantize_elem(x[b * 32 + c], s[b]);
    }
}

/* Builds rank r's logical local matrices (w13 [2P, H] up-first padded, w2 [H, P]) as fp32,
 * quantizes them when fmt is quantized, writes the dequantized values back into the logical
 * matrices (what the reference must use), and packs them. */
static void build_rank(const canon *c, rw_wfmt fmt, int T, int r, packed_layer *pl) {
    const int64_t E = c->E, H = c->H, S = c->I / T, P = rw_roundup(S, 128);
    memset(pl, 0, sizeof *pl);
    pl->d.tp = T;
    pl->d.rank = r;
    pl->d.S = S;
    pl->d.P = P;
    pl->lw.moe_fmt = fmt;
    float *l13 = calloc((size_t)(2 * P * H), sizeof(float));
    float *l2 = calloc((size_t)(H * P), sizeof(float));
    const size_t es = fmt == RW_WFMT_BF16 ? 2 : 1;
    pl->w13 = calloc((size_t)(E * 2 * P * H), es);
    pl->w2 = calloc((size_t)(E * H * P), es);
    const int64_t kt13 = (H / 32 + 3) / 4, kt2 = (P / 32 + 3) / 4;
    const int64_t s13b = rw_roundup(2 * P, 128) * kt13 * 4, s2b = rw_roundup(H, 128) * kt2 * 4;
    if (fmt == RW_WFMT_MXFP8) {
        pl->s13 = calloc((size_t)(E * s13b), 1);
        pl->s2 = calloc((size_t)(E * s2b), 1);
    } else if (fmt == RW_WFMT_FP8_BLOCK) {
        pl->s13 = calloc((size_t)(E * (2 * P / 128) * ((H + 127) / 128)), 4);
        pl->s2 = calloc((size_t)(E * ((H + 127) / 128) * (P / 128)), 4);
    }
    for (int64_t e = 0; e < E; e++) {
        memset(l13, 0, (size_t)(2 * P * H) * 4);
        memset(l2, 0, (size_t)(H * P) * 4);
        for (int64_t j = 0; j < S; j++)
            for (int64_t k = 0; k < H; k++) {
                l13[j * H + k] = c->up[(e * c->I + r * S + j) * H + k];
                l13[(P + j) * H + k] = c->gate[(e * c->I + r * S + j) * H + k];
            }
        for (int64_t h = 0; h < H; h++)
            for (int64_t j = 0; j < S; j++)
                l2[h * P + j] = c->down[(e * H + h) * c->I + r * S + j];
        if (fmt == RW_WFMT_BF16) {
            uint16_t *w13 = (uint16_t *)pl->w13 + e * 2 * P * H,
                     *w2 = (uint16_t *)pl->w2 + e * H * P;
            for (int64_t cr = 0; cr < 2 * P; cr++)
                for (int64_t k = 0; k < H; k++)
                    w13[rw_moe_kblock_offset(rw_moe_w13_row_map(cr, P), k, 2 * P)] =
                        rw_f32_to_bf16(l13[cr * H + k]);
            for (int64_t h = 0; h < H; h++)
                for (int64_t k = 0; k < P; k++)
                    w2[rw_moe_kblock_offset(rw_moe_row_shuffle(h), k, H)] =
                        rw_f32_to_bf16(l2[h * P + k]);
        } else if (fmt == RW_WFMT_MXFP8) {
            uint8_t *w13 = (uint8_t *)pl->w13 + e * 2 * P * H, *w2 = (uint8_t *)pl->w2 + e * H * P;
            uint8_t *s13 = (uint8_t *)pl->s13 + e * s13b, *s2 = (uint8_t *)pl->s2 + e * s2b;
            uint8_t sc[64];
            for (int64_t cr = 0; cr < 2 * P; cr++) {
                const int64_t n = rw_moe_w13_row_map(cr, P);
                mxfp8_quant_row(l13 + cr * H, H, w13 + n * H, sc);
                for (int64_t b = 0; b < H / 32; b++) {
                    s13[rw_moe_scale_swizzle(n, b, kt13)] = sc[b];
                    for (int q = 0; q < 32; q++)
                        l13[cr * H + b * 32 + q] =
                            rw_e4m3_to_f32(w13[n * H + b * 32 + q]) * rw_ue8m0_to_f32(sc[b]);
                }
            }
            for (int64_t h = 0; h < H; h++) {
                const int64_t n = rw_moe_row_shuffle(h);
                mxfp8_quant_row(l2 + h * P, P, w2 + n * P, sc);
                for (int64_t b = 0; b < P / 32; b++) {
                    s2[rw_moe_scale_swizzle(n, b, kt2)] = sc[b];
                    for (int q = 0; q < 32; q++)
                        l2[h * P + b * 32 + q] =
                            rw_e4m3_to_f32(w2[n * P + b * 32 + q]) * rw_ue8m0_to_f32(sc[b]);
                }
            }
        } else {
            float *mats[2] = {l13, l2};
            const int64_t rows[2] = {2 * P, H}, cols[2] = {H, P};
            uint8_t *qs[2] = {(uint8_t *)pl->w13 + e * 2 * P * H, (uint8_t *)pl->w2 + e * H * P};
            const int64_t nsc[2] = {(2 * P / 128) * ((H + 127) / 128),
                                    ((H + 127) / 128) * (P / 128)};
            float *scs[2] = {(float *)pl->s13 + e * nsc[0], (float *)pl->s2 + e * nsc[1]};
            for (int m = 0; m < 2; m++) {
                const int64_t cb = (cols[m] + 127) / 128;
                for (int64_t rb = 0; rb < (rows[m] + 127) / 128; rb++)
                    for (int64_t kb = 0; kb < cb; kb++) {
                        float amax = 0;
                        for (int64_t i = rb * 128; i < rows[m] && i < rb * 128 + 128; i++)
                            for (int64_t j = kb * 128; j < cols[m] && j < kb * 128 + 128; j++)
                                amax = fmaxf(amax, fabsf(mats[m][i * cols[m] + j]));
                        const float s = rw_fp8_block_scale_from_amax(amax);
                        scs[m][rb * cb + kb] = s;
                        for (int64_t i = rb * 128; i < rows[m] && i < rb * 128 + 128; i++)
                            for (int64_t j = kb * 128; j < cols[m] && j < kb * 128 + 128; j++) {
                                uint8_t q = rw_fp8_block_quantize_elem(mats[m][i * cols[m] + j], s);
                                qs[m][i * cols[m] + j] = q;
                                mats[m][i * cols[m] + j] = rw_e4m3_to_f32(q) * s;
                            }
                    }
            }
        }
        /* write the values the packed bytes stand for back into the canonical tensors, so the
         * reference computes on exactly what the rank holds */
        for (int64_t j = 0; j < S; j++)
            for (int64_t k = 0; k < H; k++) {
                float u = l13[j * H + k], g = l13[(P + j) * H + k];
                if (fmt == RW_WFMT_BF16) {
                    u = rw_bf16_to_f32(rw_f32_to_bf16(u));
                    g = rw_bf16_to_f32(rw_f32_to_bf16(g));
                }
                c->up[(e * c->I + r * S + j) * H + k] = u;
                c->gate[(e * c->I + r * S + j) * H + k] = g;
            }
        for (int64_t h = 0; h < H; h++)
            for (int64_t j = 0; j < S; j++) {
                float v = l2[h * P + j];
                if (fmt == RW_WFMT_BF16) v = rw_bf16_to_f32(rw_f32_to_bf16(v));
                c->down[(e * H + h) * c->I + r * S + j] = v;
            }
    }
    const rw_dtype wdt = fmt == RW_WFMT_BF16 ? RW_DTYPE_BF16 : RW_DTYPE_E4M3;
    if (fmt == RW_WFMT_BF16) {
        int64_t s13[4] = {E, H / 64, 2 * P, 64}, s2[4] = {E, P / 64, H, 64};
        pl->lw.w13 = rw_tensor_view(pl->w13, wdt, 4, s13, RW_PLACE_HOST, 0);
        pl->lw.w2 = rw_tensor_view(pl->w2, wdt, 4, s2, RW_PLACE_HOST, 0);
    } else {
        int64_t s13[3] = {E, 2 * P, H}, s2[3] = {E, H, P};
        pl->lw.w13 = rw_tensor_view(pl->w13, wdt, 3, s13, RW_PLACE_HOST, 0);
        pl->lw.w2 = rw_tensor_view(pl->w2, wdt, 3, s2, RW_PLACE_HOST, 0);
        if (fmt == RW_WFMT_MXFP8) {
            int64_t a[2] = {E, s13b}, b[2] = {E, s2b};
            pl->lw.w13_scale = rw_tensor_view(pl->s13, RW_DTYPE_UE8M0, 2, a, RW_PLACE_HOST, 0);
            pl->lw.w2_scale = rw_tensor_view(pl->s2, RW_DTYPE_UE8M0, 2, b, RW_PLACE_HOST, 0);
        } else {
            int64_t a[3] = {E, 2 * P / 128, (H + 127) / 128}, b[3] = {E, (H + 127) / 128, P / 128};
            pl->lw.w13_scale = rw_tensor_view(pl->s13, RW_DTYPE_F32, 3, a, RW_PLACE_HOST, 0);
            pl->lw.w2_scale = rw_tensor_view(pl->s2, RW_DTYPE_F32, 3, b, RW_PLACE_HOST, 0);
        }
    }
    free(l13);
    free(l2);
}

static void free_rank(packed_layer *pl) {
    free(pl->w13);
    free(pl->w2);
    free(pl->s13);
    free(pl->s2);
}

static void canon_random(canon *c, int E, int I, int H, uint64_t seed) {
    c->E = E;
    c->I = I;
    c->H = H;
    const size_t n = (size_t)E * I * H;
    c->gate = malloc(n * 4);
    c->up = malloc(n * 4);
    c->down = malloc(n * 4);
    rw_rng r;
    rw_rng_seed(&r, seed);
    for (size_t i = 0; i < n; i++)
        c->gate[i] = 0.08f * rw_rng_normal(&r);
    for (size_t i = 0; i < n; i++)
        c->up[i] = 0.08f * rw_rng_normal(&r);
    for (size_t i = 0; i < n; i++)
        c->down[i] = 0.08f * rw_rng_normal(&r);
}

static void canon_free(canon *c) {
    free(c->gate);
    free(c->up);
    free(c->down);
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
    for (int i = 0; i < ntok * E; i++)
        logits[i] = rw_rng_normal(&rng);
    rw_moe_route_ref(logits, ntok, E, k, true, ids, w);
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
                 (fmt == RW_WFMT_BF16    ? "bf16"
                  : fmt == RW_WFMT_MXFP8 ? "mxfp8"
                                         : "fp8-block"),
                 E, I, H, T, worst, wi, sum[wi], ref[wi]);
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
