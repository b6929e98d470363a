/*
 * gemm_launch.c - the GEMM templates compiled (NVRTC), loaded (through
 * the context's module cache or not) and launched: the mma.sync template
 * with its arguments by value, the Hopper template with its tensor maps,
 * alone, in pairs of CTAs (clusters) or, with a row norm, cooperatively;
 * and the separate gate / activation kernel. Declarations: gemm.h.
 */
#include "gemm.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

/* The kernel receives stof_gemm_args by value (struct stof_gemm_params in
 * gemm.cu has the same layout; both sides check the size). */
_Static_assert(sizeof(stof_gemm_args) == 136,
               "stof_gemm_args must match gemm.cu's stof_gemm_params");
_Static_assert(offsetof(stof_gemm_args, M) == 64 &&
                   offsetof(stof_gemm_args, lda) == 80 &&
                   offsetof(stof_gemm_args, eps) == 104,
               "stof_gemm_args must match gemm.cu's stof_gemm_params");

/* The Hopper template's launch parameters (struct stof_gemm_wgmma_params in
 * gemm_wgmma.cu: same field order and types; both sides check the size). */
typedef struct stof_gemm_wgmma_params {
    CUtensorMap tm_a, tm_w, tm_c, tm_r, tm_p;
    CUdeviceptr c, bias, residual, gamma, beta;
    int64_t ldc;
    int M, N, K;
    int tiles_m, tiles_n;
    float eps;
    CUdeviceptr ws;
    int n_items, split_from;
    CUdeviceptr rope_tab;
    int rope_seq, rope_cols;
    uint8_t tail_[24];
    CUtensorMap tm_ah;
} stof_gemm_wgmma_params;
_Static_assert(sizeof(stof_gemm_wgmma_params) == 896,
               "stof_gemm_wgmma_params must match gemm_wgmma.cu");
_Static_assert(offsetof(stof_gemm_wgmma_params, c) == 640 &&
                   offsetof(stof_gemm_wgmma_params, M) == 688 &&
                   offsetof(stof_gemm_wgmma_params, eps) == 708 &&
                   offsetof(stof_gemm_wgmma_params, ws) == 712 &&
                   offsetof(stof_gemm_wgmma_params, n_items) == 720 &&
                   offsetof(stof_gemm_wgmma_params, rope_tab) == 728 &&
                   offsetof(stof_gemm_wgmma_params, tm_ah) == 768,
               "stof_gemm_wgmma_params must match gemm_wgmma.cu");

/* stof__gemm_compile of the Hopper template (c already checked). */
static stof_status wgmma_compile(stof_context *ctx, stof_dtype dt,
                                 const stof_gemm_cfg *c,
                                 const stof_gemm_epi *e, int N, void **cubin,
                                 size_t *size)
{
    char d[15][32];
    snprintf(d[0], 32, "DTYPE=%d", (int)dt);
    snprintf(d[1], 32, "BLOCK_N=%d", c->block_n);
    snprintf(d[2], 32, "STAGES=%d", c->stages);
    snprintf(d[3], 32, "BIAS=%d", e->bias);
    snprintf(d[4], 32, "ACT=%d", e->act);
    snprintf(d[5], 32, "RESIDUAL=%d", e->residual);
    snprintf(d[6], 32, "GATED=%d", e->gated);
    snprintf(d[7], 32, "PINGPONG=%d", c->warps_m == 1);
    snprintf(d[8], 32, "CLUSTER=%d", c->cluster > 1 ? c->cluster : 1);
    snprintf(d[9], 32, "NORM=%d", e->norm);
    snprintf(d[10], 32, "WRITE_PRE=%d", e->write_pre);
    snprintf(d[11], 32, "N_TOTAL=%d", e->norm ? N : 0);
    /* (only when set: the other kernels' inputs stay as they were) */
    int k = 12;
    if (c->cslot)
        snprintf(d[k++], 32, "CSLOT=%d", c->cslot);
    if (e->rope) {
        snprintf(d[k++], 32, "ROPE=%d", e->rope);
        snprintf(d[k++], 32, "ROPE_HD=%d", e->rope_hd);
    }
    const char *defs[15];
    for (int i = 0; i < k; i++)
        defs[i] = d[i];
    return (stof_status)stof__jit_compile(ctx, "gemm_wgmma.cu", defs, k,
                                          "sm_90a", cubin, size);
}

