/*
 * test_search.c - stage 1 selection and stage 2 of the search with a fake
 * backend: compile failures, wrong results and slow candidates must never
 * win; the budget stops timing; the model's first choice is reported.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "search.h"
#include "testutil.h"

/* Per candidate (by cfg.block_m used as an id): what the fake does. */
typedef struct fake_spec {
    int compile_fails, load_fails;
    double err;   /* verification error */
    double ms;    /* time */
} fake_spec;

typedef struct fake {
    fake_spec spec[64];
    int compiles, loads, unloads, times;
    int concurrent, max_concurrent;
    pthread_mutex_t mu;
    double time_sleep_s;
} fake;

static int f_compile(void *u, const stof_candidate *c, void **art,
                     size_t *size, char *err, size_t n)
{
    fake *f = u;
    pthread_mutex_lock(&f->mu);
    f->compiles++;
    if (++f->concurrent > f->max_concurrent)
        f->max_concurrent = f->concurrent;
    pthread_mutex_unlock(&f->mu);
    usleep(20000); /* long enough for the pool to overlap jobs */
    pthread_mutex_lock(&f->mu);
    f->concurrent--;
    pthread_mutex_unlock(&f->mu);
    int id = c->cfg.block_m;
    if (f->spec[id].compile_fails) {
        snprintf(err, n, "fake compile error for %d", id);
        return 1;
    }
    int *a = malloc(sizeof(int));
    *a = id;
    *art = a;
    *size = sizeof(int);
    return 0;
}

static int f_load(void *u, const stof_candidate *c, const void *art,
                  size_t size, void **h, char *err, size_t n)
{
    fake *f = u;
    f->loads++;
    cr_assert_eq(size, sizeof(int));
    cr_assert_eq(*(const int *)art, c->cfg.block_m, "artifact mixed up");
    if (f->spec[c->cfg.block_m].load_fails) {
        snprintf(err, n, "fake load error");
        return 1;
    }
    *h = (void *)(intptr_t)c->cfg.block_m;
    return 0;
}

static int f_verify(void *u, void *h, double *rel, char *err, size_t n)
{
    fake *f = u;
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
    *ms = f->spec[(intptr_t)h].ms;
    (void)err, (void)n;
    return 0;
}

static void f_unload(void *u, void *h)
{
    fake *f = u;
    (void)h;
    f->unloads++;
}

static stof_candidate cand(int id, int kind, double pred)
{
    stof_candidate c;
    memset(&c, 0, sizeof(c));
    c.kind = kind;
    c.cfg.block_m = id;
    c.predicted_ms = pred;
    return c;
}

static stof_search_backend backend(fake *f)
{
    stof_search_backend b = {f, f_compile, f_load, f_verify, f_time, f_unload};
    return b;
}

Test(search, stage1_keeps_top_k_of_each_kind_in_rank_order)
{
    stof_candidate r[] = {
        cand(1, STOF_KERNEL_BLOCK, 1.0),   cand(2, STOF_KERNEL_BLOCK, 1.1),
        cand(3, STOF_KERNEL_BLOCK, 1.2),   cand(4, STOF_KERNEL_ROWWISE, 1.3),
        cand(5, STOF_KERNEL_BLOCK, 1.4),   cand(6, STOF_KERNEL_ROWWISE, 1.5),
        cand(7, STOF_KERNEL_ROWWISE, 1.6), cand(8, STOF_KERNEL_WGMMA, 9.0),
    };
    stof_candidate out[8];
    int m = stof__search_select(r, 8, 2, out, 8);
    int want[] = {1, 2, 4, 6, 8};
    cr_assert_eq(m, 5);
    for (int i = 0; i < m; i++)
        cr_assert_eq(out[i].cfg.block_m, want[i]);
    cr_assert_eq(stof__search_select(r, 8, 2, out, 3), 3);
}

