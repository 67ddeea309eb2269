/* test_pack.c - the packed layout of docs/LAYOUT.md section 3 on the host: the row maps on the
 * hand-computed P = 128 example, the K-block and scale-swizzle offsets, unpack(pack(x)) == x for
 * bf16 / mxfp8 / fp8-block at every T and I of docs/LAYOUT.md section 6, zero swizzle padding, and
 * the CPU reference of the scatter ops (copy, quantize-and-pack) against pack_ref and the quant
 * module. */
#include "moe_util.h"
#include "moe_layout.h"

static const int TPS[] = {1, 2, 4, 8};
static const int64_t IS[] = {768, 1536, 96, 160};
#define H_TEST 256

/* Row maps (section 3): the forward formula and its example for P = 128. */
static void test_row_maps(void **state) {
    (void)state;
    assert_int_equal(rw_moe_w13_row_map(0, 128), 0);
    assert_int_equal(rw_moe_w13_row_map(128, 128), 8); /* gate row 0 */
    assert_int_equal(rw_moe_w13_row_map(1, 128), 16);
    assert_int_equal(rw_moe_w13_row_map(129, 128), 24);
    assert_int_equal(rw_moe_w13_row_map(2, 128), 1);
    /* the 32-row shuffle is out[32b + d] = in[32b + src(d)], src(d) = 4 (d % 8) + d / 8 */
    for (int64_t i = 0; i < 96; i++) {
        int64_t n = rw_moe_row_shuffle(i);
        int64_t d = n % 32;
        assert_int_equal(n / 32, i / 32);
        assert_int_equal(32 * (n / 32) + 4 * (d % 8) + d / 8, i);
    }
    /* the interleave: out row i comes from in[i/2] (even) or in[M/2 + i/2] (odd), M = 2P */
    int64_t P = 256, M = 2 * P;
    unsigned char *seen = calloc((size_t)M, 1);
    for (int64_t c = 0; c < M; c++) {
        int64_t n = rw_moe_w13_row_map(c, P);
        assert_true(n >= 0 && n < M);
        seen[n]++;
        /* undo the shuffle: find i with shuffle(i) == n, then check the interleave */
        int64_t i = -1;
        for (int64_t j = 32 * (n / 32); j < 32 * (n / 32) + 32; j++)
            if (rw_moe_row_shuffle(j) == n) i = j;
        assert_int_equal(i % 2 == 0 ? i / 2 : M / 2 + i / 2, c);
    }
    for (int64_t n = 0; n < M; n++)
        assert_int_equal(seen[n], 1);
    free(seen);
    /* K blocks: element (n, k) of [M, K] -> ((k/64) M + n) 64 + k % 64 */
    assert_int_equal(rw_moe_kblock_offset(3, 70, 256), (1 * 256 + 3) * 64 + 6);
    /* scale swizzle by hand: (m, k) = (37, 5), Kt = 2 -> 0 + 512 + 5*16 + 1*4 + 1 */
    assert_int_equal(rw_moe_scale_swizzle(37, 5, 2), 512 + 80 + 4 + 1);
    assert_int_equal(rw_moe_scale_swizzle(130, 0, 3), 3 * 512 + 2 * 16);
}

static void fill_scales(rw_wfmt f, void *s, size_t bytes, uint64_t seed) {
    rw_rng r;
    rw_rng_seed(&r, seed);
    if (f == RW_WFMT_MXFP8) {
        uint8_t *b = s;
        for (size_t i = 0; i < bytes; i++)
            b[i] = (uint8_t)(100 + rw_rng_u64(&r) % 50);
    } else {
        float *x = s;
        for (size_t i = 0; i < bytes / 4; i++)
            x[i] = (float)(0.001 + rw_rng_uniform(&r));
    }
}

/* unpack(pack(x)) == x, for every format, both matrices, every T and I; mxfp8 swizzle padding
 * is zero; bf16 packed sizes match the spec's shapes. */
