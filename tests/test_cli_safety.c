/*
 * test_cli_safety.c - stof-tune where data could be lost, corrupted or
 * poisoned, or bad input silently accepted (the fleet-trust issue, items
 * 1-4, 5 on the CPU side, 7-11 and 13), without a GPU:
 *   - an output over a database that a process holds open is refused, and
 *     over one with a crashed writer's log it is replaced cleanly;
 *   - import is all or nothing (a corrupt input, an invalid record, a
 *     file-size limit standing in for a full disk);
 *   - a signal leaves no temporary file, and a kill -9's leftovers are
 *     removed by the next run;
 *   - modes are kept, reading writes nothing beside the input, a WAL
 *     database in a read-only directory reads;
 *   - crafted records are refused by merge and import;
 *   - workload files with NUL bytes or no end, a bad budget, a bad
 *     destination, escape sequences in what is printed.
 */
#include <criterion/criterion.h>

#include <dirent.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <sqlite3.h>

#include "cliutil.h"
#include "db.h"
#include "internal.h"
#include "testutil.h"

TestSuite(cli_safety, .init = cli_setup, .fini = cli_teardown,
          .timeout = 120);

/* ------------------------------------------------------------ helpers */

static const fx A[] = {
    {1, "NVIDIA H100", 13000, 0.5, 1, "a", 0, 1, NULL},
    {2, "NVIDIA H100", 13000, 0.6, 1, "a", 0, 2, NULL},
    {3, "NVIDIA H100", 13000, 0.7, 1, "a", 0, 3, NULL},
};
static const fx B[] = {
    {4, "NVIDIA H100", 13000, 0.5, 1, "b", 0, 4, NULL},
    {5, "NVIDIA H100", 13000, 0.5, 1, "b", 0, 5, NULL},
};

static long long sql_int(const char *path, const char *sql)
{
    sqlite3 *c = NULL;
    cr_assert_eq(sqlite3_open_v2(path, &c, SQLITE_OPEN_READONLY, NULL),
                 SQLITE_OK, "%s", path);
    sqlite3_stmt *s = NULL;
    cr_assert_eq(sqlite3_prepare_v2(c, sql, -1, &s, NULL), SQLITE_OK,
                 "%s: %s", sql, sqlite3_errmsg(c));
    cr_assert_eq(sqlite3_step(s), SQLITE_ROW, "%s: %s", sql,
                 sqlite3_errmsg(c));
    long long v = sqlite3_column_int64(s, 0);
    sqlite3_finalize(s);
    sqlite3_close(c);
    return v;
}

static void sql_text(const char *path, const char *sql, char *buf, size_t n)
{
    sqlite3 *c = NULL;
    cr_assert_eq(sqlite3_open_v2(path, &c, SQLITE_OPEN_READONLY, NULL),
                 SQLITE_OK);
    sqlite3_stmt *s = NULL;
    cr_assert_eq(sqlite3_prepare_v2(c, sql, -1, &s, NULL), SQLITE_OK);
    cr_assert_eq(sqlite3_step(s), SQLITE_ROW);
    const unsigned char *t = sqlite3_column_text(s, 0);
    snprintf(buf, n, "%s", t ? (const char *)t : "");
    sqlite3_finalize(s);
    sqlite3_close(c);
}

static void sql_exec(const char *path, const char *sql)
{
    sqlite3 *c = NULL;
    cr_assert_eq(sqlite3_open(path, &c), SQLITE_OK);
    char *e = NULL;
    cr_assert_eq(sqlite3_exec(c, sql, NULL, NULL, &e), SQLITE_OK, "%s: %s",
                 sql, e ? e : "");
    sqlite3_close(c);
}

static void expect_integrity(const char *path)
{
    char ok[64];
    sql_text(path, "PRAGMA integrity_check", ok, sizeof(ok));
    cr_assert_str_eq(ok, "ok", "%s", path);
}

static long long records(const char *path)
{
    return sql_int(path, "SELECT count(*) FROM records");
}

