/* sync.c - `rw-bench sync` (S1, S2, S5) and `rw-bench disk` (S4).
 *
 * sync: the targets first - the full-model update through the real protocol at the S1 bucket
 * size (rwb_sync_bench_nccl, sync_update.c: trainer on GPU0, TP1 worker on GPU1, first byte to
 * ready-to-generate, pack included; its result carries the raw broadcast of the same buckets
 * measured in the same run), S5 (the worker's peak device memory during it against weights + 2
 * buckets + 1 GiB), S2 (the same update into a worker serving mxfp8-last-8-bf16) - then a raw
 * NCCL broadcast GPU0 -> GPU1 of the model's bf16 bytes at every bucket size (the wire-time
 * lines) and the update at the other bucket sizes. Each update gets a share of the time limit
 * (RW_BENCH_TIME_LIMIT / --time-limit), which the entry point keeps to; it prints its progress
 * on stderr; one that still has not returned 15 s after its limit gets its error line and ends
 * the process (a wait that is not bounded), rather than the stage being killed silently.
 *
 * disk: a random checkpoint written to local disk (rw-ckpt random, reused when already there),
 * read twice so the page cache is warm, then update_weights_from_disk into a worker on GPU0
 * (rwb_sync_bench_disk) against a pinned host -> device copy of the same bytes. */
#include "bench.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#ifdef RWB_HAVE_SYNC
#include "sync_bench.h"

#include <pthread.h>
#include <time.h>
#endif

#ifdef RWB_HAVE_SYNC
/* One line for an rwb_sync_result: update time against the ceiling of the same run. The
 * caller adds its own fields and emits it. */
static json_t *update_line(rwb_ctx *c, const char *bench, const char *what, uint64_t bucket,
                           const rwb_sync_result *r, const char *ceiling_what,
                           const char *target_id, const char *target_text, double max_time_ratio,
                           double min_rate_ratio, double wire_sep_s) {
    int n = r->repeats < RWB_SYNC_MAX_REPEATS ? r->repeats : RWB_SYNC_MAX_REPEATS;
    int nc = r->ceiling_repeats > 0 ? r->ceiling_repeats : n;
    if (nc > RWB_SYNC_MAX_REPEATS) nc = RWB_SYNC_MAX_REPEATS;
    rwb_stats su = rwb_stats_of(r->update_s, n), sc = rwb_stats_of(r->ceiling_s, nc);
    json_t *j = rwb_line(c, bench, what);
    rwb_set_num(j, "bytes", (double)r->bytes);
    if (bucket) rwb_set_num(j, "bucket_bytes", (double)bucket);
    rwb_set_int(j, "tensors", (int64_t)r->tensors);
    rwb_set_int(j, "buckets", (int64_t)r->buckets);
    rwb_line_stats(j, &su);
    double achieved = (double)r->bytes / su.median / 1e9;
    double ceiling = (double)r->bytes / sc.median / 1e9;
    rwb_line_rate(j, achieved, "GB/s", ceiling, ceiling_what);
    rwb_set_num(j, "ceiling_median_s", sc.median);
    rwb_set_num(j, "ceiling_p10_s", sc.p10);
    rwb_set_num(j, "ceiling_p90_s", sc.p90);
    rwb_set_int(j, "ceiling_reps", nc);
    double tr = su.median / sc.median;
    rwb_set_num(j, "time_ratio", tr);
    if (wire_sep_s > 0) rwb_set_num(j, "raw_bcast_separate_s", wire_sep_s);
    /* where the time goes (S1/S2 entry point; zeros from the disk one) */
    if (r->pieces) {
        rwb_set_int(j, "pieces", (int64_t)r->pieces);
        rwb_set_num(j, "setup_s", r->setup_s);
        rwb_set_num(j, "warmup_s", r->warmup_s);
        rwb_set_num(j, "bucket_mean_s", r->bucket_mean_s);
        rwb_set_num(j, "bucket_max_s", r->bucket_max_s);
        rwb_set_num(j, "commit_s", r->commit_s);
        rwb_set_num(j, "worker_apply_s_per_bucket", r->worker_apply_s);
        rwb_set_num(j, "worker_wait_s_per_bucket", r->worker_wait_s);
        rwb_set_num(j, "worker_prepare_s_per_bucket", r->worker_prepare_s);
        rwb_set_int(j, "worker_deferred", (int64_t)r->worker_deferred);
    }
    if (r->note[0]) rwb_set_str(j, "note", r->note);
    int met = -1;
    if (target_id && max_time_ratio > 0) met = tr <= max_time_ratio;
    if (target_id && min_rate_ratio > 0) met = achieved / ceiling >= min_rate_ratio;
    rwb_line_target(j, target_id, target_text, met);
    return j;
}

