/* comm.c - tensor-parallel communicators: the single-rank one and an in-process thread group
 * (one thread per rank, for CPU tensor parallelism in tests and demos). The NCCL one is in
 * comm_nccl.c. Collectives go through the function pointers of struct rw_comm (internal.h). */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

#ifdef RW_HAVE_CUDA
#include "cuda_check.h"
#endif

int rw_comm_rank(const rw_comm *c) {
    return c ? c->rank : 0;
}
int rw_comm_size(const rw_comm *c) {
    return c ? c->size : 1;
}

void rw_comm_destroy(rw_comm *c) {
    if (!c) return;
    if (c->destroy) c->destroy(c);
    free(c);
}

void rw_comm_abort(rw_comm *c) {
    if (c && c->abort) c->abort(c);
}

rw_status rw_comm_allreduce_f32(rw_comm *c, float *buf, size_t n, rw_stream s, rw_err *err) {
    if (!c) RW_FAIL(err, RW_E_INVALID_ARG, "allreduce: NULL communicator");
    if (n == 0) return RW_OK;
    if (!buf) RW_FAIL(err, RW_E_INVALID_ARG, "allreduce: NULL buffer of %zu floats", n);
    return c->allreduce_f32(c, buf, n, s, err);
}

rw_status rw_comm_allgather(rw_comm *c, const void *send, void *recv, size_t bytes, rw_stream s,
                            rw_err *err) {
    if (!c) RW_FAIL(err, RW_E_INVALID_ARG, "allgather: NULL communicator");
    if (bytes == 0) return RW_OK;
    if (!send || !recv) RW_FAIL(err, RW_E_INVALID_ARG, "allgather: NULL buffer");
    return c->allgather(c, send, recv, bytes, s, err);
}

/* --- single rank ------------------------------------------------------------------------- */
static rw_status single_allreduce(rw_comm *c, float *buf, size_t n, rw_stream s, rw_err *err) {
    return RW_OK; /* the sum over one rank is the buffer itself */
}

static rw_status single_allgather(rw_comm *c, const void *send, void *recv, size_t bytes,
                                  rw_stream s, rw_err *err) {
    if (send == recv) return RW_OK;
#ifdef RW_HAVE_CUDA
    /* unified addressing: the same call copies host or device buffers */
    struct cudaPointerAttributes a;
    if (cudaPointerGetAttributes(&a, send) == cudaSuccess && a.type == cudaMemoryTypeDevice) {
        RW_CUDA_CHECK(err, cudaMemcpyAsync(recv, send, bytes, cudaMemcpyDefault, (cudaStream_t)s));
        return RW_OK;
    }
    (void)cudaGetLastError();
#endif
    memcpy(recv, send, bytes);
    return RW_OK;
}

rw_status rw_comm_create_single(rw_comm **out, rw_err *err) {
    rw_comm *c = calloc(1, sizeof *c);
    if (!c) RW_FAIL(err, RW_E_OOM, "communicator");
    c->rank = 0;
    c->size = 1;
    c->allreduce_f32 = single_allreduce;
    c->allgather = single_allgather;
    *out = c;
    return RW_OK;
}

/* --- thread group ------------------------------------------------------------------------ */
#define MAX_THREAD_RANKS 64

struct rw_comm_group {
    int size;
    pthread_barrier_t bar;
    const void *ptr[MAX_THREAD_RANKS]; /* each rank's published buffer for the current call */
    size_t n[MAX_THREAD_RANKS];        /* each rank's element / byte count, checked equal */
};

rw_status rw_comm_group_create(int size, rw_comm_group **out, rw_err *err) {
    if (size < 1 || size > MAX_THREAD_RANKS)
        RW_FAIL(err, RW_E_RANGE, "thread group size %d outside 1..%d", size, MAX_THREAD_RANKS);
    rw_comm_group *g = calloc(1, sizeof *g);
    if (!g) RW_FAIL(err, RW_E_OOM, "thread group");
    g->size = size;
    if (pthread_barrier_init(&g->bar, NULL, (unsigned)size) != 0) {
        free(g);
        RW_FAIL(err, RW_E_INTERNAL, "pthread_barrier_init failed");
    }
    *out = g;
    return RW_OK;
}

