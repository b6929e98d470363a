/*
 * test_gpu.c - the "gpu" suite: kernels against the C reference on fresh
 * random inputs, outputs poisoned first. Every test skips with a message
 * when no GPU is usable.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cuda_shim.h"
#include "attention_int.h"
#include "internal.h"
#include "testutil.h"

/* Open a context or skip the test. */
static stof_context *open_or_skip(void)
{
    stof_settings s;
    stof_default_settings(&s);
    s.user_db = ""; /* tests never touch the user's tuning database */
    return tu_open_gpu_or_skip(&s);
}

typedef struct gpu_case {
    const char *spec;
    int batch, heads, seq_q, seq_k, head_dim;
    stof_dtype dtype;
    stof_layout layout;
    int pad; /* extra elements per row for STOF_LAYOUT_STRIDED */
    int reference; /* 1: force the reference kernel, else the model's pick */
} gpu_case;

/* Run plan (of d and m) on fresh random inputs, its output poisoned
 * first, and compare with the C reference; returns the relative error.
 * Rows without an allowed key must come out 0. */
static double run_plan_check(stof_context *ctx, stof_plan *plan,
                             const stof_attention_desc *dp, const stof_mask *m,
                             tu_rng *rng)
{
    const stof_attention_desc d = *dp;
    const int batch = d.batch, heads = d.heads, seq_q = d.seq_q,
              seq_k = d.seq_k, head_dim = d.head_dim;
    size_t nq = tu_tensor_elems(d.q_stride, batch, heads, seq_q, head_dim);
    size_t nk = tu_tensor_elems(d.k_stride, batch, heads, seq_k, head_dim);
    uint16_t *hq = malloc(nq * 2), *hk = malloc(nk * 2), *hv = malloc(nk * 2),
             *ho = malloc(nq * 2);
    float *fq = calloc(nq, 4), *fk = calloc(nk, 4), *fv = calloc(nk, 4),
          *fo = calloc(nq, 4);
    cr_assert(hq && hk && hv && ho && fq && fk && fv && fo);
    tu_fill_random(rng, hq, fq, nq, d.dtype, 2.0f);
    tu_fill_random(rng, hk, fk, nk, d.dtype, 2.0f);
    tu_fill_random(rng, hv, fv, nk, d.dtype, 1.0f);

    const stof_api *api = stof__api();
    cr_assert_eq(stof__ctx_push(ctx), STOF_OK);
    CUdeviceptr dq, dk, dv, dout;
    cr_assert_eq(api->cuMemAlloc(&dq, nq * 2), CUDA_SUCCESS);
    cr_assert_eq(api->cuMemAlloc(&dk, nk * 2), CUDA_SUCCESS);
    cr_assert_eq(api->cuMemAlloc(&dv, nk * 2), CUDA_SUCCESS);
    cr_assert_eq(api->cuMemAlloc(&dout, nq * 2), CUDA_SUCCESS);
    cr_assert_eq(api->cuMemcpyHtoD(dq, hq, nq * 2), CUDA_SUCCESS);
    cr_assert_eq(api->cuMemcpyHtoD(dk, hk, nk * 2), CUDA_SUCCESS);
    cr_assert_eq(api->cuMemcpyHtoD(dv, hv, nk * 2), CUDA_SUCCESS);
    /* Poison: 0xffff is a NaN in fp16 and bf16, so any element the kernel
     * fails to write makes the comparison fail. */
    cr_assert_eq(api->cuMemsetD8(dout, 0xff, nq * 2), CUDA_SUCCESS);
    stof__ctx_pop(ctx);

    stof_status st = stof_attention_run(
        plan, (void *)(uintptr_t)dq, (void *)(uintptr_t)dk,
        (void *)(uintptr_t)dv, (void *)(uintptr_t)dout, NULL);
    cr_assert_eq(st, STOF_OK, "run: %s", stof_plan_errmsg(plan));

    cr_assert_eq(stof__ctx_push(ctx), STOF_OK);
    const char *failed = tu_sync_error();
    cr_assert(!failed, "kernel failed: %s", failed);
    cr_assert_eq(api->cuMemcpyDtoH(ho, dout, nq * 2), CUDA_SUCCESS);
    api->cuMemFree(dq);
    api->cuMemFree(dk);
    api->cuMemFree(dv);
    api->cuMemFree(dout);
    stof__ctx_pop(ctx);

    cr_assert_eq(stof__ref_attention(&d, m, fq, fk, fv, fo), STOF_OK);

    /* Compare only the elements of the output tensor (not the padding). */
    size_t n = (size_t)batch * heads * seq_q * head_dim;
    double *got = malloc(n * sizeof(double)), *want = malloc(n * sizeof(double));
    cr_assert(got && want);
    size_t t = 0;
    int empty_rows_nonzero = 0;
    for (int b = 0; b < batch; b++)
        for (int h = 0; h < heads; h++)
            for (int i = 0; i < seq_q; i++) {
                int row_empty = 1;
                for (int j = 0; j < seq_k && row_empty; j++)
                    row_empty = !stof_mask_get(m, i, j);
                for (int e = 0; e < head_dim; e++) {
                    size_t off = (size_t)(b * d.o_stride[0] + h * d.o_stride[1] +
                                          (int64_t)i * d.o_stride[2] + e);
                    got[t] = d.dtype == STOF_DTYPE_FP16 ? tu_f16_to_f32(ho[off])
                                                        : tu_bf16_to_f32(ho[off]);
                    want[t] = fo[off];
                    if (row_empty && got[t] != 0.0)
                        empty_rows_nonzero++;
                    t++;
                }
            }
    double err = tu_rel_err(got, want, n);
    cr_assert_eq(empty_rows_nonzero, 0,
                 "%d outputs of rows with no allowed key are not 0",
                 empty_rows_nonzero);

    free(got);
    free(want);
    free(hq), free(hk), free(hv), free(ho);
    free(fq), free(fk), free(fv), free(fo);
    return err;
}

