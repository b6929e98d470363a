/*
 * cuda_shim.c - load libcuda and libnvrtc at run time into one function
 * table (see cuda_shim.h), and turn failed driver calls into messages.
 *
 * Nothing links against either library: a machine without a driver or
 * without the toolkit still runs everything that does not need them, and
 * the reason a half is missing is kept in the table for error messages.
 */
#include "internal.h"

#include <dlfcn.h>
#include <stdatomic.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Stringify after macro expansion: cuda.h maps many driver names to their
 * versioned ABI symbols (cuMemAlloc -> cuMemAlloc_v2), and dlsym must look
 * up the symbol that matches the prototype we call through. */
#define STOF__STR2(x) #x
#define STOF__STR(x) STOF__STR2(x)

/* The table's pointer types must match cuda.h / nvrtc.h exactly; a
 * mismatch in cuda_shim.h would otherwise be a silent ABI bug. */
#if defined(__GNUC__)
#define STOF__CHECK_PROTO(name, ret, args)                                     \
    _Static_assert(__builtin_types_compatible_p(__typeof__(&name),             \
                                                ret(*) args),                  \
                   "cuda_shim.h: the type of " #name " differs from the "      \
                   "CUDA headers");
STOF__CU_FN(STOF__CHECK_PROTO)
STOF__NVRTC_FN(STOF__CHECK_PROTO)
#undef STOF__CHECK_PROTO
#endif

_Static_assert(sizeof(void *) == sizeof(void (*)(void)),
               "function pointers must fit in void * for dlsym");

static stof_api g_loaded;
static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static const stof_api *g_override;
/* The NVRTC builtins library preloaded next to libnvrtc (kept open). */
static void *g_nvrtc_builtins;

/* Append "what: detail" (or "detail" when what is NULL) to a reason
 * buffer, separated by "; ". */
static void why_append(char *why, size_t n, const char *what,
                       const char *detail)
{
    size_t len = strlen(why);
    if (len + 1 >= n)
        return;
    snprintf(why + len, n - len, "%s%s%s%s", len ? "; " : "",
             what ? what : "", what ? ": " : "",
             detail ? detail : "unknown error");
}

/* dlopen `path`; on failure record dlerror() in `why`. */
static void *try_open(const char *path, char *why, size_t n)
{
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!h)
        why_append(why, n, NULL, dlerror()); /* dlerror names the path */
    return h;
}

/* Store a dlsym result into a function-pointer field without the
 * object-to-function pointer conversion that ISO C leaves undefined. */
#define STOF__SET_FN(field, ptr) memcpy(&(field), &(ptr), sizeof(void *))

/* ---------------------------------------------------------------- libcuda */

typedef CUresult (*proc_address_fn)(const char *, void **, int, cuuint64_t,
                                    CUdriverProcAddressQueryResult *);
#if defined(__GNUC__)
_Static_assert(__builtin_types_compatible_p(__typeof__(&cuGetProcAddress),
                                            proc_address_fn),
               "cuGetProcAddress differs from the CUDA headers");
#endif

/* Resolve a driver entry point: first the ABI name that cuda.h maps the
 * call to, then (for drivers that lack that version) cuGetProcAddress with
 * the base name and the header's CUDA_VERSION. */
static void *cu_sym(void *lib, proc_address_fn gpa, const char *abi,
                    const char *base)
{
    void *p = dlsym(lib, abi);
    if (p || !gpa)
        return p;
    CUdriverProcAddressQueryResult q = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
    void *f = NULL;
    if (gpa(base, &f, CUDA_VERSION, CU_GET_PROC_ADDRESS_LEGACY_STREAM, &q) ==
            CUDA_SUCCESS &&
        q == CU_GET_PROC_ADDRESS_SUCCESS)
        return f;
    return NULL;
}

