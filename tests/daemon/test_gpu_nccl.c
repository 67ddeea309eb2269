/* test_gpu_nccl.c - weight updates end to end on CUDA workers (gpu suite): `rw-trainer push
 * --transport nccl` from GPU 0 into a random-weight worker on GPU 1 (checksums of every tensor
 * equal the fixture's, generation follows the fixture, F3 repeat push changes no checksum and no
 * token, a partial push changes exactly its tensors); a TP2 worker (ranks as processes on GPUs
 * 0 and 1, NCCL tensor parallelism) fed over ZeroMQ; and, with 3 GPUs, an NCCL push into a TP2
 * worker on GPUs 1 and 2. Skips (77) without 2 CUDA devices. */
#include <regex.h>

#include "daemon_util.h"

typedef struct st {
    dt_ref ref;
    dt_ckpts k; /* the fixture and a random checkpoint of its config */
} st;

static int run_tool(const char *rel, const char *const *args, char *out, size_t cap) {
    return dt_run_tool(rel, args, out, cap, 300);
}

/* rw-trainer push over NCCL from GPU 0 (--verify); extra options appended. */
static void push_nccl(const char *ep, const char *dir, const char *version, const char *ranks,
                      const char *only) {
    const char *args[32] = {"push",        "--model",  dir,           "--to", ep,
                            "--transport", "nccl",     "--device",    "0",    "--version",
                            version,       "--verify", "--bucket-mb", "1",    "--worker-ranks",
                            ranks};
    int k = 16;
    if (only) {
        args[k++] = "--only";
        args[k++] = only;
    }
    args[k] = NULL;
    char out[8192];
    int rc = run_tool("tools/trainer/rw-trainer", args, out, sizeof out);
    if (rc != 0) fail_msg("rw-trainer push --transport nccl exited %d: %s", rc, out);
    json_decref(dt_push_verified(out));
}

static void push_zmq(const char *ep, const char *dir, const char *version) {
    const char *args[] = {"push",        "--model", dir,         "--to",  ep,
                          "--transport", "zmq",     "--version", version, "--verify",
                          "--bucket-mb", "4",       NULL};
    char out[8192];
    int rc = run_tool("tools/trainer/rw-trainer", args, out, sizeof out);
    if (rc != 0) fail_msg("rw-trainer push --transport zmq exited %d: %s", rc, out);
}

/* Generation after the fixture's weights arrived: the first token of every reference prompt
 * is the reference's (a teacher-forced position; the bf16 backend may flip a later near-tie,
 * docs/TARGETS.md F2), the version is the pushed one. Returns the tokens of prompt 0. */
static void check_generation(st *s, rw_client *c, const char *version, int32_t *tok0) {
    for (int i = 0; i < DT_NREF; i++) {
        char p[1024], a[1200];
        dt_prompt_json(s->ref.prompt[i], s->ref.n_prompt[i], p, sizeof p);
        snprintf(a, sizeof a, "{\"prompt\":%s,\"max_new_tokens\":%d}", p, DT_REF_TOKENS);
        json_t *r = dt_ok(c, "generate", a);
        json_t *o = dt_output(r, 0);
        int32_t t[DT_REF_TOKENS];
        assert_int_equal(dt_ints(json_object_get(o, "tokens"), t, DT_REF_TOKENS), DT_REF_TOKENS);
        assert_int_equal(t[0], s->ref.greedy[i][0]);
        assert_string_equal(dt_str(o, "weight_version", NULL), version);
        if (i == 0 && tok0) memcpy(tok0, t, sizeof t);
        json_decref(r);
    }
}

/* Every tensor's checksum on every rank against the trainer-side computation for `ck`. */
static int mismatches(rw_client *c, rw_ckpt *ck, const char *config) {
    rw_client_sums *sums = NULL;
    rw_err e;
    RW_ASSERT_OK(rw_client_checksum(c, NULL, 0, DT_TIMEOUT_MS, &sums, &e), &e);
    rw_config cfg;
    RW_ASSERT_OK(rw_config_load(config, &cfg, &e), &e);
    int bad = 0, tp = rw_client_sums_tp(sums);
    for (int i = 0; i < rw_client_sums_ranks(sums); i++)
        for (size_t j = 0; j < rw_ckpt_count(ck); j++) {
            const rw_st_entry *t = rw_ckpt_at(ck, j);
            uint64_t got, want;
            RW_ASSERT_OK(rw_client_sums_find(sums, i, t->name, &got, &e), &e);
            RW_ASSERT_OK(rw_sync_expected_checksum(&cfg, tp, rw_client_sums_rank(sums, i), t->name,
                                                   t->data, t->dtype, &want, &e),
                         &e);
            bad += got != want;
        }
    rw_config_free(&cfg);
    rw_client_sums_free(sums);
    return bad;
}

