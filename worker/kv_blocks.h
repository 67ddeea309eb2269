/* kv_blocks.h - the engine's paged KV block manager (kv_blocks.c): which of the nblocks blocks of
 * the backend's KV cache are free, reference counts for blocks that several requests' block
 * tables hold (the n samples of one prompt, a prefix reused from the cache), and the prefix cache
 * itself. Internal to the worker (engine_*.c); the scheduler only asks and gives back.
 *
 * Prefix cache. A full block (bs computed positions) can be registered under the hash chain of
 * its tokens: key(i) = xxh3(tokens of block i, seed = key(i - 1), or a seed made of the weight
 * version for block 0). A lookup walks the chain of a token sequence from block 0 and stops at the
 * first block that is not cached. Hashes only find candidates: a candidate matches when its
 * version, its tokens, its parent block (the match of block i - 1) and the parent's generation
 * (bumped whenever a block leaves the cache) are equal too, so a collision can never hand out the
 * wrong KV, and a child whose parent was evicted and reused is never reached.
 *
 * Blocks are in exactly one of three states:
 *   free    (on the free stack, ref 0, not cached),
 *   held    (ref >= 1: in some request's table; cached or not),
 *   idle    (ref 0, cached: on the LRU list, reusable by a lookup, evicted when memory is needed).
 * Eviction takes the least recently released idle block; a held block is never evicted. A block
 * is never written once it is full, so a cached block's bytes never change while it is cached.
 *
 * Versions: every cached block carries the weight version whose weights computed it, and a
 * lookup matches only blocks of the version asked for; rw_kv_blocks_uncache_all drops the cache
 * (idle blocks become free, held ones stay with their requests but leave the cache).
 *
 * Routes: a cached block can carry the router's top-k (ids uint16, weights fp32, [bs, route_row])
 * of its tokens, recorded by the request that computed it, so that a later request asking for
 * routed experts gets them for a reused prefix too; a lookup that needs routes stops at the first
 * block without them. */
#ifndef RW_WORKER_KV_BLOCKS_H
#define RW_WORKER_KV_BLOCKS_H

#include "rw_core.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct rw_kv_blocks {
    int64_t nblocks;
    int block_size;
    int route_row; /* layers * top_k: elements of one token's routes */
    int32_t *free; /* stack of free block ids [nfree] */
    int64_t nfree;
    int32_t *ref; /* [nblocks] requests holding the block */
    /* prefix cache, per block [nblocks] */
    uint8_t *cached;
    uint64_t *key, *version;
    int32_t *parent;      /* block of the previous chain position (-1: block 0 of a chain) */
    uint32_t *gen, *pgen; /* generation of the block; of the parent when registered */
    int32_t *hnext;       /* next cached block in the same hash bucket */
    int32_t *lru_prev, *lru_next;
    int32_t *tok;               /* [nblocks, bs] tokens of cached blocks */
    uint16_t **rids;            /* [nblocks] -> [bs, route_row] or NULL */
    float **rwts;               /* [nblocks] -> [bs, route_row] or NULL */
    int32_t *bucket;            /* [nbucket] first cached block of each hash bucket (-1) */
    uint64_t nbucket;           /* power of two */
    int32_t lru_head, lru_tail; /* idle blocks, least recently released first */
    int64_t nidle, ncached;
    int64_t allocated, evicted; /* cumulative: blocks handed out for new KV; idle blocks evicted */
} rw_kv_blocks;

/* route_row: elements of one token's recorded routes (layers * top_k). */
rw_status rw_kv_blocks_init(rw_kv_blocks *p, int64_t nblocks, int block_size, int route_row,
                            rw_err *err);
void rw_kv_blocks_fini(rw_kv_blocks *p);
/* Every block free, the cache empty (a new or re-created cache). */
void rw_kv_blocks_reset(rw_kv_blocks *p);
/* Blocks that cover positions [0, upto). */
int rw_kv_blocks_for(const rw_kv_blocks *p, int upto);
/* Blocks a new allocation can get: free ones plus idle cached ones (evicted on demand). */
int64_t rw_kv_blocks_avail(const rw_kv_blocks *p);
/* Blocks in some request's table. */
int64_t rw_kv_blocks_held(const rw_kv_blocks *p);
/* Grows the block table (*blocks [*cap], *n in use) to cover positions [0, upto) with new blocks
 * (ref 1): free ones first, then evicted idle ones. false, with nothing taken, when too few are
 * available or the table cannot grow. */
bool rw_kv_blocks_take(rw_kv_blocks *p, int32_t **blocks, int *n, int *cap, int upto);
/* Drops one reference to each of the n blocks of a table, last to first: a block nobody holds
 * becomes idle when cached (the table's last block the least recently used, so a chain is evicted
 * from its end), free otherwise (blocks[0] is the next one taken). */
void rw_kv_blocks_give(rw_kv_blocks *p, const int32_t *blocks, int n);
/* One more reference to block b (an idle block leaves the LRU list). */
void rw_kv_blocks_hold(rw_kv_blocks *p, int32_t b);

/* The chain key of a block of tokens[0..bs) after the block whose key is prev_key (block 0 of a
 * chain: first = true, prev_key ignored), under weight `version`. */
uint64_t rw_kv_blocks_key(const rw_kv_blocks *p, bool first, uint64_t prev_key, uint64_t version,
                          const int32_t *tokens);
/* The longest cached prefix of tokens[0 .. nb * bs) under `version`: out[0..m) get its blocks,
 * *last_key the key of block m - 1; returns m (0..nb). With need_routes (and need_weights) only
 * blocks carrying routes (with weights) match. Takes no reference. */
int rw_kv_blocks_lookup(const rw_kv_blocks *p, uint64_t version, const int32_t *tokens, int nb,
                        bool need_routes, bool need_weights, int32_t *out, uint64_t *last_key);
/* Registers held block b as chain position i of `tokens` (tokens[0..bs) of that block) after
 * block `parent` (-1 for position 0; must be cached), whose key is prev_key. When an equal block
 * is cached already, that one is returned instead (b is not registered) and the caller may take
 * it in place of b (bit-identical KV); otherwise b is. rids / rwts (may be NULL): the block's
 * routes [bs, route_row], copied (attached to an existing equal block that has none). *key gets
 * the block's key. Returns -1 when out of memory (nothing registered). */
int32_t rw_kv_blocks_register(rw_kv_blocks *p, int32_t b, int32_t parent, uint64_t prev_key,
                              uint64_t version, const int32_t *tokens, const uint16_t *rids,
                              const float *rwts, uint64_t *key);
/* Empties the cache: idle blocks become free, held ones stay held but leave the cache. */
void rw_kv_blocks_uncache_all(rw_kv_blocks *p);

#ifdef __cplusplus
}
#endif

#endif
