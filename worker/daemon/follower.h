/* follower.h - the loop of a rank other than rank 0 (follower.c). */
#ifndef RW_DAEMON_FOLLOWER_H
#define RW_DAEMON_FOLLOWER_H

#include <signal.h>

#include "options.h"
#include "rw_worker.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The follower loop: connects to `peer` in `zctx`, says hello, receives the NCCL id when the
 * backend is CUDA and tp > 1 (`group` is the in-process group of CPU thread ranks, else NULL),
 * opens its rank, reports ready, then executes ops until QUIT. A process follower (stop
 * non-NULL) also ends when a signal set *stop and rank 0 stayed silent for a grace period.
 * Returns the exit status. */
int rw_follower_main(const rw_dopts *o, int rank, void *zctx, const char *peer,
                     rw_comm_group *group, volatile sig_atomic_t *stop);

#ifdef __cplusplus
}
#endif

#endif
