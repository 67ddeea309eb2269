/* fill.c - the benchmark's deterministic pseudo-random bf16 fill (CPU reference of fill.cu):
 * a counter-based hash, so any element can be generated independently and the GPU kernel
 * produces the same bytes. */
#include "rw_sync.h"

#include "fill.h"

void rw_sync_fill_bf16_ref(uint16_t *dst, uint64_t n, uint64_t seed, float std) {
    float scale = rw_sync_fill_scale(std);
    for (uint64_t i = 0; i < n; i++)
        dst[i] = rw_sync_fill_elem(seed, i, scale);
}
