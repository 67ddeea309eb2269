/* cmd_sync.c - the sync commands (RW_CMDF_SYNC: update sessions, readback, checksums) on a worker
 * of one or more ranks. The sync module's handler runs on every rank the command concerns
 * (followers first, since some of these block until every rank joined); rank 0 learns what its
 * own handler did from the typed outcome (rw_sync_outcome), the followers' answers come back as
 * their reply envelopes. Then generation follows the weights: paused while a session is open,
 * stamped with the new version at a commit, and the ranks settled after a failure. */
#include "server_internal.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* How one sync command runs on this worker. */
typedef struct sync_plan {
    rw_pause_mode pmode; /* how generation pauses for the session (begin / disk) */
    int only;            /* -1: every rank; r: rank r alone (get_weights) */
    bool was_open;       /* an update session was open before the command */
    bool implicit_disk;  /* update_weights_from_disk that opens and commits its own session */
    bool forced;         /* abort_update {force: true} without the session's token */
    rw_sync_info before; /* rank 0's session before the command (for the operator log) */
} sync_plan;

/* What the ranks answered. */
typedef struct sync_result {
    rw_status st; /* the first failure: the transport's, rank 0's or a follower's */
    int bad;      /* the rank whose answer failed (0 or a follower), -1 otherwise */
    rw_err e;     /* the message of st (unless bad == 0: rank 0's reply is its own) */
    bool ran0;    /* rank 0 ran its handler: its reply is in s->r->w */
    rw_sync_outcome o0;
    rw_op_msg rep[RW_DAEMON_MAX_TP]; /* the followers' answers */
    rw_msg *msgs[RW_DAEMON_MAX_TP];  /* ... decoded */
    rw_reply reps[RW_DAEMON_MAX_TP];
} sync_result;

/* Engine pause for an update session (unless the client paused the worker already, whose mode
 * stays in force). */
static rw_status pause_for_update(rw_server *s, rw_pause_mode mode, rw_err *err) {
    if (s->user_paused || s->update_paused) return RW_OK;
    RW_CHECK(rw_engine_pause(s->r->eng, mode, err));
    rw_srv_relay(s, RW_OP_PAUSE, (uint64_t)mode, NULL, 0);
    s->update_paused = true;
    rw_srv_collect_outputs(s);
    return RW_OK;
}

/* Generation resumes when the update's pause ends (unless the client paused the worker). */
static void lift_update_pause(rw_server *s) {
    if (!s->update_paused) return;
    s->update_paused = false;
    if (!s->user_paused) {
        rw_err e;
        rw_engine_resume(s->r->eng, &e);
        rw_srv_relay(s, RW_OP_RESUME, 0, NULL, 0);
    }
}

void rw_srv_settle_followers(rw_server *s) {
    if (!s->peers->n) return;
    rw_op_msg rep[RW_DAEMON_MAX_TP];
    rw_err e;
    rw_status st = rw_srv_relay_wait(s, -1, RW_OP_SETTLE, 0, NULL, 0, NULL, rep, &e);
    if (st != RW_OK) RW_LOGE("rank 0: %s", e.msg);
    bool incomplete = st != RW_OK;
    for (int r = 1; r <= s->peers->n; r++)
        if (rep[r].h.magic == 0 || rep[r].h.status != RW_OK || rep[r].h.a != RW_SYNC_READY)
            incomplete = true;
    s->followers_incomplete = incomplete;
    rw_srv_free_reps(s, rep);
}

void rw_srv_session_ended(rw_server *s) {
    rw_sync_info i;
    rw_sync_session_info(s->r->sess, &i);
    if (i.state == RW_SYNC_UPDATING) {
        bool intact;
        rw_err e;
        if (rw_sync_session_abort(s->r->sess, &intact, &e) != RW_OK) RW_LOGW("%s", e.msg);
    }
    rw_srv_settle_followers(s);
    rw_sync_session_info(s->r->sess, &i);
    if (i.state != RW_SYNC_READY || s->followers_incomplete) {
        /* queued and retracted requests cannot run on incomplete weights */
        rw_srv_abort_everything(s);
    }
    lift_update_pause(s);
}

/* ------------------------------------------------------------------------------------------ */
/* Operator log: update_begin / update_commit / update_abort (oplog.h)                         */
/* ------------------------------------------------------------------------------------------ */
static const char *q(const char *v, char *buf, size_t cap) {
    return rw_oplog_quote(v, strlen(v), buf, cap);
}

