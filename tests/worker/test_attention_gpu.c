/* test_attention_gpu.c - the CUDA backend's attention (worker/kernels/attention.cu) against its
 * plain-C reference on random inputs (gpu suite): prefill tiles, decode tiles of one and two row
 * fragments, unsplit and split, on a bf16 cache and on a cache of pairs, within named tolerances;
 * and its batch invariance bit for bit (a token's output is the same in any tiling, split or
 * batch). */
#include <math.h>

#include "rw_test.h"
#include "rw_test_cuda.h"
#include "kernels/attention.h"
#include "rw_worker.h"

/* Device buffers of one attention problem: K/V cache, q, block tables, positions, tiles. */
typedef struct attn_dev {
    float *q;
    uint16_t *kc, *vc, *kl, *vl, *hi, *lo;
    int32_t *pos, *bt;
    rw_attn_tile *tiles;
    void *part;
    size_t part_bytes;
} attn_dev;

static void attn_dev_free(attn_dev *d) {
    cudaFree(d->q);
    cudaFree(d->kc);
    cudaFree(d->vc);
    cudaFree(d->kl);
    cudaFree(d->vl);
    cudaFree(d->hi);
    cudaFree(d->lo);
    cudaFree(d->pos);
    cudaFree(d->bt);
    cudaFree(d->tiles);
    cudaFree(d->part);
}

/* A K or V cache of n elements from seed: random bf16 values, or (lo != NULL) random fp32 values
 * as hi + lo pairs (the high-precision mode's cache). */
static void fill_kv(uint16_t *hi, uint16_t *lo, size_t n, uint64_t seed) {
    if (!lo) {
        rw_test_fill_bf16(hi, n, seed, 1.0f);
        return;
    }
    float *f = malloc(4 * n);
    rw_test_fill_f32(f, n, seed, 1.0f);
    for (size_t i = 0; i < n; i++)
        rw_k_store_split(f[i], hi, lo, (int64_t)i);
    free(f);
}

/* Fails unless the first n of the combine's ready counters (the start of a split launch's
 * scratch) are zero, as every launch leaves them (attention.h). */
static void assert_ready_zero(const void *part, int n, const char *what) {
    unsigned *rd = malloc(sizeof *rd * (size_t)n);
    rw_tdev_get(rd, part, sizeof *rd * (size_t)n);
    for (int i = 0; i < n; i++)
        if (rd[i] != 0) fail_msg("attention %s: ready counter %d is %u", what, i, rd[i]);
    free(rd);
}

/* Runs the kernel on `tiles` (qt = their largest count) and compares with the reference. The
 * cache is kv (host arrays; with low halves: the high-precision mode). */
