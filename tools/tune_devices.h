/*
 * tune_devices.h - running the problems of `stof-tune tune` / `pending` on
 * one GPU or on several: one worker process per GPU, each taking the next
 * problem until none is left, all writing into one tuning database (which
 * takes concurrent writers).
 */
#ifndef STOF_TUNE_DEVICES_H
#define STOF_TUNE_DEVICES_H

#include <stddef.h>

#include "stof.h"

#define TD_MAX_DEVICES 64

/* One line of the summary table. Rows live in memory shared with the
 * worker processes, so every field has a fixed size. */
typedef struct tune_row {
    char problem[192];
    char kernel[32], source[32], key[33];
    char params[256];     /* the kernel's parameters as compact JSON text
                             ("" when unknown or too long) */
    double time_ms, model_ms, plan_s;
    int device;           /* the GPU ordinal that planned it */
    int ok;
    int skipped;          /* not tuned, on purpose (error says why) */
    char error[256];
} tune_row;

/* Plan problem i on ctx's GPU and fill row (problem name, result or
 * error). Returns 0 on success, nonzero when the problem failed. Called in
 * the worker processes. */
typedef int (*td_problem_fn)(void *user, stof_context *ctx, int i,
                             tune_row *row);

/* Read --devices: NULL means GPU 0; "all" every GPU of the host; else a
 * list of distinct ordinals such as "0,1". The device count is read in a
 * short-lived child process, so that this process never initialises CUDA
 * (its workers are forked). Returns the number of devices written to ords,
 * or 0 with a message in msg and the exit code in *rc. */
int td_devices(const char *spec, int *ords, int max, char *msg, size_t n,
               int *rc);

/* Whether --devices' value is well formed (no GPU is looked at); else 0
 * with a message in msg. */
int td_devices_syntax(const char *spec, char *msg, size_t n);

/* Run problems 0..n-1 on the devices: on one device in this process, on
 * several in one forked worker per device that takes the next problem
 * until none is left. A worker that dies fails the problem it was on and
 * the others go on. Progress goes to stderr (quiet: none). Fills rows
 * (the name of problem i is rows[i].problem as the worker set it).
 * Returns EXIT_OK-style 0 when every worker could open its GPU (failed
 * problems are in rows), else the exit code of the failure to open (every
 * worker failed). */
int td_run(const stof_settings *s, const int *ords, int n_dev, int n,
           td_problem_fn fn, void *user, tune_row *rows, int quiet);

/* The same with the workers' contexts opened by open_fn (settings with
 * the worker's device) instead of stof_open: tests run the pool on the
 * CPU. */
typedef stof_status (*td_open_fn)(stof_context **out, const stof_settings *s);
int td_run_with(const stof_settings *s, const int *ords, int n_dev, int n,
                td_problem_fn fn, void *user, tune_row *rows, int quiet,
                td_open_fn open_fn);

#endif
