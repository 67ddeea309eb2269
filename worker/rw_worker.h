/* rw_worker.h - the worker module's public contract: the tensor-parallel communicator, the
 * Qwen3-MoE model on a rank's weight set (CPU reference backend and CUDA backend), the paged KV
 * cache, the sampler, the generation engine (continuous batching, chunked prefill, pause/resume,
 * weight-version stamps, stats; for RL: a prefix cache and shared prompt KV for n samples,
 * routed-expert export, raw or processed logprobs, scoring of given continuations) and the
 * `--once` command-line mode.
 *
 * Semantics are those of Hugging Face transformers' Qwen3-MoE (docs/LAYOUT.md for the weights):
 * embedding, per layer [RMSNorm -> q/k/v -> per-head q/k RMSNorm -> RoPE (rotate-half) -> causal
 * GQA attention (fp32 softmax) -> o_proj -> residual -> RMSNorm -> router (fp32 softmax over all
 * experts, top-k, renormalise when norm_topk_prob) -> experts silu(gate)*up -> down -> weighted
 * sum -> residual], final RMSNorm, lm_head.
 *
 * Tensor parallelism: every rank runs the same engine with the same commands; heads, expert
 * shards and vocab rows are split per docs/LAYOUT.md section 2; hidden states are all-reduced
 * after o_proj, after the experts and after the vocab-parallel embedding; logits are all-gathered.
 * Sampling is deterministic from (seed, position), so all ranks pick the same tokens.
 */
#ifndef RW_WORKER_H
#define RW_WORKER_H

#include <stdio.h>

#include "rw_core.h"
#include "rw_quant.h"
#include "rw_moe.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------------------------------ */
/* Tensor-parallel communicator                                                                 */
/* ------------------------------------------------------------------------------------------ */
/* A group of `size` ranks that all-reduce and all-gather. Every rank calls every collective in
 * the same order. Buffers live where the communicator says (host for the single-rank and thread
 * communicators used by the CPU backend, device for NCCL). */
typedef struct rw_comm rw_comm;

/* One rank alone: collectives are no-ops (all-gather copies). Works on host and device buffers. */
rw_status rw_comm_create_single(rw_comm **out, rw_err *err);

/* In-process group for CPU tensor parallelism, one thread per rank (tests and the CPU demo).
 * The group outlives every communicator made from it. */
typedef struct rw_comm_group rw_comm_group;
rw_status rw_comm_group_create(int size, rw_comm_group **out, rw_err *err);
void rw_comm_group_destroy(rw_comm_group *g);
rw_status rw_comm_create_thread(rw_comm_group *g, int rank, rw_comm **out, rw_err *err);

/* NCCL (CUDA builds): rank 0 makes the unique id (RW_NCCL_ID_BYTES, rw_core.h) and hands it to
 * the others out of band. RW_E_NO_DEVICE without CUDA. `device` is made current before the
 * communicator is created. */
rw_status rw_comm_nccl_unique_id(uint8_t id[RW_NCCL_ID_BYTES], rw_err *err);
rw_status rw_comm_create_nccl(const uint8_t id[RW_NCCL_ID_BYTES], int size, int rank, int device,
                              rw_comm **out, rw_err *err);

void rw_comm_destroy(rw_comm *c);
/* Aborts the communicator, from any thread: a collective that waits for a rank that died ends
 * (NCCL: ncclCommAbort stops its kernels, so a stream wait on them returns; the results of the
 * step are garbage), and every later collective fails with RW_E_NCCL without touching the peers.
 * Meant for a watchdog beside a thread stuck in a step; the communicator is only good for
 * rw_comm_destroy afterwards. Idempotent; a no-op for the single-rank and thread communicators
 * and for NULL. */
