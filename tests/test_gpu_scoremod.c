/*
 * test_gpu_scoremod.c - score modifiers (desc.softcap, desc.alibi_slopes,
 * the additive bias tensor of desc.bias) on every kernel kind that builds
 * them: the reference kernel, block and wgmma (all three), row-wise and
 * wgmma-gather (soft-cap only; the cost model does not rank them with
 * ALiBi or a bias), a split-KV build, a plan searched with a bias and a
 * mask family planned by the search (its GPU reference computes the
 * modifiers too). Each output against the C reference with outputs
 * poisoned first, each row's log-sum-exp against double precision; fp16
 * and bf16, GQA, odd sizes, head_dim 64, 128 and 256; biases broadcast
 * along batch, head or row, with -inf elements (whole rows of them too).
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

TestSuite(gpu_scoremod, .timeout = 900);

typedef struct mod_case {
    int batch, heads, kv_heads, seq_q, seq_k, head_dim;
    stof_dtype dt;
    stof_layout layout;
    const char *spec;
    float softcap;
    int alibi;
    int bias; /* 0: none; else BIAS_* bits: along what the bias varies */
} mod_case;

/* The bias tensor of a case: varies along batch, head and / or query row
 * (a dimension it does not vary along has stride 0); BIAS_NINF puts -inf
 * at the keys past a per-(batch, head) length and on one whole row;
 * BIAS_MIN (bf16) puts the most negative finite bf16 value there instead,
 * which masks as -inf does (stof.h; the value transformers fills with). */
enum {
    BIAS_ON = 1,
    BIAS_B = 2,
    BIAS_H = 4,
    BIAS_R = 8,
    BIAS_NINF = 16,
    BIAS_MIN = 32
};

/* Device buffers and host copies of one problem. */
typedef struct mod_problem {
    stof_attention_desc d;
    size_t nq, nk, nl;
    uint16_t *hq, *hk, *hv, *ho;
    float *fq, *fk, *fv, *fo, *gl, *slopes, *fb;
    double *wl;
    CUdeviceptr dq, dk, dv, dout, dl, db;
    stof_mask *m;
} mod_problem;

/* The bias of case g into p: strides (rows padded past seq_k), values in
 * [-2, 2] rounded to the dtype, -inf where BIAS_NINF says; p->fb (fp32)
 * and p->db (device, 16-bit). */
static void bias_new(const mod_case *g, tu_rng *r, mod_problem *p)
{
    const int vb = (g->bias & BIAS_B) != 0, vh = (g->bias & BIAS_H) != 0,
              vr = (g->bias & BIAS_R) != 0;
    const int64_t row = vr ? (g->seq_k + 7) / 8 * 8 + 8 : 0;
    const int64_t head = vh ? (vr ? row * g->seq_q : (g->seq_k + 7) / 8 * 8)
                            : 0;
    const int64_t bat =
        vb ? (vh ? head * g->heads : vr ? row * g->seq_q
                                        : (g->seq_k + 7) / 8 * 8)
           : 0;
    p->d.bias = 1;
    p->d.bias_stride[0] = bat;
    p->d.bias_stride[1] = head;
    p->d.bias_stride[2] = row;
    const size_t n = (size_t)((g->batch - 1) * bat + (g->heads - 1) * head +
                              (g->seq_q - 1) * row + g->seq_k);
    uint16_t *hb = malloc(n * 2);
    p->fb = malloc(n * 4);
    tu_fill_random(r, hb, p->fb, n, g->dt, 2.0f);
    if (g->bias & BIAS_NINF) {
        const int use_min = (g->bias & BIAS_MIN) && g->dt == STOF_DTYPE_BF16;
        const uint16_t ninf = use_min                    ? 0xff7fu
                              : g->dt == STOF_DTYPE_FP16 ? 0xfc00u
                                                         : 0xff80u;
        const float fninf = use_min ? -3.38953139e38f : -INFINITY;
        for (int b = 0; b < (vb ? g->batch : 1); b++)
            for (int h = 0; h < (vh ? g->heads : 1); h++)
                for (int i = 0; i < (vr ? g->seq_q : 1); i++) {
                    /* A padding-like length per (b, h); row 3 all -inf. */
                    const int len = i == 3 && vr ? 0
                                                 : g->seq_k - 1 - 37 * (b + h);
                    const size_t o0 = (size_t)(b * bat + h * head + i * row);
                    for (int j = len < 0 ? 0 : len; j < g->seq_k; j++) {
                        hb[o0 + (size_t)j] = ninf;
                        p->fb[o0 + (size_t)j] = fninf;
                    }
                }
    }
    const stof_api *api = stof__api();
    cr_assert_eq(api->cuMemAlloc(&p->db, n * 2), CUDA_SUCCESS);
    api->cuMemcpyHtoD(p->db, hb, n * 2);
    free(hb);
}

