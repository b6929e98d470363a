/*
 * db.h - the SQLite tuning database: one writable user database layered
 * over any number of read-only system databases. Records hold the winning
 * kernel of a problem (its configuration and cubin) with how and where it
 * was measured; misses recorded by cache-only runs are kept for later
 * tuning. Every failure (missing, corrupt, foreign, read-only or newer-
 * schema file) is logged and degrades to "miss" or "read-only", never a
 * crash.
 */
#ifndef STOF_DB_H
#define STOF_DB_H

#include <stddef.h>
#include <stdint.h>

#include "stof.h"

typedef struct sqlite3 sqlite3;

/* Where the database reports: its caller gives it a sink (the library
 * passes one that records failures on the context and logs through it:
 * STOF_DB_SINK in internal.h), so the database knows nothing of contexts.
 * fail records a failure and returns st; log writes a line; ok marks the
 * last call successful. Any of them may be NULL. */
typedef struct stof_db_sink {
    void *user;
    stof_status (*fail)(void *user, stof_status st, const char *msg);
    void (*log)(void *user, stof_log_level level, const char *msg);
    void (*ok)(void *user);
} stof_db_sink;

/* Report through a sink (sink may be NULL: nothing is reported). */
stof_status stof__dbs_fail(const stof_db_sink *sink, stof_status st,
                           const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;
void stof__dbs_log(const stof_db_sink *sink, stof_log_level level,
                   const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;
stof_status stof__dbs_ok(const stof_db_sink *sink);

/* An argument check of the database's functions. */
#define DBS_CHECK_ARG(sink, cond, ...)                                         \
    do {                                                                       \
        if (!(cond))                                                           \
            return stof__dbs_fail((sink), STOF_ERR_INVALID_ARGUMENT,           \
                                  __VA_ARGS__);                                \
    } while (0)

#define STOF_DB_SCHEMA_VERSION 2

typedef struct stof_db stof_db;

/* One record. Strings are NUL-terminated and truncated to their arrays. */
typedef struct stof_db_record {
    char key[33];            /* problem key: 32 hex digits (XXH3-128) */
    /* the problem, readable */
    char op[16];             /* "attention" */
    char mask_digest[33];
    char mask_spec[256];     /* the spec when the mask came from one, else "" */
    int batch, heads, seq_q, seq_k, head_dim;
    char dtype[8];           /* "fp16" / "bf16" */
    char layout[16];         /* "BHSD" / "BSHD" / "strided" */
    /* where it is valid */
    char device_name[128];
    int cc_major, cc_minor, sm_count;
    int driver_version;      /* e.g. 13000 */
    char nvrtc_version[16];  /* "13.0" */
    char stof_version[16];   /* "0.2.0" */
    char template_hash[17];  /* 16 hex digits */
    /* the winner */
    char kernel[16];         /* "block", "rowwise", "wgmma", "reference" */
    char config[256];        /* JSON object of the kernel's parameters */
    char arch[16];           /* what the cubin was compiled for */
    void *cubin;             /* owned by the record (malloc) */
    size_t cubin_size;
    /* how it was measured */
    double time_ms;          /* winner's median time */
    double runner_up_ms;     /* second best (0 if none) */
    double model_ms;         /* time of the cost model's first choice */
    int n_candidates;        /* candidates timed in stage 2 */
    int verified;            /* 1: checked against the reference */
    char measured[256];      /* JSON: method, repetitions, seed */
    int64_t created_at;      /* unix seconds */
    char host[64];
    /* integrity: XXH3-128 over every field above and the cubin, in 32 hex
     * digits (stof__db_record_hash); filled by stof__db_store */
    char content_hash[33];
    /* filled by lookups */
    uint64_t cubin_xxh3;     /* XXH3-64 of the cubin when the record came
                                from the memo (0: not known) */
    int64_t hits;
    char source[16];         /* "user" or "system" */
    int layer;               /* 0 user, i + 1 system database i */
} stof_db_record;

/* Free what a record owns (the cubin) and zero it. */
void stof__db_record_clear(stof_db_record *r);

/* The default user database path: $STOF_USER_DB if set, else
 * $XDG_CACHE_HOME/stof/tuning.db, else $HOME/.cache/stof/tuning.db. Written
 * into buf (n bytes); returns 0 when no path can be formed. */
int stof__db_default_path(char *buf, size_t n);

/* Open the layered database. user_path: NULL = the default path, "" = no
 * user database. The user database is created (with its directory) when
 * missing, opened in WAL mode with a busy timeout; if it cannot be opened
 * for writing it is used read-only, and if it is unusable (corrupt,
 * foreign, newer schema) it is skipped: both are logged at STOF_LOG_WARN
 * on sink. system_paths: NULL-terminated list (may be NULL), opened
 * read-only, each skipped with a warning when unusable. Never fails for a
 * bad file; fails only for out-of-memory. */
stof_status stof__db_open(const stof_db_sink *sink, const char *user_path,
                          const char *const *system_paths,
                          stof_db **out /* OUT */);
void stof__db_close(stof_db **db);

/* 1 when the user database is open for writing. */
int stof__db_writable(const stof_db *db);

/* Look a key up: the user database first, then the system databases in
 * order. STOF_OK with *out filled (caller clears it), STOF_ERR_NOT_FOUND on
 * a miss (also when every layer is unusable). A record that fails
 * stof__db_record_check (a damaged or crafted record, or one whose content
 * hash does not match) is logged once and skipped, and the lookup goes on
 * to the next layer. Counts the hit in the user database when it is
 * writable (best effort). */
stof_status stof__db_lookup(stof_db *db, const char *key,
                            stof_db_record *out /* OUT */);

/* stof__db_lookup, except that a record served from the memo comes
 * without a cubin of more than STOF_DB_LAZY_MIN_BYTES (out->cubin NULL;
 * cubin_size and cubin_xxh3 set): for a caller that finds the module
 * loaded already by that hash and needs the bytes only otherwise (then
 * stof__db_lookup_again), sparing a copy and a hash of each cubin in a
 * warm plan. A record read from the file comes whole, as from
 * stof__db_lookup. */
#define STOF_DB_LAZY_MIN_BYTES 4096
stof_status stof__db_lookup_lazy(stof_db *db, const char *key,
                                 stof_db_record *out /* OUT */);
/* stof__db_lookup of a key just looked up lazily, whole, without counting
 * another hit. */
stof_status stof__db_lookup_again(stof_db *db, const char *key,
                                  stof_db_record *out /* OUT */);

/* Store a record in the user database in one transaction, with its content
 * hash computed here (r->content_hash is ignored). When a record with the
 * same key exists, the new one replaces it only if `replace` is set, or it
 * is verified and either faster or the stored one is unverified (so
 * concurrent tuners converge on the fastest verified record; ties and
 * unverified records never replace). trusted_here: the record was verified
 * on this host (it was just tuned here), so it is also marked trusted in
 * the same transaction (stof__db_trust). STOF_ERR_DATABASE when there is
 * no writable user database. */
stof_status stof__db_store(stof_db *db, const stof_db_record *r, int replace,
                           int trusted_here);

/* Store n records that belong together (a layer's kernels and its scheme)
 * in one transaction: all of them, replacing what their keys hold, when
 * the lead record recs[lead] would be stored by stof__db_store's rule
 * against the user database's record of its key (or `replace` is set);
 * none otherwise. So concurrent tuners of one layer never leave one's
 * scheme with another's kernels. */
stof_status stof__db_store_unit(stof_db *db, const stof_db_record *recs, int n,
                                int lead, int replace, int trusted_here);

/* --- Local trust ---------------------------------------------------------
 * A record names a cubin; a cubin is code. A record may come from anywhere
 * (a system database, an import, a merge), so before a cubin from the
 * database runs for real, this host checks it once against the reference
 * and remembers that it did, per (key, content hash): in the user
 * database's `trusted` table when it is writable, else for the life of the
 * stof_db. Trust is never read from a system database, and export, import
 * and merge never copy it. */

/* 1 when this host has verified the record with r's key and content hash. */
int stof__db_trusted(stof_db *db, const stof_db_record *r);

/* Remember that this host verified r (best effort: a failure is logged and
 * the trust is kept in memory). */
void stof__db_trust(stof_db *db, const stof_db_record *r);

/* Delete the user database's record for key when its content hash is
 * `content_hash` (a record that failed verification on this host, so that
 * a new tuning result can take its place). Best effort. */
void stof__db_forget(stof_db *db, const char *key, const char *content_hash);

/* --- Records ------------------------------------------------------------ */

/* The content hash of a record: XXH3-128, 32 lowercase hex digits, over
 * every stored field (in schema order, each with its length) and the
 * cubin; not over hits, source, layer or content_hash itself. */
void stof__db_record_hash(const stof_db_record *r, char out[33] /* OUT */);

/* Check what the database layer can know about a record: the key is 32
 * hex digits, op/dtype/layout are known words, sizes and versions are in
 * range, times are finite (time_ms > 0), text fields are printable ASCII,
 * a kernel record has a cubin of a sane size, and content_hash matches the
 * record. Returns 1 when valid, else 0 with the reason in why. The kernel
 * configuration itself is checked by its operation (stof__record_check in
 * src/). */
int stof__db_record_check(const stof_db_record *r, char *why, size_t n);

/* The columns of a record in the order stof__db_read_row reads them, as
 * SQL ("key,op,...,cubin,hits"), for statements of other modules. */
const char *stof__db_columns(void);

/* An SQL condition, on the records of table alias t, that holds when
 * every column has the type its field has and every text fits its field
 * (a longer value would be cut when read, so that what is checked is not
 * what is stored). Written into buf; 0 when it does not fit. */
int stof__db_shape_sql(const char *t, char *buf, size_t n);

/* Fill r from the row of s whose column `first` is the first of
 * stof__db_columns(). SQLITE_OK, or SQLITE_NOMEM when the cubin cannot be
 * copied (r owns its cubin: stof__db_record_clear). */
typedef struct sqlite3_stmt sqlite3_stmt;
int stof__db_read_row(sqlite3_stmt *s, int first, stof_db_record *r /* OUT */);

/* Open an existing database file for reading without writing anything
 * next to it: a WAL database that no process has open (no -wal file) is
 * opened immutable (SQLite would otherwise create -wal and -shm files
 * beside it, also in a read-only directory where that fails); any other
 * file read-only with locking. Returns the SQLite code (*out NULL on
 * failure). The URI form, for ATTACH, is stof__db_readonly_uri (caller
 * frees). */
int stof__db_open_readonly(const char *path, sqlite3 **out /* OUT */);

/* Open path with the URI query and flags (SQLITE_OPEN_URI and NOMUTEX are
 * added), extended result codes and the busy timeout. Returns the SQLite
 * code; *out is set even on failure (for its message) and must be closed. */
int stof__db_connect(const char *path, const char *query, int flags,
                     int busy_ms, sqlite3 **out /* OUT */);
char *stof__db_readonly_uri(const char *path);

/* Record a miss (a problem planned in cache-only mode): the key, the
 * problem as JSON (descriptor and mask spec) and, when the mask has no
 * spec, its packed bits. Increments the count when already recorded. */
stof_status stof__db_record_miss(stof_db *db, const char *key,
                                 const char *problem_json,
                                 const void *mask_bits, size_t mask_bytes);

/* Keep a copy of record r of layer `layer` (as stof__db_foreach gave it,
 * and checked with stof__db_record_check by the caller) in the handle's
 * memo, so that its lookups serve it without reading and checking it
 * again while its row keeps the same content hash (stof_preload). The
 * memo holds STOF_DB_MEMO_MAX records (64 MiB of cubins), the oldest
 * giving way. */
#define STOF_DB_MEMO_MAX 64
void stof__db_memo_keep(stof_db *db, int layer, const stof_db_record *r);

/* How many layers the database has (the user database, then each system
 * database), and whether layer i is open (readable). */
int stof__db_layers(const stof_db *db);
int stof__db_layer_open(const stof_db *db, int layer);

/* Iterate the records of the user database (layer 0) or system database
 * i (layer i+1), calling fn for each; fn returns nonzero to stop. Records
 * passed to fn are cleared after the call. */
typedef int (*stof_db_record_fn)(void *user, const stof_db_record *r);
stof_status stof__db_foreach(stof_db *db, int layer, stof_db_record_fn fn,
                             void *user);

/* Misses: iterate, and delete one (after tuning it). */
typedef int (*stof_db_miss_fn)(void *user, const char *key,
                               const char *problem_json, const void *mask_bits,
                               size_t mask_bytes, int64_t count);
stof_status stof__db_foreach_miss(stof_db *db, stof_db_miss_fn fn, void *user);
stof_status stof__db_delete_miss(stof_db *db, const char *key);

/* A "file:" URI for path with the given query (e.g. "?mode=ro"),
 * percent-encoding what a URI reserves, so any file name works. NULL when
 * out of memory; the caller frees. */
char *stof__db_path_uri(const char *path, const char *query);

#endif /* STOF_DB_H */
