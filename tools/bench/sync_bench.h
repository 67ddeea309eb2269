/* sync_bench.h - the weight-sync benchmarks of rw-bench (sync_update.c): a full update through
 * the real protocol against the raw transport of the same bytes, measured in one run (targets S1,
 * S2, S4, S5 of docs/TARGETS.md). Built when the sync module is; CUDA builds run them, others
 * report RW_E_NO_DEVICE. */
#ifndef RWB_SYNC_BENCH_H
#define RWB_SYNC_BENCH_H

#include "bench.h"
#include "rw_client.h"

typedef struct rwb_sync_opts {
    const rw_config *cfg;  /* the worker's model (its quantization decides S1 vs S2) */
    int trainer_device;    /* S1/S2: GPU holding the trainer's random bf16 weights */
    int worker_device;     /* GPU of the TP1 worker rank */
    uint64_t bucket_bytes; /* 0: 512 MiB */
    int repeats;           /* timed runs after one warm-up; 0: 3 */
    double timeout_s;      /* 0: 120 */
    const char *disk_dir;  /* S4: a safetensors checkpoint of cfg's shape */
    /* 0: none. The call (setup, warm-up, repeats, ceiling, cleanup) aims to end within this many
     * seconds: repeats are cut to what fits (the result's note says so; when no timed repeat
     * fits, the warm-up is reported as the only sample), every wait is bounded by the time left,
     * and an update still running at the limit is abandoned with RW_E_TIMEOUT naming the repeat,
     * the bucket and where the worker was. */
    double time_limit_s;
    /* Progress on stderr: setup steps with their times, per-bucket times of the first buckets,
     * running means per bucket (trainer call, worker host phases), each repeat's time, and every
     * 5 s a watchdog line saying where both sides are. */
    bool verbose;
} rwb_sync_opts;

#define RWB_SYNC_MAX_REPEATS 16
typedef struct rwb_sync_result {
    uint64_t bytes, tensors, buckets;
    int repeats;
    double update_s[RWB_SYNC_MAX_REPEATS];  /* first byte -> ready to generate */
    double ceiling_s[RWB_SYNC_MAX_REPEATS]; /* raw broadcast / pinned H2D of the bytes */
    double update_median_s, ceiling_median_s;
    double update_gbps, ceiling_gbps, ratio; /* ratio = update / ceiling (lower is better) */
    size_t worker_weights_bytes;             /* the weight set */
    size_t worker_staging_bytes;             /* 2 buckets */
    size_t worker_peak_bytes;                /* device memory used on the worker GPU at peak,
                                                over the level before the weight set existed */
    /* diagnostics (S1/S2; the last timed repeat, or the warm-up when none ran) */
    uint64_t pieces;          /* pieces sent per update (tensors plus row pieces) */
    int ceiling_repeats;      /* raw broadcast repeats (may be fewer than repeats when cut) */
    double setup_s;           /* weight set, trainer weights, group: before the warm-up */
    double warmup_s;          /* the untimed first update */
    double first_bucket_s[4]; /* trainer call (request -> reply -> broadcast enqueued) */
    double bucket_mean_s;     /* the same, mean over the buckets */
    double bucket_max_s;      /* and the longest */
    double commit_s;          /* commit request -> reply (the wait for the last buckets) */
    double worker_apply_s;    /* worker host time per bucket in its apply call */
    double worker_wait_s;     /* of which waiting for a bucket record to drain */
    double worker_prepare_s;  /* of which building the ops and the op table */
    uint64_t worker_deferred; /* buckets whose apply waited for their bytes */
    char note[256];           /* what was cut for time, or "" */
} rwb_sync_result;
/* S1 / S2 / S5: trainer on trainer_device generates random canonical bf16 weights, pushes them
 * as a full update over NCCL through the real protocol (a sync server on loopback) to a TP1
 * worker on worker_device; the raw ncclBroadcast of the same buckets runs in the same process.
 * Tensors larger than a bucket go as row pieces, as rw_sync_push_ckpt sends them. */
rw_status rwb_sync_bench_nccl(const rwb_sync_opts *o, rwb_sync_result *out, rw_err *err);
/* S4: update_weights_from_disk of disk_dir into a worker on worker_device; the ceiling is a
 * pinned host -> device copy of the same byte count. */
rw_status rwb_sync_bench_disk(const rwb_sync_opts *o, rwb_sync_result *out, rw_err *err);
/* The result as one JSON object (malloc'd; free with free()). */
rw_status rwb_sync_result_json(const rwb_sync_result *r, const char *name, char **out, rw_err *err);

#endif
