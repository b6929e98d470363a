/*
 * test_gpu_cli.c - stof-tune's GPU commands on Transformer layers: a
 * layer workload tuned into a database and loaded from it, verified; a
 * serving process's cache-only layer miss tuned by `pending`. The suite
 * reports itself skipped (exit 77) without a GPU (test_cli.c covers the
 * commands' parsing and their no-GPU paths).
 */
#include <criterion/criterion.h>
#include <jansson.h>

#include <stdio.h>
#include <string.h>

#include "cliutil.h"
#include "testutil.h"

TestSuite(gpu_cli, .init = cli_setup, .fini = cli_teardown, .timeout = 300);

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
 * stof_layer_plan_family. */
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

/* Criterion's main, after a probe that reports the suite skipped (exit 77)
 * when no GPU is usable. */
__attribute__((visibility("default"))) int main(int argc, char **argv)
{
    return tu_gpu_suite_main("gpu cli", argc, argv);
}