Test(search, fastest_verified_candidate_wins)
{
    stof_context *ctx = NULL;
    cr_assert_eq(stof_open(&ctx, NULL), STOF_OK);
    fake f;
    memset(&f, 0, sizeof(f));
    pthread_mutex_init(&f.mu, NULL);
    /* 1: model's choice, ok but slow; 2: fastest but wrong; 3: does not
     * compile; 4: does not load; 5: ok, fast; 6: ok, a bit slower. */
    f.spec[1] = (fake_spec){0, 0, 1e-4, 2.0};
    f.spec[2] = (fake_spec){0, 0, 0.5, 0.1};
    f.spec[3] = (fake_spec){1, 0, 1e-4, 0.05};
    f.spec[4] = (fake_spec){0, 1, 1e-4, 0.05};
    f.spec[5] = (fake_spec){0, 0, 3e-3, 0.9};
    f.spec[6] = (fake_spec){0, 0, NAN, 0.01}; /* NaN never passes */
    f.spec[7] = (fake_spec){0, 0, 1e-3, 1.0};
    stof_candidate sel[7];
    for (int i = 0; i < 7; i++)
        sel[i] = cand(i + 1, STOF_KERNEL_BLOCK, 0.1 * (i + 1));
    stof_search_backend b = backend(&f);
    stof_search_opts o = {.top_k = 8, .threads = 4, .budget_s = 0,
                          .tolerance = 1e-2};
    stof_search_result res;
    cr_assert_eq(stof__search_run(ctx, sel, 7, &o, &b, &res), STOF_OK, "%s",
                 stof_errmsg(ctx));
    cr_assert_eq(res.winner.cfg.block_m, 5);
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
    free(res.winner_art);
    stof_close(&ctx);
}

Test(search, nothing_verified_is_an_error)
{
    stof_context *ctx = NULL;
    cr_assert_eq(stof_open(&ctx, NULL), STOF_OK);
    fake f;
    memset(&f, 0, sizeof(f));
    pthread_mutex_init(&f.mu, NULL);
    f.spec[1] = (fake_spec){0, 0, 0.2, 1.0};
    f.spec[2] = (fake_spec){1, 0, 0.0, 1.0};
    stof_candidate sel[2] = {cand(1, STOF_KERNEL_BLOCK, 1),
                             cand(2, STOF_KERNEL_BLOCK, 2)};
    stof_search_backend b = backend(&f);
    stof_search_opts o = {.top_k = 2, .threads = 2, .tolerance = 1e-2};
    stof_search_result res;
    cr_assert_eq(stof__search_run(ctx, sel, 2, &o, &b, &res), STOF_ERR_VERIFY);
    cr_assert(strstr(stof_errmsg(ctx), "1 failed, 1 rejected"), "%s",
              stof_errmsg(ctx));
    cr_assert_null(res.winner_art);
    stof_close(&ctx);
}

Test(search, budget_stops_timing_but_one_is_always_timed)
{
    stof_context *ctx = NULL;
    cr_assert_eq(stof_open(&ctx, NULL), STOF_OK);
    fake f;
    memset(&f, 0, sizeof(f));
    pthread_mutex_init(&f.mu, NULL);
    f.time_sleep_s = 0.2;
    stof_candidate sel[6];
    for (int i = 0; i < 6; i++) {
        f.spec[i + 1] = (fake_spec){0, 0, 1e-4, 1.0 - 0.1 * i};
        sel[i] = cand(i + 1, STOF_KERNEL_BLOCK, i);
    }
    stof_search_backend b = backend(&f);
    stof_search_opts o = {.top_k = 6, .threads = 2, .budget_s = 0.05,
                          .tolerance = 1e-2};
    stof_search_result res;
    cr_assert_eq(stof__search_run(ctx, sel, 6, &o, &b, &res), STOF_OK);
    cr_assert_eq(res.n_timed, 1, "timed %d", res.n_timed);
    cr_assert_eq(res.winner.cfg.block_m, 1);
    free(res.winner_art);
    stof_close(&ctx);
}

Test(search, deterministic_for_the_same_inputs)
{
    stof_context *ctx = NULL;
    cr_assert_eq(stof_open(&ctx, NULL), STOF_OK);
    int first = -1;
    for (int rep = 0; rep < 3; rep++) {
        fake f;
        memset(&f, 0, sizeof(f));
        pthread_mutex_init(&f.mu, NULL);
        stof_candidate sel[5];
        for (int i = 0; i < 5; i++) {
            /* Two candidates tie: the earlier (better ranked) one wins. */
            f.spec[i + 1] = (fake_spec){0, 0, 1e-4, i == 1 || i == 3 ? 0.5 : 1.0};
            sel[i] = cand(i + 1, STOF_KERNEL_BLOCK, i);
        }
        stof_search_backend b = backend(&f);
        stof_search_opts o = {.top_k = 5, .threads = 3, .tolerance = 1e-2};
        stof_search_result res;
        cr_assert_eq(stof__search_run(ctx, sel, 5, &o, &b, &res), STOF_OK);
        if (first < 0)
            first = res.winner.cfg.block_m;
        cr_assert_eq(res.winner.cfg.block_m, first);
        cr_assert_eq(first, 2);
        free(res.winner_art);
    }
    stof_close(&ctx);
}
