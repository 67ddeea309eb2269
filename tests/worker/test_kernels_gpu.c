/* test_kernels_gpu.c - every kernel of the CUDA backend (worker/kernels.h) against its plain-C
 * reference on random inputs (gpu suite): embedding and logits gather byte for byte; norms, RoPE
 * and the KV write, attention (prefill tiles, decode, key splits), router logits within named
 * tolerances; sampling: greedy, logprobs and top-n exactly or within 1e-5, sampled tokens equal
 * to the reference's for nearly every row, and bit-identical reruns. */
#include <cuda_runtime_api.h>
#include <math.h>

#include "rw_test.h"
#include "kernels.h"
#include "rw_worker.h"

/* bf16 outputs computed in fp32 with a different summation order: one bf16 rounding step. */
#define TOL_BF16_REL (1.0 / 128)
#define TOL_F32_REL 1e-5

#define CK(x)                                                                                      \
    do {                                                                                           \
        cudaError_t e_ = (x);                                                                      \
        if (e_ != cudaSuccess) fail_msg("%s: %s", #x, cudaGetErrorString(e_));                     \
    } while (0)

static void *dput(const void *h, size_t n) {
    void *d = NULL;
    CK(cudaMalloc(&d, n ? n : 16));
    if (n) CK(cudaMemcpy(d, h, n, cudaMemcpyHostToDevice));
    return d;
}
static void dget(void *h, const void *d, size_t n) {
    CK(cudaDeviceSynchronize());
    CK(cudaMemcpy(h, d, n, cudaMemcpyDeviceToHost));
}
static void fill_f32(float *p, size_t n, uint64_t seed, float std) {
    rw_rng r;
    rw_rng_seed(&r, seed);
    for (size_t i = 0; i < n; i++)
        p[i] = std * rw_rng_normal(&r);
}

/* max |a - b| / (|b| + floor) over bf16 arrays; fails above tol */
static void near_bf16(const uint16_t *a, const uint16_t *b, size_t n, double tol, double floor,
                      const char *what) {
    for (size_t i = 0; i < n; i++) {
        const double x = rw_bf16_to_f32(a[i]), y = rw_bf16_to_f32(b[i]);
        if (!(fabs(x - y) <= tol * (fabs(y) + floor)))
            fail_msg("%s: element %zu: %g vs reference %g", what, i, x, y);
    }
}
static void near_f32(const float *a, const float *b, size_t n, double tol, double floor,
                     const char *what) {
    for (size_t i = 0; i < n; i++)
        if (!(fabs(a[i] - b[i]) <= tol * (fabs(b[i]) + floor)))
            fail_msg("%s: element %zu: %g vs reference %g", what, i, a[i], b[i]);
}

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
    int32_t *dt = dput(tok, sizeof tok);
    uint16_t *de = dput(emb, 2 * vl * H);
    float *dx;
    CK(cudaMalloc((void **)&dx, 4 * n * H));
    rw_err err = {0};
    RW_ASSERT_OK(rw_k_embed(dt, n, de, vb, vl, H, dx, NULL, &err), &err);
    dget(gx, dx, 4 * n * H);
    rw_assert_bytes_equal(gx, x, 4 * n * H, "embed");
    /* logits gather: [T=3, rows 5, vl 40] -> [5, 100] */
    float g[3 * 5 * 40], o[5 * 100], go[5 * 100];
    fill_f32(g, 600, 2, 1.0f);
    rw_k_logits_gather_ref(g, 3, 5, 40, 100, o);
    float *dg = dput(g, sizeof g), *dgo;
    CK(cudaMalloc((void **)&dgo, sizeof go));
    RW_ASSERT_OK(rw_k_logits_gather(dg, 3, 5, 40, 100, dgo, NULL, &err), &err);
    dget(go, dgo, sizeof go);
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
    float *of = malloc(4 * n * H), *gof = malloc(4 * n * H);
    fill_f32(x, (size_t)(n * H), 3, 1.0f);
    fill_f32(y, (size_t)(n * H), 4, 0.5f);
    rw_rng r;
    rw_rng_seed(&r, 5);
    for (int i = 0; i < H; i++)
        w[i] = rw_f32_to_bf16(1.0f + 0.1f * rw_rng_normal(&r));
    float *dx = dput(x, 4 * n * H), *dy = dput(y, 4 * n * H), *dof;
    uint16_t *dw = dput(w, 2 * H), *dob;
    CK(cudaMalloc((void **)&dob, 2 * n * H));
    CK(cudaMalloc((void **)&dof, 4 * n * H));
    rw_err err = {0};
    memcpy(x2, x, 4 * n * H);
    rw_k_add_rmsnorm_ref(x2, y, w, n, H, 1e-6f, ob, of);
    RW_ASSERT_OK(rw_k_add_rmsnorm(dx, dy, dw, n, H, 1e-6f, dob, dof, NULL, &err), &err);
    float *gx = malloc(4 * n * H);
    dget(gx, dx, 4 * n * H);
    rw_assert_bytes_equal(gx, x2, 4 * n * H, "residual add");
    dget(gob, dob, 2 * n * H);
    dget(gof, dof, 4 * n * H);
    near_bf16(gob, ob, (size_t)(n * H), TOL_BF16_REL, 1e-3, "add_rmsnorm bf16");
    near_f32(gof, of, (size_t)(n * H), TOL_F32_REL, 1e-3, "add_rmsnorm f32");
    /* selected rows, with the add */
    int32_t rows[4] = {7, 0, 32, 15};
    memcpy(x2, x, 4 * n * H);
    rw_k_rmsnorm_rows_ref(x2, y, rows, 4, w, H, 1e-6f, ob);
    CK(cudaMemcpy(dx, x, 4 * n * H, cudaMemcpyHostToDevice));
    int32_t *dr = dput(rows, sizeof rows);
    RW_ASSERT_OK(rw_k_rmsnorm_rows(dx, dy, dr, 4, dw, H, 1e-6f, dob, NULL, &err), &err);
    dget(gob, dob, 2 * 4 * H);
    near_bf16(gob, ob, (size_t)(4 * H), TOL_BF16_REL, 1e-3, "rmsnorm rows");
    cudaFree(dx);
    cudaFree(dy);
    cudaFree(dw);
    cudaFree(dob);
    cudaFree(dof);
    cudaFree(dr);
    free(x);
    free(y);
    free(x2);
    free(w);
    free(ob);
    free(gob);
    free(of);
    free(gof);
    free(gx);
}

