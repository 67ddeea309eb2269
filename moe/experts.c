/* experts.c - MoE expert computation on the packed padded layout (CPU reference, fp32 math):
 * out[t] += sum_j w[t,j] * down_e(silu(gate_e x_t) * up_e x_t), for e = ids[t,j], reading the
 * rank's padded shard of each expert straight from its packed bytes through the index maps of
 * rw_moe.h (docs/LAYOUT.md section 3). Quantized layers (mxfp8, fp8-block) are dequantized row
 * by row on the fly. Every (token, row) dot product is a fixed sequence of fp32 operations that
 * does not depend on which other tokens are in the batch (rw_dot_f32, core's one CPU reduction
 * order), so results are batch invariant. */
#include <math.h>
#include <stdlib.h>

#include "rw_moe.h"

/* Rows dequantized together: one block of RB packed rows is read as RB*128 contiguous bytes per
 * 64-column block in the bf16 layout, and reused by every token routed to the expert. */
#define RB 16
/* Tokens handled per pass (bounds the scratch memory). */
#define TB 64

/* One expert matrix as stored: which format, the expert's packed bytes and scales, and its
 * logical size M x K (M = 2P rows for w13, H for w2; K = H for w13, P for w2). */
typedef struct emat {
    rw_wfmt fmt;
    const void *data;  /* this expert's packed weights */
    const void *scale; /* this expert's packed scales (quantized formats) */
    int64_t M, K;
    int64_t scale_cols; /* fp8-block: column blocks per row block */
} emat;

/* Dequantizes packed rows [n0, n0 + nr) into buf [nr, K] fp32, in packed row order. */
static void emat_rows(const emat *m, int64_t n0, int nr, float *buf) {
    const int64_t M = m->M, K = m->K;
    if (m->fmt == RW_WFMT_BF16) {
        /* [K/64, M, 64]: rows n0.. of block kb are nr*64 contiguous elements */
        const uint16_t *w = m->data;
        for (int64_t kb = 0; kb < K / 64; kb++) {
            const uint16_t *src = w + (kb * M + n0) * 64;
            for (int r = 0; r < nr; r++)
                for (int c = 0; c < 64; c++)
                    buf[r * K + kb * 64 + c] = rw_bf16_to_f32(src[r * 64 + c]);
        }
    } else if (m->fmt == RW_WFMT_MXFP8) {
        /* e4m3 [M, K] (rows already mapped), UE8M0 scales swizzled 128x4 with Kt = ceil(K/32/4) */
        const uint8_t *q = m->data, *sc = m->scale;
        const int64_t kt = (K / 32 + 3) / 4;
        for (int r = 0; r < nr; r++) {
            const int64_t n = n0 + r;
            for (int64_t kb = 0; kb < K / 32; kb++) {
                const float s = rw_ue8m0_to_f32(sc[rw_moe_scale_swizzle(n, kb, kt)]);
                const uint8_t *src = q + n * K + kb * 32;
                for (int c = 0; c < 32; c++)
                    buf[r * K + kb * 32 + c] = rw_e4m3_to_f32(src[c]) * s;
            }
        }
    } else {
        /* fp8-block: e4m3 [M, K] plain, fp32 scale per 128x128 block [M/128, ceil(K/128)] */
        const uint8_t *q = m->data;
        const float *sc = m->scale;
        for (int r = 0; r < nr; r++) {
            const int64_t n = n0 + r;
            for (int64_t kb = 0; kb < (K + 127) / 128; kb++) {
                const float s = sc[(n / 128) * m->scale_cols + kb];
                const int64_t c1 = (kb + 1) * 128 < K ? (kb + 1) * 128 : K;
                for (int64_t c = kb * 128; c < c1; c++)
                    buf[r * K + c] = rw_e4m3_to_f32(q[n * K + c]) * s;
            }
        }
    }
}

/* Packed row -> canonical local row. bf16 and mxfp8 layers apply the row maps (w13: interleave
 * then 32-row shuffle; w2: shuffle only); fp8-block layers are stored unpermuted. The shuffle's
 * inverse is src(d) = 4*(d%8) + d/8 within each 32-row block. */
static int64_t canon_row(rw_wfmt fmt, rw_moe_mat mat, int64_t n, int64_t P) {
    if (fmt == RW_WFMT_FP8_BLOCK) return n;
    const int64_t i = 32 * (n / 32) + 4 * (n % 8) + (n % 32) / 8;
    if (mat == RW_MOE_W2) return i;
    return (i % 2 == 0) ? i / 2 : P + i / 2;
}

