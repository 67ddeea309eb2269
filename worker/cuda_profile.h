/* cuda_profile.h - per-phase GPU timing of the CUDA backend's forward pass, for the benchmarks
 * (bench.c, RW_BENCH_BREAKDOWN=1). Internal to the worker module; CUDA builds only.
 *
 * The forward pass records a CUDA event after each phase of every layer; a phase's time is the
 * sum over layers of the time between its event and the previous one, so the gaps between
 * kernels count towards the phase that follows them. Decode batches are profiled as they run,
 * replayed from a CUDA graph captured with the events in it (event record nodes); a batch that
 * runs eagerly (prefill, graphs off, or a capture the driver refuses) is queued behind a short
 * spin kernel so the host has queued the step before the GPU starts it, and the events measure
 * GPU time rather than launch latency. */
#ifndef RW_WORKER_CUDA_PROFILE_H
#define RW_WORKER_CUDA_PROFILE_H

#include "internal.h"

#ifdef __cplusplus
extern "C" {
#endif

enum {
    RW_PROF_EMBED = 0,   /* embedding */
    RW_PROF_NORM = 1,    /* input and post-attention RMSNorms (with the residual adds) */
    RW_PROF_QKV = 2,     /* q/k/v GEMM(s), dequantization included */
    RW_PROF_ROPE = 3,    /* per-head q/k norm, RoPE, KV cache write */
    RW_PROF_ATTN = 4,    /* paged attention (and the split combine) */
    RW_PROF_OPROJ = 5,   /* o_proj GEMM, dequantization included */
    RW_PROF_ROUTER = 6,  /* router logits and top-k */
    RW_PROF_EXPERTS = 7, /* expert sort, w13 and w2 GEMMs, combine */
    RW_PROF_COMM = 8,    /* tensor-parallel all-reduces and the logits all-gather */
    RW_PROF_LMHEAD = 9,  /* final norm, lm_head GEMM, logits gather */
    RW_PROF_NPHASE = 10,
};
const char *rw_cuda_prof_phase_name(int phase); /* "embed", "norms", ... */

typedef struct rw_cuda_prof_result {
    double phase_ms[RW_PROF_NPHASE]; /* mean over the timed steps */
    double forward_ms;               /* first to last event of the forward, mean */
    double sample_ms;                /* the sampling kernel, mean (0 without requests) */
    bool graph;                      /* the forwards were graph replays */
} rw_cuda_prof_result;

/* Runs `warmup` + `steps` forwards of `b` on `kv`, each followed by sampling `nreq` requests when
 * nreq > 0, with the events on; reports the means over the timed steps. Leaves the backend as it
 * was (graph cache and settings). */
rw_status rw_cuda_be_profile(rw_model *m, rw_kv *kv, const rw_fwd_batch *b, int nreq,
                             const rw_sample_req *req, int warmup, int steps,
                             rw_cuda_prof_result *out, rw_err *err);

#ifdef __cplusplus
}
#endif

#endif
