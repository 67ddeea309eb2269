/* test_limits.c - what one client may cost the worker, issue 17 findings 6 and 7, against live
 * rw-workers (CPU backend, the tiny fixture):
 * - memory before authentication: an unauthenticated peer sends a frame of 1 GiB + 1 byte (the
 *   default --max-frame-bytes is 1 GiB) to a worker that requires a token: its connection is
 *   dropped as soon as the frame's length is read, the worker's resident memory does not grow by
 *   the frame (before, it grew by 1 GiB before the request was refused), authenticated clients
 *   are served meanwhile, and the operator log says nothing of the peer's bytes;
 * - the client library learns the limit from begin_update (max_frame_bytes) and refuses a bigger
 *   bucket itself with `range` (the worker would drop the connection and the reply never come);
 * - per-client caps: a client's queued requests past --max-client-requests (default 131072: three
 *   commands of 65536 requests) and its tokens past --max-client-tokens are refused with `busy`
 *   naming the option, while another client is still served; once its work is done it may queue
 *   again (before, one client could queue 300,000+ requests);
 * - a client that disconnects with requests in flight: they are aborted and their KV blocks
 *   freed within a second or two, logged as client_gone (before, the worker generated them all
 *   for nobody). */
#include <inttypes.h>
#include <sys/mman.h>

#include "reliability_util.h"

static dt_worker W;
static char LOG[300];

static int teardown(void **state) {
    (void)state;
    dt_kill(&W);
    if (LOG[0]) unlink(LOG);
    return 0;
}

/* Polls stats (through c) until requests_in_flight and kv_blocks_used are 0 or limit_s passes;
 * returns the seconds it took (fails past the limit). */
static double wait_idle(rw_client *c, double limit_s) {
    const double t0 = rw_now();
    for (;;) {
        json_t *s = dt_ok(c, "stats", NULL);
        const int64_t inflight = dt_int(s, "queue", "requests_in_flight");
        const int64_t used = dt_int(s, "memory", "kv_blocks_used");
        json_decref(s);
        if (inflight == 0 && used == 0) return rw_now() - t0;
        if (rw_now() - t0 > limit_s)
            fail_msg("%" PRId64 " requests in flight, %" PRId64 " KV blocks used after %.1f s",
                     inflight, used, limit_s);
        usleep(20000);
    }
}

