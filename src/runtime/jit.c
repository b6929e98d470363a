/*
 * jit.c - run-time compilation of the embedded kernel templates with NVRTC
 * into cubins.
 *
 * A compile touches no shared state besides the atomic compile counter, so
 * compiles with ctx == NULL may run on several threads at once (the tuner
 * compiles its candidates on a thread pool).
 */
#define XXH_INLINE_ALL
#include <xxhash.h>

#include "internal.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static atomic_long g_compiles;

long stof__jit_compile_count(void)
{
    return atomic_load(&g_compiles);
}

/* Fail with NOT_FOUND, listing the templates that exist. */
static int not_found(stof_context *ctx, const char *name)
{
    stof_str known = {0};
    for (int i = 0; i < stof__n_templates; i++)
        stof__str_printf(&known, "%s%s", i ? ", " : "",
                         stof__templates[i].name);
    int st = stof__fail(ctx, STOF_ERR_NOT_FOUND,
                        "no kernel template named \"%s\" (known: %s)", name,
                        known.p && !known.oom ? known.p : "none");
    stof__str_free(&known);
    return st;
}

/* A real architecture gives a cubin: "sm_" digits, optionally "a" or "f". */
static int arch_is_real(const char *arch)
{
    if (strncmp(arch, "sm_", 3) != 0)
        return 0;
    const char *p = arch + 3;
    if (*p < '0' || *p > '9')
        return 0;
    while (*p >= '0' && *p <= '9')
        p++;
    if (*p == 'a' || *p == 'f')
        p++;
    return *p == '\0' && p - arch < 16;
}

/* " -DA -DB=1" for messages. */
static void defines_text(stof_str *s, const char *const *defines,
                         int n_defines)
{
    if (n_defines == 0)
        stof__str_printf(s, " (no defines)");
    for (int i = 0; i < n_defines; i++)
        stof__str_printf(s, " -D%s", defines[i]);
}

/* Fail with STOF_ERR_NVRTC: what happened, for which template, arch and
 * defines, then as much of the log as fits. Compilers report the first
 * errors first, so the tail is what gets cut. */
static int nvrtc_fail(stof_context *ctx, const stof_api *a, const char *what,
                      nvrtcResult r, const char *name, const char *arch,
                      const char *const *defines, int n_defines,
                      const char *log)
{
    if (!ctx)
        return STOF_ERR_NVRTC;
    stof_str head = {0};
    stof__str_printf(&head, "%s failed (%s) for template %s, %s,", what,
                     a->nvrtcGetErrorString ? a->nvrtcGetErrorString(r)
                                            : "NVRTC error",
                     name, arch);
    defines_text(&head, defines, n_defines);
    const char *h = head.p && !head.oom ? head.p : what;
    size_t loglen = log ? strlen(log) : 0;
    while (loglen && (log[loglen - 1] == '\n' || log[loglen - 1] == ' ' ||
                      log[loglen - 1] == '\r'))
        loglen--;
    int st;
    if (!loglen) {
        st = stof__fail(ctx, STOF_ERR_NVRTC, "%s", h);
    } else {
        /* Room left for the log after the head, ":\n" and a note. */
        size_t hl = strlen(h);
        size_t room = STOF_ERRMSG_MAX - 1 > hl + 80 ? STOF_ERRMSG_MAX - 1 - hl - 80
                                                    : 0;
        if (loglen <= room)
            st = stof__fail(ctx, STOF_ERR_NVRTC, "%s:\n%.*s", h, (int)loglen,
                            log);
        else
            st = stof__fail(ctx, STOF_ERR_NVRTC,
                            "%s:\n%.*s\n[log cut: %zu of %zu bytes shown]", h,
                            (int)room, log, room, loglen);
    }
    stof__str_free(&head);
    return st;
}

/* Read the program log (malloc'd, NUL-terminated) or NULL. */
static char *program_log(const stof_api *a, nvrtcProgram prog)
{
    size_t n = 0;
    if (a->nvrtcGetProgramLogSize(prog, &n) != NVRTC_SUCCESS || n == 0)
        return NULL;
    char *log = malloc(n + 1);
    if (!log)
        return NULL;
    if (a->nvrtcGetProgramLog(prog, log) != NVRTC_SUCCESS) {
        free(log);
        return NULL;
    }
    log[n] = '\0';
    return log;
}