/* q, k, v as one fused [n, q | k | v] GEMM output (row stride (nh + 2 nkv) hd). */
static void rope_case(int n, int nh, int nkv, int hd) {
    const int bs = 16, nblocks = 6;
    const int64_t ld = (int64_t)(nh + 2 * nkv) * hd;
    const size_t qe = (size_t)n * nh * hd, fe = (size_t)n * ld;
    const size_t ce = (size_t)nblocks * nkv * bs * hd;
    float *qkv = malloc(4 * fe), inv[512];
    fill_f32(qkv, fe, 6, 1.0f);
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
    uint16_t *qo = malloc(2 * qe), *gqo = malloc(2 * qe);
    uint16_t *kc = malloc(2 * ce), *vc = malloc(2 * ce), *gkc = malloc(2 * ce),
             *gvc = malloc(2 * ce);
    for (size_t i = 0; i < ce; i++)
        kc[i] = vc[i] = 0x3f80; /* 1.0: untouched slots stay */
    float *dqkv = dput(qkv, 4 * fe), *di = dput(inv, sizeof(float) * (size_t)(hd / 2));
    uint16_t *dqn = dput(qn, 2 * (size_t)hd), *dkn = dput(kn, 2 * (size_t)hd), *dqo;
    uint16_t *dkc = dput(kc, 2 * ce), *dvc = dput(vc, 2 * ce);
    int32_t *dp = dput(pos, sizeof(int32_t) * (size_t)n),
            *ds = dput(slot, sizeof(int32_t) * (size_t)n);
    CK(cudaMalloc((void **)&dqo, 2 * qe));
    rw_err err = {0};
    const int64_t qd = (int64_t)nh * hd, kd = (int64_t)nkv * hd;
    rw_k_qk_rope_kv_ref(qkv, qkv + qd, qkv + qd + kd, ld, ld, qn, kn, pos, slot, n, nh, nkv, hd, bs,
                        inv, 1e-6f, qo, kc, vc);
    RW_ASSERT_OK(rw_k_qk_rope_kv(dqkv, dqkv + qd, dqkv + qd + kd, ld, ld, dqn, dkn, dp, ds, n, nh,
                                 nkv, hd, bs, di, 1e-6f, dqo, dkc, dvc, NULL, &err),
                 &err);
    dget(gqo, dqo, 2 * qe);
    dget(gkc, dkc, 2 * ce);
    dget(gvc, dvc, 2 * ce);
    /* sincos at angles ~1e3 differs from the host libm by a few ulps of the angle */
    near_bf16(gqo, qo, qe, 2 * TOL_BF16_REL, 0.05, "rope q");
    near_bf16(gkc, kc, ce, 2 * TOL_BF16_REL, 0.05, "rope k cache");
    rw_assert_bytes_equal(gvc, vc, 2 * ce, "v cache");
    cudaFree(dqkv);
    cudaFree(di);
    cudaFree(dqn);
    cudaFree(dkn);
    cudaFree(dqo);
    cudaFree(dkc);
    cudaFree(dvc);
    cudaFree(dp);
    cudaFree(ds);
    free(qkv);
    free(qo);
    free(gqo);
    free(kc);
    free(vc);
    free(gkc);
    free(gvc);
}

