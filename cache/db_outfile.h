/*
 * db_outfile.h - writing a database file that replaces another safely
 * (export -o, merge -o): the destination checked before any work, a
 * locked temporary beside it, temporaries of killed runs cleaned up, the
 * old file replaced only while nobody has it open and only after its
 * journals are gone, its mode kept. Used by db_tools.c; the contract is
 * stof__dbt_write's (db_tools.h).
 */
#ifndef STOF_DB_OUTFILE_H
#define STOF_DB_OUTFILE_H

#include <sys/types.h>

#include "db_tools.h"

typedef struct stof_outfile {
    char *path;           /* the destination */
    char *tmp;            /* the temporary, NULL when none */
    int fd;               /* open on tmp, holding flock(LOCK_EX); -1 none */
    mode_t mode;          /* mode the result gets */
    int existed;          /* the destination existed at the start */
    uid_t uid;            /* its owner, kept when allowed */
    gid_t gid;
    const stof_dbt_opts *opts;
} stof_outfile;

/* Check the destination (see stof__dbt_write), remove temporaries of
 * killed runs for it, and create a new empty temporary (of->tmp) holding
 * its lock. On failure nothing is left behind. */
stof_status stof__outfile_begin(const stof_db_sink *sink, const char *path,
                                const stof_dbt_opts *opts,
                                stof_outfile *of /* OUT */);

/* Give the finished temporary (closed by SQLite) the destination's mode,
 * sync it, and rename it over the destination: an existing destination is
 * first locked exclusively through SQLite (STOF_ERR_DATABASE when another
 * process holds it), its log checkpointed and its -wal, -shm and -journal
 * removed. On failure the temporary is removed and the destination left
 * as it was. Frees of either way. */
stof_status stof__outfile_commit(const stof_db_sink *sink, stof_outfile *of);

/* Remove the temporary and its side files; free of. */
void stof__outfile_abort(stof_outfile *of);

/* Remove path and its -wal, -shm and -journal files (best effort). */
void stof__unlink_db_files(const char *path);

#endif