/* A last resort for a measurement that does not come back: a thread that, once the call has
 * run GUARD_GRACE_S past its own time limit (which the entry point keeps to, so this means a
 * wait that is not bounded), emits the error line for it and ends the process, instead of the
 * stage being killed with nothing said. The progress lines on stderr say where it stopped. */
#define GUARD_GRACE_S 15.0
typedef struct guard {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    pthread_t th;
    bool started, stop, armed;
    double until, limit;
    char what[64];
    uint64_t bucket;
    rwb_ctx *c;
} guard;

static void *guard_main(void *arg) {
    guard *g = arg;
    pthread_mutex_lock(&g->mu);
    while (!g->stop) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_sec += 1;
        pthread_cond_timedwait(&g->cv, &g->mu, &ts);
        if (g->stop || !g->armed || rw_now() < g->until) continue;
        rw_err e;
        RW_ERR(&e, RW_E_TIMEOUT,
               "%s at %llu MiB buckets did not return within its %.0f s time limit plus %.0f s: "
               "a wait that is not bounded (hung); rw-bench ends here (the progress and "
               "watchdog lines on stderr say where both sides were)",
               g->what, (unsigned long long)(g->bucket >> 20), g->limit, GUARD_GRACE_S);
        json_t *j = rwb_line(g->c, "sync", g->what);
        rwb_set_num(j, "bucket_bytes", (double)g->bucket);
        rwb_set_str(j, "error", e.msg);
        rwb_set_str(j, "status", rw_status_str(e.status));
        fprintf(stderr, "rw-bench: sync %s: %s\n", g->what, e.msg);
        rwb_emit(j);
        fflush(stderr);
        _exit(3);
    }
    pthread_mutex_unlock(&g->mu);
    return NULL;
}

static void guard_arm(guard *g, const char *what, uint64_t bucket, double limit_s) {
    pthread_mutex_lock(&g->mu);
    snprintf(g->what, sizeof g->what, "%s", what);
    g->bucket = bucket;
    g->limit = limit_s;
    g->until = limit_s > 0 ? rw_now() + limit_s + GUARD_GRACE_S : 1e300;
    g->armed = limit_s > 0;
    pthread_mutex_unlock(&g->mu);
}

static void guard_disarm(guard *g) {
    pthread_mutex_lock(&g->mu);
    g->armed = false;
    pthread_mutex_unlock(&g->mu);
}

/* One full-model update measurement (S1 / S2 or another bucket size), bounded by `limit_s`. */
static rw_status run_update(rwb_ctx *c, guard *g, const rw_config *cfg, const char *what,
                            uint64_t bk, double limit_s, rwb_sync_result *r, rw_err *err) {
    rwb_sync_opts so;
    memset(&so, 0, sizeof so);
    so.cfg = cfg;
    so.trainer_device = c->o.gpu0;
    so.worker_device = c->o.gpu1;
    so.bucket_bytes = bk;
    so.repeats = c->o.reps < RWB_SYNC_MAX_REPEATS ? c->o.reps : RWB_SYNC_MAX_REPEATS;
    so.timeout_s = 120;
    so.time_limit_s = limit_s;
    so.verbose = true;
    memset(r, 0, sizeof *r);
    fprintf(stderr, "rw-bench: sync: %s, %llu MiB buckets (time limit %s%.0f s)\n", what,
            (unsigned long long)(bk >> 20), limit_s > 0 ? "" : "none, ", limit_s);
    double t0 = rw_now();
    guard_arm(g, what, bk, limit_s);
    rw_status st = rwb_sync_bench_nccl(&so, r, err);
    guard_disarm(g);
    fprintf(stderr, "rw-bench: sync: %s, %llu MiB buckets: %s in %.1f s\n", what,
            (unsigned long long)(bk >> 20), st == RW_OK ? "done" : rw_status_str(st),
            rw_now() - t0);
    return st;
}

