/*
 * test_gemm_cpu.c - the CPU side of the GEMM template (src/kernels/gemm.c): which
 * configurations are refused and why, the shared memory formula, the JSON
 * round trip, the candidates of the layer shapes, the cost model's sanity,
 * and the references (activations, norms, rounding, RoPE) on small
 * hand-checked cases; the RoPE table against libm. No GPU.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "blaslt.h"
#include "gemm.h"
#include "internal.h"

/* c with epilogue e at N x K: valid (the reason printed if not), or
 * refused (`why` then holds the reason). Both need a `char why[]`. */
#define EXPECT_CFG_OK(c, e, N, K)                                              \
    cr_expect(stof__gemm_cfg_valid(NULL, (c), (e), (N), (K), why,              \
                                   sizeof(why)),                               \
              "%s", why)
#define EXPECT_CFG_REFUSED(c, e, N, K)                                         \
    cr_expect_not(stof__gemm_cfg_valid(NULL, (c), (e), (N), (K), why,          \
                                       sizeof(why)))

static const stof_gemm_epi plain = {0, 0, 0, 0, 0, 0, 0, 0};

Test(gemm_cpu, valid_and_invalid)
{
    char why[256];
    stof_gemm_cfg c = {128, 128, 32, 2, 4, 3, 0, 1, 0};
    cr_assert(stof__gemm_cfg_valid(NULL, &c, &plain, 768, 768, why,
                                   sizeof(why)),
              "%s", why);
    static const struct {
        stof_gemm_cfg c;
        stof_gemm_epi e;
        int N, K;
        const char *needle;
    } bad[] = {
        {{128, 128, 32, 2, 4, 3, 0, 1, 0}, {0, 0, 0, 0, 0, 0, 0, 0}, 100, 768, "N 100"},
        {{128, 128, 32, 2, 4, 3, 0, 1, 0}, {0, 0, 0, 0, 0, 0, 0, 0}, 768, 20, "K 20"},
        {{96, 128, 32, 2, 4, 3, 0, 1, 0}, {0, 0, 0, 0, 0, 0, 0, 0}, 768, 768, "block_m"},
        {{128, 48, 32, 2, 4, 3, 0, 1, 0}, {0, 0, 0, 0, 0, 0, 0, 0}, 768, 768, "block_n"},
        {{128, 128, 16, 2, 4, 3, 0, 1, 0}, {0, 0, 0, 0, 0, 0, 0, 0}, 768, 768, "block_k"},
        {{128, 128, 32, 4, 4, 3, 0, 1, 0}, {0, 0, 0, 0, 0, 0, 0, 0}, 768, 768, "warps"},
        {{16, 128, 32, 2, 2, 3, 0, 1, 0}, {0, 0, 0, 0, 0, 0, 0, 0}, 768, 768, "of 16"},
        {{256, 256, 32, 2, 2, 3, 0, 1, 0}, {0, 0, 0, 0, 0, 0, 0, 0}, 768, 768, "accumul"},
        {{128, 128, 32, 2, 4, 1, 0, 1, 0}, {0, 0, 0, 0, 0, 0, 0, 0}, 768, 768, "stages"},
        {{128, 128, 32, 2, 4, 3, 0, 1, 0}, {0, 7, 0, 0, 0, 0, 0, 0}, 768, 768, "act 7"},
        {{128, 128, 32, 2, 4, 3, 0, 1, 0}, {0, 0, 0, 3, 0, 0, 0, 0}, 768, 768, "norm 3"},
        {{64, 64, 32, 2, 2, 3, 0, 1, 0}, {0, 1, 0, 1, 0, 0, 0, 0}, 768, 768, "act = none"},
        {{128, 128, 32, 2, 4, 3, 0, 1, 0}, {0, 0, 0, 0, 1, 0, 0, 0}, 768, 768, "write_pre"},
        {{64, 128, 32, 2, 4, 3, 0, 1, 0}, {0, 0, 1, 1, 1, 0, 0, 0}, 4096, 768, "shared"},
        {{128, 128, 32, 2, 4, 3, 0, 1, 0}, {2, 0, 0, 0, 0, 0, 0, 0}, 768, 768, "0 or 1"},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(*bad); i++) {
        why[0] = '\0';
        cr_expect_not(stof__gemm_cfg_valid(NULL, &bad[i].c, &bad[i].e,
                                           bad[i].N, bad[i].K, why,
                                           sizeof(why)),
                      "case %zu accepted", i);
        cr_expect(strstr(why, bad[i].needle) != NULL,
                  "case %zu: reason '%s' lacks '%s'", i, why, bad[i].needle);
    }
    cr_expect_not(stof__gemm_cfg_valid(NULL, NULL, &plain, 8, 8, NULL, 0));
    /* A device with little shared memory refuses a large pipeline. */
    stof_device dev;
    memset(&dev, 0, sizeof(dev));
    dev.ok = 1;
    dev.sm_count = 108;
    dev.max_smem_optin = 48 * 1024;
    stof_gemm_cfg big = {128, 256, 32, 2, 4, 4, 0, 1, 0};
    cr_expect_not(stof__gemm_cfg_valid(&dev, &big, &plain, 768, 768, why,
                                       sizeof(why)));
    cr_expect(strstr(why, "device") != NULL, "%s", why);
}

Test(gemm_cpu, smem_bytes)
{
    stof_gemm_cfg c = {128, 128, 32, 2, 4, 3, 0, 1, 0};
    /* 3 stages x 256 rows x 40 elements x 2 bytes. */
    cr_expect_eq(stof__gemm_smem_bytes(&c, &plain, 768), 3u * 256 * 40 * 2);
    stof_gemm_cfg s = {128, 256, 32, 2, 4, 2, 0, 1, 0};
    /* The staging tile 128 x 264 is larger than 2 x 384 x 40. */
    cr_expect_eq(stof__gemm_smem_bytes(&s, &plain, 768), 128u * 264 * 2);
    stof_gemm_epi ln = {1, 0, 1, 1, 1, 0, 0, 0};
    stof_gemm_cfg n = {32, 128, 32, 2, 4, 3, 0, 1, 0};
    cr_expect_eq(stof__gemm_smem_bytes(&n, &ln, 768),
                 3u * 160 * 40 * 2 + 32u * 776 * 2);
    cr_expect_eq(stof__gemm_smem_bytes(NULL, &plain, 768), 0);
}

Test(gemm_cpu, json_round_trip)
{
    stof_gemm_cfg c = {128, 256, 64, 2, 4, 4, 0, 1, 0}, c2;
    stof_gemm_epi e = {1, 2, 1, 0, 0, 0, 0, 0}, e2;
    stof_str s = {0};
    stof__gemm_cfg_json(&c, &e, &s);
    cr_assert(s.p && !s.oom);
    cr_expect_str_eq(s.p, "{\"bm\":128,\"bn\":256,\"bk\":64,\"wm\":2,\"wn\":4,"
                          "\"st\":4,\"bias\":1,\"act\":2,\"res\":1,"
                          "\"norm\":0,\"pre\":0}");
    cr_assert(stof__gemm_cfg_parse(s.p, &c2, &e2));
    cr_expect_eq(memcmp(&c, &c2, sizeof(c)), 0);
    cr_expect_eq(memcmp(&e, &e2, sizeof(e)), 0);
    stof__str_free(&s);
    /* A Hopper kernel in pairs of CTAs keeps "wg" and "cl". */
    const stof_gemm_cfg pair = {128, 256, 64, 2, 1, 3, 1, 2, 0};
    stof__gemm_cfg_json(&pair, &e, &s);
    cr_assert(s.p && !s.oom);
    cr_expect(strstr(s.p, "\"wg\":1,\"cl\":2}") != NULL, "%s", s.p);
    cr_assert(stof__gemm_cfg_parse(s.p, &c2, &e2));
    cr_expect_eq(memcmp(&pair, &c2, sizeof(c2)), 0);
    stof__str_free(&s);
    /* Whitespace and key order do not matter. */
    cr_expect(stof__gemm_cfg_parse(
        " { \"pre\" : 1, \"norm\":1,\"res\":1,\"act\":0,\"bias\":1,\"st\":3,"
        "\"wn\":4,\"wm\":2,\"bk\":32,\"bn\":128,\"bm\":32 } ",
        &c2, &e2));
    cr_expect_eq(c2.block_m, 32);
    cr_expect_eq(e2.write_pre, 1);
    static const char *bad[] = {
        "", "{}", "{\"bm\":128}", "[1]", "{\"bm\":128,\"bn\":256,\"bk\":64,"
        "\"wm\":2,\"wn\":4,\"st\":4,\"bias\":1,\"act\":2,\"res\":1,\"norm\":0,"
        "\"pre\":0,\"bm\":1}",
        "{\"bm\":x,\"bn\":256,\"bk\":64,\"wm\":2,\"wn\":4,\"st\":4,\"bias\":1,"
        "\"act\":2,\"res\":1,\"norm\":0,\"pre\":0}",
        "{\"bm\":128,\"bn\":256,\"bk\":64,\"wm\":2,\"wn\":4,\"st\":4,\"bias\":1,"
        "\"act\":2,\"res\":1,\"norm\":0,\"pre\":0} x",
        "{\"bm\":128,\"bn\":256,\"bk\":64,\"wm\":2,\"wn\":4,\"st\":4,\"bias\":1,"
        "\"act\":2,\"res\":1,\"norm\":0,\"zz\":0}",
        NULL};
    for (int i = 0; bad[i]; i++)
        cr_expect_not(stof__gemm_cfg_parse(bad[i], &c2, &e2), "accepted %s",
                      bad[i]);
    cr_expect_not(stof__gemm_cfg_parse(NULL, &c2, &e2));
}

