/*
 * rope_cache.c - RoPE tables for layers (stof_layer_desc.rope_theta or
 * rope_freq): the (cos, sin) table of a sequence length, rotated
 * channels, frequencies and scale (compared bit for bit), computed once a
 * process on the host (stof__rope_table_f) and uploaded once a context,
 * shared by every plan of the context that needs it (those no plan holds
 * kept up to 64 MB a context, 64 MB of host tables a process). A warm
 * plan of a RoPE layer then copies nothing: uploading 512 KB (2048
 * positions of 64 pairs) took a warm plan about 0.7 ms (H200, pageable
 * copy and the plan's closing wait), more than the rest of it.
 */
#include "layer_int.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

/* --- the host's tables, kept for the process -------------------------------- */

#define HOST_MAX 16
#define HOST_BYTES ((size_t)64 << 20)
static pthread_mutex_t host_lock = PTHREAD_MUTEX_INITIALIZER;
/* What names a table: its length, channels, frequencies and scale. */
typedef struct rope_id {
    int seq, rope;
    float scale;
    float freq[128];
} rope_id;

static rope_id make_id(int seq, int rope, const float *freq, float scale)
{
    rope_id id;
    memset(&id, 0, sizeof(id));
    id.seq = seq;
    id.rope = rope;
    id.scale = scale;
    memcpy(id.freq, freq, sizeof(float) * (size_t)(rope / 2));
    return id;
}

static int same_id(const rope_id *a, const rope_id *b)
{
    return a->seq == b->seq && a->rope == b->rope &&
           memcmp(&a->scale, &b->scale, sizeof(float)) == 0 &&
           memcmp(a->freq, b->freq, sizeof(float) * (size_t)(a->rope / 2)) == 0;
}

static struct {
    rope_id id;
    const float *tab;
} host[HOST_MAX];
static int host_n;
static size_t host_bytes;

/* The table: the memo's (*owned 0, immutable) or one the caller frees
 * (*owned 1: the memo is full); NULL when out of memory. */
static const float *host_table(const rope_id *id, int *owned)
{
    *owned = 0;
    const int seq = id->seq, rope = id->rope;
    pthread_mutex_lock(&host_lock);
    for (int i = 0; i < host_n; i++)
        if (same_id(&host[i].id, id)) {
            const float *t = host[i].tab;
            pthread_mutex_unlock(&host_lock);
            return t;
        }
    pthread_mutex_unlock(&host_lock);
    const size_t bytes = (size_t)seq * (size_t)rope * sizeof(float);
    float *tab = malloc(bytes);
    if (!tab)
        return NULL;
    stof__rope_table_f(tab, NULL, seq, rope, id->freq, id->scale);
    pthread_mutex_lock(&host_lock);
    int kept = 0;
    for (int i = 0; i < host_n; i++)
        if (same_id(&host[i].id, id)) {
            /* (another thread's, computed meanwhile) */
            const float *t = host[i].tab;
            pthread_mutex_unlock(&host_lock);
            free(tab);
            return t;
        }
    if (host_n < HOST_MAX && host_bytes + bytes <= HOST_BYTES) {
        host[host_n].id = *id;
        host[host_n].tab = tab;
        host_n++;
        host_bytes += bytes;
        kept = 1;
    }
    pthread_mutex_unlock(&host_lock);
    *owned = !kept;
    return tab;
}

/* --- the context's device tables -------------------------------------------- */

/* At most DEV_MAX tables a context; those no plan holds are kept while
 * they take at most DEV_IDLE_BYTES together. */
#define DEV_MAX 8
#define DEV_IDLE_BYTES ((size_t)64 << 20)
typedef struct dev_entry {
    rope_id id;
    CUdeviceptr p;
    size_t bytes;
    int refs;
} dev_entry;

struct stof_ropecache {
    pthread_mutex_t mu;
    dev_entry e[DEV_MAX];
};

static void rc_close(struct stof_context *ctx)
{
    struct stof_ropecache *c = ctx->ropecache;
    if (!c)
        return;
    int any = 0;
    for (int i = 0; i < DEV_MAX; i++)
        any |= c->e[i].p != 0;
    if (any && stof__ctx_push(ctx) == STOF_OK) {
        for (int i = 0; i < DEV_MAX; i++)
            if (c->e[i].p)
                ctx->api->cuMemFree(c->e[i].p);
        stof__ctx_pop(ctx);
    }
    pthread_mutex_destroy(&c->mu);
    free(c);
    ctx->ropecache = NULL;
}

