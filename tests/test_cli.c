/*
 * test_cli.c - the stof-tune command line, without a GPU: every command's
 * --help, bad inputs (one line, the right exit code, no partial output),
 * export -> import round trips, merge commutativity and idempotence, and
 * conflict reports. Fixture databases are written here through the db
 * module (stof__db_store), so no GPU is needed. The binary comes from
 * $STOF_TUNE (set by tests/meson.build).
 */
#include <criterion/criterion.h>
#include <jansson.h>

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <sqlite3.h>

#include "db.h"
#include "internal.h"
#include "cliutil.h"
#include "testutil.h"

TestSuite(cli, .init = cli_setup, .fini = cli_teardown, .timeout = 120);

/* Add hits (lookups) and misses to a database. */
static void add_hits(const char *path, int key, int n)
{
    stof_context *ctx = ctx_new();
    stof_db *db = NULL;
    cr_assert_eq(stof__db_open(STOF_DB_SINK(ctx), path, NULL, &db), STOF_OK);
    char k[33];
    snprintf(k, sizeof(k), "%032x", key);
    for (int i = 0; i < n; i++) {
        stof_db_record r;
        cr_assert_eq(stof__db_lookup(db, k, &r), STOF_OK);
        stof__db_record_clear(&r);
    }
    stof__db_close(&db);
    stof_close(&ctx);
}

static void add_miss(const char *path, const char *key, int times)
{
    stof_context *ctx = ctx_new();
    stof_db *db = NULL;
    cr_assert_eq(stof__db_open(STOF_DB_SINK(ctx), path, NULL, &db), STOF_OK);
    uint64_t bits[4] = {1, 2, 3, 4};
    for (int i = 0; i < times; i++)
        cr_assert_eq(stof__db_record_miss(db, key,
                                          "{\"op\":\"attention\",\"batch\":1}",
                                          bits, sizeof(bits)),
                     STOF_OK);
    stof__db_close(&db);
    stof_close(&ctx);
}

/* Everything a database holds, as text: records (every column, blobs in
 * hex, ordered by key) then misses without their time stamps. */
static char *dump(const char *path)
{
    sqlite3 *c = NULL;
    cr_assert_eq(sqlite3_open_v2(path, &c, SQLITE_OPEN_READONLY, NULL),
                 SQLITE_OK);
    size_t cap = 1 << 16, len = 0;
    char *s = malloc(cap);
    s[0] = '\0';
    static const char *const q[] = {
        "SELECT * FROM records ORDER BY key",
        "SELECT key, problem, mask, count FROM misses ORDER BY key"};
    for (int t = 0; t < 2; t++) {
        sqlite3_stmt *st = NULL;
        cr_assert_eq(sqlite3_prepare_v2(c, q[t], -1, &st, NULL), SQLITE_OK);
        while (sqlite3_step(st) == SQLITE_ROW) {
            for (int i = 0; i < sqlite3_column_count(st); i++) {
                char cell[1024];
                if (sqlite3_column_type(st, i) == SQLITE_BLOB) {
                    const unsigned char *b = sqlite3_column_blob(st, i);
                    int n = sqlite3_column_bytes(st, i), j = 0;
                    for (int x = 0; x < n && j < 1000; x++)
                        j += snprintf(cell + j, sizeof(cell) - (size_t)j,
                                      "%02x", b[x]);
                    cell[j] = '\0';
                } else {
                    const unsigned char *v = sqlite3_column_text(st, i);
                    snprintf(cell, sizeof(cell), "%s", v ? (const char *)v
                                                         : "NULL");
                }
                size_t need = strlen(cell) + 2;
                if (len + need + 1 > cap) {
                    cap = 2 * (cap + need);
                    s = realloc(s, cap);
                }
                len += (size_t)sprintf(s + len, "%s|", cell);
            }
            s[len++] = '\n';
            s[len] = '\0';
        }
        sqlite3_finalize(st);
        if (len + 8 > cap)
            s = realloc(s, cap += 16);
        len += (size_t)sprintf(s + len, "--\n");
    }
    sqlite3_close(c);
    return s;
}

static int64_t count_rows(const char *path, const char *table)
{
    sqlite3 *c = NULL;
    cr_assert_eq(sqlite3_open_v2(path, &c, SQLITE_OPEN_READONLY, NULL),
                 SQLITE_OK);
    char sql[128];
    snprintf(sql, sizeof(sql), "SELECT count(*) FROM %s", table);
    sqlite3_stmt *st = NULL;
    cr_assert_eq(sqlite3_prepare_v2(c, sql, -1, &st, NULL), SQLITE_OK);
    cr_assert_eq(sqlite3_step(st), SQLITE_ROW);
    int64_t n = sqlite3_column_int64(st, 0);
    sqlite3_finalize(st);
    sqlite3_close(c);
    return n;
}

/* Three overlapping databases from three hosts. Key 1 differs everywhere
 * (B's is fastest); key 2: A verified and slow, C unverified and fast (A
 * wins); key 3: A and B hold the same time, different cubins (a tie);
 * keys 4, 5, 6: one each; key 7: the same record in A and C. */
static void make_fleet(void)
{
    const fx a[] = {
        {1, "NVIDIA H100", 13000, 0.30, 1, "a", 0, 0xa1, NULL},
        {2, "NVIDIA H100", 13000, 0.50, 1, "a", 0, 0xa2, NULL},
        {3, "NVIDIA H100", 13000, 0.20, 1, "a", 0, 0xa3, NULL},
        {4, "NVIDIA H100", 13000, 0.10, 1, "a", 0, 0xa4, NULL},
        {7, "NVIDIA H100", 13000, 0.70, 1, "x", 0, 0x77, NULL},
    };
    const fx b[] = {
        {1, "NVIDIA H100", 13000, 0.25, 1, "b", 0, 0xb1, NULL},
        {3, "NVIDIA H100", 13000, 0.20, 1, "b", 0, 0xb3, NULL},
        {5, "NVIDIA H200", 13000, 0.15, 1, "b", 0, 0xb5, NULL},
    };
    const fx c[] = {
        {1, "NVIDIA H100", 13000, 0.40, 1, "c", 0, 0xc1, NULL},
        {2, "NVIDIA H100", 13000, 0.10, 0, "c", 0, 0xc2, NULL},
        {6, "NVIDIA H200", 12080, 0.12, 1, "c", 0, 0xc6, NULL},
        {7, "NVIDIA H100", 13000, 0.70, 1, "x", 0, 0x77, NULL},
    };
    make_db(P("a.db"), a, 5);
    make_db(P("b.db"), b, 3);
    make_db(P("c.db"), c, 4);
    add_hits(P("a.db"), 1, 3);
    add_hits(P("c.db"), 1, 5);
    add_miss(P("a.db"), "00000000000000000000000000000099", 2);
    add_miss(P("b.db"), "00000000000000000000000000000099", 4);
    add_miss(P("c.db"), "00000000000000000000000000000098", 1);
    /* A miss that C answers with a record: dropped from merges. */
    add_miss(P("b.db"), "00000000000000000000000000000006", 1);
}

static int gpu_present(void)
{
    stof_settings s;
    stof_default_settings(&s);
    s.user_db = "";
    s.require_device = 1;
    stof_context *ctx = NULL;
    stof_status st = stof_open(&ctx, &s);
    stof_close(&ctx);
    return st == STOF_OK;
}

/* -------------------------------------------------------------- help */

static const char *const commands[] = {"tune",   "pending", "ls",
                                       "show",   "stats",   "export",
                                       "import", "merge",   "verify", "gc",
                                       "doctor", "show-mask", "hf-workload"};

