/* safetensors.c - safetensors files: a reader that validates every header rule before any byte
 * is trusted, reads tensor bytes with pread() (a file that shrinks while it is read gives an
 * error, not a signal) and maps the file for callers that want a pointer view; an in-memory
 * variant; and a streaming writer.
 *
 * File layout: u64 little-endian header length N, then N bytes of JSON
 *   {"__metadata__": {"k": "v", ...}, "name": {"dtype": "BF16", "shape": [..],
 *    "data_offsets": [begin, end]}, ...}
 * (writers pad the JSON with spaces so the data section starts 8-byte aligned), then the data
 * section. Offsets are relative to the data section; the format requires the tensors to cover it
 * exactly, with no holes and no overlaps, so a file cannot smuggle extra bytes. */
#include "rw_core.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <jansson.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

struct rw_st_file {
    void *map; /* the mapping when opened from a path (NULL for rw_st_open_mem) */
    size_t map_len;
    /* Opened from a path: the descriptor rw_st_read reads from (-1 for rw_st_open_mem), the path
     * for messages, and what fstat said at open (a read compares: size and mtime). */
    int fd;
    char *path;
    uint64_t file_size;
    struct timespec mtime;
    const uint8_t *mem; /* data section of an rw_st_open_mem buffer (borrowed) */
    uint64_t data_off;  /* 8 + header length: where the data section starts in the file */
    uint64_t data_len;  /* validated length of the data section */
    /* test hook (RW_TEST_READ_PAUSE, see rw_core.h): the armed tensor's data range */
    char *pause_path;
    uint64_t pause_b, pause_e;
    atomic_int paused;
    size_t n;
    rw_st_entry *entries; /* [n], sorted by data offset */
    size_t *by_name;      /* [n] indices into entries, sorted by name (for rw_st_find) */
    char *names;          /* all tensor names, NUL-separated; entries[i].name points here */
    size_t n_meta;
    char **meta; /* [2 * n_meta]: key, value, ... (owned) */
};

/* ------------------------------------------------------------------------------------------ */
/* Reader                                                                                       */
/* ------------------------------------------------------------------------------------------ */

/* The safetensors spelling only: a file saying "bfloat16" is not a safetensors file. */
static rw_dtype st_dtype(const char *s) {
    for (int d = 1; d < RW_DTYPE_COUNT_; d++)
        if (!strcmp(s, rw_dtype_st_name((rw_dtype)d))) return (rw_dtype)d;
    return RW_DTYPE_INVALID;
}

static int cmp_offset(const void *a, const void *b) {
    const rw_st_entry *x = a, *y = b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    if (x->end != y->end) return x->end < y->end ? -1 : 1;
    return strcmp(x->name, y->name);
}

/* qsort has no context argument: sort (name pointer, index) pairs instead of bare indices. */
typedef struct {
    const char *name;
    size_t idx;
} name_idx;

static int cmp_name_idx(const void *a, const void *b) {
    return strcmp(((const name_idx *)a)->name, ((const name_idx *)b)->name);
}