/* Run one case through stof_attention_plan/run and compare with the C
 * reference; returns the relative error. kernel: the plan's kernel (NULL:
 * the reference or the model's pick, as c->reference says). */
static double run_case_on(stof_context *ctx, const gpu_case *c, tu_rng *rng,
                          const stof_candidate *kernel)
{
    stof_mask *m = NULL;
    stof_status st = stof_mask_from_spec(ctx, c->spec, c->seq_q, c->seq_k, &m);
    cr_assert_eq(st, STOF_OK, "mask %s: %s", c->spec, stof_errmsg(ctx));

    stof_attention_desc d;
    tu_make_desc(&d, c->batch, c->heads, c->seq_q, c->seq_k, c->head_dim,
                 c->dtype, c->layout, c->pad);
    stof_plan *plan = NULL;
    stof_candidate ref_choice = {.kind = STOF_KERNEL_REFERENCE};
    st = stof__attention_plan_kernel(ctx, &d, m,
                                     c->reference ? &ref_choice : kernel,
                                     &plan);
    cr_assert_eq(st, STOF_OK, "plan %s: %s", c->spec, stof_errmsg(ctx));
    const double err = run_plan_check(ctx, plan, &d, m, rng);
    stof_plan_free(&plan);
    cr_assert_null(plan);
    stof_mask_free(&m);
    return err;
}

static double run_case(stof_context *ctx, const gpu_case *c, tu_rng *rng)
{
    return run_case_on(ctx, c, rng, NULL);
}

static void check_case(stof_context *ctx, const gpu_case *c, tu_rng *rng)
{
    double tol = c->dtype == STOF_DTYPE_FP16 ? 2e-3 : 1e-2;
    double err = run_case(ctx, c, rng);
    cr_log_info("%-24s %dx%dx%dx%d d=%d %s layout=%d %s: rel err %.2e", c->spec,
                c->batch, c->heads, c->seq_q, c->seq_k, c->head_dim,
                c->dtype == STOF_DTYPE_FP16 ? "fp16" : "bf16", (int)c->layout,
                c->reference ? "reference" : "model", err);
    cr_expect(err < tol, "%s %dx%d d=%d %s: relative error %.3e >= %.1e",
              c->spec, c->seq_q, c->seq_k, c->head_dim,
              c->dtype == STOF_DTYPE_FP16 ? "fp16" : "bf16", err, tol);
}

/* A mask's block format is built once per context and shared by the plans
 * that need it (format_cache.c): while the plan that built it lives, and
 * after it is gone; each plan's output still matches the reference. */
