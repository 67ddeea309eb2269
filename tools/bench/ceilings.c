/* ceilings.c - `rw-bench ceilings`: the machine's ceilings of docs/TARGETS.md measured now (HBM
 * copy, pinned host -> device, raw NCCL broadcast GPU0 -> GPU1 at one large and one 64 MiB bucket,
 * bf16 GEMM 8192^3), for the ceilings table of docs/BENCHMARKS.md. Every other mode measures the
 * ceiling it compares against itself, in its own run. */
#include "bench.h"

#include <stdlib.h>
#include <string.h>

/* Emits a ceiling line: `amount` bytes (or FLOPs when unit is TFLOP/s) per rep; with settle_s >= 0
 * also the seconds the copy took to reach its settled rate (settle.h). */
static void emit_ceiling(rwb_ctx *c, const char *bench, const char *what, const double *samples,
                         int n, double amount, const char *unit, const char *amount_key,
                         double settle_s) {
    rwb_stats s = rwb_stats_of(samples, n);
    json_t *j = rwb_line(c, bench, what);
    rwb_set_str(j, "role", "ceiling");
    rwb_set_num(j, amount_key, amount);
    if (settle_s >= 0) rwb_set_num(j, "settle_s", settle_s);
    rwb_line_stats(j, &s);
    double scale = strcmp(unit, "TFLOP/s") == 0 ? 1e12 : 1e9;
    rwb_line_rate(j, amount / s.median / scale, unit, 0, NULL);
    rwb_emit(j);
}

rw_status rwb_measure_hbm(rwb_ctx *c, int dev, const char *bench, double *gbps, rw_err *err) {
    double smp[RWB_MAX_SAMPLES];
    const size_t bytes = 2ull << 30;
    int reps = c->o.reps < 10 ? 10 : c->o.reps;
    double settle_s = 0;
    RW_CHECK(rwb_copy_d2d(dev, bytes, c->o.warmup, reps, smp, &settle_s, err));
    rwb_stats s = rwb_stats_of(smp, reps);
    *gbps = 2.0 * (double)bytes / s.median / 1e9;
    emit_ceiling(c, bench, "hbm_copy", smp, reps, 2.0 * (double)bytes, "GB/s", "bytes", settle_s);
    return RW_OK;
}

rw_status rwb_measure_gemm(rwb_ctx *c, rwb_gemm *g, const char *bench, const char *what,
                           int64_t m, int64_t n, int64_t k, int batch, bool emit,
                           double *median_s, rw_err *err) {
    double smp[RWB_MAX_SAMPLES];
    int reps = c->o.reps < 10 ? 10 : c->o.reps;
    RW_CHECK(rwb_gemm_run(g, m, n, k, batch, c->o.warmup, reps, smp, err));
    rwb_stats s = rwb_stats_of(smp, reps);
    *median_s = s.median;
    if (emit) {
        double flops = 2.0 * (double)m * (double)n * (double)k * batch;
        json_t *j = rwb_line(c, bench, what);
        rwb_set_str(j, "role", "ceiling");
        rwb_set_num(j, "flops", flops);
        rwb_set_int(j, "m", m);
        rwb_set_int(j, "n", n);
        rwb_set_int(j, "k", k);
        rwb_set_int(j, "batch", batch);
        rwb_line_stats(j, &s);
        rwb_line_rate(j, flops / s.median / 1e12, "TFLOP/s", 0, NULL);
        rwb_emit(j);
    }
    return RW_OK;
}

void rwb_mode_ceilings(rwb_ctx *c) {
    rw_err err = {0};
    double smp[RWB_MAX_SAMPLES];
    double gbps;
    if (rwb_measure_hbm(c, c->o.gpu0, "ceilings", &gbps, &err) != RW_OK)
        rwb_emit_error(c, "ceilings", "hbm_copy", &err);

    const uint64_t h2d_total = 8ull << 30;
    if (rwb_copy_h2d(c->o.gpu0, h2d_total, 1u << 30, c->o.warmup, c->o.reps, smp, &err) == RW_OK)
        emit_ceiling(c, "ceilings", "h2d_pinned", smp, c->o.reps, (double)h2d_total, "GB/s",
                     "bytes", -1);
    else
        rwb_emit_error(c, "ceilings", "h2d_pinned", &err);

    rwb_bcast *b = NULL;
    if (rwb_bcast_create(c->o.gpu0, c->o.gpu1, &b, &err) == RW_OK) {
        const uint64_t total = 4ull << 30;
        const uint64_t buckets[2] = {4ull << 30, 64ull << 20};
        for (int i = 0; i < 2; i++) {
            char what[64];
            snprintf(what, sizeof what, "nccl_bcast_%llumib",
                     (unsigned long long)(buckets[i] >> 20));
            if (rwb_bcast_run(b, total, buckets[i], c->o.warmup, c->o.reps, smp, &err) != RW_OK) {
                rwb_emit_error(c, "ceilings", what, &err);
                continue;
            }
            rwb_stats s = rwb_stats_of(smp, c->o.reps);
            json_t *j = rwb_line(c, "ceilings", what);
            rwb_set_str(j, "role", "ceiling");
            rwb_set_num(j, "bytes", (double)total);
            rwb_set_num(j, "bucket_bytes", (double)buckets[i]);
            rwb_line_stats(j, &s);
            rwb_line_rate(j, (double)total / s.median / 1e9, "GB/s", 0, NULL);
            rwb_emit(j);
        }
        rwb_bcast_destroy(b);
    } else {
        rwb_emit_error(c, "ceilings", "nccl_bcast", &err);
    }

    rwb_gemm *g = NULL;
    double t;
    if (rwb_gemm_create(c->o.gpu0, &g, &err) != RW_OK ||
        rwb_measure_gemm(c, g, "ceilings", "gemm_bf16_8192", 8192, 8192, 8192, 1, true, &t,
                         &err) != RW_OK)
        rwb_emit_error(c, "ceilings", "gemm_bf16_8192", &err);
    rwb_gemm_destroy(g);
}
