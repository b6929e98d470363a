/*
 * format.c - the sparse formats the kernels consume, built from a bit-packed
 * mask for a BM x BN tiling (layouts documented in stof.h):
 *
 * - block-wise: a BSR of tiles, each full or partial (empty tiles are not
 *   listed), with a BM x BN bitmap for every partial tile;
 * - row-wise: for every query row block, the ascending list of keys any of
 *   its rows allows, and a BM-row bitmap over that list.
 *
 * Everything works on whole 64-bit mask words: tile populations come from
 * popcounts of word fields (zero words are skipped), the key list is the OR
 * of the block's rows, and row bitmaps are the rows compressed by that OR
 * (a bit-extract done run by run). Full and empty tiles never look at single
 * elements, so structured masks build in a few milliseconds at 8192 x 8192.
 */
#include "internal.h"

#include <stdlib.h>
#include <string.h>

/* Population count. Without a hardware popcount in the target (baseline
 * x86-64), __builtin_popcountll becomes a slow library call, so use the
 * classic SWAR sum instead. */
static inline int popcount64(uint64_t x)
{
#if defined(__POPCNT__) || defined(__ARM_NEON) || defined(__aarch64__)
    return __builtin_popcountll(x);
#else
    x = x - ((x >> 1) & 0x5555555555555555ull);
    x = (x & 0x3333333333333333ull) + ((x >> 2) & 0x3333333333333333ull);
    x = (x + (x >> 4)) & 0x0f0f0f0f0f0f0f0full;
    return (int)((x * 0x0101010101010101ull) >> 56);
#endif
}

/* A growable array: *p holds *cap elements of `elem` bytes. Makes room for
 * `need` elements, zero-filling the new part. 0 on success. */
static int grow(void **p, size_t *cap, size_t need, size_t elem)
{
    if (need <= *cap)
        return 0;
    size_t nc = *cap ? *cap : 64;
    while (nc < need) {
        if (nc > SIZE_MAX / 2)
            return -1;
        nc *= 2;
    }
    if (nc > SIZE_MAX / elem)
        return -1;
    void *q = realloc(*p, nc * elem);
    if (!q)
        return -1;
    memset((char *)q + *cap * elem, 0, (nc - *cap) * elem);
    *p = q;
    *cap = nc;
    return 0;
}

/* Gather the bits of x selected by m into the low popcount(m) bits (a
 * software PEXT that moves one run of consecutive mask bits at a time:
 * masks made of intervals cost one or two steps per word). */
static uint64_t extract_bits(uint64_t x, uint64_t m)
{
    uint64_t r = 0;
    int o = 0;
    while (m) {
        int s = __builtin_ctzll(m);
        uint64_t t = m >> s;
        int l = (~t == 0) ? 64 - s : __builtin_ctzll(~t);
        uint64_t run = l == 64 ? ~0ull : ((1ull << l) - 1);
        r |= ((x >> s) & run) << o;
        o += l;
        m = (s + l >= 64) ? 0 : (m & (~0ull << (s + l)));
    }
    return r;
}

/* Appends bit fields to an array of 32-bit words (bit i of the stream is
 * word i/32, bit i%32). */
typedef struct bit_writer {
    uint32_t *dst;
    uint64_t acc;
    int n;
} bit_writer;

static void bw_put32(bit_writer *b, uint32_t bits, int n)
{
    b->acc |= (uint64_t)bits << b->n;
    b->n += n;
    if (b->n >= 32) {
        *b->dst++ = (uint32_t)b->acc;
        b->acc >>= 32;
        b->n -= 32;
    }
}

/* bits must have no bit set at or above n (n <= 64). */
static void bw_put(bit_writer *b, uint64_t bits, int n)
{
    if (n > 32) {
        bw_put32(b, (uint32_t)bits, 32);
        bits >>= 32;
        n -= 32;
    }
    if (n > 0)
        bw_put32(b, (uint32_t)bits, n);
}

static void bw_flush(bit_writer *b)
{
    if (b->n > 0)
        *b->dst++ = (uint32_t)b->acc;
    b->acc = 0;
    b->n = 0;
}

static int is_block_size(int b)
{
    return b >= 16 && b <= 256 && (b & (b - 1)) == 0;
}