static void attention_check(int nh, int nkv, int hd, int nsplit, const float *q, size_t qe,
                            rw_kv_planes kv, size_t ce, const int32_t *pos, int64_t ntok,
                            const int32_t *bt, int nbt, int stride, const rw_attn_tile *tiles,
                            int ntiles, const char *label) {
    const int bs = 16;
    uint16_t *o = malloc(2 * qe), *ol = malloc(2 * qe), *go = malloc(2 * qe),
             *gol = malloc(2 * qe);
    rw_k_attention_ref(q, kv, tiles, ntiles, pos, bt, stride, nh, nkv, hd, bs, o, ol);
    attn_dev d = {0};
    d.q = rw_tdev_put(q, 4 * qe);
    d.kc = rw_tdev_put(kv.k, 2 * ce);
    d.vc = rw_tdev_put(kv.v, 2 * ce);
    if (kv.k_lo) {
        d.kl = rw_tdev_put(kv.k_lo, 2 * ce);
        d.vl = rw_tdev_put(kv.v_lo, 2 * ce);
    }
    const rw_kv_planes dkv = {d.kc, d.vc, d.kl, d.vl};
    d.pos = rw_tdev_put(pos, sizeof(int32_t) * (size_t)ntok);
    d.bt = rw_tdev_put(bt, sizeof(int32_t) * (size_t)nbt);
    d.tiles = rw_tdev_put(tiles, sizeof(rw_attn_tile) * (size_t)ntiles);
    RW_TCK(cudaMalloc((void **)&d.hi, 2 * qe));
    RW_TCK(cudaMalloc((void **)&d.lo, 2 * qe));
    int qt = 1, maxp = 0;
    for (int i = 0; i < ntiles; i++)
        qt = tiles[i].ntok > qt ? tiles[i].ntok : qt;
    for (int64_t t = 0; t < ntok; t++)
        maxp = pos[t] > maxp ? pos[t] : maxp;
    d.part_bytes = rw_k_attention_part_bytes(ntok, nh, hd, maxp / RW_ATTN_SEG + 1);
    if (nsplit) {
        RW_TCK(cudaMalloc(&d.part, d.part_bytes));
        RW_TCK(cudaMemset(d.part, 0, d.part_bytes)); /* the ready counters (attention.h) */
    }
    rw_err err = {0};
    RW_ASSERT_OK(rw_k_attention(d.q, dkv, d.tiles, ntiles, qt, d.pos, d.bt, stride, ntok, nh, nkv,
                                hd, bs, nsplit, d.part, d.part_bytes, d.hi, d.lo, NULL, &err),
                 &err);
    rw_tdev_get(go, d.hi, 2 * qe);
    rw_tdev_get(gol, d.lo, 2 * qe);
    if (nsplit) assert_ready_zero(d.part, ntok * nh < 256 ? (int)(ntok * nh) : 256, label);
    /* outputs are averages of O(1) values, computed in fp32 in another order: absolute 1e-5 */
    char what[128];
    snprintf(what, sizeof what, "attention %s nh %d nkv %d hd %d split %d%s", label, nh, nkv, hd,
             nsplit, kv.k_lo ? " (pairs)" : "");
    double vmax = 0.0;
    for (size_t i = 0; i < ce; i++)
        vmax = fmax(vmax, fabs(rw_bf16_to_f32(kv.v[i])));
    /* with pairs the softmax weights are pairs too: the fp32 budget, which a kernel that left
     * out a low half (2^-9 of each key or value) would not meet */
    rw_assert_close_pair(go, gol, o, ol, qe, kv.k_lo ? RW_TOL_ATTN_KV2(vmax) : RW_TOL_ATTN_P1(vmax),
                         what);
    attn_dev_free(&d);
    free(o);
    free(ol);
    free(go);
    free(gol);
}

/* Three sequences: a prefill chunk of 19 tokens at positions 250..268 (tiles of w tokens, across
 * the first segment boundary), a decode at position 300, a fresh 3-token prompt; blocks shuffled.
 * Which kernel a tile takes depends on its rows (tokens x the group's query heads): up to 16 one
 * of the decode forms, more the prefill kernel (attention.cu). */
static void attention_tiled_case(int nh, int nkv, int hd, int nsplit, bool pairs, int w) {
    const int bs = 16, nblocks = 64, stride = 32;
    const int64_t ntok = 19 + 1 + 3;
    const size_t ce = (size_t)nblocks * nkv * bs * hd;
    uint16_t *kc = malloc(2 * ce), *vc = malloc(2 * ce), *kl = malloc(2 * ce), *vl = malloc(2 * ce);
    fill_kv(kc, pairs ? kl : NULL, ce, 11);
    fill_kv(vc, pairs ? vl : NULL, ce, 12);
    const rw_kv_planes kv = {kc, vc, pairs ? kl : NULL, pairs ? vl : NULL};
    int32_t bt[3 * 32];
    for (int i = 0; i < 3 * stride; i++)
        bt[i] = (i * 29 + 5) % nblocks; /* distinct per row */
    int32_t pos[23];
    for (int i = 0; i < 19; i++)
        pos[i] = 250 + i;
    pos[19] = 300;
    for (int i = 0; i < 3; i++)
        pos[20 + i] = i;
    rw_attn_tile tiles[19 + 2];
    int nt = 0;
    for (int i = 0; i < 19; i += w)
        tiles[nt++] = (rw_attn_tile){0, i, 19 - i < w ? 19 - i : w, 0};
    tiles[nt++] = (rw_attn_tile){1, 19, 1, 0};
    tiles[nt++] = (rw_attn_tile){2, 20, 3, 0};
    const size_t qe = (size_t)ntok * nh * hd;
    float *q = malloc(4 * qe);
    rw_test_fill_f32(q, qe, 13, 1.0f);
    char label[32];
    snprintf(label, sizeof label, "prefill (tiles of %d)", w);
    attention_check(nh, nkv, hd, nsplit, q, qe, kv, ce, pos, ntok, bt, 3 * stride, stride, tiles,
                    nt, label);
    free(kc);
    free(vc);
    free(kl);
    free(vl);
    free(q);
}

