/* kv_blocks.c - the engine's paged KV block allocator (internal.h: rw_kv_blocks): which of the
 * nblocks blocks of the backend's KV cache are free, and the block tables that requests grow from
 * them. The free list is a stack: after a reset blocks are handed out from 0 upwards, and the
 * blocks given back last are taken first. Each block has one owner, the request whose table holds
 * it; blocks shared between requests (reference counts) or kept for later requests (a prefix
 * cache) would be counted here, so that the scheduler (engine.c) only asks and gives back. */
#include <stdlib.h>

#include "internal.h"

rw_status rw_kv_blocks_init(rw_kv_blocks *p, int64_t nblocks, int block_size, rw_err *err) {
    memset(p, 0, sizeof *p);
    p->free = malloc(sizeof(int32_t) * (size_t)nblocks);
    if (!p->free) RW_FAIL(err, RW_E_OOM, "engine: free list of %lld blocks", (long long)nblocks);
    p->nblocks = nblocks;
    p->block_size = block_size;
    return RW_OK;
}

void rw_kv_blocks_fini(rw_kv_blocks *p) {
    free(p->free);
    memset(p, 0, sizeof *p);
}

void rw_kv_blocks_reset(rw_kv_blocks *p) {
    p->nfree = 0;
    /* pushed in descending order so blocks are handed out from 0 upwards */
    for (int64_t b = p->nblocks - 1; b >= 0; b--)
        p->free[p->nfree++] = (int32_t)b;
}

int rw_kv_blocks_for(const rw_kv_blocks *p, int upto) {
    return (upto + p->block_size - 1) / p->block_size;
}

bool rw_kv_blocks_take(rw_kv_blocks *p, int32_t **blocks, int *n, int *cap, int upto) {
    const int need = rw_kv_blocks_for(p, upto);
    if (need <= *n) return true;
    if (need - *n > p->nfree) return false;
    if (need > *cap) {
        int nc = *cap ? *cap : 4;
        while (nc < need)
            nc *= 2;
        int32_t *nb = realloc(*blocks, sizeof(int32_t) * (size_t)nc);
        if (!nb) return false;
        *blocks = nb;
        *cap = nc;
    }
    while (*n < need)
        (*blocks)[(*n)++] = p->free[--p->nfree];
    return true;
}

void rw_kv_blocks_give(rw_kv_blocks *p, const int32_t *blocks, int n) {
    for (int i = n - 1; i >= 0; i--)
        p->free[p->nfree++] = blocks[i];
}
