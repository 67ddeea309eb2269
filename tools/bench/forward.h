/* forward.h - rw-bench's forward-level benchmarks of the worker (forward.c): decode steps and
 * prefill passes of the CUDA backend driven directly (one forward pass, and sampling, on a
 * synthetic batch and KV cache, no scheduler) on a random model built in device memory (no disk).
 * `rw-bench decode` and `rw-bench prefill` (engine.c) run them at the target points beside the
 * engine-level measurements and re-emit their lines, so the engine's overhead shows as the
 * difference. Each prints one JSON object per result on `out`; RW_BENCH_BREAKDOWN=1 adds the
 * per-phase GPU times of the step (profile.c). CUDA builds; elsewhere RW_E_NO_DEVICE. */
#ifndef RW_BENCH_FORWARD_H
#define RW_BENCH_FORWARD_H

#include <stdio.h>

#include "rw_core.h"

#ifdef __cplusplus
extern "C" {
#endif

struct rw_model; /* rw_worker.h */

#define RWB_FWD_MAX_SHAPES 16
/* An attention shape of the kernel benchmark: seqs sequences of kv keys, causal prefill of every
 * position or one decode query at position kv - 1. */
typedef struct rwb_attn_shape {
    int seqs, kv;
    bool prefill;
} rwb_attn_shape;

typedef struct rwb_fwd_opts {
    const rw_config *cfg; /* NULL = the Qwen3-30B-A3B shape */
    int device;
    int precision;     /* the model's rw_precision (rw_model_opts) */
    int batch, ctx;    /* decode */
    int nprompt, plen; /* prefill */
    int steps;         /* timed decode steps (median reported) */
    bool graphs;       /* CUDA graphs for decode */
    uint64_t seed;
    const char *quant; /* NULL/"none", "mxfp8", "mxfp8-last-N" (last N layers bf16), "fp8" */
    /* kernels: attention shapes, expert-layer token counts, and the layers of the model whose
     * expert weights the repetitions rotate over */
    rwb_attn_shape attn[RWB_FWD_MAX_SHAPES];
    int nattn;
    int expert_tokens[RWB_FWD_MAX_SHAPES];
    int nexpert_tokens;
    int kernel_layers;
    /* kernels: token counts of the dense GEMMs alone (q/k/v, o_proj, lm_head; none by default) */
    int dense_tokens[RWB_FWD_MAX_SHAPES];
    int ndense_tokens;
    /* kernels: token counts of the small per-token kernels (RoPE + KV write, combine + norm) */
    int small_tokens[RWB_FWD_MAX_SHAPES];
    int nsmall_tokens;
} rwb_fwd_opts;
rwb_fwd_opts rwb_fwd_opts_default(void);

/* decode: `batch` sequences at context `ctx` (a random KV cache), `steps` timed steps of forward +
 * sampling (temperature 1) after 3 warm-up ones; the line has the median step, tokens per second
 * and the memory floor against the HBM copy bandwidth measured in the same call. */
rw_status rwb_fwd_decode(const rwb_fwd_opts *o, FILE *out, rw_err *err);
/* prefill: nprompt prompts of plen tokens in one forward pass (median of 3 after a warm-up), and
 * the model's GEMMs alone on layer 0's shapes (cuBLASLt dense, own experts) for comparison. */
rw_status rwb_fwd_prefill(const rwb_fwd_opts *o, FILE *out, rw_err *err);

/* kernels: attention (rw_k_attention, the engine's split) and the expert layer
 * (rw_moe_experts_cuda, on rwb_route_expert's routing) alone, for G6 and G7 (kernels.c), and the
 * dense GEMMs at o->dense_tokens (rwb_fwd_dense); one line per shape with its time, bytes or
 * FLOPs. */
rw_status rwb_fwd_kernels(const rwb_fwd_opts *o, FILE *out, rw_err *err);
/* FLOPs of causal attention over nprompt prompts of plen tokens, every layer: q.k and p.v (2
 * FLOPs per multiply-add) for each query and each key at or before it, every head (G4 counts
 * them beside the GEMMs' FLOPs). */
double rwb_prefill_attn_flops(const rw_config *cfg, int nprompt, int plen);
/* The dense GEMMs alone at M tokens (kernels_dense.c): rw_k_gemm on the model's fused q/k/v,
 * o_proj and lm_head weights with a hi + lo input pair, rotating over up to RWB_DENSE_MAX_LAYERS
 * layers; one line each with its time, bytes and FLOPs. CUDA builds; the model's attention bf16. */
#define RWB_DENSE_MAX_LAYERS 64
rw_status rwb_fwd_dense(struct rw_model *m, int64_t M, uint64_t seed, FILE *out, rw_err *err);
/* The small per-token kernels alone at M tokens (kernels_small.c): rw_k_qk_rope_kv and
 * rw_k_combine_rmsnorm on the model's shapes; one line each with its time and the bytes it must
 * move. CUDA builds. */
rw_status rwb_fwd_small(struct rw_model *m, int64_t M, uint64_t seed, FILE *out, rw_err *err);
/* Median seconds of one call of fn(ctx, rep) on stream `st` (a cudaStream_t) over 5 groups of
 * repetitions of about 20 ms each, after 2 warm-up calls (kernels.c). */
typedef rw_status (*rwb_kern_fn)(void *ctx, int rep, rw_err *err);
rw_status rwb_time_kernel(rwb_kern_fn fn, void *ctx, void *st, double *sec, rw_err *err);
/* A random hi + lo activation pair of n bf16 values each, as the engine passes GEMM inputs: hi
 * N(0, 1) from seed, lo about 2^-8 of it from seed + 1 (kernels.c; st a cudaStream_t). */
rw_status rwb_fill_pair(uint16_t *hi, uint16_t *lo, int64_t n, uint64_t seed, void *st,
                        rw_err *err);
/* Expert j of `token` in the kernel benchmark's routing, given the token's first j experts
 * `chosen`: the first of rw_rand_u64_at(seed, token * 1024 + c) % E, c = 0, 1, ..., that is not
 * among them (k distinct experts, uniform). tools/peer/torch_kernels.py computes the same. */
int32_t rwb_route_expert(uint64_t seed, int64_t token, int j, int E, const int32_t *chosen);
/* The benchmarks' random model (bf16 unless o->quant says otherwise, weights filled on the
 * device); layers > 0 keeps only the first `layers` layers of the config. */
rw_status rwb_fwd_make_model(const rwb_fwd_opts *o, int layers, rw_config *cfg, struct rw_model **m,
                             rw_err *err);

/* rw-bench's lines of these benchmarks (forward_lines.c, rw-bench only): decode at one point,
 * judged as target_id's forward-pass row (G1/forward, G2/forward, G3/forward; tok_s: the bf16
 * tok/s at the G1 point, set by the bf16 call and compared by the mxfp8 one), and prefill against
 * the GEMM ceiling of the run (TFLOP/s). Each runs its own model: the caller frees its own first.
 */
struct rwb_ctx;
void rwb_fwd_decode_lines(struct rwb_ctx *c, bool quant, int batch, int ctx, const char *target_id,
                          double *tok_s);
void rwb_fwd_prefill_lines(struct rwb_ctx *c, double ceil_8192);
/* The kernel lines (bench "kernels": attention_* and experts*) of G6 and G7's rw side. */
void rwb_fwd_kernel_lines(struct rwb_ctx *c);

/* Device kernels of these benchmarks (forward_fill.cu): e4m3 values of magnitude < 1 (no NaN
 * codes) and fp32 constants, each element from (seed, index) only; and one thread spinning `ns`
 * nanoseconds of GPU time (profile.c queues a step behind it). */
rw_status rwb_k_fill_e4m3(uint8_t *p, int64_t n, uint64_t seed, rw_stream s, rw_err *err);
rw_status rwb_k_fill_f32(float *p, int64_t n, float value, rw_stream s, rw_err *err);
rw_status rwb_k_spin(uint64_t ns, rw_stream s, rw_err *err);
/* fp32 values uniform in [-1, 1), each from (seed, index). */
rw_status rwb_k_fill_f32_rand(float *p, int64_t n, uint64_t seed, rw_stream s, rw_err *err);

#ifdef __cplusplus
}
#endif

#endif
