/*
 * db_outfile.c - replacing a database file safely (db_outfile.h).
 *
 * Why each step. A rename alone is atomic for the file's name, but a
 * SQLite database is up to four files: after `rename(tmp, out)` an old
 * `out-wal` would be replayed onto the new file (corrupting it), and a
 * process that had `out` open would go on writing to the orphaned old
 * file. So the old file is opened through SQLite and locked exclusively
 * (in WAL mode every open connection holds a shared lock, so this fails
 * while anyone has it open), its log folded in and removed, and only then
 * is the new file renamed over it, with the lock still held.
 *
 * Temporaries are named OUT.tmp-stof-PID-XXXXXX and hold flock(LOCK_EX)
 * for their whole life. A temporary whose lock can be taken and whose PID
 * is gone belongs to a killed run: the next run for the same output
 * removes it (with its -wal and -shm).
 */
#include "db_outfile.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <sqlite3.h>

#define STOF_APPLICATION_ID 0x53544f46u /* "STOF", as in db.c */
#define TMP_MARK ".tmp-stof-"

void stof__unlink_db_files(const char *path)
{
    static const char *const sfx[] = {"-wal", "-shm", "-journal", ""};
    size_t n = strlen(path) + 16;
    char *p = malloc(n);
    if (!p)
        return;
    /* The side files first: a crash in between leaves no log without its
     * database. */
    for (size_t i = 0; i < sizeof(sfx) / sizeof(*sfx); i++) {
        snprintf(p, n, "%s%s", path, sfx[i]);
        (void)unlink(p);
    }
    free(p);
}

