/*
 * test_gpu_cli.c - stof-tune's GPU commands on Transformer layers: a
 * layer workload tuned into a database and loaded from it, verified; a
 * serving process's cache-only layer miss tuned by `pending`; verify
 * checks a layer's kernel records and finds a wrong one. The suite
 * reports itself skipped (exit 77) without a GPU (test_cli.c covers the
 * commands' parsing and their no-GPU paths).
 */
#include <criterion/criterion.h>
#include <jansson.h>

#include <stdio.h>
#include <string.h>

#include "cliutil.h"
#include "db.h"
#include "gemm.h"
#include "internal.h"
#include "testutil.h"

TestSuite(gpu_cli, .init = cli_setup, .fini = cli_teardown, .timeout = 300);

/* Count the verdicts of a `verify --json` document: n[op][v] with op 0
 * layer, 1 a layer's kernel (gemm, norm), 2 anything else, v 0 ok, 1 bad,
 * 2 skipped. With key set, that record's verdict and why go to *verdict
 * and why (each up to 511 characters). */
static void verdicts(const char *js, int n[3][3], const char *key,
                     char (*verdict)[512])
{
    memset(n, 0, sizeof(int[3][3]));
    json_t *o = json_loads(js, 0, NULL);
    cr_assert(o, "%s", js);
    json_t *recs = json_object_get(o, "records"), *r;
    size_t i;
    json_array_foreach(recs, i, r)
    {
        const char *op = json_string_value(json_object_get(r, "op"));
        const char *v = json_string_value(json_object_get(r, "verdict"));
        const char *k = json_string_value(json_object_get(r, "key"));
        cr_assert(op && v && k, "%s", js);
        const int oi = !strcmp(op, "layer")
                           ? 0
                           : !strcmp(op, "gemm") || !strcmp(op, "norm") ? 1
                                                                        : 2;
        const int vi = !strcmp(v, "ok") ? 0 : !strcmp(v, "bad") ? 1 : 2;
        n[oi][vi]++;
        if (key && !strcmp(k, key))
            snprintf(verdict[0], 512, "%s: %s", v,
                     json_string_value(json_object_get(r, "why")));
    }
    json_decref(o);
}

/* `verify --db db --json`: exit 0, `layers` layer records ok, at least
 * `kernels` kernel records ok, no layer or kernel record bad or skipped and
 * nothing else bad (a builder record is skipped). */
static void expect_all_verified(const char *db, int layers, int kernels)
{
    cr_assert_eq(run("verify --db %s --json", db), 0, "%s\n%s", out_buf,
                 err_buf);
    int n[3][3];
    verdicts(out_buf, n, NULL, NULL);
    cr_expect_eq(n[0][0], layers, "%s", out_buf);
    cr_expect_geq(n[1][0], kernels, "%s", out_buf);
    for (int op = 0; op < 2; op++)
        cr_expect_eq(n[op][1] + n[op][2], 0, "op %d: %s", op, out_buf);
    cr_expect_eq(n[2][1], 0, "%s", out_buf);
}

/* On a GPU: a layer workload tunes into --db (a row per layer problem,
 * kernel "layer"), a second run loads every plan from it, and verify
 * re-checks the layer's records. */
