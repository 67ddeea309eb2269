/* sync_conformance.h - the one transport conformance test, run against every transport (ZeroMQ and
 * disk in test_transport.c, NCCL in test_nccl_gpu.c). A transport is driven through a pair of
 * ends: the trainer end sends a bucket (manifest + bytes), the worker end receives it as a
 * manifest and an rw_sync_source. The checks:
 *   1. buckets of random tensors (several dtypes, shapes, one-element and multi-MiB ones) arrive
 *      with the same tensors (name, dtype, shape, shard) and byte-identical data, through `read`
 *      and, where the source has them, the host view and `read_at` (whole tensors and ranges
 *      starting inside one; a range past the bucket refused); the source's byte count equals the
 *      received manifest's;
 *   2. several buckets sent before any is received arrive complete and in order;
 *   3. a bucket whose bytes are shorter than its manifest says is caught (the receive fails or
 *      the source's byte count disagrees with the manifest, which the session refuses);
 *   4. a receive with nothing sent fails within its timeout. */
#ifndef RW_SYNC_CONFORMANCE_H
#define RW_SYNC_CONFORMANCE_H

#include "rw_test.h"

#include "rw_client.h"

typedef struct conf_ops {
    const char *name;
    void *pair;
    /* where `read` delivers (host, or device: the test copies it back) */
    rw_place dst_place;
    int device;
    bool shards; /* the transport carries shard metadata (disk does not) */
    rw_status (*send)(void *pair, const rw_sync_manifest *m, const void *bytes, rw_err *err);
    /* NULL when the transport cannot express a short bucket */
    rw_status (*send_truncated)(void *pair, const rw_sync_manifest *m, const void *bytes,
                                rw_err *err);
    /* fills m (cleared first) and src; the source stays valid until release */
    rw_status (*recv)(void *pair, int timeout_ms, rw_sync_manifest *m, rw_sync_source *src,
                      rw_err *err);
    void (*release)(void *pair);
} conf_ops;

static const rw_dtype conf_dtypes[] = {RW_DTYPE_BF16, RW_DTYPE_F32, RW_DTYPE_E4M3, RW_DTYPE_U8,
                                       RW_DTYPE_I32};

/* A random bucket: `n` tensors with unique names, random dtypes and shapes, filled with random
 * bytes; `big` adds a tensor of about 3 MiB. */
static uint8_t *conf_bucket(rw_rng *r, int n, bool big, bool shards, rw_sync_manifest *m, int tag) {
    rw_err e;
    rw_sync_manifest_clear(m);
    for (int i = 0; i < n + (big ? 1 : 0); i++) {
        char name[64];
        snprintf(name, sizeof name, "conf.%d.t%d.weight", tag, i);
        rw_dtype dt = conf_dtypes[rw_rng_u64(r) % 5];
        int nd = 1 + (int)(rw_rng_u64(r) % 3);
        int64_t shape[RW_MAX_DIMS];
        for (int d = 0; d < nd; d++)
            shape[d] = 1 + (int64_t)(rw_rng_u64(r) % 17);
        /* byte sizes stay multiples of 4, as in real checkpoints, so that tensors packed back to
         * back (safetensors) keep every dtype aligned */
        shape[nd - 1] = 4 * (1 + (int64_t)(rw_rng_u64(r) % 5));
        if (i == 0) { /* a one-element tensor */
            nd = 1;
            shape[0] = 1;
            dt = RW_DTYPE_F32;
        }
        if (i == n) { /* big */
            nd = 2;
            shape[0] = 768;
            shape[1] = 2048;
            dt = RW_DTYPE_BF16;
        }
        int sd = -1;
        int64_t sb = 0, sl = 0;
        if (shards && nd >= 2 && i % 2 == 1 && shape[0] >= 2) {
            sd = 0;
            sl = shape[0] / 2;
            sb = shape[0] - sl;
        }
        RW_ASSERT_OK(
            rw_sync_manifest_add(m, name, dt, nd, shape, sd, sb, sl, RW_PIECE_PLAIN, NULL, &e), &e);
    }
    uint64_t nb = rw_sync_manifest_bytes(m);
    uint8_t *b = malloc(nb ? nb : 1);
    assert_non_null(b);
    for (uint64_t i = 0; i < nb; i++)
        b[i] = (uint8_t)(rw_rng_u64(r) >> 24);
    return b;
}

