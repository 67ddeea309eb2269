/* kernels.c - rw-bench's kernel-level benchmarks (forward.h: rwb_fwd_kernels): attention and the
 * expert layer alone, on the shapes that targets G6 and G7 compare with torch (docs/TARGETS.md),
 * so tools/peer/torch_kernels.py can time torch SDPA and torch grouped_mm on the same shapes and
 * the same routing in the same run.
 *
 * - attention: the backend's paged attention kernel (rw_k_attention) with the split the engine
 *   picks for the batch, on a random bf16 KV cache in 16-token blocks: decode (one query per
 *   sequence at position kv - 1, so it reads kv keys) and causal prefill (every prompt from
 *   position 0). Decode is judged by the KV bytes it must read per second, prefill by TFLOP/s
 *   counting QK^T and PV once over the causal triangle.
 * - experts: rw_moe_experts_cuda (sort, w13 GEMM + SiLU, w2 GEMM, combine) on `tokens` tokens
 *   whose top-k experts come from rwb_route_expert, the rule the peer reproduces; inputs as the
 *   engine passes them (a hi + lo activation pair) and, for reference, bf16 alone. Repetitions
 *   rotate over the layers of a small model so the touched expert weights do not stay in L2.
 *
 * - the dense GEMMs: kernels_dense.c; the small per-token kernels: kernels_small.c.
 *
 * Timing (rwb_time_kernel): CUDA events around groups of repetitions after a warm-up; the median
 * of 5 groups. */
#include <stdlib.h>
#include <string.h>

#include "forward.h"
#include "order.h"
#include "rand.h"

int32_t rwb_route_expert(uint64_t seed, int64_t token, int j, int E, const int32_t *chosen) {
    /* draws c = 0, 1, ... until one is not among the token's first j experts */
    for (uint64_t c = 0;; c++) {
        const int32_t e =
            (int32_t)(rw_rand_u64_at(seed, (uint64_t)token * 1024u + c) % (uint64_t)E);
        bool dup = false;
        for (int q = 0; q < j; q++)
            dup |= chosen[q] == e;
        if (!dup) return e;
    }
}

#ifndef RW_HAVE_CUDA
rw_status rwb_fwd_kernels(const rwb_fwd_opts *o, FILE *out, rw_err *err) {
    (void)o, (void)out;
    RW_FAIL(err, RW_E_NO_DEVICE, "bench: built without the CUDA backend");
}
#else
#include <cuda_runtime_api.h>

#include "bench_iface.h"
#include "cuda_check.h"
#include "kernels/attention.h"
#include "rw_moe.h"

rw_status rwb_fill_pair(uint16_t *hi, uint16_t *lo, int64_t n, uint64_t seed, void *st,
                        rw_err *err) {
    RW_CHECK(rw_k_fill_bf16(hi, n, seed, 0.0f, 1.0f, (rw_stream)st, err));
    return rw_k_fill_bf16(lo, n, seed + 1, 0.0f, 1.0f / 256, (rw_stream)st, err);
}

