/* disk.c - checkpoints on disk, cut into pieces by one rule (rw_sync_ckpt_rows): a tensor that
 * fits goes whole, a larger one as row pieces along dim 0 of a multiple of 128 rows (whole fp8
 * and mxfp8 blocks, so no piece leaves a partial quantization block behind). Two loaders use it:
 * update_weights_from_disk, which cuts the directory into buckets of consecutive tensors of one
 * file and applies them through the update session (its limit: the staging buffer, 64 MiB at most
 * on a host weight set), and the start-up load, which applies each piece straight to the weight
 * set from one host buffer (its limit: 256 MiB or RW_LOAD_PIECE_BYTES).
 *
 * Tensor bytes are only read with pread (rw_st_read), never through a file's mapping, so a file
 * cut short while it is read fails with "file shrank while loading" instead of a signal. */
#include "session_internal.h"

#include <inttypes.h>
#include <regex.h>
#include <stdlib.h>

/* ------------------------------------------------------------------------------------------ */
/* update_weights_from_disk                                                                     */
/* ------------------------------------------------------------------------------------------ */
static int by_file_offset(const void *a, const void *b) {
    const rw_st_entry *x = *(const rw_st_entry *const *)a, *y = *(const rw_st_entry *const *)b;
    if (x->file_index != y->file_index) return x->file_index < y->file_index ? -1 : 1;
    return x->begin < y->begin ? -1 : x->begin > y->begin;
}

/* A gap this large between selected tensors starts a new bucket instead of copying it. */
#define DISK_MAX_GAP (1u << 20)
/* Largest disk bucket on a host weight set (its bytes are read into a host buffer of this size
 * at most; larger tensors go as row pieces). */
#define DISK_HOST_BUCKET (64ull << 20)

uint64_t rw_sync_ckpt_rows(const rw_st_entry *e, uint64_t limit) {
    const uint64_t bytes = e->end - e->begin;
    const uint64_t rows = e->ndim >= 1 ? (uint64_t)e->shape[0] : 1;
    if (bytes <= limit) return rows;
    return rw_split_step(rows ? bytes / rows : 0, limit);
}

/* A checkpoint tensor larger than the bucket: row pieces along dim 0 (shard pieces over its bytes
 * in file f, rw_sync_ckpt_rows each), one bucket each. A failure before the session saw a piece
 * leaves it open (the caller aborts it). */
static rw_status apply_rows(rw_sync_session *s, const rw_st_file *f, const rw_st_entry *e,
                            uint64_t limit, rw_sync_manifest *m, rw_err *err) {
    uint64_t rows = (uint64_t)e->shape[0], bytes = e->end - e->begin;
    uint64_t row = rows ? bytes / rows : 0;
    uint64_t step = rw_sync_ckpt_rows(e, limit);
    if (!step)
        RW_FAIL(err, RW_E_RANGE,
                "update_weights_from_disk: %s: one row (%" PRIu64 " bytes) exceeds the bucket "
                "size %" PRIu64 " (begin_update bucket_bytes)",
                e->name, row, limit);
    for (uint64_t r = 0; r < rows;) {
        uint64_t end = rw_split_end(r, rows, step);
        rw_sync_manifest_clear(m);
        RW_CHECK(rw_sync_manifest_add(m, e->name, e->dtype, e->ndim, e->shape, 0, (int64_t)r,
                                      (int64_t)(end - r), RW_PIECE_PLAIN, NULL, err));
        rw_sync_source src = rw_sync_source_file(f, e->begin + r * row, (end - r) * row);
        RW_CHECK(rw_sync_session_apply(s, m, &src, NULL, err));
        r = end;
    }
    return RW_OK;
}

