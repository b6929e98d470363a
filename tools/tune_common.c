/*
 * tune_common.c - what every stof-tune command shares (tune_cli.h): one-line
 * escaped errors, the mapping from statuses to exit codes, printing --json
 * documents, reading plan descriptions, the database a command works on,
 * and opening contexts.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "db.h"
#include "internal.h"
#include "tune_cli.h"
#include "tune_text.h"

/* ------------------------------------------------------------ common */

char g_first_err[1024];
int g_json_printed;

void err(const char *fmt, ...)
{
    char msg[4096];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    if (!g_first_err[0])
        snprintf(g_first_err, sizeof(g_first_err), "%.1000s", msg);
    fprintf(stderr, PROG ": %s\n", tt_term(msg));
    tt_release();
}

int exit_for(stof_status st)
{
    switch (st) {
    case STOF_OK:
        return EXIT_OK;
    case STOF_ERR_INVALID_ARGUMENT:
        return EXIT_USAGE;
    case STOF_ERR_NO_DEVICE:
        return EXIT_NO_GPU;
    case STOF_ERR_DATABASE:
    case STOF_ERR_NOT_FOUND:
    case STOF_ERR_IO:
        return EXIT_DB;
    default:
        return EXIT_FAIL;
    }
}

int fail_with(stof_context *ctx, stof_status st)
{
    const char *m = stof_errmsg(ctx);
    if (!m || !*m)
        m = stof_status_str(st);
    switch (exit_for(st)) {
    case EXIT_DB:
        err("%s: %s",
            st == STOF_ERR_NOT_FOUND ? "database not found" : "database error",
            m);
        break;
    case EXIT_NO_GPU:
        err("no GPU found: %s", m);
        break;
    case EXIT_USAGE:
        err("invalid argument: %s", m);
        break;
    default:
        err("%s", m);
        break;
    }
    return exit_for(st);
}

int print_json(json_t *doc)
{
    g_json_printed = 1;
    if (tt_json_write(stdout, doc) == 0)
        return EXIT_OK;
    err("out of memory while writing the JSON output");
    return EXIT_FAIL;
}

json_t *plan_description(const stof_plan *plan)
{
    /* Size, then fetch: a description is never cut short. */
    size_t need = 0;
    stof_status st = stof_plan_describe(plan, NULL, 0, &need);
    if (st != STOF_OK && st != STOF_ERR_BUFFER_TOO_SMALL)
        return NULL;
    char *text = malloc(need + 1);
    json_t *d = NULL;
    if (text && stof_plan_describe(plan, text, need + 1, NULL) == STOF_OK)
        d = json_loads(text, 0, NULL);
    free(text);
    if (!json_is_object(d)) {
        json_decref(d);
        d = NULL;
    }
    return d;
}

const char *db_path(const opts *o, char *buf, size_t n)
{
    if (o->db)
        return o->db;
    if (!stof__db_default_path(buf, n)) {
        err("no database path: set --db or STOF_USER_DB");
        return NULL;
    }
    return buf;
}

stof_context *open_cpu_ctx(void)
{
    stof_settings s;
    stof_default_settings(&s);
    s.user_db = "";
    stof_context *ctx = NULL;
    if (stof__open_cpu(&ctx, &s) != STOF_OK && !ctx)
        return NULL;
    return ctx;
}

int open_gpu_ctx(const stof_settings *s, stof_context **out)
{
    stof_settings c = *s;
    c.require_device = 1;
    stof_context *ctx = NULL;
    stof_status st = stof_open(&ctx, &c);
    if (st == STOF_OK && stof_has_device(ctx)) {
        *out = ctx;
        return EXIT_OK;
    }
    const char *why = ctx ? stof_errmsg(ctx) : stof_status_str(st);
    if (st == STOF_OK || st == STOF_ERR_NO_DEVICE)
        err("no GPU found: %s", why && *why ? why : "no usable CUDA device");
    else if (st == STOF_ERR_INVALID_ARGUMENT)
        err("invalid settings: %s", why);
    else
        err("cannot open the GPU: %s", why);
    stof_close(&ctx);
    return st == STOF_OK ? EXIT_NO_GPU : exit_for(st);
}

void base_settings(const opts *o, stof_settings *s)
{
    stof_default_settings(s);
    s->user_db = o->db; /* NULL: the default user database */
    s->tuning_mode = o->force ? STOF_TUNE_FORCE : STOF_TUNE_DEFAULT;
    s->tuning_budget_s = o->budget;
}

/* (tune_cli.h) A kernel fault leaves the context failing every later
 * call: a --devices worker would drain the queue the healthy GPUs share,
 * and verify would blame the next records. */
int gpu_alive(stof_context *ctx, char *msg, size_t n)
{
    if (!ctx || !ctx->device.ok)
        return 1;
    const stof_api *api = stof__api();
    if (stof__ctx_push(ctx) != STOF_OK) {
        snprintf(msg, n, "%s", stof_errmsg(ctx));
        return 0;
    }
    const CUresult e = api->cuCtxSynchronize();
    stof__ctx_pop(ctx);
    if (e == CUDA_SUCCESS)
        return 1;
    const char *es = NULL;
    if (api->cuGetErrorString(e, &es) != CUDA_SUCCESS || !es)
        es = "unknown error";
    snprintf(msg, n, "CUDA error %d (%s)", (int)e, es);
    return 0;
}
