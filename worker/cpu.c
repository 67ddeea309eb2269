/* cpu.c - the CPU reference backend: the Qwen3-MoE forward pass in plain C with fp32 activations,
 * fp32 accumulation and an fp32 paged KV cache, reading the rank's weight set (bf16 weights are
 * upcast exactly; mxfp8 / fp8-block weights are dequantized row by row). Every per-token result is
 * a fixed sequence of fp32 operations that does not depend on the other tokens of the batch or on
 * how a prompt was split into chunks, so generation is batch and chunk invariant.
 *
 * Shapes (l = local to this rank): x, h [ntok, H]; q [ntok, nh_l, hd]; k, v [ntok, nkv_l, hd];
 * att [ntok, nh_l * hd]; KV cache per layer [nblocks, nkv_l, bs, hd] for K and for V. */
#include <math.h>
#include <stdlib.h>

#include "internal.h"

/* Weight rows dequantized together, reused by every token of the batch. */
#define ROWS 16

struct rw_kv {
    int64_t nblocks;
    int bs;
    float *k, *v; /* [L, nblocks, nkv_l, bs, hd] */
};

typedef struct cpu_be {
    int64_t cap_tok, cap_log, cap_ctx;
    float *x, *h, *q, *k, *v, *att, *y; /* token scratch */
    float *rl;                          /* router logits [ntok, E] */
    float *wts;                         /* routing weights [L, cap_tok, k]: a slice per layer */
    int32_t *ids;                       /* expert ids [L, cap_tok, k], so ops->routes finds every
                                           layer's choice of the last forward */
    int64_t last_ntok;                  /* tokens of the last forward */
    int32_t *pos;                       /* [ntok] */
    float *hl;                          /* final-normed rows [nlog, H] */
    float *lg_local, *gath, *logits;    /* [nlog, v_l], [T, nlog, v_l], [nlog, V] */
    int64_t nlogits;
    float *scores;   /* [cap_ctx] attention scores of one query head */
    float *rows;     /* [ROWS, max K] dequantized weight rows */
    float *inv_freq; /* [hd / 2] */
    void *moe_ws;
    size_t moe_ws_bytes;
    void *sample_scratch; /* [V] (float, int32) pairs */
} cpu_be;

/* Dequantizes rows [n0, n0 + nr) of a dense weight w [N, K] into out [nr, K]. bf16 is plain;
 * mxfp8 has UE8M0 scales [N, K/32] (not swizzled); fp8-block has fp32 scales [ceil(N/128),
 * ceil(K/128)]. */
static void dense_rows(rw_wfmt fmt, const rw_tensor *w, const rw_tensor *sc, int64_t n0, int nr,
                       float *out) {
    const int64_t K = w->shape[1];
    if (fmt == RW_WFMT_BF16 || w->dtype == RW_DTYPE_BF16) {
        const uint16_t *p = (const uint16_t *)w->data + n0 * K;
        for (int64_t i = 0; i < (int64_t)nr * K; i++)
            out[i] = rw_bf16_to_f32(p[i]);
    } else if (fmt == RW_WFMT_MXFP8) {
        const uint8_t *q = w->data, *s = sc->data;
        const int64_t sk = sc->shape[1];
        for (int r = 0; r < nr; r++)
            for (int64_t c = 0; c < K; c++)
                out[r * K + c] = rw_e4m3_to_f32(q[(n0 + r) * K + c]) *
                                 rw_ue8m0_to_f32(s[(n0 + r) * sk + c / 32]);
    } else {
        const uint8_t *q = w->data;
        const float *s = sc->data;
        const int64_t sk = sc->shape[1];
        for (int r = 0; r < nr; r++)
            for (int64_t c = 0; c < K; c++)
                out[r * K + c] =
                    rw_e4m3_to_f32(q[(n0 + r) * K + c]) * s[((n0 + r) / 128) * sk + c / 128];
    }
}

/* y[t, n] = x[t] . w[n] for w [N, K]; y has row stride ldy. */
static void linear(cpu_be *be, rw_wfmt fmt, const rw_tensor *w, const rw_tensor *sc, const float *x,
                   int64_t ntok, float *y, int64_t ldy) {
    const int64_t N = w->shape[0], K = w->shape[1];
    for (int64_t n0 = 0; n0 < N; n0 += ROWS) {
        const int nr = (int)(N - n0 < ROWS ? N - n0 : ROWS);
        dense_rows(fmt, w, sc, n0, nr, be->rows);
        for (int64_t t = 0; t < ntok; t++)
            for (int r = 0; r < nr; r++)
                y[t * ldy + n0 + r] = rw_dot_f32(x + t * K, be->rows + r * K, K);
    }
}

