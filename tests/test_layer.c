/*
 * test_layer.c - the layer API on the CPU: descriptor defaults and
 * validation (every bad field is named in the message), NULL handling of
 * every entry point, and, without a GPU, a clear STOF_ERR_NO_DEVICE; the
 * steps of a scheme and which of them a stack runs; a scheme record's
 * layer found again from its fields (stof-tune verify).
 */
#include <criterion/criterion.h>
#include <locale.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <stddef.h>
#include <string.h>

#include "layer_int.h"
#include "stof.h"

static stof_context *ctx_open(void)
{
    stof_context *ctx = NULL;
    stof_settings s;
    stof_default_settings(&s);
    s.user_db = "";
    cr_assert_eq(stof_open(&ctx, &s), STOF_OK);
    return ctx;
}

Test(layer, desc_init_defaults)
{
#if UINTPTR_MAX == 0xffffffffffffffffu
    /* (rope_scale and rope_freq took reserved bytes: the size is kept) */
    cr_expect_eq(sizeof(stof_layer_desc), 104);
    cr_expect_eq(offsetof(stof_layer_desc, rope_freq), 64);
    cr_expect_eq(offsetof(stof_layer_desc, qk_norm), 72);
#endif
    stof_layer_desc d;
    memset(&d, 0x5a, sizeof(d));
    cr_assert_eq(stof_layer_desc_init(&d, 8, 512, 768, 12, STOF_DTYPE_FP16),
                 STOF_OK);
    cr_expect_eq(d.batch, 8);
    cr_expect_eq(d.seq, 512);
    cr_expect_eq(d.hidden, 768);
    cr_expect_eq(d.heads, 12);
    cr_expect_eq(d.ffn, 3072);
    cr_expect_eq(d.act, STOF_ACT_GELU_TANH);
    cr_expect_eq(d.norm, STOF_NORM_LAYER);
    cr_expect_eq(d.pre_norm, 0);
    cr_expect_float_eq(d.norm_eps, 1e-5f, 1e-12f);
    for (size_t i = 0; i < sizeof(d.reserved); i++)
        cr_expect_eq(d.reserved[i], 0);
    cr_expect_eq(stof_layer_desc_init(NULL, 1, 1, 8, 1, STOF_DTYPE_FP16),
                 STOF_ERR_INVALID_ARGUMENT);
}

typedef struct bad_case {
    const char *field; /* expected in the message */
    void (*edit)(stof_layer_desc *d);
} bad_case;

static void e_batch(stof_layer_desc *d) { d->batch = 0; }
static void e_seq(stof_layer_desc *d) { d->seq = -3; }
static void e_hidden(stof_layer_desc *d) { d->hidden = 100; }
static void e_heads(stof_layer_desc *d) { d->heads = 5; }
static void e_ffn(stof_layer_desc *d) { d->ffn = 1001; }
static void e_kvh(stof_layer_desc *d) { d->kv_heads = 3; }
static void e_nobias(stof_layer_desc *d) { d->no_bias = 2; }
static void e_gated(stof_layer_desc *d) { d->gated = -1; }
static void e_gated_ffn(stof_layer_desc *d)
{
    d->gated = 1;
    d->ffn = 65536 + 8;
}
static void e_kvh_neg(stof_layer_desc *d) { d->kv_heads = -4; }
static void e_kvh_big(stof_layer_desc *d) { d->kv_heads = 8; }
static void e_dtype(stof_layer_desc *d) { d->dtype = (stof_dtype)7; }
static void e_act(stof_layer_desc *d) { d->act = (stof_activation)9; }
static void e_norm(stof_layer_desc *d) { d->norm = (stof_norm_kind)3; }
static void e_pre(stof_layer_desc *d) { d->pre_norm = 2; }
static void e_eps(stof_layer_desc *d) { d->norm_eps = -1.0f; }
static void e_res(stof_layer_desc *d) { d->reserved[7] = 1; }
static void e_hd(stof_layer_desc *d) { d->heads = 32; }       /* 256 / 32 */
static void e_tokens(stof_layer_desc *d)
{
    d->batch = 1 << 20;
    d->seq = 1 << 12;
}

Test(layer, bad_descriptors_are_named)
{
    stof_context *ctx = ctx_open();
    stof_mask *m = NULL;
    cr_assert_eq(stof_mask_from_spec(ctx, "causal", 256, 256, &m), STOF_OK);
    const bad_case cases[] = {
        {"desc.batch", e_batch},  {"desc.seq", e_seq},
        {"desc.hidden", e_hidden}, {"desc.heads", e_heads},
        {"desc.ffn", e_ffn},      {"desc.dtype", e_dtype},
        {"desc.act", e_act},      {"desc.norm ", e_norm},
        {"desc.pre_norm", e_pre}, {"desc.norm_eps", e_eps},
        {"desc.reserved[7]", e_res}, {"tokens", e_tokens},
        {"desc.kv_heads 3", e_kvh}, {"desc.kv_heads -4", e_kvh_neg},
        {"desc.kv_heads 8", e_kvh_big}, {"desc.no_bias 2", e_nobias},
        {"desc.gated -1", e_gated}, {"gated FFN's is at most", e_gated_ffn},
        {"head_dim 8", e_hd},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(*cases); i++) {
        stof_layer_desc d;
        stof_layer_desc_init(&d, 2, 256, 256, 4, STOF_DTYPE_FP16);
        cases[i].edit(&d);
        stof_layer *L = (stof_layer *)(uintptr_t)1;
        cr_expect_eq(stof_layer_plan(ctx, &d, m, &L),
                     STOF_ERR_INVALID_ARGUMENT, "case %s", cases[i].field);
        cr_expect_null(L, "case %s: output not cleared", cases[i].field);
        cr_expect(strstr(stof_errmsg(ctx), cases[i].field),
                  "case %s: message \"%s\"", cases[i].field,
                  stof_errmsg(ctx));
    }
    /* More sequence-heads than a grid's y holds (65535) are a layer's
     * like any others: the attention's grids take them in x. */
    stof_layer_desc d;
    stof_layer_desc_init(&d, 16384, 256, 256, 4, STOF_DTYPE_FP16);
    cr_expect_eq(stof__layer_desc_check(ctx, &d), STOF_OK, "%s",
                 stof_errmsg(ctx));
    /* The mask must be seq x seq. */
    stof_layer_desc_init(&d, 2, 128, 256, 4, STOF_DTYPE_FP16);
    stof_layer *L = NULL;
    cr_expect_eq(stof_layer_plan(ctx, &d, m, &L), STOF_ERR_INVALID_ARGUMENT);
    cr_expect(strstr(stof_errmsg(ctx), "seq x seq"), "%s", stof_errmsg(ctx));
    cr_expect_eq(stof_layer_plan(ctx, &d, NULL, &L),
                 STOF_ERR_INVALID_ARGUMENT);
    cr_expect_eq(stof_layer_plan(ctx, NULL, m, &L), STOF_ERR_INVALID_ARGUMENT);
    cr_expect_eq(stof_layer_plan(ctx, &d, m, NULL), STOF_ERR_INVALID_ARGUMENT);
    cr_expect_eq(stof_layer_plan(NULL, &d, m, &L), STOF_ERR_INVALID_ARGUMENT);
    stof_mask_free(&m);
    stof_close(&ctx);
}

