/* experts.cu - the expert computation on the packed layout, on the device (rw_moe_experts_cuda):
 * the pipeline below, the combine, and the workspace. The sort is expert_sort.cu, the GEMM passes
 * expert_gemm.cu (shared declarations in experts_internal.cuh); the routing is route.cu. CPU
 * reference: rw_moe_experts_ref (experts.c).
 *
 * Pipeline of rw_moe_experts_cuda for a chunk of nt tokens (A = nt * k assignments):
 *   1-3. sort:   counts per local expert, offsets, tile list of TN-row tiles per expert, and a
 *                stable sort of the assignments by expert -> perm (sorted row -> assignment) and
 *                inv (assignment -> sorted row); same order on every run     (1 CTA)
 *   4. w13 GEMM: for each (tile, 128 packed rows of w13): acc = W13 x^T with tensor cores
 *                (bf16, fp32 accumulate: wgmma on sm_90a builds, mma.sync m16n8k16 on others;
 *                the same bits, expert_gemm.cu); the packed row order puts up_j in
 *                rows 0-7 and gate_j in rows 8-15 of every 16-row group, so one thread holds
 *                both halves: act[row][j] = bf16(silu(gate) * up)
 *                (grid 2P/128 x tiles: the row blocks along x, expert_gemm.cu's launch_gemm)
 *   5. w2 GEMM:  y[row][h] = W2 act^T, rows un-shuffled to canonical h     (grid H/128 x tiles)
 *   6. combine:  out[t] += sum_j w[t, j] * y[inv[t*k + j]] in slot order      (deterministic)
 * mxfp8 and fp8-block layers run weight-only: the e4m3 tile is dequantized to bf16 (exactly:
 * e4m3 times a power of two, or times the fp32 block scale rounded to bf16 for fp8-block) and the
 * math is bf16. fp8-block tiles, and mxfp8 tiles without wgmma, dequantize into a bf16 tile in
 * shared memory; mxfp8 tiles on wgmma convert straight into the MMA's A registers
 * (mx_fragments.cuh). Every output element is computed by one thread in a fixed
 * order, so results do not depend on the run or on atomics.
 *
 * Split activations (x_lo != NULL): the GEMM inputs carry about 16 significant bits as a pair of
 * bf16 arrays, x ~= hi + lo (hi = bf16(x), lo = bf16(x - hi)). Each k16 step of w13 then runs
 * two mma into the same fp32 accumulators, acc += W hi, then acc += W lo (always in that order).
 * Rounding the expert input to bf16 is what flips near-tied routing decisions of later layers;
 * the weights are unchanged (the products stay exact in fp32), only the B tile doubles. With
 * act_pair the w13 epilogue writes act as such a pair too and w2 runs the same two mma; without
 * it act is one bf16, which moved no routing decision in the CPU emulation of the backend on
 * either test fixture (tests/worker/test_cuda_numerics.c) and halves w2's mma and input bytes.
 *
 * Shared-memory tiles are [rows][8 x 16-byte chunks] with chunk c of row r stored at c ^ (r & 7)
 * (rw_swz128) so ldmatrix reads are free of bank conflicts; the PTX wrappers are core/mma.cuh. */
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stdint.h>
#include <string.h>

#include <type_traits>

#include "cuda_check.h"
#include "experts_internal.cuh"
#include "launch.cuh"
#include "route.cuh"

#define MAX_TOPK RW_MOE_MAX_TOPK

/* out[t, h] += sum_j w[t, j] * y[inv[t*k + j], h], slots in order. A CTA takes one token and
 * COMBINE_THREADS * V columns: the token's k rows and weights are read once, and each thread issues
 * its k loads of y (V columns each: 16-byte loads where H and the pointers allow) before the first
 * add. (One CTA per token walking all H columns waited on k dependent loads per column: 31 us for a
 * one-token decode step, measured with ncu on an H200, against 5 us for the sort and 45 us for both
 * GEMMs; one column a thread, a b256 step's combine took 13.7 us a layer.) The sum is the same
 * fmaf chain in slot order whatever V, so the choice of V (by H and alignment, never by the
 * batch) does not change a bit. KMAX: the slots held in registers, k <= KMAX. */
