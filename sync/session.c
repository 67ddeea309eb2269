/* session.c - the update session of one worker rank: begin -> buckets -> commit | abort, with the
 * protocol's invariants (every manifest validated before any byte is written; a failed or
 * aborted session leaves the previous version intact or marks the weights incomplete; commit
 * switches the version atomically for generation), and the route of each bucket: on a device
 * weight set through the pipeline (pipeline.c), on a host weight set synchronously, with the
 * source's host bytes as the staging buffer (a ZeroMQ frame is host memory already; a file
 * source is read into a host buffer of the session first). Checkpoint directories are cut into
 * buckets by disk.c.
 *
 * Checkpoint bytes are never read through the file's mapping: a file truncated while it is
 * loaded would fault (SIGBUS) there. They are read with pread (rw_st_read), so such a file fails
 * the bucket with "file shrank while loading" and the session ends as any failed one does.
 */
#include "session_internal.h"

#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <sys/random.h>

const char *rw_sync_wstate_str(rw_sync_wstate s) {
    switch (s) {
    case RW_SYNC_READY: return "ready";
    case RW_SYNC_UPDATING: return "updating";
    case RW_SYNC_INCOMPLETE: return "weights_incomplete";
    default: return "unknown";
    }
}

rw_status rw_sync_session_create(rw_wset *ws, const char *version, bool incomplete,
                                 rw_sync_session **out, rw_err *err) {
    *out = NULL;
    if (!ws) RW_FAIL(err, RW_E_INVALID_ARG, "sync session: NULL weight set");
    RW_CHECK(rw_sync_check_version_tag(version, err));
    rw_sync_session *s = calloc(1, sizeof *s);
    if (!s) RW_FAIL(err, RW_E_OOM, "sync session: out of memory");
    s->ws = ws;
    rw_tensor probe = rw_wset_final_norm(ws);
    s->place = probe.place;
    s->device = probe.device;
    pthread_mutex_init(&s->mu, NULL);
    s->state = incomplete ? RW_SYNC_INCOMPLETE : RW_SYNC_READY;
    rw_sync_strlcpy(s->version, version, sizeof s->version);
    s->timeout_s = 300;
    s->owner_check = true;
    *out = s;
    return RW_OK;
}

/* 128 bits from the kernel's CSPRNG as hex: the token that makes a session its opener's. */
static rw_status draw_token(char out[RW_SYNC_TOKEN_LEN + 1], rw_err *err) {
    uint8_t b[RW_SYNC_TOKEN_LEN / 2];
    size_t got = 0;
    while (got < sizeof b) {
        ssize_t r = getrandom(b + got, sizeof b - got, 0);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0)
            RW_FAIL(err, RW_E_INTERNAL, "begin_update: no random bytes for the session token: %s",
                    strerror(errno));
        got += (size_t)r;
    }
    rw_hex_encode(b, sizeof b, out);
    return RW_OK;
}

const char *rw_sync_session_token(const rw_sync_session *s) {
    return s->state == RW_SYNC_UPDATING ? s->token : "";
}

void rw_sync_session_set_owner_check(rw_sync_session *s, bool on) {
    s->owner_check = on;
}

void rw_sync_session_set_frame_limit(rw_sync_session *s, uint64_t bytes) {
    s->frame_limit = bytes;
}

uint64_t rw_sync_session_frame_limit(const rw_sync_session *s) {
    return s->frame_limit;
}

bool rw_sync_session_checks_owner(const rw_sync_session *s) {
    return s->owner_check;
}

bool rw_sync_session_owner_ok(const rw_sync_session *s, const char *p, size_t n) {
    return s->state == RW_SYNC_UPDATING && s->token[0] && rw_secret_equal(s->token, p, n);
}

rw_wset *rw_sync_session_wset(rw_sync_session *s) {
    return s->ws;
}

