/*
 * gemm.c - host side of the tensor-core GEMM templates
 * (jit_templates/gemm.cu, gemm_wgmma.cu): which configurations they
 * support, their shared memory and workspace, the candidates and cost
 * model of the planner, the JSON form of a configuration and the CPU
 * references. Compiling, loading and launching: gemm_launch.c.
 * Declarations and contracts: gemm.h.
 */
#include "gemm.h"

#include <jansson.h>

#include <ctype.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The largest opt-in shared memory of any GPU the kernel targets (sm_90:
 * 227 KiB); used when no device is given. */
#define GEMM_SMEM_MAX_ANY (227 * 1024)


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
                       a residual, which is loaded into them, or a norm;
                       none with cslot: the slots hold them), the
                       mbarriers (two a stage, four more), with a norm
                       gamma and beta of the tile's columns in fp32, 1024
                       of slack */
        const int norm = e && e->norm;
        return (size_t)c->stages *
                   ((size_t)c->block_m + (size_t)c->block_n) *
                   (size_t)c->block_k * 2u +
               (c->cslot ? 0u : 2u) *
                   (e && (e->residual || norm) ? 4u : 2u) * 64u * 64u *
                   2u +
               16u * (size_t)c->stages + 32u +
               (norm ? 8u * (size_t)c->block_n : 0u) + 1024u;
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
    /* The row counters (WG_ROW_SLICES a tile row, padded to 256 bytes),
     * then each tile's 128 rows' statistics (two floats). */
    const size_t tiles_m = ((size_t)M + WG_BM - 1) / WG_BM;
    const size_t row_tiles = ((size_t)N + (size_t)c->block_n - 1) /
                             (size_t)c->block_n;
    return (tiles_m * WG_ROW_SLICES + 63u) / 64u * 256u +
           tiles_m * row_tiles * 128u * 8u;
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
    if (e->rope < 0 || (e->rope == 0 && e->rope_hd != 0))
        return stof__why(why, n, "rope %d, rope_hd %d: rope 0 wants rope_hd 0",
                         e->rope, e->rope_hd);
    if (e->rope &&
        (e->rope_hd < 16 || e->rope_hd > 256 || e->rope_hd % 8 ||
         e->rope % 16 || e->rope > e->rope_hd))
        return stof__why(why, n,
                         "rope %d over heads of %d: the head a multiple of 8 "
                         "in 16..256, rope a multiple of 16 at most the head",
                         e->rope, e->rope_hd);
    if (e->rope && (e->act != STOF_ACT_NONE || e->gated || e->residual ||
                    e->norm))
        return stof__why(why, n,
                         "rope: not with an activation, a gate, a residual "
                         "or a norm");
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
        (c->block_n != 64 && c->block_n != 128 && c->block_n != 192 &&
         c->block_n != 256))
        return stof__why(why, n,
                         "wgmma template: block %dx%dx%d, must be 128 x "
                         "(64, 128, 192 or 256) x 64",
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
    if (c->cslot != 0 && c->cslot != 1)
        return stof__why(why, n, "wgmma template: cslot %d, must be 0 or 1",
                         c->cslot);
    if (c->cslot && (!(e->residual || e->norm) || c->warps_m != 2 ||
                     c->cluster > 1))
        return stof__why(why, n,
                         "wgmma template: cslot (C units in the pipeline's "
                         "slots) needs a residual or a norm, warps 2x1 and "
                         "no pairs");
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
    if (e->gated && (c->block_n < 128 || c->block_n == 192))
        return stof__why(why, n,
                         "wgmma template: gated needs block_n 128 or 256 "
                         "(the output tile is half of it), not %d",
                         c->block_n);
    if (c->block_n == 192 && c->cluster > 1)
        return stof__why(why, n,
                         "wgmma template: block_n 192 runs no pairs "
                         "(cluster %d)",
                         c->cluster);
    if (e->rope && c->block_n % e->rope_hd)
        return stof__why(why, n,
                         "wgmma template: rope needs whole heads of %d in "
                         "a tile of %d columns",
                         e->rope_hd, c->block_n);
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
    if (!c->wgmma && c->cslot)
        return stof__why(why, n,
                         "cslot %d: only the wgmma template (sm_90a) has "
                         "pipeline slots to put C in",
                         c->cslot);
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
    if (e->rope)
        return stof__why(why, n,
                         "rope: only the wgmma template (sm_90a) fuses it; "
                         "elsewhere the layer runs the plain GEMM and a "
                         "rope kernel");
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
 * CTAs sharing each W tile), cslot (1: C in the pipeline's slots; only
 * with a residual, where 128 x 256 then keeps four stages and 128 x 128
 * six). Of the pairs only 128 x 256 is listed: on an H100 it won the
 * 16384 x 768 x 3072 GEMM (2% over the same tile alone) and was within 6%
 * elsewhere; 128 x 128 and 64-wide pairs (-11% to +9% against the same
 * tile alone) were never the fastest of any shape. */
