/* test_faults_gpu.c - NCCL faults against live CUDA workers (gpu suite; exits 77 without 2
 * devices; NCCL refuses two ranks of one communicator on one GPU):
 * - a trainer process (GPU 0) that joined the weight-update group, opened a session and had the
 *   worker (GPU 1) post its receive is killed before it broadcasts: the control loop keeps
 *   answering, the worker's bounded wait aborts the communicator and the session
 *   (weights_incomplete), and a new group with a full push recovers without a restart;
 * - init_weights_update_group with a unique id that no trainer ever joins: refused with timeout
 *   / nccl within the requested bound, the weights untouched, a real group afterwards works;
 * - a tensor-parallel rank process (TP2 worker on GPUs 0 and 1) killed while a request is
 *   generating: rank 0's watchdog sees the rank die, aborts the TP communicator it is stuck in,
 *   and the request is answered (an error naming the dead rank, or its output when it finished
 *   first); the worker exits, all within a bound (no hang).
 * Every worker gets a small KV cache (dt_start), so these tests can share the GPUs with others. */
#include "reliability_util.h"

#define BOUND_S 60.0

static dt_worker W;

static int teardown(void **state) {
    (void)state;
    dt_kill(&W);
    return 0;
}

static int setup(void **state) {
    (void)state;
    rw_test_require_gpu(2);
    return 0;
}

static const char *fixture(void) {
    static char p[4096];
    return rw_test_path(p, sizeof p, RW_TEST_FIXTURE);
}

/* rw-trainer push --transport nccl from GPU 0 with --verify; fails the test unless verified. */
static void push_nccl(const char *ep, const char *version) {
    char exe[4096], out[8192];
    dt_exe(exe, sizeof exe, "tools/trainer/rw-trainer");
    const char *args[] = {exe,           "push",        "--model",  fixture(), "--to",      ep,
                          "--transport", "nccl",        "--device", "0",       "--version", version,
                          "--verify",    "--bucket-mb", "1",        NULL};
    int rc = dt_run(args, out, sizeof out, 300);
    if (rc != 0) fail_msg("rw-trainer push exited %d: %s", rc, out);
    json_decref(dt_push_verified(out));
}

static const char *state_now(rw_client *c, char *version, size_t cap) {
    static char st[64];
    json_t *v = dt_ok(c, "get_weight_version", NULL);
    snprintf(st, sizeof st, "%s", dt_str(v, "state", NULL));
    if (version) snprintf(version, cap, "%s", dt_str(v, "version", NULL));
    json_decref(v);
    return st;
}

/* The trainer (this program run with --trainer EP FD): joins the group on GPU 0, opens a session,
 * sends an NCCL bucket, reports on FD, waits to be killed. No cmocka here. */
static _Noreturn void trainer_child(const char *ep, int out_fd) {
    rw_client *c = NULL;
    rw_client_group *g = NULL;
    rw_err e;
    bool ok = rw_client_connect(ep, NULL, &c, &e) == RW_OK &&
              rw_client_group_create(&c, NULL, 1, "weights", 0, 60, &g, &e) == RW_OK &&
              rw_client_begin_update(c, "doomed", false, 1u << 20, 3.0, 30000, &e) == RW_OK;
    rw_sync_manifest *m = NULL;
    int64_t shape[1] = {128};
    ok = ok && rw_sync_manifest_create(&m, &e) == RW_OK &&
         rw_sync_manifest_add(m, "model.norm.weight", RW_DTYPE_BF16, 1, shape, -1, 0, 0,
                              RW_PIECE_PLAIN, NULL, &e) == RW_OK;
    if (ok) {
        uint64_t id;
        rw_msg *msg = NULL;
        rw_reply r;
        ok = rw_client_send_bucket_nccl(c, m, "weights", &id, &e) == RW_OK &&
             rw_client_wait(c, id, 30000, &msg, &r, NULL, NULL, &e) == RW_OK;
        rw_msg_free(msg);
    }
    if (!ok) fprintf(stderr, "trainer: %s\n", e.msg);
    if (write(out_fd, ok ? "y" : "n", 1) != 1) _exit(3);
    for (;;)
        pause(); /* the broadcast never comes: killed here */
}