/* Parses one tensor entry of the header into `e` (name not set). */
static rw_status parse_entry(const char *name, json_t *v, uint64_t data_len, rw_st_entry *e,
                             rw_err *err) {
    if (!json_is_object(v))
        RW_FAIL(err, RW_E_FORMAT, "tensor '%s': header entry is not a JSON object", name);
    json_t *jd = json_object_get(v, "dtype");
    json_t *js = json_object_get(v, "shape");
    json_t *jo = json_object_get(v, "data_offsets");
    if (!jd) RW_FAIL(err, RW_E_FORMAT, "tensor '%s': missing field 'dtype'", name);
    if (!js) RW_FAIL(err, RW_E_FORMAT, "tensor '%s': missing field 'shape'", name);
    if (!jo) RW_FAIL(err, RW_E_FORMAT, "tensor '%s': missing field 'data_offsets'", name);
    if (!json_is_string(jd)) RW_FAIL(err, RW_E_FORMAT, "tensor '%s': dtype is not a string", name);
    e->dtype = st_dtype(json_string_value(jd));
    if (e->dtype == RW_DTYPE_INVALID)
        RW_FAIL(err, RW_E_DTYPE, "tensor '%s': unknown dtype '%.32s'", name, json_string_value(jd));
    if (!json_is_array(js)) RW_FAIL(err, RW_E_SHAPE, "tensor '%s': shape is not a list", name);
    size_t nd = json_array_size(js);
    if (nd > RW_MAX_DIMS)
        RW_FAIL(err, RW_E_SHAPE, "tensor '%s': shape has %zu dimensions (at most %d)", name, nd,
                RW_MAX_DIMS);
    e->ndim = (int)nd;
    /* numel * size is formed with an overflow check: a shape whose byte count does not fit in 64
     * bits can never match its data_offsets and is reported as such. */
    uint64_t bytes = rw_dtype_size(e->dtype);
    bool too_big = false;
    for (size_t i = 0; i < nd; i++) {
        json_t *d = json_array_get(js, i);
        if (!json_is_integer(d) || json_integer_value(d) < 0)
            RW_FAIL(err, RW_E_SHAPE, "tensor '%s': shape[%zu] is not a non-negative integer", name,
                    i);
        e->shape[i] = json_integer_value(d);
        uint64_t dim = (uint64_t)e->shape[i];
        if (dim != 0 && bytes > UINT64_MAX / dim)
            too_big = true;
        else
            bytes *= dim;
    }
    if (!json_is_array(jo) || json_array_size(jo) != 2 || !json_is_integer(json_array_get(jo, 0)) ||
        !json_is_integer(json_array_get(jo, 1)))
        RW_FAIL(err, RW_E_FORMAT, "tensor '%s': data_offsets is not a list of two integers", name);
    json_int_t b = json_integer_value(json_array_get(jo, 0));
    json_int_t en = json_integer_value(json_array_get(jo, 1));
    if (b < 0 || en < 0)
        RW_FAIL(err, RW_E_FORMAT, "tensor '%s': negative data_offsets [%lld, %lld]", name,
                (long long)b, (long long)en);
    if (b > en)
        RW_FAIL(err, RW_E_FORMAT, "tensor '%s': data_offsets begin %lld is after end %lld", name,
                (long long)b, (long long)en);
    e->begin = (uint64_t)b;
    e->end = (uint64_t)en;
    char sh[160];
    if (too_big || bytes != e->end - e->begin)
        RW_FAIL(err, RW_E_SHAPE,
                "tensor '%s': shape %s of %s needs %s%llu bytes but data_offsets span %llu bytes",
                name, rw_shape_str(e->ndim, e->shape, sh, sizeof sh), rw_dtype_st_name(e->dtype),
                too_big ? "more than " : "",
                too_big ? (unsigned long long)UINT64_MAX : (unsigned long long)bytes,
                (unsigned long long)(e->end - e->begin));
    if (e->end > data_len)
        RW_FAIL(err, RW_E_FORMAT,
                "tensor '%s': data_offsets [%llu, %llu) run past the end of the data section "
                "(%llu bytes; file truncated?)",
                name, (unsigned long long)e->begin, (unsigned long long)e->end,
                (unsigned long long)data_len);
    return RW_OK;
}

static rw_status parse_metadata(rw_st_file *f, json_t *m, rw_err *err) {
    if (!json_is_object(m)) RW_FAIL(err, RW_E_FORMAT, "__metadata__ is not a JSON object");
    size_t n = json_object_size(m);
    f->meta = calloc(2 * n + 1, sizeof *f->meta);
    if (!f->meta) RW_FAIL(err, RW_E_OOM, "out of memory for __metadata__");
    const char *k;
    json_t *v;
    json_object_foreach(m, k, v) {
        if (!json_is_string(v))
            RW_FAIL(err, RW_E_FORMAT, "__metadata__ value of '%.64s' is not a string", k);
        f->meta[2 * f->n_meta] = strdup(k);
        f->meta[2 * f->n_meta + 1] = strdup(json_string_value(v));
        f->n_meta++;
        if (!f->meta[2 * f->n_meta - 2] || !f->meta[2 * f->n_meta - 1])
            RW_FAIL(err, RW_E_OOM, "out of memory for __metadata__");
    }
    return RW_OK;
}

/* The u64 little-endian header length at the start of a file, checked against the file length.
 * Messages never show the value: when it is wrong the 8 bytes are probably not a safetensors
 * header at all but the start of some other file (a symlink to a file the client could not
 * read), and their bytes must not reach the client that named it. */
static rw_status header_len(const uint8_t b8[8], uint64_t len, uint64_t *out, rw_err *err) {
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--)
        hlen = (hlen << 8) | b8[i];
    if (hlen > RW_ST_MAX_HEADER)
        RW_FAIL(err, RW_E_FORMAT,
                "not a safetensors file: its header length field exceeds the limit of %u bytes",
                RW_ST_MAX_HEADER);
    if (hlen > len - 8)
        RW_FAIL(err, RW_E_FORMAT,
                "not a safetensors file (or truncated): its header length field is larger than "
                "the file (%llu bytes after it)",
                (unsigned long long)(len - 8));
    if (hlen < 2)
        RW_FAIL(err, RW_E_FORMAT,
                "not a safetensors file: its header length field is too small for a JSON object");
    *out = hlen;
    return RW_OK;
}