/* A group lasts about 20 ms: 3 to 200 calls. */
rw_status rwb_time_kernel(rwb_kern_fn fn, void *ctx, void *stream, double *sec, rw_err *err) {
    cudaStream_t st = (cudaStream_t)stream;
    cudaEvent_t a = NULL, b = NULL;
    rw_status rs = RW_OK;
    RW_CUDA_CHECKGOTO(err, cudaEventCreate(&a), rs, done);
    RW_CUDA_CHECKGOTO(err, cudaEventCreate(&b), rs, done);
    int rep = 0;
    for (int i = 0; i < 2; i++)
        RW_CHECKGOTO(fn(ctx, rep++, err), rs, done);
    RW_CUDA_CHECKGOTO(err, cudaEventRecord(a, st), rs, done);
    RW_CHECKGOTO(fn(ctx, rep++, err), rs, done);
    RW_CUDA_CHECKGOTO(err, cudaEventRecord(b, st), rs, done);
    RW_CUDA_CHECKGOTO(err, cudaEventSynchronize(b), rs, done);
    float ms = 0;
    RW_CUDA_CHECKGOTO(err, cudaEventElapsedTime(&ms, a, b), rs, done);
    int n = ms > 0 ? (int)(20.0 / ms) : 200;
    n = n < 3 ? 3 : n > 200 ? 200 : n;
    double g[5];
    for (int k = 0; k < 5; k++) {
        RW_CUDA_CHECKGOTO(err, cudaEventRecord(a, st), rs, done);
        for (int i = 0; i < n; i++)
            RW_CHECKGOTO(fn(ctx, rep++, err), rs, done);
        RW_CUDA_CHECKGOTO(err, cudaEventRecord(b, st), rs, done);
        RW_CUDA_CHECKGOTO(err, cudaEventSynchronize(b), rs, done);
        RW_CUDA_CHECKGOTO(err, cudaEventElapsedTime(&ms, a, b), rs, done);
        g[k] = ms * 1e-3 / n;
    }
    qsort(g, 5, sizeof g[0], rwb_cmp_double);
    *sec = g[2];
done:
    if (a) cudaEventDestroy(a);
    if (b) cudaEventDestroy(b);
    return rs;
}

/* ------------------------------------------------------------------------------------------ */
/* attention                                                                                    */
/* ------------------------------------------------------------------------------------------ */
typedef struct attn_run {
    cudaStream_t st;
    int nh, nkv, hd, bs, ntiles, qt, bt_stride, nsplit;
    int64_t ntok;
    float *q;
    uint16_t *kc, *vc, *hi, *lo;
    rw_attn_tile *tiles;
    int32_t *pos, *bt;
    void *part;
    size_t part_bytes;
} attn_run;

static rw_status attn_call(void *ctx, int rep, rw_err *err) {
    (void)rep;
    attn_run *a = ctx;
    const rw_kv_planes kv = {a->kc, a->vc, NULL, NULL};
    return rw_k_attention(a->q, kv, a->tiles, a->ntiles, a->qt, a->pos, a->bt, a->bt_stride,
                          a->ntok, a->nh, a->nkv, a->hd, a->bs, a->nsplit, a->part, a->part_bytes,
                          a->hi, a->lo, a->st, err);
}

/* nseq sequences of kv keys; prefill: every position 0..kv-1 is a query (causal), decode: only
 * position kv - 1. One line on out. */
