/* cuda_forward.c - the CUDA backend's forward pass over one batch whose metadata is already on
 * the device (run_model): embedding, per layer norms, q/k/v, RoPE + KV write, attention, o_proj,
 * router, experts, and the lm_head, each a kernel of worker/kernels/ or moe, with TP all-reduces
 * through rw_comm; and the choice of the attention split. What it computes and why: the top of
 * cuda_backend.c. */
#include <stdlib.h>

#include "cuda_be.h"
#include "kernels/gemm.h"
#include "kernels/norm_rope.h"
#include "kernels/router.h"
#include "kernels/vocab.h"

void rw_cuda_mark(cuda_be *be, int phase) {
    if (be->hook && !be->hook->mark(be->hook->ctx, phase, be->st, be->capturing))
        be->hook_failed = true;
}

/* A dense weight [N, K] in any format times X + X_lo (gemm.h): quantized weights are dequantized to
 * bf16 first. */
static rw_status dense(cuda_be *be, rw_wfmt fmt, const rw_tensor *w, const rw_tensor *sc,
                       const uint16_t *X, const uint16_t *X_lo, float *Y, int64_t M, rw_err *err) {
    const int64_t N = w->shape[0], K = w->shape[1];
    const void *W = w->data;
    if (w->dtype != RW_DTYPE_BF16) {
        RW_CHECK(rw_cuda_dequant(be->st, fmt, w, sc, be->wdeq, err));
        W = be->wdeq;
    }
    return rw_k_gemm(W, N, K, X, X_lo, M, Y, be->gemm_ws, be->gemm_ws_bytes, be->st, err);
}

#define FUSE_MIN_TOK 64

