/*
 * tune_cli.h - what the stof-tune commands share: the parsed options, exit
 * codes and how statuses map onto them, one-line errors, printing a --json
 * document and reading plan descriptions (jansson), the database a command
 * works on, and contexts (a CPU one that never touches CUDA, so that GPU
 * workers can be forked from the process; a GPU one per device).
 */
#ifndef STOF_TUNE_CLI_H
#define STOF_TUNE_CLI_H

#include <stddef.h>

#include <jansson.h>

#include "stof.h"

#define PROG "stof-tune"

enum {
    EXIT_OK = 0,
    EXIT_FAIL = 1,  /* a bad input file, a problem or record failed */
    EXIT_USAGE = 2, /* bad arguments or settings */
    EXIT_NO_GPU = 3,
    EXIT_DB = 4     /* a database could not be read or written */
};

#define OPT_MAX_LIST 64

typedef struct opts {
    const char *cmd;
    const char *db, *out, *gpu, *devices;
    int driver;
    const char *masks[OPT_MAX_LIST];
    int n_masks;
    const char *shapes[OPT_MAX_LIST];
    int n_shapes;
    const char *layers[OPT_MAX_LIST]; /* tune --layer, --tokens */
    int n_layers;
    const char *tokens[OPT_MAX_LIST];
    int n_tokens;
    const char *dtype, *layout;
    const char *png, *tile; /* show-mask */
    int pixels;             /* show-mask: 0 = the default */
    double budget;
    int json, force, dry_run, drop, drop_invalid, help, version;
    const char *pos[256];
    int n_pos;
} opts;

/* The first error line of the run (err), and whether a JSON document went
 * to stdout (print_json): a --json command that fails before printing one
 * prints {"error": ..., "exit": ...} instead (stof_tune.c). */
extern char g_first_err[1024];
extern int g_json_printed;

/* Whether ctx's GPU still works after a failure (its context synchronises
 * without error; a kernel fault leaves it unusable), else 0 with the
 * error in msg. 1 for a context without a device. */
int gpu_alive(stof_context *ctx, char *msg, size_t n);

/* One line on stderr, "stof-tune: ...", with everything in it escaped for
 * the terminal. */
void err(const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 1, 2)))
#endif
    ;

/* The exit code for a failed status (EXIT_OK for STOF_OK). */
int exit_for(stof_status st);

/* Print the failure recorded on ctx ("database error: ...") and return
 * its exit code. */
int fail_with(stof_context *ctx, stof_status st);

/* Print doc, a command's whole --json output, on stdout as one line
 * (tt_json_write) and release it. Returns EXIT_OK, or EXIT_FAIL after an
 * error line when doc is NULL: building it ran out of memory. */
int print_json(json_t *doc);

/* The description of plan (stof_plan_describe) as a JSON object, to be
 * released with json_decref; NULL when it cannot be had or read. */
json_t *plan_description(const stof_plan *plan);

/* The database a command works on: --db, else the default user path (into
 * buf); NULL when there is none, after saying so on stderr (the caller
 * exits with EXIT_USAGE). */
const char *db_path(const opts *o, char *buf, size_t n);

/* A context for CPU work: no device, no CUDA initialised (GPU workers are
 * forked later), no user database. NULL when out of memory. */
stof_context *open_cpu_ctx(void);

/* A GPU context with settings s (require_device is set), or a one-line
 * reason and the exit code: 3 when there is no usable GPU, 2 for bad
 * settings, 1 otherwise. */
int open_gpu_ctx(const stof_settings *s, stof_context **out);

/* Settings for the GPU commands from the options (database, mode,
 * budget). */
void base_settings(const opts *o, stof_settings *s);

/* Remember or forget a temporary output file, removed (with its -wal and
 * -shm) if a signal ends the program (stof_tune.c). */
void cli_tmp(void *user, const char *path, int created);

/* The commands. */
int cmd_ls(stof_context *ctx, const opts *o);
int cmd_show(stof_context *ctx, const opts *o);
int cmd_stats(stof_context *ctx, const opts *o);
int cmd_export(stof_context *ctx, const opts *o);
int cmd_import(stof_context *ctx, const opts *o);
int cmd_merge(stof_context *ctx, const opts *o);
int cmd_gc(stof_context *ctx, const opts *o);
int cmd_tune(stof_context *ctx, const opts *o);
int cmd_pending(stof_context *ctx, const opts *o);
int cmd_verify(stof_context *ctx, const opts *o);
int cmd_doctor(stof_context *ctx, const opts *o);
int cmd_show_mask(stof_context *ctx, const opts *o);
int cmd_hf_workload(stof_context *ctx, const opts *o);

#endif
