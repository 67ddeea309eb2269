/* test_layout_gpu.c - the CUDA layout path against its CPU reference (gpu suite; exits 77 without
 * a device): CUDA pack / unpack == rw_moe_pack_ref / rw_moe_unpack_ref byte for byte for bf16,
 * mxfp8 and fp8-block at every T and I of docs/LAYOUT.md section 6; the fused scatter (COPY, MXQ
 * from bf16 and f32, odd offsets and unaligned sources) and the fp8 block quantizer ==
 * rw_moe_ops_run_ref; a device weight set's apply_batch == a host set's apply of the same pieces
 * (whole arena bytes), for device and host pieces, trainer shards in every form, quantize on load
 * and quantized checkpoints (including fp8-block re-quantization through staging); device readback
 * and checksums == host. */
#include "moe_wset_util.h"
#include "moe_layout.h"

static const int TPS[] = {1, 2, 4, 8};
static const int64_t IS[] = {768, 1536, 96, 160};

static void *to_dev(const void *h, size_t n) {
    void *d = NULL;
    rw_err err = {0};
    RW_ASSERT_OK(rw_dev_malloc(n ? n : 1, &d, &err), &err);
    RW_ASSERT_OK(rw_memcpy(d, RW_PLACE_DEVICE, h, RW_PLACE_HOST, n, NULL, &err), &err);
    RW_ASSERT_OK(rw_stream_sync(NULL, &err), &err);
    return d;
}

static void *to_host(const void *d, size_t n) {
    void *h = malloc(n ? n : 1);
    rw_err err = {0};
    RW_ASSERT_OK(rw_memcpy(h, RW_PLACE_HOST, d, RW_PLACE_DEVICE, n, NULL, &err), &err);
    RW_ASSERT_OK(rw_stream_sync(NULL, &err), &err);
    return h;
}

/* CUDA pack == CPU pack, CUDA unpack == CPU unpack, for 3 experts at a time. */
static void test_pack_cuda_vs_ref(void **state) {
    (void)state;
    const rw_wfmt fmts[] = {RW_WFMT_BF16, RW_WFMT_MXFP8, RW_WFMT_FP8_BLOCK};
    const int64_t H = 256, NE = 3;
    rw_stream s = NULL;
    rw_err err = {0};
    RW_ASSERT_OK(rw_stream_create(&s, &err), &err);
    uint64_t seed = 10;
    for (size_t ii = 0; ii < 4; ii++)
        for (size_t ti = 0; ti < 4; ti++)
            for (size_t fi = 0; fi < 3; fi++)
                for (int mi = 0; mi < 2; mi++) {
                    int64_t P = rw_roundup(IS[ii] / TPS[ti], 128);
                    rw_wfmt f = fmts[fi];
                    rw_moe_mat m = mi ? RW_MOE_W2 : RW_MOE_W13;
                    size_t pb = rw_moe_packed_bytes(f, m, P, H);
                    size_t psb = rw_moe_packed_scale_bytes(f, m, P, H);
                    size_t lsb = moe_test_logical_scale_bytes(f, m, P, H);
                    uint8_t *x = moe_test_rand_bytes(pb * NE, seed++);
                    uint8_t *xs = moe_test_rand_bytes(lsb * NE + 1, seed++);
                    if (f == RW_WFMT_FP8_BLOCK) /* scales as finite floats */
                        for (size_t i = 0; i < lsb * NE / 4; i++)
                            ((float *)xs)[i] = 0.5f + i;
                    uint8_t *want = malloc(pb * NE), *wants = malloc(psb * NE + 1);
                    for (int64_t e = 0; e < NE; e++)
                        rw_moe_pack_ref(f, m, P, H, x + e * pb, xs + e * lsb, want + e * pb,
                                        wants + e * psb);
                    void *dx = to_dev(x, pb * NE), *dxs = to_dev(xs, lsb * NE + 1);
                    void *dp = NULL, *dps = NULL, *dy = NULL, *dys = NULL;
                    RW_ASSERT_OK(rw_dev_malloc(pb * NE, &dp, &err), &err);
                    RW_ASSERT_OK(rw_dev_malloc(psb * NE + 1, &dps, &err), &err);
                    RW_ASSERT_OK(rw_dev_malloc(pb * NE, &dy, &err), &err);
                    RW_ASSERT_OK(rw_dev_malloc(lsb * NE + 1, &dys, &err), &err);
                    RW_ASSERT_OK(rw_moe_pack_cuda(f, m, P, H, NE, dx, dxs, dp, dps, s, &err), &err);
                    RW_ASSERT_OK(rw_moe_unpack_cuda(f, m, P, H, NE, dp, dps, dy, dys, s, &err),
                                 &err);
                    RW_ASSERT_OK(rw_stream_sync(s, &err), &err);
                    uint8_t *got = to_host(dp, pb * NE), *gots = to_host(dps, psb * NE);
                    uint8_t *back = to_host(dy, pb * NE), *backs = to_host(dys, lsb * NE);
                    char what[96];
                    snprintf(what, sizeof what, "%s %s P=%lld: CUDA pack", rw_wfmt_str(f),
                             mi ? "w2" : "w13", (long long)P);
                    rw_assert_bytes_equal(want, got, pb * NE, what);
                    if (f != RW_WFMT_BF16) rw_assert_bytes_equal(wants, gots, psb * NE, what);
                    rw_assert_bytes_equal(x, back, pb * NE, "CUDA unpack");
                    if (f != RW_WFMT_BF16) rw_assert_bytes_equal(xs, backs, lsb * NE, "scales");
                    rw_dev_free(dx);
                    rw_dev_free(dxs);
                    rw_dev_free(dp);
                    rw_dev_free(dps);
                    rw_dev_free(dy);
                    rw_dev_free(dys);
                    free(x);
                    free(xs);
                    free(want);
                    free(wants);
                    free(got);
                    free(gots);
                    free(back);
                    free(backs);
                }
    rw_stream_destroy(s);
}

