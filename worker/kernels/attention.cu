/* attention.cu - paged causal attention on tensor cores (attention.h): the launcher, which picks
 * the kernel for a tile size (attention_prefill.cuh: row fragments over warps;
 * attention_decode.cuh: key segments over warps), and the combine kernel of the key split. The
 * per-row arithmetic both kernels share, and why it gives the same bits wherever a row is
 * computed, is in attention_tile.cuh; the reference is attention_ref.c. */
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>

#include "attention.h"
#include "stamps.cuh"

/* the stamps build's ring of this unit (stamps.cuh), which the decode kernel of
 * attention_decode.cuh stamps into too */
RW_STAMPS_UNIT(at, "attn", "acomb")

#include "attention_decode.cuh"
#include "attention_prefill.cuh"
#include "attention_tile.cuh"
#include "cuda_check.h"
#include "launch.cuh"

/* How long a combine CTA waits for its split CTAs before it reports a fault (__trap): far past
 * any split launch (about 17 s of 256-ns sleeps), so only counters left wrong end up here. */
#define ATC_READY_SPINS (1u << 26)

/* Merges the segments of every (token, head) in order (atc_merge_col). With ready (the counters
 * at the start of the split's scratch, attention.h), a CTA waits only for its own (token, head):
 * the split kernel's CTAs each count themselves done on the rows of their tile once their
 * partials are written (atc_decode_kernel), and the CTA merges when all nsplit have, while the
 * split still runs elsewhere; then it sets its counter back to zero. Why: at 32 x 8k the combine
 * of the whole split ended 7-11 us after its last CTA (stamps build, H100, forty-fifth
 * session). Without ready it waits for the whole split. Either way the same merges in the same
 * order. */
__global__ void atc_combine_kernel(const float *__restrict__ part_o,
                                   const float2 *__restrict__ part_ml,
                                   const int32_t *__restrict__ pos, int64_t ntok, int nh, int hd,
                                   unsigned *__restrict__ ready, int nsplit,
                                   uint16_t *__restrict__ out_hi, uint16_t *__restrict__ out_lo) {
    const int64_t th = blockIdx.x; /* token * nh + head */
    const int nseg = pos[th / nh] / ATC_SEG + 1; /* uploaded before the forward pass */
    /* o_proj's GEMV, next, reads only its weights before its wait: scheduled now, its weight
     * copies run beside the attention (launch.cuh) */
    RW_STAMP(t_entry);
    if (ready) {
        rw_pdl_trigger();
        if (threadIdx.x == 0) {
            unsigned n = 0, spins = 0;
            for (;;) {
                asm volatile("ld.acquire.gpu.global.u32 %0, [%1];"
                             : "=r"(n)
                             : "l"(ready + th)
                             : "memory");
                if (n >= (unsigned)nsplit || ++spins == ATC_READY_SPINS) break;
                __nanosleep(256);
            }
            if (n != (unsigned)nsplit) __trap(); /* counters not zeroed, or a split lost */
            ready[th] = 0;
        }
        __syncthreads();
    } else {
        rw_pdl_begin_early();
    }
    RW_STAMP(t_wait);
    const int64_t sstride = ntok * nh; /* between one segment's partials and the next's */
    for (int d = threadIdx.x; d < hd; d += blockDim.x)
        atc_put_out(out_hi, out_lo, th * hd + d,
                    atc_merge_col(part_o, part_ml, sstride, th, hd, d, nseg));
    /* Warp w has read column lines w of this (token, head)'s partial rows (hd a multiple of 32,
     * the rows 128-byte aligned with part_o) and nothing reads them before the next split writes
     * them: dropped from L2, they are never written back to DRAM (attention_tile.cuh). */
    const int w = (int)threadIdx.x >> 5, lane = (int)threadIdx.x & 31;
    if (32 * w < hd && ((uintptr_t)part_o & 127u) == 0) {
        __syncwarp();
        for (int s = lane; s < nseg; s += 32)
            rw_l2_discard128(part_o + ((int64_t)s * sstride + th) * hd + 32 * w);
    }
    /* with ready: complete only after the split has (launch.cuh) */
    if (ready) rw_pdl_wait();
    RW_STAMP_PUT(at, 1, blockIdx.x, t_entry, t_wait, 0);
}

/* ------------------------------------------------------------------------------------------ */
/* launcher                                                                                     */
/* ------------------------------------------------------------------------------------------ */
/* the ready counters at the start of `part`, 256-byte aligned like the partials after them */
#define ATC_READY_BYTES ((size_t)RW_ATTN_READY * 4)
#define ATC_READY_MIN 16

