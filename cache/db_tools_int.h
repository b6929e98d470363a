/*
 * db_tools_int.h - helpers shared by the modules behind db_tools.h
 * (db_tools.c, db_merge.c). Not for other modules.
 */
#ifndef STOF_DB_TOOLS_INT_H
#define STOF_DB_TOOLS_INT_H

#include "db_tools.h"

#include <sqlite3.h>

/* Record a failed SQLite call on sink, naming path and what failed. */
stof_status stof__dbt_sql_fail(const stof_db_sink *sink, sqlite3 *c, int rc,
                               const char *what, const char *path);

/* Open path read-write (writable) or for reading without writing beside
 * it (stof__db_open_readonly). */
int stof__dbt_connect(const char *path, int writable, sqlite3 **out);

/* Run a statement that returns no rows, with up to two text bindings. */
int stof__dbt_exec(sqlite3 *c, const char *sql, const char *a,
                   const char *b);

/* Undo an open transaction (nothing when none is open). */
void stof__dbt_rollback(sqlite3 *c);

/* One int64 from a query with up to two text bindings (0 when no row). */
int stof__dbt_int64(sqlite3 *c, const char *sql, const char *a,
                    const char *b, int64_t *out);

/* A growing string; on allocation failure it stays as it was and `bad`
 * is set. */
typedef struct stof_dbt_buf {
    char *p;
    size_t len, cap;
    int bad;
} stof_dbt_buf;
void stof__dbt_buf_add(stof_dbt_buf *b, const char *s);

#endif
