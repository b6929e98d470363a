/*
 * test_mask.c - the bit-packed mask: packing from dense bytes and back,
 * accessors, the digest (its canonical stream, a recorded value, stability
 * across constructions and sensitivity to every bit and to the sizes), and
 * argument checks.
 */
#include <criterion/criterion.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define XXH_INLINE_ALL
#include <xxhash.h>
#include <zlib.h>

#include "internal.h"
#include "stof.h"
#include "testutil.h"

static stof_context *open_ctx(void)
{
    stof_context *ctx = NULL;
    cr_assert_eq(stof_open(&ctx, NULL), STOF_OK, "%s", stof_errmsg(ctx));
    return ctx;
}

static stof_mask *from_dense(stof_context *ctx, const uint8_t *b, int sq, int sk)
{
    stof_mask *m = NULL;
    cr_assert_eq(stof_mask_from_dense(ctx, b, sq, sk, &m), STOF_OK, "%s",
                 stof_errmsg(ctx));
    cr_assert_not_null(m);
    return m;
}

static stof_mask *from_spec(stof_context *ctx, const char *s, int sq, int sk)
{
    stof_mask *m = NULL;
    cr_assert_eq(stof_mask_from_spec(ctx, s, sq, sk, &m), STOF_OK, "%s",
                 stof_errmsg(ctx));
    return m;
}

static const int dims[][2] = {
    {1, 1},   {1, 7},    {7, 1},     {3, 63},   {5, 64},   {6, 65},
    {9, 127}, {4, 128},  {11, 129},  {64, 64},  {65, 63},  {100, 1000},
    {33, 3001}, {1000, 33}, {257, 520},
};
#define N_DIMS ((int)(sizeof(dims) / sizeof(dims[0])))

Test(mask, dense_round_trip_and_accessors)
{
    stof_context *ctx = open_ctx();
    tu_rng rng = {tu_seed()};
    const double ps[] = {0.0, 0.01, 0.5, 0.93, 1.0};
    for (int d = 0; d < N_DIMS; d++) {
        for (size_t pi = 0; pi < sizeof(ps) / sizeof(ps[0]); pi++) {
            int sq = dims[d][0], sk = dims[d][1];
            size_t n = (size_t)sq * sk;
            uint8_t *b = tu_random_dense(&rng, sq, sk, ps[pi]);
            cr_assert_not_null(b);
            /* Any nonzero byte counts as allowed. */
            uint64_t count = 0;
            for (size_t i = 0; i < n; i++) {
                if (b[i])
                    b[i] = (uint8_t)(1 + tu_below(&rng, 255));
                count += b[i] != 0;
            }
            stof_mask *m = from_dense(ctx, b, sq, sk);
            cr_assert_eq(stof_mask_seq_q(m), sq);
            cr_assert_eq(stof_mask_seq_k(m), sk);
            cr_assert_eq(stof_mask_count(m), count, "%dx%d p=%g", sq, sk,
                         ps[pi]);
            cr_assert_float_eq(stof_mask_density(m), (double)count / (double)n,
                               1e-15);
            cr_assert_eq(m->words_per_row, (sk + 63) / 64);
            uint8_t *back = malloc(n);
            memset(back, 0x55, n);
            stof_mask_to_dense(m, back);
            for (size_t i = 0; i < n; i++)
                if (back[i] != (b[i] != 0))
                    cr_assert_fail("%dx%d p=%g: element %zu is %d, expected %d", sq,
                             sk, ps[pi], i, back[i], b[i] != 0);
            for (int q = 0; q < sq; q += 1 + sq / 7)
                for (int k = 0; k < sk; k++)
                    cr_assert_eq(stof_mask_get(m, q, k), b[(size_t)q * sk + k] != 0);
            cr_assert_eq(stof_mask_get(m, -1, 0), 0);
            cr_assert_eq(stof_mask_get(m, 0, -1), 0);
            cr_assert_eq(stof_mask_get(m, sq, 0), 0);
            cr_assert_eq(stof_mask_get(m, 0, sk), 0);
            /* Padding bits are zero even for all-ones rows. */
            if (sk % 64)
                for (int q = 0; q < sq; q++)
                    cr_assert_eq(m->bits[(size_t)q * m->words_per_row +
                                         m->words_per_row - 1] >>
                                     (sk % 64),
                                 0);
            free(back);
            free(b);
            stof_mask_free(&m);
            cr_assert_null(m);
        }
    }
    stof_close(&ctx);
}

