/*
 * test_gpu_blaslt.c - the "gpu" suite for the cuBLASLt GEMM candidate
 * (src/kernels/blaslt.c): row-major C = epilogue(A W^T) in fp16 and bf16 for every
 * epilogue cuBLASLt can express (none, bias, bias + GELU-tanh, bias + ReLU,
 * bias + residual, residual, GELU, ReLU), on every algorithm the heuristic
 * returns, against a float reference:
 *   - relative error ||out - ref|| / ||ref|| below 2e-3 (fp16) / 1e-2 (bf16);
 *   - every output element written (the output is poisoned with NaN);
 *   - the padding of a padded output (ldc > N) untouched.
 * Also: the epilogues it must refuse, a stored algorithm's round trip
 * (stof__blaslt_algo_bytes -> stof__blaslt_set_algo), damaged blobs
 * refused without a crash, argument checks of run, and the speed of the
 * heuristic's first algorithm against the best of its list.
 * Without a usable GPU the program checks only that the library lookup
 * answers (stof__blaslt_available) and exits 77 (skip).
 */
#include <criterion/criterion.h>
#include <criterion/logging.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "blaslt.h"
#include "cuda_shim.h"
#include "internal.h"
#include "testutil.h"

/* Open a context or skip the test. */
static stof_context *open_or_skip(void)
{
    stof_context *ctx = tu_open_gpu_or_skip(NULL);
    char why[1024];
    if (!stof__blaslt_available(why, sizeof(why))) {
        stof_close(&ctx);
        cr_skip_test("cuBLASLt not available, skipping: %s", why);
    }
    return ctx;
}

/* ------------------------------------------------------------------------ */
/* Reference                                                                 */
/* ------------------------------------------------------------------------ */

static float gelu_tanh(float x)
{
    return 0.5f * x *
           (1.0f + tanhf(0.7978845608028654f * (x + 0.044715f * x * x * x)));
}

static float gelu_erf(float x)
{
    return 0.5f * x * (1.0f + erff(x * 0.7071067811865476f));
}

/* out[m][n] (ld ldc) = act(sum_k A[m][k] W[n][k] + bias[n]) + res[m][n];
 * `erf` swaps GELU-tanh for GELU-erf (to tell which one cuBLASLt uses). */
static void ref_gemm(const float *A, const float *W, const float *bias,
                     const float *res, int M, int N, int K, int64_t lda,
                     int64_t ldw, int64_t ldc, const stof_gemm_epi *e,
                     int erf, double *out)
{
    for (int m = 0; m < M; m++)
        for (int n = 0; n < N; n++) {
            float acc = 0.0f;
            const float *a = A + (size_t)m * lda, *w = W + (size_t)n * ldw;
            for (int k = 0; k < K; k++)
                acc += a[k] * w[k];
            if (e->bias)
                acc += bias[n];
            if (e->act == STOF_ACT_GELU_TANH)
                acc = erf ? gelu_erf(acc) : gelu_tanh(acc);
            else if (e->act == STOF_ACT_RELU)
                acc = acc > 0.0f ? acc : 0.0f;
            if (e->residual)
                acc += res[(size_t)m * ldc + n];
            out[(size_t)m * N + n] = acc;
        }
}

static float to_f32(uint16_t h, stof_dtype dt)
{
    return dt == STOF_DTYPE_BF16 ? tu_bf16_to_f32(h) : tu_f16_to_f32(h);
}

/* ------------------------------------------------------------------------ */
/* One problem on the device                                                 */
/* ------------------------------------------------------------------------ */

typedef struct prob {
    stof_dtype dt;
    int M, N, K;
    int64_t lda, ldw, ldc;
    stof_gemm_epi e;
    /* host */
    uint16_t *ha, *hw, *hb, *hr, *hc;
    float *fa, *fw, *fb, *fr;
    double *ref, *ref_erf, *got;
    /* device */
    CUdeviceptr a, w, b, r, c, ws;
    CUstream s;
} prob;

