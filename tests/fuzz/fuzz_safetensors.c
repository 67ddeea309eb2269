/* fuzz_safetensors.c - the safetensors reader over arbitrary bytes (rw_st_open_mem).
 *
 * Contract checked (rw_core.h): a refusal carries its status and a message; an accepted file has
 * entries sorted by data offset, each with a known dtype, at most RW_MAX_DIMS dims, a name no
 * longer than RW_ST_MAX_NAME, shape x dtype size == end - begin, bytes inside the buffer (read
 * in full here, so ASan sees any escape) and no two entries overlapping; rw_st_find finds every
 * entry by its name. */
#include "fuzz_util.h"

#include <string.h>

#include "rw_core.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    rw_st_file *f = NULL;
    rw_err e;
    memset(&e, 0, sizeof e);
    rw_status st = rw_st_open_mem(data, size, &f, &e);
    if (st != RW_OK) {
        FUZZ_CHECK(f == NULL, "a refused file still returned a handle");
        FUZZ_CHECK_REFUSAL(st, e);
        return 0;
    }
    FUZZ_CHECK(f != NULL, "accepted without a handle");
    FUZZ_CHECK(size >= 8, "accepted %zu bytes, shorter than the length prefix", size);
    const uint8_t *end = data + size;
    size_t n = rw_st_count(f);
    uint64_t prev_begin = 0, prev_end = 0;
    uint64_t sum = 0;
    for (size_t i = 0; i < n; i++) {
        const rw_st_entry *t = rw_st_at(f, i);
        FUZZ_CHECK(t && t->name, "entry %zu missing", i);
        size_t nl = strlen(t->name);
        FUZZ_CHECK(nl <= RW_ST_MAX_NAME, "name of %zu bytes", nl);
        size_t es = rw_dtype_size(t->dtype);
        FUZZ_CHECK(es > 0, "%s: dtype %d accepted", t->name, (int)t->dtype);
        FUZZ_CHECK(t->ndim >= 0 && t->ndim <= RW_MAX_DIMS, "%s: ndim %d", t->name, t->ndim);
        FUZZ_CHECK(t->begin <= t->end, "%s: begin %llu > end %llu", t->name,
                   (unsigned long long)t->begin, (unsigned long long)t->end);
        /* the byte count equals numel x dtype size (each dim >= 0; the product cannot overflow
         * because it equals a byte range inside the buffer) */
        uint64_t numel = 1;
        bool zero = false;
        for (int d = 0; d < t->ndim; d++) {
            FUZZ_CHECK(t->shape[d] >= 0, "%s: shape[%d] = %lld", t->name, d,
                       (long long)t->shape[d]);
            if (t->shape[d] == 0) zero = true;
        }
        if (!zero)
            for (int d = 0; d < t->ndim; d++) {
                FUZZ_CHECK((uint64_t)t->shape[d] <= (t->end - t->begin) / es,
                           "%s: shape[%d] larger than its bytes", t->name, d);
                numel *= (uint64_t)t->shape[d];
                FUZZ_CHECK(numel <= (t->end - t->begin) / es, "%s: numel exceeds its bytes",
                           t->name);
            }
        else
            numel = 0;
        FUZZ_CHECK(numel * es == t->end - t->begin, "%s: %llu elements x %zu != %llu bytes",
                   t->name, (unsigned long long)numel, es, (unsigned long long)(t->end - t->begin));
        /* sorted by offset, no overlap between non-empty ranges */
        FUZZ_CHECK(i == 0 || t->begin >= prev_begin, "entries not sorted by offset at %zu", i);
        if (t->end > t->begin) {
            FUZZ_CHECK(t->begin >= prev_end, "%s overlaps the previous entry", t->name);
            prev_end = t->end;
        }
        prev_begin = t->begin;
        const uint8_t *p = t->data;
        FUZZ_CHECK(p >= data && p <= end, "%s: data pointer outside the buffer", t->name);
        FUZZ_CHECK((uint64_t)(end - p) >= t->end - t->begin, "%s: bytes run past the buffer",
                   t->name);
        for (uint64_t b = 0; b < t->end - t->begin; b++)
            sum += p[b];
        FUZZ_CHECK(t->file_index == 0, "%s: file index %d in a lone file", t->name, t->file_index);
        const rw_st_entry *found = rw_st_find(f, t->name);
        FUZZ_CHECK(found == t, "rw_st_find('%s') did not return the entry", t->name);
    }
    /* metadata lookups never fail or read out of bounds */
    const char *fmt = rw_st_metadata(f, "format");
    if (fmt) sum += strlen(fmt);
    rw_st_close(f);
    /* keep the byte reads from being optimized away */
    volatile uint64_t sink = sum;
    (void)sink;
    return 0;
}