static rw_status bench_attention(rw_model *m, int nseq, int kv, bool prefill, uint64_t seed,
                                 FILE *out, rw_err *err) {
    const rw_config *c = rw_model_config(m);
    attn_run a;
    memset(&a, 0, sizeof a);
    a.st = (cudaStream_t)rw_cuda_be_stream(m);
    a.nh = c->num_heads;
    a.nkv = c->num_kv_heads;
    a.hd = c->head_dim;
    a.bs = 16;
    a.bt_stride = (kv + a.bs - 1) / a.bs;
    a.ntok = prefill ? (int64_t)nseq * kv : nseq;
    const int tt = prefill ? rw_k_attention_tile_tokens(a.nh, a.nkv) : 1;
    const int tiles_per_seq = prefill ? (kv + tt - 1) / tt : 1;
    a.ntiles = nseq * tiles_per_seq;
    a.qt = tt;
    const int64_t nblk = (int64_t)nseq * a.bt_stride;
    const size_t kv_elems = (size_t)nblk * a.nkv * a.bs * a.hd;
    rw_attn_tile *ht = malloc(sizeof *ht * (size_t)a.ntiles);
    int32_t *hp = malloc(sizeof *hp * (size_t)a.ntok);
    int32_t *hb = malloc(sizeof *hb * (size_t)nblk);
    rw_status st = RW_OK;
    if (!ht || !hp || !hb) {
        st = RW_ERR(err, RW_E_OOM, "bench attention: host metadata");
        goto done;
    }
    for (int s = 0; s < nseq; s++) {
        for (int i = 0; i < a.bt_stride; i++)
            hb[(int64_t)s * a.bt_stride + i] = (int32_t)((int64_t)s * a.bt_stride + i);
        if (prefill) {
            for (int i = 0; i < kv; i++)
                hp[(int64_t)s * kv + i] = i;
            for (int i = 0; i < tiles_per_seq; i++) {
                const int t0 = i * tt, n = kv - t0 < tt ? kv - t0 : tt;
                ht[s * tiles_per_seq + i] =
                    (rw_attn_tile){s, (int32_t)((int64_t)s * kv + t0), n, 0};
            }
        } else {
            hp[s] = kv - 1;
            ht[s] = (rw_attn_tile){s, s, 1, 0};
        }
    }
    RW_CUDA_CHECKGOTO(err, cudaMalloc((void **)&a.q, sizeof(float) * (size_t)a.ntok * a.nh * a.hd),
                      st, done);
    RW_CUDA_CHECKGOTO(err, cudaMalloc((void **)&a.kc, 2 * kv_elems), st, done);
    RW_CUDA_CHECKGOTO(err, cudaMalloc((void **)&a.vc, 2 * kv_elems), st, done);
    RW_CUDA_CHECKGOTO(err, cudaMalloc((void **)&a.hi, 2 * (size_t)a.ntok * a.nh * a.hd), st, done);
    RW_CUDA_CHECKGOTO(err, cudaMalloc((void **)&a.lo, 2 * (size_t)a.ntok * a.nh * a.hd), st, done);
    RW_CUDA_CHECKGOTO(err, cudaMalloc((void **)&a.tiles, sizeof *ht * (size_t)a.ntiles), st, done);
    RW_CUDA_CHECKGOTO(err, cudaMalloc((void **)&a.pos, sizeof *hp * (size_t)a.ntok), st, done);
    RW_CUDA_CHECKGOTO(err, cudaMalloc((void **)&a.bt, sizeof *hb * (size_t)nblk), st, done);
    RW_CUDA_CHECKGOTO(
        err, cudaMemcpy(a.tiles, ht, sizeof *ht * (size_t)a.ntiles, cudaMemcpyHostToDevice), st,
        done);
    RW_CUDA_CHECKGOTO(
        err, cudaMemcpy(a.pos, hp, sizeof *hp * (size_t)a.ntok, cudaMemcpyHostToDevice), st, done);
    RW_CUDA_CHECKGOTO(err, cudaMemcpy(a.bt, hb, sizeof *hb * (size_t)nblk, cudaMemcpyHostToDevice),
                      st, done);
    RW_CHECKGOTO(rwb_k_fill_f32_rand(a.q, a.ntok * a.nh * a.hd, seed, (rw_stream)a.st, err), st,
                 done);
    RW_CHECKGOTO(rw_k_fill_bf16(a.kc, (int64_t)kv_elems, seed + 1, 0.0f, 1.0f, a.st, err), st,
                 done);
    RW_CHECKGOTO(rw_k_fill_bf16(a.vc, (int64_t)kv_elems, seed + 2, 0.0f, 1.0f, a.st, err), st,
                 done);
    a.nsplit = rw_cuda_be_attn_split(m, a.ntok, a.ntiles, kv, &a.part, &a.part_bytes);
    double sec = 0;
    RW_CHECKGOTO(rwb_time_kernel(attn_call, &a, a.st, &sec, err), st, done);
    const double kv_bytes = (double)nseq * kv * a.nkv * a.hd * 2.0 * 2.0;
    const double flop = 4.0 * nseq * ((double)kv * (kv + 1) / 2) * a.nh * a.hd;
    if (prefill)
        fprintf(out,
                "{\"bench\": \"kernel\", \"what\": \"attention_prefill\", \"seqs\": %d, "
                "\"kv\": %d, \"heads\": %d, \"kv_heads\": %d, \"head_dim\": %d, \"nsplit\": %d, "
                "\"seconds\": %.9f, \"flop\": %.6e, \"tflops\": %.2f}\n",
                nseq, kv, a.nh, a.nkv, a.hd, a.nsplit, sec, flop, flop / sec / 1e12);
    else
        fprintf(out,
                "{\"bench\": \"kernel\", \"what\": \"attention_decode\", \"seqs\": %d, \"kv\": %d, "
                "\"heads\": %d, \"kv_heads\": %d, \"head_dim\": %d, \"nsplit\": %d, "
                "\"seconds\": %.9f, \"bytes\": %.6e, \"gbs\": %.1f}\n",
                nseq, kv, a.nh, a.nkv, a.hd, a.nsplit, sec, kv_bytes, kv_bytes / sec / 1e9);
done:
    cudaFree(a.q);
    cudaFree(a.kc);
    cudaFree(a.vc);
    cudaFree(a.hi);
    cudaFree(a.lo);
    cudaFree(a.tiles);
    cudaFree(a.pos);
    cudaFree(a.bt);
    free(ht);
    free(hp);
    free(hb);
    return st;
}

