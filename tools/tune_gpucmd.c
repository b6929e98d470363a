/*
 * tune_gpucmd.c - the stof-tune commands that need a GPU: tune (a
 * workload), pending (the misses of cache-only runs) and verify. The
 * problems of tune and pending run on one GPU or, with --devices, on one
 * worker per GPU (tune_devices.h). Plan descriptions and recorded misses
 * are read, and the --json summary is written, with jansson.
 */
#include <errno.h>
#include <float.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "db.h"
#include "db_tools.h"
#include "internal.h"
#include "layer_int.h"
#include "tune_cli.h"
#include "tune_devices.h"
#include "tune_text.h"
#include "tune_verify.h"
#include "tune_workload.h"

/* The string member name of o, or "" when o has none. */
static const char *member_str(const json_t *o, const char *name)
{
    const char *v = json_string_value(json_object_get(o, name));
    return v ? v : "";
}

/* The int member name of o into *out: 1 when it is there, an integer and
 * in range. */
static int member_int(const json_t *o, const char *name, int *out)
{
    const json_t *v = json_object_get(o, name);
    if (!json_is_integer(v) || json_integer_value(v) < INT_MIN ||
        json_integer_value(v) > INT_MAX)
        return 0;
    *out = (int)json_integer_value(v);
    return 1;
}

/* A planned problem's row, from the plan's description. A description that
 * cannot be read leaves the fields empty: the problem was planned all the
 * same. */
static void row_from_plan(tune_row *r, const stof_plan *p)
{
    json_t *d = plan_description(p);
    snprintf(r->kernel, sizeof(r->kernel), "%s", member_str(d, "kernel"));
    snprintf(r->source, sizeof(r->source), "%s", member_str(d, "source"));
    snprintf(r->key, sizeof(r->key), "%s", member_str(d, "key"));
    /* The parameters travel as JSON text, because rows are shared with the
     * worker processes in fixed-size fields; parameters that do not fit
     * are left out rather than cut (the summary then shows {}). */
    json_t *params = json_object_get(d, "params");
    char *text = json_is_object(params) ? json_dumps(params, JSON_COMPACT)
                                        : NULL;
    snprintf(r->params, sizeof(r->params), "%s",
             text && strlen(text) < sizeof(r->params) ? text : "");
    free(text);
    /* time_ms is null when nothing was timed: 0 here, as "none". */
    r->time_ms = json_number_value(json_object_get(d, "time_ms"));
    r->model_ms = json_number_value(json_object_get(d, "model_choice_ms"));
    json_decref(d);
    r->ok = 1;
}

/* One row of the summary as JSON; NULL when out of memory. The parameters
 * are embedded as the object they are (an empty one when they were left
 * out or do not parse). */
static json_t *row_json(const tune_row *r)
{
    if (!r->ok)
        return json_pack("{s:o, s:i, s:o, s:b, s:b, s:o}", "problem",
                         tt_jstr(r->problem), "device", r->device, "plan_s",
                         tt_jnum(r->plan_s, 6), "ok", 0, "skipped",
                         r->skipped != 0, "error", tt_jstr(r->error));
    json_t *params = r->params[0] ? json_loads(r->params, 0, NULL) : NULL;
    if (!json_is_object(params)) {
        json_decref(params);
        params = json_object();
    }
    return json_pack(
        "{s:o, s:i, s:o, s:b, s:o, s:o, s:o, s:o, s:o, s:o, s:o}", "problem",
        tt_jstr(r->problem), "device", r->device, "plan_s",
        tt_jnum(r->plan_s, 6), "ok", 1, "key", tt_jstr(r->key), "kernel",
        tt_jstr(r->kernel), "params", params, "source", tt_jstr(r->source),
        "time_ms", tt_jnum(r->time_ms, 6), "model_choice_ms",
        tt_jnum(r->model_ms, 6), "speedup",
        tt_jnum(r->time_ms > 0 && r->model_ms > 0 ? r->model_ms / r->time_ms
                                                  : 1.0,
                4));
}

/* The table of a tune or pending run, or its JSON document. Returns the
 * exit code of printing it. */
