/* attention_decode.cuh - the attention kernel of tiles of one MMA fragment (decode steps): key
 * segments spread over the CTA's warps, with the MMAs in atc_block_t's form (below), the prefill
 * form atc_block, or that form packed for at most 8 rows. Per-row arithmetic in
 * attention_tile.cuh; launched by attention.cu. */
#ifndef RW_WORKER_KERNELS_ATTENTION_DECODE_CUH
#define RW_WORKER_KERNELS_ATTENTION_DECODE_CUH

#include "attention_tile.cuh"
#include "launch.cuh"

/* Decode tiles (at most 16 rows: one token of a group of <= 16 heads) are one fragment, so the
 * ATC_DW warps of a CTA take ATC_DW segments at a time instead of row fragments. Each warp streams
 * its segments' 32-key blocks through its own shared-memory slots (atc_ring): either a ring, K and
 * V of a block in separate slots, the K slot refilled as soon as the scores are computed, before V
 * is read, so all slots but the one being read can be in flight; or a double buffer of K + V
 * pairs, the next pair issued before the current one is read. After each round of ATC_DW segments
 * the partials are merged in segment order (nsplit 0) with the same merge as everywhere else, or
 * written for the combine kernel. The rounds' merges make one left fold over the segments
 * whatever ATC_DW is.
 *
 * The MMAs run with the operands' roles swapped (atc_block_t): the keys are the M side and the
 * tile's rows the N side, S^T = K q'^T and o^T += V^T P^T, in NF n8 fragments of rows (NF = 1 for
 * at most 8 rows). A one-token tile of the 30B-A3B shape has 8 rows, which filled half of a
 * 16-row fragment with the rows as the M side; here it fills one n8 fragment exactly, which
 * halves the MMAs and the o registers of each key block. Every output element is still the sum
 * of the same products over the same k16 steps in the same order (the head-dim steps of q'.K, hi
 * then lo; the key steps of P.V), one MMA per step whichever side of the instruction its row sits
 * on, and the scores are moved into atc_block's register layout before the softmax, which is
 * atc_block's code (KP: the same extra products in the same order): the same bits as the
 * prefill kernel (tests/worker/test_attention_gpu.c compares
 * rows computed both ways byte for byte).
 *
 * Why 2 warps and a ring of 3: the kernel is bound by each warp's chain of dependent instructions,
 * not by bytes in flight (docs/BENCHMARKS.md: at 4 warps, 170 KB of shared memory held an SM to
 * one CTA, one warp per scheduler issuing every 3.6 cycles; a deeper key ring changed nothing), so
 * what counts is how many warps share an SM. A CTA of 2 warps with 3 slots of 8 KB each (head dim
 * 128) needs 53 KB for one row fragment (a round's partials go to the slot each warp has just
 * consumed), so 4 CTAs, 8 warps, share an SM; with a double buffer of K + V blocks it needed
 * 73 KB and 3 CTAs, and a b256 x 1k step's 1,024 CTAs ran in 2.6 waves of 396 (one H200: 142.9
 * -> 138.1 us). */
#define ATC_DW 2

/* Slots of a warp's ring: 3 single slots (K or V) where that fits 4 CTAs on an SM (one row
 * fragment, unsplit launches: b256 x 1k 143.3 -> 137.4 us, 64 x 4k 179.3 -> 145.5 us,
 * 128 x 4k 315.0 -> 256.4 us on an H200); otherwise 4 slots taken in K + V pairs, the double
 * buffer of blocks (atc_ring_pairs): where the CTAs are few each warp's bytes in flight count,
 * and split launches measured slower with single slots (b1 x 1k 10.3 -> 11.5 us, 8 x 8k
 * 57.1 -> 67.1 us), and two row fragments would not fit a fourth CTA anyway. The double buffer
 * keeps its own loop (issue the next pair, wait, read), not the ring's cursor over pairs: with
 * the cursor, 8 x 8k measured 57.0 -> 62.8 us. */
__host__ __device__ constexpr int atc_ring(bool t, int nf) { return t && nf == 1 ? 3 : 4; }
__host__ __device__ constexpr bool atc_ring_pairs(bool t, int nf) { return atc_ring(t, nf) == 4; }