#define POISON 0xFFFFu /* NaN in fp16 and bf16 */
#define PAD_MARK 0x1234u

static void prob_init(stof_context *ctx, prob *p, stof_dtype dt, int M, int N,
                      int K, int pad, const stof_gemm_epi *e, tu_rng *rng)
{
    memset(p, 0, sizeof(*p));
    p->dt = dt, p->M = M, p->N = N, p->K = K;
    p->lda = K + pad, p->ldw = K + 2 * pad, p->ldc = N + pad;
    p->e = *e;
    size_t na = (size_t)M * p->lda, nw = (size_t)N * p->ldw,
           nc = (size_t)M * p->ldc;
    p->ha = calloc(na, 2), p->fa = calloc(na, 4);
    p->hw = calloc(nw, 2), p->fw = calloc(nw, 4);
    p->hb = calloc((size_t)N, 2), p->fb = calloc((size_t)N, 4);
    p->hr = calloc(nc, 2), p->fr = calloc(nc, 4);
    p->hc = calloc(nc, 2);
    p->ref = calloc((size_t)M * N, 8);
    p->ref_erf = calloc((size_t)M * N, 8);
    p->got = calloc((size_t)M * N, 8);
    cr_assert(p->ha && p->fa && p->hw && p->fw && p->hb && p->fb && p->hr &&
              p->fr && p->hc && p->ref && p->ref_erf && p->got);
    tu_fill_random(rng, p->ha, p->fa, na, dt, 1.0f);
    tu_fill_random(rng, p->hw, p->fw, nw, dt, 2.0f / sqrtf((float)K));
    tu_fill_random(rng, p->hb, p->fb, (size_t)N, dt, 0.5f);
    tu_fill_random(rng, p->hr, p->fr, nc, dt, 1.0f);
    ref_gemm(p->fa, p->fw, p->fb, p->fr, M, N, K, p->lda, p->ldw, p->ldc, e, 0,
             p->ref);
    if (e->act == STOF_ACT_GELU_TANH)
        ref_gemm(p->fa, p->fw, p->fb, p->fr, M, N, K, p->lda, p->ldw, p->ldc,
                 e, 1, p->ref_erf);

    const stof_api *api = ctx->api;
    cr_assert_eq(stof__ctx_push(ctx), STOF_OK);
    cr_assert_eq(api->cuMemAlloc(&p->a, na * 2), CUDA_SUCCESS);
    cr_assert_eq(api->cuMemAlloc(&p->w, nw * 2), CUDA_SUCCESS);
    cr_assert_eq(api->cuMemAlloc(&p->b, (size_t)N * 2), CUDA_SUCCESS);
    cr_assert_eq(api->cuMemAlloc(&p->r, nc * 2), CUDA_SUCCESS);
    cr_assert_eq(api->cuMemAlloc(&p->c, nc * 2), CUDA_SUCCESS);
    cr_assert_eq(api->cuMemAlloc(&p->ws, STOF_BLASLT_WORKSPACE), CUDA_SUCCESS);
    cr_assert_eq(api->cuMemcpyHtoD(p->a, p->ha, na * 2), CUDA_SUCCESS);
    cr_assert_eq(api->cuMemcpyHtoD(p->w, p->hw, nw * 2), CUDA_SUCCESS);
    cr_assert_eq(api->cuMemcpyHtoD(p->b, p->hb, (size_t)N * 2), CUDA_SUCCESS);
    cr_assert_eq(api->cuMemcpyHtoD(p->r, p->hr, nc * 2), CUDA_SUCCESS);
    cr_assert_eq(api->cuStreamCreate(&p->s, 0), CUDA_SUCCESS);
    stof__ctx_pop(ctx);
}

