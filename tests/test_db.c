/*
 * test_db.c - the tuning database (cache/db.c) on the CPU: schema creation
 * and reopening, every field through a round trip, layering, the default
 * path, bad files (corrupt, truncated, foreign, empty, newer schema),
 * read-only files and directories, concurrent writers in several processes,
 * a writer killed mid-way, the replace rule and the misses table.
 *
 * Contexts are built by hand (calloc + default settings + a log capture)
 * rather than with stof_open: the database needs no GPU, and the tests
 * fork, which must not happen in a process that initialised CUDA.
 */
#include <criterion/criterion.h>

#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <sqlite3.h>
#define XXH_INLINE_ALL
#include <xxhash.h>

#include "db.h"
#include "db_int.h"
#include "internal.h"
#include "testutil.h"

/* ---------------------------------------------------------------- helpers */

typedef struct logcap {
    char text[32768];
    size_t len;
    int n_warn, n_error;
} logcap;

static void log_capture(void *user, stof_log_level level, const char *msg)
{
    logcap *lc = user;
    if (level == STOF_LOG_WARN)
        lc->n_warn++;
    if (level == STOF_LOG_ERROR)
        lc->n_error++;
    static const char *const names[] = {"error", "warn", "info", "debug"};
    int n = snprintf(lc->text + lc->len, sizeof(lc->text) - lc->len,
                     "[%s] %s\n", names[level & 3], msg);
    if (n > 0 && lc->len + (size_t)n < sizeof(lc->text))
        lc->len += (size_t)n;
}

static void log_reset(logcap *lc)
{
    memset(lc, 0, sizeof(*lc));
}

/* A warning that contains `needle` (a file name, usually). */
static int log_has_warn(const logcap *lc, const char *needle)
{
    const char *p = lc->text;
    while ((p = strstr(p, "[warn] ")) != NULL) {
        const char *end = strchr(p, '\n');
        size_t n = end ? (size_t)(end - p) : strlen(p);
        char line[4096];
        if (n >= sizeof(line))
            n = sizeof(line) - 1;
        memcpy(line, p, n);
        line[n] = '\0';
        if (strstr(line, needle))
            return 1;
        p += n;
    }
    return 0;
}

static stof_context *ctx_new(logcap *lc)
{
    stof_context *ctx = calloc(1, sizeof(*ctx));
    cr_assert_not_null(ctx);
    stof_default_settings(&ctx->settings);
    ctx->settings.log_fn = log_capture;
    ctx->settings.log_user = lc;
    ctx->settings.log_level = STOF_LOG_INFO;
    log_reset(lc);
    return ctx;
}

/* The same for forked children (no Criterion asserts there). */
static stof_context *ctx_new_raw(logcap *lc)
{
    stof_context *ctx = calloc(1, sizeof(*ctx));
    if (!ctx)
        _exit(3);
    stof_default_settings(&ctx->settings);
    ctx->settings.log_fn = log_capture;
    ctx->settings.log_user = lc;
    ctx->settings.log_level = STOF_LOG_INFO;
    log_reset(lc);
    return ctx;
}

static char *tmpdir_new(void)
{
    char *d = strdup("/tmp/stof-db-test-XXXXXX");
    cr_assert_not_null(d);
    cr_assert_not_null(mkdtemp(d), "mkdtemp: %s", strerror(errno));
    return d;
}

/* Directories are made writable on the way down (a test may have made
 * them read-only), everything is removed on the way up. */
static int unlock_entry(const char *p, const struct stat *sb, int flag,
                        struct FTW *ftw)
{
    (void)sb;
    (void)ftw;
    if (flag == FTW_D)
        chmod(p, 0700);
    return 0;
}

static int rm_entry(const char *p, const struct stat *sb, int flag,
                    struct FTW *ftw)
{
    (void)sb;
    (void)flag;
    (void)ftw;
    remove(p);
    return 0;
}

