/* sort.cuh - the expert layer's stable sort of assignments by expert and its tile schedule, as a
 * device function of one CTA: the body of expert_sort.cu's sort kernel, and what worker's router
 * runs in the CTA that routes a one-group step (router.cu), so that step needs no sort launch.
 * Any correct stable sort gives the same off, tiles, perm and inv, whoever runs it. */
#ifndef RW_MOE_SORT_CUH
#define RW_MOE_SORT_CUH

#include <cuda_runtime.h>
#include <stdint.h>

/* One CTA. The assignments are cut into SORT_PW(E) contiguous chunks, one per placement warp:
 *   1. each placement warp counts its chunk's assignments per expert (moe_same_key groups the lanes
 *      routed to the same expert; the group's first lane adds) into wc[warp][e];
 *   2. one thread per expert turns wc[.][e] into exclusive per-warp bases (warp order) and the
 *      expert's count; warp 0 scans the counts and the tile counts over the experts (each lane a
 *      contiguous run of experts, then a warp scan) -> off[e], the tile list, ntiles;
 *   3. each placement warp walks its chunk in order and places assignment a of expert e at
 *      off[e] + (its warp base) + (earlier ones of its chunk).
 * The result is the stable order (by assignment index within each expert) on every run, found
 * in A / (32 * SORT_PW) steps instead of A / 32 (fewer warps for fewer assignments: at most one
 * warp per 32). A warp's first SORT_RS steps keep their ids and masks in registers from the
 * count to the placement (every decode step: a 256-token step is 2 steps a warp); longer chunks
 * (prefill) load and group the rest again. perm: sorted row -> assignment; inv: assignment
 * -> sorted row, -1 for ids outside [0, E) (not a local expert). E <= 1024. */
#define SORT_WC 4096 /* wc entries: placement warps x experts */
#define SORT_PW(E) ((E)*32 <= SORT_WC ? 32 : (SORT_WC / (E) > 0 ? SORT_WC / (E) : 1))
#define SORT_RS 4 /* steps a warp keeps in registers between the count and the placement */

/* The lanes of the warp whose valid key equals this lane's (a lane whose key is not valid gets
 * only itself). __match_any_sync gives it in one instruction, but with the 32 warps of a
 * 256-token step calling it on an H200 even 32 shuffles a step were faster (sort 9.79 -> 9.26
 * us); so there the mask is the AND over the key's bits of the ballot of that bit or of its
 * complement (7 bit ballots for E = 128). Both give the same mask. Measured with ncu on the 30B
 * shape, this form (ballots above SORT_MATCH_PW placement warps, the register-kept steps)
 * against the match in every walk step: a 256-token step's sort (32 warps) 10.14 -> 7.70 us, a
 * one-token step's (one warp, the match) 4.40 -> 4.71 us; with ballots at one warp too, 4.80 us
 * (docs/BENCHMARKS.md, 2026-12-03, eleventh session). */
#define SORT_MATCH_PW 4
__device__ __forceinline__ unsigned moe_same_key(int32_t key, bool valid, int E, bool ballots) {
    if (!ballots) return __match_any_sync(0xffffffffu, valid ? key : -1);
    unsigned m = __ballot_sync(0xffffffffu, valid);
    for (int bit = 0; (1 << bit) < E; bit++) {
        const bool on = (key >> bit) & 1;
        const unsigned b = __ballot_sync(0xffffffffu, on);
        m &= on ? b : ~b;
    }
    return valid ? m : 1u << (threadIdx.x & 31);
}

/* The sort of A assignments (ids [A], read with ld.global.cg: a caller may sort ids it wrote
 * in the same kernel) into off [E + 1], tiles (int2: expert, first sorted row), *ntiles, perm and
 * inv, by every thread of the CTA (blockDim.x a multiple of 32; the placement warps are at most
 * the CTA's warps, which changes the cut, not the result). wc [SORT_WC] and eoff [1024] are the
 * CTA's shared scratch. E <= 1024. */
