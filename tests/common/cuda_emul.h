/* cuda_emul.h - the CUDA backend's forward pass emulated on the CPU, for the tests of its error
 * budget (tests/worker/test_cuda_numerics.c, cpu suite) and of the GPU against what its rounding
 * points imply (tests/worker/test_cuda_vs_transformers_gpu.c). Test-only: it is built into those
 * tests, not into the worker library. Uses the kernels' plain-C references (worker/kernels/) and
 * moe's routing and expert layout. */
#ifndef RW_TEST_CUDA_EMUL_H
#define RW_TEST_CUDA_EMUL_H

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h" /* rw_rope_inv_freq */
#include "kernels/norm_rope.h"
#include "kernels/router.h"
#include "rw_moe.h"

/* The composition of the CUDA backend (worker/cuda_forward.c: run_model) computed on the host
 * from a host weight set, with each of its rounding points switchable, so the error budget of those
 * rounding points can be measured against the transformers fp32 reference without a GPU, and the
 * GPU can be checked against what its rounding points imply. Exact GEMMs (double accumulation,
 * or fp32 in index order with RW_EMUL_F32_ACCUM), fp32 everything else, as the kernels do. */
enum {
    RW_EMUL_ROUND_QKV_IN = 1u << 0, /* input-normed hidden states into the q/k/v GEMM */
    RW_EMUL_ROUND_Q = 1u << 1,      /* q after its norm and RoPE */
    RW_EMUL_ROUND_K = 1u << 2,      /* K cache (bf16) */
    RW_EMUL_ROUND_V = 1u << 3,      /* V cache (bf16) */
    RW_EMUL_ROUND_ATT = 1u << 4,    /* attention output, the o_proj input */
    RW_EMUL_ROUND_MOE_IN = 1u << 5, /* post-normed hidden states into the experts */
    RW_EMUL_ROUND_ACT = 1u << 6,    /* silu(gate) * up, the down-projection input */
    RW_EMUL_ROUND_LM_IN = 1u << 7,  /* final-normed rows into the lm_head */
    RW_EMUL_ROUND_ALL = (1u << 8) - 1,
    RW_EMUL_F32_ACCUM = 1u << 8, /* GEMMs accumulate in fp32 in index order (not double) */
    /* the dense GEMM inputs among the rounding points on (q/k/v, o_proj and lm_head inputs) are
     * hi + lo bf16 pairs (x ~ hi + lo, about 16 significant bits) instead of one bf16 */
    RW_EMUL_SPLIT = 1u << 9,
    /* the expert inputs (expert input, silu(g)*u) are hi + lo pairs too */
    RW_EMUL_SPLIT_MOE = 1u << 10,
    /* with RW_EMUL_SPLIT: the q/k/v GEMM input alone is one bf16 (what dropping its pair costs) */
    RW_EMUL_ONE_QKV = 1u << 11,
    /* the softmax weights enter P.V as one bf16 each (without it: fp32 weights, what a hi + lo
     * pair gives); the sum they are divided by stays fp32 */
    RW_EMUL_ROUND_P = 1u << 12,
    /* with RW_EMUL_SPLIT_MOE: silu(g)*u, the down-projection input, alone is one bf16 */
    RW_EMUL_ONE_ACT = 1u << 13,
    /* with RW_EMUL_SPLIT: the attention output, the o_proj input, alone is one bf16 (what
     * dropping its pair costs) */
    RW_EMUL_ONE_ATT = 1u << 14,
    /* with RW_EMUL_SPLIT: the final-normed rows, the lm_head input, alone are one bf16 */
    RW_EMUL_ONE_LM = 1u << 15,
    /* the K (V) cache entries are hi + lo bf16 pairs (what a pair KV cache would give) */
    RW_EMUL_SPLIT_K = 1u << 16,
    RW_EMUL_SPLIT_V = 1u << 17,
    RW_EMUL_SPLIT_KV = RW_EMUL_SPLIT_K | RW_EMUL_SPLIT_V,
    /* the attention's operands in fp16 instead of bf16 (11 significant bits instead of 8, range
     * to 65504): F16_KVP the K and V cache entries and the softmax weights (where their rounding
     * points are on), F16_Q q as one fp16 (instead of fp32, the backend's hi + lo pair) where
     * the kernel would round it: q' = q log2(e) / sqrt(hd), the scores then in the log2 domain
     * (exp2). (Rounding q before its scale is another rounding point: on the tiny fixture it
     * kept the closest router tie that q' flips, as the GPU did.) What an fp16 attention would
     * give: an fp16 MMA multiplies fp16 by fp16, so K, V and P move with q; the cache keeps its
     * bytes. */
    RW_EMUL_F16_KVP = 1u << 18,
    RW_EMUL_F16_Q = 1u << 19,
    /* what the CUDA backend does: q fp32, K and V cache bf16, the softmax weights one bf16 each
     * in P.V, every GEMM input a hi + lo pair but the down projection's and the lm_head's
     * (silu(g)*u and the final-normed rows one bf16; docs/BENCHMARKS.md has the per-GEMM choice
     * and what dropping a pair would cost). The kernel rounds each weight relative to its key
     * block's running maximum, the emulation relative to the row's maximum: the same rounding
     * point, not the same bits. */
    RW_EMUL_CUDA = (RW_EMUL_ROUND_ALL & ~RW_EMUL_ROUND_Q) | RW_EMUL_SPLIT | RW_EMUL_SPLIT_MOE |
                   RW_EMUL_ONE_ACT | RW_EMUL_ONE_LM | RW_EMUL_ROUND_P,
    /* what the CUDA backend does in the high-precision mode (RW_PRECISION_HIGH): the K and V
     * cache entries, the softmax weights and silu(g)*u are hi + lo pairs too */
    RW_EMUL_CUDA_HIGH =
        (RW_EMUL_CUDA & ~(RW_EMUL_ROUND_P | RW_EMUL_ONE_ACT)) | RW_EMUL_SPLIT_K | RW_EMUL_SPLIT_V,
};
/* x rounded to the nearest fp16 value (ties to even, subnormals kept, inf past 65504: core's
 * conversion, checked in tests/core/test_dtype.c). */
