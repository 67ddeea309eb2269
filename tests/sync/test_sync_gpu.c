/* test_sync_gpu.c - the sync module on CUDA devices (gpu suite; exits 77 without one):
 *  - a device weight set updated through the pipeline (ZeroMQ frames and the disk mapping copied
 *    into device staging through pinned chunks, small ones here so that each bucket takes
 *    several turns of every chunk) equals a host weight set loaded directly, by checksum of
 *    every tensor, read back from a thread whose current device is another one (the device
 *    arena is mapped for its own device only);
 * and with two devices (NCCL refuses two ranks of one communicator on one GPU, so these skip on a
 * single-GPU machine), each rank in a thread of its own with its own device current, as a
 * trainer process and a worker process are:
 *  - the transport conformance test (conformance.h) over an NCCL broadcast, trainer rank 0 on
 *    device 0, the worker rank on device 1;
 *  - a receive posted before the trainer broadcasts (the protocol's order) completes; one whose
 *    broadcast never comes times out, the communicator is aborted, and a group created again
 *    afterwards (fresh unique id, both ranks) works;
 *  - pushes over NCCL (whole tensors, trainer TP 2 shards, buckets smaller than the largest
 *    tensor) into a device weight set, verified by checksums; a trainer that stops broadcasting
 *    mid-update leaves the worker incomplete, not hung, and a new group + full push recovers.
 * The weight-sync benchmarks are tested in tests/tools. */
#include "sync_conformance.h"
#include "sync_util.h"

#include <math.h>
#include <pthread.h>
#include <unistd.h>

static int ndev(void) {
    return rw_cuda_device_count();
}

/* Every canonical tensor's checksum of `a` equals that of `b`. */
static void assert_same_weights(rw_wset *a, rw_wset *b, const rw_config *cfg, const char *what) {
    rw_ckpt *ck = fx_ckpt();
    rw_err e;
    for (size_t i = 0; i < rw_ckpt_count(ck); i++) {
        const char *name = rw_ckpt_at(ck, i)->name;
        uint64_t x, y;
        RW_ASSERT_OK(rw_wset_checksum(a, name, &x, &e), &e);
        RW_ASSERT_OK(rw_wset_checksum(b, name, &y, &e), &e);
        if (x != y) fail_msg("%s: %s differs", what, name);
    }
    (void)cfg;
    rw_ckpt_close(ck);
}

typedef struct dworker {
    rw_wset *ws;
    rw_sync_session *s;
    rw_sync_server *srv;
    rw_client *c;
} dworker;

static void dworker_start(dworker *w, const rw_config *cfg, int device) {
    rw_err e;
    RW_ASSERT_OK(rw_wset_create(cfg, 1, 0, RW_PLACE_DEVICE, device, &w->ws, &e), &e);
    RW_ASSERT_OK(rw_sync_session_create(w->ws, "zeros", true, &w->s, &e), &e);
    RW_ASSERT_OK(rw_sync_server_start(w->s, NULL, "tcp://127.0.0.1:*", &w->srv, &e), &e);
    RW_ASSERT_OK(rw_client_connect(rw_sync_server_endpoint(w->srv), NULL, &w->c, &e), &e);
}

static void dworker_stop(dworker *w) {
    rw_client_close(w->c);
    rw_sync_server_stop(w->srv);
    rw_sync_session_destroy(w->s);
    rw_wset_destroy(w->ws);
}

