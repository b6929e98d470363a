/*
 * test_search.c - the search engine (tuner/search.c) with fake operations:
 * stage 1 keeps the top few of each kind (each tile shape's best first);
 * compile failures, wrong results and slow candidates never win; the
 * budget stops timing; the model's first choice is reported; several
 * operations share one compile pool and identical kernels are compiled
 * once; one operation failing leaves the others' results; model-only runs
 * compile the first choice and time nothing; near ties are timed again
 * (the finals), within a time budget; a candidate that needs no compile
 * (a library's algorithm) works.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <uv.h>

#include "search.h"
#include "testutil.h"

/* What the fake does for candidate id (ids start at 1). */
typedef struct fake_spec {
    int compile_fails, load_fails;
    double err;   /* verification error */
    double ms;    /* time */
    int kind;
    int no_art;   /* needs no compile */
    uint64_t key; /* shared-compile key (0: none) */
    double first_ms; /* the first timing, when nonzero (a noisy one) */
    uint64_t shape; /* tile shape key (op.shape: f_shape) */
    int time_fails_after; /* timings that succeed before each fails (0:
                             none fails) */
} fake_spec;

typedef struct fake {
    fake_spec spec[64];
    int n;        /* candidates: ids 1..n, in rank order */
    int compiles, loads, unloads, times, verifies;
    int timed[64];  /* timings per id */
    int loaded_now, max_loaded; /* handles loaded at once */
    int concurrent, max_concurrent;
    pthread_mutex_t mu;
    double time_sleep_s;
} fake;

static int f_kind(void *u, int i)
{
    return ((fake *)u)->spec[i + 1].kind;
}

static uint64_t f_shape(void *u, int i)
{
    return ((fake *)u)->spec[i + 1].shape;
}

static double f_model(void *u, int i)
{
    (void)u;
    return 0.1 * (i + 1);
}

static void f_describe(void *u, int i, char *buf, size_t n)
{
    (void)u;
    snprintf(buf, n, "fake %d", i + 1);
}

static int f_compile(void *u, int i, void **art, size_t *size, char *err,
                     size_t n)
{
    fake *f = u;
    const int id = i + 1;
    pthread_mutex_lock(&f->mu);
    f->compiles++;
    if (++f->concurrent > f->max_concurrent)
        f->max_concurrent = f->concurrent;
    pthread_mutex_unlock(&f->mu);
    usleep(20000); /* long enough for the pool to overlap jobs */
    pthread_mutex_lock(&f->mu);
    f->concurrent--;
    pthread_mutex_unlock(&f->mu);
    if (f->spec[id].compile_fails) {
        snprintf(err, n, "fake compile error for %d", id);
        return 1;
    }
    if (f->spec[id].no_art) {
        *art = NULL;
        *size = 0;
        return 0;
    }
    int *a = malloc(sizeof(int));
    *a = id;
    *art = a;
    *size = sizeof(int);
    return 0;
}

static uint64_t f_key(void *u, int i)
{
    return ((fake *)u)->spec[i + 1].key;
}

static int f_load(void *u, int i, const void *art, size_t size, void **h,
                  char *err, size_t n)
{
    fake *f = u;
    const int id = i + 1;
    f->loads++;
    if (f->spec[id].no_art) {
        cr_assert_null(art);
    } else {
        cr_assert_eq(size, sizeof(int));
        /* A shared compile hands out the first sharer's artifact (of
         * another operation: its id means nothing here). */
        const int got = *(const int *)art;
        cr_assert(got == id || f->spec[id].key,
                  "artifact mixed up: %d for %d", got, id);
    }
    if (f->spec[id].load_fails) {
        snprintf(err, n, "fake load error");
        return 1;
    }
    if (++f->loaded_now > f->max_loaded)
        f->max_loaded = f->loaded_now;
    *h = (void *)(intptr_t)id;
    return 0;
}

static int f_verify(void *u, void *h, double *rel, char *err, size_t n)
{
    fake *f = u;
    f->verifies++;
    *rel = f->spec[(intptr_t)h].err;
    (void)err, (void)n;
    return 0;
}