__device__ __forceinline__ void rw_moe_sort_cta(const int32_t *ids, int64_t A, int E, int tn,
                                                int32_t *off, int2 *tiles, int32_t *ntiles,
                                                int32_t *perm, int32_t *inv, int32_t *wc,
                                                int32_t *eoff) {
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    /* no more placement warps than 32-assignment steps: a one-token step (8 assignments) then
     * has one, and the per-expert base loop below reads one count instead of 32. The sorted
     * order does not depend on the cut. */
    const int64_t steps = (A + 31) / 32;
    const int nw = (int)(blockDim.x / 32), cap = SORT_PW(E) < nw ? SORT_PW(E) : nw;
    const int pw = cap < steps ? cap : (int)(steps > 0 ? steps : 1);
    const int64_t chunk = (A + pw - 1) / pw;
    const int64_t a0 = (int64_t)warp * chunk, a1 = warp < pw ? min(A, a0 + chunk) : a0;
    int32_t *mine = wc + warp * E; /* this warp's row of wc (placement warps only) */
    const bool ballots = pw > SORT_MATCH_PW;
    /* a placement warp's chunk, 32 assignments a step in order: visit(a, a in the chunk, expert
     * e, valid, mask of the lanes routed to the same expert); the first SORT_RS steps' ids and
     * masks are loaded (all loads first) and grouped once, into rk / rm */
    int32_t rk[SORT_RS];
    unsigned rm[SORT_RS];
#pragma unroll
    for (int s = 0; s < SORT_RS; s++) {
        const int64_t a = a0 + 32 * s + lane;
        rk[s] = a < a1 ? __ldcg(ids + a) : -1;
    }
#pragma unroll
    for (int s = 0; s < SORT_RS; s++)
        if (a0 + 32 * s < a1) rm[s] = moe_same_key(rk[s], rk[s] >= 0 && rk[s] < E, E, ballots);
    auto walk = [&](auto &&visit) {
#pragma unroll
        for (int s = 0; s < SORT_RS; s++) {
            const int64_t a = a0 + 32 * s + lane;
            if (a0 + 32 * s < a1) visit(a, a < a1, rk[s], rk[s] >= 0 && rk[s] < E, rm[s]);
        }
        for (int64_t b = a0 + 32 * SORT_RS; b < a1; b += 32) {
            const int64_t a = b + lane;
            const int32_t e = a < a1 ? __ldcg(ids + a) : -1;
            const bool valid = e >= 0 && e < E;
            visit(a, a < a1, e, valid, moe_same_key(e, valid, E, ballots));
        }
    };
    for (int i = tid; i < pw * E; i += blockDim.x)
        wc[i] = 0;
    __syncthreads();
    walk([&](int64_t a, bool in, int32_t e, bool valid, unsigned mask) {
        if (in && !valid) inv[a] = -1;
        if (valid && lane == __ffs(mask) - 1) mine[e] += __popc(mask);
        __syncwarp();
    });
    __syncthreads();
    for (int e = tid; e < E; e += blockDim.x) { /* per-warp bases; the total into eoff for now */
        int32_t run = 0;
#pragma unroll 8
        for (int w = 0; w < pw; w++) {
            const int32_t c = wc[w * E + e];
            wc[w * E + e] = run;
            run += c;
        }
        eoff[e] = run;
    }
    __syncthreads();
    if (warp == 0) {
        /* lane l owns experts [l * per, (l + 1) * per): local sums, warp exclusive scan */
        const int per = (E + 31) / 32;
        const int e0 = min(E, lane * per), e1 = min(E, e0 + per);
        int32_t rows = 0, nt = 0;
        for (int e = e0; e < e1; e++) {
            rows += eoff[e];
            nt += (eoff[e] + tn - 1) / tn;
        }
        int32_t rows_x = rows, nt_x = nt; /* inclusive scans */
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
            const int32_t r = __shfl_up_sync(0xffffffffu, rows_x, o);
            const int32_t q = __shfl_up_sync(0xffffffffu, nt_x, o);
            if (lane >= o) {
                rows_x += r;
                nt_x += q;
            }
        }
        int32_t o = rows_x - rows, t = nt_x - nt;
        for (int e = e0; e < e1; e++) {
            const int32_t c = eoff[e];
            off[e] = o;
            eoff[e] = o;
            for (int r = 0; r < c; r += tn)
                tiles[t++] = make_int2(e, o + r);
            o += c;
        }
        if (lane == 31) {
            off[E] = rows_x;
            *ntiles = nt_x;
        }
    }
    __syncthreads();
    walk([&](int64_t a, bool, int32_t e, bool valid, unsigned mask) {
        const int base = valid ? eoff[e] + mine[e] : 0;
        __syncwarp();
        if (valid && lane == __ffs(mask) - 1) mine[e] += __popc(mask);
        __syncwarp();
        if (valid) {
            const int p = base + __popc(mask & ((1u << lane) - 1u));
            perm[p] = (int32_t)a;
            inv[a] = p;
        }
    });
}