/* ------------------------------------------------------------------------------------------ */
/* experts                                                                                      */
/* ------------------------------------------------------------------------------------------ */
typedef struct moe_run {
    rw_model *m;
    cudaStream_t st;
    int64_t T, H;
    int k, layers;
    uint16_t *x, *xlo; /* xlo NULL: bf16 input alone */
    int32_t *ids;
    float *wts, *y;
    void *ws;
    size_t ws_bytes;
} moe_run;

static rw_status moe_call(void *ctx, int rep, rw_err *err) {
    moe_run *r = ctx;
    const rw_layer_weights *lw = rw_wset_layer(r->m->ws, rep % r->layers);
    /* silu(g)*u one bf16, as the engine runs it */
    return rw_moe_experts_cuda(lw, &r->m->d, r->H, r->x, r->xlo, false, r->T, r->ids, r->wts, r->k,
                               r->y, r->ws, r->ws_bytes, (rw_stream)r->st, err);
}

static rw_status bench_experts(rw_model *m, int64_t T, uint64_t seed, FILE *out, rw_err *err) {
    const rw_config *c = rw_model_config(m);
    moe_run r;
    memset(&r, 0, sizeof r);
    r.m = m;
    r.st = (cudaStream_t)rw_cuda_be_stream(m);
    r.T = T;
    r.H = c->hidden_size;
    r.k = c->top_k;
    r.layers = c->num_layers;
    const int E = c->num_experts;
    int32_t *hid = malloc(sizeof(int32_t) * (size_t)(T * r.k));
    bool *used = calloc((size_t)E, 1);
    rw_status st = RW_OK;
    if (!hid || !used) {
        st = RW_ERR(err, RW_E_OOM, "bench experts: routing");
        goto done;
    }
    int64_t touched = 0;
    for (int64_t t = 0; t < T; t++)
        for (int j = 0; j < r.k; j++) {
            const int32_t e = rwb_route_expert(seed, t, j, E, hid + t * r.k);
            hid[t * r.k + j] = e;
            if (!used[e]) touched++;
            used[e] = true;
        }
    const size_t xb = 2 * (size_t)(T * r.H);
    RW_CUDA_CHECKGOTO(err, cudaMalloc((void **)&r.x, xb), st, done);
    RW_CUDA_CHECKGOTO(err, cudaMalloc((void **)&r.xlo, xb), st, done);
    RW_CUDA_CHECKGOTO(err, cudaMalloc((void **)&r.y, 2 * xb), st, done);
    RW_CUDA_CHECKGOTO(err, cudaMalloc((void **)&r.ids, sizeof(int32_t) * (size_t)(T * r.k)), st,
                      done);
    RW_CUDA_CHECKGOTO(err, cudaMalloc((void **)&r.wts, sizeof(float) * (size_t)(T * r.k)), st,
                      done);
    r.ws_bytes = rw_moe_experts_cuda_workspace(E, m->d.P, r.H, T, r.k);
    RW_CUDA_CHECKGOTO(err, cudaMalloc(&r.ws, r.ws_bytes), st, done);
    RW_CUDA_CHECKGOTO(
        err, cudaMemcpy(r.ids, hid, sizeof(int32_t) * (size_t)(T * r.k), cudaMemcpyHostToDevice),
        st, done);
    RW_CHECKGOTO(rwb_fill_pair(r.x, r.xlo, T * r.H, seed + 3, r.st, err), st, done);
    RW_CHECKGOTO(rwb_k_fill_f32(r.wts, T * r.k, 1.0f / (float)r.k, r.st, err), st, done);
    RW_CUDA_CHECKGOTO(err, cudaMemsetAsync(r.y, 0, 2 * xb, r.st), st, done);
    const rw_layer_weights *w0 = rw_wset_layer(m->ws, 0);
    const double per_expert = (double)(rw_tensor_nbytes(&w0->w13) + rw_tensor_nbytes(&w0->w2)) / E;
    const double bytes = per_expert * (double)touched;
    const double flop = 2.0 * (double)T * r.k * 3.0 * (double)m->d.P * (double)r.H;
    for (int pair = 1; pair >= 0; pair--) {
        uint16_t *lo = r.xlo;
        if (!pair) r.xlo = NULL;
        double sec = 0;
        st = rwb_time_kernel(moe_call, &r, r.st, &sec, err);
        r.xlo = lo;
        if (st != RW_OK) goto done;
        fprintf(out,
                "{\"bench\": \"kernel\", \"what\": \"%s\", \"tokens\": %lld, \"top_k\": %d, "
                "\"experts\": %d, \"experts_touched\": %lld, \"hidden\": %lld, "
                "\"intermediate\": %lld, \"weight_layers\": %d, \"route_seed\": %llu, "
                "\"seconds\": %.9f, \"bytes\": %.6e, \"gbs\": %.1f, \"flop\": %.6e, "
                "\"tflops\": %.2f}\n",
                pair ? "experts" : "experts_bf16_input", (long long)T, r.k, E, (long long)touched,
                (long long)r.H, (long long)m->d.P, r.layers, (unsigned long long)seed, sec, bytes,
                bytes / sec / 1e9, flop, flop / sec / 1e12);
    }
done:
    cudaFree(r.x);
    cudaFree(r.xlo);
    cudaFree(r.y);
    cudaFree(r.ids);
    cudaFree(r.wts);
    cudaFree(r.ws);
    free(hid);
    free(used);
    return st;
}

