/*
 * context.c - the root handle: settings, the last error and its message,
 * logging, and the device the context works on.
 */
#include "internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* $STOF_TUNING_MODE (default, cache-only or force): the default tuning
 * mode; -1 when unset or empty, -2 when it names no mode. */
static int env_tuning_mode(void)
{
    const char *e = getenv("STOF_TUNING_MODE");
    if (!e || !*e)
        return -1;
    static const char *const names[] = {"default", "cache-only", "force"};
    for (int i = 0; i < 3; i++)
        if (strcmp(e, names[i]) == 0)
            return i;
    return -2;
}

/* $STOF_PRELOAD: 1 (or "all") when stof_open preloads the databases'
 * kernels (stof_preload), 0 when unset, empty or 0, -2 otherwise. */
static int env_preload(void)
{
    const char *e = getenv("STOF_PRELOAD");
    if (!e || !*e || strcmp(e, "0") == 0)
        return 0;
    return strcmp(e, "1") == 0 || strcmp(e, "all") == 0 ? 1 : -2;
}

void stof_default_settings(stof_settings *s)
{
    if (!s)
        return;
    memset(s, 0, sizeof(*s));
    s->device = 0;
    s->require_device = 0;
    const int env_mode = env_tuning_mode();
    s->tuning_mode = env_mode >= 0 ? (stof_tuning_mode)env_mode
                                   : STOF_TUNE_DEFAULT;
    s->tuning_budget_s = 0.0;
    s->compile_threads = 0;
    s->log_level = STOF_LOG_WARN;
}

/* Without a log callback, $STOF_LOG (error, warn, info or debug) sends
 * messages up to that level to stderr: tuning progress from programs that
 * cannot pass a callback (the Python binding, a server's logs). */
static int env_log_level(void)
{
    const char *e = getenv("STOF_LOG");
    if (!e || !*e)
        return -1;
    static const char *const names[] = {"error", "warn", "info", "debug"};
    for (int i = 0; i < 4; i++)
        if (strcmp(e, names[i]) == 0)
            return i;
    return -1;
}

void stof__log_discard(void *user, stof_log_level level, const char *msg)
{
    (void)user;
    (void)level;
    (void)msg;
}

static void vlog(stof_context *ctx, stof_log_level level, const char *fmt,
                 va_list ap)
{
    if (!ctx)
        return;
    if (!ctx->settings.log_fn) {
        if ((int)level > env_log_level())
            return;
        static const char *const names[] = {"error", "warn", "info", "debug"};
        char msg[2048];
        vsnprintf(msg, sizeof(msg), fmt, ap);
        fprintf(stderr, "stof %s: %s\n", names[level & 3], msg);
        return;
    }
    if (level > ctx->settings.log_level)
        return;
    char msg[2048];
    vsnprintf(msg, sizeof(msg), fmt, ap);
    ctx->settings.log_fn(ctx->settings.log_user, level, msg);
}

void stof__log(stof_context *ctx, stof_log_level level, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vlog(ctx, level, fmt, ap);
    va_end(ap);
}

stof_status stof__fail_quiet(stof_context *ctx, stof_status st,
                             const char *fmt, ...)
{
    if (!ctx)
        return st;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(ctx->errmsg, sizeof(ctx->errmsg), fmt, ap);
    va_end(ap);
    ctx->last_status = st;
    return st;
}

stof_status stof__fail(stof_context *ctx, stof_status st, const char *fmt, ...)
{
    if (!ctx)
        return st;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(ctx->errmsg, sizeof(ctx->errmsg), fmt, ap);
    va_end(ap);
    ctx->last_status = st;
    stof__log(ctx, STOF_LOG_ERROR, "%s", ctx->errmsg);
    return st;
}

stof_status stof__ok(stof_context *ctx)
{
    if (ctx) {
        ctx->last_status = STOF_OK;
        ctx->errmsg[0] = '\0';
    }
    return STOF_OK;
}

static int all_zero(const uint8_t *p, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (p[i])
            return 0;
    return 1;
}

/* Check the settings before anything uses them. Logging is off while
 * they are checked: a garbage struct must not get its garbage callback
 * called. */