Test(gpu_cli, tune_layers)
{
    FILE *f = fopen(P("tiny.workload"), "w");
    fputs("mask causal\nlayer tiny hidden=128 heads=2 ffn=256 act=gelu_erf\n"
          "layer tinyg hidden=128 heads=2 kv_heads=1 ffn=128 act=silu "
          "norm=rms pre gated no_bias\ntokens 2x128\n",
          f);
    fclose(f);
    cr_assert_eq(run("tune %s --db %s", P("tiny.workload"), P("layers.db")),
                 0, "%s\n%s", out_buf, err_buf);
    cr_assert(strstr(out_buf, "layer tiny causal 2x128 fp16"), "%s",
              out_buf);
    cr_assert(strstr(out_buf, "layer tinyg causal 2x128 fp16"), "%s",
              out_buf);
    cr_assert_eq(count_lines(out_buf), 3, "%s", out_buf); /* + header */
    cr_assert(strstr(out_buf, " tuned"), "%s", out_buf);
    cr_assert_eq(run("tune %s --db %s --json", P("tiny.workload"),
                     P("layers.db")),
                 0, "%s", err_buf);
    cr_assert(strstr(out_buf, "\"kernel\":\"layer\""), "%s", out_buf);
    cr_assert(strstr(out_buf, "\"source\":\"database\""), "%s", out_buf);
    cr_assert(!strstr(out_buf, "\"source\":\"tuned\""), "%s", out_buf);
    cr_assert(strstr(out_buf, "\"junction_a\""), "%s", out_buf);
    cr_assert_eq(run("verify --db %s", P("layers.db")), 0, "%s\n%s", out_buf,
                 err_buf);
    /* Both layers (the second gated, grouped-query, bias-free, RMSNorm,
     * pre-norm) are planned again from their records and every kernel
     * record of theirs checked. */
    expect_all_verified(P("layers.db"), 2, 8);
}

/* Plan the tiny layer (hidden 128, 2 heads, 2 x 128 tokens) with `db` as
 * the user database in cache-only mode, over a causal mask or (family not
 * NULL) that mask family's default instance; the plan's source. */
static void tiny_layer_cache_only(const char *db, const char *family,
                                  char *source, size_t n)
{
    stof_settings s;
    stof_default_settings(&s);
    s.user_db = db;
    s.require_device = 1;
    s.tuning_mode = STOF_TUNE_CACHE_ONLY;
    stof_context *ctx = NULL;
    cr_assert_eq(stof_open(&ctx, &s), STOF_OK);
    stof_mask *m = NULL;
    stof_mask_family *fam = NULL;
    stof_layer_desc d;
    stof_layer_desc_init(&d, 2, 128, 128, 2, STOF_DTYPE_FP16);
    d.ffn = 256;
    d.act = STOF_ACT_GELU_ERF;
    stof_layer *L = NULL;
    if (family) {
        cr_assert_eq(stof_mask_family_create(ctx, family, &fam), STOF_OK);
        cr_assert_eq(stof_layer_plan_family(ctx, &d, fam, NULL, &L), STOF_OK,
                     "%s", stof_errmsg(ctx));
    } else {
        cr_assert_eq(stof_mask_from_spec(ctx, "causal", 128, 128, &m),
                     STOF_OK);
        cr_assert_eq(stof_layer_plan(ctx, &d, m, &L), STOF_OK, "%s",
                     stof_errmsg(ctx));
    }
    char js[8192];
    cr_assert_eq(stof_layer_describe(L, js, sizeof(js), NULL), STOF_OK);
    json_t *o = json_loads(js, 0, NULL);
    snprintf(source, n, "%s",
             json_string_value(json_object_get(o, "source")));
    json_decref(o);
    stof_layer_free(&L);
    stof_mask_free(&m);
    stof_mask_family_free(&fam);
    stof_close(&ctx);
}

/* The same for a layer over a mask family: its miss keeps the family's
 * spec (and sample instance), pending plans it with
 * stof_layer_plan_family; verify skips its records. */
Test(gpu_cli, pending_tunes_a_missed_family_layer)
{
    char source[32];
    tiny_layer_cache_only(P("fmiss.db"), "causal&docs", source,
                          sizeof(source));
    cr_assert_str_eq(source, "model");
    cr_assert_eq(run("pending --db %s", P("fmiss.db")), 0, "%s\n%s",
                 out_buf, err_buf);
    cr_assert(strstr(out_buf, "layer 2x128 hidden 128 heads 2 fp16 family "
                              "causal&docs"),
              "%s", out_buf);
    cr_assert_eq(run("stats --db %s", P("fmiss.db")), 0, "%s", err_buf);
    cr_assert(strstr(out_buf, "0 misses recorded"), "%s", out_buf);
    tiny_layer_cache_only(P("fmiss.db"), "causal&docs", source,
                          sizeof(source));
    cr_assert_str_eq(source, "database");
    /* verify skips the family's records with the reason (the library
     * checks them on first use), never calls them bad. */
    cr_assert_eq(run("verify --db %s --json", P("fmiss.db")), 0, "%s\n%s",
                 out_buf, err_buf);
    int n[3][3];
    verdicts(out_buf, n, NULL, NULL);
    cr_expect_eq(n[0][1] + n[1][1] + n[2][1], 0, "%s", out_buf);
    cr_expect_eq(n[0][2], 1, "%s", out_buf);
    cr_expect(strstr(out_buf, "mask family"), "%s", out_buf);
}

