/* kernels.h - the CUDA backend's kernels (kernels.cu, extern "C" launchers taking a stream) and
 * their plain-C references (kernels_ref.c) that the gpu-suite tests compare them with. Internal to
 * the worker module.
 *
 * Conventions: bf16 tensors are uint16_t bit patterns; shapes are row-major; the paged KV cache
 * of one layer is K, V bf16 [nblocks, nkv, bs, hd]; a token's KV slot is block * bs + offset. */
#ifndef RW_WORKER_KERNELS_H
#define RW_WORKER_KERNELS_H

#include <math.h>

#include "rand.h"
#include "rw_core.h"
#include "rw_moe.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The sampler's uniform draw, shared by host and device: rw_rand_unit_at(seed, position) (rand.h).
 * rw_sample_uniform (rw_worker.h) is this function. Random weights use rw_rand_bf16_at. */
RW_HD float rw_sample_uniform_dev(uint64_t seed, int64_t position) {
    return rw_rand_unit_at(seed, (uint64_t)position);
}

/* x [n, H] fp32 = emb [v_local, H] bf16 row (tok - v_begin), or zeros when the token belongs to
 * another rank's vocabulary rows. */
void rw_k_embed_ref(const int32_t *tok, int64_t n, const uint16_t *emb, int64_t v_begin,
                    int64_t v_local, int64_t H, float *x);
rw_status rw_k_embed(const int32_t *tok, int64_t n, const uint16_t *emb, int64_t v_begin,
                     int64_t v_local, int64_t H, float *x, rw_stream s, rw_err *err);

/* GEMM inputs leave the fp32 kernels as hi + lo bf16 pairs: hi = bf16(v), lo = bf16(v - hi)
 * (round to nearest even), so hi + lo carries about 16 significant bits of v and the GEMMs
 * (gemm.h, rw_moe_experts_cuda) see near-fp32 activations for bf16 weights. A NULL lo asks for
 * hi alone. */

/* When y != NULL: x += y first (x is updated). Then v = w * (x * rsqrt(mean(x^2) + eps)) goes to
 * out_hi / out_lo as a hi + lo pair and, when out_f32 != NULL, in fp32. x, y [n, H] fp32; w [H]
 * bf16. */
void rw_k_add_rmsnorm_ref(float *x, const float *y, const uint16_t *w, int64_t n, int64_t H,
                          float eps, uint16_t *out_hi, uint16_t *out_lo, float *out_f32);
rw_status rw_k_add_rmsnorm(float *x, const float *y, const uint16_t *w, int64_t n, int64_t H,
                           float eps, uint16_t *out_hi, uint16_t *out_lo, float *out_f32,
                           rw_stream s, rw_err *err);

/* out_hi / out_lo [n, H]: row i = rmsnorm(x[rows[i]] (+ y[rows[i]] when y != NULL, written back
 * to x)). Rows must be distinct. */
void rw_k_rmsnorm_rows_ref(float *x, const float *y, const int32_t *rows, int64_t n,
                           const uint16_t *w, int64_t H, float eps, uint16_t *out_hi,
                           uint16_t *out_lo);
rw_status rw_k_rmsnorm_rows(float *x, const float *y, const int32_t *rows, int64_t n,
                            const uint16_t *w, int64_t H, float eps, uint16_t *out_hi,
                            uint16_t *out_lo, rw_stream s, rw_err *err);

/* Per-head RMSNorm of q and k (weights qn, kn [hd] bf16), RoPE (rotate-half, angle = pos *
 * inv_freq[i], inv_freq [hd/2] fp32), then q_out fp32 [n, nh, hd] and the K, V cache slots (bf16):
 * slot[t] = block * bs + offset (negative: not stored). q rows of nh*hd fp32 at row stride ldq;
 * k, v rows of nkv*hd at row stride ldkv (one fused [n, q|k|v] GEMM output works with
 * ldq = ldkv = (nh + 2 nkv) hd). */
void rw_k_qk_rope_kv_ref(const float *q, const float *k, const float *v, int64_t ldq, int64_t ldkv,
                         const uint16_t *qn, const uint16_t *kn, const int32_t *pos,
                         const int32_t *slot, int64_t n, int nh, int nkv, int hd, int bs,
                         const float *inv_freq, float eps, float *q_out, uint16_t *kcache,
                         uint16_t *vcache);
