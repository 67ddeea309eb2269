/* group.c - the trainer's end of the NCCL weight-update group: init_weights_update_group sent to
 * every worker, then the trainer joins as rank 0; per bucket, update_weights to every worker and,
 * once each accepted the manifest, the broadcast of the bucket from the trainer's GPU. */
#include "client_internal.h"

#include <inttypes.h>
#include <stdlib.h>

/* ------------------------------------------------------------------------------------------ */
/* Trainer side of the NCCL group                                                               */
/* ------------------------------------------------------------------------------------------ */
struct rw_client_group {
    rw_client **w;
    int n;
    char name[64];
    rw_sync_group *comm;
};

void rw_client_group_destroy(rw_client_group *g) {
    if (!g) return;
    rw_sync_group_destroy(g->comm);
    free(g->w);
    free(g);
}

rw_sync_group *rw_client_group_comm(rw_client_group *g) {
    return g->comm;
}
void *rw_client_group_stream(rw_client_group *g) {
    return rw_sync_group_stream(g->comm);
}

rw_status rw_client_group_create(rw_client *const *workers, const int *worker_ranks, int n,
                                 const char *name, int device, double timeout_s,
                                 rw_client_group **out, rw_err *err) {
    *out = NULL;
    if (n < 1 || n > 4096) RW_FAIL(err, RW_E_INVALID_ARG, "group: %d workers", n);
    if (!name || !name[0] || strlen(name) > 63)
        RW_FAIL(err, RW_E_INVALID_ARG, "group: name empty or longer than 63 characters");
    if (timeout_s <= 0) timeout_s = 120;
    int world = 1;
    for (int i = 0; i < n; i++) {
        int r = worker_ranks ? worker_ranks[i] : 1;
        if (r < 1 || r > 64) RW_FAIL(err, RW_E_INVALID_ARG, "group: worker %d has %d ranks", i, r);
        world += r;
    }
    rw_client_group *g = calloc(1, sizeof *g);
    if (!g) RW_FAIL(err, RW_E_OOM, "group: out of memory");
    g->w = calloc((size_t)n, sizeof *g->w);
    uint64_t *ids = calloc((size_t)n, sizeof *ids);
    rw_status st = RW_OK;
    if (!g->w || !ids) {
        st = RW_ERR(err, RW_E_OOM, "group: out of memory");
        goto fail;
    }
    memcpy(g->w, workers, (size_t)n * sizeof *g->w);
    g->n = n;
    rw_sync_strlcpy(g->name, name, sizeof g->name);
    uint8_t id[RW_NCCL_ID_BYTES];
    RW_CHECKGOTO(rw_sync_group_unique_id(id, err), st, fail);
    char hex[2 * RW_NCCL_ID_BYTES + 1];
    rw_hex_encode(id, sizeof id, hex);
    int offset = 1;
    for (int i = 0; i < n; i++) {
        rw_mw *a;
        RW_CHECKGOTO(rw_mw_create(&a, err), st, fail);
        rw_mw_map(a, 5);
        rw_mw_str(a, "unique_id");
        rw_mw_str(a, hex);
        rw_mw_str(a, "world_size");
        rw_mw_u64(a, (uint64_t)world);
        rw_mw_str(a, "rank_offset");
        rw_mw_u64(a, (uint64_t)offset);
        rw_mw_str(a, "group_name");
        rw_mw_str(a, name);
        rw_mw_str(a, "timeout_s");
        rw_mw_f64(a, timeout_s);
        st = rw_client_send(workers[i], "init_weights_update_group", a, NULL, 0, false, &ids[i],
                            err);
        rw_mw_destroy(a);
        if (st != RW_OK) goto fail;
        offset += worker_ranks ? worker_ranks[i] : 1;
    }
    /* the workers join while we do: init returns once every rank is in and the first broadcasts
     * (connection setup, bounded by max(timeout_s, 60 s)) are done on every rank */
    rw_status jst = rw_sync_group_create(id, world, 0, name, device, timeout_s, &g->comm, err);
    int wait_ms = (int)((timeout_s + (timeout_s > 60 ? timeout_s : 60)) * 1000) + 5000;
    for (int i = 0; i < n; i++) {
        rw_msg *m = NULL;
        rw_reply r;
        rw_err we;
        rw_status ws = rw_client_wait(workers[i], ids[i], wait_ms, &m, &r, NULL, NULL, &we);
        rw_msg_free(m);
        if (ws != RW_OK && jst == RW_OK && st == RW_OK) {
            st = ws;
            if (err) *err = we;
            rw_err_prefix(err, "group '%s': worker %d", name, i);
        }
    }
    if (jst != RW_OK) st = jst;
    if (st != RW_OK) goto fail;
    free(ids);
    *out = g;
    return RW_OK;
fail:
    free(ids);
    rw_client_group_destroy(g);
    return st;
}

rw_status rw_client_update_weights_nccl(rw_client_group *g, const rw_sync_manifest *man,
                                        const void *dev_data, void *stream, int timeout_ms,
                                        rw_err *err) {
    uint64_t ids[64], *idp = g->n <= 64 ? ids : calloc((size_t)g->n, sizeof *idp);
    if (!idp) RW_FAIL(err, RW_E_OOM, "group: out of memory");
    rw_status st = RW_OK;
    int sent = 0;
    for (int i = 0; st == RW_OK && i < g->n; i++) {
        st = rw_client_send_bucket_nccl(g->w[i], man, g->name, &idp[i], err);
        if (st == RW_OK) sent++;
    }
    /* every worker must have posted its receive before rank 0 broadcasts */
    for (int i = 0; i < sent; i++) {
        rw_msg *m = NULL;
        rw_reply r;
        rw_err we;
        rw_status ws = rw_client_wait(g->w[i], idp[i], timeout_ms, &m, &r, NULL, NULL, &we);
        rw_msg_free(m);
        if (ws != RW_OK && st == RW_OK) {
            st = ws;
            if (err) *err = we;
            rw_err_prefix(err, "worker %d", i);
        }
    }
    if (idp != ids) free(idp);
    if (st != RW_OK) return st;
    return rw_sync_group_bcast(g->comm, (void *)dev_data, rw_sync_manifest_bytes(man), stream, err);
}

rw_status rw_client_group_sync(rw_client_group *g, void *stream, double timeout_s, rw_err *err) {
    return rw_sync_group_wait(g->comm, stream, timeout_s, err);
}
