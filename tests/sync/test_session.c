/* test_session.c - update session invariants on a host weight set of the tiny fixture: commit
 * switches the version and yields the same bytes as a direct load; abort before any write keeps
 * the previous version intact; a refused bucket (bad shape, unknown name, short source) writes
 * nothing; a failure mid-way reports weights_incomplete until a full update succeeds; state
 * errors; the idle timeout; updates from disk (whole and filtered); a checkpoint file truncated
 * while an update from disk reads it (an error naming the file and tensor, the previous version
 * or weights_incomplete, then a fresh update succeeds); and the command handlers over decoded
 * msgpack requests. */
#include "sync_util.h"

#include <ftw.h>
#include <inttypes.h>
#include <jansson.h>
#include <pthread.h>
#include <sys/stat.h>
#include <unistd.h>

typedef struct fx {
    rw_config cfg;
    rw_ckpt *ck;
    rw_wset *ws, *ref;
    rw_sync_session *s;
    rw_sync_manifest *m;
} fx;

static int setup(void **state) {
    fx *f = calloc(1, sizeof *f);
    fx_config(&f->cfg);
    f->ck = fx_ckpt();
    f->ws = ws_random(&f->cfg, 1, 0, 77);
    f->ref = ws_reference(&f->cfg, 1, 0);
    rw_err e;
    RW_ASSERT_OK(rw_sync_session_create(f->ws, "random", false, &f->s, &e), &e);
    RW_ASSERT_OK(rw_sync_manifest_create(&f->m, &e), &e);
    *state = f;
    return 0;
}

static int teardown(void **state) {
    fx *f = *state;
    rw_sync_manifest_destroy(f->m);
    rw_sync_session_destroy(f->s);
    rw_wset_destroy(f->ws);
    rw_wset_destroy(f->ref);
    rw_ckpt_close(f->ck);
    rw_config_free(&f->cfg);
    free(f);
    return 0;
}

static void begin(fx *f, const char *ver) {
    rw_err e;
    rw_sync_begin_args a = {.version = ver, .flush_cache = true};
    RW_ASSERT_OK(rw_sync_session_begin(f->s, &a, &e), &e);
}

static void apply_prefix(fx *f, const char *prefix) {
    rw_err e;
    uint8_t *b = fx_bucket(f->ck, prefix, f->m);
    rw_sync_source src = rw_sync_source_host("mem", b, rw_sync_manifest_bytes(f->m));
    rw_sync_bucket_result r;
    RW_ASSERT_OK(rw_sync_session_apply(f->s, f->m, &src, &r, &e), &e);
    assert_true(r.applied);
    assert_int_equal(r.tensors, rw_sync_manifest_count(f->m));
    free(b);
}

static void expect_state(fx *f, rw_sync_wstate st, const char *version) {
    rw_sync_info i;
    rw_sync_session_info(f->s, &i);
    assert_int_equal(i.state, st);
    assert_string_equal(i.version, version);
    char v[RW_SYNC_MAX_VERSION + 1];
    rw_err e;
    rw_status rs = rw_sync_session_ready(f->s, v, sizeof v, &e);
    assert_int_equal(rs, st == RW_SYNC_READY      ? RW_OK
                         : st == RW_SYNC_UPDATING ? RW_E_BUSY
                                                  : RW_E_WEIGHTS_INCOMPLETE);
}

static void test_commit_switches_version(void **state) {
    fx *f = *state;
    expect_state(f, RW_SYNC_READY, "random");
    begin(f, "v1");
    expect_state(f, RW_SYNC_UPDATING, "random");
    apply_prefix(f, NULL);
    expect_state(f, RW_SYNC_UPDATING, "random");
    rw_sync_commit_result r;
    rw_err e;
    RW_ASSERT_OK(rw_sync_session_commit(f->s, &r, &e), &e);
    assert_string_equal(r.version, "v1");
    assert_true(r.flush_cache);
    assert_int_equal(r.buckets, 1);
    assert_int_equal(r.bytes, rw_sync_manifest_bytes(f->m));
    expect_state(f, RW_SYNC_READY, "v1");
    ws_assert_equal(f->ws, f->ref, "session update vs direct load");
}