/* Validates the JSON header `hdr` [hlen] of a file whose data section has data_len bytes and
 * fills `f`; entries' data pointers are `data` + begin (data: the data section in a mapping or
 * buffer). */
static rw_status parse_header(rw_st_file *f, const uint8_t *hdr, uint64_t hlen, const uint8_t *data,
                              uint64_t data_len, rw_err *err) {
    json_error_t je;
    json_t *root = json_loadb((const char *)hdr, (size_t)hlen, JSON_REJECT_DUPLICATES, &je);
    /* jansson's text quotes the bytes near the error ("near 'xyz'", "control character 0x..")
     * and the header may be some other file's contents: only a fixed reason is shown */
    if (!root)
        RW_FAIL(err, RW_E_FORMAT, "header is not valid JSON (at byte %d%s)", je.position,
                strstr(je.text, "duplicate object key") ? ": duplicate object key" : "");
    rw_status st = RW_OK;
    if (!json_is_object(root)) {
        st = RW_ERR(err, RW_E_FORMAT, "header is not a JSON object");
        goto out;
    }
    size_t n = json_object_size(root);
    json_t *meta = json_object_get(root, "__metadata__");
    if (meta) {
        n--;
        RW_CHECKGOTO(parse_metadata(f, meta, err), st, out);
    }
    size_t name_bytes = 0;
    const char *k;
    json_t *v;
    json_object_foreach(root, k, v) {
        if (!strcmp(k, "__metadata__")) continue;
        size_t kl = strlen(k);
        if (kl == 0) {
            st = RW_ERR(err, RW_E_FORMAT, "a tensor has an empty name");
            goto out;
        }
        if (kl > RW_ST_MAX_NAME) {
            st = RW_ERR(err, RW_E_FORMAT, "tensor '%.64s...': name longer than %d bytes (%zu)", k,
                        RW_ST_MAX_NAME, kl);
            goto out;
        }
        name_bytes += kl + 1;
    }
    f->entries = calloc(n ? n : 1, sizeof *f->entries);
    f->by_name = calloc(n ? n : 1, sizeof *f->by_name);
    f->names = malloc(name_bytes ? name_bytes : 1);
    name_idx *ni = calloc(n ? n : 1, sizeof *ni);
    if (!f->entries || !f->by_name || !f->names || !ni) {
        free(ni);
        st = RW_ERR(err, RW_E_OOM, "out of memory for %zu tensor entries", n);
        goto out;
    }
    size_t i = 0, pos = 0;
    json_object_foreach(root, k, v) {
        if (!strcmp(k, "__metadata__")) continue;
        rw_st_entry *e = &f->entries[i++];
        st = parse_entry(k, v, data_len, e, err);
        if (st != RW_OK) {
            free(ni);
            goto out;
        }
        size_t kl = strlen(k);
        memcpy(f->names + pos, k, kl + 1);
        e->name = f->names + pos;
        pos += kl + 1;
        e->data = data + e->begin;
        e->file_index = 0;
    }
    f->n = n;
    qsort(f->entries, n, sizeof *f->entries, cmp_offset);
    /* Tensors must tile [0, data_len) exactly: no overlap, no hole, no trailing bytes. */
    uint64_t at = 0;
    const char *prev = NULL;
    for (i = 0; i < n; i++) {
        const rw_st_entry *e = &f->entries[i];
        if (e->begin < at) {
            st = RW_ERR(err, RW_E_FORMAT,
                        "tensor '%s': data_offsets [%llu, %llu) overlap tensor '%s' (ends at %llu)",
                        e->name, (unsigned long long)e->begin, (unsigned long long)e->end, prev,
                        (unsigned long long)at);
            free(ni);
            goto out;
        }
        if (e->begin > at) {
            st = RW_ERR(
                err, RW_E_FORMAT,
                "tensor '%s': data starts at %llu, leaving a hole of %llu bytes after %s%s%s",
                e->name, (unsigned long long)e->begin, (unsigned long long)(e->begin - at),
                prev ? "tensor '" : "the start", prev ? prev : "", prev ? "'" : "");
            free(ni);
            goto out;
        }
        at = e->end;
        prev = e->name;
    }
    if (at != data_len) {
        st = RW_ERR(err, RW_E_FORMAT,
                    "data section has %llu trailing bytes not covered by any tensor (tensors end "
                    "at %llu of %llu)",
                    (unsigned long long)(data_len - at), (unsigned long long)at,
                    (unsigned long long)data_len);
        free(ni);
        goto out;
    }
    for (i = 0; i < n; i++)
        ni[i] = (name_idx){f->entries[i].name, i};
    qsort(ni, n, sizeof *ni, cmp_name_idx);
    for (i = 0; i < n; i++)
        f->by_name[i] = ni[i].idx;
    free(ni);
out:
    json_decref(root);
    return st;
}