/* On a GPU: a cache-only layer plan that misses records its miss (with
 * its attention's); `pending` tunes both and drops them; the next
 * cache-only plan loads the layer from the database. */
Test(gpu_cli, pending_tunes_a_missed_layer)
{
    char source[32];
    tiny_layer_cache_only(P("miss.db"), NULL, source, sizeof(source));
    cr_assert_str_eq(source, "model");
    cr_assert_eq(run("stats --db %s", P("miss.db")), 0, "%s", err_buf);
    cr_assert(strstr(out_buf, "2 misses recorded"), "%s", out_buf);
    cr_assert_eq(run("pending --db %s", P("miss.db")), 0, "%s\n%s", out_buf,
                 err_buf);
    cr_assert(strstr(out_buf, "layer 2x128 hidden 128 heads 2 fp16"), "%s",
              out_buf);
    cr_assert_eq(run("stats --db %s", P("miss.db")), 0, "%s", err_buf);
    cr_assert(strstr(out_buf, "0 misses recorded"), "%s", out_buf);
    tiny_layer_cache_only(P("miss.db"), NULL, source, sizeof(source));
    cr_assert_str_eq(source, "database");
}

/* On a GPU: ten layer variants (every activation, both norms, pre- and
 * post-norm, gated, grouped-query, bias-free, head_dim 64 and 128, a
 * custom eps) in fp16 and bf16 tune into a database, and verify plans
 * each of the 20 layers again from its records, every kernel checked:
 * none bad, none skipped. */
Test(gpu_cli, verify_checks_every_layer_variant)
{
    FILE *f = fopen(P("variants.workload"), "w");
    fputs("layer a hidden=128 heads=2 act=gelu_tanh\n"
          "layer b hidden=128 heads=2 act=gelu_erf pre\n"
          "layer c hidden=128 heads=2 act=relu norm=rms\n"
          "layer d hidden=128 heads=2 act=silu norm=rms pre no_bias\n"
          "layer e hidden=128 heads=2 ffn=192 act=silu gated\n"
          "layer f hidden=128 heads=2 ffn=192 act=gelu_erf gated pre\n"
          "layer g hidden=128 heads=2 kv_heads=1 act=gelu_erf\n"
          "layer h hidden=256 heads=2 act=gelu_tanh pre eps=1e-12\n"
          "layer i hidden=256 heads=4 kv_heads=2 ffn=512 act=silu norm=rms "
          "pre gated no_bias eps=1e-6\n"
          "layer j hidden=256 heads=2 act=relu no_bias\n"
          "tokens 2x128\nmask causal\ndtype fp16 bf16\n",
          f);
    fclose(f);
    cr_assert_eq(run("tune %s --db %s", P("variants.workload"),
                     P("variants.db")),
                 0, "%s\n%s", out_buf, err_buf);
    expect_all_verified(P("variants.db"), 20, 80);
}

/* The first template GEMM record of the database at path, replaced by its
 * own kernel compiled for bf16 (the layer is fp16): it loads, reads the
 * same bytes and computes the wrong thing. Its key ("" when none). */
static int first_template_gemm(void *user, const stof_db_record *r)
{
    stof_db_record *out = user;
    if (out->key[0] || strcmp(r->op, "gemm") || strcmp(r->kernel, "gemm"))
        return 0;
    *out = *r;
    out->cubin = NULL;
    return 1;
}

