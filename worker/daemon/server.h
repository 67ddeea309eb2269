/* server.h - rank 0's control server (server.c and the cmd_*.c files it dispatches to). */
#ifndef RW_DAEMON_SERVER_H
#define RW_DAEMON_SERVER_H

#include <signal.h>

#include "ops.h"
#include "options.h"
#include "rank.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Serves the control socket of rank r0 until shutdown, relaying every state change to the
 * followers in `peers`. `stop` is set by the signal handler. Returns the exit status. */
int rw_server_run(const rw_dopts *o, rw_rank *r0, void *zctx, rw_peers *peers,
                  volatile sig_atomic_t *stop);

#ifdef __cplusplus
}
#endif

#endif
