/*
 * stof-tune - prebuild tuning databases and share them across hosts.
 *
 *   tune      tune the problems of a workload file (or --mask/--shape)
 *   pending   tune the misses recorded by cache-only runs
 *   ls        list the records of a database
 *   show      one record in full
 *   stats     what a database holds: by GPU, op, mask, age; hits, misses
 *   export    copy records (optionally one GPU/driver) into a new file
 *   import    merge database files into the user (or --db) database
 *   merge     merge database files into a new file
 *   verify    re-check this GPU's records against the reference
 *   gc        drop records made by other stof or template versions
 *
 * Exit status: 0 ok, 1 failure (bad input file, a problem or record
 * failed), 2 usage, 3 no GPU, 4 database error. Every error is one line on
 * stderr; every output database is written under a temporary name and
 * renamed into place, so no failure leaves a partial file.
 */
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

#include "db.h"
#include "db_tools.h"
#include "internal.h"
#include "tune_verify.h"
#include "tune_workload.h"

enum {
    EXIT_OK = 0,
    EXIT_FAIL = 1,
    EXIT_USAGE = 2,
    EXIT_NO_GPU = 3,
    EXIT_DB = 4
};

#define PROG "stof-tune"

/* ------------------------------------------------------------ options */

typedef struct opts {
    const char *cmd;
    const char *db, *out, *gpu;
    int driver;
    const char *masks[64];
    int n_masks;
    const char *shapes[64];
    int n_shapes;
    const char *dtype, *layout;
    double budget;
    int json, force, dry_run, drop, help;
    const char *pos[256];
    int n_pos;
} opts;

static void err(const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 1, 2)))
#endif
    ;
static void err(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, PROG ": ");
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
}

/* Map a failed database call to an exit code with its one-line message. */
static int db_error(stof_context *ctx, stof_status st)
{
    const char *m = stof_errmsg(ctx);
    if (st == STOF_ERR_NOT_FOUND)
        err("database not found: %s", m && *m ? m : "?");
    else
        err("database error: %s", m && *m ? m : stof_status_str(st));
    return EXIT_DB;
}

/* The database a command works on: --db, else the default user path. */
static const char *db_path(const opts *o, char *buf, size_t n)
{
    if (o->db)
        return o->db;
    if (!stof__db_default_path(buf, n))
        return NULL;
    return buf;
}

/* A JSON string literal of s, in one of 16 rotating static buffers: at
 * most 16 jstr() results may be used in one printf. */
static const char *jstr(const char *s)
{
    static char bufs[16][1024];
    static int k;
    char *b = bufs[k++ & 15];
    size_t j = 0;
    b[j++] = '"';
    for (; s && *s && j < sizeof(bufs[0]) - 8; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\') {
            b[j++] = '\\';
            b[j++] = (char)c;
        } else if (c < 0x20) {
            j += (size_t)snprintf(b + j, 8, "\\u%04x", c);
        } else {
            b[j++] = (char)c;
        }
    }
    b[j++] = '"';
    b[j] = '\0';
    return b;
}

/* ------------------------------------------------------------- helpers */

static stof_context *open_cpu_ctx(void)
{
    stof_settings s;
    stof_default_settings(&s);
    s.user_db = "";
    stof_context *ctx = NULL;
    if (stof_open(&ctx, &s) != STOF_OK && !ctx)
        return NULL;
    return ctx;
}

/* Open a GPU context or say why not: returns EXIT_OK with *out set. */
static int open_gpu_ctx(const stof_settings *s, stof_context **out)
{
    stof_settings c = *s;
    c.require_device = 1;
    stof_context *ctx = NULL;
    stof_status st = stof_open(&ctx, &c);
    if (st == STOF_OK && stof_has_device(ctx)) {
        *out = ctx;
        return EXIT_OK;
    }
    const char *why = ctx ? stof_errmsg(ctx) : stof_status_str(st);
    err("no GPU found: %s", why && *why ? why : "no usable CUDA device");
    stof_close(&ctx);
    return EXIT_NO_GPU;
}


/* Read every record of the database file at path (checked first). */
static int read_records(stof_context *ctx, const char *path, stof_dbt_records *l)
{
    memset(l, 0, sizeof(*l));
    stof_status st = stof__dbt_check(ctx, path);
    if (st != STOF_OK)
        return db_error(ctx, st);
    const char *sys[] = {path, NULL};
    stof_db *db = NULL;
    st = stof__db_open(ctx, "", sys, &db);
    if (st == STOF_OK)
        st = stof__db_foreach(db, 1, stof__dbt_collect, l);
    stof__db_close(&db);
    if (st != STOF_OK) {
        free(l->v);
        memset(l, 0, sizeof(*l));
        return db_error(ctx, st);
    }
    return EXIT_OK;
}

static void mask_label(const stof_db_record *r, char *buf, size_t n)
{
    if (r->mask_spec[0])
        snprintf(buf, n, "%s", r->mask_spec);
    else
        snprintf(buf, n, "digest:%.12s", r->mask_digest);
}

static void age_str(int64_t created, char *buf, size_t n)
{
    double s = difftime(time(NULL), (time_t)created);
    if (s < 0)
        s = 0;
    if (s < 3600)
        snprintf(buf, n, "%dm", (int)(s / 60));
    else if (s < 86400 * 2)
        snprintf(buf, n, "%dh", (int)(s / 3600));
    else
        snprintf(buf, n, "%dd", (int)(s / 86400));
}

static void record_json(FILE *f, const stof_db_record *r, size_t cubin_size)
{
    fprintf(f,
            "{\"key\":%s,\"op\":%s,\"mask_digest\":%s,\"mask_spec\":%s,"
            "\"batch\":%d,\"heads\":%d,\"seq_q\":%d,\"seq_k\":%d,"
            "\"head_dim\":%d,\"dtype\":%s,\"layout\":%s,",
            jstr(r->key), jstr(r->op), jstr(r->mask_digest),
            jstr(r->mask_spec), r->batch, r->heads, r->seq_q, r->seq_k,
            r->head_dim, jstr(r->dtype), jstr(r->layout));
    fprintf(f,
            "\"device_name\":%s,\"cc\":\"%d.%d\",\"sm_count\":%d,"
            "\"driver_version\":%d,\"nvrtc_version\":%s,\"stof_version\":%s,"
            "\"template_hash\":%s,",
            jstr(r->device_name), r->cc_major, r->cc_minor, r->sm_count,
            r->driver_version, jstr(r->nvrtc_version), jstr(r->stof_version),
            jstr(r->template_hash));
    fprintf(f,
            "\"kernel\":%s,\"config\":%s,\"arch\":%s,\"cubin_bytes\":%zu,"
            "\"time_ms\":%.6g,\"runner_up_ms\":%.6g,\"model_ms\":%.6g,"
            "\"n_candidates\":%d,\"verified\":%s,\"measured\":%s,"
            "\"created_at\":%lld,\"host\":%s,\"hits\":%lld}",
            jstr(r->kernel), jstr(r->config), jstr(r->arch), cubin_size,
            r->time_ms, r->runner_up_ms, r->model_ms, r->n_candidates,
            r->verified ? "true" : "false", jstr(r->measured),
            (long long)r->created_at, jstr(r->host), (long long)r->hits);
}

