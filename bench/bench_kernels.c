/*
 * bench_kernels.c - stof-bench-kernels: kernel time of the block-wise and
 * the gather (row-wise) sparse attention kernels (jit_templates/attn_block.cu)
 * over a list of configurations, for masks and shapes (default: the public
 * suite of BENCH.md at 4x16x4096x64 and 1x32x8192x128, fp16), with the
 * format statistics the time depends on. It is the raw material of the cost
 * model, so every row carries what the kernel had to do:
 *
 *   tiles    BM x BN tiles one (batch, head) computes: non-empty tiles of
 *            the tile BSR (block), or compacted tiles (gather: every row
 *            block's key list cut into tiles of BN entries)
 *   part%    share of those tiles that need the bitmap (partial)
 *   work     tiles * BM * BN / (seq_q * seq_k): the computed share of the
 *            dense problem
 *   util     allowed elements / (tiles * BM * BN): the useful share of it
 *   maxT     the most tiles of one row block (one CTA walks a row block), and
 *   imb      maxT / mean tiles per row block (load imbalance)
 *   keys/N   gather: mean listed keys per row block / seq_k
 *   ns/tile  time / (batch * heads * tiles)
 *   eff TF/s 4 * B * H * D * allowed / time (unmasked elements only)
 *   check    ||o - o_first|| / ||o_first|| against the first configuration
 *            run on the same inputs (0 for it; a sanity check)
 *
 * Timing: CUDA events around each launch, warm-up first, median over the
 * repetitions; inputs and outputs rotate among enough buffer sets to exceed
 * three times the L2 cache, so every run starts with its own data cold.
 * Kernels are compiled on CPU threads up front (NVRTC), then loaded.
 *
 * Usage: stof-bench-kernels [--quick] [--reps N] [--bf16]
 *            [--kind block|gather|both] [--mask NAME=SPEC]...
 *            [--shape BxHxNxD]... [--cfg BMxBNxWxS]...
 */
#include "attn_block.h"
#include "internal.h"

#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define MAX_MASKS 32
#define MAX_SHAPES 16
#define MAX_CFGS 16
#define MAX_REPS 1000

typedef struct bench_mask {
    const char *name, *spec;
} bench_mask;

typedef struct bench_shape {
    int batch, heads, seq, head_dim;
} bench_shape;

static const bench_mask default_masks[] = {
    {"none", "dense"},
    {"causal", "causal"},
    {"sliding", "sliding:256"},
    {"dilated", "dilated:512:2"},
    {"longformer", "longformer:256:64"},
    {"bigbird", "bigbird:64:3:2:3:1"},
    {"strided", "strided:128"},
};

static const bench_shape default_shapes[] = {{4, 16, 4096, 64},
                                             {1, 32, 8192, 128}};

/* Configurations {block_m, block_n, warps, stages} tried for both kinds,
 * by head_dim (the first of each list is the one --quick keeps, with the
 * second). */
static const stof_block_cfg cfgs_d64[] = {
    {128, 64, 4, 2, 0, 0, 0}, {64, 128, 4, 3, 0, 0, 0},
    {128, 64, 8, 2, 0, 0, 0}, {64, 64, 4, 2, 0, 0, 0},
    {128, 128, 8, 2, 0, 0, 0}, {128, 32, 4, 2, 0, 0, 0},
};
static const stof_block_cfg cfgs_d128[] = {
    {128, 32, 4, 2, 0, 0, 0}, {64, 64, 4, 2, 0, 0, 0},
    {128, 64, 8, 2, 0, 0, 0}, {64, 128, 4, 3, 0, 0, 0},
    {128, 128, 8, 2, 0, 0, 0}, {64, 32, 4, 2, 0, 0, 0},
};
static const stof_block_cfg cfgs_other[] = {
    {128, 64, 8, 2, 0, 0, 0}, {64, 64, 4, 2, 0, 0, 0}, {64, 32, 4, 1, 0, 0, 0},
};