Test(gemm_cpu, candidates_of_layer_shapes)
{
    static const int shapes[][3] = {{4096, 768, 768},   {4096, 2304, 768},
                                    {4096, 3072, 768},  {4096, 768, 3072},
                                    {128, 768, 768},    {128, 3072, 768},
                                    {128, 768, 3072},   {512, 2304, 768},
                                    {1, 768, 768},      {100, 200, 72}};
    stof_gemm_epi epis[] = {{1, 1, 0, 0, 0, 0, 0, 0}, {1, 0, 1, 0, 0, 0, 0, 0},
                            {1, 0, 1, 1, 1, 0, 0, 0}, {1, 0, 1, 2, 0, 0, 0, 0}};
    for (size_t s = 0; s < sizeof(shapes) / sizeof(*shapes); s++)
        for (size_t j = 0; j < sizeof(epis) / sizeof(*epis); j++) {
            stof_gemm_cfg c[64];
            const int M = shapes[s][0], N = shapes[s][1], K = shapes[s][2];
            int n = stof__gemm_candidates(NULL, &epis[j], M, N, K, c, 64);
            cr_expect_gt(n, 0, "no candidate for %dx%dx%d epi %zu", M, N, K,
                         j);
            for (int i = 0; i < n; i++) {
                char why[256];
                cr_expect(stof__gemm_cfg_valid(NULL, &c[i], &epis[j], N, K,
                                               why, sizeof(why)),
                          "candidate %d invalid: %s", i, why);
                const double ms =
                    stof__gemm_model_ms(NULL, &c[i], &epis[j], M, N, K);
                cr_expect(ms > 0.0 && isfinite(ms));
            }
            /* max is respected */
            cr_expect_leq(stof__gemm_candidates(NULL, &epis[j], M, N, K, c, 2),
                          2);
        }
    /* Norm: no candidate when even 16 rows of N do not fit. */
    stof_gemm_cfg c[8];
    stof_gemm_epi ln = {0, 0, 0, 1, 0, 0, 0, 0};
    cr_expect_eq(stof__gemm_candidates(NULL, &ln, 128, 65536, 768, c, 8), 0);
    /* The mma.sync template's row tiles are its grid's y (at most 65535):
     * at 2^21 tokens none of 16 or 32 rows is offered. */
    stof_gemm_cfg many[64];
    const int M = 1 << 21;
    for (size_t j = 0; j < sizeof(epis) / sizeof(*epis); j++) {
        const int n = stof__gemm_candidates(NULL, &epis[j], M, 768, 768, many,
                                            64);
        for (int i = 0; i < n; i++)
            cr_expect_leq((M + many[i].block_m - 1) / many[i].block_m, 65535,
                          "epi %zu: %d-row tiles", j, many[i].block_m);
    }
}

Test(gemm_cpu, model_prefers_sensible_tiles)
{
    stof_device dev;
    memset(&dev, 0, sizeof(dev));
    dev.ok = 1;
    dev.sm_count = 132;
    dev.max_smem_optin = 227 * 1024;
    stof_gemm_cfg big = {128, 256, 32, 2, 4, 3, 0, 1, 0}, small = {32, 64, 32, 1, 2, 4, 0, 1, 0};
    /* Large M: the large tile; tiny M: the small one (more CTAs). */
    cr_expect_lt(stof__gemm_model_ms(&dev, &big, &plain, 4096, 3072, 3072),
                 stof__gemm_model_ms(&dev, &small, &plain, 4096, 3072, 3072));
    cr_expect_lt(stof__gemm_model_ms(&dev, &small, &plain, 128, 768, 3072),
                 stof__gemm_model_ms(&dev, &big, &plain, 128, 768, 3072));
    /* Roughly the peak on a big problem: 2*4096*3072*3072 at ~350 TF. */
    const double ms = stof__gemm_model_ms(&dev, &big, &plain, 4096, 3072, 3072);
    cr_expect(ms > 0.15 && ms < 0.4, "model %.3f ms", ms);
    cr_expect(isinf(stof__gemm_model_ms(&dev, &big, &plain, 0, 8, 8)));
}

Test(gemm_cpu, references)
{
    cr_expect_float_eq(stof__ref_act(-2.0f, STOF_ACT_RELU), 0.0f, 0);
    cr_expect_float_eq(stof__ref_act(3.0f, STOF_ACT_NONE), 3.0f, 0);
    cr_expect(fabsf(stof__ref_act(1.0f, STOF_ACT_GELU_ERF) - 0.8413447f) <
              1e-6f);
    cr_expect(fabsf(stof__ref_act(1.0f, STOF_ACT_GELU_TANH) - 0.8411920f) <
              1e-6f);
    cr_expect(fabsf(stof__ref_act(1.0f, STOF_ACT_SILU) - 0.7310586f) < 1e-6f);
    const float v[4] = {1, 2, 3, 4}, g[4] = {1, 1, 1, 2}, b[4] = {0, 0, 0, 1};
    float o[4];
    stof__ref_norm_row(v, g, b, 4, STOF_NORM_LAYER, 0.0f, o);
    /* mean 2.5, var 1.25 */
    const float r = 1.0f / sqrtf(1.25f);
    cr_expect(fabsf(o[0] + 1.5f * r) < 1e-6f);
    cr_expect(fabsf(o[3] - (2.0f * 1.5f * r + 1.0f)) < 1e-6f);
    stof__ref_norm_row(v, g, NULL, 4, STOF_NORM_RMS, 0.0f, o);
    cr_expect(fabsf(o[1] - 2.0f / sqrtf(7.5f)) < 1e-6f);

    /* A 2x3x2 GEMM with bias, relu, residual; rounding to fp16. */
    const float A[4] = {1, 2, 3, 4}, W[6] = {1, 0, 0, 1, 1, -1},
                bias[3] = {0.5f, 0, -10}, res[6] = {1, 1, 1, 1, 1, 1};
    stof_gemm_epi e = {1, STOF_ACT_RELU, 1, 0, 0, 0, 0, 0};
    float out[6];
    stof__ref_gemm(A, W, bias, res, NULL, NULL, 2, 3, 2, 2, 2, 3, &e, 0.0f,
                   STOF_DTYPE_FP16, out, NULL);
    const float want[6] = {2.5f, 3, 1, 4.5f, 5, 1};
    for (int i = 0; i < 6; i++)
        cr_expect_float_eq(out[i], want[i], 0, "out[%d] = %g", i, out[i]);
    /* Rounding to bf16: 1 + 2^-9 becomes 1. */
    const float a1[8] = {1.001953125f, 0, 0, 0, 0, 0, 0, 0},
                w1[8] = {1, 0, 0, 0, 0, 0, 0, 0};
    stof__ref_gemm(a1, w1, NULL, NULL, NULL, NULL, 1, 1, 8, 8, 8, 1, &plain,
                   0.0f, STOF_DTYPE_BF16, out, NULL);
    cr_expect_float_eq(out[0], 1.0f, 0);
}

/* (c, e) written as a record's JSON holds `key` and reads back equal. */
static void round_trip(const stof_gemm_cfg *c, const stof_gemm_epi *e,
                       const char *key)
{
    stof_str s = {0};
    stof__gemm_cfg_json(c, e, &s);
    cr_assert(s.p && !s.oom);
    cr_expect(strstr(s.p, key) != NULL, "%s lacks %s", s.p, key);
    stof_gemm_cfg c2;
    stof_gemm_epi e2;
    cr_assert(stof__gemm_cfg_parse(s.p, &c2, &e2), "%s", s.p);
    cr_expect_eq(memcmp(&c2, c, sizeof(c2)), 0, "%s", s.p);
    cr_expect_eq(memcmp(&e2, e, sizeof(e2)), 0, "%s", s.p);
    stof__str_free(&s);
}

/* The gated epilogue (a gated FFN's first GEMM): only the Hopper template
 * with block_n 128 or 256 fuses it; its C tile is half as wide (shared
 * memory, tiles in the model), records keep "gated" (written only when
 * set), cuBLASLt never takes it, and the reference multiplies act(gate)
 * by the up projection's row N + n. */
Test(gemm_cpu, gated)
{
    char why[256];
    const stof_gemm_epi swiglu = {0, STOF_ACT_SILU, 0, 0, 0, 1, 0, 0};
    const stof_gemm_cfg wg256 = {128, 256, 64, 2, 1, 3, 1, 1, 0},
                        wg64 = {128, 64, 64, 2, 1, 6, 1, 1, 0},
                        mma = {128, 128, 32, 2, 4, 3, 0, 1, 0};
    EXPECT_CFG_OK(&wg256, &swiglu, 11008, 4096);
    EXPECT_CFG_REFUSED(&wg64, &swiglu, 768, 768);
    cr_expect(strstr(why, "128 or 256") != NULL, "%s", why);
    EXPECT_CFG_REFUSED(&mma, &swiglu, 768, 768);
    cr_expect(strstr(why, "only the wgmma template") != NULL, "%s", why);
    const stof_gemm_epi gn = {0, 0, 0, 2, 0, 1, 0, 0}, g2 = {0, 0, 0, 0, 0, 2, 0, 0};
    EXPECT_CFG_REFUSED(&wg256, &gn, 768, 768);
    cr_expect(strstr(why, "gated and norm") != NULL, "%s", why);
    EXPECT_CFG_REFUSED(&wg256, &g2, 768, 768);
    cr_expect(strstr(why, "0 or 1") != NULL, "%s", why);
    cr_expect_not(stof__blaslt_epi_ok(&swiglu));
    /* The C tile is 128 x 128, not 128 x 256, but both are staged
     * through the same rings of 64 x 64 units. */
    const stof_gemm_epi plain0 = {0, 0, 0, 0, 0, 0, 0, 0};
    cr_expect_eq(stof__gemm_smem_bytes(&wg256, &plain0, 8),
                 stof__gemm_smem_bytes(&wg256, &swiglu, 8));
    /* Candidates on an H100: wgmma tiles of 128 or 256 only, all valid. */
    stof_device dev;
    memset(&dev, 0, sizeof(dev));
    dev.ok = 1;
    dev.sm_count = 132;
    dev.cc_major = 9;
    dev.max_smem_optin = 232448;
    stof_gemm_cfg c[64];
    const int n = stof__gemm_candidates(&dev, &swiglu, 4096, 11008, 4096, c,
                                        64);
    cr_expect_gt(n, 0);
    for (int i = 0; i < n; i++) {
        cr_expect(c[i].wgmma && c[i].block_n >= 128, "candidate %d", i);
        cr_expect(stof__gemm_cfg_valid(&dev, &c[i], &swiglu, 11008, 4096,
                                       why, sizeof(why)),
                  "%s", why);
    }
    dev.cc_major = 8; /* elsewhere none: the layer splits it */
    cr_expect_eq(stof__gemm_candidates(&dev, &swiglu, 4096, 11008, 4096, c,
                                       64),
                 0);
    /* A gated tile covers half the columns: about twice the plain model's
     * time for the same output (twice the products). */
    dev.cc_major = 9;
    const double tg =
        stof__gemm_model_ms(&dev, &wg256, &swiglu, 8192, 11008, 4096);
    const double tp =
        stof__gemm_model_ms(&dev, &wg256, &plain0, 8192, 11008, 4096);
    cr_expect(tg > 1.8 * tp && tg < 2.2 * tp, "gated %g, plain %g", tg, tp);
    /* Records. */
    round_trip(&wg256, &swiglu, "\"gated\":1");
    stof_str s = {0};
    stof_gemm_cfg c2;
    stof_gemm_epi e2;
    stof__gemm_cfg_json(&wg256, &plain0, &s);
    cr_expect(strstr(s.p, "gated") == NULL, "%s", s.p);
    stof__str_free(&s);
    cr_expect_not(stof__gemm_cfg_parse(
        "{\"bm\":128,\"bn\":256,\"bk\":64,\"wm\":2,\"wn\":1,\"st\":4,"
        "\"bias\":1,\"act\":2,\"res\":0,\"norm\":0,\"pre\":0,"
        "\"wg\":1,\"gated\":1,\"extra\":1}",
        &c2, &e2));
    /* Reference: N = 2, K = 2; W rows: gate (1 0), (0 1), up (2 0), (1 1);
     * bias (0 0 1 0); A = (1 2): gate (1 2), up (3 3); silu(g) * u. */
    const float A[2] = {1, 2}, W[8] = {1, 0, 0, 1, 2, 0, 1, 1},
                bias[4] = {0, 0, 1, 0};
    const stof_gemm_epi sb = {1, STOF_ACT_SILU, 0, 0, 0, 1, 0, 0};
    float out[2];
    stof__ref_gemm(A, W, bias, NULL, NULL, NULL, 1, 2, 2, 2, 2, 2, &sb, 0.0f,
                   STOF_DTYPE_BF16, out, NULL);
    const float w0 = stof__ref_act(1.0f, STOF_ACT_SILU) * 3.0f,
                w1 = stof__ref_act(2.0f, STOF_ACT_SILU) * 3.0f;
    cr_expect(fabsf(out[0] - w0) < 1e-2f * w0, "%g vs %g", out[0], w0);
    cr_expect(fabsf(out[1] - w1) < 1e-2f * w1, "%g vs %g", out[1], w1);
}

