/* test_sessions.c - update sessions belong to the client that opened them (protocol 2), issue 17
 * finding 5, against a live rw-worker (CPU backend, the tiny fixture, its log captured):
 * - trainer A opens a session and writes 1 of its buckets; client B, without A's token, sends
 *   commit_update, abort_update, update_weights (a valid bucket) and update_weights_from_disk, with
 *   no token, with another token and with a token that is not a string: each is refused (`auth`,
 *   `protocol` for the non-string) and changes nothing - the session stays open, its bucket count
 *   unchanged (before, B's commit served A's half-written update under the new version);
 * - A, with its token, writes the rest and commits: the fixture's weights and reference tokens;
 * - a stuck session (its trainer gone quiet) ended by an operator with abort_update {force: true}
 *   from another client: intact, logged as update_abort reason=forced;
 * - rw-ctl carries a token with --session and ends a session with --force;
 * - the C client sends its token by itself: rw_sync_push_ckpt from one client while another
 *   client's foreign commit is refused. */
#include <inttypes.h>

#include "reliability_util.h"

typedef struct fx {
    rl_fx x;
    char log[300];
} fx;

static fx F;

static int setup(void **state) {
    snprintf(F.log, sizeof F.log, "/tmp/rw_rel_sessions_%d.log", (int)getpid());
    rl_fx_start(&F.x, (const char *const[]){"--log-level", "info", NULL}, F.log);
    *state = &F;
    return 0;
}

static int teardown(void **state) {
    (void)state;
    rl_fx_stop(&F.x);
    unlink(F.log);
    return 0;
}

/* A one-tensor bucket of model.norm.weight (bf16 [128]) holding the fixture's bytes. */
static void norm_bucket(uint8_t *buf, size_t cap) {
    char p[4200];
    snprintf(p, sizeof p, "%s/model.safetensors", F.x.fixture);
    rw_st_file *st;
    rw_err e;
    RW_ASSERT_OK(rw_st_open(p, &st, &e), &e);
    const rw_st_entry *t = rw_st_find(st, "model.norm.weight");
    assert_non_null(t);
    assert_int_equal(t->end - t->begin, 256);
    assert_true(cap >= 256);
    RW_ASSERT_OK(rw_st_read(st, t->begin, buf, 256, &e), &e);
    rw_st_close(st);
}

static const char *bucket_args(const char *session_field, char *buf, size_t cap) {
    snprintf(buf, cap,
             "{%s\"transport\": \"zmq\", \"manifest\": {\"nbytes\": 256, \"tensors\": [{\"name\": "
             "\"model.norm.weight\", \"dtype\": \"bf16\", \"shape\": [128], \"offset\": 0, "
             "\"nbytes\": 256}]}}",
             session_field);
    return buf;
}

/* Client B's requests on A's session, each refused without changing it. */
typedef struct foreign_rq {
    const char *cmd, *args;
    bool frame;
} foreign_rq;

static void foreign_requests(rl_sock *b, const char *version, const uint8_t *bucket) {
    char a[1024], msg[512];
    static const char *const tokens[] = {"", "\"session\": \"0123456789abcdef0123456789abcdef\", ",
                                         "\"session\": 42, "};
    for (int k = 0; k < 3; k++) {
        const rw_status want = k == 2 ? RW_E_PROTOCOL : RW_E_AUTH;
        char c_args[128], d_args[4600];
        /* {"session": ...} without the trailing ", " */
        snprintf(c_args, sizeof c_args, "{%.*s}", (int)strlen(tokens[k]) - (k ? 2 : 0), tokens[k]);
        snprintf(d_args, sizeof d_args, "{%s\"path\": \"%s\"}", tokens[k], F.x.fixture);
        const foreign_rq rq[4] = {
            {"commit_update", c_args, false},
            {"abort_update", c_args, false},
            {"update_weights", bucket_args(tokens[k], a, sizeof a), true},
            {"update_weights_from_disk", d_args, false},
        };
        for (int i = 0; i < 4; i++) {
            rw_status st = rl_status(b, 100 + (uint64_t)(10 * k + i), rq[i].cmd, rq[i].args,
                                     rq[i].frame ? bucket : NULL, 256, msg, sizeof msg);
            if (st != want)
                fail_msg("%s %s by another client: %s (%s), expected %s", rq[i].cmd, rq[i].args,
                         rw_status_str(st), msg, rw_status_str(want));
            assert_non_null(strstr(msg, "args.session"));
            if (want == RW_E_AUTH) assert_non_null(strstr(msg, version));
            /* nothing changed: the session is open, to A's version */
            json_t *v = dt_ok(F.x.c, "get_weight_version", NULL);
            assert_string_equal(dt_str(v, "state", NULL), "updating");
            assert_string_equal(dt_str(v, "updating_to", NULL), version);
            json_decref(v);
        }
    }
    printf("another client's commit / abort / update_weights / from_disk refused: %s\n", msg);
}

