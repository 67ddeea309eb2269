/* cuda_sample.c - ops->sample of the CUDA backend (the parameters of n requests to the device,
 * the sampling kernel of kernels/sample.h over the last forward's logits rows, the results back)
 * and ops->logits_host (rows of logits to the host). */
#include "cuda_be.h"

rw_status rw_cuda_sample(rw_model *m, int n, const rw_sample_req *req, rw_sample_res *res,
                         rw_err *err) {
    cuda_be *be = m->be;
    if (n <= 0) return RW_OK;
    if (n > be->cap_smp)
        RW_FAIL(err, RW_E_RANGE, "sample: %d requests, room for %d", n, be->cap_smp);
    for (int i = 0; i < n; i++) {
        if (req[i].row < 0 || req[i].row >= be->nlogits)
            RW_FAIL(err, RW_E_RANGE, "sample: row %d of %lld", req[i].row, (long long)be->nlogits);
        const rw_sampling *sp = req[i].sp;
        rw_k_sample_param *p = &be->sp_h[i];
        p->temperature = sp->temperature;
        p->top_p = sp->top_p;
        p->top_k = sp->top_k;
        p->top_n = sp->top_logprobs;
        p->seed = sp->seed;
        p->position = req[i].position;
        p->row = req[i].row;
        p->mode = sp->logprob_mode;
        p->forced = req[i].force ? req[i].token : -1;
        p->pad = 0;
        if (req[i].force && (req[i].token < 0 || req[i].token >= m->cfg.vocab_size))
            RW_FAIL(err, RW_E_RANGE, "sample: token %d outside [0, %d)", req[i].token,
                    m->cfg.vocab_size);
    }
    RW_CUDA_CHECK(err, cudaMemcpyAsync(be->sp_d, be->sp_h, sizeof(rw_k_sample_param) * (size_t)n,
                                       cudaMemcpyHostToDevice, be->st));
    rw_cuda_mark(be, RW_PHASE_SAMPLE_BEGIN);
    RW_CHECK(rw_k_sample(be->logits, n, m->cfg.vocab_size, be->sp_d, be->so_d, be->smp_ws,
                         be->smp_ws_bytes, be->st, err));
    rw_cuda_mark(be, RW_PHASE_SAMPLE_END);
    RW_CUDA_CHECK(err, cudaMemcpyAsync(be->so_h, be->so_d, sizeof(rw_k_sample_out) * (size_t)n,
                                       cudaMemcpyDeviceToHost, be->st));
    RW_CUDA_CHECK(err, cudaStreamSynchronize(be->st));
    for (int i = 0; i < n; i++) {
        res[i].token = be->so_h[i].token;
        res[i].logprob = be->so_h[i].logprob;
        const int tn = req[i].sp->top_logprobs;
        memcpy(res[i].top_ids, be->so_h[i].top_ids, sizeof(int32_t) * (size_t)tn);
        memcpy(res[i].top_lps, be->so_h[i].top_lps, sizeof(float) * (size_t)tn);
    }
    return RW_OK;
}

rw_status rw_cuda_logits_host(rw_model *m, int row0, int nrows, float *dst, rw_err *err) {
    cuda_be *be = m->be;
    if (row0 < 0 || nrows < 0 || row0 + nrows > be->nlogits)
        RW_FAIL(err, RW_E_RANGE, "logits rows [%d, %d) of %lld", row0, row0 + nrows,
                (long long)be->nlogits);
    const size_t V = (size_t)m->cfg.vocab_size;
    RW_CUDA_CHECK(err, cudaMemcpyAsync(dst, be->logits + (size_t)row0 * V,
                                       sizeof(float) * V * (size_t)nrows, cudaMemcpyDeviceToHost,
                                       be->st));
    RW_CUDA_CHECK(err, cudaStreamSynchronize(be->st));
    return RW_OK;
}

/* Every layer's slice [ntok, K] of the routing record (cuda_be.h) in one strided copy per array:
 * L rows of ntok * K values, source pitch one layer's slice (cap_tok * K). */
rw_status rw_cuda_routes(rw_model *m, int64_t ntok, int32_t *ids, float *wts, rw_err *err) {
    cuda_be *be = m->be;
    if (ntok < 0 || ntok > be->last_ntok)
        RW_FAIL(err, RW_E_RANGE, "routes: %lld tokens of %lld", (long long)ntok,
                (long long)be->last_ntok);
    if (ntok == 0) return RW_OK;
    const size_t K = (size_t)m->cfg.top_k, L = (size_t)m->cfg.num_layers;
    const size_t width = (size_t)ntok * K * 4, pitch = (size_t)be->cap_tok * K * 4;
    RW_CUDA_CHECK(err, cudaMemcpy2DAsync(ids, width, be->ids, pitch, width, L,
                                         cudaMemcpyDeviceToHost, be->st));
    if (wts)
        RW_CUDA_CHECK(err, cudaMemcpy2DAsync(wts, width, be->wts, pitch, width, L,
                                             cudaMemcpyDeviceToHost, be->st));
    RW_CUDA_CHECK(err, cudaStreamSynchronize(be->st));
    return RW_OK;
}