/* ------------------------------------------------------------ ls/show */

static int gpu_matches(const opts *o, const stof_db_record *r)
{
    return (!o->gpu || !strcasecmp(o->gpu, r->device_name)) &&
           (!o->driver || o->driver == r->driver_version);
}

static int cmd_ls(stof_context *ctx, const opts *o)
{
    char buf[4096];
    const char *path = db_path(o, buf, sizeof(buf));
    if (!path) {
        err("no database path: set --db or STOF_USER_DB");
        return EXIT_USAGE;
    }
    stof_dbt_records l;
    int rc = read_records(ctx, path, &l);
    if (rc)
        return rc;
    if (o->json) {
        printf("[");
        int first = 1;
        for (int i = 0; i < l.n; i++) {
            if (!gpu_matches(o, &l.v[i]))
                continue;
            printf(first ? "\n" : ",\n");
            first = 0;
            record_json(stdout, &l.v[i], l.v[i].cubin_size);
        }
        printf("\n]\n");
    } else {
        printf("%-12s  %-24s  %-24s  %-20s  %-5s  %-14s  %9s  %7s  %5s  %5s\n",
               "KEY", "GPU", "MASK", "SHAPE BxHxSQxSKxD", "DTYPE", "KERNEL",
               "TIME_MS", "SPEEDUP", "AGE", "HITS");
        int shown = 0;
        for (int i = 0; i < l.n; i++) {
            const stof_db_record *r = &l.v[i];
            if (!gpu_matches(o, r))
                continue;
            char mask[300], shape[64], age[16], sp[16];
            mask_label(r, mask, sizeof(mask));
            snprintf(shape, sizeof(shape), "%dx%dx%dx%dx%d", r->batch,
                     r->heads, r->seq_q, r->seq_k, r->head_dim);
            age_str(r->created_at, age, sizeof(age));
            if (r->time_ms > 0 && r->model_ms > 0)
                snprintf(sp, sizeof(sp), "%.2fx", r->model_ms / r->time_ms);
            else
                snprintf(sp, sizeof(sp), "-");
            printf("%-12.12s  %-24.24s  %-24.24s  %-20s  %-5s  %-14s  %9.4f  "
                   "%7s  %5s  %5lld%s\n",
                   r->key, r->device_name, mask, shape, r->dtype, r->kernel,
                   r->time_ms, sp, age, (long long)r->hits,
                   r->verified ? "" : "  (unverified)");
            shown++;
        }
        printf("%d record%s in %s\n", shown, shown == 1 ? "" : "s", path);
    }
    free(l.v);
    return EXIT_OK;
}

static int cmd_show(stof_context *ctx, const opts *o)
{
    char buf[4096];
    const char *path = db_path(o, buf, sizeof(buf));
    if (!path) {
        err("no database path: set --db or STOF_USER_DB");
        return EXIT_USAGE;
    }
    const char *key = o->pos[0];
    size_t kn = strlen(key);
    stof_dbt_records l;
    int rc = read_records(ctx, path, &l);
    if (rc)
        return rc;
    int found = -1, n = 0;
    for (int i = 0; i < l.n; i++)
        if (!strncasecmp(l.v[i].key, key, kn)) {
            found = i;
            n++;
        }
    rc = EXIT_OK;
    if (n == 0) {
        err("no record with key %s in %s", key, path);
        rc = EXIT_FAIL;
    } else if (n > 1) {
        err("key prefix %s matches %d records in %s: give more digits", key, n,
            path);
        rc = EXIT_FAIL;
    } else if (o->json) {
        record_json(stdout, &l.v[found], l.v[found].cubin_size);
        printf("\n");
    } else {
        const stof_db_record *r = &l.v[found];
        char age[16];
        age_str(r->created_at, age, sizeof(age));
        printf("key           %s\nop            %s\nmask          %s\n"
               "mask digest   %s\nproblem       batch %d, heads %d, seq_q %d, "
               "seq_k %d, head_dim %d, %s, %s\n",
               r->key, r->op, r->mask_spec[0] ? r->mask_spec : "(no spec)",
               r->mask_digest, r->batch, r->heads, r->seq_q, r->seq_k,
               r->head_dim, r->dtype, r->layout);
        printf("device        %s (cc %d.%d, %d SMs), driver %d, NVRTC %s\n"
               "built by      stof %s, templates %s\n",
               r->device_name, r->cc_major, r->cc_minor, r->sm_count,
               r->driver_version, r->nvrtc_version, r->stof_version,
               r->template_hash);
        printf("kernel        %s %s (%s, cubin %zu bytes)\n"
               "time          %.6g ms (runner-up %.6g ms, model's choice "
               "%.6g ms), %d candidates timed, %s\n"
               "measured      %s\ncreated       %lld (%s ago) on %s\n"
               "hits          %lld\n",
               r->kernel, r->config, r->arch, r->cubin_size, r->time_ms,
               r->runner_up_ms, r->model_ms, r->n_candidates,
               r->verified ? "verified" : "NOT verified", r->measured,
               (long long)r->created_at, age, r->host, (long long)r->hits);
    }
    free(l.v);
    return rc;
}

/* ---------------------------------------------------------------- stats */

typedef struct group {
    char label[300];
    int64_t records, hits;
} group;

typedef struct groups {
    group v[256];
    int n;
    int64_t other_records, other_hits; /* past 256 labels */
} groups;

static void group_add(groups *g, const char *label, int64_t hits)
{
    for (int i = 0; i < g->n; i++)
        if (!strcmp(g->v[i].label, label)) {
            g->v[i].records++;
            g->v[i].hits += hits;
            return;
        }
    if (g->n == (int)(sizeof(g->v) / sizeof(*g->v))) {
        g->other_records++;
        g->other_hits += hits;
        return;
    }
    snprintf(g->v[g->n].label, sizeof(g->v[0].label), "%s", label);
    g->v[g->n].records = 1;
    g->v[g->n].hits = hits;
    g->n++;
}

