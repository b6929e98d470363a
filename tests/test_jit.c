/*
 * test_jit.c - the "jit" suite: every embedded kernel template compiles
 * with NVRTC for sm_80 and sm_90 (and sm_90a where it asks for it) in every
 * parameter combination it declares, compile errors reach the user with
 * the log, and the device layer behaves without a driver, without NVRTC and
 * with a fake driver. No GPU is needed.
 *
 * Template conventions read here:
 *   // STOF_VARIANTS: A=1,B=2 | A=3,B=4   define sets to compile (any number
 *                                         of such lines; none = no defines)
 *   STOF_NEEDS_SM90A                      anywhere: also compile for sm_90a
 */
#include <criterion/criterion.h>
#include <criterion/logging.h>

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <stdint.h>
#define XXH_INLINE_ALL
#include <xxhash.h>

#include "internal.h"
#include "cuda_shim.h"
#include "attention_int.h"

static void need_nvrtc(void)
{
    const stof_api *a = stof__api();
    if (!a->has_nvrtc)
        cr_skip_test("NVRTC cannot be loaded, skipping: %s", a->nvrtc_why);
}

static int ends_with(const char *s, const char *tail)
{
    size_t n = strlen(s), m = strlen(tail);
    return n >= m && strcmp(s + n - m, tail) == 0;
}

static int is_elf(const void *p, size_t n)
{
    return n >= 4 && memcmp(p, "\177ELF", 4) == 0;
}

/* ------------------------------------------------------------------------ */
/* Variants                                                                  */
/* ------------------------------------------------------------------------ */

#define MAX_DEFS 32

typedef struct job {
    const stof_template *tpl;
    const char *arch;
    char *text;              /* the variant as written, owns the strings */
    char *defs[MAX_DEFS];    /* point into text */
    int n_defs;
    int st;
    size_t size;
    int elf;
} job;

typedef struct job_list {
    job *v;
    int n, cap;
} job_list;

static char *trim(char *s)
{
    while (*s == ' ' || *s == '\t')
        s++;
    char *e = s + strlen(s);
    while (e > s && (e[-1] == ' ' || e[-1] == '\t' || e[-1] == '\r'))
        *--e = '\0';
    return s;
}

/* Add one job for the define set `set` ("A=1,B=2", may be empty). */
static void add_job(job_list *l, const stof_template *t, const char *arch,
                    const char *set, size_t len)
{
    if (l->n == l->cap) {
        l->cap = l->cap ? 2 * l->cap : 64;
        l->v = realloc(l->v, (size_t)l->cap * sizeof(*l->v));
        cr_assert(l->v, "out of memory");
    }
    job *j = &l->v[l->n++];
    memset(j, 0, sizeof(*j));
    j->tpl = t;
    j->arch = arch;
    j->text = malloc(len + 1);
    cr_assert(j->text, "out of memory");
    memcpy(j->text, set, len);
    j->text[len] = '\0';
    char *save = NULL;
    for (char *tok = strtok_r(j->text, ",", &save); tok;
         tok = strtok_r(NULL, ",", &save)) {
        char *d = trim(tok);
        if (!*d)
            continue;
        cr_assert(j->n_defs < MAX_DEFS, "%s: more than %d defines in a "
                  "variant", t->name, MAX_DEFS);
        j->defs[j->n_defs++] = d;
    }
}

/* Add a job per declared variant of `t` for `arch`. */
static int add_template_jobs(job_list *l, const stof_template *t,
                             const char *arch)
{
    static const char marker[] = "// STOF_VARIANTS:";
    int found = 0;
    const char *p = t->source;
    while (*p) {
        const char *eol = strchr(p, '\n');
        size_t len = eol ? (size_t)(eol - p) : strlen(p);
        const char *q = p;
        while (q < p + len && (*q == ' ' || *q == '\t'))
            q++;
        if ((size_t)(p + len - q) >= sizeof(marker) - 1 &&
            memcmp(q, marker, sizeof(marker) - 1) == 0) {
            const char *s = q + sizeof(marker) - 1, *end = p + len;
            while (s <= end) {
                const char *bar = memchr(s, '|', (size_t)(end - s));
                const char *stop = bar ? bar : end;
                add_job(l, t, arch, s, (size_t)(stop - s));
                found++;
                s = stop + 1;
            }
        }
        p += len + (eol ? 1 : 0);
    }
    if (!found)
        add_job(l, t, arch, "", 0);
    return found ? found : 1;
}

static void free_jobs(job_list *l)
{
    for (int i = 0; i < l->n; i++)
        free(l->v[i].text);
    free(l->v);
    memset(l, 0, sizeof(*l));
}

/* ------------------------------------------------------------------------ */
/* Compiling every template, on several threads with ctx == NULL             */
/* ------------------------------------------------------------------------ */

typedef struct pool {
    job_list *jobs;
    atomic_int next;
} pool;

static void *worker(void *arg)
{
    pool *p = arg;
    for (;;) {
        int i = atomic_fetch_add(&p->next, 1);
        if (i >= p->jobs->n)
            return NULL;
        job *j = &p->jobs->v[i];
        void *bin = NULL;
        size_t size = 0;
        j->st = stof__jit_compile(NULL, j->tpl->name,
                                  (const char *const *)j->defs, j->n_defs,
                                  j->arch, &bin, &size);
        j->size = size;
        j->elf = bin && is_elf(bin, size);
        free(bin);
    }
}

static void describe_job(const job *j, char *buf, size_t n)
{
    int off = snprintf(buf, n, "%s for %s with", j->tpl->name, j->arch);
    if (j->n_defs == 0)
        snprintf(buf + off, n - (size_t)off, " no defines");
    for (int i = 0; i < j->n_defs && (size_t)off < n; i++)
        off += snprintf(buf + off, n - (size_t)off, " -D%s", j->defs[i]);
}

