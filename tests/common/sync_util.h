/* sync_util.h - helpers for the sync tests that use weight sets: the fixture's config and
 * checkpoint, weight sets filled with random canonical weights or loaded from the fixture by a
 * direct rw_wset_apply of every tensor (the reference the sync paths must reproduce byte for
 * byte), arena snapshots and comparisons. */
#ifndef RW_SYNC_TEST_UTIL_H
#define RW_SYNC_TEST_UTIL_H

#include "rw_test.h"

#include "rw_client.h"

static inline void fx_dir(char *buf, size_t cap) {
    rw_test_path(buf, cap, RW_TEST_FIXTURE);
}

static inline void fx_config(rw_config *cfg) {
    char p[512], d[400];
    fx_dir(d, sizeof d);
    snprintf(p, sizeof p, "%s/config.json", d);
    rw_err e;
    RW_ASSERT_OK(rw_config_load(p, cfg, &e), &e);
}

static inline rw_ckpt *fx_ckpt(void) {
    char d[400];
    fx_dir(d, sizeof d);
    rw_ckpt *c;
    rw_err e;
    RW_ASSERT_OK(rw_ckpt_open(d, &c, &e), &e);
    return c;
}

typedef struct rand_ctx {
    rw_wset *ws;
    const rw_config *cfg;
    rw_rng rng;
    rw_err *err;
} rand_ctx;

static inline rw_status rand_weight(const rw_wname *w, void *ctx) {
    rand_ctx *c = ctx;
    int nd;
    int64_t shape[RW_MAX_DIMS];
    RW_CHECK(rw_config_weight_shape(c->cfg, w, &nd, shape, c->err));
    int64_t n = rw_shape_numel(nd, shape);
    uint16_t *b = malloc((size_t)n * 2);
    if (!b) return RW_E_OOM;
    rw_test_fill_bf16(b, (size_t)n, rw_rng_u64(&c->rng), 0.05f);
    char name[RW_SYNC_MAX_NAME];
    rw_name_format(w, name, sizeof name);
    rw_piece p = {.name = name,
                  .dtype = RW_DTYPE_BF16,
                  .ndim = nd,
                  .shard_dim = -1,
                  .data = b,
                  .place = RW_PLACE_HOST};
    memcpy(p.shape, shape, sizeof shape);
    rw_status st = rw_wset_apply(c->ws, &p, NULL, c->err);
    free(b);
    return st;
}

/* A host weight set of (tp, rank) holding random canonical weights. */
static inline rw_wset *ws_random(const rw_config *cfg, int tp, int rank, uint64_t seed) {
    rw_wset *ws;
    rw_err e;
    RW_ASSERT_OK(rw_wset_create(cfg, tp, rank, RW_PLACE_HOST, 0, &ws, &e), &e);
    rand_ctx c = {.ws = ws, .cfg = cfg, .err = &e};
    rw_rng_seed(&c.rng, seed);
    RW_ASSERT_OK(rw_config_for_each_weight(cfg, rand_weight, &c), &e);
    return ws;
}

/* A host weight set of (tp, rank) loaded by applying every fixture tensor directly. */
static inline rw_wset *ws_reference(const rw_config *cfg, int tp, int rank) {
    rw_wset *ws;
    rw_err e;
    RW_ASSERT_OK(rw_wset_create(cfg, tp, rank, RW_PLACE_HOST, 0, &ws, &e), &e);
    rw_ckpt *ck = fx_ckpt();
    for (size_t i = 0; i < rw_ckpt_count(ck); i++) {
        const rw_st_entry *t = rw_ckpt_at(ck, i);
        rw_piece p = {.name = t->name,
                      .dtype = t->dtype,
                      .ndim = t->ndim,
                      .shard_dim = -1,
                      .data = t->data,
                      .place = RW_PLACE_HOST};
        memcpy(p.shape, t->shape, sizeof p.shape);
        RW_ASSERT_OK(rw_wset_apply(ws, &p, NULL, &e), &e);
    }
    rw_ckpt_close(ck);
    return ws;
}

static inline const uint8_t *ws_bytes(rw_wset *ws, size_t *n) {
    *n = rw_arena_used(rw_wset_arena(ws));
    return rw_arena_base(rw_wset_arena(ws));
}

static inline uint8_t *ws_snapshot(rw_wset *ws, size_t *n) {
    const uint8_t *b = ws_bytes(ws, n);
    uint8_t *c = malloc(*n);
    assert_non_null(c);
    memcpy(c, b, *n);
    return c;
}

static inline void ws_assert_equal(rw_wset *a, rw_wset *b, const char *what) {
    size_t na, nb;
    const uint8_t *x = ws_bytes(a, &na), *y = ws_bytes(b, &nb);
    assert_int_equal(na, nb);
    rw_assert_bytes_equal(x, y, na, what);
}

/* One bucket holding every fixture tensor whose name matches `prefix` (NULL: all), whole. */
static inline uint8_t *fx_bucket(rw_ckpt *ck, const char *prefix, rw_sync_manifest *m) {
    rw_err e;
    rw_sync_manifest_clear(m);
    for (size_t i = 0; i < rw_ckpt_count(ck); i++) {
        const rw_st_entry *t = rw_ckpt_at(ck, i);
        if (prefix && strncmp(t->name, prefix, strlen(prefix))) continue;
        RW_ASSERT_OK(rw_sync_manifest_add(m, t->name, t->dtype, t->ndim, t->shape, -1, 0, 0,
                                          RW_PIECE_PLAIN, NULL, &e),
                     &e);
    }
    uint8_t *b = calloc(1, rw_sync_manifest_bytes(m) + 1);
    assert_non_null(b);
    for (size_t i = 0; i < rw_sync_manifest_count(m); i++) {
        const rw_sync_tensor *t = rw_sync_manifest_at(m, i);
        const rw_st_entry *s = rw_ckpt_find(ck, t->name);
        memcpy(b + t->offset, s->data, t->nbytes);
    }
    return b;
}

#endif