rw_status rwb_fwd_kernels(const rwb_fwd_opts *o, FILE *out, rw_err *err) {
    rw_config cfg;
    memset(&cfg, 0, sizeof cfg);
    rw_model *m = NULL;
    rw_status st;
    RW_CHECKGOTO(rwb_fwd_make_model(o, o->kernel_layers, &cfg, &m, err), st, done);
    /* the backend's attention partials, for the splits of up to 256 tokens (larger batches take
     * none); every other buffer the benchmarks allocate themselves */
    RW_CHECKGOTO(m->ops->reserve(m, 256, 256, err), st, done);
    for (int i = 0; i < o->nattn; i++) {
        const rwb_attn_shape *a = &o->attn[i];
        fprintf(stderr, "rw-bench: kernels: attention %s %d x %d\n",
                a->prefill ? "prefill" : "decode", a->seqs, a->kv);
        RW_CHECKGOTO(bench_attention(m, a->seqs, a->kv, a->prefill, o->seed, out, err), st, done);
    }
    for (int i = 0; i < o->nexpert_tokens; i++) {
        fprintf(stderr, "rw-bench: kernels: experts %d tokens\n", o->expert_tokens[i]);
        RW_CHECKGOTO(bench_experts(m, o->expert_tokens[i], o->seed, out, err), st, done);
    }
    for (int i = 0; i < o->ndense_tokens; i++) {
        fprintf(stderr, "rw-bench: kernels: dense GEMMs at %d tokens\n", o->dense_tokens[i]);
        RW_CHECKGOTO(rwb_fwd_dense(m, o->dense_tokens[i], o->seed + 7, out, err), st, done);
    }
    for (int i = 0; i < o->nsmall_tokens; i++) {
        fprintf(stderr, "rw-bench: kernels: small kernels at %d tokens\n", o->small_tokens[i]);
        RW_CHECKGOTO(rwb_fwd_small(m, o->small_tokens[i], o->seed + 9, out, err), st, done);
    }
    st = RW_OK;
done:
    rw_model_destroy(m);
    rw_config_free(&cfg);
    return st;
}
#endif
