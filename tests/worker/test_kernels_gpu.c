/* test_kernels_gpu.c - every kernel of the CUDA backend (worker/kernels/) against its plain-C
 * reference on random inputs (gpu suite): embedding and logits gather byte for byte; norms (hi +
 * lo pairs), RoPE and the KV write, attention (prefill tiles, decode, key splits), router logits
 * within named tolerances; attention's batch invariance bit for bit (a token's output is the same
 * in any tiling, split or batch); the router with its routing against moe's route kernel and
 * reference, bit for bit; sampling: greedy, logprobs and top-n exactly or within 1e-5,
 * sampled tokens equal to the reference's for nearly every row, and bit-identical reruns;
 * processed logprobs and given tokens (scoring) within 1e-4 of the reference. */
#include <math.h>

#include "rw_test.h"
#include "rw_test_cuda.h"
#include "kernels/attention.h"
#include "kernels/norm_rope.h"
#include "kernels/router.h"
#include "kernels/sample.h"
#include "kernels/vocab.h"
#include "rw_moe.h"
#include "rw_worker.h"

static void test_embed_gather(void **state) {
    (void)state;
    const int64_t n = 50, H = 256, vl = 300, vb = 300;
    int32_t tok[50];
    for (int i = 0; i < n; i++)
        tok[i] = (i * 97) % 900; /* some outside [300, 600) */
    uint16_t *emb = malloc(2 * vl * H);
    rw_test_fill_bf16(emb, (size_t)(vl * H), 1, 1.0f);
    float *x = malloc(4 * n * H), *gx = malloc(4 * n * H);
    rw_k_embed_ref(tok, n, emb, vb, vl, H, x);
    int32_t *dt = rw_tdev_put(tok, sizeof tok);
    uint16_t *de = rw_tdev_put(emb, 2 * vl * H);
    float *dx;
    RW_TCK(cudaMalloc((void **)&dx, 4 * n * H));
    rw_err err = {0};
    RW_ASSERT_OK(rw_k_embed(dt, n, de, vb, vl, H, dx, NULL, &err), &err);
    rw_tdev_get(gx, dx, 4 * n * H);
    rw_assert_bytes_equal(gx, x, 4 * n * H, "embed");
    /* logits gather: [T=3, rows 5, vl 40] -> [5, 100] */
    float g[3 * 5 * 40], o[5 * 100], go[5 * 100];
    rw_test_fill_f32(g, 600, 2, 1.0f);
    rw_k_logits_gather_ref(g, 3, 5, 40, 100, o);
    float *dg = rw_tdev_put(g, sizeof g), *dgo;
    RW_TCK(cudaMalloc((void **)&dgo, sizeof go));
    RW_ASSERT_OK(rw_k_logits_gather(dg, 3, 5, 40, 100, dgo, NULL, &err), &err);
    rw_tdev_get(go, dgo, sizeof go);
    rw_assert_bytes_equal(go, o, sizeof o, "logits gather");
    cudaFree(dt);
    cudaFree(de);
    cudaFree(dx);
    cudaFree(dg);
    cudaFree(dgo);
    free(emb);
    free(x);
    free(gx);
}

static void test_norms(void **state) {
    (void)state;
    const int64_t n = 33, H = 2048;
    float *x = malloc(4 * n * H), *y = malloc(4 * n * H), *x2 = malloc(4 * n * H);
    uint16_t *w = malloc(2 * H), *ob = malloc(2 * n * H), *gob = malloc(2 * n * H);
    uint16_t *ol = malloc(2 * n * H), *gol = malloc(2 * n * H);
    float *of = malloc(4 * n * H), *gof = malloc(4 * n * H);
    rw_test_fill_f32(x, (size_t)(n * H), 3, 1.0f);
    rw_test_fill_f32(y, (size_t)(n * H), 4, 0.5f);
    rw_rng r;
    rw_rng_seed(&r, 5);
    for (int i = 0; i < H; i++)
        w[i] = rw_f32_to_bf16(1.0f + 0.1f * rw_rng_normal(&r));
    float *dx = rw_tdev_put(x, 4 * n * H), *dy = rw_tdev_put(y, 4 * n * H), *dof;
    uint16_t *dw = rw_tdev_put(w, 2 * H), *dob, *dol;
    RW_TCK(cudaMalloc((void **)&dob, 2 * n * H));
    RW_TCK(cudaMalloc((void **)&dol, 2 * n * H));
    RW_TCK(cudaMalloc((void **)&dof, 4 * n * H));
    rw_err err = {0};
    memcpy(x2, x, 4 * n * H);
    rw_k_add_rmsnorm_ref(x2, y, w, n, H, 1e-6f, ob, ol, of);
    RW_ASSERT_OK(rw_k_add_rmsnorm(dx, dy, dw, n, H, 1e-6f, dob, dol, dof, NULL, &err), &err);
    float *gx = malloc(4 * n * H);
    rw_tdev_get(gx, dx, 4 * n * H);
    rw_assert_bytes_equal(gx, x2, 4 * n * H, "residual add");
    rw_tdev_get(gob, dob, 2 * n * H);
    rw_tdev_get(gol, dol, 2 * n * H);
    rw_tdev_get(gof, dof, 4 * n * H);
    rw_assert_close(gob, ob, (size_t)(n * H), RW_TOL_BF16_ROUND, "add_rmsnorm hi");
    /* two pairs that split fp32 values within RW_TOL_F32_REORDER of each other: each pair is
     * within 2^-17 of its value */
    rw_assert_close_pair(gob, gol, ob, ol, (size_t)(n * H), RW_TOL_BF16_PAIR,
                         "add_rmsnorm hi + lo");
    rw_assert_close(gof, of, (size_t)(n * H), RW_TOL_F32_REORDER, "add_rmsnorm f32");
    /* the pair is the fp32 value split: hi + lo within 2^-16 of it */
    for (int64_t i = 0; i < n * H; i++) {
        const double v = (double)rw_bf16_to_f32(gob[i]) + rw_bf16_to_f32(gol[i]);
        if (!(fabs(v - gof[i]) <= fabs(gof[i]) * (1.0 / 65536)))
            fail_msg("add_rmsnorm: element %lld: hi + lo %.9g vs fp32 %.9g", (long long)i, v,
                     gof[i]);
    }
    /* selected rows, with the add */
    int32_t rows[4] = {7, 0, 32, 15};
    memcpy(x2, x, 4 * n * H);
    rw_k_rmsnorm_rows_ref(x2, y, rows, 4, w, H, 1e-6f, ob, ol);
    RW_TCK(cudaMemcpy(dx, x, 4 * n * H, cudaMemcpyHostToDevice));
    int32_t *dr = rw_tdev_put(rows, sizeof rows);
    RW_ASSERT_OK(rw_k_rmsnorm_rows(dx, dy, dr, 4, dw, H, 1e-6f, dob, dol, NULL, &err), &err);
    rw_tdev_get(gob, dob, 2 * 4 * H);
    rw_tdev_get(gol, dol, 2 * 4 * H);
    rw_assert_close_pair(gob, gol, ob, ol, (size_t)(4 * H), RW_TOL_BF16_PAIR, "rmsnorm rows");
    cudaFree(dx);
    cudaFree(dy);
    cudaFree(dw);
    cudaFree(dob);
    cudaFree(dol);
    cudaFree(dof);
    cudaFree(dr);
    free(x);
    free(y);
    free(x2);
    free(w);
    free(ob);
    free(gob);
    free(ol);
    free(gol);
    free(of);
    free(gof);
    free(gx);
}

