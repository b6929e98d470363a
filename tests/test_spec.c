/*
 * test_spec.c - the mask spec language: every leaf against a per-element
 * predicate written here from stof.h's definitions, on odd sizes; unions,
 * intersections and parentheses; the public suite's densities against the
 * peers' figures (BENCH.md); determinism of the seeded leaves; and the
 * messages of bad specs (status, column, what was expected).
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

/* Make a mask or fail the test with the context's message. */
static stof_mask *make(stof_context *ctx, const char *spec, int sq, int sk)
{
    stof_mask *m = NULL;
    stof_status st = stof_mask_from_spec(ctx, spec, sq, sk, &m);
    cr_assert_eq(st, STOF_OK, "spec \"%s\" %dx%d: %s", spec, sq, sk,
                 stof_errmsg(ctx));
    cr_assert_not_null(m);
    cr_assert_eq(stof_mask_seq_q(m), sq);
    cr_assert_eq(stof_mask_seq_k(m), sk);
    return m;
}

static uint8_t *dense_of(const stof_mask *m)
{
    size_t n = (size_t)stof_mask_seq_q(m) * (size_t)stof_mask_seq_k(m);
    uint8_t *b = malloc(n);
    cr_assert_not_null(b);
    memset(b, 0xee, n);
    stof_mask_to_dense(m, b);
    return b;
}

/* Bits past seq_k in every row's last word must be zero. */
static void assert_padding_clear(const stof_mask *m, const char *what)
{
    if (m->seq_k % 64 == 0)
        return;
    uint64_t pad = ~0ull << (m->seq_k % 64);
    for (int q = 0; q < m->seq_q; q++)
        cr_assert_eq(m->bits[(size_t)q * m->words_per_row + m->words_per_row -
                             1] & pad,
                     0, "%s: padding bits set in row %d", what, q);
}

/* ------------------------------------------------------------------------ */
/* Leaves against per-element predicates                                    */
/* ------------------------------------------------------------------------ */

enum { K_DENSE, K_NONE, K_CAUSAL, K_SLIDING, K_CSLIDING, K_DILATED,
       K_LONGFORMER, K_STRIDED };

typedef struct leaf_case {
    int kind;
    long long a, b;
} leaf_case;

static int pred(const leaf_case *c, long long q, long long k)
{
    long long d = q - k, ad = d < 0 ? -d : d;
    switch (c->kind) {
    case K_DENSE:
        return 1;
    case K_NONE:
        return 0;
    case K_CAUSAL:
        return k <= q;
    case K_SLIDING:
        return ad < c->a;
    case K_CSLIDING:
        return k <= q && q - k < c->a;
    case K_DILATED:
        return ad < c->a && d % c->b == 0;
    case K_LONGFORMER:
        return ad < c->a || q < c->b || k < c->b;
    case K_STRIDED:
        return ad < c->a || k % c->a == c->a - 1;
    }
    return -1;
}

static void spec_of(const leaf_case *c, char *buf, size_t n)
{
    switch (c->kind) {
    case K_DENSE:
        snprintf(buf, n, "dense");
        break;
    case K_NONE:
        snprintf(buf, n, "none");
        break;
    case K_CAUSAL:
        snprintf(buf, n, "causal");
        break;
    case K_SLIDING:
        snprintf(buf, n, "sliding:%lld", c->a);
        break;
    case K_CSLIDING:
        snprintf(buf, n, "causal_sliding:%lld", c->a);
        break;
    case K_DILATED:
        snprintf(buf, n, "dilated:%lld:%lld", c->a, c->b);
        break;
    case K_LONGFORMER:
        snprintf(buf, n, "longformer:%lld:%lld", c->a, c->b);
        break;
    case K_STRIDED:
        snprintf(buf, n, "strided:%lld", c->a);
        break;
    }
}

static const int sizes[][2] = {
    {1, 1},     {7, 7},     {63, 63},   {64, 64},    {65, 65},
    {127, 127}, {1, 100},   {100, 1},   {63, 65},    {65, 130},
    {1000, 127}, {127, 1000}, {1000, 1000},
};
#define N_SIZES ((int)(sizeof(sizes) / sizeof(sizes[0])))

