/* test_dtype.c - dtype sizes and names, and the scalar conversions of rw_core.h checked against
 * independent references: every bf16 / f16 / e4m3 / ue8m0 bit pattern decoded, every rounding
 * midpoint between consecutive representable values (ties to even) and its two neighbouring
 * floats, carries into the exponent, overflow and saturation, NaN, subnormals and signed zero.
 *
 * The references work in double over the table of representable values: "the nearest value,
 * ties to the even code", which is the definition rather than the bit manipulation under test. */
#include "rw_test.h"

#include <float.h>
#include <math.h>

/* ---- references ---------------------------------------------------------------------------- */

/* Index of the nearest of vals[0..n-1] (ascending, non-negative) to x >= 0; ties go to the even
 * index. Indices are the formats' codes of the positive values. */
static int ref_nearest(double x, const double *vals, int n) {
    if (x >= vals[n - 1]) return n - 1;
    int lo = 0, hi = n - 1; /* vals[lo] <= x < vals[hi] */
    while (hi - lo > 1) {
        int mid = (lo + hi) / 2;
        if (vals[mid] <= x)
            lo = mid;
        else
            hi = mid;
    }
    double dl = x - vals[lo], dh = vals[hi] - x;
    if (dl < dh) return lo;
    if (dh < dl) return hi;
    return (lo & 1) ? hi : lo;
}

static double bf16_value(int code) { /* positive codes 0..0x7f80; 0x7f80 (inf) counts as 2^128 */
    if (code == 0x7f80) return ldexp(1.0, 128);
    int e = code >> 7, m = code & 0x7f;
    return e == 0 ? ldexp(m, -133) : ldexp(128 + m, e - 134);
}

static double f16_value(int code) { /* positive codes 0..0x7c00; 0x7c00 (inf) counts as 2^16 */
    if (code == 0x7c00) return 65536.0;
    int e = code >> 10, m = code & 0x3ff;
    return e == 0 ? ldexp(m, -24) : ldexp(1024 + m, e - 25);
}

static double e4m3_value(int code) { /* positive finite codes 0..0x7e */
    int e = code >> 3, m = code & 7;
    return e == 0 ? ldexp(m, -9) : ldexp(8 + m, e - 10);
}

typedef struct {
    double bf16[0x7f81], f16[0x7c01], e4m3[0x7f];
} tables;

static void make_tables(tables *t) {
    for (int c = 0; c <= 0x7f80; c++)
        t->bf16[c] = bf16_value(c);
    for (int c = 0; c <= 0x7c00; c++)
        t->f16[c] = f16_value(c);
    for (int c = 0; c <= 0x7e; c++)
        t->e4m3[c] = e4m3_value(c);
}

static uint16_t ref_bf16(const tables *t, float f) {
    uint32_t u = rw_f32_bits(f);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    if (isnan(f)) return 0; /* callers check NaN separately */
    return (uint16_t)(sign | ref_nearest(fabs((double)f), t->bf16, 0x7f81));
}

static uint16_t ref_f16(const tables *t, float f) {
    uint16_t sign = signbit(f) ? 0x8000 : 0;
    return (uint16_t)(sign | ref_nearest(fabs((double)f), t->f16, 0x7c01));
}

static uint8_t ref_e4m3(const tables *t, float f) {
    uint8_t sign = signbit(f) ? 0x80 : 0;
    return (uint8_t)(sign | ref_nearest(fabs((double)f), t->e4m3, 0x7f));
}

static float bits(uint32_t u) {
    return rw_bits_f32(u);
}

/* Random floats over the whole exponent range (and a dense band around the formats' ranges). */
static float random_float(rw_rng *r) {
    uint64_t x = rw_rng_u64(r);
    if (x & 1) return bits((uint32_t)(x >> 32));
    /* exponent in [2^-30, 2^20): where e4m3, f16 and bf16 all have their interesting values */
    double m = 1.0 + (double)((x >> 12) & 0xfffff) / 1048576.0;
    int e = (int)((x >> 40) % 50) - 30;
    float f = (float)ldexp(m, e);
    return (x >> 63) ? -f : f;
}

