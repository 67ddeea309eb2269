/* test_faults.c - faults in the middle of a weight update, against a live rw-worker (CPU backend,
 * the tiny fixture), one worker process for the whole run:
 * - a ZeroMQ trainer killed while its bucket is on the wire (a 64 MiB multipart message cut
 *   short): the session times out; the previous version serves bit for bit (or, if the bucket
 *   had arrived whole after all, the weights report weights_incomplete);
 * - a trainer that closes its socket and exits after one bucket was written: the session times
 *   out, generate is refused with weights_incomplete, and a full push (librw_client) from a new
 *   client succeeds without a restart;
 * - disk checkpoints truncated or corrupted: a lone file cut in half, one shard of an indexed
 *   checkpoint cut short, a header with a flipped byte, data ending before the last tensor. Each
 *   is refused before anything is written and the previous version serves; the same refusal
 *   inside a session that had written a bucket leaves weights_incomplete, and a full
 *   update_weights_from_disk repairs it.
 * - a checkpoint file truncated WHILE the worker reads it (after it was opened and validated; the
 *   RW_TEST_READ_PAUSE hook of rw_st_read holds the reader at one tensor while the test cuts the
 *   file there): update_weights_from_disk fails with "file shrank while loading" naming the file,
 *   the tensor and the byte, without a signal; the previous version serves when nothing was
 *   written (one bucket), weights_incomplete when earlier buckets were (a session of 64 KiB
 *   buckets); a fresh update succeeds in the same process. The same cut during rw-worker's
 *   start-up load (rw_model_load_ckpt, in row pieces): the worker exits with status 1 and the
 *   message, not a signal; a worker started on an intact copy loads it (row pieces of 4 KiB) and
 *   serves the fixture's weights.
 * After each fault the checksums of every tensor and the fixture's greedy tokens are checked. */
#include <fcntl.h>
#include <ftw.h>
#include <inttypes.h>
#include <sys/stat.h>

#include "reliability_util.h"

typedef struct fx {
    dt_worker w;
    rw_client *c;
    dt_ref ref;
    char fixture[4096];
    char tmp[256];
    char *sums0;     /* checksums of the fixture's weights */
    char pause[300]; /* the worker's RW_TEST_READ_PAUSE file */
} fx;

static fx *F; /* for the teardown of a failed test */

/* ---- files ----------------------------------------------------------------------------------- */
static size_t file_size(const char *p) {
    struct stat sb;
    assert_int_equal(stat(p, &sb), 0);
    return (size_t)sb.st_size;
}

/* The fixture's tensors split over two shards with model.safetensors.index.json. */
static void write_sharded(const fx *f, const char *dir) {
    char p[4200];
    snprintf(p, sizeof p, "%s/model.safetensors", f->fixture);
    rw_st_file *src;
    rw_err e;
    RW_ASSERT_OK(rw_st_open(p, &src, &e), &e);
    size_t n = rw_st_count(src), half = n / 2;
    json_t *map = json_object();
    for (int s = 0; s < 2; s++) {
        size_t b = s ? half : 0, end = s ? n : half;
        rw_st_decl *d = calloc(end - b, sizeof *d);
        const char *fname =
            s ? "model-00002-of-00002.safetensors" : "model-00001-of-00002.safetensors";
        for (size_t i = b; i < end; i++) {
            const rw_st_entry *t = rw_st_at(src, i);
            d[i - b].name = t->name;
            d[i - b].dtype = t->dtype;
            d[i - b].ndim = t->ndim;
            memcpy(d[i - b].shape, t->shape, sizeof t->shape);
            json_object_set_new(map, t->name, json_string(fname));
        }
        snprintf(p, sizeof p, "%s/%s", dir, fname);
        rw_st_writer *w;
        RW_ASSERT_OK(rw_st_writer_create(p, d, end - b, NULL, &w, &e), &e);
        for (size_t i = b; i < end; i++) {
            const rw_st_entry *t = rw_st_at(src, i);
            RW_ASSERT_OK(rw_st_writer_write(w, t->data, t->end - t->begin, &e), &e);
        }
        RW_ASSERT_OK(rw_st_writer_close(w, &e), &e);
        free(d);
    }
    rw_st_close(src);
    json_t *idx = json_object();
    json_object_set_new(idx, "metadata", json_object());
    json_object_set_new(idx, "weight_map", map);
    snprintf(p, sizeof p, "%s/model.safetensors.index.json", dir);
    assert_int_equal(json_dump_file(idx, p, JSON_INDENT(1)), 0);
    json_decref(idx);
}

