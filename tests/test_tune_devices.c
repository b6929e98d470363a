/*
 * test_tune_devices.c - the worker pool of `stof-tune tune --devices`
 * (tools/tune_devices.c) on the CPU: workers open their contexts through
 * a stand-in for stof_open, so the pool's own behaviour is tested without
 * GPUs: every problem is planned exactly once, the work is shared, a
 * worker that dies fails only the problem it was on, and workers that
 * cannot open their device say why.
 */
#include <criterion/criterion.h>

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "internal.h"
#include "tune_cli.h"
#include "tune_devices.h"

/* Devices numbered 90 and up "do not exist"; 80 crashes its opener. */
static stof_status fake_open(stof_context **out, const stof_settings *s)
{
    if (s->device == 80)
        raise(SIGKILL);
    stof_status st = stof__open_cpu(out, s);
    if (st == STOF_OK && s->device >= 90)
        return stof__fail(*out, STOF_ERR_NO_DEVICE, "device %d is not there",
                          s->device);
    return st;
}

/* Planning problem i: takes a little time, says who did it; problem
 * `die_at` kills its worker. */
typedef struct job {
    int die_at;
} job;

static int fake_plan(void *user, stof_context *ctx, int i, tune_row *r)
{
    const job *j = user;
    (void)ctx;
    snprintf(r->problem, sizeof(r->problem), "problem %d", i);
    if (i == j->die_at)
        raise(SIGKILL);
    struct timespec t = {0, 2 * 1000 * 1000};
    nanosleep(&t, NULL);
    snprintf(r->kernel, sizeof(r->kernel), "%ld", (long)getpid());
    r->ok = 1;
    return 0;
}

static stof_settings settings(void)
{
    stof_settings s;
    stof_default_settings(&s);
    s.user_db = "";
    return s;
}

Test(devices, every_problem_is_planned_once_and_the_work_is_shared)
{
    enum { N = 60 };
    tune_row rows[N];
    memset(rows, 0, sizeof(rows));
    const int ords[3] = {0, 1, 2};
    job j = {-1};
    stof_settings s = settings();
    cr_assert_eq(td_run_with(&s, ords, 3, N, fake_plan, &j, rows, 1,
                             fake_open),
                 EXIT_OK);
    char pids[3][32] = {"", "", ""};
    int n_pids = 0;
    for (int i = 0; i < N; i++) {
        char want[32];
        snprintf(want, sizeof(want), "problem %d", i);
        cr_assert(rows[i].ok, "problem %d: %s", i, rows[i].error);
        cr_assert_str_eq(rows[i].problem, want);
        cr_assert(rows[i].device >= 0 && rows[i].device <= 2);
        int seen = 0;
        for (int k = 0; k < n_pids; k++)
            seen |= !strcmp(pids[k], rows[i].kernel);
        if (!seen && n_pids < 3)
            snprintf(pids[n_pids++], sizeof(pids[0]), "%s", rows[i].kernel);
    }
    cr_assert_geq(n_pids, 2, "one worker did everything");
}

Test(devices, a_worker_that_dies_fails_only_its_problem)
{
    enum { N = 40 };
    tune_row rows[N];
    memset(rows, 0, sizeof(rows));
    const int ords[2] = {0, 1};
    job j = {7};
    stof_settings s = settings();
    cr_assert_eq(td_run_with(&s, ords, 2, N, fake_plan, &j, rows, 1,
                             fake_open),
                 EXIT_OK);
    for (int i = 0; i < N; i++) {
        if (i == 7) {
            cr_assert(!rows[i].ok);
            cr_assert(strstr(rows[i].error, "died (signal 9)"), "%s",
                      rows[i].error);
            /* the name it was given before the worker died */
            cr_assert_str_eq(rows[i].problem, "problem 7");
            continue;
        }
        cr_assert(rows[i].ok, "problem %d: %s", i, rows[i].error);
    }
}

Test(devices, workers_that_cannot_open_their_device_say_why)
{
    enum { N = 10 };
    tune_row rows[N];
    memset(rows, 0, sizeof(rows));
    job j = {-1};
    stof_settings s = settings();
    /* One missing device: the other does everything. */
    const int some[2] = {0, 95};
    cr_assert_eq(td_run_with(&s, some, 2, N, fake_plan, &j, rows, 1,
                             fake_open),
                 EXIT_OK);
    for (int i = 0; i < N; i++) {
        cr_assert(rows[i].ok, "problem %d: %s", i, rows[i].error);
        cr_assert_eq(rows[i].device, 0);
    }
    /* None: the run fails with the exit code of "no GPU". */
    memset(rows, 0, sizeof(rows));
    const int none[2] = {91, 92};
    cr_assert_eq(td_run_with(&s, none, 2, N, fake_plan, &j, rows, 1,
                             fake_open),
                 EXIT_NO_GPU);
    for (int i = 0; i < N; i++)
        cr_assert(!rows[i].ok && strstr(rows[i].error, "no worker"), "%s",
                  rows[i].error);
    /* Workers that die while opening their device are not taken as
     * opened: the run fails, and a live one still does the work. */
    memset(rows, 0, sizeof(rows));
    const int crash[2] = {80, 81};
    cr_assert_eq(td_run_with(&s, crash, 2, N, fake_plan, &j, rows, 1,
                             fake_open),
                 EXIT_OK);
    for (int i = 0; i < N; i++)
        cr_assert(rows[i].ok && rows[i].device == 81, "problem %d: %s", i,
                  rows[i].error);
    memset(rows, 0, sizeof(rows));
    const int two_crash[2] = {80, 80};
    cr_assert_eq(td_run_with(&s, two_crash, 2, N, fake_plan, &j, rows, 1,
                             fake_open),
                 EXIT_FAIL);
}
