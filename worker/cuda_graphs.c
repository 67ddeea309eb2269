/* cuda_graphs.c - decode steps replayed from CUDA graphs. A decode batch (one token per sequence)
 * is padded up to a bucket size B and runs as the graph captured for (B, block-table stride,
 * attention split, KV cache), captured on first use and kept (at most MAX_GRAPHS); its metadata
 * lives at fixed device addresses (cuda_scratch.c), so a replay reads the new step's values.
 * Also the hooked run of bench_iface.h, which captures a graph for one call only. */
#include <stdlib.h>

#include "cuda_be.h"

const int rw_cuda_graph_buckets[] = {1,  2,   4,   8,   12,  16,  24,  32,  48,  64,  80,
                                     96, 112, 128, 160, 192, 224, 256, 320, 384, 448, 512};
const int rw_cuda_graph_nbuckets =
    (int)(sizeof rw_cuda_graph_buckets / sizeof rw_cuda_graph_buckets[0]);

void rw_cuda_drop_graphs(cuda_be *be) {
    for (int i = 0; i < be->ngraphs; i++)
        cudaGraphExecDestroy(be->graphs[i].exec);
    be->ngraphs = 0;
}

rw_status rw_cuda_run_graph(rw_model *m, rw_kv *kv, int B, int stride, int64_t max_ctx,
                            rw_err *err) {
    cuda_be *be = m->be;
    RW_CHECK(rw_cuda_dense_refresh(m, err)); /* a replay does not run rw_cuda_run_model's */
    const int ns = rw_cuda_graph_split(m, B, max_ctx);
    dgraph *g = NULL;
    for (int i = 0; i < be->ngraphs; i++)
        if (be->graphs[i].B == B && be->graphs[i].bt_stride == stride && be->graphs[i].kv == kv &&
            be->graphs[i].nsplit == ns)
            g = &be->graphs[i];
    if (!g) {
        if (be->ngraphs == MAX_GRAPHS) rw_cuda_drop_graphs(be);
        cudaGraph_t graph = NULL;
        cudaGraphExec_t exec = NULL;
        rw_err cerr = {0};
        RW_CUDA_CHECK(err, cudaStreamBeginCapture(be->st, cudaStreamCaptureModeRelaxed));
        rw_status st = rw_cuda_run_model(m, kv, B, B, 1, B, stride, ns, &cerr);
        cudaError_t ce = cudaStreamEndCapture(be->st, &graph);
        if (st == RW_OK && ce == cudaSuccess) ce = cudaGraphInstantiate(&exec, graph, 0);
        if (graph) cudaGraphDestroy(graph);
        if (st != RW_OK || ce != cudaSuccess) {
            /* a capture that fails falls back to running the same work eagerly, graphs off */
            (void)cudaGetLastError();
            RW_LOGW("decode graph (batch %d) not captured (%s%s): graphs off", B,
                    st != RW_OK ? cerr.msg : "", ce != cudaSuccess ? cudaGetErrorString(ce) : "");
            be->use_graphs = false;
            return rw_cuda_run_model(m, kv, B, B, 1, B, stride, ns, err);
        }
        g = &be->graphs[be->ngraphs++];
        g->exec = exec;
        g->B = B;
        g->bt_stride = stride;
        g->nsplit = ns;
        g->kv = kv;
    }
    RW_CUDA_CHECK(err, cudaGraphLaunch(g->exec, be->st));
    return RW_OK;
}

rw_status rw_cuda_run_hooked(rw_model *m, rw_kv *kv, int B, int64_t ntok, int ntiles, int qt,
                             int64_t nlog, int stride, int64_t max_ctx, rw_err *err) {
    cuda_be *be = m->be;
    RW_CHECK(rw_cuda_dense_refresh(m, err)); /* before the capture below */
    rw_cuda_fwd_hook *h = be->hook;
    h->graph = false;
    if (B && !h->no_graph) {
        const int ns = rw_cuda_graph_split(m, B, max_ctx);
        cudaGraph_t graph = NULL;
        cudaGraphExec_t exec = NULL;
        rw_err cerr = {0};
        RW_CUDA_CHECK(err, cudaStreamBeginCapture(be->st, cudaStreamCaptureModeRelaxed));
        be->capturing = true;
        be->hook_failed = false;
        const rw_status st = rw_cuda_run_model(m, kv, B, B, 1, B, stride, ns, &cerr);
        be->capturing = false;
        cudaError_t ce = cudaStreamEndCapture(be->st, &graph);
        const bool ok = st == RW_OK && !be->hook_failed;
        if (ok && ce == cudaSuccess) ce = cudaGraphInstantiate(&exec, graph, 0);
        if (graph) cudaGraphDestroy(graph);
        if (ok && ce == cudaSuccess && exec) {
            ce = cudaGraphLaunch(exec, be->st);
            const cudaError_t ce2 = cudaStreamSynchronize(be->st);
            cudaGraphExecDestroy(exec);
            if (ce != cudaSuccess || ce2 != cudaSuccess)
                return rw_cuda_fail(err, ce != cudaSuccess ? ce : ce2, __FILE__, __LINE__,
                                    "hooked decode graph");
            h->graph = true;
            return RW_OK;
        }
        if (exec) cudaGraphExecDestroy(exec);
        (void)cudaGetLastError();
        RW_LOGW("hooked decode graph not captured (%s%s): running the step eagerly",
                st != RW_OK ? cerr.msg : "", ce != cudaSuccess ? cudaGetErrorString(ce) : "");
    }
    if (B) { /* the metadata on the device is the padded decode batch */
        ntok = nlog = B;
        ntiles = B;
        qt = 1;
    }
    RW_CHECK(h->before_eager(h->ctx, be->st, err));
    const int ns = B ? rw_cuda_graph_split(m, B, max_ctx)
                     : rw_cuda_pick_split(be, ntok, ntiles, m->d.nkv_local, m->d.nh_local,
                                          m->cfg.head_dim, max_ctx);
    return rw_cuda_run_model(m, kv, ntok, ntiles, qt, nlog, stride, ns, err);
}