/* The time one measurement may take (0: no limit): `frac` of what is left, but when that is
 * under 30 s, up to 30 s of it (the measurements come in priority order: S1, S2, then the
 * rest), keeping 5 s for the lines after it. */
static double share_s(const rwb_ctx *c, double frac) {
    if (c->t_deadline <= 0) return 0;
    double left = c->t_deadline - rw_now() - 5;
    if (left <= 0) return -1;
    double s = left * frac;
    if (s < 30) s = left < 30 ? left : 30;
    return s;
}
/* Below this a full-model update is not attempted (setup alone takes seconds). */
#define MIN_UPDATE_S 15.0
#endif

void rwb_mode_sync(rwb_ctx *c) {
    rw_err err = {0};
    double smp[RWB_MAX_SAMPLES];
    double wire_s[RWB_MAX_LIST] = {0};
    const uint64_t total = rwb_model_bf16_bytes(&c->cfg);

#ifdef RWB_HAVE_SYNC
    guard g;
    memset(&g, 0, sizeof g);
    pthread_mutex_init(&g.mu, NULL);
    pthread_cond_init(&g.cv, NULL);
    g.c = c;
    if (pthread_create(&g.th, NULL, guard_main, &g) == 0) g.started = true;

    /* 1. the targets first: S1 and S5 at s1_bucket, then S2 at the same size. When the entry
     * point refuses that size, S1/S5 are measured at the next size of the list that works and
     * the lines say so in "note". */
    char note[256] = "";
    uint64_t s1_bucket = c->o.s1_bucket, s2_bucket = 0;
    bool s1_done = false, s1_tried = false;
    {
        uint64_t order[RWB_MAX_LIST + 1];
        int n = 0;
        order[n++] = s1_bucket;
        for (int i = 0; i < c->o.nbuckets; i++)
            if (c->o.buckets[i] > s1_bucket) order[n++] = c->o.buckets[i];
        for (int k = 0; k < n && !s1_done; k++) {
            uint64_t bk = order[k];
            if (rwb_out_of_time(c)) break;
            /* S1 takes at most about half of what is left (S2 and the rest follow) */
            double lim = share_s(c, 0.45);
            if (c->t_deadline > 0 && lim < MIN_UPDATE_S) break;
            rwb_sync_result r;
            if (bk == s1_bucket) s1_tried = true;
            if (run_update(c, &g, &c->cfg, "update_bf16", bk, lim, &r, &err) != RW_OK) {
                if (bk == s1_bucket)
                    snprintf(note, sizeof note,
                             "defined at %llu MiB buckets, which the benchmark refused (%s); "
                             "measured at the next bucket size that works",
                             (unsigned long long)(s1_bucket >> 20), rw_status_str(err.status));
                rwb_emit_error(c, "sync", "update_bf16", &err);
                /* a refused size (a tensor row larger than the bucket) may work at a larger
                 * one; a timeout, a device or NCCL error will not get better */
                if (err.status != RW_E_RANGE && err.status != RW_E_SHAPE) break;
                continue;
            }
            json_t *j = update_line(c, "sync", "update_bf16", bk, &r,
                                    "raw ncclBroadcast of the same buckets", "S1",
                                    "update time <= 1.15 x raw broadcast time", 1.15, 0, 0);
            if (note[0]) rwb_set_str(j, "note", note);
            rwb_emit(j);
            s1_done = true;
            s2_bucket = bk;
            /* S5: peak worker memory during the update against its budget */
            double budget = (double)r.worker_weights_bytes + 2.0 * (double)bk + RWB_GIB;
            j = rwb_line(c, "sync", "worker_memory");
            rwb_set_num(j, "bytes", (double)r.worker_peak_bytes);
            rwb_set_num(j, "bucket_bytes", (double)bk);
            rwb_set_num(j, "weights_bytes", (double)r.worker_weights_bytes);
            rwb_set_num(j, "staging_bytes", (double)r.worker_staging_bytes);
            rwb_set_num(j, "achieved", (double)r.worker_peak_bytes);
            rwb_set_str(j, "unit", "bytes");
            rwb_set_num(j, "ceiling", budget);
            rwb_set_str(j, "ceiling_what", "budget: weights + 2 buckets + 1 GiB");
            rwb_set_num(j, "ratio", (double)r.worker_peak_bytes / budget);
            rwb_line_target(j, "S5", "worker peak memory <= weights + 2 buckets + 1 GiB",
                            (double)r.worker_peak_bytes <= budget);
            if (note[0]) rwb_set_str(j, "note", note);
            rwb_emit(j);
        }
    }
    if (!c->o.no_quant) {
        double lim = share_s(c, 0.6);
        if (rwb_out_of_time(c) || (c->t_deadline > 0 && lim < MIN_UPDATE_S)) {
            rwb_emit_skip(c, "sync", "update_mxfp8", "time limit reached", NULL);
        } else {
            uint64_t bk = s2_bucket ? s2_bucket : s1_bucket;
            rwb_sync_result r;
            if (run_update(c, &g, &c->cfg_q, "update_mxfp8", bk, lim, &r, &err) != RW_OK) {
                rwb_emit_error(c, "sync", "update_mxfp8", &err);
            } else {
                json_t *j = update_line(
                    c, "sync", "update_mxfp8", bk, &r, "raw ncclBroadcast of the same buckets",
                    "S2", "update time (quantize on load) <= 1.25 x raw broadcast time", 1.25, 0,
                    0);
                if (bk != s1_bucket && note[0]) rwb_set_str(j, "note", note);
                rwb_emit(j);
            }
        }
    }
#endif

    /* 2. the wire: raw broadcasts of the model's bytes at each bucket size */
    rwb_bcast *b = NULL;
    if (rwb_out_of_time(c)) {
        rwb_emit_skip(c, "sync", "raw_bcast", "time limit reached", NULL);
    } else if (rwb_bcast_create(c->o.gpu0, c->o.gpu1, &b, &err) != RW_OK) {
        rwb_emit_error(c, "sync", "raw_bcast", &err);
    } else {
        for (int i = 0; i < c->o.nbuckets; i++) {
            uint64_t bk = c->o.buckets[i];
            if (rwb_out_of_time(c)) {
                json_t *p = json_object();
                json_object_set_new(p, "bucket_bytes", json_integer((json_int_t)bk));
                rwb_emit_skip(c, "sync", "raw_bcast", "time limit reached", p);
                continue;
            }
            fprintf(stderr, "rw-bench: sync: raw broadcast of %.2f GB in %llu MiB buckets\n",
                    (double)total / 1e9, (unsigned long long)(bk >> 20));
            if (rwb_bcast_run(b, total, bk, 1, c->o.reps, smp, &err) != RW_OK) {
                rwb_emit_error(c, "sync", "raw_bcast", &err);
                continue;
            }
            rwb_stats s = rwb_stats_of(smp, c->o.reps);
            wire_s[i] = s.median;
            json_t *j = rwb_line(c, "sync", "raw_bcast");
            rwb_set_str(j, "role", "ceiling");
            rwb_set_num(j, "bytes", (double)total);
            rwb_set_num(j, "bucket_bytes", (double)bk);
            rwb_line_stats(j, &s);
            rwb_line_rate(j, (double)total / s.median / 1e9, "GB/s", 0, NULL);
            rwb_emit(j);
        }
        rwb_bcast_destroy(b); /* frees its buffers before the updates need both GPUs' memory */
    }

#ifdef RWB_HAVE_SYNC
    /* 3. the other bucket sizes (ascending), each with its own raw broadcast ceiling */
    for (int i = 0; i < c->o.nbuckets; i++) {
        uint64_t bk = c->o.buckets[i];
        if ((s1_done && bk == s2_bucket) || (s1_tried && bk == s1_bucket)) continue; /* above */
        double lim = share_s(c, 1.0 / (double)(c->o.nbuckets - i));
        if (rwb_out_of_time(c) || (c->t_deadline > 0 && lim < MIN_UPDATE_S)) {
            json_t *p = json_object();
            json_object_set_new(p, "bucket_bytes", json_integer((json_int_t)bk));
            rwb_emit_skip(c, "sync", "update_bf16", "time limit reached", p);
            continue;
        }
        rwb_sync_result r;
        if (run_update(c, &g, &c->cfg, "update_bf16", bk, lim, &r, &err) != RW_OK) {
            rwb_emit_error(c, "sync", "update_bf16", &err);
            continue;
        }
        json_t *j =
            update_line(c, "sync", "update_bf16", bk, &r, "raw ncclBroadcast of the same buckets",
                        NULL, NULL, 0, 0, wire_s[i]);
        rwb_emit(j);
    }
    if (g.started) {
        pthread_mutex_lock(&g.mu);
        g.stop = true;
        pthread_cond_broadcast(&g.cv);
        pthread_mutex_unlock(&g.mu);
        pthread_join(g.th, NULL);
    }
    pthread_cond_destroy(&g.cv);
    pthread_mutex_destroy(&g.mu);
#else
    (void)wire_s;
    RW_ERR(&err, RW_E_UNSUPPORTED, "the sync benchmark (rwb_sync_bench_nccl) is not in this build");
    rwb_emit_error(c, "sync", "update_bf16", &err);
#endif
}

