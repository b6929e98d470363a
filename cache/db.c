/*
 * db.c - the SQLite tuning database (see db.h): one writable user database
 * layered over read-only system databases, its schema and migrations.
 *
 * Identification. A stof database carries PRAGMA application_id =
 * STOF_DB_APPLICATION_ID and PRAGMA user_version = its schema version, both
 * set in the transaction that creates the schema, so a file is either an
 * empty SQLite database, a complete stof database, or something else
 * ("foreign"). A `meta` table repeats this in readable form.
 *
 * What happens to each kind of file (every case is logged, none fails
 * stof__db_open):
 *   - missing user database: created, with its directory (mode 0700);
 *   - empty user database (0 bytes or no tables): the schema is created;
 *   - user database that cannot be written (file or directory read-only,
 *     read-only file system): used read-only (STOF_LOG_WARN); when even
 *     the -shm file cannot be created it is opened immutable;
 *   - system database: always read-only; immutable when its directory is
 *     not writable (STOF_LOG_INFO, the normal case for /usr/share);
 *   - not a database, corrupt, truncated, foreign (another application's
 *     SQLite file, or an empty one in a read-only layer), or an older schema
 *     in a read-only layer: skipped (STOF_LOG_WARN); the file is never
 *     modified;
 *   - a NEWER schema than this build (written by a later stof): skipped
 *     entirely, neither read nor written, in any layer (STOF_LOG_WARN). A
 *     later schema may change what columns mean, so reading it is not safe;
 *     users mixing versions point STOF_USER_DB at separate files.
 *   - corruption found later (during a lookup): logged once per layer, the
 *     lookup treats the layer as a miss and goes on to the next one.
 *
 * Concurrency. The user database runs in WAL mode (readers never wait for
 * writers) with a busy timeout of DB_BUSY_TIMEOUT_MS; every write is one
 * statement inside BEGIN IMMEDIATE ... COMMIT, so a process killed at any
 * point leaves the last committed state, and two tuners storing the same
 * key converge on the fastest verified record. Schema creation re-reads the
 * version after taking the write lock, so processes creating the same file
 * at once create it once.
 *
 * A stof_db is one connection per layer, used by one thread at a time (the
 * context's thread): connections are opened with SQLITE_OPEN_NOMUTEX.
 */
#include "db_int.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>


/* ------------------------------------------------------------- schema */

/* Migration steps: steps[i] upgrades schema version steps[i].to - 1 to
 * steps[i].to. Version 0 is an empty database. Adding version 2 means
 * adding {2, "ALTER TABLE ..."} here and raising STOF_DB_SCHEMA_VERSION. */
typedef struct db_migration {
    int to;
    const char *sql;
} db_migration;

static const db_migration db_migrations[] = {
    {1,
     "CREATE TABLE meta(\n"
     "  key TEXT PRIMARY KEY NOT NULL,\n"
     "  value NOT NULL);\n"
     "INSERT INTO meta(key, value) VALUES\n"
     "  ('application', 'stof tuning database'),\n"
     "  ('created_at', CAST(strftime('%s', 'now') AS INTEGER));\n"
     "CREATE TABLE records(\n"
     "  key TEXT PRIMARY KEY NOT NULL,\n"
     "  op TEXT NOT NULL,\n"
     "  mask_digest TEXT NOT NULL,\n"
     "  mask_spec TEXT NOT NULL,\n"
     "  batch INTEGER NOT NULL,\n"
     "  heads INTEGER NOT NULL,\n"
     "  seq_q INTEGER NOT NULL,\n"
     "  seq_k INTEGER NOT NULL,\n"
     "  head_dim INTEGER NOT NULL,\n"
     "  dtype TEXT NOT NULL,\n"
     "  layout TEXT NOT NULL,\n"
     "  device_name TEXT NOT NULL,\n"
     "  cc_major INTEGER NOT NULL,\n"
     "  cc_minor INTEGER NOT NULL,\n"
     "  sm_count INTEGER NOT NULL,\n"
     "  driver_version INTEGER NOT NULL,\n"
     "  nvrtc_version TEXT NOT NULL,\n"
     "  stof_version TEXT NOT NULL,\n"
     "  template_hash TEXT NOT NULL,\n"
     "  kernel TEXT NOT NULL,\n"
     "  config TEXT NOT NULL,\n"
     "  arch TEXT NOT NULL,\n"
     "  time_ms REAL NOT NULL,\n"
     "  runner_up_ms REAL NOT NULL,\n"
     "  model_ms REAL NOT NULL,\n"
     "  n_candidates INTEGER NOT NULL,\n"
     "  verified INTEGER NOT NULL,\n"
     "  measured TEXT NOT NULL,\n"
     "  created_at INTEGER NOT NULL,\n"
     "  host TEXT NOT NULL,\n"
     "  cubin BLOB,\n"
     "  hits INTEGER NOT NULL DEFAULT 0);\n"
     "CREATE TABLE misses(\n"
     "  key TEXT PRIMARY KEY NOT NULL,\n"
     "  problem TEXT NOT NULL,\n"
     "  mask BLOB,\n"
     "  count INTEGER NOT NULL DEFAULT 1,\n"
     "  first_seen INTEGER NOT NULL,\n"
     "  last_seen INTEGER NOT NULL);\n"},
    /* Version 2 (stof 0.2): records carry a content hash, and the user
     * database remembers which records this host has verified. Records of
     * version 1 get an empty hash: they fail stof__db_record_check, and
     * their keys (made without the hash's fields) never match again. */
    {2,
     "ALTER TABLE records ADD COLUMN content_hash TEXT NOT NULL DEFAULT '';\n"
     "CREATE TABLE trusted(\n"
     "  key TEXT NOT NULL,\n"
     "  content_hash TEXT NOT NULL,\n"
     "  verified_at INTEGER NOT NULL,\n"
     "  PRIMARY KEY(key, content_hash)) WITHOUT ROWID;\n"},
};

