/*
 * db_merge.c - export, merge and import of tuning databases (db_tools.h):
 * the inputs are staged, every staged record is checked, and the result
 * is merged into the destination in one transaction.
 *
 * Staging. Each input is attached read-only (without writing beside it:
 * stof__db_readonly_uri) and its records (those the filter takes) and
 * misses are copied into temporary tables of the destination's
 * connection, tagged with the input's index. ATTACH cannot run inside a
 * transaction and SQLite attaches only a few files at once, so staging is
 * what lets any number of inputs land in ONE transaction: import is all or
 * nothing.
 *
 * Checking. Every staged record is read back and checked (the caller's
 * check, else the database's): types and lengths in SQL first, so what is
 * checked in C is exactly what is stored. Invalid records fail the whole
 * operation, or with drop_invalid are left out; each is reported.
 *
 * The merge statements are built from the destination's own column list
 * (PRAGMA table_info), so a column added by a later migration takes part
 * in the merge order without a change here.
 */
#include "db_outfile.h"
#include "db_tools.h"
#include "db_tools_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <sqlite3.h>

/* ---------------------------------------------------- merge statements */

typedef struct dbt_sql {
    char *stage;      /* src.records into temp.stage */
    char *insert;     /* temp.stage into main.records, replacing worse ones */
    char *hits;       /* hits = max over inputs */
    char *misses;     /* temp.stage_miss into main.misses */
    char *losers;     /* staged records that differ from the result's */
} dbt_sql;

static void dbt_sql_free(dbt_sql *q)
{
    free(q->stage);
    free(q->insert);
    free(q->hits);
    free(q->misses);
    free(q->losers);
    memset(q, 0, sizeof(*q));
}

/* The records filter for table alias t (bound: ?1 gpu or NULL, ?2 driver,
 * 0 = any). */
static void buf_filter(stof_dbt_buf *b, const char *t)
{
    char f[256];
    snprintf(f, sizeof(f),
             "(?1 IS NULL OR lower(%s.device_name) = lower(?1)) AND"
             " (?2 = 0 OR %s.driver_version = ?2)",
             t, t);
    stof__dbt_buf_add(b, f);
}

/* The merge order of table alias t: a row value that is smaller for the
 * better record; every content column takes part. */
static void buf_order(stof_dbt_buf *b, const char *t, char **cols, int n)
{
    static const char *const first[] = {"verified", "time_ms", "cubin",
                                        "created_at", "host"};
    char part[160];
    snprintf(part, sizeof(part),
             "(%s.verified = 0, %s.time_ms, coalesce(%s.cubin, x''), "
             "%s.created_at, %s.host",
             t, t, t, t, t);
    stof__dbt_buf_add(b, part);
    for (int i = 0; i < n; i++) {
        int skip = 0;
        for (size_t j = 0; j < sizeof(first) / sizeof(*first); j++)
            skip |= !strcmp(cols[i], first[j]);
        if (skip)
            continue;
        snprintf(part, sizeof(part), ", %s.%s", t, cols[i]);
        stof__dbt_buf_add(b, part);
    }
    stof__dbt_buf_add(b, ")");
}

/* main.records' columns other than key and hits (malloc'd names). */
static int read_columns(sqlite3 *c, char **cols, int max, int *n)
{
    *n = 0;
    sqlite3_stmt *s = NULL;
    int rc = sqlite3_prepare_v2(c, "SELECT name FROM pragma_table_info("
                                   "'records', 'main') ORDER BY cid",
                                -1, &s, NULL);
    while (rc == SQLITE_OK && (rc = sqlite3_step(s)) == SQLITE_ROW) {
        const char *name = (const char *)sqlite3_column_text(s, 0);
        rc = SQLITE_OK;
        if (!name || !strcmp(name, "key") || !strcmp(name, "hits"))
            continue;
        if (*n == max || !(cols[*n] = strdup(name))) {
            rc = SQLITE_NOMEM;
            break;
        }
        (*n)++;
    }
    if (rc == SQLITE_DONE)
        rc = SQLITE_OK;
    sqlite3_finalize(s);
    return rc;
}