static void test_device_pipeline_zmq_and_disk(void **state) {
    (void)state;
    rw_config cfg;
    fx_config(&cfg);
    rw_wset *ref = ws_reference(&cfg, 1, 0);
    /* 256 KiB pinned chunks (3 of them) and 3 copier threads: a 1 MiB bucket takes 4 chunks */
    setenv("RW_SYNC_PIN_CHUNK", "262144", 1);
    setenv("RW_SYNC_COPY_THREADS", "3", 1);
    dworker w;
    dworker_start(&w, &cfg, ndev() - 1);
    char dir[400];
    fx_dir(dir, sizeof dir);
    rw_client *cl[1] = {w.c};
    rw_push_opts o = {.transport = "zmq",
                      .trainer_tp = 2,
                      .bucket_bytes = 1u << 20,
                      .version = "zmq-dev",
                      .verify = true,
                      .timeout_ms = 30000};
    rw_push_summary s;
    rw_err e;
    RW_ASSERT_OK(rw_sync_push_ckpt(cl, 1, NULL, dir, &o, &s, &e), &e);
    assert_int_equal(s.mismatches, 0);
    assert_true(s.buckets > 1); /* more than one bucket: both staging slots were used */
    /* read back with device 0 current: the set lives on the last device */
    RW_ASSERT_OK(rw_cuda_set_device(0, &e), &e);
    assert_same_weights(w.ws, ref, &cfg, "device set via zmq");
    rw_sync_info info;
    rw_sync_session_info(w.s, &info);
    assert_int_equal(info.staging_bytes, 2u << 20);
    RW_ASSERT_OK(rw_client_update_from_disk(w.c, dir, "disk-dev", 30000, &e), &e);
    RW_ASSERT_OK(rw_cuda_set_device(0, &e), &e);
    assert_same_weights(w.ws, ref, &cfg, "device set via disk");
    /* buckets smaller than the largest tensor (the 128 KiB embedding): row pieces */
    o.trainer_tp = 1;
    o.bucket_bytes = 64u << 10;
    o.version = "zmq-dev-64k";
    RW_ASSERT_OK(rw_sync_push_ckpt(cl, 1, NULL, dir, &o, &s, &e), &e);
    assert_int_equal(s.mismatches, 0);
    assert_same_weights(w.ws, ref, &cfg, "device set via zmq, 64 KiB buckets");
    /* release_memory frees the staging and the pinned chunks; the next update takes them again */
    RW_ASSERT_OK(rw_sync_session_release(w.s, &e), &e);
    rw_sync_session_info(w.s, &info);
    assert_int_equal(info.staging_bytes, 0);
    RW_ASSERT_OK(rw_client_update_from_disk(w.c, dir, "disk-dev-2", 30000, &e), &e);
    assert_same_weights(w.ws, ref, &cfg, "device set via disk after release");
    dworker_stop(&w);
    unsetenv("RW_SYNC_PIN_CHUNK");
    unsetenv("RW_SYNC_COPY_THREADS");
    rw_wset_destroy(ref);
    rw_config_free(&cfg);
}

/* --- NCCL ----------------------------------------------------------------------------------- */
typedef struct join_arg {
    uint8_t id[RW_NCCL_ID_BYTES];
    int rank, device;
    double timeout;
    rw_sync_group *g;
    rw_status st;
    rw_err err;
} join_arg;

static void *join_main(void *p) {
    join_arg *a = p;
    a->st = rw_sync_group_create(a->id, 2, a->rank, "conf", a->device, a->timeout, &a->g, &a->err);
    return NULL;
}

/* Rank 0 on device 0 and rank 1 on device 1, joined concurrently. */
static void make_pair(rw_sync_group **g0, rw_sync_group **g1) {
    rw_err e;
    join_arg a = {.rank = 0, .device = 0, .timeout = 60},
             b = {.rank = 1, .device = 1, .timeout = 60};
    RW_ASSERT_OK(rw_sync_group_unique_id(a.id, &e), &e);
    memcpy(b.id, a.id, sizeof a.id);
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, join_main, &a), 0);
    join_main(&b);
    pthread_join(th, NULL);
    RW_ASSERT_OK(a.st, &a.err);
    RW_ASSERT_OK(b.st, &b.err);
    *g0 = a.g;
    *g1 = b.g;
}

/* The NCCL pair: manifests travel through a queue in their wire form; bytes through a trainer
 * thread that copies each bucket to device 0 and broadcasts it. */
#define QN 8
typedef struct npair {
    rw_sync_group *g0, *g1;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    void *man[QN]; /* msgpack bytes */
    size_t man_len[QN];
    int mh, mt;
    uint8_t *job[QN];
    uint64_t job_len[QN];
    int jh, jt;
    bool stop;
    pthread_t th;
    rw_status st;
    rw_err err;
} npair;

static void *trainer_main(void *p) {
    npair *q = p;
    rw_err e;
    rw_cuda_set_device(0, NULL);
    for (;;) {
        pthread_mutex_lock(&q->mu);
        while (q->jh == q->jt && !q->stop)
            pthread_cond_wait(&q->cv, &q->mu);
        if (q->jh == q->jt) {
            pthread_mutex_unlock(&q->mu);
            break;
        }
        uint8_t *b = q->job[q->jh % QN];
        uint64_t n = q->job_len[q->jh % QN];
        q->jh++;
        pthread_mutex_unlock(&q->mu);
        void *d;
        rw_status st = rw_dev_malloc(n ? n : 1, &d, &e);
        if (st == RW_OK) st = rw_memcpy(d, RW_PLACE_DEVICE, b, RW_PLACE_HOST, n, NULL, &e);
        if (st == RW_OK) st = rw_stream_sync(NULL, &e);
        if (st == RW_OK) st = rw_sync_group_bcast(q->g0, d, n, NULL, &e);
        if (st == RW_OK) st = rw_sync_group_wait(q->g0, NULL, 30, &e);
        rw_dev_free(d);
        free(b);
        if (st != RW_OK && q->st == RW_OK) {
            q->st = st;
            q->err = e;
        }
    }
    return NULL;
}

