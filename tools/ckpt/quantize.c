/* quantize.c - `rw-ckpt quantize --format mxfp8|fp8-block [--last-n-bf16 N] IN_DIR OUT_DIR`:
 * writes a quantized copy of a bf16 Qwen3-MoE checkpoint (docs/LAYOUT.md section 5).
 *
 * What OUT_DIR holds:
 * - config.json: the input's config.json with every field kept, plus quantization_config in the
 *   conventional form (quant_method "mxfp8" or "fp8", fmt "e4m3", weight_block_size [1, 32] or
 *   [128, 128], scale_fmt "ue8m0" for mxfp8, activation_scheme "dynamic", modules_to_not_convert
 *   listing "model.layers.K." for each of the last N layers).
 * - one .safetensors file per input file, same file names (and model.safetensors.index.json when
 *   there is more than one): every weight the precision policy (rw_quant_policy) quantizes is
 *   stored as e4m3 with `<module>.weight_scale_inv` right after it (u8 [rows, cols/32] for
 *   mxfp8, f32 [ceil(rows/128), ceil(cols/128)] for fp8-block); every other tensor is copied
 *   byte for byte. Fused expert tensors (mlp.experts.gate_up_proj [E, 2I, H], mlp.experts.down_proj
 *   [E, H, I]) of a quantized layer are written as per-expert canonical tensors with their scales.
 * - the other regular files of IN_DIR (tokenizer, generation config, ...) copied as they are.
 *
 * The model is streamed tensor by tensor from the mapped input files; memory holds at most one
 * quantized matrix and its scales. A progress line goes to stderr at most once a second.
 */
#include "rw_core.h"
#include "rw_quant.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

int rw_ckpt_quantize_main(int argc, char **argv);

#define INDEX_NAME "model.safetensors.index.json"

static void usage(FILE *f) {
    fprintf(f, "usage: rw-ckpt quantize --format mxfp8|fp8-block [--last-n-bf16 N] IN_DIR "
               "OUT_DIR\n"
               "  Writes OUT_DIR: the bf16 checkpoint IN_DIR with attention projections and "
               "experts\n"
               "  quantized (e4m3 + <module>.weight_scale_inv), the last N layers kept in bf16\n"
               "  (listed in quantization_config.modules_to_not_convert), everything else "
               "copied.\n");
}

/* One tensor of an output file. A quantized matrix is two items, codes then scales. */
typedef enum { ITEM_COPY = 0, ITEM_CODES = 1, ITEM_SCALES = 2 } item_kind;

typedef struct {
    char *name; /* owned */
    rw_dtype dtype;
    int ndim;
    int64_t shape[RW_MAX_DIMS];
    item_kind kind;
    const rw_st_entry *src;
    /* ITEM_CODES: the matrix is rows [row0, row0 + rows) x cols of expert `expert` of the source
     * (expert 0 for a 2-D source), contiguous in the source. */
    int64_t expert, row0, rows, cols;
} item;

typedef struct {
    rw_wfmt fmt;
    const rw_config *cfg;
    item *items;
    size_t n, cap;
    /* Running totals for the progress line. */
    size_t done, total_items;
    uint64_t in_bytes_done, in_bytes_total, out_bytes;
    size_t n_quant, n_copy;
    double t0, last_print;
    /* Work buffers, grown on demand (freed at the end). */
    uint16_t *xbuf; /* aligned copy of a bf16 matrix whose mapping is not 2-byte aligned */
    uint8_t *qbuf, *sbuf;
    size_t xcap, qcap, scap;
    size_t sbytes; /* scale bytes of the last quantized matrix, written by its ITEM_SCALES */
} qctx;

static rw_status push_item(qctx *q, const item *it, rw_err *err) {
    if (q->n == q->cap) {
        size_t nc = q->cap ? 2 * q->cap : 64;
        item *p = realloc(q->items, nc * sizeof *p);
        if (!p) RW_FAIL(err, RW_E_OOM, "out of memory planning the output tensors");
        q->items = p;
        q->cap = nc;
    }
    q->items[q->n] = *it;
    q->items[q->n].name = strdup(it->name);
    if (!q->items[q->n].name) RW_FAIL(err, RW_E_OOM, "out of memory planning the output tensors");
    q->n++;
    return RW_OK;
}