Test(mask, every_byte_value_and_position_packs)
{
    /* One nonzero byte at each position of a 3 x 200 matrix, every value. */
    stof_context *ctx = open_ctx();
    uint8_t b[600];
    for (int pos = 0; pos < 600; pos++) {
        memset(b, 0, sizeof(b));
        b[pos] = (uint8_t)(1 + pos % 255);
        stof_mask *m = from_dense(ctx, b, 3, 200);
        cr_assert_eq(stof_mask_count(m), 1);
        cr_assert_eq(stof_mask_get(m, pos / 200, pos % 200), 1);
        stof_mask_free(&m);
    }
    for (int v = 1; v < 256; v++) {
        memset(b, v, sizeof(b));
        stof_mask *m = from_dense(ctx, b, 3, 200);
        cr_assert_eq(stof_mask_count(m), 600, "byte value %d", v);
        stof_mask_free(&m);
    }
    stof_close(&ctx);
}

Test(mask, spec_and_dense_agree)
{
    stof_context *ctx = open_ctx();
    const char *specs[] = {"causal", "sliding:5|strided:9", "random:0.4:3",
                           "none", "dense", "bigbird:4:3:1:2:9"};
    for (size_t s = 0; s < sizeof(specs) / sizeof(specs[0]); s++) {
        stof_mask *a = from_spec(ctx, specs[s], 70, 133);
        uint8_t *b = malloc(70 * 133);
        stof_mask_to_dense(a, b);
        stof_mask *c = from_dense(ctx, b, 70, 133);
        cr_assert_eq(memcmp(a->bits, c->bits,
                            (size_t)70 * a->words_per_row * sizeof(uint64_t)),
                     0, "%s", specs[s]);
        uint64_t da[2], dc[2];
        char ha[33], hc[33];
        stof_mask_digest(a, da, ha);
        stof_mask_digest(c, dc, hc);
        cr_assert(da[0] == dc[0] && da[1] == dc[1], "%s", specs[s]);
        cr_assert_str_eq(ha, hc);
        free(b);
        stof_mask_free(&a);
        stof_mask_free(&c);
    }
    stof_close(&ctx);
}

/* The digest as stof.h defines it, computed here from the public accessors:
 * the tag, the sizes and every row's 64-bit words, all little-endian. */
static void reference_digest(const stof_mask *m, uint64_t out[2])
{
    int sq = stof_mask_seq_q(m), sk = stof_mask_seq_k(m);
    int wpr = (sk + 63) / 64;
    size_t n = 24 + (size_t)sq * wpr * 8;
    uint8_t *buf = calloc(n, 1);
    cr_assert_not_null(buf);
    memcpy(buf, "STOFMSK1", 8);
    for (int i = 0; i < 8; i++) {
        buf[8 + i] = (uint8_t)((uint64_t)sq >> (8 * i));
        buf[16 + i] = (uint8_t)((uint64_t)sk >> (8 * i));
    }
    for (int q = 0; q < sq; q++)
        for (int k = 0; k < sk; k++)
            if (stof_mask_get(m, q, k))
                buf[24 + ((size_t)q * wpr + k / 64) * 8 + (k % 64) / 8] |=
                    (uint8_t)(1u << (k % 8));
    XXH128_hash_t h = XXH3_128bits(buf, n);
    out[0] = h.high64;
    out[1] = h.low64;
    free(buf);
}

