/*
 * stof-demo - the main job of a fresh install: builds the public mask suite,
 * its sparse formats and digests on the CPU, and, when a GPU is present,
 * plans masked attention for each mask (a demo tune into the user's tuning
 * database on the first run, database hits after), runs it, checks a
 * sample of rows against the C reference and reports the kernel time.
 */
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cuda_shim.h"
#include "internal.h"

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
#define N_SUITE (int)(sizeof(suite) / sizeof(*suite))

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec * 1e-6;
}

static void usage(FILE *f)
{
    fprintf(f,
            "usage: stof-demo [options]\n"
            "\n"
            "Builds the public mask suite (the masks of "
            "examples/suite.workload) and\nits sparse formats on the CPU; "
            "with a GPU, also plans, runs and checks\nmasked attention for "
            "each mask.\n"
            "\n"
            "options:\n"
            "  --seq N        sequence length (default 4096)\n"
            "  --batch N      batch (default 1)\n"
            "  --heads N      heads (default 8)\n"
            "  --head-dim N   head dimension (default 64)\n"
            "  --bf16         use bf16 instead of fp16\n"
            "  --cpu-only     do not touch the GPU even if one is present\n"
            "  -h, --help     this text\n"
            "  --version      the stof version and template hash\n"
            "\n"
            "exit status: 0 on success (also without a GPU), 1 when a check "
            "failed,\n2 on bad usage.\n");
}

static int parse_int(const char *s, const char *opt, int lo, int hi, int *out)
{
    char *end;
    long v = strtol(s, &end, 10);
    if (!*s || *end || v < lo || v > hi) {
        fprintf(stderr, "stof-demo: %s: '%s' is not an integer in %d..%d\n",
                opt, s, lo, hi);
        return 0;
    }
    *out = (int)v;
    return 1;
}

typedef struct demo_opts {
    int seq, batch, heads, head_dim, cpu_only;
    stof_dtype dtype;
} demo_opts;


/* Run one mask on the GPU: plan, run, time, check sampled rows. Returns 0 on
 * success, 1 on a failed check, 2 on an error. */
