/* pack.c - `rw-bench pack` (S3): the moe module's pack scatter (canonical expert slices -> padded
 * packed layout, quantizing for mxfp8 / fp8-block layers) against cudaMemcpyAsync device-to-device
 * of the same source bytes, measured in the same run with CUDA events, after a warm-up, as the
 * median of many reps over rotating buffer sets (each set larger than L2, so no rep reads what the
 * previous one left in cache). Sources are random bf16 (rwb_fill_bf16). Variants: bf16 at TP1
 * (the target), bf16 at TP4 (padded shard) and mxfp8 at TP1 (quantize + pack), for the record.
 *
 * The scatter is driven through the moe module's op interface (moe_layout.h): one op per expert
 * matrix slice, the same kernels the weight set launches for an update. */
#include "bench.h"
#include "order.h"

#include <stdlib.h>
#include <string.h>

#include "rw_moe.h"

#ifdef RWB_HAVE_MOE_BENCH
#include "cuda_check.h"
#include "moe_layout.h"

/* One S3 measurement. */
typedef struct pack_cfg {
    int64_t H, I, E; /* expert shapes (Qwen3-30B-A3B: 2048, 768, 128) */
    int tp, rank;    /* worker TP and rank: the canonical slice [r*S, (r+1)*S) is packed */
    rw_wfmt fmt;     /* bf16 (pack), mxfp8 (quantize + pack), fp8-block (quantize) */
    int layers;      /* layers' experts per rep (>= 1) */
    int bufs;        /* rotating source/destination sets (>= 2); each set is layers' worth */
    int warmup, reps;
    int device;
} pack_cfg;

typedef struct pack_result {
    double bytes_moved; /* bytes read + bytes written by one pack rep */
    double pack_ms_median, pack_ms_min, pack_ms_max;
    double copy_ms_median, copy_ms_min, copy_ms_max; /* cudaMemcpyAsync D2D of the same bytes */
    double pack_gbps, copy_gbps;                     /* bytes_moved / median time */
    double ratio;                                    /* copy time / pack time (target >= 0.7) */
    int64_t ops, launches;                           /* scatter ops and kernel launches per rep */
} pack_result;

static void stats(double *v, int n, double *med, double *mn, double *mx) {
    qsort(v, (size_t)n, sizeof *v, rwb_cmp_double);
    *med = n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
    *mn = v[0];
    *mx = v[n - 1];
}