static void test_abort_before_write_keeps_version(void **state) {
    fx *f = *state;
    size_t n;
    uint8_t *snap = ws_snapshot(f->ws, &n);
    begin(f, "v2");
    bool intact = false;
    rw_err e;
    RW_ASSERT_OK(rw_sync_session_abort(f->s, &intact, &e), &e);
    assert_true(intact);
    expect_state(f, RW_SYNC_READY, "random");
    rw_assert_bytes_equal(snap, ws_bytes(f->ws, &n), n, "after abort");
    free(snap);
}

/* A manifest whose entry `bad` has been altered by `mut`. */
static void refused_bucket(fx *f, void (*mut)(rw_sync_tensor *), int64_t src_delta, rw_status want,
                           const char *needle) {
    size_t n;
    uint8_t *snap = ws_snapshot(f->ws, &n);
    begin(f, "v3");
    uint8_t *b = fx_bucket(f->ck, "model.layers.0.", f->m);
    rw_sync_manifest *m2;
    rw_err e;
    RW_ASSERT_OK(rw_sync_manifest_create(&m2, &e), &e);
    for (size_t i = 0; i < rw_sync_manifest_count(f->m); i++) {
        rw_sync_tensor t = *rw_sync_manifest_at(f->m, i);
        if (mut && i == rw_sync_manifest_count(f->m) - 1) mut(&t);
        RW_ASSERT_OK(rw_sync_manifest_push(m2, &t, &e), &e);
    }
    rw_sync_manifest_set_bytes(m2, rw_sync_manifest_bytes(f->m));
    rw_sync_source src = rw_sync_source_host(
        "mem", b, (uint64_t)((int64_t)rw_sync_manifest_bytes(f->m) + src_delta));
    rw_assert_status(rw_sync_session_apply(f->s, m2, &src, NULL, &e), want, &e, needle,
                     "a refused bucket");
    assert_non_null(strstr(e.msg, "previous version still serves"));
    expect_state(f, RW_SYNC_READY, "random");
    rw_assert_bytes_equal(snap, ws_bytes(f->ws, &n), n, "after a refused bucket");
    /* the session is over */
    assert_int_equal(rw_sync_session_apply(f->s, m2, &src, NULL, &e), RW_E_STATE);
    rw_sync_manifest_destroy(m2);
    free(b);
    free(snap);
}

static void mut_shape(rw_sync_tensor *t) {
    /* same byte count, wrong shape */
    t->shape[0] *= 2;
    t->shape[t->ndim - 1] /= 2;
}
static void mut_name(rw_sync_tensor *t) {
    snprintf(t->name, sizeof t->name, "model.layers.0.mlp.bogus.weight");
}

static void test_refused_bucket_writes_nothing(void **state) {
    fx *f = *state;
    refused_bucket(f, mut_shape, 0, RW_E_SHAPE, "model.layers.0.");
    refused_bucket(f, mut_name, 0, RW_E_NOT_FOUND, "model.layers.0.mlp.bogus.weight");
    refused_bucket(f, NULL, -6, RW_E_SHAPE, "truncated");
    refused_bucket(f, NULL, 10, RW_E_SHAPE, "delivered");
}

