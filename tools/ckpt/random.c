/* random.c - `rw-ckpt random`: a random checkpoint of any Qwen3-MoE config, streamed to disk.
 *
 * The full canonical tensor set (per-expert names) is planned first and split into files of at
 * most --max-file-bytes (default 4 GiB, header included); one file is written as
 * model.safetensors, several as model-0000K-of-0000N.safetensors with model.safetensors.index.json.
 * config.json is copied. Values: norm weights 1 + 0.1 N(0,1), everything else N(0, 0.02).
 *
 * Speed and memory: values come from a 65536-entry table of normal quantiles already converted
 * to the output dtype, indexed by 16 random bits, so one xoshiro256** step yields four bf16
 * values and no float math runs per element. Each tensor has its own seed (from --seed and its
 * position), so the bytes do not depend on the chunking. Data goes out in 8 MiB chunks: resident
 * memory stays a few MiB whatever the model size. */
#include "ckpt_tool.h"

#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#define CHUNK (8u << 20)              /* bytes generated and written per step */
#define DEFAULT_MAX_FILE (4ull << 30) /* 4 GiB */
#define NQ 65536

typedef struct {
    char *name;
    rw_wname w;
    int ndim;
    int64_t shape[RW_MAX_DIMS];
    uint64_t bytes;
    int file;
} planned;

typedef struct {
    const rw_config *cfg;
    rw_dtype dtype;
    planned *t;
    size_t n, cap;
    rw_status st;
    rw_err *err;
} plan;

static rw_status plan_add(const rw_wname *w, void *ctx) {
    plan *p = ctx;
    if (p->n == p->cap) {
        size_t nc = p->cap ? 2 * p->cap : 1024;
        planned *nt = realloc(p->t, nc * sizeof *nt);
        if (!nt) RW_FAIL(p->err, RW_E_OOM, "out of memory planning the tensor set");
        p->t = nt;
        p->cap = nc;
    }
    planned *t = &p->t[p->n];
    memset(t, 0, sizeof *t);
    t->w = *w;
    char name[RW_ST_MAX_NAME + 32];
    rw_name_format(w, name, sizeof name);
    t->name = strdup(name);
    if (!t->name) RW_FAIL(p->err, RW_E_OOM, "out of memory planning the tensor set");
    RW_CHECK(rw_config_weight_shape(p->cfg, w, &t->ndim, t->shape, p->err));
    t->bytes = (uint64_t)rw_shape_numel(t->ndim, t->shape) * rw_dtype_size(p->dtype);
    p->n++;
    return RW_OK;
}

/* An upper bound of a tensor's share of the header: {"NAME":{"dtype":"F8_E4M3","shape":[..],
 * "data_offsets":[a,b]}, with at most 20 digits per number. */
static uint64_t header_share(const planned *t) {
    return strlen(t->name) + 64 + 21 * (uint64_t)(t->ndim + 2);
}
#define HEADER_FIXED 64 /* length field, braces, __metadata__ {"format":"pt"}, padding */

/* Assigns files in tensor order; returns the number of files. */
static rw_status assign_files(plan *p, uint64_t max_file, int *nfiles, rw_err *err) {
    int f = 0;
    uint64_t used = HEADER_FIXED;
    size_t in_file = 0;
    for (size_t i = 0; i < p->n; i++) {
        planned *t = &p->t[i];
        uint64_t need = t->bytes + header_share(t);
        if (need + HEADER_FIXED > max_file)
            RW_FAIL(err, RW_E_RANGE, "tensor %s (%llu bytes) does not fit in a file of %llu bytes",
                    t->name, (unsigned long long)t->bytes, (unsigned long long)max_file);
        if (in_file && used + need > max_file) {
            f++;
            used = HEADER_FIXED;
            in_file = 0;
        }
        t->file = f;
        used += need;
        in_file++;
    }
    *nfiles = f + 1;
    return RW_OK;
}

/* ---- values ---------------------------------------------------------------------------------- */

/* Standard normal quantile by bisection on the CDF 0.5 * erfc(-x / sqrt 2): slow per call, but
 * it runs 32768 times once, and needs no approximation constants. */
static double normal_quantile(double p) {
    double lo = -40, hi = 40;
    for (int i = 0; i < 200 && hi - lo > 1e-15; i++) {
        double mid = 0.5 * (lo + hi);
        if (0.5 * erfc(-mid / sqrt(2.0)) < p)
            lo = mid;
        else
            hi = mid;
    }
    return 0.5 * (lo + hi);
}

typedef struct {
    size_t esize;
    void *norm;  /* [NQ] values of 1 + 0.1 N(0,1) in the output dtype */
    void *other; /* [NQ] values of N(0, 0.02) */
} tables;

