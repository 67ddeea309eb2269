/* test_oplog.c - what an operator sees, issue 17 finding 8, against a live rw-worker (CPU backend,
 * the tiny fixture, an auth token, --log-level info, its log captured):
 * - one line per update event in one format, "<event> key=value ...": update_begin (version,
 *   previous, peer), update_commit (version, bytes, buckets, seconds), update_abort (version,
 *   reason client / forced / timeout / failed, bytes, seconds, state), with the values of the run;
 * - authentication failures and refused messages logged, at most RW_OPLOG_BURST lines per
 *   window, the rest counted as suppressed=N on the next line that passes;
 * - no message doubles its prefix ("sync session: sync session: ...");
 * - replies are valid UTF-8 everywhere: an unknown command and an unknown field whose names are
 *   not UTF-8 come back as messages a strict decoder accepts, the names escaped (\xNN), and the
 *   log shows no control byte (before, the raw bytes went into a msgpack str). */
#include <regex.h>

#include "reliability_util.h"

#define TOKEN "oplog-token"
#define RW_OPLOG_BURST_TEST 10 /* RW_OPLOG_BURST (worker/daemon/oplog.h) */

static dt_worker W;
static char LOG[300];

static int teardown(void **state) {
    (void)state;
    dt_kill(&W);
    unlink(LOG);
    return 0;
}

/* The lines of `log` that hold `event` as their event (after the "[rw I ...] " tag). */
static int count_events(const char *log, const char *event) {
    int n = 0;
    char want[96];
    snprintf(want, sizeof want, "] %s ", event);
    for (const char *p = log; (p = strstr(p, want)); p++)
        n++;
    return n;
}

/* Every operator line has the one format: a tag, the event, then key=value pairs (values bare or
 * quoted with escapes). */
static void check_format(const char *log) {
    static const char *const events[] = {"update_begin", "update_commit",   "update_abort",
                                         "auth_refused", "message_refused", "client_gone",
                                         "client_busy"};
    regex_t re;
    assert_int_equal(regcomp(&re,
                             "^\\[rw I [0-9]{2}:[0-9]{2}:[0-9]{2}\\.[0-9]{3}\\] [a-z_]+"
                             "( [a-z_]+=(\"([^\"\\\\]|\\\\.)*\"|[^ \"]+))+$",
                             REG_EXTENDED | REG_NOSUB),
                     0);
    int checked = 0;
    const char *p = log;
    while (*p) {
        const char *nl = strchr(p, '\n');
        size_t n = nl ? (size_t)(nl - p) : strlen(p);
        char line[2048];
        snprintf(line, sizeof line, "%.*s", (int)(n < sizeof line - 1 ? n : sizeof line - 1), p);
        for (size_t k = 0; k < sizeof events / sizeof *events; k++) {
            char tag[64];
            snprintf(tag, sizeof tag, "] %s ", events[k]);
            if (!strstr(line, tag)) continue;
            if (regexec(&re, line, 0, NULL, 0) != 0) fail_msg("not in the log format: %s", line);
            checked++;
        }
        for (const char *q = line; *q; q++)
            if ((unsigned char)*q < 0x20) fail_msg("a control byte in the log: %s", line);
        p += n + (nl ? 1 : 0);
    }
    regfree(&re);
    assert_true(checked >= 8);
}

/* No message repeats its own prefix ("x: x: ..."). */
static void check_no_doubled_prefix(const char *log) {
    regex_t re;
    assert_int_equal(regcomp(&re, "([a-z_][a-z_ ]*: )\\1", REG_EXTENDED), 0);
    regmatch_t m[2];
    if (regexec(&re, log, 2, m, 0) == 0)
        fail_msg("a doubled prefix in the log: '%.*s'", (int)(m[0].rm_eo - m[0].rm_so),
                 log + m[0].rm_so);
    regfree(&re);
}

/* A reply's message must be valid UTF-8 (the decoder itself takes any bytes). */
static void assert_utf8_reply(rl_sock *s, const void *env, size_t n, const char *needle) {
    rl_reply r;
    rl_call_raw(s, env, n, NULL, NULL, 0, &r);
    assert_false(r.rep.ok);
    if (!rw_utf8_valid(r.rep.message, strlen(r.rep.message)))
        fail_msg("an error reply that is not UTF-8: %s", r.rep.message);
    if (!strstr(r.rep.message, needle)) fail_msg("'%s' lacks '%s'", r.rep.message, needle);
    printf("%s\n", r.rep.message);
    rl_reply_free(&r);
}

