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

static void split_store(float v, uint16_t *hi, uint16_t *lo, int64_t i) {
    const uint16_t h = rw_f32_to_bf16(v);
    hi[i] = h;
    if (lo) lo[i] = rw_bf16_split_lo(v, h);
}

static float row_rms(const float *x, int64_t H, float eps) {
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
        const float r = row_rms(xt, H, eps);
        for (int64_t i = 0; i < H; i++) {
            const float v = rw_bf16_to_f32(w[i]) * (xt[i] * r);
            split_store(v, out_hi, out_lo, t * H + i);
            if (out_f32) out_f32[t * H + i] = v;
        }
    }
}

void rw_k_rmsnorm_rows_ref(float *x, const float *y, const int32_t *rows, int64_t n,
                           const uint16_t *w, int64_t H, float eps, uint16_t *out_hi,
                           uint16_t *out_lo) {
    for (int64_t t = 0; t < n; t++) {
        float *xt = x + (int64_t)rows[t] * H;
        if (y)
            for (int64_t i = 0; i < H; i++)
                xt[i] += y[(int64_t)rows[t] * H + i];
        const float r = row_rms(xt, H, eps);
        for (int64_t i = 0; i < H; i++)
            split_store(rw_bf16_to_f32(w[i]) * (xt[i] * r), out_hi, out_lo, t * H + i);
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
                         const float *inv_freq, float eps, float *q_out, uint16_t *kcache,
                         uint16_t *vcache) {
    float tmp[1024];
    for (int64_t t = 0; t < n; t++) {
        for (int h = 0; h < nh; h++) {
            head_norm_rope(q + t * ldq + h * hd, qn, hd, eps, pos[t], inv_freq, tmp);
            for (int i = 0; i < hd; i++)
                q_out[(t * nh + h) * hd + i] = tmp[i];
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

void rw_k_attention_ref(const float *q, const uint16_t *kcache, const uint16_t *vcache,
                        const rw_attn_tile *tiles, int ntiles, const int32_t *pos,
                        const int32_t *bt, int bt_stride, int nh, int nkv, int hd, int bs,
                        uint16_t *out_hi, uint16_t *out_lo) {
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
                        d += q[(t * nh + h) * hd + e] * rw_bf16_to_f32(kcache[at + e]);
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
                    split_store(o / l, out_hi, out_lo, (t * nh + h) * hd + e);
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

/* --- the CUDA backend's forward pass on the CPU (kernels.h) -------------------------------- */
static inline float emul_round(float x, unsigned flags, unsigned bit) {
    if (!(flags & bit)) return x;
    const uint16_t h = rw_f32_to_bf16(x);
    const float hi = rw_bf16_to_f32(h);
    const unsigned split_points = RW_EMUL_ROUND_QKV_IN | RW_EMUL_ROUND_ATT | RW_EMUL_ROUND_MOE_IN |
                                  RW_EMUL_ROUND_ACT | RW_EMUL_ROUND_LM_IN;
    if ((flags & RW_EMUL_SPLIT) && (bit & split_points))
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
    const float r = row_rms(x, H, eps);
    for (int64_t i = 0; i < H; i++) {
        const float v = rw_bf16_to_f32(w[i]) * (x[i] * r);
        out[i] = emul_round(v, flags, bit);
        if (out32) out32[i] = v;
    }
}

rw_status rw_cuda_emul_score(const rw_wset *ws, const int32_t *tokens, int n, unsigned flags,
                             float *logits, int32_t *route_ids, float *router_logits, rw_err *err) {
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
    const size_t fl = sizeof(float);
    float *x = calloc((size_t)(n * H), fl), *y = calloc((size_t)(n * H), fl);
    float *h = calloc((size_t)(n * H), fl), *h32 = calloc((size_t)(n * H), fl);
    float *q = calloc((size_t)(n * qd), fl), *k = calloc((size_t)(n * kd), fl);
    float *v = calloc((size_t)(n * kd), fl), *att = calloc((size_t)(n * qd), fl);
    float *rl = calloc((size_t)(n * E), fl), *wts = calloc((size_t)(n * K), fl);
    float *sc = calloc((size_t)n, fl), *gu = calloc((size_t)(2 * P), fl);
    float *act = calloc((size_t)P, fl), *ye = calloc((size_t)(K * H), fl);
    float *inv = calloc((size_t)(hd / 2), fl);
    int32_t *ids = calloc((size_t)(n * K), sizeof(int32_t));
    rw_status st = RW_OK;
    if (!x || !y || !h || !h32 || !q || !k || !v || !att || !rl || !wts || !sc || !gu || !act ||
        !ye || !inv || !ids) {
        st = RW_ERR(err, RW_E_OOM, "emulation: scratch for %d tokens", n);
        goto done;
    }
    for (int64_t i = 0; i < hd / 2; i++)
        inv[i] = (float)(1.0 / pow(c->rope_theta, (double)(2 * i) / (double)hd));
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
                head_norm_rope(q + t * qd + hh * hd, lw->q_norm.data, (int)hd, eps, t, inv, tmp);
                for (int64_t i = 0; i < hd; i++)
                    q[t * qd + hh * hd + i] = emul_round(tmp[i], flags, RW_EMUL_ROUND_Q);
            }
            for (int64_t g = 0; g < nkv; g++) {
                head_norm_rope(k + t * kd + g * hd, lw->k_norm.data, (int)hd, eps, t, inv, tmp);
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
                        s += qh[e] * scale * k[j * kd + g * hd + e];
                    sc[j] = s;
                    mx = s > mx ? s : mx;
                }
                for (int j = 0; j <= t; j++) {
                    sc[j] = expf(sc[j] - mx);
                    ls += sc[j];
                }
                for (int64_t e = 0; e < hd; e++) {
                    float o = 0.0f;
                    for (int j = 0; j <= t; j++)
                        o += sc[j] * v[j * kd + g * hd + e];
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
    free(gu);
    free(act);
    free(ye);
    free(inv);
    free(ids);
    return st;
}