/* Rebases an op's source and target addresses from one allocation to another. */
static rw_moe_op rebase(rw_moe_op o, uintptr_t sh, uintptr_t sd, uintptr_t dh, uintptr_t dd) {
    o.src = o.src - sh + sd;
    o.dst.base = o.dst.base - dh + dd;
    if (o.scl.base) o.scl.base = o.scl.base - dh + dd;
    return o;
}

/* The scatter and fp8 kernels == rw_moe_ops_run_ref on the same ops: odd rectangles, sources
 * at odd element offsets (scalar path), MXQ from bf16 and f32, FP8Q with partial blocks, into
 * bf16 K-block, mxfp8 and plain targets. */
static void test_scatter_vs_ref(void **state) {
    (void)state;
    const int64_t P = 256, H = 512;
    size_t src_bytes = (size_t)(2 * P * H) * 4 + 64, dst_bytes = 4 << 20;
    uint8_t *src = moe_test_rand_bytes(src_bytes, 1);
    /* bf16 values in the first half (finite), f32 values (from bf16) in the second */
    uint16_t *sb = (uint16_t *)src;
    rw_test_fill_bf16(sb, (size_t)(2 * P * H), 2, 2.0f);
    float *sf = (float *)(src + (size_t)(2 * P * H) * 2 + 16);
    for (int64_t i = 0; i < P * H / 2; i++)
        sf[i] = rw_bf16_to_f32(sb[i]);
    uint8_t *dh = calloc(dst_bytes, 1);
    /* targets in the dst buffer: bf16 w13, mxfp8 w13 + scales, mxfp8 w2 + scales, fp8 w13 */
    size_t o_b = 0, o_m = rw_moe_packed_bytes(RW_WFMT_BF16, RW_MOE_W13, P, H);
    size_t o_ms = o_m + rw_moe_packed_bytes(RW_WFMT_MXFP8, RW_MOE_W13, P, H);
    size_t o_w2 = o_ms + rw_moe_packed_scale_bytes(RW_WFMT_MXFP8, RW_MOE_W13, P, H);
    size_t o_w2s = o_w2 + rw_moe_packed_bytes(RW_WFMT_MXFP8, RW_MOE_W2, P, H);
    size_t o_f = o_w2s + rw_moe_packed_scale_bytes(RW_WFMT_MXFP8, RW_MOE_W2, P, H);
    size_t o_fs = o_f + rw_moe_packed_bytes(RW_WFMT_FP8_BLOCK, RW_MOE_W13, P, H);
    assert_true(o_fs + rw_moe_packed_scale_bytes(RW_WFMT_FP8_BLOCK, RW_MOE_W13, P, H) < dst_bytes);
    rw_moe_tgt tb, tbx, tm, tms, t2, t2s, tf, tfs;
    rw_moe_expert_tgt(RW_WFMT_BF16, RW_MOE_W13, P, H, dh + o_b, NULL, &tb, &tbx);
    rw_moe_expert_tgt(RW_WFMT_MXFP8, RW_MOE_W13, P, H, dh + o_m, dh + o_ms, &tm, &tms);
    rw_moe_expert_tgt(RW_WFMT_MXFP8, RW_MOE_W2, P, H, dh + o_w2, dh + o_w2s, &t2, &t2s);
    rw_moe_expert_tgt(RW_WFMT_FP8_BLOCK, RW_MOE_W13, P, H, dh + o_f, dh + o_fs, &tf, &tfs);
    rw_moe_op ops[64], fq[64];
    size_t n = 0, nq = 0;
#define OP(K, ES, SRC, LD, T, R0, C0, NR, NC)                                                      \
    do {                                                                                           \
        rw_moe_op o_;                                                                              \
        memset(&o_, 0, sizeof o_);                                                                 \
        o_.kind = (K), o_.esize = (ES), o_.src = (uint64_t)(uintptr_t)(SRC), o_.src_ld = (LD);     \
        o_.dst = (T), o_.dst_r0 = (R0), o_.dst_c0 = (C0), o_.rows = (NR), o_.cols = (NC);          \
        ops[n++] = o_;                                                                             \
    } while (0)
    /* bf16 copies: aligned whole rows, an odd rectangle, a source at an odd element offset */
    OP(RW_MOE_OP_COPY, 2, sb, H, tb, 0, 0, 100, H);
    OP(RW_MOE_OP_COPY, 2, sb + 3 * H + 5, H, tb, 100, 5, 77, 301);
    OP(RW_MOE_OP_COPY, 2, sb + 1, H - 1, tb, 300, 64, 50, 129);
    /* e4m3 copy and scale copy (swizzled) with odd edges */
    OP(RW_MOE_OP_COPY, 1, src + 7, 333, tm, 2, 3, 40, 333);
    OP(RW_MOE_OP_COPY, 1, src + 11, 16, tms, 0, 0, 150, 16); /* rows no MXQ op writes */
    /* MXQ from bf16: w13 rows and w2 (row shuffle), block-aligned column ranges */
    OP(RW_MOE_OP_MXQ, 2, sb + 64, H, tm, 200, 64, 120, 256);
    ops[n - 1].scl = tms;
    OP(RW_MOE_OP_MXQ, 2, sb + 3, 200, t2, 0, 32, H, 160);
    ops[n - 1].scl = t2s;
    /* MXQ from f32 */
    OP(RW_MOE_OP_MXQ, 4, sf, H, tm, 400, 0, 50, H);
    ops[n - 1].scl = tms;
    /* fp8 block ops: a full block, a partial one, one from f32 */
    const int64_t fr[3][4] = {{0, 0, 128, 128}, {128, 384, 70, 128}, {384, 128, 128, 33}};
    for (int k = 0; k < 3; k++) {
        rw_moe_op o;
        memset(&o, 0, sizeof o);
        o.kind = RW_MOE_OP_FP8Q;
        o.esize = k == 2 ? 4 : 2;
        o.src = k == 2 ? (uint64_t)(uintptr_t)sf : (uint64_t)(uintptr_t)(sb + k * 1000);
        o.src_ld = k == 2 ? 64 : H;
        o.dst = tf;
        o.scl = tfs;
        o.dst_r0 = fr[k][0];
        o.dst_c0 = fr[k][1];
        o.rows = (int32_t)fr[k][2];
        o.cols = (int32_t)fr[k][3];
        fq[nq++] = o;
    }
    rw_moe_ops_run_ref(ops, n);
    rw_moe_ops_run_ref(fq, nq);
    /* the same on the device */
    void *ds = to_dev(src, src_bytes), *dd = NULL;
    rw_err err = {0};
    RW_ASSERT_OK(rw_dev_malloc(dst_bytes, &dd, &err), &err);
    void *zero = calloc(dst_bytes, 1);
    RW_ASSERT_OK(rw_memcpy(dd, RW_PLACE_DEVICE, zero, RW_PLACE_HOST, dst_bytes, NULL, &err), &err);
    rw_moe_op dops[64], dfq[64];
    int64_t ub[65], acc = 0;
    for (size_t i = 0; i < n; i++) {
        dops[i] = rebase(ops[i], (uintptr_t)src, (uintptr_t)ds, (uintptr_t)dh, (uintptr_t)dd);
        ub[i] = acc;
        acc += rw_moe_op_units(&dops[i]);
    }
    ub[n] = acc;
    for (size_t i = 0; i < nq; i++)
        dfq[i] = rebase(fq[i], (uintptr_t)src, (uintptr_t)ds, (uintptr_t)dh, (uintptr_t)dd);
    void *dt = to_dev(dops, n * sizeof *dops), *du = to_dev(ub, (n + 1) * 8);
    void *dq = to_dev(dfq, nq * sizeof *dfq);
    RW_ASSERT_OK(rw_moe_scatter_cuda(dt, du, n, acc, NULL, &err), &err);
    RW_ASSERT_OK(rw_moe_fp8q_cuda(dq, nq, NULL, &err), &err);
    RW_ASSERT_OK(rw_stream_sync(NULL, &err), &err);
    uint8_t *got = to_host(dd, dst_bytes);
    rw_assert_bytes_equal(dh, got, dst_bytes, "CUDA scatter + fp8 quantize vs CPU reference");
    size_t nz = 0;
    for (size_t i = 0; i < dst_bytes; i++)
        nz += dh[i] != 0;
    assert_true(nz > (size_t)(100 * H)); /* the ops wrote something */
    rw_dev_free(ds);
    rw_dev_free(dd);
    rw_dev_free(dt);
    rw_dev_free(du);
    rw_dev_free(dq);
    free(src);
    free(dh);
    free(zero);
    free(got);
#undef OP
}

