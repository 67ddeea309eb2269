/* bench.c - weight-sync benchmarks for rw-bench (spec/targets.md S1, S2, S4, S5), CUDA builds.
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
#include "sync_internal.h"

#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <time.h>

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(const double *v, int n) {
    double t[RW_SYNC_BENCH_MAX_REPEATS];
    memcpy(t, v, (size_t)n * sizeof *t);
    qsort(t, (size_t)n, sizeof *t, cmp_d);
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
        struct timespec ts = {0, 1000000};
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
    uint64_t step = rw_sync_split_step(row, p->bucket_bytes);
    if (!step)
        RW_FAIL(p->err, RW_E_RANGE,
                "bench: %s: one row (%" PRIu64 " bytes) exceeds the bucket size %" PRIu64, name,
                row, p->bucket_bytes);
    for (uint64_t r = 0; r < rows;) {
        uint64_t end = rw_sync_split_end(r, rows, step);
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

rw_status rw_sync_bench_nccl(const rw_sync_bench_opts *o, rw_sync_bench_result *out, rw_err *err) {
    memset(out, 0, sizeof *out);
    if (!o || !o->cfg) RW_FAIL(err, RW_E_INVALID_ARG, "bench: no model config");
    if (rw_cuda_device_count() <=
        (o->trainer_device > o->worker_device ? o->trainer_device : o->worker_device))
        RW_FAIL(err, RW_E_NO_DEVICE, "bench: needs devices %d and %d", o->trainer_device,
                o->worker_device);
    int reps = o->repeats > 0 ? o->repeats : 3;
    if (reps > RW_SYNC_BENCH_MAX_REPEATS) reps = RW_SYNC_BENCH_MAX_REPEATS;
    double tmo = o->timeout_s > 0 ? o->timeout_s : 120;
    int tmo_ms = (int)(tmo * 1000);
    tb_plan p = {.bucket_bytes = o->bucket_bytes ? o->bucket_bytes : RW_SYNC_DEFAULT_BUCKET,
                 .err = err};
    plan_ctx pc = {.p = &p, .cfg = o->cfg};
    rw_wset *ws = NULL;
    rw_sync_session *sess = NULL;
    rw_sync_server *srv = NULL;
    rw_client *cl = NULL;
    rw_client_group *grp = NULL;
    void *tbuf = NULL;
    raw_worker rw = {0};
    sampler smp = {.device = o->worker_device};
    bool sampling = false;
    rw_status st = rw_config_for_each_weight(o->cfg, plan_cb, &pc);
    if (st != RW_OK) goto done;
    out->bytes = p.bytes;
    out->tensors = p.tensors;
    out->buckets = p.n;

    size_t base_used = used_now(o->worker_device);
    RW_CHECKGOTO(rw_wset_create(o->cfg, 1, 0, RW_PLACE_DEVICE, o->worker_device, &ws, err), st,
                 done);
    out->worker_weights_bytes = rw_wset_bytes(ws);
    RW_CHECKGOTO(rw_sync_session_create(ws, "bench-init", false, &sess, err), st, done);
    RW_CHECKGOTO(rw_sync_server_start(sess, NULL, "tcp://127.0.0.1:*", &srv, err), st, done);
    RW_CHECKGOTO(rw_client_connect(rw_sync_server_endpoint(srv), NULL, &cl, err), st, done);

    /* trainer weights: random bf16 on the trainer GPU, generated before anything is timed */
    RW_CUDA_TRYGOTO(err, cudaSetDevice(o->trainer_device), st, done);
    RW_CUDA_TRYGOTO(err, cudaMalloc(&tbuf, p.total), st, done);
    RW_CHECKGOTO(rw_sync_fill_bf16_cuda(tbuf, p.total / 2, 0x5eed, 0.02f, NULL, err), st, done);
    RW_CUDA_TRYGOTO(err, cudaDeviceSynchronize(), st, done);

    RW_CHECKGOTO(rw_client_group_create(&cl, NULL, 1, "bench", o->trainer_device, tmo, &grp, err),
                 st, done);

    atomic_store(&smp.peak, base_used);
    if (pthread_create(&smp.th, NULL, sampler_main, &smp) == 0) sampling = true;
    for (int r = -1; r < reps; r++) { /* r = -1: warm-up */
        char ver[32];
        snprintf(ver, sizeof ver, "bench-%d", r + 1);
        double t0 = rw_now();
        RW_CHECKGOTO(rw_client_begin_update(cl, ver, true, p.bucket_bytes, tmo, tmo_ms, err), st,
                     done);
        for (size_t i = 0; i < p.n; i++)
            RW_CHECKGOTO(rw_client_update_weights_nccl(grp, p.b[i].m, (uint8_t *)tbuf + p.b[i].base,
                                                       NULL, tmo_ms, err),
                         st, done);
        RW_CHECKGOTO(rw_client_commit_update(cl, tmo_ms, NULL, 0, err), st, done);
        double dt = rw_now() - t0;
        RW_CHECKGOTO(rw_client_group_sync(grp, NULL, tmo, err), st, done);
        if (r >= 0) out->update_s[r] = dt;
    }
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
    rw.timeout_s = tmo;
    if (!rw.g) {
        st = RW_ERR(err, RW_E_INTERNAL, "bench: the worker has no group 'bench'");
        goto done;
    }
    RW_CUDA_TRYGOTO(err, cudaSetDevice(o->worker_device), st, done);
    for (int i = 0; i < 2; i++)
        RW_CUDA_TRYGOTO(err, cudaMalloc(&rw.buf[i], p.bucket_bytes), st, done);
    rw_sync_group *tg = rw_client_group_comm(grp);
    for (int r = -1; r < reps; r++) {
        pthread_t th;
        double t0 = rw_now();
        if (pthread_create(&th, NULL, raw_worker_main, &rw)) {
            st = RW_ERR(err, RW_E_INTERNAL, "bench: pthread_create failed");
            goto done;
        }
        rw_status ts = RW_OK;
        for (size_t i = 0; i < p.n && ts == RW_OK; i++)
            ts = rw_sync_group_bcast(tg, (uint8_t *)tbuf + p.b[i].base,
                                     rw_sync_manifest_bytes(p.b[i].m), NULL, err);
        if (ts == RW_OK) ts = rw_sync_group_wait(tg, NULL, tmo, err);
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
        if (r >= 0) out->ceiling_s[r] = (rw.t_end > t1 ? rw.t_end : t1) - t0;
    }
    out->repeats = reps;
    out->update_median_s = median(out->update_s, reps);
    out->ceiling_median_s = median(out->ceiling_s, reps);
    out->update_gbps = (double)p.bytes / out->update_median_s / 1e9;
    out->ceiling_gbps = (double)p.bytes / out->ceiling_median_s / 1e9;
    out->ratio = out->update_median_s / out->ceiling_median_s;
    st = RW_OK;