/* One step per version, in order. */
_Static_assert(sizeof(db_migrations) / sizeof(db_migrations[0]) ==
                   STOF_DB_SCHEMA_VERSION,
               "every schema version needs its migration step");

const char *const stof__db_sql[ST_COUNT_] = {
    [ST_LOOKUP] = "SELECT " DB_COLUMNS " FROM records WHERE key = ?1",
    [ST_HIT] = "UPDATE records SET hits = hits + ?2 WHERE key = ?1",
    /* The conflict rule: replace when asked, else only with a verified
     * record that is faster than the stored one or replaces an unverified
     * one; hits are kept. */
    [ST_STORE] =
        "INSERT INTO records(" DB_COLUMNS ") VALUES("
        DB_FIELDS(DB_PARAM_, DB_PARAM_, DB_PARAM_, DB_PARAM_) "?, 0)"
        " ON CONFLICT(key) DO UPDATE SET "
        DB_FIELDS(DB_SET_, DB_SET_, DB_SET_, DB_SET_) "cubin=excluded.cubin"
        " WHERE :replace OR (excluded.verified <> 0 AND"
        " (records.verified = 0 OR excluded.time_ms < records.time_ms))",
    [ST_NEXT_RECORD] = "SELECT " DB_COLUMNS
                       " FROM records WHERE key > ?1 ORDER BY key LIMIT 1",
    [ST_MISS] = "INSERT INTO misses(key, problem, mask, count, first_seen,"
                " last_seen) VALUES(?1, ?2, ?3, 1, ?4, ?4)"
                " ON CONFLICT(key) DO UPDATE SET count = misses.count + 1,"
                " last_seen = excluded.last_seen,"
                " mask = coalesce(misses.mask, excluded.mask)",
    [ST_NEXT_MISS] = ("SELECT key, problem, mask, count FROM misses"
                      " WHERE key > ?1 ORDER BY key LIMIT 1"),
    [ST_DELETE_MISS] = "DELETE FROM misses WHERE key = ?1",
    [ST_TRUSTED] = "SELECT 1 FROM trusted WHERE key = ?1 AND content_hash = ?2",
    [ST_TRUST] = "INSERT OR REPLACE INTO trusted(key, content_hash, verified_at)"
                 " VALUES(?1, ?2, ?3)",
    [ST_FORGET] = "DELETE FROM records WHERE key = ?1 AND content_hash = ?2",
    [ST_HASH] = "SELECT content_hash, hits FROM records WHERE key = ?1",
};

/* --------------------------------------------------- shared helpers */

/* Record a failed SQLite call on sink: the message names what failed, the
 * SQLite message and code, the file, and where in this file. */
stof_status stof__db_fail_at(stof_db *db, const db_layer *L, int rc,
                             const char *what, int line)
{
    const char *msg = L && L->conn ? sqlite3_errmsg(L->conn)
                                   : sqlite3_errstr(rc);
    char text[sizeof(db->last_err)];
    snprintf(text, sizeof(text),
             "%s: %s (SQLite error %d) in tuning database %s at line %d of "
             "the database code",
             what, msg, rc, L && L->path ? L->path : "(none)", line);
    if (!db)
        return STOF_ERR_DATABASE;
    memcpy(db->last_err, text, sizeof(text));
    return stof__dbs_fail(&db->sink, STOF_ERR_DATABASE, "%s", text);
}

int stof__db_exec(sqlite3 *c, const char *sql)
{
    return sqlite3_exec(c, sql, NULL, NULL, NULL);
}

/* Undo an open transaction after a failure (nothing when none is open). */
void stof__db_rollback(sqlite3 *c)
{
    if (!sqlite3_get_autocommit(c))
        (void)stof__db_exec(c, "ROLLBACK");
}

