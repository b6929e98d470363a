/*
 * blaslt.c - cuBLASLt as a GEMM candidate (see blaslt.h), loaded with
 * dlopen at run time: nothing links against libcublasLt, so a machine
 * without it (or without a driver) runs everything else and gets a clear
 * STOF_ERR_UNSUPPORTED / STOF_ERR_NO_DEVICE from the calls here.
 *
 * Mapping: row-major C[M][N] = epi(A[M][K] W[N][K]^T) is, read column-major,
 * D (N x M, ld ldc) = op(W) (N x K) * A (K x M), with W stored as a K x N
 * column-major matrix (ld ldw, op = T) and A as K x M (ld lda, op = N).
 * The bias is then a vector over D's rows (n), which is what cuBLASLt's
 * BIAS epilogues add. A residual goes in as C (same layout as D) with
 * beta = 1; cuBLASLt adds it before the bias and the activation, so it is
 * only offered without activation (where the order does not matter).
 */
#include "blaslt.h"

/* cublasLt.h declares one function without a prototype (`f()`). */
#if defined(__GNUC__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wstrict-prototypes"
#endif
#include <cublasLt.h>
#if defined(__GNUC__)
#pragma GCC diagnostic pop
#endif

#include <dlfcn.h>
#include <glob.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define STOF__LT_FN(X)                                                         \
    X(cublasLtGetVersion, size_t, (void))                                      \
    X(cublasLtCreate, cublasStatus_t, (cublasLtHandle_t *))                    \
    X(cublasLtDestroy, cublasStatus_t, (cublasLtHandle_t))                     \
    X(cublasLtMatmulDescCreate, cublasStatus_t,                                \
      (cublasLtMatmulDesc_t *, cublasComputeType_t, cudaDataType_t))           \
    X(cublasLtMatmulDescDestroy, cublasStatus_t, (cublasLtMatmulDesc_t))       \
    X(cublasLtMatmulDescSetAttribute, cublasStatus_t,                          \
      (cublasLtMatmulDesc_t, cublasLtMatmulDescAttributes_t, const void *,     \
       size_t))                                                                \
    X(cublasLtMatrixLayoutCreate, cublasStatus_t,                              \
      (cublasLtMatrixLayout_t *, cudaDataType, uint64_t, uint64_t, int64_t))   \
    X(cublasLtMatrixLayoutDestroy, cublasStatus_t, (cublasLtMatrixLayout_t))   \
    X(cublasLtMatmulPreferenceCreate, cublasStatus_t,                          \
      (cublasLtMatmulPreference_t *))                                          \
    X(cublasLtMatmulPreferenceDestroy, cublasStatus_t,                         \
      (cublasLtMatmulPreference_t))                                            \
    X(cublasLtMatmulPreferenceSetAttribute, cublasStatus_t,                    \
      (cublasLtMatmulPreference_t, cublasLtMatmulPreferenceAttributes_t,       \
       const void *, size_t))                                                  \
    X(cublasLtMatmulAlgoGetHeuristic, cublasStatus_t,                          \
      (cublasLtHandle_t, cublasLtMatmulDesc_t, cublasLtMatrixLayout_t,         \
       cublasLtMatrixLayout_t, cublasLtMatrixLayout_t, cublasLtMatrixLayout_t, \
       cublasLtMatmulPreference_t, int, cublasLtMatmulHeuristicResult_t *,     \
       int *))                                                                 \
    X(cublasLtMatmulAlgoGetIds, cublasStatus_t,                                \
      (cublasLtHandle_t, cublasComputeType_t, cudaDataType_t, cudaDataType_t,  \
       cudaDataType_t, cudaDataType_t, cudaDataType_t, int, int *, int *))     \
    X(cublasLtMatmulAlgoConfigGetAttribute, cublasStatus_t,                    \
      (const cublasLtMatmulAlgo_t *, cublasLtMatmulAlgoConfigAttributes_t,     \
       void *, size_t, size_t *))                                              \
    X(cublasLtMatmulAlgoInit, cublasStatus_t,                                  \
      (cublasLtHandle_t, cublasComputeType_t, cudaDataType_t, cudaDataType_t,  \
       cudaDataType_t, cudaDataType_t, cudaDataType_t, int,                    \
       cublasLtMatmulAlgo_t *))                                                \
    X(cublasLtMatmulAlgoCapGetAttribute, cublasStatus_t,                       \
      (const cublasLtMatmulAlgo_t *, cublasLtMatmulAlgoCapAttributes_t,        \
       void *, size_t, size_t *))                                              \
    X(cublasLtMatmulAlgoConfigSetAttribute, cublasStatus_t,                    \
      (cublasLtMatmulAlgo_t *, cublasLtMatmulAlgoConfigAttributes_t,           \
       const void *, size_t))                                                  \
    X(cublasLtMatmulAlgoCheck, cublasStatus_t,                                 \
      (cublasLtHandle_t, cublasLtMatmulDesc_t, cublasLtMatrixLayout_t,         \
       cublasLtMatrixLayout_t, cublasLtMatrixLayout_t, cublasLtMatrixLayout_t, \
       const cublasLtMatmulAlgo_t *, cublasLtMatmulHeuristicResult_t *))       \
    X(cublasLtMatmul, cublasStatus_t,                                          \
      (cublasLtHandle_t, cublasLtMatmulDesc_t, const void *, const void *,     \
       cublasLtMatrixLayout_t, const void *, cublasLtMatrixLayout_t,           \
       const void *, const void *, cublasLtMatrixLayout_t, void *,             \
       cublasLtMatrixLayout_t, const cublasLtMatmulAlgo_t *, void *, size_t,   \
       cudaStream_t))

