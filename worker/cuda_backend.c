/* cuda_backend.c - the CUDA backend: the Qwen3-MoE forward pass on one GPU rank. Own kernels for
 * everything: dense GEMMs (gemm.h: q, k, v, o, lm_head), norms, RoPE, paged attention, routing,
 * experts (moe/experts.cu) and sampling (kernels.cu); NCCL all-reduce / all-gather through
 * rw_comm; decode steps replayed from CUDA graphs. cuBLASLt only serves rw_cuda_be_gemm, the
 * benchmarks' comparison on the model's GEMM shapes.
 *
 * Precision: the residual stream, norms, q, router logits, softmaxes and accumulations are fp32;
 * every GEMM input (normed hidden states, attention output, expert activations, final-normed
 * rows) is a hi + lo bf16 pair (about 16 significant bits: kernels.h), so bf16 weights meet
 * near-fp32 activations; the KV cache is bf16. One bf16 rounding of an activation moves router
 * logits by ~1e-3 and flips near-tied experts (tests/worker/test_cuda_numerics.c measures it).
 * Quantized dense weights (mxfp8 / fp8-block q, k, v, o) are dequantized to bf16 before the GEMM;
 * quantized experts are dequantized tile by tile inside the expert kernel.
 *
 * Batch invariance: a token's logits are the same bits whatever else is in the batch, however its
 * prompt was chunked, and whichever graph or split ran it. Every kernel computes a token's values
 * in an order fixed by the token alone: GEMMs without split-K (gemm.h), the experts per token in
 * slot order, attention in fixed key segments merged in order (kernels.h), norms and router per
 * row. So continuous batching reproduces a request's run alone, and seeded sampling with it.
 *
 * Per-step metadata (tokens, positions, KV slots, logits rows, attention tiles, block tables)
 * goes host -> device in one copy from pinned memory into a buffer at a fixed address, so a
 * captured decode graph reads the new step's values when replayed.
 *
 * Shapes: x, y [T, H] fp32; h, h_lo [T, H] bf16; h32 [T, H] fp32; q [T, nh*hd], k, v [T, nkv*hd]
 * fp32 (GEMM outputs); qf [T, nh*hd] fp32 (normed, rotated); att, att_lo [T, nh*hd] bf16; KV per
 * layer [nblocks + 1, nkv, bs, hd] bf16 (block nblocks is a scratch block the padding rows of a
 * decode graph write to); logits [rows, V] fp32. */
#include <cublasLt.h>
#include <cuda_runtime_api.h>
#include <math.h>
#include <stdlib.h>

#include "cuda_profile.h"
#include "gemm.h"
#include "internal.h"
#include "kernels.h"

#define CU(expr)                                                                                   \
    do {                                                                                           \
        cudaError_t e_ = (expr);                                                                   \
        if (e_ != cudaSuccess) RW_FAIL(err, RW_E_CUDA, "%s: %s", #expr, cudaGetErrorString(e_));   \
    } while (0)
#define LT(expr)                                                                                   \
    do {                                                                                           \
        cublasStatus_t s_ = (expr);                                                                \
        if (s_ != CUBLAS_STATUS_SUCCESS)                                                           \
            RW_FAIL(err, RW_E_CUDA, "%s: cuBLAS status %d", #expr, (int)s_);                       \
    } while (0)

struct rw_kv {
    int64_t nblocks;
    int bs;
    uint16_t *k, *v;    /* [L, nblocks + 1, nkv, bs, hd] */
    size_t layer_elems; /* (nblocks + 1) * nkv * bs * hd */
};

#define GEMM_CACHE 128
typedef struct gemm_algo {
    int64_t m, n, k;
    cublasLtMatmulAlgo_t algo;
} gemm_algo;

#define MAX_GRAPHS 64
typedef struct dgraph {
    int B, bt_stride, nsplit;
    const rw_kv *kv;
    cudaGraphExec_t exec;
} dgraph;

/* Per-phase events of a profiled forward (cuda_profile.h). */
typedef struct prof {
    bool on;        /* the next forwards record events */
    bool capturing; /* run_model is being captured into a graph */
    bool failed;    /* an event record failed (the step's timings are not used) */
    bool graph;     /* the last profiled forward was a graph replay */
    bool no_graph;  /* graph-recorded events could not be timed: profile eagerly */
    int n, cap;     /* events recorded in this step, allocated */
    cudaEvent_t *ev;
    uint8_t *ph;        /* [cap] phase that ends at each event */
    cudaEvent_t s0, s1; /* around the sampling kernel */
    bool sampled;
} prof;

/* Decode batch sizes that get a graph (a batch is padded up to the next one). */
static const int graph_buckets[] = {1,  2,   4,   8,   12,  16,  24,  32,  48,  64,  80,
                                    96, 112, 128, 160, 192, 224, 256, 320, 384, 448, 512};

typedef struct cuda_be {
    cudaStream_t st;
    cublasLtHandle_t lt;
    cublasLtMatmulDesc_t mm;
    void *lt_ws;
    size_t lt_ws_bytes;
    gemm_algo cache[GEMM_CACHE];
    int ncache;
    int nsm;
    /* capacities of the scratch below */
    int64_t cap_tok, cap_log;
    int cap_seq, cap_bt;
    float *x, *y, *q, *k, *v, *h32, *rl, *wts, *lg_local, *gath, *logits, *qf;
    uint16_t *h, *h_lo, *att, *att_lo, *hl, *hl_lo, *wdeq;
    int32_t *ids;
    void *attn_part;
    size_t attn_part_bytes;
    void *moe_ws;
    size_t moe_ws_bytes;
    float *inv_freq;
    /* metadata: device buffer and its pinned host mirror, layout fixed by the capacities */
    uint8_t *meta_d, *meta_h;
    size_t meta_bytes;
    size_t off_pos, off_slot, off_rows, off_tiles, off_bt;
    rw_k_sample_param *sp_d, *sp_h;
    rw_k_sample_out *so_d, *so_h;
    int cap_smp;
    int64_t nlogits;
    bool use_graphs;
    dgraph graphs[MAX_GRAPHS];
    int ngraphs;
    prof prof;
} cuda_be;

/* Records the end of `phase` (a phase of cuda_profile.h; RW_PROF_NPHASE marks the start). */
static void prof_mark(cuda_be *be, int phase) {
    prof *p = &be->prof;
    if (!p->on) return;
    if (p->n >= p->cap) {
        p->failed = true;
        return;
    }
    const cudaError_t e =
        p->capturing ? cudaEventRecordWithFlags(p->ev[p->n], be->st, cudaEventRecordExternal)
                     : cudaEventRecord(p->ev[p->n], be->st);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        p->failed = true;
        return;
    }
    p->ph[p->n++] = (uint8_t)phase;
}

static void prof_free(cuda_be *be) {
    prof *p = &be->prof;
    for (int i = 0; i < p->cap; i++)
        cudaEventDestroy(p->ev[i]);
    if (p->cap) {
        cudaEventDestroy(p->s0);
        cudaEventDestroy(p->s1);
    }
    free(p->ev);
    free(p->ph);
    memset(p, 0, sizeof *p);
}

static void drop_graphs(cuda_be *be) {
    for (int i = 0; i < be->ngraphs; i++)
        cudaGraphExecDestroy(be->graphs[i].exec);
    be->ngraphs = 0;
}

/* ------------------------------------------------------------------------------------------ */
/* GEMM: Y [M, N] fp32 = X [M, K] bf16 . W [N, K]^T bf16 (row-major). In cuBLAS's column-major
 * terms: C [N, M] = op(A) B with A = W viewed as [K, N] (transposed), B = X viewed as [K, M]. */
static rw_status gemm(cuda_be *be, const void *W, const void *X, float *Y, int64_t M, int64_t N,
                      int64_t K, rw_err *err) {
    if (M <= 0) return RW_OK;
    cublasLtMatrixLayout_t a = NULL, b = NULL, c = NULL;
    rw_status st = RW_OK;
    cublasStatus_t cs;
    if ((cs = cublasLtMatrixLayoutCreate(&a, CUDA_R_16BF, (uint64_t)K, (uint64_t)N, K)) ||
        (cs = cublasLtMatrixLayoutCreate(&b, CUDA_R_16BF, (uint64_t)K, (uint64_t)M, K)) ||
        (cs = cublasLtMatrixLayoutCreate(&c, CUDA_R_32F, (uint64_t)N, (uint64_t)M, N))) {
        st = RW_ERR(err, RW_E_CUDA, "cublasLtMatrixLayoutCreate: status %d", (int)cs);
        goto done;
    }
    gemm_algo *ga = NULL;
    for (int i = 0; i < be->ncache; i++)
        if (be->cache[i].m == M && be->cache[i].n == N && be->cache[i].k == K) ga = &be->cache[i];
    cublasLtMatmulAlgo_t algo;
    if (ga) {
        algo = ga->algo;
    } else {
        cublasLtMatmulPreference_t pref = NULL;
        cublasLtMatmulHeuristicResult_t res;
        int nres = 0;
        cs = cublasLtMatmulPreferenceCreate(&pref);
        if (!cs)
            cs =
                cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                     &be->lt_ws_bytes, sizeof be->lt_ws_bytes);
        if (!cs)
            cs = cublasLtMatmulAlgoGetHeuristic(be->lt, be->mm, a, b, c, c, pref, 1, &res, &nres);
        if (pref) cublasLtMatmulPreferenceDestroy(pref);
        if (cs || nres < 1) {
            st = RW_ERR(err, RW_E_CUDA, "cuBLASLt: no algorithm for %lldx%lldx%lld (status %d)",
                        (long long)M, (long long)N, (long long)K, (int)cs);
            goto done;
        }
        algo = res.algo;
        gemm_algo *slot = &be->cache[be->ncache < GEMM_CACHE ? be->ncache++ : 0];
        slot->m = M;
        slot->n = N;
        slot->k = K;
        slot->algo = algo;
    }
    const float one = 1.0f, zero = 0.0f;
    cs = cublasLtMatmul(be->lt, be->mm, &one, W, a, X, b, &zero, Y, c, Y, c, &algo, be->lt_ws,
                        be->lt_ws_bytes, be->st);
    if (cs)
        st = RW_ERR(err, RW_E_CUDA, "cublasLtMatmul %lldx%lldx%lld: status %d", (long long)M,
                    (long long)N, (long long)K, (int)cs);
done:
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (c) cublasLtMatrixLayoutDestroy(c);
    return st;
}

