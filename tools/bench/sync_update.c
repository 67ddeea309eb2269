/* sync_update.c - the weight-sync benchmarks of rw-bench (targets S1, S2, S4, S5 of
 * docs/TARGETS.md) over the sync module's public API; they need CUDA (without it every entry
 * point reports RW_E_NO_DEVICE).
 *
 * S1/S2/S5: one process plays both sides. The worker: a TP1 weight set on worker_device, its
 * update session served by rw_sync_server on loopback. The trainer: every canonical bf16 tensor
 * of the model generated on trainer_device (one buffer, tensors at 256-byte aligned offsets,
 * bucket after bucket), pushed through the real protocol (rw_client: begin_update,
 * update_weights over NCCL per bucket, commit_update). Timed from the first command to the
 * commit reply (ready to generate). The ceiling, in the same run: a raw ncclBroadcast of the
 * same buckets on the same communicators. A sampler thread records the worker GPU's memory use.
 * S4: update_weights_from_disk of a checkpoint into a worker; the ceiling is a pinned H2D copy
 * of the same byte count. */
#include "order.h"
#include "sync_bench.h"

#include <inttypes.h>
#include <jansson.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <time.h>

#ifdef RW_HAVE_CUDA
#include "cuda_check.h"

static double median(const double *v, int n) {
    double t[RWB_SYNC_MAX_REPEATS];
    memcpy(t, v, (size_t)n * sizeof *t);
    qsort(t, (size_t)n, sizeof *t, rwb_cmp_double);
    return n % 2 ? t[n / 2] : 0.5 * (t[n / 2 - 1] + t[n / 2]);
}

/* --- memory sampler ------------------------------------------------------------------------ */
typedef struct sampler {
    int device;
    atomic_bool stop;
    atomic_size_t peak; /* device bytes in use */
    pthread_t th;
} sampler;

static size_t used_now(int device) {
    size_t fr = 0, tot = 0;
    if (cudaSetDevice(device) != cudaSuccess || cudaMemGetInfo(&fr, &tot) != cudaSuccess) {
        cudaGetLastError();
        return 0;
    }
    return tot - fr;
}

static void *sampler_main(void *arg) {
    sampler *s = arg;
    while (!atomic_load(&s->stop)) {
        size_t u = used_now(s->device);
        if (u > atomic_load(&s->peak)) atomic_store(&s->peak, u);
        struct timespec ts = {0, 2000000};
        nanosleep(&ts, NULL);
    }
    return NULL;
}

/* --- the trainer's model: canonical tensors in buckets ----------------------------------- */
typedef struct tb_bucket {
    rw_sync_manifest *m;
    uint64_t base; /* offset of the bucket in the trainer's buffer */
} tb_bucket;

typedef struct tb_plan {
    tb_bucket *b;
    size_t n, cap;
    uint64_t total; /* buffer size */
    uint64_t bytes; /* tensor bytes */
    uint64_t tensors;
    uint64_t bucket_bytes;
    rw_err *err;
} tb_plan;

typedef struct plan_ctx {
    tb_plan *p;
    const rw_config *cfg;
} plan_ctx;

/* Appends one piece (rows [r0, r0 + rows) of the tensor when sharded, else all of it) to the
 * last bucket, or to a new one when it does not fit there. */
static rw_status plan_piece(tb_plan *p, const char *name, int nd, const int64_t *shape, int sdim,
                            int64_t r0, int64_t rows, uint64_t nb) {
    tb_bucket *cur = p->n ? &p->b[p->n - 1] : NULL;
    uint64_t at =
        cur ? (rw_sync_manifest_bytes(cur->m) + RW_SYNC_ALIGN - 1) / RW_SYNC_ALIGN * RW_SYNC_ALIGN
            : 0;
    if (!cur || at + nb > p->bucket_bytes) {
        uint64_t base = cur ? (cur->base + rw_sync_manifest_bytes(cur->m) + RW_SYNC_ALIGN - 1) /
                                  RW_SYNC_ALIGN * RW_SYNC_ALIGN
                            : 0;
        if (p->n == p->cap) {
            size_t cap = p->cap ? 2 * p->cap : 64;
            tb_bucket *nbk = realloc(p->b, cap * sizeof *nbk);
            if (!nbk) RW_FAIL(p->err, RW_E_OOM, "bench: out of memory");
            p->b = nbk;
            p->cap = cap;
        }
        cur = &p->b[p->n];
        cur->base = base;
        RW_CHECK(rw_sync_manifest_create(&cur->m, p->err));
        p->n++;
    }
    RW_CHECK(rw_sync_manifest_add(cur->m, name, RW_DTYPE_BF16, nd, shape, sdim, r0, rows,
                                  RW_PIECE_PLAIN, NULL, p->err));
    p->bytes += nb;
    p->total = cur->base + rw_sync_manifest_bytes(cur->m);
    return RW_OK;
}