int stof__jit_compile(struct stof_context *ctx, const char *name,
                      const char *const *defines, int n_defines,
                      const char *arch, void **cubin, size_t *size)
{
    STOF_CHECK_ARG(ctx, cubin && size, "cubin, size: NULL output pointer");
    *cubin = NULL;
    *size = 0;
    STOF_CHECK_ARG(ctx, name, "name: NULL template name");
    STOF_CHECK_ARG(ctx, n_defines >= 0 && (n_defines == 0 || defines),
                   "defines: %d defines but %s", n_defines,
                   n_defines < 0 ? "a negative count" : "a NULL array");
    for (int i = 0; i < n_defines; i++)
        STOF_CHECK_ARG(ctx, defines[i] && defines[i][0],
                       "defines[%d]: NULL or empty", i);

    const stof_template *tpl = stof__template_find(name);
    if (!tpl)
        return not_found(ctx, name);

    if (!arch) {
        if (!ctx || !ctx->device.ok)
            return stof__fail(ctx, STOF_ERR_NO_DEVICE,
                              "cannot compile %s: no architecture given and "
                              "no CUDA device to take it from",
                              name);
        arch = ctx->device.arch;
    }
    STOF_CHECK_ARG(ctx, arch_is_real(arch),
                   "arch: \"%s\" is not a real architecture like sm_90 or "
                   "sm_90a (only those give a cubin)",
                   arch);

    const stof_api *a = ctx && ctx->api ? ctx->api : stof__api();
    if (!a->has_nvrtc)
        return stof__fail(ctx, STOF_ERR_NO_DEVICE,
                          "cannot compile %s: NVRTC is not available: %s",
                          name, a->nvrtc_why);

    /* Every other header template, so that #include "x.cuh" works. */
    int n_headers = 0;
    const char **hsrc = malloc((size_t)stof__n_templates * sizeof(*hsrc) + 1);
    const char **hname =
        malloc((size_t)stof__n_templates * sizeof(*hname) + 1);
    /* The fixed options, then one -D per define. */
    enum { N_FIXED = 5 };
    const char **opts = malloc((size_t)(N_FIXED + n_defines) * sizeof(*opts));
    char **dopts = calloc((size_t)n_defines + 1, sizeof(*dopts));
    nvrtcProgram prog = NULL;
    nvrtcResult r;
    char *log = NULL;
    void *bin = NULL;
    size_t n = 0;
    char arch_opt[48];
    int n_opts = 0;
    int st = STOF_OK;
    if (!hsrc || !hname || !opts || !dopts) {
        st = stof__fail(ctx, STOF_ERR_OUT_OF_MEMORY,
                        "out of memory preparing the compile of %s", name);
        goto done;
    }
    for (int i = 0; i < stof__n_templates; i++) {
        const stof_template *t = &stof__templates[i];
        size_t len = strlen(t->name);
        if (t == tpl || len < 4 || strcmp(t->name + len - 4, ".cuh") != 0)
            continue;
        hsrc[n_headers] = t->source;
        hname[n_headers] = t->name;
        n_headers++;
    }

    snprintf(arch_opt, sizeof(arch_opt), "--gpu-architecture=%s", arch);
    opts[n_opts++] = arch_opt;
    opts[n_opts++] = "-std=c++17";
    opts[n_opts++] = "-default-device";
    opts[n_opts++] = "-lineinfo"; /* source lines for profilers; no cost */
    opts[n_opts++] = "-DSTOF_JIT=1";
    for (int i = 0; i < n_defines; i++) {
        size_t len = strlen(defines[i]);
        dopts[i] = malloc(len + 3);
        if (!dopts[i]) {
            st = stof__fail(ctx, STOF_ERR_OUT_OF_MEMORY,
                            "out of memory preparing the compile of %s",
                            name);
            goto done;
        }
        memcpy(dopts[i], "-D", 2);
        memcpy(dopts[i] + 2, defines[i], len + 1);
        opts[n_opts++] = dopts[i];
    }

    r = a->nvrtcCreateProgram(&prog, tpl->source, tpl->name,
                                          n_headers, hsrc, hname);
    if (r != NVRTC_SUCCESS) {
        prog = NULL;
        st = nvrtc_fail(ctx, a, "nvrtcCreateProgram", r, name, arch, defines,
                        n_defines, NULL);
        goto done;
    }
    atomic_fetch_add(&g_compiles, 1);
    r = a->nvrtcCompileProgram(prog, n_opts, opts);
    if (r != NVRTC_SUCCESS) {
        log = program_log(a, prog);
        st = nvrtc_fail(ctx, a, "nvrtcCompileProgram", r, name, arch, defines,
                        n_defines, log);
        goto done;
    }
    r = a->nvrtcGetCUBINSize(prog, &n);
    if (r != NVRTC_SUCCESS) {
        st = nvrtc_fail(ctx, a, "nvrtcGetCUBINSize", r, name, arch, defines,
                        n_defines, NULL);
        goto done;
    }
    if (n == 0) {
        st = stof__fail(ctx, STOF_ERR_NVRTC,
                        "NVRTC compiled %s for %s but produced no cubin",
                        name, arch);
        goto done;
    }
    bin = malloc(n);
    if (!bin) {
        st = stof__fail(ctx, STOF_ERR_OUT_OF_MEMORY,
                        "out of memory for the %zu-byte cubin of %s", n,
                        name);
        goto done;
    }
    r = a->nvrtcGetCUBIN(prog, bin);
    if (r != NVRTC_SUCCESS) {
        free(bin);
        st = nvrtc_fail(ctx, a, "nvrtcGetCUBIN", r, name, arch, defines,
                        n_defines, NULL);
        goto done;
    }
    *cubin = bin;
    *size = n;

done:
    if (prog)
        a->nvrtcDestroyProgram(&prog);
    free(log);
    if (dopts)
        for (int i = 0; i < n_defines; i++)
            free(dopts[i]);
    free(dopts);
    free(opts);
    free(hname);
    free(hsrc);
    return st;
}