static void clear_items(qctx *q) {
    for (size_t i = 0; i < q->n; i++)
        free(q->items[i].name);
    q->n = 0;
}

/* Codes and scales of one matrix, named from `w` (its .weight and .weight_scale_inv names). */
static rw_status push_matrix(qctx *q, const rw_wname *w, const rw_st_entry *src, int64_t expert,
                             int64_t row0, int64_t rows, int64_t cols, rw_err *err) {
    char name[RW_ST_MAX_NAME + 1];
    rw_wname x = *w;
    x.scale = false;
    rw_name_format(&x, name, sizeof name);
    item it = {.name = name,
               .dtype = RW_DTYPE_E4M3,
               .ndim = 2,
               .kind = ITEM_CODES,
               .src = src,
               .expert = expert,
               .row0 = row0,
               .rows = rows,
               .cols = cols};
    it.shape[0] = rows;
    it.shape[1] = cols;
    RW_CHECK(push_item(q, &it, err));
    x.scale = true;
    rw_name_format(&x, name, sizeof name);
    item s = {.name = name,
              .dtype = rw_quant_scale_dtype(q->fmt),
              .ndim = 2,
              .kind = ITEM_SCALES,
              .src = src};
    rw_quant_scale_shape(q->fmt, rows, cols, s.shape);
    return push_item(q, &s, err);
}

/* Adds the output items of one input tensor: a copy, or its quantized matrices. */
static rw_status plan_tensor(qctx *q, const rw_st_entry *e, rw_err *err) {
    rw_wname w;
    if (rw_name_parse(e->name, q->cfg, &w, NULL) != RW_OK) {
        RW_LOGW("quantize: '%s' is not a canonical Qwen3-MoE tensor name; copied as is", e->name);
        goto copy;
    }
    if (w.scale)
        RW_FAIL(err, RW_E_FORMAT,
                "tensor '%s': the input already holds quantization scales (quantize a bf16 "
                "checkpoint)",
                e->name);
    if (rw_quant_policy(q->cfg, &w) == RW_WFMT_BF16) goto copy;
    if (e->dtype != RW_DTYPE_BF16)
        RW_FAIL(err, RW_E_DTYPE, "tensor '%s' is %s; quantize reads bf16 weights", e->name,
                rw_dtype_name(e->dtype));
    int nd = 0;
    int64_t shape[RW_MAX_DIMS];
    RW_CHECK(rw_config_weight_shape(q->cfg, &w, &nd, shape, err));
    bool same = nd == e->ndim;
    for (int i = 0; same && i < nd; i++)
        same = shape[i] == e->shape[i];
    if (!same) {
        char a[96], b[96];
        RW_FAIL(err, RW_E_SHAPE, "tensor '%s' has shape %s; the config gives %s", e->name,
                rw_shape_str(e->ndim, e->shape, a, sizeof a), rw_shape_str(nd, shape, b, sizeof b));
    }
    if (w.kind == RW_W_EXP_GATE_UP) { /* [E, 2I, H] = [gate; up] per expert */
        int64_t I = shape[1] / 2;
        for (int64_t x = 0; x < shape[0]; x++) {
            rw_wname g = {RW_W_EXP_GATE, w.layer, (int)x, false};
            rw_wname u = {RW_W_EXP_UP, w.layer, (int)x, false};
            RW_CHECK(push_matrix(q, &g, e, x, 0, I, shape[2], err));
            RW_CHECK(push_matrix(q, &u, e, x, I, I, shape[2], err));
        }
        return RW_OK;
    }
    if (w.kind == RW_W_EXP_DOWN_ALL) { /* [E, H, I] */
        for (int64_t x = 0; x < shape[0]; x++) {
            rw_wname d = {RW_W_EXP_DOWN, w.layer, (int)x, false};
            RW_CHECK(push_matrix(q, &d, e, x, 0, shape[1], shape[2], err));
        }
        return RW_OK;
    }
    if (nd != 2)
        RW_FAIL(err, RW_E_INTERNAL, "tensor '%s': a quantized weight must be 2-D", e->name);
    return push_matrix(q, &w, e, 0, 0, shape[0], shape[1], err);
copy:;
    item it = {
        .name = (char *)e->name, .dtype = e->dtype, .ndim = e->ndim, .kind = ITEM_COPY, .src = e};
    memcpy(it.shape, e->shape, sizeof it.shape);
    return push_item(q, &it, err);
}

