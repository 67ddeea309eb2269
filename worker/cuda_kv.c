/* cuda_kv.c - the CUDA backend's paged KV cache: per layer K and V bf16 [nblocks + 1, nkv, bs, hd]
 * in two device allocations, and two more of the pairs' low halves in the high-precision mode
 * (block nblocks is the scratch block that the padding rows of a decode graph write to), its size
 * per block, and the budget the engine sizes it from. */
#include <stdlib.h>

#include "cuda_be.h"

/* K and V, and their low halves in the high-precision mode */
static int kv_arrays(const rw_model *m) {
    return m->precision == RW_PRECISION_HIGH ? 4 : 2;
}

size_t rw_cuda_kv_block_bytes(rw_model *m, int bs) {
    return (size_t)m->cfg.num_layers * (size_t)kv_arrays(m) * (size_t)m->d.nkv_local * (size_t)bs *
           (size_t)m->cfg.head_dim * 2;
}

rw_kv_planes rw_cuda_kv_layer(const rw_kv *kv, int l) {
    const size_t at = (size_t)l * kv->layer_elems;
    rw_kv_planes p = {kv->k + at, kv->v + at, NULL, NULL};
    if (kv->k_lo) {
        p.k_lo = kv->k_lo + at;
        p.v_lo = kv->v_lo + at;
    }
    return p;
}

rw_status rw_cuda_kv_budget(rw_model *m, double fraction, size_t *bytes, rw_err *err) {
    size_t fr = 0, tot = 0;
    RW_CUDA_CHECK(err, cudaMemGetInfo(&fr, &tot));
    /* headroom for NCCL buffers, graphs, cuBLAS and the allocator */
    const size_t reserve = (size_t)768 << 20;
    const double b = (double)fr * fraction - (double)reserve;
    *bytes = b > 0 ? (size_t)b : 0;
    return RW_OK;
}

rw_status rw_cuda_kv_create(rw_model *m, int64_t nblocks, int bs, rw_kv **out, rw_err *err) {
    if (nblocks < 1 || bs < 16 || bs % 16)
        RW_FAIL(err, RW_E_INVALID_ARG, "kv cache (cuda): %lld blocks of %d (bs %% 16 == 0)",
                (long long)nblocks, bs);
    rw_kv *kv = calloc(1, sizeof *kv);
    if (!kv) RW_FAIL(err, RW_E_OOM, "kv cache");
    kv->nblocks = nblocks;
    kv->bs = bs;
    kv->layer_elems = (size_t)(nblocks + 1) * m->d.nkv_local * bs * m->cfg.head_dim;
    const size_t bytes = kv->layer_elems * 2 * (size_t)m->cfg.num_layers;
    cudaStream_t st = ((cuda_be *)m->be)->st;
    const int na = kv_arrays(m);
    uint16_t **arr[4] = {&kv->k, &kv->v, &kv->k_lo, &kv->v_lo};
    cudaError_t ce = cudaSuccess;
    /* zeroed: keys past a sequence's end are masked, and zeros keep 0 * value finite */
    for (int i = 0; i < na && ce == cudaSuccess; i++) {
        ce = cudaMalloc((void **)arr[i], bytes);
        if (ce == cudaSuccess) ce = cudaMemsetAsync(*arr[i], 0, bytes, st);
    }
    if (ce == cudaSuccess) ce = cudaStreamSynchronize(st);
    if (ce != cudaSuccess) {
        for (int i = 0; i < na; i++)
            cudaFree(*arr[i]);
        free(kv);
        /* the size is the useful context; a failed allocation is RW_E_OOM, anything else
         * RW_E_CUDA (cuda_check.h) */
        char what[96];
        snprintf(what, sizeof what, "kv cache (cuda): %zu bytes", (size_t)na * bytes);
        return rw_cuda_fail(err, ce, __FILE__, __LINE__, what);
    }
    *out = kv;
    return RW_OK;
}

void rw_cuda_kv_destroy(rw_model *m, rw_kv *kv) {
    if (!kv) return;
    cuda_be *be = m->be;
    cudaStreamSynchronize(be->st);
    /* graphs captured against this cache point into it */
    int j = 0;
    for (int i = 0; i < be->ngraphs; i++) {
        if (be->graphs[i].kv == kv)
            cudaGraphExecDestroy(be->graphs[i].exec);
        else
            be->graphs[j++] = be->graphs[i];
    }
    be->ngraphs = j;
    cudaFree(kv->k);
    cudaFree(kv->v);
    cudaFree(kv->k_lo);
    cudaFree(kv->v_lo);
    free(kv);
}

void rw_cuda_be_kv_buffers(rw_model *m, rw_kv *kv, rw_kv_planes *all, size_t *elems) {
    *all = (rw_kv_planes){kv->k, kv->v, kv->k_lo, kv->v_lo};
    *elems = kv->layer_elems * (size_t)m->cfg.num_layers;
}

/* Block b of every layer lies at elements (l * (nblocks + 1) + b) * blk of K and of V (and of
 * their low halves): one strided 2D copy per block and array moves all layers (L rows of blk
 * elements, pitch one layer). Queued on the backend's stream, so it is ordered after the forward
 * that wrote the source and before the next one. */
rw_status rw_cuda_kv_copy(rw_model *m, rw_kv *kv, const int32_t *src, const int32_t *dst, int n,
                          rw_err *err) {
    cuda_be *be = m->be;
    const size_t blk = (size_t)m->d.nkv_local * (size_t)kv->bs * (size_t)m->cfg.head_dim * 2;
    const size_t pitch = kv->layer_elems * 2;
    for (int i = 0; i < n; i++) {
        if (src[i] < 0 || src[i] >= kv->nblocks || dst[i] < 0 || dst[i] >= kv->nblocks)
            RW_FAIL(err, RW_E_RANGE, "kv copy: block %d -> %d of %lld", src[i], dst[i],
                    (long long)kv->nblocks);
        uint16_t *bufs[4] = {kv->k, kv->v, kv->k_lo, kv->v_lo};
        for (int t = 0; t < 4 && bufs[t]; t++) {
            uint8_t *base = (uint8_t *)bufs[t];
            RW_CUDA_CHECK(err, cudaMemcpy2DAsync(base + (size_t)dst[i] * blk, pitch,
                                                 base + (size_t)src[i] * blk, pitch, blk,
                                                 (size_t)m->cfg.num_layers,
                                                 cudaMemcpyDeviceToDevice, be->st));
        }
    }
    return RW_OK;
}