void rw_comm_group_destroy(rw_comm_group *g) {
    if (!g) return;
    pthread_barrier_destroy(&g->bar);
    free(g);
}

/* Publishes (ptr, n), waits for every rank, and checks every rank passed the same n (all ranks
 * see the same array, so they all agree on the verdict). */
static bool thread_publish(rw_comm_group *g, int rank, const void *ptr, size_t n) {
    g->ptr[rank] = ptr;
    g->n[rank] = n;
    pthread_barrier_wait(&g->bar);
    for (int r = 0; r < g->size; r++)
        if (g->n[r] != n) return false;
    return true;
}

static rw_status thread_allreduce(rw_comm *c, float *buf, size_t n, rw_stream s, rw_err *err) {
    rw_comm_group *g = c->impl;
    float *sum = malloc(n * sizeof(float));
    /* every rank must reach both barriers even when something failed, or the others hang */
    bool same = thread_publish(g, c->rank, buf, n);
    if (same && sum) {
        /* rank order is fixed, so every rank computes the same bits */
        memcpy(sum, g->ptr[0], n * sizeof(float));
        for (int r = 1; r < g->size; r++) {
            const float *p = g->ptr[r];
            for (size_t i = 0; i < n; i++)
                sum[i] += p[i];
        }
    }
    pthread_barrier_wait(&g->bar);
    if (same && sum) memcpy(buf, sum, n * sizeof(float));
    free(sum);
    if (!same) RW_FAIL(err, RW_E_INVALID_ARG, "allreduce: ranks passed different sizes");
    if (!sum) RW_FAIL(err, RW_E_OOM, "allreduce scratch of %zu floats", n);
    return RW_OK;
}

static rw_status thread_allgather(rw_comm *c, const void *send, void *recv, size_t bytes,
                                  rw_stream s, rw_err *err) {
    rw_comm_group *g = c->impl;
    bool same = thread_publish(g, c->rank, send, bytes);
    if (same)
        for (int r = 0; r < g->size; r++)
            memcpy((uint8_t *)recv + (size_t)r * bytes, g->ptr[r], bytes);
    pthread_barrier_wait(&g->bar);
    if (!same) RW_FAIL(err, RW_E_INVALID_ARG, "allgather: ranks passed different sizes");
    return RW_OK;
}

rw_status rw_comm_create_thread(rw_comm_group *g, int rank, rw_comm **out, rw_err *err) {
    if (!g) RW_FAIL(err, RW_E_INVALID_ARG, "thread communicator: NULL group");
    if (rank < 0 || rank >= g->size)
        RW_FAIL(err, RW_E_RANGE, "thread communicator: rank %d outside 0..%d", rank, g->size - 1);
    rw_comm *c = calloc(1, sizeof *c);
    if (!c) RW_FAIL(err, RW_E_OOM, "communicator");
    c->rank = rank;
    c->size = g->size;
    c->allreduce_f32 = thread_allreduce;
    c->allgather = thread_allgather;
    c->impl = g;
    *out = c;
    return RW_OK;
}

#ifndef RW_HAVE_CUDA
rw_status rw_comm_nccl_unique_id(uint8_t id[RW_NCCL_ID_BYTES], rw_err *err) {
    RW_FAIL(err, RW_E_NO_DEVICE, "NCCL communicator: built without CUDA");
}
rw_status rw_comm_create_nccl(const uint8_t id[RW_NCCL_ID_BYTES], int size, int rank, int device,
                              rw_comm **out, rw_err *err) {
    RW_FAIL(err, RW_E_NO_DEVICE, "NCCL communicator: built without CUDA");
}
#endif