/* The prepared statement `which` of L (prepared once, kept until close). */
int stof__db_layer_stmt(db_layer *L, int which, sqlite3_stmt **out)
{
    if (!L->st[which]) {
        int rc = sqlite3_prepare_v3(L->conn, stof__db_sql[which], -1,
                                    SQLITE_PREPARE_PERSISTENT, &L->st[which],
                                    NULL);
        if (rc != SQLITE_OK) {
            *out = NULL;
            return rc;
        }
    }
    *out = L->st[which];
    return SQLITE_OK;
}

void stof__db_done_stmt(sqlite3_stmt *s)
{
    if (s) {
        sqlite3_reset(s);
        sqlite3_clear_bindings(s);
    }
}

/* Errors that mean "cannot write here" (or cannot create the -wal/-shm
 * files) rather than "this is not a good database": worth retrying with a
 * weaker open mode. */
static int rc_is_access(int rc)
{
    switch (rc & 0xff) {
    case SQLITE_READONLY:
    case SQLITE_CANTOPEN:
    case SQLITE_PERM:
    case SQLITE_IOERR:
    case SQLITE_AUTH:
        return 1;
    default:
        return 0;
    }
}

/* A "file:" URI for path with the given query, percent-encoding what a URI
 * reserves, so any file name works. Caller frees. */
char *stof__db_path_uri(const char *path, const char *query)
{
    size_t n = strlen(path);
    char *u = malloc(3 * n + strlen(query) + 16);
    if (!u)
        return NULL;
    char *p = u;
    memcpy(p, "file:", 5);
    p += 5;
    if (path[0] == '/') {
        /* An empty authority, so "//x" stays a path. */
        memcpy(p, "//", 2);
        p += 2;
    }
    static const char hex[] = "0123456789ABCDEF";
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)path[i];
        if (c <= 0x20 || c >= 0x7f || c == '%' || c == '?' || c == '#') {
            *p++ = '%';
            *p++ = hex[c >> 4];
            *p++ = hex[c & 15];
        } else {
            *p++ = (char)c;
        }
    }
    strcpy(p, query);
    return u;
}

/* 1 when the file at path starts with an SQLite header that says WAL mode
 * (bytes 18 and 19, the write and read versions, are 2). */
static int header_says_wal(const char *path)
{
    unsigned char h[100];
    FILE *f = fopen(path, "rb");
    if (!f)
        return 0;
    size_t n = fread(h, 1, sizeof(h), f);
    fclose(f);
    return n == sizeof(h) && memcmp(h, "SQLite format 3", 16) == 0 &&
           h[18] == 2 && h[19] == 2;
}

/* The URI query that reads path without creating files next to it. A WAL
 * database read with mode=ro gets -wal and -shm files made beside it (and
 * left there), or fails where the directory is read-only. When no -wal
 * file exists, no process has the database open and nothing is waiting in
 * a log: the main file holds everything, so it is read immutable (no
 * locks, no side files). With a -wal file present, a writer is (or was)
 * there: read through SQLite's locking, which uses the files that exist. */
static const char *readonly_query(const char *path)
{
    if (!header_says_wal(path))
        return "?mode=ro";
    size_t n = strlen(path) + 8;
    char *wal = malloc(n);
    if (!wal)
        return "?mode=ro";
    snprintf(wal, n, "%s-wal", path);
    struct stat sb;
    const int live = stat(wal, &sb) == 0;
    free(wal);
    return live ? "?mode=ro" : "?mode=ro&immutable=1";
}

char *stof__db_readonly_uri(const char *path)
{
    return stof__db_path_uri(path, readonly_query(path));
}

int stof__db_connect(const char *path, const char *query, int flags,
                     int busy_ms, sqlite3 **out)
{
    *out = NULL;
    char *uri = stof__db_path_uri(path, query);
    if (!uri)
        return SQLITE_NOMEM;
    sqlite3 *c = NULL;
    int rc = sqlite3_open_v2(uri, &c,
                             SQLITE_OPEN_URI | SQLITE_OPEN_NOMUTEX | flags,
                             NULL);
    free(uri);
    if (rc == SQLITE_OK)
        rc = sqlite3_extended_result_codes(c, 1);
    if (rc == SQLITE_OK)
        rc = sqlite3_busy_timeout(c, busy_ms);
    *out = c; /* on failure too, for its message; the caller closes it */
    return rc;
}

int stof__db_open_readonly(const char *path, sqlite3 **out)
{
    int rc = stof__db_connect(path, readonly_query(path),
                              SQLITE_OPEN_READONLY, DB_BUSY_TIMEOUT_MS, out);
    if (rc != SQLITE_OK) {
        sqlite3_close(*out);
        *out = NULL;
    }
    return rc;
}