static void test_roundtrip(void **state) {
    (void)state;
    const rw_wfmt fmts[] = {RW_WFMT_BF16, RW_WFMT_MXFP8, RW_WFMT_FP8_BLOCK};
    uint64_t seed = 1;
    for (size_t ii = 0; ii < 4; ii++)
        for (size_t ti = 0; ti < 4; ti++)
            for (size_t fi = 0; fi < 3; fi++)
                for (int mi = 0; mi < 2; mi++) {
                    int64_t S = IS[ii] / TPS[ti], P = rw_roundup(S, 128), H = H_TEST;
                    rw_wfmt f = fmts[fi];
                    rw_moe_mat m = mi ? RW_MOE_W2 : RW_MOE_W13;
                    size_t nb = rw_moe_packed_bytes(f, m, P, H);
                    size_t lsb = moe_test_logical_scale_bytes(f, m, P, H);
                    size_t psb = rw_moe_packed_scale_bytes(f, m, P, H);
                    assert_int_equal(nb, (size_t)(m == RW_MOE_W13 ? 2 * P : P) * H *
                                             (f == RW_WFMT_BF16 ? 2 : 1));
                    uint8_t *x = moe_test_rand_bytes(nb, seed++);
                    uint8_t *xs = malloc(lsb + 1), *ps = malloc(psb + 1), *ys = malloc(lsb + 1);
                    fill_scales(f, xs, lsb, seed++);
                    uint8_t *pk = malloc(nb), *y = malloc(nb);
                    memset(ps, 0xee, psb + 1);
                    rw_moe_pack_ref(f, m, P, H, x, xs, pk, ps);
                    rw_moe_unpack_ref(f, m, P, H, pk, ps, y, ys);
                    rw_assert_bytes_equal(x, y, nb, "unpack(pack(x))");
                    if (f != RW_WFMT_BF16) rw_assert_bytes_equal(xs, ys, lsb, "scales");
                    if (f == RW_WFMT_MXFP8) {
                        /* every byte not addressed by a scale is swizzle padding: zero */
                        size_t nz = 0;
                        for (size_t i = 0; i < psb; i++)
                            nz += ps[i] != 0;
                        assert_int_equal(nz, lsb); /* the random scales are all non-zero */
                    }
                    if (f == RW_WFMT_BF16 && m == RW_MOE_W13) {
                        /* row 0 of up lands at packed row 0, K block 0; gate row 0 at row 8 */
                        const uint16_t *xl = (const uint16_t *)x, *pp = (const uint16_t *)pk;
                        assert_int_equal(pp[0], xl[0]);
                        assert_int_equal(pp[8 * 64 + 1], xl[P * H + 1]);
                        /* element (c=1, k=65): row 16 of K block 1 */
                        assert_int_equal(pp[(1 * 2 * P + 16) * 64 + 1], xl[1 * H + 65]);
                    }
                    free(x);
                    free(xs);
                    free(ps);
                    free(ys);
                    free(pk);
                    free(y);
                }
}

/* The COPY op over a whole logical matrix (and over pieces of it with odd edges) equals
 * rw_moe_pack_ref. */
static void test_copy_ops_match_pack(void **state) {
    (void)state;
    const rw_wfmt fmts[] = {RW_WFMT_BF16, RW_WFMT_MXFP8, RW_WFMT_FP8_BLOCK};
    for (size_t fi = 0; fi < 3; fi++)
        for (int mi = 0; mi < 2; mi++) {
            rw_wfmt f = fmts[fi];
            rw_moe_mat m = mi ? RW_MOE_W2 : RW_MOE_W13;
            int64_t P = 128, H = H_TEST;
            int64_t rows = m == RW_MOE_W13 ? 2 * P : H, cols = m == RW_MOE_W13 ? H : P;
            size_t nb = rw_moe_packed_bytes(f, m, P, H),
                   psb = rw_moe_packed_scale_bytes(f, m, P, H);
            size_t lsb = moe_test_logical_scale_bytes(f, m, P, H);
            int es = f == RW_WFMT_BF16 ? 2 : 1;
            uint8_t *x = moe_test_rand_bytes(nb, 77 + fi), *xs = malloc(lsb);
            fill_scales(f, xs, lsb, 99);
            uint8_t *want = malloc(nb), *wants = malloc(psb), *got = calloc(nb, 1),
                    *gots = calloc(psb, 1);
            rw_moe_pack_ref(f, m, P, H, x, xs, want, wants);
            rw_moe_tgt td, ts;
            rw_moe_expert_tgt(f, m, P, H, got, gots, &td, &ts);
            /* four ops: split rows at 37 and columns at 101 */
            int64_t rs[3] = {0, 37, rows}, cs[3] = {0, 101, cols};
            rw_moe_op ops[8];
            size_t n = 0;
            for (int a = 0; a < 2; a++)
                for (int b = 0; b < 2; b++) {
                    rw_moe_op o;
                    memset(&o, 0, sizeof o);
                    o.kind = RW_MOE_OP_COPY;
                    o.esize = es;
                    o.src = (uint64_t)(uintptr_t)(x + (size_t)(rs[a] * cols + cs[b]) * es);
                    o.src_ld = cols;
                    o.dst = td;
                    o.dst_r0 = rs[a];
                    o.dst_c0 = cs[b];
                    o.rows = (int32_t)(rs[a + 1] - rs[a]);
                    o.cols = (int32_t)(cs[b + 1] - cs[b]);
                    ops[n++] = o;
                }
            if (f != RW_WFMT_BF16) {
                /* the scales as one COPY (mxfp8: [rows, cols/32] u8 -> swizzled) */
                rw_moe_op o;
                memset(&o, 0, sizeof o);
                o.kind = RW_MOE_OP_COPY;
                o.esize = f == RW_WFMT_MXFP8 ? 1 : 4;
                o.src = (uint64_t)(uintptr_t)xs;
                o.dst = ts;
                if (f == RW_WFMT_MXFP8) {
                    o.rows = (int32_t)rows;
                    o.cols = (int32_t)(cols / 32);
                } else {
                    o.rows = (int32_t)((rows + 127) / 128);
                    o.cols = (int32_t)((cols + 127) / 128);
                }
                o.src_ld = o.cols;
                ops[n++] = o;
            }
            rw_moe_ops_run_ref(ops, n);
            rw_assert_bytes_equal(want, got, nb, "copy ops vs pack_ref");
            if (f != RW_WFMT_BF16) rw_assert_bytes_equal(wants, gots, psb, "scale copy vs pack");
            int64_t units = 0;
            for (size_t i = 0; i < 4; i++)
                units += rw_moe_op_units(&ops[i]);
            /* rows x 64-col chunks touched: split at 101 touches chunk 1 twice */
            assert_int_equal(units, rows * ((cols + 63) / 64 + (cols > 101 ? 1 : 0)));
            free(x);
            free(xs);
            free(want);
            free(wants);
            free(got);
            free(gots);
        }
}