static void test_frame_limit_before_auth(void **state) {
    (void)state;
    snprintf(LOG, sizeof LOG, "/tmp/rw_rel_limits_%d.log", (int)getpid());
    setenv("RW_AUTH_TOKEN", "limits-secret", 1);
    rl_start_logged(&W, NULL, (const char *const[]){"--log-level", "info", NULL}, LOG);
    rw_client *c = dt_connect(&W); /* authenticated through RW_AUTH_TOKEN */
    unsetenv("RW_AUTH_TOKEN");
    json_decref(dt_ok(c, "health", NULL));
    const long rss0 = rl_rss_kib(W.pid);
    assert_true(rss0 > 0);
    /* 1 GiB + 1 of zero pages that are never touched: the sender's memory stays small */
    const size_t big = (1u << 30) + 1;
    void *frame = mmap(NULL, big, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    assert_true(frame != MAP_FAILED);
    rl_sock s;
    rl_open(&s, W.ep);
    size_t n;
    void *env = rl_env(9, "health", NULL, &n);
    assert_true(zmq_send(s.sock, env, n, ZMQ_SNDMORE) >= 0);
    free(env);
    zmq_msg_t m;
    assert_int_equal(zmq_msg_init_data(&m, frame, big, NULL, NULL), 0);
    assert_true(zmq_msg_send(&m, s.sock, 0) >= 0);
    /* while the frame is on its way, and after: an authenticated client is served, and the
     * worker's memory does not take the frame */
    long peak = rss0;
    const double end = rw_now() + 3;
    while (rw_now() < end) {
        json_decref(dt_ok(c, "health", NULL));
        const long r = rl_rss_kib(W.pid);
        peak = r > peak ? r : peak;
        usleep(50000);
    }
    printf("worker RSS %ld KiB before, peak %ld KiB while 1 GiB + 1 came\n", rss0, peak);
    assert_true(peak - rss0 < 128 * 1024);
    /* the peer got no reply: its connection was dropped */
    rl_reply r;
    assert_false(rl_recv(&s, 500, &r));
    rl_close(&s);
    munmap(frame, big);
    /* an unauthenticated request is refused and logged, the peer's bytes nowhere in the log */
    rl_open(&s, W.ep);
    char msg[256];
    assert_int_equal(rl_status(&s, 10, "shutdown", NULL, NULL, 0, msg, sizeof msg), RW_E_AUTH);
    rl_close(&s);
    char *log = rl_wait_log(LOG, "auth_refused cmd=\"shutdown\"", 10);
    assert_null(strstr(log, "limits-secret"));
    free(log);
    dt_shutdown(&W, c, 30);
}

static void test_client_refuses_frame_over_limit(void **state) {
    (void)state;
    rl_start_fixture(&W, NULL, (const char *const[]){"--max-frame-bytes", "67108864", NULL});
    rw_client *c = dt_connect(&W);
    rw_err e;
    RW_ASSERT_OK(rw_client_begin_update(c, "too-big", false, 128u << 20, 30, DT_TIMEOUT_MS, &e),
                 &e);
    rw_sync_manifest *m;
    RW_ASSERT_OK(rw_sync_manifest_create(&m, &e), &e);
    int64_t shape[1] = {128};
    RW_ASSERT_OK(rw_sync_manifest_add(m, "model.norm.weight", RW_DTYPE_BF16, 1, shape, -1, 0, 0,
                                      RW_PIECE_PLAIN, NULL, &e),
                 &e);
    rw_sync_manifest_set_bytes(m, (64u << 20) + 4096);
    void *buf = calloc(1, (64u << 20) + 4096);
    const double t0 = rw_now();
    rw_err_clear(&e);
    assert_int_equal(rw_client_update_weights_zmq(c, m, buf, DT_TIMEOUT_MS, &e), RW_E_RANGE);
    printf("refused by the client in %.3f s: %s\n", rw_now() - t0, e.msg);
    assert_true(rw_now() - t0 < 5);
    assert_non_null(strstr(e.msg, "max_frame_bytes 67108864"));
    free(buf);
    rw_sync_manifest_destroy(m);
    /* nothing reached the worker: its session is open and untouched */
    json_t *v = dt_ok(c, "get_weight_version", NULL);
    assert_string_equal(dt_str(v, "state", NULL), "updating");
    json_decref(v);
    bool intact = false;
    RW_ASSERT_OK(rw_client_abort_update(c, DT_TIMEOUT_MS, &intact, &e), &e);
    assert_true(intact);
    dt_shutdown(&W, c, 30);
}

/* {"prompts": [[1,2,3] x n], max_new_tokens} */
static char *prompts(int n, int max_new) {
    size_t cap = (size_t)n * 10 + 64, k = 0;
    char *a = malloc(cap);
    k += (size_t)snprintf(a, cap, "{\"prompts\": [");
    for (int i = 0; i < n; i++)
        k += (size_t)snprintf(a + k, cap - k, "%s[1,2,3]", i ? "," : "");
    snprintf(a + k, cap - k, "], \"max_new_tokens\": %d}", max_new);
    return a;
}

static void test_per_client_caps(void **state) {
    (void)state;
    snprintf(LOG, sizeof LOG, "/tmp/rw_rel_limits_%d.log", (int)getpid());
    rl_start_logged(&W, NULL,
                    (const char *const[]){"--max-client-requests", "100", "--max-client-tokens",
                                          "20000", "--log-level", "info", NULL},
                    LOG);
    rw_client *a = dt_connect(&W), *b = dt_connect(&W);
    json_decref(dt_ok(a, "pause", "{\"mode\": \"retract\"}")); /* work stays queued */
    char *p80 = prompts(80, 8), *p30 = prompts(30, 8);
    const uint64_t first = dt_send(a, "generate", p80);
    char msg[512];
    dt_refused(a, "generate", p30, RW_E_BUSY, msg, sizeof msg);
    printf("requests: %s\n", msg);
    assert_non_null(strstr(msg, "--max-client-requests"));
    assert_non_null(strstr(msg, "80 requests in flight"));
    /* another client has its own allowance */
    const uint64_t other = dt_send(b, "generate", p30);
    /* tokens: 80 x (3 + 8) in flight, one request of 3 + 19200 more passes 20000 */
    dt_refused(a, "generate", "{\"prompt\": [1,2,3], \"max_new_tokens\": 19200}", RW_E_BUSY, msg,
               sizeof msg);
    printf("tokens: %s\n", msg);
    assert_non_null(strstr(msg, "--max-client-tokens"));
    json_decref(dt_ok(a, "resume", NULL));
    json_decref(dt_wait_gen(a, first, NULL));
    json_decref(dt_wait_gen(b, other, NULL));
    /* its work done, the client may queue again */
    json_decref(dt_ok(a, "generate", p30));
    free(p80);
    free(p30);
    char *log = rl_wait_log(LOG, "client_busy", 10);
    free(log);
    rw_client_close(b);
    dt_shutdown(&W, a, 30);
}

/* The default cap: three commands of 65536 requests from one client are more than 131072. */
static void test_default_request_cap(void **state) {
    (void)state;
    rl_start_fixture(&W, NULL, NULL);
    rw_client *a = dt_connect(&W), *b = dt_connect(&W);
    json_decref(dt_ok(a, "pause", "{\"mode\": \"abort\"}"));
    char *p = prompts(65536, 1);
    const uint64_t g1 = dt_send(a, "generate", p), g2 = dt_send(a, "generate", p);
    char msg[512];
    dt_refused(a, "generate", p, RW_E_BUSY, msg, sizeof msg);
    printf("third command: %s\n", msg);
    assert_non_null(strstr(msg, "per-client limit of 131072"));
    json_t *h = dt_ok(b, "health", NULL);
    assert_int_equal(dt_int(h, "requests_in_flight", NULL), 131072);
    json_decref(h);
    json_t *r = dt_ok(b, "abort", "{\"all\": true}");
    assert_int_equal(dt_int(r, "aborted", NULL), 131072);
    json_decref(r);
    json_decref(dt_wait_gen(a, g1, NULL));
    json_decref(dt_wait_gen(a, g2, NULL));
    json_decref(dt_ok(a, "resume", NULL));
    json_decref(dt_ok(a, "generate", "{\"prompt\": [1,2,3], \"max_new_tokens\": 2}"));
    free(p);
    rw_client_close(b);
    dt_shutdown(&W, a, 60);
}

static void test_disconnect_aborts(void **state) {
    (void)state;
    snprintf(LOG, sizeof LOG, "/tmp/rw_rel_limits_%d.log", (int)getpid());
    rl_start_logged(&W, NULL, (const char *const[]){"--log-level", "info", NULL}, LOG);
    rw_client *c = dt_connect(&W);
    /* 256 requests of 400 tokens: about 100,000 tokens, many seconds of work */
    char *p = prompts(256, 400);
    for (int round = 0; round < 2; round++) {
        rl_sock s;
        rl_open(&s, W.ep);
        rl_send_request(&s, 1, "generate", p);
        /* round 0: gone while generating; round 1: gone at once (maybe before it was read) */
        if (round == 0) {
            const double end = rw_now() + 10;
            for (;;) {
                json_t *h = dt_ok(c, "health", NULL);
                const int64_t k = dt_int(h, "requests_in_flight", NULL);
                json_decref(h);
                if (k == 256) break;
                if (rw_now() > end) fail_msg("the generate did not start");
                usleep(10000);
            }
            usleep(300000);
        }
        rl_close(&s);
        const double dt = wait_idle(c, 5);
        printf("round %d: requests aborted and KV freed %.3f s after the client left\n", round, dt);
    }
    free(p);
    char *log = rl_wait_log(LOG, "client_gone", 10);
    assert_non_null(strstr(log, "requests_aborted=256"));
    free(log);
    /* the worker goes on serving */
    dt_ref ref;
    dt_ref_load(&ref);
    rl_assert_reference(c, &ref);
    dt_shutdown(&W, c, 30);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_teardown(test_frame_limit_before_auth, teardown),
        cmocka_unit_test_teardown(test_client_refuses_frame_over_limit, teardown),
        cmocka_unit_test_teardown(test_per_client_caps, teardown),
        cmocka_unit_test_teardown(test_default_request_cap, teardown),
        cmocka_unit_test_teardown(test_disconnect_aborts, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