/* The sorted names in tmpdir, as one line. */
static void listing(char *buf, size_t n)
{
    struct dirent **names = NULL;
    int k = scandir(tmpdir, &names, NULL, alphasort);
    cr_assert(k >= 0);
    buf[0] = '\0';
    for (int i = 0; i < k; i++) {
        /* stof-tune's captured output is not a file it wrote. */
        const char *nm = names[i]->d_name;
        size_t len = strlen(buf);
        if (strcmp(nm, "out.txt") && strcmp(nm, "err.txt"))
            snprintf(buf + len, n - len, "%s ", nm);
        free(names[i]);
    }
    free(names);
}

static int has_side_files(const char *path)
{
    char p[1100];
    snprintf(p, sizeof(p), "%s-wal", path);
    int w = exists(p);
    snprintf(p, sizeof(p), "%s-shm", path);
    return w || exists(p);
}

/* A process that opens path in WAL mode, writes, and keeps it open until
 * killed (a serving process); or, with crash set, writes and dies without
 * closing (a crashed writer whose log was never checkpointed). */
static pid_t writer(const char *path, int crash)
{
    int fds[2];
    cr_assert_eq(pipe(fds), 0);
    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) {
        close(fds[0]);
        sqlite3 *c = NULL;
        if (sqlite3_open(path, &c) != SQLITE_OK ||
            sqlite3_exec(c,
                         "PRAGMA journal_mode = WAL;"
                         "PRAGMA wal_autocheckpoint = 0;"
                         "INSERT OR REPLACE INTO misses(key, problem, count,"
                         " first_seen, last_seen) VALUES('live', '{}', 1, 1,"
                         " 1);"
                         "UPDATE records SET hits = hits + 7;",
                         NULL, NULL, NULL) != SQLITE_OK)
            _exit(3);
        if (write(fds[1], "x", 1) != 1)
            _exit(4);
        if (crash)
            _exit(0); /* no close: the log stays as it is */
        for (;;)
            pause();
    }
    close(fds[1]);
    char ch;
    cr_assert_eq(read(fds[0], &ch, 1), 1, "the writer did not start");
    close(fds[0]);
    if (crash) {
        int st;
        waitpid(pid, &st, 0);
        cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    }
    return pid;
}

/* Start stof-tune with args in the background (no shell); returns pid. */
static pid_t spawn(const char *const *args)
{
    const char *exe = getenv("STOF_TUNE");
    cr_assert(exe && *exe);
    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) {
        char *argv[16];
        int n = 0;
        argv[n++] = (char *)exe;
        for (int i = 0; args[i] && n < 15; i++)
            argv[n++] = (char *)args[i];
        argv[n] = NULL;
        if (!freopen("/dev/null", "w", stdout) ||
            !freopen(P("spawn-err.txt"), "w", stderr))
            _exit(5);
        execv(exe, argv);
        _exit(6);
    }
    return pid;
}

static void sleep_ms(int ms)
{
    struct timespec t = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&t, NULL);
}

/* Wait up to 5 s for a temporary output file to appear in tmpdir. */
static void wait_for_tmp(void)
{
    for (int i = 0; i < 500 && !has_tmp_files(); i++)
        sleep_ms(10);
    cr_assert(has_tmp_files(), "no temporary file appeared");
}

/* ------------------------------------------------ 1: live destinations */

Test(cli_safety, merge_onto_a_database_in_use_is_refused)
{
    make_db(P("a.db"), A, 3);
    make_db(P("b.db"), B, 2);
    make_db(P("x.db"), A, 1);
    pid_t w = writer(P("x.db"), 0);
    char before[1024], after[1024];
    listing(before, sizeof(before));
    cr_assert_eq(run("merge %s %s -o %s", P("a.db"), P("b.db"), P("x.db")), 4,
                 "%s", err_buf);
    cr_assert(strstr(err_buf, "open by another process"), "%s", err_buf);
    cr_assert_eq(count_lines(err_buf), 1, "%s", err_buf);
    cr_assert_eq(run("export --db %s -o %s", P("a.db"), P("x.db")), 4, "%s",
                 err_buf);
    listing(after, sizeof(after));
    cr_assert_str_eq(after, before, "files changed beside the live database");
    kill(w, SIGKILL);
    waitpid(w, NULL, 0);
    /* The writer's commits are where it left them. */
    expect_integrity(P("x.db"));
    cr_assert_eq(records(P("x.db")), 1);
    cr_assert_eq(sql_int(P("x.db"), "SELECT count(*) FROM misses WHERE "
                                     "key = 'live'"),
                 1);
}

