/* nfc.c - Unicode normalization form C for the tokenizer's NFC normalizer (Qwen3's
 * tokenizer.json says {"type": "NFC"}), and the Unicode character classes the added-token flags
 * need. utf8proc (Debian's libutf8proc) does the normalizing; PCRE2 does not normalize.
 *
 * Speed: most text is NFC already, and utf8proc allocates per call. So the text is cut into
 * pieces at "inert" characters and only pieces holding something else go through utf8proc.
 * The cut is exact: an inert character is a starter (combining class 0) with no canonical
 * decomposition that is never the second half of a canonical composition, so nothing after it
 * can compose with or reorder across anything before it, and NFC(a + b) = NFC(a) + NFC(b) when b
 * starts with one. A piece is [inert char][non-inert chars...]: the inert char it starts with is
 * included because a following combining mark may compose with it (e + U+0301 -> é).
 */
#include <stdlib.h>
#include <string.h>

#include <utf8proc.h>

#include "internal.h"

/* Inert for NFC (see above), conservatively, by blocks whose every character is a stable
 * boundary (NFC_Quick_Check=Yes, combining class 0): ASCII and Latin up to U+02FF (combining marks
 * start at U+0300), Cyrillic without its combining marks (U+0483..U+0489), general punctuation
 * from U+2002 (U+2000 and U+2001 decompose to U+2002 / U+2003), CJK symbols without the tone
 * marks U+302A..U+302F, kana without the voicing marks U+3099 / U+309A, compatibility jamo, CJK
 * ideographs, Hangul syllables, half- and fullwidth forms, U+FFFD and the emoji blocks. A
 * character that can compose with what follows it (e, か, an LV syllable) is still inert: the
 * mark that follows is not, and lands in the piece the inert character starts. */
static inline bool nfc_inert(uint32_t c) {
    if (c < 0x300) return true;
    if (c < 0x2000) return (c >= 0x400 && c <= 0x482) || (c >= 0x48a && c <= 0x52f);
    if (c < 0x3000) return c >= 0x2002 && c <= 0x206f;
    if (c < 0x3400)
        return c <= 0x3029 || (c >= 0x3030 && c <= 0x303f) || (c >= 0x3041 && c <= 0x3096) ||
               (c >= 0x30a1 && c <= 0x30fa) || (c >= 0x3131 && c <= 0x318e);
    return c <= 0x4dbf || (c >= 0x4e00 && c <= 0x9fff) || (c >= 0xac00 && c <= 0xd7a3) ||
           (c >= 0xff01 && c <= 0xffdc) || c == 0xfffd || (c >= 0x1f300 && c <= 0x1faff);
}

static rw_status nfc_piece(tok_buf *b, const char *s, size_t n, rw_err *err) {
    utf8proc_uint8_t *dst = NULL;
    utf8proc_ssize_t r = utf8proc_map((const utf8proc_uint8_t *)s, (utf8proc_ssize_t)n, &dst,
                                      UTF8PROC_STABLE | UTF8PROC_COMPOSE);
    if (r < 0) {
        free(dst);
        if (r == UTF8PROC_ERROR_NOMEM) RW_FAIL(err, RW_E_OOM, "NFC: out of memory");
        RW_FAIL(err, RW_E_INTERNAL, "NFC of %zu bytes failed: %s", n, utf8proc_errmsg(r));
    }
    bool ok = tok_buf_put(b, dst, (size_t)r);
    free(dst);
    if (!ok) RW_FAIL(err, RW_E_OOM, "NFC: out of memory");
    return RW_OK;
}

rw_status tok_nfc_append(tok_buf *b, const char *s, size_t n, rw_err *err) {
    const uint8_t *u = (const uint8_t *)s;
    size_t piece = 0;   /* start of the current piece */
    size_t copied = 0;  /* s[copied..piece) is inert text still to copy */
    bool dirty = false; /* the current piece holds a non-inert character */
    size_t i = 0;
    while (i < n) {
        if (u[i] < 0x80) { /* ASCII: inert */
            if (dirty) {
                if (!tok_buf_put(b, s + copied, piece - copied)) goto oom;
                RW_CHECK(nfc_piece(b, s + piece, i - piece, err));
                copied = i;
                dirty = false;
            }
            piece = i++;
            continue;
        }
        uint32_t cp = 0;
        size_t l = tok_utf8_valid_len(u + i, n - i, &cp);
        if (l == 0) RW_FAIL(err, RW_E_INTERNAL, "NFC: invalid UTF-8 at byte %zu", i);
        if (nfc_inert(cp)) {
            if (dirty) {
                if (!tok_buf_put(b, s + copied, piece - copied)) goto oom;
                RW_CHECK(nfc_piece(b, s + piece, i - piece, err));
                copied = i;
                dirty = false;
            }
            piece = i;
        } else {
            dirty = true;
        }
        i += l;
    }
    if (dirty) {
        if (!tok_buf_put(b, s + copied, piece - copied)) goto oom;
        RW_CHECK(nfc_piece(b, s + piece, n - piece, err));
    } else if (!tok_buf_put(b, s + copied, n - copied)) {
        goto oom;
    }
    return RW_OK;
oom:
    RW_FAIL(err, RW_E_OOM, "NFC: out of memory");
}

bool tok_is_word_char(uint32_t c) {
    if (c < 0x80)
        return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
               c == '_';
    if (c == 0x200c || c == 0x200d) return true;
    switch (utf8proc_category((utf8proc_int32_t)c)) {
    case UTF8PROC_CATEGORY_LU:
    case UTF8PROC_CATEGORY_LL:
    case UTF8PROC_CATEGORY_LT:
    case UTF8PROC_CATEGORY_LM:
    case UTF8PROC_CATEGORY_LO:
    case UTF8PROC_CATEGORY_MN:
    case UTF8PROC_CATEGORY_MC:
    case UTF8PROC_CATEGORY_ME:
    case UTF8PROC_CATEGORY_ND:
    case UTF8PROC_CATEGORY_NL:
    case UTF8PROC_CATEGORY_PC: return true;
    default: return false;
    }
}
