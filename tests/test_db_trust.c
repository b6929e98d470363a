/*
 * test_db_trust.c - what keeps a shared tuning database trustworthy, on
 * the CPU: content hashes and record checks on lookup (damaged or crafted
 * records are skipped, the next layer answers), local trust (per record,
 * persistent in the user database, in memory when it is read-only, never
 * read from a system database), deleting a record that failed, the
 * upgrade of a version-1 file, reading without writing beside the file,
 * and problem keys that do not depend on the tensor layout.
 */
#include <criterion/criterion.h>

#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <sqlite3.h>

#include "db.h"
#include "internal.h"
#include "record_check.h"
#include "testutil.h"

static char dir[64];

static void setup(void)
{
    snprintf(dir, sizeof(dir), "/tmp/stof-trust-XXXXXX");
    cr_assert_not_null(mkdtemp(dir));
}

static void teardown(void)
{
    char cmd[256];
    snprintf(cmd, sizeof(cmd), "chmod -R u+w '%s'; rm -rf '%s'", dir, dir);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", dir);
}

TestSuite(trust, .init = setup, .fini = teardown, .timeout = 60);

static const char *P(const char *name)
{
    static char bufs[4][256];
    static int k;
    char *b = bufs[k++ & 3];
    snprintf(b, sizeof(bufs[0]), "%s/%s", dir, name);
    return b;
}

static char logbuf[16384];

static void logcb(void *user, stof_log_level level, const char *msg)
{
    (void)user;
    size_t n = strlen(logbuf);
    snprintf(logbuf + n, sizeof(logbuf) - n, "[%d] %s\n", (int)level, msg);
}

static stof_context *ctx_new(void)
{
    stof_settings s;
    stof_default_settings(&s);
    s.user_db = "";
    s.log_fn = logcb;
    s.log_level = STOF_LOG_DEBUG;
    stof_context *ctx = NULL;
    stof_open(&ctx, &s);
    cr_assert_not_null(ctx);
    logbuf[0] = '\0';
    return ctx;
}

static stof_db *open_db(stof_context *ctx, const char *user,
                        const char *const *sys)
{
    stof_db *db = NULL;
    cr_assert_eq(stof__db_open(STOF_DB_SINK(ctx), user, sys, &db), STOF_OK);
    return db;
}

/* A user database at path with records seeded seeds[0..n-1]. */
static void make_db(stof_context *ctx, const char *path, const uint64_t *seeds,
                    int n, int trusted_here)
{
    stof_db *db = open_db(ctx, path, NULL);
    cr_assert(stof__db_writable(db));
    for (int i = 0; i < n; i++) {
        stof_db_record r;
        tu_record_fill(&r, seeds[i], 256);
        cr_assert_eq(stof__db_store(db, &r, 1, trusted_here), STOF_OK, "%s",
                     stof_errmsg(ctx));
        stof__db_record_clear(&r);
    }
    stof__db_close(&db);
}

static void raw_exec(const char *path, const char *sql)
{
    sqlite3 *c = NULL;
    cr_assert_eq(sqlite3_open(path, &c), SQLITE_OK);
    char *err = NULL;
    cr_assert_eq(sqlite3_exec(c, sql, NULL, NULL, &err), SQLITE_OK, "%s: %s",
                 sql, err ? err : "");
    sqlite3_close(c);
}