Test(cli, help_for_every_command)
{
    cr_assert_eq(run("--help"), 0);
    cr_assert(strstr(out_buf, "usage: stof-tune"));
    cr_assert(strstr(out_buf, "exit status"));
    for (size_t i = 0; i < sizeof(commands) / sizeof(*commands); i++) {
        cr_assert_eq(run("%s --help", commands[i]), 0, "%s --help: %s",
                     commands[i], err_buf);
        char want[64];
        snprintf(want, sizeof(want), "usage: stof-tune %s", commands[i]);
        cr_assert(strstr(out_buf, want), "%s --help printed: %s", commands[i],
                  out_buf);
        cr_assert(strstr(out_buf, "3 no GPU found"), "%s: exit codes",
                  commands[i]);
        cr_assert_eq(run("help %s", commands[i]), 0);
        cr_assert(strstr(out_buf, want));
    }
    cr_assert_eq(run("--version"), 0);
    cr_assert(strstr(out_buf, stof_version_string()));
}

/* doctor: the libraries, GPUs, database and settings in use, whatever
 * the host has (exit 0); --json is one parsable document whose fields
 * follow the environment. */
Test(cli, doctor_reports_what_the_host_has)
{
    const fx recs[] = {{1, "NVIDIA H100", 13000, 0.3, 1, "a", 0, 1, NULL},
                       {2, "NVIDIA H100", 13000, 0.4, 0, "a", 0, 2, NULL}};
    make_db(P("d.db"), recs, 2);
    cr_assert_eq(run("doctor"), 0, "%s", err_buf);
    cr_assert(strstr(out_buf, "libcuda"), "%s", out_buf);
    cr_assert(strstr(out_buf, stof_version_string()), "%s", out_buf);
    cr_assert_eq(run("doctor --json --db %s", P("d.db")), 0, "%s", err_buf);
    json_error_t je;
    json_t *doc = json_loads(out_buf, 0, &je);
    cr_assert(doc, "not JSON (%s): %s", je.text, out_buf);
    cr_expect_str_eq(json_string_value(json_object_get(
                         json_object_get(doc, "stof"), "version")),
                     stof_version_string());
    json_t *libs = json_object_get(doc, "libraries");
    cr_expect(json_is_boolean(json_object_get(
        json_object_get(libs, "libcuda"), "loaded")));
    cr_expect(json_is_array(json_object_get(doc, "devices")));
    json_t *db = json_array_get(json_object_get(doc, "databases"), 0);
    cr_expect_str_eq(json_string_value(json_object_get(db, "path_from")),
                     "--db");
    cr_expect_eq(json_integer_value(json_object_get(db, "records")), 2);
    cr_expect_eq(json_integer_value(json_object_get(db, "schema")),
                 STOF_DB_SCHEMA_VERSION);
    json_decref(doc);
    /* Told to use no driver and a mode that does not exist: it says so. */
    cr_assert_eq(run("doctor --json --db %s", P("missing.db")), 0);
    setenv("STOF_LIBCUDA", "none", 1);
    setenv("STOF_TUNING_MODE", "bogus", 1);
    const int rc = run("doctor --json --db %s", P("missing.db"));
    unsetenv("STOF_LIBCUDA");
    unsetenv("STOF_TUNING_MODE");
    cr_assert_eq(rc, 0, "%s", err_buf);
    doc = json_loads(out_buf, 0, &je);
    cr_assert(doc, "not JSON (%s): %s", je.text, out_buf);
    json_t *cuda = json_object_get(json_object_get(doc, "libraries"),
                                   "libcuda");
    cr_expect(json_is_false(json_object_get(cuda, "loaded")));
    cr_expect(strstr(json_string_value(json_object_get(cuda, "chosen_by")),
                     "$STOF_LIBCUDA=none"));
    cr_expect_eq(json_array_size(json_object_get(doc, "devices")), 0);
    cr_expect(strstr(json_string_value(json_object_get(doc, "tuning_mode")),
                     "INVALID"));
    cr_expect(json_is_false(json_object_get(
        json_array_get(json_object_get(doc, "databases"), 0), "exists")));
    cr_expect(!exists(P("missing.db")), "doctor created the database");
    json_decref(doc);
}

/* show-mask: tile counts as the formats count them, --json, the picture
 * written whole (a PNG), and bad sizes, tiles and pixels refused. */
Test(cli, show_mask_counts_tiles_and_draws)
{
    cr_assert_eq(run("show-mask causal 256 --tile 64x64"), 0, "%s", err_buf);
    /* 4 x 4 tiles of 64: 4 diagonal (partial), 6 below (full), 6 empty. */
    cr_assert(strstr(out_buf, "6 full, 4 partial, 6 empty"), "%s", out_buf);
    cr_assert_eq(run("show-mask bigbird:64:3:2:3:1 1000x2000 --png %s --json",
                     P("m.png")),
                 0, "%s", err_buf);
    json_error_t je;
    json_t *doc = json_loads(out_buf, 0, &je);
    cr_assert(doc, "not JSON (%s): %s", je.text, out_buf);
    cr_expect_eq(json_integer_value(json_object_get(doc, "seq_k")), 2000);
    json_decref(doc);
    FILE *f = fopen(P("m.png"), "rb");
    cr_assert(f, "no picture");
    unsigned char head[24];
    cr_assert_eq(fread(head, 1, 24, f), 24);
    fclose(f);
    cr_expect_eq(memcmp(head, "\x89PNG\r\n\x1a\n", 8), 0);
    /* 2000 keys in at most 1024 pixels: 2 elements a pixel, 1000 x 500. */
    cr_expect_eq((head[16] << 24 | head[17] << 16 | head[18] << 8 | head[19]),
                 1000);
    cr_expect_eq((head[20] << 24 | head[21] << 16 | head[22] << 8 | head[23]),
                 500);
    cr_assert(!has_tmp_files());
    cr_assert_eq(run("show-mask causal 0"), 2);
    cr_assert(strstr(err_buf, "not a size"), "%s", err_buf);
    cr_assert_eq(run("show-mask causal 64 --tile 64"), 2);
    cr_assert_eq(run("show-mask causal 64 --pixels 4"), 2);
    cr_assert_eq(run("show-mask nosuchmask 64"), 2);
    cr_assert_eq(count_lines(err_buf), 1, "%s", err_buf);
    cr_assert_eq(run("show-mask causal 64 --png %s", P("nodir/x.png")), 1);
    cr_assert(strstr(err_buf, "cannot write"), "%s", err_buf);
    cr_assert_eq(run("show-mask causal 64 --tile 7x3"), 2);
    cr_assert(strstr(err_buf, "power of two"), "%s", err_buf);
    /* The picture replaces a PNG (m.png above), nothing else: not
     * someone's notes, a link, a directory or a device. */
    cr_assert_eq(run("show-mask causal 64 --png %s", P("m.png")), 0, "%s",
                 err_buf);
    FILE *nf = fopen(P("notes.txt"), "w");
    fputs("my notes\n", nf);
    fclose(nf);
    cr_assert_eq(symlink(P("m.png"), P("link.png")), 0);
    const char *keep[] = {"notes.txt", "link.png", "."};
    for (int i = 0; i < 3; i++) {
        cr_assert_eq(run("show-mask causal 64 --png %s", P(keep[i])), 1, "%s",
                     keep[i]);
        cr_assert(strstr(err_buf, "not replaced") ||
                      strstr(err_buf, "directory"),
                  "%s", err_buf);
    }
    nf = fopen(P("notes.txt"), "r");
    char line[32] = "";
    cr_assert(fgets(line, sizeof(line), nf));
    fclose(nf);
    cr_assert_str_eq(line, "my notes\n");
    struct stat sb;
    cr_assert(lstat(P("link.png"), &sb) == 0 && S_ISLNK(sb.st_mode));
    if (exists("/dev/null"))
        cr_assert_eq(run("show-mask causal 64 --png /dev/null"), 1);
    cr_assert(!has_tmp_files());
}