static void test_foreign_client_refused(void **state) {
    (void)state;
    static uint8_t bucket[256];
    norm_bucket(bucket, sizeof bucket);
    rl_sock a, b;
    rl_open(&a, F.x.w.ep);
    rl_open(&b, F.x.w.ep);
    char token[64], args[1024], field[128], msg[512];
    rl_begin(&a, 1, "{\"version\": \"owned\", \"bucket_bytes\": 4194304}", token, sizeof token);
    snprintf(field, sizeof field, "\"session\": \"%s\", ", token);
    /* A writes one bucket of several */
    assert_int_equal(rl_status(&a, 2, "update_weights", bucket_args(field, args, sizeof args),
                               bucket, sizeof bucket, msg, sizeof msg),
                     RW_OK);
    foreign_requests(&b, "owned", bucket);
    json_t *s = dt_ok(F.x.c, "stats", NULL);
    assert_int_equal(dt_int(s, "weights", "updates"), 0);
    json_decref(s);
    /* A finishes its session: the whole fixture from disk inside it, then its commit */
    char d[4400];
    snprintf(d, sizeof d, "{\"session\": \"%s\", \"path\": \"%s\"}", token, F.x.fixture);
    assert_int_equal(rl_status(&a, 3, "update_weights_from_disk", d, NULL, 0, msg, sizeof msg),
                     RW_OK);
    snprintf(args, sizeof args, "{\"session\": \"%s\"}", token);
    assert_int_equal(rl_status(&a, 4, "commit_update", args, NULL, 0, msg, sizeof msg), RW_OK);
    rl_fx_assert_intact(&F.x, "owned");
    /* the old token is worth nothing now */
    assert_int_equal(rl_status(&b, 5, "commit_update", args, NULL, 0, msg, sizeof msg), RW_E_STATE);
    char *log = rl_wait_log(F.log, "update_commit version=\"owned\"", 10);
    assert_non_null(strstr(log, "auth_refused cmd=\"commit_update\""));
    assert_non_null(strstr(log, "reason=session_token"));
    free(log);
    rl_close(&a);
    rl_close(&b);
}

static void test_forced_abort_of_stuck_session(void **state) {
    (void)state;
    rl_sock a, op;
    rl_open(&a, F.x.w.ep);
    char token[64], msg[512];
    rl_begin(&a, 1, "{\"version\": \"stuck\", \"timeout_s\": 3600}", token, sizeof token);
    rl_close(&a); /* the trainer goes quiet; its session would wait an hour */
    rl_open(&op, F.x.w.ep);
    assert_int_equal(rl_status(&op, 2, "abort_update", NULL, NULL, 0, msg, sizeof msg), RW_E_AUTH);
    rl_reply r;
    rl_ok(&op, 3, "abort_update", "{\"force\": true}", &r);
    bool intact = false;
    rw_err e;
    RW_ASSERT_OK(rw_mobj_bool(rw_mobj_get(r.rep.result, "intact"), "intact", &intact, &e), &e);
    assert_true(intact);
    rl_reply_free(&r);
    json_t *v = dt_ok(F.x.c, "get_weight_version", NULL);
    assert_string_equal(dt_str(v, "state", NULL), "ready");
    json_decref(v);
    char *log = rl_wait_log(F.log, "update_abort version=\"stuck\" reason=forced", 10);
    free(log);
    rl_close(&op);
    rl_assert_reference(F.x.c, &F.x.ref);
}

