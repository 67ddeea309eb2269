/* bench_json.c - the weight-sync benchmark result as JSON (every build, so tools can print a
 * result they received or an empty one). */
#include "sync_internal.h"

#include <jansson.h>
#include <stdlib.h>

rw_status rw_sync_bench_json(const rw_sync_bench_result *r, const char *name, char **out,
                             rw_err *err) {
    *out = NULL;
    json_t *j = json_object(), *u = json_array(), *c = json_array();
    if (!j || !u || !c) {
        json_decref(j);
        json_decref(u);
        json_decref(c);
        RW_FAIL(err, RW_E_OOM, "bench json: out of memory");
    }
    int n = r->repeats < RW_SYNC_BENCH_MAX_REPEATS ? r->repeats : RW_SYNC_BENCH_MAX_REPEATS;
    for (int i = 0; i < n; i++) {
        json_array_append_new(u, json_real(r->update_s[i]));
        json_array_append_new(c, json_real(r->ceiling_s[i]));
    }
    json_object_set_new(j, "benchmark", json_string(name ? name : "sync"));
    json_object_set_new(j, "bytes", json_integer((json_int_t)r->bytes));
    json_object_set_new(j, "tensors", json_integer((json_int_t)r->tensors));
    json_object_set_new(j, "buckets", json_integer((json_int_t)r->buckets));
    json_object_set_new(j, "repeats", json_integer(r->repeats));
    json_object_set_new(j, "update_s", u);
    json_object_set_new(j, "ceiling_s", c);
    json_object_set_new(j, "update_median_s", json_real(r->update_median_s));
    json_object_set_new(j, "ceiling_median_s", json_real(r->ceiling_median_s));
    json_object_set_new(j, "update_gbps", json_real(r->update_gbps));
    json_object_set_new(j, "ceiling_gbps", json_real(r->ceiling_gbps));
    json_object_set_new(j, "ratio", json_real(r->ratio));
    json_object_set_new(j, "worker_weights_bytes",
                        json_integer((json_int_t)r->worker_weights_bytes));
    json_object_set_new(j, "worker_staging_bytes",
                        json_integer((json_int_t)r->worker_staging_bytes));
    json_object_set_new(j, "worker_peak_bytes", json_integer((json_int_t)r->worker_peak_bytes));
    json_object_set_new(j, "pieces", json_integer((json_int_t)r->pieces));
    json_object_set_new(j, "ceiling_repeats", json_integer(r->ceiling_repeats));
    json_object_set_new(j, "setup_s", json_real(r->setup_s));
    json_object_set_new(j, "warmup_s", json_real(r->warmup_s));
    json_object_set_new(j, "bucket_mean_s", json_real(r->bucket_mean_s));
    json_object_set_new(j, "bucket_max_s", json_real(r->bucket_max_s));
    json_object_set_new(j, "commit_s", json_real(r->commit_s));
    json_object_set_new(j, "worker_apply_s", json_real(r->worker_apply_s));
    json_object_set_new(j, "worker_wait_s", json_real(r->worker_wait_s));
    json_object_set_new(j, "worker_prepare_s", json_real(r->worker_prepare_s));
    json_object_set_new(j, "worker_deferred", json_integer((json_int_t)r->worker_deferred));
    if (r->note[0]) json_object_set_new(j, "note", json_string(r->note));
    *out = json_dumps(j, JSON_COMPACT);
    json_decref(j);
    if (!*out) RW_FAIL(err, RW_E_OOM, "bench json: out of memory");
    return RW_OK;
}
