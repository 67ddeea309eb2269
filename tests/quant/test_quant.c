/* test_quant.c - cpu suite for the quant module: e4m3 and UE8M0 codecs over every byte, rounding
 * ties, saturation, NaN / inf, the MXFP8 scale rule against a slow double-precision search, the
 * CPU quantizers against slow references with per-element error bounds, and the precision policy
 * (modules_to_not_convert on dotted boundaries, never-quantized kinds, K % 32).
 *
 * Random inputs come from a fresh seed each run (printed; RW_TEST_SEED=N repeats a run). */
#include "quant_util.h"
#include "rw_quant.h"

#include <float.h>

static uint64_t g_seed;

/* ------------------------------------------------------------------------------------------ */
/* Slow, independent references (double precision, no bit tricks)                              */
/* ------------------------------------------------------------------------------------------ */

/* Magnitude of e4m3 code c in 0..0x7e: exponent bias 7, 3 mantissa bits, subnormals at exp 0. */
static double e4m3_mag_slow(int c) {
    int e = (c >> 3) & 0xf, m = c & 7;
    return e == 0 ? ldexp(m, -9) : ldexp(8 + m, e - 10);
}

/* Nearest finite e4m3 value, ties to the even code, |x| >= 448 saturates, NaN -> 0x7f
 * (canonical, sign dropped). */
static uint8_t e4m3_encode_slow(double x) {
    uint8_t sign = signbit(x) ? 0x80 : 0;
    if (isnan(x)) return 0x7f;
    double a = fabs(x);
    if (a >= 448.0) return sign | 0x7e;
    int best = 0;
    double bd = INFINITY;
    for (int c = 0; c <= 0x7e; c++) {
        double d = fabs(a - e4m3_mag_slow(c));
        if (d < bd || (d == bd && (c & 1) == 0)) {
            best = c;
            bd = d;
        }
    }
    return (uint8_t)(sign | best);
}

/* Smallest e in [-127, 127] with amax <= 448 * 2^e, as a UE8M0 byte; the documented edges: zero ->
 * 0, inf -> 254, NaN -> 0xff. */
static uint8_t mx_scale_slow(float amax) {
    if (isnan(amax)) return 0xff;
    if (amax == 0.0f) return 0;
    if (isinf(amax)) return 254;
    for (int e = -127; e <= 127; e++)
        if ((double)amax <= 448.0 * ldexp(1.0, e)) return (uint8_t)(e + 127);
    return 254;
}

static rw_rng rng_for(uint64_t salt) {
    return qt_rng(g_seed, salt);
}

/* ------------------------------------------------------------------------------------------ */
/* e4m3                                                                                        */
/* ------------------------------------------------------------------------------------------ */

static void test_e4m3_every_byte(void **state) {
    (void)state;
    for (int b = 0; b < 256; b++) {
        float f = rw_e4m3_to_f32((uint8_t)b);
        bool neg = b & 0x80;
        if ((b & 0x7f) == 0x7f) {
            assert_true(isnan(f));
            assert_int_equal(rw_f32_to_e4m3(f), 0x7f); /* every NaN encodes as 0x7f */
            continue;
        }
        double want = neg ? -e4m3_mag_slow(b & 0x7f) : e4m3_mag_slow(b & 0x7f);
        if ((double)f != want || (bool)signbit(f) != neg)
            fail_msg("e4m3 0x%02x decodes to %.9g, expected %.9g", b, f, want);
        if (rw_f32_to_e4m3(f) != b)
            fail_msg("e4m3 0x%02x -> %.9g re-encodes to 0x%02x", b, f, rw_f32_to_e4m3(f));
    }
    assert_true(rw_e4m3_to_f32(0x7e) == 448.0f);
    assert_true(rw_e4m3_to_f32(0x01) == ldexpf(1.0f, -9));
    assert_true(rw_e4m3_to_f32(0x08) == ldexpf(1.0f, -6));
}

static void check_encode(float x) {
    uint8_t got = rw_f32_to_e4m3(x), want = e4m3_encode_slow(x);
    if (got != want)
        fail_msg("e4m3 encode of %.9g (0x%08x): 0x%02x, slow reference 0x%02x", x, rw_f32_bits(x),
                 got, want);
}

static void test_e4m3_encode_all_bf16(void **state) {
    (void)state;
    for (uint32_t h = 0; h < 65536; h++)
        check_encode(rw_bf16_to_f32((uint16_t)h));
}

static void test_e4m3_encode_random_f32(void **state) {
    (void)state;
    rw_rng r = rng_for(1);
    for (int i = 0; i < 400000; i++) {
        uint32_t u = (uint32_t)rw_rng_u64(&r);
        /* Half the draws near the e4m3 range (exponent in [2^-12, 2^10)), the rest anywhere. */
        if (i % 2) u = (u & 0x807fffffu) | ((uint32_t)(115 + rw_rng_u64(&r) % 22) << 23);
        check_encode(rw_bits_f32(u));
    }
    /* Every midpoint between neighbouring codes and one f32 ulp either side of it. */
    for (int c = 0; c < 0x7e; c++) {
        float mid = (float)((e4m3_mag_slow(c) + e4m3_mag_slow(c + 1)) / 2);
        assert_true((double)mid == (e4m3_mag_slow(c) + e4m3_mag_slow(c + 1)) / 2);
        for (int s = 0; s < 2; s++) {
            float m = s ? -mid : mid;
            check_encode(m);
            check_encode(nextafterf(m, 0.0f));
            check_encode(nextafterf(m, s ? -INFINITY : INFINITY));
        }
    }
}