Test(gpu, plans_of_one_mask_share_its_block_format)
{
    stof_context *ctx = open_or_skip();
    tu_rng rng = {tu_seed() ^ 7};
    const stof_candidate blk = {.kind = STOF_KERNEL_BLOCK,
                                .cfg = {64, 64, 4, 2, 0, 0, 0}};
    const gpu_case c = {"bigbird:64:3:2:3:1", 2, 3, 1024, 1024, 64,
                        STOF_DTYPE_FP16, STOF_LAYOUT_BHSD, 0, 0};
    /* builds it, then frees its plan */
    double err = run_case_on(ctx, &c, &rng, &blk);
    cr_expect(err < 2e-3, "first plan: relative error %.3e", err);

    stof_mask *m = NULL;
    cr_assert_eq(stof_mask_from_spec(ctx, c.spec, 1024, 1024, &m), STOF_OK);
    stof_attention_desc d;
    tu_make_desc(&d, 2, 3, 1024, 1024, 64, STOF_DTYPE_FP16, STOF_LAYOUT_BHSD,
                 0);
    stof_plan *a = NULL, *b = NULL, *o = NULL;
    cr_assert_eq(stof__attention_plan_kernel(ctx, &d, m, &blk, &a), STOF_OK,
                 "%s", stof_errmsg(ctx));
    cr_assert_eq(stof__attention_plan_kernel(ctx, &d, m, &blk, &b), STOF_OK,
                 "%s", stof_errmsg(ctx));
    cr_assert(a->fmt_ref && a->fmt_ref == b->fmt_ref);
    cr_assert(a->bf.mem && a->bf.mem == b->bf.mem);
    char js[4096];
    stof_plan_describe(b, js, sizeof(js), NULL);
    cr_assert(strstr(js, "\"formats_shared\":true"), "%s", js);
    /* Another tile: a format of its own. */
    const stof_candidate blk2 = {.kind = STOF_KERNEL_BLOCK,
                                 .cfg = {128, 64, 4, 2, 0, 0, 0}};
    cr_assert_eq(stof__attention_plan_kernel(ctx, &d, m, &blk2, &o), STOF_OK,
                 "%s", stof_errmsg(ctx));
    cr_assert(o->bf.mem && o->bf.mem != a->bf.mem);
    stof_plan_free(&a);
    stof_plan_free(&o);
    stof_plan_free(&b);
    stof_mask_free(&m);
    /* Every plan gone, the format kept: a new plan shares it and runs. */
    err = run_case_on(ctx, &c, &rng, &blk);
    cr_expect(err < 2e-3, "shared format: relative error %.3e", err);

    /* Eight formats at most: eight plans of other masks alive take every
     * slot (the two unreferenced bigbird ones give way), a ninth keeps its
     * own; once they are gone, slots are taken again. */
    enum { NP = 9 };
    stof_mask *ms[NP] = {0};
    stof_plan *ps[NP] = {0};
    for (int i = 0; i < NP; i++) {
        char spec[32];
        snprintf(spec, sizeof(spec), "sliding:%d", 64 * (i + 1));
        cr_assert_eq(stof_mask_from_spec(ctx, spec, 1024, 1024, &ms[i]),
                     STOF_OK);
        cr_assert_eq(stof__attention_plan_kernel(ctx, &d, ms[i], &blk, &ps[i]),
                     STOF_OK, "%s", stof_errmsg(ctx));
        if (i < NP - 1)
            cr_expect_not_null(ps[i]->fmt_ref, "plan %d not shared", i);
        else
            cr_expect_null(ps[i]->fmt_ref, "a ninth format was kept");
    }
    for (int i = 0; i < NP; i++) {
        stof_plan_free(&ps[i]);
        stof_mask_free(&ms[i]);
    }
    const gpu_case c2 = {"sliding:192", 2, 3, 1024, 1024, 64, STOF_DTYPE_FP16,
                         STOF_LAYOUT_BHSD, 0, 0};
    err = run_case_on(ctx, &c2, &rng, &blk);
    cr_expect(err < 2e-3, "after evictions: relative error %.3e", err);
    err = run_case_on(ctx, &c, &rng, &blk);
    cr_expect(err < 2e-3, "bigbird rebuilt: relative error %.3e", err);
    stof_close(&ctx);
}

/* Persistent wgmma plans of one mask share the row order and the list
 * schedule made from its shared format (format_cache.c): a schedule per
 * (batch, heads), the same row order for all; a plan made after the first
 * ones are gone borrows the kept arrays and runs correctly on them. 512
 * and 448 items on the 396 CTAs of 132 SMs: schedules that give some CTAs
 * two items. */
