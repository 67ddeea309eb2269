/* daemon.c - the rw-worker daemon: command-line options, the set-up of one rank (config, model
 * on its communicator, weights, engine, update session), the rank-level actions every rank runs
 * the same way (memory release / resume, session reset, sync commands), and the entry point with
 * its signal handling. */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "daemon_internal.h"

#ifdef RW_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

/* ------------------------------------------------------------------------------------------ */
/* Options                                                                                      */
/* ------------------------------------------------------------------------------------------ */
static void usage(FILE *f) {
    fprintf(f,
            "usage: rw-worker (--model DIR | --config FILE [--random-weights] [--seed S])\n"
            "                 [--tp N] [--rank R --peer ADDR] [--control ADDR] [--auth-token T]\n"
            "                 [--device cpu|cuda] [--gpu G] [--kv-fraction F] [--kv-mb MB]\n"
            "                 [--max-batch N] [--max-batch-tokens N] [--log-level L]\n"
            "                 [--ready-file PATH] [--startup-timeout S] [--rank-timeout S]\n"
            "  Serves the control protocol (docs/PROTOCOL.md) on --control (default %s).\n"
            "  --config without --random-weights starts with incomplete weights: generate is\n"
            "  refused until an update (push or update_weights_from_disk) fills them.\n"
            "  --tp N alone starts all N ranks (CPU: threads of this process; CUDA: one process\n"
            "  per GPU from --gpu on); with --rank R each rank is started by an external launcher\n"
            "  and finds rank 0 at --peer (rank 0 binds it).\n"
            "  KV cache: --kv-mb MB sets its size per rank; without it a CUDA rank takes\n"
            "  --kv-fraction (default 0.9) of the device memory free once its weights and\n"
            "  workspace are in place, less 768 MiB kept for NCCL, CUDA graphs and cuBLAS, so\n"
            "  10%% of that free memory stays for other processes (a CPU rank takes 64 MiB).\n"
            "  Workers that share a GPU, or start on one at the same time (each sees the\n"
            "  other's memory as free), need --kv-mb.\n"
            "  A control address that is not loopback needs --auth-token (or RW_AUTH_TOKEN).\n"
            "  The bound control endpoint is printed on stdout as a JSON line once ready.\n"
            "  rw-worker --once ... / --bench ...: see those modes' usage.\n",
            RW_DAEMON_DEFAULT_CONTROL);
}

static bool parse_double(const char *s, double lo, double hi, double *out) {
    char *end;
    errno = 0;
    double x = strtod(s, &end);
    if (end == s || *end || errno || !(x >= lo && x <= hi)) return false;
    *out = x;
    return true;
}

static bool parse_int(const char *s, long lo, long hi, int *out) {
    char *end;
    errno = 0;
    long x = strtol(s, &end, 10);
    if (end == s || *end || errno || x < lo || x > hi) return false;
    *out = (int)x;
    return true;
}

bool rw_daemon_addr_is_local(const char *a) {
    if (!strncmp(a, "ipc://", 6) || !strncmp(a, "inproc://", 9)) return true;
    if (strncmp(a, "tcp://", 6)) return false;
    a += 6;
    /* a bind interface of the form "lo;..." or a source address is not a plain host: treat the
     * forms we recognise only */
    if (!strncmp(a, "127.", 4) || !strncmp(a, "localhost:", 10) || !strncmp(a, "[::1]:", 6))
        return true;
    return false;
}