/* Ops of one buffer set: per layer, per expert, gate / up rows [rS, rS+S) and down columns. */
static rw_status build_ops(const pack_cfg *c, const uint16_t *src, uint8_t *packed, uint8_t *pscale,
                           rw_moe_op *ops, size_t *nops, size_t *src_bytes, size_t *dst_bytes) {
    int64_t H = c->H, I = c->I, S = I / c->tp, P = rw_roundup(S, 128), r = c->rank;
    rw_wfmt f = c->fmt;
    size_t pb13 = rw_moe_packed_bytes(f, RW_MOE_W13, P, H),
           pb2 = rw_moe_packed_bytes(f, RW_MOE_W2, P, H);
    size_t ps13 = rw_moe_packed_scale_bytes(f, RW_MOE_W13, P, H);
    size_t ps2 = rw_moe_packed_scale_bytes(f, RW_MOE_W2, P, H);
    size_t n = 0, sb = 0, db = 0;
    int64_t canon = 3 * I * H; /* gate, up, down of one expert, canonical */
    for (int64_t l = 0; l < c->layers; l++)
        for (int64_t e = 0; e < c->E; e++) {
            int64_t x = l * c->E + e;
            const uint16_t *g = src + x * canon, *u = g + I * H, *d = u + I * H;
            uint8_t *w13 = packed + x * (pb13 + pb2), *w2 = w13 + pb13;
            uint8_t *s13 = pscale ? pscale + x * (ps13 + ps2) : NULL, *s2 = s13 ? s13 + ps13 : NULL;
            rw_moe_tgt t13, ts13, t2, ts2;
            rw_moe_expert_tgt(f, RW_MOE_W13, P, H, w13, s13, &t13, &ts13);
            rw_moe_expert_tgt(f, RW_MOE_W2, P, H, w2, s2, &t2, &ts2);
            struct {
                const uint16_t *p;
                int64_t ld, rows, cols, r0;
                rw_moe_tgt t, ts;
            } parts[3] = {{u + r * S * H, H, S, H, 0, t13, ts13},
                          {g + r * S * H, H, S, H, P, t13, ts13},
                          {d + r * S, I, H, S, 0, t2, ts2}};
            for (int k = 0; k < 3; k++) {
                if (f == RW_WFMT_FP8_BLOCK) {
                    for (int64_t bi = 0; bi * 128 < parts[k].rows; bi++)
                        for (int64_t bj = 0; bj * 128 < parts[k].cols; bj++) {
                            rw_moe_op *o = &ops[n++];
                            memset(o, 0, sizeof *o);
                            o->kind = RW_MOE_OP_FP8Q;
                            o->esize = 2;
                            o->src = (uint64_t)(uintptr_t)(parts[k].p + bi * 128 * parts[k].ld +
                                                           bj * 128);
                            o->src_ld = parts[k].ld;
                            o->dst = parts[k].t;
                            o->scl = parts[k].ts;
                            o->dst_r0 = parts[k].r0 + bi * 128;
                            o->dst_c0 = bj * 128;
                            o->rows =
                                (int32_t)(parts[k].rows - bi * 128 < 128 ? parts[k].rows - bi * 128
                                                                         : 128);
                            o->cols =
                                (int32_t)(parts[k].cols - bj * 128 < 128 ? parts[k].cols - bj * 128
                                                                         : 128);
                        }
                } else {
                    rw_moe_op *o = &ops[n++];
                    memset(o, 0, sizeof *o);
                    o->kind = f == RW_WFMT_MXFP8 ? RW_MOE_OP_MXQ : RW_MOE_OP_COPY;
                    o->esize = 2;
                    o->src = (uint64_t)(uintptr_t)parts[k].p;
                    o->src_ld = parts[k].ld;
                    o->dst = parts[k].t;
                    o->scl = parts[k].ts;
                    o->dst_r0 = parts[k].r0;
                    o->rows = (int32_t)parts[k].rows;
                    o->cols = (int32_t)parts[k].cols;
                }
                int64_t el = parts[k].rows * parts[k].cols;
                sb += (size_t)el * 2;
                db += f == RW_WFMT_BF16
                          ? (size_t)el * 2
                          : (size_t)el + (f == RW_WFMT_MXFP8 ? (size_t)el / 32 : (size_t)el / 4096);
            }
        }
    *nops = n;
    *src_bytes = sb;
    *dst_bytes = db;
    return RW_OK;
}