static void groups_print(const char *title, const groups *g, int json,
                         int last)
{
    if (json) {
        printf("%s:[", jstr(title));
        for (int i = 0; i < g->n; i++)
            printf("%s{\"name\":%s,\"records\":%lld,\"hits\":%lld}",
                   i ? "," : "", jstr(g->v[i].label),
                   (long long)g->v[i].records, (long long)g->v[i].hits);
        printf("]%s", last ? "" : ",");
        return;
    }
    printf("\nby %s:\n", title);
    for (int i = 0; i < g->n; i++)
        printf("  %-56.56s %7lld records %9lld hits\n", g->v[i].label,
               (long long)g->v[i].records, (long long)g->v[i].hits);
    if (g->other_records)
        printf("  %-56s %7lld records %9lld hits\n", "(others)",
               (long long)g->other_records, (long long)g->other_hits);
}

static int cmd_stats(stof_context *ctx, const opts *o)
{
    char buf[4096];
    const char *path = db_path(o, buf, sizeof(buf));
    if (!path) {
        err("no database path: set --db or STOF_USER_DB");
        return EXIT_USAGE;
    }
    stof_dbt_records l;
    int rc = read_records(ctx, path, &l);
    if (rc)
        return rc;
    int64_t n_miss = 0, miss_total = 0;
    stof_status st = stof__dbt_miss_counts(ctx, path, &n_miss, &miss_total);
    if (st != STOF_OK) {
        free(l.v);
        return db_error(ctx, st);
    }
    static groups by_gpu, by_op, by_mask, by_age, by_version;
    memset(&by_gpu, 0, sizeof(by_gpu));
    memset(&by_op, 0, sizeof(by_op));
    memset(&by_mask, 0, sizeof(by_mask));
    memset(&by_age, 0, sizeof(by_age));
    memset(&by_version, 0, sizeof(by_version));
    int64_t hits = 0, verified = 0, stale = 0;
    char th[17];
    snprintf(th, sizeof(th), "%016llx",
             (unsigned long long)stof_template_hash());
    time_t now = time(NULL);
    for (int i = 0; i < l.n; i++) {
        const stof_db_record *r = &l.v[i];
        char lab[300];
        snprintf(lab, sizeof(lab), "%s (cc %d.%d, %d SMs, driver %d)",
                 r->device_name, r->cc_major, r->cc_minor, r->sm_count,
                 r->driver_version);
        group_add(&by_gpu, lab, r->hits);
        group_add(&by_op, r->op, r->hits);
        mask_label(r, lab, sizeof(lab));
        group_add(&by_mask, lab, r->hits);
        double age = difftime(now, (time_t)r->created_at);
        group_add(&by_age,
                  age < 86400        ? "under 1 day"
                  : age < 7 * 86400  ? "1 to 7 days"
                  : age < 30 * 86400 ? "7 to 30 days"
                                     : "over 30 days",
                  r->hits);
        int cur = !strcmp(r->stof_version, stof_version_string()) &&
                  !strcmp(r->template_hash, th);
        snprintf(lab, sizeof(lab), "stof %s, templates %s%s", r->stof_version,
                 r->template_hash, cur ? " (this build)" : "");
        group_add(&by_version, lab, r->hits);
        stale += !cur;
        hits += r->hits;
        verified += r->verified != 0;
    }
    if (o->json) {
        printf("{\"database\":%s,\"records\":%d,\"verified\":%lld,"
               "\"hits\":%lld,\"misses\":%lld,\"miss_count\":%lld,"
               "\"other_versions\":%lld,",
               jstr(path), l.n, (long long)verified, (long long)hits,
               (long long)n_miss, (long long)miss_total, (long long)stale);
        groups_print("gpu", &by_gpu, 1, 0);
        groups_print("op", &by_op, 1, 0);
        groups_print("mask", &by_mask, 1, 0);
        groups_print("age", &by_age, 1, 0);
        groups_print("version", &by_version, 1, 1);
        printf("}\n");
    } else {
        printf("%s: %d records (%lld verified), %lld hits; %lld misses "
               "recorded (%lld times); %lld records from other stof or "
               "template versions\n",
               path, l.n, (long long)verified, (long long)hits,
               (long long)n_miss, (long long)miss_total, (long long)stale);
        groups_print("GPU", &by_gpu, 0, 0);
        groups_print("op", &by_op, 0, 0);
        groups_print("mask", &by_mask, 0, 0);
        groups_print("age", &by_age, 0, 0);
        groups_print("version", &by_version, 0, 1);
    }
    free(l.v);
    return EXIT_OK;
}

/* ------------------------------------------- export / import / merge */

typedef struct conflict_out {
    int json, n;
} conflict_out;

static void print_conflict(void *user, const stof_dbt_conflict *c)
{
    conflict_out *co = user;
    const char *why = c->winner_verified && !c->loser_verified ? "unverified"
                      : c->loser_ms > c->winner_ms             ? "slower"
                                                   : "tie, broken by content";
    if (co->json) {
        printf("%s{\"key\":%s,\"input\":%s,\"kept\":{\"kernel\":%s,"
               "\"time_ms\":%.6g,\"verified\":%s,\"host\":%s},"
               "\"dropped\":{\"kernel\":%s,\"time_ms\":%.6g,\"verified\":%s,"
               "\"host\":%s},\"reason\":%s}",
               co->n ? "," : "", jstr(c->key), jstr(c->input),
               jstr(c->winner_kernel), c->winner_ms,
               c->winner_verified ? "true" : "false", jstr(c->winner_host),
               jstr(c->loser_kernel), c->loser_ms,
               c->loser_verified ? "true" : "false", jstr(c->loser_host),
               jstr(why));
    } else {
        printf("conflict %s: kept %s %.4g ms (%s%s) over %s %.4g ms (%s%s) "
               "from %s: %s\n",
               c->key, c->winner_kernel, c->winner_ms, c->winner_host,
               c->winner_verified ? "" : ", unverified", c->loser_kernel,
               c->loser_ms, c->loser_host,
               c->loser_verified ? "" : ", unverified", c->input, why);
    }
    co->n++;
}

