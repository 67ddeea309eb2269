/* server_internal.h - what rank 0's control server shares between its files: the server state,
 * the generate commands in flight, and the helpers every command uses (replies, relays to the
 * followers, version stamps, the worker's state). server.c owns the loop and the dispatch table;
 * cmd_generate.c, cmd_control.c and cmd_sync.c the commands. Not part of any contract.
 *
 * Ordering rule: rank 0 applies a change to its own engine and sends the same op to the
 * followers before it does anything else with the engine, so every rank sees one op sequence.
 * Engine calls that can fail on input (adding requests) run on rank 0 first and are relayed only
 * when they succeeded; commands whose outcome can differ per rank (the update commands, memory)
 * are relayed first and their answers gathered. */
#ifndef RW_DAEMON_SERVER_INTERNAL_H
#define RW_DAEMON_SERVER_INTERNAL_H

#include <math.h>

#include "clients.h"
#include "metrics.h"
#include "oplog.h"
#include "rw_tokenizer.h"
#include "server.h"

struct rw_http; /* http.h: the HTTP server of rank 0 */

/* One generate command in flight: its requests are engine ids base .. base + n - 1. */
typedef struct rw_gen {
    rw_zmq_msg *zm;  /* the request, kept for routing the reply */
    uint64_t req_id; /* the client's request id */
    char peer[256];  /* the client's routing id (abort matches on it) */
    size_t peer_len;
    uint64_t base;
    int n;
    int per_prompt;   /* samples per prompt (args.n) */
    rw_output **outs; /* [n] finished outputs */
    int done;
    bool stream, logprobs;
    int *sent; /* [n] tokens already streamed */
    double t_recv;
    bool score;           /* a score command (cmd_rollout.c answers it) */
    bool routes, weights; /* return_routed_experts / return_routing_weights */
    bool return_text; /* outputs carry `text` (decoded with the worker's tokenizer) */
    bool skip_special;
    uint64_t tokens; /* prompt + max_new_tokens of its requests: charged to its client */
} rw_gen;

typedef struct rw_server {
    const rw_dopts *o;
    rw_rank *r;
    rw_peers *peers;
    void *ctl;
    char endpoint[256];
    uint64_t seq;
    rw_gen **gens; /* sorted by base */
    int ngens, capgens;
    uint64_t next_eid;
    char (*tags)[RW_SYNC_MAX_VERSION + 1]; /* engine version index -> version tag */
    size_t ntags, captags;
    bool user_paused;
    bool update_paused;        /* paused by an open update session */
    bool followers_incomplete; /* some follower's weights are incomplete */
    bool shutdown;
    bool fatal;
    bool lost_handled;       /* a lost rank was reported to the requests in flight */
    rw_zmq_msg *shutdown_zm; /* the shutdown command, answered last */
    uint64_t shutdown_id;
    double t_start, t_poll;
    uint64_t n_commands, n_errors, n_requests, n_finished;
    rw_mw *w;  /* replies */
    rw_mw *w2; /* ADD payloads */
    int64_t *tmp;
    int32_t *tok;
    size_t tmpcap;
    int32_t *peek_tok;
    float *peek_lp;
    size_t peekcap;
    rw_srv_metrics metrics; /* latency histograms (stats, GET /metrics) */
    rw_tok *tokenizer;      /* --tokenizer (or the model's); NULL: no text */
    char tokenizer_dir[1024];
    struct rw_http *http; /* --http; NULL when not served */
    char inproc[64];      /* the ROUTER's in-process endpoint the HTTP server talks to */
    char http_url[128];   /* "http://HOST:PORT" as bound */
    rw_clients *clients;   /* the control socket's clients (NULL: not watched) */
    rw_oplog_rate rl_auth; /* rate limits of the operator log's peer-triggered events */
    rw_oplog_rate rl_msg;
    rw_oplog_rate rl_busy;
} rw_server;

/* One received command on its way through the dispatch table. */
typedef struct rw_srv_call {
    rw_cmd cmd;
    rw_zmq_msg *zm;  /* the received message: routing id, envelope, data frames */
    rw_msg *msg;     /* the decoded envelope (owns req's memory) */
    rw_request *req; /* its args without the fields the server took (auth) */
    uint64_t taken;  /* RW_OPK_* fields taken out of req->args so far */
    bool kept;       /* the handler keeps zm (it answers later) */
    bool replied;    /* the handler sent its reply itself */
    rw_client_rec *client; /* its sender (NULL when not tracked) */
} rw_srv_call;

/* A command handler: RW_OK with its reply in s->w (unless it kept the message or replied
 * itself), or a failure the server answers with an error reply. */
typedef rw_status (*rw_srv_handler)(rw_server *s, rw_srv_call *c, rw_err *err);