static int print_summary(const char *cmd, const tune_row *rows, int n,
                         int n_dev, double wall_s, int json)
{
    if (json) {
        json_t *list = json_array();
        for (int i = 0; list && i < n; i++)
            if (json_array_append_new(list, row_json(&rows[i]))) {
                json_decref(list);
                list = NULL;
            }
        return print_json(json_pack("{s:s, s:i, s:o, s:o}", "command", cmd,
                                    "devices", n_dev, "wall_s",
                                    tt_jnum(wall_s, 6), "problems", list));
    }
    printf("%-56s  %-14s  %9s  %8s  %-9s%s\n", "PROBLEM", "KERNEL", "TIME_MS",
           "SPEEDUP", "SOURCE", n_dev > 1 ? "  GPU" : "");
    for (int i = 0; i < n; i++) {
        const tune_row *r = &rows[i];
        if (!r->ok) {
            printf("%-56.56s  %s: %s\n", tt_term(r->problem),
                   r->skipped ? "SKIPPED" : "FAILED", tt_term(r->error));
            tt_release();
            continue;
        }
        char sp[16];
        if (r->time_ms > 0 && r->model_ms > 0)
            snprintf(sp, sizeof(sp), "%.2fx", r->model_ms / r->time_ms);
        else
            snprintf(sp, sizeof(sp), "-");
        printf("%-56.56s  %-14.14s  %9.4f  %8s  %-9s", tt_term(r->problem),
               tt_term(r->kernel), r->time_ms, sp, tt_term(r->source));
        if (n_dev > 1)
            printf("  %3d", r->device);
        printf("\n");
        tt_release();
    }
    return EXIT_OK;
}

static double wall_now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* ---------------------------------------------------------------- tune */

/* A planned layer's row, from its description: kernel "layer", the
 * fusion scheme as its parameters (junctions, kernel count), the layer's
 * time and the cost model's choice's. */
static void row_from_layer(tune_row *r, const stof_layer *L)
{
    size_t need = 0;
    json_t *d = NULL;
    stof_status st = stof_layer_describe(L, NULL, 0, &need);
    char *text = st == STOF_OK || st == STOF_ERR_BUFFER_TOO_SMALL
                     ? malloc(need + 1)
                     : NULL;
    if (text && stof_layer_describe(L, text, need + 1, NULL) == STOF_OK)
        d = json_loads(text, 0, NULL);
    free(text);
    snprintf(r->kernel, sizeof(r->kernel), "layer");
    snprintf(r->source, sizeof(r->source), "%s", member_str(d, "source"));
    snprintf(r->key, sizeof(r->key), "%s", member_str(d, "key"));
    const json_t *sc = json_object_get(d, "scheme");
    int nk = 0;
    member_int(sc, "kernels", &nk);
    json_t *params = json_pack("{s:s, s:s, s:i}", "junction_a",
                               member_str(sc, "junction_a"), "junction_b",
                               member_str(sc, "junction_b"), "kernels", nk);
    char *ptext = params ? json_dumps(params, JSON_COMPACT) : NULL;
    snprintf(r->params, sizeof(r->params), "%s",
             ptext && strlen(ptext) < sizeof(r->params) ? ptext : "");
    free(ptext);
    json_decref(params);
    r->time_ms = json_number_value(json_object_get(d, "layer_ms"));
    r->model_ms = json_number_value(json_object_get(d, "model_ms"));
    json_decref(d);
    r->ok = 1;
}

/* A layer problem of a workload, planned on ctx. */
static int tune_layer(stof_context *ctx, const tw_problem *p, tune_row *r)
{
    stof_mask *m = NULL;
    stof_layer *L = NULL;
    stof_layer_desc d;
    tw_layer_desc(p, &d);
    stof_status st = stof_mask_from_spec(ctx, p->mask, p->seq_q, p->seq_k,
                                         &m);
    if (st == STOF_OK)
        st = stof_layer_plan(ctx, &d, m, &L);
    if (st == STOF_OK)
        row_from_layer(r, L);
    else
        snprintf(r->error, sizeof(r->error), "%s", stof_errmsg(ctx));
    stof_layer_free(&L);
    stof_mask_free(&m);
    return st != STOF_OK;
}

/* Problem i of a workload, planned on ctx (in a worker). */
static int tune_one(void *user, stof_context *ctx, int i, tune_row *r)
{
    const tw_workload *w = user;
    tw_problem p;
    tw_get(w, i, &p);
    tw_describe(&p, r->problem, sizeof(r->problem));
    if (p.layer)
        return tune_layer(ctx, &p, r);
    stof_mask *m = NULL;
    stof_plan *plan = NULL;
    stof_attention_desc d;
    stof_status st = stof_mask_from_spec(ctx, p.mask, p.seq_q, p.seq_k, &m);
    if (st == STOF_OK)
        st = stof_attention_desc_init(&d, p.batch, p.heads, p.seq_q, p.seq_k,
                                      p.head_dim, p.dtype, p.layout);
    if (st == STOF_OK)
        st = stof_attention_plan(ctx, &d, m, &plan);
    if (st == STOF_OK)
        row_from_plan(r, plan);
    else
        snprintf(r->error, sizeof(r->error), "%s", stof_errmsg(ctx));
    stof_plan_free(&plan);
    stof_mask_free(&m);
    return st != STOF_OK;
}