Test(cli_safety, merge_onto_a_crashed_writers_database_replaces_it_cleanly)
{
    make_db(P("a.db"), A, 3);
    make_db(P("b.db"), B, 2);
    make_db(P("x.db"), A, 1);
    writer(P("x.db"), 1);
    struct stat sb;
    char wal[600];
    snprintf(wal, sizeof(wal), "%s-wal", P("x.db"));
    cr_assert(stat(wal, &sb) == 0 && sb.st_size > 0,
              "the crashed writer left no log");
    cr_assert_eq(run("merge %s %s -o %s", P("a.db"), P("b.db"), P("x.db")), 0,
                 "%s", err_buf);
    cr_assert(!has_side_files(P("x.db")), "a stale log survived");
    expect_integrity(P("x.db"));
    cr_assert_eq(records(P("x.db")), 5);
    cr_assert(!has_tmp_files());
    /* And with export too, after a second crash. */
    writer(P("x.db"), 1);
    cr_assert_eq(run("export --db %s -o %s", P("b.db"), P("x.db")), 0, "%s",
                 err_buf);
    cr_assert(!has_side_files(P("x.db")));
    expect_integrity(P("x.db"));
    cr_assert_eq(records(P("x.db")), 2);
}

/* -------------------------------------------------- 2: all or nothing */

Test(cli_safety, import_is_all_or_nothing)
{
    make_db(P("user.db"), A, 1);
    make_db(P("a.db"), A, 3);
    make_db(P("b.db"), B, 2);
    FILE *f = fopen(P("corrupt.db"), "wb");
    fputs("SQLite format 3", f);
    for (int i = 0; i < 8000; i++)
        fputc(i * 7, f);
    fclose(f);
    cr_assert_eq(run("import %s %s --db %s", P("a.db"), P("corrupt.db"),
                     P("user.db")),
                 4, "%s", err_buf);
    cr_assert_eq(records(P("user.db")), 1, "a.db was imported in part");

    /* An invalid record in the second file: nothing is imported. */
    sql_exec(P("b.db"), "UPDATE records SET time_ms = -1 WHERE rowid = 1");
    cr_assert_eq(run("import %s %s --db %s", P("a.db"), P("b.db"),
                     P("user.db")),
                 4, "%s", err_buf);
    cr_assert(strstr(err_buf, "invalid record"), "%s", err_buf);
    cr_assert(strstr(err_buf, "--drop-invalid"), "%s", err_buf);
    cr_assert_eq(records(P("user.db")), 1);
    cr_assert_eq(run("import %s %s --db %s --drop-invalid", P("a.db"),
                     P("b.db"), P("user.db")),
                 0, "%s", err_buf);
    cr_assert_eq(records(P("user.db")), 4, "a.db's three and b.db's good one");
    expect_integrity(P("user.db"));

    /* A write that fails half-way (the file-size limit stands in for a
     * full disk): nothing is imported. */
    make_db(P("u2.db"), A, 1);
    long long before = records(P("u2.db"));
    static fx big[300];
    for (int i = 0; i < 300; i++)
        big[i] = (fx){100 + i, "NVIDIA H100", 13000, 0.5, 1, "big", 0,
                      (unsigned char)i, NULL};
    make_db(P("big.db"), big, 300);
    struct stat sb;
    cr_assert_eq(stat(P("u2.db"), &sb), 0);
    if (sb.st_size < 32768)
        sb.st_size = 32768; /* the -shm file has 32 KiB */
    /* Blocks of 1 KiB (bash's ulimit -f) just above the current size: the
     * 300 records need far more. */
    const char *exe = getenv("STOF_TUNE");
    char cmd[2048];
    snprintf(cmd, sizeof(cmd),
             "bash -c 'ulimit -f %lld; exec \"$0\" \"$@\"' '%s' import '%s' "
             "--db '%s' >'%s' 2>&1",
             (long long)(sb.st_size / 1024 + 8), exe, P("big.db"), P("u2.db"),
             P("ulimit.txt"));
    int st = system(cmd);
    cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 4, "status %d", st);
    cr_assert_eq(records(P("u2.db")), before, "a failed import left records");
    expect_integrity(P("u2.db"));
}