void stof_format_free(stof_format **fmt)
{
    if (!fmt || !*fmt)
        return;
    stof_format *f = *fmt;
    free(f->row_ptr);
    free(f->col_idx);
    free(f->kind);
    free(f->bitmap_idx);
    free(f->bitmaps);
    free(f->rw_ptr);
    free(f->rw_keys);
    free(f->rw_words);
    free(f->rw_bitmap_off);
    free(f->rw_bitmaps);
    free(f);
    *fmt = NULL;
}

/* The builder's growable arrays and per-row-block scratch. */
typedef struct builder {
    size_t cap_tiles, cap_bitmaps, cap_keys, cap_rw;
    uint32_t *cnt;   /* n_col_blocks: allowed elements per tile */
    uint64_t *uni;   /* words_per_row: OR of the block's rows */
    int32_t *nzw;    /* words_per_row: indices of nonzero words of uni */
} builder;

static stof_status build(stof_context *ctx, const stof_mask *m, stof_format *f,
                         builder *b)
{
    const int bm = f->block_m, bn = f->block_n;
    const int wpr = m->words_per_row;
    const int n_rb = f->n_row_blocks, n_cb = f->n_col_blocks;
    const int bwpr = f->bitmap_words_per_row;
    /* Mask words per tile (bn >= 64) or tiles per mask word (bn < 64). */
    const int tile_shift = bn >= 64 ? __builtin_ctz((unsigned)bn / 64) : 0;

    int64_t n_tiles = 0, n_partial = 0, n_full = 0;
    int64_t n_keys = 0, rw_off = 0;
    double partial_in = 0.0, partial_area = 0.0, rw_area = 0.0;

    f->row_ptr[0] = 0;
    f->rw_ptr[0] = 0;
    f->rw_bitmap_off[0] = 0;
    for (int i = 0; i < n_rb; i++) {
        const int r0 = i * bm;
        const int rows = m->seq_q - r0 < bm ? m->seq_q - r0 : bm;
        const uint64_t *blk = m->bits + (size_t)r0 * (size_t)wpr;

        /* Pass 1: tile populations and the union of the rows. */
        memset(b->cnt, 0, (size_t)n_cb * sizeof(uint32_t));
        memset(b->uni, 0, (size_t)wpr * sizeof(uint64_t));
        for (int r = 0; r < rows; r++) {
            const uint64_t *row = blk + (size_t)r * (size_t)wpr;
            for (int w = 0; w < wpr; w++) {
                uint64_t x = row[w];
                if (!x)
                    continue;
                b->uni[w] |= x;
                if (x == ~0ull) {
                    if (bn >= 64) {
                        b->cnt[w >> tile_shift] += 64;
                    } else {
                        for (int t = 0; t < 64 / bn; t++)
                            b->cnt[(64 / bn) * w + t] += (uint32_t)bn;
                    }
                } else if (bn >= 64) {
                    b->cnt[w >> tile_shift] += (uint32_t)popcount64(x);
                } else if (bn == 32) {
                    b->cnt[2 * w] +=
                        (uint32_t)popcount64(x & 0xffffffffull);
                    b->cnt[2 * w + 1] +=
                        (uint32_t)popcount64(x >> 32);
                } else {
                    for (int t = 0; t < 4; t++)
                        b->cnt[4 * w + t] += (uint32_t)popcount64(
                            (x >> (16 * t)) & 0xffffull);
                }
            }
        }

        /* Block-wise entries of this row block. */
        for (int j = 0; j < n_cb; j++) {
            if (!b->cnt[j])
                continue;
            const int c0 = j * bn;
            const int cols = m->seq_k - c0 < bn ? m->seq_k - c0 : bn;
            const uint32_t area = (uint32_t)rows * (uint32_t)cols;
            /* The three per-tile arrays share one capacity. */
            const size_t old_cap = b->cap_tiles;
            if (grow((void **)&f->col_idx, &b->cap_tiles, (size_t)n_tiles + 1,
                     sizeof(int32_t)) != 0)
                goto oom;
            if (b->cap_tiles != old_cap) {
                uint8_t *nk = realloc(f->kind, b->cap_tiles);
                if (!nk)
                    goto oom;
                f->kind = nk;
                int32_t *nb =
                    realloc(f->bitmap_idx, b->cap_tiles * sizeof(int32_t));
                if (!nb)
                    goto oom;
                f->bitmap_idx = nb;
            }
            f->col_idx[n_tiles] = j;
            if (b->cnt[j] == area) {
                f->kind[n_tiles] = STOF_TILE_FULL;
                f->bitmap_idx[n_tiles] = -1;
                n_full++;
            } else {
                if (n_partial >= INT32_MAX)
                    return stof__fail(ctx, STOF_ERR_UNSUPPORTED,
                                      "stof_format_build: more than %d partial "
                                      "tiles",
                                      INT32_MAX);
                f->kind[n_tiles] = STOF_TILE_PARTIAL;
                f->bitmap_idx[n_tiles] = (int32_t)n_partial;
                size_t base = (size_t)n_partial * (size_t)bm * (size_t)bwpr;
                if (grow((void **)&f->bitmaps, &b->cap_bitmaps,
                         base + (size_t)bm * (size_t)bwpr,
                         sizeof(uint32_t)) != 0)
                    goto oom;
                uint32_t *bmp = f->bitmaps + base;
                for (int r = 0; r < rows; r++) {
                    const uint64_t *row = blk + (size_t)r * (size_t)wpr;
                    for (int t = 0; t < bwpr; t++) {
                        int k0 = c0 + 32 * t;
                        if (k0 >= m->seq_k)
                            break;
                        uint64_t x = row[k0 >> 6] >> (k0 & 63);
                        bmp[r * bwpr + t] =
                            bn == 16 ? (uint32_t)(x & 0xffffu) : (uint32_t)x;
                    }
                }
                n_partial++;
                partial_in += b->cnt[j];
                partial_area += area;
            }
            n_tiles++;
        }
        f->row_ptr[i + 1] = n_tiles;

        /* Row-wise: the keys are the set bits of the union. */
        int n_nzw = 0;
        int64_t nk = 0;
        for (int w = 0; w < wpr; w++) {
            if (b->uni[w]) {
                b->nzw[n_nzw++] = w;
                nk += popcount64(b->uni[w]);
            }
        }
        if (grow((void **)&f->rw_keys, &b->cap_keys, (size_t)(n_keys + nk),
                 sizeof(int32_t)) != 0)
            goto oom;
        int32_t *keys = f->rw_keys + n_keys;
        for (int z = 0; z < n_nzw; z++) {
            int w = b->nzw[z];
            for (uint64_t u = b->uni[w]; u; u &= u - 1)
                *keys++ = 64 * w + __builtin_ctzll(u);
        }
        n_keys += nk;
        f->rw_ptr[i + 1] = n_keys;
        const int64_t rww = (nk + 31) / 32;
        if (rww > INT32_MAX)
            return stof__fail(ctx, STOF_ERR_UNSUPPORTED,
                              "stof_format_build: row block %d lists too many "
                              "keys",
                              i);
        f->rw_words[i] = (int32_t)rww;
        if (grow((void **)&f->rw_bitmaps, &b->cap_rw,
                 (size_t)(rw_off + (int64_t)bm * rww), sizeof(uint32_t)) != 0)
            goto oom;
        for (int r = 0; r < rows && rww > 0; r++) {
            const uint64_t *row = blk + (size_t)r * (size_t)wpr;
            bit_writer bw = {f->rw_bitmaps + rw_off + (int64_t)r * rww, 0, 0};
            for (int z = 0; z < n_nzw; z++) {
                int w = b->nzw[z];
                uint64_t u = b->uni[w], x = row[w];
                int n = popcount64(u);
                uint64_t bits;
                if (u == ~0ull)
                    bits = x;
                else if (x == 0)
                    bits = 0;
                else if (x == u)
                    bits = (1ull << n) - 1; /* n < 64 here */
                else
                    bits = extract_bits(x, u);
                bw_put(&bw, bits, n);
            }
            bw_flush(&bw);
        }
        rw_off += (int64_t)bm * rww;
        f->rw_bitmap_off[i + 1] = rw_off;
        rw_area += (double)rows * (double)nk;
    }

    f->n_full = n_full;
    f->n_partial = n_partial;
    f->n_empty = (int64_t)n_rb * (int64_t)n_cb - n_full - n_partial;
    f->allowed = m->count;
    f->partial_fill = partial_area > 0.0 ? partial_in / partial_area : 0.0;
    f->rowwise_fill = rw_area > 0.0 ? (double)m->count / rw_area : 0.0;
    return STOF_OK;

oom:
    return stof__fail(ctx, STOF_ERR_OUT_OF_MEMORY,
                      "out of memory building the %dx%d formats of a %d x %d "
                      "mask",
                      bm, bn, m->seq_q, m->seq_k);
}

