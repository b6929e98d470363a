/*
 * test_cost.c - the analytical cost model and stage-1 ranking on the CPU,
 * with a described (not real) H100-class device.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <string.h>
#include <time.h>

#include "cost_model.h"
#include "attn_block.h"
#include "attn_wgmma.h"
#include "internal.h"
#include "testutil.h"

static stof_context *open_fake_h100(void)
{
    stof_context *ctx = NULL;
    cr_assert_eq(stof_open(&ctx, NULL), STOF_OK);
    /* The model reads only these fields. */
    ctx->device.sm_count = 132;
    ctx->device.cc_major = 9;
    ctx->device.cc_minor = 0;
    ctx->device.max_smem_optin = 232448;
    return ctx;
}

static double best_ms(stof_context *ctx, const char *spec, int n, int hd,
                      stof_candidate *best)
{
    stof_mask *m = NULL;
    cr_assert_eq(stof_mask_from_spec(ctx, spec, n, n, &m), STOF_OK);
    stof_attention_desc d;
    stof_attention_desc_init(&d, 4, 16, n, n, hd, STOF_DTYPE_FP16,
                             STOF_LAYOUT_BHSD);
    stof_candidate c[256];
    int k = 0;
    cr_assert_eq(stof__cost_rank(ctx, &d, m, c, 256, &k), STOF_OK, "%s",
                 stof_errmsg(ctx));
    cr_assert_gt(k, 4);
    for (int i = 1; i < k; i++)
        cr_assert_leq(c[i - 1].predicted_ms, c[i].predicted_ms,
                      "ranking is not sorted");
    for (int i = 0; i < k; i++) {
        int valid = c[i].kind == STOF_KERNEL_WGMMA ||
                            c[i].kind == STOF_KERNEL_WGMMA_GATHER
                        ? stof__wgmma_cfg_valid(&ctx->device, hd, &c[i].wcfg,
                                                NULL, 0)
                        : stof__block_cfg_valid(&ctx->device, hd, &c[i].cfg,
                                                NULL, 0);
        cr_assert(valid, "an invalid configuration was ranked (kind %d)",
                  c[i].kind);
    }
    if (best)
        *best = c[0];
    stof_mask_free(&m);
    return c[0].predicted_ms;
}

Test(cost, sparser_masks_are_predicted_faster)
{
    stof_context *ctx = open_fake_h100();
    double dense = best_ms(ctx, "dense", 4096, 64, NULL);
    double causal = best_ms(ctx, "causal", 4096, 64, NULL);
    double sliding = best_ms(ctx, "sliding:256", 4096, 64, NULL);
    cr_assert_lt(causal, dense * 0.7, "causal %.3f vs dense %.3f", causal, dense);
    cr_assert_gt(causal, dense * 0.4, "causal %.3f vs dense %.3f", causal, dense);
    cr_assert_lt(sliding, dense * 0.25, "sliding %.3f vs dense %.3f", sliding, dense);
    /* Dense 4x16x4096x4096 d=64 is 275 GFLOP: at 200..700 TFLOP/s. */
    cr_assert(dense > 0.39 && dense < 1.4, "dense predicted %.3f ms", dense);
    stof_close(&ctx);
}

/* head_dim 256: every ranked configuration fits the device's shared
 * memory, the row-wise builds' key offsets included (a 64x64 3-stage
 * row-wise build is 544 bytes over an H100's 232448). */
Test(cost, head_dim_256_candidates_fit_shared_memory)
{
    stof_context *ctx = open_fake_h100();
    static const char *const specs[] = {"causal", "strided:128", "dense"};
    for (size_t i = 0; i < sizeof(specs) / sizeof(*specs); i++)
        best_ms(ctx, specs[i], 4096, 256, NULL);
    stof_block_cfg g = {.block_m = 64, .block_n = 64, .warps = 4,
                        .stages = 3, .gather = 1};
    cr_assert_gt(stof__block_smem_bytes(256, &g), 232448u);
    cr_assert_not(stof__block_cfg_valid(&ctx->device, 256, &g, NULL, 0));
    g.gather = 0;
    cr_assert(stof__block_cfg_valid(&ctx->device, 256, &g, NULL, 0));
    stof_close(&ctx);
}

Test(cost, unsupported_head_dim_falls_back)
{
    stof_context *ctx = open_fake_h100();
    stof_mask *m = NULL;
    cr_assert_eq(stof_mask_from_spec(ctx, "causal", 256, 256, &m), STOF_OK);
    stof_attention_desc d;
    stof_attention_desc_init(&d, 1, 1, 256, 256, 40, STOF_DTYPE_FP16,
                             STOF_LAYOUT_BHSD);
    stof_candidate c[4];
    int k = 7;
    cr_assert_eq(stof__cost_rank(ctx, &d, m, c, 4, &k), STOF_ERR_UNSUPPORTED);
    cr_assert_eq(k, 0);
    stof_mask_free(&m);
    stof_close(&ctx);
}

Test(cost, imbalance_is_modelled)
{
    /* Same number of tiles, but in one problem a single row block holds all
     * of them: the makespan must reflect the long CTA. */
    stof_context *ctx = open_fake_h100();
    stof_device *dev = &ctx->device;
    stof_block_cfg cfg = {.block_m = 128, .block_n = 64, .warps = 4, .stages = 2};
    stof_attention_desc d;
    stof_attention_desc_init(&d, 1, 1, 4096, 4096, 64, STOF_DTYPE_FP16,
                             STOF_LAYOUT_BHSD);
    stof_mask *even = NULL, *skew = NULL;
    /* even: a 128-wide band (2 tiles per row block); skew: rows 0..127 see
     * every key, the rest see only their diagonal tile. */
    cr_assert_eq(stof_mask_from_spec(ctx, "sliding:64", 4096, 4096, &even),
                 STOF_OK);
    uint8_t *b = calloc(4096u * 4096u, 1);
    for (int q = 0; q < 4096; q++)
        for (int k = 0; k < 4096; k++)
            b[(size_t)q * 4096 + k] = q < 128 || q / 64 == k / 64;
    cr_assert_eq(stof_mask_from_dense(ctx, b, 4096, 4096, &skew), STOF_OK);
    free(b);
    stof_format *fe = NULL, *fs = NULL;
    cr_assert_eq(stof_format_build(ctx, even, 128, 64, &fe), STOF_OK);
    cr_assert_eq(stof_format_build(ctx, skew, 128, 64, &fs), STOF_OK);
    stof_candidate ce, cs;
    stof__cost_predict(dev, &d, fe, STOF_KERNEL_BLOCK, &cfg, &ce);
    stof__cost_predict(dev, &d, fs, STOF_KERNEL_BLOCK, &cfg, &cs);
    cr_assert_gt(cs.predicted_ms, ce.predicted_ms * 2.0,
                 "skewed %.4f ms vs even %.4f ms", cs.predicted_ms,
                 ce.predicted_ms);
    stof_format_free(&fe);
    stof_format_free(&fs);
    stof_mask_free(&even);
    stof_mask_free(&skew);
    stof_close(&ctx);
}

