/*
 * trace_wgmma.c - stof-trace-wgmma: where a Hopper wgmma attention kernel's
 * time goes, phase by phase. The kernel (jit_templates/attn_wgmma.cu) is
 * built with WG_TRACE=1, a diagnostic build whose first consumer warp and
 * producer stamp each work item's phases with the SM clock (see WG_TRACE
 * there); this program launches it as a plan would (the format, the row
 * order, the persistent schedule and CTAs of src/ops/attention.c), reads
 * the stamps back and prints:
 *   - the kernel's time (median of 20 launches of the traced build with
 *     its trace off, so the same code as the timed one), the CTAs' start
 *     skew and span and the SM clock;
 *   - the mean cycles of each phase of an item: waiting for its Q, for its
 *     first K, the first S, the first tile's softmax, the other tiles, the
 *     last P V, staging O, storing it; the first item of each CTA (the
 *     launch's ramp) apart from the later ones;
 *   - each phase's share of the consumers' time, and a least-squares fit
 *     of an item's cycles against its tiles (per tile, fixed).
 * fp16, BHSD, random inputs. A diagnostic, like the GEMM's GW_TRACE
 * (test_gpu_gemm gpu/trace_hopper): the stamps cost a few instructions a
 * phase.
 *
 * Usage: stof-trace-wgmma [BxHxSxD SPEC CFG]...
 *   CFG: bm64|bm128, bn64|bn128, s<stages>, ov0|ov1 and optionally p
 *   (persistent), joined by commas: "bm64,bn64,s2,ov1,p".
 * Without arguments: 8x12x512x64 and 16x12x2048x64 (the BERT-base layer
 * stacks' attention) on bigbird:64:3:2:3:1, each with the persistent 64 x 64
 * kernel (two stages, the overlap) and the four-CTA one (two stages, no
 * overlap), and 16x12x2048x64 dense with the persistent one.
 * Needs a compute capability 9.0 GPU (exits 77 otherwise).
 */
#include "bench_hopper.h"

#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* As WG_TRACE in attn_wgmma.cu. */
#define TR_K 12
#define TR_ITEMS(persist) ((persist) ? 64 : 1)

typedef CUresult (*get_global_fn)(CUdeviceptr *, size_t *, CUmodule,
                                  const char *);

