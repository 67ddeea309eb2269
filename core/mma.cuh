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
/* Same, all 16 bytes read, to a shared-state-space address (rw_smem_u32): a caller that steps
 * through a tile adds its offsets to one converted address. */
__device__ __forceinline__ void rw_cp_async16_sa(uint32_t dst, const void *src) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(src));
}
/* rw_cp_async16_sa that also asks L2 to fetch the whole aligned PF bytes around src (128 or 256;
 * 0: no hint), for a stream that reads a row a narrow piece at a time: the row's next pieces are
 * then L2 hits instead of DRAM accesses of their own. */
template <int PF>
__device__ __forceinline__ void rw_cp_async16_sa_pf(uint32_t dst, const void *src) {
    static_assert(PF == 0 || PF == 128 || PF == 256, "rw_cp_async16_sa_pf: 0, 128 or 256 bytes");
    if constexpr (PF == 256)
        asm volatile("cp.async.cg.shared.global.L2::256B [%0], [%1], 16;\n" ::"r"(dst), "l"(src));
    else if constexpr (PF == 128)
        asm volatile("cp.async.cg.shared.global.L2::128B [%0], [%1], 16;\n" ::"r"(dst), "l"(src));
    else
        rw_cp_async16_sa(dst, src);
}
/* L2 eviction policies (createpolicy) for the hinted copies and stores below: evict_first for a
 * stream read once, so that its lines leave L2 before lines that will be read again; evict_last
 * for lines that will be read again soon (by the next kernel). */
__device__ __forceinline__ uint64_t rw_l2_evict_first(void) {
    uint64_t p;
    asm("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;\n" : "=l"(p));
    return p;
}
__device__ __forceinline__ uint64_t rw_l2_evict_last(void) {
    uint64_t p;
    asm("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;\n" : "=l"(p));
    return p;
}
/* rw_cp_async16_sa with an L2 eviction policy (rw_l2_evict_first, ...). */
__device__ __forceinline__ void rw_cp_async16_sa_pol(uint32_t dst, const void *src, uint64_t pol) {
    asm volatile("cp.async.cg.shared.global.L2::cache_hint [%0], [%1], 16, %2;\n" ::"r"(dst),
                 "l"(src), "l"(pol));
}
/* A float2 store to global memory with an L2 eviction policy. */
__device__ __forceinline__ void rw_st_f32x2_pol(float *p, float a, float b, uint64_t pol) {
    asm volatile("st.global.L2::cache_hint.v2.f32 [%0], {%1, %2}, %3;\n" ::"l"(p), "f"(a), "f"(b),
                 "l"(pol)
                 : "memory");
}
/* Drops the 128-byte L2 line at p (128-byte aligned) without writing it back: its bytes are
 * undefined afterwards. For scratch read for the last time, so that a line still in L2 costs no
 * DRAM write. */
__device__ __forceinline__ void rw_l2_discard128(const void *p) {
    asm volatile("discard.global.L2 [%0], 128;\n" ::"l"(p) : "memory");
}
/* Same, to a shared-state-space address, reading the first src_bytes (0 or 16) of src. */
__device__ __forceinline__ void rw_cp_async16_zfill_sa(uint32_t dst, const void *src,
                                                       uint32_t src_bytes) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
                 "r"(src_bytes));
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

/* ------------------------------------------------------------------------------------------ */
/* wgmma (sm_90a only: RW_WGMMA is 1 when the build targets it)                                 */
/* ------------------------------------------------------------------------------------------ */
/* A warpgroup (4 consecutive warps, the first a multiple of 4) multiplies a 64 x 16 bf16 tile of
 * A by a 16 x N tile of B, both read from shared memory through descriptors, into fp32
 * accumulators held by its 128 threads. Warp w of the group holds rows 16 w .. 16 w + 15 and its
 * registers d[4 j + i] are element (16 w + lane / 4 + 8 (i / 2), 8 j + 2 (lane % 4) + i % 2): the
 * accumulator layout of N / 8 side-by-side m16n8 mma.sync fragments.
 *
 * Operands here are K-major tiles in the rw_swz128 layout above (rows of 128 bytes, chunk c of
 * row r at c ^ (r & 7)): that is the hardware's 128-byte swizzle when the tile starts on a
 * 1024-byte boundary, with 8-row groups 1024 bytes apart. A descriptor names one k16 step: the
 * tile's first row plus 32 bytes per step inside the 128-byte rows. */