static int f_time(void *u, void *h, double *ms, char *err, size_t n)
{
    fake *f = u;
    f->times++;
    if (f->time_sleep_s > 0)
        usleep((useconds_t)(f->time_sleep_s * 1e6));
    const intptr_t id = (intptr_t)h;
    if (f->spec[id].time_fails_after &&
        f->timed[id] >= f->spec[id].time_fails_after) {
        f->timed[id]++;
        snprintf(err, n, "fake timing failure for %d", (int)id);
        return 1;
    }
    *ms = f->timed[id]++ == 0 && f->spec[id].first_ms > 0
              ? f->spec[id].first_ms
              : f->spec[id].ms;
    (void)err, (void)n;
    return 0;
}

static void f_unload(void *u, void *h)
{
    fake *f = u;
    (void)h;
    f->unloads++;
    f->loaded_now--;
}

static void fake_init(fake *f, int n)
{
    memset(f, 0, sizeof(*f));
    pthread_mutex_init(&f->mu, NULL);
    f->n = n;
    for (int i = 1; i <= n; i++)
        f->spec[i] = (fake_spec){0, 0, 1e-4, 1.0, 0, 0, 0, 0, 0, 0};
}

static stof_search_op op_of(fake *f, const char *name)
{
    stof_search_op op = {.user = f,
                         .name = name,
                         .n = f->n,
                         .kind = f_kind,
                         .model_ms = f_model,
                         .describe = f_describe,
                         .compile = f_compile,
                         .art_key = f_key,
                         .load = f_load,
                         .verify = f_verify,
                         .time = f_time,
                         .unload = f_unload,
                         .tolerance = 1e-2};
    return op;
}

static stof_context *ctx_new(void)
{
    stof_context *ctx = NULL;
    cr_assert_eq(stof_open(&ctx, NULL), STOF_OK);
    return ctx;
}

Test(search, stage1_keeps_top_k_of_each_kind_in_rank_order)
{
    fake f;
    fake_init(&f, 8);
    const int kinds[8] = {1, 1, 1, 2, 1, 2, 2, 3};
    for (int i = 0; i < 8; i++)
        f.spec[i + 1].kind = kinds[i];
    stof_search_op op = op_of(&f, "stage1");
    int out[8];
    int m = stof__search_select(&op, 2, out, 8);
    const int want[] = {0, 1, 3, 5, 7};
    cr_assert_eq(m, 5);
    for (int i = 0; i < m; i++)
        cr_assert_eq(out[i], want[i]);
    cr_assert_eq(stof__search_select(&op, 2, out, 3), 3);
}

/* The ids picked, as a string ("0 3 5"). */
static const char *picked(const int *out, int m)
{
    static char buf[128];
    buf[0] = '\0';
    for (int i = 0; i < m; i++)
        snprintf(buf + strlen(buf), sizeof(buf) - strlen(buf), "%s%d",
                 i ? " " : "", out[i]);
    return buf;
}

Test(search, stage1_takes_each_shape_s_best_before_a_second_variant)
{
    /* One kind; shapes A A A B A C B (say one tile's pipeline depths,
     * which the model ranks alike): the best of A, B and C first, then
     * the rank order; another kind keeps its own top_k. */
    fake f;
    fake_init(&f, 9);
    const uint64_t shapes[9] = {1, 1, 1, 2, 1, 3, 2, 7, 7};
    for (int i = 0; i < 9; i++) {
        f.spec[i + 1].kind = i < 7 ? 1 : 2;
        f.spec[i + 1].shape = shapes[i];
    }
    stof_search_op op = op_of(&f, "shapes");
    op.shape = f_shape;
    int out[9];
    int m = stof__search_select(&op, 3, out, 9);
    cr_expect_str_eq(picked(out, m), "0 3 5 7 8");
    m = stof__search_select(&op, 4, out, 9);
    cr_expect_str_eq(picked(out, m), "0 1 3 5 7 8");
    m = stof__search_select(&op, 1, out, 9);
    cr_expect_str_eq(picked(out, m), "0 7");
    /* max bounds the output, kept in rank order. */
    m = stof__search_select(&op, 3, out, 2);
    cr_expect_str_eq(picked(out, m), "0 3");
    /* Without op.shape: rank order. */
    op.shape = NULL;
    m = stof__search_select(&op, 3, out, 9);
    cr_expect_str_eq(picked(out, m), "0 1 2 7 8");
    /* stof__search_pick directly: keys, none, k past n. */
    m = stof__search_pick(7, 2, f_shape, &f, out);
    cr_expect_str_eq(picked(out, m), "0 3");
    m = stof__search_pick(7, 3, NULL, &f, out);
    cr_expect_str_eq(picked(out, m), "0 1 2");
    m = stof__search_pick(3, 5, f_shape, &f, out);
    cr_expect_str_eq(picked(out, m), "0 1 2");
    cr_expect_eq(stof__search_pick(0, 3, f_shape, &f, out), 0);
}

