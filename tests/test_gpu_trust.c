/*
 * test_gpu_trust.c - tuning records from elsewhere on a real GPU: a record
 * from a system database is verified once on this GPU and then trusted; a
 * record whose cubin computes the wrong thing (a crafted record with a
 * matching content hash) is never used, in any mode and in any layer; and
 * a problem tuned with one tensor layout hits the same record from every
 * other layout with nothing compiled. Every planning step runs in a child
 * process, as a separate program using the database would.
 */
#include <criterion/criterion.h>
#include <criterion/logging.h>

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cuda_shim.h"
#include "db.h"
#include "gemm.h"
#include "attention_int.h"
#include "internal.h"
#include "record_check.h"
#include "testutil.h"

static char dir[64];

static void setup(void)
{
    snprintf(dir, sizeof(dir), "/tmp/stof-gpu-trust-XXXXXX");
    cr_assert_not_null(mkdtemp(dir));
}

static void teardown(void)
{
    char cmd[128];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", dir);
}

TestSuite(gpu_trust, .init = setup, .fini = teardown, .timeout = 600);

static const char *P(const char *name)
{
    static char bufs[4][160];
    static int k;
    char *b = bufs[k++ & 3];
    snprintf(b, sizeof(bufs[0]), "%s/%s", dir, name);
    return b;
}

/* The problem every test plans. */
#define SPEC "bigbird:64:3:2:3:1"
#define B 2
#define H 4
#define N 1024
#define D 64

/* What a child reports: compiles, the plan's describe JSON, the log. */
typedef struct report {
    long compiles;
    char js[4096];
    char log[8192];
} report;

static char g_log[8192];
/* The problem planned by plan_job: with a soft-cap and ALiBi slopes when
 * set (children inherit it). */
static int g_mods;
static const float g_slopes[H] = {0.5f, -0.25f, 0.125f, 0.0625f};

static void logcb(void *user, stof_log_level level, const char *msg)
{
    (void)user;
    (void)level;
    size_t n = strlen(g_log);
    snprintf(g_log + n, sizeof(g_log) - n, "%s\n", msg);
}

/* In a child: plan the problem with the given databases, mode and layout
 * (STOF_LAYOUT_STRIDED: BSHD rows padded by 16 elements), report. */
typedef struct job {
    const char *user_db;
    const char *system_db; /* NULL: none */
    stof_tuning_mode mode;
    stof_layout layout;
} job;

static void plan_job(const job *j, report *out)
{
    stof_settings s;
    stof_default_settings(&s);
    s.user_db = j->user_db;
    const char *sys[] = {j->system_db, NULL};
    s.system_dbs = j->system_db ? sys : NULL;
    s.tuning_mode = j->mode;
    s.require_device = 1;
    s.log_fn = logcb;
    s.log_level = STOF_LOG_INFO;
    stof_context *ctx = NULL;
    if (stof_open(&ctx, &s) != STOF_OK)
        _exit(3);
    stof_mask *m = NULL;
    if (stof_mask_from_spec(ctx, SPEC, N, N, &m) != STOF_OK)
        _exit(4);
    stof_attention_desc d;
    tu_make_desc(&d, B, H, N, N, D, STOF_DTYPE_FP16, j->layout, 16);
    if (g_mods) {
        d.softcap = 2.0f;
        d.alibi_slopes = g_slopes;
    }
    long before = stof__jit_compile_count();
    stof_plan *p = NULL;
    if (stof_attention_plan(ctx, &d, m, &p) != STOF_OK) {
        snprintf(out->js, sizeof(out->js), "plan failed: %s",
                 stof_errmsg(ctx));
        _exit(5);
    }
    out->compiles = stof__jit_compile_count() - before;
    stof_plan_describe(p, out->js, sizeof(out->js), NULL);
    stof_plan_free(&p);
    stof_mask_free(&m);
    stof_close(&ctx);
}

