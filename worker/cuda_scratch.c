/* cuda_scratch.c - the CUDA backend's activation buffers and per-step metadata (cuda_be.h),
 * sized for the largest batch seen so far (or reserved up front by ops->reserve) and never shrunk.
 * Per-step metadata (tokens, positions, KV slots, logits rows, attention tiles, block tables) goes
 * host -> device in one copy from pinned memory into a buffer at a fixed address, so a captured
 * decode graph reads the new step's values when replayed. */
#include <stdlib.h>

#include "cuda_be.h"
#include "kernels/gemm.h"
#include "kernels/router.h"

void rw_cuda_free_scratch(cuda_be *be) {
    void *d[] = {be->x,      be->y,        be->q,    be->h32,     be->rl,        be->wts,
                 be->qf,     be->lg_local, be->gath, be->logits,  be->h,         be->h_lo,
                 be->att,    be->att_lo,   be->hl,   be->ids,     be->attn_part, be->moe_ws,
                 be->meta_d, be->sp_d,     be->so_d, be->gemm_ws, be->route_cnt, be->smp_ws};
    for (size_t i = 0; i < sizeof d / sizeof d[0]; i++)
        cudaFree(d[i]);
    cudaFreeHost(be->meta_h);
    cudaFreeHost(be->sp_h);
    cudaFreeHost(be->so_h);
    be->x = be->y = be->q = be->h32 = be->rl = be->wts = be->qf = NULL;
    be->lg_local = be->gath = be->logits = NULL;
    be->h = be->h_lo = be->att = be->att_lo = be->hl = NULL;
    be->ids = NULL;
    be->attn_part = be->moe_ws = be->gemm_ws = NULL;
    be->route_cnt = NULL;
    be->route_ncnt = 0;
    be->meta_d = be->meta_h = NULL;
    be->sp_d = be->sp_h = NULL;
    be->so_d = be->so_h = NULL;
    be->smp_ws = NULL;
    be->smp_ws_bytes = 0;
    be->cap_tok = be->cap_log = 0;
    be->cap_seq = be->cap_bt = be->cap_smp = 0;
}

/* (Re)allocates the scratch for ntok tokens, nlog logits rows, nseq sequences and block tables
 * of nbt entries; never shrinks. Reallocation drops the captured graphs (they hold pointers). */