Test(search, fastest_verified_candidate_wins)
{
    stof_context *ctx = ctx_new();
    fake f;
    fake_init(&f, 7);
    /* 1: model's choice, ok but slow; 2: fastest but wrong; 3: does not
     * compile; 4: does not load; 5: ok, fast; 6: NaN; 7: ok, slower. */
    f.spec[1] = (fake_spec){0, 0, 1e-4, 2.0, 0, 0, 0, 0, 0, 0};
    f.spec[2] = (fake_spec){0, 0, 0.5, 0.1, 0, 0, 0, 0, 0, 0};
    f.spec[3] = (fake_spec){1, 0, 1e-4, 0.05, 0, 0, 0, 0, 0, 0};
    f.spec[4] = (fake_spec){0, 1, 1e-4, 0.05, 0, 0, 0, 0, 0, 0};
    f.spec[5] = (fake_spec){0, 0, 3e-3, 0.9, 0, 0, 0, 0, 0, 0};
    f.spec[6] = (fake_spec){0, 0, NAN, 0.01, 0, 0, 0, 0, 0, 0}; /* NaN: never */
    f.spec[7] = (fake_spec){0, 0, 1e-3, 1.0, 0, 0, 0, 0, 0, 0};
    stof_search_op op = op_of(&f, "fake");
    stof_search_opts o = {.top_k = 8, .threads = 4};
    stof_search_result res;
    cr_assert_eq(stof__search_run(ctx, &op, 1, &o, &res), STOF_OK, "%s",
                 stof_errmsg(ctx));
    cr_assert_eq(res.winner, 4, "winner %d", res.winner);
    cr_assert_float_eq(res.winner_ms, 0.9, 1e-12);
    cr_assert_float_eq(res.runner_up_ms, 1.0, 1e-12);
    cr_assert_float_eq(res.model_ms, 2.0, 1e-12);
    cr_assert_eq(res.n_timed, 3);
    cr_assert_eq(res.n_rejected, 2);
    cr_assert_eq(res.n_failed, 2);
    cr_assert_eq(f.compiles, 7);
    cr_assert_eq(f.loads, 6);
    cr_assert_eq(f.unloads, 5, "every loaded candidate is unloaded");
    cr_assert_not_null(res.winner_art);
    cr_assert_eq(*(int *)res.winner_art, 5);
    cr_assert_gt(f.max_concurrent, 1, "compiles did not run in parallel");
    stof__search_results_free(&res, 1);
    stof_close(&ctx);
}

