/* test_e2e_sync.c - weight updates end to end on the CPU backend (issue 6): a worker started
 * with random weights receives the fixture's weights from `rw-trainer push --transport zmq`
 * (also with --trainer-tp 2 and 1 MiB buckets) and reproduces the fixture's greedy tokens; the
 * same through update_weights_from_disk; F3 (pushing the weights the worker has changes no
 * checksum and no token); a partial update (--only one layer's experts) changes exactly those
 * tensors; a trainer killed mid-session leaves the previous version serving or generate refused
 * with weights_incomplete, and the next full push succeeds without a restart; outputs carry the
 * version of each token span across an update; a CPU TP2 worker. */
#include <regex.h>

#include "daemon_util.h"

#define LONG_TOKENS 400

typedef struct st {
    dt_worker w;
    rw_client *c;
    dt_ref ref;
    dt_ckpts k; /* the fixture and a random checkpoint of its config */
} st;

/* ------------------------------------------------------------------------------------------ */
static int run_tool(const char *rel, const char *const *args, char *out, size_t cap) {
    return dt_run_tool(rel, args, out, cap, 120);
}

/* rw-trainer push of `dir` to the worker at `ep` with extra options; returns the summary. */
static json_t *push_to(const char *ep, const char *dir, const char *version,
                       const char *const *extra) {
    const char *args[24] = {"push",        "--model", dir,         "--to",  ep,
                            "--transport", "zmq",     "--version", version, "--verify"};
    int k = 10;
    bool bucket = false;
    for (int i = 0; extra && extra[i]; i++) {
        bucket = bucket || !strcmp(extra[i], "--bucket-mb");
        args[k++] = extra[i];
    }
    if (!bucket) {
        /* one bucket holds the whole tiny model; the 512 MiB default would only cost time */
        args[k++] = "--bucket-mb";
        args[k++] = "4";
    }
    args[k] = NULL;
    char out[8192];
    int rc = run_tool("tools/trainer/rw-trainer", args, out, sizeof out);
    if (rc != 0) fail_msg("rw-trainer push %s (%s) exited %d: %s", dir, version, rc, out);
    return dt_push_verified(out);
}

static json_t *push(st *s, const char *dir, const char *version, const char *const *extra) {
    return push_to(s->w.ep, dir, version, extra);
}

/* The worker's checksum of every tensor of `ck` compared with the bytes of `ck` (TP1 bf16: the
 * whole tensor); returns the number that differ. */
static int mismatches(rw_client *c, rw_ckpt *ck) {
    rw_client_sums *sums = NULL;
    rw_err e;
    RW_ASSERT_OK(rw_client_checksum(c, NULL, 0, DT_TIMEOUT_MS, &sums, &e), &e);
    int bad = 0;
    for (size_t i = 0; i < rw_ckpt_count(ck); i++) {
        const rw_st_entry *t = rw_ckpt_at(ck, i);
        uint64_t got;
        RW_ASSERT_OK(rw_client_sums_find(sums, 0, t->name, &got, &e), &e);
        bad += got != rw_checksum64(t->data, t->end - t->begin, 0);
    }
    rw_client_sums_free(sums);
    return bad;
}

/* Generates every reference prompt and checks the fixture's greedy tokens; returns the weight
 * version the outputs report. */
static void assert_reference(st *s, rw_client *c, const char *version) {
    for (int i = 0; i < DT_NREF; i++) {
        char p[1024], a[1200];
        dt_prompt_json(s->ref.prompt[i], s->ref.n_prompt[i], p, sizeof p);
        snprintf(a, sizeof a, "{\"prompt\":%s,\"max_new_tokens\":%d}", p, DT_REF_TOKENS);
        json_t *r = dt_ok(c, "generate", a);
        dt_assert_greedy(&s->ref, i, dt_output(r, 0), DT_REF_TOKENS);
        if (version) assert_string_equal(dt_str(dt_output(r, 0), "weight_version", NULL), version);
        json_decref(r);
    }
}

static json_t *gen0(st *s, int n) {
    char p[1024], a[1200];
    dt_prompt_json(s->ref.prompt[0], s->ref.n_prompt[0], p, sizeof p);
    snprintf(a, sizeof a, "{\"prompt\":%s,\"max_new_tokens\":%d}", p, n);
    return dt_ok(s->c, "generate", a);
}

