/*
 * format_build.c - stof-bench-formats: how long the host side of a plan takes
 * for the public mask suite (BENCH.md) at 8192 x 8192: spec -> mask, and
 * mask -> formats for the tilings the kernels use. Also a random dense byte
 * mask (p = 0.1) through stof_mask_from_dense. Prints a table of medians.
 *
 * Usage: stof-bench-formats [seq] [repetitions]   (defaults 8192 and 9)
 */
#include "stof.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof(double), cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

static const struct {
    const char *name, *spec;
} suite[] = {
    {"none", "dense"},
    {"causal", "causal"},
    {"sliding", "sliding:256"},
    {"dilated", "dilated:512:2"},
    {"longformer", "longformer:256:64"},
    {"bigbird", "bigbird:64:3:2:3:1"},
    {"strided", "strided:128"},
};

static const int tilings[3][2] = {{64, 64}, {128, 64}, {128, 128}};

#define MAX_REPS 101

/* Time the three tilings on one mask and print the rest of its table row. */
static int bench_formats(stof_context *ctx, const stof_mask *m, int reps)
{
    int64_t counts[3][3];
    for (int t = 0; t < 3; t++) {
        double ms[MAX_REPS];
        for (int r = 0; r < reps; r++) {
            stof_format *f;
            double t0 = now_ms();
            stof_status st =
                stof_format_build(ctx, m, tilings[t][0], tilings[t][1], &f);
            ms[r] = now_ms() - t0;
            if (st != STOF_OK) {
                fprintf(stderr, "stof_format_build: %s\n", stof_errmsg(ctx));
                return -1;
            }
            counts[t][0] = f->n_full;
            counts[t][1] = f->n_partial;
            counts[t][2] = f->n_empty;
            stof_format_free(&f);
        }
        printf(" %9.2f", median(ms, reps));
    }
    for (int t = 0; t < 3; t++)
        printf("  %lld/%lld/%lld", (long long)counts[t][0],
               (long long)counts[t][1], (long long)counts[t][2]);
    printf("\n");
    return 0;
}

int main(int argc, char **argv)
{
    int seq = argc > 1 ? atoi(argv[1]) : 8192;
    int reps = argc > 2 ? atoi(argv[2]) : 9;
    if (seq < 1 || seq > 65536 || reps < 1 || reps > MAX_REPS) {
        fprintf(stderr, "usage: %s [seq 1..65536] [repetitions 1..%d]\n",
                argv[0], MAX_REPS);
        return 2;
    }
    stof_context *ctx;
    if (stof_open(&ctx, NULL) != STOF_OK) {
        fprintf(stderr, "stof_open: %s\n", stof_errmsg(ctx));
        stof_close(&ctx);
        return 1;
    }
    printf("stof-bench-formats: %d x %d, median of %d, times in ms\n", seq, seq,
           reps);
    printf("%-11s %-20s %8s %9s %9s %9s %9s  %s\n", "mask", "source",
           "density", "->mask", "64x64", "128x64", "128x128",
           "tiles full/partial/empty (64x64  128x64  128x128)");
    int rc = 0;
    for (size_t s = 0; s < sizeof(suite) / sizeof(suite[0]) && !rc; s++) {
        double ms[MAX_REPS];
        stof_mask *m = NULL;
        for (int r = 0; r < reps; r++) {
            stof_mask_free(&m);
            double t0 = now_ms();
            stof_status st = stof_mask_from_spec(ctx, suite[s].spec, seq, seq, &m);
            ms[r] = now_ms() - t0;
            if (st != STOF_OK) {
                fprintf(stderr, "%s: %s\n", suite[s].spec, stof_errmsg(ctx));
                rc = 1;
                break;
            }
        }
        if (rc)
            break;
        printf("%-11s %-20s %8.4f %9.2f", suite[s].name, suite[s].spec,
               stof_mask_density(m), median(ms, reps));
        rc = bench_formats(ctx, m, reps);
        stof_mask_free(&m);
    }

    /* A random dense byte mask, as a user would pass one. */
    if (!rc) {
        size_t n = (size_t)seq * (size_t)seq;
        uint8_t *bytes = malloc(n);
        if (!bytes) {
            fprintf(stderr, "out of memory\n");
            rc = 1;
        } else {
            uint64_t s = 12345;
            for (size_t i = 0; i < n; i++) {
                s = s * 6364136223846793005ull + 1442695040888963407ull;
                bytes[i] = (uint8_t)((s >> 33) % 1000 < 100);
            }
            double ms[MAX_REPS];
            stof_mask *m = NULL;
            for (int r = 0; r < reps && !rc; r++) {
                stof_mask_free(&m);
                double t0 = now_ms();
                if (stof_mask_from_dense(ctx, bytes, seq, seq, &m) != STOF_OK) {
                    fprintf(stderr, "from_dense: %s\n", stof_errmsg(ctx));
                    rc = 1;
                }
                ms[r] = now_ms() - t0;
            }
            if (!rc) {
                printf("%-11s %-20s %8.4f %9.2f", "random", "dense bytes p=0.1",
                       stof_mask_density(m), median(ms, reps));
                rc = bench_formats(ctx, m, reps);
            }
            stof_mask_free(&m);
            free(bytes);
        }
    }
    stof_close(&ctx);
    return rc;
}
