/* server.c - rank 0's control server: the ZeroMQ ROUTER loop that interleaves socket polling with
 * engine steps, every control command of docs/PROTOCOL.md (generate with batching, many commands
 * in flight and streaming; abort; pause / resume; flush_cache; the update commands through the
 * sync module's session with generation paused while a session is open; readback and checksums;
 * release / resume memory; health; stats; shutdown), the relay of every state change to the other
 * ranks as rank ops, and the weight-version stamps of every output.
 *
 * Ordering rule: rank 0 applies a change to its own engine and sends the same op to the
 * followers before it does anything else with the engine, so every rank sees one op sequence.
 * Engine calls that can fail on input (adding requests) run on rank 0 first and are relayed only
 * when they succeeded; commands whose outcome can differ per rank (the update commands, memory)
 * are relayed first and their answers gathered. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zmq.h>

#include "daemon_internal.h"

#define MAX_PROMPTS_PER_CMD 65536 /* requests (prompts x n) in one generate command */
#define MAX_DRAIN 64              /* messages handled between two engine steps */
#define POLL_PERIOD_S 0.1         /* session timeouts and rank liveness */

/* One generate command in flight: its requests are engine ids base .. base + n - 1. */
typedef struct gen {
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
} gen;

typedef struct server {
    const rw_dopts *o;
    rw_rank *r;
    rw_peers *peers;
    void *ctl;
    char endpoint[256];
    uint64_t seq;
    gen **gens; /* sorted by base */
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
    rw_mw *w2; /* rewritten requests, ADD payloads */
    int64_t *tmp;
    int32_t *tok;
    size_t tmpcap;
    int32_t *peek_tok;
    float *peek_lp;
    size_t peekcap;
} server;

