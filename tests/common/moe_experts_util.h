/* moe_experts_util.h - for the expert tests (tests/moe test_experts.c, test_experts_gpu.c): random
 * canonical expert weights, one rank's packed padded layer built straight from the index maps of
 * rw_moe.h (bf16, mxfp8, fp8-block), with the canonical tensors replaced by the values the packed
 * bytes stand for, and random routing. */
#ifndef RW_TEST_MOE_EXPERTS_UTIL_H
#define RW_TEST_MOE_EXPERTS_UTIL_H

#include <math.h>

#include "rw_test.h"
#include "rw_moe.h"
#include "rw_quant.h"

/* --- packing helpers (straight from the index maps of rw_moe.h) ---------------------------- */
typedef struct canon {
    int E, I, H;
    float *gate, *up; /* [E, I, H] */
    float *down;      /* [E, H, I] */
} canon;

typedef struct packed_layer {
    rw_layer_weights lw;
    rw_tp_dims d;
    void *w13, *w2, *s13, *s2;
} packed_layer;

static void mxfp8_quant_row(const float *x, int64_t K, uint8_t *q, uint8_t *s) {
    for (int64_t b = 0; b < K / 32; b++) {
        float amax = 0;
        for (int c = 0; c < 32; c++)
            amax = fmaxf(amax, fabsf(x[b * 32 + c]));
        s[b] = rw_mxfp8_scale_from_amax(amax);
        for (int c = 0; c < 32; c++)
            q[b * 32 + c] = rw_mxfp8_quantize_elem(x[b * 32 + c], s[b]);
    }
}

/* Quantizes logical row x [K] into packed row n of an mxfp8 matrix (codes at q + n * K, UE8M0
 * scales at s swizzled with Kt = kt) and writes the values the codes stand for back into x. */
static void mxfp8_pack_row(float *x, int64_t K, int64_t n, int64_t kt, uint8_t *q, uint8_t *s) {
    uint8_t sc[64];
    mxfp8_quant_row(x, K, q + n * K, sc);
    for (int64_t b = 0; b < K / 32; b++) {
        s[rw_moe_scale_swizzle(n, b, kt)] = sc[b];
        for (int i = 0; i < 32; i++)
            x[b * 32 + i] = rw_e4m3_to_f32(q[n * K + b * 32 + i]) * rw_ue8m0_to_f32(sc[b]);
    }
}

/* Builds rank r's logical local matrices (w13 [2P, H] up-first padded, w2 [H, P]) as fp32,
 * quantizes them when fmt is quantized, writes the dequantized values back into the logical
 * matrices (what the reference must use), and packs them. */