Test(search, near_ties_are_decided_by_the_finals)
{
    stof_context *ctx = ctx_new();
    fake f;
    fake_init(&f, 5);
    /* 1 times 1.00; 2 is truly 0.98 but its first timing said 1.02 (a
     * near tie the first timings rank wrongly); 3 is 5% slower than 1 (not
     * a finalist); 4 is wrong; 5 first timed 1.01, truly 1.03. */
    f.spec[1].ms = 1.00;
    f.spec[2].ms = 0.98;
    f.spec[2].first_ms = 1.02;
    f.spec[3].ms = 1.05;
    f.spec[4] = (fake_spec){0, 0, 0.5, 0.5, 0, 0, 0, 0, 0, 0};
    f.spec[5].ms = 1.03;
    f.spec[5].first_ms = 1.01;
    stof_search_op op = op_of(&f, "finals");
    stof_search_opts o = {.top_k = 8, .threads = 2};
    stof_search_result res;
    cr_assert_eq(stof__search_run(ctx, &op, 1, &o, &res), STOF_OK, "%s",
                 stof_errmsg(ctx));
    cr_assert_eq(res.winner, 1, "winner %d", res.winner + 1);
    cr_assert_eq(res.n_finals, 3);
    cr_assert_float_eq(res.winner_ms, 0.98, 1e-12);
    cr_assert_float_eq(res.runner_up_ms, 1.00, 1e-12);
    cr_assert_eq(f.timed[3], 1, "3 was not within the margin");
    cr_assert_eq(f.timed[4], 0, "a wrong candidate is never timed");
    cr_assert_gt(f.timed[2], 3);
    cr_assert_eq(f.loads, f.unloads, "every finalist is unloaded");
    cr_assert_eq(f.max_loaded, 3, "the finalists are loaded together");
    stof__search_results_free(&res, 1);

    /* An exclusive operation (one candidate loaded at a time, like a
     * layer's GEMM slot): the finals load, time and unload each timing. */
    fake_init(&f, 3);
    f.spec[1].ms = 1.00;
    f.spec[2].ms = 0.98;
    f.spec[2].first_ms = 1.02;
    f.spec[3].ms = 1.01;
    op = op_of(&f, "exclusive");
    op.exclusive = 1;
    cr_assert_eq(stof__search_run(ctx, &op, 1, &o, &res), STOF_OK);
    cr_assert_eq(res.winner, 1, "winner %d", res.winner + 1);
    cr_assert_eq(res.n_finals, 3);
    cr_assert_eq(f.max_loaded, 1, "two candidates were loaded at once");
    cr_assert_eq(f.loads, f.unloads);
    cr_assert_eq(f.loads, 3 + 3 * 4, "a load for every timing");
    stof__search_results_free(&res, 1);

    /* Lucky first timings do not let an outsider win: 1 and 2 first timed
     * 0.96 / 0.97 (truly 1.00), 3 timed once at 0.999 (outside the 4%
     * margin, truly 1.06): the finals' medians compete only with each
     * other. */
    fake_init(&f, 3);
    f.spec[1].ms = 1.00;
    f.spec[1].first_ms = 0.96;
    f.spec[2].ms = 1.00;
    f.spec[2].first_ms = 0.97;
    f.spec[3].ms = 1.06;
    f.spec[3].first_ms = 0.999;
    op = op_of(&f, "outsider");
    cr_assert_eq(stof__search_run(ctx, &op, 1, &o, &res), STOF_OK);
    cr_assert(res.winner == 0 || res.winner == 1, "winner %d", res.winner + 1);
    cr_assert_eq(res.n_finals, 2);
    cr_assert_float_eq(res.winner_ms, 1.00, 1e-12);
    stof__search_results_free(&res, 1);
    /* Nor one left out of the finals (at most four are kept). */
    fake_init(&f, 5);
    const double first[5] = {0.980, 0.985, 0.986, 0.987, 0.990};
    for (int i = 0; i < 5; i++) {
        f.spec[i + 1].ms = i == 4 ? 1.10 : 1.00;
        f.spec[i + 1].first_ms = first[i];
    }
    op = op_of(&f, "left out");
    cr_assert_eq(stof__search_run(ctx, &op, 1, &o, &res), STOF_OK);
    cr_assert_neq(res.winner, 4, "the candidate left out of the finals won");
    cr_assert_eq(res.n_finals, 4);
    cr_assert_eq(f.timed[5], 1);
    stof__search_results_free(&res, 1);

    /* A clear winner has no finals. */
    fake_init(&f, 3);
    f.spec[1].ms = 1.0;
    f.spec[2].ms = 0.5;
    f.spec[3].ms = 0.8;
    op = op_of(&f, "clear");
    cr_assert_eq(stof__search_run(ctx, &op, 1, &o, &res), STOF_OK);
    cr_assert_eq(res.winner, 1);
    cr_assert_eq(res.n_finals, 0);
    cr_assert_eq(f.times, 3);
    stof__search_results_free(&res, 1);

    /* Slow timings (0.3 s each, two finalists): one round, not four. */
    fake_init(&f, 2);
    f.time_sleep_s = 0.3;
    f.spec[1].ms = 1.0;
    f.spec[2].ms = 0.99;
    op = op_of(&f, "slow");
    cr_assert_eq(stof__search_run(ctx, &op, 1, &o, &res), STOF_OK);
    cr_assert_eq(res.winner, 1);
    cr_assert_eq(res.n_finals, 2);
    cr_assert_eq(f.timed[1], 2);
    cr_assert_eq(f.timed[2], 2);
    stof__search_results_free(&res, 1);

    /* Finalists that all fail when timed again (a kernel faulting now and
     * then, or a context a fault broke): no winner, not the first
     * timings' best. */
    fake_init(&f, 2);
    f.spec[1].ms = 1.0;
    f.spec[2].ms = 0.99;
    f.spec[1].time_fails_after = f.spec[2].time_fails_after = 1;
    op = op_of(&f, "finals fail");
    cr_assert_neq(stof__search_run(ctx, &op, 1, &o, &res), STOF_OK);
    cr_assert_eq(res.winner, -1, "winner %d", res.winner + 1);
    cr_assert_null(res.winner_art);
    stof__search_results_free(&res, 1);
    /* One finalist still runs: it wins. */
    fake_init(&f, 2);
    f.spec[1].ms = 1.0;
    f.spec[2].ms = 0.99;
    f.spec[2].time_fails_after = 1;
    op = op_of(&f, "one finalist fails");
    cr_assert_eq(stof__search_run(ctx, &op, 1, &o, &res), STOF_OK);
    cr_assert_eq(res.winner, 0, "winner %d", res.winner + 1);
    stof__search_results_free(&res, 1);
    stof_close(&ctx);
}

