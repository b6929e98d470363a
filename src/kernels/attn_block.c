/*
 * attn_block.c - host side of the block-wise sparse attention kernel
 * (jit_templates/attn_block.cu) and of its gather (row-wise) mode: which
 * configurations it supports, its shared memory, the device copies of a
 * format's tile BSR and of its row-wise lists (repacked per compacted tile),
 * compile + load, and the launches. Declarations and contracts: internal.h,
 * section "Block-wise kernel (attn_block.c)".
 */
#include "attn_block.h"
#include "internal.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Mirrors struct stof_attn_block_params in jit_templates/attn_block.cu
 * (same field order and types); both sides check the size. */
typedef struct stof_attn_block_params {
    CUdeviceptr q, k, v, o;
    CUdeviceptr row_ptr, col_idx, kind, bitmap_idx, bitmaps;
    int64_t q_stride[3], k_stride[3], v_stride[3], o_stride[3];
    int batch, heads, seq_q, seq_k;
    int n_row_blocks, bitmap_words_per_row;
    float scale_log2;
    int rp_stride;
    int kv_group, pad_;
    CUdeviceptr lse; /* 0, or float[batch][heads][seq_q] */
    CUdeviceptr o_part, lse_part; /* split kernels (attn_split.h) */
    int n_split;
    float cap_in, cap_out; /* SOFTCAP: scale / softcap, softcap * log2(e) */
    int pad2_;
    CUdeviceptr alibi;     /* ALIBI: float[heads] */
    CUdeviceptr bias;      /* BIAS: the additive bias (16-bit) */
    int64_t bias_stride[3];
    CUdeviceptr k_lim;     /* 0, or int32[batch]: keys of V read (k_len) */
} stof_attn_block_params;
_Static_assert(sizeof(stof_attn_block_params) ==
                   9 * 8 + 12 * 8 + 10 * 4 + 8 + 2 * 8 + 4 * 4 + 8 + 4 * 8 +
                       8,
               "stof_attn_block_params must match attn_block.cu");

/* The gather kernel's parameters (GATHER=1): the block ones, row_ptr /
 * kind / bitmap_idx / bitmaps describing the compacted tiles, then the key
 * lists. */
typedef struct stof_attn_gather_params {
    stof_attn_block_params b;
    CUdeviceptr key_ptr, keys;
    CUdeviceptr q_rows; /* 0 or seq_q int32: format row -> tensor row */
} stof_attn_gather_params;
_Static_assert(sizeof(stof_attn_gather_params) ==
                   sizeof(stof_attn_block_params) + 3 * 8,
               "stof_attn_gather_params must match attn_block.cu");

/* The largest opt-in shared memory of any GPU the kernel targets (sm_90:
 * 227 KiB); used when no device is given. */
#define BLOCK_SMEM_MAX_ANY (227 * 1024)

/* Accumulator registers per thread the kernel can afford without spilling
 * (measured with ptxas -v for sm_80/sm_90 over the whole space: 176 floats
 * never spill, 192 do). See block_acc_regs(). */
#define BLOCK_ACC_REGS_MAX 176


/* Floats each thread keeps live across the key loop: the S tile
 * (MT*block_n/2), the O tile (MT*head_dim/2) and, when the template keeps Q
 * in registers (Q_IN_REGS default: MT*head_dim <= 128), Q (MT*head_dim/4),
 * with MT = block_m / warps / 16. */
static int block_acc_regs(int head_dim, const stof_block_cfg *c)
{
    const int mt = c->block_m / c->warps / 16;
    int r = mt * (c->block_n / 2 + head_dim / 2);
    if (mt * head_dim <= 128)
        r += mt * head_dim / 4;
    return r;
}

size_t stof__block_smem_bytes(int head_dim, const stof_block_cfg *c)
{
    if (!c || head_dim <= 0 || c->block_m <= 0 || c->block_n <= 0 ||
        c->stages <= 0)
        return 0;
    const size_t row = (size_t)head_dim * 2u;
    const size_t s = (size_t)c->stages;
    size_t bytes = (size_t)c->block_m * row;                 /* Q */
    bytes += 2u * s * (size_t)c->block_n * row;              /* K, V */
    bytes += s * (size_t)c->block_m * (size_t)(c->block_n / 32) * 4u; /* bits */
    bytes += (s * 8u + 15u) / 16u * 16u;                     /* meta */
    if (c->gather)
        bytes += (s + 1u) * 2u * (size_t)c->block_n * 4u;    /* offsets */
    return bytes;
}

