/* e4m3.cuh - e4m3 codes to bf16 on the device, shared by the dense dequantization kernel
 * (quant.cu) and the quantized expert tiles (moe/expert_gemm.cu). CUDA C++ only. */
#ifndef RW_QUANT_E4M3_CUH
#define RW_QUANT_E4M3_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <stdint.h>

/* The two e4m3 codes in the low 16 bits of `pair` times `sc`, as bf16x2: the hardware e4m3x2 ->
 * half2 conversion is exact, the fp32 product is rounded once, then to bf16 (round to nearest
 * even): the bits of rw_f32_to_bf16(rw_e4m3_to_f32(code) * sc) for every finite code. NaN codes
 * come out NaN with the hardware's payload, not the CPU reference's. */
__device__ __forceinline__ __nv_bfloat162 rw_e4m3x2_to_bf16x2(uint32_t pair, float sc) {
    const __nv_fp8x2_storage_t pr = (__nv_fp8x2_storage_t)(pair & 0xffffu);
    const float2 f = __half22float2(__half2(__nv_cvt_fp8x2_to_halfraw2(pr, __NV_E4M3)));
    return __floats2bfloat162_rn(f.x * sc, f.y * sc);
}

#endif
