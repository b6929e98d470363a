/*
 * db_tools.c - whole-file operations on tuning databases (see db_tools.h):
 * checking a file, garbage collection, deleting records, counting misses,
 * and the helpers the merge (db_merge.c) shares. The schema itself belongs
 * to db.c.
 */
#include "db_tools.h"
#include "db_tools_int.h"

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

stof_status stof__dbt_sql_fail(const stof_db_sink *sink, sqlite3 *c, int rc,
                               const char *what, const char *path)
{
    return stof__dbs_fail(sink, STOF_ERR_DATABASE, "%s%s%s: %s (SQLite error %d)",
                      path, *path ? ": " : "", what,
                      c ? sqlite3_errmsg(c) : sqlite3_errstr(rc), rc);
}

int stof__dbt_connect(const char *path, int writable, sqlite3 **out)
{
    if (!writable)
        return stof__db_open_readonly(path, out);
    return stof__db_connect(path, "", SQLITE_OPEN_READWRITE,
                            DBT_BUSY_TIMEOUT_MS, out);
}

/* Run a statement that returns no rows, with up to two text bindings. */
int stof__dbt_exec(sqlite3 *c, const char *sql, const char *a, const char *b)
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

void stof__dbt_rollback(sqlite3 *c)
{
    if (c && !sqlite3_get_autocommit(c))
        (void)sqlite3_exec(c, "ROLLBACK", NULL, NULL, NULL);
}

