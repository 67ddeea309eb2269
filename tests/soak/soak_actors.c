/* soak_actors.c - the actors of the soak test (soak.h): trainers pushing whole checkpoints over
 * ZeroMQ and probing greedy tokens after each commit, generating clients (greedy reference
 * prompts, sampled batches with top logprobs, streams, clients that leave mid-command), and the
 * hostile client that sends the inputs of issue 17's findings. Every actor has its own client
 * (its own ZeroMQ context) and records what it saw in the shared soak state. */
#include "soak.h"

#include <sys/mman.h>

/* Sleeps up to `s` seconds, waking early when the run stops. */
static void nap(const soak *s, double sec) {
    const double end = rw_now() + sec;
    while (!atomic_load(&s->stop) && rw_now() < end)
        usleep(20000);
}

/* A small deterministic generator per actor. */
static uint64_t next(uint64_t *st) {
    *st = *st * 6364136223846793005ull + 1442695040888963407ull;
    return *st >> 33;
}

/* Calls a command through the client; *out gets the parsed result (json_decref it). */
static rw_status call(rw_client *c, const char *cmd, const char *args, json_t **out, rw_err *e) {
    char *res = NULL;
    *out = NULL;
    rw_err_clear(e);
    rw_status st = rw_client_call_json(c, cmd, args, SOAK_REPLY_BOUND_MS, &res, e);
    if (st == RW_OK) {
        json_error_t je;
        *out = json_loads(res ? res : "null", JSON_DECODE_ANY, &je);
    }
    rw_client_free(res);
    return st;
}

/* Greedy generation of reference prompt i (24 tokens): the tokens must be the reference of the
 * version that made them (single span); returns true when checked. */
static bool greedy_probe(soak *s, rw_client *c, int i, const char *temperature, const char *who) {
    char p[1024], a[1400];
    dt_prompt_json(s->ref.prompt[i], s->ref.n_prompt[i], p, sizeof p);
    snprintf(a, sizeof a, "{\"prompt\": %s, \"max_new_tokens\": %d, \"temperature\": %s}", p,
             DT_REF_TOKENS, temperature);
    json_t *r;
    rw_err e;
    rw_status st = call(c, "generate", a, &r, &e);
    if (st != RW_OK) {
        /* an update that failed or was aborted can leave the weights incomplete for a moment */
        if (st != RW_E_WEIGHTS_INCOMPLETE)
            soak_fail(s, "%s: greedy probe: %s: %s", who, rw_status_str(st), e.msg);
        return false;
    }
    json_t *o = json_array_get(json_object_get(r, "outputs"), 0);
    bool checked = false;
    if (soak_check_spans(s, o, who) == 1) {
        const char *v = json_string_value(
            json_object_get(json_array_get(json_object_get(o, "version_spans"), 0), "version"));
        const int32_t *want = soak_reference(s, v, i);
        int32_t got[DT_REF_TOKENS];
        int n = dt_ints(json_object_get(o, "tokens"), got, DT_REF_TOKENS);
        if (!want) {
            soak_fail(s, "%s: tokens of an unknown version '%s'", who, v ? v : "?");
        } else if (n != DT_REF_TOKENS || memcmp(got, want, sizeof got)) {
            soak_fail(s, "%s: greedy tokens of prompt %d under '%s' are not that version's", who, i,
                      v);
        } else {
            checked = true;
        }
    }
    json_decref(r);
    return checked;
}