/* A dense weight [N, K] in any format times X + X_lo (gemm.h): quantized weights are dequantized to
 * bf16 first. */
static rw_status dense(cuda_be *be, rw_wfmt fmt, const rw_tensor *w, const rw_tensor *sc,
                       const uint16_t *X, const uint16_t *X_lo, float *Y, int64_t M, rw_err *err) {
    const int64_t N = w->shape[0], K = w->shape[1];
    const void *W = w->data;
    if (w->dtype != RW_DTYPE_BF16) {
        if (fmt == RW_WFMT_MXFP8)
            RW_CHECK(rw_dequant_mxfp8_cuda(w->data, sc->data, N, K, be->wdeq, be->st, err));
        else
            RW_CHECK(rw_dequant_fp8_block_cuda(w->data, sc->data, N, K, be->wdeq, be->st, err));
        W = be->wdeq;
    }
    return rw_k_gemm(W, N, K, X, X_lo, M, Y, be->st, err);
}

/* ------------------------------------------------------------------------------------------ */
static void free_scratch(cuda_be *be) {
    void *d[] = {be->x,    be->y,      be->q,     be->k,         be->v,      be->h32,
                 be->rl,   be->wts,    be->qf,    be->lg_local,  be->gath,   be->logits,
                 be->h,    be->h_lo,   be->att,   be->att_lo,    be->hl,     be->hl_lo,
                 be->ids,  be->attn_part, be->moe_ws, be->meta_d, be->sp_d,  be->so_d};
    for (size_t i = 0; i < sizeof d / sizeof d[0]; i++)
        cudaFree(d[i]);
    cudaFreeHost(be->meta_h);
    cudaFreeHost(be->sp_h);
    cudaFreeHost(be->so_h);
    be->x = be->y = be->q = be->k = be->v = be->h32 = be->rl = be->wts = be->qf = NULL;
    be->lg_local = be->gath = be->logits = NULL;
    be->h = be->h_lo = be->att = be->att_lo = be->hl = be->hl_lo = NULL;
    be->ids = NULL;
    be->attn_part = be->moe_ws = NULL;
    be->meta_d = be->meta_h = NULL;
    be->sp_d = be->sp_h = NULL;
    be->so_d = be->so_h = NULL;
    be->cap_tok = be->cap_log = 0;
    be->cap_seq = be->cap_bt = be->cap_smp = 0;
}

/* Attention splits (kernels.h): batches of at most SPLIT_MAX_TOK tokens spread each token's key
 * segments over up to SPLIT_MAX CTAs; the partials buffer holds SPLIT_SEGS segments of
 * SPLIT_MAX_TOK tokens (smaller batches: proportionally more segments, i.e. longer contexts). */
#define SPLIT_MAX_TOK 256
#define SPLIT_MAX 16
#define SPLIT_SEGS 16

/* (Re)allocates the scratch for ntok tokens, nlog logits rows, nseq sequences and block tables
 * of nbt entries; never shrinks. Reallocation drops the captured graphs (they hold pointers). */