int rw_dopts_parse(int argc, char **argv, rw_dopts *o) {
    memset(o, 0, sizeof *o);
    o->tp = 1;
    o->rank = -1;
    o->control = RW_DAEMON_DEFAULT_CONTROL;
    o->backend = RW_BACKEND_CPU;
    o->kv_fraction = 0.9;
    o->startup_timeout_s = 300;
    o->rank_timeout_s = 600;
    bool backend_given = false;
    const char *log_level = NULL;
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        double x;
#define NEED                                                                                       \
    if (!v) {                                                                                      \
        fprintf(stderr, "rw-worker: %s needs a value\n", a);                                       \
        return 2;                                                                                  \
    }                                                                                              \
    i++;
#define BAD                                                                                        \
    do {                                                                                           \
        fprintf(stderr, "rw-worker: bad value '%s' for %s\n", v, a);                               \
        return 2;                                                                                  \
    } while (0)
        if (!strcmp(a, "--random-weights")) {
            o->random_weights = true;
        } else if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            return 2;
        } else if (!strcmp(a, "--model")) {
            NEED o->model_dir = v;
        } else if (!strcmp(a, "--config")) {
            NEED o->config_path = v;
        } else if (!strcmp(a, "--seed")) {
            NEED char *end;
            errno = 0;
            unsigned long long s = strtoull(v, &end, 10);
            if (end == v || *end || errno || v[0] == '-') BAD;
            o->seed = s;
        } else if (!strcmp(a, "--tp")) {
            NEED if (!parse_int(v, 1, RW_DAEMON_MAX_TP, &o->tp)) BAD;
        } else if (!strcmp(a, "--rank")) {
            NEED if (!parse_int(v, 0, RW_DAEMON_MAX_TP - 1, &o->rank)) BAD;
        } else if (!strcmp(a, "--peer")) {
            NEED o->peer = v;
        } else if (!strcmp(a, "--control")) {
            NEED o->control = v;
        } else if (!strcmp(a, "--auth-token")) {
            NEED o->auth_token = v;
        } else if (!strcmp(a, "--device")) {
            NEED rw_err e;
            if (rw_backend_parse(v, &o->backend, &e) != RW_OK) BAD;
            backend_given = true;
        } else if (!strcmp(a, "--gpu")) {
            NEED if (!parse_int(v, 0, 1023, &o->gpu)) BAD;
            o->gpu_given = true;
        } else if (!strcmp(a, "--kv-fraction")) {
            NEED if (!parse_double(v, 1e-6, 1.0, &o->kv_fraction)) BAD;
        } else if (!strcmp(a, "--kv-mb")) {
            NEED if (!parse_double(v, 1, 1 << 24, &o->kv_mb)) BAD;
        } else if (!strcmp(a, "--max-batch")) {
            NEED if (!parse_int(v, 1, 1 << 20, &o->max_batch)) BAD;
        } else if (!strcmp(a, "--max-batch-tokens")) {
            NEED if (!parse_int(v, 1, 1 << 24, &o->max_batch_tokens)) BAD;
        } else if (!strcmp(a, "--log-level")) {
            NEED log_level = v;
            if (strcmp(v, "error") && strcmp(v, "warn") && strcmp(v, "info") &&
                strcmp(v, "debug") && strcmp(v, "trace"))
                BAD;
        } else if (!strcmp(a, "--ready-file")) {
            NEED o->ready_file = v;
        } else if (!strcmp(a, "--startup-timeout")) {
            NEED if (!parse_double(v, 0.1, 86400, &x)) BAD;
            o->startup_timeout_s = x;
        } else if (!strcmp(a, "--rank-timeout")) {
            NEED if (!parse_double(v, 0.1, 86400, &x)) BAD;
            o->rank_timeout_s = x;
        } else {
            fprintf(stderr, "rw-worker: unknown option '%s'\n", a);
            usage(stderr);
            return 2;
        }
#undef NEED
#undef BAD
    }
    if (!o->model_dir == !o->config_path) {
        fprintf(stderr, "rw-worker: give exactly one of --model DIR and --config FILE\n");
        usage(stderr);
        return 2;
    }
    if (o->random_weights && !o->config_path) {
        fprintf(stderr, "rw-worker: --random-weights goes with --config (a --model checkpoint "
                        "brings its own weights)\n");
        return 2;
    }
    if (o->rank >= o->tp) {
        fprintf(stderr, "rw-worker: --rank %d is not below --tp %d\n", o->rank, o->tp);
        return 2;
    }
    if (o->rank >= 0 && o->tp > 1 && !o->peer) {
        fprintf(stderr, "rw-worker: --rank with --tp > 1 needs --peer ADDR (rank 0 binds it, the "
                        "others connect)\n");
        return 2;
    }
    if (!backend_given) o->backend = rw_cuda_device_count() > 0 ? RW_BACKEND_CUDA : RW_BACKEND_CPU;
    if (o->backend == RW_BACKEND_CPU && o->tp > 1 && o->rank >= 0) {
        fprintf(stderr,
                "rw-worker: CPU tensor parallelism runs its ranks as threads of one "
                "process: use --tp %d without --rank\n",
                o->tp);
        return 2;
    }
    if (!o->auth_token) {
        const char *t = getenv("RW_AUTH_TOKEN");
        if (t && t[0]) o->auth_token = t;
    }
    if (o->auth_token && !o->auth_token[0]) o->auth_token = NULL;
    if ((o->rank <= 0) && !rw_daemon_addr_is_local(o->control) && !o->auth_token) {
        fprintf(stderr,
                "rw-worker: refusing to bind the control socket to '%s' without authentication: "
                "it is not a loopback address; give --auth-token (or RW_AUTH_TOKEN)\n",
                o->control);
        return 2;
    }
    if (log_level) setenv("RW_LOG", log_level, 1);
    return 0;
}