Test(cli, usage_errors)
{
    cr_assert_eq(run("%s", ""), 2);
    cr_assert_eq(run("frobnicate"), 2);
    cr_assert_eq(count_lines(err_buf), 1, "%s", err_buf);
    cr_assert(strstr(err_buf, "unknown command"));
    cr_assert_eq(run("ls --bogus"), 2);
    cr_assert_eq(count_lines(err_buf), 1);
    cr_assert_eq(run("ls --db"), 2);
    cr_assert_eq(run("show"), 2);
    cr_assert_eq(run("show ''"), 2); /* an empty key is no prefix */
    cr_assert(strstr(err_buf, "give a key"), "%s", err_buf);
    cr_assert_eq(run("merge -o %s", P("x.db")), 2);
    cr_assert_eq(run("merge %s", P("a.db")), 2); /* no -o */
    cr_assert_eq(run("export"), 2);
    cr_assert_eq(run("gc --json=1"), 2);
    cr_assert_eq(run("export -o %s --driver abc", P("x.db")), 2);
    cr_assert_eq(run("tune"), 2);
    cr_assert_eq(run("tune --mask causal --shape 1x2x3"), 2);
    cr_assert(strstr(err_buf, "bad shape"), "%s", err_buf);
    cr_assert_eq(run("tune --mask causal --shape 1x2x64x64 --dtype fp8"), 2);
    /* --json: a usage error is a JSON document too (options that do not
     * parse, a missing value, a wrong count of arguments). */
    const char *bad_json[] = {"tune --json --bogus", "ls --json --db",
                              "ls --json extra --db x.db"};
    for (int i = 0; i < 3; i++) {
        cr_assert_eq(run("%s", bad_json[i]), 2, "%s", bad_json[i]);
        cr_assert(strstr(out_buf, "{\"error\":") &&
                      strstr(out_buf, "\"exit\":2}"),
                  "%s: stdout '%s'", bad_json[i], out_buf);
    }
    /* Help written to a full disk is an error, not a success. */
    if (exists("/dev/full")) {
        const char *helps[] = {"--help", "ls --help", "--version"};
        for (int i = 0; i < 3; i++) {
            char cmd[1024];
            snprintf(cmd, sizeof(cmd), "'%s' %s >/dev/full 2>/dev/null",
                     getenv("STOF_TUNE"), helps[i]);
            const int st = system(cmd);
            cr_assert(WIFEXITED(st) && WEXITSTATUS(st) != 0,
                      "%s to a full disk: exit 0", helps[i]);
        }
    }
}

/* ------------------------------------------------------- bad inputs */

Test(cli, missing_and_bad_databases)
{
    cr_assert_eq(run("ls --db %s", P("missing.db")), 4);
    cr_assert_eq(count_lines(err_buf), 1, "%s", err_buf);
    cr_assert(strstr(err_buf, "not found"), "%s", err_buf);
    cr_assert(!exists(P("missing.db")), "ls created the database");
    /* --json: a document on stdout even when the command fails. */
    cr_assert_eq(run("ls --db %s --json", P("missing.db")), 4);
    cr_assert(strstr(out_buf, "{\"error\":\"database not found") &&
                  strstr(out_buf, "\"exit\":4}"),
              "%s", out_buf);

    FILE *f = fopen(P("text.db"), "w");
    fputs("this is not a database, just some text that is long enough\n", f);
    fclose(f);
    cr_assert_eq(run("stats --db %s", P("text.db")), 4);
    cr_assert_eq(count_lines(err_buf), 1, "%s", err_buf);
    cr_assert(strstr(err_buf, "not a SQLite database"), "%s", err_buf);
    /* tune checks the database it would write before any GPU work (it
     * would store nothing there). */
    cr_assert_eq(run("tune --db %s --mask causal --shape 1x2x128x64",
                     P("text.db")),
                 4, "%s", err_buf);
    cr_assert(strstr(err_buf, "not a SQLite database"), "%s", err_buf);

    f = fopen(P("empty.db"), "w");
    fclose(f);
    cr_assert_eq(run("ls --db %s", P("empty.db")), 4);
    cr_assert(strstr(err_buf, "empty"), "%s", err_buf);

    sqlite3 *c = NULL;
    cr_assert_eq(sqlite3_open(P("foreign.db"), &c), SQLITE_OK);
    cr_assert_eq(sqlite3_exec(c, "CREATE TABLE t(x)", NULL, NULL, NULL),
                 SQLITE_OK);
    sqlite3_close(c);
    cr_assert_eq(run("ls --db %s", P("foreign.db")), 4);
    cr_assert(strstr(err_buf, "not a stof tuning database"), "%s", err_buf);

    /* A database from a newer schema: never read, never written. */
    const fx one[] = {{1, "NVIDIA H100", 13000, 0.3, 1, "a", 0, 1, NULL}};
    make_db(P("newer.db"), one, 1);
    cr_assert_eq(sqlite3_open(P("newer.db"), &c), SQLITE_OK);
    cr_assert_eq(sqlite3_exec(c, "PRAGMA user_version = 99", NULL, NULL, NULL),
                 SQLITE_OK);
    sqlite3_close(c);
    char *before = NULL;
    cr_assert_eq(run("ls --db %s", P("newer.db")), 4);
    cr_assert(strstr(err_buf, "newer"), "%s", err_buf);
    cr_assert_eq(count_lines(err_buf), 1);
    cr_assert_eq(run("import %s --db %s", P("newer.db"), P("u.db")), 4);
    cr_assert_eq(run("gc --db %s", P("newer.db")), 4);
    cr_assert_eq(run("merge %s %s -o %s", P("newer.db"), P("newer.db"),
                     P("m.db")),
                 4);
    cr_assert(!exists(P("m.db")));
    free(before);
}

Test(cli, failed_merge_leaves_no_partial_file)
{
    make_fleet();
    /* An existing output stays as it was when an input is bad. */
    cr_assert_eq(run("merge %s -o %s", P("a.db"), P("out.db")), 0, "%s",
                 err_buf);
    char *before = dump(P("out.db"));
    cr_assert_eq(run("merge %s %s -o %s", P("b.db"), P("nope.db"),
                     P("out.db")),
                 4);
    cr_assert_eq(count_lines(err_buf), 1, "%s", err_buf);
    char *after = dump(P("out.db"));
    cr_assert_str_eq(before, after);
    cr_assert(!has_tmp_files(), "a temporary file was left behind");
    /* An output directory that does not exist. */
    cr_assert_neq(run("merge %s -o %s/no/such/dir/x.db", P("a.db"), tmpdir),
                  0);
    cr_assert_eq(count_lines(err_buf), 1, "%s", err_buf);
    free(before);
    free(after);
}

