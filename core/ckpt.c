/* ckpt.c - a checkpoint directory as one set of tensors: model.safetensors.index.json with its
 * shards, or a lone model.safetensors, or (without either) every *.safetensors file in the
 * directory. Lookup by name across all files; tensor bytes are read from each file's handle
 * (rw_ckpt_file + rw_st_read), which keeps the file open from validation to the last read. */
#include "rw_core.h"

#include <dirent.h>
#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

struct rw_ckpt {
    char *dir;
    size_t nfiles;
    rw_st_file **files; /* [nfiles] */
    char **paths;       /* [nfiles] full paths */
    size_t n;
    rw_st_entry *entries; /* [n] copies of the files' entries with file_index set; names borrowed
                             from the file handles. Ordered by file, then data offset. */
    size_t *by_name;      /* [n] indices into entries sorted by name */
};

#define INDEX_NAME "model.safetensors.index.json"

static char *join(const char *dir, const char *name) {
    size_t n = strlen(dir) + strlen(name) + 2;
    char *p = malloc(n);
    if (p) snprintf(p, n, "%s/%s", dir, name);
    return p;
}

static bool is_file(const char *path) {
    struct stat sb;
    return stat(path, &sb) == 0 && S_ISREG(sb.st_mode);
}

static int cmp_str(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

typedef struct {
    const char *name;
    size_t idx;
} name_idx;

/* Ties (one name in two files) are ordered by position, so the error names the files in order. */
static int cmp_name_idx(const void *a, const void *b) {
    const name_idx *x = a, *y = b;
    int c = strcmp(x->name, y->name);
    if (c) return c;
    return x->idx < y->idx ? -1 : x->idx > y->idx;
}

/* Adds a file name (relative to dir) to a growing list, skipping duplicates. */
static rw_status add_name(char ***list, size_t *n, size_t *cap, const char *name, rw_err *err) {
    for (size_t i = 0; i < *n; i++)
        if (!strcmp((*list)[i], name)) return RW_OK;
    if (*n == *cap) {
        size_t nc = *cap ? 2 * *cap : 8;
        char **nl = realloc(*list, nc * sizeof *nl);
        if (!nl) RW_FAIL(err, RW_E_OOM, "out of memory listing checkpoint files");
        *list = nl;
        *cap = nc;
    }
    (*list)[*n] = strdup(name);
    if (!(*list)[*n]) RW_FAIL(err, RW_E_OOM, "out of memory listing checkpoint files");
    (*n)++;
    return RW_OK;
}

static void free_names(char **list, size_t n) {
    for (size_t i = 0; i < n; i++)
        free(list[i]);
    free(list);
}

/* A shard name from the index must stay inside the directory. */
static bool safe_file_name(const char *s) {
    return s[0] && !strchr(s, '/') && strcmp(s, ".") && strcmp(s, "..");
}

/* Parses the index text (read from `path`): fills the (unique) shard names and keeps the parsed
 * weight_map. */
static rw_status read_index(const char *path, const char *text, size_t len, json_t **map_out,
                            char ***names, size_t *n, rw_err *err) {
    size_t cap = 0;
    json_error_t je;
    json_t *root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &je);
    /* jansson's text quotes the bytes near the error: not shown (the file may be anything) */
    if (!root) RW_FAIL(err, RW_E_FORMAT, "%s: invalid JSON at line %d", path, je.line);
    rw_status st = RW_OK;
    json_t *map = json_object_get(root, "weight_map");
    if (!json_is_object(root) || !json_is_object(map)) {
        st = RW_ERR(err, RW_E_FORMAT, "%s: no \"weight_map\" object", path);
        goto out;
    }
    const char *k;
    json_t *v;
    json_object_foreach(map, k, v) {
        if (!json_is_string(v) || !safe_file_name(json_string_value(v))) {
            st = RW_ERR(err, RW_E_FORMAT,
                        "%s: weight_map entry '%.200s' is not a plain file name in the directory",
                        path, k);
            goto out;
        }
        RW_CHECKGOTO(add_name(names, n, &cap, json_string_value(v), err), st, out);
    }
    if (*n == 0) {
        st = RW_ERR(err, RW_E_FORMAT, "%s: weight_map is empty", path);
        goto out;
    }
    qsort(*names, *n, sizeof **names, cmp_str);
    *map_out = json_incref(map);
out:
    json_decref(root);
    return st;
}