Test(search, nothing_verified_is_an_error)
{
    stof_context *ctx = ctx_new();
    fake f;
    fake_init(&f, 2);
    f.spec[1] = (fake_spec){0, 0, 0.2, 1.0, 0, 0, 0, 0, 0, 0};
    f.spec[2] = (fake_spec){1, 0, 0.0, 1.0, 0, 0, 0, 0, 0, 0};
    stof_search_op op = op_of(&f, "fake");
    stof_search_opts o = {.top_k = 2, .threads = 2};
    stof_search_result res;
    cr_assert_eq(stof__search_run(ctx, &op, 1, &o, &res), STOF_ERR_VERIFY);
    cr_assert(strstr(stof_errmsg(ctx), "1 failed, 1 rejected"), "%s",
              stof_errmsg(ctx));
    cr_assert_eq(res.winner, -1);
    cr_assert_null(res.winner_art);
    stof_close(&ctx);
}

Test(search, budget_stops_timing_but_one_is_always_timed)
{
    stof_context *ctx = ctx_new();
    fake f;
    fake_init(&f, 6);
    f.time_sleep_s = 0.2;
    for (int i = 0; i < 6; i++)
        f.spec[i + 1].ms = 1.0 - 0.1 * i;
    stof_search_op op = op_of(&f, "fake");
    stof_search_opts o = {.top_k = 6, .threads = 2, .budget_s = 0.05};
    stof_search_result res;
    cr_assert_eq(stof__search_run(ctx, &op, 1, &o, &res), STOF_OK);
    cr_assert_eq(res.n_timed, 1, "timed %d", res.n_timed);
    cr_assert_eq(res.winner, 0);
    stof__search_results_free(&res, 1);
    stof_close(&ctx);
}

Test(search, deterministic_for_the_same_inputs)
{
    stof_context *ctx = ctx_new();
    for (int rep = 0; rep < 3; rep++) {
        fake f;
        fake_init(&f, 5);
        /* Two candidates tie: the earlier (better ranked) one wins. */
        for (int i = 0; i < 5; i++)
            f.spec[i + 1].ms = i == 1 || i == 3 ? 0.5 : 1.0;
        stof_search_op op = op_of(&f, "fake");
        stof_search_opts o = {.top_k = 5, .threads = 3};
        stof_search_result res;
        cr_assert_eq(stof__search_run(ctx, &op, 1, &o, &res), STOF_OK);
        cr_assert_eq(res.winner, 1);
        stof__search_results_free(&res, 1);
    }
    stof_close(&ctx);
}

Test(search, operations_share_one_pool_and_identical_kernels)
{
    stof_context *ctx = ctx_new();
    fake a, b, c;
    fake_init(&a, 3);
    fake_init(&b, 3);
    fake_init(&c, 2);
    /* a's 2nd and b's 1st are the same kernel; c fails entirely. */
    a.spec[2].key = 77;
    b.spec[1].key = 77;
    a.spec[2].ms = 0.2;
    b.spec[3].ms = 0.3;
    c.spec[1].compile_fails = 1;
    c.spec[2].err = 1.0;
    stof_search_op ops[3] = {op_of(&a, "a"), op_of(&b, "b"), op_of(&c, "c")};
    stof_search_opts o = {.top_k = 8, .threads = 4};
    stof_search_result res[3];
    cr_assert_eq(stof__search_run(ctx, ops, 3, &o, res), STOF_ERR_VERIFY);
    cr_assert(strstr(stof_errmsg(ctx), "search c"), "%s", stof_errmsg(ctx));
    cr_assert_eq(a.compiles + b.compiles, 5, "a shared kernel compiled twice");
    cr_assert_eq(res[0].winner, 1);
    cr_assert_eq(res[1].winner, 2);
    cr_assert_eq(res[2].winner, -1, "the failing operation has no winner");
    cr_assert_eq(*(int *)res[0].winner_art, 2);
    stof__search_results_free(res, 3);
    stof_close(&ctx);
}

