/* test_wset.c - the weight set of one rank on the host (cpu suite): slicing from the unpadded
 * offsets for every T and I of docs/LAYOUT.md section 6 with zero pads and exact readback, trainer
 * pieces from any trainer TP degree (plain, Megatron gate_up, expert-parallel, odd K splits) giving
 * the same bytes as whole tensors, partial updates touching only their own bytes, idempotent
 * re-application, quantize on load == offline quantization (docs/TARGETS.md F5), fp8-block
 * re-quantization of unaligned shards, validation before any write, completeness and checksums. */
#include "moe_wset_util.h"
#include "moe_layout.h"

static const int TPS[] = {1, 2, 4, 8};
static const int64_t IS[] = {768, 1536, 96, 160};

static rw_wset *ws_new(const rw_config *c, int tp, int r) {
    rw_wset *ws = NULL;
    rw_err err = {0};
    RW_ASSERT_OK(rw_wset_create(c, tp, r, RW_PLACE_HOST, 0, &ws, &err), &err);
    return ws;
}

/* Applies the list in `nb` batches. */
static void apply_list(rw_wset *ws, const plist *l, size_t nb) {
    rw_err err = {0};
    for (size_t k = 0; k < nb; k++) {
        size_t b = l->n * k / nb, e = l->n * (k + 1) / nb;
        RW_ASSERT_OK(rw_wset_apply_batch(ws, l->p + b, e - b, NULL, &err), &err);
    }
}

static void assert_complete(const rw_wset *ws) {
    char miss[1024];
    if (!rw_wset_complete(ws, miss, sizeof miss)) fail_msg("weights incomplete: %s", miss);
}

static uint8_t *arena_copy(const rw_wset *ws) {
    size_t n = rw_wset_bytes(ws);
    uint8_t *c = malloc(n);
    memcpy(c, rw_arena_base(rw_wset_arena((rw_wset *)ws)), n);
    return c;
}

static void assert_arena_eq(const rw_wset *a, const uint8_t *want, const char *what) {
    rw_assert_bytes_equal(want, rw_arena_base(rw_wset_arena((rw_wset *)a)), rw_wset_bytes(a), what);
}

/* Rows / columns [b, e) along dim of a 2-D (or 1-D) tensor, contiguous. */
static void *slice2d(const void *x, int64_t R, int64_t C, int dim, int64_t b, int64_t e,
                     size_t es) {
    int64_t r0 = dim == 0 ? b : 0, r1 = dim == 0 ? e : R, c0 = dim == 1 ? b : 0,
            c1 = dim == 1 ? e : C;
    uint8_t *o = malloc((size_t)((r1 - r0) * (c1 - c0)) * es + 1);
    for (int64_t r = r0; r < r1; r++)
        memcpy(o + (size_t)((r - r0) * (c1 - c0)) * es,
               (const uint8_t *)x + (size_t)(r * C + c0) * es, (size_t)(c1 - c0) * es);
    return o;
}

static void assert_readback(const rw_wset *ws, const char *name, const void *want, size_t len) {
    size_t got_len = 0;
    rw_err err = {0};
    RW_ASSERT_OK(rw_wset_readback(ws, name, NULL, 0, &got_len, NULL, NULL, &err), &err);
    if (got_len != len) fail_msg("%s: readback %zu bytes, expected %zu", name, got_len, len);
    void *buf = malloc(len + 1);
    RW_ASSERT_OK(rw_wset_readback(ws, name, buf, len, &got_len, NULL, NULL, &err), &err);
    rw_assert_bytes_equal(want, buf, len, name);
    free(buf);
}

/* Local fp8 128x128 block quantization of an f32 [rows, cols] matrix (the re-quantization the
 * rank performs), written here from the rule of quant/rw_quant.h. */
static void fp8_local_quant(const float *x, int64_t rows, int64_t cols, uint8_t *q, float *s) {
    int64_t sc = (cols + 127) / 128;
    for (int64_t bi = 0; bi * 128 < rows; bi++)
        for (int64_t bj = 0; bj * 128 < cols; bj++) {
            uint32_t m = 0;
            for (int64_t r = bi * 128; r < rows && r < bi * 128 + 128; r++)
                for (int64_t c = bj * 128; c < cols && c < bj * 128 + 128; c++) {
                    uint32_t a = rw_f32_bits(x[r * cols + c]) & 0x7fffffffu;
                    if (a > m) m = a;
                }
            float scale = rw_fp8_block_scale_from_amax(rw_bits_f32(m));
            s[bi * sc + bj] = scale;
            for (int64_t r = bi * 128; r < rows && r < bi * 128 + 128; r++)
                for (int64_t c = bj * 128; c < cols && c < bj * 128 + 128; c++)
                    q[r * cols + c] = rw_fp8_block_quantize_elem(x[r * cols + c], scale);
        }
}

/* ------------------------------------------------------------------------------------------ */

/* I = 768, T = 8, r = 3 through the weight set: the rank holds rows / columns [288, 384) of
 * gate, up and down, from per-expert tensors and from the fused form. */