Test(mask, digest_follows_the_documented_stream)
{
    stof_context *ctx = open_ctx();
    const char *specs[] = {"causal", "strided:7", "random:0.5:1", "none"};
    for (size_t s = 0; s < sizeof(specs) / sizeof(specs[0]); s++) {
        for (int d = 0; d < N_DIMS; d++) {
            stof_mask *m = from_spec(ctx, specs[s], dims[d][0], dims[d][1]);
            uint64_t got[2], want[2];
            char hex[33], whex[33];
            stof_mask_digest(m, got, hex);
            reference_digest(m, want);
            cr_assert(got[0] == want[0] && got[1] == want[1], "%s %dx%d",
                      specs[s], dims[d][0], dims[d][1]);
            snprintf(whex, sizeof(whex), "%016llx%016llx",
                     (unsigned long long)want[0], (unsigned long long)want[1]);
            cr_assert_str_eq(hex, whex);
            cr_assert_eq(strlen(hex), 32);
            stof_mask_free(&m);
        }
    }
    stof_close(&ctx);
}

Test(mask, digest_recorded_value)
{
    /* A recorded digest: if this changes, every tuning database key changes
     * with it. Change it only together with the stream's tag. */
    stof_context *ctx = open_ctx();
    stof_mask *m = from_spec(ctx, "causal|strided:3", 5, 70);
    char hex[33];
    stof_mask_digest(m, NULL, hex);
    cr_assert_str_eq(hex, "fd638d6818ee4cc0f03401215eeb6298");
    stof_mask_free(&m);
    stof_close(&ctx);
}

Test(mask, digest_sensitivity)
{
    stof_context *ctx = open_ctx();
    tu_rng rng = {tu_seed() ^ 0x1234};
    int sq = 37, sk = 150;
    uint8_t *b = tu_random_dense(&rng, sq, sk, 0.3);
    stof_mask *m = from_dense(ctx, b, sq, sk);
    uint64_t d0[2];
    stof_mask_digest(m, d0, NULL);
    for (int t = 0; t < 300; t++) {
        size_t i = (size_t)tu_below(&rng, (uint64_t)sq * sk);
        b[i] ^= 1;
        stof_mask *f = from_dense(ctx, b, sq, sk);
        uint64_t d1[2];
        stof_mask_digest(f, d1, NULL);
        cr_assert(d0[0] != d1[0] || d0[1] != d1[1], "flip of element %zu", i);
        stof_mask_free(&f);
        b[i] ^= 1;
    }
    free(b);
    stof_mask_free(&m);

    /* Same bits, different sizes. */
    const int shapes[][2] = {{1, 128}, {2, 64}, {128, 1}, {64, 2}, {1, 127},
                             {1, 64}, {64, 1}, {2, 32}};
    uint64_t seen[8][2];
    for (int s = 0; s < 8; s++) {
        stof_mask *z = from_spec(ctx, "none", shapes[s][0], shapes[s][1]);
        stof_mask_digest(z, seen[s], NULL);
        for (int t = 0; t < s; t++)
            cr_assert(seen[s][0] != seen[t][0] || seen[s][1] != seen[t][1],
                      "%dx%d and %dx%d", shapes[s][0], shapes[s][1],
                      shapes[t][0], shapes[t][1]);
        stof_mask_free(&z);
    }
    /* Dense 1x64 vs dense 64x1: one all-ones word each, different sizes. */
    stof_mask *a = from_spec(ctx, "dense", 1, 64), *c = from_spec(ctx, "dense", 64, 1);
    uint64_t da[2], dc[2];
    stof_mask_digest(a, da, NULL);
    stof_mask_digest(c, dc, NULL);
    cr_assert(da[0] != dc[0] || da[1] != dc[1]);
    stof_mask_free(&a);
    stof_mask_free(&c);
    stof_close(&ctx);
}

/* stof_mask_from_bits gives the mask stof_mask_from_dense gives from the
 * same elements, whatever the padding of each row holds (bits past seq_k,
 * bytes past the row's need). */
