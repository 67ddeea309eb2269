/* pipeline.c - the device side of an update session: two staging buffers, a ring of bucket
 * records in flight, two streams, and the host -> device upload through pinned chunks.
 *
 * Pipeline on a device weight set (two staging buffers s = k % 2, two streams, a ring of NFLIGHT
 * bucket records f = k % NFLIGHT, each with its op table buffers and two events):
 *
 *   comm stream:     [wait done[k-2]] recv k -> staging[s] [rec recvd[f]]  recv k+1 -> staging[s^1]
 *   compute stream:      [wait recvd[f]] apply k (slice/quantize/pack) [rec done[f]]
 *
 * `recv` is an NCCL broadcast, or for a host source (ZeroMQ frame: pageable memory) or a file
 * source (disk: pread) copies through pinned chunks: a few threads fill one chunk from the
 * source (memcpy, or one pread per thread) while the previous chunks' host -> device copies run
 * on the comm stream (UP_NBUF chunks of 32 MiB in turn). Apply is one weight-set batch per bucket
 * reading the pieces where they lie in staging (no canonical copy of the model, no host round
 * trip), in two phases (rw_wset_batch_prepare / _launch): the host work (validation, ops, the op
 * table) is done and its buffers exist BEFORE the receive is posted, and after it only
 * asynchronous calls follow (event record / wait, a table copy, 1-3 kernel launches). The reason:
 * an NCCL receive posted before this rank replies waits for a broadcast the trainer only sends
 * after the reply, so any host wait, allocation or free that synchronizes the device between
 * posting it and replying would deadlock until the timeout; and a bucket refused by the host work
 * must not leave a receive behind.
 *
 * Reuse of a staging buffer is ordered on the device only (the receive of k waits for apply k-2
 * on the comm stream). The host waits for nothing of the buckets in flight, except, before
 * bucket k reuses record f, for bucket k - NFLIGHT (bounded by the session timeout; NCCL aware):
 * so the control thread answers a trainer up to NFLIGHT - 2 buckets ahead of the wire, and the
 * per-bucket request / reply round trip and host work overlap the broadcasts instead of adding to
 * them. Device memory stays two buckets (target S5, docs/TARGETS.md).
 *
 * A bucket whose pieces cover quantization blocks only partly needs its bytes on the host to
 * stage them; over NCCL they arrive after the reply, so such a bucket's apply is deferred: its
 * receive is posted, and it is applied at the start of the next session command (apply, commit;
 * the bytes are there by then).
 *
 * Every CUDA failure is mapped by core/cuda_check.h: a failed allocation is RW_E_OOM, any other
 * RW_E_CUDA, and the runtime's last error is cleared. */
#include "session_internal.h"

#include <inttypes.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#ifdef RW_HAVE_CUDA
#include "cuda_check.h"

#define NFLIGHT RW_SYNC_NFLIGHT
#define UP_NBUF RW_SYNC_UP_NBUF


/* ------------------------------------------------------------------------------------------ */
/* Device resources                                                                             */
/* ------------------------------------------------------------------------------------------ */
static void staging_free(rw_sync_session *s) {
    for (int i = 0; i < 2; i++) {
        if (s->staging[i]) cudaFree(s->staging[i]);
        s->staging[i] = NULL;
    }
    s->staging_bytes = 0;
}