static rw_status grow(void **buf, size_t *cap, size_t need, rw_err *err) {
    if (need <= *cap) return RW_OK;
    void *p = realloc(*buf, need);
    if (!p) RW_FAIL(err, RW_E_OOM, "out of memory (%zu bytes) for a quantization buffer", need);
    *buf = p;
    *cap = need;
    return RW_OK;
}

/* "12.3 MB" / "4.56 GB" into buf. */
static const char *human(uint64_t b, char *buf, size_t cap) {
    if (b >= 1000000000ull)
        snprintf(buf, cap, "%.2f GB", b / 1e9);
    else
        snprintf(buf, cap, "%.1f MB", b / 1e6);
    return buf;
}

static void progress(qctx *q, bool force) {
    double now = rw_now();
    if (!force && now - q->last_print < 1.0) return;
    q->last_print = now;
    char a[32], b[32], c[32];
    fprintf(stderr, "quantize: %zu/%zu tensors, %s of %s read, %s written, %.1f s\n", q->done,
            q->total_items, human(q->in_bytes_done, a, sizeof a),
            human(q->in_bytes_total, b, sizeof b), human(q->out_bytes, c, sizeof c), now - q->t0);
}

/* Writes the bytes of one planned item. */
static rw_status write_item(qctx *q, const item *it, rw_st_writer *wr, rw_err *err) {
    const rw_st_entry *e = it->src;
    if (it->kind == ITEM_COPY) {
        size_t n = (size_t)(e->end - e->begin);
        RW_CHECK(rw_st_writer_write(wr, e->data, n, err));
        q->in_bytes_done += n;
        q->out_bytes += n;
        q->n_copy++;
        return RW_OK;
    }
    if (it->kind == ITEM_SCALES) {
        RW_CHECK(rw_st_writer_write(wr, q->sbuf, q->sbytes, err));
        q->out_bytes += q->sbytes;
        return RW_OK;
    }
    /* The source rows are contiguous: expert `expert`, rows [row0, row0 + rows). */
    int64_t src_rows = e->ndim == 3 ? e->shape[1] : e->shape[0];
    size_t n = (size_t)(it->rows * it->cols);
    const uint8_t *src =
        (const uint8_t *)e->data + (size_t)((it->expert * src_rows + it->row0) * it->cols) * 2;
    const uint16_t *x = (const uint16_t *)src;
    if ((uintptr_t)src % 2) { /* safetensors offsets need not be aligned to the element size */
        RW_CHECK(grow((void **)&q->xbuf, &q->xcap, n * 2, err));
        memcpy(q->xbuf, src, n * 2);
        x = q->xbuf;
    }
    int64_t ss[2];
    rw_quant_scale_shape(q->fmt, it->rows, it->cols, ss);
    q->sbytes = (size_t)(ss[0] * ss[1]) * rw_dtype_size(rw_quant_scale_dtype(q->fmt));
    RW_CHECK(grow((void **)&q->qbuf, &q->qcap, n, err));
    RW_CHECK(grow((void **)&q->sbuf, &q->scap, q->sbytes, err));
    rw_status st =
        q->fmt == RW_WFMT_MXFP8
            ? rw_quant_mxfp8_ref(x, it->rows, it->cols, q->qbuf, q->sbuf, err)
            : rw_quant_fp8_block_ref(x, it->rows, it->cols, q->qbuf, (float *)(void *)q->sbuf, err);
    if (st != RW_OK) return rw_err_prefix(err, "tensor '%s'", it->name);
    RW_CHECK(rw_st_writer_write(wr, q->qbuf, n, err));
    q->in_bytes_done += n * 2;
    q->out_bytes += n;
    q->n_quant++;
    return RW_OK;
}

