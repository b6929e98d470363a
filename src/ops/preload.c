/*
 * preload.c - stof_preload: the kernels the tuning databases hold for this
 * GPU loaded into the context's module cache before any plan asks for
 * them.
 *
 * A plan that hits the database loads its kernels' modules (a layer's
 * GEMMs, norms and attention: 2-4 ms in a fresh process on an H200, where
 * the rest of a warm plan takes under 1 ms). A serving process can pay
 * that once at start instead of on each size's first request. Preloading
 * runs no kernel and trusts nothing: a record whose integrity check fails
 * is skipped, and a record this host has not verified yet is still
 * verified when a plan first uses it.
 *
 * Two passes over the databases' records: the first keeps, per distinct
 * cubin, how often its records were used (the `hits` column) for the
 * records that match this GPU and build (the fields every key covers),
 * without holding the cubins; the second loads the most used first, up to
 * the limit.
 */
#define XXH_INLINE_ALL
#include <xxhash.h>

#include "attention_int.h"
#include "blaslt.h"
#include "db.h"
#include "internal.h"

#include <stdlib.h>
#include <string.h>

typedef struct pre_item {
    uint64_t hash;
    size_t size;
    int64_t hits, created;
    int chosen; /* second pass: to load (1), loaded or tried (2) */
} pre_item;

typedef struct pre_walk {
    stof_context *ctx;
    stof_db_record env;
    pre_item *v;
    int n, cap;
    int bad;        /* records that failed their integrity check */
    int lt;         /* cuBLASLt records */
    int pass;       /* 1 collect, 2 load */
    int loaded, failed;
    int unsupported; /* the driver cannot list a module's kernels */
    stof_status oom;
} pre_walk;

/* Whether r was made by this GPU and build, so that some plan here can hit
 * it, and carries a module (cuBLASLt records carry an algorithm). */
static int this_build(const pre_walk *w, const stof_db_record *r)
{
    const stof_db_record *e = &w->env;
    return strcmp(r->device_name, e->device_name) == 0 &&
           r->cc_major == e->cc_major && r->cc_minor == e->cc_minor &&
           r->sm_count == e->sm_count &&
           r->driver_version == e->driver_version &&
           strcmp(r->nvrtc_version, e->nvrtc_version) == 0 &&
           strcmp(r->stof_version, e->stof_version) == 0 &&
           strcmp(r->template_hash, e->template_hash) == 0;
}

static int is_lt(const stof_db_record *r)
{
    return strcmp(r->kernel, "cublaslt") == 0;
}

static pre_item *find(pre_walk *w, uint64_t hash, size_t size)
{
    for (int i = 0; i < w->n; i++)
        if (w->v[i].hash == hash && w->v[i].size == size)
            return &w->v[i];
    return NULL;
}

static int visit(void *user, const stof_db_record *r)
{
    pre_walk *w = user;
    if (!this_build(w, r))
        return 0;
    if (w->pass == 1 && is_lt(r))
        w->lt++;
    /* (the format builder's record: loaded by its own path) */
    if (!r->cubin || r->cubin_size == 0 || is_lt(r) ||
        strcmp(r->op, "builder") == 0)
        return 0;
    const uint64_t hash = XXH3_64bits(r->cubin, r->cubin_size);
    pre_item *it = find(w, hash, r->cubin_size);
    char why[160];
    if (w->pass == 2) {
        if (!it || it->chosen != 1 ||
            !stof__db_record_check(r, why, sizeof(why)))
            return 0;
        it->chosen = 2;
        const int got = stof__module_preload(w->ctx, r->cubin, r->cubin_size);
        if (got == STOF_ERR_UNSUPPORTED) {
            w->unsupported = 1; /* (no use going on) */
            return 1;
        }
        if (got == 1) {
            w->loaded++;
        } else if (got != 0) {
            w->failed++;
            stof__log(w->ctx, STOF_LOG_WARN,
                      "preload: the module of record %s did not load: %s",
                      r->key, stof_errmsg(w->ctx));
        }
        return 0;
    }
    if (!stof__db_record_check(r, why, sizeof(why))) {
        w->bad++;
        stof__log(w->ctx, STOF_LOG_DEBUG, "preload: record %s skipped: %s",
                  r->key, why);
        return 0;
    }
    if (!it) {
        if (w->n == w->cap) {
            const int cap = w->cap ? 2 * w->cap : 64;
            pre_item *v = realloc(w->v, (size_t)cap * sizeof(*v));
            if (!v) {
                w->oom = STOF_ERR_OUT_OF_MEMORY;
                return 1;
            }
            w->v = v;
            w->cap = cap;
        }
        it = &w->v[w->n++];
        memset(it, 0, sizeof(*it));
        it->hash = hash;
        it->size = r->cubin_size;
    }
    it->hits += r->hits;
    if (r->created_at > it->created)
        it->created = r->created_at;
    return 0;
}

