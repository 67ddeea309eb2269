/* gemm_ref.c - the plain-C reference of the dense GEMM (gemm.h), its K-split rule and workspace
 * size (host code both builds share), and the stub that CPU-only builds link instead of gemm.cu. */
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

int rw_k_gemm_splits(int64_t N, int64_t K) {
    /* A weight of fewer than 256 panels of 64 rows cannot give every SM of a large GPU two
     * CTAs at small M; its K is cut into slices until it can (o_proj 2048 x 4096, 32 panels: 8
     * slices of 512 columns; q/k/v 5120 x 2048, 80 panels: 4 of 512), at most 8, K / S >= 256
     * columns. Measured on an H200 at M = 1 (split activations): o_proj 29.1 us unsplit, 11.2 us
     * in 8 slices; q/k/v 14.6 us unsplit, 10.4 us in 4 slices of 2-stage tiles (rw_k_gemm). The
     * slices cost the larger M, where one CTA folds them: q/k/v 52.7 -> 57.8 us at M = 256, 257
     * -> 293 us at M = 2048; o_proj 52.8 -> 53.7 us at M = 256. A function of N and K only: the
     * bits of a product never depend on the batch or the device. */
    const int64_t panels = (N + 63) / 64;
    int S = 1;
    while (S < 8 && panels * S < 256 && K / (2 * S) >= 256)
        S *= 2;
    /* slices of whole 64-column blocks: with a K that is not a multiple of 64 S, the first S - 1
     * slices may reach K and leave the last one empty (K = 2056 in 8 slices of 320); fewer then */
    while (S > 1 && (S - 1) * rw_k_gemm_slice_cols(K, S) >= K)
        S /= 2;
    return S;
}

int64_t rw_k_gemm_slice_cols(int64_t K, int S) {
    return S > 1 ? (K + 64 * (int64_t)S - 1) / (64 * (int64_t)S) * 64 : K;
}

size_t rw_k_gemm_ws_bytes(int64_t N, int64_t K, int64_t M) {
    const int S = N > 0 && K > 0 ? rw_k_gemm_splits(N, K) : 1;
    if (S == 1 || M <= 0) return 0;
    const int64_t rows = M < RW_K_GEMM_SPLIT_ROWS ? M : RW_K_GEMM_SPLIT_ROWS;
    return RW_K_GEMM_COUNTERS * sizeof(unsigned) + (size_t)S * (size_t)rows * (size_t)N * 4;
}

#ifndef RW_HAVE_CUDA
/* CPU-only builds: the CUDA version reports that there is no device. */
rw_status rw_k_gemm(const uint16_t *W, int64_t N, int64_t K, const uint16_t *x,
                    const uint16_t *x_lo, int64_t M, float *Y, void *ws, size_t ws_bytes,
                    rw_stream s, rw_err *err) {
    (void)W, (void)N, (void)K, (void)x, (void)x_lo, (void)M, (void)Y, (void)ws, (void)ws_bytes,
        (void)s;
    RW_FAIL(err, RW_E_NO_DEVICE, "gemm: built without CUDA");
}
#endif
