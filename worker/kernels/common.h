/* common.h - what every kernel family of the CUDA backend (worker/kernels/) and its plain-C
 * reference share: the data conventions, and the hi + lo bf16 pair that GEMM inputs travel as.
 * C11 and CUDA C++; internal to the worker module.
 *
 * The kernels are grouped by family, one .cu with extern "C" launchers beside one *_ref.c with
 * the family's references and one header with both contracts: vocab (embedding, logits gather),
 * norm_rope (RMSNorms, per-head q/k norm + RoPE + KV write), attention, router, sample, gemm, and
 * random (device generation of the random weights). A new kernel joins its family's three files;
 * a new family gets three of its own.
 *
 * Conventions: bf16 tensors are uint16_t bit patterns; shapes are row-major; the paged KV cache
 * of one layer is K, V bf16 [nblocks, nkv, bs, hd] (rw_kv_planes, with the low halves of the
 * high-precision mode); a token's KV slot is block * bs + offset.
 * Every launcher takes an rw_stream (a cudaStream_t), checks its launch (RW_LAUNCH_CHECK) and
 * neither allocates nor synchronizes, so it can be captured into a CUDA graph. A reference has
 * the kernel's inputs, outputs and rounding points (bf16 where the kernel writes bf16) in plain
 * fp32 C; the gpu-suite tests (tests/worker/test_<family>_gpu.c; vocab and norm_rope in
 * test_kernels_gpu.c) compare each kernel with it.
 *
 * Reductions use fixed per-thread orders and fixed trees, never atomics on floats, so results are
 * the same bits on every run (batch invariance: see each family's header). */
#ifndef RW_WORKER_KERNELS_COMMON_H
#define RW_WORKER_KERNELS_COMMON_H

#include "rw_core.h"

#ifdef __cplusplus
extern "C" {
#endif

/* GEMM inputs leave the fp32 kernels as hi + lo bf16 pairs: hi = bf16(v), lo = bf16(v - hi)
 * (round to nearest even), so hi + lo carries about 16 significant bits of v and the GEMMs
 * (gemm.h, rw_moe_experts_cuda) see near-fp32 activations for bf16 weights. A NULL lo asks for
 * hi alone. This stores v as element i of such a pair, on the host and on the device. */
RW_HD void rw_k_store_split(float v, uint16_t *hi, uint16_t *lo, int64_t i) {
    const uint16_t h = rw_f32_to_bf16(v);
    hi[i] = h;
    if (lo) lo[i] = rw_bf16_split_lo(v, h);
}

/* One layer's paged KV cache: K and V bf16 [nblocks, nkv, bs, hd]. With k_lo and v_lo (both or
 * neither; the high-precision mode, rw_precision) each entry is a hi + lo pair as above, k + k_lo
 * and v + v_lo, in two more arrays of the same shape: about 16 significant bits of each key and
 * value instead of 8, for twice the bytes. */
typedef struct rw_kv_planes {
    uint16_t *k, *v, *k_lo, *v_lo;
} rw_kv_planes;

#ifdef __cplusplus
}
#endif

#endif