static void test_rope_kv(void **state) {
    (void)state;
    rope_case(21, 8, 2, 128);
    rope_case(1, 32, 4, 128); /* a decode token of the 30B-A3B shape */
    rope_case(40, 4, 2, 32);  /* the fixture's heads */
}

/* Three sequences: a prefill chunk of 19 tokens at positions 30..48 (tiles of 8), a decode at
 * position 300, a fresh 3-token prompt; blocks shuffled. */
static void attention_case(int nh, int nkv, int hd, int nsplit) {
    const int bs = 16, nblocks = 64, stride = 32;
    const int64_t ntok = 19 + 1 + 3;
    const size_t ce = (size_t)nblocks * nkv * bs * hd;
    uint16_t *kc = malloc(2 * ce), *vc = malloc(2 * ce);
    rw_test_fill_bf16(kc, ce, 11, 1.0f);
    rw_test_fill_bf16(vc, ce, 12, 1.0f);
    int32_t bt[3 * 32];
    for (int i = 0; i < 3 * stride; i++)
        bt[i] = (i * 29 + 5) % nblocks; /* distinct per row */
    int32_t pos[23];
    for (int i = 0; i < 19; i++)
        pos[i] = 30 + i;
    pos[19] = 300;
    for (int i = 0; i < 3; i++)
        pos[20 + i] = i;
    rw_attn_tile tiles[] = {
        {0, 0, 8, 0}, {0, 8, 8, 0}, {0, 16, 3, 0}, {1, 19, 1, 0}, {2, 20, 3, 0}};
    /* sequence 1 needs 19 blocks for position 300: rows are 32 wide, distinct entries mod 64 */
    const size_t qe = (size_t)ntok * nh * hd;
    uint16_t *q = malloc(2 * qe), *o = malloc(2 * qe), *go = malloc(2 * qe);
    rw_test_fill_bf16(q, qe, 13, 1.0f);
    rw_k_attention_ref(q, kc, vc, tiles, 5, pos, bt, stride, nh, nkv, hd, bs, o);
    uint16_t *dq = dput(q, 2 * qe), *dkc = dput(kc, 2 * ce), *dvc = dput(vc, 2 * ce), *dout;
    int32_t *dpos = dput(pos, sizeof pos), *dbt = dput(bt, sizeof bt);
    rw_attn_tile *dt = dput(tiles, sizeof tiles);
    CK(cudaMalloc((void **)&dout, 2 * qe));
    void *part = NULL;
    const size_t pb = rw_k_attention_part_bytes(ntok, nh, hd, nsplit);
    if (pb) CK(cudaMalloc(&part, pb));
    rw_err err = {0};
    RW_ASSERT_OK(rw_k_attention(dq, dkc, dvc, dt, 5, RW_ATTN_QT, dpos, dbt, stride, ntok, nh, nkv,
                                hd, bs, nsplit, 0, part, dout, NULL, &err),
                 &err);
    dget(go, dout, 2 * qe);
    /* outputs are averages of O(1) values: absolute tolerance of a few bf16 steps */
    char what[64];
    snprintf(what, sizeof what, "attention nh %d nkv %d hd %d split %d", nh, nkv, hd, nsplit);
    near_bf16(go, o, qe, 2 * TOL_BF16_REL, 0.25, what);
    cudaFree(dq);
    cudaFree(dkc);
    cudaFree(dvc);
    cudaFree(dout);
    cudaFree(dpos);
    cudaFree(dbt);
    cudaFree(dt);
    cudaFree(part);
    free(kc);
    free(vc);
    free(q);
    free(o);
    free(go);
}