static int rm_cb(const char *p, const struct stat *sb, int flag, struct FTW *ftw) {
    (void)sb, (void)flag, (void)ftw;
    return remove(p);
}

/* ---- worker state ------------------------------------------------------------------------------
 */
static const char *wstate(fx *f, char *version, size_t cap) {
    static char st[64];
    json_t *v = dt_ok(f->c, "get_weight_version", NULL);
    snprintf(st, sizeof st, "%s", dt_str(v, "state", NULL));
    if (version) snprintf(version, cap, "%s", dt_str(v, "version", NULL));
    json_decref(v);
    return st;
}

/* Waits until no session is open (the idle timeout aborted it); returns the state. */
static const char *wait_session_end(fx *f, double limit_s) {
    double end = rw_now() + limit_s;
    while (rw_now() < end) {
        const char *s = wstate(f, NULL, 0);
        if (strcmp(s, "updating")) return s;
        usleep(50000);
    }
    fail_msg("the update session was not aborted within %.0f s", limit_s);
    return "";
}

/* The previous version serves: same version tag, every checksum as before, reference tokens. */
static void assert_intact(fx *f, const char *version) {
    char v[RW_SYNC_MAX_VERSION + 1];
    assert_string_equal(wstate(f, v, sizeof v), "ready");
    assert_string_equal(v, version);
    char *sums = rl_checksums(f->c);
    assert_string_equal(sums, f->sums0);
    free(sums);
    rl_assert_reference(f->c, &f->ref);
}

/* Weights incomplete: generate is refused with that status, health says so. */
static void assert_incomplete(fx *f) {
    assert_string_equal(wstate(f, NULL, 0), "weights_incomplete");
    char msg[512];
    dt_refused(f->c, "generate", "{\"prompt\": [1, 2, 3], \"max_new_tokens\": 2}",
               RW_E_WEIGHTS_INCOMPLETE, msg, sizeof msg);
    assert_non_null(strstr(msg, "incomplete"));
    json_t *h = dt_ok(f->c, "health", NULL);
    assert_string_equal(dt_str(h, "state", NULL), "weights_incomplete");
    json_decref(h);
}

/* A full update from disk (implicit session), then the fixture serves again. */
static void repair_from_disk(fx *f, const char *version) {
    char a[4400];
    snprintf(a, sizeof a, "{\"path\": \"%s\", \"version\": \"%s\"}", f->fixture, version);
    json_t *r = dt_ok(f->c, "update_weights_from_disk", a);
    assert_true(json_is_true(json_object_get(r, "committed")));
    json_decref(r);
    assert_intact(f, version);
}

/* ---- a trainer in a child process
 * ----------------------------------------------------------------- */
/* Sends one envelope (+ an optional frame of `flen` bytes of `fill`) on a fresh DEALER socket and
 * waits for the reply when `wait`; returns false on any failure. `session` (may be NULL): a
 * begin_update's reply leaves its session token there (protocol 2); when it holds one, the
 * session's commands carry it. Child-process code: no cmocka. */
static bool child_send(void *sock, uint64_t id, const char *cmd, const char *args, size_t flen,
                       uint8_t fill, bool wait, char *session) {
    char with[1024];
    if (session && session[0] && strcmp(cmd, "begin_update") && args[0] == '{') {
        snprintf(with, sizeof with, "{\"session\": \"%s\", %s", session, args + 1);
        args = with;
    }
    rw_mw *w;
    if (rw_mw_create(&w, NULL) != RW_OK) return false;
    rw_mw_request(w, id, cmd);
    bool ok = rw_mw_json(w, args, NULL) == RW_OK;
    const void *env;
    size_t len;
    ok = ok && rw_mw_finish(w, &env, &len, NULL) == RW_OK;
    ok = ok && zmq_send(sock, env, len, flen ? ZMQ_SNDMORE : 0) >= 0;
    rw_mw_destroy(w);
    if (ok && flen) {
        void *frame = malloc(flen);
        ok = frame != NULL;
        if (ok) {
            memset(frame, fill, flen);
            ok = zmq_send(sock, frame, flen, 0) >= 0;
            free(frame);
        }
    }
    if (!ok || !wait) return ok;
    zmq_pollitem_t pi = {.socket = sock, .events = ZMQ_POLLIN};
    if (zmq_poll(&pi, 1, 30000) <= 0) return false;
    char buf[4096];
    int n = zmq_recv(sock, buf, sizeof buf, 0);
    if (n <= 0 || n > (int)sizeof buf) return false;
    rw_msg *m = NULL;
    rw_reply rp;
    ok = rw_msg_decode_reply(buf, (size_t)n, &m, &rp, NULL) == RW_OK && rp.ok;
    if (ok && session && !strcmp(cmd, "begin_update"))
        ok = rw_mobj_strcpy(rw_mobj_get(rp.result, "session"), "session", session, 64, NULL) ==
             RW_OK;
    rw_msg_free(m);
    return ok;
}