/* Validates a whole file held in memory (`buf` [len]). */
static rw_status parse_file(rw_st_file *f, const uint8_t *buf, size_t len, rw_err *err) {
    if (len < 8)
        RW_FAIL(err, RW_E_FORMAT, "file is %zu bytes, shorter than the 8-byte header length", len);
    uint64_t hlen;
    RW_CHECK(header_len(buf, len, &hlen, err));
    f->data_off = 8 + hlen;
    f->data_len = len - 8 - hlen;
    return parse_header(f, buf + 8, hlen, buf + 8 + hlen, f->data_len, err);
}

static void st_free(rw_st_file *f) {
    if (!f) return;
    if (f->map) munmap(f->map, f->map_len);
    if (f->fd >= 0) close(f->fd);
    free(f->path);
    free(f->pause_path);
    for (size_t i = 0; i < 2 * f->n_meta; i++)
        free(f->meta[i]);
    free(f->meta);
    free(f->entries);
    free(f->by_name);
    free(f->names);
    free(f);
}

rw_status rw_st_open_mem(const void *buf, size_t len, rw_st_file **out, rw_err *err) {
    if (!out) RW_FAIL(err, RW_E_INVALID_ARG, "rw_st_open_mem: out is NULL");
    *out = NULL;
    if (!buf && len) RW_FAIL(err, RW_E_INVALID_ARG, "rw_st_open_mem: buffer is NULL");
    rw_st_file *f = calloc(1, sizeof *f);
    if (!f) RW_FAIL(err, RW_E_OOM, "out of memory for a safetensors handle");
    f->fd = -1;
    rw_status st = parse_file(f, buf, len, err);
    if (st != RW_OK) {
        st_free(f);
        return st;
    }
    f->mem = (const uint8_t *)buf + f->data_off;
    *out = f;
    return RW_OK;
}

/* pread of exactly n bytes at `off`; *got gets how many arrived (short: end of file). */
static rw_status pread_full(int fd, void *dst, size_t n, uint64_t off, size_t *got) {
    uint8_t *p = dst;
    size_t done = 0;
    while (done < n) {
        size_t ask = n - done > (1u << 30) ? (1u << 30) : n - done;
        ssize_t r = pread(fd, p + done, ask, (off_t)(off + done));
        if (r < 0) {
            if (errno == EINTR) continue;
            *got = done;
            return RW_E_IO;
        }
        if (r == 0) break;
        done += (size_t)r;
    }
    *got = done;
    return RW_OK;
}

/* Test hook: arms `f` when RW_TEST_READ_PAUSE names an existing file that holds the name of one
 * of f's tensors (see rw_core.h). */
static void pause_arm(rw_st_file *f) {
    const char *p = getenv("RW_TEST_READ_PAUSE");
    if (!p || !p[0]) return;
    char *text = NULL;
    size_t len = 0;
    if (rw_read_file(p, &text, &len, NULL) != RW_OK) return;
    while (len && (text[len - 1] == '\n' || text[len - 1] == ' '))
        text[--len] = 0;
    const rw_st_entry *e = rw_st_find(f, text);
    free(text);
    if (!e) return;
    f->pause_path = strdup(p);
    f->pause_b = e->begin;
    f->pause_e = e->end > e->begin ? e->end : e->begin + 1;
}

/* The first read of an armed handle that touches the armed tensor: "<path>.paused" appears, then
 * the read waits (up to 60 s) until <path> is removed. */
