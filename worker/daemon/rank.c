/* rank.c - one rank of the worker: its set-up (config, model on its communicator, weights,
 * engine, update session) and the rank-level actions every rank runs the same way (memory release
 * and resume, a fresh update session, a sync command). */
#include "rank.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef RW_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

/* A version tag from free text: printable ASCII, at most RW_SYNC_MAX_VERSION characters (the
 * tail is kept, it is the informative part of a path). */
static void make_tag(char *dst, const char *prefix, const char *text) {
    char buf[4096];
    snprintf(buf, sizeof buf, "%s%s", prefix, text);
    for (char *p = buf; *p; p++)
        if (*p < 0x21 || *p > 0x7e) *p = '_';
    size_t n = strlen(buf);
    const char *s = n > RW_SYNC_MAX_VERSION ? buf + (n - RW_SYNC_MAX_VERSION) : buf;
    snprintf(dst, RW_SYNC_MAX_VERSION + 1, "%s", s);
}

/* Appends to a failed CUDA rank start-up what is needed to understand it: which device, and how
 * much of its memory is free now (when a context can be made at all), plus the memory options. */
static void explain_cuda_failure(const rw_dopts *o, int rank, rw_err *err) {
#ifdef RW_HAVE_CUDA
    if (!err || o->backend != RW_BACKEND_CUDA) return;
    if (err->status != RW_E_CUDA && err->status != RW_E_OOM && err->status != RW_E_NCCL) return;
    const int dev = rw_dopts_device(o, rank);
    int ndev = rw_cuda_device_count();
    size_t fr = 0, tot = 0;
    char info[320];
    if (ndev == 0) {
        snprintf(info, sizeof info, "no CUDA device is visible");
    } else if (dev >= ndev) {
        snprintf(info, sizeof info, "CUDA device %d does not exist (%d visible)", dev, ndev);
    } else if (cudaSetDevice(dev) == cudaSuccess && cudaMemGetInfo(&fr, &tot) == cudaSuccess) {
        snprintf(info, sizeof info, "CUDA device %d (of %d): %.0f MiB free of %.0f MiB", dev, ndev,
                 (double)fr / 1048576.0, (double)tot / 1048576.0);
    } else {
        (void)cudaGetLastError();
        snprintf(info, sizeof info,
                 "CUDA device %d (of %d): no context can be made on it (its memory is probably "
                 "taken by other processes: see nvidia-smi)",
                 dev, ndev);
    }
    size_t n = strlen(err->msg);
    snprintf(err->msg + n, sizeof err->msg - n,
             "; %s; a rank's KV cache takes --kv-fraction %.2g of the memory free after its "
             "weights unless --kv-mb gives its size",
             info, o->kv_fraction);
#else
    (void)o;
    (void)rank;
    (void)err;
#endif
}

rw_status rw_rank_open(const rw_dopts *o, int rank, rw_comm *comm, rw_rank **out, rw_err *err) {
    *out = NULL;
    rw_rank *r = calloc(1, sizeof *r);
    if (!r) {
        rw_comm_destroy(comm);
        RW_FAIL(err, RW_E_OOM, "rank %d: out of memory", rank);
    }
    r->rank = rank;
    r->tp = o->tp;
    r->comm = comm;
    rw_status st;
    char path[PATH_MAX];
    if (o->model_dir)
        snprintf(path, sizeof path, "%s/config.json", o->model_dir);
    else
        snprintf(path, sizeof path, "%s", o->config_path);
    RW_CHECKGOTO(rw_config_load(path, &r->cfg, err), st, fail);
    rw_model_opts mo = {o->backend, rw_dopts_device(o, rank), o->tp, rank, comm, o->precision};
    RW_CHECKGOTO(rw_model_create(&r->cfg, &mo, &r->model, err), st, fail);
    bool incomplete = false;
    if (o->model_dir) {
        RW_CHECKGOTO(rw_model_load_ckpt(r->model, o->model_dir, err), st, fail);
        make_tag(r->version0, "disk:", o->model_dir);
    } else if (o->random_weights) {
        RW_CHECKGOTO(rw_model_load_random(r->model, o->seed, 0.0f, err), st, fail);
        char s[32];
        snprintf(s, sizeof s, "%llu", (unsigned long long)o->seed);
        make_tag(r->version0, "random:", s);
    } else {
        incomplete = true;
        make_tag(r->version0, "", "none");
    }
    rw_engine_opts eo = rw_engine_opts_default();
    if (o->max_batch > 0) eo.max_running = o->max_batch;
    if (o->max_batch_tokens > 0) eo.max_batch_tokens = o->max_batch_tokens;
    if (o->kv_mb > 0) eo.kv_bytes = (size_t)(o->kv_mb * 1048576.0);
    eo.kv_fraction = o->kv_fraction;
    eo.prefix_sharing = !o->no_prefix_cache;
    RW_CHECKGOTO(rw_engine_create(r->model, &eo, &r->eng, err), st, fail);
    {
        rw_engine_stats es;
        rw_engine_stats_get(r->eng, &es);
        RW_LOGI("rank %d: KV cache of %.1f MiB (%lld blocks of %d tokens)%s", rank,
                (double)es.kv_bytes / 1048576.0, (long long)es.kv_blocks_total, es.kv_block_size,
                o->kv_mb > 0 ? "" : ", sized from the free memory");
    }
    RW_CHECKGOTO(
        rw_sync_session_create(rw_model_wset(r->model), r->version0, incomplete, &r->sess, err), st,
        fail);
    /* a follower's sessions are rank 0's: it checked each request's session token (protocol 2)
     * before relaying it, and this rank's session drew a token of its own */
    rw_sync_session_set_owner_check(r->sess, rank == 0);
    r->frame_limit = o->max_frame_bytes;
    rw_sync_session_set_frame_limit(r->sess, r->frame_limit);
    RW_CHECKGOTO(rw_mw_create(&r->w, err), st, fail);
    *out = r;
    return RW_OK;
fail:
    rw_rank_close(r);
    explain_cuda_failure(o, rank, err); /* after the close: the memory others left */
    rw_err_prefix(err, "rank %d", rank);
    return st;
}