/* The Hopper template (wgmma = 1): its rules and reasons, its shared
 * memory, its "wg" key in records (written only when set, older records
 * without it still read), and its candidates only on a described cc 9.0
 * device; with a norm only where a row's tiles make one cluster. */
/* Configurations the rules refuse at N = K = 768, each for its reason
 * (a part of the message). */
typedef struct refused {
    stof_gemm_cfg c;
    stof_gemm_epi e;
    const char *needle;
} refused;

static void expect_refused(const refused *bad, size_t n)
{
    char why[256];
    for (size_t i = 0; i < n; i++) {
        why[0] = '\0';
        cr_expect_not(stof__gemm_cfg_valid(NULL, &bad[i].c, &bad[i].e, 768,
                                           768, why, sizeof(why)),
                      "case %zu accepted", i);
        cr_expect(strstr(why, bad[i].needle) != NULL,
                  "case %zu: reason '%s' lacks '%s'", i, why, bad[i].needle);
    }
}

Test(gemm_cpu, hopper_template)
{
    char why[256];
    const stof_gemm_cfg ok = {128, 256, 64, 2, 1, 3, 1, 1, 0};
    cr_assert(stof__gemm_cfg_valid(NULL, &ok, &plain, 768, 768, why,
                                   sizeof(why)),
              "%s", why);
    /* 3 x (128 + 256) x 64 x 2 + two warpgroups' rings of two 64 x 64 C
     * units + (3 x 2 + 4) mbarriers + 1024. */
    cr_expect_eq(stof__gemm_smem_bytes(&ok, &plain, 768),
                 3u * 384 * 128 + 32768u + 80u + 1024u);
    /* Four stages of 128 x 256 fit (227 KB), five do not; with a residual
     * (loaded into rings of four units) three. */
    const stof_gemm_cfg s4 = {128, 256, 64, 2, 1, 4, 1, 1, 0};
    const stof_gemm_epi res = {1, 0, 1, 0, 0, 0, 0, 0};
    EXPECT_CFG_OK(&s4, &plain, 768, 768);
    EXPECT_CFG_REFUSED(&s4, &res, 768, 768);
    EXPECT_CFG_OK(&ok, &res, 768, 768);
    cr_expect_eq(stof__gemm_smem_bytes(&ok, &res, 768) -
                     stof__gemm_smem_bytes(&ok, &plain, 768),
                 32768u);
    /* Ping-pong (warps 1x1): block_n <= 128, the same C rings. */
    const stof_gemm_cfg pp = {128, 128, 64, 1, 1, 5, 1, 1, 0},
                        pp256 = {128, 256, 64, 1, 1, 3, 1, 1, 0};
    cr_assert(stof__gemm_cfg_valid(NULL, &pp, &plain, 768, 768, why,
                                   sizeof(why)),
              "%s", why);
    cr_expect_eq(stof__gemm_smem_bytes(&pp, &plain, 768),
                 5u * 256 * 128 + 32768u + 112u + 1024u);
    EXPECT_CFG_REFUSED(&pp256, &plain, 768, 768);
    cr_expect(strstr(why, "ping-pong") != NULL, "%s", why);
    /* The model prefers ping-pong at small K (the epilogue's share) far
     * more than at large K. */
    stof_device h100;
    memset(&h100, 0, sizeof(h100));
    h100.ok = 1;
    h100.sm_count = 132;
    h100.cc_major = 9;
    h100.max_smem_optin = 232448;
    const stof_gemm_cfg co = {128, 128, 64, 2, 1, 5, 1, 1, 0};
#define MODEL(c, M, N, K) stof__gemm_model_ms(&h100, &(c), &plain, M, N, K)
    const double small_k =
        MODEL(co, 16384, 3072, 768) / MODEL(pp, 16384, 3072, 768);
    const double large_k =
        MODEL(co, 4096, 4096, 11008) / MODEL(pp, 4096, 4096, 11008);
    cr_expect(small_k > 1.1 && large_k < 1.05 && large_k >= 1.0,
              "cooperative / ping-pong: %g at K 768, %g at K 11008", small_k,
              large_k);
    /* Split tails: 576 ping-pong tiles of 128 x 128 (4096 x 2304) are 4.5
     * rounds on 132 SMs, 608 (4096 x 2432) still 5, and the cooperative
     * tile never splits. */
    const double split =
        MODEL(pp, 4096, 2304, 768) / MODEL(pp, 4096, 2432, 768);
    const double whole =
        MODEL(co, 4096, 2304, 768) / MODEL(co, 4096, 2432, 768);
#undef MODEL
    cr_expect(split > 0.85 && split < 0.95 && whole > 0.99,
              "4096 x 2304 / 4096 x 2432: ping-pong %g, cooperative %g",
              split, whole);
    static const refused bad[] = {
        {{64, 128, 64, 2, 1, 4, 1, 1, 0}, {0, 0, 0, 0, 0, 0, 0, 0}, "128 x"},
        {{128, 32, 64, 2, 1, 4, 1, 1, 0}, {0, 0, 0, 0, 0, 0, 0, 0}, "128 x"},
        {{128, 128, 32, 2, 1, 4, 1, 1, 0}, {0, 0, 0, 0, 0, 0, 0, 0}, "128 x"},
        {{128, 128, 64, 2, 4, 4, 1, 1, 0}, {0, 0, 0, 0, 0, 0, 0, 0}, "2x1"},
        {{128, 128, 64, 2, 1, 7, 1, 1, 0}, {0, 0, 0, 0, 0, 0, 0, 0}, "stages"},
        {{128, 256, 64, 2, 1, 5, 1, 1, 0}, {0, 0, 0, 0, 0, 0, 0, 0}, "shared memory"},
        {{128, 256, 64, 2, 1, 3, 1, 2, 0}, {0, 0, 1, 1, 0, 0, 0, 0}, "no pairs"},
        {{128, 128, 64, 2, 1, 4, 1, 1, 0}, {0, 9, 0, 0, 0, 0, 0, 0}, "act 9"},
        {{128, 128, 64, 2, 1, 4, 2, 1, 0}, {0, 0, 0, 0, 0, 0, 0, 0}, "wgmma 2"},
        {{128, 128, 64, 2, 1, 4, 1, 3, 0}, {0, 0, 0, 0, 0, 0, 0, 0}, "cluster 3"},
        {{128, 128, 32, 2, 4, 3, 0, 2, 0}, {0, 0, 0, 0, 0, 0, 0, 0}, "clusters"},
    };
    expect_refused(bad, sizeof(bad) / sizeof(*bad));
    /* An A100 refuses it by name. */
    stof_device dev;
    memset(&dev, 0, sizeof(dev));
    dev.ok = 1;
    dev.sm_count = 108;
    dev.cc_major = 8;
    dev.max_smem_optin = 166912;
    cr_expect_not(stof__gemm_cfg_valid(&dev, &ok, &plain, 768, 768, why,
                                       sizeof(why)));
    cr_expect(strstr(why, "9.0") != NULL, "%s", why);
    stof_gemm_cfg c[64];
    const stof_gemm_epi gelu = {1, STOF_ACT_GELU_ERF, 0, 0, 0, 0, 0, 0};
    int n = stof__gemm_candidates(&dev, &gelu, 4096, 3072, 768, c, 64);
    for (int i = 0; i < n; i++)
        cr_expect_eq(c[i].wgmma, 0, "an A100 got a wgmma candidate");
    n = stof__gemm_candidates(NULL, &gelu, 4096, 3072, 768, c, 64);
    for (int i = 0; i < n; i++)
        cr_expect_eq(c[i].wgmma, 0, "no device, yet a wgmma candidate");
    /* An H100: wgmma candidates, valid, and ranked by the model first for
     * a large GEMM; none for a norm epilogue. */
    dev.cc_major = 9;
    dev.sm_count = 132;
    dev.max_smem_optin = 232448;
    n = stof__gemm_candidates(&dev, &gelu, 16384, 3072, 768, c, 64);
    int n_wg = 0, best = -1;
    double best_ms = INFINITY;
    for (int i = 0; i < n; i++) {
        cr_expect(stof__gemm_cfg_valid(&dev, &c[i], &gelu, 3072, 768, why,
                                       sizeof(why)),
                  "%s", why);
        n_wg += c[i].wgmma;
        const double ms =
            stof__gemm_model_ms(&dev, &c[i], &gelu, 16384, 3072, 768);
        if (ms < best_ms) {
            best_ms = ms;
            best = i;
        }
    }
    cr_expect_gt(n_wg, 0);
    int n_pairs = 0;
    for (int i = 0; i < n; i++)
        n_pairs += c[i].cluster == 2;
    cr_expect_gt(n_pairs, 0, "no candidate in pairs of CTAs");
    /* One tile row: nothing to pair. */
    const int n1 = stof__gemm_candidates(&dev, &gelu, 128, 3072, 768, c, 64);
    for (int i = 0; i < n1; i++)
        cr_expect_neq(c[i].cluster, 2, "a pair for one tile row");
    n = stof__gemm_candidates(&dev, &gelu, 16384, 3072, 768, c, 64);
    cr_assert_geq(best, 0);
    cr_expect_eq(c[best].wgmma, 1, "the model prefers mma.sync on H100");
    /* A norm: rows of 3 (or 6) tiles at N 768, ranked first; at N 4096
     * only 256-wide tiles (16 a row), none at 8192. */
    const stof_gemm_epi ln = {1, 0, 1, 1, 0, 0, 0, 0};
    n = stof__gemm_candidates(&dev, &ln, 4096, 768, 768, c, 64);
    n_wg = 0;
    best = -1;
    best_ms = INFINITY;
    for (int i = 0; i < n; i++) {
        cr_expect(stof__gemm_cfg_valid(&dev, &c[i], &ln, 768, 768, why,
                                       sizeof(why)),
                  "%s", why);
        n_wg += c[i].wgmma;
        cr_expect(!c[i].wgmma || c[i].cluster <= 1);
        const double ms = stof__gemm_model_ms(&dev, &c[i], &ln, 4096, 768,
                                              768);
        if (ms < best_ms) {
            best_ms = ms;
            best = i;
        }
    }
    cr_expect_gt(n_wg, 0, "no wgmma candidate for a norm at N 768");
    cr_assert_geq(best, 0);
    cr_expect_eq(c[best].wgmma, 1, "the model prefers the row-complete "
                                   "mma.sync kernel for a norm");
    /* 64-column tiles only where every tile runs in one round: 128
     * tokens x 768 (12 CTAs, not 128 x 192's 4), not 4096 tokens; the
     * layer's workspace follows its narrowest candidate. */
    int n64 = 0;
    n = stof__gemm_candidates(&dev, &ln, 128, 768, 768, c, 64);
    for (int i = 0; i < n; i++)
        n64 += c[i].wgmma && c[i].block_n == 64;
    cr_expect_eq(n64, 2, "128 x 64 tiles, both kinds, at 128 tokens");
    n = stof__gemm_candidates(&dev, &ln, 4096, 768, 768, c, 64);
    for (int i = 0; i < n; i++)
        cr_expect(!c[i].wgmma || c[i].block_n > 64,
                  "128 x 64 norm tiles at 4096 tokens (384 tiles)");
    const stof_gemm_cfg w64 = {128, 64, 64, 2, 1, 6, 1, 1, 0},
                        w128 = {128, 128, 64, 2, 1, 4, 1, 1, 0};
    cr_expect_eq(stof__gemm_norm_ws_max(&dev, 128, 768),
                 stof__gemm_ws_bytes(&w64, &ln, 128, 768));
    cr_expect_eq(stof__gemm_norm_ws_max(&dev, 4096, 768),
                 stof__gemm_ws_bytes(&w128, &ln, 4096, 768));
    cr_expect_eq(stof__gemm_norm_ws_max(NULL, 128, 768), 0u);
    /* The layer's workspace is exactly the largest its norm candidates
     * need: none where no wgmma tile can take a row (N > 16 x 256), and
     * the narrowest legal tile's where 128 columns cannot (N > 2048). */
    {
        const int ms[] = {128, 4096, 32768}, ns[] = {768,  1024, 2048, 3072,
                                                     4096, 5120, 8192, 16384};
        stof_gemm_cfg cc[64];
        for (int a = 0; a < 3; a++)
            for (int b = 0; b < 8; b++) {
                const int got = stof__gemm_candidates(&dev, &ln, ms[a], ns[b],
                                                      1024, cc, 64);
                size_t most = 0;
                for (int i = 0; i < got; i++) {
                    const size_t w =
                        stof__gemm_ws_bytes(&cc[i], &ln, ms[a], ns[b]);
                    most = w > most ? w : most;
                }
                cr_expect_eq(stof__gemm_norm_ws_max(&dev, ms[a], ns[b]), most,
                             "M %d N %d: workspace %zu, candidates need %zu",
                             ms[a], ns[b],
                             stof__gemm_norm_ws_max(&dev, ms[a], ns[b]), most);
            }
    }
    n = stof__gemm_candidates(&dev, &ln, 4096, 4096, 4096, c, 64);
    n_wg = 0;
    for (int i = 0; i < n; i++) {
        n_wg += c[i].wgmma;
        cr_expect(!c[i].wgmma || c[i].block_n == 256,
                  "a wgmma norm over 32 tiles a row");
    }
    cr_expect_gt(n_wg, 0, "no wgmma candidate for a norm at N 4096");
    n = stof__gemm_candidates(&dev, &ln, 4096, 8192, 4096, c, 64);
    for (int i = 0; i < n; i++)
        cr_expect_eq(c[i].wgmma, 0, "a wgmma norm over 32 tiles a row");
    cr_expect_not(stof__gemm_cfg_valid(&dev, &co, &ln, 4096, 768, why,
                                       sizeof(why)));
    cr_expect(strstr(why, "more than the 16") != NULL, "%s", why);
    /* 192-wide tiles: four stages with a norm's rings; not gated, not in
     * pairs. */
    const stof_gemm_cfg w192 = {128, 192, 64, 2, 1, 4, 1, 1, 0},
                        w192p = {128, 192, 64, 2, 1, 3, 1, 2, 0};
    cr_expect(stof__gemm_cfg_valid(&dev, &w192, &ln, 768, 3072, why,
                                   sizeof(why)),
              "%s", why);
    const stof_gemm_epi swiglu = {0, STOF_ACT_SILU, 0, 0, 0, 1, 0, 0};
    cr_expect_not(stof__gemm_cfg_valid(&dev, &w192, &swiglu, 768, 768, why,
                                       sizeof(why)));
    cr_expect_not(stof__gemm_cfg_valid(&dev, &w192p, &gelu, 768, 768, why,
                                       sizeof(why)));
    cr_expect(strstr(why, "192") != NULL, "%s", why);
    /* Its shared memory: four C units a warpgroup, gamma and beta of 256
     * columns in fp32; its workspace: a row counter a warp's 16 rows,
     * eight a tile row (256-byte padded), and 128 rows x 8 bytes a tile. */
    cr_expect_eq(stof__gemm_smem_bytes(&ok, &ln, 768),
                 3u * 384 * 128 + 65536u + 48u + 32u + 2048u + 1024u);
    cr_expect_eq(stof__gemm_ws_bytes(&ok, &ln, 300, 768),
                 256u + 3u * 3u * 1024u);
    cr_expect_eq(stof__gemm_ws_bytes(&ok, &ln, 9 * 128, 768),
                 512u + 9u * 3u * 1024u);
    cr_expect_eq(stof__gemm_ws_bytes(&ok, &gelu, 300, 768), 0u);
    /* Records: "wg" only when set; both forms read back. */
    round_trip(&ok, &gelu, "\"wg\":1");
    stof_str s = {0};
    stof_gemm_cfg c2;
    stof_gemm_epi e2;
    const stof_gemm_cfg mma = {128, 128, 32, 2, 4, 3, 0, 1, 0};
    stof__gemm_cfg_json(&mma, &gelu, &s);
    cr_expect(strstr(s.p, "wg") == NULL, "%s", s.p);
    cr_assert(stof__gemm_cfg_parse(s.p, &c2, &e2));
    cr_expect_eq(c2.wgmma, 0);
    stof__str_free(&s);
    cr_expect_not(stof__gemm_cfg_parse(
        "{\"bm\":128,\"bn\":256,\"bk\":64,\"wm\":2,\"wn\":1,\"st\":4,"
        "\"bias\":1,\"act\":2,\"res\":0,\"norm\":0,\"pre\":0,"
        "\"wg\":\"1\"}",
        &c2, &e2));
}

