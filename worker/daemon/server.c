/* server.c - rank 0's control server: the ZeroMQ ROUTER loop that interleaves socket polling with
 * engine steps, the dispatch of every command of docs/PROTOCOL.md through one table (the
 * commands themselves: cmd_generate.c, cmd_control.c, cmd_sync.c), the token check, replies, the
 * relay of state changes to the other ranks as rank ops, the weight-version stamps, and what
 * happens when a rank is lost. */
#include "server_internal.h"

#include <errno.h>
#include <sys/stat.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zmq.h>

#include "http.h"

#define MAX_DRAIN 64      /* messages handled between two engine steps */
#define POLL_PERIOD_S 0.1 /* session timeouts and rank liveness */

/* ------------------------------------------------------------------------------------------ */
/* Replies                                                                                      */
/* ------------------------------------------------------------------------------------------ */
void rw_srv_send(rw_server *s, const rw_zmq_msg *zm, rw_mw *w, rw_sync_out_frame *of) {
    const void *env;
    size_t len;
    rw_err e;
    if (rw_mw_finish(w, &env, &len, &e) != RW_OK) {
        RW_LOGE("reply not built: %s", e.msg);
        if (of) {
            free(of->data);
            of->data = NULL;
        }
        return;
    }
    if (rw_zmq_reply(s->ctl, zm, env, len, of, &e) != RW_OK)
        RW_LOGW("reply not sent (client gone?): %s", e.msg);
}

void rw_srv_reply_err(rw_server *s, const rw_zmq_msg *zm, uint64_t id, rw_status st,
                      const char *msg) {
    s->n_errors++;
    rw_mw_reset(s->w);
    rw_mw_reply_err(s->w, id, st, msg);
    rw_srv_send(s, zm, s->w, NULL);
}

/* ------------------------------------------------------------------------------------------ */
/* Relay                                                                                        */
/* ------------------------------------------------------------------------------------------ */
/* Sends an op that needs no answer to every follower. A failure here means a follower is
 * unreachable: the ranks can no longer run in step, which is fatal for the worker. */
void rw_srv_relay(rw_server *s, rw_op op, uint64_t a, const void *payload, size_t plen) {
    if (!s->peers->n) return;
    rw_op_hdr h = rw_op_make(op, ++s->seq, a, 0, 0);
    rw_err e;
    if (rw_peers_send(s->peers, -1, &h, payload, plen, NULL, &e) != RW_OK) {
        RW_LOGE("relay of op %d failed: %s; stopping", (int)op, e.msg);
        s->fatal = true;
        s->shutdown = true;
    }
}

/* Sends an op to the followers (all, or one) and gathers their answers into rep[rank].
 * Returns the first failure (transport, or a follower's status with its message). */
rw_status rw_srv_relay_wait(rw_server *s, int only, rw_op op, uint64_t a, const void *payload,
                            size_t plen, const rw_sync_frames *frames, rw_op_msg *rep,
                            rw_err *err) {
    for (int r = 0; r <= s->peers->n; r++)
        memset(&rep[r], 0, sizeof rep[r]);
    if (!s->peers->n || only == 0) return RW_OK;
    rw_op_hdr h = rw_op_make(op, ++s->seq, a, 0, RW_OPF_REPLY);
    RW_CHECK(rw_peers_send(s->peers, only, &h, payload, plen, frames, err));
    return rw_peers_gather(s->peers, only, h.seq, s->o->rank_timeout_s, rep, err);
}

void rw_srv_free_reps(rw_server *s, rw_op_msg *rep) {
    for (int r = 0; r <= s->peers->n; r++)
        rw_op_msg_free(&rep[r]);
}

/* The first failing follower answer of a non-sync op, as an error. */
rw_status rw_srv_reps_status(rw_server *s, rw_op_msg *rep, rw_err *err) {
    for (int r = 1; r <= s->peers->n; r++) {
        if (rep[r].h.magic == 0 || rep[r].h.status == RW_OK) continue;
        size_t len;
        const char *m = rw_op_payload(&rep[r], &len);
        return rw_err_set(err, (rw_status)rep[r].h.status, __FILE__, __LINE__, "rank %d: %.*s", r,
                          (int)len, m ? m : "");
    }
    return RW_OK;
}