static void test_seed_regression(void **state) {
    (void)state;
    tmodel m;
    tm_random(&m, 256, 4, 768, 1, RW_QMETHOD_NONE, 0, 11);
    tm_add_fused(&m, 0);
    rw_wset *a = ws_new(&m.cfg, 8, 3), *b = ws_new(&m.cfg, 8, 3);
    plist la = {0}, lb = {0};
    pl_whole(&la, &m);
    apply_list(a, &la, 1);
    assert_complete(a);
    /* the same model from the fused tensors (whole) plus everything else */
    for (size_t i = 0; i < la.n; i++)
        if (!strstr(la.p[i].name, ".mlp.experts.")) pl_push(&lb, la.p[i], NULL);
    pl_push(&lb, piece_whole(tm_find(&m, "model.layers.0.mlp.experts.gate_up_proj")), NULL);
    pl_push(&lb, piece_whole(tm_find(&m, "model.layers.0.mlp.experts.down_proj")), NULL);
    apply_list(b, &lb, 1);
    assert_complete(b);
    uint8_t *ca = arena_copy(a);
    assert_arena_eq(b, ca, "fused vs per-expert");
    const char *names[3] = {"model.layers.0.mlp.experts.2.gate_proj.weight",
                            "model.layers.0.mlp.experts.2.up_proj.weight",
                            "model.layers.0.mlp.experts.2.down_proj.weight"};
    for (int k = 0; k < 3; k++) {
        ttensor *t = tm_find(&m, names[k]);
        void *want = slice2d(t->data, t->shape[0], t->shape[1], k == 2 ? 1 : 0, 288, 384, 2);
        assert_readback(a, names[k], want, 96 * 256 * 2);
        /* what the padded offset would have read, [384, 480), is not what the rank holds */
        void *wrong = slice2d(t->data, t->shape[0], t->shape[1], k == 2 ? 1 : 0, 384, 480, 2);
        assert_memory_not_equal(want, wrong, 96 * 256 * 2);
        free(want);
        free(wrong);
    }
    /* readback of the fused name: [E, 2S, H], gate slice then up slice per expert */
    ttensor *gu = tm_find(&m, "model.layers.0.mlp.experts.gate_up_proj");
    size_t len = 4 * 192 * 256 * 2;
    uint16_t *want = malloc(len);
    const uint16_t *x = gu->data;
    for (int e = 0; e < 4; e++) {
        memcpy(want + e * 192 * 256, x + (e * 1536 + 288) * 256, 96 * 256 * 2);
        memcpy(want + e * 192 * 256 + 96 * 256, x + (e * 1536 + 768 + 288) * 256, 96 * 256 * 2);
    }
    assert_readback(a, "model.layers.0.mlp.experts.gate_up_proj", want, len);
    free(want);
    free(ca);
    pl_free(&la);
    pl_free(&lb);
    rw_wset_destroy(a);
    rw_wset_destroy(b);
    tm_free(&m);
}

/* Checks the pads of every local expert of layer l are zero (unpacking the arena). */
static void assert_pads_zero(const rw_wset *ws, int l) {
    const rw_layer_weights *lw = rw_wset_layer(ws, l);
    const rw_tp_dims *d = rw_wset_dims(ws);
    int64_t P = d->P, S = d->S, H = rw_wset_config(ws)->hidden_size;
    rw_wfmt f = lw->moe_fmt;
    size_t es = f == RW_WFMT_BF16 ? 2 : 1;
    for (int e = 0; e < rw_wset_config(ws)->num_experts; e++) {
        for (int mi = 0; mi < 2; mi++) {
            rw_moe_mat m = mi ? RW_MOE_W2 : RW_MOE_W13;
            int64_t rows = mi ? H : 2 * P, cols = mi ? P : H;
            size_t pb = rw_moe_packed_bytes(f, m, P, H),
                   psb = rw_moe_packed_scale_bytes(f, m, P, H);
            const rw_tensor *t = mi ? &lw->w2 : &lw->w13, *ts = mi ? &lw->w2_scale : &lw->w13_scale;
            uint8_t *lg = malloc(pb), *lsc = malloc(psb + (size_t)(rows * cols) + 1);
            rw_moe_unpack_ref(f, m, P, H, (uint8_t *)t->data + e * pb,
                              ts->data ? (uint8_t *)ts->data + e * psb : NULL, lg, lsc);
            for (int64_t r = 0; r < rows; r++)
                for (int64_t c = 0; c < cols; c++) {
                    bool pad = mi ? c >= S : (r % P) >= S;
                    if (!pad) continue;
                    for (size_t k = 0; k < es; k++)
                        if (lg[(size_t)(r * cols + c) * es + k])
                            fail_msg("layer %d expert %d %s: pad element (%lld, %lld) is not zero",
                                     l, e, mi ? "w2" : "w13", (long long)r, (long long)c);
                }
            if (f == RW_WFMT_MXFP8) {
                int64_t sc = cols / 32;
                for (int64_t r = 0; r < rows; r++)
                    for (int64_t j = 0; j < sc; j++) {
                        bool pad = mi ? j >= S / 32 : (r % P) >= S;
                        if (pad && lsc[r * sc + j])
                            fail_msg("layer %d expert %d: pad scale (%lld, %lld) is not zero", l, e,
                                     (long long)r, (long long)j);
                    }
            }
            free(lg);
            free(lsc);
        }
    }
}

/* Every T and I of section 6, bf16 / mxfp8 / fp8-block: whole tensors give complete weights,
 * readback equals the canonical slice (or its quantization: offline mxfp8, local fp8 blocks),
 * pads are zero; mxfp8 refuses shards with S % 32 != 0. */
static void test_slices_every_T_I(void **state) {
    (void)state;
    const rw_qmethod methods[] = {RW_QMETHOD_NONE, RW_QMETHOD_MXFP8, RW_QMETHOD_FP8_BLOCK};
    for (size_t mi = 0; mi < 3; mi++)
        for (size_t ii = 0; ii < 4; ii++) {
            tmodel m, q;
            tm_random_quantized(&m, &q, 256, 2, IS[ii], 1, methods[mi], 0, 100 + ii);
            plist l = pl_whole_of(&m);
            for (size_t ti = 0; ti < 4; ti++) {
                int T = TPS[ti];
                int64_t S = IS[ii] / T;
                for (int r = 0; r < T; r++) {
                    if (methods[mi] == RW_QMETHOD_MXFP8 && S % 32) {
                        rw_wset *ws = NULL;
                        rw_err err = {0};
                        assert_int_equal(rw_wset_create(&m.cfg, T, r, RW_PLACE_HOST, 0, &ws, &err),
                                         RW_E_UNSUPPORTED);
                        assert_null(ws);
                        break;
                    }
                    rw_wset *ws = ws_new(&m.cfg, T, r);
                    apply_list(ws, &l, 1);
                    assert_complete(ws);
                    assert_pads_zero(ws, 0);
                    for (size_t i = 0; i < m.n; i++) {
                        const ttensor *t = &m.t[i];
                        rw_wname w;
                        rw_err err = {0};
                        RW_ASSERT_OK(rw_name_parse(t->name, &m.cfg, &w, &err), &err);
                        rw_shard_plan p;
                        RW_ASSERT_OK(rw_moe_plan_tensor(&m.cfg, T, r, &w, &p, &err), &err);
                        int64_t R = t->ndim == 1 ? 1 : t->shape[0];
                        int64_t C = t->ndim == 1 ? t->shape[0] : t->shape[1];
                        int dim = t->ndim == 1 ? -1 : p.dim;
                        int64_t vr = dim == 0 ? p.src_end - p.src_begin : R;
                        int64_t vc = dim == 1 ? p.src_end - p.src_begin : C;
                        rw_wfmt f = rw_quant_policy(&m.cfg, &w);
                        if (f == RW_WFMT_BF16) {
                            void *want = slice2d(t->data, R, C, dim, p.src_begin, p.src_end, 2);
                            assert_readback(ws, t->name, want, (size_t)(vr * vc) * 2);
                            free(want);
                            continue;
                        }
                        char sn[176];
                        snprintf(sn, sizeof sn, "%s_scale_inv", t->name);
                        if (f == RW_WFMT_MXFP8) {
                            const ttensor *qt = tm_find(&q, t->name), *qs = tm_find(&q, sn);
                            void *want = slice2d(qt->data, R, C, dim, p.src_begin, p.src_end, 1);
                            assert_readback(ws, t->name, want, (size_t)(vr * vc));
                            free(want);
                            want = slice2d(qs->data, R, C / 32, dim,
                                           dim == 1 ? p.src_begin / 32 : p.src_begin,
                                           dim == 1 ? p.src_end / 32 : p.src_end, 1);
                            assert_readback(ws, sn, want, (size_t)(vr * vc / 32));
                            free(want);
                        } else {
                            uint16_t *sl = slice2d(t->data, R, C, dim, p.src_begin, p.src_end, 2);
                            int64_t sr = (vr + 127) / 128, sc = (vc + 127) / 128;
                            uint8_t *wq = malloc((size_t)(vr * vc));
                            float *wsc = malloc(sizeof(float) * (size_t)(sr * sc));
                            RW_ASSERT_OK(rw_quant_fp8_block_ref(sl, vr, vc, wq, wsc, &err), &err);
                            assert_readback(ws, t->name, wq, (size_t)(vr * vc));
                            assert_readback(ws, sn, wsc, sizeof(float) * (size_t)(sr * sc));
                            free(sl);
                            free(wq);
                            free(wsc);
                        }
                    }
                    rw_wset_destroy(ws);
                }
            }
            pl_free(&l);
            tm_free(&m);
            tm_free(&q);
        }
}

