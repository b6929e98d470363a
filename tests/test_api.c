/*
 * test_api.c - the public API on the CPU: statuses, versions, settings,
 * context lifetime, descriptor validation and its messages.
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "stof.h"
#include "testutil.h"

Test(api, status_strings_are_static_and_distinct)
{
    for (int i = 0; i < STOF_STATUS_COUNT_; i++) {
        const char *a = stof_status_str((stof_status)i);
        cr_assert(a && *a);
        cr_assert_str_neq(a, "unknown status", "status %d has no text", i);
        for (int j = 0; j < i; j++)
            cr_assert_str_neq(a, stof_status_str((stof_status)j));
    }
    cr_assert_str_eq(stof_status_str(STOF_OK), "success");
    cr_assert_str_eq(stof_status_name(STOF_ERR_NO_DEVICE), "ERR_NO_DEVICE");
    cr_assert_str_eq(stof_status_str((stof_status)999), "unknown status");
    cr_assert_str_eq(stof_status_str((stof_status)-1), "unknown status");
}

Test(api, versions_agree)
{
    cr_assert_eq(stof_version(), STOF_VERSION_NUMBER);
    char want[32];
    snprintf(want, sizeof(want), "%d.%d.%d", STOF_VERSION_MAJOR,
             STOF_VERSION_MINOR, STOF_VERSION_PATCH);
    cr_assert_str_eq(stof_version_string(), want);
    cr_assert_neq(stof_template_hash(), 0);
    cr_assert_eq(stof_template_hash(), stof_template_hash());
}

Test(api, open_close_without_requiring_a_device)
{
    stof_context *ctx = NULL;
    cr_assert_eq(stof_open(&ctx, NULL), STOF_OK, "%s", stof_errmsg(ctx));
    cr_assert_not_null(ctx);
    cr_assert_str_eq(stof_errmsg(ctx), "");
    stof_close(&ctx);
    cr_assert_null(ctx);
    stof_close(&ctx);  /* harmless */
    stof_close(NULL);  /* harmless */
    cr_assert(strlen(stof_errmsg(NULL)) > 0);
    cr_assert_eq(stof_open(NULL, NULL), STOF_ERR_INVALID_ARGUMENT);
}

Test(api, bad_settings_are_named)
{
    stof_settings s;
    stof_default_settings(&s);
    s.reserved[5] = 1;
    stof_context *ctx = NULL;
    cr_assert_eq(stof_open(&ctx, &s), STOF_ERR_INVALID_ARGUMENT);
    cr_assert(strstr(stof_errmsg(ctx), "reserved"), "%s", stof_errmsg(ctx));
    stof_close(&ctx);

    stof_default_settings(&s);
    s.device = -2;
    cr_assert_eq(stof_open(&ctx, &s), STOF_ERR_INVALID_ARGUMENT);
    cr_assert(strstr(stof_errmsg(ctx), "settings.device"), "%s",
              stof_errmsg(ctx));
    stof_close(&ctx);

    stof_default_settings(&s);
    s.tuning_top_k = 99;
    cr_assert_eq(stof_open(&ctx, &s), STOF_ERR_INVALID_ARGUMENT);
    cr_assert(strstr(stof_errmsg(ctx), "tuning_top_k"), "%s", stof_errmsg(ctx));
    stof_close(&ctx);

    stof_default_settings(&s);
    s.tuning_mode = (stof_tuning_mode)7;
    cr_assert_eq(stof_open(&ctx, &s), STOF_ERR_INVALID_ARGUMENT);
    cr_assert(strstr(stof_errmsg(ctx), "tuning_mode"), "%s", stof_errmsg(ctx));
    stof_close(&ctx);
}

/* $STOF_TUNING_MODE sets the default tuning mode; a field set by the
 * program wins; a value naming no mode makes stof_open fail by name
 * (each Criterion test runs in its own process). */