Test(gpu, persistent_plans_of_one_mask_share_their_schedule)
{
    stof_context *ctx = open_or_skip();
    if (!stof__wgmma_device_ok(&ctx->device)) {
        stof_close(&ctx);
        cr_skip_test("no sm_90 GPU: the persistent wgmma kernel needs one");
    }
    tu_rng rng = {tu_seed() ^ 11};
    const stof_candidate pk = {.kind = STOF_KERNEL_WGMMA,
                               .cfg = {64, 64, 4, 2, 0, 0, 0},
                               .wcfg = {64, 2, 1, 0, 64, 0, 0, 1}};
    const gpu_case c = {"bigbird:64:3:2:3:1", 8, 4, 1024, 1024, 64,
                        STOF_DTYPE_FP16, STOF_LAYOUT_BHSD, 0, 0};
    const gpu_case c3 = {"bigbird:64:3:2:3:1", 7, 4, 1024, 1024, 64,
                         STOF_DTYPE_FP16, STOF_LAYOUT_BHSD, 0, 0};
    stof_mask *m = NULL;
    cr_assert_eq(stof_mask_from_spec(ctx, c.spec, 1024, 1024, &m), STOF_OK);
    stof_attention_desc d, d3;
    tu_make_desc(&d, 8, 4, 1024, 1024, 64, STOF_DTYPE_FP16,
                 STOF_LAYOUT_BHSD, 0);
    tu_make_desc(&d3, 7, 4, 1024, 1024, 64, STOF_DTYPE_FP16,
                 STOF_LAYOUT_BHSD, 0);
    stof_plan *a = NULL, *b = NULL, *o = NULL, *n = NULL;
    cr_assert_eq(stof__attention_plan_kernel(ctx, &d, m, &pk, &a), STOF_OK,
                 "%s", stof_errmsg(ctx));
    cr_assert_eq(stof__attention_plan_kernel(ctx, &d, m, &pk, &b), STOF_OK,
                 "%s", stof_errmsg(ctx));
    cr_assert_eq(stof__attention_plan_kernel(ctx, &d3, m, &pk, &o), STOF_OK,
                 "%s", stof_errmsg(ctx));
    cr_assert(a->fmt_ref && a->fmt_ref == b->fmt_ref &&
              o->fmt_ref == a->fmt_ref);
    cr_assert(a->d_sched && a->d_row_order, "no schedule or row order");
    cr_expect(a->sched_shared && a->order_shared);
    cr_expect_eq(b->d_sched, a->d_sched, "the schedule was made again");
    cr_expect_eq(b->d_row_order, a->d_row_order);
    cr_expect_eq(b->persist_heads, a->persist_heads);
    cr_expect_eq(b->sched_items, a->sched_items);
    cr_expect_eq(a->sched_items, 16 * 8 * 4);
    /* Seven batch elements: a schedule of their own, the same row order. */
    cr_expect(o->d_sched && o->d_sched != a->d_sched);
    cr_expect_eq(o->d_row_order, a->d_row_order);
    cr_expect_eq(o->sched_items, 16 * 7 * 4);
    const CUdeviceptr sched = a->d_sched, sched3 = o->d_sched;
    stof_plan_free(&a);
    stof_plan_free(&o);
    stof_plan_free(&b);
    /* Every plan gone: a new one borrows the kept arrays. */
    cr_assert_eq(stof__attention_plan_kernel(ctx, &d, m, &pk, &n), STOF_OK,
                 "%s", stof_errmsg(ctx));
    cr_expect(n->sched_shared && n->d_sched == sched,
              "the kept schedule was not found");
    stof_plan_free(&n);
    double err = run_case_on(ctx, &c, &rng, &pk);
    cr_expect(err < 2e-3, "a plan on the kept schedule: relative error %.3e",
              err);
    cr_assert_eq(stof__attention_plan_kernel(ctx, &d3, m, &pk, &n), STOF_OK,
                 "%s", stof_errmsg(ctx));
    cr_expect(n->sched_shared && n->d_sched == sched3);
    stof_plan_free(&n);
    err = run_case_on(ctx, &c3, &rng, &pk);
    cr_expect(err < 2e-3, "seven batch elements: relative error %.3e", err);
    stof_mask_free(&m);
    stof_close(&ctx);
}

static const char *const suite_specs[] = {
    "dense",          "causal",     "sliding:256",
    "dilated:512:2",  "longformer:256:64", "bigbird:64:3:2:3:1",
    "strided:128",
};

Test(gpu, reference_public_suite_fp16)
{
    stof_context *ctx = open_or_skip();
    tu_rng rng = {tu_seed() ^ 1};
    for (size_t i = 0; i < sizeof(suite_specs) / sizeof(*suite_specs); i++) {
        for (int ref = 0; ref < 2; ref++) {
            gpu_case c = {suite_specs[i], 2, 3, 1024, 1024, 64, STOF_DTYPE_FP16,
                          STOF_LAYOUT_BHSD, 0, ref};
            check_case(ctx, &c, &rng);
        }
    }
    stof_close(&ctx);
}

Test(gpu, reference_public_suite_bf16_d128)
{
    stof_context *ctx = open_or_skip();
    tu_rng rng = {tu_seed() ^ 2};
    for (size_t i = 0; i < sizeof(suite_specs) / sizeof(*suite_specs); i++) {
        for (int ref = 0; ref < 2; ref++) {
            gpu_case c = {suite_specs[i], 1, 2, 1024, 1024, 128, STOF_DTYPE_BF16,
                          STOF_LAYOUT_BSHD, 0, ref};
            check_case(ctx, &c, &rng);
        }
    }
    stof_close(&ctx);
}