void rw_srv_log_abort(rw_server *s, const char *version, const char *reason, const rw_zmq_msg *zm,
                      const char *why) {
    rw_sync_info i;
    rw_sync_session_info(s->r->sess, &i);
    char v[300], w[700], who[160];
    rw_oplog("update_abort",
             "version=%s reason=%s bytes=%llu buckets=%llu seconds=%.3f state=%s%s%s%s%s",
             q(version, v, sizeof v), reason, (unsigned long long)i.bytes,
             (unsigned long long)i.buckets, i.session_s, rw_sync_wstate_str(i.state), zm ? " " : "",
             zm ? rw_srv_peer_desc(zm, who, sizeof who) : "", why ? " message=" : "",
             why ? q(why, w, sizeof w) : "");
}

static void log_outcome(rw_server *s, const rw_srv_call *c, const sync_plan *p,
                        const sync_result *r) {
    const rw_cmd cmd = c->cmd;
    char v[300], pv[300], who[160];
    rw_sync_info i;
    rw_sync_session_info(s->r->sess, &i);
    if (cmd == RW_CMD_BEGIN_UPDATE && r->st == RW_OK) {
        rw_oplog("update_begin", "version=%s previous=%s %s", q(i.new_version, v, sizeof v),
                 q(i.version, pv, sizeof pv), rw_srv_peer_desc(c->zm, who, sizeof who));
    } else if (r->st == RW_OK && (cmd == RW_CMD_COMMIT_UPDATE || p->implicit_disk)) {
        rw_oplog("update_commit", "version=%s bytes=%llu buckets=%llu seconds=%.3f %s",
                 q(i.version, v, sizeof v), (unsigned long long)i.bytes,
                 (unsigned long long)i.buckets, i.last_update_s,
                 rw_srv_peer_desc(c->zm, who, sizeof who));
    } else if ((p->was_open || p->implicit_disk) && i.state != RW_SYNC_UPDATING) {
        /* the session ended without a commit: by abort_update (forced or not), or a failure */
        const bool by_abort = cmd == RW_CMD_ABORT_UPDATE && r->st == RW_OK;
        rw_srv_log_abort(s, p->implicit_disk ? "(update_weights_from_disk)" : p->before.new_version,
                         by_abort ? (p->forced ? "forced" : "client") : "failed", c->zm,
                         by_abort ? NULL : r->e.msg);
    }
}

/* A commit that succeeded on every rank: stamp the new version, flush when asked, resume. */
static void session_committed(rw_server *s, const char *version, bool flush) {
    if (!rw_srv_push_tag(s, version)) RW_LOGE("out of memory for the version table");
    rw_sync_info si;
    rw_sync_session_info(s->r->sess, &si);
    rw_srv_metrics_update(&s->metrics, si.last_update_s, si.bytes);
    const uint64_t v = s->ntags - 1;
    rw_engine_set_weight_version(s->r->eng, v);
    rw_srv_relay(s, RW_OP_SET_VERSION, v, NULL, 0);
    s->followers_incomplete = false;
    if (flush) {
        rw_err e;
        /* requests frozen in place hold KV of the old weights: recompute it */
        if (rw_engine_paused(s->r->eng)) {
            rw_engine_pause(s->r->eng, RW_PAUSE_RETRACT, &e);
            rw_srv_relay(s, RW_OP_PAUSE, RW_PAUSE_RETRACT, NULL, 0);
        }
        if (rw_engine_flush_cache(s->r->eng, &e) != RW_OK) RW_LOGW("flush at commit: %s", e.msg);
        rw_srv_relay(s, RW_OP_FLUSH, 0, NULL, 0);
    }
    lift_update_pause(s);
}

/* The daemon's own fields of a sync command, taken out of the args before a handler sees them:
 * pause_mode (how generation pauses for the session) and get_weights' rank (which rank's
 * slice). Refuses a command while the weights' memory is released. */
