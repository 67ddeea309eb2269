/* test_load.c - load on a live rw-worker (CPU backend, the tiny fixture): two clients each send
 * 1000 generate commands (2000 requests in flight; short random prompts, 1-4 new tokens, greedy
 * or sampled, some streamed) using the same request ids, with pauses in every mode and resumes in
 * between, and 10% of the requests aborted by id at random moments. Checks: every request gets
 * exactly one final reply, on its own client; streamed chunks are contiguous prefixes of the
 * final tokens; a request finishes early ("abort") only when it was aborted or a pause in mode
 * abort came after it, and otherwise runs to max_new_tokens; every abort / pause / resume gets
 * one reply; nothing is left in flight or holding KV afterwards; no reply arrives after the
 * last; the worker shuts down with exit status 0 (in a sanitizer build: no leak report). And a
 * client that reads 3000 replies only after all of them were produced still gets every one. */
#include "reliability_util.h"

#define NCLIENT 2
#define PER_CLIENT 1000
#define NREQ (NCLIENT * PER_CLIENT)
#define MAX_NEW 4

typedef struct req {
    int client;
    uint64_t id; /* the client's request id (both clients use 1..PER_CLIENT) */
    int max_new;
    bool stream;
    bool abort_sent; /* an abort naming it was sent */
    int pause_abort; /* pause-abort commands sent while it was in flight */
    int finals, partials;
    bool early;   /* finished with "abort" */
    int streamed; /* tokens received in stream chunks */
    int32_t stream_tok[MAX_NEW];
    bool sent;
} req;

typedef struct load {
    rl_sock s[NCLIENT];
    req r[NREQ];
    int finals;
    int control_pending[NCLIENT]; /* abort / pause / resume replies still expected */
    int64_t ctl_seq;
    int aborts_sent, pauses[3];
    uint64_t pause_id; /* a pause whose reply is awaited (0: none) */
} load;

static dt_worker W; /* killed by the teardown when a failed check left it running */

static req *find(load *L, int client, uint64_t id) {
    if (id < 1 || id > PER_CLIENT) return NULL;
    return &L->r[client * PER_CLIENT + (int)(id - 1)];
}

static int64_t geti(const rw_mobj *m, const char *k) {
    int64_t v = -1;
    if (rw_mobj_i64(rw_mobj_get(m, k), k, &v, NULL) != RW_OK)
        fail_msg("reply field '%s' missing or not an integer", k);
    return v;
}

static int in_flight(const load *L) {
    int n = 0;
    for (int i = 0; i < NREQ; i++)
        n += L->r[i].sent && !L->r[i].finals;
    return n;
}

static void in_flight_pause_abort(load *L) {
    for (int i = 0; i < NREQ; i++)
        if (L->r[i].sent && !L->r[i].finals) L->r[i].pause_abort++;
}