/* Tiles of 8 tokens (for 8 query heads a kv head the prefill kernel's 64 rows) ... */
static void attention_case(int nh, int nkv, int hd, int nsplit, bool pairs) {
    attention_tiled_case(nh, nkv, hd, nsplit, pairs, 8);
}
/* ... and tiles as wide as the engine makes them (rw_k_attention_tile_tokens: 64 rows), which for
 * fewer query heads a kv head are the only ones that reach the prefill kernel */
static void attention_wide_case(int nh, int nkv, int hd, int nsplit, bool pairs) {
    attention_tiled_case(nh, nkv, hd, nsplit, pairs, rw_k_attention_tile_tokens(nh, nkv));
}

/* A decode batch: one-token tiles only (qt 1) at positions pos[0..ns), blocks shuffled. */
static void attention_decode_at(int nh, int nkv, int hd, int nsplit, const int32_t *pos, int ns,
                                bool pairs) {
    const int bs = 16;
    int maxp = 0;
    for (int i = 0; i < ns; i++)
        maxp = pos[i] > maxp ? pos[i] : maxp;
    const int stride = maxp / bs + 1, nblocks = stride * 2;
    const size_t ce = (size_t)nblocks * nkv * bs * hd;
    uint16_t *kc = malloc(2 * ce), *vc = malloc(2 * ce), *kl = malloc(2 * ce), *vl = malloc(2 * ce);
    fill_kv(kc, pairs ? kl : NULL, ce, 21);
    fill_kv(vc, pairs ? vl : NULL, ce, 22);
    const rw_kv_planes kv = {kc, vc, pairs ? kl : NULL, pairs ? vl : NULL};
    int32_t *bt = malloc(sizeof(int32_t) * (size_t)ns * stride);
    for (int i = 0; i < ns * stride; i++)
        bt[i] = (int32_t)(((int64_t)i * 37 + 11) % nblocks); /* distinct within a row */
    rw_attn_tile *tiles = malloc(sizeof(rw_attn_tile) * (size_t)ns);
    for (int i = 0; i < ns; i++)
        tiles[i] = (rw_attn_tile){i, i, 1, 0};
    const size_t qe = (size_t)ns * nh * hd;
    float *q = malloc(4 * qe);
    rw_test_fill_f32(q, qe, 23, 1.0f);
    attention_check(nh, nkv, hd, nsplit, q, qe, kv, ce, pos, ns, bt, ns * stride, stride, tiles, ns,
                    "decode");
    free(kc);
    free(vc);
    free(kl);
    free(vl);
    free(bt);
    free(tiles);
    free(q);
}

/* Positions at block, key-block and segment edges (up to 5 segments: a second round of the
 * decode kernel's 4 warps with one busy warp). */
static void attention_decode_case(int nh, int nkv, int hd, int nsplit, bool pairs) {
    static const int32_t pos[] = {0, 15, 16, 17, 100, 255, 256, 300, 639};
    attention_decode_at(nh, nkv, hd, nsplit, pos, (int)(sizeof pos / sizeof pos[0]), pairs);
}

/* Long contexts: up to 27 segments (7 rounds), last segments of 1 to 4 key blocks, so each
 * warp's stream of staged blocks crosses rounds at every offset of the kernel's stage ring. */