/* Device copies of a list's pieces (place DEVICE); the returned list owns the device buffers
 * through `dev` (freed by dev_free). */
static plist pl_to_device(const plist *l, void ***dev) {
    plist d = {0};
    *dev = calloc(l->n + 1, sizeof **dev);
    for (size_t i = 0; i < l->n; i++) {
        rw_piece p = l->p[i];
        size_t nb = rw_piece_nbytes(&p);
        (*dev)[i] = to_dev(p.data, nb);
        p.data = (*dev)[i];
        p.place = RW_PLACE_DEVICE;
        pl_push(&d, p, NULL);
    }
    return d;
}

static void dev_free_all(void **dev, size_t n) {
    for (size_t i = 0; i < n; i++)
        rw_dev_free(dev[i]);
    free(dev);
}

/* Applies `l` to a host set and (as device pieces, and as host pieces) to device sets of the
 * same rank; all three arenas must be identical and complete. */
static void check_device_apply(const rw_config *cfg, int T, int r, const plist *l, size_t nb,
                               const char *what) {
    rw_err err = {0};
    rw_wset *h = NULL, *d = NULL, *dh = NULL;
    RW_ASSERT_OK(rw_wset_create(cfg, T, r, RW_PLACE_HOST, 0, &h, &err), &err);
    RW_ASSERT_OK(rw_wset_create(cfg, T, r, RW_PLACE_DEVICE, 0, &d, &err), &err);
    RW_ASSERT_OK(rw_wset_create(cfg, T, r, RW_PLACE_DEVICE, 0, &dh, &err), &err);
    void **dev;
    plist dl = pl_to_device(l, &dev);
    rw_stream s = NULL;
    RW_ASSERT_OK(rw_stream_create(&s, &err), &err);
    for (size_t k = 0; k < nb; k++) {
        size_t b = l->n * k / nb, e = l->n * (k + 1) / nb;
        RW_ASSERT_OK(rw_wset_apply_batch(h, l->p + b, e - b, NULL, &err), &err);
        RW_ASSERT_OK(rw_wset_apply_batch(d, dl.p + b, e - b, s, &err), &err);
        RW_ASSERT_OK(rw_wset_apply_batch(dh, l->p + b, e - b, s, &err), &err);
    }
    RW_ASSERT_OK(rw_stream_sync(s, &err), &err);
    size_t n = rw_wset_bytes(h);
    assert_int_equal(rw_wset_bytes(d), n);
    uint8_t *gd = to_host(rw_arena_base(rw_wset_arena(d)), n);
    uint8_t *gh = to_host(rw_arena_base(rw_wset_arena(dh)), n);
    char msg[256];
    snprintf(msg, sizeof msg, "%s (TP %d rank %d): device set, device pieces", what, T, r);
    rw_assert_bytes_equal(rw_arena_base(rw_wset_arena(h)), gd, n, msg);
    snprintf(msg, sizeof msg, "%s (TP %d rank %d): device set, host pieces", what, T, r);
    rw_assert_bytes_equal(rw_arena_base(rw_wset_arena(h)), gh, n, msg);
    char miss[512];
    if (!rw_wset_complete(d, miss, sizeof miss))
        fail_msg("%s: device set incomplete: %s", what, miss);
    /* readback and checksums through the device set == host set */
    for (size_t i = 0; i < l->n; i += 7) {
        uint64_t a = 0, b = 1;
        RW_ASSERT_OK(rw_wset_checksum(h, l->p[i].name, &a, &err), &err);
        RW_ASSERT_OK(rw_wset_checksum(d, l->p[i].name, &b, &err), &err);
        if (a != b)
            fail_msg("%s: checksum of %s differs between host and device", what, l->p[i].name);
    }
    free(gd);
    free(gh);
    rw_stream_destroy(s);
    pl_free(&dl);
    dev_free_all(dev, l->n);
    rw_wset_destroy(h);
    rw_wset_destroy(d);
    rw_wset_destroy(dh);
}