/* HF Qwen3MoeRMSNorm in fp32: w * (x * rsqrt(mean(x^2) + eps)). */
static void rmsnorm(const float *x, const uint16_t *w, int64_t n, float eps, float *out) {
    const float r = 1.0f / sqrtf(rw_dot_f32(x, x, n) / (float)n + eps);
    for (int64_t i = 0; i < n; i++)
        out[i] = rw_bf16_to_f32(w[i]) * (x[i] * r);
}

static void *grow(void *p, size_t bytes, bool *ok) {
    void *q = realloc(p, bytes ? bytes : 1);
    if (!q) *ok = false;
    return q ? q : p;
}

static rw_status ensure(rw_model *m, cpu_be *be, int64_t ntok, int64_t nlog, int64_t ctx,
                        rw_err *err) {
    const rw_config *c = &m->cfg;
    const rw_tp_dims *d = &m->d;
    const int64_t H = c->hidden_size, hd = c->head_dim, T = d->tp;
    bool ok = true;
    if (ntok > be->cap_tok) {
        const int64_t n = ntok;
        be->x = grow(be->x, sizeof(float) * n * H, &ok);
        be->h = grow(be->h, sizeof(float) * n * H, &ok);
        be->y = grow(be->y, sizeof(float) * n * H, &ok);
        be->q = grow(be->q, sizeof(float) * n * d->nh_local * hd, &ok);
        be->att = grow(be->att, sizeof(float) * n * d->nh_local * hd, &ok);
        be->k = grow(be->k, sizeof(float) * n * d->nkv_local * hd, &ok);
        be->v = grow(be->v, sizeof(float) * n * d->nkv_local * hd, &ok);
        be->rl = grow(be->rl, sizeof(float) * n * c->num_experts, &ok);
        be->wts = grow(be->wts, sizeof(float) * n * c->num_layers * c->top_k, &ok);
        be->ids = grow(be->ids, sizeof(int32_t) * n * c->num_layers * c->top_k, &ok);
        be->pos = grow(be->pos, sizeof(int32_t) * n, &ok);
        if (ok) be->cap_tok = n;
    }
    if (nlog > be->cap_log) {
        const int64_t n = nlog;
        be->hl = grow(be->hl, sizeof(float) * n * H, &ok);
        be->lg_local = grow(be->lg_local, sizeof(float) * n * d->v_local, &ok);
        be->gath = grow(be->gath, sizeof(float) * T * n * d->v_local, &ok);
        be->logits = grow(be->logits, sizeof(float) * n * c->vocab_size, &ok);
        if (ok) be->cap_log = n;
    }
    if (ctx > be->cap_ctx) {
        be->scores = grow(be->scores, sizeof(float) * ctx, &ok);
        if (ok) be->cap_ctx = ctx;
    }
    if (!ok) RW_FAIL(err, RW_E_OOM, "cpu backend scratch for %lld tokens", (long long)ntok);
    return RW_OK;
}

static size_t cpu_kv_block_bytes(rw_model *m, int bs) {
    return (size_t)m->cfg.num_layers * 2 * (size_t)m->d.nkv_local * (size_t)bs *
           (size_t)m->cfg.head_dim * sizeof(float);
}

static rw_status cpu_kv_budget(rw_model *m, double fraction, size_t *bytes, rw_err *err) {
    *bytes = (size_t)64 << 20;
    return RW_OK;
}

static rw_status cpu_kv_create(rw_model *m, int64_t nblocks, int bs, rw_kv **out, rw_err *err) {
    if (nblocks < 1 || bs < 1)
        RW_FAIL(err, RW_E_INVALID_ARG, "kv cache: %lld blocks of %d", (long long)nblocks, bs);
    rw_kv *kv = calloc(1, sizeof *kv);
    const size_t half = cpu_kv_block_bytes(m, bs) / 2 * (size_t)nblocks;
    if (kv) {
        kv->k = malloc(half);
        kv->v = malloc(half);
    }
    if (!kv || !kv->k || !kv->v) {
        if (kv) {
            free(kv->k);
            free(kv->v);
        }
        free(kv);
        RW_FAIL(err, RW_E_OOM, "kv cache of %zu bytes", 2 * half);
    }
    kv->nblocks = nblocks;
    kv->bs = bs;
    *out = kv;
    return RW_OK;
}

