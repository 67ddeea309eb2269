/* engine.h - what rw-bench's engine-level modes share (engine.c: decode, prefill; rollout.c:
 * rollout): the model with random weights cached for the invocation, the HBM ceiling measured
 * once, the memory floor of a decode step, and draining outputs. Worker builds only
 * (RWB_HAVE_WORKER). Not a public contract. */
#ifndef RW_BENCH_ENGINE_H
#define RW_BENCH_ENGINE_H

#include "bench.h"
#include "rw_worker.h"

/* The benchmarked model (c->cfg, or its mxfp8-last-8-bf16 variant when quant) on GPU gpu0 with
 * random weights written through the weight set's apply path; built once and cached in c
 * (rwb_engine_release frees it). Borrowed. */
rw_status rwb_engine_model(rwb_ctx *c, bool quant, rw_model **out, rw_err *err);
/* The HBM copy bandwidth in GB/s, measured once per invocation (its ceiling line is emitted
 * under `bench` the first time) with no engine model resident: a model that rwb_engine_model
 * cached before is released first, so a pointer it returned is invalid after the first call. */
rw_status rwb_engine_hbm(rwb_ctx *c, const char *bench, double *gbps, rw_err *err);

/* Bytes a forward must read, by kind. */
typedef struct rwb_floor {
    double fixed;        /* read once per step whatever the batch: attention, router, norms,
                            lm_head, final norm */
    double per_expert;   /* bytes of one expert summed over the layers */
    double per_row;      /* embedding row read per token */
    double kv_per_token; /* KV bytes per cached token (all layers, K and V) */
    int E, k;
} rwb_floor;
rwb_floor rwb_floor_of(rw_model *m);
/* Bytes of a decode step of `batch` sequences at mean context ctx: fixed + embedding rows + the
 * distinct experts the batch touches in expectation under uniform top-k routing,
 * E (1 - (1 - k/E)^batch) per layer (*experts gets it), + the KV read. */
double rwb_floor_bytes(const rwb_floor *f, int batch, double ctx, double *experts);

/* Frees every finished output of e. */
void rwb_free_outputs(rw_engine *e);

#endif