/* compile_threads counts for every search of a process: at most `threads`
 * compiles run at once. */
Test(search, each_search_keeps_to_its_own_thread_count)
{
    stof_context *ctx = ctx_new();
    const int threads[3] = {4, 1, 2};
    for (int r = 0; r < 3; r++) {
        fake f;
        fake_init(&f, 8);
        stof_search_op op = op_of(&f, "fake");
        stof_search_opts o = {.top_k = 8, .threads = threads[r]};
        stof_search_result res;
        cr_assert_eq(stof__search_run(ctx, &op, 1, &o, &res), STOF_OK, "%s",
                     stof_errmsg(ctx));
        cr_assert_eq(f.compiles, 8);
        cr_assert_leq(f.max_concurrent, threads[r],
                      "search %d: %d compiles at once with threads = %d", r,
                      f.max_concurrent, threads[r]);
        if (threads[r] > 1)
            cr_assert_gt(f.max_concurrent, 1, "search %d: no overlap", r);
        stof__search_results_free(&res, 1);
    }
    stof_close(&ctx);
}

/* Searches started from libuv's own pool threads, as many as the pool
 * has (a host that plans inside uv_queue_work): their compiles do not
 * wait for that pool (they did, forever). */
typedef struct pool_plan {
    uv_work_t req;
    stof_context *ctx;
    fake f;
    int rc;
} pool_plan;

static void plan_on_pool(uv_work_t *req)
{
    pool_plan *p = req->data;
    stof_search_op op = op_of(&p->f, "fake");
    stof_search_opts o = {.top_k = 8, .threads = 2};
    stof_search_result res;
    p->rc = stof__search_run(p->ctx, &op, 1, &o, &res);
    if (p->rc == STOF_OK)
        stof__search_results_free(&res, 1);
}

Test(search, searches_from_a_full_libuv_pool_finish, .timeout = 30)
{
    setenv("UV_THREADPOOL_SIZE", "2", 1); /* (this test's own process) */
    uv_loop_t loop;
    cr_assert_eq(uv_loop_init(&loop), 0);
    pool_plan p[2];
    for (int i = 0; i < 2; i++) {
        memset(&p[i], 0, sizeof(p[i]));
        p[i].ctx = ctx_new();
        fake_init(&p[i].f, 8);
        p[i].rc = -1;
        p[i].req.data = &p[i];
        cr_assert_eq(uv_queue_work(&loop, &p[i].req, plan_on_pool, NULL), 0);
    }
    uv_run(&loop, UV_RUN_DEFAULT);
    uv_loop_close(&loop);
    for (int i = 0; i < 2; i++) {
        cr_expect_eq(p[i].rc, STOF_OK);
        cr_expect_eq(p[i].f.compiles, 8);
        stof_close(&p[i].ctx);
    }
}

Test(search, model_only_compiles_the_first_choice_and_times_nothing)
{
    stof_context *ctx = ctx_new();
    fake f;
    fake_init(&f, 4);
    stof_search_op op = op_of(&f, "fake");
    stof_search_opts o = {.top_k = 4, .threads = 2, .model_only = 1};
    stof_search_result res;
    cr_assert_eq(stof__search_run(ctx, &op, 1, &o, &res), STOF_OK);
    cr_assert_eq(res.winner, 0);
    cr_assert_eq(f.compiles, 1);
    cr_assert_eq(f.loads + f.verifies + f.times, 0);
    cr_assert_eq(res.winner_ms, 0.0);
    stof__search_results_free(&res, 1);
    stof_close(&ctx);
}

Test(search, a_candidate_without_compile_can_win)
{
    stof_context *ctx = ctx_new();
    fake f;
    fake_init(&f, 3);
    f.spec[3].no_art = 1; /* a library's algorithm */
    f.spec[3].kind = 1;
    f.spec[3].ms = 0.1;
    stof_search_op op = op_of(&f, "fake");
    stof_search_opts o = {.top_k = 4, .threads = 2};
    stof_search_result res;
    cr_assert_eq(stof__search_run(ctx, &op, 1, &o, &res), STOF_OK);
    cr_assert_eq(res.winner, 2);
    cr_assert_null(res.winner_art);
    stof__search_results_free(&res, 1);
    stof_close(&ctx);
}