/* ------------------------------------------------------------------------------------------ */
/* Replies                                                                                      */
/* ------------------------------------------------------------------------------------------ */
static void send_writer(server *s, const rw_zmq_msg *zm, rw_mw *w, rw_sync_out_frame *of) {
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

static void reply_err(server *s, const rw_zmq_msg *zm, uint64_t id, rw_status st, const char *msg) {
    s->n_errors++;
    rw_mw_reset(s->w);
    rw_mw_reply_err(s->w, id, st, msg);
    send_writer(s, zm, s->w, NULL);
}

static void kv_str(rw_mw *w, const char *k, const char *v) {
    rw_mw_str(w, k);
    rw_mw_str(w, v);
}
static void kv_u64(rw_mw *w, const char *k, uint64_t v) {
    rw_mw_str(w, k);
    rw_mw_u64(w, v);
}
static void kv_i64(rw_mw *w, const char *k, int64_t v) {
    rw_mw_str(w, k);
    rw_mw_i64(w, v);
}
static void kv_f64(rw_mw *w, const char *k, double v) {
    rw_mw_str(w, k);
    rw_mw_f64(w, v);
}
static void kv_bool(rw_mw *w, const char *k, bool v) {
    rw_mw_str(w, k);
    rw_mw_bool(w, v);
}

/* ------------------------------------------------------------------------------------------ */
/* Relay                                                                                        */
/* ------------------------------------------------------------------------------------------ */
/* Sends an op that needs no answer to every follower. A failure here means a follower is
 * unreachable: the ranks can no longer run in step, which is fatal for the worker. */
static void relay(server *s, rw_op op, uint64_t a, const void *payload, size_t plen) {
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
static rw_status relay_wait(server *s, int only, rw_op op, uint64_t a, const void *payload,
                            size_t plen, const rw_sync_frames *frames, rw_op_msg *rep,
                            rw_err *err) {
    for (int r = 0; r <= s->peers->n; r++)
        memset(&rep[r], 0, sizeof rep[r]);
    if (!s->peers->n || only == 0) return RW_OK;
    rw_op_hdr h = rw_op_make(op, ++s->seq, a, 0, RW_OPF_REPLY);
    RW_CHECK(rw_peers_send(s->peers, only, &h, payload, plen, frames, err));
    return rw_peers_gather(s->peers, only, h.seq, s->o->rank_timeout_s, rep, err);
}

static void free_reps(server *s, rw_op_msg *rep) {
    for (int r = 0; r <= s->peers->n; r++)
        rw_op_msg_free(&rep[r]);
}

/* The first failing follower answer of a non-sync op, as an error. */
static rw_status reps_status(server *s, rw_op_msg *rep, rw_err *err) {
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
/* Versions                                                                                     */
/* ------------------------------------------------------------------------------------------ */
static bool push_tag(server *s, const char *tag) {
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

static const char *tag_of(const server *s, uint64_t v) {
    return v < s->ntags ? s->tags[v] : "?";
}

/* ------------------------------------------------------------------------------------------ */
/* Generate bookkeeping                                                                         */
/* ------------------------------------------------------------------------------------------ */
static gen *gen_find(server *s, uint64_t eid, int *pos) {
    int lo = 0, hi = s->ngens - 1, at = -1;
    while (lo <= hi) {
        int mid = (lo + hi) / 2;
        if (s->gens[mid]->base <= eid) {
            at = mid;
            lo = mid + 1;
        } else {
            hi = mid - 1;
        }
    }
    if (at < 0 || eid >= s->gens[at]->base + (uint64_t)s->gens[at]->n) return NULL;
    if (pos) *pos = at;
    return s->gens[at];
}

static void gen_free(gen *g) {
    if (!g) return;
    if (g->outs)
        for (int i = 0; i < g->n; i++)
            rw_output_free(g->outs[i]);
    free(g->outs);
    free(g->sent);
    rw_zmq_msg_free(g->zm);
    free(g);
}

static int64_t requests_in_flight(const server *s) {
    int64_t n = 0;
    for (int i = 0; i < s->ngens; i++)
        n += s->gens[i]->n - s->gens[i]->done;
    return n;
}

/* The final reply of a generate command. */
static void gen_reply(server *s, gen *g) {
    rw_mw *w = s->w;
    rw_mw_reset(w);
    rw_mw_reply_ok(w, g->req_id);
    rw_mw_map(w, 2);
    kv_bool(w, "stream", false);
    rw_mw_str(w, "outputs");
    rw_mw_array(w, (uint32_t)g->n);
    for (int k = 0; k < g->n; k++) {
        const rw_output *o = g->outs[k];
        const bool top = o->top_n > 0;
        rw_mw_map(w, 10 + (g->logprobs ? 1 : 0) + (top ? 1 : 0));
        kv_u64(w, "index", (uint64_t)k);
        kv_u64(w, "prompt_index", (uint64_t)(k / g->per_prompt));
        kv_u64(w, "sample", (uint64_t)(k % g->per_prompt));
        rw_mw_str(w, "tokens");
        rw_mw_array(w, (uint32_t)o->n);
        for (int i = 0; i < o->n; i++)
            rw_mw_i64(w, o->tokens[i]);
        if (g->logprobs) {
            rw_mw_str(w, "logprobs");
            rw_mw_array(w, (uint32_t)o->n);
            for (int i = 0; i < o->n; i++)
                rw_mw_f64(w, o->logprobs[i]);
        }
        if (top) {
            rw_mw_str(w, "top_logprobs");
            rw_mw_array(w, (uint32_t)o->n);
            for (int i = 0; i < o->n; i++) {
                rw_mw_array(w, (uint32_t)o->top_n);
                for (int j = 0; j < o->top_n; j++) {
                    rw_mw_array(w, 2);
                    rw_mw_i64(w, o->top_ids[(size_t)i * o->top_n + j]);
                    rw_mw_f64(w, o->top_logprobs[(size_t)i * o->top_n + j]);
                }
            }
        }
        kv_str(w, "finish", rw_finish_str(o->finish));
        kv_u64(w, "prompt_tokens", (uint64_t)o->n_prompt);
        /* the version that produced the last token (the serving one when nothing was made) */
        uint64_t last =
            o->n_spans ? o->spans[o->n_spans - 1].version : (s->ntags ? s->ntags - 1 : 0);
        kv_str(w, "weight_version", tag_of(s, last));
        rw_mw_str(w, "version_spans");
        rw_mw_array(w, (uint32_t)o->n_spans);
        for (int i = 0; i < o->n_spans; i++) {
            rw_mw_map(w, 3);
            kv_str(w, "version", tag_of(s, o->spans[i].version));
            kv_i64(w, "begin", o->spans[i].begin);
            kv_i64(w, "end", o->spans[i].end);
        }
        /* seconds from the command's arrival */
        kv_f64(w, "first_token_s", o->t_first > 0 ? o->t_first - g->t_recv : -1);
        kv_f64(w, "total_s", o->t_done - g->t_recv);
    }
    send_writer(s, g->zm, w, NULL);
}

static void gen_remove(server *s, int pos) {
    gen *g = s->gens[pos];
    memmove(s->gens + pos, s->gens + pos + 1, sizeof(gen *) * (size_t)(s->ngens - pos - 1));
    s->ngens--;
    gen_free(g);
}

/* Takes every finished output of rank 0's engine; answers the commands that are complete. */
static void collect_outputs(server *s) {
    rw_output *o;
    while ((o = rw_engine_pop_output(s->r->eng))) {
        int pos;
        gen *g = gen_find(s, o->id, &pos);
        if (!g || g->outs[o->id - g->base]) {
            rw_output_free(o); /* a request rolled back before it was registered */
            continue;
        }
        g->outs[o->id - g->base] = o;
        g->done++;
        s->n_finished++;
        if (g->done == g->n) {
            gen_reply(s, g);
            gen_remove(s, pos);
        }
    }
}

/* Streams the tokens made since the last partial reply of every streaming command. */
static void stream_partials(server *s) {
    for (int gi = 0; gi < s->ngens; gi++) {
        gen *g = s->gens[gi];
        if (!g->stream) continue;
        int nchunks = 0;
        for (int k = 0; k < g->n; k++) {
            if (g->outs[k]) continue;
            int p = rw_engine_progress(s->r->eng, g->base + (uint64_t)k);
            if (p > g->sent[k]) nchunks++;
        }
        if (!nchunks) continue;
        rw_mw *w = s->w;
        rw_mw_reset(w);
        rw_mw_reply_ok(w, g->req_id);
        rw_mw_map(w, 2);
        kv_bool(w, "stream", true);
        rw_mw_str(w, "outputs");
        rw_mw_array(w, (uint32_t)nchunks);
        for (int k = 0; k < g->n; k++) {
            if (g->outs[k]) continue;
            const uint64_t eid = g->base + (uint64_t)k;
            int p = rw_engine_progress(s->r->eng, eid);
            if (p <= g->sent[k]) continue;
            int want = p - g->sent[k];
            if ((size_t)want > s->peekcap) {
                int32_t *t = realloc(s->peek_tok, sizeof(int32_t) * (size_t)want);
                if (t) s->peek_tok = t;
                float *l = realloc(s->peek_lp, sizeof(float) * (size_t)want);
                if (l) s->peek_lp = l;
                if (!t || !l) return; /* try again after the next step */
                s->peekcap = (size_t)want;
            }
            int got = 0;
            rw_err e;
            if (rw_engine_peek(s->r->eng, eid, g->sent[k], s->peek_tok, s->peek_lp, want, &got,
                               &e) != RW_OK)
                got = 0;
            rw_mw_map(w, g->logprobs ? 4 : 3);
            kv_u64(w, "index", (uint64_t)k);
            kv_u64(w, "offset", (uint64_t)g->sent[k]);
            rw_mw_str(w, "tokens");
            rw_mw_array(w, (uint32_t)got);
            for (int i = 0; i < got; i++)
                rw_mw_i64(w, s->peek_tok[i]);
            if (g->logprobs) {
                rw_mw_str(w, "logprobs");
                rw_mw_array(w, (uint32_t)got);
                for (int i = 0; i < got; i++)
                    rw_mw_f64(w, s->peek_lp[i]);
            }
            g->sent[k] += got;
        }
        send_writer(s, g->zm, w, NULL);
    }
}

/* Aborts every request on every rank; their commands get their partial outputs. */
static void abort_everything(server *s) {
    rw_engine_abort_all(s->r->eng);
    relay(s, RW_OP_ABORT_ALL, 0, NULL, 0);
    collect_outputs(s);
}

/* ------------------------------------------------------------------------------------------ */
/* Weight state                                                                                 */
/* ------------------------------------------------------------------------------------------ */
static bool session_open(const server *s) {
    rw_sync_info i;
    rw_sync_session_info(s->r->sess, &i);
    return i.state == RW_SYNC_UPDATING;
}

static const char *worker_state(const server *s) {
    rw_sync_info i;
    rw_sync_session_info(s->r->sess, &i);
    if (s->r->weights_released) return "weights_released";
    if (i.state == RW_SYNC_UPDATING) return "updating";
    if (i.state == RW_SYNC_INCOMPLETE || s->followers_incomplete) return "weights_incomplete";
    if (s->user_paused) return "paused";
    return "serving";
}

/* Whether generation may be queued now (an open session only delays it). */
static rw_status gen_gate(const server *s, rw_err *err) {
    if (s->r->weights_released)
        RW_FAIL(err, RW_E_STATE,
                "generate: the weights' memory is released (resume_memory, then push or reload "
                "the weights)");
    if (s->r->kv_released)
        RW_FAIL(err, RW_E_STATE, "generate: the KV cache's memory is released (resume_memory)");
    rw_err e;
    rw_status st = rw_sync_session_ready(s->r->sess, NULL, 0, &e);
    if (st == RW_E_WEIGHTS_INCOMPLETE || (st == RW_OK && s->followers_incomplete))
        RW_FAIL(err, RW_E_WEIGHTS_INCOMPLETE,
                "generate: the weights are incomplete (a failed or aborted update, a start "
                "without weights, or released memory); a full update or update_weights_from_disk "
                "must succeed first");
    return RW_OK;
}

/* Engine pause for an update session (unless the client paused the worker already, whose mode
 * stays in force). */
static rw_status pause_for_update(server *s, rw_pause_mode mode, rw_err *err) {
    if (s->user_paused || s->update_paused) return RW_OK;
    RW_CHECK(rw_engine_pause(s->r->eng, mode, err));
    relay(s, RW_OP_PAUSE, (uint64_t)mode, NULL, 0);
    s->update_paused = true;
    collect_outputs(s);
    return RW_OK;
}

/* Asks every follower for its weight state (after a session ended) and records whether any is
 * incomplete; followers with a session still open are told to abort it. */
static void settle_followers(server *s) {
    if (!s->peers->n) return;
    for (int pass = 0; pass < 2; pass++) {
        const char *cmd = pass == 0 ? "abort_update" : "get_weight_version";
        rw_mw_reset(s->w2);
        rw_mw_request(s->w2, 0, cmd);
        rw_mw_map(s->w2, 0);
        const void *env;
        size_t len;
        rw_err e;
        if (rw_mw_finish(s->w2, &env, &len, &e) != RW_OK) return;
        rw_op_msg rep[RW_DAEMON_MAX_TP];
        rw_status st = relay_wait(s, -1, RW_OP_SYNC, 0, env, len, NULL, rep, &e);
        if (st != RW_OK) RW_LOGE("rank 0: %s", e.msg);
        if (pass == 1) {
            bool incomplete = st != RW_OK;
            for (int r = 1; r <= s->peers->n; r++) {
                size_t plen;
                const void *p = rw_op_payload(&rep[r], &plen);
                rw_msg *m = NULL;
                rw_reply rp;
                if (!p || rw_msg_decode_reply(p, plen, &m, &rp, &e) != RW_OK || !rp.ok) {
                    incomplete = true;
                } else {
                    const char *sv;
                    size_t sl;
                    if (rw_mobj_str(rw_mobj_get(rp.result, "state"), "state", &sv, &sl, &e) !=
                            RW_OK ||
                        sl != 5 || memcmp(sv, "ready", 5))
                        incomplete = true;
                }
                rw_msg_free(m);
            }
            s->followers_incomplete = incomplete;
        }
        free_reps(s, rep);
    }
}

/* After a session ended without a commit everywhere: settle the ranks, drop what can no longer
 * run, lift the update's pause. */
static void session_ended(server *s) {
    rw_sync_info i;
    rw_sync_session_info(s->r->sess, &i);
    if (i.state == RW_SYNC_UPDATING) {
        bool intact;
        rw_err e;
        if (rw_sync_session_abort(s->r->sess, &intact, &e) != RW_OK) RW_LOGW("%s", e.msg);
    }
    settle_followers(s);
    rw_sync_session_info(s->r->sess, &i);
    if (i.state != RW_SYNC_READY || s->followers_incomplete) {
        /* queued and retracted requests cannot run on incomplete weights */
        abort_everything(s);
    }
    if (s->update_paused) {
        s->update_paused = false;
        if (!s->user_paused) {
            rw_err e;
            rw_engine_resume(s->r->eng, &e);
            relay(s, RW_OP_RESUME, 0, NULL, 0);
        }
    }
}

/* A commit that succeeded on every rank: stamp the new version, flush when asked, resume. */
static void session_committed(server *s, const char *version, bool flush) {
    if (!push_tag(s, version)) RW_LOGE("out of memory for the version table");
    const uint64_t v = s->ntags - 1;
    rw_engine_set_weight_version(s->r->eng, v);
    relay(s, RW_OP_SET_VERSION, v, NULL, 0);
    s->followers_incomplete = false;
    if (flush) {
        rw_err e;
        /* requests frozen in place hold KV of the old weights: recompute it */
        if (rw_engine_paused(s->r->eng)) {
            rw_engine_pause(s->r->eng, RW_PAUSE_RETRACT, &e);
            relay(s, RW_OP_PAUSE, RW_PAUSE_RETRACT, NULL, 0);
        }
        if (rw_engine_flush_cache(s->r->eng, &e) != RW_OK) RW_LOGW("flush at commit: %s", e.msg);
        relay(s, RW_OP_FLUSH, 0, NULL, 0);
    }
    if (s->update_paused) {
        s->update_paused = false;
        if (!s->user_paused) {
            rw_err e;
            rw_engine_resume(s->r->eng, &e);
            relay(s, RW_OP_RESUME, 0, NULL, 0);
        }
    }
}

/* ------------------------------------------------------------------------------------------ */
/* Request rewriting: the daemon's own fields are taken out before a request reaches a handler  */
/* that refuses unknown fields.                                                                 */
/* ------------------------------------------------------------------------------------------ */
static bool key_eq(const rw_mobj *k, const char *s) {
    const char *p;
    size_t n;
    return rw_mobj_str(k, "key", &p, &n, NULL) == RW_OK && n == strlen(s) && !memcmp(p, s, n);
}

/* Re-encodes `req` without the args keys in drop[]; *msg / *req are replaced (the old message is
 * freed). */
static rw_status strip_args(server *s, rw_msg **msg, rw_request *req, const char *const *drop,
                            int ndrop, rw_err *err) {
    const rw_mobj *a = req->args;
    size_t n = rw_mobj_len(a), keep = 0;
    for (size_t i = 0; i < n; i++) {
        bool d = false;
        for (int j = 0; j < ndrop; j++)
            d = d || key_eq(rw_mobj_key_at(a, i), drop[j]);
        keep += !d;
    }
    if (keep == n) return RW_OK;
    rw_mw_reset(s->w2);
    rw_mw_request(s->w2, req->id, req->cmd);
    rw_mw_map(s->w2, (uint32_t)keep);
    for (size_t i = 0; i < n; i++) {
        bool d = false;
        for (int j = 0; j < ndrop; j++)
            d = d || key_eq(rw_mobj_key_at(a, i), drop[j]);
        if (d) continue;
        rw_mw_obj(s->w2, rw_mobj_key_at(a, i));
        rw_mw_obj(s->w2, rw_mobj_val_at(a, i));
    }
    const void *env;
    size_t len;
    RW_CHECK(rw_mw_finish(s->w2, &env, &len, err));
    rw_msg *nm = NULL;
    rw_request nr;
    RW_CHECK(rw_msg_decode_request(env, len, &nm, &nr, err));
    rw_msg_free(*msg);
    *msg = nm;
    *req = nr;
    return RW_OK;
}

/* The encoded form of a (possibly rewritten) request, for relaying. */
static rw_status encode_request(server *s, const rw_request *req, const void **env, size_t *len,
                                rw_err *err) {
    rw_mw_reset(s->w2);
    rw_mw_request(s->w2, req->id, req->cmd);
    rw_mw_obj(s->w2, req->args);
    return rw_mw_finish(s->w2, env, len, err);
}

static rw_status parse_mode(const char *m, const char *what, rw_pause_mode *out, rw_err *err) {
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

static const char *mode_str(rw_pause_mode m) {
    return m == RW_PAUSE_ABORT ? "abort" : m == RW_PAUSE_RETRACT ? "retract" : "in_place";
}

/* ------------------------------------------------------------------------------------------ */
/* generate                                                                                     */
/* ------------------------------------------------------------------------------------------ */
static rw_status grow_tokens(server *s, size_t n, rw_err *err) {
    if (n <= s->tmpcap) return RW_OK;
    int64_t *a = realloc(s->tmp, sizeof *a * n);
    if (a) s->tmp = a;
    int32_t *b = realloc(s->tok, sizeof *b * n);
    if (b) s->tok = b;
    if (!a || !b) RW_FAIL(err, RW_E_OOM, "generate: prompt of %zu tokens", n);
    s->tmpcap = n;
    return RW_OK;
}

static rw_status read_prompt(server *s, const rw_mobj *p, const char *what, int *n, rw_err *err) {
    if (rw_mobj_type(p) != RW_M_ARRAY)
        RW_FAIL(err, RW_E_PROTOCOL, "%s: expected an array of token ids, got %s", what,
                rw_mtype_str(rw_mobj_type(p)));
    size_t len = rw_mobj_len(p);
    if (len == 0) RW_FAIL(err, RW_E_INVALID_ARG, "%s: empty prompt", what);
    if (len > (size_t)INT32_MAX) RW_FAIL(err, RW_E_RANGE, "%s: %zu tokens", what, len);
    RW_CHECK(grow_tokens(s, len, err));
    size_t got;
    const int64_t V = s->r->cfg.vocab_size;
    RW_CHECK(rw_mobj_i64_array(p, what, INT64_MIN, INT64_MAX, s->tmp, len, &got, err));
    for (size_t i = 0; i < got; i++) {
        if (s->tmp[i] < 0 || s->tmp[i] >= V)
            RW_FAIL(err, RW_E_RANGE, "%s[%zu]: token id %" PRId64 " outside [0, %" PRId64 ")", what,
                    i, s->tmp[i], V);
        s->tok[i] = (int32_t)s->tmp[i];
    }
    *n = (int)got;
    return RW_OK;
}

/* Parses the sampling fields shared by every request of the command. */
static rw_status read_sampling(rw_mfields *f, rw_sampling *sp, rw_err *err) {
    *sp = rw_sampling_default();
    uint64_t u;
    double d;
    RW_CHECK(rw_mfields_u64(f, "max_new_tokens", (uint64_t)sp->max_new_tokens, &u, err));
    if (u < 1 || u > (1u << 24))
        RW_FAIL(err, RW_E_RANGE, "args.max_new_tokens: %" PRIu64 " outside [1, 2^24]", u);
    sp->max_new_tokens = (int)u;
    RW_CHECK(rw_mfields_f64(f, "temperature", 0.0, &d, err));
    if (!(d >= 0 && d <= 1e6)) RW_FAIL(err, RW_E_RANGE, "args.temperature: %g outside [0, 1e6]", d);
    sp->temperature = (float)d;
    RW_CHECK(rw_mfields_f64(f, "top_p", 1.0, &d, err));
    if (!(d > 0 && d <= 1)) RW_FAIL(err, RW_E_RANGE, "args.top_p: %g outside (0, 1]", d);
    sp->top_p = (float)d;
    RW_CHECK(rw_mfields_u64(f, "top_k", 0, &u, err));
    if (u > (1u << 30)) RW_FAIL(err, RW_E_RANGE, "args.top_k: %" PRIu64 " too large", u);
    sp->top_k = (int)u;
    RW_CHECK(rw_mfields_u64(f, "seed", 0, &sp->seed, err));
    RW_CHECK(rw_mfields_u64(f, "top_logprobs", 0, &u, err));
    if (u > RW_MAX_TOP_LOGPROBS)
        RW_FAIL(err, RW_E_RANGE, "args.top_logprobs: %" PRIu64 " (at most %d)", u,
                RW_MAX_TOP_LOGPROBS);
    sp->top_logprobs = (int)u;
    const rw_mobj *stop = rw_mfields_get(f, "stop");
    if (stop) {
        int64_t ids[RW_MAX_STOP];
        size_t n;
        if (rw_mobj_type(stop) == RW_M_ARRAY && rw_mobj_len(stop) > RW_MAX_STOP)
            RW_FAIL(err, RW_E_RANGE, "args.stop: %zu stop ids (at most %d)", rw_mobj_len(stop),
                    RW_MAX_STOP);
        RW_CHECK(rw_mobj_i64_array(stop, "args.stop", 0, INT32_MAX, ids, RW_MAX_STOP, &n, err));
        sp->n_stop = (int)n;
        for (size_t i = 0; i < n; i++)
            sp->stop_ids[i] = (int32_t)ids[i];
    }
    return RW_OK;
}

/* Handles generate. On success the command is registered (its zm kept) and *kept is set. */
static rw_status cmd_generate(server *s, rw_zmq_msg *zm, const rw_request *req, bool *kept,
                              rw_err *err) {
    RW_CHECK(gen_gate(s, err));
    rw_mfields f;
    RW_CHECK(rw_mfields_init(&f, req->args, "args", err));
    const rw_mobj *prompts = rw_mfields_get(&f, "prompts");
    const rw_mobj *prompt = rw_mfields_get(&f, "prompt");
    if (!prompts == !prompt)
        RW_FAIL(err, RW_E_PROTOCOL,
                "generate: give exactly one of args.prompt (one prompt) and "
                "args.prompts (a batch)");
    if (prompts && rw_mobj_type(prompts) != RW_M_ARRAY)
        RW_FAIL(err, RW_E_PROTOCOL, "args.prompts: expected an array of prompts, got %s",
                rw_mtype_str(rw_mobj_type(prompts)));
    size_t np = prompts ? rw_mobj_len(prompts) : 1;
    if (np == 0) RW_FAIL(err, RW_E_INVALID_ARG, "args.prompts: empty batch");
    uint64_t per;
    RW_CHECK(rw_mfields_u64(&f, "n", 1, &per, err));
    if (per < 1 || per > 1024)
        RW_FAIL(err, RW_E_RANGE, "args.n: %" PRIu64 " outside [1, 1024]", per);
    if (np * per > MAX_PROMPTS_PER_CMD)
        RW_FAIL(err, RW_E_RANGE, "generate: %zu prompts x n %" PRIu64 " requests (at most %d)", np,
                per, MAX_PROMPTS_PER_CMD);
    rw_sampling sp;
    RW_CHECK(read_sampling(&f, &sp, err));
    bool stream, logprobs;
    RW_CHECK(rw_mfields_bool(&f, "stream", false, &stream, err));
    RW_CHECK(rw_mfields_bool(&f, "logprobs", true, &logprobs, err));
    RW_CHECK(rw_mfields_done(&f, err));

    const int total = (int)(np * per);
    gen *g = calloc(1, sizeof *g);
    if (!g) RW_FAIL(err, RW_E_OOM, "generate");
    g->outs = calloc((size_t)total, sizeof *g->outs);
    g->sent = calloc((size_t)total, sizeof *g->sent);
    if (!g->outs || !g->sent) {
        gen_free(g);
        RW_FAIL(err, RW_E_OOM, "generate: %d requests", total);
    }
    g->n = total;
    g->per_prompt = (int)per;
    g->base = s->next_eid;
    g->req_id = req->id;
    g->stream = stream;
    g->logprobs = logprobs;
    g->t_recv = rw_now();
    const void *peer = rw_zmq_msg_peer(zm, &g->peer_len);
    if (g->peer_len > sizeof g->peer) g->peer_len = sizeof g->peer;
    memcpy(g->peer, peer, g->peer_len);

    /* add every request on rank 0 first; any refusal rolls the command back before a follower
     * heard of it */
    rw_status st = RW_OK;
    int added = 0;
    const uint64_t seed0 = sp.seed;
    for (int k = 0; k < total && st == RW_OK; k++) {
        const size_t pi = (size_t)k / per;
        char what[48];
        snprintf(what, sizeof what, prompts ? "args.prompts[%zu]" : "args.prompt", pi);
        int n = 0;
        st = read_prompt(s, prompts ? rw_mobj_at(prompts, pi) : prompt, what, &n, err);
        if (st != RW_OK) break;
        sp.seed = seed0 + (uint64_t)k;
        st = rw_engine_add(s->r->eng, g->base + (uint64_t)k, s->tok, n, &sp, err);
        if (st != RW_OK) {
            rw_err_prefix(err, "%s", what);
            break;
        }
        added++;
    }
    if (st != RW_OK) {
        for (int k = 0; k < added; k++)
            rw_engine_abort(s->r->eng, g->base + (uint64_t)k, NULL);
        collect_outputs(s); /* drops the rolled-back outputs: the command is not registered */
        gen_free(g);
        return st;
    }
    /* the same adds on every other rank */
    for (int k = 0; k < total && s->peers->n; k++) {
        const size_t pi = (size_t)k / per;
        int n = 0;
        rw_err pe;
        if (read_prompt(s, prompts ? rw_mobj_at(prompts, pi) : prompt, "prompt", &n, &pe) != RW_OK)
            break; /* cannot happen: the same read succeeded above */
        sp.seed = seed0 + (uint64_t)k;
        if (rw_op_add_encode(s->w2, s->tok, n, &sp, &pe) != RW_OK) {
            RW_LOGE("generate: %s", pe.msg);
            s->fatal = s->shutdown = true;
            break;
        }
        const void *pl;
        size_t plen;
        rw_mw_finish(s->w2, &pl, &plen, NULL);
        relay(s, RW_OP_ADD, g->base + (uint64_t)k, pl, plen);
    }
    s->next_eid += (uint64_t)total;
    s->n_requests += (uint64_t)total;
    if (s->ngens == s->capgens) {
        int nc = s->capgens ? 2 * s->capgens : 64;
        gen **p = realloc(s->gens, sizeof *p * (size_t)nc);
        if (!p) {
            /* registered nowhere: take the requests back everywhere */
            for (int k = 0; k < total; k++) {
                rw_engine_abort(s->r->eng, g->base + (uint64_t)k, NULL);
                relay(s, RW_OP_ABORT, g->base + (uint64_t)k, NULL, 0);
            }
            collect_outputs(s);
            gen_free(g);
            RW_FAIL(err, RW_E_OOM, "generate: command table");
        }
        s->gens = p;
        s->capgens = nc;
    }
    g->zm = zm;
    s->gens[s->ngens++] = g;
    *kept = true;
    return RW_OK;
}

/* ------------------------------------------------------------------------------------------ */
/* abort / pause / resume / flush_cache                                                         */
/* ------------------------------------------------------------------------------------------ */
static rw_status cmd_abort(server *s, const rw_zmq_msg *zm, const rw_request *req, rw_err *err) {
    rw_mfields f;
    RW_CHECK(rw_mfields_init(&f, req->args, "args", err));
    const rw_mobj *rid = rw_mfields_get(&f, "request_id");
    bool all;
    RW_CHECK(rw_mfields_bool(&f, "all", false, &all, err));
    RW_CHECK(rw_mfields_done(&f, err));
    if (!rid == !all)
        RW_FAIL(
            err, RW_E_PROTOCOL,
            "abort: give args.request_id (a generate command of this client) or args.all: true");
    int64_t n_aborted = 0, n_cmds = 0;
    if (all) {
        n_aborted = requests_in_flight(s);
        n_cmds = s->ngens;
        abort_everything(s);
    } else {
        uint64_t id;
        RW_CHECK(rw_mobj_u64(rid, "args.request_id", &id, err));
        size_t plen;
        const void *peer = rw_zmq_msg_peer(zm, &plen);
        for (int gi = 0; gi < s->ngens; gi++) {
            gen *g = s->gens[gi];
            if (g->req_id != id || g->peer_len != plen || memcmp(g->peer, peer, plen)) continue;
            n_cmds++;
            for (int k = 0; k < g->n; k++) {
                if (g->outs[k]) continue;
                const uint64_t eid = g->base + (uint64_t)k;
                if (rw_engine_abort(s->r->eng, eid, NULL) == RW_OK) {
                    relay(s, RW_OP_ABORT, eid, NULL, 0);
                    n_aborted++;
                }
            }
        }
        if (!n_cmds)
            RW_FAIL(err, RW_E_NOT_FOUND,
                    "abort: no generate command with id %" PRIu64 " from this client is in flight",
                    id);
        collect_outputs(s);
    }
    rw_mw_reset(s->w);
    rw_mw_reply_ok(s->w, req->id);
    rw_mw_map(s->w, 2);
    kv_i64(s->w, "aborted", n_aborted);
    kv_i64(s->w, "commands", n_cmds);
    return RW_OK;
}

static rw_status cmd_pause(server *s, const rw_request *req, rw_err *err) {
    rw_mfields f;
    RW_CHECK(rw_mfields_init(&f, req->args, "args", err));
    char m[16];
    RW_CHECK(rw_mfields_str(&f, "mode", "abort", m, sizeof m, err));
    RW_CHECK(rw_mfields_done(&f, err));
    rw_pause_mode mode;
    RW_CHECK(parse_mode(m, "args.mode", &mode, err));
    const uint64_t before = s->n_finished;
    RW_CHECK(rw_engine_pause(s->r->eng, mode, err));
    relay(s, RW_OP_PAUSE, (uint64_t)mode, NULL, 0);
    s->user_paused = true;
    collect_outputs(s);
    rw_engine_stats es;
    rw_engine_stats_get(s->r->eng, &es);
    rw_mw_reset(s->w);
    rw_mw_reply_ok(s->w, req->id);
    rw_mw_map(s->w, 5);
    kv_bool(s->w, "paused", true);
    kv_str(s->w, "mode", mode_str(mode));
    kv_u64(s->w, "aborted", s->n_finished - before);
    kv_i64(s->w, "running", es.running);
    kv_i64(s->w, "waiting", es.waiting);
    return RW_OK;
}

static rw_status cmd_resume(server *s, const rw_request *req, rw_err *err) {
    rw_mfields f;
    RW_CHECK(rw_mfields_init(&f, req->args, "args", err));
    RW_CHECK(rw_mfields_done(&f, err));
    if (session_open(s))
        RW_FAIL(err, RW_E_STATE,
                "resume: an update session is open; generation resumes at "
                "commit_update or abort_update");
    if (rw_engine_paused(s->r->eng)) {
        RW_CHECK(rw_engine_resume(s->r->eng, err));
        relay(s, RW_OP_RESUME, 0, NULL, 0);
    }
    s->user_paused = false;
    rw_mw_reset(s->w);
    rw_mw_reply_ok(s->w, req->id);
    rw_mw_map(s->w, 1);
    kv_bool(s->w, "paused", false);
    return RW_OK;
}

static rw_status cmd_flush(server *s, const rw_request *req, rw_err *err) {
    rw_mfields f;
    RW_CHECK(rw_mfields_init(&f, req->args, "args", err));
    RW_CHECK(rw_mfields_done(&f, err));
    rw_engine_stats es;
    rw_engine_stats_get(s->r->eng, &es);
    if (es.running > 0)
        RW_FAIL(err, RW_E_BUSY,
                "flush_cache: %d request(s) are running (let them finish, abort them, or pause "
                "with mode abort or retract first)",
                es.running);
    RW_CHECK(rw_engine_flush_cache(s->r->eng, err));
    rw_op_msg rep[RW_DAEMON_MAX_TP];
    rw_status st = relay_wait(s, -1, RW_OP_FLUSH, 0, NULL, 0, NULL, rep, err);
    if (st == RW_OK) st = reps_status(s, rep, err);
    free_reps(s, rep);
    RW_CHECK(st);
    rw_mw_reset(s->w);
    rw_mw_reply_ok(s->w, req->id);
    rw_mw_map(s->w, 1);
    kv_bool(s->w, "flushed", true);
    return RW_OK;
}

/* ------------------------------------------------------------------------------------------ */
/* release_memory / resume_memory                                                               */
/* ------------------------------------------------------------------------------------------ */
static rw_status cmd_memory(server *s, const rw_request *req, bool release, rw_err *err) {
    rw_mfields f;
    RW_CHECK(rw_mfields_init(&f, req->args, "args", err));
    bool weights, kv;
    RW_CHECK(rw_mfields_bool(&f, "weights", true, &weights, err));
    RW_CHECK(rw_mfields_bool(&f, "kv_cache", true, &kv, err));
    RW_CHECK(rw_mfields_done(&f, err));
    if (!weights && !kv)
        RW_FAIL(err, RW_E_INVALID_ARG, "%s: nothing selected (weights and kv_cache are false)",
                req->cmd);
    if (session_open(s))
        RW_FAIL(err, RW_E_STATE, "%s: an update session is open (commit or abort it first)",
                req->cmd);
    size_t before_w = rw_wset_bytes(rw_model_wset(s->r->model));
    rw_engine_stats es;
    rw_engine_stats_get(s->r->eng, &es);
    if (release && (es.running || es.waiting))
        RW_FAIL(err, RW_E_BUSY,
                "release_memory: %d request(s) running and %d queued (abort them, or pause with "
                "mode abort, first)",
                es.running, es.waiting);
    unsigned flags = 0;
    if (release)
        flags = (weights ? RW_MEM_RELEASE_WEIGHTS : 0) | (kv ? RW_MEM_RELEASE_KV : 0);
    else
        flags = (weights ? RW_MEM_RESUME_WEIGHTS : 0) | (kv ? RW_MEM_RESUME_KV : 0);
    const bool was_w = s->r->weights_released, was_kv = s->r->kv_released;
    RW_CHECK(rw_rank_memory(s->r, flags, err));
    rw_op_msg rep[RW_DAEMON_MAX_TP];
    rw_status st = relay_wait(s, -1, RW_OP_MEM, flags, NULL, 0, NULL, rep, err);
    if (st == RW_OK) st = reps_status(s, rep, err);
    free_reps(s, rep);
    if (st != RW_OK) return st;
    if (!release && weights && was_w) {
        /* the fresh sessions on every rank start incomplete */
        s->followers_incomplete = s->peers->n > 0;
        settle_followers(s);
    }
    size_t freed = 0;
    if (release && weights && !was_w) freed += before_w;
    if (release && kv && !was_kv) freed += es.kv_bytes;
    rw_mw_reset(s->w);
    rw_mw_reply_ok(s->w, req->id);
    rw_mw_map(s->w, 4);
    kv_bool(s->w, "weights_released", s->r->weights_released);
    kv_bool(s->w, "kv_released", s->r->kv_released);
    kv_u64(s->w, release ? "released_bytes" : "resumed_bytes", release ? freed : 0);
    kv_str(s->w, "state", worker_state(s));
    return RW_OK;
}

/* ------------------------------------------------------------------------------------------ */
/* health / stats                                                                               */
/* ------------------------------------------------------------------------------------------ */
static rw_status cmd_health(server *s, const rw_request *req, rw_err *err) {
    rw_mfields f;
    RW_CHECK(rw_mfields_init(&f, req->args, "args", err));
    RW_CHECK(rw_mfields_done(&f, err));
    rw_sync_info i;
    rw_sync_session_info(s->r->sess, &i);
    rw_mw_reset(s->w);
    rw_mw_reply_ok(s->w, req->id);
    rw_mw_map(s->w, 7);
    kv_str(s->w, "status", "ok");
    kv_str(s->w, "state", worker_state(s));
    kv_str(s->w, "version", i.version);
    kv_i64(s->w, "tp", s->r->tp);
    kv_str(s->w, "device", rw_backend_str(s->o->backend));
    kv_f64(s->w, "uptime_s", rw_now() - s->t_start);
    kv_i64(s->w, "requests_in_flight", requests_in_flight(s));
    return RW_OK;
}

static rw_status cmd_stats(server *s, const rw_request *req, rw_err *err) {
    rw_mfields f;
    RW_CHECK(rw_mfields_init(&f, req->args, "args", err));
    RW_CHECK(rw_mfields_done(&f, err));
    rw_engine_stats es;
    rw_engine_stats_get(s->r->eng, &es);
    rw_sync_info i;
    rw_sync_session_info(s->r->sess, &i);
    rw_mw *w = s->w;
    rw_mw_reset(w);
    rw_mw_reply_ok(w, req->id);
    rw_mw_map(w, 9);
    kv_str(w, "state", worker_state(s));
    kv_i64(w, "tp", s->r->tp);
    kv_str(w, "device", rw_backend_str(s->o->backend));
    kv_f64(w, "uptime_s", rw_now() - s->t_start);
    rw_mw_str(w, "queue");
    rw_mw_map(w, 5);
    kv_i64(w, "waiting", es.waiting);
    kv_i64(w, "running", es.running);
    kv_bool(w, "paused", es.paused);
    kv_i64(w, "commands_in_flight", s->ngens);
    kv_i64(w, "requests_in_flight", requests_in_flight(s));
    rw_mw_str(w, "throughput");
    rw_mw_map(w, 8);
    kv_f64(w, "generated_tokens_per_s", es.gen_tokens_per_s);
    kv_i64(w, "steps", es.steps);
    kv_i64(w, "prefill_tokens", es.prompt_tokens);
    kv_i64(w, "generated_tokens", es.generated_tokens);
    kv_i64(w, "preemptions", es.preemptions);
    kv_u64(w, "requests", s->n_requests);
    kv_u64(w, "requests_finished", s->n_finished);
    kv_u64(w, "commands", s->n_commands);
    rw_mw_str(w, "memory");
    rw_mw_map(w, 8);
    kv_u64(w, "weights_bytes", rw_wset_bytes(rw_model_wset(s->r->model)));
    kv_bool(w, "weights_released", s->r->weights_released);
    kv_u64(w, "kv_bytes", es.kv_bytes);
    kv_i64(w, "kv_blocks_total", es.kv_blocks_total);
    kv_i64(w, "kv_blocks_used", es.kv_blocks_used);
    kv_i64(w, "kv_block_size", es.kv_block_size);
    kv_bool(w, "kv_released", es.kv_released);
    kv_u64(w, "staging_bytes", i.staging_bytes);
    rw_mw_str(w, "weights");
    rw_mw_map(w, 10);
    kv_str(w, "version", i.version);
    kv_str(w, "state", rw_sync_wstate_str(i.state));
    kv_u64(w, "updates", i.sessions_committed);
    kv_u64(w, "updates_aborted", i.sessions_aborted);
    kv_f64(w, "last_update_s", i.last_update_s);
    kv_f64(w, "last_update_gbps", i.last_update_gbps);
    kv_u64(w, "last_update_bytes", i.bytes);
    kv_f64(w, "last_update_age_s", i.last_commit_time > 0 ? rw_now() - i.last_commit_time : -1);
    kv_bool(w, "nccl_group", i.has_group);
    kv_u64(w, "versions_served", s->ntags);
    kv_u64(w, "errors", s->n_errors);
    return RW_OK;
}

/* ------------------------------------------------------------------------------------------ */
/* The update commands                                                                          */
/* ------------------------------------------------------------------------------------------ */
/* Merges rank 0's checksum reply (in r->w) with the followers' into s->w: the "ranks" arrays are
 * concatenated, every other field is rank 0's. */
static rw_status merge_checksums(server *s, const rw_request *req, rw_reply *reps, rw_err *err) {
    const void *p0;
    size_t l0;
    rw_msg *m0 = NULL;
    rw_reply r0;
    RW_CHECK(rw_mw_finish(s->r->w, &p0, &l0, err));
    RW_CHECK(rw_msg_decode_reply(p0, l0, &m0, &r0, err));
    const rw_mobj *res = r0.result;
    rw_mw_reset(s->w);
    rw_mw_reply_ok(s->w, req->id);
    rw_mw_map(s->w, (uint32_t)rw_mobj_len(res));
    for (size_t i = 0; i < rw_mobj_len(res); i++) {
        const rw_mobj *k = rw_mobj_key_at(res, i), *v = rw_mobj_val_at(res, i);
        rw_mw_obj(s->w, k);
        if (!key_eq(k, "ranks")) {
            rw_mw_obj(s->w, v);
            continue;
        }
        size_t total = rw_mobj_len(v);
        for (int r = 1; r <= s->peers->n; r++)
            total += rw_mobj_len(rw_mobj_get(reps[r].result, "ranks"));
        rw_mw_array(s->w, (uint32_t)total);
        for (size_t j = 0; j < rw_mobj_len(v); j++)
            rw_mw_obj(s->w, rw_mobj_at(v, j));
        for (int r = 1; r <= s->peers->n; r++) {
            const rw_mobj *ra = rw_mobj_get(reps[r].result, "ranks");
            for (size_t j = 0; j < rw_mobj_len(ra); j++)
                rw_mw_obj(s->w, rw_mobj_at(ra, j));
        }
    }
    rw_msg_free(m0);
    return RW_OK;
}

/* Runs an update / readback command on the ranks it concerns (followers first, since some of
 * these block until every rank joined) and sends the combined reply: the first failure (a
 * follower's named by its rank), a follower's readback as it is, merged checksums, or rank 0's
 * reply. Then applies the consequences for generation (pause while a session is open, the new
 * version at commit, settling the ranks after a failure). */
static void cmd_sync(server *s, const rw_zmq_msg *zm, rw_msg **msg, rw_request *req) {
    const char *c = req->cmd;
    const bool is_update = !strcmp(c, "begin_update") || !strcmp(c, "update_weights") ||
                           !strcmp(c, "update_weights_from_disk") || !strcmp(c, "commit_update");
    const bool disk = !strcmp(c, "update_weights_from_disk");
    rw_err e;
    rw_err_clear(&e);
    rw_status st = RW_OK;
    rw_pause_mode pmode = RW_PAUSE_RETRACT;
    int only = -1; /* -1: every rank; r: rank r alone */
    if (s->r->weights_released && strcmp(c, "get_weight_version") && strcmp(c, "abort_update")) {
        st = RW_ERR(&e, RW_E_STATE, "%s: the weights' memory is released (resume_memory first)", c);
    } else if (!strcmp(c, "begin_update") || disk) {
        /* the daemon's own argument: how generation pauses for the session */
        const rw_mobj *pm = rw_mobj_get(req->args, "pause_mode");
        if (pm) {
            char m[16];
            static const char *const drop[] = {"pause_mode"};
            st = rw_mobj_strcpy(pm, "args.pause_mode", m, sizeof m, &e);
            if (st == RW_OK) st = parse_mode(m, "args.pause_mode", &pmode, &e);
            if (st == RW_OK) st = strip_args(s, msg, req, drop, 1, &e);
        }
    } else if (!strcmp(c, "get_weights")) {
        /* the daemon's own argument: which rank's slice */
        const rw_mobj *rk = rw_mobj_get(req->args, "rank");
        only = 0;
        if (rk) {
            uint64_t r;
            static const char *const drop[] = {"rank"};
            st = rw_mobj_u64(rk, "args.rank", &r, &e);
            if (st == RW_OK && r >= (uint64_t)s->r->tp)
                st = RW_ERR(&e, RW_E_RANGE, "args.rank: %" PRIu64 " (this worker has %d ranks)", r,
                            s->r->tp);
            if (st == RW_OK) {
                only = (int)r;
                st = strip_args(s, msg, req, drop, 1, &e);
            }
        }
    }
    if (st != RW_OK) {
        reply_err(s, zm, req->id, st, e.msg);
        return;
    }
    const bool was_open = session_open(s);
    const bool implicit_disk = disk && !was_open;
    if (implicit_disk && (st = pause_for_update(s, pmode, &e)) != RW_OK) {
        reply_err(s, zm, req->id, st, e.msg);
        return;
    }

    /* run it: followers first, then rank 0, then gather */
    rw_sync_frames in;
    rw_zmq_msg_frames(zm, &in);
    rw_op_msg rep[RW_DAEMON_MAX_TP];
    for (int r = 0; r <= s->peers->n; r++)
        memset(&rep[r], 0, sizeof rep[r]);
    rw_sync_out_frame of = {0};
    bool sent = false, ran0 = false;
    uint64_t seq = 0;
    rw_status st0 = RW_OK;
    if (s->peers->n && only != 0) {
        const void *env;
        size_t len;
        st = encode_request(s, req, &env, &len, &e);
        if (st == RW_OK) {
            rw_op_hdr h = rw_op_make(RW_OP_SYNC, ++s->seq, 0, 0, RW_OPF_REPLY);
            seq = h.seq;
            st = rw_peers_send(s->peers, only, &h, env, len, &in, &e);
            sent = st == RW_OK;
        }
    }
    rw_err e0;
    rw_err_clear(&e0);
    if (st == RW_OK && only <= 0) {
        st0 = rw_rank_sync(s->r, req, &in, &of, &e0);
        ran0 = true;
    }
    if (sent && (st = rw_peers_gather(s->peers, only, seq, s->o->rank_timeout_s, rep, &e)) != RW_OK)
        RW_LOGE("%s: %s", c, e.msg);

    /* the reply */
    rw_msg *msgs[RW_DAEMON_MAX_TP] = {0};
    rw_reply reps[RW_DAEMON_MAX_TP];
    int bad = -1;
    if (st == RW_OK && ran0 && st0 != RW_OK) {
        bad = 0;
        st = st0;
    }
    for (int r = 1; st == RW_OK && r <= s->peers->n; r++) {
        if (rep[r].h.magic == 0) continue;
        size_t plen;
        const void *p = rw_op_payload(&rep[r], &plen);
        rw_err de;
        if (!p || rw_msg_decode_reply(p, plen, &msgs[r], &reps[r], &de) != RW_OK) {
            st = RW_ERR(&e, RW_E_INTERNAL, "rank %d: undecodable answer to %s", r, c);
            bad = r;
        } else if (!reps[r].ok) {
            st = rw_err_set(&e, reps[r].status, __FILE__, __LINE__, "rank %d: %s", r,
                            reps[r].message);
            bad = r;
        }
    }
    char version[RW_SYNC_MAX_VERSION + 1] = "";
    bool flush = false;
    if (bad == 0) {
        s->n_errors++;
        send_writer(s, zm, s->r->w, NULL); /* the handler's own error reply */
    } else if (st != RW_OK) {
        reply_err(s, zm, req->id, st, e.msg);
    } else {
        if (!strcmp(c, "commit_update")) {
            /* what the daemon needs from rank 0's reply, read before anything reuses it */
            const void *p;
            size_t l;
            rw_msg *m = NULL;
            rw_reply rp;
            if (rw_mw_finish(s->r->w, &p, &l, NULL) == RW_OK &&
                rw_msg_decode_reply(p, l, &m, &rp, NULL) == RW_OK && rp.ok) {
                rw_mobj_strcpy(rw_mobj_get(rp.result, "version"), "version", version,
                               sizeof version, NULL);
                const rw_mobj *fv = rw_mobj_get(rp.result, "flush_cache");
                if (fv) rw_mobj_bool(fv, "flush_cache", &flush, NULL);
            }
            rw_msg_free(m);
        }
        if (only > 0) {
            /* a follower's readback, reply and frame as they are */
            size_t plen;
            const void *p = rw_op_payload(&rep[only], &plen);
            rw_sync_frames fr;
            rw_op_frames(&rep[only], &fr);
            rw_mw_reset(s->w);
            rw_mw_raw(s->w, p, plen);
            if (fr.n && (of.data = malloc(fr.len[0] ? fr.len[0] : 1))) {
                memcpy(of.data, fr.data[0], fr.len[0]);
                of.len = fr.len[0];
                send_writer(s, zm, s->w, &of);
            } else if (fr.n) {
                reply_err(s, zm, req->id, RW_E_OOM, "get_weights: out of memory for the frame");
            } else {
                send_writer(s, zm, s->w, NULL);
            }
        } else if (!strcmp(c, "checksum") && s->peers->n) {
            st = merge_checksums(s, req, reps, &e);
            if (st == RW_OK)
                send_writer(s, zm, s->w, NULL);
            else
                reply_err(s, zm, req->id, st, e.msg);
        } else {
            send_writer(s, zm, s->r->w, &of);
        }
    }
    free(of.data);
    for (int r = 0; r <= s->peers->n; r++)
        rw_msg_free(msgs[r]);
    free_reps(s, rep);

    /* consequences for generation */
    if (!strcmp(c, "begin_update")) {
        if (st == RW_OK) {
            if (pause_for_update(s, pmode, &e) != RW_OK) RW_LOGE("begin_update: %s", e.msg);
        } else if (!was_open && (session_open(s) || s->peers->n)) {
            session_ended(s); /* ranks that did open a session close it again */
        }
    } else if (is_update && st != RW_OK) {
        if (was_open || implicit_disk || session_open(s)) session_ended(s);
    } else if (!strcmp(c, "abort_update")) {
        if (st == RW_OK || session_open(s) || s->update_paused) session_ended(s);
    }
    if (st == RW_OK && (!strcmp(c, "commit_update") || implicit_disk)) {
        if (!version[0]) {
            rw_sync_info i;
            rw_sync_session_info(s->r->sess, &i);
            snprintf(version, sizeof version, "%s", i.version);
        }
        session_committed(s, version, flush);
    }
}

/* ------------------------------------------------------------------------------------------ */
/* Dispatch                                                                                     */
/* ------------------------------------------------------------------------------------------ */
static bool token_ok(const char *want, const char *got, size_t n) {
    size_t wn = strlen(want);
    unsigned diff = (unsigned)(wn ^ n);
    for (size_t i = 0; i < wn; i++)
        diff |= (unsigned)want[i] ^ (unsigned)(i < n ? got[i] : 0);
    return diff == 0;
}

static const char *const daemon_cmds[] = {
    "generate",       "abort",         "pause",  "resume", "flush_cache",
    "release_memory", "resume_memory", "health", "stats",  "shutdown",
};

static bool is_daemon_cmd(const char *c) {
    for (size_t i = 0; i < sizeof daemon_cmds / sizeof *daemon_cmds; i++)
        if (!strcmp(c, daemon_cmds[i])) return true;
    return false;
}

/* Handles one received message; takes ownership of zm. */
static void handle(server *s, rw_zmq_msg *zm, rw_status recv_st, const rw_err *recv_err) {
    s->n_commands++;
    if (recv_st != RW_OK) {
        reply_err(s, zm, 0, recv_st, recv_err->msg);
        rw_zmq_msg_free(zm);
        return;
    }
    rw_err e;
    rw_err_clear(&e);
    rw_msg *msg = NULL;
    rw_request req;
    size_t len;
    const void *env = rw_zmq_msg_envelope(zm, &len);
    rw_status st = rw_msg_decode_request(env, len, &msg, &req, &e);
    if (st != RW_OK) {
        reply_err(s, zm, req.has_id ? req.id : 0, st, e.msg);
        rw_msg_free(msg);
        rw_zmq_msg_free(zm);
        return;
    }
    if (s->o->auth_token) {
        const rw_mobj *a = rw_mobj_get(req.args, "auth");
        const char *p = NULL;
        size_t n = 0;
        if (!a || rw_mobj_str(a, "args.auth", &p, &n, NULL) != RW_OK ||
            !token_ok(s->o->auth_token, p, n)) {
            reply_err(s, zm, req.id, RW_E_AUTH,
                      "authentication failed: args.auth must carry this worker's token");
            rw_msg_free(msg);
            rw_zmq_msg_free(zm);
            return;
        }
        static const char *const drop[] = {"auth"};
        st = strip_args(s, &msg, &req, drop, 1, &e);
        if (st != RW_OK) {
            reply_err(s, zm, req.id, st, e.msg);
            rw_msg_free(msg);
            rw_zmq_msg_free(zm);
            return;
        }
    }
    rw_sync_frames fr;
    rw_zmq_msg_frames(zm, &fr);
    bool kept = false;
    const char *c = req.cmd;
    if (is_daemon_cmd(c) && fr.n) {
        st = RW_ERR(&e, RW_E_PROTOCOL, "%s: takes no data frames, got %zu", c, fr.n);
    } else if (!strcmp(c, "generate")) {
        st = cmd_generate(s, zm, &req, &kept, &e);
    } else if (!strcmp(c, "abort")) {
        st = cmd_abort(s, zm, &req, &e);
    } else if (!strcmp(c, "pause")) {
        st = cmd_pause(s, &req, &e);
    } else if (!strcmp(c, "resume")) {
        st = cmd_resume(s, &req, &e);
    } else if (!strcmp(c, "flush_cache")) {
        st = cmd_flush(s, &req, &e);
    } else if (!strcmp(c, "release_memory")) {
        st = cmd_memory(s, &req, true, &e);
    } else if (!strcmp(c, "resume_memory")) {
        st = cmd_memory(s, &req, false, &e);
    } else if (!strcmp(c, "health")) {
        st = cmd_health(s, &req, &e);
    } else if (!strcmp(c, "stats")) {
        st = cmd_stats(s, &req, &e);
    } else if (!strcmp(c, "shutdown")) {
        rw_mfields f;
        st = rw_mfields_init(&f, req.args, "args", &e);
        if (st == RW_OK) st = rw_mfields_done(&f, &e);
        if (st == RW_OK) {
            s->shutdown = true;
            s->shutdown_zm = zm;
            s->shutdown_id = req.id;
            kept = true;
        }
    } else if (rw_sync_is_command(c)) {
        cmd_sync(s, zm, &msg, &req);
        rw_msg_free(msg);
        rw_zmq_msg_free(zm);
        return;
    } else {
        st = RW_ERR(&e, RW_E_PROTOCOL,
                    "unknown command '%s' (generate, abort, pause, resume, flush_cache, "
                    "init_weights_update_group, begin_update, update_weights, "
                    "update_weights_from_disk, commit_update, abort_update, get_weight_version, "
                    "get_weights, checksum, release_memory, resume_memory, health, stats, "
                    "shutdown)",
                    c);
    }
    if (st != RW_OK)
        reply_err(s, zm, req.id, st, e.msg);
    else if (!kept)
        send_writer(s, zm, s->w, NULL);
    rw_msg_free(msg);
    if (!kept) rw_zmq_msg_free(zm);
}

/* ------------------------------------------------------------------------------------------ */
/* A lost rank                                                                                  */
/* ------------------------------------------------------------------------------------------ */
/* Answers every generate command in flight with an error naming the lost rank, and a pending
 * shutdown command with its result. Touches neither the engine nor the followers, so that the
 * watchdog's last resort can use it while the engine is stuck. */
static void answer_lost(server *s, const char *why) {
    char msg[400];
    snprintf(msg, sizeof msg,
             "generate: %s; the worker cannot generate without every rank and stops (restart "
             "it)",
             why);
    for (int i = 0; i < s->ngens; i++)
        reply_err(s, s->gens[i]->zm, s->gens[i]->req_id, RW_E_ABORTED, msg);
    if (s->shutdown_zm) {
        rw_mw_reset(s->w);
        rw_mw_reply_ok(s->w, s->shutdown_id);
        rw_mw_map(s->w, 1);
        kv_i64(s->w, "aborted", requests_in_flight(s));
        send_writer(s, s->shutdown_zm, s->w, NULL);
        rw_zmq_msg_free(s->shutdown_zm);
        s->shutdown_zm = NULL;
    }
}

/* Once the watchdog reports a lost rank: every request in flight gets an error reply naming it
 * and the worker stops (exit status 1). True from then on. */
static bool check_lost(server *s) {
    if (s->lost_handled) return true;
    char why[256];
    if (!rw_watch_lost(s->peers->watch, why, sizeof why)) return false;
    s->lost_handled = true;
    s->peers->lost = true;
    RW_LOGE("%s: answering %" PRId64 " request(s) in flight with an error and stopping", why,
            requests_in_flight(s));
    answer_lost(s, why);
    while (s->ngens)
        gen_remove(s, s->ngens - 1);
    rw_engine_abort_all(s->r->eng); /* rank 0's own bookkeeping; the others are gone or stuck */
    collect_outputs(s);             /* no command claims them any more: dropped */
    s->fatal = s->shutdown = true;
    return true;
}

/* The watchdog's last resort (daemon_internal.h): rank 0 stays stuck in the engine although the
 * communicator was aborted, and nothing can unwind it. The clients are answered, ZeroMQ's I/O
 * thread is given a moment to put the replies on the wire (the context cannot be terminated
 * while the stuck thread holds its sockets), the follower processes are killed, and the process
 * ends: the one place the daemon exits by itself, as the alternative is a worker that hangs. */
static void last_resort(void *arg, const char *why) {
    server *s = arg;
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
static void step(server *s) {
    relay(s, RW_OP_STEP, 0, NULL, 0);
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
        abort_everything(s);
        return;
    }
    collect_outputs(s);
    stream_partials(s);
}

static void periodic(server *s) {
    double now = rw_now();
    if (now - s->t_poll < POLL_PERIOD_S) return;
    s->t_poll = now;
    rw_err e;
    if (session_open(s) && rw_sync_session_poll(s->r->sess, &e) != RW_OK) {
        RW_LOGW("update session ended: %s", e.msg);
        session_ended(s);
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

static void announce(server *s) {
    rw_sync_info i;
    rw_sync_session_info(s->r->sess, &i);
    printf(
        "{\"event\": \"ready\", \"control\": \"%s\", \"pid\": %d, \"tp\": %d, \"device\": \"%s\", "
        "\"version\": \"%s\", \"state\": \"%s\"}\n",
        s->endpoint, (int)getpid(), s->r->tp, rw_backend_str(s->o->backend), i.version,
        worker_state(s));
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

int rw_server_run(const rw_dopts *o, rw_rank *r0, void *zctx, rw_peers *peers,
                  volatile sig_atomic_t *stop) {
    server sv;
    server *s = &sv;
    memset(s, 0, sizeof *s);
    s->o = o;
    s->r = r0;
    s->peers = peers;
    s->next_eid = 1;
    s->t_start = rw_now();
    int rc = 1;
    rw_err e;
    if (rw_mw_create(&s->w, &e) != RW_OK || rw_mw_create(&s->w2, &e) != RW_OK ||
        !push_tag(s, r0->version0)) {
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
    if (zmq_bind(s->ctl, o->control) != 0) {
        fprintf(stderr, "rw-worker: cannot bind the control socket to %s: %s\n", o->control,
                zmq_strerror(errno));
        goto out;
    }
    size_t elen = sizeof s->endpoint;
    zmq_getsockopt(s->ctl, ZMQ_LAST_ENDPOINT, s->endpoint, &elen);
    RW_LOGI("serving on %s (tp %d, %s)", s->endpoint, r0->tp, rw_backend_str(o->backend));
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
    const int64_t inflight = requests_in_flight(s);
    abort_everything(s);
    if (s->shutdown_zm) {
        rw_mw_reset(s->w);
        rw_mw_reply_ok(s->w, s->shutdown_id);
        rw_mw_map(s->w, 1);
        kv_i64(s->w, "aborted", inflight);
        send_writer(s, s->shutdown_zm, s->w, NULL);
        rw_zmq_msg_free(s->shutdown_zm);
    }
    rc = s->fatal ? 1 : 0;
    RW_LOGI("shut down (%" PRId64 " request(s) aborted)", inflight);
out:
    rw_watch_stop(peers->watch);
    peers->watch = NULL;
    for (int i = 0; i < s->ngens; i++)
        gen_free(s->gens[i]);
    free(s->gens);
    free(s->tags);
    free(s->tmp);
    free(s->tok);
    free(s->peek_tok);
    free(s->peek_lp);
    rw_mw_destroy(s->w);
    rw_mw_destroy(s->w2);
    if (s->ctl) zmq_close(s->ctl);
    return rc;
}