int stof__module_load(struct stof_context *ctx, const void *cubin,
                      const char *fn_name, size_t smem_bytes, CUmodule *mod,
                      CUfunction *fn)
{
    if (!ctx)
        return STOF_ERR_INVALID_ARGUMENT;
    STOF_CHECK_ARG(ctx, mod && fn && cubin, "NULL cubin or output pointer");
    *mod = NULL;
    *fn = NULL;
    stof_status st = (stof_status)stof__ctx_push(ctx);
    if (st != STOF_OK)
        return st;
    const stof_api *api = ctx->api;
    CUmodule m = NULL;
    CUfunction f = NULL;
    /* (no device memory for the module, or for its functions when they
     * load lazily at cuModuleGetFunction: STOF_ERR_OUT_OF_MEMORY) */
    STOF_CU_GOTO(ctx, st, fail, api->cuModuleLoadData(&m, cubin));
    STOF_CU_GOTO(ctx, st, fail, api->cuModuleGetFunction(&f, m, fn_name));
    if (smem_bytes > 0)
        STOF_CU_GOTO(ctx, st, fail,
                     api->cuFuncSetAttribute(
                         f, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                         (int)smem_bytes));
    stof__ctx_pop(ctx);
    *mod = m;
    *fn = f;
    return stof__ok(ctx);
fail:
    if (m)
        api->cuModuleUnload(m);
    stof__ctx_pop(ctx);
    return st;
}

/* --- the module cache ------------------------------------------------------ */

/* Modules by content (XXH3 of the cubin and its size), each with the
 * kernels asked of it by name and the dynamic shared memory limit set on
 * each. A preloaded module (stof__module_preload) comes in with every
 * kernel it has, loaded, and no limit set yet. */
#define MODCACHE_MAX STOF_MODCACHE_MAX
#define MODCACHE_FNS 8

typedef struct modcache_fn {
    char name[64];
    CUfunction fn;
    size_t smem; /* the limit set on it (0: none) */
} modcache_fn;

typedef struct modcache_entry {
    uint64_t hash;
    size_t size;
    CUmodule mod;
    modcache_fn f[MODCACHE_FNS];
    int n_fn;
    int refs;
    uint64_t tick; /* last use */
} modcache_entry;

struct stof_modcache {
    pthread_mutex_t mu;
    modcache_entry e[MODCACHE_MAX];
    int n;
    uint64_t tick;
    long loads, preloads;
};