/* A child's context on the GPU with `path` as its user database (exit 3
 * when it cannot open). */
static stof_context *open_with_db(const char *path)
{
    stof_settings s;
    stof_default_settings(&s);
    s.user_db = path;
    s.require_device = 1;
    stof_context *ctx = NULL;
    if (stof_open(&ctx, &s) != STOF_OK)
        _exit(3);
    return ctx;
}

/* In a child: replace the tuned problem's record in `path` (its user
 * database) by a kernel compiled here for dtype dt: the record's own
 * configuration, or (kind, config not NULL) that one; fast: it also
 * claims 1e-4 ms. Reports "WHAT KEY (KERNEL)". */
static void replace_record(const char *path, const char *kind,
                           const char *config, stof_dtype dt, int fast,
                           const char *what, report *out)
{
    stof_context *ctx = open_with_db(path);
    stof_mask *m = NULL;
    stof_attention_desc d;
    tu_make_desc(&d, B, H, N, N, D, STOF_DTYPE_FP16, STOF_LAYOUT_BHSD, 0);
    if (stof_mask_from_spec(ctx, SPEC, N, N, &m) != STOF_OK)
        _exit(4);
    char hex[33], key[33];
    stof_mask_digest(m, NULL, hex);
    stof__attention_key(ctx, &d, hex, key, NULL, 0);
    stof_db *db = stof__ctx_db(ctx);
    stof_db_record r;
    stof_candidate c;
    char why[256];
    if (!db || stof__db_lookup(db, key, &r) != STOF_OK)
        _exit(6);
    if (config) {
        snprintf(r.kernel, sizeof(r.kernel), "%s", kind);
        snprintf(r.config, sizeof(r.config), "%s", config);
    }
    if (!stof__attention_record_candidate(&r, &c, why, sizeof(why)))
        _exit(6);
    void *bin = NULL;
    size_t size = 0;
    if (stof__kernel_compile(ctx, &c, D, dt, &bin, &size) != STOF_OK)
        _exit(7);
    free(r.cubin);
    r.cubin = bin;
    r.cubin_size = size;
    if (fast)
        r.time_ms = 1e-4;
    if (stof__db_store(db, &r, 1, 0) != STOF_OK)
        _exit(8);
    snprintf(out->js, sizeof(out->js), "%s %s (%s)", what, key, r.kernel);
    stof__db_record_clear(&r);
    stof_mask_free(&m);
    stof_close(&ctx);
}

/* The record's own kernel compiled for bf16 on fp16 data, claiming to be
 * very fast: it loads, runs, reads the same bytes and computes the wrong
 * thing; its content hash is made to match, so only running it can tell. */
static void poison_job(const char *path, report *out)
{
    replace_record(path, NULL, NULL, STOF_DTYPE_BF16, 1, "poisoned", out);
}

/* Run fn(arg, report) in a child process and return its report. */
static report run(void (*fn)(const void *, report *), const void *arg)
{
    report *shared = malloc(sizeof(report));
    cr_assert_not_null(shared);
    int fds[2];
    cr_assert_eq(pipe(fds), 0);
    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) {
        close(fds[0]);
        report r;
        memset(&r, 0, sizeof(r));
        g_log[0] = '\0';
        fn(arg, &r);
        snprintf(r.log, sizeof(r.log), "%s", g_log);
        ssize_t w = write(fds[1], &r, sizeof(r));
        _exit(w == (ssize_t)sizeof(r) ? 0 : 9);
    }
    close(fds[1]);
    size_t got = 0;
    ssize_t n;
    while (got < sizeof(report) &&
           (n = read(fds[0], (char *)shared + got, sizeof(report) - got)) > 0)
        got += (size_t)n;
    close(fds[0]);
    int status = 0;
    waitpid(pid, &status, 0);
    cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0 &&
                  got == sizeof(report),
              "child failed (status %d)", status);
    report r = *shared;
    free(shared);
    return r;
}

