/* main.c - the rw-worker executable: dispatches to the --once mode (once.c), or by default the
 * control-socket daemon (daemon.c). */
#include <stdio.h>
#include <string.h>

#include "daemon.h"
#include "rw_worker.h"

int main(int argc, char **argv) {
    rw_cuda_load_modules_eagerly(); /* before any CUDA call */
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--once") == 0) return rw_worker_once_main(argc - 1, argv + 1, stdout);
    }
    return rw_worker_daemon_main(argc - 1, argv + 1);
}
