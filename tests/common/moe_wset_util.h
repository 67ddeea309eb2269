/* moe_wset_util.h - for the weight-set tests (tests/moe test_wset.c, cpu; test_layout_gpu.c, gpu):
 * a random canonical model in memory and the pieces a trainer would send for it (whole tensors,
 * Megatron TP shards with a trainer TP degree of its own, fused gate_up in the Megatron form,
 * expert-parallel shards of the fused tensors, odd splits along K), plus the offline-quantized
 * form of a checkpoint. */
#ifndef RW_TEST_MOE_WSET_UTIL_H
#define RW_TEST_MOE_WSET_UTIL_H

#include "moe_util.h"

typedef struct ttensor {
    char name[160];
    rw_dtype dtype;
    int ndim;
    int64_t shape[3];
    void *data;
} ttensor;

typedef struct tmodel {
    rw_config cfg;
    size_t n, cap;
    ttensor *t;
} tmodel;

static inline ttensor *tm_add(tmodel *m, const char *name, rw_dtype dt, int ndim,
                              const int64_t *shape, void *data) {
    if (m->n == m->cap) {
        m->cap = m->cap ? 2 * m->cap : 64;
        m->t = realloc(m->t, m->cap * sizeof *m->t);
        assert_non_null(m->t);
    }
    ttensor *t = &m->t[m->n++];
    memset(t, 0, sizeof *t);
    snprintf(t->name, sizeof t->name, "%s", name);
    t->dtype = dt;
    t->ndim = ndim;
    for (int i = 0; i < ndim; i++)
        t->shape[i] = shape[i];
    t->data = data;
    return t;
}

static inline size_t tt_bytes(const ttensor *t) {
    size_t n = rw_dtype_size(t->dtype);
    for (int i = 0; i < t->ndim; i++)
        n *= (size_t)t->shape[i];
    return n;
}

static inline ttensor *tm_find(const tmodel *m, const char *name) {
    for (size_t i = 0; i < m->n; i++)
        if (!strcmp(m->t[i].name, name)) return &m->t[i];
    return NULL;
}

typedef struct tm_walk {
    tmodel *m;
    uint64_t seed;
} tm_walk;

static inline rw_status tm_add_one(const rw_wname *w, void *ctx) {
    tm_walk *k = ctx;
    char name[160];
    rw_name_format(w, name, sizeof name);
    int nd;
    int64_t shape[RW_MAX_DIMS];
    rw_err err = {0};
    RW_ASSERT_OK(rw_config_weight_shape(&k->m->cfg, w, &nd, shape, &err), &err);
    size_t n = (size_t)rw_shape_numel(nd, shape);
    tm_add(k->m, name, RW_DTYPE_BF16, nd, shape, moe_test_rand_bf16(n, k->seed++, 0.5f));
    return RW_OK;
}

/* Every canonical tensor of `cfg`, random bf16. Takes ownership of cfg's strings. */
static inline void tm_make(tmodel *m, const rw_config *cfg, uint64_t seed) {
    memset(m, 0, sizeof *m);
    m->cfg = *cfg;
    tm_walk k = {m, seed};
    assert_int_equal(rw_config_for_each_weight(cfg, tm_add_one, &k), RW_OK);
}

/* tm_make on moe_test_config(&cfg, H, E, I, L, method, last_n_bf16): a random model in one call. */
static inline void tm_random(tmodel *m, int64_t H, int E, int64_t I, int L, rw_qmethod method,
                             int last_n_bf16, uint64_t seed) {
    rw_config c;
    moe_test_config(&c, H, E, I, L, method, last_n_bf16);
    tm_make(m, &c, seed);
}

static inline void tm_free(tmodel *m) {
    for (size_t i = 0; i < m->n; i++)
        free(m->t[i].data);
    free(m->t);
    rw_config_free(&m->cfg);
    memset(m, 0, sizeof *m);
}

/* A list of pieces with the buffers they own. */
typedef struct plist {
    size_t n, cap;
    rw_piece *p;
    void **own;
} plist;

static inline void pl_push(plist *l, rw_piece p, void *owned) {
    if (l->n == l->cap) {
        l->cap = l->cap ? 2 * l->cap : 64;
        l->p = realloc(l->p, l->cap * sizeof *l->p);
        l->own = realloc(l->own, l->cap * sizeof *l->own);
        assert_non_null(l->p);
    }
    l->own[l->n] = owned;
    l->p[l->n++] = p;
}