/* Every canonical tensor as a trainer would send it: whole, or, when larger than a bucket (the
 * 30B-A3B embedding and lm_head: 622 MB), as row pieces along dim 0 (shard pieces), as
 * rw_sync_push_ckpt sends them. */
static rw_status plan_cb(const rw_wname *w, void *ctx) {
    plan_ctx *c = ctx;
    tb_plan *p = c->p;
    int nd;
    int64_t shape[RW_MAX_DIMS];
    RW_CHECK(rw_config_weight_shape(c->cfg, w, &nd, shape, p->err));
    char name[RW_SYNC_MAX_NAME];
    rw_name_format(w, name, sizeof name);
    uint64_t nb = 2;
    for (int d = 0; d < nd; d++)
        nb *= (uint64_t)shape[d];
    p->tensors++;
    if (nb <= p->bucket_bytes) return plan_piece(p, name, nd, shape, -1, 0, 0, nb);
    uint64_t rows = (uint64_t)shape[0], row = nb / rows;
    uint64_t step = rw_split_step(row, p->bucket_bytes);
    if (!step)
        RW_FAIL(p->err, RW_E_RANGE,
                "bench: %s: one row (%" PRIu64 " bytes) exceeds the bucket size %" PRIu64, name,
                row, p->bucket_bytes);
    for (uint64_t r = 0; r < rows;) {
        uint64_t end = rw_split_end(r, rows, step);
        RW_CHECK(
            plan_piece(p, name, nd, shape, 0, (int64_t)r, (int64_t)(end - r), (end - r) * row));
        r = end;
    }
    return RW_OK;
}

static void plan_free(tb_plan *p) {
    for (size_t i = 0; i < p->n; i++)
        rw_sync_manifest_destroy(p->b[i].m);
    free(p->b);
}

/* --- raw broadcast: the worker side runs in its own thread ---------------------------------- */
typedef struct raw_worker {
    rw_sync_group *g;
    tb_plan *p;
    void *buf[2];
    double t_end;
    rw_status st;
    rw_err err;
    double timeout_s;
} raw_worker;

static void *raw_worker_main(void *arg) {
    raw_worker *r = arg;
    r->st = RW_OK;
    cudaSetDevice(rw_sync_group_device(r->g));
    for (size_t i = 0; i < r->p->n && r->st == RW_OK; i++)
        r->st = rw_sync_group_bcast(r->g, r->buf[i % 2], rw_sync_manifest_bytes(r->p->b[i].m), NULL,
                                    &r->err);
    if (r->st == RW_OK) r->st = rw_sync_group_wait(r->g, NULL, r->timeout_s, &r->err);
    r->t_end = rw_now();
    return NULL;
}

/* --- progress and watchdog ------------------------------------------------------------------ */
/* What the benchmark's main thread is doing, for the progress lines and the watchdog thread. */
typedef struct prog {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool stop, verbose;
    const char *phase; /* static string */
    int rep;           /* -1: warm-up */
    size_t bucket, nbuckets;
    double t_phase, t_start;
    rw_sync_session *sess;
    pthread_t th;
    bool running;
} prog;

static void prog_set(prog *p, const char *phase, int rep, size_t bucket) {
    pthread_mutex_lock(&p->mu);
    if (phase != p->phase || rep != p->rep) p->t_phase = rw_now();
    p->phase = phase;
    p->rep = rep;
    p->bucket = bucket;
    pthread_mutex_unlock(&p->mu);
}

static void prog_bucket(prog *p, size_t bucket) {
    pthread_mutex_lock(&p->mu);
    p->bucket = bucket;
    pthread_mutex_unlock(&p->mu);
}

/* Every 5 s: where the trainer loop is and where the worker's control thread is. A hang shows
 * up as the same line repeating with a growing time. */
static void *watchdog_main(void *arg) {
    prog *p = arg;
    pthread_mutex_lock(&p->mu);
    for (;;) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_sec += 5;
        while (!p->stop && pthread_cond_timedwait(&p->cv, &p->mu, &ts) == 0) {
        }
        if (p->stop) break;
        const char *phase = p->phase;
        int rep = p->rep;
        size_t b = p->bucket, nb = p->nbuckets;
        double now = rw_now(), tp = now - p->t_phase, tt = now - p->t_start;
        /* read under p->mu: the main thread clears p->sess (under it) before destroying it */
        rw_sync_sstats ws;
        memset(&ws, 0, sizeof ws);
        if (p->sess) rw_sync_session_stats(p->sess, &ws);
        pthread_mutex_unlock(&p->mu);
        fprintf(stderr,
                "rw sync bench: watchdog %.0f s: %s (rep %d, bucket %zu/%zu) for %.1f s; worker: "
                "%s for %.2f s at bucket %" PRIu64 ", %" PRIu64 " applied (%" PRIu64
                " deferred), host %.3f ms/bucket\n",
                tt, phase ? phase : "?", rep, b, nb, tp, rw_sync_phase_str(ws.phase),
                now - ws.phase_since, ws.bucket, ws.buckets, ws.deferred,
                ws.buckets ? 1e3 * ws.apply_s / (double)ws.buckets : 0.0);
        pthread_mutex_lock(&p->mu);
    }
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