/* The experts' combine fused into the next norm: x after the combine is the reference's bit for
 * bit (fmaf over the slots in order, then one add), and the outputs are rw_k_add_rmsnorm's on
 * that x byte for byte (the fused path must not move a bit of the forward pass) and within the
 * norms' tolerances of the reference. Slots with no row (-1) are skipped. */
static void combine_norm_case(int64_t n, int64_t H, int k, uint64_t seed) {
    const int64_t R = n * k;
    float *x = malloc(4 * n * H), *y = malloc(4 * R * H), *wts = malloc(4 * n * k);
    float *x2 = malloc(4 * n * H), *gx = malloc(4 * n * H);
    float *of = malloc(4 * n * H), *gof = malloc(4 * n * H), *gof2 = malloc(4 * n * H);
    uint16_t *w = malloc(2 * H), *ob = malloc(2 * n * H), *ol = malloc(2 * n * H);
    uint16_t *gob = malloc(2 * n * H), *gol = malloc(2 * n * H);
    uint16_t *gob2 = malloc(2 * n * H), *gol2 = malloc(2 * n * H);
    int32_t *inv = malloc(4 * n * k);
    rw_test_fill_f32(x, (size_t)(n * H), seed, 1.0f);
    rw_test_fill_f32(y, (size_t)(R * H), seed + 1, 0.5f);
    rw_rng r;
    rw_rng_seed(&r, seed + 2);
    for (int64_t i = 0; i < H; i++)
        w[i] = rw_f32_to_bf16(1.0f + 0.1f * rw_rng_normal(&r));
    for (int64_t i = 0; i < n * k; i++) { /* a permutation of the rows, every 7th slot empty */
        inv[i] = i % 7 == 3 ? -1 : (int32_t)((i * 5 + 1) % R);
        wts[i] = 0.05f + 0.2f * (float)rw_rng_uniform(&r);
    }
    float *dx = rw_tdev_put(x, 4 * n * H), *dy = rw_tdev_put(y, 4 * R * H);
    float *dwt = rw_tdev_put(wts, 4 * n * k), *dof;
    int32_t *dinv = rw_tdev_put(inv, 4 * n * k);
    uint16_t *dw = rw_tdev_put(w, 2 * H), *dob, *dol;
    RW_TCK(cudaMalloc((void **)&dob, 2 * n * H));
    RW_TCK(cudaMalloc((void **)&dol, 2 * n * H));
    RW_TCK(cudaMalloc((void **)&dof, 4 * n * H));
    rw_err err = {0};
    memcpy(x2, x, 4 * n * H);
    rw_k_combine_rmsnorm_ref(x2, y, inv, wts, k, w, n, H, 1e-6f, ob, ol, of);
    RW_ASSERT_OK(rw_k_combine_rmsnorm(dx, dy, dinv, dwt, k, dw, n, H, 1e-6f, dob, dol, dof, NULL,
                                      &err),
                 &err);
    rw_tdev_get(gx, dx, 4 * n * H);
    rw_tdev_get(gob, dob, 2 * n * H);
    rw_tdev_get(gol, dol, 2 * n * H);
    rw_tdev_get(gof, dof, 4 * n * H);
    char what[96];
    snprintf(what, sizeof what, "combine_rmsnorm n %lld H %lld k %d: x", (long long)n,
             (long long)H, k);
    rw_assert_bytes_equal(gx, x2, 4 * n * H, what);
    rw_assert_close(gof, of, (size_t)(n * H), RW_TOL_F32_REORDER, "combine_rmsnorm f32");
    rw_assert_close_pair(gob, gol, ob, ol, (size_t)(n * H), RW_TOL_BF16_PAIR,
                         "combine_rmsnorm hi + lo");
    /* the unfused path on the combined x: the same bytes */
    RW_TCK(cudaMemcpy(dx, x2, 4 * n * H, cudaMemcpyHostToDevice));
    RW_ASSERT_OK(rw_k_add_rmsnorm(dx, NULL, dw, n, H, 1e-6f, dob, dol, dof, NULL, &err), &err);
    rw_tdev_get(gob2, dob, 2 * n * H);
    rw_tdev_get(gol2, dol, 2 * n * H);
    rw_tdev_get(gof2, dof, 4 * n * H);
    rw_assert_bytes_equal(gob, gob2, 2 * n * H, "combine_rmsnorm hi vs add_rmsnorm");
    rw_assert_bytes_equal(gol, gol2, 2 * n * H, "combine_rmsnorm lo vs add_rmsnorm");
    rw_assert_bytes_equal(gof, gof2, 4 * n * H, "combine_rmsnorm f32 vs add_rmsnorm");
    /* unsupported shapes are refused by name */
    assert_int_equal(rw_k_combine_rmsnorm(dx, dy, dinv, dwt, 9, dw, n, H, 1e-6f, dob, dol, dof,
                                          NULL, &err),
                     RW_E_UNSUPPORTED);
    assert_non_null(strstr(err.msg, "combine_rmsnorm"));
    cudaFree(dx);
    cudaFree(dy);
    cudaFree(dwt);
    cudaFree(dinv);
    cudaFree(dw);
    cudaFree(dob);
    cudaFree(dol);
    cudaFree(dof);
    free(x);
    free(y);
    free(wts);
    free(x2);
    free(gx);
    free(of);
    free(gof);
    free(gof2);
    free(w);
    free(ob);
    free(ol);
    free(gob);
    free(gol);
    free(gob2);
    free(gol2);
    free(inv);
}

static void test_combine_norm(void **state) {
    (void)state;
    combine_norm_case(33, 2048, 8, 40);
    combine_norm_case(1, 2048, 8, 41);
    combine_norm_case(5, 200, 2, 42); /* H not a multiple of the CTA's 256 */
    combine_norm_case(3, 64, 1, 43);
}

/* The values a cache's pairs stand for: out[i] = hi[i] + lo[i] (hi alone without lo). */
static void pair_values(const uint16_t *hi, const uint16_t *lo, size_t n, float *out) {
    for (size_t i = 0; i < n; i++)
        out[i] = rw_bf16_to_f32(hi[i]) + (lo ? rw_bf16_to_f32(lo[i]) : 0.0f);
}

/* q, k, v as one fused [n, q | k | v] GEMM output (row stride (nh + 2 nkv) hd); pairs: the
 * cache's low halves written too (the high-precision mode). */
