/*
 * test_format.c - the sparse formats against a brute-force construction from
 * the dense mask: every tile's kind, every bitmap bit (padding included),
 * every row-wise key list and bitmap bit, the statistics; on random masks of
 * several densities (all-empty and all-full too), structured masks, odd
 * sizes and every block size combination. Plus argument checks.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

#include "stof.h"
#include "testutil.h"

static stof_context *open_ctx(void)
{
    stof_context *ctx = NULL;
    cr_assert_eq(stof_open(&ctx, NULL), STOF_OK, "%s", stof_errmsg(ctx));
    return ctx;
}

static const int block_sizes[] = {16, 32, 64, 128, 256};

static int at(const uint8_t *d, int sq, int sk, int q, int k)
{
    if (q < 0 || q >= sq || k < 0 || k >= sk)
        return 0;
    return d[(size_t)q * sk + k] != 0;
}

/* Compare a format with what the definitions in stof.h give for `d`. */
static void check_format(const char *what, const stof_format *f,
                         const uint8_t *d, int sq, int sk, int bm, int bn)
{
    const int nrb = (sq + bm - 1) / bm, ncb = (sk + bn - 1) / bn;
    const int bwpr = (bn + 31) / 32;
    cr_assert_eq(f->seq_q, sq, "%s", what);
    cr_assert_eq(f->seq_k, sk, "%s", what);
    cr_assert_eq(f->block_m, bm, "%s", what);
    cr_assert_eq(f->block_n, bn, "%s", what);
    cr_assert_eq(f->n_row_blocks, nrb, "%s", what);
    cr_assert_eq(f->n_col_blocks, ncb, "%s", what);
    cr_assert_eq(f->bitmap_words_per_row, bwpr, "%s", what);
    cr_assert(f->row_ptr && f->col_idx && f->kind && f->bitmap_idx &&
                  f->bitmaps && f->rw_ptr && f->rw_keys && f->rw_words &&
                  f->rw_bitmap_off && f->rw_bitmaps,
              "%s: NULL array", what);

    uint64_t allowed = 0;
    for (size_t i = 0; i < (size_t)sq * sk; i++)
        allowed += d[i] != 0;
    cr_assert_eq(f->allowed, allowed, "%s", what);

    /* Block-wise. */
    int64_t e = 0, n_full = 0, n_partial = 0;
    double pin = 0, parea = 0, rwarea = 0;
    cr_assert_eq(f->row_ptr[0], 0, "%s", what);
    for (int i = 0; i < nrb; i++) {
        int rows = sq - i * bm < bm ? sq - i * bm : bm;
        for (int j = 0; j < ncb; j++) {
            int cols = sk - j * bn < bn ? sk - j * bn : bn;
            int cnt = 0;
            for (int r = 0; r < rows; r++)
                for (int c = 0; c < cols; c++)
                    cnt += at(d, sq, sk, i * bm + r, j * bn + c);
            if (cnt == 0)
                continue;
            if (e >= f->row_ptr[i + 1])
                cr_assert_fail("%s %dx%d: row block %d lacks tile %d", what,
                               bm, bn, i, j);
            cr_assert_eq(f->col_idx[e], j, "%s %dx%d: row block %d entry %lld",
                         what, bm, bn, i, (long long)e);
            int full = cnt == rows * cols;
            if (full) {
                cr_assert_eq(f->kind[e], STOF_TILE_FULL, "%s tile (%d,%d)",
                             what, i, j);
                cr_assert_eq(f->bitmap_idx[e], -1, "%s", what);
                n_full++;
            } else {
                cr_assert_eq(f->kind[e], STOF_TILE_PARTIAL, "%s tile (%d,%d)",
                             what, i, j);
                cr_assert_eq(f->bitmap_idx[e], n_partial, "%s", what);
                const uint32_t *bmp =
                    f->bitmaps + (size_t)n_partial * bm * bwpr;
                for (int r = 0; r < bm; r++)
                    for (int c = 0; c < 32 * bwpr; c++) {
                        int want = c < bn ? at(d, sq, sk, i * bm + r, j * bn + c)
                                          : 0;
                        int got = (bmp[r * bwpr + c / 32] >> (c % 32)) & 1;
                        if (got != want)
                            cr_assert_fail("%s %dx%d tile (%d,%d) bit (%d,%d): "
                                           "%d, expected %d",
                                           what, bm, bn, i, j, r, c, got, want);
                    }
                n_partial++;
                pin += cnt;
                parea += rows * cols;
            }
            e++;
        }
        cr_assert_eq(f->row_ptr[i + 1], e, "%s %dx%d: row_ptr[%d]", what, bm,
                     bn, i + 1);
    }
    cr_assert_eq(f->n_full, n_full, "%s", what);
    cr_assert_eq(f->n_partial, n_partial, "%s", what);
    cr_assert_eq(f->n_empty, (int64_t)nrb * ncb - n_full - n_partial, "%s",
                 what);
    cr_assert_float_eq(f->partial_fill, parea > 0 ? pin / parea : 0.0, 1e-12,
                       "%s", what);

    /* Row-wise. */
    int *keys = malloc((size_t)sk * sizeof(int));
    cr_assert_not_null(keys);
    cr_assert_eq(f->rw_ptr[0], 0, "%s", what);
    cr_assert_eq(f->rw_bitmap_off[0], 0, "%s", what);
    for (int i = 0; i < nrb; i++) {
        int rows = sq - i * bm < bm ? sq - i * bm : bm;
        int nk = 0;
        for (int k = 0; k < sk; k++) {
            int any = 0;
            for (int r = 0; r < rows && !any; r++)
                any = at(d, sq, sk, i * bm + r, k);
            if (any)
                keys[nk++] = k;
        }
        cr_assert_eq(f->rw_ptr[i + 1] - f->rw_ptr[i], nk,
                     "%s %dx%d: row block %d key count", what, bm, bn, i);
        for (int t = 0; t < nk; t++)
            cr_assert_eq(f->rw_keys[f->rw_ptr[i] + t], keys[t],
                         "%s %dx%d: row block %d key %d", what, bm, bn, i, t);
        int words = (nk + 31) / 32;
        cr_assert_eq(f->rw_words[i], words, "%s: rw_words[%d]", what, i);
        cr_assert_eq(f->rw_bitmap_off[i + 1] - f->rw_bitmap_off[i],
                     (int64_t)bm * words, "%s: rw_bitmap_off[%d]", what, i + 1);
        const uint32_t *bmp = f->rw_bitmaps + f->rw_bitmap_off[i];
        for (int r = 0; r < bm; r++)
            for (int t = 0; t < 32 * words; t++) {
                int want = t < nk ? at(d, sq, sk, i * bm + r, keys[t]) : 0;
                int got = (bmp[r * words + t / 32] >> (t % 32)) & 1;
                if (got != want)
                    cr_assert_fail("%s %dx%d: row block %d bit (%d,%d): %d, "
                                   "expected %d",
                                   what, bm, bn, i, r, t, got, want);
            }
        rwarea += (double)rows * nk;
    }
    cr_assert_float_eq(f->rowwise_fill, rwarea > 0 ? (double)allowed / rwarea : 0.0,
                       1e-12, "%s", what);
    free(keys);
}