static void prob_free(stof_context *ctx, prob *p)
{
    const stof_api *api = ctx->api;
    if (stof__ctx_push(ctx) == STOF_OK) {
        CUdeviceptr d[] = {p->a, p->w, p->b, p->r, p->c, p->ws};
        for (size_t i = 0; i < sizeof(d) / sizeof(d[0]); i++)
            if (d[i])
                api->cuMemFree(d[i]);
        if (p->s)
            api->cuStreamDestroy(p->s);
        stof__ctx_pop(ctx);
    }
    free(p->ha), free(p->fa), free(p->hw), free(p->fw), free(p->hb);
    free(p->fb), free(p->hr), free(p->fr), free(p->hc), free(p->ref);
    free(p->ref_erf), free(p->got);
}

static stof_gemm_args prob_args(const prob *p)
{
    stof_gemm_args x;
    memset(&x, 0, sizeof(x));
    x.a = p->a, x.w = p->w, x.c = p->c;
    x.bias = p->e.bias ? p->b : 0;
    x.residual = p->e.residual ? p->r : 0;
    x.M = p->M, x.N = p->N, x.K = p->K;
    x.lda = p->lda, x.ldw = p->ldw, x.ldc = p->ldc;
    return x;
}

/* Run algorithm `algo` of g on p with a poisoned output; return the
 * relative error against the reference (tanh GELU), *err_erf against the
 * erf one. Asserts that the padding was left alone. */
static double prob_run(stof_context *ctx, prob *p, stof_blaslt_gemm *g,
                       int algo, double *err_erf)
{
    const stof_api *api = ctx->api;
    size_t nc = (size_t)p->M * p->ldc;
    for (size_t i = 0; i < nc; i++)
        p->hc[i] = (i % (size_t)p->ldc) < (size_t)p->N ? POISON : PAD_MARK;
    cr_assert_eq(stof__ctx_push(ctx), STOF_OK);
    cr_assert_eq(api->cuMemcpyHtoD(p->c, p->hc, nc * 2), CUDA_SUCCESS);
    stof_gemm_args x = prob_args(p);
    /* Exactly the workspace the algorithm says it needs (none: no
     * pointer), as a layer plan gives it. */
    const size_t need = stof__blaslt_ws_need(g, algo);
    cr_assert(need <= STOF_BLASLT_WORKSPACE);
    stof_status st = stof__blaslt_run(g, algo, &x, need ? p->ws : 0, need, p->s);
    cr_assert_eq(st, STOF_OK, "stof__blaslt_run algo %d: %s", algo,
                 stof_status_name(st));
    cr_assert_eq(api->cuStreamSynchronize(p->s), CUDA_SUCCESS);
    cr_assert_eq(api->cuMemcpyDtoH(p->hc, p->c, nc * 2), CUDA_SUCCESS);
    stof__ctx_pop(ctx);
    for (int m = 0; m < p->M; m++) {
        for (int n = 0; n < p->N; n++)
            p->got[(size_t)m * p->N + n] =
                to_f32(p->hc[(size_t)m * p->ldc + n], p->dt);
        for (int64_t n = p->N; n < p->ldc; n++)
            cr_assert_eq(p->hc[(size_t)m * p->ldc + (size_t)n], PAD_MARK,
                         "padding written at row %d col %lld", m,
                         (long long)n);
    }
    size_t n = (size_t)p->M * p->N;
    if (err_erf)
        *err_erf = p->e.act == STOF_ACT_GELU_TANH
                       ? tu_rel_err(p->got, p->ref_erf, n)
                       : NAN;
    return tu_rel_err(p->got, p->ref, n);
}

static double tol(stof_dtype dt)
{
    return dt == STOF_DTYPE_BF16 ? 1e-2 : 2e-3;
}

static const char *dt_name(stof_dtype dt)
{
    return dt == STOF_DTYPE_BF16 ? "bf16" : "fp16";
}

/* ------------------------------------------------------------------------ */
/* Tests                                                                     */
/* ------------------------------------------------------------------------ */

typedef struct epi_case {
    const char *name;
    stof_gemm_epi e;
} epi_case;

