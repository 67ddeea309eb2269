/* text.c - text the worker shows that may hold bytes a client sent (a command name, a key, a
 * tensor name): escaped to plain ASCII for messages and log lines, or repaired to valid UTF-8 for
 * the msgpack strings of replies (a strict client refuses a str that is not UTF-8). */
#include "rw_core.h"

const char *rw_escape(const char *s, size_t n, char *buf, size_t cap) {
    static const char hex[] = "0123456789abcdef";
    if (!cap) return buf;
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        const unsigned char ch = (unsigned char)s[i];
        char e[4];
        size_t m;
        if (ch == '"' || ch == '\\') {
            e[0] = '\\';
            e[1] = (char)ch;
            m = 2;
        } else if (ch >= 0x20 && ch < 0x7f) {
            e[0] = (char)ch;
            m = 1;
        } else {
            e[0] = '\\';
            e[1] = 'x';
            e[2] = hex[ch >> 4];
            e[3] = hex[ch & 15];
            m = 4;
        }
        if (k + m + 4 > cap) { /* room for "...", NUL */
            if (k + 4 <= cap) {
                memcpy(buf + k, "...", 3);
                k += 3;
            }
            break;
        }
        memcpy(buf + k, e, m);
        k += m;
    }
    buf[k] = 0;
    return buf;
}

/* Length of the valid UTF-8 sequence at s[0..n) (RFC 3629: shortest form, no surrogates, at most
 * U+10FFFF), 0 when it is not one. */
static size_t utf8_seq(const unsigned char *s, size_t n) {
    if (s[0] < 0x80) return 1;
    size_t len;
    uint32_t cp;
    if ((s[0] & 0xe0) == 0xc0) {
        len = 2;
        cp = s[0] & 0x1f;
    } else if ((s[0] & 0xf0) == 0xe0) {
        len = 3;
        cp = s[0] & 0x0f;
    } else if ((s[0] & 0xf8) == 0xf0) {
        len = 4;
        cp = s[0] & 0x07;
    } else {
        return 0;
    }
    if (len > n) return 0;
    for (size_t i = 1; i < len; i++) {
        if ((s[i] & 0xc0) != 0x80) return 0;
        cp = (cp << 6) | (s[i] & 0x3f);
    }
    static const uint32_t min[5] = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < min[len] || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return 0;
    return len;
}

bool rw_utf8_valid(const char *s, size_t n) {
    const unsigned char *p = (const unsigned char *)s;
    for (size_t i = 0; i < n;) {
        const size_t m = utf8_seq(p + i, n - i);
        if (!m) return false;
        i += m;
    }
    return true;
}

size_t rw_utf8_repair(const char *s, size_t n, char *buf, size_t cap) {
    static const char fffd[] = "\xef\xbf\xbd";
    const unsigned char *p = (const unsigned char *)s;
    size_t k = 0;
    if (!cap) return 0;
    for (size_t i = 0; i < n;) {
        size_t m = utf8_seq(p + i, n - i);
        const char *src = s + i;
        size_t out = m;
        if (!m) { /* one invalid byte becomes one replacement character */
            src = fffd;
            out = 3;
            m = 1;
        }
        if (k + out + 1 > cap) break;
        memcpy(buf + k, src, out);
        k += out;
        i += m;
    }
    buf[k] = 0;
    return k;
}