/* A decode batch: one-token tiles only (qt 1: the tensor-core kernel, and the general kernel in
 * its small configuration), positions at block and key-tile edges, blocks shuffled. */
static void attention_decode_case(int nh, int nkv, int hd, int nsplit) {
    enum { NS = 7 };
    const int bs = 16, nblocks = 96, stride = 40;
    static const int32_t pos[NS] = {0, 15, 16, 17, 100, 300, 639};
    const size_t ce = (size_t)nblocks * nkv * bs * hd;
    uint16_t *kc = malloc(2 * ce), *vc = malloc(2 * ce);
    rw_test_fill_bf16(kc, ce, 21, 1.0f);
    rw_test_fill_bf16(vc, ce, 22, 1.0f);
    int32_t bt[NS * 40];
    for (int i = 0; i < NS * stride; i++)
        bt[i] = (i * 37 + 11) % nblocks; /* distinct within a row */
    rw_attn_tile tiles[NS];
    for (int i = 0; i < NS; i++)
        tiles[i] = (rw_attn_tile){i, i, 1, 0};
    const size_t qe = (size_t)NS * nh * hd;
    uint16_t *q = malloc(2 * qe), *o = malloc(2 * qe), *go = malloc(2 * qe);
    rw_test_fill_bf16(q, qe, 23, 1.0f);
    rw_k_attention_ref(q, kc, vc, tiles, NS, pos, bt, stride, nh, nkv, hd, bs, o);
    uint16_t *dq = dput(q, 2 * qe), *dkc = dput(kc, 2 * ce), *dvc = dput(vc, 2 * ce), *dout;
    int32_t *dpos = dput(pos, sizeof pos), *dbt = dput(bt, sizeof bt);
    rw_attn_tile *dt = dput(tiles, sizeof tiles);
    CK(cudaMalloc((void **)&dout, 2 * qe));
    void *part = NULL;
    const size_t pb = rw_k_attention_part_bytes(NS, nh, hd, nsplit);
    if (pb) CK(cudaMalloc(&part, pb));
    rw_err err = {0};
    /* tensor cores (P in bf16) and the general kernel */
    for (int k = 0; k < 2; k++) {
        RW_ASSERT_OK(rw_k_attention(dq, dkc, dvc, dt, NS, 1, dpos, dbt, stride, NS, nh, nkv, hd, bs,
                                    nsplit, k ? RW_ATTN_CUDA_CORES : 0, part, dout, NULL, &err),
                     &err);
        dget(go, dout, 2 * qe);
        char what[96];
        snprintf(what, sizeof what, "decode attention (%s) nh %d nkv %d hd %d split %d",
                 k ? "cuda cores" : "tensor cores", nh, nkv, hd, nsplit);
        near_bf16(go, o, qe, 2 * TOL_BF16_REL, 0.25, what);
    }
    cudaFree(dq);
    cudaFree(dkc);
    cudaFree(dvc);
    cudaFree(dout);
    cudaFree(dpos);
    cudaFree(dbt);
    cudaFree(dt);
    cudaFree(part);
    free(kc);
    free(vc);
    free(q);
    free(o);
    free(go);
}

static void test_attention(void **state) {
    (void)state;
    attention_case(32, 4, 128, 1);
    attention_case(32, 4, 128, 4);
    attention_case(4, 2, 32, 1);
    attention_case(4, 2, 32, 3);
    attention_case(8, 8, 64, 1);
    attention_decode_case(32, 4, 128, 1);
    attention_decode_case(32, 4, 128, 16);
    attention_decode_case(4, 2, 32, 1);
    attention_decode_case(4, 2, 32, 5);
    attention_decode_case(8, 8, 64, 1);
    attention_decode_case(16, 1, 64, 3);
    attention_decode_case(12, 1, 128, 2); /* a group that does not fill the 16 mma rows */
}

/* Router logits: decode-sized and prefill-sized batches, the fixture's shape; a token's logits
 * are the same bits alone as in a batch. */
