/* format_cache.c - block formats kept by the context and shared by the
 * plans that need the same one.
 *
 * A mask's block format depends only on its bits and the tile: planning the
 * same layer or attention again (a warm plan from the database) built it
 * again each time, on the GPU (a spec it evaluates: a builder launch, two
 * read-backs, an allocation) or on the host (the bits, then an upload):
 * 0.17-0.36 ms of a ~0.7 ms layer plan on an H100. The cache keeps the
 * device format and the host format's row_ptr and kind (what the wgmma row
 * order and the persistent schedule read), keyed by the mask's digest, the
 * sequence lengths and the tile; a plan holds a reference and only reads
 * the format's memory (as every kernel does). Entries stay after their last
 * reference until evicted (unreferenced, least recently used, when a new
 * one needs the slot) or the context closes.
 *
 * An entry also keeps a few device arrays derived from its format, each
 * under a key naming the rest of its inputs (stof__fmtcache_find_array):
 * the wgmma row order and a persistent kernel's list schedule, whose deal
 * over every item (6144 at 16 x 2048 tokens, 12 heads) took about 1 ms of
 * a warm layer plan on an H200's host. A plan holds the arrays it uses
 * (find, keep) until it releases them; they go with the entry, or sooner
 * when no plan holds them and a new one needs the room. */
#include "attention_int.h"
#include "../runtime/internal.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define FMTCACHE_MAX 8
/* Device bytes: a format larger than this is not kept (long sequences'
 * formats are the plan's alone, freed with it), nor more than the total
 * (unreferenced entries give way first). */
#define FMTCACHE_ENTRY_BYTES ((size_t)32 << 20)
#define FMTCACHE_TOTAL_BYTES ((size_t)128 << 20)

/* Derived arrays an entry keeps: the row order and a few schedules
 * (batch sizes, and the search's persistent candidates, which all plan on
 * the same format). One no plan holds gives way, least recently used
 * first, to a new one that needs its slot or its bytes. */
#define FMTCACHE_ARRAYS 8
#define FMTCACHE_ARRAY_BYTES ((size_t)16 << 20) /* an entry's, in all */

typedef struct fmt_array {
    int32_t key[STOF_FMTCACHE_KEY];
    CUdeviceptr d; /* owned; 0: an empty slot */
    size_t bytes;
    int32_t value;
    int refs; /* the plans holding it */
    uint64_t tick;
} fmt_array;

typedef struct fmt_entry {
    char key[96];
    stof_block_format bf; /* owned: bf.mem */
    stof_format *counts;  /* owned: row_ptr, kind */
    int gpu;              /* built on the GPU */
    int used, refs;
    uint64_t tick;
    fmt_array arr[FMTCACHE_ARRAYS];
} fmt_entry;

/* Free what an entry owns and empty it. */
static void entry_free(struct stof_context *ctx, fmt_entry *e)
{
    int any = 0;
    for (int i = 0; i < FMTCACHE_ARRAYS; i++)
        any |= e->arr[i].d != 0;
    if (any && stof__ctx_push(ctx) == STOF_OK) {
        for (int i = 0; i < FMTCACHE_ARRAYS; i++)
            if (e->arr[i].d)
                ctx->api->cuMemFree(e->arr[i].d);
        stof__ctx_pop(ctx);
    }
    stof__block_format_free(ctx, &e->bf);
    stof_format_free(&e->counts);
    memset(e, 0, sizeof(*e));
}

struct stof_fmtcache {
    pthread_mutex_t mu;
    fmt_entry e[FMTCACHE_MAX];
    uint64_t tick;
};

static void fc_close(struct stof_context *ctx)
{
    struct stof_fmtcache *c = ctx->fmtcache;
    if (!c)
        return;
    for (int i = 0; i < FMTCACHE_MAX; i++)
        if (c->e[i].used)
            entry_free(ctx, &c->e[i]);
    pthread_mutex_destroy(&c->mu);
    free(c);
    ctx->fmtcache = NULL;
}

static struct stof_fmtcache *fc(stof_context *ctx)
{
    if (!ctx->fmtcache) {
        struct stof_fmtcache *c = calloc(1, sizeof(*c));
        if (!c || pthread_mutex_init(&c->mu, NULL) != 0) {
            free(c);
            return NULL;
        }
        ctx->fmtcache = c;
        ctx->fmtcache_close = fc_close;
    }
    return ctx->fmtcache;
}

