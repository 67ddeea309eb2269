/* test_quant_gpu.c - gpu suite for the quant module: the CUDA quantizers equal the CPU reference
 * byte for byte (codes and scales), and the CUDA dequantizers equal the CPU dequantization
 * rounded to bf16, over random inputs (weight-like and full-range with zeros, NaN and inf), the
 * 30B-A3B expert shapes, fp8 blocks that do not divide the shape, and misaligned pointers (which
 * take the scalar kernels); the dequantization of every code under every scale byte. Exits 77
 * without a device. */
#include "quant_util.h"
#include "rw_quant.h"

static uint64_t g_seed;

typedef enum { FILL_WEIGHTS = 0, FILL_RANGES = 1, FILL_SPECIALS = 2 } fill_mode;

static void fill(uint16_t *x, int64_t rows, int64_t cols, fill_mode m, uint64_t salt) {
    size_t n = (size_t)(rows * cols);
    if (m == FILL_WEIGHTS) {
        rw_test_fill_bf16(x, n, g_seed ^ salt, 0.08f);
        return;
    }
    rw_rng r = qt_rng(g_seed, salt);
    qt_fill_ranges(x, rows, cols, 32, &r);
    if (m == FILL_SPECIALS) {
        const uint16_t sp[] = {0x7fc0, 0xffc0, 0x7f80, 0xff80, 0x7f7f, 0x0001, 0x8000};
        for (int i = 0; i < 8 && n > 0; i++)
            x[rw_rng_u64(&r) % n] = sp[rw_rng_u64(&r) % (sizeof sp / sizeof sp[0])];
    }
}

/* Device buffer with `off` bytes of deliberate misalignment. */
typedef struct {
    void *base;
    uint8_t *p;
} dbuf;

static dbuf dalloc(size_t bytes, size_t off) {
    dbuf b;
    rw_err err = {0};
    RW_ASSERT_OK(rw_dev_malloc(bytes + 64, &b.base, &err), &err);
    b.p = (uint8_t *)b.base + off;
    return b;
}

static void h2d(dbuf d, const void *h, size_t n) {
    rw_err err = {0};
    RW_ASSERT_OK(rw_memcpy(d.p, RW_PLACE_DEVICE, h, RW_PLACE_HOST, n, NULL, &err), &err);
}

static void d2h(void *h, dbuf d, size_t n) {
    rw_err err = {0};
    RW_ASSERT_OK(rw_memcpy(h, RW_PLACE_HOST, d.p, RW_PLACE_DEVICE, n, NULL, &err), &err);
    RW_ASSERT_OK(rw_stream_sync(NULL, &err), &err);
}

static void *xmalloc(size_t n) {
    void *p = malloc(n ? n : 1);
    assert_non_null(p);
    return p;
}

/* Offsets (x, q, scale, out) in bytes: 0 = aligned (vector kernels); odd = scalar kernels. */
static const size_t k_offsets[][4] = {{0, 0, 0, 0}, {2, 1, 1, 2}, {0, 4, 0, 6}};

/* One case of one format: the CUDA quantizer == the CPU reference (scales, then codes) and the
 * CUDA dequantizer == the CPU dequantization rounded to bf16. */
