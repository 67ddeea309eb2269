/* mma.cuh - the PTX wrappers rw's tensor-core and streaming kernels share (CUDA C++ only, sm_80+).
 *
 * One copy for every kernel family (GEMMs, experts, attention), so an instruction's operand order
 * or a swizzle rule is written once. Each wrapper is a single instruction; what they compute is
 * the PTX ISA's definition, restated here only where the caller must know a layout.
 *
 * Shared-memory tiles of bf16 rows are stored as 128-byte rows of eight 16-byte chunks with chunk
 * c of row r at c ^ (r & 7) (rw_swz128): eight consecutive rows read by ldmatrix then fall in
 * eight different bank groups, so a warp's ldmatrix is free of bank conflicts. */
#ifndef RW_MMA_CUH
#define RW_MMA_CUH

#include <stdint.h>

/* Shared-state-space address of a generic pointer into shared memory. */
__device__ __forceinline__ uint32_t rw_smem_u32(const void *p) {
    return (uint32_t)__cvta_generic_to_shared(p);
}

/* Asynchronous 16-byte global -> shared copy (L2 only, .cg). The first src_bytes (0 or 16) bytes
 * are read; the rest of the 16 are written as zeros, so out-of-range rows cost no load. */
__device__ __forceinline__ void rw_cp_async16(void *dst, const void *src, int src_bytes) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(rw_smem_u32(dst)),
                 "l"(src), "r"(src_bytes));
}
/* Same, all 16 bytes read. */
__device__ __forceinline__ void rw_cp_async16_full(void *dst, const void *src) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(rw_smem_u32(dst)), "l"(src));
}
/* Closes the group of copies issued since the last commit. */
__device__ __forceinline__ void rw_cp_async_commit() {
    asm volatile("cp.async.commit_group;\n" ::);
}
/* Waits until at most N committed groups are still in flight (N = 0: all landed). */
template <int N> __device__ __forceinline__ void rw_cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

/* ldmatrix: four (x4) or two (x2) 8x8 b16 matrices from shared memory; lane i supplies the row
 * address of row i % 8 of matrix i / 8. Register j of a lane holds matrix j's elements
 * (lane / 4, 2 * (lane % 4) + {0, 1}). */
__device__ __forceinline__ void rw_ldsm_x4(uint32_t &r0, uint32_t &r1, uint32_t &r2, uint32_t &r3,
                                           const void *p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
                 : "r"(rw_smem_u32(p)));
}
__device__ __forceinline__ void rw_ldsm_x2(uint32_t &r0, uint32_t &r1, const void *p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0,%1}, [%2];\n"
                 : "=r"(r0), "=r"(r1)
                 : "r"(rw_smem_u32(p)));
}
/* The transposing forms: each 8x8 matrix is delivered transposed (for a B operand stored
 * row-major along N, such as V in attention). */
__device__ __forceinline__ void rw_ldsm_x4_trans(uint32_t &r0, uint32_t &r1, uint32_t &r2,
                                                 uint32_t &r3, const void *p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
                 : "r"(rw_smem_u32(p)));
}
__device__ __forceinline__ void rw_ldsm_x2_trans(uint32_t &r0, uint32_t &r1, const void *p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0,%1}, [%2];\n"
                 : "=r"(r0), "=r"(r1)
                 : "r"(rw_smem_u32(p)));
}

/* c[0..4) += A (16x16, row-major fragments a[0..4)) . B (16x8, column fragments b0, b1), bf16 in,
 * fp32 accumulate: D = A.B + C computed per output element as the hardware defines (the order of
 * the 16 products within one instruction is fixed by the hardware, the same in every call). Lane
 * layout of c: (lane / 4 + 8 * (i / 2), 2 * (lane % 4) + i % 2) for c[i]. */
__device__ __forceinline__ void rw_mma_bf16_16816(float *c, const uint32_t *a, uint32_t b0,
                                                  uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, "
                 "{%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/* Byte offset of 16-byte chunk c (0..7) of row r in a swizzled [rows][128 B] tile. */
__device__ __forceinline__ int rw_swz128(int r, int c) {
    return r * 128 + ((c ^ (r & 7)) << 4);
}

/* Two fp32 values as one register of two bf16 (lo in the low half), round to nearest even. */
__device__ __forceinline__ uint32_t rw_pack_bf16x2(float lo, float hi) {
    uint32_t r;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}

#endif /* RW_MMA_CUH */