static void problem_new(stof_context *ctx, const mod_case *g, tu_rng *r,
                        mod_problem *p)
{
    memset(p, 0, sizeof(*p));
    tu_make_desc(&p->d, g->batch, g->heads, g->seq_q, g->seq_k, g->head_dim,
                 g->dt, g->layout, 0);
    p->d.kv_heads = g->kv_heads;
    p->d.softcap = g->softcap;
    stof__attention_normalise(&p->d);
    if (g->alibi) {
        /* Slopes of both signs and sizes, one per head. */
        p->slopes = malloc(sizeof(float) * (size_t)g->heads);
        for (int h = 0; h < g->heads; h++)
            p->slopes[h] = (float)((tu_uniform(r) - 0.3) * 0.2);
        p->d.alibi_slopes = p->slopes;
    }
    p->nq = tu_tensor_elems(p->d.q_stride, g->batch, g->heads, g->seq_q,
                            g->head_dim);
    p->nk = tu_tensor_elems(p->d.k_stride, g->batch, g->kv_heads, g->seq_k,
                            g->head_dim);
    p->nl = (size_t)g->batch * g->heads * g->seq_q;
    p->hq = malloc(p->nq * 2);
    p->hk = malloc(p->nk * 2);
    p->hv = malloc(p->nk * 2);
    p->ho = malloc(p->nq * 2);
    p->fq = malloc(p->nq * 4);
    p->fk = malloc(p->nk * 4);
    p->fv = malloc(p->nk * 4);
    p->fo = calloc(p->nq, 4);
    p->gl = malloc(p->nl * 4);
    p->wl = malloc(p->nl * sizeof(double));
    /* Scores up to a few units, so a soft-cap of 1..5 bends them. */
    tu_fill_random(r, p->hq, p->fq, p->nq, g->dt, 2.0f);
    tu_fill_random(r, p->hk, p->fk, p->nk, g->dt, 2.0f);
    tu_fill_random(r, p->hv, p->fv, p->nk, g->dt, 1.0f);
    cr_assert_eq(stof_mask_from_spec(ctx, g->spec, g->seq_q, g->seq_k,
                                     &p->m),
                 STOF_OK);
    const stof_api *api = stof__api();
    stof__ctx_push(ctx);
    if (g->bias)
        bias_new(g, r, p);
    cr_assert_eq(stof__ref_attention_bias(&p->d, p->m, p->fq, p->fk, p->fv,
                                          p->fb, p->fo),
                 STOF_OK);
    tu_lse_ref_bias(&p->d, p->m, p->fq, p->fk, p->fb, p->wl);
    cr_assert_eq(api->cuMemAlloc(&p->dq, p->nq * 2), CUDA_SUCCESS);
    cr_assert_eq(api->cuMemAlloc(&p->dout, p->nq * 2), CUDA_SUCCESS);
    cr_assert_eq(api->cuMemAlloc(&p->dk, p->nk * 2), CUDA_SUCCESS);
    cr_assert_eq(api->cuMemAlloc(&p->dv, p->nk * 2), CUDA_SUCCESS);
    cr_assert_eq(api->cuMemAlloc(&p->dl, p->nl * 4), CUDA_SUCCESS);
    api->cuMemcpyHtoD(p->dq, p->hq, p->nq * 2);
    api->cuMemcpyHtoD(p->dk, p->hk, p->nk * 2);
    api->cuMemcpyHtoD(p->dv, p->hv, p->nk * 2);
    stof__ctx_pop(ctx);
}

