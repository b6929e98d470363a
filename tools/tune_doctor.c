/*
 * tune_doctor.c - stof-tune doctor: what this host gives stof. Which
 * libcuda, NVRTC and cuBLASLt were loaded (the file, and why that one: the
 * environment variable that chose it, or the default names), their
 * versions or the reason they are missing; each GPU as stof sees it; the
 * user database (its path and where the path came from, schema, records,
 * misses, trusted records); the environment variables stof reads; this
 * build's version and template hash. Text, or one JSON document (--json).
 * Always exit 0 unless the report cannot be made: the report itself says
 * what is missing.
 */
#include <dlfcn.h>
#include <link.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <sqlite3.h>

#include "blaslt.h"
#include "cuda_shim.h"
#include "db.h"
#include "internal.h"
#include "tune_cli.h"
#include "tune_text.h"

/* The file a dlopen handle came from ("" when unknown). */
static const char *lib_file(void *handle)
{
    struct link_map *lm = NULL;
    if (!handle || dlinfo(handle, RTLD_DI_LINKMAP, &lm) != 0 || !lm ||
        !lm->l_name)
        return "";
    return lm->l_name;
}

/* How the library was chosen: the variable that named it, else the
 * default search. */
static json_t *chosen_by(const char *var, const char *defaults)
{
    const char *v = getenv(var);
    char buf[512];
    if (v && *v)
        snprintf(buf, sizeof(buf), "$%s=%s", var, v);
    else
        snprintf(buf, sizeof(buf), "default search (%s; $%s unset)",
                 defaults, var);
    return tt_jstr(buf);
}

static json_t *libraries(void)
{
    const stof_api *a = stof__api();
    json_t *cuda = json_pack(
        "{s:b, s:o, s:o}", "loaded", a->has_cuda, "file",
        tt_jstr(a->has_cuda ? lib_file(a->cuda_lib) : ""), "chosen_by",
        chosen_by("STOF_LIBCUDA", "libcuda.so.1, libcuda.so"));
    int drv = 0;
    if (a->has_cuda && a->cuDriverGetVersion(&drv) == CUDA_SUCCESS)
        json_object_set_new(cuda, "driver_version", json_integer(drv));
    if (!a->has_cuda)
        json_object_set_new(cuda, "why", tt_jstr(a->cuda_why));

    json_t *nvrtc = json_pack(
        "{s:b, s:o, s:o}", "loaded", a->has_nvrtc, "file",
        tt_jstr(a->has_nvrtc ? lib_file(a->nvrtc_lib) : ""), "chosen_by",
        chosen_by("STOF_LIBNVRTC", "libnvrtc.so.13, .12, libnvrtc.so, then "
                                   "/usr/local/cuda/lib64 and "
                                   "$CUDA_HOME/lib64"));
    int major = 0, minor = 0;
    if (a->has_nvrtc && a->nvrtcVersion(&major, &minor) == NVRTC_SUCCESS) {
        char v[32];
        snprintf(v, sizeof(v), "%d.%d", major, minor);
        json_object_set_new(nvrtc, "version", json_string(v));
    }
    if (!a->has_nvrtc)
        json_object_set_new(nvrtc, "why", tt_jstr(a->nvrtc_why));

    char why[512] = "";
    const int lt = stof__blaslt_available(why, sizeof(why));
    json_t *blas = json_pack(
        "{s:b, s:o}", "loaded", lt, "chosen_by",
        chosen_by("STOF_LIBCUBLASLT",
                  "libcublasLt.so.13, .12, libcublasLt.so, the toolkit, "
                  "PyTorch's NVIDIA wheels"));
    if (lt) {
        json_object_set_new(blas, "file", tt_jstr(stof__blaslt_path()));
        json_object_set_new(blas, "version",
                            json_integer((json_int_t)stof__blaslt_version()));
    } else
        json_object_set_new(blas, "why", tt_jstr(why));
    return json_pack("{s:o, s:o, s:o}", "libcuda", cuda, "nvrtc", nvrtc,
                     "cublaslt", blas);
}

/* Every GPU as stof describes it (stof_device_describe of a context on
 * it), or why there is none. */