static inline void pl_free(plist *l) {
    for (size_t i = 0; i < l->n; i++)
        free(l->own[i]);
    free(l->p);
    free(l->own);
    memset(l, 0, sizeof *l);
}

static inline rw_piece piece_whole(const ttensor *t) {
    rw_piece p;
    memset(&p, 0, sizeof p);
    p.name = t->name;
    p.dtype = t->dtype;
    p.ndim = t->ndim;
    for (int i = 0; i < t->ndim; i++)
        p.shape[i] = t->shape[i];
    p.shard_dim = -1;
    p.layout = RW_PIECE_PLAIN;
    p.data = t->data;
    p.place = RW_PLACE_HOST;
    p.nbytes = tt_bytes(t);
    return p;
}

/* Copies [b, b + len) along `dim` of t into a new contiguous buffer. */
static inline void *tt_slice(const ttensor *t, int dim, int64_t b, int64_t len) {
    int64_t outer = 1, inner = 1;
    for (int i = 0; i < dim; i++)
        outer *= t->shape[i];
    for (int i = dim + 1; i < t->ndim; i++)
        inner *= t->shape[i];
    size_t es = rw_dtype_size(t->dtype);
    uint8_t *o = malloc((size_t)(outer * len * inner) * es + 1);
    assert_non_null(o);
    for (int64_t a = 0; a < outer; a++)
        memcpy(o + (size_t)(a * len * inner) * es,
               (const uint8_t *)t->data + (size_t)((a * t->shape[dim] + b) * inner) * es,
               (size_t)(len * inner) * es);
    return o;
}

static inline void pl_shard(plist *l, const ttensor *t, int dim, int64_t b, int64_t len) {
    rw_piece p = piece_whole(t);
    p.shard_dim = dim;
    p.shard_begin = b;
    p.shard_len = len;
    void *d = tt_slice(t, dim, b, len);
    p.data = d;
    p.nbytes = rw_piece_nbytes(&p);
    pl_push(l, p, d);
}

/* Splits t along dim into `parts` equal pieces (or the given cut points when cuts != NULL). */
static inline void pl_split(plist *l, const ttensor *t, int dim, int parts, const int64_t *cuts) {
    int64_t n = t->shape[dim];
    for (int k = 0; k < parts; k++) {
        int64_t b = cuts ? cuts[k] : n * k / parts, e = cuts ? cuts[k + 1] : n * (k + 1) / parts;
        pl_shard(l, t, dim, b, e - b);
    }
}

/* Fused canonical tensors of layer l: gate_up [E, 2I, H] = [gate; up] and down [E, H, I]. Added
 * to the model (names "model.layers.L.mlp.experts.gate_up_proj" / ".down_proj"). */
static inline void tm_add_fused(tmodel *m, int l) {
    int64_t E = m->cfg.num_experts, I = m->cfg.moe_intermediate, H = m->cfg.hidden_size;
    uint16_t *gu = malloc(sizeof(uint16_t) * (size_t)(E * 2 * I * H));
    uint16_t *dn = malloc(sizeof(uint16_t) * (size_t)(E * H * I));
    for (int64_t e = 0; e < E; e++) {
        char nm[160];
        snprintf(nm, sizeof nm, "model.layers.%d.mlp.experts.%lld.gate_proj.weight", l,
                 (long long)e);
        ttensor *g = tm_find(m, nm);
        snprintf(nm, sizeof nm, "model.layers.%d.mlp.experts.%lld.up_proj.weight", l, (long long)e);
        ttensor *u = tm_find(m, nm);
        snprintf(nm, sizeof nm, "model.layers.%d.mlp.experts.%lld.down_proj.weight", l,
                 (long long)e);
        ttensor *d = tm_find(m, nm);
        memcpy(gu + e * 2 * I * H, g->data, sizeof(uint16_t) * (size_t)(I * H));
        memcpy(gu + e * 2 * I * H + I * H, u->data, sizeof(uint16_t) * (size_t)(I * H));
        memcpy(dn + e * H * I, d->data, sizeof(uint16_t) * (size_t)(H * I));
    }
    char nm[160];
    snprintf(nm, sizeof nm, "model.layers.%d.mlp.experts.gate_up_proj", l);
    tm_add(m, nm, RW_DTYPE_BF16, 3, (const int64_t[]){E, 2 * I, H}, gu);
    snprintf(nm, sizeof nm, "model.layers.%d.mlp.experts.down_proj", l);
    tm_add(m, nm, RW_DTYPE_BF16, 3, (const int64_t[]){E, H, I}, dn);
}

