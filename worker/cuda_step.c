/* cuda_step.c - ops->forward of the CUDA backend: checks the batch, lays its metadata out in the
 * pinned mirror (tokens, positions, KV slots, logits rows, attention tiles of up to rw_k_attention_tile_tokens
 * tokens, block tables), uploads it in one copy, then runs the model eagerly, from a decode graph
 * (cuda_graphs.c) or for the phase hook (bench_iface.h). Decode batches (one token per sequence,
 * one logits row each) are padded up to a graph bucket: the padding rows are token 0 at position
 * 0 writing the scratch KV block. */
#include <stdlib.h>

#include "cuda_be.h"

rw_status rw_cuda_forward(rw_model *m, rw_kv *kv, const rw_fwd_batch *b, rw_err *err) {
    cuda_be *be = m->be;
    const int bs = kv->bs;
    int64_t max_ctx = 0;
    int maxb = 1;
    RW_CHECK(rw_fwd_batch_check(m, b, kv->nblocks, bs, &max_ctx, &maxb, err));
    bool decode = !b->all_logits && b->nlogits == b->nseq;
    for (int s = 0; s < b->nseq && decode; s++)
        if (b->seq[s].ntok != 1 || b->seq[s].logits_row != s) decode = false;

    /* decode batches replay a graph captured for the padded batch size */
    int B = 0;
    if (decode && be->use_graphs)
        for (int i = 0; i < rw_cuda_graph_nbuckets; i++)
            if (rw_cuda_graph_buckets[i] >= b->nseq) {
                B = rw_cuda_graph_buckets[i];
                break;
            }
    const int64_t ntok = B ? B : b->ntok;
    const int nseq = B ? B : b->nseq;
    const int64_t nlog = B ? B : b->nlogits;
    RW_CHECK(rw_cuda_ensure(m, ntok, nlog, nseq, maxb, err));
    /* the previous step's upload must have left the mirror before it is rewritten: prefill
     * chunks queue no host sync, and without this wait a chunk's metadata could replace the one
     * before it while that one's copy still waits in the stream (a request then came out
     * different under a small token budget: tests/worker/test_invariance_gpu.c) */
    if (be->meta_pending) RW_CUDA_CHECK(err, cudaEventSynchronize(be->meta_ev));
    be->meta_pending = false;

    /* metadata into the pinned mirror */
    int32_t *h_tok = (int32_t *)be->meta_h;
    int32_t *h_pos = (int32_t *)(be->meta_h + be->off_pos);
    int32_t *h_slot = (int32_t *)(be->meta_h + be->off_slot);
    int32_t *h_rows = (int32_t *)(be->meta_h + be->off_rows);
    rw_attn_tile *h_tiles = (rw_attn_tile *)(be->meta_h + be->off_tiles);
    int32_t *h_bt = (int32_t *)(be->meta_h + be->off_bt);
    const int stride = be->cap_bt;
    int ntiles = 0, qt = 1;
    const int tt = rw_k_attention_tile_tokens(m->d.nh_local, m->d.nkv_local);
    for (int s = 0; s < b->nseq; s++) {
        const rw_fwd_seq *q = &b->seq[s];
        for (int32_t i = 0; i < q->ntok; i++) {
            const int64_t t = q->tok0 + i;
            const int32_t p = q->pos0 + i;
            h_tok[t] = b->tokens[t];
            h_pos[t] = p;
            h_slot[t] = q->blocks[p / bs] * bs + p % bs;
            if (b->all_logits) h_rows[t] = (int32_t)t;
        }
        if (!b->all_logits && q->logits_row >= 0) h_rows[q->logits_row] = q->tok0 + q->ntok - 1;
        for (int32_t i = 0; i < q->ntok; i += tt) {
            const int32_t n = q->ntok - i < tt ? q->ntok - i : tt;
            h_tiles[ntiles++] = (rw_attn_tile){s, q->tok0 + i, n, 0};
            if (n > qt) qt = n;
        }
        const int nb = (q->pos0 + q->ntok + bs - 1) / bs;
        memcpy(h_bt + (size_t)s * stride, q->blocks, sizeof(int32_t) * (size_t)nb);
    }
    for (int s = b->nseq; s < nseq; s++) { /* padding rows: token 0 at position 0, scratch block */
        h_tok[s] = 0;
        h_pos[s] = 0;
        h_slot[s] = (int32_t)(kv->nblocks * bs);
        h_rows[s] = s;
        h_tiles[ntiles++] = (rw_attn_tile){s, s, 1, 0};
        h_bt[(size_t)s * stride] = (int32_t)kv->nblocks;
    }
    RW_CUDA_CHECK(err,
                  cudaMemcpyAsync(be->meta_d, be->meta_h, be->off_bt + (size_t)nseq * stride * 4,
                                  cudaMemcpyHostToDevice, be->st));
    RW_CUDA_CHECK(err, cudaEventRecord(be->meta_ev, be->st));
    be->meta_pending = true;
    if (be->hook) {
        RW_CHECK(rw_cuda_run_hooked(m, kv, B, ntok, ntiles, qt, nlog, stride, max_ctx, err));
    } else if (!B) {
        const int ns = rw_cuda_pick_split(be, ntok, ntiles, m->d.nkv_local, m->d.nh_local,
                                          m->cfg.head_dim, max_ctx);
        RW_CHECK(rw_cuda_run_model(m, kv, ntok, ntiles, qt, nlog, stride, ns, err));
    } else {
        RW_CHECK(rw_cuda_run_graph(m, kv, B, stride, max_ctx, err));
    }
    be->nlogits = b->nlogits;
    return RW_OK;
}
