/* norm_rope_ref.c - plain-C references of the norms and of the per-head norm + RoPE + KV write
 * (norm_rope.h): the kernels' inputs, outputs and rounding points, fp32 math. */
#include <math.h>

#include "norm_rope.h"

float rw_k_rms_scale_ref(const float *x, int64_t H, float eps) {
    float ss = 0.0f;
    for (int64_t i = 0; i < H; i++)
        ss += x[i] * x[i];
    return 1.0f / sqrtf(ss / (float)H + eps);
}

void rw_k_add_rmsnorm_ref(float *x, const float *y, const uint16_t *w, int64_t n, int64_t H,
                          float eps, uint16_t *out_hi, uint16_t *out_lo, float *out_f32) {
    for (int64_t t = 0; t < n; t++) {
        float *xt = x + t * H;
        if (y)
            for (int64_t i = 0; i < H; i++)
                xt[i] += y[t * H + i];
        const float r = rw_k_rms_scale_ref(xt, H, eps);
        for (int64_t i = 0; i < H; i++) {
            const float v = rw_bf16_to_f32(w[i]) * (xt[i] * r);
            rw_k_store_split(v, out_hi, out_lo, t * H + i);
            if (out_f32) out_f32[t * H + i] = v;
        }
    }
}

void rw_k_combine_rmsnorm_ref(float *x, const float *y, const int32_t *inv, const float *wts, int k,
                              const uint16_t *w, int64_t n, int64_t H, float eps,
                              uint16_t *out_hi, uint16_t *out_lo, float *out_f32) {
    for (int64_t t = 0; t < n; t++) {
        float *xt = x + t * H;
        for (int64_t i = 0; i < H; i++) {
            float s = 0.0f;
            for (int j = 0; j < k; j++) {
                const int32_t r = inv[t * k + j];
                if (r >= 0) s = fmaf(wts[t * k + j], y[(int64_t)r * H + i], s);
            }
            xt[i] += s;
        }
    }
    rw_k_add_rmsnorm_ref(x, NULL, w, n, H, eps, out_hi, out_lo, out_f32);
}

void rw_k_rmsnorm_rows_ref(float *x, const float *y, const int32_t *rows, int64_t n,
                           const uint16_t *w, int64_t H, float eps, uint16_t *out_hi,
                           uint16_t *out_lo) {
    for (int64_t t = 0; t < n; t++) {
        float *xt = x + (int64_t)rows[t] * H;
        if (y)
            for (int64_t i = 0; i < H; i++)
                xt[i] += y[(int64_t)rows[t] * H + i];
        const float r = rw_k_rms_scale_ref(xt, H, eps);
        for (int64_t i = 0; i < H; i++)
            rw_k_store_split(rw_bf16_to_f32(w[i]) * (xt[i] * r), out_hi, out_lo, t * H + i);
    }
}

void rw_k_head_norm_rope_ref(const float *x, const uint16_t *nw, int hd, float eps, int32_t pos,
                             const float *inv_freq, float *out) {
    const float r = rw_k_rms_scale_ref(x, hd, eps);
    const int half = hd / 2;
    for (int i = 0; i < half; i++) {
        const float a = rw_bf16_to_f32(nw[i]) * (x[i] * r);
        const float b = rw_bf16_to_f32(nw[i + half]) * (x[i + half] * r);
        const float ang = (float)pos * inv_freq[i];
        const float c = cosf(ang), s = sinf(ang);
        out[i] = a * c - b * s;
        out[i + half] = b * c + a * s;
    }
}

void rw_k_qk_rope_kv_ref(const float *q, const float *k, const float *v, int64_t ldq, int64_t ldkv,
                         const uint16_t *qn, const uint16_t *kn, const int32_t *pos,
                         const int32_t *slot, int64_t n, int nh, int nkv, int hd, int bs,
                         const float *inv_freq, float eps, float *q_out, rw_kv_planes kv) {
    float tmp[1024];
    for (int64_t t = 0; t < n; t++) {
        for (int h = 0; h < nh; h++) {
            rw_k_head_norm_rope_ref(q + t * ldq + h * hd, qn, hd, eps, pos[t], inv_freq, tmp);
            for (int i = 0; i < hd; i++)
                q_out[(t * nh + h) * hd + i] = tmp[i];
        }
        if (slot[t] < 0) continue;
        const int64_t blk = slot[t] / bs, off = slot[t] % bs;
        for (int g = 0; g < nkv; g++) {
            rw_k_head_norm_rope_ref(k + t * ldkv + g * hd, kn, hd, eps, pos[t], inv_freq, tmp);
            const int64_t at = ((blk * nkv + g) * bs + off) * hd;
            for (int i = 0; i < hd; i++) {
                rw_k_store_split(tmp[i], kv.k, kv.k_lo, at + i);
                rw_k_store_split(v[t * ldkv + g * hd + i], kv.v, kv.v_lo, at + i);
            }
        }
    }
}