rw_status rw_sync_session_apply_disk(rw_sync_session *s, const char *dir, const char *only,
                                     const rw_sync_begin_args *a, uint64_t *tensors,
                                     uint64_t *bytes, rw_err *err) {
    if (tensors) *tensors = 0;
    if (bytes) *bytes = 0;
    if (!dir || !dir[0]) RW_FAIL(err, RW_E_INVALID_ARG, "update_weights_from_disk: empty path");
    bool implicit = s->state != RW_SYNC_UPDATING;
    rw_ckpt *ck = NULL;
    const rw_st_entry **ents = NULL;
    rw_sync_manifest *m = NULL;
    regex_t re;
    bool have_re = false;
    rw_status st;
    if (only && only[0]) {
        int rc = regcomp(&re, only, REG_EXTENDED | REG_NOSUB);
        if (rc) {
            char msg[128];
            regerror(rc, &re, msg, sizeof msg);
            RW_FAIL(err, RW_E_INVALID_ARG, "update_weights_from_disk: regex '%s': %s", only, msg);
        }
        have_re = true;
    }
    RW_CHECKGOTO(rw_sync_manifest_create(&m, err), st, out);
    RW_CHECKGOTO(rw_ckpt_open(dir, &ck, err), st, out);
    size_t n = rw_ckpt_count(ck), k = 0;
    ents = calloc(n ? n : 1, sizeof *ents);
    if (!ents) {
        st = RW_ERR(err, RW_E_OOM, "update_weights_from_disk: out of memory");
        goto out;
    }
    /* validate every selected tensor before anything is written; the pieces are addressed at a
     * placeholder, never read (tensor bytes are only read with pread, bucket by bucket) */
    static const uint8_t not_read[1];
    for (size_t i = 0; i < n; i++) {
        const rw_st_entry *e = rw_ckpt_at(ck, i);
        if (have_re && regexec(&re, e->name, 0, NULL, 0) != 0) continue;
        rw_sync_manifest_clear(m);
        rw_sync_source one;
        RW_CHECKGOTO(rw_sync_bucket_from_entries(rw_ckpt_file(ck, (size_t)e->file_index), &e, 1, m,
                                                 &one, err),
                     st, out);
        rw_piece p = rw_sync_tensor_piece(rw_sync_manifest_at(m, 0), not_read, RW_PLACE_HOST);
        st = rw_wset_validate_piece(s->ws, &p, err);
        if (st != RW_OK) {
            rw_err_prefix(err, "update_weights_from_disk: %s", dir);
            goto out;
        }
        ents[k++] = e;
    }
    if (k == 0) {
        st = RW_ERR(err, RW_E_NOT_FOUND, "update_weights_from_disk: %s: no tensor selected%s%s",
                    dir, have_re ? " by " : "", have_re ? only : "");
        goto out;
    }
    qsort(ents, k, sizeof *ents, by_file_offset);
    if (implicit) {
        char ver[RW_SYNC_MAX_VERSION + 1];
        rw_sync_begin_args b = a ? *a : (rw_sync_begin_args){0};
        if (!b.version || !b.version[0]) {
            snprintf(ver, sizeof ver, "disk:%s", dir);
            for (char *c = ver; *c; c++)
                if (*c < 0x20 || *c > 0x7e) *c = '?';
            b.version = ver;
        }
        RW_CHECKGOTO(rw_sync_session_begin(s, &b, err), st, out);
    }
    uint64_t limit = s->staging_bytes ? s->staging_bytes : RW_SYNC_DEFAULT_BUCKET;
    if (s->place == RW_PLACE_HOST && limit > DISK_HOST_BUCKET) limit = DISK_HOST_BUCKET;
    for (size_t i = 0; i < k;) {
        /* a bucket: consecutive tensors of one file, one byte range of it */
        const rw_st_entry *first = ents[i];
        const rw_st_file *file = rw_ckpt_file(ck, (size_t)first->file_index);
        if (first->end - first->begin > limit) {
            st = apply_rows(s, file, first, limit, m, err);
            if (st != RW_OK) {
                /* aborts the session unless applying a piece did already */
                st = rw_sync_session_fail(s, st, err);
                goto out;
            }
            if (tensors) (*tensors)++;
            if (bytes) *bytes += first->end - first->begin;
            i++;
            continue;
        }
        size_t j = i + 1;
        uint64_t end = first->end;
        while (j < k) {
            const rw_st_entry *e = ents[j];
            /* a tensor misaligned for its dtype relative to the bucket starts a new one */
            if (e->file_index != first->file_index || e->end - first->begin > limit ||
                e->begin > end + DISK_MAX_GAP ||
                (e->begin - first->begin) % rw_dtype_size(e->dtype))
                break;
            end = e->end;
            j++;
        }
        rw_sync_source src;
        RW_CHECKGOTO(rw_sync_bucket_from_entries(file, &ents[i], j - i, m, &src, err), st,
                     fail_open);
        /* apply aborts the session itself on failure */
        st = rw_sync_session_apply(s, m, &src, NULL, err);
        if (st != RW_OK) goto out;
        if (tensors) *tensors += j - i;
        if (bytes) *bytes += end - first->begin;
        i = j;
    }
    /* the files are closed below: nothing may still read them (every read has returned by
     * now; this waits for the device work queued after them) */
    st = rw_sync_pipe_wait_all(s, err);
    if (st != RW_OK) {
        st = rw_sync_session_fail(s, st, err);
        goto out;
    }
    if (implicit) st = rw_sync_session_commit(s, NULL, err);
    goto out;
fail_open:
    st = rw_sync_session_fail(s, st, err);
out:
    rw_sync_manifest_destroy(m);
    free(ents);
    rw_ckpt_close(ck);
    /* the host buffer of file buckets is not kept between loads */
    free(s->bounce);
    s->bounce = NULL;
    s->bounce_cap = 0;
    if (have_re) regfree(&re);
    return st;
}