#ifndef RW_WGMMA
#define RW_WGMMA 0 /* host side: whether the build targets sm_90a (meson sets it) */
#endif
#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define RW_WGMMA_DEVICE 0 /* device code for an architecture without wgmma: the wrappers trap */
#else
#define RW_WGMMA_DEVICE 1
#endif

/* wgmma's descriptors anchor the swizzle to 1024-byte boundaries: a kernel's dynamic shared
 * memory (which follows its static shared memory) is rounded up to one, and sized
 * RW_WGMMA_SMEM_SLACK bytes larger for it. */
#define RW_WGMMA_SMEM_SLACK 1024
__device__ __forceinline__ uint8_t *rw_smem_align1024(uint8_t *p) {
    /* an offset from p, not a pointer made from an integer: the compiler then still knows that
     * the result is shared memory and reads and writes it with shared-memory instructions (a
     * pointer rebuilt from an integer is generic: every access through it resolved its space) */
    return p + ((1024u - (rw_smem_u32(p) & 1023u)) & 1023u);
}

/* Descriptor of a 128-byte-swizzled K-major operand at p (16-byte aligned; the swizzle pattern
 * is anchored to the 1024-byte boundary below p). */
__device__ __forceinline__ uint64_t rw_wgmma_desc(const void *p) {
    const uint64_t a = rw_smem_u32(p);
    return ((a & 0x3FFFFu) >> 4)           /* start address, 16-byte units */
           | ((uint64_t)1 << 16)           /* leading offset: unused for swizzled K-major */
           | ((uint64_t)(1024 >> 4) << 32) /* stride between 8-row groups */
           | ((uint64_t)1 << 62);          /* 128-byte swizzle */
}
/* The descriptor of the tile `bytes` further on (a multiple of 16) from the one d describes: its
 * start-address field (bits 0-13, address / 16) plus bytes / 16. Exact while the address stays in
 * shared memory (under 256 KB, so the field never carries); a kernel builds one descriptor a
 * stage and steps through its k16 slices and m64 blocks with this add instead of rebuilding each
 * from a pointer (about eight instructions each, with the moves to uniform registers). */
__device__ __forceinline__ uint64_t rw_wgmma_desc_at(uint64_t d, uint32_t bytes) {
    return d + (bytes >> 4);
}
/* Orders this thread's earlier register and shared-memory writes before the next wgmma reads. */
__device__ __forceinline__ void rw_wgmma_fence() {
#if RW_WGMMA_DEVICE
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#endif
}
/* Closes the group of wgmmas issued since the last commit. */
__device__ __forceinline__ void rw_wgmma_commit() {
#if RW_WGMMA_DEVICE
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
#endif
}
/* Waits until at most N committed groups are in flight; their accumulators are then readable. */
template <int N> __device__ __forceinline__ void rw_wgmma_wait() {
#if RW_WGMMA_DEVICE
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
#endif
}
/* Makes generic-proxy writes to shared memory (st.shared, cp.async) visible to wgmma's reads. */
__device__ __forceinline__ void rw_fence_proxy_async() {
#if RW_WGMMA_DEVICE
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#endif
}

/* Pins n accumulator registers at this point of the program (an empty asm that reads and writes
 * them): the compiler then keeps them in place across a wgmma group instead of copying them
 * between its instructions, which would force a fence before every wgmma. */
__device__ __forceinline__ void rw_wgmma_pin(float *d, int n) {
#pragma unroll
    for (int i = 0; i < n; i++)
        asm volatile("" : "+f"(d[i])::"memory");
}
/* The same for n A-fragment registers of rw_wgmma_bf16_rs: kept live, in place, up to this point
 * (a wait that retired the group reading them), so the compiler gives them to nothing else
 * while the group may still read them. */
