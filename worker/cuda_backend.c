/* cuda_backend.c - the CUDA backend: the Qwen3-MoE forward pass on one GPU rank. Own kernels for
 * everything: dense GEMMs (kernels/gemm.h: q, k, v, o, lm_head), norms, RoPE, paged attention,
 * routing, experts (moe/route.cu, moe/experts.cu) and sampling (worker/kernels/); NCCL
 * all-reduce / all-gather through rw_comm; decode steps replayed from CUDA graphs. This file: the
 * design, init / destroy and the ops table; the work is spread over the cuda_*.c files listed in
 * cuda_be.h.
 *
 * Precision: the residual stream, norms, q, router logits, softmaxes and accumulations are fp32;
 * every GEMM input (normed hidden states, attention output, expert activations, final-normed
 * rows) is a hi + lo bf16 pair (about 16 significant bits: kernels/common.h), so bf16 weights
 * meet near-fp32 activations; the KV cache is bf16. One bf16 rounding of an activation moves
 * router logits by ~1e-3 and flips near-tied experts (tests/worker/test_cuda_numerics.c measures
 * it). Quantized dense weights (mxfp8 / fp8-block q, k, v, o) are dequantized to bf16 before the
 * GEMM; quantized experts are dequantized tile by tile inside the expert kernel.
 *
 * Batch invariance: a token's logits are the same bits whatever else is in the batch, however its
 * prompt was chunked, and whichever graph or split ran it. Every kernel computes a token's values
 * in an order fixed by the token alone: GEMMs whose K slices are fixed by the weight's shape and
 * added in slice order (kernels/gemm.h), the experts per token in slot order, attention in fixed
 * key segments merged in order (kernels/attention.h), norms and router per row. So continuous
 * batching reproduces a request's run alone, and seeded sampling with it. */
#include <stdlib.h>

#include "cuda_be.h"

static void cuda_destroy(rw_model *m) {
    cuda_be *be = m->be;
    if (!be) return;
    cudaStreamSynchronize(be->st);
    if (be->side) cudaStreamSynchronize(be->side); /* joined into st unless a forward failed */
    rw_cuda_drop_graphs(be);
    rw_cuda_free_scratch(be);
    cudaFree(be->inv_freq);
    cudaFree(be->wdeq);
    cudaFree(be->wdeq2);
    cudaFree(be->wdeq_o);
    rw_cuda_dense_free(be);
    if (be->ev_fork) cudaEventDestroy(be->ev_fork);
    if (be->ev_join) cudaEventDestroy(be->ev_join);
    if (be->side) cudaStreamDestroy(be->side);
    if (be->meta_ev) cudaEventDestroy(be->meta_ev);
    if (be->st) cudaStreamDestroy(be->st);
    free(be);
    m->be = NULL;
}

static const rw_backend_ops cuda_ops = {
    .name = "cuda",
    .reserve = rw_cuda_reserve,
    .kv_block_bytes = rw_cuda_kv_block_bytes,
    .kv_budget = rw_cuda_kv_budget,
    .kv_create = rw_cuda_kv_create,
    .kv_destroy = rw_cuda_kv_destroy,
    .forward = rw_cuda_forward,
    .sample = rw_cuda_sample,
    .logits_host = rw_cuda_logits_host,
    .kv_copy = rw_cuda_kv_copy,
    .routes = rw_cuda_routes,
    .load_random = rw_cuda_load_random,
    .release_derived = rw_cuda_dense_release,
    .destroy = cuda_destroy,
};

