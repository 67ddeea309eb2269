/* sync_internal.h - what the sync module's files share beyond its public headers: the ZeroMQ
 * error mapping, a string copy, the session's failure path, the parallel host copier, and the
 * device pipeline under the update session (pipeline.c). Tests of the module may include it;
 * nothing outside sync does. CUDA and NCCL failures go through core/cuda_check.h. */
#ifndef RW_SYNC_INTERNAL_H
#define RW_SYNC_INTERNAL_H

#include "rw_sync.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#ifdef RW_HAVE_CUDA
#include <cuda_runtime.h>
#endif

/* Maps a failing ZeroMQ call (which returned -1 and set errno) to RW_E_ZMQ, or RW_E_TIMEOUT for
 * EAGAIN. */
#define RW_ZMQ_FAIL(err, what)                                                                     \
    rw_err_set((err), errno == EAGAIN ? RW_E_TIMEOUT : RW_E_ZMQ, __FILE__, __LINE__, "%s: %s",     \
               (what), zmq_strerror(errno))

/* Copies a NUL-terminated string, truncating to cap - 1. */
static inline void rw_sync_strlcpy(char *dst, const char *src, size_t cap) {
    if (!cap) return;
    size_t n = src ? strlen(src) : 0;
    if (n >= cap) n = cap - 1;
    if (n) memcpy(dst, src, n);
    dst[n] = 0;
}

/* The pause of the polling loops that wait for device work, a peer or a reply (20 us). */
static inline void rw_sync_nap(void) {
    struct timespec ts = {0, 20000};
    nanosleep(&ts, NULL);
}

/* The body of a variadic wrapper that maps a library failure with a context of its own: formats
 * `fmt` and the wrapper's arguments after it, then returns fail(err, code, file, line, context)
 * (rw_cuda_fail / rw_nccl_fail of core/cuda_check.h: "<context>: <library error string>"). */
#define RW_SYNC_FAIL_CTX(fail, err, code, file, line, fmt)                                         \
    do {                                                                                           \
        char what_[256];                                                                           \
        va_list ap_;                                                                               \
        va_start(ap_, fmt);                                                                        \
        vsnprintf(what_, sizeof what_, fmt, ap_);                                                  \
        va_end(ap_);                                                                               \
        return fail(err, code, file, line, what_);                                                 \
    } while (0)

#ifdef RW_HAVE_CUDA
/* A failed CUDA call with context of our own, mapped by core/cuda_check.h's rule (RW_E_OOM for a
 * failed allocation, else RW_E_CUDA; the last error cleared). `fmt` formats the context. (nccl.c:
 * CUDA builds only.) */
rw_status rw_sync_cuda_fail(rw_err *err, cudaError_t e, const char *file, int line, const char *fmt,
                            ...);
#endif

/* After a failed update command: aborts the session if it is still open (appending the outcome
 * to err's message); returns st. */
rw_status rw_sync_session_fail(rw_sync_session *s, rw_status st, rw_err *err);
/* Session ownership (session.c, for rw_sync_check_owner): whether the token is checked at all,
 * and whether p[n] is the open session's token (compared in time independent of the bytes). */
bool rw_sync_session_checks_owner(const rw_sync_session *s);
bool rw_sync_session_owner_ok(const rw_sync_session *s, const char *p, size_t n);
/* A decoded value as a jansson value (msg.c; the same rules as rw_mobj_to_json): *out is the
 * caller's (json_decref). */
struct json_t;
rw_status rw_mobj_to_jansson(const rw_mobj *o, struct json_t **out, rw_err *err);
/* rw_sync_session_set_frame_limit's value (0: unknown). */
uint64_t rw_sync_session_frame_limit(const rw_sync_session *s);

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

#endif
