/*
 * gemm.c - host side of the tensor-core GEMM template
 * (jit_templates/gemm.cu): which configurations it supports, its shared
 * memory, the candidates and cost model of the planner, compile + load,
 * the launch, the JSON form of a configuration and the CPU references.
 * Declarations and contracts: gemm.h.
 */
#include "gemm.h"

#include <jansson.h>

#include <ctype.h>
#include <math.h>
#include <pthread.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The kernel receives stof_gemm_args by value (struct stof_gemm_params in
 * gemm.cu has the same layout; both sides check the size). */
_Static_assert(sizeof(stof_gemm_args) == 120,
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
    uint8_t tail_[48];
} stof_gemm_wgmma_params;
_Static_assert(sizeof(stof_gemm_wgmma_params) == 768,
               "stof_gemm_wgmma_params must match gemm_wgmma.cu");
_Static_assert(offsetof(stof_gemm_wgmma_params, c) == 640 &&
                   offsetof(stof_gemm_wgmma_params, M) == 688 &&
                   offsetof(stof_gemm_wgmma_params, eps) == 708 &&
                   offsetof(stof_gemm_wgmma_params, ws) == 712,
               "stof_gemm_wgmma_params must match gemm_wgmma.cu");

/* The largest opt-in shared memory of any GPU the kernel targets (sm_90:
 * 227 KiB); used when no device is given. */
#define GEMM_SMEM_MAX_ANY (227 * 1024)

/* The Hopper template: 128-row tiles, 64 of K per stage; with a row norm
 * a row is at most WG_NORM_TILES tiles. */
#define WG_BM 128
#define WG_BK 64
#define WG_NORM_TILES 16

/* Accumulator floats per thread the kernel allows (a 64x64 warp tile): with
 * the fragments and addresses this stays under 255 registers. */
#define GEMM_ACC_MAX 128

/* Cost model constants (H100 / H200 class, mma.sync):
 *   GEMM_SM_PEAK   dense fp16/bf16 mma.sync throughput of one SM, FLOP/s
 *                  (about 3.0 TFLOP/s: 132 SMs give ~400 TFLOP/s, roughly
 *                  what the best mma.sync kernels reach on H100);
 *   GEMM_BW        DRAM bandwidth in bytes/s (H100 SXM 3.35 TB/s, H200
 *                  4.8 TB/s; the lower bound is used);
 *   GEMM_LAUNCH_MS launch and tail overhead of one kernel. */
#define GEMM_SM_PEAK 3.0e12
/* wgmma: about 990 TFLOP/s dense fp16/bf16 on an H100 SXM, 7.5 per SM. */
#define WGMMA_SM_PEAK 7.5e12
#define GEMM_BW 3.0e12
#define GEMM_LAUNCH_MS 0.003

static int is_pow2(int x)
{
    return x > 0 && (x & (x - 1)) == 0;
}

size_t stof__gemm_smem_bytes(const stof_gemm_cfg *c, const stof_gemm_epi *e,
                             int N)
{
    if (!c || c->block_m <= 0 || c->block_n <= 0 || c->block_k <= 0 ||
        c->stages <= 0)
        return 0;
    if (c->wgmma) { /* stages x {A, W} tiles, the two consumer
                       warpgroups' rings of 64 x 64 C units (two; four with
                       a residual, which is loaded into them, or a norm),
                       the mbarriers (two a stage, four more), with a norm
                       gamma and beta of the tile's columns, 1024 of
                       slack */
        const int norm = e && e->norm;
        return (size_t)c->stages *
                   ((size_t)c->block_m + (size_t)c->block_n) *
                   (size_t)c->block_k * 2u +
               2u * (e && (e->residual || norm) ? 4u : 2u) * 64u * 64u *
                   2u +
               16u * (size_t)c->stages + 32u +
               (norm ? 4u * (size_t)c->block_n : 0u) + 1024u;
    }
    const size_t pitch = (size_t)c->block_k + 8u;
    const size_t pipe = (size_t)c->stages *
                        ((size_t)c->block_m + (size_t)c->block_n) * pitch * 2u;
    if (e && e->norm) {
        if (N <= 0)
            return 0;
        return pipe + (size_t)c->block_m * ((size_t)N + 8u) * 2u;
    }
    const size_t stage = (size_t)c->block_m * ((size_t)c->block_n + 8u) * 2u;
    return pipe > stage ? pipe : stage;
}

size_t stof__gemm_ws_bytes(const stof_gemm_cfg *c, const stof_gemm_epi *e,
                           int M, int N)
{
    if (!c || !e || !c->wgmma || !e->norm || M <= 0 || N <= 0 ||
        c->block_n <= 0)
        return 0;
    /* The row counters (one a tile row, padded to 256 bytes), then each
     * tile's 128 rows' statistics (two floats). */
    const size_t tiles_m = ((size_t)M + WG_BM - 1) / WG_BM;
    const size_t row_tiles = ((size_t)N + (size_t)c->block_n - 1) /
                             (size_t)c->block_n;
    return (tiles_m + 63u) / 64u * 256u + tiles_m * row_tiles * 128u * 8u;
}