static void test_midway_failure_then_full_update(void **state) {
    fx *f = *state;
    rw_err e;
    begin(f, "v4");
    apply_prefix(f, "model.layers.0.");
    /* second bucket refused: the first was written */
    uint8_t *b = fx_bucket(f->ck, "model.layers.1.", f->m);
    rw_sync_tensor t = *rw_sync_manifest_at(f->m, 0);
    rw_sync_manifest *m2;
    RW_ASSERT_OK(rw_sync_manifest_create(&m2, &e), &e);
    mut_name(&t);
    RW_ASSERT_OK(rw_sync_manifest_push(m2, &t, &e), &e);
    rw_sync_manifest_set_bytes(m2, t.offset + t.nbytes);
    rw_sync_source src = rw_sync_source_host("mem", b, t.offset + t.nbytes);
    assert_int_equal(rw_sync_session_apply(f->s, m2, &src, NULL, &e), RW_E_NOT_FOUND);
    assert_non_null(strstr(e.msg, "incomplete"));
    expect_state(f, RW_SYNC_INCOMPLETE, "random");
    free(b);
    rw_sync_manifest_destroy(m2);
    /* a partial update does not make them complete */
    begin(f, "v5");
    apply_prefix(f, "model.layers.1.");
    assert_int_equal(rw_sync_session_commit(f->s, NULL, &e), RW_E_WEIGHTS_INCOMPLETE);
    assert_non_null(strstr(e.msg, "first missing"));
    expect_state(f, RW_SYNC_INCOMPLETE, "random");
    /* a full update from disk does */
    char dir[400];
    fx_dir(dir, sizeof dir);
    uint64_t nt, nb;
    RW_ASSERT_OK(rw_sync_session_apply_disk(f->s, dir, NULL, NULL, &nt, &nb, &e), &e);
    assert_int_equal(nt, rw_ckpt_count(f->ck));
    char want[RW_SYNC_MAX_VERSION + 1];
    snprintf(want, sizeof want, "disk:%s", dir);
    expect_state(f, RW_SYNC_READY, want);
    ws_assert_equal(f->ws, f->ref, "disk update vs direct load");
}

static void test_state_errors(void **state) {
    fx *f = *state;
    rw_err e;
    bool intact;
    rw_sync_source src = rw_sync_source_host("mem", "", 0);
    assert_int_equal(rw_sync_session_apply(f->s, f->m, &src, NULL, &e), RW_E_STATE);
    assert_non_null(strstr(e.msg, "begin_update first"));
    assert_int_equal(rw_sync_session_commit(f->s, NULL, &e), RW_E_STATE);
    assert_int_equal(rw_sync_session_abort(f->s, &intact, &e), RW_E_STATE);
    rw_sync_begin_args a = {.version = ""};
    assert_int_equal(rw_sync_session_begin(f->s, &a, &e), RW_E_INVALID_ARG);
    a.version = "bad\ttag";
    assert_int_equal(rw_sync_session_begin(f->s, &a, &e), RW_E_INVALID_ARG);
    begin(f, "v6");
    a.version = "v7";
    assert_int_equal(rw_sync_session_begin(f->s, &a, &e), RW_E_STATE);
    assert_non_null(strstr(e.msg, "'v6'"));
    assert_int_equal(rw_sync_session_release(f->s, &e), RW_E_STATE);
    RW_ASSERT_OK(rw_sync_session_abort(f->s, &intact, &e), &e);
    assert_true(intact);
    RW_ASSERT_OK(rw_sync_session_release(f->s, &e), &e);
}

static void test_idle_timeout(void **state) {
    fx *f = *state;
    rw_err e;
    rw_sync_begin_args a = {.version = "v8", .timeout_s = 0.2};
    RW_ASSERT_OK(rw_sync_session_begin(f->s, &a, &e), &e);
    RW_ASSERT_OK(rw_sync_session_poll(f->s, &e), &e);
    usleep(350000);
    assert_int_equal(rw_sync_session_poll(f->s, &e), RW_E_TIMEOUT);
    assert_non_null(strstr(e.msg, "previous version still serves"));
    expect_state(f, RW_SYNC_READY, "random");
    RW_ASSERT_OK(rw_sync_session_poll(f->s, &e), &e);
}