static void attention_decode_long_case(int nh, int nkv, int hd, int nsplit, bool pairs) {
    static const int32_t pos[] = {1023, 1024, 1055, 1056, 2047, 2100, 3000, 3455};
    attention_decode_at(nh, nkv, hd, nsplit, pos, (int)(sizeof pos / sizeof pos[0]), pairs);
}

/* A batch wide enough for the combine's ready counters (attention.h: at least 16 tokens) at
 * mixed lengths, so that a combine CTA merges its row while other rows' split CTAs still run. */
static void attention_decode_wide_case(int nh, int nkv, int hd, int nsplit, bool pairs) {
    static const int32_t pos[] = {0,    15, 16,   127, 128, 300,  639, 700,  1023, 1024,
                                  1055, 40, 2047, 100, 511, 3000, 255, 1500, 9,    777};
    attention_decode_at(nh, nkv, hd, nsplit, pos, (int)(sizeof pos / sizeof pos[0]), pairs);
}

/* Every kernel form (prefill tiles; decode tiles of one and two row fragments, unsplit and
 * split) on a bf16 cache and on a cache of pairs (the high-precision mode). */
static void test_attention(void **state) {
    (void)state;
    for (int pairs = 0; pairs < 2; pairs++) {
        attention_case(32, 4, 128, 0, pairs);
        attention_case(32, 4, 128, 4, pairs);
        attention_case(4, 2, 32, 0, pairs);
        attention_case(4, 2, 32, 3, pairs);
        attention_case(8, 8, 64, 0, pairs);
        attention_wide_case(4, 2, 32, 0, pairs);
        attention_wide_case(4, 2, 32, 3, pairs);
        attention_wide_case(8, 8, 64, 0, pairs);
        attention_wide_case(8, 8, 64, 2, pairs);
        attention_decode_case(32, 4, 128, 0, pairs);
        attention_decode_case(32, 4, 128, 16, pairs);
        attention_decode_case(4, 2, 32, 0, pairs);
        attention_decode_case(4, 2, 32, 5, pairs);
        attention_decode_case(8, 8, 64, 1, pairs);
        attention_decode_case(16, 1, 64, 3, pairs);
        attention_decode_case(12, 1, 128, 2, pairs);
        attention_decode_long_case(32, 4, 128, 0, pairs);
        attention_decode_long_case(32, 4, 128, 3, pairs);
        attention_decode_long_case(8, 8, 64, 0, pairs);
        attention_decode_wide_case(32, 4, 128, 0, pairs);
        attention_decode_wide_case(32, 4, 128, 3, pairs);
        attention_decode_wide_case(4, 2, 32, 16, pairs);
    }
}

/* Batch invariance: one sequence of 40 tokens at positions 490..529 (across a segment boundary:
 * 512 is a multiple of RW_ATTN_SEG) attended in several batches: one prefill chunk in the engine's
 * tiles (rw_k_attention_tile_tokens: the prefill kernel but for a short last tile), the same
 * tokens in tiles of 3 and 5 next to another sequence's tokens, every token alone as a one-token
 * tile (a decode step), and the first D of them alone as a decode batch of D, with and without
 * splits (nsplit 0, 1, 2, 7). The outputs (hi and lo) must be the same bits in every run. The
 * batch of D launches a grid smaller than the SM count where the 40 launch more CTAs than fit
 * one wave, so a launch-shape choice made by grid size would show here. */