typedef struct options {
    int quick, reps;
    stof_dtype dtype;
    int kinds; /* bit 0 block, bit 1 gather */
    bench_mask masks[MAX_MASKS];
    int n_masks;
    bench_shape shapes[MAX_SHAPES];
    int n_shapes;
    stof_block_cfg cfgs[MAX_CFGS];
    int n_cfgs; /* 0: the lists above */
} options;

static void usage(FILE *out)
{
    fprintf(out,
            "usage: stof-bench-kernels [options]\n"
            "Times the block-wise and gather (row-wise) sparse attention "
            "kernels.\n"
            "  --quick            short run: first shape only, 2 configs "
            "per kind, 20 reps\n"
            "  --reps N           timed repetitions per config (default "
            "30, at least 20)\n"
            "  --bf16             bf16 inputs (default fp16)\n"
            "  --kind K           block, gather or both (default both)\n"
            "  --mask NAME=SPEC   a mask (repeatable; default: the public "
            "suite)\n"
            "  --shape BxHxNxD    batch x heads x seq x head_dim "
            "(repeatable; default\n"
            "                     4x16x4096x64 and 1x32x8192x128)\n"
            "  --cfg BMxBNxWxS    block_m x block_n x warps x stages "
            "(repeatable;\n"
            "                     default: a list per head_dim)\n"
            "  --help             this text\n");
}

static int parse_args(int argc, char **argv, options *o)
{
    memset(o, 0, sizeof(*o));
    o->reps = 30;
    o->dtype = STOF_DTYPE_FP16;
    o->kinds = 3;
    int reps_set = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            exit(0);
        } else if (!strcmp(a, "--quick")) {
            o->quick = 1;
        } else if (!strcmp(a, "--bf16")) {
            o->dtype = STOF_DTYPE_BF16;
        } else if (!strcmp(a, "--reps") && v) {
            o->reps = atoi(v);
            reps_set = 1;
            i++;
        } else if (!strcmp(a, "--kind") && v) {
            o->kinds = !strcmp(v, "block")    ? 1
                       : !strcmp(v, "gather") ? 2
                       : !strcmp(v, "both")   ? 3
                                              : 0;
            if (!o->kinds) {
                fprintf(stderr, "--kind: block, gather or both\n");
                return -1;
            }
            i++;
        } else if (!strcmp(a, "--mask") && v && o->n_masks < MAX_MASKS) {
            const char *eq = strchr(v, '=');
            bench_mask *m = &o->masks[o->n_masks++];
            if (eq) {
                char *name = strndup(v, (size_t)(eq - v));
                m->name = name ? name : v;
                m->spec = eq + 1;
            } else {
                m->name = m->spec = v;
            }
            i++;
        } else if (!strcmp(a, "--shape") && v && o->n_shapes < MAX_SHAPES) {
            bench_shape *s = &o->shapes[o->n_shapes++];
            if (sscanf(v, "%dx%dx%dx%d", &s->batch, &s->heads, &s->seq,
                       &s->head_dim) != 4 ||
                s->batch < 1 || s->heads < 1 || s->seq < 1 ||
                s->head_dim < 1) {
                fprintf(stderr, "--shape %s: expected BxHxNxD\n", v);
                return -1;
            }
            i++;
        } else if (!strcmp(a, "--cfg") && v && o->n_cfgs < MAX_CFGS) {
            stof_block_cfg *c = &o->cfgs[o->n_cfgs++];
            memset(c, 0, sizeof(*c));
            if (sscanf(v, "%dx%dx%dx%d", &c->block_m, &c->block_n, &c->warps,
                       &c->stages) != 4) {
                fprintf(stderr, "--cfg %s: expected BMxBNxWxS\n", v);
                return -1;
            }
            i++;
        } else {
            fprintf(stderr, "unknown or incomplete option %s\n", a);
            usage(stderr);
            return -1;
        }
    }
    if (o->quick && !reps_set)
        o->reps = 20;
    if (o->reps < 20)
        o->reps = 20;
    if (o->reps > MAX_REPS)
        o->reps = MAX_REPS;
    if (!o->n_masks) {
        o->n_masks = (int)(sizeof(default_masks) / sizeof(*default_masks));
        memcpy(o->masks, default_masks, sizeof(default_masks));
    }
    if (!o->n_shapes) {
        o->n_shapes = o->quick ? 1 : 2;
        memcpy(o->shapes, default_shapes, sizeof(default_shapes));
    }
    return 0;
}