typedef enum trainer_end {
    KILLED_MID_BUCKET = 0,   /* SIGKILL right after a 64 MiB bucket is handed to ZeroMQ */
    CLOSED_AFTER_BUCKET = 1, /* one small bucket applied, then socket closed and exit(0) */
} trainer_end;

#define BIG_BUCKET (64u << 20)

/* Runs the trainer; returns once it is gone. */
static void trainer(fx *f, trainer_end how) {
    int report;
    pid_t pid = dt_fork_reporter(&report);
    if (pid == 0) {
        void *ctx = zmq_ctx_new();
        void *sock = zmq_socket(ctx, ZMQ_DEALER);
        int linger = how == CLOSED_AFTER_BUCKET ? 2000 : 0;
        zmq_setsockopt(sock, ZMQ_LINGER, &linger, sizeof linger);
        bool ok = zmq_connect(sock, f->w.ep) == 0;
        char a[512];
        snprintf(a, sizeof a, "{\"version\": \"never\", \"timeout_s\": 3, \"bucket_bytes\": %u}",
                 BIG_BUCKET);
        char session[64] = "";
        ok = ok && child_send(sock, 1, "begin_update", a, 0, 0, true, session);
        if (how == KILLED_MID_BUCKET) {
            /* one small piece and a large gap: a valid bucket that takes a while to cross */
            snprintf(a, sizeof a,
                     "{\"transport\": \"zmq\", \"manifest\": {\"nbytes\": %u, \"tensors\": "
                     "[{\"name\": \"model.norm.weight\", \"dtype\": \"bf16\", \"shape\": [128], "
                     "\"offset\": 0, \"nbytes\": 256}]}}",
                     BIG_BUCKET);
            ok = ok && child_send(sock, 2, "update_weights", a, BIG_BUCKET, 0x3f, false, session);
        } else {
            ok = ok && child_send(sock, 2, "update_weights",
                                  "{\"transport\": \"zmq\", \"manifest\": {\"nbytes\": 256, "
                                  "\"tensors\": [{\"name\": \"model.norm.weight\", \"dtype\": "
                                  "\"bf16\", \"shape\": [128], \"offset\": 0, \"nbytes\": "
                                  "256}]}}",
                                  256, 0x3f, true, session);
        }
        if (write(report, ok ? "y" : "n", 1) != 1) _exit(3);
        if (how == KILLED_MID_BUCKET)
            for (;;)
                pause(); /* until killed */
        zmq_close(sock);
        zmq_ctx_term(ctx);
        _exit(ok ? 0 : 1);
    }
    dt_reporter_done(pid, report, how == KILLED_MID_BUCKET);
}

/* ---- tests
 * ------------------------------------------------------------------------------------------- */
static void test_trainer_killed_mid_bucket(void **state) {
    fx *f = *state;
    const pid_t pid = f->w.pid;
    char v0[RW_SYNC_MAX_VERSION + 1];
    wstate(f, v0, sizeof v0);
    trainer(f, KILLED_MID_BUCKET);
    const char *st = wait_session_end(f, 30);
    /* the bucket either never arrived whole (ZeroMQ drops a cut message: nothing written) or it
     * did and was applied before the trainer died */
    json_t *s = dt_ok(f->c, "stats", NULL);
    const int64_t got = dt_int(s, "weights", "last_update_bytes");
    const int64_t aborted = dt_int(s, "weights", "updates_aborted");
    json_decref(s);
    assert_true(aborted >= 1);
    printf("trainer killed mid-bucket: %s\n",
           got ? "the bucket had arrived whole" : "the bucket was cut short");
    if (got == 0) {
        assert_string_equal(st, "ready");
        assert_intact(f, v0);
    } else {
        assert_int_equal(got, BIG_BUCKET);
        assert_incomplete(f);
        repair_from_disk(f, "after-mid-bucket");
    }
    assert_int_equal(kill(pid, 0), 0);
}

