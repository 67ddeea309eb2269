/* profile.c - per-phase GPU timing of the CUDA backend's forward pass through the phase hook of
 * worker/bench_iface.h (profile.h says what is measured and how). */
#include <cuda_runtime_api.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_check.h"
#include "forward.h"
#include "profile.h"

typedef struct prof {
    rw_cuda_fwd_hook hook;
    bool failed; /* an event record failed (the step's timings are not used) */
    int n, cap;  /* events recorded in this step, allocated */
    cudaEvent_t *ev;
    uint8_t *ph;        /* [cap] phase that ends at each event */
    cudaEvent_t s0, s1; /* around the sampling kernel */
    bool have_s, sampled;
} prof;

/* The hook's mark: an event at the end of `phase` (a fresh step at RW_PHASE_START). */
static bool prof_mark(void *ctx, int phase, void *stream, bool capturing) {
    prof *p = ctx;
    if (phase == RW_PHASE_SAMPLE_BEGIN) {
        p->sampled = cudaEventRecord(p->s0, (cudaStream_t)stream) == cudaSuccess;
        return true;
    }
    if (phase == RW_PHASE_SAMPLE_END) {
        if (p->sampled) p->sampled = cudaEventRecord(p->s1, (cudaStream_t)stream) == cudaSuccess;
        return true;
    }
    if (phase == RW_PHASE_START) {
        p->n = 0;
        p->failed = false;
    }
    if (p->n >= p->cap) {
        p->failed = true;
        return false;
    }
    const cudaError_t e = capturing ? cudaEventRecordWithFlags(p->ev[p->n], (cudaStream_t)stream,
                                                               cudaEventRecordExternal)
                                    : cudaEventRecord(p->ev[p->n], (cudaStream_t)stream);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        p->failed = true;
        return false;
    }
    p->ph[p->n++] = (uint8_t)phase;
    return true;
}

/* The hook's before_eager: a 20 ms head start for the host. */
static rw_status prof_before_eager(void *ctx, void *stream, rw_err *err) {
    (void)ctx;
    return rwb_k_spin(20 * 1000 * 1000, stream, err);
}

static void prof_free(prof *p) {
    for (int i = 0; i < p->cap; i++)
        cudaEventDestroy(p->ev[i]);
    if (p->have_s) {
        cudaEventDestroy(p->s0);
        cudaEventDestroy(p->s1);
    }
    free(p->ev);
    free(p->ph);
    memset(p, 0, sizeof *p);
}

static rw_status prof_alloc(prof *p, int need, rw_err *err) {
    p->ev = calloc((size_t)need, sizeof *p->ev);
    p->ph = calloc((size_t)need, 1);
    if (!p->ev || !p->ph) RW_FAIL(err, RW_E_OOM, "profile: %d events", need);
    for (int i = 0; i < need; i++) {
        RW_CUDA_CHECK(err, cudaEventCreate(&p->ev[i]));
        p->cap = i + 1;
    }
    RW_CUDA_CHECK(err, cudaEventCreate(&p->s0));
    const cudaError_t e = cudaEventCreate(&p->s1);
    if (e != cudaSuccess) {
        cudaEventDestroy(p->s0);
        return rw_cuda_fail(err, e, __FILE__, __LINE__, "cudaEventCreate(&p->s1)");
    }
    p->have_s = true;
    return RW_OK;
}

const char *rwb_phase_name(int phase) {
    static const char *const names[RW_PHASE_COUNT] = {
        "embed",  "norms",   "qkv_gemm", "qk_norm_rope_kv", "attention", "o_gemm",
        "router", "experts", "comm",     "lm_head"};
    return phase >= 0 && phase < RW_PHASE_COUNT ? names[phase] : "?";
}

rw_status rwb_profile(rw_model *m, rw_kv *kv, const rw_fwd_batch *b, int nreq,
                      const rw_sample_req *req, int warmup, int steps, rwb_prof_result *out,
                      rw_err *err) {
    memset(out, 0, sizeof *out);
    if (steps < 1) RW_FAIL(err, RW_E_INVALID_ARG, "profile: %d steps", steps);
    prof p;
    memset(&p, 0, sizeof p);
    /* events: 12 per layer (with TP), the start and the lm_head's */
    const int need = 12 * rw_model_config(m)->num_layers + 8;
    rw_status st = prof_alloc(&p, need, err);
    if (st != RW_OK) {
        prof_free(&p);
        return st;
    }
    p.hook = (rw_cuda_fwd_hook){&p, prof_mark, prof_before_eager, false, false};
    rw_sample_res *res = nreq > 0 ? calloc((size_t)nreq, sizeof *res) : NULL;
    if (nreq > 0 && !res) {
        prof_free(&p);
        RW_FAIL(err, RW_E_OOM, "profile: sample results");
    }
    cudaStream_t stream = (cudaStream_t)rw_cuda_be_stream(m);
    int timed = 0;
    for (int it = 0; it < warmup + 3 * steps && timed < steps; it++) {
        rw_cuda_be_set_hook(m, &p.hook);
        p.sampled = false;
        st = m->ops->forward(m, kv, b, err);
        if (st == RW_OK && nreq > 0) st = m->ops->sample(m, nreq, req, res, err);
        rw_cuda_be_set_hook(m, NULL);
        if (st != RW_OK) break;
        const cudaError_t ce = cudaStreamSynchronize(stream);
        if (ce != cudaSuccess) {
            st = rw_cuda_fail(err, ce, __FILE__, __LINE__, "profile: cudaStreamSynchronize");
            break;
        }
        if (it < warmup || p.failed || p.n < 2) continue;
        double ph[RW_PHASE_COUNT] = {0};
        float fw = 0.0f, sm = 0.0f;
        bool ok = cudaEventElapsedTime(&fw, p.ev[0], p.ev[p.n - 1]) == cudaSuccess;
        for (int i = 1; ok && i < p.n; i++) {
            float ms = 0.0f;
            ok = cudaEventElapsedTime(&ms, p.ev[i - 1], p.ev[i]) == cudaSuccess;
            if (ok && p.ph[i] < RW_PHASE_COUNT) ph[p.ph[i]] += ms;
        }
        if (!ok) { /* events recorded inside the graph cannot be timed here: go eager */
            (void)cudaGetLastError();
            if (p.hook.graph) p.hook.no_graph = true;
            continue;
        }
        for (int i = 0; i < RW_PHASE_COUNT; i++)
            out->phase_ms[i] += ph[i];
        out->forward_ms += fw;
        if (p.sampled && cudaEventElapsedTime(&sm, p.s0, p.s1) == cudaSuccess) out->sample_ms += sm;
        out->graph = p.hook.graph;
        timed++;
    }
    (void)cudaGetLastError();
    free(res);
    prof_free(&p);
    if (st != RW_OK) return st;
    if (!timed) RW_FAIL(err, RW_E_CUDA, "profile: no step could be timed (event records failed)");
    for (int i = 0; i < RW_PHASE_COUNT; i++)
        out->phase_ms[i] /= timed;
    out->forward_ms /= timed;
    out->sample_ms /= timed;
    return RW_OK;
}