#define COMBINE_THREADS 256
template <int V, int KMAX>
__global__ void __launch_bounds__(COMBINE_THREADS)
    combine_kernel(const float *__restrict__ y, const int32_t *__restrict__ inv,
                   const float *__restrict__ wts, int64_t nt, int k, int64_t H,
                   float *__restrict__ out) {
    __shared__ int32_t rows[MAX_TOPK];
    __shared__ float ws[MAX_TOPK];
    const int64_t t = blockIdx.x;
    /* the token's rows and weights before the PDL wait: the sort and the router wrote them two or
     * more kernels back (launch.cuh), read through L2; y, the w2 pass's output, after it */
    if (threadIdx.x < k) {
        rows[threadIdx.x] = __ldcg(inv + t * k + threadIdx.x);
        ws[threadIdx.x] = __ldcg(wts + t * k + threadIdx.x);
    }
    rw_pdl_begin();
    __syncthreads();
    const int64_t h = ((int64_t)blockIdx.y * COMBINE_THREADS + threadIdx.x) * V;
    if (h >= H) return;
    typedef typename std::conditional<V == 4, float4, float>::type vec;
    vec yv[KMAX];
#pragma unroll
    for (int j = 0; j < KMAX; j++) {
        if (j < k && rows[j] >= 0)
            yv[j] = *(const vec *)(y + (int64_t)rows[j] * H + h);
        else
            memset(&yv[j], 0, sizeof(vec));
    }
    float s[V];
#pragma unroll
    for (int c = 0; c < V; c++)
        s[c] = 0.0f;
#pragma unroll
    for (int j = 0; j < KMAX; j++)
        if (j < k && rows[j] >= 0) {
            const float *f = (const float *)&yv[j];
#pragma unroll
            for (int c = 0; c < V; c++)
                s[c] = fmaf(ws[j], f[c], s[c]);
        }
    vec *o = (vec *)(out + t * H + h);
    vec ov = *o;
    float *of = (float *)&ov;
#pragma unroll
    for (int c = 0; c < V; c++)
        of[c] += s[c];
    *o = ov;
}

/* The combine of nt tokens: 4 columns a thread where H and the pointers allow, the top-k slots in
 * registers (8 for k <= 8). */
static rw_status combine_launch(const float *y, const int32_t *inv, const float *wts, int64_t nt,
                                int k, int64_t H, float *out, cudaStream_t st, rw_err *err) {
    const bool v4 = H % 4 == 0 && ((uintptr_t)y | (uintptr_t)out) % 16 == 0;
    const int64_t cols = COMBINE_THREADS * (v4 ? 4 : 1);
    const dim3 grid((unsigned)nt, (unsigned)((H + cols - 1) / cols));
    auto kern = v4 ? (k <= 8 ? combine_kernel<4, 8> : combine_kernel<4, MAX_TOPK>)
                   : (k <= 8 ? combine_kernel<1, 8> : combine_kernel<1, MAX_TOPK>);
    (void)rw_launch_pdl(kern, grid, COMBINE_THREADS, 0, st, y, inv, wts, nt, k, H, out);
    return RW_LAUNCH_CHECK((rw_stream)st, "moe combine", err);
}

/* ------------------------------------------------------------------------------------------ */
/* launchers                                                                                    */
/* ------------------------------------------------------------------------------------------ */
/* Workspace carve-up for a chunk of up to max_tok tokens. */
typedef struct moe_ws {
    int32_t *off, *perm, *inv, *ntiles;
    int2 *tiles;
    __nv_bfloat16 *act, *act_lo;
    float *y;
    size_t bytes;
} moe_ws;

static int64_t max_tiles(int64_t A, int64_t E, int tn) {
    return (A + tn - 1) / tn + E;
}

static moe_ws ws_layout(void *base, int64_t E, int64_t P, int64_t H, int64_t max_tok, int k) {
    moe_ws w;
    uint8_t *p = (uint8_t *)base;
    size_t o = 0;
    const int64_t A = max_tok * k;
#define TAKE(field, type, n)                                                                       \
    w.field = (type *)(p ? p + o : NULL);                                                          \
    o += ((size_t)(n) * sizeof(type) + 255) & ~(size_t)255;
    TAKE(off, int32_t, E + 1);
    TAKE(perm, int32_t, A);
    TAKE(inv, int32_t, A);
    TAKE(ntiles, int32_t, 1);
    TAKE(tiles, int2, max_tiles(A, E, MOE_TN_MIN));
    TAKE(act, __nv_bfloat16, A * P);
    TAKE(act_lo, __nv_bfloat16, A * P); /* act pairs only; reserved always */
    TAKE(y, float, A *H);
#undef TAKE
    w.bytes = o;
    return w;
}