static void cpu_kv_destroy(rw_model *m, rw_kv *kv) {
    if (!kv) return;
    free(kv->k);
    free(kv->v);
    free(kv);
}

/* Per-head RMSNorm (q_norm / k_norm over head_dim) then RoPE, rotate-half form:
 * out[i] = x[i] cos - x[i + hd/2] sin, out[i + hd/2] = x[i + hd/2] cos + x[i] sin, i < hd/2,
 * angle = position * inv_freq[i]. */
static void norm_rope(const cpu_be *be, float *x, int nheads, int64_t hd, const uint16_t *nw,
                      float eps, int32_t pos) {
    float tmp[1024];
    const int64_t half = hd / 2;
    for (int h = 0; h < nheads; h++) {
        float *p = x + h * hd;
        rmsnorm(p, nw, hd, eps, tmp);
        for (int64_t i = 0; i < half; i++) {
            const float ang = (float)pos * be->inv_freq[i];
            const float cs = cosf(ang), sn = sinf(ang);
            p[i] = tmp[i] * cs - tmp[i + half] * sn;
            p[i + half] = tmp[i + half] * cs + tmp[i] * sn;
        }
    }
}

static rw_status cpu_forward(rw_model *m, rw_kv *kv, const rw_fwd_batch *b, rw_err *err) {
    cpu_be *be = m->be;
    const rw_config *c = &m->cfg;
    const rw_tp_dims *d = &m->d;
    const int64_t H = c->hidden_size, hd = c->head_dim, E = c->num_experts;
    const int K = c->top_k, nh = d->nh_local, nkv = d->nkv_local, group = nh / nkv;
    const float eps = (float)c->rms_eps;
    const float scale = (float)(1.0 / sqrt((double)hd));
    const int64_t ntok = b->ntok;
    int64_t max_ctx = 0;
    int max_blocks = 1;
    RW_CHECK(rw_fwd_batch_check(m, b, kv->nblocks, kv->bs, &max_ctx, &max_blocks, err));
    RW_CHECK(ensure(m, be, ntok, b->nlogits, max_ctx, err));
    for (int s = 0; s < b->nseq; s++)
        for (int32_t i = 0; i < b->seq[s].ntok; i++)
            be->pos[b->seq[s].tok0 + i] = b->seq[s].pos0 + i;

    /* vocab-parallel embedding: each rank fills the rows it holds, the all-reduce adds them */
    const rw_tensor emb = rw_wset_embed(m->ws);
    for (int64_t t = 0; t < ntok; t++) {
        const int64_t loc = (int64_t)b->tokens[t] - d->v_begin;
        float *xt = be->x + t * H;
        if (loc >= 0 && loc < d->v_local) {
            const uint16_t *row = (const uint16_t *)emb.data + loc * H;
            for (int64_t i = 0; i < H; i++)
                xt[i] = rw_bf16_to_f32(row[i]);
        } else {
            memset(xt, 0, sizeof(float) * (size_t)H);
        }
    }
    if (d->tp > 1) RW_CHECK(rw_comm_allreduce_f32(m->comm, be->x, (size_t)(ntok * H), NULL, err));

    const size_t kv_layer = (size_t)kv->nblocks * nkv * kv->bs * hd; /* floats per layer */
    for (int l = 0; l < c->num_layers; l++) {
        const rw_layer_weights *lw = rw_wset_layer(m->ws, l);
        for (int64_t t = 0; t < ntok; t++)
            rmsnorm(be->x + t * H, lw->input_norm.data, H, eps, be->h + t * H);
        linear(be, lw->attn_fmt, &lw->q, &lw->q_scale, be->h, ntok, be->q, nh * hd);
        linear(be, lw->attn_fmt, &lw->k, &lw->k_scale, be->h, ntok, be->k, nkv * hd);
        linear(be, lw->attn_fmt, &lw->v, &lw->v_scale, be->h, ntok, be->v, nkv * hd);
        float *kc = kv->k + l * kv_layer, *vc = kv->v + l * kv_layer;
        for (int s = 0; s < b->nseq; s++) {
            const rw_fwd_seq *sq = &b->seq[s];
            for (int32_t i = 0; i < sq->ntok; i++) {
                const int64_t t = sq->tok0 + i;
                const int32_t p = sq->pos0 + i;
                norm_rope(be, be->q + t * nh * hd, nh, hd, lw->q_norm.data, eps, p);
                norm_rope(be, be->k + t * nkv * hd, nkv, hd, lw->k_norm.data, eps, p);
                const int64_t blk = sq->blocks[p / kv->bs], off = p % kv->bs;
                for (int g = 0; g < nkv; g++) {
                    const size_t at = (((size_t)blk * nkv + g) * kv->bs + off) * hd;
                    memcpy(kc + at, be->k + (t * nkv + g) * hd, sizeof(float) * (size_t)hd);
                    memcpy(vc + at, be->v + (t * nkv + g) * hd, sizeof(float) * (size_t)hd);
                }
            }
        }
        /* causal attention from the cache: query at position p sees keys 0..p */
        for (int s = 0; s < b->nseq; s++) {
            const rw_fwd_seq *sq = &b->seq[s];
            for (int32_t i = 0; i < sq->ntok; i++) {
                const int64_t t = sq->tok0 + i;
                const int32_t p = sq->pos0 + i;
                for (int h = 0; h < nh; h++) {
                    const int g = h / group;
                    const float *qh = be->q + (t * nh + h) * hd;
                    float mx = -INFINITY;
                    for (int32_t j = 0; j <= p; j++) {
                        const size_t at =
                            (((size_t)sq->blocks[j / kv->bs] * nkv + g) * kv->bs + j % kv->bs) * hd;
                        const float sc = rw_dot_f32(qh, kc + at, hd) * scale;
                        be->scores[j] = sc;
                        mx = sc > mx ? sc : mx;
                    }
                    float sum = 0.0f;
                    for (int32_t j = 0; j <= p; j++) {
                        be->scores[j] = expf(be->scores[j] - mx);
                        sum += be->scores[j];
                    }
                    float *o = be->att + (t * nh + h) * hd;
                    memset(o, 0, sizeof(float) * (size_t)hd);
                    for (int32_t j = 0; j <= p; j++) {
                        const float pj = be->scores[j] / sum;
                        const size_t at =
                            (((size_t)sq->blocks[j / kv->bs] * nkv + g) * kv->bs + j % kv->bs) * hd;
                        for (int64_t e = 0; e < hd; e++)
                            o[e] += pj * vc[at + e];
                    }
                }
            }
        }
        linear(be, lw->attn_fmt, &lw->o, &lw->o_scale, be->att, ntok, be->y, H);
        if (d->tp > 1)
            RW_CHECK(rw_comm_allreduce_f32(m->comm, be->y, (size_t)(ntok * H), NULL, err));
        for (int64_t i = 0; i < ntok * H; i++)
            be->x[i] += be->y[i];

        /* MoE block */
        for (int64_t t = 0; t < ntok; t++)
            rmsnorm(be->x + t * H, lw->post_norm.data, H, eps, be->h + t * H);
        linear(be, RW_WFMT_BF16, &lw->router, NULL, be->h, ntok, be->rl, E);
        int32_t *ids = be->ids + (size_t)l * be->cap_tok * K;
        float *wts = be->wts + (size_t)l * be->cap_tok * K;
        rw_moe_route_ref(be->rl, ntok, (int)E, K, c->norm_topk_prob, ids, wts);
        memset(be->y, 0, sizeof(float) * (size_t)(ntok * H));
        RW_CHECK(rw_moe_experts_ref_ws(lw, d, H, be->h, ntok, ids, wts, K, be->y, be->moe_ws,
                                       be->moe_ws_bytes, err));
        if (d->tp > 1)
            RW_CHECK(rw_comm_allreduce_f32(m->comm, be->y, (size_t)(ntok * H), NULL, err));
        for (int64_t i = 0; i < ntok * H; i++)
            be->x[i] += be->y[i];
    }

    /* final norm and the vocab-parallel lm_head on the rows that need logits */
    const int64_t nlog = b->nlogits;
    const rw_tensor fn = rw_wset_final_norm(m->ws), lm = rw_wset_lm_head(m->ws);
    if (b->all_logits) {
        for (int64_t t = 0; t < ntok; t++)
            rmsnorm(be->x + t * H, fn.data, H, eps, be->hl + t * H);
    } else {
        for (int s = 0; s < b->nseq; s++) {
            const rw_fwd_seq *q = &b->seq[s];
            const int32_t rows = rw_fwd_seq_rows(q);
            for (int32_t i = 0; i < rows; i++)
                rmsnorm(be->x + (int64_t)(q->tok0 + q->ntok - rows + i) * H, fn.data, H, eps,
                        be->hl + (int64_t)(q->logits_row + i) * H);
        }
    }
    linear(be, RW_WFMT_BF16, &lm, NULL, be->hl, nlog, be->lg_local, d->v_local);
    const int64_t V = c->vocab_size, vl = d->v_local;
    const float *g = be->lg_local;
    if (d->tp > 1) {
        RW_CHECK(rw_comm_allgather(m->comm, be->lg_local, be->gath,
                                   sizeof(float) * (size_t)(nlog * vl), NULL, err));
        g = be->gath;
    }
    for (int64_t r = 0; r < nlog; r++)
        for (int64_t i = 0; i < V; i++)
            be->logits[r * V + i] = g[((i / vl) * nlog + r) * vl + i % vl];
    be->nlogits = nlog;
    be->last_ntok = ntok;
    return RW_OK;
}