static void test_operator_log(void **state) {
    (void)state;
    snprintf(LOG, sizeof LOG, "/tmp/rw_rel_oplog_%d.log", (int)getpid());
    rl_start_logged(&W, NULL,
                    (const char *const[]){"--auth-token", TOKEN, "--log-level", "info", NULL}, LOG);
    rw_client *c = dt_connect(&W);
    rw_err e;
    RW_ASSERT_OK(rw_client_set_auth(c, TOKEN, &e), &e);
    char fixture[4096];
    rw_test_path(fixture, sizeof fixture, RW_TEST_FIXTURE);

    /* a committed update: begin, the fixture from disk (its bytes), commit */
    RW_ASSERT_OK(rw_client_begin_update(c, "op-1", false, 4u << 20, 60, DT_TIMEOUT_MS, &e), &e);
    RW_ASSERT_OK(rw_client_update_from_disk(c, fixture, NULL, DT_TIMEOUT_MS, &e), &e);
    RW_ASSERT_OK(rw_client_commit_update(c, DT_TIMEOUT_MS, NULL, 0, &e), &e);
    json_t *st = dt_ok(c, "stats", NULL);
    const int64_t bytes = dt_int(st, "weights", "last_update_bytes");
    json_decref(st);
    /* an update the client aborts, one an operator forces out, one that times out, one that fails
     */
    RW_ASSERT_OK(rw_client_begin_update(c, "op-2", false, 0, 60, DT_TIMEOUT_MS, &e), &e);
    RW_ASSERT_OK(rw_client_abort_update(c, DT_TIMEOUT_MS, NULL, &e), &e);
    json_decref(dt_ok(c, "begin_update", "{\"version\": \"op-3\"}"));
    json_decref(dt_ok(c, "abort_update", "{\"force\": true}"));
    json_decref(dt_ok(c, "begin_update", "{\"version\": \"op-4\", \"timeout_s\": 0.3}"));
    char *log = rl_wait_log(LOG, "update_abort version=\"op-4\" reason=timeout", 10);
    free(log);
    json_decref(dt_ok(c, "begin_update", "{\"version\": \"op-5\"}"));
    char a[4400];
    snprintf(a, sizeof a, "{\"path\": \"%s/nope\"}", fixture);
    dt_refused(c, "update_weights_from_disk", a, RW_E_NOT_FOUND, NULL, 0);

    /* 25 requests without the token and 25 messages of six frames: 10 lines each in a window */
    rl_sock s;
    rl_open(&s, W.ep);
    char msg[512];
    for (int i = 0; i < 25; i++) {
        assert_int_equal(rl_status(&s, 100 + (uint64_t)i, "health", NULL, NULL, 0, msg, sizeof msg),
                         RW_E_AUTH);
        size_t n;
        void *env = rl_env(200 + (uint64_t)i, "health", NULL, &n);
        const void *f[7] = {env, "a", "b", "c", "d", "e", "f"};
        const size_t l[7] = {n, 1, 1, 1, 1, 1, 1};
        rl_send(&s, f, l, 7);
        free(env);
        rl_reply r;
        assert_true(rl_recv(&s, DT_TIMEOUT_MS, &r));
        assert_int_equal(r.rep.status, RW_E_FORMAT);
        rl_reply_free(&r);
    }
    /* names that are not UTF-8 (with a control byte), quoted back escaped */
    rw_mw *w;
    RW_ASSERT_OK(rw_mw_create(&w, &e), &e);
    rw_mw_request(w, 300, "fly\xff\xfe\x1b[31m");
    rw_mw_map(w, 1);
    rw_mw_kv_str(w, "auth", TOKEN);
    const void *p;
    size_t n;
    RW_ASSERT_OK(rw_mw_finish(w, &p, &n, &e), &e);
    assert_utf8_reply(&s, p, n, "unknown command 'fly\\xff\\xfe\\x1b[31m'");
    rw_mw_reset(w);
    rw_mw_request(w, 301, "health");
    rw_mw_map(w, 2);
    rw_mw_kv_str(w, "auth", TOKEN);
    rw_mw_kv_bool(w, "col\xc3\x28our", true); /* an invalid 2-byte sequence */
    RW_ASSERT_OK(rw_mw_finish(w, &p, &n, &e), &e);
    assert_utf8_reply(&s, p, n, "unknown field 'col");
    rw_mw_destroy(w);
    rl_close(&s);

    log = rl_wait_log(LOG, "update_abort version=\"op-5\" reason=failed", 10);
    char want[200];
    snprintf(want, sizeof want,
             "update_commit version=\"op-1\" bytes=%lld buckets=", (long long)bytes);
    assert_non_null(strstr(log, "update_begin version=\"op-1\" previous="));
    assert_non_null(strstr(log, want));
    assert_non_null(strstr(log, "update_abort version=\"op-2\" reason=client"));
    assert_non_null(strstr(log, "update_abort version=\"op-3\" reason=forced"));
    const char *op5 = strstr(log, "version=\"op-5\" reason=failed");
    assert_non_null(op5);
    assert_non_null(strstr(op5, " message=\""));
    assert_non_null(strstr(log, " seconds="));
    assert_int_equal(count_events(log, "auth_refused"), RW_OPLOG_BURST_TEST);
    assert_int_equal(count_events(log, "message_refused"), RW_OPLOG_BURST_TEST);
    check_format(log);
    check_no_doubled_prefix(log);
    assert_null(strstr(log, TOKEN));
    free(log);
    /* after the window, the next refusal reports what was suppressed */
    usleep(10100000);
    rl_open(&s, W.ep);
    assert_int_equal(rl_status(&s, 400, "health", NULL, NULL, 0, msg, sizeof msg), RW_E_AUTH);
    rl_close(&s);
    log = rl_wait_log(LOG, "suppressed=15", 10);
    free(log);
    dt_shutdown(&W, c, 30);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_teardown(test_operator_log, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