static void check_leaf(stof_context *ctx, const leaf_case *c, int sq, int sk)
{
    char spec[128];
    spec_of(c, spec, sizeof(spec));
    stof_mask *m = make(ctx, spec, sq, sk);
    uint8_t *b = dense_of(m);
    uint64_t count = 0;
    for (long long q = 0; q < sq; q++) {
        for (long long k = 0; k < sk; k++) {
            int want = pred(c, q, k);
            count += (uint64_t)want;
            if (b[q * sk + k] != want)
                cr_assert_fail("%s at %dx%d: element (%lld, %lld) is %d, expected %d",
                         spec, sq, sk, q, k, b[q * sk + k], want);
        }
    }
    cr_assert_eq(stof_mask_count(m), count, "%s %dx%d: count %llu vs %llu",
                 spec, sq, sk, (unsigned long long)stof_mask_count(m),
                 (unsigned long long)count);
    assert_padding_clear(m, spec);
    free(b);
    stof_mask_free(&m);
}

static void check_kind_all_sizes(int kind, const long long *as, int na,
                                 const long long *bs, int nb)
{
    stof_context *ctx = open_ctx();
    for (int s = 0; s < N_SIZES; s++)
        for (int i = 0; i < na; i++)
            for (int j = 0; j < nb; j++) {
                leaf_case c = {kind, as[i], bs[j]};
                check_leaf(ctx, &c, sizes[s][0], sizes[s][1]);
            }
    stof_close(&ctx);
}

static const long long widths[] = {1, 2, 3, 31, 63, 64, 65, 128, 999, 5000};
#define N_WIDTHS ((int)(sizeof(widths) / sizeof(widths[0])))
static const long long one[] = {0};

Test(spec, simple_leaves_match_predicates)
{
    check_kind_all_sizes(K_DENSE, one, 1, one, 1);
    check_kind_all_sizes(K_NONE, one, 1, one, 1);
    check_kind_all_sizes(K_CAUSAL, one, 1, one, 1);
}

Test(spec, sliding_matches_predicate)
{
    check_kind_all_sizes(K_SLIDING, widths, N_WIDTHS, one, 1);
    check_kind_all_sizes(K_CSLIDING, widths, N_WIDTHS, one, 1);
}

Test(spec, dilated_matches_predicate)
{
    static const long long ds[] = {1, 2, 3, 7, 63, 64, 65, 100, 2000};
    check_kind_all_sizes(K_DILATED, widths, N_WIDTHS, ds,
                         (int)(sizeof(ds) / sizeof(ds[0])));
}

Test(spec, longformer_matches_predicate)
{
    static const long long gs[] = {0, 1, 5, 64, 65, 300, 5000};
    check_kind_all_sizes(K_LONGFORMER, widths, N_WIDTHS, gs,
                         (int)(sizeof(gs) / sizeof(gs[0])));
}

Test(spec, strided_matches_predicate)
{
    static const long long ss[] = {1, 2, 3, 16, 63, 64, 65, 128, 999, 5000};
    check_kind_all_sizes(K_STRIDED, ss, (int)(sizeof(ss) / sizeof(ss[0])), one,
                         1);
}

Test(spec, large_odd_size_and_huge_parameters)
{
    stof_context *ctx = open_ctx();
    leaf_case cases[] = {
        {K_SLIDING, 256, 0},      {K_DILATED, 512, 2},
        {K_DILATED, 700, 67},     {K_LONGFORMER, 256, 64},
        {K_STRIDED, 128, 0},      {K_CSLIDING, 77, 0},
        {K_SLIDING, 2000000, 0},  {K_DILATED, 3000000, 2500000},
        {K_STRIDED, 2097153, 0},  {K_LONGFORMER, 1, 4000000},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        check_leaf(ctx, &cases[i], 3001, 3001);
        check_leaf(ctx, &cases[i], 1500, 3001);
    }
    stof_close(&ctx);
}

/* ------------------------------------------------------------------------ */
/* bigbird                                                                   */
/* ------------------------------------------------------------------------ */

/* Check bigbird's definition: the mask is constant on B x B blocks, every
 * window and global block is allowed, and the other allowed blocks of a
 * block row are at most R "random" ones (exactly min(R, free) when the
 * draws cannot collide with window/global blocks is not guaranteed, so only
 * the bound and the total are checked). */