static rw_status cpu_sample(rw_model *m, int n, const rw_sample_req *req, rw_sample_res *res,
                            rw_err *err) {
    cpu_be *be = m->be;
    const int V = m->cfg.vocab_size;
    for (int i = 0; i < n; i++) {
        if (req[i].row < 0 || req[i].row >= be->nlogits)
            RW_FAIL(err, RW_E_RANGE, "sample: row %d of %lld", req[i].row, (long long)be->nlogits);
        const float *row = be->logits + (int64_t)req[i].row * V;
        if (req[i].force) {
            res[i].token = req[i].token;
            RW_CHECK(rw_logprob_row_ref(row, V, req[i].sp, req[i].token, be->sample_scratch,
                                        &res[i].logprob, res[i].top_ids, res[i].top_lps, err));
        } else {
            RW_CHECK(rw_sample_row_ref(row, V, req[i].sp, req[i].position, be->sample_scratch,
                                       &res[i].token, &res[i].logprob, res[i].top_ids,
                                       res[i].top_lps, err));
        }
    }
    return RW_OK;
}

static rw_status cpu_logits_host(rw_model *m, int row0, int nrows, float *dst, rw_err *err) {
    cpu_be *be = m->be;
    if (row0 < 0 || nrows < 0 || row0 + nrows > be->nlogits)
        RW_FAIL(err, RW_E_RANGE, "logits rows [%d, %d) of %lld", row0, row0 + nrows,
                (long long)be->nlogits);
    const size_t V = (size_t)m->cfg.vocab_size;
    memcpy(dst, be->logits + (size_t)row0 * V, sizeof(float) * V * (size_t)nrows);
    return RW_OK;
}

