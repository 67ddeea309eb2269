/* sums.c - the checksums a worker reports (the checksum command's reply), per rank: parsed into
 * an opaque table the trainer looks names up in, with the worker's quantization config. */
#include "client_internal.h"

#include <inttypes.h>
#include <stdlib.h>

/* ------------------------------------------------------------------------------------------ */
/* Checksums                                                                                    */
/* ------------------------------------------------------------------------------------------ */
typedef struct sums_rank {
    int rank;
    size_t n;
    char **names;
    uint64_t *values;
} sums_rank;

struct rw_client_sums {
    int tp;
    char method[16];
    int n_not_convert;
    char **not_convert;
    int nranks;
    sums_rank *r;
};

void rw_client_sums_free(rw_client_sums *s) {
    if (!s) return;
    for (int i = 0; i < s->nranks; i++) {
        for (size_t j = 0; j < s->r[i].n; j++)
            free(s->r[i].names[j]);
        free(s->r[i].names);
        free(s->r[i].values);
    }
    for (int i = 0; i < s->n_not_convert; i++)
        free(s->not_convert[i]);
    free(s->not_convert);
    free(s->r);
    free(s);
}

int rw_client_sums_tp(const rw_client_sums *s) {
    return s->tp;
}
int rw_client_sums_ranks(const rw_client_sums *s) {
    return s->nranks;
}
int rw_client_sums_rank(const rw_client_sums *s, int i) {
    return i >= 0 && i < s->nranks ? s->r[i].rank : -1;
}
size_t rw_client_sums_count(const rw_client_sums *s, int i) {
    return i >= 0 && i < s->nranks ? s->r[i].n : 0;
}
const char *rw_client_sums_at(const rw_client_sums *s, int i, size_t j, uint64_t *value) {
    if (i < 0 || i >= s->nranks || j >= s->r[i].n) return NULL;
    if (value) *value = s->r[i].values[j];
    return s->r[i].names[j];
}
rw_status rw_client_sums_find(const rw_client_sums *s, int i, const char *name, uint64_t *value,
                              rw_err *err) {
    if (i < 0 || i >= s->nranks) RW_FAIL(err, RW_E_RANGE, "checksums: rank entry %d", i);
    for (size_t j = 0; j < s->r[i].n; j++)
        if (!strcmp(s->r[i].names[j], name)) {
            *value = s->r[i].values[j];
            return RW_OK;
        }
    RW_FAIL(err, RW_E_NOT_FOUND, "checksums: %s not reported by rank %d", name, s->r[i].rank);
}

rw_status rw_client_sums_quant(const rw_client_sums *s, rw_quant_config *q, rw_err *err) {
    memset(q, 0, sizeof *q);
    if (!strcmp(s->method, "none")) return RW_OK;
    if (!strcmp(s->method, "mxfp8")) {
        q->method = RW_QMETHOD_MXFP8;
        q->block[0] = 1;
        q->block[1] = 32;
    } else if (!strcmp(s->method, "fp8")) {
        q->method = RW_QMETHOD_FP8_BLOCK;
        q->block[0] = q->block[1] = 128;
    } else {
        RW_FAIL(err, RW_E_PROTOCOL, "checksums: unknown quant method '%s'", s->method);
    }
    strcpy(q->fmt, "e4m3");
    q->n_not_convert = s->n_not_convert;
    for (int i = 0; i < s->n_not_convert; i++)
        q->not_convert[i] = s->not_convert[i];
    return RW_OK;
}

