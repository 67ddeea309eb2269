/* reliability_util.h - helpers of the reliability tests: a raw ZeroMQ DEALER socket that sends any
 * bytes as any frames and reads replies as they come (the client library would refuse to build bad
 * messages, and it keeps at most 1024 unclaimed replies), request envelopes from JSON, and
 * small msgpack builders for broken ones. Worker processes come from tests/daemon/daemon_test.h. */
#ifndef RW_RELIABILITY_UTIL_H
#define RW_RELIABILITY_UTIL_H

#include <zmq.h>

#include "daemon_util.h"

typedef struct rl_sock {
    void *ctx, *sock;
} rl_sock;

static inline void rl_open(rl_sock *s, const char *ep) {
    s->ctx = zmq_ctx_new();
    assert_non_null(s->ctx);
    s->sock = zmq_socket(s->ctx, ZMQ_DEALER);
    assert_non_null(s->sock);
    int linger = 0;
    zmq_setsockopt(s->sock, ZMQ_LINGER, &linger, sizeof linger);
    assert_int_equal(zmq_connect(s->sock, ep), 0);
}

static inline void rl_close(rl_sock *s) {
    if (s->sock) zmq_close(s->sock);
    if (s->ctx) zmq_ctx_term(s->ctx);
    memset(s, 0, sizeof *s);
}

/* Sends n frames as one multipart message. */
static inline void rl_send(rl_sock *s, const void *const *frames, const size_t *lens, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (zmq_send(s->sock, frames[i], lens[i], i + 1 < n ? ZMQ_SNDMORE : 0) < 0)
            fail_msg("zmq_send frame %zu: %s", i, zmq_strerror(errno));
}

/* One reply: the decoded envelope (the first non-empty frame: a reply to a message that began
 * with an empty frame comes back with a delimiter) and how many frames came after it. */
typedef struct rl_reply {
    rw_msg *msg;
    rw_reply rep;
    int data_frames;
} rl_reply;

/* Waits up to timeout_ms for one reply; false on timeout. Fails the test on an undecodable one. */
static inline bool rl_recv(rl_sock *s, int timeout_ms, rl_reply *out) {
    memset(out, 0, sizeof *out);
    zmq_pollitem_t pi = {.socket = s->sock, .events = ZMQ_POLLIN};
    if (zmq_poll(&pi, 1, timeout_ms) <= 0) return false;
    bool have_env = false;
    int more = 1;
    while (more) {
        zmq_msg_t m;
        zmq_msg_init(&m);
        if (zmq_msg_recv(&m, s->sock, 0) < 0) fail_msg("zmq_msg_recv: %s", zmq_strerror(errno));
        more = zmq_msg_more(&m);
        size_t n = zmq_msg_size(&m);
        if (!have_env && n > 0) {
            rw_err e;
            rw_err_clear(&e);
            if (rw_msg_decode_reply(zmq_msg_data(&m), n, &out->msg, &out->rep, &e) != RW_OK)
                fail_msg("undecodable reply: %s", e.msg);
            have_env = true;
        } else if (have_env) {
            out->data_frames++;
        }
        zmq_msg_close(&m);
    }
    if (!have_env) fail_msg("a reply without an envelope frame");
    return true;
}

static inline void rl_reply_free(rl_reply *r) {
    rw_msg_free(r->msg);
    r->msg = NULL;
}

/* A request envelope {protocol, id, cmd, args} with args from JSON (NULL: {}), malloc'd. */
static inline void *rl_env(uint64_t id, const char *cmd, const char *args_json, size_t *len) {
    rw_mw *w;
    rw_err e;
    RW_ASSERT_OK(rw_mw_create(&w, &e), &e);
    rw_mw_request(w, id, cmd);
    RW_ASSERT_OK(rw_mw_json(w, args_json ? args_json : "{}", &e), &e);
    void *p;
    RW_ASSERT_OK(rw_mw_take(w, &p, len, &e), &e);
    rw_mw_destroy(w);
    return p;
}

/* The bytes of a writer, malloc'd; the writer is reset. */
static inline void *rl_take(rw_mw *w, size_t *len) {
    void *p;
    rw_err e;
    RW_ASSERT_OK(rw_mw_take(w, &p, len, &e), &e);
    rw_mw_reset(w);
    return p;
}

/* Sends one envelope (plus optional data frames) and waits for its reply. */
static inline void rl_call_raw(rl_sock *s, const void *env, size_t env_len,
                               const void *const *frames, const size_t *flens, size_t nframes,
                               rl_reply *out) {
    const void *f[8];
    size_t l[8];
    assert_true(nframes < 8);
    f[0] = env;
    l[0] = env_len;
    for (size_t i = 0; i < nframes; i++) {
        f[i + 1] = frames[i];
        l[i + 1] = flens[i];
    }
    rl_send(s, f, l, nframes + 1);
    if (!rl_recv(s, DT_TIMEOUT_MS, out)) fail_msg("no reply within %d ms", DT_TIMEOUT_MS);
}

