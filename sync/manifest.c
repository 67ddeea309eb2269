/* manifest.c - bucket manifests: building them on the trainer side, their msgpack wire form, and
 * the structural checks run before the model is consulted (ranges inside the bucket, no
 * overlaps, byte counts consistent with dtype x shape). */
#include "sync_internal.h"

#include <inttypes.h>
#include <stdlib.h>

struct rw_sync_manifest {
    rw_sync_tensor *t;
    size_t n, cap;
    uint64_t bytes;
};

rw_status rw_sync_manifest_create(rw_sync_manifest **out, rw_err *err) {
    *out = calloc(1, sizeof **out);
    if (!*out) RW_FAIL(err, RW_E_OOM, "manifest: out of memory");
    return RW_OK;
}

void rw_sync_manifest_destroy(rw_sync_manifest *m) {
    if (!m) return;
    free(m->t);
    free(m);
}

void rw_sync_manifest_clear(rw_sync_manifest *m) {
    m->n = 0;
    m->bytes = 0;
}

size_t rw_sync_manifest_count(const rw_sync_manifest *m) {
    return m->n;
}
const rw_sync_tensor *rw_sync_manifest_at(const rw_sync_manifest *m, size_t i) {
    return i < m->n ? &m->t[i] : NULL;
}
uint64_t rw_sync_manifest_bytes(const rw_sync_manifest *m) {
    return m->bytes;
}
void rw_sync_manifest_set_bytes(rw_sync_manifest *m, uint64_t b) {
    m->bytes = b;
}

rw_status rw_sync_manifest_push(rw_sync_manifest *m, const rw_sync_tensor *t, rw_err *err) {
    if (m->n >= RW_SYNC_MAX_TENSORS)
        RW_FAIL(err, RW_E_RANGE, "manifest: more than %d tensors in one bucket",
                RW_SYNC_MAX_TENSORS);
    if (m->n == m->cap) {
        size_t cap = m->cap ? 2 * m->cap : 64;
        rw_sync_tensor *nt = realloc(m->t, cap * sizeof *nt);
        if (!nt) RW_FAIL(err, RW_E_OOM, "manifest: out of memory");
        m->t = nt;
        m->cap = cap;
    }
    m->t[m->n++] = *t;
    return RW_OK;
}

/* Overflow-safe element count of the piece; 0 when a dim is invalid. */
uint64_t rw_sync_piece_bytes(const rw_sync_tensor *t) {
    size_t es = rw_dtype_size(t->dtype);
    if (!es || t->ndim < 1 || t->ndim > RW_MAX_DIMS) return 0;
    uint64_t n = es;
    for (int d = 0; d < t->ndim; d++) {
        int64_t len = t->shape[d];
        if (d == t->shard_dim)
            len = t->layout == RW_PIECE_GATE_UP ? 2 * t->shard_len : t->shard_len;
        if (len <= 0 || (uint64_t)len > UINT64_MAX / n) return 0;
        n *= (uint64_t)len;
    }
    return n;
}

rw_status rw_sync_manifest_add(rw_sync_manifest *m, const char *name, rw_dtype dtype, int ndim,
                               const int64_t *shape, int shard_dim, int64_t shard_begin,
                               int64_t shard_len, rw_piece_layout layout, uint64_t *offset,
                               rw_err *err) {
    rw_sync_tensor t;
    memset(&t, 0, sizeof t);
    if (!name || strlen(name) >= sizeof t.name)
        RW_FAIL(err, RW_E_INVALID_ARG, "manifest: name missing or longer than %d bytes",
                RW_SYNC_MAX_NAME - 1);
    if (ndim < 1 || ndim > RW_MAX_DIMS)
        RW_FAIL(err, RW_E_SHAPE, "manifest: %s: ndim %d outside [1, %d]", name, ndim, RW_MAX_DIMS);
    strcpy(t.name, name);
    t.dtype = dtype;
    t.ndim = ndim;
    memcpy(t.shape, shape, (size_t)ndim * sizeof *shape);
    t.shard_dim = shard_dim;
    t.shard_begin = shard_dim >= 0 ? shard_begin : 0;
    t.shard_len = shard_dim >= 0 ? shard_len : 0;
    t.layout = layout;
    t.nbytes = rw_sync_piece_bytes(&t);
    if (!t.nbytes)
        RW_FAIL(err, RW_E_SHAPE, "manifest: %s: invalid dtype, shape or shard length", name);
    t.offset = (m->bytes + RW_SYNC_ALIGN - 1) / RW_SYNC_ALIGN * RW_SYNC_ALIGN;
    RW_CHECK(rw_sync_manifest_push(m, &t, err));
    m->bytes = t.offset + t.nbytes;
    if (offset) *offset = t.offset;
    return RW_OK;
}

