/* kernels_small.c - the forward pass's small per-token kernels alone (forward.h: rwb_fwd_small,
 * part of rw-bench kernels): the q/k norm + RoPE + KV write (rw_k_qk_rope_kv) and the experts'
 * combine fused into the next layer's input norm (rw_k_combine_rmsnorm), at M tokens on the
 * model's shapes and layer 0's norm weights, with the arguments the forward pass gives them
 * (cuda_forward.c). rw-bench sets each line beside the HBM copy bandwidth of the run: what the
 * kernel must move against what a copy moves in that time.
 *
 * The inputs stay put between repetitions, as the previous kernel's output would: at small M they
 * sit in L2 as they do in a step. Each token writes its K and V into a block of its own, as a
 * decode batch of M sequences does. */
#include <stdlib.h>
#include <string.h>

#include "forward.h"

#ifdef RW_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "bench_iface.h"
#include "cuda_check.h"
#include "kernels/norm_rope.h"

#define SMALL_BS 16 /* tokens a KV block, the engine's */

typedef struct small_run {
    void *st;
    const rw_config *c;
    const rw_layer_weights *l0;
    int64_t M;
    /* rope: q | k | v rows of the fused GEMM's output, the backend's frequencies, the positions
     * and slots */
    float *qkv, *qf;
    const float *inv;
    int32_t *pos, *slot;
    rw_kv_planes kv;
    /* combine: the residual x, the expert rows y [M k, H], each token's rows and weights */
    float *x, *y, *wts;
    int32_t *rinv;
    uint16_t *hi, *lo;
} small_run;

static rw_status rope_call(void *ctx, int rep, rw_err *err) {
    (void)rep;
    small_run *r = ctx;
    const rw_config *c = r->c;
    const int64_t hd = c->head_dim, ld = (int64_t)(c->num_heads + 2 * c->num_kv_heads) * hd;
    const float *q = r->qkv, *k = q + (int64_t)c->num_heads * hd,
                *v = k + (int64_t)c->num_kv_heads * hd;
    return rw_k_qk_rope_kv(q, k, v, ld, ld, r->l0->q_norm.data, r->l0->k_norm.data, r->pos, r->slot,
                           r->M, c->num_heads, c->num_kv_heads, (int)hd, SMALL_BS, r->inv,
                           (float)c->rms_eps, r->qf, r->kv, (rw_stream)r->st, err);
}

static rw_status combine_call(void *ctx, int rep, rw_err *err) {
    (void)rep;
    small_run *r = ctx;
    const rw_config *c = r->c;
    return rw_k_combine_rmsnorm(r->x, r->y, r->rinv, r->wts, c->top_k, r->l0->input_norm.data, r->M,
                                c->hidden_size, (float)c->rms_eps, r->hi, r->lo, NULL,
                                (rw_stream)r->st, err);
}

static void small_line(FILE *out, const char *what, int64_t M, double sec, double bytes) {
    fprintf(out,
            "{\"bench\": \"kernel\", \"what\": \"%s\", \"tokens\": %lld, \"seconds\": %.9f, "
            "\"bytes\": %.6e, \"gbs\": %.1f}\n",
            what, (long long)M, sec, bytes, bytes / sec / 1e9);
}

/* Host data for the launches: positions spread over a 1k context, one KV block a token, and
 * each token's top-k rows a permutation's (the rows the sort would give, here token-major, so
 * each row is read once). */
static rw_status small_host(small_run *r, uint64_t seed, rw_err *err) {
    const rw_config *c = r->c;
    const int64_t M = r->M, K = c->top_k;
    rw_status st = RW_OK;
    int32_t *pos = malloc(sizeof(int32_t) * (size_t)M), *slot = malloc(sizeof(int32_t) * (size_t)M);
    int32_t *rinv = malloc(sizeof(int32_t) * (size_t)(M * K));
    float *wts = malloc(sizeof(float) * (size_t)(M * K));
    if (!pos || !slot || !rinv || !wts) {
        RW_ERR(err, RW_E_OOM, "bench small: host arrays for %lld tokens", (long long)M);
        st = RW_E_OOM;
        goto done;
    }
    for (int64_t t = 0; t < M; t++) {
        pos[t] = (int32_t)((t * 37 + (int64_t)seed) % 1024);
        slot[t] = (int32_t)(t * SMALL_BS + t % SMALL_BS);
        for (int64_t j = 0; j < K; j++) {
            rinv[t * K + j] = (int32_t)(t * K + j);
            wts[t * K + j] = 1.0f / (float)K;
        }
    }
    RW_CUDA_CHECKGOTO(err,
                      cudaMemcpy(r->pos, pos, sizeof(int32_t) * (size_t)M, cudaMemcpyHostToDevice),
                      st, done);
    RW_CUDA_CHECKGOTO(
        err, cudaMemcpy(r->slot, slot, sizeof(int32_t) * (size_t)M, cudaMemcpyHostToDevice), st,
        done);
    RW_CUDA_CHECKGOTO(
        err, cudaMemcpy(r->rinv, rinv, sizeof(int32_t) * (size_t)(M * K), cudaMemcpyHostToDevice),
        st, done);
    RW_CUDA_CHECKGOTO(
        err, cudaMemcpy(r->wts, wts, sizeof(float) * (size_t)(M * K), cudaMemcpyHostToDevice), st,
        done);
done:
    free(pos);
    free(slot);
    free(rinv);
    free(wts);
    return st;
}

