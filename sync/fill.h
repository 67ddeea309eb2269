/* fill.h - the element rule of the benchmark fill, shared by fill.c and fill.cu (host + device)
 * so both compute identical bytes: u = splitmix64(seed ^ i * golden) >> 40 (24 bits), value
 * (u - 2^23) * scale with scale = std * sqrt(3) / 2^23 (uniform with the given std), as bf16. */
#ifndef RW_SYNC_FILL_H
#define RW_SYNC_FILL_H

#include "rw_core.h"

RW_HD uint64_t rw_sync_fill_hash(uint64_t x) {
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

/* One multiply after an exact integer-to-float conversion: no contraction can change it. */
RW_HD uint16_t rw_sync_fill_elem(uint64_t seed, uint64_t i, float scale) {
    uint64_t h = rw_sync_fill_hash(seed ^ (i * 0x9e3779b97f4a7c15ull));
    int32_t u = (int32_t)(h >> 40) - 8388608; /* [-2^23, 2^23) */
    return rw_f32_to_bf16((float)u * scale);
}

static inline float rw_sync_fill_scale(float std) {
    return std * 1.7320508075688772f * (1.0f / 8388608.0f);
}

#endif
