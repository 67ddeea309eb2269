/* test_safetensors.c - safetensors writer -> reader round trips (file and memory, through the
 * mapping and through rw_st_read), the exact bytes of a small written file, malformed files each
 * refused with its own status and message, writer misuse, random corruption (never a crash,
 * never an entry outside the buffer), files truncated or rewritten after they were validated
 * (rw_st_read reports them; the RW_TEST_READ_PAUSE hook), and checkpoint directories: index +
 * shards, a lone file, loose files, and inconsistent indexes. */
#include "rw_test.h"

#include <fcntl.h>
#include <ftw.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---- helpers ------------------------------------------------------------------------------- */

static bool exists(const char *p) {
    struct stat sb;
    return stat(p, &sb) == 0;
}

static void fill_random(void *p, size_t n, uint64_t seed) {
    rw_rng r;
    rw_rng_seed(&r, seed);
    uint8_t *b = p;
    for (size_t i = 0; i < n; i++)
        b[i] = (uint8_t)(rw_rng_u64(&r) >> 56);
}

/* A safetensors image in memory: 8-byte length (as given), the header text, data_len random bytes.
 */
static uint8_t *image(uint64_t hlen_field, const char *hdr, size_t data_len, size_t *len) {
    size_t hl = strlen(hdr);
    *len = 8 + hl + data_len;
    uint8_t *b = malloc(*len);
    assert_non_null(b);
    for (int i = 0; i < 8; i++)
        b[i] = (uint8_t)(hlen_field >> (8 * i));
    memcpy(b + 8, hdr, hl);
    fill_random(b + 8 + hl, data_len, 99);
    return b;
}

/* Writes `decls` with their data (concatenated in declaration order) in random chunk sizes. */
static void write_file(const char *path, const rw_st_decl *d, size_t n, const char *const *meta,
                       const uint8_t *data, size_t total, uint64_t seed) {
    rw_err e = {0};
    rw_st_writer *w = NULL;
    RW_ASSERT_OK(rw_st_writer_create(path, d, n, meta, &w, &e), &e);
    rw_rng r;
    rw_rng_seed(&r, seed);
    size_t at = 0;
    while (at < total) {
        size_t k = 1 + (size_t)(rw_rng_u64(&r) % 5000);
        if (rw_rng_u64(&r) % 8 == 0) k = 3u << 20; /* sometimes larger than the writer's buffer */
        if (k > total - at) k = total - at;
        RW_ASSERT_OK(rw_st_writer_write(w, data + at, k, &e), &e);
        at += k;
    }
    RW_ASSERT_OK(rw_st_writer_close(w, &e), &e);
}

static size_t decl_bytes(const rw_st_decl *d) {
    return (size_t)rw_shape_numel(d->ndim, d->shape) * rw_dtype_size(d->dtype);
}

/* ---- round trips ----------------------------------------------------------------------------- */

static void check_contents(const rw_st_file *f, const rw_st_decl *d, size_t n,
                           const uint8_t *data) {
    assert_int_equal(rw_st_count(f), n);
    size_t off = 0;
    for (size_t i = 0; i < n; i++) {
        const rw_st_entry *e = rw_st_find(f, d[i].name);
        if (!e) fail_msg("tensor %s not found after the round trip", d[i].name);
        assert_string_equal(e->name, d[i].name);
        assert_int_equal(e->dtype, d[i].dtype);
        assert_int_equal(e->ndim, d[i].ndim);
        for (int k = 0; k < d[i].ndim; k++)
            assert_int_equal(e->shape[k], d[i].shape[k]);
        size_t nb = decl_bytes(&d[i]);
        assert_int_equal(e->begin, off); /* data in declaration order */
        assert_int_equal(e->end, off + nb);
        rw_assert_bytes_equal(e->data, data + off, nb, d[i].name);
        assert_int_equal(e->file_index, 0);
        /* the same bytes through rw_st_read: whole, and a range starting inside the tensor */
        uint8_t *r = malloc(nb + 1);
        assert_non_null(r);
        rw_err er;
        RW_ASSERT_OK(rw_st_read(f, e->begin, r, nb, &er), &er);
        rw_assert_bytes_equal(r, data + off, nb, d[i].name);
        RW_ASSERT_OK(rw_st_read(f, e->begin + nb / 3, r, nb - nb / 3, &er), &er);
        rw_assert_bytes_equal(r, data + off + nb / 3, nb - nb / 3, d[i].name);
        free(r);
        off += nb;
    }
    /* past the data section: refused */
    uint8_t one;
    rw_err er;
    assert_int_equal(rw_st_read(f, off, &one, 1, &er), RW_E_RANGE);
    assert_int_equal(rw_st_read(f, UINT64_MAX, &one, 1, &er), RW_E_RANGE);
    RW_ASSERT_OK(rw_st_read(f, off, &one, 0, &er), &er);
    /* rw_st_at is ordered by offset */
    for (size_t i = 1; i < n; i++)
        assert_true(rw_st_at(f, i)->begin >= rw_st_at(f, i - 1)->end);
    assert_null(rw_st_at(f, n));
    assert_null(rw_st_find(f, "no.such.tensor"));
    assert_null(rw_st_find(f, ""));
}