static void plan_fn(const void *arg, report *r)
{
    plan_job(arg, r);
}

static void poison_fn(const void *arg, report *r)
{
    poison_job(arg, r);
}

/* In a child: the tuned problem's record in `path` made the persistent
 * 64 x 64 wgmma kernel (compiled for real: a correct kernel, so only a
 * crash or a wrong deal can fail it). A host that reads `path` as a system
 * database checks the plan on its first use on one batch element and two
 * heads: fewer work items than the plan's schedule was dealt for. */
static void persist_fn(const void *arg, report *out)
{
    replace_record(arg, "wgmma",
                   "{\"kind\":\"wgmma\",\"block_m\":64,\"block_n\":64,"
                   "\"warps\":8,\"stages\":2,\"overlap\":0,\"group\":0,"
                   "\"splits\":0,\"mods\":0,\"persist\":1}",
                   STOF_DTYPE_FP16, 0, "persistent", out);
}

static double verify_ms(const report *r)
{
    const char *v = strstr(r->js, "\"verify_ms\":");
    cr_assert_not_null(v, "%s", r->js);
    return atof(v + 12);
}

static void expect_source(const report *r, const char *source)
{
    char want[64];
    snprintf(want, sizeof(want), "\"source\":\"%s\"", source);
    cr_assert(strstr(r->js, want), "expected %s: %s\nlog:\n%s", source, r->js,
              r->log);
}

Test(gpu_trust, a_system_record_is_verified_once_then_trusted)
{
    job tune = {P("fleet.db"), NULL, STOF_TUNE_DEFAULT, STOF_LAYOUT_BHSD};
    report r0 = run(plan_fn, &tune);
    expect_source(&r0, "tuned");
    cr_assert_eq(verify_ms(&r0), 0.0, "a record tuned here is trusted");

    job use = {P("host.db"), P("fleet.db"), STOF_TUNE_DEFAULT,
               STOF_LAYOUT_BHSD};
    report r1 = run(plan_fn, &use);
    expect_source(&r1, "system db");
    cr_assert_gt(verify_ms(&r1), 0.0, "no verification at the first use");
    cr_assert_leq(r1.compiles, 1, "only the reference may compile: %ld",
                  r1.compiles);
    cr_assert(strstr(r1.log, "verified on this GPU"), "%s", r1.log);
    report r2 = run(plan_fn, &use);
    expect_source(&r2, "system db");
    cr_assert_eq(verify_ms(&r2), 0.0, "verified twice");
    cr_assert_eq(r2.compiles, 0);
    cr_log_info("first use of a system record: verified in %.1f ms "
                "(%ld compile); second use: %.1f ms",
                verify_ms(&r1), r1.compiles, verify_ms(&r2));
}

/* The same with score modifiers: the first-use check computes its
 * reference with the record's soft-cap and the plan's ALiBi slopes. */
Test(gpu_trust, a_system_record_with_score_modifiers_is_verified)
{
    g_mods = 1;
    job tune = {P("fleet-mods.db"), NULL, STOF_TUNE_DEFAULT,
                STOF_LAYOUT_BHSD};
    report r0 = run(plan_fn, &tune);
    expect_source(&r0, "tuned");
    job use = {P("host-mods.db"), P("fleet-mods.db"), STOF_TUNE_DEFAULT,
               STOF_LAYOUT_BHSD};
    report r1 = run(plan_fn, &use);
    expect_source(&r1, "system db");
    cr_assert_gt(verify_ms(&r1), 0.0, "no verification at the first use");
    cr_assert(strstr(r1.log, "verified on this GPU"), "%s", r1.log);
    cr_assert(strstr(r1.js, "\"ALIBI\""), "%s", r1.js);
    g_mods = 0;
}

