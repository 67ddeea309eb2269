/* cuda_dense.c - the dense weights of the quantized layers (q/k/v, o_proj) as bf16 for the GEMMs:
 * the dequantization itself, and bf16 copies made once per weight generation
 * (rw_wset_generation) instead of before every GEMM of every step.
 *
 * A copy holds exactly what the per-step dequantization produced (e4m3 times a power of two for
 * mxfp8, the fp8-block product), so the GEMMs read the same bf16 values and nothing computed
 * changes; a step reads (qd + 2 kd + qd) H bf16 a quantized layer instead of reading the e4m3
 * weights, writing that bf16 and reading it back, and launches two kernels a layer fewer. The
 * copies take that much device memory (1.5 GB for the 30B-A3B shape's 40 mxfp8 layers), claimed
 * with the backend, before a KV cache sizes itself from what is free; where it is not there the
 * forward pass dequantizes per step as before (cuda_forward.c). A worker that hands its weights'
 * memory back (release_memory) hands these back too (rw_model_release_derived); the next forward
 * pass claims them again. */
#include <stdlib.h>
#include <string.h>

#include "cuda_be.h"

rw_status rw_cuda_dequant(rw_stream s, rw_wfmt fmt, const rw_tensor *w, const rw_tensor *sc,
                          uint16_t *out, rw_err *err) {
    const int64_t N = w->shape[0], K = w->shape[1];
    if (fmt == RW_WFMT_MXFP8) return rw_dequant_mxfp8_cuda(w->data, sc->data, N, K, out, s, err);
    return rw_dequant_fp8_block_cuda(w->data, sc->data, N, K, out, s, err);
}

rw_status rw_cuda_dequant_qkv(rw_stream s, const rw_layer_weights *lw, int64_t qd, int64_t kd,
                              int64_t H, uint16_t *out, rw_err *err) {
    RW_CHECK(rw_cuda_dequant(s, lw->attn_fmt, &lw->q, &lw->q_scale, out, err));
    RW_CHECK(rw_cuda_dequant(s, lw->attn_fmt, &lw->k, &lw->k_scale, out + qd * H, err));
    return rw_cuda_dequant(s, lw->attn_fmt, &lw->v, &lw->v_scale, out + (qd + kd) * H, err);
}

/* A layer whose dense weights are quantized (bf16 layers have the fused q/k/v view instead) */
static bool quantized(const rw_layer_weights *lw) {
    return lw->attn_fmt != RW_WFMT_BF16;
}

/* Claims the copies' memory (be->dq_want), and points each quantized layer's copies into it; a
 * warning and no copies when it is not there. */
static void dense_alloc(rw_model *m) {
    cuda_be *be = m->be;
    const rw_config *c = &m->cfg;
    const int64_t H = c->hidden_size, hd = c->head_dim;
    const int64_t qd = m->d.nh_local * hd, kd = m->d.nkv_local * hd;
    const size_t per = (size_t)(qd + 2 * kd) * (size_t)H + (size_t)H * (size_t)qd; /* elements */
    int nq = 0;
    for (int l = 0; l < c->num_layers; l++)
        nq += quantized(rw_wset_layer(m->ws, l));
    be->dq_qkv = calloc((size_t)c->num_layers, sizeof *be->dq_qkv);
    be->dq_o = calloc((size_t)c->num_layers, sizeof *be->dq_o);
    const cudaError_t ce =
        be->dq_qkv && be->dq_o ? cudaMalloc(&be->dq_mem, per * (size_t)nq * 2) : cudaErrorMemoryAllocation;
    if (ce != cudaSuccess) {
        (void)cudaGetLastError();
        RW_LOGW("no room for bf16 copies of %d quantized layers' dense weights (%.2f GB): they "
                "are dequantized every step instead",
                nq, (double)(per * (size_t)nq * 2) / 1e9);
        free(be->dq_qkv);
        free(be->dq_o);
        be->dq_qkv = be->dq_o = NULL;
        be->dq_mem = NULL;
        return;
    }
    uint16_t *p = be->dq_mem;
    for (int l = 0; l < c->num_layers; l++) {
        if (!quantized(rw_wset_layer(m->ws, l))) continue;
        be->dq_qkv[l] = p;
        be->dq_o[l] = p + (size_t)(qd + 2 * kd) * (size_t)H;
        p += per;
    }
    be->dq_valid = false;
}

void rw_cuda_dense_init(rw_model *m) {
    cuda_be *be = m->be;
    bool any = false;
    for (int l = 0; l < m->cfg.num_layers; l++)
        any |= quantized(rw_wset_layer(m->ws, l));
    const char *e = getenv("RW_DENSE_BF16_COPIES");
    be->dq_want = any && !(e && strcmp(e, "0") == 0);
    /* now, so that a KV cache sized later from the free memory leaves room for them */
    if (be->dq_want) dense_alloc(m);
}

void rw_cuda_dense_free(cuda_be *be) {
    cudaFree(be->dq_mem);
    free(be->dq_qkv);
    free(be->dq_o);
    be->dq_mem = NULL;
    be->dq_qkv = be->dq_o = NULL;
    be->dq_valid = false;
}

void rw_cuda_dense_release(rw_model *m) {
    cuda_be *be = m->be;
    if (!be->dq_mem) return;
    cudaStreamSynchronize(be->st); /* no forward pass reads them any more */
    rw_cuda_dense_free(be);
}

rw_status rw_cuda_dense_refresh(rw_model *m, rw_err *err) {
    cuda_be *be = m->be;
    if (!be->dq_want) return RW_OK;
    const uint64_t gen = rw_wset_generation(m->ws);
    if (be->dq_mem && be->dq_valid && be->dq_gen == gen) return RW_OK;
    /* the copies are made before a step is captured (cuda_graphs.c refreshes first): a stale one
     * here would be captured into the graph and remade on every replay */
    enum cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
    RW_CUDA_CHECK(err, cudaStreamIsCapturing(be->st, &cs));
    if (cs != cudaStreamCaptureStatusNone)
        RW_FAIL(err, RW_E_STATE, "CUDA forward: the bf16 copies of the quantized dense weights "
                                 "are stale inside a graph capture");
    if (!be->dq_mem) { /* released with the weights (rw_cuda_dense_release): claimed again */
        /* graphs captured before read the freed copies, whether or not new ones come */
        rw_cuda_drop_graphs(be);
        dense_alloc(m);
        if (!be->dq_mem) {
            be->dq_want = false; /* the warning is given: dequantize per step from now on */
            return RW_OK;
        }
    }
    const rw_config *c = &m->cfg;
    const int64_t H = c->hidden_size, hd = c->head_dim;
    const int64_t qd = m->d.nh_local * hd, kd = m->d.nkv_local * hd;
    be->dq_valid = false; /* until every layer is queued */
    for (int l = 0; l < c->num_layers; l++) {
        const rw_layer_weights *lw = rw_wset_layer(m->ws, l);
        if (!be->dq_qkv[l]) continue;
        RW_CHECK(rw_cuda_dequant_qkv(be->st, lw, qd, kd, H, be->dq_qkv[l], err));
        RW_CHECK(rw_cuda_dequant(be->st, lw->attn_fmt, &lw->o, &lw->o_scale, be->dq_o[l], err));
    }
    be->dq_gen = gen;
    be->dq_valid = true;
    return RW_OK;
}