/* Every *.safetensors regular file in the directory, sorted by name. */
static rw_status scan_dir(const char *dir, char ***names, size_t *n, rw_err *err) {
    size_t cap = 0;
    DIR *d = opendir(dir);
    if (!d) RW_FAIL(err, RW_E_IO, "cannot list %s: %s", dir, strerror(errno));
    rw_status st = RW_OK;
    struct dirent *de;
    while ((de = readdir(d))) {
        size_t l = strlen(de->d_name);
        const char *ext = ".safetensors";
        size_t el = strlen(ext);
        if (l <= el || strcmp(de->d_name + l - el, ext)) continue;
        char *p = join(dir, de->d_name);
        if (!p) {
            st = RW_ERR(err, RW_E_OOM, "out of memory");
            break;
        }
        bool reg = is_file(p);
        free(p);
        if (!reg) continue;
        RW_CHECKGOTO(add_name(names, n, &cap, de->d_name, err), st, out);
    }
out:
    closedir(d);
    if (st == RW_OK && *n == 0)
        st = RW_ERR(err, RW_E_NOT_FOUND,
                    "%s holds no " INDEX_NAME ", no model.safetensors and "
                    "no other *.safetensors file",
                    dir);
    if (st == RW_OK) qsort(*names, *n, sizeof **names, cmp_str);
    return st;
}

void rw_ckpt_close(rw_ckpt *c) {
    if (!c) return;
    for (size_t i = 0; i < c->nfiles; i++) {
        rw_st_close(c->files[i]);
        free(c->paths[i]);
    }
    free(c->files);
    free(c->paths);
    free(c->entries);
    free(c->by_name);
    free(c->dir);
    free(c);
}