Test(gpu_trust, a_wrong_kernel_is_never_used)
{
    job tune = {P("fleet.db"), NULL, STOF_TUNE_DEFAULT, STOF_LAYOUT_BHSD};
    expect_source((report[]){run(plan_fn, &tune)}, "tuned");
    report pr = run(poison_fn, P("fleet.db"));
    cr_log_info("%s", pr.js);

    /* From a system database: cache-only falls back, default tunes. */
    job co = {P("a.db"), P("fleet.db"), STOF_TUNE_CACHE_ONLY,
              STOF_LAYOUT_BHSD};
    report r1 = run(plan_fn, &co);
    expect_source(&r1, "fallback");
    cr_assert(strstr(r1.log, "failed verification"), "%s", r1.log);
    job def = {P("b.db"), P("fleet.db"), STOF_TUNE_DEFAULT, STOF_LAYOUT_BHSD};
    report r2 = run(plan_fn, &def);
    expect_source(&r2, "tuned");
    /* The new record in b.db shadows the system one from now on. */
    report r3 = run(plan_fn, &def);
    expect_source(&r3, "user db");
    cr_assert_eq(r3.compiles, 0);

    /* In the user database itself: deleted, then replaced by tuning. */
    job own = {P("fleet.db"), NULL, STOF_TUNE_DEFAULT, STOF_LAYOUT_BHSD};
    report r4 = run(plan_fn, &own);
    expect_source(&r4, "tuned");
    cr_assert(strstr(r4.log, "failed verification"), "%s", r4.log);
    report r5 = run(plan_fn, &own);
    expect_source(&r5, "user db");
    cr_assert_eq(verify_ms(&r5), 0.0);
}

/* The record's own kernel, compiled again and stored with another time:
 * a correct record whose content hash this host has never checked (as a
 * record imported from another host is). */
static void retime_fn(const void *arg, report *r)
{
    replace_record(arg, NULL, NULL, STOF_DTYPE_FP16, 1, "retimed", r);
}

/* plan_fn in a process whose first-use checks cannot run their reference
 * (as without memory for it). */
static void plan_no_reference_fn(const void *arg, report *r)
{
    stof__test_no_reference = 1;
    plan_job(arg, r);
}

/* A record in the user database that this host has not checked yet, whose
 * first-use check cannot run here for reasons not its own, is kept, not
 * deleted as a record that failed would be: the next plan checks it and
 * uses it. */
Test(gpu_trust, a_record_whose_check_cannot_run_is_kept)
{
    job tune = {P("host.db"), NULL, STOF_TUNE_DEFAULT, STOF_LAYOUT_BHSD};
    expect_source((report[]){run(plan_fn, &tune)}, "tuned");
    report rt = run(retime_fn, P("host.db"));
    cr_log_info("%s", rt.js);
    job use = {P("host.db"), NULL, STOF_TUNE_CACHE_ONLY, STOF_LAYOUT_BHSD};
    report r1 = run(plan_no_reference_fn, &use);
    expect_source(&r1, "fallback"); /* not used unchecked */
    cr_assert(strstr(r1.log, "could not be verified on this GPU") &&
                  strstr(r1.log, "kept"),
              "%s\n%s", r1.js, r1.log);
    cr_assert_null(strstr(r1.log, "failed verification"), "%s", r1.log);
    /* Default mode too: the model's plan, not a tune (that would need
     * more memory still); the record stays. */
    job def = {P("host.db"), NULL, STOF_TUNE_DEFAULT, STOF_LAYOUT_BHSD};
    report rd = run(plan_no_reference_fn, &def);
    expect_source(&rd, "fallback");
    cr_assert_lt(rd.compiles, 4, "tuned: %ld compiles", rd.compiles);
    report r2 = run(plan_fn, &use);
    expect_source(&r2, "user db");
    cr_assert_gt(verify_ms(&r2), 0.0, "not checked at its first use");
    cr_assert(strstr(r2.log, "verified on this GPU"), "%s", r2.log);
}

/* The first-use check of a persistent plan runs fewer work items than
 * the plan dealt its CTAs (one batch element, two heads): it must not
 * walk the plan's list (which named items past its launch: out-of-bounds
 * reads, an illegal address that poisoned the context). */
