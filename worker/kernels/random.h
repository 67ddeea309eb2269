/* random.h - the device generator of seeded random bf16 tensors, for random model weights
 * (cuda_random.c: rw_model_load_random on the CUDA backend generates every tensor in place). Its
 * reference is the rule itself, rw_rand_bf16_at (core/rand.h), which the CPU side evaluates: the
 * bytes are equal on both (tests/worker/test_cuda_vs_transformers_gpu.c checks it). */
#ifndef RW_WORKER_KERNELS_RANDOM_H
#define RW_WORKER_KERNELS_RANDOM_H

#include "common.h"

#ifdef __cplusplus
extern "C" {
#endif

/* p[i] = rw_rand_bf16_at(seed, i, mean, std) for i in [0, n): each element depends only on
 * (seed, i), so the values are those of the host generator whatever the launch shape. */
rw_status rw_k_fill_bf16(uint16_t *p, int64_t n, uint64_t seed, float mean, float std, rw_stream s,
                         rw_err *err);

#ifdef __cplusplus
}
#endif

#endif
