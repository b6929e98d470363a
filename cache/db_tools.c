/*
 * db_tools.c - whole-file operations on tuning databases (see db_tools.h):
 * check, export/merge into a new file, import into an existing one, gc.
 *
 * The schema itself belongs to db.c: a new file is created through
 * stof__db_open (so it gets exactly the schema a running library makes),
 * and the merge statements are built from the `records` table's own column
 * list (PRAGMA table_info), so a column added by a later migration takes
 * part in the merge order without a change here.
 *
 * Inputs are attached read-only, one at a time ("src"), to a connection on
 * the destination; each input is merged in its own transaction.
 */
#include "db_tools.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <sqlite3.h>

#define DBT_APPLICATION_ID 0x53544f46 /* "STOF", as in db.c */
#define DBT_BUSY_TIMEOUT_MS 10000

/* ------------------------------------------------------------ helpers */

static stof_status dbt_sql_fail(stof_context *ctx, sqlite3 *c, int rc,
                                const char *what, const char *path)
{
    return stof__fail(ctx, STOF_ERR_DATABASE, "%s: %s: %s (SQLite error %d)",
                      path, what, c ? sqlite3_errmsg(c) : sqlite3_errstr(rc),
                      rc);
}

static int dbt_connect(const char *path, int writable, sqlite3 **out)
{
    *out = NULL;
    char *uri = stof__db_path_uri(path, writable ? "" : "?mode=ro");
    if (!uri)
        return SQLITE_NOMEM;
    int flags = SQLITE_OPEN_URI | SQLITE_OPEN_NOMUTEX |
                (writable ? SQLITE_OPEN_READWRITE : SQLITE_OPEN_READONLY);
    int rc = sqlite3_open_v2(uri, out, flags, NULL);
    free(uri);
    if (rc == SQLITE_OK)
        rc = sqlite3_extended_result_codes(*out, 1);
    if (rc == SQLITE_OK)
        rc = sqlite3_busy_timeout(*out, DBT_BUSY_TIMEOUT_MS);
    return rc;
}

/* Run a statement that returns no rows, with up to two text bindings. */
static int dbt_exec(sqlite3 *c, const char *sql, const char *a, const char *b)
{
    sqlite3_stmt *s = NULL;
    int rc = sqlite3_prepare_v2(c, sql, -1, &s, NULL);
    if (rc == SQLITE_OK && a)
        rc = sqlite3_bind_text(s, 1, a, -1, SQLITE_STATIC);
    if (rc == SQLITE_OK && b)
        rc = sqlite3_bind_text(s, 2, b, -1, SQLITE_STATIC);
    if (rc == SQLITE_OK) {
        rc = sqlite3_step(s);
        if (rc == SQLITE_DONE || rc == SQLITE_ROW)
            rc = SQLITE_OK;
    }
    sqlite3_finalize(s);
    return rc;
}

static void dbt_rollback(sqlite3 *c)
{
    if (c && !sqlite3_get_autocommit(c))
        (void)sqlite3_exec(c, "ROLLBACK", NULL, NULL, NULL);
}

/* One int64 from a query with up to two text bindings (0 when no row). */
static int dbt_int64(sqlite3 *c, const char *sql, const char *a,
                     const char *b, int64_t *out)
{
    sqlite3_stmt *s = NULL;
    *out = 0;
    int rc = sqlite3_prepare_v2(c, sql, -1, &s, NULL);
    if (rc == SQLITE_OK && a)
        rc = sqlite3_bind_text(s, 1, a, -1, SQLITE_STATIC);
    if (rc == SQLITE_OK && b)
        rc = sqlite3_bind_text(s, 2, b, -1, SQLITE_STATIC);
    if (rc == SQLITE_OK) {
        rc = sqlite3_step(s);
        if (rc == SQLITE_ROW) {
            *out = sqlite3_column_int64(s, 0);
            rc = SQLITE_OK;
        } else if (rc == SQLITE_DONE) {
            rc = SQLITE_OK;
        }
    }
    sqlite3_finalize(s);
    return rc;
}

/* ------------------------------------------------------------- check */

/* Classify an open connection's main database; 0 when it is a current stof
 * database, else a reason in why. */
