/* test_router_gpu.c - the CUDA backend's router (worker/kernels/router.cu) on random inputs (gpu
 * suite): its logits against the plain-C reference within a named tolerance, the routing against
 * moe's route kernel and reference bit for bit, the sort in the routing CTA against a reference
 * sort, and the form with the post-attention norm against add_rmsnorm then the router, byte for
 * byte. */
#include <math.h>

#include "rw_test.h"
#include "rw_test_cuda.h"
#include "kernels/norm_rope.h"
#include "kernels/router.h"
#include "rw_moe.h"
#include "rw_worker.h"

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
 * are the same bits alone as in a batch. dup > 0: expert e's weights are expert e % dup's, so
 * equal logits tie in the picks (the tie goes to the lower id in every routing form). */
static void router_case_dup(int64_t n, int64_t E, int64_t H, int k, uint64_t seed, int64_t dup) {
    float *x = malloc(4 * n * H), *y = malloc(4 * n * E), *gy = malloc(4 * n * E);
    float *one = malloc(4 * E);
    uint16_t *w = malloc(2 * E * H);
    rw_test_fill_f32(x, (size_t)(n * H), seed, 1.0f);
    rw_test_fill_bf16(w, (size_t)(E * H), seed + 1, 0.05f);
    for (int64_t e = dup; dup > 0 && e < E; e++)
        memcpy(w + e * H, w + (e % dup) * H, 2 * (size_t)H);
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

static void router_case(int64_t n, int64_t E, int64_t H, int k, uint64_t seed) {
    router_case_dup(n, E, H, k, seed, 0);
}

/* A one-token step whose input is NaN (every probability NaN): the picks of the routing CTA
 * that sorts them (the cluster form for E <= 128) are rw_k_router_topk's bit for bit, and the
 * sort places none of them. */
static void router_nan_case(int64_t E, int64_t H, int k) {
    float *x = malloc(4 * H);
    uint16_t *w = malloc(2 * E * H);
    rw_test_fill_f32(x, (size_t)H, 50, 1.0f);
    rw_test_fill_bf16(w, (size_t)(E * H), 51, 0.05f);
    x[H / 3] = NAN;
    float *dx = rw_tdev_put(x, 4 * H), *dy, *dwt, *dwt2;
    uint16_t *dw = rw_tdev_put(w, 2 * E * H);
    int32_t *did, *did2, *dcnt, *doff, *dtiles, *dnt, *dperm, *dinv;
    const int64_t nc = rw_k_router_counters(1);
    RW_TCK(cudaMalloc((void **)&dy, 4 * E));
    RW_TCK(cudaMalloc((void **)&dwt, 4 * k));
    RW_TCK(cudaMalloc((void **)&dwt2, 4 * k));
    RW_TCK(cudaMalloc((void **)&did, 4 * k));
    RW_TCK(cudaMalloc((void **)&did2, 4 * k));
    RW_TCK(cudaMalloc((void **)&dcnt, 4 * nc));
    RW_TCK(cudaMalloc((void **)&doff, 4 * (E + 1)));
    RW_TCK(cudaMalloc((void **)&dtiles, 8 * (k + E)));
    RW_TCK(cudaMalloc((void **)&dnt, 4));
    RW_TCK(cudaMalloc((void **)&dperm, 4 * k));
    RW_TCK(cudaMalloc((void **)&dinv, 4 * k));
    RW_TCK(cudaMemset(dcnt, 0, 4 * nc));
    rw_err err = {0};
    const rw_moe_sort_dest sd = {doff, dtiles, dnt, dperm, dinv, 16};
    RW_ASSERT_OK(
        rw_k_router_topk_sort(dx, dw, 1, E, H, k, true, dy, did, dwt, dcnt, nc, &sd, NULL, &err),
        &err);
    RW_ASSERT_OK(rw_k_router_topk(dx, dw, 1, E, H, k, true, dy, did2, dwt2, dcnt, nc, NULL, &err),
                 &err);
    int32_t ids[32], ids2[32], inv[32], nt = -1;
    float wt[32], wt2[32];
    rw_tdev_get(ids, did, 4 * k);
    rw_tdev_get(ids2, did2, 4 * k);
    rw_tdev_get(wt, dwt, 4 * k);
    rw_tdev_get(wt2, dwt2, 4 * k);
    rw_tdev_get(inv, dinv, 4 * k);
    rw_tdev_get(&nt, dnt, 4);
    rw_assert_bytes_equal(ids, ids2, 4 * k, "router NaN: ids, routing CTA vs rw_k_router_topk");
    rw_assert_bytes_equal(wt, wt2, 4 * k, "router NaN: weights, routing CTA vs rw_k_router_topk");
    for (int j = 0; j < k; j++) {
        if (ids[j] >= 0 && ids[j] < E) fail_msg("router NaN: pick %d is expert %d", j, ids[j]);
        assert_int_equal(inv[j], -1);
    }
    assert_int_equal(nt, 0);
    assert_counters_zero(dcnt, nc, "router NaN");
    cudaFree(dx);
    cudaFree(dw);
    cudaFree(dy);
    cudaFree(dwt);
    cudaFree(dwt2);
    cudaFree(did);
    cudaFree(did2);
    cudaFree(dcnt);
    cudaFree(doff);
    cudaFree(dtiles);
    cudaFree(dnt);
    cudaFree(dperm);
    cudaFree(dinv);
    free(x);
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
    /* the one-token sort (a bit set of the picks, one word a lane) at other expert counts: two
     * words, seventeen with 32 picks, and all 32 with the offset past the last word */
    router_case(1, 60, 512, 4, 38);
    router_case(1, 520, 256, 32, 40);
    router_case(1, 1024, 256, 8, 42);
    /* ties among the picks (duplicated expert weights), the one-token forms included; and a
     * NaN input */
    router_case_dup(1, 128, 2048, 8, 44, 37);
    router_case_dup(1, 128, 2048, 8, 46, 2);
    router_case_dup(1, 60, 512, 4, 48, 7);
    router_case_dup(8, 128, 2048, 8, 49, 5);
    router_nan_case(128, 2048, 8);
    router_nan_case(60, 512, 4);
    router_norm_case(1, 128, 2048, 8, 30); /* the 30B shape's batch-1 step */
    router_norm_case(8, 128, 2048, 8, 32); /* a whole token group */
    router_norm_case(3, 60, 1000, 4, 34);  /* rows not a multiple of the CTA's threads */
    router_norm_case(5, 520, 256, 32, 36);
}

int main(void) {
    rw_test_require_gpu(1);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_router),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