static void test_trainer_closed_after_bucket(void **state) {
    fx *f = *state;
    const pid_t pid = f->w.pid;
    trainer(f, CLOSED_AFTER_BUCKET);
    assert_string_equal(wait_session_end(f, 30), "weights_incomplete");
    assert_incomplete(f);
    /* a full push through the client library from a new client, same worker process */
    rw_client *c = dt_connect(&f->w);
    rw_push_opts o = {.transport = "zmq",
                      .bucket_bytes = 4u << 20,
                      .version = "pushed-after-close",
                      .verify = true,
                      .timeout_ms = DT_TIMEOUT_MS};
    rw_push_summary sum;
    rw_err e;
    rw_err_clear(&e);
    RW_ASSERT_OK(rw_sync_push_ckpt(&c, 1, NULL, f->fixture, &o, &sum, &e), &e);
    assert_true(sum.verified);
    assert_int_equal(sum.mismatches, 0);
    rw_client_close(c);
    assert_intact(f, "pushed-after-close");
    assert_int_equal(kill(pid, 0), 0);
}

/* update_weights_from_disk of `dir` is refused with `want` and a message holding `sub`. */
static void disk_refused(fx *f, const char *dir, rw_status want, const char *sub, char *msg,
                         size_t cap) {
    char a[4400];
    snprintf(a, sizeof a, "{\"path\": \"%s\", \"version\": \"never\"}", dir);
    dt_refused(f->c, "update_weights_from_disk", a, want, msg, cap);
    if (!strstr(msg, sub)) fail_msg("%s: message '%s' lacks '%s'", dir, msg, sub);
    printf("refused %s: %s\n", dir, msg);
}

static void test_disk_truncated(void **state) {
    fx *f = *state;
    char v0[RW_SYNC_MAX_VERSION + 1], dir[4200], src[4200], dst[4300], msg[512];
    wstate(f, v0, sizeof v0);
    snprintf(src, sizeof src, "%s/model.safetensors", f->fixture);
    const size_t full = file_size(src);

    /* a lone file cut in half */
    rl_new_ckpt_dir(f->fixture, f->tmp, "half", dir, sizeof dir);
    snprintf(dst, sizeof dst, "%s/model.safetensors", dir);
    rl_copy_file(src, dst, full / 2);
    disk_refused(f, dir, RW_E_FORMAT, "model.safetensors", msg, sizeof msg);
    assert_intact(f, v0);

    /* the data ends 2 bytes before the last tensor does */
    rl_new_ckpt_dir(f->fixture, f->tmp, "short2", dir, sizeof dir);
    snprintf(dst, sizeof dst, "%s/model.safetensors", dir);
    rl_copy_file(src, dst, full - 2);
    disk_refused(f, dir, RW_E_FORMAT, "model.safetensors", msg, sizeof msg);
    assert_intact(f, v0);

    /* a flipped byte inside the JSON header */
    rl_new_ckpt_dir(f->fixture, f->tmp, "flipped", dir, sizeof dir);
    snprintf(dst, sizeof dst, "%s/model.safetensors", dir);
    rl_copy_file(src, dst, SIZE_MAX);
    {
        FILE *fp = fopen(dst, "r+b");
        assert_non_null(fp);
        assert_int_equal(fseek(fp, 8, SEEK_SET), 0);
        assert_int_equal(fputc('[', fp), '['); /* the header's '{' */
        assert_int_equal(fclose(fp), 0);
    }
    disk_refused(f, dir, RW_E_FORMAT, "model.safetensors", msg, sizeof msg);
    assert_intact(f, v0);

    /* an indexed checkpoint whose second shard is cut short */
    rl_new_ckpt_dir(f->fixture, f->tmp, "sharded", dir, sizeof dir);
    write_sharded(f, dir);
    snprintf(dst, sizeof dst, "%s/model-00002-of-00002.safetensors", dir);
    assert_int_equal(truncate(dst, (off_t)(file_size(dst) - 100)), 0);
    disk_refused(f, dir, RW_E_FORMAT, "model-00002-of-00002.safetensors", msg, sizeof msg);
    assert_intact(f, v0);

    /* the same refusal inside a session that had written a bucket: incomplete, then repaired */
    rl_sock s;
    rl_open(&s, f->w.ep);
    rl_reply r;
    rl_ok(&s, 1, "begin_update", "{\"version\": \"mixed\", \"bucket_bytes\": 4194304}", &r);
    char token[64], ua[512];
    rl_result_str(&r, "session", token, sizeof token);
    rl_reply_free(&r);
    static uint8_t ones[256];
    for (size_t i = 0; i < sizeof ones; i += 2)
        ones[i] = 0x80, ones[i + 1] = 0x3f;
    size_t n;
    snprintf(ua, sizeof ua,
             "{\"session\": \"%s\", \"manifest\": {\"nbytes\": 256, \"tensors\": [{\"name\": "
             "\"model.norm.weight\", \"dtype\": \"bf16\", \"shape\": [128], "
             "\"offset\": 0, \"nbytes\": 256}]}}",
             token);
    void *env = rl_env(2, "update_weights", ua, &n);
    const void *fr[1] = {ones};
    size_t fl[1] = {sizeof ones};
    rl_call_raw(&s, env, n, fr, fl, 1, &r);
    free(env);
    assert_true(r.rep.ok);
    rl_reply_free(&r);
    rl_close(&s);
    /* the update from disk goes to the same session: this client is given its token */
    rw_err te;
    RW_ASSERT_OK(rw_client_set_session(f->c, token, &te), &te);
    disk_refused(f, dir, RW_E_FORMAT, "weights are incomplete until a full update succeeds", msg,
                 sizeof msg);
    assert_incomplete(f);
    repair_from_disk(f, "repaired-from-disk");

    /* the intact sharded checkpoint loads */
    rl_new_ckpt_dir(f->fixture, f->tmp, "sharded_ok", dir, sizeof dir);
    write_sharded(f, dir);
    char a[4400];
    snprintf(a, sizeof a, "{\"path\": \"%s\", \"version\": \"sharded\"}", dir);
    json_decref(dt_ok(f->c, "update_weights_from_disk", a));
    assert_intact(f, "sharded");
}