Test(gpu, reference_odd_sizes)
{
    stof_context *ctx = open_or_skip();
    tu_rng rng = {tu_seed() ^ 3};
    const gpu_case cases[] = {
        {"causal", 1, 2, 1000, 1000, 64, STOF_DTYPE_FP16, STOF_LAYOUT_BHSD, 0, 0},
        {"sliding:100|strided:37", 2, 1, 1000, 3000, 40, STOF_DTYPE_BF16,
         STOF_LAYOUT_BHSD, 0, 0},
        {"bigbird:64:3:2:3:7", 1, 3, 3000, 1000, 128, STOF_DTYPE_FP16,
         STOF_LAYOUT_BSHD, 0, 0},
        {"dense", 1, 1, 1, 1, 16, STOF_DTYPE_FP16, STOF_LAYOUT_BHSD, 0, 0},
        {"dense", 3, 1, 1, 777, 256, STOF_DTYPE_BF16, STOF_LAYOUT_BHSD, 0, 0},
        {"random:0.05:9", 1, 2, 333, 65, 96, STOF_DTYPE_FP16,
         STOF_LAYOUT_STRIDED, 8, 0},
        {"causal_sliding:64", 2, 2, 129, 4097, 64, STOF_DTYPE_BF16,
         STOF_LAYOUT_STRIDED, 16, 0},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(*cases); i++) {
        check_case(ctx, &cases[i], &rng);
        gpu_case r = cases[i];
        r.reference = 1;
        check_case(ctx, &r, &rng);
    }
    stof_close(&ctx);
}

Test(gpu, reference_rows_without_keys)
{
    stof_context *ctx = open_or_skip();
    tu_rng rng = {tu_seed() ^ 4};
    /* "none" has no key at all; the others leave some rows empty. */
    const gpu_case cases[] = {
        {"none", 1, 2, 100, 200, 64, STOF_DTYPE_FP16, STOF_LAYOUT_BHSD, 0, 0},
        {"random:0.002:5", 1, 2, 500, 300, 64, STOF_DTYPE_FP16,
         STOF_LAYOUT_BHSD, 0, 0},
        {"causal&sliding:8&strided:200", 1, 1, 700, 700, 128,
         STOF_DTYPE_BF16, STOF_LAYOUT_BHSD, 0, 0},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(*cases); i++) {
        check_case(ctx, &cases[i], &rng);
        gpu_case r = cases[i];
        r.reference = 1;
        check_case(ctx, &r, &rng);
    }
    stof_close(&ctx);
}

Test(gpu, plan_describe_and_errors)
{
    stof_context *ctx = open_or_skip();
    stof_mask *m = NULL;
    cr_assert_eq(stof_mask_from_spec(ctx, "causal", 256, 256, &m), STOF_OK);
    stof_attention_desc d;
    stof_attention_desc_init(&d, 1, 1, 256, 256, 64, STOF_DTYPE_FP16,
                             STOF_LAYOUT_BHSD);
    stof_plan *p = NULL;
    cr_assert_eq(stof_attention_plan(ctx, &d, m, &p), STOF_OK, "%s",
                 stof_errmsg(ctx));
    size_t need = 0;
    cr_assert_eq(stof_plan_describe(p, NULL, 0, &need),
                 STOF_ERR_BUFFER_TOO_SMALL);
    cr_assert_gt(need, 10);
    char *buf = malloc(need + 1);
    cr_assert_eq(stof_plan_describe(p, buf, need + 1, NULL), STOF_OK);
    cr_assert(strstr(buf, "\"kernel\":\"block\"") ||
                  strstr(buf, "\"kernel\":\"wgmma\""),
              "%s", buf);
    cr_assert(strstr(buf, "\"BLOCK_M\""), "%s", buf);
    cr_assert(strstr(buf, "\"seq_q\":256"), "%s", buf);
    free(buf);
    /* Misaligned and NULL pointers are refused before any launch. */
    char dummy[64];
    void *al = (void *)(((uintptr_t)dummy + 15) & ~(uintptr_t)15);
    cr_assert_eq(stof_attention_run(p, NULL, al, al, al, NULL),
                 STOF_ERR_INVALID_ARGUMENT);
    cr_assert(strstr(stof_plan_errmsg(p), "q is NULL"));
    cr_assert_eq(stof_attention_run(p, (char *)al + 2, al, al, al, NULL),
                 STOF_ERR_INVALID_ARGUMENT);
    cr_assert(strstr(stof_plan_errmsg(p), "aligned"));
    stof_plan_free(&p);
    stof_mask_free(&m);

    /* Device description. */
    size_t n = 0;
    cr_assert_eq(stof_device_describe(ctx, NULL, 0, &n),
                 STOF_ERR_BUFFER_TOO_SMALL);
    char *dj = malloc(n + 1);
    cr_assert_eq(stof_device_describe(ctx, dj, n + 1, NULL), STOF_OK);
    cr_log_info("device: %s", dj);
    free(dj);
    stof_close(&ctx);
}

/* Plan one problem in a child process with the tuning database at `db`;
 * write "<compiles> <plan ms> <describe JSON>" to fd. Runs in a fresh
 * process so that CUDA is initialised only there. */
