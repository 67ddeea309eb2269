/* launch.h - starting the ranks of a worker and serving (launch.c). */
#ifndef RW_DAEMON_LAUNCH_H
#define RW_DAEMON_LAUNCH_H

#include <signal.h>

#include "options.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Starts the other ranks of `o` (threads for the CPU backend, processes of self_exe for CUDA),
 * runs rank 0 in this thread (rendezvous, rank set-up, then the control server until shutdown or
 * *stop), and reaps them; a process started with --rank R >= 1 runs that follower instead.
 * Returns the exit status. */
int rw_launch_main(const rw_dopts *o, volatile sig_atomic_t *stop);

#ifdef __cplusplus
}
#endif

#endif
