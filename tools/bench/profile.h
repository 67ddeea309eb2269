/* profile.h - per-phase GPU timing of the CUDA backend's forward pass (profile.c), for the
 * forward-level benchmarks (forward.c, RW_BENCH_BREAKDOWN=1). It implements the phase hook of
 * worker/bench_iface.h: a CUDA event after each phase of every layer; a phase's time is the sum
 * over layers of the time between its event and the previous one, so the gaps between kernels
 * count towards the phase that follows them. Decode batches are profiled as they run, replayed
 * from a CUDA graph captured with the events in it (event record nodes); a batch that runs eagerly
 * (prefill, graphs off, or a capture the driver refuses) is queued behind a short spin kernel so
 * the host has queued the step before the GPU starts it, and the events measure GPU time rather
 * than launch latency. CUDA builds only. */
#ifndef RW_BENCH_PROFILE_H
#define RW_BENCH_PROFILE_H

#include "bench_iface.h"

typedef struct rwb_prof_result {
    double phase_ms[RW_PHASE_COUNT]; /* mean over the timed steps */
    double forward_ms;               /* first to last event of the forward, mean */
    double sample_ms;                /* the sampling kernel, mean (0 without requests) */
    bool graph;                      /* the forwards were graph replays */
} rwb_prof_result;

const char *rwb_phase_name(int phase); /* "embed", "norms", ... */

/* Runs `warmup` + `steps` forwards of `b` on `kv`, each followed by sampling `nreq` requests when
 * nreq > 0, with the hook set; reports the means over the timed steps. Leaves the backend as it
 * was (graph cache and settings). */
rw_status rwb_profile(rw_model *m, rw_kv *kv, const rw_fwd_batch *b, int nreq,
                      const rw_sample_req *req, int warmup, int steps, rwb_prof_result *out,
                      rw_err *err);

#endif
