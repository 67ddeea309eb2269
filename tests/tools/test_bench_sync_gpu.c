/* test_bench_sync_gpu.c - the weight-sync benchmarks of rw-bench (tools/bench/sync_update.c) and
 * the benchmarks' device fill (gpu suite; exits 77 without a device):
 *  - the fill kernel equals core/rand.h's rule on the CPU byte for byte;
 *  - the S1 benchmark entry point on the tiny model (also with buckets smaller than its largest
 *    tensor), and the S4 one (two devices). */
#include "sync_util.h"

#include "rand.h"
#include "sync_bench.h"

static int ndev(void) {
    return rw_cuda_device_count();
}

static void test_fill_kernel(void **state) {
    (void)state;
    rw_err e;
    const uint64_t n = (1u << 20) + 3;
    uint16_t *ref = malloc(n * 2), *got = malloc(n * 2);
    for (uint64_t i = 0; i < n; i++)
        ref[i] = rw_rand_bf16_at(42, i, 0.0f, 0.02f);
    void *d;
    RW_ASSERT_OK(rw_cuda_set_device(0, &e), &e);
    RW_ASSERT_OK(rw_dev_malloc(n * 2, &d, &e), &e);
    RW_ASSERT_OK(rwb_fill_bf16(d, n, 42, 0.0f, 0.02f, NULL, &e), &e);
    RW_ASSERT_OK(rw_memcpy(got, RW_PLACE_HOST, d, RW_PLACE_DEVICE, n * 2, NULL, &e), &e);
    RW_ASSERT_OK(rw_stream_sync(NULL, &e), &e);
    rw_assert_bytes_equal(ref, got, n * 2, "fill kernel vs reference");
    /* not degenerate: values spread around zero with about the asked std */
    double s2 = 0;
    int zeros = 0;
    for (uint64_t i = 0; i < n; i++) {
        float v = rw_bf16_to_f32(ref[i]);
        s2 += (double)v * v;
        zeros += v == 0.0f;
    }
    double sd = sqrt(s2 / (double)n);
    assert_true(sd > 0.018 && sd < 0.022);
    assert_true(zeros < 100);
    rw_dev_free(d);
    free(ref);
    free(got);
}

static void test_bench_entry(void **state) {
    (void)state;
    if (ndev() < 2) skip();
    rw_config cfg;
    fx_config(&cfg);
    rwb_sync_opts o = {.cfg = &cfg,
                       .trainer_device = 0,
                       .worker_device = 1,
                       .bucket_bytes = 1u << 20,
                       .repeats = 2,
                       .timeout_s = 60};
    rwb_sync_result r;
    rw_err e;
    RW_ASSERT_OK(rwb_sync_bench_nccl(&o, &r, &e), &e);
    assert_int_equal(r.repeats, 2);
    assert_true(r.bytes > 0 && r.buckets > 1);
    assert_true(r.update_median_s > 0 && r.ceiling_median_s > 0);
    assert_true(r.worker_weights_bytes > 0);
    char *json;
    RW_ASSERT_OK(rwb_sync_result_json(&r, "S1-tiny", &json, &e), &e);
    assert_non_null(strstr(json, "\"ratio\""));
    fprintf(stderr, "%s\n", json);
    free(json);
    /* buckets smaller than the largest tensor: cut into row pieces, not refused */
    uint64_t bytes = r.bytes, tensors = r.tensors;
    o.bucket_bytes = 64u << 10;
    o.repeats = 1;
    RW_ASSERT_OK(rwb_sync_bench_nccl(&o, &r, &e), &e);
    assert_int_equal(r.bytes, bytes);
    assert_int_equal(r.tensors, tensors);
    assert_true(r.buckets >= bytes / (64u << 10));
    /* S4 on the fixture checkpoint */
    char dir[400];
    fx_dir(dir, sizeof dir);
    rwb_sync_opts d = {.cfg = &cfg, .worker_device = 1, .repeats = 2, .disk_dir = dir};
    RW_ASSERT_OK(rwb_sync_bench_disk(&d, &r, &e), &e);
    rw_ckpt *ck = fx_ckpt();
    assert_int_equal(r.tensors, rw_ckpt_count(ck));
    rw_ckpt_close(ck);
    assert_true(r.update_median_s > 0 && r.ceiling_median_s > 0);
    RW_ASSERT_OK(rwb_sync_result_json(&r, "S4-tiny", &json, &e), &e);
    fprintf(stderr, "%s\n", json);
    free(json);
    rw_config_free(&cfg);
}

int main(void) {
    rw_test_require_gpu(1);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fill_kernel),
        cmocka_unit_test(test_bench_entry),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