static emat expert_mat(const rw_layer_weights *lw, rw_moe_mat mat, int64_t e, int64_t P,
                       int64_t H) {
    const rw_tensor *w = mat == RW_MOE_W13 ? &lw->w13 : &lw->w2;
    const rw_tensor *s = mat == RW_MOE_W13 ? &lw->w13_scale : &lw->w2_scale;
    emat m = {0};
    m.fmt = lw->moe_fmt;
    m.M = mat == RW_MOE_W13 ? 2 * P : H;
    m.K = mat == RW_MOE_W13 ? H : P;
    const int64_t E = w->shape[0];
    const size_t wbytes = rw_tensor_nbytes(w) / (size_t)E;
    m.data = (const uint8_t *)w->data + (size_t)e * wbytes;
    if (m.fmt != RW_WFMT_BF16) {
        const size_t sbytes = rw_tensor_nbytes(s) / (size_t)E;
        m.scale = (const uint8_t *)s->data + (size_t)e * sbytes;
        m.scale_cols = (m.K + 127) / 128;
    }
    return m;
}

/* Scratch layout (floats unless noted): y [TB*k, H] expert outputs, gu [TB*k, 2P] gate/up dots
 * by canonical row, act [TB*k, P] silu(g)*u, buf [RB, max(H, P)] dequantized rows; then int64:
 * list [TB*k] assignments sorted by expert, cnt [E+1], crow13 [2P], crow2 [H] row maps. */
size_t rw_moe_experts_ref_workspace(int64_t E, int64_t P, int64_t H, int k) {
    const int64_t nas = (int64_t)TB * k;
    const int64_t nf = nas * H + nas * 2 * P + nas * P + (int64_t)RB * (H > P ? H : P);
    const int64_t ni = nas + (E + 1) + 2 * P + H;
    return (size_t)nf * sizeof(float) + (size_t)ni * sizeof(int64_t) + 64;
}