/* Compile every .cu template (only those marked STOF_NEEDS_SM90A when
 * `only_sm90a`) for `arch` in all its variants. */
static void compile_all(const char *arch, int only_sm90a)
{
    need_nvrtc();
    job_list jobs = {0};
    int n_cu = 0, n_tpl = 0;
    for (int i = 0; i < stof__n_templates; i++) {
        const stof_template *t = &stof__templates[i];
        if (!ends_with(t->name, ".cu"))
            continue;
        n_cu++;
        if (only_sm90a && !strstr(t->source, "STOF_NEEDS_SM90A"))
            continue;
        n_tpl++;
        add_template_jobs(&jobs, t, arch);
    }
    cr_assert(n_cu > 0, "no .cu template is embedded");
    if (jobs.n == 0) {
        cr_log_info("no template asks for %s (STOF_NEEDS_SM90A)", arch);
        return;
    }

    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    /* At least two threads, so that concurrent compiles are exercised. */
    int nthreads = ncpu > 8 ? 8 : ncpu < 2 ? 2 : (int)ncpu;
    if (nthreads > jobs.n)
        nthreads = jobs.n;
    pool p = {.jobs = &jobs};
    atomic_init(&p.next, 0);
    pthread_t th[8];
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    long before = stof__jit_compile_count();
    for (int i = 0; i < nthreads; i++)
        cr_assert(pthread_create(&th[i], NULL, worker, &p) == 0,
                  "pthread_create failed");
    for (int i = 0; i < nthreads; i++)
        pthread_join(th[i], NULL);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    cr_expect(stof__jit_compile_count() - before == jobs.n,
              "compile counter moved by %ld for %d compiles",
              stof__jit_compile_count() - before, jobs.n);

    /* Failures are compiled again with a context to get the NVRTC log. */
    int failed = 0;
    for (int i = 0; i < jobs.n; i++) {
        job *j = &jobs.v[i];
        char what[1024];
        describe_job(j, what, sizeof(what));
        if (j->st == STOF_OK) {
            cr_expect(j->size > 0 && j->elf,
                      "%s: the cubin (%zu bytes) is not an ELF file", what,
                      j->size);
            continue;
        }
        failed++;
        stof_settings s;
        stof_default_settings(&s);
        stof_context *ctx = NULL;
        stof_open(&ctx, &s);
        void *bin = NULL;
        size_t size = 0;
        int st = stof__jit_compile(ctx, j->tpl->name,
                                   (const char *const *)j->defs, j->n_defs,
                                   j->arch, &bin, &size);
        free(bin);
        cr_expect_fail("%s failed: %s (again with a context: %s)\n%s", what,
                       stof_status_name((stof_status)j->st),
                       stof_status_name((stof_status)st), stof_errmsg(ctx));
        stof_close(&ctx);
    }
    double secs = (double)(t1.tv_sec - t0.tv_sec) +
                  (double)(t1.tv_nsec - t0.tv_nsec) * 1e-9;
    cr_log_info("%s: %d compiles of %d templates on %d threads in %.1f s, "
                "%d failed",
                arch, jobs.n, n_tpl, nthreads, secs, failed);
    free_jobs(&jobs);
}

Test(jit, templates_sm80, .timeout = 550)
{
    compile_all("sm_80", 0);
}

Test(jit, templates_sm90, .timeout = 550)
{
    compile_all("sm_90", 0);
}

Test(jit, templates_sm90a, .timeout = 550)
{
    compile_all("sm_90a", 1);
}

/* The variant parser itself, on a made-up template. */
Test(jit, variant_lines)
{
    stof_template t = {
        "x.cu",
        "// STOF_VARIANTS: HEAD_DIM=64,DTYPE=0 | HEAD_DIM=128 , DTYPE=1\n"
        "  // STOF_VARIANTS: A\n"
        "int x; // STOF_VARIANTS: ignored, not at the start of a line\n",
        0};
    job_list l = {0};
    cr_assert_eq(add_template_jobs(&l, &t, "sm_80"), 3);
    cr_assert_eq(l.v[0].n_defs, 2);
    cr_expect_str_eq(l.v[0].defs[0], "HEAD_DIM=64");
    cr_expect_str_eq(l.v[0].defs[1], "DTYPE=0");
    cr_assert_eq(l.v[1].n_defs, 2);
    cr_expect_str_eq(l.v[1].defs[0], "HEAD_DIM=128");
    cr_expect_str_eq(l.v[1].defs[1], "DTYPE=1");
    cr_assert_eq(l.v[2].n_defs, 1);
    cr_expect_str_eq(l.v[2].defs[0], "A");
    free_jobs(&l);
    stof_template none = {"y.cu", "int y;\n", 0};
    cr_assert_eq(add_template_jobs(&l, &none, "sm_80"), 1);
    cr_expect_eq(l.v[0].n_defs, 0);
    free_jobs(&l);
}

/* ------------------------------------------------------------------------ */
/* Errors                                                                    */
/* ------------------------------------------------------------------------ */

static stof_context *open_default(void)
{
    stof_settings s;
    stof_default_settings(&s);
    stof_context *ctx = NULL;
    cr_assert_eq(stof_open(&ctx, &s), STOF_OK, "stof_open: %s",
                 stof_errmsg(ctx));
    return ctx;
}