void rw_rank_close(rw_rank *r) {
    if (!r) return;
    rw_sync_session_destroy(r->sess);
    rw_engine_destroy(r->eng);
    rw_model_destroy(r->model);
    rw_comm_destroy(r->comm);
    rw_config_free(&r->cfg);
    rw_mw_destroy(r->w);
    free(r);
}

rw_status rw_rank_reset_session(rw_rank *r, const char *version, rw_err *err) {
    rw_sync_session *s = NULL;
    RW_CHECK(rw_sync_session_create(rw_model_wset(r->model), version, true, &s, err));
    rw_sync_session_set_owner_check(s, r->rank == 0);
    rw_sync_session_set_frame_limit(s, r->frame_limit);
    rw_sync_session_destroy(r->sess);
    r->sess = s;
    return RW_OK;
}

rw_status rw_rank_memory(rw_rank *r, unsigned flags, rw_err *err) {
    rw_arena *a = rw_wset_arena(rw_model_wset(r->model));
    if (flags & RW_MEM_RELEASE_KV) {
        RW_CHECK(rw_engine_release_kv(r->eng, err));
        r->kv_released = true;
    }
    if (flags & RW_MEM_RELEASE_WEIGHTS) {
        /* the staging buffers of the update pipeline go with the weights */
        RW_CHECK(rw_sync_session_release(r->sess, err));
        RW_CHECK(rw_arena_release(a, err));
        rw_model_release_derived(r->model); /* the bf16 copies of quantized weights too */
        r->weights_released = true;
    }
    if (flags & RW_MEM_RESUME_WEIGHTS) {
        if (r->weights_released) {
            RW_CHECK(rw_arena_resume(a, err));
            r->weights_released = false;
            /* the bytes did not survive: until a full update (or reload) lands, generation must
             * be refused, which is exactly the session's incomplete state */
            rw_sync_info info;
            rw_sync_session_info(r->sess, &info);
            RW_CHECK(rw_rank_reset_session(r, info.version, err));
        }
    }
    if (flags & RW_MEM_RESUME_KV) {
        RW_CHECK(rw_engine_resume_kv(r->eng, err));
        r->kv_released = false;
    }
    return RW_OK;
}

rw_status rw_rank_sync(rw_rank *r, const rw_request *req, const rw_sync_frames *in,
                       rw_sync_outcome *out, rw_err *err) {
    return rw_sync_handle(r->sess, r->rank, req, in, r->w, out, err);
}

rw_status rw_rank_settle(rw_rank *r, rw_sync_wstate *state, rw_err *err) {
    rw_sync_info info;
    rw_sync_session_info(r->sess, &info);
    rw_status st = RW_OK;
    if (info.state == RW_SYNC_UPDATING) {
        bool intact;
        st = rw_sync_session_abort(r->sess, &intact, err);
        rw_sync_session_info(r->sess, &info);
    }
    *state = info.state;
    return st;
}