static void test_round_trip(void **state) {
    (void)state;
    static const rw_st_decl d[] = {
        {"model.layers.0.mlp.experts.0.up_proj.weight", RW_DTYPE_BF16, 2, {96, 128}},
        {"scalar", RW_DTYPE_F32, 0, {0}},
        {"empty", RW_DTYPE_F32, 2, {0, 5}},
        {"q", RW_DTYPE_E4M3, 2, {33, 64}},
        {"scale", RW_DTYPE_U8, 2, {33, 2}},
        {"ids", RW_DTYPE_I64, 1, {17}},
        {"half", RW_DTYPE_F16, 3, {3, 5, 7}},
        {"ue", RW_DTYPE_UE8M0, 1, {9}},
        {"big", RW_DTYPE_F32, 2, {1024, 1100}}, /* 4.4 MB: crosses the writer's buffer */
    };
    size_t n = sizeof d / sizeof d[0], total = 0;
    for (size_t i = 0; i < n; i++)
        total += decl_bytes(&d[i]);
    uint8_t *data = malloc(total);
    assert_non_null(data);
    fill_random(data, total, 7);
    char *dir = rw_test_tmpdir("rw_test_st_");
    char path[512];
    snprintf(path, sizeof path, "%s/a.safetensors", dir);
    const char *meta[] = {"format", "pt", "producer", "rw test \xc3\xa9", NULL};
    write_file(path, d, n, meta, data, total, 3);
    char partial[600];
    snprintf(partial, sizeof partial, "%s.partial", path);
    assert_false(exists(partial));

    rw_err e = {0};
    rw_st_file *f = NULL;
    RW_ASSERT_OK(rw_st_open(path, &f, &e), &e);
    check_contents(f, d, n, data);
    assert_string_equal(rw_st_metadata(f, "format"), "pt");
    assert_string_equal(rw_st_metadata(f, "producer"), "rw test \xc3\xa9");
    assert_null(rw_st_metadata(f, "nope"));
    assert_string_equal(rw_st_path(f), path);
    /* the data section starts 8-byte aligned (the mapping is page aligned) */
    assert_int_equal((uintptr_t)rw_st_at(f, 0)->data % 8, 0);
    rw_st_close(f);

    /* the same bytes through rw_st_open_mem */
    char *buf = NULL;
    size_t len = 0;
    RW_ASSERT_OK(rw_read_file(path, &buf, &len, &e), &e);
    RW_ASSERT_OK(rw_st_open_mem(buf, len, &f, &e), &e);
    check_contents(f, d, n, data);
    rw_st_close(f);
    /* header length field: multiple of 8, padding is spaces */
    uint64_t hl = 0;
    for (int i = 7; i >= 0; i--)
        hl = (hl << 8) | (uint8_t)buf[i];
    assert_int_equal(hl % 8, 0);
    assert_int_equal(len, 8 + hl + total);
    assert_int_equal(buf[8], '{');
    size_t k = 8 + hl;
    while (buf[k - 1] == ' ')
        k--;
    assert_int_equal(buf[k - 1], '}');
    free(buf);
    rw_st_close(NULL);

    /* a file with no tensors at all */
    snprintf(path, sizeof path, "%s/empty.safetensors", dir);
    write_file(path, NULL, 0, NULL, NULL, 0, 1);
    RW_ASSERT_OK(rw_st_open(path, &f, &e), &e);
    assert_int_equal(rw_st_count(f), 0);
    assert_null(rw_st_metadata(f, "format"));
    rw_st_close(f);
    free(data);
    rw_test_rm_rf(dir);
    free(dir);
}

/* ---- files changed after they were validated ------------------------------------------------ */

/* Three tensors: a [256 f32], b [512 x 1024 bf16: 1 MiB], c [4096 u8]. */
static const rw_st_decl cut_decls[] = {
    {"a", RW_DTYPE_F32, 1, {256}},
    {"b", RW_DTYPE_BF16, 2, {512, 1024}},
    {"c", RW_DTYPE_U8, 1, {4096}},
};
#define CUT_TOTAL (1024 + (1u << 20) + 4096)

static uint64_t file_len(const char *p) {
    struct stat sb;
    assert_int_equal(stat(p, &sb), 0);
    return (uint64_t)sb.st_size;
}

/* Asserts a "file shrank" error naming the path, tensor `t` and the file's new end `at`. */
static void assert_shrank(const rw_err *e, const char *path, const char *t, uint64_t at) {
    char want[128];
    if (!strstr(e->msg, path) || !strstr(e->msg, "file shrank while loading"))
        fail_msg("unexpected message: %s", e->msg);
    snprintf(want, sizeof want, "tensor '%s' is cut at byte %" PRIu64 " of the file", t, at);
    if (!strstr(e->msg, want)) fail_msg("message '%s' lacks '%s'", e->msg, want);
}

