/* session.c - the update session of one worker rank: begin -> buckets -> commit | abort, with the
 * protocol's invariants (every manifest validated before any byte is written; a failed or
 * aborted session leaves the previous version intact or marks the weights incomplete; commit
 * switches the version atomically for generation), and the bucket pipeline.
 *
 * Pipeline on a device weight set (two staging buffers s = k % 2, two streams, a ring of NFLIGHT
 * bucket records f = k % NFLIGHT, each with its op table buffers and two events):
 *
 *   comm stream:     [wait done[k-2]] recv k -> staging[s] [rec recvd[f]]  recv k+1 -> staging[s^1]
 *   compute stream:                        [wait recvd[f]] apply k (slice/quantize/pack) [rec
 * done[f]]
 *
 * `recv` is an NCCL broadcast, or for a host source (ZeroMQ frame: pageable memory) or a file
 * source (disk: pread) copies through pinned chunks: a few threads fill one chunk from the
 * source (memcpy, or one pread per thread) while the previous chunks' host -> device copies run
 * on the comm stream (UP_NBUF chunks of 32 MiB in turn). Apply is
 * one weight-set batch per bucket reading the pieces where they lie in staging (no canonical copy
 * of the model, no host round trip), in two phases (rw_wset_batch_prepare / _launch): the host
 * work (validation, ops, the op table) is done and its buffers exist BEFORE the receive is posted,
 * and after it only asynchronous calls follow (event record / wait, a table copy, 1-3 kernel
 * launches). The reason: an NCCL receive posted before this rank replies waits for a broadcast the
 * trainer only sends after the reply, so any host wait, allocation or free that synchronizes the
 * device between posting it and replying would deadlock until the timeout; and a bucket refused
 * by the host work must not leave a receive behind.
 *
 * Reuse of a staging buffer is ordered on the device only (the receive of k waits for apply k-2
 * on the comm stream). The host waits for nothing of the buckets in flight, except, before
 * bucket k reuses record f, for bucket k - NFLIGHT (bounded by the session timeout; NCCL aware):
 * so the control thread answers a trainer up to NFLIGHT - 2 buckets ahead of the wire, and the
 * per-bucket request / reply round trip and host work overlap the broadcasts instead of adding to
 * them. Device memory stays two buckets (S5).
 *
 * A bucket whose pieces cover quantization blocks only partly needs its bytes on the host to
 * stage them; over NCCL they arrive after the reply, so such a bucket's apply is deferred: its
 * receive is posted, and it is applied at the start of the next session command (apply, commit;
 * the bytes are there by then). On a host weight set the same sequence runs with the source's
 * host bytes as the staging buffer (a ZeroMQ frame is host memory already; a file source is
 * read into a host buffer of the session first), synchronously.
 *
 * A checkpoint tensor larger than the bucket (the 30B-A3B embedding and lm_head are 622 MB) is
 * applied as row pieces (shard dim 0), each a bucket of its own.
 *
 * Checkpoint bytes are never read through the file's mapping: a file truncated while it is
 * loaded would fault (SIGBUS) there. They are read with pread (rw_st_read), so such a file fails
 * the bucket with "file shrank while loading" and the session ends as any failed one does.
 */
#include "sync_internal.h"

#include <inttypes.h>
#include <pthread.h>
#include <regex.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

/* Pinned chunks between a host source and device staging: UP_NBUF of UP_CHUNK bytes (the
 * environment variable RW_SYNC_PIN_CHUNK sets another size, at least 4096 bytes: tests use small
 * chunks to run many through the pipeline). */
#define UP_CHUNK (32u << 20)
#define UP_NBUF 3
/* Bucket records in flight on a device set (>= 2: the staging buffers alternate). */
#define NFLIGHT 4

/* One bucket in flight: its op table (pinned image, device copy) and its events. */
typedef struct flight {
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
} flight;

struct rw_sync_session {
    rw_wset *ws;
    rw_place place;
    int device;

    /* Guarded by mu: what other threads read (rw_sync_session_info / _ready). */
    pthread_mutex_t mu;
    rw_sync_wstate state;
    char version[RW_SYNC_MAX_VERSION + 1];     /* serving (or last complete) version */
    char new_version[RW_SYNC_MAX_VERSION + 1]; /* of the open session */
    bool flush_cache;
    uint64_t committed, aborted;
    uint64_t buckets, bytes;
    double last_update_s, last_gbps, last_commit_time;

    /* Control-thread only. */
    bool was_incomplete; /* weights were incomplete when the open session began */
    bool written;        /* the open session has issued at least one write */
    double timeout_s;
    double t_begin, t_active;

    uint64_t staging_bytes; /* each of the two device buffers */
    void *staging[2];
    flight fl[NFLIGHT];   /* bucket k uses fl[k % NFLIGHT] and staging[k % 2] */
    uint64_t slot_next;   /* bucket counter across the session */
    double hard_deadline; /* when non-zero, waits give up at this rw_now() (abort's grace) */
    rw_wset_batch *batch; /* the weight set's prepared batch (memory reused) */
    rw_piece *pieces;     /* the bucket's pieces (memory reused) */
    size_t pieces_cap;
    rw_sync_manifest *dm; /* a deferred bucket's manifest (copy) */
    uint8_t *bounce;      /* host weight sets: a file source's bucket bytes [bounce_cap] */
    size_t bounce_cap;
    bool have_deferred;
    uint64_t deferred_index;
    rw_sync_sstats stats; /* guarded by mu */
#ifdef RW_HAVE_CUDA
    cudaStream_t comm, compute;
    /* host and file sources: pinned chunks (allocated at the first one) and the copier filling
     * them */
    void *pin[UP_NBUF];
    size_t pin_bytes;              /* each */
    cudaEvent_t pin_free[UP_NBUF]; /* recorded on comm after the copy out of pin[i] */
    bool pin_used[UP_NBUF];
    int pin_next;
    rw_sync_copier *copier;
#endif
    rw_sync_group *group;
};

const char *rw_sync_wstate_str(rw_sync_wstate s) {
    switch (s) {
    case RW_SYNC_READY: return "ready";
    case RW_SYNC_UPDATING: return "updating";
    case RW_SYNC_INCOMPLETE: return "weights_incomplete";
    default: return "unknown";
    }
}

rw_status rw_sync_session_create(rw_wset *ws, const char *version, bool incomplete,
                                 rw_sync_session **out, rw_err *err) {
    *out = NULL;
    if (!ws) RW_FAIL(err, RW_E_INVALID_ARG, "sync session: NULL weight set");
    RW_CHECK(rw_sync_check_version_tag(version, err));
    rw_sync_session *s = calloc(1, sizeof *s);
    if (!s) RW_FAIL(err, RW_E_OOM, "sync session: out of memory");
    s->ws = ws;
    rw_tensor probe = rw_wset_final_norm(ws);
    s->place = probe.place;
    s->device = probe.device;
    pthread_mutex_init(&s->mu, NULL);
    s->state = incomplete ? RW_SYNC_INCOMPLETE : RW_SYNC_READY;
    rw_sync_strlcpy(s->version, version, sizeof s->version);
    s->timeout_s = 300;
    *out = s;
    return RW_OK;
}