static void prog_start(prog *p, bool verbose, size_t nbuckets) {
    memset(p, 0, sizeof *p);
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->cv, NULL);
    p->verbose = verbose;
    p->nbuckets = nbuckets;
    p->phase = "setup";
    p->t_start = p->t_phase = rw_now();
    if (verbose && pthread_create(&p->th, NULL, watchdog_main, p) == 0) p->running = true;
}

static void prog_stop(prog *p) {
    pthread_mutex_lock(&p->mu);
    p->stop = true;
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
    if (p->running) pthread_join(p->th, NULL);
    p->running = false;
    pthread_cond_destroy(&p->cv);
    pthread_mutex_destroy(&p->mu);
}

#define SAY(o, ...)                                                                                \
    do {                                                                                           \
        if ((o)->verbose) {                                                                        \
            fprintf(stderr, "rw sync bench: " __VA_ARGS__);                                        \
            fputc('\n', stderr);                                                                   \
        }                                                                                          \
    } while (0)

/* Seconds left before the deadline (a large number without one). */
static double left_s(double deadline) {
    return deadline > 0 ? deadline - rw_now() : 1e9;
}
/* A wait bound: the configured timeout, or less when the deadline is closer (at least 1 s). */
static double bound_s(double tmo, double deadline) {
    double l = left_s(deadline);
    if (l < 1) l = 1;
    return tmo < l ? tmo : l;
}

/* One full update through the protocol (begin, every bucket over NCCL, commit), timed from the
 * first command to the commit reply. Per-bucket trainer call times go to `bt` (n entries). On a
 * deadline passed between buckets: RW_E_TIMEOUT saying where. */
static rw_status one_update(const rwb_sync_opts *o, prog *pg, rw_client *cl, rw_client_group *grp,
                            rw_sync_session *sess, const tb_plan *p, void *tbuf, int r, double tmo,
                            double deadline, double *bt, double *dt_out, double *commit_s,
                            rw_err *err) {
    char ver[32];
    snprintf(ver, sizeof ver, "bench-%d", r + 1);
    prog_set(pg, "begin_update", r, 0);
    double t0 = rw_now(), last_say = t0;
    RW_CHECK(rw_client_begin_update(cl, ver, true, p->bucket_bytes, tmo,
                                    (int)(bound_s(tmo, deadline) * 1000), err));
    prog_set(pg, "buckets", r, 0);
    for (size_t i = 0; i < p->n; i++) {
        if (deadline > 0 && rw_now() > deadline) {
            rw_sync_sstats ws;
            rw_sync_session_stats(sess, &ws);
            double el = rw_now() - t0;
            RW_FAIL(err, RW_E_TIMEOUT,
                    "bench: time limit reached in update %s%d after %zu of %zu buckets (%.1f s "
                    "into it, %.3f ms per bucket; worker host %.3f ms per bucket, waits %.3f, "
                    "prepare %.3f, %" PRIu64 " deferred)",
                    r < 0 ? "warm-up " : "repeat ", r < 0 ? 0 : r + 1, i, p->n, el,
                    i ? 1e3 * el / (double)i : 0.0,
                    ws.buckets ? 1e3 * ws.apply_s / (double)ws.buckets : 0.0,
                    ws.buckets ? 1e3 * ws.wait_s / (double)ws.buckets : 0.0,
                    ws.buckets ? 1e3 * ws.prepare_s / (double)ws.buckets : 0.0, ws.deferred);
        }
        prog_bucket(pg, i);
        double tb = rw_now();
        rw_status st =
            rw_client_update_weights_nccl(grp, p->b[i].m, (uint8_t *)tbuf + p->b[i].base, NULL,
                                          (int)(bound_s(tmo, deadline) * 1000), err);
        if (st != RW_OK) {
            rw_err_prefix(err, "bench: update %s%d, bucket %zu of %zu (%.1f s into it)",
                          r < 0 ? "warm-up " : "repeat ", r < 0 ? 0 : r + 1, i, p->n,
                          rw_now() - t0);
            return st;
        }
        double now = rw_now();
        bt[i] = now - tb;
        if (o->verbose && i < 3)
            SAY(o, "update %s%d: bucket %zu (%zu pieces, %.1f MiB): %.3f ms",
                r < 0 ? "warm-up " : "", r < 0 ? 0 : r + 1, i, rw_sync_manifest_count(p->b[i].m),
                (double)rw_sync_manifest_bytes(p->b[i].m) / 1048576.0, 1e3 * bt[i]);
        if (o->verbose && now - last_say > 2.0) {
            rw_sync_sstats ws;
            rw_sync_session_stats(sess, &ws);
            double nb = ws.buckets ? (double)ws.buckets : 1;
            SAY(o,
                "update %s%d: %zu/%zu buckets in %.2f s, %.3f ms per bucket (trainer call); "
                "worker host %.3f ms per bucket (wait %.3f, prepare %.3f, receive %.3f, launch "
                "%.3f), %" PRIu64 " deferred",
                r < 0 ? "warm-up " : "", r < 0 ? 0 : r + 1, i + 1, p->n, now - t0,
                1e3 * (now - t0) / (double)(i + 1), 1e3 * ws.apply_s / nb, 1e3 * ws.wait_s / nb,
                1e3 * ws.prepare_s / nb, 1e3 * ws.recv_s / nb, 1e3 * ws.launch_s / nb, ws.deferred);
            last_say = now;
        }
    }
    prog_set(pg, "commit_update", r, p->n);
    double tc = rw_now();
    rw_status st = rw_client_commit_update(cl, (int)(bound_s(tmo, deadline) * 1000), NULL, 0, err);
    if (st != RW_OK) {
        rw_err_prefix(err, "bench: update %s%d: commit", r < 0 ? "warm-up " : "repeat ",
                      r < 0 ? 0 : r + 1);
        return st;
    }
    double t1 = rw_now();
    *dt_out = t1 - t0;
    *commit_s = t1 - tc;
    prog_set(pg, "trainer stream sync", r, p->n);
    return rw_client_group_sync(grp, NULL, bound_s(tmo, deadline), err);
}