/* ------------------------------------------------------------------------------------------ */
/* Start-up load                                                                                */
/* ------------------------------------------------------------------------------------------ */
#define LOAD_PIECE (256ull << 20)

static uint64_t load_piece_bytes(void) {
    const char *v = getenv("RW_LOAD_PIECE_BYTES");
    if (v && v[0]) {
        long long n = atoll(v);
        if (n >= 4096) return (uint64_t)n;
    }
    return LOAD_PIECE;
}

/* Rows per piece of the start-up load: the cutter's, but a row larger than the limit goes alone
 * (the host buffer, not a staging buffer, bounds these pieces, and it grows to one row). */
static uint64_t load_rows(const rw_st_entry *e, uint64_t limit) {
    uint64_t step = rw_sync_ckpt_rows(e, limit);
    return step ? step : 1;
}

rw_status rw_sync_load_ckpt(rw_wset *ws, const char *dir, uint64_t piece_bytes, rw_err *err) {
    rw_ckpt *ck = NULL;
    RW_CHECK(rw_ckpt_open(dir, &ck, err));
    rw_status st = RW_OK;
    const size_t n = rw_ckpt_count(ck);
    const uint64_t limit = piece_bytes ? piece_bytes : load_piece_bytes();
    /* the host buffer: the largest piece (rw_wset_apply gathers host pieces into its own
     * staging before it returns, so one buffer serves every piece in turn) */
    uint64_t cap = 1;
    for (size_t i = 0; i < n; i++) {
        const rw_st_entry *e = rw_ckpt_at(ck, i);
        uint64_t bytes = e->end - e->begin, rows = e->ndim >= 1 ? (uint64_t)e->shape[0] : 1;
        uint64_t piece = rows ? bytes / rows * load_rows(e, limit) : bytes;
        if (piece > cap) cap = piece;
    }
    void *buf = malloc((size_t)cap);
    if (!buf) {
        rw_ckpt_close(ck);
        RW_FAIL(err, RW_E_OOM, "loading %s: out of memory for a %llu-byte read buffer", dir,
                (unsigned long long)cap);
    }
    rw_wset_mark_clear(ws);
    for (size_t i = 0; i < n && st == RW_OK; i++) {
        const rw_st_entry *e = rw_ckpt_at(ck, i);
        const rw_st_file *f = rw_ckpt_file(ck, (size_t)e->file_index);
        const uint64_t bytes = e->end - e->begin;
        const uint64_t rows = e->ndim >= 1 ? (uint64_t)e->shape[0] : 1;
        const uint64_t step = load_rows(e, limit);
        const bool whole = step >= rows;
        const uint64_t row = rows ? bytes / rows : 0;
        uint64_t r = 0;
        do {
            const uint64_t nr = whole ? rows : (rows - r < step ? rows - r : step);
            const uint64_t off = whole ? 0 : r * row, len = whole ? bytes : nr * row;
            rw_piece p = {.name = e->name,
                          .dtype = e->dtype,
                          .ndim = e->ndim,
                          .shard_dim = whole ? -1 : 0,
                          .shard_begin = whole ? 0 : (int64_t)r,
                          .shard_len = whole ? 0 : (int64_t)nr,
                          .layout = RW_PIECE_PLAIN,
                          .data = buf,
                          .place = RW_PLACE_HOST};
            memcpy(p.shape, e->shape, sizeof p.shape);
            st = rw_st_read(f, e->begin + off, buf, (size_t)len, err);
            /* host pieces are copied before rw_wset_apply returns: buf is free again after it */
            if (st == RW_OK) st = rw_wset_apply(ws, &p, NULL, err);
            if (st != RW_OK) rw_err_prefix(err, "loading %s", dir);
            r += nr;
        } while (st == RW_OK && !whole && r < rows);
    }
    free(buf);
    rw_ckpt_close(ck);
    return st;
}
