/*
 * test_gpu_gqa.c - grouped-query and multi-query attention (desc.kv_heads)
 * and the log-sum-exp output (stof_attention_run_lse)
 * on every kernel kind: the block and row-wise (mma.sync) kernels, wgmma
 * in block and gather mode, and the reference kernel, each against the C
 * reference (query head h reads K/V head h / (heads / kv_heads)), outputs
 * poisoned first; and the same plan's output equal, bit for bit, to the
 * problem with K/V heads expanded (the same arithmetic on the same data).
 * Bad kv_heads are refused by name. Each kind's log-sum-exp output
 * against a double-precision computation, -inf for rows with no key.
 */
#include <math.h>
#include <criterion/criterion.h>
#include <criterion/logging.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attention_int.h"
#include "cost_model.h"
#include "cuda_shim.h"
#include "internal.h"
#include "testutil.h"

TestSuite(gpu_gqa, .timeout = 900);

typedef struct gqa_case {
    int batch, heads, kv_heads, seq_q, seq_k, head_dim;
    stof_dtype dt;
    stof_layout layout;
    const char *spec;
} gqa_case;

/* Plan candidate c (NULL: the reference kernel) for d and m, run it on
 * the device tensors and download the output into ho. */
static int run_kind(stof_context *ctx, const stof_attention_desc *d,
                    const stof_mask *m, const stof_candidate *c,
                    CUdeviceptr dq, CUdeviceptr dk, CUdeviceptr dv,
                    CUdeviceptr dout, size_t nq, uint16_t *ho)
{
    stof_candidate ref = {.kind = STOF_KERNEL_REFERENCE};
    stof_plan *p = NULL;
    if (stof__attention_plan_kernel(ctx, d, m, c ? c : &ref, &p) != STOF_OK) {
        cr_log_warn("kind %d: %s", c ? c->kind : 0, stof_errmsg(ctx));
        return 0;
    }
    const stof_api *api = stof__api();
    stof__ctx_push(ctx);
    api->cuMemsetD8(dout, 0xff, nq * 2);
    stof__ctx_pop(ctx);
    cr_assert_eq(stof_attention_run(p, (void *)(uintptr_t)dq,
                                    (void *)(uintptr_t)dk,
                                    (void *)(uintptr_t)dv,
                                    (void *)(uintptr_t)dout, NULL),
                 STOF_OK, "%s", stof_plan_errmsg(p));
    stof__ctx_push(ctx);
    cr_assert_eq(api->cuCtxSynchronize(), CUDA_SUCCESS);
    api->cuMemcpyDtoH(ho, dout, nq * 2);
    stof__ctx_pop(ctx);
    stof_plan_free(&p);
    return 1;
}