static const char *base_name(const char *path) {
    const char *s = strrchr(path, '/');
    return s ? s + 1 : path;
}

static char *join(const char *dir, const char *name) {
    size_t n = strlen(dir) + strlen(name) + 2;
    char *p = malloc(n);
    if (p) snprintf(p, n, "%s/%s", dir, name);
    return p;
}

/* Plans and writes the output file for input file `fi`; adds its names to `weight_map`. */
static rw_status write_file(qctx *q, const rw_ckpt *c, size_t fi, const char *out_dir,
                            json_t *weight_map, rw_err *err) {
    clear_items(q);
    for (size_t i = 0; i < rw_ckpt_count(c); i++) {
        const rw_st_entry *e = rw_ckpt_at(c, i);
        if ((size_t)e->file_index == fi) RW_CHECK(plan_tensor(q, e, err));
    }
    rw_st_decl *decls = calloc(q->n ? q->n : 1, sizeof *decls);
    if (!decls) RW_FAIL(err, RW_E_OOM, "out of memory");
    for (size_t i = 0; i < q->n; i++) {
        decls[i].name = q->items[i].name;
        decls[i].dtype = q->items[i].dtype;
        decls[i].ndim = q->items[i].ndim;
        memcpy(decls[i].shape, q->items[i].shape, sizeof decls[i].shape);
    }
    const char *fname = base_name(rw_ckpt_file_path(c, fi));
    char *path = join(out_dir, fname);
    const char *meta[] = {"format", "pt", NULL};
    rw_st_writer *wr = NULL;
    rw_status st = path ? RW_OK : RW_ERR(err, RW_E_OOM, "out of memory");
    if (st == RW_OK) st = rw_st_writer_create(path, decls, q->n, meta, &wr, err);
    free(decls);
    for (size_t i = 0; st == RW_OK && i < q->n; i++) {
        st = write_item(q, &q->items[i], wr, err);
        if (weight_map && st == RW_OK)
            json_object_set_new(weight_map, q->items[i].name, json_string(fname));
        q->done++;
        progress(q, false);
    }
    if (st == RW_OK)
        st = rw_st_writer_close(wr, err);
    else if (wr)
        rw_st_writer_discard(wr);
    free(path);
    return st;
}

/* config.json of IN_DIR with quantization_config set from cfg (every other field kept). */
static rw_status write_config(const char *in_dir, const char *out_dir, const rw_config *cfg,
                              rw_err *err) {
    char *in_path = join(in_dir, "config.json"), *out_path = join(out_dir, "config.json");
    char *text = NULL, *gen = NULL, *dump = NULL;
    size_t len = 0;
    json_t *root = NULL, *groot = NULL;
    rw_status st = in_path && out_path ? RW_OK : RW_ERR(err, RW_E_OOM, "out of memory");
    if (st == RW_OK) st = rw_read_file(in_path, &text, &len, err);
    if (st == RW_OK) st = rw_config_to_json(cfg, &gen, err);
    if (st == RW_OK) {
        json_error_t je;
        root = json_loadb(text, len, 0, &je);
        groot = json_loads(gen, 0, &je);
        json_t *qc = groot ? json_object_get(groot, "quantization_config") : NULL;
        if (!json_is_object(root) || !qc)
            st = RW_ERR(err, RW_E_FORMAT, "%s: cannot rewrite the config", in_path);
        else
            json_object_set(root, "quantization_config", qc);
    }
    if (st == RW_OK) {
        dump = json_dumps(root, JSON_INDENT(2) | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(17));
        if (!dump) st = RW_ERR(err, RW_E_OOM, "out of memory writing config.json");
    }
    if (st == RW_OK) {
        FILE *f = fopen(out_path, "wb");
        if (!f)
            st = RW_ERR(err, RW_E_IO, "cannot create %s: %s", out_path, strerror(errno));
        else {
            bool ok = fputs(dump, f) >= 0 && fputc('\n', f) != EOF;
            if (fclose(f) != 0 || !ok)
                st = RW_ERR(err, RW_E_IO, "writing %s failed: %s", out_path, strerror(errno));
        }
    }
    json_decref(root);
    json_decref(groot);
    free(dump);
    free(gen);
    free(text);
    free(in_path);
    free(out_path);
    return st;
}