/* ------------------------------------------------------- 3: signals */

static void kill_merge_and_check(int sig)
{
    make_db(P("a.db"), A, 3);
    make_db(P("x.db"), B, 1);
    /* A live writer on the output makes the merge wait at the end, with
     * its temporary written: the moment a signal is most harmful. */
    pid_t w = writer(P("x.db"), 0);
    const char *args[] = {"merge", P("a.db"), "-o", P("x.db"), NULL};
    pid_t m = spawn(args);
    wait_for_tmp();
    sleep_ms(300);
    kill(m, sig);
    int st;
    waitpid(m, &st, 0);
    cr_assert(WIFSIGNALED(st) && WTERMSIG(st) == sig,
              "stof-tune was not ended by signal %d (status %d)", sig, st);
    cr_assert(!has_tmp_files(), "signal %d left a temporary file", sig);
    kill(w, SIGKILL);
    waitpid(w, NULL, 0);
}

Test(cli_safety, a_signal_leaves_no_temporary_file)
{
    kill_merge_and_check(SIGTERM);
    kill_merge_and_check(SIGINT);
    kill_merge_and_check(SIGHUP);
}

Test(cli_safety, the_next_run_removes_what_kill_9_left)
{
    make_db(P("a.db"), A, 3);
    make_db(P("x.db"), B, 1);
    pid_t w = writer(P("x.db"), 0);
    const char *args[] = {"merge", P("a.db"), "-o", P("x.db"), NULL};
    pid_t m = spawn(args);
    wait_for_tmp();
    sleep_ms(200);
    kill(m, SIGKILL);
    waitpid(m, NULL, 0);
    kill(w, SIGKILL);
    waitpid(w, NULL, 0);
    cr_assert(has_tmp_files(), "kill -9 left nothing to clean (the test is "
                               "not testing)");
    /* Another output's temporaries are not this run's to remove. */
    cr_assert_eq(run("merge %s -o %s", P("a.db"), P("other.db")), 0, "%s",
                 err_buf);
    cr_assert(has_tmp_files());
    cr_assert_eq(run("merge %s -o %s", P("a.db"), P("x.db")), 0, "%s",
                 err_buf);
    cr_assert(strstr(err_buf, "temporary file of a run that was killed"),
              "%s", err_buf);
    cr_assert(!has_tmp_files(), "stale temporaries remain");
    expect_integrity(P("x.db"));
}

Test(cli_safety, a_file_size_limit_fails_cleanly)
{
    fx big[40];
    for (int i = 0; i < 40; i++)
        big[i] = (fx){100 + i, "NVIDIA H100", 13000, 0.5, 1, "big", 0,
                      (unsigned char)i, NULL};
    make_db(P("big.db"), big, 40);
    const char *exe = getenv("STOF_TUNE");
    char cmd[2048];
    snprintf(cmd, sizeof(cmd),
             "bash -c 'ulimit -f 16; exec \"$0\" \"$@\"' '%s' merge '%s' "
             "-o '%s' >'%s' 2>&1",
             exe, P("big.db"), P("out.db"), P("ulimit.txt"));
    int st = system(cmd);
    cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 4, "status %d", st);
    cr_assert(!exists(P("out.db")));
    cr_assert(!has_tmp_files());
}

/* ------------------------------------------ 4, 13: modes and reading */