static rw_status ensure(rw_model *m, int64_t ntok, int64_t nlog, int nseq, int nbt, rw_err *err) {
    cuda_be *be = m->be;
    if (ntok <= be->cap_tok && nlog <= be->cap_log && nseq <= be->cap_seq && nbt <= be->cap_bt)
        return RW_OK;
    CU(cudaStreamSynchronize(be->st));
    drop_graphs(be);
    const int64_t T = ntok > be->cap_tok ? ntok : be->cap_tok;
    const int64_t NL = nlog > be->cap_log ? nlog : be->cap_log;
    const int NS = nseq > be->cap_seq ? nseq : be->cap_seq;
    int NB = be->cap_bt ? be->cap_bt : 64;
    while (NB < nbt)
        NB *= 2;
    free_scratch(be);
    const rw_config *c = &m->cfg;
    const rw_tp_dims *d = &m->d;
    const int64_t H = c->hidden_size, hd = c->head_dim, E = c->num_experts, K = c->top_k;
    const int64_t qd = d->nh_local * hd, kd = d->nkv_local * hd, vl = d->v_local, V = c->vocab_size;
#define DALLOC(p, bytes) CU(cudaMalloc((void **)&(p), (size_t)(bytes) > 0 ? (size_t)(bytes) : 16))
    DALLOC(be->x, T * H * 4);
    DALLOC(be->y, T * H * 4);
    DALLOC(be->h32, T * H * 4);
    DALLOC(be->h, T * H * 2);
    DALLOC(be->h_lo, T * H * 2);
    DALLOC(be->q, T * (qd + 2 * kd) * 4); /* room for the fused [q | k | v] rows */
    DALLOC(be->k, T * kd * 4);
    DALLOC(be->v, T * kd * 4);
    DALLOC(be->qf, T * qd * 4);
    DALLOC(be->att, T * qd * 2);
    DALLOC(be->att_lo, T * qd * 2);
    DALLOC(be->rl, T * E * 4);
    DALLOC(be->wts, T * K * 4);
    DALLOC(be->ids, T * K * 4);
    DALLOC(be->hl, NL * H * 2);
    DALLOC(be->hl_lo, NL * H * 2);
    DALLOC(be->lg_local, NL * vl * 4);
    DALLOC(be->gath, (int64_t)d->tp * NL * vl * 4);
    DALLOC(be->logits, NL * V * 4);
    be->attn_part_bytes = rw_k_attention_part_bytes(T < SPLIT_MAX_TOK ? T : SPLIT_MAX_TOK,
                                                    d->nh_local, (int)hd, SPLIT_SEGS);
    DALLOC(be->attn_part, be->attn_part_bytes);
    be->moe_ws_bytes = rw_moe_experts_cuda_workspace(E, d->P, H, T, (int)K);
    DALLOC(be->moe_ws, be->moe_ws_bytes);
    /* metadata: tok, pos, slot [T]; rows [NL]; tiles [T + NS]; bt [NS, NB] */
    be->off_pos = (size_t)T * 4;
    be->off_slot = be->off_pos + (size_t)T * 4;
    be->off_rows = be->off_slot + (size_t)T * 4;
    be->off_tiles = (be->off_rows + (size_t)NL * 4 + 15) & ~(size_t)15;
    be->off_bt = be->off_tiles + (size_t)(T + NS) * sizeof(rw_attn_tile);
    be->meta_bytes = be->off_bt + (size_t)NS * NB * 4;
    DALLOC(be->meta_d, be->meta_bytes);
    CU(cudaMallocHost((void **)&be->meta_h, be->meta_bytes));
    be->cap_smp = (int)(NL > NS ? NL : NS);
    DALLOC(be->sp_d, (size_t)be->cap_smp * sizeof(rw_k_sample_param));
    DALLOC(be->so_d, (size_t)be->cap_smp * sizeof(rw_k_sample_out));
    CU(cudaMallocHost((void **)&be->sp_h, (size_t)be->cap_smp * sizeof(rw_k_sample_param)));
    CU(cudaMallocHost((void **)&be->so_h, (size_t)be->cap_smp * sizeof(rw_k_sample_out)));
#undef DALLOC
    be->cap_tok = T;
    be->cap_log = NL;
    be->cap_seq = NS;
    be->cap_bt = NB;
    return RW_OK;
}

static rw_status cuda_reserve(rw_model *m, int64_t max_tokens, int max_seqs, rw_err *err) {
    const int nb = graph_buckets[sizeof graph_buckets / sizeof graph_buckets[0] - 1];
    const int64_t tok = max_tokens > nb ? max_tokens : nb;
    const int seqs = max_seqs > nb ? max_seqs : nb;
    return ensure(m, tok, seqs, seqs, 256, err);
}

/* ------------------------------------------------------------------------------------------ */
static size_t cuda_kv_block_bytes(rw_model *m, int bs) {
    return (size_t)m->cfg.num_layers * 2 * (size_t)m->d.nkv_local * (size_t)bs *
           (size_t)m->cfg.head_dim * 2;
}

static rw_status cuda_kv_budget(rw_model *m, double fraction, size_t *bytes, rw_err *err) {
    size_t fr = 0, tot = 0;
    CU(cudaMemGetInfo(&fr, &tot));
    /* headroom for NCCL buffers, graphs, cuBLAS and the allocator */
    const size_t reserve = (size_t)768 << 20;
    const double b = (double)fr * fraction - (double)reserve;
    *bytes = b > 0 ? (size_t)b : 0;
    return RW_OK;
}

static rw_status cuda_kv_create(rw_model *m, int64_t nblocks, int bs, rw_kv **out, rw_err *err) {
    if (nblocks < 1 || bs < 16 || bs % 16)
        RW_FAIL(err, RW_E_INVALID_ARG, "kv cache (cuda): %lld blocks of %d (bs %% 16 == 0)",
                (long long)nblocks, bs);
    rw_kv *kv = calloc(1, sizeof *kv);
    if (!kv) RW_FAIL(err, RW_E_OOM, "kv cache");
    kv->nblocks = nblocks;
    kv->bs = bs;
    kv->layer_elems = (size_t)(nblocks + 1) * m->d.nkv_local * bs * m->cfg.head_dim;
    const size_t bytes = kv->layer_elems * 2 * (size_t)m->cfg.num_layers;
    cudaError_t ce = cudaMalloc((void **)&kv->k, bytes);
    if (ce == cudaSuccess) ce = cudaMalloc((void **)&kv->v, bytes);
    /* zeroed: keys past a sequence's end are masked, and zeros keep 0 * value finite */
    if (ce == cudaSuccess) ce = cudaMemsetAsync(kv->k, 0, bytes, ((cuda_be *)m->be)->st);
    if (ce == cudaSuccess) ce = cudaMemsetAsync(kv->v, 0, bytes, ((cuda_be *)m->be)->st);
    if (ce == cudaSuccess) ce = cudaStreamSynchronize(((cuda_be *)m->be)->st);
    if (ce != cudaSuccess) {
        cudaFree(kv->k);
        cudaFree(kv->v);
        free(kv);
        (void)cudaGetLastError();
        RW_FAIL(err, RW_E_OOM, "kv cache (cuda): %zu bytes: %s", 2 * bytes, cudaGetErrorString(ce));
    }
    *out = kv;
    return RW_OK;
}

static void cuda_kv_destroy(rw_model *m, rw_kv *kv) {
    if (!kv) return;
    cuda_be *be = m->be;
    cudaStreamSynchronize(be->st);
    /* graphs captured against this cache point into it */
    int j = 0;
    for (int i = 0; i < be->ngraphs; i++) {
        if (be->graphs[i].kv == kv)
            cudaGraphExecDestroy(be->graphs[i].exec);
        else
            be->graphs[j++] = be->graphs[i];
    }
    be->ngraphs = j;
    cudaFree(kv->k);
    cudaFree(kv->v);
    free(kv);
}