rw_status rwb_fwd_small(struct rw_model *m, int64_t M, uint64_t seed, FILE *out, rw_err *err) {
    const rw_config *c = rw_model_config(m);
    small_run r;
    memset(&r, 0, sizeof r);
    r.st = rw_cuda_be_stream(m);
    r.c = c;
    r.M = M;
    r.l0 = rw_wset_layer(m->ws, 0);
    r.inv = rw_cuda_be_inv_freq(m);
    const int64_t H = c->hidden_size, K = c->top_k, hd = c->head_dim;
    const int64_t nq = (int64_t)c->num_heads * hd, nkv = (int64_t)c->num_kv_heads * hd;
    const size_t qkv_b = 4 * (size_t)(M * (nq + 2 * nkv)), kv_b = 2 * (size_t)(M * SMALL_BS * nkv);
    rw_status st = RW_OK;
    RW_CUDA_CHECKGOTO(err, cudaMalloc((void **)&r.qkv, qkv_b), st, done);
    RW_CUDA_CHECKGOTO(err, cudaMalloc((void **)&r.qf, 4 * (size_t)(M * nq)), st, done);
    RW_CUDA_CHECKGOTO(err, cudaMalloc((void **)&r.pos, 4 * (size_t)M), st, done);
    RW_CUDA_CHECKGOTO(err, cudaMalloc((void **)&r.slot, 4 * (size_t)M), st, done);
    RW_CUDA_CHECKGOTO(err, cudaMalloc((void **)&r.kv.k, kv_b), st, done);
    RW_CUDA_CHECKGOTO(err, cudaMalloc((void **)&r.kv.v, kv_b), st, done);
    RW_CUDA_CHECKGOTO(err, cudaMalloc((void **)&r.x, 4 * (size_t)(M * H)), st, done);
    RW_CUDA_CHECKGOTO(err, cudaMalloc((void **)&r.y, 4 * (size_t)(M * K * H)), st, done);
    RW_CUDA_CHECKGOTO(err, cudaMalloc((void **)&r.wts, 4 * (size_t)(M * K)), st, done);
    RW_CUDA_CHECKGOTO(err, cudaMalloc((void **)&r.rinv, 4 * (size_t)(M * K)), st, done);
    RW_CUDA_CHECKGOTO(err, cudaMalloc((void **)&r.hi, 2 * (size_t)(M * H)), st, done);
    RW_CUDA_CHECKGOTO(err, cudaMalloc((void **)&r.lo, 2 * (size_t)(M * H)), st, done);
    RW_CHECKGOTO(small_host(&r, seed, err), st, done);
    RW_CHECKGOTO(rwb_k_fill_f32_rand(r.qkv, M * (nq + 2 * nkv), seed, r.st, err), st, done);
    RW_CHECKGOTO(rwb_k_fill_f32_rand(r.x, M * H, seed + 1, r.st, err), st, done);
    RW_CHECKGOTO(rwb_k_fill_f32_rand(r.y, M * K * H, seed + 2, r.st, err), st, done);
    double sec = 0;
    /* rope: q, k and v read in fp32, q written in fp32, K and V written in bf16 */
    RW_CHECKGOTO(rwb_time_kernel(rope_call, &r, r.st, &sec, err), st, done);
    small_line(out, "qk_rope_kv", M, sec,
               4.0 * (double)(M * (nq + 2 * nkv)) + 4.0 * (double)(M * nq) +
                   4.0 * (double)(M * nkv));
    /* combine + norm: x read and written, the k expert rows read, the bf16 pair written */
    RW_CHECKGOTO(rwb_time_kernel(combine_call, &r, r.st, &sec, err), st, done);
    small_line(out, "combine_rmsnorm", M, sec, (8.0 + 4.0 * (double)K + 4.0) * (double)(M * H));
done:
    cudaFree(r.qkv);
    cudaFree(r.qf);
    cudaFree(r.pos);
    cudaFree(r.slot);
    cudaFree(r.kv.k);
    cudaFree(r.kv.v);
    cudaFree(r.x);
    cudaFree(r.y);
    cudaFree(r.wts);
    cudaFree(r.rinv);
    cudaFree(r.hi);
    cudaFree(r.lo);
    return st;
}
#endif