static void pause_here(const rw_st_file *f, uint64_t off, size_t len) {
    if (!f->pause_path || off >= f->pause_e || off + len <= f->pause_b) return;
    if (atomic_exchange((atomic_int *)&f->paused, 1)) return;
    size_t n = strlen(f->pause_path) + 8;
    char *mark = malloc(n);
    if (!mark) return;
    snprintf(mark, n, "%s.paused", f->pause_path);
    int fd = open(mark, O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
    if (fd >= 0) close(fd);
    free(mark);
    double end = rw_now() + 60;
    while (access(f->pause_path, F_OK) == 0 && rw_now() < end) {
        struct timespec ts = {0, 5000000};
        nanosleep(&ts, NULL);
    }
}

/* The tensor whose bytes hold data-section offset `off` (the last one for off past the end). */
static const rw_st_entry *entry_at(const rw_st_file *f, uint64_t off) {
    if (f->n == 0) return NULL;
    size_t lo = 0, hi = f->n;
    while (lo < hi) { /* first entry with end > off */
        size_t mid = lo + (hi - lo) / 2;
        if (f->entries[mid].end > off)
            hi = mid;
        else
            lo = mid + 1;
    }
    return &f->entries[lo < f->n ? lo : f->n - 1];
}

rw_status rw_st_open(const char *path, rw_st_file **out, rw_err *err) {
    if (!out || !path) RW_FAIL(err, RW_E_INVALID_ARG, "rw_st_open: path or out is NULL");
    *out = NULL;
    /* without blocking and checked on the descriptor: a FIFO or device named as a checkpoint
     * file is refused at once instead of stalling the worker (rw_open_regular) */
    int fd;
    struct stat sb;
    RW_CHECK(rw_open_regular(path, &fd, &sb, err));
    size_t len = (size_t)sb.st_size;
    if (len < 8) {
        close(fd);
        RW_FAIL(err, RW_E_FORMAT, "%s: file is %zu bytes, shorter than the 8-byte header length",
                path, len);
    }
    rw_st_file *f = calloc(1, sizeof *f);
    if (!f) {
        close(fd);
        RW_FAIL(err, RW_E_OOM, "out of memory for a safetensors handle");
    }
    f->fd = fd;
    f->file_size = (uint64_t)sb.st_size;
    f->mtime = sb.st_mtim;
    rw_status st = RW_OK;
    uint8_t *hdr = NULL;
    f->path = strdup(path);
    if (!f->path) {
        st = RW_ERR(err, RW_E_OOM, "out of memory for a safetensors handle");
        goto fail;
    }
    /* The header is read, not mapped: a file cut short meanwhile is an error here too. */
    uint8_t b8[8];
    size_t got = 0;
    uint64_t hlen = 0;
    if (pread_full(fd, b8, 8, 0, &got) != RW_OK || got != 8) {
        st = RW_ERR(err, RW_E_IO, "cannot read the header length: %s",
                    got != 8 ? "file shrank while opening" : strerror(errno));
        goto fail;
    }
    RW_CHECKGOTO(header_len(b8, len, &hlen, err), st, fail);
    hdr = malloc((size_t)hlen);
    if (!hdr) {
        st = RW_ERR(err, RW_E_OOM, "out of memory for a header of %llu bytes",
                    (unsigned long long)hlen); /* a valid length: it fits the file */
        goto fail;
    }
    if (pread_full(fd, hdr, (size_t)hlen, 8, &got) != RW_OK || got != hlen) {
        st = RW_ERR(err, RW_E_IO, "cannot read the %llu-byte header: %s", (unsigned long long)hlen,
                    got != hlen ? "file shrank while opening" : strerror(errno));
        goto fail;
    }
    /* The mapping backs rw_st_entry.data for callers that want a pointer view (tools, tests);
     * the worker's load paths read with rw_st_read instead. Mapping reads nothing. */
    void *map = mmap(NULL, len, PROT_READ, MAP_SHARED, fd, 0);
    if (map == MAP_FAILED) {
        st = RW_ERR(err, RW_E_IO, "cannot mmap: %s", strerror(errno));
        goto fail;
    }
    f->map = map;
    f->map_len = len;
    f->data_off = 8 + hlen;
    f->data_len = len - 8 - hlen;
    RW_CHECKGOTO(parse_header(f, hdr, hlen, (const uint8_t *)map + 8 + hlen, f->data_len, err), st,
                 fail);
    free(hdr);
    pause_arm(f);
    *out = f;
    return RW_OK;
fail:
    free(hdr);
    st_free(f);
    return rw_err_prefix(err, "%s", path), st;
}

const char *rw_st_path(const rw_st_file *f) {
    return f ? f->path : NULL;
}

rw_status rw_st_read(const rw_st_file *f, uint64_t off, void *dst, size_t len, rw_err *err) {
    if (!f || (!dst && len)) RW_FAIL(err, RW_E_INVALID_ARG, "rw_st_read: NULL argument");
    if (off > f->data_len || len > f->data_len - off)
        RW_FAIL(err, RW_E_RANGE,
                "%s: read of %zu bytes at data offset %" PRIu64 " passes the data section (%" PRIu64
                " bytes)",
                f->path ? f->path : "safetensors buffer", len, off, f->data_len);
    if (len == 0) return RW_OK;
    if (!f->path) {
        memcpy(dst, f->mem + off, len);
        return RW_OK;
    }
    pause_here(f, off, len);
    size_t got = 0;
    rw_status st = pread_full(f->fd, dst, len, f->data_off + off, &got);
    int e = errno;
    if (st != RW_OK) {
        const rw_st_entry *t = entry_at(f, off + got);
        RW_FAIL(err, RW_E_IO,
                "%s: read failed at byte %" PRIu64 " of the file (tensor '%s', %" PRIu64
                " bytes into it): %s",
                f->path, f->data_off + off + got, t ? t->name : "?",
                t && off + got >= t->begin ? off + got - t->begin : 0, strerror(e));
    }
    struct stat sb;
    bool have = fstat(f->fd, &sb) == 0;
    if (have && (uint64_t)sb.st_size < f->file_size) {
        /* Whether this read came up short or ran before the cut, the error names where the file
         * ends now (the same for every read of a shrunk file, whichever thread reports it). */
        uint64_t now = (uint64_t)sb.st_size, d = now > f->data_off ? now - f->data_off : 0;
        const rw_st_entry *t = entry_at(f, d);
        RW_FAIL(err, RW_E_IO,
                "%s: file shrank while loading: it is now %" PRIu64 " bytes (%" PRIu64
                " when it was validated); tensor '%s' is cut at byte %" PRIu64
                " of the file (%" PRIu64 " bytes into the tensor)",
                f->path, now, f->file_size, t ? t->name : "?", now,
                t && d >= t->begin ? d - t->begin : 0);
    }
    if (got < len) { /* shrank and grew again since */
        const rw_st_entry *t = entry_at(f, off + got);
        RW_FAIL(err, RW_E_IO,
                "%s: file shrank while loading: tensor '%s' could not be read at byte %" PRIu64
                " of the file (%" PRIu64 " bytes into the tensor)",
                f->path, t ? t->name : "?", f->data_off + off + got,
                t && off + got >= t->begin ? off + got - t->begin : 0);
    }
    /* The bytes arrived; but if the file was rewritten meanwhile they may mix two versions. */
    if (have && ((uint64_t)sb.st_size != f->file_size || sb.st_mtim.tv_sec != f->mtime.tv_sec ||
                 sb.st_mtim.tv_nsec != f->mtime.tv_nsec)) {
        const rw_st_entry *t = entry_at(f, off);
        RW_FAIL(err, RW_E_IO,
                "%s: file changed while loading (modified after it was validated; now %lld "
                "bytes, %" PRIu64 " then): reading tensor '%s' at byte %" PRIu64 " of the file",
                f->path, (long long)sb.st_size, f->file_size, t ? t->name : "?", f->data_off + off);
    }
    return RW_OK;
}

void rw_st_close(rw_st_file *f) {
    st_free(f);
}

size_t rw_st_count(const rw_st_file *f) {
    return f ? f->n : 0;
}

const rw_st_entry *rw_st_at(const rw_st_file *f, size_t i) {
    return f && i < f->n ? &f->entries[i] : NULL;
}

const rw_st_entry *rw_st_find(const rw_st_file *f, const char *name) {
    if (!f || !name) return NULL;
    size_t lo = 0, hi = f->n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        const rw_st_entry *e = &f->entries[f->by_name[mid]];
        int c = strcmp(name, e->name);
        if (c == 0) return e;
        if (c < 0)
            hi = mid;
        else
            lo = mid + 1;
    }
    return NULL;
}

