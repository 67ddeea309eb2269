/* e4m3.cuh - e4m3 codes to bf16 on the device, shared by the dense dequantization kernel
 * (quant.cu) and the quantized expert tiles (moe/expert_gemm.cu). CUDA C++ only. */
#ifndef RW_QUANT_E4M3_CUH
#define RW_QUANT_E4M3_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <stdint.h>

#include "rw_quant.h" /* RW_E4M3_FAST_SCALE_MAX */

/* The two e4m3 codes in the low 16 bits of `pair` times `sc`, as bf16x2: the hardware e4m3x2 ->
 * half2 conversion is exact, the fp32 product is rounded once, then to bf16 (round to nearest
 * even): the bits of rw_f32_to_bf16(rw_e4m3_to_f32(code) * sc) for every finite code. NaN codes
 * come out NaN with the hardware's payload, not the CPU reference's. */
__device__ __forceinline__ __nv_bfloat162 rw_e4m3x2_to_bf16x2(uint32_t pair, float sc) {
    const __nv_fp8x2_storage_t pr = (__nv_fp8x2_storage_t)(pair & 0xffffu);
    const float2 f = __half22float2(__half2(__nv_cvt_fp8x2_to_halfraw2(pr, __NV_E4M3)));
    return __floats2bfloat162_rn(f.x * sc, f.y * sc);
}

/* 2^(s - 7) in both halves of a bf16x2, for s <= RW_E4M3_FAST_SCALE_MAX: exponent field s + 120 */
__device__ __forceinline__ uint32_t rw_ue8m0_bf16x2_mul(uint32_t s) {
    return ((s + 120u) << 7) * 0x10001u;
}

/* The same for the two scale bytes of s2 (s0 in bits 0..7, s1 in 8..15), both at most
 * RW_E4M3_FAST_SCALE_MAX: one add for both (no carry: s + 120 < 256), one prmt and one shift
 * each */
__device__ __forceinline__ void rw_ue8m0x2_bf16x2_muls(uint32_t s2, uint32_t &m0, uint32_t &m1) {
    const uint32_t t = s2 + 0x7878u;
    m0 = __byte_perm(t, 0, 0x4040) << 7;
    m1 = __byte_perm(t, 0, 0x4141) << 7;
}

/* Four e4m3 codes (one word, code i in byte i) times 2^(s - 127) as four bf16 (two words, code i
 * in half i), given mul = rw_ue8m0_bf16x2_mul(s), s <= RW_E4M3_FAST_SCALE_MAX: the bits of
 * rw_f32_to_bf16(rw_e4m3_to_f32(code) * rw_ue8m0_to_f32(s)) for every finite code (NaN codes
 * come out finite). Four instructions a pair instead of six through half and fp32:
 * - prmt puts each code in a 16-bit lane over its sign replicated (0xff80 | mag for a negative
 *   code), the and keeps bit 11 (the sign) and bits 6..0 (the magnitude), the shift moves them to
 *   bits 15 and 10..4. Read as bf16 that lane is the code's value times 2^-120 exactly: the
 *   e4m3 exponent field lands in the low four bits of bf16's, the three mantissa bits at the top
 *   of bf16's seven, and e4m3 subnormals become bf16 subnormals with the same ratio.
 * - one bf16x2 multiply by 2^(s - 7), a power of two, then rounds the exact product once, as the
 *   reference rounds its exact fp32 product once to bf16 (bf16 arithmetic keeps subnormals). */
__device__ __forceinline__ uint32_t rw_e4m3_pick2_to_bf16x2(uint32_t a, uint32_t b, uint32_t sel,
                                                            uint32_t mul);
__device__ __forceinline__ uint2 rw_e4m3x4_to_bf16x4(uint32_t w, uint32_t mul) {
    return make_uint2(rw_e4m3_pick2_to_bf16x2(w, 0, 0x9180u, mul),
                      rw_e4m3_pick2_to_bf16x2(w, 0, 0xb3a2u, mul));
}

/* The prmt selector of rw_e4m3_pick2_to_bf16x2 for bytes 2 i and 2 i + 1 (i < 4) of the eight
 * bytes a, b: each byte's nibble (2 i, 2 i + 1) followed by the same with bit 3, which
 * replicates that byte's sign over the next byte */
__device__ __forceinline__ uint32_t rw_e4m3_pair_sel(uint32_t i) {
    return 0x9180u + 0x2222u * i;
}

/* Two codes of the eight bytes of a (bytes 0-3) and b (4-7), picked by a selector of
 * rw_e4m3_pair_sel, times 2^(s - 127) as one bf16x2: rw_e4m3x4_to_bf16x4's arithmetic for one
 * pair. The selector may be a register: a thread picks its own pair out of a shared-memory
 * vector with the instruction that also sign-extends it. */
__device__ __forceinline__ uint32_t rw_e4m3_pick2_to_bf16x2(uint32_t a, uint32_t b, uint32_t sel,
                                                            uint32_t mul) {
    uint32_t x;
    asm("prmt.b32 %0, %1, %2, %3;" : "=r"(x) : "r"(a), "r"(b), "r"(sel));
    x = (x & 0x087f087fu) << 4;
    const __nv_bfloat162 v = __hmul2_rn(*(const __nv_bfloat162 *)&x, *(const __nv_bfloat162 *)&mul);
    return *(const uint32_t *)&v;
}

#endif
