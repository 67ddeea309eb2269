/* gemm_ref.c - the plain-C reference of the dense GEMM (gemm.h), and the stub that CPU-only
 * builds link instead of gemm.cu. */
#include "gemm.h"

void rw_k_gemm_ref(const uint16_t *W, int64_t N, int64_t K, const uint16_t *x, const uint16_t *x_lo,
                   int64_t M, float *Y) {
    for (int64_t m = 0; m < M; m++) {
        const uint16_t *xm = x + m * K;
        const uint16_t *lm = x_lo ? x_lo + m * K : NULL;
        for (int64_t n = 0; n < N; n++) {
            const uint16_t *wn = W + n * K;
            double acc = 0.0;
            for (int64_t k = 0; k < K; k++) {
                const double w = rw_bf16_to_f32(wn[k]);
                acc += w * rw_bf16_to_f32(xm[k]);
                if (lm) acc += w * rw_bf16_to_f32(lm[k]);
            }
            Y[m * N + n] = (float)acc;
        }
    }
}

#ifndef RW_HAVE_CUDA
/* CPU-only builds: the CUDA version reports that there is no device. */
rw_status rw_k_gemm(const uint16_t *W, int64_t N, int64_t K, const uint16_t *x,
                    const uint16_t *x_lo, int64_t M, float *Y, rw_stream s, rw_err *err) {
    (void)W, (void)N, (void)K, (void)x, (void)x_lo, (void)M, (void)Y, (void)s;
    RW_FAIL(err, RW_E_NO_DEVICE, "gemm: built without CUDA");
}
#endif
