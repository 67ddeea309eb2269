/* test_replies.c - replies larger than one message may be, issue 17 finding 2, against live
 * rw-workers (CPU backend, the tiny fixture):
 * - a generate result of more than 64 MiB (msgpack; 1024 prompts x 240 tokens with top_logprobs
 *   20) with the default limits: delivered in parts and joined by the client library, every
 *   output whole (before, the worker sent one 70 MB message, the client dropped it as too large
 *   and reported `timeout` after the whole generation);
 * - with --max-reply-bytes 65536: parts that never pass it, outputs cut inside (offsets), `more`
 *   on every part but the last, streamed partials before them; joined, the result equals the one
 *   a default worker sends in one message (the same seeds: the same tokens, logprobs, top
 *   logprobs, versions);
 * - the client library and an unreadable reply (too large for its decoder, or corrupt, from a
 *   fake worker): the request's error at once - `range` / `format` naming the request - never a
 *   wait until the timeout, also for a reply that arrives while another request is waited for. */
#include <inttypes.h>
#include <pthread.h>

#include "reliability_util.h"

/* Built with AddressSanitizer (tools/test.sh --sanitize): gcc says so with __SANITIZE_ADDRESS__,
 * clang with __has_feature. */
#if defined(__SANITIZE_ADDRESS__)
#define RW_TEST_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define RW_TEST_ASAN 1
#endif
#endif

/* the worker's default --max-reply-bytes (worker/daemon/options.h) */
#define RW_DAEMON_TEST_REPLY_BYTES (32u << 20)

static dt_worker W1, W2;

static int teardown(void **state) {
    (void)state;
    dt_kill(&W1);
    dt_kill(&W2);
    return 0;
}

/* generate args: n prompts of a few tokens each (different), max_new_tokens t, sampled. */
static char *gen_args(int n, int t, int top, bool stream) {
    size_t cap = (size_t)n * 24 + 256, k = 0;
    char *a = malloc(cap);
    k += (size_t)snprintf(a + k, cap - k, "{\"prompts\": [");
    for (int i = 0; i < n; i++)
        k += (size_t)snprintf(a + k, cap - k, "%s[%d, %d, %d]", i ? "," : "", 1 + i % 500,
                              2 + i % 7, 3 + i % 11);
    snprintf(a + k, cap - k,
             "], \"max_new_tokens\": %d, \"temperature\": 0.9, \"seed\": 11, \"top_logprobs\": "
             "%d, \"stream\": %s}",
             t, top, stream ? "true" : "false");
    return a;
}

/* The fields of an output that must not depend on how the reply was cut (not the timings). */
static void assert_same_output(json_t *a, json_t *b, size_t i) {
    static const char *const keys[] = {"index",          "prompt_index", "sample", "tokens",
                                       "logprobs",       "top_logprobs", "finish", "prompt_tokens",
                                       "weight_version", "version_spans"};
    for (size_t k = 0; k < sizeof keys / sizeof *keys; k++) {
        json_t *x = json_object_get(a, keys[k]), *y = json_object_get(b, keys[k]);
        if (!json_equal(x, y))
            fail_msg("output %zu: '%s' differs after joining the parts", i, keys[k]);
    }
    assert_null(json_object_get(a, "offset"));
    assert_null(json_object_get(a, "more"));
}

/* A result of more than 64 MiB with the default limits: delivered in parts, every output whole.
 * Read part by part through the client's msgpack API (the JSON join of 70 MB of numbers would take
 * a gigabyte of jansson objects; the join is checked on a small result below). Greedy, so that
 * the CPU sampler does not sort the vocabulary for every token. */