static int count_failed(const tune_row *rows, int n, int *skipped)
{
    int failed = 0;
    *skipped = 0;
    for (int i = 0; i < n; i++) {
        *skipped += rows[i].skipped;
        failed += !rows[i].ok && !rows[i].skipped;
    }
    return failed;
}

/* Whether a new file at path could be made: the nearest directory above
 * it that exists is writable (the library makes the missing ones). */
static int dir_writable(const char *path)
{
    char dir[4096];
    snprintf(dir, sizeof(dir), "%s", path);
    for (;;) {
        char *slash = strrchr(dir, '/');
        if (!slash)
            snprintf(dir, sizeof(dir), ".");
        else if (slash == dir)
            dir[1] = 0;
        else
            *slash = 0;
        struct stat sb;
        if (stat(dir, &sb) == 0)
            return S_ISDIR(sb.st_mode) && access(dir, W_OK | X_OK) == 0;
        if (errno != ENOENT || !strcmp(dir, ".") || !strcmp(dir, "/"))
            return 1; /* (the library says why) */
    }
}

int cmd_tune(stof_context *cpu, const opts *o)
{
    tw_workload w;
    tw_init(&w);
    char msg[512];
    int bad;
    if (o->n_pos == 1 && (o->n_masks || o->n_shapes || o->n_layers ||
                          o->n_tokens || o->dtype || o->layout)) {
        /* (the file names every problem's own: these would be ignored) */
        err("tune: a WORKLOAD file names its problems' masks, shapes, "
            "dtypes and layouts; --mask, --shape, --layer, --tokens, "
            "--dtype and --layout go without one");
        return EXIT_USAGE;
    } else if (o->n_pos == 1)
        bad = tw_parse_file(o->pos[0], &w, msg, sizeof(msg));
    else if (o->n_masks && (o->n_shapes || o->n_layers || o->n_tokens))
        bad = tw_from_args(o->masks, o->n_masks, o->shapes, o->n_shapes,
                           o->layers, o->n_layers, o->tokens, o->n_tokens,
                           o->dtype, o->layout, &w, msg, sizeof(msg));
    else {
        err("tune: give a WORKLOAD file, or --mask SPEC and --shape SHAPE "
            "(or --layer and --tokens)");
        return EXIT_USAGE;
    }
    /* Specs are checked cheaply (their validity does not depend on the
     * sizes); the GPU before any mask is built at its real size. */
    if (!bad)
        bad = tw_check_specs(cpu, &w, msg, sizeof(msg));
    if (bad) {
        err("%s", msg);
        tw_free(&w);
        return o->n_pos == 1 ? EXIT_FAIL : EXIT_USAGE;
    }
    if (!td_devices_syntax(o->devices, msg, sizeof(msg))) {
        err("%s", msg); /* (a --dry-run too) */
        tw_free(&w);
        return EXIT_USAGE;
    }
    if (o->dry_run) { /* the problems' names, nothing tuned */
        json_t *list = o->json ? json_array() : NULL;
        for (int i = 0; i < tw_count(&w); i++) {
            tw_problem p;
            char name[192];
            tw_get(&w, i, &p);
            tw_describe(&p, name, sizeof(name));
            if (list)
                json_array_append_new(list, tt_jstr(name));
            else {
                printf("%s\n", tt_term(name));
                tt_release();
            }
        }
        tw_free(&w);
        return o->json ? print_json(list) : EXIT_OK;
    }
    /* The database the records go to, before any GPU work: one that
     * exists must be a stof database this build can write (the library
     * would open a foreign, newer or read-only one read-only, and tuning
     * would store nothing); a missing one is made by the first store. */
    {
        char buf[4096];
        const char *path = o->db;
        if (!path && stof__db_default_path(buf, sizeof(buf)))
            path = buf;
        stof_status st = STOF_OK;
        if (path && *path && access(path, F_OK) == 0) {
            st = stof__dbt_check(STOF_DB_SINK(cpu), path);
            stof_db *db = NULL;
            if (st == STOF_OK)
                st = stof__db_open(STOF_DB_SINK(cpu), path, NULL, &db);
            if (st == STOF_OK && !stof__db_writable(db))
                st = stof__fail(cpu, STOF_ERR_DATABASE,
                                "%s cannot be written here (read-only, or "
                                "not a database this build writes)",
                                path);
            stof__db_close(&db);
        } else if (path && *path && !dir_writable(path)) {
            err("%s cannot be made: its directory is not writable", path);
            tw_free(&w);
            return EXIT_DB;
        }
        if (st != STOF_OK) {
            tw_free(&w);
            return fail_with(cpu, st);
        }
    }
    int ords[TD_MAX_DEVICES], rc = EXIT_OK;
    int n_dev = td_devices(o->devices, ords, TD_MAX_DEVICES, msg, sizeof(msg),
                           &rc);
    if (!n_dev) {
        err("%s", msg);
        tw_free(&w);
        return rc;
    }
    int n = tw_count(&w);
    tune_row *rows = calloc((size_t)n + 1, sizeof(*rows));
    if (!rows) {
        err("out of memory");
        tw_free(&w);
        return EXIT_FAIL;
    }
    stof_settings s;
    base_settings(o, &s);
    const double t0 = wall_now();
    rc = td_run(&s, ords, n_dev, n, tune_one, &w, rows, o->json);
    const double wall = wall_now() - t0;
    if (rc == EXIT_OK) {
        rc = print_summary("tune", rows, n, n_dev, wall, o->json);
        int skipped, failed = count_failed(rows, n, &skipped);
        if (!o->json)
            fprintf(stderr,
                    PROG ": %d problems on %d GPU%s in %.1f s, %d failed\n",
                    n, n_dev, n_dev == 1 ? "" : "s", wall, failed);
        if (failed)
            rc = EXIT_FAIL;
    }
    free(rows);
    tw_free(&w);
    return rc;
}

