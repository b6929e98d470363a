/*
 * tune_verify.h - `stof-tune verify`: re-check the records of a database
 * that were made for this GPU, driver and build.
 */
#ifndef STOF_TUNE_VERIFY_H
#define STOF_TUNE_VERIFY_H

#include "stof.h"

/* Opens a GPU context with the given settings, or prints "no GPU found"
 * and returns the exit code for it. */
typedef int (*tv_open_gpu_fn)(const stof_settings *s, stof_context **out);

/* Verify the records of path (already checked to be a stof database).
 * drop: delete the bad ones. Returns the exit code (0 ok, 1 bad records
 * left, 3 no GPU, 4 database error). */
int tv_verify(stof_context *cpu, const char *path, int drop, int json,
              tv_open_gpu_fn open_gpu);

#endif
