/*
 * mask_png.c - a picture of a mask (stof_mask_png): its tiles coloured by
 * kind, as the sparse formats see them (full: every element allowed;
 * partial: some; empty: none), each pixel shaded by the share of allowed
 * elements it covers; encoded as an 8-bit RGB PNG with zlib.
 */
#include "internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <zlib.h>

/* Allowed elements of row q in keys [k0, k1). */
static uint64_t row_count(const stof_mask *m, int q, int k0, int k1)
{
    const uint64_t *w = m->bits + (size_t)q * m->words_per_row;
    uint64_t n = 0;
    int k = k0;
    while (k < k1) {
        const int b = k & 63, take = 64 - b < k1 - k ? 64 - b : k1 - k;
        uint64_t x = w[k >> 6] >> b;
        if (take < 64)
            x &= (UINT64_C(1) << take) - 1;
        n += (uint64_t)__builtin_popcountll(x);
        k += take;
    }
    return n;
}

/* Colours (RGB). */
static const unsigned char C_EMPTY[3] = {255, 255, 255};
static const unsigned char C_FULL[3] = {31, 78, 161};
static const unsigned char C_PART_BG[3] = {255, 236, 204};
static const unsigned char C_PART_FG[3] = {230, 110, 0};
static const unsigned char C_GRID[3] = {205, 205, 205};

/* Append a PNG chunk (length, type, data, CRC of type + data). */
static unsigned char *chunk(unsigned char *p, const char type[4],
                            const unsigned char *data, uint32_t len)
{
    p[0] = (unsigned char)(len >> 24);
    p[1] = (unsigned char)(len >> 16);
    p[2] = (unsigned char)(len >> 8);
    p[3] = (unsigned char)len;
    memcpy(p + 4, type, 4);
    if (len)
        memcpy(p + 8, data, len);
    uLong crc = crc32(0L, Z_NULL, 0);
    crc = crc32(crc, p + 4, 4 + len);
    p[8 + len] = (unsigned char)(crc >> 24);
    p[9 + len] = (unsigned char)(crc >> 16);
    p[10 + len] = (unsigned char)(crc >> 8);
    p[11 + len] = (unsigned char)crc;
    return p + 12 + len;
}