/* A command that must succeed on the raw socket; returns its decoded reply (free it). */
static inline void rl_ok(rl_sock *s, uint64_t id, const char *cmd, const char *args,
                         rl_reply *out) {
    size_t n;
    void *env = rl_env(id, cmd, args, &n);
    rl_call_raw(s, env, n, NULL, NULL, 0, out);
    free(env);
    if (!out->rep.ok)
        fail_msg("%s %s -> %s: %s", cmd, args ? args : "", rw_status_str(out->rep.status),
                 out->rep.message);
    assert_int_equal(out->rep.id, id);
}

/* A string field of an ok reply's result ("" when absent). */
static inline const char *rl_result_str(const rl_reply *r, const char *key, char *buf, size_t cap) {
    buf[0] = 0;
    const rw_mobj *v = rw_mobj_get(r->rep.result, key);
    if (v) rw_mobj_strcpy(v, key, buf, cap, NULL);
    return buf;
}

/* A worker on the fixture, the CPU backend, control address `control` (NULL: a free loopback
 * port), and `extra` arguments (may be NULL). */
static inline void rl_start_fixture(dt_worker *w, const char *control, const char *const *extra) {
    static char model[4096];
    rw_test_path(model, sizeof model, RW_TEST_FIXTURE);
    const char *args[32] = {"--model", model,       "--device",
                            "cpu",     "--control", control ? control : "tcp://127.0.0.1:*"};
    int k = 6;
    for (int i = 0; extra && extra[i] && k < 31; i++)
        args[k++] = extra[i];
    args[k] = NULL;
    dt_start(w, args);
}

/* Generates the fixture's four reference prompts greedily (24 tokens each) through `c` and
 * asserts the reference tokens. */
static inline void rl_assert_reference(rw_client *c, const dt_ref *ref) {
    for (int i = 0; i < DT_NREF; i++) {
        char p[1024], a[1200];
        dt_prompt_json(ref->prompt[i], ref->n_prompt[i], p, sizeof p);
        snprintf(a, sizeof a, "{\"prompt\":%s,\"max_new_tokens\":%d}", p, DT_REF_TOKENS);
        json_t *r = dt_ok(c, "generate", a);
        dt_assert_greedy(ref, i, dt_output(r, 0), DT_REF_TOKENS);
        json_decref(r);
    }
}

/* xxh3 checksums of every tensor the worker holds, as one JSON text (for before/after). */
static inline char *rl_checksums(rw_client *c) {
    json_t *r = dt_ok(c, "checksum", NULL);
    char *s = json_dumps(json_object_get(r, "ranks"), JSON_COMPACT | JSON_SORT_KEYS);
    json_decref(r);
    assert_non_null(s);
    return s;
}

/* ---- round two (issue 17): files, logs, memory, sessions --------------------------------- */

/* Copies a file, its first `keep` bytes only (SIZE_MAX: all). */
static inline void rl_copy_file(const char *src, const char *dst, size_t keep) {
    char *text;
    size_t len;
    rw_err e;
    RW_ASSERT_OK(rw_read_file(src, &text, &len, &e), &e);
    if (keep < len) len = keep;
    FILE *f = fopen(dst, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(text, 1, len, f), len);
    assert_int_equal(fclose(f), 0);
    free(text);
}

/* tmp/name, a new checkpoint directory holding the fixture's config.json (into dir[cap]). */
static inline void rl_new_ckpt_dir(const char *fixture, const char *tmp, const char *name,
                                   char *dir, size_t cap) {
    snprintf(dir, cap, "%s/%s", tmp, name);
    assert_int_equal(mkdir(dir, 0755), 0);
    char a[4200], b[4200];
    snprintf(a, sizeof a, "%s/config.json", fixture);
    snprintf(b, sizeof b, "%s/config.json", dir);
    rl_copy_file(a, b, SIZE_MAX);
}