/* ---- files cut while the worker reads them -------------------------------------------------- */
/* A copy of the fixture in tmp/name; the pause file armed on the i-th tensor (file order); the
 * file size to cut at (24 bytes into that tensor). Returns the tensor's name (static). */
static const char *cut_setup(fx *f, const char *name, size_t i, char *dir, size_t cap, char *file,
                             size_t fcap, uint64_t *cut) {
    static char tname[RW_SYNC_MAX_NAME];
    char src[4200];
    rl_new_ckpt_dir(f->fixture, f->tmp, name, dir, cap);
    snprintf(src, sizeof src, "%s/model.safetensors", f->fixture);
    snprintf(file, fcap, "%s/model.safetensors", dir);
    rl_copy_file(src, file, SIZE_MAX);
    rw_st_file *st;
    rw_err e;
    RW_ASSERT_OK(rw_st_open(file, &st, &e), &e);
    const size_t n = rw_st_count(st);
    assert_true(i < n);
    const rw_st_entry *t = rw_st_at(st, i);
    snprintf(tname, sizeof tname, "%s", t->name);
    *cut = file_size(file) - rw_st_at(st, n - 1)->end + t->begin + 24;
    rw_st_close(st);
    FILE *fp = fopen(f->pause, "w");
    assert_non_null(fp);
    fprintf(fp, "%s\n", tname);
    assert_int_equal(fclose(fp), 0);
    return tname;
}

/* Waits for the reader to stop at the armed tensor, cuts `file` to `cut` bytes, lets it go on. */
static void cut_when_paused(fx *f, const char *file, uint64_t cut) {
    char mark[400];
    snprintf(mark, sizeof mark, "%s.paused", f->pause);
    double end = rw_now() + 30;
    struct stat sb;
    while (stat(mark, &sb) != 0) {
        if (rw_now() > end) fail_msg("the reader did not reach the armed tensor within 30 s");
        usleep(2000);
    }
    assert_int_equal(truncate(file, (off_t)cut), 0);
    assert_int_equal(unlink(f->pause), 0);
    assert_int_equal(unlink(mark), 0);
}