Test(trust, a_valid_record_passes_every_check)
{
    stof_db_record r;
    tu_record_fill(&r, 5, 128);
    char why[256] = "";
    cr_assert(stof__record_check(&r, why, sizeof(why)), "%s", why);
    /* Each field that a crafted record could abuse is refused, even with
     * a content hash made to match. */
    stof_db_record x;
#define REFUSED(stmt, needle)                                                  \
    do {                                                                       \
        x = r;                                                                 \
        stmt;                                                                  \
        stof__db_record_hash(&x, x.content_hash);                              \
        why[0] = '\0';                                                         \
        cr_assert(!stof__record_check(&x, why, sizeof(why)), #stmt);           \
        cr_assert(strstr(why, needle), #stmt ": %s", why);                     \
    } while (0)
    REFUSED(x.time_ms = -1.0, "time_ms");
    REFUSED(x.time_ms = 0.0, "time_ms");
    REFUSED(x.time_ms = NAN, "time_ms");
    REFUSED(x.time_ms = INFINITY, "time_ms");
    REFUSED(x.model_ms = -2.0, "model_ms");
    REFUSED(snprintf(x.kernel, sizeof(x.kernel), "evil"), "kernel");
    REFUSED(snprintf(x.op, sizeof(x.op), "shell"), "op");
    REFUSED(snprintf(x.config, sizeof(x.config),
                     "{\"kind\":\"block\",\"block_m\":4096,\"block_n\":64,"
                     "\"warps\":4,\"stages\":2,\"overlap\":0,\"group\":0}"),
            "configuration");
    REFUSED(snprintf(x.config, sizeof(x.config), "{}"), "configuration");
    REFUSED(snprintf(x.host, sizeof(x.host), "a\033[2Jb"), "host");
    REFUSED(snprintf(x.mask_spec, sizeof(x.mask_spec), "causal\n"),
            "mask_spec");
    REFUSED(x.cubin_size = 0, "cubin");
    REFUSED(x.verified = 7, "verified");
    REFUSED(snprintf(x.key, sizeof(x.key), "not-a-key"), "key");
    REFUSED(snprintf(x.dtype, sizeof(x.dtype), "fp8"), "dtype");
    REFUSED(x.head_dim = -64, "range");
    /* A consistent hash is required: an edit without it is caught too. */
    x = r;
    x.time_ms = 1e-6;
    cr_assert(!stof__record_check(&x, why, sizeof(why)));
    cr_assert(strstr(why, "content hash"), "%s", why);
#undef REFUSED
    stof__db_record_clear(&r);
}

/* Split-KV records say how many CTAs share a row block ("splits"), and
 * records say which score modifiers their kernel was built for ("mods");
 * older records have neither field: not split, no modifiers. */
Test(trust, split_counts_in_records_are_read_and_checked)
{
    static const char *base = "{\"kind\":\"block\",\"block_m\":64,"
                              "\"block_n\":64,\"warps\":4,\"stages\":2,"
                              "\"overlap\":0,\"group\":0";
    static const struct {
        const char *tail;
        int ok, splits;
    } cases[] = {
        {"}", 1, 0},
        {",\"splits\":0}", 1, 0},
        {",\"splits\":8}", 1, 8},
        {",\"splits\":64}", 1, 64},
        {",\"splits\":1}", 0, 0},
        {",\"splits\":65}", 0, 0},
        {",\"splits\":-2}", 0, 0},
        {",\"splits\":\"4\"}", 0, 0},
        {",\"splits\":4.5}", 0, 0},
        /* score modifiers the kernel was built for (0..7) */
        {",\"splits\":0,\"mods\":3}", 1, 0},
        {",\"mods\":7}", 1, 0},
        {",\"mods\":8}", 0, 0},
        {",\"mods\":-1}", 0, 0},
        {",\"mods\":\"1\"}", 0, 0},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        stof_db_record r;
        tu_record_fill(&r, 11 + i, 128);
        snprintf(r.config, sizeof(r.config), "%s%s", base, cases[i].tail);
        stof__db_record_hash(&r, r.content_hash);
        char why[256] = "";
        cr_assert_eq(stof__record_check(&r, why, sizeof(why)), cases[i].ok,
                     "%s: %s", r.config, why);
        stof_candidate c;
        cr_assert_eq(stof__attention_record_candidate(&r, &c, why,
                                                      sizeof(why)),
                     cases[i].ok, "%s: %s", r.config, why);
        if (cases[i].ok) {
            cr_assert_eq(c.splits, cases[i].splits, "%s", r.config);
            cr_assert_eq(c.cfg.split, cases[i].splits > 1, "%s", r.config);
        } else {
            cr_assert(strstr(why, "split") || strstr(why, "modifiers"),
                      "%s: %s", r.config, why);
        }
        if (cases[i].ok && strstr(cases[i].tail, "mods"))
            cr_assert_eq(c.cfg.mods,
                         atoi(strstr(cases[i].tail, "mods") + 6), "%s",
                         r.config);
        stof__db_record_clear(&r);
    }
    /* The reference kernel is never split. */
    stof_db_record r;
    tu_record_fill(&r, 99, 128);
    snprintf(r.kernel, sizeof(r.kernel), "reference");
    snprintf(r.config, sizeof(r.config),
             "{\"kind\":\"reference\",\"block_m\":0,\"block_n\":0,"
             "\"warps\":0,\"stages\":0,\"overlap\":0,\"group\":0,"
             "\"splits\":4}");
    stof__db_record_hash(&r, r.content_hash);
    char why[256] = "";
    stof_candidate c;
    cr_assert_not(stof__attention_record_candidate(&r, &c, why, sizeof(why)));
    cr_assert(strstr(why, "split"), "%s", why);
    stof__db_record_clear(&r);
}

/* Records of the persistent wgmma kernel say so ("persist": 1); older
 * records have no such field (not persistent). Other kernels, split
 * counts and values other than 0 / 1 are refused. */
Test(trust, persistent_flag_in_records_is_read_and_checked)
{
    static const struct {
        const char *kernel, *tail;
        int ok, persist;
    } cases[] = {
        {"wgmma", "}", 1, 0},
        {"wgmma", ",\"persist\":0}", 1, 0},
        {"wgmma", ",\"persist\":1}", 1, 1},
        {"wgmma", ",\"persist\":2}", 0, 0},
        {"wgmma", ",\"persist\":\"1\"}", 0, 0},
        {"wgmma", ",\"splits\":4,\"persist\":1}", 0, 0},
        {"wgmma-gather", ",\"persist\":1}", 0, 0},
        {"block", ",\"persist\":1}", 0, 0},
        {"block", ",\"persist\":0}", 1, 0},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        stof_db_record r;
        tu_record_fill(&r, 40 + i, 128);
        snprintf(r.kernel, sizeof(r.kernel), "%s", cases[i].kernel);
        if (cases[i].kernel[0] == 'w')
            snprintf(r.arch, sizeof(r.arch), "sm_90a");
        snprintf(r.config, sizeof(r.config),
                 "{\"kind\":\"%s\",\"block_m\":%d,\"block_n\":64,"
                 "\"warps\":%d,\"stages\":2,\"overlap\":1,\"group\":0%s",
                 cases[i].kernel, cases[i].kernel[0] == 'w' ? 128 : 64,
                 cases[i].kernel[0] == 'w' ? 12 : 4, cases[i].tail);
        stof__db_record_hash(&r, r.content_hash);
        char why[256] = "";
        stof_candidate c;
        cr_assert_eq(stof__attention_record_candidate(&r, &c, why,
                                                      sizeof(why)),
                     cases[i].ok, "%s %s: %s", r.kernel, r.config, why);
        if (cases[i].ok)
            cr_assert_eq(c.wcfg.persist, cases[i].persist, "%s", r.config);
        else
            cr_assert(strstr(why, "persist"), "%s: %s", r.config, why);
        stof__db_record_clear(&r);
    }
}

Test(trust, lookup_skips_damaged_and_crafted_records)
{
    stof_context *ctx = ctx_new();
    const uint64_t seeds[] = {1, 2, 3};
    make_db(ctx, P("user.db"), seeds, 3, 0);
    make_db(ctx, P("sys.db"), seeds, 3, 0);
    char k1[33], k2[33], k3[33];
    snprintf(k1, sizeof(k1), "%032x", 1);
    snprintf(k2, sizeof(k2), "%032x", 2);
    snprintf(k3, sizeof(k3), "%032x", 3);
    /* Record 1: a poisoned time without a matching hash; record 2: the
     * cubin replaced; record 3 untouched. */
    char sql[512];
    snprintf(sql, sizeof(sql),
             "UPDATE records SET time_ms = -1, verified = 1 WHERE key = '%s';"
             "UPDATE records SET cubin = zeroblob(300) WHERE key = '%s';",
             k1, k2);
    raw_exec(P("user.db"), sql);
    const char *sys[] = {P("sys.db"), NULL};
    stof_db *db = open_db(ctx, P("user.db"), sys);
    stof_db_record r;
    cr_assert_eq(stof__db_lookup(db, k1, &r), STOF_OK);
    cr_assert_str_eq(r.source, "system", "the damaged user record is skipped");
    cr_assert_eq(r.layer, 1);
    cr_assert(r.time_ms > 0);
    stof__db_record_clear(&r);
    cr_assert(strstr(logbuf, k1) && strstr(logbuf, "invalid"), "%s", logbuf);
    cr_assert_eq(stof__db_lookup(db, k2, &r), STOF_OK);
    cr_assert_str_eq(r.source, "system");
    cr_assert_eq(r.cubin_size, 256);
    stof__db_record_clear(&r);
    cr_assert(strstr(logbuf, "content hash does not match"), "%s", logbuf);
    cr_assert_eq(stof__db_lookup(db, k3, &r), STOF_OK);
    cr_assert_str_eq(r.source, "user");
    stof__db_record_clear(&r);
    stof__db_close(&db);

    /* Without a good layer below, the damaged record is a miss. */
    db = open_db(ctx, P("user.db"), NULL);
    cr_assert_eq(stof__db_lookup(db, k1, &r), STOF_ERR_NOT_FOUND);
    cr_assert_eq(stof__db_lookup(db, k2, &r), STOF_ERR_NOT_FOUND);
    stof__db_close(&db);
    stof_close(&ctx);
}

Test(trust, trust_is_per_record_local_and_persistent)
{
    stof_context *ctx = ctx_new();
    const uint64_t seeds[] = {10, 11};
    make_db(ctx, P("sys.db"), seeds, 2, 1); /* trusted where it was made */
    char k10[33], k11[33];
    snprintf(k10, sizeof(k10), "%032x", 10);
    snprintf(k11, sizeof(k11), "%032x", 11);
    const char *sys[] = {P("sys.db"), NULL};

    /* A new host: the system database's own trust table is not read. */
    stof_db *db = open_db(ctx, P("user.db"), sys);
    stof_db_record r;
    cr_assert_eq(stof__db_lookup(db, k10, &r), STOF_OK);
    cr_assert_eq(r.layer, 1);
    cr_assert(!stof__db_trusted(db, &r), "trust came from a system database");
    stof__db_trust(db, &r);
    cr_assert(stof__db_trusted(db, &r));
    stof__db_record_clear(&r);
    stof__db_close(&db);

    /* Remembered across opens, for that record only. */
    db = open_db(ctx, P("user.db"), sys);
    cr_assert_eq(stof__db_lookup(db, k10, &r), STOF_OK);
    cr_assert(stof__db_trusted(db, &r));
    stof_db_record other = r;
    other.cubin = NULL;
    other.content_hash[0] ^= 1; /* another record under the same key */
    cr_assert(!stof__db_trusted(db, &other));
    stof__db_record_clear(&r);
    cr_assert_eq(stof__db_lookup(db, k11, &r), STOF_OK);
    cr_assert(!stof__db_trusted(db, &r));
    stof__db_record_clear(&r);

    /* A record tuned here is trusted with its store. */
    tu_record_fill(&r, 12, 64);
    cr_assert_eq(stof__db_store(db, &r, 0, 1), STOF_OK);
    stof__db_record_clear(&r);
    char k12[33];
    snprintf(k12, sizeof(k12), "%032x", 12);
    cr_assert_eq(stof__db_lookup(db, k12, &r), STOF_OK);
    cr_assert(stof__db_trusted(db, &r));
    stof__db_record_clear(&r);
    stof__db_close(&db);

    /* Without a writable user database the trust lasts as long as the
     * handle. */
    db = open_db(ctx, "", sys);
    cr_assert_eq(stof__db_lookup(db, k11, &r), STOF_OK);
    cr_assert(!stof__db_trusted(db, &r));
    stof__db_trust(db, &r);
    cr_assert(stof__db_trusted(db, &r));
    stof__db_record_clear(&r);
    stof__db_close(&db);
    db = open_db(ctx, "", sys);
    cr_assert_eq(stof__db_lookup(db, k11, &r), STOF_OK);
    cr_assert(!stof__db_trusted(db, &r));
    stof__db_record_clear(&r);
    stof__db_close(&db);
    stof_close(&ctx);
}

Test(trust, forget_deletes_only_the_record_that_failed)
{
    stof_context *ctx = ctx_new();
    const uint64_t seeds[] = {20};
    make_db(ctx, P("user.db"), seeds, 1, 0);
    char k[33];
    snprintf(k, sizeof(k), "%032x", 20);
    stof_db *db = open_db(ctx, P("user.db"), NULL);
    stof_db_record r;
    cr_assert_eq(stof__db_lookup(db, k, &r), STOF_OK);
    char h[33];
    memcpy(h, r.content_hash, sizeof(h));
    stof__db_record_clear(&r);
    stof__db_forget(db, k, "00000000000000000000000000000000");
    cr_assert_eq(stof__db_lookup(db, k, &r), STOF_OK, "another record stays");
    stof__db_record_clear(&r);
    stof__db_forget(db, k, h);
    cr_assert_eq(stof__db_lookup(db, k, &r), STOF_ERR_NOT_FOUND);
    stof__db_close(&db);
    stof_close(&ctx);
}

/* The version-1 schema exactly as stof 0.1 wrote it. */
static const char v1_sql[] =
    "CREATE TABLE meta(key TEXT PRIMARY KEY NOT NULL, value NOT NULL);"
    "CREATE TABLE records(key TEXT PRIMARY KEY NOT NULL, op TEXT NOT NULL,"
    " mask_digest TEXT NOT NULL, mask_spec TEXT NOT NULL,"
    " batch INTEGER NOT NULL, heads INTEGER NOT NULL, seq_q INTEGER NOT NULL,"
    " seq_k INTEGER NOT NULL, head_dim INTEGER NOT NULL,"
    " dtype TEXT NOT NULL, layout TEXT NOT NULL, device_name TEXT NOT NULL,"
    " cc_major INTEGER NOT NULL, cc_minor INTEGER NOT NULL,"
    " sm_count INTEGER NOT NULL, driver_version INTEGER NOT NULL,"
    " nvrtc_version TEXT NOT NULL, stof_version TEXT NOT NULL,"
    " template_hash TEXT NOT NULL, kernel TEXT NOT NULL,"
    " config TEXT NOT NULL, arch TEXT NOT NULL, time_ms REAL NOT NULL,"
    " runner_up_ms REAL NOT NULL, model_ms REAL NOT NULL,"
    " n_candidates INTEGER NOT NULL, verified INTEGER NOT NULL,"
    " measured TEXT NOT NULL, created_at INTEGER NOT NULL,"
    " host TEXT NOT NULL, cubin BLOB, hits INTEGER NOT NULL DEFAULT 0);"
    "CREATE TABLE misses(key TEXT PRIMARY KEY NOT NULL, problem TEXT NOT NULL,"
    " mask BLOB, count INTEGER NOT NULL DEFAULT 1,"
    " first_seen INTEGER NOT NULL, last_seen INTEGER NOT NULL);"
    "INSERT INTO records VALUES('0000000000000000000000000000002a',"
    " 'attention', '', '', 1, 1, 64, 64, 64, 'fp16', 'BHSD', 'GPU', 9, 0,"
    " 132, 13000, '13.0', '0.1.0', '0000000000000000', 'block', '{}',"
    " 'sm_90', 1.0, 0, 0, 1, 1, '{}', 1700000000, 'h', x'00112233', 0);"
    "PRAGMA application_id = 1398034246; PRAGMA user_version = 1;";

Test(trust, a_version_1_database_is_upgraded_and_its_records_ignored)
{
    raw_exec(P("v1.db"), v1_sql);
    stof_context *ctx = ctx_new();
    stof_db *db = open_db(ctx, P("v1.db"), NULL);
    cr_assert(stof__db_writable(db), "%s", logbuf);
    stof_db_record r;
    cr_assert_eq(stof__db_lookup(db, "0000000000000000000000000000002a", &r),
                 STOF_ERR_NOT_FOUND);
    cr_assert(strstr(logbuf, "no content hash"), "%s", logbuf);
    tu_record_fill(&r, 43, 64);
    cr_assert_eq(stof__db_store(db, &r, 0, 1), STOF_OK, "%s",
                 stof_errmsg(ctx));
    stof__db_record_clear(&r);
    stof__db_close(&db);
    sqlite3 *c = NULL;
    cr_assert_eq(sqlite3_open(P("v1.db"), &c), SQLITE_OK);
    sqlite3_stmt *s = NULL;
    cr_assert_eq(sqlite3_prepare_v2(c, "PRAGMA user_version", -1, &s, NULL),
                 SQLITE_OK);
    cr_assert_eq(sqlite3_step(s), SQLITE_ROW);
    cr_assert_eq(sqlite3_column_int(s, 0), STOF_DB_SCHEMA_VERSION);
    sqlite3_finalize(s);
    sqlite3_close(c);

    /* stof's id and version 1 over other tables: someone else's file,
     * never migrated or written. */
    raw_exec(P("odd.db"), "CREATE TABLE records(key TEXT PRIMARY KEY);"
                          "PRAGMA application_id = 1398034246;"
                          "PRAGMA user_version = 1;");
    struct stat before, after;
    cr_assert_eq(stat(P("odd.db"), &before), 0);
    db = open_db(ctx, P("odd.db"), NULL);
    cr_assert(!stof__db_writable(db));
    cr_assert(strstr(logbuf, "not those of stof's schema"), "%s", logbuf);
    stof__db_close(&db);
    cr_assert_eq(stat(P("odd.db"), &after), 0);
    cr_assert_eq(before.st_size, after.st_size);
    cr_assert_eq(before.st_mtime, after.st_mtime);
    stof_close(&ctx);
}

/* The names in dir, sorted, as one string. */
static void listing(char *buf, size_t n)
{
    struct dirent **names = NULL;
    int k = scandir(dir, &names, NULL, alphasort);
    cr_assert(k >= 0);
    buf[0] = '\0';
    for (int i = 0; i < k; i++) {
        size_t len = strlen(buf);
        snprintf(buf + len, n - len, "%s ", names[i]->d_name);
        free(names[i]);
    }
    free(names);
}

Test(trust, reading_writes_nothing_beside_the_file)
{
    stof_context *ctx = ctx_new();
    const uint64_t seeds[] = {30, 31};
    make_db(ctx, P("wal.db"), seeds, 2, 0); /* a closed WAL database */
    char before[1024], after[1024];
    listing(before, sizeof(before));
    cr_assert(!strstr(before, "-wal") && !strstr(before, "-shm"), "%s",
              before);

    /* As a system layer (the library) and through the read-only open
     * (stof-tune). */
    const char *sys[] = {P("wal.db"), NULL};
    stof_db *db = open_db(ctx, "", sys);
    char k[33];
    snprintf(k, sizeof(k), "%032x", 30);
    stof_db_record r;
    cr_assert_eq(stof__db_lookup(db, k, &r), STOF_OK, "%s", logbuf);
    stof__db_record_clear(&r);
    listing(after, sizeof(after));
    cr_assert_str_eq(after, before, "while open");
    stof__db_close(&db);
    sqlite3 *c = NULL;
    cr_assert_eq(stof__db_open_readonly(P("wal.db"), &c), SQLITE_OK);
    cr_assert_eq(sqlite3_exec(c, "SELECT count(*) FROM records", NULL, NULL,
                              NULL),
                 SQLITE_OK);
    sqlite3_close(c);
    listing(after, sizeof(after));
    cr_assert_str_eq(after, before);

    /* A file with a WAL header and garbage after it. */
    FILE *f = fopen(P("wal.db"), "r+b");
    cr_assert_not_null(f);
    cr_assert_eq(fseek(f, 200, SEEK_SET), 0);
    for (int i = 0; i < 4000; i++)
        fputc(i * 37, f);
    fclose(f);
    db = open_db(ctx, "", sys);
    (void)stof__db_lookup(db, k, &r);
    stof__db_record_clear(&r);
    stof__db_close(&db);
    listing(after, sizeof(after));
    cr_assert_str_eq(after, before, "beside a corrupt file");

    /* A read-only directory: reading works. */
    make_db(ctx, P("ro.db"), seeds, 1, 0);
    listing(before, sizeof(before));
    cr_assert_eq(chmod(dir, 0555), 0);
    const char *sys2[] = {P("ro.db"), NULL};
    db = open_db(ctx, "", sys2);
    cr_assert_eq(stof__db_lookup(db, k, &r), STOF_OK, "%s", logbuf);
    stof__db_record_clear(&r);
    stof__db_close(&db);
    cr_assert_eq(chmod(dir, 0755), 0);
    listing(after, sizeof(after));
    cr_assert_str_eq(after, before);
    stof_close(&ctx);
}

Test(trust, the_key_does_not_depend_on_the_layout)
{
    stof_context *ctx = ctx_new();
    char k[3][33];
    const stof_layout layouts[3] = {STOF_LAYOUT_BHSD, STOF_LAYOUT_BSHD,
                                    STOF_LAYOUT_STRIDED};
    for (int i = 0; i < 3; i++) {
        stof_attention_desc d;
        /* Strided: BSHD strides given as such (what Python passes). */
        cr_assert_eq(stof_attention_desc_init(&d, 2, 8, 1024, 1024, 64,
                                              STOF_DTYPE_FP16,
                                              i == 2 ? STOF_LAYOUT_BSHD
                                                     : layouts[i]),
                     STOF_OK);
        d.layout = layouts[i];
        stof__attention_key(ctx, &d, "0123456789abcdef0123456789abcdef",
                            k[i], NULL, 0);
    }
    cr_assert_str_eq(k[0], k[1]);
    cr_assert_str_eq(k[0], k[2]);
    /* What the kernel depends on still changes the key. */
    stof_attention_desc d;
    stof_attention_desc_init(&d, 2, 8, 1024, 1024, 64, STOF_DTYPE_BF16,
                             STOF_LAYOUT_BHSD);
    char kb[33];
    stof__attention_key(ctx, &d, "0123456789abcdef0123456789abcdef", kb, NULL,
                        0);
    cr_assert_str_neq(k[0], kb);
    stof_close(&ctx);
}
