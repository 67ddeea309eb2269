/* test_misc.c - status names and rw_err, logging levels, tensor views, the host arena, the PRNG,
 * rw_read_file, checksums, and the device helpers' answers when no device is usable. */
#include "rw_test.h"

#include <math.h>
#include <stdint.h>
#include <unistd.h>

static void test_status_names(void **state) {
    (void)state;
    const char *seen[RW_E_RANGE + 1];
    for (int s = 0; s <= RW_E_RANGE; s++) {
        seen[s] = rw_status_str((rw_status)s);
        assert_non_null(seen[s]);
        assert_string_not_equal(seen[s], "unknown_status");
        for (int t = 0; t < s; t++)
            if (!strcmp(seen[s], seen[t]))
                fail_msg("statuses %d and %d share the name %s", s, t, seen[s]);
    }
    assert_string_equal(rw_status_str(RW_OK), "ok");
    assert_string_equal(rw_status_str(RW_E_FORMAT), "format");
    assert_string_equal(rw_status_str((rw_status)999), "unknown_status");
}

static rw_status fails_with_context(int x, rw_err *err) {
    RW_FAIL(err, RW_E_RANGE, "value %d out of range", x);
}

static rw_status propagates(int x, rw_err *err) {
    RW_CHECK(fails_with_context(x, err));
    return RW_OK; /* not reached */
}

static rw_status cleans_up(int *cleaned, rw_err *err) {
    rw_status st = RW_OK;
    RW_CHECKGOTO(fails_with_context(7, err), st, out);
    st = RW_E_INTERNAL; /* not reached */
out:
    *cleaned = 1;
    return st;
}

static void test_err(void **state) {
    (void)state;
    rw_err e;
    memset(&e, 0x55, sizeof e);
    rw_err_clear(&e);
    assert_int_equal(e.status, RW_OK);
    assert_string_equal(e.msg, "");
    assert_int_equal(propagates(42, &e), RW_E_RANGE);
    assert_int_equal(e.status, RW_E_RANGE);
    assert_string_equal(e.msg, "value 42 out of range");
    assert_non_null(strstr(e.where, "test_misc.c:"));
    assert_int_equal(rw_err_prefix(&e, "layer %d", 3), RW_E_RANGE);
    assert_string_equal(e.msg, "layer 3: value 42 out of range");
    int cleaned = 0;
    assert_int_equal(cleans_up(&cleaned, &e), RW_E_RANGE);
    assert_int_equal(cleaned, 1);
    assert_string_equal(e.msg, "value 7 out of range"); /* a later message replaces the earlier */
    /* NULL err: the status still comes back */
    assert_int_equal(fails_with_context(1, NULL), RW_E_RANGE);
    assert_int_equal(rw_err_prefix(NULL, "x"), RW_OK);
    rw_err_clear(NULL);
    /* long messages are cut, never overflow */
    char big[2000];
    memset(big, 'x', sizeof big - 1);
    big[sizeof big - 1] = 0;
    rw_err_set(&e, RW_E_IO, "f.c", 1, "%s", big);
    assert_int_equal(strlen(e.msg), sizeof e.msg - 1);
    rw_err_prefix(&e, "%s", big);
    assert_int_equal(strlen(e.msg), sizeof e.msg - 1);
}

static void test_log_levels(void **state) {
    (void)state;
    const char *old = getenv("RW_LOG");
    char *saved = old ? strdup(old) : NULL;
    setenv("RW_LOG", "error", 1);
    assert_true(rw_log_enabled(RW_LOG_ERROR));
    assert_false(rw_log_enabled(RW_LOG_WARN));
    setenv("RW_LOG", "debug", 1);
    assert_true(rw_log_enabled(RW_LOG_DEBUG));
    assert_false(rw_log_enabled(RW_LOG_TRACE));
    setenv("RW_LOG", "4", 1);
    assert_true(rw_log_enabled(RW_LOG_TRACE));
    unsetenv("RW_LOG");
    assert_true(rw_log_enabled(RW_LOG_INFO));
    assert_false(rw_log_enabled(RW_LOG_DEBUG));
    setenv("RW_LOG", "error", 1);
    RW_LOGI("not shown at level error");
    if (saved) {
        setenv("RW_LOG", saved, 1);
        free(saved);
    } else {
        unsetenv("RW_LOG");
    }
    double t0 = rw_now();
    usleep(2000);
    double t1 = rw_now();
    assert_true(t1 - t0 >= 0.0015 && t1 - t0 < 5.0);
}