static void note(const stof_dbt_opts *o, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;
static void note(const stof_dbt_opts *o, const char *fmt, ...)
{
    if (!o || !o->on_note)
        return;
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    o->on_note(o->user, msg);
}

/* The directory part of path ("." when none); caller frees. */
static char *dir_of(const char *path)
{
    char *copy = strdup(path);
    if (!copy)
        return NULL;
    char *d = strdup(dirname(copy));
    free(copy);
    return d;
}

/* 1 when the file at path is a stof tuning database by its header (the
 * application id at byte 68), or empty. */
static int is_stof_file(const char *path, off_t size)
{
    if (size == 0)
        return 1;
    unsigned char h[100];
    FILE *f = fopen(path, "rb");
    if (!f)
        return 0;
    size_t n = fread(h, 1, sizeof(h), f);
    fclose(f);
    if (n != sizeof(h) || memcmp(h, "SQLite format 3", 16) != 0)
        return 0;
    const unsigned id = (unsigned)h[68] << 24 | (unsigned)h[69] << 16 |
                        (unsigned)h[70] << 8 | (unsigned)h[71];
    return id == STOF_APPLICATION_ID;
}

/* Remove the temporaries of killed runs for the output named `base` in
 * dir: OUT.tmp-stof-PID-XXXXXX whose PID is gone and whose lock nobody
 * holds. */
static void remove_stale(const char *dir, const char *base,
                         const stof_dbt_opts *opts)
{
    DIR *d = opendir(dir);
    if (!d)
        return;
    size_t bl = strlen(base), ml = strlen(TMP_MARK);
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        const char *name = e->d_name;
        size_t nl = strlen(name);
        if (nl <= bl + ml || strncmp(name, base, bl) != 0 ||
            strncmp(name + bl, TMP_MARK, ml) != 0)
            continue;
        const char *rest = name + bl + ml;
        char *end = NULL;
        long pid = strtol(rest, &end, 10);
        /* Side files go with their database below; only the base name
         * "PID-XXXXXX" is considered. */
        if (pid <= 0 || !end || *end != '-' || strchr(end + 1, '-'))
            continue;
        if (kill((pid_t)pid, 0) == 0 || errno != ESRCH)
            continue; /* that process lives (or is not ours to judge) */
        size_t pn = strlen(dir) + nl + 2;
        char *p = malloc(pn);
        if (!p)
            break;
        snprintf(p, pn, "%s/%s", dir, name);
        int fd = open(p, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
        if (fd >= 0 && flock(fd, LOCK_EX | LOCK_NB) == 0) {
            stof__unlink_db_files(p);
            note(opts,
                 "removed %s: the temporary file of a run that was killed "
                 "(process %ld)",
                 p, pid);
        }
        if (fd >= 0)
            close(fd);
        free(p);
    }
    closedir(d);
}

static stof_status check_destination(const stof_db_sink *sink, const char *path,
                                     stof_outfile *of)
{
    struct stat sb;
    if (stat(path, &sb) != 0) {
        if (errno != ENOENT)
            return stof__dbs_fail(sink, STOF_ERR_IO, "%s: %s", path,
                              strerror(errno));
        mode_t um = umask(0);
        umask(um);
        of->mode = 0666 & ~um;
        return STOF_OK;
    }
    if (S_ISDIR(sb.st_mode))
        return stof__dbs_fail(sink, STOF_ERR_DATABASE,
                          "%s is a directory: give the output file's name",
                          path);
    if (!S_ISREG(sb.st_mode))
        return stof__dbs_fail(sink, STOF_ERR_DATABASE,
                          "%s exists and is not a regular file: not replaced",
                          path);
    if (access(path, W_OK) != 0)
        return stof__dbs_fail(sink, STOF_ERR_DATABASE,
                          "%s is not writable (mode %04o): not replaced; "
                          "change its mode or write elsewhere",
                          path, (unsigned)(sb.st_mode & 07777));
    if (!is_stof_file(path, sb.st_size))
        return stof__dbs_fail(sink, STOF_ERR_DATABASE,
                          "%s exists and is not a stof tuning database: not "
                          "replaced; remove it or choose another name",
                          path);
    of->existed = 1;
    of->mode = sb.st_mode & 07777;
    of->uid = sb.st_uid;
    of->gid = sb.st_gid;
    return STOF_OK;
}

stof_status stof__outfile_begin(const stof_db_sink *sink, const char *path,
                                const stof_dbt_opts *opts, stof_outfile *of)
{
    memset(of, 0, sizeof(*of));
    of->fd = -1;
    of->opts = opts;
    stof_status st = check_destination(sink, path, of);
    if (st != STOF_OK)
        return st;
    char *dir = dir_of(path), *copy = strdup(path);
    of->path = strdup(path);
    size_t tn = strlen(path) + 64;
    of->tmp = malloc(tn);
    if (!dir || !copy || !of->path || !of->tmp) {
        free(dir);
        free(copy);
        stof__outfile_abort(of);
        return stof__dbs_fail(sink, STOF_ERR_OUT_OF_MEMORY, "out of memory");
    }
    remove_stale(dir, basename(copy), opts);
    snprintf(of->tmp, tn, "%s" TMP_MARK "%ld-XXXXXX", path, (long)getpid());
    of->fd = mkstemp(of->tmp);
    if (of->fd < 0) {
        st = stof__dbs_fail(sink, STOF_ERR_IO, "cannot create a file in %s: %s",
                        dir, strerror(errno));
        free(of->tmp);
        of->tmp = NULL;
    } else {
        (void)fcntl(of->fd, F_SETFD, FD_CLOEXEC);
        if (flock(of->fd, LOCK_EX) != 0)
            note(opts, "%s: cannot lock it (%s)", of->tmp, strerror(errno));
        if (opts && opts->on_tmp)
            opts->on_tmp(opts->user, of->tmp, 1);
    }
    free(dir);
    free(copy);
    if (st != STOF_OK)
        stof__outfile_abort(of);
    return st;
}

void stof__outfile_abort(stof_outfile *of)
{
    if (of->tmp) {
        stof__unlink_db_files(of->tmp);
        if (of->opts && of->opts->on_tmp)
            of->opts->on_tmp(of->opts->user, of->tmp, 0);
    }
    if (of->fd >= 0)
        close(of->fd);
    free(of->tmp);
    free(of->path);
    memset(of, 0, sizeof(*of));
    of->fd = -1;
}

static int exec0(sqlite3 *c, const char *sql)
{
    return sqlite3_exec(c, sql, NULL, NULL, NULL);
}

/* Lock the existing destination exclusively through SQLite, fold in and
 * remove its log. *held is the connection that keeps the lock (close it
 * after the rename). */
static stof_status lock_old(const stof_db_sink *sink, const char *path,
                            sqlite3 **held)
{
    *held = NULL;
    struct stat sb;
    if (stat(path, &sb) != 0 || sb.st_size == 0)
        return STOF_OK; /* gone or empty: nothing can be replayed onto it */
    /* A short wait rides over a reader's brief transaction; a process that
     * keeps the database open holds its lock for good. */
    sqlite3 *c = NULL;
    int rc = stof__db_connect(path, "", SQLITE_OPEN_READWRITE, 1000, &c);
    if (rc == SQLITE_OK)
        rc = exec0(c, "PRAGMA locking_mode = EXCLUSIVE");
    if (rc == SQLITE_OK)
        rc = exec0(c, "BEGIN EXCLUSIVE");
    if (rc == SQLITE_OK)
        rc = exec0(c, "COMMIT");
    if ((rc & 0xff) == SQLITE_BUSY || (rc & 0xff) == SQLITE_LOCKED) {
        sqlite3_close(c);
        return stof__dbs_fail(sink, STOF_ERR_DATABASE,
                          "%s is open by another process (a program using "
                          "it as its tuning database, or another "
                          "stof-tune): not replaced; stop it or write "
                          "elsewhere",
                          path);
    }
    if (rc == SQLITE_OK)
        rc = exec0(c, "PRAGMA journal_mode = DELETE");
    if (rc != SQLITE_OK) {
        stof_status st = stof__dbs_fail(sink, STOF_ERR_DATABASE,
                                    "%s: cannot take it over for "
                                    "replacement: %s (SQLite error %d)",
                                    path, sqlite3_errmsg(c), rc);
        sqlite3_close(c);
        return st;
    }
    *held = c;
    return STOF_OK;
}

/* fsync the directory holding path, so the rename survives a crash. */
static void sync_dir(const char *path)
{
    char *dir = dir_of(path);
    if (!dir)
        return;
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd >= 0) {
        (void)fsync(fd);
        close(fd);
    }
    free(dir);
}