/* ---- bf16 ---------------------------------------------------------------------------------- */

static void test_bf16_all_patterns(void **state) {
    (void)state;
    for (uint32_t h = 0; h <= 0xffff; h++) {
        float f = rw_bf16_to_f32((uint16_t)h);
        assert_int_equal(rw_f32_bits(f), h << 16); /* decode is exact: the upper half of a float */
        uint16_t back = rw_f32_to_bf16(f);
        bool nan = ((h >> 7) & 0xff) == 0xff && (h & 0x7f);
        if (nan) {
            if (back != 0x7fc0) /* every NaN comes back as the canonical quiet NaN */
                fail_msg("bf16 NaN 0x%04x came back as 0x%04x, not 0x7fc0", h, back);
        } else if (back != h) {
            fail_msg("bf16 0x%04x round trip gave 0x%04x", h, back);
        }
    }
}

static void test_bf16_rounding_boundaries(void **state) {
    (void)state;
    tables *t = malloc(sizeof *t);
    assert_non_null(t);
    make_tables(t);
    int checked = 0;
    for (uint32_t c = 0; c < 0x7f80; c++) {
        for (uint32_t s = 0; s <= 0x8000; s += 0x8000) {
            uint32_t mid = ((s | c) << 16) | 0x8000u; /* exactly halfway between c and c + 1 */
            uint16_t even = (uint16_t)(s | ((c & 1) ? c + 1 : c));
            uint16_t got = rw_f32_to_bf16(bits(mid));
            if (got != even) fail_msg("bf16 tie 0x%08x -> 0x%04x, want 0x%04x", mid, got, even);
            got = rw_f32_to_bf16(bits(mid + 1)); /* just above: away from zero */
            if (got != (uint16_t)(s | (c + 1)))
                fail_msg("bf16 above tie 0x%08x -> 0x%04x", mid + 1, got);
            got = rw_f32_to_bf16(bits(mid - 1)); /* just below: toward zero */
            if (got != (uint16_t)(s | c)) fail_msg("bf16 below tie 0x%08x -> 0x%04x", mid - 1, got);
            checked += 3;
        }
    }
    assert_int_equal(checked, 6 * 0x7f80);
    /* carries: a mantissa of all ones rounding up moves to the next exponent */
    assert_int_equal(rw_f32_to_bf16(bits(0x3fffffffu)), 0x4000);
    assert_int_equal(rw_f32_to_bf16(bits(0x3f7fc000u)), 0x3f80);
    assert_int_equal(rw_f32_to_bf16(bits(0x007fffffu)), 0x0080); /* subnormal -> smallest normal */
    /* overflow: past the midpoint above the largest finite bf16 is inf, as IEEE rounding */
    assert_int_equal(rw_f32_to_bf16(FLT_MAX), 0x7f80);
    assert_int_equal(rw_f32_to_bf16(-FLT_MAX), 0xff80);
    assert_int_equal(rw_f32_to_bf16(bits(0x7f7f7fffu)), 0x7f7f);
    assert_int_equal(rw_f32_to_bf16(INFINITY), 0x7f80);
    assert_int_equal(rw_f32_to_bf16(-INFINITY), 0xff80);
    /* NaN stays NaN, never becomes inf (a signalling NaN with a low payload is the trap) */
    assert_int_equal(rw_f32_to_bf16(bits(0x7f800001u)), 0x7fc0);
    assert_int_equal(rw_f32_to_bf16(bits(0xff800001u)), 0x7fc0);
    assert_int_equal(rw_f32_to_bf16(bits(0x7fc00000u)), 0x7fc0);
    assert_int_equal(rw_f32_to_bf16(bits(0x7fffffffu)), 0x7fc0);
    assert_int_equal(rw_f32_to_bf16(bits(0xffc00000u)), 0x7fc0);
    assert_int_equal(rw_f32_to_bf16(-0.0f), 0x8000);
    assert_int_equal(rw_f32_to_bf16(1.0f), 0x3f80);
    /* random floats against the reference */
    rw_rng r;
    rw_rng_seed(&r, 0xbf16);
    for (int i = 0; i < 2000000; i++) {
        float f = random_float(&r);
        if (isnan(f)) continue;
        uint16_t want = ref_bf16(t, f), got = rw_f32_to_bf16(f);
        if (want != got)
            fail_msg("bf16(0x%08x) = 0x%04x, reference 0x%04x", rw_f32_bits(f), got, want);
    }
    free(t);
}