static int fc_key(char *k, size_t n, const char *mask_hex, int seq_q,
                  int seq_k, int block_m, int block_n)
{
    const int w = snprintf(k, n, "%s %d %d %d %d", mask_hex, seq_q, seq_k,
                           block_m, block_n);
    return w > 0 && (size_t)w < n;
}

/* A copy of what counts formats hold (counts_format in
 * attention_family.c): the sizes, row_ptr and kind. */
static stof_format *counts_copy(const stof_format *f)
{
    stof_format *c = calloc(1, sizeof(*c));
    if (!c)
        return NULL;
    /* The sizes and counts, field by field (no pointer of f is shared). */
    c->seq_q = f->seq_q;
    c->seq_k = f->seq_k;
    c->block_m = f->block_m;
    c->block_n = f->block_n;
    c->n_row_blocks = f->n_row_blocks;
    c->n_col_blocks = f->n_col_blocks;
    c->n_full = f->n_full;
    c->n_partial = f->n_partial;
    c->n_empty = f->n_empty;
    c->bitmap_words_per_row = f->bitmap_words_per_row;
    c->allowed = f->allowed;
    c->partial_fill = f->partial_fill;
    c->rowwise_fill = f->rowwise_fill;
    const size_t nrb = (size_t)f->n_row_blocks;
    const size_t nt = f->row_ptr ? (size_t)f->row_ptr[nrb] : 0;
    c->row_ptr = malloc(sizeof(int64_t) * (nrb + 1));
    c->kind = malloc(nt + 1);
    if (!c->row_ptr || !c->kind || !f->row_ptr || !f->kind) {
        stof_format_free(&c);
        return NULL;
    }
    memcpy(c->row_ptr, f->row_ptr, sizeof(int64_t) * (nrb + 1));
    memcpy(c->kind, f->kind, nt);
    return c;
}

void *stof__fmtcache_get(stof_context *ctx, const char *mask_hex, int seq_q,
                         int seq_k, int block_m, int block_n,
                         stof_block_format *bf, int *gpu,
                         stof_format **counts)
{
    char key[sizeof(((fmt_entry *)0)->key)];
    struct stof_fmtcache *c = fc(ctx);
    if (!c || !mask_hex || !mask_hex[0] ||
        !fc_key(key, sizeof(key), mask_hex, seq_q, seq_k, block_m, block_n))
        return NULL;
    fmt_entry *hit = NULL;
    pthread_mutex_lock(&c->mu);
    for (int i = 0; i < FMTCACHE_MAX && !hit; i++)
        if (c->e[i].used && strcmp(c->e[i].key, key) == 0)
            hit = &c->e[i];
    stof_format *copy = NULL;
    if (hit && counts && !(copy = counts_copy(hit->counts)))
        hit = NULL;
    if (hit) {
        hit->refs++;
        hit->tick = ++c->tick;
        *bf = hit->bf;
        *gpu = hit->gpu;
        if (counts)
            *counts = copy;
    }
    pthread_mutex_unlock(&c->mu);
    return hit;
}

void *stof__fmtcache_put(stof_context *ctx, const char *mask_hex, int seq_q,
                         int seq_k, int block_m, int block_n,
                         const stof_block_format *bf, int gpu,
                         const stof_format *counts)
{
    char key[sizeof(((fmt_entry *)0)->key)];
    struct stof_fmtcache *c = fc(ctx);
    if (!c || !mask_hex || !mask_hex[0] || !bf->mem || !counts ||
        bf->bytes > FMTCACHE_ENTRY_BYTES ||
        !fc_key(key, sizeof(key), mask_hex, seq_q, seq_k, block_m, block_n))
        return NULL;
    stof_format *own = counts_copy(counts);
    if (!own)
        return NULL;
    pthread_mutex_lock(&c->mu);
    /* Room: unreferenced entries go, least recently used first, until the
     * new one fits the total and a slot is free. */
    fmt_entry *slot = NULL;
    for (;;) {
        size_t total = bf->bytes;
        fmt_entry *lru = NULL;
        slot = NULL;
        for (int i = 0; i < FMTCACHE_MAX; i++) {
            fmt_entry *e = &c->e[i];
            if (!e->used) {
                slot = slot ? slot : e;
                continue;
            }
            total += e->bf.bytes;
            if (e->refs == 0 && (!lru || e->tick < lru->tick))
                lru = e;
        }
        if (slot && total <= FMTCACHE_TOTAL_BYTES)
            break;
        slot = NULL;
        if (!lru)
            break; /* everything referenced: not kept */
        entry_free(ctx, lru);
    }
    if (slot) {
        snprintf(slot->key, sizeof(slot->key), "%s", key);
        slot->bf = *bf;
        slot->gpu = gpu;
        slot->counts = own;
        own = NULL;
        slot->used = 1;
        slot->refs = 1;
        slot->tick = ++c->tick;
    }
    pthread_mutex_unlock(&c->mu);
    stof_format_free(&own);
    return slot;
}

