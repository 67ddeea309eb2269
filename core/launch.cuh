/* launch.cuh - programmatic dependent launch (PDL) for the forward pass's kernels (CUDA C++ only).
 *
 * A kernel launched with rw_launch_pdl may be scheduled before the kernel ahead of it in the
 * stream has finished, so its CTAs are resident and set up when that kernel ends instead of
 * being launched only then. At batch 1 a step is some 580 small dependent kernels; on an H200
 * this took a decode step from 5.66 to 5.51 ms (docs/BENCHMARKS.md, 2026-12-02). The contract
 * that keeps this exact:
 *   - every kernel launched with rw_launch_pdl calls rw_pdl_begin() as its first statement,
 *     before any global memory access. Its wait returns once the previous kernel of the stream
 *     has completed and its writes are visible, exactly as with an ordinary launch; it is a no-op
 *     for a kernel launched without the attribute. Two exceptions, both from the same fact: the
 *     kernel ahead of this one was itself scheduled only after everything before it had
 *     completed. So before the wait a kernel may read the model's weights and other constants,
 *     which no kernel of a forward pass writes (gemv.cu's tensor copies, the router's first
 *     weight loads, the norms' weights, RoPE's norm weights and frequencies), the step's metadata,
 *     which the host uploads before the forward pass (the tokens' positions and KV slots, the
 *     attention tiles and block table: RoPE, the attention kernels), and what kernels two or
 *     more back wrote (the expert w2 pass reads the sort's tile list and issues its first
 *     weight loads: moe/expert_gemm.cu; the combines read each token's rows and routing weights:
 *     moe/experts.cu, worker/kernels/norm_rope.cu), through L2 (ld.global.cg) so that no line an
 *     earlier kernel left in L1 is read;
 *   - rw_pdl_begin() then lets the next kernel of the stream be scheduled. That kernel waits in
 *     its own rw_pdl_begin() for this one to complete, so at most two kernels are in flight and
 *     every dependency, transitive ones included, is ordered as before. (Letting it be scheduled
 *     before the wait, three kernels in flight, measured slower: a batch-1 step 3.89 -> 4.37 ms
 *     on an H200, docs/BENCHMARKS.md.)
 * One exception to the last rule, rw_pdl_begin_early: a kernel whose successor reads nothing
 * before its wait but weights and the step's metadata may let it be scheduled before its own
 * wait, three kernels in flight, where that successor has much to fetch before its wait and the
 * kernel ahead of it is short: the attention combine before o_proj's GEMV, whose weight copies
 * then start while the attention runs (a one-token step 3.029-3.057 -> 3.003-3.012 ms on an
 * H200, same run; docs/BENCHMARKS.md, twenty-first session). The successor's wait still returns
 * only after this kernel, and so everything before it, has completed; what it may read before
 * that wait no longer includes what kernels two back wrote.
 * A kernel may also take its predecessor's results as they come, through flags of its own, and
 * wait only at its end (rw_pdl_trigger first, rw_pdl_wait last): the combine of a key split,
 * whose CTAs merge a (token, head) as soon as the split CTAs it needs have counted themselves done
 * (worker/kernels/attention.cu). Its wait at the end keeps the rule that a kernel completes only
 * after everything before it has.
 * Nothing computed changes, only when CTAs are scheduled. RW_PDL=0 in the environment launches
 * ordinarily (read once per process). Captured into a CUDA graph, the attribute becomes a
 * programmatic edge with the same meaning. */
#ifndef RW_LAUNCH_CUH
#define RW_LAUNCH_CUH

#include <cuda_runtime.h>
#include <stdlib.h>
#include <string.h>

/* The two steps of a programmatic launch, each one instruction: the wait (for the kernel ahead
 * to complete, its writes visible) and the trigger (the next kernel may be scheduled). Alone,
 * for a kernel that reads its predecessor's results through flags of its own (above):
 * rw_pdl_trigger as its first statement, rw_pdl_wait as its last. */
__device__ __forceinline__ void rw_pdl_wait(void) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void rw_pdl_trigger(void) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}

/* First statement of every kernel launched with rw_launch_pdl. */
__device__ __forceinline__ void rw_pdl_begin(void) {
    rw_pdl_wait();
    rw_pdl_trigger();
}

/* rw_pdl_begin's two steps the other way round, for the kernels the contract above names: the
 * next kernel may be scheduled before this one's wait. */
__device__ __forceinline__ void rw_pdl_begin_early(void) {
    rw_pdl_trigger();
    rw_pdl_wait();
}

/* Whether launches use PDL: yes unless RW_PDL=0. */
static inline bool rw_pdl_enabled(void) {
    static int on = -1;
    if (on < 0) {
        const char *v = getenv("RW_PDL");
        on = !(v && !strcmp(v, "0"));
    }
    return on != 0;
}

/* kernel<<<grid, block, smem, s>>>(args...) with the PDL attribute and, for cluster > 1,
 * thread-block clusters of `cluster` consecutive CTAs along x (grid.x a multiple of it); the
 * error is the launch's (cudaGetLastError reports it too). */
template <typename... KArgs, typename... Args>
static cudaError_t rw_launch_pdl_cluster(void (*kernel)(KArgs...), dim3 grid, dim3 block,
                                         size_t smem, cudaStream_t s, unsigned cluster,
                                         Args... args) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = smem;
    cfg.stream = s;
    cudaLaunchAttribute at[2];
    unsigned n = 0;
    if (rw_pdl_enabled()) {
        at[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
        at[n++].val.programmaticStreamSerializationAllowed = 1;
    }
    if (cluster > 1) {
        at[n].id = cudaLaunchAttributeClusterDimension;
        at[n].val.clusterDim.x = cluster;
        at[n].val.clusterDim.y = 1;
        at[n++].val.clusterDim.z = 1;
    }
    cfg.attrs = at;
    cfg.numAttrs = n;
    return cudaLaunchKernelEx(&cfg, kernel, ((KArgs)args)...);
}
/* The same without clusters. */
template <typename... KArgs, typename... Args>
static cudaError_t rw_launch_pdl(void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem,
                                 cudaStream_t s, Args... args) {
    return rw_launch_pdl_cluster(kernel, grid, block, smem, s, 1u, args...);
}

#endif
