/* test_device_gpu.c - device helpers on a real GPU: copies in every direction on a stream (bytes
 * compared), pinned host memory, and the device arena: zero-filled, views written and read back,
 * release/resume keeping the base address (views stay valid) with memory zeroed again, and
 * allocation refused while released. Skips (exit 77) without a CUDA device. */
#include "rw_test.h"

static void fill(uint8_t *p, size_t n, uint64_t seed) {
    rw_rng r;
    rw_rng_seed(&r, seed);
    for (size_t i = 0; i < n; i++)
        p[i] = (uint8_t)(rw_rng_u64(&r) >> 56);
}

static void assert_zero(const uint8_t *p, size_t n, const char *what) {
    for (size_t i = 0; i < n; i++)
        if (p[i]) fail_msg("%s: byte %zu is 0x%02x, want 0", what, i, p[i]);
}

static void test_copies(void **state) {
    (void)state;
    rw_err e = {0};
    RW_ASSERT_OK(rw_cuda_set_device(0, &e), &e);
    rw_stream s = NULL;
    RW_ASSERT_OK(rw_stream_create(&s, &e), &e);
    assert_non_null(s);
    const size_t n = (3u << 20) + 17; /* not a multiple of anything convenient */
    uint8_t *src = malloc(n), *back = malloc(n), *pinned = NULL;
    assert_non_null(src);
    assert_non_null(back);
    fill(src, n, 1);
    void *d1 = NULL, *d2 = NULL;
    RW_ASSERT_OK(rw_dev_malloc(n, &d1, &e), &e);
    RW_ASSERT_OK(rw_dev_malloc(n, &d2, &e), &e);
    RW_ASSERT_OK(rw_memcpy(d1, RW_PLACE_DEVICE, src, RW_PLACE_HOST, n, s, &e), &e);
    RW_ASSERT_OK(rw_memcpy(d2, RW_PLACE_DEVICE, d1, RW_PLACE_DEVICE, n, s, &e), &e);
    RW_ASSERT_OK(rw_host_malloc_pinned(n, (void **)&pinned, &e), &e);
    memset(pinned, 0, n);
    RW_ASSERT_OK(rw_memcpy(pinned, RW_PLACE_HOST, d2, RW_PLACE_DEVICE, n, s, &e), &e);
    RW_ASSERT_OK(rw_stream_sync(s, &e), &e);
    rw_assert_bytes_equal(pinned, src, n, "host -> device -> device -> pinned host");
    RW_ASSERT_OK(rw_memcpy(back, RW_PLACE_HOST, d2, RW_PLACE_DEVICE, n, NULL, &e), &e);
    RW_ASSERT_OK(rw_stream_sync(NULL, &e), &e);
    rw_assert_bytes_equal(back, src, n, "device -> pageable host on the default stream");
    /* no kernel failed: the launch check is clean */
    RW_ASSERT_OK(RW_LAUNCH_CHECK(s, "nothing", &e), &e);
    rw_dev_free(d1);
    rw_dev_free(d2);
    rw_dev_free(NULL);
    rw_host_free_pinned(pinned);
    rw_stream_destroy(s);
    free(src);
    free(back);
    /* an impossible allocation is an error, not a crash */
    void *huge = NULL;
    assert_int_equal(rw_dev_malloc((size_t)1 << 50, &huge, &e), RW_E_OOM);
    assert_null(huge);
}