static void store(rw_dtype dt, void *tab, size_t i, double v) {
    switch (dt) {
    case RW_DTYPE_BF16: ((uint16_t *)tab)[i] = rw_f32_to_bf16((float)v); break;
    case RW_DTYPE_F16: ((uint16_t *)tab)[i] = rw_f32_to_f16((float)v); break;
    default: ((float *)tab)[i] = (float)v; break;
    }
}

static rw_status make_tables(rw_dtype dt, tables *t, rw_err *err) {
    t->esize = rw_dtype_size(dt);
    t->norm = malloc(NQ * t->esize);
    t->other = malloc(NQ * t->esize);
    if (!t->norm || !t->other) RW_FAIL(err, RW_E_OOM, "out of memory for value tables");
    for (size_t i = 0; i < NQ / 2; i++) {
        /* quantile of the midpoint of bucket i: symmetric, so the table's mean is exactly 0 */
        double q = normal_quantile(((double)i + 0.5) / NQ);
        store(dt, t->norm, i, 1.0 + 0.1 * q);
        store(dt, t->norm, NQ - 1 - i, 1.0 - 0.1 * q);
        store(dt, t->other, i, 0.02 * q);
        store(dt, t->other, NQ - 1 - i, -0.02 * q);
    }
    return RW_OK;
}

static bool is_norm(rw_wkind k) {
    return k == RW_W_INPUT_NORM || k == RW_W_POST_NORM || k == RW_W_FINAL_NORM ||
           k == RW_W_Q_NORM || k == RW_W_K_NORM;
}

/* Fills n elements of type T from table t (one 16-bit draw per element, rw_rng_next inline: the
 * generator is the inner loop); n is a multiple of 4 except at a tensor's end. */
#define GENERATE(T)                                                                                \
    do {                                                                                           \
        const T *t = tab;                                                                          \
        T *o = out;                                                                                \
        size_t i = 0;                                                                              \
        for (; i + 4 <= n; i += 4) {                                                               \
            uint64_t x = rw_rng_next(r);                                                           \
            o[i] = t[x & 0xffff];                                                                  \
            o[i + 1] = t[(x >> 16) & 0xffff];                                                      \
            o[i + 2] = t[(x >> 32) & 0xffff];                                                      \
            o[i + 3] = t[x >> 48];                                                                 \
        }                                                                                          \
        for (uint64_t x = rw_rng_next(r); i < n; i++, x >>= 16)                                    \
            o[i] = t[x & 0xffff];                                                                  \
    } while (0)

static void generate(const void *tab, size_t esize, rw_rng *r, void *out, size_t n) {
    if (esize == 2)
        GENERATE(uint16_t);
    else
        GENERATE(uint32_t);
}
#undef GENERATE

/* ---- output ---------------------------------------------------------------------------------- */

static rw_status write_text(const char *path, const char *text, size_t len, rw_err *err) {
    char tmp[4200];
    snprintf(tmp, sizeof tmp, "%s.partial", path);
    FILE *f = fopen(tmp, "wb");
    if (!f) RW_FAIL(err, RW_E_IO, "cannot create %s: %s", tmp, strerror(errno));
    bool ok = fwrite(text, 1, len, f) == len;
    ok = (fclose(f) == 0) && ok;
    if (!ok) {
        unlink(tmp);
        RW_FAIL(err, RW_E_IO, "cannot write %s", tmp);
    }
    if (rename(tmp, path) != 0) {
        unlink(tmp);
        RW_FAIL(err, RW_E_IO, "cannot rename %s: %s", tmp, strerror(errno));
    }
    return RW_OK;
}

static void file_name(int f, int nfiles, char *buf, size_t cap) {
    if (nfiles == 1)
        snprintf(buf, cap, "model.safetensors");
    else
        snprintf(buf, cap, "model-%05d-of-%05d.safetensors", f + 1, nfiles);
}

static rw_status write_index(const char *dir, const plan *p, int nfiles, uint64_t total,
                             rw_err *err) {
    json_t *root = json_object(), *meta = json_object(), *map = json_object();
    json_object_set_new(meta, "total_size", json_integer((json_int_t)total));
    json_object_set_new(root, "metadata", meta);
    json_object_set_new(root, "weight_map", map);
    char fname[64];
    for (size_t i = 0; i < p->n; i++) {
        file_name(p->t[i].file, nfiles, fname, sizeof fname);
        json_object_set_new(map, p->t[i].name, json_string(fname));
    }
    char *text = json_dumps(root, JSON_INDENT(2) | JSON_SORT_KEYS);
    json_decref(root);
    if (!text) RW_FAIL(err, RW_E_OOM, "out of memory writing the index");
    char path[4200];
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
    size_t len = strlen(text);
    rw_status st = write_text(path, text, len, err);
    free(text);
    return st;
}