int stof__block_cfg_valid(const stof_device *dev, int head_dim,
                          const stof_block_cfg *c, char *why, size_t n)
{
    if (why && n)
        why[0] = '\0';
    if (!c)
        return stof__why(why, n, "no configuration (NULL)");
    if (head_dim != 32 && head_dim != 64 && head_dim != 128 && head_dim != 256)
        return stof__why(why, n,
                       "head_dim %d: the block kernel supports 32, 64, 128 "
                       "and 256",
                       head_dim);
    if (c->block_m != 64 && c->block_m != 128)
        return stof__why(why, n, "block_m %d: must be 64 or 128", c->block_m);
    if (c->block_n != 32 && c->block_n != 64 && c->block_n != 128)
        return stof__why(why, n, "block_n %d: must be 32, 64 or 128",
                       c->block_n);
    if (c->warps != 4 && c->warps != 8)
        return stof__why(why, n, "warps %d: must be 4 or 8", c->warps);
    if (c->block_m % (16 * c->warps) != 0)
        return stof__why(why, n,
                       "block_m %d with %d warps: each warp must own a "
                       "multiple of 16 query rows",
                       c->block_m, c->warps);
    if (c->stages < 1 || c->stages > 3)
        return stof__why(why, n, "stages %d: must be 1..3", c->stages);
    if (!stof__attn_options_valid(c->gather, c->split, c->mods, why, n))
        return 0;
    const int acc = block_acc_regs(head_dim, c);
    if (acc > BLOCK_ACC_REGS_MAX)
        return stof__why(why, n,
                       "head_dim %d, block %dx%d, %d warps: %d accumulator "
                       "registers per thread (more than %d would spill)",
                       head_dim, c->block_m, c->block_n, c->warps, acc,
                       BLOCK_ACC_REGS_MAX);
    const size_t smem = stof__block_smem_bytes(head_dim, c);
    const size_t lim = dev && dev->ok && dev->max_smem_optin > 0
                           ? (size_t)dev->max_smem_optin
                           : (size_t)BLOCK_SMEM_MAX_ANY;
    if (smem > lim)
        return stof__why(why, n,
                       "head_dim %d, block %dx%d, %d stages: %zu bytes of "
                       "shared memory, more than the %zu the %s allows",
                       head_dim, c->block_m, c->block_n, c->stages, smem, lim,
                       dev && dev->ok ? "device" : "largest supported GPU");
    return 1;
}

/* ------------------------------------------------------------------------ */
/* Device copy of the tile BSR                                               */
/* ------------------------------------------------------------------------ */

static size_t align256(size_t x)
{
    return (x + 255u) & ~(size_t)255u;
}

void stof__block_format_free(stof_context *ctx, stof_block_format *bf)
{
    if (!bf)
        return;
    if (bf->mem && ctx && stof__ctx_push(ctx) == STOF_OK) {
        ctx->api->cuMemFree(bf->mem);
        stof__ctx_pop(ctx);
    }
    memset(bf, 0, sizeof(*bf));
}

/* Copy the staged host image h (n bytes; freed here, whatever happens) to
 * a new device allocation *mem. */
static stof_status upload_staged(stof_context *ctx, uint8_t *h, size_t n,
                                 CUdeviceptr *mem)
{
    *mem = 0;
    stof_status st = (stof_status)stof__ctx_push(ctx);
    if (st != STOF_OK) {
        free(h);
        return st;
    }
    const stof_api *api = ctx->api;
    CUdeviceptr m = 0;
    STOF_CU_GOTO(ctx, st, done, api->cuMemAlloc(&m, n));
    STOF_CU_GOTO(ctx, st, done, api->cuMemcpyHtoD(m, h, n));
    *mem = m;
    m = 0;
done:
    if (m)
        api->cuMemFree(m);
    stof__ctx_pop(ctx);
    free(h);
    return st;
}

