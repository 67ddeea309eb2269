/* quant.cu - CUDA quantize / dequantize for MXFP8 (e4m3 + UE8M0 per 1x32 along K) and FP8
 * 128x128 block (e4m3 + fp32 scale). Every kernel calls the scalar rules of rw_quant.h that the
 * CPU reference in quant.c calls, so both produce the same bytes; the block amax is taken on the
 * magnitude bits as integers (NaN above inf above every finite value), as in quant.c.
 *
 * Each operation has a vector kernel (16-byte bf16 loads, 8-byte e4m3 stores) used when the
 * pointers are aligned for it, and a scalar kernel for any other alignment.
 */
#include <cuda_runtime.h>
#include <stdint.h>

#include "e4m3.cuh"

#include "rw_quant.h"

namespace {

constexpr int kThreads = 256;

/* Element-wise max over the lanes of `mask` whose xor partner at each offset below `width` is
 * also in the mask (groups of `width` consecutive lanes, width a power of two <= 32). */
template <int width> __device__ __forceinline__ uint32_t group_max(uint32_t v, uint32_t mask) {
#pragma unroll
    for (int o = width / 2; o > 0; o /= 2) {
        uint32_t w = __shfl_xor_sync(mask, v, o);
        v = w > v ? w : v;
    }
    return v;
}

__device__ __forceinline__ uint32_t abs_max8(const uint4 &v) {
    uint32_t w[4] = {v.x, v.y, v.z, v.w};
    uint32_t m = 0;
#pragma unroll
    for (int i = 0; i < 4; i++) {
        uint32_t lo = w[i] & 0x7fffu, hi = (w[i] >> 16) & 0x7fffu;
        m = lo > m ? lo : m;
        m = hi > m ? hi : m;
    }
    return m;
}

/* ---------------------------------------------------------------------------------------- */
/* MXFP8                                                                                     */
/* ---------------------------------------------------------------------------------------- */

/* Vector: thread g owns elements [8g, 8g+8); 4 consecutive lanes make one 32-element block,
 * whose flat index g/4 is also its index in the [rows, cols/32] scale matrix (cols % 32 == 0). */
__global__ void mxfp8_quant_vec(const uint4 *__restrict__ x, int64_t n8, uint2 *__restrict__ q,
                                uint8_t *__restrict__ scale) {
    int64_t g = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    bool live = g < n8;
    /* n8 is a multiple of 4, so a group of 4 lanes is either all live or all not. */
    uint32_t mask = __ballot_sync(0xffffffffu, live);
    if (!live) return;
    uint4 v = x[g];
    uint32_t m = group_max<4>(abs_max8(v), mask);
    uint8_t s = rw_mxfp8_scale_from_amax(rw_bf16_to_f32((uint16_t)m));
    if ((g & 3) == 0) scale[g >> 2] = s;
    uint32_t w[4] = {v.x, v.y, v.z, v.w};
    uint32_t out[2] = {0, 0};
#pragma unroll
    for (int i = 0; i < 8; i++) {
        uint16_t h = (uint16_t)(w[i / 2] >> (16 * (i % 2)));
        out[i / 4] |= (uint32_t)rw_mxfp8_quantize_elem(rw_bf16_to_f32(h), s) << (8 * (i % 4));
    }
    q[g] = make_uint2(out[0], out[1]);
}

/* Scalar: one warp per 32-element block, lane i holds element i. */
__global__ void mxfp8_quant_scalar(const uint16_t *__restrict__ x, int64_t nblocks,
                                   uint8_t *__restrict__ q, uint8_t *__restrict__ scale) {
    int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    int64_t b = t / 32;
    int lane = (int)(t % 32);
    if (b >= nblocks) return; /* whole warps leave together: blockDim is a multiple of 32 */
    uint16_t h = x[b * 32 + lane];
    uint32_t m = group_max<32>(h & 0x7fffu, 0xffffffffu);
    uint8_t s = rw_mxfp8_scale_from_amax(rw_bf16_to_f32((uint16_t)m));
    if (lane == 0) scale[b] = s;
    q[b * 32 + lane] = rw_mxfp8_quantize_elem(rw_bf16_to_f32(h), s);
}

__device__ __forceinline__ uint16_t mxfp8_deq(uint8_t qv, uint8_t s) {
    return rw_f32_to_bf16(rw_e4m3_to_f32(qv) * rw_ue8m0_to_f32(s));
}

/* Four e4m3 codes (one word) times the scale s (sc its value) as four bf16 (two words), the bits
 * of mxfp8_deq: rw_e4m3x4_to_bf16x4 for the scales it takes, rw_e4m3x2_to_bf16x2 for larger
 * ones. A word holding a NaN code (0x7f, 0xff) or a NaN scale (0xff) takes mxfp8_deq itself,
 * whose NaN bits are the CPU reference's (the hardware conversions give other NaN payloads). */
__device__ __forceinline__ uint2 mxfp8_deq4(uint32_t w, uint8_t s, float sc) {
    /* bytes 0x7f / 0xff: (byte & 0x7f) + 1 carries into bit 7, never into the next byte */
    if ((((w & 0x7f7f7f7fu) + 0x01010101u) & 0x80808080u) || s == 0xff) {
        uint32_t o[2];
        for (int i = 0; i < 2; i++) {
            const uint32_t x = w >> (16 * i);
            o[i] = (uint32_t)mxfp8_deq((uint8_t)x, s) |
                   ((uint32_t)mxfp8_deq((uint8_t)(x >> 8), s) << 16);
        }
        return make_uint2(o[0], o[1]);
    }
    if (s <= RW_E4M3_FAST_SCALE_MAX) return rw_e4m3x4_to_bf16x4(w, rw_ue8m0_bf16x2_mul(s));
    uint32_t o[2];
#pragma unroll
    for (int i = 0; i < 2; i++) {
        const __nv_bfloat162 b = rw_e4m3x2_to_bf16x2(w >> (16 * i), sc);
        o[i] = (uint32_t)__bfloat16_as_ushort(b.x) | ((uint32_t)__bfloat16_as_ushort(b.y) << 16);
    }
    return make_uint2(o[0], o[1]);
}

/* Vector: thread g turns 8 e4m3 bytes (one uint2) into 8 bf16 (one uint4). Measured on an H200
 * for a 4096 x 2048 weight: 8.4 us, against 15.6 with mxfp8_deq for every code; 32 codes a
 * thread (one wave, whose loads, arithmetic and stores cannot overlap) took 16.7 us with either
 * decode. */
__global__ void mxfp8_dequant_vec(const uint2 *__restrict__ q, const uint8_t *__restrict__ scale,
                                  int64_t n8, uint4 *__restrict__ out) {
    int64_t g = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (g >= n8) return;
    const uint2 v = q[g];
    const uint8_t s = scale[g >> 2];
    const float sc = rw_ue8m0_to_f32(s);
    const uint2 a = mxfp8_deq4(v.x, s, sc), b = mxfp8_deq4(v.y, s, sc);
    out[g] = make_uint4(a.x, a.y, b.x, b.y);
}

__global__ void mxfp8_dequant_scalar(const uint8_t *__restrict__ q,
                                     const uint8_t *__restrict__ scale, int64_t n,
                                     uint16_t *__restrict__ out) {
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    out[i] = mxfp8_deq(q[i], scale[i / 32]);
}

/* ---------------------------------------------------------------------------------------- */
/* FP8 128x128 block                                                                         */
/* ---------------------------------------------------------------------------------------- */

/* Block-wide max of one value per thread (kThreads threads); every thread gets the result. */
__device__ __forceinline__ uint32_t block_max(uint32_t v, uint32_t *smem /* [kThreads/32] */) {
    v = group_max<32>(v, 0xffffffffu);
    int warp = threadIdx.x / 32;
    if (threadIdx.x % 32 == 0) smem[warp] = v;
    __syncthreads();
    uint32_t m = 0;
#pragma unroll
    for (int i = 0; i < kThreads / 32; i++)
        m = smem[i] > m ? smem[i] : m;
    return m;
}

/* One CUDA block per 128x128 tile (blockIdx.x = tile_row * tiles_per_row + tile_col). Vector:
 * the tile is 128 rows x 16 chunks of 8 columns; thread t owns chunk t % 16 of rows
 * t / 16 + 16 j, j = 0..7, kept in registers between the amax and the quantize pass. A row's 16
 * chunks are 16 consecutive threads, 256 contiguous bytes. Needs cols % 8 == 0 so that a chunk
 * is wholly inside or wholly outside the matrix. */
__global__ void __launch_bounds__(kThreads)
    fp8_block_quant_vec(const uint16_t *__restrict__ x, int64_t rows, int64_t cols, int64_t tiles_c,
                        uint8_t *__restrict__ q, float *__restrict__ scale) {
    __shared__ uint32_t smem[kThreads / 32];
    int64_t tr = blockIdx.x / tiles_c, tc = blockIdx.x % tiles_c;
    int t = threadIdx.x;
    int64_t c0 = tc * RW_FP8_BLOCK + (t % 16) * 8;
    uint4 v[8];
    uint32_t m = 0;
#pragma unroll
    for (int j = 0; j < 8; j++) {
        int64_t r = tr * RW_FP8_BLOCK + t / 16 + 16 * j;
        v[j] = make_uint4(0, 0, 0, 0);
        if (r < rows && c0 < cols) {
            v[j] = *reinterpret_cast<const uint4 *>(x + r * cols + c0);
            uint32_t a = abs_max8(v[j]);
            m = a > m ? a : m;
        }
    }
    m = block_max(m, smem);
    float s = rw_fp8_block_scale_from_amax(rw_bf16_to_f32((uint16_t)m));
    if (t == 0) scale[blockIdx.x] = s;
#pragma unroll
    for (int j = 0; j < 8; j++) {
        int64_t r = tr * RW_FP8_BLOCK + t / 16 + 16 * j;
        if (r < rows && c0 < cols) {
            uint32_t w[4] = {v[j].x, v[j].y, v[j].z, v[j].w};
            uint32_t out[2] = {0, 0};
#pragma unroll
            for (int i = 0; i < 8; i++) {
                uint16_t h = (uint16_t)(w[i / 2] >> (16 * (i % 2)));
                out[i / 4] |= (uint32_t)rw_fp8_block_quantize_elem(rw_bf16_to_f32(h), s)
                              << (8 * (i % 4));
            }
            *reinterpret_cast<uint2 *>(q + r * cols + c0) = make_uint2(out[0], out[1]);
        }
    }
}

/* Scalar: thread t owns column t % 128 of rows t / 128 + 2 j; the tile is read twice (amax,
 * then quantize). Any cols, any alignment. */
__global__ void __launch_bounds__(kThreads)
    fp8_block_quant_scalar(const uint16_t *__restrict__ x, int64_t rows, int64_t cols,
                           int64_t tiles_c, uint8_t *__restrict__ q, float *__restrict__ scale) {
    __shared__ uint32_t smem[kThreads / 32];
    int64_t tr = blockIdx.x / tiles_c, tc = blockIdx.x % tiles_c;
    int t = threadIdx.x;
    int64_t c = tc * RW_FP8_BLOCK + t % 128;
    uint32_t m = 0;
    for (int j = 0; j < RW_FP8_BLOCK / 2; j++) {
        int64_t r = tr * RW_FP8_BLOCK + t / 128 + 2 * j;
        if (r < rows && c < cols) {
            uint32_t a = x[r * cols + c] & 0x7fffu;
            m = a > m ? a : m;
        }
    }
    m = block_max(m, smem);
    float s = rw_fp8_block_scale_from_amax(rw_bf16_to_f32((uint16_t)m));
    if (t == 0) scale[blockIdx.x] = s;
    for (int j = 0; j < RW_FP8_BLOCK / 2; j++) {
        int64_t r = tr * RW_FP8_BLOCK + t / 128 + 2 * j;
        if (r < rows && c < cols)
            q[r * cols + c] = rw_fp8_block_quantize_elem(rw_bf16_to_f32(x[r * cols + c]), s);
    }
}

__device__ __forceinline__ uint16_t fp8_deq(uint8_t qv, float s) {
    return rw_f32_to_bf16(rw_e4m3_to_f32(qv) * s);
}

/* Vector: thread g owns elements [8g, 8g+8) of the flat matrix; cols % 8 == 0 so the 8 share a
 * row and a 128-column block. */
__global__ void fp8_block_dequant_vec(const uint2 *__restrict__ q, const float *__restrict__ scale,
                                      int64_t cols, int64_t tiles_c, int64_t n8,
                                      uint4 *__restrict__ out) {
    int64_t g = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (g >= n8) return;
    int64_t e = g * 8, r = e / cols, c = e % cols;
    float s = scale[(r / RW_FP8_BLOCK) * tiles_c + c / RW_FP8_BLOCK];
    uint2 v = q[g];
    uint32_t w[2] = {v.x, v.y};
    uint32_t o[4];
#pragma unroll
    for (int i = 0; i < 4; i++) {
        uint8_t a = (uint8_t)(w[i / 2] >> (16 * (i % 2)));
        uint8_t b = (uint8_t)(w[i / 2] >> (16 * (i % 2) + 8));
        o[i] = (uint32_t)fp8_deq(a, s) | ((uint32_t)fp8_deq(b, s) << 16);
    }
    out[g] = make_uint4(o[0], o[1], o[2], o[3]);
}

__global__ void fp8_block_dequant_scalar(const uint8_t *__restrict__ q,
                                         const float *__restrict__ scale, int64_t cols,
                                         int64_t tiles_c, int64_t n, uint16_t *__restrict__ out) {
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    int64_t r = i / cols, c = i % cols;
    out[i] = fp8_deq(q[i], scale[(r / RW_FP8_BLOCK) * tiles_c + c / RW_FP8_BLOCK]);
}

/* ---------------------------------------------------------------------------------------- */

bool aligned(const void *p, uintptr_t a) {
    return ((uintptr_t)p & (a - 1)) == 0;
}

unsigned grid_for(int64_t n) {
    return (unsigned)((n + kThreads - 1) / kThreads);
}

rw_status check_shape(const char *what, int64_t rows, int64_t cols, const void *a, const void *b,
                      const void *c, rw_err *err) {
    if (rows < 0 || cols < 0)
        RW_FAIL(err, RW_E_SHAPE, "%s: negative shape [%lld, %lld]", what, (long long)rows,
                (long long)cols);
    if (rows > 0 && cols > 0 && (!a || !b || !c))
        RW_FAIL(err, RW_E_INVALID_ARG, "%s: NULL device pointer", what);
    /* Grids are 1-D with at most 2^31 - 1 blocks: 2^37 elements keeps every grid (and the tile
     * count) below it. */
    if (cols > 0 && rows > ((int64_t)1 << 37) / cols)
        RW_FAIL(err, RW_E_RANGE, "%s: [%lld, %lld] is too large for one launch", what,
                (long long)rows, (long long)cols);
    return RW_OK;
}

} // namespace

