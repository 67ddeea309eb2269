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
/* A failing call is reported through rw_status and cleared from the runtime's per-thread last
 * error, so that a later launch check (cudaGetLastError) does not report it as its own. */
#define RW_CUDA_TRY(err, call)                                                                     \
    do {                                                                                           \
        cudaError_t e_ = (call);                                                                   \
        if (e_ != cudaSuccess) {                                                                   \
            cudaGetLastError();                                                                    \
            return rw_err_set((err), e_ == cudaErrorMemoryAllocation ? RW_E_OOM : RW_E_CUDA,       \
                              __FILE__, __LINE__, "%s: %s", #call, cudaGetErrorString(e_));        \
        }                                                                                          \
    } while (0)
#define RW_CUDA_TRYGOTO(err, call, st, label)                                                      \
    do {                                                                                           \
        cudaError_t e_ = (call);                                                                   \
        if (e_ != cudaSuccess) {                                                                   \
            cudaGetLastError();                                                                    \
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

/* Splitting a piece that does not fit a bucket along one dim: how many consecutive indices of
 * `unit` bytes each one piece may hold within `limit` bytes. The most that fit, rounded down to a
 * multiple of 128 when at least 128 fit, so that cuts fall on fp8 block (128) and mxfp8 block
 * (32) boundaries and the worker applies each piece without staging partial blocks. 0 when a
 * single index does not fit. Pieces are cut at multiples of the step (see rw_sync_split_end). */
static inline uint64_t rw_sync_split_step(uint64_t unit, uint64_t limit) {
    if (unit == 0 || unit > limit) return 0;
    uint64_t n = limit / unit;
    return n >= 128 ? n / 128 * 128 : n;
}
/* The end of the piece that starts at index `at` of the range ending at `end`: the next multiple
 * of `step`, or `end`. */
static inline uint64_t rw_sync_split_end(uint64_t at, uint64_t end, uint64_t step) {
    uint64_t e = (at / step + 1) * step;
    return e < end ? e : end;
}

/* A parallel host copy (copier.c): `nthreads` threads including the caller (helper threads
 * that cannot be started are done without), each filling one contiguous share of the range.
 * rw_sync_copier_run copies [src, src + len) to dst; rw_sync_copier_read fills dst[0, len) with
 * bytes [off, off + len) of `src` through src->read_at (pread of a file: several reads in
 * flight), and on failure returns the error of the failed share lowest in the range (the other
 * shares still complete or fail on their own). Both return when every share is done; one caller
 * at a time. */
typedef struct rw_sync_copier rw_sync_copier;
rw_status rw_sync_copier_create(int nthreads, rw_sync_copier **out, rw_err *err);
void rw_sync_copier_destroy(rw_sync_copier *c);
int rw_sync_copier_threads(const rw_sync_copier *c);
void rw_sync_copier_run(rw_sync_copier *c, void *dst, const void *src, size_t len);
rw_status rw_sync_copier_read(rw_sync_copier *c, void *dst, const rw_sync_source *src, uint64_t off,
                              size_t len, rw_err *err);

/* Where an update session's control thread is and what its buckets cost on the host: the
 * benchmark's progress lines and watchdog read it from another thread (rw_sync_session_stats). */
typedef enum rw_sync_phase {
    RW_SYNC_PH_IDLE = 0,
    RW_SYNC_PH_VALIDATE = 1, /* manifest and pieces against the model */
    RW_SYNC_PH_WAIT = 2,     /* for the bucket NFLIGHT before (its record is reused) */
    RW_SYNC_PH_PREPARE = 3,  /* ops and op table on the host */
    RW_SYNC_PH_BUFFERS = 4,  /* growing a record's op table buffers */
    RW_SYNC_PH_RECV = 5,     /* posting the receive (NCCL enqueue / host upload) */
    RW_SYNC_PH_LAUNCH = 6,   /* table copy and kernel launches */
    RW_SYNC_PH_DEFERRED = 7, /* applying a deferred bucket */
    RW_SYNC_PH_COMMIT = 8,   /* commit: waiting for the buckets in flight */
} rw_sync_phase;
const char *rw_sync_phase_str(rw_sync_phase p);

typedef struct rw_sync_sstats {
    rw_sync_phase phase;
    double phase_since;                 /* rw_now() when the phase began */
    uint64_t bucket;                    /* index of the bucket being handled (or last handled) */
    uint64_t buckets, pieces, deferred; /* of the open (or last) session */
    /* host seconds summed over the session's buckets, per phase */
    double validate_s, wait_s, prepare_s, buffers_s, recv_s, launch_s, deferred_s;
    double apply_s;     /* whole rw_sync_session_apply calls */
    double max_apply_s; /* the longest one */
    double commit_wait_s;
} rw_sync_sstats;
/* Thread-safe snapshot. */
void rw_sync_session_stats(rw_sync_session *s, rw_sync_sstats *out);

/* The trainer group's own stream (a cudaStream_t) used when callers pass none. */
void *rw_client_group_stream(rw_client_group *g);
void *rw_sync_group_stream(rw_sync_group *g);
/* The worker's quantization config as a checksum reply reports it (strings borrowed from s). */
rw_status rw_client_sums_quant(const rw_client_sums *s, rw_quant_config *q, rw_err *err);

#endif