rw_status rw_cuda_ensure(rw_model *m, int64_t ntok, int64_t nlog, int nseq, int nbt, rw_err *err) {
    cuda_be *be = m->be;
    if (ntok <= be->cap_tok && nlog <= be->cap_log && nseq <= be->cap_seq && nbt <= be->cap_bt)
        return RW_OK;
    RW_CUDA_CHECK(err, cudaStreamSynchronize(be->st));
    rw_cuda_drop_graphs(be);
    const int64_t T = ntok > be->cap_tok ? ntok : be->cap_tok;
    const int64_t NL = nlog > be->cap_log ? nlog : be->cap_log;
    const int NS = nseq > be->cap_seq ? nseq : be->cap_seq;
    int NB = be->cap_bt ? be->cap_bt : 64;
    while (NB < nbt)
        NB *= 2;
    rw_cuda_free_scratch(be);
    const rw_config *c = &m->cfg;
    const rw_tp_dims *d = &m->d;
    const int64_t H = c->hidden_size, hd = c->head_dim, E = c->num_experts, K = c->top_k;
    const int64_t qd = d->nh_local * hd, kd = d->nkv_local * hd, vl = d->v_local, V = c->vocab_size;
#define DALLOC(p, bytes)                                                                           \
    RW_CUDA_CHECK(err, cudaMalloc((void **)&(p), (size_t)(bytes) > 0 ? (size_t)(bytes) : 16))
    DALLOC(be->x, T * H * 4);
    DALLOC(be->y, T * H * 4);
    DALLOC(be->h32, T * H * 4);
    DALLOC(be->h, T * H * 2);
    DALLOC(be->h_lo, T * H * 2);
    DALLOC(be->q, T * (qd + 2 * kd) * 4); /* the fused [q | k | v] rows */
    DALLOC(be->qf, T * qd * 4);
    DALLOC(be->att, T * qd * 2);
    DALLOC(be->att_lo, T * qd * 2);
    DALLOC(be->rl, T * E * 4);
    /* the router's choice, a [T, K] slice per layer: the experts read their layer's slice and
     * ops->routes copies every layer's out after the forward (no copy inside the forward) */
    DALLOC(be->wts, (int64_t)c->num_layers * T * K * 4);
    DALLOC(be->ids, (int64_t)c->num_layers * T * K * 4);
    DALLOC(be->hl, NL * H * 2); /* the lm_head input: one bf16, no lo half */
    DALLOC(be->lg_local, NL * vl * 4);
    DALLOC(be->gath, (int64_t)d->tp * NL * vl * 4);
    DALLOC(be->logits, NL * V * 4);
    be->attn_part_bytes = rw_k_attention_part_bytes(T < SPLIT_MAX_TOK ? T : SPLIT_MAX_TOK,
                                                    d->nh_local, (int)hd, SPLIT_SEGS);
    DALLOC(be->attn_part, be->attn_part_bytes);
    /* zeros once: the combine's ready counters at its start (attention.h), which every launch
     * leaves zero */
    RW_CUDA_CHECK(err, cudaMemsetAsync(be->attn_part, 0, be->attn_part_bytes, be->st));
    be->moe_ws_bytes = rw_moe_experts_cuda_workspace(E, d->P, H, T, (int)K);
    DALLOC(be->moe_ws, be->moe_ws_bytes);
    /* zeros once: the expert passes read their tile's entry beside the tile count, also in CTAs
     * past the count (moe/expert_gemm.cu), so entries no sort has written yet are read (and not
     * used); zeroed, those reads see defined values (a memory checker's initcheck stays quiet) */
    RW_CUDA_CHECK(err, cudaMemsetAsync(be->moe_ws, 0, be->moe_ws_bytes, be->st));
    /* the dense GEMMs' K-split workspace for the largest of them: q/k/v fused and apart, o_proj,
     * lm_head */
    const int64_t gemm_nk[][3] = {
        {qd + 2 * kd, H, T}, {qd, H, T}, {kd, H, T}, {H, qd, T}, {vl, H, NL}};
    be->gemm_ws_bytes = 0;
    for (size_t i = 0; i < sizeof gemm_nk / sizeof gemm_nk[0]; i++) {
        const size_t b = rw_k_gemm_ws_bytes(gemm_nk[i][0], gemm_nk[i][1], gemm_nk[i][2]);
        if (b > be->gemm_ws_bytes) be->gemm_ws_bytes = b;
    }
    DALLOC(be->gemm_ws, be->gemm_ws_bytes);
    if (be->gemm_ws_bytes) /* the tile counters start at zero (gemm.h) */
        RW_CUDA_CHECK(err, cudaMemsetAsync(be->gemm_ws, 0, be->gemm_ws_bytes, be->st));
    be->route_ncnt = rw_k_router_counters(T);
    DALLOC(be->route_cnt, be->route_ncnt * 4);
    RW_CUDA_CHECK(err, cudaMemsetAsync(be->route_cnt, 0, (size_t)be->route_ncnt * 4, be->st));
    /* metadata: tok, pos, slot [T]; rows [NL]; tiles [T + NS]; bt [NS, NB] */
    be->off_pos = (size_t)T * 4;
    be->off_slot = be->off_pos + (size_t)T * 4;
    be->off_rows = be->off_slot + (size_t)T * 4;
    be->off_tiles = (be->off_rows + (size_t)NL * 4 + 15) & ~(size_t)15;
    be->off_bt = be->off_tiles + (size_t)(T + NS) * sizeof(rw_attn_tile);
    be->meta_bytes = be->off_bt + (size_t)NS * NB * 4;
    DALLOC(be->meta_d, be->meta_bytes);
    RW_CUDA_CHECK(err, cudaMallocHost((void **)&be->meta_h, be->meta_bytes));
    be->cap_smp = (int)(NL > NS ? NL : NS);
    DALLOC(be->sp_d, (size_t)be->cap_smp * sizeof(rw_k_sample_param));
    DALLOC(be->so_d, (size_t)be->cap_smp * sizeof(rw_k_sample_out));
    be->smp_ws_bytes = rw_k_sample_ws_bytes(be->cap_smp, m->cfg.vocab_size);
    DALLOC(be->smp_ws, be->smp_ws_bytes);
    RW_CUDA_CHECK(
        err, cudaMallocHost((void **)&be->sp_h, (size_t)be->cap_smp * sizeof(rw_k_sample_param)));
    RW_CUDA_CHECK(
        err, cudaMallocHost((void **)&be->so_h, (size_t)be->cap_smp * sizeof(rw_k_sample_out)));
#undef DALLOC
    be->cap_tok = T;
    be->cap_log = NL;
    be->cap_seq = NS;
    be->cap_bt = NB;
    return RW_OK;
}

rw_status rw_cuda_reserve(rw_model *m, int64_t max_tokens, int max_seqs, rw_err *err) {
    const int nb = rw_cuda_graph_buckets[rw_cuda_graph_nbuckets - 1];
    const int64_t tok = max_tokens > nb ? max_tokens : nb;
    const int seqs = max_seqs > nb ? max_seqs : nb;
    return rw_cuda_ensure(m, tok, seqs, seqs, 256, err);
}