Test(layer, good_descriptor_without_gpu_says_so)
{
    stof_context *ctx = ctx_open();
    if (stof_has_device(ctx)) {
        stof_close(&ctx);
        cr_skip_test("a GPU is present; the GPU suite plans layers");
    }
    stof_mask *m = NULL;
    cr_assert_eq(stof_mask_from_spec(ctx, "bigbird:64:3:2:3:1", 512, 512, &m),
                 STOF_OK);
    stof_layer_desc d;
    stof_layer_desc_init(&d, 8, 512, 768, 12, STOF_DTYPE_BF16);
    d.pre_norm = 1;
    d.norm = STOF_NORM_RMS;
    stof_layer *L = NULL;
    cr_expect_eq(stof_layer_plan(ctx, &d, m, &L), STOF_ERR_NO_DEVICE);
    cr_expect_null(L);
    cr_expect(strstr(stof_errmsg(ctx), "GPU"), "%s", stof_errmsg(ctx));
    stof_mask_free(&m);
    stof_close(&ctx);
}

/* Rotary position embeddings in the descriptor: rope_theta 0 (none) or
 * a finite base > 1, or frequencies of its own (rope_freq, with a
 * rope_scale); rope_dim 0 (the whole head) or a multiple of 4 up to
 * head_dim, and only with RoPE. Each bad value refused with the field
 * named (head_dim 64 but for the last case, 72); good ones pass the descriptor checks
 * and, without a GPU, get as far as STOF_ERR_NO_DEVICE. */
static void e_theta_neg(stof_layer_desc *d) { d->rope_theta = -10000.0f; }
static void e_theta_nan(stof_layer_desc *d) { d->rope_theta = NAN; }
static void e_theta_inf(stof_layer_desc *d) { d->rope_theta = INFINITY; }
static void e_theta_half(stof_layer_desc *d) { d->rope_theta = 0.5f; }
static void e_theta_one(stof_layer_desc *d) { d->rope_theta = 1.0f; }
static void e_theta_nan_dim(stof_layer_desc *d)
{
    d->rope_theta = NAN;
    d->rope_dim = 32;
}
static void e_rdim_alone(stof_layer_desc *d) { d->rope_dim = 32; }
static float freq32[32] = {1.0f, 0.5f, 0.25f, 0.125f};
static void e_freq_theta(stof_layer_desc *d)
{
    d->rope_theta = 10000.0f;
    d->rope_freq = freq32;
}
static void e_freq_nan(stof_layer_desc *d)
{
    static float f[32];
    f[3] = NAN;
    d->rope_freq = f;
}
static void e_freq_neg(stof_layer_desc *d)
{
    static float f[8];
    f[7] = -1.0f;
    d->rope_freq = f;
    d->rope_dim = 16; /* (8 pairs: the last is read) */
}
static void e_freq_inf(stof_layer_desc *d)
{
    static float f[32];
    f[31] = INFINITY;
    d->rope_freq = f;
}
static void e_scale_neg(stof_layer_desc *d)
{
    d->rope_theta = 10000.0f;
    d->rope_scale = -1.0f;
}
static void e_scale_nan(stof_layer_desc *d)
{
    d->rope_freq = freq32;
    d->rope_scale = NAN;
}
static void e_scale_alone(stof_layer_desc *d) { d->rope_scale = 2.0f; }
static void e_qk_norm(stof_layer_desc *d) { d->qk_norm = 2; }
static void e_head_dim_12(stof_layer_desc *d) { d->head_dim = 12; }
static void e_head_dim_neg(stof_layer_desc *d) { d->head_dim = -64; }
static void e_head_dim_wide(stof_layer_desc *d)
{
    d->heads = 256;
    d->head_dim = 256; /* (65536 columns) */
}
static void e_heads_3(stof_layer_desc *d) { d->heads = 3; }
static void e_scale_big(stof_layer_desc *d)
{
    d->rope_theta = 10000.0f;
    d->rope_scale = 17.0f;
}
static void e_freq_angle(stof_layer_desc *d)
{
    /* (finite, but 255 times it is not) */
    static float f[32];
    f[5] = 1e37f;
    d->rope_freq = f;
}
static void e_rdim_22(stof_layer_desc *d)
{
    d->rope_theta = 10000.0f;
    d->rope_dim = 22;
}
static void e_rdim_big(stof_layer_desc *d)
{
    d->rope_theta = 10000.0f;
    d->rope_dim = 80; /* head_dim 64 */
}
static void e_rdim_neg(stof_layer_desc *d)
{
    d->rope_theta = 500000.0f;
    d->rope_dim = -16;
}
static void e_rdim_hd72(stof_layer_desc *d)
{
    d->hidden = 288; /* head_dim 72: not a multiple of 16 */
    d->ffn = 1152;
    d->rope_theta = 10000.0f;
}
static void e_rdim_hd72_big(stof_layer_desc *d)
{
    e_rdim_hd72(d);
    d->rope_dim = 80;
}

