/* internal.h - worker internals shared by the model, the backends (cpu.c, cuda_*.c) and the
 * engine: the forward-batch description, the backend interface (a struct of function pointers),
 * the model struct, random weights and the communicator interface. Not part of the public
 * contract. */
#ifndef RW_WORKER_INTERNAL_H
#define RW_WORKER_INTERNAL_H

#include "rw_worker.h"

#ifdef __cplusplus
extern "C" {
#endif

/* One sequence's part of a forward step. Its tokens are tokens[tok0, tok0 + ntok) of the batch,
 * at positions pos0 .. pos0 + ntok - 1; the KV of positions [0, pos0) is already in the cache,
 * the step writes positions [pos0, pos0 + ntok). blocks[i] is the physical KV block holding
 * positions [i*bs, (i+1)*bs). */
typedef struct rw_fwd_seq {
    int32_t tok0, ntok, pos0;
    const int32_t *blocks; /* [ceil((pos0 + ntok) / bs)] */
    int32_t logits_row;    /* row of the logits output for the sequence's last token; -1 none */
    int32_t logits_n;      /* with logits_row >= 0: the chunk's last logits_n tokens (1..ntok) get
                              rows logits_row .. logits_row + logits_n - 1, in token order (scoring
                              a sequence); 0 means 1 */
} rw_fwd_seq;

/* Rows of logits a sequence asks for (0 when logits_row < 0). */
static inline int32_t rw_fwd_seq_rows(const rw_fwd_seq *q) {
    return q->logits_row < 0 ? 0 : q->logits_n > 1 ? q->logits_n : 1;
}

typedef struct rw_fwd_batch {
    int nseq;
    const rw_fwd_seq *seq;
    int32_t ntok;
    const int32_t *tokens; /* [ntok] */
    int32_t nlogits;       /* rows of logits produced */
    bool all_logits;       /* teacher forcing: token i gets logits row i (nlogits == ntok) */
} rw_fwd_batch;

/* What every backend checks before a forward (model.c): a non-empty batch whose sequences cover
 * tokens [0, ntok) in order, blocks of their positions inside a KV cache of nblocks blocks of bs
 * tokens, logits rows in range and each asked once (nlogits == ntok for all_logits), token ids in
 * [0, V). Reports the longest context (largest pos0 + ntok) and the most KV blocks one sequence
 * spans (at least 1). */
rw_status rw_fwd_batch_check(const rw_model *m, const rw_fwd_batch *b, int64_t nblocks, int bs,
                             int64_t *max_ctx, int *max_blocks, rw_err *err);

/* Backend-owned KV storage: nblocks blocks of bs tokens for every layer. */
typedef struct rw_kv rw_kv;

/* One sampling request against a row of the last forward's logits. Several requests may name
 * the same row (the n samples of one prompt draw their first tokens from its one logits row). */
typedef struct rw_sample_req {
    const rw_sampling *sp;
    int64_t position; /* position of the token being generated (prompt + generated so far) */
    int row;
    bool force; /* no draw: the token is `token` (scoring a given continuation); its
                   logprob (sp->logprob_mode) and the top-n are computed as for a draw */
    int32_t token;
} rw_sample_req;

typedef struct rw_sample_res {
    int32_t token;
    float logprob;
    int32_t top_ids[RW_MAX_TOP_LOGPROBS];
    float top_lps[RW_MAX_TOP_LOGPROBS];
} rw_sample_res;

typedef struct rw_backend_ops {
    const char *name;
    /* sizes the scratch for forwards of up to max_tokens tokens / max_seqs sequences before the
     * KV cache takes the remaining memory (NULL: grows on demand) */
    rw_status (*reserve)(rw_model *m, int64_t max_tokens, int max_seqs, rw_err *err);
    /* bytes of one KV block (all layers, K and V) */
    size_t (*kv_block_bytes)(rw_model *m, int block_size);
    /* memory available for the KV cache given a fraction of what is free */
    rw_status (*kv_budget)(rw_model *m, double fraction, size_t *bytes, rw_err *err);
    rw_status (*kv_create)(rw_model *m, int64_t nblocks, int block_size, rw_kv **out, rw_err *err);
    void (*kv_destroy)(rw_model *m, rw_kv *kv);
    /* runs the batch; keeps the logits rows (full vocabulary, after the all-gather) inside the
     * backend until the next forward */
    rw_status (*forward)(rw_model *m, rw_kv *kv, const rw_fwd_batch *b, rw_err *err);
    rw_status (*sample)(rw_model *m, int n, const rw_sample_req *req, rw_sample_res *res,
                        rw_err *err);
    /* copies logits rows [row0, row0 + nrows) to host dst [nrows, V] */
    rw_status (*logits_host)(rw_model *m, int row0, int nrows, float *dst, rw_err *err);
    /* copies whole KV blocks src[i] -> dst[i], i < n (every layer, K and V), ordered after the
     * forwards queued before it and before the next one: the copy-on-write of a partly filled
     * block that the n samples of a prompt share */
    rw_status (*kv_copy)(rw_model *m, rw_kv *kv, const int32_t *src, const int32_t *dst, int n,
                         rw_err *err);
    /* the router's choice in the last forward for its first ntok tokens: ids [L, ntok, top_k]
     * int32 (descending weight) and, when wts is not NULL, their routing weights [L, ntok,
     * top_k] fp32 (after renormalisation when norm_topk_prob), on the host. The forward always
     * keeps every layer's choice (the experts read it from there); only this copy costs. */
    rw_status (*routes)(rw_model *m, int64_t ntok, int32_t *ids, float *wts, rw_err *err);
    /* applies every canonical tensor of seeded random weights (rw_model_load_random; std > 0)
     * to the weight set, generated where the backend likes: the values are rw_model_rand_params'
     * rule whatever the backend (model_random.c) */
    rw_status (*load_random)(rw_model *m, uint64_t seed, float std, rw_err *err);
    /* frees what the backend keeps derived from the weights (NULL: nothing): it is made again
     * from the weights when a forward pass needs it (rw_model_release_derived) */
    void (*release_derived)(rw_model *m);
    void (*destroy)(rw_model *m);
} rw_backend_ops;

struct rw_model {
    rw_config cfg;
    rw_tp_dims d;
    rw_backend kind;
    int device;
    rw_precision precision;
    rw_comm *comm; /* borrowed, or own_comm */
    bool own_comm;
    rw_wset *ws;
    const rw_backend_ops *ops;
    void *be; /* backend state */
};

/* Random weights (rw_model_load_random, model_random.c): tensor `name` is element-wise
 * rw_rand_bf16_at(tensor_seed, i, mean, sd) with norms around 1. */
void rw_model_rand_params(const rw_wname *w, const char *name, uint64_t seed, float std,
                          uint64_t *tensor_seed, float *mean, float *sd);
/* One tensor of random weights: n elements, element i = rw_rand_bf16_at(seed, i, mean, sd). */
typedef struct rw_rand_tensor {
    const rw_wname *w;
    const char *name;
    uint64_t seed;
    float mean, sd;
    size_t n;
} rw_rand_tensor;
/* A backend's generator: puts t's values somewhere and points p->data / p->place at them (the
 * rest of the bf16 piece is filled in); they must stay valid until rw_wset_apply, called next on
 * stream s, has read them. */
typedef rw_status (*rw_rand_gen)(void *ctx, const rw_rand_tensor *t, rw_piece *p, rw_err *err);
/* Generates (gen) and applies (rw_wset_apply on stream s) every canonical tensor in
 * rw_config_for_each_weight order. */
rw_status rw_model_rand_apply(rw_model *m, uint64_t seed, float std, rw_rand_gen gen, void *ctx,
                              rw_stream s, rw_err *err);
/* ops->load_random generating on the host (the CPU backend's). */
rw_status rw_model_load_random_host(rw_model *m, uint64_t seed, float std, rw_err *err);

/* RoPE's frequencies out[i] = theta^(-2i/hd), i < hd / 2, rounded once to fp32 as transformers'
 * default rope computes them: what both backends use, so their angles agree bit for bit. */
void rw_rope_inv_freq(const rw_config *c, float *out);

rw_status rw_cpu_backend_init(rw_model *m, rw_err *err);
rw_status rw_cuda_backend_init(rw_model *m, rw_err *err);

/* The engine's paged KV block manager and prefix cache: kv_blocks.h. */
#include "kv_blocks.h"

/* The communicator: an interface over single-rank, thread-group and NCCL implementations. */
struct rw_comm {
    int rank, size;
    rw_status (*allreduce_f32)(rw_comm *c, float *buf, size_t n, rw_stream s, rw_err *err);
    rw_status (*allgather)(rw_comm *c, const void *send, void *recv, size_t bytes, rw_stream s,
                           rw_err *err);
    void (*destroy)(rw_comm *c);
    /* rw_comm_abort (NULL: nothing to abort, the single-rank and thread communicators) */
    void (*abort)(rw_comm *c);
    void *impl;
};

#ifdef __cplusplus
}
#endif

#endif