static int dbt_classify(sqlite3 *c, char *why, size_t n, int *sqlite_rc)
{
    static const char sql[] =
        "SELECT (SELECT application_id FROM pragma_application_id),"
        " (SELECT user_version FROM pragma_user_version),"
        " (SELECT count(*) FROM sqlite_master),"
        " (SELECT count(*) FROM sqlite_master WHERE type = 'table' AND"
        "  name IN ('records', 'misses'))";
    sqlite3_stmt *s = NULL;
    int rc = sqlite3_prepare_v2(c, sql, -1, &s, NULL);
    if (rc == SQLITE_OK)
        rc = sqlite3_step(s);
    *sqlite_rc = SQLITE_OK;
    if (rc != SQLITE_ROW) {
        *sqlite_rc = rc;
        snprintf(why, n, "%s",
                 (rc & 0xff) == SQLITE_NOTADB ? "not a SQLite database"
                                              : sqlite3_errmsg(c));
        sqlite3_finalize(s);
        return -1;
    }
    int app = sqlite3_column_int(s, 0), ver = sqlite3_column_int(s, 1),
        objects = sqlite3_column_int(s, 2), tables = sqlite3_column_int(s, 3);
    sqlite3_finalize(s);
    if (app == 0 && objects == 0) {
        snprintf(why, n, "empty file, not a stof tuning database");
        return -1;
    }
    if (app != DBT_APPLICATION_ID) {
        snprintf(why, n, "not a stof tuning database (application_id 0x%08x)",
                 (unsigned)app);
        return -1;
    }
    if (ver > STOF_DB_SCHEMA_VERSION) {
        snprintf(why, n,
                 "schema version %d is newer than this build's (%d): written "
                 "by a later stof",
                 ver, STOF_DB_SCHEMA_VERSION);
        return -1;
    }
    if (ver < STOF_DB_SCHEMA_VERSION || tables != 2) {
        snprintf(why, n,
                 "schema version %d does not match this build's (%d); open it "
                 "once with this stof as a user database to upgrade it",
                 ver, STOF_DB_SCHEMA_VERSION);
        return -1;
    }
    return 0;
}

stof_status stof__dbt_check(stof_context *ctx, const char *path)
{
    STOF_CHECK_ARG(ctx, path && *path, "stof__dbt_check: no path");
    struct stat sb;
    if (stat(path, &sb) != 0)
        return stof__fail(ctx,
                          errno == ENOENT ? STOF_ERR_NOT_FOUND
                                          : STOF_ERR_DATABASE,
                          "%s: %s", path, strerror(errno));
    if (!S_ISREG(sb.st_mode))
        return stof__fail(ctx, STOF_ERR_DATABASE, "%s: not a regular file",
                          path);
    if (sb.st_size == 0)
        return stof__fail(ctx, STOF_ERR_DATABASE,
                          "%s: empty file, not a stof tuning database", path);
    sqlite3 *c = NULL;
    int rc = dbt_connect(path, 0, &c);
    if (rc != SQLITE_OK) {
        stof_status st = dbt_sql_fail(ctx, c, rc, "cannot open", path);
        sqlite3_close(c);
        return st;
    }
    char why[256];
    int src;
    int bad = dbt_classify(c, why, sizeof(why), &src);
    sqlite3_close(c);
    if (bad)
        return stof__fail(ctx, STOF_ERR_DATABASE, "%s: %s", path, why);
    return stof__ok(ctx);
}

/* ---------------------------------------------------- merge statements */

typedef struct dbt_sql {
    char *insert;     /* records from src, replacing worse ones */
    char *hits;       /* hits = max over inputs */
    char *misses;     /* misses from src */
    char *losers;     /* src records that differ from the result's */
} dbt_sql;

static void dbt_sql_free(dbt_sql *q)
{
    free(q->insert);
    free(q->hits);
    free(q->misses);
    free(q->losers);
    memset(q, 0, sizeof(*q));
}

/* A growing string; on allocation failure it stays NULL-ed and `bad`. */
typedef struct dbt_buf {
    char *p;
    size_t len, cap;
    int bad;
} dbt_buf;