static bool name_ok(const char *s) {
    if (!s[0]) return false;
    for (const char *p = s; *p; p++)
        if (*p < 0x21 || *p > 0x7e) return false;
    return true;
}

typedef struct idx_sort {
    const rw_sync_tensor *t;
} idx_sort;

static int by_offset(const void *a, const void *b) {
    const rw_sync_tensor *x = ((const idx_sort *)a)->t, *y = ((const idx_sort *)b)->t;
    return x->offset < y->offset ? -1 : x->offset > y->offset;
}

static int by_name_then_shard(const void *a, const void *b) {
    const rw_sync_tensor *x = ((const idx_sort *)a)->t, *y = ((const idx_sort *)b)->t;
    int c = strcmp(x->name, y->name);
    if (c) return c;
    return x->shard_begin < y->shard_begin ? -1 : x->shard_begin > y->shard_begin;
}

static rw_status check_one(const rw_sync_tensor *t, uint64_t bucket, size_t i, rw_err *err) {
    if (!name_ok(t->name))
        RW_FAIL(err, RW_E_INVALID_ARG, "manifest: tensor %zu: empty or non-printable name", i);
    const char *n = t->name;
    if (!rw_dtype_size(t->dtype))
        RW_FAIL(err, RW_E_DTYPE, "manifest: %s: unknown dtype %d", n, (int)t->dtype);
    if (t->ndim < 1 || t->ndim > RW_MAX_DIMS)
        RW_FAIL(err, RW_E_SHAPE, "manifest: %s: ndim %d outside [1, %d]", n, t->ndim, RW_MAX_DIMS);
    for (int d = 0; d < t->ndim; d++)
        if (t->shape[d] < 1 || t->shape[d] > (INT64_C(1) << 40))
            RW_FAIL(err, RW_E_SHAPE, "manifest: %s: shape[%d] = %" PRId64 " outside [1, 2^40]", n,
                    d, t->shape[d]);
    if (t->layout != RW_PIECE_PLAIN && t->layout != RW_PIECE_GATE_UP)
        RW_FAIL(err, RW_E_INVALID_ARG, "manifest: %s: unknown layout %d", n, (int)t->layout);
    if (t->shard_dim < -1 || t->shard_dim >= t->ndim)
        RW_FAIL(err, RW_E_SHAPE, "manifest: %s: shard dim %d outside [-1, %d)", n, t->shard_dim,
                t->ndim);
    if (t->shard_dim >= 0) {
        /* gate_up shards index each half [0, I) of the fused dim 2I */
        int64_t extent =
            t->layout == RW_PIECE_GATE_UP ? t->shape[t->shard_dim] / 2 : t->shape[t->shard_dim];
        if (t->layout == RW_PIECE_GATE_UP && t->shape[t->shard_dim] % 2)
            RW_FAIL(err, RW_E_SHAPE, "manifest: %s: gate_up dim %d has odd size %" PRId64, n,
                    t->shard_dim, t->shape[t->shard_dim]);
        if (t->shard_len < 1 || t->shard_begin < 0 || t->shard_begin > extent - t->shard_len)
            RW_FAIL(err, RW_E_SHAPE,
                    "manifest: %s: shard [%" PRId64 ", +%" PRId64 ") outside [0, %" PRId64
                    ") along dim %d",
                    n, t->shard_begin, t->shard_len, extent, t->shard_dim);
    } else if (t->layout == RW_PIECE_GATE_UP) {
        RW_FAIL(err, RW_E_SHAPE, "manifest: %s: layout gate_up needs a shard dim", n);
    }
    uint64_t want = rw_sync_piece_bytes(t);
    if (!want) RW_FAIL(err, RW_E_SHAPE, "manifest: %s: shape too large", n);
    if (t->nbytes != want)
        RW_FAIL(err, RW_E_SHAPE,
                "manifest: %s: nbytes %" PRIu64 " but dtype %s x shape of the piece is %" PRIu64, n,
                t->nbytes, rw_dtype_name(t->dtype), want);
    if (t->offset % rw_dtype_size(t->dtype))
        RW_FAIL(err, RW_E_INVALID_ARG, "manifest: %s: offset %" PRIu64 " not aligned to %zu bytes",
                n, t->offset, rw_dtype_size(t->dtype));
    if (t->offset > bucket || t->nbytes > bucket - t->offset)
        RW_FAIL(err, RW_E_RANGE,
                "manifest: %s: bytes [%" PRIu64 ", %" PRIu64 ") outside the bucket of %" PRIu64
                " bytes",
                n, t->offset, t->offset + t->nbytes, bucket);
    return RW_OK;
}