static int merge_like(stof_context *ctx, const opts *o, const char *what,
                      const char *dest, const char *const *inputs, int n,
                      int in_place, int with_misses)
{
    stof_dbt_filter f = {o->gpu, o->driver};
    stof_dbt_result res;
    conflict_out co = {o->json, 0};
    if (o->json)
        printf("{\"conflicts\":[");
    stof_status st =
        in_place ? stof__dbt_merge_into(ctx, dest, inputs, n, &f, with_misses,
                                        print_conflict, &co, &res)
                 : stof__dbt_write(ctx, dest, inputs, n, &f, with_misses,
                                   print_conflict, &co, &res);
    if (st != STOF_OK) {
        if (o->json)
            printf("],\"error\":%s}\n", jstr(stof_errmsg(ctx)));
        fflush(stdout);
        return st == STOF_ERR_IO ? (err("%s", stof_errmsg(ctx)), EXIT_FAIL)
                                 : db_error(ctx, st);
    }
    if (o->json)
        printf("],\"command\":%s,\"output\":%s,\"inputs\":%d,"
               "\"records_read\":%lld,\"records\":%lld,\"misses\":%lld,"
               "\"conflicting_keys\":%lld,\"dropped_records\":%lld}\n",
               jstr(what), jstr(dest), n, (long long)res.records_read,
               (long long)res.records, (long long)res.misses,
               (long long)res.conflicts, (long long)res.losers);
    else
        printf("%s: %lld records read from %d file%s; %s now holds %lld "
               "records and %lld misses; %lld conflicting key%s\n",
               what, (long long)res.records_read, n, n == 1 ? "" : "s", dest,
               (long long)res.records, (long long)res.misses,
               (long long)res.conflicts, res.conflicts == 1 ? "" : "s");
    return EXIT_OK;
}

static int cmd_export(stof_context *ctx, const opts *o)
{
    char buf[4096];
    const char *path = db_path(o, buf, sizeof(buf));
    if (!path) {
        err("no database path: set --db or STOF_USER_DB");
        return EXIT_USAGE;
    }
    if (!o->out) {
        err("export: -o OUT is required");
        return EXIT_USAGE;
    }
    const char *in[] = {path};
    return merge_like(ctx, o, "export", o->out, in, 1, 0, 0);
}

static int cmd_import(stof_context *ctx, const opts *o)
{
    char buf[4096];
    const char *path = db_path(o, buf, sizeof(buf));
    if (!path) {
        err("no database path: set --db or STOF_USER_DB");
        return EXIT_USAGE;
    }
    return merge_like(ctx, o, "import", path, o->pos, o->n_pos, 1, 1);
}

static int cmd_merge(stof_context *ctx, const opts *o)
{
    if (!o->out) {
        err("merge: -o OUT is required");
        return EXIT_USAGE;
    }
    return merge_like(ctx, o, "merge", o->out, o->pos, o->n_pos, 0, 1);
}

static int cmd_gc(stof_context *ctx, const opts *o)
{
    char buf[4096];
    const char *path = db_path(o, buf, sizeof(buf));
    if (!path) {
        err("no database path: set --db or STOF_USER_DB");
        return EXIT_USAGE;
    }
    char th[17];
    snprintf(th, sizeof(th), "%016llx",
             (unsigned long long)stof_template_hash());
    int64_t del = 0, kept = 0;
    stof_status st = stof__dbt_gc(ctx, path, stof_version_string(), th,
                                  o->dry_run, &del, &kept);
    if (st != STOF_OK)
        return db_error(ctx, st);
    if (o->json)
        printf("{\"database\":%s,\"dry_run\":%s,\"dropped\":%lld,"
               "\"kept\":%lld,\"stof_version\":%s,\"template_hash\":%s}\n",
               jstr(path), o->dry_run ? "true" : "false", (long long)del,
               (long long)kept, jstr(stof_version_string()), jstr(th));
    else
        printf("%s: %s %lld records of other stof or template versions "
               "(this build: stof %s, templates %s); %lld kept\n",
               path, o->dry_run ? "would drop" : "dropped", (long long)del,
               stof_version_string(), th, (long long)kept);
    return EXIT_OK;
}

/* ----------------------------------------------------- GPU commands */

/* One line of the summary table. */
typedef struct tune_row {
    char problem[192];
    char kernel[32], source[32], params[256], key[33];
    double time_ms, model_ms;
    int ok;
    char error[256];
} tune_row;

/* A string field of a flat JSON object ("" when absent). */
static void json_field_str(const char *js, const char *name, char *out,
                           size_t n)
{
    char pat[64];
    snprintf(pat, sizeof(pat), "\"%s\":\"", name);
    const char *a = strstr(js, pat);
    out[0] = '\0';
    if (!a)
        return;
    a += strlen(pat);
    size_t i = 0;
    while (a[i] && a[i] != '"' && i + 1 < n) {
        out[i] = a[i];
        i++;
    }
    out[i] = '\0';
}

static double json_field_num(const char *js, const char *name)
{
    char pat[64];
    snprintf(pat, sizeof(pat), "\"%s\":", name);
    const char *a = strstr(js, pat);
    if (!a)
        return 0;
    char *end;
    double v = strtod(a + strlen(pat), &end);
    return end == a + strlen(pat) ? 0 : v;
}

/* The object value of "name": {...} (flat). */
static void json_field_obj(const char *js, const char *name, char *out,
                           size_t n)
{
    char pat[64];
    snprintf(pat, sizeof(pat), "\"%s\":{", name);
    const char *a = strstr(js, pat);
    snprintf(out, n, "{}");
    if (!a)
        return;
    a += strlen(pat) - 1;
    const char *b = strchr(a, '}');
    if (!b)
        return;
    size_t len = (size_t)(b - a + 1);
    if (len >= n)
        len = n - 1;
    memcpy(out, a, len);
    out[len] = '\0';
}

static void row_from_plan(tune_row *r, const stof_plan *p)
{
    char js[8192];
    if (stof_plan_describe(p, js, sizeof(js), NULL) != STOF_OK)
        js[0] = '\0';
    json_field_str(js, "kernel", r->kernel, sizeof(r->kernel));
    json_field_str(js, "source", r->source, sizeof(r->source));
    json_field_str(js, "key", r->key, sizeof(r->key));
    json_field_obj(js, "params", r->params, sizeof(r->params));
    r->time_ms = json_field_num(js, "time_ms");
    r->model_ms = json_field_num(js, "model_choice_ms");
    r->ok = 1;
}

