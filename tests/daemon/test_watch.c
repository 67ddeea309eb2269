/* test_watch.c - the rank watchdog (worker/daemon_watch.c) on its own, in the cpu suite, since the
 * faults it handles only happen on CUDA tensor-parallel workers (ranks as processes, NCCL):
 * - a follower process killed while the serving thread is inside an op: reported as "rank 1
 *   died" with the signal, the communicator aborted after abort_after_s, the last resort called
 *   after last_resort_after_s, and the dead process left for the launcher to reap;
 * - nothing lost: ops that come and go are never aborted;
 * - a dropped op-socket connection: rank 0 reports it (no child to name), a follower reports rank
 *   0 gone;
 * - a stop signal on a follower stuck in an op aborts the communicator; outside an op it does
 *   nothing.
 * The communicator is a stand-in whose abort only counts. */
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zmq.h>

#include "watch.h"
#include "internal.h"
#include "rw_test.h"

static atomic_int n_abort, n_resort;
static char resort_why[256];

static void fake_abort(rw_comm *c) {
    (void)c;
    atomic_fetch_add(&n_abort, 1);
}

static void resort(void *arg, const char *why) {
    (void)arg;
    snprintf(resort_why, sizeof resort_why, "%s", why);
    atomic_fetch_add(&n_resort, 1);
}

static void reset(void) {
    atomic_store(&n_abort, 0);
    atomic_store(&n_resort, 0);
    resort_why[0] = 0;
}

/* Waits up to timeout_s for *v >= want. */
static bool wait_count(atomic_int *v, int want, double timeout_s) {
    const double end = rw_now() + timeout_s;
    while (atomic_load(v) < want && rw_now() < end)
        usleep(10000);
    return atomic_load(v) >= want;
}

static bool wait_lost(rw_watch *w, char *why, size_t cap, double timeout_s) {
    const double end = rw_now() + timeout_s;
    while (!rw_watch_lost(w, why, cap) && rw_now() < end)
        usleep(10000);
    return rw_watch_lost(w, why, cap) != 0;
}

/* A child process that waits to be killed. */
static pid_t sleeper(void) {
    pid_t child = fork();
    assert_true(child >= 0);
    if (child == 0) {
        for (;;)
            pause();
    }
    return child;
}

/* Rank 0's watchdog over one follower process, `child`, on a fake communicator (rw_watch_start
 * copies the pids; the communicator must outlive the watchdog). */
static rw_comm fake_rank0 = {.rank = 0, .size = 2, .abort = fake_abort};
static rw_watch *watch_child(pid_t child, double abort_after_s, double last_resort_after_s) {
    pid_t pids[2] = {0, child};
    rw_watch_opts o = {.rank = 0,
                       .pids = pids,
                       .npids = 2,
                       .comm = &fake_rank0,
                       .abort_after_s = abort_after_s,
                       .last_resort_after_s = last_resort_after_s,
                       .last_resort = resort};
    rw_watch *w = NULL;
    rw_err e;
    RW_ASSERT_OK(rw_watch_start(&o, &w, &e), &e);
    return w;
}