Test(jit, forced_compile_error)
{
    need_nvrtc();
    const stof_template *common = stof__template_find("stof_common.cuh");
    cr_assert(common, "stof_common.cuh is not embedded");
    cr_assert(strstr(common->source, "STOF_JIT_FORCE_ERROR"),
              "stof_common.cuh lacks the STOF_JIT_FORCE_ERROR #error");
    stof_context *ctx = open_default();
    const char *defs[] = {"STOF_JIT_FORCE_ERROR", "HEAD_DIM=64"};
    void *bin = (void *)1;
    size_t size = 1;
    long before = stof__jit_compile_count();
    int st = stof__jit_compile(ctx, "stof_common.cuh", defs, 2, "sm_80", &bin,
                               &size);
    cr_assert_eq(st, STOF_ERR_NVRTC, "status %s: %s",
                 stof_status_name((stof_status)st), stof_errmsg(ctx));
    cr_expect_eq(stof_errcode(ctx), STOF_ERR_NVRTC);
    cr_expect_null(bin);
    cr_expect_eq(size, 0);
    cr_expect_eq(stof__jit_compile_count(), before + 1);
    const char *msg = stof_errmsg(ctx);
    cr_expect(strstr(msg, "compile error forced by STOF_JIT_FORCE_ERROR"),
              "the log is missing: %s", msg);
    cr_expect(strstr(msg, "stof_common.cuh"), "no template name: %s", msg);
    cr_expect(strstr(msg, "-DSTOF_JIT_FORCE_ERROR") &&
                  strstr(msg, "-DHEAD_DIM=64"),
              "no defines: %s", msg);
    cr_expect(strstr(msg, "sm_80"), "no arch: %s", msg);
    /* Without a context: the same status, nothing recorded anywhere. */
    st = stof__jit_compile(NULL, "stof_common.cuh", defs, 2, "sm_80", &bin,
                           &size);
    cr_expect_eq(st, STOF_ERR_NVRTC);
    stof_close(&ctx);
}

Test(jit, unknown_template)
{
    stof_context *ctx = open_default();
    void *bin = NULL;
    size_t size = 0;
    long before = stof__jit_compile_count();
    int st = stof__jit_compile(ctx, "no_such_template.cu", NULL, 0, "sm_80",
                               &bin, &size);
    cr_assert_eq(st, STOF_ERR_NOT_FOUND, "%s", stof_errmsg(ctx));
    cr_expect(strstr(stof_errmsg(ctx), "no_such_template.cu"), "%s",
              stof_errmsg(ctx));
    cr_expect(strstr(stof_errmsg(ctx), "stof_common.cuh"),
              "known names are not listed: %s", stof_errmsg(ctx));
    cr_expect_eq(stof__jit_compile_count(), before);
    cr_expect_eq(stof__jit_compile(NULL, "no_such_template.cu", NULL, 0,
                                   "sm_80", &bin, &size),
                 STOF_ERR_NOT_FOUND);
    stof_close(&ctx);
}

Test(jit, bad_arguments)
{
    stof_context *ctx = open_default();
    void *bin = NULL;
    size_t size = 0;
    static const char *const bad[] = {"compute_90", "sm_", "sm_90b", "90",
                                      "sm_90a; rm"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        int st = stof__jit_compile(ctx, "stof_common.cuh", NULL, 0, bad[i],
                                   &bin, &size);
        cr_expect_eq(st, STOF_ERR_INVALID_ARGUMENT, "arch %s: %s", bad[i],
                     stof_status_name((stof_status)st));
        cr_expect(strstr(stof_errmsg(ctx), "arch"), "%s", stof_errmsg(ctx));
    }
    cr_expect_eq(stof__jit_compile(ctx, NULL, NULL, 0, "sm_80", &bin, &size),
                 STOF_ERR_INVALID_ARGUMENT);
    cr_expect_eq(stof__jit_compile(ctx, "stof_common.cuh", NULL, 2, "sm_80",
                                   &bin, &size),
                 STOF_ERR_INVALID_ARGUMENT);
    cr_expect_eq(stof__jit_compile(ctx, "stof_common.cuh", NULL, 0, "sm_80",
                                   NULL, &size),
                 STOF_ERR_INVALID_ARGUMENT);
    stof_close(&ctx);
}

/* A copy of the real table with the driver half removed. */
static stof_api g_nodrv;

static void use_no_driver(void)
{
    g_nodrv = *stof__api();
#define CLEAR(name, ret, args) g_nodrv.name = NULL;
    STOF__CU_FN(CLEAR)
#undef CLEAR
    g_nodrv.has_cuda = 0;
    g_nodrv.cuda_lib = NULL;
    snprintf(g_nodrv.cuda_why, sizeof(g_nodrv.cuda_why),
             "test: driver removed");
    stof__api_override(&g_nodrv);
}

static void restore_api(void)
{
    stof__api_override(NULL);
}

Test(jit, null_arch_without_device, .fini = restore_api)
{
    void *bin = NULL;
    size_t size = 0;
    cr_expect_eq(stof__jit_compile(NULL, "stof_common.cuh", NULL, 0, NULL,
                                   &bin, &size),
                 STOF_ERR_NO_DEVICE);
    use_no_driver();
    stof_context *ctx = open_default();
    cr_assert_not(stof_has_device(ctx));
    int st = stof__jit_compile(ctx, "stof_common.cuh", NULL, 0, NULL, &bin,
                               &size);
    cr_expect_eq(st, STOF_ERR_NO_DEVICE, "%s", stof_errmsg(ctx));
    cr_expect(strstr(stof_errmsg(ctx), "no architecture"), "%s",
              stof_errmsg(ctx));
    cr_expect_null(bin);
    stof_close(&ctx);
}