static void test_disk_filtered(void **state) {
    fx *f = *state;
    rw_err e;
    char dir[400];
    fx_dir(dir, sizeof dir);
    /* checksums before: layer 1 must change to the fixture's, the rest must not */
    size_t n = rw_ckpt_count(f->ck);
    uint64_t *before = calloc(n, sizeof *before);
    for (size_t i = 0; i < n; i++)
        RW_ASSERT_OK(rw_wset_checksum(f->ws, rw_ckpt_at(f->ck, i)->name, &before[i], &e), &e);
    rw_sync_begin_args a = {.version = "layer1"};
    uint64_t nt, nb;
    RW_ASSERT_OK(rw_sync_session_apply_disk(f->s, dir, "^model\\.layers\\.1\\.", &a, &nt, &nb, &e),
                 &e);
    assert_true(nt > 0 && nt < n);
    expect_state(f, RW_SYNC_READY, "layer1");
    size_t changed = 0;
    for (size_t i = 0; i < n; i++) {
        const char *name = rw_ckpt_at(f->ck, i)->name;
        uint64_t now, ref;
        RW_ASSERT_OK(rw_wset_checksum(f->ws, name, &now, &e), &e);
        RW_ASSERT_OK(rw_wset_checksum(f->ref, name, &ref, &e), &e);
        if (!strncmp(name, "model.layers.1.", 15)) {
            assert_true(now == ref);
            changed++;
        } else {
            assert_true(now == before[i]);
        }
    }
    assert_int_equal(changed, nt);
    /* a regex selecting nothing, and a bad regex, are refused before a session opens */
    assert_int_equal(rw_sync_session_apply_disk(f->s, dir, "^nothing$", &a, &nt, &nb, &e),
                     RW_E_NOT_FOUND);
    assert_int_equal(rw_sync_session_apply_disk(f->s, dir, "([", &a, &nt, &nb, &e),
                     RW_E_INVALID_ARG);
    assert_int_not_equal(
        rw_sync_session_apply_disk(f->s, "/nonexistent/dir", NULL, &a, &nt, &nb, &e), RW_OK);
    assert_non_null(strstr(e.msg, "/nonexistent/dir"));
    expect_state(f, RW_SYNC_READY, "layer1");
    free(before);
}

/* --- a checkpoint file cut short while it is read ------------------------------------------- */
/* The RW_TEST_READ_PAUSE hook (rw_core.h) stops the reader before its first read of one tensor;
 * a thread truncates the file there and lets it go on. */
typedef struct cutter {
    char pause[512], mark[520], file[512];
    uint64_t cut;
    bool done;
} cutter;

static void *cutter_main(void *p) {
    cutter *c = p;
    struct stat sb;
    double end = rw_now() + 30;
    while (stat(c->mark, &sb) != 0 && rw_now() < end)
        usleep(1000);
    c->done = stat(c->mark, &sb) == 0 && truncate(c->file, (off_t)c->cut) == 0;
    unlink(c->pause);
    unlink(c->mark);
    return NULL;
}

static int rm_cb(const char *p, const struct stat *sb, int flag, struct FTW *ftw) {
    (void)sb, (void)flag, (void)ftw;
    return remove(p);
}

/* Copies the fixture's model.safetensors to dir; arms the hook on the i-th tensor by offset and
 * sets c to cut the copy 24 bytes into that tensor. Returns the tensor's name. */
static const char *arm_cut(fx *f, const char *dir, size_t i, cutter *c) {
    char src[512];
    fx_dir(src, sizeof src);
    strcat(src, "/model.safetensors");
    char *bytes;
    size_t len;
    rw_err e;
    RW_ASSERT_OK(rw_read_file(src, &bytes, &len, &e), &e);
    snprintf(c->file, sizeof c->file, "%s/model.safetensors", dir);
    FILE *fp = fopen(c->file, "wb");
    assert_non_null(fp);
    assert_int_equal(fwrite(bytes, 1, len, fp), len);
    fclose(fp);
    free(bytes);
    /* the fixture checkpoint is this one file: ckpt entry order is offset order */
    const rw_st_entry *t = rw_ckpt_at(f->ck, i);
    const rw_st_entry *last = rw_ckpt_at(f->ck, rw_ckpt_count(f->ck) - 1);
    c->cut = len - last->end + t->begin + 24;
    snprintf(c->pause, sizeof c->pause, "%s/pause", dir);
    snprintf(c->mark, sizeof c->mark, "%s/pause.paused", dir);
    fp = fopen(c->pause, "w");
    assert_non_null(fp);
    fprintf(fp, "%s\n", t->name);
    fclose(fp);
    c->done = false;
    return t->name;
}

