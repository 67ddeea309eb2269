/* bench.h - rw-bench internals: options, the JSON result line, statistics, the ceilings measured
 * in the same run (device copy, pinned host -> device copy, raw NCCL broadcast, cuBLASLt GEMM)
 * and the modes. Not a public contract: only tools/bench includes it.
 *
 * Every measurement prints one JSON object per line on stdout (schema in docs/BENCHMARKS.md):
 * bench, what, bytes or tokens, median_s, p10_s, p90_s, reps, achieved, unit, ceiling,
 * ceiling_what, ratio, target_id, target, met, commit, device, date, cmd. Progress and diagnostics
 * go to stderr.
 */
#ifndef RW_BENCH_H
#define RW_BENCH_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "forward.h" /* rwb_attn_shape */
#include "rw_core.h"

#define RWB_MAX_LIST 16
#define RWB_MAX_SAMPLES 256
#define RWB_GIB (1024.0 * 1024.0 * 1024.0)
#define RWB_MIB (1024.0 * 1024.0)

/* ------------------------------------------------------------------------------------------ */
/* Options and run context                                                                     */
/* ------------------------------------------------------------------------------------------ */
typedef struct rwb_opts {
    const char *config_path; /* Qwen3-MoE config.json of the benchmarked model */
    int gpu0, gpu1;          /* trainer / primary GPU, worker GPU (sync) */
    int reps, warmup;        /* per measurement (modes with slow reps use fewer, see main.c) */
    bool full;               /* full sweep grids instead of the reduced default ones */
    bool no_quant;           /* skip the mxfp8-last-8-bf16 variants (S2, G3) */
    int precision;           /* the generation modes' models' rw_precision (--precision) */
    uint64_t seed;
    /* sync */
    uint64_t buckets[RWB_MAX_LIST]; /* bytes */
    int nbuckets;
    uint64_t s1_bucket;             /* the bucket size targets S1, S2, S5 are defined at */
    /* pack */
    int pack_layers;
    /* disk */
    const char *disk_dir; /* an existing checkpoint of the config (skips writing one) */
    const char *scratch;  /* where the checkpoint is written (local disk, not $OUT) */
    int disk_layers;      /* layers of the written checkpoint (0: all of the config) */
    const char *ckpt_tool;/* rw-ckpt executable */
    /* decode */
    int batches[RWB_MAX_LIST], nbatches;
    int ctxs[RWB_MAX_LIST], nctxs;
    int steps;                   /* timed decode steps per point */
    int g1_batch, g1_ctx;        /* the point targets G1 and G3 are defined at */
    int gen_batch, gen_prompt, gen_new; /* end-to-end generate (the rw side of G5) */
    int gen_reps;
    double setup_timeout_s;      /* bound on the prefill that fills a decode batch's KV cache */
    /* prefill */
    int nprompt, plen;
    int prefill_max_tokens;      /* engine max_batch_tokens for the prefill run (0: all tokens) */
    int prefill_reps;
    double time_limit_s;         /* 0: none */
    /* decode: also time the G1 point with every request returning its routed experts */
    bool routes;
    /* decode: skip the lines of the worker's forward entry point (G1/G2/G3 forward), which
     * build their own models at the G1 point and at batch 1 whatever --batches says */
    bool no_forward;
    /* rollout (R1): prompts x samples, prompt lengths uniform [pmin, pmax], response lengths
     * log-normal (median, sigma) capped; sharing 0 off, 1 on, 2 both; series every dt s */
    int ro_prompts, ro_n, ro_pmin, ro_pmax, ro_median, ro_cap;
    double ro_sigma, ro_dt;
    int ro_sharing, ro_max_running, ro_max_batch_tokens;
    /* kernels (G6, G7): attention shapes (seqs x kv keys, prefill or decode), expert-layer token
     * counts, and the layers whose expert weights the repetitions rotate over */
    rwb_attn_shape kattn[RWB_MAX_LIST];
    int nkattn;
    int ktokens[RWB_MAX_LIST], nktokens;
    int dtokens[RWB_MAX_LIST], ndtokens; /* kernels: the dense GEMMs' token counts */
    int stokens[RWB_MAX_LIST], nstokens; /* kernels: the small kernels' token counts */
    int kernel_layers;
} rwb_opts;

/* What every line carries besides its numbers. */
typedef struct rwb_meta {
    char commit[64];
    char device[192];
    char date[32];
    char *cmd; /* argv joined (owned) */
} rwb_meta;