/* ------------------------------------------------------------------------------------------ */
/* bf16 q, k, v weights stored back to back ([q; k; v] rows): one GEMM serves all three. */
static bool qkv_fused(const rw_layer_weights *lw) {
    if (lw->q.dtype != RW_DTYPE_BF16) return false;
    const uint8_t *q = lw->q.data, *k = lw->k.data, *v = lw->v.data;
    return k == q + rw_tensor_nbytes(&lw->q) && v == k + rw_tensor_nbytes(&lw->k);
}

/* The model on the metadata already on the device. */
static rw_status run_model(rw_model *m, rw_kv *kv, int64_t ntok, int ntiles, int qt, int64_t nlog,
                           int bt_stride, int nsplit, rw_err *err) {
    cuda_be *be = m->be;
    const rw_config *c = &m->cfg;
    const rw_tp_dims *d = &m->d;
    const int64_t H = c->hidden_size, hd = c->head_dim, E = c->num_experts;
    const int K = c->top_k, nh = d->nh_local, nkv = d->nkv_local;
    const float eps = (float)c->rms_eps;
    rw_stream s = be->st;
    const int32_t *tok = (const int32_t *)be->meta_d;
    const int32_t *pos = (const int32_t *)(be->meta_d + be->off_pos);
    const int32_t *slot = (const int32_t *)(be->meta_d + be->off_slot);
    const int32_t *rows = (const int32_t *)(be->meta_d + be->off_rows);
    const rw_attn_tile *tiles = (const rw_attn_tile *)(be->meta_d + be->off_tiles);
    const int32_t *bt = (const int32_t *)(be->meta_d + be->off_bt);
    const bool tp = d->tp > 1;

    prof_mark(be, RW_PROF_NPHASE);
    const rw_tensor emb = rw_wset_embed(m->ws);
    RW_CHECK(rw_k_embed(tok, ntok, emb.data, d->v_begin, d->v_local, H, be->x, s, err));
    prof_mark(be, RW_PROF_EMBED);
    if (tp) {
        RW_CHECK(rw_comm_allreduce_f32(m->comm, be->x, (size_t)(ntok * H), s, err));
        prof_mark(be, RW_PROF_COMM);
    }
    /* One rank: the experts accumulate straight into the residual x (no zeroed y, no add); with
     * TP their partial sums go to y, are all-reduced and added by the next norm. The same bits:
     * x + (0 + s) == x + s. */
    float *moe_out = tp ? be->y : be->x;
    for (int l = 0; l < c->num_layers; l++) {
        const rw_layer_weights *lw = rw_wset_layer(m->ws, l);
        RW_CHECK(rw_k_add_rmsnorm(be->x, l && tp ? be->y : NULL, lw->input_norm.data, ntok, H, eps,
                                  be->h, be->h_lo, NULL, s, err));
        prof_mark(be, RW_PROF_NORM);
        const int64_t qd = (int64_t)nh * hd, kd = (int64_t)nkv * hd;
        const float *qp, *kp, *vp;
        int64_t ldq, ldkv;
        if (qkv_fused(lw)) {
            /* q, k, v lie back to back in the arena: one GEMM, output rows [q | k | v] */
            RW_CHECK(rw_k_gemm(lw->q.data, qd + 2 * kd, H, be->h, be->h_lo, ntok, be->q, s, err));
            qp = be->q;
            kp = be->q + qd;
            vp = be->q + qd + kd;
            ldq = ldkv = qd + 2 * kd;
        } else {
            RW_CHECK(dense(be, lw->attn_fmt, &lw->q, &lw->q_scale, be->h, be->h_lo, be->q, ntok,
                           err));
            RW_CHECK(dense(be, lw->attn_fmt, &lw->k, &lw->k_scale, be->h, be->h_lo, be->k, ntok,
                           err));
            RW_CHECK(dense(be, lw->attn_fmt, &lw->v, &lw->v_scale, be->h, be->h_lo, be->v, ntok,
                           err));
            qp = be->q;
            kp = be->k;
            vp = be->v;
            ldq = qd;
            ldkv = kd;
        }
        prof_mark(be, RW_PROF_QKV);
        uint16_t *kc = kv->k + (size_t)l * kv->layer_elems,
                 *vc = kv->v + (size_t)l * kv->layer_elems;
        RW_CHECK(rw_k_qk_rope_kv(qp, kp, vp, ldq, ldkv, lw->q_norm.data, lw->k_norm.data, pos, slot,
                                 ntok, nh, nkv, (int)hd, kv->bs, be->inv_freq, eps, be->qf, kc, vc,
                                 s, err));
        prof_mark(be, RW_PROF_ROPE);
        RW_CHECK(rw_k_attention(be->qf, kc, vc, tiles, ntiles, qt, pos, bt, bt_stride, ntok, nh,
                                nkv, (int)hd, kv->bs, nsplit, be->attn_part, be->attn_part_bytes,
                                be->att, be->att_lo, s, err));
        prof_mark(be, RW_PROF_ATTN);
        RW_CHECK(
            dense(be, lw->attn_fmt, &lw->o, &lw->o_scale, be->att, be->att_lo, be->y, ntok, err));
        prof_mark(be, RW_PROF_OPROJ);
        if (tp) {
            RW_CHECK(rw_comm_allreduce_f32(m->comm, be->y, (size_t)(ntok * H), s, err));
            prof_mark(be, RW_PROF_COMM);
        }
        RW_CHECK(rw_k_add_rmsnorm(be->x, be->y, lw->post_norm.data, ntok, H, eps, be->h, be->h_lo,
                                  be->h32, s, err));
        prof_mark(be, RW_PROF_NORM);
        RW_CHECK(rw_k_router(be->h32, lw->router.data, ntok, E, H, be->rl, s, err));
        RW_CHECK(rw_moe_route_cuda(be->rl, ntok, (int)E, K, c->norm_topk_prob, be->ids, be->wts, s,
                                   err));
        prof_mark(be, RW_PROF_ROUTER);
        if (tp) CU(cudaMemsetAsync(be->y, 0, (size_t)(ntok * H) * 4, be->st));
        RW_CHECK(rw_moe_experts_cuda(lw, d, H, be->h, be->h_lo, ntok, be->ids, be->wts, K, moe_out,
                                     be->moe_ws, be->moe_ws_bytes, s, err));
        prof_mark(be, RW_PROF_EXPERTS);
        if (tp) {
            RW_CHECK(rw_comm_allreduce_f32(m->comm, be->y, (size_t)(ntok * H), s, err));
            prof_mark(be, RW_PROF_COMM);
        }
    }
    const rw_tensor fn = rw_wset_final_norm(m->ws), lm = rw_wset_lm_head(m->ws);
    RW_CHECK(rw_k_rmsnorm_rows(be->x, tp ? be->y : NULL, rows, nlog, fn.data, H, eps, be->hl,
                               be->hl_lo, s, err));
    /* one rank whose vocabulary needs no padding: the lm_head writes the logits in place */
    const bool direct = !tp && d->v_local == c->vocab_size;
    RW_CHECK(rw_k_gemm(lm.data, d->v_local, H, be->hl, be->hl_lo, nlog,
                       direct ? be->logits : be->lg_local, s, err));
    const float *g = be->lg_local;
    if (tp) {
        prof_mark(be, RW_PROF_LMHEAD);
        RW_CHECK(rw_comm_allgather(m->comm, be->lg_local, be->gath,
                                   sizeof(float) * (size_t)(nlog * d->v_local), s, err));
        prof_mark(be, RW_PROF_COMM);
        g = be->gath;
    }
    if (!direct)
        RW_CHECK(rw_k_logits_gather(g, d->tp, nlog, d->v_local, c->vocab_size, be->logits, s, err));
    prof_mark(be, RW_PROF_LMHEAD);
    return RW_OK;
}

