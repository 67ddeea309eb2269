/* kernels_ref.c - plain-C references of the CUDA backend's kernels (kernels.h): the same inputs,
 * outputs and rounding points (bf16 where the kernel writes bf16), fp32 math. The gpu-suite test
 * compares each kernel with its reference. */
#include <math.h>
#include <stdlib.h>

#include "kernels.h"
#include "rw_worker.h"

void rw_k_embed_ref(const int32_t *tok, int64_t n, const uint16_t *emb, int64_t v_begin,
                    int64_t v_local, int64_t H, float *x) {
    for (int64_t t = 0; t < n; t++) {
        const int64_t r = (int64_t)tok[t] - v_begin;
        for (int64_t i = 0; i < H; i++)
            x[t * H + i] = (r >= 0 && r < v_local) ? rw_bf16_to_f32(emb[r * H + i]) : 0.0f;
    }
}

static float row_rms(const float *x, int64_t H, float eps) {
    float ss = 0.0f;
    for (int64_t i = 0; i < H; i++)
        ss += x[i] * x[i];
    return 1.0f / sqrtf(ss / (float)H + eps);
}

void rw_k_add_rmsnorm_ref(float *x, const float *y, const uint16_t *w, int64_t n, int64_t H,
                          float eps, uint16_t *out_bf16, float *out_f32) {
    for (int64_t t = 0; t < n; t++) {
        float *xt = x + t * H;
        if (y)
            for (int64_t i = 0; i < H; i++)
                xt[i] += y[t * H + i];
        const float r = row_rms(xt, H, eps);
        for (int64_t i = 0; i < H; i++) {
            const float v = rw_bf16_to_f32(w[i]) * (xt[i] * r);
            out_bf16[t * H + i] = rw_f32_to_bf16(v);
            if (out_f32) out_f32[t * H + i] = v;
        }
    }
}

void rw_k_rmsnorm_rows_ref(float *x, const float *y, const int32_t *rows, int64_t n,
                           const uint16_t *w, int64_t H, float eps, uint16_t *out_bf16) {
    for (int64_t t = 0; t < n; t++) {
        float *xt = x + (int64_t)rows[t] * H;
        if (y)
            for (int64_t i = 0; i < H; i++)
                xt[i] += y[(int64_t)rows[t] * H + i];
        const float r = row_rms(xt, H, eps);
        for (int64_t i = 0; i < H; i++)
            out_bf16[t * H + i] = rw_f32_to_bf16(rw_bf16_to_f32(w[i]) * (xt[i] * r));
    }
}

static void head_norm_rope(const float *x, const uint16_t *nw, int hd, float eps, int32_t pos,
                           const float *inv_freq, float *out) {
    const float r = row_rms(x, hd, eps);
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
                         const float *inv_freq, float eps, uint16_t *q_out, uint16_t *kcache,
                         uint16_t *vcache) {
    float tmp[1024];
    for (int64_t t = 0; t < n; t++) {
        for (int h = 0; h < nh; h++) {
            head_norm_rope(q + t * ldq + h * hd, qn, hd, eps, pos[t], inv_freq, tmp);
            for (int i = 0; i < hd; i++)
                q_out[(t * nh + h) * hd + i] = rw_f32_to_bf16(tmp[i]);
        }
        if (slot[t] < 0) continue;
        const int64_t blk = slot[t] / bs, off = slot[t] % bs;
        for (int g = 0; g < nkv; g++) {
            head_norm_rope(k + t * ldkv + g * hd, kn, hd, eps, pos[t], inv_freq, tmp);
            const int64_t at = ((blk * nkv + g) * bs + off) * hd;
            for (int i = 0; i < hd; i++) {
                kcache[at + i] = rw_f32_to_bf16(tmp[i]);
                vcache[at + i] = rw_f32_to_bf16(v[t * ldkv + g * hd + i]);
            }
        }
    }
}

void rw_k_attention_ref(const uint16_t *q, const uint16_t *kcache, const uint16_t *vcache,
                        const rw_attn_tile *tiles, int ntiles, const int32_t *pos,
                        const int32_t *bt, int bt_stride, int nh, int nkv, int hd, int bs,
                        uint16_t *out) {
    const int group = nh / nkv;
    const float scale = 1.0f / sqrtf((float)hd);
    for (int ti = 0; ti < ntiles; ti++) {
        const rw_attn_tile *tl = &tiles[ti];
        const int32_t *blocks = bt + (int64_t)tl->seq * bt_stride;
        for (int i = 0; i < tl->ntok; i++) {
            const int64_t t = tl->tok0 + i;
            const int32_t p = pos[t];
            float *sc = malloc(sizeof(float) * (size_t)(p + 1));
            for (int h = 0; h < nh; h++) {
                const int g = h / group;
                float mx = -INFINITY;
                for (int32_t j = 0; j <= p; j++) {
                    const int64_t at = (((int64_t)blocks[j / bs] * nkv + g) * bs + j % bs) * hd;
                    float d = 0.0f;
                    for (int e = 0; e < hd; e++)
                        d += rw_bf16_to_f32(q[(t * nh + h) * hd + e]) *
                             rw_bf16_to_f32(kcache[at + e]);
                    sc[j] = d * scale;
                    mx = sc[j] > mx ? sc[j] : mx;
                }
                float l = 0.0f;
                for (int32_t j = 0; j <= p; j++) {
                    sc[j] = expf(sc[j] - mx);
                    l += sc[j];
                }
                for (int e = 0; e < hd; e++) {
                    float o = 0.0f;
                    for (int32_t j = 0; j <= p; j++) {
                        const int64_t at = (((int64_t)blocks[j / bs] * nkv + g) * bs + j % bs) * hd;
                        o += sc[j] * rw_bf16_to_f32(vcache[at + e]);
                    }
                    out[(t * nh + h) * hd + e] = rw_f32_to_bf16(o / l);
                }
            }
            free(sc);
        }
    }
}

