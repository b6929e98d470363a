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
#include "format.h"

#include <stdlib.h>
#include <string.h>
#if defined(__linux__)
#include <sys/mman.h>
#endif

/* The builder is dominated by popcounts. Baseline x86-64 has no popcount
 * instruction (__builtin_popcountll becomes a slow library call), so on
 * x86-64 ELF targets the builder is compiled twice and the loader picks the
 * popcnt version on CPUs that have it (all recent ones); elsewhere a SWAR
 * popcount (or the builtin, where the target has the instruction) is used. */
#if defined(__x86_64__) && defined(__ELF__) && defined(__GLIBC__) &&           \
    !defined(__POPCNT__) &&                                                    \
    ((defined(__clang__) && __clang_major__ >= 14) ||                          \
     (!defined(__clang__) && defined(__GNUC__) && __GNUC__ >= 7))
#define FORMAT_CLONES __attribute__((target_clones("popcnt", "default")))
#define FORMAT_INLINE inline __attribute__((always_inline))
#define POPCNT(x) __builtin_popcountll(x)
#else
#define FORMAT_CLONES
#define FORMAT_INLINE inline
#define POPCNT(x) popcount64(x)
static inline int popcount64(uint64_t x)
{
#if defined(__POPCNT__) || defined(__aarch64__)
    return __builtin_popcountll(x);
#else
    x = x - ((x >> 1) & 0x5555555555555555ull);
    x = (x & 0x3333333333333333ull) + ((x >> 2) & 0x3333333333333333ull);
    x = (x + (x >> 4)) & 0x0f0f0f0f0f0f0f0full;
    return (int)((x * 0x0101010101010101ull) >> 56);
#endif
}
#endif

/* Gather the bits of x selected by m into the low popcount(m) bits (a
 * software PEXT that moves one run of consecutive mask bits at a time:
 * masks made of intervals cost one or two steps per word). */
static FORMAT_INLINE uint64_t extract_bits(uint64_t x, uint64_t m)
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

static FORMAT_INLINE void bw_put32(bit_writer *b, uint32_t bits, int n)
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
static FORMAT_INLINE void bw_put(bit_writer *b, uint64_t bits, int n)
{
    if (n > 32) {
        bw_put32(b, (uint32_t)bits, 32);
        bits >>= 32;
        n -= 32;
    }
    if (n > 0)
        bw_put32(b, (uint32_t)bits, n);
}

static FORMAT_INLINE void bw_flush(bit_writer *b)
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

/* Per-row-block scratch of the builder. */
typedef struct builder {
    uint32_t *cnt;   /* n_cnt >= n_col_blocks: allowed elements per tile */
    size_t n_cnt;
    uint64_t *uni;   /* words_per_row: OR of the block's rows */
    int32_t *nzw;    /* words_per_row: indices of nonzero words of uni */
    uint8_t *nzp;    /* words_per_row: their popcounts */
    int32_t *all;    /* words_per_row: 0, 1, 2, ... */
    const int32_t *act; /* the words of the current block that may be
                           nonzero */
    int n_act;
    int block;       /* build the block-wise part */
    int rowwise;     /* build the row-wise part */
} builder;

/* Scan the rows of a row block (blk: rows x wpr words; act: the words that
 * may be nonzero, n_act of them): the population of each of its tiles
 * (b->cnt) and the OR of its rows (b->uni). Zero words are skipped and
 * all-ones words need no popcount, so the cost follows the mask's nonzero
 * words. */
static FORMAT_INLINE void scan_block(const uint64_t *blk, int rows, int wpr,
                                     const int32_t *act, int n_act, int bn,
                                     builder *b)
{
    /* Mask words per tile (bn >= 64) or tiles per mask word (bn < 64). */
    const int tile_shift = bn >= 64 ? __builtin_ctz((unsigned)bn / 64) : 0;
    memset(b->cnt, 0, b->n_cnt * sizeof(uint32_t));
    memset(b->uni, 0, (size_t)wpr * sizeof(uint64_t));
    for (int r = 0; r < rows; r++) {
        const uint64_t *row = blk + (size_t)r * (size_t)wpr;
        for (int z = 0; z < n_act; z++) {
            const int w = act[z];
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
                b->cnt[w >> tile_shift] += (uint32_t)POPCNT(x);
            } else if (bn == 32) {
                b->cnt[2 * w] += (uint32_t)POPCNT(x & 0xffffffffull);
                b->cnt[2 * w + 1] += (uint32_t)POPCNT(x >> 32);
            } else {
                for (int t = 0; t < 4; t++)
                    b->cnt[4 * w + t] +=
                        (uint32_t)POPCNT((x >> (16 * t)) & 0xffffull);
            }
        }
    }
}

