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
    /* Weights of at most 64 panels of 64 rows (4096 rows: o_proj 2048 x 4096) cannot give every
     * SM a tile at small M; they are cut into enough slices for two CTAs on every SM of a large
     * GPU (o_proj: 8 slices of 512 columns), K / S >= 256 columns. Measured on an H200 at
     * M = 1 (split activations): o_proj 29.1 us unsplit, 11.2 us in 8 slices; at M = 256 (folded)
     * 52.8 and 53.7 us. q/k/v (5120 x 2048, 80 panels) is not split: 4 slices took it
     * from 16.5 to 15.3 us at M = 1 (11.8 us with 2-stage tiles) but from 60.4 to 62.1 us at
     * M = 256 and 291 to 300 us at M = 2048. A function of N and K only: the bits of a product
     * never depend on the batch or the device. */
    const int64_t panels = (N + 63) / 64;
    int S = 1;
    while (panels <= 64 && S < 8 && panels * S < 256 && K / (2 * S) >= 256)
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