static inline float emul_f16(float x) {
    return rw_f16_to_f32(rw_f32_to_f16(x));
}
static inline float emul_round(float x, unsigned flags, unsigned bit) {
    if (!(flags & bit)) return x;
    if ((flags & RW_EMUL_F16_KVP) && (bit & (RW_EMUL_ROUND_K | RW_EMUL_ROUND_V | RW_EMUL_ROUND_P)))
        return emul_f16(x);
    const uint16_t h = rw_f32_to_bf16(x);
    const float hi = rw_bf16_to_f32(h);
    const unsigned dense = RW_EMUL_ROUND_QKV_IN | RW_EMUL_ROUND_ATT | RW_EMUL_ROUND_LM_IN;
    const unsigned moe =
        (flags & RW_EMUL_ONE_ACT) ? RW_EMUL_ROUND_MOE_IN : RW_EMUL_ROUND_MOE_IN | RW_EMUL_ROUND_ACT;
    const unsigned split = dense & ~((flags & RW_EMUL_ONE_QKV) ? RW_EMUL_ROUND_QKV_IN : 0u) &
                           ~((flags & RW_EMUL_ONE_ATT) ? RW_EMUL_ROUND_ATT : 0u) &
                           ~((flags & RW_EMUL_ONE_LM) ? RW_EMUL_ROUND_LM_IN : 0u);
    const unsigned kv = ((flags & RW_EMUL_SPLIT_K) ? RW_EMUL_ROUND_K : 0u) |
                        ((flags & RW_EMUL_SPLIT_V) ? RW_EMUL_ROUND_V : 0u);
    if (((flags & RW_EMUL_SPLIT) && (bit & split)) ||
        ((flags & RW_EMUL_SPLIT_MOE) && (bit & moe)) || (bit & kv))
        return hi + rw_bf16_to_f32(rw_bf16_split_lo(x, h));
    return hi;
}