/* Arrival orders of the trainer forms: the shuffle seed of trainer TP index ti, form `mode`,
 * worker rank r is a * ti + b * mode + c * r + d. */
typedef struct seed_rule {
    uint64_t a, b, c, d;
} seed_rule;

/* For every worker TP and rank: the pieces of every trainer TP in each form of `modes`, shuffled
 * and applied in `batches` batches, give the same arena as `whole` applied at once, and complete
 * weights. `label` names the model in failures. */
static void check_trainer_forms(const tmodel *m, const plist *whole, const tmode *modes,
                                size_t nmodes, seed_rule sr, size_t batches, const char *label) {
    for (size_t wi = 0; wi < 4; wi++) {
        int W = TPS[wi];
        for (int r = 0; r < W; r++) {
            rw_wset *ref = ws_new(&m->cfg, W, r);
            apply_list(ref, whole, 1);
            assert_complete(ref);
            uint8_t *want = arena_copy(ref);
            for (size_t ti = 0; ti < 4; ti++)
                for (size_t k = 0; k < nmodes; k++) {
                    trainer_case tc;
                    tc_make(&tc, m, TPS[ti], modes[k],
                            sr.a * ti + sr.b * (uint64_t)modes[k] + sr.c * (uint64_t)r + sr.d,
                            label);
                    rw_wset *ws = ws_new(&m->cfg, W, r);
                    apply_list(ws, &tc.l, batches);
                    char what[224];
                    snprintf(what, sizeof what, "%s -> worker TP %d rank %d", tc.what, W, r);
                    assert_arena_eq(ws, want, what);
                    char miss[512];
                    if (!rw_wset_complete(ws, miss, sizeof miss))
                        fail_msg("%s: incomplete: %s", what, miss);
                    rw_wset_destroy(ws);
                    pl_free(&tc.l);
                }
            free(want);
            rw_wset_destroy(ref);
        }
    }
}

/* Trainer pieces: for trainer TP in {1,2,4,8} x worker TP in {1,2,4,8}, every rank, in every
 * piece form (Megatron TP shards, fused gate_up in the Megatron form, expert-parallel shards
 * of the fused tensors, odd splits along K, fused tensors cut across the gate / up boundary),
 * shuffled and in several batches: the packed bytes
 * equal those from whole tensors. bf16, mxfp8 and fp8-block layers (quantize on load, with
 * staging of partly covered blocks). */
static void test_trainer_pieces(void **state) {
    (void)state;
    const rw_qmethod methods[] = {RW_QMETHOD_NONE, RW_QMETHOD_MXFP8, RW_QMETHOD_FP8_BLOCK};
    const tmode modes[] = {TM_PLAIN, TM_GATE_UP, TM_EP, TM_ODD, TM_FUSED_ODD};
    for (size_t mi = 0; mi < 3; mi++) {
        tmodel m;
        tm_random(&m, 128, 2, 768, 1, methods[mi], 0, 200 + mi);
        tm_add_fused(&m, 0);
        plist whole = pl_whole_of(&m);
        const rw_wname w0 = {RW_W_EXP_GATE, 0, 0, false};
        check_trainer_forms(&m, &whole, modes, 5, (seed_rule){1000, 10, 1, 0}, 3,
                            rw_wfmt_str(rw_quant_policy(&m.cfg, &w0)));
        pl_free(&whole);
        tm_free(&m);
    }
}

/* Quantized checkpoints sharded by a trainer (e4m3 split like Megatron or along K at odd
 * offsets, scales whole) give the same bytes as the whole checkpoint. For fp8-block with
 * S % 128 != 0 this runs the per-rank re-quantization through staging. */
static void test_quantized_checkpoint_pieces(void **state) {
    (void)state;
    const rw_qmethod methods[] = {RW_QMETHOD_MXFP8, RW_QMETHOD_FP8_BLOCK};
    const tmode modes[] = {TM_PLAIN, TM_ODD};
    for (size_t mi = 0; mi < 2; mi++) {
        tmodel m, q;
        tm_random_quantized(&m, &q, 128, 2, 768, 1, methods[mi], 0, 300 + mi);
        plist whole = pl_whole_of(&q);
        check_trainer_forms(&q, &whole, modes, 2, (seed_rule){1, 1, 0, 77}, 4,
                            methods[mi] == RW_QMETHOD_MXFP8 ? "mxfp8 checkpoint"
                                                            : "fp8 checkpoint");
        pl_free(&whole);
        tm_free(&m);
        tm_free(&q);
    }
}

