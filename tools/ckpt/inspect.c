/* inspect.c - `rw-ckpt inspect DIR`: the config summary, tensor count and bytes per dtype of a
 * checkpoint, and every tensor checked against the config: unknown names, missing tensors,
 * shapes other than the canonical ones, dtypes a weight cannot have, and quantization scales
 * that do not fit their weights. Exit 0 when nothing is wrong, 1 when anything is, 2 when the
 * checkpoint cannot be read at all. */
#include "ckpt_tool.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

typedef enum {
    P_UNKNOWN = 0,    /* name not canonical, or index out of range */
    P_MISSING = 1,    /* expected by the config, absent */
    P_SHAPE = 2,      /* wrong shape (weights and scales) */
    P_DTYPE = 3,      /* a dtype the tensor cannot have */
    P_UNEXPECTED = 4, /* canonical name, but not part of this model (orphan scale, double form) */
    P_COUNT_ = 5,
} problem_kind;

static const char *problem_label[P_COUNT_] = {"unknown", "missing", "mis-shaped", "bad dtype",
                                              "unexpected"};

typedef struct {
    char **lines;
    size_t n, cap;
} strlist;

typedef struct {
    const rw_config *cfg;
    const rw_ckpt *ck;
    strlist p[P_COUNT_];
    bool oom;
    size_t recognised;
    /* which expert weights a layer holds, per expert and kind (gate, up, down), and whether it
     * holds the fused forms */
    uint8_t *per_expert; /* [L][E] bitmask: 1 gate, 2 up, 4 down */
    uint8_t *fused;      /* [L] bitmask: 1 gate_up_proj, 2 down_proj */
} inspect_ctx;