stof_status stof_mask_png(stof_context *ctx, const stof_mask *m, int block_m,
                          int block_n, int max_side, unsigned char *buf,
                          size_t cap, size_t *size)
{
    if (!ctx)
        return STOF_ERR_INVALID_ARGUMENT;
    STOF_CHECK_ARG(ctx, m && size, "mask and size must not be NULL");
    STOF_CHECK_ARG(ctx, buf || cap == 0, "buf is NULL but cap is %zu", cap);
    if (block_m == 0)
        block_m = 128;
    if (block_n == 0)
        block_n = 128;
    if (max_side == 0)
        max_side = 1024;
    STOF_CHECK_ARG(ctx, block_m > 0 && block_n > 0,
                   "block_m %d, block_n %d: tiles must be positive (0: 128)",
                   block_m, block_n);
    STOF_CHECK_ARG(ctx, max_side >= 16 && max_side <= 8192,
                   "max_side %d: must be 16..8192 pixels (0: 1024)",
                   max_side);
    *size = 0;
    const int sq = m->seq_q, sk = m->seq_k;
    /* A tile larger than the mask draws as the whole mask (and keeps the
     * tile counts below in range). */
    if (block_m > sq)
        block_m = sq;
    if (block_n > sk)
        block_n = sk;
    /* s x s elements a pixel, so that neither side passes max_side. */
    const int s = ((sq > sk ? sq : sk) + max_side - 1) / max_side;
    const int W = (sk + s - 1) / s, H = (sq + s - 1) / s;
    const int tr = (sq + block_m - 1) / block_m,
              tc = (sk + block_n - 1) / block_n;
    /* Each tile is counted row by row: tiny tiles on a huge mask would
     * take gigabytes and hours. */
    STOF_CHECK_ARG(ctx, (int64_t)tr * tc <= (1 << 24),
                   "tiles of %d x %d make %lld tiles of a %d x %d mask, more "
                   "than the %d a picture draws: use larger tiles",
                   block_m, block_n, (long long)tr * tc, sq, sk, 1 << 24);
    uint64_t *pix = calloc((size_t)W * H, sizeof(*pix));
    uint64_t *tile = calloc((size_t)tr * tc, sizeof(*tile));
    const size_t stride = 1 + (size_t)W * 3;
    unsigned char *raw = malloc(stride * H);
    uLong zcap = compressBound((uLong)(stride * H));
    unsigned char *z = malloc(zcap);
    stof_status st = STOF_OK;
    if (!pix || !tile || !raw || !z) {
        st = stof__fail(ctx, STOF_ERR_OUT_OF_MEMORY,
                        "out of memory drawing a %dx%d mask", sq, sk);
        goto out;
    }
    for (int q = 0; q < sq; q++) {
        uint64_t *pr = pix + (size_t)(q / s) * W;
        for (int x = 0; x < W; x++)
            pr[x] += row_count(m, q, x * s, (x + 1) * s < sk ? (x + 1) * s
                                                              : sk);
        uint64_t *trow = tile + (size_t)(q / block_m) * tc;
        for (int t = 0; t < tc; t++)
            trow[t] += row_count(m, q, t * block_n,
                                 (t + 1) * block_n < sk ? (t + 1) * block_n
                                                        : sk);
    }
    /* Tile lines only when a tile spans at least 4 pixels. */
    const int grid_m = block_m / s >= 4, grid_n = block_n / s >= 4;
    for (int y = 0; y < H; y++) {
        unsigned char *row = raw + (size_t)y * stride;
        row[0] = 0; /* filter: none */
        const int q0 = y * s, q1 = (y + 1) * s < sq ? (y + 1) * s : sq;
        for (int x = 0; x < W; x++) {
            const int k0 = x * s, k1 = (x + 1) * s < sk ? (x + 1) * s : sk;
            /* The tile of the pixel's first element decides the hue. */
            const int ti = q0 / block_m, tj = k0 / block_n;
            const int tq = (ti + 1) * block_m < sq ? block_m
                                                   : sq - ti * block_m;
            const int tk = (tj + 1) * block_n < sk ? block_n
                                                   : sk - tj * block_n;
            const uint64_t n = tile[(size_t)ti * tc + tj];
            /* The square root shows a few allowed elements in a pixel
             * (one column in four) clearly. */
            const double f = sqrt((double)pix[(size_t)y * W + x] /
                                  ((double)(q1 - q0) * (k1 - k0)));
            unsigned char c[3];
            if (n == 0) {
                memcpy(c, C_EMPTY, 3);
            } else if (n == (uint64_t)tq * tk) {
                memcpy(c, C_FULL, 3);
            } else {
                for (int i = 0; i < 3; i++)
                    c[i] = (unsigned char)(C_PART_BG[i] +
                                           f * (C_PART_FG[i] - C_PART_BG[i]) +
                                           0.5);
            }
            /* A tile line where this pixel starts a new tile row / column
             * (the pixel size need not divide the tile). */
            if ((grid_m && y > 0 && q0 / block_m != (q0 - s) / block_m) ||
                (grid_n && x > 0 && k0 / block_n != (k0 - s) / block_n))
                memcpy(c, C_GRID, 3);
            memcpy(row + 1 + (size_t)x * 3, c, 3);
        }
    }
    uLongf zlen = zcap;
    if (compress2(z, &zlen, raw, (uLong)(stride * H), 6) != Z_OK) {
        st = stof__fail(ctx, STOF_ERR_OUT_OF_MEMORY,
                        "zlib could not compress the picture");
        goto out;
    }
    /* Signature, IHDR (13), IDAT, IEND: 8 + 25 + 12 + zlen + 12. */
    const size_t need = 8 + 25 + 12 + (size_t)zlen + 12;
    *size = need;
    if (cap < need) {
        /* A size query (no buffer) is not an error worth a log line. */
        st = buf ? stof__fail(ctx, STOF_ERR_BUFFER_TOO_SMALL,
                              "the picture needs %zu bytes, the buffer has "
                              "%zu",
                              need, cap)
                 : stof__fail_quiet(ctx, STOF_ERR_BUFFER_TOO_SMALL,
                                    "the picture needs %zu bytes", need);
        goto out;
    }
    static const unsigned char sig[8] = {0x89, 'P', 'N', 'G',
                                         '\r', '\n', 0x1a, '\n'};
    memcpy(buf, sig, 8);
    const unsigned char ihdr[13] = {
        (unsigned char)(W >> 24), (unsigned char)(W >> 16),
        (unsigned char)(W >> 8),  (unsigned char)W,
        (unsigned char)(H >> 24), (unsigned char)(H >> 16),
        (unsigned char)(H >> 8),  (unsigned char)H,
        8, 2, 0, 0, 0}; /* 8-bit RGB, deflate, no filter method, no
                           interlace */
    unsigned char *p = chunk(buf + 8, "IHDR", ihdr, 13);
    p = chunk(p, "IDAT", z, (uint32_t)zlen);
    chunk(p, "IEND", NULL, 0);
    st = stof__ok(ctx);
out:
    free(pix);
    free(tile);
    free(raw);
    free(z);
    return st;
}