static struct stof_ropecache *rc(stof_context *ctx)
{
    if (!ctx->ropecache) {
        struct stof_ropecache *c = calloc(1, sizeof(*c));
        if (!c || pthread_mutex_init(&c->mu, NULL) != 0) {
            free(c);
            return NULL;
        }
        ctx->ropecache = c;
        ctx->ropecache_close = rc_close;
    }
    return ctx->ropecache;
}

stof_status stof__rope_dev_get(stof_context *ctx, int seq, int rope,
                               const float *freq, float scale,
                               CUdeviceptr *out)
{
    *out = 0;
    if (seq < 1 || rope < 2 || rope > 256 || rope % 2 || !freq)
        return stof__fail(ctx, STOF_ERR_INVALID_ARGUMENT,
                          "the RoPE table of %d positions, %d channels",
                          seq, rope);
    const rope_id id = make_id(seq, rope, freq, scale);
    struct stof_ropecache *c = rc(ctx);
    if (c) {
        pthread_mutex_lock(&c->mu);
        for (int i = 0; i < DEV_MAX; i++) {
            dev_entry *e = &c->e[i];
            if (e->p && same_id(&e->id, &id)) {
                e->refs++;
                *out = e->p;
                pthread_mutex_unlock(&c->mu);
                return STOF_OK;
            }
        }
        pthread_mutex_unlock(&c->mu);
    }
    const size_t bytes = (size_t)seq * (size_t)rope * sizeof(float);
    int owned = 0;
    const float *h = host_table(&id, &owned);
    if (!h)
        return stof__fail(ctx, STOF_ERR_OUT_OF_MEMORY,
                          "out of memory (the RoPE table, %zu bytes)", bytes);
    const stof_api *api = ctx->api;
    CUdeviceptr p = 0;
    CUresult r = api->cuMemAlloc(&p, bytes);
    if (r == CUDA_SUCCESS) {
        r = api->cuMemcpyHtoD(p, h, bytes);
        if (r != CUDA_SUCCESS)
            api->cuMemFree(p);
    }
    if (owned)
        free((void *)h);
    if (r != CUDA_SUCCESS)
        return (stof_status)stof__cuda_fail(ctx, r, "the RoPE table",
                                            __FILE__, __LINE__);
    /* Into a free slot, or one no plan holds (its table freed), else
     * the plan's own (freed by stof__rope_dev_put). */
    CUdeviceptr evict = 0;
    if (c) {
        pthread_mutex_lock(&c->mu);
        int slot = -1;
        for (int i = 0; i < DEV_MAX && slot < 0; i++)
            if (!c->e[i].p)
                slot = i;
        for (int i = 0; i < DEV_MAX && slot < 0; i++)
            if (!c->e[i].refs)
                slot = i;
        if (slot >= 0) {
            evict = c->e[slot].p;
            c->e[slot] = (dev_entry){id, p, bytes, 1};
        }
        pthread_mutex_unlock(&c->mu);
    }
    if (evict)
        api->cuMemFree(evict);
    *out = p;
    return STOF_OK;
}

void stof__rope_dev_put(stof_context *ctx, CUdeviceptr p)
{
    if (!p)
        return;
    struct stof_ropecache *c = ctx->ropecache;
    if (c) {
        pthread_mutex_lock(&c->mu);
        for (int i = 0; i < DEV_MAX; i++)
            if (c->e[i].p == p) {
                if (c->e[i].refs > 0)
                    c->e[i].refs--;
                /* Kept for the next plan while the tables no plan holds
                 * stay small; else freed now. */
                size_t idle = 0;
                for (int j = 0; j < DEV_MAX; j++)
                    if (c->e[j].p && !c->e[j].refs)
                        idle += c->e[j].bytes;
                const int drop = !c->e[i].refs && idle > DEV_IDLE_BYTES;
                if (drop)
                    memset(&c->e[i], 0, sizeof(c->e[i]));
                pthread_mutex_unlock(&c->mu);
                if (drop)
                    ctx->api->cuMemFree(p);
                return;
            }
        pthread_mutex_unlock(&c->mu);
    }
    ctx->api->cuMemFree(p); /* (not the cache's) */
}

/* --- stand-in frequencies ------------------------------------------------- */

static float standin[128];
static pthread_once_t standin_once = PTHREAD_ONCE_INIT;

static void standin_init(void)
{
    stof__rope_freqs(standin, 256, 10000.0f);
}

const float *stof__rope_freq_standin(void)
{
    pthread_once(&standin_once, standin_init);
    return standin;
}