void rw_sync_session_info(const rw_sync_session *cs, rw_sync_info *out) {
    rw_sync_session *s = (rw_sync_session *)cs;
    memset(out, 0, sizeof *out);
    pthread_mutex_lock(&s->mu);
    out->state = s->state;
    memcpy(out->version, s->version, sizeof out->version);
    if (s->state == RW_SYNC_UPDATING) memcpy(out->new_version, s->new_version, sizeof out->version);
    out->flush_cache = s->flush_cache;
    out->sessions_committed = s->committed;
    out->sessions_aborted = s->aborted;
    out->buckets = s->buckets;
    out->bytes = s->bytes;
    out->last_update_s = s->last_update_s;
    out->last_update_gbps = s->last_gbps;
    out->last_commit_time = s->last_commit_time;
    out->session_s = s->state == RW_SYNC_UPDATING ? rw_now() - s->t_begin : s->t_end - s->t_begin;
    pthread_mutex_unlock(&s->mu);
    out->staging_bytes = s->staging[0] ? 2 * s->staging_bytes : 0;
    out->has_group = s->group && rw_sync_group_ok(s->group);
    if (s->group) rw_sync_strlcpy(out->group, rw_sync_group_name(s->group), sizeof out->group);
}

rw_status rw_sync_session_ready(const rw_sync_session *cs, char *version, size_t cap, rw_err *err) {
    rw_sync_session *s = (rw_sync_session *)cs;
    pthread_mutex_lock(&s->mu);
    rw_sync_wstate st = s->state;
    if (version && cap) rw_sync_strlcpy(version, s->version, cap);
    pthread_mutex_unlock(&s->mu);
    if (st == RW_SYNC_UPDATING)
        RW_FAIL(err, RW_E_BUSY, "weights: an update session is open (generation is paused)");
    if (st == RW_SYNC_INCOMPLETE)
        RW_FAIL(err, RW_E_WEIGHTS_INCOMPLETE,
                "weights: a failed or aborted update left them partly written; a full update "
                "(or reload) must succeed first");
    return RW_OK;
}

void rw_sync_session_destroy(rw_sync_session *s) {
    if (!s) return;
    if (s->state == RW_SYNC_UPDATING) {
        bool intact;
        rw_sync_session_abort(s, &intact, NULL);
    }
    rw_sync_group_destroy(s->group);
    rw_sync_pipe_free_staging(s);
    rw_sync_pipe_destroy(s);
    rw_wset_batch_destroy(s->batch);
    rw_sync_manifest_destroy(s->dm);
    free(s->bounce);
    free(s->pieces);
    pthread_mutex_destroy(&s->mu);
    free(s);
}

rw_status rw_sync_session_release(rw_sync_session *s, rw_err *err) {
    if (s->state == RW_SYNC_UPDATING)
        RW_FAIL(err, RW_E_STATE, "sync session: cannot release staging while an update is open");
    rw_sync_pipe_free_staging(s);
    return RW_OK;
}