/* Progress: a bar on a terminal, plain lines otherwise. */
static void progress(int i, int n, const char *what, int done)
{
    if (isatty(fileno(stderr))) {
        int w = 30, fill = n ? (i * w) / n : w;
        fprintf(stderr, "\r[");
        for (int k = 0; k < w; k++)
            fputc(k < fill ? '#' : '.', stderr);
        fprintf(stderr, "] %d/%d %-60.60s", i, n, what);
        if (done)
            fputc('\n', stderr);
        fflush(stderr);
    } else if (!done) {
        fprintf(stderr, PROG ": [%d/%d] %s\n", i + 1, n, what);
    }
}

static void print_summary(const char *cmd, const tune_row *rows, int n,
                          int json)
{
    if (json) {
        printf("{\"command\":%s,\"problems\":[", jstr(cmd));
        for (int i = 0; i < n; i++) {
            const tune_row *r = &rows[i];
            printf("%s\n{\"problem\":%s,\"ok\":%s", i ? "," : "",
                   jstr(r->problem), r->ok ? "true" : "false");
            if (r->ok)
                printf(",\"key\":%s,\"kernel\":%s,\"params\":%s,"
                       "\"source\":%s,\"time_ms\":%.6g,"
                       "\"model_choice_ms\":%.6g,\"speedup\":%.4g}",
                       jstr(r->key), jstr(r->kernel), r->params,
                       jstr(r->source), r->time_ms, r->model_ms,
                       r->time_ms > 0 && r->model_ms > 0
                           ? r->model_ms / r->time_ms
                           : 1.0);
            else
                printf(",\"error\":%s}", jstr(r->error));
        }
        printf("\n]}\n");
        return;
    }
    printf("%-56s  %-14s  %9s  %8s  %s\n", "PROBLEM", "KERNEL", "TIME_MS",
           "SPEEDUP", "SOURCE");
    for (int i = 0; i < n; i++) {
        const tune_row *r = &rows[i];
        if (!r->ok) {
            printf("%-56.56s  FAILED: %s\n", r->problem, r->error);
            continue;
        }
        char sp[16];
        if (r->time_ms > 0 && r->model_ms > 0)
            snprintf(sp, sizeof(sp), "%.2fx", r->model_ms / r->time_ms);
        else
            snprintf(sp, sizeof(sp), "-");
        printf("%-56.56s  %-14s  %9.4f  %8s  %s\n", r->problem, r->kernel,
               r->time_ms, sp, r->source);
    }
}

static void base_settings(const opts *o, stof_settings *s)
{
    stof_default_settings(s);
    s->user_db = o->db; /* NULL: the default user database */
    s->tuning_mode = o->force ? STOF_TUNE_FORCE : STOF_TUNE_DEFAULT;
    s->tuning_budget_s = o->budget;
}

static int cmd_tune(stof_context *cpu, const opts *o)
{
    tw_workload w;
    tw_init(&w);
    char msg[512];
    int bad;
    if (o->n_pos == 1)
        bad = tw_parse_file(o->pos[0], &w, msg, sizeof(msg));
    else if (o->n_masks && o->n_shapes)
        bad = tw_from_args(o->masks, o->n_masks, o->shapes, o->n_shapes,
                           o->dtype, o->layout, &w, msg, sizeof(msg));
    else {
        err("tune: give a WORKLOAD file, or --mask SPEC and --shape SHAPE");
        return EXIT_USAGE;
    }
    if (bad) {
        err("%s", msg);
        tw_free(&w);
        return o->n_pos == 1 ? EXIT_FAIL : EXIT_USAGE;
    }
    /* Every mask is built before any GPU work: a bad spec fails here. */
    if (tw_check_masks(cpu, &w, msg, sizeof(msg))) {
        err("%s", msg);
        tw_free(&w);
        return o->n_pos == 1 ? EXIT_FAIL : EXIT_USAGE;
    }
    int n = tw_count(&w);
    stof_settings s;
    base_settings(o, &s);
    stof_context *ctx = NULL;
    int rc = open_gpu_ctx(&s, &ctx);
    if (rc) {
        tw_free(&w);
        return rc;
    }
    tune_row *rows = calloc((size_t)n, sizeof(*rows));
    if (!rows) {
        err("out of memory");
        stof_close(&ctx);
        tw_free(&w);
        return EXIT_FAIL;
    }
    int failed = 0;
    for (int i = 0; i < n; i++) {
        tw_problem p;
        tw_get(&w, i, &p);
        tune_row *r = &rows[i];
        tw_describe(&p, r->problem, sizeof(r->problem));
        if (!o->json)
            progress(i, n, r->problem, 0);
        stof_mask *m = NULL;
        stof_plan *plan = NULL;
        stof_attention_desc d;
        stof_status st =
            stof_mask_from_spec(ctx, p.mask, p.seq_q, p.seq_k, &m);
        if (st == STOF_OK)
            st = stof_attention_desc_init(&d, p.batch, p.heads, p.seq_q,
                                          p.seq_k, p.head_dim, p.dtype,
                                          p.layout);
        if (st == STOF_OK)
            st = stof_attention_plan(ctx, &d, m, &plan);
        if (st == STOF_OK) {
            row_from_plan(r, plan);
        } else {
            snprintf(r->error, sizeof(r->error), "%s", stof_errmsg(ctx));
            failed++;
        }
        stof_plan_free(&plan);
        stof_mask_free(&m);
    }
    if (!o->json)
        progress(n, n, "done", 1);
    print_summary("tune", rows, n, o->json);
    if (failed)
        err("%d of %d problems failed", failed, n);
    free(rows);
    stof_close(&ctx);
    tw_free(&w);
    return failed ? EXIT_FAIL : EXIT_OK;
}

/* Misses read from the user database before tuning them. */
typedef struct miss {
    char key[33];
    char *problem;
    void *bits;
    size_t nbits;
    int64_t count;
} miss;

typedef struct miss_list {
    miss *v;
    int n, cap;
} miss_list;

static int collect_miss(void *user, const char *key, const char *problem,
                        const void *bits, size_t nbits, int64_t count)
{
    miss_list *l = user;
    if (l->n == l->cap) {
        int cap = l->cap ? 2 * l->cap : 32;
        miss *v = realloc(l->v, (size_t)cap * sizeof(*v));
        if (!v)
            return 1;
        l->v = v;
        l->cap = cap;
    }
    miss *m = &l->v[l->n];
    memset(m, 0, sizeof(*m));
    snprintf(m->key, sizeof(m->key), "%s", key);
    m->problem = strdup(problem ? problem : "");
    if (nbits && (m->bits = malloc(nbits))) {
        memcpy(m->bits, bits, nbits);
        m->nbits = nbits;
    }
    m->count = count;
    l->n++;
    return 0;
}

