/* cmd_control.c - the commands that steer rank 0 and its followers without touching weights:
 * pause / resume generation, flush_cache, release_memory / resume_memory, health, stats and
 * shutdown. */
#include "server_internal.h"

#include <inttypes.h>
#include <stdio.h>
#include <string.h>

static const char *mode_str(rw_pause_mode m) {
    return m == RW_PAUSE_ABORT ? "abort" : m == RW_PAUSE_RETRACT ? "retract" : "in_place";
}

rw_status rw_srv_pause(rw_server *s, rw_srv_call *c, rw_err *err) {
    const rw_request *req = c->req;
    rw_mfields f;
    RW_CHECK(rw_mfields_init(&f, req->args, "args", err));
    char m[16];
    RW_CHECK(rw_mfields_str(&f, "mode", "abort", m, sizeof m, err));
    RW_CHECK(rw_mfields_done(&f, err));
    rw_pause_mode mode;
    RW_CHECK(rw_srv_parse_mode(m, "args.mode", &mode, err));
    const uint64_t before = s->n_finished;
    RW_CHECK(rw_engine_pause(s->r->eng, mode, err));
    rw_srv_relay(s, RW_OP_PAUSE, (uint64_t)mode, NULL, 0);
    s->user_paused = true;
    rw_srv_collect_outputs(s);
    rw_engine_stats es;
    rw_engine_stats_get(s->r->eng, &es);
    rw_mw_reset(s->w);
    rw_mw_reply_ok(s->w, req->id);
    rw_mw_map(s->w, 5);
    rw_mw_kv_bool(s->w, "paused", true);
    rw_mw_kv_str(s->w, "mode", mode_str(mode));
    rw_mw_kv_u64(s->w, "aborted", s->n_finished - before);
    rw_mw_kv_i64(s->w, "running", es.running);
    rw_mw_kv_i64(s->w, "waiting", es.waiting);
    return RW_OK;
}

rw_status rw_srv_resume(rw_server *s, rw_srv_call *c, rw_err *err) {
    const rw_request *req = c->req;
    RW_CHECK(rw_mfields_none(req->args, "args", err));
    if (rw_srv_session_open(s))
        RW_FAIL(err, RW_E_STATE,
                "resume: an update session is open; generation resumes at "
                "commit_update or abort_update");
    if (rw_engine_paused(s->r->eng)) {
        RW_CHECK(rw_engine_resume(s->r->eng, err));
        rw_srv_relay(s, RW_OP_RESUME, 0, NULL, 0);
    }
    s->user_paused = false;
    rw_mw_reset(s->w);
    rw_mw_reply_ok(s->w, req->id);
    rw_mw_map(s->w, 1);
    rw_mw_kv_bool(s->w, "paused", false);
    return RW_OK;
}

rw_status rw_srv_flush(rw_server *s, rw_srv_call *c, rw_err *err) {
    const rw_request *req = c->req;
    RW_CHECK(rw_mfields_none(req->args, "args", err));
    rw_engine_stats es;
    rw_engine_stats_get(s->r->eng, &es);
    if (es.running > 0)
        RW_FAIL(err, RW_E_BUSY,
                "flush_cache: %d request(s) are running (let them finish, abort them, or pause "
                "with mode abort or retract first)",
                es.running);
    RW_CHECK(rw_engine_flush_cache(s->r->eng, err));
    rw_op_msg rep[RW_DAEMON_MAX_TP];
    rw_status st = rw_srv_relay_wait(s, -1, RW_OP_FLUSH, 0, NULL, 0, NULL, rep, err);
    if (st == RW_OK) st = rw_srv_reps_status(s, rep, err);
    rw_srv_free_reps(s, rep);
    RW_CHECK(st);
    rw_mw_reset(s->w);
    rw_mw_reply_ok(s->w, req->id);
    rw_mw_map(s->w, 1);
    rw_mw_kv_bool(s->w, "flushed", true);
    return RW_OK;
}