Test(api, tuning_mode_from_the_environment)
{
    stof_settings s;
    unsetenv("STOF_TUNING_MODE");
    stof_default_settings(&s);
    cr_assert_eq(s.tuning_mode, STOF_TUNE_DEFAULT);
    static const struct {
        const char *v;
        stof_tuning_mode m;
    } ok[] = {{"cache-only", STOF_TUNE_CACHE_ONLY},
              {"force", STOF_TUNE_FORCE},
              {"default", STOF_TUNE_DEFAULT},
              {"", STOF_TUNE_DEFAULT}};
    for (size_t i = 0; i < sizeof(ok) / sizeof(*ok); i++) {
        cr_assert_eq(setenv("STOF_TUNING_MODE", ok[i].v, 1), 0);
        stof_default_settings(&s);
        cr_assert_eq(s.tuning_mode, ok[i].m, "%s", ok[i].v);
    }
    cr_assert_eq(setenv("STOF_TUNING_MODE", "force", 1), 0);
    stof_default_settings(&s);
    s.tuning_mode = STOF_TUNE_CACHE_ONLY;
    stof_context *ctx = NULL;
    cr_assert_eq(stof_open(&ctx, &s), STOF_OK, "%s", stof_errmsg(ctx));
    stof_close(&ctx);
    cr_assert_eq(setenv("STOF_TUNING_MODE", "cache_only", 1), 0);
    cr_assert_eq(stof_open(&ctx, NULL), STOF_ERR_INVALID_ARGUMENT);
    cr_assert(strstr(stof_errmsg(ctx), "STOF_TUNING_MODE=cache_only"), "%s",
              stof_errmsg(ctx));
    stof_close(&ctx);
    unsetenv("STOF_TUNING_MODE");
}

/* $STOF_PRELOAD: 0, 1 or all open (with or without a GPU: a context that
 * cannot preload still opens); anything else fails by name. */
Test(api, preload_from_the_environment)
{
    static const char *const ok[] = {"0", "1", "all", ""};
    for (size_t i = 0; i < sizeof(ok) / sizeof(*ok); i++) {
        cr_assert_eq(setenv("STOF_PRELOAD", ok[i], 1), 0);
        stof_settings s;
        stof_default_settings(&s);
        s.user_db = ""; /* (no database: nothing to load) */
        stof_context *ctx = NULL;
        cr_assert_eq(stof_open(&ctx, &s), STOF_OK, "STOF_PRELOAD=%s: %s",
                     ok[i], stof_errmsg(ctx));
        stof_close(&ctx);
    }
    cr_assert_eq(setenv("STOF_PRELOAD", "yes", 1), 0);
    stof_context *ctx = NULL;
    cr_assert_eq(stof_open(&ctx, NULL), STOF_ERR_INVALID_ARGUMENT);
    cr_assert(strstr(stof_errmsg(ctx), "STOF_PRELOAD=yes"), "%s",
              stof_errmsg(ctx));
    stof_close(&ctx);
    unsetenv("STOF_PRELOAD");
}

Test(api, device_required_but_absent_or_present)
{
    stof_settings s;
    stof_default_settings(&s);
    s.require_device = 1;
    stof_context *ctx = NULL;
    stof_status st = stof_open(&ctx, &s);
    if (st == STOF_OK) {
        cr_assert(stof_has_device(ctx));
    } else {
        cr_assert_eq(st, STOF_ERR_NO_DEVICE, "%s", stof_errmsg(ctx));
        cr_assert(strlen(stof_errmsg(ctx)) > 10);
        cr_assert_eq(stof_errcode(ctx), STOF_ERR_NO_DEVICE);
    }
    stof_close(&ctx);
}

typedef struct log_capture {
    int n;
    char last[512];
} log_capture;

static void capture(void *user, stof_log_level level, const char *msg)
{
    log_capture *c = user;
    (void)level;
    c->n++;
    snprintf(c->last, sizeof(c->last), "%s", msg);
}

static stof_context *open_plain(log_capture *cap)
{
    stof_settings s;
    stof_default_settings(&s);
    if (cap) {
        s.log_fn = capture;
        s.log_user = cap;
        s.log_level = STOF_LOG_ERROR;
    }
    stof_context *ctx = NULL;
    cr_assert_eq(stof_open(&ctx, &s), STOF_OK);
    return ctx;
}

/* Plan a problem and expect STOF_ERR_INVALID_ARGUMENT with `needle` in the
 * message. Validation runs before any GPU work, so this needs no device. */