static void rm_tree(const char *d)
{
    chmod(d, 0700);
    nftw(d, unlock_entry, 16, FTW_PHYS);
    nftw(d, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
}

static void tmpdir_free(char *d)
{
    if (!d)
        return;
    rm_tree(d);
    free(d);
}

static char *path_join(const char *dir, const char *name)
{
    size_t n = strlen(dir) + strlen(name) + 2;
    char *p = malloc(n);
    cr_assert_not_null(p);
    snprintf(p, n, "%s/%s", dir, name);
    return p;
}

static uint64_t mix(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

/* A key of 32 hex digits made from n. */
static void make_key(char key[33], uint64_t n)
{
    snprintf(key, 33, "%016llx%016llx", (unsigned long long)mix(n),
             (unsigned long long)mix(n + 1000003));
}

/* Fill every field of r with values derived from `seed`; the cubin has
 * cubin_size bytes. */
static void record_fill(stof_db_record *r, uint64_t seed, size_t cubin_size)
{
    memset(r, 0, sizeof(*r));
    make_key(r->key, seed);
    snprintf(r->op, sizeof(r->op), "attention");
    snprintf(r->mask_digest, sizeof(r->mask_digest), "%016llx%016llx",
             (unsigned long long)mix(seed * 3),
             (unsigned long long)mix(seed * 5));
    snprintf(r->mask_spec, sizeof(r->mask_spec), "sliding:%d|strided:%d",
             (int)(seed % 512) + 1, (int)(seed % 64) + 2);
    r->batch = (int)(seed % 7) + 1;
    r->heads = (int)(seed % 31) + 1;
    r->seq_q = 1024 + (int)(seed % 100);
    r->seq_k = 2048 + (int)(seed % 100);
    r->head_dim = 64;
    snprintf(r->dtype, sizeof(r->dtype), seed & 1 ? "bf16" : "fp16");
    snprintf(r->layout, sizeof(r->layout), "BHSD");
    snprintf(r->device_name, sizeof(r->device_name), "NVIDIA H100 80GB HBM3");
    r->cc_major = 9;
    r->cc_minor = 0;
    r->sm_count = 132;
    r->driver_version = 13000;
    snprintf(r->nvrtc_version, sizeof(r->nvrtc_version), "13.0");
    snprintf(r->stof_version, sizeof(r->stof_version), "0.1.0");
    snprintf(r->template_hash, sizeof(r->template_hash), "%016llx",
             (unsigned long long)mix(seed * 7));
    snprintf(r->kernel, sizeof(r->kernel), "block");
    snprintf(r->config, sizeof(r->config),
             "{\"block_m\":64,\"block_n\":64,\"seed\":%llu}",
             (unsigned long long)seed);
    snprintf(r->arch, sizeof(r->arch), "sm_90");
    r->time_ms = 1.0 + (double)(seed % 1000) / 7.0;
    r->runner_up_ms = r->time_ms * 1.25;
    r->model_ms = r->time_ms * 1.5;
    r->n_candidates = 8;
    r->verified = 1;
    snprintf(r->measured, sizeof(r->measured),
             "{\"method\":\"cuda_events\",\"reps\":50,\"seed\":%llu}",
             (unsigned long long)seed);
    r->created_at = 1700000000 + (int64_t)seed;
    snprintf(r->host, sizeof(r->host), "host-%llu", (unsigned long long)seed);
    if (cubin_size) {
        r->cubin = malloc(cubin_size);
        if (!r->cubin)
            abort();
        unsigned char *b = r->cubin;
        for (size_t i = 0; i < cubin_size; i++)
            b[i] = (unsigned char)mix(seed ^ (i * 0x100000001ull));
        r->cubin_size = cubin_size;
    }
}

static void assert_record_eq(const stof_db_record *a, const stof_db_record *b)
{
#define EQ_S(f) cr_assert_str_eq(a->f, b->f, "field " #f)
#define EQ_I(f) cr_assert_eq(a->f, b->f, "field " #f)
    EQ_S(key); EQ_S(op); EQ_S(mask_digest); EQ_S(mask_spec);
    EQ_I(batch); EQ_I(heads); EQ_I(seq_q); EQ_I(seq_k); EQ_I(head_dim);
    EQ_S(dtype); EQ_S(layout); EQ_S(device_name);
    EQ_I(cc_major); EQ_I(cc_minor); EQ_I(sm_count); EQ_I(driver_version);
    EQ_S(nvrtc_version); EQ_S(stof_version); EQ_S(template_hash);
    EQ_S(kernel); EQ_S(config); EQ_S(arch);
    EQ_I(time_ms); EQ_I(runner_up_ms); EQ_I(model_ms);
    EQ_I(n_candidates); EQ_I(verified); EQ_S(measured);
    EQ_I(created_at); EQ_S(host);
    EQ_I(cubin_size);
#undef EQ_S
#undef EQ_I
    if (a->cubin_size)
        cr_assert(memcmp(a->cubin, b->cubin, a->cubin_size) == 0,
                  "cubin differs");
}

/* Open a database, assert success (the open never fails for bad files). */
static stof_db *db_open(stof_context *ctx, const char *user,
                        const char *const *sys)
{
    stof_db *db = NULL;
    cr_assert_eq(stof__db_open(STOF_DB_SINK(ctx), user, sys, &db), STOF_OK, "%s",
                 stof_errmsg(ctx));
    cr_assert_not_null(db);
    return db;
}

/* A test's user database, alone in a fresh directory, with its log. */
typedef struct one_db {
    char *dir, *path;
    logcap lc;
    stof_context *ctx;
    stof_db *db;
} one_db;

static void one_db_open(one_db *f)
{
    f->dir = tmpdir_new();
    f->path = path_join(f->dir, "tuning.db");
    f->ctx = ctx_new(&f->lc);
    f->db = db_open(f->ctx, f->path, NULL);
}

static void one_db_close(one_db *f)
{
    stof__db_close(&f->db);
    free(f->path);
    tmpdir_free(f->dir);
    free(f->ctx);
}

/* Make a valid database at path holding n records seeded base..base+n-1,
 * each with a cubin of cubin_size bytes. */
static void make_db(const char *path, uint64_t base, int n,
                    size_t cubin_size, const char *config)
{
    logcap lc;
    stof_context *ctx = ctx_new(&lc);
    stof_db *db = db_open(ctx, path, NULL);
    cr_assert(stof__db_writable(db), "%s", lc.text);
    for (int i = 0; i < n; i++) {
        stof_db_record r;
        record_fill(&r, base + (uint64_t)i, cubin_size);
        if (config)
            snprintf(r.config, sizeof(r.config), "%s", config);
        cr_assert_eq(stof__db_store(db, &r, 0, 0), STOF_OK, "%s",
                     stof_errmsg(ctx));
        stof__db_record_clear(&r);
    }
    stof__db_close(&db);
    free(ctx);
}

static unsigned char *read_file(const char *path, size_t *n)
{
    FILE *f = fopen(path, "rb");
    cr_assert_not_null(f, "%s: %s", path, strerror(errno));
    cr_assert_eq(fseek(f, 0, SEEK_END), 0);
    long len = ftell(f);
    cr_assert(len >= 0);
    rewind(f);
    unsigned char *b = malloc((size_t)len + 1);
    cr_assert_not_null(b);
    cr_assert_eq(fread(b, 1, (size_t)len, f), (size_t)len);
    fclose(f);
    *n = (size_t)len;
    return b;
}

static void write_file(const char *path, const void *data, size_t n)
{
    FILE *f = fopen(path, "wb");
    cr_assert_not_null(f, "%s: %s", path, strerror(errno));
    if (n)
        cr_assert_eq(fwrite(data, 1, n, f), n);
    cr_assert_eq(fclose(f), 0);
}

/* One integer or text answer of a query on a raw connection. */
static long long raw_int(sqlite3 *c, const char *sql)
{
    sqlite3_stmt *s = NULL;
    cr_assert_eq(sqlite3_prepare_v2(c, sql, -1, &s, NULL), SQLITE_OK,
                 "%s: %s", sql, sqlite3_errmsg(c));
    cr_assert_eq(sqlite3_step(s), SQLITE_ROW, "%s: %s", sql,
                 sqlite3_errmsg(c));
    long long v = sqlite3_column_int64(s, 0);
    sqlite3_finalize(s);
    return v;
}

static void raw_text(sqlite3 *c, const char *sql, char *buf, size_t n)
{
    sqlite3_stmt *s = NULL;
    cr_assert_eq(sqlite3_prepare_v2(c, sql, -1, &s, NULL), SQLITE_OK,
                 "%s: %s", sql, sqlite3_errmsg(c));
    cr_assert_eq(sqlite3_step(s), SQLITE_ROW, "%s: %s", sql,
                 sqlite3_errmsg(c));
    const unsigned char *t = sqlite3_column_text(s, 0);
    snprintf(buf, n, "%s", t ? (const char *)t : "");
    sqlite3_finalize(s);
}

static sqlite3 *raw_open(const char *path, int flags)
{
    sqlite3 *c = NULL;
    cr_assert_eq(sqlite3_open_v2(path, &c, flags, NULL), SQLITE_OK, "%s",
                 path);
    sqlite3_busy_timeout(c, 10000);
    return c;
}

static int count_cb(void *user, const stof_db_record *r)
{
    (void)r;
    (*(int *)user)++;
    return 0;
}

/* ----------------------------------------------------------------- schema */

Test(db, schema_created_with_directories_and_reopened)
{
    char *dir = tmpdir_new();
    char *path = path_join(dir, "a/b/c/tuning.db");
    logcap lc;
    stof_context *ctx = ctx_new(&lc);

    stof_db *db = db_open(ctx, path, NULL);
    cr_assert(stof__db_writable(db), "%s", lc.text);
    cr_assert_eq(lc.n_warn + lc.n_error, 0, "%s", lc.text);
    stof__db_close(&db);
    cr_assert_null(db);
    stof__db_close(&db); /* harmless */
    stof__db_close(NULL);

    struct stat sb;
    cr_assert_eq(stat(path, &sb), 0, "the file was not created");
    char *sub = path_join(dir, "a");
    cr_assert_eq(stat(sub, &sb), 0);
    cr_assert_eq(sb.st_mode & 0777, 0700, "directory mode %o",
                 sb.st_mode & 0777);
    free(sub);

    sqlite3 *c = raw_open(path, SQLITE_OPEN_READONLY);
    cr_assert_eq(raw_int(c, "PRAGMA application_id"), 0x53544f46);
    cr_assert_eq(raw_int(c, "PRAGMA user_version"), STOF_DB_SCHEMA_VERSION);
    char buf[256];
    raw_text(c, "PRAGMA journal_mode", buf, sizeof(buf));
    cr_assert_str_eq(buf, "wal");
    raw_text(c, "SELECT value FROM meta WHERE key = 'application'", buf,
             sizeof(buf));
    cr_assert_str_eq(buf, "stof tuning database");
    cr_assert_eq(raw_int(c, "SELECT value FROM meta WHERE key = "
                            "'schema_version'"),
                 STOF_DB_SCHEMA_VERSION);
    long long created = raw_int(c, "SELECT value FROM meta WHERE key = "
                                   "'created_at'");
    cr_assert(created > 1600000000 && created <= (long long)time(NULL) + 5);
    raw_text(c, "SELECT value FROM meta WHERE key = 'stof_version'", buf,
             sizeof(buf));
    cr_assert_str_eq(buf, stof_version_string());
    cr_assert_eq(raw_int(c, "SELECT count(*) FROM sqlite_master WHERE type = "
                            "'table' AND name IN ('meta', 'records', "
                            "'misses')"),
                 3);
    cr_assert_eq(raw_int(c, "SELECT count(*) FROM pragma_table_info("
                            "'records')"),
                 33, "records has a column per record field");
    raw_text(c, "PRAGMA integrity_check", buf, sizeof(buf));
    cr_assert_str_eq(buf, "ok");
    sqlite3_close(c);

    /* Reopen: nothing to create, no message. */
    db = db_open(ctx, path, NULL);
    cr_assert(stof__db_writable(db));
    cr_assert_eq(lc.n_warn + lc.n_error, 0, "%s", lc.text);
    stof_db_record r;
    cr_assert_eq(stof__db_lookup(db, "0123456789abcdef0123456789abcdef", &r),
                 STOF_ERR_NOT_FOUND);
    stof__db_close(&db);

    /* No user database at all: a miss, and writing fails clearly. */
    db = db_open(ctx, "", NULL);
    cr_assert(!stof__db_writable(db));
    cr_assert_eq(stof__db_lookup(db, "00", &r), STOF_ERR_NOT_FOUND);
    record_fill(&r, 1, 0);
    cr_assert_eq(stof__db_store(db, &r, 0, 0), STOF_ERR_DATABASE);
    cr_assert(strstr(stof_errmsg(ctx), "no writable user tuning database"),
              "%s", stof_errmsg(ctx));
    cr_assert_eq(stof__db_record_miss(db, "k", "{}", NULL, 0),
                 STOF_ERR_DATABASE);
    cr_assert_eq(stof__db_foreach(db, 0, count_cb, &(int){0}),
                 STOF_ERR_DATABASE);
    cr_assert_eq(stof__db_foreach(db, 1, count_cb, &(int){0}),
                 STOF_ERR_INVALID_ARGUMENT);
    stof__db_close(&db);

    free(path);
    tmpdir_free(dir);
    free(ctx);
}

/* --------------------------------------------------------------- records */

typedef struct collect {
    int n;
    char keys[8][33];
    int stop_after;
    stof_db *db;  /* when set, the callback stores a record (re-entry) */
} collect;

static int collect_cb(void *user, const stof_db_record *r)
{
    collect *c = user;
    if (c->n < 8)
        snprintf(c->keys[c->n], 33, "%s", r->key);
    c->n++;
    if (c->db) {
        stof_db_record x;
        record_fill(&x, 900 + (uint64_t)c->n, 16);
        if (stof__db_store(c->db, &x, 0, 0) != STOF_OK)
            c->n += 1000;
        stof__db_record_clear(&x);
    }
    return c->stop_after && c->n >= c->stop_after;
}

Test(db, every_field_survives_a_round_trip)
{
    char *dir = tmpdir_new();
    /* A name with the characters a URI reserves. */
    char *path = path_join(dir, "odd name ?#%20&mode=ro.db");
    logcap lc;
    stof_context *ctx = ctx_new(&lc);
    stof_db *db = db_open(ctx, path, NULL);

    stof_db_record a, b;
    record_fill(&a, 42, 300000); /* spans many overflow pages */
    /* Strings at their longest. */
    memset(a.mask_spec, 'x', sizeof(a.mask_spec) - 1);
    memset(a.config, 'c', sizeof(a.config) - 1);
    a.config[0] = '{';
    a.config[sizeof(a.config) - 2] = '}';
    memset(a.measured, 'm', sizeof(a.measured) - 1);
    memset(a.device_name, 'd', sizeof(a.device_name) - 1);
    memset(a.host, 'h', sizeof(a.host) - 1);
    a.time_ms = 0.123456789012345;
    a.runner_up_ms = 0.0;
    a.model_ms = 1e-9;
    a.created_at = (int64_t)1 << 40;
    cr_assert_eq(stof__db_store(db, &a, 0, 0), STOF_OK, "%s", stof_errmsg(ctx));
    stof__db_close(&db);

    db = db_open(ctx, path, NULL);
    cr_assert_eq(stof__db_lookup(db, a.key, &b), STOF_OK, "%s",
                 stof_errmsg(ctx));
    assert_record_eq(&b, &a);
    cr_assert_str_eq(b.source, "user");
    cr_assert_eq(b.hits, 1, "hits %lld", (long long)b.hits);
    stof__db_record_clear(&b);
    cr_assert_eq(b.cubin, NULL);
    cr_assert_eq(stof__db_lookup(db, a.key, &b), STOF_OK);
    cr_assert_eq(b.hits, 2);
    stof__db_record_clear(&b);

    /* No cubin (a layer record), and a record without host or time stamp
     * gets both. */
    stof_db_record c;
    record_fill(&c, 43, 0);
    snprintf(c.op, sizeof(c.op), "layer");
    c.host[0] = '\0';
    c.created_at = 0;
    cr_assert_eq(stof__db_store(db, &c, 0, 0), STOF_OK, "%s", stof_errmsg(ctx));
    cr_assert_eq(stof__db_lookup(db, c.key, &b), STOF_OK);
    cr_assert_null(b.cubin);
    cr_assert_eq(b.cubin_size, 0);
    char host[64] = "";
    gethostname(host, sizeof(host) - 1);
    cr_assert_str_eq(b.host, host);
    cr_assert(b.created_at >= (int64_t)time(NULL) - 60);
    stof__db_record_clear(&b);

    /* Bad records are refused with a message. */
    c.key[0] = '\0';
    cr_assert_eq(stof__db_store(db, &c, 0, 0), STOF_ERR_INVALID_ARGUMENT);
    make_key(c.key, 43);
    c.time_ms = 0.0 / 0.0;
    cr_assert_eq(stof__db_store(db, &c, 0, 0), STOF_ERR_INVALID_ARGUMENT);
    cr_assert(strstr(stof_errmsg(ctx), "finite"), "%s", stof_errmsg(ctx));
    c.time_ms = 1.0;
    c.cubin_size = 10;
    cr_assert_eq(stof__db_store(db, &c, 0, 0), STOF_ERR_INVALID_ARGUMENT);
    c.cubin_size = 0;
    cr_assert_eq(stof__db_lookup(db, "", &b), STOF_ERR_INVALID_ARGUMENT);
    cr_assert_eq(stof__db_lookup(db, NULL, &b), STOF_ERR_INVALID_ARGUMENT);

    /* foreach: key order, every record once, stop, and re-entry. */
    collect col = {0};
    cr_assert_eq(stof__db_foreach(db, 0, collect_cb, &col), STOF_OK);
    cr_assert_eq(col.n, 2);
    cr_assert(strcmp(col.keys[0], col.keys[1]) < 0);
    memset(&col, 0, sizeof(col));
    col.stop_after = 1;
    cr_assert_eq(stof__db_foreach(db, 0, collect_cb, &col), STOF_OK);
    cr_assert_eq(col.n, 1);
    memset(&col, 0, sizeof(col));
    col.db = db;
    cr_assert_eq(stof__db_foreach(db, 0, collect_cb, &col), STOF_OK);
    cr_assert(col.n >= 2 && col.n < 1000, "n = %d", col.n);
    int n = 0;
    cr_assert_eq(stof__db_foreach(db, 0, count_cb, &n), STOF_OK);
    cr_assert(n >= 4, "%d records", n);

    stof__db_record_clear(&a);
    stof__db_record_clear(&c);
    stof__db_close(&db);
    cr_assert_eq(lc.n_warn, 0, "%s", lc.text);
    struct stat sb;
    cr_assert_eq(stat(path, &sb), 0, "the file name was not kept");
    free(path);
    tmpdir_free(dir);
    free(ctx);
}

Test(db, replace_rule)
{
    one_db f;
    one_db_open(&f);
    stof_context *ctx = f.ctx;
    stof_db *db = f.db;
    stof_db_record r, out;
    record_fill(&r, 7, 64);

#define STORE(t, v, rep, cfg)                                                  \
    do {                                                                       \
        r.time_ms = (t);                                                       \
        r.verified = (v);                                                      \
        snprintf(r.config, sizeof(r.config), "%s", (cfg));                     \
        cr_assert_eq(stof__db_store(db, &r, (rep), 0), STOF_OK, "%s",             \
                     stof_errmsg(ctx));                                        \
    } while (0)
#define EXPECT(t, v, cfg)                                                      \
    do {                                                                       \
        cr_assert_eq(stof__db_lookup(db, r.key, &out), STOF_OK);               \
        cr_assert_eq(out.time_ms, (t), "time %g", out.time_ms);                \
        cr_assert_eq(out.verified, (v));                                       \
        cr_assert_str_eq(out.config, (cfg));                                   \
        stof__db_record_clear(&out);                                           \
    } while (0)

    STORE(2.0, 1, 0, "{first}");
    EXPECT(2.0, 1, "{first}");
    STORE(3.0, 1, 0, "{slower}");          /* slower verified: kept out */
    EXPECT(2.0, 1, "{first}");
    STORE(2.0, 1, 0, "{tie}");             /* a tie does not replace */
    EXPECT(2.0, 1, "{first}");
    STORE(1.5, 1, 0, "{faster}");          /* faster verified: replaces */
    EXPECT(1.5, 1, "{faster}");
    STORE(0.5, 0, 0, "{unverified}");      /* unverified never replaces */
    EXPECT(1.5, 1, "{faster}");
    STORE(0.5, 0, 1, "{forced}");          /* ... unless replace is set */
    EXPECT(0.5, 0, "{forced}");
    STORE(0.1, 0, 0, "{unverified2}");     /* unverified over unverified: no */
    EXPECT(0.5, 0, "{forced}");
    STORE(9.0, 1, 0, "{verified-slow}");   /* verified beats unverified */
    EXPECT(9.0, 1, "{verified-slow}");
    STORE(20.0, 1, 1, "{forced-slow}");    /* replace forces a slower one */
    EXPECT(20.0, 1, "{forced-slow}");

    /* Replacing keeps the hit count: 9 lookups above, one more now. */
    cr_assert_eq(stof__db_lookup(db, r.key, &out), STOF_OK);
    cr_assert_eq(out.hits, 10, "hits %lld", (long long)out.hits);
    stof__db_record_clear(&out);
#undef STORE
#undef EXPECT
    stof__db_record_clear(&r);
    one_db_close(&f);
}

/* A record read and checked once is served again from memory while the
 * database still stores it under the same content hash: the same record,
 * cubin and all, and hits still counted. Bytes changed behind the handle
 * under the old hash are never served (the checked copy is; a new handle
 * rejects the row), a changed hash or a deleted row is read afresh. */
Test(db, lookups_served_again_only_while_unchanged)
{
    one_db f;
    one_db_open(&f);
    stof_context *ctx = f.ctx;
    stof_db *db = f.db;
    stof_db_record r, a, b;
    record_fill(&r, 11, 4096);
    cr_assert_eq(stof__db_store(db, &r, 0, 0), STOF_OK, "%s",
                 stof_errmsg(ctx));
    cr_assert_eq(stof__db_lookup(db, r.key, &a), STOF_OK);
    assert_record_eq(&a, &r);
    for (int i = 0; i < 3; i++) {
        cr_assert_eq(stof__db_lookup(db, r.key, &b), STOF_OK);
        assert_record_eq(&b, &r);
        cr_assert_eq(b.hits, a.hits + 1 + i, "hits %lld",
                     (long long)b.hits);
        cr_assert_str_eq(b.source, "user");
        stof__db_record_clear(&b);
    }
    /* The cubin zeroed behind the handle, the hash left as it was. */
    sqlite3 *c = raw_open(f.path, SQLITE_OPEN_READWRITE);
    char sql[256];
    snprintf(sql, sizeof(sql),
             "UPDATE records SET cubin = zeroblob(4096) WHERE key = '%s'",
             r.key);
    cr_assert_eq(sqlite3_exec(c, sql, NULL, NULL, NULL), SQLITE_OK);
    cr_assert_eq(stof__db_lookup(db, r.key, &b), STOF_OK);
    assert_record_eq(&b, &r); /* the checked bytes, not the zeros */
    stof__db_record_clear(&b);
    stof_db *db2 = db_open(ctx, f.path, NULL);
    cr_assert_eq(stof__db_lookup(db2, r.key, &b), STOF_ERR_NOT_FOUND);
    stof__db_close(&db2);
    /* A new hash: read again, checked, rejected. */
    snprintf(sql, sizeof(sql),
             "UPDATE records SET content_hash = '%032d' WHERE key = '%s'", 0,
             r.key);
    cr_assert_eq(sqlite3_exec(c, sql, NULL, NULL, NULL), SQLITE_OK);
    cr_assert_eq(stof__db_lookup(db, r.key, &b), STOF_ERR_NOT_FOUND);
    /* Stored again (replacing), then deleted. */
    cr_assert_eq(stof__db_store(db, &r, 1, 0), STOF_OK, "%s",
                 stof_errmsg(ctx));
    cr_assert_eq(stof__db_lookup(db, r.key, &b), STOF_OK);
    assert_record_eq(&b, &r);
    stof__db_record_clear(&b);
    snprintf(sql, sizeof(sql), "DELETE FROM records WHERE key = '%s'", r.key);
    cr_assert_eq(sqlite3_exec(c, sql, NULL, NULL, NULL), SQLITE_OK);
    cr_assert_eq(stof__db_lookup(db, r.key, &b), STOF_ERR_NOT_FOUND);
    sqlite3_close(c);
    stof__db_record_clear(&a);
    stof__db_record_clear(&r);
    one_db_close(&f);
}

/* A lazy lookup served from memory leaves the cubin there: the record
 * without its bytes but with their size and XXH3-64 (what a warm plan
 * finds its loaded module by); read from the file it comes whole. The
 * whole record read again counts no second hit; a row stored again is
 * served with its new bytes' hash; small cubins come along. */
Test(db, lazy_lookups_leave_the_cubin_in_memory)
{
    one_db f;
    one_db_open(&f);
    stof_context *ctx = f.ctx;
    stof_db *db = f.db;
    stof_db_record r, a, b;
    record_fill(&r, 12, 8192);
    cr_assert_eq(stof__db_store(db, &r, 0, 0), STOF_OK, "%s",
                 stof_errmsg(ctx));
    /* from the file (a handle that has not read it yet): whole */
    stof_db *db2 = db_open(ctx, f.path, NULL);
    cr_assert_eq(stof__db_lookup_lazy(db2, r.key, &a), STOF_OK);
    cr_assert_not_null(a.cubin);
    assert_record_eq(&a, &r);
    stof__db_close(&db2);
    /* from memory (the store kept it there), without the bytes */
    cr_assert_eq(stof__db_lookup(db, r.key, &a), STOF_OK);
    cr_assert_eq(stof__db_lookup_lazy(db, r.key, &b), STOF_OK);
    cr_expect_null(b.cubin);
    cr_expect_eq(b.cubin_size, r.cubin_size);
    cr_expect_eq(b.cubin_xxh3, XXH3_64bits(r.cubin, r.cubin_size));
    cr_expect_str_eq(b.content_hash, a.content_hash);
    cr_expect_str_eq(b.config, r.config);
    cr_expect_eq(b.hits, a.hits + 1, "hits %lld", (long long)b.hits);
    const int64_t hits = b.hits;
    stof__db_record_clear(&b);
    /* whole again: the bytes, no hit counted */
    cr_assert_eq(stof__db_lookup_again(db, r.key, &b), STOF_OK);
    cr_assert_not_null(b.cubin);
    assert_record_eq(&b, &r);
    stof__db_record_clear(&b);
    cr_assert_eq(stof__db_lookup(db, r.key, &b), STOF_OK);
    cr_expect_eq(b.hits, hits + 1, "hits %lld", (long long)b.hits);
    stof__db_record_clear(&b);
    /* a changed row (other bytes, so another content hash): whole */
    ((unsigned char *)r.cubin)[7] ^= 0x5a;
    cr_assert_eq(stof__db_store(db, &r, 1, 0), STOF_OK, "%s",
                 stof_errmsg(ctx));
    cr_assert_eq(stof__db_lookup_lazy(db, r.key, &b), STOF_OK);
    cr_expect_eq(b.cubin_xxh3, XXH3_64bits(r.cubin, r.cubin_size));
    cr_expect_str_neq(b.content_hash, a.content_hash);
    stof__db_record_clear(&b);
    /* and whole from the file in a handle that has not read it */
    db2 = db_open(ctx, f.path, NULL);
    cr_assert_eq(stof__db_lookup_lazy(db2, r.key, &b), STOF_OK);
    cr_assert_not_null(b.cubin);
    assert_record_eq(&b, &r);
    stof__db_record_clear(&b);
    stof__db_close(&db2);
    stof__db_record_clear(&a);
    stof__db_record_clear(&r);
    /* a small cubin (cuBLASLt's algorithm bytes) comes along */
    record_fill(&r, 13, 64);
    cr_assert_eq(stof__db_store(db, &r, 0, 0), STOF_OK, "%s",
                 stof_errmsg(ctx));
    cr_assert_eq(stof__db_lookup(db, r.key, &a), STOF_OK);
    cr_assert_eq(stof__db_lookup_lazy(db, r.key, &b), STOF_OK);
    cr_assert_not_null(b.cubin);
    assert_record_eq(&b, &r);
    stof__db_record_clear(&b);
    stof__db_record_clear(&a);
    stof__db_record_clear(&r);
    one_db_close(&f);
}

/* Hits are counted in memory (a lookup writes nothing, however many keys
 * wait) and written in one transaction when a record is stored and when
 * the database closes. */
Test(db, hits_are_written_together)
{
    char *dir = tmpdir_new();
    char *path = path_join(dir, "tuning.db");
    logcap lc;
    stof_context *ctx = ctx_new(&lc);
    stof_db *db = db_open(ctx, path, NULL);
    enum { NK = 70 };
    stof_db_record r, out;
    for (int k = 0; k < NK; k++) {
        record_fill(&r, 1000 + k, 16);
        cr_assert_eq(stof__db_store(db, &r, 0, 0), STOF_OK, "%s",
                     stof_errmsg(ctx));
        stof__db_record_clear(&r);
    }
    record_fill(&r, 1000, 16);
    char key0[sizeof(r.key)];
    snprintf(key0, sizeof(key0), "%s", r.key);
    stof__db_record_clear(&r);
    sqlite3 *c = raw_open(path, SQLITE_OPEN_READONLY);
    for (int i = 1; i <= 3; i++) {
        cr_assert_eq(stof__db_lookup(db, key0, &out), STOF_OK);
        cr_assert_eq(out.hits, i, "hits %lld", (long long)out.hits);
        stof__db_record_clear(&out);
    }
    cr_assert_eq(raw_int(c, "SELECT sum(hits) FROM records"), 0,
                 "a lookup wrote its hit");
    /* 63 more keys: still nothing written by a lookup... */
    for (int k = 1; k < 64; k++) {
        record_fill(&r, 1000 + k, 16);
        cr_assert_eq(stof__db_lookup(db, r.key, &out), STOF_OK);
        stof__db_record_clear(&out);
        stof__db_record_clear(&r);
    }
    cr_assert_eq(raw_int(c, "SELECT sum(hits) FROM records"), 0,
                 "a lookup wrote the hits");
    /* ... until a record is stored (a tuning writes anyway). */
    record_fill(&r, 2000, 16);
    cr_assert_eq(stof__db_store(db, &r, 0, 0), STOF_OK, "%s",
                 stof_errmsg(ctx));
    stof__db_record_clear(&r);
    cr_assert_eq(raw_int(c, "SELECT sum(hits) FROM records"), 66);
    /* After the write a lookup counts the row's hits and its own. */
    cr_assert_eq(stof__db_lookup(db, key0, &out), STOF_OK);
    cr_assert_eq(out.hits, 4, "hits %lld", (long long)out.hits);
    stof__db_record_clear(&out);
    cr_assert_eq(raw_int(c, "SELECT sum(hits) FROM records"), 66);
    stof__db_close(&db);
    cr_assert_eq(raw_int(c, "SELECT sum(hits) FROM records"), 67);
    sqlite3_close(c);
    stof_close(&ctx);
    free(path);
    tmpdir_free(dir);
}

/* A plan's own writes (a cache-only miss, the trust of a verified record)
 * do not wait the busy timeout's 10 s while another connection holds the
 * write lock (an import, a tuner's commit): they give up after a short
 * wait (the trust stays in memory) and succeed once the lock is free. */
Test(db, writes_on_a_plans_path_do_not_wait_for_a_busy_database)
{
    char *dir = tmpdir_new();
    char *path = path_join(dir, "tuning.db");
    logcap lc;
    stof_context *ctx = ctx_new(&lc);
    stof_db *db = db_open(ctx, path, NULL);
    stof_db_record r;
    record_fill(&r, 4242, 16);
    cr_assert_eq(stof__db_store(db, &r, 0, 0), STOF_OK, "%s", stof_errmsg(ctx));
    stof_db_record got;
    cr_assert_eq(stof__db_lookup(db, r.key, &got), STOF_OK);
    sqlite3 *c = raw_open(path, SQLITE_OPEN_READWRITE);
    cr_assert_eq(sqlite3_exec(c, "BEGIN IMMEDIATE", NULL, NULL, NULL), SQLITE_OK);
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    (void)stof__db_record_miss(db, "k-busy", "{}", NULL, 0);
    stof__db_trust(db, &got); /* kept in memory */
    clock_gettime(CLOCK_MONOTONIC, &t1);
    const double s_waited = (double)(t1.tv_sec - t0.tv_sec) +
                            (double)(t1.tv_nsec - t0.tv_nsec) * 1e-9;
    cr_expect_lt(s_waited, 2.0, "a plan's writes waited %.2f s for the lock",
                 s_waited);
    cr_expect(stof__db_trusted(db, &got), "trusted for this process");
    cr_assert_eq(sqlite3_exec(c, "COMMIT", NULL, NULL, NULL), SQLITE_OK);
    cr_expect_eq(stof__db_record_miss(db, "k-free", "{}", NULL, 0), STOF_OK);
    cr_expect_eq(raw_int(c, "SELECT count(*) FROM misses WHERE key = 'k-free'"), 1);
    stof__db_record_clear(&got);
    stof__db_record_clear(&r);
    sqlite3_close(c);
    stof__db_close(&db);
    stof_close(&ctx);
    free(path);
    tmpdir_free(dir);
}

/* A system database a server opened immutable (WAL, no -wal file beside
 * it) and that is then updated in place (an import into it while the
 * server runs): its lookups see the new records, no "malformed" warning. */
Test(db, an_immutable_system_database_changed_on_disk_is_reopened)
{
    char *dir = tmpdir_new();
    char *user = path_join(dir, "user.db");
    char *sys = path_join(dir, "team.db");
    make_db(sys, 100, 100, 128, "{old}");
    logcap lc;
    stof_context *ctx = ctx_new(&lc);
    const char *sysv[] = {sys, NULL};
    stof_db *db = db_open(ctx, user, sysv);
    cr_assert(db->layers[1].immutable, "the system database was not opened "
              "immutable: %s", lc.text);
    char k[33];
    stof_db_record r;
    for (int i = 0; i < 100; i += 9) {
        make_key(k, 100 + (uint64_t)i);
        cr_assert_eq(stof__db_lookup(db, k, &r), STOF_OK);
        stof__db_record_clear(&r);
    }
    make_db(sys, 1000, 300, 128, "{new}"); /* another process, in place */
    int hits = 0;
    for (int i = 0; i < 300; i++) {
        make_key(k, 1000 + (uint64_t)i);
        if (stof__db_lookup(db, k, &r) == STOF_OK) {
            hits++;
            cr_expect_str_eq(r.config, "{new}");
            stof__db_record_clear(&r);
        }
    }
    cr_expect_eq(hits, 300, "%d of the 300 new records seen", hits);
    for (int i = 0; i < 100; i += 7) {
        make_key(k, 100 + (uint64_t)i);
        cr_expect_eq(stof__db_lookup(db, k, &r), STOF_OK);
        stof__db_record_clear(&r);
    }
    cr_expect(!strstr(lc.text, "malformed"), "%s", lc.text);
    /* Copied over in two steps (cp truncates first): a lookup between them
     * finds no usable file; once the copy is whole it is used again. */
    char *other = path_join(dir, "other.db");
    make_db(other, 5000, 40, 128, "{copied}");
    size_t n = 0;
    unsigned char *bytes = read_file(other, &n);
    FILE *f = fopen(sys, "wb");
    cr_assert_not_null(f);
    fclose(f);
    make_key(k, 5000);
    cr_expect_neq(stof__db_lookup(db, k, &r), STOF_OK, "an empty file served");
    f = fopen(sys, "wb");
    cr_assert_not_null(f);
    cr_assert_eq(fwrite(bytes, 1, n, f), n);
    fclose(f);
    free(bytes);
    hits = 0;
    for (int i = 0; i < 40; i++) {
        make_key(k, 5000 + (uint64_t)i);
        if (stof__db_lookup(db, k, &r) == STOF_OK) {
            hits++;
            stof__db_record_clear(&r);
        }
    }
    cr_expect_eq(hits, 40, "%d of the copied file's 40 records seen", hits);
    free(other);
    stof__db_close(&db);
    stof_close(&ctx);
    free(user);
    free(sys);
    tmpdir_free(dir);
}

/* A layer's records as one unit (stof__db_store_unit): its lead (the
 * scheme) decides for all. Three tuners store units over the same keys in
 * turn, through their own handles: a unit whose scheme is slower than the
 * stored one leaves nothing of its own (not even its faster kernels: they
 * would be paired with the other's scheme), a faster one replaces every
 * record, and a unit that fails half way leaves nothing. */
static void unit_fill(stof_db_record u[3], uint64_t seed, double kernel_ms,
                      double scheme_ms)
{
    for (int i = 0; i < 3; i++) {
        record_fill(&u[i], seed + (uint64_t)i, 16);
        make_key(u[i].key, 777 + (uint64_t)i); /* the same keys every time */
        u[i].time_ms = i < 2 ? kernel_ms : scheme_ms;
        snprintf(u[i].config, sizeof(u[i].config), "{\"unit\": %llu}",
                 (unsigned long long)seed);
    }
}

static void unit_expect(stof_db *db, uint64_t seed, const char *what)
{
    char want[64];
    snprintf(want, sizeof(want), "{\"unit\": %llu}", (unsigned long long)seed);
    for (int i = 0; i < 3; i++) {
        char k[33];
        make_key(k, 777 + (uint64_t)i);
        stof_db_record r;
        cr_assert_eq(stof__db_lookup(db, k, &r), STOF_OK, "%s", what);
        cr_expect_str_eq(r.config, want, "%s: record %d", what, i);
        stof__db_record_clear(&r);
    }
}

/* Store the unit of seed (its second record made invalid when `broken`)
 * through db. */
static stof_status unit_store(stof_db *db, uint64_t seed, double kernel_ms,
                              double scheme_ms, int replace, int broken)
{
    stof_db_record u[3];
    unit_fill(u, seed, kernel_ms, scheme_ms);
    if (broken)
        u[1].time_ms = 1.0 / 0.0;
    const stof_status st = stof__db_store_unit(db, u, 3, 2, replace, 1);
    for (int i = 0; i < 3; i++)
        stof__db_record_clear(&u[i]);
    return st;
}

Test(db, a_layers_records_are_stored_as_one_unit)
{
    char *dir = tmpdir_new();
    char *path = path_join(dir, "tuning.db");
    logcap la, lb;
    stof_context *ca = ctx_new(&la), *cb = ctx_new(&lb);
    stof_db *a = db_open(ca, path, NULL), *b = db_open(cb, path, NULL);
    cr_assert_eq(unit_store(a, 100, 1.0, 2.0, 0, 0), STOF_OK, "%s",
                 stof_errmsg(ca));
    unit_expect(b, 100, "the first unit");
    /* Faster kernels, a slower scheme: nothing of it. */
    cr_assert_eq(unit_store(b, 200, 0.5, 3.0, 0, 0), STOF_OK, "%s",
                 stof_errmsg(cb));
    unit_expect(a, 100, "a slower scheme's unit");
    /* Slower kernels, a faster scheme: all of it. */
    cr_assert_eq(unit_store(a, 300, 4.0, 1.5, 0, 0), STOF_OK, "%s",
                 stof_errmsg(ca));
    unit_expect(b, 300, "a faster scheme's unit");
    /* A unit that fails on its second record: nothing of it, even with
     * replace set. */
    cr_assert_neq(unit_store(b, 400, 0.1, 0.2, 1, 1), STOF_OK);
    unit_expect(a, 300, "a failed unit");
    /* replace: a slower unit replaces all. */
    cr_assert_eq(unit_store(b, 500, 9.0, 9.0, 1, 0), STOF_OK, "%s",
                 stof_errmsg(cb));
    unit_expect(a, 500, "a replacing unit");
    stof__db_close(&a);
    stof__db_close(&b);
    stof_close(&ca);
    stof_close(&cb);
    free(path);
    tmpdir_free(dir);
}

/* ---------------------------------------------------------------- preload */

/* Record `seed` made on env's GPU and build, with the cubin of record
 * cubin_seed (cubin_size bytes; 0: none). */
static void preload_record(stof_db_record *r, const stof_db_record *env,
                           int seed, int cubin_seed, size_t cubin_size)
{
    record_fill(r, (uint64_t)seed, 0);
    memcpy(r->device_name, env->device_name, sizeof(r->device_name));
    memcpy(r->template_hash, env->template_hash, sizeof(r->template_hash));
    if (cubin_size) {
        stof_db_record c;
        record_fill(&c, (uint64_t)cubin_seed, cubin_size);
        r->cubin = c.cubin;
        r->cubin_size = c.cubin_size;
    }
}

/* What stof_preload would load: the distinct cubins of records made on
 * this GPU and build, over every layer, most used first; records of
 * another GPU or template version, cuBLASLt algorithms and records that
 * fail their integrity check are left out. */
Test(db, preload_picks_this_gpus_modules_most_used_first)
{
    char *dir = tmpdir_new();
    char *user = path_join(dir, "user.db");
    char *sys1 = path_join(dir, "sys1.db");
    logcap lc;
    stof_context *ctx = ctx_new(&lc);
    stof_db_record env, r;
    record_fill(&env, 1, 0);
    /* seed: {cubin seed, hits, how it differs from env} */
    enum { SAME, OTHER_GPU, OTHER_TEMPLATES, CUBLASLT, TAMPERED, NO_CUBIN };
    static const struct {
        int seed, cubin, hits, how;
    } recs[] = {
        {10, 100, 5, SAME},  {11, 100, 2, SAME},   /* one cubin: 7 hits */
        {12, 101, 9, SAME},  {13, 102, 0, SAME},   /* 9, then 0 */
        {14, 103, 90, OTHER_GPU}, {15, 104, 80, OTHER_TEMPLATES},
        {16, 105, 70, CUBLASLT}, {17, 106, 60, TAMPERED},
        {18, 107, 50, NO_CUBIN},
    };
    stof_db *db = db_open(ctx, user, NULL);
    for (size_t i = 0; i < sizeof(recs) / sizeof(*recs); i++) {
        preload_record(&r, &env, recs[i].seed, recs[i].cubin,
                       recs[i].how == NO_CUBIN ? 0
                                               : 256 + recs[i].cubin % 2);
        if (recs[i].how == OTHER_GPU)
            snprintf(r.device_name, sizeof(r.device_name), "NVIDIA H200");
        if (recs[i].how == OTHER_TEMPLATES)
            snprintf(r.template_hash, sizeof(r.template_hash), "%016x", 7);
        if (recs[i].how == CUBLASLT)
            snprintf(r.kernel, sizeof(r.kernel), "cublaslt");
        if (recs[i].how == NO_CUBIN) /* (a layer's scheme: no module) */
            snprintf(r.op, sizeof(r.op), "layer");
        cr_assert_eq(stof__db_store(db, &r, 0, 0), STOF_OK, "%s",
                     stof_errmsg(ctx));
        stof__db_record_clear(&r);
    }
    stof__db_close(&db);
    /* A system database: a newer record of its own cubin, no hits. */
    {
        stof_db *s = db_open(ctx, sys1, NULL);
        preload_record(&r, &env, 19, 108, 300);
        r.created_at = env.created_at + 1000;
        cr_assert_eq(stof__db_store(s, &r, 0, 0), STOF_OK, "%s",
                     stof_errmsg(ctx));
        stof__db_record_clear(&r);
        stof__db_close(&s);
    }
    sqlite3 *c = raw_open(user, SQLITE_OPEN_READWRITE);
    for (size_t i = 0; i < sizeof(recs) / sizeof(*recs); i++) {
        char key[33], sql[160];
        make_key(key, (uint64_t)recs[i].seed);
        snprintf(sql, sizeof(sql),
                 "UPDATE records SET hits = %d%s WHERE key = '%s'",
                 recs[i].hits,
                 recs[i].how == TAMPERED ? ", time_ms = 0.001" : "", key);
        cr_assert_eq(sqlite3_exec(c, sql, NULL, NULL, NULL), SQLITE_OK);
    }
    sqlite3_close(c);

    const char *sys[] = {sys1, NULL};
    db = db_open(ctx, user, sys);
    uint64_t hash[8];
    size_t size[8];
    int bad = -1;
    int lt = -1;
    int n = stof__preload_pick(ctx, db, &env, 8, hash, size, &bad, &lt);
    cr_assert_eq(n, 4, "picked %d", n);
    cr_expect_eq(bad, 1, "%d records failed the check", bad);
    cr_expect_eq(lt, 1, "%d cuBLASLt records", lt);
    /* Expected: cubins 101 (9 hits), 100 (7), then with no hits the newer
     * first: 108 (the system database's), 102. */
    static const int order[] = {101, 100, 108, 102};
    for (int i = 0; i < n; i++) {
        stof_db_record e;
        record_fill(&e, (uint64_t)order[i],
                    order[i] == 108 ? 300 : 256 + order[i] % 2);
        cr_expect_eq(hash[i], XXH3_64bits(e.cubin, e.cubin_size),
                     "pick %d is not cubin %d", i, order[i]);
        cr_expect_eq(size[i], e.cubin_size);
        stof__db_record_clear(&e);
    }
    /* At most max. */
    cr_assert_eq(stof__preload_pick(ctx, db, &env, 1, hash, size, NULL, NULL), 1);
    stof_db_record e;
    record_fill(&e, 101, 257);
    cr_expect_eq(hash[0], XXH3_64bits(e.cubin, e.cubin_size));
    stof__db_record_clear(&e);
    /* Another GPU's view: only its one record. */
    snprintf(env.device_name, sizeof(env.device_name), "NVIDIA H200");
    cr_assert_eq(stof__preload_pick(ctx, db, &env, 8, hash, size, NULL, NULL), 1);
    stof__db_close(&db);
    stof_close(&ctx);
    free(user);
    free(sys1);
    tmpdir_free(dir);
}

/* --------------------------------------------------------------- layering */

Test(db, user_over_two_system_databases)
{
    char *dir = tmpdir_new();
    char *user = path_join(dir, "user.db");
    char *sys1 = path_join(dir, "sys1.db");
    char *sys2 = path_join(dir, "sys2.db");
    /* Keys: seed 1 in sys1 and sys2, 2 in sys1 and user, 3 in sys2 only. */
    make_db(sys1, 1, 2, 128, "{sys1}");
    make_db(sys2, 1, 1, 128, "{sys2}");
    make_db(sys2, 3, 1, 128, "{sys2}");
    make_db(user, 2, 1, 128, "{user}");
    size_t n1, n2;
    unsigned char *before1 = read_file(sys1, &n1);
    unsigned char *before2 = read_file(sys2, &n2);

    logcap lc;
    stof_context *ctx = ctx_new(&lc);
    const char *sys[] = {sys1, sys2, NULL};
    stof_db *db = db_open(ctx, user, sys);
    cr_assert(stof__db_writable(db));
    cr_assert_eq(lc.n_warn, 0, "%s", lc.text);

    char k1[33], k2[33], k3[33], k4[33];
    make_key(k1, 1);
    make_key(k2, 2);
    make_key(k3, 3);
    make_key(k4, 4);
    stof_db_record r;
    cr_assert_eq(stof__db_lookup(db, k1, &r), STOF_OK);
    cr_assert_str_eq(r.config, "{sys1}", "the first system database wins");
    cr_assert_str_eq(r.source, "system");
    cr_assert_eq(r.hits, 0, "a system hit is not counted");
    cr_assert_eq(r.cubin_size, 128);
    stof__db_record_clear(&r);
    cr_assert_eq(stof__db_lookup(db, k2, &r), STOF_OK);
    cr_assert_str_eq(r.config, "{user}", "the user database wins");
    cr_assert_str_eq(r.source, "user");
    stof__db_record_clear(&r);
    cr_assert_eq(stof__db_lookup(db, k3, &r), STOF_OK);
    cr_assert_str_eq(r.config, "{sys2}");
    cr_assert_str_eq(r.source, "system");
    stof__db_record_clear(&r);
    cr_assert_eq(stof__db_lookup(db, k4, &r), STOF_ERR_NOT_FOUND);

    /* A store goes to the user database and then shadows the systems. */
    record_fill(&r, 1, 16);
    snprintf(r.config, sizeof(r.config), "{mine}");
    r.time_ms = 1000.0; /* slower than the system record: still stored */
    cr_assert_eq(stof__db_store(db, &r, 0, 0), STOF_OK, "%s", stof_errmsg(ctx));
    stof__db_record_clear(&r);
    cr_assert_eq(stof__db_lookup(db, k1, &r), STOF_OK);
    cr_assert_str_eq(r.config, "{mine}");
    cr_assert_str_eq(r.source, "user");
    stof__db_record_clear(&r);

    /* foreach per layer. */
    int n = 0;
    cr_assert_eq(stof__db_foreach(db, 0, count_cb, &n), STOF_OK);
    cr_assert_eq(n, 2);
    n = 0;
    cr_assert_eq(stof__db_foreach(db, 1, count_cb, &n), STOF_OK);
    cr_assert_eq(n, 2);
    n = 0;
    cr_assert_eq(stof__db_foreach(db, 2, count_cb, &n), STOF_OK);
    cr_assert_eq(n, 2);
    cr_assert_eq(stof__db_foreach(db, 3, count_cb, &n),
                 STOF_ERR_INVALID_ARGUMENT);
    cr_assert_eq(stof__db_foreach(db, -1, count_cb, &n),
                 STOF_ERR_INVALID_ARGUMENT);
    stof__db_close(&db);

    /* The system databases were never written. */
    size_t m1, m2;
    unsigned char *after1 = read_file(sys1, &m1);
    unsigned char *after2 = read_file(sys2, &m2);
    cr_assert(n1 == m1 && memcmp(before1, after1, n1) == 0);
    cr_assert(n2 == m2 && memcmp(before2, after2, n2) == 0);
    sqlite3 *c = raw_open(sys1, SQLITE_OPEN_READONLY);
    cr_assert_eq(raw_int(c, "SELECT count(*) FROM records"), 2);
    cr_assert_eq(raw_int(c, "SELECT sum(hits) FROM records"), 0);
    sqlite3_close(c);

    /* Without a user database the systems still serve. */
    db = db_open(ctx, "", sys);
    cr_assert(!stof__db_writable(db));
    cr_assert_eq(stof__db_lookup(db, k2, &r), STOF_OK);
    cr_assert_str_eq(r.config, "{sys1}");
    stof__db_record_clear(&r);
    stof__db_close(&db);

    /* A missing system database is a warning, not a failure. */
    char *none = path_join(dir, "nope/none.db");
    const char *sys_bad[] = {none, "", sys2, NULL};
    log_reset(&lc);
    db = db_open(ctx, user, sys_bad);
    cr_assert(log_has_warn(&lc, none), "%s", lc.text);
    cr_assert(log_has_warn(&lc, "empty path"), "%s", lc.text);
    cr_assert_eq(stof__db_lookup(db, k3, &r), STOF_OK);
    stof__db_record_clear(&r);
    cr_assert_eq(stof__db_foreach(db, 1, count_cb, &n), STOF_ERR_DATABASE);
    cr_assert(strstr(stof_errmsg(ctx), none), "%s", stof_errmsg(ctx));
    stof__db_close(&db);
    struct stat sb;
    cr_assert_neq(stat(none, &sb), 0, "a system database was created");

    free(none);
    free(before1);
    free(before2);
    free(after1);
    free(after2);
    free(user);
    free(sys1);
    free(sys2);
    tmpdir_free(dir);
    free(ctx);
}

Test(db, default_path_from_the_environment)
{
    char *dir = tmpdir_new();
    char buf[4096];

    cr_assert_eq(setenv("STOF_USER_DB", "/x/y/my.db", 1), 0);
    cr_assert_eq(setenv("XDG_CACHE_HOME", "/xdg", 1), 0);
    cr_assert_eq(setenv("HOME", "/home/u", 1), 0);
    cr_assert(stof__db_default_path(buf, sizeof(buf)));
    cr_assert_str_eq(buf, "/x/y/my.db");
    char small[8];
    cr_assert_eq(stof__db_default_path(small, sizeof(small)), 0,
                 "a path that does not fit is no path");

    cr_assert_eq(setenv("STOF_USER_DB", "", 1), 0); /* empty = unset */
    cr_assert(stof__db_default_path(buf, sizeof(buf)));
    cr_assert_str_eq(buf, "/xdg/stof/tuning.db");

    cr_assert_eq(unsetenv("STOF_USER_DB"), 0);
    cr_assert_eq(setenv("XDG_CACHE_HOME", "relative/dir", 1), 0);
    cr_assert(stof__db_default_path(buf, sizeof(buf)));
    cr_assert_str_eq(buf, "/home/u/.cache/stof/tuning.db",
                     "a relative XDG_CACHE_HOME is ignored");
    cr_assert_eq(unsetenv("XDG_CACHE_HOME"), 0);
    cr_assert(stof__db_default_path(buf, sizeof(buf)));
    cr_assert_str_eq(buf, "/home/u/.cache/stof/tuning.db");

    cr_assert_eq(unsetenv("HOME"), 0);
    cr_assert_eq(stof__db_default_path(buf, sizeof(buf)), 0);

    /* Opening with user_path NULL uses it (and creates the directories). */
    logcap lc;
    stof_context *ctx = ctx_new(&lc);
    stof_db *db = db_open(ctx, NULL, NULL);
    cr_assert(!stof__db_writable(db), "no path, no user database");
    stof__db_close(&db);

    cr_assert_eq(setenv("HOME", dir, 1), 0);
    db = db_open(ctx, NULL, NULL);
    cr_assert(stof__db_writable(db), "%s", lc.text);
    stof__db_close(&db);
    char *p = path_join(dir, ".cache/stof/tuning.db");
    struct stat sb;
    cr_assert_eq(stat(p, &sb), 0, "%s was not created", p);
    free(p);

    char *xdg = path_join(dir, "xdg");
    cr_assert_eq(setenv("XDG_CACHE_HOME", xdg, 1), 0);
    db = db_open(ctx, NULL, NULL);
    cr_assert(stof__db_writable(db));
    stof__db_close(&db);
    p = path_join(xdg, "stof/tuning.db");
    cr_assert_eq(stat(p, &sb), 0, "%s was not created", p);
    free(p);

    p = path_join(dir, "env/given.db");
    cr_assert_eq(setenv("STOF_USER_DB", p, 1), 0);
    db = db_open(ctx, NULL, NULL);
    cr_assert(stof__db_writable(db));
    stof__db_close(&db);
    cr_assert_eq(stat(p, &sb), 0, "%s was not created", p);
    free(p);

    cr_assert_eq(lc.n_warn, 0, "%s", lc.text);
    free(xdg);
    tmpdir_free(dir);
    free(ctx);
}

/* -------------------------------------------------------------- bad files */

/* A bad file used as the user database and as a system database: warned
 * about by name, skipped, lookups miss, the file is not modified, and the
 * good layers keep working. */
static void check_bad_file(const char *dir, const char *bad,
                           const char *what)
{
    char *good = path_join(dir, "good.db");
    struct stat sb;
    if (stat(good, &sb) != 0)
        make_db(good, 100, 3, 64, "{good}");
    char key_good[33], key_bad[33];
    make_key(key_good, 100);
    make_key(key_bad, 1);
    size_t n0;
    unsigned char *before = read_file(bad, &n0);

    logcap lc;
    stof_context *ctx = ctx_new(&lc);
    stof_db *db = db_open(ctx, bad, NULL);
    cr_assert(log_has_warn(&lc, bad), "%s: no warning naming the file:\n%s",
              what, lc.text);
    cr_assert(!stof__db_writable(db), "%s", what);
    stof_db_record r;
    cr_assert_eq(stof__db_lookup(db, key_bad, &r), STOF_ERR_NOT_FOUND, "%s",
                 what);
    record_fill(&r, 5, 8);
    cr_assert_eq(stof__db_store(db, &r, 0, 0), STOF_ERR_DATABASE, "%s", what);
    cr_assert(strstr(stof_errmsg(ctx), bad), "%s", stof_errmsg(ctx));
    stof__db_record_clear(&r);
    stof__db_close(&db);

    const char *sys[] = {bad, good, NULL};
    log_reset(&lc);
    char *user = path_join(dir, "user.db");
    db = db_open(ctx, user, sys);
    cr_assert(log_has_warn(&lc, bad), "%s (system): no warning:\n%s", what,
              lc.text);
    cr_assert(stof__db_writable(db));
    cr_assert_eq(stof__db_lookup(db, key_bad, &r), STOF_ERR_NOT_FOUND);
    cr_assert_eq(stof__db_lookup(db, key_good, &r), STOF_OK, "%s", what);
    cr_assert_str_eq(r.config, "{good}");
    stof__db_record_clear(&r);
    stof__db_close(&db);
    free(user);

    size_t n1;
    unsigned char *after = read_file(bad, &n1);
    cr_assert(n0 == n1 && (n0 == 0 || memcmp(before, after, n0) == 0),
              "%s: the file was modified", what);
    free(before);
    free(after);
    free(good);
    free(ctx);
}

Test(db, random_bytes_are_skipped)
{
    char *dir = tmpdir_new();
    char *bad = path_join(dir, "random.db");
    unsigned char junk[10000];
    for (size_t i = 0; i < sizeof(junk); i++)
        junk[i] = (unsigned char)mix(i);
    write_file(bad, junk, sizeof(junk));
    check_bad_file(dir, bad, "random bytes");
    /* A text file, too. */
    const char *txt = "this is not a database\n";
    write_file(bad, txt, strlen(txt));
    check_bad_file(dir, bad, "text file");
    /* A SQLite header followed by garbage. */
    memcpy(junk, "SQLite format 3", 16);
    write_file(bad, junk, sizeof(junk));
    check_bad_file(dir, bad, "SQLite magic with garbage");
    free(bad);
    tmpdir_free(dir);
}

Test(db, truncated_database_is_skipped)
{
    char *dir = tmpdir_new();
    char *src = path_join(dir, "full.db");
    make_db(src, 1, 20, 20000, NULL);
    size_t n;
    unsigned char *b = read_file(src, &n);
    cr_assert(n > 100000, "size %zu", n);
    char *bad = path_join(dir, "truncated.db");
    write_file(bad, b, n / 2);
    check_bad_file(dir, bad, "truncated to half");
    write_file(bad, b, 4096 + 100);
    check_bad_file(dir, bad, "truncated after the first page");
    write_file(bad, b, 50);
    check_bad_file(dir, bad, "truncated inside the header");
    free(b);
    free(src);
    free(bad);
    tmpdir_free(dir);
}

Test(db, foreign_sqlite_database_is_skipped)
{
    char *dir = tmpdir_new();
    char *bad = path_join(dir, "foreign.db");
    sqlite3 *c = raw_open(bad, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE);
    cr_assert_eq(sqlite3_exec(c,
                              "CREATE TABLE records(key TEXT, x INTEGER);"
                              "INSERT INTO records VALUES('a', 1);",
                              NULL, NULL, NULL),
                 SQLITE_OK);
    sqlite3_close(c);
    check_bad_file(dir, bad, "foreign database");

    /* Another application's id, no tables. */
    char *bad2 = path_join(dir, "foreign2.db");
    c = raw_open(bad2, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE);
    cr_assert_eq(sqlite3_exec(c, "PRAGMA application_id = 12345;", NULL,
                              NULL, NULL),
                 SQLITE_OK);
    sqlite3_close(c);
    check_bad_file(dir, bad2, "foreign application id");

    /* stof's id and version but a records table of another shape. */
    char *bad3 = path_join(dir, "misshapen.db");
    c = raw_open(bad3, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE);
    cr_assert_eq(sqlite3_exec(c,
                              "PRAGMA application_id = 1398034246;"
                              "PRAGMA user_version = 1;"
                              "CREATE TABLE records(key TEXT PRIMARY KEY);",
                              NULL, NULL, NULL),
                 SQLITE_OK);
    sqlite3_close(c);
    check_bad_file(dir, bad3, "records table of another shape");
    free(bad);
    free(bad2);
    free(bad3);
    tmpdir_free(dir);
}

Test(db, newer_schema_is_skipped)
{
    char *dir = tmpdir_new();
    char *bad = path_join(dir, "newer.db");
    make_db(bad, 1, 2, 64, NULL);
    sqlite3 *c = raw_open(bad, SQLITE_OPEN_READWRITE);
    char sql[64];
    snprintf(sql, sizeof(sql), "PRAGMA user_version = %d;",
             STOF_DB_SCHEMA_VERSION + 1);
    cr_assert_eq(sqlite3_exec(c, sql, NULL, NULL, NULL), SQLITE_OK);
    sqlite3_close(c);
    check_bad_file(dir, bad, "newer schema");
    logcap lc;
    stof_context *ctx = ctx_new(&lc);
    stof_db *db = db_open(ctx, bad, NULL);
    cr_assert(strstr(lc.text, "newer"), "%s", lc.text);
    stof__db_close(&db);
    free(ctx);
    free(bad);
    tmpdir_free(dir);
}

Test(db, empty_file)
{
    char *dir = tmpdir_new();
    char *empty = path_join(dir, "empty.db");
    write_file(empty, "", 0);
    /* As a system database it is not a stof database: skipped. */
    char *user = path_join(dir, "user.db");
    const char *sys[] = {empty, NULL};
    logcap lc;
    stof_context *ctx = ctx_new(&lc);
    stof_db *db = db_open(ctx, user, sys);
    cr_assert(log_has_warn(&lc, empty), "%s", lc.text);
    cr_assert_eq(stof__db_foreach(db, 1, count_cb, &(int){0}),
                 STOF_ERR_DATABASE);
    stof__db_close(&db);
    struct stat sb;
    cr_assert_eq(stat(empty, &sb), 0);
    cr_assert_eq(sb.st_size, 0, "a system database was written");

    /* As the user database it is what SQLite itself creates before the
     * schema: it gets the schema, silently. */
    log_reset(&lc);
    db = db_open(ctx, empty, NULL);
    cr_assert(stof__db_writable(db), "%s", lc.text);
    cr_assert_eq(lc.n_warn, 0, "%s", lc.text);
    stof_db_record r;
    record_fill(&r, 1, 10);
    cr_assert_eq(stof__db_store(db, &r, 0, 0), STOF_OK);
    stof__db_record_clear(&r);
    stof__db_close(&db);
    free(ctx);
    free(empty);
    free(user);
    tmpdir_free(dir);
}

Test(db, corruption_inside_is_a_warned_miss)
{
    char *dir = tmpdir_new();
    char *src = path_join(dir, "full.db");
    make_db(src, 1, 20, 20000, NULL);
    size_t n;
    unsigned char *b = read_file(src, &n);
    /* Keep page 1 (header and schema), scramble every other page. */
    for (size_t i = 4096; i < n; i++)
        b[i] = (unsigned char)mix(i * 31);
    char *bad = path_join(dir, "scrambled.db");
    write_file(bad, b, n);
    free(b);

    /* The system database has the keys; the user database is the broken
     * one: lookups warn once and fall through to the system. */
    char *sys1 = path_join(dir, "sys.db");
    make_db(sys1, 1, 20, 16, "{sys}");
    const char *sys[] = {sys1, NULL};
    logcap lc;
    stof_context *ctx = ctx_new(&lc);
    stof_db *db = db_open(ctx, bad, sys);
    int found = 0;
    for (uint64_t i = 1; i <= 20; i++) {
        char key[33];
        make_key(key, i);
        stof_db_record r;
        stof_status st = stof__db_lookup(db, key, &r);
        cr_assert(st == STOF_OK || st == STOF_ERR_NOT_FOUND);
        if (st == STOF_OK) {
            found++;
            cr_assert_str_eq(r.config, "{sys}");
            stof__db_record_clear(&r);
        }
    }
    cr_assert_eq(found, 20);
    cr_assert(log_has_warn(&lc, bad), "%s", lc.text);
    /* Warned once, not once per lookup. */
    int n_bad = 0;
    for (const char *p = lc.text; (p = strstr(p, "lookup failed")); p++)
        n_bad++;
    cr_assert(n_bad <= 1, "%s", lc.text);
    stof_status st = stof__db_foreach(db, 0, count_cb, &(int){0});
    cr_assert(st == STOF_OK || st == STOF_ERR_DATABASE);
    stof_db_record r;
    record_fill(&r, 77, 10);
    st = stof__db_store(db, &r, 0, 0);
    cr_assert(st == STOF_OK || st == STOF_ERR_DATABASE);
    stof__db_record_clear(&r);
    stof__db_close(&db);
    free(ctx);
    free(src);
    free(bad);
    free(sys1);
    tmpdir_free(dir);
}

/* ------------------------------------------------------------- read-only */

/* Read-only cases must run as a user that permissions stop. As root they
 * run in a child that drops to "nobody"; when that is impossible the test
 * is skipped. Checks in the child write the failure to a pipe and exit 1;
 * exit 77 means "skip" with the reason in the pipe. */
static int g_report_fd = -1;

static void child_report(int code, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3), noreturn))
#endif
    ;