/* The same sort for one token's k <= 32 assignments of distinct experts, by the one warp that
 * routed them, from its registers: lane j < k holds assignment j's expert e (the other lanes
 * pass anything). With distinct experts the stable sort is the order of the ids, each expert's
 * count one: assignment j goes to row rank(j) (the valid ids below it), off[x] counts the valid
 * ids below x, and each valid id has one tile. The picks become a set of E bits in sh (a word a
 * lane: E <= 1024), so every count is a popcount of one word plus the words' prefix, one warp
 * scan, with no loop over the picks for each x (the routing CTA sorted in 2.1-2.3 us a layer
 * so; on an H100, same run, b1 x 4k engine steps 3.591-3.625 -> 3.575-3.592 ms and b1 x 1k
 * medians 3.371 -> 3.326: docs/BENCHMARKS.md, thirty-fifth session).
 * Returns false, having written nothing but sh, when two valid ids are equal (fewer bits than
 * valid picks; a top-k never picks one expert twice; the caller then runs rw_moe_sort_cta on
 * the ids it wrote). sh: 32 ints of shared scratch. */
__device__ __forceinline__ bool rw_moe_sort_one_token_warp(int32_t e, int k, int E, int32_t *off,
                                                           int2 *tiles, int32_t *ntiles,
                                                           int32_t *perm, int32_t *inv,
                                                           int32_t *sh) {
    const int lane = threadIdx.x & 31;
    const bool valid = lane < k && e >= 0 && e < E;
    const unsigned vb = __ballot_sync(0xffffffffu, valid);
    unsigned *const bits = (unsigned *)sh; /* bit e % 32 of word e / 32: expert e was picked */
    bits[lane] = 0u;
    __syncwarp();
    if (valid) atomicOr(&bits[e >> 5], 1u << (e & 31));
    __syncwarp();
    const unsigned word = bits[lane];
    int incl = __popc(word); /* picks in words 0..lane */
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        const int t = __shfl_up_sync(0xffffffffu, incl, o);
        if (lane >= o) incl += t;
    }
    const int base = incl - __popc(word); /* picks below expert 32 lane */
    const int total = __shfl_sync(0xffffffffu, incl, 31);
    __syncwarp(); /* every lane has read its word: sh is the caller's again */
    if (total != __popc(vb)) return false;
    const int we = valid ? e >> 5 : 0;
    const int rb = __shfl_sync(0xffffffffu, base, we);
    const unsigned rw = __shfl_sync(0xffffffffu, word, we);
    const int32_t rank = rb + __popc(rw & ((1u << (e & 31)) - 1u));
    if (lane < k) {
        inv[lane] = valid ? rank : -1;
        if (valid) {
            perm[rank] = lane;
            tiles[rank] = make_int2(e, rank);
        }
    }
    for (int x0 = 0; x0 <= E; x0 += 32) { /* word x0 / 32 of the set; past the last, all of it */
        const int t = x0 >> 5;
        const int b = t < 32 ? __shfl_sync(0xffffffffu, base, t) : total;
        const unsigned w = t < 32 ? __shfl_sync(0xffffffffu, word, t) : 0u;
        if (x0 + lane <= E) off[x0 + lane] = b + __popc(w & ((1u << lane) - 1u));
    }
    if (lane == 0) *ntiles = __popc(vb);
    return true;
}

#endif