/* ------------------------------------------------------------------------------------------ */
/* Session state machine                                                                        */
/* ------------------------------------------------------------------------------------------ */
rw_status rw_sync_session_begin(rw_sync_session *s, const rw_sync_begin_args *a, rw_err *err) {
    if (!a) RW_FAIL(err, RW_E_INVALID_ARG, "begin_update: NULL arguments");
    if (s->state == RW_SYNC_UPDATING)
        RW_FAIL(err, RW_E_STATE, "begin_update: an update session (to '%s') is already open",
                s->new_version);
    RW_CHECK(rw_sync_check_version_tag(a->version, err));
    uint64_t bucket = a->bucket_bytes ? a->bucket_bytes : RW_SYNC_DEFAULT_BUCKET;
    if (bucket > (64ull << 30))
        RW_FAIL(err, RW_E_RANGE, "begin_update: bucket_bytes %" PRIu64 " (limit 64 GiB)", bucket);
    double timeout = a->timeout_s > 0 ? a->timeout_s : 300;
    char token[RW_SYNC_TOKEN_LEN + 1];
    RW_CHECK(draw_token(token, err));
    if (s->place == RW_PLACE_DEVICE) RW_CHECK(rw_sync_pipe_reserve(s, bucket, err));
    s->staging_bytes = s->place == RW_PLACE_DEVICE ? s->staging_bytes : bucket;
    s->was_incomplete = s->state == RW_SYNC_INCOMPLETE;
    s->written = false;
    s->timeout_s = timeout;
    s->t_active = rw_now();
    s->slot_next = 0;
    s->have_deferred = false;
    rw_wset_mark_clear(s->ws);
    pthread_mutex_lock(&s->mu);
    s->t_begin = s->t_active; /* read by rw_sync_session_info under mu */
    s->state = RW_SYNC_UPDATING;
    rw_sync_strlcpy(s->new_version, a->version, sizeof s->new_version);
    memcpy(s->token, token, sizeof s->token);
    s->flush_cache = a->flush_cache;
    s->buckets = s->bytes = 0;
    memset(&s->stats, 0, sizeof s->stats);
    s->stats.phase_since = rw_now();
    pthread_mutex_unlock(&s->mu);
    return RW_OK;
}

/* Ends the open session without a version change. */
static void end_aborted(rw_sync_session *s, bool *intact) {
    bool keep = !s->written && !s->was_incomplete;
    pthread_mutex_lock(&s->mu);
    s->t_end = rw_now();
    s->state = keep ? RW_SYNC_READY : RW_SYNC_INCOMPLETE;
    s->aborted++;
    pthread_mutex_unlock(&s->mu);
    *intact = keep;
}

rw_status rw_sync_session_abort(rw_sync_session *s, bool *intact, rw_err *err) {
    if (s->state != RW_SYNC_UPDATING)
        RW_FAIL(err, RW_E_STATE, "abort_update: no update session is open");
    /* the trainer gave up: a receive still waiting for its broadcast gets a short grace, then
     * its communicator is aborted (the group must be re-created) */
    rw_err e2;
    s->hard_deadline = rw_now() + (s->timeout_s < 5 ? s->timeout_s : 5);
    rw_status st = rw_sync_pipe_wait_all(s, &e2);
    s->hard_deadline = 0;
    if (st != RW_OK) RW_LOGW("abort_update: %s", e2.msg);
    end_aborted(s, intact);
    return RW_OK;
}

/* Aborts the session after a failure and appends what that means to the error message. */
static rw_status fail_session(rw_sync_session *s, rw_status st, rw_err *err) {
    rw_err e2;
    if (rw_sync_pipe_wait_all(s, &e2) != RW_OK) RW_LOGW("sync session: while aborting: %s", e2.msg);
    bool intact;
    end_aborted(s, &intact);
    if (err) {
        char tmp[sizeof err->msg];
        snprintf(tmp, sizeof tmp, "%s; update aborted: %s", err->msg,
                 intact ? "nothing was written, the previous version still serves"
                        : "weights are incomplete until a full update succeeds");
        memcpy(err->msg, tmp, sizeof tmp);
    }
    /* the message names what failed already ("update_weights: ...", "sync session: ...") */
    RW_LOGW("%s", err ? err->msg : rw_status_str(st));
    return st;
}

rw_status rw_sync_session_fail(rw_sync_session *s, rw_status st, rw_err *err) {
    if (st == RW_OK || s->state != RW_SYNC_UPDATING) return st;
    return fail_session(s, st, err);
}

rw_status rw_sync_session_poll(rw_sync_session *s, rw_err *err) {
    if (s->state != RW_SYNC_UPDATING) return RW_OK;
    double now = rw_now();
    bool active = false;
    rw_status st = rw_sync_pipe_poll(s, &active, err);
    if (st != RW_OK) return fail_session(s, st, err);
    if (active) return RW_OK;
    if (now - s->t_active > s->timeout_s) {
        st =
            RW_ERR(err, RW_E_TIMEOUT, "sync session: no update command for %.1f s (timeout %.1f s)",
                   now - s->t_active, s->timeout_s);
        return fail_session(s, st, err);
    }
    return RW_OK;
}

