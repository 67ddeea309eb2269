/* forward.c - rw-bench's forward-level benchmarks of the worker (forward.h): decode and prefill
 * on a random model built in device memory (no disk), for targets G1-G4 (docs/TARGETS.md). They
 * drive the CUDA backend's ops directly through the worker's benchmark-facing interface
 * (worker/bench_iface.h). */
#include <math.h>
#include <stdlib.h>

#include "forward.h"
#include "order.h"

rwb_fwd_opts rwb_fwd_opts_default(void) {
    return (rwb_fwd_opts){.batch = 256,
                          .ctx = 1024,
                          .nprompt = 8,
                          .plen = 2048,
                          .steps = 20,
                          .graphs = true,
                          .seed = 1};
}

double rwb_prefill_attn_flops(const rw_config *cfg, int nprompt, int plen) {
    const double pairs = (double)plen * (plen + 1) / 2.0; /* (query, key) pairs of one prompt */
    return (double)cfg->num_layers * 2.0 * 2.0 * nprompt * pairs * cfg->num_heads * cfg->head_dim;
}

#ifndef RW_HAVE_CUDA
rw_status rwb_fwd_decode(const rwb_fwd_opts *o, FILE *out, rw_err *err) {
    (void)o, (void)out;
    RW_FAIL(err, RW_E_NO_DEVICE, "bench: built without the CUDA backend");
}
rw_status rwb_fwd_prefill(const rwb_fwd_opts *o, FILE *out, rw_err *err) {
    (void)o, (void)out;
    RW_FAIL(err, RW_E_NO_DEVICE, "bench: built without the CUDA backend");
}
#else
#include <cublasLt.h>
#include <cuda_profiler_api.h>
#include <cuda_runtime_api.h>

#include "cuda_check.h" /* after cublasLt.h: RW_CUBLAS_CHECK */
#include "profile.h"
#include "settle.h"

/* The Qwen3-30B-A3B shape of docs/TARGETS.md. */
static void qwen3_30b(rw_config *c) {
    memset(c, 0, sizeof *c);
    c->vocab_size = 151936;
    c->hidden_size = 2048;
    c->num_layers = 48;
    c->num_heads = 32;
    c->num_kv_heads = 4;
    c->head_dim = 128;
    c->num_experts = 128;
    c->top_k = 8;
    c->moe_intermediate = 768;
    c->max_position = 40960;
    c->rope_theta = 1000000.0;
    c->rms_eps = 1e-6;
    c->norm_topk_prob = true;
    c->tie_word_embeddings = false;
}

static rw_status fill_t(const rw_tensor *t, rw_wfmt fmt, bool is_scale, float mean, float std,
                        uint64_t seed, rw_stream s, rw_err *err) {
    if (!t->data || rw_tensor_numel(t) == 0) return RW_OK;
    const int64_t n = rw_tensor_numel(t);
    if (t->dtype == RW_DTYPE_BF16) return rw_k_fill_bf16(t->data, n, seed, mean, std, s, err);
    if (t->dtype == RW_DTYPE_F32) /* fp8-block scales: e4m3 values in (-1, 1) times this */
        return rwb_k_fill_f32(t->data, n, std, s, err);
    if (is_scale || t->dtype == RW_DTYPE_UE8M0 ||
        (t->dtype == RW_DTYPE_U8 && fmt == RW_WFMT_MXFP8)) {
        /* UE8M0 2^-6: e4m3 values below 1 become weights below 1/64 */
        RW_CUDA_CHECK(err, cudaMemsetAsync(t->data, 121, (size_t)n, (cudaStream_t)s));
        return RW_OK;
    }
    return rwb_k_fill_e4m3(t->data, n, seed, s, err);
}