Test(cost, wgmma_is_ranked_on_hopper_only)
{
    stof_context *ctx = open_fake_h100();
    stof_mask *m = NULL;
    cr_assert_eq(stof_mask_from_spec(ctx, "dense", 4096, 4096, &m), STOF_OK);
    stof_attention_desc d;
    stof_attention_desc_init(&d, 1, 32, 4096, 4096, 128, STOF_DTYPE_FP16,
                             STOF_LAYOUT_BHSD);
    stof_candidate c[256];
    int k = 0;
    ctx->device.ok = 1; /* the model reads the fields only */
    cr_assert_eq(stof__cost_rank(ctx, &d, m, c, 256, &k), STOF_OK);
    int n_wg = 0;
    for (int i = 0; i < k; i++)
        n_wg += c[i].kind == STOF_KERNEL_WGMMA;
    cr_assert_gt(n_wg, 0);
    cr_assert_eq(c[0].kind, STOF_KERNEL_WGMMA, "dense d=128 on Hopper: wgmma");
    /* A negative scale is not supported by the wgmma kernel. */
    d.scale = -0.1f;
    cr_assert_eq(stof__cost_rank(ctx, &d, m, c, 256, &k), STOF_OK);
    for (int i = 0; i < k; i++)
        cr_assert_neq(c[i].kind, STOF_KERNEL_WGMMA);
    d.scale = 0.0f;
    /* Nor K/V expanded over the heads (a head stride of 0): the kernels'
     * launches refuse such strides, so a plan of it must not pick one. */
    d.k_stride[1] = d.v_stride[1] = 0;
    cr_assert_eq(stof__cost_rank(ctx, &d, m, c, 256, &k), STOF_OK);
    cr_assert_gt(k, 0);
    for (int i = 0; i < k; i++)
        cr_assert(c[i].kind != STOF_KERNEL_WGMMA &&
                  c[i].kind != STOF_KERNEL_WGMMA_GATHER);
    stof_attention_desc_init(&d, 1, 32, 4096, 4096, 128, STOF_DTYPE_FP16,
                             STOF_LAYOUT_BHSD);
    /* An A100 gets no wgmma candidate. */
    ctx->device.cc_major = 8;
    ctx->device.max_smem_optin = 166912;
    cr_assert_eq(stof__cost_rank(ctx, &d, m, c, 256, &k), STOF_OK);
    for (int i = 0; i < k; i++)
        cr_assert_neq(c[i].kind, STOF_KERNEL_WGMMA);
    ctx->device.ok = 0;
    stof_mask_free(&m);
    stof_close(&ctx);
}

/* Split-KV: a decode problem (a few CTAs over long key lists) ranks split
 * candidates first, predicted faster than any unsplit one; a prefill that
 * fills the GPU ranks none. */
Test(cost, decode_is_split_and_prefill_is_not)
{
    stof_context *ctx = open_fake_h100();
    static const struct {
        int b, h, sq, sk;
        int split;
    } probs[] = {{1, 8, 1, 32768, 1}, {2, 16, 16, 16384, 1},
                 {1, 32, 1, 4096, 1}, {4, 16, 4096, 4096, 0},
                 {64, 32, 1, 2048, 0}};
    for (size_t i = 0; i < sizeof(probs) / sizeof(probs[0]); i++) {
        stof_mask *m = NULL;
        cr_assert_eq(stof_mask_from_spec(ctx, "dense", probs[i].sq,
                                         probs[i].sk, &m),
                     STOF_OK);
        stof_attention_desc d;
        stof_attention_desc_init(&d, probs[i].b, probs[i].h, probs[i].sq,
                                 probs[i].sk, 128, STOF_DTYPE_BF16,
                                 STOF_LAYOUT_BHSD);
        stof_candidate c[512];
        int k = 0;
        cr_assert_eq(stof__cost_rank(ctx, &d, m, c, 512, &k), STOF_OK);
        double best_split = INFINITY, best_plain = INFINITY;
        for (int j = 0; j < k; j++) {
            cr_assert(c[j].splits == 0 ||
                          (c[j].splits >= 2 && c[j].splits <= STOF_SPLIT_MAX),
                      "split count %d", c[j].splits);
            cr_assert_eq(c[j].cfg.split, c[j].splits > 1);
            double *best = c[j].splits > 1 ? &best_split : &best_plain;
            if (c[j].predicted_ms < *best)
                *best = c[j].predicted_ms;
        }
        if (probs[i].split) {
            cr_assert_gt(c[0].splits, 1, "%dx%dx%dx%d: first candidate not "
                         "split", probs[i].b, probs[i].h, probs[i].sq,
                         probs[i].sk);
            /* One row block of 8 (b, h): spread over the SMs, several
             * times faster. */
            if (probs[i].b * probs[i].h <= 8)
                cr_assert_lt(best_split, best_plain / 4, "split %.4f vs "
                             "plain %.4f", best_split, best_plain);
        } else {
            cr_assert(isinf(best_split), "%dx%dx%dx%d ranked a split "
                      "candidate", probs[i].b, probs[i].h, probs[i].sq,
                      probs[i].sk);
        }
        stof_mask_free(&m);
    }
    stof_close(&ctx);
}

/* A decode tile is bound by memory: its time grows with the keys read,
 * not with the 64 or 128 query rows the tile computes. */
Test(cost, decode_tiles_cost_their_memory)
{
    stof_context *ctx = open_fake_h100();
    stof_mask *m = NULL;
    cr_assert_eq(stof_mask_from_spec(ctx, "dense", 1, 8192, &m), STOF_OK);
    stof_attention_desc d;
    stof_attention_desc_init(&d, 32, 32, 1, 8192, 128, STOF_DTYPE_BF16,
                             STOF_LAYOUT_BHSD);
    stof_format *f = NULL;
    cr_assert_eq(stof_format_build(ctx, m, 64, 64, &f), STOF_OK);
    stof_block_cfg cfg = {.block_m = 64, .block_n = 64, .warps = 4,
                          .stages = 2};
    const double ms = stof__cost_predict(&ctx->device, &d, f,
                                         STOF_KERNEL_BLOCK, &cfg, NULL);
    /* 4.3 GB of K and V at 3.0 TB/s: 1.43 ms, plus the CTAs' start. */
    cr_assert(ms > 1.4 && ms < 2.2, "predicted %.3f ms", ms);
    stof_format_free(&f);
    stof_mask_free(&m);
    stof_close(&ctx);
}