/* mkdir -p of the directory that holds `path`. 0, or -1 with errno. */
static int make_parent_dirs(const char *path)
{
    char *p = strdup(path);
    if (!p)
        return -1;
    char *slash = strrchr(p, '/');
    if (!slash || slash == p) {
        free(p);
        return 0;
    }
    *slash = '\0';
    for (char *q = p + 1;; q++) {
        if (*q != '/' && *q != '\0')
            continue;
        char c = *q;
        *q = '\0';
        if (mkdir(p, 0700) != 0) {
            int e = errno;
            struct stat sb;
            if (stat(p, &sb) != 0 || !S_ISDIR(sb.st_mode)) {
                free(p);
                errno = e;
                return -1;
            }
        }
        if (c == '\0')
            break;
        *q = c;
    }
    free(p);
    return 0;
}

/* The identity of path's contents (and whether a -wal is beside it); 0
 * when it cannot be read. */
static int file_id(const char *path, db_file_id *id)
{
    struct stat sb;
    memset(id, 0, sizeof(*id));
    if (stat(path, &sb) != 0)
        return 0;
    id->dev = (unsigned long long)sb.st_dev;
    id->ino = (unsigned long long)sb.st_ino;
    id->size = (unsigned long long)sb.st_size;
    id->mt_s = (long long)sb.st_mtim.tv_sec;
    id->mt_ns = (long long)sb.st_mtim.tv_nsec;
    /* (on a lookup's path: no allocation for the usual path lengths) */
    char small[512];
    const size_t n = strlen(path) + 8;
    char *wal = n <= sizeof(small) ? small : malloc(n);
    if (wal) {
        snprintf(wal, n, "%s-wal", path);
        id->wal = stat(wal, &sb) == 0;
        if (wal != small)
            free(wal);
    }
    return 1;
}

/* Open L->path in `mode`; on failure *out is NULL and the SQLite code is
 * returned (with its message in why). */
static int layer_connect(db_layer *L, db_mode mode, int user,
                         sqlite3 **out)
{
    const char *query = mode == MODE_RW   ? ""
                        : mode == MODE_RO ? (user ? "?mode=ro"
                                                  : readonly_query(L->path))
                                          : "?mode=ro&immutable=1";
    /* (stamped before the connection: a change from here on is seen) */
    L->immutable = strstr(query, "immutable=1") != NULL;
    if (L->immutable) {
        L->watched = 1;
        file_id(L->path, &L->id);
    }
    int rc = stof__db_connect(L->path, query,
                              mode == MODE_RW ? SQLITE_OPEN_READWRITE |
                                                    SQLITE_OPEN_CREATE
                                              : SQLITE_OPEN_READONLY,
                              DB_BUSY_TIMEOUT_MS, out);
    /* A page cache that holds a few layers' records with their cubins
     * (SQLite's default is 2 MiB): read once (stof_preload reads them
     * all), a plan's lookups then copy rather than read the file. */
    if (rc == SQLITE_OK)
        rc = stof__db_exec(*out, "PRAGMA cache_size = -16384");
    if (rc != SQLITE_OK) {
        snprintf(L->why, sizeof(L->why), "%s",
                 *out ? sqlite3_errmsg(*out) : sqlite3_errstr(rc));
        sqlite3_close(*out);
        *out = NULL;
    }
    return rc;
}

/* Header facts of an open database, read in one statement (one read
 * transaction). This is where "not a database", truncated and corrupt
 * files show up. */
typedef struct db_header {
    int app_id, version, n_objects;
} db_header;

static int read_header(sqlite3 *c, db_header *h)
{
    static const char sql[] =
        "SELECT (SELECT application_id FROM pragma_application_id),"
        " (SELECT user_version FROM pragma_user_version),"
        " (SELECT count(*) FROM sqlite_master)";
    sqlite3_stmt *s = NULL;
    int rc = sqlite3_prepare_v2(c, sql, -1, &s, NULL);
    if (rc == SQLITE_OK) {
        rc = sqlite3_step(s);
        if (rc == SQLITE_ROW) {
            h->app_id = sqlite3_column_int(s, 0);
            h->version = sqlite3_column_int(s, 1);
            h->n_objects = sqlite3_column_int(s, 2);
            rc = SQLITE_OK;
        }
    }
    sqlite3_finalize(s);
    return rc;
}

/* How a header is to be treated. */
typedef enum db_kind {
    KIND_CURRENT,  /* a stof database of this schema version */
    KIND_OLDER,    /* a stof database (or empty) that needs migrations */
    KIND_NEWER,    /* written by a later stof */
    KIND_FOREIGN,  /* some other SQLite file */
    KIND_BROKEN    /* stof's id with an impossible version */
} db_kind;

static db_kind classify(const db_header *h)
{
    if (h->app_id == 0 && h->version == 0 && h->n_objects == 0)
        return KIND_OLDER; /* empty: version 0 */
    if (h->app_id != STOF_DB_APPLICATION_ID)
        return KIND_FOREIGN;
    if (h->version > STOF_DB_SCHEMA_VERSION)
        return KIND_NEWER;
    if (h->version < 1)
        return KIND_BROKEN;
    return h->version == STOF_DB_SCHEMA_VERSION ? KIND_CURRENT : KIND_OLDER;
}