static void check_all_tilings(stof_context *ctx, const char *what,
                              const stof_mask *m)
{
    int sq = stof_mask_seq_q(m), sk = stof_mask_seq_k(m);
    uint8_t *d = malloc((size_t)sq * sk);
    cr_assert_not_null(d);
    stof_mask_to_dense(m, d);
    for (int a = 0; a < 5; a++)
        for (int b = 0; b < 5; b++) {
            stof_format *f = NULL;
            stof_status st = stof_format_build(ctx, m, block_sizes[a],
                                               block_sizes[b], &f);
            cr_assert_eq(st, STOF_OK, "%s: %s", what, stof_errmsg(ctx));
            check_format(what, f, d, sq, sk, block_sizes[a], block_sizes[b]);
            stof_format_free(&f);
            cr_assert_null(f);
        }
    free(d);
}

static const int shapes[][2] = {
    {1, 1}, {17, 33}, {64, 64}, {100, 300}, {257, 255}, {300, 129}, {513, 70},
};
#define N_SHAPES ((int)(sizeof(shapes) / sizeof(shapes[0])))

Test(format, random_masks_every_tiling)
{
    stof_context *ctx = open_ctx();
    tu_rng rng = {tu_seed()};
    const double ps[] = {0.0, 0.002, 0.05, 0.5, 0.97, 1.0};
    for (int s = 0; s < N_SHAPES; s++)
        for (size_t p = 0; p < sizeof(ps) / sizeof(ps[0]); p++) {
            int sq = shapes[s][0], sk = shapes[s][1];
            uint8_t *d = tu_random_dense(&rng, sq, sk, ps[p]);
            stof_mask *m = NULL;
            cr_assert_eq(stof_mask_from_dense(ctx, d, sq, sk, &m), STOF_OK);
            char what[64];
            snprintf(what, sizeof(what), "random p=%g %dx%d", ps[p], sq, sk);
            check_all_tilings(ctx, what, m);
            stof_mask_free(&m);
            free(d);
        }
    stof_close(&ctx);
}