static void invariance_case(int nh, int nkv, int hd, bool pairs) {
    enum { N = 40, P0 = 490, OTHER = 11, D = 8 };
    const int bs = 16, nblocks = 80, stride = 40;
    const size_t ce = (size_t)nblocks * nkv * bs * hd;
    uint16_t *kc = malloc(2 * ce), *vc = malloc(2 * ce), *kl = malloc(2 * ce), *vl = malloc(2 * ce);
    fill_kv(kc, pairs ? kl : NULL, ce, 31);
    fill_kv(vc, pairs ? vl : NULL, ce, 32);
    int32_t bt[2 * 40];
    for (int i = 0; i < 2 * stride; i++)
        bt[i] = (i * 23 + 3) % nblocks;
    /* batch layout A: [the 40 tokens]; layout B: [OTHER tokens of sequence 1 | the 40 tokens] */
    const size_t row = (size_t)nh * hd;
    float *q = malloc(4 * row * (N + OTHER));
    rw_test_fill_f32(q, row * (N + OTHER), 33, 1.0f);
    int32_t pos[N + OTHER];
    for (int i = 0; i < OTHER; i++)
        pos[i] = 100 + i;
    for (int i = 0; i < N; i++)
        pos[OTHER + i] = P0 + i;
    float *dq = rw_tdev_put(q, 4 * row * (N + OTHER));
    int32_t *dpos = rw_tdev_put(pos, sizeof pos), *dbt = rw_tdev_put(bt, sizeof bt);
    uint16_t *dkc = rw_tdev_put(kc, 2 * ce), *dvc = rw_tdev_put(vc, 2 * ce), *dhi, *dlo;
    uint16_t *dkl = rw_tdev_put(kl, 2 * ce), *dvl = rw_tdev_put(vl, 2 * ce);
    const rw_kv_planes dkv = {dkc, dvc, pairs ? dkl : NULL, pairs ? dvl : NULL};
    RW_TCK(cudaMalloc((void **)&dhi, 2 * row * (N + OTHER)));
    RW_TCK(cudaMalloc((void **)&dlo, 2 * row * (N + OTHER)));
    const size_t pb = rw_k_attention_part_bytes(N + OTHER, nh, hd, (P0 + N) / RW_ATTN_SEG + 1);
    void *part;
    RW_TCK(cudaMalloc(&part, pb));
    RW_TCK(cudaMemset(part, 0, pb)); /* the ready counters (attention.h) */
    rw_attn_tile *dt;
    RW_TCK(cudaMalloc((void **)&dt, sizeof(rw_attn_tile) * (N + OTHER)));
    uint16_t *first = malloc(4 * row * N), *got = malloc(4 * row * N);
    rw_err err = {0};
    static const int splits[] = {0, 1, 2, 7};
    const int tw = rw_k_attention_tile_tokens(nh, nkv);
    int runs = 0;
    for (int layout = 0; layout < 4; layout++)
        for (size_t si = 0; si < sizeof splits / sizeof splits[0]; si++) {
            rw_attn_tile tiles[N + OTHER];
            int nt = 0, qt = 1;
            const int base = layout == 1 ? OTHER : 0; /* first of the 40 tokens in the batch */
            if (layout == 0) { /* the 40 tokens alone, in the engine's tiles (64 rows) */
                for (int i = 0; i < N; i += tw)
                    tiles[nt++] = (rw_attn_tile){0, i, N - i < tw ? N - i : tw, 0};
            } else if (layout == 1) { /* after sequence 1, tiles of 3 and 5 */
                for (int i = 0; i < OTHER; i += 4)
                    tiles[nt++] = (rw_attn_tile){1, i, OTHER - i < 4 ? OTHER - i : 4, 0};
                for (int i = 0, w = 3; i < N; i += w, w = w == 3 ? 5 : 3)
                    tiles[nt++] = (rw_attn_tile){0, OTHER + i, N - i < w ? N - i : w, 0};
            } else { /* every token alone: a decode batch of N, or of the first D (layout 3) */
                for (int i = 0; i < (layout == 3 ? D : N); i++)
                    tiles[nt++] = (rw_attn_tile){0, i, 1, 0};
            }
            for (int i = 0; i < nt; i++)
                qt = tiles[i].ntok > qt ? tiles[i].ntok : qt;
            const int64_t ntok = layout == 1 ? N + OTHER : layout == 3 ? D : N;
            const int64_t rows = layout == 3 ? D : N; /* the 40 tokens' rows this run computes */
            /* layouts 0, 2 and 3 use the 40 tokens' rows of q and pos directly */
            const float *qp = layout == 1 ? dq : dq + row * OTHER;
            const int32_t *pp = layout == 1 ? dpos : dpos + OTHER;
            /* sequence 0's block table is row 0, sequence 1's row 1 */
            RW_TCK(cudaMemcpy(dt, tiles, sizeof(rw_attn_tile) * (size_t)nt, cudaMemcpyHostToDevice));
            RW_ASSERT_OK(rw_k_attention(qp, dkv, dt, nt, qt, pp, dbt, stride, ntok, nh, nkv, hd, bs,
                                        splits[si], part, pb, dhi, dlo, NULL, &err),
                         &err);
            rw_tdev_get(got, dhi + row * base, 2 * row * rows);
            rw_tdev_get(got + row * N, dlo + row * base, 2 * row * rows);
            if (runs++ == 0) {
                memcpy(first, got, 4 * row * N);
            } else {
                char what[128];
                snprintf(what, sizeof what,
                         "attention invariance nh %d hd %d%s: layout %d split %d vs layout 0 "
                         "split 0",
                         nh, hd, pairs ? " (pairs)" : "", layout, splits[si]);
                rw_assert_bytes_equal(got, first, 2 * row * rows, what);
                rw_assert_bytes_equal(got + row * N, first + row * N, 2 * row * rows, what);
            }
        }
    assert_ready_zero(part, RW_ATTN_READY, "invariance launches"); /* all of them, for the next */
    cudaFree(dq);
    cudaFree(dpos);
    cudaFree(dbt);
    cudaFree(dkc);
    cudaFree(dvc);
    cudaFree(dkl);
    cudaFree(dvl);
    cudaFree(dhi);
    cudaFree(dlo);
    cudaFree(part);
    cudaFree(dt);
    free(kc);
    free(vc);
    free(kl);
    free(vl);
    free(q);
    free(first);
    free(got);
}