Test(cli_safety, the_mode_of_a_replaced_file_is_kept)
{
    make_db(P("a.db"), A, 3);
    make_db(P("x.db"), B, 1);
    cr_assert_eq(chmod(P("x.db"), 0640), 0);
    cr_assert_eq(run("merge %s -o %s", P("a.db"), P("x.db")), 0, "%s",
                 err_buf);
    struct stat sb;
    cr_assert_eq(stat(P("x.db"), &sb), 0);
    cr_assert_eq(sb.st_mode & 07777, 0640, "mode %o", sb.st_mode & 07777);

    /* Read-only: refused for a user who may not write it; root may write
     * anything, and then the mode stays read-only. */
    cr_assert_eq(chmod(P("x.db"), 0444), 0);
    int rc = run("merge %s -o %s", P("a.db"), P("x.db"));
    cr_assert_eq(stat(P("x.db"), &sb), 0);
    cr_assert_eq(sb.st_mode & 07777, 0444, "mode %o", sb.st_mode & 07777);
    if (geteuid() != 0) {
        cr_assert_eq(rc, 4, "%s", err_buf);
        cr_assert(strstr(err_buf, "not writable"), "%s", err_buf);
    } else {
        cr_assert_eq(rc, 0, "%s", err_buf);
    }

    /* A new file gets 0666 less the umask. */
    mode_t old = umask(027);
    cr_assert_eq(run("merge %s -o %s", P("a.db"), P("new.db")), 0);
    umask(old);
    cr_assert_eq(stat(P("new.db"), &sb), 0);
    cr_assert_eq(sb.st_mode & 07777, 0640, "mode %o", sb.st_mode & 07777);
}

Test(cli_safety, reading_writes_nothing_beside_the_input)
{
    make_db(P("wal.db"), A, 3); /* a closed WAL database */
    make_db(P("b.db"), B, 2);
    char before[2048], after[2048];
    listing(before, sizeof(before));
    cr_assert_eq(run("ls --db %s", P("wal.db")), 0, "%s", err_buf);
    cr_assert_eq(run("stats --db %s --json", P("wal.db")), 0, "%s", err_buf);
    cr_assert_eq(run("show 00000000000000000000000000000001 --db %s",
                     P("wal.db")),
                 0, "%s", err_buf);
    cr_assert_eq(run("verify --db %s", P("wal.db")), 3, "%s", err_buf);
    listing(after, sizeof(after));
    cr_assert_str_eq(after, before);
    cr_assert_eq(run("merge %s %s -o %s", P("wal.db"), P("b.db"), P("m.db")),
                 0, "%s", err_buf);
    cr_assert(!has_side_files(P("wal.db")) && !has_side_files(P("b.db")));
    cr_assert(!has_side_files(P("m.db")), "the output is not self-contained");

    /* Beside a corrupt file with a WAL header. */
    FILE *f = fopen(P("wal.db"), "r+b");
    cr_assert_not_null(f);
    fseek(f, 300, SEEK_SET);
    for (int i = 0; i < 6000; i++)
        fputc(i * 13, f);
    fclose(f);
    listing(before, sizeof(before));
    int rc = run("ls --db %s", P("wal.db"));
    cr_assert(rc == 4 || rc == 0, "%d %s", rc, err_buf);
    (void)run("merge %s -o %s", P("wal.db"), P("m2.db"));
    listing(after, sizeof(after));
    cr_assert_str_eq(after, before);
}

/* Run stof-tune as an unprivileged user (root bypasses permissions). */
static int run_unprivileged(const char *args)
{
    if (geteuid() != 0)
        return run("%s", args);
    cr_assert_eq(chmod(tmpdir, 0777), 0);
    char wrapped[4096];
    snprintf(wrapped, sizeof(wrapped),
             "--version >/dev/null; setpriv --reuid=65534 --regid=65534 "
             "--clear-groups -- \"$STOF_TUNE\" %s",
             args);
    return run("%s", wrapped);
}

Test(cli_safety, a_wal_database_in_a_read_only_directory_reads)
{
    char dir[600];
    snprintf(dir, sizeof(dir), "%s/ro", tmpdir);
    cr_assert_eq(mkdir(dir, 0755), 0);
    char db[700];
    snprintf(db, sizeof(db), "%s/sys.db", dir);
    make_db(db, A, 3);
    cr_assert_eq(chmod(db, 0444), 0);
    cr_assert_eq(chmod(dir, 0555), 0);
    char args[1024];
    snprintf(args, sizeof(args), "ls --db '%s'", db);
    cr_assert_eq(run_unprivileged(args), 0, "%s", err_buf);
    cr_assert(strstr(out_buf, "3 records"), "%s", out_buf);
    snprintf(args, sizeof(args), "stats --db '%s'", db);
    cr_assert_eq(run_unprivileged(args), 0, "%s", err_buf);
    snprintf(args, sizeof(args), "export --db '%s' -o '%s/out.db'", db,
             tmpdir);
    cr_assert_eq(run_unprivileged(args), 0, "%s", err_buf);
    cr_assert_eq(records(P("out.db")), 3);
    cr_assert(!has_side_files(db));
    cr_assert_eq(chmod(dir, 0755), 0);
}