void rw_comm_abort(rw_comm *c);
int rw_comm_rank(const rw_comm *c);
int rw_comm_size(const rw_comm *c);
/* buf[0..n) = sum over ranks, the same bits on every rank (fixed rank order on the CPU). */
rw_status rw_comm_allreduce_f32(rw_comm *c, float *buf, size_t n, rw_stream s, rw_err *err);
/* recv [size, bytes] = every rank's `bytes` of send, in rank order. */
rw_status rw_comm_allgather(rw_comm *c, const void *send, void *recv, size_t bytes, rw_stream s,
                            rw_err *err);

/* ------------------------------------------------------------------------------------------ */
/* Model                                                                                        */
/* ------------------------------------------------------------------------------------------ */
typedef enum rw_backend {
    RW_BACKEND_CPU = 0,  /* plain C, fp32 activations and accumulation, fp32 KV cache */
    RW_BACKEND_CUDA = 1, /* bf16 GEMM inputs, fp32 accumulation and residual, bf16 KV cache */
} rw_backend;

const char *rw_backend_str(rw_backend b); /* "cpu", "cuda" */
rw_status rw_backend_parse(const char *s, rw_backend *out, rw_err *err);

/* The CUDA backend's activation precision (the CPU backend computes in fp32 either way).
 * STANDARD: the GEMM inputs upstream of the routers travel as hi + lo bf16 pairs, the KV cache,
 * the softmax weights and the down projection's input are one bf16 each; the router logits land
 * within about 1e-2 of an fp32 forward pass's. HIGH: those three are pairs too, and the router
 * logits land within about 3e-5 of it (measured on the test fixtures), below the gaps that
 * decide routing ties in practice, so a token takes the experts the fp32 model gives it; for
 * twice the KV cache's memory and attention's reads, and one more MMA per attention product and
 * down projection (docs/BENCHMARKS.md has the cost). */
typedef enum rw_precision {
    RW_PRECISION_STANDARD = 0,
    RW_PRECISION_HIGH = 1,
} rw_precision;

const char *rw_precision_str(rw_precision p); /* "standard", "high" */
rw_status rw_precision_parse(const char *s, rw_precision *out, rw_err *err);

typedef struct rw_model_opts {
    rw_backend backend;
    int device;    /* CUDA ordinal (CUDA backend) */
    int tp, rank;  /* tensor-parallel degree and this rank; tp 1 when comm is NULL */
    rw_comm *comm; /* borrowed, must outlive the model; NULL for a single rank */
    rw_precision precision; /* CUDA backend; RW_PRECISION_STANDARD = 0 */
} rw_model_opts;

typedef struct rw_model rw_model;

/* Creates the rank's (zeroed) weight set on the backend's place and the backend state. The
 * config is copied. */
rw_status rw_model_create(const rw_config *cfg, const rw_model_opts *o, rw_model **out,
                          rw_err *err);
void rw_model_destroy(rw_model *m);
const rw_config *rw_model_config(const rw_model *m);
const rw_tp_dims *rw_model_dims(const rw_model *m);
rw_backend rw_model_backend(const rw_model *m);
rw_wset *rw_model_wset(rw_model *m); /* borrowed; updates write through rw_wset_apply */
/* Frees the device memory the backend keeps derived from the weights (the CUDA backend's bf16
 * copies of quantized dense weights), for a worker that hands its weights' memory back
 * (release_memory); the next forward pass makes them again, or, where that memory is gone by
 * then, dequantizes every step instead. No effect on results. */
void rw_model_release_derived(rw_model *m);

/* Loads every tensor of a Hugging Face checkpoint directory (whole tensors, bf16 or pre-quantized
 * with .weight_scale_inv) through rw_wset_apply, then checks the set is complete. */
rw_status rw_model_load_ckpt(rw_model *m, const char *dir, rw_err *err);
/* Fills every canonical weight with seeded random bf16 through the same apply path: norms
 * 1 + 0.1 N(0,1), everything else std * N(0,1) (std <= 0 picks 0.02). Same seed, same weights on
 * every rank and TP degree. */
rw_status rw_model_load_random(rw_model *m, uint64_t seed, float std, rw_err *err);

/* Teacher forcing: runs `tokens` [n] (positions 0..n-1) through the model with a scratch KV cache
 * and writes the logits of every position to host `logits` [n, V] fp32. For tests. */