static void buf_add(dbt_buf *b, const char *s)
{
    size_t n = strlen(s);
    if (b->bad)
        return;
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (b->len + n + 1 > cap)
            cap *= 2;
        char *p = realloc(b->p, cap);
        if (!p) {
            b->bad = 1;
            return;
        }
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->len, s, n + 1);
    b->len += n;
}

/* The records filter for table alias t (bound: ?1 gpu or NULL, ?2 driver,
 * 0 = any). */
static void buf_filter(dbt_buf *b, const char *t)
{
    char f[256];
    snprintf(f, sizeof(f),
             "(?1 IS NULL OR lower(%s.device_name) = lower(?1)) AND"
             " (?2 = 0 OR %s.driver_version = ?2)",
             t, t);
    buf_add(b, f);
}

/* The merge order of table alias t: a row value that is smaller for the
 * better record; every content column takes part. */
static void buf_order(dbt_buf *b, const char *t, char **cols, int n)
{
    static const char *const first[] = {"verified", "time_ms", "cubin",
                                        "created_at", "host"};
    char part[160];
    snprintf(part, sizeof(part),
             "(%s.verified = 0, %s.time_ms, coalesce(%s.cubin, x''), "
             "%s.created_at, %s.host",
             t, t, t, t, t);
    buf_add(b, part);
    for (int i = 0; i < n; i++) {
        int skip = 0;
        for (size_t j = 0; j < sizeof(first) / sizeof(*first); j++)
            skip |= !strcmp(cols[i], first[j]);
        if (skip)
            continue;
        snprintf(part, sizeof(part), ", %s.%s", t, cols[i]);
        buf_add(b, part);
    }
    buf_add(b, ")");
}

/* Build the statements from main.records' columns. */
static int dbt_sql_build(sqlite3 *c, dbt_sql *q)
{
    memset(q, 0, sizeof(*q));
    char *cols[96];
    int n = 0;
    sqlite3_stmt *s = NULL;
    int rc = sqlite3_prepare_v2(c, "SELECT name FROM pragma_table_info("
                                   "'records', 'main') ORDER BY cid",
                                -1, &s, NULL);
    while (rc == SQLITE_OK && (rc = sqlite3_step(s)) == SQLITE_ROW) {
        const char *name = (const char *)sqlite3_column_text(s, 0);
        rc = SQLITE_OK;
        if (!name || !strcmp(name, "key") || !strcmp(name, "hits"))
            continue;
        if (n == (int)(sizeof(cols) / sizeof(*cols)) ||
            !(cols[n] = strdup(name))) {
            rc = SQLITE_NOMEM;
            break;
        }
        n++;
    }
    if (rc == SQLITE_DONE)
        rc = SQLITE_OK;
    sqlite3_finalize(s);

    dbt_buf all = {0}, ins = {0}, hits = {0}, mis = {0}, los = {0};
    if (rc == SQLITE_OK) {
        buf_add(&all, "key");
        for (int i = 0; i < n; i++) {
            buf_add(&all, ",");
            buf_add(&all, cols[i]);
        }
        buf_add(&all, ",hits");

        buf_add(&ins, "INSERT INTO main.records(");
        buf_add(&ins, all.p ? all.p : "");
        buf_add(&ins, ") SELECT ");
        buf_add(&ins, all.p ? all.p : "");
        buf_add(&ins, " FROM src.records AS s WHERE ");
        buf_filter(&ins, "s");
        buf_add(&ins, " ON CONFLICT(key) DO UPDATE SET ");
        for (int i = 0; i < n; i++) {
            buf_add(&ins, i ? ", " : "");
            buf_add(&ins, cols[i]);
            buf_add(&ins, " = excluded.");
            buf_add(&ins, cols[i]);
        }
        buf_add(&ins, " WHERE ");
        buf_order(&ins, "excluded", cols, n);
        buf_add(&ins, " < ");
        buf_order(&ins, "records", cols, n);

        buf_add(&hits, "UPDATE main.records SET hits = max(hits, (SELECT "
                       "s.hits FROM src.records AS s WHERE s.key = "
                       "records.key)) WHERE key IN (SELECT s.key FROM "
                       "src.records AS s WHERE ");
        buf_filter(&hits, "s");
        buf_add(&hits, ")");

        buf_add(&mis,
                "INSERT INTO main.misses(key, problem, mask, count, "
                "first_seen, last_seen) SELECT key, problem, mask, count, "
                "first_seen, last_seen FROM src.misses WHERE true "
                "ON CONFLICT(key) DO UPDATE SET "
                "count = max(misses.count, excluded.count), "
                "first_seen = min(misses.first_seen, excluded.first_seen), "
                "last_seen = max(misses.last_seen, excluded.last_seen), "
                "problem = min(misses.problem, excluded.problem), "
                "mask = CASE WHEN misses.mask IS NULL THEN excluded.mask "
                "WHEN excluded.mask IS NULL THEN misses.mask "
                "WHEN excluded.mask < misses.mask THEN excluded.mask "
                "ELSE misses.mask END");

        buf_add(&los, "INSERT INTO temp.dbt_losers(key, input, kernel, "
                      "time_ms, verified, host) SELECT s.key, ?3, s.kernel, "
                      "s.time_ms, s.verified, s.host FROM src.records AS s "
                      "JOIN main.records AS m ON m.key = s.key WHERE ");
        buf_filter(&los, "s");
        buf_add(&los, " AND (0");
        for (int i = 0; i < n; i++) {
            buf_add(&los, " OR s.");
            buf_add(&los, cols[i]);
            buf_add(&los, " IS NOT m.");
            buf_add(&los, cols[i]);
        }
        buf_add(&los, ")");
    }
    for (int i = 0; i < n; i++)
        free(cols[i]);
    free(all.p);
    q->insert = ins.p;
    q->hits = hits.p;
    q->misses = mis.p;
    q->losers = los.p;
    if (rc == SQLITE_OK && (ins.bad || hits.bad || mis.bad || los.bad || all.bad))
        rc = SQLITE_NOMEM;
    if (rc != SQLITE_OK)
        dbt_sql_free(q);
    return rc;
}

