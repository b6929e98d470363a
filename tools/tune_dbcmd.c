/*
 * tune_dbcmd.c - the stof-tune commands on database files: ls, show,
 * stats, export, import, merge and gc. Reading never writes beside a file
 * (a WAL database in a read-only directory reads fine); writing goes
 * through db_tools.h, which checks every record and replaces files safely.
 * Everything printed from a database is escaped for the terminal; --json
 * output is one document per command, built as jansson values and written
 * by print_json (tune_text.h).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include "db.h"
#include "db_tools.h"
#include "internal.h"
#include "record_check.h"
#include "tune_cli.h"
#include "tune_text.h"

/* Read every record of the database file at path (checked first), each
 * with its verdict (stof__record_check). */
static int read_records(stof_context *ctx, const char *path,
                        stof_dbt_records *l)
{
    memset(l, 0, sizeof(*l));
    l->check = stof__record_check;
    stof_status st = stof__dbt_check(STOF_DB_SINK(ctx), path);
    if (st != STOF_OK)
        return fail_with(ctx, st);
    const char *sys[] = {path, NULL};
    stof_db *db = NULL;
    st = stof__db_open(STOF_DB_SINK(ctx), "", sys, &db);
    if (st == STOF_OK)
        st = stof__db_foreach(db, 1, stof__dbt_collect, l);
    stof__db_close(&db);
    if (st != STOF_OK) {
        stof__dbt_records_free(l);
        return fail_with(ctx, st);
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

/* A record as a JSON object, with its verdict (why: "" when valid); NULL
 * when out of memory. Text fields are strings whatever they hold ("config"
 * and "measured" are JSON text, kept as the strings they are stored as). */
/* A record's sizes for `ls`: an attention problem's BxHxSQxSKxD (a layer's
 * too: its batch, heads, sequence and head_dim), a layer GEMM's M x N x K,
 * a layer norm's rows x hidden. */
static void shape_label(const stof_db_record *r, char *buf, size_t n)
{
    if (!strcmp(r->op, "gemm"))
        snprintf(buf, n, "%dx%dx%d MNK", r->batch, r->seq_q, r->seq_k);
    else if (!strcmp(r->op, "norm"))
        snprintf(buf, n, "%dx%d rows", r->batch, r->seq_q);
    else
        snprintf(buf, n, "%dx%dx%dx%dx%d", r->batch, r->heads, r->seq_q,
                 r->seq_k, r->head_dim);
}

static json_t *record_json(const stof_db_record *r, const char *why)
{
    char cc[32];
    snprintf(cc, sizeof(cc), "%d.%d", r->cc_major, r->cc_minor);
    return json_pack(
        "{s:o, s:o, s:o, s:o, s:i, s:i, s:i, s:i, s:i, s:o, s:o,"
        " s:o, s:s, s:i, s:i, s:o, s:o, s:o,"
        " s:o, s:o, s:o, s:I, s:o, s:o, s:o, s:i, s:b, s:o, s:I, s:o, s:I,"
        " s:o, s:b, s:o}",
        "key", tt_jstr(r->key), "op", tt_jstr(r->op), "mask_digest",
        tt_jstr(r->mask_digest), "mask_spec", tt_jstr(r->mask_spec), "batch",
        r->batch, "heads", r->heads, "seq_q", r->seq_q, "seq_k", r->seq_k,
        "head_dim", r->head_dim, "dtype", tt_jstr(r->dtype), "layout",
        tt_jstr(r->layout),
        "device_name", tt_jstr(r->device_name), "cc", cc, "sm_count",
        r->sm_count, "driver_version", r->driver_version, "nvrtc_version",
        tt_jstr(r->nvrtc_version), "stof_version", tt_jstr(r->stof_version),
        "template_hash", tt_jstr(r->template_hash),
        "kernel", tt_jstr(r->kernel), "config", tt_jstr(r->config), "arch",
        tt_jstr(r->arch), "cubin_bytes", (json_int_t)r->cubin_size,
        "time_ms", tt_jnum(r->time_ms, 6), "runner_up_ms",
        tt_jnum(r->runner_up_ms, 6), "model_ms", tt_jnum(r->model_ms, 6),
        "n_candidates", r->n_candidates, "verified", r->verified != 0,
        "measured", tt_jstr(r->measured), "created_at",
        (json_int_t)r->created_at, "host", tt_jstr(r->host), "hits",
        (json_int_t)r->hits, "content_hash", tt_jstr(r->content_hash),
        "valid", !why[0], "invalid_why", why[0] ? tt_jstr(why) : json_null());
}

/* ------------------------------------------------------------ ls/show */

static int gpu_matches(const opts *o, const stof_db_record *r)
{
    return (!o->gpu || !strcasecmp(o->gpu, r->device_name)) &&
           (!o->driver || o->driver == r->driver_version);
}

int cmd_ls(stof_context *ctx, const opts *o)
{
    char buf[4096];
    const char *path = db_path(o, buf, sizeof(buf));
    if (!path)
        return EXIT_USAGE;
    stof_dbt_records l;
    int rc = read_records(ctx, path, &l);
    if (rc)
        return rc;
    if (o->json) {
        json_t *list = json_array();
        for (int i = 0; list && i < l.n; i++) {
            if (!gpu_matches(o, &l.v[i]))
                continue;
            if (json_array_append_new(list, record_json(&l.v[i], l.why[i]))) {
                json_decref(list);
                list = NULL;
            }
        }
        rc = print_json(list);
    } else {
        printf("%-12s  %-24s  %-24s  %-20s  %-5s  %-14s  %9s  %7s  %5s  %5s\n",
               "KEY", "GPU", "MASK", "SHAPE BxHxSQxSKxD", "DTYPE", "KERNEL",
               "TIME_MS", "SPEEDUP", "AGE", "HITS");
        int shown = 0, invalid = 0;
        for (int i = 0; i < l.n; i++) {
            const stof_db_record *r = &l.v[i];
            if (!gpu_matches(o, r))
                continue;
            char mask[300], shape[64], age[16], sp[16];
            mask_label(r, mask, sizeof(mask));
            shape_label(r, shape, sizeof(shape));
            age_str(r->created_at, age, sizeof(age));
            if (r->time_ms > 0 && r->model_ms > 0)
                snprintf(sp, sizeof(sp), "%.2fx", r->model_ms / r->time_ms);
            else
                snprintf(sp, sizeof(sp), "-");
            printf("%-12.12s  %-24.24s  %-24.24s  %-20s  %-5.5s  %-14.14s  "
                   "%9.4f  %7s  %5s  %5lld%s%s\n",
                   tt_term(r->key), tt_term(r->device_name), tt_term(mask),
                   shape, tt_term(r->dtype), tt_term(r->kernel), r->time_ms,
                   sp, age, (long long)r->hits,
                   r->verified ? "" : "  (unverified)",
                   l.why[i][0] ? "  INVALID" : "");
            tt_release();
            shown++;
            invalid += l.why[i][0] != 0;
        }
        printf("%d record%s in %s", shown, shown == 1 ? "" : "s",
               tt_term(path));
        if (invalid)
            printf("; %d INVALID (never used; `stof-tune show KEY` says why)",
                   invalid);
        printf("\n");
        tt_release();
    }
    stof__dbt_records_free(&l);
    return rc;
}

int cmd_show(stof_context *ctx, const opts *o)
{
    char buf[4096];
    const char *path = db_path(o, buf, sizeof(buf));
    if (!path)
        return EXIT_USAGE;
    const char *key = o->pos[0];
    size_t kn = strlen(key);
    if (!kn) {
        err("show: give a key or a prefix of one (see stof-tune ls)");
        return EXIT_USAGE;
    }
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
        rc = print_json(record_json(&l.v[found], l.why[found]));
    } else {
        const stof_db_record *r = &l.v[found];
        char age[16];
        age_str(r->created_at, age, sizeof(age));
        printf("key           %s\nop            %s\nmask          %s\n"
               "mask digest   %s\nproblem       batch %d, heads %d, seq_q %d, "
               "seq_k %d, head_dim %d, %s, tuned with %s\n",
               tt_term(r->key), tt_term(r->op),
               r->mask_spec[0] ? tt_term(r->mask_spec) : "(no spec)",
               tt_term(r->mask_digest), r->batch, r->heads, r->seq_q,
               r->seq_k, r->head_dim, tt_term(r->dtype), tt_term(r->layout));
        printf("device        %s (cc %d.%d, %d SMs), driver %d, NVRTC %s\n"
               "built by      stof %s, templates %s\n",
               tt_term(r->device_name), r->cc_major, r->cc_minor, r->sm_count,
               r->driver_version, tt_term(r->nvrtc_version),
               tt_term(r->stof_version), tt_term(r->template_hash));
        printf("kernel        %s %s (%s, cubin %zu bytes)\n"
               "time          %.6g ms (runner-up %.6g ms, model's choice "
               "%.6g ms), %d candidates timed, %s\n"
               "measured      %s\ncreated       %lld (%s ago) on %s\n"
               "hits          %lld\ncontent hash  %s\nvalid         %s%s\n",
               tt_term(r->kernel), tt_term(r->config), tt_term(r->arch),
               r->cubin_size, r->time_ms, r->runner_up_ms, r->model_ms,
               r->n_candidates, r->verified ? "verified" : "NOT verified",
               tt_term(r->measured), (long long)r->created_at, age,
               tt_term(r->host), (long long)r->hits,
               tt_term(r->content_hash),
               l.why[found][0] ? "NO: " : "yes",
               l.why[found][0] ? tt_term(l.why[found]) : "");
        tt_release();
    }
    stof__dbt_records_free(&l);
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

/* A group list as JSON: [{"name", "records", "hits"}, ...] (the labels
 * past the first 256 are left out, as in the table); NULL when out of
 * memory. */
static json_t *groups_json(const groups *g)
{
    json_t *list = json_array();
    for (int i = 0; list && i < g->n; i++)
        if (json_array_append_new(
                list, json_pack("{s:o, s:I, s:I}", "name",
                                tt_jstr(g->v[i].label), "records",
                                (json_int_t)g->v[i].records, "hits",
                                (json_int_t)g->v[i].hits))) {
            json_decref(list);
            list = NULL;
        }
    return list;
}

static void groups_print(const char *title, const groups *g)
{
    printf("\nby %s:\n", title);
    for (int i = 0; i < g->n; i++)
        printf("  %-56.56s %7lld records %9lld hits\n", tt_term(g->v[i].label),
               (long long)g->v[i].records, (long long)g->v[i].hits);
    tt_release();
    if (g->other_records)
        printf("  %-56s %7lld records %9lld hits\n", "(others)",
               (long long)g->other_records, (long long)g->other_hits);
}

int cmd_stats(stof_context *ctx, const opts *o)
{
    char buf[4096];
    const char *path = db_path(o, buf, sizeof(buf));
    if (!path)
        return EXIT_USAGE;
    stof_dbt_records l;
    int rc = read_records(ctx, path, &l);
    if (rc)
        return rc;
    int64_t n_miss = 0, miss_total = 0;
    stof_status st = stof__dbt_miss_counts(STOF_DB_SINK(ctx), path, &n_miss, &miss_total);
    if (st != STOF_OK) {
        stof__dbt_records_free(&l);
        return fail_with(ctx, st);
    }
    static groups by_gpu, by_op, by_mask, by_age, by_version;
    memset(&by_gpu, 0, sizeof(by_gpu));
    memset(&by_op, 0, sizeof(by_op));
    memset(&by_mask, 0, sizeof(by_mask));
    memset(&by_age, 0, sizeof(by_age));
    memset(&by_version, 0, sizeof(by_version));
    int64_t hits = 0, verified = 0, stale = 0, invalid = 0;
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
        invalid += l.why[i][0] != 0;
    }
    if (o->json) {
        rc = print_json(json_pack(
            "{s:o, s:i, s:I, s:I, s:I, s:I, s:I, s:I, s:o, s:o, s:o, s:o,"
            " s:o}",
            "database", tt_jstr(path), "records", l.n, "verified",
            (json_int_t)verified, "hits", (json_int_t)hits, "misses",
            (json_int_t)n_miss, "miss_count", (json_int_t)miss_total,
            "other_versions", (json_int_t)stale, "invalid",
            (json_int_t)invalid, "gpu", groups_json(&by_gpu), "op",
            groups_json(&by_op), "mask", groups_json(&by_mask), "age",
            groups_json(&by_age), "version", groups_json(&by_version)));
    } else {
        printf("%s: %d records (%lld verified, %lld invalid), %lld hits; "
               "%lld misses recorded (%lld times); %lld records from other "
               "stof or template versions\n",
               tt_term(path), l.n, (long long)verified, (long long)invalid,
               (long long)hits, (long long)n_miss, (long long)miss_total,
               (long long)stale);
        tt_release();
        groups_print("GPU", &by_gpu);
        groups_print("op", &by_op);
        groups_print("mask", &by_mask);
        groups_print("age", &by_age);
        groups_print("version", &by_version);
    }
    stof__dbt_records_free(&l);
    return rc;
}

/* ------------------------------------------- export / import / merge */

/* What the callbacks of a merge gather: with --json the conflicts (an
 * array, NULL once building it ran out of memory), printed in one
 * document when the merge ends. */
typedef struct merge_out {
    int json, n_conflicts, n_rejected;
    json_t *conflicts;
} merge_out;

static void print_conflict(void *user, const stof_dbt_conflict *c)
{
    merge_out *mo = user;
    const char *why = c->winner_verified && !c->loser_verified ? "unverified"
                      : c->loser_ms > c->winner_ms             ? "slower"
                                                   : "tie, broken by content";
    if (mo->json) {
        json_t *one = json_pack(
            "{s:o, s:o, s:{s:o, s:o, s:b, s:o}, s:{s:o, s:o, s:b, s:o}, s:s}",
            "key", tt_jstr(c->key), "input", tt_jstr(c->input), "kept",
            "kernel", tt_jstr(c->winner_kernel), "time_ms",
            tt_jnum(c->winner_ms, 6), "verified", c->winner_verified != 0,
            "host", tt_jstr(c->winner_host), "dropped", "kernel",
            tt_jstr(c->loser_kernel), "time_ms", tt_jnum(c->loser_ms, 6),
            "verified", c->loser_verified != 0, "host",
            tt_jstr(c->loser_host), "reason", why);
        if (json_array_append_new(mo->conflicts, one)) {
            json_decref(mo->conflicts);
            mo->conflicts = NULL;
        }
    } else {
        printf("conflict %s: kept %s %.4g ms (%s%s) over %s %.4g ms (%s%s) "
               "from %s: %s\n",
               tt_term(c->key), tt_term(c->winner_kernel), c->winner_ms,
               tt_term(c->winner_host),
               c->winner_verified ? "" : ", unverified",
               tt_term(c->loser_kernel), c->loser_ms, tt_term(c->loser_host),
               c->loser_verified ? "" : ", unverified", tt_term(c->input),
               why);
        tt_release();
    }
    mo->n_conflicts++;
}

/* Invalid records go to stderr (they are not part of the result); with
 * --json the document counts them ("invalid_records"). */
static void print_reject(void *user, const char *input, const char *key,
                         const char *why)
{
    merge_out *mo = user;
    err("invalid record %s in %s: %s", key, input, why);
    mo->n_rejected++;
}

static void print_note(void *user, const char *msg)
{
    (void)user;
    err("note: %s", msg);
}

static int merge_like(stof_context *ctx, const opts *o, const char *what,
                      const char *dest, const char *const *inputs, int n,
                      int in_place, int with_misses)
{
    merge_out mo = {o->json, 0, 0, o->json ? json_array() : NULL};
    stof_dbt_opts dopts = {
        .filter = {o->gpu, o->driver},
        .with_misses = with_misses,
        .check = stof__record_check,
        .drop_invalid = o->drop_invalid,
        .on_conflict = print_conflict,
        .on_reject = print_reject,
        .on_tmp = cli_tmp,
        .on_note = print_note,
        .user = &mo,
    };
    stof_dbt_result res;
    stof_status st =
        in_place ? stof__dbt_merge_into(STOF_DB_SINK(ctx), dest, inputs, n, &dopts, &res)
                 : stof__dbt_write(STOF_DB_SINK(ctx), dest, inputs, n, &dopts, &res);
    if (st != STOF_OK) {
        /* The document still comes first, with the conflicts seen before
         * the failure and the error; the exit code is the failure's. */
        if (o->json)
            (void)print_json(json_pack("{s:o, s:o}", "conflicts",
                                       mo.conflicts, "error",
                                       tt_jstr(stof_errmsg(ctx))));
        fflush(stdout);
        if (mo.n_rejected && !o->drop_invalid) {
            err("%s: nothing was written: %d invalid record%s (above); "
                "--drop-invalid leaves them out",
                what, mo.n_rejected, mo.n_rejected == 1 ? "" : "s");
            return EXIT_DB;
        }
        return fail_with(ctx, st);
    }
    if (o->json)
        return print_json(json_pack(
            "{s:o, s:s, s:o, s:i, s:I, s:I, s:I, s:I, s:I, s:I}", "conflicts",
            mo.conflicts, "command", what, "output", tt_jstr(dest), "inputs",
            n, "records_read", (json_int_t)res.records_read, "records",
            (json_int_t)res.records, "misses", (json_int_t)res.misses,
            "conflicting_keys", (json_int_t)res.conflicts, "dropped_records",
            (json_int_t)res.losers, "invalid_records",
            (json_int_t)res.rejected));
    printf("%s: %lld records read from %d file%s%s; %s now holds %lld "
           "records and %lld misses; %lld conflicting key%s\n",
           what, (long long)res.records_read, n, n == 1 ? "" : "s",
           res.rejected ? " (invalid ones left out)" : "", tt_term(dest),
           (long long)res.records, (long long)res.misses,
           (long long)res.conflicts, res.conflicts == 1 ? "" : "s");
    tt_release();
    return EXIT_OK;
}

int cmd_export(stof_context *ctx, const opts *o)
{
    char buf[4096];
    const char *path = db_path(o, buf, sizeof(buf));
    if (!path)
        return EXIT_USAGE;
    if (!o->out) {
        err("export: -o OUT is required");
        return EXIT_USAGE;
    }
    const char *in[] = {path};
    return merge_like(ctx, o, "export", o->out, in, 1, 0, 0);
}

int cmd_import(stof_context *ctx, const opts *o)
{
    char buf[4096];
    const char *path = db_path(o, buf, sizeof(buf));
    if (!path)
        return EXIT_USAGE;
    return merge_like(ctx, o, "import", path, o->pos, o->n_pos, 1, 1);
}

int cmd_merge(stof_context *ctx, const opts *o)
{
    if (!o->out) {
        err("merge: -o OUT is required");
        return EXIT_USAGE;
    }
    return merge_like(ctx, o, "merge", o->out, o->pos, o->n_pos, 0, 1);
}

int cmd_gc(stof_context *ctx, const opts *o)
{
    char buf[4096];
    const char *path = db_path(o, buf, sizeof(buf));
    if (!path)
        return EXIT_USAGE;
    char th[17];
    snprintf(th, sizeof(th), "%016llx",
             (unsigned long long)stof_template_hash());
    int64_t del = 0, kept = 0;
    stof_status st = stof__dbt_gc(STOF_DB_SINK(ctx), path, stof_version_string(), th,
                                  o->dry_run, &del, &kept);
    if (st != STOF_OK)
        return fail_with(ctx, st);
    if (o->json)
        return print_json(json_pack(
            "{s:o, s:b, s:I, s:I, s:o, s:o}", "database", tt_jstr(path),
            "dry_run", o->dry_run != 0, "dropped", (json_int_t)del, "kept",
            (json_int_t)kept, "stof_version", tt_jstr(stof_version_string()),
            "template_hash", tt_jstr(th)));
    printf("%s: %s %lld records of other stof or template versions "
           "(this build: stof %s, templates %s); %lld kept\n",
           tt_term(path), o->dry_run ? "would drop" : "dropped",
           (long long)del, stof_version_string(), th, (long long)kept);
    tt_release();
    return EXIT_OK;
}