/* ---- trainers -------------------------------------------------------------------------------- */
void *soak_trainer(void *arg) {
    soak_actor *a = arg;
    soak *s = a->s;
    rw_client *c = NULL;
    rw_err e;
    if (rw_client_connect(s->ep, NULL, &c, &e) != RW_OK) {
        soak_fail(s, "trainer %d: connect: %s", a->index, e.msg);
        return NULL;
    }
    uint64_t rng = 99 + (uint64_t)a->index;
    nap(s, 0.5 * a->index); /* staggered */
    for (int n = 0; !atomic_load(&s->stop); n++) {
        const bool rnd = (n + a->index) % 2;
        char version[64];
        snprintf(version, sizeof version, "%s-t%d-%d", rnd ? "rnd" : "fix", a->index, n);
        rw_push_opts o = {.transport = "zmq",
                          .bucket_bytes = (256u << 10) << (next(&rng) % 3),
                          .version = version,
                          .verify = n % 5 == 0, /* checksums against the checkpoint, now and then */
                          .timeout_ms = SOAK_REPLY_BOUND_MS};
        rw_push_summary sum;
        rw_err_clear(&e);
        rw_status st =
            rw_sync_push_ckpt(&c, 1, NULL, rnd ? s->random_dir : s->fixture, &o, &sum, &e);
        if (st == RW_OK) {
            soak_committed(s, version);
            if (sum.verified && sum.mismatches)
                soak_fail(s, "trainer %d: %s: %llu checksum mismatches (%s)", a->index, version,
                          (unsigned long long)sum.mismatches, sum.first_mismatch);
            /* the greedy tokens right after the commit */
            if (greedy_probe(s, c, n % DT_NREF, "0", "trainer probe")) {
                pthread_mutex_lock(&s->mu);
                s->probes_exact++;
                pthread_mutex_unlock(&s->mu);
            }
        } else {
            pthread_mutex_lock(&s->mu);
            if (st == RW_E_STATE) /* another trainer's session is open: try again soon */
                s->commit_conflicts++;
            else
                s->pushes_failed++;
            pthread_mutex_unlock(&s->mu);
            if (st != RW_E_STATE)
                soak_fail(s, "trainer %d: push %s: %s: %s", a->index, version, rw_status_str(st),
                          e.msg);
            nap(s, 0.05 + 0.01 * (double)(next(&rng) % 20));
            continue;
        }
        nap(s, s->push_interval_s * (0.5 + (double)(next(&rng) % 100) / 100.0));
    }
    rw_client_close(c);
    return NULL;
}

/* ---- generating clients ------------------------------------------------------------------- */
/* One sampled batch: n prompts, t tokens, maybe top_logprobs and streaming. */
static char *batch_args(uint64_t *rng, int *np, int *nt) {
    *np = 1 + (int)(next(rng) % 24);
    *nt = 1 + (int)(next(rng) % 120);
    const int top = next(rng) % 3 == 0 ? 20 : 0;
    const bool stream = next(rng) % 4 == 0;
    size_t cap = (size_t)*np * 64 + 256, k = 0;
    char *a = malloc(cap);
    k += (size_t)snprintf(a + k, cap - k, "{\"prompts\": [");
    for (int i = 0; i < *np; i++) {
        const int len = 1 + (int)(next(rng) % 12);
        k += (size_t)snprintf(a + k, cap - k, "%s[", i ? "," : "");
        for (int j = 0; j < len; j++)
            k += (size_t)snprintf(a + k, cap - k, "%s%d", j ? "," : "", (int)(next(rng) % 512));
        k += (size_t)snprintf(a + k, cap - k, "]");
    }
    snprintf(a + k, cap - k,
             "], \"max_new_tokens\": %d, \"temperature\": 0.8, \"top_p\": 0.95, \"seed\": %llu, "
             "\"top_logprobs\": %d, \"stream\": %s}",
             *nt, (unsigned long long)next(rng), top, stream ? "true" : "false");
    return a;
}