static void rope_case(int n, int nh, int nkv, int hd, bool pairs) {
    const int bs = 16, nblocks = 6;
    const int64_t ld = (int64_t)(nh + 2 * nkv) * hd;
    const size_t qe = (size_t)n * nh * hd, fe = (size_t)n * ld;
    const size_t ce = (size_t)nblocks * nkv * bs * hd;
    float *qkv = malloc(4 * fe), inv[512];
    rw_test_fill_f32(qkv, fe, 6, 1.0f);
    for (int i = 0; i < hd / 2; i++)
        inv[i] = (float)(1.0 / pow(1e6, 2.0 * i / hd));
    uint16_t qn[1024], kn[1024];
    rw_test_fill_bf16(qn, hd, 9, 1.0f);
    rw_test_fill_bf16(kn, hd, 10, 1.0f);
    int32_t pos[64], slot[64];
    for (int t = 0; t < n; t++) {
        pos[t] = 100 + t * 37;                                       /* large angles */
        slot[t] = t == 5 ? -1 : ((t * 7) % nblocks) * bs + (t % bs); /* token 5 not stored */
        if (n < 6) slot[t] = t * bs + 3;
    }
    float *qo = malloc(4 * qe), *gqo = malloc(4 * qe);
    uint16_t *kc = malloc(2 * ce), *vc = malloc(2 * ce), *gkc = malloc(2 * ce),
             *gvc = malloc(2 * ce), *kl = malloc(2 * ce), *vl = malloc(2 * ce),
             *gkl = malloc(2 * ce), *gvl = malloc(2 * ce);
    for (size_t i = 0; i < ce; i++) {
        kc[i] = vc[i] = 0x3f80; /* 1.0: untouched slots stay */
        kl[i] = vl[i] = 0x3b80; /* 2^-8 */
    }
    float *dqkv = rw_tdev_put(qkv, 4 * fe), *di = rw_tdev_put(inv, sizeof(float) * (size_t)(hd / 2));
    uint16_t *dqn = rw_tdev_put(qn, 2 * (size_t)hd), *dkn = rw_tdev_put(kn, 2 * (size_t)hd);
    float *dqo;
    uint16_t *dkc = rw_tdev_put(kc, 2 * ce), *dvc = rw_tdev_put(vc, 2 * ce);
    uint16_t *dkl = rw_tdev_put(kl, 2 * ce), *dvl = rw_tdev_put(vl, 2 * ce);
    const rw_kv_planes hkv = {kc, vc, pairs ? kl : NULL, pairs ? vl : NULL};
    const rw_kv_planes dkv = {dkc, dvc, pairs ? dkl : NULL, pairs ? dvl : NULL};
    int32_t *dp = rw_tdev_put(pos, sizeof(int32_t) * (size_t)n),
            *ds = rw_tdev_put(slot, sizeof(int32_t) * (size_t)n);
    RW_TCK(cudaMalloc((void **)&dqo, 4 * qe));
    rw_err err = {0};
    const int64_t qd = (int64_t)nh * hd, kd = (int64_t)nkv * hd;
    rw_k_qk_rope_kv_ref(qkv, qkv + qd, qkv + qd + kd, ld, ld, qn, kn, pos, slot, n, nh, nkv, hd, bs,
                        inv, 1e-6f, qo, hkv);
    RW_ASSERT_OK(rw_k_qk_rope_kv(dqkv, dqkv + qd, dqkv + qd + kd, ld, ld, dqn, dkn, dp, ds, n, nh,
                                 nkv, hd, bs, di, 1e-6f, dqo, dkv, NULL, &err),
                 &err);
    rw_tdev_get(gqo, dqo, 4 * qe);
    rw_tdev_get(gkc, dkc, 2 * ce);
    rw_tdev_get(gvc, dvc, 2 * ce);
    rw_tdev_get(gkl, dkl, 2 * ce);
    rw_tdev_get(gvl, dvl, 2 * ce);
    /* sincos at angles ~1e3 differs from the host libm by a few ulps of the angle */
    rw_assert_close(gqo, qo, qe, RW_TOL_ROPE_F32, "rope q (fp32)");
    rw_assert_close(gkc, kc, ce, RW_TOL_ROPE_BF16, "rope k cache");
    rw_assert_bytes_equal(gvc, vc, 2 * ce, "v cache");
    /* the low halves: V's exactly; K's pairs within the fp32 budget of q (the same rotation);
     * untouched without pairs */
    rw_assert_bytes_equal(gvl, vl, 2 * ce, "v cache, low halves");
    if (pairs) {
        float *a = malloc(4 * ce), *b = malloc(4 * ce);
        pair_values(gkc, gkl, ce, a);
        pair_values(kc, kl, ce, b);
        rw_assert_close(a, b, ce, RW_TOL_ROPE_F32, "rope k cache pairs");
        free(a);
        free(b);
    } else {
        rw_assert_bytes_equal(gkl, kl, 2 * ce, "k cache low halves, untouched");
    }
    cudaFree(dqkv);
    cudaFree(di);
    cudaFree(dqn);
    cudaFree(dkn);
    cudaFree(dqo);
    cudaFree(dkc);
    cudaFree(dvc);
    cudaFree(dkl);
    cudaFree(dvl);
    cudaFree(dp);
    cudaFree(ds);
    free(qkv);
    free(qo);
    free(gqo);
    free(kc);
    free(vc);
    free(gkc);
    free(gvc);
    free(kl);
    free(vl);
    free(gkl);
    free(gvl);
}

static void test_rope_kv(void **state) {
    (void)state;
    for (int pairs = 0; pairs < 2; pairs++) {
        rope_case(21, 8, 2, 128, pairs);
        rope_case(1, 32, 4, 128, pairs); /* a decode token of the 30B-A3B shape */
        rope_case(40, 4, 2, 32, pairs);  /* the fixture's heads */
    }
}

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
    if (nsplit) RW_TCK(cudaMalloc(&d.part, d.part_bytes));
    rw_err err = {0};
    RW_ASSERT_OK(rw_k_attention(d.q, dkv, d.tiles, ntiles, qt, d.pos, d.bt, stride, ntok, nh, nkv,
                                hd, bs, nsplit, d.part, d.part_bytes, d.hi, d.lo, NULL, &err),
                 &err);
    rw_tdev_get(go, d.hi, 2 * qe);
    rw_tdev_get(gol, d.lo, 2 * qe);
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

/* Three sequences: a prefill chunk of 19 tokens at positions 250..268 (tiles of 8, across the
 * first segment boundary), a decode at position 300, a fresh 3-token prompt; blocks shuffled. */
static void attention_case(int nh, int nkv, int hd, int nsplit, bool pairs) {
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
    const rw_attn_tile tiles[] = {
        {0, 0, 8, 0}, {0, 8, 8, 0}, {0, 16, 3, 0}, {1, 19, 1, 0}, {2, 20, 3, 0}};
    const size_t qe = (size_t)ntok * nh * hd;
    float *q = malloc(4 * qe);
    rw_test_fill_f32(q, qe, 13, 1.0f);
    attention_check(nh, nkv, hd, nsplit, q, qe, kv, ce, pos, ntok, bt, 3 * stride, stride, tiles, 5,
                    "prefill");
    free(kc);
    free(vc);
    free(kl);
    free(vl);
    free(q);
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
    }
}