static void test_e4m3_ties(void **state) {
    (void)state;
    /* Normal ties go to the even mantissa. */
    assert_int_equal(rw_f32_to_e4m3(1.0625f), 0x38); /* 1 + 1/16: between 1.0 (0x38) and 1.125 */
    assert_int_equal(rw_f32_to_e4m3(1.1875f), 0x3a); /* 1 + 3/16: between 1.125 and 1.25 (0x3a) */
    assert_int_equal(rw_f32_to_e4m3(-1.0625f), 0xb8);
    assert_int_equal(rw_f32_to_e4m3(15.5f), 0x58);  /* 15 (0x57) / 16 (0x58): 0x58 is even */
    assert_int_equal(rw_f32_to_e4m3(432.0f), 0x7e); /* 416 (0x7d) / 448 (0x7e) */
    /* Subnormal ties (step 2^-9). */
    assert_int_equal(rw_f32_to_e4m3(ldexpf(1.0f, -10)), 0x00);  /* 0 / 2^-9 -> 0 */
    assert_int_equal(rw_f32_to_e4m3(ldexpf(3.0f, -10)), 0x02);  /* 1.5 steps -> 2 */
    assert_int_equal(rw_f32_to_e4m3(ldexpf(5.0f, -10)), 0x02);  /* 2.5 steps -> 2 */
    assert_int_equal(rw_f32_to_e4m3(ldexpf(15.0f, -10)), 0x08); /* 7.5 steps -> 8 = 2^-6 */
    assert_int_equal(rw_f32_to_e4m3(-ldexpf(1.0f, -10)), 0x80); /* sign kept on zero */
    /* Just off a tie goes to the nearer side. */
    assert_int_equal(rw_f32_to_e4m3(nextafterf(1.0625f, 2.0f)), 0x39);
    assert_int_equal(rw_f32_to_e4m3(nextafterf(ldexpf(1.0f, -10), 1.0f)), 0x01);
}

static void test_e4m3_saturation_nan_inf(void **state) {
    (void)state;
    const float big[] = {448.0f, 449.0f, 463.99f, 464.0f, 480.0f, 1e6f, FLT_MAX, INFINITY};
    for (size_t i = 0; i < sizeof big / sizeof big[0]; i++) {
        assert_int_equal(rw_f32_to_e4m3(big[i]), 0x7e);
        assert_int_equal(rw_f32_to_e4m3(-big[i]), 0xfe);
    }
    assert_int_equal(rw_f32_to_e4m3(nextafterf(448.0f, 0.0f)), 0x7e); /* rounds to 448 */
    assert_int_equal(rw_f32_to_e4m3(NAN), 0x7f);
    assert_int_equal(rw_f32_to_e4m3(-NAN), 0x7f); /* canonical NaN */
    assert_int_equal(rw_f32_to_e4m3(rw_bits_f32(0x7f800001u)), 0x7f); /* signalling NaN */
    assert_int_equal(rw_f32_to_e4m3(0.0f), 0x00);
    assert_int_equal(rw_f32_to_e4m3(-0.0f), 0x80);
    assert_int_equal(rw_f32_to_e4m3(rw_bits_f32(1)), 0x00); /* smallest f32 subnormal */
}

/* ------------------------------------------------------------------------------------------ */
/* UE8M0 and the MXFP8 scale rule                                                              */
/* ------------------------------------------------------------------------------------------ */

static void test_ue8m0_every_byte(void **state) {
    (void)state;
    for (int b = 0; b < 256; b++) {
        float v = rw_ue8m0_to_f32((uint8_t)b);
        if (b == 255) {
            assert_true(isnan(v));
            /* A NaN amax re-encodes to the NaN scale. */
            assert_int_equal(rw_mxfp8_scale_from_amax(v), 0xff);
            continue;
        }
        if ((double)v != ldexp(1.0, b - 127)) fail_msg("ue8m0 %d decodes to %g", b, v);
        /* Re-encode: the scale of a block whose amax is exactly 448 * v is v itself (for every b
         * whose 448 * 2^(b-127) is a finite float), and one f32 ulp above needs the next scale. */
        if (b <= 246) {
            float amax = 448.0f * v;
            assert_true((double)amax == 448.0 * ldexp(1.0, b - 127));
            if (rw_mxfp8_scale_from_amax(amax) != b)
                fail_msg("ue8m0 %d: amax 448*2^%d gives scale byte %d", b, b - 127,
                         rw_mxfp8_scale_from_amax(amax));
            assert_int_equal(rw_mxfp8_scale_from_amax(nextafterf(amax, INFINITY)), b + 1);
        }
    }
}

static void check_scale(float amax) {
    uint8_t got = rw_mxfp8_scale_from_amax(amax), want = mx_scale_slow(amax);
    if (got != want)
        fail_msg("scale of amax %.9g (0x%08x): byte %d, slow search %d", amax, rw_f32_bits(amax),
                 got, want);
    /* The property itself: amax / scale <= 448, and half the scale would not do (b > 0). */
    if (isfinite(amax) && amax > 0) {
        double s = ldexp(1.0, got - 127);
        assert_true((double)amax / s <= 448.0);
        if (got > 0) assert_true((double)amax / (s / 2) > 448.0);
    }
}

static void test_mxfp8_scale_rule(void **state) {
    (void)state;
    rw_rng r = rng_for(2);
    for (int i = 0; i < 1000000; i++) {
        uint32_t u = (uint32_t)rw_rng_u64(&r) & 0x7fffffffu;
        if (u > 0x7f800000u) u &= 0x7f7fffffu; /* keep finite; NaN and inf are edge cases below */
        check_scale(rw_bits_f32(u));
        check_scale(rw_bf16_to_f32((uint16_t)(u >> 16)));
    }
    for (int k = -149; k <= 127; k++) {
        float p = ldexpf(1.0f, k);
        check_scale(p);
        check_scale(nextafterf(p, 0.0f));
        check_scale(nextafterf(p, INFINITY));
        if (k <= 118) {
            float e = 448.0f * p; /* exactly 448 * 2^k: the boundary of the rule */
            check_scale(e);
            check_scale(nextafterf(e, 0.0f));
            check_scale(nextafterf(e, INFINITY));
        }
    }
    check_scale(0.0f);
    check_scale(FLT_MIN);
    check_scale(FLT_MAX);
    check_scale(INFINITY);
    check_scale(NAN);
    check_scale(rw_bits_f32(1));
    check_scale(rw_bits_f32(0x007fffffu));
    /* Documented edges. */
    assert_int_equal(rw_mxfp8_scale_from_amax(0.0f), 0);
    assert_int_equal(rw_mxfp8_scale_from_amax(-0.0f), 0);
    assert_int_equal(rw_mxfp8_scale_from_amax(INFINITY), 254);
    assert_int_equal(rw_mxfp8_scale_from_amax(NAN), 0xff);
    assert_int_equal(rw_mxfp8_scale_from_amax(448.0f), 127);
    assert_int_equal(rw_mxfp8_scale_from_amax(449.0f), 128);
    assert_int_equal(rw_mxfp8_scale_from_amax(224.0f), 126);
}