static json_t *devices(json_t **why)
{
    const stof_api *a = stof__api();
    json_t *list = json_array();
    int n = 0;
    if (!a->has_cuda) {
        *why = json_string("no CUDA driver (see libcuda)");
        return list;
    }
    CUresult r = a->cuInit(0);
    if (r == CUDA_SUCCESS)
        r = a->cuDeviceGetCount(&n);
    if (r != CUDA_SUCCESS || n == 0) {
        const char *name = NULL;
        if (r != CUDA_SUCCESS)
            a->cuGetErrorName(r, &name);
        char buf[256];
        snprintf(buf, sizeof(buf), "%s",
                 r != CUDA_SUCCESS ? (name ? name : "cuInit failed")
                                   : "the driver reports no GPU");
        *why = json_string(buf);
        return list;
    }
    for (int i = 0; i < n; i++) {
        stof_settings s;
        stof_default_settings(&s);
        s.device = i;
        s.user_db = ""; /* no database for this */
        stof_context *c = NULL;
        json_t *d = NULL;
        if (stof_open(&c, &s) == STOF_OK) {
            char buf[4096];
            size_t need = 0;
            if (stof_device_describe(c, buf, sizeof(buf), &need) == STOF_OK)
                d = json_loads(buf, 0, NULL);
        }
        if (!d)
            d = json_pack("{s:i, s:o}", "ordinal", i, "error",
                          tt_jstr(c ? stof_errmsg(c) : "out of memory"));
        stof_close(&c);
        json_array_append_new(list, d);
    }
    return list;
}

/* An integer from one SQL statement (-1 when it fails). */
static long long sql_int(sqlite3 *db, const char *q)
{
    sqlite3_stmt *s = NULL;
    long long v = -1;
    if (sqlite3_prepare_v2(db, q, -1, &s, NULL) == SQLITE_OK &&
        sqlite3_step(s) == SQLITE_ROW)
        v = sqlite3_column_int64(s, 0);
    sqlite3_finalize(s);
    return v;
}

/* The user database: path, where it came from, and what it holds. */
static json_t *user_db(const opts *o)
{
    char buf[4096];
    const char *path = NULL, *from = NULL;
    const char *env = getenv("STOF_USER_DB");
    if (o->db) {
        path = o->db;
        from = "--db";
    } else if (stof__db_default_path(buf, sizeof(buf))) {
        path = buf;
        /* The rules of stof__db_default_path: $XDG_CACHE_HOME only when
         * absolute. */
        const char *xdg = getenv("XDG_CACHE_HOME");
        from = env && *env            ? "$STOF_USER_DB"
               : xdg && xdg[0] == '/' ? "$XDG_CACHE_HOME/stof/tuning.db"
                                      : "$HOME/.cache/stof/tuning.db";
    }
    if (!path)
        return json_pack("{s:s, s:s}", "role", "user", "error",
                         "no path: $STOF_USER_DB, $XDG_CACHE_HOME and $HOME "
                         "are unset");
    json_t *d = json_pack("{s:s, s:o, s:s}", "role", "user", "path",
                          tt_jstr(path), "path_from", from);
    struct stat st;
    if (stat(path, &st) != 0) {
        json_object_set_new(d, "exists", json_false());
        json_object_set_new(d, "note",
                            json_string("created on the first tuned plan"));
        return d;
    }
    json_object_set_new(d, "exists", json_true());
    json_object_set_new(d, "bytes", json_integer((json_int_t)st.st_size));
    sqlite3 *db = NULL;
    if (stof__db_open_readonly(path, &db) != SQLITE_OK) {
        json_object_set_new(d, "error",
                            tt_jstr(db ? sqlite3_errmsg(db)
                                       : "cannot be opened"));
        sqlite3_close(db);
        return d;
    }
    const long long schema = sql_int(db, "PRAGMA user_version");
    json_object_set_new(d, "schema", json_integer(schema));
    if (schema != STOF_DB_SCHEMA_VERSION) {
        char m[128];
        snprintf(m, sizeof(m), "schema %lld; this build reads %d", schema,
                 STOF_DB_SCHEMA_VERSION);
        json_object_set_new(d, "error", json_string(m));
    } else {
        json_object_set_new(
            d, "records",
            json_integer(sql_int(db, "SELECT count(*) FROM records")));
        json_object_set_new(
            d, "misses", json_integer(sql_int(db, "SELECT count(*) FROM misses")));
        json_object_set_new(
            d, "trusted",
            json_integer(sql_int(db, "SELECT count(*) FROM trusted")));
    }
    sqlite3_close(db);
    return d;
}

/* The variables stof reads, those set. */
static json_t *environment(void)
{
    static const char *const vars[] = {
        "STOF_USER_DB",   "STOF_TUNING_MODE", "STOF_LOG",
        "STOF_PRELOAD",   "STOF_LIBCUDA",     "STOF_LIBNVRTC",
        "STOF_LIBCUBLASLT",
        "CUDA_HOME",      "XDG_CACHE_HOME",
    };
    json_t *e = json_object();
    for (size_t i = 0; i < sizeof(vars) / sizeof(*vars); i++) {
        const char *v = getenv(vars[i]);
        if (v)
            json_object_set_new(e, vars[i], tt_jstr(v));
    }
    return e;
}