static void child_report(int code, const char *fmt, ...)
{
    char msg[4096];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    if (n > (int)sizeof(msg) - 1)
        n = (int)sizeof(msg) - 1;
    if (g_report_fd >= 0 && n > 0 && write(g_report_fd, msg, (size_t)n) < 0)
        code = 2;
    _exit(code);
}

static void child_fail(int line, const char *cond, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4), noreturn))
#endif
    ;
static void child_fail(int line, const char *cond, const char *fmt, ...)
{
    char msg[3072];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    child_report(1, "test_db.c:%d: %s: %s", line, cond, msg);
}

#define CHILD_CHECK(cond, ...)                                                 \
    do {                                                                       \
        if (!(cond))                                                           \
            child_fail(__LINE__, #cond, __VA_ARGS__);                          \
    } while (0)

/* Run fn in a child as an unprivileged user; assert it passed. */
static void run_unprivileged(void (*fn)(void))
{
    int fds[2];
    cr_assert_eq(pipe(fds), 0);
    pid_t pid = fork();
    cr_assert(pid >= 0);
    if (pid == 0) {
        close(fds[0]);
        g_report_fd = fds[1];
        if (geteuid() == 0) {
            if (setgid(65534) != 0 || setuid(65534) != 0)
                child_report(77, "running as root and cannot drop to "
                                 "nobody (%s): permissions cannot be "
                                 "tested",
                             strerror(errno));
        }
        fn();
        _exit(0);
    }
    close(fds[1]);
    char msg[4097];
    size_t len = 0;
    ssize_t k;
    while (len < sizeof(msg) - 1 &&
           (k = read(fds[0], msg + len, sizeof(msg) - 1 - len)) > 0)
        len += (size_t)k;
    msg[len] = '\0';
    close(fds[0]);
    int status = 0;
    cr_assert_eq(waitpid(pid, &status, 0), pid);
    cr_assert(WIFEXITED(status), "the child died (status %d): %s", status,
              msg);
    if (WEXITSTATUS(status) == 77)
        cr_skip_test("%s", msg);
    cr_assert_eq(WEXITSTATUS(status), 0, "%s", msg);
}

/* A fresh database at path with record seed 1; in a child. */
static void child_make_db(const char *path)
{
    logcap lc;
    stof_context *ctx = ctx_new_raw(&lc);
    stof_db *db = NULL;
    CHILD_CHECK(stof__db_open(STOF_DB_SINK(ctx), path, NULL, &db) == STOF_OK, "open");
    CHILD_CHECK(stof__db_writable(db), "%s", lc.text);
    stof_db_record r;
    record_fill(&r, 1, 100);
    CHILD_CHECK(stof__db_store(db, &r, 0, 0) == STOF_OK, "%s",
                stof_errmsg(ctx));
    stof__db_record_clear(&r);
    stof__db_close(&db);
    free(ctx);
}

/* Open path as the user database and check read-only behaviour: warned,
 * readable, not writable. */
static void child_check_read_only(const char *path)
{
    logcap lc;
    stof_context *ctx = ctx_new_raw(&lc);
    stof_db *db = NULL;
    CHILD_CHECK(stof__db_open(STOF_DB_SINK(ctx), path, NULL, &db) == STOF_OK, "open");
    CHILD_CHECK(!stof__db_writable(db), "%s", lc.text);
    CHILD_CHECK(log_has_warn(&lc, path) && strstr(lc.text, "read-only"),
                "no read-only warning naming the file:\n%s", lc.text);
    char key[33];
    make_key(key, 1);
    stof_db_record r;
    CHILD_CHECK(stof__db_lookup(db, key, &r) == STOF_OK, "lookup: %s",
                lc.text);
    CHILD_CHECK(r.cubin_size == 100 && strcmp(r.source, "user") == 0,
                "size %zu", r.cubin_size);
    stof__db_record_clear(&r);
    record_fill(&r, 2, 10);
    CHILD_CHECK(stof__db_store(db, &r, 0, 0) == STOF_ERR_DATABASE, "store");
    CHILD_CHECK(strstr(stof_errmsg(ctx), path), "%s", stof_errmsg(ctx));
    CHILD_CHECK(stof__db_record_miss(db, key, "{}", NULL, 0) ==
                    STOF_ERR_DATABASE,
                "miss");
    stof__db_record_clear(&r);
    /* And as a system database under no user database: readable. */
    stof__db_close(&db);
    const char *sys[] = {path, NULL};
    log_reset(&lc);
    CHILD_CHECK(stof__db_open(STOF_DB_SINK(ctx), "", sys, &db) == STOF_OK, "open");
    CHILD_CHECK(lc.n_warn == 0, "%s", lc.text);
    CHILD_CHECK(stof__db_lookup(db, key, &r) == STOF_OK, "%s", lc.text);
    CHILD_CHECK(strcmp(r.source, "system") == 0, "%s", r.source);
    stof__db_record_clear(&r);
    stof__db_close(&db);
    free(ctx);
}

static char g_dir[64];

static void child_tmpdir(void)
{
    snprintf(g_dir, sizeof(g_dir), "/tmp/stof-db-ro-XXXXXX");
    CHILD_CHECK(mkdtemp(g_dir), "mkdtemp: %s", strerror(errno));
}

static void child_rm(const char *dir)
{
    rm_tree(dir);
}

static void read_only_file_body(void)
{
    child_tmpdir();
    char path[128];
    snprintf(path, sizeof(path), "%s/tuning.db", g_dir);
    child_make_db(path);
    CHILD_CHECK(chmod(path, 0444) == 0, "chmod");
    int fd = open(path, O_WRONLY);
    if (fd >= 0) {
        close(fd);
        child_rm(g_dir);
        child_report(77, "chmod 0444 does not stop writes here");
    }
    child_check_read_only(path);
    child_rm(g_dir);
}

Test(db, read_only_file)
{
    run_unprivileged(read_only_file_body);
}

static void read_only_dir_body(void)
{
    child_tmpdir();
    char sub[128], path[160], missing[160];
    snprintf(sub, sizeof(sub), "%s/ro", g_dir);
    CHILD_CHECK(mkdir(sub, 0700) == 0, "mkdir");
    snprintf(path, sizeof(path), "%s/tuning.db", sub);
    snprintf(missing, sizeof(missing), "%s/missing.db", sub);
    child_make_db(path);
    /* The file stays writable; its directory is not, so the -wal and -shm
     * files cannot be made. */
    CHILD_CHECK(chmod(sub, 0555) == 0, "chmod");
    char probe[192];
    snprintf(probe, sizeof(probe), "%s/probe", sub);
    int fd = open(probe, O_WRONLY | O_CREAT, 0600);
    if (fd >= 0) {
        close(fd);
        child_rm(g_dir);
        child_report(77, "chmod 0555 does not stop writes here");
    }
    child_check_read_only(path);

    /* A database that does not exist in a read-only directory: skipped. */
    logcap lc;
    stof_context *ctx = ctx_new_raw(&lc);
    stof_db *db = NULL;
    CHILD_CHECK(stof__db_open(STOF_DB_SINK(ctx), missing, NULL, &db) == STOF_OK, "open");
    CHILD_CHECK(!stof__db_writable(db), "writable");
    CHILD_CHECK(log_has_warn(&lc, missing), "%s", lc.text);
    char key[33];
    make_key(key, 1);
    stof_db_record r;
    CHILD_CHECK(stof__db_lookup(db, key, &r) == STOF_ERR_NOT_FOUND, "lookup");
    stof__db_close(&db);

    /* A directory that cannot be created. */
    char deep[192];
    snprintf(deep, sizeof(deep), "%s/a/b.db", sub);
    log_reset(&lc);
    CHILD_CHECK(stof__db_open(STOF_DB_SINK(ctx), deep, NULL, &db) == STOF_OK, "open");
    CHILD_CHECK(!stof__db_writable(db), "writable");
    CHILD_CHECK(log_has_warn(&lc, deep), "%s", lc.text);
    stof__db_close(&db);
    free(ctx);
    child_rm(g_dir);
}

Test(db, read_only_directory)
{
    run_unprivileged(read_only_dir_body);
}

/* ------------------------------------------------------------ concurrency */

#define N_WRITERS 4
#define N_STORES 200
#define N_KEYS 40

/* What writer w stores at step i: key, time, verified. Times are distinct
 * (w and i are in the low digits). */
static void writer_step(int w, int i, int *key, double *t, int *verified)
{
    uint64_t h = mix((uint64_t)w * 1000003u + (uint64_t)i);
    *key = (int)((unsigned)(i * 7 + w * 13) % N_KEYS);
    *t = 1.0 + (double)(h % 100000) / 100.0 + (double)(w * N_STORES + i) *
                                                  1e-6;
    *verified = (h >> 20) % 4 != 0;
}

static void writer_child(const char *path, int w, int start_fd)
{
    char go;
    if (read(start_fd, &go, 1) != 1) /* all start together */
        _exit(4);
    logcap lc;
    stof_context *ctx = ctx_new_raw(&lc);
    stof_db *db = NULL;
    CHILD_CHECK(stof__db_open(STOF_DB_SINK(ctx), path, NULL, &db) == STOF_OK, "open");
    CHILD_CHECK(stof__db_writable(db), "writer %d: %s", w, lc.text);
    for (int i = 0; i < N_STORES; i++) {
        int k, v;
        double t;
        writer_step(w, i, &k, &t, &v);
        stof_db_record r;
        record_fill(&r, (uint64_t)k, 512);
        r.time_ms = t;
        r.verified = v;
        snprintf(r.config, sizeof(r.config), "{\"w\":%d,\"i\":%d}", w, i);
        CHILD_CHECK(stof__db_store(db, &r, 0, 0) == STOF_OK,
                    "writer %d store %d: %s", w, i, stof_errmsg(ctx));
        stof__db_record_clear(&r);
        char mk[16];
        snprintf(mk, sizeof(mk), "miss%d", i % 10);
        CHILD_CHECK(stof__db_record_miss(db, mk, "{}", NULL, 0) == STOF_OK,
                    "writer %d miss %d: %s", w, i, stof_errmsg(ctx));
        if (i % 10 == 0) {
            char kk[33];
            make_key(kk, (uint64_t)k);
            CHILD_CHECK(stof__db_lookup(db, kk, &r) == STOF_OK, "lookup");
            stof__db_record_clear(&r);
        }
    }
    stof__db_close(&db);
    CHILD_CHECK(lc.n_warn + lc.n_error == 0, "writer %d: %s", w, lc.text);
    free(ctx);
}

static int sum_miss_cb(void *user, const char *key, const char *problem,
                       const void *bits, size_t n, int64_t count)
{
    (void)key;
    (void)problem;
    (void)bits;
    (void)n;
    *(int64_t *)user += count;
    return 0;
}

Test(db, concurrent_writers_converge_on_the_fastest)
{
    char *dir = tmpdir_new();
    /* The file does not exist yet: the writers also race to create it. */
    char *path = path_join(dir, "shared/tuning.db");
    int start[2];
    cr_assert_eq(pipe(start), 0);
    int reports[2];
    cr_assert_eq(pipe(reports), 0);
    pid_t pids[N_WRITERS];
    for (int w = 0; w < N_WRITERS; w++) {
        pids[w] = fork();
        cr_assert(pids[w] >= 0);
        if (pids[w] == 0) {
            close(start[1]);
            close(reports[0]);
            g_report_fd = reports[1];
            writer_child(path, w, start[0]);
            _exit(0);
        }
    }
    close(start[0]);
    close(reports[1]);
    char go[N_WRITERS] = {0};
    cr_assert_eq(write(start[1], go, sizeof(go)), (ssize_t)sizeof(go));
    close(start[1]);
    char msg[8192];
    size_t len = 0;
    ssize_t k;
    while (len < sizeof(msg) - 1 &&
           (k = read(reports[0], msg + len, sizeof(msg) - 1 - len)) > 0)
        len += (size_t)k;
    msg[len] = '\0';
    close(reports[0]);
    for (int w = 0; w < N_WRITERS; w++) {
        int status = 0;
        cr_assert_eq(waitpid(pids[w], &status, 0), pids[w]);
        cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0,
                  "writer %d: status %d: %s", w, status, msg);
    }

    /* Per key: the fastest verified time, with its writer's config. */
    double best[N_KEYS];
    int best_w[N_KEYS], best_i[N_KEYS];
    for (int i = 0; i < N_KEYS; i++)
        best[i] = -1.0;
    for (int w = 0; w < N_WRITERS; w++)
        for (int i = 0; i < N_STORES; i++) {
            int key, v;
            double t;
            writer_step(w, i, &key, &t, &v);
            if (v && (best[key] < 0 || t < best[key])) {
                best[key] = t;
                best_w[key] = w;
                best_i[key] = i;
            }
        }
    logcap lc;
    stof_context *ctx = ctx_new(&lc);
    stof_db *db = db_open(ctx, path, NULL);
    cr_assert(stof__db_writable(db), "%s", lc.text);
    for (int key = 0; key < N_KEYS; key++) {
        char kk[33];
        make_key(kk, (uint64_t)key);
        stof_db_record r;
        cr_assert_eq(stof__db_lookup(db, kk, &r), STOF_OK, "key %d", key);
        cr_assert(best[key] > 0, "key %d never got a verified record", key);
        cr_assert_eq(r.verified, 1, "key %d", key);
        cr_assert_eq(r.time_ms, best[key], "key %d: %g, want %g", key,
                     r.time_ms, best[key]);
        char cfg[64];
        snprintf(cfg, sizeof(cfg), "{\"w\":%d,\"i\":%d}", best_w[key],
                 best_i[key]);
        cr_assert_str_eq(r.config, cfg, "key %d", key);
        cr_assert_eq(r.cubin_size, 512);
        stof__db_record_clear(&r);
    }
    int n = 0;
    cr_assert_eq(stof__db_foreach(db, 0, count_cb, &n), STOF_OK);
    cr_assert_eq(n, N_KEYS);
    int64_t misses = 0;
    cr_assert_eq(stof__db_foreach_miss(db, sum_miss_cb, &misses), STOF_OK);
    cr_assert_eq(misses, N_WRITERS * N_STORES, "every miss was counted");
    stof__db_close(&db);

    sqlite3 *c = raw_open(path, SQLITE_OPEN_READONLY);
    char buf[64];
    raw_text(c, "PRAGMA integrity_check", buf, sizeof(buf));
    cr_assert_str_eq(buf, "ok");
    sqlite3_close(c);
    free(ctx);
    free(path);
    tmpdir_free(dir);
}

