/* sync_internal.h - helpers shared by the sync module's files (not part of the public contract):
 * CUDA / NCCL / ZeroMQ error mapping and small string utilities. */
#ifndef RW_SYNC_INTERNAL_H
#define RW_SYNC_INTERNAL_H

#include "rw_sync.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

/* Maps a failing ZeroMQ call (which returned -1 and set errno) to RW_E_ZMQ, or RW_E_TIMEOUT for
 * EAGAIN. */
#define RW_ZMQ_FAIL(err, what)                                                                     \
    rw_err_set((err), errno == EAGAIN ? RW_E_TIMEOUT : RW_E_ZMQ, __FILE__, __LINE__, "%s: %s",     \
               (what), zmq_strerror(errno))

#ifdef RW_HAVE_CUDA
#include <cuda_runtime.h>
#define RW_CUDA_TRY(err, call)                                                                     \
    do {                                                                                           \
        cudaError_t e_ = (call);                                                                   \
        if (e_ != cudaSuccess)                                                                     \
            return rw_err_set((err), e_ == cudaErrorMemoryAllocation ? RW_E_OOM : RW_E_CUDA,       \
                              __FILE__, __LINE__, "%s: %s", #call, cudaGetErrorString(e_));        \
    } while (0)
#define RW_CUDA_TRYGOTO(err, call, st, label)                                                      \
    do {                                                                                           \
        cudaError_t e_ = (call);                                                                   \
        if (e_ != cudaSuccess) {                                                                   \
            (st) = rw_err_set((err), e_ == cudaErrorMemoryAllocation ? RW_E_OOM : RW_E_CUDA,       \
                              __FILE__, __LINE__, "%s: %s", #call, cudaGetErrorString(e_));        \
            goto label;                                                                            \
        }                                                                                          \
    } while (0)
#endif

/* Copies a NUL-terminated string, truncating to cap - 1. */
static inline void rw_sync_strlcpy(char *dst, const char *src, size_t cap) {
    if (!cap) return;
    size_t n = src ? strlen(src) : 0;
    if (n >= cap) n = cap - 1;
    if (n) memcpy(dst, src, n);
    dst[n] = 0;
}

/* A version tag: 1..RW_SYNC_MAX_VERSION printable ASCII characters. */
rw_status rw_sync_check_version_tag(const char *v, rw_err *err);

/* After a failed update command: aborts the session if it is still open (appending the outcome
 * to err's message); returns st. */
rw_status rw_sync_session_fail(rw_sync_session *s, rw_status st, rw_err *err);

/* The trainer group's own stream (a cudaStream_t) used when callers pass none. */
void *rw_client_group_stream(rw_client_group *g);
void *rw_sync_group_stream(rw_sync_group *g);
/* The worker's quantization config as a checksum reply reports it (strings borrowed from s). */
rw_status rw_client_sums_quant(const rw_client_sums *s, rw_quant_config *q, rw_err *err);

#endif