static void problem_free(stof_context *ctx, mod_problem *p)
{
    const stof_api *api = stof__api();
    stof__ctx_push(ctx);
    api->cuMemFree(p->dq);
    api->cuMemFree(p->dk);
    api->cuMemFree(p->dv);
    api->cuMemFree(p->dout);
    api->cuMemFree(p->dl);
    if (p->db)
        api->cuMemFree(p->db);
    stof__ctx_pop(ctx);
    stof_mask_free(&p->m);
    free(p->hq);
    free(p->hk);
    free(p->hv);
    free(p->ho);
    free(p->fq);
    free(p->fk);
    free(p->fv);
    free(p->fo);
    free(p->gl);
    free(p->wl);
    free(p->slopes);
    free(p->fb);
}

/* Run plan `plan` with an LSE output (outputs poisoned first) and check O
 * against the C reference and the LSE against double precision. */
static void run_and_check(stof_context *ctx, mod_problem *p, stof_plan *plan,
                          const char *what)
{
    const stof_api *api = stof__api();
    const stof_attention_desc *d = &p->d;
    stof__ctx_push(ctx);
    api->cuMemsetD8(p->dout, 0xff, p->nq * 2); /* NaN */
    api->cuMemsetD8(p->dl, 0x7f, p->nl * 4);   /* large finite */
    stof__ctx_pop(ctx);
    stof_run_args a = {.q = (const void *)(uintptr_t)p->dq,
                       .k = (const void *)(uintptr_t)p->dk,
                       .v = (const void *)(uintptr_t)p->dv,
                       .o = (void *)(uintptr_t)p->dout,
                       .lse = (float *)(uintptr_t)p->dl,
                       .bias = (const void *)(uintptr_t)p->db};
    if (p->db) {
        /* A bias plan runs only through stof_attention_run_ex, with a
         * 16-byte aligned bias. */
        cr_assert_eq(stof_attention_run(plan, a.q, a.k, a.v, a.o, NULL),
                     STOF_ERR_INVALID_ARGUMENT, "%s", what);
        cr_assert(strstr(stof_plan_errmsg(plan), "stof_attention_run_ex"));
        stof_run_args mis = a;
        mis.bias = (const char *)a.bias + 2;
        cr_assert_eq(stof_attention_run_ex(plan, &mis, NULL),
                     STOF_ERR_INVALID_ARGUMENT, "%s", what);
    } else {
        /* A bias given to a plan made without one is refused. */
        stof_run_args extra = a;
        extra.bias = a.q;
        cr_assert_eq(stof_attention_run_ex(plan, &extra, NULL),
                     STOF_ERR_INVALID_ARGUMENT, "%s", what);
    }
    cr_assert_eq(stof_attention_run_ex(plan, &a, NULL), STOF_OK, "%s: %s",
                 what, stof_plan_errmsg(plan));
    stof__ctx_push(ctx);
    cr_assert_eq(api->cuCtxSynchronize(), CUDA_SUCCESS);
    api->cuMemcpyDtoH(p->ho, p->dout, p->nq * 2);
    api->cuMemcpyDtoH(p->gl, p->dl, p->nl * 4);
    stof__ctx_pop(ctx);
    const double err = tu_out_rel_err(d, p->ho, p->fo, 0, d->batch);
    cr_assert(err < (d->dtype == STOF_DTYPE_FP16 ? 3e-3 : 1.6e-2),
              "%s: rel err %g", what, err);
    double worst = 0.0;
    for (size_t i = 0; i < p->nl; i++) {
        if (isinf(p->wl[i])) {
            cr_assert(isinf(p->gl[i]) && p->gl[i] < 0,
                      "%s row %zu: lse %g, not -inf", what, i,
                      (double)p->gl[i]);
            continue;
        }
        const double e = fabs(p->gl[i] - p->wl[i]);
        cr_assert(e < 5e-3 + 1e-3 * fabs(p->wl[i]),
                  "%s row %zu: lse %g, want %g", what, i, (double)p->gl[i],
                  p->wl[i]);
        worst = e > worst ? e : worst;
    }
    cr_log_info("%s: rel err %.2e, lse %.2e", what, err, worst);
}

