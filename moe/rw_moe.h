/* rw_moe.h - the moe module's public contract: tensor-parallel shard plans (always from the
 * unpadded size), the padded FlashInfer-style packed MoE layout and its exact inverse, the rank's
 * weight set (one arena, every local weight in its final layout), the piece-apply path that
 * updates call (slice -> quantize -> pack in one pass, touching only its own bytes), canonical
 * readback and checksums, routing, and the expert computation on the packed layout.
 *
 * The layout contract is docs/LAYOUT.md; section numbers below refer to it.
 */
#ifndef RW_MOE_H
#define RW_MOE_H

#include "rw_core.h"
#include "rw_quant.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------------------------------ */
/* Shard plans (section 2)                                                                      */
/* ------------------------------------------------------------------------------------------ */
static inline int64_t rw_roundup(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

typedef struct rw_tp_dims {
    int tp, rank;
    int64_t S;      /* I / T: unpadded expert shard */
    int64_t P;      /* roundup(S, 128): padded expert shard */
    int nh_local;   /* nH / T query heads on this rank */
    int nkv_local;  /* max(1, nKV / T) kv heads on this rank */
    int kv_head0;   /* first global kv head this rank holds */
    int64_t Vp;     /* roundup(V, 64) */
    int64_t v_local;/* Vp / T vocab rows on this rank */
    int64_t v_begin;/* r * v_local */
} rw_tp_dims;

/* Checks that T divides nH, I, Vp and (nKV or T/nKV), and T in 1..64. */
rw_status rw_tp_dims_make(const rw_config *cfg, int tp, int rank, rw_tp_dims *out, rw_err *err);

/* Where rank r's part of one canonical tensor comes from and what it becomes. */
typedef struct rw_shard_plan {
    rw_wname w;
    int ndim;
    int64_t canon_shape[RW_MAX_DIMS]; /* full canonical shape */
    int dim;                          /* sharded dim of the canonical tensor; -1 = replicated */
    int64_t src_begin, src_end;       /* range read along `dim` (whole dim when dim == -1) */
    int dst_ndim;
    int64_t dst_shape[RW_MAX_DIMS];   /* logical local shape, padded (before packing) */
    bool padded;                      /* dst is larger than the slice (zero pad rows/cols) */
    /* fused gate_up [E, 2I, H]: two source ranges along dim 1 (gate, then up) */
    int64_t src2_begin, src2_end;     /* up half; equal to 0 when unused */
} rw_shard_plan;

rw_status rw_moe_plan_tensor(const rw_config *cfg, int tp, int rank, const rw_wname *w,
                             rw_shard_plan *out, rw_err *err);
/* One JSON object (no trailing newline) describing the plan, for rw-layout. Caller frees. */
rw_status rw_moe_plan_json(const rw_shard_plan *p, char **out, rw_err *err);

/* ------------------------------------------------------------------------------------------ */
/* Packed layout (section 3): index maps. All are bijections on their index sets.               */
/* ------------------------------------------------------------------------------------------ */

/* bf16 w13: canonical local row c in [0, 2P) (up rows [0,P), gate rows [P,2P)), column k in [0,H)
 * -> element offset within expert e of the packed [E_l, H/64, 2P, 64] buffer. */
RW_HD int64_t rw_moe_w13_row_map(int64_t c, int64_t P) {
    int64_t i = c < P ? 2 * c : 2 * (c - P) + 1; /* gated-activation interleave */
    return 32 * (i / 32) + 8 * (i % 4) + (i % 32) / 4; /* 32-row shuffle */
}
RW_HD int64_t rw_moe_row_shuffle(int64_t i) { return 32 * (i / 32) + 8 * (i % 4) + (i % 32) / 4; }
/* K-block layout: element (n, k) of an [M, K] matrix -> offset in [K/64, M, 64]. */
RW_HD int64_t rw_moe_kblock_offset(int64_t n, int64_t k, int64_t M) {
    return ((k / 64) * M + n) * 64 + (k % 64);
}
/* 128x4 scale swizzle: scale (m, k) of a [rows, cols] scale matrix, with Kt = ceil(cols / 4). */
RW_HD int64_t rw_moe_scale_swizzle(int64_t m, int64_t k, int64_t Kt) {
    return (m / 128) * Kt * 512 + (k / 4) * 512 + (m % 32) * 16 + ((m % 128) / 32) * 4 + (k % 4);
}

/* Pack / unpack one expert's logical local matrices (CPU reference).
 * bf16:  w13 [2P, H] (up-first, padded) <-> [H/64, 2P, 64];  w2 [H, P] <-> [P/64, H, 64].
 * mxfp8: w13 e4m3 [2P, H] rows mapped (no K blocks), scales [2P, H/32] rows mapped + swizzled to
 *        [roundup(2P,128), roundup(H/32,4)]; w2 e4m3 [H, P] row-shuffled, scales [H, P/32] likewise.
 * fp8-block: identity (plain [2P, H] and [H, P] up-first). */
typedef enum rw_moe_mat {
    RW_MOE_W13 = 0,
    RW_MOE_W2 = 1,
} rw_moe_mat;

/* Sizes in bytes of one expert's packed data and packed scales for a layer format. */
size_t rw_moe_packed_bytes(rw_wfmt f, rw_moe_mat m, int64_t P, int64_t H);
size_t rw_moe_packed_scale_bytes(rw_wfmt f, rw_moe_mat m, int64_t P, int64_t H);
void rw_moe_pack_ref(rw_wfmt f, rw_moe_mat m, int64_t P, int64_t H, const void *logical,
                     const void *logical_scale, void *packed, void *packed_scale);
void rw_moe_unpack_ref(rw_wfmt f, rw_moe_mat m, int64_t P, int64_t H, const void *packed,
                       const void *packed_scale, void *logical, void *logical_scale);
/* CUDA pack / unpack of `n_experts` consecutive experts (device pointers, on `s`): logical
 * matrices and scales back to back per expert (mxfp8 logical scales [rows, cols/32] u8, fp8
 * [rows/128, cols/128] f32), packed ones at rw_moe_packed_bytes / rw_moe_packed_scale_bytes
 * strides. Byte-identical to the _ref functions. RW_E_NO_DEVICE without CUDA. */
rw_status rw_moe_pack_cuda(rw_wfmt f, rw_moe_mat m, int64_t P, int64_t H, int64_t n_experts,
                           const void *logical, const void *logical_scale, void *packed,
                           void *packed_scale, rw_stream s, rw_err *err);
rw_status rw_moe_unpack_cuda(rw_wfmt f, rw_moe_mat m, int64_t P, int64_t H, int64_t n_experts,
                             const void *packed, const void *packed_scale, void *logical,
                             void *logical_scale, rw_stream s, rw_err *err);

/* ------------------------------------------------------------------------------------------ */
/* Pieces: what an update delivers                                                              */
/* ------------------------------------------------------------------------------------------ */
typedef enum rw_piece_layout {
    RW_PIECE_PLAIN = 0,   /* [shard_begin, shard_begin+shard_len) along shard_dim of the tensor */
    RW_PIECE_GATE_UP = 1, /* Megatron-style shard of fused gate_up [E, 2I, H]: the piece is
                             [E, 2*len, H] = [gate rows [b, b+len) ; up rows [b, b+len)] */
} rw_piece_layout;

typedef struct rw_piece {
    const char *name;            /* canonical name (per-expert, fused, or .weight_scale_inv) */
    rw_dtype dtype;              /* dtype of the bytes (bf16, or e4m3/u8/f32 for quantized) */
    int ndim;
    int64_t shape[RW_MAX_DIMS];  /* FULL canonical shape of the tensor */
    int shard_dim;               /* -1: the piece is the whole tensor */
    int64_t shard_begin, shard_len;
    rw_piece_layout layout;
    const void *data;            /* contiguous piece bytes, borrowed for the call */
    rw_place place;
    size_t nbytes;               /* bytes at `data` as delivered; 0 = not given (not checked),
                                    otherwise it must equal rw_piece_nbytes() */
} rw_piece;

size_t rw_piece_nbytes(const rw_piece *p);

/* ------------------------------------------------------------------------------------------ */
/* The weight set of one rank                                                                   */
/* ------------------------------------------------------------------------------------------ */
/* All tensors below are views into the set's arena. Shapes are per rank (l = local). */
typedef struct rw_layer_weights {
    rw_wfmt attn_fmt;   /* format of q/k/v/o in this layer */
    rw_wfmt moe_fmt;    /* format of the experts in this layer */
    rw_tensor input_norm, post_norm;   /* bf16 [H] */
    rw_tensor q_norm, k_norm;          /* bf16 [hd] */
    rw_tensor q;        /* [nh_l*hd, H]   bf16 or e4m3 */
    rw_tensor k, v;     /* [nkv_l*hd, H] */
    rw_tensor o;        /* [H, nh_l*hd] */
    /* Fused q/k/v view, bf16 attention only: [(nh_l + 2*nkv_l)*hd, H], the rows of q, then k,
     * then v back to back in one allocation (q.data == qkv.data, k and v follow without a gap),
     * so that one GEMM computes all three projections into rows [q | k | v]. When the layer's
     * attention is quantized (attn_fmt != bf16) q, k, v are separate and qkv is all zero
     * (data NULL). */
    rw_tensor qkv;
    rw_tensor q_scale, k_scale, v_scale, o_scale; /* when quantized: mxfp8 u8 [N, K/32] plain
                                                     (not swizzled); fp8 f32 [N/128, K/128] */
    rw_tensor router;   /* bf16 [E, H] (replicated) */
    rw_tensor w13;      /* experts, packed: bf16 [E, H/64, 2P, 64]; e4m3 [E, 2P, H] */
    rw_tensor w2;       /* bf16 [E, P/64, H, 64]; e4m3 [E, H, P] */
    /* mxfp8: u8 swizzled per expert; fp8: f32 [E, 2P/128, ceil(H/128)], [E, ceil(H/128), P/128] */
    rw_tensor w13_scale, w2_scale;
} rw_layer_weights;

typedef struct rw_wset rw_wset;

/* Allocates (zeroed) every local weight of rank `rank` of `tp` in one arena on `place`, formats
 * chosen by rw_quant_policy(cfg). */
rw_status rw_wset_create(const rw_config *cfg, int tp, int rank, rw_place place, int device,
                         rw_wset **out, rw_err *err);
void rw_wset_destroy(rw_wset *ws);
const rw_config *rw_wset_config(const rw_wset *ws);
const rw_tp_dims *rw_wset_dims(const rw_wset *ws);
const rw_layer_weights *rw_wset_layer(const rw_wset *ws, int layer);
rw_tensor rw_wset_embed(const rw_wset *ws);      /* bf16 [v_local, H], rows past V are zero */
rw_tensor rw_wset_lm_head(const rw_wset *ws);    /* bf16 [v_local, H] */
rw_tensor rw_wset_final_norm(const rw_wset *ws); /* bf16 [H] */
rw_arena *rw_wset_arena(rw_wset *ws);
size_t rw_wset_bytes(const rw_wset *ws);
/* How many writes the weights have taken: rw_wset_apply, rw_wset_apply_batch and
 * rw_wset_batch_launch each count one when they queue bytes. A copy derived from the weights (the
 * CUDA backend's bf16 views of quantized dense layers) is stale when this has changed since it
 * was made; the writes are on the caller's stream, so whoever rebuilds the copy orders itself
 * after them as a forward pass does. */
uint64_t rw_wset_generation(const rw_wset *ws);

/* Checks a piece against the model before anything is written: known name, dtype allowed for the
 * tensor's format, full shape equal to the canonical shape, shard range inside the tensor,
 * byte count = shape of the piece x dtype size. Errors name the tensor. */
rw_status rw_wset_validate_piece(const rw_wset *ws, const rw_piece *p, rw_err *err);
/* Writes the part of the piece this rank owns into its final place: slice from the unpadded
 * offsets, quantize when the layer is quantized and the piece is bf16, pack. Touches only the
 * bytes the piece covers (a partial update leaves everything else identical). Quantized targets
 * receiving bf16 whose quantization block is only partly covered by the piece keep the part in a
 * staging area until the block is complete. `s` is the stream for device work. */
rw_status rw_wset_apply(rw_wset *ws, const rw_piece *p, rw_stream s, rw_err *err);
/* Applies `n` pieces as one batch: validates all of them first (nothing is written when any is
 * refused), then performs the batch; on a device set with a handful of kernel launches (one fused
 * scatter for every copy / quantize-and-pack op of the batch). rw_wset_apply is this with n = 1.
 * Device work is queued on `s`: device pieces must stay valid until `s` reaches it; host pieces
 * are copied before the call returns. Pieces of one batch must not overlap (or must agree).
 * Partly covered quantization blocks are kept on the host until complete; rw_wset_mark_clear()
 * drops them. A set is not safe for concurrent calls. */
rw_status rw_wset_apply_batch(rw_wset *ws, const rw_piece *pieces, size_t n, rw_stream s,
                              rw_err *err);

/* The same apply in two phases, for pipelines whose piece bytes arrive on a device stream after
 * the host work is done (the sync module posts an NCCL receive between the two, and must not
 * allocate or synchronize the device once that receive waits for its sender):
 *   prepare (host only): validates every piece (nothing is recorded when any is refused), cuts
 *     them into scatter ops, stages partly covered quantization blocks and records what the
 *     batch writes (rw_wset_complete). Device pieces are addressed, not read, unless a piece
 *     covers a quantization block only partly (its part is copied to the host on `s`, which
 *     synchronizes `s`); with `no_device_reads` such a batch stops instead and sets
 *     *needs_reads: prepare the same pieces again (reads allowed) once their bytes are there.
 *     Host pieces are read at launch: they must stay valid until then.
 *   launch: on a device set writes the table image (rw_wset_batch_table_bytes; nothing to do
 *     when 0) into `host_table` (pinned host memory, not rewritten by the caller before `s` has
 *     passed this launch), copies it to `dev_table` (device memory of the set's device, read by
 *     the kernels until `s` passes them) on `s`, and launches the kernels; no allocation, no
 *     synchronization. On a host set runs the ops (tables may be NULL).
 * A batch object is reused across batches (its memory is kept); one set at a time. */
typedef struct rw_wset_batch rw_wset_batch;
rw_status rw_wset_batch_create(rw_wset_batch **out, rw_err *err);
void rw_wset_batch_destroy(rw_wset_batch *b);
rw_status rw_wset_batch_prepare(rw_wset *ws, const rw_piece *pieces, size_t n,
                                bool no_device_reads, rw_stream s, rw_wset_batch *b,
                                bool *needs_reads, rw_err *err);
size_t rw_wset_batch_table_bytes(const rw_wset_batch *b);
rw_status rw_wset_batch_launch(rw_wset *ws, rw_wset_batch *b, void *host_table, void *dev_table,
                               rw_stream s, rw_err *err);
/* True when every local weight has been fully written since the last rw_wset_mark_clear(). */
void rw_wset_mark_clear(rw_wset *ws);
bool rw_wset_complete(const rw_wset *ws, char *missing, size_t cap);

/* Canonical readback of this rank's slice of tensor `name` (unpadded, the inverse maps), as the
 * dtype the set stores (bf16, or e4m3 + scale via name ".weight_scale_inv"). `*len` gets the byte
 * count; with dst == NULL only the size is returned. `shape` (may be NULL) gets the slice shape. */
rw_status rw_wset_readback(const rw_wset *ws, const char *name, void *dst, size_t cap, size_t *len,
                           int *ndim, int64_t *shape, rw_err *err);
/* xxh3-64 of the readback bytes (same as rw_checksum64 over a trainer's slice computed with
 * rw_moe_plan_tensor). */
rw_status rw_wset_checksum(const rw_wset *ws, const char *name, uint64_t *out, rw_err *err);

/* ------------------------------------------------------------------------------------------ */
/* Routing and experts on the packed layout                                                     */
/* ------------------------------------------------------------------------------------------ */
/* fp32 softmax over all E router logits, top-k (ties to the lower index), renormalize when
 * norm_topk_prob. logits [T, E] fp32 -> ids [T, k] int32, weights [T, k] fp32. */
void rw_moe_route_ref(const float *logits, int64_t ntok, int E, int k, bool renorm, int32_t *ids,
                      float *weights);

/* out[t] += sum_j weights[t,j] * down_e(silu(gate_e x_t) * up_e x_t) for this rank's padded shard
 * (pads contribute zero), x [ntok, H] fp32, reading the packed expert weights of layer `lw`. */
void rw_moe_experts_ref(const rw_layer_weights *lw, const rw_tp_dims *d, int64_t H,
                        const float *x, int64_t ntok, const int32_t *ids, const float *weights,
                        int k, float *out);
/* Same computation with a caller-provided scratch buffer (no allocation, errors reported):
 * ws must hold rw_moe_experts_ref_workspace(E_l, P, H, k) bytes. H % 64 == 0, P % 128 == 0. */
size_t rw_moe_experts_ref_workspace(int64_t E, int64_t P, int64_t H, int k);
rw_status rw_moe_experts_ref_ws(const rw_layer_weights *lw, const rw_tp_dims *d, int64_t H,
                                const float *x, int64_t ntok, const int32_t *ids,
                                const float *weights, int k, float *out, void *ws,
                                size_t ws_bytes, rw_err *err);

/* CUDA versions (route.cu, experts.cu; RW_E_NO_DEVICE without CUDA). Device pointers, work on `s`.
 * Routing: same rule as rw_moe_route_ref (ties to the lower id), E <= 1024, k <= 32.
 * Experts: x is bf16 [ntok, H] (the GEMM input), out [ntok, H] fp32 is accumulated into (+=) as
 * in the reference; quantized experts are dequantized to bf16 tile by tile (weight-only).
 *   x_lo == NULL: the input is x, and the gate/up products silu(g) * u are rounded to bf16 before
 *     the down projection.
 *   x_lo != NULL (split mode): x_lo is bf16 [ntok, H] too and the input is x + x_lo, about 16
 *     significant bits (for an fp32 value v: x = bf16(v), x_lo = bf16(v - x), both to nearest
 *     even). Each k16 step accumulates W x, then W x_lo, in fp32. This keeps activation rounding
 *     (up to 2^-8 relative in bf16) from deciding near-tied routing downstream. act_pair: the
 *     down projection's input silu(g) * u is kept as the same kind of pair; otherwise it is one
 *     bf16 (the CUDA backend's choice: docs/BENCHMARKS.md has what each costs in accuracy and
 *     time). act_pair is ignored without x_lo.
 * Each output element is one thread's fixed-order sum: a token's result does not depend on the
 * other tokens of the batch, in either mode. H and P multiples of 128. ws holds
 * rw_moe_experts_cuda_workspace(E_l, P, H, max_tok, k) bytes for calls with ntok <= max_tok
 * (either mode).
 * out == NULL (ntok <= RW_MOE_CUDA_CHUNK): the combine is left to the caller. The expert rows stay
 * in ws until its next use: rw_moe_experts_cuda_rows gives y [ntok k, H] fp32 (the rows in sorted
 * order) and inv [ntok k] (assignment t k + j -> its row of y, -1 for an expert not local), and
 * out[t] += sum_j weights[t k + j] y[inv[t k + j]], one fmaf a slot in order from 0, is the
 * combine (worker's rw_k_combine_rmsnorm fuses it into the next norm). */
/* Tokens a pass of rw_moe_experts_cuda: every pass reads all of the layer's expert weights
 * (1.2 GB for Qwen3-30B-A3B), and the workspace holds one pass's rows (y: 64 KB a token of an
 * H = 2048, k = 8 model in fp32). Passes of 16,384 tokens rather than 4096: the expert layer at
 * 16,384 tokens 5.62 -> 4.95 ms on an H100, the 8 x 2k prefill 490.8 -> 474.2 ms, same run
 * (docs/BENCHMARKS.md, forty-eighth session); the workspace follows the engine's token budget,
 * so a budget of 2048 keeps its size. */
#define RW_MOE_CUDA_CHUNK 16384
rw_status rw_moe_route_cuda(const float *logits, int64_t ntok, int E, int k, bool renorm,
                            int32_t *ids, float *weights, rw_stream s, rw_err *err);
size_t rw_moe_experts_cuda_workspace(int64_t E, int64_t P, int64_t H, int64_t max_tok, int k);
rw_status rw_moe_experts_cuda(const rw_layer_weights *lw, const rw_tp_dims *d, int64_t H,
                              const uint16_t *x, const uint16_t *x_lo, bool act_pair, int64_t ntok,
                              const int32_t *ids, const float *weights, int k, float *out,
                              void *ws, size_t ws_bytes, rw_stream s, rw_err *err);
void rw_moe_experts_cuda_rows(void *ws, int64_t E, int64_t P, int64_t H, int64_t ntok, int k,
                              const float **y, const int32_t **inv);
/* Where a call of ntok tokens (one pass: ntok <= RW_MOE_CUDA_CHUNK) keeps its sort of the
 * assignments by expert in ws, for a kernel that sorts them itself (worker's router, for steps
 * of one token group, with moe's sort.cuh): off [E + 1], tiles [ntiles][2] (expert, first sorted
 * row of each tn-row tile), ntiles, perm (sorted row -> assignment), inv (assignment -> sorted
 * row, -1 outside [0, E)), and the tile width tn the call will use. false (d untouched) for more
 * than one pass. rw_moe_experts_cuda_presorted is rw_moe_experts_cuda without its sort: the
 * same ids must have been sorted into these places, on the same stream, before it. */
typedef struct rw_moe_sort_dest {
    int32_t *off, *tiles, *ntiles, *perm, *inv;
    int tn;
} rw_moe_sort_dest;
bool rw_moe_experts_cuda_sort_dest(void *ws, int64_t E, int64_t P, int64_t H, int64_t ntok, int k,
                                   rw_moe_sort_dest *d);
rw_status rw_moe_experts_cuda_presorted(const rw_layer_weights *lw, const rw_tp_dims *d, int64_t H,
                                        const uint16_t *x, const uint16_t *x_lo, bool act_pair,
                                        int64_t ntok, const int32_t *ids, const float *weights,
                                        int k, float *out, void *ws, size_t ws_bytes, rw_stream s,
                                        rw_err *err);

#ifdef __cplusplus
}
#endif

#endif /* RW_MOE_H */
