/* test_transport.c - the transport conformance test (conformance.h) over ZeroMQ (an rw_client
 * DEALER to a ROUTER on loopback TCP, zero-copy frames, the real decode path) and over disk
 * (safetensors files written, then read with pread through rw_sync_bucket_from_entries' file
 * sources); the ROUTER's frame limits; and the parallel host copier that moves host bucket bytes
 * (memcpy from a frame, pread from a file) into pinned staging on the device path. */
#include "sync_conformance.h"

#include "sync_internal.h"

#include <sys/stat.h>
#include <unistd.h>
#include <zmq.h>

/* --- ZeroMQ --------------------------------------------------------------------------------- */
typedef struct zpair {
    void *ctx, *router;
    rw_client *cl;
    rw_zmq_msg *cur;
    rw_msg *msg;
    uint64_t ids[32];
    int nids;
} zpair;

static rw_status z_send_impl(zpair *z, const rw_sync_manifest *m, const void *bytes, size_t len,
                             bool zero_copy, rw_err *err) {
    RW_CHECK(rw_client_send_bucket(z->cl, m, bytes, len, zero_copy, &z->ids[z->nids], err));
    z->nids++;
    return RW_OK;
}

static rw_status z_send(void *pair, const rw_sync_manifest *m, const void *bytes, rw_err *err) {
    return z_send_impl(pair, m, bytes, rw_sync_manifest_bytes(m), true, err);
}

static rw_status z_send_short(void *pair, const rw_sync_manifest *m, const void *bytes,
                              rw_err *err) {
    return z_send_impl(pair, m, bytes, rw_sync_manifest_bytes(m) - 6, false, err);
}

static rw_status z_recv(void *pair, int timeout_ms, rw_sync_manifest *m, rw_sync_source *src,
                        rw_err *err) {
    zpair *z = pair;
    RW_CHECK(rw_zmq_recv(z->router, timeout_ms, &z->cur, err));
    size_t len;
    const void *env = rw_zmq_msg_envelope(z->cur, &len);
    rw_request req;
    RW_CHECK(rw_msg_decode_request(env, len, &z->msg, &req, err));
    if (strcmp(req.cmd, "update_weights")) RW_FAIL(err, RW_E_PROTOCOL, "unexpected %s", req.cmd);
    RW_CHECK(rw_sync_manifest_read(rw_mobj_get(req.args, "manifest"), "args.manifest", m, err));
    rw_sync_frames fr;
    rw_zmq_msg_frames(z->cur, &fr);
    if (fr.n != 1) RW_FAIL(err, RW_E_PROTOCOL, "%zu data frames", fr.n);
    *src = rw_sync_source_host("zmq", fr.data[0], fr.len[0]);
    return RW_OK;
}

static void z_release(void *pair) {
    zpair *z = pair;
    rw_mw *w;
    rw_err e;
    RW_ASSERT_OK(rw_mw_create(&w, &e), &e);
    rw_request req;
    rw_msg *m2;
    size_t len;
    const void *env = rw_zmq_msg_envelope(z->cur, &len);
    RW_ASSERT_OK(rw_msg_decode_request(env, len, &m2, &req, &e), &e);
    rw_mw_reply_ok(w, req.id);
    rw_mw_nil(w);
    const void *p;
    size_t n;
    RW_ASSERT_OK(rw_mw_finish(w, &p, &n, &e), &e);
    RW_ASSERT_OK(rw_zmq_reply(z->router, z->cur, p, n, NULL, &e), &e);
    rw_msg_free(m2);
    rw_mw_destroy(w);
    rw_msg_free(z->msg);
    z->msg = NULL;
    rw_zmq_msg_free(z->cur);
    z->cur = NULL;
}

static void test_conformance_zmq(void **state) {
    (void)state;
    zpair z = {0};
    rw_err e;
    z.ctx = zmq_ctx_new();
    z.router = zmq_socket(z.ctx, ZMQ_ROUTER);
    int linger = 0;
    zmq_setsockopt(z.router, ZMQ_LINGER, &linger, sizeof linger);
    assert_int_equal(zmq_bind(z.router, "tcp://127.0.0.1:*"), 0);
    char ep[256];
    size_t epl = sizeof ep;
    zmq_getsockopt(z.router, ZMQ_LAST_ENDPOINT, ep, &epl);
    RW_ASSERT_OK(rw_client_connect(ep, z.ctx, &z.cl, &e), &e);
    conf_ops o = {.name = "zmq",
                  .pair = &z,
                  .dst_place = RW_PLACE_HOST,
                  .shards = true,
                  .send = z_send,
                  .send_truncated = z_send_short,
                  .recv = z_recv,
                  .release = z_release};
    conformance_run(&o);
    /* every bucket got its reply, matched by id */
    for (int i = 0; i < z.nids; i++) {
        rw_msg *m;
        rw_reply r;
        RW_ASSERT_OK(rw_client_wait(z.cl, z.ids[i], 5000, &m, &r, NULL, NULL, &e), &e);
        assert_int_equal(r.id, z.ids[i]);
        rw_msg_free(m);
    }
    rw_client_close(z.cl);
    zmq_close(z.router);
    zmq_ctx_term(z.ctx);
}