static rw_status cpu_kv_copy(rw_model *m, rw_kv *kv, const int32_t *src, const int32_t *dst, int n,
                             rw_err *err) {
    const size_t blk = (size_t)m->d.nkv_local * (size_t)kv->bs * (size_t)m->cfg.head_dim;
    const size_t layer = (size_t)kv->nblocks * blk;
    for (int i = 0; i < n; i++) {
        if (src[i] < 0 || src[i] >= kv->nblocks || dst[i] < 0 || dst[i] >= kv->nblocks)
            RW_FAIL(err, RW_E_RANGE, "kv copy: block %d -> %d of %lld", src[i], dst[i],
                    (long long)kv->nblocks);
        for (int l = 0; l < m->cfg.num_layers; l++) {
            const size_t from = l * layer + (size_t)src[i] * blk,
                         to = l * layer + (size_t)dst[i] * blk;
            memcpy(kv->k + to, kv->k + from, sizeof(float) * blk);
            memcpy(kv->v + to, kv->v + from, sizeof(float) * blk);
        }
    }
    return RW_OK;
}

static rw_status cpu_routes(rw_model *m, int64_t ntok, int32_t *ids, float *wts, rw_err *err) {
    cpu_be *be = m->be;
    if (ntok < 0 || ntok > be->last_ntok)
        RW_FAIL(err, RW_E_RANGE, "routes: %lld tokens of %lld", (long long)ntok,
                (long long)be->last_ntok);
    const size_t K = (size_t)m->cfg.top_k, n = (size_t)ntok * K;
    for (int l = 0; l < m->cfg.num_layers; l++) {
        const size_t from = (size_t)l * (size_t)be->cap_tok * K;
        memcpy(ids + (size_t)l * n, be->ids + from, sizeof(int32_t) * n);
        if (wts) memcpy(wts + (size_t)l * n, be->wts + from, sizeof(float) * n);
    }
    return RW_OK;
}