void stof__fmtcache_unref(stof_context *ctx, void *h)
{
    struct stof_fmtcache *c = ctx ? ctx->fmtcache : NULL;
    if (!c || !h)
        return;
    pthread_mutex_lock(&c->mu);
    fmt_entry *e = h;
    if (e->refs > 0)
        e->refs--;
    pthread_mutex_unlock(&c->mu);
}

CUdeviceptr stof__fmtcache_find_array(stof_context *ctx, void *h,
                                      const int32_t *key, int32_t *value)
{
    struct stof_fmtcache *c = ctx ? ctx->fmtcache : NULL;
    if (!c || !h || !key)
        return 0;
    CUdeviceptr d = 0;
    pthread_mutex_lock(&c->mu);
    fmt_entry *e = h;
    for (int i = 0; i < FMTCACHE_ARRAYS && !d; i++) {
        fmt_array *a = &e->arr[i];
        if (a->d && memcmp(a->key, key, sizeof(a->key)) == 0) {
            d = a->d;
            a->refs++;
            a->tick = ++c->tick;
            if (value)
                *value = a->value;
        }
    }
    pthread_mutex_unlock(&c->mu);
    return d;
}

int stof__fmtcache_keep_array(stof_context *ctx, void *h, const int32_t *key,
                              CUdeviceptr d, size_t bytes, int32_t value)
{
    struct stof_fmtcache *c = ctx ? ctx->fmtcache : NULL;
    if (!c || !h || !key || !d)
        return 0;
    pthread_mutex_lock(&c->mu);
    fmt_entry *e = h;
    /* Another plan kept one under this key first, or the arrays other
     * plans hold leave no room: the caller's stays its own. */
    size_t held = bytes;
    int n_held = 0, taken = 0;
    for (int i = 0; i < FMTCACHE_ARRAYS; i++) {
        const fmt_array *a = &e->arr[i];
        taken |= a->d && memcmp(a->key, key, sizeof(a->key)) == 0;
        if (a->d && a->refs > 0) {
            held += a->bytes;
            n_held++;
        }
    }
    fmt_array *slot = NULL;
    if (!taken && n_held < FMTCACHE_ARRAYS && held <= FMTCACHE_ARRAY_BYTES)
        for (;;) { /* the unheld ones give way, least recently used first */
            size_t total = bytes;
            fmt_array *lru = NULL;
            slot = NULL;
            for (int i = 0; i < FMTCACHE_ARRAYS; i++) {
                fmt_array *a = &e->arr[i];
                if (!a->d) {
                    slot = slot ? slot : a;
                    continue;
                }
                total += a->bytes;
                if (a->refs == 0 && (!lru || a->tick < lru->tick))
                    lru = a;
            }
            if (slot && total <= FMTCACHE_ARRAY_BYTES)
                break;
            if (!lru) { /* (the check above leaves room: not reached) */
                slot = NULL;
                break;
            }
            if (stof__ctx_push(ctx) == STOF_OK) {
                ctx->api->cuMemFree(lru->d);
                stof__ctx_pop(ctx);
            }
            memset(lru, 0, sizeof(*lru));
        }
    if (slot) {
        memcpy(slot->key, key, sizeof(slot->key));
        slot->d = d;
        slot->bytes = bytes;
        slot->value = value;
        slot->refs = 1;
        slot->tick = ++c->tick;
    }
    pthread_mutex_unlock(&c->mu);
    return slot != NULL;
}

void stof__fmtcache_release_array(stof_context *ctx, void *h, CUdeviceptr d)
{
    struct stof_fmtcache *c = ctx ? ctx->fmtcache : NULL;
    if (!c || !h || !d)
        return;
    pthread_mutex_lock(&c->mu);
    fmt_entry *e = h;
    for (int i = 0; i < FMTCACHE_ARRAYS; i++)
        if (e->arr[i].d == d && e->arr[i].refs > 0) {
            e->arr[i].refs--;
            break;
        }
    pthread_mutex_unlock(&c->mu);
}
