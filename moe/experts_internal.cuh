/* experts_internal.cuh - what the expert layer's CUDA files share (not a public contract):
 * experts.cu runs the pipeline (rw_moe_experts_cuda) with the sort of expert_sort.cu and the
 * grouped GEMM passes of expert_gemm.cu. The pipeline, the layouts and the arithmetic are
 * described at the top of experts.cu. CUDA C++ only. */
#ifndef RW_MOE_EXPERTS_INTERNAL_CUH
#define RW_MOE_EXPERTS_INTERNAL_CUH

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include "rw_moe.h"

/* weight rows of a GEMM CTA (64 for the one-token bf16 tiles: expert_gemm.cu) */
#define MOE_BM 128
/* The narrowest tile, for batches of at most one assignment per expert on average (a decode step
 * of up to E / k tokens): most experts then hold one or two tokens, and 16 columns instead of 32
 * halve the mma work and the activation bytes of a CTA that streams the same weights. The B
 * fragments are loaded in pairs of n8 tiles, so 16 is the least. */
#define MOE_TN_MIN 16
/* mxfp8 scales kept in shared memory: scale_cols * 512 bytes = 4 K bytes, K <= MOE_MX_MAX_K */
#define MOE_MX_MAX_K 8192

/* weight formats of a GEMM pass */
enum { FMT_BF16 = 0, FMT_MX = 1, FMT_FP8B = 2 };

/* One GEMM pass's operands (w13 or w2). */
struct gemm_args {
    const void *w;      /* packed weights of the layer, all local experts */
    const void *wscale; /* packed scales (quantized formats) */
    int64_t w_expert;   /* bytes per expert of w */
    int64_t s_expert;   /* bytes per expert of wscale */
    int64_t M, K;       /* rows (2P or H) and reduction length (H or P) of one expert */
    int64_t P, H;
    int64_t scale_cols;          /* fp8-block: column blocks; mxfp8: Kt (swizzle) */
    const __nv_bfloat16 *xin;    /* w13: x [ntok, H] gathered through perm; w2: act [A, P] */
    const __nv_bfloat16 *xin_lo; /* split mode: low halves of xin, same layout */
    const int32_t *perm, *off;
    const int2 *tiles;
    const int32_t *ntiles;
    int k;                 /* top-k (w13 gathers token perm[row] / k) */
    __nv_bfloat16 *act;    /* w13 output [A, P] */
    __nv_bfloat16 *act_lo; /* split mode, when w2 takes the pair: act_lo = bf16(v - act); or NULL */
    float *y;              /* w2 output [A, H] */
    int64_t E;             /* local experts of w (the tensor map's extent) */
};

/* The stable sort of A assignments (ids) by local expert, and the list of tn-row tiles per
 * expert (expert_sort.cu): off [E + 1], tiles, *ntiles, perm (sorted row -> assignment), inv
 * (assignment -> sorted row, -1 outside [0, E)). One CTA; E <= 1024. */
rw_status moe_sort_launch(const int32_t *ids, int64_t A, int E, int tn, int32_t *off, int2 *tiles,
                          int32_t *ntiles, int32_t *perm, int32_t *inv, cudaStream_t st,
                          rw_err *err);

/* One grouped GEMM pass (expert_gemm.cu): w13 (x -> act, SiLU fused) or w2 (act -> y) over the
 * tiles of g, grid_x tile columns, tn tokens a tile (16, 32 or 128), in format fmt, split = the
 * hi + lo input pair; sms: the device's SM count (one-wave grids get deeper pipelines). */
rw_status moe_gemm_pass(bool w13, int tn, int fmt, bool split, const gemm_args &g, int64_t grid_x,
                        int sms, rw_stream s, rw_err *err);

#endif