Test(cli, gpu_commands_without_gpu)
{
    if (gpu_present()) {
        cr_skip_test("a GPU is present: the no-GPU paths do not apply");
        return;
    }
    const fx one[] = {{1, "NVIDIA H100", 13000, 0.3, 1, "a", 0, 1, NULL}};
    make_db(P("user.db"), one, 1);
    cr_assert_eq(run("tune --mask causal --shape 1x2x128x64"), 3);
    cr_assert(!strncmp(err_buf, "stof-tune: no GPU found: ", 25), "%s",
                 err_buf);
    cr_assert_eq(count_lines(err_buf), 1);
    cr_assert_eq(run("tune %s", tu_src_path("examples/suite.workload")), 3,
                 "%s", err_buf);
    cr_assert(strstr(err_buf, "no GPU found"), "%s", err_buf);
    cr_assert_eq(run("tune %s", tu_src_path("examples/layers.workload")), 3,
                 "%s", err_buf);
    cr_assert(strstr(err_buf, "no GPU found"), "%s", err_buf);
    cr_assert_eq(run("pending"), 3);
    cr_assert(strstr(err_buf, "no GPU found"));
    cr_assert_eq(run("verify"), 3);
    cr_assert(strstr(err_buf, "no GPU found"));
    /* A missing database is a database error before the GPU is looked
     * for. */
    cr_assert_eq(run("verify --db %s", P("none.db")), 4);
}

Test(cli, bad_workload_files)
{
    cr_assert_eq(run("tune %s", P("missing.workload")), 1);
    cr_assert(strstr(err_buf, "missing.workload"), "%s", err_buf);
    cr_assert_eq(count_lines(err_buf), 1);

    static const struct {
        const char *text, *want;
    } cases[] = {
        {"mask causal\nshape 1x2x64x64\nfrobnicate 3\n", "bad.workload:3:"},
        {"mask causal\nshape 1x2x64\n", "bad.workload:2: bad shape"},
        {"mask causal\nshape 1x2x64x12\n", "head_dim"},
        {"# nothing\nshape 1x2x64x64\n", "no mask"},
        {"mask causal\n", "no shape"},
        {"mask causal\nshape 1x2x64x64\ndtype fp8\n", "bad.workload:3:"},
        {"mask causal\nshape 1x2x64x64\nlayout xyz\n", "bad.workload:3:"},
        {"\n\nmask sliding:\nshape 1x2x64x64\n", "bad.workload:3: bad mask"},
        {"mask\nshape 1x2x64x64\n", "bad.workload:1:"},
        /* layers */
        {"mask causal\nlayer b hidden=768 heads=12\n", "no 'tokens'"},
        {"mask causal\ntokens 8x512\n", "'tokens' but no 'layer'"},
        {"mask causal\nlayer b heads=12\ntokens 1x128\n",
         "bad.workload:2: layer b needs hidden= and heads="},
        {"mask causal\nlayer b hidden=768 heads=12 act=gelu\ntokens 1x8\n",
         "bad.workload:2: layer b: bad act=gelu"},
        {"mask causal\nlayer hidden=768 heads=12\ntokens 1x8\n",
         "bad.workload:2: 'layer' needs a name"},
        {"mask causal\nlayer b hidden=768 heads=12 colour=red\ntokens 1x8\n",
         "unknown setting 'colour'"},
        {"mask causal\nlayer b hidden=768 heads=7\ntokens 1x8\n",
         "heads 7 must divide hidden 768"},
        {"mask causal\nlayer b hidden=64 heads=4 kv_heads=3\ntokens 1x8\n",
         "kv_heads 3 divide heads"},
        {"mask causal\nlayer b hidden=768 heads=12\ntokens 8x\n",
         "bad.workload:3: bad tokens '8x'"},
        {"mask causal\nlayer b hidden=768 heads=12\ntokens 0x128\n",
         "bad tokens '0x128'"},
        {"mask causal\nlayer b hidden=768 heads=12 pre=1\ntokens 1x8\n",
         "bad pre=1"},
        {"mask causal\nlayer b hidden=768 heads=12 eps=2\ntokens 1x8\n",
         "bad eps=2"},
        {"mask causal\nlayer b hidden=768 heads=12 norm=batch\ntokens 1x8\n",
         "bad norm=batch"},
        /* RoPE: a finite base > 1 (once a float), a dim of 0 or more */
        {"mask causal\nlayer b hidden=768 heads=12 rope=1\ntokens 1x8\n",
         "bad.workload:2: layer b: bad rope=1 ("},
        {"mask causal\nlayer b hidden=768 heads=12 rope=1.00000001\n"
         "tokens 1x8\n",
         "bad rope=1.00000001"},
        {"mask causal\nlayer b hidden=768 heads=12 rope=0\ntokens 1x8\n",
         "bad rope=0"},
        {"mask causal\nlayer b hidden=768 heads=12 rope=-10000\ntokens 1x8\n",
         "bad rope=-10000"},
        {"mask causal\nlayer b hidden=768 heads=12 rope=inf\ntokens 1x8\n",
         "bad rope=inf"},
        {"mask causal\nlayer b hidden=768 heads=12 rope=nan\ntokens 1x8\n",
         "bad rope=nan"},
        {"mask causal\nlayer b hidden=768 heads=12 rope=1e39\ntokens 1x8\n",
         "bad rope=1e39"},
        {"mask causal\nlayer b hidden=768 heads=12 rope=1e4x\ntokens 1x8\n",
         "bad rope=1e4x"},
        {"mask causal\nlayer b hidden=768 heads=12 rope\ntokens 1x8\n",
         "layer b: bad rope (sizes"},
        {"mask causal\nlayer b hidden=768 heads=12 rope=10000 rope_dim=-16\n"
         "tokens 1x8\n",
         "bad rope_dim=-16"},
        {"mask causal\nlayer b hidden=768 heads=12 rope=10000 rope_dim=16.5\n"
         "tokens 1x8\n",
         "bad rope_dim=16.5"},
        {"mask causal\nlayer b hidden=768 heads=12 rope=10000 rope_dim\n"
         "tokens 1x8\n",
         "rope a finite base > 1"},
        {"mask causal\nlayer b hidden=768 heads=12 rotary=10000\ntokens 1x8\n",
         "unknown setting 'rotary' (hidden, heads, ffn, kv_heads, act, norm, "
         "pre, post, gated, no_bias, qk_norm, head_dim, eps, rope, rope_dim)"},
        /* what a plan would refuse, named before any GPU work */
        {"mask causal\nshape 1048576x1048576x1048576x256\n",
         "bad.workload: bad shape 1048576x1048576x1048576x1048576x256"},
        {"mask causal\nshape 8192x4096x1024x64\n",
         "more query rows than one launch takes"},
        {"mask causal\nlayer b hidden=768 heads=768\ntokens 2x128\n",
         "bad.workload:2: layer b at 2x128 tokens: desc.hidden 768 / desc.heads 768 = head_dim 1"},
        {"mask causal\nlayer b hidden=768 heads=12\ntokens 1048576x1048576\n",
         "at most 2^30"},
        {"mask causal\nlayer b hidden=100 heads=4\ntokens 1x8\n",
         "desc.hidden 100"},
        {"mask causal\nlayer b hidden=64 heads=2\nlayer b hidden=128 "
         "heads=2\ntokens 1x8\n",
         "bad.workload:3: layer b is given twice"},
        /* RoPE's plan rules (the values parsed into the descriptor) */
        {"mask causal\nlayer b hidden=768 heads=12 rope_dim=32\ntokens 1x8\n",
         "bad.workload:2: layer b at 1x8 tokens: desc.rope_dim 32 without "
         "RoPE"},
        {"mask causal\nlayer b hidden=768 heads=12 rope=tables\ntokens 1x8\n",
         "bad rope=tables"},
        {"mask causal\nlayer b hidden=768 heads=12 qk_norm=1\ntokens 1x8\n",
         "bad qk_norm=1"},
        {"mask causal\nlayer b hidden=768 heads=12 head_dim=12\ntokens 1x8\n",
         "desc.head_dim 12: a multiple of 8"},
        {"mask causal\nlayer b hidden=768 heads=12 head_dim\ntokens 1x8\n",
         "bad head_dim ("},
        {"mask causal\nlayer b hidden=768 heads=12 rope=table rope_dim=22\n"
         "tokens 1x8\n",
         "desc.rope_dim 22: 0 (the whole head)"},
        {"mask causal\nlayer b hidden=768 heads=12 rope=10000 rope_dim=30\n"
         "tokens 1x8\n",
         "desc.rope_dim 30: 0 (the whole head) or a multiple of 4 up to "
         "head_dim 64"},
        {"mask causal\nlayer b hidden=768 heads=12 rope_dim=80 rope=1e4\n"
         "tokens 1x8\n",
         "desc.rope_dim 80"},
        {"mask causal\nlayer b hidden=192 heads=8 rope=500000 rope_dim=28\n"
         "tokens 1x8\n",
         "desc.rope_dim 28: 0 (the whole head) or a multiple of 4 up to "
         "head_dim 24"},
    };
    /* 256 masks x 256 tokens sizes x 2 layers: more than one run tunes. */
    FILE *big = fopen(P("big.workload"), "w");
    for (int i = 0; i < 256; i++)
        fprintf(big, "mask sliding:%d\ntokens %dx128\n", 64 + i, 1 + i);
    fputs("layer a hidden=64 heads=2\nlayer b hidden=64 heads=2\n", big);
    fclose(big);
    cr_assert_eq(run("tune %s --dry-run", P("big.workload")), 1, "%s",
                 err_buf);
    cr_assert(strstr(err_buf, "131072 problems"), "%s", err_buf);
    for (size_t i = 0; i < sizeof(cases) / sizeof(*cases); i++) {
        FILE *f = fopen(P("bad.workload"), "w");
        fputs(cases[i].text, f);
        fclose(f);
        cr_assert_eq(run("tune %s", P("bad.workload")), 1, "case %zu: %s", i,
                     err_buf);
        cr_assert(strstr(err_buf, cases[i].want), "case %zu: %s", i, err_buf);
        cr_assert_eq(count_lines(err_buf), 1, "case %zu: %s", i, err_buf);
    }
}