/* The error names the file, the tensor and the byte where the file ends now. */
static void assert_cut_message(const char *msg, const char *file, const char *tensor,
                               uint64_t cut) {
    char want[400];
    snprintf(want, sizeof want, "tensor '%s' is cut at byte %" PRIu64 " of the file", tensor, cut);
    if (!strstr(msg, file) || !strstr(msg, "file shrank while loading") || !strstr(msg, want))
        fail_msg("message '%s' lacks the file, 'file shrank while loading' or '%s'", msg, want);
}

/* update_weights_from_disk of dir, with the file cut while the worker reads it; returns the
 * error message in msg. */
static void disk_cut(fx *f, const char *dir, const char *file, const char *tensor, uint64_t cut,
                     const char *outcome, char *msg, size_t cap) {
    char a[4400];
    snprintf(a, sizeof a, "{\"path\": \"%s\", \"version\": \"never\"}", dir);
    uint64_t id;
    rw_err e;
    RW_ASSERT_OK(rw_client_send_json(f->c, "update_weights_from_disk", a, NULL, NULL, 0, &id, &e),
                 &e);
    cut_when_paused(f, file, cut);
    rw_err_clear(&e);
    assert_int_equal(rw_client_wait_json(f->c, id, DT_TIMEOUT_MS, NULL, NULL, NULL, &e), RW_E_IO);
    snprintf(msg, cap, "%s", e.msg);
    assert_cut_message(msg, file, tensor, cut);
    if (!strstr(msg, outcome)) fail_msg("message '%s' lacks '%s'", msg, outcome);
    printf("cut while loading: %s\n", msg);
}

/* Tensors in the fixture's model.safetensors. */
static size_t fixture_tensors(fx *f) {
    char file[4300];
    snprintf(file, sizeof file, "%s/model.safetensors", f->fixture);
    rw_st_file *st;
    rw_err e;
    RW_ASSERT_OK(rw_st_open(file, &st, &e), &e);
    const size_t n = rw_st_count(st);
    rw_st_close(st);
    return n;
}

static void test_disk_cut_while_loading(void **state) {
    fx *f = *state;
    const pid_t pid = f->w.pid;
    char v0[RW_SYNC_MAX_VERSION + 1], dir[4200], file[4300], msg[512];
    uint64_t cut;
    wstate(f, v0, sizeof v0);
    const size_t n = fixture_tensors(f);

    /* an implicit session: the fixture is one bucket, cut before a byte of it was written */
    const char *t = cut_setup(f, "cut1", n / 2, dir, sizeof dir, file, sizeof file, &cut);
    disk_cut(f, dir, file, t, cut, "nothing was written, the previous version still serves", msg,
             sizeof msg);
    assert_intact(f, v0);
    assert_int_equal(kill(pid, 0), 0);

    /* inside a session of 64 KiB buckets: the buckets before the cut were written */
    t = cut_setup(f, "cut2", n - 4, dir, sizeof dir, file, sizeof file, &cut);
    json_decref(dt_ok(f->c, "begin_update", "{\"version\": \"cut\", \"bucket_bytes\": 65536}"));
    disk_cut(f, dir, file, t, cut, "weights are incomplete until a full update succeeds", msg,
             sizeof msg);
    assert_incomplete(f);
    assert_int_equal(kill(pid, 0), 0);

    /* a fresh update from disk in the same process */
    repair_from_disk(f, "after-cut-while-loading");
}

/* Waits (bounded) for a child to end; returns its wait status. */
static int wait_child(pid_t pid, double limit_s) {
    double end = rw_now() + limit_s;
    int status = 0;
    for (;;) {
        pid_t r = waitpid(pid, &status, WNOHANG);
        if (r == pid) return status;
        if (rw_now() > end) {
            kill(pid, SIGKILL);
            waitpid(pid, &status, 0);
            fail_msg("rw-worker did not exit within %.0f s", limit_s);
        }
        usleep(10000);
    }
}