static void run_case(rw_wfmt f, int64_t rows, int64_t cols, fill_mode m, const size_t off[4]) {
    const bool mx = f == RW_WFMT_MXFP8;
    size_t n = (size_t)(rows * cols);
    /* scale bytes: mxfp8 u8 [rows, cols / 32], fp8-block f32 per 128 x 128 block */
    size_t ns = mx ? (size_t)(rows * (cols / 32))
                   : (size_t)(((rows + 127) / 128) * ((cols + 127) / 128)) * 4;
    char what[160];
    snprintf(what, sizeof what, "%s [%lld, %lld] fill %d offsets %zu/%zu/%zu/%zu", rw_wfmt_str(f),
             (long long)rows, (long long)cols, (int)m, off[0], off[1], off[2], off[3]);
    uint16_t *x = xmalloc(n * 2);
    fill(x, rows, cols, m, (uint64_t)(rows * (mx ? 131 : 7919) + cols + m));
    uint8_t *q_ref = xmalloc(n), *q_gpu = xmalloc(n), *s_ref = xmalloc(ns), *s_gpu = xmalloc(ns);
    float *d_ref = xmalloc(n * sizeof(float));
    uint16_t *b_ref = xmalloc(n * 2), *b_gpu = xmalloc(n * 2);
    rw_err err = {0};
    if (mx) {
        RW_ASSERT_OK(rw_quant_mxfp8_ref(x, rows, cols, q_ref, s_ref, &err), &err);
        rw_dequant_mxfp8_ref(q_ref, s_ref, rows, cols, d_ref);
    } else {
        RW_ASSERT_OK(rw_quant_fp8_block_ref(x, rows, cols, q_ref, (float *)s_ref, &err), &err);
        rw_dequant_fp8_block_ref(q_ref, (const float *)s_ref, rows, cols, d_ref);
    }
    for (size_t i = 0; i < n; i++)
        b_ref[i] = rw_f32_to_bf16(d_ref[i]);

    /* fp32 scales keep 4-byte alignment; the other pointers take the offsets. */
    dbuf dx = dalloc(n * 2, off[0]), dq = dalloc(n, off[1]), ds = dalloc(ns, mx ? off[2] : 0),
         dout = dalloc(n * 2, off[3]);
    h2d(dx, x, n * 2);
    if (mx)
        RW_ASSERT_OK(
            rw_quant_mxfp8_cuda((const uint16_t *)dx.p, rows, cols, dq.p, ds.p, NULL, &err), &err);
    else
        RW_ASSERT_OK(rw_quant_fp8_block_cuda((const uint16_t *)dx.p, rows, cols, dq.p,
                                             (float *)ds.p, NULL, &err),
                     &err);
    d2h(q_gpu, dq, n);
    d2h(s_gpu, ds, ns);
    char w2[200];
    snprintf(w2, sizeof w2, "%s: scales", what);
    rw_assert_bytes_equal(s_gpu, s_ref, ns, w2);
    snprintf(w2, sizeof w2, "%s: codes", what);
    rw_assert_bytes_equal(q_gpu, q_ref, n, w2);
    if (mx)
        RW_ASSERT_OK(rw_dequant_mxfp8_cuda(dq.p, ds.p, rows, cols, (uint16_t *)dout.p, NULL, &err),
                     &err);
    else
        RW_ASSERT_OK(rw_dequant_fp8_block_cuda(dq.p, (const float *)ds.p, rows, cols,
                                               (uint16_t *)dout.p, NULL, &err),
                     &err);
    d2h(b_gpu, dout, n * 2);
    snprintf(w2, sizeof w2, "%s: dequantized bf16", what);
    rw_assert_bytes_equal(b_gpu, b_ref, n * 2, w2);

    rw_dev_free(dx.base);
    rw_dev_free(dq.base);
    rw_dev_free(ds.base);
    rw_dev_free(dout.base);
    free(x);
    free(q_ref);
    free(q_gpu);
    free(s_ref);
    free(s_gpu);
    free(d_ref);
    free(b_ref);
    free(b_gpu);
}

static void test_mxfp8_cuda_vs_cpu(void **state) {
    (void)state;
    /* 30B-A3B expert gate/up [768, 2048] and down [2048, 768], the tiny fixture's [96, 128] and
     * [128, 96], and odd row counts. */
    const int64_t shapes[][2] = {{768, 2048}, {2048, 768}, {96, 128}, {128, 96},
                                 {1, 32},     {37, 160},   {3, 4096}};
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++)
        for (int m = 0; m < 3; m++)
            for (size_t o = 0; o < sizeof k_offsets / sizeof k_offsets[0]; o++)
                run_case(RW_WFMT_MXFP8, shapes[i][0], shapes[i][1], (fill_mode)m, k_offsets[o]);
}

static void test_fp8_block_cuda_vs_cpu(void **state) {
    (void)state;
    const int64_t shapes[][2] = {{768, 2048}, {2048, 768}, {200, 300}, {129, 128}, {1, 1},
                                 {5, 7},      {257, 96},   {130, 520}, {96, 128},  {333, 1000}};
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++)
        for (int m = 0; m < 3; m++)
            for (size_t o = 0; o < sizeof k_offsets / sizeof k_offsets[0]; o++)
                run_case(RW_WFMT_FP8_BLOCK, shapes[i][0], shapes[i][1], (fill_mode)m, k_offsets[o]);
}

