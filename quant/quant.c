/* quant.c - CPU reference quantize / dequantize for MXFP8 (e4m3 + UE8M0 per 1x32 along K) and
 * FP8 128x128 block (e4m3 + fp32 scale), built on the host+device scalar rules of rw_quant.h so
 * the CUDA kernels in quant.cu produce the same bytes. Without CUDA the device entry points exist
 * here and report RW_E_NO_DEVICE.
 *
 * NaN, inf and all-zero blocks behave as documented in rw_quant.h ("Special values").
 */
#include "rw_quant.h"

/* Largest |x| of `n` bf16 values as fp32, NaN if any is NaN. Comparing the magnitude bits as
 * integers orders all non-negative floats, with inf above every finite value and NaN above inf;
 * fmaxf would drop NaN instead. */
static float amax_bf16(const uint16_t *x, int64_t n) {
    uint16_t m = 0;
    for (int64_t i = 0; i < n; i++) {
        uint16_t a = x[i] & 0x7fffu;
        if (a > m) m = a;
    }
    return rw_bf16_to_f32(m);
}

static rw_status check_args(const char *what, const void *x, int64_t rows, int64_t cols,
                            const void *q, const void *scale, rw_err *err) {
    if (rows < 0 || cols < 0)
        RW_FAIL(err, RW_E_SHAPE, "%s: negative shape [%lld, %lld]", what, (long long)rows,
                (long long)cols);
    if (rows > 0 && cols > 0 && (!x || !q || !scale))
        RW_FAIL(err, RW_E_INVALID_ARG, "%s: NULL %s pointer", what,
                !x ? "input" : (!q ? "output" : "scale"));
    return RW_OK;
}

rw_status rw_quant_mxfp8_ref(const uint16_t *x_bf16, int64_t rows, int64_t cols, uint8_t *q,
                             uint8_t *scale, rw_err *err) {
    RW_CHECK(check_args("mxfp8 quantize", x_bf16, rows, cols, q, scale, err));
    if (cols % RW_MXFP8_BLOCK)
        RW_FAIL(err, RW_E_SHAPE, "mxfp8 quantize: K = %lld is not a multiple of %d",
                (long long)cols, RW_MXFP8_BLOCK);
    int64_t nb = cols / RW_MXFP8_BLOCK;
    for (int64_t r = 0; r < rows; r++) {
        for (int64_t b = 0; b < nb; b++) {
            const uint16_t *xb = x_bf16 + r * cols + b * RW_MXFP8_BLOCK;
            uint8_t *qb = q + r * cols + b * RW_MXFP8_BLOCK;
            uint8_t s = rw_mxfp8_scale_from_amax(amax_bf16(xb, RW_MXFP8_BLOCK));
            scale[r * nb + b] = s;
            for (int i = 0; i < RW_MXFP8_BLOCK; i++)
                qb[i] = rw_mxfp8_quantize_elem(rw_bf16_to_f32(xb[i]), s);
        }
    }
    return RW_OK;
}

void rw_dequant_mxfp8_ref(const uint8_t *q, const uint8_t *scale, int64_t rows, int64_t cols,
                          float *out) {
    int64_t nb = cols / RW_MXFP8_BLOCK;
    for (int64_t r = 0; r < rows; r++)
        for (int64_t c = 0; c < cols; c++)
            out[r * cols + c] = rw_e4m3_to_f32(q[r * cols + c]) *
                                rw_ue8m0_to_f32(scale[r * nb + c / RW_MXFP8_BLOCK]);
}

rw_status rw_quant_fp8_block_ref(const uint16_t *x_bf16, int64_t rows, int64_t cols, uint8_t *q,
                                 float *scale, rw_err *err) {
    RW_CHECK(check_args("fp8-block quantize", x_bf16, rows, cols, q, scale, err));
    const int64_t B = RW_FP8_BLOCK;
    int64_t sr = (rows + B - 1) / B, sc = (cols + B - 1) / B;
    for (int64_t br = 0; br < sr; br++) {
        int64_t r0 = br * B, r1 = r0 + B < rows ? r0 + B : rows;
        for (int64_t bc = 0; bc < sc; bc++) {
            int64_t c0 = bc * B, c1 = c0 + B < cols ? c0 + B : cols;
            uint16_t m = 0;
            for (int64_t r = r0; r < r1; r++)
                for (int64_t c = c0; c < c1; c++) {
                    uint16_t a = x_bf16[r * cols + c] & 0x7fffu;
                    if (a > m) m = a;
                }
            float s = rw_fp8_block_scale_from_amax(rw_bf16_to_f32(m));
            scale[br * sc + bc] = s;
            for (int64_t r = r0; r < r1; r++)
                for (int64_t c = c0; c < c1; c++)
                    q[r * cols + c] =
                        rw_fp8_block_quantize_elem(rw_bf16_to_f32(x_bf16[r * cols + c]), s);
        }
    }
    return RW_OK;
}

void rw_dequant_fp8_block_ref(const uint8_t *q, const float *scale, int64_t rows, int64_t cols,
                              float *out) {
    int64_t sc = (cols + RW_FP8_BLOCK - 1) / RW_FP8_BLOCK;
    for (int64_t r = 0; r < rows; r++)
        for (int64_t c = 0; c < cols; c++)
            out[r * cols + c] =
                rw_e4m3_to_f32(q[r * cols + c]) * scale[(r / RW_FP8_BLOCK) * sc + c / RW_FP8_BLOCK];
}

#ifndef RW_HAVE_CUDA
rw_status rw_quant_mxfp8_cuda(const uint16_t *x_bf16, int64_t rows, int64_t cols, uint8_t *q,
                              uint8_t *scale, rw_stream s, rw_err *err) {
    RW_FAIL(err, RW_E_NO_DEVICE, "rw_quant_mxfp8_cuda: built without CUDA");
}
rw_status rw_quant_fp8_block_cuda(const uint16_t *x_bf16, int64_t rows, int64_t cols, uint8_t *q,
                                  float *scale, rw_stream s, rw_err *err) {
    RW_FAIL(err, RW_E_NO_DEVICE, "rw_quant_fp8_block_cuda: built without CUDA");
}
rw_status rw_dequant_mxfp8_cuda(const uint8_t *q, const uint8_t *scale, int64_t rows, int64_t cols,
                                uint16_t *out_bf16, rw_stream s, rw_err *err) {
    RW_FAIL(err, RW_E_NO_DEVICE, "rw_dequant_mxfp8_cuda: built without CUDA");
}
rw_status rw_dequant_fp8_block_cuda(const uint8_t *q, const float *scale, int64_t rows,
                                    int64_t cols, uint16_t *out_bf16, rw_stream s, rw_err *err) {
    RW_FAIL(err, RW_E_NO_DEVICE, "rw_dequant_fp8_block_cuda: built without CUDA");
}
#endif