/* ------------------------------------------------ 5: crafted records */

Test(cli_safety, merge_refuses_crafted_records)
{
    make_db(P("a.db"), A, 3);
    make_db(P("evil.db"), B, 2);
    /* A record that claims to be faster than anything, verified, with a
     * different cubin and a content hash made to match. */
    stof_context *ctx = ctx_new();
    stof_db *db = NULL;
    cr_assert_eq(stof__db_open(STOF_DB_SINK(ctx), P("evil.db"), NULL, &db), STOF_OK);
    stof_db_record r;
    fx_record(&A[0], &r);
    unsigned char junk[64];
    memset(junk, 0xcc, sizeof(junk));
    r.cubin = junk;
    r.cubin_size = sizeof(junk);
    r.time_ms = -1.0;
    cr_assert_eq(stof__db_store(db, &r, 1, 0), STOF_OK);
    stof__db_close(&db);
    stof_close(&ctx);
    cr_assert_eq(run("merge %s %s -o %s", P("a.db"), P("evil.db"), P("m.db")),
                 4, "%s", err_buf);
    cr_assert(strstr(err_buf, "time_ms"), "%s", err_buf);
    cr_assert(!exists(P("m.db")));
    cr_assert_eq(run("merge %s %s -o %s --drop-invalid --json", P("a.db"),
                     P("evil.db"), P("m.db")),
                 0, "%s", err_buf);
    cr_assert(strstr(out_buf, "\"invalid_records\":1"), "%s", out_buf);
    /* The honest record of key 1 survived. */
    char h[64];
    sql_text(P("m.db"),
             "SELECT hex(substr(cubin, 1, 2)) FROM records WHERE key = "
             "'00000000000000000000000000000001'",
             h, sizeof(h));
    cr_assert_str_eq(h, "0101");

    /* A field edited in place: the hash no longer matches. */
    sql_exec(P("evil.db"), "UPDATE records SET time_ms = 0.001");
    cr_assert_eq(run("import %s --db %s", P("evil.db"), P("a.db")), 4);
    cr_assert(strstr(err_buf, "content hash"), "%s", err_buf);
    /* A key too long to be checked as it is stored. */
    make_db(P("long.db"), B, 1);
    sql_exec(P("long.db"), "UPDATE records SET key = key || 'ff'");
    cr_assert_eq(run("import %s --db %s", P("long.db"), P("a.db")), 4);
    cr_assert(strstr(err_buf, "wrong type or is too long"), "%s", err_buf);
}

/* Misses that stof__db_record_miss could not have written (a BLOB key, a
 * NUL inside a key or problem, a negative count) are left out of a merge,
 * and said so; the honest one is merged, and the result lists in full. */
Test(cli_safety, merge_leaves_out_malformed_misses)
{
    make_db(P("a.db"), A, 1);
    make_db(P("b.db"), B, 1);
    sql_exec(P("b.db"),
             "INSERT INTO misses(key, problem, mask, count, first_seen,"
             " last_seen) VALUES ('good', '{}', NULL, 2, 1, 1),"
             " (x'0102', '{}', NULL, 1, 1, 1),"
             " (CAST(x'41420043' AS TEXT), '{}', NULL, 1, 1, 1),"
             " ('nulproblem', CAST(x'7b00' AS TEXT), NULL, 1, 1, 1),"
             " ('negative', '{}', NULL, -5, 1, 1),"
             " ('blobproblem', x'ff00', NULL, 1, 1, 1)");
    cr_assert_eq(run("merge %s %s -o %s", P("a.db"), P("b.db"), P("m.db")), 0,
                 "%s", err_buf);
    cr_assert(strstr(err_buf, "5 invalid miss row(s) left out"), "%s",
              err_buf);
    cr_assert_eq(sql_int(P("m.db"), "SELECT count(*) FROM misses"), 1);
    char k[64];
    sql_text(P("m.db"), "SELECT key FROM misses", k, sizeof(k));
    cr_assert_str_eq(k, "good");
}