static rw_status n_send(void *pair, const rw_sync_manifest *m, const void *bytes, rw_err *err) {
    npair *q = pair;
    rw_mw *w;
    RW_CHECK(rw_mw_create(&w, err));
    rw_sync_manifest_write(m, w);
    void *mb;
    size_t ml;
    RW_CHECK(rw_mw_take(w, &mb, &ml, err));
    rw_mw_destroy(w);
    uint64_t n = rw_sync_manifest_bytes(m);
    uint8_t *copy = malloc(n ? n : 1);
    memcpy(copy, bytes, n);
    pthread_mutex_lock(&q->mu);
    q->man[q->mt % QN] = mb;
    q->man_len[q->mt % QN] = ml;
    q->mt++;
    q->job[q->jt % QN] = copy;
    q->job_len[q->jt % QN] = n;
    q->jt++;
    pthread_cond_broadcast(&q->cv);
    pthread_mutex_unlock(&q->mu);
    return RW_OK;
}

static rw_status n_recv(void *pair, int timeout_ms, rw_sync_manifest *m, rw_sync_source *src,
                        rw_err *err) {
    npair *q = pair;
    double deadline = rw_now() + timeout_ms / 1e3;
    pthread_mutex_lock(&q->mu);
    while (q->mh == q->mt) {
        pthread_mutex_unlock(&q->mu);
        if (rw_now() > deadline) RW_FAIL(err, RW_E_TIMEOUT, "no manifest");
        usleep(2000);
        pthread_mutex_lock(&q->mu);
    }
    void *mb = q->man[q->mh % QN];
    size_t ml = q->man_len[q->mh % QN];
    q->mh++;
    pthread_mutex_unlock(&q->mu);
    rw_msg *msg;
    const rw_mobj *v;
    rw_status st = rw_msg_decode_value(mb, ml, &msg, &v, err);
    if (st == RW_OK) st = rw_sync_manifest_read(v, "manifest", m, err);
    rw_msg_free(msg);
    free(mb);
    if (st == RW_OK) *src = rw_sync_source_nccl(q->g1, rw_sync_manifest_bytes(m));
    return st;
}

static void n_release(void *pair) {
    (void)pair;
}

static void test_conformance_nccl(void **state) {
    (void)state;
    if (ndev() < 2) skip();
    npair q = {0};
    pthread_mutex_init(&q.mu, NULL);
    pthread_cond_init(&q.cv, NULL);
    make_pair(&q.g0, &q.g1);
    assert_int_equal(pthread_create(&q.th, NULL, trainer_main, &q), 0);
    conf_ops o = {.name = "nccl",
                  .pair = &q,
                  .dst_place = RW_PLACE_DEVICE,
                  .device = 1,
                  .shards = true,
                  .send = n_send,
                  .send_truncated = NULL, /* a broadcast's count is fixed by the manifest */
                  .recv = n_recv,
                  .release = n_release};
    conformance_run(&o);
    pthread_mutex_lock(&q.mu);
    q.stop = true;
    pthread_cond_broadcast(&q.cv);
    pthread_mutex_unlock(&q.mu);
    pthread_join(q.th, NULL);
    RW_ASSERT_OK(q.st, &q.err);
    rw_sync_group_destroy(q.g0);
    rw_sync_group_destroy(q.g1);
}

/* Trainer rank 0 in a thread of its own, as in a trainer process: device 0 current, `n` bytes
 * of `host` copied to its GPU, broadcast, waited for. */
typedef struct bcaster {
    rw_sync_group *g;
    const uint8_t *host;
    uint64_t n;
    pthread_t th;
    rw_status st;
    rw_err err;
} bcaster;

