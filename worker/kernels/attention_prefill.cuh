/* attention_prefill.cuh - the attention kernel of tiles larger than one MMA fragment (prefill
 * chunks): the tile's 16-row fragments spread over 4 warps, keys staged for the CTA in 64-key
 * blocks. Per-row arithmetic in attention_tile.cuh; launched by attention.cu.
 *
 * Work outside the softmax blocks. Nsight Compute of an 8 x 2k prefill (H100) put only a third
 * of the kernel's instructions in the softmax blocks: a fifth went to the final stores (each
 * element's row index recomputed, two 2-byte stores, a branch), a sixth to the segment merges
 * (a branch an element) and an eighth to the key copies. So the merged o sits in shared memory
 * as a float4 a lane and n8 fragment, the merge selects instead of branching, the stores write
 * two columns at a time from each row's index computed once, the copies take their block ids
 * from a lane of the warp read a segment ahead, and the two softmax blocks of a staged block
 * are unrolled. The same arithmetic in the same order (the GPU suite compares the rows byte for
 * byte with the decode kernels'); the kernel 8 x 2k 2.42-2.46 -> 1.94-1.95 ms, 1 x 8k 3.95-4.00
 * -> 3.36 ms (docs/BENCHMARKS.md, forty-seventh session). */
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
    /* [4 warps][HD / 8][32 lanes] merged o, a float4 a lane and n8 fragment (its o[d][0..3]),
     * so a segment's merge and the final stores read and write it 16 bytes at a time */
    float4 *oacc = (float4 *)(sm + 2 * NP * BLK);

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
    /* The block ids of the segment being staged (ids, its 16-key groups one a lane: atc_seg_ids)
     * and of the CTA's next segment (ids_next), read when the copies enter a segment: the top
     * stall of the kernel had been a copy's address waiting for its block table load.
     * seg_ids(k): the ids of the CTA's k-th segment. */
    auto seg_ids = [&](int k) -> int32_t {
        const int sg = sfirst + k * sstep;
        return atc_seg_ids(blocks, sg < nseg ? sg : -1, plast, bs, lane);
    };
    int kseg = 0;
    int32_t ids = seg_ids(0), ids_next = seg_ids(1);
    /* stages the idx-th block of this CTA (b = block_of(idx) >= 0) into buffer buf */
    auto load = [&](int buf, int idx, int b) {
        if (idx / BPS != kseg) { /* the next segment: idx / BPS == kseg + 1 */
            kseg++;
            ids = ids_next;
            ids_next = seg_ids(kseg + 1);
        }
        uint8_t *kd = stage + (size_t)buf * NP * BLK;
        /* the first NP planes: K, V (KP: then K_lo, V_lo) */
        uint8_t *const d[4] = {kd, kd + BLK, kd + 2 * BLK, kd + 3 * BLK};
        const uint16_t *const c[4] = {kc, vc, kcl, vcl};
#pragma unroll
        for (int gi = 0; gi < ATC_KB / 16; gi++) {
            const int kp0 = b * ATC_KB + 16 * gi;
            const int64_t base =
                atc_seg_base(ids, (idx % BPS) * (ATC_KB / 16) + gi, kp0, nkv, g, bs, HD);
            atc_load_group<HD, ATC_THREADS, NP>(d, c, 16 * gi, kp0, base, plast, tid);
        }
    };

    /* merged result (nsplit 0) */
    float Mt0 = -INFINITY, Mt1 = -INFINITY, Lt0 = 0.0f, Lt1 = 0.0f;
    float4 *oa = oacc + (size_t)warp * DN * 32 + lane;
    if (nsplit == 0 && active)
        for (int d = 0; d < DN; d++)
            oa[d * 32] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);

    /* per-segment state */
    float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.0f, l1 = 0.0f;
    float o[DN][4];
#pragma unroll
    for (int d = 0; d < DN; d++)
#pragma unroll
        for (int i = 0; i < 4; i++)
            o[d][i] = 0.0f;

    int cur = block_of(0);
    if (cur >= 0) load(0, 0, cur);
    rw_cp_async_commit();
    for (int idx = 0; cur >= 0; idx++) {
        const int nxt = block_of(idx + 1);
        if (nxt >= 0) load((idx + 1) & 1, idx + 1, nxt);
        rw_cp_async_commit();
        rw_cp_async_wait<1>();
        __syncthreads();
        const uint8_t *kd = stage + (size_t)(idx & 1) * NP * BLK;
        const uint8_t *vd = kd + BLK;
        if (active) {
#pragma unroll
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
                /* O = O*a + o*b for the rows merged (u), by selects rather than a branch an
                 * element: the same values */
                if (u0 || u1) {
#pragma unroll
                    for (int d = 0; d < DN; d++) {
                        float4 O = oa[d * 32];
                        const float x = __fadd_rn(__fmul_rn(O.x, a0), __fmul_rn(o[d][0], b0));
                        const float y = __fadd_rn(__fmul_rn(O.y, a0), __fmul_rn(o[d][1], b0));
                        const float z = __fadd_rn(__fmul_rn(O.z, a1), __fmul_rn(o[d][2], b1));
                        const float w = __fadd_rn(__fmul_rn(O.w, a1), __fmul_rn(o[d][3], b1));
                        O = make_float4(u0 ? x : O.x, u0 ? y : O.y, u1 ? z : O.z, u1 ? w : O.w);
                        oa[d * 32] = O;
                    }
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
    /* out = o / l, each lane two adjacent columns of rows r0 and r1 an n8 fragment */
    const int64_t at0 = r0 < nrows ? atc_row_th(tl, g, group, nh, r0) * HD : -1;
    const int64_t at1 = r1 < nrows ? atc_row_th(tl, g, group, nh, r1) * HD : -1;
    for (int d = 0; d < DN; d++) {
        const float4 O = oa[d * 32];
        const int col = d * 8 + 2 * (lane & 3);
        if (at0 >= 0)
            atc_put_out2(out_hi, out_lo, at0 + col, __fdiv_rn(O.x, Lt0), __fdiv_rn(O.y, Lt0));
        if (at1 >= 0)
            atc_put_out2(out_hi, out_lo, at1 + col, __fdiv_rn(O.z, Lt1), __fdiv_rn(O.w, Lt1));
    }
}

template <int HD, bool KP> static constexpr size_t atc_smem() {
    return (size_t)2 * (KP ? 4 : 2) * ATC_KB * HD * 2 + (size_t)4 * (HD / 8) * 32 * sizeof(float4);
}

#endif