/* ---------------------------------------------------------- killed writer */

/* Stores records 0, 1, 2, ... until killed; says "started" after 20. */
static void endless_writer(const char *path, int fd)
{
    logcap lc;
    stof_context *ctx = ctx_new_raw(&lc);
    stof_db *db = NULL;
    if (stof__db_open(STOF_DB_SINK(ctx), path, NULL, &db) != STOF_OK ||
        !stof__db_writable(db))
        _exit(5);
    for (uint64_t i = 0;; i++) {
        stof_db_record r;
        record_fill(&r, i, 4096 + (size_t)(i % 7) * 10000);
        if (stof__db_store(db, &r, 0, 0) != STOF_OK)
            _exit(6);
        stof__db_record_clear(&r);
        if (i == 20 && write(fd, "s", 1) != 1)
            _exit(7);
    }
}

/* Opens a transaction that deletes every record and rewrites the misses,
 * says so, and waits to be killed. */
static void stuck_transaction(const char *path, int fd)
{
    sqlite3 *c = NULL;
    if (sqlite3_open_v2(path, &c, SQLITE_OPEN_READWRITE, NULL) != SQLITE_OK)
        _exit(5);
    sqlite3_busy_timeout(c, 10000);
    if (sqlite3_exec(c,
                     "BEGIN IMMEDIATE; DELETE FROM records;"
                     "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1"
                     " FROM n WHERE i < 5000)"
                     " INSERT INTO misses(key, problem, mask, count,"
                     " first_seen, last_seen)"
                     " SELECT 'x' || i, '{}', randomblob(1000), 1, 0, 0"
                     " FROM n;",
                     NULL, NULL, NULL) != SQLITE_OK)
        _exit(6);
    if (write(fd, "s", 1) != 1)
        _exit(7);
    for (;;)
        pause();
}