static void build_rank(const canon *c, rw_wfmt fmt, int T, int r, packed_layer *pl) {
    const int64_t E = c->E, H = c->H, S = c->I / T, P = rw_roundup(S, 128);
    memset(pl, 0, sizeof *pl);
    pl->d.tp = T;
    pl->d.rank = r;
    pl->d.S = S;
    pl->d.P = P;
    pl->lw.moe_fmt = fmt;
    float *l13 = calloc((size_t)(2 * P * H), sizeof(float));
    float *l2 = calloc((size_t)(H * P), sizeof(float));
    const size_t es = fmt == RW_WFMT_BF16 ? 2 : 1;
    pl->w13 = calloc((size_t)(E * 2 * P * H), es);
    pl->w2 = calloc((size_t)(E * H * P), es);
    const int64_t kt13 = (H / 32 + 3) / 4, kt2 = (P / 32 + 3) / 4;
    const int64_t s13b = rw_roundup(2 * P, 128) * kt13 * 4, s2b = rw_roundup(H, 128) * kt2 * 4;
    if (fmt == RW_WFMT_MXFP8) {
        pl->s13 = calloc((size_t)(E * s13b), 1);
        pl->s2 = calloc((size_t)(E * s2b), 1);
    } else if (fmt == RW_WFMT_FP8_BLOCK) {
        pl->s13 = calloc((size_t)(E * (2 * P / 128) * ((H + 127) / 128)), 4);
        pl->s2 = calloc((size_t)(E * ((H + 127) / 128) * (P / 128)), 4);
    }
    for (int64_t e = 0; e < E; e++) {
        memset(l13, 0, (size_t)(2 * P * H) * 4);
        memset(l2, 0, (size_t)(H * P) * 4);
        for (int64_t j = 0; j < S; j++)
            for (int64_t k = 0; k < H; k++) {
                l13[j * H + k] = c->up[(e * c->I + r * S + j) * H + k];
                l13[(P + j) * H + k] = c->gate[(e * c->I + r * S + j) * H + k];
            }
        for (int64_t h = 0; h < H; h++)
            for (int64_t j = 0; j < S; j++)
                l2[h * P + j] = c->down[(e * H + h) * c->I + r * S + j];
        if (fmt == RW_WFMT_BF16) {
            uint16_t *w13 = (uint16_t *)pl->w13 + e * 2 * P * H,
                     *w2 = (uint16_t *)pl->w2 + e * H * P;
            for (int64_t cr = 0; cr < 2 * P; cr++)
                for (int64_t k = 0; k < H; k++)
                    w13[rw_moe_kblock_offset(rw_moe_w13_row_map(cr, P), k, 2 * P)] =
                        rw_f32_to_bf16(l13[cr * H + k]);
            for (int64_t h = 0; h < H; h++)
                for (int64_t k = 0; k < P; k++)
                    w2[rw_moe_kblock_offset(rw_moe_row_shuffle(h), k, H)] =
                        rw_f32_to_bf16(l2[h * P + k]);
        } else if (fmt == RW_WFMT_MXFP8) {
            uint8_t *w13 = (uint8_t *)pl->w13 + e * 2 * P * H, *w2 = (uint8_t *)pl->w2 + e * H * P;
            uint8_t *s13 = (uint8_t *)pl->s13 + e * s13b, *s2 = (uint8_t *)pl->s2 + e * s2b;
            for (int64_t cr = 0; cr < 2 * P; cr++)
                mxfp8_pack_row(l13 + cr * H, H, rw_moe_w13_row_map(cr, P), kt13, w13, s13);
            for (int64_t h = 0; h < H; h++)
                mxfp8_pack_row(l2 + h * P, P, rw_moe_row_shuffle(h), kt2, w2, s2);
        } else {
            float *mats[2] = {l13, l2};
            const int64_t rows[2] = {2 * P, H}, cols[2] = {H, P};
            uint8_t *qs[2] = {(uint8_t *)pl->w13 + e * 2 * P * H, (uint8_t *)pl->w2 + e * H * P};
            const int64_t nsc[2] = {(2 * P / 128) * ((H + 127) / 128),
                                    ((H + 127) / 128) * (P / 128)};
            float *scs[2] = {(float *)pl->s13 + e * nsc[0], (float *)pl->s2 + e * nsc[1]};
            for (int m = 0; m < 2; m++) {
                const int64_t cb = (cols[m] + 127) / 128;
                for (int64_t rb = 0; rb < (rows[m] + 127) / 128; rb++)
                    for (int64_t kb = 0; kb < cb; kb++) {
                        float amax = 0;
                        for (int64_t i = rb * 128; i < rows[m] && i < rb * 128 + 128; i++)
                            for (int64_t j = kb * 128; j < cols[m] && j < kb * 128 + 128; j++)
                                amax = fmaxf(amax, fabsf(mats[m][i * cols[m] + j]));
                        const float s = rw_fp8_block_scale_from_amax(amax);
                        scs[m][rb * cb + kb] = s;
                        for (int64_t i = rb * 128; i < rows[m] && i < rb * 128 + 128; i++)
                            for (int64_t j = kb * 128; j < cols[m] && j < kb * 128 + 128; j++) {
                                uint8_t q = rw_fp8_block_quantize_elem(mats[m][i * cols[m] + j], s);
                                qs[m][i * cols[m] + j] = q;
                                mats[m][i * cols[m] + j] = rw_e4m3_to_f32(q) * s;
                            }
                    }
            }
        }
        /* write the values the packed bytes stand for back into the canonical tensors, so the
         * reference computes on exactly what the rank holds */
        for (int64_t j = 0; j < S; j++)
            for (int64_t k = 0; k < H; k++) {
                float u = l13[j * H + k], g = l13[(P + j) * H + k];
                if (fmt == RW_WFMT_BF16) {
                    u = rw_bf16_to_f32(rw_f32_to_bf16(u));
                    g = rw_bf16_to_f32(rw_f32_to_bf16(g));
                }
                c->up[(e * c->I + r * S + j) * H + k] = u;
                c->gate[(e * c->I + r * S + j) * H + k] = g;
            }
        for (int64_t h = 0; h < H; h++)
            for (int64_t j = 0; j < S; j++) {
                float v = l2[h * P + j];
                if (fmt == RW_WFMT_BF16) v = rw_bf16_to_f32(rw_f32_to_bf16(v));
                c->down[(e * H + h) * c->I + r * S + j] = v;
            }
    }
    const rw_dtype wdt = fmt == RW_WFMT_BF16 ? RW_DTYPE_BF16 : RW_DTYPE_E4M3;
    if (fmt == RW_WFMT_BF16) {
        int64_t s13[4] = {E, H / 64, 2 * P, 64}, s2[4] = {E, P / 64, H, 64};
        pl->lw.w13 = rw_tensor_view(pl->w13, wdt, 4, s13, RW_PLACE_HOST, 0);
        pl->lw.w2 = rw_tensor_view(pl->w2, wdt, 4, s2, RW_PLACE_HOST, 0);
    } else {
        int64_t s13[3] = {E, 2 * P, H}, s2[3] = {E, H, P};
        pl->lw.w13 = rw_tensor_view(pl->w13, wdt, 3, s13, RW_PLACE_HOST, 0);
        pl->lw.w2 = rw_tensor_view(pl->w2, wdt, 3, s2, RW_PLACE_HOST, 0);
        if (fmt == RW_WFMT_MXFP8) {
            int64_t a[2] = {E, s13b}, b[2] = {E, s2b};
            pl->lw.w13_scale = rw_tensor_view(pl->s13, RW_DTYPE_UE8M0, 2, a, RW_PLACE_HOST, 0);
            pl->lw.w2_scale = rw_tensor_view(pl->s2, RW_DTYPE_UE8M0, 2, b, RW_PLACE_HOST, 0);
        } else {
            int64_t a[3] = {E, 2 * P / 128, (H + 127) / 128}, b[3] = {E, (H + 127) / 128, P / 128};
            pl->lw.w13_scale = rw_tensor_view(pl->s13, RW_DTYPE_F32, 3, a, RW_PLACE_HOST, 0);
            pl->lw.w2_scale = rw_tensor_view(pl->s2, RW_DTYPE_F32, 3, b, RW_PLACE_HOST, 0);
        }
    }
    free(l13);
    free(l2);
}