/* The one allocation of a row-wise format (stof__rowwise_layout), as the
 * upload and the GPU builder both lay it out: every array 256-byte aligned
 * after the one before it, room for each, 256 bytes to spare, and 0 for
 * sizes that do not fit. */
Test(cost, rowwise_layout_holds_every_array)
{
    static const int64_t cases[][5] = {
        /* row blocks, keys, tiles, bitmaps, block_m */
        {1, 0, 0, 0, 64}, {64, 4096, 300, 120, 128}, {7, 33, 5, 5, 16},
        {1000, 1 << 20, 20000, 20000, 128}};
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        const int nrb = (int)cases[i][0], bm = (int)cases[i][4], bwpr = 2;
        const int64_t nk = cases[i][1], nt = cases[i][2], nb = cases[i][3];
        stof_rowwise_layout l;
        const size_t total = stof__rowwise_layout(nrb, nk, nt, nb, bm, bwpr, &l);
        cr_assert_eq(total, l.total);
        const size_t off[6] = {l.key_ptr, l.keys, l.tile_ptr, l.kind,
                               l.bitmap_idx, l.bitmaps};
        const size_t need[6] = {
            (size_t)(nrb + 1) * 4u, (size_t)nk * 4u, (size_t)(nrb + 1) * 4u,
            (size_t)nt, (size_t)nt * 4u, (size_t)nb * (size_t)bm * bwpr * 4u};
        cr_assert_eq(off[0], 0u);
        for (int a = 0; a < 6; a++) {
            cr_assert_eq(off[a] % 256u, 0u, "case %zu array %d", i, a);
            const size_t end = a < 5 ? off[a + 1] : total - 256u;
            cr_assert_geq(end, off[a] + need[a], "case %zu array %d", i, a);
            cr_assert_lt(end, off[a] + need[a] + 256u, "case %zu array %d",
                         i, a);
        }
        stof_rowwise_format rf;
        memset(&rf, 0, sizeof(rf));
        stof__rowwise_format_at(&rf, 0x100000, &l);
        cr_assert(rf.mem == 0x100000 && rf.bytes == total &&
                      rf.keys == 0x100000 + l.keys &&
                      rf.bitmaps == 0x100000 + l.bitmaps,
                  "view");
    }
    stof_rowwise_layout l;
    cr_assert_eq(stof__rowwise_layout(4, 10, 10, INT64_MAX / 2, 128, 4, &l), 0u);
    cr_assert_eq(stof__rowwise_layout(4, -1, 10, 1, 128, 4, &l), 0u);
}

/* The launches' shared rules (attn_split.h), without a GPU: the split-KV
 * workspace and grid, the score modifiers' match and launch values, the
 * option defines of a build. */