rw_wset *rw_sync_session_wset(rw_sync_session *s) {
    return s->ws;
}

void rw_sync_session_info(const rw_sync_session *cs, rw_sync_info *out) {
    rw_sync_session *s = (rw_sync_session *)cs;
    memset(out, 0, sizeof *out);
    pthread_mutex_lock(&s->mu);
    out->state = s->state;
    memcpy(out->version, s->version, sizeof out->version);
    if (s->state == RW_SYNC_UPDATING) memcpy(out->new_version, s->new_version, sizeof out->version);
    out->flush_cache = s->flush_cache;
    out->sessions_committed = s->committed;
    out->sessions_aborted = s->aborted;
    out->buckets = s->buckets;
    out->bytes = s->bytes;
    out->last_update_s = s->last_update_s;
    out->last_update_gbps = s->last_gbps;
    out->last_commit_time = s->last_commit_time;
    pthread_mutex_unlock(&s->mu);
    out->staging_bytes = s->staging[0] ? 2 * s->staging_bytes : 0;
    out->has_group = s->group && rw_sync_group_ok(s->group);
    if (s->group) rw_sync_strlcpy(out->group, rw_sync_group_name(s->group), sizeof out->group);
}

rw_status rw_sync_session_ready(const rw_sync_session *cs, char *version, size_t cap, rw_err *err) {
    rw_sync_session *s = (rw_sync_session *)cs;
    pthread_mutex_lock(&s->mu);
    rw_sync_wstate st = s->state;
    if (version && cap) rw_sync_strlcpy(version, s->version, cap);
    pthread_mutex_unlock(&s->mu);
    if (st == RW_SYNC_UPDATING)
        RW_FAIL(err, RW_E_BUSY, "weights: an update session is open (generation is paused)");
    if (st == RW_SYNC_INCOMPLETE)
        RW_FAIL(err, RW_E_WEIGHTS_INCOMPLETE,
                "weights: a failed or aborted update left them partly written; a full update "
                "(or reload) must succeed first");
    return RW_OK;
}

/* ------------------------------------------------------------------------------------------ */
/* Device resources                                                                             */
/* ------------------------------------------------------------------------------------------ */
#ifdef RW_HAVE_CUDA
static rw_status dev_resources(rw_sync_session *s, uint64_t bucket_bytes, rw_err *err) {
    RW_CUDA_TRY(err, cudaSetDevice(s->device));
    if (!s->comm) {
        /* the receive stream gets the highest priority: when a receive and the previous bucket's
         * apply become ready together, the block scheduler gives the NCCL kernel its SMs first
         * (the apply's large grid would otherwise hold the wire up for its duration) */
        int lo = 0, hi = 0;
        if (cudaDeviceGetStreamPriorityRange(&lo, &hi) != cudaSuccess) {
            cudaGetLastError();
            lo = hi = 0;
        }
        RW_CUDA_TRY(err, cudaStreamCreateWithPriority(&s->comm, cudaStreamNonBlocking, hi));
        RW_CUDA_TRY(err, cudaStreamCreateWithPriority(&s->compute, cudaStreamNonBlocking, lo));
        for (int i = 0; i < NFLIGHT; i++) {
            RW_CUDA_TRY(err, cudaEventCreateWithFlags(&s->fl[i].recvd, cudaEventDisableTiming));
            RW_CUDA_TRY(err, cudaEventCreateWithFlags(&s->fl[i].done, cudaEventDisableTiming));
        }
    }
    if (s->staging[0] && s->staging_bytes >= bucket_bytes) return RW_OK;
    for (int i = 0; i < 2; i++) {
        if (s->staging[i]) cudaFree(s->staging[i]);
        s->staging[i] = NULL;
    }
    s->staging_bytes = 0;
    for (int i = 0; i < 2; i++) {
        cudaError_t e = cudaMalloc(&s->staging[i], bucket_bytes);
        if (e != cudaSuccess) {
            cudaGetLastError();
            for (int j = 0; j < 2; j++) {
                if (s->staging[j]) cudaFree(s->staging[j]);
                s->staging[j] = NULL;
            }
            RW_FAIL(err, RW_E_OOM,
                    "sync session: two staging buffers of %" PRIu64 " bytes on device %d: %s",
                    bucket_bytes, s->device, cudaGetErrorString(e));
        }
    }
    s->staging_bytes = bucket_bytes;
    return RW_OK;
}

/* Frees the op table buffers of every record (nothing may be in flight). */
static void tables_free(rw_sync_session *s) {
    for (int i = 0; i < NFLIGHT; i++) {
        flight *f = &s->fl[i];
        if (f->htab) cudaFreeHost(f->htab);
        if (f->dtab) cudaFree(f->dtab);
        f->htab = f->dtab = NULL;
        f->tab_cap = 0;
    }
}

/* Record f's op table buffers hold at least `bytes`. Called before the bucket's receive is
 * posted (or for a host source, whose upload needs no peer): cudaFree / cudaFreeHost may
 * synchronize the device, which is harmless only then. Grown geometrically and kept, so steady
 * state allocates nothing. */
static rw_status table_reserve(rw_sync_session *s, flight *f, size_t bytes, rw_err *err) {
    if (f->tab_cap >= bytes) return RW_OK;
    size_t cap = f->tab_cap ? f->tab_cap : (256u << 10);
    while (cap < bytes)
        cap *= 2;
    if (f->htab) cudaFreeHost(f->htab);
    if (f->dtab) cudaFree(f->dtab);
    f->htab = f->dtab = NULL;
    f->tab_cap = 0;
    cudaError_t e = cudaMallocHost(&f->htab, cap);
    if (e == cudaSuccess) e = cudaMalloc(&f->dtab, cap);
    if (e != cudaSuccess) {
        cudaGetLastError();
        if (f->htab) cudaFreeHost(f->htab);
        f->htab = NULL;
        RW_FAIL(err, RW_E_OOM, "sync session: op table buffers of %zu bytes: %s", cap,
                cudaGetErrorString(e));
    }
    f->tab_cap = cap;
    return RW_OK;
}

/* Waits for record f's bucket (bounded): its apply, or for a deferred one its receive. Returns
 * RW_E_TIMEOUT / RW_E_NCCL / RW_E_CUDA. A stuck NCCL receive gets its communicator aborted,
 * which ends the kernel, so the record drains. */