/* The element rule equals e4m3(x / scale) computed exactly in double. */
static void test_mxfp8_elem_rule(void **state) {
    (void)state;
    rw_rng r = rng_for(3);
    for (int i = 0; i < 300000; i++) {
        uint8_t b = (uint8_t)(rw_rng_u64(&r) % 255); /* 0..254 */
        /* x around 448 * 2^(b-127) times 2^[-20, 1) so the quotient covers e4m3's whole range,
         * the subnormals and the flush to zero. */
        int k = (int)b - 127 + (int)(rw_rng_u64(&r) % 21) - 20;
        float x = ldexpf((float)(rw_rng_uniform(&r) * 448.0), k);
        if (rw_rng_u64(&r) % 2) x = -x;
        if (i % 7 == 0) x = rw_bf16_to_f32(rw_f32_to_bf16(x));
        uint8_t got = rw_mxfp8_quantize_elem(x, b);
        uint8_t want = e4m3_encode_slow((double)x * ldexp(1.0, 127 - b));
        if (got != want)
            fail_msg("mxfp8 elem x=%.9g scale byte %d: 0x%02x, expected 0x%02x", x, b, got, want);
    }
    /* The extreme scales: no overflow in the split multiply. */
    assert_int_equal(rw_mxfp8_quantize_elem(ldexpf(448.0f, -127), 0), 0x7e);
    assert_int_equal(rw_mxfp8_quantize_elem(ldexpf(1.0f, -136), 0), 0x01);
    assert_int_equal(rw_mxfp8_quantize_elem(FLT_MAX, 254),
                     e4m3_encode_slow(FLT_MAX / ldexp(1.0, 127))); /* FLT_MAX / 2^127 is ~2 */
    assert_int_equal(rw_mxfp8_quantize_elem(ldexpf(1.0f, -100), 254), 0x00);
}

/* ------------------------------------------------------------------------------------------ */
/* MXFP8 tensors                                                                               */
/* ------------------------------------------------------------------------------------------ */

static void check_mxfp8_tensor(const uint16_t *x, int64_t rows, int64_t cols) {
    int64_t nb = cols / 32;
    uint8_t *q = malloc((size_t)(rows * cols));
    uint8_t *s = malloc((size_t)(rows * nb));
    float *d = malloc(sizeof(float) * (size_t)(rows * cols));
    assert_non_null(q);
    assert_non_null(s);
    assert_non_null(d);
    rw_err err = {0};
    RW_ASSERT_OK(rw_quant_mxfp8_ref(x, rows, cols, q, s, &err), &err);
    rw_dequant_mxfp8_ref(q, s, rows, cols, d);
    double worst = 0; /* largest error / bound seen, reported on failure */
    for (int64_t r = 0; r < rows; r++) {
        for (int64_t b = 0; b < nb; b++) {
            const uint16_t *xb = x + r * cols + b * 32;
            float amax = 0;
            bool has_nan = false;
            for (int i = 0; i < 32; i++) {
                float v = fabsf(rw_bf16_to_f32(xb[i]));
                if (isnan(v))
                    has_nan = true;
                else if (v > amax)
                    amax = v;
            }
            uint8_t sb = s[r * nb + b];
            uint8_t want_sb = has_nan ? 0xff : mx_scale_slow(amax);
            if (sb != want_sb)
                fail_msg("mxfp8 [%lld, %lld] row %lld block %lld: scale byte %d, expected %d",
                         (long long)rows, (long long)cols, (long long)r, (long long)b, sb, want_sb);
            double sc = ldexp(1.0, sb - 127);
            for (int i = 0; i < 32; i++) {
                int64_t at = r * cols + b * 32 + i;
                double xv = rw_bf16_to_f32(xb[i]);
                double dv = d[at];
                if (has_nan) {
                    if (!isnan(dv))
                        fail_msg("mxfp8: element %lld of a NaN block is %g", (long long)at, dv);
                    continue;
                }
                uint8_t want_q = e4m3_encode_slow(xv / sc);
                if (q[at] != want_q)
                    fail_msg("mxfp8: element %lld (x=%.9g): 0x%02x, expected 0x%02x", (long long)at,
                             xv, q[at], want_q);
                if (isinf(xv)) {
                    if (dv != xv)
                        fail_msg("mxfp8: inf element %lld dequantizes to %g", (long long)at, dv);
                    continue;
                }
                if (isinf(amax)) continue; /* finite values in an inf block go to ~0: see quant.c */
                /* Exact dequantization: code value times the power-of-two scale, except past the
                 * fp32 range, where it is inf (bf16 values within 2^-5 of 2^128 round up to
                 * 2^128; see quant.c). */
                double exact = (double)rw_e4m3_to_f32(q[at]) * sc;
                if (fabs(exact) > FLT_MAX) {
                    if (!isinf(dv) || signbit(dv) != signbit(xv))
                        fail_msg("mxfp8: element %lld x=%.9g: %g, expected an overflow to inf",
                                 (long long)at, xv, dv);
                    continue;
                }
                if (dv != exact)
                    fail_msg("mxfp8 dequant of element %lld: %.9g, exact %.9g", (long long)at, dv,
                             exact);
                double bound = qt_e4m3_half_ulp(fabs(xv) / sc) * sc;
                double e = fabs(dv - xv);
                if (e > bound)
                    fail_msg("mxfp8: element %lld x=%.9g deq=%.9g error %.3g > bound %.3g "
                             "(scale 2^%d)",
                             (long long)at, xv, dv, e, bound, sb - 127);
                /* The coarse form: relative 2^-4 plus the subnormal half-step. */
                assert_true(e <= ldexp(fabs(xv), -4) + ldexp(sc, -10));
                if (bound > 0 && e / bound > worst) worst = e / bound;
                if (xv == 0) assert_true(dv == 0); /* zeros stay zeros */
            }
        }
    }
    free(q);
    free(s);
    free(d);
}