static void test_attention_invariance(void **state) {
    (void)state;
    for (int pairs = 0; pairs < 2; pairs++) {
        invariance_case(32, 4, 128, pairs);
        invariance_case(4, 2, 32, pairs);
    }
}

/* Arguments the launcher refuses, each with an error naming what was wrong, before any launch. */
static void test_attention_bad_args(void **state) {
    (void)state;
    uint16_t *out = rw_tdev_alloc(2 * 64);
    const rw_attn_tile *tiles = (const rw_attn_tile *)out; /* never read: refused first */
    const rw_kv_planes kv = {out, out, NULL, NULL};
    rw_err err = {0};
    /* the outputs must be 4-byte aligned (the prefill kernel stores column pairs) */
    rw_assert_status(rw_k_attention(NULL, kv, tiles, 1, 1, NULL, NULL, 1, 1, 8, 2, 64, 16, 0, NULL,
                                    0, out + 1, out, NULL, &err),
                     RW_E_INVALID_ARG, &err, "aligned", "attention");
    rw_assert_status(rw_k_attention(NULL, kv, tiles, 1, 1, NULL, NULL, 1, 1, 8, 2, 64, 16, 0, NULL,
                                    0, out, out + 1, NULL, &err),
                     RW_E_INVALID_ARG, &err, "aligned", "attention");
    rw_assert_status(rw_k_attention(NULL, kv, tiles, 1, 1, NULL, NULL, 1, 1, 8, 3, 64, 16, 0, NULL,
                                    0, out, out, NULL, &err),
                     RW_E_UNSUPPORTED, &err, "kv heads", "attention");
    rw_assert_status(rw_k_attention(NULL, kv, tiles, 1, 1, NULL, NULL, 1, 1, 8, 2, 96, 16, 0, NULL,
                                    0, out, out, NULL, &err),
                     RW_E_UNSUPPORTED, &err, "head_dim 96", "attention");
    cudaFree(out);
}

int main(void) {
    rw_test_require_gpu(1);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_attention),
        cmocka_unit_test(test_attention_invariance),
        cmocka_unit_test(test_attention_bad_args),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
