/* attention_prefill.cuh - the attention kernel of tiles larger than one MMA fragment (prefill
 * chunks): the tile's 16-row fragments spread over 4 warps, keys staged for the CTA in 64-key
 * blocks. Per-row arithmetic in attention_tile.cuh; launched by attention.cu. */
#ifndef RW_WORKER_KERNELS_ATTENTION_PREFILL_CUH
#define RW_WORKER_KERNELS_ATTENTION_PREFILL_CUH

#include "attention_tile.cuh"
#include "launch.cuh"

template <int HD, bool KP>
__global__ void __launch_bounds__(ATC_THREADS, 2)
    atc_kernel(const float *__restrict__ q, const uint16_t *__restrict__ kc,
               const uint16_t *__restrict__ vc, const uint16_t *__restrict__ kcl,
               const uint16_t *__restrict__ vcl, const rw_attn_tile *__restrict__ tiles,
               const int32_t *__restrict__ pos, const int32_t *__restrict__ bt, int bt_stride,
               int nh, int nkv, int bs, int nsplit, float qscale, uint16_t *__restrict__ out_hi,
               uint16_t *__restrict__ out_lo, float *__restrict__ part_o,
               float2 *__restrict__ part_ml, int64_t ntok, int seg_cap) {
    rw_pdl_begin();
    constexpr int BLK = ATC_KB * HD * 2;       /* bytes of K (or V) per block */
    constexpr int NP = KP ? 4 : 2;             /* planes a stage: K, V (KP: then K_lo, V_lo) */
    constexpr int KS = HD / 16;                /* head-dim k16 steps */
    constexpr int DN = HD / 8;                 /* output n8 fragments */
    extern __shared__ __align__(128) uint8_t sm[];
    uint8_t *stage = sm;                        /* 2 stages of NP blocks */
    float *oacc = (float *)(sm + 2 * NP * BLK); /* [4 warps][HD/2][32] merged o */

    const rw_attn_tile tl = tiles[blockIdx.x];
    const int g = blockIdx.y, split = blockIdx.z;
    const int group = nh / nkv;
    const int nrows = tl.ntok * group;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int r0 = warp * 16 + (lane >> 2), r1 = r0 + 8; /* this lane's two rows */
    const bool active = warp * 16 < nrows;
    const int32_t plast = pos[tl.tok0 + tl.ntok - 1];
    const int nblk = plast / ATC_KB + 1;
    const int nseg = plast / ATC_SEG + 1;
    const int32_t *blocks = bt + (int64_t)tl.seq * bt_stride;

    uint32_t qh[KS][4], ql[KS][4];
    int32_t qp0, qp1;
    atc_load_q<HD>(q, pos, tl, g, group, nh, nrows, r0, r1, qscale, qh, ql, qp0, qp1);

    /* the blocks this CTA walks: segments split, split + nsplit, ..., BPS blocks each */
    constexpr int BPS = ATC_SEG / ATC_KB;
    static_assert(BPS * ATC_KB == ATC_SEG, "a segment is whole staged blocks");
    const int sstep = nsplit > 0 ? nsplit : 1;
    const int sfirst = nsplit > 0 ? split : 0;
    /* the idx-th block of this CTA, or -1 */
    auto block_of = [&](int idx) -> int {
        const int sg = sfirst + (idx / BPS) * sstep;
        const int b = sg * BPS + (idx % BPS);
        return (sg < nseg && b < nblk) ? b : -1;
    };
    auto load = [&](int buf, int b) {
        uint8_t *kd = stage + (size_t)buf * NP * BLK;
        /* the first NP planes: K, V (KP: then K_lo, V_lo) */
        uint8_t *const d[4] = {kd, kd + BLK, kd + 2 * BLK, kd + 3 * BLK};
        const uint16_t *const c[4] = {kc, vc, kcl, vcl};
        atc_load_keys<HD, ATC_THREADS, NP>(d, c, blocks, b * ATC_KB, ATC_KB, plast, nkv, g, bs,
                                           tid);
    };

    /* merged result (nsplit 0) */
    float Mt0 = -INFINITY, Mt1 = -INFINITY, Lt0 = 0.0f, Lt1 = 0.0f;
    float *oa = oacc + (size_t)warp * (HD / 2) * 32;
    if (nsplit == 0 && active)
        for (int i = 0; i < HD / 2; i++)
            oa[i * 32 + lane] = 0.0f;

    /* per-segment state */
    float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.0f, l1 = 0.0f;
    float o[DN][4];
#pragma unroll
    for (int d = 0; d < DN; d++)
#pragma unroll
        for (int i = 0; i < 4; i++)
            o[d][i] = 0.0f;

    int cur = block_of(0);
    if (cur >= 0) load(0, cur);
    rw_cp_async_commit();
    for (int idx = 0; cur >= 0; idx++) {
        const int nxt = block_of(idx + 1);
        if (nxt >= 0) load((idx + 1) & 1, nxt);
        rw_cp_async_commit();
        rw_cp_async_wait<1>();
        __syncthreads();
        const uint8_t *kd = stage + (size_t)(idx & 1) * NP * BLK;
        const uint8_t *vd = kd + BLK;
        if (active) {
#pragma unroll 1
            for (int sub = 0; sub < ATC_KB / ATC_SB; sub++)
                atc_block<HD, KP>(kd + sub * ATC_SB * HD * 2, vd + sub * ATC_SB * HD * 2, 2 * BLK,
                                  cur * ATC_KB + sub * ATC_SB, qh, ql, qp0, qp1, m0, m1, l0, l1, o);
        }
        /* end of a segment: merge (nsplit 0) or write the partial */
        const int nb = block_of(idx + 1);
        const bool seg_end = nb < 0 || nb / BPS != cur / BPS;
        if (seg_end && active) {
            const int sg = cur / BPS;
            if (nsplit == 0) {
                float a0 = 0.0f, b0 = 0.0f, a1 = 0.0f, b1 = 0.0f;
                const bool u0 = rw_attn_merge_ml(Mt0, Lt0, m0, l0, a0, b0);
                const bool u1 = rw_attn_merge_ml(Mt1, Lt1, m1, l1, a1, b1);
#pragma unroll
                for (int d = 0; d < DN; d++)
#pragma unroll
                    for (int i = 0; i < 4; i++) {
                        const bool hi = i & 2;
                        if (hi ? !u1 : !u0) continue;
                        float &O = oa[(d * 4 + i) * 32 + lane];
                        O = __fadd_rn(__fmul_rn(O, hi ? a1 : a0), __fmul_rn(o[d][i], hi ? b1 : b0));
                    }
            } else if (sg < seg_cap) {
                atc_write_part<HD>(part_o, part_ml, tl, g, group, nh, nrows, r0, r1, sg, ntok, m0,
                                   m1, l0, l1, o);
            }
            m0 = m1 = -INFINITY;
            l0 = l1 = 0.0f;
#pragma unroll
            for (int d = 0; d < DN; d++)
#pragma unroll
                for (int i = 0; i < 4; i++)
                    o[d][i] = 0.0f;
        }
        __syncthreads(); /* the buffer is reloaded by the next iteration's prefetch */
        cur = nb;
    }
    rw_cp_async_wait<0>();
    if (nsplit != 0 || !active) return;
    for (int i = 0; i < HD / 2; i++)
        atc_store_out<HD>(out_hi, out_lo, tl, g, group, nh, nrows, r0, r1, i, oa[i * 32 + lane],
                          Lt0, Lt1);
}

template <int HD, bool KP> static constexpr size_t atc_smem() {
    return (size_t)2 * (KP ? 4 : 2) * ATC_KB * HD * 2 + (size_t)4 * (HD / 2) * 32 * 4;
}

#endif