static void *bcaster_main(void *p) {
    bcaster *b = p;
    void *d = NULL;
    b->st = rw_cuda_set_device(rw_sync_group_device(b->g), &b->err);
    if (b->st == RW_OK) b->st = rw_dev_malloc(b->n, &d, &b->err);
    if (b->st == RW_OK)
        b->st = rw_memcpy(d, RW_PLACE_DEVICE, b->host, RW_PLACE_HOST, b->n, NULL, &b->err);
    if (b->st == RW_OK) b->st = rw_stream_sync(NULL, &b->err);
    if (b->st == RW_OK) b->st = rw_sync_group_bcast(b->g, d, b->n, NULL, &b->err);
    if (b->st == RW_OK) b->st = rw_sync_group_wait(b->g, NULL, 30, &b->err);
    rw_dev_free(d);
    return NULL;
}

static void test_nccl_timeout_abort_recreate(void **state) {
    (void)state;
    if (ndev() < 2) skip();
    rw_sync_group *g0, *g1;
    make_pair(&g0, &g1);
    rw_err e;
    void *d1;
    /* this thread is the worker rank: device 1 */
    RW_ASSERT_OK(rw_cuda_set_device(1, &e), &e);
    RW_ASSERT_OK(rw_dev_malloc(1 << 20, &d1, &e), &e);
    /* the protocol's order: the worker posts its receive (and would reply) first, the trainer
     * broadcasts afterwards; the receive is enqueued without waiting for the trainer */
    uint8_t host[4096], back[4096];
    for (int i = 0; i < 4096; i++)
        host[i] = (uint8_t)(i * 7 + 3);
    double t0 = rw_now();
    RW_ASSERT_OK(rw_sync_group_bcast(g1, d1, 4096, NULL, &e), &e);
    assert_true(rw_now() - t0 < 5);
    bcaster b = {.g = g0, .host = host, .n = 4096};
    assert_int_equal(pthread_create(&b.th, NULL, bcaster_main, &b), 0);
    RW_ASSERT_OK(rw_sync_group_wait(g1, NULL, 30, &e), &e);
    pthread_join(b.th, NULL);
    RW_ASSERT_OK(b.st, &b.err);
    RW_ASSERT_OK(rw_memcpy(back, RW_PLACE_HOST, d1, RW_PLACE_DEVICE, 4096, NULL, &e), &e);
    RW_ASSERT_OK(rw_stream_sync(NULL, &e), &e);
    rw_assert_bytes_equal(host, back, 4096, "receive posted before the broadcast");
    /* the worker posts a receive; the trainer never broadcasts */
    RW_ASSERT_OK(rw_sync_group_bcast(g1, d1, 1 << 20, NULL, &e), &e);
    t0 = rw_now();
    assert_int_equal(rw_sync_group_wait(g1, NULL, 1.0, &e), RW_E_TIMEOUT);
    assert_true(rw_now() - t0 < 10);
    assert_non_null(strstr(e.msg, "aborted"));
    assert_false(rw_sync_group_ok(g1));
    assert_int_equal(rw_sync_group_bcast(g1, d1, 16, NULL, &e), RW_E_STATE);
    rw_sync_group_destroy(g1);
    rw_sync_group_destroy(g0);
    /* a new group (fresh unique id, both ranks joining again) works */
    make_pair(&g0, &g1);
    for (int i = 0; i < 4096; i++)
        host[i] = (uint8_t)(i * 13 + 5);
    RW_ASSERT_OK(rw_cuda_set_device(1, &e), &e);
    memset(back, 0, sizeof back);
    RW_ASSERT_OK(rw_memcpy(d1, RW_PLACE_DEVICE, back, RW_PLACE_HOST, 4096, NULL, &e), &e);
    RW_ASSERT_OK(rw_stream_sync(NULL, &e), &e);
    b = (bcaster){.g = g0, .host = host, .n = 4096};
    assert_int_equal(pthread_create(&b.th, NULL, bcaster_main, &b), 0);
    RW_ASSERT_OK(rw_sync_group_bcast(g1, d1, 4096, NULL, &e), &e);
    RW_ASSERT_OK(rw_sync_group_wait(g1, NULL, 30, &e), &e);
    pthread_join(b.th, NULL);
    RW_ASSERT_OK(b.st, &b.err);
    RW_ASSERT_OK(rw_memcpy(back, RW_PLACE_HOST, d1, RW_PLACE_DEVICE, 4096, NULL, &e), &e);
    RW_ASSERT_OK(rw_stream_sync(NULL, &e), &e);
    rw_assert_bytes_equal(host, back, 4096, "broadcast after re-creating the group");
    rw_dev_free(d1);
    rw_sync_group_destroy(g0);
    rw_sync_group_destroy(g1);
}