static const char *state_now(rw_client *c, char *buf, size_t cap) {
    json_t *v = dt_ok(c, "get_weight_version", NULL);
    snprintf(buf, cap, "%s", dt_str(v, "state", NULL));
    json_decref(v);
    return buf;
}

static int setup(void **state) {
    st *s = calloc(1, sizeof *s);
    dt_ref_load(&s->ref);
    dt_ckpts_make(&s->k, "/tmp/rw-e2e-XXXXXX");
    const char *wargs[] = {"--config", s->k.config, "--random-weights",  "--seed", "3", "--device",
                           "cpu",      "--control", "tcp://127.0.0.1:*", NULL};
    dt_start(&s->w, wargs);
    s->c = dt_connect(&s->w);
    *state = s;
    return 0;
}

static int teardown(void **state) {
    st *s = *state;
    dt_shutdown(&s->w, s->c, 30);
    dt_ckpts_free(&s->k);
    free(s);
    return 0;
}

/* ------------------------------------------------------------------------------------------ */
static void test_push_zmq(void **state) {
    st *s = *state;
    /* random weights: not the fixture's */
    assert_int_equal(mismatches(s->c, s->k.fix), (int)rw_ckpt_count(s->k.fix));
    json_t *r = gen0(s, DT_REF_TOKENS);
    int32_t t[DT_REF_TOKENS];
    dt_ints(json_object_get(dt_output(r, 0), "tokens"), t, DT_REF_TOKENS);
    assert_true(memcmp(t, s->ref.greedy[0], sizeof t) != 0);
    assert_string_equal(dt_str(dt_output(r, 0), "weight_version", NULL), "random:3");
    json_decref(r);
    json_t *sum = push(s, s->k.fixture, "v-zmq", NULL);
    assert_int_equal(dt_int(sum, "tensors", NULL), (int64_t)rw_ckpt_count(s->k.fix));
    json_decref(sum);
    assert_int_equal(mismatches(s->c, s->k.fix), 0);
    assert_reference(s, s->c, "v-zmq");
    json_t *v = dt_ok(s->c, "get_weight_version", NULL);
    assert_string_equal(dt_str(v, "version", NULL), "v-zmq");
    assert_string_equal(dt_str(v, "state", NULL), "ready");
    json_decref(v);
    json_t *t2 = dt_ok(s->c, "stats", NULL);
    assert_true(dt_int(t2, "weights", "last_update_bytes") >= 2000000);
    assert_true(
        json_real_value(json_object_get(json_object_get(t2, "weights"), "last_update_gbps")) > 0);
    json_decref(t2);
}

static void test_push_trainer_tp2(void **state) {
    st *s = *state;
    json_decref(push(s, s->k.random_dir, "rnd-a", NULL));
    assert_int_equal(mismatches(s->c, s->k.rnd), 0);
    const char *extra[] = {"--trainer-tp", "2", NULL};
    json_t *sum = push(s, s->k.fixture, "v-ttp2", extra);
    assert_int_equal(dt_int(sum, "trainer_tp", NULL), 2);
    json_decref(sum);
    assert_int_equal(mismatches(s->c, s->k.fix), 0);
    assert_reference(s, s->c, "v-ttp2");
}

static void test_push_bucket_1mb(void **state) {
    st *s = *state;
    json_decref(push(s, s->k.random_dir, "rnd-b", NULL));
    const char *extra[] = {"--bucket-mb", "1", NULL};
    json_t *sum = push(s, s->k.fixture, "v-1mb", extra);
    assert_true(dt_int(sum, "buckets", NULL) >= 3); /* 2.3 MB of weights */
    json_decref(sum);
    assert_int_equal(mismatches(s->c, s->k.fix), 0);
    assert_reference(s, s->c, "v-1mb");
}

