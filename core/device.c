/* device.c - CUDA runtime helpers and the device arena's stable virtual range. Every function
 * exists in every build; without CUDA they report RW_E_NO_DEVICE. */
#include "rw_core.h"

#include <stdio.h>
#include <stdlib.h>

void rw_cuda_load_modules_eagerly(void) { setenv("CUDA_MODULE_LOADING", "EAGER", 0); }

#ifdef RW_HAVE_CUDA
#include <cuda.h>
#include <cuda_runtime.h>

/* Failing runtime calls go through cuda_check.h: RW_E_OOM for a failed allocation, RW_E_CUDA
 * otherwise, and the per-thread last error cleared, so that a later, unrelated launch check
 * (cudaGetLastError) does not report it again as its own. */
#include "cuda_check.h"

bool rw_cuda_built(void) { return true; }

int rw_cuda_device_count(void) {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        cudaGetLastError();
        return 0;
    }
    return n;
}

rw_status rw_cuda_set_device(int dev, rw_err *err) {
    RW_CUDA_CHECK(err, cudaSetDevice(dev));
    return RW_OK;
}

rw_status rw_cuda_sm_count(int *sms, rw_err *err) {
    int dev = 0;
    *sms = 0;
    RW_CUDA_CHECK(err, cudaGetDevice(&dev));
    RW_CUDA_CHECK(err, cudaDeviceGetAttribute(sms, cudaDevAttrMultiProcessorCount, dev));
    return RW_OK;
}

/* Device (or pinned host) memory; a failure through rw_cuda_fail (RW_E_OOM when out of memory). */
static rw_status cuda_alloc(bool pinned, size_t bytes, void **out, rw_err *err) {
    *out = NULL;
    const cudaError_t e =
        pinned ? cudaMallocHost(out, bytes ? bytes : 1) : cudaMalloc(out, bytes ? bytes : 1);
    if (e != cudaSuccess) {
        char what[64];
        snprintf(what, sizeof what, "%s(%zu bytes)", pinned ? "cudaMallocHost" : "cudaMalloc",
                 bytes);
        return rw_cuda_fail(err, e, __FILE__, __LINE__, what);
    }
    return RW_OK;
}

rw_status rw_dev_malloc(size_t bytes, void **out, rw_err *err) {
    return cuda_alloc(false, bytes, out, err);
}

void rw_dev_free(void *p) {
    if (p) cudaFree(p);
}

rw_status rw_host_malloc_pinned(size_t bytes, void **out, rw_err *err) {
    return cuda_alloc(true, bytes, out, err);
}

void rw_host_free_pinned(void *p) {
    if (p) cudaFreeHost(p);
}

/* The device that owns device memory at p, or -1 (not device memory, or unknown). */
static int owner_device(const void *p) {
    struct cudaPointerAttributes a;
    if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
        cudaGetLastError();
        return -1;
    }
    return a.type == cudaMemoryTypeDevice ? a.device : -1;
}

rw_status rw_memcpy(void *dst, rw_place dplace, const void *src, rw_place splace, size_t bytes,
                    rw_stream s, rw_err *err) {
    if (bytes == 0) return RW_OK;
    if (dplace == RW_PLACE_HOST && splace == RW_PLACE_HOST) {
        memcpy(dst, src, bytes);
        return RW_OK;
    }
    /* the kind follows from the places: nothing is inferred from the pointers */
    enum cudaMemcpyKind k = dplace == RW_PLACE_HOST   ? cudaMemcpyDeviceToHost
                            : splace == RW_PLACE_HOST ? cudaMemcpyHostToDevice
                                                      : cudaMemcpyDeviceToDevice;
    if (!s) {
        /* The default stream is the current device's, and a copy on it runs in that device's
         * context. A device arena (rw_dev_vmm_create: mapped with access for its own device
         * only) cannot be reached from another device's context (cudaErrorInvalidValue), so the
         * copy runs with the owning device current. It completes before the caller's device is
         * made current again: a later sync of the default stream would be the caller's
         * device's, which does not cover this copy. */
        int cur = 0;
        int own = owner_device(dplace == RW_PLACE_DEVICE ? dst : src);
        RW_CUDA_CHECK(err, cudaGetDevice(&cur));
        if (own >= 0 && own != cur) {
            cudaError_t e = cudaSetDevice(own);
            if (e == cudaSuccess) e = cudaMemcpyAsync(dst, src, bytes, k, 0);
            if (e == cudaSuccess) e = cudaStreamSynchronize(0);
            cudaError_t e2 = cudaSetDevice(cur);
            if (e == cudaSuccess) e = e2;
            if (e != cudaSuccess) {
                char what[96];
                snprintf(what, sizeof what, "cudaMemcpyAsync of %zu bytes on device %d", bytes, own);
                return rw_cuda_fail(err, e, __FILE__, __LINE__, what);
            }
            return RW_OK;
        }
    }
    RW_CUDA_CHECK(err, cudaMemcpyAsync(dst, src, bytes, k, (cudaStream_t)s));
    return RW_OK;
}