/* ------------------------------------------------------------------------------------------ */
/* Versions and weight state                                                                    */
/* ------------------------------------------------------------------------------------------ */
bool rw_srv_push_tag(rw_server *s, const char *tag) {
    if (s->ntags == s->captags) {
        size_t nc = s->captags ? 2 * s->captags : 16;
        void *p = realloc(s->tags, nc * sizeof *s->tags);
        if (!p) return false;
        s->tags = p;
        s->captags = nc;
    }
    snprintf(s->tags[s->ntags++], RW_SYNC_MAX_VERSION + 1, "%s", tag);
    return true;
}

const char *rw_srv_tag_of(const rw_server *s, uint64_t v) {
    return v < s->ntags ? s->tags[v] : "?";
}

const char *rw_srv_peer_desc(const rw_zmq_msg *zm, char *buf, size_t cap) {
    size_t n;
    const void *id = rw_zmq_msg_peer(zm, &n);
    char hex[40], addr[80];
    rw_oplog_hex(id, n, hex, sizeof hex);
    const char *a = rw_zmq_msg_peer_addr(zm);
    snprintf(buf, cap, "peer=%s addr=%s", hex, rw_oplog_quote(a, strlen(a), addr, sizeof addr));
    return buf;
}

bool rw_srv_session_open(const rw_server *s) {
    rw_sync_info i;
    rw_sync_session_info(s->r->sess, &i);
    return i.state == RW_SYNC_UPDATING;
}

const char *rw_srv_worker_state(const rw_server *s) {
    rw_sync_info i;
    rw_sync_session_info(s->r->sess, &i);
    if (s->r->weights_released) return "weights_released";
    if (i.state == RW_SYNC_UPDATING) return "updating";
    if (i.state == RW_SYNC_INCOMPLETE || s->followers_incomplete) return "weights_incomplete";
    if (s->user_paused) return "paused";
    return "serving";
}

rw_status rw_srv_parse_mode(const char *m, const char *what, rw_pause_mode *out, rw_err *err) {
    if (!strcmp(m, "abort"))
        *out = RW_PAUSE_ABORT;
    else if (!strcmp(m, "retract"))
        *out = RW_PAUSE_RETRACT;
    else if (!strcmp(m, "in_place"))
        *out = RW_PAUSE_IN_PLACE;
    else
        RW_FAIL(err, RW_E_INVALID_ARG, "%s: unknown mode '%s' (abort, retract, in_place)", what, m);
    return RW_OK;
}

/* ------------------------------------------------------------------------------------------ */
/* Dispatch                                                                                     */
/* ------------------------------------------------------------------------------------------ */
/* The command table: a handler and its flags for every command of the protocol (names from the
 * one table of rw_msg.h). */
#define CMD_NO_FRAMES 1u /* refused with data frames (the sync handlers check their own) */

typedef struct cmd_entry {
    rw_srv_handler fn;
    unsigned flags;
} cmd_entry;

static const cmd_entry commands[RW_CMD_COUNT] = {
    [RW_CMD_GENERATE] = {rw_srv_generate, CMD_NO_FRAMES},
    [RW_CMD_ABORT] = {rw_srv_abort, CMD_NO_FRAMES},
    [RW_CMD_PAUSE] = {rw_srv_pause, CMD_NO_FRAMES},
    [RW_CMD_RESUME] = {rw_srv_resume, CMD_NO_FRAMES},
    [RW_CMD_FLUSH_CACHE] = {rw_srv_flush, CMD_NO_FRAMES},
    [RW_CMD_INIT_WEIGHTS_UPDATE_GROUP] = {rw_srv_sync, 0},
    [RW_CMD_BEGIN_UPDATE] = {rw_srv_sync, 0},
    [RW_CMD_UPDATE_WEIGHTS] = {rw_srv_sync, 0},
    [RW_CMD_UPDATE_WEIGHTS_FROM_DISK] = {rw_srv_sync, 0},
    [RW_CMD_COMMIT_UPDATE] = {rw_srv_sync, 0},
    [RW_CMD_ABORT_UPDATE] = {rw_srv_sync, 0},
    [RW_CMD_GET_WEIGHT_VERSION] = {rw_srv_sync, 0},
    [RW_CMD_GET_WEIGHTS] = {rw_srv_sync, 0},
    [RW_CMD_CHECKSUM] = {rw_srv_sync, 0},
    [RW_CMD_RELEASE_MEMORY] = {rw_srv_release_memory, CMD_NO_FRAMES},
    [RW_CMD_RESUME_MEMORY] = {rw_srv_resume_memory, CMD_NO_FRAMES},
    [RW_CMD_HEALTH] = {rw_srv_health, CMD_NO_FRAMES},
    [RW_CMD_STATS] = {rw_srv_stats, CMD_NO_FRAMES},
    [RW_CMD_SHUTDOWN] = {rw_srv_shutdown, CMD_NO_FRAMES},
    [RW_CMD_SCORE] = {rw_srv_score, CMD_NO_FRAMES},
};