static void test_mxfp8_random_tensors(void **state) {
    (void)state;
    const int64_t shapes[][2] = {{1, 32}, {3, 64}, {96, 128}, {128, 96}, {37, 256}, {64, 2048}};
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
        int64_t rows = shapes[i][0], cols = shapes[i][1];
        uint16_t *x = malloc(sizeof(uint16_t) * (size_t)(rows * cols));
        assert_non_null(x);
        rw_rng r = rng_for(10 + i);
        qt_fill_ranges(x, rows, cols, 32, &r);
        check_mxfp8_tensor(x, rows, cols);
        rw_test_fill_bf16(x, (size_t)(rows * cols), g_seed + i, 0.08f); /* weight-like */
        check_mxfp8_tensor(x, rows, cols);
        free(x);
    }
}

static void test_mxfp8_special_blocks(void **state) {
    (void)state;
    enum { R = 4, C = 96 };
    uint16_t x[R * C];
    rw_test_fill_bf16(x, R * C, g_seed + 77, 1.0f);
    for (int i = 0; i < 32; i++)
        x[i] = i % 3 ? 0x0000 : 0x8000; /* row 0 block 0: +-0 only */
    x[32 + 5] = 0x7fc0;                 /* row 0 block 1: a NaN */
    x[C + 7] = 0x7f80;                  /* row 1 block 0: +inf */
    x[C + 40] = 0xff80;                 /* row 1 block 1: -inf */
    x[2 * C + 64] = 0x7f7f;             /* row 2 block 2: bf16 max */
    for (int i = 0; i < 32; i++)
        x[3 * C + i] = (uint16_t)(1 + i); /* bf16 subnormals */
    check_mxfp8_tensor(x, R, C);

    uint8_t q[R * C], s[R * C / 32];
    float d[R * C];
    rw_err err = {0};
    RW_ASSERT_OK(rw_quant_mxfp8_ref(x, R, C, q, s, &err), &err);
    rw_dequant_mxfp8_ref(q, s, R, C, d);
    /* All-zero block: the smallest scale; zeros (with their signs) stay zeros. */
    assert_int_equal(s[0], 0);
    for (int i = 0; i < 32; i++) {
        assert_int_equal(q[i], i % 3 ? 0x00 : 0x80);
        assert_true(d[i] == 0.0f && (bool)signbit(d[i]) == (i % 3 == 0));
    }
    /* NaN block: NaN scale, every element NaN after dequantization; the NaN itself is 0x7f. */
    assert_int_equal(s[1], 0xff);
    assert_int_equal(q[32 + 5], 0x7f);
    for (int i = 32; i < 64; i++)
        assert_true(isnan(d[i]));
    /* Other blocks of the row are untouched by it. */
    assert_true(s[2] != 0xff && !isnan(d[64]));
    /* inf blocks: scale 2^127, the inf saturates to 448 and dequantizes to inf. */
    assert_int_equal(s[3], 254);
    assert_int_equal(q[C + 7], 0x7e);
    assert_true(isinf(d[C + 7]) && d[C + 7] > 0);
    assert_int_equal(s[4], 254);
    assert_int_equal(q[C + 40], 0xfe);
    assert_true(isinf(d[C + 40]) && d[C + 40] < 0);
    /* bf16 max (about 3.39e38 = 1.99 x 2^127) needs scale 2^120; x / scale = 255 rounds to the
     * e4m3 value 256, and 256 x 2^120 = 2^128 is past the fp32 range: +inf. */
    assert_int_equal(s[2 * 3 + 2], 127 + 120);
    assert_int_equal(q[2 * C + 64], 0x78); /* 2^8 */
    assert_true(isinf(d[2 * C + 64]) && d[2 * C + 64] > 0);
    /* bf16 subnormals 1..32 x 2^-133 (amax 2^-128): the smallest scale 2^-127, every value
     * within the bound (checked above) and none flushed to zero (x / scale >= 2^-6). */
    assert_int_equal(s[3 * 3], 0);
    for (int i = 0; i < 32; i++)
        assert_true(d[3 * C + i] > 0.0f);
}

static void test_mxfp8_dequant_layout(void **state) {
    (void)state;
    /* Hand-built codes and scales: each element must use the scale of its own 32-block. */
    enum { R = 3, C = 64 };
    uint8_t q[R * C], s[R * 2];
    float d[R * C];
    rw_rng r = rng_for(4);
    for (int i = 0; i < R * C; i++) {
        q[i] = (uint8_t)(rw_rng_u64(&r) % 256);
        if ((q[i] & 0x7f) == 0x7f) q[i] = 0x11;
    }
    for (int i = 0; i < R * 2; i++)
        s[i] = (uint8_t)(100 + 7 * i);
    rw_dequant_mxfp8_ref(q, s, R, C, d);
    for (int i = 0; i < R * C; i++) {
        int row = i / C, blk = (i % C) / 32;
        double want = (double)rw_e4m3_to_f32(q[i]) * ldexp(1.0, s[row * 2 + blk] - 127);
        if ((double)d[i] != want) fail_msg("mxfp8 dequant element %d: %g, want %g", i, d[i], want);
    }
}