Test(layer, rope_descriptors_are_named)
{
    stof_context *ctx = ctx_open();
    stof_mask *m = NULL;
    cr_assert_eq(stof_mask_from_spec(ctx, "causal", 256, 256, &m), STOF_OK);
    const bad_case cases[] = {
        {"desc.rope_theta -10000", e_theta_neg},
        {"desc.rope_theta", e_theta_nan},
        {"desc.rope_theta inf", e_theta_inf},
        {"desc.rope_theta 0.5", e_theta_half},
        {"desc.rope_theta 1:", e_theta_one},
        {"desc.rope_theta", e_theta_nan_dim},
        {"desc.rope_dim 32 without RoPE", e_rdim_alone},
        {"desc.rope_theta 10000 with desc.rope_freq", e_freq_theta},
        {"desc.rope_freq[3] nan", e_freq_nan},
        {"desc.rope_freq[7] -1", e_freq_neg},
        {"desc.rope_freq[31] inf", e_freq_inf},
        {"desc.rope_scale -1", e_scale_neg},
        {"desc.rope_scale nan", e_scale_nan},
        {"desc.rope_scale 2 without RoPE", e_scale_alone},
        {"desc.qk_norm 2: 0 (none) or 1", e_qk_norm},
        {"desc.head_dim 12: a multiple of 8 in 16..256", e_head_dim_12},
        {"desc.head_dim -64", e_head_dim_neg},
        {"desc.heads 256 x desc.head_dim 256", e_head_dim_wide},
        {"desc.heads 3 does not divide desc.hidden 256 (or give "
         "desc.head_dim)", e_heads_3},
        {"desc.rope_scale 17: 0 (1) or in (0, 16]", e_scale_big},
        {"desc.rope_freq[5] 1e+37: the frequencies are finite, >= 0, and "
         "their angles at position 255", e_freq_angle},
        {"desc.rope_dim 22: 0 (the whole head) or a multiple of 4", e_rdim_22},
        {"desc.rope_dim 80", e_rdim_big},
        {"desc.rope_dim -16", e_rdim_neg},
        {"desc.rope_dim 80", e_rdim_hd72_big},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(*cases); i++) {
        stof_layer_desc d;
        stof_layer_desc_init(&d, 2, 256, 256, 4, STOF_DTYPE_FP16);
        cases[i].edit(&d);
        stof_layer *L = (stof_layer *)(uintptr_t)1;
        cr_expect_eq(stof_layer_plan(ctx, &d, m, &L),
                     STOF_ERR_INVALID_ARGUMENT, "case %zu (%s)", i,
                     cases[i].field);
        cr_expect_null(L, "case %zu: output not cleared", i);
        cr_expect(strstr(stof_errmsg(ctx), cases[i].field),
                  "case %zu: message \"%s\" lacks \"%s\"", i,
                  stof_errmsg(ctx), cases[i].field);
        cr_expect_eq(stof__layer_desc_check(ctx, &d),
                     STOF_ERR_INVALID_ARGUMENT, "case %zu (%s)", i,
                     cases[i].field);
    }
    /* The message says which head_dim. */
    stof_layer_desc d;
    stof_layer_desc_init(&d, 2, 256, 256, 4, STOF_DTYPE_FP16);
    e_rdim_hd72_big(&d);
    stof_layer *L = NULL;
    cr_expect_eq(stof_layer_plan(ctx, &d, m, &L), STOF_ERR_INVALID_ARGUMENT);
    cr_expect(strstr(stof_errmsg(ctx), "head_dim 72"), "%s",
              stof_errmsg(ctx));
    /* Good ones: Llama 2 (the whole head), Llama 3's base, GPT-NeoX's
     * partial rope, head_dim 72 with a rope_dim, the largest; frequencies
     * of its own (0s allowed) with and without a scale; rotated channels
     * not a multiple of 16 (the rope kernel): GPT-NeoX 20B's 24 of 96,
     * StableLM 3B's 20 of 80, the whole of a head of 72. */
    static const struct {
        int hidden, heads, rope_dim;
        float theta, scale;
        const float *freq;
    } good[] = {{256, 4, 0, 10000.0f, 0, NULL},
                {256, 4, 0, 500000.0f, 1.25f, NULL},
                {256, 4, 16, 10000.0f, 0, NULL},
                {256, 4, 64, 1.5f, 0, NULL},
                {288, 4, 64, 10000.0f, 0, NULL},
                {288, 4, 16, 1e6f, 0, NULL},
                {1024, 4, 256, 10000.0f, 0, NULL},
                {256, 4, 0, 0.0f, 0, freq32},
                {256, 4, 32, 0.0f, 0.5f, freq32},
                {384, 4, 24, 10000.0f, 0, NULL},
                {320, 4, 20, 10000.0f, 0, NULL},
                {288, 4, 0, 10000.0f, 0, NULL},
                {288, 4, 36, 0.0f, 0, freq32},
                {256, 3, 0, 10000.0f, 0, NULL}};
    const int gpu = stof_has_device(ctx);
    for (size_t i = 0; i < sizeof(good) / sizeof(*good); i++) {
        stof_layer_desc_init(&d, 2, 256, good[i].hidden, good[i].heads,
                             STOF_DTYPE_BF16);
        d.rope_theta = good[i].theta;
        d.rope_dim = good[i].rope_dim;
        d.rope_scale = good[i].scale;
        d.rope_freq = good[i].freq;
        if (good[i].heads == 3)
            d.head_dim = 128; /* (heads not dividing hidden: 384 columns) */
        cr_expect_eq(stof__layer_desc_check(ctx, &d), STOF_OK,
                     "good case %zu: %s", i, stof_errmsg(ctx));
        if (gpu)
            continue; /* (the GPU suite plans layers) */
        L = NULL;
        cr_expect_eq(stof_layer_plan(ctx, &d, m, &L), STOF_ERR_NO_DEVICE,
                     "good case %zu: %s", i, stof_errmsg(ctx));
        cr_expect_null(L);
    }
    stof_mask_free(&m);
    stof_close(&ctx);
}

/* A cuBLASLt step that fails to launch says so in the layer's message, not
 * whatever last failed on the context (here a bad spec). */
Test(layer, cublaslt_step_failure_names_itself)
{
    stof_context *ctx = ctx_open();
    stof_mask *m = NULL;
    cr_assert_neq(stof_mask_from_spec(ctx, "sliding:zz", 64, 64, &m), STOF_OK);
    stof_layer *L = calloc(1, sizeof(*L));
    cr_assert_not_null(L);
    L->ctx = ctx;
    stof_layer_desc_init(&L->d, 1, 64, 64, 1, STOF_DTYPE_FP16);
    L->M = 64;
    stof__layer_build_steps(L, J_RES_NORM, J_RES_NORM);
    L->n_steps = 1; /* the QKV GEMM, on cuBLASLt with no handle: refused */
    gemm_op *g = &L->g[G_QKV];
    g->M = 64;
    g->N = 192;
    g->K = 64;
    g->ok = 1;
    g->lt = 1;
    CUdeviceptr wp[SYM_COUNT] = {0};
    wp[SYM_WQKV] = 0x1000;
    wp[SYM_BQKV] = 0x2000;
    cr_assert_neq(stof__layer_run_steps(L, wp, 0x3000, 0x4000, NULL, 0), STOF_OK);
    const char *msg = stof_layer_errmsg(L);
    cr_expect(strstr(msg, "cuBLASLt") && strstr(msg, "qkv") && !strstr(msg, "zz"),
              "%s", msg);
    free(L);
    stof_close(&ctx);
}

/* A norm record loads only into a slot that compiles what it was tuned
 * for. */
Test(layer, norm_records_match_their_slot)
{
    norm_op n = {.used = 1, .bias = 1, .res = 1, .pre = 0};
    int w = 0;
    cr_expect(stof__layer_norm_record_matches(
        "{\"warps\": 4, \"bias\": 1, \"res\": 1, \"pre\": 0, \"norm\": 0}", &n, 0,
        &w));
    cr_expect_eq(w, 4);
    const char *bad[] = {
        "{\"warps\": 4, \"bias\": 1, \"res\": 1, \"pre\": 1, \"norm\": 0}",
        "{\"warps\": 4, \"bias\": 0, \"res\": 1, \"pre\": 0, \"norm\": 0}",
        "{\"warps\": 4, \"bias\": 1, \"res\": 0, \"pre\": 0, \"norm\": 0}",
        "{\"warps\": 4, \"bias\": 1, \"res\": 1, \"pre\": 0, \"norm\": 1}",
        "{\"warps\": 40, \"bias\": 1, \"res\": 1, \"pre\": 0, \"norm\": 0}",
        "{\"warps\": 4}",
        NULL,
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(*bad); i++)
        cr_expect(!stof__layer_norm_record_matches(bad[i], &n, 0, &w), "case %zu",
                  i);
}