rw_status rw_ckpt_open(const char *dir, rw_ckpt **out, rw_err *err) {
    if (!out || !dir) RW_FAIL(err, RW_E_INVALID_ARG, "rw_ckpt_open: dir or out is NULL");
    *out = NULL;
    struct stat sb;
    if (stat(dir, &sb) != 0)
        RW_FAIL(err, errno == ENOENT ? RW_E_NOT_FOUND : RW_E_IO, "checkpoint %s: %s", dir,
                strerror(errno));
    if (!S_ISDIR(sb.st_mode))
        RW_FAIL(err, RW_E_INVALID_ARG, "checkpoint %s is not a directory", dir);

    rw_status st = RW_OK;
    json_t *map = NULL;
    char **names = NULL;
    size_t nn = 0;
    name_idx *ni = NULL;
    rw_ckpt *c = calloc(1, sizeof *c);
    if (!c) RW_FAIL(err, RW_E_OOM, "out of memory for a checkpoint handle");
    c->dir = strdup(dir);
    char *index = join(dir, INDEX_NAME);
    char *single = join(dir, "model.safetensors");
    if (!c->dir || !index || !single) {
        st = RW_ERR(err, RW_E_OOM, "out of memory");
        goto out;
    }
    /* The layout is decided by what opens, not by a stat before the open (a file swapped for
     * a FIFO in between would block the worker): the index is read through rw_open_regular, and a
     * model.safetensors that exists in any form is opened by rw_st_open, which refuses it
     * without blocking unless it is a regular file. */
    char *itext = NULL;
    size_t ilen = 0;
    rw_err ierr;
    rw_err_clear(&ierr);
    rw_status ist = rw_read_regular_file(index, RW_ST_MAX_HEADER, &itext, &ilen, &ierr);
    if (ist == RW_OK) {
        st = read_index(index, itext, ilen, &map, &names, &nn, err);
        free(itext);
        if (st != RW_OK) goto out;
    } else if (ist != RW_E_NOT_FOUND) {
        if (err) *err = ierr;
        st = ist;
        goto out;
    } else if (access(single, F_OK) == 0) {
        size_t cap = 0;
        RW_CHECKGOTO(add_name(&names, &nn, &cap, "model.safetensors", err), st, out);
    } else {
        RW_CHECKGOTO(scan_dir(dir, &names, &nn, err), st, out);
    }

    c->files = calloc(nn, sizeof *c->files);
    c->paths = calloc(nn, sizeof *c->paths);
    if (!c->files || !c->paths) {
        st = RW_ERR(err, RW_E_OOM, "out of memory");
        goto out;
    }
    size_t total = 0;
    for (size_t i = 0; i < nn; i++) {
        c->paths[i] = join(dir, names[i]);
        c->nfiles = i + 1;
        if (!c->paths[i]) {
            st = RW_ERR(err, RW_E_OOM, "out of memory");
            goto out;
        }
        st = rw_st_open(c->paths[i], &c->files[i], err);
        if (st != RW_OK) {
            if (map && st == RW_E_NOT_FOUND)
                rw_err_prefix(err, "%s names a shard that does not exist", INDEX_NAME);
            goto out;
        }
        total += rw_st_count(c->files[i]);
    }

    c->entries = calloc(total ? total : 1, sizeof *c->entries);
    c->by_name = calloc(total ? total : 1, sizeof *c->by_name);
    ni = calloc(total ? total : 1, sizeof *ni);
    if (!c->entries || !c->by_name || !ni) {
        st = RW_ERR(err, RW_E_OOM, "out of memory for %zu checkpoint entries", total);
        goto out;
    }
    for (size_t f = 0; f < c->nfiles; f++) {
        for (size_t i = 0; i < rw_st_count(c->files[f]); i++) {
            rw_st_entry *e = &c->entries[c->n];
            *e = *rw_st_at(c->files[f], i);
            e->file_index = (int)f;
            ni[c->n] = (name_idx){e->name, c->n};
            c->n++;
        }
    }
    qsort(ni, c->n, sizeof *ni, cmp_name_idx);
    for (size_t i = 0; i < c->n; i++) {
        c->by_name[i] = ni[i].idx;
        if (i && !strcmp(ni[i].name, ni[i - 1].name)) {
            st = RW_ERR(err, RW_E_FORMAT, "checkpoint %s: tensor '%s' is in both %s and %s", dir,
                        ni[i].name, names[c->entries[ni[i - 1].idx].file_index],
                        names[c->entries[ni[i].idx].file_index]);
            goto out;
        }
    }

    if (map) {
        /* The index and the files must agree both ways: every listed tensor is in its file, and
         * every tensor of a file is listed for that file. */
        const char *k;
        json_t *v;
        json_object_foreach(map, k, v) {
            const rw_st_entry *e = rw_ckpt_find(c, k);
            const char *want = json_string_value(v);
            if (!e) {
                st = RW_ERR(err, RW_E_NOT_FOUND,
                            "checkpoint %s: " INDEX_NAME " lists tensor '%s' in %s, which does not "
                            "hold it",
                            dir, k, want);
                goto out;
            }
            if (strcmp(names[e->file_index], want)) {
                st =
                    RW_ERR(err, RW_E_FORMAT,
                           "checkpoint %s: " INDEX_NAME " lists tensor '%s' in %s, but it is in %s",
                           dir, k, want, names[e->file_index]);
                goto out;
            }
        }
        if (json_object_size(map) != c->n) {
            for (size_t i = 0; i < c->n; i++) {
                if (!json_object_get(map, c->entries[i].name)) {
                    st = RW_ERR(err, RW_E_FORMAT,
                                "checkpoint %s: tensor '%s' in %s is not listed in " INDEX_NAME,
                                dir, c->entries[i].name, names[c->entries[i].file_index]);
                    goto out;
                }
            }
        }
    }

out:
    free(ni);
    free(index);
    free(single);
    free_names(names, nn);
    json_decref(map);
    if (st != RW_OK) {
        rw_ckpt_close(c);
        return st;
    }
    *out = c;
    return RW_OK;
}

size_t rw_ckpt_count(const rw_ckpt *c) {
    return c ? c->n : 0;
}

const rw_st_entry *rw_ckpt_at(const rw_ckpt *c, size_t i) {
    return c && i < c->n ? &c->entries[i] : NULL;
}

const rw_st_entry *rw_ckpt_find(const rw_ckpt *c, const char *name) {
    if (!c || !name) return NULL;
    size_t lo = 0, hi = c->n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        const rw_st_entry *e = &c->entries[c->by_name[mid]];
        int r = strcmp(name, e->name);
        if (r == 0) return e;
        if (r < 0)
            hi = mid;
        else
            lo = mid + 1;
    }
    return NULL;
}

size_t rw_ckpt_file_count(const rw_ckpt *c) {
    return c ? c->nfiles : 0;
}

const char *rw_ckpt_file_path(const rw_ckpt *c, size_t i) {
    return c && i < c->nfiles ? c->paths[i] : NULL;
}

const rw_st_file *rw_ckpt_file(const rw_ckpt *c, size_t i) {
    return c && i < c->nfiles ? c->files[i] : NULL;
}

const char *rw_ckpt_dir(const rw_ckpt *c) {
    return c ? c->dir : NULL;
}