rw_status rw_k_qk_rope_kv(const float *q, const float *k, const float *v, int64_t ldq, int64_t ldkv,
                          const uint16_t *qn, const uint16_t *kn, const int32_t *pos,
                          const int32_t *slot, int64_t n, int nh, int nkv, int hd, int bs,
                          const float *inv_freq, float eps, float *q_out, uint16_t *kcache,
                          uint16_t *vcache, rw_stream s, rw_err *err);

/* Paged causal attention. A tile is up to RW_ATTN_QT consecutive tokens of one sequence:
 * tiles[i] = {seq, first token, count, 0}; qt is the largest count of any tile (a decode batch:
 * 1), which sizes the kernel's registers and shared memory. Token t of the batch has position
 * pos[t] and attends keys 0..pos[t] of its sequence, whose KV block table is bt[seq * bt_stride
 * ...]. q [ntok, nh, hd] fp32 -> out_hi / out_lo [ntok, nh, hd] (a hi + lo pair); fp32 math,
 * softmax scale 1/sqrt(hd). bs % 16 == 0, hd in {32, 64, 128}, nh / nkv <= 16.
 *
 * Batch invariance: a query row's keys are cut into fixed segments of RW_ATTN_SEG positions
 * (0..127, 128..255, ...); each segment is reduced in one order (16-key tiles in sequence, online
 * softmax), and the segments' (max, sum, output) are merged in segment order by one function. So
 * a token's output bits depend on its q, its keys and its position only: not on the batch, the
 * tiles, qt, or how the segments are spread over CTAs:
 * - nsplit 0: one CTA per (tile, kv head) walks every segment and merges as it goes;
 * - nsplit >= 1: CTA z of nsplit takes segments z, z + nsplit, ... and writes each segment's
 *   partial to `part`, then a combine kernel merges them per (token, head). `part` must hold
 *   rw_k_attention_part_bytes(ntok, nh, hd, segments) with segments >= pos / RW_ATTN_SEG + 1 for
 *   every token (part_bytes says how much it holds; segments past it are not written). */
#define RW_ATTN_QT 8
#define RW_ATTN_SEG 128
typedef struct rw_attn_tile {
    int32_t seq, tok0, ntok, pad;
} rw_attn_tile;
void rw_k_attention_ref(const float *q, const uint16_t *kcache, const uint16_t *vcache,
                        const rw_attn_tile *tiles, int ntiles, const int32_t *pos,
                        const int32_t *bt, int bt_stride, int nh, int nkv, int hd, int bs,
                        uint16_t *out_hi, uint16_t *out_lo);
size_t rw_k_attention_part_bytes(int64_t ntok, int nh, int hd, int segments);
rw_status rw_k_attention(const float *q, const uint16_t *kcache, const uint16_t *vcache,
                         const rw_attn_tile *tiles, int ntiles, int qt, const int32_t *pos,
                         const int32_t *bt, int bt_stride, int64_t ntok, int nh, int nkv, int hd,
                         int bs, int nsplit, void *part, size_t part_bytes, uint16_t *out_hi,
                         uint16_t *out_lo, rw_stream s, rw_err *err);

/* Router logits in fp32: y [n, E] = x [n, H] fp32 . w [E, H] bf16 (upcast exactly). H % 8 == 0,
 * x and w 16-byte aligned. A token's logits do not depend on the rest of the batch (bit for bit).
 */
void rw_k_router_ref(const float *x, const uint16_t *w, int64_t n, int64_t E, int64_t H, float *y);
rw_status rw_k_router(const float *x, const uint16_t *w, int64_t n, int64_t E, int64_t H, float *y,
                      rw_stream s, rw_err *err);

/* Logits from the vocab-parallel lm_head: g [T, n, vl] (rank-major, as all-gathered) ->
 * out [n, V] (V <= T * vl; the zero rows past V are dropped). */
void rw_k_logits_gather_ref(const float *g, int T, int64_t n, int64_t vl, int64_t V, float *out);
rw_status rw_k_logits_gather(const float *g, int T, int64_t n, int64_t vl, int64_t V, float *out,
                             rw_stream s, rw_err *err);

/* Sampling of n rows of logits [n, V] fp32 on the device, one CTA per row, the rule of
 * rw_sampling (rw_worker.h) with one documented difference: probability masses are summed as
 * 32.32 fixed point (exp(z - zmax) * 2^32, truncated) in uint64, which makes the sums exact and
 * independent of the reduction order (so reruns give the same tokens); an id whose mass rounds
 * to zero is never drawn. */