static int gpu_one(stof_context *ctx, const demo_opts *o, const stof_mask *m,
                   const char *name, double *ms_out, double *err_out,
                   double *plan_ms, char *kernel, size_t kernel_n)
{
    stof_attention_desc d;
    stof_attention_desc_init(&d, o->batch, o->heads, o->seq, o->seq,
                             o->head_dim, o->dtype, STOF_LAYOUT_BHSD);
    stof_plan *plan = NULL;
    double t0 = now_ms();
    if (stof_attention_plan(ctx, &d, m, &plan) != STOF_OK) {
        fprintf(stderr, "stof-demo: %s: plan: %s\n", name, stof_errmsg(ctx));
        return 2;
    }
    *plan_ms = now_ms() - t0;
    /* "kernel" and "source" from the plan's description. */
    {
        char js[4096];
        stof_plan_describe(plan, js, sizeof(js), NULL);
        char k[32] = "?", src[32] = "?";
        const char *a = strstr(js, "\"kernel\":\"");
        if (a)
            sscanf(a + 10, "%31[^\"]", k);
        a = strstr(js, "\"source\":\"");
        if (a)
            sscanf(a + 10, "%31[^\"]", src);
        snprintf(kernel, kernel_n, "%s (%s)", k, src);
    }
    const stof_api *api = stof__api();
    size_t n = (size_t)o->batch * o->heads * o->seq * o->head_dim;
    uint16_t *h = malloc(n * 2 * 4);
    if (!h) {
        stof_plan_free(&plan);
        return 2;
    }
    uint16_t *hq = h, *hk = h + n, *hv = h + 2 * n, *ho = h + 3 * n;
    uint64_t s = 0x5eed;
    for (size_t i = 0; i < 3 * n; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        float x = (float)((s >> 40) * (1.0 / 16777216.0) * 2.0 - 1.0);
        h[i] = stof__f32_to_half(x, o->dtype);
    }
    CUdeviceptr dq = 0, dk = 0, dv = 0, dout = 0;
    CUevent e0 = NULL, e1 = NULL;
    int rc = 2;
    if (stof__ctx_push(ctx) != STOF_OK)
        goto out_nopop;
    if (api->cuMemAlloc(&dq, n * 2) || api->cuMemAlloc(&dk, n * 2) ||
        api->cuMemAlloc(&dv, n * 2) || api->cuMemAlloc(&dout, n * 2) ||
        api->cuMemcpyHtoD(dq, hq, n * 2) || api->cuMemcpyHtoD(dk, hk, n * 2) ||
        api->cuMemcpyHtoD(dv, hv, n * 2) ||
        api->cuMemsetD8(dout, 0xff, n * 2) ||
        api->cuEventCreate(&e0, CU_EVENT_DEFAULT) ||
        api->cuEventCreate(&e1, CU_EVENT_DEFAULT)) {
        fprintf(stderr, "stof-demo: %s: device memory setup failed\n", name);
        goto out;
    }
    void *pq = (void *)(uintptr_t)dq, *pk = (void *)(uintptr_t)dk,
         *pv = (void *)(uintptr_t)dv, *po = (void *)(uintptr_t)dout;
    if (stof_attention_run(plan, pq, pk, pv, po, NULL) != STOF_OK ||
        api->cuCtxSynchronize() != CUDA_SUCCESS) {
        fprintf(stderr, "stof-demo: %s: run failed: %s\n", name,
                stof_plan_errmsg(plan));
        goto out;
    }
    if (api->cuMemcpyDtoH(ho, dout, n * 2))
        goto out;
    const int reps = 10;
    api->cuEventRecord(e0, NULL);
    for (int r = 0; r < reps; r++)
        stof_attention_run(plan, pq, pk, pv, po, NULL);
    api->cuEventRecord(e1, NULL);
    api->cuEventSynchronize(e1);
    float ms = 0;
    api->cuEventElapsedTime(&ms, e0, e1);
    *ms_out = ms / reps;

    /* Check 16 sampled rows of batch 0, head 0 against the C reference,
     * computed on a one-head problem built from those rows. */
    {
        stof_attention_desc one;
        stof_attention_desc_init(&one, 1, 1, o->seq, o->seq, o->head_dim,
                                 o->dtype, STOF_LAYOUT_BHSD);
        size_t n1 = (size_t)o->seq * o->head_dim;
        float *f = malloc(n1 * 4 * sizeof(float));
        if (!f)
            goto out;
        for (size_t i = 0; i < n1; i++) {
            f[i] = stof__half_to_f32(hq[i], o->dtype);
            f[n1 + i] = stof__half_to_f32(hk[i], o->dtype);
            f[2 * n1 + i] = stof__half_to_f32(hv[i], o->dtype);
        }
        stof__ref_attention(&one, m, f, f + n1, f + 2 * n1, f + 3 * n1);
        double num = 0, den = 0;
        for (int t = 0; t < 16; t++) {
            int row = (int)((size_t)t * (o->seq - 1) / 15);
            for (int c = 0; c < o->head_dim; c++) {
                size_t idx = (size_t)row * o->head_dim + c;
                double g = stof__half_to_f32(ho[idx], o->dtype), w = f[3 * n1 + idx];
                if (!isfinite(g))
                    num = INFINITY;
                num += (g - w) * (g - w);
                den += w * w;
            }
        }
        free(f);
        *err_out = den > 0 ? sqrt(num / den) : sqrt(num);
        rc = *err_out < 1e-2 ? 0 : 1;
    }
out:
    if (e0)
        api->cuEventDestroy(e0);
    if (e1)
        api->cuEventDestroy(e1);
    if (dq)
        api->cuMemFree(dq);
    if (dk)
        api->cuMemFree(dk);
    if (dv)
        api->cuMemFree(dv);
    if (dout)
        api->cuMemFree(dout);
    stof__ctx_pop(ctx);
out_nopop:
    free(h);
    stof_plan_free(&plan);
    return rc;
}



