/* tma.cuh - the Tensor Memory Accelerator (sm_90) for kernels that stream 2-D bf16 tiles into
 * shared memory (CUDA C++ only): the host-side tensor map of a row-major matrix, and the device
 * wrappers of the bulk tensor copy and of the shared-memory barrier it completes.
 *
 * Why: a cp.async pipeline spends instructions on every 16-byte chunk (its address, its bounds,
 * its swizzle); the dense GEMM's 128 x 128 tiles spent about 350 instructions a warp on each
 * 64-column stage, against 8 wgmma (ncu on an H200, docs/BENCHMARKS.md). One thread issues a
 * tensor copy for a whole tile instead, and the copy engine applies the bounds (rows and columns
 * past the matrix are written as zeros) and the 128-byte swizzle that rw_swz128 describes
 * (mma.cuh), so the tiles land exactly where the cp.async pipeline put them. */
#ifndef RW_TMA_CUH
#define RW_TMA_CUH

#include <cuda.h>
#include <cuda_runtime.h>
#include <cudaTypedefs.h>
#include <stdint.h>

#include "mma.cuh"

/* ----------------------------------------------------------------------------------------- */
/* host                                                                                        */
/* ----------------------------------------------------------------------------------------- */
/* The driver's tensor-map encoder, found once through the runtime (no link against the driver
 * library; a function-local static, so concurrent first callers see one lookup); NULL where the
 * driver has none. */
static inline PFN_cuTensorMapEncodeTiled_v12000 rw_tma_encoder(void) {
    static const PFN_cuTensorMapEncodeTiled_v12000 fn = [] {
        void *p = NULL;
        cudaDriverEntryPointQueryResult q;
        if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault,
                                             &q) == cudaSuccess &&
            q == cudaDriverEntryPointSuccess)
            return (PFN_cuTensorMapEncodeTiled_v12000)p;
        (void)cudaGetLastError();
        return (PFN_cuTensorMapEncodeTiled_v12000)NULL;
    }();
    return fn;
}

/* The tensor map of a bf16 array of `rank` (2..5) dimensions, innermost first: dims[0] elements
 * (64: 128-byte rows) of contiguous bf16, then dims[i] steps of stride[i - 1] bytes (multiples of
 * 16); boxes of box[i] elements, written to shared memory with the 128-byte swizzle, elements
 * past the array as zeros. false when the driver cannot encode it. No L2 promotion: the boxes
 * are whole 128-byte rows already, and asking for 256-byte promotion made a batch-1 step 0.5 to
 * 1.2% slower on an H200 (two sessions, two runs each; nothing at batch 8 or 256;
 * docs/BENCHMARKS.md, twenty-third and twenty-fourth sessions). */