static void check_case(stof_context *ctx, const gqa_case *g, tu_rng *r)
{
    stof_attention_desc d;
    tu_make_desc(&d, g->batch, g->heads, g->seq_q, g->seq_k, g->head_dim,
                 g->dt, g->layout, 0);
    d.kv_heads = g->kv_heads;
    stof__attention_normalise(&d);
    /* The same problem with every K/V head repeated for its query heads. */
    stof_attention_desc e;
    tu_make_desc(&e, g->batch, g->heads, g->seq_q, g->seq_k, g->head_dim,
                 g->dt, g->layout, 0);
    stof__attention_normalise(&e);
    const int group = g->heads / g->kv_heads;
    const size_t nq = tu_tensor_elems(d.q_stride, g->batch, g->heads,
                                      g->seq_q, g->head_dim);
    const size_t nk = tu_tensor_elems(d.k_stride, g->batch, g->kv_heads,
                                      g->seq_k, g->head_dim);
    const size_t ne = tu_tensor_elems(e.k_stride, g->batch, g->heads,
                                      g->seq_k, g->head_dim);
    uint16_t *hq = malloc(nq * 2), *hk = malloc(nk * 2), *hv = malloc(nk * 2);
    uint16_t *ho = malloc(nq * 2), *ho2 = malloc(nq * 2);
    uint16_t *xk = calloc(ne, 2), *xv = calloc(ne, 2);
    float *fq = malloc(nq * 4), *fk = malloc(nk * 4), *fv = malloc(nk * 4);
    float *fo = calloc(nq, 4);
    tu_fill_random(r, hq, fq, nq, g->dt, 1.0f);
    tu_fill_random(r, hk, fk, nk, g->dt, 1.0f);
    tu_fill_random(r, hv, fv, nk, g->dt, 1.0f);
    for (int b = 0; b < g->batch; b++)
        for (int h = 0; h < g->heads; h++)
            for (int s = 0; s < g->seq_k; s++) {
                const int64_t src = b * d.k_stride[0] +
                                    (h / group) * d.k_stride[1] +
                                    s * d.k_stride[2];
                const int64_t dst = b * e.k_stride[0] + h * e.k_stride[1] +
                                    s * e.k_stride[2];
                memcpy(xk + dst, hk + src, (size_t)g->head_dim * 2);
                memcpy(xv + dst, hv + src, (size_t)g->head_dim * 2);
            }
    stof_mask *m = NULL;
    cr_assert_eq(stof_mask_from_spec(ctx, g->spec, g->seq_q, g->seq_k, &m),
                 STOF_OK);
    cr_assert_eq(stof__ref_attention(&d, m, fq, fk, fv, fo), STOF_OK);
    const stof_api *api = stof__api();
    CUdeviceptr dq, dk, dv, dout, ek, ev;
    stof__ctx_push(ctx);
    cr_assert_eq(api->cuMemAlloc(&dq, nq * 2), CUDA_SUCCESS);
    cr_assert_eq(api->cuMemAlloc(&dout, nq * 2), CUDA_SUCCESS);
    /* K/V of exactly kv_heads heads: a read of another head faults or
     * shows in the comparison. */
    cr_assert_eq(api->cuMemAlloc(&dk, nk * 2), CUDA_SUCCESS);
    cr_assert_eq(api->cuMemAlloc(&dv, nk * 2), CUDA_SUCCESS);
    cr_assert_eq(api->cuMemAlloc(&ek, ne * 2), CUDA_SUCCESS);
    cr_assert_eq(api->cuMemAlloc(&ev, ne * 2), CUDA_SUCCESS);
    api->cuMemcpyHtoD(dq, hq, nq * 2);
    api->cuMemcpyHtoD(dk, hk, nk * 2);
    api->cuMemcpyHtoD(dv, hv, nk * 2);
    api->cuMemcpyHtoD(ek, xk, ne * 2);
    api->cuMemcpyHtoD(ev, xv, ne * 2);
    stof__ctx_pop(ctx);

    stof_candidate cands[64];
    int n = 0;
    cr_assert_eq(stof__cost_rank(ctx, &d, m, cands, 64, &n), STOF_OK, "%s",
                 stof_errmsg(ctx));
    static const int kinds[] = {STOF_KERNEL_REFERENCE, STOF_KERNEL_BLOCK,
                                STOF_KERNEL_ROWWISE, STOF_KERNEL_WGMMA,
                                STOF_KERNEL_WGMMA_GATHER};
    int tested = 0;
    for (size_t t = 0; t < sizeof(kinds) / sizeof(kinds[0]); t++) {
        const stof_candidate *c = NULL;
        if (kinds[t] != STOF_KERNEL_REFERENCE) {
            for (int i = 0; i < n && !c; i++)
                if (cands[i].kind == kinds[t])
                    c = &cands[i];
            if (!c)
                continue; /* not for this device or problem */
        }
        if (!run_kind(ctx, &d, m, c, dq, dk, dv, dout, nq, ho))
            continue;
        /* Against the C reference, on every element the layout holds. */
        const double err = tu_out_rel_err(&d, ho, fo, 0, g->batch);
        cr_assert(err < (g->dt == STOF_DTYPE_FP16 ? 2e-3 : 1.6e-2),
                  "%s %dx%d/%dx%dx%d d=%d kind %d: rel err %g", g->spec,
                  g->batch, g->heads, g->kv_heads, g->seq_q, g->seq_k,
                  g->head_dim, kinds[t], err);
        /* The expanded problem with the same kernel: the same bits. */
        if (run_kind(ctx, &e, m, c, dq, ek, ev, dout, nq, ho2))
            cr_assert(memcmp(ho, ho2, nq * 2) == 0,
                      "%s kind %d: GQA and expanded K/V differ", g->spec,
                      kinds[t]);
        tested++;
        cr_log_info("%s %d/%d heads kind %d: rel err %.2e", g->spec,
                    g->heads, g->kv_heads, kinds[t], err);
    }
    cr_assert_geq(tested, 3, "%s: only %d kernel kinds ran", g->spec, tested);
    stof__ctx_push(ctx);
    api->cuMemFree(dq);
    api->cuMemFree(dk);
    api->cuMemFree(dv);
    api->cuMemFree(dout);
    api->cuMemFree(ek);
    api->cuMemFree(ev);
    stof__ctx_pop(ctx);
    stof_mask_free(&m);
    free(hq);
    free(hk);
    free(hv);
    free(ho);
    free(ho2);
    free(xk);
    free(xv);
    free(fq);
    free(fk);
    free(fv);
    free(fo);
}