static const char *kind_why(db_kind k, const db_header *h, char *buf,
                            size_t n)
{
    switch (k) {
    case KIND_NEWER:
        snprintf(buf, n,
                 "schema version %d is newer than this build's (%d): written "
                 "by a later stof",
                 h->version, STOF_DB_SCHEMA_VERSION);
        break;
    case KIND_FOREIGN:
        if (h->app_id == 0 && h->n_objects == 0)
            snprintf(buf, n, "empty SQLite file, not a stof database");
        else
            snprintf(buf, n,
                     "not a stof tuning database (application_id 0x%08x, "
                     "%d schema objects)",
                     (unsigned)h->app_id, h->n_objects);
        break;
    case KIND_BROKEN:
        snprintf(buf, n, "stof database without a schema version");
        break;
    case KIND_OLDER:
        snprintf(buf, n,
                 "schema version %d is older than this build's (%d) and the "
                 "file cannot be upgraded (read-only)",
                 h->version, STOF_DB_SCHEMA_VERSION);
        break;
    default:
        snprintf(buf, n, "usable");
        break;
    }
    return buf;
}



/* Bring an empty or older stof database up to STOF_DB_SCHEMA_VERSION under
 * the write lock. The header is read again inside the transaction: another
 * process may have created or upgraded the file since it was read. Returns
 * the SQLite code; *kind says what the file turned out to be. */
static int migrate(sqlite3 *c, db_kind *kind, db_header *h)
{
    int rc = stof__db_exec(c, "BEGIN IMMEDIATE");
    if (rc != SQLITE_OK)
        return rc;
    rc = read_header(c, h);
    if (rc != SQLITE_OK)
        goto fail;
    *kind = classify(h);
    if (*kind != KIND_OLDER) {
        rc = stof__db_exec(c, "COMMIT");
        goto done;
    }
    for (size_t i = 0; i < sizeof(db_migrations) / sizeof(db_migrations[0]);
         i++) {
        if (db_migrations[i].to <= h->version)
            continue;
        rc = stof__db_exec(c, db_migrations[i].sql);
        if (rc != SQLITE_OK)
            goto fail;
    }
    char sql[512];
    snprintf(sql, sizeof(sql),
             "PRAGMA application_id = %d;"
             "PRAGMA user_version = %d;"
             "INSERT OR REPLACE INTO meta(key, value) VALUES"
             " ('schema_version', %d), ('stof_version', '%s');",
             STOF_DB_APPLICATION_ID, STOF_DB_SCHEMA_VERSION,
             STOF_DB_SCHEMA_VERSION, stof_version_string());
    rc = stof__db_exec(c, sql);
    if (rc != SQLITE_OK)
        goto fail;
    rc = stof__db_exec(c, "COMMIT");
    if (rc != SQLITE_OK)
        goto fail;
    h->app_id = STOF_DB_APPLICATION_ID;
    h->version = STOF_DB_SCHEMA_VERSION;
    *kind = KIND_CURRENT;
done:
    return rc;
fail:
    stof__db_rollback(c);
    return rc;
}


static void layer_close(db_layer *L)
{
    for (int i = 0; i < ST_COUNT_; i++) {
        sqlite3_finalize(L->st[i]);
        L->st[i] = NULL;
    }
    if (L->conn)
        sqlite3_close(L->conn);
    L->conn = NULL;
    L->writable = 0;
}

/* 1 when the tables have what this build reads and writes (preparing the
 * statements checks every column); else 0 with the reason in why. */
static int records_match(sqlite3 *c, char *why, size_t n)
{
    static const int check[] = {ST_LOOKUP, ST_STORE, ST_MISS};
    for (size_t i = 0; i < sizeof(check) / sizeof(check[0]); i++) {
        sqlite3_stmt *s = NULL;
        int rc = sqlite3_prepare_v2(c, stof__db_sql[check[i]], -1, &s, NULL);
        sqlite3_finalize(s);
        if (rc != SQLITE_OK) {
            snprintf(why, n, "its tables do not match this build: %s",
                     sqlite3_errmsg(c));
            return 0;
        }
    }
    return 1;
}

/* The columns of every table, as one text, of the schema made by the
 * migration steps up to `version` (applied to an in-memory database) or of
 * the database open on c: "table(name type notnull pk, ...)..." in name
 * order. NULL when out of memory. */
static char *schema_text(sqlite3 *c)
{
    static const char sql[] =
        "SELECT group_concat(line, ';') FROM (SELECT m.name || '(' ||"
        " (SELECT group_concat(p.name || ' ' || p.type || ' ' || p.\"notnull\""
        " || ' ' || p.pk, ',') FROM pragma_table_info(m.name) AS p) || ')'"
        " AS line FROM sqlite_master AS m WHERE m.type = 'table'"
        " ORDER BY m.name)";
    sqlite3_stmt *s = NULL;
    char *out = NULL;
    if (sqlite3_prepare_v2(c, sql, -1, &s, NULL) == SQLITE_OK &&
        sqlite3_step(s) == SQLITE_ROW) {
        const char *t = (const char *)sqlite3_column_text(s, 0);
        out = strdup(t ? t : "");
    }
    sqlite3_finalize(s);
    return out;
}