static void test_over_64_mib_default(void **state) {
    (void)state;
#ifdef RW_TEST_ASAN
    /* Skipped under AddressSanitizer: its 276,480 greedy tokens with 20 top logprobs each took
     * 29-31 min on a 2-core machine, and then more than the suite's 40-min limit. The plain build
     * runs it (about 90 s), and the parts themselves run under the sanitizers in
     * test_parts_lowered_limit. */
    skip();
#endif
    rl_start_fixture(&W1, NULL, (const char *const[]){"--max-batch", "1024", NULL});
    rw_client *c = dt_connect(&W1);
    enum { NP = 1152, NT = 240, TOP = 20 };
    char *a = gen_args(NP, NT, TOP, false);
    char *g = strstr(a, "\"temperature\": 0.9");
    memcpy(g, "\"temperature\": 0.0", 18);
    const double t0 = rw_now();
    uint64_t id = dt_send(c, "generate", a);
    free(a);
    int *got = calloc(NP, sizeof *got);
    bool *fin = calloc(NP, sizeof *fin);
    size_t total = 0, largest = 0;
    int parts = 0;
    rw_mw *w;
    rw_err e;
    RW_ASSERT_OK(rw_mw_create(&w, &e), &e);
    for (bool more = true; more;) {
        rw_msg *m;
        rw_reply r;
        rw_err_clear(&e);
        /* the generation takes 70-90 s: wait up to just under the suite's limit (600 s), so that
         * meson's timeout, not this one, is what a slower machine meets */
        rw_status st = rw_client_wait(c, id, 590 * 1000, &m, &r, NULL, NULL, &e);
        if (st != RW_OK) fail_msg("generate of > 64 MiB: %s: %s", rw_status_str(st), e.msg);
        more = false;
        const rw_mobj *mo = rw_mobj_get(r.result, "more");
        if (mo) RW_ASSERT_OK(rw_mobj_bool(mo, "more", &more, &e), &e);
        parts++;
        /* the part's size as it travelled: its result re-encoded */
        rw_mw_reset(w);
        rw_mw_obj(w, r.result);
        const void *p;
        size_t n;
        RW_ASSERT_OK(rw_mw_finish(w, &p, &n, &e), &e);
        total += n;
        largest = n > largest ? n : largest;
        const rw_mobj *outs = rw_mobj_get(r.result, "outputs");
        for (size_t i = 0; i < rw_mobj_len(outs); i++) {
            const rw_mobj *o = rw_mobj_at(outs, i);
            uint64_t idx, off = 0;
            RW_ASSERT_OK(rw_mobj_u64(rw_mobj_get(o, "index"), "index", &idx, &e), &e);
            assert_true(idx < NP);
            if (rw_mobj_get(o, "offset"))
                RW_ASSERT_OK(rw_mobj_u64(rw_mobj_get(o, "offset"), "offset", &off, &e), &e);
            assert_int_equal(off, got[idx]);
            const size_t k = rw_mobj_len(rw_mobj_get(o, "tokens"));
            assert_int_equal(rw_mobj_len(rw_mobj_get(o, "logprobs")), k);
            const rw_mobj *top = rw_mobj_get(o, "top_logprobs");
            assert_int_equal(rw_mobj_len(top), k);
            if (k) assert_int_equal(rw_mobj_len(rw_mobj_at(top, k - 1)), TOP);
            got[idx] += (int)k;
            if (rw_mobj_get(o, "finish")) fin[idx] = true;
        }
        rw_msg_free(m);
    }
    rw_mw_destroy(w);
    printf("generate result of %.1f MiB in %d parts (largest %.1f MiB) delivered in %.1f s\n",
           total / 1048576.0, parts, largest / 1048576.0, rw_now() - t0);
    assert_true(total > RW_MSG_MAX_BYTES);
    assert_true(largest <= RW_DAEMON_TEST_REPLY_BYTES);
    for (int i = 0; i < NP; i++) {
        if (got[i] != NT || !fin[i])
            fail_msg("output %d: %d tokens, finished %d", i, got[i], fin[i]);
    }
    free(got);
    free(fin);
    dt_shutdown(&W1, c, 60);
}

/* Reads every message of request `id` from the raw socket up to the final one (the last part):
 * checks the parts and returns how many there were. */