/* ------------------------------------------------------------- pending */

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

/* A miss's sq x sk mask: from its spec when it had one (so the tuned
 * record keeps the spec and `verify` can rebuild it), checked against the
 * recorded digest; else from the recorded bits. 1, or 0 with why set. */
static int miss_mask(stof_context *ctx, const miss *ms, const json_t *js,
                     int sq, int sk, stof_mask **m, char *why, size_t wn)
{
    const char *spec = member_str(js, "mask_spec");
    if (spec[0] && stof_mask_from_spec(ctx, spec, sq, sk, m) == STOF_OK) {
        char hex[33];
        stof_mask_digest(*m, NULL, hex);
        if (!strcmp(hex, member_str(js, "mask_digest")))
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

/* Rebuild a missed problem from the JSON object recorded with it (the
 * problem, its strides, the mask's spec and digest: plan_fallback in
 * src/ops/attention_plan.c) and the recorded mask bits; 0 with why set
 * when it cannot be. */
static int miss_problem(stof_context *ctx, const miss *ms,
                        stof_attention_desc *d, stof_mask **m,
                        stof_mask_family **fam, stof_mask_data *sample,
                        float *slopes, char *why, size_t wn)
{
    json_error_t jerr;
    json_t *js = json_loads(ms->problem, 0, &jerr);
    int ok = 0;
    if (!json_is_object(js)) {
        snprintf(why, wn, "unreadable problem (%s): %s",
                 js ? "not a JSON object" : jerr.text, ms->problem);
        goto out;
    }
    const char *dt = member_str(js, "dtype"), *lay = member_str(js, "layout");
    /* Strided and packed descriptors carry their strides. */
    const int packed = !strcasecmp(lay, "packed");
    const int strided = !strcasecmp(lay, "strided") || packed;
    stof_layout L = !strcasecmp(lay, "BSHD") ? STOF_LAYOUT_BSHD
                                             : STOF_LAYOUT_BHSD;
    if (strcasecmp(lay, "BSHD") && strcasecmp(lay, "BHSD") && !strided) {
        snprintf(why, wn, "layout '%s' is not known", lay);
        goto out;
    }
    int b = 0, h = 0, sq = 0, sk = 0, hd = 0;
    if (!member_int(js, "batch", &b) || !member_int(js, "heads", &h) ||
        !member_int(js, "seq_q", &sq) || !member_int(js, "seq_k", &sk) ||
        !member_int(js, "head_dim", &hd) ||
        stof_attention_desc_init(d, b, h, sq, sk, hd,
                                 strcmp(dt, "bf16") ? STOF_DTYPE_FP16
                                                    : STOF_DTYPE_BF16,
                                 L) != STOF_OK ||
        sq < 1 || sk < 1) {
        snprintf(why, wn, "unreadable problem %s", ms->problem);
        goto out;
    }
    if (strided) {
        /* Strided misses carry their strides (q_s0 .. o_s2). */
        static const char *const names[4] = {"q", "k", "v", "o"};
        int64_t *dst[4] = {d->q_stride, d->k_stride, d->v_stride, d->o_stride};
        for (int t = 0; t < 4; t++)
            for (int i = 0; i < 3; i++) {
                char f[16];
                snprintf(f, sizeof(f), "%s_s%d", names[t], i);
                const json_t *v = json_object_get(js, f);
                if (!json_is_integer(v)) {
                    snprintf(why, wn, "strided layout recorded without "
                                      "strides");
                    goto out;
                }
                dst[t][i] = (int64_t)json_integer_value(v);
            }
        d->layout = packed ? STOF_LAYOUT_PACKED : STOF_LAYOUT_STRIDED;
    }
    d->scale = (float)json_number_value(json_object_get(js, "scale"));
    /* Grouped-query problems (planning takes their K/V strides with
     * it, as for the caller that missed). */
    int kvh = 0;
    if (member_int(js, "kv_heads", &kvh) && kvh > 0)
        d->kv_heads = kvh;
    /* Score modifiers: the soft-cap, and the ALiBi slopes into `slopes`
     * (room for 4096 heads, the most a descriptor has). */
    const json_t *cap = json_object_get(js, "softcap");
    if (json_is_number(cap))
        d->softcap = (float)json_number_value(cap);
    const json_t *al = json_object_get(js, "alibi_slopes");
    if (al) {
        if (!json_is_array(al) || (int)json_array_size(al) != h ||
            h > 4096) {
            snprintf(why, wn, "unreadable ALiBi slopes in %s", ms->problem);
            goto out;
        }
        for (int i = 0; i < h; i++)
            slopes[i] = (float)json_number_value(json_array_get(al, (size_t)i));
        d->alibi_slopes = slopes;
    }
    /* An additive bias: its strides (the search makes its own tensor). */
    const json_t *bs = json_object_get(js, "bias_stride");
    if (bs) {
        if (!json_is_array(bs) || json_array_size(bs) != 3) {
            snprintf(why, wn, "unreadable bias strides in %s", ms->problem);
            goto out;
        }
        d->bias = 1;
        for (size_t i = 0; i < 3; i++)
            d->bias_stride[i] =
                (int64_t)json_integer_value(json_array_get(bs, i));
    }
    if (member_str(js, "family_spec")[0]) {
        /* stof_attention_plan_family's miss: the family, and the sample
         * instance it was planned on (its key holds the sample's
         * statistics) from the recorded blob. */
        const char *fs = member_str(js, "family_spec");
        const char *kept = member_str(js, "family_sample");
        if (strcmp(kept, "default") &&
            !stof__family_sample_unpack(d, ms->bits, ms->nbits, sample)) {
            snprintf(why, wn,
                     "a mask-family miss (\"%s\") whose sample instance "
                     "was %s: plan it with stof_attention_plan_family in "
                     "default mode",
                     fs, strcmp(kept, "kept") ? "not kept (too large)"
                                              : "recorded unreadably");
            goto out;
        }
        if (stof_mask_family_create(ctx, fs, fam) != STOF_OK) {
            snprintf(why, wn, "family \"%s\": %s", fs, stof_errmsg(ctx));
            goto out;
        }
        ok = 1;
        goto out;
    }
    ok = miss_mask(ctx, ms, js, sq, sk, m, why, wn);
out:
    json_decref(js);
    return ok;
}

/* After miss ms was planned (key: the plan's; untuned: the source of a
 * plan that was not tuned nor loaded): a plan under another key is
 * skipped (recorded on another GPU, driver or build), else the miss goes
 * once a record holds it. */
static void settle_miss(stof_context *ctx, const miss *ms, const char *key,
                        const char *untuned, tune_row *r)
{
    if (strcmp(key, ms->key)) {
        snprintf(r->error, sizeof(r->error),
                 "recorded on another GPU, driver or build");
        r->skipped = 1;
    } else if (!strcmp(r->source, untuned)) {
        /* planned without a record (no kernel of this build fits it):
         * the miss stays, and is not counted as tuned */
        snprintf(r->error, sizeof(r->error),
                 "kept: planned by %s, no tuned record", untuned);
        r->skipped = 1;
    } else {
        /* The miss goes once its record is in the database: a store that
         * failed (the database busy or full) is only a warning of the
         * library's, and must not cost the miss. */
        stof_db *db = stof__ctx_db(ctx);
        stof_db_record rec;
        if (db && stof__db_lookup(db, key, &rec) == STOF_OK) {
            stof__db_record_clear(&rec);
            (void)stof__db_delete_miss(db, ms->key);
        } else {
            snprintf(r->error, sizeof(r->error),
                     "tuned, but its record is not in the database (the "
                     "store failed; STOF_LOG=warn says why): the miss is "
                     "kept");
            r->ok = 0;
        }
    }
}

/* A family's miss: planned with its sample in this (tuning) context; the
 * miss goes once the plan's key is the recorded one and a record holds
 * it. */
static int pending_family(stof_context *ctx, const miss *ms,
                          const stof_attention_desc *d, stof_mask_family *fam,
                          const stof_mask_data *sample, tune_row *r)
{
    const int has_sample = memcmp(sample, &(stof_mask_data){0},
                                  sizeof(*sample)) != 0;
    snprintf(r->problem, sizeof(r->problem), "%dx%dx%dx%dx%d %s family %.40s",
             d->batch, d->heads, d->seq_q, d->seq_k, d->head_dim,
             d->dtype == STOF_DTYPE_BF16 ? "bf16" : "fp16",
             stof_mask_family_spec(fam));
    stof_plan *plan = NULL;
    int failed = 0;
    if (stof_attention_plan_family(ctx, d, fam, has_sample ? sample : NULL,
                                   &plan) == STOF_OK) {
        row_from_plan(r, plan);
        settle_miss(ctx, ms, stof__plan_key(plan), "fallback", r);
    } else {
        snprintf(r->error, sizeof(r->error), "%s", stof_errmsg(ctx));
        failed = 1;
    }
    stof_plan_free(&plan);
    stof_mask_family_free(&fam);
    return failed;
}

/* A layer's miss (stof_layer_plan or stof_layer_plan_family in
 * cache-only mode: its descriptor and mask or family and sample,
 * record_layer_miss in src/ops/layer.c), planned on ctx; the miss goes
 * once the plan's key is the recorded one and it was tuned or loaded. 0,
 * or 1 when the problem failed; unreadable: skipped. */
static int pending_layer(stof_context *ctx, const miss *ms, const json_t *js,
                         tune_row *r)
{
    int b = 0, s = 0, hid = 0, heads = 0, ffn = 0, kvh = 0, act = 0, norm = 0,
        pre = 0, nob = 0, gated = 0, rope_dim = 0;
    const char *dt = member_str(js, "dtype");
    /* RoPE: only the misses of RoPE layers name it (absent: none); a
     * base a float cannot hold is unreadable (the rest: the plan's
     * checks) */
    const json_t *jt = json_object_get(js, "rope_theta");
    const json_t *jf = json_object_get(js, "rope_table");
    const int rope_ok =
        (!jt || (json_is_number(jt) && json_number_value(jt) > 1.0 &&
                 json_number_value(jt) <= FLT_MAX)) &&
        (!jf || (json_is_true(jf) && !jt)) &&
        (!json_object_get(js, "rope_dim") ||
         member_int(js, "rope_dim", &rope_dim));
    stof_layer_desc d;
    if (!rope_ok || !member_int(js, "batch", &b) ||
        !member_int(js, "seq", &s) ||
        !member_int(js, "hidden", &hid) || !member_int(js, "heads", &heads) ||
        !member_int(js, "ffn", &ffn) || !member_int(js, "kv_heads", &kvh) ||
        !member_int(js, "act", &act) || !member_int(js, "norm", &norm) ||
        !member_int(js, "pre_norm", &pre) ||
        !member_int(js, "no_bias", &nob) || !member_int(js, "gated", &gated) ||
        b < 1 || s < 1 || hid < 1 || heads < 1 ||
        (strcmp(dt, "fp16") && strcmp(dt, "bf16")) ||
        stof_layer_desc_init(&d, b, s, hid, heads,
                             strcmp(dt, "bf16") ? STOF_DTYPE_FP16
                                                : STOF_DTYPE_BF16) !=
            STOF_OK) {
        snprintf(r->error, sizeof(r->error), "unreadable layer problem %.200s",
                 ms->problem);
        r->skipped = 1;
        return 0;
    }
    d.ffn = ffn;
    d.kv_heads = kvh;
    d.act = (stof_activation)act;
    d.norm = (stof_norm_kind)norm;
    d.pre_norm = pre;
    d.no_bias = nob;
    d.gated = gated;
    d.norm_eps = (float)json_number_value(json_object_get(js, "eps"));
    d.rope_theta = jt ? (float)json_number_value(jt) : 0.0f;
    d.rope_dim = rope_dim;
    /* (a layer with its own frequencies: stand-ins, as its key is any
     * table's) */
    d.rope_freq = jf ? stof__rope_freq_standin() : NULL;
    /* (heads whose width is not hidden's; absent: hidden / heads) */
    const json_t *jh = json_object_get(js, "head_dim");
    d.head_dim = !jh ? 0
                 : json_is_integer(jh) && json_integer_value(jh) > 0 &&
                         json_integer_value(jh) <= 256
                     ? (int)json_integer_value(jh)
                     : -1; /* (refused by the plan) */
    /* (a QK norm: 1, or absent; anything else the plan refuses) */
    const json_t *jq = json_object_get(js, "qk_norm");
    d.qk_norm = !jq                                                   ? 0
                : json_is_integer(jq) && json_integer_value(jq) == 1 ? 1
                                                                     : -1;
    stof_mask *m = NULL;
    stof_mask_family *fam = NULL;
    stof_mask_data sample;
    memset(&sample, 0, sizeof(sample));
    char why[256] = "";
    const char *fs = member_str(js, "family_spec");
    if (fs[0]) {
        /* A family layer's miss: the family, and the sample instance its
         * attention was planned on (the blob, packed for the layer's
         * attention: batch x heads x seq). */
        snprintf(r->problem, sizeof(r->problem),
                 "layer %dx%d hidden %d heads %d %s family %.40s", b, s, hid,
                 heads, dt, fs);
        const char *kept = member_str(js, "family_sample");
        stof_attention_desc ad;
        int ok = stof_attention_desc_init(&ad, b, heads, s, s,
                                          d.head_dim > 0 ? d.head_dim
                                                         : hid / heads,
                                          d.dtype, STOF_LAYOUT_BHSD) ==
                 STOF_OK;
        ad.kv_heads = kvh;
        if (ok && strcmp(kept, "default") &&
            !stof__family_sample_unpack(&ad, ms->bits, ms->nbits, &sample)) {
            snprintf(why, sizeof(why),
                     "a family layer's miss whose sample instance was %s: "
                     "plan it with stof_layer_plan_family in default mode",
                     strcmp(kept, "kept") ? "not kept (too large)"
                                          : "recorded unreadably");
            ok = 0;
        } else if (ok && stof_mask_family_create(ctx, fs, &fam) != STOF_OK) {
            snprintf(why, sizeof(why), "family \"%s\": %s", fs,
                     stof_errmsg(ctx));
            ok = 0;
        }
        if (!ok) {
            snprintf(r->error, sizeof(r->error), "%s",
                     why[0] ? why : "unreadable layer problem");
            r->skipped = 1;
            return 0;
        }
    } else {
        snprintf(r->problem, sizeof(r->problem),
                 "layer %dx%d hidden %d heads %d %s mask %.12s", b, s, hid,
                 heads, dt, ms->key);
        if (!miss_mask(ctx, ms, js, s, s, &m, why, sizeof(why))) {
            snprintf(r->error, sizeof(r->error), "%s", why);
            r->skipped = 1;
            return 0;
        }
    }
    const int has_sample = memcmp(&sample, &(stof_mask_data){0},
                                  sizeof(sample)) != 0;
    stof_layer *L = NULL;
    int failed = 0;
    if ((fam ? stof_layer_plan_family(ctx, &d, fam,
                                      has_sample ? &sample : NULL, &L)
             : stof_layer_plan(ctx, &d, m, &L)) == STOF_OK) {
        row_from_layer(r, L);
        settle_miss(ctx, ms, r->key, "model", r);
    } else {
        snprintf(r->error, sizeof(r->error), "%s", stof_errmsg(ctx));
        failed = 1;
    }
    stof_layer_free(&L);
    stof_mask_free(&m);
    stof_mask_family_free(&fam);
    return failed;
}

/* Miss i, rebuilt and planned on ctx (in a worker); its miss is deleted
 * from the database once it has a record. */
typedef struct pending_job {
    miss_list ml;
    const char *path;
} pending_job;

static int pending_one(void *user, stof_context *ctx, int i, tune_row *r)
{
    pending_job *job = user;
    const miss *ms = &job->ml.v[i];
    stof_attention_desc d;
    stof_mask *m = NULL;
    stof_mask_family *fam = NULL;
    stof_mask_data sample;
    memset(&sample, 0, sizeof(sample));
    char why[256] = "";
    float slopes[4096]; /* ALiBi slopes of the problem, when it has them */
    snprintf(r->problem, sizeof(r->problem), "miss %.12s (%lld times)",
             ms->key, (long long)ms->count);
    json_t *js = json_loads(ms->problem, 0, NULL);
    if (!strcmp(member_str(js, "op"), "layer")) {
        const int failed = pending_layer(ctx, ms, js, r);
        json_decref(js);
        return failed;
    }
    json_decref(js);
    if (!miss_problem(ctx, ms, &d, &m, &fam, &sample, slopes, why,
                      sizeof(why))) {
        snprintf(r->error, sizeof(r->error), "%s", why);
        r->skipped = 1;
        return 0;
    }
    if (fam)
        return pending_family(ctx, ms, &d, fam, &sample, r);
    snprintf(r->problem, sizeof(r->problem), "%dx%dx%dx%dx%d %s mask %.12s",
             d.batch, d.heads, d.seq_q, d.seq_k, d.head_dim,
             d.dtype == STOF_DTYPE_BF16 ? "bf16" : "fp16", ms->key);
    char hex[33], key[33];
    stof_mask_digest(m, NULL, hex);
    stof__attention_key(ctx, &d, hex, key, NULL, 0);
    if (strcmp(key, ms->key)) {
        snprintf(r->error, sizeof(r->error),
                 "recorded on another GPU, driver or build");
        r->skipped = 1;
        stof_mask_free(&m);
        return 0;
    }
    stof_plan *plan = NULL;
    int failed = 0;
    if (stof_attention_plan(ctx, &d, m, &plan) == STOF_OK) {
        row_from_plan(r, plan);
        settle_miss(ctx, ms, key, "fallback", r); /* (key checked above) */
    } else {
        snprintf(r->error, sizeof(r->error), "%s", stof_errmsg(ctx));
        failed = 1;
    }
    stof_plan_free(&plan);
    stof_mask_free(&m);
    return failed;
}

int cmd_pending(stof_context *cpu, const opts *o)
{
    char buf[4096];
    const char *path = db_path(o, buf, sizeof(buf));
    if (!path)
        return EXIT_USAGE;
    stof_status st = stof__dbt_check(STOF_DB_SINK(cpu), path);
    if (st != STOF_OK)
        return fail_with(cpu, st);
    char msg[512];
    int ords[TD_MAX_DEVICES], rc = EXIT_OK;
    int n_dev = td_devices(o->devices, ords, TD_MAX_DEVICES, msg, sizeof(msg),
                           &rc);
    if (!n_dev) {
        err("%s", msg);
        return rc;
    }
    /* The misses are read on the CPU context: no GPU work before the
     * workers start. */
    pending_job job = {{0}, path};
    stof_db *db = NULL;
    st = stof__db_open(STOF_DB_SINK(cpu), path, NULL, &db);
    if (st == STOF_OK && !stof__db_writable(db))
        st = stof__fail(cpu, STOF_ERR_DATABASE, "%s is not writable", path);
    if (st == STOF_OK)
        st = stof__db_foreach_miss(db, collect_miss, &job.ml);
    stof__db_close(&db);
    if (st != STOF_OK) {
        miss_list_free(&job.ml);
        return fail_with(cpu, st);
    }
    int n = job.ml.n;
    tune_row *rows = calloc((size_t)n + 1, sizeof(*rows));
    if (!rows) {
        miss_list_free(&job.ml);
        err("out of memory");
        return EXIT_FAIL;
    }
    stof_settings s;
    base_settings(o, &s);
    s.user_db = path;
    const double t0 = wall_now();
    rc = n ? td_run(&s, ords, n_dev, n, pending_one, &job, rows, o->json)
           : EXIT_OK;
    const double wall = wall_now() - t0;
    if (rc == EXIT_OK) {
        rc = print_summary("pending", rows, n, n_dev, wall, o->json);
        int skipped, failed = count_failed(rows, n, &skipped);
        if (!o->json)
            fprintf(stderr,
                    PROG ": %d misses: %d tuned, %d skipped, %d failed\n", n,
                    n - skipped - failed, skipped, failed);
        if (failed)
            rc = EXIT_FAIL;
    }
    free(rows);
    miss_list_free(&job.ml);
    return rc;
}

/* -------------------------------------------------------------- verify */

int cmd_verify(stof_context *cpu, const opts *o)
{
    char buf[4096];
    const char *path = db_path(o, buf, sizeof(buf));
    if (!path)
        return EXIT_USAGE;
    stof_status st = stof__dbt_check(STOF_DB_SINK(cpu), path);
    if (st != STOF_OK)
        return fail_with(cpu, st);
    return tv_verify(cpu, path, o->drop, o->json, open_gpu_ctx);
}