stof_status stof__block_format_upload(stof_context *ctx, const stof_format *f,
                                      stof_block_format *out)
{
    if (!ctx)
        return STOF_ERR_INVALID_ARGUMENT;
    STOF_CHECK_ARG(ctx, out, "out (the block format) is NULL");
    memset(out, 0, sizeof(*out));
    STOF_CHECK_ARG(ctx, f, "format is NULL");
    STOF_CHECK_ARG(ctx, f->row_ptr && f->n_row_blocks >= 1,
                   "format has no tile BSR (row_ptr NULL or no row block)");
    const int64_t n_tiles = f->row_ptr[f->n_row_blocks];
    if (n_tiles < 0 || n_tiles > INT32_MAX || f->n_partial < 0 ||
        f->n_partial > INT32_MAX)
        return stof__fail(ctx, STOF_ERR_UNSUPPORTED,
                          "block format: %lld tiles (%lld partial) do not "
                          "fit the kernel's 32-bit indices",
                          (long long)n_tiles, (long long)f->n_partial);
    const int wpr = f->bitmap_words_per_row;
    const size_t bitmap_words =
        (size_t)f->n_partial * (size_t)f->block_m * (size_t)wpr;
    if (f->n_partial > 0 &&
        bitmap_words / (size_t)f->n_partial !=
            (size_t)f->block_m * (size_t)wpr)
        return stof__fail(ctx, STOF_ERR_UNSUPPORTED,
                          "block format: bitmap size overflows");

    const size_t nrp = (size_t)f->n_row_blocks + 1u;
    const size_t nt = (size_t)n_tiles;
    const size_t off_row = 0;
    const size_t off_col = off_row + align256(nrp * 4u);
    const size_t off_kind = off_col + align256(nt * 4u);
    const size_t off_bidx = off_kind + align256(nt);
    const size_t off_bits = off_bidx + align256(nt * 4u);
    const size_t total = off_bits + align256(bitmap_words * 4u);
    /* Every array gets at least 256 bytes: an empty one still has a valid,
     * distinct pointer. */
    const size_t total_alloc = total + 256u;

    uint8_t *h = calloc(1, total_alloc);
    if (!h)
        return stof__fail(ctx, STOF_ERR_OUT_OF_MEMORY,
                          "out of memory staging a %zu-byte block format",
                          total_alloc);
    int32_t *rp = (int32_t *)(void *)(h + off_row);
    for (size_t i = 0; i < nrp; i++)
        rp[i] = (int32_t)f->row_ptr[i];
    if (nt) {
        memcpy(h + off_col, f->col_idx, nt * 4u);
        memcpy(h + off_kind, f->kind, nt);
        memcpy(h + off_bidx, f->bitmap_idx, nt * 4u);
    }
    if (bitmap_words)
        memcpy(h + off_bits, f->bitmaps, bitmap_words * 4u);

    CUdeviceptr mem = 0;
    stof_status st = upload_staged(ctx, h, total_alloc, &mem);
    if (st != STOF_OK)
        return st;

    out->mem = mem;
    out->bytes = total_alloc;
    out->row_ptr = mem + off_row;
    out->col_idx = mem + off_col;
    out->kind = mem + off_kind;
    out->bitmap_idx = mem + off_bidx;
    out->bitmaps = mem + off_bits;
    out->seq_q = f->seq_q;
    out->seq_k = f->seq_k;
    out->block_m = f->block_m;
    out->block_n = f->block_n;
    out->n_row_blocks = f->n_row_blocks;
    out->n_col_blocks = f->n_col_blocks;
    out->bitmap_words_per_row = wpr;
    out->n_tiles = n_tiles;
    out->n_partial = f->n_partial;
    return stof__ok(ctx);
}

/* ------------------------------------------------------------------------ */
/* Device copy of the row-wise lists, repacked per compacted tile            */
/* ------------------------------------------------------------------------ */

/* Bits pos .. pos+width-1 (width <= 32) of a row-wise bitmap row of `w`
 * words, in the low bits; bits past the row read as 0. */
static uint32_t rw_field(const uint32_t *row, int64_t w, int64_t pos,
                         int width)
{
    const int64_t wi = pos >> 5;
    const int sh = (int)(pos & 31);
    uint64_t x = wi < w ? row[wi] : 0u;
    if (sh && wi + 1 < w)
        x |= (uint64_t)row[wi + 1] << 32;
    x >>= sh;
    return width >= 32 ? (uint32_t)x : (uint32_t)x & ((1u << width) - 1u);
}

/* Where rw_pack writes (NULL: it only counts). The arrays are sized by a
 * counting pass: tile_ptr n_row_blocks + 1, kind and bitmap_idx n_tiles,
 * bitmaps n_partial * block_m * words_per_row words, zeroed. */
typedef struct rw_pack_out {
    int32_t *tile_ptr;
    uint8_t *kind;
    int32_t *bitmap_idx;
    uint32_t *bitmaps;
} rw_pack_out;

/* Cut every row block's key list into tiles of block_n entries, classify
 * each (full: every row of the block inside seq_q allows every listed key
 * of the tile) and, with `o`, write the tile arrays and the partial tiles'
 * bitmaps. */
