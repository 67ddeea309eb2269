/* kv_blocks.c - the engine's paged KV block manager and prefix cache (contract and design:
 * kv_blocks.h). The free list is a stack: after a reset blocks are handed out from 0 upwards, and
 * the blocks given back last are taken first. Idle cached blocks sit on a doubly linked LRU list;
 * cached blocks are found through a chained hash table of their keys. */
#include <stdlib.h>

#include "kv_blocks.h"

rw_status rw_kv_blocks_init(rw_kv_blocks *p, int64_t nblocks, int block_size, int route_row,
                            rw_err *err) {
    memset(p, 0, sizeof *p);
    p->nblocks = nblocks;
    p->block_size = block_size;
    p->route_row = route_row;
    p->nbucket = 64;
    while (p->nbucket < (uint64_t)nblocks)
        p->nbucket *= 2;
    const size_t n = (size_t)nblocks;
    p->free = malloc(sizeof(int32_t) * n);
    p->ref = calloc(n, sizeof(int32_t));
    p->cached = calloc(n, 1);
    p->key = calloc(n, sizeof(uint64_t));
    p->version = calloc(n, sizeof(uint64_t));
    p->parent = calloc(n, sizeof(int32_t));
    p->gen = calloc(n, sizeof(uint32_t));
    p->pgen = calloc(n, sizeof(uint32_t));
    p->hnext = calloc(n, sizeof(int32_t));
    p->lru_prev = calloc(n, sizeof(int32_t));
    p->lru_next = calloc(n, sizeof(int32_t));
    p->tok = malloc(sizeof(int32_t) * n * (size_t)block_size);
    p->rids = calloc(n, sizeof(uint16_t *));
    p->rwts = calloc(n, sizeof(float *));
    p->bucket = malloc(sizeof(int32_t) * p->nbucket);
    if (!p->free || !p->ref || !p->cached || !p->key || !p->version || !p->parent || !p->gen ||
        !p->pgen || !p->hnext || !p->lru_prev || !p->lru_next || !p->tok || !p->rids || !p->rwts ||
        !p->bucket) {
        rw_kv_blocks_fini(p);
        RW_FAIL(err, RW_E_OOM, "engine: block tables of %lld KV blocks", (long long)nblocks);
    }
    for (uint64_t i = 0; i < p->nbucket; i++)
        p->bucket[i] = -1;
    p->lru_head = p->lru_tail = -1;
    return RW_OK;
}

static void drop_routes(rw_kv_blocks *p, int32_t b) {
    free(p->rids[b]);
    free(p->rwts[b]);
    p->rids[b] = NULL;
    p->rwts[b] = NULL;
}

void rw_kv_blocks_fini(rw_kv_blocks *p) {
    if (p->rids)
        for (int64_t b = 0; b < p->nblocks; b++)
            drop_routes(p, (int32_t)b);
    void *a[] = {p->free,     p->ref, p->cached, p->key,   p->version,
                 p->parent,   p->gen, p->pgen,   p->hnext, p->lru_prev,
                 p->lru_next, p->tok, p->rids,   p->rwts,  p->bucket};
    for (size_t i = 0; i < sizeof a / sizeof a[0]; i++)
        free(a[i]);
    memset(p, 0, sizeof *p);
}

void rw_kv_blocks_reset(rw_kv_blocks *p) {
    for (int64_t b = 0; b < p->nblocks; b++) {
        drop_routes(p, (int32_t)b);
        if (p->cached[b]) p->gen[b]++;
        p->cached[b] = 0;
        p->ref[b] = 0;
    }
    for (uint64_t i = 0; i < p->nbucket; i++)
        p->bucket[i] = -1;
    p->lru_head = p->lru_tail = -1;
    p->nidle = p->ncached = 0;
    p->nfree = 0;
    /* pushed in descending order so blocks are handed out from 0 upwards */
    for (int64_t b = p->nblocks - 1; b >= 0; b--)
        p->free[p->nfree++] = (int32_t)b;
}

