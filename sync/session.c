/* session.c - the update session of one worker rank: begin -> buckets -> commit | abort, with the
 * protocol's invariants (every manifest validated before any byte is written; a failed or
 * aborted session leaves the previous version intact or marks the weights incomplete; commit
 * switches the version atomically for generation), and the bucket pipeline.
 *
 * Pipeline on a device weight set (two staging buffers, two streams):
 *
 *   comm stream:     [wait done[s]] recv k -> staging[s] [rec recvd[s]]   recv k+1 -> staging[s^1]
 *   compute stream:                       [wait recvd[s]] apply k (restore/slice/quantize/pack)
 *                                                                         [rec done[s]]
 *
 * `recv` is an NCCL broadcast, or for a host source (ZeroMQ frame, mmap'd file: pageable memory)
 * copies through pinned chunks: a few threads copy one chunk from the source while the previous
 * chunks' host -> device copies run on the comm stream (UP_NBUF chunks of 32 MiB in turn). Apply is
 * one rw_wset_apply_batch per bucket, reading the pieces where they lie in staging: no canonical
 * copy of the model, no host round trip. At most two buckets are in flight; reusing a slot waits
 * (on the host, bounded by the session timeout) for the bucket that used it two steps ago, so the
 * receive of bucket k+1 overlaps the apply of bucket k. On a host weight set the same sequence runs
 * with the source's host bytes as the staging buffer (ZeroMQ frames and mmaps are host memory
 * already), synchronously.
 *
 * A checkpoint tensor larger than the bucket (the 30B-A3B embedding and lm_head are 622 MB) is
 * applied as row pieces (shard dim 0), each a bucket of its own.
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
    bool busy[2];         /* slot holds a bucket whose apply may still run */
    double busy_t0[2];    /* when it was enqueued */
    bool busy_nccl[2];    /* its receive is an NCCL broadcast (a hung peer can stall it) */
    uint64_t slot_next;   /* bucket counter across the session; slot = counter % 2 */
    double hard_deadline; /* when non-zero, waits give up at this rw_now() (abort's grace) */