/* ------------------------------------------------------------------------------------------ */
/* One rank                                                                                     */
/* ------------------------------------------------------------------------------------------ */
int rw_dopts_device(const rw_dopts *o, int rank) {
    if (o->rank < 0) return o->gpu + rank; /* this process launches every rank */
    if (o->gpu_given) return o->gpu;
    int nd = rw_cuda_device_count();
    return nd > 0 ? rank % nd : 0;
}

/* A version tag from free text: printable ASCII, at most RW_SYNC_MAX_VERSION characters (the
 * tail is kept, it is the informative part of a path). */
static void make_tag(char *dst, const char *prefix, const char *text) {
    char buf[4096];
    snprintf(buf, sizeof buf, "%s%s", prefix, text);
    for (char *p = buf; *p; p++)
        if (*p < 0x21 || *p > 0x7e) *p = '_';
    size_t n = strlen(buf);
    const char *s = n > RW_SYNC_MAX_VERSION ? buf + (n - RW_SYNC_MAX_VERSION) : buf;
    snprintf(dst, RW_SYNC_MAX_VERSION + 1, "%s", s);
}

/* Appends to a failed CUDA rank start-up what is needed to understand it: which device, and how
 * much of its memory is free now (when a context can be made at all), plus the memory options. */
static void explain_cuda_failure(const rw_dopts *o, int rank, rw_err *err) {
#ifdef RW_HAVE_CUDA
    if (!err || o->backend != RW_BACKEND_CUDA) return;
    if (err->status != RW_E_CUDA && err->status != RW_E_OOM && err->status != RW_E_NCCL) return;
    const int dev = rw_dopts_device(o, rank);
    int ndev = rw_cuda_device_count();
    size_t fr = 0, tot = 0;
    char info[320];
    if (ndev == 0) {
        snprintf(info, sizeof info, "no CUDA device is visible");
    } else if (dev >= ndev) {
        snprintf(info, sizeof info, "CUDA device %d does not exist (%d visible)", dev, ndev);
    } else if (cudaSetDevice(dev) == cudaSuccess && cudaMemGetInfo(&fr, &tot) == cudaSuccess) {
        snprintf(info, sizeof info, "CUDA device %d (of %d): %.0f MiB free of %.0f MiB", dev, ndev,
                 (double)fr / 1048576.0, (double)tot / 1048576.0);
    } else {
        (void)cudaGetLastError();
        snprintf(info, sizeof info,
                 "CUDA device %d (of %d): no context can be made on it (its memory is probably "
                 "taken by other processes: see nvidia-smi)",
                 dev, ndev);
    }
    size_t n = strlen(err->msg);
    snprintf(err->msg + n, sizeof err->msg - n,
             "; %s; a rank's KV cache takes --kv-fraction %.2g of the memory free after its "
             "weights unless --kv-mb gives its size",
             info, o->kv_fraction);
#else
    (void)o;
    (void)rank;
    (void)err;
#endif
}