/* Device apply_batch == host apply: bf16 / mxfp8 / fp8-block layers, whole tensors and trainer
 * shards in every form, at several T. */
static void test_device_wset_bf16_pieces(void **state) {
    (void)state;
    const rw_qmethod methods[] = {RW_QMETHOD_NONE, RW_QMETHOD_MXFP8, RW_QMETHOD_FP8_BLOCK};
    for (size_t mi = 0; mi < 3; mi++) {
        tmodel m;
        tm_random(&m, 256, 4, 768, 2, methods[mi], 1, 2000 + mi);
        tm_add_fused(&m, 0);
        tm_add_fused(&m, 1);
        plist whole = pl_whole_of(&m);
        const rw_wname w0 = {RW_W_EXP_GATE, 0, 0, false}; /* layer 0 names the format */
        for (size_t ti = 0; ti < 4; ti++) {
            int T = TPS[ti], r = T - 1;
            check_device_apply(&m.cfg, T, r, &whole, 1, "whole tensors");
            for (int mode = TM_PLAIN; mode <= TM_FUSED_ODD; mode++) {
                trainer_case tc;
                tc_make(&tc, &m, TPS[3 - ti], (tmode)mode, 31 * ti + (uint64_t)mode,
                        rw_wfmt_str(rw_quant_policy(&m.cfg, &w0)));
                check_device_apply(&m.cfg, T, r, &tc.l, 3, tc.what);
                pl_free(&tc.l);
            }
        }
        pl_free(&whole);
        tm_free(&m);
    }
}

