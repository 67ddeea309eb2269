/* test_auth.c - authentication of the control socket on a non-loopback bind (tcp://0.0.0.0):
 * rw-worker refuses to start there without a token; with one, a client without the token (or
 * with a wrong one, a prefix of it, a longer one, one of another type) is refused with status
 * auth on every command - state-changing ones included, which then have no effect - while a
 * client that carries it (rw_client_set_auth, or RW_AUTH_TOKEN in the client's environment) is
 * served: health, generate with the fixture's greedy tokens, and a full weight push through the
 * client library. The worker also takes its token from RW_AUTH_TOKEN. */
#include "reliability_util.h"

#define TOKEN "c0ntrol-Plane-Secret-4242"

static dt_worker W; /* killed by the teardown when a failed check left it running */

static int teardown(void **state) {
    (void)state;
    dt_kill(&W);
    return 0;
}

/* "tcp://0.0.0.0:PORT" -> "tcp://127.0.0.1:PORT" (a client must name a host). */
static void client_addr(const char *ep, char *out, size_t cap) {
    const char *colon = strrchr(ep, ':');
    assert_non_null(colon);
    snprintf(out, cap, "tcp://127.0.0.1%s", colon);
}

static rw_client *connect_to(const char *addr, const char *token) {
    rw_client *c = NULL;
    rw_err e;
    RW_ASSERT_OK(rw_client_connect(addr, NULL, &c, &e), &e);
    RW_ASSERT_OK(rw_client_set_auth(c, token, &e), &e);
    return c;
}

static void refused_auth(rw_client *c, const char *cmd, const char *args) {
    char msg[512];
    dt_refused(c, cmd, args, RW_E_AUTH, msg, sizeof msg);
    assert_non_null(strstr(msg, "authentication failed"));
}

/* rw-worker with `bind` (and `token` when non-NULL) must exit 2 naming the missing
 * authentication (stderr is captured through a shell). */
static void refuses_to_start(const char *bind, const char *token) {
    char model[4096], exe[4096], out[8192];
    rw_test_path(model, sizeof model, RW_TEST_FIXTURE);
    dt_exe(exe, sizeof exe, "worker/rw-worker");
    const char *args[] = {"/bin/sh",
                          "-c",
                          "exec \"$0\" \"$@\" 2>&1",
                          exe,
                          "--model",
                          model,
                          "--device",
                          "cpu",
                          "--control",
                          bind,
                          token ? "--auth-token" : NULL,
                          token,
                          NULL};
    assert_int_equal(dt_run(args, out, sizeof out, 60), 2);
    if (!strstr(out, "without authentication"))
        fail_msg("%s: the refusal does not name the missing authentication: %s", bind, out);
}

static void test_refuses_open_bind_without_token(void **state) {
    (void)state;
    unsetenv("RW_AUTH_TOKEN");
    refuses_to_start("tcp://0.0.0.0:*", NULL);
    refuses_to_start("tcp://*:*", NULL);
    refuses_to_start("tcp://0.0.0.0:*", ""); /* an empty token is no token */
}