static void test_mxfp8_bad_args(void **state) {
    (void)state;
    uint16_t x[64] = {0};
    uint8_t q[64], s[2];
    rw_err err = {0};
    assert_int_equal(rw_quant_mxfp8_ref(x, 2, 31, q, s, &err), RW_E_SHAPE);
    assert_non_null(strstr(err.msg, "31"));
    assert_int_equal(rw_quant_mxfp8_ref(x, -1, 32, q, s, &err), RW_E_SHAPE);
    assert_int_equal(rw_quant_mxfp8_ref(NULL, 1, 32, q, s, &err), RW_E_INVALID_ARG);
    assert_int_equal(rw_quant_mxfp8_ref(x, 1, 32, q, NULL, &err), RW_E_INVALID_ARG);
    assert_int_equal(rw_quant_mxfp8_ref(x, 0, 32, NULL, NULL, &err), RW_OK); /* empty */
    assert_int_equal(rw_quant_fp8_block_ref(x, -3, 4, q, NULL, &err), RW_E_SHAPE);
    assert_int_equal(rw_quant_fp8_block_ref(x, 1, 4, NULL, (float *)s, &err), RW_E_INVALID_ARG);
    if (!rw_cuda_built()) {
        assert_int_equal(rw_quant_mxfp8_cuda(x, 1, 32, q, s, NULL, &err), RW_E_NO_DEVICE);
        assert_int_equal(rw_quant_fp8_block_cuda(x, 1, 32, q, NULL, NULL, &err), RW_E_NO_DEVICE);
        assert_int_equal(rw_dequant_mxfp8_cuda(q, s, 1, 32, x, NULL, &err), RW_E_NO_DEVICE);
        assert_int_equal(rw_dequant_fp8_block_cuda(q, NULL, 1, 32, x, NULL, &err), RW_E_NO_DEVICE);
    }
}

/* ------------------------------------------------------------------------------------------ */
/* FP8 128x128 block                                                                           */
/* ------------------------------------------------------------------------------------------ */

static void check_fp8_tensor(const uint16_t *x, int64_t rows, int64_t cols) {
    int64_t sr = (rows + 127) / 128, sc = (cols + 127) / 128;
    uint8_t *q = malloc((size_t)(rows * cols));
    float *s = malloc(sizeof(float) * (size_t)(sr * sc));
    float *d = malloc(sizeof(float) * (size_t)(rows * cols));
    assert_non_null(q);
    assert_non_null(s);
    assert_non_null(d);
    rw_err err = {0};
    RW_ASSERT_OK(rw_quant_fp8_block_ref(x, rows, cols, q, s, &err), &err);
    rw_dequant_fp8_block_ref(q, s, rows, cols, d);
    for (int64_t br = 0; br < sr; br++) {
        for (int64_t bc = 0; bc < sc; bc++) {
            /* amax over the elements this (possibly partial) block holds. */
            float amax = 0;
            bool nan = false;
            for (int64_t r = br * 128; r < rows && r < br * 128 + 128; r++)
                for (int64_t c = bc * 128; c < cols && c < bc * 128 + 128; c++) {
                    float v = fabsf(rw_bf16_to_f32(x[r * cols + c]));
                    if (isnan(v))
                        nan = true;
                    else if (v > amax)
                        amax = v;
                }
            float want_s = nan || amax == 0 ? 1.0f : amax / 448.0f;
            float got_s = s[br * sc + bc];
            if (rw_f32_bits(got_s) != rw_f32_bits(want_s))
                fail_msg("fp8-block [%lld, %lld] block (%lld, %lld): scale %.9g, expected %.9g",
                         (long long)rows, (long long)cols, (long long)br, (long long)bc, got_s,
                         want_s);
            for (int64_t r = br * 128; r < rows && r < br * 128 + 128; r++)
                for (int64_t c = bc * 128; c < cols && c < bc * 128 + 128; c++) {
                    int64_t at = r * cols + c;
                    float xv = rw_bf16_to_f32(x[at]);
                    uint8_t want_q = e4m3_encode_slow((double)(xv / got_s));
                    if (q[at] != want_q)
                        fail_msg("fp8-block element (%lld, %lld) x=%.9g: 0x%02x, expected 0x%02x",
                                 (long long)r, (long long)c, xv, q[at], want_q);
                    if (isnan(xv)) {
                        assert_true(isnan(d[at]));
                        continue;
                    }
                    if (isinf(amax)) {
                        assert_true(isnan(d[at])); /* 0 * inf and NaN * inf */
                        continue;
                    }
                    if (nan) continue; /* scale 1.0 may saturate the block's other values */
                    assert_true(d[at] == rw_e4m3_to_f32(q[at]) * got_s);
                    double e = fabs((double)d[at] - xv);
                    double bound = qt_fp8_block_bound(xv, got_s);
                    if (e > bound)
                        fail_msg("fp8-block element (%lld, %lld) x=%.9g deq=%.9g error %.3g > %.3g",
                                 (long long)r, (long long)c, xv, d[at], e, bound);
                }
        }
    }
    free(q);
    free(s);
    free(d);
}

static void test_fp8_block_random_tensors(void **state) {
    (void)state;
    const int64_t shapes[][2] = {{1, 1},     {5, 7},    {128, 128}, {129, 128},
                                 {200, 300}, {96, 128}, {257, 96},  {130, 520}};
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
        int64_t rows = shapes[i][0], cols = shapes[i][1];
        uint16_t *x = malloc(sizeof(uint16_t) * (size_t)(rows * cols));
        assert_non_null(x);
        rw_test_fill_bf16(x, (size_t)(rows * cols), g_seed + 100 + i, 0.08f);
        check_fp8_tensor(x, rows, cols);
        rw_rng r = rng_for(200 + i);
        qt_fill_ranges(x, rows, cols, 7, &r); /* wide dynamic range within each block */
        check_fp8_tensor(x, rows, cols);
        free(x);
    }
}