static const epi_case epis[] = {
    {"none", {0, STOF_ACT_NONE, 0, 0, 0, 0, 0, 0}},
    {"bias", {1, STOF_ACT_NONE, 0, 0, 0, 0, 0, 0}},
    {"bias+gelu_tanh", {1, STOF_ACT_GELU_TANH, 0, 0, 0, 0, 0, 0}},
    {"bias+relu", {1, STOF_ACT_RELU, 0, 0, 0, 0, 0, 0}},
    {"bias+residual", {1, STOF_ACT_NONE, 1, 0, 0, 0, 0, 0}},
    {"residual", {0, STOF_ACT_NONE, 1, 0, 0, 0, 0, 0}},
    {"gelu_tanh", {0, STOF_ACT_GELU_TANH, 0, 0, 0, 0, 0, 0}},
    {"relu", {0, STOF_ACT_RELU, 0, 0, 0, 0, 0, 0}},
};

typedef struct shape {
    int M, N, K, pad;
} shape;

static const shape shapes[] = {
    {256, 768, 768, 0},
    {100, 200, 72, 0},
    {100, 200, 72, 8}, /* padded rows: lda, ldw, ldc > K, K, N */
    {1, 64, 64, 0},
};

Test(blaslt, epilogues_all_algos, .timeout = 600)
{
    stof_context *ctx = open_or_skip();
    char why[1024];
    stof__blaslt_available(why, sizeof(why));
    cr_log_info("cuBLASLt: %s", why);
    tu_rng rng = {tu_seed()};
    const stof_dtype dts[] = {STOF_DTYPE_FP16, STOF_DTYPE_BF16};
    int checked = 0;
    for (size_t di = 0; di < 2; di++)
        for (size_t si = 0; si < sizeof(shapes) / sizeof(shapes[0]); si++)
            for (size_t ei = 0; ei < sizeof(epis) / sizeof(epis[0]); ei++) {
                const shape *sh = &shapes[si];
                const epi_case *ec = &epis[ei];
                cr_assert(stof__blaslt_epi_ok(&ec->e), "%s", ec->name);
                prob p;
                prob_init(ctx, &p, dts[di], sh->M, sh->N, sh->K, sh->pad,
                          &ec->e, &rng);
                stof_blaslt_gemm *g = NULL;
                stof_status st = stof__blaslt_create(
                    ctx, p.dt, p.M, p.N, p.K, p.lda, p.ldw, p.ldc, &ec->e, 8,
                    &g);
                cr_assert_eq(st, STOF_OK, "create %s %s %dx%dx%d: %s",
                             dt_name(p.dt), ec->name, p.M, p.N, p.K,
                             stof_errmsg(ctx));
                int n = stof__blaslt_n_algos(g);
                cr_assert(n >= 1 && n <= 8);
                double worst = 0.0, worst_erf = 0.0;
                for (int i = 0; i < n; i++) {
                    double ee = NAN;
                    double err = prob_run(ctx, &p, g, i, &ee);
                    cr_expect_lt(err, tol(p.dt),
                                 "%s %s M %d N %d K %d pad %d algo %d/%d: "
                                 "rel err %g",
                                 dt_name(p.dt), ec->name, p.M, p.N, p.K,
                                 sh->pad, i, n, err);
                    if (err > worst)
                        worst = err;
                    if (ee > worst_erf)
                        worst_erf = ee;
                    checked++;
                }
                if (ec->e.act == STOF_ACT_GELU_TANH)
                    cr_log_info("%s %s %dx%dx%d: %d algos, worst rel err %.3g "
                                "(against GELU-erf %.3g)",
                                dt_name(p.dt), ec->name, p.M, p.N, p.K, n,
                                worst, worst_erf);
                else
                    cr_log_info("%s %s %dx%dx%d pad %d: %d algos, worst rel "
                                "err %.3g",
                                dt_name(p.dt), ec->name, p.M, p.N, p.K,
                                sh->pad, n, worst);
                stof__blaslt_free(&g);
                cr_assert_null(g);
                prob_free(ctx, &p);
            }
    cr_log_info("%d runs checked", checked);
    stof_close(&ctx);
}