static void test_tensor_views(void **state) {
    (void)state;
    float buf[2 * 3 * 4];
    int64_t shape[3] = {2, 3, 4};
    rw_tensor t = rw_tensor_view(buf, RW_DTYPE_F32, 3, shape, RW_PLACE_HOST, 0);
    assert_int_equal(t.ndim, 3);
    assert_int_equal(t.stride[0], 12);
    assert_int_equal(t.stride[1], 4);
    assert_int_equal(t.stride[2], 1);
    assert_int_equal(rw_tensor_numel(&t), 24);
    assert_int_equal(rw_tensor_nbytes(&t), 96);
    assert_true(rw_tensor_is_contiguous(&t));
    t.stride[1] = 8; /* a row-strided view */
    assert_false(rw_tensor_is_contiguous(&t));
    char s[64];
    assert_string_equal(rw_shape_str(3, shape, s, sizeof s), "[2, 3, 4]");
    assert_string_equal(rw_shape_str(0, shape, s, sizeof s), "[]");
    char tiny[5];
    rw_shape_str(3, shape, tiny, sizeof tiny); /* truncated, NUL-terminated */
    assert_true(strlen(tiny) < sizeof tiny);
    assert_int_equal(rw_shape_numel(0, shape), 1);
    int64_t z[2] = {5, 0};
    assert_int_equal(rw_shape_numel(2, z), 0);
}

static void test_host_arena(void **state) {
    (void)state;
    rw_err e = {0};
    rw_arena *a = NULL;
    RW_ASSERT_OK(rw_arena_create(RW_PLACE_HOST, 0, 1 << 20, &a, &e), &e);
    assert_int_equal(rw_arena_capacity(a), 1 << 20);
    assert_int_equal(rw_arena_used(a), 0);
    assert_int_equal(rw_arena_place(a), RW_PLACE_HOST);
    uint8_t *base = rw_arena_base(a);
    for (size_t i = 0; i < (1 << 20); i += 4096)
        assert_int_equal(base[i], 0); /* zero-filled */
    void *p = NULL, *q = NULL;
    RW_ASSERT_OK(rw_arena_alloc(a, 3, 1, &p, &e), &e);
    RW_ASSERT_OK(rw_arena_alloc(a, 100, 64, &q, &e), &e);
    assert_int_equal((uintptr_t)q % 64, 0);
    assert_true((uint8_t *)q >= (uint8_t *)p + 3);
    int64_t shape[2] = {17, 33};
    rw_tensor t;
    RW_ASSERT_OK(rw_arena_tensor(a, RW_DTYPE_BF16, 2, shape, &t, &e), &e);
    assert_int_equal((uintptr_t)t.data % 256, 0);
    assert_int_equal(rw_tensor_nbytes(&t), 17 * 33 * 2);
    assert_true(rw_arena_used(a) >= (size_t)((uint8_t *)t.data - base) + 17 * 33 * 2);
    rw_test_fill_bf16(t.data, 17 * 33, 11, 0.1f);
    /* bad alignment and overflow are refused without changing the arena */
    size_t used = rw_arena_used(a);
    assert_int_equal(rw_arena_alloc(a, 8, 3, &p, &e), RW_E_INVALID_ARG);
    assert_non_null(strstr(e.msg, "power of two"));
    assert_int_equal(rw_arena_alloc(a, 1 << 20, 1, &p, &e), RW_E_OOM);
    assert_non_null(strstr(e.msg, "arena full"));
    assert_int_equal(rw_arena_alloc(a, SIZE_MAX, 1, &p, &e), RW_E_OOM);
    assert_int_equal(rw_arena_used(a), used);
    /* release / resume keep the bookkeeping; allocation is refused while released */
    RW_ASSERT_OK(rw_arena_release(a, &e), &e);
    assert_true(rw_arena_is_released(a));
    assert_int_equal(rw_arena_alloc(a, 8, 8, &p, &e), RW_E_STATE);
    RW_ASSERT_OK(rw_arena_resume(a, &e), &e);
    assert_false(rw_arena_is_released(a));
    assert_int_equal(rw_arena_used(a), used);
    assert_ptr_equal(rw_arena_base(a), base);
    memset(base, 0xab, 4096); /* writable again */
    rw_arena_destroy(a);
    rw_arena_destroy(NULL);
}