/* Run one of the statements with the filter bound (and ?3 = input index
 * when the statement has it). */
static int dbt_run_filtered(sqlite3 *c, const char *sql,
                            const stof_dbt_filter *f, int input)
{
    sqlite3_stmt *s = NULL;
    int rc = sqlite3_prepare_v2(c, sql, -1, &s, NULL);
    int np = rc == SQLITE_OK ? sqlite3_bind_parameter_count(s) : 0;
    if (rc == SQLITE_OK && np >= 1)
        rc = f && f->gpu && *f->gpu
                 ? sqlite3_bind_text(s, 1, f->gpu, -1, SQLITE_STATIC)
                 : sqlite3_bind_null(s, 1);
    if (rc == SQLITE_OK && np >= 2)
        rc = sqlite3_bind_int(s, 2, f ? f->driver : 0);
    if (rc == SQLITE_OK && np >= 3)
        rc = sqlite3_bind_int(s, 3, input);
    if (rc == SQLITE_OK) {
        rc = sqlite3_step(s);
        if (rc == SQLITE_DONE)
            rc = SQLITE_OK;
    }
    sqlite3_finalize(s);
    return rc;
}

static int dbt_attach(sqlite3 *c, const char *path)
{
    char *uri = stof__db_path_uri(path, "?mode=ro");
    if (!uri)
        return SQLITE_NOMEM;
    int rc = dbt_exec(c, "ATTACH DATABASE ?1 AS src", uri, NULL);
    free(uri);
    return rc;
}

static void dbt_detach(sqlite3 *c)
{
    (void)sqlite3_exec(c, "DETACH DATABASE src", NULL, NULL, NULL);
}