/* Every e4m3 code at every byte of its word under every UE8M0 scale byte: row r's blocks all have
 * scale byte r, and its 1024 columns hold the 256 codes four times, shifted by one column each
 * time. The device dequantization equals the CPU reference rounded to bf16, byte for byte: the
 * fast conversion (subnormal codes and scales included), the fp32 one for scales past it, and
 * the reference's own NaNs. */
static void test_mxfp8_dequant_every_code_and_scale(void **state) {
    (void)state;
    const int64_t rows = 256, cols = 1024;
    const size_t n = (size_t)(rows * cols), ns = (size_t)(rows * (cols / 32));
    uint8_t *q = xmalloc(n), *sc = xmalloc(ns);
    for (int64_t r = 0; r < rows; r++)
        for (int64_t c = 0; c < cols; c++)
            q[r * cols + c] = (uint8_t)((c + c / 256) & 0xff);
    for (size_t i = 0; i < ns; i++)
        sc[i] = (uint8_t)(i / (size_t)(cols / 32));
    float *d_ref = xmalloc(n * sizeof(float));
    uint16_t *b_ref = xmalloc(n * 2), *b_gpu = xmalloc(n * 2);
    rw_dequant_mxfp8_ref(q, sc, rows, cols, d_ref);
    for (size_t i = 0; i < n; i++)
        b_ref[i] = rw_f32_to_bf16(d_ref[i]);
    dbuf dq = dalloc(n, 0), ds = dalloc(ns, 0), dout = dalloc(n * 2, 0);
    h2d(dq, q, n);
    h2d(ds, sc, ns);
    rw_err err = {0};
    RW_ASSERT_OK(rw_dequant_mxfp8_cuda(dq.p, ds.p, rows, cols, (uint16_t *)dout.p, NULL, &err),
                 &err);
    d2h(b_gpu, dout, n * 2);
    for (size_t i = 0; i < n; i++)
        if (b_gpu[i] != b_ref[i])
            fail_msg("mxfp8 dequant of code 0x%02x under scale byte %zu (byte %zu of its word): "
                     "0x%04x, want 0x%04x",
                     q[i], i / (size_t)cols, i % 4, b_gpu[i], b_ref[i]);
    rw_dev_free(dq.base);
    rw_dev_free(ds.base);
    rw_dev_free(dout.base);
    free(q);
    free(sc);
    free(d_ref);
    free(b_ref);
    free(b_gpu);
}

static void test_cuda_bad_args_and_empty(void **state) {
    (void)state;
    rw_err err = {0};
    dbuf d = dalloc(4096, 0);
    assert_int_equal(rw_quant_mxfp8_cuda((const uint16_t *)d.p, 4, 48, d.p, d.p, NULL, &err),
                     RW_E_SHAPE);
    assert_non_null(strstr(err.msg, "48"));
    assert_int_equal(rw_dequant_mxfp8_cuda(d.p, d.p, 4, 40, (uint16_t *)d.p, NULL, &err),
                     RW_E_SHAPE);
    assert_int_equal(rw_quant_fp8_block_cuda(NULL, 4, 40, d.p, (float *)d.p, NULL, &err),
                     RW_E_INVALID_ARG);
    assert_int_equal(
        rw_quant_fp8_block_cuda((const uint16_t *)d.p, -1, 40, d.p, (float *)d.p, NULL, &err),
        RW_E_SHAPE);
    /* Empty tensors launch nothing and succeed. */
    RW_ASSERT_OK(rw_quant_mxfp8_cuda(NULL, 0, 32, NULL, NULL, NULL, &err), &err);
    RW_ASSERT_OK(rw_quant_fp8_block_cuda(NULL, 3, 0, NULL, NULL, NULL, &err), &err);
    rw_dev_free(d.base);
}

int main(void) {
    rw_test_require_gpu(1);
    g_seed = qt_seed("test_quant_gpu");
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_mxfp8_cuda_vs_cpu),
        cmocka_unit_test(test_fp8_block_cuda_vs_cpu),
        cmocka_unit_test(test_mxfp8_dequant_every_code_and_scale),
        cmocka_unit_test(test_cuda_bad_args_and_empty),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
