/* test_push.c - the data path without the engine, over real ZeroMQ on loopback: a worker rank
 * (host weight set with random weights, its session served by rw_sync_server) receives the
 * fixture from rw_sync_push_ckpt and must end up byte-identical to loading the fixture directly:
 * whole tensors, Megatron-style trainer shards (trainer TP 2, fused gate_up) with 1 MiB buckets,
 * a TP2 worker (two ranks), a repeated push (F3: nothing changes), a partial push (--only one
 * layer's experts changes exactly those bytes), checksum verification, a trainer that vanishes
 * mid-update (idle timeout -> weights_incomplete, then a full push recovers),
 * update_weights_from_disk through the client, and buckets smaller than the largest tensor (the
 * embedding and lm_head, 512 x 128 bf16 = 128 KiB, in 64 KiB buckets: row pieces, and sub-ranges
 * of trainer shards and fused gate_up shards) over ZeroMQ and from disk. */
#include "sync_util.h"

#include <unistd.h>

typedef struct worker {
    rw_wset *ws;
    rw_sync_session *s;
    rw_sync_server *srv;
    rw_client *c;
} worker;

static void worker_start(worker *w, const rw_config *cfg, int tp, int rank, uint64_t seed) {
    rw_err e;
    w->ws = ws_random(cfg, tp, rank, seed);
    RW_ASSERT_OK(rw_sync_session_create(w->ws, "random", false, &w->s, &e), &e);
    RW_ASSERT_OK(rw_sync_server_start(w->s, NULL, "tcp://127.0.0.1:*", &w->srv, &e), &e);
    RW_ASSERT_OK(rw_client_connect(rw_sync_server_endpoint(w->srv), NULL, &w->c, &e), &e);
}

static void worker_stop(worker *w) {
    rw_client_close(w->c);
    rw_sync_server_stop(w->srv);
    rw_sync_session_destroy(w->s);
    rw_wset_destroy(w->ws);
}

/* A TP1 worker with random weights (seed) beside the fixture's weights loaded directly. */
typedef struct one {
    rw_config cfg;
    rw_wset *ref;
    worker w;
} one;

static void one_start(one *o, uint64_t seed) {
    fx_config(&o->cfg);
    o->ref = ws_reference(&o->cfg, 1, 0);
    worker_start(&o->w, &o->cfg, 1, 0, seed);
}

static void one_stop(one *o) {
    worker_stop(&o->w);
    rw_wset_destroy(o->ref);
    rw_config_free(&o->cfg);
}

static void push(worker *w, int n, int trainer_tp, uint64_t bucket, const char *only,
                 const char *version, rw_push_summary *sum) {
    char dir[400];
    fx_dir(dir, sizeof dir);
    rw_client *cl[4];
    for (int i = 0; i < n; i++)
        cl[i] = w[i].c;
    rw_push_opts o = {.transport = "zmq",
                      .trainer_tp = trainer_tp,
                      .bucket_bytes = bucket,
                      .version = version,
                      .only = only,
                      .verify = true,
                      .timeout_ms = 20000};
    rw_err e;
    RW_ASSERT_OK(rw_sync_push_ckpt(cl, n, NULL, dir, &o, sum, &e), &e);
    assert_true(sum->verified);
    assert_true(sum->checked > 0);
    if (sum->mismatches) fail_msg("checksum mismatch: %s", sum->first_mismatch);
    assert_string_equal(sum->version, version);
}

static void expect_version(worker *w, const char *version, int state) {
    char v[RW_SYNC_MAX_VERSION + 1];
    int st;
    rw_err e;
    RW_ASSERT_OK(rw_client_get_weight_version(w->c, 5000, v, sizeof v, &st, &e), &e);
    assert_string_equal(v, version);
    assert_int_equal(st, state);
}

static void test_push_tp1(void **state) {
    (void)state;
    one o;
    one_start(&o, 11);
    rw_push_summary s;
    push(&o.w, 1, 1, 0, NULL, "whole", &s);
    ws_assert_equal(o.w.ws, o.ref, "push, whole tensors");
    assert_int_equal(s.buckets, 1);
    assert_int_equal(s.tensors, rw_config_weight_count(&o.cfg));
    expect_version(&o.w, "whole", RW_SYNC_READY);
    /* F3: pushing the same weights again changes nothing */
    size_t n;
    uint8_t *snap = ws_snapshot(o.w.ws, &n);
    push(&o.w, 1, 2, 1u << 20, NULL, "again", &s);
    rw_assert_bytes_equal(snap, ws_bytes(o.w.ws, &n), n, "second push of the same weights");
    free(snap);
    one_stop(&o);
}