/* The token check of a worker that requires one: args.auth must carry it; it is then taken out
 * of the args (no handler knows the field). */
static rw_status check_auth(rw_server *s, rw_srv_call *c, rw_err *err) {
    if (!s->o->auth_token) return RW_OK;
    const rw_mobj *a = rw_mobj_get(c->req->args, "auth");
    const char *p = NULL;
    size_t n = 0;
    if (!a || rw_mobj_str(a, "args.auth", &p, &n, NULL) != RW_OK ||
        !rw_secret_equal(s->o->auth_token, p, n)) {
        char who[160], cmd[100];
        rw_oplog_limited(&s->rl_auth, "auth_refused", "cmd=%s %s reason=%s",
                         rw_oplog_quote(c->req->cmd, strlen(c->req->cmd), cmd, sizeof cmd),
                         rw_srv_peer_desc(c->zm, who, sizeof who), a ? "wrong_token" : "no_token");
        RW_FAIL(err, RW_E_AUTH, "authentication failed: args.auth must carry this worker's token");
    }
    static const char *const key[] = {"auth"};
    RW_CHECK(rw_request_take_args(c->msg, c->req, key, 1, NULL, err));
    c->taken |= RW_OPK_AUTH;
    return RW_OK;
}

/* Runs one decoded command through the table. */
static rw_status dispatch(rw_server *s, rw_srv_call *c, rw_err *err) {
    RW_CHECK(check_auth(s, c, err));
    c->cmd = rw_cmd_parse(c->req->cmd);
    const cmd_entry *t = c->cmd != RW_CMD_NONE ? &commands[c->cmd] : NULL;
    if (!t || !t->fn) {
        /* the name is the client's bytes: shown escaped (the reply stays valid UTF-8 and the
         * log line plain text) */
        char list[512], name[4 * RW_MSG_MAX_CMD + 8];
        rw_escape(c->req->cmd, strlen(c->req->cmd), name, sizeof name);
        RW_FAIL(err, RW_E_PROTOCOL, "unknown command '%s' (%s)", name,
                rw_cmd_list(list, sizeof list));
    }
    rw_sync_frames fr;
    rw_zmq_msg_frames(c->zm, &fr);
    if ((t->flags & CMD_NO_FRAMES) && fr.n)
        RW_FAIL(err, RW_E_PROTOCOL, "%s: takes no data frames, got %zu", c->req->cmd, fr.n);
    return t->fn(s, c, err);
}

/* A message refused before it was read as a request (frames, decoder): logged, rate limited. */
static void refused(rw_server *s, const rw_zmq_msg *zm, rw_status st, const char *why) {
    char who[160], q[300];
    rw_oplog_limited(&s->rl_msg, "message_refused", "%s status=%s reason=%s",
                     rw_srv_peer_desc(zm, who, sizeof who), rw_status_str(st),
                     rw_oplog_quote(why, strlen(why), q, sizeof q));
}

/* Handles one received message; takes ownership of zm. */
static void handle(rw_server *s, rw_zmq_msg *zm, rw_status recv_st, const rw_err *recv_err) {
    s->n_commands++;
    rw_client_rec *client = rw_clients_seen(s->clients, zm);
    if (recv_st != RW_OK) {
        refused(s, zm, recv_st, recv_err->msg);
        rw_srv_reply_err(s, zm, 0, recv_st, recv_err->msg);
        rw_zmq_msg_free(zm);
        return;
    }
    rw_err e;
    rw_err_clear(&e);
    rw_request req;
    rw_srv_call c = {.zm = zm, .req = &req, .client = client};
    size_t len;
    const void *env = rw_zmq_msg_envelope(zm, &len);
    rw_status st = rw_msg_decode_request(env, len, &c.msg, &req, &e);
    if (st != RW_OK) {
        refused(s, zm, st, e.msg);
        rw_srv_reply_err(s, zm, req.has_id ? req.id : 0, st, e.msg);
    } else {
        st = dispatch(s, &c, &e);
        if (st != RW_OK && !c.replied)
            rw_srv_reply_err(s, zm, req.id, st, e.msg);
        else if (!c.kept && !c.replied)
            rw_srv_send(s, zm, s->w, NULL);
    }
    rw_msg_free(c.msg);
    if (!c.kept) rw_zmq_msg_free(zm);
}
/* ------------------------------------------------------------------------------------------ */
/* A lost rank                                                                                  */
/* ------------------------------------------------------------------------------------------ */
/* Answers every generate command in flight with an error naming the lost rank, and a pending
 * shutdown command with its result. Touches neither the engine nor the followers, so that the
 * watchdog's last resort can use it while the engine is stuck. */