stof_status stof_format_build(stof_context *ctx, const stof_mask *m,
                              int block_m, int block_n, stof_format **fmt)
{
    STOF_CHECK_ARG(ctx, fmt != NULL, "stof_format_build: fmt is NULL");
    *fmt = NULL;
    STOF_CHECK_ARG(ctx, m != NULL, "stof_format_build: mask is NULL");
    STOF_CHECK_ARG(ctx, is_block_size(block_m),
                   "stof_format_build: block_m = %d, expected a power of two "
                   "from 16 to 256",
                   block_m);
    STOF_CHECK_ARG(ctx, is_block_size(block_n),
                   "stof_format_build: block_n = %d, expected a power of two "
                   "from 16 to 256",
                   block_n);

    stof_format *f = calloc(1, sizeof(*f));
    if (!f)
        return stof__fail(ctx, STOF_ERR_OUT_OF_MEMORY,
                          "out of memory allocating a format");
    f->seq_q = m->seq_q;
    f->seq_k = m->seq_k;
    f->block_m = block_m;
    f->block_n = block_n;
    f->n_row_blocks = (m->seq_q + block_m - 1) / block_m;
    f->n_col_blocks = (m->seq_k + block_n - 1) / block_n;
    f->bitmap_words_per_row = (block_n + 31) / 32;

    const size_t nrb = (size_t)f->n_row_blocks;
    builder b;
    memset(&b, 0, sizeof(b));
    f->row_ptr = malloc((nrb + 1) * sizeof(int64_t));
    f->rw_ptr = malloc((nrb + 1) * sizeof(int64_t));
    f->rw_words = malloc(nrb * sizeof(int32_t));
    f->rw_bitmap_off = malloc((nrb + 1) * sizeof(int64_t));
    b.cnt = malloc((size_t)f->n_col_blocks * sizeof(uint32_t));
    b.uni = malloc((size_t)m->words_per_row * sizeof(uint64_t));
    b.nzw = malloc((size_t)m->words_per_row * sizeof(int32_t));
    /* Start every growable array non-empty, so that no pointer of a valid
     * format is NULL even when the mask is empty. */
    stof_status st = STOF_OK;
    if (!f->row_ptr || !f->rw_ptr || !f->rw_words || !f->rw_bitmap_off ||
        !b.cnt || !b.uni || !b.nzw ||
        grow((void **)&f->col_idx, &b.cap_tiles, 1, sizeof(int32_t)) != 0 ||
        !(f->kind = calloc(b.cap_tiles, 1)) ||
        !(f->bitmap_idx = calloc(b.cap_tiles, sizeof(int32_t))) ||
        grow((void **)&f->bitmaps, &b.cap_bitmaps, 1, sizeof(uint32_t)) != 0 ||
        grow((void **)&f->rw_keys, &b.cap_keys, 1, sizeof(int32_t)) != 0 ||
        grow((void **)&f->rw_bitmaps, &b.cap_rw, 1, sizeof(uint32_t)) != 0)
        st = stof__fail(ctx, STOF_ERR_OUT_OF_MEMORY,
                        "out of memory allocating the formats of a %d x %d "
                        "mask",
                        m->seq_q, m->seq_k);
    if (st == STOF_OK)
        st = build(ctx, m, f, &b);
    free(b.cnt);
    free(b.uni);
    free(b.nzw);
    if (st != STOF_OK) {
        stof_format_free(&f);
        return st;
    }
    *fmt = f;
    return stof__ok(ctx);
}
