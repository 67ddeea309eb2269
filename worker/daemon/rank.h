/* rank.h - one rank of the worker (rank.c): its model, engine and update session, and the
 * actions every rank runs the same way, on rank 0 for itself and on a follower for an op. */
#ifndef RW_DAEMON_RANK_H
#define RW_DAEMON_RANK_H

#include "options.h"
#include "rw_sync.h"
#include "rw_worker.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct rw_rank {
    int rank, tp;
    rw_config cfg;
    rw_comm *comm; /* owned */
    rw_model *model;
    rw_engine *eng;
    rw_sync_session *sess;
    char version0[RW_SYNC_MAX_VERSION + 1]; /* tag of the weights loaded at start */
    bool weights_released;                  /* the weight arena's memory is given back */
    bool kv_released;
    rw_mw *w;             /* reply writer (sync commands) */
    uint64_t frame_limit; /* the control socket's largest frame (begin_update reports it) */
} rw_rank;

/* Loads the config, creates the model on `comm` (ownership passes to the rank, also on
 * failure), loads the weights (checkpoint, random, or none: incomplete until pushed), creates
 * the engine and the update session. */
rw_status rw_rank_open(const rw_dopts *o, int rank, rw_comm *comm, rw_rank **out, rw_err *err);
void rw_rank_close(rw_rank *r);

/* Memory flags of rw_rank_memory (and of the rank op that relays it). */
#define RW_MEM_RELEASE_WEIGHTS 1u
#define RW_MEM_RELEASE_KV 2u
#define RW_MEM_RESUME_WEIGHTS 4u
#define RW_MEM_RESUME_KV 8u
rw_status rw_rank_memory(rw_rank *r, unsigned flags, rw_err *err);
/* Replaces the update session by a fresh one whose weights are incomplete (after the weight
 * memory was given back and re-taken: the bytes are gone, a full update or reload must follow).
 * The NCCL update group of the old session is destroyed with it. */
rw_status rw_rank_reset_session(rw_rank *r, const char *version, rw_err *err);
/* Runs one sync command (rw_sync_handle) on this rank: the reply goes to r->w, what it did to
 * *out (free with rw_sync_outcome_free). */
rw_status rw_rank_sync(rw_rank *r, const rw_request *req, const rw_sync_frames *in,
                       rw_sync_outcome *out, rw_err *err);
/* After an update session ended on some rank: aborts this rank's session if it is still open and
 * reports its weight state. */
rw_status rw_rank_settle(rw_rank *r, rw_sync_wstate *state, rw_err *err);

#ifdef __cplusplus
}
#endif

#endif