/* Batch invariance: one sequence of 40 tokens at positions 490..529 (across a segment boundary:
 * 512 is a multiple of RW_ATTN_SEG) attended in several batches: one prefill chunk in tiles of 8, the same
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
    rw_attn_tile *dt;
    RW_TCK(cudaMalloc((void **)&dt, sizeof(rw_attn_tile) * (N + OTHER)));
    uint16_t *first = malloc(4 * row * N), *got = malloc(4 * row * N);
    rw_err err = {0};
    static const int splits[] = {0, 1, 2, 7};
    int runs = 0;
    for (int layout = 0; layout < 4; layout++)
        for (size_t si = 0; si < sizeof splits / sizeof splits[0]; si++) {
            rw_attn_tile tiles[N + OTHER];
            int nt = 0, qt = 1;
            const int base = layout == 1 ? OTHER : 0; /* first of the 40 tokens in the batch */
            if (layout == 0) { /* the 40 tokens alone, in tiles of 8 */
                for (int i = 0; i < N; i += 8)
                    tiles[nt++] = (rw_attn_tile){0, i, N - i < 8 ? N - i : 8, 0};
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

/* The expert layer's sort of A assignments by expert, in plain C: the stable order, the tile
 * list of tn-row tiles per expert (rw_moe_experts_cuda_sort_dest's places) */
static int32_t sort_ref(const int32_t *ids, int64_t A, int E, int tn, int32_t *off, int32_t *tiles,
                        int32_t *perm, int32_t *inv) {
    int32_t *cur = calloc((size_t)E + 1, 4);
    memset(off, 0, 4 * ((size_t)E + 1));
    for (int64_t a = 0; a < A; a++)
        if (ids[a] >= 0 && ids[a] < E) off[ids[a] + 1]++;
    for (int e = 0; e < E; e++)
        off[e + 1] += off[e];
    memcpy(cur, off, 4 * (size_t)E);
    for (int64_t a = 0; a < A; a++) {
        inv[a] = -1;
        if (ids[a] < 0 || ids[a] >= E) continue;
        perm[cur[ids[a]]] = (int32_t)a;
        inv[a] = cur[ids[a]]++;
    }
    int32_t nt = 0;
    for (int e = 0; e < E; e++)
        for (int32_t r = off[e]; r < off[e + 1]; r += tn) {
            tiles[2 * nt] = e;
            tiles[2 * nt + 1] = r;
            nt++;
        }
    free(cur);
    return nt;
}

/* The router's nc routing counters on the device, every one back at zero after a call. */
static void assert_counters_zero(const int32_t *dcnt, int64_t nc, const char *what) {
    int32_t *cnt = malloc(4 * nc);
    rw_tdev_get(cnt, dcnt, 4 * nc);
    for (int64_t i = 0; i < nc; i++)
        if (cnt[i] != 0) fail_msg("%s: counter %lld left at %d", what, (long long)i, cnt[i]);
    free(cnt);
}

/* rw_k_router_topk_sort for a step of one token group, at two tile widths: the ids and weights of
 * rw_k_router_topk (rids, rwt) bit for bit, and the sort of sort_ref on them; the counters left
 * zero. Places for more than one group are refused. */
static void router_sort_case(const float *dx, const uint16_t *dw, int64_t n, int64_t E, int64_t H,
                             int k, const int32_t *rids, const float *rwt, int32_t *dcnt,
                             int64_t nc) {
    const int64_t A = n * k, maxt = A + E;
    int32_t *doff, *dtiles, *dnt, *dperm, *dinv, *did;
    float *dy, *dwt;
    RW_TCK(cudaMalloc((void **)&doff, 4 * (E + 1)));
    RW_TCK(cudaMalloc((void **)&dtiles, 8 * maxt));
    RW_TCK(cudaMalloc((void **)&dnt, 4));
    RW_TCK(cudaMalloc((void **)&dperm, 4 * A));
    RW_TCK(cudaMalloc((void **)&dinv, 4 * A));
    RW_TCK(cudaMalloc((void **)&did, 4 * A));
    RW_TCK(cudaMalloc((void **)&dwt, 4 * A));
    RW_TCK(cudaMalloc((void **)&dy, 4 * n * E));
    int32_t *off = malloc(4 * (E + 1)), *roff = malloc(4 * (E + 1)), *tiles = malloc(8 * maxt),
            *rtiles = malloc(8 * maxt), *perm = malloc(4 * A), *rperm = malloc(4 * A),
            *inv = malloc(4 * A), *rinv = malloc(4 * A), *ids = malloc(4 * A);
    float *wt = malloc(4 * A);
    rw_err err = {0};
    for (int tn = 16; tn <= 32; tn += 16) {
        const rw_moe_sort_dest sd = {doff, dtiles, dnt, dperm, dinv, tn};
        RW_ASSERT_OK(rw_k_router_topk_sort(dx, dw, n, E, H, k, true, dy, did, dwt, dcnt, nc, &sd,
                                           NULL, &err),
                     &err);
        rw_tdev_get(ids, did, 4 * A);
        rw_tdev_get(wt, dwt, 4 * A);
        rw_assert_bytes_equal(ids, rids, 4 * A, "router_topk_sort: ids vs rw_k_router_topk");
        rw_assert_bytes_equal(wt, rwt, 4 * A, "router_topk_sort: weights vs rw_k_router_topk");
        const int32_t rnt = sort_ref(ids, A, (int)E, tn, roff, rtiles, rperm, rinv);
        int32_t nt = -1;
        rw_tdev_get(&nt, dnt, 4);
        rw_tdev_get(off, doff, 4 * (E + 1));
        rw_tdev_get(tiles, dtiles, 8 * maxt);
        rw_tdev_get(perm, dperm, 4 * A);
        rw_tdev_get(inv, dinv, 4 * A);
        assert_int_equal(nt, rnt);
        rw_assert_bytes_equal(off, roff, 4 * (E + 1), "router_topk_sort: off vs sort_ref");
        rw_assert_bytes_equal(tiles, rtiles, 8 * (size_t)rnt, "router_topk_sort: tiles");
        rw_assert_bytes_equal(perm, rperm, 4 * (size_t)roff[E], "router_topk_sort: perm");
        rw_assert_bytes_equal(inv, rinv, 4 * A, "router_topk_sort: inv vs sort_ref");
        assert_counters_zero(dcnt, nc, "router_topk_sort");
    }
    const rw_moe_sort_dest sd = {doff, dtiles, dnt, dperm, dinv, 16};
    assert_int_equal(rw_k_router_topk_sort(dx, dw, RW_K_ROUTER_GROUP + 1, E, H, k, true, dy, did,
                                           dwt, dcnt, nc, &sd, NULL, &err),
                     RW_E_INVALID_ARG);
    assert_non_null(strstr(err.msg, "sort"));
    cudaFree(doff);
    cudaFree(dtiles);
    cudaFree(dnt);
    cudaFree(dperm);
    cudaFree(dinv);
    cudaFree(did);
    cudaFree(dwt);
    cudaFree(dy);
    free(off);
    free(roff);
    free(tiles);
    free(rtiles);
    free(perm);
    free(rperm);
    free(inv);
    free(rinv);
    free(ids);
    free(wt);
}

/* The router with the routing in the same launch (rw_k_router_topk), on the logits gy that
 * rw_k_router computed: the same logits bits, the ids and weights of rw_moe_route_cuda on them
 * bit for bit (and rw_moe_route_ref's ids), with and without renormalisation, twice over the same
 * counters, which every call leaves zero; too few counters are refused. */
static void router_topk_case(const float *dx, const uint16_t *dw, const float *gy, int64_t n,
                             int64_t E, int64_t H, int k) {
    const int64_t nc = rw_k_router_counters(n);
    float *dy, *dwt, *dwt2, *fy = malloc(4 * n * E), *wt = malloc(4 * n * k),
                          *wt2 = malloc(4 * n * k), *rwt = malloc(4 * n * k);
    int32_t *did, *did2, *dcnt, *ids = malloc(4 * n * k), *ids2 = malloc(4 * n * k),
                                *rids = malloc(4 * n * k);
    RW_TCK(cudaMalloc((void **)&dy, 4 * n * E));
    RW_TCK(cudaMalloc((void **)&dwt, 4 * n * k));
    RW_TCK(cudaMalloc((void **)&dwt2, 4 * n * k));
    RW_TCK(cudaMalloc((void **)&did, 4 * n * k));
    RW_TCK(cudaMalloc((void **)&did2, 4 * n * k));
    RW_TCK(cudaMalloc((void **)&dcnt, 4 * nc));
    RW_TCK(cudaMemset(dcnt, 0, 4 * nc));
    rw_err err = {0};
    for (int rep = 0; rep < 4; rep++) {
        const bool renorm = rep & 1;
        RW_ASSERT_OK(rw_k_router_topk(dx, dw, n, E, H, k, renorm, dy, did, dwt, dcnt, nc, NULL,
                                      &err),
                     &err);
        RW_ASSERT_OK(rw_moe_route_cuda(dy, n, (int)E, k, renorm, did2, dwt2, NULL,
                                       &err),
                     &err);
        rw_tdev_get(fy, dy, 4 * n * E);
        rw_tdev_get(ids, did, 4 * n * k);
        rw_tdev_get(wt, dwt, 4 * n * k);
        rw_tdev_get(ids2, did2, 4 * n * k);
        rw_tdev_get(wt2, dwt2, 4 * n * k);
        rw_assert_bytes_equal(fy, gy, 4 * n * E, "router_topk: logits vs rw_k_router");
        rw_assert_bytes_equal(ids, ids2, 4 * n * k, "router_topk: ids vs rw_moe_route_cuda");
        rw_assert_bytes_equal(wt, wt2, 4 * n * k, "router_topk: weights vs rw_moe_route_cuda");
        rw_moe_route_ref(gy, n, (int)E, k, renorm, rids, rwt);
        rw_assert_bytes_equal(ids, rids, 4 * n * k, "router_topk: ids vs rw_moe_route_ref");
        assert_counters_zero(dcnt, nc, "router_topk");
    }
    /* (the last rep renormalised: ids and wt are its result) */
    if (n <= RW_K_ROUTER_GROUP) router_sort_case(dx, dw, n, E, H, k, ids, wt, dcnt, nc);
    assert_int_equal(
        rw_k_router_topk(dx, dw, n, E, H, k, true, dy, did, dwt, dcnt, nc - 1, NULL, &err),
        RW_E_INVALID_ARG);
    assert_non_null(strstr(err.msg, "counters"));
    cudaFree(dy);
    cudaFree(dwt);
    cudaFree(dwt2);
    cudaFree(did);
    cudaFree(did2);
    cudaFree(dcnt);
    free(fy);
    free(wt);
    free(wt2);
    free(rwt);
    free(ids);
    free(ids2);
    free(rids);
}

/* The post-attention norm in the router's launch (rw_k_add_rmsnorm_router_topk_sort) against
 * rw_k_add_rmsnorm followed by rw_k_router_topk_sort (both compared with their references
 * above): the updated x, the bf16 pair, the logits, ids, weights and the whole sort, byte for
 * byte, for a one-group step of n tokens; the counters left zero; rows too wide refused. */
static void router_norm_case(int64_t n, int64_t E, int64_t H, int k, uint64_t seed) {
    const float eps = 1e-6f;
    const int64_t A = n * k, maxt = A + E, nc = rw_k_router_counters(n);
    float *x = malloc(4 * n * H), *add = malloc(4 * n * H);
    uint16_t *nw = malloc(2 * H), *w = malloc(2 * E * H);
    rw_test_fill_f32(x, (size_t)(n * H), seed, 1.0f);
    rw_test_fill_f32(add, (size_t)(n * H), seed + 1, 0.5f);
    rw_test_fill_bf16(nw, (size_t)H, seed + 2, 1.0f);
    rw_test_fill_bf16(w, (size_t)(E * H), seed + 3, 0.05f);
    float *dadd = rw_tdev_put(add, 4 * n * H), *dx[2], *dh32, *dy[2], *dwt[2];
    uint16_t *dnw = rw_tdev_put(nw, 2 * H), *dw = rw_tdev_put(w, 2 * E * H), *dhi[2], *dlo[2];
    int32_t *did[2], *doff[2], *dtiles[2], *dnt[2], *dperm[2], *dinv[2], *dcnt;
    RW_TCK(cudaMalloc((void **)&dh32, 4 * n * H));
    RW_TCK(cudaMalloc((void **)&dcnt, 4 * nc));
    RW_TCK(cudaMemset(dcnt, 0, 4 * nc));
    for (int v = 0; v < 2; v++) {
        dx[v] = rw_tdev_put(x, 4 * n * H);
        RW_TCK(cudaMalloc((void **)&dhi[v], 2 * n * H));
        RW_TCK(cudaMalloc((void **)&dlo[v], 2 * n * H));
        RW_TCK(cudaMalloc((void **)&dy[v], 4 * n * E));
        RW_TCK(cudaMalloc((void **)&dwt[v], 4 * A));
        RW_TCK(cudaMalloc((void **)&did[v], 4 * A));
        RW_TCK(cudaMalloc((void **)&doff[v], 4 * (E + 1)));
        RW_TCK(cudaMalloc((void **)&dtiles[v], 8 * maxt));
        RW_TCK(cudaMalloc((void **)&dnt[v], 4));
        RW_TCK(cudaMalloc((void **)&dperm[v], 4 * A));
        RW_TCK(cudaMalloc((void **)&dinv[v], 4 * A));
        RW_TCK(cudaMemset(dtiles[v], 0, 8 * maxt));
        RW_TCK(cudaMemset(dperm[v], 0, 4 * A));
    }
    rw_err err = {0};
    const rw_moe_sort_dest s0 = {doff[0], dtiles[0], dnt[0], dperm[0], dinv[0], 16};
    const rw_moe_sort_dest s1 = {doff[1], dtiles[1], dnt[1], dperm[1], dinv[1], 16};
    RW_ASSERT_OK(rw_k_add_rmsnorm(dx[0], dadd, dnw, n, H, eps, dhi[0], dlo[0], dh32, NULL, &err),
                 &err);
    RW_ASSERT_OK(rw_k_router_topk_sort(dh32, dw, n, E, H, k, true, dy[0], did[0], dwt[0], dcnt, nc,
                                       &s0, NULL, &err),
                 &err);
    RW_ASSERT_OK(rw_k_add_rmsnorm_router_topk_sort(dx[1], dadd, dnw, eps, dhi[1], dlo[1], dw, n, E,
                                                   H, k, true, dy[1], did[1], dwt[1], dcnt, nc, &s1,
                                                   NULL, &err),
                 &err);
    char what[96];
    const struct {
        void **d;
        size_t bytes;
        const char *name;
    } outs[] = {{(void **)dx, 4 * n * H, "x"},        {(void **)dhi, 2 * n * H, "hi"},
                {(void **)dlo, 2 * n * H, "lo"},      {(void **)dy, 4 * n * E, "logits"},
                {(void **)did, 4 * A, "ids"},         {(void **)dwt, 4 * A, "weights"},
                {(void **)doff, 4 * (E + 1), "off"},  {(void **)dnt, 4, "ntiles"},
                {(void **)dtiles, 8 * maxt, "tiles"}, {(void **)dperm, 4 * A, "perm"},
                {(void **)dinv, 4 * A, "inv"}};
    for (size_t o = 0; o < sizeof outs / sizeof outs[0]; o++) {
        uint8_t *a = malloc(outs[o].bytes), *b = malloc(outs[o].bytes);
        rw_tdev_get(a, outs[o].d[0], outs[o].bytes);
        rw_tdev_get(b, outs[o].d[1], outs[o].bytes);
        snprintf(what, sizeof what, "router with the norm, n %lld H %lld: %s", (long long)n,
                 (long long)H, outs[o].name);
        rw_assert_bytes_equal(b, a, outs[o].bytes, what);
        free(a);
        free(b);
    }
    assert_counters_zero(dcnt, nc, "router with the norm");
    assert_int_equal(rw_k_add_rmsnorm_router_topk_sort(dx[1], dadd, dnw, eps, dhi[1], dlo[1], dw, n,
                                                       E, RW_K_ROUTER_NORM_MAX_H + 8, k, true,
                                                       dy[1], did[1], dwt[1], dcnt, nc, &s1, NULL,
                                                       &err),
                     RW_E_UNSUPPORTED);
    assert_non_null(strstr(err.msg, "norm"));
    for (int v = 0; v < 2; v++) {
        void *f[] = {dx[v],   dhi[v],    dlo[v], dy[v],    dwt[v], did[v],
                     doff[v], dtiles[v], dnt[v], dperm[v], dinv[v]};
        for (size_t i = 0; i < sizeof f / sizeof f[0]; i++)
            cudaFree(f[i]);
    }
    cudaFree(dadd);
    cudaFree(dh32);
    cudaFree(dcnt);
    cudaFree(dnw);
    cudaFree(dw);
    free(x);
    free(add);
    free(nw);
    free(w);
}

/* Router logits: decode-sized and prefill-sized batches, the fixture's shape; a token's logits
 * are the same bits alone as in a batch. */
static void router_case(int64_t n, int64_t E, int64_t H, int k, uint64_t seed) {
    float *x = malloc(4 * n * H), *y = malloc(4 * n * E), *gy = malloc(4 * n * E);
    float *one = malloc(4 * E);
    uint16_t *w = malloc(2 * E * H);
    rw_test_fill_f32(x, (size_t)(n * H), seed, 1.0f);
    rw_test_fill_bf16(w, (size_t)(E * H), seed + 1, 0.05f);
    rw_k_router_ref(x, w, n, E, H, y);
    float *dx = rw_tdev_put(x, 4 * n * H), *dy;
    uint16_t *dw = rw_tdev_put(w, 2 * E * H);
    RW_TCK(cudaMalloc((void **)&dy, 4 * n * E));
    rw_err err = {0};
    RW_ASSERT_OK(rw_k_router(dx, dw, n, E, H, dy, NULL, &err), &err);
    rw_tdev_get(gy, dy, 4 * n * E);
    char what[64];
    snprintf(what, sizeof what, "router n %lld E %lld H %lld", (long long)n, (long long)E,
             (long long)H);
    rw_assert_close(gy, y, (size_t)(n * E), RW_TOL_F32_DOT, what);
    for (int64_t t = 0; t < n; t += n / 3 + 1) {
        RW_ASSERT_OK(rw_k_router(dx + t * H, dw, 1, E, H, dy, NULL, &err), &err);
        rw_tdev_get(one, dy, 4 * E);
        rw_assert_bytes_equal(one, gy + t * E, 4 * E, "router: a token alone vs in the batch");
    }
    router_topk_case(dx, dw, gy, n, E, H, k);
    cudaFree(dx);
    cudaFree(dy);
    cudaFree(dw);
    free(x);
    free(y);
    free(gy);
    free(one);
    free(w);
}

static void test_router(void **state) {
    (void)state;
    router_case(77, 128, 2048, 8, 14);
    router_case(1, 128, 2048, 8, 16);
    router_case(8, 128, 2048, 8, 17);
    router_case(256, 128, 2048, 8, 19); /* the largest decode tiles */
    router_case(13, 8, 128, 2, 18);
    router_case(300, 60, 512, 4, 20); /* prefill tiles against decode tiles (alone) */
    router_case(9, 200, 256, 8, 22);  /* 8 logits per lane in the routing */
    router_case(20, 520, 256, 16, 24); /* 32 */
    router_case(8, 520, 256, 32, 26);  /* a one-group sort of 256 assignments: 8 placement warps */
    router_case(5, 60, 512, 4, 28);    /* a one-group sort over a partial expert tile */
    router_norm_case(1, 128, 2048, 8, 30); /* the 30B shape's batch-1 step */
    router_norm_case(8, 128, 2048, 8, 32); /* a whole token group */
    router_norm_case(3, 60, 1000, 4, 34);  /* rows not a multiple of the CTA's threads */
    router_norm_case(5, 520, 256, 32, 36);
}

/* The sampling kernel on n requests p over logits l [rows, V]: the results into got, after
 * checking that a second run gives the same bytes. */
static void sample_gpu(const float *l, int64_t rows, int64_t n, int64_t V,
                       const rw_k_sample_param *p, rw_k_sample_out *got, const char *what) {
    rw_k_sample_out *again = calloc((size_t)n, sizeof *again);
    float *dl = rw_tdev_put(l, 4 * rows * V);
    rw_k_sample_param *dp = rw_tdev_put(p, sizeof *p * n);
    rw_k_sample_out *dout;
    RW_TCK(cudaMalloc((void **)&dout, sizeof *dout * n));
    const size_t wb = rw_k_sample_ws_bytes(n, V);
    void *ws;
    RW_TCK(cudaMalloc(&ws, wb));
    rw_err err = {0};
    /* a workspace too small is refused, naming the size it needs */
    const rw_status bad = rw_k_sample(dl, n, V, dp, dout, ws, wb - 1, NULL, &err);
    assert_int_equal(bad, RW_E_INVALID_ARG);
    assert_non_null(strstr(err.msg, "workspace"));
    RW_ASSERT_OK(rw_k_sample(dl, n, V, dp, dout, ws, wb, NULL, &err), &err);
    rw_tdev_get(got, dout, sizeof *got * n);
    RW_ASSERT_OK(rw_k_sample(dl, n, V, dp, dout, ws, wb, NULL, &err), &err);
    rw_tdev_get(again, dout, sizeof *again * n);
    rw_assert_bytes_equal(got, again, sizeof *got * n, what);
    /* each request alone (its row first in a batch of one): the same bytes as in the batch */
    for (int64_t i = 0; i < n; i += 37) {
        rw_k_sample_out one;
        RW_ASSERT_OK(rw_k_sample(dl, 1, V, dp + i, dout, ws, wb, NULL, &err), &err);
        rw_tdev_get(&one, dout, sizeof one);
        const int tn = p[i].top_n < 20 ? p[i].top_n : 20;
        if (one.token != got[i].token || memcmp(&one.logprob, &got[i].logprob, 4) ||
            memcmp(one.top_ids, got[i].top_ids, 4 * (size_t)tn) ||
            memcmp(one.top_lps, got[i].top_lps, 4 * (size_t)tn))
            fail_msg("%s: request %lld alone gives token %d (%a), batched %d (%a)", what,
                     (long long)i, one.token, one.logprob, got[i].token, got[i].logprob);
    }
    cudaFree(dl);
    cudaFree(dp);
    cudaFree(dout);
    cudaFree(ws);
    free(again);
}

/* n requests over a vocabulary of V: draws, greedy rows, top-k and top-p limits, top-n lists,
 * against the reference. */
static void sample_case(int64_t n, int64_t V) {
    float *l = malloc(4 * n * V);
    rw_test_fill_f32(l, (size_t)(n * V), 16, 3.0f);
    rw_k_sample_param *p = calloc((size_t)n, sizeof *p);
    for (int i = 0; i < n; i++) {
        p[i].row = (int32_t)(n - 1 - i); /* rows in another order than requests */
        p[i].forced = -1;                /* draws (given tokens: test_sample_processed) */
        p[i].seed = 1000 + (uint64_t)i;
        p[i].position = 17 + i;
        p[i].top_p = 1.0f;
        p[i].top_n = i % 5 == 0 ? 20 : i % 7;
        switch (i % 4) {
        case 0: break; /* greedy */
        case 1: p[i].temperature = 1.0f; break;
        case 2:
            p[i].temperature = 0.7f;
            p[i].top_k = 50;
            break;
        case 3:
            p[i].temperature = 1.2f;
            p[i].top_p = 0.8f;
            p[i].top_k = i % 8 == 3 ? 0 : 500;
            break;
        }
    }
    rw_k_sample_out *ref = calloc((size_t)n, sizeof *ref), *got = calloc((size_t)n, sizeof *got);
    rw_k_sample_ref(l, n, V, p, ref);
    sample_gpu(l, n, n, V, p, got, "sampling rerun");
    int same = 0, sampled = 0;
    for (int i = 0; i < n; i++) {
        const float *row = l + (int64_t)p[i].row * V;
        if (p[i].temperature == 0.0f) {
            assert_int_equal(got[i].token, ref[i].token);
        } else {
            sampled++;
            same += got[i].token == ref[i].token;
        }
        assert_true(got[i].token >= 0 && got[i].token < V);
        /* logprob = raw logit - logsumexp, the normaliser in double here (the reference sums
         * exp in fp32 in index order: over 151,936 ids that alone drifts past 1e-4) */
        double mx = row[0], se = 0.0;
        for (int64_t v = 1; v < V; v++)
            mx = row[v] > mx ? row[v] : mx;
        for (int64_t v = 0; v < V; v++)
            se += exp(row[v] - mx);
        const double lse = mx + log(se);
        if (!(fabs(got[i].logprob - (row[got[i].token] - lse)) < 1e-4))
            fail_msg("V %lld request %d: logprob %.7g, logit - lse %.7g (reference %.7g)",
                     (long long)V, i, got[i].logprob, row[got[i].token] - lse, ref[i].logprob);
        for (int j = 0; j < p[i].top_n; j++) {
            assert_int_equal(got[i].top_ids[j], ref[i].top_ids[j]);
            assert_true(fabs(got[i].top_lps[j] - (row[got[i].top_ids[j]] - lse)) < 1e-4);
        }
        if (p[i].top_k > 0) { /* the token is inside the top-k */
            int above = 0;
            for (int64_t v = 0; v < V; v++)
                above += row[v] > row[got[i].token];
            assert_true(above < p[i].top_k);
        }
    }
    print_message("V %lld: sampled rows: %d of %d draw the reference's token\n", (long long)V, same,
                  sampled);
    /* only exp() rounding differs from the reference: boundary cases are rare */
    assert_true(same >= sampled - 2);
    free(l);
    free(p);
    free(ref);
    free(got);
}

/* A vocabulary of 2 chunks (the second of 907 ids) and the 30B-A3B one (38 chunks). */
static void test_sample(void **state) {
    (void)state;
    sample_case(240, 5003);
    sample_case(24, 151936);
}

/* More requests than one launch of the chunk passes takes (65535): requests i and i + 100 sample
 * the same row with the same parameters, so every request must equal request i % 100, across
 * the launches' boundary; and those match the reference. */
static void test_sample_many(void **state) {
    (void)state;
    const int64_t rows = 100, n = 65535 + 300, V = 5003;
    float *l = malloc(4 * rows * V);
    rw_test_fill_f32(l, (size_t)(rows * V), 41, 3.0f);
    rw_k_sample_param *p = calloc((size_t)n, sizeof *p);
    for (int64_t i = 0; i < n; i++) {
        const int r = (int)(i % rows);
        p[i].row = r;
        p[i].forced = -1;
        p[i].seed = 7000 + (uint64_t)r;
        p[i].position = 5 + r;
        p[i].top_p = 1.0f;
        p[i].top_n = r % 3;
        p[i].temperature = r % 2 ? 1.0f : 0.0f;
    }
    rw_k_sample_out *got = calloc((size_t)n, sizeof *got), *ref = calloc((size_t)rows, sizeof *ref);
    sample_gpu(l, rows, n, V, p, got, "many requests rerun");
    rw_k_sample_ref(l, rows, V, p, ref);
    for (int64_t i = 0; i < n; i++) {
        const rw_k_sample_out *a = &got[i], *b = &got[i % rows];
        const int tn = p[i].top_n;
        if (a->token != b->token || memcmp(&a->logprob, &b->logprob, 4) ||
            memcmp(a->top_ids, b->top_ids, 4 * (size_t)tn))
            fail_msg("request %lld: token %d (%a), request %lld: %d (%a)", (long long)i, a->token,
                     a->logprob, (long long)(i % rows), b->token, b->logprob);
    }
    int same = 0;
    for (int64_t r = 0; r < rows; r++) {
        if (p[r].temperature == 0.0f) assert_int_equal(got[r].token, ref[r].token);
        same += got[r].token == ref[r].token;
    }
    assert_true(same >= rows - 2);
    free(l);
    free(p);
    free(got);
    free(ref);
}

/* Processed logprobs (mode 1) and given tokens (forced >= 0) against the reference: given tokens
 * exactly; logprobs and top-n within 1e-4 (the kernel sums the kept mass in a fixed tree, the
 * reference in index order), -inf exactly where the reference has it; greedy rows 0 / -inf;
 * a drawn token's processed logprob equals the one of the same token given; bit-identical
 * reruns. */
static void test_sample_processed(void **state) {
    (void)state;
    const int64_t n = 200, V = 4099;
    float *l = malloc(4 * n * V);
    rw_test_fill_f32(l, (size_t)(n * V), 23, 2.5f);
    rw_k_sample_param *p = calloc((size_t)n, sizeof *p);
    for (int i = 0; i < n; i++) {
        p[i].row = (int32_t)((i * 7) % n);
        p[i].seed = 500 + (uint64_t)i;
        p[i].position = 3 + i;
        p[i].top_p = 1.0f;
        p[i].top_n = i % 3 ? 6 : 0;
        p[i].mode = i % 5 == 4 ? 0 : 1;          /* mostly processed, some raw given tokens */
        p[i].forced = i % 2 ? (int32_t)((i * 131) % V) : -1;
        switch (i % 4) {
        case 0: break; /* greedy */
        case 1: p[i].temperature = 0.9f; break;
        case 2:
            p[i].temperature = 1.1f;
            p[i].top_k = 60;
            break;
        case 3:
            p[i].temperature = 0.8f;
            p[i].top_p = 0.85f;
            p[i].top_k = i % 8 == 3 ? 0 : 300;
            break;
        }
    }
    rw_k_sample_out *ref = calloc((size_t)n, sizeof *ref), *got = calloc((size_t)n, sizeof *got),
                    *again = calloc((size_t)n, sizeof *again);
    rw_k_sample_ref(l, n, V, p, ref);
    sample_gpu(l, n, n, V, p, got, "processed sampling rerun");
    int inf = 0, same = 0, drawn = 0;
    for (int i = 0; i < n; i++) {
        if (p[i].forced >= 0) assert_int_equal(got[i].token, p[i].forced);
        if (p[i].temperature == 0.0f) assert_int_equal(got[i].token, ref[i].token);
        const bool tok_same = got[i].token == ref[i].token;
        if (p[i].forced < 0 && p[i].temperature > 0.0f) {
            drawn++;
            same += tok_same;
        }
        if (tok_same) {
            if (isinf(ref[i].logprob)) {
                assert_true(isinf(got[i].logprob) && got[i].logprob < 0);
                inf++;
            } else if (!(fabsf(got[i].logprob - ref[i].logprob) < 1e-4f)) {
                fail_msg("row %d: logprob %.7g, reference %.7g (mode %d, forced %d)", i,
                         got[i].logprob, ref[i].logprob, p[i].mode, p[i].forced);
            }
        }
        for (int j = 0; j < p[i].top_n; j++) {
            assert_int_equal(got[i].top_ids[j], ref[i].top_ids[j]);
            if (isinf(ref[i].top_lps[j]))
                assert_true(isinf(got[i].top_lps[j]) && got[i].top_lps[j] < 0);
            else
                assert_true(fabsf(got[i].top_lps[j] - ref[i].top_lps[j]) < 1e-4f);
        }
        if (p[i].mode == 1 && p[i].temperature == 0.0f && p[i].forced < 0)
            assert_true(got[i].logprob == 0.0f);
    }
    /* a drawn token given back: the same processed logprob bits */
    for (int i = 0; i < n; i++)
        if (p[i].forced < 0) p[i].forced = got[i].token;
    sample_gpu(l, n, n, V, p, again, "given tokens rerun");
    for (int i = 0; i < n; i++)
        rw_assert_bytes_equal(&again[i].logprob, &got[i].logprob, 4, "drawn vs given logprob");
    print_message("processed / given: %d of %d draws equal the reference's token, %d -inf\n",
                  same, drawn, inf);
    assert_true(same >= drawn - 2);
    assert_true(inf > 0);
    free(l);
    free(p);
    free(ref);
    free(got);
    free(again);
}

/* Temperatures too small to invert (1/T or max logit / T not finite in float) sample greedily on
 * the device as in the reference: the argmax of each row, whatever the seed, top-k or top-p
 * (before, every mass was NaN and the draw returned the last id of the vocabulary). */
static void test_sample_tiny_temperature(void **state) {
    (void)state;
    static const float temps[] = {1.4e-45f, 1e-42f, 1e-40f, 1e-39f, 2.9e-39f, 3e-39f, 1e-38f};
    const int nt = (int)(sizeof temps / sizeof *temps);
    const int64_t n = 4 * nt, V = 5003;
    float *l = malloc(4 * n * V);
    rw_test_fill_f32(l, (size_t)(n * V), 23, 40.0f); /* large logits: max / T overflows */
    rw_k_sample_param *p = calloc((size_t)n, sizeof *p);
    for (int i = 0; i < n; i++) {
        p[i].row = i;
        p[i].seed = 77 + (uint64_t)i;
        p[i].position = i;
        p[i].temperature = temps[i % nt];
        p[i].top_p = i / nt == 1 ? 0.5f : 1.0f;
        p[i].top_k = i / nt == 2 ? 40 : 0;
        p[i].top_n = 3;
        p[i].forced = -1; /* draw (not a given token) */
    }
    rw_k_sample_out *ref = calloc((size_t)n, sizeof *ref), *got = calloc((size_t)n, sizeof *got);
    rw_k_sample_ref(l, n, V, p, ref);
    sample_gpu(l, n, n, V, p, got, "tiny temperature rerun");
    for (int i = 0; i < n; i++) {
        const float *row = l + (int64_t)i * V;
        int32_t arg = 0;
        for (int64_t v = 1; v < V; v++)
            if (row[v] > row[arg]) arg = (int32_t)v;
        if (got[i].token != arg || ref[i].token != arg)
            fail_msg("row %d (T %g): device %d, reference %d, argmax %d", i,
                     (double)p[i].temperature, got[i].token, ref[i].token, arg);
    }
    free(l);
    free(p);
    free(ref);
    free(got);
}

int main(void) {
    rw_test_require_gpu(1);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_embed_gather), cmocka_unit_test(test_norms), cmocka_unit_test(test_combine_norm),
        cmocka_unit_test(test_rope_kv),      cmocka_unit_test(test_attention),
        cmocka_unit_test(test_attention_invariance),
        cmocka_unit_test(test_router),       cmocka_unit_test(test_sample),
        cmocka_unit_test(test_sample_many),
        cmocka_unit_test(test_sample_processed),
        cmocka_unit_test(test_sample_tiny_temperature),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