const char *rw_st_metadata(const rw_st_file *f, const char *key) {
    if (!f || !key) return NULL;
    for (size_t i = 0; i < f->n_meta; i++)
        if (!strcmp(f->meta[2 * i], key)) return f->meta[2 * i + 1];
    return NULL;
}

/* ------------------------------------------------------------------------------------------ */
/* Writer                                                                                       */
/* ------------------------------------------------------------------------------------------ */

/* Small writes are gathered in `buf` so that element-by-element producers do not pay a system
 * call each; large writes go straight to the file. The file is written under a temporary name
 * and renamed on a successful close, so a reader never sees a half-written file. */
#define WBUF (1u << 20)

struct rw_st_writer {
    int fd;
    char *path;
    char *tmp;
    uint64_t total;   /* declared data bytes */
    uint64_t written; /* data bytes accepted so far */
    size_t nbuf;
    uint8_t *buf; /* [WBUF] */
};

static rw_status write_all(int fd, const void *p, size_t n, const char *path, rw_err *err) {
    const uint8_t *b = p;
    while (n) {
        ssize_t w = write(fd, b, n > (1u << 30) ? (1u << 30) : n);
        if (w < 0) {
            if (errno == EINTR) continue;
            RW_FAIL(err, RW_E_IO, "write to %s failed: %s", path, strerror(errno));
        }
        b += w;
        n -= (size_t)w;
    }
    return RW_OK;
}

static rw_status flush_buf(rw_st_writer *w, rw_err *err) {
    if (!w->nbuf) return RW_OK;
    RW_CHECK(write_all(w->fd, w->buf, w->nbuf, w->tmp, err));
    w->nbuf = 0;
    return RW_OK;
}