static void check_bigbird(stof_context *ctx, int bs, int w, int g, int r,
                          unsigned long long seed, int sq, int sk)
{
    char spec[128];
    snprintf(spec, sizeof(spec), "bigbird:%d:%d:%d:%d:%llu", bs, w, g, r,
             seed);
    stof_mask *m = make(ctx, spec, sq, sk);
    uint8_t *b = dense_of(m);
    int nbq = (sq + bs - 1) / bs, nbk = (sk + bs - 1) / bs;
    for (int i = 0; i < nbq; i++) {
        int extra = 0, allowed_blocks = 0;
        for (int j = 0; j < nbk; j++) {
            int v = b[(size_t)(i * bs) * sk + (size_t)(j * bs)];
            for (int q = i * bs; q < sq && q < (i + 1) * bs; q++)
                for (int k = j * bs; k < sk && k < (j + 1) * bs; k++)
                    if (b[(size_t)q * sk + k] != v)
                        cr_assert_fail("%s %dx%d: block (%d,%d) not uniform at "
                                 "(%d,%d)",
                                 spec, sq, sk, i, j, q, k);
            int structural = i < g || j < g ||
                             (j >= i - (w - 1) / 2 && j <= i + w / 2);
            if (structural && !v)
                cr_assert_fail("%s %dx%d: window/global block (%d,%d) is masked",
                         spec, sq, sk, i, j);
            if (!structural && v)
                extra++;
            allowed_blocks += v;
        }
        if (i >= g) {
            cr_assert_leq(extra, r, "%s: block row %d has %d random blocks",
                          spec, i, extra);
            if (r >= nbk)
                cr_assert_eq(allowed_blocks, nbk);
        }
    }
    assert_padding_clear(m, spec);
    free(b);
    stof_mask_free(&m);
}

Test(spec, bigbird_structure)
{
    stof_context *ctx = open_ctx();
    check_bigbird(ctx, 64, 3, 2, 3, 1, 1024, 1024);
    check_bigbird(ctx, 16, 1, 0, 0, 7, 100, 300);
    check_bigbird(ctx, 16, 2, 1, 1, 7, 300, 100);
    check_bigbird(ctx, 7, 4, 3, 5, 99, 333, 257);
    check_bigbird(ctx, 1, 3, 1, 2, 5, 65, 65);
    check_bigbird(ctx, 32, 3, 0, 100, 5, 200, 200);  /* R >= column blocks */
    check_bigbird(ctx, 1000, 3, 0, 1, 5, 10, 10);    /* one block */
    check_bigbird(ctx, 64, 3, 2, 3, 18446744073709551615ull, 1000, 1000);
    stof_close(&ctx);
}

Test(spec, bigbird_random_blocks_are_distinct_and_counted)
{
    /* With no window overlap possible (W = 1, G = 0, R draws), every block
     * row has exactly 1 + R' allowed blocks where R' counts draws off the
     * diagonal: R or R - 1. */
    stof_context *ctx = open_ctx();
    stof_mask *m = make(ctx, "bigbird:8:1:0:5:42", 400, 400);
    for (int i = 0; i < 50; i++) {
        int n = 0;
        for (int j = 0; j < 50; j++)
            n += stof_mask_get(m, i * 8, j * 8);
        cr_assert(n == 5 || n == 6, "block row %d has %d blocks", i, n);
    }
    stof_mask_free(&m);
    stof_close(&ctx);
}

/* ------------------------------------------------------------------------ */
/* Combinations                                                              */
/* ------------------------------------------------------------------------ */

static uint8_t *dense_spec(stof_context *ctx, const char *spec, int sq, int sk)
{
    stof_mask *m = make(ctx, spec, sq, sk);
    uint8_t *b = dense_of(m);
    stof_mask_free(&m);
    return b;
}