void *soak_generator(void *arg) {
    soak_actor *a = arg;
    soak *s = a->s;
    uint64_t rng = 1000 + (uint64_t)a->index;
    rw_client *c = NULL;
    rw_err e;
    while (!atomic_load(&s->stop)) {
        if (!c && rw_client_connect(s->ep, NULL, &c, &e) != RW_OK) {
            soak_fail(s, "generator %d: connect: %s", a->index, e.msg);
            return NULL;
        }
        const uint64_t pick = next(&rng) % 10;
        if (pick < 3) { /* a greedy reference prompt */
            if (greedy_probe(s, c, (int)(next(&rng) % DT_NREF), "0", "generator")) {
                pthread_mutex_lock(&s->mu);
                s->gen_greedy_exact++;
                pthread_mutex_unlock(&s->mu);
            }
            continue;
        }
        int np, nt;
        char *args = batch_args(&rng, &np, &nt);
        uint64_t id;
        rw_err_clear(&e);
        if (rw_client_send_json(c, "generate", args, NULL, NULL, 0, &id, &e) != RW_OK) {
            soak_fail(s, "generator %d: send: %s", a->index, e.msg);
            free(args);
            continue;
        }
        free(args);
        if (pick == 9) { /* leaves with its command in flight: the worker must drop the work */
            nap(s, 0.01 * (double)(next(&rng) % 50));
            rw_client_close(c);
            c = NULL;
            pthread_mutex_lock(&s->mu);
            s->disconnects++;
            pthread_mutex_unlock(&s->mu);
            continue;
        }
        json_t *final = NULL;
        for (;;) { /* partial replies first when streamed; parts of the final one are joined */
            char *res = NULL;
            rw_err_clear(&e);
            rw_status st = rw_client_wait_json(c, id, SOAK_REPLY_BOUND_MS, &res, NULL, NULL, &e);
            if (st != RW_OK) {
                if (st != RW_E_WEIGHTS_INCOMPLETE)
                    soak_fail(s, "generator %d: generate: %s: %s", a->index, rw_status_str(st),
                              e.msg);
                break;
            }
            json_error_t je;
            json_t *r = json_loads(res, 0, &je);
            rw_client_free(res);
            if (!r || !json_is_true(json_object_get(r, "stream"))) {
                final = r;
                break;
            }
            json_decref(r);
        }
        if (!final) continue;
        json_t *outs = json_object_get(final, "outputs");
        uint64_t toks = 0, multi = 0;
        if ((int)json_array_size(outs) != np)
            soak_fail(s, "generator %d: %zu outputs for %d prompts", a->index,
                      json_array_size(outs), np);
        size_t i;
        json_t *o;
        json_array_foreach(outs, i, o) {
            const size_t k = json_array_size(json_object_get(o, "tokens"));
            toks += k;
            if (k > (size_t)nt) soak_fail(s, "generator %d: %zu tokens of %d", a->index, k, nt);
            multi += soak_check_spans(s, o, "generator") > 1;
        }
        json_decref(final);
        pthread_mutex_lock(&s->mu);
        s->gen_commands++;
        s->gen_requests += (uint64_t)np;
        s->gen_tokens += toks;
        s->gen_multi_span += multi;
        pthread_mutex_unlock(&s->mu);
    }
    rw_client_close(c);
    return NULL;
}

/* ---- the hostile client -----------------------------------------------------------------------
 */
/* A raw DEALER that sends one multipart message and reads one reply; false when none came. */
typedef struct raw {
    void *ctx, *sock;
} raw;

static void raw_open(raw *r, const char *ep) {
    r->ctx = zmq_ctx_new();
    r->sock = zmq_socket(r->ctx, ZMQ_DEALER);
    int linger = 0;
    zmq_setsockopt(r->sock, ZMQ_LINGER, &linger, sizeof linger);
    zmq_connect(r->sock, ep);
}

static void raw_close(raw *r) {
    zmq_close(r->sock);
    zmq_ctx_term(r->ctx);
}