/* Tokens per pass: bounds the y buffer ([chunk * k, H] fp32). */
#define MOE_CHUNK RW_MOE_CUDA_CHUNK
/* the tokens of the passes of a call with ntok tokens (at least 1): the workspace's layout */
static int64_t moe_chunk(int64_t ntok) {
    return ntok < 1 ? 1 : ntok < MOE_CHUNK ? ntok : MOE_CHUNK;
}

extern "C" size_t rw_moe_experts_cuda_workspace(int64_t E, int64_t P, int64_t H, int64_t max_tok,
                                                int k) {
    return ws_layout(NULL, E, P, H, moe_chunk(max_tok), k).bytes;
}

extern "C" void rw_moe_experts_cuda_rows(void *ws, int64_t E, int64_t P, int64_t H, int64_t ntok,
                                         int k, const float **y, const int32_t **inv) {
    const moe_ws w = ws_layout(ws, E, P, H, moe_chunk(ntok), k);
    *y = w.y;
    *inv = w.inv;
}

/* the tile width of a pass of A assignments over E experts: narrow tiles for decode-sized
 * batches (tokens per expert decide it) */
static int moe_tn(int64_t A, int64_t E) {
    return A <= E ? MOE_TN_MIN : A / E <= 48 ? 32 : 128;
}

extern "C" bool rw_moe_experts_cuda_sort_dest(void *ws, int64_t E, int64_t P, int64_t H,
                                              int64_t ntok, int k, rw_moe_sort_dest *d) {
    if (ntok < 1 || ntok > MOE_CHUNK || k < 1 || !d) return false;
    const moe_ws w = ws_layout(ws, E, P, H, moe_chunk(ntok), k);
    d->off = w.off;
    d->tiles = (int32_t *)w.tiles;
    d->ntiles = w.ntiles;
    d->perm = w.perm;
    d->inv = w.inv;
    d->tn = moe_tn(ntok * k, E);
    return true;
}