Test(spec, union_intersection_and_parentheses)
{
    stof_context *ctx = open_ctx();
    const char *a = "sliding:9", *bb = "strided:17", *c = "causal",
               *d = "random:0.3:5";
    const int dims[][2] = {{1, 1}, {70, 130}, {131, 64}, {200, 200}};
    for (int s = 0; s < 4; s++) {
        int sq = dims[s][0], sk = dims[s][1];
        size_t n = (size_t)sq * sk;
        uint8_t *ma = dense_spec(ctx, a, sq, sk), *mb = dense_spec(ctx, bb, sq, sk),
                *mc = dense_spec(ctx, c, sq, sk), *md = dense_spec(ctx, d, sq, sk);
        struct {
            const char *spec;
            int form;
        } combos[] = {
            {"sliding:9|strided:17&causal", 0},        /* a | (b & c) */
            {"(sliding:9|strided:17)&causal", 1},      /* (a | b) & c */
            {"strided:17&causal|sliding:9", 0},        /* (b & c) | a */
            {" ( sliding : 9 | strided:17 ) & causal ", 1},
            {"sliding:9&strided:17&causal", 2},        /* a & b & c */
            {"sliding:9|strided:17|causal", 3},        /* a | b | c */
            {"(((sliding:9)))&(strided:17|causal)", 4},/* a & (b | c) */
            {"sliding:9&random:0.3:5|strided:17&causal&random:0.3:5", 5},
            {"none|sliding:9", 6},
            {"dense&sliding:9", 6},
            {"dense&(none|(sliding:9&dense))", 6},
        };
        for (size_t t = 0; t < sizeof(combos) / sizeof(combos[0]); t++) {
            uint8_t *got = dense_spec(ctx, combos[t].spec, sq, sk);
            for (size_t i = 0; i < n; i++) {
                int want = 0;
                switch (combos[t].form) {
                case 0: want = ma[i] | (mb[i] & mc[i]); break;
                case 1: want = (ma[i] | mb[i]) & mc[i]; break;
                case 2: want = ma[i] & mb[i] & mc[i]; break;
                case 3: want = ma[i] | mb[i] | mc[i]; break;
                case 4: want = ma[i] & (mb[i] | mc[i]); break;
                case 5: want = (ma[i] & md[i]) | (mb[i] & mc[i] & md[i]); break;
                case 6: want = ma[i]; break;
                }
                if (got[i] != want)
                    cr_assert_fail("%s %dx%d: element %zu is %d, expected %d",
                             combos[t].spec, sq, sk, i, got[i], want);
            }
            free(got);
        }
        free(ma);
        free(mb);
        free(mc);
        free(md);
    }
    stof_close(&ctx);
}

Test(spec, long_chains_and_deep_nesting)
{
    stof_context *ctx = open_ctx();
    /* A 5000-operand union is one wide node, not a deep tree. */
    size_t cap = 5000 * 12 + 1;
    char *s = malloc(cap);
    cr_assert_not_null(s);
    s[0] = '\0';
    for (int i = 0; i < 5000; i++)
        strcat(s, i ? "|sliding:3" : "sliding:3");
    stof_mask *m = make(ctx, s, 50, 50);
    stof_mask *ref = make(ctx, "sliding:3", 50, 50);
    cr_assert_eq(stof_mask_count(m), stof_mask_count(ref));
    stof_mask_free(&m);
    stof_mask_free(&ref);

    /* 64 levels of parentheses are accepted, 65 are refused. */
    char deep[256];
    for (int depth = 63; depth <= 65; depth++) {
        int o = 0;
        for (int i = 0; i < depth; i++)
            deep[o++] = '(';
        o += sprintf(deep + o, "causal");
        for (int i = 0; i < depth; i++)
            deep[o++] = ')';
        deep[o] = '\0';
        stof_status st = stof_mask_from_spec(ctx, deep, 10, 10, &m);
        if (depth <= 64) {
            cr_assert_eq(st, STOF_OK, "depth %d: %s", depth, stof_errmsg(ctx));
            cr_assert_eq(stof_mask_count(m), 55);
            stof_mask_free(&m);
        } else {
            cr_assert_eq(st, STOF_ERR_INVALID_ARGUMENT);
            cr_assert_null(m);
            cr_assert(strstr(stof_errmsg(ctx), "column 65"), "%s",
                      stof_errmsg(ctx));
            cr_assert(strstr(stof_errmsg(ctx), "deeper than 64"), "%s",
                      stof_errmsg(ctx));
        }
    }
    /* Alternating operators at full depth. */
    int o = 0;
    char alt[2048];
    for (int i = 0; i < 64; i++)
        o += sprintf(alt + o, "(dense&none|");
    o += sprintf(alt + o, "causal");
    for (int i = 0; i < 64; i++)
        alt[o++] = ')';
    alt[o] = '\0';
    m = make(ctx, alt, 10, 10);
    cr_assert_eq(stof_mask_count(m), 55);
    stof_mask_free(&m);
    free(s);
    stof_close(&ctx);
}

