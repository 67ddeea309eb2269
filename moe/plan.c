/* plan.c - tensor-parallel shard plans (docs/LAYOUT.md section 2): for a config, a TP degree T and
 * a rank r, where each canonical tensor's part for r comes from and the local (padded) shape it
 * becomes. Every offset is computed from the unpadded size: rank r of an expert weight reads
 * [r * S, (r + 1) * S) with S = I / T, never r * P. */
#include "rw_moe.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

rw_status rw_tp_dims_make(const rw_config *cfg, int tp, int rank, rw_tp_dims *out, rw_err *err) {
    if (!cfg || !out) RW_FAIL(err, RW_E_INVALID_ARG, "tp dims: NULL config or output");
    memset(out, 0, sizeof *out);
    if (tp < 1 || tp > 64) RW_FAIL(err, RW_E_RANGE, "tp dims: TP degree %d outside 1..64", tp);
    if (rank < 0 || rank >= tp)
        RW_FAIL(err, RW_E_RANGE, "tp dims: rank %d outside 0..%d", rank, tp - 1);
    if (cfg->num_heads <= 0 || cfg->num_kv_heads <= 0 || cfg->head_dim <= 0 ||
        cfg->moe_intermediate <= 0 || cfg->hidden_size <= 0 || cfg->vocab_size <= 0)
        RW_FAIL(err, RW_E_SHAPE,
                "tp dims: config has a non-positive size (heads %d, kv heads %d, head_dim %d, "
                "moe_intermediate %d, hidden %d, vocab %d)",
                cfg->num_heads, cfg->num_kv_heads, cfg->head_dim, cfg->moe_intermediate,
                cfg->hidden_size, cfg->vocab_size);
    if (cfg->num_heads % tp)
        RW_FAIL(err, RW_E_SHAPE, "tp dims: TP %d does not divide num_attention_heads %d", tp,
                cfg->num_heads);
    if (cfg->moe_intermediate % tp)
        RW_FAIL(err, RW_E_SHAPE, "tp dims: TP %d does not divide moe_intermediate_size %d", tp,
                cfg->moe_intermediate);
    int nkv = cfg->num_kv_heads;
    if (tp <= nkv ? nkv % tp : tp % nkv)
        RW_FAIL(err, RW_E_SHAPE,
                "tp dims: TP %d and num_key_value_heads %d: one must divide the other", tp, nkv);
    int64_t Vp = rw_roundup(cfg->vocab_size, 64);
    if (Vp % tp)
        RW_FAIL(err, RW_E_SHAPE, "tp dims: TP %d does not divide the padded vocab %lld", tp,
                (long long)Vp);
    out->tp = tp;
    out->rank = rank;
    out->S = cfg->moe_intermediate / tp;
    out->P = rw_roundup(out->S, 128);
    out->nh_local = cfg->num_heads / tp;
    if (tp <= nkv) {
        out->nkv_local = nkv / tp;
        out->kv_head0 = rank * (nkv / tp);
    } else {
        out->nkv_local = 1;
        out->kv_head0 = rank / (tp / nkv); /* T/nKV ranks share one replicated kv head */
    }
    out->Vp = Vp;
    out->v_local = Vp / tp;
    out->v_begin = rank * out->v_local;
    return RW_OK;
}

/* Fills the range fields of `p` for a tensor sharded along `dim` from `b` to `e` (unpadded,
 * canonical coordinates) whose local logical extent along that dim is `local`. */
static void set_range(rw_shard_plan *p, int dim, int64_t b, int64_t e, int64_t local) {
    p->dim = dim;
    p->src_begin = b;
    p->src_end = e;
    p->dst_ndim = p->ndim;
    for (int i = 0; i < p->ndim; i++)
        p->dst_shape[i] = p->canon_shape[i];
    if (dim >= 0) p->dst_shape[dim] = local;
    p->padded = dim >= 0 && local > e - b;
}