static rw_status own_args(rw_server *s, rw_srv_call *c, sync_plan *p, rw_err *err) {
    const rw_cmd cmd = c->cmd;
    p->pmode = RW_PAUSE_RETRACT;
    p->only = -1;
    if (s->r->weights_released && cmd != RW_CMD_GET_WEIGHT_VERSION && cmd != RW_CMD_ABORT_UPDATE)
        RW_FAIL(err, RW_E_STATE, "%s: the weights' memory is released (resume_memory first)",
                c->req->cmd);
    const char *key = NULL;
    if (cmd == RW_CMD_BEGIN_UPDATE || cmd == RW_CMD_UPDATE_WEIGHTS_FROM_DISK) {
        const rw_mobj *pm = rw_mobj_get(c->req->args, "pause_mode");
        if (pm) {
            char m[16];
            RW_CHECK(rw_mobj_strcpy(pm, "args.pause_mode", m, sizeof m, err));
            RW_CHECK(rw_srv_parse_mode(m, "args.pause_mode", &p->pmode, err));
            key = "pause_mode";
            c->taken |= RW_OPK_PAUSE_MODE;
        }
    } else if (cmd == RW_CMD_GET_WEIGHTS) {
        const rw_mobj *rk = rw_mobj_get(c->req->args, "rank");
        p->only = 0;
        if (rk) {
            uint64_t r;
            RW_CHECK(rw_mobj_u64(rk, "args.rank", &r, err));
            if (r >= (uint64_t)s->r->tp)
                RW_FAIL(err, RW_E_RANGE, "args.rank: %" PRIu64 " (this worker has %d ranks)", r,
                        s->r->tp);
            p->only = (int)r;
            key = "rank";
            c->taken |= RW_OPK_RANK;
        }
    }
    if (key) RW_CHECK(rw_request_take_args(c->msg, c->req, &key, 1, NULL, err));
    /* the session's owner, before any rank runs the command (followers first: a refusal found
     * by rank 0's handler afterwards would come too late) */
    rw_status st = rw_sync_check_owner(s->r->sess, c->req, &p->forced, err);
    if (st != RW_OK) {
        char who[160], cmdq[100];
        rw_oplog_limited(&s->rl_auth, "auth_refused", "cmd=%s %s reason=session_token",
                         q(c->req->cmd, cmdq, sizeof cmdq),
                         rw_srv_peer_desc(c->zm, who, sizeof who));
    }
    return st;
}

/* Runs the command: the request as it came to the followers it concerns, then rank 0's handler,
 * then the followers' answers. */
static void run_ranks(rw_server *s, const rw_srv_call *c, const sync_plan *p, sync_result *r) {
    memset(r, 0, sizeof *r);
    r->bad = -1;
    rw_err_clear(&r->e);
    rw_sync_frames in;
    rw_zmq_msg_frames(c->zm, &in);
    bool sent = false;
    uint64_t seq = 0;
    if (s->peers->n && p->only != 0) {
        size_t len;
        const void *env = rw_zmq_msg_envelope(c->zm, &len);
        rw_op_hdr h = rw_op_make(RW_OP_SYNC, ++s->seq, c->taken, 0, RW_OPF_REPLY);
        seq = h.seq;
        r->st = rw_peers_send(s->peers, p->only, &h, env, len, &in, &r->e);
        sent = r->st == RW_OK;
    }
    rw_status st0 = RW_OK;
    rw_err e0;
    rw_err_clear(&e0);
    if (r->st == RW_OK && p->only <= 0) {
        st0 = rw_rank_sync(s->r, c->req, &in, &r->o0, &e0);
        r->ran0 = true;
    }
    if (sent && (r->st = rw_peers_gather(s->peers, p->only, seq, s->o->rank_timeout_s, r->rep,
                                         &r->e)) != RW_OK)
        RW_LOGE("%s: %s", c->req->cmd, r->e.msg);
    if (r->st == RW_OK && r->ran0 && st0 != RW_OK) {
        r->bad = 0;
        r->st = st0;
        r->e = e0; /* for the operator log (the client gets rank 0's own reply) */
    }
    for (int k = 1; r->st == RW_OK && k <= s->peers->n; k++) {
        if (r->rep[k].h.magic == 0) continue;
        size_t plen;
        const void *pl = rw_op_payload(&r->rep[k], &plen);
        rw_err de;
        if (!pl || rw_msg_decode_reply(pl, plen, &r->msgs[k], &r->reps[k], &de) != RW_OK) {
            r->st =
                RW_ERR(&r->e, RW_E_INTERNAL, "rank %d: undecodable answer to %s", k, c->req->cmd);
            r->bad = k;
        } else if (!r->reps[k].ok) {
            r->st = rw_err_set(&r->e, r->reps[k].status, __FILE__, __LINE__, "rank %d: %s", k,
                               r->reps[k].message);
            r->bad = k;
        }
    }
}

static void free_result(rw_server *s, sync_result *r) {
    rw_sync_outcome_free(&r->o0);
    for (int k = 0; k <= s->peers->n; k++)
        rw_msg_free(r->msgs[k]);
    rw_srv_free_reps(s, r->rep);
}