static void test_push_trainer_tp2_small_buckets(void **state) {
    (void)state;
    one o;
    one_start(&o, 12);
    rw_push_summary s;
    push(&o.w, 1, 2, 1u << 20, NULL, "tp2-1mib", &s);
    ws_assert_equal(o.w.ws, o.ref, "push, trainer TP 2, 1 MiB buckets");
    assert_true(s.buckets > 1);
    assert_true(s.pieces > s.tensors / 2); /* shards and fused gate_up pieces */
    assert_int_equal(s.tensors, rw_config_weight_count(&o.cfg));
    one_stop(&o);
}

static void test_push_worker_tp2(void **state) {
    (void)state;
    rw_config cfg;
    fx_config(&cfg);
    worker w[2];
    for (int r = 0; r < 2; r++)
        worker_start(&w[r], &cfg, 2, r, 20 + (uint64_t)r);
    rw_push_summary s;
    push(w, 2, 2, 1u << 20, NULL, "w-tp2", &s);
    for (int r = 0; r < 2; r++) {
        rw_wset *ref = ws_reference(&cfg, 2, r);
        ws_assert_equal(w[r].ws, ref, r ? "TP2 worker rank 1" : "TP2 worker rank 0");
        rw_wset_destroy(ref);
        worker_stop(&w[r]);
    }
    rw_config_free(&cfg);
}

/* Byte ranges of layer 1's packed experts in the arena. */
static bool in_layer1_experts(rw_wset *ws, size_t off) {
    const rw_layer_weights *lw = rw_wset_layer(ws, 1);
    const uint8_t *base = rw_arena_base(rw_wset_arena(ws));
    const rw_tensor *t[4] = {&lw->w13, &lw->w2, &lw->w13_scale, &lw->w2_scale};
    for (int i = 0; i < 4; i++) {
        if (!t[i]->data) continue;
        size_t b = (size_t)((const uint8_t *)t[i]->data - base), n = rw_tensor_nbytes(t[i]);
        if (off >= b && off < b + n) return true;
    }
    return false;
}

static void test_push_partial(void **state) {
    (void)state;
    one o;
    one_start(&o, 13);
    size_t n;
    uint8_t *before = ws_snapshot(o.w.ws, &n);
    rw_push_summary s;
    push(&o.w, 1, 2, 1u << 20, "^model\\.layers\\.1\\.mlp\\.experts\\.", "partial", &s);
    assert_int_equal(s.tensors, 3 * (uint64_t)o.cfg.num_experts);
    const uint8_t *after = ws_bytes(o.w.ws, &n);
    size_t changed = 0;
    for (size_t i = 0; i < n; i++)
        if (after[i] != before[i]) {
            if (!in_layer1_experts(o.w.ws, i))
                fail_msg("byte %zu outside layer 1's experts changed", i);
            changed++;
        }
    assert_true(changed > 0);
    /* and those experts now hold the fixture's values */
    rw_ckpt *ck = fx_ckpt();
    rw_err e;
    for (int x = 0; x < o.cfg.num_experts; x++)
        for (int k = 0; k < 3; k++) {
            char name[128];
            static const char *const p[3] = {"gate_proj", "up_proj", "down_proj"};
            snprintf(name, sizeof name, "model.layers.1.mlp.experts.%d.%s.weight", x, p[k]);
            uint64_t a, b;
            RW_ASSERT_OK(rw_wset_checksum(o.w.ws, name, &a, &e), &e);
            RW_ASSERT_OK(rw_wset_checksum(o.ref, name, &b, &e), &e);
            assert_true(a == b);
        }
    rw_ckpt_close(ck);
    free(before);
    one_stop(&o);
}

static void test_trainer_vanishes(void **state) {
    (void)state;
    one o;
    one_start(&o, 14);
    rw_err e;
    /* a trainer begins, sends one bucket, and is gone */
    rw_client *t;
    RW_ASSERT_OK(rw_client_connect(rw_sync_server_endpoint(o.w.srv), NULL, &t, &e), &e);
    RW_ASSERT_OK(rw_client_begin_update(t, "doomed", false, 0, 0.3, 5000, &e), &e);
    rw_ckpt *ck = fx_ckpt();
    rw_sync_manifest *m;
    RW_ASSERT_OK(rw_sync_manifest_create(&m, &e), &e);
    uint8_t *b = fx_bucket(ck, "model.layers.0.", m);
    RW_ASSERT_OK(rw_client_update_weights_zmq(t, m, b, 5000, &e), &e);
    rw_client_close(t);
    expect_version(&o.w, "random", RW_SYNC_UPDATING);
    /* the worker does not wait forever: its idle timeout aborts the session */
    double t0 = rw_now();
    int st = RW_SYNC_UPDATING;
    char v[RW_SYNC_MAX_VERSION + 1];
    while (st == RW_SYNC_UPDATING && rw_now() - t0 < 5) {
        usleep(50000);
        RW_ASSERT_OK(rw_client_get_weight_version(o.w.c, 5000, v, sizeof v, &st, &e), &e);
    }
    assert_int_equal(st, RW_SYNC_INCOMPLETE);
    /* the next full push recovers without a restart */
    rw_push_summary s;
    push(&o.w, 1, 1, 0, NULL, "recovered", &s);
    expect_version(&o.w, "recovered", RW_SYNC_READY);
    ws_assert_equal(o.w.ws, o.ref, "push after an abandoned session");
    free(b);
    rw_sync_manifest_destroy(m);
    rw_ckpt_close(ck);
    one_stop(&o);
}