static void test_fp8_block_special(void **state) {
    (void)state;
    enum { R = 130, C = 260 }; /* 2 x 3 blocks, the last row and column partial */
    uint16_t *x = malloc(sizeof(uint16_t) * R * C);
    assert_non_null(x);
    rw_test_fill_bf16(x, R * C, g_seed + 300, 2.0f);
    for (int r = 0; r < 128; r++)
        for (int c = 0; c < 128; c++)
            x[r * C + c] = 0;  /* block (0,0): zeros */
    x[5 * C + 130] = 0x7fc0;   /* block (0,1): NaN */
    x[129 * C + 259] = 0xff80; /* block (1,2): -inf, partial corner */
    check_fp8_tensor(x, R, C);
    uint8_t *q = malloc(R * C);
    float s[6], *d = malloc(sizeof(float) * R * C);
    rw_err err = {0};
    RW_ASSERT_OK(rw_quant_fp8_block_ref(x, R, C, q, s, &err), &err);
    rw_dequant_fp8_block_ref(q, s, R, C, d);
    assert_true(s[0] == 1.0f); /* all-zero block: scale 1.0, values stay zero */
    for (int c = 0; c < 128; c++)
        assert_true(q[c] == 0 && d[c] == 0.0f);
    assert_true(s[1] == 1.0f); /* NaN block: scale 1.0, the NaN encodes as NaN */
    assert_int_equal(q[5 * C + 130], 0x7f);
    assert_true(isinf(s[5])); /* -inf block: scale inf, dequantizes to NaN */
    assert_int_equal(q[129 * C + 259], 0x7f); /* -inf / inf is NaN: canonical 0x7f */
    assert_true(isnan(d[128 * C + 258]));
    assert_true(!isnan(d[128 * C + 200])); /* block (1, 1) is normal */
    /* Blocks without specials are normal. */
    assert_true(isfinite(s[2]) && s[2] > 0 && s[2] != 1.0f);
    free(x);
    free(q);
    free(d);
}

static void test_fp8_block_dequant_layout(void **state) {
    (void)state;
    enum { R = 140, C = 300 };
    uint8_t *q = malloc(R * C);
    float s[2 * 3], *d = malloc(sizeof(float) * R * C);
    rw_rng r = rng_for(5);
    for (int i = 0; i < R * C; i++)
        q[i] = (uint8_t)(rw_rng_u64(&r) % 0x7f); /* no NaN codes */
    for (int i = 0; i < 6; i++)
        s[i] = (float)(0.5 + i);
    rw_dequant_fp8_block_ref(q, s, R, C, d);
    for (int i = 0; i < R * C; i++) {
        int row = i / C, col = i % C;
        float want = rw_e4m3_to_f32(q[i]) * s[(row / 128) * 3 + col / 128];
        if (d[i] != want)
            fail_msg("fp8-block dequant element (%d, %d): %g, want %g", row, col, d[i], want);
    }
    free(q);
    free(d);
}

/* ------------------------------------------------------------------------------------------ */
/* Policy                                                                                      */
/* ------------------------------------------------------------------------------------------ */

static void load_cfg(rw_config *cfg, int layers, int hidden, int heads, int head_dim, int inter,
                     const char *quant_json) {
    char buf[2048];
    snprintf(buf, sizeof buf,
             "{\"model_type\": \"qwen3_moe\", \"vocab_size\": 512, \"hidden_size\": %d, "
             "\"num_hidden_layers\": %d, \"num_attention_heads\": %d, \"num_key_value_heads\": 2, "
             "\"head_dim\": %d, \"num_experts\": 8, \"num_experts_per_tok\": 2, "
             "\"moe_intermediate_size\": %d%s%s}",
             hidden, layers, heads, head_dim, inter,
             quant_json ? ", \"quantization_config\": " : "", quant_json ? quant_json : "");
    rw_err err = {0};
    RW_ASSERT_OK(rw_config_parse(buf, strlen(buf), cfg, &err), &err);
}

static rw_wfmt pol(const rw_config *cfg, const char *name) {
    rw_wname w;
    rw_err err = {0};
    RW_ASSERT_OK(rw_name_parse(name, cfg, &w, &err), &err);
    return rw_quant_policy(cfg, &w);
}

#define ASSERT_POL(cfg, name, want)                                                                \
    do {                                                                                           \
        rw_wfmt got_ = pol((cfg), (name));                                                         \
        if (got_ != (want))                                                                        \
            fail_msg("policy of %s: %s, expected %s", (name), rw_wfmt_str(got_),                   \
                     rw_wfmt_str(want));                                                           \
    } while (0)

/* A table of (name, expected format) checked in order with ASSERT_POL. */
typedef struct pol_case {
    const char *name;
    rw_wfmt want;
} pol_case;

static void check_pols(const rw_config *cfg, const pol_case *c, size_t n) {
    for (size_t i = 0; i < n; i++)
        ASSERT_POL(cfg, c[i].name, c[i].want);
}

#define CHECK_POLS(cfg, ...)                                                                       \
    do {                                                                                           \
        const pol_case pc_[] = {__VA_ARGS__};                                                      \
        check_pols((cfg), pc_, sizeof pc_ / sizeof pc_[0]);                                        \
    } while (0)

