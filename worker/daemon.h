/* daemon.h - the entry point of the rw-worker daemon mode (rw-worker without --once / --bench):
 * a ZeroMQ control server on rank 0 that relays every command to the other tensor-parallel ranks.
 * The wire protocol is docs/PROTOCOL.md. */
#ifndef RW_WORKER_DAEMON_H
#define RW_WORKER_DAEMON_H

#ifdef __cplusplus
extern "C" {
#endif

/* `rw-worker [--model DIR | --config FILE [--random-weights] [--seed S]] [--tp N [--rank R
 * --peer ADDR]] [--control ADDR] [--auth-token T] [--device cpu|cuda] [--gpu G] ...`: parses argv
 * (after the program name), starts the ranks, serves until `shutdown` or SIGTERM / SIGINT.
 * Returns the process exit status (0 clean shutdown, 1 failure, 2 usage). */
int rw_worker_daemon_main(int argc, char **argv);

#ifdef __cplusplus
}
#endif

#endif