/* F5: bf16 weights pushed to a worker serving mxfp8-last-1-bf16 (quantize on load, whole or in
 * trainer shards) give the same packed bytes as loading the offline-quantized checkpoint; for
 * fp8-block the same holds where every local block is a canonical block (T = 1 here; at T = 2
 * the k/v rows [64, 128) already straddle a block, so the checkpoint is re-quantized). */
static void test_quantize_on_load(void **state) {
    (void)state;
    const rw_qmethod methods[] = {RW_QMETHOD_MXFP8, RW_QMETHOD_FP8_BLOCK};
    for (size_t mi = 0; mi < 2; mi++) {
        tmodel m, q;
        tm_random_quantized(&m, &q, 256, 2, 768, 2, methods[mi], 1, 400 + mi);
        plist lb = {0}, lq = {0}, lt = {0};
        pl_whole(&lb, &m);
        pl_whole(&lq, &q);
        pl_trainer(&lt, &m, 8, TM_ODD);
        for (size_t wi = 0; wi < (mi == 0 ? 4 : 1); wi++)
            for (int r = 0; r < TPS[wi]; r++) {
                rw_wset *a = ws_new(&m.cfg, TPS[wi], r), *b = ws_new(&m.cfg, TPS[wi], r),
                        *t = ws_new(&m.cfg, TPS[wi], r);
                assert_int_equal(rw_wset_layer(a, 0)->moe_fmt,
                                 mi == 0 ? RW_WFMT_MXFP8 : RW_WFMT_FP8_BLOCK);
                assert_int_equal(rw_wset_layer(a, 0)->attn_fmt,
                                 mi == 0 ? RW_WFMT_MXFP8 : RW_WFMT_FP8_BLOCK);
                assert_int_equal(rw_wset_layer(a, 1)->moe_fmt, RW_WFMT_BF16);
                assert_int_equal(rw_wset_layer(a, 1)->attn_fmt, RW_WFMT_BF16);
                apply_list(a, &lb, 1);
                apply_list(b, &lq, 2);
                apply_list(t, &lt, 5);
                assert_complete(a);
                assert_complete(b);
                assert_complete(t);
                uint8_t *wa = arena_copy(a);
                assert_arena_eq(b, wa, "offline-quantized checkpoint vs quantize on load");
                assert_arena_eq(t, wa, "bf16 trainer shards vs whole bf16");
                free(wa);
                rw_wset_destroy(a);
                rw_wset_destroy(b);
                rw_wset_destroy(t);
            }
        pl_free(&lt);
        pl_free(&lb);
        pl_free(&lq);
        tm_free(&m);
        tm_free(&q);
    }
}

/* fp8-block checkpoints with S % 128 != 0: the rank holds its own re-quantization of the
 * dequantized checkpoint values (local 128x128 blocks of its padded up-first shard). */
static void test_fp8_requantize_unaligned(void **state) {
    (void)state;
    const int64_t Is[] = {768, 160};
    for (int k = 0; k < 2; k++) {
        tmodel m, q;
        tm_random_quantized(&m, &q, 256, 2, Is[k], 1, RW_QMETHOD_FP8_BLOCK, 0, 500 + k);
        plist l = pl_whole_of(&q);
        int T = 8, r = 3;
        int64_t I = Is[k], S = I / T, H = 256;
        rw_wset *ws = ws_new(&q.cfg, T, r);
        apply_list(ws, &l, 1);
        assert_complete(ws);
        const char *nm[2] = {"model.layers.0.mlp.experts.1.up_proj.weight",
                             "model.layers.0.mlp.experts.1.down_proj.weight"};
        for (int j = 0; j < 2; j++) {
            const ttensor *qt = tm_find(&q, nm[j]);
            char sn[176];
            snprintf(sn, sizeof sn, "%s_scale_inv", nm[j]);
            const ttensor *qs = tm_find(&q, sn);
            int64_t R = qt->shape[0], C = qt->shape[1];
            float *deq = malloc(sizeof(float) * (size_t)(R * C));
            rw_dequant_fp8_block_ref(qt->data, qs->data, R, C, deq);
            float *sl = slice2d(deq, R, C, j == 0 ? 0 : 1, r * S, (r + 1) * S, 4);
            int64_t vr = j == 0 ? S : H, vc = j == 0 ? H : S;
            int64_t sr = (vr + 127) / 128, sc = (vc + 127) / 128;
            uint8_t *wq = malloc((size_t)(vr * vc));
            float *wsc = malloc(sizeof(float) * (size_t)(sr * sc));
            fp8_local_quant(sl, vr, vc, wq, wsc);
            assert_readback(ws, nm[j], wq, (size_t)(vr * vc));
            assert_readback(ws, sn, wsc, sizeof(float) * (size_t)(sr * sc));
            free(deq);
            free(sl);
            free(wq);
            free(wsc);
        }
        rw_wset_destroy(ws);
        pl_free(&l);
        tm_free(&m);
        tm_free(&q);
    }
}

/* Marks every byte that unit (expert e's `kind` weight, plus its scale) may occupy. */
static void mark_expert_bytes(const rw_wset *ws, int l, int e, rw_wkind kind, uint8_t *mask) {
    const rw_layer_weights *lw = rw_wset_layer(ws, l);
    const rw_tp_dims *d = rw_wset_dims(ws);
    int64_t P = d->P, S = d->S, H = rw_wset_config(ws)->hidden_size;
    rw_moe_mat m = kind == RW_W_EXP_DOWN ? RW_MOE_W2 : RW_MOE_W13;
    const rw_tensor *t = m == RW_MOE_W2 ? &lw->w2 : &lw->w13;
    const rw_tensor *ts = m == RW_MOE_W2 ? &lw->w2_scale : &lw->w13_scale;
    size_t pb = rw_moe_packed_bytes(lw->moe_fmt, m, P, H);
    size_t psb = rw_moe_packed_scale_bytes(lw->moe_fmt, m, P, H);
    uint8_t *base = rw_arena_base(rw_wset_arena((rw_wset *)ws));
    size_t dofs = (size_t)((uint8_t *)t->data - base) + (size_t)e * pb;
    size_t sofs = ts->data ? (size_t)((uint8_t *)ts->data - base) + (size_t)e * psb : 0;
    rw_moe_tgt td, tsc;
    rw_moe_expert_tgt(lw->moe_fmt, m, P, H, NULL, NULL, &td, &tsc);
    int64_t r0 = kind == RW_W_EXP_GATE ? P : 0;
    int64_t rows = m == RW_MOE_W2 ? H : S, cols = m == RW_MOE_W2 ? S : H;
    size_t es = lw->moe_fmt == RW_WFMT_BF16 ? 2 : 1;
    for (int64_t r = 0; r < rows; r++)
        for (int64_t c = 0; c < cols; c++) {
            size_t o = dofs + (size_t)rw_moe_tgt_offset(&td, r0 + r, c) * es;
            for (size_t k = 0; k < es; k++)
                mask[o + k] = 1;
            if (lw->moe_fmt == RW_WFMT_MXFP8 && c % 32 == 0)
                mask[sofs + (size_t)rw_moe_tgt_offset(&tsc, r0 + r, c / 32)] = 1;
        }
}