static void test_rng(void **state) {
    (void)state;
    rw_rng a, b, c;
    rw_rng_seed(&a, 123);
    rw_rng_seed(&b, 123);
    rw_rng_seed(&c, 124);
    int same = 0;
    for (int i = 0; i < 1000; i++) {
        uint64_t x = rw_rng_u64(&a), y = rw_rng_u64(&b), z = rw_rng_u64(&c);
        assert_true(x == y);
        same += x == z;
    }
    assert_true(same < 2);
    /* uniform in [0, 1) with the right mean; normal with mean 0, variance 1 */
    double su = 0, sn = 0, sn2 = 0;
    const int n = 200000;
    for (int i = 0; i < n; i++) {
        double u = rw_rng_uniform(&a);
        assert_true(u >= 0.0 && u < 1.0);
        su += u;
        double g = rw_rng_normal(&a);
        assert_true(isfinite(g));
        sn += g;
        sn2 += g * g;
    }
    assert_true(fabs(su / n - 0.5) < 0.01);
    assert_true(fabs(sn / n) < 0.02);
    assert_true(fabs(sn2 / n - 1.0) < 0.02);
}

static void test_read_file_and_checksum(void **state) {
    (void)state;
    char path[] = "/tmp/rw_test_misc_XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    uint8_t data[10000];
    rw_rng r;
    rw_rng_seed(&r, 5);
    for (size_t i = 0; i < sizeof data; i++)
        data[i] = (uint8_t)rw_rng_u64(&r);
    assert_int_equal(write(fd, data, sizeof data), (ssize_t)sizeof data);
    close(fd);
    rw_err e = {0};
    char *buf = NULL;
    size_t len = 0;
    RW_ASSERT_OK(rw_read_file(path, &buf, &len, &e), &e);
    assert_int_equal(len, sizeof data);
    rw_assert_bytes_equal(buf, data, len, "rw_read_file");
    assert_int_equal(buf[len], 0);
    assert_true(rw_checksum64(buf, len, 0) == rw_checksum64(data, sizeof data, 0));
    free(buf);
    unlink(path);
    assert_int_equal(rw_read_file(path, &buf, &len, &e), RW_E_IO);
    assert_non_null(strstr(e.msg, path));
    assert_null(buf);
    /* checksums: seed and every byte matter */
    uint64_t h = rw_checksum64(data, sizeof data, 0);
    assert_true(h != rw_checksum64(data, sizeof data, 1));
    data[9999] ^= 1;
    assert_true(h != rw_checksum64(data, sizeof data, 0));
    /* known value of xxh3-64 for the empty input with seed 0 (so trainer and worker agree with
     * any other xxh3 implementation) */
    assert_true(rw_checksum64("", 0, 0) == 0x2d06800538d394c2ull);
}

static void test_device_without_gpu(void **state) {
    (void)state;
    if (rw_cuda_built() && rw_cuda_device_count() > 0) skip();
    rw_err e = {0};
    void *p = (void *)1;
    char src_dummy[4] = {1, 2, 3, 4};
    (void)src_dummy;
    if (!rw_cuda_built()) {
        assert_int_equal(rw_cuda_device_count(), 0);
        assert_int_equal(rw_dev_malloc(16, &p, &e), RW_E_NO_DEVICE);
        assert_int_equal(rw_cuda_set_device(0, &e), RW_E_NO_DEVICE);
        rw_stream s = (rw_stream)1;
        RW_ASSERT_OK(rw_stream_create(&s, &e), &e); /* the default (null) stream */
        assert_null(s);
        assert_int_equal(RW_LAUNCH_CHECK(s, "k", &e), RW_E_NO_DEVICE);
        assert_int_equal(
            rw_memcpy(src_dummy, RW_PLACE_DEVICE, src_dummy, RW_PLACE_HOST, 4, NULL, &e),
            RW_E_NO_DEVICE);
    } else {
        assert_int_not_equal(rw_dev_malloc(16, &p, &e), RW_OK);
    }
    rw_arena *a = NULL;
    assert_int_not_equal(rw_arena_create(RW_PLACE_DEVICE, 0, 1 << 20, &a, &e), RW_OK);
    assert_null(a);
    /* host to host copies work in every build */
    char src[64], dst[64];
    for (int i = 0; i < 64; i++)
        src[i] = (char)(i * 7 + 1);
    RW_ASSERT_OK(rw_memcpy(dst, RW_PLACE_HOST, src, RW_PLACE_HOST, 64, NULL, &e), &e);
    rw_assert_bytes_equal(dst, src, 64, "host memcpy");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_status_names),
        cmocka_unit_test(test_err),
        cmocka_unit_test(test_log_levels),
        cmocka_unit_test(test_tensor_views),
        cmocka_unit_test(test_host_arena),
        cmocka_unit_test(test_rng),
        cmocka_unit_test(test_read_file_and_checksum),
        cmocka_unit_test(test_device_without_gpu),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