/* Megatron-style shard of the fused gate_up: [E, 2 len, H] = [gate rows [b, b+len); up rows]. */
static inline void pl_gate_up_shard(plist *l, const ttensor *gu, int64_t I, int64_t b,
                                    int64_t len) {
    int64_t E = gu->shape[0], H = gu->shape[2];
    uint16_t *o = malloc(sizeof(uint16_t) * (size_t)(E * 2 * len * H));
    const uint16_t *x = gu->data;
    for (int64_t e = 0; e < E; e++) {
        memcpy(o + e * 2 * len * H, x + (e * 2 * I + b) * H, sizeof(uint16_t) * (size_t)(len * H));
        memcpy(o + e * 2 * len * H + len * H, x + (e * 2 * I + I + b) * H,
               sizeof(uint16_t) * (size_t)(len * H));
    }
    rw_piece p = piece_whole(gu);
    p.shard_dim = 1;
    p.shard_begin = b;
    p.shard_len = len;
    p.layout = RW_PIECE_GATE_UP;
    p.data = o;
    p.nbytes = rw_piece_nbytes(&p);
    pl_push(l, p, o);
}

typedef enum tmode {
    TM_PLAIN = 0,     /* per-expert tensors, Megatron TP shards */
    TM_GATE_UP = 1,   /* fused gate_up in the Megatron form, fused down split along I */
    TM_EP = 2,        /* fused tensors split along the expert dim */
    TM_ODD = 3,       /* per-expert tensors split along K at odd offsets, attention along K */
    TM_FUSED_ODD = 4, /* fused gate_up split along its 2I rows at cuts crossing gate / up, fused
                         down along H, both at odd offsets */
} tmode;

static inline bool is_kind(const char *name, const char *suffix) {
    size_t n = strlen(name), k = strlen(suffix);
    return n >= k && !strcmp(name + n - k, suffix);
}

/* The pieces trainer TP degree `tt` sends for the model's canonical tensors (per-expert tensors
 * or, for the fused modes, the layer's fused tensors, which must have been added). Weights of a
 * quantized checkpoint (e4m3) are split the same way; their scales are sent whole. */
static inline void pl_trainer(plist *l, const tmodel *m, int tt, tmode mode) {
    int64_t I = m->cfg.moe_intermediate, E = m->cfg.num_experts;
    for (size_t i = 0; i < m->n; i++) {
        const ttensor *t = &m->t[i];
        if (is_kind(t->name, "_scale_inv")) { /* scales of a quantized checkpoint: whole */
            pl_push(l, piece_whole(t), NULL);
            continue;
        }
        bool fused =
            is_kind(t->name, "experts.gate_up_proj") || is_kind(t->name, "experts.down_proj");
        bool expert = !fused && strstr(t->name, ".mlp.experts.") != NULL;
        bool fused_mode = mode == TM_GATE_UP || mode == TM_EP || mode == TM_FUSED_ODD;
        if (fused_mode ? expert : fused) continue;
        if (fused) {
            bool gu = is_kind(t->name, "gate_up_proj");
            if (mode == TM_FUSED_ODD) {
                int64_t n = t->shape[1];
                int64_t cuts[4] = {0, n / 2 - 37, n / 2 + 11, n}; /* the middle piece spans both */
                pl_split(l, t, 1, 3, cuts);
            } else if (mode == TM_EP) {
                int parts = tt < E ? tt : (int)E;
                pl_split(l, t, 0, parts, NULL);
            } else if (gu) {
                for (int r = 0; r < tt; r++)
                    pl_gate_up_shard(l, t, I, r * (I / tt), I / tt);
            } else {
                pl_split(l, t, 2, tt, NULL);
            }
            continue;
        }
        if (mode == TM_ODD && t->ndim == 2 && (expert || strstr(t->name, "self_attn"))) {
            /* three pieces along K (dim 1) at offsets that straddle 32- and 128-blocks */
            int64_t K = t->shape[1];
            int64_t cuts[4] = {0, K / 3 + 5, 2 * K / 3 + 17, K};
            pl_split(l, t, 1, 3, cuts);
            continue;
        }
        if (is_kind(t->name, "gate_proj.weight") || is_kind(t->name, "up_proj.weight") ||
            is_kind(t->name, "q_proj.weight") || is_kind(t->name, "k_proj.weight") ||
            is_kind(t->name, "v_proj.weight") || is_kind(t->name, "embed_tokens.weight") ||
            is_kind(t->name, "lm_head.weight"))
            pl_split(l, t, 0, tt, NULL);
        else if (is_kind(t->name, "down_proj.weight") || is_kind(t->name, "o_proj.weight"))
            pl_split(l, t, 1, tt, NULL);
        else
            pl_push(l, piece_whole(t), NULL); /* norms, router: replicated */
    }
}