static void test_read_after_truncation(void **state) {
    (void)state;
    uint8_t *data = malloc(CUT_TOTAL);
    assert_non_null(data);
    fill_random(data, CUT_TOTAL, 11);
    char *dir = rw_test_tmpdir("rw_test_st_");
    char path[512];
    snprintf(path, sizeof path, "%s/cut.safetensors", dir);
    write_file(path, cut_decls, 3, NULL, data, CUT_TOTAL, 5);
    const uint64_t full = file_len(path), data_off = full - CUT_TOTAL;

    rw_err e;
    rw_st_file *f;
    RW_ASSERT_OK(rw_st_open(path, &f, &e), &e);
    const rw_st_entry *b = rw_st_find(f, "b");
    uint8_t *buf = malloc(CUT_TOTAL);
    assert_non_null(buf);
    RW_ASSERT_OK(rw_st_read(f, 0, buf, CUT_TOTAL, &e), &e);
    rw_assert_bytes_equal(buf, data, CUT_TOTAL, "whole data section");
    /* cut inside b: every read reports where the file ends now (b, 1000 bytes into it), the
     * read that ran out of data as well as one of bytes still there */
    const uint64_t cut = data_off + b->begin + 1000;
    assert_int_equal(truncate(path, (off_t)cut), 0);
    assert_int_equal(rw_st_read(f, b->begin, buf, b->end - b->begin, &e), RW_E_IO);
    assert_shrank(&e, path, "b", cut);
    assert_non_null(strstr(e.msg, "1000 bytes into the tensor"));
    assert_int_equal(rw_st_read(f, rw_st_find(f, "c")->begin, buf, 4096, &e), RW_E_IO);
    assert_shrank(&e, path, "b", cut);
    assert_int_equal(rw_st_read(f, 0, buf, 1024, &e), RW_E_IO);
    assert_shrank(&e, path, "b", cut);
    /* cut inside the header: no tensor data left */
    assert_int_equal(truncate(path, 20), 0);
    assert_int_equal(rw_st_read(f, 0, buf, 16, &e), RW_E_IO);
    assert_non_null(strstr(e.msg, "file shrank while loading: it is now 20 bytes"));
    rw_st_close(f);

    /* rewritten in place with the same length (other bytes, a later mtime): a read that
     * succeeds still reports the change, since its bytes may mix two versions */
    write_file(path, cut_decls, 3, NULL, data, CUT_TOTAL, 5);
    RW_ASSERT_OK(rw_st_open(path, &f, &e), &e);
    {
        int fd = open(path, O_WRONLY);
        assert_true(fd >= 0);
        uint8_t x = 0x5a;
        assert_int_equal(pwrite(fd, &x, 1, (off_t)(data_off + 10)), 1);
        struct timespec ts[2] = {{0, UTIME_OMIT}, {0, 0}};
        assert_int_equal(clock_gettime(CLOCK_REALTIME, &ts[1]), 0);
        ts[1].tv_sec += 5; /* a different mtime whatever the file system's granularity */
        assert_int_equal(futimens(fd, ts), 0);
        close(fd);
    }
    assert_int_equal(file_len(path), full);
    assert_int_equal(rw_st_read(f, 0, buf, 64, &e), RW_E_IO);
    assert_non_null(strstr(e.msg, "file changed while loading"));
    assert_non_null(strstr(e.msg, "tensor 'a'"));
    assert_non_null(strstr(e.msg, path));
    rw_st_close(f);

    /* replaced by a shorter file through a rename: the open handle still reads what it
     * validated */
    write_file(path, cut_decls, 3, NULL, data, CUT_TOTAL, 5);
    RW_ASSERT_OK(rw_st_open(path, &f, &e), &e);
    char other[600];
    snprintf(other, sizeof other, "%s/short.safetensors", dir);
    write_file(other, cut_decls, 1, NULL, data, 1024, 5);
    assert_int_equal(rename(other, path), 0);
    RW_ASSERT_OK(rw_st_read(f, 0, buf, CUT_TOTAL, &e), &e);
    rw_assert_bytes_equal(buf, data, CUT_TOTAL, "after a rename over the file");
    rw_st_close(f);

    /* a buffer handle reads with memcpy; its path is NULL */
    char *img = NULL;
    size_t len = 0;
    write_file(path, cut_decls, 3, NULL, data, CUT_TOTAL, 5);
    RW_ASSERT_OK(rw_read_file(path, &img, &len, &e), &e);
    RW_ASSERT_OK(rw_st_open_mem(img, len, &f, &e), &e);
    assert_null(rw_st_path(f));
    RW_ASSERT_OK(rw_st_read(f, 1024, buf, 4096, &e), &e);
    rw_assert_bytes_equal(buf, data + 1024, 4096, "buffer handle");
    assert_int_equal(rw_st_read(f, CUT_TOTAL - 10, buf, 11, &e), RW_E_RANGE);
    rw_st_close(f);
    free(img);
    free(buf);
    free(data);
    rw_test_rm_rf(dir);
    free(dir);
}

/* The test hook: a reader paused before its first read of tensor c; another thread truncates the
 * file meanwhile, as a trainer rewriting a checkpoint would. */
typedef struct cutter {
    char pause[600];
    char path[600];
    uint64_t cut;
    bool saw_pause;
} cutter;

static void *cutter_main(void *p) {
    cutter *c = p;
    char mark[700];
    snprintf(mark, sizeof mark, "%s.paused", c->pause);
    double end = rw_now() + 30;
    while (!exists(mark) && rw_now() < end)
        usleep(1000);
    c->saw_pause = exists(mark);
    if (truncate(c->path, (off_t)c->cut) != 0) c->saw_pause = false;
    unlink(c->pause);
    return NULL;
}

static void test_read_pause_hook(void **state) {
    (void)state;
    uint8_t *data = malloc(CUT_TOTAL);
    assert_non_null(data);
    fill_random(data, CUT_TOTAL, 12);
    char *dir = rw_test_tmpdir("rw_test_st_");
    cutter c = {0};
    snprintf(c.path, sizeof c.path, "%s/m.safetensors", dir);
    snprintf(c.pause, sizeof c.pause, "%s/pause", dir);
    write_file(c.path, cut_decls, 3, NULL, data, CUT_TOTAL, 5);
    const uint64_t data_off = file_len(c.path) - CUT_TOTAL;
    FILE *pf = fopen(c.pause, "w");
    assert_non_null(pf);
    fputs("c\n", pf);
    fclose(pf);
    assert_int_equal(setenv("RW_TEST_READ_PAUSE", c.pause, 1), 0);
    rw_err e;
    rw_st_file *f;
    rw_status st = rw_st_open(c.path, &f, &e);
    unsetenv("RW_TEST_READ_PAUSE");
    RW_ASSERT_OK(st, &e);
    const rw_st_entry *tc = rw_st_find(f, "c");
    c.cut = data_off + tc->begin + 100;
    uint8_t *buf = malloc(CUT_TOTAL);
    assert_non_null(buf);
    /* reads that do not touch c do not pause */
    RW_ASSERT_OK(rw_st_read(f, 0, buf, tc->begin, &e), &e);
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, cutter_main, &c), 0);
    st = rw_st_read(f, 0, buf, CUT_TOTAL, &e);
    pthread_join(th, NULL);
    assert_true(c.saw_pause);
    assert_int_equal(st, RW_E_IO);
    assert_shrank(&e, c.path, "c", c.cut);
    assert_non_null(strstr(e.msg, "100 bytes into the tensor"));
    /* the hook pauses once per handle */
    double t0 = rw_now();
    assert_int_equal(rw_st_read(f, tc->begin, buf, 16, &e), RW_E_IO);
    assert_true(rw_now() - t0 < 5);
    rw_st_close(f);
    char mark[700];
    snprintf(mark, sizeof mark, "%s.paused", c.pause);
    unlink(mark);
    free(buf);
    free(data);
    rw_test_rm_rf(dir);
    free(dir);
}