rw_status rw_model_score(rw_model *m, const int32_t *tokens, int n, float *logits, rw_err *err);

/* ------------------------------------------------------------------------------------------ */
/* Sampling                                                                                     */
/* ------------------------------------------------------------------------------------------ */
#define RW_MAX_STOP 16
#define RW_MAX_TOP_LOGPROBS 20

/* What a reported logprob is the log-probability of (rw_sampling.logprob_mode). */
typedef enum rw_logprob_mode {
    RW_LOGPROB_RAW = 0,       /* log_softmax of the raw logits */
    RW_LOGPROB_PROCESSED = 1, /* under the distribution actually sampled from */
} rw_logprob_mode;

/* Per-request sampling parameters. The rules, identical on every backend and TP degree:
 * - logprob_mode raw (the default): logprob = log_softmax(raw logits)[token], the unmodified
 *   distribution (no temperature, top-k or top-p applied), the quantity an RL trainer compares
 *   against its own forward pass;
 * - logprob_mode processed: the log-probability under the distribution the token was drawn from:
 *   z = logits / temperature restricted to the kept set below and renormalised, i.e.
 *   z[token] - zmax - log(sum over the kept ids of exp(z - zmax)); -inf for an id outside the kept
 *   set; greedy (below) puts all mass on the argmax: 0 for it, -inf for every other id. The top
 *   logprobs are reported in the same mode (the same ids: the best raw logits);
 * - temperature <= 0 or top_k == 1: greedy (argmax of the raw logits, ties to the lower id);
 *   so is a temperature too small to invert in float (1/T, or the largest logit / T, not finite:
 *   rw_sample_inv_temperature), the T -> 0 limit of softmax(logits / T);
 * - otherwise z = logits / temperature; keep the ids whose z is >= the k-th largest z (top_k > 0;
 *   ties at the boundary all kept); then keep the ids whose z is >= the value where the
 *   descending cumulative softmax mass of the kept set first reaches top_p (top_p < 1); draw
 *   u in [0, 1) from (seed, position of the token being generated) only and return the first id,
 *   in ascending id order over the kept set, whose cumulative mass exceeds u * total. */
typedef struct rw_sampling {
    float temperature;
    float top_p; /* (0, 1]; values outside are refused */
    int top_k;   /* 0 = all */
    uint64_t seed;
    int max_new_tokens; /* >= 1 */
    int n_stop;
    int32_t stop_ids[RW_MAX_STOP]; /* generation ends after emitting one of these */
    int top_logprobs; /* 0..RW_MAX_TOP_LOGPROBS: also return the n best (id, logprob) */
    int logprob_mode; /* rw_logprob_mode (RW_LOGPROB_RAW = 0) */
} rw_sampling;

/* Greedy, max_new_tokens 16, top_p 1, no stops. */
rw_sampling rw_sampling_default(void);

/* The uniform draw of the rule above: splitmix64 of (seed, position), 24 bits, in [0, 1). */
float rw_sample_uniform(uint64_t seed, int64_t position);

/* CPU reference of one row: logits [V] fp32 -> token, its logprob, and the top-n (ids sorted by
 * descending logprob, ties to the lower id). `scratch` holds 2*V floats + V int32. */
rw_status rw_sample_row_ref(const float *logits, int V, const rw_sampling *sp, int64_t position,
                            void *scratch, int32_t *token, float *logprob, int32_t *top_ids,
                            float *top_lps, rw_err *err);
/* The same rule for a given token (scoring a continuation; no draw): its logprob in
 * sp->logprob_mode and the top-n, exactly as rw_sample_row_ref reports them when it draws that
 * token. RW_E_RANGE for a token outside [0, V). */
rw_status rw_logprob_row_ref(const float *logits, int V, const rw_sampling *sp, int32_t token,
                             void *scratch, float *logprob, int32_t *top_ids, float *top_lps,
                             rw_err *err);