/* Handles one reply that arrived on client c. */
static void on_reply(load *L, int c, rl_reply *rp) {
    const uint64_t id = rp->rep.id;
    if (id >= 1000000) { /* a control command's reply */
        L->control_pending[c]--;
        if (id == L->pause_id) L->pause_id = 0; /* the pause is in force */
        if (!rp->rep.ok) {
            /* an abort of a request that had finished already is the one allowed refusal */
            if (rp->rep.status != RW_E_NOT_FOUND)
                fail_msg("control command %llu failed: %s: %s", (unsigned long long)id,
                         rw_status_str(rp->rep.status), rp->rep.message);
        }
        return;
    }
    req *q = find(L, c, id);
    if (!q || !q->sent)
        fail_msg("client %d: a reply to unknown request %llu", c, (unsigned long long)id);
    if (!rp->rep.ok)
        fail_msg("client %d request %llu: %s: %s", c, (unsigned long long)id,
                 rw_status_str(rp->rep.status), rp->rep.message);
    if (q->finals)
        fail_msg("client %d request %llu: a reply after its final one", c, (unsigned long long)id);
    const rw_mobj *res = rp->rep.result;
    bool stream = false;
    rw_mobj_bool(rw_mobj_get(res, "stream"), "stream", &stream, NULL);
    const rw_mobj *outs = rw_mobj_get(res, "outputs");
    if (stream) {
        q->partials++;
        for (size_t i = 0; i < rw_mobj_len(outs); i++) {
            const rw_mobj *o = rw_mobj_at(outs, i);
            assert_int_equal(geti(o, "index"), 0);
            if (geti(o, "offset") != q->streamed)
                fail_msg("request %llu: chunk at offset %lld after %d tokens",
                         (unsigned long long)id, (long long)geti(o, "offset"), q->streamed);
            const rw_mobj *t = rw_mobj_get(o, "tokens");
            for (size_t k = 0; k < rw_mobj_len(t); k++) {
                int64_t v;
                assert_int_equal(rw_mobj_i64(rw_mobj_at(t, k), "t", &v, NULL), RW_OK);
                if (q->streamed >= MAX_NEW)
                    fail_msg("request %llu: too many streamed tokens", (unsigned long long)id);
                q->stream_tok[q->streamed++] = (int32_t)v;
            }
        }
        return;
    }
    q->finals++;
    L->finals++;
    assert_int_equal(rw_mobj_len(outs), 1);
    const rw_mobj *o = rw_mobj_at(outs, 0);
    char fin[16];
    assert_int_equal(rw_mobj_strcpy(rw_mobj_get(o, "finish"), "finish", fin, sizeof fin, NULL),
                     RW_OK);
    const rw_mobj *t = rw_mobj_get(o, "tokens");
    const int n = (int)rw_mobj_len(t);
    if (n > q->max_new)
        fail_msg("request %llu: %d tokens for max_new_tokens %d", (unsigned long long)id, n,
                 q->max_new);
    for (int k = 0; k < n; k++) {
        int64_t v;
        assert_int_equal(rw_mobj_i64(rw_mobj_at(t, (size_t)k), "t", &v, NULL), RW_OK);
        assert_true(v >= 0 && v < 512);
        if (k < q->streamed && q->stream_tok[k] != v)
            fail_msg("request %llu: streamed token %d differs from the final one",
                     (unsigned long long)id, k);
    }
    if (q->streamed > n)
        fail_msg("request %llu: streamed %d tokens, final has %d", (unsigned long long)id,
                 q->streamed, n);
    if (!strcmp(fin, "abort")) {
        q->early = true;
        if (!q->abort_sent && !q->pause_abort)
            fail_msg("client %d request %llu finished 'abort' without an abort or pause", c,
                     (unsigned long long)id);
    } else if (!strcmp(fin, "length")) {
        if (n != q->max_new)
            fail_msg("request %llu: finish length with %d of %d tokens", (unsigned long long)id, n,
                     q->max_new);
    } else {
        fail_msg("request %llu: finish '%s'", (unsigned long long)id, fin);
    }
}

/* Reads every reply available within wait_ms (then without waiting). */
static void drain(load *L, int wait_ms) {
    for (;;) {
        zmq_pollitem_t pi[NCLIENT];
        for (int c = 0; c < NCLIENT; c++)
            pi[c] = (zmq_pollitem_t){.socket = L->s[c].sock, .events = ZMQ_POLLIN};
        int rc = zmq_poll(pi, NCLIENT, wait_ms);
        if (rc <= 0) return;
        for (int c = 0; c < NCLIENT; c++) {
            if (!(pi[c].revents & ZMQ_POLLIN)) continue;
            rl_reply rp;
            if (rl_recv(&L->s[c], 0, &rp)) {
                on_reply(L, c, &rp);
                rl_reply_free(&rp);
            }
        }
        wait_ms = 0;
    }
}

static void send_env(load *L, int c, uint64_t id, const char *cmd, const char *args) {
    size_t n;
    void *env = rl_env(id, cmd, args, &n);
    const void *f[1] = {env};
    size_t l[1] = {n};
    rl_send(&L->s[c], f, l, 1);
    free(env);
    if (id >= 1000000) L->control_pending[c]++;
}

