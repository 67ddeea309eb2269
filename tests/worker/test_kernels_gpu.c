/* test_kernels_gpu.c - the small kernels of the CUDA backend (worker/kernels/ vocab and
 * norm_rope) against their plain-C references on random inputs (gpu suite): embedding and logits
 * gather byte for byte; the norms (hi + lo pairs), the combine + norm, RoPE and the KV write within
 * named tolerances. Attention, the router and sampling have their own files
 * (test_attention_gpu.c, test_router_gpu.c, test_sample_gpu.c), the GEMMs test_gemm_gpu.c. */
#include <math.h>

#include "rw_test.h"
#include "rw_test_cuda.h"
#include "kernels/norm_rope.h"
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
        /* other widths: the rotation prepared before the launch wait (64, 96, 256: every
         * ROPE_PRE slot used at 256) and the wider heads' loop (512) */
        rope_case(7, 4, 2, 64, pairs);
        rope_case(9, 2, 1, 256, pairs);
        rope_case(6, 3, 1, 96, pairs);
        rope_case(3, 2, 1, 512, pairs);
    }
}

int main(void) {
    rw_test_require_gpu(1);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_embed_gather),
        cmocka_unit_test(test_norms),
        cmocka_unit_test(test_combine_norm),
        cmocka_unit_test(test_rope_kv),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