static void test_nccl_trainer_killed(void **state) {
    (void)state;
    const char *args[] = {"--model", fixture(),   "--device",          "cuda", "--gpu",
                          "1",       "--control", "tcp://127.0.0.1:*", NULL};
    dt_start(&W, args);
    rw_client *c = dt_connect(&W);
    const pid_t wpid = W.pid;
    /* a fresh process image: this one has initialised CUDA, which a forked child cannot use */
    int report;
    pid_t pid = dt_fork_reporter(&report);
    if (pid == 0) {
        char fd[16];
        snprintf(fd, sizeof fd, "%d", report);
        execl("/proc/self/exe", "test_rel_faults_gpu", "--trainer", W.ep, fd, (char *)NULL);
        _exit(127);
    }
    dt_reporter_done(pid, report, true);
    /* the control loop answers while the receive is stuck */
    double t0 = rw_now();
    json_decref(dt_ok(c, "health", NULL));
    assert_true(rw_now() - t0 < 5);
    /* the bounded wait (session timeout_s 3) ends it */
    const char *st = "updating";
    while (!strcmp(st, "updating") && rw_now() - t0 < BOUND_S) {
        usleep(200000);
        st = state_now(c, NULL, 0);
    }
    assert_string_equal(st, "weights_incomplete");
    json_t *s = dt_ok(c, "stats", NULL);
    assert_false(json_is_true(json_object_get(json_object_get(s, "weights"), "nccl_group")));
    json_decref(s);
    dt_refused(c, "generate", "{\"prompt\": [1, 2], \"max_new_tokens\": 2}",
               RW_E_WEIGHTS_INCOMPLETE, NULL, 0);
    /* a new group and a full push, same process */
    push_nccl(W.ep, "after-dead-trainer");
    char v[RW_SYNC_MAX_VERSION + 1];
    assert_string_equal(state_now(c, v, sizeof v), "ready");
    assert_string_equal(v, "after-dead-trainer");
    assert_int_equal(W.pid, wpid);
    assert_int_equal(kill(wpid, 0), 0);
    dt_shutdown(&W, c, 60);
}

static void test_nccl_join_never_completes(void **state) {
    (void)state;
    const char *args[] = {"--model", fixture(),   "--device",          "cuda", "--gpu",
                          "1",       "--control", "tcp://127.0.0.1:*", NULL};
    dt_start(&W, args);
    rw_client *c = dt_connect(&W);
    char v0[RW_SYNC_MAX_VERSION + 1];
    assert_string_equal(state_now(c, v0, sizeof v0), "ready");
    uint8_t id[RW_NCCL_ID_BYTES];
    rw_err e;
    RW_ASSERT_OK(rw_cuda_set_device(0, &e), &e);
    RW_ASSERT_OK(rw_sync_group_unique_id(id, &e), &e);
    char hex[2 * RW_NCCL_ID_BYTES + 1], a[600];
    rw_hex_encode(id, sizeof id, hex);
    snprintf(a, sizeof a,
             "{\"unique_id\": \"%s\", \"world_size\": 2, \"rank_offset\": 1, \"timeout_s\": 3}",
             hex);
    double t0 = rw_now();
    json_t *r = NULL;
    rw_err_clear(&e);
    rw_status st = dt_call(c, "init_weights_update_group", a, &r, &e);
    json_decref(r);
    printf("join without a trainer: %s after %.1f s: %s\n", rw_status_str(st), rw_now() - t0,
           e.msg);
    assert_true(st == RW_E_TIMEOUT || st == RW_E_NCCL);
    assert_true(rw_now() - t0 < BOUND_S);
    char v[RW_SYNC_MAX_VERSION + 1];
    assert_string_equal(state_now(c, v, sizeof v), "ready");
    assert_string_equal(v, v0);
    push_nccl(W.ep, "after-failed-join");
    dt_shutdown(&W, c, 60);
}

/* The first child process of `pid` (the TP2 launcher starts rank 1 as its child). */
static pid_t first_child(pid_t pid) {
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/task/%d/children", (int)pid, (int)pid);
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    int child = -1;
    if (fscanf(f, "%d", &child) != 1) child = -1;
    fclose(f);
    return (pid_t)child;
}

static void test_tp_rank_killed(void **state) {
    (void)state;
    const char *args[] = {"--model", fixture(),   "--device",          "cuda", "--tp", "2", "--gpu",
                          "0",       "--control", "tcp://127.0.0.1:*", NULL};
    dt_start(&W, args);
    rw_client *c = dt_connect(&W);
    pid_t rank1 = first_child(W.pid);
    assert_true(rank1 > 0);
    uint64_t id = dt_send(c, "generate", "{\"prompt\": [1, 2, 3], \"max_new_tokens\": 400}");
    usleep(300000);
    assert_int_equal(kill(rank1, SIGKILL), 0);
    double t0 = rw_now();
    char *res = NULL;
    rw_err e;
    rw_err_clear(&e);
    rw_status st = rw_client_wait_json(c, id, (int)(BOUND_S * 1000), &res, NULL, NULL, &e);
    printf("generate after rank 1 died: %s after %.1f s: %s\n", rw_status_str(st), rw_now() - t0,
           st == RW_OK ? res : e.msg);
    assert_int_not_equal(st, RW_E_TIMEOUT);
    rw_client_free(res);
    if (st != RW_OK) assert_non_null(strstr(e.msg, "rank 1"));
    int rc = dt_wait_exit(&W, BOUND_S);
    printf("worker exit status %d after %.1f s\n", rc, rw_now() - t0);
    assert_int_not_equal(rc, -1); /* -1: it had to be killed (hung) */
    rw_client_close(c);
}

int main(int argc, char **argv) {
    if (argc == 4 && !strcmp(argv[1], "--trainer")) trainer_child(argv[2], atoi(argv[3]));
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_teardown(test_nccl_trainer_killed, teardown),
        cmocka_unit_test_teardown(test_nccl_join_never_completes, teardown),
        cmocka_unit_test_teardown(test_tp_rank_killed, teardown),
    };
    return cmocka_run_group_tests(tests, setup, NULL);
}
