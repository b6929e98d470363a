/*
 * preload.c - stof_preload: what a plan from the tuning databases would
 * load, loaded before any plan asks for it.
 *
 * A plan that hits the database reads and checks its records, loads its
 * kernels' modules (a layer's GEMMs, norms and attention: 2-3 ms in a fresh
 * process on an H200, where the rest of a warm plan takes under 1 ms) and,
 * the first of a process, starts cuBLASLt (~0.1 s). A serving process can
 * pay that once at start instead of on each size's first request:
 *   - the distinct cubins of the records made on this GPU and build (the
 *     fields every key covers), most used first, into the context's module
 *     cache, each with every kernel it has;
 *   - the most used records themselves into the database handle's memo,
 *     so that a plan's lookups do not read and check them again;
 *   - cuBLASLt's start, when cuBLASLt algorithms are stored;
 *   - the GPU format builder, when its record is there.
 * It runs no kernel and trusts nothing: a record whose integrity check
 * fails is skipped, and a record this host has not verified is still
 * verified when a plan first uses it.
 *
 * Two passes over the databases' records: the first ranks the cubins and
 * the records without holding either; the second loads the chosen ones.
 */
#define XXH_INLINE_ALL
#include <xxhash.h>

#include "attention_int.h"
#include "blaslt.h"
#include "db.h"
#include "internal.h"

#include <stdlib.h>
#include <string.h>

/* A distinct cubin: how often its records were used. */
typedef struct pre_item {
    uint64_t hash;
    size_t size;
    int64_t hits, created;
    int chosen; /* second pass: to load (1), tried (2) */
} pre_item;

/* A record, for the memo. */
typedef struct pre_rec {
    char key[33];
    int layer;
    int64_t hits, created;
} pre_rec;

typedef struct pre_walk {
    stof_context *ctx;
    stof_db *db;
    stof_db_record env;
    int pass;  /* 1 rank, 2 load */
    int layer; /* the database being walked */
    pre_item *v;
    int n, cap;
    pre_rec *r;
    int nr, capr;
    int bad; /* records that failed their integrity check */
    int lt;  /* cuBLASLt records */
    int loaded, failed, kept;
    stof_module_enum en; /* the driver's entry points for module loads */
    stof_status oom;
} pre_walk;

/* Whether r was made by this GPU and build, so that some plan here can hit
 * it. */
static int this_build(const pre_walk *w, const stof_db_record *r)
{
    return stof__record_same_build(r, &w->env);
}

static int is_lt(const stof_db_record *r)
{
    return strcmp(r->kernel, "cublaslt") == 0;
}

/* Whether r carries a module for the cache (cuBLASLt records carry an
 * algorithm; the format builder's is loaded by its own path). */
static int has_module(const stof_db_record *r)
{
    return r->cubin && r->cubin_size > 0 && !is_lt(r) &&
           strcmp(r->op, "builder") != 0;
}

static pre_item *find(pre_walk *w, uint64_t hash, size_t size)
{
    for (int i = 0; i < w->n; i++)
        if (w->v[i].hash == hash && w->v[i].size == size)
            return &w->v[i];
    return NULL;
}

static int chosen_rec(const pre_walk *w, int layer, const char *key)
{
    for (int i = 0; i < w->nr; i++)
        if (w->r[i].layer == layer && !strcmp(w->r[i].key, key))
            return 1;
    return 0;
}

/* Room for one more in a growing array; 0 when memory ran out. */
static int grow(void **p, int n, int *cap, size_t each)
{
    if (n < *cap)
        return 1;
    const int c = *cap ? 2 * *cap : 64;
    void *q = realloc(*p, (size_t)c * each);
    if (!q)
        return 0;
    *p = q;
    *cap = c;
    return 1;
}