stof_status stof__outfile_commit(const stof_db_sink *sink, stof_outfile *of)
{
    stof_status st = STOF_OK;
    if (fchmod(of->fd, of->mode) != 0)
        st = stof__dbs_fail(sink, STOF_ERR_IO, "%s: cannot set its mode: %s",
                        of->tmp, strerror(errno));
    if (st == STOF_OK && of->existed &&
        (of->uid != geteuid() || of->gid != getegid()) &&
        fchown(of->fd, of->uid, of->gid) != 0)
        note(of->opts,
             "%s: the new file is owned by this user, not by the old "
             "file's owner (%s)",
             of->path, strerror(errno));
    if (st == STOF_OK && fsync(of->fd) != 0)
        st = stof__dbs_fail(sink, STOF_ERR_IO, "%s: cannot sync it: %s", of->tmp,
                        strerror(errno));
    sqlite3 *held = NULL;
    if (st == STOF_OK)
        st = lock_old(sink, of->path, &held);
    if (st == STOF_OK) {
        /* The old file is ours alone now: whatever journal is beside it
         * is stale, and must not meet the new file. */
        size_t n = strlen(of->path) + 16;
        char *p = malloc(n);
        static const char *const sfx[] = {"-wal", "-shm", "-journal"};
        for (size_t i = 0; p && i < sizeof(sfx) / sizeof(*sfx); i++) {
            snprintf(p, n, "%s%s", of->path, sfx[i]);
            (void)unlink(p);
        }
        free(p);
        if (rename(of->tmp, of->path) != 0)
            st = stof__dbs_fail(sink, STOF_ERR_IO, "%s: cannot rename %s to it: %s",
                            of->path, of->tmp, strerror(errno));
    }
    sqlite3_close(held); /* on the old, now unlinked, file */
    if (st != STOF_OK) {
        stof__outfile_abort(of);
        return st;
    }
    sync_dir(of->path);
    if (of->opts && of->opts->on_tmp)
        of->opts->on_tmp(of->opts->user, of->tmp, 0);
    free(of->tmp);
    of->tmp = NULL;
    close(of->fd);
    of->fd = -1;
    free(of->path);
    of->path = NULL;
    return STOF_OK;
}