Test(gpu_trust, a_persistent_system_record_is_checked_on_fewer_items)
{
    job tune = {P("fleet.db"), NULL, STOF_TUNE_DEFAULT, STOF_LAYOUT_BHSD};
    expect_source((report[]){run(plan_fn, &tune)}, "tuned");
    report pr = run(persist_fn, P("fleet.db"));
    cr_assert(!strncmp(pr.js, "persistent ", 11), "%s", pr.js);
    job use = {P("host.db"), P("fleet.db"), STOF_TUNE_CACHE_ONLY,
               STOF_LAYOUT_BHSD};
    report r1 = run(plan_fn, &use);
    expect_source(&r1, "system db");
    cr_assert(strstr(r1.log, "verified on this GPU"), "%s", r1.log);
    cr_assert(strstr(r1.js, "\"PERSIST\":1"), "%s", r1.js);
}

Test(gpu_trust, every_layout_hits_the_same_record)
{
    job tune = {P("t.db"), NULL, STOF_TUNE_DEFAULT, STOF_LAYOUT_BHSD};
    report r0 = run(plan_fn, &tune);
    expect_source(&r0, "tuned");
    const stof_layout others[] = {STOF_LAYOUT_BSHD, STOF_LAYOUT_STRIDED};
    for (int i = 0; i < 2; i++) {
        job j = {P("t.db"), NULL, STOF_TUNE_DEFAULT, others[i]};
        report r = run(plan_fn, &j);
        expect_source(&r, "user db");
        cr_assert_eq(r.compiles, 0, "layout %d compiled %ld kernels",
                     (int)others[i], r.compiles);
    }
}

/* In a child: plan a small Transformer layer with the given databases. */
/* The layers planned: BERT-like (post-norm, biases), Llama-like (gated
 * SwiGLU, grouped-query, bias-free, RMSNorm, pre-norm), over a mask
 * family (its default instance), GPT-2-like in bf16 (pre-norm, tanh). */
enum { LAYER_BERT, LAYER_LLAMA, LAYER_FAMILY, LAYER_GPT2_BF16 };

/* A layer of batch x seq tokens, hidden, heads (a causal mask, or the
 * causal&docs family), planned through job j's databases; its description
 * in the report. */
static void layer_plan_job(const job *j, int batch, int seq, int hidden,
                           int heads, int kind, report *out)
{
    stof_settings s;
    stof_default_settings(&s);
    s.user_db = j->user_db;
    const char *sys[] = {j->system_db, NULL};
    s.system_dbs = j->system_db ? sys : NULL;
    s.tuning_mode = j->mode;
    s.require_device = 1;
    s.log_fn = logcb;
    s.log_level = STOF_LOG_INFO;
    stof_context *ctx = NULL;
    if (stof_open(&ctx, &s) != STOF_OK)
        _exit(3);
    stof_mask *m = NULL;
    stof_mask_family *fam = NULL;
    if (kind == LAYER_FAMILY
            ? stof_mask_family_create(ctx, "causal&docs", &fam) != STOF_OK
            : stof_mask_from_spec(ctx, "causal", seq, seq, &m) != STOF_OK)
        _exit(4);
    stof_layer_desc d;
    stof_layer_desc_init(&d, batch, seq, hidden, heads,
                         kind == LAYER_GPT2_BF16 ? STOF_DTYPE_BF16
                                                 : STOF_DTYPE_FP16);
    if (kind == LAYER_LLAMA) {
        d.act = STOF_ACT_SILU;
        d.gated = 1;
        d.ffn = 2 * hidden;
        d.kv_heads = heads / 2;
        d.no_bias = 1;
        d.norm = STOF_NORM_RMS;
        d.pre_norm = 1;
    } else if (kind == LAYER_GPT2_BF16) {
        d.pre_norm = 1;
    }
    stof_layer *L = NULL;
    long before = stof__jit_compile_count();
    if ((fam ? stof_layer_plan_family(ctx, &d, fam, NULL, &L)
             : stof_layer_plan(ctx, &d, m, &L)) != STOF_OK) {
        snprintf(out->js, sizeof(out->js), "plan failed: %s",
                 stof_errmsg(ctx));
        _exit(5);
    }
    out->compiles = stof__jit_compile_count() - before;
    stof_layer_describe(L, out->js, sizeof(out->js), NULL);
    stof_layer_free(&L);
    stof_mask_free(&m);
    stof_mask_family_free(&fam);
    stof_close(&ctx);
}