/* The rows of row block i from the source, scanned. */
static stof_status load_block(const stof_row_source *src, int i, int bm,
                              int wpr, builder *b, const uint64_t **blk,
                              int *rows)
{
    const int r0 = i * bm;
    *rows = src->seq_q - r0 < bm ? src->seq_q - r0 : bm;
    const int32_t *act = NULL;
    int n_act = 0;
    stof_status st = src->block(src->user, r0, *rows, blk, &act, &n_act);
    if (st != STOF_OK)
        return st;
    if (!act) {
        act = b->all;
        n_act = wpr;
    }
    b->act = act;
    b->n_act = n_act;
    scan_block(*blk, *rows, wpr, act, n_act, src->block_n, b);
    return STOF_OK;
}

/* malloc of n elements (at least one, so that no array of a valid format is
 * NULL), with the size product checked. */
static void *alloc_array(int64_t n, size_t elem)
{
    if (n < 1)
        n = 1;
    if ((uint64_t)n > SIZE_MAX / elem)
        return NULL;
    size_t bytes = (size_t)n * elem;
#if defined(MADV_HUGEPAGE)
    /* Large arrays are written once, front to back, right after this: with
     * 4 KiB pages the page faults cost more than the writing. Ask for
     * transparent huge pages (a hint; ignored where unsupported). */
    const size_t huge = (size_t)2 << 20;
    if (bytes >= 2 * huge && bytes <= SIZE_MAX - huge) {
        size_t rounded = (bytes + huge - 1) / huge * huge;
        void *p = aligned_alloc(huge, rounded);
        if (p)
            madvise(p, rounded, MADV_HUGEPAGE);
        return p;
    }
#endif
    return malloc(bytes);
}

/* Build the formats in two passes over the row blocks: the first sizes
 * every array (and fills the pointer arrays), the second fills them. Exact
 * sizes avoid growing arrays, whose copies and page faults would cost more
 * than scanning the mask twice. */