/* ------------------------------------------------------------------------------------------ */
/* disk                                                                                         */
/* ------------------------------------------------------------------------------------------ */
static rw_status write_text(const char *path, const char *text, rw_err *err) {
    FILE *f = fopen(path, "w");
    if (!f) RW_FAIL(err, RW_E_IO, "%s: %s", path, strerror(errno));
    size_t n = strlen(text);
    bool ok = fwrite(text, 1, n, f) == n;
    ok = (fclose(f) == 0) && ok;
    if (!ok) RW_FAIL(err, RW_E_IO, "%s: write failed", path);
    return RW_OK;
}

static rw_status mkdirs(const char *path, rw_err *err) {
    char buf[1024];
    snprintf(buf, sizeof buf, "%s", path);
    for (char *p = buf + 1; *p; p++) {
        if (*p != '/') continue;
        *p = 0;
        if (mkdir(buf, 0755) != 0 && errno != EEXIST)
            RW_FAIL(err, RW_E_IO, "mkdir %s: %s", buf, strerror(errno));
        *p = '/';
    }
    if (mkdir(buf, 0755) != 0 && errno != EEXIST)
        RW_FAIL(err, RW_E_IO, "mkdir %s: %s", buf, strerror(errno));
    return RW_OK;
}

/* Runs argv[0] with argv, waiting for it; stdout goes to our stderr (stdout carries JSON). */
static rw_status run_tool(char *const argv[], rw_err *err) {
    pid_t pid = fork();
    if (pid < 0) RW_FAIL(err, RW_E_IO, "fork: %s", strerror(errno));
    if (pid == 0) {
        dup2(2, 1);
        execv(argv[0], argv);
        fprintf(stderr, "rw-bench: exec %s: %s\n", argv[0], strerror(errno));
        _exit(127);
    }
    int wst = 0;
    while (waitpid(pid, &wst, 0) < 0)
        if (errno != EINTR) RW_FAIL(err, RW_E_IO, "waitpid: %s", strerror(errno));
    if (!WIFEXITED(wst) || WEXITSTATUS(wst) != 0)
        RW_FAIL(err, RW_E_IO, "%s failed (status %d)", argv[0],
                WIFEXITED(wst) ? WEXITSTATUS(wst) : -1);
    return RW_OK;
}