static rw_status wait_flight(rw_sync_session *s, flight *f, rw_err *err) {
    if (!f->busy) return RW_OK;
    cudaEvent_t ev = f->deferred ? f->recvd : f->done;
    for (;;) {
        cudaError_t e = cudaEventQuery(ev);
        if (e == cudaSuccess) break;
        if (e != cudaErrorNotReady) {
            cudaGetLastError();
            f->busy = false;
            RW_FAIL(err, RW_E_CUDA, "sync session: bucket %" PRIu64 " failed on the device: %s",
                    f->index, cudaGetErrorString(e));
        }
        if (f->nccl && s->group) {
            rw_status st = rw_sync_group_check(s->group, err);
            if (st != RW_OK) {
                cudaEventSynchronize(ev); /* the abort ended the kernel */
                f->busy = false;
                return st;
            }
        }
        if (rw_now() - f->t0 > s->timeout_s ||
            (s->hard_deadline > 0 && rw_now() > s->hard_deadline)) {
            if (f->nccl && s->group) {
                rw_sync_group_abort(s->group);
                cudaEventSynchronize(ev);
                f->busy = false;
                RW_FAIL(err, RW_E_TIMEOUT,
                        "sync session: NCCL receive of bucket %" PRIu64 " (group '%s') did not "
                        "finish within %.1f s (trainer gone?): communicator aborted, re-create "
                        "the group",
                        f->index, rw_sync_group_name(s->group), s->timeout_s);
            }
            RW_FAIL(err, RW_E_TIMEOUT,
                    "sync session: device work of bucket %" PRIu64 " did not finish within %.1f s",
                    f->index, s->timeout_s);
        }
        struct timespec ts = {0, 20000};
        nanosleep(&ts, NULL);
    }
    if (!f->deferred) f->busy = false;
    return RW_OK;
}

/* Threads of the host copier: RW_SYNC_COPY_THREADS (1..64), else up to 8 of the host's cores. */
static int copy_threads(void) {
    const char *v = getenv("RW_SYNC_COPY_THREADS");
    if (v && v[0]) {
        int n = atoi(v);
        if (n >= 1 && n <= 64) return n;
    }
    long c = sysconf(_SC_NPROCESSORS_ONLN);
    return c >= 8 ? 8 : c >= 1 ? (int)c : 1;
}

/* Frees the pinned chunks once no copy out of them is pending. */
static void pin_free_all(rw_sync_session *s) {
    for (int i = 0; i < UP_NBUF; i++) {
        if (s->pin_used[i]) cudaEventSynchronize(s->pin_free[i]);
        if (s->pin[i]) cudaFreeHost(s->pin[i]);
        s->pin[i] = NULL;
        s->pin_used[i] = false;
    }
    s->pin_next = 0;
}

static rw_status pin_init(rw_sync_session *s, rw_err *err) {
    if (s->pin[0]) return RW_OK;
    if (!s->copier) RW_CHECK(rw_sync_copier_create(copy_threads(), &s->copier, err));
    s->pin_bytes = UP_CHUNK;
    const char *v = getenv("RW_SYNC_PIN_CHUNK");
    if (v && v[0]) {
        long long n = atoll(v);
        if (n >= 4096 && n <= (1ll << 30)) s->pin_bytes = (size_t)n;
    }
    for (int i = 0; i < UP_NBUF; i++) {
        if (!s->pin_free[i])
            RW_CUDA_TRY(err, cudaEventCreateWithFlags(&s->pin_free[i], cudaEventDisableTiming));
        cudaError_t e = cudaMallocHost(&s->pin[i], s->pin_bytes);
        if (e != cudaSuccess) {
            cudaGetLastError();
            s->pin[i] = NULL;
            pin_free_all(s);
            RW_FAIL(err, RW_E_OOM, "sync session: pinned staging chunk of %zu bytes: %s",
                    s->pin_bytes, cudaGetErrorString(e));
        }
    }
    return RW_OK;
}

/* Waits (bounded by the session timeout) for an event on the comm stream. Only an NCCL receive
 * can hold that stream up; its communicator is aborted then, which ends it. */
static rw_status wait_comm(rw_sync_session *s, cudaEvent_t ev, rw_err *err) {
    double t0 = rw_now();
    for (;;) {
        cudaError_t e = cudaEventQuery(ev);
        if (e == cudaSuccess) return RW_OK;
        if (e != cudaErrorNotReady) {
            cudaGetLastError();
            RW_FAIL(err, RW_E_CUDA, "sync session: host -> device copy failed: %s",
                    cudaGetErrorString(e));
        }
        if (s->group && rw_sync_group_ok(s->group)) {
            rw_status st = rw_sync_group_check(s->group, err);
            if (st != RW_OK) {
                cudaEventSynchronize(ev);
                return st;
            }
        }
        if (rw_now() - t0 > s->timeout_s || (s->hard_deadline > 0 && rw_now() > s->hard_deadline)) {
            if (s->group) {
                rw_sync_group_abort(s->group);
                cudaEventSynchronize(ev);
            }
            RW_FAIL(err, RW_E_TIMEOUT,
                    "sync session: host -> device copy did not finish within %.1f s", s->timeout_s);
        }
        struct timespec ts = {0, 20000};
        nanosleep(&ts, NULL);
    }
}

/* Host or file source -> device staging on the comm stream through the pinned chunks: the
 * copier fills chunk i (memcpy from src->host, or preads through src->read_at) while the copies
 * of the chunks before it run. Returns once every byte has left `src` (the source may be released
 * then); the device copies complete in stream order. A failed read returns its error; the
 * chunks copied before it stay queued (they only write staging). */
static rw_status upload_host(rw_sync_session *s, uint8_t *dst, const rw_sync_source *src,
                             uint64_t nb, rw_err *err) {
    RW_CHECK(pin_init(s, err));
    const size_t chunk = s->pin_bytes;
    for (uint64_t off = 0; off < nb; off += chunk) {
        size_t n = nb - off < chunk ? (size_t)(nb - off) : chunk;
        int i = s->pin_next;
        s->pin_next = (i + 1) % UP_NBUF;
        if (s->pin_used[i]) RW_CHECK(wait_comm(s, s->pin_free[i], err));
        if (src->host)
            rw_sync_copier_run(s->copier, s->pin[i], (const uint8_t *)src->host + off, n);
        else
            RW_CHECK(rw_sync_copier_read(s->copier, s->pin[i], src, off, n, err));
        RW_CUDA_TRY(err, cudaMemcpyAsync(dst + off, s->pin[i], n, cudaMemcpyHostToDevice, s->comm));
        RW_CUDA_TRY(err, cudaEventRecord(s->pin_free[i], s->comm));
        s->pin_used[i] = true;
    }
    return RW_OK;
}
#endif

/* Waits for every bucket in flight, oldest first; the first error wins but every record is
 * drained. A deferred bucket still waiting for its apply is dropped after its receive ended
 * (commit applies it first; abort and failures drop it). */
static rw_status wait_all(rw_sync_session *s, rw_err *err) {
#ifdef RW_HAVE_CUDA
    rw_status st = RW_OK;
    for (uint64_t k = 0; k < NFLIGHT; k++) {
        flight *f = &s->fl[(s->slot_next + k) % NFLIGHT];
        rw_status si = wait_flight(s, f, st == RW_OK ? err : NULL);
        if (st == RW_OK) st = si;
        f->busy = f->deferred = false;
    }
    s->have_deferred = false;
    return st;
#else
    (void)s;
    (void)err;
    return RW_OK;
#endif
}

