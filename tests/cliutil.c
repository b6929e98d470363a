/*
 * cliutil.c - helpers of the stof-tune suites (cliutil.h): a temporary
 * directory per test, running stof-tune with its output captured, and
 * fixture databases written through the db module.
 */
#include <criterion/criterion.h>

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cliutil.h"
#include "db.h"
#include "internal.h"
#include "testutil.h"

/* ------------------------------------------------------------ helpers */

char tmpdir[256];

void cli_setup(void)
{
    snprintf(tmpdir, sizeof(tmpdir), "/tmp/stof-cli-XXXXXX");
    cr_assert(mkdtemp(tmpdir), "mkdtemp failed");
}

void cli_teardown(void)
{
    char cmd[400];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", tmpdir);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", tmpdir);
}


const char *P(const char *name)
{
    static char bufs[8][512];
    static int k;
    char *b = bufs[k++ & 7];
    snprintf(b, sizeof(bufs[0]), "%s/%s", tmpdir, name);
    return b;
}

char out_buf[1 << 16], err_buf[1 << 16];

static void slurp(const char *path, char *buf, size_t n)
{
    buf[0] = '\0';
    FILE *f = fopen(path, "r");
    if (!f)
        return;
    size_t r = fread(buf, 1, n - 1, f);
    buf[r] = '\0';
    fclose(f);
}

/* Run stof-tune with the arguments (a shell fragment); returns its exit
 * status; stdout and stderr land in out_buf and err_buf. */
int run(const char *fmt, ...)
{
    const char *exe = getenv("STOF_TUNE");
    cr_assert(exe && *exe, "STOF_TUNE is not set (run through meson test)");
    char args[4096], cmd[8192];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(args, sizeof(args), fmt, ap);
    va_end(ap);
    snprintf(cmd, sizeof(cmd),
             "STOF_USER_DB='%s/user.db' '%s' %s >'%s/out.txt' 2>'%s/err.txt'",
             tmpdir, exe, args, tmpdir, tmpdir);
    int st = system(cmd);
    slurp(P("out.txt"), out_buf, sizeof(out_buf));
    slurp(P("err.txt"), err_buf, sizeof(err_buf));
    cr_assert(WIFEXITED(st), "stof-tune %s did not exit normally", args);
    return WEXITSTATUS(st);
}

int count_lines(const char *s)
{
    int n = 0;
    for (; *s; s++)
        n += *s == '\n';
    return n;
}

int exists(const char *path)
{
    struct stat sb;
    return stat(path, &sb) == 0;
}

/* Does the directory hold a leftover temporary file? */
int has_tmp_files(void)
{
    char cmd[512];
    snprintf(cmd, sizeof(cmd), "ls '%s' | grep -q '\\.tmp-'", tmpdir);
    return system(cmd) == 0;
}

/* ----------------------------------------------------------- fixtures */

stof_context *ctx_new(void)
{
    stof_settings s;
    stof_default_settings(&s);
    s.user_db = "";
    stof_context *ctx = NULL;
    stof_open(&ctx, &s);
    cr_assert(ctx);
    return ctx;
}


void fx_record(const fx *f, stof_db_record *r)
{
    memset(r, 0, sizeof(*r));
    snprintf(r->key, sizeof(r->key), "%032x", f->key);
    snprintf(r->op, sizeof(r->op), "attention");
    snprintf(r->mask_digest, sizeof(r->mask_digest), "%032x", f->key * 7);
    snprintf(r->mask_spec, sizeof(r->mask_spec), "sliding:%d", 64 * f->key);
    r->batch = 1;
    r->heads = 8;
    r->seq_q = r->seq_k = 4096;
    r->head_dim = 64;
    snprintf(r->dtype, sizeof(r->dtype), "fp16");
    snprintf(r->layout, sizeof(r->layout), "BHSD");
    snprintf(r->device_name, sizeof(r->device_name), "%s", f->gpu);
    r->cc_major = 9;
    r->sm_count = 132;
    r->driver_version = f->driver;
    snprintf(r->nvrtc_version, sizeof(r->nvrtc_version), "13.0");
    snprintf(r->stof_version, sizeof(r->stof_version), "%s",
             f->version ? f->version : stof_version_string());
    snprintf(r->template_hash, sizeof(r->template_hash), "%016llx",
             (unsigned long long)stof_template_hash());
    snprintf(r->kernel, sizeof(r->kernel), "block");
    snprintf(r->config, sizeof(r->config),
             "{\"kind\":\"block\",\"block_m\":64,\"block_n\":64,"
             "\"warps\":4,\"stages\":2,\"overlap\":0,\"group\":0}");
    snprintf(r->arch, sizeof(r->arch), "sm_90");
    r->time_ms = f->ms;
    r->model_ms = f->ms * 1.5;
    r->n_candidates = 6;
    r->verified = f->verified;
    snprintf(r->measured, sizeof(r->measured), "{}");
    r->created_at = f->created ? f->created : 1700000000;
    snprintf(r->host, sizeof(r->host), "%s", f->host ? f->host : "host-a");
}

/* A database at path holding the records (stored with replace). */
void store_records(const char *path, const struct stof_db_record *recs,
                   int n)
{
    stof_context *ctx = ctx_new();
    stof_db *db = NULL;
    cr_assert_eq(stof__db_open(STOF_DB_SINK(ctx), path, NULL, &db), STOF_OK);
    cr_assert(stof__db_writable(db), "%s not writable", path);
    for (int i = 0; i < n; i++)
        cr_assert_eq(stof__db_store(db, &recs[i], 1, 0), STOF_OK, "%s",
                     stof_errmsg(ctx));
    stof__db_close(&db);
    stof_close(&ctx);
}

void make_db(const char *path, const fx *recs, int n)
{
    stof_db_record *r = calloc((size_t)n + 1, sizeof(*r));
    unsigned char(*cubin)[64] = calloc((size_t)n + 1, sizeof(*cubin));
    cr_assert(r && cubin);
    for (int i = 0; i < n; i++) {
        fx_record(&recs[i], &r[i]);
        memset(cubin[i], recs[i].cubin_byte, sizeof(cubin[i]));
        r[i].cubin = cubin[i];
        r[i].cubin_size = sizeof(cubin[i]);
    }
    store_records(path, r, n);
    free(r);
    free(cubin);
}