/* ---- f16 ----------------------------------------------------------------------------------- */

static void test_f16_all_patterns(void **state) {
    (void)state;
    for (uint32_t h = 0; h <= 0xffff; h++) {
        float f = rw_f16_to_f32((uint16_t)h);
        uint32_t e = (h >> 10) & 0x1f, m = h & 0x3ff;
        bool neg = h & 0x8000;
        if (e == 0x1f && m) {
            if (!isnan(f)) fail_msg("f16 0x%04x should decode to NaN", h);
            assert_int_equal(!!signbit(f), neg);
            uint16_t back = rw_f32_to_f16(f);
            if (!(((back >> 10) & 0x1f) == 0x1f && (back & 0x3ff)))
                fail_msg("f16 NaN 0x%04x came back as 0x%04x", h, back);
            assert_int_equal(back & 0x8000, h & 0x8000);
            continue;
        }
        double want = e == 0x1f ? INFINITY : f16_value((int)(h & 0x7fff));
        if (neg) want = -want;
        float wf = (float)want;
        if (rw_f32_bits(f) != rw_f32_bits(wf))
            fail_msg("f16 0x%04x decoded to 0x%08x, want 0x%08x", h, rw_f32_bits(f),
                     rw_f32_bits(wf));
        uint16_t back = rw_f32_to_f16(f);
        if (back != h) fail_msg("f16 0x%04x round trip gave 0x%04x", h, back);
    }
}