/* Build the statements from main.records' columns. */
static int dbt_sql_build(sqlite3 *c, dbt_sql *q)
{
    memset(q, 0, sizeof(*q));
    char *cols[96];
    int n = 0;
    int rc = read_columns(c, cols, 96, &n);
    stof_dbt_buf all = {0}, stg = {0}, ins = {0}, hits = {0}, mis = {0},
                 los = {0};
    if (rc == SQLITE_OK) {
        stof__dbt_buf_add(&all, "key");
        for (int i = 0; i < n; i++) {
            stof__dbt_buf_add(&all, ",");
            stof__dbt_buf_add(&all, cols[i]);
        }
        stof__dbt_buf_add(&all, ",hits");
        const char *a = all.p ? all.p : "";

        stof__dbt_buf_add(&stg, "INSERT INTO temp.stage(");
        stof__dbt_buf_add(&stg, a);
        stof__dbt_buf_add(&stg, ",input) SELECT ");
        stof__dbt_buf_add(&stg, a);
        stof__dbt_buf_add(&stg, ",?3 FROM src.records AS s WHERE ");
        buf_filter(&stg, "s");

        stof__dbt_buf_add(&ins, "INSERT INTO main.records(");
        stof__dbt_buf_add(&ins, a);
        stof__dbt_buf_add(&ins, ") SELECT ");
        stof__dbt_buf_add(&ins, a);
        stof__dbt_buf_add(&ins, " FROM temp.stage WHERE true"
                                " ON CONFLICT(key) DO UPDATE SET ");
        for (int i = 0; i < n; i++) {
            stof__dbt_buf_add(&ins, i ? ", " : "");
            stof__dbt_buf_add(&ins, cols[i]);
            stof__dbt_buf_add(&ins, " = excluded.");
            stof__dbt_buf_add(&ins, cols[i]);
        }
        stof__dbt_buf_add(&ins, " WHERE ");
        buf_order(&ins, "excluded", cols, n);
        stof__dbt_buf_add(&ins, " < ");
        buf_order(&ins, "records", cols, n);

        stof__dbt_buf_add(&hits,
                          "UPDATE main.records SET hits = max(hits, (SELECT "
                          "max(s.hits) FROM temp.stage AS s WHERE s.key = "
                          "records.key)) WHERE key IN (SELECT key FROM "
                          "temp.stage)");

        stof__dbt_buf_add(
            &mis, "INSERT INTO main.misses(key, problem, mask, count, "
                  "first_seen, last_seen) SELECT key, problem, mask, count, "
                  "first_seen, last_seen FROM temp.stage_miss WHERE true "
                  "ON CONFLICT(key) DO UPDATE SET "
                  "count = max(misses.count, excluded.count), "
                  "first_seen = min(misses.first_seen, excluded.first_seen), "
                  "last_seen = max(misses.last_seen, excluded.last_seen), "
                  "problem = min(misses.problem, excluded.problem), "
                  "mask = CASE WHEN misses.mask IS NULL THEN excluded.mask "
                  "WHEN excluded.mask IS NULL THEN misses.mask "
                  "WHEN excluded.mask < misses.mask THEN excluded.mask "
                  "ELSE misses.mask END");

        stof__dbt_buf_add(&los, "INSERT INTO temp.dbt_losers(key, input, "
                                "kernel, time_ms, verified, host) SELECT "
                                "s.key, s.input, s.kernel, s.time_ms, "
                                "s.verified, s.host FROM temp.stage AS s "
                                "JOIN main.records AS m ON m.key = s.key "
                                "WHERE (0");
        for (int i = 0; i < n; i++) {
            stof__dbt_buf_add(&los, " OR s.");
            stof__dbt_buf_add(&los, cols[i]);
            stof__dbt_buf_add(&los, " IS NOT m.");
            stof__dbt_buf_add(&los, cols[i]);
        }
        stof__dbt_buf_add(&los, ")");
    }
    for (int i = 0; i < n; i++)
        free(cols[i]);
    free(all.p);
    q->stage = stg.p;
    q->insert = ins.p;
    q->hits = hits.p;
    q->misses = mis.p;
    q->losers = los.p;
    if (rc == SQLITE_OK &&
        (stg.bad || ins.bad || hits.bad || mis.bad || los.bad || all.bad))
        rc = SQLITE_NOMEM;
    if (rc != SQLITE_OK)
        dbt_sql_free(q);
    return rc;
}

/* Run a statement with the filter bound (and ?3 = input index when the
 * statement has it). */