extern "C" size_t rw_k_attention_part_bytes(int64_t ntok, int nh, int hd, int segments) {
    if (segments < 1 || ntok < 1) return 0;
    return ATC_READY_BYTES + (size_t)segments * (size_t)ntok * (size_t)nh * ((size_t)hd * 4 + 8) +
           256;
}

extern "C" int rw_k_attention_tile_tokens(int nh, int nkv) {
    const int group = nkv > 0 ? nh / nkv : 1;
    const int t = group > 0 ? ATC_ROWS / group : 1;
    return t < 1 ? 1 : t > RW_ATTN_QT ? RW_ATTN_QT : t;
}

template <int HD, bool KP>
static rw_status atc_launch(const float *q, rw_kv_planes kv, const rw_attn_tile *tiles, int ntiles,
                            int qt, const int32_t *pos, const int32_t *bt, int bt_stride,
                            int64_t ntok, int nh, int nkv, int bs, int nsplit, void *part,
                            size_t part_bytes, uint16_t *out_hi, uint16_t *out_lo, rw_stream s,
                            rw_err *err) {
    const int group = nh / nkv;
    const bool decode = qt * group <= 16; /* tiles of one fragment (attention_decode.cuh) */
    float *po = NULL;
    float2 *pml = NULL;
    int seg_cap = 0;
    if (nsplit > 0) {
        const size_t per = (size_t)ntok * nh * ((size_t)HD * 4 + 8);
        const size_t fixed = ATC_READY_BYTES + 256;
        seg_cap = part_bytes > fixed ? (int)((part_bytes - fixed) / per) : 0;
        if (seg_cap < 1)
            RW_FAIL(err, RW_E_INVALID_ARG, "attention: %zu bytes of scratch hold no segment",
                    part_bytes);
        po = (float *)((uint8_t *)part + ATC_READY_BYTES);
        pml = (float2 *)((uint8_t *)po + (size_t)seg_cap * ntok * nh * HD * 4);
    }
    /* the combine's counters (attention.h): split launches of decode tiles of at least
     * ATC_READY_MIN tokens whose rows they hold. Below that the combine is short and waiting for
     * the whole split measured faster: engine steps b1 x 1k and 8k 0.4-0.8% slower with the
     * counters, b8 level; from 16 tokens the kernel pair faster (H100, forty-fifth session:
     * 32 x 8k 199.5 -> 195.0 us, 16 x 4k 58 -> 56.5). */
    unsigned *ready = nsplit > 0 && decode && ntok >= ATC_READY_MIN && ntok * nh <= RW_ATTN_READY
                          ? (unsigned *)part
                          : NULL;
    dim3 grid((unsigned)ntiles, (unsigned)nkv, (unsigned)(nsplit > 0 ? nsplit : 1));
    const float qscale = (float)(1.4426950408889634 / sqrt((double)HD));
    cudaStream_t st = (cudaStream_t)s;
    RW_STAMPS_REGISTER(at);
    /* tiles of one fragment (decode) spread key segments over the warps; larger tiles spread
     * their row fragments; the smem attributes are the kernels' fixed needs, so captured graphs
     * stay launchable whatever is launched in between */
    if (decode) {
        /* unsplit: the keys on the MMA's M side (atc_block_t), in one row fragment for up to 8
         * rows (a b256 step: 160.1 -> 140.9 us a layer for 256 x 1k keys on an H200); split:
         * the rows on the M side (atc_block), which measured faster when few CTAs share the
         * GPU (32 x 8k in 2 splits: 178 vs 208 us; a b1 step 11.9 vs 14.3 us). Both give the
         * same bits (docs/BENCHMARKS.md, fifth session). Split tiles of up to 8 rows without
         * KP take atc_block's packed form (PACK: the q pair in the one fragment; PK the split
         * kernel of such tiles, with KP atc_block's): on an H200 the kernel at 1 x 4k
         * 10.5 -> 9.5 us, 32 x 8k 156.1 -> 154.0, 8 x 4k 27.1 -> 28.0; engine steps b1 x 1k
         * 1.6% and b8 x 4k 0.8% faster (thirtieth session). */
        const bool one = qt * group <= 8;
        constexpr int PK = KP ? 2 : 1;
        const atc_decode_launch<HD, KP> f = nsplit > 0 ? (one ? atc_decode_form<HD, false, PK, KP>()
                                                              : atc_decode_form<HD, false, 2, KP>())
                                            : one      ? atc_decode_form<HD, true, 1, KP>()
                                                       : atc_decode_form<HD, true, 2, KP>();
        RW_CUDA_CHECK(err, cudaFuncSetAttribute(f.kern, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                (int)f.smem));
        (void)rw_launch_pdl(f.kern, grid, ATC_DW * 32, f.smem, st, q, kv.k, kv.v, kv.k_lo, kv.v_lo,
                            tiles, pos, bt, bt_stride, nh, nkv, bs, nsplit, qscale, out_hi, out_lo,
                            po, pml, ntok, seg_cap, ready);
    } else {
        const size_t sm = atc_smem<HD, KP>();
        RW_CUDA_CHECK(err,
                      cudaFuncSetAttribute(atc_kernel<HD, KP>,
                                           cudaFuncAttributeMaxDynamicSharedMemorySize, (int)sm));
        (void)rw_launch_pdl(atc_kernel<HD, KP>, grid, ATC_THREADS, sm, st, q, kv.k, kv.v, kv.k_lo,
                            kv.v_lo, tiles, pos, bt, bt_stride, nh, nkv, bs, nsplit, qscale, out_hi,
                            out_lo, po, pml, ntok, seg_cap);
    }
    RW_CHECK(LAUNCH_CHECK(s, "attention"));
    if (nsplit > 0) {
        (void)rw_launch_pdl(atc_combine_kernel, dim3((unsigned)(ntok * nh)), 128, 0, st, po, pml,
                            pos, ntok, nh, HD, ready, nsplit, out_hi, out_lo);
        RW_CHECK(LAUNCH_CHECK(s, "attention combine"));
    }
    return RW_OK;
}