static void rw_pack(const stof_format *f, const rw_pack_out *o,
                    int64_t *n_tiles, int64_t *n_partial, int *max_tiles)
{
    const int bm = f->block_m, bn = f->block_n;
    const int wpr = (bn + 31) / 32;
    const int width = bn < 32 ? bn : 32; /* bits of a tile's bitmap word */
    int64_t e = 0, part = 0;
    int most = 0;
    for (int i = 0; i < f->n_row_blocks; i++) {
        const int rows = f->seq_q - i * bm < bm ? f->seq_q - i * bm : bm;
        const int64_t nk = f->rw_ptr[i + 1] - f->rw_ptr[i];
        const int64_t w = f->rw_words[i];
        const uint32_t *base = f->rw_bitmaps + f->rw_bitmap_off[i];
        const int64_t nt = (nk + bn - 1) / bn;
        if (o)
            o->tile_ptr[i] = (int32_t)e;
        if (nt > most)
            most = (int)nt;
        for (int64_t t = 0; t < nt; t++, e++) {
            const int64_t cnt = nk - t * bn < bn ? nk - t * bn : bn;
            int full = 1;
            for (int r = 0; r < rows && full; r++) {
                const uint32_t *row = base + (int64_t)r * w;
                for (int j = 0; j < wpr; j++) {
                    const int64_t vb = cnt - 32 * j; /* valid bits */
                    const uint32_t need =
                        vb >= width ? (width == 32 ? ~0u : (1u << width) - 1u)
                        : vb > 0    ? (1u << vb) - 1u
                                    : 0u;
                    if ((rw_field(row, w, t * bn + 32 * j, width) & need) !=
                        need) {
                        full = 0;
                        break;
                    }
                }
            }
            if (o) {
                o->kind[e] = full ? STOF_TILE_FULL : STOF_TILE_PARTIAL;
                o->bitmap_idx[e] = full ? -1 : (int32_t)part;
            }
            if (!full && o) {
                uint32_t *dst = o->bitmaps + part * bm * wpr;
                for (int r = 0; r < rows; r++) {
                    const uint32_t *row = base + (int64_t)r * w;
                    for (int j = 0; j < wpr; j++) {
                        const int64_t vb = cnt - 32 * j;
                        const uint32_t keep =
                            vb >= 32 ? ~0u : vb > 0 ? (1u << vb) - 1u : 0u;
                        dst[r * wpr + j] =
                            rw_field(row, w, t * bn + 32 * j, width) & keep;
                    }
                }
            }
            part += !full;
        }
    }
    if (o)
        o->tile_ptr[f->n_row_blocks] = (int32_t)e;
    *n_tiles = e;
    *n_partial = part;
    *max_tiles = most;
}

static int has_rowwise(const stof_format *f)
{
    return f && f->n_row_blocks >= 1 && f->block_m >= 1 && f->block_n >= 1 &&
           f->rw_ptr && f->rw_keys && f->rw_words && f->rw_bitmap_off &&
           f->rw_bitmaps;
}

stof_status stof__rowwise_stats(const stof_format *f, int64_t *n_keys,
                                int64_t *n_tiles, int64_t *n_partial,
                                int *max_tiles)
{
    if (!has_rowwise(f))
        return STOF_ERR_INVALID_ARGUMENT;
    int64_t nt, np;
    int most;
    rw_pack(f, NULL, &nt, &np, &most);
    if (n_keys)
        *n_keys = f->rw_ptr[f->n_row_blocks];
    if (n_tiles)
        *n_tiles = nt;
    if (n_partial)
        *n_partial = np;
    if (max_tiles)
        *max_tiles = most;
    return STOF_OK;
}

void stof__rowwise_format_free(stof_context *ctx, stof_rowwise_format *rf)
{
    if (!rf)
        return;
    if (rf->mem && ctx && stof__ctx_push(ctx) == STOF_OK) {
        ctx->api->cuMemFree(rf->mem);
        stof__ctx_pop(ctx);
    }
    memset(rf, 0, sizeof(*rf));
}

