/* mx_fragments.cuh - an mxfp8 expert tile's K block, from its e4m3 stage and the staged UE8M0
 * scales straight into a thread's wgmma A fragments (bf16, registers), for the register-fragment
 * form of moe/expert_gemm.cu. CUDA C++ only.
 *
 * The stage is the tile's 128 weight rows x 64 codes, 64 bytes a row, its four 16-byte chunks
 * swizzled: chunk c of row r at c ^ ((r / 2) % 4) (what the loads write). A thread's fragments
 * are those of rw_wgmma_bf16_rs: in each of its m64 blocks mt, rows lane / 4 and + 8 of its
 * warp's 16, columns 2 (lane % 4) and + 1 and the same 8 further, for each k16 step ks.
 *
 * Per row and k16 step the thread reads the row's 16 codes of that step at once (the eight rows
 * of a warp then read 128 different bytes, which the swizzle puts on all banks), and one prmt
 * picks its two codes of a fragment register and sign-extends them for the conversion
 * (quant/e4m3.cuh). The values are the bits of the reference's bf16 dequantization, code times
 * 2^(s - 127) rounded once, so the MMAs see what the shared-memory form saw. */
#ifndef RW_MOE_MX_FRAGMENTS_CUH
#define RW_MOE_MX_FRAGMENTS_CUH

#include <stdint.h>

#include "e4m3.cuh"

/* Where a thread reads, worked out once a tile: NWG warpgroups of AM m64 blocks each (the tile's
 * 128 rows: AM 2 and one warpgroup, or AM 1 and two). k[ks]: byte offset in the stage of the
 * thread's first row's chunk ks (the swizzle of all its rows is the same: they are 8 and 64
 * apart); sc: byte offset of its first row's scales in the staged run (rw_moe_scale_swizzle with
 * the K block's part left out: (k / 4) 512 + (r % 32) 16 + (r / 32) 4 + k % 4). */
struct mx_frag_at {
    uint32_t k[4];
    uint32_t sc;
    int r; /* the first row, in the tile */
};
template <int NWG> __device__ __forceinline__ mx_frag_at mx_frag_setup(int warp, int lane) {
    const int r = (NWG == 1 ? 0 : (warp >> 2) * 64) + (warp & 3) * 16 + (lane >> 2);
    const uint32_t swz = (uint32_t)(lane >> 3) & 3u; /* (r / 2) % 4: r % 16 = lane / 4 */
    mx_frag_at at;
#pragma unroll
    for (int ks = 0; ks < 4; ks++)
        at.k[ks] = (uint32_t)r * 64 + (((uint32_t)ks ^ swz) << 4);
    at.sc = (uint32_t)(r % 32) * 16 + (uint32_t)(r / 32) * 4;
    at.r = r;
    return at;
}
/* The offsets of the thread's row i (i = 2 mt + h: block mt, h the + 8 row) from its first row,
 * in the stage and in the scale run: + 8 rows keeps r / 32 and adds 8 to r % 32 (< 32: r % 16
 * < 8 before), + 64 rows adds 2 to r / 32. Constants, so the reads take them as immediates. */
__device__ __forceinline__ constexpr int mx_row(int i) {
    return (i >> 1) * 64 + (i & 1) * 8;
}
__device__ __forceinline__ constexpr uint32_t mx_row_off(int i) {
    return (uint32_t)mx_row(i) * 64;
}
__device__ __forceinline__ constexpr uint32_t mx_sc_off(int i) {
    return (uint32_t)(i >> 1) * 8 + (uint32_t)(i & 1) * 128;
}

/* Whether every scale byte of the staged run (the tile's rows over all of K, `bytes` of them, a
 * multiple of 16 * MOE threads or not) is at most RW_E4M3_FAST_SCALE_MAX, agreed by the whole
 * CTA (a barrier): the K loop then takes the four-instruction conversion without a test a row.
 * rw's quantizer writes larger bytes only for blocks holding an inf or a NaN. */
__device__ __forceinline__ bool mx_scales_fast(const uint8_t *ssc, int64_t bytes, int tid,
                                               int nthreads) {
    uint32_t big = 0;
    for (int64_t q = tid; q < bytes / 16; q += nthreads) {
        const uint4 v = ((const uint4 *)ssc)[q];
        const uint32_t m = __vmaxu4(__vmaxu4(v.x, v.y), __vmaxu4(v.z, v.w));
        big |= __vcmpgtu4(m, RW_E4M3_FAST_SCALE_MAX * 0x01010101u);
    }
    return !__syncthreads_or(big != 0);
}