Test(cost, split_and_modifier_rules)
{
    stof_attention_desc d;
    stof_attention_desc_init(&d, 2, 8, 16, 4096, 128, STOF_DTYPE_BF16,
                             STOF_LAYOUT_BHSD);
    /* n_split x batch x heads x seq_q rows of head_dim floats (rounded up
     * to 256 bytes), then one float each. */
    const size_t rows = 4u * 2u * 8u * 16u;
    cr_assert_eq(stof__split_bytes(4, &d), rows * 128u * 4u + rows * 4u);
    cr_assert_eq(stof__split_bytes(0, &d), 0u);
    cr_assert_eq(stof__split_bytes(STOF_SPLIT_MAX + 1, &d), 0u);
    stof_attention_desc big = d;
    big.batch = 65535;
    big.seq_q = 1 << 30;
    cr_assert_eq(stof__split_bytes(64, &big), 0u, "overflow not refused");
    stof_attn_ext x = {0};
    stof__split_parts(4096, 4, &d, &x);
    cr_assert_eq(x.n_split, 4);
    cr_assert_eq(x.o_part, 4096u);
    cr_assert_eq(x.lse_part, 4096u + rows * 128u * 4u);
    cr_assert_eq(x.lse_part % 256u, 0u);
    /* The grid's z: 1 unsplit, n_split split, 0 on a mismatch. */
    cr_assert_eq(stof__split_grid_z(0, NULL), 1u);
    cr_assert_eq(stof__split_grid_z(0, &x), 0u, "split launch, unsplit kernel");
    cr_assert_eq(stof__split_grid_z(1, &x), 4u);
    cr_assert_eq(stof__split_grid_z(1, NULL), 0u);
    stof_attn_ext nop = {0};
    cr_assert_eq(stof__split_grid_z(1, &nop), 0u, "no partials");
    /* Modifiers: the problem's, and whether a build matches a launch. */
    cr_assert_eq(stof__attn_mods(&d), 0);
    stof_attention_desc m = d;
    const float slopes[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    m.softcap = 30.0f;
    cr_assert_eq(stof__attn_mods(&m), STOF_MOD_SOFTCAP);
    m.alibi_slopes = slopes;
    cr_assert_eq(stof__attn_mods(&m), STOF_MOD_SOFTCAP | STOF_MOD_ALIBI);
    stof_attn_ext a = {.alibi = 256};
    cr_assert(stof__mods_match(STOF_MOD_SOFTCAP | STOF_MOD_ALIBI, &m, &a));
    cr_assert_not(stof__mods_match(STOF_MOD_SOFTCAP, &m, &a));
    cr_assert_not(stof__mods_match(STOF_MOD_ALIBI, &m, NULL));
    cr_assert(stof__mods_match(0, &d, NULL));
    cr_assert_not(stof__mods_match(STOF_MOD_SOFTCAP, &d, NULL));
    /* A bias: in the problem's modifiers, and a BIAS=1 build matches only
     * a launch that has the tensor. */
    stof_attention_desc bd = d;
    bd.bias = 1;
    cr_assert_eq(stof__attn_mods(&bd), STOF_MOD_BIAS);
    stof_attn_ext bx = {.bias = 512};
    cr_assert(stof__mods_match(STOF_MOD_BIAS, &bd, &bx));
    cr_assert_not(stof__mods_match(STOF_MOD_BIAS, &bd, NULL));
    cr_assert_not(stof__mods_match(0, &bd, &bx));
    cr_assert_not(stof__mods_match(STOF_MOD_BIAS, &d, &bx));
    float cin = -1.0f, cout = -1.0f;
    stof__softcap_params(30.0f, 0.125f, &cin, &cout);
    cr_assert_float_eq(cin, 0.125f / 30.0f, 1e-9f);
    cr_assert_float_eq(cout, 30.0f * 1.4426950408889634f, 1e-4f);
    stof__softcap_params(0.0f, 0.125f, &cin, &cout);
    cr_assert(cin == 0.0f && cout == 0.0f);
    /* Option defines in a fixed order, only those set. */
    const char *defs[8] = {"HEAD_DIM=64"};
    int n = stof__attn_option_defines(1, 1, STOF_MOD_SOFTCAP | STOF_MOD_ALIBI,
                                      defs, 1);
    cr_assert_eq(n, 5);
    cr_assert_str_eq(defs[1], "GATHER=1");
    cr_assert_str_eq(defs[2], "SPLIT=1");
    cr_assert_str_eq(defs[3], "SOFTCAP=1");
    cr_assert_str_eq(defs[4], "ALIBI=1");
    cr_assert_eq(stof__attn_option_defines(0, 0, 0, defs, 1), 1);
    cr_assert_eq(stof__attn_option_defines(0, 0, STOF_MOD_BIAS, defs, 1), 2);
    cr_assert_str_eq(defs[1], "BIAS=1");
    /* The build rules: ALiBi needs block mode (key indices). */
    char why[200];
    stof_block_cfg g = {.block_m = 64, .block_n = 64, .warps = 4,
                        .stages = 2, .gather = 1, .mods = STOF_MOD_ALIBI};
    cr_assert_not(stof__block_cfg_valid(NULL, 64, &g, why, sizeof(why)));
    cr_assert(strstr(why, "ALiBi"), "%s", why);
    g.mods = STOF_MOD_SOFTCAP;
    cr_assert(stof__block_cfg_valid(NULL, 64, &g, why, sizeof(why)), "%s",
              why);
    g.mods = 7;
    cr_assert_not(stof__block_cfg_valid(NULL, 64, &g, why, sizeof(why)));
    g.mods = 8;
    cr_assert_not(stof__block_cfg_valid(NULL, 64, &g, why, sizeof(why)));
    cr_assert(strstr(why, "mods 8"), "%s", why);
    g.mods = STOF_MOD_BIAS; /* gather: no key indices for the bias */
    cr_assert_not(stof__block_cfg_valid(NULL, 64, &g, why, sizeof(why)));
    cr_assert(strstr(why, "bias"), "%s", why);
    g.gather = 0;
    g.mods = STOF_MOD_ALL;
    cr_assert(stof__block_cfg_valid(NULL, 64, &g, why, sizeof(why)), "%s",
              why);
    stof_wgmma_cfg w = {.block_n = 128, .stages = 2, .overlap = 1,
                        .gather = 1, .mods = STOF_MOD_ALIBI};
    cr_assert_not(stof__wgmma_cfg_valid(NULL, 128, &w, why, sizeof(why)));
    cr_assert(strstr(why, "ALiBi"), "%s", why);
    w.mods = STOF_MOD_BIAS;
    cr_assert_not(stof__wgmma_cfg_valid(NULL, 128, &w, why, sizeof(why)));
    w.gather = 0;
    cr_assert(stof__wgmma_cfg_valid(NULL, 128, &w, why, sizeof(why)), "%s",
              why);
}

/* The persistent wgmma kernel: ranked in block mode only and never split;
 * on many short row blocks (a 256-key sliding window at 16k tokens) it is
 * predicted faster than the same cfg launched one CTA per row block,
 * whose every CTA pays its start and epilogue in the open. */
Test(cost, persistent_kernel_is_ranked_for_short_row_blocks)
{
    stof_context *ctx = open_fake_h100();
    ctx->device.ok = 1; /* the model reads the fields only */
    stof_mask *m = NULL;
    cr_assert_eq(stof_mask_from_spec(ctx, "sliding:256", 16384, 16384, &m),
                 STOF_OK);
    stof_attention_desc d;
    stof_attention_desc_init(&d, 1, 16, 16384, 16384, 64, STOF_DTYPE_BF16,
                             STOF_LAYOUT_BHSD);
    stof_candidate c[512];
    int k = 0;
    cr_assert_eq(stof__cost_rank(ctx, &d, m, c, 512, &k), STOF_OK);
    int n_persist = 0;
    for (int i = 0; i < k; i++) {
        if (!c[i].wcfg.persist)
            continue;
        n_persist++;
        cr_assert_eq(c[i].kind, STOF_KERNEL_WGMMA);
        cr_assert_eq(c[i].splits, 0);
        /* The same cfg, one CTA per row block. */
        int found = 0;
        for (int j = 0; j < k && !found; j++) {
            const stof_wgmma_cfg *a = &c[i].wcfg, *b = &c[j].wcfg;
            if (c[j].kind != STOF_KERNEL_WGMMA || b->persist ||
                c[j].splits || a->block_n != b->block_n ||
                a->stages != b->stages ||
                stof__wgmma_block_m(a) != stof__wgmma_block_m(b))
                continue;
            found = 1;
            /* 128 rows: one CTA an SM either way, the persistent one
             * saves each later item's start. 64 rows: several CTAs an SM,
             * whose hardware scheduling the persistent grid's static deal
             * does not beat (H100, sliding:256 at 4096 tokens: 2%
             * slower): close. */
            if (c[i].ctas_per_sm < c[j].ctas_per_sm)
                /* Its second Q buffer fits fewer CTAs an SM (measured:
                 * 64x128 s3, 1 against 2: 0.198 against 0.135 ms). */
                cr_assert_gt(c[i].predicted_ms, c[j].predicted_ms);
            else if (stof__wgmma_block_m(a) == 64)
                cr_assert(c[i].predicted_ms < 1.1 * c[j].predicted_ms &&
                              c[j].predicted_ms < 1.1 * c[i].predicted_ms,
                          "persistent 64x%d s%d %.4f ms vs %.4f", a->block_n,
                          a->stages, c[i].predicted_ms, c[j].predicted_ms);
            else
                cr_assert_lt(c[i].predicted_ms, c[j].predicted_ms,
                             "persistent %dx%d s%d %.4f ms vs %.4f",
                             stof__wgmma_block_m(a), a->block_n, a->stages,
                             c[i].predicted_ms, c[j].predicted_ms);
        }
        cr_assert(found);
    }
    cr_assert_gt(n_persist, 0);
    stof_mask_free(&m);
    stof_close(&ctx);
}

/* Rank every candidate for attention B x H x N x N x D (fp16) under mask
 * `spec` into c[0..cap); returns how many. */
static int rank_problem(stof_context *ctx, const char *spec, int B, int H,
                        int N, int D, stof_candidate *c, int cap)
{
    stof_mask *m = NULL;
    cr_assert_eq(stof_mask_from_spec(ctx, spec, N, N, &m), STOF_OK);
    stof_attention_desc d;
    stof_attention_desc_init(&d, B, H, N, N, D, STOF_DTYPE_FP16,
                             STOF_LAYOUT_BHSD);
    int k = 0;
    cr_assert_eq(stof__cost_rank(ctx, &d, m, c, cap, &k), STOF_OK, "%s",
                 stof_errmsg(ctx));
    stof_mask_free(&m);
    return k;
}

/* The predicted ms of the wgmma candidate 64 x bn, `stages`, on c[0..k). */
static double m64_ms(const stof_candidate *c, int k, int bn, int stages,
                     int persist)
{
    for (int i = 0; i < k; i++)
        if (c[i].kind == STOF_KERNEL_WGMMA && !c[i].splits &&
            stof__wgmma_block_m(&c[i].wcfg) == 64 &&
            c[i].wcfg.block_n == bn && c[i].wcfg.stages == stages &&
            c[i].wcfg.persist == persist)
            return c[i].predicted_ms;
    cr_assert_fail("no 64x%d s%d%s candidate", bn, stages,
                   persist ? " persistent" : "");
    return 0;
}

Test(cost, row_blocks_of_64_are_ranked_by_the_ctas_an_sm_holds)
{
    /* One consumer warpgroup a CTA: an SM holding one 64-row CTA leaves
     * the tensor cores idle during its softmax, three hide it (H100,
     * 2026-11-25, bench/RESULTS.md: sliding:256 4x16x4096x64 64x64 s2
     * (3 an SM) 0.117 ms, 64x64 s4 (2) 0.140, 64x128 s4 (1) 0.212; the
     * best 128-row kernel 0.132). */
    /* head_dim, block_n, stages -> 64-row CTAs an SM. */
    static const int fits[][4] = {
        {64, 64, 2, 3}, {64, 64, 4, 2}, {64, 128, 4, 1}, {128, 64, 3, 1}};
    for (size_t i = 0; i < sizeof(fits) / sizeof(fits[0]); i++) {
        const stof_wgmma_cfg wc = {.block_n = fits[i][1],
                                   .stages = fits[i][2],
                                   .overlap = 1,
                                   .block_m = 64};
        cr_expect_eq(stof__wgmma_ctas_per_sm(fits[i][0], &wc), fits[i][3],
                     "d%d 64x%d s%d", fits[i][0], fits[i][1], fits[i][2]);
    }
    /* Without the overlap, two stages, block mode: four (64 registers a
     * thread); gathered or with three stages, three. */
    stof_wgmma_cfg w4 = {.block_n = 64, .stages = 2, .block_m = 64};
    cr_expect_eq(stof__wgmma_ctas_per_sm(64, &w4), 4);
    w4.persist = 1;
    cr_expect_eq(stof__wgmma_ctas_per_sm(64, &w4), 4);
    w4.gather = 1;
    cr_expect_eq(stof__wgmma_ctas_per_sm(64, &w4), 3);
    w4.gather = 0;
    w4.stages = 3;
    cr_expect_eq(stof__wgmma_ctas_per_sm(64, &w4), 3);
    stof_context *ctx = open_fake_h100();
    ctx->device.ok = 1;
    static stof_candidate c[1024];
    int k = rank_problem(ctx, "sliding:256", 4, 16, 4096, 64, c, 1024);
    const double o3 = m64_ms(c, k, 64, 2, 0), o2 = m64_ms(c, k, 64, 4, 0),
                 o1 = m64_ms(c, k, 128, 4, 0);
    cr_expect(o3 < o2 && o2 < o1, "3 an SM %.4f, 2 %.4f, 1 %.4f", o3, o2, o1);
    /* The measured best leads the non-persistent wgmma kernels. */
    for (int i = 0; i < k; i++)
        if (c[i].kind == STOF_KERNEL_WGMMA && !c[i].wcfg.persist) {
            cr_expect_eq(stof__wgmma_block_m(&c[i].wcfg), 64);
            cr_expect_eq(c[i].wcfg.block_n, 64);
            cr_expect_lt(c[i].wcfg.stages, 4);
            break;
        }
    /* head_dim 128: 64 x 64 with 2 stages fits twice, 3 stages once
     * (dense 4x16x2048x128: 0.264 against 0.398 ms). */
    k = rank_problem(ctx, "dense", 4, 16, 2048, 128, c, 1024);
    const double two = m64_ms(c, k, 64, 2, 0), one = m64_ms(c, k, 64, 3, 0);
    cr_expect_lt(two * 1.2, one, "2 an SM %.4f, 1 %.4f", two, one);
    stof_close(&ctx);
}

Test(cost, persistent_schedule_groups_fit_the_l2)
{
    /* Groups of the persistent schedule: the K and V of a group within a
     * third of the L2 (50 MB: 16.7 MB). */
    stof_device dl2 = {.ok = 1, .sm_count = 132, .l2_bytes = 50 << 20};
    stof_attention_desc gd;
    /* 4096 keys x 64: 1 MiB a head -> 16 of the 64 pairs. */
    stof_attention_desc_init(&gd, 4, 16, 4096, 4096, 64, STOF_DTYPE_FP16,
                             STOF_LAYOUT_BHSD);
    cr_expect_eq(stof__wgmma_persist_group(&dl2, &gd), 16);
    /* All 64 fit at 1024 keys: one group (0). */
    stof_attention_desc_init(&gd, 4, 16, 1024, 1024, 64, STOF_DTYPE_FP16,
                             STOF_LAYOUT_BHSD);
    cr_expect_eq(stof__wgmma_persist_group(&dl2, &gd), 0);
    /* 16384 x 128: 8 MiB a head -> 2. */
    stof_attention_desc_init(&gd, 1, 32, 16384, 16384, 128, STOF_DTYPE_BF16,
                             STOF_LAYOUT_BHSD);
    cr_expect_eq(stof__wgmma_persist_group(&dl2, &gd), 2);
    /* GQA, 8 query heads a K/V head: 1 MiB a query head -> 16, whole K/V
     * heads of 8; a K/V head larger than the budget still makes a group. */
    gd.kv_heads = 4;
    cr_expect_eq(stof__wgmma_persist_group(&dl2, &gd), 16);
    stof_attention_desc_init(&gd, 1, 32, 131072, 131072, 128,
                             STOF_DTYPE_BF16, STOF_LAYOUT_BHSD);
    gd.kv_heads = 4;
    cr_expect_eq(stof__wgmma_persist_group(&dl2, &gd), 8);
    /* No device: 48 MB assumed. */
    stof_attention_desc_init(&gd, 4, 16, 4096, 4096, 64, STOF_DTYPE_FP16,
                             STOF_LAYOUT_BHSD);
    cr_expect_eq(stof__wgmma_persist_group(NULL, &gd), 16);

    /* The schedule: 32 equal row blocks (dense) over 132 CTAs -> groups
     * of 16 by rank; a causal staircase -> groups too (by rank or in
     * pairs of ranks), dealt within 3% of the in-order balance; two heavy
     * rows and thirty light ones (neither grouping deals them evenly) ->
     * in order. */
    double w[32], t[132];
    for (int i = 0; i < 32; i++)
        w[i] = 32.0;
    cr_expect_eq(stof__wgmma_persist_heads(&dl2, &gd, w, 32, 132), 16);
    for (int i = 0; i < 32; i++)
        w[i] = 32.0 - i;
    const int stair = stof__wgmma_persist_heads(&dl2, &gd, w, 32, 132);
    cr_expect(stair == 16 || stair == -16, "%d", stair);
    const double in_order =
        stof__wgmma_persist_deal_max(w, 32, 64, 0, 132, 8.25, t);
    const double chosen =
        stof__wgmma_persist_deal_max(w, 32, 64, stair, 132, 8.25, t);
    cr_expect_leq(chosen, 1.03 * in_order, "%g vs %g", chosen, in_order);
    for (int i = 0; i < 32; i++)
        w[i] = i < 2 ? 400.0 : 1.0;
    cr_expect_eq(stof__wgmma_persist_heads(&dl2, &gd, w, 32, 132), 0);
    /* ... and never when every pair fits in one group. */
    stof_attention_desc_init(&gd, 4, 16, 1024, 1024, 64, STOF_DTYPE_FP16,
                             STOF_LAYOUT_BHSD);
    for (int i = 0; i < 32; i++)
        w[i] = 8.0;
    cr_expect_eq(stof__wgmma_persist_heads(&dl2, &gd, w, 8, 132), 0);
}

/* The deal's loads, as its definition states them by division (item pos
 * of the deal: its group, rank and head; slot pos % slots, every other
 * round reversed): the counter form must add the same values in the same
 * order, so the loads come out bit for bit the same. */
static double deal_by_division(const double *w, int nrb, int64_t bh, int hg,
                               int slots, double over, double *t)
{
    memset(t, 0, sizeof(*t) * (size_t)slots);
    const int64_t g = hg == 0 ? bh : hg > 0 ? hg : -(int64_t)hg;
    const int64_t gn = g < bh ? g : bh;
    const int64_t np = hg < 0 ? (nrb + 1) / 2 : nrb, gs = gn * np;
    for (int64_t pos = 0; pos < bh * np; pos++) {
        const int64_t j = pos / gs, g0 = j * gn;
        const int64_t n = bh - g0 < gn ? bh - g0 : gn;
        const int64_t i = (pos - j * gs) / n, i2 = nrb - 1 - i;
        const int64_t round = pos / slots, x = pos % slots;
        t[round & 1 ? slots - 1 - x : x] +=
            w[i] + over + (hg < 0 && i2 != i ? w[i2] + over : 0.0);
    }
    double m = 0.0;
    for (int i = 0; i < slots; i++)
        if (t[i] > m)
            m = t[i];
    return m;
}

Test(cost, persist_deal_loads_as_defined)
{
    static const struct {
        int nrb;
        int64_t bh;
        int slots;
    } cases[] = {{32, 192, 396}, {7, 13, 5}, {1, 1, 1}, {33, 64, 132},
                 {8, 3, 16}};
    double w[64], t1[400], t2[400];
    for (size_t c = 0; c < sizeof(cases) / sizeof(*cases); c++) {
        const int nrb = cases[c].nrb, slots = cases[c].slots;
        for (int i = 0; i < nrb; i++)
            w[i] = 1.0 + (double)((i * 37) % 11) + 0.25 * i;
        const int hgs[] = {0, 1, 4, -4, 5, -5, 16, -16, 1000, -1000};
        for (size_t h = 0; h < sizeof(hgs) / sizeof(*hgs); h++) {
            const double a = stof__wgmma_persist_deal_max(
                w, nrb, cases[c].bh, hgs[h], slots, 0.75, t1);
            const double b = deal_by_division(w, nrb, cases[c].bh, hgs[h],
                                              slots, 0.75, t2);
            cr_expect_eq(a, b, "case %zu hg %d: max %.17g vs %.17g", c,
                         hgs[h], a, b);
            cr_expect(memcmp(t1, t2, sizeof(double) * (size_t)slots) == 0,
                      "case %zu hg %d: the slots' loads differ", c, hgs[h]);
        }
    }
}

/* 192-row wgmma CTAs (head_dim 64): their rules, the 64-row formats they
 * read (stof__wgmma_uniform_triples: every three row blocks the same full
 * tiles), and their candidates: for masks with such formats only. */
Test(cost, wgmma_192_rows)
{
    char why[256];
    const stof_wgmma_cfg c192 = {128, 2, 1, 0, 192, 0, 0, 0};
    cr_expect(stof__wgmma_cfg_valid(NULL, 64, &c192, why, sizeof(why)), "%s",
              why);
    cr_expect_eq(stof__wgmma_block_m(&c192), 192);
    cr_expect_eq(stof__wgmma_format_block_m(&c192), 64);
    cr_expect_eq(stof__wgmma_row_blocks(&c192, 1000), 6);
    cr_expect_eq(stof__wgmma_row_blocks(&c192, 192), 1);
    const stof_wgmma_cfg c128 = {128, 2, 1, 0, 0, 0, 0, 0};
    cr_expect_eq(stof__wgmma_format_block_m(&c128), 128);
    /* Q 192 x 128 B, K and V 2 x 2 x 16 KiB, bitmaps 2 x 192 x 16 B, nine
     * barriers, meta, alignment slack. */
    cr_expect_eq(stof__wgmma_smem_bytes(64, &c192),
                 24576u + 65536u + 6144u + 72u + 16u + 1024u);
    cr_expect_not(stof__wgmma_cfg_valid(NULL, 128, &c192, why, sizeof(why)));
    cr_expect(strstr(why, "block_m 192") != NULL, "%s", why);
    const stof_wgmma_cfg bad[] = {
        {128, 2, 1, 1, 192, 0, 0, 0},                 /* gather */
        {128, 2, 1, 0, 192, 1, 0, 0},                 /* split */
        {128, 2, 1, 0, 192, 0, STOF_MOD_ALIBI, 0},    /* ALiBi */
        {128, 2, 1, 0, 192, 0, STOF_MOD_BIAS, 0},     /* bias tensor */
        {128, 2, 1, 0, 96, 0, 0, 0},                  /* not a size */
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(*bad); i++) {
        why[0] = '\0';
        cr_expect_not(stof__wgmma_cfg_valid(NULL, 64, &bad[i], why,
                                            sizeof(why)),
                      "case %zu accepted", i);
        cr_expect(strstr(why, "block_m") != NULL, "case %zu: %s", i, why);
    }
    const stof_wgmma_cfg cap = {128, 3, 1, 0, 192, 0, STOF_MOD_SOFTCAP, 1};
    cr_expect(stof__wgmma_cfg_valid(NULL, 64, &cap, why, sizeof(why)), "%s",
              why);

    stof_context *ctx = open_fake_h100();
    ctx->device.ok = 1; /* the model reads the fields only */
    static const struct {
        const char *spec;
        int n, bm, uniform;
    } fm[] = {
        {"dense", 1000, 64, 1},  {"none", 300, 64, 1},
        {"dense", 64, 64, 1},    {"causal", 1000, 64, 0},
        {"sliding:256", 1000, 64, 0}, {"bigbird:64:3:2:3:1", 1024, 64, 0},
        {"dense", 1000, 128, 0}, /* not a 64-row format */
    };
    for (size_t i = 0; i < sizeof(fm) / sizeof(*fm); i++) {
        stof_mask *m = NULL;
        cr_assert_eq(stof_mask_from_spec(ctx, fm[i].spec, fm[i].n, fm[i].n,
                                         &m),
                     STOF_OK);
        stof_format *f = NULL;
        cr_assert_eq(stof_format_build(ctx, m, fm[i].bm, 128, &f), STOF_OK);
        cr_expect_eq(stof__wgmma_uniform_triples(f), fm[i].uniform,
                     "%s %d at %d rows", fm[i].spec, fm[i].n, fm[i].bm);
        stof_format_free(&f);
        stof_mask_free(&m);
    }
    cr_expect_not(stof__wgmma_uniform_triples(NULL));
    /* A format built on the GPU comes with counts only (no col_idx): every
     * row block listing every key block decides it (dense); otherwise not
     * (causal with its tiles called full: the lists differ, and unread). */
    {
        stof_mask *m = NULL;
        stof_format *f = NULL;
        cr_assert_eq(stof_mask_from_spec(ctx, "dense", 1000, 700, &m), STOF_OK);
        cr_assert_eq(stof_format_build(ctx, m, 64, 128, &f), STOF_OK);
        int32_t *cols = f->col_idx;
        f->col_idx = NULL;
        cr_expect(stof__wgmma_uniform_triples(f));
        f->col_idx = cols;
        stof_format_free(&f);
        stof_mask_free(&m);
        cr_assert_eq(stof_mask_from_spec(ctx, "causal", 1000, 1000, &m),
                     STOF_OK);
        cr_assert_eq(stof_format_build(ctx, m, 64, 128, &f), STOF_OK);
        memset(f->kind, STOF_TILE_FULL, (size_t)f->row_ptr[f->n_row_blocks]);
        cr_expect_not(stof__wgmma_uniform_triples(f));
        cols = f->col_idx;
        f->col_idx = NULL;
        cr_expect_not(stof__wgmma_uniform_triples(f));
        f->col_idx = cols;
        stof_format_free(&f);
        stof_mask_free(&m);
    }

    /* Ranked for dense head_dim 64 (valid, folded to 192-row items), not
     * for causal or head_dim 128. */
    static const struct {
        const char *spec;
        int hd, want;
    } rk[] = {{"dense", 64, 1}, {"causal", 64, 0}, {"dense", 128, 0}};
    for (size_t i = 0; i < sizeof(rk) / sizeof(*rk); i++) {
        stof_mask *m = NULL;
        cr_assert_eq(stof_mask_from_spec(ctx, rk[i].spec, 4096, 4096, &m),
                     STOF_OK);
        stof_attention_desc d;
        stof_attention_desc_init(&d, 1, 12, 4096, 4096, rk[i].hd,
                                 STOF_DTYPE_FP16, STOF_LAYOUT_BHSD);
        stof_candidate c[512];
        int k = 0, n192 = 0;
        cr_assert_eq(stof__cost_rank(ctx, &d, m, c, 512, &k), STOF_OK);
        for (int j = 0; j < k; j++) {
            if (c[j].kind != STOF_KERNEL_WGMMA ||
                stof__wgmma_block_m(&c[j].wcfg) != 192)
                continue;
            n192++;
            cr_expect(stof__wgmma_cfg_valid(&ctx->device, rk[i].hd,
                                            &c[j].wcfg, why, sizeof(why)),
                      "%s", why);
            cr_expect_eq(c[j].cfg.block_m, 192);
            cr_expect(isfinite(c[j].predicted_ms) && c[j].predicted_ms > 0);
            /* The work of one head: 22 row blocks of 192 (the 64 of the
             * format, folded by three), each all 32 key blocks. */
            cr_expect_eq((int64_t)c[j].work_tiles, (int64_t)22 * 32,
                         "work %g", c[j].work_tiles);
        }
        cr_expect_eq(n192 > 0, rk[i].want, "%s d=%d: %d candidates of 192 rows",
                     rk[i].spec, rk[i].hd, n192);
        stof_mask_free(&m);
    }
    stof_close(&ctx);
}

/* The persistent kernel's list schedule: every item once, each slot's
 * items in the deal's order (group by group), the busiest slot within one
 * item of the mean (longest first onto the least loaded), and no list past
 * STOF_PERSIST_LIST_MAX. */
/* splitmix64: the random cases' numbers. */
static uint64_t rng_next(uint64_t *x)
{
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* Each item of the deal goes to the least loaded slot, the lowest of equal
 * ones: found here by scanning every slot, the list must be the same item
 * for item (the library deals by levels of equal load). */
static void check_deal(const double *w, int nrb, int64_t bh, int hg,
                       int slots, double over, int id)
{
    const int64_t items = nrb * bh;
    size_t n = 0;
    int32_t *l = stof__wgmma_persist_list(w, nrb, bh, hg, slots, over, &n);
    cr_assert_not_null(l);
    cr_assert_eq(n, (size_t)slots + 1 + (size_t)items);
    /* The reference deal: the slot of each item in the deal's order. */
    int32_t *slot_of = malloc(sizeof(int32_t) * (size_t)items);
    int32_t *want = malloc(sizeof(int32_t) * (size_t)items);
    int *used = calloc((size_t)slots, sizeof(int));
    double *load = calloc((size_t)slots, sizeof(double));
    cr_assert(slot_of && want && used && load);
    const int64_t gn = hg > 0 && hg < bh ? hg : bh;
    int64_t k = 0;
    for (int64_t g0 = 0; g0 < bh; g0 += gn)
        for (int r = 0; r < nrb; r++)
            for (int64_t b = g0; b < g0 + gn && b < bh; b++, k++) {
                int best = 0;
                for (int x = 1; x < slots; x++)
                    if (load[x] < load[best])
                        best = x;
                load[best] += w[r] + over;
                slot_of[k] = best;
                want[k] = (int32_t)((int64_t)r * bh + b);
            }
    /* Slot x's items, in the deal's order, are its part of the list. */
    for (int64_t i = 0; i < items; i++) {
        const int x = slot_of[i];
        cr_assert_eq(l[slots + 1 + l[x] + used[x]], want[i],
                     "case %d (nrb %d, bh %lld, hg %d, %d slots): item %lld "
                     "of slot %d",
                     id, nrb, (long long)bh, hg, slots, (long long)i, x);
        used[x]++;
    }
    for (int x = 0; x < slots; x++)
        cr_assert_eq(l[x + 1] - l[x], used[x], "case %d: slot %d", id, x);
    free(slot_of);
    free(want);
    free(used);
    free(load);
    free(l);
}

Test(cost, persist_list_gives_each_item_to_the_least_loaded_slot)
{
    static const struct {
        int nrb, slots, hg;
        int64_t bh;
    } cases[] = {{32, 396, 0, 192}, {32, 396, 24, 192}, {7, 5, 4, 13},
                 {1, 1, 0, 1},      {33, 132, 16, 64},  {5, 50, 0, 3},
                 {6, 7, 3, 9},      {40, 130, 0, 200}};
    double w[64];
    for (size_t c = 0; c < sizeof(cases) / sizeof(*cases); c++) {
        for (int i = 0; i < cases[c].nrb; i++) /* heaviest first, ties */
            w[i] = i < 2 ? 128.0 : 40.0 - (double)(i / 3);
        check_deal(w, cases[c].nrb, cases[c].bh, cases[c].hg, cases[c].slots,
                   18.0, (int)c);
    }
    /* Random ones: many equal loads (small integer weights, zero weights,
     * no fixed cost), equal weights, fractions. */
    uint64_t x = 0x5eed;
    for (int c = 0; c < 3000; c++) {
        const int nrb = 1 + (int)(rng_next(&x) % 40);
        const int64_t bh = 1 + (int64_t)(rng_next(&x) % 30);
        const int slots = 1 + (int)(rng_next(&x) % 70);
        const int hg = rng_next(&x) % 3 == 0 ? 0 : 1 + (int)(rng_next(&x) % 40);
        const int mode = (int)(rng_next(&x) % 3);
        for (int i = 0; i < nrb; i++)
            w[i] = mode == 0   ? (double)(rng_next(&x) % 4)
                   : mode == 1 ? 1.0
                               : (double)(rng_next(&x) % 1000) / 97.0;
        const double over = mode == 0 ? (double)(rng_next(&x) % 3)
                                      : rng_next(&x) % 2 ? 0.5 : 0.0;
        check_deal(w, nrb, bh, hg, slots, over, 100 + c);
    }
}

Test(cost, persist_list_deals_every_item_once_and_balanced)
{
    const double w[7] = {32, 32, 9, 8, 8, 7, 1}; /* heaviest first */
    const int nrb = 7;
    const int64_t bh = 10;
    for (int hg = 0; hg <= 4; hg += 2)
        for (int slots = 1; slots <= 13; slots += 4) {
            size_t n = 0;
            int32_t *l = stof__wgmma_persist_list(w, nrb, bh, hg, slots, 0.5,
                                                  &n);
            cr_assert_not_null(l);
            cr_assert_eq(n, (size_t)slots + 1 + (size_t)(nrb * bh));
            cr_assert_eq(l[0], 0);
            cr_assert_eq(l[slots], nrb * bh);
            int seen[70] = {0};
            double mx = 0, sum = 0;
            for (int x = 0; x < slots; x++) {
                cr_assert_leq(l[x], l[x + 1]);
                double load = 0;
                int64_t last_group = -1;
                for (int i = l[x]; i < l[x + 1]; i++) {
                    const int it = l[slots + 1 + i];
                    cr_assert(it >= 0 && it < nrb * bh);
                    seen[it]++;
                    load += w[it / bh] + 0.5;
                    const int64_t grp = hg > 0 ? (it % bh) / hg : 0;
                    cr_assert_geq(grp, last_group, "slot %d out of order", x);
                    last_group = grp;
                }
                mx = load > mx ? load : mx;
                sum += load;
            }
            for (int i = 0; i < nrb * bh; i++)
                cr_assert_eq(seen[i], 1, "item %d dealt %d times", i, seen[i]);
            cr_expect_leq(mx, sum / slots + 32.5 + 1e-9,
                          "hg %d, %d slots: busiest %.1f, mean %.1f", hg,
                          slots, mx, sum / slots);
            free(l);
        }
    size_t n = 1;
    cr_expect_null(stof__wgmma_persist_list(w, nrb, STOF_PERSIST_LIST_MAX, 0,
                                            4, 0.0, &n));
    cr_expect_eq(n, 0);
}

/* Stage 1 on a very large batch x heads: the list schedule is simulated
 * for enough copies to be steady and the rest added at the work rate, so
 * ranking 256 x 64 heads of a 16384-token causal mask takes a fraction of
 * a second (it took ~5 s on a CI-class machine, every one of them a
 * simulated CTA), and the predictions stay linear in the batch (twice the
 * batch, twice the time, within 0.5%). */
Test(cost, ranking_a_huge_batch_is_quick_and_linear)
{
    stof_context *ctx = open_fake_h100();
    stof_mask *m = NULL;
    cr_assert_eq(stof_mask_from_spec(ctx, "causal", 16384, 16384, &m),
                 STOF_OK);
    stof_candidate c[256], c2[256];
    int k = 0, k2 = 0;
    stof_attention_desc d;
    stof_attention_desc_init(&d, 256, 64, 16384, 16384, 64, STOF_DTYPE_FP16,
                             STOF_LAYOUT_BHSD);
    /* CPU time, not wall time: a loaded machine (CI's parallel suites)
     * must not fail it; the full simulation took 4.9 s of CPU, this 0.3. */
    struct timespec t0, t1;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t0);
    cr_assert_eq(stof__cost_rank(ctx, &d, m, c, 256, &k), STOF_OK);
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t1);
    const double s = (double)(t1.tv_sec - t0.tv_sec) +
                     (double)(t1.tv_nsec - t0.tv_nsec) * 1e-9;
    cr_assert_lt(s, 3.0, "ranking took %.2f s of CPU", s);
    d.batch = 128;
    cr_assert_eq(stof__cost_rank(ctx, &d, m, c2, 256, &k2), STOF_OK);
    cr_assert(k > 0 && k == k2);
    for (int i = 0; i < k; i++)
        for (int j = 0; j < k2; j++)
            if (c2[j].kind == c[i].kind && c2[j].splits == c[i].splits &&
                !memcmp(&c2[j].cfg, &c[i].cfg, sizeof(c[i].cfg)) &&
                !memcmp(&c2[j].wcfg, &c[i].wcfg, sizeof(c[i].wcfg)) &&
                c2[j].group == c[i].group) {
                const double r = c[i].predicted_ms / c2[j].predicted_ms;
                cr_expect(fabs(r - 2.0) < 0.01, "candidate %d: 256 / 128 "
                          "batch predicted %.4f / %.4f ms", i,
                          c[i].predicted_ms, c2[j].predicted_ms);
            }
    stof_mask_free(&m);
    stof_close(&ctx);
}