static rw_status pack_run(const pack_cfg *cfg, pack_result *out, rw_err *err) {
    if (!cfg || !out) RW_FAIL(err, RW_E_INVALID_ARG, "bench: NULL argument");
    pack_cfg c = *cfg;
    memset(out, 0, sizeof *out);
    if (c.tp < 1 || c.I % c.tp || c.rank < 0 || c.rank >= c.tp || c.H % 64 || c.E < 1 ||
        c.layers < 1 || c.bufs < 2 || c.reps < 1 || c.warmup < 0)
        RW_FAIL(err, RW_E_INVALID_ARG,
                "bench: bad config (H %lld, I %lld, E %lld, tp %d, rank %d, layers %d, bufs %d, "
                "reps %d)",
                (long long)c.H, (long long)c.I, (long long)c.E, c.tp, c.rank, c.layers, c.bufs,
                c.reps);
    if (c.fmt == RW_WFMT_MXFP8 && (c.I / c.tp) % 32)
        RW_FAIL(err, RW_E_UNSUPPORTED, "bench: mxfp8 needs I/T %% 32 == 0");
    rw_status st = RW_OK;
    int64_t S = c.I / c.tp, P = rw_roundup(S, 128);
    int64_t nexp = (int64_t)c.layers * c.E;
    size_t canon = (size_t)(3 * c.I * c.H) * 2 * (size_t)nexp;
    size_t pbytes = (rw_moe_packed_bytes(c.fmt, RW_MOE_W13, P, c.H) +
                     rw_moe_packed_bytes(c.fmt, RW_MOE_W2, P, c.H)) *
                    (size_t)nexp;
    size_t sbytes = (rw_moe_packed_scale_bytes(c.fmt, RW_MOE_W13, P, c.H) +
                     rw_moe_packed_scale_bytes(c.fmt, RW_MOE_W2, P, c.H)) *
                    (size_t)nexp;
    size_t ops_cap =
        (size_t)nexp * 3 *
        (c.fmt == RW_WFMT_FP8_BLOCK
             ? (size_t)((c.I / 128 + 2) * (c.H / 128 + 2) + (c.H / 128 + 1) * (P / 128))
             : 1);
    int B = c.bufs;
    uint16_t **src = (uint16_t **)calloc((size_t)B, sizeof *src);
    uint8_t **pk = (uint8_t **)calloc((size_t)B, sizeof *pk);
    uint8_t **ps = (uint8_t **)calloc((size_t)B, sizeof *ps);
    uint8_t **cp = (uint8_t **)calloc((size_t)B, sizeof *cp);
    void **dtab = (void **)calloc((size_t)B, sizeof *dtab);
    size_t *nops = (size_t *)calloc((size_t)B, sizeof *nops);
    int64_t *units = (int64_t *)calloc((size_t)B, sizeof *units);
    rw_moe_op *ops = (rw_moe_op *)malloc(ops_cap * sizeof *ops + 1);
    int64_t *ub = (int64_t *)malloc((ops_cap + 1) * sizeof *ub);
    double *tp = (double *)malloc(sizeof(double) * (size_t)c.reps);
    double *tc = (double *)malloc(sizeof(double) * (size_t)c.reps);
    cudaStream_t s = NULL;
    cudaEvent_t e0 = NULL, e1 = NULL;
    size_t src_bytes = 0, dst_bytes = 0;
    if (!src || !pk || !ps || !cp || !dtab || !nops || !units || !ops || !ub || !tp || !tc) {
        st = RW_ERR(err, RW_E_OOM, "bench: out of memory");
        goto done;
    }
    RW_CUDA_CHECKGOTO(err, cudaSetDevice(c.device), st, done);
    RW_CUDA_CHECKGOTO(err, cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), st, done);
    RW_CUDA_CHECKGOTO(err, cudaEventCreate(&e0), st, done);
    RW_CUDA_CHECKGOTO(err, cudaEventCreate(&e1), st, done);
    for (int b = 0; b < B; b++) {
        RW_CUDA_CHECKGOTO(err, cudaMalloc((void **)&src[b], canon), st, done);
        RW_CUDA_CHECKGOTO(err, cudaMalloc((void **)&pk[b], pbytes), st, done);
        if (sbytes) RW_CUDA_CHECKGOTO(err, cudaMalloc((void **)&ps[b], sbytes), st, done);
        RW_CHECKGOTO(rwb_fill_bf16(src[b], canon / 2, 1234 + (uint64_t)b, 0.0f, 1.0f, s, err), st,
                     done);
        RW_CUDA_CHECKGOTO(err, cudaMemsetAsync(pk[b], 0, pbytes, s), st, done);
        size_t n = 0;
        build_ops(&c, src[b], pk[b], ps[b], ops, &n, &src_bytes, &dst_bytes);
        int64_t acc = 0;
        for (size_t i = 0; i < n; i++) {
            ub[i] = acc;
            acc += rw_moe_op_units(&ops[i]);
        }
        ub[n] = acc;
        nops[b] = n;
        units[b] = acc;
        size_t tb = n * sizeof *ops + (n + 1) * 8;
        RW_CUDA_CHECKGOTO(err, cudaMalloc(&dtab[b], tb), st, done);
        RW_CUDA_CHECKGOTO(err, cudaMemcpy(dtab[b], ops, n * sizeof *ops, cudaMemcpyHostToDevice),
                          st, done);
        RW_CUDA_CHECKGOTO(err,
                          cudaMemcpy((uint8_t *)dtab[b] + n * sizeof *ops, ub, (n + 1) * 8,
                                     cudaMemcpyHostToDevice),
                          st, done);
        RW_CUDA_CHECKGOTO(err, cudaMalloc((void **)&cp[b], src_bytes), st, done);
    }
    RW_CUDA_CHECKGOTO(err, cudaStreamSynchronize(s), st, done);
    for (int pass = 0; pass < 2; pass++) { /* pass 0: pack, pass 1: copy */
        for (int i = -c.warmup; i < c.reps; i++) {
            int b = ((i % B) + B) % B;
            RW_CUDA_CHECKGOTO(err, cudaEventRecord(e0, s), st, done);
            if (pass == 0) {
                const rw_moe_op *dops = (const rw_moe_op *)dtab[b];
                if (c.fmt == RW_WFMT_FP8_BLOCK)
                    st = rw_moe_fp8q_cuda(dops, nops[b], s, err);
                else
                    st = rw_moe_scatter_cuda(
                        dops, (const int64_t *)((uint8_t *)dtab[b] + nops[b] * sizeof *ops),
                        nops[b], units[b], s, err);
                if (st != RW_OK) goto done;
            } else {
                /* the same number of source bytes, contiguous, device to device */
                RW_CUDA_CHECKGOTO(
                    err, cudaMemcpyAsync(cp[b], src[b], src_bytes, cudaMemcpyDeviceToDevice, s), st,
                    done);
            }
            RW_CUDA_CHECKGOTO(err, cudaEventRecord(e1, s), st, done);
            RW_CUDA_CHECKGOTO(err, cudaEventSynchronize(e1), st, done);
            float ms = 0;
            RW_CUDA_CHECKGOTO(err, cudaEventElapsedTime(&ms, e0, e1), st, done);
            if (i >= 0) (pass ? tc : tp)[i] = ms;
        }
    }
    stats(tp, c.reps, &out->pack_ms_median, &out->pack_ms_min, &out->pack_ms_max);
    stats(tc, c.reps, &out->copy_ms_median, &out->copy_ms_min, &out->copy_ms_max);
    out->bytes_moved = (double)(src_bytes + dst_bytes);
    out->pack_gbps = out->bytes_moved / (out->pack_ms_median * 1e-3) / 1e9;
    out->copy_gbps = 2.0 * (double)src_bytes / (out->copy_ms_median * 1e-3) / 1e9;
    /* time to copy the source bytes / time to pack them: >= 0.7 is the target */
    out->ratio = out->copy_ms_median / out->pack_ms_median;
    out->ops = (int64_t)nops[0];
    out->launches = 1;