rw_status rw_stream_create(rw_stream *out, rw_err *err) {
    cudaStream_t s;
    RW_CUDA_CHECK(err, cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    *out = (rw_stream)s;
    return RW_OK;
}

void rw_stream_destroy(rw_stream s) {
    if (s) cudaStreamDestroy((cudaStream_t)s);
}

rw_status rw_stream_sync(rw_stream s, rw_err *err) {
    RW_CUDA_CHECK(err, cudaStreamSynchronize((cudaStream_t)s));
    return RW_OK;
}

rw_status rw_cuda_after_launch(rw_stream s, const char *what, const char *file, int line,
                               rw_err *err) {
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess)
        return rw_err_set(err, RW_E_CUDA, file, line, "launch of %s failed: %s", what,
                          cudaGetErrorString(e));
    const char *sync = getenv("RW_CUDA_SYNC");
    if (sync && sync[0] == '1') {
        e = cudaStreamSynchronize((cudaStream_t)s);
        if (e != cudaSuccess)
            return rw_err_set(err, RW_E_CUDA, file, line, "%s failed: %s", what,
                              cudaGetErrorString(e));
    }
    return RW_OK;
}

/* --- stable virtual range for device arenas (driver VMM API through the runtime's entry point
 * lookup, so nothing links libcuda directly) ------------------------------------------------ */
typedef struct vmm {
    int device;
    size_t size; /* rounded to granularity */
    CUdeviceptr base;
    CUmemGenericAllocationHandle h;
    bool mapped;
    CUresult (*reserve)(CUdeviceptr *, size_t, size_t, CUdeviceptr, unsigned long long);
    CUresult (*addr_free)(CUdeviceptr, size_t);
    CUresult (*create)(CUmemGenericAllocationHandle *, size_t, const CUmemAllocationProp *,
                       unsigned long long);
    CUresult (*release)(CUmemGenericAllocationHandle);
    CUresult (*map)(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle, unsigned long long);
    CUresult (*unmap)(CUdeviceptr, size_t);
    CUresult (*set_access)(CUdeviceptr, size_t, const CUmemAccessDesc *, size_t);
    CUresult (*granularity)(size_t *, const CUmemAllocationProp *,
                            CUmemAllocationGranularity_flags);
} vmm;

static rw_status vmm_sym(const char *name, void **fn, rw_err *err) {
    enum cudaDriverEntryPointQueryResult q;
    cudaError_t e = cudaGetDriverEntryPointByVersion(name, fn, 12000, cudaEnableDefault, &q);
    if (e != cudaSuccess || q != cudaDriverEntryPointSuccess || !*fn)
        RW_FAIL(err, RW_E_CUDA, "driver entry point %s not available", name);
    return RW_OK;
}