/* Which items of a ping-pong launch run as 64-row halves: only a last
 * round that would leave at least half of the CTAs idle. */
Test(gemm_cpu, split_tail_items)
{
    cr_expect_eq(stof__gemm_split_from(576, 132), 528); /* 48 -> 96 halves */
    cr_expect_eq(stof__gemm_split_from(198, 132), 132); /* r = grid / 2 */
    cr_expect_eq(stof__gemm_split_from(199, 132), 199); /* r > grid / 2 */
    cr_expect_eq(stof__gemm_split_from(768, 132), 768);
    cr_expect_eq(stof__gemm_split_from(528, 132), 528); /* whole rounds */
    cr_expect_eq(stof__gemm_split_from(100, 132), 100); /* one round */
    cr_expect_eq(stof__gemm_split_from(132, 132), 132);
    cr_expect_eq(stof__gemm_split_from(4, 3), 3);
    cr_expect_eq(stof__gemm_split_from(7, 3), 6);
    cr_expect_eq(stof__gemm_split_from(5, 3), 5);
    cr_expect_eq(stof__gemm_split_from(5, 0), 5);
}

/* The templates' erf-GELU (jit_templates/stof_gelu.cuh, the formula
 * gemm_epi.cuh evaluates, with exp2f for the SFU's ex2) against erfc in
 * double: over every finite fp16 value, a dense sweep of [-12, 12] and
 * large values, within the header's stated bounds; the limits and NaN. */