rw_status rw_moe_experts_ref_ws(const rw_layer_weights *lw, const rw_tp_dims *d, int64_t H,
                                const float *x, int64_t ntok, const int32_t *ids,
                                const float *weights, int k, float *out, void *ws, size_t ws_bytes,
                                rw_err *err) {
    if (ntok <= 0) return RW_OK;
    if (!lw || !d || !x || !ids || !weights || !out || k <= 0)
        RW_FAIL(err, RW_E_INVALID_ARG, "moe experts: NULL argument or k = %d", k);
    const int64_t P = d->P;
    const int64_t E = lw->w13.shape[0];
    if (H % 64 != 0 || P % 128 != 0 || lw->w13.ndim < 1 || E <= 0)
        RW_FAIL(err, RW_E_SHAPE, "moe experts: H = %lld (needs %% 64), P = %lld (needs %% 128)",
                (long long)H, (long long)P);
    if (ws_bytes < rw_moe_experts_ref_workspace(E, P, H, k))
        RW_FAIL(err, RW_E_INVALID_ARG, "moe experts: workspace of %zu bytes, needs %zu", ws_bytes,
                rw_moe_experts_ref_workspace(E, P, H, k));
    const int64_t nas = (int64_t)TB * k; /* assignments per pass */
    float *y = ws;
    float *gu = y + nas * H;
    float *act = gu + nas * 2 * P;
    float *buf = act + nas * P;
    uintptr_t ip = (uintptr_t)(buf + (int64_t)RB * (H > P ? H : P));
    ip = (ip + 7) & ~(uintptr_t)7;
    int64_t *list = (int64_t *)ip;
    int64_t *cnt = list + nas;
    int64_t *crow13 = cnt + E + 1;
    int64_t *crow2 = crow13 + 2 * P;
    for (int64_t n = 0; n < 2 * P; n++)
        crow13[n] = canon_row(lw->moe_fmt, RW_MOE_W13, n, P);
    for (int64_t n = 0; n < H; n++)
        crow2[n] = canon_row(lw->moe_fmt, RW_MOE_W2, n, P);

    for (int64_t t0 = 0; t0 < ntok; t0 += TB) {
        const int64_t nt = ntok - t0 < TB ? ntok - t0 : TB;
        const int64_t na = nt * k;
        /* counting sort of this pass's assignments by expert; ids outside [0, E) are not local
         * experts and contribute nothing */
        for (int64_t e = 0; e <= E; e++)
            cnt[e] = 0;
        for (int64_t a = 0; a < na; a++) {
            const int32_t e = ids[t0 * k + a];
            if (e >= 0 && e < E) cnt[e + 1]++;
        }
        for (int64_t e = 0; e < E; e++)
            cnt[e + 1] += cnt[e];
        for (int64_t a = 0; a < na; a++) {
            const int32_t e = ids[t0 * k + a];
            if (e >= 0 && e < E) list[cnt[e]++] = a;
        }
        for (int64_t e = E; e > 0; e--)
            cnt[e] = cnt[e - 1];
        cnt[0] = 0;
        for (int64_t a = 0; a < na; a++)
            for (int64_t h = 0; h < H; h++)
                y[a * H + h] = 0.0f;

        for (int64_t e = 0; e < E; e++) {
            const int64_t b = cnt[e], n_e = cnt[e + 1] - cnt[e];
            if (n_e == 0) continue;
            /* gate/up: gu[a][canonical row] = x_t . w13[row] over all 2P rows (pads included,
             * which are zero, so a wrongly packed pad would show) */
            const emat w13 = expert_mat(lw, RW_MOE_W13, e, P, H);
            for (int64_t n0 = 0; n0 < 2 * P; n0 += RB) {
                const int nr = (int)(2 * P - n0 < RB ? 2 * P - n0 : RB);
                emat_rows(&w13, n0, nr, buf);
                for (int64_t i = 0; i < n_e; i++) {
                    const int64_t a = list[b + i];
                    const float *xt = x + (t0 + a / k) * H;
                    for (int r = 0; r < nr; r++)
                        gu[a * 2 * P + crow13[n0 + r]] = rw_dot_f32(xt, buf + r * H, H);
                }
            }
            for (int64_t i = 0; i < n_e; i++) {
                const int64_t a = list[b + i];
                for (int64_t j = 0; j < P; j++) {
                    const float u = gu[a * 2 * P + j], g = gu[a * 2 * P + P + j];
                    act[a * P + j] = g / (1.0f + expf(-g)) * u;
                }
            }
            /* down: y[a][canonical h] = act_a . w2[row] over the padded P columns */
            const emat w2 = expert_mat(lw, RW_MOE_W2, e, P, H);
            for (int64_t n0 = 0; n0 < H; n0 += RB) {
                const int nr = (int)(H - n0 < RB ? H - n0 : RB);
                emat_rows(&w2, n0, nr, buf);
                for (int64_t i = 0; i < n_e; i++) {
                    const int64_t a = list[b + i];
                    for (int r = 0; r < nr; r++)
                        y[a * H + crow2[n0 + r]] = rw_dot_f32(act + a * P, buf + r * P, P);
                }
            }
        }
        /* weighted sum over the k slots in slot order, then one add into out */
        for (int64_t t = 0; t < nt; t++) {
            float *o = out + (t0 + t) * H;
            const float *w = weights + (t0 + t) * k;
            for (int64_t h = 0; h < H; h++) {
                float s = 0.0f;
                for (int j = 0; j < k; j++)
                    s += w[j] * y[(t * k + j) * H + h];
                o[h] += s;
            }
        }
    }
    return RW_OK;
}

void rw_moe_experts_ref(const rw_layer_weights *lw, const rw_tp_dims *d, int64_t H, const float *x,
                        int64_t ntok, const int32_t *ids, const float *weights, int k, float *out) {
    if (ntok <= 0 || k <= 0 || !lw || !d) return;
    const size_t n = rw_moe_experts_ref_workspace(lw->w13.shape[0], d->P, H, k);
    void *ws = malloc(n);
    if (!ws) return; /* out is left unchanged; rw_moe_experts_ref_ws reports errors */
    rw_moe_experts_ref_ws(lw, d, H, x, ntok, ids, weights, k, out, ws, n, NULL);
    free(ws);
}

#ifndef RW_HAVE_CUDA
/* CPU-only builds: the CUDA versions report that there is no device. */
rw_status rw_moe_route_cuda(const float *logits, int64_t ntok, int E, int k, bool renorm,
                            int32_t *ids, float *weights, rw_stream s, rw_err *err) {
    RW_FAIL(err, RW_E_NO_DEVICE, "moe route: built without CUDA");
}
size_t rw_moe_experts_cuda_workspace(int64_t E, int64_t P, int64_t H, int64_t max_tok, int k) {
    return 0;
}
rw_status rw_moe_experts_cuda(const rw_layer_weights *lw, const rw_tp_dims *d, int64_t H,
                              const uint16_t *x, const uint16_t *x_lo, bool act_pair, int64_t ntok,
                              const int32_t *ids, const float *weights, int k, float *out, void *ws,
                              size_t ws_bytes, rw_stream s, rw_err *err) {
    RW_FAIL(err, RW_E_NO_DEVICE, "moe experts: built without CUDA");
}
#endif