/* MXQ op on bf16 (and on the same values as f32) == rw_quant_mxfp8_ref then rw_moe_pack_ref;
 * FP8Q ops over the 128x128 blocks == rw_quant_fp8_block_ref. Includes an all-zero block and
 * large values. */
static void test_quant_ops(void **state) {
    (void)state;
    int64_t P = 128, H = H_TEST;
    for (int mi = 0; mi < 2; mi++) {
        rw_moe_mat m = mi ? RW_MOE_W2 : RW_MOE_W13;
        int64_t rows = m == RW_MOE_W13 ? 2 * P : H, cols = m == RW_MOE_W13 ? H : P;
        size_t n = (size_t)(rows * cols);
        uint16_t *x = moe_test_rand_bf16(n, 5 + mi, 3.0f);
        for (int64_t j = 0; j < 32; j++)
            x[3 * cols + 64 + j] = 0;               /* all-zero block */
        x[5 * cols + 7] = rw_f32_to_bf16(30000.0f); /* large amax */
        float *xf = malloc(n * sizeof(float));
        for (size_t i = 0; i < n; i++)
            xf[i] = rw_bf16_to_f32(x[i]);
        /* mxfp8 */
        uint8_t *q = malloc(n), *qs = malloc(n / 32);
        rw_err err = {0};
        RW_ASSERT_OK(rw_quant_mxfp8_ref(x, rows, cols, q, qs, &err), &err);
        size_t nb = rw_moe_packed_bytes(RW_WFMT_MXFP8, m, P, H);
        size_t psb = rw_moe_packed_scale_bytes(RW_WFMT_MXFP8, m, P, H);
        uint8_t *want = malloc(nb), *wants = malloc(psb);
        rw_moe_pack_ref(RW_WFMT_MXFP8, m, P, H, q, qs, want, wants);
        for (int es = 2; es <= 4; es += 2) {
            uint8_t *got = calloc(nb, 1), *gots = calloc(psb, 1);
            rw_moe_tgt td, ts;
            rw_moe_expert_tgt(RW_WFMT_MXFP8, m, P, H, got, gots, &td, &ts);
            /* two ops split at column 96 (a block boundary) */
            rw_moe_op o[2];
            for (int k = 0; k < 2; k++) {
                memset(&o[k], 0, sizeof o[k]);
                int64_t c0 = k ? 96 : 0, c1 = k ? cols : 96;
                o[k].kind = RW_MOE_OP_MXQ;
                o[k].esize = es;
                o[k].src = es == 2 ? (uint64_t)(uintptr_t)(x + c0) : (uint64_t)(uintptr_t)(xf + c0);
                o[k].src_ld = cols;
                o[k].dst = td;
                o[k].scl = ts;
                o[k].dst_c0 = c0;
                o[k].rows = (int32_t)rows;
                o[k].cols = (int32_t)(c1 - c0);
            }
            rw_moe_ops_run_ref(o, 2);
            rw_assert_bytes_equal(want, got, nb, "MXQ op vs quantize + pack (data)");
            rw_assert_bytes_equal(wants, gots, psb, "MXQ op vs quantize + pack (scales)");
            free(got);
            free(gots);
        }
        /* fp8 block: plain layout, one op per 128x128 block */
        uint8_t *fq = malloc(n);
        int64_t sr = (rows + 127) / 128, sc = (cols + 127) / 128;
        float *fs = malloc(sizeof(float) * (size_t)(sr * sc));
        RW_ASSERT_OK(rw_quant_fp8_block_ref(x, rows, cols, fq, fs, &err), &err);
        uint8_t *g = calloc(n, 1);
        float *gs = calloc((size_t)(sr * sc), sizeof(float));
        rw_moe_tgt td, ts;
        rw_moe_expert_tgt(RW_WFMT_FP8_BLOCK, m, P, H, g, gs, &td, &ts);
        for (int64_t bi = 0; bi < sr; bi++)
            for (int64_t bj = 0; bj < sc; bj++) {
                rw_moe_op o;
                memset(&o, 0, sizeof o);
                o.kind = RW_MOE_OP_FP8Q;
                o.esize = 2;
                o.src = (uint64_t)(uintptr_t)(x + bi * 128 * cols + bj * 128);
                o.src_ld = cols;
                o.dst = td;
                o.scl = ts;
                o.dst_r0 = bi * 128;
                o.dst_c0 = bj * 128;
                o.rows = (int32_t)(rows - bi * 128 < 128 ? rows - bi * 128 : 128);
                o.cols = (int32_t)(cols - bj * 128 < 128 ? cols - bj * 128 : 128);
                rw_moe_ops_run_ref(&o, 1);
            }
        rw_assert_bytes_equal(fq, g, n, "FP8Q ops vs rw_quant_fp8_block_ref (data)");
        rw_assert_bytes_equal(fs, gs, sizeof(float) * (size_t)(sr * sc), "FP8Q scales");
        free(x);
        free(xf);
        free(q);
        free(qs);
        free(want);
        free(wants);
        free(fq);
        free(fs);
        free(g);
        free(gs);
    }
}