static void kill_and_check(const char *path, void (*child)(const char *, int),
                           int delay_us, int64_t must_have)
{
    int fds[2];
    cr_assert_eq(pipe(fds), 0);
    pid_t pid = fork();
    cr_assert(pid >= 0);
    if (pid == 0) {
        close(fds[0]);
        child(path, fds[1]);
        _exit(0);
    }
    close(fds[1]);
    char c;
    cr_assert_eq(read(fds[0], &c, 1), 1, "the writer did not start");
    close(fds[0]);
    if (delay_us)
        usleep((useconds_t)delay_us);
    cr_assert_eq(kill(pid, SIGKILL), 0);
    int status = 0;
    cr_assert_eq(waitpid(pid, &status, 0), pid);
    cr_assert(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL,
              "status %d", status);

    sqlite3 *raw = raw_open(path, SQLITE_OPEN_READWRITE);
    char buf[64];
    raw_text(raw, "PRAGMA integrity_check", buf, sizeof(buf));
    cr_assert_str_eq(buf, "ok");
    cr_assert_eq(raw_int(raw, "SELECT count(*) FROM misses WHERE key LIKE "
                              "'x%'"),
                 0, "an uncommitted transaction is visible");
    sqlite3_close(raw);

    logcap lc;
    stof_context *ctx = ctx_new(&lc);
    stof_db *db = db_open(ctx, path, NULL);
    cr_assert(stof__db_writable(db), "%s", lc.text);
    cr_assert_eq(lc.n_warn, 0, "%s", lc.text);
    for (int64_t i = 0; i < must_have; i++) {
        char key[33];
        make_key(key, (uint64_t)i);
        stof_db_record r;
        cr_assert_eq(stof__db_lookup(db, key, &r), STOF_OK,
                     "committed record %lld is lost", (long long)i);
        stof_db_record want;
        record_fill(&want, (uint64_t)i, 4096 + (size_t)(i % 7) * 10000);
        assert_record_eq(&r, &want);
        stof__db_record_clear(&want);
        stof__db_record_clear(&r);
    }
    stof_db_record r;
    record_fill(&r, 123456789, 1000);
    cr_assert_eq(stof__db_store(db, &r, 0, 0), STOF_OK, "%s", stof_errmsg(ctx));
    stof__db_record_clear(&r);
    char key[33];
    make_key(key, 123456789);
    cr_assert_eq(stof__db_lookup(db, key, &r), STOF_OK);
    stof__db_record_clear(&r);
    cr_assert_eq(stof__db_record_miss(db, "after", "{}", NULL, 0), STOF_OK);
    stof__db_close(&db);
    free(ctx);
}