void rw_k_router_ref(const float *x, const uint16_t *w, int64_t n, int64_t E, int64_t H, float *y) {
    for (int64_t t = 0; t < n; t++)
        for (int64_t e = 0; e < E; e++) {
            float s = 0.0f;
            for (int64_t i = 0; i < H; i++)
                s += x[t * H + i] * rw_bf16_to_f32(w[e * H + i]);
            y[t * E + e] = s;
        }
}

void rw_k_logits_gather_ref(const float *g, int T, int64_t n, int64_t vl, int64_t V, float *out) {
    for (int64_t r = 0; r < n; r++)
        for (int64_t i = 0; i < V; i++)
            out[r * V + i] = g[((i / vl) * n + r) * vl + i % vl];
    (void)T;
}

/* --- sampling: the fixed-point rule of kernels.h ------------------------------------------ */
static inline uint64_t fixed_mass(float z, float zmax) {
    return (uint64_t)((double)expf(z - zmax) * 4294967296.0);
}

typedef struct zi {
    float z;
    int32_t id;
} zi;
static int zi_desc(const void *a, const void *b) {
    const zi *x = a, *y = b;
    if (x->z != y->z) return x->z > y->z ? -1 : 1;
    return x->id < y->id ? -1 : (x->id > y->id);
}

void rw_k_sample_ref(const float *logits, int64_t n, int64_t V, const rw_k_sample_param *p,
                     rw_k_sample_out *out) {
    zi *s = malloc(sizeof(zi) * (size_t)V);
    for (int64_t r = 0; r < n; r++) {
        const rw_k_sample_param *pr = &p[r];
        const float *l = logits + (int64_t)pr->row * V;
        rw_k_sample_out *o = &out[r];
        float mx = -INFINITY;
        int32_t arg = 0;
        for (int64_t i = 0; i < V; i++)
            if (l[i] > mx) {
                mx = l[i];
                arg = (int32_t)i;
            }
        float se = 0.0f;
        for (int64_t i = 0; i < V; i++)
            se += expf(l[i] - mx);
        const float lse = mx + logf(se);
        int32_t tok = arg;
        if (pr->temperature > 0.0f && pr->top_k != 1 && s) {
            const float inv_t = 1.0f / pr->temperature;
            const float zmax = mx * inv_t;
            for (int64_t i = 0; i < V; i++) {
                s[i].z = l[i] * inv_t;
                s[i].id = (int32_t)i;
            }
            qsort(s, (size_t)V, sizeof *s, zi_desc);
            float thr = -INFINITY;
            int64_t nk = V;
            if (pr->top_k > 0 && pr->top_k < V) {
                thr = s[pr->top_k - 1].z;
                while (nk > 0 && s[nk - 1].z < thr)
                    nk--;
            }
            if (pr->top_p < 1.0f) {
                uint64_t tot = 0;
                for (int64_t i = 0; i < nk; i++)
                    tot += fixed_mass(s[i].z, zmax);
                const uint64_t target = (uint64_t)((double)pr->top_p * (double)tot);
                uint64_t cum = 0;
                for (int64_t i = 0; i < nk; i++) {
                    cum += fixed_mass(s[i].z, zmax);
                    /* all entries equal to s[i].z belong to the kept set */
                    if (cum >= target && (i + 1 == nk || s[i + 1].z != s[i].z)) {
                        if (s[i].z > thr) thr = s[i].z;
                        break;
                    }
                }
            }
            uint64_t W = 0;
            for (int64_t i = 0; i < V; i++)
                if (l[i] * inv_t >= thr) W += fixed_mass(l[i] * inv_t, zmax);
            const uint64_t u = (uint64_t)(rw_sample_uniform(pr->seed, pr->position) * 16777216.0f);
            const uint64_t target = (W >> 24) * u + (((W & 0xffffffu) * u) >> 24);
            uint64_t cum = 0;
            tok = -1;
            for (int64_t i = 0; i < V; i++) {
                const float z = l[i] * inv_t;
                if (z < thr) continue;
                const uint64_t w = fixed_mass(z, zmax);
                if (w == 0) continue;
                cum += w;
                tok = (int32_t)i;
                if (cum > target) break;
            }
            if (tok < 0) tok = arg;
        }
        o->token = tok;
        o->logprob = l[tok] - lse;
        float pv = INFINITY;
        int32_t pid = -1;
        for (int j = 0; j < pr->top_n && j < 20; j++) {
            int32_t best = -1;
            for (int64_t i = 0; i < V; i++) {
                const float x = l[i];
                if (x > pv || (x == pv && i <= pid)) continue;
                if (best < 0 || x > l[best]) best = (int32_t)i;
            }
            if (best < 0) best = 0;
            o->top_ids[j] = best;
            o->top_lps[j] = l[best] - lse;
            pv = l[best];
            pid = best;
        }
    }
    free(s);
}