done:
    if (sampling) {
        atomic_store(&smp.stop, true);
        pthread_join(smp.th, NULL);
    }
    for (int i = 0; i < 2; i++)
        if (rw.buf[i]) cudaFree(rw.buf[i]);
    rw_client_group_destroy(grp);
    rw_client_close(cl);
    rw_sync_server_stop(srv);
    rw_sync_session_destroy(sess);
    rw_wset_destroy(ws);
    if (tbuf) cudaFree(tbuf);
    plan_free(&p);
    return st;
}

rw_status rw_sync_bench_disk(const rw_sync_bench_opts *o, rw_sync_bench_result *out, rw_err *err) {
    memset(out, 0, sizeof *out);
    if (!o || !o->cfg || !o->disk_dir)
        RW_FAIL(err, RW_E_INVALID_ARG, "bench disk: needs a config and a checkpoint directory");
    if (rw_cuda_device_count() <= o->worker_device)
        RW_FAIL(err, RW_E_NO_DEVICE, "bench disk: needs device %d", o->worker_device);
    int reps = o->repeats > 0 ? o->repeats : 3;
    if (reps > RW_SYNC_BENCH_MAX_REPEATS) reps = RW_SYNC_BENCH_MAX_REPEATS;
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
    RW_CUDA_TRYGOTO(err, cudaSetDevice(o->worker_device), st, done);
    RW_CUDA_TRYGOTO(err, cudaMallocHost(&hbuf, bucket), st, done);
    RW_CUDA_TRYGOTO(err, cudaMalloc(&dbuf, bucket), st, done);
    memset(hbuf, 0x3c, bucket);
    RW_CUDA_TRYGOTO(err, cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), st, done);
    RW_CUDA_TRYGOTO(err, cudaEventCreate(&e0), st, done);
    RW_CUDA_TRYGOTO(err, cudaEventCreate(&e1), st, done);
    for (int r = -1; r < reps; r++) {
        RW_CUDA_TRYGOTO(err, cudaEventRecord(e0, s), st, done);
        for (uint64_t off = 0; off < out->bytes; off += bucket) {
            uint64_t n = out->bytes - off < bucket ? out->bytes - off : bucket;
            RW_CUDA_TRYGOTO(err, cudaMemcpyAsync(dbuf, hbuf, n, cudaMemcpyHostToDevice, s), st,
                            done);
        }
        RW_CUDA_TRYGOTO(err, cudaEventRecord(e1, s), st, done);
        RW_CUDA_TRYGOTO(err, cudaEventSynchronize(e1), st, done);
        float ms;
        RW_CUDA_TRYGOTO(err, cudaEventElapsedTime(&ms, e0, e1), st, done);
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
