/*
 * json.c - the library's JSON, through jansson: descriptions written into
 * caller buffers, record configurations written into fixed fields, and
 * flat objects of integers read back (internal.h). One library for every
 * JSON stof writes or reads.
 */
#include "internal.h"

#include <limits.h>
#include <string.h>

#include <jansson.h>

/* Compact, and times with nine significant digits (not seventeen). */
#define DUMP_FLAGS (JSON_COMPACT | JSON_REAL_PRECISION(9))

stof_status stof__json_out(json_t *v, char *buf, size_t n, size_t *needed)
{
    if (needed)
        *needed = 0;
    if (!buf && n > 0) { /* (n = 0 asks for the size) */
        json_decref(v);
        return STOF_ERR_INVALID_ARGUMENT;
    }
    char *text = v ? json_dumps(v, DUMP_FLAGS) : NULL;
    json_decref(v);
    if (!text)
        return STOF_ERR_OUT_OF_MEMORY;
    const size_t len = strlen(text);
    if (needed)
        *needed = len;
    stof_status st = STOF_OK;
    if (n > 0 && buf) {
        size_t k = len < n - 1 ? len : n - 1;
        memcpy(buf, text, k);
        buf[k] = '\0';
    }
    if (len >= n)
        st = STOF_ERR_BUFFER_TOO_SMALL;
    free(text);
    return st;
}

int stof__json_text(json_t *v, char *buf, size_t n)
{
    char *text = v ? json_dumps(v, DUMP_FLAGS) : NULL;
    json_decref(v);
    if (!text || strlen(text) >= n) {
        free(text);
        if (n)
            buf[0] = '\0';
        return 0;
    }
    memcpy(buf, text, strlen(text) + 1);
    free(text);
    return 1;
}

int stof__json_ints(const char *text, const char *const *keys, int n,
                    int *vals)
{
    json_error_t err;
    json_t *o = text ? json_loads(text, JSON_REJECT_DUPLICATES, &err) : NULL;
    int ok = json_is_object(o);
    for (int i = 0; ok && i < n; i++) {
        json_t *v = json_object_get(o, keys[i]);
        ok = json_is_integer(v) && json_integer_value(v) >= INT_MIN &&
             json_integer_value(v) <= INT_MAX;
        if (ok)
            vals[i] = (int)json_integer_value(v);
    }
    json_decref(o);
    return ok;
}

int stof__json_str(const char *text, const char *key, char *out, size_t n)
{
    json_t *o = text ? json_loads(text, 0, NULL) : NULL;
    json_t *v = json_object_get(o, key);
    const int ok = json_is_string(v) && strlen(json_string_value(v)) < n;
    if (ok)
        memcpy(out, json_string_value(v), strlen(json_string_value(v)) + 1);
    else if (n)
        out[0] = '\0';
    json_decref(o);
    return ok;
}
