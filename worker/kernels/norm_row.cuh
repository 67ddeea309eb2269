/* norm_row.cuh - the RMSNorm of one row by one CTA of NORM_THREADS threads, as device code for
 * every kernel that norms a row: norm_rope.cu's norms and the router's one-group form, which
 * norms its input itself instead of waiting for a norm launch (router.cu). One function, so
 * both give the same bits. */
#ifndef RW_WORKER_KERNELS_NORM_ROW_CUH
#define RW_WORKER_KERNELS_NORM_ROW_CUH

#include <stdint.h>

#include "device.cuh"

/* One CTA per row; each thread keeps its PER elements (H <= 256 PER) in registers between the
 * two passes. All loads of x, y and w are issued before the first store to x: interleaved, the
 * compiler must assume the store may alias the next load and waits out one memory round trip per
 * element (7-10 us for a 2048-wide row on an H200, ncu). PER is the least that holds the row, so
 * the 2048-wide rows of the 30B-A3B shape keep the registers, and the CTAs per SM, of a prefill.
 * The sum of squares keeps its element order for every PER. */
#define NORM_THREADS 256
#define NORM_MAXPER 32

/* The norm of a row from its PER elements a thread (v: x, already summed; wv: the weights):
 * element i = threadIdx.x + NORM_THREADS j goes to put(i, normed value). Every thread of the
 * CTA calls it (block_sum). */
template <int PER, typename Put>
static __device__ __forceinline__ void norm_row(const float (&v)[PER], const float (&wv)[PER],
                                                int64_t H, float eps, float *sh, Put put) {
    float ss = 0.0f;
#pragma unroll
    for (int j = 0; j < PER; j++)
        if (threadIdx.x + (int64_t)j * NORM_THREADS < H) ss += v[j] * v[j];
    const float r = rsqrtf(block_sum(ss, sh) / (float)H + eps);
#pragma unroll
    for (int j = 0; j < PER; j++) {
        const int64_t i = threadIdx.x + (int64_t)j * NORM_THREADS;
        if (i < H) put(i, wv[j] * (v[j] * r));
    }
}

/* A thread's PER norm weights, loaded before the kernel's PDL wait (launch.cuh: no kernel of a
 * forward pass writes a weight). The rows are the previous kernel's output and are read after
 * it; the norm weight, read from memory once a layer at batch 1, then no longer adds its own
 * round trip to theirs. */
template <int PER>
static __device__ __forceinline__ void norm_weights(float (&wv)[PER], const uint16_t *w,
                                                    int64_t H) {
#pragma unroll
    for (int j = 0; j < PER; j++) {
        const int64_t i = threadIdx.x + (int64_t)j * NORM_THREADS;
        wv[j] = i < H ? b2f(w[i]) : 0.0f;
    }
}

#endif
