/* nccl.c - the NCCL transport: a weight-update group (trainer = rank 0, worker ranks at their rank
 * offset) on a non-blocking communicator, so that every wait is bounded: init and completion are
 * polled with ncclCommGetAsyncError, and a timeout aborts the communicator (ncclCommAbort ends
 * its kernels) after which the group can be created again. Built only with CUDA; nccl_none.c
 * answers RW_E_NO_DEVICE elsewhere. NVLink SHARP / multicast (NCCL_NVLS_ENABLE) is left as the
 * environment sets it; this code never turns it on.
 *
 * Connections: NCCL connects a communicator's channels at its first collective (runtime
 * connect), and on a non-blocking communicator that happens while the collective is being
 * enqueued, which cannot finish before every rank has issued the same collective. The protocol
 * has a worker post its receive and reply before the trainer broadcasts, so that first enqueue
 * would wait for a broadcast that waits for the reply. Creating the group therefore ends with
 * two broadcasts on every rank, a small one and a bucket-sized one (all ranks are in
 * rw_sync_group_create together anyway): the rings are connected there, under the create
 * timeout (at least FIRST_TIMEOUT_S, as connecting can take seconds), and a later enqueue is
 * local to its rank. */
#include "sync_internal.h"

#include <inttypes.h>
#include <nccl.h>
#include <stdarg.h>
#include <stdlib.h>
#include <time.h>

#include "cuda_check.h" /* after nccl.h: RW_NCCL_CHECK and rw_nccl_fail */

/* Lower bound on the wait for a communicator's first collective (connection setup). */
#define FIRST_TIMEOUT_S 60.0

struct rw_sync_group {
    ncclComm_t comm;
    char name[64];
    int world, rank, device;
    bool ok;
    double timeout_s; /* bound on an enqueue (the create timeout) */
    cudaStream_t own; /* used when a caller passes no stream */
};

/* rw_nccl_fail with a message of our own: "<context>: <NCCL error string>". */
static rw_status nccl_fail_ctx(rw_err *err, ncclResult_t r, int line, const char *fmt, ...) {
    RW_SYNC_FAIL_CTX(rw_nccl_fail, err, r, __FILE__, line, fmt);
}

/* Defined here, in the part of the module the trainer-side library shares (pipeline.c uses it
 * too). */
rw_status rw_sync_cuda_fail(rw_err *err, cudaError_t e, const char *file, int line, const char *fmt,
                            ...) {
    RW_SYNC_FAIL_CTX(rw_cuda_fail, err, e, file, line, fmt);
}

rw_status rw_sync_group_unique_id(uint8_t id[RW_NCCL_ID_BYTES], rw_err *err) {
    ncclUniqueId u;
    _Static_assert(sizeof u == RW_NCCL_ID_BYTES, "ncclUniqueId size");
    ncclResult_t r = ncclGetUniqueId(&u);
    if (r != ncclSuccess) return rw_nccl_fail(err, r, __FILE__, __LINE__, "ncclGetUniqueId");
    memcpy(id, &u, sizeof u);
    return RW_OK;
}

/* Polls a non-blocking communicator until its pending operation settles. */
static rw_status settle(rw_sync_group *g, double deadline, const char *what, rw_err *err) {
    for (;;) {
        ncclResult_t state = ncclSuccess;
        ncclResult_t r = ncclCommGetAsyncError(g->comm, &state);
        if (r != ncclSuccess) state = r;
        if (state == ncclSuccess) return RW_OK;
        if (state != ncclInProgress) {
            rw_sync_group_abort(g);
            return nccl_fail_ctx(err, state, __LINE__, "NCCL group '%s' (rank %d of %d): %s",
                                 g->name, g->rank, g->world, what);
        }
        if (rw_now() > deadline) {
            rw_sync_group_abort(g);
            RW_FAIL(err, RW_E_TIMEOUT,
                    "NCCL group '%s' (rank %d of %d): %s did not finish in time: communicator "
                    "aborted, create the group again",
                    g->name, g->rank, g->world, what);
        }
        rw_sync_nap();
    }
}

/* Waits (bounded) for the work enqueued on `st` so far. */
static rw_status wait_stream(rw_sync_group *g, cudaStream_t st, double timeout_s, rw_err *err);

/* The group's first collectives on every rank: broadcasts from rank 0 of 16 bytes and of
 * WARM_BIG bytes (the protocols and channel counts of small and of bucket-sized broadcasts),
 * enqueued and completed within timeout_s; the bytes are checked. */