#include "../jit_templates/stof_gelu.cuh"
#include "testutil.h"

static float gelu_tpl(float v)
{
    const float ac = stof_gelu_erf_clamp(v);
    return stof_gelu_erf_finish(v, ac, exp2f(stof_gelu_erf_exponent(v, ac)));
}

static void gelu_check(float v, double *max_abs, double *max_rel)
{
    const double x = v, ref = 0.5 * x * erfc(-x / sqrt(2.0));
    const double g = gelu_tpl(v);
    cr_assert(isfinite(g), "gelu(%.9g) = %g", v, g);
    /* the fp32 result's own rounding aside */
    const double err = fabs(g - ref) - fabs(ref) * 0x1p-24;
    cr_assert(err <= 7e-7, "gelu(%.9g) = %.9g, exact %.9g", v, g, ref);
    if (err > *max_abs)
        *max_abs = err;
    if (fabs(ref) > 1e-6) {
        cr_assert(err / fabs(ref) <= 7e-6, "gelu(%.9g) = %.9g, exact %.9g",
                  v, g, ref);
        if (err / fabs(ref) > *max_rel)
            *max_rel = err / fabs(ref);
    } else {
        cr_assert(x > -5.5 || err <= 2e-9, "gelu(%.9g) = %.9g, exact %.9g",
                  v, g, ref);
    }
}

Test(gemm_cpu, gelu_erf_formula)
{
    double max_abs = 0, max_rel = 0;
    for (unsigned b = 0; b < 0x10000u; b++) {
        const float v = tu_f16_to_f32((uint16_t)b);
        if (isfinite(v))
            gelu_check(v, &max_abs, &max_rel);
    }
    for (int i = 0; i <= 2400000; i++)
        gelu_check(-12.0f + (float)i * 1e-5f, &max_abs, &max_rel);
    const float big[] = {1e3f, -1e3f, 3.0e38f, -3.0e38f, 1e-30f, -1e-30f};
    for (size_t i = 0; i < sizeof(big) / sizeof(big[0]); i++)
        gelu_check(big[i], &max_abs, &max_rel);
    cr_assert(max_abs > 1e-8, "the check compares something (%g)", max_abs);
    cr_log_info("erf-GELU: max abs error %.3g, max relative %.3g", max_abs,
                max_rel);
    /* the limits: +inf, 0 far below (and at -inf), NaN kept */
    cr_assert(isinf(gelu_tpl(INFINITY)) && gelu_tpl(INFINITY) > 0);
    cr_assert(gelu_tpl(-INFINITY) == 0.0f);
    cr_assert(isnan(gelu_tpl(NAN)));
    cr_assert(gelu_tpl(0.0f) == 0.0f && gelu_tpl(-0.0f) == 0.0f);
    /* the tail falls to 0 without a jump at T */
    float prev = gelu_tpl(-5.0f);
    for (float v = -5.0f; v > -40.0f; v -= 0.01f) {
        const float g = gelu_tpl(v);
        cr_assert(g <= 0.0f && fabsf(g) <= fabsf(prev) * 1.0001f + 1e-12f,
                  "gelu(%g) = %g after %g", v, g, prev);
        prev = g;
    }
    cr_assert(gelu_tpl(-40.0f) == 0.0f);
}

/* C units in the Hopper template's pipeline slots (cslot): only with a
 * residual or a norm, both warpgroups on each tile and no pairs; its
 * shared memory has no C rings, so 128 x 256 keeps four stages with a
 * residual (three without cslot) and 128 x 192 five with a norm; records
 * keep "cs" (written only when set); the candidates offer it where it
 * applies and nowhere else. */
Test(gemm_cpu, c_in_slots)
{
    char why[256];
    const stof_gemm_epi res = {1, 0, 1, 0, 0, 0, 0, 0},
                        ln = {1, 0, 1, 1, 0, 0, 0, 0}, rms = {0, 0, 0, 2, 1, 0, 0, 0};
    const stof_gemm_cfg cs4 = {128, 256, 64, 2, 1, 4, 1, 1, 1},
                        ring4 = {128, 256, 64, 2, 1, 4, 1, 1, 0},
                        cs192 = {128, 192, 64, 2, 1, 5, 1, 1, 1},
                        ring192 = {128, 192, 64, 2, 1, 5, 1, 1, 0};
    EXPECT_CFG_OK(&cs4, &res, 2048, 5632);
    EXPECT_CFG_REFUSED(&ring4, &res, 2048, 5632);
    EXPECT_CFG_OK(&cs4, &ln, 1024, 4096);
    EXPECT_CFG_OK(&cs192, &rms, 768, 768);
    EXPECT_CFG_REFUSED(&ring192, &ln, 768, 768);
    /* 4 x (128 + 256) x 64 x 2 + (4 x 2 + 4) mbarriers + 1024; with a norm
     * gamma and beta of 256 columns in fp32 too. */
    cr_expect_eq(stof__gemm_smem_bytes(&cs4, &res, 2048),
                 4u * 384 * 128 + 64u + 32u + 1024u);
    cr_expect_eq(stof__gemm_smem_bytes(&cs4, &ln, 1024),
                 4u * 384 * 128 + 64u + 32u + 2048u + 1024u);
    static const refused bad[] = {
        {{128, 256, 64, 2, 1, 3, 1, 1, 1}, {1, 2, 0, 0, 0, 0, 0, 0}, "residual"},
        {{128, 128, 64, 1, 1, 5, 1, 1, 1}, {1, 0, 1, 0, 0, 0, 0, 0}, "2x1"},
        {{128, 256, 64, 2, 1, 3, 1, 2, 1}, {1, 0, 1, 0, 0, 0, 0, 0}, "no pairs"},
        {{128, 256, 64, 2, 1, 3, 1, 1, 2}, {1, 0, 1, 0, 0, 0, 0, 0}, "cslot 2"},
        {{128, 128, 32, 2, 4, 3, 0, 1, 1}, {1, 0, 1, 0, 0, 0, 0, 0}, "wgmma"},
        {{128, 256, 64, 2, 1, 5, 1, 1, 1}, {1, 0, 1, 0, 0, 0, 0, 0},
         "shared memory"},
    };
    expect_refused(bad, sizeof(bad) / sizeof(*bad));
    /* Records: "cs" only when set, read back either way. */
    round_trip(&cs4, &res, "\"cs\":1");
    stof_str s = {0};
    stof__gemm_cfg_json(&ring4, &plain, &s);
    cr_assert(s.p && !s.oom);
    cr_expect(strstr(s.p, "cs") == NULL, "%s", s.p);
    stof__str_free(&s);
    round_trip(&ring4, &plain, "\"wg\":1");
    /* Candidates on an H100-like device: with a residual or a norm some
     * put C in the slots (each valid), without neither does. */
    stof_device dev;
    memset(&dev, 0, sizeof(dev));
    dev.ok = 1;
    dev.cc_major = 9;
    dev.sm_count = 132;
    dev.max_smem_optin = 232448;
    stof_gemm_cfg c[64];
    const struct {
        const stof_gemm_epi *e;
        int M, N, K, want;
    } cases[] = {{&res, 4096, 2048, 5632, 1}, {&ln, 4096, 1024, 4096, 1},
                 {&rms, 4096, 768, 768, 1},   {&plain, 4096, 2048, 5632, 0}};
    for (size_t k = 0; k < sizeof(cases) / sizeof(*cases); k++) {
        const int n = stof__gemm_candidates(&dev, cases[k].e, cases[k].M,
                                            cases[k].N, cases[k].K, c, 64);
        int n_cs = 0;
        for (int i = 0; i < n; i++) {
            n_cs += c[i].cslot;
            cr_expect(stof__gemm_cfg_valid(&dev, &c[i], cases[k].e,
                                           cases[k].N, cases[k].K, why,
                                           sizeof(why)),
                      "case %zu: %s", k, why);
        }
        if (cases[k].want)
            cr_expect_gt(n_cs, 0, "case %zu: no candidate with C in the "
                                  "slots", k);
        else
            cr_expect_eq(n_cs, 0, "case %zu: C in the slots without a "
                                  "residual or a norm", k);
    }
}

/* Who decides programmatic dependent launch (cuda_shim.c): STOF_PDL, or
 * stof__pdl_set(0 / 1), for every launch; else (stof__pdl_set(-1)) the
 * calling thread's scope, which a layer plan sets around its launches:
 * off outside one, per thread. */
static void *pdl_other_thread(void *arg)
{
    *(int *)arg = stof__pdl_enabled();
    return NULL;
}

Test(gemm_cpu, pdl_choice)
{
    const char *env = getenv("STOF_PDL");
    if (env && (env[0] == '0' || env[0] == '1') && env[1] == '\0')
        cr_skip_test("STOF_PDL=%s decides for every launch here", env);
    stof__pdl_set(-1);
    cr_expect_eq(stof__pdl_enabled(), 0, "on outside a scope");
    int was = stof__pdl_scope(1);
    cr_expect_eq(was, 0);
    cr_expect_eq(stof__pdl_enabled(), 1);
    int other = -1;
    pthread_t th;
    cr_assert_eq(pthread_create(&th, NULL, pdl_other_thread, &other), 0);
    cr_assert_eq(pthread_join(th, NULL), 0);
    cr_expect_eq(other, 0, "another thread sees this thread's scope");
    stof__pdl_set(0); /* forced off: the scope does not count */
    cr_expect_eq(stof__pdl_enabled(), 0);
    stof__pdl_set(1);
    cr_expect_eq(stof__pdl_scope(0), 1);
    cr_expect_eq(stof__pdl_enabled(), 1, "forced on: the scope does not count");
    stof__pdl_set(-1);
    cr_expect_eq(stof__pdl_enabled(), 0);
    stof__pdl_scope(was);
}

/* ------------------------------------------------------------------------ */
/* Rotary position embeddings (the epilogue's rope)                          */
/* ------------------------------------------------------------------------ */

/* Hugging Face's inv_freq of pair i: 1 / theta^(2 i / rope), each step in
 * fp32 (as gemm.h says stof__rope_table computes it). */
