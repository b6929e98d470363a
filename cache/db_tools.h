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
 * Every function records its failure on ctx (stof_errmsg) and returns
 * STOF_ERR_DATABASE for an unusable or unwritable file, STOF_ERR_IO for a
 * file that cannot be created or renamed. One thread at a time per ctx.
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

typedef struct stof_dbt_result {
    int64_t records_read;   /* records taken from the inputs */
    int64_t records;        /* records in the result */
    int64_t misses;         /* misses in the result */
    int64_t conflicts;      /* keys with at least one losing record */
    int64_t losers;         /* losing records */
} stof_dbt_result;

/* Check that `path` is a readable stof tuning database of this build's
 * schema: 0 bytes, a foreign file, a corrupt file or a newer schema fail
 * with STOF_ERR_DATABASE and a message naming the file and the reason;
 * a missing file with STOF_ERR_NOT_FOUND. Never modifies the file. */
stof_status stof__dbt_check(stof_context *ctx, const char *path);

/* Write a new database at out_path from the n inputs, merged by the rule
 * above (records filtered by f, which may be NULL; misses are copied only
 * when with_misses is set). The file is written under a temporary name in
 * the same directory and renamed over out_path only on success, so a
 * failure never leaves a partial file (an existing out_path is then left
 * as it was). conflict_fn may be NULL. res may be NULL. */
stof_status stof__dbt_write(stof_context *ctx, const char *out_path,
                            const char *const *inputs, int n,
                            const stof_dbt_filter *f, int with_misses,
                            stof_dbt_conflict_fn conflict_fn, void *user,
                            stof_dbt_result *res /* OUT */);

/* Merge the n inputs into the existing (or new) database at dest_path in
 * place, in one transaction, by the same rule (import). */
stof_status stof__dbt_merge_into(stof_context *ctx, const char *dest_path,
                                 const char *const *inputs, int n,
                                 const stof_dbt_filter *f, int with_misses,
                                 stof_dbt_conflict_fn conflict_fn, void *user,
                                 stof_dbt_result *res /* OUT */);

/* Delete the records of `path` whose stof_version differs from
 * `stof_version` or whose template_hash differs from `template_hash`
 * (dry_run: only count). *deleted and *kept get the counts. */
stof_status stof__dbt_gc(stof_context *ctx, const char *path,
                         const char *stof_version, const char *template_hash,
                         int dry_run, int64_t *deleted /* OUT */,
                         int64_t *kept /* OUT */);

/* Delete one record by key. STOF_ERR_NOT_FOUND when it is not there. */
stof_status stof__dbt_delete(stof_context *ctx, const char *path,
                             const char *key);

/* Misses of `path`: their number and the sum of their counts. */
stof_status stof__dbt_miss_counts(stof_context *ctx, const char *path,
                                  int64_t *n /* OUT */,
                                  int64_t *total /* OUT */);

/* A growing list of records without their cubins, filled by passing
 * stof__dbt_collect and the list to stof__db_foreach. Free v with free(). */
typedef struct stof_dbt_records {
    stof_db_record *v;
    int n, cap;
} stof_dbt_records;
int stof__dbt_collect(void *user, const stof_db_record *r);

#endif /* STOF_DB_TOOLS_H */