static void test_child_killed_in_op(void **state) {
    (void)state;
    reset();
    pid_t child = sleeper();
    rw_watch *w = watch_child(child, 0.3, 0.5);
    char why[256];
    assert_int_equal(rw_watch_lost(w, why, sizeof why), 0);
    rw_watch_enter(w); /* stuck from here on, as in a collective */
    assert_int_equal(kill(child, SIGKILL), 0);
    assert_true(wait_lost(w, why, sizeof why, 5));
    assert_int_equal(rw_watch_lost(w, NULL, 0), 1);
    printf("lost: %s\n", why);
    assert_non_null(strstr(why, "rank 1 died"));
    assert_non_null(strstr(why, "signal 9"));
    assert_true(wait_count(&n_abort, 1, 5));
    assert_true(rw_watch_aborted(w));
    assert_true(wait_count(&n_resort, 1, 5));
    assert_non_null(strstr(resort_why, "rank 1 died"));
    rw_watch_leave(w);
    usleep(200000);
    assert_int_equal(atomic_load(&n_abort), 1);
    assert_int_equal(atomic_load(&n_resort), 1);
    rw_watch_stop(w);
    /* left for the launcher to reap */
    int status = 0;
    assert_int_equal(waitpid(child, &status, 0), child);
    assert_true(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
}

static void test_nothing_lost(void **state) {
    (void)state;
    reset();
    pid_t child = sleeper();
    rw_watch *w = watch_child(child, 0.1, 0.1);
    /* short ops and one long one: alive peers are never aborted */
    const double end = rw_now() + 0.5;
    while (rw_now() < end) {
        rw_watch_enter(w);
        usleep(2000);
        rw_watch_leave(w);
    }
    rw_watch_enter(w);
    usleep(400000);
    rw_watch_leave(w);
    assert_int_equal(rw_watch_lost(w, NULL, 0), 0);
    assert_int_equal(atomic_load(&n_abort), 0);
    assert_int_equal(atomic_load(&n_resort), 0);
    rw_watch_stop(w);
    rw_watch_stop(NULL);
    rw_watch_enter(NULL);
    rw_watch_leave(NULL);
    assert_int_equal(rw_watch_lost(NULL, NULL, 0), 0);
    kill(child, SIGKILL);
    waitpid(child, NULL, 0);
}

/* A ROUTER (rank 0) and a DEALER (a follower) on loopback TCP in two contexts, connected (one
 * message through); the watchdog monitors `watched`; closing the other side drops the
 * connection. */
static void dropped_connection(bool watch_router) {
    reset();
    void *c0 = zmq_ctx_new(), *c1 = zmq_ctx_new();
    void *router = zmq_socket(c0, ZMQ_ROUTER), *dealer = zmq_socket(c1, ZMQ_DEALER);
    int linger = 0;
    zmq_setsockopt(router, ZMQ_LINGER, &linger, sizeof linger);
    zmq_setsockopt(dealer, ZMQ_LINGER, &linger, sizeof linger);
    rw_op_socket_heartbeats(router);
    rw_op_socket_heartbeats(dealer);
    assert_int_equal(zmq_bind(router, "tcp://127.0.0.1:*"), 0);
    char ep[256];
    size_t len = sizeof ep;
    zmq_getsockopt(router, ZMQ_LAST_ENDPOINT, ep, &len);
    assert_int_equal(zmq_connect(dealer, ep), 0);
    assert_int_equal(zmq_send(dealer, "hi", 2, 0), 2);
    char buf[64];
    assert_true(zmq_recv(router, buf, sizeof buf, 0) > 0); /* routing id */
    assert_int_equal(zmq_recv(router, buf, sizeof buf, 0), 2);

    rw_comm fake = {.rank = 0, .size = 2, .abort = fake_abort};
    rw_watch_opts o = {.rank = watch_router ? 0 : 1,
                       .zctx = watch_router ? c0 : c1,
                       .sock = watch_router ? router : dealer,
                       .comm = &fake,
                       .abort_after_s = 0.2,
                       .last_resort_after_s = 10};
    rw_watch *w = NULL;
    rw_err e;
    RW_ASSERT_OK(rw_watch_start(&o, &w, &e), &e);
    usleep(100000);
    assert_int_equal(rw_watch_lost(w, NULL, 0), 0);
    /* the other side goes away */
    if (watch_router) {
        zmq_close(dealer);
        zmq_ctx_term(c1);
    } else {
        zmq_close(router);
        zmq_ctx_term(c0);
    }
    char why[256];
    assert_true(wait_lost(w, why, sizeof why, 5));
    printf("lost: %s\n", why);
    assert_int_equal(rw_watch_lost(w, NULL, 0), -1);
    assert_non_null(strstr(why, watch_router ? "connection of a rank" : "rank 0 went away"));
    /* not inside an op: nothing to abort */
    usleep(300000);
    assert_int_equal(atomic_load(&n_abort), 0);
    rw_watch_enter(w);
    assert_true(wait_count(&n_abort, 1, 5));
    rw_watch_leave(w);
    rw_watch_stop(w);
    if (watch_router) {
        zmq_close(router);
        zmq_ctx_term(c0);
    } else {
        zmq_close(dealer);
        zmq_ctx_term(c1);
    }
}

static void test_follower_dropped(void **state) {
    (void)state;
    dropped_connection(true);
}

static void test_rank0_dropped(void **state) {
    (void)state;
    dropped_connection(false);
}

static void test_stop_signal(void **state) {
    (void)state;
    reset();
    volatile sig_atomic_t stop = 0;
    rw_comm fake = {.rank = 1, .size = 2, .abort = fake_abort};
    rw_watch_opts o = {.rank = 1, .comm = &fake, .stop = &stop, .abort_after_s = 0.2};
    rw_watch *w = NULL;
    rw_err e;
    RW_ASSERT_OK(rw_watch_start(&o, &w, &e), &e);
    stop = 1;
    usleep(400000);
    assert_int_equal(atomic_load(&n_abort), 0); /* idle: the serving loop sees the stop */
    rw_watch_enter(w);
    assert_true(wait_count(&n_abort, 1, 5));
    rw_watch_leave(w);
    assert_int_equal(rw_watch_lost(w, NULL, 0), 0);
    rw_watch_stop(w);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_child_killed_in_op), cmocka_unit_test(test_nothing_lost),
        cmocka_unit_test(test_follower_dropped),   cmocka_unit_test(test_rank0_dropped),
        cmocka_unit_test(test_stop_signal),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