static const int wgmma_tiles[][5] = {
    {256, 4, 2, 1, 0}, {256, 3, 2, 1, 0}, {256, 2, 2, 1, 0},
    {128, 4, 2, 1, 0}, {128, 5, 2, 1, 0}, {128, 6, 2, 1, 0},
    {64, 6, 2, 1, 0},  {128, 4, 1, 1, 0}, {128, 5, 1, 1, 0},
    {128, 6, 1, 1, 0}, {64, 6, 1, 1, 0},  {256, 4, 2, 2, 0},
    {256, 3, 2, 2, 0}, {256, 4, 2, 1, 1}, {128, 6, 2, 1, 1}};

/* With a row norm: block_n, stages, warps_m (1: ping-pong, the row
 * statistics' wait passes under the other warpgroup's K loop), cslot (C
 * units in the pipeline's slots: one stage more). 192 makes
 * a 768-wide row 4 tiles, so 4096 tokens' 128 tiles fill 132 SMs in one
 * round (128 x 128: 192 tiles, two rounds; 128 x 256: 96). 64 only where
 * all tiles fit one round (norm_narrow): a few tile rows, whose wider
 * tiles leave most SMs idle (128 tokens x 768: 4 CTAs of 128 x 192). */
static const int wgmma_norm_tiles[][4] = {
    {128, 5, 1, 0}, {128, 4, 1, 0}, {256, 3, 2, 0}, {128, 4, 2, 0},
    {256, 2, 2, 0}, {192, 4, 2, 0}, {192, 3, 2, 0}, {64, 6, 2, 0},
    {64, 6, 1, 0},  {256, 4, 2, 1}, {192, 5, 2, 1}, {128, 6, 2, 1}};

/* Whether 64-column norm tiles are candidates for M x N: every tile in
 * one round of the SMs. */
static int norm_narrow(const stof_device *dev, int M, int N)
{
    const int sms = dev && dev->ok && dev->sm_count > 0 ? dev->sm_count : 132;
    const long tiles = (long)((M + WG_BM - 1) / WG_BM) * ((N + 63) / 64);
    return M > 0 && N > 0 && tiles <= sms;
}