/* --- disk ----------------------------------------------------------------------------------- */
typedef struct dpair {
    char dir[128];
    int sent, recvd;
    rw_st_file *cur;
} dpair;

static rw_status d_send_impl(dpair *d, const rw_sync_manifest *m, const void *bytes, bool cut,
                             rw_err *err) {
    size_t n = rw_sync_manifest_count(m);
    rw_st_decl *decl = calloc(n, sizeof *decl);
    if (!decl) RW_FAIL(err, RW_E_OOM, "decls");
    for (size_t i = 0; i < n; i++) {
        const rw_sync_tensor *t = rw_sync_manifest_at(m, i);
        decl[i].name = t->name;
        decl[i].dtype = t->dtype;
        decl[i].ndim = t->ndim;
        memcpy(decl[i].shape, t->shape, sizeof t->shape);
    }
    char path[256];
    snprintf(path, sizeof path, "%s/bucket-%d.safetensors", d->dir, d->sent);
    rw_st_writer *w;
    rw_status st = rw_st_writer_create(path, decl, n, NULL, &w, err);
    for (size_t i = 0; st == RW_OK && i < n; i++) {
        const rw_sync_tensor *t = rw_sync_manifest_at(m, i);
        st = rw_st_writer_write(w, (const uint8_t *)bytes + t->offset, t->nbytes, err);
    }
    if (st == RW_OK) st = rw_st_writer_close(w, err);
    free(decl);
    if (st == RW_OK && cut) {
        struct stat sb;
        stat(path, &sb);
        if (truncate(path, sb.st_size - 7)) st = RW_ERR(err, RW_E_IO, "truncate");
    }
    d->sent++;
    return st;
}

static rw_status d_send(void *p, const rw_sync_manifest *m, const void *b, rw_err *err) {
    return d_send_impl(p, m, b, false, err);
}
static rw_status d_send_short(void *p, const rw_sync_manifest *m, const void *b, rw_err *err) {
    return d_send_impl(p, m, b, true, err);
}

static rw_status d_recv(void *pair, int timeout_ms, rw_sync_manifest *m, rw_sync_source *src,
                        rw_err *err) {
    dpair *d = pair;
    char path[256];
    snprintf(path, sizeof path, "%s/bucket-%d.safetensors", d->dir, d->recvd);
    double deadline = rw_now() + timeout_ms / 1e3;
    struct stat sb;
    while (stat(path, &sb) != 0) {
        if (rw_now() > deadline) RW_FAIL(err, RW_E_TIMEOUT, "no file %s", path);
        usleep(10000);
    }
    d->recvd++;
    RW_CHECK(rw_st_open(path, &d->cur, err));
    size_t n = rw_st_count(d->cur);
    const rw_st_entry **e = calloc(n ? n : 1, sizeof *e);
    for (size_t i = 0; i < n; i++)
        e[i] = rw_st_at(d->cur, i);
    rw_status st = rw_sync_bucket_from_entries(d->cur, e, n, m, src, err);
    free(e);
    return st;
}

static void d_release(void *pair) {
    dpair *d = pair;
    rw_st_close(d->cur);
    d->cur = NULL;
}

static void test_conformance_disk(void **state) {
    (void)state;
    dpair d = {0};
    strcpy(d.dir, "/tmp/rw-conf-XXXXXX");
    assert_non_null(mkdtemp(d.dir));
    conf_ops o = {.name = "disk",
                  .pair = &d,
                  .dst_place = RW_PLACE_HOST,
                  .shards = false,
                  .send = d_send,
                  .send_truncated = d_send_short,
                  .recv = d_recv,
                  .release = d_release};
    conformance_run(&o);
    for (int i = 0; i < d.sent; i++) {
        char path[256];
        snprintf(path, sizeof path, "%s/bucket-%d.safetensors", d.dir, i);
        unlink(path);
    }
    rmdir(d.dir);
}