/* --- server.c: replies, relays, versions ------------------------------------------------------ */
/* Sends the message in `w` (and `of`, whose ownership passes on) to the client of `zm`. */
void rw_srv_send(rw_server *s, const rw_zmq_msg *zm, rw_mw *w, rw_sync_out_frame *of);
void rw_srv_reply_err(rw_server *s, const rw_zmq_msg *zm, uint64_t id, rw_status st,
                      const char *msg);
/* Sends an op that needs no answer to every follower. A failure means a follower is
 * unreachable: the ranks can no longer run in step, which is fatal for the worker. */
void rw_srv_relay(rw_server *s, rw_op op, uint64_t a, const void *payload, size_t plen);
/* Sends an op to the followers (all: only < 0, or one) and gathers their answers into
 * rep[rank]; free them with rw_srv_free_reps. Returns the first transport failure. */
rw_status rw_srv_relay_wait(rw_server *s, int only, rw_op op, uint64_t a, const void *payload,
                            size_t plen, const rw_sync_frames *frames, rw_op_msg *rep, rw_err *err);
void rw_srv_free_reps(rw_server *s, rw_op_msg *rep);
/* The first failing follower answer of a relayed op, as an error. */
rw_status rw_srv_reps_status(rw_server *s, rw_op_msg *rep, rw_err *err);
/* Appends a version tag; its index is what the engine stamps outputs with. */
bool rw_srv_push_tag(rw_server *s, const char *tag);
const char *rw_srv_tag_of(const rw_server *s, uint64_t v);
/* "peer=<routing id hex> addr=<ip>" of a message's sender, for operator log lines. */
const char *rw_srv_peer_desc(const rw_zmq_msg *zm, char *buf, size_t cap);
/* "serving", "paused", "updating", "weights_incomplete" or "weights_released". */
const char *rw_srv_worker_state(const rw_server *s);
/* True while an update session is open on rank 0. */
bool rw_srv_session_open(const rw_server *s);
rw_status rw_srv_parse_mode(const char *m, const char *what, rw_pause_mode *out, rw_err *err);

/* --- cmd_generate.c ------------------------------------------------------------------------- */
rw_status rw_srv_generate(rw_server *s, rw_srv_call *c, rw_err *err);
rw_status rw_srv_abort(rw_server *s, rw_srv_call *c, rw_err *err);
/* Takes every finished output of rank 0's engine; answers the commands that are complete. */
void rw_srv_collect_outputs(rw_server *s);
/* Streams the tokens made since the last partial reply of every streaming command. */
void rw_srv_stream_partials(rw_server *s);
/* Aborts every request on every rank; their commands get their partial outputs. */
void rw_srv_abort_everything(rw_server *s);
int64_t rw_srv_requests_in_flight(const rw_server *s);
void rw_srv_gen_remove(rw_server *s, int pos);
void rw_srv_gen_free(rw_gen *g);
/* Reads the token ids of `p` (an array, 1..INT32_MAX ids in [0, V)) into s->tok; *n gets the
 * count. Errors name `what`. */
rw_status rw_srv_read_tokens(rw_server *s, const rw_mobj *p, const char *what, int *n, rw_err *err);
/* A command of n requests (per_prompt each) for the client of c, with its bookkeeping arrays;
 * NULL when out of memory. */
rw_gen *rw_srv_gen_new(rw_server *s, const rw_srv_call *c, int n, int per_prompt);
/* Registers a command whose requests every rank has (it is answered when they finish); on
 * failure takes them back everywhere and frees g. */
rw_status rw_srv_gen_register(rw_server *s, rw_srv_call *c, rw_gen *g, rw_err *err);
/* Sends the add of request(s) eid .. (rw_engine_add_ex) to every follower. */
void rw_srv_relay_add(rw_server *s, uint64_t eid, const int32_t *tokens, int n,
                      const rw_sampling *sp, const rw_request_opts *ro);

/* A logprob on the wire: a float, or nil for -inf (processed logprobs of ids outside the kept
 * set) and NaN, which JSON cannot carry. */
static inline void rw_srv_lp(rw_mw *w, float lp) {
    if (isfinite(lp))
        rw_mw_f64(w, lp);
    else
        rw_mw_nil(w);
}
/* Upper bounds of what one token's logprob fields add to a reply, as rw_srv_put_logprobs writes
 * them: its logprob (float64: 9 bytes, 1 element) when `logprob`, and top_n [id, logprob] pairs
 * (15 bytes, 3 elements each) in an array of at most 3 header bytes. The reply bounds of
 * generate (gen_reply.c) and score (cmd_rollout.c) both count with it. */
static inline void rw_srv_logprob_bound(bool logprob, uint64_t top_n, uint64_t *bytes,
                                        uint64_t *elems) {
    *bytes = (logprob ? 9 : 0) + (top_n ? 3 + 15 * top_n : 0);
    *elems = (logprob ? 1 : 0) + (top_n ? 1 + 3 * top_n : 0);
}
/* Writes an output's "logprobs" (unless top_only) and, when it has them, "top_logprobs"
 * ([[id, logprob], ...] per token) as key / value pairs of the map being written. */