/* ------------------------------------------------------------------------ */
/* The public suite against the peers' densities                            */
/* ------------------------------------------------------------------------ */

Test(spec, public_suite_densities_match_peers)
{
    /* From /work/shared/peers/flex_anchor_h200.json (PyTorch masks). */
    static const struct {
        const char *spec;
        int seq;
        double density;
        double tol; /* 0 = exact */
    } want[] = {
        {"dense", 1024, 1.0, 0},
        {"causal", 1024, 0.50048828125, 0},
        {"sliding:256", 1024, 0.436767578125, 0},
        {"dilated:512:2", 1024, 0.37451171875, 0},
        {"longformer:256:64", 1024, 0.52667236328125, 0},
        {"strided:128", 1024, 0.23950862884521484, 0},
        {"bigbird:64:3:2:3:1", 1024, 0.49609375, 0.03},
        {"dense", 4096, 1.0, 0},
        {"causal", 4096, 0.5001220703125, 0},
        {"sliding:256", 4096, 0.1208648681640625, 0},
        {"dilated:512:2", 4096, 0.116973876953125, 0},
        {"longformer:256:64", 4096, 0.14992141723632812, 0},
        {"strided:128", 4096, 0.06862062215805054, 0},
        {"bigbird:64:3:2:3:1", 4096, 0.148193359375, 0.005},
        {"causal", 8192, 0.50006103515625, 0},
        {"sliding:256", 8192, 0.061405181884765625, 0},
        {"dilated:512:2", 8192, 0.06043243408203125, 0},
        {"longformer:256:64", 8192, 0.07648181915283203, 0},
        {"strided:128", 8192, 0.03845690190792084, 0},
        {"bigbird:64:3:2:3:1", 8192, 0.07611083984375, 0.003},
    };
    stof_context *ctx = open_ctx();
    for (size_t i = 0; i < sizeof(want) / sizeof(want[0]); i++) {
        stof_mask *m = make(ctx, want[i].spec, want[i].seq, want[i].seq);
        double d = stof_mask_density(m);
        double n2 = (double)want[i].seq * want[i].seq;
        if (want[i].tol == 0)
            cr_assert_eq((double)stof_mask_count(m),
                         (double)(long long)(want[i].density * n2 + 0.5),
                         "%s at %d: density %.17g, peers %.17g", want[i].spec,
                         want[i].seq, d, want[i].density);
        else
            cr_assert(d > want[i].density - want[i].tol &&
                          d < want[i].density + want[i].tol,
                      "%s at %d: density %.6f, peers %.6f", want[i].spec,
                      want[i].seq, d, want[i].density);
        stof_mask_free(&m);
    }
    stof_close(&ctx);
}

/* ------------------------------------------------------------------------ */
/* Seeded leaves                                                             */
/* ------------------------------------------------------------------------ */

static void digest_of(stof_context *ctx, const char *spec, int sq, int sk,
                      uint64_t d[2])
{
    stof_mask *m = make(ctx, spec, sq, sk);
    stof_mask_digest(m, d, NULL);
    stof_mask_free(&m);
}

Test(spec, seeded_leaves_are_deterministic_and_seed_dependent)
{
    stof_context *ctx = open_ctx();
    uint64_t seed = tu_seed();
    const char *forms[] = {"random:0.3:%llu", "random:0.01:%llu",
                           "random:0.999:%llu", "bigbird:16:3:1:2:%llu",
                           "bigbird:8:1:0:3:%llu"};
    for (size_t f = 0; f < sizeof(forms) / sizeof(forms[0]); f++) {
        char s1[64], s2[64];
        snprintf(s1, sizeof(s1), forms[f], (unsigned long long)seed);
        snprintf(s2, sizeof(s2), forms[f], (unsigned long long)(seed + 1));
        uint64_t a[2], b[2], c[2];
        digest_of(ctx, s1, 300, 257, a);
        digest_of(ctx, s1, 300, 257, b);
        digest_of(ctx, s2, 300, 257, c);
        cr_assert(a[0] == b[0] && a[1] == b[1], "%s is not deterministic", s1);
        cr_assert(a[0] != c[0] || a[1] != c[1], "%s and %s are equal", s1, s2);
    }
    stof_close(&ctx);
}