static void answer_lost(rw_server *s, const char *why) {
    char msg[400];
    snprintf(msg, sizeof msg,
             "generate: %s; the worker cannot generate without every rank and stops (restart "
             "it)",
             why);
    for (int i = 0; i < s->ngens; i++)
        rw_srv_reply_err(s, s->gens[i]->zm, s->gens[i]->req_id, RW_E_ABORTED, msg);
    if (s->shutdown_zm) {
        rw_mw_reset(s->w);
        rw_mw_reply_ok(s->w, s->shutdown_id);
        rw_mw_map(s->w, 1);
        rw_mw_kv_i64(s->w, "aborted", rw_srv_requests_in_flight(s));
        rw_srv_send(s, s->shutdown_zm, s->w, NULL);
        rw_zmq_msg_free(s->shutdown_zm);
        s->shutdown_zm = NULL;
    }
}

/* Once the watchdog reports a lost rank: every request in flight gets an error reply naming it
 * and the worker stops (exit status 1). True from then on. */
static bool check_lost(rw_server *s) {
    if (s->lost_handled) return true;
    char why[256];
    if (!rw_watch_lost(s->peers->watch, why, sizeof why)) return false;
    s->lost_handled = true;
    s->peers->lost = true;
    RW_LOGE("%s: answering %" PRId64 " request(s) in flight with an error and stopping", why,
            rw_srv_requests_in_flight(s));
    answer_lost(s, why);
    while (s->ngens)
        rw_srv_gen_remove(s, s->ngens - 1);
    rw_engine_abort_all(s->r->eng); /* rank 0's own bookkeeping; the others are gone or stuck */
    rw_srv_collect_outputs(s);      /* no command claims them any more: dropped */
    s->fatal = s->shutdown = true;
    return true;
}

/* The watchdog's last resort (daemon_internal.h): rank 0 stays stuck in the engine although the
 * communicator was aborted, and nothing can unwind it. The clients are answered, ZeroMQ's I/O
 * thread is given a moment to put the replies on the wire (the context cannot be terminated
 * while the stuck thread holds its sockets), the follower processes are killed, and the process
 * ends: the one place the daemon exits by itself, as the alternative is a worker that hangs. */
static void last_resort(void *arg, const char *why) {
    rw_server *s = arg;
    fprintf(stderr,
            "rw-worker: %s, and rank 0 stays stuck in a collective after the communicator "
            "abort: answering the requests in flight and exiting\n",
            why);
    answer_lost(s, why);
    usleep(1000000);
    for (int r = 1; r <= s->peers->n; r++)
        if (s->peers->pids[r] > 0) kill(s->peers->pids[r], SIGKILL);
    _exit(1);
}

/* ------------------------------------------------------------------------------------------ */
/* Loop                                                                                         */
/* ------------------------------------------------------------------------------------------ */
static void step(rw_server *s) {
    rw_srv_relay(s, RW_OP_STEP, 0, NULL, 0);
    if (s->fatal) return; /* a follower is unreachable: its collectives would never come */
    rw_err e;
    /* the watchdog ends a step stuck in a collective with a rank that died */
    rw_watch_enter(s->peers->watch);
    rw_status st = rw_engine_step(s->r->eng, &e);
    rw_watch_leave(s->peers->watch);
    if (check_lost(s)) return; /* whatever the step made is not to be trusted */
    if (st != RW_OK) {
        RW_LOGE("engine step failed: %s: %s; aborting the requests in flight", rw_status_str(st),
                e.msg);
        rw_srv_abort_everything(s);
        return;
    }
    rw_srv_collect_outputs(s);
    rw_srv_stream_partials(s);
}