/* Sends frames; waits for the reply's status (RW_OK for ok; -1 when none came in time). */
static int raw_call(raw *r, const void *const *f, const size_t *l, int n, int timeout_ms, char *msg,
                    size_t cap) {
    for (int i = 0; i < n; i++)
        if (zmq_send(r->sock, f[i], l[i], i + 1 < n ? ZMQ_SNDMORE : 0) < 0) return -1;
    zmq_pollitem_t pi = {.socket = r->sock, .events = ZMQ_POLLIN};
    if (zmq_poll(&pi, 1, timeout_ms) <= 0) return -1;
    int st = -1, more = 1;
    while (more) {
        zmq_msg_t m;
        zmq_msg_init(&m);
        if (zmq_msg_recv(&m, r->sock, 0) < 0) return -1;
        more = zmq_msg_more(&m);
        rw_msg *dm;
        rw_reply rep;
        if (st == -1 &&
            rw_msg_decode_reply(zmq_msg_data(&m), zmq_msg_size(&m), &dm, &rep, NULL) == RW_OK) {
            st = rep.ok ? RW_OK : (int)rep.status;
            if (msg) snprintf(msg, cap, "%s", rep.ok ? "" : rep.message);
            rw_msg_free(dm);
        }
        zmq_msg_close(&m);
    }
    return st;
}

static int raw_json(raw *r, uint64_t id, const char *cmd, const char *args, char *msg, size_t cap) {
    rw_mw *w;
    if (rw_mw_create(&w, NULL) != RW_OK) return -1;
    rw_mw_request(w, id, cmd);
    const void *p;
    size_t n;
    int st = -1;
    if (rw_mw_json(w, args ? args : "{}", NULL) == RW_OK && rw_mw_finish(w, &p, &n, NULL) == RW_OK)
        st = raw_call(r, (const void *const[]){p}, (size_t[]){n}, 1, SOAK_REPLY_BOUND_MS, msg, cap);
    rw_mw_destroy(w);
    return st;
}

/* Expects one of the statuses in want[0..n) (never ok). */
static void expect(soak *s, int kind, int st, const int *want, int n, const char *what,
                   const char *msg) {
    for (int i = 0; i < n; i++)
        if (st == want[i]) {
            pthread_mutex_lock(&s->mu);
            s->hostile[kind]++;
            pthread_mutex_unlock(&s->mu);
            return;
        }
    soak_fail(s, "hostile %s: status %d (%s)", what, st, msg ? msg : "");
}