/* The writer's bytes, exactly: header in declaration order, compact, space-padded to 8. */
static void test_writer_exact_bytes(void **state) {
    (void)state;
    char *dir = rw_test_tmpdir("rw_test_st_");
    char path[512];
    snprintf(path, sizeof path, "%s/x.safetensors", dir);
    rw_st_decl d[] = {{"z", RW_DTYPE_F32, 2, {1, 2}}, {"a", RW_DTYPE_BF16, 1, {3}}};
    const uint8_t data[14] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14};
    const char *meta[] = {"format", "pt", NULL};
    write_file(path, d, 2, meta, data, sizeof data, 5);
    const char *hdr = "{\"__metadata__\":{\"format\":\"pt\"},"
                      "\"z\":{\"dtype\":\"F32\",\"shape\":[1,2],\"data_offsets\":[0,8]},"
                      "\"a\":{\"dtype\":\"BF16\",\"shape\":[3],\"data_offsets\":[8,14]}}";
    size_t hl = strlen(hdr), padded = (hl + 7) / 8 * 8;
    uint8_t want[512];
    for (int i = 0; i < 8; i++)
        want[i] = (uint8_t)((uint64_t)padded >> (8 * i));
    memcpy(want + 8, hdr, hl);
    memset(want + 8 + hl, ' ', padded - hl);
    memcpy(want + 8 + padded, data, sizeof data);
    char *buf = NULL;
    size_t len = 0;
    rw_err e = {0};
    RW_ASSERT_OK(rw_read_file(path, &buf, &len, &e), &e);
    assert_int_equal(len, 8 + padded + sizeof data);
    rw_assert_bytes_equal(buf, want, len, "written file");
    free(buf);
    rw_test_rm_rf(dir);
    free(dir);
}

static void test_writer_misuse(void **state) {
    (void)state;
    char *dir = rw_test_tmpdir("rw_test_st_");
    char path[512], partial[600];
    snprintf(path, sizeof path, "%s/w.safetensors", dir);
    snprintf(partial, sizeof partial, "%s.partial", path);
    rw_st_decl d[] = {{"a", RW_DTYPE_F32, 2, {3, 10}}, {"b", RW_DTYPE_BF16, 1, {30}}};
    uint8_t data[180];
    fill_random(data, sizeof data, 1);
    rw_err e = {0};
    rw_st_writer *w = NULL;

    /* too few bytes: close fails and leaves nothing behind */
    RW_ASSERT_OK(rw_st_writer_create(path, d, 2, NULL, &w, &e), &e);
    assert_true(exists(partial));
    RW_ASSERT_OK(rw_st_writer_write(w, data, 119, &e), &e);
    assert_int_equal(rw_st_writer_close(w, &e), RW_E_SHAPE);
    assert_non_null(strstr(e.msg, "119 of 180 declared"));
    assert_false(exists(path));
    assert_false(exists(partial));

    /* too many bytes: refused, the writer stays usable */
    RW_ASSERT_OK(rw_st_writer_create(path, d, 2, NULL, &w, &e), &e);
    RW_ASSERT_OK(rw_st_writer_write(w, data, 100, &e), &e);
    assert_int_equal(rw_st_writer_write(w, data, 81, &e), RW_E_SHAPE);
    assert_non_null(strstr(e.msg, "would pass the 180 declared"));
    RW_ASSERT_OK(rw_st_writer_write(w, data + 100, 80, &e), &e);
    RW_ASSERT_OK(rw_st_writer_close(w, &e), &e);
    assert_true(exists(path));
    assert_false(exists(partial));

    /* discard removes the partial file and leaves an existing final file alone */
    RW_ASSERT_OK(rw_st_writer_create(path, d, 2, NULL, &w, &e), &e);
    RW_ASSERT_OK(rw_st_writer_write(w, data, 10, &e), &e);
    rw_st_writer_discard(w);
    rw_st_writer_discard(NULL);
    assert_false(exists(partial));
    rw_st_file *f = NULL;
    RW_ASSERT_OK(rw_st_open(path, &f, &e), &e); /* the earlier complete file is intact */
    rw_assert_bytes_equal(rw_st_find(f, "b")->data, data + 120, 60, "kept file");
    rw_st_close(f);

    /* bad declarations */
    rw_st_decl dup[] = {{"a", RW_DTYPE_F32, 1, {1}}, {"a", RW_DTYPE_F32, 1, {1}}};
    assert_int_equal(rw_st_writer_create(path, dup, 2, NULL, &w, &e), RW_E_INVALID_ARG);
    assert_non_null(strstr(e.msg, "'a' is declared twice"));
    rw_st_decl bad_dt[] = {{"a", RW_DTYPE_INVALID, 1, {1}}};
    assert_int_equal(rw_st_writer_create(path, bad_dt, 1, NULL, &w, &e), RW_E_DTYPE);
    rw_st_decl neg[] = {{"a", RW_DTYPE_F32, 2, {1, -1}}};
    assert_int_equal(rw_st_writer_create(path, neg, 1, NULL, &w, &e), RW_E_SHAPE);
    assert_non_null(strstr(e.msg, "negative shape[1]"));
    rw_st_decl nd[] = {{"a", RW_DTYPE_F32, 7, {1}}};
    assert_int_equal(rw_st_writer_create(path, nd, 1, NULL, &w, &e), RW_E_SHAPE);
    rw_st_decl noname[] = {{NULL, RW_DTYPE_F32, 1, {1}}};
    assert_int_equal(rw_st_writer_create(path, noname, 1, NULL, &w, &e), RW_E_INVALID_ARG);
    char longname[600];
    memset(longname, 'n', sizeof longname - 1);
    longname[sizeof longname - 1] = 0;
    rw_st_decl ln[] = {{longname, RW_DTYPE_F32, 1, {1}}};
    assert_int_equal(rw_st_writer_create(path, ln, 1, NULL, &w, &e), RW_E_INVALID_ARG);
    assert_non_null(strstr(e.msg, "name longer than 512"));
    rw_st_decl md[] = {{"__metadata__", RW_DTYPE_F32, 1, {1}}};
    assert_int_equal(rw_st_writer_create(path, md, 1, NULL, &w, &e), RW_E_INVALID_ARG);
    const char *odd_meta[] = {"key", NULL};
    assert_int_equal(rw_st_writer_create(path, d, 2, odd_meta, &w, &e), RW_E_INVALID_ARG);
    assert_non_null(strstr(e.msg, "'key' has no value"));
    assert_int_equal(rw_st_writer_create("/nonexistent/dir/x.safetensors", d, 2, NULL, &w, &e),
                     RW_E_IO);
    assert_null(w);
    rw_test_rm_rf(dir);
    free(dir);
}

/* ---- malformed files ------------------------------------------------------------------------- */

typedef struct {
    const char *what;
    const char *hdr;
    size_t data_len;
    rw_status st;
    const char *needle;
} bad_case;

#define A_OK "\"a\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,24]}"

