/* main.c - the rw-worker executable: dispatches to the --once mode (worker/once.c) or by default
 * the control-socket daemon: options, signal handling, then the ranks (launch.c). (Benchmarks
 * are rw-bench's: tools/bench.) */
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "launch.h"
#include "options.h"
#include "rw_worker.h"

/* The one piece of global state: set by the signal handler, read by the serving loops. */
static volatile sig_atomic_t g_stop;

static void on_signal(int sig) {
    (void)sig;
    g_stop = 1;
}

/* `rw-worker [--model DIR | --config FILE [--random-weights] [--seed S]] [--tp N [--rank R
 * --peer ADDR]] [--control ADDR] [--auth-token T] [--device cpu|cuda] [--gpu G] ...`: parses argv
 * (after the program name), starts the ranks, serves until `shutdown` or SIGTERM / SIGINT.
 * Returns the process exit status (0 clean shutdown, 1 failure, 2 usage). */
static int daemon_main(int argc, char **argv) {
    rw_dopts o;
    int rc = rw_dopts_parse(argc, argv, &o);
    if (rc) return rc < 0 ? 0 : rc; /* --help / --version: printed, exit 0 */
    char exe[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n > 0) {
        exe[n] = 0;
        o.self_exe = exe;
    }
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    /* a client that goes away mid-reply must not kill the worker */
    signal(SIGPIPE, SIG_IGN);
    return rw_launch_main(&o, &g_stop);
}

int main(int argc, char **argv) {
    rw_cuda_load_modules_eagerly(); /* before any CUDA call */
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--once") == 0) return rw_worker_once_main(argc - 1, argv + 1, stdout);
    }
    return daemon_main(argc - 1, argv + 1);
}
