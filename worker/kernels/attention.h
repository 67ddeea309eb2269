/* attention.h - paged causal attention for prefill and decode (one arithmetic for both), with an
 * optional split of a token's keys over CTAs for batches of few sequences. Launcher in
 * attention.cu (kernels in attention_*.cuh), reference in attention_ref.c; conventions and the
 * hi + lo pair in common.h. */
#ifndef RW_WORKER_KERNELS_ATTENTION_H
#define RW_WORKER_KERNELS_ATTENTION_H

#include "common.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Paged causal attention on tensor cores. A tile is consecutive tokens of one sequence:
 * tiles[i] = {seq, first token, count, 0}; qt is the largest count of any tile (a decode batch:
 * 1); a tile holds at most 64 rows (count x nh / nkv): rw_k_attention_tile_tokens gives the
 * largest count for a head layout. Token t of the batch has position pos[t] and attends keys
 * 0..pos[t] of its sequence, whose KV block table is bt[seq * bt_stride ...]; every KV slot up to
 * the largest position of a tile must be written (the step writes its tokens' KV first).
 * q [ntok, nh, hd] fp32 -> out_hi / out_lo [ntok, nh, hd] (a hi + lo pair, each 4-byte
 * aligned); softmax scale 1/sqrt(hd). bs % 16 == 0, hd in {32, 64, 128}, nh / nkv <= 16.
 *
 * Numerics: q travels to the tensor cores as a hi + lo bf16 pair (about 16 significant bits), the
 * softmax weights as one bf16 each, products accumulate in fp32: within 2^-9 max|v| of an fp32
 * computation on the cache's bf16 keys and values (attention_tile.cuh has the exact per-row
 * sequence). With the cache's low halves (kv.k_lo and kv.v_lo, the high-precision mode) the keys
 * and values are the pairs k + k_lo, v + v_lo and the softmax weights a pair too: within about
 * 2^-15 max|v| of an fp32 computation on those pairs, for twice the cache bytes read and one more
 * MMA per product (qh.K_lo; P_lo.V and P_hi.V_lo).
 *
 * Batch invariance: a query row's keys are cut into fixed segments of RW_ATTN_SEG positions
 * (0..127, 128..255, ...), each reduced in one order (softmax blocks of 32 keys in sequence), and
 * the segments' (max, sum, output) are merged in segment order by one function. So a token's
 * output bits depend on its q, its keys and its position only: not on the batch, the tiles, qt,
 * which kernel runs (tiles of at most 16 rows spread segments over warps, larger ones spread row
 * fragments), or how the segments are spread over CTAs:
 * - nsplit 0: one CTA per (tile, kv head) walks every segment and merges as it goes;
 * - nsplit >= 1: CTA z of nsplit takes segments z, z + nsplit, ... and writes each segment's
 *   partial to `part`, then a combine kernel merges them per (token, head). `part` must hold
 *   rw_k_attention_part_bytes(ntok, nh, hd, segments) with segments >= pos / RW_ATTN_SEG + 1 for
 *   every token (part_bytes says how much it holds; segments past it are not written). */
/* `part` begins with RW_ATTN_READY counters, one a (token, head) of a split launch of decode
 * tiles, which let the combine merge a (token, head) as soon as its split CTAs are done; they
 * must be zero before the buffer's first use (cudaMemset it when allocated) and every launch
 * leaves them zero (each token in exactly one tile, as a batch's tiles are: a token no split
 * CTA counts would stop its combine CTA with a fault after seconds). Launches of fewer than 16
 * tokens, of more than RW_ATTN_READY (token, head) rows, or of larger tiles combine after the
 * whole split instead. */
#define RW_ATTN_READY 16384
#define RW_ATTN_QT 64
#define RW_ATTN_SEG 128
typedef struct rw_attn_tile {
    int32_t seq, tok0, ntok, pad;
} rw_attn_tile;
void rw_k_attention_ref(const float *q, rw_kv_planes kv, const rw_attn_tile *tiles, int ntiles,
                        const int32_t *pos, const int32_t *bt, int bt_stride, int nh, int nkv,
                        int hd, int bs, uint16_t *out_hi, uint16_t *out_lo);
size_t rw_k_attention_part_bytes(int64_t ntok, int nh, int hd, int segments);
/* Tokens per tile that fill a CTA's 64 rows for nh q heads over nkv kv heads (1..RW_ATTN_QT). */
int rw_k_attention_tile_tokens(int nh, int nkv);
rw_status rw_k_attention(const float *q, rw_kv_planes kv, const rw_attn_tile *tiles, int ntiles,
                         int qt, const int32_t *pos, const int32_t *bt, int bt_stride, int64_t ntok,
                         int nh, int nkv, int hd, int bs, int nsplit, void *part, size_t part_bytes,
                         uint16_t *out_hi, uint16_t *out_lo, rw_stream s, rw_err *err);

#ifdef __cplusplus
}
#endif

#endif