#define WARM_BIG (8u << 20)
static rw_status warm_up(rw_sync_group *g, double timeout_s, rw_err *err) {
    const uint8_t magic = 0x5a;
    const size_t sizes[2] = {16, WARM_BIG};
    uint8_t *d = NULL, h[32];
    RW_CUDA_CHECK(err, cudaMalloc((void **)&d, WARM_BIG));
    rw_status st = RW_OK;
    RW_CUDA_CHECKGOTO(err, cudaMemsetAsync(d, g->rank == 0 ? magic : 0, WARM_BIG, g->own), st, out);
    double deadline = rw_now() + timeout_s;
    for (int k = 0; k < 2; k++) {
        ncclResult_t r = ncclBroadcast(d, d, sizes[k], ncclUint8, 0, g->comm, g->own);
        if (r != ncclSuccess && r != ncclInProgress) {
            rw_sync_group_abort(g);
            st =
                nccl_fail_ctx(err, r, __LINE__, "NCCL group '%s' (rank %d of %d): first broadcasts",
                              g->name, g->rank, g->world);
            goto out;
        }
        if (r == ncclInProgress)
            RW_CHECKGOTO(settle(g, deadline, "connecting (first broadcasts)", err), st, out);
    }
    double left = deadline - rw_now();
    RW_CHECKGOTO(wait_stream(g, g->own, left > 0.001 ? left : 0.001, err), st, out);
    RW_CUDA_CHECKGOTO(err, cudaMemcpy(h, d, 16, cudaMemcpyDeviceToHost), st, out);
    RW_CUDA_CHECKGOTO(err, cudaMemcpy(h + 16, d + WARM_BIG - 16, 16, cudaMemcpyDeviceToHost), st,
                      out);
    for (size_t i = 0; i < sizeof h; i++)
        if (h[i] != magic) {
            rw_sync_group_abort(g);
            st = RW_ERR(err, RW_E_NCCL,
                        "NCCL group '%s' (rank %d of %d): a first broadcast delivered wrong "
                        "bytes (0x%02x)",
                        g->name, g->rank, g->world, h[i]);
            goto out;
        }
out:
    cudaFree(d);
    return st;
}

rw_status rw_sync_group_create(const uint8_t id[RW_NCCL_ID_BYTES], int world, int rank,
                               const char *name, int device, double timeout_s, rw_sync_group **out,
                               rw_err *err) {
    *out = NULL;
    if (world < 2 || rank < 0 || rank >= world)
        RW_FAIL(err, RW_E_RANGE, "NCCL group: rank %d of world %d", rank, world);
    if (!name || !name[0] || strlen(name) >= 64)
        RW_FAIL(err, RW_E_INVALID_ARG, "NCCL group: name empty or longer than 63 characters");
    if (timeout_s <= 0) timeout_s = 120;
    RW_CUDA_CHECK(err, cudaSetDevice(device));
    rw_sync_group *g = calloc(1, sizeof *g);
    if (!g) RW_FAIL(err, RW_E_OOM, "NCCL group: out of memory");
    rw_sync_strlcpy(g->name, name, sizeof g->name);
    g->world = world;
    g->rank = rank;
    g->device = device;
    g->timeout_s = timeout_s;
    ncclUniqueId u;
    memcpy(&u, id, sizeof u);
    /* Connect every channel while the group is created, not lazily at a collective's first use:
     * with lazy connection, the first broadcast of a new size/protocol (a 512 MiB bucket after the
     * small warm-up broadcasts) cannot finish its enqueue until the trainer enqueues too, but the
     * worker posts its receive before it replies and the trainer broadcasts only after the reply,
     * so the two would wait on each other. An explicit setting from the environment is kept. */
    setenv("NCCL_RUNTIME_CONNECT", "0", 0);
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = 0;
    ncclResult_t r = ncclCommInitRankConfig(&g->comm, world, u, rank, &cfg);
    if (r != ncclSuccess && r != ncclInProgress) {
        free(g);
        return nccl_fail_ctx(err, r, __LINE__,
                             "NCCL group '%s': ncclCommInitRankConfig (rank %d of %d)", name, rank,
                             world);
    }
    g->ok = true;
    rw_status st = settle(g, rw_now() + timeout_s, "joining", err);
    if (st != RW_OK) {
        rw_sync_group_destroy(g);
        return st;
    }
    cudaError_t ce = cudaStreamCreateWithFlags(&g->own, cudaStreamNonBlocking);
    if (ce != cudaSuccess) {
        rw_sync_group_destroy(g);
        return rw_cuda_fail(err, ce, __FILE__, __LINE__, "NCCL group: cudaStreamCreate");
    }
    st = warm_up(g, timeout_s > FIRST_TIMEOUT_S ? timeout_s : FIRST_TIMEOUT_S, err);
    if (st != RW_OK) {
        rw_sync_group_destroy(g);
        return st;
    }
    *out = g;
    return RW_OK;
}

void rw_sync_group_abort(rw_sync_group *g) {
    if (!g || !g->ok) return;
    g->ok = false;
    cudaSetDevice(g->device);
    ncclCommAbort(g->comm);
    g->comm = NULL;
}

void rw_sync_group_destroy(rw_sync_group *g) {
    if (!g) return;
    /* abort rather than finalize: finalize would wait for peers that may be gone */
    rw_sync_group_abort(g);
    if (g->own) cudaStreamDestroy(g->own);
    free(g);
}