/* The model on the metadata already on the device. */
rw_status rw_cuda_run_model(rw_model *m, rw_kv *kv, int64_t ntok, int ntiles, int qt, int64_t nlog,
                            int bt_stride, int nsplit, rw_err *err) {
    cuda_be *be = m->be;
    const rw_config *c = &m->cfg;
    const rw_tp_dims *d = &m->d;
    const int64_t H = c->hidden_size, hd = c->head_dim, E = c->num_experts;
    const int K = c->top_k, nh = d->nh_local, nkv = d->nkv_local;
    const float eps = (float)c->rms_eps;
    rw_stream s = be->st;
    RW_CHECK(rw_cuda_dense_refresh(m, err)); /* no-op unless the weights changed */
    const int32_t *tok = (const int32_t *)be->meta_d;
    const int32_t *pos = (const int32_t *)(be->meta_d + be->off_pos);
    const int32_t *slot = (const int32_t *)(be->meta_d + be->off_slot);
    const int32_t *rows = (const int32_t *)(be->meta_d + be->off_rows);
    const rw_attn_tile *tiles = (const rw_attn_tile *)(be->meta_d + be->off_tiles);
    const int32_t *bt = (const int32_t *)(be->meta_d + be->off_bt);
    const bool tp = d->tp > 1;

    rw_cuda_mark(be, RW_PHASE_START);
    const rw_tensor emb = rw_wset_embed(m->ws);
    RW_CHECK(rw_k_embed(tok, ntok, emb.data, d->v_begin, d->v_local, H, be->x, s, err));
    rw_cuda_mark(be, RW_PHASE_EMBED);
    if (tp) {
        RW_CHECK(rw_comm_allreduce_f32(m->comm, be->x, (size_t)(ntok * H), s, err));
        rw_cuda_mark(be, RW_PHASE_COMM);
    }
    /* One rank: the experts accumulate straight into the residual x (no zeroed y, no add); with
     * TP their partial sums go to y, are all-reduced and added by the next norm. The same bits:
     * x + (0 + s) == x + s. */
    float *moe_out = tp ? be->y : be->x;
    /* One rank, a step of one token or of FUSE_MIN_TOK to one expert chunk of tokens: a layer's
     * expert rows stay in the workspace and the next layer's input norm adds their combine to x
     * (rw_k_combine_rmsnorm, the same bits as the combine into x then the norm), one launch and
     * one pass over x fewer a layer. The last layer combines into x itself. Measured on an H200:
     * b256 11.9 -> 10.0 us a layer for the two kernels; the b1 forward step 3.30-3.31 -> 3.26-3.28
     * ms once both combines read their routes before the PDL wait (docs/BENCHMARKS.md,
     * nineteenth session); b8 was 0.5% slower fused (8.63-8.70 -> 8.70-8.72 ms), so 2 to
     * FUSE_MIN_TOK - 1 tokens keep the kernels apart (between 8 and 64 not measured). */
    const bool fuse = !tp && (ntok == 1 || ntok >= FUSE_MIN_TOK) && ntok <= RW_MOE_CUDA_CHUNK &&
                      K <= RW_K_COMBINE_MAX_K && H <= RW_K_COMBINE_MAX_H;
    const float *ey = NULL;
    const int32_t *einv = NULL;
    if (fuse)
        rw_moe_experts_cuda_rows(be->moe_ws, rw_wset_layer(m->ws, 0)->w13.shape[0], d->P, H, ntok,
                                 K, &ey, &einv);
    int qkv_ready = -1; /* the layer whose q/k/v the side stream has dequantized (below) */
    for (int l = 0; l < c->num_layers; l++) {
        const rw_layer_weights *lw = rw_wset_layer(m->ws, l);
        if (fuse && l > 0)
            RW_CHECK(rw_k_combine_rmsnorm(be->x, ey, einv,
                                          be->wts + (size_t)(l - 1) * (size_t)be->cap_tok * K, K,
                                          lw->input_norm.data, ntok, H, eps, be->h, be->h_lo,
                                          NULL, s, err));
        else
            RW_CHECK(rw_k_add_rmsnorm(be->x, l && tp ? be->y : NULL, lw->input_norm.data, ntok,
                                      H, eps, be->h, be->h_lo, NULL, s, err));
        rw_cuda_mark(be, RW_PHASE_NORM);
        const int64_t qd = (int64_t)nh * hd, kd = (int64_t)nkv * hd;
        /* one GEMM over [q | k | v] rows: a bf16 layer's fused view in the weight set (every
         * bf16 layer has one, rw_layer_weights), or a quantized layer's q, k and v dequantized
         * one after the other into one bf16 matrix (three GEMMs of 4096, 512 and 512 rows took
         * 16.7 + 18.9 + 18.9 us at b256 on an H200, the fused one 25.8): its bf16 copy
         * (cuda_dense.c), or without copies dequantized here */
        const void *wqkv = lw->qkv.data ? lw->qkv.data : be->dq_qkv ? be->dq_qkv[l] : NULL;
        const uint16_t *wo = be->dq_o ? be->dq_o[l] : NULL; /* o_proj's copy, if any */
        /* the side stream took this layer's o_proj (and maybe the next layer's q/k/v) */
        bool o_side = false;
        if (!wqkv) {
            if (lw->attn_fmt == RW_WFMT_BF16)
                RW_FAIL(err, RW_E_INVALID_ARG,
                        "CUDA forward: layer %d: bf16 attention weights without the fused q/k/v "
                        "view of the weight set",
                        l);
            uint16_t *const buf[2] = {be->wdeq, be->wdeq2 ? be->wdeq2 : be->wdeq};
            if (l != qkv_ready) RW_CHECK(rw_cuda_dequant_qkv(s, lw, qd, kd, H, buf[l % 2], err));
            wqkv = buf[l % 2];
            if (be->side) {
                /* Overlap: layer l's o_proj and layer l + 1's q/k/v dequantize on the side stream
                 * while this layer's q/k/v GEMM (about 80 CTAs at b256: compute-bound with the
                 * input pair, most of an H200's SMs idle), RoPE and attention run. The fork comes
                 * after layer l - 1's GEMMs in st's order, so the buffers it overwrites (buf[(l +
                 * 1) % 2] and wdeq_o) are no longer read; st waits for the join before the
                 * o_proj GEMM, and layer l + 1's q/k/v GEMM comes after that. The same kernels on
                 * the same bytes: only when they run changes. */
                RW_CUDA_CHECK(err, cudaEventRecord(be->ev_fork, (cudaStream_t)s));
                RW_CUDA_CHECK(err, cudaStreamWaitEvent(be->side, be->ev_fork, 0));
                RW_CHECK(
                    rw_cuda_dequant(be->side, lw->attn_fmt, &lw->o, &lw->o_scale, be->wdeq_o, err));
                const rw_layer_weights *nx =
                    l + 1 < c->num_layers ? rw_wset_layer(m->ws, l + 1) : NULL;
                if (nx && !nx->qkv.data && nx->attn_fmt != RW_WFMT_BF16) {
                    RW_CHECK(rw_cuda_dequant_qkv(be->side, nx, qd, kd, H, buf[(l + 1) % 2], err));
                    qkv_ready = l + 1;
                }
                RW_CUDA_CHECK(err, cudaEventRecord(be->ev_join, be->side));
                o_side = true;
            }
        }
        RW_CHECK(rw_k_gemm(wqkv, qd + 2 * kd, H, be->h, be->h_lo, ntok, be->q, be->gemm_ws,
                           be->gemm_ws_bytes, s, err));
        const float *qp = be->q, *kp = be->q + qd, *vp = be->q + qd + kd;
        const int64_t ldq = qd + 2 * kd, ldkv = ldq;
        rw_cuda_mark(be, RW_PHASE_QKV);
        const rw_kv_planes kvl = rw_cuda_kv_layer(kv, l);
        RW_CHECK(rw_k_qk_rope_kv(qp, kp, vp, ldq, ldkv, lw->q_norm.data, lw->k_norm.data, pos, slot,
                                 ntok, nh, nkv, (int)hd, kv->bs, be->inv_freq, eps, be->qf, kvl, s,
                                 err));
        rw_cuda_mark(be, RW_PHASE_ROPE);
        RW_CHECK(rw_k_attention(be->qf, kvl, tiles, ntiles, qt, pos, bt, bt_stride, ntok, nh, nkv,
                                (int)hd, kv->bs, nsplit, be->attn_part, be->attn_part_bytes,
                                be->att, be->att_lo, s, err));
        rw_cuda_mark(be, RW_PHASE_ATTN);
        if (o_side || wo) {
            if (o_side) RW_CUDA_CHECK(err, cudaStreamWaitEvent((cudaStream_t)s, be->ev_join, 0));
            RW_CHECK(rw_k_gemm(o_side ? be->wdeq_o : wo, lw->o.shape[0], lw->o.shape[1], be->att,
                               be->att_lo, ntok, be->y, be->gemm_ws, be->gemm_ws_bytes, s, err));
        } else {
            RW_CHECK(dense(be, lw->attn_fmt, &lw->o, &lw->o_scale, be->att, be->att_lo, be->y, ntok,
                           err));
        }
        rw_cuda_mark(be, RW_PHASE_OPROJ);
        if (tp) {
            RW_CHECK(rw_comm_allreduce_f32(m->comm, be->y, (size_t)(ntok * H), s, err));
            rw_cuda_mark(be, RW_PHASE_COMM);
        }
        /* this layer's slice of the routing record (ops->routes reads every layer's) */
        int32_t *ids = be->ids + (size_t)l * (size_t)be->cap_tok * K;
        float *wts = be->wts + (size_t)l * (size_t)be->cap_tok * K;
        /* a step of one token group: the router's routing CTA also sorts the assignments for
         * the expert layer (router.h), one launch less a layer. At one token its CTAs also
         * compute the post-attention norm themselves, one more launch less: on an H200 a b1
         * step 3.270-3.296 -> 3.225-3.244 ms (4k: 3.525-3.554 -> 3.474-3.494); at 8 tokens, where
         * every CTA norms the 8 rows one after another, 8.58-8.60 -> 9.05-9.09 ms
         * (docs/BENCHMARKS.md, 2026-12-04, nineteenth session) */
        rw_moe_sort_dest sd;
        const int64_t El = lw->w13.shape[0];
        const bool rsort = ntok <= RW_K_ROUTER_GROUP && El == E &&
                           rw_moe_experts_cuda_sort_dest(be->moe_ws, El, d->P, H, ntok, K, &sd);
        if (rsort && ntok == 1 && rw_k_router_norm_fits(H)) {
            RW_CHECK(rw_k_add_rmsnorm_router_topk_sort(be->x, be->y, lw->post_norm.data, eps, be->h,
                                                       be->h_lo, lw->router.data, ntok, E, H, K,
                                                       c->norm_topk_prob, be->rl, ids, wts,
                                                       be->route_cnt, be->route_ncnt, &sd, s, err));
        } else {
            RW_CHECK(rw_k_add_rmsnorm(be->x, be->y, lw->post_norm.data, ntok, H, eps, be->h,
                                      be->h_lo, be->h32, s, err));
            rw_cuda_mark(be, RW_PHASE_NORM);
            if (rsort)
                RW_CHECK(rw_k_router_topk_sort(be->h32, lw->router.data, ntok, E, H, K,
                                               c->norm_topk_prob, be->rl, ids, wts, be->route_cnt,
                                               be->route_ncnt, &sd, s, err));
            else
                RW_CHECK(rw_k_router_topk(be->h32, lw->router.data, ntok, E, H, K,
                                          c->norm_topk_prob, be->rl, ids, wts, be->route_cnt,
                                          be->route_ncnt, s, err));
        }
        rw_cuda_mark(be, RW_PHASE_ROUTER);
        if (tp) RW_CUDA_CHECK(err, cudaMemsetAsync(be->y, 0, (size_t)(ntok * H) * 4, be->st));
        float *const eo = fuse && l + 1 < c->num_layers ? NULL : moe_out;
        /* silu(g)*u into the down projection: one bf16, or a pair in the high-precision mode */
        const bool act_pair = m->precision == RW_PRECISION_HIGH;
        if (rsort)
            RW_CHECK(rw_moe_experts_cuda_presorted(lw, d, H, be->h, be->h_lo, act_pair, ntok, ids,
                                                   wts, K, eo, be->moe_ws, be->moe_ws_bytes, s,
                                                   err));
        else
            RW_CHECK(rw_moe_experts_cuda(lw, d, H, be->h, be->h_lo, act_pair, ntok, ids, wts, K, eo,
                                         be->moe_ws, be->moe_ws_bytes, s, err));
        rw_cuda_mark(be, RW_PHASE_EXPERTS);
        if (tp) {
            RW_CHECK(rw_comm_allreduce_f32(m->comm, be->y, (size_t)(ntok * H), s, err));
            rw_cuda_mark(be, RW_PHASE_COMM);
        }
    }
    const rw_tensor fn = rw_wset_final_norm(m->ws), lm = rw_wset_lm_head(m->ws);
    RW_CHECK(rw_k_rmsnorm_rows(be->x, tp ? be->y : NULL, rows, nlog, fn.data, H, eps, be->hl,
                               NULL, s, err));
    /* one rank whose vocabulary needs no padding: the lm_head writes the logits in place. Its
     * input is one bf16 (the norm writes no lo half): the lm_head comes after every routing
     * decision, and F2 holds without the lo half wherever it holds with it
     * (test_cuda_numerics, "one bf16 lm_head input"), at half the products of the pair */
    const bool direct = !tp && d->v_local == c->vocab_size;
    RW_CHECK(rw_k_gemm(lm.data, d->v_local, H, be->hl, NULL, nlog,
                       direct ? be->logits : be->lg_local, be->gemm_ws, be->gemm_ws_bytes, s, err));
    const float *g = be->lg_local;
    if (tp) {
        rw_cuda_mark(be, RW_PHASE_LMHEAD);
        RW_CHECK(rw_comm_allgather(m->comm, be->lg_local, be->gath,
                                   sizeof(float) * (size_t)(nlog * d->v_local), s, err));
        rw_cuda_mark(be, RW_PHASE_COMM);
        g = be->gath;
    }
    if (!direct)
        RW_CHECK(rw_k_logits_gather(g, d->tp, nlog, d->v_local, c->vocab_size, be->logits, s, err));
    rw_cuda_mark(be, RW_PHASE_LMHEAD);
    return RW_OK;
}

