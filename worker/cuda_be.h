/* cuda_be.h - the CUDA backend's state and the functions its files share (CUDA builds only).
 *
 *   cuda_backend.c  what the backend computes and why (precision, batch invariance); init,
 *                   destroy, the ops table, the benchmark-facing setters (bench_iface.h)
 *   cuda_scratch.c  activation and per-step metadata buffers, sized for a batch
 *   cuda_kv.c       the paged KV cache
 *   cuda_forward.c  the model on one batch whose metadata is on the device (run_model), the
 *                   attention split
 *   cuda_step.c     ops->forward: batch checks, metadata upload, then an eager run or a decode
 * graph cuda_graphs.c   decode graphs (capture, cache, replay) and the hooked run of bench_iface.h
 *   cuda_sample.c   ops->sample, ops->logits_host and ops->routes
 *   cuda_random.c   ops->load_random: random weights generated on the device
 *
 * Shapes: x, y [T, H] fp32; h, h_lo [T, H] bf16; h32 [T, H] fp32; q [T, nh*hd], k, v [T, nkv*hd]
 * fp32 (GEMM outputs); qf [T, nh*hd] fp32 (normed, rotated); att, att_lo [T, nh*hd] bf16; KV per
 * layer [nblocks + 1, nkv, bs, hd] bf16 (block nblocks is a scratch block the padding rows of a
 * decode graph write to); logits [rows, V] fp32. */
#ifndef RW_WORKER_CUDA_BE_H
#define RW_WORKER_CUDA_BE_H

#include <cuda_runtime_api.h>

#include "bench_iface.h"
#include "cuda_check.h"
#include "internal.h"
#include "kernels/attention.h"
#include "kernels/sample.h"

struct rw_kv {
    int64_t nblocks;
    int bs;
    uint16_t *k, *v;       /* [L, nblocks + 1, nkv, bs, hd] */
    uint16_t *k_lo, *v_lo; /* the pairs' low halves, same shape (RW_PRECISION_HIGH), or NULL */
    size_t layer_elems;    /* (nblocks + 1) * nkv * bs * hd */
};

/* Layer l's arrays of kv (kernels/common.h). */
rw_kv_planes rw_cuda_kv_layer(const rw_kv *kv, int l);

/* A captured decode step: B rows (the batch padded up to a graph bucket), the block-table stride
 * and attention split it was captured with, on one KV cache. */
#define MAX_GRAPHS 64
typedef struct dgraph {
    int B, bt_stride, nsplit;
    const rw_kv *kv;
    cudaGraphExec_t exec;
} dgraph;

/* Attention splits (attention.h): batches of at most SPLIT_MAX_TOK tokens spread each token's key
 * segments over up to SPLIT_MAX CTAs; the partials buffer holds SPLIT_SEGS segments of
 * SPLIT_MAX_TOK tokens (smaller batches: proportionally more segments, i.e. longer contexts). */
#define SPLIT_MAX_TOK 256
#define SPLIT_MAX 16
#define SPLIT_SEGS 16

typedef struct cuda_be {
    cudaStream_t st;
    int nsm;
    /* capacities of the scratch below */
    int64_t cap_tok, cap_log;
    int cap_seq, cap_bt;
    float *x, *y, *q, *h32, *rl, *wts, *lg_local, *gath, *logits, *qf; /* q: [q | k | v] rows */
    uint16_t *h, *h_lo, *att, *att_lo, *hl, *wdeq;
    /* Quantized dense weights (models with a quantization config): a side stream dequantizes
     * layer l's o_proj (into wdeq_o) and layer l + 1's q/k/v (into wdeq2 or wdeq, alternating)
     * while layer l's q/k/v GEMM, RoPE and attention run on st; ev_fork and ev_join order the two
     * (cuda_forward.c). NULL without a quantization config. */
    cudaStream_t side;
    uint16_t *wdeq2, *wdeq_o;
    cudaEvent_t ev_fork, ev_join;
    /* bf16 copies of the quantized layers' dense weights, remade when the weights change
     * (cuda_dense.c): dq_qkv[l] [qd + 2 kd, H] and dq_o[l] [H, qd] in dq_mem, NULL for bf16
     * layers; all NULL where there was no memory for them (the side stream's path then) */
    uint16_t **dq_qkv, **dq_o;
    void *dq_mem;
    uint64_t dq_gen; /* the rw_wset_generation they were made at, when dq_valid */
    bool dq_valid;
    bool dq_want; /* the model has quantized layers and copies are wanted (not yet refused) */
    int32_t *ids; /* [L, cap_tok, top_k]; wts the same shape */
    void *attn_part;
    size_t attn_part_bytes;
    void *moe_ws;
    size_t moe_ws_bytes;
    void *gemm_ws; /* the dense GEMMs' K-split workspace (gemm.h), counters zeroed */
    size_t gemm_ws_bytes;
    int32_t *route_cnt; /* the router's token-group counters (router.h), zeroed */
    int64_t route_ncnt;
    float *inv_freq;
    /* metadata: device buffer and its pinned host mirror, layout fixed by the capacities. The
     * upload is asynchronous: meta_ev marks it done, and the mirror is not rewritten before it is
     * (a prefill chunk queues no host sync, so the next chunk would otherwise overwrite the
     * mirror while the previous copy waits in the stream) */
    uint8_t *meta_d, *meta_h;
    cudaEvent_t meta_ev;
    bool meta_pending;
    size_t meta_bytes;
    size_t off_pos, off_slot, off_rows, off_tiles, off_bt;
    rw_k_sample_param *sp_d, *sp_h;
    rw_k_sample_out *so_d, *so_h;
    void *smp_ws; /* the sampler's chunk sums (rw_k_sample_ws_bytes for cap_smp requests) */
    size_t smp_ws_bytes;
    int cap_smp;
    int64_t nlogits;
    int64_t last_ntok; /* tokens of the last forward (ops->routes) */
    bool use_graphs;
    dgraph graphs[MAX_GRAPHS];
    int ngraphs;
    /* the phase hook (bench_iface.h): NULL in the product */
    rw_cuda_fwd_hook *hook;
    bool capturing;   /* run_model is being captured for the hook */
    bool hook_failed; /* a mark failed during that capture */
} cuda_be;