/* Random weights straight into the device weight set (no host round trip). */
static rw_status fill_model(rw_model *m, uint64_t seed, rw_err *err) {
    rw_stream s = rw_cuda_be_stream(m);
    const rw_config *c = rw_model_config(m);
    const float std = 0.02f;
    uint64_t k = seed * 1000003u;
    for (int l = 0; l < c->num_layers; l++) {
        const rw_layer_weights *w = rw_wset_layer(rw_model_wset(m), l);
        const rw_tensor *norms[] = {&w->input_norm, &w->post_norm, &w->q_norm, &w->k_norm};
        for (int i = 0; i < 4; i++)
            RW_CHECK(fill_t(norms[i], RW_WFMT_BF16, false, 1.0f, 0.05f, ++k, s, err));
        const rw_tensor *att[] = {&w->q, &w->k, &w->v, &w->o};
        const rw_tensor *atts[] = {&w->q_scale, &w->k_scale, &w->v_scale, &w->o_scale};
        for (int i = 0; i < 4; i++) {
            RW_CHECK(fill_t(att[i], w->attn_fmt, false, 0.0f, std, ++k, s, err));
            if (w->attn_fmt != RW_WFMT_BF16)
                RW_CHECK(fill_t(atts[i], w->attn_fmt, true, 0.0f, std, ++k, s, err));
        }
        RW_CHECK(fill_t(&w->router, RW_WFMT_BF16, false, 0.0f, std, ++k, s, err));
        RW_CHECK(fill_t(&w->w13, w->moe_fmt, false, 0.0f, std, ++k, s, err));
        RW_CHECK(fill_t(&w->w2, w->moe_fmt, false, 0.0f, std, ++k, s, err));
        if (w->moe_fmt != RW_WFMT_BF16) {
            RW_CHECK(fill_t(&w->w13_scale, w->moe_fmt, true, 0.0f, std, ++k, s, err));
            RW_CHECK(fill_t(&w->w2_scale, w->moe_fmt, true, 0.0f, std, ++k, s, err));
        }
    }
    rw_tensor e = rw_wset_embed(rw_model_wset(m)), h = rw_wset_lm_head(rw_model_wset(m)),
              f = rw_wset_final_norm(rw_model_wset(m));
    RW_CHECK(fill_t(&e, RW_WFMT_BF16, false, 0.0f, 1.0f, ++k, s, err));
    RW_CHECK(fill_t(&h, RW_WFMT_BF16, false, 0.0f, std, ++k, s, err));
    RW_CHECK(fill_t(&f, RW_WFMT_BF16, false, 1.0f, 0.05f, ++k, s, err));
    RW_CUDA_CHECK(err, cudaStreamSynchronize((cudaStream_t)s));
    return RW_OK;
}

/* The cuBLASLt comparison of the prefill benchmark on the model's dense GEMM shapes: bf16 in, fp32
 * out, the heuristic's first algorithm per shape (cached), a 32 MiB workspace. */
#define GEMM_CACHE 128
typedef struct gemm_algo {
    int64_t m, n, k;
    cublasLtMatmulAlgo_t algo;
} gemm_algo;

typedef struct lt_gemm {
    cudaStream_t st;
    cublasLtHandle_t lt;
    cublasLtMatmulDesc_t mm;
    void *lt_ws;
    size_t lt_ws_bytes;
    gemm_algo cache[GEMM_CACHE];
    int ncache;
} lt_gemm;

static void lt_destroy(lt_gemm *g) {
    cudaFree(g->lt_ws);
    if (g->mm) cublasLtMatmulDescDestroy(g->mm);
    if (g->lt) cublasLtDestroy(g->lt);
    memset(g, 0, sizeof *g);
}