/* Merge the inputs into the database open on c (path: for messages). */
static stof_status dbt_merge_conn(stof_context *ctx, sqlite3 *c,
                                  const char *path, const char *const *inputs,
                                  int n, const stof_dbt_filter *f,
                                  int with_misses,
                                  stof_dbt_conflict_fn conflict_fn, void *user,
                                  stof_dbt_result *res)
{
    dbt_sql q;
    int rc = dbt_sql_build(c, &q);
    if (rc != SQLITE_OK)
        return dbt_sql_fail(ctx, c, rc, "preparing the merge", path);
    stof_status st = STOF_OK;
    rc = sqlite3_exec(c,
                      "CREATE TEMP TABLE IF NOT EXISTS dbt_losers(key TEXT, "
                      "input INTEGER, kernel TEXT, time_ms REAL, verified "
                      "INTEGER, host TEXT); DELETE FROM temp.dbt_losers",
                      NULL, NULL, NULL);
    if (rc != SQLITE_OK)
        st = dbt_sql_fail(ctx, c, rc, "preparing the merge", path);

    /* Pass 1: merge every input, each in one transaction. */
    for (int i = 0; st == STOF_OK && i < n; i++) {
        rc = dbt_attach(c, inputs[i]);
        if (rc != SQLITE_OK) {
            st = dbt_sql_fail(ctx, c, rc, "cannot attach", inputs[i]);
            break;
        }
        int64_t before = 0;
        rc = dbt_exec(c, "BEGIN IMMEDIATE", NULL, NULL);
        if (rc == SQLITE_OK && res) {
            /* records_read: those the filter takes. */
            sqlite3_stmt *s = NULL;
            dbt_buf b = {0};
            buf_add(&b, "SELECT count(*) FROM src.records AS s WHERE ");
            buf_filter(&b, "s");
            rc = b.bad ? SQLITE_NOMEM
                       : sqlite3_prepare_v2(c, b.p, -1, &s, NULL);
            free(b.p);
            if (rc == SQLITE_OK)
                rc = f && f->gpu && *f->gpu
                         ? sqlite3_bind_text(s, 1, f->gpu, -1, SQLITE_STATIC)
                         : sqlite3_bind_null(s, 1);
            if (rc == SQLITE_OK)
                rc = sqlite3_bind_int(s, 2, f ? f->driver : 0);
            if (rc == SQLITE_OK && (rc = sqlite3_step(s)) == SQLITE_ROW) {
                before = sqlite3_column_int64(s, 0);
                rc = SQLITE_OK;
            }
            sqlite3_finalize(s);
            res->records_read += before;
        }
        if (rc == SQLITE_OK)
            rc = dbt_run_filtered(c, q.insert, f, i);
        if (rc == SQLITE_OK)
            rc = dbt_run_filtered(c, q.hits, f, i);
        if (rc == SQLITE_OK && with_misses)
            rc = dbt_run_filtered(c, q.misses, f, i);
        if (rc == SQLITE_OK)
            rc = dbt_exec(c, "COMMIT", NULL, NULL);
        if (rc != SQLITE_OK) {
            st = dbt_sql_fail(ctx, c, rc, "merging", inputs[i]);
            dbt_rollback(c);
        }
        dbt_detach(c);
    }
    /* Misses that now have a record are answered. */
    if (st == STOF_OK) {
        rc = dbt_exec(c,
                      "DELETE FROM main.misses WHERE key IN (SELECT key FROM "
                      "main.records)",
                      NULL, NULL);
        if (rc != SQLITE_OK)
            st = dbt_sql_fail(ctx, c, rc, "dropping answered misses", path);
    }
    /* Pass 2: the input records that lost to a different record. */
    for (int i = 0; st == STOF_OK && i < n; i++) {
        rc = dbt_attach(c, inputs[i]);
        if (rc == SQLITE_OK)
            rc = dbt_run_filtered(c, q.losers, f, i);
        if (rc != SQLITE_OK)
            st = dbt_sql_fail(ctx, c, rc, "comparing", inputs[i]);
        dbt_detach(c);
    }
    if (st == STOF_OK) {
        sqlite3_stmt *s = NULL;
        rc = sqlite3_prepare_v2(
            c,
            "SELECT l.key, l.input, l.kernel, l.time_ms, l.verified, l.host,"
            " m.kernel, m.time_ms, m.verified, m.host FROM temp.dbt_losers l"
            " JOIN main.records m ON m.key = l.key ORDER BY l.key, l.input",
            -1, &s, NULL);
        char lastkey[33] = "";
        while (rc == SQLITE_OK && (rc = sqlite3_step(s)) == SQLITE_ROW) {
            stof_dbt_conflict x;
            memset(&x, 0, sizeof(x));
            const char *k = (const char *)sqlite3_column_text(s, 0);
            snprintf(x.key, sizeof(x.key), "%s", k ? k : "");
            int in = sqlite3_column_int(s, 1);
            x.input = in >= 0 && in < n ? inputs[in] : "?";
            const char *t = (const char *)sqlite3_column_text(s, 2);
            snprintf(x.loser_kernel, sizeof(x.loser_kernel), "%s", t ? t : "");
            x.loser_ms = sqlite3_column_double(s, 3);
            x.loser_verified = sqlite3_column_int(s, 4) != 0;
            t = (const char *)sqlite3_column_text(s, 5);
            snprintf(x.loser_host, sizeof(x.loser_host), "%s", t ? t : "");
            t = (const char *)sqlite3_column_text(s, 6);
            snprintf(x.winner_kernel, sizeof(x.winner_kernel), "%s",
                     t ? t : "");
            x.winner_ms = sqlite3_column_double(s, 7);
            x.winner_verified = sqlite3_column_int(s, 8) != 0;
            t = (const char *)sqlite3_column_text(s, 9);
            snprintf(x.winner_host, sizeof(x.winner_host), "%s", t ? t : "");
            if (res) {
                res->losers++;
                if (strcmp(lastkey, x.key))
                    res->conflicts++;
            }
            snprintf(lastkey, sizeof(lastkey), "%s", x.key);
            if (conflict_fn)
                conflict_fn(user, &x);
            rc = SQLITE_OK;
        }
        if (rc == SQLITE_DONE)
            rc = SQLITE_OK;
        sqlite3_finalize(s);
        if (rc != SQLITE_OK)
            st = dbt_sql_fail(ctx, c, rc, "reporting conflicts", path);
    }
    if (st == STOF_OK && res) {
        rc = dbt_int64(c, "SELECT count(*) FROM main.records", NULL, NULL,
                       &res->records);
        if (rc == SQLITE_OK)
            rc = dbt_int64(c, "SELECT count(*) FROM main.misses", NULL, NULL,
                           &res->misses);
        if (rc != SQLITE_OK)
            st = dbt_sql_fail(ctx, c, rc, "counting", path);
    }
    (void)sqlite3_exec(c, "DROP TABLE IF EXISTS temp.dbt_losers", NULL, NULL,
                       NULL);
    dbt_sql_free(&q);
    return st;
}