static int read_parts(rl_sock *s, uint64_t id, size_t limit, int *partials) {
    int parts = 0;
    *partials = 0;
    json_t *pieces = json_object(); /* index -> tokens seen so far */
    for (;;) {
        zmq_pollitem_t pi = {.socket = s->sock, .events = ZMQ_POLLIN};
        if (zmq_poll(&pi, 1, DT_TIMEOUT_MS) <= 0) fail_msg("no reply within %d ms", DT_TIMEOUT_MS);
        zmq_msg_t m;
        zmq_msg_init(&m);
        assert_true(zmq_msg_recv(&m, s->sock, 0) >= 0);
        const size_t n = zmq_msg_size(&m);
        rw_msg *msg;
        rw_reply rep;
        rw_err e;
        RW_ASSERT_OK(rw_msg_decode_reply(zmq_msg_data(&m), n, &msg, &rep, &e), &e);
        int frames = zmq_msg_more(&m); /* a data frame follows (routed experts) */
        zmq_msg_close(&m);
        while (frames) {
            zmq_msg_init(&m);
            assert_true(zmq_msg_recv(&m, s->sock, 0) >= 0);
            frames = zmq_msg_more(&m);
            zmq_msg_close(&m);
        }
        assert_int_equal(rep.id, id);
        assert_true(rep.ok);
        const rw_mobj *st = rw_mobj_get(rep.result, "stream");
        bool stream = false, more = false;
        RW_ASSERT_OK(rw_mobj_bool(st, "stream", &stream, &e), &e);
        if (stream) {
            (*partials)++;
            rw_msg_free(msg);
            continue;
        }
        if (n > limit) fail_msg("a part of %zu bytes passes --max-reply-bytes %zu", n, limit);
        const rw_mobj *mo = rw_mobj_get(rep.result, "more");
        if (mo) RW_ASSERT_OK(rw_mobj_bool(mo, "more", &more, &e), &e);
        parts++;
        /* the pieces of an output continue where the last one ended */
        const rw_mobj *outs = rw_mobj_get(rep.result, "outputs");
        for (size_t i = 0; i < rw_mobj_len(outs); i++) {
            const rw_mobj *o = rw_mobj_at(outs, i);
            uint64_t idx, off = 0;
            RW_ASSERT_OK(rw_mobj_u64(rw_mobj_get(o, "index"), "index", &idx, &e), &e);
            if (rw_mobj_get(o, "offset"))
                RW_ASSERT_OK(rw_mobj_u64(rw_mobj_get(o, "offset"), "offset", &off, &e), &e);
            char key[32];
            snprintf(key, sizeof key, "%" PRIu64, idx);
            const int64_t seen = json_integer_value(json_object_get(pieces, key));
            if ((int64_t)off != seen)
                fail_msg("output %" PRIu64 ": a piece at offset %" PRIu64 " after %" PRId64
                         " tokens",
                         idx, off, seen);
            json_object_set_new(
                pieces, key, json_integer(seen + (int64_t)rw_mobj_len(rw_mobj_get(o, "tokens"))));
        }
        rw_msg_free(msg);
        if (!more) break;
    }
    json_decref(pieces);
    return parts;
}