void *soak_hostile(void *arg) {
    soak_actor *a = arg;
    soak *s = a->s;
    raw r;
    raw_open(&r, s->ep);
    rw_client *c = NULL;
    rw_err e;
    if (rw_client_connect(s->ep, NULL, &c, &e) != RW_OK) {
        soak_fail(s, "hostile: connect: %s", e.msg);
        return NULL;
    }
    /* a frame one byte past the soak worker's --max-frame-bytes (64 MiB), of untouched pages */
    const size_t big = (64u << 20) + 1;
    void *frame = mmap(NULL, big, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    char args[4400], msg[600];
    for (uint64_t k = 0; !atomic_load(&s->stop); k++) {
        const int kind = (int)(k % 9);
        int st;
        switch (kind) {
        case 0: /* finding 1: a shard that is a FIFO */
            snprintf(args, sizeof args, "{\"path\": \"%s\"}", s->fifo_dir);
            st = raw_json(&r, k, "update_weights_from_disk", args, msg, sizeof msg);
            expect(s, kind, st, (const int[]){RW_E_IO, RW_E_AUTH}, 2, "FIFO shard", msg);
            break;
        case 1: /* finding 3: a symlink to a file that is no checkpoint */
            snprintf(args, sizeof args, "{\"path\": \"%s\"}", s->symlink_dir);
            st = raw_json(&r, k, "update_weights_from_disk", args, msg, sizeof msg);
            expect(s, kind, st, (const int[]){RW_E_FORMAT, RW_E_AUTH}, 2, "symlink", msg);
            if (strstr(msg, "hunter2")) soak_fail(s, "hostile: file bytes in an error: %s", msg);
            break;
        case 2: /* finding 4: a temperature too small to invert is greedy */
            if (greedy_probe(s, c, (int)(k % DT_NREF), "1e-40", "hostile tiny temperature")) {
                pthread_mutex_lock(&s->mu);
                s->hostile[kind]++;
                pthread_mutex_unlock(&s->mu);
            }
            break;
        case 3: /* finding 5: another trainer's session, without its token */
            st = raw_json(&r, k, k % 2 ? "commit_update" : "abort_update", NULL, msg, sizeof msg);
            expect(s, kind, st, (const int[]){RW_E_AUTH, RW_E_STATE}, 2, "foreign commit", msg);
            break;
        case 4: { /* finding 6: a frame past the limit drops the connection, nothing stored */
            if (frame == MAP_FAILED) break;
            zmq_msg_t m;
            size_t n;
            void *env = rl_env(k, "health", NULL, &n);
            zmq_send(r.sock, env, n, ZMQ_SNDMORE);
            free(env);
            zmq_msg_init_data(&m, frame, big, NULL, NULL);
            zmq_msg_send(&m, r.sock, 0);
            nap(s, 0.3);
            raw_close(&r); /* its connection is gone: a new one */
            raw_open(&r, s->ep);
            pthread_mutex_lock(&s->mu);
            s->hostile[kind]++;
            pthread_mutex_unlock(&s->mu);
            break;
        }
        case 5: { /* too many frames */
            size_t n;
            void *env = rl_env(k, "health", NULL, &n);
            st = raw_call(&r, (const void *const[]){env, "a", "b", "c", "d", "e"},
                          (size_t[]){n, 1, 1, 1, 1, 1}, 6, SOAK_REPLY_BOUND_MS, msg, sizeof msg);
            free(env);
            expect(s, kind, st, (const int[]){RW_E_FORMAT}, 1, "six frames", msg);
            break;
        }
        case 6: /* finding 8: a command name that is not UTF-8 */
            st = raw_json(&r, k, "gen\xff\xfe", NULL, msg, sizeof msg);
            if (!rw_utf8_valid(msg, strlen(msg))) soak_fail(s, "hostile: a reply not UTF-8");
            expect(s, kind, st, (const int[]){RW_E_PROTOCOL}, 1, "non-UTF-8 command", msg);
            break;
        case 7: { /* findings 2 and 7: a large result with top logprobs, asked and abandoned */
            raw g;
            raw_open(&g, s->ep);
            char *ga = malloc(64 * 12 + 128);
            size_t q = (size_t)sprintf(ga, "{\"prompts\": [");
            for (int i = 0; i < 64; i++)
                q += (size_t)sprintf(ga + q, "%s[%d,2,3]", i ? "," : "", i + 1);
            sprintf(ga + q, "], \"max_new_tokens\": 200, \"top_logprobs\": 20}");
            size_t n;
            void *env = rl_env(k, "generate", ga, &n);
            zmq_send(g.sock, env, n, 0);
            free(env);
            free(ga);
            nap(s, 0.2);
            raw_close(&g);
            pthread_mutex_lock(&s->mu);
            s->hostile[kind]++;
            pthread_mutex_unlock(&s->mu);
            break;
        }
        case 8: { /* finding 7: more requests than one client may queue */
            char *ga = malloc(3000 * 8 + 64);
            size_t q = (size_t)sprintf(ga, "{\"prompts\": [");
            for (int i = 0; i < 3000; i++)
                q += (size_t)sprintf(ga + q, "%s[1]", i ? "," : "");
            sprintf(ga + q, "], \"max_new_tokens\": 1}");
            st = raw_json(&r, k, "generate", ga, msg, sizeof msg);
            free(ga);
            expect(s, kind, st, (const int[]){RW_E_BUSY}, 1, "per-client cap", msg);
            break;
        }
        }
        nap(s, 0.05);
    }
    if (frame != MAP_FAILED) munmap(frame, big);
    raw_close(&r);
    rw_client_close(c);
    return NULL;
}