static void free_staging(rw_sync_session *s) {
#ifdef RW_HAVE_CUDA
    if (s->staging[0] || s->pin[0] || s->fl[0].tab_cap) cudaSetDevice(s->device);
    for (int i = 0; i < 2; i++) {
        if (s->staging[i]) cudaFree(s->staging[i]);
        s->staging[i] = NULL;
    }
    tables_free(s);
    pin_free_all(s);
#endif
    s->staging_bytes = 0;
}

void rw_sync_session_destroy(rw_sync_session *s) {
    if (!s) return;
    if (s->state == RW_SYNC_UPDATING) {
        bool intact;
        rw_sync_session_abort(s, &intact, NULL);
    }
    rw_sync_group_destroy(s->group);
    free_staging(s);
#ifdef RW_HAVE_CUDA
    if (s->comm) {
        cudaSetDevice(s->device);
        for (int i = 0; i < NFLIGHT; i++) {
            cudaEventDestroy(s->fl[i].recvd);
            cudaEventDestroy(s->fl[i].done);
        }
        for (int i = 0; i < UP_NBUF; i++)
            if (s->pin_free[i]) cudaEventDestroy(s->pin_free[i]);
        cudaStreamDestroy(s->comm);
        cudaStreamDestroy(s->compute);
    }
    rw_sync_copier_destroy(s->copier);
#endif
    rw_wset_batch_destroy(s->batch);
    rw_sync_manifest_destroy(s->dm);
    free(s->bounce);
    free(s->pieces);
    pthread_mutex_destroy(&s->mu);
    free(s);
}

rw_status rw_sync_session_release(rw_sync_session *s, rw_err *err) {
    if (s->state == RW_SYNC_UPDATING)
        RW_FAIL(err, RW_E_STATE, "sync session: cannot release staging while an update is open");
    free_staging(s);
    return RW_OK;
}

/* ------------------------------------------------------------------------------------------ */
/* Session state machine                                                                        */
/* ------------------------------------------------------------------------------------------ */
rw_status rw_sync_session_begin(rw_sync_session *s, const rw_sync_begin_args *a, rw_err *err) {
    if (!a) RW_FAIL(err, RW_E_INVALID_ARG, "begin_update: NULL arguments");
    if (s->state == RW_SYNC_UPDATING)
        RW_FAIL(err, RW_E_STATE, "begin_update: an update session (to '%s') is already open",
                s->new_version);
    RW_CHECK(rw_sync_check_version_tag(a->version, err));
    uint64_t bucket = a->bucket_bytes ? a->bucket_bytes : RW_SYNC_DEFAULT_BUCKET;
    if (bucket > (64ull << 30))
        RW_FAIL(err, RW_E_RANGE, "begin_update: bucket_bytes %" PRIu64 " (limit 64 GiB)", bucket);
    double timeout = a->timeout_s > 0 ? a->timeout_s : 300;
    if (s->place == RW_PLACE_DEVICE) {
#ifdef RW_HAVE_CUDA
        RW_CHECK(dev_resources(s, bucket, err));
#else
        RW_FAIL(err, RW_E_NO_DEVICE, "begin_update: device weight set in a build without CUDA");
#endif
    }
    s->staging_bytes = s->place == RW_PLACE_DEVICE ? s->staging_bytes : bucket;
    s->was_incomplete = s->state == RW_SYNC_INCOMPLETE;
    s->written = false;
    s->timeout_s = timeout;
    s->t_begin = s->t_active = rw_now();
    s->slot_next = 0;
    s->have_deferred = false;
    rw_wset_mark_clear(s->ws);
    pthread_mutex_lock(&s->mu);
    s->state = RW_SYNC_UPDATING;
    rw_sync_strlcpy(s->new_version, a->version, sizeof s->new_version);
    s->flush_cache = a->flush_cache;
    s->buckets = s->bytes = 0;
    memset(&s->stats, 0, sizeof s->stats);
    s->stats.phase_since = rw_now();
    pthread_mutex_unlock(&s->mu);
    return RW_OK;
}

/* Ends the open session without a version change. */
static void end_aborted(rw_sync_session *s, bool *intact) {
    bool keep = !s->written && !s->was_incomplete;
    pthread_mutex_lock(&s->mu);
    s->state = keep ? RW_SYNC_READY : RW_SYNC_INCOMPLETE;
    s->aborted++;
    pthread_mutex_unlock(&s->mu);
    *intact = keep;
}

rw_status rw_sync_session_abort(rw_sync_session *s, bool *intact, rw_err *err) {
    if (s->state != RW_SYNC_UPDATING)
        RW_FAIL(err, RW_E_STATE, "abort_update: no update session is open");
    /* the trainer gave up: a receive still waiting for its broadcast gets a short grace, then
     * its communicator is aborted (the group must be re-created) */
    rw_err e2;
    s->hard_deadline = rw_now() + (s->timeout_s < 5 ? s->timeout_s : 5);
    rw_status st = wait_all(s, &e2);
    s->hard_deadline = 0;
    if (st != RW_OK) RW_LOGW("abort_update: %s", e2.msg);
    end_aborted(s, intact);
    return RW_OK;
}

/* Aborts the session after a failure and appends what that means to the error message. */
static rw_status fail_session(rw_sync_session *s, rw_status st, rw_err *err) {
    rw_err e2;
    if (wait_all(s, &e2) != RW_OK) RW_LOGW("sync session: while aborting: %s", e2.msg);
    bool intact;
    end_aborted(s, &intact);
    if (err) {
        char tmp[sizeof err->msg];
        snprintf(tmp, sizeof tmp, "%s; update aborted: %s", err->msg,
                 intact ? "nothing was written, the previous version still serves"
                        : "weights are incomplete until a full update succeeds");
        memcpy(err->msg, tmp, sizeof tmp);
    }
    RW_LOGW("sync session: %s", err ? err->msg : rw_status_str(st));
    return st;
}

rw_status rw_sync_session_fail(rw_sync_session *s, rw_status st, rw_err *err) {
    if (st == RW_OK || s->state != RW_SYNC_UPDATING) return st;
    return fail_session(s, st, err);
}

#ifdef RW_HAVE_CUDA
static rw_status apply_deferred(rw_sync_session *s, rw_err *err);
#endif

