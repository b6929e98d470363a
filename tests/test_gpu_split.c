/*
 * test_gpu_split.c - split-KV (attn_split.h): short queries against long
 * keys with each row block's tiles split over several CTAs and merged by
 * stof_attn_combine, for every kernel kind that has a split build (block,
 * row-wise, wgmma, wgmma-gather) at several split counts, including more
 * splits than a row block has tiles (empty CTAs). Each output against the
 * C reference with outputs poisoned first, each row's log-sum-exp
 * (stof_attention_run_lse) against double precision (-inf for rows
 * without keys), GQA, both layouts, fp16 and bf16; the cost model ranks
 * split candidates for decode problems and none for large prefills; bad
 * split counts are refused.
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

TestSuite(gpu_split, .timeout = 900);

typedef struct split_case {
    int batch, heads, kv_heads, seq_q, seq_k, head_dim;
    stof_dtype dt;
    stof_layout layout;
    const char *spec;
} split_case;

/* The first candidate of `kind` the cost model ranks (split or not: the
 * caller sets the split count), or 0. */
static int base_of(const stof_candidate *cands, int n, int kind,
                   stof_candidate *out)
{
    for (int i = 0; i < n; i++)
        if (cands[i].kind == kind) {
            *out = cands[i];
            return 1;
        }
    return 0;
}

