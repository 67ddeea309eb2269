/* gpu_none.c - rw-bench's ceilings in a build without CUDA: every measurement reports
 * RW_E_NO_DEVICE, so rw-bench still runs (and prints error lines) on a CPU-only machine. */
#include "bench.h"

#define NO_DEVICE(err) RW_FAIL(err, RW_E_NO_DEVICE, "rw-bench: this build has no CUDA")

void rwb_device_desc(char *buf, size_t cap) { snprintf(buf, cap, "no CUDA (CPU-only build)"); }
rw_status rwb_fill_bf16(void *dst, uint64_t n, uint64_t seed, float mean, float std, void *s,
                        rw_err *err) {
    NO_DEVICE(err);
}
rw_status rwb_device_sync(int dev, rw_err *err) { NO_DEVICE(err); }
void rwb_profiler(bool on) { (void)on; }
rw_status rwb_mem_info(size_t *free_b, size_t *total_b, rw_err *err) { NO_DEVICE(err); }
rw_status rwb_copy_d2d(int dev, size_t bytes, int warmup, int reps, double *samples,
                       double *settle_s, rw_err *err) {
    NO_DEVICE(err);
}
rw_status rwb_copy_h2d(int dev, uint64_t total, size_t chunk, int warmup, int reps,
                       double *samples, rw_err *err) {
    NO_DEVICE(err);
}
rw_status rwb_bcast_create(int dev0, int dev1, rwb_bcast **out, rw_err *err) {
    *out = NULL;
    NO_DEVICE(err);
}
void rwb_bcast_destroy(rwb_bcast *b) { (void)b; }
rw_status rwb_bcast_run(rwb_bcast *b, uint64_t total, uint64_t bucket, int warmup, int reps,
                        double *samples, rw_err *err) {
    NO_DEVICE(err);
}
rw_status rwb_gemm_create(int dev, rwb_gemm **out, rw_err *err) {
    *out = NULL;
    NO_DEVICE(err);
}
void rwb_gemm_destroy(rwb_gemm *g) { (void)g; }
rw_status rwb_gemm_run(rwb_gemm *g, int64_t m, int64_t n, int64_t k, int batch, int warmup,
                       int reps, double *samples, rw_err *err) {
    NO_DEVICE(err);
}