Test(mask, packed_bits_give_the_dense_mask)
{
    stof_context *ctx = open_ctx();
    tu_rng rng = {tu_seed()};
    const double ps[] = {0.0, 0.3, 1.0};
    for (int d = 0; d < N_DIMS; d++) {
        for (size_t pi = 0; pi < sizeof(ps) / sizeof(ps[0]); pi++) {
            int sq = dims[d][0], sk = dims[d][1];
            uint8_t *b = tu_random_dense(&rng, sq, sk, ps[pi]);
            cr_assert_not_null(b);
            stof_mask *want = from_dense(ctx, b, sq, sk);
            const size_t need = ((size_t)sk + 7) / 8;
            for (size_t extra = 0; extra <= 9; extra += 9) {
                size_t rb = need + extra;
                uint8_t *bits = malloc((size_t)sq * rb);
                cr_assert_not_null(bits);
                for (size_t i = 0; i < (size_t)sq * rb; i++)
                    bits[i] = (uint8_t)tu_below(&rng, 256); /* padding: noise */
                for (int q = 0; q < sq; q++) {
                    uint8_t *row = bits + (size_t)q * rb;
                    for (int k = 0; k < sk; k++) {
                        uint8_t bit = (uint8_t)(1u << (k % 8));
                        if (b[(size_t)q * sk + k])
                            row[k / 8] |= bit;
                        else
                            row[k / 8] &= (uint8_t)~bit;
                    }
                }
                stof_mask *m = NULL;
                cr_assert_eq(stof_mask_from_bits(ctx, bits, rb, sq, sk, &m), STOF_OK,
                             "%s", stof_errmsg(ctx));
                cr_assert_eq(stof_mask_count(m), stof_mask_count(want),
                             "%dx%d p=%g extra %zu", sq, sk, ps[pi], extra);
                uint64_t dm[2], dw[2];
                stof_mask_digest(m, dm, NULL);
                stof_mask_digest(want, dw, NULL);
                cr_assert(dm[0] == dw[0] && dm[1] == dw[1], "%dx%d p=%g extra %zu",
                          sq, sk, ps[pi], extra);
                for (int q = 0; q < sq; q++)
                    cr_assert_eq(m->bits[(size_t)q * m->words_per_row +
                                         m->words_per_row - 1] &
                                     (sk % 64 ? ~((1ull << (sk % 64)) - 1) : 0),
                                 0, "padding bits set in row %d", q);
                stof_mask_free(&m);
                free(bits);
            }
            stof_mask_free(&want);
            free(b);
        }
    }
    /* Arguments. */
    uint8_t z[8] = {0xff};
    stof_mask *m = (stof_mask *)(uintptr_t)1;
    cr_assert_eq(stof_mask_from_bits(ctx, z, 1, 2, 9, &m), STOF_ERR_INVALID_ARGUMENT);
    cr_assert_null(m);
    cr_assert(strstr(stof_errmsg(ctx), "row_bytes = 1"), "%s", stof_errmsg(ctx));
    cr_assert_eq(stof_mask_from_bits(ctx, NULL, 1, 1, 8, &m), STOF_ERR_INVALID_ARGUMENT);
    cr_assert(strstr(stof_errmsg(ctx), "bits"), "%s", stof_errmsg(ctx));
    cr_assert_eq(stof_mask_from_bits(ctx, z, 1, 0, 8, &m), STOF_ERR_INVALID_ARGUMENT);
    cr_assert(strstr(stof_errmsg(ctx), "seq_q"), "%s", stof_errmsg(ctx));
    cr_assert_eq(stof_mask_from_bits(ctx, z, 1, 1, 1048577, &m),
                 STOF_ERR_INVALID_ARGUMENT);
    cr_assert(strstr(stof_errmsg(ctx), "seq_k"), "%s", stof_errmsg(ctx));
    cr_assert_eq(stof_mask_from_bits(ctx, z, 1, 1, 8, NULL), STOF_ERR_INVALID_ARGUMENT);
    cr_assert_eq(stof_mask_from_bits(ctx, z, 1, 1, 3, &m), STOF_OK);
    cr_assert_eq(stof_mask_count(m), 3); /* 0xff: bits past 3 ignored */
    stof_mask_free(&m);
    stof_close(&ctx);
}