size_t stof__rowwise_layout(int n_row_blocks, int64_t n_keys, int64_t n_tiles,
                            int64_t bitmaps, int block_m, int bwpr,
                            stof_rowwise_layout *l)
{
    memset(l, 0, sizeof(*l));
    const size_t tile_bytes = (size_t)block_m * (size_t)bwpr * 4u;
    if (n_row_blocks < 0 || n_keys < 0 || n_tiles < 0 || bitmaps < 0 ||
        !tile_bytes || (uint64_t)bitmaps > SIZE_MAX / 2u / tile_bytes ||
        (uint64_t)n_keys > SIZE_MAX / 16u || (uint64_t)n_tiles > SIZE_MAX / 16u)
        return 0;
    const size_t nrp = (size_t)n_row_blocks + 1u, nt = (size_t)n_tiles;
    l->key_ptr = 0;
    l->keys = l->key_ptr + align256(nrp * 4u);
    l->tile_ptr = l->keys + align256((size_t)n_keys * 4u);
    l->kind = l->tile_ptr + align256(nrp * 4u);
    l->bitmap_idx = l->kind + align256(nt);
    l->bitmaps = l->bitmap_idx + align256(nt * 4u);
    const size_t end = l->bitmaps + align256((size_t)bitmaps * tile_bytes);
    if (end < l->bitmaps || end > SIZE_MAX - 256u) /* wrapped */
        return 0;
    l->total = end + 256u;
    return l->total;
}

void stof__rowwise_format_at(stof_rowwise_format *rf, CUdeviceptr mem,
                             const stof_rowwise_layout *l)
{
    rf->mem = mem;
    rf->bytes = l->total;
    rf->key_ptr = mem + l->key_ptr;
    rf->keys = mem + l->keys;
    rf->tile_ptr = mem + l->tile_ptr;
    rf->kind = mem + l->kind;
    rf->bitmap_idx = mem + l->bitmap_idx;
    rf->bitmaps = mem + l->bitmaps;
}

stof_status stof__rowwise_format_upload(stof_context *ctx,
                                        const stof_format *f,
                                        stof_rowwise_format *out)
{
    if (!ctx)
        return STOF_ERR_INVALID_ARGUMENT;
    STOF_CHECK_ARG(ctx, out, "out (the row-wise format) is NULL");
    memset(out, 0, sizeof(*out));
    STOF_CHECK_ARG(ctx, f, "format is NULL");
    STOF_CHECK_ARG(ctx, has_rowwise(f),
                   "format has no row-wise part (rw_* NULL or no row "
                   "block)");
    const int64_t n_keys = f->rw_ptr[f->n_row_blocks];
    int64_t n_tiles, n_partial;
    int most;
    rw_pack(f, NULL, &n_tiles, &n_partial, &most);
    const int wpr = (f->block_n + 31) / 32;
    const size_t tile_words = (size_t)f->block_m * (size_t)wpr;
    if (n_keys < 0 || n_keys > INT32_MAX || n_tiles > INT32_MAX ||
        (uint64_t)n_partial > SIZE_MAX / 4u / tile_words)
        return stof__fail(ctx, STOF_ERR_UNSUPPORTED,
                          "row-wise format: %lld keys in %lld tiles (%lld "
                          "partial) do not fit the kernel's 32-bit indices",
                          (long long)n_keys, (long long)n_tiles,
                          (long long)n_partial);
    const size_t nrp = (size_t)f->n_row_blocks + 1u;
    stof_rowwise_layout l;
    const size_t total_alloc = stof__rowwise_layout(
        f->n_row_blocks, n_keys, n_tiles, n_partial, f->block_m, wpr, &l);
    if (!total_alloc)
        return stof__fail(ctx, STOF_ERR_UNSUPPORTED,
                          "row-wise format: size overflows");
    const size_t off_kptr = l.key_ptr, off_keys = l.keys,
                 off_tptr = l.tile_ptr, off_kind = l.kind,
                 off_bidx = l.bitmap_idx, off_bits = l.bitmaps;

    uint8_t *h = calloc(1, total_alloc);
    if (!h)
        return stof__fail(ctx, STOF_ERR_OUT_OF_MEMORY,
                          "out of memory staging a %zu-byte row-wise format",
                          total_alloc);
    int32_t *kp = (int32_t *)(void *)(h + off_kptr);
    for (size_t i = 0; i < nrp; i++)
        kp[i] = (int32_t)f->rw_ptr[i];
    if (n_keys)
        memcpy(h + off_keys, f->rw_keys, (size_t)n_keys * 4u);
    const rw_pack_out o = {(int32_t *)(void *)(h + off_tptr), h + off_kind,
                           (int32_t *)(void *)(h + off_bidx),
                           (uint32_t *)(void *)(h + off_bits)};
    rw_pack(f, &o, &n_tiles, &n_partial, &most);

    CUdeviceptr mem = 0;
    stof_status st = upload_staged(ctx, h, total_alloc, &mem);
    if (st != STOF_OK)
        return st;

    stof__rowwise_format_at(out, mem, &l);
    out->seq_q = f->seq_q;
    out->seq_k = f->seq_k;
    out->block_m = f->block_m;
    out->block_n = f->block_n;
    out->n_row_blocks = f->n_row_blocks;
    out->bitmap_words_per_row = wpr;
    out->max_tiles = most;
    out->n_keys = n_keys;
    out->n_tiles = n_tiles;
    out->n_partial = n_partial;
    return stof__ok(ctx);
}