static const bad_case bad_cases[] = {
    {"unknown dtype", "{\"a\":{\"dtype\":\"F8_E5M2\",\"shape\":[2],\"data_offsets\":[0,2]}}", 2,
     RW_E_DTYPE, "tensor 'a': unknown dtype 'F8_E5M2'"},
    {"lower-case dtype", "{\"a\":{\"dtype\":\"bf16\",\"shape\":[2],\"data_offsets\":[0,4]}}", 4,
     RW_E_DTYPE, "unknown dtype 'bf16'"},
    {"dtype not a string", "{\"a\":{\"dtype\":7,\"shape\":[2],\"data_offsets\":[0,2]}}", 2,
     RW_E_FORMAT, "tensor 'a': dtype is not a string"},
    {"shape x dtype != bytes",
     "{\"a\":{\"dtype\":\"F32\",\"shape\":[2,4],\"data_offsets\":[0,24]}}", 24, RW_E_SHAPE,
     "tensor 'a': shape [2, 4] of F32 needs 32 bytes but data_offsets span 24"},
    {"offsets past the data",
     "{" A_OK ",\"b\":{\"dtype\":\"BF16\",\"shape\":[8],\"data_offsets\":[24,40]}}", 32,
     RW_E_FORMAT, "tensor 'b': data_offsets [24, 40) run past the end of the data section"},
    {"overlap", "{" A_OK ",\"b\":{\"dtype\":\"BF16\",\"shape\":[4],\"data_offsets\":[20,28]}}", 28,
     RW_E_FORMAT, "tensor 'b': data_offsets [20, 28) overlap tensor 'a'"},
    {"hole", "{" A_OK ",\"b\":{\"dtype\":\"BF16\",\"shape\":[4],\"data_offsets\":[26,34]}}", 34,
     RW_E_FORMAT, "leaving a hole of 2 bytes after tensor 'a'"},
    {"hole at the start", "{\"a\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[8,32]}}", 32,
     RW_E_FORMAT, "hole of 8 bytes after the start"},
    {"trailing bytes", "{" A_OK "}", 40, RW_E_FORMAT, "16 trailing bytes"},
    {"invalid JSON", "{\"a\":{\"dtype\":\"F32\",", 0, RW_E_FORMAT, "header is not valid JSON"},
    {"not an object", "[1, 2, 3]", 0, RW_E_FORMAT, "header is not a JSON object"},
    {"duplicate tensor", "{" A_OK "," A_OK "}", 24, RW_E_FORMAT, "duplicate"},
    {"entry not an object", "{\"a\":5}", 0, RW_E_FORMAT,
     "tensor 'a': header entry is not a JSON object"},
    {"missing dtype", "{\"a\":{\"shape\":[1],\"data_offsets\":[0,4]}}", 4, RW_E_FORMAT,
     "tensor 'a': missing field 'dtype'"},
    {"missing shape", "{\"a\":{\"dtype\":\"F32\",\"data_offsets\":[0,4]}}", 4, RW_E_FORMAT,
     "tensor 'a': missing field 'shape'"},
    {"missing data_offsets", "{\"a\":{\"dtype\":\"F32\",\"shape\":[1]}}", 4, RW_E_FORMAT,
     "tensor 'a': missing field 'data_offsets'"},
    {"data_offsets not a pair", "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0]}}", 4,
     RW_E_FORMAT, "data_offsets is not a list of two integers"},
    {"begin after end", "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[8,4]}}", 8,
     RW_E_FORMAT, "begin 8 is after end 4"},
    {"negative offsets", "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[-4,0]}}", 4,
     RW_E_FORMAT, "negative data_offsets"},
    {"negative dim", "{\"a\":{\"dtype\":\"F32\",\"shape\":[-1,4],\"data_offsets\":[0,16]}}", 16,
     RW_E_SHAPE, "shape[0] is not a non-negative integer"},
    {"fractional dim", "{\"a\":{\"dtype\":\"F32\",\"shape\":[1.5],\"data_offsets\":[0,4]}}", 4,
     RW_E_SHAPE, "shape[0] is not a non-negative integer"},
    {"shape not a list", "{\"a\":{\"dtype\":\"F32\",\"shape\":4,\"data_offsets\":[0,16]}}", 16,
     RW_E_SHAPE, "shape is not a list"},
    {"too many dims",
     "{\"a\":{\"dtype\":\"F32\",\"shape\":[1,1,1,1,1,1,1],\"data_offsets\":[0,4]}}", 4, RW_E_SHAPE,
     "7 dimensions"},
    {"byte count overflows",
     "{\"a\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296,4],\"data_offsets\":[0,0]}}", 0,
     RW_E_SHAPE, "needs more than"},
    {"metadata not an object", "{\"__metadata__\":\"x\"," A_OK "}", 24, RW_E_FORMAT,
     "__metadata__ is not a JSON object"},
    {"metadata value not a string", "{\"__metadata__\":{\"k\":1}," A_OK "}", 24, RW_E_FORMAT,
     "__metadata__ value of 'k' is not a string"},
    {"empty name", "{\"\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4,
     RW_E_FORMAT, "empty name"},
};

static void test_malformed_headers(void **state) {
    (void)state;
    for (size_t i = 0; i < sizeof bad_cases / sizeof bad_cases[0]; i++) {
        const bad_case *c = &bad_cases[i];
        size_t len;
        uint8_t *b = image(strlen(c->hdr), c->hdr, c->data_len, &len);
        rw_err e = {0};
        rw_st_file *f = (rw_st_file *)b;
        rw_status st = rw_st_open_mem(b, len, &f, &e);
        if (st != c->st)
            fail_msg("%s: got %s (%s), want %s", c->what, rw_status_str(st), e.msg,
                     rw_status_str(c->st));
        if (!strstr(e.msg, c->needle))
            fail_msg("%s: message '%s' lacks '%s'", c->what, e.msg, c->needle);
        assert_null(f);
        free(b);
    }
    /* and the valid base case parses, so the cases above fail for their own reason */
    size_t len;
    uint8_t *b = image(strlen("{" A_OK "}"), "{" A_OK "}", 24, &len);
    rw_err e = {0};
    rw_st_file *f = NULL;
    RW_ASSERT_OK(rw_st_open_mem(b, len, &f, &e), &e);
    rw_st_close(f);
    free(b);
}