/* ------------------------------------------------------ 7-11: input */

Test(cli_safety, workloads_with_nul_bytes_or_no_end_are_refused)
{
    FILE *f = fopen(P("nul.workload"), "wb");
    fputs("mask causal\nshape 1x1x64x64\n", f);
    fputc('\0', f);
    fputs("mask sliding:64\n", f);
    fclose(f);
    cr_assert_eq(run("tune %s", P("nul.workload")), 1, "%s", err_buf);
    cr_assert(strstr(err_buf, ":3: not a text file"), "%s", err_buf);
    cr_assert_eq(count_lines(err_buf), 1);

    time_t t0 = time(NULL);
    cr_assert_eq(run("tune /dev/zero"), 1, "%s", err_buf);
    cr_assert(strstr(err_buf, "not a text file"), "%s", err_buf);
    cr_assert_leq(time(NULL) - t0, 5);

    f = fopen(P("huge.workload"), "wb");
    for (int i = 0; i < 300000; i++)
        fputs("# a comment line\n", f);
    fclose(f);
    cr_assert_eq(run("tune %s", P("huge.workload")), 1, "%s", err_buf);
    cr_assert(strstr(err_buf, "larger than 4 MiB"), "%s", err_buf);
}

Test(cli_safety, tune_checks_the_gpu_before_building_masks)
{
    FILE *f = fopen(P("long.workload"), "w");
    fputs("mask sliding:4096\nmask causal\nshape 1x8x1048576x128\n"
          "shape 1x8x524288x128\n",
          f);
    fclose(f);
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    int rc = run("tune %s", P("long.workload"));
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double s = (double)(t1.tv_sec - t0.tv_sec) +
               1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
    cr_assert_eq(rc, 3, "%s", err_buf);
    cr_assert(strstr(err_buf, "no GPU found"), "%s", err_buf);
    cr_assert_lt(s, 5.0, "%.1f s: masks were built before the GPU check", s);
    /* A bad spec is still found first, with its line. */
    f = fopen(P("bad.workload"), "w");
    fputs("shape 1x1x64x64\nmask causal\nmask slidin:4\n", f);
    fclose(f);
    cr_assert_eq(run("tune %s", P("bad.workload")), 1);
    cr_assert(strstr(err_buf, "bad.workload:3"), "%s", err_buf);
}

Test(cli_safety, each_failure_has_its_exit_code)
{
    static const char *const bad[] = {"nan", "inf", "-1", "1e99", "x", ""};
    for (size_t i = 0; i < sizeof(bad) / sizeof(*bad); i++) {
        cr_assert_eq(run("tune --mask causal --shape 1x1x64x64 --budget '%s'",
                         bad[i]),
                     2, "--budget %s: %s", bad[i], err_buf);
        cr_assert(strstr(err_buf, "budget"), "%s", err_buf);
    }
    cr_assert_eq(run("tune --mask causal --shape 1x1x64x64 --devices 0,0"), 2,
                 "%s", err_buf);
    cr_assert_eq(run("tune --mask causal --shape 1x1x64x64 --devices x"), 2,
                 "%s", err_buf);
    cr_assert_eq(run("tune --mask causal --shape 1x1x64x64 --devices all"), 3,
                 "%s", err_buf);
    cr_assert_eq(run("pending --db %s", P("none.db")), 4, "%s", err_buf);
}