/* ------------------------------------------------------------------------------------------ */
/* release_memory / resume_memory                                                               */
/* ------------------------------------------------------------------------------------------ */
/* release_memory (release) and resume_memory. */
static rw_status memory(rw_server *s, const rw_request *req, bool release, rw_err *err) {
    rw_mfields f;
    RW_CHECK(rw_mfields_init(&f, req->args, "args", err));
    bool weights, kv;
    RW_CHECK(rw_mfields_bool(&f, "weights", true, &weights, err));
    RW_CHECK(rw_mfields_bool(&f, "kv_cache", true, &kv, err));
    RW_CHECK(rw_mfields_done(&f, err));
    if (!weights && !kv)
        RW_FAIL(err, RW_E_INVALID_ARG, "%s: nothing selected (weights and kv_cache are false)",
                req->cmd);
    if (rw_srv_session_open(s))
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
    rw_status st = rw_srv_relay_wait(s, -1, RW_OP_MEM, flags, NULL, 0, NULL, rep, err);
    if (st == RW_OK) st = rw_srv_reps_status(s, rep, err);
    rw_srv_free_reps(s, rep);
    if (st != RW_OK) return st;
    if (!release && weights && was_w) {
        /* the fresh sessions on every rank start incomplete */
        s->followers_incomplete = s->peers->n > 0;
        rw_srv_settle_followers(s);
    }
    size_t freed = 0;
    if (release && weights && !was_w) freed += before_w;
    if (release && kv && !was_kv) freed += es.kv_bytes;
    rw_mw_reset(s->w);
    rw_mw_reply_ok(s->w, req->id);
    rw_mw_map(s->w, 4);
    rw_mw_kv_bool(s->w, "weights_released", s->r->weights_released);
    rw_mw_kv_bool(s->w, "kv_released", s->r->kv_released);
    rw_mw_kv_u64(s->w, release ? "released_bytes" : "resumed_bytes", release ? freed : 0);
    rw_mw_kv_str(s->w, "state", rw_srv_worker_state(s));
    return RW_OK;
}

/* ------------------------------------------------------------------------------------------ */
/* health / stats                                                                               */
/* ------------------------------------------------------------------------------------------ */
rw_status rw_srv_health(rw_server *s, rw_srv_call *c, rw_err *err) {
    const rw_request *req = c->req;
    RW_CHECK(rw_mfields_none(req->args, "args", err));
    rw_sync_info i;
    rw_sync_session_info(s->r->sess, &i);
    rw_mw_reset(s->w);
    rw_mw_reply_ok(s->w, req->id);
    rw_mw_map(s->w, 8);
    rw_mw_kv_str(s->w, "status", "ok");
    rw_mw_kv_str(s->w, "state", rw_srv_worker_state(s));
    rw_mw_kv_str(s->w, "version", i.version);
    rw_mw_kv_i64(s->w, "tp", s->r->tp);
    rw_mw_kv_str(s->w, "device", rw_backend_str(s->o->backend));
    rw_mw_kv_str(s->w, "precision", rw_precision_str(s->o->precision));
    rw_mw_kv_f64(s->w, "uptime_s", rw_now() - s->t_start);
    rw_mw_kv_i64(s->w, "requests_in_flight", rw_srv_requests_in_flight(s));
    return RW_OK;
}