Test(mask, null_arguments)
{
    stof_context *ctx = open_ctx();
    uint8_t b[16] = {1};
    stof_mask *m = (stof_mask *)(uintptr_t)1;
    cr_assert_eq(stof_mask_from_dense(ctx, NULL, 4, 4, &m),
                 STOF_ERR_INVALID_ARGUMENT);
    cr_assert_null(m);
    cr_assert(strstr(stof_errmsg(ctx), "bytes"), "%s", stof_errmsg(ctx));
    cr_assert_eq(stof_mask_from_dense(ctx, b, 4, 4, NULL),
                 STOF_ERR_INVALID_ARGUMENT);
    cr_assert(strstr(stof_errmsg(ctx), "mask"), "%s", stof_errmsg(ctx));
    const int badsz[] = {0, -5, 1048577};
    for (int i = 0; i < 3; i++) {
        cr_assert_eq(stof_mask_from_dense(ctx, b, badsz[i], 4, &m),
                     STOF_ERR_INVALID_ARGUMENT);
        cr_assert(strstr(stof_errmsg(ctx), "seq_q"), "%s", stof_errmsg(ctx));
        cr_assert_eq(stof_mask_from_dense(ctx, b, 4, badsz[i], &m),
                     STOF_ERR_INVALID_ARGUMENT);
        cr_assert(strstr(stof_errmsg(ctx), "seq_k"), "%s", stof_errmsg(ctx));
    }
    cr_assert_eq(stof_mask_from_dense(NULL, b, 4, 4, &m), STOF_OK);
    cr_assert_eq(stof_mask_count(m), 1);
    stof_mask_free(&m);

    stof_mask_free(NULL);
    stof_mask_free(&m);
    cr_assert_eq(stof_mask_seq_q(NULL), 0);
    cr_assert_eq(stof_mask_seq_k(NULL), 0);
    cr_assert_eq(stof_mask_count(NULL), 0);
    cr_assert_eq(stof_mask_density(NULL), 0.0);
    cr_assert_eq(stof_mask_get(NULL, 0, 0), 0);
    stof_mask_to_dense(NULL, b);
    uint64_t d[2] = {1, 1};
    char hex[33];
    stof_mask_digest(NULL, d, hex);
    cr_assert(d[0] == 0 && d[1] == 0);
    cr_assert_str_eq(hex, "00000000000000000000000000000000");
    m = from_spec(ctx, "causal", 4, 4);
    stof_mask_to_dense(m, NULL);
    stof_mask_digest(m, NULL, NULL);
    stof_mask_free(&m);
    stof_close(&ctx);
}

Test(mask, extreme_shapes)
{
    stof_context *ctx = open_ctx();
    size_t n = 1048576;
    uint8_t *b = malloc(n);
    cr_assert_not_null(b);
    for (size_t i = 0; i < n; i++)
        b[i] = (uint8_t)(i % 3 == 0);
    stof_mask *r = from_dense(ctx, b, 1, 1048576);
    stof_mask *c = from_dense(ctx, b, 1048576, 1);
    cr_assert_eq(stof_mask_count(r), (n + 2) / 3);
    cr_assert_eq(stof_mask_count(c), (n + 2) / 3);
    cr_assert_eq(stof_mask_get(r, 0, 1048575), 1048575 % 3 == 0);
    cr_assert_eq(stof_mask_get(c, 1048575, 0), 1048575 % 3 == 0);
    stof_mask_free(&r);
    stof_mask_free(&c);
    free(b);
    stof_close(&ctx);
}