/* Most used first, then the newest. */
static int by_use(const void *a, const void *b)
{
    const pre_item *x = a, *y = b;
    if (x->hits != y->hits)
        return x->hits > y->hits ? -1 : 1;
    if (x->created != y->created)
        return x->created > y->created ? -1 : 1;
    return 0;
}

static stof_status walk(stof_db *db, pre_walk *w)
{
    for (int layer = 0; layer < stof__db_layers(db); layer++) {
        if (!stof__db_layer_open(db, layer))
            continue;
        const stof_status st = stof__db_foreach(db, layer, visit, w);
        if (w->oom != STOF_OK)
            return w->oom;
        if (st != STOF_OK)
            return st;
    }
    return STOF_OK;
}

int stof__preload_pick(stof_context *ctx, stof_db *db,
                       const stof_db_record *env, int max, uint64_t *hash,
                       size_t *size, int *bad, int *lt)
{
    pre_walk w;
    memset(&w, 0, sizeof(w));
    w.ctx = ctx;
    w.env = *env;
    w.env.cubin = NULL;
    w.pass = 1;
    const stof_status st = walk(db, &w);
    if (bad)
        *bad = w.bad;
    if (lt)
        *lt = w.lt;
    if (st != STOF_OK) {
        free(w.v);
        return -(int)st;
    }
    qsort(w.v, (size_t)w.n, sizeof(*w.v), by_use);
    const int n = w.n < max ? w.n : max;
    for (int i = 0; i < n; i++) {
        hash[i] = w.v[i].hash;
        size[i] = w.v[i].size;
    }
    free(w.v);
    return n;
}

stof_status stof_preload(stof_context *ctx, int max_modules, int *loaded)
{
    if (loaded)
        *loaded = 0;
    if (!ctx)
        return STOF_ERR_INVALID_ARGUMENT;
    STOF_CHECK_ARG(ctx, max_modules >= 0, "max_modules %d < 0", max_modules);
    if (!ctx->device.ok)
        return stof__fail(ctx, STOF_ERR_NO_DEVICE,
                          "stof_preload needs a GPU: %s",
                          ctx->device.why[0] ? ctx->device.why
                                             : "no usable CUDA device");
    if (max_modules == 0 || max_modules > STOF_MODCACHE_MAX)
        max_modules = STOF_MODCACHE_MAX;
    stof_db *db = stof__ctx_db(ctx);
    if (!db) {
        stof__log(ctx, STOF_LOG_INFO,
                  "preload: no tuning database, nothing to load");
        return stof__ok(ctx);
    }
    const double t0 = stof__now_ms();
    stof_db_record env;
    memset(&env, 0, sizeof(env));
    stof__record_env(ctx, &env);
    uint64_t hash[STOF_MODCACHE_MAX];
    size_t size[STOF_MODCACHE_MAX];
    int bad = 0, lt = 0;
    const int n = stof__preload_pick(ctx, db, &env, max_modules, hash, size,
                                     &bad, &lt);
    if (n < 0)
        return (stof_status)-n;
    /* Records of cuBLASLt algorithms: start cuBLASLt now too (its first
     * handle in a process takes ~0.1 s). */
    if (lt && stof__blaslt_warm(ctx) != STOF_OK)
        stof__log(ctx, STOF_LOG_WARN, "preload: cuBLASLt did not start: %s",
                  stof_errmsg(ctx));
    /* The GPU format builder of spec masks, when the database has it. */
    const int mb = stof__family_builder_preload(ctx);
    if (mb < 0)
        stof__log(ctx, STOF_LOG_WARN,
                  "preload: the format builder did not load: %s",
                  stof_errmsg(ctx));
    pre_item items[STOF_MODCACHE_MAX];
    pre_walk w;
    memset(&w, 0, sizeof(w));
    w.ctx = ctx;
    w.env = env;
    w.pass = 2;
    w.v = items;
    w.n = w.cap = n;
    for (int i = 0; i < n; i++) {
        memset(&items[i], 0, sizeof(items[i]));
        items[i].hash = hash[i];
        items[i].size = size[i];
        items[i].chosen = 1;
    }
    const stof_status st = n > 0 ? walk(db, &w) : STOF_OK;
    if (st != STOF_OK)
        return st;
    if (w.unsupported) /* (the message is stof__module_preload's) */
        return STOF_ERR_UNSUPPORTED;
    if (loaded)
        *loaded = w.loaded;
    stof__log(ctx, STOF_LOG_INFO,
              "preload: %d module%s loaded in %.1f ms (%d chosen, at most "
              "%d; %d failed to load; %d record%s failed the integrity "
              "check)%s%s",
              w.loaded, w.loaded == 1 ? "" : "s", stof__now_ms() - t0, n,
              max_modules, w.failed, bad, bad == 1 ? "" : "s",
              ctx->lt_warm ? "; cuBLASLt started" : "",
              mb == 1 ? "; the format builder loaded" : "");
    return stof__ok(ctx);
}