Test(jit, compile_counter)
{
    need_nvrtc();
    const stof_template *t = NULL;
    for (int i = 0; i < stof__n_templates && !t; i++)
        if (ends_with(stof__templates[i].name, ".cu"))
            t = &stof__templates[i];
    cr_assert(t, "no .cu template");
    job_list l = {0};
    add_template_jobs(&l, t, "sm_80");
    long before = stof__jit_compile_count();
    void *bin = NULL;
    size_t size = 0;
    int st = stof__jit_compile(NULL, t->name, (const char *const *)l.v[0].defs,
                               l.v[0].n_defs, "sm_80", &bin, &size);
    cr_assert_eq(st, STOF_OK, "%s: %s", t->name,
                 stof_status_name((stof_status)st));
    cr_expect(is_elf(bin, size), "not an ELF cubin");
    cr_expect_eq(stof__jit_compile_count(), before + 1);
    free(bin);
    free_jobs(&l);
}

/* ------------------------------------------------------------------------ */
/* Fake driver tables                                                        */
/* ------------------------------------------------------------------------ */

static stof_api g_fake;
static int g_fake_count = 1;
static int g_fake_cc_major = 9, g_fake_cc_minor = 0;
static CUresult g_fake_init_result = CUDA_SUCCESS;
static int g_retains, g_releases, g_pushes, g_pops;
static int g_dummy_ctx;
static int g_fake_archs[8];
static int g_fake_n_archs;

static CUresult fake_init(unsigned int flags)
{
    (void)flags;
    return g_fake_init_result;
}

static CUresult fake_driver_version(int *v)
{
    *v = 13000;
    return CUDA_SUCCESS;
}

static CUresult fake_error_name(CUresult r, const char **s)
{
    switch (r) {
    case CUDA_SUCCESS: *s = "CUDA_SUCCESS"; return CUDA_SUCCESS;
    case CUDA_ERROR_OUT_OF_MEMORY: *s = "CUDA_ERROR_OUT_OF_MEMORY"; return CUDA_SUCCESS;
    case CUDA_ERROR_NO_DEVICE: *s = "CUDA_ERROR_NO_DEVICE"; return CUDA_SUCCESS;
    default: *s = NULL; return CUDA_ERROR_INVALID_VALUE;
    }
}

static CUresult fake_error_string(CUresult r, const char **s)
{
    switch (r) {
    case CUDA_SUCCESS: *s = "no error"; return CUDA_SUCCESS;
    case CUDA_ERROR_OUT_OF_MEMORY: *s = "out of memory"; return CUDA_SUCCESS;
    case CUDA_ERROR_NO_DEVICE: *s = "no CUDA-capable device is detected"; return CUDA_SUCCESS;
    default: *s = NULL; return CUDA_ERROR_INVALID_VALUE;
    }
}

static CUresult fake_count(int *n)
{
    *n = g_fake_count;
    return CUDA_SUCCESS;
}

static CUresult fake_device_get(CUdevice *d, int ordinal)
{
    *d = (CUdevice)ordinal;
    return CUDA_SUCCESS;
}

static CUresult fake_name(char *buf, int len, CUdevice d)
{
    (void)d;
    snprintf(buf, (size_t)len, "Fake \"H100\"\\GPU");
    return CUDA_SUCCESS;
}

static CUresult fake_attribute(int *v, CUdevice_attribute a, CUdevice d)
{
    (void)d;
    switch (a) {
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR: *v = g_fake_cc_major; break;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR: *v = g_fake_cc_minor; break;
    case CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT: *v = 132; break;
    case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN: *v = 232448; break;
    case CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE: *v = 52428800; break;
    default: return CUDA_ERROR_INVALID_VALUE;
    }
    return CUDA_SUCCESS;
}

static CUresult fake_total_mem(size_t *bytes, CUdevice d)
{
    (void)d;
    *bytes = (size_t)80 << 30;
    return CUDA_SUCCESS;
}

static CUresult fake_retain(CUcontext *c, CUdevice d)
{
    (void)d;
    *c = (CUcontext)(void *)&g_dummy_ctx;
    g_retains++;
    return CUDA_SUCCESS;
}

static CUresult fake_release(CUdevice d)
{
    (void)d;
    g_releases++;
    return CUDA_SUCCESS;
}

static CUresult fake_push(CUcontext c)
{
    cr_expect_eq((void *)c, (void *)&g_dummy_ctx, "pushed the wrong context");
    g_pushes++;
    return CUDA_SUCCESS;
}

static CUresult fake_pop(CUcontext *c)
{
    if (c)
        *c = (CUcontext)(void *)&g_dummy_ctx;
    g_pops++;
    return CUDA_SUCCESS;
}

static nvrtcResult fake_nvrtc_version(int *major, int *minor)
{
    *major = 12;
    *minor = 4;
    return NVRTC_SUCCESS;
}

static nvrtcResult fake_num_archs(int *n)
{
    *n = g_fake_n_archs;
    return NVRTC_SUCCESS;
}

static nvrtcResult fake_archs(int *archs)
{
    memcpy(archs, g_fake_archs, (size_t)g_fake_n_archs * sizeof(int));
    return NVRTC_SUCCESS;
}

/* A table whose driver half is the fakes above and whose NVRTC half is
 * missing. */
static void use_fake_driver(void)
{
    memset(&g_fake, 0, sizeof(g_fake));
    g_fake.has_cuda = 1;
    g_fake.has_nvrtc = 0;
    snprintf(g_fake.nvrtc_why, sizeof(g_fake.nvrtc_why),
             "test: no NVRTC in the fake table");
    g_fake.cuInit = fake_init;
    g_fake.cuDriverGetVersion = fake_driver_version;
    g_fake.cuGetErrorName = fake_error_name;
    g_fake.cuGetErrorString = fake_error_string;
    g_fake.cuDeviceGetCount = fake_count;
    g_fake.cuDeviceGet = fake_device_get;
    g_fake.cuDeviceGetName = fake_name;
    g_fake.cuDeviceGetAttribute = fake_attribute;
    g_fake.cuDeviceTotalMem = fake_total_mem;
    g_fake.cuDevicePrimaryCtxRetain = fake_retain;
    g_fake.cuDevicePrimaryCtxRelease = fake_release;
    g_fake.cuCtxPushCurrent = fake_push;
    g_fake.cuCtxPopCurrent = fake_pop;
    stof__api_override(&g_fake);
}

