/* source.c - byte sources over host memory (a ZeroMQ frame) and over a safetensors file (the disk
 * transport's bucket: consecutive tensors of one file, read with pread through rw_st_read, never
 * through the file's mapping, so a file cut short while it is read gives an error, not SIGBUS). */
#include "sync_internal.h"

#include <inttypes.h>
#include <stdlib.h>

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
    rw_sync_source s = {
        .kind = RW_SYNC_SRC_HOST, .name = name, .host = bytes, .nbytes = nbytes, .read = host_read};
    return s;
}

/* ------------------------------------------------------------------------------------------ */
/* File byte source                                                                             */
/* ------------------------------------------------------------------------------------------ */
static rw_status file_read_at(const rw_sync_source *src, void *dst, uint64_t off, size_t len,
                              rw_err *err) {
    if (off > src->nbytes || len > src->nbytes - off)
        RW_FAIL(err, RW_E_RANGE,
                "%s source: bytes [%" PRIu64 ", %" PRIu64 ") asked, %" PRIu64 " available",
                src->name, off, off + len, src->nbytes);
    return rw_st_read((const rw_st_file *)src->ctx, src->base + off, dst, len, err);
}

/* Host destinations directly; device ones through a host buffer, a piece at a time (this path
 * is for conformance and tools: the session's pipeline reads disk buckets through read_at into
 * its pinned chunks). */
static rw_status file_read(rw_sync_source *src, void *dst, rw_place place, uint64_t nbytes,
                           rw_stream s, rw_err *err) {
    if (nbytes > src->nbytes)
        RW_FAIL(err, RW_E_RANGE, "%s source: %" PRIu64 " bytes asked, %" PRIu64 " available",
                src->name, nbytes, src->nbytes);
    if (place == RW_PLACE_HOST) return file_read_at(src, dst, 0, (size_t)nbytes, err);
    const size_t piece = 8u << 20;
    uint8_t *buf = malloc(nbytes < piece ? (size_t)nbytes + 1 : piece);
    if (!buf) RW_FAIL(err, RW_E_OOM, "%s source: out of memory for a read buffer", src->name);
    rw_status st = RW_OK;
    for (uint64_t off = 0; off < nbytes && st == RW_OK;) {
        size_t n = nbytes - off < piece ? (size_t)(nbytes - off) : piece;
        st = file_read_at(src, buf, off, n, err);
        if (st == RW_OK) st = rw_memcpy((uint8_t *)dst + off, place, buf, RW_PLACE_HOST, n, s, err);
        if (st == RW_OK) st = rw_stream_sync(s, err); /* before buf is refilled */
        off += n;
    }
    free(buf);
    return st;
}

rw_sync_source rw_sync_source_file(const rw_st_file *f, uint64_t begin, uint64_t nbytes) {
    rw_sync_source s = {.kind = RW_SYNC_SRC_FILE,
                        .name = "disk",
                        .nbytes = nbytes,
                        .read = file_read,
                        .ctx = (void *)f,
                        .read_at = file_read_at,
                        .base = begin};
    return s;
}

rw_status rw_sync_bucket_from_entries(const rw_st_file *f, const rw_st_entry *const *e, size_t n,
                                      rw_sync_manifest *m, rw_sync_source *src, rw_err *err) {
    rw_sync_manifest_clear(m);
    if (!f) RW_FAIL(err, RW_E_INVALID_ARG, "disk bucket: no file");
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
    *src = rw_sync_source_file(f, base, end - base);
    return RW_OK;
}