Test(db, killed_writer_leaves_a_valid_database)
{
    char *dir = tmpdir_new();
    char *path = path_join(dir, "tuning.db");
    /* Kill a storing loop at several moments. */
    for (int round = 0; round < 5; round++)
        kill_and_check(path, endless_writer, round * 3000, 21);
    /* Kill a process inside an open write transaction: its changes vanish
     * and its lock goes with it. */
    kill_and_check(path, stuck_transaction, 0, 21);
    free(path);
    tmpdir_free(dir);
}

/* ------------------------------------------------------------------ misses */

typedef struct miss_seen {
    int n;
    char keys[4][16];
    int64_t counts[4];
    size_t bytes[4];
    unsigned char first_bits[16];
    char problem[4][64];
} miss_seen;

static int miss_cb(void *user, const char *key, const char *problem,
                   const void *bits, size_t n, int64_t count)
{
    miss_seen *m = user;
    if (m->n < 4) {
        snprintf(m->keys[m->n], 16, "%s", key);
        snprintf(m->problem[m->n], 64, "%s", problem);
        m->counts[m->n] = count;
        m->bytes[m->n] = n;
        if (m->n == 0 && n == 16)
            memcpy(m->first_bits, bits, 16);
    }
    m->n++;
    return 0;
}

Test(db, misses_are_counted_listed_and_deleted)
{
    char *dir = tmpdir_new();
    char *path = path_join(dir, "tuning.db");
    logcap lc;
    stof_context *ctx = ctx_new(&lc);
    stof_db *db = db_open(ctx, path, NULL);
    unsigned char bits[16];
    for (int i = 0; i < 16; i++)
        bits[i] = (unsigned char)(i * 17);
    cr_assert_eq(stof__db_record_miss(db, "k1", "{\"seq_q\":128}", bits, 16),
                 STOF_OK, "%s", stof_errmsg(ctx));
    cr_assert_eq(stof__db_record_miss(db, "k1", "{\"seq_q\":128}", bits, 16),
                 STOF_OK);
    cr_assert_eq(stof__db_record_miss(db, "k2", "{\"spec\":\"causal\"}",
                                      NULL, 0),
                 STOF_OK);
    cr_assert_eq(stof__db_record_miss(db, "", "{}", NULL, 0),
                 STOF_ERR_INVALID_ARGUMENT);
    cr_assert_eq(stof__db_record_miss(db, "k3", "{}", NULL, 5),
                 STOF_ERR_INVALID_ARGUMENT);

    miss_seen m;
    memset(&m, 0, sizeof(m));
    cr_assert_eq(stof__db_foreach_miss(db, miss_cb, &m), STOF_OK);
    cr_assert_eq(m.n, 2);
    cr_assert_str_eq(m.keys[0], "k1");
    cr_assert_eq(m.counts[0], 2);
    cr_assert_eq(m.bytes[0], 16);
    cr_assert(memcmp(m.first_bits, bits, 16) == 0);
    cr_assert_str_eq(m.problem[0], "{\"seq_q\":128}");
    cr_assert_str_eq(m.keys[1], "k2");
    cr_assert_eq(m.counts[1], 1);
    cr_assert_eq(m.bytes[1], 0);

    sqlite3 *c = raw_open(path, SQLITE_OPEN_READONLY);
    cr_assert(raw_int(c, "SELECT first_seen FROM misses WHERE key = 'k1'") >
              1600000000);
    cr_assert(raw_int(c, "SELECT last_seen >= first_seen FROM misses WHERE "
                         "key = 'k1'"));
    sqlite3_close(c);

    cr_assert_eq(stof__db_delete_miss(db, "k1"), STOF_OK);
    cr_assert_eq(stof__db_delete_miss(db, "k1"), STOF_OK,
                 "deleting twice is harmless");
    memset(&m, 0, sizeof(m));
    cr_assert_eq(stof__db_foreach_miss(db, miss_cb, &m), STOF_OK);
    cr_assert_eq(m.n, 1);
    cr_assert_str_eq(m.keys[0], "k2");
    stof__db_close(&db);
    cr_assert_eq(lc.n_warn, 0, "%s", lc.text);
    free(path);
    tmpdir_free(dir);
    free(ctx);
}