/* The ROUTER side refuses a message with too many frames and still answers it. */
static void test_zmq_frame_limits(void **state) {
    (void)state;
    void *ctx = zmq_ctx_new(), *router = zmq_socket(ctx, ZMQ_ROUTER);
    int linger = 0;
    zmq_setsockopt(router, ZMQ_LINGER, &linger, sizeof linger);
    assert_int_equal(zmq_bind(router, "tcp://127.0.0.1:*"), 0);
    char ep[256];
    size_t epl = sizeof ep;
    zmq_getsockopt(router, ZMQ_LAST_ENDPOINT, ep, &epl);
    rw_client *c;
    rw_err e;
    RW_ASSERT_OK(rw_client_connect(ep, ctx, &c, &e), &e);
    const void *frames[6] = {"a", "b", "c", "d", "e", "f"};
    size_t lens[6] = {1, 1, 1, 1, 1, 1};
    uint64_t id;
    RW_ASSERT_OK(rw_client_send_json(c, "update_weights", "{}", frames, lens, 6, &id, &e), &e);
    rw_zmq_msg *m;
    assert_int_equal(rw_zmq_recv(router, 5000, &m, &e), RW_E_FORMAT);
    assert_non_null(m);
    assert_non_null(strstr(e.msg, "more than 4 data frames"));
    rw_zmq_msg_free(m);
    /* five data frames: still one too many; four are accepted */
    RW_ASSERT_OK(rw_client_send_json(c, "update_weights", "{}", frames, lens, 5, &id, &e), &e);
    assert_int_equal(rw_zmq_recv(router, 5000, &m, &e), RW_E_FORMAT);
    assert_non_null(m);
    rw_zmq_msg_free(m);
    RW_ASSERT_OK(rw_client_send_json(c, "update_weights", "{}", frames, lens, 4, &id, &e), &e);
    RW_ASSERT_OK(rw_zmq_recv(router, 5000, &m, &e), &e);
    rw_sync_frames fr;
    rw_zmq_msg_frames(m, &fr);
    assert_int_equal(fr.n, 4);
    assert_memory_equal(fr.data[3], "d", 1);
    rw_zmq_msg_free(m);
    /* nothing else pending: a bounded wait times out */
    assert_int_equal(rw_zmq_recv(router, 50, &m, &e), RW_E_TIMEOUT);
    assert_null(m);
    rw_client_close(c);
    zmq_close(router);
    zmq_ctx_term(ctx);
}

/* The parallel copier equals memcpy for every size around its thresholds and share grain, any
 * thread count and unaligned ends, and writes nothing outside the destination range. */
static void test_copier(void **state) {
    (void)state;
    /* around the share grain (4096) and the parallel threshold (256 KiB), and larger ones */
    const size_t sizes[] = {0, 1, 4095, 4096, 4097, 262143, 262144, 1048576, 1060921, 7340035};
    const int threads[] = {1, 2, 3, 8};
    const size_t cap = (8u << 20) + 64;
    uint8_t *src = malloc(cap), *dst = malloc(cap);
    assert_non_null(src);
    assert_non_null(dst);
    rw_rng r;
    rw_rng_seed(&r, 99);
    for (size_t i = 0; i < cap; i++)
        src[i] = (uint8_t)(rw_rng_u64(&r) >> 32);
    rw_err e;
    for (size_t t = 0; t < sizeof threads / sizeof *threads; t++) {
        rw_sync_copier *c;
        RW_ASSERT_OK(rw_sync_copier_create(threads[t], &c, &e), &e);
        assert_true(rw_sync_copier_threads(c) >= 1 && rw_sync_copier_threads(c) <= threads[t]);
        for (size_t k = 0; k < sizeof sizes / sizeof *sizes; k++) {
            for (size_t so = 0; so < 2; so++) {
                size_t n = sizes[k], doff = 3 + so * 13, soff = 1 + so * 7;
                memset(dst, 0xee, cap);
                rw_sync_copier_run(c, dst + doff, src + soff, n);
                if (n && memcmp(dst + doff, src + soff, n))
                    fail_msg("copier: %zu bytes with %d threads differ", n, threads[t]);
                for (size_t i = 0; i < doff; i++)
                    assert_int_equal(dst[i], 0xee);
                for (size_t i = doff + n; i < doff + n + 32; i++)
                    assert_int_equal(dst[i], 0xee);
            }
        }
        rw_sync_copier_destroy(c);
    }
    assert_int_equal(rw_sync_copier_create(0, &(rw_sync_copier *){NULL}, &e), RW_E_RANGE);
    rw_sync_copier_destroy(NULL);
    free(src);
    free(dst);
}

