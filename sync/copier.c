/* copier.c - a parallel host copy: a few threads that each fill one contiguous share of a range,
 * by memcpy from host memory (a ZeroMQ frame: pageable memory) or through a source's read_at (a
 * checkpoint file: pread). The device pipeline uses it to fill pinned staging chunks, where one
 * thread alone copies far slower than the pinned host -> device DMA drains them. */
#include "sync_internal.h"

#include <pthread.h>
#include <stdlib.h>

#define COPIER_MAX_THREADS 64
/* shares are cut at multiples of this (whole cache lines, whole pages of large ranges) */
#define COPIER_GRAIN 4096
/* below this a range is copied by the caller alone (waking threads costs more) */
#define COPIER_MIN_PARALLEL (256u << 10)

struct rw_sync_copier {
    int n; /* threads, the caller included */
    pthread_t th[COPIER_MAX_THREADS];
    int started; /* helper threads running */
    pthread_mutex_t mu;
    pthread_cond_t go, done;
    uint64_t gen; /* job generation: helpers run each job once */
    int pending;  /* helpers still copying the current job */
    bool quit;
    /* the current job: dst[0, len) from src (memcpy) or from rd's bytes [off, off + len) */
    uint8_t *dst;
    const uint8_t *src;
    const rw_sync_source *rd;
    uint64_t off;
    size_t len;
    /* the failed share lowest in the range (reads only), guarded by mu */
    size_t fail_at;
    rw_status fail_st;
    rw_err fail_err;
};

/* Share i of n of [0, len): cut at COPIER_GRAIN multiples, the last share takes the rest. */
static void share(size_t len, int i, int n, size_t *b, size_t *e) {
    size_t units = (len + COPIER_GRAIN - 1) / COPIER_GRAIN;
    size_t ub = units * (size_t)i / (size_t)n, ue = units * (size_t)(i + 1) / (size_t)n;
    *b = ub * COPIER_GRAIN < len ? ub * COPIER_GRAIN : len;
    *e = ue * COPIER_GRAIN < len ? ue * COPIER_GRAIN : len;
}

/* Fills share [b, e) of the job; a failed read is kept when it is the lowest so far. */
static void run_share(rw_sync_copier *c, uint8_t *dst, const uint8_t *src, const rw_sync_source *rd,
                      uint64_t off, size_t b, size_t e) {
    if (e <= b) return;
    if (!rd) {
        memcpy(dst + b, src + b, e - b);
        return;
    }
    rw_err er;
    rw_err_clear(&er);
    rw_status st = rd->read_at(rd, dst + b, off + b, e - b, &er);
    if (st == RW_OK) return;
    pthread_mutex_lock(&c->mu);
    if (c->fail_st == RW_OK || b < c->fail_at) {
        c->fail_st = st;
        c->fail_at = b;
        c->fail_err = er;
    }
    pthread_mutex_unlock(&c->mu);
}

typedef struct helper_arg {
    rw_sync_copier *c;
    int index; /* 1..n-1; the caller copies share 0 */
} helper_arg;

static void *helper_main(void *p) {
    rw_sync_copier *c = ((helper_arg *)p)->c;
    int index = ((helper_arg *)p)->index;
    free(p);
    uint64_t seen = 0;
    pthread_mutex_lock(&c->mu);
    for (;;) {
        while (!c->quit && c->gen == seen)
            pthread_cond_wait(&c->go, &c->mu);
        if (c->quit) break;
        seen = c->gen;
        uint8_t *dst = c->dst;
        const uint8_t *src = c->src;
        const rw_sync_source *rd = c->rd;
        uint64_t off = c->off;
        size_t len = c->len, b, e;
        int n = c->n;
        pthread_mutex_unlock(&c->mu);
        share(len, index, n, &b, &e);
        run_share(c, dst, src, rd, off, b, e);
        pthread_mutex_lock(&c->mu);
        if (--c->pending == 0) pthread_cond_signal(&c->done);
    }
    pthread_mutex_unlock(&c->mu);
    return NULL;
}

rw_status rw_sync_copier_create(int nthreads, rw_sync_copier **out, rw_err *err) {
    *out = NULL;
    if (nthreads < 1 || nthreads > COPIER_MAX_THREADS)
        RW_FAIL(err, RW_E_RANGE, "copier: %d threads (1..%d)", nthreads, COPIER_MAX_THREADS);
    rw_sync_copier *c = calloc(1, sizeof *c);
    if (!c) RW_FAIL(err, RW_E_OOM, "copier: out of memory");
    c->n = nthreads;
    pthread_mutex_init(&c->mu, NULL);
    pthread_cond_init(&c->go, NULL);
    pthread_cond_init(&c->done, NULL);
    for (int i = 1; i < nthreads; i++) {
        helper_arg *a = malloc(sizeof *a);
        if (!a) break;
        a->c = c;
        a->index = i;
        if (pthread_create(&c->th[c->started], NULL, helper_main, a) != 0) {
            free(a);
            break;
        }
        c->started++;
    }
    /* fewer helpers than asked (thread limits): the shares follow the threads there are */
    c->n = c->started + 1;
    *out = c;
    return RW_OK;
}

void rw_sync_copier_destroy(rw_sync_copier *c) {
    if (!c) return;
    pthread_mutex_lock(&c->mu);
    c->quit = true;
    pthread_cond_broadcast(&c->go);
    pthread_mutex_unlock(&c->mu);
    for (int i = 0; i < c->started; i++)
        pthread_join(c->th[i], NULL);
    pthread_cond_destroy(&c->go);
    pthread_cond_destroy(&c->done);
    pthread_mutex_destroy(&c->mu);
    free(c);
}

int rw_sync_copier_threads(const rw_sync_copier *c) {
    return c ? c->n : 0;
}

/* One job over every thread (the caller takes share 0); returns when all shares are done. */
static rw_status run_job(rw_sync_copier *c, uint8_t *dst, const uint8_t *src,
                         const rw_sync_source *rd, uint64_t off, size_t len, rw_err *err) {
    c->fail_st = RW_OK;
    c->fail_at = 0;
    if (c->n == 1 || len < COPIER_MIN_PARALLEL) {
        run_share(c, dst, src, rd, off, 0, len);
    } else {
        pthread_mutex_lock(&c->mu);
        c->dst = dst;
        c->src = src;
        c->rd = rd;
        c->off = off;
        c->len = len;
        c->pending = c->n - 1;
        c->gen++;
        pthread_cond_broadcast(&c->go);
        pthread_mutex_unlock(&c->mu);
        size_t b, e;
        share(len, 0, c->n, &b, &e);
        run_share(c, dst, src, rd, off, b, e);
        pthread_mutex_lock(&c->mu);
        while (c->pending > 0)
            pthread_cond_wait(&c->done, &c->mu);
        pthread_mutex_unlock(&c->mu);
    }
    if (c->fail_st == RW_OK) return RW_OK;
    if (err) *err = c->fail_err;
    return c->fail_st;
}

void rw_sync_copier_run(rw_sync_copier *c, void *dst, const void *src, size_t len) {
    if (len == 0) return;
    run_job(c, dst, src, NULL, 0, len, NULL);
}

rw_status rw_sync_copier_read(rw_sync_copier *c, void *dst, const rw_sync_source *src, uint64_t off,
                              size_t len, rw_err *err) {
    if (len == 0) return RW_OK;
    if (!src || !src->read_at) RW_FAIL(err, RW_E_INVALID_ARG, "copier: the source has no read_at");
    return run_job(c, dst, NULL, src, off, len, err);
}