static void test_f16_rounding_boundaries(void **state) {
    (void)state;
    tables *t = malloc(sizeof *t);
    assert_non_null(t);
    make_tables(t);
    for (int c = 0; c < 0x7c00; c++) {
        /* f16 midpoints have 12 significant bits: exact in float */
        float mid = (float)((t->f16[c] + t->f16[c + 1]) / 2);
        assert_true((double)mid == (t->f16[c] + t->f16[c + 1]) / 2);
        for (int s = 0; s <= 1; s++) {
            float m = s ? -mid : mid;
            uint16_t sg = s ? 0x8000 : 0;
            uint16_t even = (uint16_t)(sg | ((c & 1) ? c + 1 : c));
            uint16_t got = rw_f32_to_f16(m);
            if (got != even) fail_msg("f16 tie %a -> 0x%04x, want 0x%04x", (double)m, got, even);
            got = rw_f32_to_f16(nextafterf(m, s ? -INFINITY : INFINITY));
            if (got != (uint16_t)(sg | (c + 1)))
                fail_msg("f16 above tie %a -> 0x%04x", (double)m, got);
            got = rw_f32_to_f16(nextafterf(m, 0.0f));
            if (got != (uint16_t)(sg | c)) fail_msg("f16 below tie %a -> 0x%04x", (double)m, got);
        }
    }
    /* overflow: 65520 is the midpoint between 65504 and "65536"; ties to even = inf */
    assert_int_equal(rw_f32_to_f16(65504.0f), 0x7bff);
    assert_int_equal(rw_f32_to_f16(65519.996f), 0x7bff);
    assert_int_equal(rw_f32_to_f16(65520.0f), 0x7c00);
    assert_int_equal(rw_f32_to_f16(1e9f), 0x7c00);
    assert_int_equal(rw_f32_to_f16(-1e9f), 0xfc00);
    assert_int_equal(rw_f32_to_f16(INFINITY), 0x7c00);
    assert_int_equal(rw_f32_to_f16(-INFINITY), 0xfc00);
    /* subnormal range: step 2^-24; 2^-25 is a tie between 0 and the smallest subnormal */
    assert_int_equal(rw_f32_to_f16(ldexpf(1, -24)), 0x0001);
    assert_int_equal(rw_f32_to_f16(ldexpf(1, -25)), 0x0000);
    assert_int_equal(rw_f32_to_f16(nextafterf(ldexpf(1, -25), 1)), 0x0001);
    assert_int_equal(rw_f32_to_f16(ldexpf(3, -25)), 0x0002); /* 1.5 ulp: tie to even (2) */
    assert_int_equal(rw_f32_to_f16(ldexpf(1, -26)), 0x0000);
    assert_int_equal(rw_f32_to_f16(-ldexpf(1, -26)), 0x8000);
    assert_int_equal(rw_f32_to_f16(FLT_TRUE_MIN), 0x0000);
    assert_int_equal(rw_f32_to_f16(ldexpf(1023, -24)), 0x03ff);
    assert_int_equal(rw_f32_to_f16(ldexpf(2047, -25)), 0x0400); /* carry into the normals */
    assert_int_equal(rw_f32_to_f16(-0.0f), 0x8000);
    assert_int_equal(rw_f32_to_f16(0.0f), 0x0000);
    /* NaN kept, quiet, sign kept */
    assert_int_equal(rw_f32_to_f16(bits(0x7fc00000u)) & 0x7e00, 0x7e00);
    assert_int_equal(rw_f32_to_f16(bits(0xff800001u)) & 0xfe00, 0xfe00);
    rw_rng r;
    rw_rng_seed(&r, 0xf16);
    for (int i = 0; i < 2000000; i++) {
        float f = random_float(&r);
        if (isnan(f)) continue;
        uint16_t want = ref_f16(t, f), got = rw_f32_to_f16(f);
        if (want != got)
            fail_msg("f16(0x%08x) = 0x%04x, reference 0x%04x", rw_f32_bits(f), got, want);
    }
    free(t);
}

/* ---- e4m3 ---------------------------------------------------------------------------------- */

static void test_e4m3_all_patterns(void **state) {
    (void)state;
    for (int b = 0; b < 256; b++) {
        float f = rw_e4m3_to_f32((uint8_t)b);
        if ((b & 0x7f) == 0x7f) {
            if (!isnan(f)) fail_msg("e4m3 0x%02x should be NaN", b);
            assert_int_equal(rw_f32_to_e4m3(f), 0x7f); /* NaN is canonical: 0x7f */
            continue;
        }
        double want = e4m3_value(b & 0x7f);
        if (b & 0x80) want = -want;
        if (rw_f32_bits(f) != rw_f32_bits((float)want))
            fail_msg("e4m3 0x%02x decoded to %a, want %a", b, (double)f, want);
        assert_int_equal(rw_f32_to_e4m3(f), b);
    }
    assert_true(rw_e4m3_to_f32(0x7e) == 448.0f);
    assert_true(rw_e4m3_to_f32(0x01) == ldexpf(1, -9));
    assert_true(rw_e4m3_to_f32(0x08) == ldexpf(1, -6));
    assert_int_equal(rw_f32_bits(rw_e4m3_to_f32(0x80)), 0x80000000u);
}