static void test_token_required_and_accepted(void **state) {
    (void)state;
    dt_ref ref;
    dt_ref_load(&ref);
    unsetenv("RW_AUTH_TOKEN");
    const char *extra[] = {"--auth-token", TOKEN, NULL};
    rl_start_fixture(&W, "tcp://0.0.0.0:*", extra);
    assert_non_null(strstr(W.ep, "0.0.0.0"));
    char addr[256];
    client_addr(W.ep, addr, sizeof addr);

    /* refused: no token, wrong tokens, a token of another type */
    rw_client *anon = connect_to(addr, NULL);
    refused_auth(anon, "health", NULL);
    refused_auth(anon, "generate", "{\"prompt\": [1, 2], \"max_new_tokens\": 2}");
    refused_auth(anon, "begin_update", "{\"version\": \"intruder\"}");
    refused_auth(anon, "release_memory", NULL);
    refused_auth(anon, "shutdown", NULL);
    refused_auth(anon, "health", "{\"auth\": \"wrong\"}");
    refused_auth(anon, "health", "{\"auth\": \"c0ntrol-Plane-Secret-424\"}");   /* a prefix */
    refused_auth(anon, "health", "{\"auth\": \"c0ntrol-Plane-Secret-42420\"}"); /* longer */
    refused_auth(anon, "health", "{\"auth\": \"\"}");
    refused_auth(anon, "health", "{\"auth\": 4242}");
    refused_auth(anon, "health", "{\"auth\": null}");
    rw_client *wrong = connect_to(addr, "not-" TOKEN);
    char v[RW_SYNC_MAX_VERSION + 1];
    rw_err e;
    rw_err_clear(&e);
    assert_int_equal(rw_client_get_weight_version(wrong, DT_TIMEOUT_MS, v, sizeof v, NULL, &e),
                     RW_E_AUTH);
    rw_client_close(wrong);

    /* served: the token on every request of the client */
    rw_client *c = connect_to(addr, TOKEN);
    json_t *h = dt_ok(c, "health", NULL);
    assert_string_equal(dt_str(h, "status", NULL), "ok");
    json_decref(h);
    /* the refused begin_update, release_memory and shutdown had no effect */
    int state_code = -1;
    RW_ASSERT_OK(rw_client_get_weight_version(c, DT_TIMEOUT_MS, v, sizeof v, &state_code, &e), &e);
    assert_int_equal(state_code, RW_SYNC_READY);
    json_t *s = dt_ok(c, "stats", NULL);
    assert_false(json_is_true(json_object_get(json_object_get(s, "memory"), "weights_released")));
    assert_int_equal(dt_int(s, "weights", "updates"), 0);
    json_decref(s);
    assert_int_equal(kill(W.pid, 0), 0);
    rl_assert_reference(c, &ref);
    /* a trainer push through the client library */
    char fixture[4096];
    rw_test_path(fixture, sizeof fixture, RW_TEST_FIXTURE);
    rw_push_opts o = {.transport = "zmq",
                      .bucket_bytes = 4u << 20,
                      .version = "pushed-with-token",
                      .verify = true,
                      .timeout_ms = DT_TIMEOUT_MS};
    rw_push_summary sum;
    RW_ASSERT_OK(rw_sync_push_ckpt(&c, 1, NULL, fixture, &o, &sum, &e), &e);
    assert_true(sum.verified);
    assert_int_equal(sum.mismatches, 0);
    RW_ASSERT_OK(rw_client_get_weight_version(c, DT_TIMEOUT_MS, v, sizeof v, NULL, &e), &e);
    assert_string_equal(v, "pushed-with-token");
    /* the same push without the token changes nothing */
    o.version = "pushed-without-token";
    assert_int_equal(rw_sync_push_ckpt(&anon, 1, NULL, fixture, &o, &sum, &e), RW_E_AUTH);
    RW_ASSERT_OK(rw_client_get_weight_version(c, DT_TIMEOUT_MS, v, sizeof v, NULL, &e), &e);
    assert_string_equal(v, "pushed-with-token");
    rw_client_close(anon);

    /* the client takes the token from RW_AUTH_TOKEN */
    setenv("RW_AUTH_TOKEN", TOKEN, 1);
    rw_client *env_client = NULL;
    RW_ASSERT_OK(rw_client_connect(addr, NULL, &env_client, &e), &e);
    unsetenv("RW_AUTH_TOKEN");
    json_decref(dt_ok(env_client, "health", NULL));
    rw_client_close(env_client);

    dt_shutdown(&W, c, 30);
}

static void test_worker_token_from_env(void **state) {
    (void)state;
    setenv("RW_AUTH_TOKEN", TOKEN, 1);
    rl_start_fixture(&W, "tcp://0.0.0.0:*", NULL); /* inherits RW_AUTH_TOKEN */
    unsetenv("RW_AUTH_TOKEN");
    char addr[256];
    client_addr(W.ep, addr, sizeof addr);
    rw_client *anon = connect_to(addr, NULL);
    refused_auth(anon, "health", NULL);
    rw_client_close(anon);
    rw_client *c = connect_to(addr, TOKEN);
    json_decref(dt_ok(c, "health", NULL));
    dt_shutdown(&W, c, 30);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_refuses_open_bind_without_token),
        cmocka_unit_test_teardown(test_token_required_and_accepted, teardown),
        cmocka_unit_test_teardown(test_worker_token_from_env, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