static void miss_list_free(miss_list *l)
{
    for (int i = 0; i < l->n; i++) {
        free(l->v[i].problem);
        free(l->v[i].bits);
    }
    free(l->v);
    memset(l, 0, sizeof(*l));
}

/* Rebuild a missed problem; 0 with why set when it cannot be. */
static int miss_problem(stof_context *ctx, const miss *ms,
                        stof_attention_desc *d, stof_mask **m, char *why,
                        size_t wn)
{
    const char *js = ms->problem;
    int b = (int)json_field_num(js, "batch"), h = (int)json_field_num(js, "heads"),
        sq = (int)json_field_num(js, "seq_q"), sk = (int)json_field_num(js, "seq_k"),
        hd = (int)json_field_num(js, "head_dim");
    char dt[16], lay[16];
    json_field_str(js, "dtype", dt, sizeof(dt));
    json_field_str(js, "layout", lay, sizeof(lay));
    const int strided = !strcasecmp(lay, "strided");
    stof_layout L = !strcasecmp(lay, "BSHD") ? STOF_LAYOUT_BSHD
                                             : STOF_LAYOUT_BHSD;
    if (strcasecmp(lay, "BSHD") && strcasecmp(lay, "BHSD") && !strided) {
        snprintf(why, wn, "layout '%s' is not known", lay);
        return 0;
    }
    if (stof_attention_desc_init(d, b, h, sq, sk, hd,
                                 strcmp(dt, "bf16") ? STOF_DTYPE_FP16
                                                    : STOF_DTYPE_BF16,
                                 L) != STOF_OK || sq < 1 || sk < 1) {
        snprintf(why, wn, "unreadable problem %s", js);
        return 0;
    }
    if (strided) {
        /* Strided misses carry their strides (q_s0 .. o_s2). */
        static const char *const names[4] = {"q", "k", "v", "o"};
        int64_t *dst[4] = {d->q_stride, d->k_stride, d->v_stride, d->o_stride};
        for (int t = 0; t < 4; t++)
            for (int i = 0; i < 3; i++) {
                char f[8];
                snprintf(f, sizeof(f), "%s_s%d", names[t], i);
                if (!strstr(js, f)) {
                    snprintf(why, wn, "strided layout recorded without "
                                      "strides");
                    return 0;
                }
                dst[t][i] = (int64_t)json_field_num(js, f);
            }
        d->layout = STOF_LAYOUT_STRIDED;
    }
    d->scale = (float)json_field_num(js, "scale");
    /* From its spec when it had one (so the tuned record keeps the spec
     * and `verify` can rebuild it), checked against the recorded digest;
     * else from the recorded bits. */
    char spec[256] = "", digest[40] = "";
    json_field_str(js, "mask_spec", spec, sizeof(spec));
    json_field_str(js, "mask_digest", digest, sizeof(digest));
    if (spec[0] && stof_mask_from_spec(ctx, spec, sq, sk, m) == STOF_OK) {
        char hex[33];
        stof_mask_digest(*m, NULL, hex);
        if (!strcmp(hex, digest))
            return 1;
        stof_mask_free(m);
    }
    size_t wpr = ((size_t)sk + 63) / 64;
    if (!ms->bits || ms->nbits != (size_t)sq * wpr * 8) {
        snprintf(why, wn, "no mask recorded for it");
        return 0;
    }
    if (stof__mask_alloc(ctx, sq, sk, m) != STOF_OK) {
        snprintf(why, wn, "%s", stof_errmsg(ctx));
        return 0;
    }
    memcpy((*m)->bits, ms->bits, ms->nbits);
    stof__mask_recount(*m);
    return 1;
}

static int cmd_pending(stof_context *cpu, const opts *o)
{
    char buf[4096];
    const char *path = db_path(o, buf, sizeof(buf));
    if (!path) {
        err("no database path: set --db or STOF_USER_DB");
        return EXIT_USAGE;
    }
    stof_status st = stof__dbt_check(cpu, path);
    if (st != STOF_OK)
        return db_error(cpu, st);
    stof_settings s;
    base_settings(o, &s);
    s.user_db = path;
    stof_context *ctx = NULL;
    int rc = open_gpu_ctx(&s, &ctx);
    if (rc)
        return rc;
    stof_db *db = NULL;
    miss_list ml = {0};
    st = stof__db_open(ctx, path, NULL, &db);
    if (st == STOF_OK && !stof__db_writable(db))
        st = stof__fail(ctx, STOF_ERR_DATABASE, "%s is not writable", path);
    if (st == STOF_OK)
        st = stof__db_foreach_miss(db, collect_miss, &ml);
    if (st != STOF_OK) {
        rc = db_error(ctx, st);
        stof__db_close(&db);
        miss_list_free(&ml);
        stof_close(&ctx);
        return rc;
    }
    tune_row *rows = calloc((size_t)ml.n + 1, sizeof(*rows));
    int failed = 0, skipped = 0;
    for (int i = 0; rows && i < ml.n; i++) {
        tune_row *r = &rows[i];
        stof_attention_desc d;
        stof_mask *m = NULL;
        char why[256] = "";
        snprintf(r->problem, sizeof(r->problem), "miss %.12s (%lld times)",
                 ml.v[i].key, (long long)ml.v[i].count);
        if (!o->json)
            progress(i, ml.n, r->problem, 0);
        if (!miss_problem(ctx, &ml.v[i], &d, &m, why, sizeof(why))) {
            snprintf(r->error, sizeof(r->error), "skipped: %s", why);
            skipped++;
            continue;
        }
        snprintf(r->problem, sizeof(r->problem), "%dx%dx%dx%dx%d %s mask %.12s",
                 d.batch, d.heads, d.seq_q, d.seq_k, d.head_dim,
                 d.dtype == STOF_DTYPE_BF16 ? "bf16" : "fp16", ml.v[i].key);
        char hex[33], key[33];
        stof_mask_digest(m, NULL, hex);
        stof__attention_key(ctx, &d, hex, key, NULL, 0);
        if (strcmp(key, ml.v[i].key)) {
            snprintf(r->error, sizeof(r->error),
                     "skipped: recorded on another GPU, driver or build");
            skipped++;
            stof_mask_free(&m);
            continue;
        }
        stof_plan *plan = NULL;
        if (stof_attention_plan(ctx, &d, m, &plan) == STOF_OK) {
            row_from_plan(r, plan);
            if (strcmp(r->source, "fallback"))
                (void)stof__db_delete_miss(db, ml.v[i].key);
        } else {
            snprintf(r->error, sizeof(r->error), "%s", stof_errmsg(ctx));
            failed++;
        }
        stof_plan_free(&plan);
        stof_mask_free(&m);
    }
    if (!o->json && ml.n)
        progress(ml.n, ml.n, "done", 1);
    if (rows)
        print_summary("pending", rows, ml.n, o->json);
    if (!o->json)
        fprintf(stderr, PROG ": %d misses: %d tuned, %d skipped, %d failed\n",
                ml.n, ml.n - skipped - failed, skipped, failed);
    free(rows);
    stof__db_close(&db);
    miss_list_free(&ml);
    stof_close(&ctx);
    return failed ? EXIT_FAIL : EXIT_OK;
}

