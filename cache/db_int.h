/*
 * db_int.h - what the files of the layered database share (db.c: schema,
 * files and layers; db_rows.c: records, trust and misses): the column
 * list, the prepared statements, the layer and database structures and a
 * few helpers. Not for other modules.
 */
#ifndef STOF_DB_INT_H
#define STOF_DB_INT_H

#include "db.h"

#include <sqlite3.h>

/* "STOF" in ASCII. */
#define STOF_DB_APPLICATION_ID 0x53544f46
#define DB_BUSY_TIMEOUT_MS 10000

/* The columns of `records` that map one to one onto stof_db_record fields:
 * T text (char array), I int, L int64, D double. The cubin and hits columns
 * follow them in every statement. The v1 DDL below is written out in full
 * (a migration must never change), so a new field means a new migration
 * step plus an entry here. */
#define DB_FIELDS(T, I, L, D)                                                  \
    T(key) T(op) T(mask_digest) T(mask_spec)                                   \
    I(batch) I(heads) I(seq_q) I(seq_k) I(head_dim) T(dtype) T(layout)         \
    T(device_name) I(cc_major) I(cc_minor) I(sm_count) I(driver_version)       \
    T(nvrtc_version) T(stof_version) T(template_hash)                          \
    T(kernel) T(config) T(arch)                                                \
    D(time_ms) D(runner_up_ms) D(model_ms) I(n_candidates) I(verified)         \
    T(measured) L(created_at) T(host) T(content_hash)

#define DB_NAME_(f) #f ","
#define DB_PARAM_(f) "?,"
#define DB_SET_(f) #f "=excluded." #f ","
#define DB_COLUMNS DB_FIELDS(DB_NAME_, DB_NAME_, DB_NAME_, DB_NAME_) "cubin,hits"

/* --------------------------------------------------------- statements */

enum {
    ST_LOOKUP,
    ST_HIT,
    ST_STORE,
    ST_NEXT_RECORD,
    ST_MISS,
    ST_NEXT_MISS,
    ST_DELETE_MISS,
    ST_TRUSTED,
    ST_TRUST,
    ST_FORGET,
    ST_HASH,
    ST_COUNT_
};

extern const char *const stof__db_sql[ST_COUNT_];

/* ------------------------------------------------------------- layers */

typedef enum db_mode { MODE_RW, MODE_RO, MODE_IMMUTABLE } db_mode;

/* What identifies a database file's contents without reading it: an
 * immutable connection does not see changes, so a change of these reopens
 * the layer (stof__db_layer_fresh). */
typedef struct db_file_id {
    unsigned long long dev, ino, size;
    long long mt_s, mt_ns;
    int wal; /* a -wal file beside it */
} db_file_id;

typedef struct db_layer {
    char *path;            /* NULL: no database in this slot */
    sqlite3 *conn;         /* NULL when unusable */
    int writable;
    db_mode mode;
    int immutable;         /* opened with immutable=1: id says as what */
    int watched;           /* was immutable once: a change of id reopens it
                              (also after a reopen that failed) */
    db_file_id id;
    int warned;            /* a lookup error was logged */
    char why[512];         /* why unusable or read-only */
    sqlite3_stmt *st[ST_COUNT_];
} db_layer;

/* Trust kept in memory when the user database cannot hold it. */
typedef struct db_trust_mem {
    char (*v)[66];         /* key followed by content hash */
    int n, cap;
} db_trust_mem;

/* Hits counted in memory and written in one transaction (stof__db_hits_
 * flush, when a record is stored and at close): a write transaction per
 * lookup cost a warm layer plan (seven lookups) about half a millisecond. */
typedef struct db_pending_hits {
    char (*key)[33];
    int64_t *n;
    int len, cap;
} db_pending_hits;

/* Records this handle read and checked, kept with their cubins: a warm
 * plan looks the same few up again, and one still stored under the same
 * content hash is served from here (stof__db_lookup) without reading the
 * row's cubin or hashing the record again. */
typedef struct db_memo_entry {
    int layer;             /* which database it came from */
    stof_db_record rec;    /* as read and checked (source, hits aside) */
} db_memo_entry;

typedef struct db_memo {
    db_memo_entry *e;
    int n, cap;
    size_t bytes;          /* their cubins */
    unsigned next;         /* the next to replace when full */
} db_memo;

struct stof_db {
    stof_db_sink sink;     /* where failures and logs go */
    char last_err[1024];   /* the last failure of a write (DB_FAIL) */
    db_trust_mem trust;
    db_pending_hits pend;
    db_memo memo;
    int n_layers;          /* 1 + number of system paths */
    db_layer layers[];     /* [0] user, [i + 1] system_paths[i] */
};

/* Record a failed SQLite call through the database's sink: what failed,
 * the SQLite message and code, the file, and where in the code. */
stof_status stof__db_fail_at(stof_db *db, const db_layer *L, int rc,
                             const char *what, int line);
#define DB_FAIL(db, L, rc, what)                                               \
    stof__db_fail_at((db), (L), (rc), (what), __LINE__)

/* Write the hits counted in memory to the user layer (one transaction;
 * kept for later when the database is busy). */
void stof__db_hits_flush(stof_db *db);

/* Forget the memo's records of key (NULL: all of them, and its memory). */
void stof__db_memo_drop(stof_db *db, const char *key);
/* Layer i of db, reopened first when it was opened immutable and its file
 * has changed since (an import into a system database a server reads):
 * 1 when the layer is usable. */
int stof__db_layer_fresh(stof_db *db, int i);

/* sqlite3_exec without callbacks. */
int stof__db_exec(sqlite3 *c, const char *sql);
/* Undo an open transaction after a failure (nothing when none is open). */
void stof__db_rollback(sqlite3 *c);
/* The prepared statement `which` of L (prepared once, kept until close). */
int stof__db_layer_stmt(db_layer *L, int which, sqlite3_stmt **out);
/* Reset a statement and clear its bindings (NULL is harmless). */
void stof__db_done_stmt(sqlite3_stmt *s);

#endif