static rw_status vmm_map(vmm *v, rw_err *err) {
    CUmemAllocationProp prop;
    memset(&prop, 0, sizeof prop);
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = v->device;
    CUresult r = v->create(&v->h, v->size, &prop, 0);
    if (r != CUDA_SUCCESS)
        RW_FAIL(err, r == CUDA_ERROR_OUT_OF_MEMORY ? RW_E_OOM : RW_E_CUDA,
                "cuMemCreate(%zu bytes) failed (%d)", v->size, (int)r);
    r = v->map(v->base, v->size, 0, v->h, 0);
    if (r != CUDA_SUCCESS) {
        v->release(v->h);
        RW_FAIL(err, RW_E_CUDA, "cuMemMap failed (%d)", (int)r);
    }
    CUmemAccessDesc acc;
    memset(&acc, 0, sizeof acc);
    acc.location = prop.location;
    acc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    r = v->set_access(v->base, v->size, &acc, 1);
    if (r != CUDA_SUCCESS) {
        v->unmap(v->base, v->size);
        v->release(v->h);
        RW_FAIL(err, RW_E_CUDA, "cuMemSetAccess failed (%d)", (int)r);
    }
    RW_CUDA_CHECK(err, cudaMemset((void *)v->base, 0, v->size));
    RW_CUDA_CHECK(err, cudaDeviceSynchronize());
    v->mapped = true;
    return RW_OK;
}

static rw_status rw_dev_vmm_create_current(int device, size_t bytes, void **base, void **handle,
                                           rw_err *err);

rw_status rw_dev_vmm_create(int device, size_t bytes, void **base, void **handle, rw_err *err) {
    /* The driver calls below act on the current context: make `device`'s primary context
     * current (cudaFree(0) creates it) and restore the caller's device afterwards. */
    int prev = 0;
    RW_CUDA_CHECK(err, cudaGetDevice(&prev));
    RW_CUDA_CHECK(err, cudaSetDevice(device));
    RW_CUDA_CHECK(err, cudaFree(0));
    rw_status st = rw_dev_vmm_create_current(device, bytes, base, handle, err);
    cudaSetDevice(prev);
    return st;
}

static rw_status rw_dev_vmm_create_current(int device, size_t bytes, void **base, void **handle,
                                           rw_err *err) {
    vmm *v = calloc(1, sizeof *v);
    if (!v) RW_FAIL(err, RW_E_OOM, "out of memory");
    v->device = device;
    rw_status st = RW_OK;
    RW_CHECKGOTO(vmm_sym("cuMemAddressReserve", (void **)&v->reserve, err), st, fail);
    RW_CHECKGOTO(vmm_sym("cuMemAddressFree", (void **)&v->addr_free, err), st, fail);
    RW_CHECKGOTO(vmm_sym("cuMemCreate", (void **)&v->create, err), st, fail);
    RW_CHECKGOTO(vmm_sym("cuMemRelease", (void **)&v->release, err), st, fail);
    RW_CHECKGOTO(vmm_sym("cuMemMap", (void **)&v->map, err), st, fail);
    RW_CHECKGOTO(vmm_sym("cuMemUnmap", (void **)&v->unmap, err), st, fail);
    RW_CHECKGOTO(vmm_sym("cuMemSetAccess", (void **)&v->set_access, err), st, fail);
    RW_CHECKGOTO(vmm_sym("cuMemGetAllocationGranularity", (void **)&v->granularity, err), st, fail);
    {
        CUmemAllocationProp prop;
        memset(&prop, 0, sizeof prop);
        prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
        prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
        prop.location.id = device;
        size_t g = 0;
        if (v->granularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED) != CUDA_SUCCESS || !g)
            g = 2u << 20;
        v->size = (bytes + g - 1) / g * g;
        if (v->reserve(&v->base, v->size, 0, 0, 0) != CUDA_SUCCESS) {
            st = RW_ERR(err, RW_E_OOM, "cannot reserve %zu bytes of device address space",
                        v->size);
            goto fail;
        }
        st = vmm_map(v, err);
        if (st != RW_OK) {
            v->addr_free(v->base, v->size);
            goto fail;
        }
    }
    *base = (void *)v->base;
    *handle = v;
    return RW_OK;