/* A random mask's element (q, k) does not depend on the mask's width: the
 * mask at 200 x 640 is the first 640 keys of the mask at 200 x 6400 (and
 * of 200 x 641), for probabilities on both paths of the generator (the
 * word cascade with its remainder, and the skipping alone). So a family's
 * random pattern over old keys stays as its cache grows. */
Test(spec, random_bits_do_not_depend_on_the_width)
{
    stof_context *ctx = open_ctx();
    const uint64_t seed = tu_seed();
    const double ps[] = {0.49, 0.0058, 0.003, 0.3, 0.77};
    const int wide_k[] = {641, 6400, 700};
    char spec[64];
    for (size_t i = 0; i < sizeof(ps) / sizeof(ps[0]); i++) {
        snprintf(spec, sizeof(spec), "random:%.4f:%llu", ps[i],
                 (unsigned long long)seed);
        stof_mask *base = make(ctx, spec, 200, 640);
        for (size_t w = 0; w < sizeof(wide_k) / sizeof(wide_k[0]); w++) {
            stof_mask *wide = make(ctx, spec, 200, wide_k[w]);
            int diff = 0;
            for (int q = 0; q < 200; q++)
                for (int k = 0; k < 640; k++)
                    diff += stof_mask_get(base, q, k) != stof_mask_get(wide, q, k);
            cr_assert_eq(diff, 0, "%s: %d of the first 640 keys differ at "
                                  "200 x %d",
                         spec, diff, wide_k[w]);
            stof_mask_free(&wide);
        }
        stof_mask_free(&base);
    }
    stof_close(&ctx);
}

Test(spec, random_density_and_edge_probabilities)
{
    stof_context *ctx = open_ctx();
    uint64_t seed = tu_seed();
    const double ps[] = {0.001, 0.01, 0.0624, 0.0625, 0.1, 0.3, 0.5, 0.77,
                         0.999};
    char spec[64];
    for (size_t i = 0; i < sizeof(ps) / sizeof(ps[0]); i++) {
        snprintf(spec, sizeof(spec), "random:%.4f:%llu", ps[i],
                 (unsigned long long)seed);
        stof_mask *m = make(ctx, spec, 1000, 999);
        double n = 1000.0 * 999.0;
        double mean = ps[i] * n, sd = sqrt(n * ps[i] * (1 - ps[i]));
        double got = (double)stof_mask_count(m);
        cr_assert(got > mean - 6 * sd && got < mean + 6 * sd,
                  "%s: %g allowed, expected %g +- %g", spec, got, mean, sd);
        /* Rows differ from each other. */
        int differ = 0;
        for (int k = 0; k < 999 && !differ; k++)
            differ = stof_mask_get(m, 0, k) != stof_mask_get(m, 1, k);
        cr_assert(differ || ps[i] > 0.99 || ps[i] < 0.01, "%s: rows 0 and 1 equal",
                  spec);
        /* Columns are not biased: first and second half agree. */
        uint64_t lo = 0, hi = 0;
        for (int q = 0; q < 1000; q++)
            for (int k = 0; k < 999; k++)
                *(k < 500 ? &lo : &hi) += (uint64_t)stof_mask_get(m, q, k);
        double elo = ps[i] * 1000.0 * 500.0, ehi = ps[i] * 1000.0 * 499.0;
        cr_assert(fabs((double)lo - elo) < 6 * sd + 10 &&
                      fabs((double)hi - ehi) < 6 * sd + 10,
                  "%s: halves %llu / %llu", spec, (unsigned long long)lo,
                  (unsigned long long)hi);
        assert_padding_clear(m, spec);
        stof_mask_free(&m);
    }
    stof_mask *m = make(ctx, "random:0:1", 77, 130);
    cr_assert_eq(stof_mask_count(m), 0);
    stof_mask_free(&m);
    m = make(ctx, "random:1:1", 77, 130);
    cr_assert_eq(stof_mask_count(m), 77 * 130);
    stof_mask_free(&m);
    m = make(ctx, "random:1.000:1", 77, 130);
    cr_assert_eq(stof_mask_count(m), 77 * 130);
    stof_mask_free(&m);
    m = make(ctx, "random:.5:18446744073709551615", 77, 130);
    stof_mask_free(&m);
    m = make(ctx, "random:0.000000000000000000000000001:1", 77, 130);
    cr_assert_eq(stof_mask_count(m), 0);
    stof_mask_free(&m);
    stof_close(&ctx);
}