static void writer_free(rw_st_writer *w, bool remove_tmp) {
    if (!w) return;
    if (w->fd >= 0) close(w->fd);
    if (remove_tmp && w->tmp) unlink(w->tmp);
    free(w->path);
    free(w->tmp);
    free(w->buf);
    free(w);
}

/* Builds the header JSON: metadata first, then the tensors in declaration order with contiguous
 * offsets. */
static rw_status build_header(const rw_st_decl *decls, size_t n, const char *const *meta_kv,
                              char **out, uint64_t *total, rw_err *err) {
    *out = NULL;
    rw_status st = RW_OK;
    json_t *root = json_object();
    if (!root) RW_FAIL(err, RW_E_OOM, "out of memory building a safetensors header");
    if (meta_kv && meta_kv[0]) {
        json_t *m = json_object();
        json_object_set_new(root, "__metadata__", m);
        for (size_t i = 0; meta_kv[i]; i += 2) {
            if (!meta_kv[i + 1]) {
                st = RW_ERR(err, RW_E_INVALID_ARG, "metadata key '%s' has no value", meta_kv[i]);
                goto out;
            }
            if (json_object_set_new(m, meta_kv[i], json_string(meta_kv[i + 1])) != 0) {
                st = RW_ERR(err, RW_E_INVALID_ARG, "metadata '%s' is not valid UTF-8", meta_kv[i]);
                goto out;
            }
        }
    }
    uint64_t off = 0;
    for (size_t i = 0; i < n; i++) {
        const rw_st_decl *d = &decls[i];
        if (!d->name || !d->name[0]) {
            st = RW_ERR(err, RW_E_INVALID_ARG, "tensor %zu has no name", i);
            goto out;
        }
        size_t kl = strlen(d->name);
        if (kl > RW_ST_MAX_NAME) {
            st = RW_ERR(err, RW_E_INVALID_ARG, "tensor '%.64s...': name longer than %d bytes",
                        d->name, RW_ST_MAX_NAME);
            goto out;
        }
        if (!strcmp(d->name, "__metadata__")) {
            st = RW_ERR(err, RW_E_INVALID_ARG, "a tensor cannot be named __metadata__");
            goto out;
        }
        if (json_object_get(root, d->name)) {
            st = RW_ERR(err, RW_E_INVALID_ARG, "tensor '%s' is declared twice", d->name);
            goto out;
        }
        size_t es = rw_dtype_size(d->dtype);
        if (!es) {
            st = RW_ERR(err, RW_E_DTYPE, "tensor '%s': invalid dtype %d", d->name, (int)d->dtype);
            goto out;
        }
        if (d->ndim < 0 || d->ndim > RW_MAX_DIMS) {
            st = RW_ERR(err, RW_E_SHAPE, "tensor '%s': ndim %d (0..%d)", d->name, d->ndim,
                        RW_MAX_DIMS);
            goto out;
        }
        uint64_t bytes = es;
        json_t *shape = json_array();
        json_t *e = json_object();
        json_object_set_new(e, "dtype", json_string(rw_dtype_st_name(d->dtype)));
        json_object_set_new(e, "shape", shape);
        if (json_object_set_new(root, d->name, e) != 0) {
            st = RW_ERR(err, RW_E_INVALID_ARG, "tensor name '%.64s' is not valid UTF-8", d->name);
            goto out;
        }
        for (int k = 0; k < d->ndim; k++) {
            if (d->shape[k] < 0) {
                st = RW_ERR(err, RW_E_SHAPE, "tensor '%s': negative shape[%d]", d->name, k);
                goto out;
            }
            uint64_t dim = (uint64_t)d->shape[k];
            if (dim && bytes > (UINT64_MAX >> 2) / dim) {
                st = RW_ERR(err, RW_E_SHAPE, "tensor '%s': byte size overflows", d->name);
                goto out;
            }
            bytes *= dim;
            json_array_append_new(shape, json_integer(d->shape[k]));
        }
        if (off + bytes > (uint64_t)INT64_MAX) {
            st = RW_ERR(err, RW_E_SHAPE, "tensor '%s': file would exceed 2^63 bytes", d->name);
            goto out;
        }
        json_t *o = json_array();
        json_array_append_new(o, json_integer((json_int_t)off));
        json_array_append_new(o, json_integer((json_int_t)(off + bytes)));
        json_object_set_new(e, "data_offsets", o);
        off += bytes;
    }
    *out = json_dumps(root, JSON_COMPACT | JSON_PRESERVE_ORDER);
    if (!*out) st = RW_ERR(err, RW_E_OOM, "out of memory serialising a safetensors header");
    *total = off;
out:
    json_decref(root);
    return st;
}