/* One softmax block of ATC_SB keys for a warp's rows r0 = lane / 4 and (NF = 2) r1 = r0 + 8,
 * atc_block's arithmetic with the keys as the MMA's M side (after_k runs between the last read of
 * K and the first of V, as in atc_block). qb / qlb: the B fragments of q'^T
 * (hi, lo) for row fragment nf (atc_load_q's registers 0, 2 of row r0 and 1, 3 of row r1);
 * ot[f][nf]: o^T for head-dim rows 16 f .. 16 f + 15 by the fragment's rows (columns). */
template <int HD, int NF, bool KP, typename H>
__device__ __forceinline__ void atc_block_t(const uint8_t *kd, const uint8_t *vd, int lo,
                                            int key_abs, const uint32_t (&qb)[HD / 16][NF][2],
                                            const uint32_t (&qlb)[HD / 16][NF][2], int32_t qp0,
                                            int32_t qp1, float &m0, float &m1, float &l0, float &l1,
                                            float (&ot)[HD / 16][NF][4], H after_k) {
    constexpr int KS = HD / 16, NI = 2 * NF; /* s[n][i]: i < 2 row r0, i >= 2 row r1 */
    const int lane = threadIdx.x & 31, cq = lane & 3;
    float th[2][NF][4], tl[2][NF][4];
#pragma unroll
    for (int j = 0; j < 2; j++)
#pragma unroll
        for (int nf = 0; nf < NF; nf++)
#pragma unroll
            for (int i = 0; i < 4; i++)
                th[j][nf][i] = tl[j][nf][i] = 0.0f;
#pragma unroll
    for (int ks = 0; ks < KS; ks++) {
#pragma unroll
        for (int j = 0; j < 2; j++) {
            /* keys 16 j .. + 15 as A rows, head-dim chunks 2 ks, 2 ks + 1 */
            const int kr = 16 * j + (lane & 7) + ((lane >> 3) & 1) * 8;
            const int kc = 2 * ks + (lane >> 4);
            uint32_t a[4];
            rw_ldsm_x4(a[0], a[1], a[2], a[3], kd + atc_swz<HD>(kr, kc));
#pragma unroll
            for (int nf = 0; nf < NF; nf++) {
                rw_mma_bf16_16816(th[j][nf], a, qb[ks][nf][0], qb[ks][nf][1]);
                rw_mma_bf16_16816(tl[j][nf], a, qlb[ks][nf][0], qlb[ks][nf][1]);
            }
            if constexpr (KP) { /* K_lo . qh into the lo sums, as atc_block */
                rw_ldsm_x4(a[0], a[1], a[2], a[3], kd + lo + atc_swz<HD>(kr, kc));
#pragma unroll
                for (int nf = 0; nf < NF; nf++)
                    rw_mma_bf16_16816(tl[j][nf], a, qb[ks][nf][0], qb[ks][nf][1]);
            }
        }
    }
    after_k();
    /* S[r][key], key = 8 n + 2 cq + (i & 1), row r0 / r1 by i / 2: element (key % 16 / 8, r % 2)
     * of fragment (key / 16, r / 8) in lane 4 (key % 8) + (r % 8) / 2 */
    float s[4][4];
#pragma unroll
    for (int n = 0; n < 4; n++)
#pragma unroll
        for (int i = 0; i < NI; i++) {
            const int src = 8 * cq + 4 * (i & 1) + (lane >> 3);
            const int j = n >> 1, h = n & 1, nf = i >> 1;
            const float v0 = __fadd_rn(th[j][nf][2 * h], tl[j][nf][2 * h]);
            const float v1 = __fadd_rn(th[j][nf][2 * h + 1], tl[j][nf][2 * h + 1]);
            const float w0 = __shfl_sync(0xffffffffu, v0, src);
            const float w1 = __shfl_sync(0xffffffffu, v1, src);
            s[n][i] = ((lane >> 2) & 1) ? w1 : w0;
        }
    float c0, c1;
    atc_softmax<NI>(s, key_abs, qp0, qp1, m0, m1, l0, l1, c0, c1);
    /* o^T's columns in fragment nf are rows 8 nf + 2 cq and + 1: their factors from lanes 8 cq
     * and 8 cq + 4 */
    float ca[NF], cb[NF];
#pragma unroll
    for (int nf = 0; nf < NF; nf++) {
        ca[nf] = __shfl_sync(0xffffffffu, nf ? c1 : c0, 8 * cq);
        cb[nf] = __shfl_sync(0xffffffffu, nf ? c1 : c0, 8 * cq + 4);
    }
    if (__any_sync(0xffffffffu, c0 != 1.0f || (NF == 2 && c1 != 1.0f))) {
#pragma unroll
        for (int f = 0; f < KS; f++)
#pragma unroll
            for (int nf = 0; nf < NF; nf++) {
                ot[f][nf][0] = __fmul_rn(ot[f][nf][0], ca[nf]);
                ot[f][nf][1] = __fmul_rn(ot[f][nf][1], cb[nf]);
                ot[f][nf][2] = __fmul_rn(ot[f][nf][2], ca[nf]);
                ot[f][nf][3] = __fmul_rn(ot[f][nf][3], cb[nf]);
            }
    }
    /* o^T += V^T P^T in key steps: P^T's B fragment for row fragment nf is atc_block's A
     * fragment registers (0, 2) of row r0 or (1, 3) of row r1; V^T's A fragment is the
     * transposed key rows, head-dim rows 16 f .. + 15 */
#pragma unroll
    for (int j = 0; j < 2; j++) {
        uint32_t b0[NF], b1[NF], c0l[NF], c1l[NF];
#pragma unroll
        for (int nf = 0; nf < NF; nf++) {
            atc_split2(s[2 * j][2 * nf], s[2 * j][2 * nf + 1], b0[nf], c0l[nf]);
            atc_split2(s[2 * j + 1][2 * nf], s[2 * j + 1][2 * nf + 1], b1[nf], c1l[nf]);
        }
#pragma unroll
        for (int f = 0; f < KS; f++) {
            const int vr = 16 * j + (lane & 7) + ((lane >> 4) & 1) * 8;
            const int vc = 2 * f + ((lane >> 3) & 1);
            uint32_t a[4];
            rw_ldsm_x4_trans(a[0], a[1], a[2], a[3], vd + atc_swz<HD>(vr, vc));
#pragma unroll
            for (int nf = 0; nf < NF; nf++)
                rw_mma_bf16_16816(ot[f][nf], a, b0[nf], b1[nf]);
            if constexpr (KP) { /* V . P_lo, then V_lo . P_hi, as atc_block */
#pragma unroll
                for (int nf = 0; nf < NF; nf++)
                    rw_mma_bf16_16816(ot[f][nf], a, c0l[nf], c1l[nf]);
                rw_ldsm_x4_trans(a[0], a[1], a[2], a[3], vd + lo + atc_swz<HD>(vr, vc));
#pragma unroll
                for (int nf = 0; nf < NF; nf++)
                    rw_mma_bf16_16816(ot[f][nf], a, b0[nf], b1[nf]);
            }
        }
    }
}