static inline void pl_whole(plist *l, const tmodel *m) {
    for (size_t i = 0; i < m->n; i++) {
        const ttensor *t = &m->t[i];
        if (is_kind(t->name, "experts.gate_up_proj") || is_kind(t->name, "experts.down_proj"))
            continue;
        pl_push(l, piece_whole(t), NULL);
    }
}

/* A new list of every per-tensor piece of the model, whole (pl_whole; pl_free releases it). */
static inline plist pl_whole_of(const tmodel *m) {
    plist l = {0};
    pl_whole(&l, m);
    return l;
}

/* Deterministic shuffle of a piece list (different arrival orders). */
static inline void pl_shuffle(plist *l, uint64_t seed) {
    rw_rng r;
    rw_rng_seed(&r, seed);
    for (size_t i = l->n; i > 1; i--) {
        size_t j = (size_t)(rw_rng_u64(&r) % i);
        rw_piece tp = l->p[i - 1];
        l->p[i - 1] = l->p[j];
        l->p[j] = tp;
        void *to = l->own[i - 1];
        l->own[i - 1] = l->own[j];
        l->own[j] = to;
    }
}

/* One trainer form of a model's pieces: what trainer TP `tt` sends in form `mode` (pl_trainer),
 * in the arrival order of `seed` (pl_shuffle), and a description naming them for failures. */
typedef struct trainer_case {
    plist l;
    char what[160];
} trainer_case;

static inline void tc_make(trainer_case *c, const tmodel *m, int tt, tmode mode, uint64_t seed,
                           const char *label) {
    memset(c, 0, sizeof *c);
    pl_trainer(&c->l, m, tt, mode);
    pl_shuffle(&c->l, seed);
    snprintf(c->what, sizeof c->what, "%s, trainer TP %d mode %d", label, tt, (int)mode);
}

/* The offline-quantized checkpoint of `m` under its config: every tensor the policy quantizes
 * becomes an e4m3 weight plus its .weight_scale_inv (mxfp8 u8 [N, K/32] or fp8 f32 blocks);
 * the others stay bf16. */
static inline void tm_quantized(const tmodel *m, tmodel *q) {
    memset(q, 0, sizeof *q);
    rw_config_copy(&m->cfg, &q->cfg, NULL);
    for (size_t i = 0; i < m->n; i++) {
        const ttensor *t = &m->t[i];
        rw_wname w;
        rw_err err = {0};
        RW_ASSERT_OK(rw_name_parse(t->name, &m->cfg, &w, &err), &err);
        rw_wfmt f = rw_quant_policy(&m->cfg, &w);
        if (f == RW_WFMT_BF16 || t->ndim != 2) {
            size_t nb = tt_bytes(t);
            void *d = malloc(nb);
            memcpy(d, t->data, nb);
            tm_add(q, t->name, t->dtype, t->ndim, t->shape, d);
            continue;
        }
        int64_t R = t->shape[0], C = t->shape[1], ss[2];
        rw_quant_scale_shape(f, R, C, ss);
        uint8_t *qq = malloc((size_t)(R * C));
        void *sc = malloc((size_t)(ss[0] * ss[1]) * (f == RW_WFMT_MXFP8 ? 1 : 4));
        if (f == RW_WFMT_MXFP8)
            RW_ASSERT_OK(rw_quant_mxfp8_ref(t->data, R, C, qq, sc, &err), &err);
        else
            RW_ASSERT_OK(rw_quant_fp8_block_ref(t->data, R, C, qq, sc, &err), &err);
        tm_add(q, t->name, RW_DTYPE_E4M3, 2, t->shape, qq);
        char sn[176];
        snprintf(sn, sizeof sn, "%s_scale_inv", t->name);
        tm_add(q, sn, f == RW_WFMT_MXFP8 ? RW_DTYPE_U8 : RW_DTYPE_F32, 2, ss, sc);
    }
}

/* tm_random and its offline-quantized checkpoint (tm_quantized) into q. */
static inline void tm_random_quantized(tmodel *m, tmodel *q, int64_t H, int E, int64_t I, int L,
                                       rw_qmethod method, int last_n_bf16, uint64_t seed) {
    tm_random(m, H, E, I, L, method, last_n_bf16, seed);
    tm_quantized(m, q);
}

#endif