/* 1 when the tables of the database on c are exactly those of stof's
 * schema `version`, so that migrating it is safe; else 0 with the reason.
 * A file with stof's id but other tables is someone else's, and is never
 * modified. */
static int schema_is_version(sqlite3 *c, int version, char *why, size_t n)
{
    sqlite3 *mem = NULL;
    char *want = NULL, *have = NULL;
    int ok = 0;
    if (sqlite3_open_v2(":memory:", &mem,
                        SQLITE_OPEN_READWRITE | SQLITE_OPEN_MEMORY, NULL) ==
        SQLITE_OK) {
        int rc = SQLITE_OK;
        for (size_t i = 0; rc == SQLITE_OK &&
                           i < sizeof(db_migrations) / sizeof(db_migrations[0]);
             i++)
            if (db_migrations[i].to <= version)
                rc = stof__db_exec(mem, db_migrations[i].sql);
        if (rc == SQLITE_OK)
            want = schema_text(mem);
    }
    have = schema_text(c);
    ok = want && have && strcmp(want, have) == 0;
    if (!ok)
        snprintf(why, n,
                 "its tables are not those of stof's schema version %d",
                 version);
    free(want);
    free(have);
    sqlite3_close(mem);
    return ok;
}

/* Make an open, writable user database ready: WAL journal, synchronous
 * NORMAL, and the schema (created or migrated) when *kind is KIND_OLDER.
 * Returns the SQLite code; *kind becomes KIND_CURRENT, or what the file
 * turned out to be. */
static int setup_writable(const stof_db_sink *sink, db_layer *L, sqlite3 *c,
                          db_kind *kind, db_header *h)
{
    /* WAL lets readers and one writer work at once; when it cannot be had
     * (a file system without shared memory), the rollback journal with the
     * busy timeout still works. */
    sqlite3_stmt *s = NULL;
    int rc = sqlite3_prepare_v2(c, "PRAGMA journal_mode=WAL", -1, &s, NULL);
    if (rc == SQLITE_OK) {
        rc = sqlite3_step(s);
        if (rc == SQLITE_ROW) {
            const char *jm = (const char *)sqlite3_column_text(s, 0);
            if (!jm || strcmp(jm, "wal") != 0)
                stof__dbs_log(sink, STOF_LOG_INFO,
                          "tuning database %s: WAL mode not available "
                          "(journal mode %s)",
                          L->path, jm ? jm : "?");
            rc = SQLITE_OK;
        }
    }
    sqlite3_finalize(s);
    if (rc == SQLITE_OK)
        rc = stof__db_exec(c, "PRAGMA synchronous=NORMAL");
    if (rc == SQLITE_OK && *kind == KIND_OLDER)
        rc = migrate(c, kind, h);
    return rc;
}

/* Open layer L: the user database (user = 1: writable if possible, created
 * when missing) or a system database. Leaves L->conn NULL when unusable;
 * logs what it did. */
