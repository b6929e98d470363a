/*
 * bench_trust.c - stof-bench-trust: what trusting a record from elsewhere
 * costs. For each mask of the public suite it plans one problem three
 * ways and prints the times:
 *   cold     a fresh database: the problem is tuned (the two-stage search);
 *   first    another host's view: its own empty user database over the
 *            first one as a system database, so the record is used for the
 *            first time here and verified against the reference kernel;
 *   trusted  the same again in a new context: verified before, loaded only.
 * The first-use check must stay far below a cold tune.
 *
 *   stof-bench-trust [--shape BxHxNxD] [--dtype fp16|bf16] [--dir DIR]
 *                    [--json FILE]
 */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "stof.h"

static const char *const masks[][2] = {
    {"none", "dense"},
    {"causal", "causal"},
    {"sliding", "sliding:256"},
    {"dilated", "dilated:512:2"},
    {"longformer", "longformer:256:64"},
    {"bigbird", "bigbird:64:3:2:3:1"},
    {"strided", "strided:128"},
};
#define N_MASKS (int)(sizeof(masks) / sizeof(*masks))

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* A number field of the describe JSON (0 when absent). */
static double field(const char *js, const char *name)
{
    char pat[64];
    snprintf(pat, sizeof(pat), "\"%s\":", name);
    const char *p = strstr(js, pat);
    return p ? atof(p + strlen(pat)) : 0.0;
}

typedef struct result {
    double cold_s, first_s, first_verify_ms, trusted_s, trusted_verify_ms;
    char source[3][16];
} result;

/* Plan (b, h, n, d, dt) with spec in a new context over the given
 * databases; *secs is the plan's wall time, js its describe JSON. */
static int plan_once(const char *user, const char *sys, const char *spec,
                     const int shape[4], stof_dtype dt, double *secs,
                     char *js, size_t jn)
{
    stof_settings s;
    stof_default_settings(&s);
    s.user_db = user;
    const char *sys_list[] = {sys, NULL};
    s.system_dbs = sys ? sys_list : NULL;
    s.require_device = 1;
    stof_context *ctx = NULL;
    stof_status st = stof_open(&ctx, &s);
    if (st != STOF_OK) {
        fprintf(stderr, "stof-bench-trust: %s\n", stof_errmsg(ctx));
        stof_close(&ctx);
        if (st == STOF_ERR_NO_DEVICE)
            exit(77); /* nothing to measure here */
        return 0;
    }
    stof_mask *m = NULL;
    stof_attention_desc d;
    stof_plan *p = NULL;
    int ok = stof_mask_from_spec(ctx, spec, shape[2], shape[2], &m) ==
                 STOF_OK &&
             stof_attention_desc_init(&d, shape[0], shape[1], shape[2],
                                      shape[2], shape[3], dt,
                                      STOF_LAYOUT_BHSD) == STOF_OK;
    const double t0 = now_s();
    ok = ok && stof_attention_plan(ctx, &d, m, &p) == STOF_OK;
    *secs = now_s() - t0;
    if (ok)
        stof_plan_describe(p, js, jn, NULL);
    else
        fprintf(stderr, "stof-bench-trust: %s: %s\n", spec, stof_errmsg(ctx));
    stof_plan_free(&p);
    stof_mask_free(&m);
    stof_close(&ctx);
    return ok;
}

static void source_of(const char *js, char *out, size_t n)
{
    const char *p = strstr(js, "\"source\":\"");
    snprintf(out, n, "%.*s", p ? (int)strcspn(p + 10, "\"") : 1,
             p ? p + 10 : "?");
}