static void test_malformed_lengths(void **state) {
    (void)state;
    rw_err e = {0};
    rw_st_file *f = NULL;
    size_t len;
    const char *hdr = "{" A_OK "}";
    /* header length larger than the file */
    uint8_t *b = image(strlen(hdr) + 100, hdr, 24, &len);
    assert_int_equal(rw_st_open_mem(b, len, &f, &e), RW_E_FORMAT);
    assert_non_null(strstr(e.msg, "is larger than the file"));
    free(b);
    /* header length past the sanity limit (before any allocation is tried) */
    b = image(1ull << 40, hdr, 24, &len);
    assert_int_equal(rw_st_open_mem(b, len, &f, &e), RW_E_FORMAT);
    assert_non_null(strstr(e.msg, "exceeds the limit"));
    free(b);
    b = image(UINT64_MAX, hdr, 24, &len);
    assert_int_equal(rw_st_open_mem(b, len, &f, &e), RW_E_FORMAT);
    assert_non_null(strstr(e.msg, "exceeds the limit"));
    free(b);
    /* header length shorter than the JSON: the rest counts as data, the JSON is cut */
    b = image(strlen(hdr) - 3, hdr, 24, &len);
    assert_int_equal(rw_st_open_mem(b, len, &f, &e), RW_E_FORMAT);
    assert_non_null(strstr(e.msg, "not valid JSON"));
    free(b);
    b = image(0, "", 0, &len);
    assert_int_equal(rw_st_open_mem(b, len, &f, &e), RW_E_FORMAT);
    assert_non_null(strstr(e.msg, "too small"));
    free(b);
    /* shorter than the length field itself */
    uint8_t tiny[5] = {1, 0, 0, 0, 0};
    assert_int_equal(rw_st_open_mem(tiny, sizeof tiny, &f, &e), RW_E_FORMAT);
    assert_non_null(strstr(e.msg, "shorter than the 8-byte header length"));
    assert_int_equal(rw_st_open_mem(NULL, 0, &f, &e), RW_E_FORMAT);
    assert_int_equal(rw_st_open_mem(NULL, 10, &f, &e), RW_E_INVALID_ARG);
    /* the header must not smuggle a NUL */
    const char nul_hdr[] = "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}";
    b = image(strlen(nul_hdr) + 2, nul_hdr, 6, &len);
    b[8 + strlen(nul_hdr)] = 0;
    b[8 + strlen(nul_hdr) + 1] = ' ';
    assert_int_equal(rw_st_open_mem(b, len, &f, &e), RW_E_FORMAT);
    free(b);
}

static void test_malformed_files_on_disk(void **state) {
    (void)state;
    char *dir = rw_test_tmpdir("rw_test_st_");
    char path[512];
    snprintf(path, sizeof path, "%s/t.safetensors", dir);
    rw_st_decl d[] = {{"w", RW_DTYPE_BF16, 2, {64, 64}}, {"v", RW_DTYPE_F32, 1, {100}}};
    size_t total = 64 * 64 * 2 + 400;
    uint8_t *data = malloc(total);
    fill_random(data, total, 2);
    write_file(path, d, 2, NULL, data, total, 9);
    /* truncated data: the last tensor runs past the end */
    struct stat sb;
    assert_int_equal(stat(path, &sb), 0);
    assert_int_equal(truncate(path, sb.st_size - 5), 0);
    rw_err e = {0};
    rw_st_file *f = NULL;
    assert_int_equal(rw_st_open(path, &f, &e), RW_E_FORMAT);
    assert_non_null(strstr(e.msg, "tensor 'v'"));
    assert_non_null(strstr(e.msg, "run past the end of the data section"));
    assert_non_null(strstr(e.msg, path)); /* the message names the file */
    assert_null(f);
    /* truncated inside the header */
    assert_int_equal(truncate(path, 40), 0);
    assert_int_equal(rw_st_open(path, &f, &e), RW_E_FORMAT);
    assert_non_null(strstr(e.msg, "larger than the file"));
    /* empty file */
    assert_int_equal(truncate(path, 0), 0);
    assert_int_equal(rw_st_open(path, &f, &e), RW_E_FORMAT);
    assert_non_null(strstr(e.msg, "shorter than the 8-byte header length"));
    /* not there, not a file */
    assert_int_equal(rw_st_open("/nonexistent/x.safetensors", &f, &e), RW_E_NOT_FOUND);
    assert_non_null(strstr(e.msg, "/nonexistent/x.safetensors"));
    assert_int_equal(rw_st_open(dir, &f, &e), RW_E_IO);
    assert_non_null(strstr(e.msg, "not a regular file"));
    free(data);
    rw_test_rm_rf(dir);
    free(dir);
}

/* Random byte changes and truncations of a valid image: the reader must answer every one, and
 * whatever it accepts must lie inside the buffer and tile the data section. */
