/* bench_none.c - the weight-sync benchmarks in a build without CUDA: they need GPUs, so every
 * entry point reports RW_E_NO_DEVICE. */
#include "rw_sync.h"

rw_status rw_sync_bench_nccl(const rw_sync_bench_opts *o, rw_sync_bench_result *out, rw_err *err) {
    (void)o;
    memset(out, 0, sizeof *out);
    RW_FAIL(err, RW_E_NO_DEVICE, "sync benchmark: this build has no CUDA");
}

rw_status rw_sync_bench_disk(const rw_sync_bench_opts *o, rw_sync_bench_result *out, rw_err *err) {
    (void)o;
    memset(out, 0, sizeof *out);
    RW_FAIL(err, RW_E_NO_DEVICE, "sync benchmark: this build has no CUDA");
}

rw_status rw_sync_fill_bf16_cuda(uint16_t *dst, uint64_t n, uint64_t seed, float std, rw_stream s,
                                 rw_err *err) {
    (void)dst;
    (void)n;
    (void)seed;
    (void)std;
    (void)s;
    RW_FAIL(err, RW_E_NO_DEVICE, "fill: this build has no CUDA");
}