/* The table's types must match cublasLt.h (a mismatch would be a silent ABI
 * bug). */
#if defined(__GNUC__)
#define STOF__CHECK_LT(name, ret, args)                                        \
    _Static_assert(__builtin_types_compatible_p(__typeof__(&name),             \
                                                ret(*) args),                  \
                   "blaslt.c: the type of " #name " differs from cublasLt.h");
STOF__LT_FN(STOF__CHECK_LT)
#undef STOF__CHECK_LT
#endif

_Static_assert(sizeof(cublasLtMatmulAlgo_t) == STOF_BLASLT_ALGO_BYTES,
               "STOF_BLASLT_ALGO_BYTES differs from cublasLtMatmulAlgo_t");
/* CUstream and cudaStream_t are the same handle type. */
_Static_assert(sizeof(CUstream) == sizeof(cudaStream_t), "stream handles");

typedef struct lt_api {
    int ok;
    void *lib;
    size_t version;
    char path[512];
    char why[2048];
    /* Optional: absent in some versions. */
    const char *(*cublasLtGetStatusName)(cublasStatus_t);
    const char *(*cublasLtGetStatusString)(cublasStatus_t);
#define STOF__LT_PTR(name, ret, args) ret(*name) args;
    STOF__LT_FN(STOF__LT_PTR)
#undef STOF__LT_PTR
} lt_api;

static lt_api g_lt;
static pthread_once_t g_lt_once = PTHREAD_ONCE_INIT;

#define STOF__SET_FN(field, ptr) memcpy(&(field), &(ptr), sizeof(void *))

static void why_append(const char *fmt_what, const char *detail)
{
    size_t len = strlen(g_lt.why);
    if (len + 1 >= sizeof(g_lt.why))
        return;
    snprintf(g_lt.why + len, sizeof(g_lt.why) - len, "%s%s%s%s",
             len ? "; " : "", fmt_what ? fmt_what : "", fmt_what ? ": " : "",
             detail ? detail : "unknown error");
}

/* dlopen `path` and resolve the table into `a`. 1 on success; else 0 with
 * the reason appended to g_lt.why and nothing left open. */
static int lt_try(const char *path, lt_api *a)
{
    void *lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        why_append(NULL, dlerror());
        return 0;
    }
    memset(a, 0, sizeof(*a));
    const char *missing = NULL;
#define STOF__LOAD_LT(name, ret, args)                                         \
    if (!missing) {                                                            \
        void *p_ = dlsym(lib, #name);                                          \
        if (p_)                                                                \
            STOF__SET_FN(a->name, p_);                                         \
        else                                                                   \
            missing = #name;                                                   \
    }
    STOF__LT_FN(STOF__LOAD_LT)
#undef STOF__LOAD_LT
    if (missing) {
        why_append(path, "lacks the entry point");
        why_append(NULL, missing);
        dlclose(lib);
        return 0;
    }
    void *p = dlsym(lib, "cublasLtGetStatusName");
    if (p)
        STOF__SET_FN(a->cublasLtGetStatusName, p);
    p = dlsym(lib, "cublasLtGetStatusString");
    if (p)
        STOF__SET_FN(a->cublasLtGetStatusString, p);
    a->lib = lib;
    a->version = a->cublasLtGetVersion();
    /* The file actually loaded (a bare soname resolves somewhere). */
    Dl_info info;
    const char *where = path;
    void *sym = dlsym(lib, "cublasLtCreate");
    if (sym && dladdr(sym, &info) && info.dli_fname)
        where = info.dli_fname;
    snprintf(a->path, sizeof(a->path), "%s", where);
    return 1;
}

/* The driver's CUDA major version, or 0 when unknown (no driver). */
static int driver_major(void)
{
    const stof_api *api = stof__api();
    int v = 0;
    if (!api || !api->has_cuda || !api->cuDriverGetVersion ||
        api->cuDriverGetVersion(&v) != CUDA_SUCCESS)
        return 0;
    return v / 1000;
}

/* Try `path`; keep it when its major version can run on the driver
 * (cuBLAS 13 needs a CUDA 13 driver, 12 a CUDA 12 one; minor versions are
 * compatible). */
static int lt_accept(const char *path, int drv)
{
    lt_api a;
    if (!lt_try(path, &a))
        return 0;
    int major = (int)(a.version / 10000);
    if (drv && major > drv) {
        char msg[160];
        snprintf(msg, sizeof(msg),
                 "version %zu needs a CUDA %d driver, this one is CUDA %d",
                 a.version, major, drv);
        why_append(path, msg);
        dlclose(a.lib);
        return 0;
    }
    char why[sizeof(g_lt.why)];
    memcpy(why, g_lt.why, sizeof(why));
    g_lt = a;
    memcpy(g_lt.why, why, sizeof(why));
    g_lt.ok = 1;
    return 1;
}

/* Try every file matching `pattern`, the newest-looking name first (glob
 * sorts ascending, so libcublasLt.so.13 comes after libcublasLt.so.12). */
static int lt_accept_glob(const char *pattern, int drv)
{
    glob_t gl;
    memset(&gl, 0, sizeof(gl));
    if (glob(pattern, 0, NULL, &gl) != 0) {
        globfree(&gl);
        return 0;
    }
    int ok = 0;
    for (size_t i = gl.gl_pathc; !ok && i > 0; i--)
        ok = lt_accept(gl.gl_pathv[i - 1], drv);
    globfree(&gl);
    return ok;
}

static void lt_load(void)
{
    int drv = driver_major();
    const char *env = getenv("STOF_LIBCUBLASLT");
    if (env && *env) {
        /* An explicit choice is exclusive ("none" disables cuBLASLt). */
        if (!lt_accept(env, drv))
            why_append("STOF_LIBCUBLASLT", env);
        return;
    }
    static const char *const names[] = {
        "libcublasLt.so.13", "libcublasLt.so.12", "libcublasLt.so"};
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++)
        if (lt_accept(names[i], drv))
            return;
    /* The toolkit, then the NVIDIA wheels that PyTorch installs (cu13 keeps
     * every library in nvidia/cu13/lib, cu12 in nvidia/cublas/lib). */
    static const char *const globs[] = {
        "/usr/local/cuda/lib64/libcublasLt.so*",
        "/usr/local/cuda/targets/*/lib/libcublasLt.so*",
        "/usr/local/cuda-*/lib64/libcublasLt.so*",
        "/usr/local/lib/python3*/dist-packages/nvidia/*/lib/libcublasLt.so*",
        "/usr/local/lib/python3*/site-packages/nvidia/*/lib/libcublasLt.so*",
        "/usr/lib/python3*/dist-packages/nvidia/*/lib/libcublasLt.so*",
        "/usr/lib/python3*/site-packages/nvidia/*/lib/libcublasLt.so*",
        "/usr/lib64/python3*/site-packages/nvidia/*/lib/libcublasLt.so*",
        "/opt/conda/lib/python3*/site-packages/nvidia/*/lib/libcublasLt.so*",
        "/opt/*/.venv/lib/python3*/site-packages/nvidia/*/lib/libcublasLt.so*",
        "/opt/*/lib/python3*/site-packages/nvidia/*/lib/libcublasLt.so*",
        "/opt/conda/lib/libcublasLt.so*",
    };
    for (size_t i = 0; i < sizeof(globs) / sizeof(globs[0]); i++)
        if (lt_accept_glob(globs[i], drv))
            return;
    /* Per-user and environment prefixes. */
    static const char *const envs[] = {"VIRTUAL_ENV", "CONDA_PREFIX", "HOME"};
    for (size_t i = 0; i < sizeof(envs) / sizeof(envs[0]); i++) {
        const char *root = getenv(envs[i]);
        if (!root || !*root)
            continue;
        char pat[1024];
        snprintf(pat, sizeof(pat),
                 "%s%s/lib/python3*/site-packages/nvidia/*/lib/"
                 "libcublasLt.so*",
                 root, i == 2 ? "/.local" : "");
        if (lt_accept_glob(pat, drv))
            return;
        if (i == 1) {
            snprintf(pat, sizeof(pat), "%s/lib/libcublasLt.so*", root);
            if (lt_accept_glob(pat, drv))
                return;
        }
    }
    why_append(NULL, "no usable libcublasLt found (set STOF_LIBCUBLASLT)");
}