/* A lane's o registers and the rows they belong to, in the two MMA forms of the decode kernel.
 * T (atc_block_t, NF row fragments): register i = 4 (NF f + nf) + c holds head-dim row
 * 16 f + lane / 4 (+ 8 for c >= 2) of tile row 8 nf + 2 (lane % 4) + c % 2. Rows on the M side
 * (atc_block, one 16-row fragment): register i = 4 d + c holds head-dim 8 d + 2 (lane % 4) + c % 2
 * of row lane / 4 (+ 8 for c >= 2). A lane's registers cover ATC_SLOTS rows, its slots. */
template <bool T, int NF> struct atc_regs {
    static constexpr int SLOTS = T ? 2 * NF : 2;
    /* slot(i) repeats every PERIOD registers */
    static constexpr int PERIOD = T ? 4 * NF : 4;
    static __device__ __forceinline__ int slot(int i) {
        return T ? 2 * ((i >> 2) % NF) + (i & 1) : (i >> 1) & 1;
    }
    static __device__ __forceinline__ int row(int k) {
        const int lane = threadIdx.x & 31;
        return T ? 8 * (k >> 1) + 2 * (lane & 3) + (k & 1) : (lane >> 2) + 8 * k;
    }
    static __device__ __forceinline__ int dim(int i) {
        const int lane = threadIdx.x & 31;
        return T ? 16 * ((i >> 2) / NF) + (lane >> 2) + ((i & 2) ? 8 : 0)
                 : 8 * (i >> 2) + 2 * (lane & 3) + (i & 1);
    }
};

/* Waits until at most n of this thread's cp.async groups are pending (0 <= n; 3 and more wait
 * for 3) */