int rw_kv_blocks_for(const rw_kv_blocks *p, int upto) {
    return (upto + p->block_size - 1) / p->block_size;
}

int64_t rw_kv_blocks_avail(const rw_kv_blocks *p) {
    return p->nfree + p->nidle;
}

int64_t rw_kv_blocks_held(const rw_kv_blocks *p) {
    return p->nblocks - p->nfree - p->nidle;
}

/* --- LRU list of idle cached blocks ------------------------------------------------------- */
static void lru_unlink(rw_kv_blocks *p, int32_t b) {
    const int32_t pr = p->lru_prev[b], nx = p->lru_next[b];
    if (pr >= 0)
        p->lru_next[pr] = nx;
    else
        p->lru_head = nx;
    if (nx >= 0)
        p->lru_prev[nx] = pr;
    else
        p->lru_tail = pr;
    p->nidle--;
}

static void lru_append(rw_kv_blocks *p, int32_t b) {
    p->lru_prev[b] = p->lru_tail;
    p->lru_next[b] = -1;
    if (p->lru_tail >= 0)
        p->lru_next[p->lru_tail] = b;
    else
        p->lru_head = b;
    p->lru_tail = b;
    p->nidle++;
}

/* --- hash table ---------------------------------------------------------------------------- */
static uint64_t bucket_of(const rw_kv_blocks *p, uint64_t key) {
    return (key ^ (key >> 29)) & (p->nbucket - 1);
}

/* Takes b out of the cache (it keeps its references); its children can no longer match. */
static void uncache(rw_kv_blocks *p, int32_t b) {
    int32_t *at = &p->bucket[bucket_of(p, p->key[b])];
    while (*at >= 0 && *at != b)
        at = &p->hnext[*at];
    if (*at == b) *at = p->hnext[b];
    p->cached[b] = 0;
    p->gen[b]++;
    p->ncached--;
    drop_routes(p, b);
}

void rw_kv_blocks_hold(rw_kv_blocks *p, int32_t b) {
    if (p->ref[b] == 0 && p->cached[b]) lru_unlink(p, b);
    p->ref[b]++;
}

bool rw_kv_blocks_take(rw_kv_blocks *p, int32_t **blocks, int *n, int *cap, int upto) {
    const int need = rw_kv_blocks_for(p, upto);
    if (need <= *n) return true;
    if (need - *n > rw_kv_blocks_avail(p)) return false;
    if (need > *cap) {
        int nc = *cap ? *cap : 4;
        while (nc < need)
            nc *= 2;
        int32_t *nb = realloc(*blocks, sizeof(int32_t) * (size_t)nc);
        if (!nb) return false;
        *blocks = nb;
        *cap = nc;
    }
    while (*n < need) {
        int32_t b;
        if (p->nfree > 0) {
            b = p->free[--p->nfree];
        } else { /* evict the least recently used idle block */
            b = p->lru_head;
            lru_unlink(p, b);
            uncache(p, b);
            p->evicted++;
        }
        p->ref[b] = 1;
        p->allocated++;
        (*blocks)[(*n)++] = b;
    }
    return true;
}

void rw_kv_blocks_give(rw_kv_blocks *p, const int32_t *blocks, int n) {
    for (int i = n - 1; i >= 0; i--) {
        const int32_t b = blocks[i];
        if (--p->ref[b] > 0) continue;
        if (p->cached[b])
            lru_append(p, b);
        else
            p->free[p->nfree++] = b;
    }
}

/* --- prefix cache -------------------------------------------------------------------------- */
uint64_t rw_kv_blocks_key(const rw_kv_blocks *p, bool first, uint64_t prev_key, uint64_t version,
                          const int32_t *tokens) {
    /* block 0's seed depends on the version, so chains of different weights never share keys */
    const uint64_t seed =
        first ? rw_checksum64(&version, sizeof version, 0x6b765f7072656678ull) : prev_key;
    return rw_checksum64(tokens, sizeof(int32_t) * (size_t)p->block_size, seed);
}

