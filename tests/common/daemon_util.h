/* daemon_util.h - helpers for the daemon tests: start rw-worker processes on loopback (a free
 * port, read back from the ready line), call commands through the client library with JSON
 * results, run the command-line tools, and read the fixture's greedy reference. */
#ifndef RW_DAEMON_UTIL_H
#define RW_DAEMON_UTIL_H

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <jansson.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include "rw_client.h"
#include "rw_test.h"

#define DT_TIMEOUT_MS 60000

/* A built executable under the build tree (RW_BUILD_ROOT), e.g. "worker/rw-worker". */
static inline const char *dt_exe(char *buf, size_t cap, const char *rel) {
    const char *b = getenv("RW_BUILD_ROOT");
    snprintf(buf, cap, "%s/%s", b ? b : ".", rel);
    return buf;
}

typedef struct dt_worker {
    pid_t pid;
    int out_fd;    /* the worker's stdout */
    char ep[256];  /* control endpoint */
    json_t *ready; /* the ready line */
} dt_worker;

/* Reads one line from fd within timeout_s; false on EOF or timeout. */
static inline bool dt_read_line(int fd, char *buf, size_t cap, double timeout_s) {
    size_t n = 0;
    double end = rw_now() + timeout_s;
    while (n + 1 < cap) {
        struct pollfd p = {fd, POLLIN, 0};
        int left = (int)((end - rw_now()) * 1000);
        if (left <= 0 || poll(&p, 1, left) <= 0) return false;
        char ch;
        ssize_t r = read(fd, &ch, 1);
        if (r <= 0) return false;
        if (ch == '\n') break;
        buf[n++] = ch;
    }
    buf[n] = 0;
    return true;
}

/* KV budget (MiB) of every worker a test starts, unless its arguments give --kv-mb: the CPU
 * default, and on CUDA a small fixed size instead of 0.9 of the free memory, so that the gpu
 * tests can run side by side on the same GPUs. */
#define DT_KV_MB "64"

/* Starts rw-worker with `args` (NULL-terminated, after the program name) and waits for its
 * ready line. Fails the test when it does not come. */
static inline void dt_start(dt_worker *w, const char *const *args) {
    memset(w, 0, sizeof *w);
    char exe[4096];
    dt_exe(exe, sizeof exe, "worker/rw-worker");
    const char *av[64];
    int k = 0;
    bool kv = false;
    av[k++] = exe;
    for (int i = 0; args[i] && k < 61; i++) {
        kv = kv || !strcmp(args[i], "--kv-mb");
        av[k++] = args[i];
    }
    if (!kv) {
        av[k++] = "--kv-mb";
        av[k++] = DT_KV_MB;
    }
    av[k] = NULL;
    int p[2];
    assert_int_equal(pipe(p), 0);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        dup2(p[1], 1);
        close(p[0]);
        close(p[1]);
        execv(exe, (char *const *)av);
        _exit(127);
    }
    close(p[1]);
    w->pid = pid;
    w->out_fd = p[0];
    char line[4096];
    for (;;) {
        if (!dt_read_line(w->out_fd, line, sizeof line, 60)) {
            kill(pid, SIGKILL);
            waitpid(pid, NULL, 0);
            fail_msg("rw-worker did not print its ready line");
        }
        json_error_t je;
        json_t *j = json_loads(line, 0, &je);
        const char *ep = j ? json_string_value(json_object_get(j, "control")) : NULL;
        if (ep) {
            snprintf(w->ep, sizeof w->ep, "%s", ep);
            w->ready = j;
            return;
        }
        json_decref(j);
    }
}

/* Waits for the worker to exit (bounded); returns its exit status, or -1 if it had to be
 * killed. */
