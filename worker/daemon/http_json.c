/* http_json.c - reading HTTP request bodies: JSON parsed by jansson (duplicate keys refused),
 * typed optional fields with ranges, unknown fields refused by name, token-id arrays checked
 * against the vocabulary. Every refusal names the field, so a client learns what to fix. */
#include "http_internal.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#define MAX_DEPTH 64 /* nesting of a request body */

static const char *jtype(const json_t *j) {
    switch (json_typeof(j)) {
    case JSON_OBJECT: return "an object";
    case JSON_ARRAY: return "an array";
    case JSON_STRING: return "a string";
    case JSON_INTEGER: return "an integer";
    case JSON_REAL: return "a number";
    case JSON_TRUE:
    case JSON_FALSE: return "a boolean";
    default: return "null";
    }
}

static void name(char *dst, size_t cap, const char *what, const char *key) {
    if (what && what[0])
        snprintf(dst, cap, "%s.%s", what, key);
    else
        snprintf(dst, cap, "%s", key);
}

static int depth(const json_t *j, int d) {
    if (d > MAX_DEPTH) return d;
    int m = d;
    if (json_is_object(j)) {
        const char *k;
        json_t *v;
        json_object_foreach((json_t *)j, k, v) {
            int x = depth(v, d + 1);
            if (x > m) m = x;
            if (m > MAX_DEPTH) break;
        }
    } else if (json_is_array(j)) {
        size_t i;
        json_t *v;
        json_array_foreach(j, i, v) {
            int x = depth(v, d + 1);
            if (x > m) m = x;
            if (m > MAX_DEPTH) break;
        }
    }
    return m;
}

rw_status rw_hj_body(rw_hreq *r, json_t **out, rw_err *err) {
    *out = NULL;
    if (!r->body.n)
        RW_FAIL(err, RW_E_INVALID_ARG, "the request body is empty (expected a JSON object)");
    json_error_t je;
    json_t *j = json_loadb(r->body.p, r->body.n, JSON_REJECT_DUPLICATES, &je);
    if (!j)
        RW_FAIL(err, RW_E_FORMAT, "malformed JSON body: %s (line %d, column %d)", je.text, je.line,
                je.column);
    if (!json_is_object(j)) {
        const char *t = jtype(j);
        json_decref(j);
        RW_FAIL(err, RW_E_INVALID_ARG, "the request body is %s; expected a JSON object", t);
    }
    if (depth(j, 0) > MAX_DEPTH) {
        json_decref(j);
        RW_FAIL(err, RW_E_FORMAT, "the request body nests deeper than %d levels", MAX_DEPTH);
    }
    *out = j;
    return RW_OK;
}

rw_status rw_hj_only(const json_t *obj, const char *what, const char *const *allowed, rw_err *err) {
    const char *k;
    json_t *v;
    json_object_foreach((json_t *)obj, k, v) {
        bool ok = false;
        for (size_t i = 0; allowed[i] && !ok; i++)
            ok = !strcmp(k, allowed[i]);
        if (!ok) {
            char f[160];
            name(f, sizeof f, what, k);
            RW_FAIL(err, RW_E_INVALID_ARG, "unknown field '%s'", f);
        }
    }
    return RW_OK;
}

rw_status rw_hj_bool(const json_t *o, const char *what, const char *key, bool def, bool *out,
                     rw_err *err) {
    const json_t *v = json_object_get(o, key);
    *out = def;
    if (!v || json_is_null(v)) return RW_OK;
    char f[160];
    name(f, sizeof f, what, key);
    if (!json_is_boolean(v))
        RW_FAIL(err, RW_E_INVALID_ARG, "%s: expected a boolean, got %s", f, jtype(v));
    *out = json_is_true(v);
    return RW_OK;
}

rw_status rw_hj_int(const json_t *o, const char *what, const char *key, int64_t def, int64_t lo,
                    int64_t hi, int64_t *out, rw_err *err) {
    const json_t *v = json_object_get(o, key);
    *out = def;
    if (!v || json_is_null(v)) return RW_OK;
    char f[160];
    name(f, sizeof f, what, key);
    int64_t x;
    if (json_is_integer(v)) {
        x = json_integer_value(v);
    } else if (json_is_real(v) && json_real_value(v) == floor(json_real_value(v)) &&
               fabs(json_real_value(v)) < 9e15) {
        x = (int64_t)json_real_value(v); /* 16.0 from a client that only has doubles */
    } else {
        RW_FAIL(err, RW_E_INVALID_ARG, "%s: expected an integer, got %s", f, jtype(v));
    }
    if (x < lo || x > hi)
        RW_FAIL(err, RW_E_RANGE, "%s: %lld outside [%lld, %lld]", f, (long long)x, (long long)lo,
                (long long)hi);
    *out = x;
    return RW_OK;
}