/* The cached block equal to chain position (parent, tokens, version) with this key, or -1. */
static int32_t find(const rw_kv_blocks *p, uint64_t key, int32_t parent, uint64_t version,
                    const int32_t *tokens) {
    const size_t bytes = sizeof(int32_t) * (size_t)p->block_size;
    for (int32_t b = p->bucket[bucket_of(p, key)]; b >= 0; b = p->hnext[b]) {
        if (p->key[b] != key || p->version[b] != version || p->parent[b] != parent) continue;
        if (parent >= 0 && p->pgen[b] != p->gen[parent]) continue;
        if (memcmp(p->tok + (size_t)b * p->block_size, tokens, bytes) != 0) continue;
        return b;
    }
    return -1;
}

int rw_kv_blocks_lookup(const rw_kv_blocks *p, uint64_t version, const int32_t *tokens, int nb,
                        bool need_routes, bool need_weights, int32_t *out, uint64_t *last_key) {
    int32_t parent = -1;
    uint64_t key = 0;
    int m = 0;
    for (; m < nb; m++) {
        const int32_t *t = tokens + (size_t)m * p->block_size;
        const uint64_t k = rw_kv_blocks_key(p, m == 0, key, version, t);
        const int32_t b = find(p, k, parent, version, t);
        if (b < 0 || (need_routes && !p->rids[b]) || (need_weights && !p->rwts[b])) break;
        out[m] = b;
        parent = b;
        key = k;
    }
    *last_key = key;
    return m;
}

int32_t rw_kv_blocks_register(rw_kv_blocks *p, int32_t b, int32_t parent, uint64_t prev_key,
                              uint64_t version, const int32_t *tokens, const uint16_t *rids,
                              const float *rwts, uint64_t *key) {
    const uint64_t k = rw_kv_blocks_key(p, parent < 0, prev_key, version, tokens);
    *key = k;
    const size_t rbytes = (size_t)p->block_size * (size_t)p->route_row;
    int32_t e = find(p, k, parent, version, tokens);
    const int32_t dst = e >= 0 ? e : b;
    /* routes: copied for a new entry, attached to an equal entry that has none */
    if (rids && !p->rids[dst]) {
        uint16_t *r = malloc(sizeof(uint16_t) * rbytes);
        if (!r) return -1;
        memcpy(r, rids, sizeof(uint16_t) * rbytes);
        p->rids[dst] = r;
        if (rwts) {
            float *w = malloc(sizeof(float) * rbytes);
            if (w) memcpy(w, rwts, sizeof(float) * rbytes);
            p->rwts[dst] = w; /* without memory the block simply has no weights */
        }
    }
    if (e >= 0) return e;
    p->cached[b] = 1;
    p->key[b] = k;
    p->version[b] = version;
    p->parent[b] = parent;
    p->pgen[b] = parent >= 0 ? p->gen[parent] : 0;
    memcpy(p->tok + (size_t)b * p->block_size, tokens, sizeof(int32_t) * (size_t)p->block_size);
    const uint64_t h = bucket_of(p, k);
    p->hnext[b] = p->bucket[h];
    p->bucket[h] = b;
    p->ncached++;
    if (p->ref[b] == 0) lru_append(p, b); /* registered while nobody holds it: idle at once */
    return b;
}

void rw_kv_blocks_uncache_all(rw_kv_blocks *p) {
    for (int64_t i = 0; i < p->nblocks; i++) {
        const int32_t b = (int32_t)i;
        if (!p->cached[b]) continue;
        if (p->ref[b] == 0) {
            lru_unlink(p, b);
            uncache(p, b);
            p->free[p->nfree++] = b;
        } else {
            uncache(p, b);
        }
    }
}