/* Row grouping for masks whose allowed (q, k) all satisfy q = k mod D. */
Test(mask_group, period_detection_and_permutation)
{
    stof_context *ctx = NULL;
    cr_assert_eq(stof_open(&ctx, NULL), STOF_OK);
    static const struct {
        const char *spec;
        int period;
    } cases[] = {
        {"dilated:512:2", 2},  {"dilated:64:3", 3},  {"dilated:100:6", 2},
        {"dilated:33:5", 5},   {"causal", 1},        {"strided:16", 1},
        {"sliding:9", 1},      {"dilated:40:4&causal", 2},
        {"dense", 1},
    };
    for (size_t c = 0; c < sizeof(cases) / sizeof(*cases); c++) {
        stof_mask *m = NULL;
        cr_assert_eq(stof_mask_from_spec(ctx, cases[c].spec, 301, 257, &m),
                     STOF_OK);
        int d = stof__mask_row_period(m);
        cr_assert_eq(d, cases[c].period, "%s: period %d, expected %d",
                     cases[c].spec, d, cases[c].period);
        stof_mask *g = NULL;
        int32_t *perm = NULL;
        cr_assert_eq(stof__mask_group_rows(ctx, m, d, &g, &perm), STOF_OK);
        /* perm is a permutation, grouped by class, and rows moved intact. */
        uint8_t *seen = calloc(301, 1);
        for (int i = 0; i < 301; i++) {
            cr_assert(perm[i] >= 0 && perm[i] < 301 && !seen[perm[i]]);
            seen[perm[i]] = 1;
            if (i > 0)
                cr_assert(perm[i - 1] % d < perm[i] % d ||
                          (perm[i - 1] % d == perm[i] % d && perm[i - 1] < perm[i]));
            for (int k = 0; k < 257; k++)
                cr_assert_eq(stof_mask_get(g, i, k), stof_mask_get(m, perm[i], k));
        }
        cr_assert_eq(stof_mask_count(g), stof_mask_count(m));
        free(seen);
        free(perm);
        stof_mask_free(&g);
        stof_mask_free(&m);
    }
    stof_close(&ctx);
}

/* A mask remembers the spec it came from (tuning records keep it so that
 * `stof-tune verify` can rebuild the mask); dense masks have none. */
Test(mask, keeps_its_spec)
{
    stof_context *ctx = NULL;
    cr_assert_eq(stof_open(&ctx, NULL), STOF_OK);
    stof_mask *m = NULL;
    cr_assert_eq(stof_mask_from_spec(ctx, "causal & sliding:9", 20, 30, &m),
                 STOF_OK);
    cr_assert_str_eq(m->spec, "causal & sliding:9");
    uint8_t b[4] = {1, 0, 1, 1};
    stof_mask *d = NULL;
    cr_assert_eq(stof_mask_from_dense(ctx, b, 2, 2, &d), STOF_OK);
    cr_assert_null(d->spec);
    stof_mask_free(&m);
    stof_mask_free(&d);
    stof_close(&ctx);
}

/* stof_mask_png: a size query (no buffer) fails quietly with the size; a
 * short buffer fails with a message; the picture decodes (zlib) to the
 * colour of each tile kind: a dense tile blue, a tile with one row of
 * alternate keys orange where allowed and pale where not, an empty tile
 * white, tile lines grey. */