static void layer_fn(const void *arg, report *out)
{
    layer_plan_job(arg, 2, 128, 128, 2, LAYER_BERT, out);
}

static void llama_layer_fn(const void *arg, report *out)
{
    layer_plan_job(arg, 2, 128, 128, 2, LAYER_LLAMA, out);
}

static void family_layer_fn(const void *arg, report *out)
{
    layer_plan_job(arg, 2, 128, 128, 2, LAYER_FAMILY, out);
}

static void gpt2_bf16_layer_fn(const void *arg, report *out)
{
    layer_plan_job(arg, 2, 128, 128, 2, LAYER_GPT2_BF16, out);
}

/* BERT-base's layer at 8 x 512 tokens: its tuned scheme fuses the norms
 * into the GEMMs before them (H100). */
static void bert_layer_fn(const void *arg, report *out)
{
    layer_plan_job(arg, 8, 512, 768, 12, LAYER_BERT, out);
}

/* A layer tuned into a fleet database (name.db) is planned from it as a
 * system database: its kernels are verified at the first use on this
 * host, then trusted. */
static void layer_verified_once(void (*fn)(const void *, report *),
                                const char *name)
{
    char fleet[64], host[64];
    snprintf(fleet, sizeof(fleet), "%s-fleet.db", name);
    snprintf(host, sizeof(host), "%s-host.db", name);
    job tune = {P(fleet), NULL, STOF_TUNE_DEFAULT, STOF_LAYOUT_BHSD};
    report r0 = run(fn, &tune);
    expect_source(&r0, "tuned");
    job use = {P(host), P(fleet), STOF_TUNE_DEFAULT, STOF_LAYOUT_BHSD};
    report r1 = run(fn, &use);
    expect_source(&r1, "database");
    cr_assert_gt(verify_ms(&r1), 0.0, "%s", r1.js);
    report r2 = run(fn, &use);
    expect_source(&r2, "database");
    cr_assert_eq(verify_ms(&r2), 0.0, "%s", r2.js);
    cr_log_info("first use of a %s layer's records: verified in %.1f ms",
                name, verify_ms(&r1));
}

Test(gpu_trust, layer_kernels_are_verified_once_then_trusted)
{
    layer_verified_once(layer_fn, "bert");
}

/* A gated layer's first FFN GEMM may run fused with the gate (no
 * [tokens][2 ffn] buffer) or split. */
Test(gpu_trust, gated_layer_kernels_are_verified_once_then_trusted)
{
    layer_verified_once(llama_layer_fn, "llama");
}

Test(gpu_trust, family_layer_kernels_are_verified_once_then_trusted)
{
    layer_verified_once(family_layer_fn, "family");
}

Test(gpu_trust, bf16_layer_kernels_are_verified_once_then_trusted)
{
    layer_verified_once(gpt2_bf16_layer_fn, "gpt2-bf16");
}

/* layer_fn in a process whose first-use checks cannot run (as without
 * memory for them). */
static void layer_no_reference_fn(const void *arg, report *out)
{
    stof__test_no_reference = 1;
    layer_fn(arg, out);
}

/* As for attention records: a layer whose stored kernels this host could
 * not check for reasons not theirs runs the cost model's choice in every
 * mode (a tune would need more memory still), and the records stay, to
 * be checked and used by the next plan. */