__device__ __forceinline__ void rw_wgmma_pin_frag(uint32_t *a, int n) {
#pragma unroll
    for (int i = 0; i < n; i++)
        asm volatile("" : "+r"(a[i])::"memory");
}

/* d[0 .. N/2) += A (64 x 16, descriptor a) . B (16 x N, descriptor b), bf16 in, fp32 accumulate
 * (D = A.B + D: the predicate p, scale-d, is true); N = 16, 32, 64, 96, 128 or 256. Asynchronous:
 * the registers are defined after rw_wgmma_commit + rw_wgmma_wait. */
template <int N> __device__ __forceinline__ void rw_wgmma_bf16(float *d, uint64_t a, uint64_t b);
/* One specialization per N: REGS is the asm's accumulator list, A and B the operand numbers of
 * the descriptors, OPS the accumulator constraints (RW_WG_R8 per 8 registers). */
#define RW_WG_R8(i)                                                                                \
    "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), "+f"(d[i + 4]), "+f"(d[i + 5]),    \
        "+f"(d[i + 6]), "+f"(d[i + 7])
#if RW_WGMMA_DEVICE
#define RW_WGMMA_BF16(N, REGS, A, B, ...)                                                          \
    template <>                                                                                    \
    __device__ __forceinline__ void rw_wgmma_bf16<N>(float *d, uint64_t a, uint64_t b) {           \
        asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"                                    \
                     "wgmma.mma_async.sync.aligned.m64n" #N "k16.f32.bf16.bf16 "                   \
                     "{" REGS "}, %" #A ", %" #B ", p, 1, 1, 0, 0;\n}\n"                           \
                     : __VA_ARGS__                                                                 \
                     : "l"(a), "l"(b));                                                            \
    }
#else
#define RW_WGMMA_BF16(N, REGS, A, B, ...)                                                          \
    template <> __device__ __forceinline__ void rw_wgmma_bf16<N>(float *, uint64_t, uint64_t) {    \
        __trap();                                                                                  \
    }
#endif
/* The same with A from registers (the "RS" form): a[0 .. 3] hold the thread's part of the 64 x 16
 * A tile in the layout of an m16n8k16 mma.sync A fragment of rows 16 w .. 16 w + 15 (w the warp
 * of the group): a[0] row lane / 4, columns 2 (lane % 4) and + 1; a[1] 8 rows further; a[2] and
 * a[3] the same rows 8 columns further. The registers are read asynchronously: the caller must
 * not write them again until a wait has retired the group. After a wait_group that left a group
 * in flight, ptxas gave that group's registers to new fragments (wrong results on an H200; the
 * register-fragment tiles of moe/expert_gemm.cu therefore retire every group with wait<0>).
 * Fragments converted between two MMAs with no wait between measured correct
 * (docs/BENCHMARKS.md, 2026-12-04). So did two sets of fragments, alternating by block, each
 * pinned (an empty asm reading and writing its registers) after the wait that retired the group
 * reading it, which keeps the compiler off those registers until then; it was slower there
 * (docs/BENCHMARKS.md, 2026-12-04, seventeenth session). */
template <int N>
__device__ __forceinline__ void rw_wgmma_bf16_rs(float *d, const uint32_t *a, uint64_t b);
#if RW_WGMMA_DEVICE
#define RW_WGMMA_BF16_RS(N, REGS, AREGS, B, ...)                                                   \
    template <>                                                                                    \
    __device__ __forceinline__ void rw_wgmma_bf16_rs<N>(float *d, const uint32_t *a, uint64_t b) { \
        asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"                                    \
                     "wgmma.mma_async.sync.aligned.m64n" #N "k16.f32.bf16.bf16 "                   \
                     "{" REGS "}, {" AREGS "}, %" #B ", p, 1, 1, 0;\n}\n"                          \
                     : __VA_ARGS__                                                                 \
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b));                        \
    }