/* Attention CTAs per (tile, kv head) for a batch (rw_k_attention's nsplit): 0 (one CTA walks
 * every key segment) when the tiles alone fill the GPU or the partials of max_ctx's segments do
 * not fit the scratch. max_ctx is the longest context of the batch (the largest position + 1);
 * decode graphs are captured with max_ctx 0 (any context) and checked per step (graph_split).
 * Results do not depend on the choice (kernels.h), only the speed does. */
static int pick_split(const cuda_be *be, int64_t ntok, int ntiles, int nkv, int nh, int hd,
                      int64_t max_ctx) {
    if (ntok > SPLIT_MAX_TOK) return 0;
    /* enough CTAs for 16 per SM (128 threads each): a CTA walks its key tiles one after the
     * other, so latency hides behind the other CTAs of its SM */
    const int cta = ntiles * nkv > 0 ? ntiles * nkv : 1;
    int ns = (16 * be->nsm + cta - 1) / cta;
    if (max_ctx > 0) {
        const int64_t segs = (max_ctx - 1) / RW_ATTN_SEG + 1;
        if (ns > segs) ns = (int)segs;
        if (rw_k_attention_part_bytes(ntok, nh, hd, (int)segs) > be->attn_part_bytes) return 0;
    }
    if (ns > SPLIT_MAX) ns = SPLIT_MAX;
    return ns < 2 ? 0 : ns;
}

/* The split a decode graph of B rows uses for a step whose longest context is max_ctx: the
 * batch-size choice when the partials of every segment fit, else 0. */
static int graph_split(const rw_model *m, int B, int64_t max_ctx) {
    const cuda_be *be = m->be;
    const int nh = m->d.nh_local, hd = m->cfg.head_dim;
    const int ns = pick_split(be, B, B, m->d.nkv_local, nh, hd, 0);
    if (ns == 0) return 0;
    const int64_t segs = max_ctx > 0 ? (max_ctx - 1) / RW_ATTN_SEG + 1 : 1;
    return rw_k_attention_part_bytes(B, nh, hd, (int)segs) <= be->attn_part_bytes ? ns : 0;
}

/* A profiled forward (cuda_profile.h): decode batches (B > 0) are captured with their events
 * into a graph of their own (not cached) and replayed; other batches, or a capture the driver
 * refuses, run eagerly behind a spin kernel that lets the host queue the whole step first. */
static rw_status profiled_run(rw_model *m, rw_kv *kv, int B, int64_t ntok, int ntiles, int qt,
                              int64_t nlog, int stride, int64_t max_ctx, rw_err *err) {
    cuda_be *be = m->be;
    prof *p = &be->prof;
    p->n = 0;
    p->failed = false;
    p->graph = false;
    if (B && !p->no_graph) {
        const int ns = graph_split(m, B, max_ctx);
        cudaGraph_t graph = NULL;
        cudaGraphExec_t exec = NULL;
        rw_err cerr = {0};
        CU(cudaStreamBeginCapture(be->st, cudaStreamCaptureModeRelaxed));
        p->capturing = true;
        const rw_status st = run_model(m, kv, B, B, 1, B, stride, ns, &cerr);
        p->capturing = false;
        cudaError_t ce = cudaStreamEndCapture(be->st, &graph);
        if (st == RW_OK && ce == cudaSuccess && !p->failed)
            ce = cudaGraphInstantiate(&exec, graph, 0);
        if (graph) cudaGraphDestroy(graph);
        if (st == RW_OK && ce == cudaSuccess && !p->failed && exec) {
            ce = cudaGraphLaunch(exec, be->st);
            const cudaError_t ce2 = cudaStreamSynchronize(be->st);
            cudaGraphExecDestroy(exec);
            if (ce != cudaSuccess || ce2 != cudaSuccess)
                RW_FAIL(err, RW_E_CUDA, "profiled decode graph: %s",
                        cudaGetErrorString(ce != cudaSuccess ? ce : ce2));
            p->graph = true;
            return RW_OK;
        }
        if (exec) cudaGraphExecDestroy(exec);
        (void)cudaGetLastError();
        RW_LOGW("profiled decode graph not captured (%s%s): timing the step eagerly",
                st != RW_OK ? cerr.msg : "", ce != cudaSuccess ? cudaGetErrorString(ce) : "");
        p->n = 0;
        p->failed = false;
    }
    if (B) { /* the metadata on the device is the padded decode batch */
        ntok = nlog = B;
        ntiles = B;
        qt = 1;
    }
    RW_CHECK(rw_k_spin(20 * 1000 * 1000, be->st, err)); /* 20 ms head start for the host */
    const int ns = B ? graph_split(m, B, max_ctx)
                     : pick_split(be, ntok, ntiles, m->d.nkv_local, m->d.nh_local,
                                  m->cfg.head_dim, max_ctx);
    return run_model(m, kv, ntok, ntiles, qt, nlog, stride, ns, err);
}