/* Quantized checkpoints (e4m3 + scales, whole and sharded) on the device == host, including
 * fp8-block re-quantization of unaligned shards (device pieces staged through the host). */
static void test_device_wset_quantized_pieces(void **state) {
    (void)state;
    const rw_qmethod methods[] = {RW_QMETHOD_MXFP8, RW_QMETHOD_FP8_BLOCK};
    for (size_t mi = 0; mi < 2; mi++) {
        tmodel m, q;
        tm_random_quantized(&m, &q, 256, 4, 768, 2, methods[mi], 1, 2100 + mi);
        plist whole = pl_whole_of(&q);
        for (size_t ti = 0; ti < 4; ti++) {
            check_device_apply(&q.cfg, TPS[ti], TPS[ti] / 2, &whole, 2, "quantized checkpoint");
            plist l = {0};
            pl_trainer(&l, &q, 4, TM_ODD);
            pl_shuffle(&l, 5 + ti);
            check_device_apply(&q.cfg, TPS[ti], TPS[ti] / 2, &l, 4, "quantized checkpoint shards");
            pl_free(&l);
        }
        pl_free(&whole);
        tm_free(&m);
        tm_free(&q);
    }
}

/* Many small batches on one stream without synchronizing in between (the pinned op tables
 * alternate and must not be overwritten before the device has read them). */