rw_status rw_sync_session_poll(rw_sync_session *s, rw_err *err) {
    if (s->state != RW_SYNC_UPDATING) return RW_OK;
    double now = rw_now();
#ifdef RW_HAVE_CUDA
    bool any = false;
    for (int i = 0; i < NFLIGHT; i++) {
        flight *f = &s->fl[i];
        if (!f->busy) continue;
        cudaError_t e = cudaEventQuery(f->deferred ? f->recvd : f->done);
        if (e == cudaSuccess) {
            if (!f->deferred) f->busy = false;
            continue;
        }
        rw_status st = RW_OK;
        if (e != cudaErrorNotReady) {
            cudaGetLastError();
            f->busy = false;
            st = RW_ERR(err, RW_E_CUDA, "sync session: bucket %" PRIu64 " failed on the device: %s",
                        f->index, cudaGetErrorString(e));
        } else if (f->nccl && s->group) {
            st = rw_sync_group_check(s->group, err);
        }
        if (st == RW_OK && now - f->t0 > s->timeout_s) st = wait_flight(s, f, err);
        if (st != RW_OK) return fail_session(s, st, err);
        any = true;
    }
    /* a deferred bucket whose bytes are in: apply it now rather than at the next command */
    if (s->have_deferred) {
        flight *f = &s->fl[s->deferred_index % NFLIGHT];
        if (cudaEventQuery(f->recvd) == cudaSuccess) {
            rw_status st = apply_deferred(s, err);
            if (st != RW_OK) return fail_session(s, st, err);
        }
        any = true;
    }
    if (any) return RW_OK;
#endif
    if (now - s->t_active > s->timeout_s) {
        rw_status st =
            RW_ERR(err, RW_E_TIMEOUT, "sync session: no update command for %.1f s (timeout %.1f s)",
                   now - s->t_active, s->timeout_s);
        return fail_session(s, st, err);
    }
    return RW_OK;
}

/* Phase bookkeeping for rw_sync_session_stats: the time since the last mark goes to the phase
 * that ends, summed per bucket. */
static double mark(rw_sync_session *s, rw_sync_phase next, double *acc) {
    double now = rw_now();
    pthread_mutex_lock(&s->mu);
    if (acc) *acc += now - s->stats.phase_since;
    s->stats.phase = next;
    s->stats.phase_since = now;
    pthread_mutex_unlock(&s->mu);
    return now;
}

const char *rw_sync_phase_str(rw_sync_phase p) {
    switch (p) {
    case RW_SYNC_PH_IDLE: return "idle";
    case RW_SYNC_PH_VALIDATE: return "validate";
    case RW_SYNC_PH_WAIT: return "wait-for-record";
    case RW_SYNC_PH_PREPARE: return "prepare";
    case RW_SYNC_PH_BUFFERS: return "table-buffers";
    case RW_SYNC_PH_RECV: return "post-receive";
    case RW_SYNC_PH_LAUNCH: return "launch";
    case RW_SYNC_PH_DEFERRED: return "deferred-apply";
    case RW_SYNC_PH_COMMIT: return "commit-wait";
    }
    return "?";
}

void rw_sync_session_stats(rw_sync_session *s, rw_sync_sstats *out) {
    pthread_mutex_lock(&s->mu);
    *out = s->stats;
    pthread_mutex_unlock(&s->mu);
}

/* The bucket's pieces over bytes at `base` (s->pieces, grown as needed). */
static rw_status make_pieces(rw_sync_session *s, const rw_sync_manifest *m, const void *base,
                             rw_place place, rw_err *err) {
    size_t n = rw_sync_manifest_count(m);
    if (n > s->pieces_cap) {
        rw_piece *p = realloc(s->pieces, n * sizeof *p);
        if (!p) RW_FAIL(err, RW_E_OOM, "update_weights: out of memory for %zu pieces", n);
        s->pieces = p;
        s->pieces_cap = n;
    }
    for (size_t i = 0; i < n; i++)
        s->pieces[i] = rw_sync_tensor_piece(rw_sync_manifest_at(m, i), base, place);
    return RW_OK;
}

/* Everything that can be checked before a byte is written; leaves the pieces in s->pieces. */
static rw_status validate_bucket(rw_sync_session *s, const rw_sync_manifest *m,
                                 const rw_sync_source *src, rw_err *err) {
    RW_CHECK(rw_sync_manifest_check(m, err));
    uint64_t nb = rw_sync_manifest_bytes(m);
    if (src->nbytes != nb)
        RW_FAIL(err, RW_E_SHAPE,
                "update_weights: the manifest describes %" PRIu64 " bytes but the %s transport "
                "delivered %" PRIu64 " (truncated or extra frame data)",
                nb, src->name, src->nbytes);
    /* host weight sets have no staging buffer, but the announced size binds them too: the
     * same trainer must get the same answer from a CPU and a CUDA worker */
    if (nb > s->staging_bytes)
        RW_FAIL(err, RW_E_RANGE,
                "update_weights: bucket of %" PRIu64 " bytes is larger than announced by "
                "begin_update (bucket_bytes %" PRIu64 ", the staging buffer size)",
                nb, s->staging_bytes);
    if (s->place == RW_PLACE_HOST && !src->host && !src->read_at)
        RW_FAIL(err, RW_E_UNSUPPORTED,
                "update_weights: the %s transport needs a CUDA weight set (this one is on the "
                "host)",
                src->name);
    /* pieces point where they will be applied from (host bytes, the host buffer a file source
     * is read into, or the staging buffer the receive will fill); nothing is read here */
    const void *base = s->staging[s->slot_next % 2];
    if (s->place == RW_PLACE_HOST && src->host) {
        base = src->host;
    } else if (s->place == RW_PLACE_HOST) {
        if (nb > s->bounce_cap) {
            free(s->bounce);
            s->bounce_cap = 0;
            s->bounce = malloc(nb ? (size_t)nb : 1);
            if (!s->bounce)
                RW_FAIL(err, RW_E_OOM,
                        "update_weights: out of memory for a %" PRIu64 "-byte read buffer", nb);
            s->bounce_cap = (size_t)nb;
        }
        base = s->bounce;
    }
    RW_CHECK(make_pieces(s, m, base, s->place, err));
    for (size_t i = 0; i < rw_sync_manifest_count(m); i++)
        RW_CHECK(rw_wset_validate_piece(s->ws, &s->pieces[i], err));
    return RW_OK;
}

static rw_status batch_ready(rw_sync_session *s, rw_err *err) {
    if (!s->batch) RW_CHECK(rw_wset_batch_create(&s->batch, err));
    return RW_OK;
}

/* Host weight set: the pieces in s->pieces applied straight from the source's bytes. */
static rw_status apply_host(rw_sync_session *s, size_t n, rw_err *err) {
    if (n == 0) return RW_OK;
    RW_CHECK(batch_ready(s, err));
    s->written = true;
    RW_CHECK(rw_wset_batch_prepare(s->ws, s->pieces, n, false, NULL, s->batch, NULL, err));
    return rw_wset_batch_launch(s->ws, s->batch, NULL, NULL, NULL, err);
}

#ifdef RW_HAVE_CUDA
/* Launches the prepared batch of record f on the compute stream (after its receive) and records
 * its completion. Only asynchronous calls: it may run while f's NCCL receive waits for the
 * trainer. */
