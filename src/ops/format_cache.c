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
 * one needs the slot) or the context closes. */
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

typedef struct fmt_entry {
    char key[96];
    stof_block_format bf; /* owned: bf.mem */
    stof_format *counts;  /* owned: row_ptr, kind */
    int gpu;              /* built on the GPU */
    int used, refs;
    uint64_t tick;
} fmt_entry;

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
        if (c->e[i].used) {
            stof__block_format_free(ctx, &c->e[i].bf);
            stof_format_free(&c->e[i].counts);
        }
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
        stof__block_format_free(ctx, &lru->bf);
        stof_format_free(&lru->counts);
        memset(lru, 0, sizeof(*lru));
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