/* Runs the update from disk of dir with the cutter; asserts the refusal names file and tensor. */
static void disk_cut(fx *f, const char *dir, cutter *c, const char *tensor,
                     const rw_sync_begin_args *a, const char *outcome) {
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, cutter_main, c), 0);
    rw_err e;
    uint64_t nt, nb;
    rw_status st = rw_sync_session_apply_disk(f->s, dir, NULL, a, &nt, &nb, &e);
    pthread_join(th, NULL);
    assert_true(c->done);
    assert_int_equal(st, RW_E_IO);
    char want[400];
    snprintf(want, sizeof want, "tensor '%s' is cut at byte %" PRIu64 " of the file", tensor,
             c->cut);
    if (!strstr(e.msg, c->file) || !strstr(e.msg, "file shrank while loading") ||
        !strstr(e.msg, want) || !strstr(e.msg, outcome))
        fail_msg("unexpected message: %s", e.msg);
    print_message("refused: %s\n", e.msg);
}

static void test_disk_truncated_while_loading(void **state) {
    fx *f = *state;
    char dir[64] = "/tmp/rw_sync_cut_XXXXXX";
    assert_non_null(mkdtemp(dir));
    cutter c;
    size_t n0;
    uint8_t *before = ws_snapshot(f->ws, &n0);

    /* one bucket (the whole fixture): the cut is found before anything is written */
    const char *t = arm_cut(f, dir, rw_ckpt_count(f->ck) / 2, &c);
    assert_int_equal(setenv("RW_TEST_READ_PAUSE", c.pause, 1), 0);
    rw_sync_begin_args a = {.version = "never"};
    disk_cut(f, dir, &c, t, &a, "nothing was written, the previous version still serves");
    expect_state(f, RW_SYNC_READY, "random");
    size_t n1;
    const uint8_t *now = ws_bytes(f->ws, &n1);
    assert_int_equal(n0, n1);
    rw_assert_bytes_equal(now, before, n0, "weights after a refused update");

    /* 64 KiB buckets in an open session: earlier buckets were written, so incomplete */
    t = arm_cut(f, dir, rw_ckpt_count(f->ck) - 3, &c);
    rw_err e;
    rw_sync_begin_args b = {.version = "cut", .bucket_bytes = 64u << 10};
    RW_ASSERT_OK(rw_sync_session_begin(f->s, &b, &e), &e);
    disk_cut(f, dir, &c, t, NULL, "weights are incomplete until a full update succeeds");
    expect_state(f, RW_SYNC_INCOMPLETE, "random");
    unsetenv("RW_TEST_READ_PAUSE");

    /* the same session object takes a fresh update from an intact copy */
    arm_cut(f, dir, 0, &c);
    unlink(c.pause);
    uint64_t nt, nb;
    rw_sync_begin_args r = {.version = "repaired"};
    RW_ASSERT_OK(rw_sync_session_apply_disk(f->s, dir, NULL, &r, &nt, &nb, &e), &e);
    assert_int_equal(nt, rw_ckpt_count(f->ck));
    expect_state(f, RW_SYNC_READY, "repaired");
    ws_assert_equal(f->ws, f->ref, "disk update after a truncated one vs direct load");
    free(before);
    nftw(dir, rm_cb, 8, FTW_DEPTH | FTW_PHYS);
}

/* The start-up loader (rw_sync_load_ckpt, the cutter without a session): whole tensors, and row
 * pieces of 4 KiB (every tensor larger than that is cut), give the bytes of a direct load; a
 * missing directory is refused. */
