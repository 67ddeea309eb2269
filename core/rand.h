/* rand.h - rw's one counter-based random rule, shared by host and device code (C11 and CUDA C++).
 *
 * Everything that must produce the same random bits on the CPU and on the GPU, or on every rank
 * and TP degree, derives them from rw_splitmix64 of (seed, index): random model weights, benchmark
 * fills, the sampler's uniform draw. Stateful streams (rw_rng in rw_core.h) are seeded with it.
 * Integer arithmetic and at most one fma per value, so host and device agree bit for bit. */
#ifndef RW_RAND_H
#define RW_RAND_H

#include <math.h>
#include <stdint.h>

#include "rw_core.h"

#ifdef __cplusplus
extern "C" {
#endif

/* splitmix64's output function of state x (the state is advanced by the golden gamma first). */
RW_HD uint64_t rw_splitmix64(uint64_t x) {
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

/* 64 random bits for element i of the stream `seed`. */
RW_HD uint64_t rw_rand_u64_at(uint64_t seed, uint64_t i) {
    return rw_splitmix64(seed ^ rw_splitmix64(i));
}

/* A uniform in [0, 1) from the top 24 bits of rw_rand_u64_at (exact in fp32). */
RW_HD float rw_rand_unit_at(uint64_t seed, uint64_t i) {
    return (float)(rw_rand_u64_at(seed, i) >> 40) * (1.0f / 16777216.0f);
}

/* Element i of a seeded random bf16 tensor: mean + std * g, with g the standardised sum of the four
 * 16-bit fields of rw_rand_u64_at(seed, i) (a bounded approximation of N(0, 1), |g| < 3.47).
 * The one fill rule for random weights and benchmark data. */
RW_HD uint16_t rw_rand_bf16_at(uint64_t seed, uint64_t i, float mean, float std) {
    const uint64_t r = rw_rand_u64_at(seed, i);
    const int32_t s = (int32_t)(r & 0xffffu) + (int32_t)((r >> 16) & 0xffffu) +
                      (int32_t)((r >> 32) & 0xffffu) + (int32_t)(r >> 48);
    const float g = (float)(s - 131070) * (1.0f / 37837.23f);
    return rw_f32_to_bf16(fmaf(std, g, mean));
}

#ifdef __cplusplus
}
#endif

#endif /* RW_RAND_H */
