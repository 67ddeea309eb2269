/* rw_test.h - shared helpers for the test programs (cmocka): fixture paths, GPU skip, scratch
 * directories, random inputs, byte comparisons that report the first differing index, and
 * closeness within a named error budget (rw_assert_close) that reports the worst element. */
#ifndef RW_TEST_H
#define RW_TEST_H

#include <ftw.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <cmocka.h>

#include "rw_core.h"

/* Source tree root, passed by meson as RW_SOURCE_ROOT in the test environment. */
static inline const char *rw_test_root(void) {
    const char *r = getenv("RW_SOURCE_ROOT");
    return r ? r : ".";
}

/* Path under the source tree, in a static buffer per call site use (copy it if kept). */
static inline const char *rw_test_path(char *buf, size_t cap, const char *rel) {
    snprintf(buf, cap, "%s/%s", rw_test_root(), rel);
    return buf;
}

#define RW_TEST_FIXTURE "tests/fixtures/qwen3-moe-tiny"

/* GPU tests call this first: exits 77 (meson's "skipped") without a CUDA build or device. */
static inline void rw_test_require_gpu(int ndev) {
    if (!rw_cuda_built() || rw_cuda_device_count() < ndev) {
        fprintf(stderr, "skip: needs %d CUDA device(s), have %d (built with CUDA: %s)\n", ndev,
                rw_cuda_device_count(), rw_cuda_built() ? "yes" : "no");
        exit(77);
    }
}