/* Reads every regular file of `dir` once; returns the bytes read. */
static rw_status read_dir(const char *dir, uint64_t *bytes, rw_err *err) {
    *bytes = 0;
    DIR *d = opendir(dir);
    if (!d) RW_FAIL(err, RW_E_IO, "%s: %s", dir, strerror(errno));
    const size_t cap = 64u << 20;
    char *buf = malloc(cap);
    rw_status st = RW_OK;
    if (!buf) {
        closedir(d);
        RW_FAIL(err, RW_E_OOM, "out of memory");
    }
    struct dirent *e;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.') continue;
        char p[1200];
        snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
        struct stat sb;
        if (stat(p, &sb) != 0 || !S_ISREG(sb.st_mode)) continue;
        int fd = open(p, O_RDONLY);
        if (fd < 0) {
            st = RW_ERR(err, RW_E_IO, "%s: %s", p, strerror(errno));
            break;
        }
        ssize_t n;
        while ((n = read(fd, buf, cap)) > 0) *bytes += (uint64_t)n;
        if (n < 0) st = RW_ERR(err, RW_E_IO, "%s: %s", p, strerror(errno));
        close(fd);
        if (st != RW_OK) break;
    }
    free(buf);
    closedir(d);
    return st;
}

/* The checkpoint directory for `cfg`: the given one, or one written under scratch (reused when a
 * marker from an earlier complete write with the same layer count is there). */