/* ------------------------------------------------------------------------------------------ */
/* Engine: continuous batching over a paged KV cache                                            */
/* ------------------------------------------------------------------------------------------ */
typedef struct rw_engine_opts {
    int max_running;      /* sequences in the running batch (default 256) */
    int max_batch_tokens; /* tokens per step: decodes + prefill chunks (default 2048) */
    int kv_block_size;    /* tokens per KV block (default 16) */
    size_t kv_bytes;      /* KV memory budget; 0 = kv_fraction of free device memory (CUDA) or
                             64 MiB (CPU) */
    double kv_fraction;   /* default 0.9 of the device memory free after weights and workspace */
    int max_seq_len;      /* prompt + generated tokens; 0 = max_position_embeddings */
    bool prefix_sharing;  /* prefix cache and shared prompt KV of n samples (default true);
                             false: every request computes and holds all of its own KV */
} rw_engine_opts;

rw_engine_opts rw_engine_opts_default(void);

typedef enum rw_finish {
    RW_FINISH_NONE = 0,   /* still running */
    RW_FINISH_LENGTH = 1, /* max_new_tokens or max_seq_len reached */
    RW_FINISH_STOP = 2,   /* a stop token was emitted (it is included in the output) */
    RW_FINISH_ABORT = 3,  /* aborted; the tokens generated so far are returned */
} rw_finish;
const char *rw_finish_str(rw_finish f); /* "running", "length", "stop", "abort" */

/* A run of generated tokens produced under one weight version: tokens [begin, end). */
typedef struct rw_version_span {
    uint64_t version;
    int begin, end;
} rw_version_span;

/* A finished request. Owned by the caller after rw_engine_pop_output; free with
 * rw_output_free. A score request (rw_request_opts.n_score) reports its continuation as the
 * `n` tokens with their logprobs, finish length, and no spans beyond the one version. */
typedef struct rw_output {
    uint64_t id;
    int n_prompt;
    int n;               /* generated tokens */
    int32_t *tokens;     /* [n] */
    float *logprobs;     /* [n] logprob of each token (sampling.logprob_mode) */
    int top_n;           /* top logprobs per token (0 when not asked) */
    int32_t *top_ids;    /* [n, top_n] */
    float *top_logprobs; /* [n, top_n] */
    rw_finish finish;
    int n_spans;
    rw_version_span *spans;           /* [n_spans], in token order, covering [0, n) */
    double t_submit, t_first, t_done; /* rw_now() stamps */
    /* score requests with prompt_logprobs: [n_prompt], entry 0 NaN (no token before it) */
    float *prompt_logprobs;
    /* routed experts (rw_request_opts.routed_experts): the router's top-k of every token and
     * layer, token-major: [n_routed, route_layers, route_k], descending weight. n_routed is
     * n_prompt + n (every prompt and generated token; the last generated token is run through
     * the model once more for it) except for aborted requests, which have the tokens computed
     * so far. Tokens whose KV came from the prefix cache or a sibling sample have the routes
     * recorded when that KV was computed (stored with the KV blocks). */
    int n_routed, route_layers, route_k;
    uint16_t *routed_ids;  /* [n_routed, route_layers, route_k] expert ids */
    float *routed_weights; /* same shape, routing weights; NULL unless asked */
    int n_reused;          /* prompt tokens whose KV was reused (prefix cache or a sibling) */
} rw_output;
void rw_output_free(rw_output *o);

typedef enum rw_pause_mode {
    RW_PAUSE_ABORT = 0,    /* finish every request now with what it has (finish = abort) */
    RW_PAUSE_RETRACT = 1,  /* drop their KV and requeue them, generated tokens kept; after resume
                              their KV is recomputed and generation continues */
    RW_PAUSE_IN_PLACE = 2, /* freeze them with their KV kept */
} rw_pause_mode;