/* y [n, N] (row stride ldy) = x [n, K] . w [N, K]^T with bf16 weights. */
static void emul_gemm(const float *x, const uint16_t *w, int64_t n, int64_t N, int64_t K, float *y,
                      int64_t ldy, unsigned flags) {
    for (int64_t t = 0; t < n; t++)
        for (int64_t o = 0; o < N; o++) {
            const float *xt = x + t * K;
            const uint16_t *wr = w + o * K;
            if (flags & RW_EMUL_F32_ACCUM) {
                float s = 0.0f;
                for (int64_t k = 0; k < K; k++)
                    s += xt[k] * rw_bf16_to_f32(wr[k]);
                y[t * ldy + o] = s;
            } else {
                double s = 0.0;
                for (int64_t k = 0; k < K; k++)
                    s += (double)xt[k] * rw_bf16_to_f32(wr[k]);
                y[t * ldy + o] = (float)s;
            }
        }
}

/* out [H] = w * (x * rsqrt(mean(x^2) + eps)), rounded per `bit`; the fp32 value into out32. */
static void emul_norm(const float *x, const uint16_t *w, int64_t H, float eps, unsigned flags,
                      unsigned bit, float *out, float *out32) {
    const float r = rw_k_rms_scale_ref(x, H, eps);
    for (int64_t i = 0; i < H; i++) {
        const float v = rw_bf16_to_f32(w[i]) * (x[i] * r);
        out[i] = emul_round(v, flags, bit);
        if (out32) out32[i] = v;
    }
}

/* Teacher-forced logits [n, V] of tokens [n] (positions 0..n-1) for a TP1 host weight set whose
 * layers are all bf16. route_ids [L, n, top_k] and router_logits [L, n, E] (both may be NULL)
 * receive every layer's routing. RW_E_UNSUPPORTED for device, TP > 1 or quantized sets. */