static rw_status cuda_forward(rw_model *m, rw_kv *kv, const rw_fwd_batch *b, rw_err *err) {
    cuda_be *be = m->be;
    if (!b || b->ntok < 1 || b->nseq < 1 || !b->tokens || !b->seq)
        RW_FAIL(err, RW_E_INVALID_ARG, "forward: empty batch");
    if (b->all_logits && b->nlogits != b->ntok)
        RW_FAIL(err, RW_E_INVALID_ARG, "forward: all_logits needs nlogits == ntok");
    const int bs = kv->bs;
    int maxb = 1;
    int64_t max_ctx = 0, tok = 0;
    bool decode = !b->all_logits && b->nlogits == b->nseq;
    int nrows_set = 0;
    for (int s = 0; s < b->nseq; s++) {
        const rw_fwd_seq *q = &b->seq[s];
        if (q->tok0 != tok || q->ntok < 1 || q->pos0 < 0 || !q->blocks)
            RW_FAIL(err, RW_E_INVALID_ARG, "forward: sequence %d malformed", s);
        tok += q->ntok;
        const int64_t end = (int64_t)q->pos0 + q->ntok;
        const int nb = (int)((end + bs - 1) / bs);
        if (nb > maxb) maxb = nb;
        if (end > max_ctx) max_ctx = end;
        for (int i = 0; i < nb; i++)
            if (q->blocks[i] < 0 || q->blocks[i] >= kv->nblocks)
                RW_FAIL(err, RW_E_RANGE, "forward: sequence %d block %d = %d outside [0, %lld)", s,
                        i, q->blocks[i], (long long)kv->nblocks);
        if (q->ntok != 1 || q->logits_row != s) decode = false;
        if (!b->all_logits && q->logits_row >= b->nlogits)
            RW_FAIL(err, RW_E_RANGE, "forward: logits row %d of %d", q->logits_row, b->nlogits);
        if (!b->all_logits && q->logits_row >= 0) nrows_set++;
    }
    /* every logits row must name a token (rows are distinct by construction of the engine) */
    if (!b->all_logits && nrows_set != b->nlogits)
        RW_FAIL(err, RW_E_INVALID_ARG, "forward: %d sequences ask for logits, nlogits is %d",
                nrows_set, b->nlogits);
    if (tok != b->ntok)
        RW_FAIL(err, RW_E_INVALID_ARG, "forward: sequences cover %lld of %d tokens", (long long)tok,
                b->ntok);
    for (int32_t t = 0; t < b->ntok; t++)
        if (b->tokens[t] < 0 || b->tokens[t] >= m->cfg.vocab_size)
            RW_FAIL(err, RW_E_RANGE, "forward: token %d outside [0, %d)", b->tokens[t],
                    m->cfg.vocab_size);

    /* decode batches replay a graph captured for the padded batch size */
    int B = 0;
    if (decode && be->use_graphs)
        for (size_t i = 0; i < sizeof graph_buckets / sizeof graph_buckets[0]; i++)
            if (graph_buckets[i] >= b->nseq) {
                B = graph_buckets[i];
                break;
            }
    const int64_t ntok = B ? B : b->ntok;
    const int nseq = B ? B : b->nseq;
    const int64_t nlog = B ? B : b->nlogits;
    RW_CHECK(ensure(m, ntok, nlog, nseq, maxb, err));

    /* metadata into the pinned mirror */
    int32_t *h_tok = (int32_t *)be->meta_h;
    int32_t *h_pos = (int32_t *)(be->meta_h + be->off_pos);
    int32_t *h_slot = (int32_t *)(be->meta_h + be->off_slot);
    int32_t *h_rows = (int32_t *)(be->meta_h + be->off_rows);
    rw_attn_tile *h_tiles = (rw_attn_tile *)(be->meta_h + be->off_tiles);
    int32_t *h_bt = (int32_t *)(be->meta_h + be->off_bt);
    const int stride = be->cap_bt;
    int ntiles = 0, qt = 1;
    for (int s = 0; s < b->nseq; s++) {
        const rw_fwd_seq *q = &b->seq[s];
        for (int32_t i = 0; i < q->ntok; i++) {
            const int64_t t = q->tok0 + i;
            const int32_t p = q->pos0 + i;
            h_tok[t] = b->tokens[t];
            h_pos[t] = p;
            h_slot[t] = q->blocks[p / bs] * bs + p % bs;
            if (b->all_logits) h_rows[t] = (int32_t)t;
        }
        if (!b->all_logits && q->logits_row >= 0) h_rows[q->logits_row] = q->tok0 + q->ntok - 1;
        for (int32_t i = 0; i < q->ntok; i += RW_ATTN_QT) {
            const int32_t n = q->ntok - i < RW_ATTN_QT ? q->ntok - i : RW_ATTN_QT;
            h_tiles[ntiles++] = (rw_attn_tile){s, q->tok0 + i, n, 0};
            if (n > qt) qt = n;
        }
        const int nb = (q->pos0 + q->ntok + bs - 1) / bs;
        memcpy(h_bt + (size_t)s * stride, q->blocks, sizeof(int32_t) * (size_t)nb);
    }
    for (int s = b->nseq; s < nseq; s++) { /* padding rows: token 0 at position 0, scratch block */
        h_tok[s] = 0;
        h_pos[s] = 0;
        h_slot[s] = (int32_t)(kv->nblocks * bs);
        h_rows[s] = s;
        h_tiles[ntiles++] = (rw_attn_tile){s, s, 1, 0};
        h_bt[(size_t)s * stride] = (int32_t)kv->nblocks;
    }
    CU(cudaMemcpyAsync(be->meta_d, be->meta_h, be->off_bt + (size_t)nseq * stride * 4,
                       cudaMemcpyHostToDevice, be->st));
    if (be->prof.on) {
        RW_CHECK(profiled_run(m, kv, B, ntok, ntiles, qt, nlog, stride, max_ctx, err));
        be->nlogits = b->nlogits;
        return RW_OK;
    }
    if (!B) {
        const int ns = pick_split(be, ntok, ntiles, m->d.nkv_local, m->d.nh_local,
                                  m->cfg.head_dim, max_ctx);
        RW_CHECK(run_model(m, kv, ntok, ntiles, qt, nlog, stride, ns, err));
    } else {
        const int ns = graph_split(m, B, max_ctx);
        dgraph *g = NULL;
        for (int i = 0; i < be->ngraphs; i++)
            if (be->graphs[i].B == B && be->graphs[i].bt_stride == stride &&
                be->graphs[i].kv == kv && be->graphs[i].nsplit == ns)
                g = &be->graphs[i];
        if (!g) {
            if (be->ngraphs == MAX_GRAPHS) drop_graphs(be);
            cudaGraph_t graph = NULL;
            cudaGraphExec_t exec = NULL;
            rw_err cerr = {0};
            CU(cudaStreamBeginCapture(be->st, cudaStreamCaptureModeRelaxed));
            rw_status st = run_model(m, kv, B, B, 1, B, stride, ns, &cerr);
            cudaError_t ce = cudaStreamEndCapture(be->st, &graph);
            if (st == RW_OK && ce == cudaSuccess) ce = cudaGraphInstantiate(&exec, graph, 0);
            if (graph) cudaGraphDestroy(graph);
            if (st != RW_OK || ce != cudaSuccess) {
                /* a capture that fails falls back to running the same work eagerly, graphs off */
                (void)cudaGetLastError();
                RW_LOGW("decode graph (batch %d) not captured (%s%s): graphs off", B,
                        st != RW_OK ? cerr.msg : "",
                        ce != cudaSuccess ? cudaGetErrorString(ce) : "");
                be->use_graphs = false;
                RW_CHECK(run_model(m, kv, B, B, 1, B, stride, ns, err));
                be->nlogits = b->nlogits;
                return RW_OK;
            }
            g = &be->graphs[be->ngraphs++];
            g->exec = exec;
            g->B = B;
            g->bt_stride = stride;
            g->nsplit = ns;
            g->kv = kv;
        }
        CU(cudaGraphLaunch(g->exec, be->st));
    }
    be->nlogits = b->nlogits;
    return RW_OK;
}