static stof_status check_settings(stof_context *ctx)
{
    stof_settings *cs = &ctx->settings;
    const stof_log_fn fn = cs->log_fn;
    cs->log_fn = NULL;
    stof_status st = STOF_OK;
#define CHECK_(cond, ...)                                                      \
    if (st == STOF_OK && !(cond))                                              \
        st = stof__fail(ctx, STOF_ERR_INVALID_ARGUMENT, __VA_ARGS__);
    CHECK_(all_zero(cs->reserved, sizeof(cs->reserved)),
           "settings: reserved bytes are not zero (fill the struct with "
           "stof_default_settings() first)");
    CHECK_(cs->device >= 0, "settings.device: %d is negative", cs->device);
    CHECK_(cs->require_device == 0 || cs->require_device == 1,
           "settings.require_device: %d is not 0 or 1", cs->require_device);
    CHECK_((int)cs->tuning_mode >= STOF_TUNE_DEFAULT &&
               (int)cs->tuning_mode <= STOF_TUNE_FORCE,
           "settings.tuning_mode: %d is not a stof_tuning_mode",
           (int)cs->tuning_mode);
    CHECK_(cs->tuning_budget_s >= 0.0 && cs->tuning_budget_s <= 1e9,
           "settings.tuning_budget_s: %g is not a number of seconds "
           "(0..1e9)",
           cs->tuning_budget_s);
    CHECK_(cs->compile_threads >= 0 && cs->compile_threads <= 4096,
           "settings.compile_threads: %d is outside 0..4096",
           cs->compile_threads);
    CHECK_((int)cs->log_level >= STOF_LOG_ERROR &&
               (int)cs->log_level <= STOF_LOG_DEBUG,
           "settings.log_level: %d is not a stof_log_level",
           (int)cs->log_level);
    CHECK_(cs->tuning_top_k >= 0 && cs->tuning_top_k <= 16,
           "settings.tuning_top_k: %d is outside 0..16", cs->tuning_top_k);
    CHECK_(cs->tuning_reps >= 0 && cs->tuning_reps <= 1000,
           "settings.tuning_reps: %d is outside 0..1000", cs->tuning_reps);
#undef CHECK_
    cs->log_fn = fn;
    if (st != STOF_OK)
        cs->log_fn = NULL; /* a context that failed to open never calls it */
    return st;
}