/* The epilogue's own rules (both templates). */
static int epi_valid(const stof_gemm_epi *e, char *why, size_t n)
{
    if ((e->bias != 0 && e->bias != 1) ||
        (e->residual != 0 && e->residual != 1) ||
        (e->write_pre != 0 && e->write_pre != 1) ||
        (e->gated != 0 && e->gated != 1))
        return stof__why(why, n,
                         "bias, residual, write_pre and gated must be 0 or 1");
    if (e->act < STOF_ACT_NONE || e->act > STOF_ACT_SILU)
        return stof__why(why, n, "act %d: not a stof_activation", e->act);
    if (e->norm < 0 || e->norm > 2)
        return stof__why(why, n,
                         "norm %d: must be 0 (none), 1 (LayerNorm) or 2 "
                         "(RMSNorm)",
                         e->norm);
    if (e->norm && e->act != STOF_ACT_NONE)
        return stof__why(why, n, "norm needs act = none (act %d)", e->act);
    if (e->write_pre && !e->norm)
        return stof__why(why, n, "write_pre needs norm");
    if (e->gated && e->norm)
        return stof__why(why, n, "gated and norm cannot be combined");
    return 1;
}

static size_t smem_limit(const stof_device *dev)
{
    return dev && dev->ok && dev->max_smem_optin > 0
               ? (size_t)dev->max_smem_optin
               : (size_t)GEMM_SMEM_MAX_ANY;
}

/* stof__gemm_cfg_valid for the Hopper template. */
static int wgmma_cfg_valid(const stof_device *dev, const stof_gemm_cfg *c,
                           const stof_gemm_epi *e, int N, char *why,
                           size_t n)
{
    if (c->block_m != WG_BM || c->block_k != WG_BK ||
        (c->block_n != 64 && c->block_n != 128 && c->block_n != 256))
        return stof__why(why, n,
                         "wgmma template: block %dx%dx%d, must be 128 x "
                         "(64, 128 or 256) x 64",
                         c->block_m, c->block_n, c->block_k);
    if ((c->warps_m != 2 && c->warps_m != 1) || c->warps_n != 1)
        return stof__why(why, n,
                         "wgmma template: warps %dx%d, must be 2x1 (two "
                         "consumer warpgroups on each tile) or 1x1 (ping-"
                         "pong: each takes whole tiles in turn)",
                         c->warps_m, c->warps_n);
    if (c->warps_m == 1 && c->block_n > 128)
        return stof__why(why, n,
                         "wgmma template: ping-pong (warps 1x1) needs "
                         "block_n 64 or 128 (a warpgroup holds the whole "
                         "tile), not %d",
                         c->block_n);
    if (c->stages < 2 || c->stages > 6)
        return stof__why(why, n, "wgmma template: stages %d, must be 2..6",
                         c->stages);
    if (c->cluster < 0 || c->cluster > 2)
        return stof__why(why, n,
                         "wgmma template: cluster %d, must be 0 or 1 (none) "
                         "or 2 (pairs of CTAs sharing W tiles)",
                         c->cluster);
    if (!epi_valid(e, why, n))
        return 0;
    if (e->norm && c->cluster > 1)
        return stof__why(why, n,
                         "wgmma template: a row norm runs no pairs "
                         "(cluster %d)",
                         c->cluster);
    if (e->norm && (N + c->block_n - 1) / c->block_n > WG_NORM_TILES)
        return stof__why(why, n,
                         "wgmma template: a row norm over N %d takes %d "
                         "tiles of %d, more than the %d a row may have",
                         N, (N + c->block_n - 1) / c->block_n, c->block_n,
                         WG_NORM_TILES);
    if (e->gated && c->block_n < 128)
        return stof__why(why, n,
                         "wgmma template: gated needs block_n 128 or 256 "
                         "(the output tile is half of it), not %d",
                         c->block_n);
    if (dev && dev->ok && (dev->cc_major != 9 || dev->cc_minor != 0))
        return stof__why(why, n,
                         "wgmma template: needs compute capability 9.0 "
                         "(sm_90a), the device is %d.%d",
                         dev->cc_major, dev->cc_minor);
    const size_t smem = stof__gemm_smem_bytes(c, e, N);
    if (smem > smem_limit(dev))
        return stof__why(why, n,
                         "wgmma template: block 128x%d, %d stages: %zu bytes "
                         "of shared memory, more than the %zu the %s allows",
                         c->block_n, c->stages, smem, smem_limit(dev),
                         dev && dev->ok ? "device" : "largest supported GPU");
    return 1;
}

