/* session_internal.h - the update session's state, shared by its three files: session.c (the
 * state machine and its invariants), pipeline.c (device staging, bucket records in flight, the
 * host -> device upload) and disk.c (checkpoints cut into buckets). Not part of any contract;
 * tests of the module may include it to reach the pipeline directly. */
#ifndef RW_SYNC_SESSION_INTERNAL_H
#define RW_SYNC_SESSION_INTERNAL_H

#include "sync_internal.h"

#include <pthread.h>

#ifdef RW_HAVE_CUDA
#include <cuda_runtime.h>
#endif

/* Pinned chunks between a host source and device staging: RW_SYNC_UP_NBUF of RW_SYNC_UP_CHUNK
 * bytes (the environment variable RW_SYNC_PIN_CHUNK sets another size, at least 4096 bytes:
 * tests use small chunks to run many through the pipeline). */
#define RW_SYNC_UP_CHUNK (32u << 20)
#define RW_SYNC_UP_NBUF 3
/* Bucket records in flight on a device set (>= 2: the staging buffers alternate). */
#define RW_SYNC_NFLIGHT 4

/* One bucket in flight: its op table (pinned image, device copy) and its events. */
typedef struct rw_sync_flight {
    bool busy;     /* enqueued: its receive or apply may still run */
    bool deferred; /* receive posted, apply not yet launched (done not recorded) */
    bool nccl;     /* its receive is an NCCL broadcast (a hung peer can stall it) */
    double t0;     /* when it was enqueued */
    uint64_t index;
    void *htab, *dtab; /* pinned host / device op table of tab_cap bytes each */
    size_t tab_cap;
#ifdef RW_HAVE_CUDA
    cudaEvent_t recvd, done;
#endif
} rw_sync_flight;

struct rw_sync_session {
    rw_wset *ws;
    rw_place place;
    int device;

    /* Guarded by mu: what other threads read (rw_sync_session_info / _ready / _stats). */
    pthread_mutex_t mu;
    rw_sync_wstate state;
    char version[RW_SYNC_MAX_VERSION + 1];     /* serving (or last complete) version */
    char new_version[RW_SYNC_MAX_VERSION + 1]; /* of the open session */
    char token[RW_SYNC_TOKEN_LEN + 1];         /* of the open session ("" when none) */
    bool owner_check;                          /* rw_sync_check_owner checks the token */
    uint64_t frame_limit;                      /* reported by begin_update (0: unknown) */
    bool flush_cache;
    uint64_t committed, aborted;
    uint64_t buckets, bytes;
    double last_update_s, last_gbps, last_commit_time;
    rw_sync_sstats stats;

    /* Control-thread only. */
    bool was_incomplete; /* weights were incomplete when the open session began */
    bool written;        /* the open session has issued at least one write */
    double timeout_s;
    double t_begin, t_active;
    double t_end; /* when the last session ended (guarded by mu: rw_sync_session_info) */

    uint64_t staging_bytes; /* each of the two device buffers (host sets: the announced size) */
    void *staging[2];
    rw_sync_flight fl[RW_SYNC_NFLIGHT]; /* bucket k uses fl[k % NFLIGHT] and staging[k % 2] */
    uint64_t slot_next;                 /* bucket counter across the session */
    double hard_deadline; /* when non-zero, waits give up at this rw_now() (abort's grace) */
    rw_wset_batch *batch; /* the weight set's prepared batch (memory reused) */
    rw_piece *pieces;     /* the bucket's pieces (memory reused) */
    size_t pieces_cap;
    rw_sync_manifest *dm; /* a deferred bucket's manifest (copy) */
    uint8_t *bounce;      /* host weight sets: a file source's bucket bytes [bounce_cap] */
    size_t bounce_cap;
    bool have_deferred;
    uint64_t deferred_index;
#ifdef RW_HAVE_CUDA
    cudaStream_t comm, compute;
    /* host and file sources: pinned chunks (allocated at the first one) and the copier filling
     * them */
    void *pin[RW_SYNC_UP_NBUF];
    size_t pin_bytes;                      /* each */
    cudaEvent_t pin_free[RW_SYNC_UP_NBUF]; /* recorded on comm after the copy out of pin[i] */
    bool pin_used[RW_SYNC_UP_NBUF];
    int pin_next;
    rw_sync_copier *copier;
#endif
    rw_sync_group *group;
};

/* --- session.c ------------------------------------------------------------------------------ */
/* Phase bookkeeping for rw_sync_session_stats: the time since the last mark goes to *acc (may be
 * NULL), the phase becomes `next`. Returns rw_now(). */
double rw_sync_mark(rw_sync_session *s, rw_sync_phase next, double *acc);
/* The bucket's pieces over bytes at `base` (s->pieces, grown as needed). */
rw_status rw_sync_make_pieces(rw_sync_session *s, const rw_sync_manifest *m, const void *base,
                              rw_place place, rw_err *err);
/* The session's weight-set batch, created at first use. */
rw_status rw_sync_batch_ready(rw_sync_session *s, rw_err *err);

/* --- pipeline.c (device weight sets; without CUDA every call reports RW_E_NO_DEVICE or does
 * nothing) ------------------------------------------------------------------------------------ */
/* Streams and events (created once), and two staging buffers of at least bucket_bytes each
 * (kept when large enough). A failed allocation is RW_E_OOM naming the size and device, and
 * leaves no staging buffer. */
rw_status rw_sync_pipe_reserve(rw_sync_session *s, uint64_t bucket_bytes, rw_err *err);
/* Record f's op table buffers (pinned host and device) hold at least `bytes`. */
rw_status rw_sync_pipe_table_reserve(rw_sync_session *s, rw_sync_flight *f, size_t bytes,
                                     rw_err *err);
/* The pinned upload chunks, `chunk_bytes` each (0: RW_SYNC_PIN_CHUNK or RW_SYNC_UP_CHUNK), and the
 * copier that fills them; kept once allocated. */
rw_status rw_sync_pipe_pin_reserve(rw_sync_session *s, size_t chunk_bytes, rw_err *err);
/* Applies bucket k = s->slot_next from `src` (pieces in s->pieces over staging[k % 2]): waits for
 * the record's previous bucket, does the host work, posts the receive, launches (or defers) the
 * apply. */
rw_status rw_sync_pipe_apply(rw_sync_session *s, const rw_sync_manifest *m, rw_sync_source *src,
                             rw_err *err);
/* Applies the deferred bucket, if any (its receive is waited for first). */
rw_status rw_sync_pipe_apply_deferred(rw_sync_session *s, rw_err *err);
/* Waits for every bucket in flight, oldest first; the first error wins but every record is
 * drained. A deferred bucket still waiting for its apply is dropped after its receive ended. */
rw_status rw_sync_pipe_wait_all(rw_sync_session *s, rw_err *err);
/* The periodic check of rw_sync_session_poll: completes finished records, fails a bucket that
 * failed on the device or whose NCCL group failed, waits (bounded) for one past the timeout,
 * applies a deferred bucket whose bytes arrived. *active is set when buckets are still in
 * flight (the session is not idle). */
rw_status rw_sync_pipe_poll(rw_sync_session *s, bool *active, rw_err *err);
/* True while a record holds work. */
bool rw_sync_pipe_busy(const rw_sync_session *s);
/* Frees the staging buffers, the op tables and the pinned chunks (nothing may be in flight). */
void rw_sync_pipe_free_staging(rw_sync_session *s);
/* Frees everything else the pipeline holds (streams, events, the copier). */
void rw_sync_pipe_destroy(rw_sync_session *s);

#endif