static rw_status launch_flight(rw_sync_session *s, flight *f, rw_err *err) {
    rw_status st = rw_wset_batch_launch(s->ws, s->batch, f->htab, f->dtab, s->compute, err);
    /* recorded after a failed launch too: what it queued reads the staging buffer until then */
    cudaError_t ce = cudaEventRecord(f->done, s->compute);
    f->deferred = false;
    if (st != RW_OK) return st;
    if (ce != cudaSuccess) {
        cudaGetLastError();
        RW_FAIL(err, RW_E_CUDA, "sync session: cudaEventRecord: %s", cudaGetErrorString(ce));
    }
    return RW_OK;
}

/* The deferred bucket: its receive has been waited for (bounded), its pieces (reads of their
 * bytes allowed now) prepared and launched. */
static rw_status apply_deferred(rw_sync_session *s, rw_err *err) {
    if (!s->have_deferred) return RW_OK;
    uint64_t k = s->deferred_index;
    flight *f = &s->fl[k % NFLIGHT];
    double t0 = mark(s, RW_SYNC_PH_DEFERRED, NULL);
    RW_CUDA_TRY(err, cudaSetDevice(s->device));
    RW_CHECK(wait_flight(s, f, err)); /* its receive */
    s->have_deferred = false;
    RW_CHECK(make_pieces(s, s->dm, s->staging[k % 2], RW_PLACE_DEVICE, err));
    size_t n = rw_sync_manifest_count(s->dm);
    bool again = false;
    /* reads copy parts of staging to the host on the compute stream, which holds only this
     * bucket's wait for its (complete) receive and earlier applies */
    RW_CHECK(rw_wset_batch_prepare(s->ws, s->pieces, n, false, s->compute, s->batch, &again, err));
    RW_CHECK(table_reserve(s, f, rw_wset_batch_table_bytes(s->batch), err));
    rw_status st = launch_flight(s, f, err);
    f->busy = true;
    f->t0 = rw_now();
    pthread_mutex_lock(&s->mu);
    s->stats.deferred_s += rw_now() - t0;
    s->stats.phase = RW_SYNC_PH_IDLE;
    s->stats.phase_since = rw_now();
    pthread_mutex_unlock(&s->mu);
    return st;
}

/* Keeps a copy of the manifest of a deferred bucket. */
static rw_status keep_manifest(rw_sync_session *s, const rw_sync_manifest *m, rw_err *err) {
    if (!s->dm) RW_CHECK(rw_sync_manifest_create(&s->dm, err));
    rw_sync_manifest_clear(s->dm);
    for (size_t i = 0; i < rw_sync_manifest_count(m); i++)
        RW_CHECK(rw_sync_manifest_push(s->dm, rw_sync_manifest_at(m, i), err));
    rw_sync_manifest_set_bytes(s->dm, rw_sync_manifest_bytes(m));
    return RW_OK;
}

/* Device weight set: bucket k = s->slot_next, pieces in s->pieces (over staging[k % 2]).
 * Order: wait for the record's previous bucket; host work and buffers; receive; launch. */
static rw_status apply_device(rw_sync_session *s, const rw_sync_manifest *m, rw_sync_source *src,
                              rw_err *err) {
    uint64_t k = s->slot_next, nb = rw_sync_manifest_bytes(m);
    size_t n = rw_sync_manifest_count(m);
    flight *f = &s->fl[k % NFLIGHT];
    bool nccl = !src->host && !src->read_at;
    RW_CUDA_TRY(err, cudaSetDevice(s->device));
    RW_CHECK(batch_ready(s, err));
    /* 1. the record's previous user, bucket k - NFLIGHT (on a steady stream long done) */
    mark(s, RW_SYNC_PH_WAIT, &s->stats.validate_s);
    RW_CHECK(wait_flight(s, f, err));
    f->busy = f->deferred = false;
    /* 2. host work, with no read of the bytes (they are not there yet) */
    mark(s, RW_SYNC_PH_PREPARE, &s->stats.wait_s);
    bool needs_reads = false;
    s->written = true; /* prepare records what the batch writes */
    RW_CHECK(
        rw_wset_batch_prepare(s->ws, s->pieces, n, true, s->compute, s->batch, &needs_reads, err));
    mark(s, RW_SYNC_PH_BUFFERS, &s->stats.prepare_s);
    if (!needs_reads) RW_CHECK(table_reserve(s, f, rw_wset_batch_table_bytes(s->batch), err));
    /* 3. the receive into staging[k % 2], after the apply that last read it (bucket k - 2) */
    mark(s, RW_SYNC_PH_RECV, &s->stats.buffers_s);
    if (k >= 2) {
        flight *prev = &s->fl[(k - 2) % NFLIGHT];
        /* bucket k - 2's apply is launched (a deferred one is applied before the next bucket
         * starts), so its done event is recorded */
        RW_CUDA_TRY(err, cudaStreamWaitEvent(s->comm, prev->done, 0));
    }
    f->index = k;
    f->nccl = nccl;
    f->t0 = rw_now();
    if (!nccl)
        RW_CHECK(upload_host(s, s->staging[k % 2], src, nb, err));
    else
        RW_CHECK(src->read(src, s->staging[k % 2], RW_PLACE_DEVICE, nb, s->comm, err));
    /* from here on the record holds work that may read staging: drained by wait_all */
    f->busy = true;
    f->deferred = true; /* until launch_flight records done */
    RW_CUDA_TRY(err, cudaEventRecord(f->recvd, s->comm));
    RW_CUDA_TRY(err, cudaStreamWaitEvent(s->compute, f->recvd, 0));
    mark(s, RW_SYNC_PH_LAUNCH, &s->stats.recv_s);
    if (needs_reads && nccl) {
        /* the bytes arrive after the reply: applied at the next command (apply_deferred) */
        RW_CHECK(keep_manifest(s, m, err));
        s->have_deferred = true;
        s->deferred_index = k;
        pthread_mutex_lock(&s->mu);
        s->stats.deferred++;
        pthread_mutex_unlock(&s->mu);
    } else {
        if (needs_reads) {
            /* a host source: its upload needs no peer, so the compute stream (waiting for it)
             * can be synchronized by the reads */
            RW_CHECK(
                rw_wset_batch_prepare(s->ws, s->pieces, n, false, s->compute, s->batch, NULL, err));
            RW_CHECK(table_reserve(s, f, rw_wset_batch_table_bytes(s->batch), err));
        }
        RW_CHECK(launch_flight(s, f, err));
    }
    mark(s, RW_SYNC_PH_IDLE, &s->stats.launch_s);
    return RW_OK;
}
#endif