stof_status stof__gemm_compile(stof_context *ctx, stof_dtype dt,
                               const stof_gemm_cfg *c, const stof_gemm_epi *e,
                               int N, const char *arch, void **cubin,
                               size_t *size)
{
    if (!cubin || !size)
        return stof__fail(ctx, STOF_ERR_INVALID_ARGUMENT,
                          "gemm compile: NULL output pointer");
    *cubin = NULL;
    *size = 0;
    if (dt != STOF_DTYPE_FP16 && dt != STOF_DTYPE_BF16)
        return stof__fail(ctx, STOF_ERR_INVALID_ARGUMENT,
                          "gemm compile: dtype %d is not a stof_dtype",
                          (int)dt);
    /* The N check only matters to the norm variant; others compile for any
     * N (a multiple of 8). */
    const int n_chk = e && e->norm ? N : 8;
    char why[256];
    const stof_device *dev = ctx && ctx->device.ok ? &ctx->device : NULL;
    if (!stof__gemm_cfg_valid(dev, c, e, n_chk, 8, why, sizeof(why)))
        return stof__fail(ctx, STOF_ERR_UNSUPPORTED,
                          "gemm kernel configuration not supported: %s", why);
    if (c->wgmma)
        return wgmma_compile(ctx, dt, c, e, N, cubin, size);
    char d[13][32];
    int k = 0;
    snprintf(d[k++], 32, "DTYPE=%d", (int)dt);
    snprintf(d[k++], 32, "BLOCK_M=%d", c->block_m);
    snprintf(d[k++], 32, "BLOCK_N=%d", c->block_n);
    snprintf(d[k++], 32, "BLOCK_K=%d", c->block_k);
    snprintf(d[k++], 32, "WARPS_M=%d", c->warps_m);
    snprintf(d[k++], 32, "WARPS_N=%d", c->warps_n);
    snprintf(d[k++], 32, "STAGES=%d", c->stages);
    snprintf(d[k++], 32, "BIAS=%d", e->bias);
    snprintf(d[k++], 32, "ACT=%d", e->act);
    snprintf(d[k++], 32, "RESIDUAL=%d", e->residual);
    snprintf(d[k++], 32, "NORM=%d", e->norm);
    snprintf(d[k++], 32, "WRITE_PRE=%d", e->write_pre);
    if (e->norm)
        snprintf(d[k++], 32, "N_TOTAL=%d", N);
    const char *defs[13];
    for (int i = 0; i < k; i++)
        defs[i] = d[i];
    return (stof_status)stof__jit_compile(ctx, "gemm.cu", defs, k, arch,
                                          cubin, size);
}

stof_status stof__gemm_load_cubin(stof_context *ctx, const stof_gemm_cfg *c,
                                  const stof_gemm_epi *e, int N,
                                  const void *cubin, CUmodule *mod,
                                  CUfunction *fn)
{
    /* (size 0: loaded apart, not through the cache) */
    return stof__gemm_load_cubin_shared(ctx, c, e, N, cubin, 0, 0, mod, fn);
}

stof_status stof__gemm_load_cubin_shared(stof_context *ctx,
                                         const stof_gemm_cfg *c,
                                         const stof_gemm_epi *e, int N,
                                         const void *cubin, size_t size,
                                         uint64_t hash, CUmodule *mod,
                                         CUfunction *fn)
{
    if (!c || !e || (!cubin && !hash) || !mod || !fn)
        return stof__fail(ctx, STOF_ERR_INVALID_ARGUMENT,
                          "gemm load: NULL argument");
    return (stof_status)stof__module_load_shared_hashed(
        ctx, cubin, size, hash, c->wgmma ? "stof_gemm_wgmma" : "stof_gemm",
        stof__gemm_smem_bytes(c, e, N), mod, fn);
}