static void free_rank(packed_layer *pl) {
    free(pl->w13);
    free(pl->w2);
    free(pl->s13);
    free(pl->s2);
}

static void canon_random(canon *c, int E, int I, int H, uint64_t seed) {
    c->E = E;
    c->I = I;
    c->H = H;
    const size_t n = (size_t)E * I * H;
    c->gate = malloc(n * 4);
    c->up = malloc(n * 4);
    c->down = malloc(n * 4);
    rw_rng r;
    rw_rng_seed(&r, seed);
    for (size_t i = 0; i < n; i++)
        c->gate[i] = 0.08f * rw_rng_normal(&r);
    for (size_t i = 0; i < n; i++)
        c->up[i] = 0.08f * rw_rng_normal(&r);
    for (size_t i = 0; i < n; i++)
        c->down[i] = 0.08f * rw_rng_normal(&r);
}

/* Random routing of ntok tokens: standard normal logits [ntok, E] from `rng`, then
 * rw_moe_route_ref (renormalized top-k) -> ids, w [ntok, k]. */
static void route_random(rw_rng *rng, int64_t ntok, int E, int k, float *logits, int32_t *ids,
                         float *w) {
    for (int64_t i = 0; i < ntok * E; i++)
        logits[i] = rw_rng_normal(rng);
    rw_moe_route_ref(logits, ntok, E, k, true, ids, w);
}

static void canon_free(canon *c) {
    free(c->gate);
    free(c->up);
    free(c->down);
}

#endif