static int cmd_verify(stof_context *cpu, const opts *o)
{
    char buf[4096];
    const char *path = db_path(o, buf, sizeof(buf));
    if (!path) {
        err("no database path: set --db or STOF_USER_DB");
        return EXIT_USAGE;
    }
    stof_status st = stof__dbt_check(cpu, path);
    if (st != STOF_OK)
        return db_error(cpu, st);
    return tv_verify(cpu, path, o->drop, o->json, open_gpu_ctx);
}

/* ------------------------------------------------------------- driver */

typedef struct command {
    const char *name;
    int (*fn)(stof_context *, const opts *);
    const char *allowed; /* option names, space separated */
    int min_pos, max_pos;
    const char *usage;
} command;

static const command commands[] = {
    {"tune", cmd_tune, "db mask shape dtype layout force budget json", 0, 1,
     "usage: stof-tune tune WORKLOAD [options]\n"
     "       stof-tune tune --mask SPEC --shape SHAPE [options]\n"
     "\n"
     "Tune every problem of a workload file (masks x shapes x dtypes x\n"
     "layouts; format in examples/suite.workload) into the user database\n"
     "or --db, then print a table: problem, kernel, time, speed-up over the\n"
     "cost model's first choice, source (tuned, user db, system db).\n"
     "\n"
     "  --mask SPEC      a mask spec (repeatable), e.g. sliding:256\n"
     "  --shape SHAPE    BxHxNxD or BxHxSQxSKxD (repeatable)\n"
     "  --dtype T        fp16 (default) or bf16\n"
     "  --layout L       bhsd (default) or bshd\n"
     "  --db PATH        the database to tune into (default: user database)\n"
     "  --force          re-tune problems already in the database\n"
     "  --budget S       tuning budget per problem in seconds (0: none)\n"
     "  --json           print the summary as JSON\n"},
    {"pending", cmd_pending, "db force budget json", 0, 0,
     "usage: stof-tune pending [--db PATH] [--json]\n"
     "\n"
     "Tune the misses that cache-only runs (STOF_TUNE_CACHE_ONLY) recorded\n"
     "in the user database (or --db), and drop each miss once its problem\n"
     "has a record. Misses recorded on another GPU, driver or build are\n"
     "skipped and kept.\n"},
    {"ls", cmd_ls, "db gpu driver json", 0, 0,
     "usage: stof-tune ls [--db PATH] [--gpu NAME] [--driver N] [--json]\n"
     "\n"
     "List the records of a database: key, GPU, mask, shape, dtype, kernel,\n"
     "time, speed-up over the model's choice, age, hits.\n"},
    {"show", cmd_show, "db json", 1, 1,
     "usage: stof-tune show KEY [--db PATH] [--json]\n"
     "\n"
     "Print one record in full. KEY may be a unique prefix.\n"},
    {"stats", cmd_stats, "db json", 0, 0,
     "usage: stof-tune stats [--db PATH] [--json]\n"
     "\n"
     "What a database holds, by GPU, op, mask, age and version, with hit\n"
     "counts and the recorded misses.\n"},
    {"export", cmd_export, "db out gpu driver json", 0, 0,
     "usage: stof-tune export -o OUT [--db PATH] [--gpu NAME] [--driver N]\n"
     "                        [--json]\n"
     "\n"
     "Write the records of the user database (or --db), optionally only\n"
     "those of one GPU (device name, case-insensitive) and driver version\n"
     "(e.g. 13000), into a new database file OUT (replaced atomically).\n"
     "Misses are not exported.\n"},
    {"import", cmd_import, "db gpu driver json", 1, 255,
     "usage: stof-tune import FILE... [--db PATH] [--gpu NAME] [--driver N]\n"
     "                        [--json]\n"
     "\n"
     "Merge database files into the user database (or --db) in place, by\n"
     "the merge rule (see merge); misses are merged too.\n"},
    {"merge", cmd_merge, "out gpu driver json", 1, 255,
     "usage: stof-tune merge A B ... -o OUT [--json]\n"
     "\n"
     "Merge databases into a new file OUT (replaced atomically). Per key the\n"
     "fastest verified record wins; ties are broken by a total order on the\n"
     "record's content, so merge is commutative and idempotent. Hits take\n"
     "the maximum, misses are merged by key. Every input record that lost\n"
     "to a different record is reported as a conflict.\n"},
    {"verify", cmd_verify, "db drop json", 0, 0,
     "usage: stof-tune verify [--db PATH] [--drop] [--json]\n"
     "\n"
     "Re-check every record made for this GPU, driver and build: load its\n"
     "kernel, run it on random inputs and compare with the C reference.\n"
     "Bad records are reported, and deleted with --drop. Records without a\n"
     "mask spec cannot be rebuilt and are skipped.\n"},
    {"gc", cmd_gc, "db dry-run json", 0, 0,
     "usage: stof-tune gc [--db PATH] [--dry-run] [--json]\n"
     "\n"
     "Delete the records made by another stof version or another set of\n"
     "kernel templates (they can never match this build).\n"},
};
#define N_COMMANDS (int)(sizeof(commands) / sizeof(*commands))

static const char exit_text[] =
    "\nexit status: 0 ok; 1 failure (bad input file, a problem or record\n"
    "failed); 2 usage error; 3 no GPU found; 4 database error (missing,\n"
    "unreadable, foreign or newer-schema database, or a failed write).\n";