static void test_update_from_disk(void **state) {
    st *s = *state;
    json_decref(push(s, s->k.random_dir, "rnd-c", NULL));
    char a[8192];
    snprintf(a, sizeof a, "{\"path\":\"%s\",\"version\":\"v-disk\"}", s->k.fixture);
    json_t *r = dt_ok(s->c, "update_weights_from_disk", a);
    assert_true(json_is_true(json_object_get(r, "committed")));
    assert_int_equal(dt_int(r, "tensors", NULL), (int64_t)rw_ckpt_count(s->k.fix));
    json_decref(r);
    assert_int_equal(mismatches(s->c, s->k.fix), 0);
    assert_reference(s, s->c, "v-disk");
}

/* F3: pushing the weights the worker has changes no checksum, no token and no logprob. */
static void test_f3_same_weights(void **state) {
    st *s = *state;
    rw_client_sums *before = NULL, *after = NULL;
    rw_err e;
    RW_ASSERT_OK(rw_client_checksum(s->c, NULL, 0, DT_TIMEOUT_MS, &before, &e), &e);
    json_t *g0 = gen0(s, DT_REF_TOKENS);
    char *j0 = json_dumps(json_object_get(dt_output(g0, 0), "logprobs"), JSON_COMPACT);
    char *t0 = json_dumps(json_object_get(dt_output(g0, 0), "tokens"), JSON_COMPACT);
    for (int pass = 0; pass < 2; pass++) {
        if (pass == 0) {
            json_decref(push(s, s->k.fixture, "v-f3-zmq", NULL));
        } else {
            char a[8192];
            snprintf(a, sizeof a, "{\"path\":\"%s\",\"version\":\"v-f3-disk\"}", s->k.fixture);
            json_decref(dt_ok(s->c, "update_weights_from_disk", a));
        }
        RW_ASSERT_OK(rw_client_checksum(s->c, NULL, 0, DT_TIMEOUT_MS, &after, &e), &e);
        assert_int_equal(rw_client_sums_count(after, 0), rw_client_sums_count(before, 0));
        for (size_t j = 0; j < rw_client_sums_count(before, 0); j++) {
            uint64_t a, b;
            const char *name = rw_client_sums_at(before, 0, j, &a);
            RW_ASSERT_OK(rw_client_sums_find(after, 0, name, &b, &e), &e);
            if (a != b) fail_msg("%s changed by pushing the same weights", name);
        }
        rw_client_sums_free(after);
        json_t *g1 = gen0(s, DT_REF_TOKENS);
        char *j1 = json_dumps(json_object_get(dt_output(g1, 0), "logprobs"), JSON_COMPACT);
        char *t1 = json_dumps(json_object_get(dt_output(g1, 0), "tokens"), JSON_COMPACT);
        assert_string_equal(t0, t1);
        assert_string_equal(j0, j1);
        free(j1);
        free(t1);
        json_decref(g1);
    }
    free(j0);
    free(t0);
    json_decref(g0);
    rw_client_sums_free(before);
}

/* A partial update of one layer's experts changes exactly those tensors. */
static void test_partial_only(void **state) {
    st *s = *state;
    const char *re = "^model\\.layers\\.1\\.mlp\\.experts\\.";
    const char *extra[] = {"--only", re, NULL};
    json_t *sum = push(s, s->k.random_dir, "v-partial", extra);
    regex_t rx;
    assert_int_equal(regcomp(&rx, re, REG_EXTENDED | REG_NOSUB), 0);
    int selected = 0;
    for (size_t i = 0; i < rw_ckpt_count(s->k.fix); i++)
        selected += regexec(&rx, rw_ckpt_at(s->k.fix, i)->name, 0, NULL, 0) == 0;
    assert_int_equal(dt_int(sum, "tensors", NULL), selected);
    assert_int_equal(selected, 8 * 3); /* 8 experts x gate, up, down */
    json_decref(sum);
    rw_client_sums *sums = NULL;
    rw_err e;
    RW_ASSERT_OK(rw_client_checksum(s->c, NULL, 0, DT_TIMEOUT_MS, &sums, &e), &e);
    for (size_t i = 0; i < rw_ckpt_count(s->k.fix); i++) {
        const rw_st_entry *f = rw_ckpt_at(s->k.fix, i);
        const rw_st_entry *r = rw_ckpt_find(s->k.rnd, f->name);
        assert_non_null(r);
        uint64_t got;
        RW_ASSERT_OK(rw_client_sums_find(sums, 0, f->name, &got, &e), &e);
        const bool sel = regexec(&rx, f->name, 0, NULL, 0) == 0;
        const uint64_t want = sel ? rw_checksum64(r->data, r->end - r->begin, 0)
                                  : rw_checksum64(f->data, f->end - f->begin, 0);
        if (got != want)
            fail_msg("%s: %s after the partial update", f->name,
                     sel ? "not updated" : "changed although not selected");
    }
    rw_client_sums_free(sums);
    regfree(&rx);
    /* back to the fixture for the tests that follow */
    json_decref(push(s, s->k.fixture, "v-restored", NULL));
    assert_int_equal(mismatches(s->c, s->k.fix), 0);
}