static void test_e4m3_rounding_boundaries(void **state) {
    (void)state;
    tables *t = malloc(sizeof *t);
    assert_non_null(t);
    make_tables(t);
    for (int c = 0; c < 0x7e; c++) {
        float mid = (float)((t->e4m3[c] + t->e4m3[c + 1]) / 2);
        assert_true((double)mid == (t->e4m3[c] + t->e4m3[c + 1]) / 2);
        for (int s = 0; s <= 1; s++) {
            float m = s ? -mid : mid;
            uint8_t sg = s ? 0x80 : 0;
            uint8_t even = (uint8_t)(sg | ((c & 1) ? c + 1 : c));
            uint8_t got = rw_f32_to_e4m3(m);
            if (got != even) fail_msg("e4m3 tie %a -> 0x%02x, want 0x%02x", (double)m, got, even);
            got = rw_f32_to_e4m3(nextafterf(m, s ? -INFINITY : INFINITY));
            if (got != (uint8_t)(sg | (c + 1)))
                fail_msg("e4m3 above tie %a -> 0x%02x", (double)m, got);
            got = rw_f32_to_e4m3(nextafterf(m, 0.0f));
            if (got != (uint8_t)(sg | c)) fail_msg("e4m3 below tie %a -> 0x%02x", (double)m, got);
        }
    }
    /* saturation at and above 448 (no infinities in e4m3fn) */
    const float sat[] = {448.0f,  nextafterf(448.0f, 1e9f),
                         449.0f,  463.99f,
                         464.0f,  465.0f,
                         480.0f,  1e4f,
                         1e30f,   FLT_MAX,
                         INFINITY};
    for (size_t i = 0; i < sizeof sat / sizeof sat[0]; i++) {
        if (rw_f32_to_e4m3(sat[i]) != 0x7e) fail_msg("e4m3(%g) should saturate to 0x7e", sat[i]);
        if (rw_f32_to_e4m3(-sat[i]) != 0xfe) fail_msg("e4m3(-%g) should saturate to 0xfe", sat[i]);
    }
    assert_int_equal(rw_f32_to_e4m3(nextafterf(448.0f, 0.0f)), 0x7e);
    assert_int_equal(rw_f32_to_e4m3(432.0f), 0x7e); /* midpoint 416|448: tie to even (0x7e) */
    assert_int_equal(rw_f32_to_e4m3(nextafterf(432.0f, 0.0f)), 0x7d);
    /* NaN in any form -> 0x7f, the sign dropped */
    assert_int_equal(rw_f32_to_e4m3(bits(0x7fc00000u)), 0x7f);
    assert_int_equal(rw_f32_to_e4m3(bits(0xffc00000u)), 0x7f);
    assert_int_equal(rw_f32_to_e4m3(bits(0x7f800001u)), 0x7f);
    assert_int_equal(rw_f32_to_e4m3(bits(0xffffffffu)), 0x7f);
    /* subnormal range: step 2^-9 */
    for (int k = 0; k < 8; k++)
        assert_int_equal(rw_f32_to_e4m3(ldexpf((float)k, -9)), k);
    assert_int_equal(rw_f32_to_e4m3(ldexpf(1, -10)), 0x00); /* tie between 0 and 2^-9 */
    assert_int_equal(rw_f32_to_e4m3(nextafterf(ldexpf(1, -10), 1)), 0x01);
    assert_int_equal(rw_f32_to_e4m3(ldexpf(3, -10)), 0x02);  /* 1.5 steps: tie to even */
    assert_int_equal(rw_f32_to_e4m3(ldexpf(15, -10)), 0x08); /* 7.5 steps: into the normals */
    assert_int_equal(rw_f32_to_e4m3(ldexpf(1, -11)), 0x00);
    assert_int_equal(rw_f32_to_e4m3(FLT_TRUE_MIN), 0x00);
    assert_int_equal(rw_f32_to_e4m3(-FLT_TRUE_MIN), 0x80);
    assert_int_equal(rw_f32_to_e4m3(-ldexpf(1, -10)), 0x80);
    assert_int_equal(rw_f32_to_e4m3(-ldexpf(5, -11)), 0x81);
    /* signed zero */
    assert_int_equal(rw_f32_to_e4m3(0.0f), 0x00);
    assert_int_equal(rw_f32_to_e4m3(-0.0f), 0x80);
    rw_rng r;
    rw_rng_seed(&r, 0xe4);
    for (int i = 0; i < 2000000; i++) {
        float f = random_float(&r);
        if (isnan(f)) continue;
        uint8_t want = ref_e4m3(t, f), got = rw_f32_to_e4m3(f);
        if (want != got)
            fail_msg("e4m3(0x%08x) = 0x%02x, reference 0x%02x", rw_f32_bits(f), got, want);
    }
    free(t);
}

