/* rw_test.h - shared helpers for the test programs (cmocka): fixture paths, GPU skip, random
 * inputs, byte comparisons that report the first differing index. */
#ifndef RW_TEST_H
#define RW_TEST_H

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
    for (size_t i = 0; i < n; i++) p[i] = rw_f32_to_bf16(std * rw_rng_normal(&r));
}

#endif