static stof_status open_context(stof_context **out, const stof_settings *s,
                                int with_device)
{
    if (!out)
        return STOF_ERR_INVALID_ARGUMENT;
    *out = NULL;
    stof_context *ctx = calloc(1, sizeof(*ctx));
    if (!ctx)
        return STOF_ERR_OUT_OF_MEMORY;
    *out = ctx;
    if (s)
        ctx->settings = *s;
    else
        stof_default_settings(&ctx->settings);
    if (env_tuning_mode() == -2) {
        ctx->settings.user_db = NULL;
        ctx->settings.system_dbs = NULL;
        return stof__fail(ctx, STOF_ERR_INVALID_ARGUMENT,
                          "STOF_TUNING_MODE=%s: expected default, "
                          "cache-only or force",
                          getenv("STOF_TUNING_MODE"));
    }
    if (env_preload() == -2) {
        ctx->settings.user_db = NULL;
        ctx->settings.system_dbs = NULL;
        return stof__fail(ctx, STOF_ERR_INVALID_ARGUMENT,
                          "STOF_PRELOAD=%s: expected 0, 1 or all",
                          getenv("STOF_PRELOAD"));
    }
    stof_status st = check_settings(ctx);
    if (st != STOF_OK) {
        ctx->settings.user_db = NULL;
        ctx->settings.system_dbs = NULL;
        return st;
    }
    const stof_settings *cs = &ctx->settings;
    /* Pointers in the settings are borrowed only during stof_open: keep
     * copies. */
    if (cs->user_db && !(ctx->user_db = strdup(cs->user_db)))
        return stof__fail(ctx, STOF_ERR_OUT_OF_MEMORY, "out of memory");
    if (cs->system_dbs) {
        size_t n = 0;
        while (cs->system_dbs[n])
            n++;
        ctx->system_dbs = calloc(n + 1, sizeof(char *));
        if (!ctx->system_dbs)
            return stof__fail(ctx, STOF_ERR_OUT_OF_MEMORY, "out of memory");
        for (size_t i = 0; i < n; i++)
            if (!(ctx->system_dbs[i] = strdup(cs->system_dbs[i])))
                return stof__fail(ctx, STOF_ERR_OUT_OF_MEMORY, "out of memory");
    }
    ctx->settings.user_db = NULL;
    ctx->settings.system_dbs = NULL;

    /* Loading the libraries initialises nothing: a process may still fork
     * GPU workers after a CPU-only open. */
    ctx->api = stof__api();
    if (!with_device) {
        snprintf(ctx->device.why, sizeof(ctx->device.why),
                 "a CPU-only context (stof-tune's own)");
        return stof__ok(ctx);
    }
    st = (stof_status)stof__device_init(ctx, cs->device);
    if (st != STOF_OK) {
        size_t n = strlen(ctx->errmsg);
        if (n >= sizeof(ctx->device.why))
            n = sizeof(ctx->device.why) - 1;
        memcpy(ctx->device.why, ctx->errmsg, n);
        ctx->device.why[n] = '\0';
        if (cs->require_device)
            return st; /* message already recorded */
        stof__log(ctx, STOF_LOG_INFO, "no GPU: %s", ctx->errmsg);
    } else if (env_preload() == 1 && stof_preload(ctx, 0, NULL) != STOF_OK) {
        /* (a context without its kernels preloaded still works) */
        stof__log(ctx, STOF_LOG_WARN, "STOF_PRELOAD: %s", ctx->errmsg);
    }
    return stof__ok(ctx);
}

stof_status stof_open(stof_context **out, const stof_settings *s)
{
    return open_context(out, s, 1);
}

stof_status stof__open_cpu(stof_context **out, const stof_settings *s)
{
    return open_context(out, s, 0);
}

void stof_close(stof_context **pctx)
{
    if (!pctx || !*pctx)
        return;
    stof_context *ctx = *pctx;
    /* The database belongs to the operations that opened it (they set
     * how to close it): the runtime does not know the database. */
    if (ctx->db && ctx->db_close)
        ctx->db_close(&ctx->db);
    if (ctx->mb_close)
        ctx->mb_close(ctx);
    if (ctx->fmtcache_close)
        ctx->fmtcache_close(ctx);
    if (ctx->ropecache_close)
        ctx->ropecache_close(ctx);
    if (ctx->lt_warm_close)
        ctx->lt_warm_close(ctx);
    stof__modcache_close(ctx);
    for (int i = 0; i < ctx->n_ref_cubins; i++)
        free(ctx->ref_cubins[i].cubin);
    free(ctx->mb_cubin);
    free(ctx->user_db);
    if (ctx->system_dbs)
        for (size_t i = 0; ctx->system_dbs[i]; i++)
            free(ctx->system_dbs[i]);
    free(ctx->system_dbs);
    stof__device_release(ctx);
    free(ctx);
    *pctx = NULL;
}

const char *stof_errmsg(const stof_context *ctx)
{
    if (!ctx)
        return "no context (stof_open failed for lack of memory or was "
               "given NULL)";
    return ctx->errmsg;
}

stof_status stof_errcode(const stof_context *ctx)
{
    return ctx ? ctx->last_status : STOF_ERR_INVALID_ARGUMENT;
}

int stof_has_device(const stof_context *ctx)
{
    return ctx && ctx->device.ok;
}

double stof__now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec * 1e-6;
}

stof_status stof__ctx_sink_fail(void *ctx, stof_status st, const char *msg)
{
    return stof__fail(ctx, st, "%s", msg);
}

void stof__ctx_sink_log(void *ctx, stof_log_level level, const char *msg)
{
    stof__log(ctx, level, "%s", msg);
}

void stof__ctx_sink_ok(void *ctx)
{
    stof__ok(ctx);
}