static void plan_in_child(const char *db, int fd)
{
    stof_settings s;
    stof_default_settings(&s);
    s.user_db = db;
    s.require_device = 1;
    stof_context *ctx = NULL;
    if (stof_open(&ctx, &s) != STOF_OK)
        _exit(3);
    stof_mask *m = NULL;
    stof_attention_desc d;
    stof_attention_desc_init(&d, 2, 4, 1024, 1024, 64, STOF_DTYPE_FP16,
                             STOF_LAYOUT_BHSD);
    if (stof_mask_from_spec(ctx, "bigbird:64:3:2:3:1", 1024, 1024, &m))
        _exit(4);
    long before = stof__jit_compile_count();
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    stof_plan *p = NULL;
    if (stof_attention_plan(ctx, &d, m, &p) != STOF_OK) {
        dprintf(fd, "error %s", stof_errmsg(ctx));
        _exit(5);
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    char js[4096];
    stof_plan_describe(p, js, sizeof(js), NULL);
    dprintf(fd, "%ld %.3f %s", stof__jit_compile_count() - before,
            (t1.tv_sec - t0.tv_sec) * 1e3 + (t1.tv_nsec - t0.tv_nsec) * 1e-6,
            js);
    stof_plan_free(&p);
    stof_mask_free(&m);
    stof_close(&ctx);
    _exit(0);
}

static void run_child(const char *db, char *out, size_t n)
{
    int fds[2];
    cr_assert_eq(pipe(fds), 0);
    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) {
        close(fds[0]);
        plan_in_child(db, fds[1]);
    }
    close(fds[1]);
    size_t got = 0;
    ssize_t r;
    while (got + 1 < n && (r = read(fds[0], out + got, n - 1 - got)) > 0)
        got += (size_t)r;
    out[got] = '\0';
    close(fds[0]);
    int status = 0;
    waitpid(pid, &status, 0);
    cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0,
              "child failed (status %d): %s", status, out);
}

/* The config part of a describe JSON ("params":{...}). */
static void params_of(const char *js, char *out, size_t n)
{
    const char *a = strstr(js, "\"params\":{");
    const char *b = a ? strchr(a, '}') : NULL;
    cr_assert(a && b, "no params in %s", js);
    snprintf(out, n, "%.*s", (int)(b - a + 1), a);
}

Test(gpu, second_process_loads_from_the_database_without_compiling,
     .timeout = 600)
{
    char dir[] = "/tmp/stof-gpu-db-XXXXXX";
    cr_assert_not_null(mkdtemp(dir));
    char db[512];
    snprintf(db, sizeof(db), "%s/tuning.db", dir);
    static char first[8192], second[8192];
    run_child(db, first, sizeof(first));
    run_child(db, second, sizeof(second));
    long c1 = 0, c2 = -1;
    double ms1 = 0, ms2 = 0;
    cr_assert_eq(sscanf(first, "%ld %lf", &c1, &ms1), 2, "%s", first);
    cr_assert_eq(sscanf(second, "%ld %lf", &c2, &ms2), 2, "%s", second);
    cr_log_info("cold plan (tuned): %ld NVRTC compiles, %.1f ms", c1, ms1);
    cr_log_info("warm plan (database): %ld NVRTC compiles, %.2f ms", c2, ms2);
    cr_assert_gt(c1, 1, "the first plan should have tuned: %s", first);
    cr_assert(strstr(first, "\"source\":\"tuned\""), "%s", first);
    cr_assert_eq(c2, 0, "the second process compiled %ld kernels", c2);
    cr_assert(strstr(second, "\"source\":\"user db\""), "%s", second);
    /* The format builder's cubin came from the database too: the tiles
     * were built on the GPU with nothing compiled. */
    cr_assert(strstr(second, "\"formats_built_on\":\"gpu\""), "%s", second);
    char p1[512], p2[512];
    params_of(first, p1, sizeof(p1));
    params_of(second, p2, sizeof(p2));
    cr_assert_str_eq(p1, p2, "different configurations");
    char cmd[600];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
    cr_assert_eq(system(cmd), 0);
}