static void expect_bad(stof_context *ctx, const stof_attention_desc *d,
                       const stof_mask *m, const char *needle)
{
    stof_plan *p = (stof_plan *)0x1;
    cr_assert_eq(stof_attention_plan(ctx, d, m, &p), STOF_ERR_INVALID_ARGUMENT,
                 "expected a refusal mentioning \"%s\"", needle);
    cr_assert_null(p);
    cr_assert(strstr(stof_errmsg(ctx), needle), "message \"%s\" lacks \"%s\"",
              stof_errmsg(ctx), needle);
}

Test(api, descriptor_validation_names_the_field)
{
    log_capture cap = {0};
    stof_context *ctx = open_plain(&cap);
    stof_mask *m = NULL;
    cr_assert_eq(stof_mask_from_spec(ctx, "causal", 128, 96, &m), STOF_OK);
    stof_attention_desc d0, d;
    cr_assert_eq(stof_attention_desc_init(&d0, 2, 4, 128, 96, 64,
                                          STOF_DTYPE_FP16, STOF_LAYOUT_BHSD),
                 STOF_OK);
    cr_assert_eq(d0.q_stride[2], 64);
    cr_assert_eq(d0.q_stride[1], 128 * 64);
    cr_assert_eq(d0.k_stride[0], 4 * 96 * 64);

    d = d0; d.batch = 0;            expect_bad(ctx, &d, m, "desc.batch");
    d = d0; d.heads = -1;           expect_bad(ctx, &d, m, "desc.heads");
    d = d0; d.seq_q = 64;           expect_bad(ctx, &d, m, "mask is 128 x 96");
    d = d0; d.head_dim = 12;        expect_bad(ctx, &d, m, "desc.head_dim");
    d = d0; d.head_dim = 264;       expect_bad(ctx, &d, m, "desc.head_dim");
    d = d0; d.dtype = (stof_dtype)5; expect_bad(ctx, &d, m, "desc.dtype");
    d = d0; d.layout = (stof_layout)9; expect_bad(ctx, &d, m, "desc.layout");
    d = d0; d.scale = 1.0f / 0.0f;  expect_bad(ctx, &d, m, "desc.scale");
    d = d0; d.reserved[3] = 1;      expect_bad(ctx, &d, m, "reserved");
    d = d0; d.kv_heads = 3;         expect_bad(ctx, &d, m, "desc.kv_heads");
    d = d0; d.kv_heads = 8;         expect_bad(ctx, &d, m, "desc.kv_heads");
    d = d0; d.kv_heads = -2;        expect_bad(ctx, &d, m, "desc.kv_heads");
    d = d0; d.softcap = -1.0f;      expect_bad(ctx, &d, m, "desc.softcap");
    d = d0; d.softcap = 1.0f / 0.0f; expect_bad(ctx, &d, m, "desc.softcap");
    const float slopes[4] = {0.5f, 0.25f, 0.0f / 0.0f, 0.125f};
    d = d0; d.alibi_slopes = slopes;
    expect_bad(ctx, &d, m, "desc.alibi_slopes[2]");
    /* Finite values whose base-2 constants overflow (inf * 0 = NaN in the
     * kernels). */
    d = d0; d.scale = 3e38f;        expect_bad(ctx, &d, m, "log2(e)");
    d = d0; d.softcap = 3e38f;      expect_bad(ctx, &d, m, "desc.softcap: 3");
    d = d0; d.softcap = 3e-39f; d.scale = 2.0f;
    expect_bad(ctx, &d, m, "scale / softcap");
    const float big[4] = {0.5f, 0.25f, 0.125f, 3e38f};
    d = d0; d.alibi_slopes = big;
    expect_bad(ctx, &d, m, "desc.alibi_slopes[3]");
    d = d0; d.bias = 2;             expect_bad(ctx, &d, m, "desc.bias");
    d = d0; d.bias_stride[1] = 8;   expect_bad(ctx, &d, m, "desc.bias is 0");
    d = d0; d.bias = 1; d.bias_stride[2] = 100;
    expect_bad(ctx, &d, m, "desc.bias_stride[2]");
    d = d0; d.bias = 1; d.bias_stride[0] = -8;
    expect_bad(ctx, &d, m, "desc.bias_stride[0]");
    d = d0; d.bias = 1; d.bias_stride[0] = INT64_MAX / 8 * 8;
    expect_bad(ctx, &d, m, "bias tensor's extent");
    d = d0; d.layout = STOF_LAYOUT_PACKED;
    expect_bad(ctx, &d, m, "stof_attention_plan_family");
    d = d0; d.layout = STOF_LAYOUT_STRIDED; d.k_stride[2] = 60;
    expect_bad(ctx, &d, m, "desc.k_stride[2]");
    d = d0; d.layout = STOF_LAYOUT_STRIDED; d.v_stride[0] = -8;
    expect_bad(ctx, &d, m, "desc.v_stride[0]");
    d = d0; d.layout = STOF_LAYOUT_STRIDED; d.o_stride[2] = 32;
    expect_bad(ctx, &d, m, "overlap");
    d = d0; d.layout = STOF_LAYOUT_STRIDED; d.q_stride[0] = INT64_MAX / 8 * 8;
    expect_bad(ctx, &d, m, "overflows");
    expect_bad(ctx, NULL, m, "desc is NULL");
    expect_bad(ctx, &d0, NULL, "mask is NULL");
    cr_assert_gt(cap.n, 0, "errors reach the log callback");
    cr_assert(strstr(cap.last, "mask is NULL"), "%s", cap.last);

    cr_assert_eq(stof_attention_plan(ctx, &d0, m, NULL),
                 STOF_ERR_INVALID_ARGUMENT);
    cr_assert_eq(stof_attention_plan(NULL, &d0, m, NULL),
                 STOF_ERR_INVALID_ARGUMENT);
    cr_assert_eq(stof_attention_desc_init(&d, 1, 1, 8, 8, 64, STOF_DTYPE_FP16,
                                          STOF_LAYOUT_STRIDED),
                 STOF_ERR_INVALID_ARGUMENT);
    stof_mask_free(&m);
    stof_close(&ctx);
}

