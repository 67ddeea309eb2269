/* quant_util.h - helpers shared by the quant module's tests (tests/quant): the run's random seed,
 * per-case random streams from it, bf16 inputs spread over the whole bf16 range, and the error
 * bounds of the two formats. */
#ifndef RW_TEST_QUANT_UTIL_H
#define RW_TEST_QUANT_UTIL_H

#include "rw_test.h"

#include <math.h>
#include <time.h>

/* A fresh seed per run, printed so a failure can be repeated with RW_TEST_SEED=N. */
static inline uint64_t qt_seed(const char *prog) {
    const char *env = getenv("RW_TEST_SEED");
    uint64_t s = env ? strtoull(env, NULL, 0) : (uint64_t)time(NULL) ^ ((uint64_t)clock() << 32);
    fprintf(stderr, "%s: RW_TEST_SEED=%llu\n", prog, (unsigned long long)s);
    return s;
}

/* The random stream of one case: the run's seed mixed with the case's salt. */
static inline rw_rng qt_rng(uint64_t seed, uint64_t salt) {
    rw_rng r;
    rw_rng_seed(&r, seed ^ (salt * 0x9e3779b97f4a7c15ull));
    return r;
}

/* Random bf16 matrix whose runs of `run` elements along a row share a magnitude 2^k, k drawn over
 * the whole bf16 range (subnormal to near max); one run in 16 is all zero (with random signs),
 * one element in 64 is zero, signs are random. */
static inline void qt_fill_ranges(uint16_t *x, int64_t rows, int64_t cols, int64_t run, rw_rng *r) {
    for (int64_t i = 0; i < rows; i++) {
        for (int64_t c0 = 0; c0 < cols; c0 += run) {
            int k = (int)(rw_rng_u64(r) % 256) - 135; /* [-135, 120] */
            bool zero = rw_rng_u64(r) % 16 == 0;
            for (int64_t c = c0; c < c0 + run && c < cols; c++) {
                float v = zero || rw_rng_u64(r) % 64 == 0 ? 0.0f : ldexpf(rw_rng_normal(r), k);
                x[i * cols + c] = rw_f32_to_bf16(v);
                if (zero && rw_rng_u64(r) % 2) x[i * cols + c] = 0x8000; /* -0 */
            }
        }
    }
}

/* Half an e4m3 ulp at magnitude y (in units of the scale): 2^(floor(log2 y) - 4) for normals,
 * half the subnormal step 2^-9 below 2^-6. The MXFP8 error bound of an element is this times
 * its block's scale (nothing saturates: amax / scale <= 448). */
static inline double qt_e4m3_half_ulp(double y) {
    if (y < ldexp(1.0, -6)) return ldexp(1.0, -10);
    int e;
    frexp(y, &e); /* y = f * 2^e, f in [0.5, 1): floor(log2 y) = e - 1 */
    return ldexp(1.0, e - 1 - 4);
}

/* FP8-block error bound of an element x in a block of scale s: e4m3 rounding (relative 2^-4,
 * absolute 2^-10 in the subnormals) in units of the scale, plus the fp32 division and product
 * (2^-24 each, taken generously) and the slack when x / s rounds just past 448. */
static inline double qt_fp8_block_bound(double x, double s) {
    return (ldexp(1.0, -4) + ldexp(1.0, -18)) * fabs(x) + ldexp(s, -10) * (1 + ldexp(1.0, -18)) +
           ldexp(1.0, -149);
}

#endif