Test(gpu_trust, layer_records_whose_check_cannot_run_are_kept)
{
    job tune = {P("lk-fleet.db"), NULL, STOF_TUNE_DEFAULT, STOF_LAYOUT_BHSD};
    report r0 = run(layer_fn, &tune);
    expect_source(&r0, "tuned");
    const stof_tuning_mode modes[] = {STOF_TUNE_CACHE_ONLY,
                                      STOF_TUNE_DEFAULT};
    for (int i = 0; i < 2; i++) {
        job use = {P("lk-host.db"), P("lk-fleet.db"), modes[i],
                   STOF_LAYOUT_BHSD};
        report r = run(layer_no_reference_fn, &use);
        expect_source(&r, "model");
        const char *w = strstr(r.log, "its stored kernels could not be "
                                      "verified");
        cr_assert(w && strstr(w, "not used this time, kept"),
                  "%s\n%s", r.js, r.log);
        cr_assert_null(strstr(r.log, "failed verification"), "%s", r.log);
        cr_assert_lt(r.compiles, r0.compiles, "tuned: %ld compiles (%ld "
                     "tuning)", r.compiles, r0.compiles);
    }
    job use = {P("lk-host.db"), P("lk-fleet.db"), STOF_TUNE_CACHE_ONLY,
               STOF_LAYOUT_BHSD};
    report r1 = run(layer_fn, &use);
    expect_source(&r1, "database");
    cr_assert_gt(verify_ms(&r1), 0.0, "not checked at its first use: %s",
                 r1.js);
}

/* The user database's Hopper GEMM records with a row norm, rewritten as
 * the same kernel with 64-column tiles: a valid configuration, compiled
 * for real, stored as verified and trusted here, whose row statistics
 * need more workspace than a layer plan allocates (at 4096 tokens it
 * holds its candidates' largest: their narrowest tiles have 128
 * columns). */
typedef struct {
    stof_context *ctx;
    stof_db_record r[16];
    int n;
} widen_set;

static int widen_collect(void *user, const stof_db_record *r)
{
    widen_set *w = user;
    stof_gemm_cfg c;
    stof_gemm_epi e;
    if (w->n < 16 && !strcmp(r->op, "gemm") && !strcmp(r->kernel, "gemm") &&
        stof__gemm_cfg_parse(r->config, &c, &e) && c.wgmma && e.norm &&
        c.block_n > 64) {
        w->r[w->n] = *r;
        w->r[w->n++].cubin = NULL;
    }
    return 0;
}

static int layer_collect(void *user, const stof_db_record *r)
{
    widen_set *w = user;
    if (w->n < 16 && !strcmp(r->op, "layer")) {
        w->r[w->n] = *r;
        w->r[w->n++].cubin = NULL;
    }
    return 0;
}

static void widen_fn(const void *arg, report *out)
{
    stof_context *ctx = open_with_db(arg);
    stof_db *db = stof__ctx_db(ctx);
    widen_set *w = calloc(1, sizeof(*w));
    if (!db || !w || stof__db_foreach(db, 0, widen_collect, w) != STOF_OK)
        _exit(4);
    int done = 0;
    for (int i = 0; i < w->n; i++) {
        stof_db_record *r = &w->r[i];
        stof_gemm_cfg c;
        stof_gemm_epi e;
        if (!stof__gemm_cfg_parse(r->config, &c, &e))
            _exit(5);
        c.block_n = 64;
        const stof_dtype dt = strcmp(r->dtype, "bf16") ? STOF_DTYPE_FP16
                                                       : STOF_DTYPE_BF16;
        if (stof__gemm_compile(ctx, dt, &c, &e, r->seq_q, NULL, &r->cubin,
                               &r->cubin_size) != STOF_OK)
            _exit(6);
        stof_str js = {0};
        stof__gemm_cfg_json(&c, &e, &js);
        if (!js.p || js.oom)
            _exit(7);
        snprintf(r->config, sizeof(r->config), "%s", js.p);
        stof__str_free(&js);
        if (stof__db_store(db, r, 1, 1) != STOF_OK)
            _exit(8);
        stof__db_record_clear(r);
        done++;
    }
    snprintf(out->js, sizeof(out->js), "{\"widened\":%d}", done);
    free(w);
    stof_close(&ctx);
}

