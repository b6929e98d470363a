/*
 * tune_text.c - escaping for terminals and JSON (tune_text.h).
 */
#include "tune_text.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Strings handed out since the last tt_release. */
static char **pool;
static size_t pool_n, pool_cap;

static const char *keep(char *s, const char *fallback)
{
    if (!s)
        return fallback;
    if (pool_n == pool_cap) {
        size_t cap = pool_cap ? 2 * pool_cap : 64;
        char **p = realloc(pool, cap * sizeof(*p));
        if (!p) {
            free(s);
            return fallback;
        }
        pool = p;
        pool_cap = cap;
    }
    pool[pool_n++] = s;
    return s;
}

void tt_release(void)
{
    for (size_t i = 0; i < pool_n; i++)
        free(pool[i]);
    pool_n = 0;
}

/* The code point of the UTF-8 sequence at s (n bytes left), its length in
 * *len; -1 (with *len 1) for an invalid or overlong sequence or a
 * surrogate. */
static long utf8_next(const unsigned char *s, size_t n, int *len)
{
    *len = 1;
    unsigned c = s[0];
    if (c < 0x80)
        return (long)c;
    int k = c >= 0xf0 && c <= 0xf4 ? 4 : c >= 0xe0 ? 3 : c >= 0xc2 ? 2 : 0;
    if (c >= 0xf8 || !k || (size_t)k > n)
        return -1;
    long cp = c & (0x7f >> k);
    for (int i = 1; i < k; i++) {
        if ((s[i] & 0xc0) != 0x80)
            return -1;
        cp = cp << 6 | (s[i] & 0x3f);
    }
    static const long min[5] = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < min[k] || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff))
        return -1;
    *len = k;
    return cp;
}

/* Code points that must not reach a terminal as they are: C0 and C1
 * controls, DEL, line and paragraph separators, bidi controls. */
static int is_control(long cp)
{
    return cp < 0x20 || (cp >= 0x7f && cp <= 0x9f) || cp == 0x2028 ||
           cp == 0x2029 || (cp >= 0x202a && cp <= 0x202e) ||
           (cp >= 0x2066 && cp <= 0x2069) || cp == 0x200e || cp == 0x200f ||
           cp == 0x061c;
}

const char *tt_json(const char *s)
{
    if (!s)
        s = "";
    size_t n = strlen(s);
    char *out = malloc(6 * n + 3);
    if (!out)
        return keep(NULL, "\"\"");
    char *o = out;
    *o++ = '"';
    const unsigned char *p = (const unsigned char *)s;
    while (*p) {
        int len;
        long cp = utf8_next(p, n - (size_t)(p - (const unsigned char *)s),
                            &len);
        if (cp < 0) {
            o += sprintf(o, "\\ufffd");
        } else if (cp == '"' || cp == '\\') {
            *o++ = '\\';
            *o++ = (char)cp;
        } else if (cp < 0x20 || cp == 0x7f || cp == 0x2028 || cp == 0x2029) {
            o += sprintf(o, "\\u%04lx", cp);
        } else {
            memcpy(o, p, (size_t)len);
            o += len;
        }
        p += len;
    }
    *o++ = '"';
    *o = '\0';
    return keep(out, "\"\"");
}

const char *tt_term(const char *s)
{
    if (!s)
        s = "";
    size_t n = strlen(s);
    char *out = malloc(10 * n + 1);
    if (!out)
        return keep(NULL, "?");
    char *o = out;
    const unsigned char *p = (const unsigned char *)s;
    while (*p) {
        int len;
        long cp = utf8_next(p, n - (size_t)(p - (const unsigned char *)s),
                            &len);
        if (cp < 0)
            o += sprintf(o, "\\x%02x", p[0]);
        else if (is_control(cp))
            o += cp < 0x100 ? sprintf(o, "\\x%02lx", cp)
                            : sprintf(o, "\\u%04lx", cp);
        else {
            memcpy(o, p, (size_t)len);
            o += len;
        }
        p += len;
    }
    *o = '\0';
    return keep(out, "?");
}