int stof__gemm_cfg_valid(const stof_device *dev, const stof_gemm_cfg *c,
                         const stof_gemm_epi *e, int N, int K, char *why,
                         size_t n)
{
    if (why && n)
        why[0] = '\0';
    if (!c || !e)
        return stof__why(why, n, "no configuration or epilogue (NULL)");
    if (N <= 0 || N % 8 != 0)
        return stof__why(why, n, "N %d: must be a positive multiple of 8", N);
    if (K <= 0 || K % 8 != 0)
        return stof__why(why, n, "K %d: must be a positive multiple of 8", K);
    if (c->wgmma != 0 && c->wgmma != 1)
        return stof__why(why, n, "wgmma %d: must be 0 or 1", c->wgmma);
    if (!c->wgmma && c->cluster > 1)
        return stof__why(why, n,
                         "cluster %d: only the wgmma template (sm_90a) runs "
                         "in clusters",
                         c->cluster);
    if (c->wgmma)
        return wgmma_cfg_valid(dev, c, e, N, why, n);
    if (!is_pow2(c->block_m) || c->block_m < 16 || c->block_m > 256)
        return stof__why(why, n, "block_m %d: must be 16, 32, 64, 128 or 256",
                         c->block_m);
    if (!is_pow2(c->block_n) || c->block_n < 32 || c->block_n > 256)
        return stof__why(why, n, "block_n %d: must be 32, 64, 128 or 256",
                         c->block_n);
    if (c->block_k != 32 && c->block_k != 64)
        return stof__why(why, n, "block_k %d: must be 32 or 64", c->block_k);
    if (!is_pow2(c->warps_m) || !is_pow2(c->warps_n) ||
        c->warps_m * c->warps_n > 8)
        return stof__why(why, n,
                         "warps %dx%d: each a power of two, at most 8 warps "
                         "in all",
                         c->warps_m, c->warps_n);
    if (c->block_m % (16 * c->warps_m) != 0 ||
        c->block_n % (16 * c->warps_n) != 0)
        return stof__why(why, n,
                         "block %dx%d with %dx%d warps: each warp's tile must "
                         "be a multiple of 16 in both directions",
                         c->block_m, c->block_n, c->warps_m, c->warps_n);
    const int acc = (c->block_m / c->warps_m) * (c->block_n / c->warps_n) / 32;
    if (acc > GEMM_ACC_MAX)
        return stof__why(why, n,
                         "block %dx%d with %dx%d warps: %d accumulators per "
                         "thread (at most %d)",
                         c->block_m, c->block_n, c->warps_m, c->warps_n, acc,
                         GEMM_ACC_MAX);
    if (c->stages < 2 || c->stages > 5)
        return stof__why(why, n, "stages %d: must be 2..5", c->stages);
    if (!epi_valid(e, why, n))
        return 0;
    if (e->gated)
        return stof__why(why, n,
                         "gated: only the wgmma template (sm_90a) fuses it; "
                         "elsewhere the layer runs the 2N-wide GEMM and a "
                         "gate kernel");
    const size_t smem = stof__gemm_smem_bytes(c, e, N);
    const size_t lim = smem_limit(dev);
    if (smem > lim)
        return stof__why(why, n,
                         "block %dx%dx%d, %d stages%s: %zu bytes of shared "
                         "memory, more than the %zu the %s allows",
                         c->block_m, c->block_n, c->block_k, c->stages,
                         e->norm ? " with a row buffer of the whole N" : "",
                         smem, lim,
                         dev && dev->ok ? "device" : "largest supported GPU");
    return 1;
}

/* ------------------------------------------------------------------------ */
/* Candidates and cost model                                                 */
/* ------------------------------------------------------------------------ */

typedef struct tile {
    int bm, bn, bk, wm, wn;
} tile;

/* Full tiles, large first. */
static const tile gemm_tiles[] = {
    {128, 256, 32, 2, 4}, {256, 128, 32, 4, 2}, {128, 128, 32, 2, 4},
    {128, 128, 64, 2, 4}, {64, 128, 32, 2, 2},  {128, 64, 32, 2, 2},
    {64, 64, 32, 2, 2},   {64, 64, 64, 2, 2},   {32, 64, 32, 1, 2},
    {32, 128, 32, 1, 4},
};

/* Row-complete (norm) tiles: block_n is the pass width. */
static const tile norm_tiles[] = {
    {16, 128, 64, 1, 4}, {16, 64, 64, 1, 4}, {32, 128, 32, 2, 4},
    {32, 64, 64, 2, 2},  {64, 128, 32, 2, 4}, {64, 64, 32, 2, 2},
};

static int round_up(int x, int m)
{
    return (x + m - 1) / m * m;
}

/* The Hopper template's tiles: block_n, stages, warps_m (2: both
 * consumer warpgroups on each tile; 1: ping-pong), cluster (2: pairs of
 * CTAs sharing each W tile). Of the pairs only 128 x 256 is listed: on an
 * H100 it won the 16384 x 768 x 3072 GEMM (2% over the same tile alone)
 * and was within 6% elsewhere; 128 x 128 and 64-wide pairs (-11% to +9%
 * against the same tile alone) were never the fastest of any shape. */