/* ------------------------------------------------------------------------ */
/* Bad specs                                                                 */
/* ------------------------------------------------------------------------ */

typedef struct bad_case {
    const char *spec;
    int column;       /* 0: no column expected */
    const char *text; /* a substring of the message */
} bad_case;

static const bad_case bad[] = {
    {"", 1, "empty spec"},
    {"   ", 4, "empty spec"},
    {"sliding:x", 9, "expected a positive integer for W"},
    {"sliding", 8, "expected ':'"},
    {"sliding:", 9, "expected a positive integer for W"},
    {"sliding:0", 9, "positive integer for W"},
    {"sliding:-3", 9, "positive integer for W"},
    {"sliding:+3", 9, "positive integer for W"},
    {"sliding:256x", 12, "unexpected 'x'"},
    {"sliding:2.5", 10, "unexpected '.'"},
    {"sliding:99999999999999999999", 9, "64 bits"},
    {"sliding:3:4", 10, "takes 1 parameter"},
    {"dense:3", 6, "takes no parameters"},
    {"foo", 1, "unknown mask \"foo\""},
    {"causal|sliding:3&Dense", 18, "unknown mask"},
    {"slidingx:3", 1, "unknown mask"},
    {"(causal", 8, "missing ')'"},
    {"((causal)", 10, "missing ')' for the '(' at column 1"},
    {"causal)", 7, "unmatched ')'"},
    {"causal|", 8, "expected a mask name, '!' or '('"},
    {"causal||dense", 8, "expected a mask name, '!' or '('"},
    {"&causal", 1, "expected a mask name, '!' or '('"},
    {"causal dense", 8, "unexpected 'd'"},
    {"(causal dense)", 9, "expected '&', '|' or ')'"},
    {"()", 2, "expected a mask name, '!' or '('"},
    {"causal&()", 9, "expected a mask name"},
    {"random:1.5:3", 8, "from 0 to 1"},
    {"random:.:3", 8, "decimal number from 0 to 1 for P"},
    {"random:-0.5:3", 8, "decimal number"},
    {"random:0.5", 11, "SEED"},
    {"random:0.5:", 12, "unsigned 64-bit integer for SEED"},
    {"random:0.5:18446744073709551616", 12, "64 bits"},
    {"bigbird:64:3:2:3", 17, "SEED"},
    {"bigbird:64:0:2:3:1", 12, "positive integer for W of bigbird"},
    {"bigbird:0:3:2:3:1", 9, "positive integer for B"},
    {"longformer:256:-1", 16, "non-negative integer for G"},
    {"dilated:5", 10, "D of dilated"},
    {"strided:", 9, "S of strided"},
    {"causal\xff", 7, "unexpected byte 0xff"},
    {"causal\"", 7, "unexpected '\"'"},
    {"sliding: 1 2", 12, "unexpected '2'"},
};

Test(spec, bad_specs_name_the_column_and_the_problem)
{
    stof_context *ctx = open_ctx();
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        stof_mask *m = (stof_mask *)(uintptr_t)1; /* must be reset to NULL */
        stof_status st = stof_mask_from_spec(ctx, bad[i].spec, 64, 64, &m);
        const char *msg = stof_errmsg(ctx);
        cr_assert_eq(st, STOF_ERR_INVALID_ARGUMENT, "\"%s\" gave %s",
                     bad[i].spec, stof_status_name(st));
        cr_assert_eq(stof_errcode(ctx), STOF_ERR_INVALID_ARGUMENT);
        cr_assert_null(m, "\"%s\": *mask not reset", bad[i].spec);
        char col[32];
        snprintf(col, sizeof(col), "column %d:", bad[i].column);
        cr_assert(strstr(msg, col), "\"%s\": expected \"%s\" in: %s",
                  bad[i].spec, col, msg);
        cr_assert(strstr(msg, bad[i].text), "\"%s\": expected \"%s\" in: %s",
                  bad[i].spec, bad[i].text, msg);
        cr_assert(strncmp(msg, "spec \"", 6) == 0, "%s", msg);
    }
    /* The unknown-name message lists the valid names. */
    stof_mask *m;
    stof_mask_from_spec(ctx, "slidng:3", 8, 8, &m);
    const char *msg = stof_errmsg(ctx);
    const char *names[] = {"dense", "none", "causal", "sliding",
                           "causal_sliding", "dilated", "longformer",
                           "bigbird", "strided", "random"};
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++)
        cr_assert(strstr(msg, names[i]), "%s not in: %s", names[i], msg);
    /* A success clears the message. */
    m = make(ctx, "causal", 8, 8);
    cr_assert_str_eq(stof_errmsg(ctx), "");
    stof_mask_free(&m);
    stof_close(&ctx);
}

