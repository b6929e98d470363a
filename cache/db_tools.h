/*
 * db_tools.h - operations on whole tuning database files, for stof-tune:
 * checking a file, writing a new database from others (export with
 * filters, merge), merging into an existing one (import), garbage
 * collection of records made by other stof or template versions, and
 * deleting single records. db.h is the database a running library uses;
 * this module works on the files themselves.
 *
 * The merge rule. Per key, the record that sorts first in one total order
 * over the record's content wins: verified before unverified, then the
 * smaller time_ms, then the cubin bytes, created_at, host, and every other
 * column in table order. Because it is the minimum of a total order, the
 * winner does not depend on the order of the inputs or on how often a
 * database is merged: merge is commutative, associative and idempotent.
 * Hit counts take the maximum over the inputs (a sum would count a
 * database merged twice twice). Misses are merged by key (count and
 * last_seen: maximum, first_seen: minimum, problem and mask: the smaller
 * value), and a miss whose key has a record in the result is dropped.
 *
 * Inputs are read without writing anything beside them. Every input
 * record is checked (stof_dbt_opts.check) before anything is written: a
 * fleet database must not spread a damaged or crafted record.
 *
 * Every function records its failure on sink (stof_errmsg) and returns
 * STOF_ERR_DATABASE for an unusable or unwritable file, STOF_ERR_IO for a
 * file that cannot be created or renamed. One thread at a time per sink.
 */
#ifndef STOF_DB_TOOLS_H
#define STOF_DB_TOOLS_H

#include "db.h"

/* Which records to take. NULL strings and 0 mean "any". */
typedef struct stof_dbt_filter {
    const char *gpu;      /* device_name equal to this (case-insensitive) */
    int driver;           /* driver_version equal to this */
} stof_dbt_filter;

/* A record that lost the merge to a different record with the same key. */
typedef struct stof_dbt_conflict {
    char key[33];
    const char *input;    /* the file the losing record came from */
    char loser_kernel[16], winner_kernel[16];
    double loser_ms, winner_ms;
    int loser_verified, winner_verified;
    char loser_host[64], winner_host[64];
} stof_dbt_conflict;

/* Called once per losing record, ordered by key then input index. */
typedef void (*stof_dbt_conflict_fn)(void *user, const stof_dbt_conflict *c);

/* Called once per invalid input record: the file, the record's key (as
 * stored, at most 32 characters, possibly not hex) and why. */
typedef void (*stof_dbt_reject_fn)(void *user, const char *input,
                                   const char *key, const char *why);

/* The full check of a record (stof__record_check in src/, which knows the
 * kernels); the database's own check when none is given. */
typedef int (*stof_dbt_check_fn)(const stof_db_record *r, char *why,
                                 size_t n);

/* Temporary files: `created` 1 when path (an output's temporary name) was
 * just created, 0 when it is gone (renamed into place or removed), so a
 * program can remove it when a signal ends it (stof-tune does). */
typedef void (*stof_dbt_tmp_fn)(void *user, const char *path, int created);

/* Something the operator should know that is not an error (a stale
 * temporary file removed). */
typedef void (*stof_dbt_note_fn)(void *user, const char *msg);

typedef struct stof_dbt_opts {
    stof_dbt_filter filter;
    int with_misses;      /* merge the misses too */
    stof_dbt_check_fn check;      /* NULL: stof__db_record_check */
    int drop_invalid;     /* 0: one invalid record fails the operation and
                             nothing is written; 1: invalid records are
                             left out (each reported) */
    stof_dbt_conflict_fn on_conflict;  /* each may be NULL */
    stof_dbt_reject_fn on_reject;
    stof_dbt_tmp_fn on_tmp;
    stof_dbt_note_fn on_note;
    void *user;
} stof_dbt_opts;

typedef struct stof_dbt_result {
    int64_t records_read;   /* records taken from the inputs */
    int64_t records;        /* records in the result */
    int64_t misses;         /* misses in the result */
    int64_t conflicts;      /* keys with at least one losing record */
    int64_t losers;         /* losing records */
    int64_t rejected;       /* invalid input records */
} stof_dbt_result;