#ifdef RW_HAVE_CUDA
    cudaStream_t comm, compute;
    cudaEvent_t recvd[2], done[2];
    /* host sources: pinned chunks (allocated at the first one) and the copier filling them */
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
        RW_CUDA_TRY(err, cudaStreamCreateWithFlags(&s->comm, cudaStreamNonBlocking));
        RW_CUDA_TRY(err, cudaStreamCreateWithFlags(&s->compute, cudaStreamNonBlocking));
        for (int i = 0; i < 2; i++) {
            RW_CUDA_TRY(err, cudaEventCreateWithFlags(&s->recvd[i], cudaEventDisableTiming));
            RW_CUDA_TRY(err, cudaEventCreateWithFlags(&s->done[i], cudaEventDisableTiming));
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

/* Waits for slot i's bucket (bounded). Returns RW_E_TIMEOUT / RW_E_NCCL / RW_E_CUDA. A stuck
 * NCCL receive gets its communicator aborted, which ends the kernel, so the slot drains. */
static rw_status wait_slot(rw_sync_session *s, int i, rw_err *err) {
    if (!s->busy[i]) return RW_OK;
    for (;;) {
        cudaError_t e = cudaEventQuery(s->done[i]);
        if (e == cudaSuccess) break;
        if (e != cudaErrorNotReady) {
            cudaGetLastError();
            s->busy[i] = false;
            RW_FAIL(err, RW_E_CUDA, "sync session: bucket in slot %d failed on the device: %s", i,
                    cudaGetErrorString(e));
        }
        if (s->busy_nccl[i] && s->group) {
            rw_status st = rw_sync_group_check(s->group, err);
            if (st != RW_OK) {
                cudaEventSynchronize(s->done[i]); /* the abort ended the kernel */
                s->busy[i] = false;
                return st;
            }
        }
        if (rw_now() - s->busy_t0[i] > s->timeout_s ||
            (s->hard_deadline > 0 && rw_now() > s->hard_deadline)) {
            if (s->busy_nccl[i] && s->group) {
                rw_sync_group_abort(s->group);
                cudaEventSynchronize(s->done[i]);
                s->busy[i] = false;
                RW_FAIL(err, RW_E_TIMEOUT,
                        "sync session: NCCL receive of group '%s' did not finish within %.1f s "
                        "(trainer gone?): communicator aborted, re-create the group",
                        rw_sync_group_name(s->group), s->timeout_s);
            }
            RW_FAIL(err, RW_E_TIMEOUT,
                    "sync session: device work of a bucket did not finish within %.1f s",
                    s->timeout_s);
        }
        struct timespec ts = {0, 20000};
        nanosleep(&ts, NULL);
    }
    s->busy[i] = false;
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

/* Host bytes -> device staging on the comm stream through the pinned chunks: the copier fills
 * chunk i while the copies of the chunks before it run. Returns once every byte has left
 * `src` (the source may be released then); the device copies complete in stream order. */
static rw_status upload_host(rw_sync_session *s, uint8_t *dst, const uint8_t *src, uint64_t nb,
                             rw_err *err) {
    RW_CHECK(pin_init(s, err));
    const size_t chunk = s->pin_bytes;
    for (uint64_t off = 0; off < nb; off += chunk) {
        size_t n = nb - off < chunk ? (size_t)(nb - off) : chunk;
        int i = s->pin_next;
        s->pin_next = (i + 1) % UP_NBUF;
        if (s->pin_used[i]) RW_CHECK(wait_comm(s, s->pin_free[i], err));
        rw_sync_copier_run(s->copier, s->pin[i], src + off, n);
        RW_CUDA_TRY(err, cudaMemcpyAsync(dst + off, s->pin[i], n, cudaMemcpyHostToDevice, s->comm));
        RW_CUDA_TRY(err, cudaEventRecord(s->pin_free[i], s->comm));
        s->pin_used[i] = true;
    }
    return RW_OK;
}
#endif

/* Waits for every bucket in flight; the first error wins but both slots are drained. */
static rw_status wait_all(rw_sync_session *s, rw_err *err) {
#ifdef RW_HAVE_CUDA
    rw_status st = RW_OK;
    for (int i = 0; i < 2; i++) {
        rw_status si = wait_slot(s, i, st == RW_OK ? err : NULL);
        if (st == RW_OK) st = si;
    }
    return st;
#else
    (void)s;
    (void)err;
    return RW_OK;
#endif
}

static void free_staging(rw_sync_session *s) {
#ifdef RW_HAVE_CUDA
    if (s->staging[0] || s->pin[0]) cudaSetDevice(s->device);
    for (int i = 0; i < 2; i++) {
        if (s->staging[i]) cudaFree(s->staging[i]);
        s->staging[i] = NULL;
    }
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
        for (int i = 0; i < 2; i++) {
            cudaEventDestroy(s->recvd[i]);
            cudaEventDestroy(s->done[i]);
        }
        for (int i = 0; i < UP_NBUF; i++)
            if (s->pin_free[i]) cudaEventDestroy(s->pin_free[i]);
        cudaStreamDestroy(s->comm);
        cudaStreamDestroy(s->compute);
    }
    rw_sync_copier_destroy(s->copier);
#endif
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
    rw_wset_mark_clear(s->ws);
    pthread_mutex_lock(&s->mu);
    s->state = RW_SYNC_UPDATING;
    rw_sync_strlcpy(s->new_version, a->version, sizeof s->new_version);
    s->flush_cache = a->flush_cache;
    s->buckets = s->bytes = 0;
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

rw_status rw_sync_session_poll(rw_sync_session *s, rw_err *err) {
    if (s->state != RW_SYNC_UPDATING) return RW_OK;
    double now = rw_now();
#ifdef RW_HAVE_CUDA
    for (int i = 0; i < 2; i++) {
        if (!s->busy[i]) continue;
        cudaError_t e = cudaEventQuery(s->done[i]);
        if (e == cudaSuccess) {
            s->busy[i] = false;
            continue;
        }
        rw_status st = RW_OK;
        if (e != cudaErrorNotReady) {
            s->busy[i] = false;
            st = RW_ERR(err, RW_E_CUDA, "sync session: bucket failed on the device: %s",
                        cudaGetErrorString(e));
        } else if (s->busy_nccl[i] && s->group) {
            st = rw_sync_group_check(s->group, err);
        }
        if (st == RW_OK && now - s->busy_t0[i] > s->timeout_s) st = wait_slot(s, i, err);
        if (st != RW_OK) return fail_session(s, st, err);
    }
    if (s->busy[0] || s->busy[1]) return RW_OK;
#endif
    if (now - s->t_active > s->timeout_s) {
        rw_status st =
            RW_ERR(err, RW_E_TIMEOUT, "sync session: no update command for %.1f s (timeout %.1f s)",
                   now - s->t_active, s->timeout_s);
        return fail_session(s, st, err);
    }
    return RW_OK;
}

/* Everything that can be checked before a byte is written. */
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
    if (s->place == RW_PLACE_HOST && !src->host)
        RW_FAIL(err, RW_E_UNSUPPORTED,
                "update_weights: the %s transport needs a CUDA weight set (this one is on the "
                "host)",
                src->name);
    /* pieces point where they will be applied from (host bytes, or the staging slot the
     * receive will fill); nothing is read here */
    const void *base = s->place == RW_PLACE_HOST ? src->host : s->staging[s->slot_next % 2];
    for (size_t i = 0; i < rw_sync_manifest_count(m); i++) {
        rw_piece p = rw_sync_tensor_piece(rw_sync_manifest_at(m, i), base, s->place);
        RW_CHECK(rw_wset_validate_piece(s->ws, &p, err));
    }
    return RW_OK;
}

/* One batch per bucket: the weight set turns it into a handful of kernel launches on a device
 * (rw_wset_apply_batch), so per-tensor launch overhead does not scale with the tensor count. */
static rw_status apply_pieces(rw_sync_session *s, const rw_sync_manifest *m, const void *base,
                              rw_place place, rw_stream stream, rw_err *err) {
    size_t n = rw_sync_manifest_count(m);
    if (n == 0) return RW_OK;
    rw_piece *p = malloc(n * sizeof *p);
    if (!p) RW_FAIL(err, RW_E_OOM, "update_weights: out of memory for %zu pieces", n);
    for (size_t i = 0; i < n; i++)
        p[i] = rw_sync_tensor_piece(rw_sync_manifest_at(m, i), base, place);
    s->written = true;
    rw_status st = rw_wset_apply_batch(s->ws, p, n, stream, err);
    free(p);
    return st;
}

rw_status rw_sync_session_apply(rw_sync_session *s, const rw_sync_manifest *m, rw_sync_source *src,
                                rw_sync_bucket_result *out, rw_err *err) {
    if (out) memset(out, 0, sizeof *out);
    if (s->state != RW_SYNC_UPDATING)
        RW_FAIL(err, RW_E_STATE, "update_weights: no update session is open (begin_update first)");
    s->t_active = rw_now();
    rw_status st = validate_bucket(s, m, src, err);
    if (st != RW_OK) return fail_session(s, st, err);
    uint64_t nb = rw_sync_manifest_bytes(m), idx = s->slot_next++;
    bool applied = false;
    if (s->place == RW_PLACE_HOST) {
        st = apply_pieces(s, m, src->host, RW_PLACE_HOST, NULL, err);
        applied = true;
    } else {
#ifdef RW_HAVE_CUDA
        int slot = (int)(idx % 2);
        bool nccl = src->host == NULL;
        /* the apply that last read this slot (two buckets ago) is done: waited for on the host
         * (bounded), and ordered on the device too. Only this slot's: a wait for the other
         * slot's apply would hold the receive of this bucket until the previous bucket is
         * applied, and nothing would overlap. */
        RW_CHECKGOTO(wait_slot(s, slot, err), st, fail);
        RW_CUDA_TRYGOTO(err, cudaSetDevice(s->device), st, fail);
        RW_CUDA_TRYGOTO(err, cudaStreamWaitEvent(s->comm, s->done[slot], 0), st, fail);
        if (src->host)
            RW_CHECKGOTO(upload_host(s, s->staging[slot], src->host, nb, err), st, fail);
        else
            RW_CHECKGOTO(src->read(src, s->staging[slot], RW_PLACE_DEVICE, nb, s->comm, err), st,
                         fail);
        RW_CUDA_TRYGOTO(err, cudaEventRecord(s->recvd[slot], s->comm), st, fail);
        RW_CUDA_TRYGOTO(err, cudaStreamWaitEvent(s->compute, s->recvd[slot], 0), st, fail);
        s->busy[slot] = true;
        s->busy_t0[slot] = rw_now();
        s->busy_nccl[slot] = nccl;
        st = apply_pieces(s, m, s->staging[slot], RW_PLACE_DEVICE, s->compute, err);
        /* recorded after a failed apply too: what it queued reads the slot until then */
        cudaError_t ce = cudaEventRecord(s->done[slot], s->compute);
        if (st != RW_OK) goto fail;
        if (ce != cudaSuccess) {
            cudaGetLastError();
            st =
                RW_ERR(err, RW_E_CUDA, "sync session: cudaEventRecord: %s", cudaGetErrorString(ce));
            goto fail;
        }
#else
        st = RW_ERR(err, RW_E_NO_DEVICE, "update_weights: device weight set without CUDA");
#endif
    }
#ifdef RW_HAVE_CUDA
fail:
#endif
    if (st != RW_OK) return fail_session(s, st, err);
    pthread_mutex_lock(&s->mu);
    s->buckets++;
    s->bytes += nb;
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
    rw_status st = wait_all(s, err);
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
    if (s->busy[0] || s->busy[1])
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

/* A checkpoint tensor larger than the bucket: row pieces along dim 0 (shard pieces over its bytes
 * in the mapping, rw_sync_split_step rows each), one bucket each. A failure before the session
 * saw a piece leaves it open (the caller aborts it). */
static rw_status apply_rows(rw_sync_session *s, const rw_st_entry *e, uint64_t limit,
                            rw_sync_manifest *m, rw_err *err) {
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
        rw_sync_source src =
            rw_sync_source_host("disk", (const uint8_t *)e->data + r * row, (end - r) * row);
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
    /* validate every selected tensor before anything is written */
    for (size_t i = 0; i < n; i++) {
        const rw_st_entry *e = rw_ckpt_at(ck, i);
        if (have_re && regexec(&re, e->name, 0, NULL, 0) != 0) continue;
        rw_sync_manifest_clear(m);
        rw_sync_source one;
        RW_CHECKGOTO(rw_sync_bucket_from_entries(&e, 1, m, &one, err), st, out);
        rw_piece p = rw_sync_tensor_piece(rw_sync_manifest_at(m, 0), e->data, RW_PLACE_HOST);
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
    for (size_t i = 0; i < k;) {
        /* a bucket: consecutive tensors of one file, one byte range of its mapping */
        const rw_st_entry *first = ents[i];
        if (first->end - first->begin > limit) {
            st = apply_rows(s, first, limit, m, err);
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
        RW_CHECKGOTO(rw_sync_bucket_from_entries(&ents[i], j - i, m, &src, err), st, fail_open);
        /* apply aborts the session itself on failure */
        st = rw_sync_session_apply(s, m, &src, NULL, err);
        if (st != RW_OK) goto out;
        if (tensors) *tensors += j - i;
        if (bytes) *bytes += end - first->begin;
        i = j;
    }
    /* the mapping is closed below: nothing may still read it */
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
    if (have_re) regfree(&re);
    return st;
}