static rw_status disk_ckpt(rwb_ctx *c, const rw_config *cfg, char *dir, size_t cap, rw_err *err) {
    if (c->o.disk_dir) {
        snprintf(dir, cap, "%s", c->o.disk_dir);
        return RW_OK;
    }
    char cfgpath[1100], marker[1100];
    snprintf(dir, cap, "%s/ckpt-%dl-seed%llu", c->o.scratch, cfg->num_layers,
             (unsigned long long)c->o.seed);
    snprintf(marker, sizeof marker, "%s/.rw-bench-complete", dir);
    if (access(marker, F_OK) == 0) {
        fprintf(stderr, "rw-bench: disk: reusing %s\n", dir);
        return RW_OK;
    }
    RW_CHECK(mkdirs(c->o.scratch, err));
    snprintf(cfgpath, sizeof cfgpath, "%s/config-%dl.json", c->o.scratch, cfg->num_layers);
    char *json = NULL;
    RW_CHECK(rw_config_to_json(cfg, &json, err));
    rw_status st = write_text(cfgpath, json, err);
    free(json);
    RW_CHECK(st);
    if (!c->o.ckpt_tool || !*c->o.ckpt_tool)
        RW_FAIL(err, RW_E_NOT_FOUND, "no rw-ckpt executable (pass --ckpt-tool or --disk-dir)");
    char seed[32];
    snprintf(seed, sizeof seed, "%llu", (unsigned long long)c->o.seed);
    char *argv[] = {(char *)c->o.ckpt_tool, "random", "--config", cfgpath, "--out", dir,
                    "--seed", seed, NULL};
    fprintf(stderr, "rw-bench: disk: writing a random checkpoint of %d layers to %s\n",
            cfg->num_layers, dir);
    double t0 = rw_now();
    RW_CHECK(run_tool(argv, err));
    fprintf(stderr, "rw-bench: disk: written in %.1f s\n", rw_now() - t0);
    return write_text(marker, "complete\n", err);
}