/* Iterations over records and misses end on keys a C string cannot hold
 * (a BLOB, text with a NUL inside: one damaged byte, or a crafted file),
 * visiting each row once, instead of finding the same row for ever. */
Test(db, iterations_end_on_keys_a_c_string_cannot_hold, .timeout = 30)
{
    one_db f;
    one_db_open(&f);
    stof_db *db = f.db;
    stof_db_record r;
    for (int i = 0; i < 2; i++) {
        record_fill(&r, 40 + (uint64_t)i, 64);
        cr_assert_eq(stof__db_store(db, &r, 0, 0), STOF_OK);
        stof__db_record_clear(&r);
    }
    cr_assert_eq(stof__db_record_miss(db, "k1", "{}", NULL, 0), STOF_OK);
    sqlite3 *c = raw_open(f.path, SQLITE_OPEN_READWRITE);
    const char *sql =
        "CREATE TEMP TABLE t AS SELECT * FROM records LIMIT 1;"
        "UPDATE t SET key = x'00ff';"
        "INSERT INTO records SELECT * FROM t;"
        "UPDATE t SET key = CAST(x'41420043' AS TEXT);"
        "INSERT INTO records SELECT * FROM t;"
        "INSERT INTO misses(key, problem, mask, count, first_seen, last_seen)"
        " VALUES (x'0102', '{}', NULL, 1, 1, 1),"
        " (CAST(x'41420043' AS TEXT), '{}', NULL, 1, 1, 1);";
    char *err = NULL;
    cr_assert_eq(sqlite3_exec(c, sql, NULL, NULL, &err), SQLITE_OK, "%s",
                 err ? err : "");
    sqlite3_close(c);
    int n = 0;
    cr_assert_eq(stof__db_foreach(db, 0, count_cb, &n), STOF_OK);
    cr_assert_eq(n, 4, "%d records visited", n);
    miss_seen m;
    memset(&m, 0, sizeof(m));
    cr_assert_eq(stof__db_foreach_miss(db, miss_cb, &m), STOF_OK);
    cr_assert_eq(m.n, 3, "%d misses visited", m.n);
    one_db_close(&f);
}