static const lt_api *lt(void)
{
    pthread_once(&g_lt_once, lt_load);
    return g_lt.ok ? &g_lt : NULL;
}

int stof__blaslt_available(char *why, size_t n)
{
    const lt_api *a = lt();
    if (why && n) {
        if (a)
            snprintf(why, n, "%s (cuBLASLt %zu)", a->path, a->version);
        else
            snprintf(why, n, "%s", g_lt.why);
    }
    return a != NULL;
}

size_t stof__blaslt_version(void)
{
    const lt_api *a = lt();
    return a ? a->version : 0;
}

const char *stof__blaslt_path(void)
{
    const lt_api *a = lt();
    return a ? a->path : "";
}

int stof__blaslt_epi_ok(const stof_gemm_epi *e)
{
    if (!e)
        return 0;
    if (e->norm || e->write_pre || e->gated || e->rope)
        return 0;
    if (e->act != STOF_ACT_NONE && e->act != STOF_ACT_GELU_TANH &&
        e->act != STOF_ACT_RELU)
        return 0;
    /* cuBLASLt adds C before the epilogue: act(acc + residual + bias). */
    if (e->residual && e->act != STOF_ACT_NONE)
        return 0;
    return 1;
}

/* ------------------------------------------------------------------------ */

struct stof_blaslt_gemm {
    const lt_api *lt;
    const stof_api *api;
    CUcontext pctx;
    cublasLtHandle_t h;
    cublasLtMatmulDesc_t op;
    cublasLtMatrixLayout_t lw, la, lc; /* W^T (K x N), A (K x M), C/D */
    stof_dtype dt;
    int M, N, K;
    int64_t lda, ldw, ldc;
    stof_gemm_epi e;
    int n_algos;
    cublasLtMatmulAlgo_t *algos;
    size_t *ws_need; /* each algorithm's workspace (bytes), as cuBLASLt
                      * reported it */
    /* Held from setting the bias pointer (part of the descriptor) to the
     * enqueue, so that threads running one gemm do not mix pointers. */
    pthread_mutex_t run_lock;
    int lock_ok;
};

