/*
 * bench_family.c - the cost of a new mask instance: building the block-wise
 * format on the GPU (mask_build.cu: classify, scan, fill) for the situations
 * of issue 12, against building it on the CPU (stof_format_build_family,
 * one sequence after the other) and the bit-matrix path (mask, then
 * stof_format_build). GPU times: CUDA events around 200 builds, median of
 * 5 such runs; CPU times: wall clock, best of 3.
 *
 * Usage: stof-bench-family [--quick]. Exits 77 without a GPU.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cuda_shim.h"
#include "internal.h"
#include "mask_build.h"

static double now_ms(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e3 + (double)t.tv_nsec * 1e-6;
}

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static uint64_t next(void)
{
    uint64_t z = (rng += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}
static int between(int lo, int hi)
{
    return lo + (int)(next() % (uint64_t)(hi - lo + 1));
}

typedef struct scenario {
    const char *name, *spec;
    int batch, seq, bm, bn;
    int docs_lo, docs_hi; /* packed documents of these lengths (0: none) */
    int len_lo, len_hi;   /* per-sequence lengths (0: full) */
} scenario;

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv)
{
    int quick = argc > 1 && strcmp(argv[1], "--quick") == 0;
    stof_settings set;
    stof_default_settings(&set);
    stof_context *ctx = NULL;
    if (stof_open(&ctx, &set) != STOF_OK || !stof_has_device(ctx)) {
        fprintf(stderr, "no GPU: %s\n", ctx ? stof_errmsg(ctx) : "");
        stof_close(&ctx);
        return 77;
    }
    const stof_api *api = stof__api();
    stof_mb_kernels k;
    double t0 = now_ms();
    if (stof__mb_load(ctx, &k) != STOF_OK) {
        fprintf(stderr, "%s\n", stof_errmsg(ctx));
        return 1;
    }
    printf("builder compile+load: %.1f ms (once per process)\n\n",
           now_ms() - t0);
    static const scenario sc[] = {
        {"packed docs 1x4096", "causal&docs", 1, 4096, 128, 64, 50, 900, 0, 0},
        {"packed docs 1x4096 (128x128)", "causal&docs", 1, 4096, 128, 128, 50,
         900, 0, 0},
        {"padded 8 x 64..512", "dense", 8, 512, 128, 64, 0, 0, 64, 512},
        {"padded 16 x 128..2048", "dense", 16, 2048, 128, 64, 0, 0, 128,
         2048},
        {"padded causal 16 x 128..2048", "causal", 16, 2048, 128, 64, 0, 0,
         128, 2048},
        {"sliding:4096 at 65536", "sliding:4096", 1, 65536, 128, 128, 0, 0, 0,
         0},
        {"sliding:4096 at 131072", "sliding:4096", 1, 131072, 128, 128, 0, 0,
         0, 0},
        {"causal&docs at 131072 (docs 1k-32k)", "causal&docs", 1, 131072, 128,
         128, 1000, 32000, 0, 0},
    };
    printf("| situation | tiles | partial | GPU build us | CPU family ms | "
           "CPU bit matrix ms |\n|---|---|---|---|---|---|\n");
    for (size_t s = 0; s < sizeof(sc) / sizeof(sc[0]); s++) {
        const scenario *c = &sc[s];
        if (quick && c->seq > 8192)
            continue;
        const int B = c->batch, N = c->seq;
        int32_t *ql = malloc(sizeof(int32_t) * (size_t)B);
        int32_t *doc = malloc(sizeof(int32_t) * (size_t)B * (size_t)N);
        for (int b = 0; b < B; b++) {
            ql[b] = c->len_lo ? between(c->len_lo, c->len_hi) : N;
            int d = 0, left = c->docs_lo ? between(c->docs_lo, c->docs_hi) : N;
            for (int i = 0; i < N; i++) {
                if (left-- == 0) {
                    d++;
                    left = between(c->docs_lo, c->docs_hi) - 1;
                }
                doc[(size_t)b * (size_t)N + (size_t)i] = d;
            }
        }
        stof_mask_family *fam = NULL;
        stof_mask_family_create(ctx, c->spec, &fam);
        stof_mb_workspace ws;
        if (stof__mb_workspace_new(ctx, fam, B, N, N, c->bm, c->bn, &ws) !=
            STOF_OK) {
            printf("| %s | %s |\n", c->name, stof_errmsg(ctx));
            continue;
        }
        stof__ctx_push(ctx);
        CUdeviceptr dl = 0, dd = 0;
        api->cuMemAlloc(&dl, sizeof(int32_t) * (size_t)B);
        api->cuMemAlloc(&dd, sizeof(int32_t) * (size_t)B * (size_t)N);
        api->cuMemcpyHtoD(dl, ql, sizeof(int32_t) * (size_t)B);
        api->cuMemcpyHtoD(dd, doc, sizeof(int32_t) * (size_t)B * (size_t)N);
        stof_mb_data md = {0};
        if (c->len_lo)
            md.q_len = md.k_len = dl;
        if (c->docs_lo)
            md.doc_id = dd;
        CUstream st;
        api->cuStreamCreate(&st, 1);
        CUevent e0, e1;
        api->cuEventCreate(&e0, 0);
        api->cuEventCreate(&e1, 0);
        stof__mb_build(&k, &ws, &md, st, api);
        api->cuStreamSynchronize(st);
        double runs[5];
        const int reps = 200;
        for (int r = 0; r < 5; r++) {
            api->cuEventRecord(e0, st);
            for (int i = 0; i < reps; i++)
                stof__mb_build(&k, &ws, &md, st, api);
            api->cuEventRecord(e1, st);
            api->cuEventSynchronize(e1);
            float ms = 0;
            api->cuEventElapsedTime(&ms, e0, e1);
            runs[r] = ms * 1000.0 / reps;
        }
        qsort(runs, 5, sizeof(double), cmp_d);
        int64_t stats[4];
        api->cuMemcpyDtoH(stats, ws.stats, sizeof(stats));
        api->cuMemFree(dl);
        api->cuMemFree(dd);
        api->cuStreamDestroy(st);
        stof__ctx_pop(ctx);

        /* CPU: the family builder, every sequence; the bit-matrix path. */
        stof_mask_data hd;
        memset(&hd, 0, sizeof(hd));
        if (c->len_lo)
            hd.q_len = hd.k_len = ql;
        if (c->docs_lo)
            hd.doc_id = doc;
        double fam_ms = 1e30, bit_ms = 1e30;
        for (int r = 0; r < (N > 8192 ? 1 : 3); r++) {
            double a = now_ms();
            for (int b = 0; b < B; b++) {
                stof_format *f = NULL;
                stof_format_build_family(ctx, fam, N, N, &hd, b, c->bm, c->bn,
                                         &f);
                stof_format_free(&f);
            }
            double m1 = now_ms() - a;
            fam_ms = m1 < fam_ms ? m1 : fam_ms;
            if (N > 65536)
                continue; /* a bit matrix of 2 GB: not timed */
            a = now_ms();
            for (int b = 0; b < B; b++) {
                stof_mask *m = NULL;
                stof_format *f = NULL;
                stof_mask_family_eval(ctx, fam, N, N, &hd, b, &m);
                stof_format_build(ctx, m, c->bm, c->bn, &f);
                stof_format_free(&f);
                stof_mask_free(&m);
            }
            double m2 = now_ms() - a;
            bit_ms = m2 < bit_ms ? m2 : bit_ms;
        }
        char bits[32];
        if (bit_ms < 1e29)
            snprintf(bits, sizeof(bits), "%.2f", bit_ms);
        else
            snprintf(bits, sizeof(bits), "-");
        printf("| %s (%dx%d tiles) | %lld | %lld | %.1f | %.2f | %s |\n",
               c->name, c->bm, c->bn, (long long)stats[0],
               (long long)stats[1], runs[2], fam_ms, bits);
        fflush(stdout);
        stof__mb_workspace_free(ctx, &ws);
        stof_mask_family_free(&fam);
        free(ql);
        free(doc);
    }
    stof__mb_unload(ctx, &k);
    stof_close(&ctx);
    return 0;
}