static rw_status lt_create(lt_gemm *g, cudaStream_t st, rw_err *err) {
    const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    g->st = st;
    g->lt_ws_bytes = (size_t)32 << 20;
    RW_CUBLAS_CHECK(err, cublasLtCreate(&g->lt));
    RW_CUBLAS_CHECK(err, cublasLtMatmulDescCreate(&g->mm, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    RW_CUBLAS_CHECK(
        err, cublasLtMatmulDescSetAttribute(g->mm, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
    RW_CUBLAS_CHECK(
        err, cublasLtMatmulDescSetAttribute(g->mm, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
    RW_CUDA_CHECK(err, cudaMalloc(&g->lt_ws, g->lt_ws_bytes));
    return RW_OK;
}

static rw_status lt_run(lt_gemm *be, const void *W, const void *X, float *Y, int64_t M, int64_t N,
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

/* Fills a KV cache with random bf16 (benchmarks must not time zeros); the low halves of the
 * high-precision mode with values 2^-8 as large. */
static rw_status kv_randomize(rw_model *m, rw_kv *kv, uint64_t seed, rw_err *err) {
    cudaStream_t st = (cudaStream_t)rw_cuda_be_stream(m);
    rw_kv_planes p;
    size_t n;
    rw_cuda_be_kv_buffers(m, kv, &p, &n);
    RW_CHECK(rw_k_fill_bf16(p.k, (int64_t)n, seed, 0.0f, 1.0f, st, err));
    RW_CHECK(rw_k_fill_bf16(p.v, (int64_t)n, seed + 1, 0.0f, 1.0f, st, err));
    if (p.k_lo) {
        RW_CHECK(rw_k_fill_bf16(p.k_lo, (int64_t)n, seed + 2, 0.0f, 1.0f / 256, st, err));
        RW_CHECK(rw_k_fill_bf16(p.v_lo, (int64_t)n, seed + 3, 0.0f, 1.0f / 256, st, err));
    }
    RW_CUDA_CHECK(err, cudaStreamSynchronize(st));
    return RW_OK;
}

static bool want_breakdown(void) {
    const char *v = getenv("RW_BENCH_BREAKDOWN");
    return v && v[0] == '1';
}

/* RW_BENCH_BREAKDOWN=1: per-phase GPU time of the benchmarked step (profile.h), as one JSON
 * line on `out` and a readable line on stderr. step_ms is the benchmark's own median step. */
static rw_status print_breakdown(rw_model *m, rw_kv *kv, const rw_fwd_batch *b, int nreq,
                                 const rw_sample_req *req, int steps, const char *what,
                                 const char *experts, int batch, int ctx, double step_ms, FILE *out,
                                 rw_err *err) {
    rwb_prof_result r;
    RW_CHECK(rwb_profile(m, kv, b, nreq, req, steps > 1 ? 2 : 0, steps, &r, err));
    char ph[1024];
    size_t o = 0;
    double sum = 0;
    for (int i = 0; i < RW_PHASE_COUNT; i++) {
        o += (size_t)snprintf(ph + o, sizeof ph - o, "%s\"%s\": %.4f", i ? ", " : "",
                              rwb_phase_name(i), r.phase_ms[i]);
        sum += r.phase_ms[i];
    }
    fprintf(out,
            "{\"bench\": \"%s\", \"experts\": \"%s\", \"batch\": %d, \"ctx\": %d, "
            "\"mode\": \"%s\", \"steps\": %d, \"step_ms_median\": %.3f, \"forward_ms\": %.3f, "
            "\"sample_ms\": %.4f, \"host_and_other_ms\": %.3f, \"phases_ms\": {%s}}\n",
            what, experts, batch, ctx, r.graph ? "graph" : "eager", steps, step_ms, r.forward_ms,
            r.sample_ms, step_ms - r.forward_ms - r.sample_ms, ph);
    fprintf(stderr,
            "rw-bench: breakdown %s batch %d ctx %d (%s): step %.3f ms = forward %.3f + "
            "sample %.3f + other %.3f;",
            what, batch, ctx, r.graph ? "graph" : "eager", step_ms, r.forward_ms, r.sample_ms,
            step_ms - r.forward_ms - r.sample_ms);
    for (int i = 0; i < RW_PHASE_COUNT; i++)
        if (r.phase_ms[i] > 0)
            fprintf(stderr, " %s %.3f (%.0f%%)", rwb_phase_name(i), r.phase_ms[i],
                    sum > 0 ? 100.0 * r.phase_ms[i] / sum : 0.0);
    fprintf(stderr, "\n");
    return RW_OK;
}

/* measure_hbm's copies for rwb_time_kernel: call rep copies a -> b when rep is even, b -> a when
 * it is odd. */
typedef struct hbm_copy {
    void *a, *b;
    size_t bytes;
    cudaStream_t st;
} hbm_copy;
static rw_status hbm_copy_call(void *ctx, int rep, rw_err *err) {
    const hbm_copy *h = ctx;
    RW_CUDA_CHECK(err, cudaMemcpyAsync(rep % 2 ? h->a : h->b, rep % 2 ? h->b : h->a, h->bytes,
                                       cudaMemcpyDeviceToDevice, h->st));
    return RW_OK;
}

/* The same copies timed on the host: copy i between two synchronizes, its seconds. */
static double host_timed_copy(const hbm_copy *h, int i) {
    cudaDeviceSynchronize();
    const double t0 = rw_now();
    cudaMemcpy(i % 2 ? h->a : h->b, i % 2 ? h->b : h->a, h->bytes, cudaMemcpyDeviceToDevice);
    cudaDeviceSynchronize();
    return rw_now() - t0;
}

/* HBM bandwidth measured now (device-to-device copy, read + write bytes), GB/s: cudaMemcpy timed
 * on the host around a device synchronize, the floor of this entry's lines. *events_gbs: the same
 * copies on a stream, timed by events (rwb_time_kernel, about 0.1 s; the stage ceiling hbm_copy
 * is timed by events too), reported beside it. In one rw-bench process the stage's hbm_copy
 * measured 4.24 TB/s and this entry 3.78-3.79; on an H200 the two timings of this call read
 * 3,817 and 3,787 GB/s, so the gap was the GPU's state, not the timing (docs/BENCHMARKS.md,
 * thirteenth session): the driver clearing the memory the previous entry had just freed (its
 * model), which the twenty-fourth session found and which the settling before the timed copies
 * waits out (settle.h). *settle_s: the seconds that took. */
static rw_status measure_hbm(double *gbs, double *events_gbs, double *settle_s, rw_err *err) {
    const size_t bytes = (size_t)2 << 30;
    void *a = NULL, *b = NULL;
    RW_CUDA_CHECK(err, cudaMalloc(&a, bytes));
    cudaError_t ce = cudaMalloc(&b, bytes);
    if (ce != cudaSuccess) {
        cudaFree(a);
        return rw_cuda_fail(err, ce, __FILE__, __LINE__, "bench: 2 GiB copy buffer");
    }
    cudaMemset(a, 1, bytes);
    hbm_copy h = {a, b, bytes, NULL};
    /* first the same copy until its rate has settled (settle.h): this entry runs right after the
     * previous one freed its model */
    rwb_settle se;
    rwb_settle_init(&se);
    for (int i = 0;; i++) {
        const double dt = host_timed_copy(&h, i);
        if (rwb_settle_add(&se, rw_now(), dt > 0 ? 2.0 * (double)bytes / dt : 0.0)) break;
    }
    *settle_s = se.waited;
    double t[7];
    for (int i = 0; i < 8; i++) {
        const double dt = host_timed_copy(&h, i);
        if (i) t[i - 1] = dt;
    }
    qsort(t, 7, sizeof t[0], rwb_cmp_double);
    *gbs = 2.0 * (double)bytes / t[3] / 1e9;
    double sec = 0;
    rw_status st = RW_OK;
    ce = cudaStreamCreateWithFlags(&h.st, cudaStreamNonBlocking);
    if (ce != cudaSuccess) {
        st = rw_cuda_fail(err, ce, __FILE__, __LINE__, "bench: copy stream");
    } else {
        st = rwb_time_kernel(hbm_copy_call, &h, h.st, &sec, err);
        cudaStreamDestroy(h.st);
    }
    cudaFree(a);
    cudaFree(b);
    RW_CHECK(st);
    *events_gbs = 2.0 * (double)bytes / sec / 1e9;
    return RW_OK;
}

static size_t tensor_bytes(const rw_tensor *t) {
    return t->data ? rw_tensor_nbytes(t) : 0;
}

static const char *fmt_name(rw_wfmt f) {
    return f == RW_WFMT_BF16 ? "bf16" : f == RW_WFMT_MXFP8 ? "mxfp8" : "fp8-block";
}

/* Applies a --quant preset to the config: mxfp8 (1x32 UE8M0), mxfp8-last-N (the last N layers
 * kept bf16 through modules_to_not_convert), fp8 (128x128 blocks). */
static rw_status apply_quant(rw_config *c, const char *q, rw_err *err) {
    if (!q || strcmp(q, "none") == 0) return RW_OK;
    int last = 0;
    rw_quant_config *qc = &c->quant;
    if (strcmp(q, "fp8") == 0) {
        qc->method = RW_QMETHOD_FP8_BLOCK;
        qc->block[0] = qc->block[1] = 128;
        snprintf(qc->scale_fmt, sizeof qc->scale_fmt, "%s", "");
    } else if (strcmp(q, "mxfp8") == 0 || sscanf(q, "mxfp8-last-%d", &last) == 1) {
        qc->method = RW_QMETHOD_MXFP8;
        qc->block[0] = 1;
        qc->block[1] = 32;
        snprintf(qc->scale_fmt, sizeof qc->scale_fmt, "%s", "ue8m0");
    } else {
        RW_FAIL(err, RW_E_INVALID_ARG, "bench: --quant '%s' (none, mxfp8, mxfp8-last-N, fp8)", q);
    }
    snprintf(qc->fmt, sizeof qc->fmt, "%s", "e4m3");
    snprintf(qc->activation_scheme, sizeof qc->activation_scheme, "%s", "dynamic");
    if (last < 0 || last > c->num_layers || last > RW_MAX_NOT_CONVERT)
        RW_FAIL(err, RW_E_RANGE, "bench: --quant %s: %d layers", q, c->num_layers);
    for (int l = c->num_layers - last; l < c->num_layers; l++) {
        char pre[64];
        snprintf(pre, sizeof pre, "model.layers.%d.", l);
        qc->not_convert[qc->n_not_convert] = strdup(pre);
        if (!qc->not_convert[qc->n_not_convert]) RW_FAIL(err, RW_E_OOM, "bench: quant config");
        qc->n_not_convert++;
    }
    return RW_OK;
}

rw_status rwb_fwd_make_model(const rwb_fwd_opts *o, int layers, rw_config *cfg, rw_model **m,
                             rw_err *err) {
    if (o->cfg)
        RW_CHECK(rw_config_copy(o->cfg, cfg, err));
    else
        qwen3_30b(cfg);
    if (layers > 0 && layers < cfg->num_layers) cfg->num_layers = layers;
    RW_CHECK(apply_quant(cfg, o->quant, err));
    rw_model_opts mo = {RW_BACKEND_CUDA, o->device, 1, 0, NULL, (rw_precision)o->precision};
    RW_CHECK(rw_model_create(cfg, &mo, m, err));
    rw_cuda_be_set_graphs(*m, o->graphs);
    return fill_model(*m, o->seed, err);
}

/* What both benchmarks build: the model, its KV cache and config, block tables, tokens and
 * sequences. */
static void free_run(rw_model *m, rw_kv *kv, rw_config *cfg, int32_t *blocks, int32_t *toks,
                     rw_fwd_seq *seqs) {
    if (kv) m->ops->kv_destroy(m, kv);
    rw_model_destroy(m);
    rw_config_free(cfg);
    free(blocks);
    free(toks);
    free(seqs);
}

rw_status rwb_fwd_decode(const rwb_fwd_opts *o, FILE *out, rw_err *err) {
    rw_config cfg;
    rw_model *m = NULL;
    rw_kv *kv = NULL;
    int32_t *blocks = NULL, *toks = NULL;
    rw_fwd_seq *seqs = NULL;
    rw_sample_req *req = NULL;
    rw_sample_res *res = NULL;
    double *times = NULL;
    rw_status st;
    memset(&cfg, 0, sizeof cfg);
    const int B = o->batch, ctx = o->ctx, steps = o->steps > 0 ? o->steps : 20;
    if (B < 1 || ctx < 1) RW_FAIL(err, RW_E_INVALID_ARG, "bench decode: batch %d, ctx %d", B, ctx);
    double hbm = 0, hbm_events = 0, hbm_settle = 0;
    RW_CHECK(measure_hbm(&hbm, &hbm_events, &hbm_settle, err));
    RW_CHECKGOTO(rwb_fwd_make_model(o, 0, &cfg, &m, err), st, done);
    const int bs = 16, bps = (ctx + 1 + bs - 1) / bs;
    RW_CHECKGOTO(m->ops->reserve(m, B, B, err), st, done);
    RW_CHECKGOTO(m->ops->kv_create(m, (int64_t)B * bps, bs, &kv, err), st, done);
    RW_CHECKGOTO(kv_randomize(m, kv, o->seed + 7, err), st, done);
    blocks = malloc(sizeof(int32_t) * (size_t)B * bps);
    toks = malloc(sizeof(int32_t) * (size_t)B);
    seqs = calloc((size_t)B, sizeof *seqs);
    req = calloc((size_t)B, sizeof *req);
    res = calloc((size_t)B, sizeof *res);
    times = calloc((size_t)steps, sizeof *times);
    if (!blocks || !toks || !seqs || !req || !res || !times) {
        st = RW_ERR(err, RW_E_OOM, "bench decode buffers");
        goto done;
    }
    rw_sampling sp = rw_sampling_default();
    sp.temperature = 1.0f; /* the usual RL rollout setting */
    rw_rng r;
    rw_rng_seed(&r, o->seed);
    for (int s = 0; s < B; s++) {
        for (int i = 0; i < bps; i++)
            blocks[s * bps + i] = s * bps + i;
        seqs[s] = (rw_fwd_seq){s, 1, ctx, blocks + (size_t)s * bps, s};
        req[s] = (rw_sample_req){&sp, ctx + 1, s};
    }
    const int warm = 3;
    /* RW_BENCH_NCU_BATCH=B: the first timed step at batch B runs between cudaProfilerStart and
     * cudaProfilerStop, so `ncu --profile-from-start off` profiles exactly one step
     * (tools/gpu/kernel-times.sh) */
    const char *ncu_b = getenv("RW_BENCH_NCU_BATCH");
    const bool ncu_step = ncu_b && atoi(ncu_b) == B;
    for (int it = 0; it < warm + steps; it++) {
        for (int s = 0; s < B; s++)
            toks[s] = (int32_t)(rw_rng_u64(&r) % (uint64_t)cfg.vocab_size);
        rw_fwd_batch b = {B, seqs, B, toks, B, false};
        RW_CUDA_CHECKGOTO(err, cudaDeviceSynchronize(), st, done);
        /* a failed profiler call must not become the next launch check's error */
        if (ncu_step && it == warm && cudaProfilerStart() != cudaSuccess) (void)cudaGetLastError();
        const double t0 = rw_now();
        RW_CHECKGOTO(m->ops->forward(m, kv, &b, err), st, done);
        RW_CHECKGOTO(m->ops->sample(m, B, req, res, err), st, done); /* synchronizes */
        if (it >= warm) times[it - warm] = rw_now() - t0;
        if (ncu_step && it == warm && cudaProfilerStop() != cudaSuccess) (void)cudaGetLastError();
    }
    qsort(times, (size_t)steps, sizeof *times, rwb_cmp_double);
    /* bytes a step must read: every expert some token routed to (expected count under uniform
     * routing), dense attention weights, router, lm_head, and the KV of every sequence */
    const rw_layer_weights *w0 = rw_wset_layer(m->ws, 0);
    const double E = cfg.num_experts, k = cfg.top_k;
    const double touched = E * (1.0 - pow(1.0 - k / E, B));
    double wbytes = 0;
    for (int l = 0; l < cfg.num_layers; l++) {
        const rw_layer_weights *w = rw_wset_layer(m->ws, l);
        const double per_exp = (double)(tensor_bytes(&w->w13) + tensor_bytes(&w->w2) +
                                        tensor_bytes(&w->w13_scale) + tensor_bytes(&w->w2_scale)) /
                               E;
        wbytes += touched * per_exp;
        wbytes += (double)(tensor_bytes(&w->q) + tensor_bytes(&w->k) + tensor_bytes(&w->v) +
                           tensor_bytes(&w->o) + tensor_bytes(&w->router));
    }
    rw_tensor lm = rw_wset_lm_head(m->ws);
    wbytes += (double)tensor_bytes(&lm);
    const double kvbytes =
        (double)B * (ctx + 1) * cfg.num_layers * m->d.nkv_local * cfg.head_dim * 2.0 * 2.0;
    const double floor_s = (wbytes + kvbytes) / (hbm * 1e9);
    const double med = times[steps / 2];
    fprintf(
        out,
        "{\"bench\": \"decode\", \"experts\": \"%s\", \"batch\": %d, \"ctx\": %d, \"steps\": %d, "
        "\"graphs\": %s, \"step_ms_median\": %.3f, \"step_ms_min\": %.3f, \"step_ms_max\": %.3f, "
        "\"tokens_per_s\": %.1f, \"bytes_per_step_gb\": %.3f, \"hbm_gbs_measured\": %.0f, "
        "\"hbm_gbs_events\": %.0f, \"hbm_settle_s\": %.3f, \"floor_ms\": %.3f, "
        "\"floor_tokens_per_s\": %.1f, \"ratio_to_floor\": %.3f}\n",
        fmt_name(w0->moe_fmt), B, ctx, steps, o->graphs ? "true" : "false", med * 1e3,
        times[0] * 1e3, times[steps - 1] * 1e3, B / med, (wbytes + kvbytes) / 1e9, hbm, hbm_events,
        hbm_settle, floor_s * 1e3, B / floor_s, floor_s / med);
    if (want_breakdown()) {
        rw_fwd_batch b = {B, seqs, B, toks, B, false};
        RW_CHECKGOTO(print_breakdown(m, kv, &b, B, req, 5, "decode_breakdown",
                                     fmt_name(w0->moe_fmt), B, ctx, med * 1e3, out, err),
                     st, done);
    }
    st = RW_OK;
done:
    free_run(m, kv, &cfg, blocks, toks, seqs);
    free(req);
    free(res);
    free(times);
    return st;
}

rw_status rwb_fwd_prefill(const rwb_fwd_opts *o, FILE *out, rw_err *err) {
    rw_config cfg;
    rw_model *m = NULL;
    rw_kv *kv = NULL;
    int32_t *blocks = NULL, *toks = NULL, *ids = NULL;
    rw_fwd_seq *seqs = NULL;
    uint16_t *xd = NULL;
    float *yd = NULL, *wd = NULL;
    int32_t *idd = NULL;
    void *mws = NULL;
    lt_gemm lt;
    memset(&lt, 0, sizeof lt);
    rw_status st;
    memset(&cfg, 0, sizeof cfg);
    const int NP = o->nprompt, L = o->plen;
    if (NP < 1 || L < 1) RW_FAIL(err, RW_E_INVALID_ARG, "bench prefill: %d x %d", NP, L);
    RW_CHECKGOTO(rwb_fwd_make_model(o, 0, &cfg, &m, err), st, done);
    const int bs = 16, bps = (L + bs - 1) / bs;
    const int64_t T = (int64_t)NP * L;
    RW_CHECKGOTO(m->ops->reserve(m, T, NP, err), st, done);
    RW_CHECKGOTO(m->ops->kv_create(m, (int64_t)NP * bps, bs, &kv, err), st, done);
    blocks = malloc(sizeof(int32_t) * (size_t)NP * bps);
    toks = malloc(sizeof(int32_t) * (size_t)T);
    seqs = calloc((size_t)NP, sizeof *seqs);
    if (!blocks || !toks || !seqs) {
        st = RW_ERR(err, RW_E_OOM, "bench prefill buffers");
        goto done;
    }
    rw_rng r;
    rw_rng_seed(&r, o->seed);
    for (int64_t i = 0; i < T; i++)
        toks[i] = (int32_t)(rw_rng_u64(&r) % (uint64_t)cfg.vocab_size);
    for (int s = 0; s < NP; s++) {
        for (int i = 0; i < bps; i++)
            blocks[s * bps + i] = s * bps + i;
        seqs[s] = (rw_fwd_seq){s * L, L, 0, blocks + (size_t)s * bps, s};
    }
    rw_fwd_batch b = {NP, seqs, (int32_t)T, toks, NP, false};
    double t[4];
    for (int it = 0; it < 4; it++) {
        RW_CUDA_CHECKGOTO(err, cudaDeviceSynchronize(), st, done);
        const double t0 = rw_now();
        RW_CHECKGOTO(m->ops->forward(m, kv, &b, err), st, done);
        RW_CUDA_CHECKGOTO(err, cudaStreamSynchronize((cudaStream_t)rw_cuda_be_stream(m)), st, done);
        t[it] = rw_now() - t0;
    }
    qsort(t + 1, 3, sizeof t[0], rwb_cmp_double);
    const double fwd = t[2];
    if (want_breakdown())
        RW_CHECKGOTO(print_breakdown(m, kv, &b, 0, NULL, 1, "prefill_breakdown",
                                     fmt_name(rw_wset_layer(m->ws, 0)->moe_fmt), NP, L, fwd * 1e3,
                                     out, err),
                     st, done);
    /* GEMMs alone, same shapes: q, k, v, o (cuBLASLt) and the experts (own kernel), layer 0 */
    const rw_layer_weights *w = rw_wset_layer(m->ws, 0);
    const int64_t H = cfg.hidden_size, qd = (int64_t)m->d.nh_local * cfg.head_dim,
                  kd = (int64_t)m->d.nkv_local * cfg.head_dim, P = m->d.P;
    const int K = cfg.top_k;
    rw_stream s = rw_cuda_be_stream(m);
    RW_CUDA_CHECKGOTO(err, cudaMalloc((void **)&xd, (size_t)T * (size_t)(qd > H ? qd : H) * 2), st,
                      done);
    RW_CUDA_CHECKGOTO(err, cudaMalloc((void **)&yd, (size_t)T * (size_t)(qd > H ? qd : H) * 4), st,
                      done);
    RW_CUDA_CHECKGOTO(err, cudaMalloc((void **)&wd, (size_t)T * K * 4), st, done);
    RW_CUDA_CHECKGOTO(err, cudaMalloc((void **)&idd, (size_t)T * K * 4), st, done);
    RW_CHECKGOTO(rw_k_fill_bf16(xd, T * (qd > H ? qd : H), o->seed + 3, 0.0f, 1.0f, s, err), st,
                 done);
    RW_CHECKGOTO(rwb_k_fill_f32(wd, T * K, 1.0f / K, s, err), st, done);
    ids = malloc(sizeof(int32_t) * (size_t)T * K);
    if (!ids) {
        st = RW_ERR(err, RW_E_OOM, "ids");
        goto done;
    }
    for (int64_t i = 0; i < T; i++) /* k distinct experts per token, uniform */
        for (int j = 0; j < K; j++) {
            int32_t e;
            bool dup;
            do {
                e = (int32_t)(rw_rng_u64(&r) % (uint64_t)cfg.num_experts);
                dup = false;
                for (int q = 0; q < j; q++)
                    dup |= ids[i * K + q] == e;
            } while (dup);
            ids[i * K + j] = e;
        }
    RW_CUDA_CHECKGOTO(err,
                      cudaMemcpy(idd, ids, sizeof(int32_t) * (size_t)T * K, cudaMemcpyHostToDevice),
                      st, done);
    const size_t mwsb = rw_moe_experts_cuda_workspace(cfg.num_experts, P, H, T, K);
    RW_CUDA_CHECKGOTO(err, cudaMalloc(&mws, mwsb), st, done);
    RW_CHECKGOTO(lt_create(&lt, (cudaStream_t)s, err), st, done);
    if (w->attn_fmt != RW_WFMT_BF16 || w->moe_fmt != RW_WFMT_BF16)
        fprintf(out, "{\"note\": \"layer 0 is quantized: GEMM timing uses its formats\"}\n");
    double tg_dense = 0, tg_moe = 0;
    for (int it = 0; it < 4; it++) {
        RW_CUDA_CHECKGOTO(err, cudaStreamSynchronize((cudaStream_t)s), st, done);
        double t0 = rw_now();
        if (w->attn_fmt == RW_WFMT_BF16) {
            RW_CHECKGOTO(lt_run(&lt, w->q.data, xd, yd, T, qd, H, err), st, done);
            RW_CHECKGOTO(lt_run(&lt, w->k.data, xd, yd, T, kd, H, err), st, done);
            RW_CHECKGOTO(lt_run(&lt, w->v.data, xd, yd, T, kd, H, err), st, done);
            RW_CHECKGOTO(lt_run(&lt, w->o.data, xd, yd, T, H, qd, err), st, done);
        }
        RW_CUDA_CHECKGOTO(err, cudaStreamSynchronize((cudaStream_t)s), st, done);
        double t1 = rw_now();
        RW_CUDA_CHECKGOTO(err, cudaMemsetAsync(yd, 0, (size_t)T * H * 4, (cudaStream_t)s), st,
                          done);
        RW_CHECKGOTO(
            rw_moe_experts_cuda(w, &m->d, H, xd, NULL, false, T, idd, wd, K, yd, mws, mwsb, s, err),
            st, done);
        RW_CUDA_CHECKGOTO(err, cudaStreamSynchronize((cudaStream_t)s), st, done);
        double t2 = rw_now();
        if (it) { /* first round warms up */
            tg_dense += (t1 - t0) / 3;
            tg_moe += (t2 - t1) / 3;
        }
    }
    const double f_dense = 2.0 * T * H * (qd + 2 * kd) + 2.0 * T * qd * H;
    const double f_moe = 2.0 * T * K * (2.0 * P * H + (double)H * P);
    const double f_lm = 2.0 * NP * (double)m->d.v_local * H;
    const double f_gemm = cfg.num_layers * (f_dense + f_moe) + f_lm;
    const double f_attn = rwb_prefill_attn_flops(&cfg, NP, L);
    const double dense_tfs = w->attn_fmt == RW_WFMT_BF16 ? f_dense / tg_dense / 1e12 : 0;
    const double moe_tfs = f_moe / tg_moe / 1e12;
    const double layer_gemm_s = (w->attn_fmt == RW_WFMT_BF16 ? tg_dense : 0) + tg_moe;
    fprintf(out,
            "{\"bench\": \"prefill\", \"experts\": \"%s\", \"prompts\": %d, \"prompt_len\": %d, "
            "\"forward_ms\": %.2f, \"tokens_per_s\": %.0f, \"gemm_tflop_per_forward\": %.2f, "
            "\"attention_tflop_per_forward\": %.2f, \"forward_tflops_gemm_only\": %.1f, "
            "\"dense_gemm_tflops\": %.1f, \"moe_gemm_tflops\": %.1f, "
            "\"layer_gemm_tflops\": %.1f, \"ratio_to_779\": %.3f}\n",
            fmt_name(w->moe_fmt), NP, L, fwd * 1e3, T / fwd, f_gemm / 1e12, f_attn / 1e12,
            f_gemm / fwd / 1e12, dense_tfs, moe_tfs,
            (f_dense * (w->attn_fmt == RW_WFMT_BF16) + f_moe) / layer_gemm_s / 1e12,
            (f_dense * (w->attn_fmt == RW_WFMT_BF16) + f_moe) / layer_gemm_s / 1e12 / 779.0);
    st = RW_OK;
done:
    cudaFree(xd);
    cudaFree(yd);
    cudaFree(wd);
    cudaFree(idd);
    cudaFree(mws);
    lt_destroy(&lt);
    free_run(m, kv, &cfg, blocks, toks, seqs);
    free(ids);
    return st;
}
#endif
