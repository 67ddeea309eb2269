/* bench_iface.h - the worker's benchmark-facing internal interface: what the forward-level
 * benchmarks (tools/bench/forward.c, profile.c) need beyond the public API to run single forward
 * passes of the CUDA backend on a synthetic batch (m->ops on an rw_fwd_batch, internal.h) and to
 * time their phases. Not a public contract: the product never calls these; only tools/bench and
 * its test include this header. CUDA builds only (the functions exist only there).
 *
 * The phase hook is the one place the backend knows about profiling: a forward with a hook set
 * reports the end of each phase of every layer to it, on the backend's stream, as the work is
 * queued; the benchmark records CUDA events there. */
#ifndef RW_WORKER_BENCH_IFACE_H
#define RW_WORKER_BENCH_IFACE_H

#include "internal.h"
#include "kernels/random.h" /* rw_k_fill_bf16: the benchmarks fill their data with it too */

#ifdef __cplusplus
extern "C" {
#endif

/* The backend's stream (a cudaStream_t): everything of a forward and of a sample is queued on it.
 */
void *rw_cuda_be_stream(rw_model *m);
/* Decode graphs on (the default) or off (every batch runs eagerly; the graph cache is dropped). */
void rw_cuda_be_set_graphs(rw_model *m, bool on);
/* The device K and V storage of a KV cache made by this backend (and the low halves in the
 * high-precision mode, else NULL): each holds `elems` bf16 values (every layer, the scratch block
 * included). */
void rw_cuda_be_kv_buffers(rw_model *m, rw_kv *kv, rw_kv_planes *all, size_t *elems);
/* The RoPE frequencies the forward pass passes to rw_k_qk_rope_kv: device fp32 [head_dim / 2]. */
const float *rw_cuda_be_inv_freq(rw_model *m);

/* The attention split (rw_k_attention's nsplit) the forward pass uses for ntok tokens in ntiles
 * tiles whose longest context is max_ctx (a decode batch, ntok == ntiles, as its graph picks it),
 * and the backend's partials buffer for it (sized by the last reserve). The kernel benchmark
 * (tools/bench/kernels.c) times attention with the engine's own choice. */
int rw_cuda_be_attn_split(rw_model *m, int64_t ntok, int ntiles, int64_t max_ctx, void **part,
                          size_t *part_bytes);

/* Phases of the forward pass, in the order they end within a layer. */
enum {
    RW_PHASE_EMBED = 0,   /* embedding */
    RW_PHASE_NORM = 1,    /* input and post-attention RMSNorms (with the residual adds) */
    RW_PHASE_QKV = 2,     /* q/k/v GEMM(s), dequantization included */
    RW_PHASE_ROPE = 3,    /* per-head q/k norm, RoPE, KV cache write */
    RW_PHASE_ATTN = 4,    /* paged attention (and the split combine) */
    RW_PHASE_OPROJ = 5,   /* o_proj GEMM, dequantization included */
    RW_PHASE_ROUTER = 6,  /* router logits and top-k */
    RW_PHASE_EXPERTS = 7, /* expert sort, w13 and w2 GEMMs, combine */
    RW_PHASE_COMM = 8,    /* tensor-parallel all-reduces and the logits all-gather */
    RW_PHASE_LMHEAD = 9,  /* final norm, lm_head GEMM, logits gather */
    RW_PHASE_COUNT = 10,
    RW_PHASE_START = 10,        /* marked before the first phase of a forward */
    RW_PHASE_SAMPLE_BEGIN = 11, /* before the sampling kernel (ops->sample) */
    RW_PHASE_SAMPLE_END = 12,   /* after it */
};

/* An observer of the forward pass (and of sampling), set with rw_cuda_be_set_hook. While one is
 * set, ops->forward:
 * - calls mark(ctx, phase, stream, capturing) at RW_PHASE_START and at the end of every phase
 *   (several times per phase and layer), on the backend's stream, as the work is queued; capturing
 *   says the stream is being captured into a graph (an event must then be recorded with
 *   cudaEventRecordExternal). mark returns false when it could not record;
 * - runs a decode batch (when graphs are on and no_graph is false) as a graph captured for this
 *   one call, not cached, so the marks are inside it, and replays it once, synchronously; graph
 *   is set true then. A capture that fails, or in which a mark failed, is dropped;
 * - otherwise (and after a dropped capture) calls before_eager(ctx, stream, err), fails with its
 *   status when it is not RW_OK, and queues the batch eagerly (a profiler queues a spin kernel
 * there, so the host has queued the whole step before the GPU starts it and the events time the GPU
 * rather than the launches). ops->sample marks RW_PHASE_SAMPLE_BEGIN and RW_PHASE_SAMPLE_END around
 * its kernel. The cached decode graphs are neither used nor changed while a hook is set. */
typedef struct rw_cuda_fwd_hook {
    void *ctx;
    bool (*mark)(void *ctx, int phase, void *stream, bool capturing);
    rw_status (*before_eager)(void *ctx, void *stream, rw_err *err);
    bool no_graph; /* in: run decode batches eagerly too */
    bool graph;    /* out: the last forward was a graph replay */
} rw_cuda_fwd_hook;
/* Sets (h borrowed until it is removed) or removes (NULL) the hook. */
void rw_cuda_be_set_hook(rw_model *m, rw_cuda_fwd_hook *h);

#ifdef __cplusplus
}
#endif

#endif