void rw_srv_put_logprobs(rw_mw *w, const rw_output *o, bool top_only);
/* The distribution fields generate and score share: temperature, top_p, top_k, top_logprobs. */
rw_status rw_srv_read_dist(rw_mfields *f, rw_sampling *sp, rw_err *err);

/* --- cmd_rollout.c: what RL trainers need beyond generation -------------------------------- */
/* The score command: given continuations' logprobs, one prefill each, no sampling. */
rw_status rw_srv_score(rw_server *s, rw_srv_call *c, rw_err *err);
/* The final reply of a score command. */
void rw_srv_score_reply(rw_server *s, rw_gen *g);
/* The fields generate and score share: logprob_mode (into sp), return_routed_experts and
 * return_routing_weights (into ro, and g's flags when g is not NULL). */
rw_status rw_srv_rollout_args(rw_mfields *f, rw_sampling *sp, rw_request_opts *ro, rw_err *err);
/* The data frame of a reply with routes: the expert ids of outputs k0 .. k1 - 1 ([tokens, layers,
 * k] uint8 when num_experts <= 256, else uint16), each followed by its weights (fp32) when asked,
 * each at an offset from the frame's start aligned to 8 (offs[2k] ids, offs[2k + 1] weights of
 * output k; offs has 2n entries). of->data is NULL when the command asked for no routes or the
 * range is empty. */
rw_status rw_srv_routes_frame(const rw_server *s, const rw_gen *g, int k0, int k1, size_t *offs,
                              rw_sync_out_frame *of, rw_err *err);
/* The number of routes fields an output has (0..2), and writes them for output k. */
int rw_srv_routes_nfields(const rw_gen *g);
void rw_srv_routes_fields(rw_mw *w, const rw_server *s, const rw_gen *g, int k, const size_t *offs);
/* The per-client limits (--max-client-requests, --max-client-tokens) for a command of `requests`
 * requests and `tokens` tokens (prompt + max_new_tokens) from the client of c: RW_E_BUSY past
 * them; a client that left gets no work. rw_srv_gen_register charges g->n and g->tokens. */
rw_status rw_srv_client_room(rw_server *s, const rw_srv_call *c, uint64_t requests,
                             uint64_t tokens, rw_err *err);
/* Aborts every generate command of a client whose connection closed (their KV is freed; the
 * final replies go nowhere). */
void rw_srv_client_gone(void *server, rw_client_rec *rec);

/* --- gen_reply.c ---------------------------------------------------------------------------- */
/* Sends the final reply of a finished generate command: one message, or parts of at most
 * --max-reply-bytes (docs/PROTOCOL.md 4.1). */
void rw_srv_gen_final(rw_server *s, rw_gen *g);

/* --- cmd_control.c -------------------------------------------------------------------------- */
rw_status rw_srv_pause(rw_server *s, rw_srv_call *c, rw_err *err);
rw_status rw_srv_resume(rw_server *s, rw_srv_call *c, rw_err *err);
rw_status rw_srv_flush(rw_server *s, rw_srv_call *c, rw_err *err);
rw_status rw_srv_release_memory(rw_server *s, rw_srv_call *c, rw_err *err);
rw_status rw_srv_resume_memory(rw_server *s, rw_srv_call *c, rw_err *err);
rw_status rw_srv_health(rw_server *s, rw_srv_call *c, rw_err *err);
rw_status rw_srv_stats(rw_server *s, rw_srv_call *c, rw_err *err);
rw_status rw_srv_shutdown(rw_server *s, rw_srv_call *c, rw_err *err);

/* --- cmd_sync.c ----------------------------------------------------------------------------- */
/* Every sync command (RW_CMDF_SYNC): run on the ranks it concerns, answered, and its
 * consequences for generation applied. Replies itself. */
rw_status rw_srv_sync(rw_server *s, rw_srv_call *c, rw_err *err);
/* After a session ended without a commit everywhere: settle the ranks, drop what can no longer
 * run, lift the update's pause. */
void rw_srv_session_ended(rw_server *s);
/* The operator log's update_abort line for a session (to `version`) that ended without a commit:
 * reason "client", "forced", "failed" or "timeout"; zm (may be NULL) the client whose command
 * ended it, why (may be NULL) the error. */
void rw_srv_log_abort(rw_server *s, const char *version, const char *reason, const rw_zmq_msg *zm,
                      const char *why);
/* Asks every follower for its weight state (after a session ended) and records whether any is
 * incomplete; followers with a session still open abort it. */
void rw_srv_settle_followers(rw_server *s);

#endif