static void test_disk_and_readback_via_client(void **state) {
    (void)state;
    one o;
    one_start(&o, 15);
    char dir[400];
    fx_dir(dir, sizeof dir);
    rw_err e;
    RW_ASSERT_OK(rw_client_update_from_disk(o.w.c, dir, "from-disk", 20000, &e), &e);
    expect_version(&o.w, "from-disk", RW_SYNC_READY);
    ws_assert_equal(o.w.ws, o.ref, "update_weights_from_disk");
    /* readback through the client equals the fixture tensor (TP1: the whole tensor) */
    rw_ckpt *ck = fx_ckpt();
    const rw_st_entry *t = rw_ckpt_find(ck, "model.layers.0.self_attn.q_proj.weight");
    uint8_t *buf = malloc(t->end - t->begin);
    size_t len;
    RW_ASSERT_OK(rw_client_get_weights(o.w.c, t->name, 0, buf, t->end - t->begin, &len, 5000, &e),
                 &e);
    assert_int_equal(len, t->end - t->begin);
    rw_assert_bytes_equal(t->data, buf, len, "get_weights");
    assert_int_equal(rw_client_get_weights(o.w.c, t->name, 0, buf, 10, &len, 5000, &e), RW_E_RANGE);
    /* errors travel back with their status and message */
    assert_int_equal(rw_client_commit_update(o.w.c, 5000, NULL, 0, &e), RW_E_STATE);
    assert_non_null(strstr(rw_client_last_error(o.w.c), "no update session"));
    char *json = NULL;
    assert_int_equal(
        rw_client_call_json(o.w.c, "update_weights_from_disk", "{\"path\": 3}", 5000, &json, &e),
        RW_E_PROTOCOL);
    assert_non_null(strstr(e.msg, "args.path: expected a string"));
    RW_ASSERT_OK(rw_client_call_json(o.w.c, "get_weight_version", NULL, 5000, &json, &e), &e);
    assert_non_null(strstr(json, "\"version\":\"from-disk\""));
    rw_client_free(json);
    free(buf);
    rw_ckpt_close(ck);
    one_stop(&o);
}

/* Buckets smaller than the largest tensor: every piece that does not fit goes as several, and
 * the worker ends up byte-identical to a direct load. Trainer TP 1 (whole tensors: the
 * embedding and lm_head as row pieces) and 2 (shards and fused gate_up shards cut into
 * sub-ranges), a TP2 worker, and update_weights_from_disk with the same bucket size. */