rw_status rw_sync_pipe_reserve(rw_sync_session *s, uint64_t bucket_bytes, rw_err *err) {
    RW_CUDA_CHECK(err, cudaSetDevice(s->device));
    if (!s->comm) {
        /* the receive stream gets the highest priority: when a receive and the previous bucket's
         * apply become ready together, the block scheduler gives the NCCL kernel its SMs first
         * (the apply's large grid would otherwise hold the wire up for its duration) */
        int lo = 0, hi = 0;
        if (cudaDeviceGetStreamPriorityRange(&lo, &hi) != cudaSuccess) {
            cudaGetLastError();
            lo = hi = 0;
        }
        RW_CUDA_CHECK(err, cudaStreamCreateWithPriority(&s->comm, cudaStreamNonBlocking, hi));
        RW_CUDA_CHECK(err, cudaStreamCreateWithPriority(&s->compute, cudaStreamNonBlocking, lo));
        for (int i = 0; i < NFLIGHT; i++) {
            RW_CUDA_CHECK(err, cudaEventCreateWithFlags(&s->fl[i].recvd, cudaEventDisableTiming));
            RW_CUDA_CHECK(err, cudaEventCreateWithFlags(&s->fl[i].done, cudaEventDisableTiming));
        }
    }
    if (s->staging[0] && s->staging_bytes >= bucket_bytes) return RW_OK;
    staging_free(s);
    for (int i = 0; i < 2; i++) {
        cudaError_t e = cudaMalloc(&s->staging[i], bucket_bytes);
        if (e != cudaSuccess) {
            s->staging[i] = NULL;
            staging_free(s);
            return rw_sync_cuda_fail(err, e, __FILE__, __LINE__,
                                     "sync session: two staging buffers of %" PRIu64
                                     " bytes on device %d",
                                     bucket_bytes, s->device);
        }
    }
    s->staging_bytes = bucket_bytes;
    return RW_OK;
}

/* Frees the op table buffers of every record (nothing may be in flight). */
static void tables_free(rw_sync_session *s) {
    for (int i = 0; i < NFLIGHT; i++) {
        rw_sync_flight *f = &s->fl[i];
        if (f->htab) cudaFreeHost(f->htab);
        if (f->dtab) cudaFree(f->dtab);
        f->htab = f->dtab = NULL;
        f->tab_cap = 0;
    }
}

/* Called before the bucket's receive is posted (or for a host source, whose upload needs no
 * peer): cudaFree / cudaFreeHost may synchronize the device, which is harmless only then. Grown
 * geometrically and kept, so steady state allocates nothing. */
rw_status rw_sync_pipe_table_reserve(rw_sync_session *s, rw_sync_flight *f, size_t bytes,
                                     rw_err *err) {
    if (f->tab_cap >= bytes) return RW_OK;
    size_t cap = f->tab_cap ? f->tab_cap : (256u << 10);
    while (cap < bytes)
        cap = cap > SIZE_MAX / 2 ? bytes : cap * 2;
    if (f->htab) cudaFreeHost(f->htab);
    if (f->dtab) cudaFree(f->dtab);
    f->htab = f->dtab = NULL;
    f->tab_cap = 0;
    cudaError_t e = cudaMallocHost(&f->htab, cap);
    if (e == cudaSuccess) e = cudaMalloc(&f->dtab, cap);
    if (e != cudaSuccess) {
        if (f->htab) cudaFreeHost(f->htab);
        f->htab = f->dtab = NULL;
        return rw_sync_cuda_fail(err, e, __FILE__, __LINE__,
                                 "sync session: op table buffers of %zu bytes", cap);
    }
    f->tab_cap = cap;
    (void)s;
    return RW_OK;
}

/* Waits for record f's bucket (bounded): its apply, or for a deferred one its receive. Returns
 * RW_E_TIMEOUT / RW_E_NCCL / RW_E_CUDA. A stuck NCCL receive gets its communicator aborted,
 * which ends the kernel, so the record drains. */