static rw_status write_index(const char *out_dir, json_t *weight_map, uint64_t total, rw_err *err) {
    json_t *root = json_object(), *meta = json_object();
    json_object_set_new(meta, "total_size", json_integer((json_int_t)total));
    json_object_set_new(root, "metadata", meta);
    json_object_set(root, "weight_map", weight_map);
    char *path = join(out_dir, INDEX_NAME);
    rw_status st = RW_OK;
    if (!path || json_dump_file(root, path, JSON_INDENT(2) | JSON_SORT_KEYS) != 0)
        st = RW_ERR(err, RW_E_IO, "cannot write %s/%s", out_dir, INDEX_NAME);
    free(path);
    json_decref(root);
    return st;
}

static rw_status copy_file(const char *src, const char *dst, rw_err *err) {
    int in = open(src, O_RDONLY | O_CLOEXEC);
    if (in < 0) RW_FAIL(err, RW_E_IO, "cannot open %s: %s", src, strerror(errno));
    int out = open(dst, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (out < 0) {
        int e = errno;
        close(in);
        RW_FAIL(err, RW_E_IO, "cannot create %s: %s", dst, strerror(e));
    }
    rw_status st = RW_OK;
    char buf[1 << 16];
    for (;;) {
        ssize_t r = read(in, buf, sizeof buf);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) {
            st = RW_ERR(err, RW_E_IO, "reading %s failed: %s", src, strerror(errno));
            break;
        }
        if (r == 0) break;
        for (ssize_t o = 0; o < r;) {
            ssize_t w = write(out, buf + o, (size_t)(r - o));
            if (w < 0 && errno == EINTR) continue;
            if (w < 0) {
                st = RW_ERR(err, RW_E_IO, "writing %s failed: %s", dst, strerror(errno));
                break;
            }
            o += w;
        }
        if (st != RW_OK) break;
    }
    close(in);
    if (close(out) != 0 && st == RW_OK)
        st = RW_ERR(err, RW_E_IO, "closing %s failed: %s", dst, strerror(errno));
    return st;
}

static bool ends_with(const char *s, const char *sfx) {
    size_t a = strlen(s), b = strlen(sfx);
    return a >= b && !strcmp(s + a - b, sfx);
}

/* The regular files of IN_DIR that are neither tensors nor the config or index. */
static rw_status copy_aux_files(const char *in_dir, const char *out_dir, rw_err *err) {
    DIR *d = opendir(in_dir);
    if (!d) RW_FAIL(err, RW_E_IO, "cannot list %s: %s", in_dir, strerror(errno));
    rw_status st = RW_OK;
    struct dirent *de;
    while (st == RW_OK && (de = readdir(d))) {
        const char *n = de->d_name;
        if (n[0] == '.' || !strcmp(n, "config.json") || !strcmp(n, INDEX_NAME) ||
            ends_with(n, ".safetensors") || ends_with(n, ".partial"))
            continue;
        char *src = join(in_dir, n), *dst = join(out_dir, n);
        struct stat sb;
        if (!src || !dst)
            st = RW_ERR(err, RW_E_OOM, "out of memory");
        else if (stat(src, &sb) == 0 && S_ISREG(sb.st_mode)) {
            RW_LOGI("quantize: copying %s", n);
            st = copy_file(src, dst, err);
        }
        free(src);
        free(dst);
    }
    closedir(d);
    return st;
}