/* Compares a received bucket against what was sent. */
static void conf_check(const conf_ops *o, const rw_sync_manifest *sent, const uint8_t *bytes,
                       const rw_sync_manifest *got, rw_sync_source *src) {
    rw_err e;
    assert_int_equal(rw_sync_manifest_count(got), rw_sync_manifest_count(sent));
    assert_int_equal(src->nbytes, rw_sync_manifest_bytes(got));
    RW_ASSERT_OK(rw_sync_manifest_check(got, &e), &e);
    uint64_t nb = rw_sync_manifest_bytes(got);
    uint8_t *recv = malloc(nb ? nb : 1);
    assert_non_null(recv);
    if (o->dst_place == RW_PLACE_HOST) {
        RW_ASSERT_OK(src->read(src, recv, RW_PLACE_HOST, nb, NULL, &e), &e);
    } else {
        void *d;
        RW_ASSERT_OK(rw_cuda_set_device(o->device, &e), &e);
        RW_ASSERT_OK(rw_dev_malloc(nb ? nb : 1, &d, &e), &e);
        rw_stream s;
        RW_ASSERT_OK(rw_stream_create(&s, &e), &e);
        RW_ASSERT_OK(src->read(src, d, RW_PLACE_DEVICE, nb, s, &e), &e);
        RW_ASSERT_OK(rw_memcpy(recv, RW_PLACE_HOST, d, RW_PLACE_DEVICE, nb, s, &e), &e);
        RW_ASSERT_OK(rw_stream_sync(s, &e), &e);
        rw_stream_destroy(s);
        rw_dev_free(d);
    }
    for (size_t i = 0; i < rw_sync_manifest_count(sent); i++) {
        const rw_sync_tensor *a = rw_sync_manifest_at(sent, i), *b = NULL;
        for (size_t j = 0; j < rw_sync_manifest_count(got); j++)
            if (!strcmp(rw_sync_manifest_at(got, j)->name, a->name))
                b = rw_sync_manifest_at(got, j);
        if (!b) fail_msg("%s: %s did not arrive", o->name, a->name);
        assert_int_equal(a->dtype, b->dtype);
        assert_int_equal(a->ndim, b->ndim);
        assert_memory_equal(a->shape, b->shape, sizeof a->shape);
        if (o->shards) {
            assert_int_equal(a->shard_dim, b->shard_dim);
            assert_int_equal(a->shard_begin, b->shard_begin);
            assert_int_equal(a->shard_len, b->shard_len);
        }
        assert_int_equal(a->nbytes, b->nbytes);
        char what[128];
        snprintf(what, sizeof what, "%s: %s via read", o->name, a->name);
        rw_assert_bytes_equal(bytes + a->offset, recv + b->offset, a->nbytes, what);
        if (src->host) {
            snprintf(what, sizeof what, "%s: %s via host view", o->name, a->name);
            rw_assert_bytes_equal(bytes + a->offset, (const uint8_t *)src->host + b->offset,
                                  a->nbytes, what);
        }
        if (src->read_at) {
            /* the tensor's bytes, then a piece that starts inside it */
            uint8_t *part = malloc(a->nbytes + 1);
            assert_non_null(part);
            RW_ASSERT_OK(src->read_at(src, part, b->offset, a->nbytes, &e), &e);
            snprintf(what, sizeof what, "%s: %s via read_at", o->name, a->name);
            rw_assert_bytes_equal(bytes + a->offset, part, a->nbytes, what);
            uint64_t skip = a->nbytes / 3;
            RW_ASSERT_OK(src->read_at(src, part, b->offset + skip, a->nbytes - skip, &e), &e);
            rw_assert_bytes_equal(bytes + a->offset + skip, part, a->nbytes - skip, what);
            free(part);
        }
    }
    if (src->read_at) { /* past the end of the bucket: refused, nothing read */
        uint8_t one;
        assert_int_equal(src->read_at(src, &one, nb, 1, &e), RW_E_RANGE);
    }
    free(recv);
}

static void conformance_run(const conf_ops *o) {
    rw_rng r;
    rw_rng_seed(&r, 0xc0ffee);
    rw_err e;
    rw_sync_manifest *sent[3], *got;
    uint8_t *bytes[3];
    for (int i = 0; i < 3; i++)
        RW_ASSERT_OK(rw_sync_manifest_create(&sent[i], &e), &e);
    RW_ASSERT_OK(rw_sync_manifest_create(&got, &e), &e);

    /* 1: one bucket at a time, small and big */
    for (int round = 0; round < 4; round++) {
        bytes[0] = conf_bucket(&r, 1 + round * 3, round == 2, o->shards, sent[0], round);
        RW_ASSERT_OK(o->send(o->pair, sent[0], bytes[0], &e), &e);
        rw_sync_source src;
        RW_ASSERT_OK(o->recv(o->pair, 10000, got, &src, &e), &e);
        conf_check(o, sent[0], bytes[0], got, &src);
        o->release(o->pair);
        free(bytes[0]);
    }
    /* 2: three in flight, received in order */
    for (int i = 0; i < 3; i++) {
        bytes[i] = conf_bucket(&r, 2 + i, false, o->shards, sent[i], 10 + i);
        RW_ASSERT_OK(o->send(o->pair, sent[i], bytes[i], &e), &e);
    }
    for (int i = 0; i < 3; i++) {
        rw_sync_source src;
        RW_ASSERT_OK(o->recv(o->pair, 10000, got, &src, &e), &e);
        conf_check(o, sent[i], bytes[i], got, &src);
        o->release(o->pair);
        free(bytes[i]);
    }
    /* 3: a short bucket is caught */
    if (o->send_truncated) {
        bytes[0] = conf_bucket(&r, 3, false, o->shards, sent[0], 20);
        RW_ASSERT_OK(o->send_truncated(o->pair, sent[0], bytes[0], &e), &e);
        rw_sync_source src;
        rw_status st = o->recv(o->pair, 10000, got, &src, &e);
        if (st == RW_OK) {
            assert_true(src.nbytes != rw_sync_manifest_bytes(got) ||
                        rw_sync_manifest_bytes(got) != rw_sync_manifest_bytes(sent[0]));
            o->release(o->pair);
        }
        free(bytes[0]);
    }
    /* 4: nothing sent: the receive gives up within its timeout */
    {
        rw_sync_source src;
        double t0 = rw_now();
        rw_status st = o->recv(o->pair, 200, got, &src, &e);
        double dt = rw_now() - t0;
        assert_int_equal(st, RW_E_TIMEOUT);
        assert_true(dt < 2.0);
    }
    for (int i = 0; i < 3; i++)
        rw_sync_manifest_destroy(sent[i]);
    rw_sync_manifest_destroy(got);
}

#endif