/* State shared by the modes of one invocation (no globals: passed to every mode). */
typedef struct rwb_ctx {
    rwb_opts o;
    rw_config cfg;   /* bf16 model */
    rw_config cfg_q; /* mxfp8-last-8-bf16 variant of cfg */
    rwb_meta meta;
    int failures;    /* measurements that reported an error */
    void *engine_state; /* engine.c's cached model (decode and prefill share it) */
    double t_deadline;  /* rw_now() after which measurements are skipped (0: none) */
} rwb_ctx;

/* True once the --time-limit of this invocation has passed: the caller emits a "skipped" line
 * for what it did not measure, so a run ends with lines rather than being killed. */
bool rwb_out_of_time(const rwb_ctx *c);

/* ------------------------------------------------------------------------------------------ */
/* Result lines and statistics (out.c)                                                          */
/* ------------------------------------------------------------------------------------------ */
typedef struct rwb_stats {
    int n;
    double median, p10, p90, min, max;
} rwb_stats;

/* Order statistics of x[0..n) (n >= 1; x is not modified). Percentiles interpolate linearly
 * between order statistics. */
rwb_stats rwb_stats_of(const double *x, int n);

/* A new result line with bench, what, commit, device, date and cmd set. */
json_t *rwb_line(const rwb_ctx *c, const char *bench, const char *what);
/* median_s, p10_s, p90_s, min_s, max_s and reps from samples (seconds). */
void rwb_line_stats(json_t *j, const rwb_stats *s);
/* achieved, unit, ceiling, ceiling_what and ratio = achieved / ceiling (null when the ceiling is
 * missing or zero). */
void rwb_line_rate(json_t *j, double achieved, const char *unit, double ceiling,
                   const char *ceiling_what);
/* target_id, target (human text) and met (null when met < 0). */
void rwb_line_target(json_t *j, const char *id, const char *text, int met);
void rwb_set_num(json_t *j, const char *key, double v);
void rwb_set_int(json_t *j, const char *key, int64_t v);
void rwb_set_str(json_t *j, const char *key, const char *v);
/* Prints the line on stdout (one compact JSON object and a newline, flushed) and frees it. */
void rwb_emit(json_t *j);
/* An error line for a measurement that could not run; counts a failure. */
void rwb_emit_error(rwb_ctx *c, const char *bench, const char *what, const rw_err *err);
/* A line saying a point was skipped on purpose (why), not a failure. */
void rwb_emit_skip(rwb_ctx *c, const char *bench, const char *what, const char *why,
                   json_t *params);

/* Fills meta (commit from RW_COMMIT or the build, device names, UTC date). */
void rwb_meta_init(rwb_meta *m, const rwb_opts *o, int argc, char **argv);
void rwb_meta_free(rwb_meta *m);

/* Bytes of every canonical weight of cfg in bf16 (what a trainer sends), and of the largest one
 * (the embedding or the lm_head: 622 MB for Qwen3-30B-A3B, more than a 512 MiB bucket). */
uint64_t rwb_model_bf16_bytes(const rw_config *cfg);
uint64_t rwb_model_largest_tensor(const rw_config *cfg);
/* The mxfp8-last-N-bf16 variant of a bf16 config (as rw-ckpt quantize writes it). */
rw_status rwb_config_mxfp8_last(const rw_config *src, int last_n, rw_config *out, rw_err *err);

/* The token id of prompt `seq` at position `pos`: splitmix64 of (seed, seq, pos) modulo V.
 * tools/peer/hf_generate.py computes the same prompts. */
int32_t rwb_prompt_token(uint64_t seed, int seq, int pos, int vocab);

/* ------------------------------------------------------------------------------------------ */
/* Ceilings (gpu.c; RW_E_NO_DEVICE in builds without CUDA)                                     */
/* ------------------------------------------------------------------------------------------ */
/* Device-to-device copies of `bytes` on `dev` (cudaMemcpyAsync, rotating over 2 source and
 * destination buffers of random data), CUDA events per rep, after the copy's rate has settled
 * (settle.h; *settle_s, when not NULL: the seconds that took). samples[reps] in seconds; one copy
 * moves 2 * bytes (read + write). */
rw_status rwb_copy_d2d(int dev, size_t bytes, int warmup, int reps, double *samples,
                       double *settle_s, rw_err *err);
/* Pinned host -> device copy of `total` bytes in chunks of `chunk` (one pinned chunk of random
 * bytes, rotating over 2 device chunks); samples[reps] in seconds for the whole `total`. */