/* A trainer that opens a session (and, with `write`, sends one bucket) and then is killed. */
static void dying_trainer(const char *ep, rw_ckpt *src, bool send_bucket) {
    int report;
    pid_t pid = dt_fork_reporter(&report);
    if (pid == 0) {
        rw_client *c = NULL;
        rw_err e;
        int ok = rw_client_connect(ep, NULL, &c, &e) == RW_OK &&
                 rw_client_begin_update(c, "never", false, 0, 3.0, 10000, &e) == RW_OK;
        if (ok && send_bucket) {
            const rw_st_entry *t = rw_ckpt_find(src, "model.layers.0.self_attn.q_proj.weight");
            rw_sync_manifest *m = NULL;
            uint64_t off = 0;
            ok = t && rw_sync_manifest_create(&m, &e) == RW_OK &&
                 rw_sync_manifest_add(m, t->name, t->dtype, t->ndim, t->shape, -1, 0, 0,
                                      RW_PIECE_PLAIN, &off, &e) == RW_OK;
            void *bucket = ok ? calloc(1, rw_sync_manifest_bytes(m)) : NULL;
            if (bucket) {
                memcpy((char *)bucket + off, t->data, t->end - t->begin);
                ok = rw_client_update_weights_zmq(c, m, bucket, 10000, &e) == RW_OK;
            } else {
                ok = 0;
            }
        }
        if (write(report, ok ? "y" : "n", 1) != 1) _exit(3);
        for (;;)
            pause(); /* until killed */
    }
    dt_reporter_done(pid, report, true);
}

static void wait_not_updating(rw_client *c, char *state, size_t cap) {
    double end = rw_now() + 20;
    while (rw_now() < end) {
        if (strcmp(state_now(c, state, cap), "updating")) return;
        usleep(100000);
    }
    fail_msg("the dead trainer's session was not aborted");
}

static void test_trainer_killed(void **state) {
    st *s = *state;
    char stt[64];
    /* killed after begin_update: nothing written, the previous version serves */
    dying_trainer(s->w.ep, s->k.rnd, false);
    assert_string_equal(state_now(s->c, stt, sizeof stt), "updating");
    wait_not_updating(s->c, stt, sizeof stt);
    assert_string_equal(stt, "ready");
    json_t *v = dt_ok(s->c, "get_weight_version", NULL);
    assert_string_equal(dt_str(v, "version", NULL), "v-restored");
    json_decref(v);
    assert_reference(s, s->c, "v-restored");
    /* killed after one bucket: weights incomplete, generate refused */
    dying_trainer(s->w.ep, s->k.rnd, true);
    wait_not_updating(s->c, stt, sizeof stt);
    assert_string_equal(stt, "weights_incomplete");
    char p[1024], a[1200], msg[512];
    dt_prompt_json(s->ref.prompt[0], s->ref.n_prompt[0], p, sizeof p);
    snprintf(a, sizeof a, "{\"prompt\":%s,\"max_new_tokens\":4}", p);
    dt_refused(s->c, "generate", a, RW_E_WEIGHTS_INCOMPLETE, msg, sizeof msg);
    json_t *h = dt_ok(s->c, "health", NULL);
    assert_string_equal(dt_str(h, "state", NULL), "weights_incomplete");
    json_decref(h);
    /* the next full push succeeds, same worker process */
    const pid_t pid = s->w.pid;
    json_decref(push(s, s->k.fixture, "v-after-kill", NULL));
    assert_int_equal(kill(pid, 0), 0);
    assert_reference(s, s->c, "v-after-kill");
}