static int setup(void **state) {
    rw_test_require_gpu(2);
    st *s = calloc(1, sizeof *s);
    dt_ref_load(&s->ref);
    dt_ckpts_make(&s->k, "/tmp/rw-gpu-e2e-XXXXXX");
    *state = s;
    return 0;
}

static int teardown(void **state) {
    st *s = *state;
    if (!s) return 0;
    dt_ckpts_free(&s->k);
    free(s);
    return 0;
}

/* Trainer on GPU 0, TP1 worker on GPU 1. */
static void test_nccl_tp1(void **state) {
    st *s = *state;
    dt_worker w;
    const char *wargs[] = {"--config", s->k.config, "--random-weights", "--device",          "cuda",
                           "--gpu",    "1",         "--control",        "tcp://127.0.0.1:*", NULL};
    dt_start(&w, wargs);
    rw_client *c = dt_connect(&w);
    assert_true(mismatches(c, s->k.fix, s->k.config) > 0);
    push_nccl(w.ep, s->k.fixture, "nccl-1", "1", NULL);
    assert_int_equal(mismatches(c, s->k.fix, s->k.config), 0);
    int32_t t1[DT_REF_TOKENS], t2[DT_REF_TOKENS];
    check_generation(s, c, "nccl-1", t1);
    /* F3: the same weights again change no checksum and no token */
    push_nccl(w.ep, s->k.fixture, "nccl-2", "1", NULL);
    assert_int_equal(mismatches(c, s->k.fix, s->k.config), 0);
    check_generation(s, c, "nccl-2", t2);
    assert_memory_equal(t1, t2, sizeof t1);
    /* a partial push changes exactly its tensors */
    const char *re = "^model\\.layers\\.2\\.mlp\\.experts\\.";
    push_nccl(w.ep, s->k.random_dir, "nccl-partial", "1", re);
    regex_t rx;
    assert_int_equal(regcomp(&rx, re, REG_EXTENDED | REG_NOSUB), 0);
    rw_client_sums *sums = NULL;
    rw_err e;
    RW_ASSERT_OK(rw_client_checksum(c, NULL, 0, DT_TIMEOUT_MS, &sums, &e), &e);
    for (size_t i = 0; i < rw_ckpt_count(s->k.fix); i++) {
        const rw_st_entry *f = rw_ckpt_at(s->k.fix, i);
        const rw_st_entry *r = rw_ckpt_find(s->k.rnd, f->name);
        const bool sel = regexec(&rx, f->name, 0, NULL, 0) == 0;
        const rw_st_entry *src = sel ? r : f;
        uint64_t got;
        RW_ASSERT_OK(rw_client_sums_find(sums, 0, f->name, &got, &e), &e);
        if (got != rw_checksum64(src->data, src->end - src->begin, 0))
            fail_msg("%s: %s", f->name, sel ? "not updated" : "changed although not selected");
    }
    rw_client_sums_free(sums);
    regfree(&rx);
    dt_shutdown(&w, c, 60);
}

/* A TP2 worker: two rank processes on GPUs 0 and 1 with NCCL tensor parallelism. */
static void test_tp2_worker_zmq(void **state) {
    st *s = *state;
    dt_worker w;
    const char *wargs[] = {
        "--config", s->k.config, "--random-weights", "--device",          "cuda", "--tp", "2",
        "--gpu",    "0",         "--control",        "tcp://127.0.0.1:*", NULL};
    dt_start(&w, wargs);
    rw_client *c = dt_connect(&w);
    push_zmq(w.ep, s->k.fixture, "tp2-zmq");
    assert_int_equal(mismatches(c, s->k.fix, s->k.config), 0);
    check_generation(s, c, "tp2-zmq", NULL);
    dt_shutdown(&w, c, 60);
}

/* NCCL push into a TP2 worker (GPUs 1, 2; the trainer on GPU 0): needs 3 GPUs. */
static void test_nccl_tp2(void **state) {
    st *s = *state;
    if (rw_cuda_device_count() < 3) {
        print_message("skip: an NCCL push into a TP2 worker needs 3 GPUs (have %d)\n",
                      rw_cuda_device_count());
        skip();
    }
    dt_worker w;
    const char *wargs[] = {
        "--config", s->k.config, "--random-weights", "--device",          "cuda", "--tp", "2",
        "--gpu",    "1",         "--control",        "tcp://127.0.0.1:*", NULL};
    dt_start(&w, wargs);
    rw_client *c = dt_connect(&w);
    push_nccl(w.ep, s->k.fixture, "nccl-tp2", "2", NULL);
    assert_int_equal(mismatches(c, s->k.fix, s->k.config), 0);
    check_generation(s, c, "nccl-tp2", NULL);
    dt_shutdown(&w, c, 60);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_nccl_tp1),
        cmocka_unit_test(test_tp2_worker_zmq),
        cmocka_unit_test(test_nccl_tp2),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