/* A partial update (one expert's up_proj in trainer shards, and rows of one q_proj) changes
 * exactly the bytes of those targets and equals a fresh load of the updated model; the
 * untouched bytes stay identical. bf16 and mxfp8 layers. */
static void test_partial_update(void **state) {
    (void)state;
    const rw_qmethod methods[] = {RW_QMETHOD_NONE, RW_QMETHOD_MXFP8};
    for (size_t mi = 0; mi < 2; mi++) {
        rw_config c, c2;
        moe_test_config(&c, 256, 4, 768, 2, methods[mi], 0);
        moe_test_config(&c2, 256, 4, 768, 2, methods[mi], 0);
        tmodel m, m2;
        tm_make(&m, &c, 600);
        tm_make(&m2, &c2, 600);
        /* m2: expert 2 up_proj of layer 1 replaced, rows [64, 128) of layer 0 q_proj changed */
        ttensor *up = tm_find(&m2, "model.layers.1.mlp.experts.2.up_proj.weight");
        free(up->data);
        up->data = moe_test_rand_bf16((size_t)(768 * 256), 601, 0.7f);
        ttensor *qp = tm_find(&m2, "model.layers.0.self_attn.q_proj.weight");
        uint16_t *nq = moe_test_rand_bf16((size_t)(64 * 256), 602, 0.7f);
        memcpy((uint16_t *)qp->data + 64 * 256, nq, 64 * 256 * 2);
        free(nq);
        plist l1 = {0}, l2 = {0}, upd = {0};
        pl_whole(&l1, &m);
        pl_whole(&l2, &m2);
        pl_split(&upd, up, 0, 3, NULL); /* the update arrives as three row shards */
        pl_shard(&upd, qp, 0, 64, 64);
        for (int T = 1; T <= 8; T *= 2)
            for (int r = 0; r < T; r += (T > 2 ? 3 : 1)) {
                rw_wset *ws = ws_new(&m.cfg, T, r), *fresh = ws_new(&m2.cfg, T, r);
                apply_list(ws, &l1, 1);
                uint8_t *before = arena_copy(ws);
                rw_wset_mark_clear(ws);
                apply_list(ws, &upd, 1);
                apply_list(fresh, &l2, 1);
                uint8_t *want = arena_copy(fresh);
                assert_arena_eq(ws, want, "partial update vs fresh load of the updated model");
                /* every changed byte belongs to the targets */
                size_t n = rw_wset_bytes(ws);
                uint8_t *mask = calloc(n, 1), *now = arena_copy(ws);
                mark_expert_bytes(ws, 1, 2, RW_W_EXP_UP, mask);
                const rw_layer_weights *l0 = rw_wset_layer(ws, 0);
                uint8_t *base = rw_arena_base(rw_wset_arena(ws));
                size_t qo = (size_t)((uint8_t *)l0->q.data - base);
                memset(mask + qo, 1, rw_tensor_nbytes(&l0->q));
                if (l0->q_scale.data)
                    memset(mask + (size_t)((uint8_t *)l0->q_scale.data - base), 1,
                           rw_tensor_nbytes(&l0->q_scale));
                size_t changed = 0;
                for (size_t i = 0; i < n; i++) {
                    if (before[i] == now[i]) continue;
                    changed++;
                    if (!mask[i])
                        fail_msg("T=%d r=%d: byte %zu outside the update changed", T, r, i);
                }
                assert_true(changed > 0);
                /* the update alone is not a complete model: completeness names what is missing */
                char miss[256];
                assert_false(rw_wset_complete(ws, miss, sizeof miss));
                assert_non_null(strstr(miss, "model.embed_tokens.weight"));
                free(before);
                free(want);
                free(mask);
                free(now);
                rw_wset_destroy(ws);
                rw_wset_destroy(fresh);
            }
        pl_free(&l1);
        pl_free(&l2);
        pl_free(&upd);
        tm_free(&m);
        tm_free(&m2);
    }
}

/* Applying the same weights twice (whole, then as trainer shards) leaves every byte identical. */
static void test_apply_twice(void **state) {
    (void)state;
    const rw_qmethod methods[] = {RW_QMETHOD_NONE, RW_QMETHOD_MXFP8, RW_QMETHOD_FP8_BLOCK};
    for (size_t mi = 0; mi < 3; mi++) {
        tmodel m;
        tm_random(&m, 256, 2, 768, 1, methods[mi], 0, 700);
        plist l = {0}, t = {0};
        pl_whole(&l, &m);
        pl_trainer(&t, &m, 4, TM_ODD);
        rw_wset *ws = ws_new(&m.cfg, 8, 5);
        apply_list(ws, &l, 1);
        uint8_t *once = arena_copy(ws);
        rw_wset_mark_clear(ws);
        apply_list(ws, &l, 1);
        assert_arena_eq(ws, once, "second whole apply");
        assert_complete(ws);
        rw_wset_mark_clear(ws);
        apply_list(ws, &t, 2);
        assert_arena_eq(ws, once, "third apply, as trainer shards");
        assert_complete(ws);
        free(once);
        rw_wset_destroy(ws);
        pl_free(&l);
        pl_free(&t);
        tm_free(&m);
    }
}

typedef struct vcase {
    rw_piece p;
    rw_status want;
    const char *needle;
} vcase;

/* Validation refuses, before anything is written, wrong names, layers, dtypes, shapes, ranges,
 * layouts and byte counts, with a message naming the tensor. */