/* Decode batch sizes that get a graph (a batch is padded up to the next one). */
extern const int rw_cuda_graph_buckets[];
extern const int rw_cuda_graph_nbuckets;

/* cuda_dense.c: a quantized dense weight [N, K] (fmt, scales sc) dequantized to bf16 at out on s,
 * and a layer's q, k and v one after the other ([qd + 2 kd, H]); the copies: claimed at backend
 * init (a warning and none when the memory is not there; RW_DENSE_BF16_COPIES=0: none), remade
 * by refresh when the weights' generation moved (on st; refused inside a graph capture, so the
 * graph paths refresh before they capture or replay), freed with the backend. */
rw_status rw_cuda_dequant(rw_stream s, rw_wfmt fmt, const rw_tensor *w, const rw_tensor *sc,
                          uint16_t *out, rw_err *err);
rw_status rw_cuda_dequant_qkv(rw_stream s, const rw_layer_weights *lw, int64_t qd, int64_t kd,
                              int64_t H, uint16_t *out, rw_err *err);
void rw_cuda_dense_init(rw_model *m);
rw_status rw_cuda_dense_refresh(rw_model *m, rw_err *err);
void rw_cuda_dense_free(cuda_be *be);
/* ops->release_derived: the copies' memory handed back; refresh claims it again (dropping the
 * decode graphs, which read the old copies) or, without room, turns the copies off */
void rw_cuda_dense_release(rw_model *m);

/* cuda_scratch.c */
rw_status rw_cuda_ensure(rw_model *m, int64_t ntok, int64_t nlog, int nseq, int nbt, rw_err *err);
rw_status rw_cuda_reserve(rw_model *m, int64_t max_tokens, int max_seqs, rw_err *err);
void rw_cuda_free_scratch(cuda_be *be);

/* cuda_kv.c */
size_t rw_cuda_kv_block_bytes(rw_model *m, int bs);
rw_status rw_cuda_kv_budget(rw_model *m, double fraction, size_t *bytes, rw_err *err);
rw_status rw_cuda_kv_create(rw_model *m, int64_t nblocks, int bs, rw_kv **out, rw_err *err);
void rw_cuda_kv_destroy(rw_model *m, rw_kv *kv);
rw_status rw_cuda_kv_copy(rw_model *m, rw_kv *kv, const int32_t *src, const int32_t *dst, int n,
                          rw_err *err);

/* cuda_forward.c */
rw_status rw_cuda_run_model(rw_model *m, rw_kv *kv, int64_t ntok, int ntiles, int qt, int64_t nlog,
                            int bt_stride, int nsplit, rw_err *err);
int rw_cuda_pick_split(const cuda_be *be, int64_t ntok, int ntiles, int nkv, int nh, int hd,
                       int64_t max_ctx);
int rw_cuda_graph_split(const rw_model *m, int B, int64_t max_ctx);
/* Tells the hook (if any) that `phase` ended (bench_iface.h). */
void rw_cuda_mark(cuda_be *be, int phase);

/* cuda_step.c */
rw_status rw_cuda_forward(rw_model *m, rw_kv *kv, const rw_fwd_batch *b, rw_err *err);

/* cuda_graphs.c: the decode step of B rows (metadata on the device) from the graph cache,
 * captured on first use; hooked: the same step run for the hook (bench_iface.h) */
rw_status rw_cuda_run_graph(rw_model *m, rw_kv *kv, int B, int stride, int64_t max_ctx,
                            rw_err *err);
rw_status rw_cuda_run_hooked(rw_model *m, rw_kv *kv, int B, int64_t ntok, int ntiles, int qt,
                             int64_t nlog, int stride, int64_t max_ctx, rw_err *err);
void rw_cuda_drop_graphs(cuda_be *be);

/* cuda_sample.c */
rw_status rw_cuda_sample(rw_model *m, int n, const rw_sample_req *req, rw_sample_res *res,
                         rw_err *err);
rw_status rw_cuda_logits_host(rw_model *m, int row0, int nrows, float *dst, rw_err *err);
rw_status rw_cuda_routes(rw_model *m, int64_t ntok, int32_t *ids, float *wts, rw_err *err);

/* cuda_random.c */
rw_status rw_cuda_load_random(rw_model *m, uint64_t seed, float std, rw_err *err);

#endif