typedef struct rw_engine_stats {
    int waiting, running, paused; /* requests queued (sibling samples waiting for their first
                                     sample's prefill included), in the batch; paused flag */
    int64_t steps, prompt_tokens, generated_tokens, preemptions;
    double gen_tokens_per_s;                 /* over the last few seconds of steps */
    int64_t kv_blocks_total, kv_blocks_used; /* used: held by requests (a shared block once) */
    int kv_block_size;
    size_t kv_bytes;
    bool kv_released;
    uint64_t weight_version;
    /* prefix sharing (prompt_tokens above counts the tokens actually computed) */
    int64_t kv_blocks_cached;    /* blocks in the prefix cache (held or idle) */
    int64_t kv_blocks_allocated; /* cumulative: blocks taken for newly computed KV */
    int64_t kv_blocks_evicted;   /* cumulative: idle cached blocks reused for other KV */
    int64_t prefix_hits;         /* admissions that reused cached blocks */
    int64_t prefix_tokens_saved; /* tokens whose KV was reused instead of computed */
    int64_t forked_samples;      /* samples that started from a sibling's prefill */
    int64_t score_tokens;        /* tokens scored (continuation and prompt logprobs) */
    /* the last step's forward (for per-step floors): tokens, sequences, logits rows, the sum of
     * its sequences' context lengths (keys each reads), and of (query, key) pairs attended */
    int64_t last_tokens, last_seqs, last_logits, last_ctx, last_attn;
    /* cumulative wall seconds of the steps that ran a forward pass, and within them of the
     * model's calls (forward, KV copies, sampling; on the CUDA backend these include waiting for
     * the device): step_s - model_s is the engine's own host work (scheduling, bookkeeping) */
    double step_s, model_s;
} rw_engine_stats;

typedef struct rw_engine rw_engine;

/* The engine borrows the model (which must outlive it) and allocates the KV cache. */
rw_status rw_engine_create(rw_model *m, const rw_engine_opts *o, rw_engine **out, rw_err *err);
void rw_engine_destroy(rw_engine *e);

/* Queues a request. `prompt` is copied. Refused (RW_E_RANGE) when a token id is outside
 * [0, V), when prompt + max_new_tokens exceeds max_seq_len or the whole KV cache, and
 * (RW_E_INVALID_ARG) for a duplicate id or bad sampling parameters. */
rw_status rw_engine_add(rw_engine *e, uint64_t id, const int32_t *prompt, int n,
                        const rw_sampling *sp, rw_err *err);
/* What a request asks for beyond sampling (rw_engine_add_ex). Zero is plain generation. */
typedef struct rw_request_opts {
    /* Generation: n_samples >= 1 requests with ids id .. id + n_samples - 1 sample the same
     * prompt; sample i uses seed sp->seed + i (0 means 1). The first is prefilled (reusing the
     * prefix cache); the others then start from its KV: its full blocks shared (reference
     * counts), its partly filled last block copied, their first tokens drawn from its logits
     * row with their own seeds. Without room (KV, max_running) or with prefix sharing off, a
     * sample runs on its own. Either way each sample's tokens and logprob bits are those it
     * produces alone. */
    int n_samples;
    /* Scoring: > 0 makes this a score request: the last n_score tokens of the request's tokens
     * are a given continuation of the first n - n_score (the prompt, >= 1 token); one prefill,
     * no sampling; the output's tokens and logprobs are the continuation's, with the logprobs
     * generate reports for those tokens (sp's logprob_mode, temperature, top_k, top_p; sp's
     * top_logprobs too). max_new_tokens, seed and stop ids are not used. */
    int n_score;
    bool prompt_logprobs; /* score: also the logprobs of prompt tokens 1 .. n_prompt - 1 */
    bool routed_experts;  /* record the router's top-k of every token (rw_output) */
    bool routing_weights; /* and their weights (needs routed_experts) */
    /* n_samples > 1 (engine API only: the daemon's rank ops do not carry it): sample i stops
     * after sample_max_new[i] tokens, 1..sp->max_new_tokens, instead of sp->max_new_tokens
     * (benchmarks emulating response lengths); NULL: all after sp->max_new_tokens. Copied. */
    const int *sample_max_new;
} rw_request_opts;