extern "C" rw_status rw_k_attention(const float *q, rw_kv_planes kv, const rw_attn_tile *tiles,
                                    int ntiles, int qt, const int32_t *pos, const int32_t *bt,
                                    int bt_stride, int64_t ntok, int nh, int nkv, int hd, int bs,
                                    int nsplit, void *part, size_t part_bytes, uint16_t *out_hi,
                                    uint16_t *out_lo, rw_stream s, rw_err *err) {
    if (ntiles <= 0) return RW_OK;
    if (nkv < 1 || nh % nkv)
        RW_FAIL(err, RW_E_UNSUPPORTED, "attention: %d heads over %d kv heads", nh, nkv);
    if (nh / nkv > 16)
        RW_FAIL(err, RW_E_UNSUPPORTED, "attention: %d q heads per kv head (at most 16)", nh / nkv);
    if (qt < 1 || qt > RW_ATTN_QT || qt * (nh / nkv) > ATC_ROWS)
        RW_FAIL(err, RW_E_INVALID_ARG,
                "attention: tiles of up to %d tokens of %d heads (1..%d tokens, at most %d rows)",
                qt, nh / nkv, RW_ATTN_QT, ATC_ROWS);
    if (bs % 16 != 0) RW_FAIL(err, RW_E_UNSUPPORTED, "attention: block size %d %% 16", bs);
    if (nsplit < 0 || (nsplit > 0 && !part))
        RW_FAIL(err, RW_E_INVALID_ARG, "attention: nsplit %d without scratch", nsplit);
    if (!kv.k_lo != !kv.v_lo)
        RW_FAIL(err, RW_E_INVALID_ARG,
                "attention: the low halves of the K cache without those of V, or back");
    /* the prefill kernel stores two adjacent columns at a time */
    if (((uintptr_t)out_hi | (uintptr_t)out_lo) & 3u)
        RW_FAIL(err, RW_E_INVALID_ARG, "attention: output arrays not 4-byte aligned");
    const bool kp = kv.k_lo != NULL;
#define ATC_LAUNCH(HD)                                                                             \
    (kp ? atc_launch<HD, true>(q, kv, tiles, ntiles, qt, pos, bt, bt_stride, ntok, nh, nkv, bs,    \
                               nsplit, part, part_bytes, out_hi, out_lo, s, err)                   \
        : atc_launch<HD, false>(q, kv, tiles, ntiles, qt, pos, bt, bt_stride, ntok, nh, nkv, bs,   \
                                nsplit, part, part_bytes, out_hi, out_lo, s, err))
    switch (hd) {
    case 32: return ATC_LAUNCH(32);
    case 64: return ATC_LAUNCH(64);
    case 128: return ATC_LAUNCH(128);
    default: RW_FAIL(err, RW_E_UNSUPPORTED, "attention: head_dim %d (32, 64 or 128)", hd);
    }
#undef ATC_LAUNCH
}