static void test_not_convert_match(void **state) {
    (void)state;
    char *e[] = {"model.layers.4.", "model.layers.7", "model.layers.3.self_attn.q_proj", "lm_head"};
    rw_quant_config q = {.method = RW_QMETHOD_MXFP8, .n_not_convert = 4};
    for (int i = 0; i < 4; i++)
        q.not_convert[i] = e[i];
    const struct {
        const char *name;
        bool match;
    } cases[] = {
        {"model.layers.4.mlp.experts.0.up_proj.weight", true},
        {"model.layers.4.self_attn.q_proj.weight", true},
        {"model.layers.40.mlp.experts.0.up_proj.weight", false},
        {"model.layers.41.self_attn.o_proj.weight", false},
        {"model.layers.7.mlp.experts.3.down_proj.weight", true},
        {"model.layers.7", true},
        {"model.layers.70.mlp.gate.weight", false},
        {"model.layers.77.self_attn.k_proj.weight", false},
        {"model.layers.3.self_attn.q_proj.weight", true},
        {"model.layers.3.self_attn.q_proj.weight_scale_inv", true},
        {"model.layers.3.self_attn.q_proj_x.weight", false},
        {"model.layers.3.self_attn.k_proj.weight", false},
        {"model.layers.30.self_attn.q_proj.weight", false},
        {"lm_head.weight", true},
        {"lm_headx.weight", false},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        if (rw_quant_not_convert_match(&q, cases[i].name) != cases[i].match)
            fail_msg("not_convert match of %s: expected %d", cases[i].name, cases[i].match);
    /* An entry with the trailing dot needs the name to continue past it. */
    assert_false(rw_quant_not_convert_match(&q, "model.layers.4"));
    assert_false(rw_quant_not_convert_match(&q, "model"));
    assert_false(rw_quant_not_convert_match(NULL, "model.layers.4.x"));
    rw_quant_config none = {0};
    assert_false(rw_quant_not_convert_match(&none, "model.layers.4.x"));
}

static void test_policy_tiny_mxfp8_last1(void **state) {
    (void)state;
    rw_config cfg;
    load_cfg(&cfg, 3, 128, 4, 32, 96,
             "{\"quant_method\": \"mxfp8\", \"fmt\": \"e4m3\", \"weight_block_size\": [1, 32], "
             "\"scale_fmt\": \"ue8m0\", \"activation_scheme\": \"dynamic\", "
             "\"modules_to_not_convert\": [\"model.layers.2.\", \"lm_head\"]}");
    for (int l = 0; l < 2; l++) {
        char n[128];
        const char *q_kinds[] = {"self_attn.q_proj.weight",
                                 "self_attn.k_proj.weight",
                                 "self_attn.v_proj.weight",
                                 "self_attn.o_proj.weight",
                                 "self_attn.o_proj.weight_scale_inv",
                                 "mlp.experts.0.gate_proj.weight",
                                 "mlp.experts.7.up_proj.weight",
                                 "mlp.experts.3.down_proj.weight",
                                 "mlp.experts.3.down_proj.weight_scale_inv",
                                 "mlp.experts.gate_up_proj",
                                 "mlp.experts.down_proj"};
        for (size_t i = 0; i < sizeof q_kinds / sizeof q_kinds[0]; i++) {
            snprintf(n, sizeof n, "model.layers.%d.%s", l, q_kinds[i]);
            ASSERT_POL(&cfg, n, RW_WFMT_MXFP8);
        }
        const char *b_kinds[] = {"input_layernorm.weight", "post_attention_layernorm.weight",
                                 "self_attn.q_norm.weight", "self_attn.k_norm.weight",
                                 "mlp.gate.weight"};
        for (size_t i = 0; i < sizeof b_kinds / sizeof b_kinds[0]; i++) {
            snprintf(n, sizeof n, "model.layers.%d.%s", l, b_kinds[i]);
            ASSERT_POL(&cfg, n, RW_WFMT_BF16);
        }
    }
    CHECK_POLS(&cfg, {"model.layers.2.self_attn.q_proj.weight", RW_WFMT_BF16},
               {"model.layers.2.mlp.experts.5.up_proj.weight", RW_WFMT_BF16},
               {"model.layers.2.mlp.experts.gate_up_proj", RW_WFMT_BF16},
               {"model.embed_tokens.weight", RW_WFMT_BF16}, {"model.norm.weight", RW_WFMT_BF16},
               {"lm_head.weight", RW_WFMT_BF16});
    rw_config_free(&cfg);
}

static void test_policy_layer_4_vs_40(void **state) {
    (void)state;
    const char *entries[] = {"model.layers.4.", "model.layers.4"};
    for (int v = 0; v < 2; v++) {
        char qj[512];
        snprintf(qj, sizeof qj,
                 "{\"quant_method\": \"mxfp8\", \"modules_to_not_convert\": [\"%s\"]}", entries[v]);
        rw_config cfg;
        load_cfg(&cfg, 48, 128, 4, 32, 96, qj);
        CHECK_POLS(&cfg, {"model.layers.4.mlp.experts.1.gate_proj.weight", RW_WFMT_BF16},
                   {"model.layers.4.self_attn.o_proj.weight", RW_WFMT_BF16},
                   {"model.layers.40.mlp.experts.1.gate_proj.weight", RW_WFMT_MXFP8},
                   {"model.layers.40.self_attn.o_proj.weight", RW_WFMT_MXFP8},
                   {"model.layers.41.mlp.experts.down_proj", RW_WFMT_MXFP8},
                   {"model.layers.47.self_attn.q_proj.weight", RW_WFMT_MXFP8},
                   {"model.layers.3.self_attn.q_proj.weight", RW_WFMT_MXFP8});
        rw_config_free(&cfg);
    }
}

static void test_policy_modules_and_k(void **state) {
    (void)state;
    rw_config cfg;
    /* Module entries: one projection, one layer's experts, one layer's mlp, one single expert. */
    load_cfg(&cfg, 6, 128, 4, 32, 96,
             "{\"quant_method\": \"fp8\", \"weight_block_size\": [128, 128], "
             "\"modules_to_not_convert\": [\"model.layers.0.self_attn.q_proj\", "
             "\"model.layers.1.mlp.experts\", \"model.layers.2.mlp\", "
             "\"model.layers.3.mlp.experts.5.up_proj\"]}");
    CHECK_POLS(&cfg, {"model.layers.0.self_attn.q_proj.weight", RW_WFMT_BF16},
               {"model.layers.0.self_attn.k_proj.weight", RW_WFMT_FP8_BLOCK},
               {"model.layers.0.mlp.experts.0.up_proj.weight", RW_WFMT_FP8_BLOCK},
               {"model.layers.1.mlp.experts.0.up_proj.weight", RW_WFMT_BF16},
               {"model.layers.1.mlp.experts.down_proj", RW_WFMT_BF16},
               {"model.layers.1.self_attn.v_proj.weight", RW_WFMT_FP8_BLOCK},
               {"model.layers.2.mlp.experts.6.down_proj.weight", RW_WFMT_BF16},
               {"model.layers.2.self_attn.o_proj.weight", RW_WFMT_FP8_BLOCK});
    /* A single-expert entry leaves the layer's experts quantized (one format per layer); the
     * name itself still matches. */
    CHECK_POLS(&cfg, {"model.layers.3.mlp.experts.5.up_proj.weight", RW_WFMT_FP8_BLOCK},
               {"model.layers.3.mlp.experts.4.up_proj.weight", RW_WFMT_FP8_BLOCK});
    assert_true(
        rw_quant_not_convert_match(&cfg.quant, "model.layers.3.mlp.experts.5.up_proj.weight"));
    ASSERT_POL(&cfg, "model.layers.5.mlp.experts.0.gate_proj.weight", RW_WFMT_FP8_BLOCK);
    rw_config_free(&cfg);

    /* K % 32 != 0: I = 80 keeps every expert of every layer in bf16 (down has K = I; gate and up
     * follow their layer); o_proj with K = nH * hd = 4 * 20 = 80 is bf16 while q (K = H) is not. */
    load_cfg(&cfg, 2, 128, 4, 20, 80, "{\"quant_method\": \"mxfp8\"}");
    CHECK_POLS(&cfg, {"model.layers.0.mlp.experts.0.down_proj.weight", RW_WFMT_BF16},
               {"model.layers.0.mlp.experts.0.gate_proj.weight", RW_WFMT_BF16},
               {"model.layers.1.mlp.experts.gate_up_proj", RW_WFMT_BF16},
               {"model.layers.0.self_attn.o_proj.weight", RW_WFMT_BF16},
               {"model.layers.0.self_attn.q_proj.weight", RW_WFMT_MXFP8});
    rw_config_free(&cfg);

    /* H % 32 != 0: nothing with K = H is quantized. */
    load_cfg(&cfg, 1, 80, 4, 32, 96, "{\"quant_method\": \"mxfp8\"}");
    CHECK_POLS(&cfg, {"model.layers.0.self_attn.q_proj.weight", RW_WFMT_BF16},
               {"model.layers.0.self_attn.o_proj.weight", RW_WFMT_MXFP8}, /* K = 128 */
               {"model.layers.0.mlp.experts.0.down_proj.weight", RW_WFMT_BF16});
    rw_config_free(&cfg);

    /* No quantization_config: everything bf16. */
    load_cfg(&cfg, 1, 128, 4, 32, 96, NULL);
    CHECK_POLS(&cfg, {"model.layers.0.self_attn.q_proj.weight", RW_WFMT_BF16},
               {"model.layers.0.mlp.experts.0.up_proj.weight", RW_WFMT_BF16});
    rw_config_free(&cfg);
}

static void test_policy_helpers(void **state) {
    (void)state;
    int64_t sh[2];
    rw_quant_scale_shape(RW_WFMT_MXFP8, 96, 128, sh);
    assert_true(sh[0] == 96 && sh[1] == 4);
    rw_quant_scale_shape(RW_WFMT_FP8_BLOCK, 96, 128, sh);
    assert_true(sh[0] == 1 && sh[1] == 1);
    rw_quant_scale_shape(RW_WFMT_FP8_BLOCK, 2048, 768, sh);
    assert_true(sh[0] == 16 && sh[1] == 6);
    rw_quant_scale_shape(RW_WFMT_FP8_BLOCK, 129, 257, sh);
    assert_true(sh[0] == 2 && sh[1] == 3);
    rw_quant_scale_shape(RW_WFMT_MXFP8, 768, 2048, sh);
    assert_true(sh[0] == 768 && sh[1] == 64);
    assert_int_equal(rw_quant_scale_dtype(RW_WFMT_MXFP8), RW_DTYPE_U8);
    assert_int_equal(rw_quant_scale_dtype(RW_WFMT_FP8_BLOCK), RW_DTYPE_F32);
    assert_int_equal(rw_quant_scale_dtype(RW_WFMT_BF16), RW_DTYPE_INVALID);
    assert_string_equal(rw_wfmt_str(RW_WFMT_BF16), "bf16");
    assert_string_equal(rw_wfmt_str(RW_WFMT_MXFP8), "mxfp8");
    assert_string_equal(rw_wfmt_str(RW_WFMT_FP8_BLOCK), "fp8-block");
}

int main(void) {
    g_seed = qt_seed("test_quant");
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_e4m3_every_byte),
        cmocka_unit_test(test_e4m3_encode_all_bf16),
        cmocka_unit_test(test_e4m3_encode_random_f32),
        cmocka_unit_test(test_e4m3_ties),
        cmocka_unit_test(test_e4m3_saturation_nan_inf),
        cmocka_unit_test(test_ue8m0_every_byte),
        cmocka_unit_test(test_mxfp8_scale_rule),
        cmocka_unit_test(test_mxfp8_elem_rule),
        cmocka_unit_test(test_mxfp8_random_tensors),
        cmocka_unit_test(test_mxfp8_special_blocks),
        cmocka_unit_test(test_mxfp8_dequant_layout),
        cmocka_unit_test(test_mxfp8_bad_args),
        cmocka_unit_test(test_fp8_block_random_tensors),
        cmocka_unit_test(test_fp8_block_special),
        cmocka_unit_test(test_fp8_block_dequant_layout),
        cmocka_unit_test(test_not_convert_match),
        cmocka_unit_test(test_policy_tiny_mxfp8_last1),
        cmocka_unit_test(test_policy_layer_4_vs_40),
        cmocka_unit_test(test_policy_modules_and_k),
        cmocka_unit_test(test_policy_helpers),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