Test(gpu, batch_warm_up_tunes_misses_together_then_hits, .timeout = 600)
{
    char dir[] = "/tmp/stof-gpu-batch-XXXXXX";
    cr_assert_not_null(mkdtemp(dir));
    char db[512];
    snprintf(db, sizeof(db), "%s/tuning.db", dir);
    stof_settings s;
    stof_default_settings(&s);
    s.user_db = db;
    stof_context *ctx = NULL;
    cr_assert_eq(stof_open(&ctx, &s), STOF_OK);
    const char *specs[4] = {"causal", "sliding:128", "strided:64", "causal"};
    stof_mask *m[4] = {0};
    stof_attention_desc d[4];
    for (int i = 0; i < 4; i++) {
        cr_assert_eq(stof_mask_from_spec(ctx, specs[i], 512, 512, &m[i]),
                     STOF_OK);
        stof_attention_desc_init(&d[i], 1, 4, 512, 512, i == 1 ? 128 : 64,
                                 STOF_DTYPE_FP16, STOF_LAYOUT_BHSD);
    }
    d[3].head_dim = 12; /* invalid: reported, the others still planned */
    stof_plan *p[4];
    long c0 = stof__jit_compile_count();
    stof_status st = stof_attention_plan_batch(
        ctx, 4, d, (const stof_mask *const *)m, p);
    long compiled = stof__jit_compile_count() - c0;
    cr_assert_eq(st, STOF_ERR_INVALID_ARGUMENT, "%s", stof_errmsg(ctx));
    cr_assert(strstr(stof_errmsg(ctx), "problem 3"), "%s", stof_errmsg(ctx));
    cr_assert_null(p[3]);
    char js[4096];
    for (int i = 0; i < 3; i++) {
        cr_assert_not_null(p[i], "problem %d not planned", i);
        stof_plan_describe(p[i], js, sizeof(js), NULL);
        cr_assert(strstr(js, "\"source\":\"tuned\""), "%s", js);
        stof_plan_free(&p[i]);
    }
    cr_log_info("batch of 3 misses: %ld NVRTC compiles", compiled);
    /* Again: every problem from the database, nothing compiled. */
    c0 = stof__jit_compile_count();
    st = stof_attention_plan_batch(ctx, 3, d, (const stof_mask *const *)m, p);
    cr_assert_eq(st, STOF_OK, "%s", stof_errmsg(ctx));
    cr_assert_eq(stof__jit_compile_count() - c0, 0);
    for (int i = 0; i < 3; i++) {
        stof_plan_describe(p[i], js, sizeof(js), NULL);
        cr_assert(strstr(js, "\"source\":\"user db\""), "%s", js);
        stof_plan_free(&p[i]);
    }
    /* A third time: the records come from the database handle's memory
     * and their modules are still in the context's cache, found by the
     * cubins' hashes without their bytes; the plans run correctly. */
    const long loads = stof__module_shared_loads(ctx);
    st = stof_attention_plan_batch(ctx, 3, d, (const stof_mask *const *)m, p);
    cr_assert_eq(st, STOF_OK, "%s", stof_errmsg(ctx));
    cr_assert_eq(stof__module_shared_loads(ctx), loads);
    tu_rng rng = {tu_seed() ^ 0xb47cu};
    for (int i = 0; i < 3; i++) {
        stof_plan_describe(p[i], js, sizeof(js), NULL);
        cr_assert(strstr(js, "\"source\":\"user db\""), "%s", js);
        cr_expect(p[i]->by_hash, "plan %d read its record's cubin: %s", i,
                  js);
        const double err = run_plan_check(ctx, p[i], &d[i], m[i], &rng);
        cr_expect(err < 2e-3, "plan %d: relative error %.3e", i, err);
        stof_plan_free(&p[i]);
    }
    for (int i = 0; i < 4; i++)
        stof_mask_free(&m[i]);
    stof_close(&ctx);
    char cmd[600];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
    cr_assert_eq(system(cmd), 0);
}

/* Criterion's main, after a probe that reports the suite skipped (exit 77)
 * when no GPU is usable. */
__attribute__((visibility("default"))) int main(int argc, char **argv)
{
    return tu_gpu_suite_main("gpu", argc, argv);
}

/* More sequence-heads than a grid's y holds (65535): the attention kernels'
 * grids take the row blocks and the (batch, head) pairs together in x. 17
 * x 4096 = 69632 sequence-heads of 32 causal rows, through the reference
 * kernel, a block kernel, the model's pick and a tuned plan (whose search
 * checks its candidates on the GPU with the reference and diff kernels);
 * heads about 65535 and others sampled, against the C reference of their
 * slices, outputs poisoned first. */
