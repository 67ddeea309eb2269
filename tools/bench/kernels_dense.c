/* kernels_dense.c - the dense GEMMs alone (forward.h: rwb_fwd_dense, part of rw-bench kernels):
 * rw_k_gemm as the forward pass calls it, with the K split and tile it picks, on the model's q/k/v
 * (the fused view), o_proj and lm_head weights at M tokens; the activations of q/k/v and o_proj a
 * hi + lo bf16 pair, the lm_head's one bf16 input (cuda_forward.c's forms).
 * Repetitions rotate over the layers' weights (the lm_head is larger than L2 alone), so weights
 * come from memory as in a decode step. rw-bench sets each line beside the HBM copy bandwidth and
 * cuBLASLt on the same shape (forward_lines.c). */
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "forward.h"

#ifdef RW_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "bench_iface.h"
#include "cuda_check.h"
#include "kernels/gemm.h"

typedef struct dense_run {
    void *st;
    const uint16_t *w[RWB_DENSE_MAX_LAYERS];
    int nw;
    int64_t N, K, M;
    uint16_t *x, *xlo;
    bool pair; /* the input as a hi + lo pair, or its hi part alone */
    float *y;
    void *ws;
    size_t ws_bytes;
} dense_run;

static rw_status dense_call(void *ctx, int rep, rw_err *err) {
    dense_run *d = ctx;
    return rw_k_gemm(d->w[rep % d->nw], d->N, d->K, d->x, d->pair ? d->xlo : NULL, d->M, d->y,
                     d->ws, d->ws_bytes, (rw_stream)d->st, err);
}

/* One weight kind at M tokens: one line. */
static rw_status dense_one(dense_run *d, const char *name, uint64_t seed, FILE *out,
                           rw_err *err) {
    rw_status st = RW_OK;
    const size_t xb = 2 * (size_t)(d->M * d->K), yb = 4 * (size_t)(d->M * d->N);
    d->ws_bytes = rw_k_gemm_ws_bytes(d->N, d->K, d->M);
    RW_CUDA_CHECKGOTO(err, cudaMalloc((void **)&d->x, xb), st, done);
    RW_CUDA_CHECKGOTO(err, cudaMalloc((void **)&d->xlo, xb), st, done);
    RW_CUDA_CHECKGOTO(err, cudaMalloc((void **)&d->y, yb), st, done);
    if (d->ws_bytes) {
        RW_CUDA_CHECKGOTO(err, cudaMalloc(&d->ws, d->ws_bytes), st, done);
        /* the split's tile counters start at zero (gemm.h) */
        RW_CUDA_CHECKGOTO(err, cudaMemset(d->ws, 0, d->ws_bytes), st, done);
    }
    RW_CHECKGOTO(rwb_fill_pair(d->x, d->xlo, d->M * d->K, seed, d->st, err), st, done);
    double sec = 0;
    RW_CHECKGOTO(rwb_time_kernel(dense_call, d, d->st, &sec, err), st, done);
    /* bytes it must move: the weight once, the input (pair), the fp32 output */
    const double bytes =
        2.0 * (double)d->N * d->K + (d->pair ? 2.0 : 1.0) * (double)xb + (double)yb;
    const double flop = 2.0 * (double)d->M * d->N * d->K;
    fprintf(out,
            "{\"bench\": \"kernel\", \"what\": \"dense_%s\", \"tokens\": %lld, \"n\": %lld, "
            "\"k\": %lld, \"pair\": %s, \"k_slices\": %d, \"weight_layers\": %d, "
            "\"seconds\": %.9f, "
            "\"bytes\": %.6e, \"gbs\": %.1f, \"flop\": %.6e, \"tflops\": %.2f}\n",
            name, (long long)d->M, (long long)d->N, (long long)d->K, d->pair ? "true" : "false",
            rw_k_gemm_splits(d->N, d->K), d->nw, sec, bytes, bytes / sec / 1e9, flop,
            flop / sec / 1e12);
done:
    cudaFree(d->x);
    cudaFree(d->xlo);
    cudaFree(d->y);
    cudaFree(d->ws);
    d->x = d->xlo = NULL;
    d->y = NULL;
    d->ws = NULL;
    return st;
}

rw_status rwb_fwd_dense(struct rw_model *m, int64_t M, uint64_t seed, FILE *out, rw_err *err) {
    const rw_config *c = rw_model_config(m);
    const int L = c->num_layers < RWB_DENSE_MAX_LAYERS ? c->num_layers : RWB_DENSE_MAX_LAYERS;
    dense_run d;
    memset(&d, 0, sizeof d);
    d.st = rw_cuda_be_stream(m);
    d.M = M;
    d.pair = true;
    const rw_layer_weights *l0 = rw_wset_layer(m->ws, 0);
    if (!l0->qkv.data || l0->o.dtype != RW_DTYPE_BF16)
        RW_FAIL(err, RW_E_UNSUPPORTED, "bench dense: the model's attention is not bf16");
    /* q/k/v: the fused [q | k | v] view the forward pass multiplies */
    d.N = l0->qkv.shape[0];
    d.K = l0->qkv.shape[1];
    d.nw = L;
    for (int l = 0; l < L; l++)
        d.w[l] = rw_wset_layer(m->ws, l)->qkv.data;
    RW_CHECK(dense_one(&d, "qkv", seed, out, err));
    d.N = l0->o.shape[0];
    d.K = l0->o.shape[1];
    for (int l = 0; l < L; l++)
        d.w[l] = rw_wset_layer(m->ws, l)->o.data;
    RW_CHECK(dense_one(&d, "o_proj", seed, out, err));
    const rw_tensor lm = rw_wset_lm_head(m->ws);
    d.N = lm.shape[0];
    d.K = lm.shape[1];
    d.nw = 1;
    d.w[0] = lm.data;
    d.pair = false;
    return dense_one(&d, "lm_head", seed, out, err);
}
#endif