static struct stof_modcache *modcache(struct stof_context *ctx)
{
    if (!ctx->modcache) {
        struct stof_modcache *c = calloc(1, sizeof(*c));
        if (!c || pthread_mutex_init(&c->mu, NULL) != 0) {
            free(c);
            return NULL;
        }
        ctx->modcache = c;
    }
    return ctx->modcache;
}

static modcache_entry *cache_find(struct stof_modcache *c, uint64_t hash,
                                  size_t size)
{
    for (int i = 0; i < c->n; i++)
        if (c->e[i].hash == hash && c->e[i].size == size)
            return &c->e[i];
    return NULL;
}

static modcache_fn *entry_fn(modcache_entry *e, const char *name)
{
    for (int i = 0; i < e->n_fn; i++)
        if (strcmp(e->f[i].name, name) == 0)
            return &e->f[i];
    return NULL;
}

/* Put module `mod` (with the n kernels of f) into the cache, evicting the
 * least recently used module nobody holds when it is full; holds = 1 takes
 * a reference. Called locked; returns the module to unload (evicted), or
 * `mod` itself when every slot is held (the caller keeps it alone). */
static CUmodule cache_insert(struct stof_modcache *c, uint64_t hash,
                             size_t size, CUmodule mod, const modcache_fn *f,
                             int n, int holds)
{
    int slot = c->n < MODCACHE_MAX ? c->n : -1;
    if (slot < 0)
        for (int i = 0; i < c->n; i++)
            if (c->e[i].refs == 0 &&
                (slot < 0 || c->e[i].tick < c->e[slot].tick))
                slot = i;
    if (slot < 0)
        return mod;
    modcache_entry *e = &c->e[slot];
    CUmodule evict = slot < c->n ? e->mod : NULL;
    if (slot == c->n)
        c->n++;
    memset(e, 0, sizeof(*e));
    e->hash = hash;
    e->size = size;
    e->mod = mod;
    e->n_fn = n < MODCACHE_FNS ? n : MODCACHE_FNS;
    memcpy(e->f, f, (size_t)e->n_fn * sizeof(*f));
    e->refs = holds;
    e->tick = ++c->tick;
    return evict;
}

static void unload(struct stof_context *ctx, CUmodule mod)
{
    if (mod && stof__ctx_push(ctx) == STOF_OK) {
        ctx->api->cuModuleUnload(mod);
        stof__ctx_pop(ctx);
    }
}

/* Kernel `name` of cached module e (held by the caller), with its shared
 * memory limit at least smem_bytes: looked up or raised outside the lock. */
static int cached_kernel(struct stof_context *ctx, struct stof_modcache *c,
                         modcache_entry *e, const char *name,
                         size_t smem_bytes, CUfunction *fn)
{
    pthread_mutex_lock(&c->mu);
    modcache_fn *f = entry_fn(e, name);
    CUfunction got = f ? f->fn : NULL;
    const int ready = f && f->smem >= smem_bytes;
    CUmodule mod = e->mod;
    pthread_mutex_unlock(&c->mu);
    if (ready) {
        *fn = got;
        return stof__ok(ctx);
    }
    stof_status st = (stof_status)stof__ctx_push(ctx);
    if (st != STOF_OK)
        return st;
    const stof_api *api = ctx->api;
    if (!got)
        STOF_CU_GOTO(ctx, st, done, api->cuModuleGetFunction(&got, mod, name));
    /* The kernel is shared: its limit is only ever raised (a kernel the
     * entry has no room to record asks the driver what it is). */
    int have = f ? (int)f->smem : 0;
    if (!f && smem_bytes > 0)
        STOF_CU_GOTO(ctx, st, done,
                     api->cuFuncGetAttribute(
                         &have, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                         got));
    if (smem_bytes > (size_t)have)
        STOF_CU_GOTO(ctx, st, done,
                     api->cuFuncSetAttribute(
                         got, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                         (int)smem_bytes));
    pthread_mutex_lock(&c->mu);
    if (!(f = entry_fn(e, name)) && e->n_fn < MODCACHE_FNS) {
        f = &e->f[e->n_fn++];
        snprintf(f->name, sizeof(f->name), "%s", name);
        f->fn = got;
        f->smem = 0;
    }
    if (f && f->smem < smem_bytes)
        f->smem = smem_bytes;
    pthread_mutex_unlock(&c->mu);
    *fn = got;
    st = STOF_OK;
done:
    stof__ctx_pop(ctx);
    return st == STOF_OK ? stof__ok(ctx) : st;
}