/* Check that `path` is a readable stof tuning database of this build's
 * schema: 0 bytes, a foreign file, a corrupt file or a newer schema fail
 * with STOF_ERR_DATABASE and a message naming the file and the reason;
 * a missing file with STOF_ERR_NOT_FOUND. Never modifies the file, and
 * creates nothing beside it (stof__db_open_readonly). */
stof_status stof__dbt_check(const stof_db_sink *sink, const char *path);

/* Write a new database at out_path from the n inputs, merged by the rule
 * above, with every input record checked first (opts->check).
 *
 * The output is checked before any work: a directory, something that is
 * not a regular file, a file that is not a stof tuning database (or an
 * empty file), a file this user may not write, or a directory where no
 * file can be created fail at once (STOF_ERR_DATABASE / STOF_ERR_IO) and
 * nothing is written. The result is built under a temporary name
 * "OUT.tmp-stof-PID-XXXXXX" in the same directory, locked while it lives
 * (temporaries of killed runs, which nobody holds, are removed by the
 * next run), made self-contained (no -wal or -shm), given the mode of the
 * file it replaces (or 0666 less the umask), and renamed over out_path.
 * An existing out_path is replaced only while no process has it open: it
 * is locked exclusively first (a serving process or a writer holding it
 * makes the call fail with STOF_ERR_DATABASE, and nothing changes), its
 * log is folded in and its -wal/-shm/-journal removed, so none of them can
 * meet the new file. A failure never leaves a partial or temporary file.
 * res may be NULL. */
stof_status stof__dbt_write(const stof_db_sink *sink, const char *out_path,
                            const char *const *inputs, int n,
                            const stof_dbt_opts *opts,
                            stof_dbt_result *res /* OUT */);

/* Merge the n inputs into the existing (or new) database at dest_path in
 * place (import), by the same rule and checks, in ONE transaction: either
 * every input is merged or, on any failure (an unreadable input, an
 * invalid record, a full disk), nothing is. */
stof_status stof__dbt_merge_into(const stof_db_sink *sink, const char *dest_path,
                                 const char *const *inputs, int n,
                                 const stof_dbt_opts *opts,
                                 stof_dbt_result *res /* OUT */);

/* Delete the records of `path` whose stof_version differs from
 * `stof_version` or whose template_hash differs from `template_hash`
 * (dry_run: only count). *deleted and *kept get the counts. */
stof_status stof__dbt_gc(const stof_db_sink *sink, const char *path,
                         const char *stof_version, const char *template_hash,
                         int dry_run, int64_t *deleted /* OUT */,
                         int64_t *kept /* OUT */);

/* Delete one record by key, and content hash unless that is NULL or empty.
 * STOF_ERR_NOT_FOUND when it is not there. */
stof_status stof__dbt_delete(const stof_db_sink *sink, const char *path,
                             const char *key, const char *content_hash);

/* Misses of `path`: their number and the sum of their counts. */
stof_status stof__dbt_miss_counts(const stof_db_sink *sink, const char *path,
                                  int64_t *n /* OUT */,
                                  int64_t *total /* OUT */);

/* A growing list of records without their cubins (cubin NULL, cubin_size
 * kept), each checked while its cubin was there: why[i] is "" for a valid
 * record, else the reason. Fill it by passing stof__dbt_collect and the
 * list to stof__db_foreach; free it with stof__dbt_records_free. */
typedef struct stof_dbt_records {
    stof_db_record *v;
    char (*why)[160];
    int n, cap;
    stof_dbt_check_fn check;  /* set before collecting; NULL: the
                                 database's own check */
} stof_dbt_records;
int stof__dbt_collect(void *user, const stof_db_record *r);
void stof__dbt_records_free(stof_dbt_records *l);

#endif /* STOF_DB_TOOLS_H */