rw_status rw_st_writer_create(const char *path, const rw_st_decl *decls, size_t n,
                              const char *const *meta_kv, rw_st_writer **out, rw_err *err) {
    if (!out || !path) RW_FAIL(err, RW_E_INVALID_ARG, "rw_st_writer_create: path or out is NULL");
    *out = NULL;
    if (n && !decls) RW_FAIL(err, RW_E_INVALID_ARG, "rw_st_writer_create: decls is NULL");
    char *hdr = NULL;
    uint64_t total = 0;
    rw_status st = build_header(decls, n, meta_kv, &hdr, &total, err);
    if (st != RW_OK) return rw_err_prefix(err, "%s", path), st;
    size_t hl = strlen(hdr);
    size_t padded = (hl + 7) & ~(size_t)7; /* data section starts 8-byte aligned */
    if (padded > RW_ST_MAX_HEADER) {
        free(hdr);
        RW_FAIL(err, RW_E_RANGE, "%s: header of %zu bytes exceeds the reader's limit", path,
                padded);
    }
    rw_st_writer *w = calloc(1, sizeof *w);
    if (!w) {
        free(hdr);
        RW_FAIL(err, RW_E_OOM, "out of memory for a safetensors writer");
    }
    w->fd = -1;
    w->total = total;
    w->path = strdup(path);
    w->tmp = malloc(strlen(path) + 16);
    w->buf = malloc(WBUF > padded + 8 ? WBUF : padded + 8);
    if (!w->path || !w->tmp || !w->buf) {
        free(hdr);
        writer_free(w, false);
        RW_FAIL(err, RW_E_OOM, "out of memory for a safetensors writer");
    }
    sprintf(w->tmp, "%s.partial", path);
    w->fd = open(w->tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (w->fd < 0) {
        int e = errno;
        free(hdr);
        writer_free(w, false);
        RW_FAIL(err, RW_E_IO, "cannot create %s.partial: %s", path, strerror(e));
    }
    uint64_t hlen = padded;
    for (int i = 0; i < 8; i++)
        w->buf[i] = (uint8_t)(hlen >> (8 * i));
    memcpy(w->buf + 8, hdr, hl);
    memset(w->buf + 8 + hl, ' ', padded - hl);
    free(hdr);
    w->nbuf = 8 + padded;
    st = flush_buf(w, err);
    if (st != RW_OK) {
        writer_free(w, true);
        return st;
    }
    *out = w;
    return RW_OK;
}

rw_status rw_st_writer_write(rw_st_writer *w, const void *bytes, size_t len, rw_err *err) {
    if (!w) RW_FAIL(err, RW_E_INVALID_ARG, "rw_st_writer_write: writer is NULL");
    if (len && !bytes) RW_FAIL(err, RW_E_INVALID_ARG, "rw_st_writer_write: bytes is NULL");
    if (len > w->total - w->written)
        RW_FAIL(err, RW_E_SHAPE,
                "%s: writing %zu bytes would pass the %llu declared (%llu written)", w->path, len,
                (unsigned long long)w->total, (unsigned long long)w->written);
    if (w->nbuf + len <= WBUF) {
        memcpy(w->buf + w->nbuf, bytes, len);
        w->nbuf += len;
    } else {
        RW_CHECK(flush_buf(w, err));
        if (len < WBUF) {
            memcpy(w->buf, bytes, len);
            w->nbuf = len;
        } else {
            RW_CHECK(write_all(w->fd, bytes, len, w->tmp, err));
        }
    }
    w->written += len;
    return RW_OK;
}

rw_status rw_st_writer_close(rw_st_writer *w, rw_err *err) {
    if (!w) RW_FAIL(err, RW_E_INVALID_ARG, "rw_st_writer_close: writer is NULL");
    rw_status st = RW_OK;
    if (w->written != w->total) {
        st = RW_ERR(err, RW_E_SHAPE, "%s: %llu of %llu declared data bytes written", w->path,
                    (unsigned long long)w->written, (unsigned long long)w->total);
        writer_free(w, true);
        return st;
    }
    st = flush_buf(w, err);
    if (st == RW_OK) {
        int fd = w->fd;
        w->fd = -1;
        if (close(fd) != 0)
            st = RW_ERR(err, RW_E_IO, "closing %s failed: %s", w->tmp, strerror(errno));
    }
    if (st == RW_OK && rename(w->tmp, w->path) != 0)
        st = RW_ERR(err, RW_E_IO, "cannot rename %s to %s: %s", w->tmp, w->path, strerror(errno));
    writer_free(w, st != RW_OK);
    return st;
}

void rw_st_writer_discard(rw_st_writer *w) {
    writer_free(w, true);
}