static void test_parts_lowered_limit(void **state) {
    (void)state;
    enum { LIMIT = 65536, NP = 6, NT = 200, TOP = 20 };
    char lim[32];
    snprintf(lim, sizeof lim, "%d", LIMIT);
    rl_start_fixture(&W1, NULL, (const char *const[]){"--max-reply-bytes", lim, NULL});
    rl_start_fixture(&W2, NULL, NULL);
    rw_client *c1 = dt_connect(&W1), *c2 = dt_connect(&W2);
    /* the same command on both: one message from the default worker, parts from the other */
    char *a = gen_args(NP, NT, TOP, false);
    json_t *one = dt_ok(c2, "generate", a);
    json_t *joined = dt_ok(c1, "generate", a);
    json_t *o1 = json_object_get(one, "outputs"), *oj = json_object_get(joined, "outputs");
    assert_int_equal(json_array_size(o1), NP);
    assert_int_equal(json_array_size(oj), NP);
    for (size_t i = 0; i < NP; i++)
        assert_same_output(json_array_get(oj, i), json_array_get(o1, i), i);
    /* the parts as they come on the wire */
    rl_sock s;
    rl_open(&s, W1.ep);
    rl_send_request(&s, 5, "generate", a);
    int partials;
    const int parts = read_parts(&s, 5, LIMIT, &partials);
    printf("%d parts of at most %d bytes\n", parts, LIMIT);
    assert_true(parts >= 5); /* about 400 KB of result */
    free(a);
    /* streamed: partial replies first, then the final result in parts, joined by the client */
    a = gen_args(NP, NT, TOP, true);
    rl_send_request(&s, 6, "generate", a);
    assert_true(read_parts(&s, 6, LIMIT, &partials) >= 5);
    assert_true(partials > 0);
    uint64_t id = dt_send(c1, "generate", a);
    json_t *streamed = dt_wait_gen(c1, id, NULL);
    free(a);
    for (size_t i = 0; i < NP; i++)
        assert_same_output(json_array_get(json_object_get(streamed, "outputs"), i),
                           json_array_get(o1, i), i);
    json_decref(streamed);
    /* the typed call (rw_client_generate) joins the parts too */
    a = gen_args(NP, NT, TOP, false);
    char *res = NULL;
    void *fr = NULL;
    size_t frl = 0;
    rw_err e = {0};
    RW_ASSERT_OK(rw_client_generate(c1, a, 120000, &res, &fr, &frl, &e), &e);
    json_t *typed = json_loads(res, 0, NULL);
    assert_non_null(typed);
    for (size_t i = 0; i < NP; i++)
        assert_same_output(json_array_get(json_object_get(typed, "outputs"), i),
                           json_array_get(o1, i), i);
    json_decref(typed);
    free(res);
    free(fr);
    /* with routed experts: parts as well, each carrying the routes of the outputs that end in
     * it in its own data frame; joined by the client, the routes equal those of the default
     * worker's one message, byte for byte */
    a[strlen(a) - 1] = '\0'; /* drop the closing brace: one more field */
    char *ar = malloc(strlen(a) + 96);
    sprintf(ar, "%s, \"return_routed_experts\": true, \"return_routing_weights\": true}", a);
    free(a);
    rl_send_request(&s, 7, "generate", ar);
    assert_true(read_parts(&s, 7, LIMIT, &partials) >= 5);
    char *res1 = NULL;
    void *fr1 = NULL;
    size_t frl1 = 0;
    res = NULL;
    RW_ASSERT_OK(rw_client_generate(c1, ar, 120000, &res, &fr, &frl, &e), &e);
    RW_ASSERT_OK(rw_client_generate(c2, ar, 120000, &res1, &fr1, &frl1, &e), &e);
    free(ar);
    typed = json_loads(res, 0, NULL);
    assert_non_null(typed);
    for (size_t i = 0; i < NP; i++) {
        json_t *o = json_array_get(json_object_get(typed, "outputs"), i);
        assert_same_output(o, json_array_get(o1, i), i);
        rw_client_routes r, r1;
        RW_ASSERT_OK(rw_client_routes_of(res, i, fr, frl, &r, &e), &e);
        RW_ASSERT_OK(rw_client_routes_of(res1, i, fr1, frl1, &r1, &e), &e);
        assert_int_equal(r.tokens, json_integer_value(json_object_get(o, "prompt_tokens")) +
                                       (json_int_t)json_array_size(json_object_get(o, "tokens")));
        assert_int_equal(r.tokens, r1.tokens);
        assert_int_equal(r.layers, r1.layers);
        assert_int_equal(r.k, r1.k);
        assert_int_equal(r.id_bytes, r1.id_bytes);
        const size_t cells = (size_t)(r.tokens * r.layers * r.k);
        rw_assert_bytes_equal(r.ids, r1.ids, cells * (size_t)r.id_bytes, "routes in parts");
        rw_assert_bytes_equal(r.weights, r1.weights, cells * sizeof(float),
                              "routing weights in parts");
    }
    json_decref(typed);
    free(res);
    free(fr);
    free(res1);
    free(fr1);
    json_decref(one);
    json_decref(joined);
    rl_close(&s);
    dt_shutdown(&W1, c1, 30);
    dt_shutdown(&W2, c2, 30);
}

/* ---- a fake worker whose replies the client cannot read ----------------------------------- */
typedef struct fake {
    void *ctx, *sock;
    char ep[128];
    pthread_t th;
} fake;

/* Answers 3 requests: the 1st with an envelope of 65 MiB (past the decoder's limit), the 2nd
 * with a corrupt one, in the reverse order of their arrival after the 3rd has been read (so the
 * client meets request 1's unreadable reply while it waits for request 3), the 3rd normally. */