rw_status rw_sync_manifest_check(const rw_sync_manifest *m, rw_err *err) {
    for (size_t i = 0; i < m->n; i++)
        RW_CHECK(check_one(&m->t[i], m->bytes, i, err));
    if (m->n < 2) return RW_OK;
    idx_sort *ix = malloc(m->n * sizeof *ix);
    if (!ix) RW_FAIL(err, RW_E_OOM, "manifest: out of memory");
    for (size_t i = 0; i < m->n; i++)
        ix[i].t = &m->t[i];
    rw_status st = RW_OK;
    qsort(ix, m->n, sizeof *ix, by_offset);
    for (size_t i = 1; i < m->n; i++)
        if (ix[i].t->offset < ix[i - 1].t->offset + ix[i - 1].t->nbytes) {
            st = RW_ERR(err, RW_E_RANGE,
                        "manifest: %s: bytes [%" PRIu64 ", %" PRIu64 ") overlap %s [%" PRIu64
                        ", %" PRIu64 ")",
                        ix[i].t->name, ix[i].t->offset, ix[i].t->offset + ix[i].t->nbytes,
                        ix[i - 1].t->name, ix[i - 1].t->offset,
                        ix[i - 1].t->offset + ix[i - 1].t->nbytes);
            goto done;
        }
    /* two pieces of the same tensor: whole + anything, or overlapping shard ranges */
    qsort(ix, m->n, sizeof *ix, by_name_then_shard);
    for (size_t i = 1; i < m->n; i++) {
        const rw_sync_tensor *a = ix[i - 1].t, *b = ix[i].t;
        if (strcmp(a->name, b->name)) continue;
        if (a->shard_dim < 0 || b->shard_dim < 0 || a->shard_dim != b->shard_dim ||
            a->layout != b->layout || b->shard_begin < a->shard_begin + a->shard_len) {
            st = RW_ERR(err, RW_E_INVALID_ARG,
                        "manifest: %s: two pieces in one bucket cover the same elements", a->name);
            goto done;
        }
    }
done:
    free(ix);
    return st;
}

rw_piece rw_sync_tensor_piece(const rw_sync_tensor *t, const void *base, rw_place place) {
    rw_piece p;
    memset(&p, 0, sizeof p);
    p.name = t->name;
    p.dtype = t->dtype;
    p.ndim = t->ndim;
    memcpy(p.shape, t->shape, sizeof p.shape);
    p.shard_dim = t->shard_dim;
    p.shard_begin = t->shard_begin;
    p.shard_len = t->shard_len;
    p.layout = t->layout;
    p.data = base ? (const uint8_t *)base + t->offset : NULL;
    p.place = place;
    return p;
}