static void test_ue8m0_all_patterns(void **state) {
    (void)state;
    for (int b = 0; b < 256; b++) {
        float f = rw_ue8m0_to_f32((uint8_t)b);
        if (b == 0xff) {
            assert_true(isnan(f));
            continue;
        }
        if ((double)f != ldexp(1.0, b - 127)) fail_msg("ue8m0 0x%02x = %a", b, (double)f);
    }
}

/* ---- names and sizes ----------------------------------------------------------------------- */

static void test_dtype_names(void **state) {
    (void)state;
    static const struct {
        rw_dtype dt;
        size_t size;
        const char *name, *st;
    } want[] = {
        {RW_DTYPE_BF16, 2, "bf16", "BF16"},    {RW_DTYPE_F16, 2, "f16", "F16"},
        {RW_DTYPE_F32, 4, "f32", "F32"},       {RW_DTYPE_I32, 4, "i32", "I32"},
        {RW_DTYPE_E4M3, 1, "e4m3", "F8_E4M3"}, {RW_DTYPE_UE8M0, 1, "ue8m0", "F8_E8M0"},
        {RW_DTYPE_U8, 1, "u8", "U8"},          {RW_DTYPE_I64, 8, "i64", "I64"},
        {RW_DTYPE_F64, 8, "f64", "F64"},       {RW_DTYPE_I8, 1, "i8", "I8"},
        {RW_DTYPE_BOOL, 1, "bool", "BOOL"},    {RW_DTYPE_I16, 2, "i16", "I16"},
    };
    assert_int_equal(sizeof want / sizeof want[0], RW_DTYPE_COUNT_ - 1);
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        assert_int_equal(rw_dtype_size(want[i].dt), want[i].size);
        assert_string_equal(rw_dtype_name(want[i].dt), want[i].name);
        assert_string_equal(rw_dtype_st_name(want[i].dt), want[i].st);
        assert_int_equal(rw_dtype_from_name(want[i].name), want[i].dt);
        assert_int_equal(rw_dtype_from_name(want[i].st), want[i].dt);
    }
    assert_int_equal(rw_dtype_from_name("bfloat16"), RW_DTYPE_BF16);
    assert_int_equal(rw_dtype_from_name("float8_e4m3fn"), RW_DTYPE_E4M3);
    assert_int_equal(rw_dtype_from_name("F8_E5M2"), RW_DTYPE_INVALID);
    assert_int_equal(rw_dtype_from_name(""), RW_DTYPE_INVALID);
    assert_int_equal(rw_dtype_from_name(NULL), RW_DTYPE_INVALID);
    assert_int_equal(rw_dtype_size(RW_DTYPE_INVALID), 0);
    assert_string_equal(rw_dtype_name(RW_DTYPE_INVALID), "invalid");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bf16_all_patterns),  cmocka_unit_test(test_bf16_rounding_boundaries),
        cmocka_unit_test(test_f16_all_patterns),   cmocka_unit_test(test_f16_rounding_boundaries),
        cmocka_unit_test(test_e4m3_all_patterns),  cmocka_unit_test(test_e4m3_rounding_boundaries),
        cmocka_unit_test(test_ue8m0_all_patterns), cmocka_unit_test(test_dtype_names),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
