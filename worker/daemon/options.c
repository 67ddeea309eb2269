/* options.c - the rw-worker daemon's command line: usage, parsing with a clear message for every
 * refused value, the checks that tie options together (one weight source, loopback or a token),
 * and the CUDA device of each rank. */
#include "options.h"

#include "rw_msg.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void usage(FILE *f) {
    fprintf(f,
            "usage: rw-worker (--model DIR | --config FILE [--random-weights] [--seed S])\n"
            "                 [--tp N] [--rank R --peer ADDR] [--control ADDR] [--auth-token T]\n"
            "                 [--device cpu|cuda] [--gpu G] [--precision standard|high]\n"
            "                 [--kv-fraction F] [--kv-mb MB]\n"
            "                 [--max-batch N] [--max-batch-tokens N] [--log-level L]\n"
            "                 [--ready-file PATH] [--startup-timeout S] [--rank-timeout S]\n"
            "                 [--no-prefix-cache] [--tokenizer DIR] [--http [HOST:]PORT]\n"
            "                 [--http-timeout S] [--served-model-name NAME] [--version]\n"
            "                 [--max-frame-bytes N] [--max-reply-bytes N]\n"
            "                 [--max-client-requests N] [--max-client-tokens N]\n"
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
            "  --precision high (CUDA): the KV cache, the softmax weights and the experts'\n"
            "  down-projection input as hi + lo bf16 pairs too, so routing follows an fp32\n"
            "  forward pass rather than its near-ties' luck; twice the KV cache memory per\n"
            "  token. standard (the default) keeps them one bf16 each. docs/ARCHITECTURE.md.\n"
            "  A control address that is not loopback needs --auth-token (or RW_AUTH_TOKEN).\n"
            "  The bound control endpoint is printed on stdout as a JSON line once ready.\n"
            "  --no-prefix-cache: every request computes and holds all of its own KV (no prefix\n"
            "  cache across requests, no shared prompt KV for the n samples of a prompt).\n"
            "  Text: --tokenizer DIR (tokenizer.json; default: the model directory when it has\n"
            "  one) lets generate take and return text. HTTP: --http serves SGLang- and\n"
            "  OpenAI-compatible routes and /metrics on rank 0 (a bare PORT binds 127.0.0.1;\n"
            "  another host needs --auth-token, sent as 'Authorization: Bearer T'; port 0 picks\n"
            "  a free one, printed in the ready line). docs/PROTOCOL.md section 6.\n"
            "  Limits (docs/OPERATIONS.md): --max-frame-bytes (default 1 GiB) is the largest\n"
            "  frame the control socket reads (a larger one drops the sender's connection);\n"
            "  --max-reply-bytes (default 32 MiB, 64 KiB .. 64 MiB) the largest reply message\n"
            "  (a larger generate result comes in parts); per client connection at most\n"
            "  --max-client-requests (default 131072) requests and --max-client-tokens\n"
            "  (default 2^28; prompt + max_new_tokens summed) in flight, else 'busy'.\n"
            "  rw-worker --once ...: see that mode's usage (benchmarks: rw-bench).\n",
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

static bool parse_u64(const char *s, uint64_t lo, uint64_t hi, uint64_t *out) {
    char *end;
    errno = 0;
    if (s[0] == '-') return false;
    unsigned long long x = strtoull(s, &end, 10);
    if (end == s || *end || errno || x < lo || x > hi) return false;
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

bool rw_daemon_http_is_local(const char *a) {
    if (!strchr(a, ':')) return true; /* a bare port binds 127.0.0.1 */
    return !strncmp(a, "127.", 4) || !strncmp(a, "localhost:", 10) || !strncmp(a, "[::1]:", 6);
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
    o->http_timeout_s = 60;
    o->max_frame_bytes = RW_DAEMON_MAX_FRAME_BYTES;
    o->max_reply_bytes = RW_DAEMON_MAX_REPLY_BYTES;
    o->max_client_requests = RW_DAEMON_MAX_CLIENT_REQUESTS;
    o->max_client_tokens = RW_DAEMON_MAX_CLIENT_TOKENS;
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
        } else if (!strcmp(a, "--no-prefix-cache")) {
            o->no_prefix_cache = true;
        } else if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            return -1;
        } else if (!strcmp(a, "--version")) {
            printf("rw-worker %s\n", RW_VERSION);
            return -1;
        } else if (!strcmp(a, "--tokenizer")) {
            NEED o->tokenizer_dir = v;
        } else if (!strcmp(a, "--http")) {
            NEED o->http = v;
        } else if (!strcmp(a, "--served-model-name")) {
            NEED if (!v[0] || strlen(v) > 255) BAD;
            o->served_model_name = v;
        } else if (!strcmp(a, "--http-timeout")) {
            NEED if (!parse_double(v, 0.1, 86400, &x)) BAD;
            o->http_timeout_s = x;
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
        } else if (!strcmp(a, "--precision")) {
            NEED rw_err e;
            if (rw_precision_parse(v, &o->precision, &e) != RW_OK) BAD;
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
        } else if (!strcmp(a, "--max-frame-bytes")) {
            /* ZMQ_MAXMSGSIZE is an int64; the envelope frame alone may need 64 MiB */
            NEED if (!parse_u64(v, RW_MSG_MAX_BYTES, 1ull << 40, &o->max_frame_bytes)) BAD;
        } else if (!strcmp(a, "--max-reply-bytes")) {
            NEED if (!parse_u64(v, 65536, RW_MSG_MAX_BYTES, &o->max_reply_bytes)) BAD;
        } else if (!strcmp(a, "--max-client-requests")) {
            NEED if (!parse_u64(v, 1, 1ull << 32, &o->max_client_requests)) BAD;
        } else if (!strcmp(a, "--max-client-tokens")) {
            NEED if (!parse_u64(v, 1, 1ull << 48, &o->max_client_tokens)) BAD;
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
    if (o->http && o->rank <= 0 && !rw_daemon_http_is_local(o->http) && !o->auth_token) {
        fprintf(stderr,
                "rw-worker: refusing to serve HTTP on '%s' without authentication: it is not a "
                "loopback address; give --auth-token (or RW_AUTH_TOKEN)\n",
                o->http);
        return 2;
    }
    if (log_level) setenv("RW_LOG", log_level, 1);
    return 0;
}

int rw_dopts_device(const rw_dopts *o, int rank) {
    if (o->rank < 0) return o->gpu + rank; /* this process launches every rank */
    if (o->gpu_given) return o->gpu;
    int nd = rw_cuda_device_count();
    return nd > 0 ? rank % nd : 0;
}
