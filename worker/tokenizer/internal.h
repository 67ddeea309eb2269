/* internal.h - the tokenizer's tables and the helpers its files share (load.c builds the
 * tables, encode.c and decode.c read them). Not installed; only worker/tokenizer includes it.
 *
 * Layout. Every token, BPE or added, is stored by the bytes it decodes to: a BPE token's
 * byte-level characters ("Ġthe") are mapped back to bytes (" the") once at load, so BPE runs on
 * raw bytes and decode is a table lookup. Merges are a hash of (left id, right id) -> (rank,
 * merged id): BPE never builds strings.
 */
#ifndef RW_TOK_INTERNAL_H
#define RW_TOK_INTERNAL_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "rw_tokenizer.h"

/* A growable byte buffer. */
typedef struct tok_buf {
    char *p;
    size_t n, cap;
} tok_buf;

/* token kinds (tok_kind[id]) */
enum { TK_NONE = 0, TK_BPE = 1, TK_ADDED = 2, TK_SPECIAL = 3 };

/* (left id, right id) -> (rank, merged id); open addressing, linear probing, power-of-two
 * capacity, load <= 1/2. key == 0 marks an empty slot, so keys are stored as pair + 1. */
typedef struct tok_merge_slot {
    uint64_t key;
    uint32_t rank;
    int32_t id;
} tok_merge_slot;

/* bytes -> id, for rw_tok_token_id and for building the merge table. */
typedef struct tok_str_slot {
    uint64_t hash;
    int32_t id; /* -1: empty */
} tok_str_slot;

typedef struct tok_added {
    int32_t id;
    uint32_t off, len; /* content bytes in t->pool (normalized content when normalized=true) */
    bool special, lstrip, rstrip, single_word, normalized;
} tok_added;

/* The per-piece BPE cache: NSHARD shards, each a small open-addressing table with its own lock.
 * A shard that fills up is emptied whole (no LRU bookkeeping on the hot path): pieces that repeat
 * come back within a few calls, and memory stays bounded for a long-running worker. */
#define TOK_CACHE_SHARDS 64
#define TOK_CACHE_SLOTS 4096    /* per shard, power of two */
#define TOK_CACHE_MAX_FILL 2048 /* entries per shard before it is emptied */
#define TOK_CACHE_MAX_PIECE 64  /* longer pieces are not cached (rarely repeat) */

typedef struct tok_cache_entry {
    uint64_t hash;
    uint16_t klen, nids;
    /* followed by klen bytes, padding to 4, nids int32 ids */
} tok_cache_entry;

typedef struct tok_cache_shard {
    pthread_mutex_t mu;
    tok_cache_entry **slots; /* TOK_CACHE_SLOTS, NULL = empty */
    int fill;
} tok_cache_shard;

struct rw_tok {
    /* tokens: ids 0 .. n_ids-1 */
    int32_t n_ids;
    uint8_t *kind;        /* [n_ids] TK_* */
    uint32_t *off;        /* [n_ids] decoded bytes in pool */
    uint32_t *len;        /* [n_ids] */
    tok_buf pool;         /* every token's bytes, back to back */
    int32_t byte_id[256]; /* id of each single byte (BPE's starting symbols) */

    tok_str_slot *vocab; /* BPE tokens by bytes */
    size_t vocab_cap;

    tok_merge_slot *merges;
    size_t merges_cap;
    bool ignore_merges; /* a piece that is itself a token is taken whole */

    tok_added *added;
    int n_added;
    uint8_t added_first[256]; /* bit 0: a raw-matched added token starts with this byte;
                                 bit 1: a normalized-matched one does */
    bool any_normalized_added;

    bool nfc;
    pcre2_code *re;  /* NULL: no Split (the whole section is one piece) */
    bool re_removed; /* behavior Removed: matches are dropped, gaps kept */
    bool jit;

    int32_t eos_id, pad_id, bos_id;
    bool has_chat_template;

    tok_cache_shard cache[TOK_CACHE_SHARDS];
};

/* --- hashing (xxh3 from core) ------------------------------------------------------------- */
static inline uint64_t tok_hash(const void *p, size_t n) {
    return rw_checksum64(p, n, 0x746f6bull);
}

/* id of a BPE token given by its bytes, -1 if none (load.c). */
int32_t tok_vocab_find(const rw_tok *t, const char *s, size_t n);

/* --- UTF-8 (utf8.c) --------------------------------------------------------------------- */

/* Length of the valid UTF-8 character at s[0..n), 0 if the bytes there are not one (invalid or
 * truncated). Valid means as RFC 3629: no overlongs, no surrogates, <= U+10FFFF. */
size_t tok_utf8_valid_len(const uint8_t *s, size_t n, uint32_t *cp);
/* Length of the maximal invalid subpart at s[0..n) (n > 0, s[0] does not start a valid
 * character): the longest prefix that is the start of some valid sequence, at least 1. */
size_t tok_utf8_maximal_subpart(const uint8_t *s, size_t n);
/* True when s[0..n) is valid UTF-8. */
bool tok_utf8_is_valid(const uint8_t *s, size_t n);

bool tok_buf_reserve(tok_buf *b, size_t extra);
bool tok_buf_put(tok_buf *b, const void *s, size_t n);
static inline bool tok_buf_putc(tok_buf *b, char c) {
    return tok_buf_put(b, &c, 1);
}
void tok_buf_free(tok_buf *b);

/* Appends s[0..n) to `b` with every maximal invalid subpart replaced by U+FFFD (EF BF BD). */
bool tok_utf8_lossy(tok_buf *b, const uint8_t *s, size_t n);
/* The same; when !final, a trailing valid-but-incomplete prefix (at most 3 bytes) is left out
 * and *used (if non-NULL) says how many bytes were consumed. */
bool tok_utf8_lossy_ex(tok_buf *b, const uint8_t *s, size_t n, bool final, size_t *used);

/* Unicode White_Space (what Rust's char::is_whitespace and `tokenizers`' \s mean). */
bool tok_is_white_space(uint32_t cp);
/* A "word" character for single_word added tokens (\w of Rust's regex: letters, marks, decimal
 * digits, connector punctuation, and the joiners). */
bool tok_is_word_char(uint32_t cp);
/* Code point of the last / first character of valid UTF-8 s[0..n); 0 when n == 0. */
uint32_t tok_utf8_last_cp(const uint8_t *s, size_t n, size_t *clen);
uint32_t tok_utf8_first_cp(const uint8_t *s, size_t n, size_t *clen);

/* --- NFC (nfc.c) ------------------------------------------------------------------------ */
/* Appends NFC(s[0..n)) to `b` (s valid UTF-8). Only the stretches that can change are passed to
 * utf8proc; ASCII, CJK ideographs, kana and Hangul syllables are copied. */
rw_status tok_nfc_append(tok_buf *b, const char *s, size_t n, rw_err *err);

/* --- cache (encode.c) -------------------------------------------------------------------- */
void tok_cache_init(rw_tok *t);
void tok_cache_free(rw_tok *t);

#endif