/* Fails the test with the status, message and location of an rw_err. */
#define RW_ASSERT_OK(expr, errp)                                                                   \
    do {                                                                                           \
        rw_status s__ = (expr);                                                                    \
        if (s__ != RW_OK)                                                                          \
            fail_msg("%s -> %s: %s (%s)", #expr, rw_status_str(s__), (errp)->msg, (errp)->where);  \
    } while (0)

/* Fails unless a call returned `want` and (needle given) its error message names `needle`: a
 * refusal that says what was wrong. */
static inline void rw_assert_status(rw_status got, rw_status want, const rw_err *err,
                                    const char *needle, const char *what) {
    if (got != want)
        fail_msg("%s: %s, expected %s (%s)", what, rw_status_str(got), rw_status_str(want),
                 err->msg);
    if (needle && !strstr(err->msg, needle))
        fail_msg("%s: message '%s' does not name '%s'", what, err->msg, needle);
}

/* Byte-exact comparison naming the first differing offset. */
static inline void rw_assert_bytes_equal(const void *a, const void *b, size_t n, const char *what) {
    const uint8_t *x = a, *y = b;
    for (size_t i = 0; i < n; i++)
        if (x[i] != y[i])
            fail_msg("%s: first difference at byte %zu of %zu (0x%02x vs 0x%02x)", what, i, n, x[i],
                     y[i]);
}

/* Fills with bf16 normal(0, std) values from a seeded rng (never zeros). */
static inline void rw_test_fill_bf16(uint16_t *p, size_t n, uint64_t seed, float std) {
    rw_rng r;
    rw_rng_seed(&r, seed);
    for (size_t i = 0; i < n; i++)
        p[i] = rw_f32_to_bf16(std * rw_rng_normal(&r));
}

/* Fills with fp32 normal(0, std) values from a seeded rng. */
static inline void rw_test_fill_f32(float *p, size_t n, uint64_t seed, float std) {
    rw_rng r;
    rw_rng_seed(&r, seed);
    for (size_t i = 0; i < n; i++)
        p[i] = std * rw_rng_normal(&r);
}

/* A fresh directory "/tmp/<prefix>XXXXXX" (malloc'd path; the caller frees it), and its removal
 * with everything below it. */
static inline char *rw_test_tmpdir(const char *prefix) {
    char *d = malloc(strlen(prefix) + 16);
    assert_non_null(d);
    sprintf(d, "/tmp/%sXXXXXX", prefix);
    assert_non_null(mkdtemp(d));
    return d;
}
static inline int rw_test_rm_one_(const char *p, const struct stat *sb, int flag, struct FTW *ftw) {
    (void)sb, (void)flag, (void)ftw;
    return remove(p);
}
static inline void rw_test_rm_rf(const char *dir) {
    nftw(dir, rw_test_rm_one_, 16, FTW_DEPTH | FTW_PHYS);
}

/* ------------------------------------------------------------------------------------------ */
/* Closeness within a named error budget                                                       */
/* ------------------------------------------------------------------------------------------ */
/* Element i passes when |actual - expected| <= abs + rel * (|expected| + floor), or when both
 * are NaN; a NaN on one side only fails. Budgets are named for what they bound (the dtype and the
 * computation that separates the two sides); a test picks one rather than writing a number. */
typedef struct rw_tol {
    const char *name;
    double abs, rel, floor;
} rw_tol;

/* The CPU backend (fp32) against the transformers fp32 reference: logits and logprobs. */
#define RW_TOL_F32_REF ((rw_tol){"RW_TOL_F32_REF", 1e-3, 0.0, 0.0})
/* The CUDA backend (bf16 weights, hi + lo activations, bf16 KV) against the fp32 reference. */
#define RW_TOL_CUDA_REF ((rw_tol){"RW_TOL_CUDA_REF", 5e-2, 0.0, 0.0})
/* An fp32 kernel against its fp32 reference summed in another order. */
#define RW_TOL_F32_REORDER ((rw_tol){"RW_TOL_F32_REORDER", 0.0, 1e-5, 1e-3})
/* A bf16 output computed in fp32 in another order: one bf16 rounding step (2^-7). */
#define RW_TOL_BF16_ROUND ((rw_tol){"RW_TOL_BF16_ROUND", 0.0, 1.0 / 128, 1e-3})
/* hi + lo bf16 pairs of two fp32 values within RW_TOL_F32_REORDER: each pair is within 2^-17 of
 * its value. */
#define RW_TOL_BF16_PAIR ((rw_tol){"RW_TOL_BF16_PAIR", 0.0, 1e-5 + 2.0 / 131072, 1e-3})
/* RoPE: sincosf on the device against the host's sinf / cosf at angles ~1e3, where they differ
 * by a few ulps of the angle; q in fp32 and the K cache in bf16. */
#define RW_TOL_ROPE_F32 ((rw_tol){"RW_TOL_ROPE_F32", 0.0, 1e-3, 0.05})
#define RW_TOL_ROPE_BF16 ((rw_tol){"RW_TOL_ROPE_BF16", 0.0, 2.0 / 128, 0.05})
/* Attention outputs (averages of O(1) values in fp32, another order) as hi + lo pairs. */
#define RW_TOL_ATTN_PAIR ((rw_tol){"RW_TOL_ATTN_PAIR", 0.0, 4e-5, 0.25})
/* Attention outputs whose softmax weights entered P.V as one bf16 each: each term is off by at
 * most 2^-9 of itself, so the average by at most 2^-9 max|v|, on top of RW_TOL_ATTN_PAIR's
 * budget (vmax: the largest |v| of the cache). */
#define RW_TOL_ATTN_P1(vmax) ((rw_tol){"RW_TOL_ATTN_P1", (vmax) / 512.0 + 1e-5, 4e-5, 0.25})
/* Attention on a cache of hi + lo pairs (the high-precision mode), the softmax weights pairs too:
 * the fp32 budget of RW_TOL_ATTN_PAIR, with an absolute floor of 2^-16 max|v| for outputs near
 * zero. A low half left out would cost up to 2^-9 of each term. */
#define RW_TOL_ATTN_KV2(vmax) ((rw_tol){"RW_TOL_ATTN_KV2", (vmax) / 65536.0, 4e-5, 0.25})
/* Router logits: fp32 dot products over H in another order. */
#define RW_TOL_F32_DOT ((rw_tol){"RW_TOL_F32_DOT", 0.0, 1e-4, 1.0})

/* What a comparison found: elements outside the budget (the first of them), NaN mismatches, and
 * the largest absolute and relative errors with their indices (over elements that are not NaN). */
typedef struct rw_close {
    size_t n, bad, first_bad, nan_mismatch;
    double worst_abs, worst_rel;
    size_t worst_abs_at, worst_rel_at;
    double first_actual, first_expected;
} rw_close;

enum { RW_TV_F32 = 0, RW_TV_F64 = 1, RW_TV_BF16 = 2 }; /* element types (bf16: uint16_t bits) */

static inline double rw_tv_at_(const void *p, int ty, size_t i) {
    if (ty == RW_TV_F32) return ((const float *)p)[i];
    if (ty == RW_TV_F64) return ((const double *)p)[i];
    return rw_bf16_to_f32(((const uint16_t *)p)[i]);
}

static inline rw_close rw_close_typed_(const void *actual, const void *expected, int ty, size_t n,
                                       rw_tol t) {
    rw_close c;
    memset(&c, 0, sizeof c);
    c.n = n;
    for (size_t i = 0; i < n; i++) {
        const double a = rw_tv_at_(actual, ty, i), e = rw_tv_at_(expected, ty, i);
        if (isnan(a) && isnan(e)) continue;
        const double d = fabs(a - e);
        bool ok = d <= t.abs + t.rel * (fabs(e) + t.floor);
        if (isnan(a) || isnan(e)) {
            c.nan_mismatch++;
            ok = false;
        } else {
            const double r = e != 0 ? d / fabs(e) : (d != 0 ? INFINITY : 0.0);
            if (d > c.worst_abs) c.worst_abs = d, c.worst_abs_at = i;
            if (r > c.worst_rel) c.worst_rel = r, c.worst_rel_at = i;
        }
        if (!ok && c.bad++ == 0) {
            c.first_bad = i;
            c.first_actual = a;
            c.first_expected = e;
        }
    }
    return c;
}

/* Compares n elements of actual and expected (float *, double *, or bf16 as uint16_t *; both of
 * the same type) against budget t; returns what it found without failing (for threads). */
#define RW_TV_OF_(p)                                                                               \
    _Generic((p), float *: RW_TV_F32, const float *: RW_TV_F32, double *: RW_TV_F64,              \
             const double *: RW_TV_F64, uint16_t *: RW_TV_BF16, const uint16_t *: RW_TV_BF16)
#define rw_close_check(actual, expected, n, t)                                                     \
    rw_close_typed_((actual), (expected), RW_TV_OF_(actual), (n), (t))

/* A one-line account of a comparison, e.g. for a thread's failure message. */
static inline void rw_close_describe(const rw_close *c, rw_tol t, const char *what, char *buf,
                                     size_t cap) {
    snprintf(buf, cap,
             "%s: %zu of %zu elements outside %s (|d| <= %g + %g (|expected| + %g)), %zu NaN "
             "mismatches; first at %zu: %.9g vs expected %.9g; max abs error %.3g at %zu, max "
             "rel error %.3g at %zu",
             what, c->bad, c->n, t.name, t.abs, t.rel, t.floor, c->nan_mismatch, c->first_bad,
             c->first_actual, c->first_expected, c->worst_abs, c->worst_abs_at, c->worst_rel,
             c->worst_rel_at);
}

static inline void rw_assert_close_typed_(const void *actual, const void *expected, int ty,
                                          size_t n, rw_tol t, const char *what) {
    const rw_close c = rw_close_typed_(actual, expected, ty, n, t);
    if (c.bad) {
        char msg[512];
        rw_close_describe(&c, t, what, msg, sizeof msg);
        fail_msg("%s", msg);
    }
}

/* Fails the test when an element of actual is outside budget t of expected (see rw_tol). */
#define rw_assert_close(actual, expected, n, t, what)                                              \
    rw_assert_close_typed_((actual), (expected), RW_TV_OF_(actual), (n), (t), (what))

/* hi + lo bf16 pairs (worker/kernels/common.h) against reference pairs: the values they carry
 * within t, and each lo within one bf16 step of its hi (|lo| <= 2^-8 |hi|). */
static inline void rw_assert_close_pair(const uint16_t *hi, const uint16_t *lo, const uint16_t *rhi,
                                        const uint16_t *rlo, size_t n, rw_tol t, const char *what) {
    double *a = malloc(sizeof(double) * (n ? n : 1)), *e = malloc(sizeof(double) * (n ? n : 1));
    assert_non_null(a);
    assert_non_null(e);
    for (size_t i = 0; i < n; i++) {
        a[i] = (double)rw_bf16_to_f32(hi[i]) + rw_bf16_to_f32(lo[i]);
        e[i] = (double)rw_bf16_to_f32(rhi[i]) + rw_bf16_to_f32(rlo[i]);
    }
    const rw_close c = rw_close_check(a, e, n, t);
    free(a);
    free(e);
    if (c.bad) {
        char msg[512];
        rw_close_describe(&c, t, what, msg, sizeof msg);
        fail_msg("%s (hi + lo)", msg);
    }
    for (size_t i = 0; i < n; i++) {
        const double h = rw_bf16_to_f32(hi[i]), l = rw_bf16_to_f32(lo[i]);
        if (!(fabs(l) <= fabs(h) * (1.0 / 256)))
            fail_msg("%s: element %zu: lo %g is not below hi %g's last bit", what, i, l, h);
    }
}

#endif