static void cpu_destroy(rw_model *m) {
    cpu_be *be = m->be;
    if (!be) return;
    void *ps[] = {be->x,      be->h,    be->q,        be->k,      be->v,
                  be->att,    be->y,    be->rl,       be->wts,    be->ids,
                  be->pos,    be->hl,   be->lg_local, be->gath,   be->logits,
                  be->scores, be->rows, be->inv_freq, be->moe_ws, be->sample_scratch};
    for (size_t i = 0; i < sizeof ps / sizeof ps[0]; i++)
        free(ps[i]);
    free(be);
    m->be = NULL;
}

static const rw_backend_ops cpu_ops = {
    .name = "cpu",
    .reserve = NULL,
    .kv_block_bytes = cpu_kv_block_bytes,
    .kv_budget = cpu_kv_budget,
    .kv_create = cpu_kv_create,
    .kv_destroy = cpu_kv_destroy,
    .forward = cpu_forward,
    .sample = cpu_sample,
    .logits_host = cpu_logits_host,
    .kv_copy = cpu_kv_copy,
    .routes = cpu_routes,
    .load_random = rw_model_load_random_host,
    .destroy = cpu_destroy,
};

/* The layout this backend reads: checked once so a mismatch is an error, not garbage. */
static rw_status check_shapes(rw_model *m, rw_err *err) {
    const rw_config *c = &m->cfg;
    const rw_tp_dims *d = &m->d;
    const int64_t H = c->hidden_size, hd = c->head_dim;
    for (int l = 0; l < c->num_layers; l++) {
        const rw_layer_weights *lw = rw_wset_layer(m->ws, l);
        if (!lw) RW_FAIL(err, RW_E_INTERNAL, "weight set has no layer %d", l);
        const struct {
            const rw_tensor *t;
            int64_t r, c;
            const char *n;
        } want[] = {{&lw->q, d->nh_local * hd, H, "q_proj"},
                    {&lw->k, d->nkv_local * hd, H, "k_proj"},
                    {&lw->v, d->nkv_local * hd, H, "v_proj"},
                    {&lw->o, H, d->nh_local * hd, "o_proj"},
                    {&lw->router, c->num_experts, H, "router"}};
        for (size_t i = 0; i < sizeof want / sizeof want[0]; i++)
            if (want[i].t->ndim != 2 || want[i].t->shape[0] != want[i].r ||
                want[i].t->shape[1] != want[i].c)
                RW_FAIL(err, RW_E_SHAPE, "layer %d %s: weight set shape is not [%lld, %lld]", l,
                        want[i].n, (long long)want[i].r, (long long)want[i].c);
        if (lw->w13.shape[0] != c->num_experts)
            RW_FAIL(err, RW_E_SHAPE, "layer %d: %lld local experts, expected %d", l,
                    (long long)lw->w13.shape[0], c->num_experts);
    }
    return RW_OK;
}

rw_status rw_cpu_backend_init(rw_model *m, rw_err *err) {
    RW_CHECK(check_shapes(m, err));
    cpu_be *be = calloc(1, sizeof *be);
    if (!be) RW_FAIL(err, RW_E_OOM, "cpu backend");
    const rw_config *c = &m->cfg;
    const int64_t hd = c->head_dim, H = c->hidden_size;
    int64_t maxk = H > m->d.nh_local * hd ? H : m->d.nh_local * hd;
    be->rows = malloc(sizeof(float) * ROWS * (size_t)maxk);
    be->inv_freq = malloc(sizeof(float) * (size_t)(hd / 2));
    be->moe_ws_bytes = rw_moe_experts_ref_workspace(c->num_experts, m->d.P, H, c->top_k);
    be->moe_ws = malloc(be->moe_ws_bytes);
    be->sample_scratch = malloc((size_t)c->vocab_size * 8);
    if (!be->rows || !be->inv_freq || !be->moe_ws || !be->sample_scratch || hd > 1024) {
        m->be = be;
        cpu_destroy(m);
        if (hd > 1024) RW_FAIL(err, RW_E_UNSUPPORTED, "head_dim %lld > 1024", (long long)hd);
        RW_FAIL(err, RW_E_OOM, "cpu backend buffers");
    }
    rw_rope_inv_freq(c, be->inv_freq);
    m->be = be;
    m->ops = &cpu_ops;
    return RW_OK;
}
