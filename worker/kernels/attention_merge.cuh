/* attention_merge.cuh - the merge of key segments (attention.h's batch invariance rests on it):
 * one segment's (m, l, o) into a running (M, L, O), and a key split's partials merged into a
 * (token, head)'s output columns. CUDA C++, included by attention_tile.cuh (the kernels' own
 * merges) and attention.cu (the combine kernel of a key split): one function, so the same bits
 * in each. */
#ifndef RW_WORKER_KERNELS_ATTENTION_MERGE_CUH
#define RW_WORKER_KERNELS_ATTENTION_MERGE_CUH

#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>

#include "attention.h"

/* 2^x in one instruction (ex2.approx.ftz: results below 2^-126 flush to zero); exact at 0
 * (1.0) and -inf (+0.0), the two values the masking and merging rules rely on. */
__device__ __forceinline__ float atc_exp2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

/* (M, L, O) <- (M, L, O) merged with a segment's (m, l, o), log2 domain; a segment without keys
 * for the row (l == 0) is skipped. From (-inf, 0, 0) the first merge is an exact copy. No fused
 * multiply-adds, so every caller gets the same bits. */
__device__ __forceinline__ bool rw_attn_merge_ml(float &M, float &L, float m, float l, float &a,
                                                 float &b) {
    if (!(l > 0.0f)) return false;
    const float mn = fmaxf(M, m);
    a = atc_exp2(__fsub_rn(M, mn));
    b = atc_exp2(__fsub_rn(m, mn));
    L = __fadd_rn(__fmul_rn(L, a), __fmul_rn(l, b));
    M = mn;
    return true;
}

/* Output column d of (token, head) th (th = token * nh + head) from a key split's partials (o
 * [segment][token * nh + head][hd] and the (m, l) pairs [segment][token * nh + head], segments
 * sstride rows apart): its nseg segments merged in order, o / l. The partials are read ATC_CU
 * segments at a time, all loads issued before the merges that use them: read one by one, each
 * segment's loads would wait for the previous merge, a memory round trip per segment (an 8k
 * context has 64): 8 at a time measured faster than 16 or 32 (forty-fifth session). The loads go
 * through L2 (ld.global.cg): the split kernel that writes them may still be running (the ready
 * counters of attention.cu). */
#define ATC_CU 8
__device__ __forceinline__ float atc_merge_col(const float *__restrict__ part_o,
                                               const float2 *__restrict__ part_ml, int64_t sstride,
                                               int64_t th, int hd, int d, int nseg) {
    float M = -INFINITY, L = 0.0f, O = 0.0f;
    for (int s0 = 0; s0 < nseg; s0 += ATC_CU) {
        float2 ml[ATC_CU];
        float ov[ATC_CU];
#pragma unroll
        for (int u = 0; u < ATC_CU; u++) {
            ml[u] = make_float2(-INFINITY, 0.0f); /* no keys: the merge skips it */
            ov[u] = 0.0f;
            if (s0 + u < nseg) {
                const int64_t b = (int64_t)(s0 + u) * sstride + th;
                ml[u] = __ldcg(part_ml + b);
                ov[u] = __ldcg(part_o + b * hd + d);
            }
        }
#pragma unroll
        for (int u = 0; u < ATC_CU; u++) {
            float a, bb;
            if (!rw_attn_merge_ml(M, L, ml[u].x, ml[u].y, a, bb)) continue;
            O = __fadd_rn(__fmul_rn(O, a), __fmul_rn(ov[u], bb));
        }
    }
    return __fdiv_rn(O, L);
}

#endif