typedef struct {
    double t0, last;
    uint64_t done, total;
    bool tty, printed;
} progress;

static void progress_tick(progress *pr, bool final) {
    double now = rw_now();
    if (!final && now - pr->last < 2.0) return;
    if (final && !pr->printed) return; /* short runs stay quiet */
    pr->last = now;
    double el = now - pr->t0, rate = el > 0 ? (double)pr->done / el : 0;
    double eta = rate > 0 ? (double)(pr->total - pr->done) / rate : 0;
    fprintf(stderr, "%srw-ckpt random: %.2f / %.2f GB (%.0f%%), %.2f GB/s, ETA %.0f s%s",
            pr->tty ? "\r" : "", (double)pr->done / 1e9, (double)pr->total / 1e9,
            pr->total ? 100.0 * (double)pr->done / (double)pr->total : 100.0, rate / 1e9, eta,
            pr->tty ? (final ? "\n" : "   ") : "\n");
    fflush(stderr);
    pr->printed = true;
}

static rw_status write_files(const char *dir, const plan *p, int nfiles, const tables *tab,
                             uint64_t seed, progress *pr, rw_err *err) {
    uint8_t *buf = malloc(CHUNK);
    rw_st_decl *decls = malloc(p->n * sizeof *decls);
    if (!buf || !decls) {
        free(buf);
        free(decls);
        RW_FAIL(err, RW_E_OOM, "out of memory for the write buffer");
    }
    const char *meta[] = {"format", "pt", NULL};
    rw_status st = RW_OK;
    size_t i = 0;
    for (int f = 0; f < nfiles && st == RW_OK; f++) {
        size_t first = i, nd = 0;
        for (; i < p->n && p->t[i].file == f; i++, nd++) {
            decls[nd] = (rw_st_decl){p->t[i].name, p->dtype, p->t[i].ndim, {0}};
            memcpy(decls[nd].shape, p->t[i].shape, sizeof decls[nd].shape);
        }
        char fname[64], path[4200];
        file_name(f, nfiles, fname, sizeof fname);
        snprintf(path, sizeof path, "%s/%s", dir, fname);
        rw_st_writer *w = NULL;
        st = rw_st_writer_create(path, decls, nd, meta, &w, err);
        if (st != RW_OK) break;
        for (size_t k = first; k < first + nd && st == RW_OK; k++) {
            const planned *t = &p->t[k];
            rw_rng r;
            rw_rng_seed(&r, seed ^ (0x9e3779b97f4a7c15ull * (k + 1)));
            const void *vt = is_norm(t->w.kind) ? tab->norm : tab->other;
            uint64_t left = t->bytes;
            while (left && st == RW_OK) {
                size_t nb = left < CHUNK ? (size_t)left : CHUNK;
                generate(vt, tab->esize, &r, buf, nb / tab->esize);
                st = rw_st_writer_write(w, buf, nb, err);
                left -= nb;
                pr->done += nb;
                progress_tick(pr, false);
            }
        }
        if (st == RW_OK)
            st = rw_st_writer_close(w, err);
        else
            rw_st_writer_discard(w);
    }
    free(buf);
    free(decls);
    return st;
}

static void usage(FILE *f) {
    fprintf(f, "usage: rw-ckpt random --config CONFIG --out DIR [--seed S] [--dtype bf16|f16|f32]\n"
               "\n"
               "Writes a random checkpoint of the Qwen3-MoE model described by CONFIG (a\n"
               "config.json) into DIR (created if missing): the canonical tensor set with\n"
               "per-expert names, norm weights 1 + 0.1 N(0,1) and all other weights N(0, 0.02),\n"
               "in files of at most 4 GiB (model-0000K-of-0000N.safetensors with\n"
               "model.safetensors.index.json, or one model.safetensors), and a copy of CONFIG as\n"
               "DIR/config.json. The same seed gives the same bytes. Memory stays a few MiB;\n"
               "long runs print progress to stderr.\n");
}

static bool parse_u64(const char *s, uint64_t *out) {
    char *end = NULL;
    errno = 0;
    if (!s || !*s || *s == '-') return false;
    unsigned long long v = strtoull(s, &end, 0);
    if (errno || *end) return false;
    *out = v;
    return true;
}