rw_status rwb_copy_h2d(int dev, uint64_t total, size_t chunk, int warmup, int reps,
                       double *samples, rw_err *err);

/* A raw NCCL broadcast from dev0 to dev1 within this process (ncclCommInitAll, both ranks driven
 * from this thread in group calls). */
typedef struct rwb_bcast rwb_bcast;
rw_status rwb_bcast_create(int dev0, int dev1, rwb_bcast **out, rw_err *err);
void rwb_bcast_destroy(rwb_bcast *b);
/* Broadcasts `total` bytes as ceil(total / bucket) broadcasts of at most `bucket` bytes, rotating
 * over 2 bucket buffers of random data on each side; host time from the first enqueue to both
 * streams done, per rep. */
rw_status rwb_bcast_run(rwb_bcast *b, uint64_t total, uint64_t bucket, int warmup, int reps,
                        double *samples, rw_err *err);

/* cuBLASLt bf16 GEMM, fp32 accumulate, bf16 out: C[m x n] = op(A)[m x k] B[k x n] with A stored
 * k x m (transposed) and B k x n, column-major, `batch` independent products (strided). Random
 * inputs, rotating over enough sets to exceed L2; CUDA events per rep. FLOPs = 2 m n k batch. */
typedef struct rwb_gemm rwb_gemm;
rw_status rwb_gemm_create(int dev, rwb_gemm **out, rw_err *err);
void rwb_gemm_destroy(rwb_gemm *g);
rw_status rwb_gemm_run(rwb_gemm *g, int64_t m, int64_t n, int64_t k, int batch, int warmup,
                       int reps, double *samples, rw_err *err);

/* Device name and count, e.g. "2x NVIDIA H200 (sm_90, 132 SMs, 139.8 GiB)". */
void rwb_device_desc(char *buf, size_t cap);
/* Random bf16 values on the device: element i = rw_rand_bf16_at(seed, i, mean, std) (core/rand.h,
 * mean + std * N(0,1) approximately); no zeros except by rounding. `s` is a cudaStream_t. */
rw_status rwb_fill_bf16(void *dst, uint64_t n, uint64_t seed, float mean, float std, void *s,
                        rw_err *err);
rw_status rwb_device_sync(int dev, rw_err *err);
/* cudaProfilerStart / cudaProfilerStop (`ncu --profile-from-start off` profiles what runs between
 * them); a failure is cleared, not reported: profiling is a diagnostic. No-ops without CUDA. */
void rwb_profiler(bool on);
/* Free and total memory of the current device. */
rw_status rwb_mem_info(size_t *free_b, size_t *total_b, rw_err *err);

/* Measures the HBM copy bandwidth of `dev` (2 GiB copies, read + write bytes counted), emits its
 * ceiling line under `bench`, and returns GB/s (ceilings.c). */
rw_status rwb_measure_hbm(rwb_ctx *c, int dev, const char *bench, double *gbps, rw_err *err);
/* Times one GEMM shape (see rwb_gemm_run); emits a ceiling line when `emit`. */
rw_status rwb_measure_gemm(rwb_ctx *c, rwb_gemm *g, const char *bench, const char *what,
                           int64_t m, int64_t n, int64_t k, int batch, bool emit,
                           double *median_s, rw_err *err);

/* ------------------------------------------------------------------------------------------ */
/* Modes: each measures its own ceilings in the same run and prints its lines.                 */
/* ------------------------------------------------------------------------------------------ */
void rwb_mode_ceilings(rwb_ctx *c);
void rwb_mode_sync(rwb_ctx *c);
void rwb_mode_pack(rwb_ctx *c);
void rwb_mode_disk(rwb_ctx *c);
void rwb_mode_decode(rwb_ctx *c);
void rwb_mode_prefill(rwb_ctx *c);
void rwb_mode_tokenizer(rwb_ctx *c); /* tokenizer.c: encode tokens/s vs the reference tokenizers */
void rwb_mode_rollout(rwb_ctx *c);   /* rollout.c: R1, an RL-shaped rollout (not in `all`) */
/* forward_lines.c: G6 / G7's rw side, attention and the expert layer alone (not in `all`) */
void rwb_mode_kernels(rwb_ctx *c);
/* The kernels mode's routing of `tokens` tokens (cfg's experts and top-k) as one JSON array per
 * token on stdout; 0, or 1 with a message when the build has no worker module. */
int rwb_print_routing(const rw_config *cfg, uint64_t seed, long tokens);
/* Releases what engine.c cached in c->engine_state. */
void rwb_engine_release(rwb_ctx *c);

#endif