static void poison_template_gemm(const char *path, char key[33])
{
    stof_settings s;
    stof_default_settings(&s);
    s.user_db = path;
    s.require_device = 1;
    stof_context *ctx = NULL;
    cr_assert_eq(stof_open(&ctx, &s), STOF_OK);
    stof_db *db = stof__ctx_db(ctx);
    stof_db_record r;
    memset(&r, 0, sizeof(r));
    cr_assert(db);
    cr_assert_eq(stof__db_foreach(db, 0, first_template_gemm, &r), STOF_OK);
    key[0] = '\0';
    if (r.key[0]) {
        stof_gemm_cfg c;
        stof_gemm_epi e;
        cr_assert(stof__gemm_cfg_parse(r.config, &c, &e), "%s", r.config);
        cr_assert_eq(stof__gemm_compile(ctx, STOF_DTYPE_BF16, &c, &e,
                                        r.seq_q, NULL, &r.cubin,
                                        &r.cubin_size),
                     STOF_OK, "%s", stof_errmsg(ctx));
        cr_assert_eq(stof__db_store(db, &r, 1, 0), STOF_OK, "%s",
                     stof_errmsg(ctx));
        snprintf(key, 33, "%s", r.key);
        stof__db_record_clear(&r);
    }
    stof_close(&ctx);
}

/* On a GPU: a layer record whose GEMM kernel computes the wrong thing.
 * verify names that record and its layer bad (the layer's other kernels
 * not reached are skipped, never called bad), --drop deletes the two, and
 * the database then verifies clean. cuBLASLt is left out
 * (STOF_LIBCUBLASLT=none), so the layer's GEMMs are template kernels. */
Test(gpu_cli, verify_finds_a_wrong_layer_kernel)
{
    cr_assert_eq(setenv("STOF_LIBCUBLASLT", "none", 1), 0);
    FILE *f = fopen(P("one.workload"), "w");
    fputs("mask causal\nlayer tiny hidden=128 heads=2 ffn=256 "
          "act=gelu_erf\ntokens 2x128\n",
          f);
    fclose(f);
    cr_assert_eq(run("tune %s --db %s", P("one.workload"), P("w.db")), 0,
                 "%s\n%s", out_buf, err_buf);
    char key[33], v[1][512] = {""};
    poison_template_gemm(P("w.db"), key);
    cr_assert(key[0], "no template GEMM record to replace");
    cr_assert_eq(run("verify --db %s --json", P("w.db")), 1, "%s\n%s",
                 out_buf, err_buf);
    int n[3][3];
    verdicts(out_buf, n, key, v);
    cr_expect(!strncmp(v[0], "bad: ", 5) && strstr(v[0], "verification"),
              "%s", v[0]);
    cr_expect_eq(n[0][1], 1, "the layer: %s", out_buf);
    cr_expect_eq(n[1][1], 1, "its kernels: %s", out_buf);
    cr_expect_eq(n[2][1], 0, "%s", out_buf);
    cr_expect_eq(n[1][0], 0, "%s", out_buf);
    cr_assert_eq(run("verify --db %s --drop", P("w.db")), 0, "%s\n%s",
                 out_buf, err_buf);
    cr_assert(strstr(out_buf, "2 bad (dropped)"), "%s", out_buf);
    cr_assert_eq(run("verify --db %s --json", P("w.db")), 0, "%s\n%s",
                 out_buf, err_buf);
    verdicts(out_buf, n, NULL, NULL);
    cr_expect_eq(n[0][0] + n[0][1] + n[0][2], 0, "%s", out_buf);
    cr_expect_eq(n[1][1] + n[2][1], 0, "%s", out_buf);
    cr_expect_geq(n[1][2], 1, "%s", out_buf);
}

/* Criterion's main, after a probe that reports the suite skipped (exit 77)
 * when no GPU is usable. */
__attribute__((visibility("default"))) int main(int argc, char **argv)
{
    return tu_gpu_suite_main("gpu cli", argc, argv);
}