static void test_validation(void **state) {
    (void)state;
    tmodel m;
    tm_random(&m, 256, 2, 768, 2, RW_QMETHOD_MXFP8, 1, 800);
    rw_wset *ws = ws_new(&m.cfg, 2, 1);
    const ttensor *g0 = tm_find(&m, "model.layers.0.mlp.experts.1.gate_proj.weight");
    const ttensor *g1 = tm_find(&m, "model.layers.1.mlp.experts.1.gate_proj.weight");
    rw_err err = {0};
    vcase cases[20];
    int n = 0;
    rw_piece p = piece_whole(g0);
    p.name = "model.layers.0.mlp.experts.1.gate_projx.weight";
    cases[n++] = (vcase){p, RW_E_NOT_FOUND, "gate_projx"};
    p = piece_whole(g0);
    p.name = "model.layers.7.mlp.experts.1.gate_proj.weight";
    cases[n++] = (vcase){p, RW_E_RANGE, "layers.7"};
    p = piece_whole(g0);
    p.name = "model.layers.0.mlp.experts.9.gate_proj.weight";
    cases[n++] = (vcase){p, RW_E_RANGE, "experts.9"};
    p = piece_whole(g1); /* layer 1 is bf16: e4m3 is wrong there */
    p.dtype = RW_DTYPE_E4M3;
    cases[n++] = (vcase){p, RW_E_DTYPE, g1->name};
    p = piece_whole(g0);
    p.dtype = RW_DTYPE_F32;
    cases[n++] = (vcase){p, RW_E_DTYPE, g0->name};
    p = piece_whole(g1);
    p.name = "model.layers.1.mlp.experts.1.gate_proj.weight_scale_inv";
    p.dtype = RW_DTYPE_U8;
    cases[n++] = (vcase){p, RW_E_NOT_FOUND, "weight_scale_inv"};
    p = piece_whole(g0);
    p.name = "model.layers.0.mlp.experts.1.gate_proj.weight_scale_inv";
    p.dtype = RW_DTYPE_F32;
    p.shape[1] = 256 / 32;
    cases[n++] = (vcase){p, RW_E_DTYPE, "weight_scale_inv"};
    p = piece_whole(g0);
    p.name = "model.layers.0.mlp.experts.1.gate_proj.weight_scale_inv";
    p.dtype = RW_DTYPE_U8;
    p.shape[1] = 256; /* should be 256 / 32 */
    cases[n++] = (vcase){p, RW_E_SHAPE, "weight_scale_inv"};
    p = piece_whole(g0);
    p.shape[0] = 767;
    cases[n++] = (vcase){p, RW_E_SHAPE, g0->name};
    p = piece_whole(g0);
    p.ndim = 3;
    cases[n++] = (vcase){p, RW_E_SHAPE, g0->name};
    p = piece_whole(g0);
    p.shard_dim = 0, p.shard_begin = 700, p.shard_len = 100;
    p.nbytes = 0;
    cases[n++] = (vcase){p, RW_E_RANGE, g0->name};
    p = piece_whole(g0);
    p.shard_dim = 2, p.shard_begin = 0, p.shard_len = 1;
    cases[n++] = (vcase){p, RW_E_RANGE, g0->name};
    p = piece_whole(g0);
    p.shard_dim = 1, p.shard_begin = 0, p.shard_len = 0;
    cases[n++] = (vcase){p, RW_E_RANGE, g0->name};
    p = piece_whole(g0);
    p.nbytes -= 2;
    cases[n++] = (vcase){p, RW_E_SHAPE, g0->name};
    p = piece_whole(g0);
    p.shard_dim = 0, p.shard_begin = 0, p.shard_len = 384; /* nbytes still of the whole tensor */
    cases[n++] = (vcase){p, RW_E_SHAPE, "bytes"};
    p = piece_whole(g0);
    p.shard_dim = 1, p.shard_begin = 0, p.shard_len = 64, p.layout = RW_PIECE_GATE_UP;
    p.nbytes = 0;
    cases[n++] = (vcase){p, RW_E_INVALID_ARG, g0->name};
    p = piece_whole(g0);
    p.data = NULL;
    cases[n++] = (vcase){p, RW_E_INVALID_ARG, g0->name};
    p = piece_whole(g0);
    p.name = "model.layers.0.mlp.experts.gate_up_proj";
    p.ndim = 3, p.shape[0] = 2, p.shape[1] = 1536, p.shape[2] = 256;
    p.dtype = RW_DTYPE_E4M3, p.nbytes = 0;
    cases[n++] = (vcase){p, RW_E_DTYPE, "gate_up_proj"};
    for (int i = 0; i < n; i++) {
        char what[128];
        snprintf(what, sizeof what, "case %d (%s)", i, cases[i].p.name);
        rw_assert_status(rw_wset_validate_piece(ws, &cases[i].p, &err), cases[i].want, &err,
                         cases[i].needle, what);
        /* in a batch after a valid piece: refused, and nothing written */
        rw_piece batch[2] = {piece_whole(g0), cases[i].p};
        assert_int_equal(rw_wset_apply_batch(ws, batch, 2, NULL, &err), cases[i].want);
        const uint8_t *b = rw_arena_base(rw_wset_arena(ws));
        for (size_t k = 0; k < rw_wset_bytes(ws); k++)
            if (b[k]) fail_msg("case %d: byte %zu written by a refused batch", i, k);
    }
    /* tied embeddings: lm_head is not a tensor of its own */
    rw_config ct;
    moe_test_config(&ct, 256, 2, 768, 1, RW_QMETHOD_NONE, 0);
    ct.tie_word_embeddings = true;
    rw_wset *wt = ws_new(&ct, 1, 0);
    rw_piece lh = piece_whole(g0);
    lh.name = "lm_head.weight";
    lh.shape[0] = 200, lh.shape[1] = 256;
    assert_int_equal(rw_wset_validate_piece(wt, &lh, &err), RW_E_NOT_FOUND);
    assert_non_null(strstr(err.msg, "lm_head"));
    char miss[256];
    assert_false(rw_wset_complete(wt, miss, sizeof miss));
    assert_null(strstr(miss, "lm_head"));
    rw_wset_destroy(wt);
    rw_config_free(&ct);
    rw_wset_destroy(ws);
    tm_free(&m);
}

/* Completeness: pieces in parts (including a quantization block split across batches, and fp8
 * e4m3 whose scales come in a later batch) complete a tensor only once everything arrived;
 * rw_wset_complete names what is missing; mark_clear starts over. */
