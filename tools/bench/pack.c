/* pack.c - `rw-bench pack` (S3): the moe module's pack scatter (canonical expert slice -> padded
 * packed layout) against a device-to-device copy of the same bytes, both timed in the same run
 * by rw_moe_bench_pack. Variants: bf16 at TP1 (the target), bf16 at TP4 (padded shard) and
 * mxfp8 at TP1 (quantize + pack), for the record. */
#include "bench.h"

#include <string.h>

#include "rw_moe.h"

#ifdef RWB_HAVE_MOE_BENCH
static void pack_one(rwb_ctx *c, const char *what, rw_wfmt fmt, int tp, const char *target_id) {
    rw_err err = {0};
    rw_moe_bench_cfg bc;
    memset(&bc, 0, sizeof bc);
    bc.H = c->cfg.hidden_size;
    bc.I = c->cfg.moe_intermediate;
    bc.E = c->cfg.num_experts;
    bc.tp = tp;
    bc.rank = 0;
    bc.fmt = fmt;
    bc.layers = c->o.pack_layers;
    bc.bufs = 2;
    bc.warmup = c->o.warmup;
    bc.reps = c->o.reps < 10 ? 10 : c->o.reps;
    bc.device = c->o.gpu0;
    rw_moe_bench_result r;
    memset(&r, 0, sizeof r);
    fprintf(stderr, "rw-bench: pack: %s\n", what);
    if (rw_moe_bench_pack(&bc, &r, &err) != RW_OK) {
        rwb_emit_error(c, "pack", what, &err);
        return;
    }
    json_t *j = rwb_line(c, "pack", what);
    rwb_set_num(j, "bytes", r.bytes_moved);
    rwb_set_int(j, "tp", tp);
    rwb_set_str(j, "format", rw_wfmt_str(fmt));
    rwb_set_int(j, "layers", bc.layers);
    /* the entry point reports the median and the extremes, not percentiles */
    rwb_set_num(j, "median_s", r.pack_ms_median * 1e-3);
    json_object_set_new(j, "p10_s", json_null());
    json_object_set_new(j, "p90_s", json_null());
    rwb_set_num(j, "min_s", r.pack_ms_min * 1e-3);
    rwb_set_num(j, "max_s", r.pack_ms_max * 1e-3);
    rwb_set_int(j, "reps", bc.reps);
    rwb_line_rate(j, r.pack_gbps, "GB/s", r.copy_gbps,
                  "cudaMemcpyAsync device-to-device of the same bytes");
    rwb_set_num(j, "ceiling_median_s", r.copy_ms_median * 1e-3);
    rwb_set_num(j, "ceiling_min_s", r.copy_ms_min * 1e-3);
    rwb_set_num(j, "ceiling_max_s", r.copy_ms_max * 1e-3);
    rwb_set_num(j, "time_ratio_copy_over_pack", r.ratio); /* the entry point's own ratio */
    rwb_set_int(j, "ops", r.ops);
    rwb_set_int(j, "launches", r.launches);
    rwb_line_target(j, target_id, target_id ? "pack bandwidth >= 0.7 x copy bandwidth" : NULL,
                    target_id ? r.pack_gbps >= 0.7 * r.copy_gbps : -1);
    rwb_emit(j);
}
#endif

void rwb_mode_pack(rwb_ctx *c) {
#ifdef RWB_HAVE_MOE_BENCH
    pack_one(c, "pack_bf16_tp1", RW_WFMT_BF16, 1, "S3");
    pack_one(c, "pack_bf16_tp4", RW_WFMT_BF16, 4, NULL);
    if (!c->o.no_quant) pack_one(c, "pack_mxfp8_tp1", RW_WFMT_MXFP8, 1, NULL);
#else
    /* no entry point: at least the ceiling, so the run says what the pack would be held to */
    rw_err err = {0};
    double gbps;
    if (rwb_measure_hbm(c, c->o.gpu0, "pack", &gbps, &err) != RW_OK)
        rwb_emit_error(c, "pack", "hbm_copy", &err);
    RW_ERR(&err, RW_E_UNSUPPORTED,
           "the moe module's benchmark entry point (rw_moe_bench_pack) is not in this build");
    rwb_emit_error(c, "pack", "pack_bf16_tp1", &err);
#endif
}