static void test_load_ckpt(void **state) {
    fx *f = *state;
    char dir[400];
    fx_dir(dir, sizeof dir);
    const uint64_t pieces[] = {0, 4096};
    for (size_t i = 0; i < sizeof pieces / sizeof *pieces; i++) {
        rw_wset *ws = ws_random(&f->cfg, 1, 0, 99);
        rw_err e;
        RW_ASSERT_OK(rw_sync_load_ckpt(ws, dir, pieces[i], &e), &e);
        char missing[RW_SYNC_MAX_NAME] = "";
        assert_true(rw_wset_complete(ws, missing, sizeof missing));
        ws_assert_equal(ws, f->ref, pieces[i] ? "start-up load, 4 KiB pieces" : "start-up load");
        rw_wset_destroy(ws);
    }
    /* the cutter: a tensor that fits goes whole, a larger one in multiples of 128 rows when that
     * many fit, 0 when one row does not fit */
    const rw_st_entry *emb = rw_ckpt_find(f->ck, "model.embed_tokens.weight");
    const uint64_t rows = (uint64_t)emb->shape[0], row = (emb->end - emb->begin) / rows;
    assert_int_equal(rw_sync_ckpt_rows(emb, emb->end - emb->begin), rows);
    assert_int_equal(rw_sync_ckpt_rows(emb, 200 * row), 128);
    assert_int_equal(rw_sync_ckpt_rows(emb, 100 * row), 100);
    assert_int_equal(rw_sync_ckpt_rows(emb, row - 1), 0);
    rw_wset *ws = ws_random(&f->cfg, 1, 0, 98);
    rw_err e;
    assert_int_equal(rw_sync_load_ckpt(ws, "/nonexistent/rw-ckpt", 0, &e), RW_E_NOT_FOUND);
    rw_wset_destroy(ws);
}

/* --- handlers ------------------------------------------------------------------------------ */
typedef struct call_out {
    rw_status st;
    rw_msg *msg;
    rw_reply rep;
    rw_sync_outcome out; /* out.frame: a readback */
} call_out;

/* The commands of an open session carry its token (protocol 2), as the client library adds it:
 * args_json with "session" set to the open session's token. Malloc'd. */
static char *with_session(fx *f, const char *cmd, const char *args_json) {
    json_error_t je;
    json_t *a = json_loads(args_json, 0, &je);
    assert_non_null(a);
    const rw_cmd c = rw_cmd_parse(cmd);
    const char *tok = rw_sync_session_token(f->s);
    if (tok[0] && (c == RW_CMD_UPDATE_WEIGHTS || c == RW_CMD_UPDATE_WEIGHTS_FROM_DISK ||
                   c == RW_CMD_COMMIT_UPDATE || c == RW_CMD_ABORT_UPDATE))
        json_object_set_new(a, "session", json_string(tok));
    char *out = json_dumps(a, JSON_COMPACT);
    json_decref(a);
    return out;
}

static call_out call(fx *f, const char *cmd, const char *args_json, const void *frame,
                     size_t flen) {
    rw_mw *w, *r;
    rw_err e;
    RW_ASSERT_OK(rw_mw_create(&w, &e), &e);
    RW_ASSERT_OK(rw_mw_create(&r, &e), &e);
    rw_mw_request(w, 99, cmd);
    char *args = with_session(f, cmd, args_json);
    RW_ASSERT_OK(rw_mw_json(w, args, &e), &e);
    free(args);
    const void *p;
    size_t n;
    RW_ASSERT_OK(rw_mw_finish(w, &p, &n, &e), &e);
    rw_msg *m;
    rw_request req;
    RW_ASSERT_OK(rw_msg_decode_request(p, n, &m, &req, &e), &e);
    rw_sync_frames in = {.n = frame ? 1 : 0, .data = {frame}, .len = {flen}};
    call_out o;
    memset(&o, 0, sizeof o);
    o.st = rw_sync_handle(f->s, 0, &req, &in, r, &o.out, &e);
    RW_ASSERT_OK(rw_mw_finish(r, &p, &n, &e), &e);
    RW_ASSERT_OK(rw_msg_decode_reply(p, n, &o.msg, &o.rep, &e), &e);
    assert_int_equal(o.rep.id, 99);
    assert_int_equal(o.rep.ok, o.st == RW_OK);
    if (!o.rep.ok) assert_int_equal(o.rep.status, o.st);
    rw_msg_free(m);
    rw_mw_destroy(w);
    rw_mw_destroy(r);
    return o;
}