static void router_case(int64_t n, int64_t E, int64_t H, uint64_t seed) {
    float *x = malloc(4 * n * H), *y = malloc(4 * n * E), *gy = malloc(4 * n * E);
    float *one = malloc(4 * E);
    uint16_t *w = malloc(2 * E * H);
    fill_f32(x, (size_t)(n * H), seed, 1.0f);
    rw_test_fill_bf16(w, (size_t)(E * H), seed + 1, 0.05f);
    rw_k_router_ref(x, w, n, E, H, y);
    float *dx = dput(x, 4 * n * H), *dy;
    uint16_t *dw = dput(w, 2 * E * H);
    CK(cudaMalloc((void **)&dy, 4 * n * E));
    rw_err err = {0};
    RW_ASSERT_OK(rw_k_router(dx, dw, n, E, H, dy, NULL, &err), &err);
    dget(gy, dy, 4 * n * E);
    char what[64];
    snprintf(what, sizeof what, "router n %lld E %lld H %lld", (long long)n, (long long)E,
             (long long)H);
    near_f32(gy, y, (size_t)(n * E), 1e-4, 1.0, what);
    for (int64_t t = 0; t < n; t += n / 3 + 1) {
        RW_ASSERT_OK(rw_k_router(dx + t * H, dw, 1, E, H, dy, NULL, &err), &err);
        dget(one, dy, 4 * E);
        rw_assert_bytes_equal(one, gy + t * E, 4 * E, "router: a token alone vs in the batch");
    }
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
    router_case(77, 128, 2048, 14);
    router_case(1, 128, 2048, 16);
    router_case(13, 8, 128, 18);
    router_case(300, 60, 512, 20);
}

static void test_sample(void **state) {
    (void)state;
    const int64_t n = 240, V = 5003;
    float *l = malloc(4 * n * V);
    fill_f32(l, (size_t)(n * V), 16, 3.0f);
    rw_k_sample_param *p = calloc((size_t)n, sizeof *p);
    for (int i = 0; i < n; i++) {
        p[i].row = (int32_t)(n - 1 - i); /* rows in another order than requests */
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
    rw_k_sample_out *ref = calloc((size_t)n, sizeof *ref), *got = calloc((size_t)n, sizeof *got),
                    *again = calloc((size_t)n, sizeof *again);
    rw_k_sample_ref(l, n, V, p, ref);
    float *dl = dput(l, 4 * n * V);
    rw_k_sample_param *dp = dput(p, sizeof *p * n);
    rw_k_sample_out *dout;
    CK(cudaMalloc((void **)&dout, sizeof *dout * n));
    rw_err err = {0};
    RW_ASSERT_OK(rw_k_sample(dl, n, V, dp, dout, NULL, &err), &err);
    dget(got, dout, sizeof *got * n);
    RW_ASSERT_OK(rw_k_sample(dl, n, V, dp, dout, NULL, &err), &err);
    dget(again, dout, sizeof *again * n);
    rw_assert_bytes_equal(got, again, sizeof *got * n, "sampling rerun");
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
        /* logprob = raw logit - logsumexp, the normaliser taken from the reference's token */
        const float lse = row[ref[i].token] - ref[i].logprob;
        assert_true(fabsf(got[i].logprob - (row[got[i].token] - lse)) < 1e-4f);
        for (int j = 0; j < p[i].top_n; j++) {
            assert_int_equal(got[i].top_ids[j], ref[i].top_ids[j]);
            assert_true(fabsf(got[i].top_lps[j] - ref[i].top_lps[j]) < 1e-4f);
        }
        if (p[i].top_k > 0) { /* the token is inside the top-k */
            int above = 0;
            for (int64_t v = 0; v < V; v++)
                above += row[v] > row[got[i].token];
            assert_true(above < p[i].top_k);
        }
    }
    print_message("sampled rows: %d of %d draw the reference's token\n", same, sampled);
    /* only exp() rounding differs from the reference: boundary cases are rare */
    assert_true(same >= sampled - 2);
    cudaFree(dl);
    cudaFree(dp);
    cudaFree(dout);
    free(l);
    free(p);
    free(ref);
    free(got);
    free(again);
}

int main(void) {
    rw_test_require_gpu(1);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_embed_gather), cmocka_unit_test(test_norms),
        cmocka_unit_test(test_rope_kv),      cmocka_unit_test(test_attention),
        cmocka_unit_test(test_router),       cmocka_unit_test(test_sample),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