/* hf-workload: a Hugging Face config.json (as published: Llama 3.1 8B
 * with its llama3 rope scaling, Qwen3 0.6B with heads of 128 over a hidden
 * of 1024 and its QK norm, Qwen2.5 7B with Q/K/V biases and a window it
 * does not use, Mistral 7B with its sliding window; a transformers 5
 * config with rope_parameters and layer_types) gives the workload of its
 * decoder layers, which tune --dry-run takes; other models, activations,
 * windows on some layers only, bad files and --dtype values are refused. */
static void write_text(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    cr_assert(f);
    fputs(text, f);
    fclose(f);
}

Test(cli, hf_workload_from_configs)
{
    static const struct {
        const char *name, *json, *want[3];
    } cases[] = {
        {"llama31",
         "{\"attention_bias\": false, \"hidden_act\": \"silu\", "
         "\"hidden_size\": 4096, \"intermediate_size\": 14336, "
         "\"mlp_bias\": false, \"model_type\": \"llama\", "
         "\"num_attention_heads\": 32, \"num_hidden_layers\": 32, "
         "\"num_key_value_heads\": 8, \"rms_norm_eps\": 1e-05, "
         "\"rope_scaling\": {\"factor\": 8.0, \"low_freq_factor\": 1.0, "
         "\"high_freq_factor\": 4.0, \"original_max_position_embeddings\": "
         "8192, \"rope_type\": \"llama3\"}, \"rope_theta\": 500000.0, "
         "\"torch_dtype\": \"bfloat16\"}",
         {"mask causal\n",
          "layer llama hidden=4096 heads=32 ffn=14336 kv_heads=8 act=silu "
          "norm=rms pre gated no_bias eps=1.0000000000000001e-05 rope=table\n",
          "dtype bf16\n"}},
        {"qwen3",
         "{\"attention_bias\": false, \"head_dim\": 128, \"hidden_act\": "
         "\"silu\", \"hidden_size\": 1024, \"intermediate_size\": 3072, "
         "\"max_window_layers\": 28, \"model_type\": \"qwen3\", "
         "\"num_attention_heads\": 16, \"num_hidden_layers\": 28, "
         "\"num_key_value_heads\": 8, \"rms_norm_eps\": 1e-06, "
         "\"rope_scaling\": null, \"rope_theta\": 1000000, "
         "\"sliding_window\": null, \"use_sliding_window\": false}",
         {"mask causal\n",
          "layer qwen3 hidden=1024 heads=16 ffn=3072 kv_heads=8 act=silu "
          "norm=rms pre gated no_bias qk_norm head_dim=128 "
          "eps=9.9999999999999995e-07 rope=1000000\n",
          "dtype fp16\n"}},
        {"qwen2",
         "{\"hidden_act\": \"silu\", \"hidden_size\": 3584, "
         "\"intermediate_size\": 18944, \"max_window_layers\": 28, "
         "\"model_type\": \"qwen2\", \"num_attention_heads\": 28, "
         "\"num_hidden_layers\": 28, \"num_key_value_heads\": 4, "
         "\"rms_norm_eps\": 1e-06, \"rope_theta\": 1000000.0, "
         "\"sliding_window\": 131072, \"use_sliding_window\": false}",
         {"mask causal\n",
          "layer qwen2 hidden=3584 heads=28 ffn=18944 kv_heads=4 act=silu "
          "norm=rms pre gated eps=9.9999999999999995e-07 rope=1000000\n",
          "tokens 1x128 8x512 16x2048\n"}},
        {"mistral",
         "{\"hidden_act\": \"silu\", \"hidden_size\": 4096, "
         "\"intermediate_size\": 14336, \"model_type\": \"mistral\", "
         "\"num_attention_heads\": 32, \"num_hidden_layers\": 32, "
         "\"num_key_value_heads\": 8, \"rms_norm_eps\": 1e-05, "
         "\"rope_theta\": 10000.0, \"sliding_window\": 4096}",
         {"mask causal_sliding:4096\n", " no_bias eps=", " rope=10000\n"}},
        /* transformers 5: rope_parameters, layer_types all sliding */
        {"qwen2v5",
         "{\"hidden_act\": \"silu\", \"hidden_size\": 256, "
         "\"intermediate_size\": 512, \"model_type\": \"qwen2\", "
         "\"num_attention_heads\": 4, \"num_hidden_layers\": 2, "
         "\"num_key_value_heads\": 2, \"rms_norm_eps\": 1e-06, "
         "\"rope_parameters\": {\"rope_type\": \"yarn\", \"factor\": 4.0, "
         "\"rope_theta\": 1000000.0}, \"sliding_window\": 64, "
         "\"use_sliding_window\": true, "
         "\"layer_types\": [\"sliding_attention\", \"sliding_attention\"]}",
         {"mask causal_sliding:64\n", " rope=table\n", "dtype fp16\n"}},
        /* transformers' defaults: no use_sliding_window, no window (its
         * layer_types aside); max_window_layers 28 of 28 layers: none */
        {"qwen2def",
         "{\"hidden_act\": \"silu\", \"hidden_size\": 256, "
         "\"intermediate_size\": 512, \"model_type\": \"qwen2\", "
         "\"num_attention_heads\": 4, \"num_hidden_layers\": 28, "
         "\"num_key_value_heads\": 2, \"rms_norm_eps\": 1e-06, "
         "\"sliding_window\": 64, \"layer_types\": [\"sliding_attention\"]}",
         {"mask causal\n", " rope=10000\n", " kv_heads=2 "}},
        {"qwen2mwl",
         "{\"hidden_act\": \"silu\", \"hidden_size\": 256, "
         "\"intermediate_size\": 512, \"model_type\": \"qwen2\", "
         "\"num_attention_heads\": 4, \"num_hidden_layers\": 28, "
         "\"num_key_value_heads\": 2, \"rms_norm_eps\": 1e-06, "
         "\"sliding_window\": 64, \"use_sliding_window\": true}",
         {"mask causal\n", "layer qwen2 ", "tokens "}},
        /* Mistral without the key: transformers' 4096 */
        {"mistraldef",
         "{\"hidden_size\": 256, \"intermediate_size\": 512, "
         "\"model_type\": \"mistral\", \"num_attention_heads\": 4, "
         "\"num_key_value_heads\": 4, \"rms_norm_eps\": 1e-05}",
         {"mask causal_sliding:4096\n", " no_bias ", " rope=10000\n"}},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(*cases); i++) {
        char cfg[64], wl[64];
        snprintf(cfg, sizeof(cfg), "%s.json", cases[i].name);
        snprintf(wl, sizeof(wl), "%s.workload", cases[i].name);
        write_text(P(cfg), cases[i].json);
        cr_assert_eq(run("hf-workload %s", P(cfg)), 0, "%s: %s",
                     cases[i].name, err_buf);
        for (int k = 0; k < 3; k++)
            cr_expect(strstr(out_buf, cases[i].want[k]), "%s: no '%s' in\n%s",
                      cases[i].name, cases[i].want[k], out_buf);
        write_text(P(wl), out_buf);
        cr_assert_eq(run("tune %s --dry-run", P(wl)), 0, "%s: %s",
                     cases[i].name, err_buf);
        cr_expect_eq(count_lines(out_buf), 3, "%s: %s", cases[i].name,
                     out_buf);
    }
    /* --tokens and --dtype */
    cr_assert_eq(run("hf-workload %s --tokens 2x256 --tokens 4x64 --dtype bf16",
                     P("qwen3.json")),
                 0, "%s", err_buf);
    cr_expect(strstr(out_buf, "\ntokens 2x256 4x64\ndtype bf16\n"), "%s",
              out_buf);
    cr_expect_eq(run("hf-workload %s --dtype fp8", P("qwen3.json")), 2);
    cr_expect_eq(run("hf-workload %s --tokens '8x512 garbage'", P("qwen3.json")),
                 2);
    cr_expect(strstr(err_buf, "--tokens 8x512 garbage"), "%s", err_buf);
    /* refused: another model, activation, a window on some layers, a
     * partial rotation with a scaled rope, no file, not JSON */
    static const struct {
        const char *json, *want;
    } bad[] = {
        {"{\"model_type\": \"gpt2\"}", "model_type 'gpt2'"},
        {"{\"model_type\": \"llama\", \"hidden_act\": \"gelu\"}",
         "hidden_act 'gelu'"},
        {"{\"model_type\": \"llama\", \"hidden_size\": 256, "
         "\"num_attention_heads\": 4, \"intermediate_size\": 512, "
         "\"rms_norm_eps\": 1e-6, \"rope_theta\": 1e4}",
         NULL},
        {"{\"model_type\": \"qwen2\", \"hidden_size\": 256, "
         "\"num_attention_heads\": 4, \"intermediate_size\": 512, "
         "\"num_key_value_heads\": 4, "
         "\"rms_norm_eps\": 1e-6, \"sliding_window\": 64, "
         "\"use_sliding_window\": true, \"layer_types\": "
         "[\"sliding_attention\", \"full_attention\"]}",
         "some layers only (1 of 2)"},
        {"{\"model_type\": \"qwen2\", \"hidden_size\": 256, "
         "\"num_attention_heads\": 4, \"intermediate_size\": 512, "
         "\"num_key_value_heads\": 4, "
         "\"rms_norm_eps\": 1e-6, \"sliding_window\": 64, "
         "\"use_sliding_window\": true, \"max_window_layers\": 1, "
         "\"num_hidden_layers\": 3}",
         "some layers only (2 of 3)"},
        {"{\"model_type\": \"qwen3\", \"hidden_size\": 256, "
         "\"num_attention_heads\": 4, \"intermediate_size\": 512, "
         "\"rms_norm_eps\": 1e-6}",
         "num_key_value_heads is missing"},
        {"{\"model_type\": \"llama\", \"hidden_size\": 256, "
         "\"num_attention_heads\": 4, \"intermediate_size\": 512, "
         "\"rms_norm_eps\": 1e-6, \"rope_theta\": 1e4, "
         "\"rope_parameters\": {\"full_attention\": {\"rope_theta\": 1e6}}}",
         "rope_parameters per layer type"},
        {"{\"model_type\": \"llama\", \"hidden_size\": 256, "
         "\"num_attention_heads\": 4, \"intermediate_size\": 512, "
         "\"rms_norm_eps\": 1e-6, \"rope_scaling\": {\"rope_type\": "
         "\"linear\", \"factor\": 2.0}, \"partial_rotary_factor\": 0.5}",
         "partial_rotary_factor with rope type linear"},
        {"{\"model_type\": \"llama\", \"num_attention_heads\": 4}",
         "hidden_size is missing"},
        {"{\"model_type\": \"llama\", \"hidden_size\": 256, "
         "\"num_attention_heads\": 4, \"intermediate_size\": 512}",
         "rms_norm_eps is missing"},
        {"[1, 2]", "not a JSON object"},
        {"{\"model_type\": ", "hf-workload"},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(*bad); i++) {
        write_text(P("bad.json"), bad[i].json);
        const int rc = run("hf-workload %s", P("bad.json"));
        if (!bad[i].want) { /* (a good one among them: the defaults) */
            cr_expect_eq(rc, 0, "case %zu: %s", i, err_buf);
            cr_expect(strstr(out_buf, " rope=10000\n"), "%s", out_buf);
            continue;
        }
        cr_expect_eq(rc, 1, "case %zu: %s", i, bad[i].json);
        cr_expect(strstr(err_buf, bad[i].want), "case %zu: %s", i, err_buf);
    }
    cr_expect_eq(run("hf-workload %s", P("no-such.json")), 1);
    cr_expect(strstr(err_buf, "no-such.json"), "%s", err_buf);
}