/* --- wire form --------------------------------------------------------------------------- */
void rw_sync_manifest_write(const rw_sync_manifest *m, rw_mw *w) {
    rw_mw_map(w, 2);
    rw_mw_str(w, "nbytes");
    rw_mw_u64(w, m->bytes);
    rw_mw_str(w, "tensors");
    rw_mw_array(w, (uint32_t)m->n);
    for (size_t i = 0; i < m->n; i++) {
        const rw_sync_tensor *t = &m->t[i];
        bool shard = t->shard_dim >= 0, gu = t->layout == RW_PIECE_GATE_UP;
        rw_mw_map(w, 5 + (shard ? 1 : 0) + (gu ? 1 : 0));
        rw_mw_str(w, "name");
        rw_mw_str(w, t->name);
        rw_mw_str(w, "dtype");
        rw_mw_str(w, rw_dtype_name(t->dtype));
        rw_mw_str(w, "shape");
        rw_mw_array(w, (uint32_t)t->ndim);
        for (int d = 0; d < t->ndim; d++)
            rw_mw_i64(w, t->shape[d]);
        rw_mw_str(w, "offset");
        rw_mw_u64(w, t->offset);
        rw_mw_str(w, "nbytes");
        rw_mw_u64(w, t->nbytes);
        if (shard) {
            rw_mw_str(w, "shard");
            rw_mw_map(w, 3);
            rw_mw_str(w, "dim");
            rw_mw_i64(w, t->shard_dim);
            rw_mw_str(w, "begin");
            rw_mw_i64(w, t->shard_begin);
            rw_mw_str(w, "len");
            rw_mw_i64(w, t->shard_len);
        }
        if (gu) {
            rw_mw_str(w, "layout");
            rw_mw_str(w, "gate_up");
        }
    }
}

static rw_status read_tensor(const rw_mobj *o, const char *what, rw_sync_tensor *t, rw_err *err) {
    memset(t, 0, sizeof *t);
    t->shard_dim = -1;
    rw_mfields f;
    RW_CHECK(rw_mfields_init(&f, o, what, err));
    const rw_mobj *v;
    char w[160];
    RW_CHECK(rw_mfields_req(&f, "name", &v, err));
    snprintf(w, sizeof w, "%s.name", what);
    RW_CHECK(rw_mobj_strcpy(v, w, t->name, sizeof t->name, err));
    /* from here on errors name the tensor, not only its index */
    char dt[32];
    RW_CHECK(rw_mfields_req(&f, "dtype", &v, err));
    snprintf(w, sizeof w, "%s (%s).dtype", what, t->name);
    RW_CHECK(rw_mobj_strcpy(v, w, dt, sizeof dt, err));
    t->dtype = rw_dtype_from_name(dt);
    if (t->dtype == RW_DTYPE_INVALID) RW_FAIL(err, RW_E_DTYPE, "%s: unknown dtype '%s'", w, dt);
    RW_CHECK(rw_mfields_req(&f, "shape", &v, err));
    snprintf(w, sizeof w, "%s (%s).shape", what, t->name);
    size_t nd;
    RW_CHECK(rw_mobj_i64_array(v, w, 1, INT64_C(1) << 40, t->shape, RW_MAX_DIMS, &nd, err));
    if (nd < 1) RW_FAIL(err, RW_E_SHAPE, "%s: empty shape", w);
    t->ndim = (int)nd;
    /* missing-field errors from here on name the tensor */
    rw_mfields fw = f;
    rw_sync_strlcpy(fw.what, t->name, sizeof fw.what);
    RW_CHECK(rw_mfields_req(&fw, "offset", &v, err));
    snprintf(w, sizeof w, "%s.offset", t->name);
    RW_CHECK(rw_mobj_u64(v, w, &t->offset, err));
    RW_CHECK(rw_mfields_req(&fw, "nbytes", &v, err));
    snprintf(w, sizeof w, "%s.nbytes", t->name);
    RW_CHECK(rw_mobj_u64(v, w, &t->nbytes, err));
    const rw_mobj *sh = rw_mfields_get(&fw, "shard");
    if (sh) {
        rw_mfields sf;
        snprintf(w, sizeof w, "%s.shard", t->name);
        RW_CHECK(rw_mfields_init(&sf, sh, w, err));
        int64_t dim, b, l;
        RW_CHECK(rw_mfields_req(&sf, "dim", &v, err));
        RW_CHECK(rw_mobj_i64(v, w, &dim, err));
        RW_CHECK(rw_mfields_req(&sf, "begin", &v, err));
        RW_CHECK(rw_mobj_i64(v, w, &b, err));
        RW_CHECK(rw_mfields_req(&sf, "len", &v, err));
        RW_CHECK(rw_mobj_i64(v, w, &l, err));
        RW_CHECK(rw_mfields_done(&sf, err));
        if (dim < 0 || dim >= t->ndim)
            RW_FAIL(err, RW_E_SHAPE, "%s.dim: %" PRId64 " outside [0, %d)", w, dim, t->ndim);
        t->shard_dim = (int)dim;
        t->shard_begin = b;
        t->shard_len = l;
    }
    char lay[16];
    RW_CHECK(rw_mfields_str(&fw, "layout", "plain", lay, sizeof lay, err));
    if (!strcmp(lay, "plain"))
        t->layout = RW_PIECE_PLAIN;
    else if (!strcmp(lay, "gate_up"))
        t->layout = RW_PIECE_GATE_UP;
    else
        RW_FAIL(err, RW_E_PROTOCOL, "%s.layout: unknown layout '%s' (plain, gate_up)", t->name,
                lay);
    return rw_mfields_done(&fw, err);
}