static void layer_open(const stof_db_sink *sink, db_layer *L, int user)
{
    const char *role = user ? "user" : "system";
    char first_why[sizeof(L->why)] = "";
    char kwhy[256];
    int mkdir_errno = 0;

    if (user && make_parent_dirs(L->path) != 0)
        mkdir_errno = errno;

    for (db_mode mode = user ? MODE_RW : MODE_RO; mode <= MODE_IMMUTABLE;
         mode++) {
        sqlite3 *c = NULL;
        db_header h = {0, 0, 0};
        int rc = SQLITE_OK;
        /* Another process may be creating the file or switching it to WAL
         * right now: an I/O or lock error on the header is retried before
         * the file is taken as read-only or unusable. */
        for (int attempt = 0;; attempt++) {
            rc = layer_connect(L, mode, user, &c);
            if (rc == SQLITE_OK)
                rc = read_header(c, &h);
            const int transient = (rc & 0xff) == SQLITE_IOERR ||
                                  (rc & 0xff) == SQLITE_BUSY ||
                                  (rc & 0xff) == SQLITE_LOCKED;
            if (rc == SQLITE_OK || !transient || attempt >= 20)
                break;
            sqlite3_close(c);
            c = NULL;
            usleep(5000u * (unsigned)(attempt + 1));
        }
        if (!c) {
            if (!first_why[0])
                memcpy(first_why, L->why, sizeof(first_why));
            if (rc_is_access(rc))
                continue;
            break;
        }
        int writable = mode == MODE_RW && !sqlite3_db_readonly(c, "main");
        if (mode == MODE_RW && !writable && !first_why[0])
            snprintf(first_why, sizeof(first_why),
                     "the file is not writable");
        if (rc != SQLITE_OK) {
            snprintf(L->why, sizeof(L->why), "%s", sqlite3_errmsg(c));
            if (!first_why[0])
                memcpy(first_why, L->why, sizeof(first_why));
            sqlite3_close(c);
            if (rc_is_access(rc))
                continue;
            break;
        }
        db_kind kind = classify(&h);
        if (kind == KIND_OLDER && !writable) {
            /* An empty file (version 0) where nothing can be created reads
             * as "not a stof database". */
            if (h.version == 0)
                kind = KIND_FOREIGN;
        }
        if (kind != KIND_CURRENT && !(kind == KIND_OLDER && writable)) {
            kind_why(kind, &h, kwhy, sizeof(kwhy));
            snprintf(L->why, sizeof(L->why), "%s", kwhy);
            sqlite3_close(c);
            break;
        }
        if ((kind == KIND_CURRENT &&
             !records_match(c, L->why, sizeof(L->why))) ||
            (kind == KIND_OLDER && h.version > 0 &&
             !schema_is_version(c, h.version, L->why, sizeof(L->why)))) {
            /* Checked before anything is written (the journal mode is in
             * the header): a file that is not ours is never modified. */
            sqlite3_close(c);
            break;
        }
        if (writable) {
            /* Switching to WAL and creating the schema need locks that
             * SQLite may refuse at once (SQLITE_BUSY without waiting on the
             * busy handler) while other processes open the same new file:
             * retry for as long as the busy timeout would have waited. */
            for (int attempt = 0;; attempt++) {
                rc = setup_writable(sink, L, c, &kind, &h);
                const int locked = (rc & 0xff) == SQLITE_BUSY ||
                                   (rc & 0xff) == SQLITE_LOCKED;
                if (!locked || attempt >= 400)
                    break;
                usleep(attempt < 20 ? 2000u : 25000u);
            }
            if (rc == SQLITE_OK && kind != KIND_CURRENT) {
                kind_why(kind, &h, kwhy, sizeof(kwhy));
                snprintf(L->why, sizeof(L->why), "%s", kwhy);
                sqlite3_close(c);
                break;
            }
            if (rc != SQLITE_OK) {
                snprintf(L->why, sizeof(L->why), "%s", sqlite3_errmsg(c));
                if (!first_why[0])
                    memcpy(first_why, L->why, sizeof(first_why));
                sqlite3_close(c);
                if (rc_is_access(rc) || (rc & 0xff) == SQLITE_BUSY)
                    continue;
                break;
            }
        }
        L->conn = c;
        L->writable = writable;
        L->mode = mode;
        sqlite3_stmt *s;
        rc = stof__db_layer_stmt(L, ST_LOOKUP, &s);
        if (rc != SQLITE_OK) {
            snprintf(L->why, sizeof(L->why), "preparing lookups: %s",
                     sqlite3_errmsg(c));
            layer_close(L);
            break;
        }
        /* And the check that serves a lookup from the memo (db_rows.c), so
         * that a process's first plan does not prepare it (measured on an
         * H200 host: 0.06 ms of the first lookup). Best effort: prepared
         * at its first use otherwise. */
        (void)stof__db_layer_stmt(L, ST_HASH, &s);
        if (writable) {
            L->why[0] = '\0';
            return;
        }
        snprintf(L->why, sizeof(L->why), "%s",
                 first_why[0] ? first_why : "opened read-only");
        if (user)
            stof__dbs_log(sink, STOF_LOG_WARN,
                      "tuning database %s (user): cannot be written (%s%s); "
                      "using it read-only%s, tuning results will not be "
                      "stored",
                      L->path, L->why,
                      mkdir_errno ? ", creating its directory failed" : "",
                      mode == MODE_IMMUTABLE
                          ? " and immutable (its directory is not writable, "
                            "so SQLite cannot make its -shm file; changes by "
                            "others are not seen)"
                          : "");
        else if (mode == MODE_IMMUTABLE)
            stof__dbs_log(sink, STOF_LOG_INFO,
                      "tuning database %s (system): opened immutable (%s)",
                      L->path, L->why);
        return;
    }
    if (mkdir_errno && user) {
        size_t k = strlen(L->why);
        snprintf(L->why + k, sizeof(L->why) - k,
                 " (creating its directory failed: %s)",
                 strerror(mkdir_errno));
    }
    stof__dbs_log(sink, STOF_LOG_WARN, "tuning database %s (%s): skipped: %s",
              L->path, role, L->why[0] ? L->why : "cannot be opened");
}

/* --------------------------------------------------------- public API */

void stof__db_record_clear(stof_db_record *r)
{
    if (!r)
        return;
    free(r->cubin);
    memset(r, 0, sizeof(*r));
}