/* Attention CTAs per (tile, kv head) for a batch (rw_k_attention's nsplit): 0 (one CTA walks
 * every key segment) when the tiles alone fill the GPU or the partials of max_ctx's segments do
 * not fit the scratch. max_ctx is the longest context of the batch (the largest position + 1);
 * decode graphs are captured with max_ctx 0 (any context) and checked per step
 * (rw_cuda_graph_split).
 * Results do not depend on the choice (attention.h), only the speed does. */
int rw_cuda_pick_split(const cuda_be *be, int64_t ntok, int ntiles, int nkv, int nh, int hd,
                       int64_t max_ctx) {
    if (ntok > SPLIT_MAX_TOK) return 0;
    /* Unsplit when the tiles alone give about one CTA an SM: there a split only adds partials
     * and the combine (an H200, 64 sequences x 4k keys: 25.9 ms a step unsplit, 27.0 in 2
     * splits). Fewer tiles aim at about two split CTAs an SM (the split CTAs' 75 KB of shared
     * memory fit three): each warp walks its segments as a chain of dependent instructions
     * (Nsight Compute at 8 x 4k: one warp a scheduler, an issue every 3 cycles), so a second CTA
     * an SM hides the chain's latency. Against one split CTA an SM, same runs: 8 x 4k and 8 x 8k
     * 0.670-0.674 -> 0.690-0.694 and 0.674-0.676 -> 0.684-0.688 of the memory floor, 32 x 4k
     * and 32 x 8k 0.743-0.745 -> 0.746-0.748 and 0.751-0.752 -> 0.763-0.765; three or four an SM
     * lost at 8 sequences (docs/BENCHMARKS.md, twelfth session). */
    const int cta = ntiles * nkv > 0 ? ntiles * nkv : 1;
    if ((be->nsm + cta - 1) / cta < 2) return 0;
    int ns = (2 * be->nsm + cta - 1) / cta;
    if (max_ctx > 0) {
        const int64_t segs = (max_ctx - 1) / RW_ATTN_SEG + 1;
        if (ns > segs) ns = (int)segs;
        if (rw_k_attention_part_bytes(ntok, nh, hd, (int)segs) > be->attn_part_bytes) return 0;
    }
    if (ns > SPLIT_MAX) ns = SPLIT_MAX;
    return ns < 2 ? 0 : ns;
}

/* The split a decode graph of B rows uses for a step whose longest context is max_ctx: the
 * batch-size choice when the partials of every segment fit, else 0. */
int rw_cuda_graph_split(const rw_model *m, int B, int64_t max_ctx) {
    const cuda_be *be = m->be;
    const int nh = m->d.nh_local, hd = m->cfg.head_dim;
    const int ns = rw_cuda_pick_split(be, B, B, m->d.nkv_local, nh, hd, 0);
    if (ns == 0) return 0;
    const int64_t segs = max_ctx > 0 ? (max_ctx - 1) / RW_ATTN_SEG + 1 : 1;
    return rw_k_attention_part_bytes(B, nh, hd, (int)segs) <= be->attn_part_bytes ? ns : 0;
}