/* ------------------------------------------------------------------------ */
/* Compile, load, launch                                                     */
/* ------------------------------------------------------------------------ */

stof_status stof__block_compile(stof_context *ctx, int head_dim,
                                stof_dtype dt, const stof_block_cfg *c,
                                const char *arch_or_NULL, void **cubin,
                                size_t *size)
{
    if (!ctx)
        return STOF_ERR_INVALID_ARGUMENT;
    *cubin = NULL;
    *size = 0;
    STOF_CHECK_ARG(ctx, dt == STOF_DTYPE_FP16 || dt == STOF_DTYPE_BF16,
                   "dtype %d is not a stof_dtype", (int)dt);
    char why[256];
    if (!stof__block_cfg_valid(ctx->device.ok ? &ctx->device : NULL,
                               head_dim, c, why, sizeof(why)))
        return stof__fail(ctx, STOF_ERR_UNSUPPORTED,
                          "block kernel configuration not supported: %s",
                          why);
    char d_hd[32], d_dt[32], d_bm[32], d_bn[32], d_w[32], d_s[32];
    snprintf(d_hd, sizeof(d_hd), "HEAD_DIM=%d", head_dim);
    snprintf(d_dt, sizeof(d_dt), "DTYPE=%d", (int)dt);
    snprintf(d_bm, sizeof(d_bm), "BLOCK_M=%d", c->block_m);
    snprintf(d_bn, sizeof(d_bn), "BLOCK_N=%d", c->block_n);
    snprintf(d_w, sizeof(d_w), "WARPS=%d", c->warps);
    snprintf(d_s, sizeof(d_s), "STAGES=%d", c->stages);
    /* GATHER, SPLIT, SOFTCAP, ALIBI, BIAS are defined only when set, so
     * block-wise kernels compile from exactly the defines they always had. */
    const char *defs[12] = {d_hd, d_dt, d_bm, d_bn, d_w, d_s};
    const int n_defs =
        stof__attn_option_defines(c->gather, c->split, c->mods, defs, 6);
    return (stof_status)stof__jit_compile(ctx, "attn_block.cu", defs, n_defs,
                                          arch_or_NULL, cubin, size);
}

stof_status stof__block_load_cubin(stof_context *ctx, int head_dim,
                                   const stof_block_cfg *c, const void *cubin,
                                   CUmodule *mod, CUfunction *fn)
{
    return stof__block_load_cubin_shared(ctx, head_dim, c, cubin, 0, 0, mod,
                                          fn);
}

stof_status stof__block_load_cubin_shared(stof_context *ctx, int head_dim,
                                          const stof_block_cfg *c,
                                          const void *cubin, size_t size,
                                          uint64_t hash, CUmodule *mod,
                                          CUfunction *fn)
{
    /* (size 0: loaded apart, not through the cache) */
    return (stof_status)stof__module_load_shared_hashed(
        ctx, cubin, size, hash, "stof_attn_block",
        stof__block_smem_bytes(head_dim, c), mod, fn);
}

stof_status stof__block_load(stof_context *ctx, int head_dim, stof_dtype dt,
                             const stof_block_cfg *c, const char *arch_or_NULL,
                             CUmodule *mod, CUfunction *fn)
{
    if (!ctx)
        return STOF_ERR_INVALID_ARGUMENT;
    STOF_CHECK_ARG(ctx, mod && fn, "mod, fn: NULL output pointer");
    *mod = NULL;
    *fn = NULL;
    if (!ctx->device.ok)
        return stof__fail(ctx, STOF_ERR_NO_DEVICE,
                          "loading the block kernel needs a GPU: no usable "
                          "CUDA device in this context");
    void *cubin = NULL;
    size_t size = 0;
    stof_status st =
        stof__block_compile(ctx, head_dim, dt, c, arch_or_NULL, &cubin, &size);
    if (st == STOF_OK)
        st = stof__block_load_cubin(ctx, head_dim, c, cubin, mod, fn);
    free(cubin);
    return st;
}

