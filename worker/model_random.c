/* model_random.c - seeded random weights (rw_model_load_random): the canonical tensors of the
 * config in rw_config_for_each_weight order, the one value rule per tensor (rw_model_rand_params),
 * and the walk that has a backend generate each tensor and applies it through rw_wset_apply. The
 * host generator here is the CPU backend's ops->load_random; the CUDA backend generates on the
 * device (cuda_random.c) with the same rule, so both hold the same bytes. */
#include <stdlib.h>

#include "internal.h"
#include "rand.h"

void rw_model_rand_params(const rw_wname *w, const char *name, uint64_t seed, float std,
                          uint64_t *tensor_seed, float *mean, float *sd) {
    const bool norm = w->kind == RW_W_INPUT_NORM || w->kind == RW_W_POST_NORM ||
                      w->kind == RW_W_FINAL_NORM || w->kind == RW_W_Q_NORM ||
                      w->kind == RW_W_K_NORM;
    *tensor_seed = seed ^ rw_checksum64(name, strlen(name), 0x5eed);
    *mean = norm ? 1.0f : 0.0f;
    *sd = norm ? 0.1f : std;
}

typedef struct rand_walk {
    rw_model *m;
    uint64_t seed;
    float std;
    rw_rand_gen gen;
    void *ctx;
    rw_stream s;
    rw_err *err;
} rand_walk;

static rw_status rand_one(const rw_wname *w, void *vctx) {
    rand_walk *c = vctx;
    rw_err *err = c->err;
    char name[256];
    rw_name_format(w, name, sizeof name);
    rw_piece p;
    memset(&p, 0, sizeof p);
    RW_CHECK(rw_config_weight_shape(&c->m->cfg, w, &p.ndim, p.shape, err));
    rw_rand_tensor t = {w, name, 0, 0.0f, 0.0f, (size_t)rw_shape_numel(p.ndim, p.shape)};
    /* each tensor depends only on (seed, name): the same on every rank, TP degree and backend */
    rw_model_rand_params(w, name, c->seed, c->std, &t.seed, &t.mean, &t.sd);
    p.name = name;
    p.dtype = RW_DTYPE_BF16;
    p.shard_dim = -1;
    p.layout = RW_PIECE_PLAIN;
    RW_CHECK(c->gen(c->ctx, &t, &p, err));
    return rw_wset_apply(c->m->ws, &p, c->s, err);
}

rw_status rw_model_rand_apply(rw_model *m, uint64_t seed, float std, rw_rand_gen gen, void *ctx,
                              rw_stream s, rw_err *err) {
    rand_walk c = {m, seed, std, gen, ctx, s, err};
    return rw_config_for_each_weight(&m->cfg, rand_one, &c);
}

typedef struct host_gen {
    uint16_t *buf;
    size_t cap;
} host_gen;

static rw_status host_fill(void *vctx, const rw_rand_tensor *t, rw_piece *p, rw_err *err) {
    host_gen *g = vctx;
    if (t->n > g->cap) {
        uint16_t *nb = realloc(g->buf, t->n * sizeof(uint16_t));
        if (!nb) RW_FAIL(err, RW_E_OOM, "random weights: %zu elements for %s", t->n, t->name);
        g->buf = nb;
        g->cap = t->n;
    }
    for (size_t i = 0; i < t->n; i++)
        g->buf[i] = rw_rand_bf16_at(t->seed, i, t->mean, t->sd);
    p->data = g->buf;
    p->place = RW_PLACE_HOST;
    return RW_OK;
}

rw_status rw_model_load_random_host(rw_model *m, uint64_t seed, float std, rw_err *err) {
    host_gen g = {NULL, 0};
    const rw_status st = rw_model_rand_apply(m, seed, std, host_fill, &g, NULL, err);
    free(g.buf);
    return st;
}