static inline int dt_wait_exit(dt_worker *w, double timeout_s) {
    if (w->pid <= 0) return -1;
    double end = rw_now() + timeout_s;
    int status = 0;
    bool killed = false;
    for (;;) {
        pid_t r = waitpid(w->pid, &status, WNOHANG);
        if (r == w->pid) break;
        if (rw_now() > end) {
            kill(w->pid, SIGKILL);
            waitpid(w->pid, &status, 0);
            killed = true;
            break;
        }
        usleep(10000);
    }
    w->pid = 0;
    close(w->out_fd);
    json_decref(w->ready);
    w->ready = NULL;
    if (killed) return -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

/* A teardown's end of a worker that a failed check left running: killed and reaped. */
static inline void dt_kill(dt_worker *w) {
    if (w->pid <= 0) return;
    kill(w->pid, SIGKILL);
    dt_wait_exit(w, 10);
}

static inline rw_client *dt_connect(const dt_worker *w) {
    rw_client *c = NULL;
    rw_err e;
    RW_ASSERT_OK(rw_client_connect(w->ep, NULL, &c, &e), &e);
    return c;
}

/* Calls a command; *result gets the result (owned, json_decref) on success. */
static inline rw_status dt_call(rw_client *c, const char *cmd, const char *args, json_t **result,
                                rw_err *e) {
    char *res = NULL;
    if (result) *result = NULL;
    rw_status st = rw_client_call_json(c, cmd, args, DT_TIMEOUT_MS, &res, e);
    if (st == RW_OK && result) {
        json_error_t je;
        *result = json_loads(res ? res : "null", JSON_DECODE_ANY, &je);
    }
    rw_client_free(res);
    return st;
}

/* A command that must succeed: its result. */
static inline json_t *dt_ok(rw_client *c, const char *cmd, const char *args) {
    json_t *r = NULL;
    rw_err e;
    rw_err_clear(&e);
    rw_status st = dt_call(c, cmd, args, &r, &e);
    if (st != RW_OK) fail_msg("%s %s -> %s: %s", cmd, args ? args : "", rw_status_str(st), e.msg);
    return r;
}

/* A command that must fail with `want`: its message is copied to msg (may be NULL). */
static inline void dt_refused(rw_client *c, const char *cmd, const char *args, rw_status want,
                              char *msg, size_t cap) {
    rw_err e;
    rw_err_clear(&e);
    json_t *r = NULL;
    rw_status st = dt_call(c, cmd, args, &r, &e);
    json_decref(r);
    if (st != want)
        fail_msg("%s %s: expected %s, got %s (%s)", cmd, args ? args : "", rw_status_str(want),
                 rw_status_str(st), e.msg);
    if (msg) snprintf(msg, cap, "%s", e.msg);
}

/* Waits for the final reply of a (possibly streaming) generate; partial replies are checked
 * against it later by the caller when `partials` is given (a JSON array that receives them). */
static inline json_t *dt_wait_gen(rw_client *c, uint64_t id, json_t *partials) {
    for (;;) {
        char *res = NULL;
        rw_err e;
        rw_status st = rw_client_wait_json(c, id, DT_TIMEOUT_MS, &res, NULL, NULL, &e);
        if (st != RW_OK) fail_msg("generate %" PRIu64 ": %s: %s", id, rw_status_str(st), e.msg);
        json_error_t je;
        json_t *r = json_loads(res, 0, &je);
        rw_client_free(res);
        assert_non_null(r);
        if (!json_is_true(json_object_get(r, "stream"))) return r;
        if (partials)
            json_array_append_new(partials, r);
        else
            json_decref(r);
    }
}

static inline uint64_t dt_send(rw_client *c, const char *cmd, const char *args) {
    uint64_t id = 0;
    rw_err e;
    RW_ASSERT_OK(rw_client_send_json(c, cmd, args, NULL, NULL, 0, &id, &e), &e);
    return id;
}

/* outputs[i] of a generate result. */
static inline json_t *dt_output(json_t *res, size_t i) {
    json_t *o = json_array_get(json_object_get(res, "outputs"), i);
    if (!o) fail_msg("generate result has no outputs[%zu]", i);
    return o;
}

/* The integers of a JSON array into dst (at most cap); returns the count. */
static inline int dt_ints(json_t *arr, int32_t *dst, int cap) {
    int n = (int)json_array_size(arr);
    if (n > cap) n = cap;
    for (int i = 0; i < n; i++)
        dst[i] = (int32_t)json_integer_value(json_array_get(arr, i));
    return n;
}

/* Field path1 (.path2) of a result. */
static inline json_t *dt_field(json_t *o, const char *path1, const char *path2) {
    json_t *v = json_object_get(o, path1);
    return path2 ? json_object_get(v, path2) : v;
}

static inline int64_t dt_int(json_t *o, const char *path1, const char *path2) {
    json_t *v = dt_field(o, path1, path2);
    if (!json_is_integer(v))
        fail_msg("result field %s.%s is not an integer", path1, path2 ? path2 : "");
    return json_integer_value(v);
}

static inline double dt_real(json_t *o, const char *path1, const char *path2) {
    json_t *v = dt_field(o, path1, path2);
    if (!json_is_number(v))
        fail_msg("result field %s.%s is not a number", path1, path2 ? path2 : "");
    return json_number_value(v);
}

static inline const char *dt_str(json_t *o, const char *path1, const char *path2) {
    json_t *v = dt_field(o, path1, path2);
    if (!json_is_string(v))
        fail_msg("result field %s.%s is not a string", path1, path2 ? path2 : "");
    return json_string_value(v);
}

/* Runs a program (argv[0] a path) to completion within timeout_s, its stdout into out (may be
 * NULL). Returns the exit status, -1 on timeout (killed). */
static inline int dt_run(const char *const *argv, char *out, size_t cap, double timeout_s) {
    int p[2];
    if (pipe(p)) return -1;
    pid_t pid = fork();
    if (pid == 0) {
        dup2(p[1], 1);
        close(p[0]);
        close(p[1]);
        execv(argv[0], (char *const *)argv);
        _exit(127);
    }
    close(p[1]);
    size_t n = 0;
    double end = rw_now() + timeout_s;
    for (;;) {
        struct pollfd pf = {p[0], POLLIN, 0};
        int left = (int)((end - rw_now()) * 1000);
        if (left <= 0) break;
        if (poll(&pf, 1, left) <= 0) continue;
        char buf[4096];
        ssize_t r = read(p[0], buf, sizeof buf);
        if (r <= 0) break;
        if (out && n + 1 < cap) {
            size_t k = (size_t)r < cap - 1 - n ? (size_t)r : cap - 1 - n;
            memcpy(out + n, buf, k);
            n += k;
        }
    }
    if (out && cap) out[n] = 0;
    close(p[0]);
    int status;
    while (rw_now() < end) {
        if (waitpid(pid, &status, WNOHANG) == pid)
            return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
        usleep(10000);
    }
    kill(pid, SIGKILL);
    waitpid(pid, &status, 0);
    return -1;
}

/* The fixture's greedy reference (tests/fixtures/README.md). */
#define DT_NREF 4
#define DT_REF_TOKENS 24
typedef struct dt_ref {
    int n_prompt[DT_NREF];
    int32_t prompt[DT_NREF][64];
    int32_t greedy[DT_NREF][DT_REF_TOKENS];
    float greedy_lp[DT_NREF][DT_REF_TOKENS];
} dt_ref;

static inline void dt_ref_load(dt_ref *r) {
    char path[4096];
    rw_test_path(path, sizeof path, RW_TEST_FIXTURE "/reference.safetensors");
    rw_st_file *f = NULL;
    rw_err e;
    RW_ASSERT_OK(rw_st_open(path, &f, &e), &e);
    for (int i = 0; i < DT_NREF; i++) {
        char name[32];
        snprintf(name, sizeof name, "prompt.%d", i);
        const rw_st_entry *p = rw_st_find(f, name);
        assert_non_null(p);
        r->n_prompt[i] = (int)p->shape[0];
        assert_true(r->n_prompt[i] <= 64);
        memcpy(r->prompt[i], p->data, sizeof(int32_t) * (size_t)r->n_prompt[i]);
        snprintf(name, sizeof name, "greedy.%d", i);
        p = rw_st_find(f, name);
        assert_non_null(p);
        assert_int_equal(p->shape[0], DT_REF_TOKENS);
        memcpy(r->greedy[i], p->data, sizeof r->greedy[i]);
        snprintf(name, sizeof name, "greedy_logprob.%d", i);
        p = rw_st_find(f, name);
        assert_non_null(p);
        memcpy(r->greedy_lp[i], p->data, sizeof r->greedy_lp[i]);
    }
    rw_st_close(f);
}

/* "[1,2,3]" of a prompt. */
static inline const char *dt_prompt_json(const int32_t *p, int n, char *buf, size_t cap) {
    size_t k = (size_t)snprintf(buf, cap, "[");
    for (int i = 0; i < n && k + 16 < cap; i++)
        k += (size_t)snprintf(buf + k, cap - k, "%s%d", i ? "," : "", p[i]);
    snprintf(buf + k, cap - k, "]");
    return buf;
}

/* Asserts that generate result output `o` holds exactly the reference greedy tokens of prompt
 * i (the first `n` of them). */
static inline void dt_assert_greedy(const dt_ref *ref, int i, json_t *o, int n) {
    int32_t got[512];
    int k = dt_ints(json_object_get(o, "tokens"), got, 512);
    assert_int_equal(k, n);
    for (int j = 0; j < n; j++)
        if (got[j] != ref->greedy[i][j])
            fail_msg("prompt %d: token %d is %d, the reference has %d", i, j, got[j],
                     ref->greedy[i][j]);
}

/* Runs the built tool `rel` (e.g. "tools/trainer/rw-trainer") with args (NULL-terminated; at most
 * 38), its output into out[cap] (dt_run); returns its exit status. */
static inline int dt_run_tool(const char *rel, const char *const *args, char *out, size_t cap,
                              double timeout_s) {
    char exe[4096];
    dt_exe(exe, sizeof exe, rel);
    const char *av[40];
    int k = 0;
    av[k++] = exe;
    for (int i = 0; args[i] && k < 39; i++)
        av[k++] = args[i];
    av[k] = NULL;
    return dt_run(av, out, cap, timeout_s);
}

/* rw-trainer push --verify printed `out`: its JSON summary (json_decref it), which must say that
 * the checksums were verified and none mismatched. */
static inline json_t *dt_push_verified(const char *out) {
    json_error_t je;
    json_t *j = json_loads(out, JSON_DISABLE_EOF_CHECK, &je);
    if (!j) fail_msg("rw-trainer output is not JSON: %s", out);
    assert_true(json_is_true(json_object_get(j, "verified")));
    assert_int_equal(dt_int(j, "mismatches", NULL), 0);
    return j;
}

/* A child process (a trainer, typically) that does one thing and reports it with one byte on a
 * pipe, 'y' when it worked. Forks: in the child *report is the pipe's write end (the child's
 * branch must end in _exit or be killed), in the parent its read end. */
static inline pid_t dt_fork_reporter(int *report) {
    int p[2];
    assert_int_equal(pipe(p), 0);
    pid_t pid = fork();
    assert_true(pid >= 0);
    close(pid == 0 ? p[0] : p[1]);
    *report = pid == 0 ? p[1] : p[0];
    return pid;
}

/* The parent's end of dt_fork_reporter: reads the child's byte, kills the child when asked,
 * reaps it, and requires the byte to be 'y'. */
static inline void dt_reporter_done(pid_t pid, int report, bool kill_it) {
    char ch = 0;
    assert_int_equal(read(report, &ch, 1), 1);
    close(report);
    if (kill_it) kill(pid, SIGKILL);
    int status;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_int_equal(ch, 'y');
}

/* The clean end of a worker: `shutdown` answered, the process exits with status 0 within
 * timeout_s, and the client is closed. */
static inline void dt_shutdown(dt_worker *w, rw_client *c, double timeout_s) {
    json_decref(dt_ok(c, "shutdown", NULL));
    assert_int_equal(dt_wait_exit(w, timeout_s), 0);
    rw_client_close(c);
}

/* The fixture checkpoint and a random checkpoint of its config (rw-ckpt random --seed 7) in a
 * temporary directory, both open. */
typedef struct dt_ckpts {
    char fixture[4096], config[4096];
    char tmp[256], random_dir[512];
    rw_ckpt *fix, *rnd;
} dt_ckpts;

/* `tmp_pattern` is a mkdtemp pattern (".../name-XXXXXX"). */
static inline void dt_ckpts_make(dt_ckpts *k, const char *tmp_pattern) {
    rw_test_path(k->fixture, sizeof k->fixture, RW_TEST_FIXTURE);
    snprintf(k->config, sizeof k->config, "%s/config.json", k->fixture);
    snprintf(k->tmp, sizeof k->tmp, "%s", tmp_pattern);
    assert_non_null(mkdtemp(k->tmp));
    snprintf(k->random_dir, sizeof k->random_dir, "%s/random", k->tmp);
    const char *args[] = {"random",      "--config", k->config, "--out",
                          k->random_dir, "--seed",   "7",       NULL};
    char out[4096];
    assert_int_equal(dt_run_tool("tools/ckpt/rw-ckpt", args, out, sizeof out, 120), 0);
    rw_err e;
    RW_ASSERT_OK(rw_ckpt_open(k->fixture, &k->fix, &e), &e);
    RW_ASSERT_OK(rw_ckpt_open(k->random_dir, &k->rnd, &e), &e);
}

static inline void dt_ckpts_free(dt_ckpts *k) {
    rw_ckpt_close(k->fix);
    rw_ckpt_close(k->rnd);
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", k->tmp);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", k->tmp);
}

#endif