FORMAT_CLONES
static stof_status build(stof_context *ctx, const stof_row_source *src,
                         stof_format *f, builder *b)
{
    const int bm = f->block_m, bn = f->block_n;
    const int wpr = src->words_per_row;
    const int seq_q = f->seq_q, seq_k = f->seq_k;
    uint64_t allowed = 0;
    const uint64_t *blk = NULL;
    stof_status st;
    const int n_rb = f->n_row_blocks, n_cb = f->n_col_blocks;
    const int bwpr = f->bitmap_words_per_row;

    /* Pass 1: sizes. */
    int64_t n_tiles = 0, n_partial = 0, n_keys = 0, rw_off = 0;
    f->row_ptr[0] = 0;
    f->rw_ptr[0] = 0;
    f->rw_bitmap_off[0] = 0;
    for (int i = 0; i < n_rb; i++) {
        int rows;
        if ((st = load_block(src, i, bm, wpr, b, &blk, &rows)) != STOF_OK)
            return st;
        for (int j = 0; j < n_cb; j++)
            allowed += b->cnt[j];
        for (int j = 0; j < n_cb && b->block; j++) {
            if (!b->cnt[j])
                continue;
            const int cols = seq_k - j * bn < bn ? seq_k - j * bn : bn;
            n_tiles++;
            n_partial += b->cnt[j] != (uint32_t)rows * (uint32_t)cols;
        }
        int64_t nk = 0;
        for (int z = 0; z < b->n_act; z++)
            nk += POPCNT(b->uni[b->act[z]]);
        if (!b->rowwise)
            nk = 0; /* an empty row-wise part: no keys, no words */
        const int64_t rww = (nk + 31) / 32;
        f->row_ptr[i + 1] = n_tiles;
        f->rw_ptr[i + 1] = n_keys += nk;
        f->rw_words[i] = (int32_t)rww; /* nk <= 2^20: fits */
        f->rw_bitmap_off[i + 1] = rw_off += (int64_t)bm * rww;
    }
    if (n_partial > INT32_MAX)
        return stof__fail(ctx, STOF_ERR_UNSUPPORTED,
                          "stof_format_build: %lld partial tiles, at most %d "
                          "are supported",
                          (long long)n_partial, INT32_MAX);
    const int64_t bitmap_words = n_partial * bm * bwpr;
    if (!(f->col_idx = alloc_array(n_tiles, sizeof(int32_t))) ||
        !(f->kind = alloc_array(n_tiles, 1)) ||
        !(f->bitmap_idx = alloc_array(n_tiles, sizeof(int32_t))) ||
        !(f->bitmaps = alloc_array(bitmap_words, sizeof(uint32_t))) ||
        !(f->rw_keys = alloc_array(n_keys, sizeof(int32_t))) ||
        !(f->rw_bitmaps = alloc_array(rw_off, sizeof(uint32_t))))
        return stof__fail(ctx, STOF_ERR_OUT_OF_MEMORY,
                          "out of memory building the %dx%d formats of a %d x "
                          "%d mask (%lld tiles, %lld bitmap words, %lld keys, "
                          "%lld row-wise words)",
                          bm, bn, seq_q, seq_k, (long long)n_tiles,
                          (long long)bitmap_words, (long long)n_keys,
                          (long long)rw_off);

    /* Pass 2: contents. */
    int64_t e = 0, n_full = 0, part = 0;
    double partial_in = 0.0, partial_area = 0.0, rw_area = 0.0;
    for (int i = 0; i < n_rb; i++) {
        int rows;
        if ((st = load_block(src, i, bm, wpr, b, &blk, &rows)) != STOF_OK)
            return st;

        /* Block-wise entries. */
        for (int j = 0; j < n_cb && b->block; j++) {
            if (!b->cnt[j])
                continue;
            const int c0 = j * bn;
            const int cols = seq_k - c0 < bn ? seq_k - c0 : bn;
            const uint32_t area = (uint32_t)rows * (uint32_t)cols;
            f->col_idx[e] = j;
            if (b->cnt[j] == area) {
                f->kind[e] = STOF_TILE_FULL;
                f->bitmap_idx[e] = -1;
                n_full++;
            } else {
                f->kind[e] = STOF_TILE_PARTIAL;
                f->bitmap_idx[e] = (int32_t)part;
                /* Bits past seq_k are 0 in the mask; words past it and rows
                 * past seq_q are written as 0. */
                uint32_t *bmp =
                    f->bitmaps + (size_t)part * (size_t)bm * (size_t)bwpr;
                for (int r = 0; r < rows; r++) {
                    const uint64_t *row = blk + (size_t)r * (size_t)wpr;
                    for (int t = 0; t < bwpr; t++) {
                        int k0 = c0 + 32 * t;
                        uint32_t v = 0;
                        if (k0 < seq_k) {
                            uint64_t x = row[k0 >> 6] >> (k0 & 63);
                            v = bn == 16 ? (uint32_t)(x & 0xffffu)
                                         : (uint32_t)x;
                        }
                        bmp[r * bwpr + t] = v;
                    }
                }
                if (rows < bm)
                    memset(bmp + (size_t)rows * (size_t)bwpr, 0,
                           (size_t)(bm - rows) * (size_t)bwpr *
                               sizeof(uint32_t));
                part++;
                partial_in += b->cnt[j];
                partial_area += area;
            }
            e++;
        }

        /* Row-wise: the keys are the set bits of the union, and each row's
         * bitmap is the row compressed by the union. */
        if (!b->rowwise)
            continue;
        int n_nzw = 0;
        int64_t nk = 0;
        for (int z = 0; z < b->n_act; z++) {
            const int w = b->act[z];
            if (b->uni[w]) {
                int c = POPCNT(b->uni[w]);
                b->nzp[n_nzw] = (uint8_t)c;
                b->nzw[n_nzw++] = w;
                nk += c;
            }
        }
        int32_t *keys = f->rw_keys + f->rw_ptr[i];
        for (int z = 0; z < n_nzw; z++) {
            int w = b->nzw[z];
            for (uint64_t u = b->uni[w]; u; u &= u - 1)
                *keys++ = 64 * w + __builtin_ctzll(u);
        }
        const int64_t rww = f->rw_words[i];
        uint32_t *rwb = f->rw_bitmaps + f->rw_bitmap_off[i];
        for (int r = 0; r < rows && rww > 0; r++) {
            const uint64_t *row = blk + (size_t)r * (size_t)wpr;
            bit_writer bw = {rwb + (int64_t)r * rww, 0, 0};
            for (int z = 0; z < n_nzw; z++) {
                int w = b->nzw[z];
                uint64_t u = b->uni[w], x = row[w];
                int n = b->nzp[z];
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
            bw_flush(&bw); /* the row's nk bits fill exactly rww words */
        }
        if (rows < bm && rww > 0)
            memset(rwb + (int64_t)rows * rww, 0,
                   (size_t)((int64_t)(bm - rows) * rww) * sizeof(uint32_t));
        rw_area += (double)rows * (double)nk;
    }

    f->n_full = n_full;
    f->n_partial = n_partial;
    f->n_empty = b->block ? (int64_t)n_rb * (int64_t)n_cb - n_full - n_partial
                          : 0;
    f->allowed = allowed;
    f->partial_fill = partial_area > 0.0 ? partial_in / partial_area : 0.0;
    f->rowwise_fill = rw_area > 0.0 ? (double)allowed / rw_area : 0.0;
    return STOF_OK;
}

stof_status stof_format_build(stof_context *ctx, const stof_mask *m,
                              int block_m, int block_n, stof_format **fmt)
{
    return stof__format_build_parts(
        ctx, m, block_m, block_n, STOF__FORMAT_BLOCK | STOF__FORMAT_ROWWISE,
        fmt);
}

/* The row source of a bit mask: its rows, every word. */
static stof_status mask_block(void *user, int r0, int rows,
                              const uint64_t **bits, const int32_t **act,
                              int *n_act)
{
    (void)rows;
    const stof_mask *m = user;
    *bits = m->bits + (size_t)r0 * (size_t)m->words_per_row;
    *act = NULL;
    *n_act = 0;
    return STOF_OK;
}

stof_status stof__format_build_parts(stof_context *ctx, const stof_mask *m,
                                     int block_m, int block_n, int parts,
                                     stof_format **fmt)
{
    STOF_CHECK_ARG(ctx, fmt != NULL, "stof_format_build: fmt is NULL");
    *fmt = NULL;
    STOF_CHECK_ARG(ctx, m != NULL, "stof_format_build: mask is NULL");
    stof_row_source src = {m->seq_q, m->seq_k, m->words_per_row, block_n,
                           mask_block, (void *)m};
    return stof__format_build_source(ctx, &src, block_m, block_n, parts, fmt);
}

stof_status stof__format_build_source(stof_context *ctx,
                                      const stof_row_source *src, int block_m,
                                      int block_n, int parts,
                                      stof_format **fmt)
{
    *fmt = NULL;
    STOF_CHECK_ARG(ctx, is_block_size(block_m),
                   "stof_format_build: block_m = %d, expected a power of two "
                   "from 16 to 256",
                   block_m);
    STOF_CHECK_ARG(ctx, is_block_size(block_n),
                   "stof_format_build: block_n = %d, expected a power of two "
                   "from 16 to 256",
                   block_n);
    STOF_CHECK_ARG(ctx, src->block_n == block_n,
                   "stof_format_build: the row source is for block_n %d, "
                   "not %d",
                   src->block_n, block_n);

    stof_format *f = calloc(1, sizeof(*f));
    if (!f)
        return stof__fail(ctx, STOF_ERR_OUT_OF_MEMORY,
                          "out of memory allocating a format");
    const int wpr = src->words_per_row;
    f->seq_q = src->seq_q;
    f->seq_k = src->seq_k;
    f->block_m = block_m;
    f->block_n = block_n;
    f->n_row_blocks = (src->seq_q + block_m - 1) / block_m;
    f->n_col_blocks = (src->seq_k + block_n - 1) / block_n;
    f->bitmap_words_per_row = (block_n + 31) / 32;

    const size_t nrb = (size_t)f->n_row_blocks;
    builder b;
    memset(&b, 0, sizeof(b));
    b.block = !!(parts & STOF__FORMAT_BLOCK);
    b.rowwise = !!(parts & STOF__FORMAT_ROWWISE);
    /* For BN < 64 the last mask word can span tiles past the last column
     * block (their counts stay 0); size cnt for whole words. */
    b.n_cnt = (size_t)wpr * 4;
    if (b.n_cnt < (size_t)f->n_col_blocks)
        b.n_cnt = (size_t)f->n_col_blocks;
    f->row_ptr = malloc((nrb + 1) * sizeof(int64_t));
    f->rw_ptr = malloc((nrb + 1) * sizeof(int64_t));
    f->rw_words = malloc((nrb ? nrb : 1) * sizeof(int32_t));
    f->rw_bitmap_off = malloc((nrb + 1) * sizeof(int64_t));
    b.cnt = malloc(b.n_cnt * sizeof(uint32_t));
    b.uni = malloc((size_t)wpr * sizeof(uint64_t));
    b.nzw = malloc((size_t)wpr * sizeof(int32_t));
    b.nzp = malloc((size_t)wpr);
    b.all = malloc((size_t)wpr * sizeof(int32_t));
    stof_status st;
    if (!f->row_ptr || !f->rw_ptr || !f->rw_words || !f->rw_bitmap_off ||
        !b.cnt || !b.uni || !b.nzw || !b.nzp || !b.all) {
        st = stof__fail(ctx, STOF_ERR_OUT_OF_MEMORY,
                        "out of memory allocating the formats of a %d x %d "
                        "mask",
                        src->seq_q, src->seq_k);
    } else {
        for (int w = 0; w < wpr; w++)
            b.all[w] = w;
        st = build(ctx, src, f, &b);
    }
    free(b.cnt);
    free(b.uni);
    free(b.nzw);
    free(b.nzp);
    free(b.all);
    if (st != STOF_OK) {
        stof_format_free(&f);
        return st;
    }
    *fmt = f;
    return stof__ok(ctx);
}