static void periodic(rw_server *s) {
    double now = rw_now();
    if (now - s->t_poll < POLL_PERIOD_S) return;
    s->t_poll = now;
    rw_err e;
    if (rw_srv_session_open(s)) {
        rw_sync_info before;
        rw_sync_session_info(s->r->sess, &before);
        if (rw_sync_session_poll(s->r->sess, &e) != RW_OK) {
            rw_srv_session_ended(s);
            rw_srv_log_abort(s, before.new_version, e.status == RW_E_TIMEOUT ? "timeout" : "failed",
                             NULL, e.msg);
        }
    }
    /* (without a watchdog: it watches the ranks otherwise) */
    for (int r = 1; r <= s->peers->n && !s->peers->watch; r++) {
        if (s->peers->pids[r] <= 0) continue;
        int status;
        if (waitpid(s->peers->pids[r], &status, WNOHANG) == s->peers->pids[r]) {
            s->peers->pids[r] = 0;
            RW_LOGE("rank %d exited; the worker cannot continue without it", r);
            s->fatal = s->shutdown = true;
        }
    }
}

static void announce(rw_server *s) {
    rw_sync_info i;
    rw_sync_session_info(s->r->sess, &i);
    printf(
        "{\"event\": \"ready\", \"control\": \"%s\", \"pid\": %d, \"tp\": %d, \"device\": \"%s\", "
        "\"version\": \"%s\", \"state\": \"%s\"%s%s%s}\n",
        s->endpoint, (int)getpid(), s->r->tp, rw_backend_str(s->o->backend), i.version,
        rw_srv_worker_state(s), s->http ? ", \"http\": \"" : "", s->http ? s->http_url : "",
        s->http ? "\"" : "");
    fflush(stdout);
    if (s->o->ready_file) {
        char tmp[4096];
        snprintf(tmp, sizeof tmp, "%s.tmp", s->o->ready_file);
        FILE *f = fopen(tmp, "w");
        if (f) {
            fprintf(f, "%s\n", s->endpoint);
            fclose(f);
            if (rename(tmp, s->o->ready_file) != 0)
                RW_LOGW("ready file %s: %s", s->o->ready_file, strerror(errno));
        } else {
            RW_LOGW("ready file %s: %s", tmp, strerror(errno));
        }
    }
}

/* The tokenizer: --tokenizer DIR, else the model directory when it has a tokenizer.json. An
 * explicit directory that does not load is fatal; the model's own is only warned about. */
static bool load_tokenizer(rw_server *s) {
    const char *dir = s->o->tokenizer_dir;
    bool given = dir != NULL;
    char path[1100];
    struct stat st;
    if (!dir && s->o->model_dir) {
        snprintf(path, sizeof path, "%s/tokenizer.json", s->o->model_dir);
        if (stat(path, &st) == 0) dir = s->o->model_dir;
    }
    if (!dir) return true;
    rw_err e;
    double t0 = rw_now();
    if (rw_tok_load(dir, &s->tokenizer, &e) != RW_OK) {
        if (given) {
            fprintf(stderr, "rw-worker: --tokenizer %s: %s\n", dir, e.msg);
            return false;
        }
        RW_LOGW("no tokenizer (text is not available): %s", e.msg);
        return true;
    }
    snprintf(s->tokenizer_dir, sizeof s->tokenizer_dir, "%s", dir);
    RW_LOGI("tokenizer from %s (%d ids, %.2f s)", dir, (int)rw_tok_id_end(s->tokenizer),
            rw_now() - t0);
    return true;
}

/* The model name OpenAI clients see: --served-model-name, else the model's directory name. */
static void model_name(const rw_dopts *o, char *dst, size_t cap) {
    const char *p = o->served_model_name;
    char buf[1024];
    if (!p) {
        snprintf(buf, sizeof buf, "%s", o->model_dir ? o->model_dir : o->config_path);
        size_t n = strlen(buf);
        while (n > 1 && buf[n - 1] == '/')
            buf[--n] = 0;
        if (!o->model_dir) { /* a config file: its directory */
            char *sl = strrchr(buf, '/');
            if (sl) *sl = 0; else snprintf(buf, sizeof buf, ".");
        }
        const char *sl = strrchr(buf, '/');
        p = sl ? sl + 1 : buf;
    }
    snprintf(dst, cap, "%s", p);
}

