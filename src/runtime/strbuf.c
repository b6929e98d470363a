/*
 * strbuf.c - a growable string for JSON and text that leaves stof through
 * caller buffers (size-then-fetch).
 */
#include "internal.h"
#include "cfmt.h"

#include <locale.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void stof__str_printf(stof_str *s, const char *fmt, ...)
{
    if (s->oom)
        return;
    for (;;) {
        size_t room = s->cap - s->len;
        va_list ap;
        va_start(ap, fmt);
        int n = vsnprintf(s->p ? s->p + s->len : NULL, s->p ? room : 0, fmt, ap);
        va_end(ap);
        if (n < 0) {
            s->oom = 1;
            return;
        }
        if (s->p && (size_t)n < room) {
            s->len += (size_t)n;
            return;
        }
        size_t cap = s->cap ? s->cap : 256;
        while (cap < s->len + (size_t)n + 1)
            cap *= 2;
        char *p = realloc(s->p, cap);
        if (!p) {
            s->oom = 1;
            return;
        }
        s->p = p;
        s->cap = cap;
    }
}

void stof__str_free(stof_str *s)
{
    free(s->p);
    memset(s, 0, sizeof(*s));
}

stof_status stof__str_out(const stof_str *s, char *buf, size_t n,
                          size_t *needed)
{
    if (s->oom)
        return STOF_ERR_OUT_OF_MEMORY;
    if (needed)
        *needed = s->len;
    if (buf && n > 0) {
        size_t c = s->len < n - 1 ? s->len : n - 1;
        if (c)
            memcpy(buf, s->p, c);
        buf[c] = '\0';
    }
    return (buf && n > s->len) ? STOF_OK : STOF_ERR_BUFFER_TOO_SMALL;
}

int stof__why(char *why, size_t n, const char *fmt, ...)
{
    if (why && n) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(why, n, fmt, ap);
        va_end(ap);
    }
    return 0;
}

/* The C locale, made once (NULL where it cannot be: the process's own
 * locale then applies, which is C unless the host program changed it). */
static locale_t c_locale;
static pthread_once_t c_locale_once = PTHREAD_ONCE_INIT;

static void make_c_locale(void)
{
    c_locale = newlocale(LC_ALL_MASK, "C", (locale_t)0);
}

int stof__c_vsnprintf(char *buf, size_t n, const char *fmt, va_list ap)
{
    pthread_once(&c_locale_once, make_c_locale);
    locale_t old = c_locale ? uselocale(c_locale) : (locale_t)0;
    int r = vsnprintf(buf, n, fmt, ap);
    if (old)
        uselocale(old);
    return r;
}

int stof__c_snprintf(char *buf, size_t n, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int r = stof__c_vsnprintf(buf, n, fmt, ap);
    va_end(ap);
    return r;
}