Test(api, plan_without_device_says_so)
{
    stof_context *ctx = open_plain(NULL);
    if (stof_has_device(ctx)) {
        stof_close(&ctx);
        cr_skip_test("a GPU is present; the no-device path is not reachable");
    }
    stof_mask *m = NULL;
    cr_assert_eq(stof_mask_from_spec(ctx, "dense", 64, 64, &m), STOF_OK);
    stof_attention_desc d;
    stof_attention_desc_init(&d, 1, 1, 64, 64, 64, STOF_DTYPE_BF16,
                             STOF_LAYOUT_BSHD);
    stof_plan *p = NULL;
    cr_assert_eq(stof_attention_plan(ctx, &d, m, &p), STOF_ERR_NO_DEVICE);
    cr_assert_null(p);
    cr_assert(strstr(stof_errmsg(ctx), "GPU"), "%s", stof_errmsg(ctx));
    cr_assert_eq(stof_device_describe(ctx, NULL, 0, NULL), STOF_ERR_NO_DEVICE);
    /* The batch warm-up says which problem failed and why. */
    stof_plan *ps[2] = {(stof_plan *)0x1, (stof_plan *)0x1};
    stof_attention_desc ds[2] = {d, d};
    const stof_mask *ms[2] = {m, m};
    cr_assert_eq(stof_attention_plan_batch(ctx, 2, ds, ms, ps),
                 STOF_ERR_NO_DEVICE);
    cr_assert_null(ps[0]);
    cr_assert_null(ps[1]);
    cr_assert(strstr(stof_errmsg(ctx), "problem 0"), "%s", stof_errmsg(ctx));
    cr_assert_eq(stof_attention_plan_batch(ctx, 0, NULL, NULL, NULL), STOF_OK);
    cr_assert_eq(stof_attention_plan_batch(ctx, -1, ds, ms, ps),
                 STOF_ERR_INVALID_ARGUMENT);
    stof_mask_free(&m);
    stof_plan_free(&p);
    stof_plan_free(NULL);
    cr_assert_eq(stof_plan_describe(NULL, NULL, 0, NULL),
                 STOF_ERR_INVALID_ARGUMENT);
    /* *needed is set (0) on every error, as stof_device_describe's. */
    size_t need = 99;
    cr_assert_eq(stof_plan_describe(NULL, NULL, 0, &need),
                 STOF_ERR_INVALID_ARGUMENT);
    cr_assert_eq(need, 0);
    need = 99;
    cr_assert_eq(stof_layer_describe(NULL, NULL, 5, &need),
                 STOF_ERR_INVALID_ARGUMENT);
    cr_assert_eq(need, 0);
    stof_close(&ctx);
}