Test(cli_safety, bad_destinations_fail_before_any_work)
{
    make_db(P("a.db"), A, 3);
    cr_assert_eq(mkdir(P("dir.db"), 0755), 0);
    cr_assert_eq(run("merge %s -o %s", P("a.db"), P("dir.db")), 4, "%s",
                 err_buf);
    cr_assert(strstr(err_buf, "is a directory"), "%s", err_buf);
    cr_assert_eq(run("export --db %s -o %s/", P("a.db"), tmpdir), 4, "%s",
                 err_buf);
    cr_assert_eq(run("merge %s -o /nonexistent-stof-dir/x.db", P("a.db")), 4,
                 "%s", err_buf);
    cr_assert(strstr(err_buf, "cannot create a file in"), "%s", err_buf);
    FILE *f = fopen(P("notes.txt"), "w");
    fputs("precious\n", f);
    fclose(f);
    cr_assert_eq(run("merge %s -o %s", P("a.db"), P("notes.txt")), 4, "%s",
                 err_buf);
    cr_assert(strstr(err_buf, "not a stof tuning database"), "%s", err_buf);
    char text[64] = "";
    f = fopen(P("notes.txt"), "r");
    cr_assert(fgets(text, sizeof(text), f));
    fclose(f);
    cr_assert_str_eq(text, "precious\n");
    cr_assert(!has_tmp_files());
    /* An unwritable directory (as a user that cannot write there). */
    char dir[600];
    snprintf(dir, sizeof(dir), "%s/locked", tmpdir);
    cr_assert_eq(mkdir(dir, 0555), 0);
    char args[1200];
    snprintf(args, sizeof(args), "merge '%s' -o '%s/x.db'", P("a.db"), dir);
    cr_assert_eq(run_unprivileged(args), 4, "%s", err_buf);
    cr_assert(strstr(err_buf, "cannot create a file in"), "%s", err_buf);
}

static int has_raw_controls(const char *s)
{
    for (; *s; s++)
        if ((unsigned char)*s < 0x20 && *s != '\n')
            return 1;
    return 0;
}

Test(cli_safety, what_is_printed_is_escaped)
{
    make_db(P("a.db"), A, 2);
    /* Escape sequences and invalid UTF-8 in stored fields. */
    sql_exec(P("a.db"),
             "UPDATE records SET host = 'h' || char(27) || '[2J' || "
             "char(7) || 'x', device_name = 'GPU' || char(8238) || 'evil' "
             "WHERE rowid = 1;"
             "UPDATE records SET host = CAST(x'ff41c0' AS TEXT) "
             "WHERE rowid = 2;");
    cr_assert_eq(run("ls --db %s", P("a.db")), 0, "%s", err_buf);
    cr_assert(!has_raw_controls(out_buf), "%s", out_buf);
    cr_assert(!strstr(out_buf, "\xe2\x80\xae"), "a bidi override reached "
                                                "the terminal");
    cr_assert(strstr(out_buf, "INVALID"), "%s", out_buf);
    cr_assert_eq(run("show 00000000000000000000000000000001 --db %s",
                     P("a.db")),
                 0);
    cr_assert(!has_raw_controls(out_buf), "%s", out_buf);
    cr_assert(strstr(out_buf, "\\x1b[2J"), "%s", out_buf);
    cr_assert_eq(run("ls --db %s --json", P("a.db")), 0);
    cr_assert(!has_raw_controls(out_buf), "%s", out_buf);
    cr_assert(strstr(out_buf, "\\u001b[2J"), "%s", out_buf);
    cr_assert(strstr(out_buf, "\\ufffd"), "invalid UTF-8 reached JSON: %s",
              out_buf);
    /* The document parses (python3 is part of the build). */
    FILE *f = fopen(P("ls.json"), "w");
    fputs(out_buf, f);
    fclose(f);
    char cmd[700];
    snprintf(cmd, sizeof(cmd),
             "python3 -c 'import json,sys; json.load(open(sys.argv[1]))' "
             "'%s'",
             P("ls.json"));
    cr_assert_eq(system(cmd), 0, "ls --json is not valid JSON");

    /* From a workload file, into an error message. */
    f = fopen(P("esc.workload"), "w");
    fputs("shape 1x1x64x64\nmask causal\033]0;pwned\007\n", f);
    fclose(f);
    cr_assert_eq(run("tune %s", P("esc.workload")), 1);
    cr_assert(!has_raw_controls(err_buf), "%s", err_buf);
    cr_assert(strstr(err_buf, "\\x1b]0;pwned\\x07"), "%s", err_buf);
}