int stof__module_load_shared(struct stof_context *ctx, const void *cubin,
                             size_t size, const char *fn_name,
                             size_t smem_bytes, CUmodule *mod, CUfunction *fn)
{
    return stof__module_load_shared_hashed(ctx, cubin, size, 0, fn_name,
                                           smem_bytes, mod, fn);
}

int stof__module_load_shared_hashed(struct stof_context *ctx,
                                    const void *cubin, size_t size,
                                    uint64_t hash, const char *fn_name,
                                    size_t smem_bytes, CUmodule *mod,
                                    CUfunction *fn)
{
    if (!ctx)
        return STOF_ERR_INVALID_ARGUMENT;
    STOF_CHECK_ARG(ctx, mod && fn && fn_name && (cubin || (hash && size)),
                   "NULL cubin (without its hash), name or output pointer");
    struct stof_modcache *c = modcache(ctx);
    if (!c || !size || strlen(fn_name) >= sizeof(c->e[0].f[0].name))
        return cubin ? stof__module_load(ctx, cubin, fn_name, smem_bytes, mod,
                                         fn)
                     : STOF_ERR_NOT_FOUND; /* (no cache to find it in) */
    if (!hash)
        hash = XXH3_64bits(cubin, size);
    pthread_mutex_lock(&c->mu);
    modcache_entry *e = cache_find(c, hash, size);
    if (e) {
        e->refs++; /* held while its kernel is looked up */
        e->tick = ++c->tick;
        CUmodule m = e->mod;
        pthread_mutex_unlock(&c->mu);
        int st = cached_kernel(ctx, c, e, fn_name, smem_bytes, fn);
        if (st != STOF_OK) {
            stof__module_release(ctx, m);
            return st;
        }
        *mod = m;
        return STOF_OK;
    }
    pthread_mutex_unlock(&c->mu);
    if (!cubin)
        return STOF_ERR_NOT_FOUND; /* (the caller reads the cubin) */
    int st = stof__module_load(ctx, cubin, fn_name, smem_bytes, mod, fn);
    if (st != STOF_OK)
        return st;
    modcache_fn f;
    memset(&f, 0, sizeof(f));
    snprintf(f.name, sizeof(f.name), "%s", fn_name);
    f.fn = *fn;
    f.smem = smem_bytes;
    pthread_mutex_lock(&c->mu);
    c->loads++;
    /* (every slot held: the module stays the caller's alone, and
     * stof__module_release unloads it) */
    CUmodule evict = cache_insert(c, hash, size, *mod, &f, 1, 1);
    pthread_mutex_unlock(&c->mu);
    if (evict != *mod)
        unload(ctx, evict);
    return stof__ok(ctx);
}

int stof__module_preload(struct stof_context *ctx,
                         const stof_module_enum *en, const void *cubin,
                         size_t size, int *loaded)
{
    if (loaded)
        *loaded = 0;
    if (!ctx)
        return STOF_ERR_INVALID_ARGUMENT;
    STOF_CHECK_ARG(ctx, en && cubin && size && loaded,
                   "NULL entry points, cubin or output, or an empty cubin");
    struct stof_modcache *c = modcache(ctx);
    if (!c)
        return stof__fail(ctx, STOF_ERR_OUT_OF_MEMORY,
                          "out of memory for the module cache");
    const uint64_t hash = XXH3_64bits(cubin, size);
    pthread_mutex_lock(&c->mu);
    const int have = cache_find(c, hash, size) != NULL;
    pthread_mutex_unlock(&c->mu);
    if (have)
        return stof__ok(ctx);
    stof_status st = (stof_status)stof__ctx_push(ctx);
    if (st != STOF_OK)
        return st;
    const stof_api *api = ctx->api;
    CUmodule m = NULL;
    CUfunction fns[MODCACHE_FNS];
    modcache_fn f[MODCACHE_FNS];
    unsigned n = 0;
    memset(f, 0, sizeof(f));
    STOF_CU_GOTO(ctx, st, fail, api->cuModuleLoadData(&m, cubin));
    STOF_CU_GOTO(ctx, st, fail, en->count(&n, m));
    if (n > MODCACHE_FNS) /* (the others are looked up when asked for) */
        n = MODCACHE_FNS;
    if (n)
        STOF_CU_GOTO(ctx, st, fail, en->list(fns, n, m));
    for (unsigned i = 0; i < n; i++) {
        const char *name = NULL;
        STOF_CU_GOTO(ctx, st, fail, en->name(&name, fns[i]));
        STOF_CU_GOTO(ctx, st, fail, en->load(fns[i]));
        snprintf(f[i].name, sizeof(f[i].name), "%s", name ? name : "");
        f[i].fn = fns[i];
    }
    stof__ctx_pop(ctx);
    pthread_mutex_lock(&c->mu);
    CUmodule evict = cache_insert(c, hash, size, m, f, (int)n, 0);
    if (evict != m)
        c->preloads++;
    pthread_mutex_unlock(&c->mu);
    unload(ctx, evict); /* (or m itself: every slot held) */
    *loaded = evict != m;
    return stof__ok(ctx);
fail:
    if (m)
        api->cuModuleUnload(m);
    stof__ctx_pop(ctx);
    return st;
}

