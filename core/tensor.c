/* tensor.c - tensor views and the weight arena (one allocation, many views). */
#include "rw_core.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>

rw_tensor rw_tensor_view(void *data, rw_dtype dt, int ndim, const int64_t *shape, rw_place place,
                         int device) {
    rw_tensor t;
    memset(&t, 0, sizeof t);
    t.dtype = dt;
    t.ndim = ndim;
    t.data = data;
    t.place = place;
    t.device = device;
    int64_t st = 1;
    for (int i = ndim - 1; i >= 0; i--) {
        t.shape[i] = shape[i];
        t.stride[i] = st;
        st *= shape[i];
    }
    return t;
}

int64_t rw_shape_numel(int ndim, const int64_t *shape) {
    int64_t n = 1;
    for (int i = 0; i < ndim; i++) n *= shape[i];
    return n;
}

int64_t rw_tensor_numel(const rw_tensor *t) { return rw_shape_numel(t->ndim, t->shape); }

size_t rw_tensor_nbytes(const rw_tensor *t) {
    return (size_t)rw_tensor_numel(t) * rw_dtype_size(t->dtype);
}

bool rw_tensor_is_contiguous(const rw_tensor *t) {
    int64_t st = 1;
    for (int i = t->ndim - 1; i >= 0; i--) {
        if (t->shape[i] != 1 && t->stride[i] != st) return false;
        st *= t->shape[i];
    }
    return true;
}

const char *rw_shape_str(int ndim, const int64_t *shape, char *buf, size_t cap) {
    size_t n = 0;
    if (cap == 0) return buf;
    buf[0] = 0;
    n += (size_t)snprintf(buf + n, cap - n, "[");
    for (int i = 0; i < ndim && n < cap; i++)
        n += (size_t)snprintf(buf + n, cap - n, "%s%lld", i ? ", " : "", (long long)shape[i]);
    if (n < cap) snprintf(buf + n, cap - n, "]");
    return buf;
}

/* ------------------------------------------------------------------------------------------ */

/* Device arenas keep their virtual address range across release/resume (device.c maps and
 * unmaps physical memory under it), so every view handed out stays valid after resume. Host
 * arenas are an anonymous mapping: release drops the pages (MADV_DONTNEED), resume touches
 * nothing (pages come back zeroed on first write). */
struct rw_arena {
    rw_place place;
    int device;
    size_t capacity, used;
    void *base;
    bool released;
    void *vmm; /* device.c's handle for a device arena */
};

/* device.c */
rw_status rw_dev_vmm_create(int device, size_t bytes, void **base, void **handle, rw_err *err);
rw_status rw_dev_vmm_release(void *handle, rw_err *err);
rw_status rw_dev_vmm_resume(void *handle, rw_err *err);
void rw_dev_vmm_destroy(void *handle);

rw_status rw_arena_create(rw_place place, int device, size_t capacity, rw_arena **out,
                          rw_err *err) {
    *out = NULL;
    if (capacity == 0) capacity = 256;
    rw_arena *a = calloc(1, sizeof *a);
    if (!a) RW_FAIL(err, RW_E_OOM, "out of memory for arena handle");
    a->place = place;
    a->device = device;
    a->capacity = capacity;
    if (place == RW_PLACE_HOST) {
        void *p = mmap(NULL, capacity, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (p == MAP_FAILED) {
            free(a);
            RW_FAIL(err, RW_E_OOM, "cannot map %zu bytes for a host arena: %s", capacity,
                    strerror(errno));
        }
        a->base = p;
    } else {
        rw_status st = rw_dev_vmm_create(device, capacity, &a->base, &a->vmm, err);
        if (st != RW_OK) {
            free(a);
            return st;
        }
    }
    *out = a;
    return RW_OK;
}

void rw_arena_destroy(rw_arena *a) {
    if (!a) return;
    if (a->place == RW_PLACE_HOST) {
        if (a->base) munmap(a->base, a->capacity);
    } else {
        rw_dev_vmm_destroy(a->vmm);
    }
    free(a);
}

rw_status rw_arena_alloc(rw_arena *a, size_t bytes, size_t align, void **out, rw_err *err) {
    *out = NULL;
    if (align == 0 || (align & (align - 1))) RW_FAIL(err, RW_E_INVALID_ARG, "alignment %zu is not a power of two", align);
    if (a->released) RW_FAIL(err, RW_E_STATE, "arena memory is released");
    size_t off = (a->used + align - 1) & ~(align - 1);
    if (off > a->capacity || bytes > a->capacity - off)
        RW_FAIL(err, RW_E_OOM, "arena full: %zu bytes asked, %zu of %zu used", bytes, a->used,
                a->capacity);
    *out = (char *)a->base + off;
    a->used = off + bytes;
    return RW_OK;
}

rw_status rw_arena_tensor(rw_arena *a, rw_dtype dt, int ndim, const int64_t *shape,
                          rw_tensor *out, rw_err *err) {
    if (ndim < 0 || ndim > RW_MAX_DIMS) RW_FAIL(err, RW_E_INVALID_ARG, "ndim %d out of range", ndim);
    int64_t n = rw_shape_numel(ndim, shape);
    if (n < 0) RW_FAIL(err, RW_E_SHAPE, "negative shape");
    void *p;
    RW_CHECK(rw_arena_alloc(a, (size_t)n * rw_dtype_size(dt), 256, &p, err));
    *out = rw_tensor_view(p, dt, ndim, shape, a->place, a->device);
    return RW_OK;
}

size_t rw_arena_used(const rw_arena *a) { return a->used; }
size_t rw_arena_capacity(const rw_arena *a) { return a->capacity; }
void *rw_arena_base(const rw_arena *a) { return a->base; }
rw_place rw_arena_place(const rw_arena *a) { return a->place; }
bool rw_arena_is_released(const rw_arena *a) { return a->released; }

rw_status rw_arena_release(rw_arena *a, rw_err *err) {
    if (a->released) return RW_OK;
    if (a->place == RW_PLACE_HOST) {
        if (madvise(a->base, a->capacity, MADV_DONTNEED) != 0)
            RW_FAIL(err, RW_E_IO, "madvise(DONTNEED) failed: %s", strerror(errno));
        /* Touching released memory is a bug: make it fault instead of silently reading zeros. */
        if (mprotect(a->base, a->capacity, PROT_NONE) != 0)
            RW_FAIL(err, RW_E_IO, "mprotect failed: %s", strerror(errno));
    } else {
        RW_CHECK(rw_dev_vmm_release(a->vmm, err));
    }
    a->released = true;
    return RW_OK;
}

rw_status rw_arena_resume(rw_arena *a, rw_err *err) {
    if (!a->released) return RW_OK;
    if (a->place == RW_PLACE_HOST) {
        if (mprotect(a->base, a->capacity, PROT_READ | PROT_WRITE) != 0)
            RW_FAIL(err, RW_E_IO, "mprotect failed: %s", strerror(errno));
    } else {
        RW_CHECK(rw_dev_vmm_resume(a->vmm, err));
    }
    a->released = false;
    return RW_OK;
}