static void print_lib(const char *name, json_t *l)
{
    json_t *file = json_object_get(l, "file");
    printf("  %-9s %s", name,
           json_is_true(json_object_get(l, "loaded")) ? "loaded" : "MISSING");
    if (file && json_string_length(file))
        printf(" from %s", tt_term(json_string_value(file)));
    json_t *v = json_object_get(l, "version");
    if (json_is_string(v))
        printf(", version %s", json_string_value(v));
    else if (json_is_integer(v))
        printf(", version %lld", (long long)json_integer_value(v));
    v = json_object_get(l, "driver_version");
    if (v)
        printf(", driver %lld", (long long)json_integer_value(v));
    printf("\n            chosen by %s\n",
           tt_term(json_string_value(json_object_get(l, "chosen_by"))));
    v = json_object_get(l, "why");
    if (v)
        printf("            why: %s\n", tt_term(json_string_value(v)));
}

int cmd_doctor(stof_context *ctx, const opts *o)
{
    (void)ctx;
    char th[17];
    snprintf(th, sizeof(th), "%016llx",
             (unsigned long long)stof_template_hash());
    stof_settings s;
    stof_default_settings(&s); /* reads $STOF_TUNING_MODE */
    static const char *const modes[] = {"default", "cache-only", "force"};
    const char *mode = (int)s.tuning_mode >= 0 && (int)s.tuning_mode < 3
                           ? modes[s.tuning_mode]
                           : "?";
    /* A value naming no mode makes stof_open fail (context.c). */
    const char *me = getenv("STOF_TUNING_MODE");
    if (me && *me && strcmp(me, modes[0]) && strcmp(me, modes[1]) &&
        strcmp(me, modes[2]))
        mode = "INVALID: $STOF_TUNING_MODE names no mode (default, "
               "cache-only, force), so stof_open fails";
    json_t *dev_why = NULL;
    json_t *doc = json_pack(
        "{s:{s:s, s:s, s:i}, s:o, s:o, s:o, s:o, s:o}", "stof", "version",
        stof_version_string(), "template_hash", th, "db_schema",
        STOF_DB_SCHEMA_VERSION, "libraries", libraries(), "devices",
        devices(&dev_why), "databases", json_pack("[o]", user_db(o)),
        "tuning_mode", tt_jstr(mode), "environment", environment());
    if (doc && dev_why)
        json_object_set_new(doc, "devices_why", dev_why);
    if (!doc) {
        err("out of memory");
        return EXIT_FAIL;
    }
    if (o->json)
        return print_json(doc);

    printf("stof %s, templates %s, database schema %d\n",
           stof_version_string(), th, STOF_DB_SCHEMA_VERSION);
    printf("libraries:\n");
    json_t *libs = json_object_get(doc, "libraries");
    print_lib("libcuda", json_object_get(libs, "libcuda"));
    print_lib("nvrtc", json_object_get(libs, "nvrtc"));
    print_lib("cublaslt", json_object_get(libs, "cublaslt"));
    json_t *devs = json_object_get(doc, "devices");
    printf("devices: %zu\n", json_array_size(devs));
    if (json_object_get(doc, "devices_why"))
        printf("  none: %s\n", tt_term(json_string_value(
                                   json_object_get(doc, "devices_why"))));
    for (size_t i = 0; i < json_array_size(devs); i++) {
        char *t = json_dumps(json_array_get(devs, i), JSON_COMPACT);
        printf("  %s\n", t ? tt_term(t) : "?");
        free(t);
    }
    json_t *db = json_array_get(json_object_get(doc, "databases"), 0);
    printf("user database: %s\n",
           json_object_get(db, "path")
               ? tt_term(json_string_value(json_object_get(db, "path")))
               : "(none)");
    if (json_object_get(db, "path_from"))
        printf("  from %s\n",
               json_string_value(json_object_get(db, "path_from")));
    if (json_object_get(db, "error"))
        printf("  error: %s\n",
               tt_term(json_string_value(json_object_get(db, "error"))));
    else if (json_is_false(json_object_get(db, "exists")))
        printf("  not there yet (created on the first tuned plan)\n");
    else
        printf("  schema %lld, %lld records, %lld misses, %lld trusted\n",
               (long long)json_integer_value(json_object_get(db, "schema")),
               (long long)json_integer_value(json_object_get(db, "records")),
               (long long)json_integer_value(json_object_get(db, "misses")),
               (long long)json_integer_value(json_object_get(db, "trusted")));
    printf("tuning mode: %s\n", mode);
    json_t *env = json_object_get(doc, "environment");
    const char *k;
    json_t *v;
    printf("environment:%s\n", json_object_size(env) ? "" : " (no stof "
                                                            "variable set)");
    json_object_foreach(env, k, v)
        printf("  %s=%s\n", k, tt_term(json_string_value(v)));
    tt_release();
    json_decref(doc);
    return EXIT_OK;
}
