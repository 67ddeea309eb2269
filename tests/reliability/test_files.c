/* test_files.c - checkpoint files that are not what they claim, against a live rw-worker (CPU
 * backend, the tiny fixture), issue 17 findings 1 and 3:
 * - update_weights_from_disk of a directory whose index names a shard that is a FIFO, whose lone
 *   model.safetensors is a FIFO, or whose model.safetensors.index.json is a FIFO: refused at once
 *   with "is not a regular file (a FIFO)" naming the file, while another client's `health` is
 *   answered within a second (the worker used to block in open() until someone wrote the FIFO,
 *   and with it every client);
 * - a model.safetensors that is a symlink to a readable file that is no checkpoint (its first 8
 *   bytes a huge "header length", or a small one followed by text), and an index that is no JSON:
 *   refused with `format`, and the message holds none of the file's bytes - neither the number its
 *   first 8 bytes make nor any of its text (the worker used to print "header length N" and
 *   jansson's "near '...'" quote).
 * After each, the previous version serves: every checksum as before and the reference tokens. */
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <sys/stat.h>

#include "reliability_util.h"

typedef struct fx {
    rl_fx x;
    char *tmp;
} fx;

static fx F;

static int setup(void **state) {
    F.tmp = rw_test_tmpdir("rw_rel_files_");
    rl_fx_start(&F.x, NULL, NULL);
    *state = &F;
    return 0;
}

static int teardown(void **state) {
    (void)state;
    rl_fx_stop(&F.x);
    rw_test_rm_rf(F.tmp);
    free(F.tmp);
    return 0;
}

/* tmp/name with the fixture's config.json (and, when `model`, a copy of its model.safetensors). */
static const char *new_dir(const char *name, bool model, char *dir, size_t cap) {
    rl_new_ckpt_dir(F.x.fixture, F.tmp, name, dir, cap);
    if (model) {
        char a[4200], b[4400];
        snprintf(a, sizeof a, "%s/model.safetensors", F.x.fixture);
        snprintf(b, sizeof b, "%s/model.safetensors", dir);
        rl_copy_file(a, b, SIZE_MAX);
    }
    return dir;
}

/* update_weights_from_disk of dir, sent while another client keeps asking for health: the
 * refusal comes with `want` and a message holding `sub`, and health is answered within a second
 * meanwhile. Returns the message in msg. */
static void disk_refused_live(const char *dir, rw_status want, const char *sub, char *msg,
                              size_t cap) {
    char a[4400];
    snprintf(a, sizeof a, "{\"path\": \"%s\", \"version\": \"never\"}", dir);
    rl_sock s;
    rl_open(&s, F.x.w.ep);
    rl_send_request(&s, 77, "update_weights_from_disk", a);
    /* the control loop is free: a second client's health comes back at once */
    rw_client *h = dt_connect(&F.x.w);
    const double t0 = rw_now();
    char *res = NULL;
    rw_err e;
    rw_err_clear(&e);
    rw_status st = rw_client_call_json(h, "health", NULL, 1000, &res, &e);
    if (st != RW_OK)
        fail_msg("health not answered while the worker opened %s: %s (%s)", dir, rw_status_str(st),
                 e.msg);
    rw_client_free(res);
    rw_client_close(h);
    printf("health answered in %.3f s\n", rw_now() - t0);
    rl_reply r;
    if (!rl_recv(&s, 5000, &r)) fail_msg("%s: no reply to update_weights_from_disk", dir);
    assert_false(r.rep.ok);
    snprintf(msg, cap, "%s", r.rep.message);
    if (r.rep.status != want)
        fail_msg("%s: %s (%s), expected %s", dir, rw_status_str(r.rep.status), msg,
                 rw_status_str(want));
    if (!strstr(msg, sub)) fail_msg("%s: message '%s' lacks '%s'", dir, msg, sub);
    printf("refused %s: %s\n", dir, msg);
    rl_reply_free(&r);
    rl_close(&s);
}

/* If a test fails with the worker blocked in open() on a FIFO, this lets it go. */
static void unblock_fifo(const char *path) {
    int fd = open(path, O_WRONLY | O_NONBLOCK);
    if (fd >= 0) close(fd);
}

static void test_fifo_shard(void **state) {
    (void)state;
    char dir[4200], p[4400], msg[512];
    new_dir("fifo_shard", true, dir, sizeof dir);
    /* the index names two shards: the first a real file, the second a FIFO */
    char src[4400];
    snprintf(src, sizeof src, "%s/model.safetensors", dir);
    snprintf(p, sizeof p, "%s/model-00001-of-00002.safetensors", dir);
    assert_int_equal(rename(src, p), 0);
    snprintf(p, sizeof p, "%s/model-00002-of-00002.safetensors", dir);
    assert_int_equal(mkfifo(p, 0644), 0);
    json_t *map = json_object();
    json_object_set_new(map, "model.norm.weight", json_string("model-00001-of-00002.safetensors"));
    json_object_set_new(map, "lm_head.weight", json_string("model-00002-of-00002.safetensors"));
    json_t *idx = json_object();
    json_object_set_new(idx, "metadata", json_object());
    json_object_set_new(idx, "weight_map", map);
    char ip[4400];
    snprintf(ip, sizeof ip, "%s/model.safetensors.index.json", dir);
    assert_int_equal(json_dump_file(idx, ip, 0), 0);
    json_decref(idx);
    disk_refused_live(dir, RW_E_IO, "is not a regular file (a FIFO)", msg, sizeof msg);
    unblock_fifo(p);
    assert_non_null(strstr(msg, "model-00002-of-00002.safetensors"));
    rl_fx_assert_intact(&F.x, NULL);
}