/* --dry-run lists a workload's problems without a GPU: attention problems
 * (masks x shapes x dtypes x layouts), then layers x tokens x masks x
 * dtypes. */
Test(cli, tune_dry_run_lists_attention_and_layer_problems)
{
    FILE *f = fopen(P("mix.workload"), "w");
    fputs("mask causal\nmask sliding:64\nshape 1x2x128x64\n"
          "layer enc hidden=256 heads=4 act=gelu_erf\n"
          "layer dec hidden=256 heads=4 kv_heads=2 ffn=512 act=silu "
          "norm=rms pre gated no_bias eps=1e-6 rope=500000 rope_dim=32\n"
          "layer l31 hidden=256 heads=4 act=silu norm=rms pre gated no_bias "
          "qk_norm head_dim=128 rope=table\n"
          "layer odd hidden=256 heads=3 head_dim=128\n"
          "tokens 2x128 1x256\ndtype fp16 bf16\n",
          f);
    fclose(f);
    cr_assert_eq(run("tune %s --dry-run", P("mix.workload")), 0, "%s",
                 err_buf);
    /* 2 masks x 1 shape x 2 dtypes, then 4 layers x 2 sizes x 2 masks x 2
     * dtypes (l31's RoPE frequencies its own: rope=table; odd's 3 heads of
     * 128 over a hidden of 256). */
    cr_assert_eq(count_lines(out_buf), 4 + 32, "%s", out_buf);
    cr_assert(strstr(out_buf, "\nlayer l31 causal 1x256 bf16\n"), "%s",
              out_buf);
    cr_assert(!strncmp(out_buf, "causal 1x2x128x128x64 fp16 bhsd\n", 32),
              "%s", out_buf);
    cr_assert(strstr(out_buf, "\nlayer enc causal 2x128 fp16\n"), "%s",
              out_buf);
    cr_assert(strstr(out_buf, "\nlayer dec sliding:64 1x256 bf16\n"), "%s",
              out_buf);
    /* Options the file would override are refused, not ignored. */
    cr_assert_eq(run("tune %s --dtype bf16 --dry-run", P("mix.workload")), 2);
    cr_assert(strstr(err_buf, "go without one"), "%s", err_buf);
    cr_assert_eq(run("tune %s --mask causal --dry-run", P("mix.workload")),
                 2);
    /* A --devices value that could never run is refused by a dry run too. */
    cr_assert_eq(run("tune %s --dry-run --devices bogus", P("mix.workload")),
                 2);
    cr_assert(strstr(err_buf, "--devices"), "%s", err_buf);
    cr_assert_eq(run("tune %s --dry-run --devices 0,1", P("mix.workload")), 0,
                 "%s", err_buf);
    cr_assert_eq(run("tune %s --dry-run --json", P("mix.workload")), 0);
    cr_assert(out_buf[0] == '[' && strstr(out_buf, "\"layer dec causal "
                                                   "2x128 bf16\""),
              "%s", out_buf);
    /* The same problems from the command line. */
    cr_assert_eq(run("tune --mask causal --layer 'enc hidden=256 heads=4' "
                     "--layer 'dec hidden=256 heads=4 pre gated rope=1e4 "
                     "rope_dim=0' --tokens 2x128 "
                     "--tokens '1x256 4x64' --dtype bf16 --dry-run"),
                 0, "%s", err_buf);
    cr_assert_eq(count_lines(out_buf), 6, "%s", out_buf);
    cr_assert(strstr(out_buf, "layer dec causal 4x64 bf16\n"), "%s", out_buf);
    cr_assert_eq(run("tune --mask causal --layer 'enc hidden=256 heads=4' "
                     "--dry-run"),
                 2);
    cr_assert(strstr(err_buf, "command line: layers but no --tokens"), "%s",
              err_buf);
    cr_assert_eq(run("tune --mask causal --tokens 2x8 --dry-run"), 2);
    cr_assert(strstr(err_buf, "--tokens but no --layer"), "%s", err_buf);
    cr_assert_eq(run("tune --mask causal --layer 'x heads=2' --tokens 1x8"),
                 2);
    cr_assert(strstr(err_buf, "layer x needs hidden="), "%s", err_buf);
    /* The same problem given twice (written two ways) is tuned once. */
    f = fopen(P("dup.workload"), "w");
    fputs("mask causal\nmask causal\nshape 4x16x4096x64\nshape 4 16 4096 64\n"
          "layer a hidden=64 heads=2\ntokens 2x64 2x64\ntokens 2X64\n",
          f);
    fclose(f);
    cr_assert_eq(run("tune %s --dry-run", P("dup.workload")), 0, "%s",
                 err_buf);
    cr_assert_eq(count_lines(out_buf), 2, "%s", out_buf);
    /* The example file parses. */
    cr_assert_eq(run("tune %s --dry-run",
                     tu_src_path("examples/layers.workload")),
                 0, "%s", err_buf);
    cr_assert_eq(count_lines(out_buf), 6, "%s", out_buf);
}

