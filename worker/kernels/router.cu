/* router.cu - the router logits kernel (router.h); reference in router_ref.c. */
#include <cuda_runtime.h>
#include <stdint.h>

#include "device.cuh"
#include "router.h"

/* Router logits: y [n, E] = x [n, H] . w[E, H]^T in fp32. A warp computes RT_EW experts for the
 * RT_TT tokens of its CTA: lane l accumulates columns [c + 8l, c + 8l + 8) of every 256-column
 * chunk c in order (one 16-byte load of 8 bf16 weights per expert, two of x per token), then a
 * fixed xor tree adds the lanes. The summation order of an output depends on H only, so a token's
 * logits are the same bits in any batch; a decode batch is spread over E / (RT_WARPS * RT_EW)
 * CTAs per RT_TT tokens instead of one CTA walking H in 64 dependent steps. */
#define RT_WARPS 8
#define RT_EW 2
#define RT_TT 8
__global__ void __launch_bounds__(RT_WARPS * 32)
    router_kernel(const float *__restrict__ x, const uint16_t *__restrict__ w, int64_t n, int64_t E,
                  int64_t H, float *__restrict__ y) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int64_t t0 = (int64_t)blockIdx.x * RT_TT;
    const int64_t e0 = ((int64_t)blockIdx.y * RT_WARPS + warp) * RT_EW;
    if (e0 >= E) return; /* whole warps; no block-wide barrier below */
    const int nt = (int)(n - t0 < RT_TT ? n - t0 : RT_TT);
    float acc[RT_EW][RT_TT];
#pragma unroll
    for (int a = 0; a < RT_EW; a++)
#pragma unroll
        for (int b = 0; b < RT_TT; b++)
            acc[a][b] = 0.0f;
    for (int64_t c = (int64_t)lane * 8; c < H; c += 256) {
        float wv[RT_EW][8];
#pragma unroll
        for (int a = 0; a < RT_EW; a++) {
            uint4 u = make_uint4(0, 0, 0, 0);
            if (e0 + a < E) u = __ldg((const uint4 *)(w + (e0 + a) * H + c));
            const uint32_t uw[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
            for (int i = 0; i < 4; i++) {
                wv[a][2 * i] = __uint_as_float(uw[i] << 16);
                wv[a][2 * i + 1] = __uint_as_float(uw[i] & 0xffff0000u);
            }
        }
#pragma unroll
        for (int b = 0; b < RT_TT; b++) {
            if (b >= nt) break; /* uniform over the warp */
            const float4 p0 = *(const float4 *)(x + (t0 + b) * H + c);
            const float4 p1 = *(const float4 *)(x + (t0 + b) * H + c + 4);
            const float xv[8] = {p0.x, p0.y, p0.z, p0.w, p1.x, p1.y, p1.z, p1.w};
#pragma unroll
            for (int a = 0; a < RT_EW; a++) {
                float sum = acc[a][b];
#pragma unroll
                for (int i = 0; i < 8; i++)
                    sum = fmaf(xv[i], wv[a][i], sum);
                acc[a][b] = sum;
            }
        }
    }
#pragma unroll
    for (int a = 0; a < RT_EW; a++)
#pragma unroll
        for (int b = 0; b < RT_TT; b++) {
            float v = acc[a][b];
#pragma unroll
            for (int o = 16; o > 0; o >>= 1)
                v += __shfl_xor_sync(0xffffffffu, v, o);
            if (lane == 0 && b < nt && e0 + a < E) y[(t0 + b) * E + e0 + a] = v;
        }
}

extern "C" rw_status rw_k_router(const float *x, const uint16_t *w, int64_t n, int64_t E, int64_t H,
                                 float *y, rw_stream s, rw_err *err) {
    if (n <= 0) return RW_OK;
    if (H % 8 || ((uintptr_t)x | (uintptr_t)w) % 16)
        RW_FAIL(err, RW_E_UNSUPPORTED, "router: H = %lld (needs %% 8) or unaligned inputs",
                (long long)H);
    dim3 grid((unsigned)((n + RT_TT - 1) / RT_TT),
              (unsigned)((E + RT_WARPS * RT_EW - 1) / (RT_WARPS * RT_EW)));
    router_kernel<<<grid, RT_WARPS * 32, 0, (cudaStream_t)s>>>(x, w, n, E, H, y);
    return LAUNCH_CHECK(s, "router");
}