rw_status rw_moe_plan_tensor(const rw_config *cfg, int tp, int rank, const rw_wname *w,
                             rw_shard_plan *out, rw_err *err) {
    if (!w || !out) RW_FAIL(err, RW_E_INVALID_ARG, "shard plan: NULL tensor or output");
    rw_tp_dims d;
    RW_CHECK(rw_tp_dims_make(cfg, tp, rank, &d, err));
    memset(out, 0, sizeof *out);
    out->w = *w;
    rw_wname plain = *w;
    plain.scale = false;
    RW_CHECK(rw_config_weight_shape(cfg, &plain, &out->ndim, out->canon_shape, err));
    if (w->scale) {
        /* Scale tensors are planned by the weight set (their shape depends on the format). */
        char name[160];
        rw_name_format(w, name, sizeof name);
        RW_FAIL(err, RW_E_UNSUPPORTED, "shard plan: '%s' is a quantization scale; plan its weight",
                name);
    }
    int64_t hd = cfg->head_dim, S = d.S, r = rank;
    switch (w->kind) {
    case RW_W_EMBED:
    case RW_W_LM_HEAD: {
        /* Rows [v_begin, v_begin + v_local) of the vocab padded to Vp; rows past V are zeros. */
        int64_t V = cfg->vocab_size;
        int64_t b = d.v_begin < V ? d.v_begin : V;
        int64_t e = d.v_begin + d.v_local < V ? d.v_begin + d.v_local : V;
        set_range(out, 0, b, e, d.v_local);
        break;
    }
    case RW_W_Q: {
        int64_t n = (int64_t)d.nh_local * hd;
        set_range(out, 0, r * n, (r + 1) * n, n);
        break;
    }
    case RW_W_K:
    case RW_W_V: {
        int64_t n = (int64_t)d.nkv_local * hd;
        set_range(out, 0, (int64_t)d.kv_head0 * hd, (int64_t)d.kv_head0 * hd + n, n);
        break;
    }
    case RW_W_O: {
        int64_t n = (int64_t)d.nh_local * hd;
        set_range(out, 1, r * n, (r + 1) * n, n);
        break;
    }
    case RW_W_FINAL_NORM:
    case RW_W_INPUT_NORM:
    case RW_W_POST_NORM:
    case RW_W_Q_NORM:
    case RW_W_K_NORM:
    case RW_W_ROUTER: set_range(out, -1, 0, out->canon_shape[0], out->canon_shape[0]); break;
    case RW_W_EXP_GATE:
    case RW_W_EXP_UP: set_range(out, 0, r * S, (r + 1) * S, d.P); break;
    case RW_W_EXP_DOWN: set_range(out, 1, r * S, (r + 1) * S, d.P); break;
    case RW_W_EXP_GATE_UP: {
        /* [E, 2I, H] = [gate; up]: each half sliced on its own; local [E, 2P, H] up-first. */
        int64_t I = cfg->moe_intermediate;
        set_range(out, 1, r * S, (r + 1) * S, 2 * d.P);
        out->src2_begin = I + r * S;
        out->src2_end = I + (r + 1) * S;
        out->padded = d.P > S;
        break;
    }
    case RW_W_EXP_DOWN_ALL: set_range(out, 2, r * S, (r + 1) * S, d.P); break;
    default: RW_FAIL(err, RW_E_INVALID_ARG, "shard plan: tensor kind %d has no plan", (int)w->kind);
    }
    return RW_OK;
}

/* A growing string buffer; `oom` records an allocation failure (later appends are ignored). */
typedef struct sbuf {
    char *p;
    size_t len, cap;
    bool oom;
} sbuf;

static void sb_printf(sbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void sb_printf(sbuf *b, const char *fmt, ...) {
    if (b->oom) return;
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int n = vsnprintf(b->p ? b->p + b->len : NULL, b->p ? b->cap - b->len : 0, fmt, ap);
        va_end(ap);
        if (n < 0) {
            b->oom = true;
            return;
        }
        if (b->p && b->len + (size_t)n < b->cap) {
            b->len += (size_t)n;
            return;
        }
        size_t cap = b->cap ? b->cap : 256;
        while (cap <= b->len + (size_t)n)
            cap *= 2;
        char *q = realloc(b->p, cap);
        if (!q) {
            b->oom = true;
            return;
        }
        b->p = q;
        b->cap = cap;
    }
}

static void sb_shape(sbuf *b, int ndim, const int64_t *shape) {
    sb_printf(b, "[");
    for (int i = 0; i < ndim; i++)
        sb_printf(b, "%s%lld", i ? ", " : "", (long long)shape[i]);
    sb_printf(b, "]");
}

rw_status rw_moe_plan_json(const rw_shard_plan *p, char **out, rw_err *err) {
    if (!p || !out) RW_FAIL(err, RW_E_INVALID_ARG, "plan json: NULL plan or output");
    *out = NULL;
    char name[192];
    rw_name_format(&p->w, name, sizeof name);
    sbuf b = {0};
    /* Canonical names hold only [A-Za-z0-9._]: no JSON escaping needed. */
    sb_printf(&b, "{\"tensor\": \"%s\", \"kind\": \"%s\", \"dim\": ", name,
              rw_wkind_str(p->w.kind));
    if (p->dim >= 0)
        sb_printf(&b, "%d", p->dim);
    else
        sb_printf(&b, "null");
    sb_printf(&b, ", \"canon_shape\": ");
    sb_shape(&b, p->ndim, p->canon_shape);
    sb_printf(&b, ", \"src_begin\": %lld, \"src_end\": %lld", (long long)p->src_begin,
              (long long)p->src_end);
    if (p->w.kind == RW_W_EXP_GATE_UP)
        sb_printf(&b, ", \"src2_begin\": %lld, \"src2_end\": %lld", (long long)p->src2_begin,
                  (long long)p->src2_end);
    sb_printf(&b, ", \"dst_shape\": ");
    sb_shape(&b, p->dst_ndim, p->dst_shape);
    sb_printf(&b, ", \"padded\": %s}", p->padded ? "true" : "false");
    if (b.oom) {
        free(b.p);
        RW_FAIL(err, RW_E_OOM, "plan json: out of memory");
    }
    *out = b.p;
    return RW_OK;
}
