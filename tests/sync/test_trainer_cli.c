/* test_trainer_cli.c - rw-trainer as a user runs it (its path is argv[1]): `push` over ZeroMQ
 * into a worker rank served on loopback (trainer TP 2, 1 MiB buckets, --verify; then 64 KiB
 * buckets given in bytes, smaller than the largest tensor) leaves the weights byte-identical to
 * a direct load and prints a JSON summary that adds up; `checksum` prints what a TP2 rank 1
 * reports; bad usage exits 2. */
#include "sync_util.h"

#include <jansson.h>
#include <math.h>
#include <sys/wait.h>

static const char *exe;

static json_t *run_json(const char *cmdline, int *status) {
    FILE *p = popen(cmdline, "r");
    assert_non_null(p);
    static char buf[1 << 20];
    size_t n = fread(buf, 1, sizeof buf - 1, p);
    buf[n] = 0;
    *status = pclose(p);
    json_error_t je;
    return json_loads(buf, 0, &je);
}

static void test_push_cli(void **state) {
    (void)state;
    rw_config cfg;
    fx_config(&cfg);
    rw_wset *ws = ws_random(&cfg, 1, 0, 31), *ref = ws_reference(&cfg, 1, 0);
    rw_sync_session *s;
    rw_sync_server *srv;
    rw_err e;
    RW_ASSERT_OK(rw_sync_session_create(ws, "random", false, &s, &e), &e);
    RW_ASSERT_OK(rw_sync_server_start(s, NULL, "tcp://127.0.0.1:*", &srv, &e), &e);
    char dir[400], cmd[1400];
    fx_dir(dir, sizeof dir);
    snprintf(cmd, sizeof cmd,
             "%s push --model %s --to %s --transport zmq --trainer-tp 2 --bucket-mb 1 "
             "--version cli-1 --verify",
             exe, dir, rw_sync_server_endpoint(srv));
    int status;
    json_t *j = run_json(cmd, &status);
    assert_int_equal(status, 0);
    assert_non_null(j);
    assert_string_equal(json_string_value(json_object_get(j, "version")), "cli-1");
    assert_true(json_is_true(json_object_get(j, "verified")));
    assert_int_equal(json_integer_value(json_object_get(j, "mismatches")), 0);
    assert_true(json_integer_value(json_object_get(j, "checked")) > 0);
    assert_true(json_integer_value(json_object_get(j, "buckets")) > 1);
    assert_int_equal(json_integer_value(json_object_get(j, "tensors")),
                     (json_int_t)rw_config_weight_count(&cfg));
    double secs = json_real_value(json_object_get(j, "seconds"));
    double gbps = json_real_value(json_object_get(j, "gbps"));
    json_int_t bytes = json_integer_value(json_object_get(j, "bytes"));
    assert_true(secs > 0 && bytes > 0);
    assert_true(fabs(gbps - (double)bytes / secs / 1e9) <= 1e-6 * gbps + 1e-12);
    json_decref(j);
    rw_sync_info info;
    rw_sync_session_info(s, &info);
    assert_int_equal(info.state, RW_SYNC_READY);
    assert_string_equal(info.version, "cli-1");
    ws_assert_equal(ws, ref, "rw-trainer push");
    /* --bucket-bytes below the largest tensor (the 128 KiB embedding): cut into row pieces */
    snprintf(cmd, sizeof cmd,
             "%s push --model %s --to %s --transport zmq --bucket-bytes 65536 --version cli-2 "
             "--verify",
             exe, dir, rw_sync_server_endpoint(srv));
    j = run_json(cmd, &status);
    assert_int_equal(status, 0);
    assert_non_null(j);
    assert_int_equal(json_integer_value(json_object_get(j, "bucket_bytes")), 65536);
    assert_int_equal(json_integer_value(json_object_get(j, "mismatches")), 0);
    assert_int_equal(json_integer_value(json_object_get(j, "tensors")),
                     (json_int_t)rw_config_weight_count(&cfg));
    assert_true(json_integer_value(json_object_get(j, "pieces")) >
                json_integer_value(json_object_get(j, "tensors")));
    json_decref(j);
    ws_assert_equal(ws, ref, "rw-trainer push --bucket-bytes 65536");
    snprintf(cmd, sizeof cmd, "%s push --model %s --to %s --bucket-bytes 100 >/dev/null 2>&1", exe,
             dir, rw_sync_server_endpoint(srv));
    assert_int_equal(WEXITSTATUS(system(cmd)), 2);
    rw_sync_server_stop(srv);
    rw_sync_session_destroy(s);
    rw_wset_destroy(ws);
    rw_wset_destroy(ref);
    rw_config_free(&cfg);
}

static void test_checksum_cli(void **state) {
    (void)state;
    rw_config cfg;
    fx_config(&cfg);
    rw_wset *ref = ws_reference(&cfg, 2, 1);
    char dir[400], cmd[1400];
    fx_dir(dir, sizeof dir);
    snprintf(cmd, sizeof cmd, "%s checksum --model %s --tp 2 --rank 1", exe, dir);
    int status;
    json_t *j = run_json(cmd, &status);
    assert_int_equal(status, 0);
    assert_non_null(j);
    json_t *sums = json_object_get(j, "checksums");
    assert_int_equal(json_object_size(sums), rw_config_weight_count(&cfg));
    const char *name;
    json_t *v;
    rw_err e;
    json_object_foreach(sums, name, v) {
        uint64_t got;
        RW_ASSERT_OK(rw_wset_checksum(ref, name, &got, &e), &e);
        char hex[17];
        snprintf(hex, sizeof hex, "%016llx", (unsigned long long)got);
        assert_string_equal(json_string_value(v), hex);
    }
    json_decref(j);
    snprintf(cmd, sizeof cmd, "%s push --model %s >/dev/null 2>&1", exe, dir);
    assert_int_equal(WEXITSTATUS(system(cmd)), 2);
    snprintf(cmd, sizeof cmd, "%s checksum --model %s --tp 2 --rank 2 >/dev/null 2>&1", exe, dir);
    assert_int_equal(WEXITSTATUS(system(cmd)), 2);
    rw_wset_destroy(ref);
    rw_config_free(&cfg);
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: test_trainer_cli PATH-TO-rw-trainer\n");
        return 1;
    }
    exe = argv[1];
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_push_cli),
        cmocka_unit_test(test_checksum_cli),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