static void check_case(stof_context *ctx, const mod_case *g, tu_rng *r)
{
    mod_problem p;
    problem_new(ctx, g, r, &p);
    stof_candidate cands[512];
    int n = 0;
    cr_assert_eq(stof__cost_rank(ctx, &p.d, p.m, cands, 512, &n), STOF_OK,
                 "%s", stof_errmsg(ctx));
    static const int kinds[] = {STOF_KERNEL_REFERENCE, STOF_KERNEL_BLOCK,
                                STOF_KERNEL_ROWWISE, STOF_KERNEL_WGMMA,
                                STOF_KERNEL_WGMMA_GATHER};
    int tested = 0;
    for (size_t t = 0; t < sizeof(kinds) / sizeof(kinds[0]); t++) {
        stof_candidate c = {.kind = STOF_KERNEL_REFERENCE};
        int found = kinds[t] == STOF_KERNEL_REFERENCE;
        for (int i = 0; i < n && !found; i++)
            if (cands[i].kind == kinds[t] && cands[i].splits <= 1) {
                c = cands[i];
                found = 1;
            }
        if (g->alibi || g->bias)
            cr_assert(!found || (kinds[t] != STOF_KERNEL_ROWWISE &&
                                 kinds[t] != STOF_KERNEL_WGMMA_GATHER),
                      "a gather kind was ranked for ALiBi or a bias");
        if (!found)
            continue;
        /* The ranked candidates are built for the problem's modifiers. */
        const int cm = c.kind >= STOF_KERNEL_WGMMA ? c.wcfg.mods : c.cfg.mods;
        if (c.kind != STOF_KERNEL_REFERENCE)
            cr_assert_eq(cm, stof__attn_mods(&p.d));
        for (int split = 0; split < 2; split++) {
            stof_candidate cs = c;
            if (split) { /* the same kernel split over the keys */
                if (c.kind == STOF_KERNEL_REFERENCE)
                    break;
                if (c.kind >= STOF_KERNEL_WGMMA && c.wcfg.persist) {
                    /* The persistent kernel is never split: the best
                     * ranked of this kind that is not persistent. */
                    int other = 0;
                    for (int i = 0; i < n && !other; i++)
                        if (cands[i].kind == c.kind && cands[i].splits <= 1 &&
                            !cands[i].wcfg.persist) {
                            cs = cands[i];
                            other = 1;
                        }
                    if (!other)
                        break;
                }
                cs.splits = 3;
                cs.cfg.split = cs.wcfg.split = 1;
            }
            stof_plan *plan = NULL;
            cr_assert_eq(stof__attention_plan_kernel(ctx, &p.d, p.m, &cs,
                                                     &plan),
                         STOF_OK, "kind %d: %s", cs.kind, stof_errmsg(ctx));
            char what[200];
            snprintf(what, sizeof(what),
                     "%s %dx%d/%dx%dx%d d=%d cap %g alibi %d bias %d kind "
                     "%d split %d",
                     g->spec, g->batch, g->heads, g->kv_heads, g->seq_q,
                     g->seq_k, g->head_dim, (double)g->softcap, g->alibi,
                     g->bias, cs.kind, cs.splits);
            run_and_check(ctx, &p, plan, what);
            stof_plan_free(&plan);
            tested++;
        }
    }
    cr_assert_geq(tested, 3, "%s: only %d plans ran", g->spec, tested);
    /* A candidate built without the modifiers is refused by name. */
    if (n > 0) {
        stof_candidate bad = cands[0];
        bad.cfg.mods = bad.wcfg.mods = 0;
        stof_plan *plan = NULL;
        cr_assert_eq(stof__attention_plan_kernel(ctx, &p.d, p.m, &bad, &plan),
                     STOF_ERR_UNSUPPORTED);
        cr_assert_null(plan);
        cr_assert(strstr(stof_errmsg(ctx), "modifiers"), "%s",
                  stof_errmsg(ctx));
    }
    problem_free(ctx, &p);
}