/* The parameters every launch shares: tensors, strides, sizes, scale,
 * what x asks besides O. */
static void fill_params(stof_attn_block_params *p, int head_dim,
                        const stof_attention_desc *d, float scale,
                        CUdeviceptr q, CUdeviceptr k, CUdeviceptr v,
                        CUdeviceptr o, const stof_attn_ext *x)
{
    memset(p, 0, sizeof(*p));
    if (x) {
        p->lse = x->lse;
        p->o_part = x->o_part;
        p->lse_part = x->lse_part;
        p->n_split = x->n_split;
        p->alibi = x->alibi;
        p->bias = x->bias;
        p->k_lim = x->k_lim;
    }
    memcpy(p->bias_stride, d->bias_stride, sizeof(p->bias_stride));
    p->q = q;
    p->k = k;
    p->v = v;
    p->o = o;
    memcpy(p->q_stride, d->q_stride, sizeof(p->q_stride));
    memcpy(p->k_stride, d->k_stride, sizeof(p->k_stride));
    memcpy(p->v_stride, d->v_stride, sizeof(p->v_stride));
    memcpy(p->o_stride, d->o_stride, sizeof(p->o_stride));
    p->batch = d->batch;
    p->heads = d->heads;
    p->seq_q = d->seq_q;
    p->seq_k = d->seq_k;
    if (scale == 0.0f)
        scale = 1.0f / sqrtf((float)head_dim);
    p->scale_log2 = (float)((double)scale * 1.4426950408889634);
    stof__softcap_params(d->softcap, scale, &p->cap_in, &p->cap_out);
    p->rp_stride = 0;
    p->kv_group = stof__kv_group(d);
}

stof_status stof__block_launch(CUfunction fn, const stof_block_cfg *c,
                               int head_dim, const stof_attention_desc *d,
                               float scale, const stof_block_format *bf,
                               CUdeviceptr q, CUdeviceptr k, CUdeviceptr v,
                               CUdeviceptr o, CUstream s, const stof_api *api)
{
    return stof__block_launch_ex(fn, c, head_dim, d, scale, bf, q, k, v, o,
                                 NULL, s, api);
}

stof_status stof__block_launch_ex(CUfunction fn, const stof_block_cfg *c,
                                  int head_dim, const stof_attention_desc *d,
                                  float scale, const stof_block_format *bf,
                                  CUdeviceptr q, CUdeviceptr k, CUdeviceptr v,
                                  CUdeviceptr o, const stof_attn_ext *x,
                                  CUstream s, const stof_api *api)
{
    if (!fn || !c || !d || !bf || !api || !api->cuLaunchKernel || c->gather)
        return STOF_ERR_INVALID_ARGUMENT;
    if (d->head_dim != head_dim || bf->block_m != c->block_m ||
        bf->block_n != c->block_n || bf->seq_q != d->seq_q ||
        bf->seq_k != d->seq_k || bf->bitmap_words_per_row != c->block_n / 32 ||
        !bf->mem || d->batch < 1 || d->heads < 1 || bf->n_row_blocks < 1 ||
        (int64_t)bf->n_row_blocks * d->batch * d->heads > INT32_MAX)
        return STOF_ERR_INVALID_ARGUMENT;
    if (!q || !k || !v || !o || (q | k | v | o) % 16u)
        return STOF_ERR_INVALID_ARGUMENT;
    const unsigned gz = stof__split_grid_z(c->split, x);
    if (!gz || (x && x->lse % 4u) || !stof__mods_match(c->mods, d, x))
        return STOF_ERR_INVALID_ARGUMENT;

    stof_attn_block_params p;
    fill_params(&p, head_dim, d, scale, q, k, v, o, x);
    p.row_ptr = bf->row_ptr;
    p.col_idx = bf->col_idx;
    p.kind = bf->kind;
    p.bitmap_idx = bf->bitmap_idx;
    p.bitmaps = bf->bitmaps;
    p.n_row_blocks = bf->n_row_blocks;
    p.bitmap_words_per_row = bf->bitmap_words_per_row;
    p.rp_stride = bf->rp_stride;

    const size_t smem = stof__block_smem_bytes(head_dim, c);
    void *args[] = {&p};
    const stof_launch_opts pdl = {.pdl = STOF_PDL_IF_SM90};
    /* (row blocks times batch * heads in x: stof_cta_rb_bh) */
    CUresult r = stof__launch(
        api, fn, (unsigned)(bf->n_row_blocks * d->batch * d->heads), 1, gz,
        (unsigned)(32 * c->warps), (unsigned)smem, s, args, &pdl);
    return r == CUDA_SUCCESS ? STOF_OK : STOF_ERR_CUDA;
}