/* ------------------------------------------------------------------------------------------ */
/* Buckets                                                                                      */
/* ------------------------------------------------------------------------------------------ */
double rw_sync_mark(rw_sync_session *s, rw_sync_phase next, double *acc) {
    double now = rw_now();
    pthread_mutex_lock(&s->mu);
    if (acc) *acc += now - s->stats.phase_since;
    s->stats.phase = next;
    s->stats.phase_since = now;
    pthread_mutex_unlock(&s->mu);
    return now;
}

const char *rw_sync_phase_str(rw_sync_phase p) {
    switch (p) {
    case RW_SYNC_PH_IDLE: return "idle";
    case RW_SYNC_PH_VALIDATE: return "validate";
    case RW_SYNC_PH_WAIT: return "wait-for-record";
    case RW_SYNC_PH_PREPARE: return "prepare";
    case RW_SYNC_PH_BUFFERS: return "table-buffers";
    case RW_SYNC_PH_RECV: return "post-receive";
    case RW_SYNC_PH_LAUNCH: return "launch";
    case RW_SYNC_PH_DEFERRED: return "deferred-apply";
    case RW_SYNC_PH_COMMIT: return "commit-wait";
    }
    return "?";
}

void rw_sync_session_stats(rw_sync_session *s, rw_sync_sstats *out) {
    pthread_mutex_lock(&s->mu);
    *out = s->stats;
    pthread_mutex_unlock(&s->mu);
}

rw_status rw_sync_make_pieces(rw_sync_session *s, const rw_sync_manifest *m, const void *base,
                              rw_place place, rw_err *err) {
    size_t n = rw_sync_manifest_count(m);
    if (n > s->pieces_cap) {
        rw_piece *p = realloc(s->pieces, n * sizeof *p);
        if (!p) RW_FAIL(err, RW_E_OOM, "update_weights: out of memory for %zu pieces", n);
        s->pieces = p;
        s->pieces_cap = n;
    }
    for (size_t i = 0; i < n; i++)
        s->pieces[i] = rw_sync_tensor_piece(rw_sync_manifest_at(m, i), base, place);
    return RW_OK;
}

/* Everything that can be checked before a byte is written; leaves the pieces in s->pieces. */
static rw_status validate_bucket(rw_sync_session *s, const rw_sync_manifest *m,
                                 const rw_sync_source *src, rw_err *err) {
    RW_CHECK(rw_sync_manifest_check(m, err));
    uint64_t nb = rw_sync_manifest_bytes(m);
    if (src->nbytes != nb)
        RW_FAIL(err, RW_E_SHAPE,
                "update_weights: the manifest describes %" PRIu64 " bytes but the %s transport "
                "delivered %" PRIu64 " (truncated or extra frame data)",
                nb, src->name, src->nbytes);
    /* host weight sets have no staging buffer, but the announced size binds them too: the
     * same trainer must get the same answer from a CPU and a CUDA worker */
    if (nb > s->staging_bytes)
        RW_FAIL(err, RW_E_RANGE,
                "update_weights: bucket of %" PRIu64 " bytes is larger than announced by "
                "begin_update (bucket_bytes %" PRIu64 ", the staging buffer size)",
                nb, s->staging_bytes);
    if (s->place == RW_PLACE_HOST && src->kind == RW_SYNC_SRC_NCCL)
        RW_FAIL(err, RW_E_UNSUPPORTED,
                "update_weights: the %s transport needs a CUDA weight set (this one is on the "
                "host)",
                src->name);
    /* pieces point where they will be applied from (host bytes, the host buffer a file source
     * is read into, or the staging buffer the receive will fill); nothing is read here */
    const void *base = s->staging[s->slot_next % 2];
    if (s->place == RW_PLACE_HOST && src->kind == RW_SYNC_SRC_HOST) {
        base = src->host;
    } else if (s->place == RW_PLACE_HOST) {
        if (nb > s->bounce_cap) {
            free(s->bounce);
            s->bounce_cap = 0;
            s->bounce = malloc(nb ? (size_t)nb : 1);
            if (!s->bounce)
                RW_FAIL(err, RW_E_OOM,
                        "update_weights: out of memory for a %" PRIu64 "-byte read buffer", nb);
            s->bounce_cap = (size_t)nb;
        }
        base = s->bounce;
    }
    RW_CHECK(rw_sync_make_pieces(s, m, base, s->place, err));
    for (size_t i = 0; i < rw_sync_manifest_count(m); i++)
        RW_CHECK(rw_wset_validate_piece(s->ws, &s->pieces[i], err));
    return RW_OK;
}