rw_status rwb_sync_bench_nccl(const rwb_sync_opts *o, rwb_sync_result *out, rw_err *err) {
    memset(out, 0, sizeof *out);
    if (!o || !o->cfg) RW_FAIL(err, RW_E_INVALID_ARG, "bench: no model config");
    if (rw_cuda_device_count() <=
        (o->trainer_device > o->worker_device ? o->trainer_device : o->worker_device))
        RW_FAIL(err, RW_E_NO_DEVICE, "bench: needs devices %d and %d", o->trainer_device,
                o->worker_device);
    double t_start = rw_now();
    /* the work ends `reserve` seconds before the limit: what cleanup (freeing 2 x 61 GB,
     * aborting communicators, joining threads) may take */
    const double reserve = 8.0;
    double deadline = o->time_limit_s > 0 ? t_start + o->time_limit_s - reserve : 0;
    if (deadline > 0 && deadline < t_start + 1) deadline = t_start + 1;
    int reps = o->repeats > 0 ? o->repeats : 3;
    if (reps > RWB_SYNC_MAX_REPEATS) reps = RWB_SYNC_MAX_REPEATS;
    double tmo = o->timeout_s > 0 ? o->timeout_s : 120;
    tb_plan p = {.bucket_bytes = o->bucket_bytes ? o->bucket_bytes : RW_SYNC_DEFAULT_BUCKET,
                 .err = err};
    plan_ctx pc = {.p = &p, .cfg = o->cfg};
    rw_wset *ws = NULL;
    rw_sync_session *sess = NULL;
    rw_sync_server *srv = NULL;
    rw_client *cl = NULL;
    rw_client_group *grp = NULL;
    void *tbuf = NULL;
    double *bt = NULL;
    raw_worker rw = {0};
    sampler smp = {.device = o->worker_device};
    bool sampling = false;
    prog pg;
    prog_start(&pg, o->verbose, 0);
    rw_status st = rw_config_for_each_weight(o->cfg, plan_cb, &pc);
    if (st != RW_OK) goto done;
    out->bytes = p.bytes;
    out->tensors = p.tensors;
    out->buckets = p.n;
    for (size_t i = 0; i < p.n; i++)
        out->pieces += rw_sync_manifest_count(p.b[i].m);
    pg.nbuckets = p.n;
    bt = calloc(p.n ? p.n : 1, sizeof *bt);
    if (!bt) {
        st = RW_ERR(err, RW_E_OOM, "bench: out of memory");
        goto done;
    }
    SAY(o,
        "plan: %.2f GB in %zu buckets of <= %.0f MiB, %" PRIu64 " tensors as %" PRIu64
        " pieces; trainer GPU %d -> worker GPU %d; %d repeats after a warm-up%s",
        (double)p.bytes / 1e9, p.n, (double)p.bucket_bytes / 1048576.0, p.tensors, out->pieces,
        o->trainer_device, o->worker_device, reps, deadline > 0 ? "" : " (no time limit)");
    if (deadline > 0) SAY(o, "time limit %.0f s", o->time_limit_s);

    size_t base_used = used_now(o->worker_device);
    double t = rw_now();
    RW_CHECKGOTO(rw_wset_create(o->cfg, 1, 0, RW_PLACE_DEVICE, o->worker_device, &ws, err), st,
                 done);
    out->worker_weights_bytes = rw_wset_bytes(ws);
    SAY(o, "worker weight set: %.2f GB on GPU %d in %.2f s", (double)rw_wset_bytes(ws) / 1e9,
        o->worker_device, rw_now() - t);
    RW_CHECKGOTO(rw_sync_session_create(ws, "bench-init", false, &sess, err), st, done);
    RW_CHECKGOTO(rw_sync_server_start(sess, NULL, "tcp://127.0.0.1:*", &srv, err), st, done);
    RW_CHECKGOTO(rw_client_connect(rw_sync_server_endpoint(srv), NULL, &cl, err), st, done);
    pthread_mutex_lock(&pg.mu);
    pg.sess = sess;
    pthread_mutex_unlock(&pg.mu);

    /* trainer weights: random bf16 on the trainer GPU, generated before anything is timed */
    prog_set(&pg, "trainer weights", -1, 0);
    t = rw_now();
    RW_CUDA_CHECKGOTO(err, cudaSetDevice(o->trainer_device), st, done);
    RW_CUDA_CHECKGOTO(err, cudaMalloc(&tbuf, p.total), st, done);
    RW_CHECKGOTO(rwb_fill_bf16(tbuf, p.total / 2, 0x5eed, 0.0f, 0.02f, NULL, err), st, done);
    RW_CUDA_CHECKGOTO(err, cudaDeviceSynchronize(), st, done);
    SAY(o, "trainer weights: %.2f GB on GPU %d in %.2f s", (double)p.total / 1e9, o->trainer_device,
        rw_now() - t);

    prog_set(&pg, "group create", -1, 0);
    t = rw_now();
    RW_CHECKGOTO(rw_client_group_create(&cl, NULL, 1, "bench", o->trainer_device,
                                        bound_s(tmo, deadline), &grp, err),
                 st, done);
    SAY(o, "NCCL group: %.2f s", rw_now() - t);
    out->setup_s = rw_now() - t_start;
    if (deadline > 0 && rw_now() > deadline) {
        st = RW_ERR(err, RW_E_TIMEOUT,
                    "bench: setup took %.1f s of the %.0f s time limit; no update was measured",
                    out->setup_s, o->time_limit_s);
        goto done;
    }

    atomic_store(&smp.peak, base_used);
    if (pthread_create(&smp.th, NULL, sampler_main, &smp) == 0) sampling = true;
    double est = 0; /* seconds one update takes (the longest seen) */
    int done_reps = 0;
    for (int r = -1; r < reps; r++) { /* r = -1: warm-up */
        if (r >= 0 && deadline > 0 && rw_now() + 1.25 * est * 2 > deadline) {
            /* this repeat and one raw broadcast of the same bytes would not fit */
            snprintf(out->note, sizeof out->note,
                     "%d of %d timed repeats fit the %.0f s time limit%s", done_reps, reps,
                     o->time_limit_s, done_reps ? "" : " (the warm-up is reported)");
            break;
        }
        double dt = 0, cs = 0;
        RW_CHECKGOTO(
            one_update(o, &pg, cl, grp, sess, &p, tbuf, r, tmo, deadline, bt, &dt, &cs, err), st,
            done);
        if (dt > est) est = dt;
        rw_sync_sstats ws;
        rw_sync_session_stats(sess, &ws);
        double nb = ws.buckets ? (double)ws.buckets : 1, sum = 0, mx = 0;
        for (size_t i = 0; i < p.n; i++) {
            sum += bt[i];
            if (bt[i] > mx) mx = bt[i];
        }
        if (r < 0) out->warmup_s = dt;
        if (r >= 0) out->update_s[done_reps++] = dt;
        for (size_t i = 0; i < 4; i++)
            out->first_bucket_s[i] = i < p.n ? bt[i] : 0;
        out->bucket_mean_s = p.n ? sum / (double)p.n : 0;
        out->bucket_max_s = mx;
        out->commit_s = cs;
        out->worker_apply_s = ws.apply_s / nb;
        out->worker_wait_s = ws.wait_s / nb;
        out->worker_prepare_s = ws.prepare_s / nb;
        out->worker_deferred = ws.deferred;
        SAY(o,
            "update %s%d: %.3f s = %.1f GB/s (buckets %.3f ms mean, %.3f ms max; commit %.3f "
            "ms; worker host %.3f ms per bucket, of which wait %.3f, prepare %.3f; %" PRIu64
            " deferred)",
            r < 0 ? "warm-up " : "", r < 0 ? 0 : r + 1, dt, (double)p.bytes / dt / 1e9,
            1e3 * out->bucket_mean_s, 1e3 * mx, 1e3 * cs, 1e3 * out->worker_apply_s,
            1e3 * out->worker_wait_s, 1e3 * out->worker_prepare_s, ws.deferred);
    }
    if (done_reps == 0) out->update_s[done_reps++] = out->warmup_s;
    if (sampling) {
        atomic_store(&smp.stop, true);
        pthread_join(smp.th, NULL);
        sampling = false;
    }
    out->worker_peak_bytes = atomic_load(&smp.peak) - base_used;
    rw_sync_info info;
    rw_sync_session_info(sess, &info);
    out->worker_staging_bytes = info.staging_bytes;

    /* ceiling: raw broadcasts of the same buckets over the same communicators */
    rw.g = rw_sync_session_group(sess, "bench");
    rw.p = &p;
    rw.timeout_s = bound_s(tmo, deadline);
    if (!rw.g) {
        st = RW_ERR(err, RW_E_INTERNAL, "bench: the worker has no group 'bench'");
        goto done;
    }
    RW_CUDA_CHECKGOTO(err, cudaSetDevice(o->worker_device), st, done);
    for (int i = 0; i < 2; i++)
        RW_CUDA_CHECKGOTO(err, cudaMalloc(&rw.buf[i], p.bucket_bytes), st, done);
    rw_sync_group *tg = rw_client_group_comm(grp);
    double raw_est = 0;
    int raw_reps = 0;
    for (int r = -1; r < done_reps; r++) {
        if (r >= 1 && deadline > 0 && rw_now() + 1.25 * raw_est > deadline) break;
        prog_set(&pg, "raw broadcast", r, 0);
        pthread_t th;
        double t0 = rw_now();
        rw.timeout_s = bound_s(tmo, deadline);
        if (pthread_create(&th, NULL, raw_worker_main, &rw)) {
            st = RW_ERR(err, RW_E_INTERNAL, "bench: pthread_create failed");
            goto done;
        }
        rw_status ts = RW_OK;
        for (size_t i = 0; i < p.n && ts == RW_OK; i++)
            ts = rw_sync_group_bcast(tg, (uint8_t *)tbuf + p.b[i].base,
                                     rw_sync_manifest_bytes(p.b[i].m), NULL, err);
        if (ts == RW_OK) ts = rw_sync_group_wait(tg, NULL, bound_s(tmo, deadline), err);
        double t1 = rw_now();
        pthread_join(th, NULL);
        if (ts != RW_OK) {
            st = ts;
            goto done;
        }
        if (rw.st != RW_OK) {
            st = rw.st;
            if (err) *err = rw.err;
            goto done;
        }
        double dt = (rw.t_end > t1 ? rw.t_end : t1) - t0;
        if (dt > raw_est) raw_est = dt;
        if (r >= 0) out->ceiling_s[raw_reps++] = dt;
        SAY(o, "raw broadcast %s%d: %.3f s = %.1f GB/s", r < 0 ? "warm-up " : "", r < 0 ? 0 : r + 1,
            dt, (double)p.bytes / dt / 1e9);
    }
    if (raw_reps < done_reps && !out->note[0])
        snprintf(out->note, sizeof out->note, "%d raw broadcast repeats fit the time limit",
                 raw_reps);
    out->repeats = done_reps;
    out->ceiling_repeats = raw_reps;
    out->update_median_s = median(out->update_s, done_reps);
    out->ceiling_median_s = median(out->ceiling_s, raw_reps);
    out->update_gbps = (double)p.bytes / out->update_median_s / 1e9;
    out->ceiling_gbps = (double)p.bytes / out->ceiling_median_s / 1e9;
    out->ratio = out->update_median_s / out->ceiling_median_s;
    SAY(o, "result: update %.3f s (median of %d), raw broadcast %.3f s (median of %d): %.3f x",
        out->update_median_s, done_reps, out->ceiling_median_s, raw_reps, out->ratio);
    st = RW_OK;
done:
    prog_set(&pg, "cleanup", -1, 0);
    if (sampling) {
        atomic_store(&smp.stop, true);
        pthread_join(smp.th, NULL);
    }
    if (st != RW_OK && cl && grp) {
        /* an update left open: end it on the worker (its receives are all matched: the trainer
         * broadcast every bucket the worker accepted) */
        rw_err e2;
        rw_client_abort_update(cl, 5000, NULL, &e2);
    }
    double tcl = rw_now();
    for (int i = 0; i < 2; i++)
        if (rw.buf[i]) cudaFree(rw.buf[i]);
    rw_client_group_destroy(grp);
    rw_client_close(cl);
    rw_sync_server_stop(srv);
    pthread_mutex_lock(&pg.mu);
    pg.sess = NULL;
    pthread_mutex_unlock(&pg.mu);
    rw_sync_session_destroy(sess);
    rw_wset_destroy(ws);
    if (tbuf) cudaFree(tbuf);
    plan_free(&p);
    free(bt);
    SAY(o, "cleanup: %.2f s; %s after %.1f s", rw_now() - tcl, st == RW_OK ? "done" : "failed",
        rw_now() - t_start);
    prog_stop(&pg);
    return st;
}