static rw_status rw_cuda_emul_score(const rw_wset *ws, const int32_t *tokens, int n, unsigned flags,
                                    float *logits, int32_t *route_ids, float *router_logits,
                                    rw_err *err) {
    const rw_config *c = rw_wset_config(ws);
    const rw_tp_dims *d = rw_wset_dims(ws);
    if (!tokens || !logits || n <= 0) RW_FAIL(err, RW_E_INVALID_ARG, "emulation: no tokens");
    if (d->tp != 1) RW_FAIL(err, RW_E_UNSUPPORTED, "emulation: TP %d (TP1 only)", d->tp);
    if (c->head_dim > 1024) RW_FAIL(err, RW_E_UNSUPPORTED, "emulation: head_dim %d", c->head_dim);
    const rw_tensor emb = rw_wset_embed(ws), lm = rw_wset_lm_head(ws), fnw = rw_wset_final_norm(ws);
    if (emb.place != RW_PLACE_HOST)
        RW_FAIL(err, RW_E_UNSUPPORTED, "emulation: the weight set is not on the host");
    for (int l = 0; l < c->num_layers; l++) {
        const rw_layer_weights *lw = rw_wset_layer(ws, l);
        if (lw->attn_fmt != RW_WFMT_BF16 || lw->moe_fmt != RW_WFMT_BF16)
            RW_FAIL(err, RW_E_UNSUPPORTED, "emulation: layer %d is quantized (bf16 only)", l);
    }
    const int64_t H = c->hidden_size, hd = c->head_dim, E = c->num_experts, P = d->P;
    const int64_t V = c->vocab_size, nh = d->nh_local, nkv = d->nkv_local;
    const int K = c->top_k, group = (int)(nh / nkv);
    const int64_t qd = nh * hd, kd = nkv * hd;
    const float eps = (float)c->rms_eps, scale = 1.0f / sqrtf((float)hd);
    /* F16_Q: the kernel's q' scale (log2(e) / sqrt(hd), rounded to fp32 as its launcher does) */
    const float qscale_log2 = (float)(1.4426950408889634 / sqrt((double)hd));
    /* q's factor in the scores: the scale, or (F16_Q, q' already scaled) 1, which leaves each
     * product exact as it is */
    const float qmul = (flags & RW_EMUL_F16_Q) ? 1.0f : scale;
    const size_t fl = sizeof(float);
    float *x = calloc((size_t)(n * H), fl), *y = calloc((size_t)(n * H), fl);
    float *h = calloc((size_t)(n * H), fl), *h32 = calloc((size_t)(n * H), fl);
    float *q = calloc((size_t)(n * qd), fl), *k = calloc((size_t)(n * kd), fl);
    float *v = calloc((size_t)(n * kd), fl), *att = calloc((size_t)(n * qd), fl);
    float *rl = calloc((size_t)(n * E), fl), *wts = calloc((size_t)(n * K), fl);
    float *sc = calloc((size_t)n, fl), *pw = calloc((size_t)n, fl);
    float *gu = calloc((size_t)(2 * P), fl);
    float *act = calloc((size_t)P, fl), *ye = calloc((size_t)(K * H), fl);
    float *inv = calloc((size_t)(hd / 2), fl);
    int32_t *ids = calloc((size_t)(n * K), sizeof(int32_t));
    rw_status st = RW_OK;
    if (!x || !y || !h || !h32 || !q || !k || !v || !att || !rl || !wts || !sc || !pw || !gu ||
        !act || !ye || !inv || !ids) {
        st = RW_ERR(err, RW_E_OOM, "emulation: scratch for %d tokens", n);
        goto done;
    }
    rw_rope_inv_freq(c, inv); /* the frequencies both backends use */
    for (int t = 0; t < n; t++) {
        if (tokens[t] < 0 || tokens[t] >= V) {
            st = RW_ERR(err, RW_E_RANGE, "emulation: token %d", tokens[t]);
            goto done;
        }
        for (int64_t i = 0; i < H; i++)
            x[t * H + i] = rw_bf16_to_f32(((const uint16_t *)emb.data)[tokens[t] * H + i]);
    }
    for (int l = 0; l < c->num_layers; l++) {
        const rw_layer_weights *lw = rw_wset_layer(ws, l);
        /* attention block: x += y (the previous layer's experts) inside the input norm */
        for (int64_t t = 0; t < n; t++) {
            if (l)
                for (int64_t i = 0; i < H; i++)
                    x[t * H + i] += y[t * H + i];
            emul_norm(x + t * H, lw->input_norm.data, H, eps, flags, RW_EMUL_ROUND_QKV_IN,
                      h + t * H, NULL);
        }
        emul_gemm(h, lw->q.data, n, qd, H, q, qd, flags);
        emul_gemm(h, lw->k.data, n, kd, H, k, kd, flags);
        emul_gemm(h, lw->v.data, n, kd, H, v, kd, flags);
        float tmp[1024];
        for (int t = 0; t < n; t++) {
            for (int64_t hh = 0; hh < nh; hh++) {
                rw_k_head_norm_rope_ref(q + t * qd + hh * hd, lw->q_norm.data, (int)hd, eps, t, inv,
                                        tmp);
                for (int64_t i = 0; i < hd; i++)
                    q[t * qd + hh * hd + i] = (flags & RW_EMUL_F16_Q)
                                                  ? emul_f16(tmp[i] * qscale_log2)
                                                  : emul_round(tmp[i], flags, RW_EMUL_ROUND_Q);
            }
            for (int64_t g = 0; g < nkv; g++) {
                rw_k_head_norm_rope_ref(k + t * kd + g * hd, lw->k_norm.data, (int)hd, eps, t, inv,
                                        tmp);
                for (int64_t i = 0; i < hd; i++) {
                    k[t * kd + g * hd + i] = emul_round(tmp[i], flags, RW_EMUL_ROUND_K);
                    v[t * kd + g * hd + i] =
                        emul_round(v[t * kd + g * hd + i], flags, RW_EMUL_ROUND_V);
                }
            }
        }
        /* causal attention, fp32 softmax */
        for (int t = 0; t < n; t++)
            for (int64_t hh = 0; hh < nh; hh++) {
                const int64_t g = hh / group;
                const float *qh = q + t * qd + hh * hd;
                float mx = -INFINITY, ls = 0.0f;
                for (int j = 0; j <= t; j++) {
                    float s = 0.0f;
                    for (int64_t e = 0; e < hd; e++)
                        s += qh[e] * qmul * k[j * kd + g * hd + e];
                    sc[j] = s;
                    mx = s > mx ? s : mx;
                }
                for (int j = 0; j <= t; j++) {
                    sc[j] = (flags & RW_EMUL_F16_Q) ? exp2f(sc[j] - mx) : expf(sc[j] - mx);
                    ls += sc[j];
                }
                if (flags & RW_EMUL_ROUND_P)
                    for (int j = 0; j <= t; j++)
                        pw[j] = emul_round(sc[j], flags, RW_EMUL_ROUND_P);
                const float *pj = (flags & RW_EMUL_ROUND_P) ? pw : sc;
                for (int64_t e = 0; e < hd; e++) {
                    float o = 0.0f;
                    for (int j = 0; j <= t; j++)
                        o += pj[j] * v[j * kd + g * hd + e];
                    att[t * qd + hh * hd + e] = emul_round(o / ls, flags, RW_EMUL_ROUND_ATT);
                }
            }
        emul_gemm(att, lw->o.data, n, H, qd, y, H, flags);
        /* MoE block: x += o_proj output inside the post norm; fp32 router on the fp32 norm */
        for (int64_t t = 0; t < n; t++) {
            for (int64_t i = 0; i < H; i++)
                x[t * H + i] += y[t * H + i];
            emul_norm(x + t * H, lw->post_norm.data, H, eps, flags, RW_EMUL_ROUND_MOE_IN, h + t * H,
                      h32 + t * H);
        }
        rw_k_router_ref(h32, lw->router.data, n, E, H, rl);
        rw_moe_route_ref(rl, n, (int)E, K, c->norm_topk_prob, ids, wts);
        if (route_ids)
            memcpy(route_ids + (size_t)l * n * K, ids, sizeof(int32_t) * (size_t)(n * K));
        if (router_logits) memcpy(router_logits + (size_t)l * n * E, rl, fl * (size_t)(n * E));
        const int64_t e13 = 2 * P * H, e2 = H * P; /* elements per expert */
        for (int64_t t = 0; t < n; t++) {
            const float *xt = h + t * H;
            for (int j = 0; j < K; j++) {
                const int64_t e = ids[t * K + j];
                const uint16_t *w13 = (const uint16_t *)lw->w13.data + e * e13;
                const uint16_t *w2 = (const uint16_t *)lw->w2.data + e * e2;
                for (int64_t cr = 0; cr < 2 * P; cr++) { /* canonical rows: up [0, P), gate */
                    const int64_t pr = rw_moe_w13_row_map(cr, P);
                    double s = 0.0;
                    float sf = 0.0f;
                    for (int64_t kk = 0; kk < H; kk++) {
                        const float w = rw_bf16_to_f32(w13[rw_moe_kblock_offset(pr, kk, 2 * P)]);
                        s += (double)xt[kk] * w;
                        sf += xt[kk] * w;
                    }
                    gu[cr] = (flags & RW_EMUL_F32_ACCUM) ? sf : (float)s;
                }
                for (int64_t i = 0; i < P; i++) {
                    const float u = gu[i], g = gu[P + i];
                    act[i] = emul_round(g / (1.0f + expf(-g)) * u, flags, RW_EMUL_ROUND_ACT);
                }
                for (int64_t hh = 0; hh < H; hh++) {
                    const int64_t pr = rw_moe_row_shuffle(hh);
                    double s = 0.0;
                    float sf = 0.0f;
                    for (int64_t i = 0; i < P; i++) {
                        const float w = rw_bf16_to_f32(w2[rw_moe_kblock_offset(pr, i, H)]);
                        s += (double)act[i] * w;
                        sf += act[i] * w;
                    }
                    ye[j * H + hh] = (flags & RW_EMUL_F32_ACCUM) ? sf : (float)s;
                }
            }
            /* combine in slot order, as the kernel does */
            for (int64_t hh = 0; hh < H; hh++) {
                float s = 0.0f;
                for (int j = 0; j < K; j++)
                    s += wts[t * K + j] * ye[j * H + hh];
                y[t * H + hh] = s;
            }
        }
    }
    for (int64_t t = 0; t < n; t++) {
        for (int64_t i = 0; i < H; i++)
            x[t * H + i] += y[t * H + i];
        emul_norm(x + t * H, fnw.data, H, eps, flags, RW_EMUL_ROUND_LM_IN, h + t * H, NULL);
    }
    emul_gemm(h, lm.data, n, V, H, logits, V, flags);
done:
    free(x);
    free(y);
    free(h);
    free(h32);
    free(q);
    free(k);
    free(v);
    free(att);
    free(rl);
    free(wts);
    free(sc);
    free(pw);
    free(gu);
    free(act);
    free(ye);
    free(inv);
    free(ids);
    return st;
}

#endif