static float rope_freq(int i, int rope, float theta)
{
    return 1.0f / powf(theta, (float)(2 * i) / (float)rope);
}

/* Half a float ulp at |v| (the ulp above |v|: the looser side at a power
 * of two). */
static double half_ulp(double v)
{
    const float a = fabsf((float)v);
    return 0.5 * ((double)nextafterf(a, INFINITY) - (double)a);
}

/* Entry (cos, sin) t of a table against the direct cos and sin in double
 * of the fp32 angle (float)p * f: within 2e-7, and in fact rounded to
 * nearest but for the table's stated 1e-11 before the rounding. Counts a
 * failure in *bad (reported for the first few only). */
static void rope_entry_check(const float *t, int p, int i, float f,
                             const char *what, size_t *bad)
{
    const volatile float ang = (float)p * f;
    const double c = cos((double)ang), s = sin((double)ang);
    const double ec = fabs((double)t[0] - c), es = fabs((double)t[1] - s);
    const int ok = ec <= 2e-7 && es <= 2e-7 && ec <= half_ulp(c) + 1e-11 &&
                   es <= half_ulp(s) + 1e-11;
    if (!ok && (*bad)++ < 5)
        cr_log_error("%s: p %d pair %d (angle %.9g): (%.9g, %.9g), direct "
                     "(%.12g, %.12g)",
                     what, p, i, (double)ang, (double)t[0], (double)t[1], c,
                     s);
}

/* stof__rope_table without positions (the rotation recurrence corrected
 * by the angle's fp32 rounding) against the direct cos and sin of each
 * fp32 angle, over up to 200000 positions (every position of the first
 * 2048, a stride of 61 through the rest, so every residue of the 64-
 * position anchors, and the last 256), each pair, several widths and
 * bases (Llama 2's 10000, Llama 3's 500000); with positions (libm) the
 * same values, for sampled positions in any order and repeated. */
Test(gemm_cpu, rope_table, .timeout = 120)
{
    static const struct {
        int rope, n;
        float theta;
    } cases[] = {{128, 200000, 10000.0f},
                 {64, 200000, 500000.0f},
                 {96, 5000, 500000.0f},
                 {16, 3000, 10000.0f},
                 {32, 131072, 10000.0f}};
    for (size_t k = 0; k < sizeof(cases) / sizeof(*cases); k++) {
        const int rope = cases[k].rope, n = cases[k].n, half = rope / 2;
        const float theta = cases[k].theta;
        char what[64];
        snprintf(what, sizeof(what), "rope %d theta %g n %d", rope,
                 (double)theta, n);
        float *tab = malloc(sizeof(float) * (size_t)n * (size_t)rope);
        float *f = malloc(sizeof(float) * (size_t)half);
        int *pos = malloc(sizeof(int) * (size_t)n);
        cr_assert(tab && f && pos);
        /* (poisoned: every entry must be written) */
        memset(tab, 0xff, sizeof(float) * (size_t)n * (size_t)rope);
        stof__rope_table(tab, NULL, n, rope, theta);
        for (int i = 0; i < half; i++)
            f[i] = rope_freq(i, rope, theta);
        /* Position 0 is the identity, exactly. */
        for (int i = 0; i < half; i++)
            cr_expect(tab[2 * i] == 1.0f && tab[2 * i + 1] == 0.0f,
                      "%s: pair %d at position 0: (%g, %g)", what, i,
                      (double)tab[2 * i], (double)tab[2 * i + 1]);
        size_t bad = 0, checked = 0;
        int np = 0;
        for (int p = 0; p < n; p++) {
            if (p >= 2048 && p % 61 != 0 && p < n - 256)
                continue;
            pos[np++] = p;
            for (int i = 0; i < half; i++, checked++)
                rope_entry_check(tab + 2 * ((size_t)p * half + i), p, i,
                                 f[i], what, &bad);
        }
        cr_expect_eq(bad, 0, "%s: %zu of %zu entries off", what, bad,
                     checked);
        /* With positions: the sampled ones reversed, 0 and the last one
         * again at the end. */
        for (int a = 0, b = np - 1; a < b; a++, b--) {
            const int t = pos[a];
            pos[a] = pos[b];
            pos[b] = t;
        }
        pos[np++] = 0;
        pos[np++] = n - 1;
        float *tp = malloc(sizeof(float) * (size_t)np * (size_t)rope);
        cr_assert(tp);
        memset(tp, 0xff, sizeof(float) * (size_t)np * (size_t)rope);
        stof__rope_table(tp, pos, np, rope, theta);
        size_t bad_pos = 0, differ = 0, equal = 0;
        snprintf(what, sizeof(what), "rope %d theta %g with pos", rope,
                 (double)theta);
        for (int r = 0; r < np; r++)
            for (int i = 0; i < half; i++) {
                const float *a = tp + 2 * ((size_t)r * half + i);
                const float *b = tab + 2 * ((size_t)pos[r] * half + i);
                rope_entry_check(a, pos[r], i, f[i], what, &bad_pos);
                for (int j = 0; j < 2; j++) {
                    /* both rounded to nearest but for 1e-11: an ulp
                     * apart at most, a few near 0 */
                    const double d = fabs((double)a[j] - (double)b[j]);
                    if (!(d <= 2.0 * half_ulp(b[j]) + 2e-11) && differ++ < 5)
                        cr_log_error("%s: p %d pair %d [%d]: %.9g, without "
                                     "positions %.9g",
                                     what, pos[r], i, j, (double)a[j],
                                     (double)b[j]);
                    equal += a[j] == b[j];
                }
            }
        cr_expect_eq(bad_pos, 0, "%s: %zu entries off", what, bad_pos);
        cr_expect_eq(differ, 0, "%s: %zu entries more than an ulp (or "
                                "2e-11) from the table without positions",
                     what, differ);
        cr_expect_geq(equal, (size_t)np * (size_t)rope * 99 / 100,
                      "%s: only %zu of %zu entries equal", what, equal,
                      (size_t)np * (size_t)rope);
        free(tp);
        free(tab), free(f), free(pos);
    }
    /* Bad arguments write nothing. */
    float t[4] = {7, 7, 7, 7};
    stof__rope_table(t, NULL, 0, 4, 10000.0f);
    stof__rope_table(t, NULL, 1, 3, 10000.0f);
    stof__rope_table(NULL, NULL, 1, 4, 10000.0f);
    for (int i = 0; i < 4; i++)
        cr_expect(t[i] == 7.0f);
}

/* stof__rope_table_f, the table of given frequencies and a scale:
 * theta's frequencies (stof__rope_freqs, as stof__rope_table computes
 * them) and scale 1 give stof__rope_table's table bit for bit; any
 * frequencies (Llama 3.1's scaled ones, large ones, 0: no rotation) give
 * the direct cos and sin of each fp32 angle as rope_entry_check says; a
 * scale multiplies both after their rounding, in fp32 (Hugging Face's
 * attention_scaling). Bad arguments write nothing. */
Test(gemm_cpu, rope_table_of_given_frequencies)
{
    enum { ROPE = 64, HALF = ROPE / 2, N = 5000 };
    float f[HALF];
    float *ta = malloc(sizeof(float) * N * ROPE),
          *tb = malloc(sizeof(float) * N * ROPE);
    cr_assert(ta && tb);
    stof__rope_freqs(f, ROPE, 500000.0f);
    for (int i = 0; i < HALF; i++)
        cr_expect(f[i] == rope_freq(i, ROPE, 500000.0f), "pair %d", i);
    stof__rope_table(ta, NULL, N, ROPE, 500000.0f);
    memset(tb, 0xff, sizeof(float) * N * ROPE);
    stof__rope_table_f(tb, NULL, N, ROPE, f, 1.0f);
    cr_expect(memcmp(ta, tb, sizeof(float) * N * ROPE) == 0,
              "theta's frequencies: another table than stof__rope_table's");
    /* Llama 3.1's scaling of the low frequencies (factor 8, between
     * wavelengths 8192 / 4 and 8192 blended), a large one and 0. */
    for (int i = 0; i < HALF; i++) {
        const float wl = 2.0f * 3.14159265f / f[i];
        if (wl > 8192.0f)
            f[i] /= 8.0f;
        else if (wl >= 2048.0f) {
            const float sm = (8192.0f / wl - 1.0f) / 3.0f;
            f[i] = (1.0f - sm) * f[i] / 8.0f + sm * f[i];
        }
    }
    f[1] = 3.0f;
    f[HALF - 1] = 0.0f;
    memset(tb, 0xff, sizeof(float) * N * ROPE);
    stof__rope_table_f(tb, NULL, N, ROPE, f, 1.0f);
    size_t bad = 0;
    for (int p = 0; p < N; p++)
        for (int i = 0; i < HALF; i++)
            rope_entry_check(tb + 2 * ((size_t)p * HALF + i), p, i, f[i],
                             "given frequencies", &bad);
    cr_expect_eq(bad, 0, "%zu entries off", bad);
    for (int p = 0; p < N; p++) /* (f 0: the identity at every position) */
        cr_expect(tb[2 * ((size_t)p * HALF + HALF - 1)] == 1.0f &&
                      tb[2 * ((size_t)p * HALF + HALF - 1) + 1] == 0.0f,
                  "f 0 at position %d", p);
    /* A scale: each entry the unscaled one times it, in fp32. */
    const float scale = 1.2079441f; /* (yarn's 0.1 ln(8) + 1) */
    memset(ta, 0xff, sizeof(float) * N * ROPE);
    stof__rope_table_f(ta, NULL, N, ROPE, f, scale);
    size_t off = 0;
    for (size_t k = 0; k < (size_t)N * ROPE; k++)
        off += ta[k] != tb[k] * scale;
    cr_expect_eq(off, 0, "%zu scaled entries are not the unscaled times %g",
                 off, (double)scale);
    /* Bad arguments write nothing. */
    float t[4] = {7, 7, 7, 7};
    stof__rope_table_f(t, NULL, 1, 4, NULL, 1.0f);
    stof__rope_table_f(t, NULL, 0, 4, f, 1.0f);
    stof__rope_table_f(t, NULL, 1, 3, f, 1.0f);
    for (int i = 0; i < 4; i++)
        cr_expect(t[i] == 7.0f);
    free(ta);
    free(tb);
}