/* Many processes opening the same new database at once (as a fleet of
 * workers starting together does) all get it writable: SQLite may refuse
 * the WAL switch or the schema creation with SQLITE_BUSY without waiting,
 * which must be retried rather than taken as "read-only" or "foreign". */
Test(db, many_processes_creating_one_file_all_get_it_writable, .timeout = 120)
{
    char *dir = tmpdir_new();
    enum { ROUNDS = 6, PROCS = 24 };
    int refused = 0;
    for (int r = 0; r < ROUNDS; r++) {
        char path[512];
        snprintf(path, sizeof(path), "%s/fleet-%d.db", dir, r);
        for (int i = 0; i < PROCS; i++) {
            pid_t pid = fork();
            cr_assert_geq(pid, 0);
            if (pid == 0) {
                logcap lc;
                stof_context *ctx = ctx_new_raw(&lc);
                stof_db *db = NULL;
                stof__db_open(STOF_DB_SINK(ctx), path, NULL, &db);
                int ok = db && stof__db_writable(db);
                stof__db_close(&db);
                _exit(ok ? 0 : 1);
            }
        }
        for (int i = 0; i < PROCS; i++) {
            int st = 0;
            wait(&st);
            refused += !(WIFEXITED(st) && WEXITSTATUS(st) == 0);
        }
    }
    cr_assert_eq(refused, 0, "%d of %d opens were not writable", refused,
                 ROUNDS * PROCS);
    rm_tree(dir);
    free(dir);
}