rw_status rw_rank_open(const rw_dopts *o, int rank, rw_comm *comm, rw_rank **out, rw_err *err) {
    *out = NULL;
    rw_rank *r = calloc(1, sizeof *r);
    if (!r) {
        rw_comm_destroy(comm);
        RW_FAIL(err, RW_E_OOM, "rank %d: out of memory", rank);
    }
    r->rank = rank;
    r->tp = o->tp;
    r->comm = comm;
    rw_status st;
    char path[PATH_MAX];
    if (o->model_dir)
        snprintf(path, sizeof path, "%s/config.json", o->model_dir);
    else
        snprintf(path, sizeof path, "%s", o->config_path);
    RW_CHECKGOTO(rw_config_load(path, &r->cfg, err), st, fail);
    rw_model_opts mo = {o->backend, rw_dopts_device(o, rank), o->tp, rank, comm};
    RW_CHECKGOTO(rw_model_create(&r->cfg, &mo, &r->model, err), st, fail);
    bool incomplete = false;
    if (o->model_dir) {
        RW_CHECKGOTO(rw_model_load_ckpt(r->model, o->model_dir, err), st, fail);
        make_tag(r->version0, "disk:", o->model_dir);
    } else if (o->random_weights) {
        RW_CHECKGOTO(rw_model_load_random(r->model, o->seed, 0.0f, err), st, fail);
        char s[32];
        snprintf(s, sizeof s, "%llu", (unsigned long long)o->seed);
        make_tag(r->version0, "random:", s);
    } else {
        incomplete = true;
        make_tag(r->version0, "", "none");
    }
    rw_engine_opts eo = rw_engine_opts_default();
    if (o->max_batch > 0) eo.max_running = o->max_batch;
    if (o->max_batch_tokens > 0) eo.max_batch_tokens = o->max_batch_tokens;
    if (o->kv_mb > 0) eo.kv_bytes = (size_t)(o->kv_mb * 1048576.0);
    eo.kv_fraction = o->kv_fraction;
    RW_CHECKGOTO(rw_engine_create(r->model, &eo, &r->eng, err), st, fail);
    {
        rw_engine_stats es;
        rw_engine_stats_get(r->eng, &es);
        RW_LOGI("rank %d: KV cache of %.1f MiB (%lld blocks of %d tokens)%s", rank,
                (double)es.kv_bytes / 1048576.0, (long long)es.kv_blocks_total, es.kv_block_size,
                o->kv_mb > 0 ? "" : ", sized from the free memory");
    }
    RW_CHECKGOTO(
        rw_sync_session_create(rw_model_wset(r->model), r->version0, incomplete, &r->sess, err), st,
        fail);
    RW_CHECKGOTO(rw_mw_create(&r->w, err), st, fail);
    *out = r;
    return RW_OK;
fail:
    rw_rank_close(r);
    explain_cuda_failure(o, rank, err); /* after the close: the memory others left */
    rw_err_prefix(err, "rank %d", rank);
    return st;
}

void rw_rank_close(rw_rank *r) {
    if (!r) return;
    rw_sync_session_destroy(r->sess);
    rw_engine_destroy(r->eng);
    rw_model_destroy(r->model);
    rw_comm_destroy(r->comm);
    rw_config_free(&r->cfg);
    rw_mw_destroy(r->w);
    free(r);
}

rw_status rw_rank_reset_session(rw_rank *r, const char *version, rw_err *err) {
    rw_sync_session *s = NULL;
    RW_CHECK(rw_sync_session_create(rw_model_wset(r->model), version, true, &s, err));
    rw_sync_session_destroy(r->sess);
    r->sess = s;
    return RW_OK;
}

rw_status rw_rank_memory(rw_rank *r, unsigned flags, rw_err *err) {
    rw_arena *a = rw_wset_arena(rw_model_wset(r->model));
    if (flags & RW_MEM_RELEASE_KV) {
        RW_CHECK(rw_engine_release_kv(r->eng, err));
        r->kv_released = true;
    }
    if (flags & RW_MEM_RELEASE_WEIGHTS) {
        /* the staging buffers of the update pipeline go with the weights */
        RW_CHECK(rw_sync_session_release(r->sess, err));
        RW_CHECK(rw_arena_release(a, err));
        r->weights_released = true;
    }
    if (flags & RW_MEM_RESUME_WEIGHTS) {
        if (r->weights_released) {
            RW_CHECK(rw_arena_resume(a, err));
            r->weights_released = false;
            /* the bytes did not survive: until a full update (or reload) lands, generation must
             * be refused, which is exactly the session's incomplete state */
            rw_sync_info info;
            rw_sync_session_info(r->sess, &info);
            RW_CHECK(rw_rank_reset_session(r, info.version, err));
        }
    }
    if (flags & RW_MEM_RESUME_KV) {
        RW_CHECK(rw_engine_resume_kv(r->eng, err));
        r->kv_released = false;
    }
    return RW_OK;
}

rw_status rw_rank_sync(rw_rank *r, const rw_request *req, const rw_sync_frames *in,
                       rw_sync_out_frame *out, rw_err *err) {
    return rw_sync_handle(r->sess, r->rank, req, in, r->w, out, err);
}

/* ------------------------------------------------------------------------------------------ */
/* Entry                                                                                        */
/* ------------------------------------------------------------------------------------------ */
/* The one piece of global state: set by the signal handler, read by the serving loops. */
static volatile sig_atomic_t g_stop;

static void on_signal(int sig) {
    (void)sig;
    g_stop = 1;
}

int rw_worker_daemon_main(int argc, char **argv) {
    rw_dopts o;
    int rc = rw_dopts_parse(argc, argv, &o);
    if (rc) return rc;
    char exe[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n > 0) {
        exe[n] = 0;
        o.self_exe = exe;
    }
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    /* a client that goes away mid-reply must not kill the worker */
    signal(SIGPIPE, SIG_IGN);
    return rw_launch_main(&o, &g_stop);
}