/* A small QKV projection's operands: A uniform in [-1, 1), W in [-0.2,
 * 0.2), the bias in [-0.5, 0.5), drawn in that order. */
/* v[n] = bias[n] + a . W[n] over K, in double (n < N). */
static void biased_row(const float *a, const float *W, const float *bias,
                       int N, int K, double *v)
{
    for (int n = 0; n < N; n++) {
        double acc = bias[n];
        for (int k = 0; k < K; k++)
            acc += (double)a[k] * W[n * K + k];
        v[n] = acc;
    }
}

static void qkv_operands(tu_rng *rng, float *A, int na, float *W, int nw,
                         float *bias, int nb)
{
    for (int i = 0; i < na; i++)
        A[i] = (float)(2.0 * tu_uniform(rng) - 1.0);
    for (int i = 0; i < nw; i++)
        W[i] = (float)(0.4 * tu_uniform(rng) - 0.2);
    for (int i = 0; i < nb; i++)
        bias[i] = (float)(tu_uniform(rng) - 0.5);
}

/* stof__ref_gemm_rope on a small QKV projection against the formula
 * written out: M 5 rows at scattered positions (0 among them), heads of
 * 32 (two of Q, one of K, one of V: the first 96 columns rotate), K 24,
 * with a bias (added before the rotation), rope 16 (partial) and 32
 * (whole heads), fp16. V and the channels past rope equal the plain
 * product; rotation keeps each pair's norm; position 0 changes nothing;
 * without a table, or with e->rope 0, it is stof__ref_gemm. */
Test(gemm_cpu, rope_reference)
{
    enum { M = 5, HD = 32, N = 4 * HD, K = 24, COLS = 3 * HD, SEQ = 4096 };
    static const int pos[M] = {3, 0, 17, 1000, 4095};
    const float theta = 10000.0f;
    tu_rng rng = {tu_seed() ^ 0x70be};
    float A[M * K], W[N * K], bias[N];
    qkv_operands(&rng, A, M * K, W, N * K, bias, N);
    float *plain_o = malloc(sizeof(float) * M * N),
          *out = malloc(sizeof(float) * M * N);
    cr_assert(plain_o && out);
    const stof_gemm_epi eb = {.bias = 1};
    stof__ref_gemm(A, W, bias, NULL, NULL, NULL, M, N, K, K, K, N, &eb, 0.0f,
                   STOF_DTYPE_FP16, plain_o, NULL);
    for (int rope = 16; rope <= HD; rope += 16) {
        const int half = rope / 2;
        float *tab = malloc(sizeof(float) * (size_t)SEQ * (size_t)rope);
        cr_assert(tab);
        stof__rope_table(tab, NULL, SEQ, rope, theta);
        const stof_gemm_epi e = {.bias = 1, .rope = rope, .rope_hd = HD};
        const stof_ref_rope rr = {tab, pos, COLS, NULL, 0, 0.0f};
        for (int i = 0; i < M * N; i++)
            out[i] = NAN;
        stof__ref_gemm_rope(A, W, bias, NULL, NULL, NULL, M, N, K, K, K, N,
                            &e, 0.0f, STOF_DTYPE_FP16, &rr, out, NULL);
        size_t off = 0, moved = 0;
        for (int m = 0; m < M; m++) {
            double v[N]; /* the biased product in double */
            biased_row(A + m * K, W, bias, N, K, v);
            for (int n = 0; n < N; n++) {
                const int h0 = n / HD * HD, c = n % HD;
                double want = v[n];
                if (n < COLS && c < rope) {
                    const int i = c % half;
                    const volatile float ang =
                        (float)pos[m] * rope_freq(i, rope, theta);
                    const double co = cos((double)ang), si = sin((double)ang);
                    const double x = v[h0 + i], y = v[h0 + i + half];
                    want = c < half ? x * co - y * si : y * co + x * si;
                } else {
                    /* V, and the channels past rope: the plain product */
                    off += out[m * N + n] != plain_o[m * N + n];
                }
                if (pos[m] == 0)
                    off += out[m * N + n] != plain_o[m * N + n];
                else
                    moved += out[m * N + n] != plain_o[m * N + n];
                const double err = fabs(out[m * N + n] - want);
                if (!(err <= 1e-3 * fabs(want) + 1e-5) && off++ < 1000)
                    cr_log_error("rope %d: row %d (position %d) column %d: "
                                 "%.7g, formula %.7g",
                                 rope, m, pos[m], n, (double)out[m * N + n],
                                 want);
            }
            /* Each rotated pair keeps its norm (both sides in fp16). */
            for (int h0 = 0; h0 < COLS; h0 += HD)
                for (int i = 0; i < half; i++) {
                    const float *o = out + m * N + h0,
                                *p = plain_o + m * N + h0;
                    const double r1 = hypot(o[i], o[i + half]),
                                 r0 = hypot(p[i], p[i + half]);
                    if (!(fabs(r1 - r0) <= 2e-3 * r0 + 1e-5) && off++ < 1000)
                        cr_log_error("rope %d: row %d head at %d pair %d: "
                                     "norm %.7g, before %.7g",
                                     rope, m, h0, i, r1, r0);
                }
        }
        cr_expect_eq(off, 0, "rope %d: %zu values off", rope, off);
        cr_expect_gt(moved, (size_t)(M - 1) * 3 * rope / 2,
                     "rope %d: only %zu values rotated", rope, moved);
        /* No table, or e->rope 0: the plain product. */
        stof__ref_gemm_rope(A, W, bias, NULL, NULL, NULL, M, N, K, K, K, N,
                            &e, 0.0f, STOF_DTYPE_FP16, NULL, out, NULL);
        cr_expect_eq(memcmp(out, plain_o, sizeof(float) * M * N), 0);
        stof__ref_gemm_rope(A, W, bias, NULL, NULL, NULL, M, N, K, K, K, N,
                            &eb, 0.0f, STOF_DTYPE_FP16, &rr, out, NULL);
        cr_expect_eq(memcmp(out, plain_o, sizeof(float) * M * N), 0);
        free(tab);
    }
    free(plain_o), free(out);
}

/* stof__ref_gemm_rope with a QK norm (qk_gamma): each head below cols
 * RMS-normalised with Q's weight below q_cols and K's above, then rotated
 * (rope 16 of 32, positions from pos) or not (rope 0), against the
 * formula in double on the biased product; V's head untouched. */
Test(gemm_cpu, qk_norm_reference)
{
    enum { M = 4, HD = 32, N = 4 * HD, K = 24, COLS = 3 * HD, QC = 2 * HD };
    static const int pos[M] = {0, 5, 63, 1};
    tu_rng rng = {tu_seed() ^ 0x9c0e};
    float A[M * K], W[N * K], bias[N], g[2 * HD];
    qkv_operands(&rng, A, M * K, W, N * K, bias, N);
    for (int i = 0; i < 2 * HD; i++)
        g[i] = (float)(0.5 + tu_uniform(&rng));
    float *tab = malloc(sizeof(float) * 64 * 16), out[M * N];
    cr_assert(tab);
    stof__rope_table(tab, NULL, 64, 16, 10000.0f);
    for (int rope = 0; rope <= 16; rope += 16) {
        const stof_gemm_epi e = {.bias = 1, .rope = rope, .rope_hd = HD};
        const stof_ref_rope rr = {rope ? tab : NULL, pos, COLS, g, QC, 1e-5f};
        stof__ref_gemm_rope(A, W, bias, NULL, NULL, NULL, M, N, K, K, K, N,
                            &e, 0.0f, STOF_DTYPE_FP16, &rr, out, NULL);
        size_t off = 0;
        for (int m = 0; m < M; m++) {
            double v[N];
            biased_row(A + m * K, W, bias, N, K, v);
            for (int h0 = 0; h0 < COLS; h0 += HD) {
                double ss = 0.0;
                for (int i = 0; i < HD; i++)
                    ss += v[h0 + i] * v[h0 + i];
                const double rs = 1.0 / sqrt(ss / HD + 1e-5);
                for (int i = 0; i < HD; i++)
                    v[h0 + i] *= rs * g[(h0 < QC ? 0 : HD) + i];
                for (int i = 0; i < rope / 2; i++) {
                    const double a = (double)pos[m] * (double)(1.0f /
                                     powf(10000.0f, (float)(2 * i) / 16.0f));
                    const double x = v[h0 + i], y = v[h0 + i + 8];
                    v[h0 + i] = x * cos(a) - y * sin(a);
                    v[h0 + i + 8] = y * cos(a) + x * sin(a);
                }
            }
            for (int n = 0; n < N; n++)
                if (!(fabs(out[m * N + n] - v[n]) <= 1e-3 * fabs(v[n]) + 1e-4)) {
                    if (off++ < 5)
                        cr_log_error("rope %d row %d col %d: %.8g, formula "
                                     "%.8g", rope, m, n,
                                     (double)out[m * N + n], v[n]);
                }
        }
        cr_expect_eq(off, 0, "rope %d: %zu values off", rope, off);
    }
    free(tab);
}

/* The rope epilogue's rules: only the Hopper template fuses it (mma.sync
 * refuses it by name, naming the rope kernel), with whole heads in a
 * tile, not with an activation, gate, residual or norm, rope a multiple
 * of 16 at most a head of 16..256 (a multiple of 8); the shared memory
 * is the plain kernel's; the candidates on an H100 are Hopper tiles that
 * hold whole heads, and none elsewhere (the layer splits it). */