/* rw-ctl prints begin_update's token; --session carries it, --force ends another's session. */
static void test_rw_ctl_tokens(void **state) {
    (void)state;
    char out[8192];
    const char *begin[] = {"--to", F.x.w.ep, "begin_update", "--version", "ctl-v", NULL};
    assert_int_equal(dt_run_tool("tools/ctl/rw-ctl", begin, out, sizeof out, 60), 0);
    json_error_t je;
    json_t *r = json_loads(out, JSON_DISABLE_EOF_CHECK, &je);
    assert_non_null(r);
    char token[64];
    snprintf(token, sizeof token, "%s", dt_str(r, "session", NULL));
    json_decref(r);
    const char *no_token[] = {"--to", F.x.w.ep, "commit_update", NULL};
    assert_int_equal(dt_run_tool("tools/ctl/rw-ctl", no_token, out, sizeof out, 60), 1);
    assert_non_null(strstr(out, "\"auth\""));
    char d[4200];
    snprintf(d, sizeof d, "%s", F.x.fixture);
    const char *disk[] = {"--to", F.x.w.ep, "update_weights_from_disk", "--path", d, "--session",
                          token,  NULL};
    assert_int_equal(dt_run_tool("tools/ctl/rw-ctl", disk, out, sizeof out, 60), 0);
    const char *commit[] = {"--to", F.x.w.ep, "commit_update", "--session", token, NULL};
    assert_int_equal(dt_run_tool("tools/ctl/rw-ctl", commit, out, sizeof out, 60), 0);
    assert_non_null(strstr(out, "\"version\":\"ctl-v\""));
    const char *begin2[] = {"--to", F.x.w.ep, "begin_update", "--version", "ctl-w", NULL};
    assert_int_equal(dt_run_tool("tools/ctl/rw-ctl", begin2, out, sizeof out, 60), 0);
    const char *force[] = {"--to", F.x.w.ep, "abort_update", "--force", NULL};
    assert_int_equal(dt_run_tool("tools/ctl/rw-ctl", force, out, sizeof out, 60), 0);
    assert_non_null(strstr(out, "\"intact\":true"));
}

/* The client library keeps its session's token by itself: a verified push from one client, while
 * another client's commit in the middle of it is refused. */
static void test_client_library_tokens(void **state) {
    (void)state;
    rw_client *t = dt_connect(&F.x.w), *other = dt_connect(&F.x.w);
    rw_err e;
    RW_ASSERT_OK(rw_client_begin_update(t, "lib-v", false, 4u << 20, 60, DT_TIMEOUT_MS, &e), &e);
    assert_int_equal(strlen(rw_client_session(t)), RW_SYNC_TOKEN_LEN);
    assert_int_equal(strlen(rw_client_session(other)), 0);
    rw_err_clear(&e);
    assert_int_equal(rw_client_commit_update(other, DT_TIMEOUT_MS, NULL, 0, &e), RW_E_AUTH);
    RW_ASSERT_OK(rw_client_update_from_disk(t, F.x.fixture, NULL, DT_TIMEOUT_MS, &e), &e);
    char v[RW_SYNC_MAX_VERSION + 1];
    RW_ASSERT_OK(rw_client_commit_update(t, DT_TIMEOUT_MS, v, sizeof v, &e), &e);
    assert_string_equal(v, "lib-v");
    /* and a whole push, with its checksums verified */
    rw_push_opts o = {.transport = "zmq",
                      .bucket_bytes = 1u << 20,
                      .version = "lib-push",
                      .verify = true,
                      .timeout_ms = DT_TIMEOUT_MS};
    rw_push_summary sum;
    RW_ASSERT_OK(rw_sync_push_ckpt(&t, 1, NULL, F.x.fixture, &o, &sum, &e), &e);
    assert_true(sum.verified && sum.mismatches == 0);
    rw_client_close(t);
    rw_client_close(other);
    rl_assert_reference(F.x.c, &F.x.ref);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_foreign_client_refused),
        cmocka_unit_test(test_forced_abort_of_stuck_session),
        cmocka_unit_test(test_rw_ctl_tokens),
        cmocka_unit_test(test_client_library_tokens),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