/* A locale whose decimal point is a comma, compiled for the test into a
 * temporary directory (LOCPATH); (locale_t)0 where localedef or glibc's
 * locale sources are missing. */
static locale_t comma_locale(void)
{
    char dir[] = "/tmp/stof-locale-XXXXXX";
    if (!mkdtemp(dir))
        return (locale_t)0;
    char cmd[256];
    snprintf(cmd, sizeof(cmd),
             "localedef -c -i de_DE -f UTF-8 %s/de_DE.UTF-8 >/dev/null 2>&1", dir);
    if (system(cmd) == -1)
        return (locale_t)0;
    setenv("LOCPATH", dir, 1);
    locale_t l = newlocale(LC_ALL_MASK, "de_DE.UTF-8", (locale_t)0);
    unsetenv("LOCPATH");
    /* (loaded: its files may go) */
    snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
    if (system(cmd) != 0)
        fprintf(stderr, "(left behind: %s)\n", dir);
    return l;
}

/* Database keys and records' content hashes hold numbers as text: a host
 * program (or thread) whose locale writes a decimal comma must make the
 * same keys and hashes as stof-tune in the C locale, or it could never use
 * the fleet's records (and its own would read as damaged elsewhere). */
Test(layer, keys_and_record_hashes_ignore_the_locale)
{
    locale_t de = comma_locale();
    if (!de)
        cr_skip_test("no comma locale could be made (localedef or the de_DE "
                     "locale sources are missing)");
    char probe[16];
    locale_t old = uselocale(de);
    snprintf(probe, sizeof(probe), "%.1f", 1.5);
    uselocale(old);
    cr_assert_str_eq(probe, "1,5", "the test locale is not in effect");

    stof_context *ctx = ctx_open();
    const char *hex = "0123456789abcdef0123456789abcdef";
    stof_layer *L = calloc(1, sizeof(*L));
    cr_assert_not_null(L);
    L->ctx = ctx;
    stof_layer_desc_init(&L->d, 2, 128, 256, 4, STOF_DTYPE_FP16);
    L->eps = 1e-5f;
    stof__layer_key(L, hex);
    char k1[33], t1[sizeof(L->key_text)];
    memcpy(k1, L->key, sizeof(k1));
    memcpy(t1, L->key_text, sizeof(t1));
    old = uselocale(de);
    stof__layer_key(L, hex);
    uselocale(old);
    cr_expect_str_eq(L->key_text, t1);
    cr_expect_str_eq(L->key, k1);

    stof_attention_desc d;
    stof_attention_desc_init(&d, 2, 4, 128, 128, 64, STOF_DTYPE_FP16,
                             STOF_LAYOUT_BHSD);
    d.softcap = 30.5f;
    char a1[33], a2[33], at1[640], at2[640];
    stof__attention_key(ctx, &d, hex, a1, at1, sizeof(at1));
    old = uselocale(de);
    stof__attention_key(ctx, &d, hex, a2, at2, sizeof(at2));
    uselocale(old);
    cr_expect(strstr(at1, "softcap=30.5"), "%s", at1);
    cr_expect_str_eq(at2, at1);
    cr_expect_str_eq(a2, a1);

    stof_db_record r;
    memset(&r, 0, sizeof(r));
    snprintf(r.key, sizeof(r.key), "%s", hex);
    r.time_ms = 0.125;
    r.runner_up_ms = 0.5;
    r.model_ms = 1.0 / 3.0;
    char h1[33], h2[33];
    stof__db_record_hash(&r, h1);
    old = uselocale(de);
    stof__db_record_hash(&r, h2);
    uselocale(old);
    cr_expect_str_eq(h2, h1);
    free(L);
    freelocale(de);
    stof_close(&ctx);
}

Test(layer, null_layer_is_harmless)
{
    stof_layer_weights w;
    memset(&w, 0, sizeof(w));
    cr_expect_eq(stof_layer_run(NULL, &w, NULL, NULL, NULL),
                 STOF_ERR_INVALID_ARGUMENT);
    cr_expect_eq(stof_layer_stack_run(NULL, 2, &w, NULL, NULL, NULL, 0),
                 STOF_ERR_INVALID_ARGUMENT);
    char buf[16];
    size_t need = 0;
    cr_expect_eq(stof_layer_describe(NULL, buf, sizeof(buf), &need),
                 STOF_ERR_INVALID_ARGUMENT);
    cr_expect_str_eq(stof_layer_errmsg(NULL), "layer is NULL");
    stof_layer *L = NULL;
    stof_layer_free(&L);
    stof_layer_free(NULL);
}

/* The chain of a pre-norm layer whose scheme fuses the stack ending: the
 * last GEMM's stack-only twin writes Y (pre) and N with the next layer's
 * input norm, and runs, in place of the plain one, only inside a stack;
 * a layer after the first skips its input norm; post-norm layers have no
 * stack ending. */
Test(layer, stack_ending_steps)
{
    stof_layer *L = calloc(1, sizeof(*L));
    cr_assert(L);
    stof_layer_desc_init(&L->d, 2, 128, 256, 4, STOF_DTYPE_FP16);
    L->d.pre_norm = 1;
    stof__layer_build_steps(L, J_FUSED, J_FUSED);
    const int n = L->n_steps;
    cr_assert_geq(n, 3);
    const step *last = &L->steps[n - 1], *plain = &L->steps[n - 2];
    cr_expect(last->stack_end && last->kind == STEP_GEMM &&
              last->op == G_B_NORM);
    cr_expect_eq(last->s[O_OUT], SYM_N);
    cr_expect_eq(last->s[O_PRE], SYM_Y);
    cr_expect_eq(last->s[O_RES], SYM_H);
    cr_expect_eq(last->s[O_GAMMA], SYM_G1_NEXT);
    cr_expect_eq(last->s[O_BETA], SYM_BE1_NEXT);
    cr_expect(!plain->stack_end && plain->op == G_B_RES &&
              plain->s[O_OUT] == SYM_Y);
    cr_expect(L->steps[0].kind == STEP_NORM && L->steps[0].op == N_IN);
    static const int modes[] = {0, RUN_END_FUSED,
                                RUN_SKIP_NORM_IN | RUN_END_FUSED,
                                RUN_SKIP_NORM_IN};
    for (int m = 0; m < 4; m++) {
        const int mode = modes[m];
        int runs = 0;
        for (int i = 0; i < n; i++)
            runs += stof__layer_step_runs(L, i, mode);
        cr_expect_eq(runs, n - 1 - !!(mode & RUN_SKIP_NORM_IN),
                     "mode %d: %d of %d steps", mode, runs, n);
        cr_expect_eq(stof__layer_step_runs(L, n - 1, mode),
                     !!(mode & RUN_END_FUSED), "mode %d", mode);
        cr_expect_eq(stof__layer_step_runs(L, n - 2, mode),
                     !(mode & RUN_END_FUSED), "mode %d", mode);
        cr_expect_eq(stof__layer_step_runs(L, 0, mode),
                     !(mode & RUN_SKIP_NORM_IN), "mode %d", mode);
    }
    /* RMSNorm: no beta; no stack ending without jb = J_FUSED. */
    L->d.norm = STOF_NORM_RMS;
    stof__layer_build_steps(L, J_FUSED, J_FUSED);
    cr_expect_eq(L->steps[L->n_steps - 1].s[O_BETA], SYM_NONE);
    stof__layer_build_steps(L, J_FUSED, 0);
    for (int i = 0; i < L->n_steps; i++)
        cr_expect(!L->steps[i].stack_end && stof__layer_step_runs(L, i, 0));
    /* Post-norm: the fused junction B is a plain step. */
    L->d.pre_norm = 0;
    L->d.norm = STOF_NORM_LAYER;
    stof__layer_build_steps(L, J_FUSED, J_FUSED);
    for (int i = 0; i < L->n_steps; i++)
        cr_expect(!L->steps[i].stack_end);
    cr_expect_eq(L->steps[L->n_steps - 1].op, G_B_NORM);
    cr_expect_eq(L->steps[L->n_steps - 1].s[O_OUT], SYM_Y);
    free(L);
}