rw_status rw_hj_num(const json_t *o, const char *what, const char *key, double def, double lo,
                    double hi, double *out, rw_err *err) {
    const json_t *v = json_object_get(o, key);
    *out = def;
    if (!v || json_is_null(v)) return RW_OK;
    char f[160];
    name(f, sizeof f, what, key);
    if (!json_is_number(v))
        RW_FAIL(err, RW_E_INVALID_ARG, "%s: expected a number, got %s", f, jtype(v));
    double x = json_number_value(v);
    if (!(x >= lo && x <= hi)) RW_FAIL(err, RW_E_RANGE, "%s: %g outside [%g, %g]", f, x, lo, hi);
    *out = x;
    return RW_OK;
}

rw_status rw_hj_str(const json_t *o, const char *what, const char *key, const char **out,
                    rw_err *err) {
    const json_t *v = json_object_get(o, key);
    *out = NULL;
    if (!v || json_is_null(v)) return RW_OK;
    if (!json_is_string(v)) {
        char f[160];
        name(f, sizeof f, what, key);
        RW_FAIL(err, RW_E_INVALID_ARG, "%s: expected a string, got %s", f, jtype(v));
    }
    *out = json_string_value(v);
    return RW_OK;
}

rw_status rw_hj_ids(const json_t *a, const char *what, int64_t hi, rw_tok_ids *out, rw_err *err) {
    if (!json_is_array(a))
        RW_FAIL(err, RW_E_INVALID_ARG, "%s: expected an array of token ids, got %s", what,
                jtype(a));
    const size_t n = json_array_size(a);
    if (out->cap < out->n + n) {
        int32_t *p = realloc(out->ids, sizeof *p * (out->n + n));
        if (!p) RW_FAIL(err, RW_E_OOM, "%s: %zu ids", what, n);
        out->ids = p;
        out->cap = out->n + n;
    }
    for (size_t i = 0; i < n; i++) {
        const json_t *v = json_array_get(a, i);
        if (!json_is_integer(v))
            RW_FAIL(err, RW_E_INVALID_ARG, "%s[%zu]: expected a token id (integer), got %s", what,
                    i, jtype(v));
        const json_int_t x = json_integer_value(v);
        if (x < 0 || x >= hi)
            RW_FAIL(err, RW_E_RANGE, "%s[%zu]: token id %lld outside [0, %lld)", what, i,
                    (long long)x, (long long)hi);
        out->ids[out->n++] = (int32_t)x;
    }
    return RW_OK;
}

rw_status rw_hj_strs(const json_t *v, const char *what, const char **strs, int cap, int *n,
                     rw_err *err) {
    *n = 0;
    if (!v || json_is_null(v)) return RW_OK;
    if (json_is_string(v)) {
        strs[(*n)++] = json_string_value(v);
        return RW_OK;
    }
    if (!json_is_array(v))
        RW_FAIL(err, RW_E_INVALID_ARG, "%s: expected a string or an array of strings, got %s", what,
                jtype(v));
    if (json_array_size(v) > (size_t)cap)
        RW_FAIL(err, RW_E_RANGE, "%s: %zu strings (at most %d)", what, json_array_size(v), cap);
    for (size_t i = 0; i < json_array_size(v); i++) {
        const json_t *s = json_array_get(v, i);
        if (!json_is_string(s))
            RW_FAIL(err, RW_E_INVALID_ARG, "%s[%zu]: expected a string, got %s", what, i, jtype(s));
        strs[(*n)++] = json_string_value(s);
    }
    return RW_OK;
}

rw_status rw_hj_request(rw_hreq *r, const char *const *allowed, bool empty_ok, json_t **out,
                        rw_err *err) {
    *out = NULL;
    if (!r->body.n && empty_ok) {
        *out = json_object();
        return *out ? RW_OK : rw_err_set(err, RW_E_OOM, __FILE__, __LINE__, "request body");
    }
    RW_CHECK(rw_hj_body(r, out, err));
    rw_status st = rw_hj_only(*out, "", allowed, err);
    if (st != RW_OK) {
        json_decref(*out);
        *out = NULL;
    }
    return st;
}