/* af[mt][ks][0..3] of K block kb of the stage at sa; FAST: every scale byte of the tile is at
 * most RW_E4M3_FAST_SCALE_MAX (mx_scales_fast). The block's two 32-column scale blocks are
 * adjacent bytes, the first for k16 steps 0 and 1, the second for 2 and 3. */
template <int AM, bool FAST>
__device__ __forceinline__ void mx_fragments(uint32_t (&af)[AM][4][4], const uint8_t *sa,
                                             const uint8_t *ssc, const mx_frag_at &at, int kb,
                                             int lane) {
    const uint32_t sel = rw_e4m3_pair_sel((uint32_t)lane & 3u);
    const uint8_t *sck = ssc + at.sc + (kb >> 1) * 512 + (kb & 1) * 2;
#pragma unroll
    for (int i = 0; i < 2 * AM; i++) {
        const int mt = i >> 1, h = i & 1;
        const uint32_t s2 = *(const uint16_t *)(sck + mx_sc_off(i));
        uint4 w[4];
#pragma unroll
        for (int ks = 0; ks < 4; ks++)
            w[ks] = *(const uint4 *)(sa + at.k[ks] + mx_row_off(i));
        if (FAST || max(s2 & 0xffu, s2 >> 8) <= RW_E4M3_FAST_SCALE_MAX) {
            uint32_t m[2];
            rw_ue8m0x2_bf16x2_muls(s2, m[0], m[1]);
#pragma unroll
            for (int ks = 0; ks < 4; ks++) {
                af[mt][ks][h] = rw_e4m3_pick2_to_bf16x2(w[ks].x, w[ks].y, sel, m[ks >> 1]);
                af[mt][ks][2 + h] = rw_e4m3_pick2_to_bf16x2(w[ks].z, w[ks].w, sel, m[ks >> 1]);
            }
        } else {
            /* scales past 2^127 x 2^-120 (blocks holding an inf or a NaN): the two codes, bytes
             * 2 (lane % 4) and + 1 of a word pair, through half and fp32 */
            const float f[2] = {rw_ue8m0_to_f32((uint8_t)(s2 & 0xffu)),
                                rw_ue8m0_to_f32((uint8_t)(s2 >> 8))};
            const uint32_t psel = 0x10u + 0x22u * ((uint32_t)lane & 3u);
#pragma unroll
            for (int ks = 0; ks < 4; ks++) {
                const __nv_bfloat162 lo =
                    rw_e4m3x2_to_bf16x2(__byte_perm(w[ks].x, w[ks].y, psel), f[ks >> 1]);
                const __nv_bfloat162 hi =
                    rw_e4m3x2_to_bf16x2(__byte_perm(w[ks].z, w[ks].w, psel), f[ks >> 1]);
                af[mt][ks][h] = *(const uint32_t *)&lo;
                af[mt][ks][2 + h] = *(const uint32_t *)&hi;
            }
        }
    }
}

/* The same for fp8-block (one fp32 scale a 128 x 128 block): row i's codes times f[i], the
 * block's scale for that row, through half and fp32 and rounded once to bf16, the bits of the
 * shared-memory form's dequantization (rw_e4m3x2_to_bf16x2 on the same pairs of codes). */
template <int AM>
__device__ __forceinline__ void fp8b_fragments(uint32_t (&af)[AM][4][4], const uint8_t *sa,
                                               const mx_frag_at &at, const float (&f)[2 * AM],
                                               int lane) {
    const uint32_t psel = 0x10u + 0x22u * ((uint32_t)lane & 3u);
#pragma unroll
    for (int i = 0; i < 2 * AM; i++) {
        const int mt = i >> 1, h = i & 1;
#pragma unroll
        for (int ks = 0; ks < 4; ks++) {
            const uint4 w = *(const uint4 *)(sa + at.k[ks] + mx_row_off(i));
            const __nv_bfloat162 lo = rw_e4m3x2_to_bf16x2(__byte_perm(w.x, w.y, psel), f[i]);
            const __nv_bfloat162 hi = rw_e4m3x2_to_bf16x2(__byte_perm(w.z, w.w, psel), f[i]);
            af[mt][ks][h] = *(const uint32_t *)&lo;
            af[mt][ks][2 + h] = *(const uint32_t *)&hi;
        }
    }
}

#endif