/* Each layer's mode in a stack of n (stof__layer_stack_mode, what both the
 * stacks and the search's PDL timing chain run): with the fused stack
 * ending, every layer but the last ends with it and every layer but the
 * first skips its input norm; one layer alone, a post-norm layer or
 * another junction B runs plain. */
Test(layer, stack_modes)
{
    stof_layer *L = calloc(1, sizeof(*L));
    cr_assert(L);
    stof_layer_desc_init(&L->d, 2, 128, 256, 4, STOF_DTYPE_FP16);
    L->d.pre_norm = 1;
    L->jb = J_FUSED;
    for (int n = 1; n <= 4; n++)
        for (int i = 0; i < n; i++)
            cr_expect_eq(stof__layer_stack_mode(L, i, n),
                         (i > 0 ? RUN_SKIP_NORM_IN : 0) |
                             (i + 1 < n ? RUN_END_FUSED : 0),
                         "layer %d of %d", i, n);
    cr_expect_eq(stof__layer_stack_mode(L, 0, 1), 0);
    cr_expect_eq(stof__layer_stack_mode(L, 0, 3), RUN_END_FUSED);
    cr_expect_eq(stof__layer_stack_mode(L, 2, 3), RUN_SKIP_NORM_IN);
    L->jb = J_BIAS_RES_NORM;
    for (int i = 0; i < 3; i++)
        cr_expect_eq(stof__layer_stack_mode(L, i, 3), 0, "layer %d", i);
    L->jb = J_FUSED;
    L->d.pre_norm = 0;
    for (int i = 0; i < 3; i++)
        cr_expect_eq(stof__layer_stack_mode(L, i, 3), 0, "layer %d", i);
    free(L);
}

/* Buffers of the layer's memory that step `st` reads (rd) and writes (wr)
 * as bit sets of SYM_* (the intermediates only: X, Y and weights are the
 * caller's). */
static void step_syms(const step *st, unsigned *rd, unsigned *wr)
{
    *rd = *wr = 0;
    if (st->kind == STEP_ATTN) {
        *rd = 1u << SYM_QKV;
        *wr = 1u << SYM_ATT;
        return;
    }
    const int in[] = {st->s[O_A], st->s[O_RES]};
    const int out[] = {st->s[O_OUT], st->s[O_PRE]};
    for (int k = 0; k < 2; k++) {
        if (in[k] >= SYM_FIRST_BUF && in[k] < SYM_G)
            *rd |= 1u << in[k];
        if (out[k] >= SYM_FIRST_BUF && out[k] < SYM_G)
            *wr |= 1u << out[k];
    }
}

/* How many times a step writes memory that holds a value still to be
 * read (by itself or a later step, in the same layer or the next of a
 * stack), buffers at off[]: on the steps a stack of two layers runs. */
static int clobbers(stof_layer *L, const size_t *off, size_t total,
                    const char *what)
{
    unsigned rd[2 * MAX_STEPS], wr[2 * MAX_STEPS];
    int n = 0, bad = 0;
    for (int layer = 0; layer < 2; layer++)
        for (int i = 0; i < L->n_steps; i++)
            if (stof__layer_step_runs(L, i, stof__layer_stack_mode(L, layer, 2)))
                step_syms(&L->steps[i], &rd[n], &wr[n]), n++;
    for (int i = 0; i < n; i++) {
        for (int s = SYM_FIRST_BUF; s < SYM_G; s++)
            if (((rd[i] | wr[i]) >> s) & 1u && off[s] == STOF_LAYER_NO_BUF) {
                cr_log_info("%s: step %d uses buffer %d, which has none", what,
                            i, s);
                bad++;
            }
        for (int o = SYM_FIRST_BUF; o < SYM_G; o++) {
            if (!((wr[i] >> o) & 1u) || off[o] == STOF_LAYER_NO_BUF)
                continue;
            const size_t o0 = off[o],
                         o1 = o0 + (size_t)L->M * stof__layer_tok_ld(L, o) * 2;
            if (o1 > total) {
                cr_log_info("%s: buffer %d past the end", what, o);
                bad++;
            }
            /* every other buffer written before step i and read at i or
             * after, before it is written again */
            for (int s = SYM_FIRST_BUF; s < SYM_G; s++) {
                if (s == o || off[s] == STOF_LAYER_NO_BUF)
                    continue;
                int live = 0, written = 0;
                for (int j = i; j < n && !live; j++) {
                    if ((rd[j] >> s) & 1u)
                        live = 1;
                    if (j > i && (wr[j] >> s) & 1u)
                        break;
                }
                for (int j = 0; j < i; j++)
                    written |= (wr[j] >> s) & 1u;
                const size_t s0 = off[s],
                             s1 = s0 + (size_t)L->M * stof__layer_tok_ld(L, s) * 2;
                if (live && written && o0 < s1 && s0 < o1) {
                    cr_log_info("%s: step %d writes buffer %d [%zu, %zu) over "
                                "buffer %d [%zu, %zu), still to be read",
                                what, i, o, o0, o1, s, s0, s1);
                    bad++;
                }
            }
        }
    }
    return bad;
}

/* The plan's intermediates share memory where their lives do not overlap
 * (F over QKV and ATT): no step of any scheme, alone or in a stack,
 * writes over a value still to be read, in the search's layout (every
 * scheme's buffers) or a chosen scheme's own; and the check finds the
 * overlaps of layouts that would. */