static void add(inspect_ctx *x, problem_kind k, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static void add(inspect_ctx *x, problem_kind k, const char *fmt, ...) {
    strlist *l = &x->p[k];
    if (l->n == l->cap) {
        size_t nc = l->cap ? 2 * l->cap : 16;
        char **nl = realloc(l->lines, nc * sizeof *nl);
        if (!nl) {
            x->oom = true;
            return;
        }
        l->lines = nl;
        l->cap = nc;
    }
    char buf[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    l->lines[l->n] = strdup(buf);
    if (!l->lines[l->n]) {
        x->oom = true;
        return;
    }
    l->n++;
}

static bool same_shape(int nd, const int64_t *s, int nd2, const int64_t *s2) {
    if (nd != nd2) return false;
    for (int i = 0; i < nd; i++)
        if (s[i] != s2[i]) return false;
    return true;
}

static bool is_float(rw_dtype d) {
    return d == RW_DTYPE_BF16 || d == RW_DTYPE_F16 || d == RW_DTYPE_F32;
}

/* Linear weights are the only ones a quantized checkpoint stores in e4m3. */
static bool quantizable(rw_wkind k) {
    switch (k) {
    case RW_W_Q:
    case RW_W_K:
    case RW_W_V:
    case RW_W_O:
    case RW_W_EXP_GATE:
    case RW_W_EXP_UP:
    case RW_W_EXP_DOWN: return true;
    default: return false;
    }
}

/* modules_to_not_convert entries match on dotted boundaries: "model.layers.4." matches layer 4
 * only, "lm_head" matches "lm_head.weight". */
static bool not_converted(const rw_config *c, const char *name) {
    for (int i = 0; i < c->quant.n_not_convert; i++) {
        const char *p = c->quant.not_convert[i];
        size_t n = strlen(p);
        if (n == 0 || strncmp(name, p, n)) continue;
        if (p[n - 1] == '.' || name[n] == '.' || name[n] == 0) return true;
    }
    return false;
}

/* Checks an e4m3 weight's scale tensor `<stem>.weight_scale_inv`. */
static void check_scale(inspect_ctx *x, const char *name, const rw_wname *w, int nd,
                        const int64_t *shape) {
    const rw_config *c = x->cfg;
    rw_wname sw = *w;
    sw.scale = true;
    char sname[RW_ST_MAX_NAME + 32];
    rw_name_format(&sw, sname, sizeof sname);
    const rw_st_entry *s = rw_ckpt_find(x->ck, sname);
    if (c->quant.method == RW_QMETHOD_NONE) {
        add(x, P_DTYPE, "%s: e4m3, but config.json has no quantization_config", name);
        return;
    }
    if (not_converted(c, name))
        add(x, P_DTYPE, "%s: e4m3, but it is listed in modules_to_not_convert", name);
    if (!s) {
        add(x, P_MISSING, "%s (the scale of e4m3 weight %s)", sname, name);
        return;
    }
    int64_t rows = shape[0], cols = shape[nd - 1];
    int64_t want[2];
    char a[96], b[96];
    if (c->quant.method == RW_QMETHOD_MXFP8) {
        if (cols % 32) {
            add(x, P_SHAPE, "%s: %lld columns are not a multiple of 32 (mxfp8 blocks)", name,
                (long long)cols);
            return;
        }
        want[0] = rows;
        want[1] = cols / 32;
        if (s->dtype != RW_DTYPE_U8 && s->dtype != RW_DTYPE_UE8M0)
            add(x, P_DTYPE, "%s: %s, expected u8 (UE8M0 exponents) for mxfp8", sname,
                rw_dtype_name(s->dtype));
    } else {
        want[0] = (rows + 127) / 128;
        want[1] = (cols + 127) / 128;
        if (s->dtype != RW_DTYPE_F32)
            add(x, P_DTYPE, "%s: %s, expected f32 for fp8 128x128 blocks", sname,
                rw_dtype_name(s->dtype));
    }
    if (!same_shape(s->ndim, s->shape, 2, want))
        add(x, P_SHAPE, "%s: %s, expected %s", sname, rw_shape_str(s->ndim, s->shape, a, sizeof a),
            rw_shape_str(2, want, b, sizeof b));
}

static void check_tensor(inspect_ctx *x, const rw_st_entry *e) {
    const rw_config *c = x->cfg;
    rw_wname w;
    rw_err err = {0};
    if (rw_name_parse(e->name, c, &w, &err) != RW_OK) {
        add(x, P_UNKNOWN, "%s", err.msg); /* the message quotes the name */
        return;
    }
    x->recognised++;
    char a[96], b[96];
    if (w.scale) {
        /* checked with its weight; here only: is there an e4m3 weight for it? */
        rw_wname ww = w;
        ww.scale = false;
        char wname[RW_ST_MAX_NAME + 32];
        rw_name_format(&ww, wname, sizeof wname);
        const rw_st_entry *we = rw_ckpt_find(x->ck, wname);
        if (!we || we->dtype != RW_DTYPE_E4M3)
            add(x, P_UNEXPECTED, "%s: a scale without an e4m3 weight %s", e->name, wname);
        return;
    }
    if (w.kind == RW_W_LM_HEAD && c->tie_word_embeddings)
        add(x, P_UNEXPECTED, "%s: tie_word_embeddings is true, the head is the embedding", e->name);
    if (w.layer >= 0) {
        if (w.expert >= 0)
            x->per_expert[(size_t)w.layer * c->num_experts + w.expert] |=
                (uint8_t)(1u << (w.kind - RW_W_EXP_GATE));
        else if (w.kind == RW_W_EXP_GATE_UP)
            x->fused[w.layer] |= 1;
        else if (w.kind == RW_W_EXP_DOWN_ALL)
            x->fused[w.layer] |= 2;
    }
    int nd = 0;
    int64_t shape[RW_MAX_DIMS];
    if (rw_config_weight_shape(c, &w, &nd, shape, &err) != RW_OK) {
        add(x, P_UNKNOWN, "%s (%s)", e->name, err.msg);
        return;
    }
    bool shape_ok = same_shape(e->ndim, e->shape, nd, shape);
    if (!shape_ok)
        add(x, P_SHAPE, "%s: %s %s, expected %s", e->name,
            rw_shape_str(e->ndim, e->shape, a, sizeof a), rw_dtype_name(e->dtype),
            rw_shape_str(nd, shape, b, sizeof b));
    if (e->dtype == RW_DTYPE_E4M3) {
        if (w.kind == RW_W_EXP_GATE_UP || w.kind == RW_W_EXP_DOWN_ALL) {
            add(x, P_DTYPE,
                "%s: e4m3 fused expert tensors are not supported (quantized experts "
                "are stored per expert with a .weight_scale_inv)",
                e->name);
            return;
        }
        if (!quantizable(w.kind)) {
            add(x, P_DTYPE, "%s: e4m3, but %s weights are never quantized", e->name,
                rw_wkind_str(w.kind));
            return;
        }
        if (shape_ok) check_scale(x, e->name, &w, nd, shape);
    } else if (!is_float(e->dtype)) {
        add(x, P_DTYPE, "%s: %s, expected bf16, f16 or f32%s", e->name, rw_dtype_name(e->dtype),
            quantizable(w.kind) ? " (or e4m3 with a scale)" : "");
    }
}

/* Every tensor the config implies, per expert or fused. */
static rw_status check_present(const rw_wname *w, void *ctx) {
    inspect_ctx *x = ctx;
    char name[RW_ST_MAX_NAME + 32];
    rw_name_format(w, name, sizeof name);
    if (rw_wkind_is_expert(w->kind)) {
        int bit = w->kind - RW_W_EXP_GATE;
        bool have = x->per_expert[(size_t)w->layer * x->cfg->num_experts + w->expert] & (1u << bit);
        uint8_t fmask = w->kind == RW_W_EXP_DOWN ? 2 : 1;
        bool fused = x->fused[w->layer] & fmask;
        if (have && fused && w->expert == 0)
            add(x, P_UNEXPECTED, "layer %d holds %s both per expert and fused (%s)", w->layer,
                rw_wkind_str(w->kind),
                fmask == 1 ? "mlp.experts.gate_up_proj" : "mlp.experts.down_proj");
        if (!have && !fused) add(x, P_MISSING, "%s", name);
        return RW_OK;
    }
    if (!rw_ckpt_find(x->ck, name)) add(x, P_MISSING, "%s", name);
    return RW_OK;
}

static void human_bytes(double b, char *buf, size_t cap) {
    const char *u[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    int i = 0;
    while (b >= 1024 && i < 4)
        b /= 1024, i++;
    snprintf(buf, cap, i ? "%.2f %s" : "%.0f %s", b, u[i]);
}

static const char *qmethod_str(const rw_config *c, char *buf, size_t cap) {
    switch (c->quant.method) {
    case RW_QMETHOD_NONE: return "none (unquantized)";
    case RW_QMETHOD_MXFP8:
        snprintf(buf, cap,
                 "mxfp8 (e4m3, UE8M0 scale per 1x32), %d module prefixes kept unquantized",
                 c->quant.n_not_convert);
        return buf;
    case RW_QMETHOD_FP8_BLOCK:
        snprintf(buf, cap,
                 "fp8 block (e4m3, f32 scale per 128x128), %d module prefixes kept "
                 "unquantized",
                 c->quant.n_not_convert);
        return buf;
    }
    return "?";
}

static void usage(FILE *f) {
    fprintf(f, "usage: rw-ckpt inspect [--all] DIR\n"
               "\n"
               "Reads DIR/config.json and the checkpoint's safetensors files (an index with\n"
               "shards, a lone model.safetensors, or every *.safetensors file), prints a summary\n"
               "and checks every tensor against the config. Problems are listed by kind\n"
               "(unknown, missing, mis-shaped, bad dtype, unexpected); at most 100 of each unless\n"
               "--all is given.\n"
               "\n"
               "exit status: 0 all tensors recognised and none missing, 1 problems found,\n"
               "2 the checkpoint or its config could not be read.\n");
}

int rw_ckpt_inspect_main(int argc, char **argv) {
    const char *dir = NULL;
    bool all = false;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(argv[i], "--all")) {
            all = true;
        } else if (argv[i][0] == '-') {
            fprintf(stderr, "rw-ckpt inspect: unknown option %s\n", argv[i]);
            usage(stderr);
            return 2;
        } else if (!dir) {
            dir = argv[i];
        } else {
            fprintf(stderr, "rw-ckpt inspect: one directory only (got %s and %s)\n", dir, argv[i]);
            return 2;
        }
    }
    if (!dir) {
        usage(stderr);
        return 2;
    }
    char cpath[4096];
    snprintf(cpath, sizeof cpath, "%s/config.json", dir);
    rw_config cfg;
    rw_err err = {0};
    if (rw_config_load(cpath, &cfg, &err) != RW_OK) {
        fprintf(stderr, "rw-ckpt inspect: %s\n", err.msg);
        return 2;
    }
    rw_ckpt *ck = NULL;
    if (rw_ckpt_open(dir, &ck, &err) != RW_OK) {
        fprintf(stderr, "rw-ckpt inspect: %s\n", err.msg);
        rw_config_free(&cfg);
        return 2;
    }
    char qb[160], hb[32];
    printf("checkpoint   %s (%zu file%s)\n", dir, rw_ckpt_file_count(ck),
           rw_ckpt_file_count(ck) == 1 ? "" : "s");
    printf("config       layers %d, hidden %d, experts %d, top-k %d, heads %d q / %d kv x %d, "
           "moe_intermediate %d, vocab %d\n",
           cfg.num_layers, cfg.hidden_size, cfg.num_experts, cfg.top_k, cfg.num_heads,
           cfg.num_kv_heads, cfg.head_dim, cfg.moe_intermediate, cfg.vocab_size);
    printf("             max_position %d, rope_theta %g, rms_eps %g, norm_topk_prob %s, tied "
           "embeddings %s\n",
           cfg.max_position, cfg.rope_theta, cfg.rms_eps, cfg.norm_topk_prob ? "yes" : "no",
           cfg.tie_word_embeddings ? "yes" : "no");
    printf("quantization %s\n", qmethod_str(&cfg, qb, sizeof qb));

    size_t n = rw_ckpt_count(ck);
    uint64_t bytes_dt[RW_DTYPE_COUNT_] = {0}, total = 0;
    size_t count_dt[RW_DTYPE_COUNT_] = {0};
    for (size_t i = 0; i < n; i++) {
        const rw_st_entry *e = rw_ckpt_at(ck, i);
        bytes_dt[e->dtype] += e->end - e->begin;
        count_dt[e->dtype]++;
        total += e->end - e->begin;
    }
    human_bytes((double)total, hb, sizeof hb);
    printf("tensors      %zu, %llu bytes (%s)\n", n, (unsigned long long)total, hb);
    for (int d = 1; d < RW_DTYPE_COUNT_; d++) {
        if (!count_dt[d]) continue;
        human_bytes((double)bytes_dt[d], hb, sizeof hb);
        printf("  %-10s %zu tensors, %llu bytes (%s)\n", rw_dtype_name((rw_dtype)d), count_dt[d],
               (unsigned long long)bytes_dt[d], hb);
    }

    inspect_ctx x = {.cfg = &cfg, .ck = ck};
    x.per_expert = calloc((size_t)cfg.num_layers * cfg.num_experts, 1);
    x.fused = calloc((size_t)cfg.num_layers, 1);
    int rc = 0;
    if (!x.per_expert || !x.fused) {
        fprintf(stderr, "rw-ckpt inspect: out of memory\n");
        rc = 2;
        goto out;
    }
    for (size_t i = 0; i < n; i++)
        check_tensor(&x, rw_ckpt_at(ck, i));
    rw_config_for_each_weight(&cfg, check_present, &x);
    if (x.oom) {
        fprintf(stderr, "rw-ckpt inspect: out of memory while listing problems\n");
        rc = 2;
        goto out;
    }
    size_t problems = 0;
    for (int k = 0; k < P_COUNT_; k++)
        problems += x.p[k].n;
    if (problems == 0) {
        printf("check        all %zu tensors recognised, none missing, none mis-shaped\n", n);
        printf("OK\n");
    } else {
        printf("check        %zu of %zu tensors recognised; %zu unknown, %zu missing, %zu "
               "mis-shaped, %zu bad dtype, %zu unexpected\n",
               x.recognised, n, x.p[P_UNKNOWN].n, x.p[P_MISSING].n, x.p[P_SHAPE].n, x.p[P_DTYPE].n,
               x.p[P_UNEXPECTED].n);
        for (int k = 0; k < P_COUNT_; k++) {
            size_t show = all || x.p[k].n <= 100 ? x.p[k].n : 100;
            for (size_t i = 0; i < show; i++)
                printf("%-11s  %s\n", problem_label[k], x.p[k].lines[i]);
            if (show < x.p[k].n)
                printf("%-11s  ... and %zu more (--all lists them)\n", problem_label[k],
                       x.p[k].n - show);
        }
        printf("FAILED: %zu problem%s\n", problems, problems == 1 ? "" : "s");
        rc = 1;
    }
out:
    for (int k = 0; k < P_COUNT_; k++) {
        for (size_t i = 0; i < x.p[k].n; i++)
            free(x.p[k].lines[i]);
        free(x.p[k].lines);
    }
    free(x.per_expert);
    free(x.fused);
    rw_ckpt_close(ck);
    rw_config_free(&cfg);
    return rc;
}