int stof__modcache_room(struct stof_context *ctx)
{
    struct stof_modcache *c = ctx ? modcache(ctx) : NULL;
    if (!c)
        return 0;
    pthread_mutex_lock(&c->mu);
    int held = 0;
    for (int i = 0; i < c->n; i++)
        held += c->e[i].refs > 0;
    pthread_mutex_unlock(&c->mu);
    return MODCACHE_MAX - held;
}

int stof__module_cached(struct stof_context *ctx, uint64_t hash, size_t size)
{
    struct stof_modcache *c = ctx ? ctx->modcache : NULL;
    if (!c || !hash || !size)
        return 0;
    pthread_mutex_lock(&c->mu);
    const int have = cache_find(c, hash, size) != NULL;
    pthread_mutex_unlock(&c->mu);
    return have;
}

void stof__module_touch(struct stof_context *ctx, uint64_t hash, size_t size)
{
    struct stof_modcache *c = ctx ? ctx->modcache : NULL;
    if (!c)
        return;
    pthread_mutex_lock(&c->mu);
    modcache_entry *e = cache_find(c, hash, size);
    if (e)
        e->tick = ++c->tick;
    pthread_mutex_unlock(&c->mu);
}

int stof__module_retain(struct stof_context *ctx, CUmodule mod)
{
    struct stof_modcache *c = ctx && mod ? ctx->modcache : NULL;
    if (!c)
        return 0;
    int held = 0;
    pthread_mutex_lock(&c->mu);
    for (int i = 0; i < c->n && !held; i++)
        if (c->e[i].mod == mod) {
            c->e[i].refs++;
            held = 1;
        }
    pthread_mutex_unlock(&c->mu);
    return held;
}

void stof__module_release(struct stof_context *ctx, CUmodule mod)
{
    if (!ctx || !mod)
        return;
    struct stof_modcache *c = ctx->modcache;
    if (c) {
        pthread_mutex_lock(&c->mu);
        for (int i = 0; i < c->n; i++)
            if (c->e[i].mod == mod) {
                if (c->e[i].refs > 0)
                    c->e[i].refs--;
                pthread_mutex_unlock(&c->mu);
                return;
            }
        pthread_mutex_unlock(&c->mu);
    }
    unload(ctx, mod);
}

void stof__modcache_close(struct stof_context *ctx)
{
    struct stof_modcache *c = ctx ? ctx->modcache : NULL;
    if (!c)
        return;
    if (c->n && stof__ctx_push(ctx) == STOF_OK) {
        for (int i = 0; i < c->n; i++)
            ctx->api->cuModuleUnload(c->e[i].mod);
        stof__ctx_pop(ctx);
    }
    pthread_mutex_destroy(&c->mu);
    free(c);
    ctx->modcache = NULL;
}

long stof__module_shared_loads(const struct stof_context *ctx)
{
    return ctx && ctx->modcache ? ctx->modcache->loads : 0;
}

long stof__module_preloads(const struct stof_context *ctx)
{
    return ctx && ctx->modcache ? ctx->modcache->preloads : 0;
}