#else
#define RW_WGMMA_BF16_RS(N, REGS, AREGS, B, ...)                                                   \
    template <>                                                                                    \
    __device__ __forceinline__ void rw_wgmma_bf16_rs<N>(float *, const uint32_t *, uint64_t) {     \
        __trap();                                                                                  \
    }
#endif
#define RW_WG_L16 "%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15"
#define RW_WG_L32 RW_WG_L16 ",%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31"
#define RW_WG_L48 RW_WG_L32 ",%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47"
#define RW_WG_L64                                                                                  \
    RW_WG_L32 ",%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,"  \
              "%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63"
#define RW_WG_L128                                                                                 \
    RW_WG_L64 ",%64,%65,%66,%67,%68,%69,%70,%71,%72,%73,%74,%75,%76,%77,%78,%79,%80,%81,%82,%83,"  \
              "%84,%85,%86,%87,%88,%89,%90,%91,%92,%93,%94,%95,%96,%97,%98,%99,%100,%101,%102,"    \
              "%103,%104,%105,%106,%107,%108,%109,%110,%111,%112,%113,%114,%115,%116,%117,%118,"   \
              "%119,%120,%121,%122,%123,%124,%125,%126,%127"
RW_WGMMA_BF16(16, "%0,%1,%2,%3,%4,%5,%6,%7", 8, 9, RW_WG_R8(0))
RW_WGMMA_BF16(32, RW_WG_L16, 16, 17, RW_WG_R8(0), RW_WG_R8(8))
RW_WGMMA_BF16(64, RW_WG_L32, 32, 33, RW_WG_R8(0), RW_WG_R8(8), RW_WG_R8(16), RW_WG_R8(24))
RW_WGMMA_BF16(96, RW_WG_L48, 48, 49, RW_WG_R8(0), RW_WG_R8(8), RW_WG_R8(16), RW_WG_R8(24),
              RW_WG_R8(32), RW_WG_R8(40))
RW_WGMMA_BF16(128, RW_WG_L64, 64, 65, RW_WG_R8(0), RW_WG_R8(8), RW_WG_R8(16), RW_WG_R8(24),
              RW_WG_R8(32), RW_WG_R8(40), RW_WG_R8(48), RW_WG_R8(56))
RW_WGMMA_BF16(256, RW_WG_L128, 128, 129, RW_WG_R8(0), RW_WG_R8(8), RW_WG_R8(16), RW_WG_R8(24),
              RW_WG_R8(32), RW_WG_R8(40), RW_WG_R8(48), RW_WG_R8(56), RW_WG_R8(64), RW_WG_R8(72),
              RW_WG_R8(80), RW_WG_R8(88), RW_WG_R8(96), RW_WG_R8(104), RW_WG_R8(112), RW_WG_R8(120))
RW_WGMMA_BF16_RS(16, "%0,%1,%2,%3,%4,%5,%6,%7", "%8,%9,%10,%11", 12, RW_WG_R8(0))
RW_WGMMA_BF16_RS(32, RW_WG_L16, "%16,%17,%18,%19", 20, RW_WG_R8(0), RW_WG_R8(8))
RW_WGMMA_BF16_RS(64, RW_WG_L32, "%32,%33,%34,%35", 36, RW_WG_R8(0), RW_WG_R8(8), RW_WG_R8(16),
                 RW_WG_R8(24))
RW_WGMMA_BF16_RS(128, RW_WG_L64, "%64,%65,%66,%67", 68, RW_WG_R8(0), RW_WG_R8(8), RW_WG_R8(16),
                 RW_WG_R8(24), RW_WG_R8(32), RW_WG_R8(40), RW_WG_R8(48), RW_WG_R8(56))
#undef RW_WGMMA_BF16_RS
#undef RW_WGMMA_BF16
#undef RW_WG_L16
#undef RW_WG_L32
#undef RW_WG_L48
#undef RW_WG_L64
#undef RW_WG_L128
#undef RW_WG_R8

#endif /* RW_MMA_CUH */