static void test_startup_cut_while_loading(void **state) {
    fx *f = *state;
    char dir[4200], file[4300], log[400], exe[4096];
    uint64_t cut;
    rw_err e;
    const size_t n = fixture_tensors(f);
    const char *t = cut_setup(f, "cut_start", n / 3, dir, sizeof dir, file, sizeof file, &cut);
    snprintf(log, sizeof log, "%s/start.log", f->tmp);
    dt_exe(exe, sizeof exe, "worker/rw-worker");
    /* row pieces of 4 KiB: the load reads the armed tensor in several preads */
    assert_int_equal(setenv("RW_TEST_READ_PAUSE", f->pause, 1), 0);
    assert_int_equal(setenv("RW_LOAD_PIECE_BYTES", "4096", 1), 0);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        int fd = open(log, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (fd < 0) _exit(126);
        dup2(fd, 1);
        dup2(fd, 2);
        execl(exe, exe, "--model", dir, "--device", "cpu", "--control", "tcp://127.0.0.1:*",
              "--kv-mb", DT_KV_MB, (char *)NULL);
        _exit(127);
    }
    unsetenv("RW_TEST_READ_PAUSE");
    cut_when_paused(f, file, cut);
    int status = wait_child(pid, 60);
    char *out = NULL;
    size_t len = 0;
    RW_ASSERT_OK(rw_read_file(log, &out, &len, &e), &e);
    printf("start-up on a file cut while loading: %s", out);
    if (!WIFEXITED(status))
        fail_msg("rw-worker ended by signal %d, not with an error", WTERMSIG(status));
    assert_int_equal(WEXITSTATUS(status), 1);
    assert_cut_message(out, file, t, cut);
    char want[4400];
    snprintf(want, sizeof want, "loading %s", dir);
    assert_non_null(strstr(out, want));
    free(out);

    /* a worker started on an intact copy loads it (the same row pieces) and serves it */
    rl_new_ckpt_dir(f->fixture, f->tmp, "intact_start", dir, sizeof dir);
    snprintf(file, sizeof file, "%s/model.safetensors", dir);
    char src[4200];
    snprintf(src, sizeof src, "%s/model.safetensors", f->fixture);
    rl_copy_file(src, file, SIZE_MAX);
    const char *args[] = {"--model",           dir, "--device", "cpu", "--control",
                          "tcp://127.0.0.1:*", NULL};
    dt_worker w;
    dt_start(&w, args);
    unsetenv("RW_LOAD_PIECE_BYTES");
    rw_client *c = dt_connect(&w);
    char *sums = rl_checksums(c);
    assert_string_equal(sums, f->sums0);
    free(sums);
    rl_assert_reference(c, &f->ref);
    json_t *r = NULL;
    RW_ASSERT_OK(dt_call(c, "shutdown", NULL, &r, &e), &e);
    json_decref(r);
    assert_int_equal(dt_wait_exit(&w, 30), 0);
    rw_client_close(c);
}

/* ---- fixture
 * ------------------------------------------------------------------------------------------ */
static int setup(void **state) {
    fx *f = calloc(1, sizeof *f);
    F = f;
    dt_ref_load(&f->ref);
    rw_test_path(f->fixture, sizeof f->fixture, RW_TEST_FIXTURE);
    snprintf(f->tmp, sizeof f->tmp, "/tmp/rw_rel_faults_XXXXXX");
    assert_non_null(mkdtemp(f->tmp));
    /* the worker reads the hook's file at every checkpoint open; it exists only during a test */
    snprintf(f->pause, sizeof f->pause, "%s/pause", f->tmp);
    assert_int_equal(setenv("RW_TEST_READ_PAUSE", f->pause, 1), 0);
    rl_start_fixture(&f->w, NULL, NULL);
    unsetenv("RW_TEST_READ_PAUSE");
    f->c = dt_connect(&f->w);
    f->sums0 = rl_checksums(f->c);
    *state = f;
    return 0;
}

static int teardown(void **state) {
    fx *f = *state ? *state : F;
    if (!f) return 0;
    if (f->w.pid > 0) {
        rw_err e;
        json_t *r = NULL;
        if (dt_call(f->c, "shutdown", NULL, &r, &e) == RW_OK) {
            json_decref(r);
            assert_int_equal(dt_wait_exit(&f->w, 30), 0);
        } else {
            kill(f->w.pid, SIGKILL);
            dt_wait_exit(&f->w, 10);
        }
    }
    rw_client_close(f->c);
    nftw(f->tmp, rm_cb, 16, FTW_DEPTH | FTW_PHYS);
    free(f->sums0);
    free(f);
    F = NULL;
    return 0;
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_trainer_killed_mid_bucket),
        cmocka_unit_test(test_trainer_closed_after_bucket),
        cmocka_unit_test(test_disk_truncated),
        cmocka_unit_test(test_disk_cut_while_loading),
        cmocka_unit_test(test_startup_cut_while_loading),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