/* A request in flight across an update: retracted at begin_update, resumed after commit; its
 * output names the version of each token span. The pushed weights are the ones it had, so its
 * tokens are those of an uninterrupted run. */
static void test_version_spans(void **state) {
    st *s = *state;
    json_t *ref = gen0(s, LONG_TOKENS);
    int32_t want[LONG_TOKENS];
    assert_int_equal(dt_ints(json_object_get(dt_output(ref, 0), "tokens"), want, LONG_TOKENS),
                     LONG_TOKENS);
    const char *v0 = dt_str(dt_output(ref, 0), "weight_version", NULL);
    char v0s[128];
    snprintf(v0s, sizeof v0s, "%s", v0);
    json_decref(ref);
    char p[1024], a[8192];
    dt_prompt_json(s->ref.prompt[0], s->ref.n_prompt[0], p, sizeof p);
    snprintf(a, sizeof a, "{\"prompt\":%s,\"max_new_tokens\":%d,\"stream\":true}", p, LONG_TOKENS);
    uint64_t id = dt_send(s->c, "generate", a);
    char *res = NULL;
    rw_err e;
    RW_ASSERT_OK(rw_client_wait_json(s->c, id, DT_TIMEOUT_MS, &res, NULL, NULL, &e), &e);
    rw_client_free(res); /* first tokens made: the request is in flight */
    json_decref(
        dt_ok(s->c, "begin_update", "{\"version\":\"v-spans\",\"pause_mode\":\"retract\"}"));
    json_t *t = dt_ok(s->c, "stats", NULL);
    assert_int_equal(dt_int(t, "queue", "running"), 0);
    assert_int_equal(dt_int(t, "queue", "waiting"), 1);
    assert_string_equal(dt_str(t, "state", NULL), "updating");
    json_decref(t);
    snprintf(a, sizeof a, "{\"path\":\"%s\"}", s->k.fixture);
    json_t *d = dt_ok(s->c, "update_weights_from_disk", a);
    assert_false(json_is_true(json_object_get(d, "committed")));
    json_decref(d);
    json_decref(dt_ok(s->c, "commit_update", NULL));
    json_t *g = dt_wait_gen(s->c, id, NULL);
    json_t *o = dt_output(g, 0);
    int32_t got[LONG_TOKENS];
    assert_int_equal(dt_ints(json_object_get(o, "tokens"), got, LONG_TOKENS), LONG_TOKENS);
    assert_memory_equal(got, want, sizeof want);
    json_t *spans = json_object_get(o, "version_spans");
    assert_int_equal(json_array_size(spans), 2);
    json_t *s0 = json_array_get(spans, 0), *s1 = json_array_get(spans, 1);
    assert_string_equal(dt_str(s0, "version", NULL), v0s);
    assert_string_equal(dt_str(s1, "version", NULL), "v-spans");
    assert_int_equal(dt_int(s0, "begin", NULL), 0);
    const int64_t k = dt_int(s0, "end", NULL);
    assert_true(k >= 1 && k < LONG_TOKENS);
    assert_int_equal(dt_int(s1, "begin", NULL), k);
    assert_int_equal(dt_int(s1, "end", NULL), LONG_TOKENS);
    assert_string_equal(dt_str(o, "weight_version", NULL), "v-spans");
    json_decref(g);
    /* an update refused midway (a tensor the model does not have) leaves the version intact */
    json_decref(dt_ok(s->c, "begin_update", "{\"version\":\"v-bad\"}"));
    dt_refused(s->c, "update_weights_from_disk", "{\"path\":\"/nonexistent/checkpoint\"}",
               RW_E_NOT_FOUND, NULL, 0);
    char stt[64];
    assert_string_equal(state_now(s->c, stt, sizeof stt), "ready");
    assert_reference(s, s->c, "v-spans");
}