/* The copier reading a file source (pread into one share per thread): the bytes of any range,
 * and after the file was cut short every thread count reports the same "file shrank" error. */
static void test_copier_read(void **state) {
    (void)state;
    char dir[64] = "/tmp/rw-copier-XXXXXX";
    assert_non_null(mkdtemp(dir));
    char path[128];
    snprintf(path, sizeof path, "%s/c.safetensors", dir);
    const size_t nb = 7340035;
    rw_st_decl d = {"blob", RW_DTYPE_U8, 1, {(int64_t)nb}};
    uint8_t *src = malloc(nb), *dst = malloc(nb + 64);
    assert_non_null(src);
    assert_non_null(dst);
    rw_rng r;
    rw_rng_seed(&r, 17);
    for (size_t i = 0; i < nb; i++)
        src[i] = (uint8_t)(rw_rng_u64(&r) >> 40);
    rw_err e;
    rw_st_writer *w;
    RW_ASSERT_OK(rw_st_writer_create(path, &d, 1, NULL, &w, &e), &e);
    RW_ASSERT_OK(rw_st_writer_write(w, src, nb, &e), &e);
    RW_ASSERT_OK(rw_st_writer_close(w, &e), &e);
    rw_st_file *f;
    RW_ASSERT_OK(rw_st_open(path, &f, &e), &e);
    /* the source covers the blob from byte 5 on */
    rw_sync_source fs = rw_sync_source_file(f, 5, nb - 5);
    assert_null(fs.host);
    const size_t sizes[] = {0, 1, 4097, 262144, 1060921, nb - 5};
    const int threads[] = {1, 3, 8};
    for (size_t t = 0; t < sizeof threads / sizeof *threads; t++) {
        rw_sync_copier *c;
        RW_ASSERT_OK(rw_sync_copier_create(threads[t], &c, &e), &e);
        for (size_t k = 0; k < sizeof sizes / sizeof *sizes; k++) {
            size_t n = sizes[k], off = n == nb - 5 ? 0 : 11;
            memset(dst, 0xee, nb + 64);
            RW_ASSERT_OK(rw_sync_copier_read(c, dst + 3, &fs, off, n, &e), &e);
            if (n && memcmp(dst + 3, src + 5 + off, n))
                fail_msg("copier read: %zu bytes with %d threads differ", n, threads[t]);
            assert_int_equal(dst[2], 0xee);
            assert_int_equal(dst[3 + n], 0xee);
        }
        assert_int_equal(rw_sync_copier_read(c, dst, &fs, nb - 5, 1, &e), RW_E_RANGE);
        rw_sync_copier_destroy(c);
    }
    /* a source without read_at is refused */
    rw_sync_copier *c;
    RW_ASSERT_OK(rw_sync_copier_create(2, &c, &e), &e);
    rw_sync_source hs = rw_sync_source_host("mem", src, nb);
    assert_int_equal(rw_sync_copier_read(c, dst, &hs, 0, 16, &e), RW_E_INVALID_ARG);
    rw_sync_copier_destroy(c);
    /* cut at 3 MiB + 7 bytes into the blob */
    struct stat sb;
    assert_int_equal(stat(path, &sb), 0);
    const uint64_t cut = (uint64_t)sb.st_size - nb + (3u << 20) + 7;
    assert_int_equal(truncate(path, (off_t)cut), 0);
    char want[128];
    snprintf(want, sizeof want, "tensor 'blob' is cut at byte %llu of the file",
             (unsigned long long)cut);
    for (size_t t = 0; t < sizeof threads / sizeof *threads; t++) {
        RW_ASSERT_OK(rw_sync_copier_create(threads[t], &c, &e), &e);
        rw_err_clear(&e);
        assert_int_equal(rw_sync_copier_read(c, dst, &fs, 0, nb - 5, &e), RW_E_IO);
        if (!strstr(e.msg, "file shrank while loading") || !strstr(e.msg, want) ||
            !strstr(e.msg, path))
            fail_msg("%d threads: unexpected message: %s", threads[t], e.msg);
        rw_sync_copier_destroy(c);
    }
    rw_st_close(f);
    unlink(path);
    rmdir(dir);
    free(src);
    free(dst);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_conformance_zmq),  cmocka_unit_test(test_conformance_disk),
        cmocka_unit_test(test_zmq_frame_limits), cmocka_unit_test(test_copier),
        cmocka_unit_test(test_copier_read),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