rw_status rw_sync_session_apply(rw_sync_session *s, const rw_sync_manifest *m, rw_sync_source *src,
                                rw_sync_bucket_result *out, rw_err *err) {
    if (out) memset(out, 0, sizeof *out);
    if (s->state != RW_SYNC_UPDATING)
        RW_FAIL(err, RW_E_STATE, "update_weights: no update session is open (begin_update first)");
    double t0 = rw_now();
    s->t_active = t0;
    rw_status st = RW_OK;
#ifdef RW_HAVE_CUDA
    /* the bucket before, when its apply waited for its bytes, goes first (stream order) */
    if (s->have_deferred) {
        st = apply_deferred(s, err);
        if (st != RW_OK) return fail_session(s, st, err);
    }
#endif
    pthread_mutex_lock(&s->mu);
    s->stats.phase = RW_SYNC_PH_VALIDATE;
    s->stats.phase_since = rw_now();
    s->stats.bucket = s->slot_next;
    pthread_mutex_unlock(&s->mu);
    st = validate_bucket(s, m, src, err);
    if (st != RW_OK) return fail_session(s, st, err);
    uint64_t nb = rw_sync_manifest_bytes(m), idx = s->slot_next;
    bool applied = true;
    if (s->place == RW_PLACE_HOST) {
        /* a file source: its bytes into the host buffer the pieces point at, before anything
         * is written (a failed read leaves the weights as they were) */
        if (!src->host) {
            mark(s, RW_SYNC_PH_RECV, &s->stats.validate_s);
            st = src->read_at(src, s->bounce, 0, (size_t)nb, err);
            mark(s, RW_SYNC_PH_PREPARE, &s->stats.recv_s);
        } else {
            mark(s, RW_SYNC_PH_PREPARE, &s->stats.validate_s);
        }
        if (st == RW_OK) st = apply_host(s, rw_sync_manifest_count(m), err);
        mark(s, RW_SYNC_PH_IDLE, &s->stats.prepare_s);
    } else {
#ifdef RW_HAVE_CUDA
        applied = false; /* in flight on the device streams */
        st = apply_device(s, m, src, err);
#else
        st = RW_ERR(err, RW_E_NO_DEVICE, "update_weights: device weight set without CUDA");
#endif
    }
    if (st != RW_OK) {
        mark(s, RW_SYNC_PH_IDLE, NULL);
        return fail_session(s, st, err);
    }
    s->slot_next++;
    double dt = rw_now() - t0;
    pthread_mutex_lock(&s->mu);
    s->buckets++;
    s->bytes += nb;
    s->stats.buckets++;
    s->stats.pieces += rw_sync_manifest_count(m);
    s->stats.apply_s += dt;
    if (dt > s->stats.max_apply_s) s->stats.max_apply_s = dt;
    pthread_mutex_unlock(&s->mu);
    s->t_active = rw_now();
    if (out) {
        out->index = idx;
        out->tensors = rw_sync_manifest_count(m);
        out->bytes = nb;
        out->applied = applied;
    }
    return RW_OK;
}

rw_status rw_sync_session_commit(rw_sync_session *s, rw_sync_commit_result *out, rw_err *err) {
    if (out) memset(out, 0, sizeof *out);
    if (s->state != RW_SYNC_UPDATING)
        RW_FAIL(err, RW_E_STATE, "commit_update: no update session is open");
    rw_status st = RW_OK;
#ifdef RW_HAVE_CUDA
    if (s->have_deferred) st = apply_deferred(s, err);
#endif
    mark(s, RW_SYNC_PH_COMMIT, NULL);
    if (st == RW_OK) st = wait_all(s, err);
    mark(s, RW_SYNC_PH_IDLE, &s->stats.commit_wait_s);
    if (st != RW_OK) return fail_session(s, st, err);
    if (s->was_incomplete) {
        char missing[RW_SYNC_MAX_NAME];
        missing[0] = 0;
        if (!rw_wset_complete(s->ws, missing, sizeof missing)) {
            st = RW_ERR(err, RW_E_WEIGHTS_INCOMPLETE,
                        "commit_update: the weights were incomplete before this session and it "
                        "did not write all of them (first missing: %s)",
                        missing[0] ? missing : "?");
            return fail_session(s, st, err);
        }
    }
    double now = rw_now(), dt = now - s->t_begin;
    pthread_mutex_lock(&s->mu);
    memcpy(s->version, s->new_version, sizeof s->version);
    s->state = RW_SYNC_READY;
    s->committed++;
    s->last_update_s = dt;
    s->last_gbps = dt > 0 ? (double)s->bytes / dt / 1e9 : 0;
    s->last_commit_time = now;
    if (out) {
        memcpy(out->version, s->version, sizeof out->version);
        out->flush_cache = s->flush_cache;
        out->buckets = s->buckets;
        out->bytes = s->bytes;
        out->seconds = dt;
    }
    pthread_mutex_unlock(&s->mu);
    return RW_OK;
}

/* ------------------------------------------------------------------------------------------ */
/* NCCL group                                                                                   */
/* ------------------------------------------------------------------------------------------ */
rw_status rw_sync_session_init_group(rw_sync_session *s, const uint8_t id[RW_NCCL_ID_BYTES],
                                     int world, int rank, const char *name, double timeout_s,
                                     rw_err *err) {
    if (s->place != RW_PLACE_DEVICE)
        RW_FAIL(
            err, RW_E_UNSUPPORTED,
            "init_weights_update_group: NCCL needs a CUDA weight set (this one is on the host)");
    bool busy = false;
    for (int i = 0; i < NFLIGHT; i++)
        busy |= s->fl[i].busy;
    if (busy)
        RW_FAIL(err, RW_E_BUSY,
                "init_weights_update_group: buckets are in flight on the current group");
    rw_sync_group_destroy(s->group);
    s->group = NULL;
    return rw_sync_group_create(id, world, rank, name, s->device, timeout_s, &s->group, err);
}

rw_sync_group *rw_sync_session_group(rw_sync_session *s, const char *name) {
    if (!s->group) return NULL;
    if (name && name[0] && strcmp(name, rw_sync_group_name(s->group))) return NULL;
    return s->group;
}

/* ------------------------------------------------------------------------------------------ */
/* Disk                                                                                         */
/* ------------------------------------------------------------------------------------------ */
static int by_file_offset(const void *a, const void *b) {
    const rw_st_entry *x = *(const rw_st_entry *const *)a, *y = *(const rw_st_entry *const *)b;
    if (x->file_index != y->file_index) return x->file_index < y->file_index ? -1 : 1;
    return x->begin < y->begin ? -1 : x->begin > y->begin;
}

/* A gap this large between selected tensors starts a new bucket instead of copying it. */
#define DISK_MAX_GAP (1u << 20)
/* Largest disk bucket on a host weight set (its bytes are read into a host buffer of this size
 * at most; larger tensors go as row pieces). */
#define DISK_HOST_BUCKET (64ull << 20)

/* A checkpoint tensor larger than the bucket: row pieces along dim 0 (shard pieces over its bytes
 * in file f, rw_sync_split_step rows each), one bucket each. A failure before the session saw a
 * piece leaves it open (the caller aborts it). */
