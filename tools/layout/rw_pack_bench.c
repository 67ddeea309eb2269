/* rw_pack_bench.c - rw-pack-bench: benchmark S3 of spec/targets.md. Packs the experts of
 * Qwen3-30B-A3B-shaped layers (canonical bf16 slices -> padded packed layout, quantizing for
 * mxfp8 / fp8-block) and copies the same source bytes device to device, in one run; prints one
 * JSON line per measurement.
 *
 *   rw-pack-bench [--fmt bf16|mxfp8|fp8-block|all] [--tp T|all] [--rank R] [--layers N]
 *                 [--bufs N] [--reps N] [--warmup N] [--H H] [--I I] [--E E] [--device D]
 */
#include "rw_moe.h"

#include <stdio.h>
#include <stdlib.h>

static void usage(FILE *f) {
    fprintf(f,
            "usage: rw-pack-bench [--fmt bf16|mxfp8|fp8-block|all] [--tp T|all] [--rank R]\n"
            "                     [--layers N] [--bufs N] [--reps N] [--warmup N]\n"
            "                     [--H H] [--I I] [--E E] [--device D]\n"
            "Defaults: Qwen3-30B-A3B experts (H 2048, I 768, E 128), fmt all, tp all (1 2 4 8),\n"
            "rank 0, 1 layer, 3 rotating buffer sets, 50 reps after 5 warm-up reps.\n");
}

static bool parse_i64(const char *s, int64_t *out) {
    char *end;
    long long v = strtoll(s, &end, 10);
    if (!*s || *end || v < 0) return false;
    *out = v;
    return true;
}

int main(int argc, char **argv) {
    rw_moe_bench_cfg c = {.H = 2048,
                          .I = 768,
                          .E = 128,
                          .tp = 1,
                          .rank = 0,
                          .fmt = RW_WFMT_BF16,
                          .layers = 1,
                          .bufs = 3,
                          .warmup = 5,
                          .reps = 50,
                          .device = 0};
    const char *fmt = "all", *tps = "all";
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        }
        if (i + 1 >= argc) {
            fprintf(stderr, "rw-pack-bench: %s needs a value\n", a);
            return 2;
        }
        const char *v = argv[++i];
        int64_t x = 0;
        if (!strcmp(a, "--fmt")) {
            fmt = v;
            continue;
        }
        if (!strcmp(a, "--tp")) {
            tps = v;
            continue;
        }
        if (!parse_i64(v, &x)) {
            fprintf(stderr, "rw-pack-bench: %s '%s' is not a non-negative integer\n", a, v);
            return 2;
        }
        if (!strcmp(a, "--rank"))
            c.rank = (int)x;
        else if (!strcmp(a, "--layers"))
            c.layers = (int)x;
        else if (!strcmp(a, "--bufs"))
            c.bufs = (int)x;
        else if (!strcmp(a, "--reps"))
            c.reps = (int)x;
        else if (!strcmp(a, "--warmup"))
            c.warmup = (int)x;
        else if (!strcmp(a, "--H"))
            c.H = x;
        else if (!strcmp(a, "--I"))
            c.I = x;
        else if (!strcmp(a, "--E"))
            c.E = x;
        else if (!strcmp(a, "--device"))
            c.device = (int)x;
        else {
            fprintf(stderr, "rw-pack-bench: unknown option %s\n", a);
            usage(stderr);
            return 2;
        }
    }
    const rw_wfmt all_f[] = {RW_WFMT_BF16, RW_WFMT_MXFP8, RW_WFMT_FP8_BLOCK};
    const int all_t[] = {1, 2, 4, 8};
    rw_wfmt fl[3];
    int nf = 0, tl[4], nt = 0;
    for (int i = 0; i < 3; i++)
        if (!strcmp(fmt, "all") || !strcmp(fmt, rw_wfmt_str(all_f[i]))) fl[nf++] = all_f[i];
    if (!strcmp(tps, "all")) {
        for (int i = 0; i < 4; i++)
            tl[nt++] = all_t[i];
    } else {
        int64_t t;
        if (!parse_i64(tps, &t) || t < 1) {
            fprintf(stderr, "rw-pack-bench: --tp '%s' is not a TP degree\n", tps);
            return 2;
        }
        tl[nt++] = (int)t;
    }
    if (!nf) {
        fprintf(stderr, "rw-pack-bench: unknown --fmt '%s'\n", fmt);
        return 2;
    }
    int rc = 0;
    for (int fi = 0; fi < nf; fi++)
        for (int ti = 0; ti < nt; ti++) {
            c.fmt = fl[fi];
            c.tp = tl[ti];
            if (c.rank >= c.tp) continue;
            rw_moe_bench_result r;
            rw_err err = {0};
            rw_status st = rw_moe_bench_pack(&c, &r, &err);
            if (st != RW_OK) {
                fprintf(stderr, "rw-pack-bench: %s tp %d: %s\n", rw_wfmt_str(c.fmt), c.tp, err.msg);
                rc = 1;
                continue;
            }
            printf("{\"bench\": \"S3\", \"fmt\": \"%s\", \"tp\": %d, \"rank\": %d, \"H\": %lld, "
                   "\"I\": %lld, \"E\": %lld, \"layers\": %d, \"bufs\": %d, \"reps\": %d, "
                   "\"bytes_moved\": %.0f, \"pack_ms_median\": %.4f, \"pack_ms_min\": %.4f, "
                   "\"pack_ms_max\": %.4f, \"copy_ms_median\": %.4f, \"copy_ms_min\": %.4f, "
                   "\"copy_ms_max\": %.4f, \"pack_gbps\": %.1f, \"copy_gbps\": %.1f, "
                   "\"ratio\": %.3f, \"ops\": %lld, \"launches\": %lld}\n",
                   rw_wfmt_str(c.fmt), c.tp, c.rank, (long long)c.H, (long long)c.I, (long long)c.E,
                   c.layers, c.bufs, c.reps, r.bytes_moved, r.pack_ms_median, r.pack_ms_min,
                   r.pack_ms_max, r.copy_ms_median, r.copy_ms_min, r.copy_ms_max, r.pack_gbps,
                   r.copy_gbps, r.ratio, (long long)r.ops, (long long)r.launches);
            fflush(stdout);
        }
    return rc;
}