done:
    if (s) cudaStreamSynchronize(s);
    for (int b = 0; src && b < B; b++) {
        if (src[b]) cudaFree(src[b]);
        if (pk && pk[b]) cudaFree(pk[b]);
        if (ps && ps[b]) cudaFree(ps[b]);
        if (cp && cp[b]) cudaFree(cp[b]);
        if (dtab && dtab[b]) cudaFree(dtab[b]);
    }
    if (e0) cudaEventDestroy(e0);
    if (e1) cudaEventDestroy(e1);
    if (s) cudaStreamDestroy(s);
    free(src);
    free(pk);
    free(ps);
    free(cp);
    free(dtab);
    free(nops);
    free(units);
    free(ops);
    free(ub);
    free(tp);
    free(tc);
    return st;
}

static void pack_one(rwb_ctx *c, const char *what, rw_wfmt fmt, int tp, const char *target_id) {
    rw_err err = {0};
    pack_cfg bc;
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
    pack_result r;
    memset(&r, 0, sizeof r);
    fprintf(stderr, "rw-bench: pack: %s\n", what);
    if (pack_run(&bc, &r, &err) != RW_OK) {
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
    RW_ERR(&err, RW_E_UNSUPPORTED, "the pack benchmark needs a CUDA build");
    rwb_emit_error(c, "pack", "pack_bf16_tp1", &err);
#endif
}