/* dir `name` (with the fixture's model.safetensors when `model`) whose file `fifo` is a FIFO:
 * refused at once, naming that file. */
static void fifo_case(const char *name, bool model, const char *fifo) {
    char dir[4200], p[4400], msg[512];
    new_dir(name, model, dir, sizeof dir);
    snprintf(p, sizeof p, "%s/%s", dir, fifo);
    assert_int_equal(mkfifo(p, 0644), 0);
    disk_refused_live(dir, RW_E_IO, "is not a regular file (a FIFO)", msg, sizeof msg);
    unblock_fifo(p);
    assert_non_null(strstr(msg, fifo));
    rl_fx_assert_intact(&F.x, NULL);
}

static void test_fifo_model_and_index(void **state) {
    (void)state;
    /* a lone model.safetensors that is a FIFO */
    fifo_case("fifo_model", false, "model.safetensors");
    /* an index that is a FIFO (next to a valid model.safetensors it must not fall back to) */
    fifo_case("fifo_index", true, "model.safetensors.index.json");
}

/* A secret-looking file the worker can read but the client could not: its bytes must not come
 * back in the error. */
static void write_secret(const char *path, const uint8_t *head, size_t hn, const char *text) {
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(head, 1, hn, f), hn);
    assert_int_equal(fwrite(text, 1, strlen(text), f), strlen(text));
    assert_int_equal(fclose(f), 0);
}

/* The message holds no run of 4 characters of `text` and not the decimal value of `head`, outside
 * the paths it names: the test's directory (random characters, such as "24", the value of one
 * head below) is cut out first, so only what the worker wrote about the file is checked. */
static void assert_no_bytes(const char *msg_in, const uint8_t *head, const char *text) {
    char msg[512];
    size_t n = 0;
    const size_t tl = strlen(F.tmp);
    for (const char *m = msg_in; *m && n + 1 < sizeof msg;) {
        if (strncmp(m, F.tmp, tl) == 0) {
            m += tl;
            continue;
        }
        msg[n++] = *m++;
    }
    msg[n] = 0;
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = (v << 8) | head[i];
    char num[32];
    snprintf(num, sizeof num, "%" PRIu64, v);
    if (strstr(msg, num)) fail_msg("the message shows the file's first 8 bytes (%s): %s", num, msg);
    for (size_t i = 0; i + 4 <= strlen(text); i++) {
        char w[5];
        memcpy(w, text + i, 4);
        w[4] = 0;
        if (strstr(msg, w)) fail_msg("the message quotes the file ('%s'): %s", w, msg);
    }
}

static void test_symlink_not_a_checkpoint(void **state) {
    (void)state;
    char dir[4200], p[4400], target[4400], msg[512];
    static const char text[] = "ROOTPASSWORD=hunter2\nAPIKEY=zq7Xk9Lm\n";
    /* first 8 bytes: a "header length" far past any limit */
    const uint8_t big[8] = {'S', 'E', 'C', 'R', 'E', 'T', '=', '1'};
    snprintf(target, sizeof target, "%s/secret_a.env", F.tmp);
    write_secret(target, big, sizeof big, text);
    new_dir("symlink_a", false, dir, sizeof dir);
    snprintf(p, sizeof p, "%s/model.safetensors", dir);
    assert_int_equal(symlink(target, p), 0);
    disk_refused_live(dir, RW_E_FORMAT, "not a safetensors file", msg, sizeof msg);
    assert_no_bytes(msg, big, text);
    assert_null(strstr(msg, "SECRET"));
    /* a small "header length" (inside the file) followed by text that is no JSON */
    const uint8_t small[8] = {24, 0, 0, 0, 0, 0, 0, 0};
    snprintf(target, sizeof target, "%s/secret_b.env", F.tmp);
    write_secret(target, small, sizeof small, text);
    new_dir("symlink_b", false, dir, sizeof dir);
    snprintf(p, sizeof p, "%s/model.safetensors", dir);
    assert_int_equal(symlink(target, p), 0);
    disk_refused_live(dir, RW_E_FORMAT, "header is not valid JSON", msg, sizeof msg);
    assert_no_bytes(msg, small, text);
    /* an index that is a symlink to the same kind of file */
    new_dir("symlink_index", false, dir, sizeof dir);
    snprintf(p, sizeof p, "%s/model.safetensors.index.json", dir);
    assert_int_equal(symlink(target, p), 0);
    disk_refused_live(dir, RW_E_FORMAT, "invalid JSON", msg, sizeof msg);
    assert_no_bytes(msg, small, text);
    /* a symlink to a real checkpoint (a Hugging Face cache is made of them) still loads */
    new_dir("symlink_ok", false, dir, sizeof dir);
    snprintf(p, sizeof p, "%s/model.safetensors", dir);
    snprintf(target, sizeof target, "%s/model.safetensors", F.x.fixture);
    assert_int_equal(symlink(target, p), 0);
    char a[4400];
    snprintf(a, sizeof a, "{\"path\": \"%s\", \"version\": \"via-symlink\"}", dir);
    json_decref(dt_ok(F.x.c, "update_weights_from_disk", a));
    rl_fx_assert_intact(&F.x, NULL);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fifo_shard),
        cmocka_unit_test(test_fifo_model_and_index),
        cmocka_unit_test(test_symlink_not_a_checkpoint),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