/* The configurations for one head_dim (gather = 0; each is run as both
 * kinds). */
static int cfgs_for(const options *o, int head_dim, stof_block_cfg *out)
{
    if (o->n_cfgs) {
        memcpy(out, o->cfgs, (size_t)o->n_cfgs * sizeof(*out));
        return o->n_cfgs;
    }
    const stof_block_cfg *l = cfgs_other;
    int n = (int)(sizeof(cfgs_other) / sizeof(*cfgs_other));
    if (head_dim <= 64) {
        l = cfgs_d64;
        n = (int)(sizeof(cfgs_d64) / sizeof(*cfgs_d64));
    } else if (head_dim == 128) {
        l = cfgs_d128;
        n = (int)(sizeof(cfgs_d128) / sizeof(*cfgs_d128));
    }
    if (o->quick && n > 2)
        n = 2;
    memcpy(out, l, (size_t)n * sizeof(*out));
    return n;
}

/* ------------------------------------------------------------------------ */
/* Kernels: compiled on threads, loaded once, kept for the whole run         */
/* ------------------------------------------------------------------------ */

typedef struct kernel {
    int head_dim;
    stof_dtype dtype;
    stof_block_cfg cfg;
    void *cubin;
    size_t cubin_size;
    int compile_st;
    CUmodule mod;
    CUfunction fn;
    int load_st;
} kernel;

#define MAX_KERNELS 256
static kernel g_kernels[MAX_KERNELS];
static int g_n_kernels;
static const char *g_arch;

static kernel *kernel_find(int head_dim, stof_dtype dt,
                           const stof_block_cfg *c)
{
    for (int i = 0; i < g_n_kernels; i++) {
        kernel *k = &g_kernels[i];
        if (k->head_dim == head_dim && k->dtype == dt &&
            !memcmp(&k->cfg, c, sizeof(*c)))
            return k;
    }
    return NULL;
}

static void kernel_add(int head_dim, stof_dtype dt, const stof_block_cfg *c)
{
    if (kernel_find(head_dim, dt, c) || g_n_kernels >= MAX_KERNELS)
        return;
    kernel *k = &g_kernels[g_n_kernels++];
    memset(k, 0, sizeof(*k));
    k->head_dim = head_dim;
    k->dtype = dt;
    k->cfg = *c;
    k->compile_st = -1;
}

static int g_next_job;
static pthread_mutex_t g_job_lock = PTHREAD_MUTEX_INITIALIZER;

/* The same defines as stof__block_load. */
static void *compile_worker(void *arg)
{
    (void)arg;
    for (;;) {
        pthread_mutex_lock(&g_job_lock);
        const int i = g_next_job++;
        pthread_mutex_unlock(&g_job_lock);
        if (i >= g_n_kernels)
            return NULL;
        kernel *k = &g_kernels[i];
        char d[6][32];
        snprintf(d[0], sizeof(d[0]), "HEAD_DIM=%d", k->head_dim);
        snprintf(d[1], sizeof(d[1]), "DTYPE=%d", (int)k->dtype);
        snprintf(d[2], sizeof(d[2]), "BLOCK_M=%d", k->cfg.block_m);
        snprintf(d[3], sizeof(d[3]), "BLOCK_N=%d", k->cfg.block_n);
        snprintf(d[4], sizeof(d[4]), "WARPS=%d", k->cfg.warps);
        snprintf(d[5], sizeof(d[5]), "STAGES=%d", k->cfg.stages);
        const char *defs[] = {d[0], d[1], d[2], d[3], d[4], d[5], "GATHER=1"};
        k->compile_st = stof__jit_compile(NULL, "attn_block.cu", defs,
                                          k->cfg.gather ? 7 : 6, g_arch,
                                          &k->cubin, &k->cubin_size);
    }
}