static void use_fake_nvrtc(const int *archs, int n)
{
    memcpy(g_fake_archs, archs, (size_t)n * sizeof(int));
    g_fake_n_archs = n;
    g_fake.has_nvrtc = 1;
    g_fake.nvrtc_why[0] = '\0';
    g_fake.nvrtcVersion = fake_nvrtc_version;
    g_fake.nvrtcGetNumSupportedArchs = fake_num_archs;
    g_fake.nvrtcGetSupportedArchs = fake_archs;
}

static stof_status open_with(int device, int require, stof_context **ctx)
{
    stof_settings s;
    stof_default_settings(&s);
    s.device = device;
    s.require_device = require;
    *ctx = NULL;
    return stof_open(ctx, &s);
}

Test(jit, no_driver_no_nvrtc, .fini = restore_api)
{
    memset(&g_fake, 0, sizeof(g_fake));
    snprintf(g_fake.cuda_why, sizeof(g_fake.cuda_why),
             "test: libcuda.so.1 absent");
    snprintf(g_fake.nvrtc_why, sizeof(g_fake.nvrtc_why),
             "test: libnvrtc.so.13 absent");
    stof__api_override(&g_fake);

    stof_context *ctx;
    cr_assert_eq(open_with(0, 0, &ctx), STOF_OK, "%s", stof_errmsg(ctx));
    cr_expect_eq(stof_has_device(ctx), 0);
    char buf[256];
    size_t needed = 1;
    cr_expect_eq(stof_device_describe(ctx, buf, sizeof(buf), &needed),
                 STOF_ERR_NO_DEVICE);
    cr_expect(strstr(stof_errmsg(ctx), "libcuda.so.1 absent"), "%s",
              stof_errmsg(ctx));
    cr_expect_eq(stof__ctx_push(ctx), STOF_ERR_NO_DEVICE);
    void *bin = NULL;
    size_t size = 0;
    int st = stof__jit_compile(ctx, "stof_common.cuh", NULL, 0, "sm_90", &bin,
                               &size);
    cr_expect_eq(st, STOF_ERR_NO_DEVICE);
    cr_expect(strstr(stof_errmsg(ctx), "NVRTC") &&
                  strstr(stof_errmsg(ctx), "libnvrtc.so.13 absent"),
              "%s", stof_errmsg(ctx));
    stof_close(&ctx);
    cr_expect_null(ctx);

    cr_expect_eq(open_with(0, 1, &ctx), STOF_ERR_NO_DEVICE);
    cr_assert_not_null(ctx);
    cr_expect(strstr(stof_errmsg(ctx), "no CUDA driver") &&
                  strstr(stof_errmsg(ctx), "libcuda.so.1 absent"),
              "%s", stof_errmsg(ctx));
    stof_close(&ctx);
}

Test(jit, fake_cuinit_no_device, .fini = restore_api)
{
    use_fake_driver();
    g_fake_init_result = CUDA_ERROR_NO_DEVICE;
    stof_context *ctx;
    cr_expect_eq(open_with(0, 1, &ctx), STOF_ERR_NO_DEVICE);
    cr_expect(strstr(stof_errmsg(ctx), "cuInit") &&
                  strstr(stof_errmsg(ctx), "CUDA_ERROR_NO_DEVICE"),
              "%s", stof_errmsg(ctx));
    stof_close(&ctx);
    cr_expect_eq(open_with(0, 0, &ctx), STOF_OK);
    cr_expect_eq(stof_has_device(ctx), 0);
    stof_close(&ctx);
    cr_expect_eq(g_retains, 0);
}

Test(jit, fake_no_device_found, .fini = restore_api)
{
    use_fake_driver();
    g_fake_count = 0;
    stof_context *ctx;
    cr_expect_eq(open_with(0, 1, &ctx), STOF_ERR_NO_DEVICE);
    cr_expect(strstr(stof_errmsg(ctx), "no CUDA device found"), "%s",
              stof_errmsg(ctx));
    stof_close(&ctx);
}

Test(jit, fake_ordinal_out_of_range, .fini = restore_api)
{
    use_fake_driver();
    g_fake_count = 1;
    stof_context *ctx;
    cr_expect_eq(open_with(3, 1, &ctx), STOF_ERR_INVALID_ARGUMENT);
    cr_expect(strstr(stof_errmsg(ctx), "settings.device") &&
                  strstr(stof_errmsg(ctx), "1 CUDA device"),
              "%s", stof_errmsg(ctx));
    stof_close(&ctx);
    cr_expect_eq(g_retains, 0);
}

static CUresult g_load_result;

static CUresult fake_module_load(CUmodule *m, const void *image)
{
    (void)image;
    *m = g_load_result == CUDA_SUCCESS ? (CUmodule)8 : NULL;
    return g_load_result;
}

static CUresult fake_get_function(CUfunction *f, CUmodule m, const char *n)
{
    (void)m;
    (void)n;
    *f = NULL;
    return CUDA_ERROR_OUT_OF_MEMORY;
}

static CUresult fake_unload(CUmodule m)
{
    (void)m;
    return CUDA_SUCCESS;
}

/* A module that cannot load for want of device memory says so
 * (STOF_ERR_OUT_OF_MEMORY: the host's state, not the cubin's), also when
 * its functions load lazily; any other load failure is a CUDA error. */