static void test_device_many_batches(void **state) {
    (void)state;
    tmodel m;
    tm_random(&m, 256, 8, 768, 2, RW_QMETHOD_MXFP8, 1, 2200);
    plist l = {0};
    pl_trainer(&l, &m, 8, TM_PLAIN);
    pl_shuffle(&l, 9);
    check_device_apply(&m.cfg, 8, 5, &l, l.n, "one piece per batch");
    pl_free(&l);
    tm_free(&m);
}

/* A device allocation that cannot succeed is RW_E_OOM on every path of the module that allocates
 * (a batch's stream-ordered table, the pinned table slots, the weight set's arena), and the
 * failure is not reported again by the next CUDA call. */
static void test_device_oom(void **state) {
    (void)state;
    const size_t huge = (size_t)1 << 50; /* 1 PiB: more than any device or host holds */
    rw_err err = {0};
    void *p = NULL;
    assert_int_equal(rw_moe_dev_alloc_async(huge, NULL, &p, &err), RW_E_OOM);
    assert_null(p);
    rw_moe_host_slot sl = {0};
    assert_int_equal(rw_moe_slot_acquire(&sl, huge, &err), RW_E_OOM);
    assert_null(sl.host);
    rw_moe_slot_free(&sl);
    rw_config c; /* about 0.8 TB of experts in bf16 */
    moe_test_config(&c, 4096, 256, 8192, 16, RW_QMETHOD_NONE, 0);
    rw_wset *ws = NULL;
    assert_int_equal(rw_wset_create(&c, 1, 0, RW_PLACE_DEVICE, 0, &ws, &err), RW_E_OOM);
    assert_null(ws);
    rw_config_free(&c);
    /* the device still works */
    RW_ASSERT_OK(rw_moe_dev_alloc_async(4096, NULL, &p, &err), &err);
    rw_moe_dev_free_async(p, NULL);
    RW_ASSERT_OK(rw_stream_sync(NULL, &err), &err);
}

int main(void) {
    rw_test_require_gpu(1);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_pack_cuda_vs_ref),
        cmocka_unit_test(test_scatter_vs_ref),
        cmocka_unit_test(test_device_wset_bf16_pieces),
        cmocka_unit_test(test_device_wset_quantized_pieces),
        cmocka_unit_test(test_device_many_batches),
        cmocka_unit_test(test_device_oom),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