Test(layer, buffers_share_memory_safely)
{
    stof_layer *L = calloc(1, sizeof(*L));
    cr_assert(L);
    static const struct {
        int hidden, heads, kv_heads, ffn;
    } shapes[] = {{768, 12, 0, 3072}, {1024, 16, 0, 4096},
                  {4096, 32, 8, 11008}, {512, 8, 2, 512}};
    char what[96];
    for (size_t k = 0; k < sizeof(shapes) / sizeof(shapes[0]); k++) {
        for (int pre = 0; pre < 2; pre++) {
            stof_layer_desc_init(&L->d, 2, 256, shapes[k].hidden,
                                 shapes[k].heads, STOF_DTYPE_FP16);
            L->d.kv_heads = shapes[k].kv_heads;
            L->d.ffn = shapes[k].ffn;
            L->d.pre_norm = pre;
            L->M = L->d.batch * L->d.seq;
            size_t off[SYM_COUNT], sum = 0;
            const size_t total = stof__layer_buf_layout(L, 1, off);
            for (int ja = 0; ja < J_COUNT; ja++) {
                for (int jb = 0; jb < J_COUNT; jb++) {
                    stof__layer_build_steps(L, ja, jb);
                    snprintf(what, sizeof(what), "hidden %d pre %d ja %d jb %d",
                             shapes[k].hidden, pre, ja, jb);
                    cr_expect_eq(clobbers(L, off, total, what), 0, "%s", what);
                    /* the chosen scheme's own buffers: no more than the
                     * search's, T only where a junction's GEMM and norm
                     * are apart (in a pre-norm layer's junction A, the
                     * residual's sum goes to H unless the bias is apart) */
                    size_t own[SYM_COUNT];
                    const size_t own_total = stof__layer_buf_layout(L, 0, own);
                    cr_expect_eq(clobbers(L, own, own_total, what), 0, "%s",
                                 what);
                    cr_expect_leq(own_total, total, "%s", what);
                    int uses_t = 0;
                    for (int i = 0; i < L->n_steps; i++)
                        for (int o = 0; o < O_COUNT; o++)
                            uses_t |= L->steps[i].s[o] == SYM_T;
                    cr_expect_eq(own[SYM_T] != STOF_LAYER_NO_BUF, uses_t, "%s",
                                 what);
                    cr_expect_eq(uses_t,
                                 pre ? ja == J_BIAS_RES_NORM
                                     : ja != J_FUSED || jb != J_FUSED,
                                 "%s", what);
                    /* H over F (junction B reads both), T over ATT
                     * (junction A's GEMM writes T reading ATT when split) */
                    size_t bad[SYM_COUNT];
                    memcpy(bad, off, sizeof(bad));
                    bad[SYM_H] = off[SYM_F];
                    cr_expect_gt(clobbers(L, bad, total, "H over F"), 0, "%s",
                                 what);
                    if (ja == J_BIAS_RES_NORM) {
                        memcpy(bad, off, sizeof(bad));
                        bad[SYM_T] = off[SYM_ATT];
                        cr_expect_gt(clobbers(L, bad, total, "T over ATT"), 0,
                                     "%s", what);
                    }
                    if (pre) {
                        memcpy(bad, off, sizeof(bad));
                        bad[SYM_N] = STOF_LAYER_NO_BUF;
                        cr_expect_gt(clobbers(L, bad, total, "no N"), 0, "%s",
                                     what);
                    }
                }
            }
            for (int s = SYM_FIRST_BUF; s < SYM_G; s++)
                if (off[s] != STOF_LAYER_NO_BUF)
                    sum += (size_t)L->M * stof__layer_tok_ld(L, s) * 2;
            cr_expect_lt(total, sum, "hidden %d: %zu of %zu bytes",
                         shapes[k].hidden, total, sum);
            cr_expect_eq(off[SYM_N] == STOF_LAYER_NO_BUF, !pre);
        }
    }
    free(L);
}

/* `stof-tune verify` plans a layer again from its scheme record alone:
 * the record's fields and configuration give back the descriptor whose
 * key is the record's; an older record (without kv_heads, no_bias, gated
 * and eps in its configuration) by the usual values of those; a record
 * whose fields describe another layer matches nothing. */
/* A scheme record's row for a layer of 2 x 256 tokens and 8 heads in
 * bf16 under key, for mask digest hex (its config the caller's). */
static void scheme_record(stof_db_record *r, const char *key, const char *hex)
{
    memset(r, 0, sizeof(*r));
    snprintf(r->key, sizeof(r->key), "%s", key);
    snprintf(r->op, sizeof(r->op), "layer");
    snprintf(r->kernel, sizeof(r->kernel), "scheme");
    snprintf(r->mask_digest, sizeof(r->mask_digest), "%s", hex);
    snprintf(r->dtype, sizeof(r->dtype), "bf16");
    r->batch = 2;
    r->heads = 8;
    r->seq_q = r->seq_k = 256;
}

/* A Llama-style layer (2 x 256 tokens, hidden 512, 8 heads, FFN 1376
 * SwiGLU, no biases, pre-RMSNorm eps 1e-6) of ctx, unplanned: for keys
 * and records. */
static stof_layer *llama_layer(stof_context *ctx)
{
    stof_layer *L = calloc(1, sizeof(*L));
    cr_assert(L);
    L->ctx = ctx;
    stof_layer_desc_init(&L->d, 2, 256, 512, 8, STOF_DTYPE_BF16);
    L->d.ffn = 1376;
    L->d.act = STOF_ACT_SILU;
    L->d.norm = STOF_NORM_RMS;
    L->d.pre_norm = 1;
    L->d.no_bias = 1;
    L->d.gated = 1;
    L->eps = L->d.norm_eps = 1e-6f;
    return L;
}

