/* comm_nccl.c - the NCCL tensor-parallel communicator (CUDA builds): all-reduce of fp32 and
 * all-gather of bytes on device buffers, enqueued on the caller's stream. */
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>
#include <nccl.h>

#include "internal.h"

#define NCCL_TRY(expr, err)                                                                        \
    do {                                                                                           \
        ncclResult_t r_ = (expr);                                                                  \
        if (r_ != ncclSuccess) RW_FAIL(err, RW_E_NCCL, "%s: %s", #expr, ncclGetErrorString(r_));   \
    } while (0)

_Static_assert(sizeof(ncclUniqueId) == RW_NCCL_ID_BYTES, "NCCL unique id size");

rw_status rw_comm_nccl_unique_id(uint8_t id[RW_NCCL_ID_BYTES], rw_err *err) {
    ncclUniqueId u;
    NCCL_TRY(ncclGetUniqueId(&u), err);
    memcpy(id, &u, sizeof u);
    return RW_OK;
}

static rw_status nccl_allreduce(rw_comm *c, float *buf, size_t n, rw_stream s, rw_err *err) {
    NCCL_TRY(ncclAllReduce(buf, buf, n, ncclFloat32, ncclSum, (ncclComm_t)c->impl, (cudaStream_t)s),
             err);
    return RW_OK;
}

static rw_status nccl_allgather(rw_comm *c, const void *send, void *recv, size_t bytes, rw_stream s,
                                rw_err *err) {
    NCCL_TRY(ncclAllGather(send, recv, bytes, ncclUint8, (ncclComm_t)c->impl, (cudaStream_t)s),
             err);
    return RW_OK;
}

static void nccl_destroy(rw_comm *c) {
    if (c->impl) ncclCommDestroy((ncclComm_t)c->impl);
}

rw_status rw_comm_create_nccl(const uint8_t id[RW_NCCL_ID_BYTES], int size, int rank, int device,
                              rw_comm **out, rw_err *err) {
    if (size < 1 || rank < 0 || rank >= size)
        RW_FAIL(err, RW_E_RANGE, "NCCL communicator: rank %d of %d", rank, size);
    RW_CHECK(rw_cuda_set_device(device, err));
    ncclUniqueId u;
    memcpy(&u, id, sizeof u);
    ncclComm_t nc = NULL;
    NCCL_TRY(ncclCommInitRank(&nc, size, u, rank), err);
    rw_comm *c = calloc(1, sizeof *c);
    if (!c) {
        ncclCommDestroy(nc);
        RW_FAIL(err, RW_E_OOM, "communicator");
    }
    c->rank = rank;
    c->size = size;
    c->allreduce_f32 = nccl_allreduce;
    c->allgather = nccl_allgather;
    c->destroy = nccl_destroy;
    c->impl = nc;
    *out = c;
    return RW_OK;
}