static void test_push_bucket_smaller_than_tensor(void **state) {
    (void)state;
    const uint64_t bucket = 64u << 10;
    rw_config cfg;
    fx_config(&cfg);
    rw_ckpt *ck = fx_ckpt();
    const rw_st_entry *emb = rw_ckpt_find(ck, "model.embed_tokens.weight");
    assert_non_null(emb);
    assert_true(emb->end - emb->begin > bucket); /* the premise: 128 KiB */
    rw_wset *ref = ws_reference(&cfg, 1, 0);
    for (int ttp = 1; ttp <= 2; ttp++) {
        worker w;
        worker_start(&w, &cfg, 1, 0, 40 + (uint64_t)ttp);
        rw_push_summary s;
        push(&w, 1, ttp, bucket, NULL, ttp == 1 ? "small-1" : "small-2", &s);
        ws_assert_equal(
            w.ws, ref, ttp == 1 ? "64 KiB buckets, whole tensors" : "64 KiB buckets, trainer TP 2");
        assert_int_equal(s.tensors, rw_config_weight_count(&cfg));
        assert_true(s.buckets >= s.bytes / bucket);
        if (ttp == 1) assert_true(s.pieces > rw_ckpt_count(ck)); /* some tensors were cut */
        rw_sync_info info;
        rw_sync_session_info(w.s, &info);
        assert_int_equal(info.state, RW_SYNC_READY);
        worker_stop(&w);
    }
    /* a worker of two ranks: row pieces cross its rank boundary */
    worker w2[2];
    for (int r = 0; r < 2; r++)
        worker_start(&w2[r], &cfg, 2, r, 50 + (uint64_t)r);
    rw_push_summary s;
    push(w2, 2, 1, bucket, NULL, "small-w2", &s);
    for (int r = 0; r < 2; r++) {
        rw_wset *rr = ws_reference(&cfg, 2, r);
        ws_assert_equal(w2[r].ws, rr, r ? "64 KiB buckets, TP2 rank 1" : "64 KiB buckets, rank 0");
        rw_wset_destroy(rr);
        worker_stop(&w2[r]);
    }
    /* from disk with the same bucket size */
    worker w;
    worker_start(&w, &cfg, 1, 0, 44);
    char dir[400];
    fx_dir(dir, sizeof dir);
    rw_sync_begin_args a = {.version = "small-disk", .bucket_bytes = bucket};
    uint64_t nt, nb;
    rw_err e;
    RW_ASSERT_OK(rw_sync_session_apply_disk(w.s, dir, NULL, &a, &nt, &nb, &e), &e);
    assert_int_equal(nt, rw_ckpt_count(ck));
    ws_assert_equal(w.ws, ref, "update_weights_from_disk, 64 KiB buckets");
    rw_sync_info info;
    rw_sync_session_info(w.s, &info);
    assert_string_equal(info.version, "small-disk");
    assert_true(info.buckets > nb / bucket);
    worker_stop(&w);
    /* a bucket that cannot hold one index of a piece is refused before anything is sent
     * (a fused gate_up shard's index is 8 experts x 2 x 128 bf16 = 4 KiB) */
    worker_start(&w, &cfg, 1, 0, 45);
    rw_client *cl[1] = {w.c};
    rw_push_opts o = {.transport = "zmq",
                      .trainer_tp = 2,
                      .bucket_bytes = 1024,
                      .version = "too-small",
                      .timeout_ms = 20000};
    assert_int_equal(rw_sync_push_ckpt(cl, 1, NULL, dir, &o, &s, &e), RW_E_RANGE);
    assert_non_null(strstr(e.msg, "bucket size"));
    expect_version(&w, "random", RW_SYNC_READY);
    worker_stop(&w);
    rw_wset_destroy(ref);
    rw_ckpt_close(ck);
    rw_config_free(&cfg);
}

/* Expected checksums, computed on the trainer side, equal a worker's for every tensor, rank and
 * TP degree; and they catch a single flipped weight. */
static void test_expected_checksums(void **state) {
    (void)state;
    rw_config cfg;
    fx_config(&cfg);
    rw_ckpt *ck = fx_ckpt();
    rw_err e;
    for (int tp = 1; tp <= 2; tp++)
        for (int r = 0; r < tp; r++) {
            rw_wset *ref = ws_reference(&cfg, tp, r);
            for (size_t i = 0; i < rw_ckpt_count(ck); i++) {
                const rw_st_entry *t = rw_ckpt_at(ck, i);
                uint64_t want, got;
                RW_ASSERT_OK(
                    rw_sync_expected_checksum(&cfg, tp, r, t->name, t->data, t->dtype, &want, &e),
                    &e);
                RW_ASSERT_OK(rw_wset_checksum(ref, t->name, &got, &e), &e);
                if (want != got) fail_msg("tp %d rank %d %s", tp, r, t->name);
            }
            rw_wset_destroy(ref);
        }
    const rw_st_entry *t = rw_ckpt_find(ck, "model.layers.2.mlp.experts.5.down_proj.weight");
    uint8_t *mod = malloc(t->end - t->begin);
    memcpy(mod, t->data, t->end - t->begin);
    uint64_t a, b;
    RW_ASSERT_OK(rw_sync_expected_checksum(&cfg, 1, 0, t->name, mod, t->dtype, &a, &e), &e);
    mod[101] ^= 1;
    RW_ASSERT_OK(rw_sync_expected_checksum(&cfg, 1, 0, t->name, mod, t->dtype, &b, &e), &e);
    assert_true(a != b);
    free(mod);
    rw_ckpt_close(ck);
    rw_config_free(&cfg);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_push_tp1),
        cmocka_unit_test(test_push_trainer_tp2_small_buckets),
        cmocka_unit_test(test_push_worker_tp2),
        cmocka_unit_test(test_push_partial),
        cmocka_unit_test(test_trainer_vanishes),
        cmocka_unit_test(test_disk_and_readback_via_client),
        cmocka_unit_test(test_push_bucket_smaller_than_tensor),
        cmocka_unit_test(test_expected_checksums),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