static void load_cuda(stof_api *a)
{
    const char *env = getenv("STOF_LIBCUDA");
    void *lib = NULL;
    if (env && *env) {
        /* An explicit choice is exclusive: silently using another driver
         * would hide the mistake (and "STOF_LIBCUDA=none" disables CUDA). */
        lib = try_open(env, a->cuda_why, sizeof(a->cuda_why));
    } else {
        static const char *const names[] = {"libcuda.so.1", "libcuda.so"};
        for (size_t i = 0; !lib && i < sizeof(names) / sizeof(names[0]); i++)
            lib = try_open(names[i], a->cuda_why, sizeof(a->cuda_why));
    }
    if (!lib)
        return;
    a->cuda_why[0] = '\0';

    proc_address_fn gpa = NULL;
    void *g = dlsym(lib, STOF__STR(cuGetProcAddress));
    STOF__SET_FN(gpa, g);

    const char *missing = NULL;
#define STOF__LOAD_CU(name, ret, args)                                         \
    if (!missing) {                                                            \
        void *p_ = cu_sym(lib, gpa, STOF__STR(name), #name);                   \
        if (p_)                                                                \
            STOF__SET_FN(a->name, p_);                                         \
        else                                                                   \
            missing = STOF__STR(name);                                         \
    }
    STOF__CU_FN(STOF__LOAD_CU)
#undef STOF__LOAD_CU
    if (missing) {
        const char *e = dlerror();
        Dl_info info;
        const char *path = env && *env ? env : "libcuda";
        if (g && dladdr(g, &info) && info.dli_fname)
            path = info.dli_fname;
        snprintf(a->cuda_why, sizeof(a->cuda_why),
                 "%s lacks the driver entry point %s (%s); the driver is "
                 "too old for these CUDA %d.%d headers",
                 path, missing, e ? e : "not found", CUDA_VERSION / 1000,
                 CUDA_VERSION % 1000 / 10);
#define STOF__CLEAR(name, ret, args) a->name = NULL;
        STOF__CU_FN(STOF__CLEAR)
#undef STOF__CLEAR
        dlclose(lib);
        return;
    }
    a->cuda_lib = lib;
    a->has_cuda = 1;
}

/* --------------------------------------------------------------- libnvrtc */

/* libnvrtc opens libnvrtc-builtins.so.MAJOR.MINOR by its bare name when it
 * first compiles. When libnvrtc itself came from a toolkit directory that
 * is not on the library path, that lookup would fail; opening the builtins
 * from the same directory first makes the later lookup find the loaded
 * copy by its soname. Harmless when the builtins are found anyway. */
static void preload_builtins(void *lib, int major, int minor)
{
    char dir[PATH_MAX];
    if (dlinfo(lib, RTLD_DI_ORIGIN, dir) != 0)
        return;
    char path[PATH_MAX + 64];
    snprintf(path, sizeof(path), "%s/libnvrtc-builtins.so.%d.%d", dir, major,
             minor);
    if (access(path, R_OK) == 0)
        g_nvrtc_builtins = dlopen(path, RTLD_NOW | RTLD_LOCAL);
}

static void *open_nvrtc(char *why, size_t n)
{
    const char *env = getenv("STOF_LIBNVRTC");
    if (env && *env)
        return try_open(env, why, n); /* exclusive, like STOF_LIBCUDA */

    static const char *const names[] = {"libnvrtc.so.13", "libnvrtc.so.12",
                                        "libnvrtc.so"};
    const size_t nn = sizeof(names) / sizeof(names[0]);
    void *lib = NULL;
    for (size_t i = 0; !lib && i < nn; i++)
        lib = try_open(names[i], why, n);
    /* An application may not have the toolkit on its library path. */
    const char *dirs[2] = {"/usr/local/cuda/lib64", getenv("CUDA_HOME")};
    for (int d = 0; d < 2 && !lib; d++) {
        if (!dirs[d] || !*dirs[d])
            continue;
        const char *sub = d == 0 ? "" : "/lib64";
        for (size_t i = 0; !lib && i < nn; i++) {
            char path[PATH_MAX];
            int len = snprintf(path, sizeof(path), "%s%s/%s", dirs[d], sub,
                               names[i]);
            if (len < 0 || (size_t)len >= sizeof(path))
                continue;
            if (access(path, F_OK) != 0)
                continue; /* keep the reason short: only real candidates */
            lib = try_open(path, why, n);
        }
    }
    return lib;
}

static void load_nvrtc(stof_api *a)
{
    void *lib = open_nvrtc(a->nvrtc_why, sizeof(a->nvrtc_why));
    if (!lib)
        return;
    a->nvrtc_why[0] = '\0';

    const char *missing = NULL;
#define STOF__LOAD_NVRTC(name, ret, args)                                      \
    if (!missing) {                                                            \
        void *p_ = dlsym(lib, STOF__STR(name));                                \
        if (p_)                                                                \
            STOF__SET_FN(a->name, p_);                                         \
        else                                                                   \
            missing = STOF__STR(name);                                         \
    }
    STOF__NVRTC_FN(STOF__LOAD_NVRTC)
#undef STOF__LOAD_NVRTC
    int major = 0, minor = 0;
    if (!missing && a->nvrtcVersion(&major, &minor) != NVRTC_SUCCESS)
        missing = "nvrtcVersion (call failed)";
    if (missing) {
        const char *e = dlerror();
        char path[PATH_MAX] = "libnvrtc";
        dlinfo(lib, RTLD_DI_ORIGIN, path);
        snprintf(a->nvrtc_why, sizeof(a->nvrtc_why),
                 "libnvrtc in %.200s lacks %s (%.200s)", path, missing,
                 e ? e : "not found");
#define STOF__CLEAR(name, ret, args) a->name = NULL;
        STOF__NVRTC_FN(STOF__CLEAR)
#undef STOF__CLEAR
        dlclose(lib);
        return;
    }
    preload_builtins(lib, major, minor);
    a->nvrtc_lib = lib;
    a->has_nvrtc = 1;
}

static void load_all(void)
{
    load_cuda(&g_loaded);
    load_nvrtc(&g_loaded);
}

const stof_api *stof__api(void)
{
    const stof_api *o = __atomic_load_n(&g_override, __ATOMIC_ACQUIRE);
    if (o)
        return o;
    pthread_once(&g_once, load_all);
    return &g_loaded;
}

void stof__api_override(const stof_api *api)
{
    __atomic_store_n(&g_override, api, __ATOMIC_RELEASE);
}

/* ----------------------------------------------------------------- errors */

/* Drop the "../" that out-of-tree builds put in front of __FILE__, so that
 * messages say "src/attention.c". */
static const char *short_path(const char *file)
{
    if (!file)
        return "?";
    while (strncmp(file, "../", 3) == 0 || strncmp(file, "./", 2) == 0)
        file += file[1] == '/' ? 2 : 3;
    return file;
}

int stof__cuda_fail(struct stof_context *ctx, CUresult r, const char *what,
                    const char *file, int line)
{
    const stof_api *a = ctx && ctx->api ? ctx->api : stof__api();
    const char *name = NULL, *text = NULL;
    if (a->cuGetErrorName && a->cuGetErrorName(r, &name) != CUDA_SUCCESS)
        name = NULL;
    if (a->cuGetErrorString && a->cuGetErrorString(r, &text) != CUDA_SUCCESS)
        text = NULL;
    char num[32];
    if (!name) {
        snprintf(num, sizeof(num), "CUresult %d", (int)r);
        name = num;
    }
    /* Device memory exhausted: the host's state, not a fault (callers
     * tell it apart: a database record that cannot load or be checked for
     * it is still a good record). */
    const stof_status st = r == CUDA_ERROR_OUT_OF_MEMORY
                               ? STOF_ERR_OUT_OF_MEMORY
                               : STOF_ERR_CUDA;
    if (text)
        return stof__fail(ctx, st, "%s failed: %s (%s) at %s:%d",
                          what ? what : "CUDA call", name, text,
                          short_path(file), line);
    return stof__fail(ctx, st, "%s failed: %s at %s:%d",
                      what ? what : "CUDA call", name, short_path(file), line);
}

/* An entry point of libcuda that the table does not hold: from the
 * library `api` loaded or, when the table was swapped, whichever libcuda
 * the process already has. NULL when neither has it. */
static void *cuda_optional(const stof_api *api, const char *name)
{
    void *sym = NULL;
    if (api && api->cuda_lib)
        sym = dlsym(api->cuda_lib, name);
    if (!sym) {
        void *h = dlopen("libcuda.so.1", RTLD_NOLOAD | RTLD_NOW);
        if (h) {
            sym = dlsym(h, name);
            dlclose(h); /* NOLOAD took a reference; the library stays */
        }
    }
    return sym;
}

/* The optional entry point `name` of type `type`, cached after the first
 * success in `cached` (dlsym returns data pointers; POSIX guarantees the
 * conversion). */
#define STOF__OPTIONAL(type, cached, api, name)                                \
    do {                                                                       \
        type f_ = atomic_load(&(cached));                                      \
        if (f_)                                                                \
            return f_;                                                         \
        void *sym_ = cuda_optional((api), (name));                             \
        if (!sym_)                                                             \
            return NULL;                                                       \
        memcpy(&f_, &sym_, sizeof(f_));                                        \
        atomic_store(&(cached), f_);                                           \
        return f_;                                                             \
    } while (0)

stof_encode_tiled_fn stof__encode_tiled(const stof_api *api)
{
    static _Atomic(stof_encode_tiled_fn) cached;
    STOF__OPTIONAL(stof_encode_tiled_fn, cached, api,
                   "cuTensorMapEncodeTiled");
}

stof_launch_ex_fn stof__launch_ex(const stof_api *api)
{
    static _Atomic(stof_launch_ex_fn) cached;
    STOF__OPTIONAL(stof_launch_ex_fn, cached, api, STOF__STR(cuLaunchKernelEx));
}

/* cuStreamGetCaptureInfo_v2's type (CUDA 11.3's), spelled here: newer
 * headers map the name to later versions with other parameters. */
typedef CUresult (*capture_info_fn)(CUstream, CUstreamCaptureStatus *,
                                    cuuint64_t *, CUgraph *,
                                    const CUgraphNode **, size_t *);

static capture_info_fn capture_info(const stof_api *api)
{
    static _Atomic(capture_info_fn) cached;
    STOF__OPTIONAL(capture_info_fn, cached, api, "cuStreamGetCaptureInfo_v2");
}

int stof__capture_id(const stof_api *api, CUstream stream,
                     unsigned long long *id)
{
    const capture_info_fn f = capture_info(api);
    CUstreamCaptureStatus cs = CU_STREAM_CAPTURE_STATUS_NONE;
    cuuint64_t got = 0;
    if (!f || f(stream, &cs, &got, NULL, NULL, NULL) != CUDA_SUCCESS ||
        cs != CU_STREAM_CAPTURE_STATUS_ACTIVE)
        return 0;
    *id = (unsigned long long)got;
    return 1;
}

int stof__env_switch(_Atomic int *state, const char *name, int dflt)
{
    int v = atomic_load(state);
    if (v < 0) {
        const char *e = getenv(name);
        v = e && (e[0] == '0' || e[0] == '1') && e[1] == '\0' ? e[0] == '1'
                                                              : dflt;
        int expect = -1;
        if (!atomic_compare_exchange_strong(state, &expect, v))
            v = expect;
    }
    return v;
}

/* -1: not read yet; 0 / 1: STOF_PDL (or stof__pdl_set) decides; 2: the
 * thread's scope does. */
static _Atomic int pdl_state = -1;
static _Thread_local int pdl_thread; /* stof__pdl_scope's choice */

int stof__pdl_for(int choice)
{
    const int v = stof__env_switch(&pdl_state, "STOF_PDL", 2);
    return v == 2 ? choice != 0 : v;
}

int stof__pdl_enabled(void)
{
    return stof__pdl_for(pdl_thread);
}

void stof__pdl_set(int on)
{
    atomic_store(&pdl_state, on < 0 ? 2 : on ? 1 : 0);
}

int stof__pdl_scope(int on)
{
    const int was = pdl_thread;
    pdl_thread = on != 0;
    return was;
}

/* Whether fn was compiled for compute capability 9.0 or later. */
static int fn_sm90(const stof_api *api, CUfunction fn)
{
    int v = 0;
    return api && api->cuFuncGetAttribute && fn &&
           api->cuFuncGetAttribute(&v, CU_FUNC_ATTRIBUTE_BINARY_VERSION,
                                   fn) == CUDA_SUCCESS &&
           v >= 90;
}

void stof__launch_config(CUlaunchConfig *cfg, CUlaunchAttribute at[3],
                         unsigned gx, unsigned gy, unsigned gz,
                         unsigned threads, unsigned smem, CUstream stream,
                         unsigned cluster, int cooperative, int pdl)
{
    memset(at, 0, 3 * sizeof(*at));
    unsigned n = 0;
    if (cluster > 1) {
        at[n].id = CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION;
        at[n].value.clusterDim.x = cluster;
        at[n].value.clusterDim.y = 1;
        at[n].value.clusterDim.z = 1;
        n++;
    }
    if (cooperative) {
        at[n].id = CU_LAUNCH_ATTRIBUTE_COOPERATIVE;
        at[n].value.cooperative = 1;
        n++;
    }
    if (pdl) {
        at[n].id = CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
        at[n].value.programmaticStreamSerializationAllowed = 1;
        n++;
    }
    memset(cfg, 0, sizeof(*cfg));
    cfg->gridDimX = gx;
    cfg->gridDimY = gy;
    cfg->gridDimZ = gz;
    cfg->blockDimX = threads;
    cfg->blockDimY = cfg->blockDimZ = 1;
    cfg->sharedMemBytes = smem;
    cfg->hStream = stream;
    cfg->attrs = at;
    cfg->numAttrs = n;
}

CUresult stof__launch(const stof_api *api, CUfunction fn, unsigned gx,
                      unsigned gy, unsigned gz, unsigned threads,
                      unsigned smem, CUstream stream, void **params,
                      const stof_launch_opts *o)
{
    if (!api || !api->cuLaunchKernel)
        return CUDA_ERROR_NOT_INITIALIZED;
    const unsigned cluster = o && o->cluster > 1 ? o->cluster : 0;
    const int coop = o && o->cooperative;
    stof_launch_ex_fn ex = stof__launch_ex(api);
    const int pdl = o && o->pdl && ex && stof__pdl_enabled() &&
                    (o->pdl != STOF_PDL_IF_SM90 || fn_sm90(api, fn));
    if (!cluster && !coop && !pdl)
        return api->cuLaunchKernel(fn, gx, gy, gz, threads, 1, 1, smem,
                                   stream, params, NULL);
    if (!ex)
        return CUDA_ERROR_NOT_SUPPORTED;
    CUlaunchAttribute at[3];
    CUlaunchConfig cfg;
    stof__launch_config(&cfg, at, gx, gy, gz, threads, smem, stream,
                        cluster, coop, pdl);
    return ex(&cfg, fn, params, NULL);
}

stof_max_clusters_fn stof__max_clusters(const stof_api *api)
{
    static _Atomic(stof_max_clusters_fn) cached;
    STOF__OPTIONAL(stof_max_clusters_fn, cached, api,
                   STOF__STR(cuOccupancyMaxActiveClusters));
}

int stof__module_enum(const stof_api *api, stof_module_enum *e)
{
    static const char *const names[4] = {
        STOF__STR(cuModuleGetFunctionCount),
        STOF__STR(cuModuleEnumerateFunctions), STOF__STR(cuFuncGetName),
        STOF__STR(cuFuncLoad)};
    void *sym[4];
    memset(e, 0, sizeof(*e));
    for (int i = 0; i < 4; i++)
        if (!(sym[i] = cuda_optional(api, names[i])))
            return 0;
    memcpy(&e->count, &sym[0], sizeof(e->count));
    memcpy(&e->list, &sym[1], sizeof(e->list));
    memcpy(&e->name, &sym[2], sizeof(e->name));
    memcpy(&e->load, &sym[3], sizeof(e->load));
    return 1;
}