/* rl_start_fixture with the worker's stderr (its log) written to `log_path`. */
static inline void rl_start_logged(dt_worker *w, const char *control, const char *const *extra,
                                   const char *log_path) {
    int fd = open(log_path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    assert_true(fd >= 0);
    fflush(stderr);
    int saved = dup(2);
    assert_true(saved >= 0);
    assert_int_equal(dup2(fd, 2), 2); /* the forked worker inherits it */
    close(fd);
    rl_start_fixture(w, control, extra);
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
}

/* The whole log file, NUL-terminated (free it). */
static inline char *rl_read_log(const char *path) {
    /* through a heap slot: gcc's -Wdangling-pointer takes the text for the address of a local */
    char **slot = calloc(1, sizeof *slot);
    size_t n = 0;
    rw_err e;
    if (!slot || rw_read_file(path, slot, &n, &e) != RW_OK) fail_msg("log %s: %s", path, e.msg);
    char *text = *slot;
    free(slot);
    return text;
}

/* Waits up to timeout_s for the log to hold `needle`; returns the log (free it) or fails. */
static inline char *rl_wait_log(const char *path, const char *needle, double timeout_s) {
    const double end = rw_now() + timeout_s;
    for (;;) {
        char *t = rl_read_log(path);
        if (strstr(t, needle)) return t;
        if (rw_now() > end) {
            fprintf(stderr, "log %s:\n%s\n", path, t);
            free(t);
            fail_msg("the log has no '%s' after %.0f s", needle, timeout_s);
        }
        free(t);
        usleep(50000);
    }
}

/* Resident memory of a process in KiB (VmRSS), -1 when unknown. */
static inline long rl_rss_kib(pid_t pid) {
    char path[64], line[256];
    snprintf(path, sizeof path, "/proc/%d/status", (int)pid);
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    long kib = -1;
    while (fgets(line, sizeof line, f))
        if (!strncmp(line, "VmRSS:", 6)) kib = strtol(line + 6, NULL, 10);
    fclose(f);
    return kib;
}

/* A worker on the fixture with a client, the fixture's reference and its checksums: the set-up
 * most reliability tests share. `extra` (may be NULL) are more worker arguments; `log` (may be
 * NULL) receives the worker's stderr. */
typedef struct rl_fx {
    dt_worker w;
    rw_client *c;
    dt_ref ref;
    char fixture[4096];
    char *sums0; /* the checksums of the fixture's weights */
} rl_fx;

static inline void rl_fx_start(rl_fx *f, const char *const *extra, const char *log) {
    dt_ref_load(&f->ref);
    rw_test_path(f->fixture, sizeof f->fixture, RW_TEST_FIXTURE);
    if (log)
        rl_start_logged(&f->w, NULL, extra, log);
    else
        rl_start_fixture(&f->w, NULL, extra);
    f->c = dt_connect(&f->w);
    f->sums0 = rl_checksums(f->c);
}

/* The clean end (shutdown answered, exit 0) of a worker still running, the kill of one a failed
 * check left behind. */
static inline void rl_fx_stop(rl_fx *f) {
    if (f->w.pid > 0 && f->c) dt_shutdown(&f->w, f->c, 30);
    f->c = NULL;
    dt_kill(&f->w);
    free(f->sums0);
    f->sums0 = NULL;
}

/* The worker serves the fixture's weights as they were: state ready (and `version` when not
 * NULL), every checksum as at the start, the reference tokens. */
static inline void rl_fx_assert_intact(rl_fx *f, const char *version) {
    json_t *v = dt_ok(f->c, "get_weight_version", NULL);
    assert_string_equal(dt_str(v, "state", NULL), "ready");
    if (version) assert_string_equal(dt_str(v, "version", NULL), version);
    json_decref(v);
    char *sums = rl_checksums(f->c);
    assert_string_equal(sums, f->sums0);
    free(sums);
    rl_assert_reference(f->c, &f->ref);
}

/* Sends one request (args from JSON) without waiting for its reply. */
static inline void rl_send_request(rl_sock *s, uint64_t id, const char *cmd, const char *args) {
    size_t n;
    void *env = rl_env(id, cmd, args, &n);
    rl_send(s, (const void *const[]){env}, (size_t[]){n}, 1);
    free(env);
}

/* begin_update on the raw socket; its session token into token[cap] (protocol 2). */
static inline void rl_begin(rl_sock *s, uint64_t id, const char *args, char *token, size_t cap) {
    rl_reply r;
    rl_ok(s, id, "begin_update", args, &r);
    rl_result_str(&r, "session", token, cap);
    rl_reply_free(&r);
    assert_int_equal(strlen(token), RW_SYNC_TOKEN_LEN);
}

/* Sends one request (args from JSON, plus optional data frames) and returns its reply's status
 * (RW_OK when ok); the message into msg[cap] (may be NULL). */
static inline rw_status rl_status(rl_sock *s, uint64_t id, const char *cmd, const char *args,
                                  const void *frame, size_t flen, char *msg, size_t cap) {
    size_t n;
    void *env = rl_env(id, cmd, args, &n);
    const void *fr[1] = {frame};
    size_t fl[1] = {flen};
    rl_reply r;
    rl_call_raw(s, env, n, fr, fl, frame ? 1 : 0, &r);
    free(env);
    assert_int_equal(r.rep.id, id);
    rw_status st = r.rep.ok ? RW_OK : r.rep.status;
    if (msg) snprintf(msg, cap, "%s", r.rep.ok ? "" : r.rep.message);
    rl_reply_free(&r);
    return st;
}

#endif