Test(gpu_scoremod, every_kind_matches_the_reference)
{
    stof_context *ctx = tu_open_gpu_or_skip(NULL);
    tu_rng r = {tu_seed()};
    static const mod_case cases[] = {
        {2, 4, 4, 300, 300, 64, STOF_DTYPE_FP16, STOF_LAYOUT_BHSD, "causal",
         2.0f, 0, 0},
        {1, 8, 2, 520, 700, 128, STOF_DTYPE_BF16, STOF_LAYOUT_BSHD,
         "sliding:200", 0.0f, 1, 0},
        {2, 2, 2, 257, 333, 64, STOF_DTYPE_FP16, STOF_LAYOUT_BHSD,
         "causal&!prefix:5", 3.0f, 1, 0},
        {1, 2, 1, 384, 384, 256, STOF_DTYPE_BF16, STOF_LAYOUT_BHSD, "dense",
         5.0f, 0, 0},
        {1, 4, 4, 256, 500, 128, STOF_DTYPE_FP16, STOF_LAYOUT_BSHD,
         "bigbird:64:3:2:3:1", 1.5f, 0, 0},
        /* Additive biases: per head (T5-like), per batch element with
         * -inf padding (a padding mask), one per (batch, head, row) with
         * every modifier, one row broadcast over rows (keys only). */
        {2, 4, 4, 300, 300, 64, STOF_DTYPE_BF16, STOF_LAYOUT_BHSD, "causal",
         0.0f, 0, BIAS_ON | BIAS_H | BIAS_R},
        {3, 4, 2, 257, 333, 128, STOF_DTYPE_FP16, STOF_LAYOUT_BSHD, "dense",
         0.0f, 0, BIAS_ON | BIAS_B | BIAS_R | BIAS_NINF},
        {2, 2, 1, 200, 456, 256, STOF_DTYPE_BF16, STOF_LAYOUT_BHSD,
         "sliding:100", 3.0f, 1,
         BIAS_ON | BIAS_B | BIAS_H | BIAS_R | BIAS_NINF},
        {2, 4, 4, 129, 640, 64, STOF_DTYPE_FP16, STOF_LAYOUT_BHSD,
         "bigbird:64:3:2:3:1", 0.0f, 0, BIAS_ON | BIAS_B | BIAS_NINF},
        /* bf16's most negative value as the padding and a whole row's
         * bias (row 3: zeros and an LSE of -inf in every kernel, the
         * reference included), with the bias divided by the scale and,
         * soft-capped, scaled by log2(e). */
        {2, 4, 4, 129, 640, 64, STOF_DTYPE_BF16, STOF_LAYOUT_BHSD,
         "bigbird:64:3:2:3:1", 0.0f, 0,
         BIAS_ON | BIAS_B | BIAS_R | BIAS_NINF | BIAS_MIN},
        {2, 2, 1, 200, 456, 128, STOF_DTYPE_BF16, STOF_LAYOUT_BSHD,
         "sliding:100", 2.0f, 0,
         BIAS_ON | BIAS_H | BIAS_R | BIAS_NINF | BIAS_MIN},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
        check_case(ctx, &cases[i], &r);
    stof_close(&ctx);
}

/* A family planned by the search (its candidates verified against the GPU
 * family reference with the modifiers) runs its default instance, which
 * is the spec's mask. */
Test(gpu_scoremod, a_searched_family_plan_matches_the_reference)
{
    stof_settings s;
    stof_default_settings(&s);
    s.user_db = ""; /* no database: the search runs */
    stof_context *ctx = tu_open_gpu_or_skip(&s);
    tu_rng r = {tu_seed() ^ 0x50f7};
    static const mod_case cases[] = {
        {2, 4, 2, 200, 600, 64, STOF_DTYPE_BF16, STOF_LAYOUT_BHSD, "causal",
         4.0f, 1, 0},
        {2, 4, 2, 200, 600, 128, STOF_DTYPE_FP16, STOF_LAYOUT_BSHD,
         "sliding:150", 0.0f, 0, BIAS_ON | BIAS_B | BIAS_R | BIAS_NINF},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        const mod_case *g = &cases[i];
        mod_problem p;
        problem_new(ctx, g, &r, &p);
        stof_mask_family *fam = NULL;
        cr_assert_eq(stof_mask_family_create(ctx, g->spec, &fam), STOF_OK);
        stof_plan *plan = NULL;
        cr_assert_eq(stof_attention_plan_family(ctx, &p.d, fam, NULL, &plan),
                     STOF_OK, "%s", stof_errmsg(ctx));
        char what[96];
        snprintf(what, sizeof(what), "family %s cap %g alibi %d bias %d",
                 g->spec, (double)g->softcap, g->alibi, g->bias);
        run_and_check(ctx, &p, plan, what);
        stof_plan_free(&plan);
        stof_mask_family_free(&fam);
        problem_free(ctx, &p);
    }
    stof_close(&ctx);
}

/* stof_attention_plan with a bias: the search verifies its candidates on
 * a bias of its own and the plan's description names it; a descriptor
 * with bias strides but no bias, or bad strides, is refused by name. */
Test(gpu_scoremod, a_searched_plan_with_a_bias_matches_the_reference)
{
    stof_settings s;
    stof_default_settings(&s);
    s.user_db = "";
    stof_context *ctx = tu_open_gpu_or_skip(&s);
    tu_rng r = {tu_seed() ^ 0xb1a5};
    const mod_case g = {2, 8, 8, 384, 384, 128, STOF_DTYPE_BF16,
                        STOF_LAYOUT_BHSD, "causal", 0.0f, 0,
                        BIAS_ON | BIAS_H | BIAS_R};
    mod_problem p;
    problem_new(ctx, &g, &r, &p);
    stof_plan *plan = NULL;
    cr_assert_eq(stof_attention_plan(ctx, &p.d, p.m, &plan), STOF_OK, "%s",
                 stof_errmsg(ctx));
    char buf[4096];
    cr_assert_eq(stof_plan_describe(plan, buf, sizeof(buf), NULL), STOF_OK);
    cr_assert(strstr(buf, "\"BIAS\""), "%s", buf);
    run_and_check(ctx, &p, plan, "searched causal, bias per head");
    stof_plan_free(&plan);

    stof_attention_desc bad = p.d;
    bad.bias = 0;
    cr_assert_eq(stof_attention_plan(ctx, &bad, p.m, &plan),
                 STOF_ERR_INVALID_ARGUMENT);
    cr_assert(strstr(stof_errmsg(ctx), "bias_stride"), "%s",
              stof_errmsg(ctx));
    bad = p.d;
    bad.bias_stride[2] = 100;
    cr_assert_eq(stof_attention_plan(ctx, &bad, p.m, &plan),
                 STOF_ERR_INVALID_ARGUMENT);
    cr_assert(strstr(stof_errmsg(ctx), "multiple of 8"), "%s",
              stof_errmsg(ctx));
    bad = p.d;
    bad.bias = 2;
    cr_assert_eq(stof_attention_plan(ctx, &bad, p.m, &plan),
                 STOF_ERR_INVALID_ARGUMENT);
    cr_assert_null(plan);
    problem_free(ctx, &p);
    stof_close(&ctx);
}

__attribute__((visibility("default"))) int main(int argc, char **argv)
{
    return tu_gpu_suite_main("gpu_scoremod", argc, argv);
}