/* Binds the in-process endpoint on the control socket and starts the HTTP server. */
static bool start_http(rw_server *s, void *zctx) {
    snprintf(s->inproc, sizeof s->inproc, "inproc://rw-http-%p", (void *)s);
    if (zmq_bind(s->ctl, s->inproc) != 0) {
        fprintf(stderr, "rw-worker: cannot bind %s: %s\n", s->inproc, zmq_strerror(errno));
        return false;
    }
    char name[256];
    model_name(s->o, name, sizeof name);
    rw_engine_stats es;
    rw_engine_stats_get(s->r->eng, &es);
    rw_http_opts ho = {.addr = s->o->http,
                       .zctx = zctx,
                       .inproc = s->inproc,
                       .token = s->o->auth_token,
                       .tok = s->tokenizer,
                       .model_name = name,
                       .model_path = s->o->model_dir ? s->o->model_dir : s->o->config_path,
                       .tokenizer_path = s->tokenizer ? s->tokenizer_dir : NULL,
                       .max_seq_len = s->r->cfg.max_position,
                       .vocab_size = s->r->cfg.vocab_size,
                       .timeout_s = s->o->http_timeout_s};
    /* the KV cache bounds a request too */
    const int64_t kv_tokens = es.kv_blocks_total * es.kv_block_size;
    if (kv_tokens > 0 && kv_tokens < ho.max_seq_len) ho.max_seq_len = kv_tokens;
    if (s->tokenizer) {
        const int32_t cand[2] = {rw_tok_eos_id(s->tokenizer), rw_tok_pad_id(s->tokenizer)};
        /* Qwen3's generation config ends on <|im_end|> and <|endoftext|> */
        for (int i = 0; i < 2; i++)
            if (cand[i] >= 0 && (i == 0 || cand[i] != cand[0])) ho.eos[ho.n_eos++] = cand[i];
    }
    rw_err e;
    if (rw_http_start(&ho, &s->http, s->http_url, sizeof s->http_url, &e) != RW_OK) {
        fprintf(stderr, "rw-worker: --http %s: %s\n", s->o->http, e.msg);
        return false;
    }
    RW_LOGI("HTTP on %s (model name '%s'%s)", s->http_url, name,
            s->tokenizer ? "" : "; no tokenizer: ids only");
    return true;
}