static void test_load(void **state) {
    (void)state;
    load *L = calloc(1, sizeof *L);
    /* a sanitizer build of the worker checks for leaks at exit (the default, made explicit) */
    char asan[1024];
    const char *prev = getenv("ASAN_OPTIONS");
    snprintf(asan, sizeof asan, "%s%sdetect_leaks=1", prev ? prev : "", prev && *prev ? ":" : "");
    setenv("ASAN_OPTIONS", asan, 1);
    const char *extra[] = {"--max-batch", "64", NULL};
    rl_start_fixture(&W, NULL, extra);
    for (int c = 0; c < NCLIENT; c++)
        rl_open(&L->s[c], W.ep);
    rw_rng rng;
    rw_rng_seed(&rng, 20260529);

    /* the order of sends: requests interleaved between the clients, in 8 waves; between waves a
     * pause (modes in turn) or a resume, and aborts of random earlier requests */
    int order[NREQ];
    for (int i = 0; i < NREQ; i++)
        order[i] = (i % 2) * PER_CLIENT + i / 2;
    const int waves = 8, per_wave = NREQ / waves;
    bool paused = false;
    int mode = 0;
    static const char *const modes[3] = {"retract", "in_place", "abort"};
    for (int wv = 0; wv < waves; wv++) {
        for (int k = wv * per_wave; k < (wv + 1) * per_wave; k++) {
            req *q = &L->r[order[k]];
            q->client = order[k] / PER_CLIENT;
            q->id = (uint64_t)(order[k] % PER_CLIENT) + 1;
            q->max_new = 1 + (int)(rw_rng_u64(&rng) % MAX_NEW);
            q->stream = rw_rng_u64(&rng) % 10 == 0;
            const int plen = 1 + (int)(rw_rng_u64(&rng) % 8);
            const bool sample = rw_rng_u64(&rng) % 2;
            char a[512];
            int n = snprintf(a, sizeof a, "{\"prompt\": [");
            for (int t = 0; t < plen; t++)
                n += snprintf(a + n, sizeof a - (size_t)n, "%s%d", t ? "," : "",
                              (int)(rw_rng_u64(&rng) % 512));
            snprintf(a + n, sizeof a - (size_t)n,
                     "], \"max_new_tokens\": %d, \"stream\": %s, \"temperature\": %s, "
                     "\"seed\": %d, \"logprobs\": %s}",
                     q->max_new, q->stream ? "true" : "false", sample ? "0.8" : "0",
                     (int)(rw_rng_u64(&rng) % 100000), k % 3 ? "true" : "false");
            q->sent = true;
            send_env(L, q->client, q->id, "generate", a);
        }
        /* 10% of the requests: abort sent ones at random (25 new ones per wave) */
        for (int k = 0; k < NREQ / 10 / waves;) {
            int pick = order[(int)(rw_rng_u64(&rng) % (uint64_t)((wv + 1) * per_wave))];
            req *q = &L->r[pick];
            if (q->abort_sent) continue;
            q->abort_sent = true;
            L->aborts_sent++;
            k++;
            char a[64];
            snprintf(a, sizeof a, "{\"request_id\": %llu}", (unsigned long long)q->id);
            send_env(L, q->client, (uint64_t)(1000000 + L->ctl_seq++), "abort", a);
        }
        drain(L, 5);
        if (!paused && wv % 2 == 0) {
            char a[64];
            snprintf(a, sizeof a, "{\"mode\": \"%s\"}", modes[mode]);
            if (mode == 2) {
                /* a pause in mode abort ends whatever was sent so far (on either client): let
                 * the queue shrink to about 100 first, so most of the load still runs */
                double until = rw_now() + 120;
                while (in_flight(L) > 100 && rw_now() < until)
                    drain(L, 50);
                in_flight_pause_abort(L);
            }
            L->pauses[mode]++;
            mode = (mode + 1) % 3;
            L->pause_id = (uint64_t)(1000000 + L->ctl_seq++);
            send_env(L, wv % NCLIENT, L->pause_id, "pause", a);
            paused = true;
            /* nothing more is sent before the pause is in force */
            double until = rw_now() + 60;
            while (L->pause_id && rw_now() < until)
                drain(L, 50);
            if (L->pause_id) fail_msg("no reply to pause");
        } else if (paused) {
            drain(L, 20); /* let the pause be seen with requests queued behind it */
            send_env(L, wv % NCLIENT, (uint64_t)(1000000 + L->ctl_seq++), "resume", NULL);
            paused = false;
        }
    }
    if (paused) send_env(L, 0, (uint64_t)(1000000 + L->ctl_seq++), "resume", NULL);
    printf("sent %d requests, %d aborts, pauses retract/in_place/abort %d/%d/%d\n", NREQ,
           L->aborts_sent, L->pauses[0], L->pauses[1], L->pauses[2]);
    assert_int_equal(L->aborts_sent, NREQ / 10);

    double end = rw_now() + 300;
    while ((L->finals < NREQ || L->control_pending[0] || L->control_pending[1]) && rw_now() < end)
        drain(L, 200);
    if (L->finals < NREQ) fail_msg("only %d of %d requests got a final reply", L->finals, NREQ);
    for (int c = 0; c < NCLIENT; c++)
        if (L->control_pending[c])
            fail_msg("client %d: %d control replies missing", c, L->control_pending[c]);
    /* exactly one final each (on_reply refuses a second), and nothing more arrives */
    for (int i = 0; i < NREQ; i++)
        assert_int_equal(L->r[i].finals, 1);
    const int before = L->finals;
    drain(L, 500);
    assert_int_equal(L->finals, before);

    int early = 0, streamed = 0;
    for (int i = 0; i < NREQ; i++) {
        early += L->r[i].early;
        streamed += L->r[i].partials > 0;
    }
    printf("%d finals: %d ran to max_new_tokens, %d ended early (abort by id or pause abort), "
           "%d streamed with partial replies\n",
           L->finals, L->finals - early, early, streamed);
    /* most requests must have run: the load is generation, not only aborts */
    assert_true(L->finals - early >= NREQ * 6 / 10);

    /* nothing left behind */
    rw_client *cl = dt_connect(&W);
    json_t *s = dt_ok(cl, "stats", NULL);
    assert_int_equal(dt_int(s, "queue", "requests_in_flight"), 0);
    assert_int_equal(dt_int(s, "queue", "commands_in_flight"), 0);
    assert_int_equal(dt_int(s, "queue", "running"), 0);
    assert_int_equal(dt_int(s, "queue", "waiting"), 0);
    assert_int_equal(dt_int(s, "memory", "kv_blocks_used"), 0);
    assert_int_equal(dt_int(s, "throughput", "requests_finished"), NREQ);
    json_decref(s);
    for (int c = 0; c < NCLIENT; c++)
        rl_close(&L->s[c]);
    json_decref(dt_ok(cl, "shutdown", NULL));
    /* exit status 0: in a sanitizer build LeakSanitizer would fail the exit on a leak */
    assert_int_equal(dt_wait_exit(&W, 60), 0);
    rw_client_close(cl);
    free(L);
}