static rw_status cuda_sample(rw_model *m, int n, const rw_sample_req *req, rw_sample_res *res,
                             rw_err *err) {
    cuda_be *be = m->be;
    if (n <= 0) return RW_OK;
    if (n > be->cap_smp)
        RW_FAIL(err, RW_E_RANGE, "sample: %d requests, room for %d", n, be->cap_smp);
    for (int i = 0; i < n; i++) {
        if (req[i].row < 0 || req[i].row >= be->nlogits)
            RW_FAIL(err, RW_E_RANGE, "sample: row %d of %lld", req[i].row, (long long)be->nlogits);
        const rw_sampling *sp = req[i].sp;
        rw_k_sample_param *p = &be->sp_h[i];
        p->temperature = sp->temperature;
        p->top_p = sp->top_p;
        p->top_k = sp->top_k;
        p->top_n = sp->top_logprobs;
        p->seed = sp->seed;
        p->position = req[i].position;
        p->row = req[i].row;
        p->pad = 0;
    }
    CU(cudaMemcpyAsync(be->sp_d, be->sp_h, sizeof(rw_k_sample_param) * (size_t)n,
                       cudaMemcpyHostToDevice, be->st));
    if (be->prof.on) be->prof.sampled = cudaEventRecord(be->prof.s0, be->st) == cudaSuccess;
    RW_CHECK(rw_k_sample(be->logits, n, m->cfg.vocab_size, be->sp_d, be->so_d, be->st, err));
    if (be->prof.on && be->prof.sampled)
        be->prof.sampled = cudaEventRecord(be->prof.s1, be->st) == cudaSuccess;
    CU(cudaMemcpyAsync(be->so_h, be->so_d, sizeof(rw_k_sample_out) * (size_t)n,
                       cudaMemcpyDeviceToHost, be->st));
    CU(cudaStreamSynchronize(be->st));
    for (int i = 0; i < n; i++) {
        res[i].token = be->so_h[i].token;
        res[i].logprob = be->so_h[i].logprob;
        const int tn = req[i].sp->top_logprobs;
        memcpy(res[i].top_ids, be->so_h[i].top_ids, sizeof(int32_t) * (size_t)tn);
        memcpy(res[i].top_lps, be->so_h[i].top_lps, sizeof(float) * (size_t)tn);
    }
    return RW_OK;
}

static rw_status cuda_logits_host(rw_model *m, int row0, int nrows, float *dst, rw_err *err) {
    cuda_be *be = m->be;
    if (row0 < 0 || nrows < 0 || row0 + nrows > be->nlogits)
        RW_FAIL(err, RW_E_RANGE, "logits rows [%d, %d) of %lld", row0, row0 + nrows,
                (long long)be->nlogits);
    const size_t V = (size_t)m->cfg.vocab_size;
    CU(cudaMemcpyAsync(dst, be->logits + (size_t)row0 * V, sizeof(float) * V * (size_t)nrows,
                       cudaMemcpyDeviceToHost, be->st));
    CU(cudaStreamSynchronize(be->st));
    return RW_OK;
}

static void cuda_destroy(rw_model *m) {
    cuda_be *be = m->be;
    if (!be) return;
    cudaStreamSynchronize(be->st);
    drop_graphs(be);
    free_scratch(be);
    prof_free(be);
    cudaFree(be->inv_freq);
    cudaFree(be->lt_ws);
    cudaFree(be->wdeq);
    if (be->mm) cublasLtMatmulDescDestroy(be->mm);
    if (be->lt) cublasLtDestroy(be->lt);
    if (be->st) cudaStreamDestroy(be->st);
    free(be);
    m->be = NULL;
}

static const rw_backend_ops cuda_ops = {
    .name = "cuda",
    .reserve = cuda_reserve,
    .kv_block_bytes = cuda_kv_block_bytes,
    .kv_budget = cuda_kv_budget,
    .kv_create = cuda_kv_create,
    .kv_destroy = cuda_kv_destroy,
    .forward = cuda_forward,
    .sample = cuda_sample,
    .logits_host = cuda_logits_host,
    .destroy = cuda_destroy,
};

/* Internal hooks for the benchmarks (bench.c). */
rw_status rw_cuda_be_gemm(rw_model *m, const void *W, const void *X, float *Y, int64_t M, int64_t N,
                          int64_t K, rw_err *err) {
    return gemm(m->be, W, X, Y, M, N, K, err);
}
void *rw_cuda_be_stream(rw_model *m) {
    return ((cuda_be *)m->be)->st;
}
void rw_cuda_be_set_graphs(rw_model *m, bool on) {
    cuda_be *be = m->be;
    if (!on) drop_graphs(be);
    be->use_graphs = on;
}
const char *rw_cuda_prof_phase_name(int phase) {
    static const char *const names[RW_PROF_NPHASE] = {
        "embed",  "norms",   "qkv_gemm", "qk_norm_rope_kv", "attention", "o_gemm",
        "router", "experts", "comm",     "lm_head"};
    return phase >= 0 && phase < RW_PROF_NPHASE ? names[phase] : "?";
}

rw_status rw_cuda_be_profile(rw_model *m, rw_kv *kv, const rw_fwd_batch *b, int nreq,
                             const rw_sample_req *req, int warmup, int steps,
                             rw_cuda_prof_result *out, rw_err *err) {
    cuda_be *be = m->be;
    prof *p = &be->prof;
    memset(out, 0, sizeof *out);
    if (steps < 1) RW_FAIL(err, RW_E_INVALID_ARG, "profile: %d steps", steps);
    /* events: 12 per layer (with TP), the start and the lm_head's */
    const int need = 12 * m->cfg.num_layers + 8;
    if (p->cap < need) {
        prof_free(be);
        p->ev = calloc((size_t)need, sizeof *p->ev);
        p->ph = calloc((size_t)need, 1);
        if (!p->ev || !p->ph) {
            prof_free(be);
            RW_FAIL(err, RW_E_OOM, "profile: %d events", need);
        }
        for (int i = 0; i < need; i++) {
            const cudaError_t e = cudaEventCreate(&p->ev[i]);
            if (e != cudaSuccess) {
                p->cap = i;
                prof_free(be);
                RW_FAIL(err, RW_E_CUDA, "profile: cudaEventCreate: %s", cudaGetErrorString(e));
            }
            p->cap = i + 1;
        }
        CU(cudaEventCreate(&p->s0));
        CU(cudaEventCreate(&p->s1));
    }
    rw_sample_res *res = nreq > 0 ? calloc((size_t)nreq, sizeof *res) : NULL;
    if (nreq > 0 && !res) RW_FAIL(err, RW_E_OOM, "profile: sample results");
    rw_status st = RW_OK;
    int timed = 0;
    p->no_graph = false;
    for (int it = 0; it < warmup + 3 * steps && timed < steps; it++) {
        p->on = true;
        p->sampled = false;
        st = m->ops->forward(m, kv, b, err);
        if (st == RW_OK && nreq > 0) st = m->ops->sample(m, nreq, req, res, err);
        p->on = false;
        if (st != RW_OK) break;
        const cudaError_t ce = cudaStreamSynchronize(be->st);
        if (ce != cudaSuccess) {
            st = RW_ERR(err, RW_E_CUDA, "profile: %s", cudaGetErrorString(ce));
            break;
        }
        if (it < warmup || p->failed || p->n < 2) continue;
        double ph[RW_PROF_NPHASE] = {0};
        float fw = 0.0f, sm = 0.0f;
        bool ok = cudaEventElapsedTime(&fw, p->ev[0], p->ev[p->n - 1]) == cudaSuccess;
        for (int i = 1; ok && i < p->n; i++) {
            float ms = 0.0f;
            ok = cudaEventElapsedTime(&ms, p->ev[i - 1], p->ev[i]) == cudaSuccess;
            if (ok && p->ph[i] < RW_PROF_NPHASE) ph[p->ph[i]] += ms;
        }
        if (!ok) { /* events recorded inside the graph cannot be timed here: go eager */
            (void)cudaGetLastError();
            if (p->graph) p->no_graph = true;
            continue;
        }
        for (int i = 0; i < RW_PROF_NPHASE; i++)
            out->phase_ms[i] += ph[i];
        out->forward_ms += fw;
        if (p->sampled && cudaEventElapsedTime(&sm, p->s0, p->s1) == cudaSuccess)
            out->sample_ms += sm;
        out->graph = p->graph;
        timed++;
    }
    (void)cudaGetLastError();
    free(res);
    if (st != RW_OK) return st;
    if (!timed) RW_FAIL(err, RW_E_CUDA, "profile: no step could be timed (event records failed)");
    for (int i = 0; i < RW_PROF_NPHASE; i++)
        out->phase_ms[i] /= timed;
    out->forward_ms /= timed;
    out->sample_ms /= timed;
    return RW_OK;
}