rw_status rw_srv_stats(rw_server *s, rw_srv_call *c, rw_err *err) {
    const rw_request *req = c->req;
    RW_CHECK(rw_mfields_none(req->args, "args", err));
    rw_engine_stats es;
    rw_engine_stats_get(s->r->eng, &es);
    rw_sync_info i;
    rw_sync_session_info(s->r->sess, &i);
    rw_mw *w = s->w;
    rw_mw_reset(w);
    rw_mw_reply_ok(w, req->id);
    /* state, tp, device, precision, uptime_s, queue, throughput, memory, prefix_cache, weights,
     * latency, errors */
    rw_mw_map(w, 12);
    rw_mw_kv_str(w, "state", rw_srv_worker_state(s));
    rw_mw_kv_i64(w, "tp", s->r->tp);
    rw_mw_kv_str(w, "device", rw_backend_str(s->o->backend));
    rw_mw_kv_str(w, "precision", rw_precision_str(s->o->precision));
    rw_mw_kv_f64(w, "uptime_s", rw_now() - s->t_start);
    rw_mw_str(w, "queue");
    rw_mw_map(w, 5);
    rw_mw_kv_i64(w, "waiting", es.waiting);
    rw_mw_kv_i64(w, "running", es.running);
    rw_mw_kv_bool(w, "paused", es.paused);
    rw_mw_kv_i64(w, "commands_in_flight", s->ngens);
    rw_mw_kv_i64(w, "requests_in_flight", rw_srv_requests_in_flight(s));
    rw_mw_str(w, "throughput");
    rw_mw_map(w, 10);
    rw_mw_kv_f64(w, "generated_tokens_per_s", es.gen_tokens_per_s);
    rw_mw_kv_i64(w, "steps", es.steps);
    rw_mw_kv_f64(w, "step_seconds", es.step_s);
    rw_mw_kv_f64(w, "model_seconds", es.model_s);
    rw_mw_kv_i64(w, "prefill_tokens", es.prompt_tokens);
    rw_mw_kv_i64(w, "generated_tokens", es.generated_tokens);
    rw_mw_kv_i64(w, "preemptions", es.preemptions);
    rw_mw_kv_u64(w, "requests", s->n_requests);
    rw_mw_kv_u64(w, "requests_finished", s->n_finished);
    rw_mw_kv_u64(w, "commands", s->n_commands);
    rw_mw_str(w, "memory");
    rw_mw_map(w, 8);
    rw_mw_kv_u64(w, "weights_bytes", rw_wset_bytes(rw_model_wset(s->r->model)));
    rw_mw_kv_bool(w, "weights_released", s->r->weights_released);
    rw_mw_kv_u64(w, "kv_bytes", es.kv_bytes);
    rw_mw_kv_i64(w, "kv_blocks_total", es.kv_blocks_total);
    rw_mw_kv_i64(w, "kv_blocks_used", es.kv_blocks_used);
    rw_mw_kv_i64(w, "kv_block_size", es.kv_block_size);
    rw_mw_kv_bool(w, "kv_released", es.kv_released);
    rw_mw_kv_u64(w, "staging_bytes", i.staging_bytes);
    rw_mw_str(w, "prefix_cache");
    rw_mw_map(w, 9);
    rw_mw_kv_bool(w, "enabled", !s->o->no_prefix_cache);
    rw_mw_kv_i64(w, "hits", es.prefix_hits);
    rw_mw_kv_i64(w, "tokens_saved", es.prefix_tokens_saved);
    rw_mw_kv_i64(w, "blocks_cached", es.kv_blocks_cached);
    rw_mw_kv_i64(w, "blocks_allocated", es.kv_blocks_allocated);
    rw_mw_kv_i64(w, "blocks_evicted", es.kv_blocks_evicted);
    rw_mw_kv_i64(w, "forked_samples", es.forked_samples);
    rw_mw_kv_i64(w, "score_tokens", es.score_tokens);
    rw_mw_kv_i64(w, "prefill_tokens", es.prompt_tokens);
    rw_mw_str(w, "weights");
    rw_mw_map(w, 12);
    rw_mw_kv_str(w, "version", i.version);
    rw_mw_kv_str(w, "state", rw_sync_wstate_str(i.state));
    rw_mw_kv_u64(w, "updates", i.sessions_committed);
    rw_mw_kv_u64(w, "updates_aborted", i.sessions_aborted);
    rw_mw_kv_f64(w, "last_update_s", i.last_update_s);
    rw_mw_kv_f64(w, "last_update_gbps", i.last_update_gbps);
    rw_mw_kv_u64(w, "last_update_bytes", i.bytes);
    rw_mw_kv_f64(w, "last_update_age_s",
                 i.last_commit_time > 0 ? rw_now() - i.last_commit_time : -1);
    rw_mw_kv_bool(w, "nccl_group", i.has_group);
    rw_mw_kv_u64(w, "versions_served", s->ntags);
    rw_mw_kv_u64(w, "update_bytes_total", s->metrics.update_bytes_total);
    rw_mw_str(w, "update_seconds");
    rw_hist_write(w, &s->metrics.update_s);
    rw_mw_str(w, "latency");
    rw_mw_map(w, 3);
    rw_mw_str(w, "ttft");
    rw_hist_write(w, &s->metrics.ttft);
    rw_mw_str(w, "itl");
    rw_hist_write(w, &s->metrics.itl);
    rw_mw_str(w, "e2e");
    rw_hist_write(w, &s->metrics.e2e);
    rw_mw_kv_u64(w, "errors", s->n_errors);
    return RW_OK;
}

rw_status rw_srv_release_memory(rw_server *s, rw_srv_call *c, rw_err *err) {
    return memory(s, c->req, true, err);
}

rw_status rw_srv_resume_memory(rw_server *s, rw_srv_call *c, rw_err *err) {
    return memory(s, c->req, false, err);
}

/* shutdown: answered last, once every request in flight got its partial output. */
rw_status rw_srv_shutdown(rw_server *s, rw_srv_call *c, rw_err *err) {
    RW_CHECK(rw_mfields_none(c->req->args, "args", err));
    s->shutdown = true;
    s->shutdown_zm = c->zm;
    s->shutdown_id = c->req->id;
    c->kept = true;
    return RW_OK;
}