Test(layer, scheme_record_gives_back_its_layer)
{
    stof_context *ctx = ctx_open();
    stof_layer *L = llama_layer(ctx);
    L->d.kv_heads = 2;
    const char *hex = "00112233445566778899aabbccddeeff";
    stof__layer_key(L, hex);
    stof_db_record r;
    scheme_record(&r, L->key, hex);
    static const char *const configs[] = {
        /* as stored now, with the search's timed choice of programmatic
         * launches */
        "{\"ja\": 1, \"jb\": 1, \"pre\": 1, \"hidden\": 512, \"ffn\": 1376, "
        "\"act\": 4, \"norm\": 1, \"kv_heads\": 2, \"no_bias\": 1, "
        "\"gated\": 1, \"eps\": 9.9999999747524271e-07, \"lt\": %d, "
        "\"pdl\": 1}",
        /* without it (no timing: before compute capability 9.0, STOF_PDL
         * set, an older record) */
        "{\"ja\": 1, \"jb\": 1, \"pre\": 1, \"hidden\": 512, \"ffn\": 1376, "
        "\"act\": 4, \"norm\": 1, \"kv_heads\": 2, \"no_bias\": 1, "
        "\"gated\": 1, \"eps\": 9.9999999747524271e-07, \"lt\": %d}",
        /* as stored before */
        "{\"ja\": 1, \"jb\": 1, \"pre\": 1, \"hidden\": 512, \"ffn\": 1376, "
        "\"act\": 4, \"norm\": 1}"};
    const int lt = (int)stof__blaslt_version();
    char text[1024];
    for (int c = 0; c < 3; c++) {
        snprintf(r.config, sizeof(r.config), configs[c], lt);
        cr_expect_eq(stof__layer_record_pdl(r.config), c == 0 ? 1 : -1,
                     "config %d", c);
        stof_layer_desc d;
        int old = -1;
        char why[256] = "";
        cr_assert_eq(stof__layer_record_desc(ctx, &r, &d, &old, text,
                                             sizeof(text), why, sizeof(why)),
                     1, "config %d: %s", c, why);
        cr_expect_str_eq(text, L->key_text);
        cr_expect_eq(d.batch, 2);
        cr_expect_eq(d.seq, 256);
        cr_expect_eq(d.hidden, 512);
        cr_expect_eq(d.heads, 8);
        cr_expect_eq(d.ffn, 1376);
        cr_expect_eq(d.dtype, STOF_DTYPE_BF16);
        cr_expect_eq(d.act, STOF_ACT_SILU);
        cr_expect_eq(d.norm, STOF_NORM_RMS);
        cr_expect_eq(d.pre_norm, 1);
        cr_expect_eq(d.kv_heads, 2);
        cr_expect_eq(d.no_bias, 1);
        cr_expect_eq(d.gated, 1);
        cr_expect_eq(d.norm_eps, 1e-6f);
    }
    stof_layer_desc d;
    int old = -1;
    char why[256] = "";
    /* Made with another cuBLASLt (its key names that version): found, and
     * said so. */
    {
        char lt_text[1024];
        snprintf(lt_text, sizeof(lt_text), "%s", L->key_text);
        char *at = strstr(lt_text, ";cublaslt=");
        cr_assert(at);
        const char *tail = strchr(at + 1, ';');
        char rest[256];
        snprintf(rest, sizeof(rest), "%s", tail ? tail : "");
        snprintf(at, sizeof(lt_text) - (size_t)(at - lt_text),
                 ";cublaslt=%d%s", lt + 7, rest);
        stof_db_record r2 = r;
        stof__layer_key_hash(lt_text, r2.key);
        snprintf(r2.config, sizeof(r2.config), configs[0], lt + 7);
        cr_expect_eq(stof__layer_record_desc(ctx, &r2, &d, &old, text,
                                             sizeof(text), why, sizeof(why)),
                     2, "%s", why);
        cr_expect_str_eq(text, lt_text);
        cr_expect_eq(d.gated, 1);
        /* its kernels' keys follow from that text */
        char k1[33], k2[33];
        stof__layer_op_key_of(lt_text, "qkv", k1);
        stof__layer_op_key_of(L->key_text, "qkv", k2);
        cr_expect_str_neq(k1, k2);
    }
    /* Another layer: a field changed (now: bad; before: not found among
     * the usual values, so old = 1). */
    snprintf(r.config, sizeof(r.config), configs[0], lt);
    char *g = strstr(r.config, "\"gated\": 1");
    cr_assert(g);
    g[9] = '0';
    cr_expect_eq(stof__layer_record_desc(ctx, &r, &d, &old, text,
                                         sizeof(text), why, sizeof(why)),
                 0);
    cr_expect_eq(old, 0, "%s", why);
    L->eps = 3e-5f; /* not a usual eps */
    stof__layer_key(L, hex);
    snprintf(r.key, sizeof(r.key), "%s", L->key);
    snprintf(r.config, sizeof(r.config), configs[2], lt);
    cr_expect_eq(stof__layer_record_desc(ctx, &r, &d, &old, text,
                                         sizeof(text), why, sizeof(why)),
                 0);
    cr_expect_eq(old, 1, "%s", why);
    snprintf(r.config, sizeof(r.config), configs[0], lt);
    cr_expect_eq(stof__layer_record_desc(ctx, &r, &d, &old, text,
                                         sizeof(text), why, sizeof(why)),
                 0, "eps 1e-6 in the record, 3e-5 in its key");
    r.heads = 0;
    cr_expect_eq(stof__layer_record_desc(ctx, &r, &d, &old, text,
                                         sizeof(text), why, sizeof(why)),
                 0);
    free(L);
    stof_close(&ctx);
}

/* A layer with frequencies of its own (desc.rope_freq): its key says
 * ";rope=table;rope_dim=D" whatever the frequencies and the scale (a
 * scheme does not depend on them), unlike a base's; its record
 * ("rope_table": true) gives back a descriptor with stand-in frequencies
 * and that key; a record that says rope_table false, or both a table and
 * a base, is not a layer's. */
Test(layer, rope_table_key_and_record)
{
    stof_context *ctx = ctx_open();
    stof_layer *L = llama_layer(ctx);
    L->d.rope_dim = 32;
    const char *hex = "00112233445566778899aabbccddeeff";
    float fa[16], fb[16];
    for (int i = 0; i < 16; i++) {
        fa[i] = 1.0f / (float)(i + 1);
        fb[i] = 0.5f * fa[i];
    }
    L->d.rope_freq = fa;
    stof__layer_key(L, hex);
    char ka[33], text[1024];
    snprintf(ka, sizeof(ka), "%s", L->key);
    snprintf(text, sizeof(text), "%s", L->key_text);
    cr_expect(strstr(text, ";rope=table;rope_dim=32"), "%s", text);
    L->d.rope_freq = fb;
    L->d.rope_scale = 1.5f;
    stof__layer_key(L, hex);
    cr_expect_str_eq(L->key, ka, "another table, another key");
    L->d.rope_freq = NULL;
    L->d.rope_scale = 0.0f;
    L->d.rope_theta = 10000.0f;
    stof__layer_key(L, hex);
    cr_expect_str_neq(L->key, ka, "a base's key and a table's are one");
    cr_expect(strstr(L->key_text, ";rope=0x1.388p+13;rope_dim=32"), "%s",
              L->key_text);

    stof_db_record r;
    scheme_record(&r, ka, hex);
    const int lt = (int)stof__blaslt_version();
    static const char *const cfg =
        "{\"ja\": 1, \"jb\": 1, \"pre\": 1, \"hidden\": 512, \"ffn\": 1376, "
        "\"act\": 4, \"norm\": 1, \"kv_heads\": 0, \"no_bias\": 1, "
        "\"gated\": 1, \"eps\": 9.9999999747524271e-07, \"lt\": %d%s}";
    snprintf(r.config, sizeof(r.config), cfg, lt,
             ", \"rope_table\": true, \"rope_dim\": 32");
    stof_layer_desc d;
    int old = -1;
    char got[1024], why[256] = "";
    cr_assert_eq(stof__layer_record_desc(ctx, &r, &d, &old, got, sizeof(got),
                                         why, sizeof(why)),
                 1, "%s", why);
    cr_expect_str_eq(got, text);
    cr_expect_eq(d.rope_theta, 0.0f);
    cr_expect_eq(d.rope_dim, 32);
    cr_expect_eq(d.rope_freq, stof__rope_freq_standin());
    cr_expect_eq(stof__layer_desc_check(ctx, &d), STOF_OK, "%s",
                 stof_errmsg(ctx));
    for (int i = 0; i < 128; i++) /* (stand-ins a descriptor may hold) */
        cr_expect(isfinite(d.rope_freq[i]) && d.rope_freq[i] > 0.0f,
                  "stand-in %d: %g", i, (double)d.rope_freq[i]);
    /* A QK norm: its key and its record */
    L->d.rope_freq = fa;
    L->d.rope_theta = 0.0f;
    L->d.qk_norm = 1;
    stof__layer_key(L, hex);
    cr_expect(strstr(L->key_text, ";qk_norm=1;rope=table;rope_dim=32"), "%s",
              L->key_text);
    snprintf(r.key, sizeof(r.key), "%s", L->key);
    snprintf(r.config, sizeof(r.config), cfg, lt,
             ", \"rope_table\": true, \"rope_dim\": 32, \"qk_norm\": 1");
    cr_assert_eq(stof__layer_record_desc(ctx, &r, &d, &old, got, sizeof(got),
                                         why, sizeof(why)),
                 1, "%s", why);
    cr_expect_str_eq(got, L->key_text);
    cr_expect_eq(d.qk_norm, 1);
    snprintf(r.config, sizeof(r.config), cfg, lt,
             ", \"rope_table\": true, \"rope_dim\": 32, \"qk_norm\": 2");
    cr_expect_eq(stof__layer_record_desc(ctx, &r, &d, &old, got, sizeof(got),
                                         why, sizeof(why)),
                 0, "qk_norm 2 read as a layer's");
    snprintf(r.key, sizeof(r.key), "%s", ka);
    static const char *const bad[] = {
        ", \"rope_table\": false, \"rope_dim\": 32",
        ", \"rope_table\": 1, \"rope_dim\": 32",
        ", \"rope_table\": true, \"rope_theta\": 10000.0, \"rope_dim\": 32",
        ", \"rope_table\": true, \"rope_dim\": -2"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(*bad); i++) {
        snprintf(r.config, sizeof(r.config), cfg, lt, bad[i]);
        cr_expect_eq(stof__layer_record_desc(ctx, &r, &d, &old, got,
                                             sizeof(got), why, sizeof(why)),
                     0, "record %zu (%s) read as a layer's", i, bad[i]);
    }
    free(L);
    stof_close(&ctx);
}