typedef struct rw_k_sample_param {
    float temperature, top_p;
    int32_t top_k, top_n;
    uint64_t seed;
    int64_t position;
    int32_t row; /* row of `logits` this request samples from */
    int32_t pad;
} rw_k_sample_param;
typedef struct rw_k_sample_out {
    int32_t token;
    float logprob;
    int32_t top_ids[20];
    float top_lps[20];
} rw_k_sample_out;
/* n requests; request i samples row p[i].row of logits [rows, V] into out[i]. */
void rw_k_sample_ref(const float *logits, int64_t n, int64_t V, const rw_k_sample_param *p,
                     rw_k_sample_out *out);
rw_status rw_k_sample(const float *logits, int64_t n, int64_t V, const rw_k_sample_param *p,
                      rw_k_sample_out *out, rw_stream s, rw_err *err);

/* Seeded device fills: bf16 element i = rw_rand_bf16_at(seed, i, mean, std); e4m3 values of
 * magnitude < 1 (no NaN codes); fp32 constant. Each element depends only on (seed, i). */
rw_status rw_k_fill_bf16(uint16_t *p, int64_t n, uint64_t seed, float mean, float std, rw_stream s,
                         rw_err *err);
rw_status rw_k_fill_e4m3(uint8_t *p, int64_t n, uint64_t seed, rw_stream s, rw_err *err);
rw_status rw_k_fill_f32(float *p, int64_t n, float value, rw_stream s, rw_err *err);

/* One thread that spins for `ns` nanoseconds of GPU time (the profiler queues a step behind it). */
rw_status rw_k_spin(uint64_t ns, rw_stream s, rw_err *err);

/* --- the CUDA backend's forward pass emulated on the CPU ----------------------------------- */
/* The composition of the CUDA backend (cuda_backend.c: run_model) computed on the host from a
 * host weight set, with each of its rounding points switchable, so the error budget of those
 * rounding points can be measured against the transformers fp32 reference without a GPU, and the
 * GPU can be checked against what its rounding points imply. Exact GEMMs (double accumulation,
 * or fp32 in index order with RW_EMUL_F32_ACCUM), fp32 everything else, as the kernels do. */
enum {
    RW_EMUL_ROUND_QKV_IN = 1u << 0, /* input-normed hidden states into the q/k/v GEMM */
    RW_EMUL_ROUND_Q = 1u << 1,      /* q after its norm and RoPE */
    RW_EMUL_ROUND_K = 1u << 2,      /* K cache (bf16) */
    RW_EMUL_ROUND_V = 1u << 3,      /* V cache (bf16) */
    RW_EMUL_ROUND_ATT = 1u << 4,    /* attention output, the o_proj input */
    RW_EMUL_ROUND_MOE_IN = 1u << 5, /* post-normed hidden states into the experts */
    RW_EMUL_ROUND_ACT = 1u << 6,    /* silu(gate) * up, the down-projection input */
    RW_EMUL_ROUND_LM_IN = 1u << 7,  /* final-normed rows into the lm_head */
    RW_EMUL_ROUND_ALL = (1u << 8) - 1,
    RW_EMUL_F32_ACCUM = 1u << 8, /* GEMMs accumulate in fp32 in index order (not double) */
    /* the GEMM inputs among the rounding points on (all but q, K and V) are hi + lo bf16 pairs
     * (x ~ hi + lo, about 16 significant bits) instead of one bf16 */
    RW_EMUL_SPLIT = 1u << 9,
    /* what the CUDA backend does: q fp32, K and V cache bf16, every GEMM input a hi + lo pair */
    RW_EMUL_CUDA = (RW_EMUL_ROUND_ALL & ~RW_EMUL_ROUND_Q) | RW_EMUL_SPLIT,
};
/* Teacher-forced logits [n, V] of tokens [n] (positions 0..n-1) for a TP1 host weight set whose
 * layers are all bf16. route_ids [L, n, top_k] and router_logits [L, n, E] (both may be NULL)
 * receive every layer's routing. RW_E_UNSUPPORTED for device, TP > 1 or quantized sets. */
rw_status rw_cuda_emul_score(const rw_wset *ws, const int32_t *tokens, int n, unsigned flags,
                             float *logits, int32_t *route_ids, float *router_logits, rw_err *err);

#ifdef __cplusplus
}
#endif

#endif