static void usage_main(FILE *f)
{
    fprintf(f,
            "usage: stof-tune COMMAND [options]   (stof-tune COMMAND --help)\n"
            "\n"
            "Prebuild stof tuning databases and share them across hosts.\n"
            "\n"
            "commands:\n"
            "  tune WORKLOAD    tune a workload file (or --mask/--shape)\n"
            "  pending          tune the misses of cache-only runs\n"
            "  ls               list the records of a database\n"
            "  show KEY         one record in full\n"
            "  stats            counts by GPU, op, mask, age; hits, misses\n"
            "  export -o OUT    copy records (--gpu, --driver) to a new file\n"
            "  import FILE...   merge files into the user database\n"
            "  merge A B... -o OUT  merge files into a new file\n"
            "  verify           re-check this GPU's records\n"
            "  gc               drop records of other stof/template versions\n"
            "\n"
            "common options: --db PATH (default: $STOF_USER_DB, else\n"
            "$XDG_CACHE_HOME/stof/tuning.db, else ~/.cache/stof/tuning.db),\n"
            "--json, -h/--help, --version.\n"
            "%s",
            exit_text);
}

/* Does the space-separated list contain name? */
static int allowed(const char *list, const char *name)
{
    size_t n = strlen(name);
    for (const char *p = list; *p;) {
        const char *e = strchr(p, ' ');
        size_t len = e ? (size_t)(e - p) : strlen(p);
        if (len == n && !strncmp(p, name, n))
            return 1;
        if (!e)
            break;
        p = e + 1;
    }
    return 0;
}

static int parse_opts(const command *c, int argc, char **argv, opts *o)
{
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            o->help = 1;
            continue;
        }
        if (!strcmp(a, "--")) {
            for (i++; i < argc; i++)
                if (o->n_pos < 255)
                    o->pos[o->n_pos++] = argv[i];
            break;
        }
        if (a[0] != '-' || !a[1]) {
            if (o->n_pos == 255) {
                err("%s: too many arguments", c->name);
                return 0;
            }
            o->pos[o->n_pos++] = a;
            continue;
        }
        char name[32];
        const char *val = NULL;
        if (!strcmp(a, "-o")) {
            snprintf(name, sizeof(name), "out");
        } else if (a[1] == '-') {
            const char *eq = strchr(a, '=');
            size_t len = eq ? (size_t)(eq - a - 2) : strlen(a + 2);
            if (len >= sizeof(name))
                len = sizeof(name) - 1;
            memcpy(name, a + 2, len);
            name[len] = '\0';
            if (eq)
                val = eq + 1;
            if (!strcmp(name, "output"))
                snprintf(name, sizeof(name), "out");
        } else {
            err("%s: unknown option '%s' (see stof-tune %s --help)", c->name,
                a, c->name);
            return 0;
        }
        if (!allowed(c->allowed, name)) {
            err("%s: unknown option '%s' (see stof-tune %s --help)", c->name,
                a, c->name);
            return 0;
        }
        int flag = !strcmp(name, "json") || !strcmp(name, "force") ||
                   !strcmp(name, "dry-run") || !strcmp(name, "drop");
        if (flag) {
            if (val) {
                err("%s: option --%s takes no value", c->name, name);
                return 0;
            }
            o->json |= !strcmp(name, "json");
            o->force |= !strcmp(name, "force");
            o->dry_run |= !strcmp(name, "dry-run");
            o->drop |= !strcmp(name, "drop");
            continue;
        }
        if (!val) {
            if (i + 1 >= argc) {
                err("%s: option '%s' needs a value", c->name, a);
                return 0;
            }
            val = argv[++i];
        }
        if (!strcmp(name, "db"))
            o->db = val;
        else if (!strcmp(name, "out"))
            o->out = val;
        else if (!strcmp(name, "gpu"))
            o->gpu = val;
        else if (!strcmp(name, "dtype"))
            o->dtype = val;
        else if (!strcmp(name, "layout"))
            o->layout = val;
        else if (!strcmp(name, "mask") || !strcmp(name, "shape")) {
            int is_mask = name[0] == 'm';
            int *n = is_mask ? &o->n_masks : &o->n_shapes;
            if (*n == 64) {
                err("%s: too many --%s options (64 at most)", c->name, name);
                return 0;
            }
            (is_mask ? o->masks : o->shapes)[(*n)++] = val;
        } else if (!strcmp(name, "driver") || !strcmp(name, "budget")) {
            char *end;
            errno = 0;
            double v = strtod(val, &end);
            if (!*val || *end || errno || v < 0 || v > 1e9 ||
                (name[0] == 'd' && v != floor(v))) {
                err("%s: --%s: '%s' is not a %s", c->name, name, val,
                    name[0] == 'd' ? "driver version such as 13000"
                                   : "number of seconds");
                return 0;
            }
            if (name[0] == 'd')
                o->driver = (int)v;
            else
                o->budget = v;
        }
    }
    if (o->help)
        return 1;
    if (o->n_pos < c->min_pos || o->n_pos > c->max_pos) {
        err("%s: expected %s%d argument%s, got %d (see stof-tune %s --help)",
            c->name, c->min_pos == c->max_pos ? "" : "at least ", c->min_pos,
            c->min_pos == 1 ? "" : "s", o->n_pos, c->name);
        return 0;
    }
    return 1;
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        usage_main(stderr);
        return EXIT_USAGE;
    }
    const char *name = argv[1];
    if (!strcmp(name, "-h") || !strcmp(name, "--help") ||
        !strcmp(name, "help")) {
        if (argc > 2 && strcmp(name, "help") == 0) {
            for (int i = 0; i < N_COMMANDS; i++)
                if (!strcmp(argv[2], commands[i].name)) {
                    printf("%s%s", commands[i].usage, exit_text);
                    return EXIT_OK;
                }
        }
        usage_main(stdout);
        return EXIT_OK;
    }
    if (!strcmp(name, "--version")) {
        printf("stof-tune %s (database schema %d)\n", stof_version_string(),
               STOF_DB_SCHEMA_VERSION);
        return EXIT_OK;
    }
    const command *c = NULL;
    for (int i = 0; i < N_COMMANDS; i++)
        if (!strcmp(name, commands[i].name))
            c = &commands[i];
    if (!c) {
        err("unknown command '%s' (see stof-tune --help)", name);
        return EXIT_USAGE;
    }
    static opts o;
    o.cmd = c->name;
    if (!parse_opts(c, argc - 2, argv + 2, &o))
        return EXIT_USAGE;
    if (o.help) {
        printf("%s%s", c->usage, exit_text);
        return EXIT_OK;
    }
    stof_context *ctx = open_cpu_ctx();
    if (!ctx) {
        err("out of memory");
        return EXIT_FAIL;
    }
    int rc = c->fn(ctx, &o);
    fflush(stdout);
    if (ferror(stdout)) {
        err("cannot write the output: %s", strerror(errno));
        rc = rc ? rc : EXIT_FAIL;
    }
    stof_close(&ctx);
    return rc;
}