extern "C" rw_status rw_quant_mxfp8_cuda(const uint16_t *x_bf16, int64_t rows, int64_t cols,
                                         uint8_t *q, uint8_t *scale, rw_stream s, rw_err *err) {
    RW_CHECK(check_shape("mxfp8 quantize (cuda)", rows, cols, x_bf16, q, scale, err));
    if (cols % RW_MXFP8_BLOCK)
        RW_FAIL(err, RW_E_SHAPE, "mxfp8 quantize (cuda): K = %lld is not a multiple of %d",
                (long long)cols, RW_MXFP8_BLOCK);
    int64_t n = rows * cols;
    if (n == 0) return RW_OK;
    cudaStream_t st = (cudaStream_t)s;
    if (aligned(x_bf16, 16) && aligned(q, 8)) {
        int64_t n8 = n / 8;
        mxfp8_quant_vec<<<grid_for(n8), kThreads, 0, st>>>((const uint4 *)x_bf16, n8, (uint2 *)q,
                                                           scale);
    } else {
        mxfp8_quant_scalar<<<grid_for(n), kThreads, 0, st>>>(x_bf16, n / 32, q, scale);
    }
    return RW_LAUNCH_CHECK(s, "mxfp8 quantize", err);
}

extern "C" rw_status rw_dequant_mxfp8_cuda(const uint8_t *q, const uint8_t *scale, int64_t rows,
                                           int64_t cols, uint16_t *out_bf16, rw_stream s,
                                           rw_err *err) {
    RW_CHECK(check_shape("mxfp8 dequantize (cuda)", rows, cols, q, scale, out_bf16, err));
    if (cols % RW_MXFP8_BLOCK)
        RW_FAIL(err, RW_E_SHAPE, "mxfp8 dequantize (cuda): K = %lld is not a multiple of %d",
                (long long)cols, RW_MXFP8_BLOCK);
    int64_t n = rows * cols;
    if (n == 0) return RW_OK;
    cudaStream_t st = (cudaStream_t)s;
    if (aligned(q, 8) && aligned(out_bf16, 16)) {
        const int64_t n8 = n / 8;
        mxfp8_dequant_vec<<<grid_for(n8), kThreads, 0, st>>>((const uint2 *)q, scale, n8,
                                                             (uint4 *)out_bf16);
    } else {
        mxfp8_dequant_scalar<<<grid_for(n), kThreads, 0, st>>>(q, scale, n, out_bf16);
    }
    return RW_LAUNCH_CHECK(s, "mxfp8 dequantize", err);
}