/* Fills a KV cache with random bf16 (benchmarks must not time zeros). */
rw_status rw_cuda_be_kv_randomize(rw_model *m, rw_kv *kv, uint64_t seed, rw_err *err) {
    cuda_be *be = m->be;
    const int64_t n = (int64_t)kv->layer_elems * m->cfg.num_layers;
    RW_CHECK(rw_k_fill_bf16(kv->k, n, seed, 0.0f, 1.0f, be->st, err));
    RW_CHECK(rw_k_fill_bf16(kv->v, n, seed + 1, 0.0f, 1.0f, be->st, err));
    CU(cudaStreamSynchronize(be->st));
    return RW_OK;
}

typedef struct dev_rand {
    rw_model *m;
    uint64_t seed;
    float std;
    uint16_t *buf; /* device, reused for every tensor (stream order protects it) */
    size_t cap;
    rw_err *err;
} dev_rand;

static rw_status dev_rand_one(const rw_wname *w, void *vctx) {
    dev_rand *c = vctx;
    rw_err *err = c->err;
    cuda_be *be = c->m->be;
    char name[256];
    rw_name_format(w, name, sizeof name);
    rw_piece p;
    memset(&p, 0, sizeof p);
    RW_CHECK(rw_config_weight_shape(&c->m->cfg, w, &p.ndim, p.shape, err));
    const size_t n = (size_t)rw_shape_numel(p.ndim, p.shape);
    if (n > c->cap) {
        CU(cudaStreamSynchronize(be->st));
        cudaFree(c->buf);
        c->buf = NULL;
        c->cap = 0;
        CU(cudaMalloc((void **)&c->buf, n * sizeof(uint16_t)));
        c->cap = n;
    }
    uint64_t ts;
    float mean, sd;
    rw_model_rand_params(w, name, c->seed, c->std, &ts, &mean, &sd);
    RW_CHECK(rw_k_fill_bf16(c->buf, (int64_t)n, ts, mean, sd, be->st, err));
    p.name = name;
    p.dtype = RW_DTYPE_BF16;
    p.shard_dim = -1;
    p.layout = RW_PIECE_PLAIN;
    p.data = c->buf;
    p.place = RW_PLACE_DEVICE;
    return rw_wset_apply(c->m->ws, &p, be->st, err);
}

rw_status rw_cuda_be_load_random(rw_model *m, uint64_t seed, float std, rw_err *err) {
    cuda_be *be = m->be;
    dev_rand c = {m, seed, std, NULL, 0, err};
    rw_status st = rw_config_for_each_weight(&m->cfg, dev_rand_one, &c);
    const cudaError_t ce = cudaStreamSynchronize(be->st);
    cudaFree(c.buf);
    RW_CHECK(st);
    if (ce != cudaSuccess) RW_FAIL(err, RW_E_CUDA, "random weights: %s", cudaGetErrorString(ce));
    return RW_OK;
}

rw_status rw_cuda_backend_init(rw_model *m, rw_err *err) {
    const rw_config *c = &m->cfg;
    if (c->hidden_size % 128 != 0)
        RW_FAIL(err, RW_E_UNSUPPORTED, "CUDA backend: hidden_size %d must be a multiple of 128",
                c->hidden_size);
    cuda_be *be = calloc(1, sizeof *be);
    if (!be) RW_FAIL(err, RW_E_OOM, "cuda backend");
    m->be = be;
    rw_status st = RW_OK;
    cudaError_t ce;
    cublasStatus_t cs;
    if ((ce = cudaSetDevice(m->device)) ||
        (ce = cudaStreamCreateWithFlags(&be->st, cudaStreamNonBlocking)) ||
        (ce = cudaDeviceGetAttribute(&be->nsm, cudaDevAttrMultiProcessorCount, m->device))) {
        st = RW_ERR(err, RW_E_CUDA, "cuda backend init: %s", cudaGetErrorString(ce));
        goto fail;
    }
    if ((cs = cublasLtCreate(&be->lt)) ||
        (cs = cublasLtMatmulDescCreate(&be->mm, CUBLAS_COMPUTE_32F, CUDA_R_32F))) {
        st = RW_ERR(err, RW_E_CUDA, "cuBLASLt init: status %d", (int)cs);
        goto fail;
    }
    {
        const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
        if ((cs = cublasLtMatmulDescSetAttribute(be->mm, CUBLASLT_MATMUL_DESC_TRANSA, &ta,
                                                 sizeof ta)) ||
            (cs = cublasLtMatmulDescSetAttribute(be->mm, CUBLASLT_MATMUL_DESC_TRANSB, &tb,
                                                 sizeof tb))) {
            st = RW_ERR(err, RW_E_CUDA, "cuBLASLt descriptor: status %d", (int)cs);
            goto fail;
        }
    }
    be->lt_ws_bytes = (size_t)32 << 20;
    const int64_t hd = c->head_dim, H = c->hidden_size;
    const int64_t qd = m->d.nh_local * hd;
    const size_t wdeq = (size_t)(qd > H ? qd : H) * (size_t)(qd > H ? H : qd) * 2;
    float *inv = malloc(sizeof(float) * (size_t)(hd / 2));
    if (!inv) {
        st = RW_ERR(err, RW_E_OOM, "inv_freq");
        goto fail;
    }
    for (int64_t i = 0; i < hd / 2; i++)
        inv[i] = (float)(1.0 / pow(c->rope_theta, (double)(2 * i) / (double)hd));
    if ((ce = cudaMalloc(&be->lt_ws, be->lt_ws_bytes)) ||
        (ce = cudaMalloc((void **)&be->wdeq, wdeq)) ||
        (ce = cudaMalloc((void **)&be->inv_freq, sizeof(float) * (size_t)(hd / 2))) ||
        (ce = cudaMemcpy(be->inv_freq, inv, sizeof(float) * (size_t)(hd / 2),
                         cudaMemcpyHostToDevice))) {
        free(inv);
        st = RW_ERR(err, RW_E_CUDA, "cuda backend buffers: %s", cudaGetErrorString(ce));
        goto fail;
    }
    free(inv);
    /* RW_CUDA_GRAPHS=0 turns graphs off; RW_CUDA_SYNC=1 (synchronize after every launch to
     * localise faults) cannot run inside a capture, so it turns them off too */
    const char *g = getenv("RW_CUDA_GRAPHS"), *sy = getenv("RW_CUDA_SYNC");
    be->use_graphs = !(g && strcmp(g, "0") == 0) && !(sy && sy[0] == '1');
    m->ops = &cuda_ops;
    return RW_OK;
fail:
    cuda_destroy(m);
    return st;
}