rw_status rw_cuda_backend_init(rw_model *m, rw_err *err) {
    const rw_config *c = &m->cfg;
    if (c->hidden_size % 128 != 0)
        RW_FAIL(err, RW_E_UNSUPPORTED, "CUDA backend: hidden_size %d must be a multiple of 128",
                c->hidden_size);
    cuda_be *be = calloc(1, sizeof *be);
    if (!be) RW_FAIL(err, RW_E_OOM, "cuda backend");
    m->be = be;
    rw_status st = RW_OK;
    float *inv = NULL;
    RW_CUDA_CHECKGOTO(err, cudaSetDevice(m->device), st, fail);
    RW_CUDA_CHECKGOTO(err, cudaStreamCreateWithFlags(&be->st, cudaStreamNonBlocking), st, fail);
    RW_CUDA_CHECKGOTO(err, cudaEventCreateWithFlags(&be->meta_ev, cudaEventDisableTiming), st,
                      fail);
    RW_CUDA_CHECKGOTO(
        err, cudaDeviceGetAttribute(&be->nsm, cudaDevAttrMultiProcessorCount, m->device), st, fail);
    const int64_t hd = c->head_dim, H = c->hidden_size;
    const int64_t qd = m->d.nh_local * hd, kd = m->d.nkv_local * hd;
    /* bf16 staging for quantized dense weights, dequantized before their GEMM: one layer's
     * [q | k | v] rows, which hold more than its o_proj [H, qd] */
    const size_t wdeq = (size_t)(qd + 2 * kd) * (size_t)H * 2;
    inv = malloc(sizeof(float) * (size_t)(hd / 2));
    if (!inv) {
        st = RW_ERR(err, RW_E_OOM, "inv_freq");
        goto fail;
    }
    rw_rope_inv_freq(c, inv);
    RW_CUDA_CHECKGOTO(err, cudaMalloc((void **)&be->wdeq, wdeq), st, fail);
    if (c->quant.method != RW_QMETHOD_NONE) {
        /* the side stream's buffers: a second [q | k v] and the o_proj [H, qd] (cuda_be.h) */
        RW_CUDA_CHECKGOTO(err, cudaStreamCreateWithFlags(&be->side, cudaStreamNonBlocking), st,
                          fail);
        RW_CUDA_CHECKGOTO(err, cudaEventCreateWithFlags(&be->ev_fork, cudaEventDisableTiming), st,
                          fail);
        RW_CUDA_CHECKGOTO(err, cudaEventCreateWithFlags(&be->ev_join, cudaEventDisableTiming), st,
                          fail);
        RW_CUDA_CHECKGOTO(err, cudaMalloc((void **)&be->wdeq2, wdeq), st, fail);
        RW_CUDA_CHECKGOTO(err, cudaMalloc((void **)&be->wdeq_o, (size_t)H * (size_t)qd * 2), st,
                          fail);
    }
    RW_CUDA_CHECKGOTO(err, cudaMalloc((void **)&be->inv_freq, sizeof(float) * (size_t)(hd / 2)), st,
                      fail);
    RW_CUDA_CHECKGOTO(
        err,
        cudaMemcpy(be->inv_freq, inv, sizeof(float) * (size_t)(hd / 2), cudaMemcpyHostToDevice), st,
        fail);
    free(inv);
    rw_cuda_dense_init(m);
    /* RW_CUDA_GRAPHS=0 turns graphs off; RW_CUDA_SYNC=1 (synchronize after every launch to
     * localise faults) cannot run inside a capture, so it turns them off too */
    const char *g = getenv("RW_CUDA_GRAPHS"), *sy = getenv("RW_CUDA_SYNC");
    be->use_graphs = !(g && strcmp(g, "0") == 0) && !(sy && sy[0] == '1');
    m->ops = &cuda_ops;
    return RW_OK;
fail:
    free(inv);
    cuda_destroy(m);
    return st;
}

/* --- bench_iface.h --------------------------------------------------------------------------- */
void *rw_cuda_be_stream(rw_model *m) {
    return ((cuda_be *)m->be)->st;
}

void rw_cuda_be_set_graphs(rw_model *m, bool on) {
    cuda_be *be = m->be;
    if (!on) rw_cuda_drop_graphs(be);
    be->use_graphs = on;
}

const float *rw_cuda_be_inv_freq(rw_model *m) {
    return ((cuda_be *)m->be)->inv_freq;
}

void rw_cuda_be_set_hook(rw_model *m, rw_cuda_fwd_hook *h) {
    ((cuda_be *)m->be)->hook = h;
}

int rw_cuda_be_attn_split(rw_model *m, int64_t ntok, int ntiles, int64_t max_ctx, void **part,
                          size_t *part_bytes) {
    cuda_be *be = m->be;
    *part = be->attn_part;
    *part_bytes = be->attn_part_bytes;
    if (ntok == ntiles && be->use_graphs) return rw_cuda_graph_split(m, (int)ntok, max_ctx);
    return rw_cuda_pick_split(be, ntok, ntiles, m->d.nkv_local, m->d.nh_local, m->cfg.head_dim,
                              max_ctx);
}