static void test_push_nccl(void **state) {
    (void)state;
    if (ndev() < 2) skip();
    rw_config cfg;
    fx_config(&cfg);
    rw_wset *ref = ws_reference(&cfg, 1, 0);
    dworker w;
    dworker_start(&w, &cfg, 1);
    rw_err e;
    rw_client_group *g;
    RW_ASSERT_OK(rw_client_group_create(&w.c, NULL, 1, "weights", 0, 60, &g, &e), &e);
    char dir[400];
    fx_dir(dir, sizeof dir);
    /* trainer TP 1 and 2 in 1 MiB buckets, then 64 KiB buckets (smaller than the 128 KiB
     * embedding and lm_head: row pieces, each a broadcast of its own) */
    for (int k = 0; k < 3; k++) {
        rw_push_opts o = {.transport = "nccl",
                          .trainer_tp = k == 1 ? 2 : 1,
                          .bucket_bytes = k == 2 ? 64u << 10 : 1u << 20,
                          .version = k == 0   ? "nccl-1"
                                     : k == 1 ? "nccl-2"
                                              : "nccl-64k",
                          .verify = true,
                          .timeout_ms = 30000};
        rw_push_summary s;
        RW_ASSERT_OK(rw_sync_push_ckpt(&w.c, 1, g, dir, &o, &s, &e), &e);
        assert_int_equal(s.mismatches, 0);
        assert_true(s.checked > 0);
        if (k == 2) assert_true(s.pieces > s.tensors);
        assert_same_weights(w.ws, ref, &cfg, "device set via nccl");
    }
    /* the trainer announces a bucket and never broadcasts it */
    RW_ASSERT_OK(rw_client_begin_update(w.c, "stalled", false, 1u << 20, 1.0, 10000, &e), &e);
    rw_sync_manifest *m;
    RW_ASSERT_OK(rw_sync_manifest_create(&m, &e), &e);
    int64_t shape[1] = {cfg.hidden_size};
    RW_ASSERT_OK(rw_sync_manifest_add(m, "model.norm.weight", RW_DTYPE_BF16, 1, shape, -1, 0, 0,
                                      RW_PIECE_PLAIN, NULL, &e),
                 &e);
    uint64_t id;
    RW_ASSERT_OK(rw_client_send_bucket_nccl(w.c, m, "weights", &id, &e), &e);
    rw_msg *msg;
    rw_reply r;
    RW_ASSERT_OK(rw_client_wait(w.c, id, 10000, &msg, &r, NULL, NULL, &e), &e);
    rw_msg_free(msg);
    /* the worker's watchdog aborts the communicator and the session */
    double t0 = rw_now();
    int st = RW_SYNC_UPDATING;
    char v[RW_SYNC_MAX_VERSION + 1];
    while (st == RW_SYNC_UPDATING && rw_now() - t0 < 20) {
        usleep(100000);
        RW_ASSERT_OK(rw_client_get_weight_version(w.c, 10000, v, sizeof v, &st, &e), &e);
    }
    assert_int_equal(st, RW_SYNC_INCOMPLETE);
    rw_client_group_destroy(g);
    /* a new group and a full push recover */
    RW_ASSERT_OK(rw_client_group_create(&w.c, NULL, 1, "weights", 0, 60, &g, &e), &e);
    rw_push_opts o = {.transport = "nccl",
                      .trainer_tp = 1,
                      .version = "after",
                      .verify = true,
                      .timeout_ms = 30000};
    rw_push_summary s;
    RW_ASSERT_OK(rw_sync_push_ckpt(&w.c, 1, g, dir, &o, &s, &e), &e);
    RW_ASSERT_OK(rw_client_get_weight_version(w.c, 10000, v, sizeof v, &st, &e), &e);
    assert_int_equal(st, RW_SYNC_READY);
    assert_string_equal(v, "after");
    assert_same_weights(w.ws, ref, &cfg, "after recovery");
    rw_sync_manifest_destroy(m);
    rw_client_group_destroy(g);
    dworker_stop(&w);
    rw_wset_destroy(ref);
    rw_config_free(&cfg);
}

int main(void) {
    rw_test_require_gpu(1);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_device_pipeline_zmq_and_disk),
        cmocka_unit_test(test_conformance_nccl),
        cmocka_unit_test(test_nccl_timeout_abort_recreate),
        cmocka_unit_test(test_push_nccl),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