Test(gpu_gqa, every_kernel_kind_matches_the_reference)
{
    stof_context *ctx = tu_open_gpu_or_skip(NULL);
    tu_rng r = {tu_seed()};
    static const gqa_case cases[] = {
        {2, 8, 2, 300, 300, 64, STOF_DTYPE_FP16, STOF_LAYOUT_BHSD, "causal"},
        {1, 4, 1, 520, 520, 128, STOF_DTYPE_BF16, STOF_LAYOUT_BSHD,
         "sliding:100"},
        {2, 6, 3, 257, 700, 64, STOF_DTYPE_BF16, STOF_LAYOUT_BHSD,
         "bigbird:64:3:2:3:1"},
        {1, 8, 1, 384, 384, 128, STOF_DTYPE_FP16, STOF_LAYOUT_BSHD,
         "dilated:128:2"},
        /* head_dim 256 (Gemma-class): the wgmma kernel's 64-key tiles,
         * the mma.sync block and row-wise kernels. */
        {1, 8, 2, 300, 300, 256, STOF_DTYPE_BF16, STOF_LAYOUT_BHSD, "causal"},
        {2, 4, 1, 200, 450, 256, STOF_DTYPE_FP16, STOF_LAYOUT_BSHD,
         "bigbird:64:3:2:3:1"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
        check_case(ctx, &cases[i], &r);
    stof_close(&ctx);
}

Test(gpu_gqa, bad_kv_heads_are_refused)
{
    stof_context *ctx = tu_open_gpu_or_skip(NULL);
    stof_mask *m = NULL;
    cr_assert_eq(stof_mask_from_spec(ctx, "causal", 128, 128, &m), STOF_OK);
    static const int bad[] = {3, 9, -1};
    for (int i = 0; i < 3; i++) {
        stof_attention_desc d;
        stof_attention_desc_init(&d, 1, 8, 128, 128, 64, STOF_DTYPE_FP16,
                                 STOF_LAYOUT_BHSD);
        d.kv_heads = bad[i];
        stof_plan *p = NULL;
        cr_assert_eq(stof_attention_plan(ctx, &d, m, &p),
                     STOF_ERR_INVALID_ARGUMENT, "kv_heads %d", bad[i]);
        cr_assert(strstr(stof_errmsg(ctx), "kv_heads"), "%s",
                  stof_errmsg(ctx));
        cr_assert_null(p);
    }
    stof_mask_free(&m);
    stof_close(&ctx);
}

/* Every kernel kind's log-sum-exp against double precision on a GQA
 * problem whose first rows allow no key (causal & !prefix:10). */
Test(gpu_gqa, lse_of_every_kernel_kind)
{
    stof_context *ctx = tu_open_gpu_or_skip(NULL);
    tu_rng r = {tu_seed() ^ 0x15e};
    const int B = 2, H = 4, KV = 2, S = 333, D = 64;
    stof_attention_desc d;
    tu_make_desc(&d, B, H, S, S, D, STOF_DTYPE_FP16, STOF_LAYOUT_BHSD, 0);
    d.kv_heads = KV;
    stof__attention_normalise(&d);
    const size_t nq = (size_t)B * H * S * D, nk = (size_t)B * KV * S * D;
    uint16_t *hq = malloc(nq * 2), *hk = malloc(nk * 2), *hv = malloc(nk * 2);
    float *fq = malloc(nq * 4), *fk = malloc(nk * 4), *fv = malloc(nk * 4);
    tu_fill_random(&r, hq, fq, nq, d.dtype, 1.0f);
    tu_fill_random(&r, hk, fk, nk, d.dtype, 1.0f);
    tu_fill_random(&r, hv, fv, nk, d.dtype, 1.0f);
    stof_mask *m = NULL;
    cr_assert_eq(stof_mask_from_spec(ctx, "causal&!prefix:10", S, S, &m),
                 STOF_OK);
    /* The expected log-sum-exp, in double. */
    const size_t nl = (size_t)B * H * S;
    double *want = malloc(nl * sizeof(double));
    tu_lse_ref(&d, m, fq, fk, want);
    const stof_api *api = stof__api();
    CUdeviceptr dq, dk, dv, dout, dl;
    stof__ctx_push(ctx);
    cr_assert_eq(api->cuMemAlloc(&dq, nq * 2), CUDA_SUCCESS);
    cr_assert_eq(api->cuMemAlloc(&dout, nq * 2), CUDA_SUCCESS);
    cr_assert_eq(api->cuMemAlloc(&dk, nk * 2), CUDA_SUCCESS);
    cr_assert_eq(api->cuMemAlloc(&dv, nk * 2), CUDA_SUCCESS);
    cr_assert_eq(api->cuMemAlloc(&dl, nl * 4), CUDA_SUCCESS);
    api->cuMemcpyHtoD(dq, hq, nq * 2);
    api->cuMemcpyHtoD(dk, hk, nk * 2);
    api->cuMemcpyHtoD(dv, hv, nk * 2);
    stof__ctx_pop(ctx);
    stof_candidate cands[64];
    int n = 0;
    cr_assert_eq(stof__cost_rank(ctx, &d, m, cands, 64, &n), STOF_OK);
    static const int kinds[] = {STOF_KERNEL_REFERENCE, STOF_KERNEL_BLOCK,
                                STOF_KERNEL_ROWWISE, STOF_KERNEL_WGMMA,
                                STOF_KERNEL_WGMMA_GATHER};
    float *got = malloc(nl * 4);
    int tested = 0;
    for (size_t t = 0; t < sizeof(kinds) / sizeof(kinds[0]); t++) {
        stof_candidate ref = {.kind = STOF_KERNEL_REFERENCE};
        const stof_candidate *c = kinds[t] == STOF_KERNEL_REFERENCE ? &ref
                                                                    : NULL;
        for (int i = 0; i < n && !c; i++)
            if (cands[i].kind == kinds[t])
                c = &cands[i];
        if (!c)
            continue;
        stof_plan *p = NULL;
        if (stof__attention_plan_kernel(ctx, &d, m, c, &p) != STOF_OK)
            continue;
        stof__ctx_push(ctx);
        api->cuMemsetD8(dl, 0x7f, nl * 4); /* poison: large finite */
        stof__ctx_pop(ctx);
        cr_assert_eq(stof_attention_run_lse(p, NULL, (void *)(uintptr_t)dq,
                                            (void *)(uintptr_t)dk,
                                            (void *)(uintptr_t)dv,
                                            (void *)(uintptr_t)dout,
                                            (float *)(uintptr_t)dl, NULL),
                     STOF_OK, "%s", stof_plan_errmsg(p));
        stof__ctx_push(ctx);
        cr_assert_eq(api->cuCtxSynchronize(), CUDA_SUCCESS);
        api->cuMemcpyDtoH(got, dl, nl * 4);
        stof__ctx_pop(ctx);
        double worst = 0.0;
        for (size_t i = 0; i < nl; i++) {
            if (isinf(want[i])) {
                cr_assert(isinf(got[i]) && got[i] < 0, "kind %d row %zu: %g, "
                          "not -inf", kinds[t], i, (double)got[i]);
                continue;
            }
            const double e = fabs(got[i] - want[i]);
            cr_assert(e < 5e-3 + 1e-3 * fabs(want[i]),
                      "kind %d row %zu: lse %g, want %g", kinds[t], i,
                      (double)got[i], want[i]);
            worst = e > worst ? e : worst;
        }
        cr_log_info("kind %d: lse worst abs err %.2e", kinds[t], worst);
        stof_plan_free(&p);
        tested++;
    }
    cr_assert_geq(tested, 3, "only %d kinds ran", tested);
    /* A NULL or misaligned lse is refused, naming it. */
    stof_plan *p = NULL;
    stof_candidate ref = {.kind = STOF_KERNEL_REFERENCE};
    cr_assert_eq(stof__attention_plan_kernel(ctx, &d, m, &ref, &p), STOF_OK);
    cr_assert_eq(stof_attention_run_lse(p, NULL, (void *)(uintptr_t)dq,
                                        (void *)(uintptr_t)dk,
                                        (void *)(uintptr_t)dv,
                                        (void *)(uintptr_t)dout, NULL, NULL),
                 STOF_ERR_INVALID_ARGUMENT);
    cr_assert(strstr(stof_plan_errmsg(p), "lse"), "%s", stof_plan_errmsg(p));
    stof_plan_free(&p);
    stof__ctx_push(ctx);
    api->cuMemFree(dq);
    api->cuMemFree(dk);
    api->cuMemFree(dv);
    api->cuMemFree(dout);
    api->cuMemFree(dl);
    stof__ctx_pop(ctx);
    free(got);
    free(want);
    free(hq);
    free(hk);
    free(hv);
    free(fq);
    free(fk);
    free(fv);
    stof_mask_free(&m);
    stof_close(&ctx);
}

/* Grouped-query problems with short queries are planned as the group's
 * rows of one head (each K/V tile read once per group): the plan says so,
 * and its outputs and log-sum-exps are the problem's own. A layout whose
 * query heads are not equally spaced rows (BSHD with several rows) is
 * planned as it is. */
Test(gpu_gqa, short_queries_are_planned_as_group_rows)
{
    stof_settings s;
    stof_default_settings(&s);
    s.user_db = ""; /* search every problem */
    stof_context *ctx = tu_open_gpu_or_skip(&s);
    tu_rng r = {tu_seed() ^ 0x9a0};
    static const struct {
        int b, h, kv, sq, sk, d;
        stof_dtype dt;
        stof_layout layout;
        const char *spec;
        int view;
    } cases[] = {
        {3, 8, 2, 1, 3000, 128, STOF_DTYPE_BF16, STOF_LAYOUT_BHSD, "dense", 1},
        {2, 8, 1, 1, 2500, 64, STOF_DTYPE_FP16, STOF_LAYOUT_BSHD,
         "sliding:900", 1},
        {2, 6, 2, 5, 1500, 64, STOF_DTYPE_FP16, STOF_LAYOUT_BHSD,
         "random:0.3:4&!prefix:2", 1},
        {1, 8, 2, 4, 1000, 128, STOF_DTYPE_BF16, STOF_LAYOUT_BSHD, "dense", 0},
    };
    for (size_t c = 0; c < sizeof(cases) / sizeof(cases[0]); c++) {
        stof_attention_desc d;
        tu_make_desc(&d, cases[c].b, cases[c].h, cases[c].sq, cases[c].sk,
                     cases[c].d, cases[c].dt, cases[c].layout, 0);
        d.kv_heads = cases[c].kv;
        stof__attention_normalise(&d);
        d.softcap = c == 1 ? 2.0f : 0.0f; /* with a soft-cap too */
        const size_t nq = tu_tensor_elems(d.q_stride, d.batch, d.heads,
                                          d.seq_q, d.head_dim);
        const size_t nk = tu_tensor_elems(d.k_stride, d.batch, d.kv_heads,
                                          d.seq_k, d.head_dim);
        const size_t nl = (size_t)d.batch * d.heads * d.seq_q;
        uint16_t *hq = malloc(nq * 2), *hk = malloc(nk * 2),
                 *hv = malloc(nk * 2), *ho = malloc(nq * 2);
        float *fq = malloc(nq * 4), *fk = malloc(nk * 4), *fv = malloc(nk * 4);
        float *fo = calloc(nq, 4), *gl = malloc(nl * 4);
        double *wl = malloc(nl * sizeof(double));
        tu_fill_random(&r, hq, fq, nq, d.dtype, 1.0f);
        tu_fill_random(&r, hk, fk, nk, d.dtype, 1.0f);
        tu_fill_random(&r, hv, fv, nk, d.dtype, 1.0f);
        stof_mask *m = NULL;
        cr_assert_eq(stof_mask_from_spec(ctx, cases[c].spec, d.seq_q, d.seq_k,
                                         &m),
                     STOF_OK);
        cr_assert_eq(stof__ref_attention(&d, m, fq, fk, fv, fo), STOF_OK);
        tu_lse_ref(&d, m, fq, fk, wl);
        const stof_api *api = stof__api();
        CUdeviceptr dq, dk, dv, dout, dl;
        stof__ctx_push(ctx);
        cr_assert_eq(api->cuMemAlloc(&dq, nq * 2), CUDA_SUCCESS);
        cr_assert_eq(api->cuMemAlloc(&dout, nq * 2), CUDA_SUCCESS);
        cr_assert_eq(api->cuMemAlloc(&dk, nk * 2), CUDA_SUCCESS);
        cr_assert_eq(api->cuMemAlloc(&dv, nk * 2), CUDA_SUCCESS);
        cr_assert_eq(api->cuMemAlloc(&dl, nl * 4), CUDA_SUCCESS);
        api->cuMemcpyHtoD(dq, hq, nq * 2);
        api->cuMemcpyHtoD(dk, hk, nk * 2);
        api->cuMemcpyHtoD(dv, hv, nk * 2);
        api->cuMemsetD8(dout, 0xff, nq * 2);
        api->cuMemsetD8(dl, 0x7f, nl * 4);
        stof__ctx_pop(ctx);
        stof_plan *p = NULL;
        cr_assert_eq(stof_attention_plan(ctx, &d, m, &p), STOF_OK, "%s",
                     stof_errmsg(ctx));
        char desc[4096];
        cr_assert_eq(stof_plan_describe(p, desc, sizeof(desc), NULL),
                     STOF_OK);
        cr_assert_eq(strstr(desc, "\"gqa_rows\"") != NULL, cases[c].view,
                     "case %zu: %s", c, desc);
        cr_assert_eq(stof_attention_run_lse(p, NULL, (void *)(uintptr_t)dq,
                                            (void *)(uintptr_t)dk,
                                            (void *)(uintptr_t)dv,
                                            (void *)(uintptr_t)dout,
                                            (float *)(uintptr_t)dl, NULL),
                     STOF_OK, "%s", stof_plan_errmsg(p));
        stof__ctx_push(ctx);
        cr_assert_eq(api->cuCtxSynchronize(), CUDA_SUCCESS);
        api->cuMemcpyDtoH(ho, dout, nq * 2);
        api->cuMemcpyDtoH(gl, dl, nl * 4);
        stof__ctx_pop(ctx);
        const double err = tu_out_rel_err(&d, ho, fo, 0, d.batch);
        cr_assert(err < (d.dtype == STOF_DTYPE_FP16 ? 2e-3 : 1.6e-2),
                  "case %zu (%s): rel err %g", c, cases[c].spec, err);
        for (size_t i = 0; i < nl; i++) {
            if (isinf(wl[i])) {
                cr_assert(isinf(gl[i]) && gl[i] < 0, "case %zu row %zu: %g",
                          c, i, (double)gl[i]);
                continue;
            }
            cr_assert(fabs(gl[i] - wl[i]) < 5e-3 + 1e-3 * fabs(wl[i]),
                      "case %zu row %zu: lse %g, want %g", c, i,
                      (double)gl[i], wl[i]);
        }
        cr_log_info("case %zu %s: rel err %.2e, %s", c, cases[c].spec, err,
                    cases[c].view ? "group rows" : "as is");
        stof_plan_free(&p);
        stof__ctx_push(ctx);
        api->cuMemFree(dq);
        api->cuMemFree(dk);
        api->cuMemFree(dv);
        api->cuMemFree(dout);
        api->cuMemFree(dl);
        stof__ctx_pop(ctx);
        stof_mask_free(&m);
        free(hq);
        free(hk);
        free(hv);
        free(ho);
        free(fq);
        free(fk);
        free(fv);
        free(fo);
        free(gl);
        free(wl);
    }
    stof_close(&ctx);
}

/* Grouped-query decode over mask families (one query row, per-sequence
 * lengths and offsets, documents): planned as the group's rows of one
 * head (every row the sequence's query row), each sequence's output
 * against the C reference with its own mask, outputs poisoned first,
 * instance after instance. */
Test(gpu_gqa, family_decode_is_planned_as_group_rows)
{
    stof_settings s;
    stof_default_settings(&s);
    s.user_db = "";
    stof_context *ctx = tu_open_gpu_or_skip(&s);
    tu_rng r = {tu_seed() ^ 0xdec0de};
    static const char *specs[] = {"causal", "causal_sliding:300",
                                  "causal&docs", "dense"};
    enum { BB = 3, HH = 8, KV = 2, SK = 2100, DD = 128 };
    for (size_t si = 0; si < sizeof(specs) / sizeof(specs[0]); si++) {
        const stof_dtype dt = si % 2 ? STOF_DTYPE_BF16 : STOF_DTYPE_FP16;
        stof_attention_desc d;
        tu_make_desc(&d, BB, HH, 1, SK, DD, dt,
                     si == 1 ? STOF_LAYOUT_BSHD : STOF_LAYOUT_BHSD, 0);
        d.kv_heads = KV;
        stof__attention_normalise(&d);
        const size_t nq = (size_t)BB * HH * DD, nk = (size_t)BB * KV * SK * DD;
        uint16_t *hq = malloc(nq * 2), *hk = malloc(nk * 2),
                 *hv = malloc(nk * 2), *ho = malloc(nq * 2);
        float *fq = malloc(nq * 4), *fk = malloc(nk * 4), *fv = malloc(nk * 4);
        float *fo = calloc(nq, 4);
        tu_fill_random(&r, hq, fq, nq, dt, 1.0f);
        tu_fill_random(&r, hk, fk, nk, dt, 1.0f);
        tu_fill_random(&r, hv, fv, nk, dt, 1.0f);
        const stof_api *api = stof__api();
        CUdeviceptr dq, dk, dv, dout, dd;
        stof__ctx_push(ctx);
        cr_assert_eq(api->cuMemAlloc(&dq, nq * 2), CUDA_SUCCESS);
        cr_assert_eq(api->cuMemAlloc(&dout, nq * 2), CUDA_SUCCESS);
        cr_assert_eq(api->cuMemAlloc(&dk, nk * 2), CUDA_SUCCESS);
        cr_assert_eq(api->cuMemAlloc(&dv, nk * 2), CUDA_SUCCESS);
        cr_assert_eq(api->cuMemAlloc(&dd, 4096 + (size_t)BB * SK * 4),
                     CUDA_SUCCESS);
        api->cuMemcpyHtoD(dq, hq, nq * 2);
        api->cuMemcpyHtoD(dk, hk, nk * 2);
        api->cuMemcpyHtoD(dv, hv, nk * 2);
        stof__ctx_pop(ctx);
        stof_mask_family *fam = NULL;
        cr_assert_eq(stof_mask_family_create(ctx, specs[si], &fam), STOF_OK);
        int32_t q_len[BB], k_len[BB], q_off[BB];
        int32_t *doc = malloc(sizeof(int32_t) * BB * SK);
        stof_mask_data host;
        memset(&host, 0, sizeof(host));
        host.q_len = q_len;
        host.k_len = k_len;
        host.q_offset = q_off;
        host.doc_id = doc;
        /* A decode step: the one query at the end of each cache. */
        for (int b = 0; b < BB; b++) {
            k_len[b] = 1 + (int)tu_below(&r, SK);
            q_len[b] = 1;
            q_off[b] = k_len[b] - 1;
            for (int k = 0; k < SK; k++)
                doc[b * SK + k] = k / 500;
        }
        stof_plan *p = NULL;
        cr_assert_eq(stof_attention_plan_family(ctx, &d, fam, &host, &p),
                     STOF_OK, "%s", stof_errmsg(ctx));
        char desc[4096];
        cr_assert_eq(stof_plan_describe(p, desc, sizeof(desc), NULL),
                     STOF_OK);
        cr_assert(strstr(desc, "\"gqa_rows\""), "%s", desc);
        for (int it = 0; it < 3; it++) {
            for (int b = 0; b < BB; b++) {
                k_len[b] = it == 2 && b == 1 ? 0 : 1 + (int)tu_below(&r, SK);
                q_len[b] = it == 1 && b == 0 ? 0 : 1;
                q_off[b] = k_len[b] > 0 ? k_len[b] - 1 : 0;
            }
            stof__ctx_push(ctx);
            api->cuMemcpyHtoD(dd, q_len, sizeof(q_len));
            api->cuMemcpyHtoD(dd + 256, k_len, sizeof(k_len));
            api->cuMemcpyHtoD(dd + 512, q_off, sizeof(q_off));
            api->cuMemcpyHtoD(dd + 4096, doc, sizeof(int32_t) * BB * SK);
            api->cuMemsetD8(dout, 0xff, nq * 2);
            stof__ctx_pop(ctx);
            stof_mask_data md;
            memset(&md, 0, sizeof(md));
            md.q_len = (const int32_t *)(uintptr_t)dd;
            md.k_len = (const int32_t *)(uintptr_t)(dd + 256);
            md.q_offset = (const int32_t *)(uintptr_t)(dd + 512);
            md.doc_id = (const int32_t *)(uintptr_t)(dd + 4096);
            cr_assert_eq(stof_attention_run_family(
                             p, &md, (void *)(uintptr_t)dq,
                             (void *)(uintptr_t)dk, (void *)(uintptr_t)dv,
                             (void *)(uintptr_t)dout, NULL),
                         STOF_OK, "%s", stof_plan_errmsg(p));
            stof__ctx_push(ctx);
            cr_assert_eq(api->cuCtxSynchronize(), CUDA_SUCCESS);
            api->cuMemcpyDtoH(ho, dout, nq * 2);
            stof__ctx_pop(ctx);
            for (int b = 0; b < BB; b++) {
                stof_mask *m = NULL;
                cr_assert_eq(stof_mask_family_eval(ctx, fam, 1, SK, &host, b,
                                                   &m),
                             STOF_OK, "%s", stof_errmsg(ctx));
                stof_attention_desc d1 = d;
                d1.batch = 1;
                const float *qb = fq + b * d.q_stride[0];
                const float *kb = fk + b * d.k_stride[0];
                const float *vb = fv + b * d.v_stride[0];
                float *ob = fo + b * d.o_stride[0];
                cr_assert_eq(stof__ref_attention(&d1, m, qb, kb, vb, ob),
                             STOF_OK);
                const double err = tu_out_rel_err(&d, ho, fo, b, 1);
                cr_assert(err < (dt == STOF_DTYPE_FP16 ? 2e-3 : 1.6e-2),
                          "%s it %d b %d (k_len %d, q_len %d): rel err %g",
                          specs[si], it, b, k_len[b], q_len[b], err);
                stof_mask_free(&m);
            }
        }
        cr_log_info("%s: family decode as group rows ok", specs[si]);
        stof_plan_free(&p);
        stof_mask_family_free(&fam);
        stof__ctx_push(ctx);
        api->cuMemFree(dq);
        api->cuMemFree(dk);
        api->cuMemFree(dv);
        api->cuMemFree(dout);
        api->cuMemFree(dd);
        stof__ctx_pop(ctx);
        free(doc);
        free(hq);
        free(hk);
        free(hv);
        free(ho);
        free(fq);
        free(fk);
        free(fv);
        free(fo);
    }
    stof_close(&ctx);
}

__attribute__((visibility("default"))) int main(int argc, char **argv)
{
    return tu_gpu_suite_main("gpu_gqa", argc, argv);
}