static rw_status wait_flight(rw_sync_session *s, rw_sync_flight *f, rw_err *err) {
    if (!f->busy) return RW_OK;
    cudaEvent_t ev = f->deferred ? f->recvd : f->done;
    for (;;) {
        cudaError_t e = cudaEventQuery(ev);
        if (e == cudaSuccess) break;
        if (e != cudaErrorNotReady) {
            f->busy = false;
            return rw_sync_cuda_fail(err, e, __FILE__, __LINE__,
                                     "sync session: bucket %" PRIu64 " failed on the device",
                                     f->index);
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
        rw_sync_nap();
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

rw_status rw_sync_pipe_pin_reserve(rw_sync_session *s, size_t chunk_bytes, rw_err *err) {
    if (s->pin[0]) return RW_OK;
    if (!s->copier) RW_CHECK(rw_sync_copier_create(copy_threads(), &s->copier, err));
    s->pin_bytes = chunk_bytes;
    if (!s->pin_bytes) {
        s->pin_bytes = RW_SYNC_UP_CHUNK;
        const char *v = getenv("RW_SYNC_PIN_CHUNK");
        if (v && v[0]) {
            long long n = atoll(v);
            if (n >= 4096 && n <= (1ll << 30)) s->pin_bytes = (size_t)n;
        }
    }
    for (int i = 0; i < UP_NBUF; i++) {
        if (!s->pin_free[i])
            RW_CUDA_CHECK(err, cudaEventCreateWithFlags(&s->pin_free[i], cudaEventDisableTiming));
        cudaError_t e = cudaMallocHost(&s->pin[i], s->pin_bytes);
        if (e != cudaSuccess) {
            s->pin[i] = NULL;
            pin_free_all(s);
            return rw_sync_cuda_fail(err, e, __FILE__, __LINE__,
                                     "sync session: pinned staging chunk of %zu bytes",
                                     s->pin_bytes);
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
        if (e != cudaErrorNotReady)
            return rw_sync_cuda_fail(err, e, __FILE__, __LINE__,
                                     "sync session: host -> device copy failed");
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
        rw_sync_nap();
    }
}

/* Host or file source -> device staging on the comm stream through the pinned chunks: the
 * copier fills chunk i (memcpy from src->host, or preads through src->read_at) while the copies
 * of the chunks before it run. Returns once every byte has left `src` (the source may be released
 * then); the device copies complete in stream order. A failed read returns its error; the
 * chunks copied before it stay queued (they only write staging). */
static rw_status upload_host(rw_sync_session *s, uint8_t *dst, const rw_sync_source *src,
                             uint64_t nb, rw_err *err) {
    RW_CHECK(rw_sync_pipe_pin_reserve(s, 0, err));
    const size_t chunk = s->pin_bytes;
    for (uint64_t off = 0; off < nb; off += chunk) {
        size_t n = nb - off < chunk ? (size_t)(nb - off) : chunk;
        int i = s->pin_next;
        s->pin_next = (i + 1) % UP_NBUF;
        if (s->pin_used[i]) RW_CHECK(wait_comm(s, s->pin_free[i], err));
        if (src->kind == RW_SYNC_SRC_HOST)
            rw_sync_copier_run(s->copier, s->pin[i], (const uint8_t *)src->host + off, n);
        else
            RW_CHECK(rw_sync_copier_read(s->copier, s->pin[i], src, off, n, err));
        RW_CUDA_CHECK(err,
                      cudaMemcpyAsync(dst + off, s->pin[i], n, cudaMemcpyHostToDevice, s->comm));
        RW_CUDA_CHECK(err, cudaEventRecord(s->pin_free[i], s->comm));
        s->pin_used[i] = true;
    }
    return RW_OK;
}

rw_status rw_sync_pipe_wait_all(rw_sync_session *s, rw_err *err) {
    rw_status st = RW_OK;
    for (uint64_t k = 0; k < NFLIGHT; k++) {
        rw_sync_flight *f = &s->fl[(s->slot_next + k) % NFLIGHT];
        rw_status si = wait_flight(s, f, st == RW_OK ? err : NULL);
        if (st == RW_OK) st = si;
        f->busy = f->deferred = false;
    }
    s->have_deferred = false;
    return st;
}

bool rw_sync_pipe_busy(const rw_sync_session *s) {
    bool busy = false;
    for (int i = 0; i < NFLIGHT; i++)
        busy |= s->fl[i].busy;
    return busy;
}

void rw_sync_pipe_free_staging(rw_sync_session *s) {
    if (s->staging[0] || s->pin[0] || s->fl[0].tab_cap) cudaSetDevice(s->device);
    staging_free(s);
    tables_free(s);
    pin_free_all(s);
}

void rw_sync_pipe_destroy(rw_sync_session *s) {
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
}

/* ------------------------------------------------------------------------------------------ */
/* Buckets                                                                                      */
/* ------------------------------------------------------------------------------------------ */
/* Launches the prepared batch of record f on the compute stream (after its receive) and records
 * its completion. Only asynchronous calls: it may run while f's NCCL receive waits for the
 * trainer. */
static rw_status launch_flight(rw_sync_session *s, rw_sync_flight *f, rw_err *err) {
    rw_status st = rw_wset_batch_launch(s->ws, s->batch, f->htab, f->dtab, s->compute, err);
    /* recorded after a failed launch too: what it queued reads the staging buffer until then */
    cudaError_t ce = cudaEventRecord(f->done, s->compute);
    f->deferred = false;
    if (st != RW_OK) return st;
    if (ce != cudaSuccess)
        return rw_sync_cuda_fail(err, ce, __FILE__, __LINE__, "sync session: cudaEventRecord");
    return RW_OK;
}

rw_status rw_sync_pipe_apply_deferred(rw_sync_session *s, rw_err *err) {
    if (!s->have_deferred) return RW_OK;
    uint64_t k = s->deferred_index;
    rw_sync_flight *f = &s->fl[k % NFLIGHT];
    double t0 = rw_sync_mark(s, RW_SYNC_PH_DEFERRED, NULL);
    RW_CUDA_CHECK(err, cudaSetDevice(s->device));
    RW_CHECK(wait_flight(s, f, err)); /* its receive */
    s->have_deferred = false;
    RW_CHECK(rw_sync_make_pieces(s, s->dm, s->staging[k % 2], RW_PLACE_DEVICE, err));
    size_t n = rw_sync_manifest_count(s->dm);
    bool again = false;
    /* reads copy parts of staging to the host on the compute stream, which holds only this
     * bucket's wait for its (complete) receive and earlier applies */
    RW_CHECK(rw_wset_batch_prepare(s->ws, s->pieces, n, false, s->compute, s->batch, &again, err));
    RW_CHECK(rw_sync_pipe_table_reserve(s, f, rw_wset_batch_table_bytes(s->batch), err));
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

/* Order: wait for the record's previous bucket; host work and buffers; receive; launch. */
rw_status rw_sync_pipe_apply(rw_sync_session *s, const rw_sync_manifest *m, rw_sync_source *src,
                             rw_err *err) {
    uint64_t k = s->slot_next, nb = rw_sync_manifest_bytes(m);
    size_t n = rw_sync_manifest_count(m);
    rw_sync_flight *f = &s->fl[k % NFLIGHT];
    const bool nccl = src->kind == RW_SYNC_SRC_NCCL;
    RW_CUDA_CHECK(err, cudaSetDevice(s->device));
    RW_CHECK(rw_sync_batch_ready(s, err));
    /* 1. the record's previous user, bucket k - NFLIGHT (on a steady stream long done) */
    rw_sync_mark(s, RW_SYNC_PH_WAIT, &s->stats.validate_s);
    RW_CHECK(wait_flight(s, f, err));
    f->busy = f->deferred = false;
    /* 2. host work, with no read of the bytes (they are not there yet) */
    rw_sync_mark(s, RW_SYNC_PH_PREPARE, &s->stats.wait_s);
    bool needs_reads = false;
    s->written = true; /* prepare records what the batch writes */
    RW_CHECK(
        rw_wset_batch_prepare(s->ws, s->pieces, n, true, s->compute, s->batch, &needs_reads, err));
    rw_sync_mark(s, RW_SYNC_PH_BUFFERS, &s->stats.prepare_s);
    if (!needs_reads)
        RW_CHECK(rw_sync_pipe_table_reserve(s, f, rw_wset_batch_table_bytes(s->batch), err));
    /* 3. the receive into staging[k % 2], after the apply that last read it (bucket k - 2) */
    rw_sync_mark(s, RW_SYNC_PH_RECV, &s->stats.buffers_s);
    if (k >= 2) {
        rw_sync_flight *prev = &s->fl[(k - 2) % NFLIGHT];
        /* bucket k - 2's apply is launched (a deferred one is applied before the next bucket
         * starts), so its done event is recorded */
        RW_CUDA_CHECK(err, cudaStreamWaitEvent(s->comm, prev->done, 0));
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
    RW_CUDA_CHECK(err, cudaEventRecord(f->recvd, s->comm));
    RW_CUDA_CHECK(err, cudaStreamWaitEvent(s->compute, f->recvd, 0));
    rw_sync_mark(s, RW_SYNC_PH_LAUNCH, &s->stats.recv_s);
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
            RW_CHECK(rw_sync_pipe_table_reserve(s, f, rw_wset_batch_table_bytes(s->batch), err));
        }
        RW_CHECK(launch_flight(s, f, err));
    }
    rw_sync_mark(s, RW_SYNC_PH_IDLE, &s->stats.launch_s);
    return RW_OK;
}

rw_status rw_sync_pipe_poll(rw_sync_session *s, bool *active, rw_err *err) {
    *active = false;
    double now = rw_now();
    for (int i = 0; i < NFLIGHT; i++) {
        rw_sync_flight *f = &s->fl[i];
        if (!f->busy) continue;
        cudaError_t e = cudaEventQuery(f->deferred ? f->recvd : f->done);
        if (e == cudaSuccess) {
            if (!f->deferred) f->busy = false;
            continue;
        }
        rw_status st = RW_OK;
        if (e != cudaErrorNotReady) {
            f->busy = false;
            st = rw_sync_cuda_fail(err, e, __FILE__, __LINE__,
                                   "sync session: bucket %" PRIu64 " failed on the device",
                                   f->index);
        } else if (f->nccl && s->group) {
            st = rw_sync_group_check(s->group, err);
        }
        if (st == RW_OK && now - f->t0 > s->timeout_s) st = wait_flight(s, f, err);
        if (st != RW_OK) return st;
        *active = true;
    }
    /* a deferred bucket whose bytes are in: apply it now rather than at the next command */
    if (s->have_deferred) {
        rw_sync_flight *f = &s->fl[s->deferred_index % NFLIGHT];
        if (cudaEventQuery(f->recvd) == cudaSuccess) RW_CHECK(rw_sync_pipe_apply_deferred(s, err));
        *active = true;
    }
    return RW_OK;
}

#else /* no CUDA: host weight sets only */

rw_status rw_sync_pipe_reserve(rw_sync_session *s, uint64_t bucket_bytes, rw_err *err) {
    (void)s;
    (void)bucket_bytes;
    RW_FAIL(err, RW_E_NO_DEVICE, "begin_update: device weight set in a build without CUDA");
}
rw_status rw_sync_pipe_table_reserve(rw_sync_session *s, rw_sync_flight *f, size_t bytes,
                                     rw_err *err) {
    (void)s;
    (void)f;
    (void)bytes;
    RW_FAIL(err, RW_E_NO_DEVICE, "sync session: op tables in a build without CUDA");
}
rw_status rw_sync_pipe_pin_reserve(rw_sync_session *s, size_t chunk_bytes, rw_err *err) {
    (void)s;
    (void)chunk_bytes;
    RW_FAIL(err, RW_E_NO_DEVICE, "sync session: pinned chunks in a build without CUDA");
}
rw_status rw_sync_pipe_apply(rw_sync_session *s, const rw_sync_manifest *m, rw_sync_source *src,
                             rw_err *err) {
    (void)s;
    (void)m;
    (void)src;
    RW_FAIL(err, RW_E_NO_DEVICE, "update_weights: device weight set without CUDA");
}
rw_status rw_sync_pipe_apply_deferred(rw_sync_session *s, rw_err *err) {
    (void)s;
    (void)err;
    return RW_OK;
}
rw_status rw_sync_pipe_wait_all(rw_sync_session *s, rw_err *err) {
    (void)s;
    (void)err;
    return RW_OK;
}
rw_status rw_sync_pipe_poll(rw_sync_session *s, bool *active, rw_err *err) {
    (void)s;
    (void)err;
    *active = false;
    return RW_OK;
}
bool rw_sync_pipe_busy(const rw_sync_session *s) {
    (void)s;
    return false;
}
void rw_sync_pipe_free_staging(rw_sync_session *s) {
    s->staging_bytes = 0;
}
void rw_sync_pipe_destroy(rw_sync_session *s) {
    (void)s;
}
#endif