extern "C" rw_status rw_quant_fp8_block_cuda(const uint16_t *x_bf16, int64_t rows, int64_t cols,
                                             uint8_t *q, float *scale, rw_stream s, rw_err *err) {
    RW_CHECK(check_shape("fp8-block quantize (cuda)", rows, cols, x_bf16, q, scale, err));
    if (rows == 0 || cols == 0) return RW_OK;
    int64_t tiles_c = (cols + RW_FP8_BLOCK - 1) / RW_FP8_BLOCK;
    int64_t tiles = (rows + RW_FP8_BLOCK - 1) / RW_FP8_BLOCK * tiles_c;
    cudaStream_t st = (cudaStream_t)s;
    if (cols % 8 == 0 && aligned(x_bf16, 16) && aligned(q, 8))
        fp8_block_quant_vec<<<(unsigned)tiles, kThreads, 0, st>>>(x_bf16, rows, cols, tiles_c, q,
                                                                  scale);
    else
        fp8_block_quant_scalar<<<(unsigned)tiles, kThreads, 0, st>>>(x_bf16, rows, cols, tiles_c, q,
                                                                     scale);
    return RW_LAUNCH_CHECK(s, "fp8-block quantize", err);
}

extern "C" rw_status rw_dequant_fp8_block_cuda(const uint8_t *q, const float *scale, int64_t rows,
                                               int64_t cols, uint16_t *out_bf16, rw_stream s,
                                               rw_err *err) {
    RW_CHECK(check_shape("fp8-block dequantize (cuda)", rows, cols, q, scale, out_bf16, err));
    int64_t n = rows * cols;
    if (n == 0) return RW_OK;
    int64_t tiles_c = (cols + RW_FP8_BLOCK - 1) / RW_FP8_BLOCK;
    cudaStream_t st = (cudaStream_t)s;
    if (cols % 8 == 0 && aligned(q, 8) && aligned(out_bf16, 16)) {
        int64_t n8 = n / 8;
        fp8_block_dequant_vec<<<grid_for(n8), kThreads, 0, st>>>((const uint2 *)q, scale, cols,
                                                                 tiles_c, n8, (uint4 *)out_bf16);
    } else {
        fp8_block_dequant_scalar<<<grid_for(n), kThreads, 0, st>>>(q, scale, cols, tiles_c, n,
                                                                   out_bf16);
    }
    return RW_LAUNCH_CHECK(s, "fp8-block dequantize", err);
}
