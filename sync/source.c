/* source.c - byte sources over host memory: a ZeroMQ frame or an mmap'd safetensors range (the
 * disk transport's bucket: consecutive tensors of one file, read where they are mapped). */
#include "sync_internal.h"

#include <inttypes.h>

/* ------------------------------------------------------------------------------------------ */
/* Host byte source                                                                             */
/* ------------------------------------------------------------------------------------------ */
static rw_status host_read(rw_sync_source *src, void *dst, rw_place place, uint64_t nbytes,
                           rw_stream s, rw_err *err) {
    if (nbytes > src->nbytes)
        RW_FAIL(err, RW_E_RANGE, "%s source: %" PRIu64 " bytes asked, %" PRIu64 " available",
                src->name, nbytes, src->nbytes);
    return rw_memcpy(dst, place, src->host, RW_PLACE_HOST, nbytes, s, err);
}

rw_sync_source rw_sync_source_host(const char *name, const void *bytes, uint64_t nbytes) {
    rw_sync_source s = {.name = name, .host = bytes, .nbytes = nbytes, .read = host_read};
    return s;
}

rw_status rw_sync_bucket_from_entries(const rw_st_entry *const *e, size_t n, rw_sync_manifest *m,
                                      rw_sync_source *src, rw_err *err) {
    rw_sync_manifest_clear(m);
    if (n == 0) RW_FAIL(err, RW_E_INVALID_ARG, "disk bucket: no tensors");
    uint64_t base = e[0]->begin, end = base;
    for (size_t i = 0; i < n; i++) {
        if (e[i]->file_index != e[0]->file_index || e[i]->begin < end)
            RW_FAIL(err, RW_E_INVALID_ARG,
                    "disk bucket: %s is not after the previous tensor in the same file",
                    e[i]->name);
        if ((e[i]->begin - base) % rw_dtype_size(e[i]->dtype))
            RW_FAIL(err, RW_E_INVALID_ARG,
                    "disk bucket: %s at byte %" PRIu64 " of the bucket is not aligned to its "
                    "dtype",
                    e[i]->name, e[i]->begin - base);
        rw_sync_tensor t;
        memset(&t, 0, sizeof t);
        if (strlen(e[i]->name) >= sizeof t.name)
            RW_FAIL(err, RW_E_RANGE, "disk bucket: name '%.64s...' longer than %d bytes",
                    e[i]->name, RW_SYNC_MAX_NAME - 1);
        strcpy(t.name, e[i]->name);
        t.dtype = e[i]->dtype;
        t.ndim = e[i]->ndim;
        memcpy(t.shape, e[i]->shape, sizeof t.shape);
        t.shard_dim = -1;
        t.offset = e[i]->begin - base;
        t.nbytes = e[i]->end - e[i]->begin;
        RW_CHECK(rw_sync_manifest_push(m, &t, err));
        end = e[i]->end;
    }
    rw_sync_manifest_set_bytes(m, end - base);
    *src = rw_sync_source_host("disk", e[0]->data, end - base);
    return RW_OK;
}