/* A follower's readback: its reply and frame as they are. */
static void forward_readback(rw_server *s, const rw_srv_call *c, const rw_op_msg *rep) {
    size_t plen;
    const void *pl = rw_op_payload(rep, &plen);
    rw_sync_frames fr;
    rw_op_frames(rep, &fr);
    rw_mw_reset(s->w);
    rw_mw_raw(s->w, pl, plen);
    rw_sync_out_frame of = {0};
    if (fr.n && (of.data = malloc(fr.len[0] ? fr.len[0] : 1))) {
        memcpy(of.data, fr.data[0], fr.len[0]);
        of.len = fr.len[0];
        rw_srv_send(s, c->zm, s->w, &of);
    } else if (fr.n) {
        rw_srv_reply_err(s, c->zm, c->req->id, RW_E_OOM,
                         "get_weights: out of memory for the frame");
    } else {
        rw_srv_send(s, c->zm, s->w, NULL);
    }
}

/* The combined reply: the first failure (a follower's named by its rank, rank 0's as its handler
 * wrote it), a follower's readback as it is, checksums of every rank, or rank 0's reply. */
static void answer(rw_server *s, const rw_srv_call *c, const sync_plan *p, sync_result *r) {
    if (r->bad == 0) {
        s->n_errors++;
        rw_srv_send(s, c->zm, s->r->w, NULL); /* the handler's own error reply */
    } else if (r->st != RW_OK) {
        rw_srv_reply_err(s, c->zm, c->req->id, r->st, r->e.msg);
    } else if (p->only > 0) {
        forward_readback(s, c, &r->rep[p->only]);
    } else if (c->cmd == RW_CMD_CHECKSUM && s->peers->n) {
        r->st = rw_sync_checksum_reply(s->r->sess, c->req->id, &r->o0, &r->reps[1],
                                       (size_t)s->peers->n, s->w, &r->e);
        if (r->st == RW_OK)
            rw_srv_send(s, c->zm, s->w, NULL);
        else
            rw_srv_reply_err(s, c->zm, c->req->id, r->st, r->e.msg);
    } else {
        rw_srv_send(s, c->zm, s->r->w, &r->o0.frame);
    }
}

/* What the command means for generation: pause while a session is open, the new version at a
 * commit, the ranks settled after a failure. */
static void after(rw_server *s, const rw_srv_call *c, const sync_plan *p, const sync_result *r) {
    const rw_cmd cmd = c->cmd;
    const bool update = rw_cmd_flags(cmd) & RW_CMDF_UPDATE;
    if (cmd == RW_CMD_BEGIN_UPDATE) {
        rw_err e;
        if (r->st == RW_OK) {
            if (pause_for_update(s, p->pmode, &e) != RW_OK) RW_LOGE("begin_update: %s", e.msg);
        } else if (!p->was_open && (rw_srv_session_open(s) || s->peers->n)) {
            rw_srv_session_ended(s); /* ranks that did open a session close it again */
        }
    } else if (update && r->st != RW_OK) {
        if (p->was_open || p->implicit_disk || rw_srv_session_open(s)) rw_srv_session_ended(s);
    } else if (cmd == RW_CMD_ABORT_UPDATE) {
        if (r->st == RW_OK || rw_srv_session_open(s) || s->update_paused) rw_srv_session_ended(s);
    }
    if (r->st == RW_OK && (cmd == RW_CMD_COMMIT_UPDATE || p->implicit_disk)) {
        /* an implicit disk session's flush_cache works as begin_update's (docs/PROTOCOL.md) */
        session_committed(s, r->o0.version, r->o0.flush_cache);
    }
}

rw_status rw_srv_sync(rw_server *s, rw_srv_call *c, rw_err *err) {
    sync_plan p;
    memset(&p, 0, sizeof p);
    RW_CHECK(own_args(s, c, &p, err));
    p.was_open = rw_srv_session_open(s);
    rw_sync_session_info(s->r->sess, &p.before);
    p.implicit_disk = c->cmd == RW_CMD_UPDATE_WEIGHTS_FROM_DISK && !p.was_open;
    if (p.implicit_disk) RW_CHECK(pause_for_update(s, p.pmode, err));
    sync_result r;
    run_ranks(s, c, &p, &r);
    answer(s, c, &p, &r);
    c->replied = true;
    after(s, c, &p, &r);
    log_outcome(s, c, &p, &r);
    free_result(s, &r);
    return RW_OK;
}