static void test_random_corruption(void **state) {
    (void)state;
    char *dir = rw_test_tmpdir("rw_test_st_");
    char path[512];
    snprintf(path, sizeof path, "%s/c.safetensors", dir);
    rw_st_decl d[] = {{"alpha", RW_DTYPE_BF16, 2, {7, 9}},
                      {"beta", RW_DTYPE_F32, 1, {5}},
                      {"gamma", RW_DTYPE_E4M3, 3, {2, 3, 4}}};
    size_t total = 7 * 9 * 2 + 20 + 24;
    uint8_t data[200];
    fill_random(data, total, 4);
    const char *meta[] = {"format", "pt", NULL};
    write_file(path, d, 3, meta, data, total, 1);
    char *orig = NULL;
    size_t len = 0;
    rw_err e = {0};
    RW_ASSERT_OK(rw_read_file(path, &orig, &len, &e), &e);
    uint8_t *b = malloc(len);
    rw_rng r;
    rw_rng_seed(&r, 0xc0ffee);
    int accepted = 0, refused = 0;
    for (int it = 0; it < 20000; it++) {
        memcpy(b, orig, len);
        size_t n = len;
        int kind = (int)(rw_rng_u64(&r) % 4);
        if (kind == 3) {
            n = (size_t)(rw_rng_u64(&r) % len);
        } else {
            int flips = 1 + (int)(rw_rng_u64(&r) % 3);
            for (int k = 0; k < flips; k++) {
                /* mostly in the header, where the rules are */
                size_t at = (rw_rng_u64(&r) % 4) ? (size_t)(rw_rng_u64(&r) % 200)
                                                 : (size_t)(rw_rng_u64(&r) % len);
                b[at] = kind == 0 ? (uint8_t)rw_rng_u64(&r)
                                  : (uint8_t)("0123456789[]{},:\"-. eE"[rw_rng_u64(&r) % 22]);
            }
        }
        rw_st_file *f = NULL;
        rw_err ee = {0};
        rw_status st = rw_st_open_mem(b, n, &f, &ee);
        if (st != RW_OK) {
            assert_null(f);
            if (!ee.msg[0]) fail_msg("iteration %d: refused with an empty message", it);
            refused++;
            continue;
        }
        accepted++;
        uint64_t hl = 0;
        for (int i = 7; i >= 0; i--)
            hl = (hl << 8) | b[i];
        uint64_t at = 0;
        for (size_t i = 0; i < rw_st_count(f); i++) {
            const rw_st_entry *en = rw_st_at(f, i);
            assert_int_equal(en->begin, at);
            assert_true((const uint8_t *)en->data == b + 8 + hl + en->begin);
            assert_true(8 + hl + en->end <= n);
            assert_int_equal(en->end - en->begin, (uint64_t)rw_shape_numel(en->ndim, en->shape) *
                                                      rw_dtype_size(en->dtype));
            at = en->end;
        }
        assert_int_equal(8 + hl + at, n);
        rw_st_close(f);
    }
    assert_true(refused > 1000);
    assert_true(accepted > 0); /* flips in the data bytes or the padding are harmless */
    free(b);
    free(orig);
    rw_test_rm_rf(dir);
    free(dir);
}

/* ---- checkpoints ----------------------------------------------------------------------------- */

static void put_file(const char *dir, const char *name, const char *const *tensors, uint64_t seed) {
    rw_st_decl d[8];
    size_t n = 0;
    for (; tensors[n]; n++)
        d[n] = (rw_st_decl){tensors[n], RW_DTYPE_BF16, 2, {4, (int64_t)n + 3}};
    size_t total = 0;
    for (size_t i = 0; i < n; i++)
        total += decl_bytes(&d[i]);
    uint8_t buf[1024];
    fill_random(buf, total, seed);
    char path[600];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    write_file(path, d, n, NULL, buf, total, seed);
}