/* Device entry points: without CUDA they refuse with RW_E_NO_DEVICE; with CUDA they check shapes
 * before touching the device. */
static void test_device_entry_points(void **state) {
    (void)state;
    rw_err err = {0};
    uint8_t a[64], b[64];
    if (!rw_cuda_built()) {
        assert_int_equal(
            rw_moe_pack_cuda(RW_WFMT_BF16, RW_MOE_W13, 128, 256, 1, a, NULL, b, NULL, NULL, &err),
            RW_E_NO_DEVICE);
        assert_int_equal(
            rw_moe_unpack_cuda(RW_WFMT_BF16, RW_MOE_W13, 128, 256, 1, a, NULL, b, NULL, NULL, &err),
            RW_E_NO_DEVICE);
        rw_config c;
        moe_test_config(&c, 256, 2, 256, 1, RW_QMETHOD_NONE, 0);
        rw_wset *ws = NULL;
        assert_int_equal(rw_wset_create(&c, 1, 0, RW_PLACE_DEVICE, 0, &ws, &err), RW_E_NO_DEVICE);
        assert_null(ws);
        RW_ASSERT_OK(rw_wset_create(&c, 1, 0, RW_PLACE_HOST, 0, &ws, &err), &err);
        uint16_t *x = moe_test_rand_bf16(256 * 256, 3, 1.0f);
        rw_piece p = {.name = "model.layers.0.mlp.experts.0.up_proj.weight",
                      .dtype = RW_DTYPE_BF16,
                      .ndim = 2,
                      .shape = {256, 256},
                      .shard_dim = -1,
                      .data = x,
                      .place = RW_PLACE_DEVICE};
        assert_int_equal(rw_wset_validate_piece(ws, &p, &err), RW_E_NO_DEVICE);
        assert_non_null(strstr(err.msg, "up_proj"));
        free(x);
        rw_wset_destroy(ws);
        rw_config_free(&c);
    } else {
        assert_int_equal(
            rw_moe_pack_cuda(RW_WFMT_BF16, RW_MOE_W13, 100, 256, 1, a, NULL, b, NULL, NULL, &err),
            RW_E_SHAPE);
        assert_int_equal(
            rw_moe_unpack_cuda(RW_WFMT_MXFP8, RW_MOE_W2, 128, 96, 1, a, a, b, b, NULL, &err),
            RW_E_SHAPE);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_row_maps),
        cmocka_unit_test(test_roundtrip),
        cmocka_unit_test(test_copy_ops_match_pack),
        cmocka_unit_test(test_quant_ops),
        cmocka_unit_test(test_device_entry_points),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
