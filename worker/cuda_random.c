/* cuda_random.c - ops->load_random of the CUDA backend: every canonical tensor generated on the
 * device by the host generator's rule (kernels/random.h: the same bytes as the CPU backend's) and
 * applied as a device piece, so a 30B model takes seconds, not minutes. The tensor list and the
 * per-tensor parameters are model_random.c's. */
#include "cuda_be.h"

typedef struct dev_gen {
    cuda_be *be;
    uint16_t *buf; /* device, reused for every tensor (stream order protects it) */
    size_t cap;
} dev_gen;

static rw_status dev_fill(void *vctx, const rw_rand_tensor *t, rw_piece *p, rw_err *err) {
    dev_gen *g = vctx;
    if (t->n > g->cap) {
        RW_CUDA_CHECK(err, cudaStreamSynchronize(g->be->st));
        cudaFree(g->buf);
        g->buf = NULL;
        g->cap = 0;
        RW_CUDA_CHECK(err, cudaMalloc((void **)&g->buf, t->n * sizeof(uint16_t)));
        g->cap = t->n;
    }
    RW_CHECK(rw_k_fill_bf16(g->buf, (int64_t)t->n, t->seed, t->mean, t->sd, g->be->st, err));
    p->data = g->buf;
    p->place = RW_PLACE_DEVICE;
    return RW_OK;
}

rw_status rw_cuda_load_random(rw_model *m, uint64_t seed, float std, rw_err *err) {
    cuda_be *be = m->be;
    dev_gen g = {be, NULL, 0};
    const rw_status st = rw_model_rand_apply(m, seed, std, dev_fill, &g, be->st, err);
    const cudaError_t ce = cudaStreamSynchronize(be->st);
    cudaFree(g.buf);
    RW_CHECK(st);
    if (ce != cudaSuccess) return rw_cuda_fail(err, ce, __FILE__, __LINE__, "random weights");
    return RW_OK;
}