static void *fake_main(void *arg) {
    fake *f = arg;
    zmq_msg_t id[3];
    uint64_t rid[3];
    for (int k = 0; k < 3; k++) {
        zmq_msg_init(&id[k]);
        zmq_msg_recv(&id[k], f->sock, 0);
        zmq_msg_t env;
        zmq_msg_init(&env);
        zmq_msg_recv(&env, f->sock, 0);
        rw_msg *m;
        rw_request rq;
        rw_err e;
        rid[k] = rw_msg_decode_request(zmq_msg_data(&env), zmq_msg_size(&env), &m, &rq, &e) == RW_OK
                     ? rq.id
                     : 0;
        rw_msg_free(m);
        zmq_msg_close(&env);
    }
    rw_mw *w;
    rw_mw_create(&w, NULL);
    /* request 1: {protocol, id, ok: true, result: <65 MiB of bin chunks>} */
    rw_mw_reply_ok(w, rid[0]);
    static char chunk[1u << 20];
    rw_mw_array(w, 65);
    for (int i = 0; i < 65; i++)
        rw_mw_bin(w, chunk, sizeof chunk);
    const void *p;
    size_t n;
    rw_mw_finish(w, &p, &n, NULL);
    zmq_msg_send(&id[0], f->sock, ZMQ_SNDMORE);
    zmq_send(f->sock, p, n, 0);
    /* request 2: the id, then garbage */
    rw_mw_reset(w);
    rw_mw_reply_ok(w, rid[1]);
    rw_mw_finish(w, &p, &n, NULL);
    uint8_t bad[64];
    memcpy(bad, p, n < sizeof bad ? n : sizeof bad);
    bad[n < sizeof bad ? n : sizeof bad - 1] = 0xc1; /* a byte msgpack never uses */
    zmq_msg_send(&id[1], f->sock, ZMQ_SNDMORE);
    zmq_send(f->sock, bad, n + 1 < sizeof bad ? n + 1 : sizeof bad, 0);
    /* request 3: a good reply */
    rw_mw_reset(w);
    rw_mw_reply_ok(w, rid[2]);
    rw_mw_map(w, 0);
    rw_mw_finish(w, &p, &n, NULL);
    zmq_msg_send(&id[2], f->sock, ZMQ_SNDMORE);
    zmq_send(f->sock, p, n, 0);
    rw_mw_destroy(w);
    return NULL;
}

static void test_client_unreadable_reply(void **state) {
    (void)state;
    fake f;
    f.ctx = zmq_ctx_new();
    f.sock = zmq_socket(f.ctx, ZMQ_ROUTER);
    assert_int_equal(zmq_bind(f.sock, "tcp://127.0.0.1:*"), 0);
    size_t el = sizeof f.ep;
    zmq_getsockopt(f.sock, ZMQ_LAST_ENDPOINT, f.ep, &el);
    assert_int_equal(pthread_create(&f.th, NULL, fake_main, &f), 0);
    rw_client *c;
    rw_err e;
    RW_ASSERT_OK(rw_client_connect(f.ep, NULL, &c, &e), &e);
    uint64_t id1, id2, id3;
    RW_ASSERT_OK(rw_client_send_json(c, "health", NULL, NULL, NULL, 0, &id1, &e), &e);
    RW_ASSERT_OK(rw_client_send_json(c, "health", NULL, NULL, NULL, 0, &id2, &e), &e);
    RW_ASSERT_OK(rw_client_send_json(c, "health", NULL, NULL, NULL, 0, &id3, &e), &e);
    const double t0 = rw_now();
    /* request 3 is answered after the two unreadable replies: they wait for their own calls */
    RW_ASSERT_OK(rw_client_wait_json(c, id3, 30000, NULL, NULL, NULL, &e), &e);
    rw_err_clear(&e);
    assert_int_equal(rw_client_wait_json(c, id1, 30000, NULL, NULL, NULL, &e), RW_E_RANGE);
    printf("reply 1: %s\n", e.msg);
    assert_non_null(strstr(e.msg, "cannot be read"));
    assert_non_null(strstr(e.msg, "limit 67108864"));
    rw_err_clear(&e);
    assert_int_equal(rw_client_wait_json(c, id2, 30000, NULL, NULL, NULL, &e), RW_E_FORMAT);
    printf("reply 2: %s\n", e.msg);
    /* no wait for a timeout anywhere */
    assert_true(rw_now() - t0 < 20);
    rw_client_close(c);
    pthread_join(f.th, NULL);
    zmq_close(f.sock);
    zmq_ctx_term(f.ctx);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_teardown(test_client_unreadable_reply, teardown),
        cmocka_unit_test_teardown(test_parts_lowered_limit, teardown),
        cmocka_unit_test_teardown(test_over_64_mib_default, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