fail:
    free(v);
    return st;
}

rw_status rw_dev_vmm_release(void *handle, rw_err *err) {
    vmm *v = handle;
    if (!v->mapped) return RW_OK;
    RW_CUDA_CHECK(err, cudaDeviceSynchronize());
    if (v->unmap(v->base, v->size) != CUDA_SUCCESS) RW_FAIL(err, RW_E_CUDA, "cuMemUnmap failed");
    v->release(v->h);
    v->mapped = false;
    return RW_OK;
}

rw_status rw_dev_vmm_resume(void *handle, rw_err *err) {
    vmm *v = handle;
    if (v->mapped) return RW_OK;
    return vmm_map(v, err);
}

void rw_dev_vmm_destroy(void *handle) {
    vmm *v = handle;
    if (!v) return;
    if (v->mapped) {
        cudaDeviceSynchronize();
        v->unmap(v->base, v->size);
        v->release(v->h);
    }
    v->addr_free(v->base, v->size);
    free(v);
}

#else /* no CUDA */

bool rw_cuda_built(void) { return false; }
int rw_cuda_device_count(void) { return 0; }
rw_status rw_cuda_set_device(int dev, rw_err *err) {
    RW_FAIL(err, RW_E_NO_DEVICE, "built without CUDA (device %d asked)", dev);
}
rw_status rw_cuda_sm_count(int *sms, rw_err *err) {
    *sms = 0;
    RW_FAIL(err, RW_E_NO_DEVICE, "built without CUDA (multiprocessor count asked)");
}
rw_status rw_dev_malloc(size_t bytes, void **out, rw_err *err) {
    *out = NULL;
    RW_FAIL(err, RW_E_NO_DEVICE, "built without CUDA (device allocation of %zu bytes)", bytes);
}
void rw_dev_free(void *p) { (void)p; }
rw_status rw_host_malloc_pinned(size_t bytes, void **out, rw_err *err) {
    *out = malloc(bytes ? bytes : 1);
    if (!*out) RW_FAIL(err, RW_E_OOM, "out of memory (%zu bytes)", bytes);
    return RW_OK;
}
void rw_host_free_pinned(void *p) { free(p); }
rw_status rw_memcpy(void *dst, rw_place dplace, const void *src, rw_place splace, size_t bytes,
                    rw_stream s, rw_err *err) {
    (void)s;
    if (dplace != RW_PLACE_HOST || splace != RW_PLACE_HOST)
        RW_FAIL(err, RW_E_NO_DEVICE, "built without CUDA: device copy");
    if (bytes) memcpy(dst, src, bytes);
    return RW_OK;
}
rw_status rw_stream_create(rw_stream *out, rw_err *err) {
    *out = NULL;
    (void)err;
    return RW_OK;
}
void rw_stream_destroy(rw_stream s) { (void)s; }
rw_status rw_stream_sync(rw_stream s, rw_err *err) {
    (void)s;
    (void)err;
    return RW_OK;
}
rw_status rw_cuda_after_launch(rw_stream s, const char *what, const char *file, int line,
                               rw_err *err) {
    (void)s;
    return rw_err_set(err, RW_E_NO_DEVICE, file, line, "built without CUDA: %s", what);
}
rw_status rw_dev_vmm_create(int device, size_t bytes, void **base, void **handle, rw_err *err) {
    *base = NULL;
    *handle = NULL;
    RW_FAIL(err, RW_E_NO_DEVICE, "built without CUDA: device arena of %zu bytes on %d", bytes,
            device);
}
rw_status rw_dev_vmm_release(void *handle, rw_err *err) {
    (void)handle;
    RW_FAIL(err, RW_E_NO_DEVICE, "built without CUDA");
}
rw_status rw_dev_vmm_resume(void *handle, rw_err *err) {
    (void)handle;
    RW_FAIL(err, RW_E_NO_DEVICE, "built without CUDA");
}
void rw_dev_vmm_destroy(void *handle) { (void)handle; }

#endif
