/* fuzz_util.h - shared by the fuzz targets: the libFuzzer entry point every target defines, and the
 * invariant check that turns a broken contract into a crash the fuzzer (or the corpus replay in
 * the cpu suite) reports.
 *
 * A target must be deterministic for a given input, must not leak, and must check what the
 * public header promises about the result (not only "no crash"): every check below is a
 * documented contract of the function under test. */
#ifndef RW_FUZZ_UTIL_H
#define RW_FUZZ_UTIL_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Aborts with the failed condition and location: the fuzzer saves the input as a crash. */
#define FUZZ_CHECK(cond, ...)                                                                      \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "%s:%d: invariant failed: %s: ", __FILE__, __LINE__, #cond);           \
            fprintf(stderr, __VA_ARGS__);                                                          \
            fputc('\n', stderr);                                                                   \
            abort();                                                                               \
        }                                                                                          \
    } while (0)

/* A refusal must say why: a known non-OK status and a non-empty message. */
#define FUZZ_CHECK_REFUSAL(st, e)                                                                  \
    FUZZ_CHECK((st) != RW_OK && (e).status == (st) && (e).msg[0] != 0,                             \
               "status %d (err.status %d) with message '%s'", (int)(st), (int)(e).status, (e).msg)

/* Reads little-endian integers from the front of a fuzz input (0 past the end). */
static inline uint32_t fuzz_u32le(const uint8_t *p, size_t n) {
    uint32_t v = 0;
    for (size_t i = 0; i < 4 && i < n; i++)
        v |= (uint32_t)p[i] << (8 * i);
    return v;
}

#endif