__device__ __forceinline__ void atc_wait_groups(int n) {
    if (n >= 3)
        rw_cp_async_wait<3>();
    else if (n == 2)
        rw_cp_async_wait<2>();
    else if (n == 1)
        rw_cp_async_wait<1>();
    else
        rw_cp_async_wait<0>();
}

/* Stages the 32-key block j of segment sg, whose block ids the warp holds in sid (atc_seg_ids),
 * from NC caches into dst[0..NC): one warp, this lane (EF: evict_first copies). */
template <int HD, int NC, bool EF = false>
__device__ __forceinline__ void atc_load_block(uint8_t *const *dst, const uint16_t *const *src,
                                               int sg, int j, int32_t sid, int plast, int nkv,
                                               int g, int bs, int lane) {
#pragma unroll
    for (int gi = 0; gi < ATC_SB / 16; gi++) {
        const int kp0 = sg * ATC_SEG + j * ATC_SB + 16 * gi;
        const int64_t base = atc_seg_base(sid, j * (ATC_SB / 16) + gi, kp0, nkv, g, bs, HD);
        atc_load_group<HD, 32, NC, EF>(dst, src, 16 * gi, kp0, base, plast, lane);
    }
}

/* o registers a lane: atc_block_t's NF fragments (T), or atc_block's one 16-row fragment (also
 * in its packed form, whose row r1 registers stay zero) */
__host__ __device__ constexpr int atc_nr(int hd, bool t, int nf) {
    return t ? hd / 4 * nf : hd / 2;
}

/* T: the MMAs in atc_block_t's form with NF row fragments, for unsplit launches (the segments
 * merged here); otherwise atc_block's, which also writes the partials of split launches: NF = 2
 * the 16 rows of one fragment, NF = 1 (without KP) at most 8 rows in its packed form (PACK). */