Test(gpu, more_than_65535_sequence_heads, .timeout = 300)
{
    stof_context *ctx = open_or_skip();
    tu_rng rng = {tu_seed() ^ 0xb4u};
    enum { B = 17, H = 4096, S = 32, D = 64 };
    const size_t n = (size_t)B * H * S * D, slice = (size_t)S * D;
    stof_mask *m = NULL;
    cr_assert_eq(stof_mask_from_spec(ctx, "causal", S, S, &m), STOF_OK);
    stof_attention_desc d;
    tu_make_desc(&d, B, H, S, S, D, STOF_DTYPE_FP16, STOF_LAYOUT_BHSD, 0);
    uint16_t *hq = malloc(n * 2), *hk = malloc(n * 2), *hv = malloc(n * 2),
             *ho = malloc(n * 2);
    float *fq = malloc(n * 4), *fk = malloc(n * 4), *fv = malloc(n * 4);
    cr_assert(hq && hk && hv && ho && fq && fk && fv);
    tu_fill_random(&rng, hq, fq, n, STOF_DTYPE_FP16, 2.0f);
    tu_fill_random(&rng, hk, fk, n, STOF_DTYPE_FP16, 2.0f);
    tu_fill_random(&rng, hv, fv, n, STOF_DTYPE_FP16, 1.0f);
    const stof_api *api = stof__api();
    cr_assert_eq(stof__ctx_push(ctx), STOF_OK);
    CUdeviceptr dq, dk, dv, dout;
    cr_assert_eq(api->cuMemAlloc(&dq, n * 2), CUDA_SUCCESS);
    cr_assert_eq(api->cuMemAlloc(&dk, n * 2), CUDA_SUCCESS);
    cr_assert_eq(api->cuMemAlloc(&dv, n * 2), CUDA_SUCCESS);
    cr_assert_eq(api->cuMemAlloc(&dout, n * 2), CUDA_SUCCESS);
    cr_assert_eq(api->cuMemcpyHtoD(dq, hq, n * 2), CUDA_SUCCESS);
    cr_assert_eq(api->cuMemcpyHtoD(dk, hk, n * 2), CUDA_SUCCESS);
    cr_assert_eq(api->cuMemcpyHtoD(dv, hv, n * 2), CUDA_SUCCESS);
    stof__ctx_pop(ctx);
    /* The sampled sequence-heads: about 65535, the last, a few others. */
    int bhs[16] = {0, 1, 4095, 4096, 65534, 65535, 65536, 65537, B * H - 1};
    int n_bh = 9;
    while (n_bh < 16)
        bhs[n_bh++] = (int)(tu_next(&rng) % (uint64_t)(B * H));
    stof_attention_desc d1;
    tu_make_desc(&d1, 1, 1, S, S, D, STOF_DTYPE_FP16, STOF_LAYOUT_BHSD, 0);
    float *want = malloc(slice * 4);
    double *g = malloc(slice * sizeof(double)),
           *w = malloc(slice * sizeof(double));
    cr_assert(want && g && w);
    const stof_candidate ref = {.kind = STOF_KERNEL_REFERENCE};
    const stof_candidate blk = {.kind = STOF_KERNEL_BLOCK,
                                .cfg = {64, 64, 4, 2, 0, 0, 0}};
    const stof_candidate *choice[4] = {&ref, &blk, NULL, NULL};
    const char *name[4] = {"reference", "block 64x64", "the model's pick",
                           "tuned"};
    for (int c = 0; c < 4; c++) {
        stof_plan *plan = NULL;
        const stof_status st =
            c < 3 ? stof__attention_plan_kernel(ctx, &d, m, choice[c], &plan)
                  : stof_attention_plan(ctx, &d, m, &plan);
        cr_assert_eq(st, STOF_OK, "%s: %s", name[c], stof_errmsg(ctx));
        char js[4096];
        stof_plan_describe(plan, js, sizeof(js), NULL);
        cr_log_info("%s: %.300s", name[c], js);
        cr_assert_eq(stof__ctx_push(ctx), STOF_OK);
        cr_assert_eq(api->cuMemsetD8(dout, 0xff, n * 2), CUDA_SUCCESS);
        stof__ctx_pop(ctx);
        cr_assert_eq(stof_attention_run(plan, (void *)(uintptr_t)dq,
                                        (void *)(uintptr_t)dk,
                                        (void *)(uintptr_t)dv,
                                        (void *)(uintptr_t)dout, NULL),
                     STOF_OK, "%s: %s", name[c], stof_plan_errmsg(plan));
        cr_assert_eq(stof__ctx_push(ctx), STOF_OK);
        const char *failed = tu_sync_error();
        cr_assert(!failed, "%s: kernel failed: %s", name[c], failed);
        cr_assert_eq(api->cuMemcpyDtoH(ho, dout, n * 2), CUDA_SUCCESS);
        stof__ctx_pop(ctx);
        double worst = 0.0;
        for (int i = 0; i < n_bh; i++) {
            const size_t off = (size_t)bhs[i] * slice;
            cr_assert_eq(stof__ref_attention(&d1, m, fq + off, fk + off,
                                             fv + off, want),
                         STOF_OK);
            for (size_t e = 0; e < slice; e++) {
                g[e] = tu_f16_to_f32(ho[off + e]);
                w[e] = want[e];
            }
            const double err = tu_rel_err(g, w, slice);
            cr_expect(err < 2e-3, "%s: sequence-head %d: relative error %.3g",
                      name[c], bhs[i], err);
            if (!(err <= worst))
                worst = err;
        }
        cr_log_info("%s: %d sequence-heads of %d checked, worst relative "
                    "error %.3g",
                    name[c], n_bh, B * H, worst);
        stof_plan_free(&plan);
    }
    cr_assert_eq(stof__ctx_push(ctx), STOF_OK);
    api->cuMemFree(dq);
    api->cuMemFree(dk);
    api->cuMemFree(dv);
    api->cuMemFree(dout);
    stof__ctx_pop(ctx);
    free(want), free(g), free(w);
    free(hq), free(hk), free(hv), free(ho);
    free(fq), free(fk), free(fv);
    stof_mask_free(&m);
    stof_close(&ctx);
}