/* Check every input before anything is written. */
static stof_status dbt_check_inputs(stof_context *ctx,
                                    const char *const *inputs, int n)
{
    for (int i = 0; i < n; i++) {
        stof_status st = stof__dbt_check(ctx, inputs[i]);
        if (st != STOF_OK)
            return st;
    }
    return STOF_OK;
}

/* Create (or upgrade) a stof database at path through db.c and open a
 * read-write connection to it. */
static stof_status dbt_open_dest(stof_context *ctx, const char *path,
                                 sqlite3 **out)
{
    *out = NULL;
    stof_db *db = NULL;
    stof_status st = stof__db_open(ctx, path, NULL, &db);
    if (st != STOF_OK)
        return st;
    int w = stof__db_writable(db);
    stof__db_close(&db);
    if (!w)
        return stof__fail(ctx, STOF_ERR_DATABASE,
                          "%s: cannot be written as a stof tuning database "
                          "(read-only, foreign, corrupt or a newer schema)",
                          path);
    int rc = dbt_connect(path, 1, out);
    if (rc != SQLITE_OK) {
        st = dbt_sql_fail(ctx, *out, rc, "cannot open", path);
        sqlite3_close(*out);
        *out = NULL;
        return st;
    }
    return STOF_OK;
}

static void dbt_unlink_all(const char *path)
{
    static const char *const sfx[] = {"", "-wal", "-shm", "-journal"};
    size_t n = strlen(path) + 16;
    char *p = malloc(n);
    if (!p)
        return;
    for (size_t i = 0; i < sizeof(sfx) / sizeof(*sfx); i++) {
        snprintf(p, n, "%s%s", path, sfx[i]);
        (void)unlink(p);
    }
    free(p);
}