/* OUT_DIR: created if missing; an existing one must be empty and must not be IN_DIR. */
static rw_status prepare_out_dir(const char *in_dir, const char *out_dir, rw_err *err) {
    struct stat si, so;
    if (stat(out_dir, &so) != 0) {
        if (errno != ENOENT || mkdir(out_dir, 0755) != 0)
            RW_FAIL(err, RW_E_IO, "cannot create %s: %s", out_dir, strerror(errno));
        return RW_OK;
    }
    if (!S_ISDIR(so.st_mode)) RW_FAIL(err, RW_E_IO, "%s exists and is not a directory", out_dir);
    if (stat(in_dir, &si) == 0 && si.st_dev == so.st_dev && si.st_ino == so.st_ino)
        RW_FAIL(err, RW_E_INVALID_ARG, "OUT_DIR is IN_DIR (%s)", out_dir);
    DIR *d = opendir(out_dir);
    if (!d) RW_FAIL(err, RW_E_IO, "cannot list %s: %s", out_dir, strerror(errno));
    struct dirent *de;
    bool empty = true;
    while ((de = readdir(d)))
        if (strcmp(de->d_name, ".") && strcmp(de->d_name, "..")) empty = false;
    closedir(d);
    if (!empty) RW_FAIL(err, RW_E_INVALID_ARG, "%s is not empty", out_dir);
    return RW_OK;
}

static rw_status quantize(const char *in_dir, const char *out_dir, rw_wfmt fmt, int last_n,
                          rw_err *err) {
    rw_config cfg;
    rw_ckpt *c = NULL;
    qctx q = {.fmt = fmt, .cfg = &cfg};
    json_t *weight_map = NULL;
    char *cfg_path = join(in_dir, "config.json");
    if (!cfg_path) RW_FAIL(err, RW_E_OOM, "out of memory");
    rw_status st = rw_config_load(cfg_path, &cfg, err);
    free(cfg_path);
    RW_CHECK(st);
    if (cfg.quant.method != RW_QMETHOD_NONE) {
        st = RW_ERR(err, RW_E_FORMAT,
                    "%s/config.json already has a quantization_config (quantize a bf16 "
                    "checkpoint)",
                    in_dir);
        goto out;
    }
    if (last_n < 0 || last_n > cfg.num_layers || last_n > RW_MAX_NOT_CONVERT) {
        st = RW_ERR(err, RW_E_RANGE, "--last-n-bf16 %d: the model has %d layers (at most %d)",
                    last_n, cfg.num_layers, RW_MAX_NOT_CONVERT);
        goto out;
    }
    cfg.quant.method = fmt == RW_WFMT_MXFP8 ? RW_QMETHOD_MXFP8 : RW_QMETHOD_FP8_BLOCK;
    cfg.quant.block[0] = fmt == RW_WFMT_MXFP8 ? 1 : RW_FP8_BLOCK;
    cfg.quant.block[1] = fmt == RW_WFMT_MXFP8 ? RW_MXFP8_BLOCK : RW_FP8_BLOCK;
    snprintf(cfg.quant.fmt, sizeof cfg.quant.fmt, "e4m3");
    snprintf(cfg.quant.scale_fmt, sizeof cfg.quant.scale_fmt, "%s",
             fmt == RW_WFMT_MXFP8 ? "ue8m0" : "");
    snprintf(cfg.quant.activation_scheme, sizeof cfg.quant.activation_scheme, "dynamic");
    for (int k = cfg.num_layers - last_n; k < cfg.num_layers; k++) {
        char p[48];
        snprintf(p, sizeof p, "model.layers.%d.", k);
        cfg.quant.not_convert[cfg.quant.n_not_convert] = strdup(p);
        if (!cfg.quant.not_convert[cfg.quant.n_not_convert]) {
            st = RW_ERR(err, RW_E_OOM, "out of memory");
            goto out;
        }
        cfg.quant.n_not_convert++;
    }
    RW_CHECKGOTO(rw_ckpt_open(in_dir, &c, err), st, out);

    q.t0 = q.last_print = rw_now();
    for (size_t i = 0; i < rw_ckpt_count(c); i++) {
        const rw_st_entry *e = rw_ckpt_at(c, i);
        q.in_bytes_total += e->end - e->begin;
    }
    /* Plan every file once up front: checks every tensor (dtype, shape, no scales) before
     * anything is written, and gives the item count for the progress line. */
    for (size_t fi = 0; fi < rw_ckpt_file_count(c); fi++) {
        clear_items(&q);
        for (size_t i = 0; i < rw_ckpt_count(c); i++) {
            const rw_st_entry *e = rw_ckpt_at(c, i);
            if ((size_t)e->file_index == fi) RW_CHECKGOTO(plan_tensor(&q, e, err), st, out);
        }
        q.total_items += q.n;
    }
    RW_CHECKGOTO(prepare_out_dir(in_dir, out_dir, err), st, out);
    bool sharded = rw_ckpt_file_count(c) > 1;
    if (sharded) weight_map = json_object();
    for (size_t fi = 0; fi < rw_ckpt_file_count(c); fi++)
        RW_CHECKGOTO(write_file(&q, c, fi, out_dir, weight_map, err), st, out);
    if (sharded) RW_CHECKGOTO(write_index(out_dir, weight_map, q.out_bytes, err), st, out);
    RW_CHECKGOTO(write_config(in_dir, out_dir, &cfg, err), st, out);
    RW_CHECKGOTO(copy_aux_files(in_dir, out_dir, err), st, out);
    progress(&q, true);
    fprintf(stderr,
            "quantize: wrote %s: %zu weights as %s (+ scales), %zu tensors copied, %d last "
            "layer(s) in bf16\n",
            out_dir, q.n_quant, rw_wfmt_str(fmt), q.n_copy, last_n);
out:
    clear_items(&q);
    free(q.items);
    free(q.xbuf);
    free(q.qbuf);
    free(q.sbuf);
    json_decref(weight_map);
    rw_ckpt_close(c);
    rw_config_free(&cfg);
    return st;
}

