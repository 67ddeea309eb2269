/* test_once.c - `rw-worker --once` end to end (argv[1] is the executable): greedy generation on
 * the fixture checkpoint matches the transformers reference, random weights from a config are
 * reproducible from the seed, seeded sampling is reproducible (and the same under --precision
 * high, which the CPU backend's fp32 makes no difference to), bad usage exits 2, and --help and
 * --version answer on stdout with exit 0 as the daemon's do. */
#include <math.h>
#include <sys/wait.h>

#include "rw_test.h"

static const char *exe;

/* Runs a command, captures stdout; returns the exit status. */
static int run(const char *cmd, char *out, size_t cap) {
    FILE *p = popen(cmd, "r");
    if (!p) fail_msg("popen %s", cmd);
    size_t n = fread(out, 1, cap - 1, p);
    out[n] = 0;
    int st = pclose(p);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* Parses the integers of the "tokens" array. */
static int parse_tokens(const char *json, int32_t *t, int cap) {
    const char *p = strstr(json, "\"tokens\": [");
    if (!p) return -1;
    p += strlen("\"tokens\": [");
    int n = 0;
    while (*p && *p != ']' && n < cap) {
        char *end;
        t[n++] = (int32_t)strtol(p, &end, 10);
        p = end;
        while (*p == ',' || *p == ' ')
            p++;
    }
    return n;
}

static double first_logprob(const char *json) {
    const char *p = strstr(json, "\"logprobs\": [");
    return p ? strtod(p + strlen("\"logprobs\": ["), NULL) : NAN;
}

static void test_fixture_greedy(void **state) {
    (void)state;
    char dir[1024], path[1200], cmd[8192], out[16384];
    rw_test_path(dir, sizeof dir, RW_TEST_FIXTURE);
    snprintf(path, sizeof path, "%s/reference.safetensors", dir);
    rw_st_file *ref;
    rw_err err = {0};
    RW_ASSERT_OK(rw_st_open(path, &ref, &err), &err);
    const rw_st_entry *pr = rw_st_find(ref, "prompt.1");
    const rw_st_entry *gr = rw_st_find(ref, "greedy.1");
    const rw_st_entry *lp = rw_st_find(ref, "greedy_logprob.1");
    assert_non_null(pr);
    assert_non_null(gr);
    assert_non_null(lp);
    int k =
        snprintf(cmd, sizeof cmd, "%s --model %s --once --max-new-tokens 24 --prompt ", exe, dir);
    const int32_t *p = pr->data;
    for (int i = 0; i < pr->shape[0]; i++)
        k += snprintf(cmd + k, sizeof cmd - (size_t)k, "%s%d", i ? "," : "", p[i]);
    assert_int_equal(run(cmd, out, sizeof out), 0);
    int32_t t[64];
    assert_int_equal(parse_tokens(out, t, 64), 24);
    rw_assert_bytes_equal(t, gr->data, 24 * sizeof(int32_t), "greedy tokens");
    assert_true(fabs(first_logprob(out) - ((const float *)lp->data)[0]) < 1e-3);
    assert_non_null(strstr(out, "\"finish\": \"length\""));
    rw_st_close(ref);
}

static void test_random_weights_and_sampling(void **state) {
    (void)state;
    char dir[1024], cmd[4096], a[8192], b[8192], c[8192];
    rw_test_path(dir, sizeof dir, RW_TEST_FIXTURE);
    snprintf(cmd, sizeof cmd,
             "%s --once --config %s/config.json --random-weights --seed 3 --prompt 5,6,7 "
             "--max-new-tokens 12 --temperature 0.9 --top-p 0.95 --top-logprobs 2",
             exe, dir);
    assert_int_equal(run(cmd, a, sizeof a), 0);
    assert_int_equal(run(cmd, b, sizeof b), 0);
    assert_string_equal(a, b);
    /* the CPU backend computes in fp32 whatever the precision: the same output */
    const size_t len = strlen(cmd);
    snprintf(cmd + len, sizeof cmd - len, " --precision high");
    assert_int_equal(run(cmd, b, sizeof b), 0);
    assert_string_equal(a, b);
    int32_t t[32];
    assert_int_equal(parse_tokens(a, t, 32), 12);
    assert_non_null(strstr(a, "\"top_logprobs\": [[["));
    /* another seed gives other weights and draws */
    snprintf(cmd, sizeof cmd,
             "%s --once --config %s/config.json --random-weights --seed 4 --prompt 5,6,7 "
             "--max-new-tokens 12 --temperature 0.9 --top-p 0.95 --top-logprobs 2",
             exe, dir);
    assert_int_equal(run(cmd, c, sizeof c), 0);
    assert_string_not_equal(a, c);
}

static void test_usage(void **state) {
    (void)state;
    char cmd[2048], out[1024];
    snprintf(cmd, sizeof cmd, "%s --once --prompt 1,2 2>/dev/null", exe);
    assert_int_equal(run(cmd, out, sizeof out), 2);
    snprintf(cmd, sizeof cmd, "%s --once --model /nonexistent --prompt 1,x 2>/dev/null", exe);
    assert_int_equal(run(cmd, out, sizeof out), 2);
    snprintf(cmd, sizeof cmd, "%s --once --model /nonexistent --prompt 1,2 2>/dev/null", exe);
    assert_int_equal(run(cmd, out, sizeof out), 1);
    snprintf(cmd, sizeof cmd, "%s --once --model /x --prompt 1 --bogus 2>/dev/null", exe);
    assert_int_equal(run(cmd, out, sizeof out), 2);
    snprintf(cmd, sizeof cmd, "%s --once --model /x --prompt 1 --precision fp64 2>/dev/null", exe);
    assert_int_equal(run(cmd, out, sizeof out), 2);
    snprintf(cmd, sizeof cmd, "%s --once --help 2>/dev/null", exe);
    assert_int_equal(run(cmd, out, sizeof out), 0);
    assert_non_null(strstr(out, "usage: rw-worker --once"));
    snprintf(cmd, sizeof cmd, "%s --once --version 2>/dev/null", exe);
    assert_int_equal(run(cmd, out, sizeof out), 0);
    assert_true(strncmp(out, "rw-worker ", 10) == 0);
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: test_worker_once RW_WORKER\n");
        return 1;
    }
    exe = argv[1];
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fixture_greedy),
        cmocka_unit_test(test_random_weights_and_sampling),
        cmocka_unit_test(test_usage),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