Test(format, clustered_masks_every_tiling)
{
    /* Rows copied from a few patterns so that rows of a block share keys,
     * with full and empty runs: exercises the word shortcuts of the
     * row-wise compression and partially filled key words. */
    stof_context *ctx = open_ctx();
    tu_rng rng = {tu_seed() ^ 77};
    const int dimsx[][2] = {{200, 517}, {96, 1000}};
    for (int s = 0; s < 2; s++) {
        int sq = dimsx[s][0], sk = dimsx[s][1];
        uint8_t *d = calloc((size_t)sq * sk, 1);
        uint8_t *pat = tu_random_dense(&rng, 4, sk, 0.3);
        for (int q = 0; q < sq; q++) {
            int kind = (int)tu_below(&rng, 5);
            for (int k = 0; k < sk; k++) {
                uint8_t v = kind < 4 ? pat[kind * sk + k] : 1;
                if (k >= 100 && k < 200)
                    v = kind == 0; /* blocks of runs */
                d[(size_t)q * sk + k] = v;
            }
        }
        stof_mask *m = NULL;
        cr_assert_eq(stof_mask_from_dense(ctx, d, sq, sk, &m), STOF_OK);
        check_all_tilings(ctx, "clustered", m);
        stof_mask_free(&m);
        free(pat);
        free(d);
    }
    stof_close(&ctx);
}

Test(format, structured_masks_every_tiling)
{
    stof_context *ctx = open_ctx();
    const char *specs[] = {"causal",          "sliding:37",
                           "strided:16",      "dilated:100:3",
                           "bigbird:16:3:1:2:5", "longformer:20:3",
                           "dense",           "none",
                           "causal_sliding:64&strided:5|bigbird:32:1:0:1:3"};
    const int dimsx[][2] = {{200, 300}, {513, 513}, {256, 256}, {31, 700}};
    for (size_t s = 0; s < sizeof(specs) / sizeof(specs[0]); s++)
        for (int dd = 0; dd < 4; dd++) {
            stof_mask *m = NULL;
            cr_assert_eq(stof_mask_from_spec(ctx, specs[s], dimsx[dd][0],
                                             dimsx[dd][1], &m),
                         STOF_OK, "%s", stof_errmsg(ctx));
            char what[128];
            snprintf(what, sizeof(what), "%s %dx%d", specs[s], dimsx[dd][0],
                     dimsx[dd][1]);
            check_all_tilings(ctx, what, m);
            stof_mask_free(&m);
        }
    stof_close(&ctx);
}

Test(format, edge_tiles_are_full_when_the_matrix_part_is)
{
    /* 100 x 70 all allowed: every tile, edge tiles included, is full. */
    stof_context *ctx = open_ctx();
    stof_mask *m = NULL;
    cr_assert_eq(stof_mask_from_spec(ctx, "dense", 100, 70, &m), STOF_OK);
    stof_format *f = NULL;
    cr_assert_eq(stof_format_build(ctx, m, 64, 64, &f), STOF_OK);
    cr_assert_eq(f->n_full, 4);
    cr_assert_eq(f->n_partial, 0);
    cr_assert_eq(f->n_empty, 0);
    cr_assert_float_eq(f->rowwise_fill, 1.0, 1e-15);
    cr_assert_eq(f->partial_fill, 0.0);
    stof_format_free(&f);
    stof_mask_free(&m);
    stof_close(&ctx);
}

Test(format, public_suite_tile_counts_at_4096)
{
    /* Counts the kernels rely on, derived by hand from the definitions. */
    stof_context *ctx = open_ctx();
    stof_mask *m = NULL;
    stof_format *f = NULL;
    cr_assert_eq(stof_mask_from_spec(ctx, "causal", 4096, 4096, &m), STOF_OK);
    cr_assert_eq(stof_format_build(ctx, m, 128, 128, &f), STOF_OK);
    cr_assert_eq(f->n_partial, 32); /* the diagonal */
    cr_assert_eq(f->n_full, 32 * 31 / 2);
    stof_format_free(&f);
    stof_mask_free(&m);
    cr_assert_eq(stof_mask_from_spec(ctx, "sliding:256", 4096, 4096, &m),
                 STOF_OK);
    cr_assert_eq(stof_format_build(ctx, m, 128, 128, &f), STOF_OK);
    /* Per row block: 3 full (|i-j| <= 1) and 2 partial (|i-j| == 2). */
    cr_assert_eq(f->n_full, 32 + 2 * 31);
    cr_assert_eq(f->n_partial, 2 * 30);
    stof_format_free(&f);
    stof_mask_free(&m);
    stof_close(&ctx);
}