static void test_completeness(void **state) {
    (void)state;
    const rw_qmethod methods[] = {RW_QMETHOD_MXFP8, RW_QMETHOD_FP8_BLOCK};
    for (size_t mi = 0; mi < 2; mi++) {
        tmodel m, q;
        tm_random_quantized(&m, &q, 256, 2, 768, 1, methods[mi], 0, 900 + mi);
        rw_wset *ws = ws_new(&m.cfg, 8, 3);
        plist all = pl_whole_of(&m);
        /* everything but expert 1's up_proj */
        const char *held = "model.layers.0.mlp.experts.1.up_proj.weight";
        rw_err err = {0};
        for (size_t i = 0; i < all.n; i++)
            if (strcmp(all.p[i].name, held))
                RW_ASSERT_OK(rw_wset_apply(ws, &all.p[i], NULL, &err), &err);
        char miss[512];
        assert_false(rw_wset_complete(ws, miss, sizeof miss));
        assert_non_null(strstr(miss, held));
        /* now the held tensor in two pieces split along K inside a block (col 100) */
        const ttensor *t = tm_find(&m, held);
        plist parts = {0};
        pl_split(&parts, t, 1, 2, (const int64_t[]){0, 100, 256});
        RW_ASSERT_OK(rw_wset_apply(ws, &parts.p[0], NULL, &err), &err);
        assert_false(rw_wset_complete(ws, miss, sizeof miss));
        assert_non_null(strstr(miss, "up_proj"));
        RW_ASSERT_OK(rw_wset_apply(ws, &parts.p[1], NULL, &err), &err);
        assert_complete(ws);
        uint8_t *want = arena_copy(ws);
        /* the quantized checkpoint: e4m3 first, scales in a later batch */
        rw_wset_mark_clear(ws);
        assert_false(rw_wset_complete(ws, miss, sizeof miss));
        plist w8 = {0}, sc = {0};
        for (size_t i = 0; i < q.n; i++)
            pl_push(is_kind(q.t[i].name, "_scale_inv") ? &sc : &w8, piece_whole(&q.t[i]), NULL);
        rw_wset *wq = ws_new(&m.cfg, 8, 3);
        apply_list(wq, &w8, 1);
        assert_false(rw_wset_complete(wq, miss, sizeof miss));
        assert_non_null(strstr(miss, "weight_scale_inv"));
        apply_list(wq, &sc, 1);
        assert_complete(wq);
        if (methods[mi] == RW_QMETHOD_MXFP8) assert_arena_eq(wq, want, "e4m3 then scales");
        rw_wset_destroy(wq);
        free(want);
        pl_free(&parts);
        pl_free(&all);
        pl_free(&w8);
        pl_free(&sc);
        rw_wset_destroy(ws);
        tm_free(&m);
        tm_free(&q);
    }
}

/* A block staged from a partial piece, then written whole by a later piece, forgets the staged
 * part: completing the old partial block later must not mix old and new values. */
static void test_stale_stage(void **state) {
    (void)state;
    const rw_qmethod methods[] = {RW_QMETHOD_MXFP8, RW_QMETHOD_FP8_BLOCK};
    for (size_t mi = 0; mi < 2; mi++) {
        rw_config c, c2;
        moe_test_config(&c, 256, 2, 768, 1, methods[mi], 0);
        moe_test_config(&c2, 256, 2, 768, 1, methods[mi], 0);
        tmodel v1, v2;
        tm_make(&v1, &c, 1100);
        tm_make(&v2, &c2, 1200);
        const char *nm = "model.layers.0.mlp.experts.0.gate_proj.weight";
        plist a = {0}, b = {0}, whole2 = {0};
        pl_split(&a, tm_find(&v1, nm), 1, 2, (const int64_t[]){0, 100, 256});
        pl_split(&b, tm_find(&v2, nm), 1, 2, (const int64_t[]){0, 100, 256});
        pl_whole(&whole2, &v2);
        rw_wset *ws = ws_new(&c, 4, 1), *ref = ws_new(&c2, 4, 1);
        apply_list(ref, &whole2, 1);
        uint8_t *want = arena_copy(ref);
        rw_err err = {0};
        RW_ASSERT_OK(rw_wset_apply(ws, &a.p[0], NULL, &err), &err); /* v1 cols [0, 100) */
        apply_list(ws, &whole2, 1);                                 /* v2 everywhere */
        RW_ASSERT_OK(rw_wset_apply(ws, &b.p[1], NULL, &err), &err); /* v2 cols [100, 256) */
        assert_arena_eq(ws, want, "stale staged values after a whole write");
        free(want);
        rw_wset_destroy(ws);
        rw_wset_destroy(ref);
        pl_free(&a);
        pl_free(&b);
        pl_free(&whole2);
        tm_free(&v1);
        tm_free(&v2);
    }
}

/* Checksums are xxh3-64 of the canonical slice a trainer computes with the shard plan. */
static void test_checksum(void **state) {
    (void)state;
    tmodel m;
    tm_random(&m, 256, 2, 160, 1, RW_QMETHOD_NONE, 0, 1000);
    plist l = pl_whole_of(&m);
    for (int r = 0; r < 8; r++) {
        rw_wset *ws = ws_new(&m.cfg, 8, r);
        apply_list(ws, &l, 1);
        const char *names[] = {
            "model.layers.0.mlp.experts.1.down_proj.weight", "model.embed_tokens.weight",
            "model.layers.0.self_attn.o_proj.weight", "model.layers.0.input_layernorm.weight"};
        for (int k = 0; k < 4; k++) {
            const ttensor *t = tm_find(&m, names[k]);
            rw_wname w;
            rw_shard_plan p;
            rw_err err = {0};
            RW_ASSERT_OK(rw_name_parse(t->name, &m.cfg, &w, &err), &err);
            RW_ASSERT_OK(rw_moe_plan_tensor(&m.cfg, 8, r, &w, &p, &err), &err);
            int64_t R = t->ndim == 1 ? 1 : t->shape[0],
                    C = t->ndim == 1 ? t->shape[0] : t->shape[1];
            int dim = t->ndim == 1 ? -1 : p.dim;
            int64_t n =
                (dim == 0 ? p.src_end - p.src_begin : R) * (dim == 1 ? p.src_end - p.src_begin : C);
            void *sl = slice2d(t->data, R, C, dim, p.src_begin, p.src_end, 2);
            uint64_t got = 0;
            RW_ASSERT_OK(rw_wset_checksum(ws, t->name, &got, &err), &err);
            assert_true(got == rw_checksum64(sl, (size_t)n * 2, 0));
            free(sl);
        }
        rw_wset_destroy(ws);
    }
    pl_free(&l);
    tm_free(&m);
}