stof_status stof__rowwise_launch(CUfunction fn, const stof_block_cfg *c,
                                 int head_dim, const stof_attention_desc *d,
                                 float scale, const stof_rowwise_format *rf,
                                 CUdeviceptr q, CUdeviceptr k, CUdeviceptr v,
                                 CUdeviceptr o, CUstream s,
                                 const stof_api *api)
{
    return stof__rowwise_launch_qperm(fn, c, head_dim, d, scale, rf, 0, q, k,
                                      v, o, s, api);
}

stof_status stof__rowwise_launch_qperm(CUfunction fn, const stof_block_cfg *c,
                                       int head_dim,
                                       const stof_attention_desc *d,
                                       float scale,
                                       const stof_rowwise_format *rf,
                                       CUdeviceptr q_rows, CUdeviceptr q,
                                       CUdeviceptr k, CUdeviceptr v,
                                       CUdeviceptr o, CUstream s,
                                       const stof_api *api)
{
    return stof__rowwise_launch_qperm_ex(fn, c, head_dim, d, scale, rf,
                                         q_rows, q, k, v, o, NULL, s, api);
}

stof_status stof__rowwise_launch_qperm_ex(
    CUfunction fn, const stof_block_cfg *c, int head_dim,
    const stof_attention_desc *d, float scale, const stof_rowwise_format *rf,
    CUdeviceptr q_rows, CUdeviceptr q, CUdeviceptr k, CUdeviceptr v,
    CUdeviceptr o, const stof_attn_ext *x, CUstream s, const stof_api *api)
{
    if (!fn || !c || !d || !rf || !api || !api->cuLaunchKernel ||
        c->gather != 1)
        return STOF_ERR_INVALID_ARGUMENT;
    if (d->head_dim != head_dim || rf->block_m != c->block_m ||
        rf->block_n != c->block_n || rf->seq_q != d->seq_q ||
        rf->seq_k != d->seq_k || rf->bitmap_words_per_row != c->block_n / 32 ||
        !rf->mem || d->batch < 1 || d->heads < 1 || rf->n_row_blocks < 1 ||
        (int64_t)rf->n_row_blocks * d->batch * d->heads > INT32_MAX)
        return STOF_ERR_INVALID_ARGUMENT;
    if (!q || !k || !v || !o || (q | k | v | o) % 16u || q_rows % 4u)
        return STOF_ERR_INVALID_ARGUMENT;
    const unsigned gz = stof__split_grid_z(c->split, x);
    if (!gz || (x && x->lse % 4u) || !stof__mods_match(c->mods, d, x))
        return STOF_ERR_INVALID_ARGUMENT;
    /* The kernel keeps key row offsets in 16-byte units in 32 bits. */
    for (int t = 0; t < 2; t++) {
        const int64_t st = t ? d->v_stride[2] : d->k_stride[2];
        if (st < 0 || st % 8 || (st / 8) * (int64_t)(d->seq_k - 1) > UINT32_MAX)
            return STOF_ERR_INVALID_ARGUMENT;
    }

    stof_attn_gather_params p;
    fill_params(&p.b, head_dim, d, scale, q, k, v, o, x);
    p.b.row_ptr = rf->tile_ptr;
    p.b.col_idx = 0; /* unused in gather mode */
    p.b.kind = rf->kind;
    p.b.bitmap_idx = rf->bitmap_idx;
    p.b.bitmaps = rf->bitmaps;
    p.b.n_row_blocks = rf->n_row_blocks;
    p.b.bitmap_words_per_row = rf->bitmap_words_per_row;
    p.key_ptr = rf->key_ptr;
    p.keys = rf->keys;
    p.q_rows = q_rows;

    const size_t smem = stof__block_smem_bytes(head_dim, c);
    void *args[] = {&p};
    const stof_launch_opts pdl = {.pdl = STOF_PDL_IF_SM90};
    CUresult r = stof__launch(
        api, fn, (unsigned)(rf->n_row_blocks * d->batch * d->heads), 1, gz,
        (unsigned)(32 * c->warps), (unsigned)smem, s, args, &pdl);
    return r == CUDA_SUCCESS ? STOF_OK : STOF_ERR_CUDA;
}