rw_status rwb_sync_bench_disk(const rwb_sync_opts *o, rwb_sync_result *out, rw_err *err) {
    memset(out, 0, sizeof *out);
    if (!o || !o->cfg || !o->disk_dir)
        RW_FAIL(err, RW_E_INVALID_ARG, "bench disk: needs a config and a checkpoint directory");
    if (rw_cuda_device_count() <= o->worker_device)
        RW_FAIL(err, RW_E_NO_DEVICE, "bench disk: needs device %d", o->worker_device);
    int reps = o->repeats > 0 ? o->repeats : 3;
    if (reps > RWB_SYNC_MAX_REPEATS) reps = RWB_SYNC_MAX_REPEATS;
    uint64_t bucket = o->bucket_bytes ? o->bucket_bytes : RW_SYNC_DEFAULT_BUCKET;
    rw_wset *ws = NULL;
    rw_sync_session *sess = NULL;
    void *hbuf = NULL, *dbuf = NULL;
    cudaStream_t s = NULL;
    cudaEvent_t e0 = NULL, e1 = NULL;
    rw_status st;
    size_t base_used = used_now(o->worker_device);
    RW_CHECKGOTO(rw_wset_create(o->cfg, 1, 0, RW_PLACE_DEVICE, o->worker_device, &ws, err), st,
                 done);
    out->worker_weights_bytes = rw_wset_bytes(ws);
    RW_CHECKGOTO(rw_sync_session_create(ws, "bench-init", false, &sess, err), st, done);
    for (int r = -1; r < reps; r++) {
        char ver[32];
        snprintf(ver, sizeof ver, "disk-%d", r + 1);
        rw_sync_begin_args a = {.version = ver, .bucket_bytes = bucket, .timeout_s = 600};
        uint64_t nt, nb;
        double t0 = rw_now();
        RW_CHECKGOTO(rw_sync_session_apply_disk(sess, o->disk_dir, NULL, &a, &nt, &nb, err), st,
                     done);
        double dt = rw_now() - t0;
        if (r >= 0) out->update_s[r] = dt;
        out->bytes = nb;
        out->tensors = nt;
        size_t u = used_now(o->worker_device) - base_used;
        if (u > out->worker_peak_bytes) out->worker_peak_bytes = u;
    }
    rw_sync_info info;
    rw_sync_session_info(sess, &info);
    out->worker_staging_bytes = info.staging_bytes;
    out->buckets = info.buckets;
    /* ceiling: pinned host -> device copies of the same byte count, bucket-sized chunks */
    RW_CUDA_CHECKGOTO(err, cudaSetDevice(o->worker_device), st, done);
    RW_CUDA_CHECKGOTO(err, cudaMallocHost(&hbuf, bucket), st, done);
    RW_CUDA_CHECKGOTO(err, cudaMalloc(&dbuf, bucket), st, done);
    memset(hbuf, 0x3c, bucket);
    RW_CUDA_CHECKGOTO(err, cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), st, done);
    RW_CUDA_CHECKGOTO(err, cudaEventCreate(&e0), st, done);
    RW_CUDA_CHECKGOTO(err, cudaEventCreate(&e1), st, done);
    for (int r = -1; r < reps; r++) {
        RW_CUDA_CHECKGOTO(err, cudaEventRecord(e0, s), st, done);
        for (uint64_t off = 0; off < out->bytes; off += bucket) {
            uint64_t n = out->bytes - off < bucket ? out->bytes - off : bucket;
            RW_CUDA_CHECKGOTO(err, cudaMemcpyAsync(dbuf, hbuf, n, cudaMemcpyHostToDevice, s), st,
                              done);
        }
        RW_CUDA_CHECKGOTO(err, cudaEventRecord(e1, s), st, done);
        RW_CUDA_CHECKGOTO(err, cudaEventSynchronize(e1), st, done);
        float ms;
        RW_CUDA_CHECKGOTO(err, cudaEventElapsedTime(&ms, e0, e1), st, done);
        if (r >= 0) out->ceiling_s[r] = ms / 1e3;
    }
    out->repeats = reps;
    out->update_median_s = median(out->update_s, reps);
    out->ceiling_median_s = median(out->ceiling_s, reps);
    out->update_gbps = (double)out->bytes / out->update_median_s / 1e9;
    out->ceiling_gbps = (double)out->bytes / out->ceiling_median_s / 1e9;
    out->ratio = out->update_median_s / out->ceiling_median_s;
    st = RW_OK;