/* A client that sends 3000 generate commands (replies of about 1 kB: 4 tokens with 20 top
 * logprobs each) and reads nothing until every one has finished - three times ZeroMQ's default
 * high-water mark of 1000 messages. All 3000 must still arrive, once each. */
#define SLOW_N 3000
static void test_slow_reader(void **state) {
    (void)state;
    rl_start_fixture(&W, NULL, NULL);
    rl_sock s;
    rl_open(&s, W.ep);
    for (int i = 1; i <= SLOW_N; i++) {
        char a[160];
        snprintf(a, sizeof a, "{\"prompt\": [%d, %d], \"max_new_tokens\": 4, \"top_logprobs\": 20}",
                 i % 512, (7 * i) % 512);
        size_t n;
        void *env = rl_env((uint64_t)i, "generate", a, &n);
        const void *f[1] = {env};
        size_t l[1] = {n};
        rl_send(&s, f, l, 1);
        free(env);
    }
    /* wait, without reading, until the worker has finished them all */
    rw_client *c = dt_connect(&W);
    double end = rw_now() + 300;
    int64_t done = 0;
    while (rw_now() < end) {
        json_t *st = dt_ok(c, "stats", NULL);
        done = dt_int(st, "throughput", "requests_finished");
        json_decref(st);
        if (done >= SLOW_N) break;
        usleep(200000);
    }
    assert_int_equal(done, SLOW_N);
    static uint8_t seen[SLOW_N + 1];
    memset(seen, 0, sizeof seen);
    int got = 0;
    rl_reply r;
    while (rl_recv(&s, 2000, &r)) {
        if (!r.rep.ok || r.rep.id < 1 || r.rep.id > SLOW_N)
            fail_msg("reply %llu: ok=%d %s", (unsigned long long)r.rep.id, r.rep.ok, r.rep.message);
        if (seen[r.rep.id]++) fail_msg("request %llu answered twice", (unsigned long long)r.rep.id);
        got++;
        rl_reply_free(&r);
    }
    printf("slow reader: %d of %d replies\n", got, SLOW_N);
    assert_int_equal(got, SLOW_N);
    rl_close(&s);
    dt_shutdown(&W, c, 60);
}

static int teardown(void **state) {
    (void)state;
    dt_kill(&W);
    return 0;
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test_teardown(test_load, teardown),
                                       cmocka_unit_test_teardown(test_slow_reader, teardown)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