/* One int64 from a query with up to two text bindings (0 when no row). */
int stof__dbt_int64(sqlite3 *c, const char *sql, const char *a,
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

stof_status stof__dbt_check(const stof_db_sink *sink, const char *path)
{
    DBS_CHECK_ARG(sink, path && *path, "stof__dbt_check: no path");
    struct stat sb;
    if (stat(path, &sb) != 0)
        return stof__dbs_fail(sink,
                          errno == ENOENT ? STOF_ERR_NOT_FOUND
                                          : STOF_ERR_DATABASE,
                          "%s: %s", path, strerror(errno));
    if (!S_ISREG(sb.st_mode))
        return stof__dbs_fail(sink, STOF_ERR_DATABASE, "%s: not a regular file",
                          path);
    if (sb.st_size == 0)
        return stof__dbs_fail(sink, STOF_ERR_DATABASE,
                          "%s: empty file, not a stof tuning database", path);
    sqlite3 *c = NULL;
    int rc = stof__dbt_connect(path, 0, &c);
    if (rc != SQLITE_OK) {
        stof_status st = stof__dbt_sql_fail(sink, c, rc, "cannot open", path);
        sqlite3_close(c);
        return st;
    }
    char why[256];
    int src;
    int bad = dbt_classify(c, why, sizeof(why), &src);
    sqlite3_close(c);
    if (bad)
        return stof__dbs_fail(sink, STOF_ERR_DATABASE, "%s: %s", path, why);
    return stof__dbs_ok(sink);
}

void stof__dbt_buf_add(stof_dbt_buf *b, const char *s)
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

/* ---------------------------------------------------- other commands */

/* Open an existing database read-write after checking it. */
static stof_status dbt_open_existing(const stof_db_sink *sink, const char *path,
                                     int writable, sqlite3 **out)
{
    *out = NULL;
    stof_status st = stof__dbt_check(sink, path);
    if (st != STOF_OK)
        return st;
    int rc = stof__dbt_connect(path, writable, out);
    if (rc != SQLITE_OK) {
        st = stof__dbt_sql_fail(sink, *out, rc, "cannot open", path);
        sqlite3_close(*out);
        *out = NULL;
    }
    return st;
}

stof_status stof__dbt_gc(const stof_db_sink *sink, const char *path,
                         const char *stof_version, const char *template_hash,
                         int dry_run, int64_t *deleted, int64_t *kept)
{
    DBS_CHECK_ARG(sink, stof_version && template_hash,
                   "stof__dbt_gc: no version");
    *deleted = *kept = 0;
    sqlite3 *c = NULL;
    stof_status st = dbt_open_existing(sink, path, !dry_run, &c);
    if (st != STOF_OK)
        return st;
    static const char stale[] =
        "FROM records WHERE stof_version <> ?1 OR template_hash <> ?2";
    char sql[160];
    int rc = dry_run ? SQLITE_OK : stof__dbt_exec(c, "BEGIN IMMEDIATE", NULL, NULL);
    if (rc == SQLITE_OK) {
        snprintf(sql, sizeof(sql), "SELECT count(*) %s", stale);
        rc = stof__dbt_int64(c, sql, stof_version, template_hash, deleted);
    }
    if (rc == SQLITE_OK) {
        int64_t all = 0;
        rc = stof__dbt_int64(c, "SELECT count(*) FROM records", NULL, NULL, &all);
        *kept = all - *deleted;
    }
    if (rc == SQLITE_OK && !dry_run) {
        snprintf(sql, sizeof(sql), "DELETE %s", stale);
        rc = stof__dbt_exec(c, sql, stof_version, template_hash);
        if (rc == SQLITE_OK)
            rc = stof__dbt_exec(c, "COMMIT", NULL, NULL);
    }
    if (rc != SQLITE_OK) {
        st = stof__dbt_sql_fail(sink, c, rc, "garbage collection", path);
        stof__dbt_rollback(c);
    }
    sqlite3_close(c);
    return st == STOF_OK ? stof__dbs_ok(sink) : st;
}

stof_status stof__dbt_delete(const stof_db_sink *sink, const char *path,
                             const char *key, const char *content_hash)
{
    DBS_CHECK_ARG(sink, key && *key, "stof__dbt_delete: no key");
    sqlite3 *c = NULL;
    stof_status st = dbt_open_existing(sink, path, 1, &c);
    if (st != STOF_OK)
        return st;
    const int by_hash = content_hash && *content_hash;
    int rc = stof__dbt_exec(c,
                            by_hash ? "DELETE FROM records WHERE key = ?1 AND "
                                      "content_hash = ?2"
                                    : "DELETE FROM records WHERE key = ?1",
                            key, by_hash ? content_hash : NULL);
    int changed = rc == SQLITE_OK ? sqlite3_changes(c) : 0;
    if (rc != SQLITE_OK)
        st = stof__dbt_sql_fail(sink, c, rc, "deleting a record", path);
    else if (!changed)
        st = stof__dbs_fail(sink, STOF_ERR_NOT_FOUND, "%s: no record %s", path, key);
    sqlite3_close(c);
    return st == STOF_OK ? stof__dbs_ok(sink) : st;
}

stof_status stof__dbt_miss_counts(const stof_db_sink *sink, const char *path,
                                  int64_t *n, int64_t *total)
{
    *n = *total = 0;
    sqlite3 *c = NULL;
    stof_status st = dbt_open_existing(sink, path, 0, &c);
    if (st != STOF_OK)
        return st;
    int rc = stof__dbt_int64(c, "SELECT count(*) FROM misses", NULL, NULL, n);
    if (rc == SQLITE_OK)
        rc = stof__dbt_int64(c, "SELECT coalesce(sum(count), 0) FROM misses", NULL,
                       NULL, total);
    if (rc != SQLITE_OK)
        st = stof__dbt_sql_fail(sink, c, rc, "reading misses", path);
    sqlite3_close(c);
    return st == STOF_OK ? stof__dbs_ok(sink) : st;
}

int stof__dbt_collect(void *user, const stof_db_record *r)
{
    stof_dbt_records *l = user;
    if (l->n == l->cap) {
        int cap = l->cap ? 2 * l->cap : 64;
        stof_db_record *v = realloc(l->v, (size_t)cap * sizeof(*v));
        if (v)
            l->v = v;
        char(*w)[160] = v ? realloc(l->why, (size_t)cap * sizeof(*w)) : NULL;
        if (!v || !w)
            return 1; /* stops the iteration; the caller sees a short list */
        l->why = w;
        l->cap = cap;
    }
    char *why = l->why[l->n];
    why[0] = '\0';
    if (!(l->check ? l->check : stof__db_record_check)(r, why, 160) &&
        !why[0])
        snprintf(why, 160, "invalid");
    l->v[l->n] = *r;
    l->v[l->n].cubin = NULL; /* owned by the iteration, freed after the call */
    l->n++;
    return 0;
}

void stof__dbt_records_free(stof_dbt_records *l)
{
    free(l->v);
    free(l->why);
    l->v = NULL;
    l->why = NULL;
    l->n = l->cap = 0;
}