done:
    if (e0) cudaEventDestroy(e0);
    if (e1) cudaEventDestroy(e1);
    if (s) cudaStreamDestroy(s);
    if (dbuf) cudaFree(dbuf);
    if (hbuf) cudaFreeHost(hbuf);
    rw_sync_session_destroy(sess);
    rw_wset_destroy(ws);
    return st;
}

#else /* no CUDA: the benchmarks need GPUs */

rw_status rwb_sync_bench_nccl(const rwb_sync_opts *o, rwb_sync_result *out, rw_err *err) {
    (void)o;
    memset(out, 0, sizeof *out);
    RW_FAIL(err, RW_E_NO_DEVICE, "sync benchmark: this build has no CUDA");
}

rw_status rwb_sync_bench_disk(const rwb_sync_opts *o, rwb_sync_result *out, rw_err *err) {
    (void)o;
    memset(out, 0, sizeof *out);
    RW_FAIL(err, RW_E_NO_DEVICE, "sync benchmark: this build has no CUDA");
}
#endif

/* ------------------------------------------------------------------------------------------ */
/* The result as JSON                                                                           */
/* ------------------------------------------------------------------------------------------ */
rw_status rwb_sync_result_json(const rwb_sync_result *r, const char *name, char **out,
                               rw_err *err) {
    *out = NULL;
    json_t *j = json_object(), *u = json_array(), *c = json_array();
    if (!j || !u || !c) {
        json_decref(j);
        json_decref(u);
        json_decref(c);
        RW_FAIL(err, RW_E_OOM, "bench json: out of memory");
    }
    int n = r->repeats < RWB_SYNC_MAX_REPEATS ? r->repeats : RWB_SYNC_MAX_REPEATS;
    for (int i = 0; i < n; i++) {
        json_array_append_new(u, json_real(r->update_s[i]));
        json_array_append_new(c, json_real(r->ceiling_s[i]));
    }
    json_object_set_new(j, "benchmark", json_string(name ? name : "sync"));
    json_object_set_new(j, "bytes", json_integer((json_int_t)r->bytes));
    json_object_set_new(j, "tensors", json_integer((json_int_t)r->tensors));
    json_object_set_new(j, "buckets", json_integer((json_int_t)r->buckets));
    json_object_set_new(j, "repeats", json_integer(r->repeats));
    json_object_set_new(j, "update_s", u);
    json_object_set_new(j, "ceiling_s", c);
    json_object_set_new(j, "update_median_s", json_real(r->update_median_s));
    json_object_set_new(j, "ceiling_median_s", json_real(r->ceiling_median_s));
    json_object_set_new(j, "update_gbps", json_real(r->update_gbps));
    json_object_set_new(j, "ceiling_gbps", json_real(r->ceiling_gbps));
    json_object_set_new(j, "ratio", json_real(r->ratio));
    json_object_set_new(j, "worker_weights_bytes",
                        json_integer((json_int_t)r->worker_weights_bytes));
    json_object_set_new(j, "worker_staging_bytes",
                        json_integer((json_int_t)r->worker_staging_bytes));
    json_object_set_new(j, "worker_peak_bytes", json_integer((json_int_t)r->worker_peak_bytes));
    json_object_set_new(j, "pieces", json_integer((json_int_t)r->pieces));
    json_object_set_new(j, "ceiling_repeats", json_integer(r->ceiling_repeats));
    json_object_set_new(j, "setup_s", json_real(r->setup_s));
    json_object_set_new(j, "warmup_s", json_real(r->warmup_s));
    json_object_set_new(j, "bucket_mean_s", json_real(r->bucket_mean_s));
    json_object_set_new(j, "bucket_max_s", json_real(r->bucket_max_s));
    json_object_set_new(j, "commit_s", json_real(r->commit_s));
    json_object_set_new(j, "worker_apply_s", json_real(r->worker_apply_s));
    json_object_set_new(j, "worker_wait_s", json_real(r->worker_wait_s));
    json_object_set_new(j, "worker_prepare_s", json_real(r->worker_prepare_s));
    json_object_set_new(j, "worker_deferred", json_integer((json_int_t)r->worker_deferred));
    if (r->note[0]) json_object_set_new(j, "note", json_string(r->note));
    *out = json_dumps(j, JSON_COMPACT);
    json_decref(j);
    if (!*out) RW_FAIL(err, RW_E_OOM, "bench json: out of memory");
    return RW_OK;
}