int stof__db_default_path(char *buf, size_t n)
{
    if (!buf || n == 0)
        return 0;
    const char *env = getenv("STOF_USER_DB");
    int len;
    if (env && *env) {
        len = snprintf(buf, n, "%s", env);
    } else if ((env = getenv("XDG_CACHE_HOME")) && env[0] == '/') {
        /* The XDG spec says relative values are to be ignored. */
        len = snprintf(buf, n, "%s/stof/tuning.db", env);
    } else if ((env = getenv("HOME")) && *env) {
        len = snprintf(buf, n, "%s/.cache/stof/tuning.db", env);
    } else {
        buf[0] = '\0';
        return 0;
    }
    if (len < 0 || (size_t)len >= n) {
        buf[0] = '\0';
        return 0;
    }
    return 1;
}

int stof__db_layer_fresh(stof_db *db, int i)
{
    db_layer *L = &db->layers[i];
    /* (a layer open through SQLite's locking sees changes itself) */
    if (!L->watched || (L->conn && !L->immutable))
        return L->conn != NULL;
    db_file_id now;
    if (!file_id(L->path, &now) || memcmp(&now, &L->id, sizeof(now)) == 0)
        return L->conn != NULL; /* (gone for now: the open file serves) */
    /* Changed under an immutable connection (SQLite would read pages of two
     * versions), or changed since an open that failed (a copy under way):
     * opened again, as what the file is now. */
    stof__dbs_log(&db->sink, STOF_LOG_INFO,
                  "tuning database %s (%s): changed on disk; opened again",
                  L->path, i == 0 ? "user" : "system");
    stof__db_memo_drop(db, NULL);
    layer_close(L);
    L->warned = 0;
    L->id = now; /* (stamped again if it opens immutable) */
    layer_open(&db->sink, L, i == 0);
    return L->conn != NULL;
}

stof_status stof__db_open(const stof_db_sink *sink, const char *user_path,
                          const char *const *system_paths, stof_db **out)
{
    if (!out)
        return stof__dbs_fail(sink, STOF_ERR_INVALID_ARGUMENT,
                          "stof__db_open: out is NULL");
    *out = NULL;
    int n_sys = 0;
    while (system_paths && system_paths[n_sys])
        n_sys++;
    stof_db *db = calloc(1, sizeof(*db) + (size_t)(n_sys + 1) *
                                              sizeof(db_layer));
    if (!db)
        return stof__dbs_fail(sink, STOF_ERR_OUT_OF_MEMORY,
                          "tuning database: out of memory");
    db->sink = *sink;
    db->n_layers = n_sys + 1;

    char def[4096];
    if (!user_path) {
        if (stof__db_default_path(def, sizeof(def)))
            user_path = def;
        else
            stof__dbs_log(sink, STOF_LOG_INFO,
                      "no user tuning database: none of STOF_USER_DB, "
                      "XDG_CACHE_HOME, HOME is set");
    }
    if (user_path && *user_path) {
        db->layers[0].path = strdup(user_path);
        if (!db->layers[0].path)
            goto oom;
    } else {
        snprintf(db->layers[0].why, sizeof(db->layers[0].why),
                 "there is no user database");
    }
    for (int i = 0; i < n_sys; i++) {
        db->layers[i + 1].path = strdup(system_paths[i]);
        if (!db->layers[i + 1].path)
            goto oom;
    }

    if (db->layers[0].path)
        layer_open(sink, &db->layers[0], 1);
    for (int i = 1; i < db->n_layers; i++) {
        if (!db->layers[i].path[0]) {
            snprintf(db->layers[i].why, sizeof(db->layers[i].why),
                     "empty path");
            stof__dbs_log(sink, STOF_LOG_WARN,
                      "tuning database (system %d): skipped: empty path", i);
            continue;
        }
        layer_open(sink, &db->layers[i], 0);
    }
    *out = db;
    return STOF_OK;
oom:
    stof__db_close(&db);
    return stof__dbs_fail(sink, STOF_ERR_OUT_OF_MEMORY,
                      "tuning database: out of memory");
}

void stof__db_close(stof_db **pdb)
{
    if (!pdb || !*pdb)
        return;
    stof_db *db = *pdb;
    stof__db_hits_flush(db);
    for (int i = 0; i < db->n_layers; i++) {
        layer_close(&db->layers[i]);
        free(db->layers[i].path);
    }
    free(db->trust.v);
    stof__db_memo_drop(db, NULL);
    free(db->pend.key);
    free(db->pend.n);
    free(db);
    *pdb = NULL;
}

int stof__db_writable(const stof_db *db)
{
    return db && db->layers[0].conn && db->layers[0].writable;
}

int stof__db_layers(const stof_db *db)
{
    return db ? db->n_layers : 0;
}

int stof__db_layer_open(const stof_db *db, int layer)
{
    return db && layer >= 0 && layer < db->n_layers &&
           db->layers[layer].conn != NULL;
}

/* Copy a text column into a char array, truncating. */