static void compile_all(int threads)
{
    pthread_t t[32];
    if (threads > 32)
        threads = 32;
    if (threads < 1)
        threads = 1;
    g_next_job = 0;
    int started = 0;
    for (int i = 0; i < threads; i++)
        if (pthread_create(&t[i], NULL, compile_worker, NULL) == 0)
            started++;
    if (!started)
        compile_worker(NULL);
    for (int i = 0; i < started; i++)
        pthread_join(t[i], NULL);
}

/* Load a compiled kernel into the (current) primary context. */
static int kernel_load(const stof_api *api, kernel *k)
{
    if (k->mod)
        return 0;
    if (k->compile_st != STOF_OK || !k->cubin)
        return -1;
    if (api->cuModuleLoadData(&k->mod, k->cubin) != CUDA_SUCCESS ||
        api->cuModuleGetFunction(&k->fn, k->mod, "stof_attn_block") !=
            CUDA_SUCCESS ||
        api->cuFuncSetAttribute(
            k->fn, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
            (int)stof__block_smem_bytes(k->head_dim, &k->cfg)) !=
            CUDA_SUCCESS) {
        k->load_st = -1;
        return -1;
    }
    return 0;
}

/* ------------------------------------------------------------------------ */
/* Timing                                                                    */
/* ------------------------------------------------------------------------ */