/* CPU tensor parallelism: two ranks (threads) receive pushes and reproduce the reference. */
static void test_tp2_worker(void **state) {
    st *s = *state;
    dt_worker w;
    const char *wargs[] = {"--config", s->k.config, "--random-weights",  "--tp", "2", "--device",
                           "cpu",      "--control", "tcp://127.0.0.1:*", NULL};
    dt_start(&w, wargs);
    rw_client *c = dt_connect(&w);
    json_decref(push_to(w.ep, s->k.fixture, "tp2-a", NULL));
    rw_client_sums *sums = NULL;
    rw_err e;
    RW_ASSERT_OK(rw_client_checksum(c, NULL, 0, DT_TIMEOUT_MS, &sums, &e), &e);
    assert_int_equal(rw_client_sums_tp(sums), 2);
    assert_int_equal(rw_client_sums_ranks(sums), 2);
    rw_client_sums_free(sums);
    assert_reference(s, c, "tp2-a");
    const char *extra[] = {"--trainer-tp", "2", "--bucket-mb", "1", NULL};
    json_decref(push_to(w.ep, s->k.random_dir, "tp2-rnd", NULL));
    json_decref(push_to(w.ep, s->k.fixture, "tp2-b", extra));
    assert_reference(s, c, "tp2-b");
    /* readback of rank 1's slice */
    RW_ASSERT_OK(rw_client_checksum(c, NULL, 0, DT_TIMEOUT_MS, &sums, &e), &e);
    uint64_t want;
    RW_ASSERT_OK(
        rw_client_sums_find(sums, 1, "model.layers.2.mlp.experts.5.down_proj.weight", &want, &e),
        &e);
    rw_client_sums_free(sums);
    json_t *r = NULL;
    char *res = NULL;
    void *frame = NULL;
    size_t flen = 0;
    uint64_t id = 0;
    RW_ASSERT_OK(rw_client_send_json(c, "get_weights",
                                     "{\"name\":\"model.layers.2.mlp.experts.5.down_proj.weight\","
                                     "\"rank\":1}",
                                     NULL, NULL, 0, &id, &e),
                 &e);
    RW_ASSERT_OK(rw_client_wait_json(c, id, DT_TIMEOUT_MS, &res, &frame, &flen, &e), &e);
    json_error_t je;
    r = json_loads(res, 0, &je);
    assert_int_equal(dt_int(r, "rank", NULL), 1);
    assert_int_equal(flen, 128 * 48 * 2); /* [H, S] bf16 of rank 1 */
    assert_true(rw_checksum64(frame, flen, 0) == want);
    json_decref(r);
    rw_client_free(res);
    rw_client_free(frame);
    dt_shutdown(&w, c, 30);
}

/* A worker started from a config alone has no weights: generate is refused until the first
 * full push. */
static void test_start_without_weights(void **state) {
    st *s = *state;
    dt_worker w;
    const char *wargs[] = {"--config",  s->k.config,         "--device", "cpu",
                           "--control", "tcp://127.0.0.1:*", NULL};
    dt_start(&w, wargs);
    assert_string_equal(json_string_value(json_object_get(w.ready, "state")), "weights_incomplete");
    rw_client *c = dt_connect(&w);
    char msg[512];
    dt_refused(c, "generate", "{\"prompt\":[1,2,3]}", RW_E_WEIGHTS_INCOMPLETE, msg, sizeof msg);
    /* a partial push is not enough */
    const char *extra[] = {"--only", "^model\\.norm", NULL};
    const char *args[] = {"push",        "--model", s->k.fixture, "--to",    w.ep,
                          "--transport", "zmq",     "--version",  "partial", "--bucket-mb",
                          "4",           extra[0],  extra[1],     NULL};
    char out[4096];
    assert_int_not_equal(run_tool("tools/trainer/rw-trainer", args, out, sizeof out), 0);
    dt_refused(c, "generate", "{\"prompt\":[1,2,3]}", RW_E_WEIGHTS_INCOMPLETE, NULL, 0);
    json_decref(push_to(w.ep, s->k.fixture, "first", NULL));
    assert_reference(s, c, "first");
    dt_shutdown(&w, c, 30);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_push_zmq),        cmocka_unit_test(test_push_trainer_tp2),
        cmocka_unit_test(test_push_bucket_1mb), cmocka_unit_test(test_update_from_disk),
        cmocka_unit_test(test_f3_same_weights), cmocka_unit_test(test_partial_only),
        cmocka_unit_test(test_trainer_killed),  cmocka_unit_test(test_version_spans),
        cmocka_unit_test(test_tp2_worker),      cmocka_unit_test(test_start_without_weights),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