stof_status stof__dbt_write(stof_context *ctx, const char *out_path,
                            const char *const *inputs, int n,
                            const stof_dbt_filter *f, int with_misses,
                            stof_dbt_conflict_fn conflict_fn, void *user,
                            stof_dbt_result *res)
{
    STOF_CHECK_ARG(ctx, out_path && *out_path, "stof__dbt_write: no output");
    STOF_CHECK_ARG(ctx, n >= 0 && (inputs || n == 0),
                   "stof__dbt_write: no inputs");
    if (res)
        memset(res, 0, sizeof(*res));
    stof_status st = dbt_check_inputs(ctx, inputs, n);
    if (st != STOF_OK)
        return st;
    size_t tn = strlen(out_path) + 16;
    char *tmp = malloc(tn);
    if (!tmp)
        return stof__fail(ctx, STOF_ERR_OUT_OF_MEMORY, "out of memory");
    snprintf(tmp, tn, "%s.tmp-XXXXXX", out_path);
    int fd = mkstemp(tmp);
    if (fd < 0) {
        st = stof__fail(ctx, STOF_ERR_IO, "%s: cannot create a file there: %s",
                        out_path, strerror(errno));
        free(tmp);
        return st;
    }
    (void)fchmod(fd, 0644);
    close(fd);
    sqlite3 *c = NULL;
    st = dbt_open_dest(ctx, tmp, &c);
    if (st == STOF_OK)
        st = dbt_merge_conn(ctx, c, out_path, inputs, n, f, with_misses,
                            conflict_fn, user, res);
    /* A self-contained file: no -wal/-shm needed by its readers. */
    if (st == STOF_OK) {
        int rc = sqlite3_exec(c, "PRAGMA journal_mode = DELETE; VACUUM", NULL,
                              NULL, NULL);
        if (rc != SQLITE_OK)
            st = dbt_sql_fail(ctx, c, rc, "finishing", out_path);
    }
    if (c) {
        int rc = sqlite3_close(c);
        if (st == STOF_OK && rc != SQLITE_OK)
            st = dbt_sql_fail(ctx, NULL, rc, "closing", out_path);
    }
    if (st == STOF_OK && rename(tmp, out_path) != 0)
        st = stof__fail(ctx, STOF_ERR_IO, "%s: cannot rename %s to it: %s",
                        out_path, tmp, strerror(errno));
    if (st != STOF_OK)
        dbt_unlink_all(tmp);
    free(tmp);
    return st == STOF_OK ? stof__ok(ctx) : st;
}

stof_status stof__dbt_merge_into(stof_context *ctx, const char *dest_path,
                                 const char *const *inputs, int n,
                                 const stof_dbt_filter *f, int with_misses,
                                 stof_dbt_conflict_fn conflict_fn, void *user,
                                 stof_dbt_result *res)
{
    STOF_CHECK_ARG(ctx, dest_path && *dest_path,
                   "stof__dbt_merge_into: no destination");
    STOF_CHECK_ARG(ctx, n >= 0 && (inputs || n == 0),
                   "stof__dbt_merge_into: no inputs");
    if (res)
        memset(res, 0, sizeof(*res));
    stof_status st = dbt_check_inputs(ctx, inputs, n);
    if (st != STOF_OK)
        return st;
    /* An existing destination must be a usable database: never let
     * stof__db_open skip a bad file and leave it looking imported. */
    struct stat sb;
    if (stat(dest_path, &sb) == 0 && sb.st_size > 0 &&
        (st = stof__dbt_check(ctx, dest_path)) != STOF_OK)
        return st;
    sqlite3 *c = NULL;
    st = dbt_open_dest(ctx, dest_path, &c);
    if (st == STOF_OK)
        st = dbt_merge_conn(ctx, c, dest_path, inputs, n, f, with_misses,
                            conflict_fn, user, res);
    sqlite3_close(c);
    return st == STOF_OK ? stof__ok(ctx) : st;
}

/* Open an existing database read-write after checking it. */
static stof_status dbt_open_existing(stof_context *ctx, const char *path,
                                     int writable, sqlite3 **out)
{
    *out = NULL;
    stof_status st = stof__dbt_check(ctx, path);
    if (st != STOF_OK)
        return st;
    int rc = dbt_connect(path, writable, out);
    if (rc != SQLITE_OK) {
        st = dbt_sql_fail(ctx, *out, rc, "cannot open", path);
        sqlite3_close(*out);
        *out = NULL;
    }
    return st;
}