/* rw_moe_experts_cuda, and without its sort (presorted, one pass) */
static rw_status experts_run(const rw_layer_weights *lw, const rw_tp_dims *d, int64_t H,
                             const uint16_t *x, const uint16_t *x_lo, bool act_pair, int64_t ntok,
                             const int32_t *ids, const float *weights, int k, float *out, void *ws,
                             size_t ws_bytes, bool presorted, rw_stream s, rw_err *err) {
    if (ntok <= 0) return RW_OK;
    if (presorted && ntok > MOE_CHUNK)
        return rw_err_set(err, RW_E_INVALID_ARG, __FILE__, __LINE__,
                          "moe experts (cuda): presorted call of %lld tokens (one pass holds %d)",
                          (long long)ntok, MOE_CHUNK);
    if (!lw || !d || !x || !ids || !weights || !ws || k < 1)
        return rw_err_set(err, RW_E_INVALID_ARG, __FILE__, __LINE__,
                          "moe experts (cuda): NULL argument or k = %d", k);
    if (!out && ntok > MOE_CHUNK)
        return rw_err_set(err, RW_E_INVALID_ARG, __FILE__, __LINE__,
                          "moe experts (cuda): no output for %lld tokens (the rows are left in "
                          "the workspace for at most %d)",
                          (long long)ntok, MOE_CHUNK);
    const int64_t P = d->P, E = lw->w13.shape[0];
    if (E > 1024)
        return rw_err_set(err, RW_E_UNSUPPORTED, __FILE__, __LINE__,
                          "moe experts (cuda): %lld local experts (at most 1024)", (long long)E);
    if (H % 128 != 0 || P % 128 != 0)
        return rw_err_set(err, RW_E_UNSUPPORTED, __FILE__, __LINE__,
                          "moe experts (cuda): H = %lld and P = %lld must be multiples of 128",
                          (long long)H, (long long)P);
    if (lw->moe_fmt == RW_WFMT_MXFP8 && (H > MOE_MX_MAX_K || P > MOE_MX_MAX_K))
        return rw_err_set(err, RW_E_UNSUPPORTED, __FILE__, __LINE__,
                          "moe experts (cuda): mxfp8 with H = %lld, P = %lld (at most %d)",
                          (long long)H, (long long)P, MOE_MX_MAX_K);
    const int64_t chunk = moe_chunk(ntok);
    const size_t need = rw_moe_experts_cuda_workspace(E, P, H, chunk, k);
    if (ws_bytes < need)
        return rw_err_set(err, RW_E_INVALID_ARG, __FILE__, __LINE__,
                          "moe experts (cuda): workspace %zu bytes, needs %zu", ws_bytes, need);
    const moe_ws w = ws_layout(ws, E, P, H, chunk, k);
    const int fmt = lw->moe_fmt == RW_WFMT_BF16    ? FMT_BF16
                    : lw->moe_fmt == RW_WFMT_MXFP8 ? FMT_MX
                                                   : FMT_FP8B;
    const bool split = x_lo != NULL, split2 = split && act_pair; /* w13's input, w2's */
    cudaStream_t st = (cudaStream_t)s;
    int sms = 0;
    RW_CHECK(rw_cuda_sm_count(&sms, err));
    for (int64_t t0 = 0; t0 < ntok; t0 += chunk) {
        const int64_t nt = ntok - t0 < chunk ? ntok - t0 : chunk;
        const int64_t A = nt * k;
        const int32_t *cid = ids + t0 * k;
        const int tn = moe_tn(A, E);
        if (!presorted)
            RW_CHECK(moe_sort_launch(cid, A, (int)E, tn, w.off, w.tiles, w.ntiles, w.perm, w.inv,
                                     st, err));

        gemm_args g;
        memset(&g, 0, sizeof g);
        g.P = P;
        g.H = H;
        g.E = E;
        g.perm = w.perm;
        g.off = w.off;
        g.tiles = w.tiles;
        g.ntiles = w.ntiles;
        g.k = k;
        g.act = w.act;
        g.act_lo = split2 ? w.act_lo : NULL; /* w13 writes act's low half only for w2's pair */
        g.y = w.y;
        /* tiles: at most one per tn rows plus one partial per expert, and never more than the
         * assignments (a decode step of A = 8 launches 8 tiles of CTAs, not E + 1) */
        const int64_t grid_x = max_tiles(A, E, tn) < A ? max_tiles(A, E, tn) : A;
        /* w13: M = 2P rows, K = H */
        g.w = lw->w13.data;
        g.wscale = lw->w13_scale.data;
        g.w_expert = (int64_t)(rw_tensor_nbytes(&lw->w13) / (size_t)E);
        g.s_expert = fmt == FMT_BF16 ? 0 : (int64_t)(rw_tensor_nbytes(&lw->w13_scale) / (size_t)E);
        g.M = 2 * P;
        g.K = H;
        g.scale_cols = fmt == FMT_MX ? (H / 32 + 3) / 4 : (H + 127) / 128;
        g.xin = (const __nv_bfloat16 *)(x + t0 * H);
        g.xin_lo = split ? (const __nv_bfloat16 *)(x_lo + t0 * H) : NULL;
        RW_CHECK(moe_gemm_pass(true, tn, fmt, split, g, grid_x, sms, s, err));
        /* w2: M = H rows, K = P, input act rows in sorted order */
        g.w = lw->w2.data;
        g.wscale = lw->w2_scale.data;
        g.w_expert = (int64_t)(rw_tensor_nbytes(&lw->w2) / (size_t)E);
        g.s_expert = fmt == FMT_BF16 ? 0 : (int64_t)(rw_tensor_nbytes(&lw->w2_scale) / (size_t)E);
        g.M = H;
        g.K = P;
        g.scale_cols = fmt == FMT_MX ? (P / 32 + 3) / 4 : (P + 127) / 128;
        g.xin = w.act;
        g.xin_lo = split2 ? w.act_lo : NULL;
        RW_CHECK(moe_gemm_pass(false, tn, fmt, split2, g, grid_x, sms, s, err));
        if (out)
            RW_CHECK(combine_launch(w.y, w.inv, weights + t0 * k, nt, k, H, out + t0 * H, st, err));
    }
    return RW_OK;
}

extern "C" rw_status rw_moe_experts_cuda(const rw_layer_weights *lw, const rw_tp_dims *d, int64_t H,
                                         const uint16_t *x, const uint16_t *x_lo, bool act_pair,
                                         int64_t ntok, const int32_t *ids, const float *weights,
                                         int k, float *out, void *ws, size_t ws_bytes, rw_stream s,
                                         rw_err *err) {
    return experts_run(lw, d, H, x, x_lo, act_pair, ntok, ids, weights, k, out, ws, ws_bytes, false,
                       s, err);
}

extern "C" rw_status
rw_moe_experts_cuda_presorted(const rw_layer_weights *lw, const rw_tp_dims *d, int64_t H,
                              const uint16_t *x, const uint16_t *x_lo, bool act_pair, int64_t ntok,
                              const int32_t *ids, const float *weights, int k, float *out, void *ws,
                              size_t ws_bytes, rw_stream s, rw_err *err) {
    return experts_run(lw, d, H, x, x_lo, act_pair, ntok, ids, weights, k, out, ws, ws_bytes, true,
                       s, err);
}