static inline bool rw_tma_map_bf16_nd(CUtensorMap *map, const void *base, int rank,
                                      const uint64_t *dims, const uint64_t *stride,
                                      const uint32_t *box) {
    PFN_cuTensorMapEncodeTiled_v12000 enc = rw_tma_encoder();
    if (!enc || !base || rank < 2 || rank > 5 || (uintptr_t)base % 16) return false;
    cuuint64_t d[5], st[4];
    cuuint32_t b[5], e[5];
    for (int i = 0; i < rank; i++) {
        d[i] = dims[i];
        b[i] = box[i];
        e[i] = 1;
        if (i) st[i - 1] = stride[i - 1];
    }
    return enc(map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, (cuuint32_t)rank, (void *)base, d, st, b, e,
               CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
               CU_TENSOR_MAP_L2_PROMOTION_NONE, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

/* The tensor map of a bf16 matrix [rows, cols] (row-major, rows 16-byte aligned: cols % 8 == 0)
 * whose copies are boxes of 64 columns (128 bytes) by box_rows rows, written to shared memory
 * with the 128-byte swizzle; elements past the matrix are copied as zeros. false when the driver
 * cannot encode it (the caller then keeps its cp.async form). */
static inline bool rw_tma_map_bf16(CUtensorMap *map, const void *base, uint64_t rows, uint64_t cols,
                                   uint32_t box_rows) {
    if (cols % 8 || box_rows < 1 || box_rows > 256) return false;
    const uint64_t dims[2] = {cols, rows}, stride[1] = {cols * 2};
    const uint32_t box[2] = {64, box_rows};
    return rw_tma_map_bf16_nd(map, base, 2, dims, stride, box);
}

/* ----------------------------------------------------------------------------------------- */
/* device (sm_90; the wrappers are empty on other architectures, whose kernels never take the   */
/* tensor-copy form: the launchers pick it only on builds for sm_90a)                          */
/* ----------------------------------------------------------------------------------------- */
/* Initializes the shared-memory barrier *bar for `count` arrivals a phase. One thread; then
 * rw_mbar_init_fence and a CTA barrier before any thread uses it. */
__device__ __forceinline__ void rw_mbar_init(uint64_t *bar, int count) {
#if RW_WGMMA_DEVICE
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(rw_smem_u32(bar)), "r"(count)
                 : "memory");
#endif
}
/* Makes the initialized barriers visible to the tensor copies (the async proxy). */
__device__ __forceinline__ void rw_mbar_init_fence() {
#if RW_WGMMA_DEVICE
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
#endif
}
/* One arrival on *bar that also announces `bytes` of tensor copies completing on it: the phase
 * completes when every arrival is in and those bytes have landed. */
__device__ __forceinline__ void rw_mbar_expect_tx(uint64_t *bar, uint32_t bytes) {
#if RW_WGMMA_DEVICE
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(rw_smem_u32(bar)),
                 "r"(bytes)
                 : "memory");
#endif
}
/* One plain arrival on *bar (an empty barrier's release: the arriving warp is done with the
 * stage it guards). */
__device__ __forceinline__ void rw_mbar_arrive(uint64_t *bar) {
#if RW_WGMMA_DEVICE
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(rw_smem_u32(bar)) : "memory");
#endif
}
/* An arrival on *bar that fires once every cp.async this thread issued before it has landed
 * (.noinc: the barrier's count includes it). A full barrier of a cp.async stage: each copying
 * thread arrives once a phase, after its copies of that stage; the phase completes when all of
 * them have landed, and a thread that waits on it sees their bytes. */
__device__ __forceinline__ void rw_cp_async_mbar_arrive(uint64_t *bar) {
#if RW_WGMMA_DEVICE
    asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(rw_smem_u32(bar))
                 : "memory");
#endif
}
/* Waits until the phase of *bar with parity `parity` (0 for its first phase, then 1, 0, ...)
 * has completed; the copies completing on it are then visible to this thread and to wgmma. */
__device__ __forceinline__ void rw_mbar_wait(uint64_t *bar, uint32_t parity) {
#if RW_WGMMA_DEVICE
    asm volatile("{\n"
                 ".reg .pred p;\n"
                 "RW_MBAR_WAIT:\n"
                 "mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n"
                 "@!p bra RW_MBAR_WAIT;\n"
                 "}\n" ::"r"(rw_smem_u32(bar)),
                 "r"(parity)
                 : "memory");
#endif
}
/* Copies the box of `map` at column c0, row c1 to shared memory at dst (1024-byte aligned for
 * the swizzle), completing its bytes on *bar. One thread issues it. */
__device__ __forceinline__ void rw_tma_load_2d(void *dst, const CUtensorMap *map, uint64_t *bar,
                                               int c0, int c1) {
#if RW_WGMMA_DEVICE
    asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes "
                 "[%0], [%1, {%2, %3}], [%4];\n" ::"r"(rw_smem_u32(dst)),
                 "l"(map), "r"(c0), "r"(c1), "r"(rw_smem_u32(bar))
                 : "memory");
#endif
}

/* The 4-D form: the box at coordinates (c0, c1, c2, c3), innermost first. */
__device__ __forceinline__ void rw_tma_load_4d(void *dst, const CUtensorMap *map, uint64_t *bar,
                                               int c0, int c1, int c2, int c3) {
#if RW_WGMMA_DEVICE
    asm volatile("cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes "
                 "[%0], [%1, {%2, %3, %4, %5}], [%6];\n" ::"r"(rw_smem_u32(dst)),
                 "l"(map), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(rw_smem_u32(bar))
                 : "memory");
#endif
}

#endif