stof_status stof__dbt_gc(stof_context *ctx, const char *path,
                         const char *stof_version, const char *template_hash,
                         int dry_run, int64_t *deleted, int64_t *kept)
{
    STOF_CHECK_ARG(ctx, stof_version && template_hash,
                   "stof__dbt_gc: no version");
    *deleted = *kept = 0;
    sqlite3 *c = NULL;
    stof_status st = dbt_open_existing(ctx, path, !dry_run, &c);
    if (st != STOF_OK)
        return st;
    static const char stale[] =
        "FROM records WHERE stof_version <> ?1 OR template_hash <> ?2";
    char sql[160];
    int rc = dry_run ? SQLITE_OK : dbt_exec(c, "BEGIN IMMEDIATE", NULL, NULL);
    if (rc == SQLITE_OK) {
        snprintf(sql, sizeof(sql), "SELECT count(*) %s", stale);
        rc = dbt_int64(c, sql, stof_version, template_hash, deleted);
    }
    if (rc == SQLITE_OK) {
        int64_t all = 0;
        rc = dbt_int64(c, "SELECT count(*) FROM records", NULL, NULL, &all);
        *kept = all - *deleted;
    }
    if (rc == SQLITE_OK && !dry_run) {
        snprintf(sql, sizeof(sql), "DELETE %s", stale);
        rc = dbt_exec(c, sql, stof_version, template_hash);
        if (rc == SQLITE_OK)
            rc = dbt_exec(c, "COMMIT", NULL, NULL);
    }
    if (rc != SQLITE_OK) {
        st = dbt_sql_fail(ctx, c, rc, "garbage collection", path);
        dbt_rollback(c);
    }
    sqlite3_close(c);
    return st == STOF_OK ? stof__ok(ctx) : st;
}

stof_status stof__dbt_delete(stof_context *ctx, const char *path,
                             const char *key)
{
    STOF_CHECK_ARG(ctx, key && *key, "stof__dbt_delete: no key");
    sqlite3 *c = NULL;
    stof_status st = dbt_open_existing(ctx, path, 1, &c);
    if (st != STOF_OK)
        return st;
    int rc = dbt_exec(c, "DELETE FROM records WHERE key = ?1", key, NULL);
    int changed = rc == SQLITE_OK ? sqlite3_changes(c) : 0;
    if (rc != SQLITE_OK)
        st = dbt_sql_fail(ctx, c, rc, "deleting a record", path);
    else if (!changed)
        st = stof__fail(ctx, STOF_ERR_NOT_FOUND, "%s: no record %s", path, key);
    sqlite3_close(c);
    return st == STOF_OK ? stof__ok(ctx) : st;
}

stof_status stof__dbt_miss_counts(stof_context *ctx, const char *path,
                                  int64_t *n, int64_t *total)
{
    *n = *total = 0;
    sqlite3 *c = NULL;
    stof_status st = dbt_open_existing(ctx, path, 0, &c);
    if (st != STOF_OK)
        return st;
    int rc = dbt_int64(c, "SELECT count(*) FROM misses", NULL, NULL, n);
    if (rc == SQLITE_OK)
        rc = dbt_int64(c, "SELECT coalesce(sum(count), 0) FROM misses", NULL,
                       NULL, total);
    if (rc != SQLITE_OK)
        st = dbt_sql_fail(ctx, c, rc, "reading misses", path);
    sqlite3_close(c);
    return st == STOF_OK ? stof__ok(ctx) : st;
}

int stof__dbt_collect(void *user, const stof_db_record *r)
{
    stof_dbt_records *l = user;
    if (l->n == l->cap) {
        int cap = l->cap ? 2 * l->cap : 64;
        stof_db_record *v = realloc(l->v, (size_t)cap * sizeof(*v));
        if (!v)
            return 1; /* stops the iteration; the caller sees a short list */
        l->v = v;
        l->cap = cap;
    }
    l->v[l->n] = *r;
    l->v[l->n].cubin = NULL; /* owned by the iteration, freed after the call */
    l->v[l->n].cubin_size = 0;
    l->n++;
    return 0;
}