rw_status rw_sync_batch_ready(rw_sync_session *s, rw_err *err) {
    if (!s->batch) RW_CHECK(rw_wset_batch_create(&s->batch, err));
    return RW_OK;
}

/* Host weight set: the pieces in s->pieces applied straight from the source's bytes. */
static rw_status apply_host(rw_sync_session *s, size_t n, rw_err *err) {
    if (n == 0) return RW_OK;
    RW_CHECK(rw_sync_batch_ready(s, err));
    s->written = true;
    RW_CHECK(rw_wset_batch_prepare(s->ws, s->pieces, n, false, NULL, s->batch, NULL, err));
    return rw_wset_batch_launch(s->ws, s->batch, NULL, NULL, NULL, err);
}
rw_status rw_sync_session_apply(rw_sync_session *s, const rw_sync_manifest *m, rw_sync_source *src,
                                rw_sync_bucket_result *out, rw_err *err) {
    if (out) memset(out, 0, sizeof *out);
    if (s->state != RW_SYNC_UPDATING)
        RW_FAIL(err, RW_E_STATE, "update_weights: no update session is open (begin_update first)");
    double t0 = rw_now();
    s->t_active = t0;
    rw_status st = RW_OK;
    /* the bucket before, when its apply waited for its bytes, goes first (stream order) */
    if (s->have_deferred) {
        st = rw_sync_pipe_apply_deferred(s, err);
        if (st != RW_OK) return fail_session(s, st, err);
    }
    pthread_mutex_lock(&s->mu);
    s->stats.phase = RW_SYNC_PH_VALIDATE;
    s->stats.phase_since = rw_now();
    s->stats.bucket = s->slot_next;
    pthread_mutex_unlock(&s->mu);
    st = validate_bucket(s, m, src, err);
    if (st != RW_OK) return fail_session(s, st, err);
    uint64_t nb = rw_sync_manifest_bytes(m), idx = s->slot_next;
    bool applied = true;
    if (s->place == RW_PLACE_HOST) {
        /* a file source: its bytes into the host buffer the pieces point at, before anything
         * is written (a failed read leaves the weights as they were) */
        if (src->kind == RW_SYNC_SRC_FILE) {
            rw_sync_mark(s, RW_SYNC_PH_RECV, &s->stats.validate_s);
            st = src->read_at(src, s->bounce, 0, (size_t)nb, err);
            rw_sync_mark(s, RW_SYNC_PH_PREPARE, &s->stats.recv_s);
        } else {
            rw_sync_mark(s, RW_SYNC_PH_PREPARE, &s->stats.validate_s);
        }
        if (st == RW_OK) st = apply_host(s, rw_sync_manifest_count(m), err);
        rw_sync_mark(s, RW_SYNC_PH_IDLE, &s->stats.prepare_s);
    } else {
        applied = false; /* in flight on the device streams */
        st = rw_sync_pipe_apply(s, m, src, err);
    }
    if (st != RW_OK) {
        rw_sync_mark(s, RW_SYNC_PH_IDLE, NULL);
        return fail_session(s, st, err);
    }
    s->slot_next++;
    double dt = rw_now() - t0;
    pthread_mutex_lock(&s->mu);
    s->buckets++;
    s->bytes += nb;
    s->stats.buckets++;
    s->stats.pieces += rw_sync_manifest_count(m);
    s->stats.apply_s += dt;
    if (dt > s->stats.max_apply_s) s->stats.max_apply_s = dt;
    pthread_mutex_unlock(&s->mu);
    s->t_active = rw_now();
    if (out) {
        out->index = idx;
        out->tensors = rw_sync_manifest_count(m);
        out->bytes = nb;
        out->applied = applied;
    }
    return RW_OK;
}