/* A 2-D map over (cols, rows) of 16-bit elements with leading dimension
 * ld, boxes of 64 x box_rows, 128-byte swizzle, zeros out of bounds (and
 * stores clipped there). The elements travel as raw 16 bits (the zero
 * fill is +0 in fp16 and bf16), so one map type serves both dtypes. */
static CUresult make_map2(stof_encode_tiled_fn enc, CUtensorMap *m,
                          CUdeviceptr base, int cols, int rows, int64_t ld,
                          unsigned box_rows)
{
    const cuuint64_t dims[2] = {(cuuint64_t)cols, (cuuint64_t)rows};
    const cuuint64_t strides[1] = {(cuuint64_t)ld * 2u};
    const cuuint32_t box[2] = {(cuuint32_t)WG_BK, box_rows};
    const cuuint32_t estr[2] = {1u, 1u};
    return enc(m, CU_TENSOR_MAP_DATA_TYPE_UINT16, 2u,
               (void *)(uintptr_t)base, dims, strides, box, estr,
               CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
               CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
               CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
}

/* How many clusters of `cs` CTAs of fn can run at once (one CTA per SM:
 * clusters cannot span GPCs, so fewer than SMs / cs when a GPC's free SMs
 * are not a multiple of cs), cached per function (a function has one
 * cluster size); `fallback` when the driver cannot say. */
static int cluster_slots(CUfunction fn, const stof_api *api, unsigned cs,
                         unsigned smem, int fallback)
{
    static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
    static struct {
        CUfunction fn;
        int n;
    } cache[32];
    static unsigned next;
    pthread_mutex_lock(&lock);
    for (int i = 0; i < 32; i++)
        if (cache[i].fn == fn) {
            const int n = cache[i].n;
            pthread_mutex_unlock(&lock);
            return n;
        }
    pthread_mutex_unlock(&lock);
    stof_max_clusters_fn occ = stof__max_clusters(api);
    int n = 0;
    if (occ) {
        CUlaunchAttribute at[3];
        CUlaunchConfig cfg;
        stof__launch_config(&cfg, at,
                            cs * (unsigned)(fallback > 0 ? fallback : 1), 1,
                            1, 384, smem, NULL, cs, 0, 0);
        if (occ(&n, fn, &cfg) != CUDA_SUCCESS)
            n = 0;
    }
    if (n <= 0)
        return fallback;
    pthread_mutex_lock(&lock);
    const unsigned i = next++ % 32u;
    cache[i].fn = fn;
    cache[i].n = n;
    pthread_mutex_unlock(&lock);
    return n;
}

/* Launch fn in clusters of `cs` CTAs: as many as run at once (at most
 * ctas / cs, at least one; ctas 0: no limit; at most `items`). */
static stof_status cluster_launch(CUfunction fn, const stof_api *api,
                                  unsigned cs, int ctas, int64_t items,
                                  unsigned smem, CUstream stream,
                                  void **params)
{
    stof_launch_ex_fn launch = stof__launch_ex(api);
    if (!launch)
        return STOF_ERR_UNSUPPORTED;
    int64_t clusters = ctas <= 0          ? items
                       : ctas >= (int)cs ? ctas / (int)cs
                                         : 1;
    if (clusters > items)
        clusters = items;
    const int fit = cluster_slots(fn, api, cs, smem, (int)clusters);
    if (fit < clusters)
        clusters = fit;
    const stof_launch_opts o = {.cluster = cs, .pdl = 1};
    return stof__launch(api, fn, cs * (unsigned)clusters, 1, 1, 384, smem,
                        stream, params, &o) == CUDA_SUCCESS
               ? STOF_OK
               : STOF_ERR_CUDA;
}

/* The largest cooperative grid of fn found to launch (0: none failed
 * yet), cached per function: a process limited to part of the GPU (MPS,
 * green contexts) may not hold one CTA on every SM. */
static pthread_mutex_t coop_lock = PTHREAD_MUTEX_INITIALIZER;
static struct {
    CUfunction fn;
    int64_t grid;
} coop_cache[32];
static unsigned coop_next;

static int64_t coop_limit(CUfunction fn)
{
    int64_t g = 0;
    pthread_mutex_lock(&coop_lock);
    for (unsigned i = 0; i < 32u; i++)
        if (coop_cache[i].fn == fn)
            g = coop_cache[i].grid;
    pthread_mutex_unlock(&coop_lock);
    return g;
}

static void coop_limit_set(CUfunction fn, int64_t grid)
{
    pthread_mutex_lock(&coop_lock);
    unsigned i = 0;
    while (i < 32u && coop_cache[i].fn != fn)
        i++;
    if (i == 32u)
        i = coop_next++ % 32u;
    coop_cache[i].fn = fn;
    coop_cache[i].grid = grid;
    pthread_mutex_unlock(&coop_lock);
}

/* Launch a row-norm kernel: a multiple of the row's `row_tiles` tiles (so
 * a row's tiles run in the same round), at most ctas (0: one CTA per
 * tile) and items, cooperatively: its CTAs wait for each other's row
 * statistics, so all must be resident. When the driver finds the grid too
 * large to be resident at once, a smaller multiple of row_tiles is
 * launched instead (any multiple walks every tile) and remembered for fn;
 * an error only when not even one row's tiles fit. */
static stof_status norm_launch(CUfunction fn, const stof_api *api,
                               int row_tiles, int ctas, int64_t items,
                               unsigned smem, CUstream stream, void **params)
{
    stof_launch_ex_fn launch = stof__launch_ex(api);
    if (!launch)
        return STOF_ERR_UNSUPPORTED;
    int64_t grid = ctas > 0 && ctas < items ? ctas : items;
    const int64_t limit = coop_limit(fn);
    if (limit > 0 && grid > limit)
        grid = limit;
    grid = grid / row_tiles * row_tiles;
    if (grid < row_tiles)
        grid = row_tiles;
    const stof_launch_opts o = {.cooperative = 1, .pdl = 1};
    for (;;) {
        const CUresult r = stof__launch(api, fn, (unsigned)grid, 1, 1, 384,
                                        smem, stream, params, &o);
        if (r == CUDA_SUCCESS)
            return STOF_OK;
        if (r != CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE || grid <= row_tiles)
            return STOF_ERR_CUDA;
        /* The next smaller multiple of row_tiles, at most 7/8 of grid. */
        int64_t next = grid * 7 / 8 / row_tiles * row_tiles;
        if (next >= grid)
            next = grid - row_tiles;
        grid = next < row_tiles ? row_tiles : next;
        coop_limit_set(fn, grid);
    }
}

/* Split tails on (the default) unless the environment sets
 * STOF_GEMM_SPLIT=0 (read once) or stof__gemm_split_set(0) was called:
 * for comparisons. -1: not read yet. */
static _Atomic int split_state = -1;

int stof__gemm_split_enabled(void)
{
    return stof__env_switch(&split_state, "STOF_GEMM_SPLIT", 1);
}

void stof__gemm_split_set(int on)
{
    atomic_store(&split_state, on ? 1 : 0);
}

/* stof__gemm_launch of the Hopper template (arguments already checked). */
static stof_status wgmma_launch(CUfunction fn, const stof_gemm_cfg *c,
                                const stof_gemm_epi *e,
                                const stof_gemm_args *a, int ctas,
                                CUstream stream,
                                const stof_api *api)
{
    stof_encode_tiled_fn enc = stof__encode_tiled(api);
    if (!enc)
        return STOF_ERR_UNSUPPORTED;
    if (a->lda >= ((int64_t)1 << 38) || a->ldw >= ((int64_t)1 << 38) ||
        a->ldc >= ((int64_t)1 << 38))
        return STOF_ERR_INVALID_ARGUMENT; /* TMA strides: < 2^40 bytes */
    stof_gemm_wgmma_params p;
    memset(&p, 0, sizeof(p));
    /* gated: W's 2N rows, loaded in two boxes of half a tile; a pair of
     * CTAs loads half a W tile each (gated: one of the two boxes). */
    const int out_n = e->gated ? c->block_n / 2 : c->block_n;
    const int pair = c->cluster > 1;
    const unsigned w_box = (unsigned)(pair ? c->block_n / 2 : out_n);
    if (make_map2(enc, &p.tm_a, a->a, a->K, a->M, a->lda, WG_BM) !=
            CUDA_SUCCESS ||
        make_map2(enc, &p.tm_w, a->w, a->K, e->gated ? 2 * a->N : a->N,
                  a->ldw, w_box) != CUDA_SUCCESS ||
        make_map2(enc, &p.tm_c, a->c, a->N, a->M, a->ldc, 64u) !=
            CUDA_SUCCESS ||
        (e->residual && make_map2(enc, &p.tm_r, a->residual, a->N, a->M,
                                  a->ldc, 64u) != CUDA_SUCCESS) ||
        (e->write_pre && make_map2(enc, &p.tm_p, a->pre, a->N, a->M, a->ldc,
                                   64u) != CUDA_SUCCESS))
        return STOF_ERR_CUDA;
    p.c = a->c;
    p.bias = e->bias ? a->bias : 0;
    p.residual = e->residual ? a->residual : 0;
    p.gamma = e->norm ? a->gamma : 0;
    p.beta = e->norm == 1 ? a->beta : 0;
    p.eps = a->eps;
    p.ws = e->norm ? a->ws : 0;
    p.ldc = a->ldc;
    p.M = a->M;
    p.N = a->N;
    p.K = a->K;
    p.tiles_m = (a->M + WG_BM - 1) / WG_BM;
    p.tiles_n = (a->N + out_n - 1) / out_n;
    p.rope_tab = e->rope ? a->rope_tab : 0;
    p.rope_seq = e->rope ? a->rope_seq : 1;
    p.rope_cols = e->rope ? a->rope_cols : 0;
    /* The raster's items: tiles, or pairs of tile rows. */
    const int64_t items = (int64_t)(pair ? (p.tiles_m + 1) / 2 : p.tiles_m) *
                          p.tiles_n;
    if (items > INT32_MAX / 2 ||
        (e->norm && (p.tiles_n > WG_NORM_TILES || pair || !a->ws ||
                     a->ws % 16u)))
        return STOF_ERR_INVALID_ARGUMENT;
    const unsigned smem = (unsigned)stof__gemm_smem_bytes(c, e, a->N);
    void *params[] = {&p};
    p.n_items = p.split_from = (int)items;
    if (e->norm)
        return norm_launch(fn, api, p.tiles_n, ctas, items, smem, stream,
                           params);
    if (!pair) {
        const unsigned grid =
            (unsigned)(ctas > 0 && ctas < items ? ctas : items);
        /* Ping-pong tiles: a split tail (gemm.h), its halves' A through a
         * 64-row box. */
        if (c->warps_m == 1 && stof__gemm_split_enabled()) {
            p.split_from = (int)stof__gemm_split_from(items, grid);
            p.n_items = (int)(2 * items - p.split_from);
            if (p.split_from < items &&
                make_map2(enc, &p.tm_ah, a->a, a->K, a->M, a->lda, 64u) !=
                    CUDA_SUCCESS)
                return STOF_ERR_CUDA;
        }
        const stof_launch_opts o = {.pdl = 1};
        CUresult r = stof__launch(api, fn, grid, 1, 1, 384, smem, stream,
                                  params, &o);
        return r == CUDA_SUCCESS ? STOF_OK : STOF_ERR_CUDA;
    }
    return cluster_launch(fn, api, 2u, ctas, items, smem, stream, params);
}

stof_status stof__gemm_launch(CUfunction fn, const stof_gemm_cfg *c,
                              const stof_gemm_epi *e, const stof_gemm_args *a,
                              int ctas, CUstream stream, const stof_api *api)
{
    if (!fn || !c || !e || !a || !api || !api->cuLaunchKernel)
        return STOF_ERR_INVALID_ARGUMENT;
    if (a->M < 0 || a->N <= 0 || a->K <= 0 || a->N % 8 || a->K % 8 ||
        c->block_m <= 0 || c->block_n <= 0)
        return STOF_ERR_INVALID_ARGUMENT;
    if (a->M == 0)
        return STOF_OK;
    if (a->lda < a->K || a->ldw < a->K || a->ldc < a->N || a->lda % 8 ||
        a->ldw % 8 || a->ldc % 8)
        return STOF_ERR_INVALID_ARGUMENT;
    if (!a->a || !a->w || !a->c || (a->a | a->w | a->c) % 16u)
        return STOF_ERR_INVALID_ARGUMENT;
    if (e->bias && (!a->bias || a->bias % 16u))
        return STOF_ERR_INVALID_ARGUMENT;
    if (e->residual && (!a->residual || a->residual % 16u))
        return STOF_ERR_INVALID_ARGUMENT;
    if (e->norm && (!a->gamma || a->gamma % 16u ||
                    (e->norm == 1 && (!a->beta || a->beta % 16u))))
        return STOF_ERR_INVALID_ARGUMENT;
    if (e->write_pre && (!a->pre || a->pre % 16u))
        return STOF_ERR_INVALID_ARGUMENT;
    if (e->rope && (!a->rope_tab || a->rope_tab % 16u || a->rope_seq <= 0 ||
                    a->rope_cols < 0 || a->rope_cols > a->N ||
                    e->rope_hd <= 0 || a->rope_cols % e->rope_hd))
        return STOF_ERR_INVALID_ARGUMENT;
    if (c->wgmma)
        return wgmma_launch(fn, c, e, a, ctas, stream, api);
    if (e->gated || e->rope) /* the mma.sync template has neither */
        return STOF_ERR_INVALID_ARGUMENT;
    const unsigned gx =
        e->norm ? 1u : (unsigned)((a->N + c->block_n - 1) / c->block_n);
    const int64_t gy = ((int64_t)a->M + c->block_m - 1) / c->block_m;
    if (gy > 65535)
        return STOF_ERR_INVALID_ARGUMENT;
    const size_t smem = stof__gemm_smem_bytes(c, e, a->N);
    void *params[] = {(void *)a};
    const stof_launch_opts o = {.pdl = STOF_PDL_IF_SM90};
    CUresult r = stof__launch(api, fn, gx, (unsigned)gy, 1,
                              (unsigned)(c->warps_m * c->warps_n * 32),
                              (unsigned)smem, stream, params, &o);
    return r == CUDA_SUCCESS ? STOF_OK : STOF_ERR_CUDA;
}

/* The auxiliary kernels' cubins (gate, rope: layer_ops.cu with a few
 * defines) kept for the process, so that the next plan of a layer that
 * runs one compiles nothing (NVRTC: tens of ms, against a warm plan's
 * 1 ms). Keyed by arch and defines; at most AUX_MEMO of them. */
#define AUX_MEMO 32
static pthread_mutex_t aux_lock = PTHREAD_MUTEX_INITIALIZER;
static struct {
    char key[96];
    void *cubin;
    size_t size;
} aux_memo[AUX_MEMO];
static int aux_n;

static stof_status aux_compile(stof_context *ctx, const char *const *defs,
                               int n, const char *arch, void **cubin,
                               size_t *size)
{
    if (!arch && ctx && ctx->device.ok)
        arch = ctx->device.arch;
    char key[96];
    int k = snprintf(key, sizeof(key), "%s", arch ? arch : "-");
    for (int i = 0; i < n && k > 0 && (size_t)k < sizeof(key); i++)
        k += snprintf(key + k, sizeof(key) - (size_t)k, "|%s", defs[i]);
    const int keyed = arch && k > 0 && (size_t)k < sizeof(key);
    pthread_mutex_lock(&aux_lock);
    for (int i = 0; keyed && i < aux_n; i++)
        if (!strcmp(aux_memo[i].key, key)) {
            *cubin = malloc(aux_memo[i].size);
            if (*cubin) {
                memcpy(*cubin, aux_memo[i].cubin, aux_memo[i].size);
                *size = aux_memo[i].size;
            }
            pthread_mutex_unlock(&aux_lock);
            return *cubin ? STOF_OK
                          : stof__fail(ctx, STOF_ERR_OUT_OF_MEMORY,
                                       "out of memory");
        }
    pthread_mutex_unlock(&aux_lock);
    stof_status st = (stof_status)stof__jit_compile(ctx, "layer_ops.cu", defs,
                                                    n, arch, cubin, size);
    if (st != STOF_OK || !keyed)
        return st;
    pthread_mutex_lock(&aux_lock);
    int have = 0;
    for (int i = 0; i < aux_n && !have; i++)
        have = !strcmp(aux_memo[i].key, key);
    void *copy = !have && aux_n < AUX_MEMO ? malloc(*size) : NULL;
    if (copy) {
        memcpy(copy, *cubin, *size);
        snprintf(aux_memo[aux_n].key, sizeof(aux_memo[aux_n].key), "%s", key);
        aux_memo[aux_n].cubin = copy;
        aux_memo[aux_n].size = *size;
        aux_n++;
    }
    pthread_mutex_unlock(&aux_lock);
    return st;
}

void stof__aux_memo_clear(void)
{
    pthread_mutex_lock(&aux_lock);
    for (int i = 0; i < aux_n; i++)
        free(aux_memo[i].cubin);
    memset(aux_memo, 0, sizeof(aux_memo));
    aux_n = 0;
    pthread_mutex_unlock(&aux_lock);
}

stof_status stof__gate_compile(stof_context *ctx, stof_dtype dt, int act,
                               int gated, const char *arch, void **cubin,
                               size_t *size)
{
    if (!cubin || !size)
        return stof__fail(ctx, STOF_ERR_INVALID_ARGUMENT,
                          "gate compile: NULL output pointer");
    *cubin = NULL;
    *size = 0;
    if ((dt != STOF_DTYPE_FP16 && dt != STOF_DTYPE_BF16) ||
        act < STOF_ACT_NONE || act > STOF_ACT_SILU ||
        (gated != 0 && gated != 1))
        return stof__fail(ctx, STOF_ERR_INVALID_ARGUMENT,
                          "gate compile: dtype %d, act %d, gated %d",
                          (int)dt, act, gated);
    char d[3][32];
    snprintf(d[0], 32, "DTYPE=%d", (int)dt);
    snprintf(d[1], 32, "ACT=%d", act);
    snprintf(d[2], 32, "GATED=%d", gated);
    const char *defs[3] = {d[0], d[1], d[2]};
    return aux_compile(ctx, defs, 3, arch, cubin, size);
}

stof_status stof__gate_launch(CUfunction fn, CUdeviceptr x, CUdeviceptr out,
                              int rows, int n, int64_t ld_x, int64_t ld_out,
                              int gated, CUstream stream, const stof_api *api)
{
    if (!fn || !api || !api->cuLaunchKernel || rows < 0 || n <= 0 ||
        n % 8 || ld_x % 8 || ld_out % 8 || ld_out < n ||
        ld_x < (gated ? 2 * (int64_t)n : n) || !x || !out ||
        (x | out) % 16u)
        return STOF_ERR_INVALID_ARGUMENT;
    if (rows == 0)
        return STOF_OK;
    if (gated) { /* threads write rows that others still read: no overlap */
        const CUdeviceptr x_end =
            x + (CUdeviceptr)(((int64_t)(rows - 1) * ld_x + 2 * n) * 2);
        const CUdeviceptr o_end =
            out + (CUdeviceptr)(((int64_t)(rows - 1) * ld_out + n) * 2);
        if (out < x_end && x < o_end)
            return STOF_ERR_INVALID_ARGUMENT;
    }
    const int64_t chunks = (int64_t)rows * (n / 8);
    const int64_t blocks = (chunks + 255) / 256;
    const unsigned grid = (unsigned)(blocks < 4096 ? blocks : 4096);
    void *params[] = {&x, &out, &rows, &n, &ld_x, &ld_out};
    const stof_launch_opts o = {.pdl = STOF_PDL_IF_SM90};
    CUresult r = stof__launch(api, fn, grid, 1, 1, 256, 0, stream, params,
                              &o);
    return r == CUDA_SUCCESS ? STOF_OK : STOF_ERR_CUDA;
}


stof_status stof__rope_compile(stof_context *ctx, stof_dtype dt, int hd,
                               int rope, const char *arch, void **cubin,
                               size_t *size)
{
    if (!cubin || !size)
        return stof__fail(ctx, STOF_ERR_INVALID_ARGUMENT,
                          "rope compile: NULL output pointer");
    *cubin = NULL;
    *size = 0;
    if ((dt != STOF_DTYPE_FP16 && dt != STOF_DTYPE_BF16) || hd <= 0 ||
        hd % 8 || rope <= 0 || rope % 4 || rope > hd)
        return stof__fail(ctx, STOF_ERR_INVALID_ARGUMENT,
                          "rope compile: dtype %d, head_dim %d, rope %d",
                          (int)dt, hd, rope);
    /* (hd and rope are launch arguments: one module a dtype) */
    char d[1][32];
    snprintf(d[0], 32, "DTYPE=%d", (int)dt);
    const char *defs[1] = {d[0]};
    return aux_compile(ctx, defs, 1, arch, cubin, size);
}

stof_status stof__rope_launch(CUfunction fn, CUdeviceptr x, int rows,
                              int64_t ld, int cols, int hd, int rope,
                              CUdeviceptr tab, int seq, CUstream stream,
                              const stof_api *api)
{
    if (!fn || !api || !api->cuLaunchKernel || rows < 0 || hd <= 0 ||
        hd % 8 || rope <= 0 || rope % 4 || rope > hd || cols < 0 ||
        cols % hd || ld % 8 || ld < cols || !x || x % 16u || !tab ||
        tab % 16u || seq <= 0)
        return STOF_ERR_INVALID_ARGUMENT;
    /* (a thread step: 8 pairs, or 2 where rope is not a multiple of 16) */
    const int64_t total =
        (int64_t)rows * (cols / hd) * (rope % 16 ? rope / 4 : rope / 16);
    if (total == 0)
        return STOF_OK;
    const int64_t blocks = (total + 255) / 256;
    const unsigned grid = (unsigned)(blocks < 4096 ? blocks : 4096);
    void *params[] = {&x, &rows, &ld, &cols, &hd, &rope, &tab, &seq};
    const stof_launch_opts o = {.pdl = STOF_PDL_IF_SM90};
    CUresult r = stof__launch(api, fn, grid, 1, 1, 256, 0, stream, params,
                              &o);
    return r == CUDA_SUCCESS ? STOF_OK : STOF_ERR_CUDA;
}

stof_status stof__qknorm_launch(CUfunction fn, CUdeviceptr x, int rows,
                                int64_t ld, int q_cols, int cols, int hd,
                                int rope, CUdeviceptr tab, int seq,
                                CUdeviceptr gamma, float eps,
                                CUstream stream, const stof_api *api)
{
    if (!fn || !api || !api->cuLaunchKernel || rows < 0 || hd < 8 ||
        hd > 256 || hd % 8 || rope < 0 || rope % 2 || rope > hd ||
        cols < 0 || cols % hd || q_cols < 0 || q_cols % hd ||
        q_cols > cols || ld % 2 || ld < cols || !x || x % 4u || !gamma ||
        gamma % 4u || (rope && (!tab || tab % 8u || seq <= 0)) ||
        !(eps >= 0.0f))
        return STOF_ERR_INVALID_ARGUMENT;
    if (seq <= 0)
        seq = 1; /* (no table read) */
    const int64_t total = (int64_t)rows * (cols / hd); /* (warps) */
    if (total == 0)
        return STOF_OK;
    /* (layer_ops.cu's QK_WARPS = 4 warps a block, 128 threads) */
    const int64_t blocks = (total + 3) / 4;
    const unsigned grid = (unsigned)(blocks < 8192 ? blocks : 8192);
    void *params[] = {&x, &rows, &ld, &q_cols, &cols, &hd,
                      &rope, &tab, &seq, &gamma, &eps};
    const stof_launch_opts o = {.pdl = STOF_PDL_IF_SM90};
    CUresult r = stof__launch(api, fn, grid, 1, 1, 128, 0, stream, params,
                              &o);
    return r == CUDA_SUCCESS ? STOF_OK : STOF_ERR_CUDA;
}