static int cmp_float(const void *a, const void *b)
{
    float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

static uint16_t rand_h(uint64_t *s)
{
    /* a uniform value in [-1, 1) as fp16 bits */
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    const float f = (float)((*s >> 40) & 0xffffff) / 8388608.0f - 1.0f;
    return stof__f32_to_half(f, STOF_DTYPE_FP16);
}

static int parse_cfg(const char *s, stof_wgmma_cfg *c)
{
    memset(c, 0, sizeof(*c));
    c->block_n = 64;
    c->stages = 2;
    c->overlap = 1;
    char buf[128];
    snprintf(buf, sizeof(buf), "%s", s);
    for (char *t = strtok(buf, ","); t; t = strtok(NULL, ",")) {
        int v;
        if (sscanf(t, "bm%d", &v) == 1)
            c->block_m = v == 128 ? 0 : v;
        else if (sscanf(t, "bn%d", &v) == 1)
            c->block_n = v;
        else if (sscanf(t, "ov%d", &v) == 1)
            c->overlap = v;
        else if (sscanf(t, "s%d", &v) == 1)
            c->stages = v;
        else if (strcmp(t, "p") == 0)
            c->persist = 1;
        else
            return 0;
    }
    return 1;
}

typedef struct phase {
    const char *name;
    int from, to; /* stamps */
} phase;

static const phase phases[] = {
    {"wait for Q", 0, 1},
    {"wait for the first K", 1, 2},
    {"first S", 2, 3},
    {"first tile's softmax", 3, 4},
    {"tiles 2..n", 4, 5},
    {"last P V (its V's wait)", 5, 6},
    {"O staged", 6, 7},
    {"O stored", 7, 8},
};
#define N_PH ((int)(sizeof(phases) / sizeof(phases[0])))

typedef struct acc {
    double sum[N_PH], total;
    double tiles;
    int n;
} acc;

/* One item's record r into a (items with tiles only). */
static void acc_item(acc *a, const unsigned long long *r)
{
    for (int p = 0; p < N_PH; p++)
        a->sum[p] += (double)(r[phases[p].to] - r[phases[p].from]);
    a->total += (double)(r[8] - r[0]);
    a->tiles += (double)r[9];
    a->n++;
}

static void print_acc(const char *what, const acc *a, double ghz)
{
    if (!a->n)
        return;
    printf("  %s: %d items, %.2f tiles each, %.0f cycles (%.2f us) an item\n",
           what, a->n, a->tiles / a->n, a->total / a->n,
           a->total / a->n / ghz * 1e-3);
    for (int p = 0; p < N_PH; p++)
        printf("    %-26s %7.0f cycles  %5.1f%%\n", phases[p].name,
               a->sum[p] / a->n, 100.0 * a->sum[p] / a->total);
}

static int trace_one(stof_context *ctx, get_global_fn get_global, int B,
                     int H, int S, int D, const char *spec,
                     const stof_wgmma_cfg *c)
{
    const stof_api *api = ctx->api;
    char why[256];
    if (!stof__wgmma_cfg_valid(&ctx->device, D, c, why, sizeof(why))) {
        fprintf(stderr, "configuration not valid here: %s\n", why);
        return 1;
    }
    stof_attention_desc d;
    stof_attention_desc_init(&d, B, H, S, S, D, STOF_DTYPE_FP16,
                             STOF_LAYOUT_BHSD);
    stof_mask *m = NULL;
    stof_format *f = NULL;
    stof_block_format bf;
    memset(&bf, 0, sizeof(bf));
    int rc = 1;
    CUmodule mod = NULL;
    CUfunction fn = NULL;
    void *bin = NULL;
    size_t bin_size = 0;
    int32_t *order = NULL, *list = NULL;
    unsigned long long *h = NULL;
    uint16_t *hin = NULL;
    CUdeviceptr buf[4] = {0}, dord = 0, dsched = 0, dtr = 0, gptr = 0;
    CUevent ev[40] = {0};
    int pushed = 0;
    if (stof_mask_from_spec(ctx, spec, S, S, &m) != STOF_OK ||
        stof_format_build(ctx, m, stof__wgmma_format_block_m(c), c->block_n,
                          &f) != STOF_OK ||
        stof__block_format_upload(ctx, f, &bf) != STOF_OK) {
        fprintf(stderr, "%s: %s\n", spec, stof_errmsg(ctx));
        goto done;
    }
    if (stof__wgmma_compile_with(ctx, D, STOF_DTYPE_FP16, c, "WG_TRACE=1",
                                 &bin, &bin_size) != STOF_OK ||
        stof__wgmma_load_cubin(ctx, D, c, bin, &mod, &fn) != STOF_OK) {
        fprintf(stderr, "build: %s\n", stof_errmsg(ctx));
        goto done;
    }
    const int nrb = f->n_row_blocks;
    const int64_t items = (int64_t)nrb * B * H;
    int ctas = (int)items, heads = 0;
    size_t nl = 0;
    if (c->persist) {
        const int pc = stof__wgmma_persist_ctas(&ctx->device, D, c);
        ctas = pc < items ? pc : (int)items;
        heads = stof__wgmma_format_persist_heads(&ctx->device, &d, c, f);
        list = stof__wgmma_format_persist_list(&ctx->device, &d, c, f, &nl);
    }
    if (!(order = malloc(sizeof(int32_t) * (size_t)nrb)))
        goto done;
    stof__wgmma_row_order(f, order);
    const size_t elems = (size_t)B * H * S * D;
    if (!(hin = malloc(elems * 2u)))
        goto done;
    uint64_t seed = 0x7eaceull;
    if (stof__ctx_push(ctx) != STOF_OK)
        goto done;
    pushed = 1;
    for (int t = 0; t < 4; t++) {
        if (api->cuMemAlloc(&buf[t], elems * 2u) != CUDA_SUCCESS)
            goto done;
        for (size_t i = 0; i < elems; i++)
            hin[i] = rand_h(&seed);
        api->cuMemcpyHtoD(buf[t], hin, elems * 2u);
    }
    if (api->cuMemAlloc(&dord, sizeof(int32_t) * (size_t)nrb) !=
        CUDA_SUCCESS)
        goto done;
    api->cuMemcpyHtoD(dord, order, sizeof(int32_t) * (size_t)nrb);
    if (list) {
        if (api->cuMemAlloc(&dsched, nl * 4u) != CUDA_SUCCESS)
            goto done;
        api->cuMemcpyHtoD(dsched, list, nl * 4u);
    }
    const stof_attn_ext x = {.ctas = ctas, .persist_heads = heads,
                             .sched = dsched};
    const int n_items = TR_ITEMS(c->persist);
    const size_t rec = (size_t)(n_items + 1) * TR_K;
    const size_t tr_bytes = (size_t)ctas * rec * 8u;
    size_t gsize = 0;
    if (api->cuMemAlloc(&dtr, tr_bytes) != CUDA_SUCCESS ||
        api->cuMemsetD8(dtr, 0, tr_bytes) != CUDA_SUCCESS ||
        get_global(&gptr, &gsize, mod, "stof_wg_trace") != CUDA_SUCCESS ||
        gsize != 8u) {
        fprintf(stderr, "trace buffer of %zu bytes\n", tr_bytes);
        goto done;
    }
    const CUdeviceptr zero = 0;
    api->cuMemcpyHtoD(gptr, &zero, 8u);
#define LAUNCH()                                                               \
    stof__wgmma_launch_ex(fn, c, D, &d, 0.0f, &bf, dord, buf[0], buf[1],      \
                          buf[2], buf[3], &x, NULL, api)
    enum { REPS = 20 };
    for (int i = 0; i < 2 * REPS; i++)
        if (api->cuEventCreate(&ev[i], 0) != CUDA_SUCCESS)
            goto done;
    for (int i = 0; i < 3; i++)
        if (LAUNCH() != STOF_OK)
            goto done;
    for (int i = 0; i < REPS; i++) {
        api->cuEventRecord(ev[2 * i], NULL);
        if (LAUNCH() != STOF_OK)
            goto done;
        api->cuEventRecord(ev[2 * i + 1], NULL);
    }
    if (api->cuCtxSynchronize() != CUDA_SUCCESS)
        goto done;
    float ms[REPS];
    for (int i = 0; i < REPS; i++)
        api->cuEventElapsedTime(&ms[i], ev[2 * i], ev[2 * i + 1]);
    qsort(ms, REPS, sizeof(float), cmp_float);
    const double t_ms = 0.5 * (ms[REPS / 2 - 1] + ms[REPS / 2]);
    /* The traced launch, after one untraced (the same warm state). */
    api->cuMemcpyHtoD(gptr, &dtr, 8u);
    api->cuEventRecord(ev[0], NULL);
    if (LAUNCH() != STOF_OK)
        goto done;
    api->cuEventRecord(ev[1], NULL);
    if (api->cuCtxSynchronize() != CUDA_SUCCESS)
        goto done;
    float traced_ms = 0;
    api->cuEventElapsedTime(&traced_ms, ev[0], ev[1]);
    api->cuMemcpyHtoD(gptr, &zero, 8u);
    if (!(h = malloc(tr_bytes)) ||
        api->cuMemcpyDtoH(h, dtr, tr_bytes) != CUDA_SUCCESS)
        goto done;
#undef LAUNCH

    /* The CTAs. */
    unsigned long long t0 = ~0ull, t0max = 0, t1 = 0;
    double ghz = 0, active_ns = 0, cta_cycles = 0;
    int n_cta = 0;
    acc first, later;
    memset(&first, 0, sizeof(first));
    memset(&later, 0, sizeof(later));
    double sx = 0, sy = 0, sxx = 0, sxy = 0, prod_q = 0, prod_k = 0;
    int nfit = 0, nprod = 0, empty = 0;
    for (int b = 0; b < ctas; b++) {
        const unsigned long long *r = h + (size_t)b * rec;
        if (!r[0] || !r[3] || r[4] <= r[1])
            continue;
        n_cta++;
        t0 = r[1] < t0 ? r[1] : t0;
        t0max = r[1] > t0max ? r[1] : t0max;
        t1 = r[4] > t1 ? r[4] : t1;
        ghz += (double)(r[3] - r[0]) / (double)(r[4] - r[1]);
        active_ns += (double)(r[4] - r[1]);
        cta_cycles += (double)(r[3] - r[0]);
        const int ni = (int)r[5] < n_items ? (int)r[5] : n_items;
        for (int i = 0; i < ni; i++) {
            const unsigned long long *it = r + (size_t)(1 + i) * TR_K;
            if (!it[9] || !it[8]) {
                empty++;
                continue;
            }
            acc_item(i ? &later : &first, it);
            if (i) {
                const double xv = (double)it[9], yv = (double)(it[8] - it[0]);
                sx += xv, sy += yv, sxx += xv * xv, sxy += xv * yv;
                nfit++;
            }
            if (it[10] && it[11]) {
                /* how long before the consumer wanted it each load went
                 * out (negative: after) */
                prod_q += (double)it[0] - (double)it[10];
                prod_k += (double)it[1] - (double)it[11];
                nprod++;
            }
        }
    }
    if (!n_cta) {
        fprintf(stderr, "no stamps came back\n");
        goto done;
    }
    ghz /= n_cta;
    const double density = stof_mask_density(m);
    printf("\n%dx%dx%dx%d %s (density %.3f), bm%d bn%d s%d ov%d%s: %d CTAs "
           "(%lld items, %lld tiles)\n",
           B, H, S, D, spec, density, stof__wgmma_block_m(c), c->block_n,
           c->stages, c->overlap, c->persist ? " persistent" : "", ctas,
           (long long)items, (long long)f->row_ptr[nrb] * B * H);
    printf("  %.4f ms a launch (median of %d; %.1f TF/s of the allowed "
           "elements), the traced one %.4f ms\n",
           t_ms, REPS,
           4.0 * B * H * (double)S * S * D * density / (t_ms * 1e-3) / 1e12,
           traced_ms);
    printf("  CTAs start over %.2f us, the last ends at %.2f us, a CTA "
           "active %.2f us on average; SM clock %.2f GHz\n",
           (double)(t0max - t0) * 1e-3, (double)(t1 - t0) * 1e-3,
           active_ns / n_cta * 1e-3, ghz);
    print_acc("first item of a CTA", &first, ghz);
    print_acc("later items", &later, ghz);
    if (nfit > 2) {
        const double den = nfit * sxx - sx * sx;
        if (den > 0) {
            const double slope = (nfit * sxy - sx * sy) / den;
            printf("  later items' cycles = %.0f a tile + %.0f (fit over %d "
                   "items)\n",
                   slope, (sy - slope * sx) / nfit, nfit);
        }
    }
    const double items_cycles = first.total + later.total;
    printf("  the consumers' time in items: %.1f%% of the CTAs' (the rest: "
           "the start and the end)\n",
           100.0 * items_cycles / cta_cycles);
    if (nprod)
        printf("  the producer issued Q %.0f and the first K %.0f cycles "
               "before the consumer reached the item (its Q) on average\n",
               prod_q / nprod, prod_k / nprod);
    if (empty)
        printf("  %d items without tiles\n", empty);
    rc = 0;
done:
    for (int i = 0; i < 40; i++)
        if (ev[i])
            api->cuEventDestroy(ev[i]);
    if (!pushed && stof__ctx_push(ctx) == STOF_OK)
        pushed = 1;
    if (pushed) {
        for (int t = 0; t < 4; t++)
            if (buf[t])
                api->cuMemFree(buf[t]);
        if (dord)
            api->cuMemFree(dord);
        if (dsched)
            api->cuMemFree(dsched);
        if (dtr)
            api->cuMemFree(dtr);
        if (mod)
            api->cuModuleUnload(mod);
        stof__ctx_pop(ctx);
    }
    free(h);
    free(hin);
    free(order);
    free(list);
    free(bin);
    stof__block_format_free(ctx, &bf);
    stof_format_free(&f);
    stof_mask_free(&m);
    return rc;
}

int main(int argc, char **argv)
{
    if (argc > 1 && (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h"))) {
        printf("usage: %s [BxHxSxD SPEC CFG]...\n"
               "  CFG: bm64|bm128,bn64|bn128,s<stages>,ov0|ov1[,p]\n"
               "  (p: persistent), e.g. 8x12x512x64 bigbird:64:3:2:3:1 "
               "bm64,bn64,s2,ov1,p\n"
               "Without arguments: the BERT-base stacks' attention shapes.\n",
               argv[0]);
        return 0;
    }
    if (argc > 1 && !strcmp(argv[1], "--version")) {
        printf("stof-trace-wgmma %s\n", stof_version_string());
        return 0;
    }
    if ((argc - 1) % 3) {
        fprintf(stderr, "usage: %s [BxHxSxD SPEC CFG]... (--help)\n",
                argv[0]);
        return 2;
    }
    stof_context *ctx = bench_open_hopper();
    if (!ctx)
        return 77;
    void *lib = dlopen("libcuda.so.1", RTLD_NOW);
    get_global_fn get_global =
        lib ? (get_global_fn)(uintptr_t)dlsym(lib, "cuModuleGetGlobal_v2")
            : NULL;
    if (!get_global) {
        fprintf(stderr, "cuModuleGetGlobal_v2 not found\n");
        stof_close(&ctx);
        return 1;
    }
    printf("stof-trace-wgmma on %s (%d SMs)\n", ctx->device.name,
           ctx->device.sm_count);
    static const char *const defaults[] = {
        "8x12x512x64",   "bigbird:64:3:2:3:1", "bm64,bn64,s2,ov1,p",
        "8x12x512x64",   "bigbird:64:3:2:3:1", "bm64,bn64,s2,ov0",
        "16x12x2048x64", "bigbird:64:3:2:3:1", "bm64,bn64,s2,ov1,p",
        "16x12x2048x64", "bigbird:64:3:2:3:1", "bm64,bn64,s2,ov0",
        "16x12x2048x64", "dense",              "bm64,bn64,s2,ov1,p",
    };
    const char *const *args = argc > 1 ? (const char *const *)argv + 1
                                       : defaults;
    const int n = argc > 1 ? argc - 1
                           : (int)(sizeof(defaults) / sizeof(*defaults));
    int rc = 0;
    for (int i = 0; i + 2 < n && !rc; i += 3) {
        int B, H, S, D;
        stof_wgmma_cfg c;
        if (sscanf(args[i], "%dx%dx%dx%d", &B, &H, &S, &D) != 4 || B < 1 ||
            H < 1 || S < 1 || (D != 64 && D != 128) ||
            !parse_cfg(args[i + 2], &c)) {
            fprintf(stderr, "bad problem or configuration: %s %s\n",
                    args[i], args[i + 2]);
            rc = 2;
            break;
        }
        rc = trace_one(ctx, get_global, B, H, S, D, args[i + 1], &c);
    }
    dlclose(lib);
    stof_close(&ctx);
    return rc;
}