static rw_status apply_rows(rw_sync_session *s, const rw_st_file *f, const rw_st_entry *e,
                            uint64_t limit, rw_sync_manifest *m, rw_err *err) {
    uint64_t rows = (uint64_t)e->shape[0], bytes = e->end - e->begin;
    uint64_t row = rows ? bytes / rows : 0;
    uint64_t step = rw_sync_split_step(row, limit);
    if (!step)
        RW_FAIL(err, RW_E_RANGE,
                "update_weights_from_disk: %s: one row (%" PRIu64 " bytes) exceeds the bucket "
                "size %" PRIu64 " (begin_update bucket_bytes)",
                e->name, row, limit);
    for (uint64_t r = 0; r < rows;) {
        uint64_t end = rw_sync_split_end(r, rows, step);
        rw_sync_manifest_clear(m);
        RW_CHECK(rw_sync_manifest_add(m, e->name, e->dtype, e->ndim, e->shape, 0, (int64_t)r,
                                      (int64_t)(end - r), RW_PIECE_PLAIN, NULL, err));
        rw_sync_source src = rw_sync_source_file(f, e->begin + r * row, (end - r) * row);
        RW_CHECK(rw_sync_session_apply(s, m, &src, NULL, err));
        r = end;
    }
    return RW_OK;
}

rw_status rw_sync_session_apply_disk(rw_sync_session *s, const char *dir, const char *only,
                                     const rw_sync_begin_args *a, uint64_t *tensors,
                                     uint64_t *bytes, rw_err *err) {
    if (tensors) *tensors = 0;
    if (bytes) *bytes = 0;
    if (!dir || !dir[0]) RW_FAIL(err, RW_E_INVALID_ARG, "update_weights_from_disk: empty path");
    bool implicit = s->state != RW_SYNC_UPDATING;
    rw_ckpt *ck = NULL;
    const rw_st_entry **ents = NULL;
    rw_sync_manifest *m = NULL;
    regex_t re;
    bool have_re = false;
    rw_status st;
    if (only && only[0]) {
        int rc = regcomp(&re, only, REG_EXTENDED | REG_NOSUB);
        if (rc) {
            char msg[128];
            regerror(rc, &re, msg, sizeof msg);
            RW_FAIL(err, RW_E_INVALID_ARG, "update_weights_from_disk: regex '%s': %s", only, msg);
        }
        have_re = true;
    }
    RW_CHECKGOTO(rw_sync_manifest_create(&m, err), st, out);
    RW_CHECKGOTO(rw_ckpt_open(dir, &ck, err), st, out);
    size_t n = rw_ckpt_count(ck), k = 0;
    ents = calloc(n ? n : 1, sizeof *ents);
    if (!ents) {
        st = RW_ERR(err, RW_E_OOM, "update_weights_from_disk: out of memory");
        goto out;
    }
    /* validate every selected tensor before anything is written; the pieces are addressed at a
     * placeholder, never read (tensor bytes are only read with pread, bucket by bucket) */
    static const uint8_t not_read[1];
    for (size_t i = 0; i < n; i++) {
        const rw_st_entry *e = rw_ckpt_at(ck, i);
        if (have_re && regexec(&re, e->name, 0, NULL, 0) != 0) continue;
        rw_sync_manifest_clear(m);
        rw_sync_source one;
        RW_CHECKGOTO(rw_sync_bucket_from_entries(rw_ckpt_file(ck, (size_t)e->file_index), &e, 1, m,
                                                 &one, err),
                     st, out);
        rw_piece p = rw_sync_tensor_piece(rw_sync_manifest_at(m, 0), not_read, RW_PLACE_HOST);
        st = rw_wset_validate_piece(s->ws, &p, err);
        if (st != RW_OK) {
            rw_err_prefix(err, "update_weights_from_disk: %s", dir);
            goto out;
        }
        ents[k++] = e;
    }
    if (k == 0) {
        st = RW_ERR(err, RW_E_NOT_FOUND, "update_weights_from_disk: %s: no tensor selected%s%s",
                    dir, have_re ? " by " : "", have_re ? only : "");
        goto out;
    }
    qsort(ents, k, sizeof *ents, by_file_offset);
    if (implicit) {
        char ver[RW_SYNC_MAX_VERSION + 1];
        rw_sync_begin_args b = a ? *a : (rw_sync_begin_args){0};
        if (!b.version || !b.version[0]) {
            snprintf(ver, sizeof ver, "disk:%s", dir);
            for (char *c = ver; *c; c++)
                if (*c < 0x20 || *c > 0x7e) *c = '?';
            b.version = ver;
        }
        RW_CHECKGOTO(rw_sync_session_begin(s, &b, err), st, out);
    }
    uint64_t limit = s->staging_bytes ? s->staging_bytes : RW_SYNC_DEFAULT_BUCKET;
    if (s->place == RW_PLACE_HOST && limit > DISK_HOST_BUCKET) limit = DISK_HOST_BUCKET;
    for (size_t i = 0; i < k;) {
        /* a bucket: consecutive tensors of one file, one byte range of it */
        const rw_st_entry *first = ents[i];
        const rw_st_file *file = rw_ckpt_file(ck, (size_t)first->file_index);
        if (first->end - first->begin > limit) {
            st = apply_rows(s, file, first, limit, m, err);
            if (st != RW_OK) {
                /* aborts the session unless applying a piece did already */
                st = rw_sync_session_fail(s, st, err);
                goto out;
            }
            if (tensors) (*tensors)++;
            if (bytes) *bytes += first->end - first->begin;
            i++;
            continue;
        }
        size_t j = i + 1;
        uint64_t end = first->end;
        while (j < k) {
            const rw_st_entry *e = ents[j];
            /* a tensor misaligned for its dtype relative to the bucket starts a new one */
            if (e->file_index != first->file_index || e->end - first->begin > limit ||
                e->begin > end + DISK_MAX_GAP ||
                (e->begin - first->begin) % rw_dtype_size(e->dtype))
                break;
            end = e->end;
            j++;
        }
        rw_sync_source src;
        RW_CHECKGOTO(rw_sync_bucket_from_entries(file, &ents[i], j - i, m, &src, err), st,
                     fail_open);
        /* apply aborts the session itself on failure */
        st = rw_sync_session_apply(s, m, &src, NULL, err);
        if (st != RW_OK) goto out;
        if (tensors) *tensors += j - i;
        if (bytes) *bytes += end - first->begin;
        i = j;
    }
    /* the files are closed below: nothing may still read them (every read has returned by
     * now; this waits for the device work queued after them) */
    st = wait_all(s, err);
    if (st != RW_OK) {
        st = fail_session(s, st, err);
        goto out;
    }
    if (implicit) st = rw_sync_session_commit(s, NULL, err);
    goto out;
fail_open:
    st = fail_session(s, st, err);
out:
    rw_sync_manifest_destroy(m);
    free(ents);
    rw_ckpt_close(ck);
    /* the host buffer of file buckets is not kept between loads */
    free(s->bounce);
    s->bounce = NULL;
    s->bounce_cap = 0;
    if (have_re) regfree(&re);
    return st;
}
