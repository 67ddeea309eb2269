/* parts.c - a generate result that came in parts (docs/PROTOCOL.md 4.1) joined back into the one
 * result it stands for, for the client's JSON calls (and so the Python client): the pieces of
 * each output concatenated in order, its other fields taken from its last piece, `more` and
 * `offset` dropped; the parts' data frames (routed experts) concatenated, each at an offset
 * aligned to 8, and the offsets of the routes fields moved with them. Parts of one request arrive
 * in order on one connection. */
#include "client_internal.h"

#include <jansson.h>
#include <stdint.h>

bool rw_client_is_part(const rw_mobj *result) {
    bool more = false;
    const rw_mobj *m = rw_mobj_get(result, "more");
    return m && rw_mobj_bool(m, "more", &more, NULL) == RW_OK && more &&
           rw_mobj_get(result, "outputs");
}

/* The arrays an output's pieces split. */
static const char *const split_keys[] = {"tokens", "logprobs", "top_logprobs"};

static rw_status join_output(json_t *last, json_t *o, rw_err *err) {
    const char *k;
    json_t *v;
    json_object_foreach(o, k, v) {
        bool split = false;
        for (size_t i = 0; i < sizeof split_keys / sizeof *split_keys; i++)
            split |= !strcmp(k, split_keys[i]);
        if (split) {
            json_t *a = json_object_get(last, k);
            if (!json_is_array(a) || !json_is_array(v) || json_array_extend(a, v) != 0)
                RW_FAIL(err, RW_E_PROTOCOL, "client: a generate part continues '%s' badly", k);
        } else if (strcmp(k, "index") && json_object_set(last, k, v) != 0) {
            RW_FAIL(err, RW_E_OOM, "client: out of memory joining a generate result");
        }
    }
    return RW_OK;
}

/* Adds `base` to the offset of every routes field of the part's outputs. */
static rw_status rebase_routes(json_t *p, uint64_t base, rw_err *err) {
    size_t i;
    json_t *o;
    json_array_foreach(json_object_get(p, "outputs"), i, o) {
        static const char *const keys[] = {"routed_experts", "routing_weights"};
        for (size_t k = 0; k < 2; k++) {
            json_t *off = json_object_get(json_object_get(o, keys[k]), "offset");
            if (!off) continue;
            if (!json_is_integer(off) || json_integer_value(off) < 0 ||
                (uint64_t)json_integer_value(off) > (uint64_t)INT64_MAX - base)
                RW_FAIL(err, RW_E_PROTOCOL, "client: a generate part's %s.offset is not a count",
                        keys[k]);
            json_integer_set(off, json_integer_value(off) + (json_int_t)base);
        }
    }
    return RW_OK;
}

rw_status rw_client_join_part(struct json_t **acc, const rw_mobj *part, uint64_t frame_base,
                              rw_err *err) {
    json_t *p;
    RW_CHECK(rw_mobj_to_jansson(part, &p, err));
    if (frame_base && rebase_routes(p, frame_base, err) != RW_OK) {
        json_decref(p);
        return err->status;
    }
    if (!*acc) {
        *acc = p;
        return RW_OK;
    }
    json_t *have = json_object_get(*acc, "outputs"), *outs = json_object_get(p, "outputs");
    rw_status st = RW_OK;
    if (!json_is_array(have) || !json_is_array(outs))
        st = RW_ERR(err, RW_E_PROTOCOL, "client: a generate part without outputs");
    size_t i;
    json_t *o;
    json_array_foreach(outs, i, o) {
        if (st != RW_OK) break;
        json_t *last = json_array_get(have, json_array_size(have) - 1);
        if (last && json_equal(json_object_get(last, "index"), json_object_get(o, "index")))
            st = join_output(last, o, err);
        else if (json_array_append(have, o) != 0)
            st = RW_ERR(err, RW_E_OOM, "client: out of memory joining a generate result");
    }
    json_decref(p);
    return st;
}

rw_status rw_client_parts_done(struct json_t *acc, char **out, rw_err *err) {
    json_object_del(acc, "more");
    size_t i;
    json_t *o;
    json_array_foreach(json_object_get(acc, "outputs"), i, o) {
        json_object_del(o, "offset");
    }
    *out = json_dumps(acc, JSON_COMPACT | JSON_ENCODE_ANY);
    if (!*out) RW_FAIL(err, RW_E_OOM, "client: out of memory for a generate result");
    return RW_OK;
}
