/* test_gemm_split.c - the dense GEMM's K-split rule and workspace size (worker/kernels/gemm.h),
 * host code that decides a product's bits on the GPU (cpu suite): the slice count depends on the
 * weight's N and K only and takes the documented values on the 30B-A3B shapes; only weights of
 * fewer than 256 panels of 64 rows are split, and no further than a grid of 256 panel slices,
 * into whole 64-column blocks, 256 columns a slice or more on average,
 * none empty; the workspace covers the slices' partials of up to RW_K_GEMM_SPLIT_ROWS rows and
 * asks nothing more for larger M. */
#include "rw_test.h"
#include "kernels/gemm.h"

static const int64_t k_ns[] = {1, 16, 63, 64, 100, 1000, 2048, 2560, 4096, 4097, 5120, 151936};
static const int64_t k_ks[] = {8,    64,   256,  504,  512,  1024, 1032,
                               2048, 2056, 2104, 4096, 4104, 8192};

static void test_rule(void **state) {
    (void)state;
    for (size_t i = 0; i < sizeof k_ns / sizeof k_ns[0]; i++)
        for (size_t j = 0; j < sizeof k_ks / sizeof k_ks[0]; j++) {
            const int64_t N = k_ns[i], K = k_ks[j];
            const int S = rw_k_gemm_splits(N, K);
            if (S != 1 && S != 2 && S != 4 && S != 8)
                fail_msg("N %lld K %lld: %d slices (1, 2, 4 or 8)", (long long)N, (long long)K, S);
            const int64_t panels = (N + 63) / 64;
            if (S > 1 && panels * (S / 2) >= 256)
                fail_msg("N %lld K %lld: %d slices where %d give %lld panel slices", (long long)N,
                         (long long)K, S, S / 2, (long long)(panels * (S / 2)));
            if (S > 1 && K / S < 256)
                fail_msg("N %lld K %lld: %d slices of fewer than 256 columns", (long long)N,
                         (long long)K, S);
            /* whole 64-column blocks, the last slice ending at K and not empty */
            const int64_t c = rw_k_gemm_slice_cols(K, S);
            if (S > 1 && (c % 64 || (S - 1) * c >= K || S * c < K))
                fail_msg("N %lld K %lld: %d slices of %lld columns", (long long)N, (long long)K, S,
                         (long long)c);
            assert_int_equal(rw_k_gemm_splits(N, K), S); /* no state */
        }
    /* Qwen3-30B-A3B: o_proj at TP1 and TP2 in 8 slices, q/k/v at TP1 in 4 and at TP2 in 8;
     * lm_head whole; 256 panels (16384 rows) and more whole */
    assert_int_equal(rw_k_gemm_splits(2048, 4096), 8);
    assert_int_equal(rw_k_gemm_splits(2048, 2048), 8);
    assert_int_equal(rw_k_gemm_splits(5120, 2048), 4);
    assert_int_equal(rw_k_gemm_splits(2560, 2048), 8);
    assert_int_equal(rw_k_gemm_splits(151936, 2048), 1);
    assert_int_equal(rw_k_gemm_splits(16384, 8192), 1);
    assert_int_equal(rw_k_gemm_splits(16320, 8192), 2);
    /* a short K is not split; a K whose 8 slices of 320 columns would leave the last empty is cut
     * in 4 */
    assert_int_equal(rw_k_gemm_splits(64, 256), 1);
    assert_int_equal(rw_k_gemm_splits(2048, 2056), 4);
    assert_int_equal(rw_k_gemm_slice_cols(2056, 4), 576);
    assert_int_equal(rw_k_gemm_slice_cols(4096, 1), 4096);
}

static void test_workspace(void **state) {
    (void)state;
    for (size_t i = 0; i < sizeof k_ns / sizeof k_ns[0]; i++)
        for (size_t j = 0; j < sizeof k_ks / sizeof k_ks[0]; j++) {
            const int64_t N = k_ns[i], K = k_ks[j];
            const int S = rw_k_gemm_splits(N, K);
            assert_true(rw_k_gemm_ws_bytes(N, K, 0) == 0);
            size_t prev = 0;
            for (int64_t M = 1; M <= 3 * RW_K_GEMM_SPLIT_ROWS; M++) {
                const size_t b = rw_k_gemm_ws_bytes(N, K, M);
                if (S == 1) {
                    if (b)
                        fail_msg("N %lld K %lld unsplit asks %zu bytes", (long long)N, (long long)K,
                                 b);
                    continue;
                }
                const int64_t rows = M < RW_K_GEMM_SPLIT_ROWS ? M : RW_K_GEMM_SPLIT_ROWS;
                const size_t need = RW_K_GEMM_COUNTERS * sizeof(unsigned) +
                                    (size_t)S * (size_t)rows * (size_t)N * sizeof(float);
                if (b < need)
                    fail_msg("N %lld K %lld M %lld: %zu bytes, the partials need %zu", (long long)N,
                             (long long)K, (long long)M, b, need);
                if (M <= RW_K_GEMM_SPLIT_ROWS ? b <= prev : b != prev)
                    fail_msg("N %lld K %lld M %lld: %zu bytes after %zu for M - 1 (grows to %d "
                             "rows, then stays)",
                             (long long)N, (long long)K, (long long)M, b, prev,
                             RW_K_GEMM_SPLIT_ROWS);
                prev = b;
            }
        }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_rule),
        cmocka_unit_test(test_workspace),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