template <int HD, bool T, int NF, bool KP>
__global__ void __launch_bounds__(ATC_DW * 32, 1)
    atc_decode_kernel(const float *__restrict__ q, const uint16_t *__restrict__ kc,
                      const uint16_t *__restrict__ vc, const uint16_t *__restrict__ kcl,
                      const uint16_t *__restrict__ vcl, const rw_attn_tile *__restrict__ tiles,
                      const int32_t *__restrict__ pos, const int32_t *__restrict__ bt,
                      int bt_stride, int nh, int nkv, int bs, int nsplit, float qscale,
                      uint16_t *__restrict__ out_hi, uint16_t *__restrict__ out_lo,
                      float *__restrict__ part_o, float2 *__restrict__ part_ml, int64_t ntok,
                      int seg_cap, unsigned *__restrict__ ready) {
    /* Before the PDL wait: the step's tiles, positions and block table, which the host uploads
     * before the forward pass (launch.cuh), and the block table lookups of the first keys. After
     * it: the first keys' copies are issued before q is read, so their memory round trip and
     * q's overlap instead of adding up (globaltimer stamps of a b1 step on an H200: 2.1 us from
     * the wait to the first copy issued; docs/BENCHMARKS.md, nineteenth session). */
    typedef atc_regs<T, NF> R;
    static_assert(T || NF == 2 || (NF == 1 && !KP),
                  "atc_block's form takes one 16-row fragment, or 8 rows packed without KP");
    constexpr int SBLK = ATC_SB * HD * 2;  /* bytes of K (or V) per softmax block */
    constexpr int SLOT = KP ? 2 * SBLK : SBLK; /* a slot: the block's K or V, then (KP) its lo */
    constexpr int NR = atc_nr(HD, T, NF);      /* o registers per lane */
    static_assert(NR * 32 * 4 <= SBLK, "a warp's partial fits the slot it has consumed");
    extern __shared__ __align__(128) uint8_t sm[];
    __shared__ int pbuf[ATC_DW]; /* the slot holding each warp's partial of the round */
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    constexpr int NS = atc_ring(T, NF);
    constexpr bool PAIR = atc_ring_pairs(T, NF);
    uint8_t *ring = sm + (size_t)warp * NS * SLOT;   /* this warp's slots */
    float *pml = (float *)(sm + ATC_DW * NS * SLOT); /* [warps][4][32]: m0 m1 l0 l1 */
    float *oacc = pml + ATC_DW * 4 * 32;             /* [NR][32] merged o */

    const rw_attn_tile tl = tiles[blockIdx.x];
    const int g = blockIdx.y, split = blockIdx.z;
    const int group = nh / nkv;
    const int nrows = tl.ntok * group;
    /* the launcher picks NF for the tile's rows, and T only for unsplit launches */
    if (nrows > 8 * NF || (T && nsplit > 0)) __trap();
    const int r0 = lane >> 2, r1 = r0 + 8;
    const int32_t plast = pos[tl.tok0 + tl.ntok - 1];
    const int nseg = plast / ATC_SEG + 1;
    const int32_t *blocks = bt + (int64_t)tl.seq * bt_stride;

    /* CTA-local segment li is global segment sfirst + li * sstep; warp w takes li = ATC_DW r + w */
    const int sstep = nsplit > 0 ? nsplit : 1;
    const int sfirst = nsplit > 0 ? split : 0;
    const int nloc = sfirst < nseg ? (nseg - sfirst + sstep - 1) / sstep : 0;
    const int nround = (nloc + ATC_DW - 1) / ATC_DW;
    auto seg_of = [&](int round) -> int {
        const int li = round * ATC_DW + warp;
        return li < nloc ? sfirst + li * sstep : -1;
    };
    auto nblocks_of = [&](int sg) -> int { /* 32-key blocks of segment sg up to plast */
        const int left = plast - sg * ATC_SEG;
        return min(ATC_SEG / ATC_SB, left / ATC_SB + 1);
    };
    /* PAIR: the block ids of the segment the copies are in (ids) and of the warp's next segment
     * (ids_next), one group a lane (atc_seg_ids): the next segment's are read when the copies
     * enter a segment, so a copy's address does not wait for the block table, and the first
     * segment's are read before the PDL wait. Against a lookup inside each copy, the kernel
     * alone on an H100 (twenty-ninth session): 1 x 1k 8.8 -> 8.3 us, 1 x 4k 10.8 -> 10.4,
     * 8 x 4k 34.7 -> 33.9, 32 x 8k 217.3 -> 216.2; a b1 x 4k step 3.78-3.80 -> 3.74 ms. */
    int32_t ids = PAIR ? atc_seg_ids(blocks, seg_of(0), plast, bs, lane) : -1;
    int32_t ids_next = PAIR ? atc_seg_ids(blocks, seg_of(1), plast, bs, lane) : -1;
    /* PAIR: the double buffer of blocks, each K + V pair one cp.async group (buf: the pair being
     * read); the next block (or the next round's first) is issued before a block is waited for. */
    int buf = 0;
    /* A split CTA with one segment (b1 up to 2k keys: more splits than segments) leaves its
     * second warp idle, and its one warp's blocks arrived one memory round trip apart, each
     * issued a block ahead. Here that warp stages the whole segment at once (at most four
     * blocks) in both warps' pair slots, a cp.async group a block, and waits for each in turn.
     * The same copies and arithmetic, so the same bits. Engine steps on an H100 (thirtieth
     * session): b1 x 1k 3.485-3.509 -> 3.422-3.437 ms, b1 x 2k 3.533-3.542 -> 3.548-3.574. */
    const bool whole = PAIR && nsplit > 0 && nloc == 1;
    static_assert(!PAIR || ATC_DW * atc_ring(T, NF) / 2 >= ATC_SEG / ATC_SB,
                  "the CTA's pair slots hold a segment's blocks");
    auto load_pair = [&](int b, int sg, int j, int32_t sid) {
        uint8_t *const kd = ring + (size_t)b * 2 * SLOT;
        /* K, V (KP: then K_lo, V_lo, each behind its plane in the slot; without KP a slot is
         * SBLK, so V lies at kd + SLOT either way) */
        constexpr int NP = KP ? 4 : 2;
        uint8_t *const d[4] = {kd, kd + SLOT, kd + SBLK, kd + SLOT + SBLK};
        const uint16_t *const c[4] = {kc, vc, kcl, vcl};
        /* split launches (the forms without T): the keys evict_first, so the partials the
         * combine reads next stay in L2 (attention_tile.cuh) */
        atc_load_block<HD, NP, !T>(d, c, sg, j, sid, plast, nkv, g, bs, lane);
    };
    /* Otherwise the ring: the warp's items are K, V of each block of its segments in order, item
     * i in slot i % NS, each one cp.async group, so before an item is read NS - 1 groups may
     * still be in flight. ld_*: the next item to load; ld_base: the cache offsets of its block's
     * 16-key groups, read from the block table when the cursor reaches the block, an item before
     * they are needed (a lookup at the copy stalled the warp on a load of the table between its
     * MMAs). The ring keeps this form: with the ids of atc_seg_ids (as PAIR below) its kernel
     * measured the same or slower (256 x 512 keys on an H100: 101.0 -> 102.2 us; twenty-ninth
     * session). */
    int ld_round = 0, ld_blk = 0, ld_v = 0, ld_slot = 0;
    int ld_seg = seg_of(0), ld_nb = ld_seg >= 0 ? nblocks_of(ld_seg) : 0;
    int64_t ld_base[ATC_SB / 16];
    auto read_bases = [&]() {
#pragma unroll
        for (int gi = 0; gi < ATC_SB / 16; gi++)
            ld_base[gi] = ld_seg >= 0 ? atc_group_base(blocks,
                                                       ld_seg * ATC_SEG + ld_blk * ATC_SB + 16 * gi,
                                                       plast, nkv, g, bs, HD)
                                      : 0;
    };
    auto load_next = [&]() {
        if (ld_seg >= 0) {
            constexpr int NC = KP ? 2 : 1;
            uint8_t *const sd = ring + (size_t)ld_slot * SLOT;
            uint8_t *d[NC];
            const uint16_t *c[NC];
            d[0] = sd;
            c[0] = ld_v ? vc : kc;
            if constexpr (KP) {
                d[NC - 1] = sd + SBLK;
                c[NC - 1] = ld_v ? vcl : kcl;
            }
#pragma unroll
            for (int gi = 0; gi < ATC_SB / 16; gi++)
                atc_load_group<HD, 32, NC>(d, c, 16 * gi,
                                           ld_seg * ATC_SEG + ld_blk * ATC_SB + 16 * gi,
                                           ld_base[gi], plast, lane);
            ld_v ^= 1;
            if (!ld_v) {
                if (++ld_blk == ld_nb) {
                    ld_blk = 0;
                    ld_seg = seg_of(++ld_round);
                    ld_nb = ld_seg >= 0 ? nblocks_of(ld_seg) : 0;
                }
                read_bases();
            }
        }
        rw_cp_async_commit();
        ld_slot = ld_slot + 1 == NS ? 0 : ld_slot + 1;
    };

    /* the merged state of this lane's rows (its slots) */
    float Mt[R::SLOTS], Lt[R::SLOTS];
#pragma unroll
    for (int k = 0; k < R::SLOTS; k++) {
        Mt[k] = -INFINITY;
        Lt[k] = 0.0f;
    }
    /* this thread's share of the merged o: registers [warp * NR / ATC_DW, (warp + 1) * NR /
     * ATC_DW) of its lane (every warp's lane holds the same rows and columns) */
    const int i0 = warp * (NR / ATC_DW), i1 = i0 + NR / ATC_DW;
    static_assert((NR / ATC_DW) % R::PERIOD == 0, "a warp's registers start a slot period");
    if (nsplit == 0)
        for (int i = i0; i < i1; i++)
            oacc[i * 32 + lane] = 0.0f;

    if constexpr (!PAIR) read_bases();
    RW_STAMP(t_entry);
    rw_pdl_begin();
    RW_STAMP(t_wait);
    if constexpr (PAIR) {
        const int sg0 = seg_of(0);
        if (whole) {
            if (sg0 >= 0)
                for (int j = 0; j < nblocks_of(sg0); j++) {
                    load_pair(j, sg0, j, ids);
                    rw_cp_async_commit();
                }
        } else {
            if (sg0 >= 0) load_pair(0, sg0, 0, ids);
            rw_cp_async_commit();
        }
    } else {
        for (int k = 0; k < NS; k++)
            load_next();
    }
    uint32_t qh[HD / 16][4], ql[HD / 16][4];
    int32_t qp0, qp1;
    atc_load_q<HD>(q, pos, tl, g, group, nh, nrows, r0, r1, qscale, qh, ql, qp0, qp1);
    /* T: q'^T's B fragments, registers (0, 2) of row r0 and (1, 3) of row r1 */
    uint32_t qb[HD / 16][NF][2], qlb[HD / 16][NF][2];
#pragma unroll
    for (int ks = 0; ks < HD / 16; ks++)
#pragma unroll
        for (int nf = 0; nf < NF; nf++) {
            qb[ks][nf][0] = qh[ks][nf];
            qb[ks][nf][1] = qh[ks][nf + 2];
            qlb[ks][nf][0] = ql[ks][nf];
            qlb[ks][nf][1] = ql[ks][nf + 2];
        }
    int kslot = 0; /* ring: the slot of the next K to read */
    for (int round = 0; round < nround; round++) {
        const int sg = seg_of(round);
        if (PAIR && round > 0) { /* the copies enter this round's segment */
            ids = ids_next;
            ids_next = atc_seg_ids(blocks, seg_of(round + 1), plast, bs, lane);
        }
        float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.0f, l1 = 0.0f;
        float ov[NR]; /* T: [HD / 16][NF][4]; otherwise [HD / 8][4] (atc_regs<false, ...>) */
#pragma unroll
        for (int i = 0; i < NR; i++)
            ov[i] = 0.0f;
        /* the slot of the last V read (PAIR: its pair's first slot), refilled after the round's
         * merge */
        int vslot = 0;
        if (sg >= 0) {
            const int nb = nblocks_of(sg);
            for (int j = 0; j < nb; j++) {
                const uint8_t *kd, *vd;
                if (whole) { /* blocks j + 1 .. nb - 1 may still be in flight */
                    atc_wait_groups(nb - 1 - j);
                    kd = ring + (size_t)j * 2 * SLOT;
                    vd = kd + SLOT;
                    vslot = 2 * j;
                } else if constexpr (PAIR) {
                    const int sn = j + 1 < nb ? sg : seg_of(round + 1);
                    if (sn >= 0)
                        load_pair(buf ^ 1, sn, j + 1 < nb ? j + 1 : 0, j + 1 < nb ? ids : ids_next);
                    rw_cp_async_commit();
                    rw_cp_async_wait<1>();
                    kd = ring + (size_t)buf * 2 * SLOT;
                    vd = kd + SLOT;
                    vslot = 2 * buf; /* the pair's first slot holds the partial */
                } else {
                    vslot = kslot + 1 == NS ? 0 : kslot + 1;
                    rw_cp_async_wait<NS - 1>();
                    kd = ring + (size_t)kslot * SLOT;
                    vd = ring + (size_t)vslot * SLOT;
                }
                __syncwarp();
                /* ring: K read, refill its slot, then wait for V */
                auto after_k = [&]() {
                    if constexpr (!PAIR) {
                        __syncwarp();
                        load_next();
                        rw_cp_async_wait<NS - 1>();
                        __syncwarp();
                    }
                };
                const int key = sg * ATC_SEG + j * ATC_SB;
                if constexpr (T)
                    atc_block_t<HD, NF, KP>(kd, vd, SBLK, key, qb, qlb, qp0, qp1, m0, m1, l0, l1,
                                            *reinterpret_cast<float(*)[HD / 16][NF][4]>(ov),
                                            after_k);
                else
                    atc_block<HD, KP, NF == 1>(kd, vd, SBLK, key, qh, ql, qp0, qp1, m0, m1, l0, l1,
                                               *reinterpret_cast<float(*)[HD / 8][4]>(ov), after_k);
                __syncwarp(); /* the block's slots are refilled next */
                if constexpr (PAIR) {
                    buf ^= 1;
                } else {
                    kslot = vslot + 1 == NS ? 0 : vslot + 1;
                    if (j + 1 < nb) load_next(); /* V read: refill its slot */
                }
            }
        }
        if (nsplit > 0) {
            if constexpr (!T) /* (T is never split) */
                if (sg >= 0 && sg < seg_cap)
                    atc_write_part<HD>(part_o, part_ml, tl, g, group, nh, nrows, r0, r1, sg, ntok,
                                       m0, m1, l0, l1, *reinterpret_cast<float(*)[HD / 8][4]>(ov));
            if (!PAIR && sg >= 0) load_next();
            continue;
        }
        /* merge the round's segments in order. Slot vslot (the V read last, or PAIR its pair's
         * first slot) is refilled only after the barrier at the end of this merge, so until then
         * it holds this warp's partial. */
        if (sg >= 0) {
            float *pw = (float *)(ring + (size_t)vslot * SLOT);
#pragma unroll
            for (int i = 0; i < NR; i++)
                pw[i * 32 + lane] = ov[i];
        }
        float *mw = pml + (size_t)warp * 4 * 32;
        mw[0 * 32 + lane] = m0;
        mw[1 * 32 + lane] = m1;
        mw[2 * 32 + lane] = l0;
        mw[3 * 32 + lane] = l1;
        if (lane == 0) pbuf[warp] = warp * NS + vslot;
        __syncthreads();
        for (int w = 0; w < ATC_DW && round * ATC_DW + w < nloc; w++) {
            /* row r's (m, l) sit in lanes 4 (r % 8) .. + 3, in slots r / 8 and 2 + r / 8 */
            const float *mv = pml + (size_t)w * 4 * 32;
            float a[R::SLOTS], b[R::SLOTS];
            bool u[R::SLOTS];
#pragma unroll
            for (int k = 0; k < R::SLOTS; k++) {
                const int r = R::row(k), at = 4 * (r % 8);
                a[k] = b[k] = 0.0f;
                u[k] = rw_attn_merge_ml(Mt[k], Lt[k], mv[(r / 8) * 32 + at],
                                        mv[(2 + r / 8) * 32 + at], a[k], b[k]);
            }
            const float *pv = (const float *)(sm + (size_t)pbuf[w] * SLOT);
            /* register i = i0 + ii has ii's slot (atc_regs::PERIOD), known at compile time:
             * no selects to pick its row's factors, and a select instead of a branch */
#pragma unroll
            for (int ii = 0; ii < NR / ATC_DW; ii++) {
                const int i = i0 + ii, k = R::slot(ii);
                float &O = oacc[i * 32 + lane];
                const float v = __fadd_rn(__fmul_rn(O, a[k]), __fmul_rn(pv[i * 32 + lane], b[k]));
                O = u[k] ? v : O;
            }
        }
        __syncthreads(); /* the partials are read: their slots may be refilled */
        if (!PAIR && sg >= 0) load_next();
    }
    rw_cp_async_wait<0>();
    if (nsplit != 0) {
        /* the combine's ready counters (attention.cu): this CTA's partials are written, so it
         * counts itself done on each row of its tile, partials first made visible to the GPU */
        if (ready) {
            __threadfence();
            __syncthreads();
            if (tid < nrows) atomicAdd(ready + atc_row_th(tl, g, group, nh, tid), 1u);
        }
        RW_STAMP_PUT(at, 0, RW_STAMP_CTA, t_entry, t_wait, 0);
        return;
    }
    /* each slot's row index once, then the lane's registers (slots as in the merge) */
    int64_t at[R::SLOTS];
#pragma unroll
    for (int k = 0; k < R::SLOTS; k++) {
        const int r = R::row(k);
        at[k] = r < nrows ? atc_row_th(tl, g, group, nh, r) * HD : -1;
    }
#pragma unroll
    for (int ii = 0; ii < NR / ATC_DW; ii++) {
        const int i = i0 + ii, k = R::slot(ii);
        if (at[k] >= 0)
            atc_put_out(out_hi, out_lo, at[k] + R::dim(i), __fdiv_rn(oacc[i * 32 + lane], Lt[k]));
    }
    RW_STAMP_PUT(at, 0, RW_STAMP_CTA, t_entry, t_wait, 0);
}

/* The decode kernel's shared memory: the warps' rings (KP: slots of twice the bytes), their
 * (m, l) and the merged o (atc_nr registers a lane) */
template <int HD, bool T, int NF, bool KP> static constexpr size_t atc_decode_smem() {
    return (size_t)ATC_DW * atc_ring(T, NF) * ATC_SB * HD * 2 * (KP ? 2 : 1) +
           (size_t)ATC_DW * 4 * 32 * 4 + (size_t)atc_nr(HD, T, NF) * 32 * 4;
}

/* One form of the decode kernel with the shared memory it needs, named together so that the
 * launcher's choice of a form gives both */
template <int HD, bool KP> struct atc_decode_launch {
    decltype(&atc_decode_kernel<HD, true, 1, KP>) kern;
    size_t smem;
};
template <int HD, bool T, int NF, bool KP> static atc_decode_launch<HD, KP> atc_decode_form() {
    return {atc_decode_kernel<HD, T, NF, KP>, atc_decode_smem<HD, T, NF, KP>()};
}

#endif
