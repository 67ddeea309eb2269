/* utf8.c - UTF-8 validation and repair for the tokenizer: the one place that decides what is a
 * valid character and what one U+FFFD replaces.
 *
 * Replacement follows Unicode's "substitution of maximal subparts" (chapter 3, U+FFFD
 * substitution), which is what the WHATWG decoder (transformers.js, node), Rust's
 * String::from_utf8_lossy (`tokenizers`) and Python's errors="replace" do: a maximal subpart is
 * the longest prefix of a valid sequence; each one, and each byte that starts none, becomes one
 * U+FFFD. "E0 80" is two U+FFFD (80 cannot follow E0), "E2 82" at the end is one.
 */
#include <stdlib.h>
#include <string.h>

#include "internal.h"

/* Second-byte range of a lead byte (Unicode table 3-7); the other continuation bytes are
 * always 80..BF. need = total length, 0 for a byte that leads nothing. */
static inline void lead_info(uint8_t b, int *need, uint8_t *lo, uint8_t *hi) {
    *lo = 0x80;
    *hi = 0xbf;
    if (b < 0x80)
        *need = 1;
    else if (b < 0xc2)
        *need = 0;
    else if (b < 0xe0)
        *need = 2;
    else if (b < 0xf0) {
        *need = 3;
        if (b == 0xe0) *lo = 0xa0;
        if (b == 0xed) *hi = 0x9f; /* no surrogates */
    } else if (b < 0xf5) {
        *need = 4;
        if (b == 0xf0) *lo = 0x90;
        if (b == 0xf4) *hi = 0x8f; /* <= U+10FFFF */
    } else
        *need = 0;
}

/* One step over s[0..n), n > 0: 1 = a valid character of *len bytes (*cp set); 2 = an invalid
 * maximal subpart of *len bytes; 3 = all n bytes are a valid but incomplete prefix. */
static int utf8_step(const uint8_t *s, size_t n, size_t *len, uint32_t *cp) {
    int need;
    uint8_t lo, hi;
    lead_info(s[0], &need, &lo, &hi);
    if (need == 1) {
        *len = 1;
        *cp = s[0];
        return 1;
    }
    if (need == 0) {
        *len = 1;
        return 2;
    }
    size_t i = 1;
    for (; i < (size_t)need; i++) {
        if (i == n) {
            *len = n;
            return 3;
        }
        uint8_t l = i == 1 ? lo : 0x80, h = i == 1 ? hi : 0xbf;
        if (s[i] < l || s[i] > h) {
            *len = i;
            return 2;
        }
    }
    uint32_t c = s[0] & (need == 2 ? 0x1f : need == 3 ? 0x0f : 0x07);
    for (i = 1; i < (size_t)need; i++)
        c = (c << 6) | (s[i] & 0x3f);
    *cp = c;
    *len = (size_t)need;
    return 1;
}

size_t tok_utf8_valid_len(const uint8_t *s, size_t n, uint32_t *cp) {
    size_t len;
    uint32_t c = 0;
    if (n == 0 || utf8_step(s, n, &len, &c) != 1) return 0;
    if (cp) *cp = c;
    return len;
}

size_t tok_utf8_maximal_subpart(const uint8_t *s, size_t n) {
    size_t len;
    uint32_t c;
    int k = utf8_step(s, n, &len, &c);
    return k == 1 ? 0 : len;
}

bool tok_utf8_is_valid(const uint8_t *s, size_t n) {
    size_t i = 0;
    while (i < n) {
        /* ASCII runs dominate real text: skip 8 bytes at a time */
        while (i + 8 <= n) {
            uint64_t w;
            memcpy(&w, s + i, 8);
            if (w & 0x8080808080808080ull) break;
            i += 8;
        }
        if (i == n) break;
        if (s[i] < 0x80) {
            i++;
            continue;
        }
        size_t len;
        uint32_t c;
        if (utf8_step(s + i, n - i, &len, &c) != 1) return false;
        i += len;
    }
    return true;
}

bool tok_buf_reserve(tok_buf *b, size_t extra) {
    if (b->n + extra + 1 <= b->cap) return true;
    size_t cap = b->cap ? b->cap : 64;
    while (cap < b->n + extra + 1)
        cap *= 2;
    char *p = realloc(b->p, cap);
    if (!p) return false;
    b->p = p;
    b->cap = cap;
    return true;
}

bool tok_buf_put(tok_buf *b, const void *s, size_t n) {
    if (!tok_buf_reserve(b, n)) return false;
    if (n) memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0; /* always NUL-terminated for callers that hand the buffer out */
    return true;
}

void tok_buf_free(tok_buf *b) {
    free(b->p);
    memset(b, 0, sizeof *b);
}

bool tok_utf8_lossy(tok_buf *b, const uint8_t *s, size_t n) {
    return tok_utf8_lossy_ex(b, s, n, true, NULL);
}

bool tok_utf8_lossy_ex(tok_buf *b, const uint8_t *s, size_t n, bool final, size_t *used) {
    if (used) *used = 0;
    if (n == 0) return tok_buf_reserve(b, 0);
    /* worst case every byte becomes 3 bytes of U+FFFD */
    if (!tok_buf_reserve(b, n * 3)) return false;
    size_t i = 0, run = 0; /* s[run..i) is valid and not yet copied */
    while (i < n) {
        if (s[i] < 0x80) {
            i++;
            continue;
        }
        size_t len;
        uint32_t c;
        int k = utf8_step(s + i, n - i, &len, &c);
        if (k == 1) {
            i += len;
            continue;
        }
        if (k == 3 && !final) { /* the rest may still become a character: hold it */
            n = i;
            break;
        }
        memcpy(b->p + b->n, s + run, i - run);
        b->n += i - run;
        memcpy(b->p + b->n, "\xef\xbf\xbd", 3);
        b->n += 3;
        i += len;
        run = i;
    }
    memcpy(b->p + b->n, s + run, n - run);
    b->n += n - run;
    b->p[b->n] = 0;
    if (used) *used = n;
    return true;
}

bool tok_is_white_space(uint32_t c) {
    if (c < 0x80) return c == ' ' || (c >= 0x09 && c <= 0x0d);
    return c == 0x85 || c == 0xa0 || c == 0x1680 || (c >= 0x2000 && c <= 0x200a) || c == 0x2028 ||
           c == 0x2029 || c == 0x202f || c == 0x205f || c == 0x3000;
}

uint32_t tok_utf8_last_cp(const uint8_t *s, size_t n, size_t *clen) {
    if (n == 0) {
        if (clen) *clen = 0;
        return 0;
    }
    size_t i = n - 1;
    while (i > 0 && n - i < 4 && (s[i] & 0xc0) == 0x80)
        i--;
    uint32_t cp = 0;
    size_t l = tok_utf8_valid_len(s + i, n - i, &cp);
    if (clen) *clen = l ? l : 1;
    return l ? cp : s[n - 1];
}

uint32_t tok_utf8_first_cp(const uint8_t *s, size_t n, size_t *clen) {
    uint32_t cp = 0;
    size_t l = n ? tok_utf8_valid_len(s, n, &cp) : 0;
    if (clen) *clen = l;
    return cp;
}
