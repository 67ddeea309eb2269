/* rollout.c - the client's typed calls for rollouts (rw_client.h): generate and score with JSON
 * arguments, waiting for the final reply (a streaming generate's partial replies are skipped),
 * and the view of one output's routed experts inside the reply's data frame. */
#include <stdlib.h>
#include <string.h>

#include "client_internal.h"
#include "rw_client.h"

/* Sends cmd and waits for its final reply: result as JSON text, the data frame. */
static rw_status call_final(rw_client *c, const char *cmd, const char *args_json, int timeout_ms,
                            char **result_json, void **frame, size_t *frame_len, rw_err *err) {
    *result_json = NULL;
    if (frame) *frame = NULL;
    if (frame_len) *frame_len = 0;
    uint64_t id;
    RW_CHECK(rw_client_send_json(c, cmd, args_json, NULL, NULL, 0, &id, err));
    for (;;) {
        rw_msg *m = NULL;
        rw_reply r;
        void *f = NULL;
        size_t flen = 0;
        RW_CHECK(rw_client_wait(c, id, timeout_ms, &m, &r, &f, &flen, err));
        const rw_mobj *sv = rw_mobj_get(r.result, "stream");
        bool partial = false;
        if (sv && rw_mobj_bool(sv, "result.stream", &partial, NULL) != RW_OK) partial = false;
        if (partial) { /* a partial reply of a streaming generate: the final one repeats it */
            rw_msg_free(m);
            free(f);
            continue;
        }
        if (rw_client_is_part(r.result)) { /* a large result: its parts joined */
            rw_status st =
                rw_client_join_rest(c, id, timeout_ms, m, &r, result_json, &f, &flen, err);
            if (st != RW_OK || !frame) {
                free(f);
            } else {
                *frame = f;
                if (frame_len) *frame_len = flen;
            }
            return rw_client_note(c, st, err);
        }
        rw_status st = rw_mobj_to_json(r.result, result_json, err);
        rw_msg_free(m);
        if (st != RW_OK || !frame) {
            free(f);
        } else {
            *frame = f;
            if (frame_len) *frame_len = flen;
        }
        return rw_client_note(c, st, err);
    }
}

rw_status rw_client_generate(rw_client *c, const char *args_json, int timeout_ms,
                             char **result_json, void **frame, size_t *frame_len, rw_err *err) {
    return call_final(c, "generate", args_json, timeout_ms, result_json, frame, frame_len, err);
}

rw_status rw_client_score(rw_client *c, const char *args_json, int timeout_ms, char **result_json,
                          void **frame, size_t *frame_len, rw_err *err) {
    return call_final(c, "score", args_json, timeout_ms, result_json, frame, frame_len, err);
}

/* {offset, nbytes, shape: [t, l, k], dtype} of `key` in output o: the array inside the frame. */
static rw_status frame_array(const rw_mobj *o, const char *key, const void *frame, size_t frame_len,
                             int64_t shape[3], const char **dtype, const void **data, rw_err *err) {
    const rw_mobj *d = rw_mobj_get(o, key);
    if (!d) RW_FAIL(err, RW_E_NOT_FOUND, "routes: the output has no %s", key);
    uint64_t off, nbytes;
    RW_CHECK(rw_mobj_u64(rw_mobj_get(d, "offset"), "offset", &off, err));
    RW_CHECK(rw_mobj_u64(rw_mobj_get(d, "nbytes"), "nbytes", &nbytes, err));
    const rw_mobj *sh = rw_mobj_get(d, "shape");
    if (rw_mobj_len(sh) != 3) RW_FAIL(err, RW_E_PROTOCOL, "routes: %s.shape is not [t, l, k]", key);
    for (size_t i = 0; i < 3; i++)
        RW_CHECK(rw_mobj_i64(rw_mobj_at(sh, i), "shape", &shape[i], err));
    size_t dl;
    RW_CHECK(rw_mobj_str(rw_mobj_get(d, "dtype"), "dtype", dtype, &dl, err));
    if (!frame || off > frame_len || nbytes > frame_len - off)
        RW_FAIL(err, RW_E_PROTOCOL, "routes: %s [%llu, +%llu) outside the data frame of %zu bytes",
                key, (unsigned long long)off, (unsigned long long)nbytes, frame_len);
    *data = (const uint8_t *)frame + off;
    return RW_OK;
}

rw_status rw_client_routes_of(const char *result_json, size_t i, const void *frame,
                              size_t frame_len, rw_client_routes *out, rw_err *err) {
    memset(out, 0, sizeof *out);
    rw_mw *w = NULL;
    rw_msg *m = NULL;
    RW_CHECK(rw_mw_create(&w, err));
    rw_status st = rw_mw_json(w, result_json ? result_json : "null", err);
    const void *bytes = NULL;
    size_t len = 0;
    const rw_mobj *res = NULL;
    if (st == RW_OK) st = rw_mw_finish(w, &bytes, &len, err);
    if (st == RW_OK) st = rw_msg_decode_value(bytes, len, &m, &res, err);
    if (st != RW_OK) goto out;
    const rw_mobj *o = rw_mobj_at(rw_mobj_get(res, "outputs"), i);
    if (!o) {
        st = RW_ERR(err, RW_E_NOT_FOUND, "routes: the result has no outputs[%zu]", i);
        goto out;
    }
    int64_t shape[3];
    const char *dt;
    const void *data;
    RW_CHECKGOTO(frame_array(o, "routed_experts", frame, frame_len, shape, &dt, &data, err), st,
                 out);
    out->tokens = shape[0];
    out->layers = shape[1];
    out->k = shape[2];
    out->id_bytes = !strncmp(dt, "u8", 2) ? 1 : 2;
    out->ids = data;
    if (rw_mobj_get(o, "routing_weights")) {
        int64_t ws[3];
        RW_CHECKGOTO(frame_array(o, "routing_weights", frame, frame_len, ws, &dt, &data, err), st,
                     out);
        out->weights = data;
    }
out:
    rw_msg_free(m);
    rw_mw_destroy(w);
    return st;
}