rw_status rw_sync_session_commit(rw_sync_session *s, rw_sync_commit_result *out, rw_err *err) {
    if (out) memset(out, 0, sizeof *out);
    if (s->state != RW_SYNC_UPDATING)
        RW_FAIL(err, RW_E_STATE, "commit_update: no update session is open");
    rw_status st = RW_OK;
    if (s->have_deferred) st = rw_sync_pipe_apply_deferred(s, err);
    rw_sync_mark(s, RW_SYNC_PH_COMMIT, NULL);
    if (st == RW_OK) st = rw_sync_pipe_wait_all(s, err);
    rw_sync_mark(s, RW_SYNC_PH_IDLE, &s->stats.commit_wait_s);
    if (st != RW_OK) return fail_session(s, st, err);
    if (s->was_incomplete) {
        char missing[RW_SYNC_MAX_NAME];
        missing[0] = 0;
        if (!rw_wset_complete(s->ws, missing, sizeof missing)) {
            st = RW_ERR(err, RW_E_WEIGHTS_INCOMPLETE,
                        "commit_update: the weights were incomplete before this session and it "
                        "did not write all of them (first missing: %s)",
                        missing[0] ? missing : "?");
            return fail_session(s, st, err);
        }
    }
    double now = rw_now(), dt = now - s->t_begin;
    pthread_mutex_lock(&s->mu);
    s->t_end = now;
    memcpy(s->version, s->new_version, sizeof s->version);
    s->state = RW_SYNC_READY;
    s->committed++;
    s->last_update_s = dt;
    s->last_gbps = dt > 0 ? (double)s->bytes / dt / 1e9 : 0;
    s->last_commit_time = now;
    if (out) {
        memcpy(out->version, s->version, sizeof out->version);
        out->flush_cache = s->flush_cache;
        out->buckets = s->buckets;
        out->bytes = s->bytes;
        out->seconds = dt;
    }
    pthread_mutex_unlock(&s->mu);
    return RW_OK;
}

/* ------------------------------------------------------------------------------------------ */
/* NCCL group                                                                                   */
/* ------------------------------------------------------------------------------------------ */
rw_status rw_sync_session_init_group(rw_sync_session *s, const uint8_t id[RW_NCCL_ID_BYTES],
                                     int world, int rank, const char *name, double timeout_s,
                                     rw_err *err) {
    if (s->place != RW_PLACE_DEVICE)
        RW_FAIL(
            err, RW_E_UNSUPPORTED,
            "init_weights_update_group: NCCL needs a CUDA weight set (this one is on the host)");
    if (rw_sync_pipe_busy(s))
        RW_FAIL(err, RW_E_BUSY,
                "init_weights_update_group: buckets are in flight on the current group");
    rw_sync_group_destroy(s->group);
    s->group = NULL;
    return rw_sync_group_create(id, world, rank, name, s->device, timeout_s, &s->group, err);
}

rw_sync_group *rw_sync_session_group(rw_sync_session *s, const char *name) {
    if (!s->group) return NULL;
    if (name && name[0] && strcmp(name, rw_sync_group_name(s->group))) return NULL;
    return s->group;
}