static const int wgmma_tiles[][4] = {
    {256, 4, 2, 1}, {256, 3, 2, 1}, {256, 2, 2, 1}, {128, 4, 2, 1},
    {128, 5, 2, 1}, {128, 6, 2, 1}, {64, 6, 2, 1},  {128, 4, 1, 1},
    {128, 5, 1, 1}, {128, 6, 1, 1}, {64, 6, 1, 1},  {256, 4, 2, 2},
    {256, 3, 2, 2}};

/* With a row norm: block_n, stages, warps_m (1: ping-pong, the row
 * statistics' wait passes under the other warpgroup's K loop). */
static const int wgmma_norm_tiles[][3] = {
    {128, 5, 1}, {128, 4, 1}, {256, 3, 2}, {128, 4, 2}, {256, 2, 2}};

int stof__gemm_candidates(const stof_device *dev, const stof_gemm_epi *e,
                          int M, int N, int K, stof_gemm_cfg *out, int max)
{
    if (!e || !out || max <= 0 || M <= 0)
        return 0;
    int k = 0;
    const int hopper = dev && dev->ok && dev->cc_major == 9 &&
                       dev->cc_minor == 0;
    for (int i = 0; hopper && e->norm &&
                    i < (int)(sizeof(wgmma_norm_tiles) /
                              sizeof(*wgmma_norm_tiles)) &&
                    k < max;
         i++) {
        const stof_gemm_cfg c = {WG_BM, wgmma_norm_tiles[i][0],
                                 WG_BK, wgmma_norm_tiles[i][2],
                                 1,     wgmma_norm_tiles[i][1],
                                 1,     1};
        if (stof__gemm_cfg_valid(dev, &c, e, N, K, NULL, 0))
            out[k++] = c;
    }
    for (int i = 0; hopper && !e->norm &&
                    i < (int)(sizeof(wgmma_tiles) / sizeof(*wgmma_tiles)) &&
                    k < max;
         i++) {
        const int bn = wgmma_tiles[i][0];
        const int out_n = e->gated ? bn / 2 : bn; /* the C tile's */
        if (out_n > 64 && out_n >= 2 * round_up(N > 0 ? N : 1, 32))
            continue;
        stof_gemm_cfg c = {WG_BM, bn,  WG_BK, wgmma_tiles[i][2],
                           1,     wgmma_tiles[i][1], 1, wgmma_tiles[i][3]};
        /* A pair needs two tile rows. */
        if (c.cluster > 1 && M <= WG_BM)
            continue;
        if (stof__gemm_cfg_valid(dev, &c, e, N, K, NULL, 0))
            out[k++] = c;
    }
    const tile *list = e->norm ? norm_tiles : gemm_tiles;
    const int n_list = e->norm ? (int)(sizeof(norm_tiles) / sizeof(*norm_tiles))
                               : (int)(sizeof(gemm_tiles) / sizeof(*gemm_tiles));
    const int m16 = round_up(M, 16), n32 = round_up(N > 0 ? N : 1, 32);
    for (int i = 0; i < n_list && k < max; i++) {
        const tile *t = &list[i];
        /* Tiles far larger than the problem only waste work. */
        if (t->bm > 32 && t->bm >= 2 * m16)
            continue;
        if (!e->norm && t->bn > 64 && t->bn >= 2 * n32)
            continue;
        static const int stages[] = {3, 4};
        for (int s = 0; s < 2 && k < max; s++) {
            stof_gemm_cfg c = {t->bm, t->bn, t->bk, t->wm,
                               t->wn, stages[s], 0, 1};
            if (stof__gemm_cfg_valid(dev, &c, e, N, K, NULL, 0))
                out[k++] = c;
        }
    }
    return k;
}

/* The memory-bound time of the problem in seconds: A, W, C (and the
 * residual, pre, bias) once through DRAM. */
static double gemm_mem_s(const stof_gemm_epi *e, int M, int N, int K)
{
    const double wn = e->gated ? 2.0 * N : (double)N; /* W's rows */
    double bytes = ((double)M * K + wn * K) * 2.0 +
                   (double)M * N * 2.0 * (1 + e->residual + e->write_pre);
    if (e->bias)
        bytes += wn * 2.0;
    return bytes / GEMM_BW;
}

/* stof__gemm_model_ms of the Hopper template: one CTA per SM walks the
 * tiles; a tile's time at WGMMA_SM_PEAK times the tile's efficiency
 * (wide tiles reuse each A tile more; two stages hide less latency;
 * ping-pong hides the epilogue under the other warpgroup's K loop, which
 * counts most at small K). */