static void check_case(stof_context *ctx, const split_case *g, tu_rng *r)
{
    stof_attention_desc d;
    tu_make_desc(&d, g->batch, g->heads, g->seq_q, g->seq_k, g->head_dim,
                 g->dt, g->layout, 0);
    d.kv_heads = g->kv_heads;
    stof__attention_normalise(&d);
    const size_t nq = tu_tensor_elems(d.q_stride, g->batch, g->heads,
                                      g->seq_q, g->head_dim);
    const size_t nk = tu_tensor_elems(d.k_stride, g->batch, g->kv_heads,
                                      g->seq_k, g->head_dim);
    const size_t nl = (size_t)g->batch * g->heads * g->seq_q;
    uint16_t *hq = malloc(nq * 2), *hk = malloc(nk * 2), *hv = malloc(nk * 2);
    uint16_t *ho = malloc(nq * 2);
    float *fq = malloc(nq * 4), *fk = malloc(nk * 4), *fv = malloc(nk * 4);
    float *fo = calloc(nq, 4), *gl = malloc(nl * 4);
    double *wl = malloc(nl * sizeof(double));
    tu_fill_random(r, hq, fq, nq, g->dt, 1.0f);
    tu_fill_random(r, hk, fk, nk, g->dt, 1.0f);
    tu_fill_random(r, hv, fv, nk, g->dt, 1.0f);
    stof_mask *m = NULL;
    cr_assert_eq(stof_mask_from_spec(ctx, g->spec, g->seq_q, g->seq_k, &m),
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
    stof__ctx_pop(ctx);

    stof_candidate cands[256];
    int n = 0;
    cr_assert_eq(stof__cost_rank(ctx, &d, m, cands, 256, &n), STOF_OK, "%s",
                 stof_errmsg(ctx));
    static const int kinds[] = {STOF_KERNEL_BLOCK, STOF_KERNEL_ROWWISE,
                                STOF_KERNEL_WGMMA, STOF_KERNEL_WGMMA_GATHER};
    /* 64 splits leave most CTAs of a row block without tiles. */
    static const int splits[] = {2, 5, 64};
    int tested = 0;
    for (size_t t = 0; t < sizeof(kinds) / sizeof(kinds[0]); t++) {
        stof_candidate base;
        if (!base_of(cands, n, kinds[t], &base))
            continue; /* not for this device or problem */
        for (size_t si = 0; si < sizeof(splits) / sizeof(splits[0]); si++) {
            stof_candidate c = base;
            c.splits = splits[si];
            c.cfg.split = c.wcfg.split = 1;
            stof_plan *p = NULL;
            cr_assert_eq(stof__attention_plan_kernel(ctx, &d, m, &c, &p),
                         STOF_OK, "kind %d split %d: %s", kinds[t],
                         splits[si], stof_errmsg(ctx));
            stof__ctx_push(ctx);
            api->cuMemsetD8(dout, 0xff, nq * 2); /* NaN */
            api->cuMemsetD8(dl, 0x7f, nl * 4);   /* large finite */
            stof__ctx_pop(ctx);
            cr_assert_eq(stof_attention_run_lse(
                             p, NULL, (void *)(uintptr_t)dq,
                             (void *)(uintptr_t)dk, (void *)(uintptr_t)dv,
                             (void *)(uintptr_t)dout, (float *)(uintptr_t)dl,
                             NULL),
                         STOF_OK, "%s", stof_plan_errmsg(p));
            stof__ctx_push(ctx);
            cr_assert_eq(api->cuCtxSynchronize(), CUDA_SUCCESS);
            api->cuMemcpyDtoH(ho, dout, nq * 2);
            api->cuMemcpyDtoH(gl, dl, nl * 4);
            stof__ctx_pop(ctx);
            const double err = tu_out_rel_err(&d, ho, fo, 0, g->batch);
            cr_assert(err < (g->dt == STOF_DTYPE_FP16 ? 2e-3 : 1.6e-2),
                      "%s %dx%d/%dx%dx%d d=%d kind %d split %d: rel err %g",
                      g->spec, g->batch, g->heads, g->kv_heads, g->seq_q,
                      g->seq_k, g->head_dim, kinds[t], splits[si], err);
            double worst = 0.0;
            for (size_t i = 0; i < nl; i++) {
                if (isinf(wl[i])) {
                    cr_assert(isinf(gl[i]) && gl[i] < 0,
                              "kind %d split %d row %zu: lse %g, not -inf",
                              kinds[t], splits[si], i, (double)gl[i]);
                    continue;
                }
                const double e = fabs(gl[i] - wl[i]);
                cr_assert(e < 5e-3 + 1e-3 * fabs(wl[i]),
                          "kind %d split %d row %zu: lse %g, want %g",
                          kinds[t], splits[si], i, (double)gl[i], wl[i]);
                worst = e > worst ? e : worst;
            }
            char desc[2048];
            cr_assert_eq(stof_plan_describe(p, desc, sizeof(desc), NULL),
                         STOF_OK);
            cr_assert(strstr(desc, "\"SPLITS\""), "%s", desc);
            cr_log_info("%s %dx%dx%dx%d kind %d split %d: rel err %.2e, lse "
                        "%.2e",
                        g->spec, g->batch, g->heads, g->seq_q, g->seq_k,
                        kinds[t], splits[si], err, worst);
            stof_plan_free(&p);
            tested++;
        }
    }
    cr_assert_geq(tested, 6, "%s: only %d split plans ran", g->spec, tested);
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

Test(gpu_split, every_kind_matches_the_reference)
{
    stof_context *ctx = tu_open_gpu_or_skip(NULL);
    tu_rng r = {tu_seed()};
    static const split_case cases[] = {
        {3, 4, 4, 1, 4100, 64, STOF_DTYPE_FP16, STOF_LAYOUT_BHSD, "dense"},
        {2, 8, 2, 16, 3000, 128, STOF_DTYPE_BF16, STOF_LAYOUT_BSHD,
         "strided:37"},
        {1, 4, 1, 70, 2500, 64, STOF_DTYPE_BF16, STOF_LAYOUT_BHSD,
         "bigbird:64:3:2:3:1"},
        {2, 2, 2, 5, 5000, 128, STOF_DTYPE_FP16, STOF_LAYOUT_BSHD,
         "random:0.3:7"},
        /* One tile a row block (most CTAs empty); rows 0..2 allow no key. */
        {1, 2, 2, 5, 5000, 64, STOF_DTYPE_FP16, STOF_LAYOUT_BHSD,
         "causal&!prefix:3"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
        check_case(ctx, &cases[i], &r);
    stof_close(&ctx);
}

Test(gpu_split, the_cost_model_splits_decode_not_prefill)
{
    stof_context *ctx = tu_open_gpu_or_skip(NULL);
    static const struct {
        int b, h, sq, sk;
        int want_split;
    } probs[] = {{1, 8, 1, 32768, 1}, {2, 16, 16, 16384, 1},
                 {4, 16, 4096, 4096, 0}};
    for (size_t i = 0; i < sizeof(probs) / sizeof(probs[0]); i++) {
        stof_attention_desc d;
        stof_attention_desc_init(&d, probs[i].b, probs[i].h, probs[i].sq,
                                 probs[i].sk, 128, STOF_DTYPE_BF16,
                                 STOF_LAYOUT_BHSD);
        stof_mask *m = NULL;
        cr_assert_eq(stof_mask_from_spec(ctx, "dense", probs[i].sq,
                                         probs[i].sk, &m),
                     STOF_OK);
        stof_candidate cands[16];
        int n = 0;
        cr_assert_eq(stof__cost_rank(ctx, &d, m, cands, 16, &n), STOF_OK);
        cr_assert_gt(n, 0);
        int any = 0;
        for (int k = 0; k < n; k++)
            any |= cands[k].splits > 1;
        cr_assert_eq(cands[0].splits > 1, probs[i].want_split,
                     "%dx%dx%dx%d: first candidate split %d", probs[i].b,
                     probs[i].h, probs[i].sq, probs[i].sk, cands[0].splits);
        if (!probs[i].want_split)
            cr_assert_not(any, "a prefill ranked split candidates");
        stof_mask_free(&m);
    }
    stof_close(&ctx);
}

Test(gpu_split, bad_split_counts_are_refused)
{
    stof_context *ctx = tu_open_gpu_or_skip(NULL);
    stof_attention_desc d;
    stof_attention_desc_init(&d, 1, 2, 4, 2048, 64, STOF_DTYPE_FP16,
                             STOF_LAYOUT_BHSD);
    stof_mask *m = NULL;
    cr_assert_eq(stof_mask_from_spec(ctx, "dense", 4, 2048, &m), STOF_OK);
    stof_candidate c = {.kind = STOF_KERNEL_BLOCK,
                        .cfg = {64, 64, 4, 2, 0, 1, 0},
                        .splits = STOF_SPLIT_MAX + 1};
    stof_plan *p = NULL;
    cr_assert_eq(stof__attention_plan_kernel(ctx, &d, m, &c, &p),
                 STOF_ERR_UNSUPPORTED);
    cr_assert_null(p);
    cr_assert(strstr(stof_errmsg(ctx), "split"), "%s", stof_errmsg(ctx));
    stof_mask_free(&m);
    stof_close(&ctx);
}

__attribute__((visibility("default"))) int main(int argc, char **argv)
{
    return tu_gpu_suite_main("gpu_split", argc, argv);
}