Test(jit, fake_module_load_out_of_memory, .fini = restore_api)
{
    use_fake_driver();
    g_fake.cuModuleLoadData = fake_module_load;
    stof_context *ctx;
    cr_assert_eq(open_with(0, 1, &ctx), STOF_OK, "%s", stof_errmsg(ctx));
    CUmodule m = (CUmodule)1;
    CUfunction f = (CUfunction)1;
    static const unsigned char cubin[16] = {1};
    g_load_result = CUDA_ERROR_OUT_OF_MEMORY;
    cr_expect_eq(stof__module_load(ctx, cubin, "stof_x", 0, &m, &f),
                 STOF_ERR_OUT_OF_MEMORY);
    cr_expect(strstr(stof_errmsg(ctx), "CUDA_ERROR_OUT_OF_MEMORY"), "%s",
              stof_errmsg(ctx));
    cr_expect_null(m);
    cr_expect_null(f);
    g_load_result = CUDA_ERROR_INVALID_IMAGE;
    cr_expect_eq(stof__module_load(ctx, cubin, "stof_x", 0, &m, &f),
                 STOF_ERR_CUDA);
    cr_expect(strstr(stof_errmsg(ctx), "cuModuleLoadData"), "%s",
              stof_errmsg(ctx));
    /* Lazy loading (the default since CUDA 12.2): the function's load. */
    g_load_result = CUDA_SUCCESS;
    g_fake.cuModuleGetFunction = fake_get_function;
    g_fake.cuModuleUnload = fake_unload;
    cr_expect_eq(stof__module_load(ctx, cubin, "stof_x", 0, &m, &f),
                 STOF_ERR_OUT_OF_MEMORY);
    cr_expect(strstr(stof_errmsg(ctx), "cuModuleGetFunction") &&
                  strstr(stof_errmsg(ctx), "CUDA_ERROR_OUT_OF_MEMORY"),
              "%s", stof_errmsg(ctx));
    g_load_result = CUDA_ERROR_OUT_OF_MEMORY;
    /* The module cache passes the status on. */
    g_load_result = CUDA_ERROR_OUT_OF_MEMORY;
    cr_expect_eq(stof__module_load_shared(ctx, cubin, sizeof(cubin),
                                          "stof_x", 0, &m, &f),
                 STOF_ERR_OUT_OF_MEMORY);
    stof_close(&ctx);
}

static int g_loads;

static CUresult fake_module_load_count(CUmodule *m, const void *image)
{
    (void)image;
    *m = (CUmodule)(uintptr_t)(16 + 16 * ++g_loads);
    return CUDA_SUCCESS;
}

static CUresult fake_get_function_ok(CUfunction *f, CUmodule m, const char *n)
{
    (void)n;
    *f = (CUfunction)((uintptr_t)m + 1);
    return CUDA_SUCCESS;
}

/* A module known by its cubin's hash (a warm plan's record served without
 * its bytes): found in the context's cache without the bytes, the same
 * module as the load that put it there and no load more; not in the
 * cache: STOF_ERR_NOT_FOUND with nothing loaded and no message, and with
 * the bytes it loads as usual. */
Test(jit, fake_shared_load_by_hash, .fini = restore_api)
{
    use_fake_driver();
    g_loads = 0;
    g_fake.cuModuleLoadData = fake_module_load_count;
    g_fake.cuModuleGetFunction = fake_get_function_ok;
    g_fake.cuModuleUnload = fake_unload;
    stof_context *ctx;
    cr_assert_eq(open_with(0, 1, &ctx), STOF_OK, "%s", stof_errmsg(ctx));
    static const unsigned char a[64] = {1, 2, 3}, b[64] = {4, 5, 6};
    const uint64_t ha = XXH3_64bits(a, sizeof(a)),
                   hb = XXH3_64bits(b, sizeof(b));
    CUmodule m1 = NULL, m2 = NULL, m3 = NULL;
    CUfunction f1 = NULL, f2 = NULL, f3 = NULL;
    cr_assert_eq(stof__module_load_shared(ctx, a, sizeof(a), "stof_x", 0, &m1,
                                          &f1),
                 STOF_OK, "%s", stof_errmsg(ctx));
    cr_expect_eq(g_loads, 1);
    cr_expect_eq(stof__module_load_shared_hashed(ctx, NULL, sizeof(a), ha,
                                                 "stof_x", 0, &m2, &f2),
                 STOF_OK, "%s", stof_errmsg(ctx));
    cr_expect_eq((void *)m2, (void *)m1);
    cr_expect_eq((void *)f2, (void *)f1);
    cr_expect_eq(g_loads, 1);
    /* another size under the same hash is another cubin */
    cr_expect_eq(stof__module_load_shared_hashed(ctx, NULL, sizeof(a) - 1, ha,
                                                 "stof_x", 0, &m3, &f3),
                 STOF_ERR_NOT_FOUND);
    cr_expect_eq(stof__module_load_shared_hashed(ctx, NULL, sizeof(b), hb,
                                                 "stof_x", 0, &m3, &f3),
                 STOF_ERR_NOT_FOUND);
    cr_expect_eq(g_loads, 1);
    cr_expect_eq(stof__module_load_shared_hashed(ctx, b, sizeof(b), hb,
                                                 "stof_x", 0, &m3, &f3),
                 STOF_OK, "%s", stof_errmsg(ctx));
    cr_expect_eq(g_loads, 2);
    cr_expect_neq((void *)m3, (void *)m1);
    /* no bytes and no hash: refused */
    cr_expect_eq(stof__module_load_shared_hashed(ctx, NULL, sizeof(b), 0,
                                                 "stof_x", 0, &m3, &f3),
                 STOF_ERR_INVALID_ARGUMENT);
    stof__module_release(ctx, m1);
    stof__module_release(ctx, m2);
    stof__module_release(ctx, m3);
    stof_close(&ctx);
}