static double wgmma_model_ms(const stof_device *dev, const stof_gemm_cfg *c,
                             const stof_gemm_epi *e, int M, int N, int K)
{
    const int sms = dev && dev->ok && dev->sm_count > 0 ? dev->sm_count : 132;
    double eff = c->block_n >= 256 ? 0.78 : c->block_n >= 128 ? 0.72 : 0.55;
    if (c->warps_m == 1) /* the epilogue's share, about 1/(K/64 + 4) */
        eff *= 1.0 + 4.0 / (round_up(K, WG_BK) / WG_BK + 4.0);
    if (eff > 0.9)
        eff = 0.9;
    if (c->stages <= 2)
        eff *= 0.85;
    /* 128 x 256 hides the K-steps' latency fully only with 4 stages
     * (H100, plain: s3 2-3% slower at K 768, 22% at K 3072). */
    else if (c->block_n >= 256 && c->stages == 3)
        eff *= 0.95;
    /* Pairs read each W tile once for two CTAs: less L2 traffic a K-step
     * (a few percent; the search's timings decide). */
    if (c->cluster > 1)
        eff *= 1.03;
    const int out_n = e->gated ? c->block_n / 2 : c->block_n;
    const int tiles_m = (M + WG_BM - 1) / WG_BM;
    const int tiles_n = (N + out_n - 1) / out_n;
    const double tiles = (double)(c->cluster > 1 ? round_up(tiles_m, 2)
                                                 : tiles_m) *
                         (double)tiles_n;
    const double kpad = (double)round_up(K, WG_BK);
    /* A row norm: the grid is a multiple of the row's tiles, and each
     * tile waits for its row's statistics (about two microseconds; under
     * the other warpgroup's K loop with ping-pong). */
    const double tile_s =
        2.0 * WG_BM * c->block_n * kpad / (WGMMA_SM_PEAK * eff) +
        (e->norm && c->warps_m != 1 ? 2e-6 : 0.0);
    const int grid = e->norm ? sms / tiles_n * tiles_n : sms;
    const double compute_s =
        grid > 0 ? ceil(tiles / grid) * tile_s : INFINITY;
    const double mem_s = gemm_mem_s(e, M, N, K);
    return (compute_s > mem_s ? compute_s : mem_s) * 1e3 + GEMM_LAUNCH_MS;
}

double stof__gemm_model_ms(const stof_device *dev, const stof_gemm_cfg *c,
                           const stof_gemm_epi *e, int M, int N, int K)
{
    if (!c || !e || M <= 0 || N <= 0 || K <= 0 || c->block_m <= 0 ||
        c->block_n <= 0 || c->block_k <= 0)
        return INFINITY;
    if (c->wgmma)
        return wgmma_model_ms(dev, c, e, M, N, K);
    const int sms = dev && dev->ok && dev->sm_count > 0 ? dev->sm_count : 132;
    const size_t smem_sm = dev && dev->ok && dev->max_smem_optin > 0
                               ? (size_t)dev->max_smem_optin
                               : (size_t)GEMM_SMEM_MAX_ANY;
    const int threads = c->warps_m * c->warps_n * 32;
    /* CTAs an SM holds: shared memory, threads, registers (accumulators
     * plus ~96 others a thread: fragments double-buffered, addresses). */
    const size_t smem = stof__gemm_smem_bytes(c, e, N);
    int occ = smem ? (int)(smem_sm / smem) : 1;
    if (occ > 2048 / threads)
        occ = 2048 / threads;
    const int regs = (c->block_m / c->warps_m) * (c->block_n / c->warps_n) /
                         32 + 96;
    if (occ > 65536 / (threads * regs))
        occ = 65536 / (threads * regs);
    if (occ < 1)
        occ = 1;
    /* Tile efficiency: the mma work per byte staged through shared memory
     * grows with bm*bn/(bm+bn); 85 (a 128x256 tile) reaches ~90% of peak,
     * smaller tiles lose about as the square root of the ratio (measured on
     * H200: 128x128 ~0.7-0.9, 64x128 ~0.8, 32x64 ~0.45 of 128x256). Two
     * stages hide latency less well. */
    const double inten =
        (double)c->block_m * c->block_n / (double)(c->block_m + c->block_n);
    double eff = 0.9 * (inten >= 85.0 ? 1.0 : sqrt(inten / 85.0));
    if (c->stages <= 2)
        eff *= 0.85;
    if (threads <= 64)
        eff *= 0.8;
    const int mt = (M + c->block_m - 1) / c->block_m;
    const int nt = e->norm ? 1 : (N + c->block_n - 1) / c->block_n;
    const int passes = e->norm ? (N + c->block_n - 1) / c->block_n : 1;
    const double ctas = (double)mt * nt;
    const double slots = (double)sms * occ;
    const double waves = ceil(ctas / slots);
    /* One CTA-pass's time when `occ` CTAs share an SM. */
    const double kpad = (double)round_up(K, c->block_k);
    const double cta_flops = 2.0 * c->block_m * c->block_n * kpad * passes;
    const double cta_s = cta_flops / (GEMM_SM_PEAK * eff / occ);
    /* When fewer CTAs than slots run, each SM still works alone (no
     * sharing), so a partly filled last wave costs its share only. */
    const double busy = ctas < slots ? ceil(ctas / sms) : waves * occ;
    const double compute_s =
        (ctas < slots ? busy * cta_s / occ : waves * cta_s);
    const double mem_s = gemm_mem_s(e, M, N, K);
    const double s = compute_s > mem_s ? compute_s : mem_s;
    return s * 1e3 + GEMM_LAUNCH_MS;
}