static void test_device_arena(void **state) {
    (void)state;
    rw_err e = {0};
    RW_ASSERT_OK(rw_cuda_set_device(0, &e), &e);
    rw_arena *a = NULL;
    const size_t cap = 64u << 20;
    RW_ASSERT_OK(rw_arena_create(RW_PLACE_DEVICE, 0, cap, &a, &e), &e);
    assert_int_equal(rw_arena_place(a), RW_PLACE_DEVICE);
    assert_true(rw_arena_capacity(a) >= cap);
    void *base = rw_arena_base(a);
    assert_non_null(base);
    int64_t shape[2] = {1000, 1031};
    rw_tensor t1, t2;
    RW_ASSERT_OK(rw_arena_tensor(a, RW_DTYPE_BF16, 2, shape, &t1, &e), &e);
    RW_ASSERT_OK(rw_arena_tensor(a, RW_DTYPE_F32, 2, shape, &t2, &e), &e);
    assert_int_equal(t1.place, RW_PLACE_DEVICE);
    assert_int_equal((uintptr_t)t1.data % 256, 0);
    assert_int_equal((uintptr_t)t2.data % 256, 0);
    assert_true((uint8_t *)t2.data >= (uint8_t *)t1.data + rw_tensor_nbytes(&t1));
    size_t n1 = rw_tensor_nbytes(&t1), n2 = rw_tensor_nbytes(&t2);
    uint8_t *h = malloc(n2), *src = malloc(n2);
    assert_non_null(h);
    assert_non_null(src);
    /* zero-filled at creation */
    RW_ASSERT_OK(rw_memcpy(h, RW_PLACE_HOST, t2.data, RW_PLACE_DEVICE, n2, NULL, &e), &e);
    RW_ASSERT_OK(rw_stream_sync(NULL, &e), &e);
    assert_zero(h, n2, "new arena");
    fill(src, n2, 2);
    RW_ASSERT_OK(rw_memcpy(t1.data, RW_PLACE_DEVICE, src, RW_PLACE_HOST, n1, NULL, &e), &e);
    RW_ASSERT_OK(rw_memcpy(t2.data, RW_PLACE_DEVICE, src, RW_PLACE_HOST, n2, NULL, &e), &e);
    RW_ASSERT_OK(rw_memcpy(h, RW_PLACE_HOST, t1.data, RW_PLACE_DEVICE, n1, NULL, &e), &e);
    RW_ASSERT_OK(rw_stream_sync(NULL, &e), &e);
    rw_assert_bytes_equal(h, src, n1, "arena view 1");
    RW_ASSERT_OK(rw_memcpy(h, RW_PLACE_HOST, t2.data, RW_PLACE_DEVICE, n2, NULL, &e), &e);
    RW_ASSERT_OK(rw_stream_sync(NULL, &e), &e);
    rw_assert_bytes_equal(h, src, n2, "arena view 2");
    size_t used = rw_arena_used(a);

    /* release: memory goes, bookkeeping and address stay */
    RW_ASSERT_OK(rw_arena_release(a, &e), &e);
    assert_true(rw_arena_is_released(a));
    void *p = NULL;
    assert_int_equal(rw_arena_alloc(a, 256, 256, &p, &e), RW_E_STATE);
    RW_ASSERT_OK(rw_arena_release(a, &e), &e); /* twice is harmless */
    RW_ASSERT_OK(rw_arena_resume(a, &e), &e);
    assert_false(rw_arena_is_released(a));
    assert_ptr_equal(rw_arena_base(a), base);
    assert_int_equal(rw_arena_used(a), used);
    /* the old views are valid again, over fresh zeroed memory */
    RW_ASSERT_OK(rw_memcpy(h, RW_PLACE_HOST, t2.data, RW_PLACE_DEVICE, n2, NULL, &e), &e);
    RW_ASSERT_OK(rw_stream_sync(NULL, &e), &e);
    assert_zero(h, n2, "resumed arena");
    fill(src, n2, 3);
    RW_ASSERT_OK(rw_memcpy(t2.data, RW_PLACE_DEVICE, src, RW_PLACE_HOST, n2, NULL, &e), &e);
    RW_ASSERT_OK(rw_memcpy(h, RW_PLACE_HOST, t2.data, RW_PLACE_DEVICE, n2, NULL, &e), &e);
    RW_ASSERT_OK(rw_stream_sync(NULL, &e), &e);
    rw_assert_bytes_equal(h, src, n2, "resumed arena view");
    /* and allocation continues after the old allocations */
    RW_ASSERT_OK(rw_arena_alloc(a, 4096, 256, &p, &e), &e);
    assert_true((uint8_t *)p >= (uint8_t *)base + used);
    assert_int_equal(rw_arena_alloc(a, rw_arena_capacity(a), 256, &p, &e), RW_E_OOM);
    rw_arena_destroy(a);
    free(h);
    free(src);
}

int main(void) {
    rw_test_require_gpu(1);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_copies),
        cmocka_unit_test(test_device_arena),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