/* rw_engine_add with options (NULL: none). A score request's tokens are prompt then
 * continuation, and it needs room for all of them (max_seq_len, KV cache). Refused
 * (RW_E_INVALID_ARG) for n_samples outside 1..65536, n_score outside [0, n), n_samples > 1 with
 * a score, routing_weights without routed_experts, an id of the n_samples already in use. */
rw_status rw_engine_add_ex(rw_engine *e, uint64_t id, const int32_t *tokens, int n,
                           const rw_sampling *sp, const rw_request_opts *o, rw_err *err);
/* Finishes a request now (finish = abort, partial tokens kept) and frees its KV.
 * RW_E_NOT_FOUND if it is neither queued nor running. */
rw_status rw_engine_abort(rw_engine *e, uint64_t id, rw_err *err);
void rw_engine_abort_all(rw_engine *e);

/* One scheduler iteration: admits waiting requests while KV blocks and the token budget allow,
 * runs one forward pass over the decodes and prefill chunks, samples, retires finished requests.
 * A no-op while paused or idle. When a decode needs a KV block and none is free, the most
 * recently admitted request is retracted (KV dropped, requeued first, tokens kept). */
rw_status rw_engine_step(rw_engine *e, rw_err *err);
/* True when nothing is queued or running (or everything is paused in place). */
bool rw_engine_idle(const rw_engine *e);
/* Steps until idle. */
rw_status rw_engine_run(rw_engine *e, rw_err *err);
/* Takes the next finished request (in finishing order); NULL when none. */
rw_output *rw_engine_pop_output(rw_engine *e);
/* Number of tokens generated so far by a queued or running request (-1 if unknown). */
int rw_engine_progress(const rw_engine *e, uint64_t id);
/* Copies generated tokens [from, from + cap) of a queued or running request, and their logprobs
 * when `logprobs` is non-NULL (streaming); *n gets the number copied. RW_E_NOT_FOUND if the
 * request is neither queued nor running, RW_E_RANGE if `from` is past what it generated. */
rw_status rw_engine_peek(const rw_engine *e, uint64_t id, int from, int32_t *tokens,
                         float *logprobs, int cap, int *n, rw_err *err);

rw_status rw_engine_pause(rw_engine *e, rw_pause_mode mode, rw_err *err);
rw_status rw_engine_resume(rw_engine *e, rw_err *err);
bool rw_engine_paused(const rw_engine *e);
/* Drops all cached KV: the prefix cache is emptied. Refused (RW_E_BUSY) while any request holds
 * KV (running or paused in place). */
rw_status rw_engine_flush_cache(rw_engine *e, rw_err *err);
/* Frees the KV cache memory (for a colocated trainer); refused (RW_E_BUSY) while any request holds
 * KV. Steps do nothing until rw_engine_resume_kv re-allocates it. */
rw_status rw_engine_release_kv(rw_engine *e, rw_err *err);
rw_status rw_engine_resume_kv(rw_engine *e, rw_err *err);
/* Tokens sampled from now on are stamped with `version`, and KV is cached under it. Whoever
 * changes the weights must give them a new version: a change of version empties the prefix
 * cache (KV of other weights is never reused), and the KV that requests still hold from before
 * is not cached later. */
void rw_engine_set_weight_version(rw_engine *e, uint64_t version);
void rw_engine_stats_get(const rw_engine *e, rw_engine_stats *out);

/* ------------------------------------------------------------------------------------------ */
/* --once mode                                                                                  */
/* ------------------------------------------------------------------------------------------ */
/* `rw-worker --once ...`: parses argv (after the program name), loads the model, generates one
 * request and prints {"tokens": [...], "logprobs": [...], "finish": "..."} on `out`. Returns the
 * process exit status (0 ok, 2 usage, 1 failure with a message on stderr). */
int rw_worker_once_main(int argc, char **argv, FILE *out);

#ifdef __cplusplus
}
#endif

#endif /* RW_WORKER_H */