/* ------------------------------------------------------------------------ */
/* Compile, load, launch                                                     */
/* ------------------------------------------------------------------------ */

/* stof__gemm_compile of the Hopper template (c already checked). */
static stof_status wgmma_compile(stof_context *ctx, stof_dtype dt,
                                 const stof_gemm_cfg *c,
                                 const stof_gemm_epi *e, int N, void **cubin,
                                 size_t *size)
{
    char d[12][32];
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
    const char *defs[12] = {d[0], d[1], d[2], d[3], d[4],  d[5],
                            d[6], d[7], d[8], d[9], d[10], d[11]};
    return (stof_status)stof__jit_compile(ctx, "gemm_wgmma.cu", defs, 12,
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

static stof_status load_cubin(stof_context *ctx, const stof_gemm_cfg *c,
                              const stof_gemm_epi *e, int N,
                              const void *cubin, size_t size, CUmodule *mod,
                              CUfunction *fn, int shared)
{
    if (!c || !e || !cubin || !mod || !fn)
        return stof__fail(ctx, STOF_ERR_INVALID_ARGUMENT,
                          "gemm load: NULL argument");
    const char *name = c->wgmma ? "stof_gemm_wgmma" : "stof_gemm";
    const size_t smem = stof__gemm_smem_bytes(c, e, N);
    return (stof_status)(shared ? stof__module_load_shared(ctx, cubin, size,
                                                           name, smem, mod, fn)
                                : stof__module_load(ctx, cubin, name, smem,
                                                    mod, fn));
}

stof_status stof__gemm_load_cubin(stof_context *ctx, const stof_gemm_cfg *c,
                                  const stof_gemm_epi *e, int N,
                                  const void *cubin, CUmodule *mod,
                                  CUfunction *fn)
{
    return load_cubin(ctx, c, e, N, cubin, 0, mod, fn, 0);
}

stof_status stof__gemm_load_cubin_shared(stof_context *ctx,
                                         const stof_gemm_cfg *c,
                                         const stof_gemm_epi *e, int N,
                                         const void *cubin, size_t size,
                                         CUmodule *mod, CUfunction *fn)
{
    return load_cubin(ctx, c, e, N, cubin, size, mod, fn, 1);
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

/* A launch of `clusters` clusters of `cs` 384-thread CTAs (at points to
 * the attribute cfg uses). */
static void cluster_config(CUlaunchConfig *cfg, CUlaunchAttribute *at,
                           unsigned cs, unsigned clusters, unsigned smem,
                           CUstream stream)
{
    memset(at, 0, sizeof(*at));
    at->id = CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION;
    at->value.clusterDim.x = cs;
    at->value.clusterDim.y = 1;
    at->value.clusterDim.z = 1;
    memset(cfg, 0, sizeof(*cfg));
    cfg->gridDimX = cs * clusters;
    cfg->gridDimY = cfg->gridDimZ = 1;
    cfg->blockDimX = 384;
    cfg->blockDimY = cfg->blockDimZ = 1;
    cfg->sharedMemBytes = smem;
    cfg->hStream = stream;
    cfg->attrs = at;
    cfg->numAttrs = 1;
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
        CUlaunchAttribute at;
        CUlaunchConfig cfg;
        cluster_config(&cfg, &at, cs, (unsigned)(fallback > 0 ? fallback : 1),
                       smem, NULL);
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
    CUlaunchAttribute at;
    CUlaunchConfig cfg;
    cluster_config(&cfg, &at, cs, (unsigned)clusters, smem, stream);
    return launch(&cfg, fn, params, NULL) == CUDA_SUCCESS ? STOF_OK
                                                          : STOF_ERR_CUDA;
}

/* Launch a row-norm kernel: a multiple of the row's `row_tiles` tiles (so
 * a row's tiles run in the same round), at most ctas (0: one CTA per
 * tile) and items, cooperatively: its CTAs wait for each other's row
 * statistics, so all must be resident (the launch fails rather than
 * hangs when they cannot be). */
static stof_status norm_launch(CUfunction fn, const stof_api *api,
                               int row_tiles, int ctas, int64_t items,
                               unsigned smem, CUstream stream, void **params)
{
    stof_launch_ex_fn launch = stof__launch_ex(api);
    if (!launch)
        return STOF_ERR_UNSUPPORTED;
    int64_t grid = ctas > 0 && ctas < items ? ctas : items;
    grid = grid / row_tiles * row_tiles;
    if (grid < row_tiles)
        grid = row_tiles;
    CUlaunchAttribute at;
    memset(&at, 0, sizeof(at));
    at.id = CU_LAUNCH_ATTRIBUTE_COOPERATIVE;
    at.value.cooperative = 1;
    CUlaunchConfig cfg;
    memset(&cfg, 0, sizeof(cfg));
    cfg.gridDimX = (unsigned)grid;
    cfg.gridDimY = cfg.gridDimZ = 1;
    cfg.blockDimX = 384;
    cfg.blockDimY = cfg.blockDimZ = 1;
    cfg.sharedMemBytes = smem;
    cfg.hStream = stream;
    cfg.attrs = &at;
    cfg.numAttrs = 1;
    return launch(&cfg, fn, params, NULL) == CUDA_SUCCESS ? STOF_OK
                                                          : STOF_ERR_CUDA;
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
    /* The raster's items: tiles, or pairs of tile rows. */
    const int64_t items = (int64_t)(pair ? (p.tiles_m + 1) / 2 : p.tiles_m) *
                          p.tiles_n;
    if (items > INT32_MAX / 2 ||
        (e->norm && (p.tiles_n > WG_NORM_TILES || pair || !a->ws ||
                     a->ws % 16u)))
        return STOF_ERR_INVALID_ARGUMENT;
    const unsigned smem = (unsigned)stof__gemm_smem_bytes(c, e, a->N);
    void *params[] = {&p};
    if (e->norm)
        return norm_launch(fn, api, p.tiles_n, ctas, items, smem, stream,
                           params);
    if (!pair) {
        const unsigned grid =
            (unsigned)(ctas > 0 && ctas < items ? ctas : items);
        CUresult r = api->cuLaunchKernel(fn, grid, 1, 1, 384, 1, 1, smem,
                                         stream, params, NULL);
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
    if (c->wgmma)
        return wgmma_launch(fn, c, e, a, ctas, stream, api);
    if (e->gated) /* the mma.sync template has no gated epilogue */
        return STOF_ERR_INVALID_ARGUMENT;
    const unsigned gx =
        e->norm ? 1u : (unsigned)((a->N + c->block_n - 1) / c->block_n);
    const int64_t gy = ((int64_t)a->M + c->block_m - 1) / c->block_m;
    if (gy > 65535)
        return STOF_ERR_INVALID_ARGUMENT;
    const size_t smem = stof__gemm_smem_bytes(c, e, a->N);
    void *params[] = {(void *)a};
    CUresult r = api->cuLaunchKernel(
        fn, gx, (unsigned)gy, 1, (unsigned)(c->warps_m * c->warps_n * 32), 1,
        1, (unsigned)smem, stream, params, NULL);
    return r == CUDA_SUCCESS ? STOF_OK : STOF_ERR_CUDA;
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
    return (stof_status)stof__jit_compile(ctx, "layer_ops.cu", defs, 3, arch,
                                          cubin, size);
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
    CUresult r = api->cuLaunchKernel(fn, grid, 1, 1, 256, 1, 1, 0, stream,
                                     params, NULL);
    return r == CUDA_SUCCESS ? STOF_OK : STOF_ERR_CUDA;
}

/* ------------------------------------------------------------------------ */
/* JSON                                                                      */
/* ------------------------------------------------------------------------ */

static const char *const cfg_keys[] = {"bm",  "bn",   "bk",  "wm",
                                        "wn",  "st",   "bias", "act",
                                        "res", "norm", "pre",  "wg",
                                        "gated", "cl"};
/* "wg" (the Hopper template), "gated" and "cl" (its cluster) are written
 * only when set; older records have the first 11 keys. */
enum { CFG_KEYS = 11, CFG_KEYS_ALL = 14 };

void stof__gemm_cfg_json(const stof_gemm_cfg *c, const stof_gemm_epi *e,
                         stof_str *out)
{
    if (!c || !e || !out)
        return;
    const int v[CFG_KEYS_ALL] = {c->block_m,  c->block_n,   c->block_k,
                                 c->warps_m,  c->warps_n,   c->stages,
                                 e->bias,     e->act,       e->residual,
                                 e->norm,     e->write_pre, c->wgmma,
                                 e->gated,    c->cluster > 1 ? c->cluster : 0};
    json_t *o = json_object();
    for (int i = 0; o && i < CFG_KEYS_ALL; i++)
        if (i < CFG_KEYS || v[i])
            json_object_set_new(o, cfg_keys[i], json_integer(v[i]));
    char *text = o ? json_dumps(o, JSON_COMPACT) : NULL;
    json_decref(o);
    if (text)
        stof__str_printf(out, "%s", text);
    else
        out->oom = 1;
    free(text);
}

int stof__gemm_cfg_parse(const char *json, stof_gemm_cfg *c,
                         stof_gemm_epi *e)
{
    int val[CFG_KEYS_ALL];
    if (!json || !c || !e || !stof__json_ints(json, cfg_keys, CFG_KEYS, val))
        return 0;
    /* Exactly these keys (and the optional ones when set): a configuration
     * with more is not one of ours. */
    json_t *o = json_loads(json, 0, NULL);
    size_t want = CFG_KEYS;
    int ok = o != NULL;
    for (int i = CFG_KEYS; ok && i < CFG_KEYS_ALL; i++) {
        val[i] = 0;
        if (json_object_get(o, cfg_keys[i])) {
            want++;
            ok = stof__json_ints(json, cfg_keys + i, 1, val + i);
        }
    }
    ok = ok && json_object_size(o) == want;
    json_decref(o);
    if (!ok)
        return 0;
    for (int i = 0; i < CFG_KEYS_ALL; i++)
        if (val[i] < -1000000 || val[i] > 1000000)
            return 0;
    c->block_m = val[0];
    c->block_n = val[1];
    c->block_k = val[2];
    c->warps_m = val[3];
    c->warps_n = val[4];
    c->stages = val[5];
    e->bias = val[6];
    e->act = val[7];
    e->residual = val[8];
    e->norm = val[9];
    e->write_pre = val[10];
    c->wgmma = val[11];
    e->gated = val[12];
    c->cluster = val[13] > 1 ? val[13] : 1; /* absent: alone */
    return 1;
}

/* ------------------------------------------------------------------------ */
/* CPU references                                                            */
/* ------------------------------------------------------------------------ */

float stof__ref_act(float v, int act)
{
    switch (act) {
    case STOF_ACT_GELU_TANH: {
        const float u = 0.7978845608028654f * (v + 0.044715f * v * v * v);
        return 0.5f * v * (1.0f + tanhf(u));
    }
    case STOF_ACT_GELU_ERF:
        return 0.5f * v * (1.0f + erff(v * 0.7071067811865476f));
    case STOF_ACT_RELU:
        return v > 0.0f ? v : 0.0f;
    case STOF_ACT_SILU:
        return v / (1.0f + expf(-v));
    default:
        return v;
    }
}

void stof__ref_norm_row(const float *v, const float *gamma, const float *beta,
                        int n, int kind, float eps, float *out)
{
    if (!v || !gamma || !out || n <= 0)
        return;
    double mean = 0.0;
    if (kind == STOF_NORM_LAYER) {
        for (int i = 0; i < n; i++)
            mean += v[i];
        mean /= n;
    }
    double ss = 0.0;
    for (int i = 0; i < n; i++) {
        const double d = v[i] - mean;
        ss += d * d;
    }
    const float rstd = (float)(1.0 / sqrt(ss / n + (double)eps));
    for (int i = 0; i < n; i++) {
        float y = ((float)(v[i] - mean)) * rstd * gamma[i];
        if (kind == STOF_NORM_LAYER && beta)
            y += beta[i];
        out[i] = y;
    }
}

static float round_dt(float v, stof_dtype dt)
{
    if (dt != STOF_DTYPE_FP16 && dt != STOF_DTYPE_BF16)
        return v;
    return stof__half_to_f32(stof__f32_to_half(v, dt), dt);
}

static float dot_row(const float *a, const float *w, int K)
{
    double acc = 0.0;
    for (int k = 0; k < K; k++)
        acc += (double)a[k] * (double)w[k];
    return (float)acc;
}

void stof__ref_gemm(const float *A, const float *W, const float *bias,
                    const float *residual, const float *gamma,
                    const float *beta, int M, int N, int K, int64_t lda,
                    int64_t ldw, int64_t ldc, const stof_gemm_epi *e,
                    float eps, stof_dtype dt, float *out, float *pre)
{
    if (!A || !W || !e || !out || M <= 0 || N <= 0 || K < 0)
        return;
    float *row = malloc((size_t)N * 2u * sizeof(float));
    if (!row)
        return;
    float *nrm = row + N;
    for (int m = 0; m < M; m++) {
        const float *a = A + (int64_t)m * lda;
        for (int n = 0; n < N; n++) {
            float v = dot_row(a, W + (int64_t)n * ldw, K);
            if (e->bias && bias)
                v += bias[n];
            v = stof__ref_act(v, e->act);
            if (e->gated) { /* times the up projection, row N + n */
                float u = dot_row(a, W + (int64_t)(N + n) * ldw, K);
                if (e->bias && bias)
                    u += bias[N + n];
                v *= u;
            }
            if (e->residual && residual)
                v += residual[(int64_t)m * ldc + n];
            row[n] = round_dt(v, dt);
        }
        float *o = out + (int64_t)m * ldc;
        if (e->norm && gamma) {
            stof__ref_norm_row(row, gamma, beta, N,
                               e->norm == 1 ? STOF_NORM_LAYER : STOF_NORM_RMS,
                               eps, nrm);
            for (int n = 0; n < N; n++)
                o[n] = round_dt(nrm[n], dt);
            if (pre)
                memcpy(pre + (int64_t)m * ldc, row, (size_t)N * sizeof(float));
        } else {
            memcpy(o, row, (size_t)N * sizeof(float));
        }
    }
    free(row);
}
