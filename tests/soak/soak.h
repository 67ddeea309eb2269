/* soak.h - the soak test's shared state (soak.c runs it, soak_actors.c holds its actors): one
 * rw-worker (CPU backend, the tiny fixture, loopback) under 4 trainers that push whole
 * checkpoints over ZeroMQ every few seconds (the fixture and a random checkpoint, alternately),
 * 16 generating clients (some leaving with requests in flight), one hostile client sending the
 * inputs of issue 17's findings, a health prober and a memory sampler. Actor threads never call
 * cmocka (no longjmp across threads): they count what they did and record the first failures in
 * `soak`; the main thread checks everything at the end. */
#ifndef RW_SOAK_H
#define RW_SOAK_H

#include <pthread.h>
#include <stdatomic.h>

#include "reliability_util.h"

#define SOAK_TRAINERS 4
#define SOAK_GENERATORS 16
#define SOAK_MAX_VERSIONS 4096
#define SOAK_MAX_SAMPLES 8192
/* Bounds the run documents (docs/OPERATIONS.md section 7) and checks. */
#define SOAK_HEALTH_BOUND_S 5.0    /* health answered within this, whatever else happens */
#define SOAK_REPLY_BOUND_MS 120000 /* every other reply within this */
#define SOAK_RSS_GROWTH 0.10       /* after the warm-up: RSS within +10% (+16 MiB) of its value */

typedef enum soak_kind { SOAK_FIX = 0, SOAK_RND = 1 } soak_kind;

typedef struct soak {
    /* set up by soak.c before the actors start */
    char ep[256];
    pid_t pid;
    double t0, duration_s, warmup_s, push_interval_s;
    char fixture[4096], random_dir[600], tmp[256];
    char version0[RW_SYNC_MAX_VERSION + 1];     /* the weights the worker started with (fixture) */
    dt_ref ref;                                 /* the fixture's greedy reference */
    int32_t rnd_greedy[DT_NREF][DT_REF_TOKENS]; /* the random checkpoint's, same prompts */
    char fifo_dir[600], symlink_dir[600];       /* hostile checkpoints */
    atomic_bool stop;

    pthread_mutex_t mu; /* guards everything below */
    char (*committed)[RW_SYNC_MAX_VERSION + 1];
    size_t ncommitted;
    char (*seen)[RW_SYNC_MAX_VERSION + 1]; /* versions in generated tokens' spans */
    size_t nseen;
    uint64_t commits, commit_conflicts, pushes_failed;
    uint64_t probes_exact; /* greedy probes right after a commit */
    uint64_t gen_commands, gen_requests, gen_tokens, gen_multi_span, gen_greedy_exact;
    uint64_t disconnects, parts_joined;
    uint64_t hostile[16]; /* per input kind */
    double health_max_s;
    uint64_t health_calls;
    struct {
        double t;
        long rss_kib;
    } rss[SOAK_MAX_SAMPLES];
    size_t nrss;
    char fail[8][512]; /* the first failures */
    int nfail;
} soak;

/* Records a failure (the run goes on; the main thread fails the test at the end). */
void soak_fail(soak *s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Adds a committed version (with its kind in its name: "fix-..." or "rnd-..."). */
void soak_committed(soak *s, const char *version);
/* The greedy reference of prompt i under the weights of `version` (the fixture for the start-up
 * version and "fix-" ones, the random checkpoint for "rnd-" ones); NULL when not known. */
const int32_t *soak_reference(const soak *s, const char *version, int i);
/* Checks a generate output (JSON): version spans cover [0, n) in order, and each version is
 * recorded as seen; returns the number of spans (0 on a failure, recorded). */
int soak_check_spans(soak *s, json_t *o, const char *what);
double soak_elapsed(const soak *s);

/* The actors (soak_actors.c): thread entry points, `arg` is the soak (plus an index). */
typedef struct soak_actor {
    soak *s;
    int index;
    pthread_t th;
} soak_actor;
void *soak_trainer(void *arg);
void *soak_generator(void *arg);
void *soak_hostile(void *arg);

#endif