static rw_status parse_sums(const rw_mobj *res, rw_client_sums *s, rw_err *err) {
    uint64_t tp;
    RW_CHECK(rw_mobj_u64(rw_mobj_get(res, "tp"), "result.tp", &tp, err));
    s->tp = (int)tp;
    const rw_mobj *q = rw_mobj_get(res, "quant");
    RW_CHECK(rw_mobj_strcpy(rw_mobj_get(q, "method"), "result.quant.method", s->method,
                            sizeof s->method, err));
    const rw_mobj *nc = rw_mobj_get(q, "not_convert");
    if (rw_mobj_type(nc) != RW_M_ARRAY || rw_mobj_len(nc) > RW_MAX_NOT_CONVERT)
        RW_FAIL(err, RW_E_PROTOCOL, "result.quant.not_convert: expected an array of <= %d",
                RW_MAX_NOT_CONVERT);
    s->not_convert = calloc(rw_mobj_len(nc) + 1, sizeof *s->not_convert);
    if (!s->not_convert) RW_FAIL(err, RW_E_OOM, "checksums: out of memory");
    for (size_t i = 0; i < rw_mobj_len(nc); i++) {
        char buf[256];
        RW_CHECK(
            rw_mobj_strcpy(rw_mobj_at(nc, i), "result.quant.not_convert[]", buf, sizeof buf, err));
        s->not_convert[i] = strdup(buf);
        if (!s->not_convert[i]) RW_FAIL(err, RW_E_OOM, "checksums: out of memory");
        s->n_not_convert++;
    }
    const rw_mobj *ranks = rw_mobj_get(res, "ranks");
    if (rw_mobj_type(ranks) != RW_M_ARRAY || rw_mobj_len(ranks) == 0)
        RW_FAIL(err, RW_E_PROTOCOL, "result.ranks: expected a non-empty array");
    size_t nr = rw_mobj_len(ranks);
    s->r = calloc(nr, sizeof *s->r);
    if (!s->r) RW_FAIL(err, RW_E_OOM, "checksums: out of memory");
    for (size_t i = 0; i < nr; i++) {
        const rw_mobj *e = rw_mobj_at(ranks, i);
        sums_rank *sr = &s->r[i];
        s->nranks = (int)i + 1;
        uint64_t rk;
        RW_CHECK(rw_mobj_u64(rw_mobj_get(e, "rank"), "result.ranks[].rank", &rk, err));
        sr->rank = (int)rk;
        const rw_mobj *cs = rw_mobj_get(e, "checksums");
        if (rw_mobj_type(cs) != RW_M_MAP)
            RW_FAIL(err, RW_E_PROTOCOL, "result.ranks[].checksums: expected a map");
        size_t n = rw_mobj_len(cs);
        sr->names = calloc(n + 1, sizeof *sr->names);
        sr->values = calloc(n + 1, sizeof *sr->values);
        if (!sr->names || !sr->values) RW_FAIL(err, RW_E_OOM, "checksums: out of memory");
        for (size_t j = 0; j < n; j++) {
            char name[RW_SYNC_MAX_NAME], hex[17];
            RW_CHECK(
                rw_mobj_strcpy(rw_mobj_key_at(cs, j), "checksum name", name, sizeof name, err));
            RW_CHECK(rw_mobj_strcpy(rw_mobj_val_at(cs, j), name, hex, sizeof hex, err));
            uint8_t b[8];
            RW_CHECK(rw_hex_decode(hex, strlen(hex), b, 8, name, err));
            uint64_t v = 0;
            for (int k = 0; k < 8; k++)
                v = v << 8 | b[k];
            sr->names[j] = strdup(name);
            if (!sr->names[j]) RW_FAIL(err, RW_E_OOM, "checksums: out of memory");
            sr->values[j] = v;
            sr->n = j + 1;
        }
    }
    return RW_OK;
}

rw_status rw_client_checksum(rw_client *c, const char *const *names, size_t n, int timeout_ms,
                             rw_client_sums **out, rw_err *err) {
    *out = NULL;
    rw_mw *a;
    RW_CHECK(rw_mw_create(&a, err));
    if (names) {
        rw_mw_map(a, 1);
        rw_mw_str(a, "names");
        rw_mw_array(a, (uint32_t)n);
        for (size_t i = 0; i < n; i++)
            rw_mw_str(a, names[i]);
    } else {
        rw_mw_map(a, 0);
    }
    rw_msg *m = NULL;
    rw_reply r;
    rw_status st = rw_client_call(c, "checksum", a, timeout_ms, &m, &r, err);
    rw_mw_destroy(a);
    if (st != RW_OK) return st;
    rw_client_sums *s = calloc(1, sizeof *s);
    if (!s) st = RW_ERR(err, RW_E_OOM, "checksums: out of memory");
    if (st == RW_OK) st = parse_sums(r.result, s, err);
    rw_msg_free(m);
    if (st != RW_OK) {
        rw_client_sums_free(s);
        return rw_client_note(c, st, err);
    }
    *out = s;
    return RW_OK;
}