size_t stof__gemm_norm_ws_max(const stof_device *dev, int M, int N)
{
    if (!dev || !dev->ok || dev->cc_major != 9 || dev->cc_minor != 0)
        return 0;
    /* The narrowest tile a row norm over N may take (64 columns only when
     * norm_narrow offers them); none when even 256 columns leave a row
     * more tiles than it may have (no norm GEMM can run). */
    static const int widths[] = {64, 128, 192, 256};
    for (int i = norm_narrow(dev, M, N) ? 0 : 1; i < 4; i++) {
        if ((N + widths[i] - 1) / widths[i] > WG_NORM_TILES)
            continue;
        const stof_gemm_cfg c = {WG_BM, widths[i], WG_BK, 1, 1, 2, 1, 1, 0};
        const stof_gemm_epi e = {.norm = 1};
        return stof__gemm_ws_bytes(&c, &e, M, N);
    }
    return 0;
}

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
                                 1,     1,
                                 wgmma_norm_tiles[i][3]};
        if (c.block_n == 64 && !norm_narrow(dev, M, N))
            continue;
        if (stof__gemm_cfg_valid(dev, &c, e, N, K, NULL, 0))
            out[k++] = c;
    }
    /* RoPE wants whole heads in a tile: heads of 96 (48, 24) fit only
     * 192 columns, which other epilogues never won. */
    static const int rope_tiles[][5] = {{192, 4, 2, 1, 0}, {192, 3, 2, 1, 0}};
    const int n_wt = (int)(sizeof(wgmma_tiles) / sizeof(*wgmma_tiles));
    const int n_rt = e->rope ? (int)(sizeof(rope_tiles) / sizeof(*rope_tiles))
                             : 0;
    for (int i = 0; hopper && !e->norm && i < n_wt + n_rt && k < max; i++) {
        const int *wt = i < n_wt ? wgmma_tiles[i] : rope_tiles[i - n_wt];
        const int bn = wt[0];
        const int out_n = e->gated ? bn / 2 : bn; /* the C tile's */
        if (out_n > 64 && out_n >= 2 * round_up(N > 0 ? N : 1, 32))
            continue;
        stof_gemm_cfg c = {WG_BM, bn, WG_BK, wt[2], 1, wt[1], 1, wt[3],
                           wt[4]};
        if (c.cslot && !e->residual) /* no residual: a ring of two */
            continue;
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
        /* The template's row tiles are its grid's y (at most 65535). */
        if (((int64_t)M + t->bm - 1) / t->bm > 65535)
            continue;
        static const int stages[] = {3, 4};
        for (int s = 0; s < 2 && k < max; s++) {
            stof_gemm_cfg c = {t->bm, t->bn, t->bk, t->wm,
                               t->wn, stages[s], 0, 1, 0};
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
    double eff = c->block_n >= 256   ? 0.78
                 : c->block_n >= 192 ? 0.76
                 : c->block_n >= 128 ? 0.72
                                     : 0.55;
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
    double rounds = grid > 0 ? ceil(tiles / grid) : INFINITY;
    /* Ping-pong tiles alone split a short last round into 64-row halves
     * (stof__gemm_split_from): half a tile's time. */
    if (grid > 0 && c->warps_m == 1 && !e->norm && c->cluster <= 1 &&
        stof__gemm_split_from((int64_t)tiles, grid) < (int64_t)tiles)
        rounds = floor(tiles / grid) + 0.5;
    const double compute_s = rounds * tile_s;
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
/* JSON                                                                      */
/* ------------------------------------------------------------------------ */

static const char *const cfg_keys[] = {"bm",  "bn",   "bk",  "wm",
                                        "wn",  "st",   "bias", "act",
                                        "res", "norm", "pre",  "wg",
                                        "gated", "cl",  "cs",  "rope",
                                        "rhd"};
/* "wg" (the Hopper template), "gated", "cl" (its cluster), "cs" (C in
 * its slots), "rope" and "rhd" (its head) are written only when set;
 * older records have the first 11 keys. */
enum { CFG_KEYS = 11, CFG_KEYS_ALL = 17 };

void stof__gemm_cfg_json(const stof_gemm_cfg *c, const stof_gemm_epi *e,
                         stof_str *out)
{
    if (!c || !e || !out)
        return;
    const int v[CFG_KEYS_ALL] = {c->block_m,  c->block_n,   c->block_k,
                                 c->warps_m,  c->warps_n,   c->stages,
                                 e->bias,     e->act,       e->residual,
                                 e->norm,     e->write_pre, c->wgmma,
                                 e->gated,    c->cluster > 1 ? c->cluster : 0,
                                 c->cslot,    e->rope,      e->rope_hd};
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
    c->cslot = val[14];
    e->rope = val[15];
    e->rope_hd = val[16];
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
    stof__ref_gemm_rope(A, W, bias, residual, gamma, beta, M, N, K, lda, ldw,
                        ldc, e, eps, dt, NULL, out, pre);
}

void stof__rope_freqs(float *f, int rope, float theta)
{
    for (int i = 0; f && rope > 0 && i < rope / 2; i++) {
        /* Hugging Face: 1 / theta ** (arange(0, rope, 2).float() / rope),
         * each step in fp32. */
        const float ex = (float)(2 * i) / (float)rope;
        f[i] = 1.0f / powf(theta, ex);
    }
}

void stof__rope_table(float *tab, const int *pos, int n, int rope,
                      float theta)
{
    float f[128];
    if (rope <= 0 || rope > 256)
        return;
    stof__rope_freqs(f, rope, theta);
    stof__rope_table_f(tab, pos, n, rope, f, 1.0f);
}

void stof__rope_table_f(float *tab, const int *pos, int n, int rope,
                        const float *freq, float scale)
{
    if (!tab || !freq || n <= 0 || rope <= 0 || rope % 2)
        return;
    const int half = rope / 2;
    for (int i = 0; i < half; i++) {
        const float f = freq[i];
        const double cf = cos((double)f), sf = sin((double)f);
        double c = 1.0, s = 0.0;
        for (int k = 0; k < n; k++) {
            const int p = pos ? pos[k] : k;
            /* The angle as Hugging Face has it, one fp32 product; x the
             * exact p f (exact in double below 2^29 positions: 24 + 29
             * bits). */
            const volatile float ang = (float)p * f;
            const double x = (double)p * (double)f;
            float *t = tab + 2 * ((size_t)k * half + i);
            if (k % 64 == 0) { /* (c, s) = cos, sin of x, anew */
                c = cos(x);
                s = sin(x);
            }
            /* cos and sin of x + d, d = ang - x (|d| <= 2^-24 |x|), to
             * second order where |d| <= 2^-12 (the rest below 3e-12),
             * else from libm */
            const double d = (double)ang - x, d2 = 0.5 * d * d;
            float tc, ts;
            if (pos || fabs(d) > 0x1p-12) {
                tc = (float)cos((double)ang);
                ts = (float)sin((double)ang);
            } else {
                tc = (float)(c - s * d - c * d2);
                ts = (float)(s + c * d - s * d2);
            }
            t[0] = tc * scale; /* (exact for 1) */
            t[1] = ts * scale;
            const double nc = c * cf - s * sf;
            s = s * cf + c * sf;
            c = nc;
        }
    }
}

/* Rotate row v (N values, unrounded) of position p as e->rope says,
 * normalising each head first with a QK norm (r->qk_gamma). */
static void ref_rope_row(float *v, int N, const stof_gemm_epi *e,
                         const stof_ref_rope *r, int p)
{
    const int hd = e->rope_hd, half = e->rope / 2;
    for (int h0 = 0; r->qk_gamma && h0 + hd <= r->cols && h0 + hd <= N;
         h0 += hd) {
        const float *g = r->qk_gamma + (h0 < r->q_cols ? 0 : hd);
        double ss = 0.0;
        for (int i = 0; i < hd; i++)
            ss += (double)v[h0 + i] * v[h0 + i];
        const float rs = (float)(1.0 / sqrt(ss / hd + (double)r->qk_eps));
        for (int i = 0; i < hd; i++)
            v[h0 + i] = v[h0 + i] * rs * g[i];
    }
    if (!r->tab || half == 0)
        return;
    const float *t = r->tab + (size_t)p * e->rope;
    for (int h0 = 0; h0 + hd <= r->cols && h0 + hd <= N; h0 += hd)
        for (int i = 0; i < half; i++) {
            const float c = t[2 * i], s = t[2 * i + 1];
            const float x = v[h0 + i], y = v[h0 + i + half];
            v[h0 + i] = x * c - y * s;
            v[h0 + i + half] = y * c + x * s;
        }
}

void stof__ref_gemm_rope(const float *A, const float *W, const float *bias,
                         const float *residual, const float *gamma,
                         const float *beta, int M, int N, int K, int64_t lda,
                         int64_t ldw, int64_t ldc, const stof_gemm_epi *e,
                         float eps, stof_dtype dt, const stof_ref_rope *rope,
                         float *out, float *pre)
{
    if (!A || !W || !e || !out || M <= 0 || N <= 0 || K < 0)
        return;
    const int roped = rope && (rope->tab || rope->qk_gamma) &&
                      e->rope >= 0 && e->rope_hd > 0;
    float *row = malloc((size_t)N * 2u * sizeof(float));
    if (!row)
        return;
    float *nrm = row + N;
    for (int m = 0; m < M; m++) {
        const float *a = A + (int64_t)m * lda;
        if (roped) { /* the biased products first: pairs mix columns */
            for (int n = 0; n < N; n++) {
                row[n] = dot_row(a, W + (int64_t)n * ldw, K);
                if (e->bias && bias)
                    row[n] += bias[n];
            }
            ref_rope_row(row, N, e, rope, rope->pos ? rope->pos[m] : m);
        }
        for (int n = 0; n < N; n++) {
            float v;
            if (roped) {
                v = row[n];
            } else {
                v = dot_row(a, W + (int64_t)n * ldw, K);
                if (e->bias && bias)
                    v += bias[n];
            }
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