Test(format, bad_arguments)
{
    stof_context *ctx = open_ctx();
    stof_mask *m = NULL;
    cr_assert_eq(stof_mask_from_spec(ctx, "causal", 64, 64, &m), STOF_OK);
    stof_format *f = (stof_format *)(uintptr_t)1;
    cr_assert_eq(stof_format_build(ctx, NULL, 64, 64, &f),
                 STOF_ERR_INVALID_ARGUMENT);
    cr_assert_null(f);
    cr_assert(strstr(stof_errmsg(ctx), "mask is NULL"), "%s", stof_errmsg(ctx));
    cr_assert_eq(stof_format_build(ctx, m, 64, 64, NULL),
                 STOF_ERR_INVALID_ARGUMENT);
    cr_assert(strstr(stof_errmsg(ctx), "fmt is NULL"), "%s", stof_errmsg(ctx));
    const int bad[] = {0, -16, 8, 15, 48, 100, 512, 1 << 30};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        char want[64];
        snprintf(want, sizeof(want), "block_m = %d", bad[i]);
        cr_assert_eq(stof_format_build(ctx, m, bad[i], 64, &f),
                     STOF_ERR_INVALID_ARGUMENT);
        cr_assert(strstr(stof_errmsg(ctx), want), "%s", stof_errmsg(ctx));
        cr_assert(strstr(stof_errmsg(ctx), "power of two"), "%s",
                  stof_errmsg(ctx));
        snprintf(want, sizeof(want), "block_n = %d", bad[i]);
        cr_assert_eq(stof_format_build(ctx, m, 64, bad[i], &f),
                     STOF_ERR_INVALID_ARGUMENT);
        cr_assert(strstr(stof_errmsg(ctx), want), "%s", stof_errmsg(ctx));
        cr_assert_null(f);
    }
    cr_assert_eq(stof_format_build(NULL, m, 16, 256, &f), STOF_OK);
    stof_format_free(&f);
    cr_assert_null(f);
    stof_format_free(&f);
    stof_format_free(NULL);
    stof_mask_free(&m);
    stof_close(&ctx);
}

/* Building one part only gives that part exactly as the full build does
 * and leaves the other empty. */
Test(format, parts_build_alone)
{
    stof_context *ctx = NULL;
    cr_assert_eq(stof_open(&ctx, NULL), STOF_OK);
    const char *specs[] = {"bigbird:16:3:1:2:5", "strided:37|causal", "dense",
                           "none", "random:0.2:4"};
    for (size_t i = 0; i < sizeof(specs) / sizeof(*specs); i++) {
        stof_mask *m = NULL;
        cr_assert_eq(stof_mask_from_spec(ctx, specs[i], 300, 271, &m), STOF_OK);
        stof_format *all = NULL, *blk = NULL, *rw = NULL;
        cr_assert_eq(stof_format_build(ctx, m, 32, 64, &all), STOF_OK);
        cr_assert_eq(stof__format_build_parts(ctx, m, 32, 64,
                                              STOF__FORMAT_BLOCK, &blk),
                     STOF_OK);
        cr_assert_eq(stof__format_build_parts(ctx, m, 32, 64,
                                              STOF__FORMAT_ROWWISE, &rw),
                     STOF_OK);
        const int nrb = all->n_row_blocks;
        const int64_t nt = all->row_ptr[nrb];
        cr_assert_eq(blk->row_ptr[nrb], nt);
        cr_assert_eq(blk->n_full, all->n_full);
        cr_assert_eq(blk->n_partial, all->n_partial);
        cr_assert_eq(memcmp(blk->col_idx, all->col_idx, 4 * (size_t)nt), 0);
        cr_assert_eq(memcmp(blk->kind, all->kind, (size_t)nt), 0);
        cr_assert_eq(memcmp(blk->bitmaps, all->bitmaps,
                            4 * (size_t)all->n_partial * 32 *
                                (size_t)all->bitmap_words_per_row),
                     0);
        cr_assert_eq(blk->rw_ptr[nrb], 0, "%s: block-only has keys", specs[i]);
        const int64_t nk = all->rw_ptr[nrb];
        cr_assert_eq(rw->rw_ptr[nrb], nk);
        cr_assert_eq(memcmp(rw->rw_keys, all->rw_keys, 4 * (size_t)nk), 0);
        cr_assert_eq(memcmp(rw->rw_bitmaps, all->rw_bitmaps,
                            4 * (size_t)all->rw_bitmap_off[nrb]),
                     0);
        cr_assert_eq(rw->row_ptr[nrb], 0, "%s: row-wise-only has tiles",
                     specs[i]);
        stof_format_free(&all);
        stof_format_free(&blk);
        stof_format_free(&rw);
        stof_mask_free(&m);
    }
    stof_close(&ctx);
}