static int run_filtered(sqlite3 *c, const char *sql, const stof_dbt_filter *f,
                        int input)
{
    sqlite3_stmt *s = NULL;
    int rc = sqlite3_prepare_v2(c, sql, -1, &s, NULL);
    int np = rc == SQLITE_OK ? sqlite3_bind_parameter_count(s) : 0;
    if (rc == SQLITE_OK && np >= 1)
        rc = f->gpu && *f->gpu
                 ? sqlite3_bind_text(s, 1, f->gpu, -1, SQLITE_STATIC)
                 : sqlite3_bind_null(s, 1);
    if (rc == SQLITE_OK && np >= 2)
        rc = sqlite3_bind_int(s, 2, f->driver);
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

/* ------------------------------------------------------------- staging */

static stof_status stage_inputs(const stof_db_sink *sink, sqlite3 *c,
                                const dbt_sql *q, const char *const *inputs,
                                int n, const stof_dbt_opts *o)
{
    int rc = sqlite3_exec(
        c,
        "CREATE TEMP TABLE IF NOT EXISTS stage AS SELECT *, 0 AS input FROM "
        "main.records WHERE 0; DELETE FROM temp.stage;"
        "CREATE TEMP TABLE IF NOT EXISTS stage_miss AS SELECT * FROM "
        "main.misses WHERE 0; DELETE FROM temp.stage_miss;"
        "CREATE TEMP TABLE IF NOT EXISTS dbt_losers(key TEXT, input INTEGER,"
        " kernel TEXT, time_ms REAL, verified INTEGER, host TEXT);"
        "DELETE FROM temp.dbt_losers;",
        NULL, NULL, NULL);
    if (rc != SQLITE_OK)
        return stof__dbt_sql_fail(sink, c, rc, "preparing the merge", "");
    for (int i = 0; i < n; i++) {
        char *uri = stof__db_readonly_uri(inputs[i]);
        if (!uri)
            return stof__dbs_fail(sink, STOF_ERR_OUT_OF_MEMORY, "out of memory");
        rc = stof__dbt_exec(c, "ATTACH DATABASE ?1 AS src", uri, NULL);
        free(uri);
        if (rc != SQLITE_OK)
            return stof__dbt_sql_fail(sink, c, rc, "cannot attach", inputs[i]);
        rc = run_filtered(c, q->stage, &o->filter, i);
        /* Misses of the shape stof__db_record_miss writes: a text key
         * and problem without NUL bytes, the mask NULL or a BLOB, a
         * positive count and integer times. Others (a damaged byte, a
         * crafted file) are left out and counted: a BLOB or NUL key
         * would poison every database merged from this one. */
        if (rc == SQLITE_OK && o->with_misses)
            rc = stof__dbt_exec(
                c,
                "INSERT INTO temp.stage_miss SELECT key, problem, mask, "
                "count, first_seen, last_seen FROM src.misses WHERE "
                "typeof(key) = 'text' AND length(CAST(key AS BLOB)) "
                "BETWEEN 1 AND 256 AND instr(CAST(key AS BLOB), x'00') = 0 "
                "AND typeof(problem) = 'text' AND length(CAST(problem AS "
                "BLOB)) <= 65536 AND instr(CAST(problem AS BLOB), x'00') = 0 "
                "AND (mask IS NULL OR typeof(mask) = 'blob') AND "
                "typeof(count) = 'integer' AND count >= 1 AND "
                "typeof(first_seen) = 'integer' AND "
                "typeof(last_seen) = 'integer'",
                NULL, NULL);
        if (rc == SQLITE_OK && o->with_misses) {
            const int64_t kept = sqlite3_changes(c);
            sqlite3_stmt *cnt = NULL;
            int64_t all = kept;
            if (sqlite3_prepare_v2(c, "SELECT count(*) FROM src.misses", -1,
                                   &cnt, NULL) == SQLITE_OK &&
                sqlite3_step(cnt) == SQLITE_ROW)
                all = sqlite3_column_int64(cnt, 0);
            sqlite3_finalize(cnt);
            if (all > kept && o->on_note) {
                char msg[600];
                snprintf(msg, sizeof(msg),
                         "%.500s: %lld invalid miss row(s) left out",
                         inputs[i], (long long)(all - kept));
                o->on_note(o->user, msg);
            }
        }
        stof_status st = rc == SQLITE_OK
                             ? STOF_OK
                             : stof__dbt_sql_fail(sink, c, rc, "reading",
                                                  inputs[i]);
        (void)sqlite3_exec(c, "DETACH DATABASE src", NULL, NULL, NULL);
        if (st != STOF_OK)
            return st;
    }
    return STOF_OK;
}

/* Check every staged record; report the invalid ones, and leave them out
 * (drop_invalid) or fail. */
static stof_status check_staged(const stof_db_sink *sink, sqlite3 *c,
                                const char *const *inputs, int n,
                                const stof_dbt_opts *o, int64_t *rejected)
{
    char shape[8192];
    if (!stof__db_shape_sql("stage", shape, sizeof(shape)))
        return stof__dbs_fail(sink, STOF_ERR_INTERNAL, "record shape check");
    stof_dbt_buf sql = {0};
    stof__dbt_buf_add(&sql, "SELECT rowid, input, ");
    stof__dbt_buf_add(&sql, shape);
    stof__dbt_buf_add(&sql, ", substr(CAST(key AS TEXT), 1, 32), ");
    stof__dbt_buf_add(&sql, stof__db_columns());
    stof__dbt_buf_add(&sql, " FROM temp.stage ORDER BY rowid");
    if (sql.bad)
        return stof__dbs_fail(sink, STOF_ERR_OUT_OF_MEMORY, "out of memory");
    sqlite3_stmt *s = NULL, *del = NULL;
    int rc = sqlite3_prepare_v2(c, sql.p, -1, &s, NULL);
    free(sql.p);
    if (rc == SQLITE_OK)
        rc = sqlite3_prepare_v2(c, "DELETE FROM temp.stage WHERE rowid = ?1",
                                -1, &del, NULL);
    stof_status st = STOF_OK;
    char first[600] = "";
    /* Deleting while reading the same table would disturb the scan:
     * rowids to drop are collected first. */
    int64_t *drop = NULL;
    size_t n_drop = 0, cap = 0;
    while (rc == SQLITE_OK && (rc = sqlite3_step(s)) == SQLITE_ROW) {
        rc = SQLITE_OK;
        const int input = sqlite3_column_int(s, 1);
        const char *in = input >= 0 && input < n ? inputs[input] : "?";
        const char *key = (const char *)sqlite3_column_text(s, 3);
        char why[300] = "";
        stof_db_record r;
        memset(&r, 0, sizeof(r));
        if (!sqlite3_column_int(s, 2))
            snprintf(why, sizeof(why),
                     "a field has the wrong type or is too long");
        else if ((rc = stof__db_read_row(s, 4, &r)) != SQLITE_OK)
            break;
        else if (!(o->check ? o->check : stof__db_record_check)(
                     &r, why, sizeof(why)))
            ; /* why is set */
        else
            why[0] = '\0';
        stof__db_record_clear(&r);
        if (!why[0])
            continue;
        (*rejected)++;
        if (!first[0])
            snprintf(first, sizeof(first), "%s: record %s: %s", in,
                     key ? key : "?", why);
        if (o->on_reject)
            o->on_reject(o->user, in, key ? key : "?", why);
        if (n_drop == cap) {
            cap = cap ? 2 * cap : 64;
            int64_t *v = realloc(drop, cap * sizeof(*v));
            if (!v) {
                rc = SQLITE_NOMEM;
                break;
            }
            drop = v;
        }
        drop[n_drop++] = sqlite3_column_int64(s, 0);
    }
    if (rc == SQLITE_DONE)
        rc = SQLITE_OK;
    sqlite3_finalize(s);
    if (rc != SQLITE_OK)
        st = stof__dbt_sql_fail(sink, c, rc, "checking the records", "");
    else if (*rejected && !o->drop_invalid)
        st = stof__dbs_fail(sink, STOF_ERR_DATABASE,
                        "%s%s; nothing was written (%lld invalid record%s)",
                        first, *rejected > 1 ? " (and more)" : "",
                        (long long)*rejected, *rejected == 1 ? "" : "s");
    for (size_t i = 0; st == STOF_OK && i < n_drop; i++) {
        rc = sqlite3_bind_int64(del, 1, drop[i]);
        if (rc == SQLITE_OK && (rc = sqlite3_step(del)) == SQLITE_DONE)
            rc = SQLITE_OK;
        sqlite3_reset(del);
        if (rc != SQLITE_OK)
            st = stof__dbt_sql_fail(sink, c, rc, "leaving out a record", "");
    }
    sqlite3_finalize(del);
    free(drop);
    return st;
}

/* --------------------------------------------------------------- merge */

static void report_conflicts(sqlite3 *c, const char *const *inputs, int n,
                             const stof_dbt_opts *o, stof_dbt_result *res,
                             int *rc_out)
{
    sqlite3_stmt *s = NULL;
    int rc = sqlite3_prepare_v2(
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
        snprintf(x.winner_kernel, sizeof(x.winner_kernel), "%s", t ? t : "");
        x.winner_ms = sqlite3_column_double(s, 7);
        x.winner_verified = sqlite3_column_int(s, 8) != 0;
        t = (const char *)sqlite3_column_text(s, 9);
        snprintf(x.winner_host, sizeof(x.winner_host), "%s", t ? t : "");
        res->losers++;
        if (strcmp(lastkey, x.key))
            res->conflicts++;
        snprintf(lastkey, sizeof(lastkey), "%s", x.key);
        if (o->on_conflict)
            o->on_conflict(o->user, &x);
        rc = SQLITE_OK;
    }
    if (rc == SQLITE_DONE)
        rc = SQLITE_OK;
    sqlite3_finalize(s);
    *rc_out = rc;
}

/* Stage, check, and merge the inputs into the database open on c (path:
 * for messages) in one transaction. */
static stof_status merge_conn(const stof_db_sink *sink, sqlite3 *c, const char *path,
                              const char *const *inputs, int n,
                              const stof_dbt_opts *o, stof_dbt_result *res)
{
    dbt_sql q;
    int rc = dbt_sql_build(c, &q);
    if (rc != SQLITE_OK)
        return stof__dbt_sql_fail(sink, c, rc, "preparing the merge", path);
    stof_status st = stage_inputs(sink, c, &q, inputs, n, o);
    if (st == STOF_OK &&
        (rc = stof__dbt_int64(c, "SELECT count(*) FROM temp.stage", NULL,
                              NULL, &res->records_read)) != SQLITE_OK)
        st = stof__dbt_sql_fail(sink, c, rc, "counting", path);
    if (st == STOF_OK)
        st = check_staged(sink, c, inputs, n, o, &res->rejected);
    if (st == STOF_OK) {
        rc = stof__dbt_exec(c, "BEGIN IMMEDIATE", NULL, NULL);
        if (rc == SQLITE_OK)
            rc = stof__dbt_exec(c, q.insert, NULL, NULL);
        if (rc == SQLITE_OK)
            rc = stof__dbt_exec(c, q.hits, NULL, NULL);
        if (rc == SQLITE_OK && o->with_misses)
            rc = stof__dbt_exec(c, q.misses, NULL, NULL);
        /* Misses that now have a record are answered. */
        if (rc == SQLITE_OK)
            rc = stof__dbt_exec(c,
                                "DELETE FROM main.misses WHERE key IN "
                                "(SELECT key FROM main.records)",
                                NULL, NULL);
        if (rc == SQLITE_OK)
            rc = stof__dbt_exec(c, q.losers, NULL, NULL);
        if (rc == SQLITE_OK)
            rc = stof__dbt_exec(c, "COMMIT", NULL, NULL);
        if (rc != SQLITE_OK) {
            st = stof__dbt_sql_fail(sink, c, rc, "merging into", path);
            stof__dbt_rollback(c);
        }
    }
    if (st == STOF_OK) {
        report_conflicts(c, inputs, n, o, res, &rc);
        if (rc == SQLITE_OK)
            rc = stof__dbt_int64(c, "SELECT count(*) FROM main.records", NULL,
                                 NULL, &res->records);
        if (rc == SQLITE_OK)
            rc = stof__dbt_int64(c, "SELECT count(*) FROM main.misses", NULL,
                                 NULL, &res->misses);
        if (rc != SQLITE_OK)
            st = stof__dbt_sql_fail(sink, c, rc, "counting", path);
    }
    (void)sqlite3_exec(c,
                       "DROP TABLE IF EXISTS temp.stage;"
                       "DROP TABLE IF EXISTS temp.stage_miss;"
                       "DROP TABLE IF EXISTS temp.dbt_losers",
                       NULL, NULL, NULL);
    dbt_sql_free(&q);
    return st;
}

/* Check every input before anything is written. */
static stof_status check_inputs(const stof_db_sink *sink, const char *const *inputs,
                                int n)
{
    for (int i = 0; i < n; i++) {
        stof_status st = stof__dbt_check(sink, inputs[i]);
        if (st != STOF_OK)
            return st;
    }
    return STOF_OK;
}

/* Create (or upgrade) a stof database at path through db.c and open a
 * read-write connection to it. */
static stof_status open_dest(const stof_db_sink *sink, const char *path,
                             sqlite3 **out)
{
    *out = NULL;
    stof_db *db = NULL;
    stof_status st = stof__db_open(sink, path, NULL, &db);
    if (st != STOF_OK)
        return st;
    int w = stof__db_writable(db);
    stof__db_close(&db);
    if (!w)
        return stof__dbs_fail(sink, STOF_ERR_DATABASE,
                          "%s: cannot be written as a stof tuning database "
                          "(read-only, foreign, corrupt or a newer schema)",
                          path);
    int rc = stof__dbt_connect(path, 1, out);
    if (rc != SQLITE_OK) {
        st = stof__dbt_sql_fail(sink, *out, rc, "cannot open", path);
        sqlite3_close(*out);
        *out = NULL;
        return st;
    }
    return STOF_OK;
}

static const stof_dbt_opts no_opts;

stof_status stof__dbt_write(const stof_db_sink *sink, const char *out_path,
                            const char *const *inputs, int n,
                            const stof_dbt_opts *opts, stof_dbt_result *res)
{
    DBS_CHECK_ARG(sink, out_path && *out_path, "no output file (-o) given");
    DBS_CHECK_ARG(sink, n >= 0 && (inputs || n == 0),
                   "stof__dbt_write: no inputs");
    const stof_dbt_opts *o = opts ? opts : &no_opts;
    stof_dbt_result local;
    if (!res)
        res = &local;
    memset(res, 0, sizeof(*res));
    /* The destination first: a bad one fails before any work. */
    stof_outfile of;
    stof_status st = stof__outfile_begin(sink, out_path, o, &of);
    if (st != STOF_OK)
        return st;
    st = check_inputs(sink, inputs, n);
    sqlite3 *c = NULL;
    if (st == STOF_OK)
        st = open_dest(sink, of.tmp, &c);
    if (st == STOF_OK)
        st = merge_conn(sink, c, out_path, inputs, n, o, res);
    /* A self-contained file: no -wal/-shm needed by its readers. */
    if (st == STOF_OK) {
        int rc = sqlite3_exec(c, "PRAGMA journal_mode = DELETE; VACUUM", NULL,
                              NULL, NULL);
        if (rc != SQLITE_OK)
            st = stof__dbt_sql_fail(sink, c, rc, "finishing", out_path);
    }
    if (c) {
        int rc = sqlite3_close(c);
        if (st == STOF_OK && rc != SQLITE_OK)
            st = stof__dbt_sql_fail(sink, NULL, rc, "closing", out_path);
    }
    if (st != STOF_OK) {
        stof__outfile_abort(&of);
        return st;
    }
    st = stof__outfile_commit(sink, &of);
    return st == STOF_OK ? stof__dbs_ok(sink) : st;
}

stof_status stof__dbt_merge_into(const stof_db_sink *sink, const char *dest_path,
                                 const char *const *inputs, int n,
                                 const stof_dbt_opts *opts,
                                 stof_dbt_result *res)
{
    DBS_CHECK_ARG(sink, dest_path && *dest_path,
                   "stof__dbt_merge_into: no destination");
    DBS_CHECK_ARG(sink, n >= 0 && (inputs || n == 0),
                   "stof__dbt_merge_into: no inputs");
    const stof_dbt_opts *o = opts ? opts : &no_opts;
    stof_dbt_result local;
    if (!res)
        res = &local;
    memset(res, 0, sizeof(*res));
    stof_status st = check_inputs(sink, inputs, n);
    if (st != STOF_OK)
        return st;
    /* An existing destination must be a usable database: never let
     * stof__db_open skip a bad file and leave it looking imported. */
    struct stat sb;
    if (stat(dest_path, &sb) == 0 && (!S_ISREG(sb.st_mode) || sb.st_size > 0) &&
        (st = stof__dbt_check(sink, dest_path)) != STOF_OK)
        return st;
    sqlite3 *c = NULL;
    st = open_dest(sink, dest_path, &c);
    if (st == STOF_OK)
        st = merge_conn(sink, c, dest_path, inputs, n, o, res);
    sqlite3_close(c);
    return st == STOF_OK ? stof__dbs_ok(sink) : st;
}