Test(spec, bad_arguments)
{
    stof_context *ctx = open_ctx();
    stof_mask *m = (stof_mask *)(uintptr_t)1;
    cr_assert_eq(stof_mask_from_spec(ctx, NULL, 8, 8, &m),
                 STOF_ERR_INVALID_ARGUMENT);
    cr_assert_null(m);
    cr_assert(strstr(stof_errmsg(ctx), "spec is NULL"), "%s", stof_errmsg(ctx));
    cr_assert_eq(stof_mask_from_spec(ctx, "causal", 8, 8, NULL),
                 STOF_ERR_INVALID_ARGUMENT);
    cr_assert(strstr(stof_errmsg(ctx), "mask is NULL"), "%s", stof_errmsg(ctx));
    const int badsz[] = {0, -1, 1048577, -2147483647 - 1};
    for (size_t i = 0; i < sizeof(badsz) / sizeof(badsz[0]); i++) {
        cr_assert_eq(stof_mask_from_spec(ctx, "causal", badsz[i], 8, &m),
                     STOF_ERR_INVALID_ARGUMENT);
        cr_assert(strstr(stof_errmsg(ctx), "seq_q"), "%s", stof_errmsg(ctx));
        cr_assert_eq(stof_mask_from_spec(ctx, "causal", 8, badsz[i], &m),
                     STOF_ERR_INVALID_ARGUMENT);
        cr_assert(strstr(stof_errmsg(ctx), "seq_k"), "%s", stof_errmsg(ctx));
        cr_assert_null(m);
    }
    /* A NULL context is allowed: only the status comes back. */
    cr_assert_eq(stof_mask_from_spec(NULL, "bogus", 8, 8, &m),
                 STOF_ERR_INVALID_ARGUMENT);
    cr_assert_eq(stof_mask_from_spec(NULL, "causal", 8, 8, &m), STOF_OK);
    cr_assert_eq(stof_mask_count(m), 36);
    stof_mask_free(&m);
    /* The extreme sizes work. */
    m = make(ctx, "sliding:3|strided:1000", 1, 1048576);
    cr_assert_eq(stof_mask_count(m), 1000 + 1047); /* strided has its own band */
    stof_mask_free(&m);
    m = make(ctx, "causal", 1048576, 1);
    cr_assert_eq(stof_mask_count(m), 1048576);
    stof_mask_free(&m);
    stof_close(&ctx);
}

Test(spec, long_bad_spec_message_is_bounded)
{
    stof_context *ctx = open_ctx();
    size_t n = 100000;
    char *s = malloc(n + 1);
    cr_assert_not_null(s);
    memset(s, '(', n);
    s[n] = '\0';
    stof_mask *m;
    cr_assert_eq(stof_mask_from_spec(ctx, s, 8, 8, &m),
                 STOF_ERR_INVALID_ARGUMENT);
    cr_assert(strlen(stof_errmsg(ctx)) < 1024, "%zu", strlen(stof_errmsg(ctx)));
    cr_assert(strstr(stof_errmsg(ctx), "..."), "%s", stof_errmsg(ctx));
    memset(s, 'a', n);
    cr_assert_eq(stof_mask_from_spec(ctx, s, 8, 8, &m),
                 STOF_ERR_INVALID_ARGUMENT);
    cr_assert(strstr(stof_errmsg(ctx), "unknown mask"), "%s", stof_errmsg(ctx));
    free(s);
    stof_close(&ctx);
}

Test(spec, whitespace_is_ignored_between_tokens)
{
    stof_context *ctx = open_ctx();
    uint64_t a[2], b[2];
    digest_of(ctx, "longformer:20:3|strided:7&causal", 90, 110, a);
    digest_of(ctx, " \tlongformer : 20 :3\n|\r strided:\v7 & causal\f ", 90, 110,
              b);
    cr_assert(a[0] == b[0] && a[1] == b[1]);
    stof_close(&ctx);
}