Test(blaslt, epi_ok_refuses)
{
    const stof_gemm_epi bad[] = {
        {1, STOF_ACT_GELU_ERF, 0, 0, 0, 0, 0, 0}, {1, STOF_ACT_SILU, 0, 0, 0, 0, 0, 0},
        {0, STOF_ACT_GELU_ERF, 0, 0, 0, 0, 0, 0}, {1, STOF_ACT_NONE, 1, 1, 0, 0, 0, 0},
        {1, STOF_ACT_NONE, 1, 2, 1, 0, 0, 0},     {0, STOF_ACT_NONE, 0, 1, 0, 0, 0, 0},
        {1, STOF_ACT_GELU_TANH, 1, 0, 0, 0, 0, 0}, {1, STOF_ACT_RELU, 1, 0, 0, 0, 0, 0},
        {0, 99, 0, 0, 0, 0, 0, 0},                {0, STOF_ACT_NONE, 0, 0, 0, 1, 0, 0},
        {1, STOF_ACT_SILU, 0, 0, 0, 1, 0, 0},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
        cr_expect_not(stof__blaslt_epi_ok(&bad[i]), "case %zu", i);
    cr_expect_not(stof__blaslt_epi_ok(NULL));
    for (size_t i = 0; i < sizeof(epis) / sizeof(epis[0]); i++)
        cr_expect(stof__blaslt_epi_ok(&epis[i].e), "%s", epis[i].name);

    stof_context *ctx = open_or_skip();
    stof_blaslt_gemm *g = (stof_blaslt_gemm *)(uintptr_t)1; /* cleared */
    stof_status st = stof__blaslt_create(ctx, STOF_DTYPE_FP16, 64, 64, 64, 64,
                                         64, 64, &bad[0], 4, &g);
    cr_assert_eq(st, STOF_ERR_UNSUPPORTED);
    cr_assert_null(g);
    cr_log_info("gelu_erf refused: %s", stof_errmsg(ctx));
    stof_close(&ctx);
}

Test(blaslt, set_algo_round_trip_and_bogus_blobs, .timeout = 300)
{
    stof_context *ctx = open_or_skip();
    tu_rng rng = {tu_seed()};
    const stof_gemm_epi e = {1, STOF_ACT_GELU_TANH, 0, 0, 0, 0, 0, 0};
    prob p;
    prob_init(ctx, &p, STOF_DTYPE_FP16, 256, 768, 768, 0, &e, &rng);
    stof_blaslt_gemm *g = NULL;
    cr_assert_eq(stof__blaslt_create(ctx, p.dt, p.M, p.N, p.K, p.lda, p.ldw,
                                     p.ldc, &e, 8, &g),
                 STOF_OK, "%s", stof_errmsg(ctx));
    int n = stof__blaslt_n_algos(g);
    unsigned char blob[STOF_BLASLT_ALGO_BYTES], back[STOF_BLASLT_ALGO_BYTES];
    stof__blaslt_algo_bytes(g, n - 1, blob);

    /* A fresh description of the same problem takes each stored algorithm
     * and computes the same thing. set_algo rebuilds the algorithm from
     * its configuration: the bytes it gives back describe the same
     * configuration, and setting those again is a fixed point. */
    stof_blaslt_gemm *h = NULL;
    int same_bytes = 0;
    for (int i = 0; i < n; i++) {
        stof__blaslt_algo_bytes(g, i, blob);
        stof__blaslt_free(&h);
        cr_assert_eq(stof__blaslt_create(ctx, p.dt, p.M, p.N, p.K, p.lda,
                                         p.ldw, p.ldc, &e, 2, &h),
                     STOF_OK, "%s", stof_errmsg(ctx));
        cr_assert_eq(stof__blaslt_set_algo(ctx, h, blob), STOF_OK,
                     "algo %d: %s", i, stof_errmsg(ctx));
        cr_assert_eq(stof__blaslt_n_algos(h), 1);
        stof__blaslt_algo_bytes(h, 0, back);
        same_bytes += memcmp(blob, back, sizeof(blob)) == 0;
        cr_assert_eq(stof__blaslt_set_algo(ctx, h, back), STOF_OK, "%s",
                     stof_errmsg(ctx));
        unsigned char again[STOF_BLASLT_ALGO_BYTES];
        stof__blaslt_algo_bytes(h, 0, again);
        cr_assert_eq(memcmp(back, again, sizeof(back)), 0,
                     "algo %d: set_algo is not a fixed point", i);
        double err = prob_run(ctx, &p, h, 0, NULL);
        cr_assert_lt(err, tol(p.dt), "stored algo %d: rel err %g", i, err);
    }
    cr_log_info("stored algorithms: %d of %d come back byte for byte", same_bytes,
                n);

    /* Out of range: zeros, no crash. */
    stof__blaslt_algo_bytes(h, 5, back);
    for (size_t i = 0; i < sizeof(back); i++)
        cr_assert_eq(back[i], 0);

    /* Damaged blobs are refused (or at worst accepted after
     * cublasLtMatmulAlgoCheck); never a crash, and a refusal leaves the
     * list as it was. */
    unsigned char bad[STOF_BLASLT_ALGO_BYTES];
    memset(bad, 0xA5, sizeof(bad));
    stof_status st = stof__blaslt_set_algo(ctx, h, bad);
    cr_assert_eq(st, STOF_ERR_UNSUPPORTED, "0xA5 blob: %s",
                 stof_status_name(st));
    cr_log_info("0xA5 blob refused: %s", stof_errmsg(ctx));
    cr_assert_eq(stof__blaslt_n_algos(h), 1);
    int refused = 0, accepted = 0;
    for (int t = 0; t < 64; t++) {
        stof_blaslt_gemm *k = NULL;
        cr_assert_eq(stof__blaslt_create(ctx, p.dt, p.M, p.N, p.K, p.lda,
                                         p.ldw, p.ldc, &e, 1, &k),
                     STOF_OK);
        memcpy(bad, blob, sizeof(bad));
        if (t < 32) {
            /* random bytes everywhere */
            for (size_t i = 0; i < sizeof(bad); i++)
                bad[i] = (unsigned char)tu_below(&rng, 256);
        } else {
            /* one field of a good blob damaged */
            size_t at = tu_below(&rng, sizeof(bad) / 4) * 4;
            uint32_t v = (uint32_t)tu_next(&rng);
            memcpy(bad + at, &v, 4);
        }
        st = stof__blaslt_set_algo(ctx, k, bad);
        if (st == STOF_OK)
            accepted++;
        else {
            cr_assert_eq(st, STOF_ERR_UNSUPPORTED, "%s", stof_status_name(st));
            refused++;
        }
        stof__blaslt_free(&k);
    }
    cr_log_info("damaged blobs: %d refused, %d accepted by "
                "cublasLtMatmulAlgoCheck",
                refused, accepted);

    /* run's argument checks */
    stof_gemm_args x = prob_args(&p);
    cr_assert_eq(stof__blaslt_run(g, n, &x, p.ws, STOF_BLASLT_WORKSPACE, p.s),
                 STOF_ERR_INVALID_ARGUMENT);
    cr_assert_eq(stof__blaslt_run(g, -1, &x, p.ws, STOF_BLASLT_WORKSPACE, p.s),
                 STOF_ERR_INVALID_ARGUMENT);
    x.M++;
    cr_assert_eq(stof__blaslt_run(g, 0, &x, p.ws, STOF_BLASLT_WORKSPACE, p.s),
                 STOF_ERR_INVALID_ARGUMENT);
    x = prob_args(&p);
    x.a += 2;
    cr_assert_eq(stof__blaslt_run(g, 0, &x, p.ws, STOF_BLASLT_WORKSPACE, p.s),
                 STOF_ERR_INVALID_ARGUMENT);
    x = prob_args(&p);
    x.bias = 0;
    cr_assert_eq(stof__blaslt_run(g, 0, &x, p.ws, STOF_BLASLT_WORKSPACE, p.s),
                 STOF_ERR_INVALID_ARGUMENT);
    cr_assert_eq(stof__blaslt_run(NULL, 0, &x, p.ws, STOF_BLASLT_WORKSPACE, p.s),
                 STOF_ERR_INVALID_ARGUMENT);
    /* less workspace than the algorithm needs, or a size without memory */
    x = prob_args(&p);
    int with_need = 0;
    for (int i = 0; i < n; i++) {
        const size_t need = stof__blaslt_ws_need(g, i);
        if (need) {
            with_need++;
            cr_assert_eq(stof__blaslt_run(g, i, &x, p.ws, need - 1, p.s),
                         STOF_ERR_INVALID_ARGUMENT);
        }
    }
    cr_assert_eq(stof__blaslt_run(g, 0, &x, 0, 1024, p.s),
                 STOF_ERR_INVALID_ARGUMENT);
    /* (0 of them: the smaller-workspace check had nothing to refuse) */
    cr_log_info("%d of the %d algorithms need a workspace (the first %zu "
                "bytes)",
                with_need, n, stof__blaslt_ws_need(g, 0));

    stof__blaslt_free(&g);
    stof__blaslt_free(&h);
    stof__blaslt_free(&h); /* harmless */
    prob_free(ctx, &p);
    stof_close(&ctx);
}

/* Mean time in ms of `reps` runs of algorithm i after a warm-up. */
static double time_algo(stof_context *ctx, prob *p, stof_blaslt_gemm *g,
                        int i, int reps)
{
    const stof_api *api = ctx->api;
    stof_gemm_args x = prob_args(p);
    CUevent e0, e1;
    cr_assert_eq(stof__ctx_push(ctx), STOF_OK);
    cr_assert_eq(api->cuEventCreate(&e0, 0), CUDA_SUCCESS);
    cr_assert_eq(api->cuEventCreate(&e1, 0), CUDA_SUCCESS);
    for (int r = 0; r < 3; r++)
        cr_assert_eq(stof__blaslt_run(g, i, &x, p->ws, STOF_BLASLT_WORKSPACE, p->s), STOF_OK);
    cr_assert_eq(api->cuEventRecord(e0, p->s), CUDA_SUCCESS);
    for (int r = 0; r < reps; r++)
        cr_assert_eq(stof__blaslt_run(g, i, &x, p->ws, STOF_BLASLT_WORKSPACE, p->s), STOF_OK);
    cr_assert_eq(api->cuEventRecord(e1, p->s), CUDA_SUCCESS);
    cr_assert_eq(api->cuEventSynchronize(e1), CUDA_SUCCESS);
    float ms = 0.0f;
    cr_assert_eq(api->cuEventElapsedTime(&ms, e0, e1), CUDA_SUCCESS);
    api->cuEventDestroy(e0);
    api->cuEventDestroy(e1);
    stof__ctx_pop(ctx);
    return ms / reps;
}

Test(blaslt, first_vs_best_algo, .timeout = 300)
{
    stof_context *ctx = open_or_skip();
    tu_rng rng = {tu_seed()};
    const int M = 4096, N = 3072, K = 768;
    const double flop = 2.0 * M * N * K;
    const epi_case *cases[] = {&epis[0], &epis[2]};
    for (size_t c = 0; c < 2; c++) {
        const stof_gemm_epi *e = &cases[c]->e;
        prob p;
        prob_init(ctx, &p, STOF_DTYPE_FP16, M, N, K, 0, e, &rng);
        stof_blaslt_gemm *g = NULL;
        cr_assert_eq(stof__blaslt_create(ctx, p.dt, M, N, K, p.lda, p.ldw,
                                         p.ldc, e, 16, &g),
                     STOF_OK, "%s", stof_errmsg(ctx));
        int n = stof__blaslt_n_algos(g);
        double first = 0.0, best = 1e30;
        int best_i = 0;
        for (int i = 0; i < n; i++) {
            double ms = time_algo(ctx, &p, g, i, 20);
            if (i == 0)
                first = ms;
            if (ms < best)
                best = ms, best_i = i;
            cr_log_info("fp16 %s %dx%dx%d algo %d: %.4f ms, %.1f TFLOP/s",
                        cases[c]->name, M, N, K, i, ms, flop / ms * 1e-9);
        }
        double err = prob_run(ctx, &p, g, best_i, NULL);
        cr_expect_lt(err, tol(p.dt), "best algo %d: rel err %g", best_i, err);
        cr_log_info("fp16 %s %dx%dx%d: first of %d algos %.1f TFLOP/s, best "
                    "(algo %d) %.1f TFLOP/s (%.1f%% faster)",
                    cases[c]->name, M, N, K, n, flop / first * 1e-9, best_i,
                    flop / best * 1e-9, (first / best - 1.0) * 100.0);
        stof__blaslt_free(&g);
        prob_free(ctx, &p);
    }
    stof_close(&ctx);
}

/* Without a GPU the suite is skipped; the library lookup must still answer
 * with a reason and not crash (it runs on CI machines, where the toolkit's
 * libcublasLt may load but no driver is present). Only in the first
 * process: Criterion's workers re-enter main. */
static int lookup_check(void)
{
    char why[1024] = {0};
    int ok = stof__blaslt_available(why, sizeof(why));
    size_t v = stof__blaslt_version();
    printf("cuBLASLt lookup: %s: %s (version %zu)\n",
           ok ? "available" : "not available", why, v);
    if ((ok != 0 && ok != 1) || !why[0] || (ok && v == 0) || (!ok && v != 0))
        return 1;
    /* A second call answers the same (loaded once). */
    char why2[1024] = {0};
    if (stof__blaslt_available(why2, sizeof(why2)) != ok ||
        strcmp(why, why2) != 0)
        return 1;
    /* Without a context nothing can be created; with one lacking a device
     * the error is clean. */
    stof_context *ctx = NULL;
    stof_settings s;
    stof_default_settings(&s);
    if (stof_open(&ctx, &s) != STOF_OK)
        return 1;
    if (!stof_has_device(ctx)) {
        const stof_gemm_epi e = {1, STOF_ACT_NONE, 0, 0, 0, 0, 0, 0};
        stof_blaslt_gemm *g = NULL;
        stof_status st = stof__blaslt_create(ctx, STOF_DTYPE_FP16, 64, 64, 64,
                                             64, 64, 64, &e, 4, &g);
        printf("cuBLASLt without a device: %s: %s\n", stof_status_name(st),
               stof_errmsg(ctx));
        if (st == STOF_OK || g != NULL || !stof_errmsg(ctx)[0])
            return 1;
    }
    stof_close(&ctx);
    return 0;
}

__attribute__((visibility("default"))) int main(int argc, char **argv)
{
    /* In a child: this process must not initialise CUDA before Criterion
     * starts its workers, and a crash must read as a failure. */
    if (!getenv("STOF_GPU_PROBED")) {
        fflush(stdout);
        pid_t pid = fork();
        if (pid == 0) {
            int rc = lookup_check();
            fflush(stdout);
            _exit(rc);
        }
        int status = 0;
        if (pid < 0 || waitpid(pid, &status, 0) != pid ||
            !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
            fprintf(stderr, "cuBLASLt lookup check failed (status %d)\n",
                    status);
            return 1;
        }
    }
    return tu_gpu_suite_main("gpu blaslt", argc, argv);
}