Test(mask, png_picture)
{
    stof_context *ctx = NULL;
    cr_assert_eq(stof_open(&ctx, NULL), STOF_OK);
    /* 32 x 32, tiles 16 x 16: keys < 16 of rows < 16 allowed (full tile),
     * row 20's even keys >= 16 (partial), nothing else (empty). */
    uint8_t d[32 * 32] = {0};
    for (int q = 0; q < 16; q++)
        for (int k = 0; k < 16; k++)
            d[q * 32 + k] = 1;
    for (int k = 16; k < 32; k += 2)
        d[20 * 32 + k] = 1;
    stof_mask *m = NULL;
    cr_assert_eq(stof_mask_from_dense(ctx, d, 32, 32, &m), STOF_OK);
    size_t need = 0;
    cr_assert_eq(stof_mask_png(ctx, m, 16, 16, 0, NULL, 0, &need),
                 STOF_ERR_BUFFER_TOO_SMALL);
    cr_assert_gt(need, 8);
    unsigned char *png = malloc(need), small[8];
    cr_assert(png);
    size_t got = 0;
    cr_assert_eq(stof_mask_png(ctx, m, 16, 16, 0, small, 8, &got),
                 STOF_ERR_BUFFER_TOO_SMALL);
    cr_assert(strstr(stof_errmsg(ctx), "bytes"), "%s", stof_errmsg(ctx));
    cr_assert_eq(stof_mask_png(ctx, m, 16, 16, 0, png, need, &got), STOF_OK);
    cr_assert_eq(got, need);
    cr_assert_eq(memcmp(png, "\x89PNG\r\n\x1a\n", 8), 0);
    /* IHDR: 32 x 32, 8-bit RGB; IDAT right after it (33 bytes in). */
    cr_assert_eq(png[19], 32);
    cr_assert_eq(png[23], 32);
    cr_assert_eq(memcmp(png + 37, "IDAT", 4), 0);
    const unsigned len = (unsigned)png[33] << 24 | (unsigned)png[34] << 16 |
                         (unsigned)png[35] << 8 | png[36];
    unsigned char raw[32 * (1 + 96)];
    uLongf n = sizeof(raw);
    cr_assert_eq(uncompress(raw, &n, png + 41, len), Z_OK);
    cr_assert_eq(n, sizeof(raw));
#define PX(y, x) (raw + (y) * 97 + 1 + 3 * (x))
    static const unsigned char blue[3] = {31, 78, 161},
                               white[3] = {255, 255, 255},
                               orange[3] = {230, 110, 0},
                               pale[3] = {255, 236, 204},
                               grey[3] = {205, 205, 205};
    cr_expect_eq(memcmp(PX(3, 3), blue, 3), 0);     /* full tile */
    cr_expect_eq(memcmp(PX(3, 20), white, 3), 0);   /* empty tile */
    cr_expect_eq(memcmp(PX(20, 18), orange, 3), 0); /* allowed, partial */
    cr_expect_eq(memcmp(PX(20, 19), pale, 3), 0);   /* masked, partial */
    cr_expect_eq(memcmp(PX(16, 3), grey, 3), 0);    /* tile line */
#undef PX
    cr_assert_eq(stof_mask_png(ctx, m, 16, 16, 8, png, need, &got),
                 STOF_ERR_INVALID_ARGUMENT);
    cr_assert(strstr(stof_errmsg(ctx), "max_side"), "%s", stof_errmsg(ctx));
    /* A success clears the last error; so does a size query, which says
     * what it is. */
    cr_assert_eq(stof_mask_png(ctx, m, 16, 16, 0, png, need, &got), STOF_OK);
    cr_assert_eq(stof_errcode(ctx), STOF_OK);
    cr_assert_str_eq(stof_errmsg(ctx), "");
    cr_assert_eq(stof_mask_png(ctx, m, 16, 16, 0, NULL, 0, &need),
                 STOF_ERR_BUFFER_TOO_SMALL);
    cr_assert_eq(stof_errcode(ctx), STOF_ERR_BUFFER_TOO_SMALL);
    /* Tiles larger than the mask (up to INT_MAX) draw it as one tile. */
    enum { BIG = 1 << 16 };
    unsigned char *big = malloc(BIG);
    cr_assert(big);
    static const int tiles[3][2] = {{INT_MAX, INT_MAX}, {INT_MAX, 1},
                                    {1, INT_MAX}};
    for (int i = 0; i < 3; i++)
        cr_assert_eq(stof_mask_png(ctx, m, tiles[i][0], tiles[i][1], 0, big,
                                   BIG, &got),
                     STOF_OK, "%d x %d: %s", tiles[i][0], tiles[i][1],
                     stof_errmsg(ctx));
    free(big);
    /* Tiny tiles on a huge mask are refused by name (a tile count beyond
     * 2^24 took gigabytes and hours), before any drawing. */
    stof_mask *huge = NULL;
    cr_assert_eq(stof_mask_from_spec(ctx, "causal", 8192, 8192, &huge),
                 STOF_OK);
    cr_assert_eq(stof_mask_png(ctx, huge, 1, 1, 0, NULL, 0, &got),
                 STOF_ERR_INVALID_ARGUMENT);
    cr_assert(strstr(stof_errmsg(ctx), "larger tiles"), "%s", stof_errmsg(ctx));
    stof_mask_free(&huge);
    free(png);
    stof_mask_free(&m);
    stof_close(&ctx);
}