int rw_ckpt_random_main(int argc, char **argv) {
    const char *config = NULL, *out = NULL, *dtype_s = "bf16";
    uint64_t seed = 0, max_file = DEFAULT_MAX_FILE;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            return 0;
        }
        bool known = true;
        if (!strcmp(a, "--config"))
            config = v;
        else if (!strcmp(a, "--out"))
            out = v;
        else if (!strcmp(a, "--dtype"))
            dtype_s = v;
        else if (!strcmp(a, "--seed")) {
            if (!parse_u64(v, &seed)) {
                fprintf(stderr, "rw-ckpt random: --seed needs a non-negative integer\n");
                return 2;
            }
        } else if (!strcmp(a, "--max-file-bytes")) { /* for tests: forces several files */
            if (!parse_u64(v, &max_file) || max_file < 1024) {
                fprintf(stderr, "rw-ckpt random: --max-file-bytes needs an integer >= 1024\n");
                return 2;
            }
        } else
            known = false;
        if (!known) {
            fprintf(stderr, "rw-ckpt random: unknown argument %s\n", a);
            usage(stderr);
            return 2;
        }
        if (!v) {
            fprintf(stderr, "rw-ckpt random: %s needs a value\n", a);
            return 2;
        }
        i++;
    }
    if (!config || !out) {
        fprintf(stderr, "rw-ckpt random: --config and --out are required\n");
        usage(stderr);
        return 2;
    }
    rw_dtype dt = rw_dtype_from_name(dtype_s);
    if (dt != RW_DTYPE_BF16 && dt != RW_DTYPE_F16 && dt != RW_DTYPE_F32) {
        fprintf(stderr, "rw-ckpt random: --dtype %s (bf16, f16 or f32)\n", dtype_s);
        return 2;
    }

    rw_err err = {0};
    rw_config cfg;
    char *cfg_text = NULL;
    size_t cfg_len = 0;
    if (rw_read_file(config, &cfg_text, &cfg_len, &err) != RW_OK ||
        rw_config_parse(cfg_text, cfg_len, &cfg, &err) != RW_OK) {
        fprintf(stderr, "rw-ckpt random: %s: %s\n", config, err.msg);
        free(cfg_text);
        return 2;
    }
    if (cfg.quant.method != RW_QMETHOD_NONE)
        fprintf(stderr,
                "rw-ckpt random: note: %s has a quantization_config; the weights written "
                "are %s (quantize them with rw-ckpt quantize)\n",
                config, rw_dtype_name(dt));

    int rc = 1;
    plan p = {.cfg = &cfg, .dtype = dt, .err = &err};
    tables tab = {0};
    int nfiles = 0;
    rw_status st = rw_config_for_each_weight(&cfg, plan_add, &p);
    if (st == RW_OK) st = assign_files(&p, max_file, &nfiles, &err);
    if (st == RW_OK) st = make_tables(dt, &tab, &err);
    if (st == RW_OK && mkdir(out, 0755) != 0 && errno != EEXIST)
        st = RW_ERR(&err, RW_E_IO, "cannot create %s: %s", out, strerror(errno));
    struct stat sb;
    if (st == RW_OK && (stat(out, &sb) != 0 || !S_ISDIR(sb.st_mode)))
        st = RW_ERR(&err, RW_E_IO, "%s is not a directory", out);
    if (st != RW_OK) {
        fprintf(stderr, "rw-ckpt random: %s\n", err.msg);
        goto done;
    }
    uint64_t total = 0;
    for (size_t i = 0; i < p.n; i++)
        total += p.t[i].bytes;
    /* A checkpoint left in DIR by an earlier run in the other form would shadow or confuse this
     * one (an index wins over model.safetensors): remove it. */
    char stale[4200];
    snprintf(stale, sizeof stale, "%s/%s", out,
             nfiles == 1 ? "model.safetensors.index.json" : "model.safetensors");
    if (unlink(stale) == 0) fprintf(stderr, "rw-ckpt random: removed stale %s\n", stale);

    progress pr = {.t0 = rw_now(), .total = total, .tty = isatty(2)};
    pr.last = pr.t0;
    st = write_files(out, &p, nfiles, &tab, seed, &pr, &err);
    if (st == RW_OK && nfiles > 1) st = write_index(out, &p, nfiles, total, &err);
    if (st == RW_OK) {
        char cpath[4200];
        snprintf(cpath, sizeof cpath, "%s/config.json", out);
        st = write_text(cpath, cfg_text, cfg_len, &err);
    }
    if (st != RW_OK) {
        fprintf(stderr, "rw-ckpt random: %s\n", err.msg);
        goto done;
    }
    progress_tick(&pr, true);
    double el = rw_now() - pr.t0;
    printf(
        "wrote %zu tensors, %llu bytes (%.2f GB) of %s in %d file%s to %s in %.1f s (%.2f GB/s)\n",
        p.n, (unsigned long long)total, (double)total / 1e9, rw_dtype_name(dt), nfiles,
        nfiles == 1 ? "" : "s", out, el, el > 0 ? (double)total / 1e9 / el : 0.0);
    rc = 0;
done:
    for (size_t i = 0; i < p.n; i++)
        free(p.t[i].name);
    free(p.t);
    free(tab.norm);
    free(tab.other);
    free(cfg_text);
    rw_config_free(&cfg);
    return rc;
}