/* A log callback that must never be called. */
static void never_called(void *user, stof_log_level level, const char *msg)
{
    (void)user;
    (void)level;
    (void)msg;
    abort();
}

Test(api, preload_arguments_and_no_device)
{
    int loaded = 7;
    cr_assert_eq(stof_preload(NULL, 0, &loaded), STOF_ERR_INVALID_ARGUMENT);
    cr_assert_eq(loaded, 0);
    stof_context *ctx = open_plain(NULL);
    loaded = 7;
    cr_assert_eq(stof_preload(ctx, -1, &loaded), STOF_ERR_INVALID_ARGUMENT);
    cr_assert(strstr(stof_errmsg(ctx), "max_modules"), "%s",
              stof_errmsg(ctx));
    cr_assert_eq(loaded, 0);
    if (stof_has_device(ctx)) {
        stof_close(&ctx);
        cr_skip_test("a GPU is present; test_gpu_layer preloads");
    }
    loaded = 7;
    cr_assert_eq(stof_preload(ctx, 0, &loaded), STOF_ERR_NO_DEVICE);
    cr_assert_eq(loaded, 0);
    cr_assert(strstr(stof_errmsg(ctx), "GPU"), "%s", stof_errmsg(ctx));
    cr_assert_eq(stof_preload(ctx, 0, NULL), STOF_ERR_NO_DEVICE);
    stof_close(&ctx);
}

Test(api, garbage_settings_are_refused_before_anything_uses_them)
{
    /* A struct full of garbage: pointers that must not be followed, a
     * callback that must not be called. */
    stof_settings s;
    memset(&s, 0xa5, sizeof(s));
    stof_context *ctx = NULL;
    cr_assert_eq(stof_open(&ctx, &s), STOF_ERR_INVALID_ARGUMENT);
    cr_assert(strstr(stof_errmsg(ctx), "reserved"), "%s", stof_errmsg(ctx));
    stof_close(&ctx);
    /* Reserved bytes zeroed, but every field out of range: the first bad
     * field is named and the callback is still not called. */
    memset(&s, 0, sizeof(s));
    s.log_fn = never_called;
    s.log_level = STOF_LOG_DEBUG;
    s.tuning_budget_s = 0.0 / 0.0;
    cr_assert_eq(stof_open(&ctx, &s), STOF_ERR_INVALID_ARGUMENT);
    cr_assert(strstr(stof_errmsg(ctx), "tuning_budget_s"), "%s",
              stof_errmsg(ctx));
    stof_close(&ctx);
    stof_default_settings(&s);
    s.log_fn = never_called;
    s.log_level = (stof_log_level)77;
    cr_assert_eq(stof_open(&ctx, &s), STOF_ERR_INVALID_ARGUMENT);
    cr_assert(strstr(stof_errmsg(ctx), "log_level"), "%s", stof_errmsg(ctx));
    stof_close(&ctx);
    stof_default_settings(&s);
    s.require_device = 5;
    cr_assert_eq(stof_open(&ctx, &s), STOF_ERR_INVALID_ARGUMENT);
    stof_close(&ctx);
}

Test(api, huge_descriptor_sizes_are_refused_without_overflow)
{
    stof_attention_desc d;
    const int big = 2147483647;
    cr_assert_eq(stof_attention_desc_init(&d, big, big, big, big, big,
                                          STOF_DTYPE_FP16, STOF_LAYOUT_BHSD),
                 STOF_ERR_INVALID_ARGUMENT);
    cr_assert_eq(stof_attention_desc_init(&d, 1, 1 << 20, 1 << 30, 1 << 30,
                                          1 << 20, STOF_DTYPE_FP16,
                                          STOF_LAYOUT_BSHD),
                 STOF_ERR_INVALID_ARGUMENT);
    cr_assert_eq(stof_attention_desc_init(&d, -1, 4, 64, 64, 64,
                                          STOF_DTYPE_FP16, STOF_LAYOUT_BHSD),
                 STOF_ERR_INVALID_ARGUMENT);
    cr_assert_eq(stof_attention_desc_init(&d, 65535, 4096, 1 << 20, 1 << 20,
                                          256, STOF_DTYPE_BF16,
                                          STOF_LAYOUT_BSHD),
                 STOF_OK, "large but representable");
}