static const char *lt_status_name(const lt_api *a, cublasStatus_t s)
{
    const char *n = a && a->cublasLtGetStatusName ? a->cublasLtGetStatusName(s)
                                                   : NULL;
    return n ? n : "CUBLAS_STATUS_?";
}

static stof_status lt_fail(stof_context *ctx, const lt_api *a,
                           cublasStatus_t s, const char *what,
                           stof_status st)
{
    const char *text =
        a && a->cublasLtGetStatusString ? a->cublasLtGetStatusString(s) : NULL;
    return stof__fail(ctx, st, "cuBLASLt: %s failed: %s (%d)%s%s", what,
                      lt_status_name(a, s), (int)s, text ? ": " : "",
                      text ? text : "");
}

/* Run a cuBLASLt call; on failure record it and jump to `out`. */
#define LT_CALL(st_, code_, call_)                                             \
    do {                                                                       \
        cublasStatus_t r_ = (call_);                                           \
        if (r_ != CUBLAS_STATUS_SUCCESS) {                                     \
            (st_) = lt_fail(ctx, a, r_, #call_, (code_));                      \
            goto out;                                                          \
        }                                                                      \
    } while (0)

static cudaDataType_t lt_type(stof_dtype dt)
{
    return dt == STOF_DTYPE_BF16 ? CUDA_R_16BF : CUDA_R_16F;
}

static cublasLtEpilogue_t lt_epilogue(const stof_gemm_epi *e)
{
    switch (e->act) {
    case STOF_ACT_GELU_TANH:
        return e->bias ? CUBLASLT_EPILOGUE_GELU_BIAS : CUBLASLT_EPILOGUE_GELU;
    case STOF_ACT_RELU:
        return e->bias ? CUBLASLT_EPILOGUE_RELU_BIAS : CUBLASLT_EPILOGUE_RELU;
    default:
        return e->bias ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT;
    }
}

void stof__blaslt_free(stof_blaslt_gemm **gp)
{
    if (!gp || !*gp)
        return;
    stof_blaslt_gemm *g = *gp;
    const lt_api *a = g->lt;
    int pushed = g->pctx && g->api && g->api->cuCtxPushCurrent &&
                 g->api->cuCtxPushCurrent(g->pctx) == CUDA_SUCCESS;
    if (a) {
        if (g->lw)
            a->cublasLtMatrixLayoutDestroy(g->lw);
        if (g->la)
            a->cublasLtMatrixLayoutDestroy(g->la);
        if (g->lc)
            a->cublasLtMatrixLayoutDestroy(g->lc);
        if (g->op)
            a->cublasLtMatmulDescDestroy(g->op);
        if (g->h)
            a->cublasLtDestroy(g->h);
    }
    if (pushed) {
        CUcontext c = NULL;
        g->api->cuCtxPopCurrent(&c);
    }
    if (g->lock_ok)
        pthread_mutex_destroy(&g->run_lock);
    free(g->algos);
    free(g->ws_need);
    free(g);
    *gp = NULL;
}

stof_status stof__blaslt_create(stof_context *ctx, stof_dtype dt, int M, int N,
                                int K, int64_t lda, int64_t ldw, int64_t ldc,
                                const stof_gemm_epi *e, int max_algos,
                                stof_blaslt_gemm **out)
{
    STOF_CHECK_ARG(ctx, out != NULL, "out is NULL");
    *out = NULL;
    STOF_CHECK_ARG(ctx, e != NULL, "epilogue is NULL");
    STOF_CHECK_ARG(ctx, dt == STOF_DTYPE_FP16 || dt == STOF_DTYPE_BF16,
                   "dtype %d is neither fp16 nor bf16", (int)dt);
    STOF_CHECK_ARG(ctx, M > 0 && N > 0 && K > 0,
                   "M, N, K must be positive (%d, %d, %d)", M, N, K);
    STOF_CHECK_ARG(ctx, lda >= K && ldw >= K && ldc >= N,
                   "leading dimensions too small (lda %lld, ldw %lld for K "
                   "%d; ldc %lld for N %d)",
                   (long long)lda, (long long)ldw, K, (long long)ldc, N);
    STOF_CHECK_ARG(ctx, max_algos >= 0, "max_algos %d", max_algos);
    if (!stof__blaslt_epi_ok(e))
        return stof__fail(ctx, STOF_ERR_UNSUPPORTED,
                          "cuBLASLt cannot compute this epilogue (act %d, "
                          "bias %d, residual %d, norm %d, write_pre %d)",
                          e->act, e->bias, e->residual, e->norm, e->write_pre);
    const lt_api *a = lt();
    if (!a)
        return stof__fail(ctx, STOF_ERR_UNSUPPORTED,
                          "cuBLASLt is not available: %s", g_lt.why);
    if (max_algos > 64)
        max_algos = 64;

    const cudaDataType_t t = lt_type(dt);
    stof_status st = (stof_status)stof__ctx_push(ctx);
    if (st != STOF_OK)
        return st;
    cublasLtMatmulPreference_t pref = NULL;
    cublasLtMatmulHeuristicResult_t *res = NULL;
    stof_blaslt_gemm *g = calloc(1, sizeof(*g));
    if (!g) {
        st = stof__fail(ctx, STOF_ERR_OUT_OF_MEMORY, "out of memory");
        goto out;
    }
    g->lt = a;
    g->api = ctx->api;
    g->pctx = ctx->device.pctx;
    g->dt = dt;
    g->M = M, g->N = N, g->K = K;
    g->lda = lda, g->ldw = ldw, g->ldc = ldc;
    g->e = *e;
    if (pthread_mutex_init(&g->run_lock, NULL) != 0) {
        st = stof__fail(ctx, STOF_ERR_INTERNAL, "pthread_mutex_init failed");
        goto out;
    }
    g->lock_ok = 1;

    {
        cublasStatus_t r = a->cublasLtCreate(&g->h);
        if (r != CUBLAS_STATUS_SUCCESS) {
            g->h = NULL;
            /* Without a driver (or a GPU it supports) this is where it
             * ends; say so plainly. */
            st = lt_fail(ctx, a, r, "cublasLtCreate",
                         r == CUBLAS_STATUS_NOT_INITIALIZED
                             ? STOF_ERR_NO_DEVICE
                             : STOF_ERR_UNSUPPORTED);
            goto out;
        }
    }
    LT_CALL(st, STOF_ERR_UNSUPPORTED,
            a->cublasLtMatmulDescCreate(&g->op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    {
        int32_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
        uint32_t epi = (uint32_t)lt_epilogue(e);
        int32_t bias_t = (int32_t)t;
        LT_CALL(st, STOF_ERR_UNSUPPORTED,
                a->cublasLtMatmulDescSetAttribute(
                    g->op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)));
        LT_CALL(st, STOF_ERR_UNSUPPORTED,
                a->cublasLtMatmulDescSetAttribute(
                    g->op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)));
        LT_CALL(st, STOF_ERR_UNSUPPORTED,
                a->cublasLtMatmulDescSetAttribute(
                    g->op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof(epi)));
        if (e->bias)
            LT_CALL(st, STOF_ERR_UNSUPPORTED,
                    a->cublasLtMatmulDescSetAttribute(
                        g->op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bias_t,
                        sizeof(bias_t)));
    }
    LT_CALL(st, STOF_ERR_UNSUPPORTED,
            a->cublasLtMatrixLayoutCreate(&g->lw, t, (uint64_t)K, (uint64_t)N,
                                          ldw));
    LT_CALL(st, STOF_ERR_UNSUPPORTED,
            a->cublasLtMatrixLayoutCreate(&g->la, t, (uint64_t)K, (uint64_t)M,
                                          lda));
    LT_CALL(st, STOF_ERR_UNSUPPORTED,
            a->cublasLtMatrixLayoutCreate(&g->lc, t, (uint64_t)N, (uint64_t)M,
                                          ldc));
    LT_CALL(st, STOF_ERR_UNSUPPORTED, a->cublasLtMatmulPreferenceCreate(&pref));
    {
        uint64_t ws = STOF_BLASLT_WORKSPACE;
        LT_CALL(st, STOF_ERR_UNSUPPORTED,
                a->cublasLtMatmulPreferenceSetAttribute(
                    pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws,
                    sizeof(ws)));
        /* gemm.h promises 16-byte aligned pointers, not more: ask only for
         * algorithms that run on those (run checks it). */
        uint32_t al = 16;
        const cublasLtMatmulPreferenceAttributes_t al_attr[] = {
            CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES,
            CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
            CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES,
            CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
        for (int i = 0; i < 4; i++)
            LT_CALL(st, STOF_ERR_UNSUPPORTED,
                    a->cublasLtMatmulPreferenceSetAttribute(
                        pref, al_attr[i], &al, sizeof(al)));
    }
    res = calloc((size_t)(max_algos > 0 ? max_algos : 1), sizeof(*res));
    g->algos = calloc((size_t)(max_algos > 0 ? max_algos : 1),
                      sizeof(*g->algos));
    g->ws_need = calloc((size_t)(max_algos > 0 ? max_algos : 1),
                        sizeof(*g->ws_need));
    if (!res || !g->algos || !g->ws_need) {
        st = stof__fail(ctx, STOF_ERR_OUT_OF_MEMORY, "out of memory");
        goto out;
    }
    if (max_algos > 0) {
        int got = 0;
        cublasStatus_t r = a->cublasLtMatmulAlgoGetHeuristic(
            g->h, g->op, g->lw, g->la, g->lc, g->lc, pref, max_algos, res,
            &got);
        if (r != CUBLAS_STATUS_SUCCESS) {
            st = lt_fail(ctx, a, r, "cublasLtMatmulAlgoGetHeuristic",
                         STOF_ERR_UNSUPPORTED);
            goto out;
        }
        for (int i = 0; i < got; i++)
            if (res[i].state == CUBLAS_STATUS_SUCCESS &&
                res[i].workspaceSize <= STOF_BLASLT_WORKSPACE) {
                g->ws_need[g->n_algos] = res[i].workspaceSize;
                g->algos[g->n_algos++] = res[i].algo;
            }
        if (g->n_algos == 0) {
            st = stof__fail(ctx, STOF_ERR_UNSUPPORTED,
                            "cuBLASLt: cublasLtMatmulAlgoGetHeuristic found "
                            "no algorithm for %s M %d N %d K %d (lda %lld, "
                            "ldw %lld, ldc %lld, epilogue %u)",
                            dt == STOF_DTYPE_BF16 ? "bf16" : "fp16", M, N, K,
                            (long long)lda, (long long)ldw, (long long)ldc,
                            (unsigned)lt_epilogue(e));
            goto out;
        }
    }
    st = STOF_OK;
out:
    if (pref)
        a->cublasLtMatmulPreferenceDestroy(pref);
    free(res);
    stof__ctx_pop(ctx);
    if (st != STOF_OK) {
        stof__blaslt_free(&g);
        return st;
    }
    *out = g;
    return stof__ok(ctx);
}

int stof__blaslt_n_algos(const stof_blaslt_gemm *g)
{
    return g ? g->n_algos : 0;
}

size_t stof__blaslt_ws_need(const stof_blaslt_gemm *g, int i)
{
    return g && i >= 0 && i < g->n_algos ? g->ws_need[i] : 0;
}

void stof__blaslt_algo_bytes(const stof_blaslt_gemm *g, int i, void *out)
{
    if (!out)
        return;
    if (!g || i < 0 || i >= g->n_algos) {
        memset(out, 0, STOF_BLASLT_ALGO_BYTES);
        return;
    }
    memcpy(out, &g->algos[i], STOF_BLASLT_ALGO_BYTES);
}

/* Read config attribute `attr` of a stored blob (a plain field read). */
static int cfg_get(const lt_api *a, const cublasLtMatmulAlgo_t *algo,
                   cublasLtMatmulAlgoConfigAttributes_t attr, void *v,
                   size_t size)
{
    size_t wrote = 0;
    return a->cublasLtMatmulAlgoConfigGetAttribute(algo, attr, v, size,
                                                   &wrote) ==
               CUBLAS_STATUS_SUCCESS &&
           wrote == size;
}

/* 1 when `v` is in the capability list `attr` (an array of uint32_t) of
 * the initialised algorithm `clean`. */
static int cap_list_has(const lt_api *a, const cublasLtMatmulAlgo_t *clean,
                        cublasLtMatmulAlgoCapAttributes_t attr, uint32_t v)
{
    size_t need = 0;
    if (a->cublasLtMatmulAlgoCapGetAttribute(clean, attr, NULL, 0, &need) !=
            CUBLAS_STATUS_SUCCESS ||
        need == 0 || need % sizeof(uint32_t) != 0)
        return 0;
    uint32_t *ids = malloc(need);
    size_t wrote = 0;
    int found = 0;
    if (ids && a->cublasLtMatmulAlgoCapGetAttribute(clean, attr, ids, need,
                                                    &wrote) ==
                   CUBLAS_STATUS_SUCCESS)
        for (size_t i = 0; i < wrote / sizeof(uint32_t) && !found; i++)
            found = ids[i] == v;
    free(ids);
    return found;
}

static int cap_u32(const lt_api *a, const cublasLtMatmulAlgo_t *clean,
                   cublasLtMatmulAlgoCapAttributes_t attr, uint32_t *v)
{
    size_t wrote = 0;
    return a->cublasLtMatmulAlgoCapGetAttribute(clean, attr, v, sizeof(*v),
                                                &wrote) ==
               CUBLAS_STATUS_SUCCESS &&
           wrote == sizeof(*v);
}

/* Rebuild a stored algorithm from its configuration through cuBLASLt's own
 * API (cublasLtMatmulAlgoInit, then each config attribute checked against
 * the algorithm's capabilities), so that cuBLASLt never interprets bytes
 * we did not get from it: a damaged or foreign blob is refused here
 * (cublasLtMatmulAlgoCheck crashes on some). 0 and the reason in why[n]
 * when the blob does not describe a valid configuration. */
static int algo_rebuild(const lt_api *a, const stof_blaslt_gemm *g,
                        const cublasLtMatmulAlgo_t *blob,
                        cublasLtMatmulAlgo_t *clean, char *why, size_t n)
{
    int32_t id = -1, splitk = 1;
    uint32_t tile = 0, red = 0, swz = 0, custom = 0, stages = 0;
    uint16_t inner = 0, cluster = 0;
    if (!cfg_get(a, blob, CUBLASLT_ALGO_CONFIG_ID, &id, sizeof(id)) ||
        !cfg_get(a, blob, CUBLASLT_ALGO_CONFIG_TILE_ID, &tile, sizeof(tile)) ||
        !cfg_get(a, blob, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &splitk,
                 sizeof(splitk)) ||
        !cfg_get(a, blob, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, &red,
                 sizeof(red)) ||
        !cfg_get(a, blob, CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING, &swz,
                 sizeof(swz)) ||
        !cfg_get(a, blob, CUBLASLT_ALGO_CONFIG_CUSTOM_OPTION, &custom,
                 sizeof(custom)) ||
        !cfg_get(a, blob, CUBLASLT_ALGO_CONFIG_STAGES_ID, &stages,
                 sizeof(stages)) ||
        !cfg_get(a, blob, CUBLASLT_ALGO_CONFIG_INNER_SHAPE_ID, &inner,
                 sizeof(inner)) ||
        !cfg_get(a, blob, CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID, &cluster,
                 sizeof(cluster)))
        return stof__why(why, n, "its configuration cannot be read");

    int ids[512], n_ids = 0, known = 0;
    const cudaDataType_t t = lt_type(g->dt);
    if (a->cublasLtMatmulAlgoGetIds(g->h, CUBLAS_COMPUTE_32F, CUDA_R_32F, t, t,
                                    t, t, 512, ids,
                                    &n_ids) != CUBLAS_STATUS_SUCCESS)
        return stof__why(why, n, "cublasLtMatmulAlgoGetIds failed");
    for (int i = 0; i < n_ids && !known; i++)
        known = ids[i] == id;
    if (!known)
        return stof__why(why, n,
                         "algorithm id %d is not one of the %d this "
                         "cuBLASLt offers",
                         (int)id, n_ids);
    if (a->cublasLtMatmulAlgoInit(g->h, CUBLAS_COMPUTE_32F, CUDA_R_32F, t, t,
                                  t, t, (int)id,
                                  clean) != CUBLAS_STATUS_SUCCESS)
        return stof__why(why, n, "cublasLtMatmulAlgoInit refuses id %d",
                         (int)id);

    uint32_t splitk_ok = 0, red_mask = 0, swz_ok = 0, custom_max = 0;
    if (!cap_u32(a, clean, CUBLASLT_ALGO_CAP_SPLITK_SUPPORT, &splitk_ok) ||
        !cap_u32(a, clean, CUBLASLT_ALGO_CAP_REDUCTION_SCHEME_MASK,
                 &red_mask) ||
        !cap_u32(a, clean, CUBLASLT_ALGO_CAP_CTA_SWIZZLING_SUPPORT,
                 &swz_ok) ||
        !cap_u32(a, clean, CUBLASLT_ALGO_CAP_CUSTOM_OPTION_MAX, &custom_max))
        return stof__why(why, n, "capabilities of id %d unreadable",
                         (int)id);
    if (!cap_list_has(a, clean, CUBLASLT_ALGO_CAP_TILE_IDS, tile))
        return stof__why(why, n, "tile id %u not offered by id %d", tile,
                         (int)id);
    if (!cap_list_has(a, clean, CUBLASLT_ALGO_CAP_STAGES_IDS, stages))
        return stof__why(why, n, "stages id %u not offered by id %d", stages,
                         (int)id);
    if (splitk < 1 || splitk > 1024 || (splitk > 1 && !splitk_ok))
        return stof__why(why, n, "split-K %d not possible", (int)splitk);
    if ((red & ~(uint32_t)CUBLASLT_REDUCTION_SCHEME_MASK) != 0 ||
        (red & (red - 1)) != 0 || (red & ~red_mask) != 0)
        return stof__why(why, n, "reduction scheme %u not offered", red);
    if (swz > 1 || (swz && !swz_ok))
        return stof__why(why, n, "CTA swizzling %u not offered", swz);
    if (custom > custom_max)
        return stof__why(why, n, "custom option %u above %u", custom,
                         custom_max);
    /* No capability lists for these: a loose bound, the check decides. */
    if (inner >= 256 || cluster >= 256)
        return stof__why(why, n, "inner shape %u / cluster shape %u",
                         (unsigned)inner, (unsigned)cluster);

#define SET_CFG(attr, v)                                                       \
    if (a->cublasLtMatmulAlgoConfigSetAttribute(clean, attr, &(v),            \
                                                sizeof(v)) !=                  \
        CUBLAS_STATUS_SUCCESS)                                                 \
        return stof__why(why, n, "cublasLtMatmulAlgoConfigSetAttribute "      \
                                 "refuses " #attr);
    SET_CFG(CUBLASLT_ALGO_CONFIG_TILE_ID, tile)
    SET_CFG(CUBLASLT_ALGO_CONFIG_SPLITK_NUM, splitk)
    SET_CFG(CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, red)
    SET_CFG(CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING, swz)
    SET_CFG(CUBLASLT_ALGO_CONFIG_CUSTOM_OPTION, custom)
    SET_CFG(CUBLASLT_ALGO_CONFIG_STAGES_ID, stages)
    SET_CFG(CUBLASLT_ALGO_CONFIG_INNER_SHAPE_ID, inner)
    SET_CFG(CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID, cluster)
#undef SET_CFG
    return 1;
}

stof_status stof__blaslt_set_algo(stof_context *ctx, stof_blaslt_gemm *g,
                                  const void *bytes)
{
    STOF_CHECK_ARG(ctx, g != NULL && bytes != NULL, "gemm or bytes is NULL");
    const lt_api *a = g->lt;
    cublasLtMatmulAlgo_t blob, algo;
    memcpy(&blob, bytes, sizeof(blob));
    memset(&algo, 0, sizeof(algo));
    size_t need = 0;
    stof_status st = (stof_status)stof__ctx_push(ctx);
    if (st != STOF_OK)
        return st;
    {
        char why[256];
        if (!algo_rebuild(a, g, &blob, &algo, why, sizeof(why))) {
            st = stof__fail(ctx, STOF_ERR_UNSUPPORTED,
                            "cuBLASLt (%zu): stored algorithm refused: %s",
                            a->version, why);
            goto out;
        }
        cublasLtMatmulHeuristicResult_t res;
        memset(&res, 0, sizeof(res));
        LT_CALL(st, STOF_ERR_UNSUPPORTED,
                a->cublasLtMatmulAlgoCheck(g->h, g->op, g->lw, g->la, g->lc,
                                           g->lc, &algo, &res));
        if (res.workspaceSize > STOF_BLASLT_WORKSPACE) {
            st = stof__fail(ctx, STOF_ERR_UNSUPPORTED,
                            "cuBLASLt: stored algorithm needs %zu bytes of "
                            "workspace, more than %u",
                            res.workspaceSize, STOF_BLASLT_WORKSPACE);
            goto out;
        }
        need = res.workspaceSize;
    }
    g->algos[0] = algo;
    g->ws_need[0] = need;
    g->n_algos = 1;
    st = STOF_OK;
out:
    stof__ctx_pop(ctx);
    return st == STOF_OK ? stof__ok(ctx) : st;
}

static int misaligned(CUdeviceptr p)
{
    return (p & 15u) != 0;
}

stof_status stof__blaslt_run(const stof_blaslt_gemm *g, int algo,
                             const stof_gemm_args *x, CUdeviceptr workspace,
                             size_t ws_bytes, CUstream stream)
{
    if (!g || !x || algo < 0 || algo >= g->n_algos)
        return STOF_ERR_INVALID_ARGUMENT;
    if (x->M != g->M || x->N != g->N || x->K != g->K || x->lda != g->lda ||
        x->ldw != g->ldw || x->ldc != g->ldc)
        return STOF_ERR_INVALID_ARGUMENT;
    if (!x->a || !x->w || !x->c || (g->e.bias && !x->bias) ||
        (g->e.residual && !x->residual) || (ws_bytes && !workspace) ||
        ws_bytes < g->ws_need[algo])
        return STOF_ERR_INVALID_ARGUMENT;
    if (misaligned(x->a) || misaligned(x->w) || misaligned(x->c) ||
        (g->e.residual && misaligned(x->residual)) || misaligned(workspace))
        return STOF_ERR_INVALID_ARGUMENT;
    const lt_api *a = g->lt;
    stof_blaslt_gemm *m = (stof_blaslt_gemm *)g; /* the lock only */
    pthread_mutex_lock(&m->run_lock);
    cublasStatus_t r = CUBLAS_STATUS_SUCCESS;
    if (g->e.bias) {
        const void *bp = (const void *)(uintptr_t)x->bias;
        r = a->cublasLtMatmulDescSetAttribute(
            g->op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bp, sizeof(bp));
    }
    if (r == CUBLAS_STATUS_SUCCESS) {
        /* Defensive: make the device's context current (one more stack
         * entry when the caller already did; allowed during capture). */
        int pushed =
            g->pctx && g->api->cuCtxPushCurrent(g->pctx) == CUDA_SUCCESS;
        const float alpha = 1.0f, beta = g->e.residual ? 1.0f : 0.0f;
        const void *cptr =
            (const void *)(uintptr_t)(g->e.residual ? x->residual : x->c);
        r = a->cublasLtMatmul(
            g->h, g->op, &alpha, (const void *)(uintptr_t)x->w, g->lw,
            (const void *)(uintptr_t)x->a, g->la, &beta, cptr, g->lc,
            (void *)(uintptr_t)x->c, g->lc, &g->algos[algo],
            (void *)(uintptr_t)workspace, ws_bytes,
            (cudaStream_t)stream);
        if (pushed) {
            CUcontext c = NULL;
            g->api->cuCtxPopCurrent(&c);
        }
    }
    pthread_mutex_unlock(&m->run_lock);
    if (r == CUBLAS_STATUS_SUCCESS)
        return STOF_OK;
    if (r == CUBLAS_STATUS_EXECUTION_FAILED)
        return STOF_ERR_CUDA;
    return STOF_ERR_UNSUPPORTED;
}

static void warm_close(stof_context *ctx)
{
    const lt_api *a = lt();
    if (a && ctx->lt_warm && stof__ctx_push(ctx) == STOF_OK) {
        a->cublasLtDestroy((cublasLtHandle_t)ctx->lt_warm);
        stof__ctx_pop(ctx);
    }
    ctx->lt_warm = NULL;
}

stof_status stof__blaslt_warm(stof_context *ctx)
{
    if (ctx->lt_warm)
        return stof__ok(ctx);
    const lt_api *a = lt();
    if (!a)
        return stof__fail(ctx, STOF_ERR_UNSUPPORTED,
                          "cuBLASLt is not available: %s", g_lt.why);
    stof_status st = (stof_status)stof__ctx_push(ctx);
    if (st != STOF_OK)
        return st;
    cublasLtHandle_t h = NULL;
    const cublasStatus_t r = a->cublasLtCreate(&h);
    stof__ctx_pop(ctx);
    if (r != CUBLAS_STATUS_SUCCESS)
        return lt_fail(ctx, a, r, "cublasLtCreate", STOF_ERR_UNSUPPORTED);
    ctx->lt_warm = h;
    ctx->lt_warm_close = warm_close;
    /* Its first heuristic query in a process is what takes the time
     * (~0.1 s on an H200, whatever the shape): ask one. */
    stof_gemm_epi e;
    memset(&e, 0, sizeof(e));
    stof_blaslt_gemm *g = NULL;
    st = stof__blaslt_create(ctx, STOF_DTYPE_FP16, 128, 128, 128, 128, 128,
                             128, &e, 1, &g);
    stof__blaslt_free(&g);
    return st;
}