Test(gemm_cpu, rope_rules)
{
    char why[256];
    const stof_gemm_epi q128 = {.bias = 1, .rope = 128, .rope_hd = 128},
                        q64p = {.rope = 32, .rope_hd = 64},
                        q64 = {.bias = 1, .rope = 64, .rope_hd = 64},
                        q96 = {.bias = 1, .rope = 96, .rope_hd = 96},
                        q96p = {.rope = 32, .rope_hd = 96};
    const stof_gemm_cfg w256 = {128, 256, 64, 2, 1, 4, 1, 1, 0},
                        pp128 = {128, 128, 64, 1, 1, 5, 1, 1, 0},
                        pair256 = {128, 256, 64, 2, 1, 3, 1, 2, 0},
                        w192 = {128, 192, 64, 2, 1, 4, 1, 1, 0},
                        w64 = {128, 64, 64, 2, 1, 6, 1, 1, 0},
                        mma = {128, 128, 32, 2, 4, 3, 0, 1, 0};
    /* Llama 3 8B's QKV (hd 128), GPT-NeoX-like partial rope (hd 64),
     * hd 96 in 192-wide tiles. */
    EXPECT_CFG_OK(&w256, &q128, 6144, 4096);
    EXPECT_CFG_OK(&pair256, &q128, 6144, 4096);
    EXPECT_CFG_OK(&pp128, &q64p, 2304, 768);
    EXPECT_CFG_OK(&pp128, &q64, 2304, 768);
    EXPECT_CFG_OK(&w64, &q64, 2304, 768);
    EXPECT_CFG_OK(&pair256, &q64, 2304, 768);
    EXPECT_CFG_OK(&w192, &q96, 9216, 3072);
    EXPECT_CFG_OK(&w192, &q96p, 9216, 3072);
    EXPECT_CFG_OK(&w192, &q64, 2304, 768);
    cr_expect_eq(stof__gemm_smem_bytes(&w256, &q128, 6144),
                 stof__gemm_smem_bytes(&w256, &plain, 6144));
    cr_expect_eq(stof__gemm_ws_bytes(&w256, &q128, 4096, 6144), 0u);
    static const refused bad[] = {
        /* mma.sync: the rope kernel after the plain GEMM instead */
        {{128, 128, 32, 2, 4, 3, 0, 1, 0}, {.rope = 64, .rope_hd = 64},
         "rope: only the wgmma template"},
        {{64, 64, 32, 2, 2, 3, 0, 1, 0}, {.bias = 1, .rope = 16, .rope_hd = 16},
         "rope kernel"},
        /* not with an activation, a gate, a residual or a norm */
        {{128, 256, 64, 2, 1, 3, 1, 1, 0},
         {.act = STOF_ACT_GELU_ERF, .rope = 64, .rope_hd = 64}, "rope: not"},
        {{128, 256, 64, 2, 1, 3, 1, 1, 0},
         {.bias = 1, .residual = 1, .rope = 64, .rope_hd = 64}, "rope: not"},
        {{128, 256, 64, 2, 1, 3, 1, 1, 0},
         {.gated = 1, .rope = 64, .rope_hd = 64}, "rope: not"},
        {{128, 256, 64, 2, 1, 3, 1, 1, 0},
         {.act = STOF_ACT_SILU, .gated = 1, .rope = 64, .rope_hd = 64},
         "rope: not"},
        {{128, 256, 64, 2, 1, 3, 1, 1, 0},
         {.norm = 1, .rope = 64, .rope_hd = 64}, "rope: not"},
        {{128, 256, 64, 2, 1, 3, 1, 1, 0},
         {.norm = 2, .write_pre = 1, .rope = 64, .rope_hd = 64}, "rope: not"},
        /* whole heads in a tile */
        {{128, 192, 64, 2, 1, 4, 1, 1, 0}, {.rope = 128, .rope_hd = 128},
         "whole heads of 128 in a tile of 192"},
        {{128, 64, 64, 2, 1, 6, 1, 1, 0}, {.rope = 64, .rope_hd = 128},
         "whole heads"},
        {{128, 128, 64, 1, 1, 5, 1, 1, 0}, {.rope = 32, .rope_hd = 96},
         "whole heads"},
        {{128, 256, 64, 2, 1, 3, 1, 1, 0}, {.rope = 64, .rope_hd = 72},
         "whole heads"},
        /* rope a multiple of 16 at most the head; the head 16..256, of 8 */
        {{128, 256, 64, 2, 1, 3, 1, 1, 0}, {.rope = 24, .rope_hd = 64},
         "rope 24"},
        {{128, 256, 64, 2, 1, 3, 1, 1, 0}, {.rope = 8, .rope_hd = 64},
         "rope 8"},
        {{128, 256, 64, 2, 1, 3, 1, 1, 0}, {.rope = 80, .rope_hd = 64},
         "rope 80"},
        {{128, 256, 64, 2, 1, 3, 1, 1, 0}, {.rope = 16, .rope_hd = 0},
         "heads of 0"},
        {{128, 256, 64, 2, 1, 3, 1, 1, 0}, {.rope = 16, .rope_hd = 12},
         "heads of 12"},
        {{128, 256, 64, 2, 1, 3, 1, 1, 0}, {.rope = 16, .rope_hd = 36},
         "heads of 36"},
        {{128, 256, 64, 2, 1, 3, 1, 1, 0}, {.rope = 16, .rope_hd = 512},
         "heads of 512"},
        {{128, 256, 64, 2, 1, 3, 1, 1, 0}, {.rope = 0, .rope_hd = 64},
         "rope_hd 64"},
        {{128, 256, 64, 2, 1, 3, 1, 1, 0}, {.rope = -16, .rope_hd = 64},
         "rope -16"},
    };
    expect_refused(bad, sizeof(bad) / sizeof(*bad));
    EXPECT_CFG_REFUSED(&mma, &q64, 2304, 768);
    cr_expect(strstr(why, "rope") != NULL, "%s", why);
    /* Devices: an H100 takes it, an A100 refuses the Hopper template by
     * its compute capability and mma.sync by rope. */
    stof_device dev;
    memset(&dev, 0, sizeof(dev));
    dev.ok = 1;
    dev.sm_count = 132;
    dev.cc_major = 9;
    dev.max_smem_optin = 232448;
    cr_expect(stof__gemm_cfg_valid(&dev, &w256, &q128, 6144, 4096, why,
                                   sizeof(why)),
              "%s", why);
    stof_gemm_cfg c[64];
    static const struct {
        stof_gemm_epi e;
        int M, N, K;
    } shapes[] = {{{.bias = 1, .rope = 128, .rope_hd = 128}, 4096, 6144, 4096},
                  {{.rope = 32, .rope_hd = 64}, 1000, 2304, 768},
                  {{.bias = 1, .rope = 64, .rope_hd = 64}, 128, 2304, 768}};
    for (size_t s = 0; s < sizeof(shapes) / sizeof(*shapes); s++) {
        const stof_gemm_epi *e = &shapes[s].e;
        const int n = stof__gemm_candidates(&dev, e, shapes[s].M, shapes[s].N,
                                            shapes[s].K, c, 64);
        cr_expect_gt(n, 0, "shape %zu: no candidate on an H100", s);
        for (int i = 0; i < n; i++) {
            cr_expect(c[i].wgmma && c[i].block_n % e->rope_hd == 0,
                      "shape %zu: candidate %d (wgmma %d, block_n %d)", s, i,
                      c[i].wgmma, c[i].block_n);
            cr_expect(stof__gemm_cfg_valid(&dev, &c[i], e, shapes[s].N,
                                           shapes[s].K, why, sizeof(why)),
                      "shape %zu: %s", s, why);
        }
        cr_expect_eq(stof__gemm_candidates(NULL, e, shapes[s].M, shapes[s].N,
                                           shapes[s].K, c, 64),
                     0, "shape %zu: a candidate without a device", s);
    }
    dev.cc_major = 8;
    dev.max_smem_optin = 166912;
    cr_expect_not(stof__gemm_cfg_valid(&dev, &w256, &q128, 6144, 4096, why,
                                       sizeof(why)));
    cr_expect(strstr(why, "9.0") != NULL, "%s", why);
    cr_expect_not(stof__gemm_cfg_valid(&dev, &mma, &q128, 6144, 4096, why,
                                       sizeof(why)));
    cr_expect(strstr(why, "rope") != NULL, "%s", why);
    cr_expect_eq(stof__gemm_candidates(&dev, &q128, 4096, 6144, 4096, c, 64),
                 0, "an A100 got a candidate that fuses rope");
    /* cuBLASLt never takes it. */
    cr_expect_not(stof__blaslt_epi_ok(&q128));
}

/* Records keep "rope" and "rhd" (written only when set: a record without
 * them reads back as no rope). */
Test(gemm_cpu, rope_records)
{
    const stof_gemm_cfg w256 = {128, 256, 64, 2, 1, 4, 1, 1, 0},
                        pp = {128, 128, 64, 1, 1, 5, 1, 2, 0};
    const stof_gemm_epi q128 = {.bias = 1, .rope = 128, .rope_hd = 128},
                        q64p = {.rope = 32, .rope_hd = 64};
    round_trip(&w256, &q128, "\"rope\":128,\"rhd\":128");
    round_trip(&pp, &q64p, "\"rope\":32,\"rhd\":64");
    stof_str s = {0};
    const stof_gemm_epi b = {.bias = 1};
    stof__gemm_cfg_json(&w256, &b, &s);
    cr_assert(s.p && !s.oom);
    cr_expect(strstr(s.p, "rope") == NULL && strstr(s.p, "rhd") == NULL,
              "%s", s.p);
    stof_gemm_cfg c2;
    stof_gemm_epi e2;
    memset(&e2, 0x5a, sizeof(e2));
    cr_assert(stof__gemm_cfg_parse(s.p, &c2, &e2), "%s", s.p);
    cr_expect_eq(e2.rope, 0);
    cr_expect_eq(e2.rope_hd, 0);
    stof__str_free(&s);
    /* A key that is not a number, or not known, is refused. */
    cr_expect_not(stof__gemm_cfg_parse(
        "{\"bm\":128,\"bn\":256,\"bk\":64,\"wm\":2,\"wn\":1,\"st\":4,"
        "\"bias\":1,\"act\":0,\"res\":0,\"norm\":0,\"pre\":0,"
        "\"wg\":1,\"rope\":\"64\",\"rhd\":64}",
        &c2, &e2));
    cr_expect_not(stof__gemm_cfg_parse(
        "{\"bm\":128,\"bn\":256,\"bk\":64,\"wm\":2,\"wn\":1,\"st\":4,"
        "\"bias\":1,\"act\":0,\"res\":0,\"norm\":0,\"pre\":0,"
        "\"wg\":1,\"rope\":64,\"rope_hd\":64}",
        &c2, &e2));
}