/* rw_wset_generation counts the writes (what tells a derived copy, such as the CUDA backend's bf16
 * views of quantized dense weights, that it is stale): one per apply batch, per single apply and
 * per two-phase launch; nothing for a refused piece, a prepare alone, reads or mark clearing. */
static void test_generation(void **state) {
    (void)state;
    tmodel m;
    tm_random(&m, 256, 2, 160, 1, RW_QMETHOD_MXFP8, 0, 1100);
    plist l = pl_whole_of(&m);
    rw_wset *ws = ws_new(&m.cfg, 1, 0);
    rw_err err = {0};
    assert_true(rw_wset_generation(ws) == 0);
    apply_list(ws, &l, 2);
    assert_true(rw_wset_generation(ws) == 2);
    RW_ASSERT_OK(rw_wset_apply(ws, &l.p[0], NULL, &err), &err);
    assert_true(rw_wset_generation(ws) == 3);
    /* refused before anything is written: no write counted */
    rw_piece bad = l.p[0];
    bad.name = "model.layers.0.self_attn.no_such_proj.weight";
    assert_int_not_equal(rw_wset_apply(ws, &bad, NULL, &err), RW_OK);
    assert_int_not_equal(rw_wset_validate_piece(ws, &bad, &err), RW_OK);
    uint64_t sum = 0;
    RW_ASSERT_OK(rw_wset_checksum(ws, "model.layers.0.self_attn.o_proj.weight", &sum, &err), &err);
    rw_wset_mark_clear(ws);
    assert_true(rw_wset_generation(ws) == 3);
    /* the two-phase path: prepare counts nothing, launch counts one */
    rw_wset_batch *b;
    RW_ASSERT_OK(rw_wset_batch_create(&b, &err), &err);
    RW_ASSERT_OK(rw_wset_batch_prepare(ws, l.p, l.n, false, NULL, b, NULL, &err), &err);
    assert_true(rw_wset_generation(ws) == 3);
    RW_ASSERT_OK(rw_wset_batch_launch(ws, b, NULL, NULL, NULL, &err), &err);
    assert_true(rw_wset_generation(ws) == 4);
    assert_complete(ws);
    rw_wset_batch_destroy(b);
    rw_wset_destroy(ws);
    pl_free(&l);
    tm_free(&m);
}

/* The fused q/k/v view rw_layer_weights documents: for a bf16 layer qkv is [(nh_l + 2 nkv_l) hd,
 * H] over q, k, v back to back (the rows the rank's q, k and v slices read back as); for a layer
 * whose attention is quantized, qkv has no data. */
static void test_qkv_view(void **state) {
    (void)state;
    const struct {
        rw_qmethod method;
        int tp, rank;
    } cases[] = {{RW_QMETHOD_NONE, 1, 0}, {RW_QMETHOD_MXFP8, 2, 1}, {RW_QMETHOD_FP8_BLOCK, 4, 3}};
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
        rw_config c;
        /* quantized configs keep their last layer bf16: one layer of each kind */
        moe_test_config(&c, 256, 2, 256, 2, cases[ci].method, 1);
        tmodel m;
        tm_make(&m, &c, 1200 + ci);
        plist l = pl_whole_of(&m);
        rw_wset *ws = ws_new(&m.cfg, cases[ci].tp, cases[ci].rank);
        apply_list(ws, &l, 1);
        const rw_tp_dims *d = rw_wset_dims(ws);
        const int64_t H = m.cfg.hidden_size, hd = m.cfg.head_dim;
        const int64_t nq = (int64_t)d->nh_local * hd, nkv = (int64_t)d->nkv_local * hd;
        int nquant = 0;
        for (int layer = 0; layer < m.cfg.num_layers; layer++) {
            const rw_layer_weights *lw = rw_wset_layer(ws, layer);
            if (lw->attn_fmt != RW_WFMT_BF16) {
                assert_true(cases[ci].method != RW_QMETHOD_NONE && layer == 0);
                assert_null(lw->qkv.data);
                assert_non_null(lw->q.data);
                nquant++;
                continue;
            }
            assert_int_equal(lw->qkv.dtype, RW_DTYPE_BF16);
            assert_int_equal(lw->qkv.ndim, 2);
            assert_int_equal(lw->qkv.shape[0], nq + 2 * nkv);
            assert_int_equal(lw->qkv.shape[1], H);
            const uint8_t *base = lw->qkv.data;
            assert_ptr_equal(lw->q.data, base);
            assert_ptr_equal(lw->k.data, base + rw_tensor_nbytes(&lw->q));
            assert_ptr_equal(lw->v.data, (const uint8_t *)lw->k.data + rw_tensor_nbytes(&lw->k));
            assert_int_equal(rw_tensor_nbytes(&lw->qkv), (size_t)((nq + 2 * nkv) * H) * 2);
            /* its bytes are the rank's q, k, v slices in that order */
            uint8_t *want = malloc(rw_tensor_nbytes(&lw->qkv));
            size_t at = 0;
            const char *proj[3] = {"q_proj", "k_proj", "v_proj"};
            for (int k = 0; k < 3; k++) {
                char name[128];
                snprintf(name, sizeof name, "model.layers.%d.self_attn.%s.weight", layer, proj[k]);
                size_t len = 0;
                rw_err err = {0};
                RW_ASSERT_OK(rw_wset_readback(ws, name, want + at, rw_tensor_nbytes(&lw->qkv) - at,
                                              &len, NULL, NULL, &err),
                             &err);
                at += len;
            }
            assert_int_equal(at, rw_tensor_nbytes(&lw->qkv));
            rw_assert_bytes_equal(want, base, at, "qkv view vs q | k | v readback");
            free(want);
        }
        assert_int_equal(nquant, cases[ci].method == RW_QMETHOD_NONE ? 0 : 1);
        rw_wset_destroy(ws);
        pl_free(&l);
        tm_free(&m);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_seed_regression),  cmocka_unit_test(test_slices_every_T_I),
        cmocka_unit_test(test_trainer_pieces),   cmocka_unit_test(test_quantized_checkpoint_pieces),
        cmocka_unit_test(test_quantize_on_load), cmocka_unit_test(test_fp8_requantize_unaligned),
        cmocka_unit_test(test_partial_update),   cmocka_unit_test(test_apply_twice),
        cmocka_unit_test(test_validation),       cmocka_unit_test(test_completeness),
        cmocka_unit_test(test_stale_stage),      cmocka_unit_test(test_checksum),
        cmocka_unit_test(test_qkv_view),         cmocka_unit_test(test_generation),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