static int cmp_float(const void *a, const void *b)
{
    float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

static uint64_t g_rng = 0x9e3779b97f4a7c15ull;

static uint64_t rng_next(void)
{
    uint64_t z = (g_rng += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* A 16-bit value uniform in about [-1, 1) for fp16 or bf16. */
static uint16_t rand16(stof_dtype dt)
{
    const float x = (float)((double)(rng_next() >> 11) * 0x1.0p-53 * 2.0 - 1.0);
    uint32_t u;
    memcpy(&u, &x, 4);
    if (dt == STOF_DTYPE_BF16)
        return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
    /* fp16 of |x| < 1: normal or subnormal, truncated (enough for data). */
    const uint32_t sign = (u >> 16) & 0x8000u;
    const int e = (int)((u >> 23) & 0xff) - 127 + 15;
    if (e <= 0)
        return (uint16_t)sign;
    return (uint16_t)(sign | (uint32_t)e << 10 | ((u >> 13) & 0x3ffu));
}

typedef struct buffers {
    int sets;
    size_t elems; /* per tensor */
    CUdeviceptr q[8], k[8], v[8], o[8];
} buffers;

static void buffers_free(const stof_api *api, buffers *b)
{
    for (int i = 0; i < b->sets; i++) {
        api->cuMemFree(b->q[i]);
        api->cuMemFree(b->k[i]);
        api->cuMemFree(b->v[i]);
        api->cuMemFree(b->o[i]);
    }
    memset(b, 0, sizeof(*b));
}

/* BHSD tensors, random inputs, enough sets to exceed 3 x L2. */
static int buffers_make(const stof_api *api, const stof_device *dev,
                        const bench_shape *s, stof_dtype dt, buffers *b)
{
    memset(b, 0, sizeof(*b));
    b->elems = (size_t)s->batch * s->heads * s->seq * s->head_dim;
    const size_t bytes = b->elems * 2u;
    const size_t l2 = dev->l2_bytes > 0 ? (size_t)dev->l2_bytes : 64u << 20;
    int sets = (int)((3u * l2 + 4u * bytes - 1u) / (4u * bytes));
    if (sets < 2)
        sets = 2;
    if (sets > 8)
        sets = 8;
    uint16_t *h = malloc(bytes);
    if (!h)
        return -1;
    for (int i = 0; i < sets; i++) {
        CUdeviceptr *p[4] = {&b->q[i], &b->k[i], &b->v[i], &b->o[i]};
        for (int t = 0; t < 4; t++)
            if (api->cuMemAlloc(p[t], bytes) != CUDA_SUCCESS) {
                for (int u = 0; u < t; u++)
                    api->cuMemFree(*p[u]);
                free(h);
                buffers_free(api, b);
                return -1;
            }
        b->sets = i + 1;
        api->cuMemsetD8(b->o[i], 0, bytes);
    }
    /* q, k, v: different random data, the same in every set. */
    for (int t = 0; t < 3; t++) {
        for (size_t e = 0; e < b->elems; e++)
            h[e] = rand16(dt);
        for (int i = 0; i < sets; i++)
            api->cuMemcpyHtoD(t == 0 ? b->q[i] : t == 1 ? b->k[i] : b->v[i],
                              h, bytes);
    }
    free(h);
    return 0;
}

/* One launch of kernel k on buffer set `i`. */
typedef struct launch {
    kernel *k;
    const stof_attention_desc *d;
    const stof_block_format *bf;
    const stof_rowwise_format *rf;
    const buffers *b;
} launch;

static stof_status launch_one(const stof_api *api, const launch *l, int i)
{
    const kernel *k = l->k;
    if (k->cfg.gather)
        return stof__rowwise_launch(k->fn, &k->cfg, k->head_dim, l->d, 0.0f,
                                    l->rf, l->b->q[i], l->b->k[i], l->b->v[i],
                                    l->b->o[i], NULL, api);
    return stof__block_launch(k->fn, &k->cfg, k->head_dim, l->d, 0.0f, l->bf,
                              l->b->q[i], l->b->k[i], l->b->v[i], l->b->o[i],
                              NULL, api);
}

/* Median time in ms of `reps` launches (after 3 warm-ups), or < 0. */
static double time_kernel(const stof_api *api, const launch *l, int reps)
{
    static CUevent ev[2 * MAX_REPS];
    static int have_events;
    if (!have_events) {
        for (int i = 0; i < 2 * MAX_REPS; i++)
            if (api->cuEventCreate(&ev[i], 0) != CUDA_SUCCESS)
                return -1.0;
        have_events = 1;
    }
    const int sets = l->b->sets;
    for (int w = 0; w < 3; w++)
        if (launch_one(api, l, w % sets) != STOF_OK)
            return -1.0;
    for (int r = 0; r < reps; r++) {
        api->cuEventRecord(ev[2 * r], NULL);
        launch_one(api, l, (r + 3) % sets);
        api->cuEventRecord(ev[2 * r + 1], NULL);
    }
    if (api->cuCtxSynchronize() != CUDA_SUCCESS)
        return -1.0;
    float ms[MAX_REPS];
    for (int r = 0; r < reps; r++)
        api->cuEventElapsedTime(&ms[r], ev[2 * r], ev[2 * r + 1]);
    qsort(ms, (size_t)reps, sizeof(float), cmp_float);
    return reps % 2 ? ms[reps / 2] : 0.5 * (ms[reps / 2 - 1] + ms[reps / 2]);
}

/* Half-precision bits to float. */
static float h2f(uint16_t h, stof_dtype dt)
{
    uint32_t u;
    if (dt == STOF_DTYPE_BF16) {
        u = (uint32_t)h << 16;
    } else {
        const uint32_t s = (uint32_t)(h & 0x8000u) << 16;
        const int e = (h >> 10) & 0x1f;
        const uint32_t m = h & 0x3ffu;
        if (e == 0) {
            const float f = (float)m * 0x1.0p-24f;
            return (h & 0x8000u) ? -f : f;
        }
        u = e == 31 ? s | 0x7f800000u | (m << 13)
                    : s | (uint32_t)(e - 15 + 127) << 23 | (m << 13);
    }
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* ||o - ref|| / ||ref|| over a sample of the output (NaN -> +inf). */
static double out_diff(const uint16_t *o, const uint16_t *ref, size_t n,
                       stof_dtype dt)
{
    double num = 0.0, den = 0.0;
    for (size_t i = 0; i < n; i += 7) {
        const double a = h2f(o[i], dt), b = h2f(ref[i], dt);
        if (isnan(a))
            return INFINITY;
        num += (a - b) * (a - b);
        den += b * b;
    }
    return den > 0.0 ? sqrt(num / den) : sqrt(num);
}

/* ------------------------------------------------------------------------ */
/* The table                                                                 */
/* ------------------------------------------------------------------------ */

typedef struct result {
    int gather;
    stof_block_cfg cfg;
    double ms, tfs;
} result;

/* Formats of one mask, cached by tiling. */
typedef struct fmt_entry {
    int bm, bn;
    stof_format *f;
    stof_block_format bf;
    stof_rowwise_format rf;
    int have_bf, have_rf;
} fmt_entry;

static fmt_entry *fmt_get(stof_context *ctx, const stof_mask *m,
                          fmt_entry *cache, int *n, int bm, int bn,
                          int gather)
{
    fmt_entry *e = NULL;
    for (int i = 0; i < *n; i++)
        if (cache[i].bm == bm && cache[i].bn == bn)
            e = &cache[i];
    if (!e) {
        e = &cache[(*n)++];
        memset(e, 0, sizeof(*e));
        e->bm = bm;
        e->bn = bn;
        if (stof_format_build(ctx, m, bm, bn, &e->f) != STOF_OK) {
            fprintf(stderr, "format %dx%d: %s\n", bm, bn, stof_errmsg(ctx));
            return NULL;
        }
    }
    if (!e->f)
        return NULL;
    if (!gather && !e->have_bf) {
        if (stof__block_format_upload(ctx, e->f, &e->bf) != STOF_OK) {
            fprintf(stderr, "block upload: %s\n", stof_errmsg(ctx));
            return NULL;
        }
        e->have_bf = 1;
    }
    if (gather && !e->have_rf) {
        if (stof__rowwise_format_upload(ctx, e->f, &e->rf) != STOF_OK) {
            fprintf(stderr, "row-wise upload: %s\n", stof_errmsg(ctx));
            return NULL;
        }
        e->have_rf = 1;
    }
    return e;
}

static void print_header(void)
{
    printf("%-11s %-15s %-6s %-12s %8s %7s %7s %5s %6s %5s %5s %5s %6s "
           "%7s %8s\n",
           "mask", "shape", "kind", "cfg", "ms", "TF/s", "tiles", "part%",
           "work", "util", "maxT", "imb", "keys/N", "ns/tile", "check");
}

static int bench_mask_shape(stof_context *ctx, const options *o,
                            const bench_mask *bm, const bench_shape *s,
                            const buffers *b)
{
    const stof_api *api = ctx->api;
    stof_mask *m = NULL;
    if (stof_mask_from_spec(ctx, bm->spec, s->seq, s->seq, &m) != STOF_OK) {
        fprintf(stderr, "mask %s: %s\n", bm->spec, stof_errmsg(ctx));
        return -1;
    }
    const double density = stof_mask_density(m);
    const double allowed = (double)stof_mask_count(m);
    stof_attention_desc d;
    stof_attention_desc_init(&d, s->batch, s->heads, s->seq, s->seq,
                             s->head_dim, o->dtype, STOF_LAYOUT_BHSD);
    char shape[32];
    snprintf(shape, sizeof(shape), "%dx%dx%dx%d", s->batch, s->heads, s->seq,
             s->head_dim);

    stof_block_cfg cl[MAX_CFGS];
    const int nc = cfgs_for(o, s->head_dim, cl);
    fmt_entry cache[MAX_CFGS];
    int n_cache = 0;
    result res[2 * MAX_CFGS];
    int n_res = 0;
    uint16_t *ref = NULL, *out = NULL;
    const size_t n_out = b->elems;
    ref = malloc(n_out * 2u);
    out = malloc(n_out * 2u);
    int have_ref = 0;

    for (int kind = 0; kind < 2; kind++) {
        if (!(o->kinds & (1 << kind)))
            continue;
        for (int ci = 0; ci < nc; ci++) {
            stof_block_cfg c = cl[ci];
            c.gather = kind;
            char cs[32];
            snprintf(cs, sizeof(cs), "%dx%dx%dx%d", c.block_m, c.block_n,
                     c.warps, c.stages);
            kernel *k = kernel_find(s->head_dim, o->dtype, &c);
            if (!k || kernel_load(api, k) != 0) {
                printf("%-11s %-15s %-6s %-12s  (kernel unavailable)\n",
                       bm->name, shape, kind ? "gather" : "block", cs);
                continue;
            }
            fmt_entry *e =
                fmt_get(ctx, m, cache, &n_cache, c.block_m, c.block_n, kind);
            if (!e)
                continue;
            launch l = {k, &d, &e->bf, &e->rf, b};
            const double ms = time_kernel(api, &l, o->reps);
            if (ms < 0.0) {
                printf("%-11s %-15s %-6s %-12s  (launch failed)\n", bm->name,
                       shape, kind ? "gather" : "block", cs);
                continue;
            }
            /* Output of the last timed run: set (reps + 2) % sets. */
            const int last = (o->reps + 2) % b->sets;
            double check = NAN;
            if (ref && out) {
                if (!have_ref) {
                    api->cuMemcpyDtoH(ref, b->o[last], n_out * 2u);
                    have_ref = 1;
                    check = 0.0;
                } else {
                    api->cuMemcpyDtoH(out, b->o[last], n_out * 2u);
                    check = out_diff(out, ref, n_out, o->dtype);
                }
            }
            int64_t tiles, partial;
            int max_t;
            double keys_n = -1.0;
            const stof_format *f = e->f;
            if (kind) {
                tiles = e->rf.n_tiles;
                partial = e->rf.n_partial;
                max_t = e->rf.max_tiles;
                keys_n = (double)e->rf.n_keys / f->n_row_blocks / s->seq;
            } else {
                tiles = f->row_ptr[f->n_row_blocks];
                partial = f->n_partial;
                max_t = 0;
                for (int i = 0; i < f->n_row_blocks; i++) {
                    const int64_t t = f->row_ptr[i + 1] - f->row_ptr[i];
                    max_t = t > max_t ? (int)t : max_t;
                }
            }
            const double area = (double)c.block_m * c.block_n;
            const double work = tiles * area / ((double)s->seq * s->seq);
            const double util = tiles ? allowed / (tiles * area) : 0.0;
            const double mean_t = (double)tiles / f->n_row_blocks;
            const double tfs = 4.0 * s->batch * s->heads * s->head_dim *
                               allowed / (ms * 1e-3) / 1e12;
            const double ns_tile =
                tiles ? ms * 1e6 / ((double)s->batch * s->heads * tiles)
                      : 0.0;
            char kn[16];
            if (keys_n >= 0.0)
                snprintf(kn, sizeof(kn), "%.3f", keys_n);
            else
                snprintf(kn, sizeof(kn), "-");
            printf("%-11s %-15s %-6s %-12s %8.4f %7.1f %7lld %5.1f %6.3f "
                   "%5.3f %5d %5.2f %6s %7.1f %8.1e\n",
                   bm->name, shape, kind ? "gather" : "block", cs, ms, tfs,
                   (long long)tiles,
                   tiles ? 100.0 * (double)partial / (double)tiles : 0.0,
                   work, util, max_t, mean_t > 0 ? max_t / mean_t : 0.0, kn,
                   ns_tile, check);
            fflush(stdout);
            res[n_res].gather = kind;
            res[n_res].cfg = c;
            res[n_res].ms = ms;
            res[n_res].tfs = tfs;
            n_res++;
        }
    }
    /* The best of each kind and overall. */
    int best[2] = {-1, -1};
    for (int i = 0; i < n_res; i++) {
        int *bi = &best[res[i].gather];
        if (*bi < 0 || res[i].ms < res[*bi].ms)
            *bi = i;
    }
    int all = best[0];
    if (all < 0 || (best[1] >= 0 && res[best[1]].ms < res[all].ms))
        all = best[1];
    if (all >= 0) {
        const result *r = &res[all];
        printf("best %-10s %-15s density %.4f: %s %dx%dx%dx%d %.4f ms %.1f "
               "TF/s",
               bm->name, shape, density, r->gather ? "gather" : "block",
               r->cfg.block_m, r->cfg.block_n, r->cfg.warps, r->cfg.stages,
               r->ms, r->tfs);
        if (best[0] >= 0 && best[1] >= 0)
            printf("  (gather/block best time %.2f)",
                   res[best[1]].ms / res[best[0]].ms);
        printf("\n");
    }
    for (int i = 0; i < n_cache; i++) {
        stof__block_format_free(ctx, &cache[i].bf);
        stof__rowwise_format_free(ctx, &cache[i].rf);
        stof_format_free(&cache[i].f);
    }
    free(ref);
    free(out);
    stof_mask_free(&m);
    return 0;
}

int main(int argc, char **argv)
{
    options o;
    if (parse_args(argc, argv, &o) != 0)
        return 2;
    stof_context *ctx = NULL;
    stof_settings st;
    stof_default_settings(&st);
    st.require_device = 1;
    if (stof_open(&ctx, &st) != STOF_OK) {
        fprintf(stderr, "stof-bench-kernels: %s\n", stof_errmsg(ctx));
        stof_close(&ctx);
        return 77;
    }
    const stof_device *dev = &ctx->device;
    const stof_api *api = ctx->api;
    g_arch = dev->arch;
    time_t now = time(NULL);
    char date[32];
    strftime(date, sizeof(date), "%Y-%m-%d %H:%M", gmtime(&now));
    printf("stof-bench-kernels: %s (%s, %d SMs, L2 %d MiB), %s, %s UTC, "
           "median of %d runs\n",
           dev->name, dev->arch, dev->sm_count, dev->l2_bytes >> 20,
           o.dtype == STOF_DTYPE_FP16 ? "fp16" : "bf16", date, o.reps);

    /* Every kernel the run needs, compiled on threads up front. */
    for (int si = 0; si < o.n_shapes; si++) {
        stof_block_cfg cl[MAX_CFGS];
        const int nc = cfgs_for(&o, o.shapes[si].head_dim, cl);
        for (int ci = 0; ci < nc; ci++)
            for (int kind = 0; kind < 2; kind++) {
                stof_block_cfg c = cl[ci];
                c.gather = kind;
                char why[256];
                if (!(o.kinds & (1 << kind)) ||
                    !stof__block_cfg_valid(dev, o.shapes[si].head_dim, &c,
                                           why, sizeof(why))) {
                    if (o.kinds & (1 << kind))
                        fprintf(stderr, "skipping %dx%dx%dx%d: %s\n",
                                c.block_m, c.block_n, c.warps, c.stages, why);
                    continue;
                }
                kernel_add(o.shapes[si].head_dim, o.dtype, &c);
            }
    }
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    compile_all(16);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    int failed = 0;
    for (int i = 0; i < g_n_kernels; i++)
        failed += g_kernels[i].compile_st != STOF_OK;
    printf("compiled %d kernels in %.1f s%s\n", g_n_kernels,
           (double)(t1.tv_sec - t0.tv_sec) +
               1e-9 * (double)(t1.tv_nsec - t0.tv_nsec),
           failed ? " (some FAILED)" : "");
    printf("cfg = block_m x block_n x warps x stages; work = computed share "
           "of the dense problem; util = allowed / computed elements; imb = "
           "maxT / mean tiles per row block; check = rel. diff to the "
           "first config's output\n");

    if (stof__ctx_push(ctx) != STOF_OK) {
        fprintf(stderr, "stof-bench-kernels: %s\n", stof_errmsg(ctx));
        stof_close(&ctx);
        return 1;
    }
    int rc = 0;
    for (int si = 0; si < o.n_shapes && !rc; si++) {
        buffers b;
        if (buffers_make(api, dev, &o.shapes[si], o.dtype, &b) != 0) {
            fprintf(stderr, "out of device memory for shape %d\n", si);
            rc = 1;
            break;
        }
        print_header();
        for (int mi = 0; mi < o.n_masks; mi++)
            if (bench_mask_shape(ctx, &o, &o.masks[mi], &o.shapes[si], &b))
                rc = 1;
        buffers_free(api, &b);
    }
    for (int i = 0; i < g_n_kernels; i++) {
        if (g_kernels[i].mod)
            api->cuModuleUnload(g_kernels[i].mod);
        free(g_kernels[i].cubin);
    }
    stof__ctx_pop(ctx);
    stof_close(&ctx);
    return rc;
}