int rw_server_run(const rw_dopts *o, rw_rank *r0, void *zctx, rw_peers *peers,
                  volatile sig_atomic_t *stop) {
    rw_server sv;
    rw_server *s = &sv;
    memset(s, 0, sizeof *s);
    s->o = o;
    s->r = r0;
    s->peers = peers;
    s->next_eid = 1;
    s->t_start = rw_now();
    rw_srv_metrics_init(&s->metrics);
    int rc = 1;
    rw_err e;
    if (rw_mw_create(&s->w, &e) != RW_OK || rw_mw_create(&s->w2, &e) != RW_OK ||
        !rw_srv_push_tag(s, r0->version0)) {
        fprintf(stderr, "rw-worker: out of memory\n");
        goto out;
    }
    s->ctl = zmq_socket(zctx, ZMQ_ROUTER);
    if (!s->ctl) {
        fprintf(stderr, "rw-worker: zmq_socket: %s\n", zmq_strerror(errno));
        goto out;
    }
    /* replies (streamed partials included) queue for a client that reads slowly rather than
     * being dropped at ZeroMQ's default of 1000 messages */
    int linger = 1000, hwm = 100000;
    zmq_setsockopt(s->ctl, ZMQ_LINGER, &linger, sizeof linger);
    zmq_setsockopt(s->ctl, ZMQ_SNDHWM, &hwm, sizeof hwm);
    /* before any connection exists: a frame longer than this drops its sender's connection as
     * soon as its length is read, before its bytes are stored (no authentication happens before
     * a message is whole) */
    int64_t maxmsg = (int64_t)o->max_frame_bytes;
    if (zmq_setsockopt(s->ctl, ZMQ_MAXMSGSIZE, &maxmsg, sizeof maxmsg) != 0) {
        fprintf(stderr, "rw-worker: ZMQ_MAXMSGSIZE: %s\n", zmq_strerror(errno));
        goto out;
    }
    /* every client connection is watched: a client that leaves has its requests aborted */
    if (rw_clients_create(zctx, s->ctl, rw_srv_client_gone, s, &s->clients, &e) != RW_OK) {
        fprintf(stderr, "rw-worker: %s\n", e.msg);
        goto out;
    }
    if (zmq_bind(s->ctl, o->control) != 0) {
        fprintf(stderr, "rw-worker: cannot bind the control socket to %s: %s\n", o->control,
                zmq_strerror(errno));
        goto out;
    }
    size_t elen = sizeof s->endpoint;
    zmq_getsockopt(s->ctl, ZMQ_LAST_ENDPOINT, s->endpoint, &elen);
    RW_LOGI("serving on %s (tp %d, %s, %s precision)", s->endpoint, r0->tp,
            rw_backend_str(o->backend), rw_precision_str(o->precision));
    if (!load_tokenizer(s)) goto out;
    if (o->http && !start_http(s, zctx)) goto out;
    if (peers->n) {
        /* processes are watched (exits, dropped connections); thread ranks cannot die alone */
        const bool procs = peers->nthreads == 0;
        rw_watch_opts wo = {.rank = 0,
                            .zctx = zctx,
                            .sock = procs ? peers->sock : NULL,
                            .pids = peers->pids,
                            .npids = peers->n + 1,
                            .comm = r0->comm,
                            .last_resort = last_resort,
                            .arg = s};
        if (rw_watch_start(&wo, &peers->watch, &e) != RW_OK)
            RW_LOGW("no rank watchdog (%s): a rank that dies inside a step can hang rank 0", e.msg);
    }
    announce(s);

    while (!s->shutdown) {
        if (*stop) {
            RW_LOGI("stopping on a signal");
            s->shutdown = true;
            break;
        }
        if (check_lost(s)) break;
        const bool busy = !rw_engine_idle(s->r->eng);
        for (int k = 0; k < MAX_DRAIN && !s->shutdown; k++) {
            rw_zmq_msg *zm = NULL;
            rw_status st = rw_zmq_recv(s->ctl, k == 0 && !busy ? 100 : 0, &zm, &e);
            if (!zm) {
                if (st != RW_E_TIMEOUT && st != RW_OK) RW_LOGW("control socket: %s", e.msg);
                break;
            }
            handle(s, zm, st, &e);
        }
        if (s->shutdown) break;
        rw_clients_poll(s->clients); /* connections that closed: their requests are aborted */
        if (!rw_engine_idle(s->r->eng)) step(s);
        periodic(s);
    }
    if (s->fatal && peers->watch && !s->lost_handled) {
        /* a relay to a follower failed: give the watchdog the moment it needs to say which rank
         * was lost, so the requests in flight learn why */
        const double end = rw_now() + 2.0;
        while (!check_lost(s) && rw_now() < end)
            usleep(20000);
    }
    rw_watch_stop(peers->watch);
    peers->watch = NULL;
    /* a follower may be gone: its communicator is aborted rather than destroyed */
    if (s->fatal) peers->lost = true;
    /* every request in flight gets its partial output, then the shutdown command its answer */
    const int64_t inflight = rw_srv_requests_in_flight(s);
    rw_srv_abort_everything(s);
    if (s->shutdown_zm) {
        rw_mw_reset(s->w);
        rw_mw_reply_ok(s->w, s->shutdown_id);
        rw_mw_map(s->w, 1);
        rw_mw_kv_i64(s->w, "aborted", inflight);
        rw_srv_send(s, s->shutdown_zm, s->w, NULL);
        rw_zmq_msg_free(s->shutdown_zm);
    }
    /* the HTTP threads read the replies just sent, then stop */
    rw_http_stop(s->http);
    s->http = NULL;
    rc = s->fatal ? 1 : 0;
    RW_LOGI("shut down (%" PRId64 " request(s) aborted)", inflight);
out:
    rw_http_stop(s->http);
    rw_tok_destroy(s->tokenizer);
    rw_watch_stop(peers->watch);
    peers->watch = NULL;
    for (int i = 0; i < s->ngens; i++)
        rw_srv_gen_free(s->gens[i]);
    free(s->gens);
    free(s->tags);
    free(s->tmp);
    free(s->tok);
    free(s->peek_tok);
    free(s->peek_lp);
    rw_mw_destroy(s->w);
    rw_mw_destroy(s->w2);
    rw_clients_destroy(s->clients);
    if (s->ctl) zmq_close(s->ctl);
    return rc;
}