int main(int argc, char **argv)
{
    int shape[4] = {4, 16, 4096, 64};
    stof_dtype dt = STOF_DTYPE_FP16;
    const char *dir = NULL, *json = NULL;
    static const struct option lo[] = {
        {"shape", required_argument, NULL, 's'},
        {"dtype", required_argument, NULL, 't'},
        {"dir", required_argument, NULL, 'd'},
        {"json", required_argument, NULL, 'j'},
        {"help", no_argument, NULL, 'h'},
        {"version", no_argument, NULL, 'V'},
        {NULL, 0, NULL, 0}};
    int c;
    while ((c = getopt_long(argc, argv, "h", lo, NULL)) != -1) {
        if (c == 's' && sscanf(optarg, "%dx%dx%dx%d", &shape[0], &shape[1],
                               &shape[2], &shape[3]) == 4)
            continue;
        if (c == 't' && (!strcmp(optarg, "fp16") || !strcmp(optarg, "bf16"))) {
            dt = strcmp(optarg, "bf16") ? STOF_DTYPE_FP16 : STOF_DTYPE_BF16;
            continue;
        }
        if (c == 'd') {
            dir = optarg;
            continue;
        }
        if (c == 'j') {
            json = optarg;
            continue;
        }
        if (c == 'V') {
            printf("stof-bench-trust %s\n", stof_version_string());
            return 0;
        }
        fprintf(c == 'h' ? stdout : stderr,
                "usage: stof-bench-trust [--shape BxHxNxD] [--dtype fp16|bf16]"
                " [--dir DIR] [--json FILE]\n");
        return c == 'h' ? 0 : 2;
    }
    char tmp[] = "/tmp/stof-bench-trust-XXXXXX";
    if (!dir && !(dir = mkdtemp(tmp))) {
        perror("mkdtemp");
        return 1;
    }
    char a[600], b[600];
    snprintf(a, sizeof(a), "%s/fleet.db", dir);
    snprintf(b, sizeof(b), "%s/host.db", dir);
    result r[N_MASKS];
    memset(r, 0, sizeof(r));
    static char js[16384];
    printf("%dx%dx%dx%d %s; cold = tuned into an empty database; first = "
           "first use on another host (verified); trusted = again\n",
           shape[0], shape[1], shape[2], shape[3],
           dt == STOF_DTYPE_BF16 ? "bf16" : "fp16");
    printf("%-11s %10s %10s %12s %11s %11s\n", "mask", "cold s", "first ms",
           "verify ms", "trusted ms", "first/cold");
    int failed = 0;
    for (int i = 0; i < N_MASKS; i++) {
        result *x = &r[i];
        double s;
        int ok = plan_once(a, NULL, masks[i][1], shape, dt, &x->cold_s, js,
                           sizeof(js));
        if (ok)
            source_of(js, x->source[0], sizeof(x->source[0]));
        ok = ok && plan_once(b, a, masks[i][1], shape, dt, &s, js, sizeof(js));
        if (ok) {
            x->first_s = s;
            x->first_verify_ms = field(js, "verify_ms");
            source_of(js, x->source[1], sizeof(x->source[1]));
        }
        ok = ok && plan_once(b, a, masks[i][1], shape, dt, &s, js, sizeof(js));
        if (ok) {
            x->trusted_s = s;
            x->trusted_verify_ms = field(js, "verify_ms");
            source_of(js, x->source[2], sizeof(x->source[2]));
        }
        if (!ok) {
            failed++;
            continue;
        }
        printf("%-11s %10.2f %10.1f %12.1f %11.2f %10.1f%%   (%s, %s, %s)\n",
               masks[i][0], x->cold_s, x->first_s * 1e3, x->first_verify_ms,
               x->trusted_s * 1e3, 100.0 * x->first_s / x->cold_s,
               x->source[0], x->source[1], x->source[2]);
        fflush(stdout);
    }
    if (json) {
        FILE *f = fopen(json, "w");
        if (!f) {
            perror(json);
            return 1;
        }
        fprintf(f, "{\"shape\":[%d,%d,%d,%d],\"dtype\":\"%s\",\"rows\":[",
                shape[0], shape[1], shape[2], shape[3],
                dt == STOF_DTYPE_BF16 ? "bf16" : "fp16");
        for (int i = 0; i < N_MASKS; i++)
            fprintf(f,
                    "%s{\"mask\":\"%s\",\"cold_s\":%.4f,\"first_s\":%.4f,"
                    "\"first_verify_ms\":%.3f,\"trusted_s\":%.5f,"
                    "\"trusted_verify_ms\":%.3f,\"sources\":[\"%s\",\"%s\","
                    "\"%s\"]}",
                    i ? "," : "", masks[i][0], r[i].cold_s, r[i].first_s,
                    r[i].first_verify_ms, r[i].trusted_s,
                    r[i].trusted_verify_ms, r[i].source[0], r[i].source[1],
                    r[i].source[2]);
        fprintf(f, "]}\n");
        fclose(f);
    }
    return failed ? 1 : 0;
}