static void done(call_out *o) {
    rw_msg_free(o->msg);
    rw_sync_outcome_free(&o->out);
}

static void test_handlers(void **state) {
    fx *f = *state;
    rw_err e;
    call_out o = call(f, "get_weight_version", "{}", NULL, 0);
    RW_ASSERT_OK(o.st, &e);
    char v[64];
    RW_ASSERT_OK(rw_mobj_strcpy(rw_mobj_get(o.rep.result, "version"), "v", v, sizeof v, &e), &e);
    assert_string_equal(v, "random");
    done(&o);
    o = call(f, "begin_update", "{\"version\": \"h1\", \"colour\": 1}", NULL, 0);
    assert_int_equal(o.st, RW_E_PROTOCOL);
    assert_non_null(strstr(o.rep.message, "unknown field 'colour'"));
    done(&o);
    expect_state(f, RW_SYNC_READY, "random");
    o = call(f, "begin_update", "{\"flush_cache\": true}", NULL, 0);
    assert_int_equal(o.st, RW_E_PROTOCOL);
    assert_non_null(strstr(o.rep.message, "args.version: missing"));
    done(&o);
    o = call(f, "begin_update", "{\"version\": \"h1\", \"bucket_bytes\": 4194304}", NULL, 0);
    RW_ASSERT_OK(o.st, &e);
    done(&o);
    /* a bucket: manifest in args, bytes as the one frame */
    uint8_t *b = fx_bucket(f->ck, NULL, f->m);
    rw_mw *mw;
    RW_ASSERT_OK(rw_mw_create(&mw, &e), &e);
    rw_sync_manifest_write(f->m, mw);
    const void *mp;
    size_t mn;
    RW_ASSERT_OK(rw_mw_finish(mw, &mp, &mn, &e), &e);
    rw_msg *mm;
    const rw_mobj *mv;
    RW_ASSERT_OK(rw_msg_decode_value(mp, mn, &mm, &mv, &e), &e);
    char *mjson;
    RW_ASSERT_OK(rw_mobj_to_json(mv, &mjson, &e), &e);
    char *args = malloc(strlen(mjson) + 64);
    sprintf(args, "{\"transport\": \"zmq\", \"manifest\": %s}", mjson);
    o = call(f, "update_weights", args, b, rw_sync_manifest_bytes(f->m));
    RW_ASSERT_OK(o.st, &e);
    uint64_t bytes;
    RW_ASSERT_OK(rw_mobj_u64(rw_mobj_get(o.rep.result, "bytes"), "bytes", &bytes, &e), &e);
    assert_int_equal(bytes, rw_sync_manifest_bytes(f->m));
    done(&o);
    o = call(f, "commit_update", "{}", NULL, 0);
    RW_ASSERT_OK(o.st, &e);
    done(&o);
    ws_assert_equal(f->ws, f->ref, "handler update vs direct load");
    /* a zmq bucket without its frame is refused, and ends the session */
    o = call(f, "begin_update", "{\"version\": \"h2\"}", NULL, 0);
    RW_ASSERT_OK(o.st, &e);
    done(&o);
    o = call(f, "update_weights", args, NULL, 0);
    assert_int_equal(o.st, RW_E_PROTOCOL);
    assert_non_null(strstr(o.rep.message, "exactly one data frame"));
    assert_non_null(strstr(o.rep.message, "previous version still serves"));
    done(&o);
    expect_state(f, RW_SYNC_READY, "h1");
    o = call(f, "abort_update", "{}", NULL, 0);
    assert_int_equal(o.st, RW_E_STATE);
    done(&o);
    /* NCCL needs a device weight set */
    char idhex[2 * RW_NCCL_ID_BYTES + 1];
    memset(idhex, 'a', sizeof idhex - 1);
    idhex[sizeof idhex - 1] = 0;
    char gargs[600];
    snprintf(gargs, sizeof gargs,
             "{\"unique_id\": \"%s\", \"world_size\": 2, \"rank_offset\": 1, \"group_name\": "
             "\"g\"}",
             idhex);
    o = call(f, "init_weights_update_group", gargs, NULL, 0);
    assert_int_equal(o.st, RW_E_UNSUPPORTED);
    done(&o);
    snprintf(gargs, sizeof gargs, "{\"unique_id\": \"%s\", \"world_size\": 2, \"rank_offset\": 2}",
             idhex);
    o = call(f, "init_weights_update_group", gargs, NULL, 0);
    assert_int_equal(o.st, RW_E_RANGE);
    done(&o);
    /* checksums of every tensor, equal to the weight set's own */
    o = call(f, "checksum", "{}", NULL, 0);
    RW_ASSERT_OK(o.st, &e);
    const rw_mobj *ranks = rw_mobj_get(o.rep.result, "ranks");
    assert_int_equal(rw_mobj_len(ranks), 1);
    const rw_mobj *cs = rw_mobj_get(rw_mobj_at(ranks, 0), "checksums");
    assert_int_equal(rw_mobj_len(cs), rw_config_weight_count(&f->cfg));
    for (size_t i = 0; i < rw_mobj_len(cs); i++) {
        char name[RW_SYNC_MAX_NAME], hex[17], want[17];
        RW_ASSERT_OK(rw_mobj_strcpy(rw_mobj_key_at(cs, i), "k", name, sizeof name, &e), &e);
        RW_ASSERT_OK(rw_mobj_strcpy(rw_mobj_val_at(cs, i), "v", hex, sizeof hex, &e), &e);
        uint64_t s;
        RW_ASSERT_OK(rw_wset_checksum(f->ws, name, &s, &e), &e);
        snprintf(want, sizeof want, "%016llx", (unsigned long long)s);
        assert_string_equal(hex, want);
    }
    done(&o);
    o = call(f, "checksum", "{\"names\": [\"model.nope.weight\"]}", NULL, 0);
    assert_int_equal(o.st, RW_E_NOT_FOUND);
    done(&o);
    /* readback of one tensor as a frame */
    o = call(f, "get_weights", "{\"name\": \"model.layers.2.self_attn.o_proj.weight\"}", NULL, 0);
    RW_ASSERT_OK(o.st, &e);
    size_t len;
    RW_ASSERT_OK(rw_wset_readback(f->ws, "model.layers.2.self_attn.o_proj.weight", NULL, 0, &len,
                                  NULL, NULL, &e),
                 &e);
    uint8_t *rb = malloc(len);
    RW_ASSERT_OK(rw_wset_readback(f->ws, "model.layers.2.self_attn.o_proj.weight", rb, len, &len,
                                  NULL, NULL, &e),
                 &e);
    assert_int_equal(o.out.frame.len, len);
    rw_assert_bytes_equal(rb, o.out.frame.data, len, "get_weights frame");
    RW_ASSERT_OK(rw_mobj_strcpy(rw_mobj_get(o.rep.result, "dtype"), "dtype", v, sizeof v, &e), &e);
    assert_string_equal(v, "bf16");
    free(rb);
    done(&o);
    o = call(f, "frobnicate", "{}", NULL, 0);
    assert_int_equal(o.st, RW_E_NOT_FOUND);
    done(&o);
    free(args);
    free(mjson);
    rw_msg_free(mm);
    rw_mw_destroy(mw);
    free(b);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_commit_switches_version, setup, teardown),
        cmocka_unit_test_setup_teardown(test_abort_before_write_keeps_version, setup, teardown),
        cmocka_unit_test_setup_teardown(test_refused_bucket_writes_nothing, setup, teardown),
        cmocka_unit_test_setup_teardown(test_midway_failure_then_full_update, setup, teardown),
        cmocka_unit_test_setup_teardown(test_state_errors, setup, teardown),
        cmocka_unit_test_setup_teardown(test_idle_timeout, setup, teardown),
        cmocka_unit_test_setup_teardown(test_disk_filtered, setup, teardown),
        cmocka_unit_test_setup_teardown(test_disk_truncated_while_loading, setup, teardown),
        cmocka_unit_test_setup_teardown(test_load_ckpt, setup, teardown),
        cmocka_unit_test_setup_teardown(test_handlers, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