static void load(pre_walk *w, const stof_db_record *r, pre_item *it)
{
    it->chosen = 2;
    int got = 0;
    if (stof__module_preload(w->ctx, &w->en, r->cubin, r->cubin_size,
                             &got) != STOF_OK) {
        w->failed++;
        stof__log(w->ctx, STOF_LOG_WARN,
                  "preload: the module of record %s did not load: %s",
                  r->key, stof_errmsg(w->ctx));
    }
    w->loaded += got;
}

static int visit(void *user, const stof_db_record *r)
{
    pre_walk *w = user;
    if (!this_build(w, r))
        return 0;
    const int mod = has_module(r);
    const uint64_t hash = mod ? XXH3_64bits(r->cubin, r->cubin_size) : 0;
    pre_item *it = mod ? find(w, hash, r->cubin_size) : NULL;
    char why[160];
    if (w->pass == 2) {
        const int keep = chosen_rec(w, w->layer, r->key);
        const int want = it && it->chosen == 1;
        if ((!keep && !want) || !stof__db_record_check(r, why, sizeof(why)))
            return 0;
        if (keep) {
            stof__db_memo_keep(w->db, w->layer, r);
            w->kept++;
        }
        if (want)
            load(w, r, it);
        return 0;
    }
    if (!stof__db_record_check(r, why, sizeof(why))) {
        w->bad++;
        stof__log(w->ctx, STOF_LOG_DEBUG, "preload: record %s skipped: %s",
                  r->key, why);
        return 0;
    }
    w->lt += is_lt(r);
    if (!grow((void **)&w->r, w->nr, &w->capr, sizeof(*w->r))) {
        w->oom = STOF_ERR_OUT_OF_MEMORY;
        return 1;
    }
    pre_rec *pr = &w->r[w->nr++];
    memcpy(pr->key, r->key, sizeof(pr->key));
    pr->layer = w->layer;
    pr->hits = r->hits;
    pr->created = r->created_at;
    if (!mod)
        return 0;
    if (!it) {
        if (!grow((void **)&w->v, w->n, &w->cap, sizeof(*w->v))) {
            w->oom = STOF_ERR_OUT_OF_MEMORY;
            return 1;
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
static int by_use(int64_t ha, int64_t ca, int64_t hb, int64_t cb)
{
    if (ha != hb)
        return ha > hb ? -1 : 1;
    if (ca != cb)
        return ca > cb ? -1 : 1;
    return 0;
}

static int item_by_use(const void *a, const void *b)
{
    const pre_item *x = a, *y = b;
    return by_use(x->hits, x->created, y->hits, y->created);
}

static int rec_by_use(const void *a, const void *b)
{
    const pre_rec *x = a, *y = b;
    return by_use(x->hits, x->created, y->hits, y->created);
}

/* Every open database in turn; one that cannot be read is skipped (as a
 * lookup takes it for a miss), logged. */
static stof_status walk(pre_walk *w)
{
    for (int layer = 0; layer < stof__db_layers(w->db); layer++) {
        if (!stof__db_layer_open(w->db, layer))
            continue;
        w->layer = layer;
        const stof_status st = stof__db_foreach(w->db, layer, visit, w);
        if (w->oom != STOF_OK)
            return stof__fail(w->ctx, w->oom, "preload: out of memory");
        if (st != STOF_OK)
            stof__log(w->ctx, STOF_LOG_WARN,
                      "preload: database %d could not be read (%s); "
                      "skipped",
                      layer, stof_errmsg(w->ctx));
    }
    return STOF_OK;
}

/* The first pass: w's cubins and records, most used first. */
static stof_status rank(stof_context *ctx, stof_db *db,
                        const stof_db_record *env, pre_walk *w)
{
    memset(w, 0, sizeof(*w));
    w->ctx = ctx;
    w->db = db;
    w->env = *env;
    w->env.cubin = NULL;
    w->pass = 1;
    const stof_status st = walk(w);
    if (st == STOF_OK) {
        qsort(w->v, (size_t)w->n, sizeof(*w->v), item_by_use);
        qsort(w->r, (size_t)w->nr, sizeof(*w->r), rec_by_use);
    }
    return st;
}

static void walk_free(pre_walk *w)
{
    free(w->v);
    free(w->r);
    w->v = NULL;
    w->r = NULL;
}

int stof__preload_pick(stof_context *ctx, stof_db *db,
                       const stof_db_record *env, int max, uint64_t *hash,
                       size_t *size, int *bad, int *lt)
{
    pre_walk w;
    const stof_status st = rank(ctx, db, env, &w);
    if (bad)
        *bad = w.bad;
    if (lt)
        *lt = w.lt;
    const int n = w.n < max ? w.n : max;
    for (int i = 0; st == STOF_OK && i < n; i++) {
        hash[i] = w.v[i].hash;
        size[i] = w.v[i].size;
    }
    walk_free(&w);
    return st == STOF_OK ? n : -(int)st;
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
    if (ctx->settings.tuning_mode == STOF_TUNE_FORCE) {
        stof__log(ctx, STOF_LOG_INFO,
                  "preload: nothing to load in force mode (every plan "
                  "tunes)");
        return stof__ok(ctx);
    }
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
    pre_walk w;
    stof_status st = rank(ctx, db, &env, &w);
    if (st != STOF_OK) {
        walk_free(&w);
        return st;
    }
    /* Records of cuBLASLt algorithms: start cuBLASLt now too. */
    if (w.lt && stof__blaslt_warm(ctx) != STOF_OK)
        stof__log(ctx, STOF_LOG_WARN, "preload: cuBLASLt did not start: %s",
                  stof_errmsg(ctx));
    /* The GPU format builder of spec masks, when the database has it. */
    const int mb = stof__family_builder_preload(ctx);
    if (mb < 0)
        stof__log(ctx, STOF_LOG_WARN,
                  "preload: the format builder did not load: %s",
                  stof_errmsg(ctx));
    /* The modules: without evicting one a plan holds, or one loaded by this
     * call (the cache evicts the least recently used first). */
    const int can_load = stof__module_enum(ctx->api, &w.en);
    const int room = stof__modcache_room(ctx);
    int n = w.n < max_modules ? w.n : max_modules;
    if (n > room)
        n = room;
    if (!can_load)
        n = 0;
    for (int i = 0; i < n; i++)
        w.v[i].chosen = 1;
    /* (the memo's capacity, as many records as max_modules allows) */
    if (w.nr > STOF_DB_MEMO_MAX)
        w.nr = STOF_DB_MEMO_MAX;
    if (w.nr > max_modules)
        w.nr = max_modules;
    w.pass = 2;
    if (n > 0 || w.nr > 0)
        st = walk(&w);
    /* Loaded in the databases' order: marked used in rank order, the
     * least used first, so that the cache evicts those first. */
    for (int i = n - 1; i >= 0 && st == STOF_OK; i--)
        stof__module_touch(ctx, w.v[i].hash, w.v[i].size);
    walk_free(&w);
    if (st != STOF_OK)
        return st;
    if (!can_load)
        return stof__fail(ctx, STOF_ERR_UNSUPPORTED,
                          "preload: the CUDA driver cannot list a module's "
                          "kernels (cuModuleEnumerateFunctions needs CUDA "
                          "12.4); records kept, no module loaded");
    if (loaded)
        *loaded = w.loaded;
    stof__log(ctx, STOF_LOG_INFO,
              "preload: %d module%s loaded in %.1f ms (%d chosen, at most "
              "%d; %d failed to load; %d record%s kept; %d failed the "
              "integrity check)%s%s",
              w.loaded, w.loaded == 1 ? "" : "s", stof__now_ms() - t0, n,
              max_modules, w.failed, w.kept, w.kept == 1 ? "" : "s", w.bad,
              ctx->lt_warm ? "; cuBLASLt started" : "",
              mb == 1 ? "; the format builder loaded" : "");
    return stof__ok(ctx);
}
