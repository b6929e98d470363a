/*
 * templates.c - lookup of the kernel templates embedded at build time
 * (templates_gen.c) and the hash of their content that is part of every
 * cache key.
 */
#include "internal.h"

#include <pthread.h>
#include <string.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

const stof_template *stof__template_find(const char *name)
{
    if (!name)
        return NULL;
    for (int i = 0; i < stof__n_templates; i++)
        if (strcmp(stof__templates[i].name, name) == 0)
            return &stof__templates[i];
    return NULL;
}

static uint64_t g_hash;
static pthread_once_t g_hash_once = PTHREAD_ONCE_INIT;

/* Hash every template in the order they are embedded: its name with the
 * terminating NUL, its size as 8 little-endian bytes, then its content.
 * The framing keeps "ab"+"c" and "a"+"bc" apart, so renaming a template or
 * moving text between templates changes the hash. */
static void hash_templates(void)
{
    XXH3_state_t st;
    XXH3_64bits_reset(&st);
    for (int i = 0; i < stof__n_templates; i++) {
        const stof_template *t = &stof__templates[i];
        uint8_t size[8];
        for (int b = 0; b < 8; b++)
            size[b] = (uint8_t)((uint64_t)t->size >> (8 * b));
        XXH3_64bits_update(&st, t->name, strlen(t->name) + 1);
        XXH3_64bits_update(&st, size, sizeof(size));
        XXH3_64bits_update(&st, t->source, t->size);
    }
    g_hash = XXH3_64bits_digest(&st);
}

uint64_t stof_template_hash(void)
{
    pthread_once(&g_hash_once, hash_templates);
    return g_hash;
}