static void put_text(const char *dir, const char *name, const char *text) {
    char path[600];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

static void expect_ckpt_error(const char *dir, rw_status want, const char *needle) {
    rw_ckpt *c = (rw_ckpt *)1;
    rw_err e = {0};
    rw_status st = rw_ckpt_open(dir, &c, &e);
    if (st != want)
        fail_msg("ckpt: got %s (%s), want %s", rw_status_str(st), e.msg, rw_status_str(want));
    if (!strstr(e.msg, needle)) fail_msg("ckpt: message '%s' lacks '%s'", e.msg, needle);
    assert_null(c);
}

static void test_ckpt_fixture(void **state) {
    (void)state;
    char p[1024];
    rw_err e = {0};
    rw_ckpt *c = NULL;
    RW_ASSERT_OK(rw_ckpt_open(rw_test_path(p, sizeof p, RW_TEST_FIXTURE), &c, &e), &e);
    /* model.safetensors only: reference.safetensors beside it is not part of the model */
    assert_int_equal(rw_ckpt_file_count(c), 1);
    assert_int_equal(rw_ckpt_count(c), 102);
    assert_non_null(strstr(rw_ckpt_file_path(c, 0), "model.safetensors"));
    assert_string_equal(rw_ckpt_dir(c), p);
    const rw_st_entry *en = rw_ckpt_find(c, "model.layers.2.mlp.experts.7.down_proj.weight");
    assert_non_null(en);
    assert_int_equal(en->dtype, RW_DTYPE_BF16);
    assert_true(en->ndim == 2 && en->shape[0] == 128 && en->shape[1] == 96);
    assert_null(rw_ckpt_find(c, "logits.0"));
    assert_null(rw_ckpt_at(c, 102));
    assert_null(rw_ckpt_file_path(c, 1));
    rw_ckpt_close(c);
    rw_ckpt_close(NULL);
}

static void test_ckpt_sharded(void **state) {
    (void)state;
    char *dir = rw_test_tmpdir("rw_test_st_");
    const char *s1[] = {"x", "y", NULL}, *s2[] = {"z", NULL};
    put_file(dir, "model-00001-of-00002.safetensors", s1, 1);
    put_file(dir, "model-00002-of-00002.safetensors", s2, 2);
    put_file(dir, "stray.safetensors", s2, 3); /* not in the index: ignored */
    put_text(dir, "model.safetensors.index.json",
             "{\"metadata\":{\"total_size\":1},\"weight_map\":{"
             "\"z\":\"model-00002-of-00002.safetensors\","
             "\"x\":\"model-00001-of-00002.safetensors\","
             "\"y\":\"model-00001-of-00002.safetensors\"}}");
    rw_err e = {0};
    rw_ckpt *c = NULL;
    RW_ASSERT_OK(rw_ckpt_open(dir, &c, &e), &e);
    assert_int_equal(rw_ckpt_count(c), 3);
    assert_int_equal(rw_ckpt_file_count(c), 2);
    assert_non_null(strstr(rw_ckpt_file_path(c, 1), "model-00002-of-00002.safetensors"));
    const rw_st_entry *z = rw_ckpt_find(c, "z"), *y = rw_ckpt_find(c, "y");
    assert_non_null(z);
    assert_non_null(y);
    assert_int_equal(z->file_index, 1);
    assert_int_equal(y->file_index, 0);
    assert_true(y->shape[1] == 4);
    /* the entry's bytes are the file's bytes */
    rw_st_file *f = NULL;
    RW_ASSERT_OK(rw_st_open(rw_ckpt_file_path(c, 1), &f, &e), &e);
    rw_assert_bytes_equal(z->data, rw_st_find(f, "z")->data, 24, "z");
    rw_st_close(f);
    for (size_t i = 0; i < rw_ckpt_count(c); i++)
        assert_ptr_equal(rw_ckpt_find(c, rw_ckpt_at(c, i)->name), rw_ckpt_at(c, i));
    rw_ckpt_close(c);

    /* index problems */
    put_text(dir, "model.safetensors.index.json",
             "{\"weight_map\":{\"z\":\"model-00002-of-00002.safetensors\","
             "\"x\":\"model-00001-of-00002.safetensors\","
             "\"w\":\"model-00001-of-00002.safetensors\","
             "\"y\":\"model-00001-of-00002.safetensors\"}}");
    expect_ckpt_error(
        dir, RW_E_NOT_FOUND,
        "lists tensor 'w' in model-00001-of-00002.safetensors, which does not hold it");
    put_text(dir, "model.safetensors.index.json",
             "{\"weight_map\":{\"z\":\"model-00001-of-00002.safetensors\","
             "\"x\":\"model-00001-of-00002.safetensors\","
             "\"y\":\"model-00002-of-00002.safetensors\"}}");
    expect_ckpt_error(dir, RW_E_FORMAT, "but it is in");
    put_text(dir, "model.safetensors.index.json",
             "{\"weight_map\":{\"z\":\"model-00002-of-00002.safetensors\","
             "\"x\":\"model-00001-of-00002.safetensors\"}}");
    expect_ckpt_error(dir, RW_E_FORMAT,
                      "tensor 'y' in model-00001-of-00002.safetensors is not listed");
    put_text(dir, "model.safetensors.index.json",
             "{\"weight_map\":{\"z\":\"model-00003-of-00003.safetensors\"}}");
    expect_ckpt_error(dir, RW_E_NOT_FOUND, "names a shard that does not exist");
    put_text(dir, "model.safetensors.index.json", "{\"weight_map\":{\"z\":\"../z.safetensors\"}}");
    expect_ckpt_error(dir, RW_E_FORMAT, "not a plain file name");
    put_text(dir, "model.safetensors.index.json", "{\"weight_map\":{}}");
    expect_ckpt_error(dir, RW_E_FORMAT, "weight_map is empty");
    put_text(dir, "model.safetensors.index.json", "{\"metadata\":{}}");
    expect_ckpt_error(dir, RW_E_FORMAT, "no \"weight_map\" object");
    put_text(dir, "model.safetensors.index.json", "{\"weight_map\":");
    expect_ckpt_error(dir, RW_E_FORMAT, "invalid JSON");
    /* the same tensor in two shards */
    put_file(dir, "model-00002-of-00002.safetensors", (const char *[]){"z", "x", NULL}, 4);
    put_text(dir, "model.safetensors.index.json",
             "{\"weight_map\":{\"z\":\"model-00002-of-00002.safetensors\","
             "\"x\":\"model-00001-of-00002.safetensors\","
             "\"y\":\"model-00001-of-00002.safetensors\"}}");
    expect_ckpt_error(dir, RW_E_FORMAT,
                      "tensor 'x' is in both model-00001-of-00002.safetensors and "
                      "model-00002-of-00002.safetensors");
    /* a malformed shard: the error names the file */
    put_text(dir, "model-00002-of-00002.safetensors", "garbage!");
    expect_ckpt_error(dir, RW_E_FORMAT, "model-00002-of-00002.safetensors");
    rw_test_rm_rf(dir);
    free(dir);
}

static void test_ckpt_loose_files(void **state) {
    (void)state;
    char *dir = rw_test_tmpdir("rw_test_st_");
    expect_ckpt_error(dir, RW_E_NOT_FOUND, "no other *.safetensors file");
    put_file(dir, "b.safetensors", (const char *[]){"b1", "b2", NULL}, 1);
    put_file(dir, "a.safetensors", (const char *[]){"a1", NULL}, 2);
    put_text(dir, "notes.txt", "not a tensor file");
    char sub[600];
    snprintf(sub, sizeof sub, "%s/dir.safetensors", dir);
    assert_int_equal(mkdir(sub, 0755), 0); /* a directory with the extension is skipped */
    rw_err e = {0};
    rw_ckpt *c = NULL;
    RW_ASSERT_OK(rw_ckpt_open(dir, &c, &e), &e);
    assert_int_equal(rw_ckpt_file_count(c), 2);
    assert_non_null(strstr(rw_ckpt_file_path(c, 0), "/a.safetensors")); /* sorted by name */
    assert_int_equal(rw_ckpt_count(c), 3);
    assert_int_equal(rw_ckpt_find(c, "b2")->file_index, 1);
    assert_int_equal(rw_ckpt_at(c, 0)->file_index, 0); /* ordered by file */
    rw_ckpt_close(c);
    put_file(dir, "c.safetensors", (const char *[]){"a1", NULL}, 3);
    expect_ckpt_error(dir, RW_E_FORMAT, "tensor 'a1' is in both a.safetensors and c.safetensors");
    /* a lone model.safetensors wins over loose files */
    put_file(dir, "model.safetensors", (const char *[]){"m", NULL}, 4);
    RW_ASSERT_OK(rw_ckpt_open(dir, &c, &e), &e);
    assert_int_equal(rw_ckpt_count(c), 1);
    assert_non_null(rw_ckpt_find(c, "m"));
    rw_ckpt_close(c);
    char file[600];
    snprintf(file, sizeof file, "%s/model.safetensors", dir);
    expect_ckpt_error(file, RW_E_INVALID_ARG, "is not a directory");
    expect_ckpt_error("/nonexistent/ckpt", RW_E_NOT_FOUND, "/nonexistent/ckpt");
    rw_test_rm_rf(dir);
    free(dir);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_round_trip),
        cmocka_unit_test(test_writer_exact_bytes),
        cmocka_unit_test(test_writer_misuse),
        cmocka_unit_test(test_malformed_headers),
        cmocka_unit_test(test_malformed_lengths),
        cmocka_unit_test(test_malformed_files_on_disk),
        cmocka_unit_test(test_random_corruption),
        cmocka_unit_test(test_ckpt_fixture),
        cmocka_unit_test(test_ckpt_sharded),
        cmocka_unit_test(test_ckpt_loose_files),
        cmocka_unit_test(test_read_after_truncation),
        cmocka_unit_test(test_read_pause_hook),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