void rwb_mode_disk(rwb_ctx *c) {
    rw_err err = {0};
    double smp[RWB_MAX_SAMPLES];
    rw_config cfg;
    if (rw_cuda_device_count() < 1) {
        /* no device: do not write gigabytes for a measurement that cannot run */
        RW_ERR(&err, RW_E_NO_DEVICE, "disk: no CUDA device in this build or machine");
        rwb_emit_error(c, "disk", "update_disk", &err);
        return;
    }
    if (rw_config_copy(&c->cfg, &cfg, &err) != RW_OK) {
        rwb_emit_error(c, "disk", "update_disk", &err);
        return;
    }
    if (!c->o.disk_dir && c->o.disk_layers > 0 && c->o.disk_layers < cfg.num_layers)
        cfg.num_layers = c->o.disk_layers;
    char dir[1024];
    if (disk_ckpt(c, &cfg, dir, sizeof dir, &err) != RW_OK) {
        rwb_emit_error(c, "disk", "update_disk", &err);
        rw_config_free(&cfg);
        return;
    }
    if (c->o.disk_dir) {
        /* an existing checkpoint brings its own config */
        char p[1100];
        snprintf(p, sizeof p, "%s/config.json", dir);
        rw_config_free(&cfg);
        if (rw_config_load(p, &cfg, &err) != RW_OK) {
            rwb_emit_error(c, "disk", "update_disk", &err);
            return;
        }
    }
    const uint64_t total = rwb_model_bf16_bytes(&cfg);

    /* page cache: the first read may come from the device, the second is what "warm" means */
    uint64_t got = 0;
    for (int pass = 0; pass < 2; pass++) {
        double t0 = rw_now();
        if (read_dir(dir, &got, &err) != RW_OK) {
            rwb_emit_error(c, "disk", "page_cache_read", &err);
            rw_config_free(&cfg);
            return;
        }
        double dt = rw_now() - t0;
        if (pass == 1) {
            json_t *j = rwb_line(c, "disk", "page_cache_read");
            rwb_set_str(j, "role", "info");
            rwb_set_num(j, "bytes", (double)got);
            rwb_stats s = rwb_stats_of(&dt, 1);
            rwb_line_stats(j, &s);
            rwb_line_rate(j, (double)got / dt / 1e9, "GB/s", 0, NULL);
            rwb_emit(j);
        }
    }

    /* the ceiling of this mode, measured on its own (the entry point measures it again) */
    if (rwb_copy_h2d(c->o.gpu0, total, 1u << 30, 1, c->o.reps, smp, &err) == RW_OK) {
        rwb_stats s = rwb_stats_of(smp, c->o.reps);
        json_t *j = rwb_line(c, "disk", "h2d_pinned");
        rwb_set_str(j, "role", "ceiling");
        rwb_set_num(j, "bytes", (double)total);
        rwb_line_stats(j, &s);
        rwb_line_rate(j, (double)total / s.median / 1e9, "GB/s", 0, NULL);
        rwb_emit(j);
    } else {
        rwb_emit_error(c, "disk", "h2d_pinned", &err);
    }

#ifdef RWB_HAVE_SYNC
    rwb_sync_opts so;
    memset(&so, 0, sizeof so);
    so.cfg = &cfg;
    so.trainer_device = c->o.gpu0;
    so.worker_device = c->o.gpu0;
    so.repeats = c->o.reps < RWB_SYNC_MAX_REPEATS ? c->o.reps : RWB_SYNC_MAX_REPEATS;
    so.timeout_s = 120;
    so.disk_dir = dir;
    /* the disk path cuts files into buckets of whole tensors: a bucket must hold the largest one
     * (S4 does not fix a bucket size; 512 MiB when that is enough, else the next 256 MiB step) */
    const uint64_t largest = rwb_model_largest_tensor(&cfg), step = 256ull << 20;
    so.bucket_bytes = largest <= (512ull << 20) ? (512ull << 20) : (largest + step - 1) / step * step;
    rwb_sync_result r;
    memset(&r, 0, sizeof r);
    fprintf(stderr, "rw-bench: disk: update_weights_from_disk of %s\n", dir);
    if (rwb_sync_bench_disk(&so, &r, &err) != RW_OK) {
        rwb_emit_error(c, "disk", "update_disk", &err);
    } else {
        json_t *j = update_line(c, "disk", "update_disk", 0, &r,
                                "pinned host -> device copy of the same bytes", "S4",
                                "update from disk (page cache warm) >= 0.5 x pinned H2D bandwidth",
                                0, 0.5, 0);
        rwb_set_int(j, "layers", cfg.num_layers);
        rwb_set_num(j, "bucket_bytes", (double)so.bucket_bytes);
        rwb_emit(j);
    }
#else
    RW_ERR(&err, RW_E_UNSUPPORTED, "the sync benchmark (rwb_sync_bench_disk) is not in this build");
    rwb_emit_error(c, "disk", "update_disk", &err);
#endif
    rw_config_free(&cfg);
}
