/* comm_nccl.c - the NCCL tensor-parallel communicator (CUDA builds): all-reduce of fp32 and
 * all-gather of bytes on device buffers, enqueued on the caller's stream. The NCCL communicator
 * is a blocking one (its collectives are captured into the decode graphs); rw_comm_abort ends it
 * from another thread when a rank died: ncclCommAbort sets the abort flag that NCCL's kernels
 * poll, so kernels waiting for the dead rank return and a stream wait on them ends. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cuda_runtime_api.h>
#include <nccl.h>

#include "cuda_check.h" /* after nccl.h: RW_NCCL_CHECK */
#include "internal.h"

_Static_assert(sizeof(ncclUniqueId) == RW_NCCL_ID_BYTES, "NCCL unique id size");

rw_status rw_comm_nccl_unique_id(uint8_t id[RW_NCCL_ID_BYTES], rw_err *err) {
    ncclUniqueId u;
    RW_NCCL_CHECK(err, ncclGetUniqueId(&u));
    memcpy(id, &u, sizeof u);
    return RW_OK;
}

typedef struct nccl_comm {
    ncclComm_t nc;
    int device;
    /* held while a collective is enqueued, and by an abort while it frees the NCCL communicator,
     * so that no enqueue runs on a freed one */
    pthread_mutex_t mu;
    atomic_bool aborted;    /* set first by an abort: later collectives fail at once */
    atomic_bool abort_done; /* set last by an abort: it no longer touches this struct */
} nccl_comm;

static rw_status aborted_err(const char *what, rw_err *err) {
    RW_FAIL(err, RW_E_NCCL,
            "%s: the tensor-parallel communicator was aborted (a rank died or the worker is "
            "stopping)",
            what);
}

static rw_status nccl_allreduce(rw_comm *c, float *buf, size_t n, rw_stream s, rw_err *err) {
    nccl_comm *k = c->impl;
    if (atomic_load(&k->aborted)) return aborted_err("all-reduce", err);
    pthread_mutex_lock(&k->mu);
    const bool ab = atomic_load(&k->aborted);
    ncclResult_t r = ncclSuccess;
    if (!ab) r = ncclAllReduce(buf, buf, n, ncclFloat32, ncclSum, k->nc, (cudaStream_t)s);
    pthread_mutex_unlock(&k->mu);
    if (ab) return aborted_err("all-reduce", err);
    if (r != ncclSuccess) return rw_nccl_fail(err, r, __FILE__, __LINE__, "ncclAllReduce");
    return RW_OK;
}

static rw_status nccl_allgather(rw_comm *c, const void *send, void *recv, size_t bytes, rw_stream s,
                                rw_err *err) {
    nccl_comm *k = c->impl;
    if (atomic_load(&k->aborted)) return aborted_err("all-gather", err);
    pthread_mutex_lock(&k->mu);
    const bool ab = atomic_load(&k->aborted);
    ncclResult_t r = ncclSuccess;
    if (!ab) r = ncclAllGather(send, recv, bytes, ncclUint8, k->nc, (cudaStream_t)s);
    pthread_mutex_unlock(&k->mu);
    if (ab) return aborted_err("all-gather", err);
    if (r != ncclSuccess) return rw_nccl_fail(err, r, __FILE__, __LINE__, "ncclAllGather");
    return RW_OK;
}

static void nccl_abort(rw_comm *c) {
    nccl_comm *k = c->impl;
    if (!k || atomic_exchange(&k->aborted, true)) return;
    /* an enqueue in progress is host work that returns at once, unless it waits for room in
     * NCCL's queue behind a kernel stuck on the dead rank, which only the abort flag ends: the
     * wait for the lock is bounded and the abort goes ahead without it after that */
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_sec += 2;
    const bool locked = pthread_mutex_timedlock(&k->mu, &ts) == 0;
    if (!locked) RW_LOGW("NCCL abort: a collective is still being enqueued; aborting regardless");
    cudaSetDevice(k->device);
    ncclResult_t r = ncclCommAbort(k->nc);
    if (r != ncclSuccess) RW_LOGW("ncclCommAbort: %s", ncclGetErrorString(r));
    (void)cudaGetLastError();
    if (locked) pthread_mutex_unlock(&k->mu);
    atomic_store(&k->abort_done, true);
}

static void nccl_destroy(rw_comm *c) {
    nccl_comm *k = c->impl;
    if (!k) return;
    if (atomic_load(&k->aborted)) {
        /* the NCCL communicator is gone; an abort running on another thread may still use the
         * struct: wait for it, bounded, and leave the struct allocated if it does not finish */
        const double end = rw_now() + 10;
        while (!atomic_load(&k->abort_done) && rw_now() < end) {
            struct timespec ts = {0, 1000000};
            nanosleep(&ts, NULL);
        }
        if (!atomic_load(&k->abort_done)) {
            RW_LOGW("NCCL abort did not finish; its state is left allocated");
            return;
        }
    } else {
        ncclCommDestroy(k->nc);
    }
    pthread_mutex_destroy(&k->mu);
    free(k);
}

rw_status rw_comm_create_nccl(const uint8_t id[RW_NCCL_ID_BYTES], int size, int rank, int device,
                              rw_comm **out, rw_err *err) {
    if (size < 1 || rank < 0 || rank >= size)
        RW_FAIL(err, RW_E_RANGE, "NCCL communicator: rank %d of %d", rank, size);
    RW_CHECK(rw_cuda_set_device(device, err));
    ncclUniqueId u;
    memcpy(&u, id, sizeof u);
    ncclComm_t nc = NULL;
    RW_NCCL_CHECK(err, ncclCommInitRank(&nc, size, u, rank));
    rw_comm *c = calloc(1, sizeof *c);
    nccl_comm *k = calloc(1, sizeof *k);
    if (!c || !k || pthread_mutex_init(&k->mu, NULL) != 0) {
        free(c);
        free(k);
        ncclCommDestroy(nc);
        RW_FAIL(err, RW_E_OOM, "communicator");
    }
    k->nc = nc;
    k->device = device;
    atomic_init(&k->aborted, false);
    atomic_init(&k->abort_done, false);
    c->rank = rank;
    c->size = size;
    c->allreduce_f32 = nccl_allreduce;
    c->allgather = nccl_allgather;
    c->destroy = nccl_destroy;
    c->abort = nccl_abort;
    c->impl = k;
    *out = c;
    return RW_OK;
}