/* Heads whose width is not hidden's (desc.head_dim): the key says
 * ";head_dim=D" (a head_dim equal to hidden / heads keys as 0 does), and a
 * scheme record gives the head_dim back from its row's head_dim. */
Test(layer, head_dim_key_and_record)
{
    stof_context *ctx = ctx_open();
    stof_layer *L = calloc(1, sizeof(*L));
    cr_assert(L);
    L->ctx = ctx;
    stof_layer_desc_init(&L->d, 2, 256, 512, 8, STOF_DTYPE_BF16);
    L->d.pre_norm = 1;
    L->eps = L->d.norm_eps;
    const char *hex = "00112233445566778899aabbccddeeff";
    stof__layer_key(L, hex);
    char k0[33];
    snprintf(k0, sizeof(k0), "%s", L->key);
    cr_expect(!strstr(L->key_text, "head_dim"), "%s", L->key_text);
    L->d.head_dim = 64; /* (= hidden / heads: the same layer) */
    stof__layer_key(L, hex);
    cr_expect_str_eq(L->key, k0);
    L->d.head_dim = 128; /* (1024 columns over a hidden of 512) */
    stof__layer_key(L, hex);
    cr_expect(strstr(L->key_text, ";head_dim=128"), "%s", L->key_text);
    cr_expect_str_neq(L->key, k0);
    stof_db_record r;
    scheme_record(&r, L->key, hex);
    r.head_dim = 128;
    snprintf(r.config, sizeof(r.config),
             "{\"ja\": 1, \"jb\": 1, \"pre\": 1, \"hidden\": 512, \"ffn\": "
             "2048, \"act\": 1, \"norm\": 0, \"kv_heads\": 0, \"no_bias\": 0, "
             "\"gated\": 0, \"eps\": %.17g, \"lt\": %d}",
             (double)1e-5f, (int)stof__blaslt_version());
    stof_layer_desc d;
    int old = -1;
    char got[1024], why[256] = "";
    cr_assert_eq(stof__layer_record_desc(ctx, &r, &d, &old, got, sizeof(got),
                                         why, sizeof(why)),
                 1, "%s", why);
    cr_expect_eq(d.head_dim, 128);
    cr_expect_str_eq(got, L->key_text);
    cr_expect_eq(stof__layer_desc_check(ctx, &d), STOF_OK, "%s",
                 stof_errmsg(ctx));
    free(L);
    stof_close(&ctx);
}

/* Programmatic launches: the choice a scheme record keeps (0 or 1; none,
 * or anything else: -1, the rule decides), the rule for plans without one
 * (compute capability 9.0+, at most STOF_LAYER_PDL_TOKENS tokens) and the
 * search's pick from its timings. */
Test(layer, pdl_record_and_rule)
{
    cr_expect_eq(stof__layer_record_pdl("{\"ja\": 0, \"jb\": 0, \"pdl\": 0}"),
                 0);
    cr_expect_eq(stof__layer_record_pdl("{\"ja\": 0, \"jb\": 0, \"pdl\": 1}"),
                 1);
    cr_expect_eq(stof__layer_record_pdl("{\"ja\": 0, \"jb\": 0}"), -1);
    cr_expect_eq(stof__layer_record_pdl("{\"pdl\": 2}"), -1);
    cr_expect_eq(stof__layer_record_pdl("{\"pdl\": -1}"), -1);
    cr_expect_eq(stof__layer_record_pdl("{\"pdl\": \"on\"}"), -1);
    cr_expect_eq(stof__layer_record_pdl("not json"), -1);
    cr_expect_eq(stof__layer_record_pdl(""), -1);
    cr_expect_eq(stof__layer_record_pdl(NULL), -1);
    stof_device dev;
    memset(&dev, 0, sizeof(dev));
    dev.cc_major = 9;
    cr_expect_eq(stof__layer_pdl_rule(&dev, 128), 1);
    cr_expect_eq(stof__layer_pdl_rule(&dev, STOF_LAYER_PDL_TOKENS), 1);
    cr_expect_eq(stof__layer_pdl_rule(&dev, STOF_LAYER_PDL_TOKENS + 1), 0);
    dev.cc_major = 8;
    cr_expect_eq(stof__layer_pdl_rule(&dev, 128), 0);
    /* The search's pick: a clear difference (over the margin) decides,
     * else the rule; no timing (0, NaN): the rule. */
    cr_expect_eq(stof__layer_pdl_pick(1.0, 0.98, 0), 1);
    cr_expect_eq(stof__layer_pdl_pick(1.0, 1.02, 1), 0);
    cr_expect_eq(stof__layer_pdl_pick(1.0, 0.995, 0), 0);
    cr_expect_eq(stof__layer_pdl_pick(1.0, 0.995, 1), 1);
    cr_expect_eq(stof__layer_pdl_pick(1.0, 1.005, 1), 1);
    cr_expect_eq(stof__layer_pdl_pick(1.0, 1.005, 0), 0);
    cr_expect_eq(stof__layer_pdl_pick(0.0, 0.5, 1), 1);
    cr_expect_eq(stof__layer_pdl_pick(0.5, 0.0 / 0.0, 0), 0);
}