Test(jit, fake_device_ok, .fini = restore_api)
{
    use_fake_driver();
    stof_context *ctx;
    cr_assert_eq(open_with(0, 1, &ctx), STOF_OK, "%s", stof_errmsg(ctx));
    cr_assert_eq(stof_has_device(ctx), 1);
    cr_expect_eq(g_retains, 1);
    cr_expect_str_eq(ctx->device.arch, "sm_90");
    cr_expect_eq(ctx->device.sm_count, 132);
    cr_expect_eq(ctx->device.total_mem, (size_t)80 << 30);

    cr_expect_eq(stof__ctx_push(ctx), STOF_OK);
    stof__ctx_pop(ctx);
    cr_expect_eq(g_pushes, 1);
    cr_expect_eq(g_pops, 1);

    /* Size, then fetch. */
    size_t needed = 0;
    cr_expect_eq(stof_device_describe(ctx, NULL, 0, &needed),
                 STOF_ERR_BUFFER_TOO_SMALL);
    cr_assert_gt(needed, 0);
    char *buf = malloc(needed + 1);
    cr_assert(buf);
    size_t again = 0;
    cr_assert_eq(stof_device_describe(ctx, buf, needed + 1, &again), STOF_OK,
                 "%s", stof_errmsg(ctx));
    cr_expect_eq(again, needed);
    cr_expect_eq(strlen(buf), needed);
    cr_expect(strstr(buf, "\"name\":\"Fake \\\"H100\\\"\\\\GPU\""),
              "name not escaped: %s", buf);
    cr_expect(strstr(buf, "\"cc\":\"9.0\""), "%s", buf);
    cr_expect(strstr(buf, "\"sm_count\":132"), "%s", buf);
    cr_expect(strstr(buf, "\"smem_optin\":232448"), "%s", buf);
    cr_expect(strstr(buf, "\"l2_bytes\":52428800"), "%s", buf);
    cr_expect(strstr(buf, "\"total_mem\":85899345920"), "%s", buf);
    cr_expect(strstr(buf, "\"driver_version\":13000"), "%s", buf);
    cr_expect(strstr(buf, "\"nvrtc_version\":null"), "%s", buf);
    cr_expect(strstr(buf, "\"arch\":\"sm_90\""), "%s", buf);
    char small[8];
    cr_expect_eq(stof_device_describe(ctx, small, sizeof(small), &again),
                 STOF_ERR_BUFFER_TOO_SMALL);
    cr_expect_eq(strlen(small), sizeof(small) - 1);
    cr_expect_eq(strncmp(small, buf, sizeof(small) - 1), 0);
    free(buf);

    stof_close(&ctx);
    cr_expect_eq(g_releases, 1);
}

Test(jit, fake_arch_choice, .fini = restore_api)
{
    static const int archs[] = {75, 80, 86, 90};
    use_fake_driver();
    use_fake_nvrtc(archs, 4);
    struct {
        int major, minor;
        const char *want;
    } cases[] = {{9, 0, "sm_90"}, {8, 6, "sm_86"}, {8, 9, "sm_86"},
                 {12, 0, "sm_90"}, {7, 0, "sm_70"}};
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        g_fake_cc_major = cases[i].major;
        g_fake_cc_minor = cases[i].minor;
        stof_context *ctx;
        cr_assert_eq(open_with(0, 1, &ctx), STOF_OK, "%s", stof_errmsg(ctx));
        cr_expect_str_eq(ctx->device.arch, cases[i].want, "cc %d.%d",
                         cases[i].major, cases[i].minor);
        cr_expect_eq(ctx->device.nvrtc_major, 12);
        cr_expect_eq(ctx->device.nvrtc_minor, 4);
        stof_close(&ctx);
    }
}

Test(jit, cuda_fail_message, .fini = restore_api)
{
    use_fake_driver();
    stof_context *ctx;
    cr_assert_eq(open_with(0, 1, &ctx), STOF_OK);
    int st = stof__cuda_fail(ctx, CUDA_ERROR_OUT_OF_MEMORY,
                             "cuMemAlloc(&p, n)", "../src/attention.c", 123);
    cr_expect_eq(st, STOF_ERR_OUT_OF_MEMORY);
    cr_expect_eq(stof_errcode(ctx), STOF_ERR_OUT_OF_MEMORY);
    cr_expect_str_eq(stof_errmsg(ctx),
                     "cuMemAlloc(&p, n) failed: CUDA_ERROR_OUT_OF_MEMORY "
                     "(out of memory) at src/attention.c:123");
    /* An unknown code, and the macro. */
    st = stof__cuda_fail(ctx, (CUresult)7777, "cuFoo()", "src/x.c", 9);
    cr_expect_str_eq(stof_errmsg(ctx), "cuFoo() failed: CUresult 7777 at "
                                       "src/x.c:9");
    stof_close(&ctx);
}

/* The format cache's derived arrays (format_cache.c) with a fake driver:
 * kept under whole keys, found only under the same key, one per key; held
 * by the plans that find or keep them; an array no plan holds gives way,
 * least recently used first, to one that needs its slot (eight an entry)
 * or its bytes (16 MB an entry); the rest go with the entry. */
static CUdeviceptr g_freed[32];
static int g_n_freed;

static CUresult fake_mem_free(CUdeviceptr p)
{
    if (g_n_freed < 32)
        g_freed[g_n_freed] = p;
    g_n_freed++;
    return CUDA_SUCCESS;
}

static int was_freed(CUdeviceptr p)
{
    int n = 0;
    for (int i = 0; i < g_n_freed && i < 32; i++)
        n += g_freed[i] == p;
    return n;
}