Test(gpu_trust, a_layer_kernel_needing_more_workspace_is_not_used)
{
    job tune = {P("wide.db"), NULL, STOF_TUNE_DEFAULT, STOF_LAYOUT_BHSD};
    report r0 = run(bert_layer_fn, &tune);
    expect_source(&r0, "tuned");
    if (!strstr(r0.js, "\"fused\""))
        cr_skip_test("the tuned scheme runs no norm GEMM here: %s", r0.js);
    report w = run(widen_fn, P("wide.db"));
    cr_assert(strstr(w.js, "\"widened\":"), "%s", w.js);
    cr_assert(!strstr(w.js, "\"widened\":0}"),
              "no row-norm GEMM record to rewrite: %s\n%s", w.js, r0.js);
    /* Trusted, never verified again: only the workspace check keeps the
     * kernel from writing past the plan's workspace. The plan tunes that
     * kernel again. */
    report r1 = run(bert_layer_fn, &tune);
    expect_source(&r1, "tuned");
    cr_assert(strstr(r1.log, "cannot be used"), "%s", r1.log);
    /* The search's records replaced the unusable one (kept, it would send
     * every plan to a search): the next plan is a database hit. */
    report r2 = run(bert_layer_fn, &tune);
    expect_source(&r2, "database");
}

/* In a child: rewrite the layer record of the user database `path` to
 * name another junction for its attention side (a scheme whose kernels
 * were never stored), claiming 1e-4 ms, verified and trusted here. */
static void other_scheme_fn(const void *arg, report *out)
{
    stof_context *ctx = open_with_db(arg);
    stof_db *db = stof__ctx_db(ctx);
    widen_set *w = calloc(1, sizeof(*w));
    if (!db || !w || stof__db_foreach(db, 0, layer_collect, w) != STOF_OK ||
        w->n != 1)
        _exit(4);
    stof_db_record *r = &w->r[0];
    char *ja = strstr(r->config, "\"ja\":");
    if (!ja || ja[5] < '0' || ja[5] > '2')
        _exit(5);
    ja[5] = ja[5] == '0' ? '1' : '0';
    r->time_ms = 1e-4;
    if (stof__db_store(db, r, 1, 1) != STOF_OK)
        _exit(8);
    snprintf(out->js, sizeof(out->js), "{\"config\":%s}", r->config);
    free(w);
    stof_close(&ctx);
}

/* A layer record whose scheme's kernel records are missing sends the
 * plan to a search, whose layer record then replaces it although the
 * stored one claims to be faster: the plan after is a database hit. */
Test(gpu_trust, a_layer_record_missing_its_kernels_gives_way)
{
    job tune = {P("scheme.db"), NULL, STOF_TUNE_DEFAULT, STOF_LAYOUT_BHSD};
    report r0 = run(layer_fn, &tune);
    expect_source(&r0, "tuned");
    report w = run(other_scheme_fn, P("scheme.db"));
    cr_assert(strstr(w.js, "\"config\":"), "%s", w.js);
    report r1 = run(layer_fn, &tune);
    expect_source(&r1, "tuned");
    cr_assert(strstr(r1.log, "is missing"), "%s", r1.log);
    report r2 = run(layer_fn, &tune);
    expect_source(&r2, "database");
}

/* Criterion's main, after a probe that reports the suite skipped (exit 77)
 * when no GPU is usable. */
__attribute__((visibility("default"))) int main(int argc, char **argv)
{
    return tu_gpu_suite_main("gpu_trust", argc, argv);
}