/* ------------------------------------------------ export and import */

Test(cli, export_import_round_trip)
{
    make_fleet();
    cr_assert_eq(run("export --db %s -o %s", P("a.db"), P("exp.db")), 0, "%s",
                 err_buf);
    cr_assert_eq(count_rows(P("exp.db"), "records"), 5);
    cr_assert_eq(count_rows(P("exp.db"), "misses"), 0);
    cr_assert_eq(run("import %s --db %s", P("exp.db"), P("new.db")), 0, "%s",
                 err_buf);
    /* The records (and their hits) come back exactly. */
    char *x = dump(P("a.db")), *y = dump(P("new.db"));
    char *xm = strstr(x, "--\n"), *ym = strstr(y, "--\n");
    cr_assert(xm && ym);
    xm[0] = ym[0] = '\0';
    cr_assert_str_eq(x, y);
    free(x);
    free(y);
    /* Importing again changes nothing. */
    char *before = dump(P("new.db"));
    cr_assert_eq(run("import %s --db %s", P("exp.db"), P("new.db")), 0);
    char *after = dump(P("new.db"));
    cr_assert_str_eq(before, after);
    free(before);
    free(after);
    /* The default database is the user database ($STOF_USER_DB). */
    cr_assert_eq(run("import %s", P("exp.db")), 0, "%s", err_buf);
    cr_assert_eq(count_rows(P("user.db"), "records"), 5);
}

Test(cli, export_filters_by_gpu_and_driver)
{
    make_fleet();
    cr_assert_eq(run("export --db %s --gpu 'nvidia h200' -o %s", P("c.db"),
                     P("h200.db")),
                 0, "%s", err_buf);
    cr_assert_eq(count_rows(P("h200.db"), "records"), 1);
    cr_assert_eq(run("export --db %s --gpu 'NVIDIA H100' --driver 13000 -o %s",
                     P("c.db"), P("h100.db")),
                 0);
    cr_assert_eq(count_rows(P("h100.db"), "records"), 3);
    cr_assert_eq(run("export --db %s --driver 1 -o %s --json", P("c.db"),
                     P("none.db")),
                 0);
    cr_assert_eq(count_rows(P("none.db"), "records"), 0);
    cr_assert(strstr(out_buf, "\"records\":0"), "%s", out_buf);
    cr_assert(!has_tmp_files());
}

/* ------------------------------------------------------------- merge */