static int demo(int argc, char **argv)
{
    demo_opts o = {4096, 1, 8, 64, 0, STOF_DTYPE_FP16};
    static const struct option longopts[] = {
        {"seq", required_argument, 0, 's'},
        {"batch", required_argument, 0, 'b'},
        {"heads", required_argument, 0, 'H'},
        {"head-dim", required_argument, 0, 'd'},
        {"bf16", no_argument, 0, 'B'},
        {"cpu-only", no_argument, 0, 'c'},
        {"help", no_argument, 0, 'h'},
        {"version", no_argument, 0, 'V'},
        {0, 0, 0, 0},
    };
    int c;
    while ((c = getopt_long(argc, argv, "h", longopts, NULL)) != -1) {
        switch (c) {
        case 's':
            if (!parse_int(optarg, "--seq", 1, 65536, &o.seq))
                return 2;
            break;
        case 'b':
            if (!parse_int(optarg, "--batch", 1, 64, &o.batch))
                return 2;
            break;
        case 'H':
            if (!parse_int(optarg, "--heads", 1, 256, &o.heads))
                return 2;
            break;
        case 'd':
            if (!parse_int(optarg, "--head-dim", 16, 256, &o.head_dim))
                return 2;
            if (o.head_dim % 8) {
                fprintf(stderr, "stof-demo: --head-dim %d: must be a multiple "
                                "of 8\n", o.head_dim);
                return 2;
            }
            break;
        case 'B':
            o.dtype = STOF_DTYPE_BF16;
            break;
        case 'c':
            o.cpu_only = 1;
            break;
        case 'h':
            usage(stdout);
            return 0;
        case 'V':
            printf("stof-demo %s (templates %016llx)\n", stof_version_string(),
                   (unsigned long long)stof_template_hash());
            return 0;
        default:
            usage(stderr);
            return 2;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "stof-demo: unexpected argument '%s'\n", argv[optind]);
        usage(stderr);
        return 2;
    }

    stof_context *ctx = NULL;
    if (stof_open(&ctx, NULL) != STOF_OK) {
        fprintf(stderr, "stof-demo: %s\n", stof_errmsg(ctx));
        stof_close(&ctx);
        return 1;
    }
    printf("stof %s, template hash %016llx\n", stof_version_string(),
           (unsigned long long)stof_template_hash());
    int use_gpu = !o.cpu_only && stof_has_device(ctx);
    if (stof_has_device(ctx)) {
        char dev[1024];
        stof_device_describe(ctx, dev, sizeof(dev), NULL);
        printf("device: %s\n", dev);
    } else {
        stof_settings s;
        stof_default_settings(&s);
        s.require_device = 1;
        stof_context *probe = NULL;
        stof_open(&probe, &s);
        printf("no GPU found (%s): running the CPU-side demo only\n",
               stof_errmsg(probe));
        stof_close(&probe);
    }

    printf("\nmask suite at %d x %d, formats for 128 x 64 tiles\n", o.seq,
           o.seq);
    printf("%-11s %-20s %8s %9s %9s %7s %7s %7s  %-32s\n", "mask", "spec",
           "density", "mask ms", "fmt ms", "full", "partial", "empty",
           "digest");
    int failures = 0;
    stof_mask *masks[N_SUITE] = {0};
    for (int i = 0; i < N_SUITE; i++) {
        double t0 = now_ms();
        if (stof_mask_from_spec(ctx, suite[i].spec, o.seq, o.seq,
                                &masks[i]) != STOF_OK) {
            fprintf(stderr, "stof-demo: %s: %s\n", suite[i].name,
                    stof_errmsg(ctx));
            failures++;
            continue;
        }
        double t1 = now_ms();
        stof_format *f = NULL;
        if (stof_format_build(ctx, masks[i], 128, 64, &f) != STOF_OK) {
            fprintf(stderr, "stof-demo: %s: %s\n", suite[i].name,
                    stof_errmsg(ctx));
            failures++;
            continue;
        }
        double t2 = now_ms();
        char hex[33];
        stof_mask_digest(masks[i], NULL, hex);
        printf("%-11s %-20s %8.4f %9.2f %9.2f %7lld %7lld %7lld  %s\n",
               suite[i].name, suite[i].spec, stof_mask_density(masks[i]),
               t1 - t0, t2 - t1, (long long)f->n_full,
               (long long)f->n_partial, (long long)f->n_empty, hex);
        stof_format_free(&f);
    }

    if (use_gpu) {
        printf("\nattention %dx%dx%dx%d d=%d %s: planned (tuned on a miss, "
               "loaded from the tuning database on a hit), 16 rows checked "
               "against the C reference\n",
               o.batch, o.heads, o.seq, o.seq, o.head_dim,
               o.dtype == STOF_DTYPE_FP16 ? "fp16" : "bf16");
        printf("%-11s %-26s %9s %9s %9s %9s  %s\n", "mask", "kernel (source)",
               "plan ms", "ms", "eff TF/s", "rel err", "check");
        for (int i = 0; i < N_SUITE; i++) {
            if (!masks[i])
                continue;
            double ms = 0, err = 0, plan_ms = 0;
            char kernel[64] = "";
            int rc = gpu_one(ctx, &o, masks[i], suite[i].name, &ms, &err,
                             &plan_ms, kernel, sizeof(kernel));
            if (rc == 2) {
                failures++;
                continue;
            }
            double flops = 4.0 * o.batch * o.heads * (double)o.seq * o.seq *
                           o.head_dim * stof_mask_density(masks[i]);
            printf("%-11s %-26s %9.1f %9.3f %9.1f %9.2e  %s\n", suite[i].name,
                   kernel, plan_ms, ms, flops / (ms * 1e-3) / 1e12, err,
                   rc ? "FAIL" : "ok");
            failures += rc;
        }
    }
    for (int i = 0; i < N_SUITE; i++)
        stof_mask_free(&masks[i]);
    stof_close(&ctx);
    if (failures) {
        printf("\n%d check(s) failed\n", failures);
        return 1;
    }
    printf("\nall checks passed\n");
    return 0;
}

int main(int argc, char **argv)
{
    int rc = demo(argc, argv);
    /* Output that could not be written (a full disk, a closed pipe) is a
     * failure, --help included. */
    if (fflush(stdout) != 0 || ferror(stdout)) {
        fprintf(stderr, "stof-demo: cannot write the output: %s\n",
                strerror(errno));
        if (!rc)
            rc = 1;
    }
    return rc;
}