rw_status rw_sync_manifest_read(const rw_mobj *o, const char *what, rw_sync_manifest *m,
                                rw_err *err) {
    rw_sync_manifest_clear(m);
    rw_mfields f;
    RW_CHECK(rw_mfields_init(&f, o, what, err));
    const rw_mobj *v;
    RW_CHECK(rw_mfields_req(&f, "nbytes", &v, err));
    char w[160];
    snprintf(w, sizeof w, "%s.nbytes", what);
    RW_CHECK(rw_mobj_u64(v, w, &m->bytes, err));
    RW_CHECK(rw_mfields_req(&f, "tensors", &v, err));
    snprintf(w, sizeof w, "%s.tensors", what);
    if (rw_mobj_type(v) != RW_M_ARRAY)
        RW_FAIL(err, RW_E_PROTOCOL, "%s: expected an array, got %s", w,
                rw_mtype_str(rw_mobj_type(v)));
    size_t n = rw_mobj_len(v);
    if (n > RW_SYNC_MAX_TENSORS)
        RW_FAIL(err, RW_E_RANGE, "%s: %zu tensors (limit %d)", w, n, RW_SYNC_MAX_TENSORS);
    RW_CHECK(rw_mfields_done(&f, err));
    for (size_t i = 0; i < n; i++) {
        char wi[160];
        snprintf(wi, sizeof wi, "%s[%zu]", w, i);
        rw_sync_tensor t;
        RW_CHECK(read_tensor(rw_mobj_at(v, i), wi, &t, err));
        RW_CHECK(rw_sync_manifest_push(m, &t, err));
    }
    return rw_sync_manifest_check(m, err);
}

/* ------------------------------------------------------------------------------------------ */
/* Version tags                                                                                 */
/* ------------------------------------------------------------------------------------------ */
rw_status rw_sync_check_version_tag(const char *v, rw_err *err) {
    if (!v || !v[0]) RW_FAIL(err, RW_E_INVALID_ARG, "version: empty tag");
    size_t n = strlen(v);
    if (n > RW_SYNC_MAX_VERSION)
        RW_FAIL(err, RW_E_RANGE, "version: tag of %zu characters (limit %d)", n,
                RW_SYNC_MAX_VERSION);
    for (size_t i = 0; i < n; i++)
        if (v[i] < 0x20 || v[i] > 0x7e)
            RW_FAIL(err, RW_E_INVALID_ARG, "version: character %zu (0x%02x) is not printable ASCII",
                    i, (unsigned char)v[i]);
    return RW_OK;
}