int rw_ckpt_quantize_main(int argc, char **argv) {
    const char *format = NULL, *pos[2] = {NULL, NULL};
    int npos = 0;
    long last_n = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(a, "--format") || !strcmp(a, "--last-n-bf16")) {
            if (i + 1 >= argc) {
                fprintf(stderr, "rw-ckpt quantize: %s needs a value\n", a);
                usage(stderr);
                return 2;
            }
            const char *v = argv[++i];
            if (!strcmp(a, "--format")) {
                format = v;
            } else {
                char *end = NULL;
                errno = 0;
                last_n = strtol(v, &end, 10);
                if (errno || !*v || *end || last_n < 0 || last_n > 1000000) {
                    fprintf(stderr, "rw-ckpt quantize: --last-n-bf16 '%s' is not a count\n", v);
                    return 2;
                }
            }
        } else if (a[0] == '-' && a[1]) {
            fprintf(stderr, "rw-ckpt quantize: unknown option '%s'\n", a);
            usage(stderr);
            return 2;
        } else if (npos < 2) {
            pos[npos++] = a;
        } else {
            fprintf(stderr, "rw-ckpt quantize: unexpected argument '%s'\n", a);
            usage(stderr);
            return 2;
        }
    }
    if (!format || npos != 2) {
        fprintf(stderr, "rw-ckpt quantize: %s\n",
                !format ? "--format is required" : "IN_DIR and OUT_DIR are required");
        usage(stderr);
        return 2;
    }
    rw_wfmt fmt;
    if (!strcmp(format, "mxfp8"))
        fmt = RW_WFMT_MXFP8;
    else if (!strcmp(format, "fp8-block"))
        fmt = RW_WFMT_FP8_BLOCK;
    else {
        fprintf(stderr, "rw-ckpt quantize: --format '%s' (mxfp8 or fp8-block)\n", format);
        return 2;
    }
    rw_err err = {0};
    if (quantize(pos[0], pos[1], fmt, (int)last_n, &err) != RW_OK) {
        fprintf(stderr, "rw-ckpt quantize: %s: %s (%s)\n", rw_status_str(err.status), err.msg,
                err.where);
        return 1;
    }
    return 0;
}
