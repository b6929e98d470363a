/*
 * tune_text.c - escaping for terminals, and the JSON values and documents
 * of stof-tune through jansson (tune_text.h).
 */
#include "tune_text.h"

#include <ctype.h>
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Strings handed out by tt_term since the last tt_release. */
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
    /* Lead bytes 0xf5 to 0xff start no sequence (they would encode past
     * U+10FFFF), 0x80 to 0xc1 neither (continuations, overlong). */
    int k = c >= 0xf5   ? 0
            : c >= 0xf0 ? 4
            : c >= 0xe0 ? 3
            : c >= 0xc2 ? 2
                        : 0;
    if (!k || (size_t)k > n)
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

json_t *tt_jstr(const char *s)
{
    if (!s)
        s = "";
    size_t n = strlen(s);
    /* Each invalid byte becomes the three bytes of U+FFFD. */
    char *clean = malloc(3 * n + 1);
    if (!clean)
        return NULL;
    size_t k = 0;
    const unsigned char *p = (const unsigned char *)s;
    for (size_t i = 0; i < n;) {
        int len;
        if (utf8_next(p + i, n - i, &len) < 0) {
            memcpy(clean + k, "\xef\xbf\xbd", 3);
            k += 3;
        } else {
            memcpy(clean + k, s + i, (size_t)len);
            k += (size_t)len;
        }
        i += (size_t)len;
    }
    /* jansson checks the UTF-8 again; it agrees with utf8_next, so NULL
     * here means out of memory. */
    json_t *v = json_stringn(clean, k);
    free(clean);
    return v;
}

json_t *tt_jnum(double v, int digits)
{
    if (!isfinite(v))
        return json_null();
    /* Rounded through its decimal text, so that the document shows the
     * digits asked for and not the binary noise after them. */
    char buf[64];
    snprintf(buf, sizeof(buf), "%.*g", digits, v);
    return json_real(strtod(buf, NULL));
}

int tt_json_write(FILE *f, json_t *doc)
{
    /* DBL_DIG digits print every value rounded by tt_jnum exactly as it
     * was rounded (no trailing noise such as 0.30000000000000004). */
    char *text = doc ? json_dumps(doc, JSON_COMPACT | JSON_ENSURE_ASCII |
                                           JSON_REAL_PRECISION(DBL_DIG))
                     : NULL;
    json_decref(doc);
    if (!text)
        return -1;
    /* jansson writes \u escapes with uppercase hex digits and DEL as it
     * is. stof-tune has always written lowercase (scripts and tests look
     * for "\ufffd"), and a raw DEL should not reach a terminal, so both
     * are rewritten here. Outside strings a JSON text holds neither a
     * backslash nor DEL, so this touches string contents only. */
    for (const char *p = text; *p; p++) {
        if (*p == '\\' && p[1]) {
            fputc('\\', f);
            fputc(*++p, f);
            if (*p == 'u')
                for (int i = 0; i < 4 && p[1]; i++)
                    fputc(tolower((unsigned char)*++p), f);
        } else if (*p == 0x7f) {
            fputs("\\u007f", f);
        } else {
            fputc(*p, f);
        }
    }
    fputc('\n', f);
    free(text);
    return 0;
}