Test(jit, format_cache_keeps_derived_arrays, .fini = restore_api)
{
    use_fake_driver();
    g_fake.cuMemFree = fake_mem_free;
    g_n_freed = 0;
    stof_context *ctx;
    cr_assert_eq(open_with(0, 1, &ctx), STOF_OK, "%s", stof_errmsg(ctx));
    /* A one-tile format, its device memory a fake address. */
    int64_t row_ptr[2] = {0, 1};
    uint8_t kind[1] = {STOF_TILE_FULL};
    stof_format counts = {.seq_q = 64, .seq_k = 64, .block_m = 64,
                          .block_n = 64, .n_row_blocks = 1,
                          .n_col_blocks = 1, .n_full = 1,
                          .row_ptr = row_ptr, .kind = kind};
    stof_block_format bf = {0};
    bf.mem = (CUdeviceptr)0x10000;
    bf.bytes = 4096;
    void *h = stof__fmtcache_put(ctx, "00ff", 64, 64, 64, 64, &bf, 1, &counts);
    cr_assert_not_null(h);

    enum { NK = 10 };
    int32_t k[NK][STOF_FMTCACHE_KEY];
    memset(k, 0, sizeof(k));
    for (int i = 0; i < NK; i++)
        k[i][0] = 2, k[i][STOF_FMTCACHE_KEY - 1] = i; /* one int apart */
    const CUdeviceptr a0 = 0x100;
    int32_t v = -1;
    cr_expect_eq(stof__fmtcache_find_array(ctx, h, k[0], &v), 0);
    cr_expect_eq(stof__fmtcache_keep_array(ctx, h, k[0], a0, 64, 7), 1);
    cr_expect_eq(stof__fmtcache_find_array(ctx, h, k[0], &v), a0);
    cr_expect_eq(v, 7);
    cr_expect_eq(stof__fmtcache_find_array(ctx, h, k[1], NULL), 0);
    /* A key already kept: the second array stays the caller's. */
    cr_expect_eq(stof__fmtcache_keep_array(ctx, h, k[0], 0x200, 64, 8), 0);
    /* Eight slots, each array held by its keeper: a ninth is not kept. */
    for (int i = 1; i < 8; i++)
        cr_expect_eq(stof__fmtcache_keep_array(ctx, h, k[i],
                                               (CUdeviceptr)(0x1000 * i), 64,
                                               i),
                     1, "array %d", i);
    cr_expect_eq(stof__fmtcache_keep_array(ctx, h, k[8], 0x9000, 64, 0), 0);
    /* An array no plan holds gives way to a new one, the least recently
     * used first; a0, held by its keep and its find, released once, stays. */
    stof__fmtcache_release_array(ctx, h, 0x3000);
    stof__fmtcache_release_array(ctx, h, 0x5000);
    stof__fmtcache_release_array(ctx, h, a0);
    cr_expect_eq(stof__fmtcache_keep_array(ctx, h, k[8], 0x9000, 64, 0), 1);
    cr_expect_eq(was_freed(0x3000), 1, "the least recently used one");
    cr_expect_eq(was_freed(0x5000) + was_freed(a0), 0);
    cr_expect_eq(stof__fmtcache_find_array(ctx, h, k[3], NULL), 0);
    cr_expect_eq(stof__fmtcache_find_array(ctx, h, k[5], NULL), 0x5000);
    stof__fmtcache_release_array(ctx, h, 0x5000); /* the find's hold */
    /* Bytes: more than an entry's 16 MB is never kept, evicting nothing;
     * 10 MB evicts the unheld 0x5000 for its slot. */
    cr_expect_eq(stof__fmtcache_keep_array(ctx, h, k[9], 0xa000,
                                           ((size_t)16 << 20) + 1, 0),
                 0);
    cr_expect_eq(was_freed(0x5000), 0);
    cr_expect_eq(stof__fmtcache_keep_array(ctx, h, k[9], 0xa000,
                                           (size_t)10 << 20, 0),
                 1);
    cr_expect_eq(was_freed(0x5000), 1);
    /* A slot made free, but 10 MB more beside the held 10 MB: not kept,
     * and nothing evicted for it. */
    stof__fmtcache_release_array(ctx, h, 0x7000);
    cr_expect_eq(stof__fmtcache_keep_array(ctx, h, k[5], 0xb000,
                                           (size_t)10 << 20, 0),
                 0, "20 MB of arrays in one entry");
    cr_expect_eq(was_freed(0x7000), 0);
    /* Every slot held: not kept. */
    cr_expect_eq(stof__fmtcache_find_array(ctx, h, k[7], NULL), 0x7000);
    cr_expect_eq(stof__fmtcache_keep_array(ctx, h, k[5], 0xb000, 64, 0), 0);
    /* Nothing without a handle, a key or an array. */
    cr_expect_eq(stof__fmtcache_keep_array(ctx, NULL, k[5], 0x600, 64, 0), 0);
    cr_expect_eq(stof__fmtcache_keep_array(ctx, h, k[5], 0, 64, 0), 0);
    cr_expect_eq(stof__fmtcache_find_array(ctx, h, NULL, NULL), 0);
    cr_expect_eq(g_n_freed, 2);
    stof__fmtcache_unref(ctx, h);
    stof_close(&ctx);
    /* The rest go with the entry, once each: a0, 0x1000, 0x2000, 0x4000,
     * 0x6000, 0x7000, 0x9000, 0xa000 and the format; never the callers'
     * own (0x200, 0xb000). */
    cr_expect_eq(g_n_freed, 2 + 9);
    const CUdeviceptr kept[] = {a0,     0x1000, 0x2000, 0x4000, 0x6000,
                                0x7000, 0x9000, 0xa000, 0x10000};
    for (size_t i = 0; i < sizeof(kept) / sizeof(*kept); i++)
        cr_expect_eq(was_freed(kept[i]), 1, "0x%llx",
                     (unsigned long long)kept[i]);
    cr_expect_eq(was_freed(0x200) + was_freed(0xb000), 0);
}