const char *rw_sync_group_name(const rw_sync_group *g) {
    return g->name;
}
int rw_sync_group_rank(const rw_sync_group *g) {
    return g->rank;
}
int rw_sync_group_world(const rw_sync_group *g) {
    return g->world;
}
int rw_sync_group_device(const rw_sync_group *g) {
    return g->device;
}
bool rw_sync_group_ok(const rw_sync_group *g) {
    return g && g->ok;
}
void *rw_sync_group_stream(rw_sync_group *g) {
    return g->own;
}

rw_status rw_sync_group_check(rw_sync_group *g, rw_err *err) {
    if (!g->ok) RW_FAIL(err, RW_E_NCCL, "NCCL group '%s' was aborted", g->name);
    ncclResult_t state = ncclSuccess;
    ncclResult_t r = ncclCommGetAsyncError(g->comm, &state);
    if (r != ncclSuccess) state = r;
    if (state == ncclSuccess || state == ncclInProgress) return RW_OK;
    rw_sync_group_abort(g);
    return nccl_fail_ctx(err, state, __LINE__, "NCCL group '%s' (rank %d): communicator aborted",
                         g->name, g->rank);
}

rw_status rw_sync_group_bcast(rw_sync_group *g, void *buf, uint64_t nbytes, rw_stream s,
                              rw_err *err) {
    if (!g->ok) RW_FAIL(err, RW_E_STATE, "NCCL group '%s' was aborted; create it again", g->name);
    RW_CUDA_CHECK(err, cudaSetDevice(g->device));
    cudaStream_t st = s ? (cudaStream_t)s : g->own;
    ncclResult_t r = ncclBroadcast(buf, buf, (size_t)nbytes, ncclUint8, 0, g->comm, st);
    if (r != ncclSuccess && r != ncclInProgress) {
        rw_sync_group_abort(g);
        return nccl_fail_ctx(err, r, __LINE__,
                             "NCCL group '%s': ncclBroadcast of %" PRIu64 " bytes", g->name,
                             nbytes);
    }
    /* a non-blocking communicator enqueues from a thread of its own; the connections were made
     * when the group was created, so this needs no peer and is short */
    return r == ncclInProgress ? settle(g, rw_now() + g->timeout_s, "enqueuing a broadcast", err)
                               : RW_OK;
}

rw_status rw_sync_group_wait(rw_sync_group *g, rw_stream s, double timeout_s, rw_err *err) {
    RW_CUDA_CHECK(err, cudaSetDevice(g->device));
    return wait_stream(g, s ? (cudaStream_t)s : g->own, timeout_s, err);
}

static rw_status wait_stream(rw_sync_group *g, cudaStream_t st, double timeout_s, rw_err *err) {
    cudaEvent_t ev;
    RW_CUDA_CHECK(err, cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
    cudaError_t ce = cudaEventRecord(ev, st);
    if (ce != cudaSuccess) {
        cudaEventDestroy(ev);
        return rw_cuda_fail(err, ce, __FILE__, __LINE__, "NCCL wait: cudaEventRecord");
    }
    double deadline = rw_now() + (timeout_s > 0 ? timeout_s : 120);
    rw_status ret = RW_OK;
    for (;;) {
        ce = cudaEventQuery(ev);
        if (ce == cudaSuccess) break;
        if (ce != cudaErrorNotReady) {
            ret = rw_sync_cuda_fail(err, ce, __FILE__, __LINE__, "NCCL group '%s': stream failed",
                                    g->name);
            break;
        }
        if (g->ok && (ret = rw_sync_group_check(g, err)) != RW_OK) {
            cudaEventSynchronize(ev);
            break;
        }
        if (rw_now() > deadline) {
            rw_sync_group_abort(g);
            cudaEventSynchronize(ev); /* the abort ends the NCCL kernels */
            ret = RW_ERR(err, RW_E_TIMEOUT,
                         "NCCL group '%s' (rank %d): broadcast did not finish within %.1f s: "
                         "communicator aborted, create the group again",
                         g->name, g->rank, timeout_s);
            break;
        }
        rw_sync_nap();
    }
    cudaEventDestroy(ev);
    return ret;
}

static rw_status nccl_read(rw_sync_source *src, void *dst, rw_place place, uint64_t nbytes,
                           rw_stream s, rw_err *err) {
    if (place != RW_PLACE_DEVICE)
        RW_FAIL(err, RW_E_UNSUPPORTED, "nccl source: the destination must be device memory");
    if (nbytes != src->nbytes)
        RW_FAIL(err, RW_E_SHAPE,
                "nccl source: %" PRIu64 " bytes asked, the broadcast carries %" PRIu64, nbytes,
                src->nbytes);
    return rw_sync_group_bcast(src->ctx, dst, nbytes, s, err);
}

rw_sync_source rw_sync_source_nccl(rw_sync_group *g, uint64_t nbytes) {
    rw_sync_source s = {.kind = RW_SYNC_SRC_NCCL,
                        .name = "nccl",
                        .host = NULL,
                        .nbytes = nbytes,
                        .read = nccl_read,
                        .ctx = g};
    return s;
}
