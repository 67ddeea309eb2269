/* rw_quant.h - the quant module's public contract: MXFP8 (e4m3 + UE8M0 per 1x32 along K) and
 * FP8 128x128 block (e4m3 + fp32 scale) quantize / dequantize with a CPU reference and CUDA
 * kernels that agree byte for byte, and the per-layer precision policy from quantization_config.
 *
 * Formats: docs/LAYOUT.md section 5. The scalar rules below are host+device inline so every
 * quantizer (CPU reference, CUDA kernel, the fused pack-and-quantize scatter in moe/) computes
 * the same bytes.
 */
#ifndef RW_QUANT_H
#define RW_QUANT_H

#include "rw_core.h"

#ifdef __cplusplus
extern "C" {
#endif

#define RW_MXFP8_BLOCK 32   /* elements per UE8M0 scale, along K */
#define RW_FP8_BLOCK 128    /* rows and columns per fp32 scale */
#define RW_E4M3_MAX 448.0f
/* Scale bytes s whose power of two 2^(s - 7) is a finite normal bf16: the ones the device's
 * four-instruction e4m3 -> bf16 conversion takes (e4m3.cuh); larger ones go through fp32. rw's
 * quantizer writes larger bytes only for blocks holding an inf (254) or a NaN (255, the only
 * blocks with NaN codes). */
#define RW_E4M3_FAST_SCALE_MAX 134u

/* Smallest power-of-two exponent e with amax <= 448 * 2^e, as a UE8M0 byte (e + 127), clamped to
 * [0, 254]. amax == 0 (an all-zero block) gives 0, the smallest scale; zeros stay zeros. NaN amax
 * gives 0xff. Exact integer logic, no log2: identical on host and device. */
RW_HD uint8_t rw_mxfp8_scale_from_amax(float amax) {
    uint32_t a = rw_f32_bits(amax) & 0x7fffffffu;
    if (a > 0x7f800000u) return 0xffu;
    if (a == 0) return 0;
    if (a == 0x7f800000u) return 254;
    /* amax = m * 2^E with m in [1, 2) for normals; 448 = 1.75 * 2^8. Candidate e = E - 8, and
     * e + 1 if m > 1.75. For subnormal amax the candidate is below the clamp anyway. */
    int E = (int)(a >> 23) - 127;
    int e;
    if ((a >> 23) == 0) {
        e = -127; /* subnormal: tiny, the smallest scale already covers it */
    } else {
        uint32_t man = a & 0x7fffffu;
        e = E - 8 + (man > 0x600000u ? 1 : 0);
    }
    int b = e + 127;
    if (b < 0) b = 0;
    if (b > 254) b = 254;
    return (uint8_t)b;
}

/* x / 2^(b-127) as an exact power-of-two multiply (correctly rounded, no flush to zero), then e4m3
 * (saturating, round to nearest even). */
RW_HD uint8_t rw_mxfp8_quantize_elem(float x, uint8_t scale_b) {
    /* 2^(127-b): for b >= 1 this is a normal float 2^(127-b) in [2^-127.., 2^126]; split into two
     * exact factors to stay in range. */
    int sh = 127 - (int)scale_b; /* in [-127, 127] */
    int s1 = sh / 2, s2 = sh - s1;
    float f1 = rw_bits_f32((uint32_t)(s1 + 127) << 23);
    float f2 = rw_bits_f32((uint32_t)(s2 + 127) << 23);
    return rw_f32_to_e4m3((x * f1) * f2);
}

/* FP8 block: scale = amax / 448 (a dequantization multiplier, stored as weight_scale_inv).
 * An all-zero block gets scale 1.0 so that 1/scale stays finite; its values stay zero. */
RW_HD float rw_fp8_block_scale_from_amax(float amax) {
    return amax > 0.0f ? amax / RW_E4M3_MAX : 1.0f;
}
RW_HD uint8_t rw_fp8_block_quantize_elem(float x, float scale) { return rw_f32_to_e4m3(x / scale); }

/* ------------------------------------------------------------------------------------------ */
/* Whole-tensor quantize / dequantize. `x` is [rows, cols] row-major bf16 (K = cols).           */
/* ------------------------------------------------------------------------------------------ */

/* Special values. Both quantizers take a block's amax on the magnitude bits as integers, so a NaN
 * wins over inf and inf over every finite value (fmaxf would drop the NaN).
 * - MXFP8: a block holding a NaN gets scale byte 0xff (UE8M0 NaN) and dequantizes to NaN
 *   throughout (its NaN codes are 0x7f / 0xff). A block holding an inf (no NaN) gets scale 2^127
 *   (byte 254): the inf saturates to +-448 and dequantizes to +-inf (448 x 2^127 is past fp32);
 *   its finite values are quantized with that scale, so all below 2^117 become (signed) zero.
 *   Dequantized values are exact (a 4-bit mantissa times a power of two) except past the fp32
 *   range: a finite bf16 within 2^-5 of 2^128 rounds up to 256 x 2^120 = 2^128 = inf.
 * - FP8 block: a block holding a NaN gets scale 1.0 (rw_fp8_block_scale_from_amax's
 *   non-positive branch): its NaNs encode as NaN and its other values are quantized with scale
 *   1.0, saturating at +-448. A block holding an inf (no NaN) gets scale inf and dequantizes to
 *   NaN throughout (0 x inf, NaN x inf).
 * An all-zero block: MXFP8 scale byte 0 (2^-127), FP8-block scale 1.0; zeros keep their sign. */

/* MXFP8: q [rows, cols] e4m3, scale [rows, cols/32] UE8M0. cols % 32 == 0. */
rw_status rw_quant_mxfp8_ref(const uint16_t *x_bf16, int64_t rows, int64_t cols, uint8_t *q,
                             uint8_t *scale, rw_err *err);
void rw_dequant_mxfp8_ref(const uint8_t *q, const uint8_t *scale, int64_t rows, int64_t cols,
                          float *out);
/* FP8 block: q [rows, cols] e4m3, scale [ceil(rows/128), ceil(cols/128)] fp32. Partial edge
 * blocks take the amax of the elements they hold. */
rw_status rw_quant_fp8_block_ref(const uint16_t *x_bf16, int64_t rows, int64_t cols, uint8_t *q,
                                 float *scale, rw_err *err);
void rw_dequant_fp8_block_ref(const uint8_t *q, const float *scale, int64_t rows, int64_t cols,
                              float *out);

/* CUDA versions: same arguments, device pointers, on `s`. RW_E_NO_DEVICE without CUDA. */
rw_status rw_quant_mxfp8_cuda(const uint16_t *x_bf16, int64_t rows, int64_t cols, uint8_t *q,
                              uint8_t *scale, rw_stream s, rw_err *err);
rw_status rw_quant_fp8_block_cuda(const uint16_t *x_bf16, int64_t rows, int64_t cols, uint8_t *q,
                                  float *scale, rw_stream s, rw_err *err);
/* Dequantize to bf16 on the device (for weight-only use of quantized layers on Hopper). */
rw_status rw_dequant_mxfp8_cuda(const uint8_t *q, const uint8_t *scale, int64_t rows, int64_t cols,
                                uint16_t *out_bf16, rw_stream s, rw_err *err);
rw_status rw_dequant_fp8_block_cuda(const uint8_t *q, const float *scale, int64_t rows,
                                    int64_t cols, uint16_t *out_bf16, rw_stream s, rw_err *err);

/* ------------------------------------------------------------------------------------------ */
/* Precision policy                                                                             */
/* ------------------------------------------------------------------------------------------ */
typedef enum rw_wfmt {
    RW_WFMT_BF16 = 1,
    RW_WFMT_MXFP8 = 2,
    RW_WFMT_FP8_BLOCK = 3,
} rw_wfmt;

const char *rw_wfmt_str(rw_wfmt f); /* "bf16", "mxfp8", "fp8-block" */

/* The storage format of a canonical weight under cfg->quant: BF16 for never-quantized kinds
 * (norms, embeddings, router, lm_head), for K % 32 != 0, and for names matching a
 * modules_to_not_convert prefix on a dotted boundary ("model.layers.4." does not match layer 40);
 * otherwise the config's method. */
rw_wfmt rw_quant_policy(const rw_config *cfg, const rw_wname *w);
/* True if `name` matches any modules_to_not_convert entry on a dotted boundary. */
bool rw_quant_not_convert_match(const rw_quant_config *q, const char *name);
/* Shape of the scale tensor stored beside a quantized weight of shape [rows, cols]. */
void rw_quant_scale_shape(rw_wfmt f, int64_t rows, int64_t cols, int64_t out_shape[2]);
rw_dtype rw_quant_scale_dtype(rw_wfmt f); /* U8 for mxfp8, F32 for fp8-block */

#ifdef __cplusplus
}
#endif

#endif /* RW_QUANT_H */
