/* test_oom_gpu.c - a failed allocation on the sync paths that allocate device (or pinned host)
 * memory is reported as RW_E_OOM through core/cuda_check.h's rule, names what it allocated, clears
 * the CUDA runtime's last error, and leaves the session usable (gpu suite; exits 77 without a
 * device):
 *  - the two device staging buffers of an update session, asked absurdly large;
 *  - a bucket record's op table buffers (pinned host and device), absurdly large;
 *  - the pinned upload chunks, absurdly large;
 *  - begin_update on a device whose memory another allocation took: the public path answers
 *    RW_E_OOM, no session is open, and it succeeds once the memory is free again. */
#include "sync_util.h"

#include "session_internal.h"

#ifdef RW_HAVE_CUDA
#include "rw_test_cuda.h"

#define ABSURD (1ull << 50) /* 1 PiB: no device or host has it */

typedef struct fx {
    rw_config cfg;
    rw_wset *ws;
    rw_sync_session *s;
} fx;

static int setup(void **state) {
    fx *f = calloc(1, sizeof *f);
    assert_non_null(f);
    rw_err e;
    fx_config(&f->cfg);
    const int dev = rw_cuda_device_count() - 1;
    RW_ASSERT_OK(rw_wset_create(&f->cfg, 1, 0, RW_PLACE_DEVICE, dev, &f->ws, &e), &e);
    RW_ASSERT_OK(rw_sync_session_create(f->ws, "init", true, &f->s, &e), &e);
    *state = f;
    return 0;
}

static int teardown(void **state) {
    fx *f = *state;
    rw_sync_session_destroy(f->s);
    rw_wset_destroy(f->ws);
    rw_config_free(&f->cfg);
    free(f);
    return 0;
}

/* An RW_E_OOM whose message names `what`, with the runtime's last error cleared. */
static void assert_oom(rw_status st, const rw_err *e, const char *what) {
    rw_assert_status(st, RW_E_OOM, e, what, what);
    RW_TCK(cudaGetLastError());
}

/* The session still opens, with staging of `bucket` bytes, and aborts cleanly. */
static void assert_usable(fx *f, uint64_t bucket) {
    rw_err e;
    rw_sync_begin_args a = {.version = "after-oom", .bucket_bytes = bucket};
    RW_ASSERT_OK(rw_sync_session_begin(f->s, &a, &e), &e);
    rw_sync_info info;
    rw_sync_session_info(f->s, &info);
    assert_int_equal(info.state, RW_SYNC_UPDATING);
    assert_int_equal(info.staging_bytes, 2 * bucket);
    bool intact;
    RW_ASSERT_OK(rw_sync_session_abort(f->s, &intact, &e), &e);
}

static void test_staging_absurd(void **state) {
    fx *f = *state;
    rw_err e;
    char what[96];
    snprintf(what, sizeof what, "two staging buffers of %llu bytes", (unsigned long long)ABSURD);
    assert_oom(rw_sync_pipe_reserve(f->s, ABSURD, &e), &e, what);
    rw_sync_info info;
    rw_sync_session_info(f->s, &info);
    assert_int_equal(info.staging_bytes, 0); /* nothing half-allocated is kept */
    assert_usable(f, 1u << 20);
}

static void test_tables_absurd(void **state) {
    fx *f = *state;
    rw_err e;
    assert_oom(rw_sync_pipe_table_reserve(f->s, &f->s->fl[0], (size_t)ABSURD, &e), &e,
               "op table buffers");
    assert_int_equal(f->s->fl[0].tab_cap, 0);
    assert_null(f->s->fl[0].htab);
    assert_null(f->s->fl[0].dtab);
    /* a sensible size works afterwards */
    RW_ASSERT_OK(rw_sync_pipe_table_reserve(f->s, &f->s->fl[0], 1u << 20, &e), &e);
    assert_true(f->s->fl[0].tab_cap >= (1u << 20));
}

static void test_pinned_absurd(void **state) {
    fx *f = *state;
    rw_err e;
    assert_oom(rw_sync_pipe_pin_reserve(f->s, (size_t)ABSURD, &e), &e, "pinned staging chunk");
    for (int i = 0; i < RW_SYNC_UP_NBUF; i++)
        assert_null(f->s->pin[i]);
    RW_ASSERT_OK(rw_sync_pipe_pin_reserve(f->s, 1u << 20, &e), &e);
    for (int i = 0; i < RW_SYNC_UP_NBUF; i++)
        assert_non_null(f->s->pin[i]);
}

/* Takes all the device memory it can get (large chunks first, then smaller ones). */
typedef struct hog {
    void *p[8192];
    int n;
} hog;

static void hog_fill(hog *h, int dev) {
    RW_TCK(cudaSetDevice(dev));
    static const size_t sizes[] = {1ull << 30, 64u << 20, 2u << 20};
    for (size_t k = 0; k < sizeof sizes / sizeof *sizes; k++)
        while (h->n < (int)(sizeof h->p / sizeof *h->p) &&
               cudaMalloc(&h->p[h->n], sizes[k]) == cudaSuccess)
            h->n++;
    (void)cudaGetLastError(); /* the failed allocation that ended each size */
    size_t fr = 0, tot = 0;
    RW_TCK(cudaMemGetInfo(&fr, &tot));
    fprintf(stderr, "hog: %d allocations, %zu of %zu bytes free\n", h->n, fr, tot);
}

static void hog_free(hog *h) {
    for (int i = 0; i < h->n; i++)
        RW_TCK(cudaFree(h->p[i]));
    h->n = 0;
}

static void test_begin_on_full_device(void **state) {
    fx *f = *state;
    rw_err e;
    rw_sync_pipe_free_staging(f->s); /* what earlier tests left */
    hog *h = calloc(1, sizeof *h);
    assert_non_null(h);
    hog_fill(h, rw_cuda_device_count() - 1);
    rw_sync_begin_args a = {.version = "full", .bucket_bytes = 64u << 20};
    rw_status st = rw_sync_session_begin(f->s, &a, &e);
    hog_free(h);
    free(h);
    assert_oom(st, &e, "staging buffers");
    rw_sync_info info;
    rw_sync_session_info(f->s, &info);
    assert_int_equal(info.state, RW_SYNC_INCOMPLETE); /* no session was opened */
    assert_int_equal(info.staging_bytes, 0);
    assert_usable(f, 64u << 20);
}
#endif

int main(void) {
    rw_test_require_gpu(1);
#ifdef RW_HAVE_CUDA
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_staging_absurd),
        cmocka_unit_test(test_tables_absurd),
        cmocka_unit_test(test_pinned_absurd),
        cmocka_unit_test(test_begin_on_full_device),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
#else
    return 77;
#endif
}