Test(cli, merge_is_commutative_and_idempotent)
{
    make_fleet();
    cr_assert_eq(run("merge %s %s %s -o %s", P("a.db"), P("b.db"), P("c.db"),
                     P("abc.db")),
                 0, "%s", err_buf);
    cr_assert_eq(run("merge %s %s %s -o %s", P("c.db"), P("a.db"), P("b.db"),
                     P("cab.db")),
                 0);
    cr_assert_eq(run("merge %s %s %s -o %s", P("b.db"), P("c.db"), P("a.db"),
                     P("bca.db")),
                 0);
    /* Associative: (A B) C. */
    cr_assert_eq(run("merge %s %s -o %s", P("a.db"), P("b.db"), P("ab.db")),
                 0);
    cr_assert_eq(run("merge %s %s -o %s", P("ab.db"), P("c.db"),
                     P("ab_c.db")),
                 0);
    /* Idempotent: merging the result again, or with an input again. */
    cr_assert_eq(run("merge %s %s -o %s", P("abc.db"), P("abc.db"),
                     P("abc2.db")),
                 0);
    cr_assert_eq(run("merge %s %s %s -o %s", P("abc.db"), P("a.db"),
                     P("c.db"), P("abc3.db")),
                 0);
    char *ref = dump(P("abc.db"));
    const char *others[] = {"cab.db", "bca.db", "ab_c.db", "abc2.db",
                            "abc3.db"};
    for (size_t i = 0; i < sizeof(others) / sizeof(*others); i++) {
        char *d = dump(P(others[i]));
        cr_assert_str_eq(ref, d, "%s differs from abc.db", others[i]);
        free(d);
    }
    /* The winners: key 1 from b (fastest), key 2 from a (verified), key 7
     * once; all 7 keys; hits take the maximum (5 on key 1). */
    cr_assert_eq(count_rows(P("abc.db"), "records"), 7);
    cr_assert(strstr(ref, "00000000000000000000000000000001|") != NULL);
    cr_assert_eq(run("show 00000000000000000000000000000001 --db %s --json",
                     P("abc.db")),
                 0, "%s", err_buf);
    cr_assert(strstr(out_buf, "\"host\":\"b\""), "%s", out_buf);
    cr_assert(strstr(out_buf, "\"hits\":5"), "%s", out_buf);
    cr_assert_eq(run("show 0000000000000000000000000000000 --db %s",
                     P("abc.db")),
                 1); /* ambiguous prefix */
    cr_assert_eq(run("show 00000000000000000000000000000002 --db %s --json",
                     P("abc.db")),
                 0);
    cr_assert(strstr(out_buf, "\"host\":\"a\""), "%s", out_buf);
    cr_assert(strstr(out_buf, "\"verified\":true"), "%s", out_buf);
    /* Misses: 99 and 98 kept (99 with the larger count), 06 answered. */
    cr_assert_eq(count_rows(P("abc.db"), "misses"), 2);
    cr_assert(strstr(ref, "00000000000000000000000000000099|{\"op\":"
                          "\"attention\",\"batch\":1}|"));
    cr_assert(strstr(ref, "|4|\n"), "%s", ref);
    free(ref);
    cr_assert(!has_tmp_files());
}

Test(cli, merge_reports_conflicts)
{
    make_fleet();
    cr_assert_eq(run("merge %s %s %s -o %s --json", P("a.db"), P("b.db"),
                     P("c.db"), P("m.db")),
                 0, "%s", err_buf);
    /* Key 1: a and c lose to b; key 2: c loses (unverified); key 3: a tie
     * broken by content; key 7 is the same record: no conflict. */
    cr_assert(strstr(out_buf, "\"conflicting_keys\":3"), "%s", out_buf);
    cr_assert(strstr(out_buf, "\"dropped_records\":4"), "%s", out_buf);
    cr_assert(strstr(out_buf, "\"reason\":\"unverified\""), "%s", out_buf);
    cr_assert(strstr(out_buf, "\"reason\":\"slower\""), "%s", out_buf);
    cr_assert(strstr(out_buf, "\"reason\":\"tie, broken by content\""), "%s",
              out_buf);
    cr_assert(!strstr(out_buf, "00000000000000000000000000000007"), "%s",
              out_buf);
    /* The plain report: one line per dropped record, then a summary. */
    cr_assert_eq(run("merge %s %s %s -o %s", P("a.db"), P("b.db"), P("c.db"),
                     P("m.db")),
                 0);
    cr_assert_eq(count_lines(out_buf), 5, "%s", out_buf);
    cr_assert(strstr(out_buf, "conflict 00000000000000000000000000000002: "
                              "kept block 0.5 ms (a) over block 0.1 ms (c, "
                              "unverified)"),
              "%s", out_buf);
    /* Without overlap there is no conflict. */
    cr_assert_eq(run("merge %s %s -o %s", P("b.db"), P("a.db"), P("m2.db")),
                 0);
    cr_assert(strstr(out_buf, "2 conflicting keys"), "%s", out_buf);
}

/* ------------------------------------------------- ls / stats / gc */

Test(cli, ls_stats_show)
{
    make_fleet();
    cr_assert_eq(run("ls --db %s", P("c.db")), 0, "%s", err_buf);
    cr_assert(strstr(out_buf, "4 records"), "%s", out_buf);
    cr_assert(strstr(out_buf, "(unverified)"));
    cr_assert_eq(run("ls --db %s --gpu 'NVIDIA H200' --json", P("c.db")), 0);
    cr_assert(strstr(out_buf, "\"device_name\":\"NVIDIA H200\""));
    cr_assert(!strstr(out_buf, "\"device_name\":\"NVIDIA H100\""));
    cr_assert_eq(run("stats --db %s --json", P("a.db")), 0, "%s", err_buf);
    cr_assert(strstr(out_buf, "\"records\":5"), "%s", out_buf);
    cr_assert(strstr(out_buf, "\"hits\":3"), "%s", out_buf);
    cr_assert(strstr(out_buf, "\"misses\":1,\"miss_count\":2"), "%s", out_buf);
    cr_assert_eq(run("stats --db %s", P("a.db")), 0);
    cr_assert(strstr(out_buf, "by GPU:"));
    cr_assert(strstr(out_buf, "by mask:"));
    cr_assert(strstr(out_buf, "by age:"));
    cr_assert_eq(run("show 00000000000000000000000000000004 --db %s",
                     P("a.db")),
                 0);
    cr_assert(strstr(out_buf, "sliding:256"), "%s", out_buf);
    cr_assert_eq(run("show ffff --db %s", P("a.db")), 1);
    cr_assert_eq(count_lines(err_buf), 1);
    /* A layer's GEMM record: its M x N x K. */
    stof_db_record r;
    const fx g = {9, "NVIDIA H100", 13000, 0.05, 1, "a", 0, 1, NULL};
    fx_record(&g, &r);
    snprintf(r.op, sizeof(r.op), "gemm");
    snprintf(r.kernel, sizeof(r.kernel), "gemm");
    r.batch = 4096;
    r.heads = r.head_dim = 0;
    r.seq_q = 768;
    r.seq_k = 3072;
    unsigned char cubin[64] = {1};
    r.cubin = cubin;
    r.cubin_size = sizeof(cubin);
    store_records(P("g.db"), &r, 1);
    cr_assert_eq(run("ls --db %s", P("g.db")), 0, "%s", err_buf);
    cr_assert(strstr(out_buf, "4096x768x3072 MNK"), "%s", out_buf);
}

Test(cli, gc_drops_other_versions)
{
    const fx recs[] = {
        {1, "NVIDIA H100", 13000, 0.3, 1, "a", 0, 1, NULL},
        {2, "NVIDIA H100", 13000, 0.3, 1, "a", 0, 2, "0.0.1"},
        {3, "NVIDIA H100", 13000, 0.3, 1, "a", 0, 3, "9.9.9"},
    };
    make_db(P("g.db"), recs, 3);
    cr_assert_eq(run("gc --db %s --dry-run --json", P("g.db")), 0, "%s",
                 err_buf);
    cr_assert(strstr(out_buf, "\"dropped\":2,\"kept\":1"), "%s", out_buf);
    cr_assert_eq(count_rows(P("g.db"), "records"), 3);
    cr_assert_eq(run("gc --db %s", P("g.db")), 0);
    cr_assert_eq(count_rows(P("g.db"), "records"), 1);
    cr_assert_eq(run("gc --db %s", P("g.db")), 0);
    cr_assert(strstr(out_buf, "dropped 0 records"), "%s", out_buf);
}
