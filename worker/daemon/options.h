/* options.h - the rw-worker daemon's command-line options (options.c), read by every other file
 * of the daemon. */
#ifndef RW_DAEMON_OPTIONS_H
#define RW_DAEMON_OPTIONS_H

#include "rw_msg.h"
#include "rw_worker.h"

#ifdef __cplusplus
extern "C" {
#endif

#define RW_DAEMON_DEFAULT_CONTROL RW_DEFAULT_CONTROL /* rw_msg.h: clients share it */
#define RW_DAEMON_MAX_TP 64
#ifndef RW_VERSION
#define RW_VERSION "unknown"
#endif
/* Limits of the control socket and its clients (docs/OPERATIONS.md section 2): defaults. */
#define RW_DAEMON_MAX_FRAME_BYTES (1ull << 30)   /* --max-frame-bytes: ZMQ_MAXMSGSIZE */
#define RW_DAEMON_MAX_REPLY_BYTES (32ull << 20)  /* --max-reply-bytes: one reply message */
#define RW_DAEMON_MAX_CLIENT_REQUESTS 131072     /* --max-client-requests */
#define RW_DAEMON_MAX_CLIENT_TOKENS (1ull << 28) /* --max-client-tokens */

typedef struct rw_dopts {
    const char *model_dir;   /* --model DIR (config.json + safetensors) */
    const char *config_path; /* --config FILE */
    bool random_weights;     /* --random-weights: seeded random bf16 (with --config) */
    uint64_t seed;           /* --seed (weights) */
    int tp;                  /* --tp N */
    int rank;                /* --rank R; -1 when this process launches the ranks itself */
    const char *peer;        /* --peer ADDR: rank rendezvous (rank 0 binds, others connect) */
    const char *control;     /* --control ADDR */
    const char *auth_token;  /* --auth-token T (or RW_AUTH_TOKEN) */
    rw_backend backend;      /* --device */
    rw_precision precision;  /* --precision (CUDA) */
    int gpu;                 /* --gpu G: CUDA ordinal of this rank (launcher: of rank 0) */
    bool gpu_given;
    double kv_fraction;       /* --kv-fraction */
    double kv_mb;             /* --kv-mb: KV budget in MiB (0: engine default) */
    int max_batch;            /* --max-batch: requests in the running batch */
    int max_batch_tokens;     /* --max-batch-tokens */
    const char *ready_file;   /* --ready-file PATH: the bound control endpoint is written there */
    double startup_timeout_s; /* --startup-timeout: rendezvous / rank start-up bound */
    double rank_timeout_s;    /* --rank-timeout: bound on a follower's answer to an op */
    /* Limits (defaults RW_DAEMON_MAX_*): the largest frame the control socket reads (larger ones
     * drop the sender's connection before a byte of the frame is stored), the largest reply
     * message (a generate result beyond it comes in parts), and per client (ZeroMQ connection)
     * the requests and tokens (prompt + max_new_tokens of each request) in flight. */
    uint64_t max_frame_bytes;     /* --max-frame-bytes */
    uint64_t max_reply_bytes;     /* --max-reply-bytes */
    uint64_t max_client_requests; /* --max-client-requests */
    uint64_t max_client_tokens;   /* --max-client-tokens */
    const char *self_exe;     /* this executable (launcher mode re-executes it per rank) */
    bool no_prefix_cache;     /* --no-prefix-cache: no prefix cache, no shared sample KV */
    /* text and HTTP (rank 0; docs/PROTOCOL.md section 6) */
    const char *tokenizer_dir; /* --tokenizer DIR; NULL: the model directory when it has a
                                  tokenizer.json, else none */
    const char *http;          /* --http ADDR: "PORT" (loopback) or "HOST:PORT"; NULL: no HTTP */
    const char *served_model_name; /* --served-model-name NAME (OpenAI "model") */
    double http_timeout_s;         /* --http-timeout S: idle time before a connection is closed */
} rw_dopts;

/* Parses argv (after the program name). Returns 0 on success, 2 on a usage error (message
 * printed on stderr), -1 after --help or --version (printed on stdout: exit 0). */
int rw_dopts_parse(int argc, char **argv, rw_dopts *o);
/* True for addresses that only local processes can reach (loopback tcp, ipc, inproc). */
bool rw_daemon_addr_is_local(const char *addr);
/* The same for an --http address ("PORT" binds loopback; "HOST:PORT"). */
bool rw_daemon_http_is_local(const char *addr);
/* CUDA ordinal of `rank` under the options (launcher: --gpu + rank; external launcher: --gpu,
 * else rank modulo the device count). */
int rw_dopts_device(const rw_dopts *o, int rank);

#ifdef __cplusplus
}
#endif

#endif
