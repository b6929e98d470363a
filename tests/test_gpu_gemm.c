/*
 * test_gpu_gemm.c - the "gpu" suite for the tensor-core GEMM templates
 * (jit_templates/gemm.cu and, on compute capability 9.0, gemm_wgmma.cu;
 * src/kernels/gemm.c): every epilogue (bias, each
 * activation, residual, LayerNorm / RMSNorm with and without write_pre),
 * fp16 and bf16, M/N/K tails and a few layer shapes, on fresh random inputs
 * with the outputs poisoned first, compared with stof__ref_gemm:
 *   - relative error ||out - ref|| / ||ref|| under 3e-3 (fp16) / 1.5e-2
 *     (bf16): the reference rounds like the kernel, so what remains is
 *     summation order (one ulp on a few elements);
 *   - every output element written (no NaN left from the poison), nothing
 *     in the padding columns of ldc written.
 * RoPE (the Hopper template's fused rope, and the plain GEMM followed by
 * the rope kernel) is compared with stof__ref_gemm_rope the same way, and
 * element by element too.
 * STOF_GEMM_BENCH=1 also times the layer shapes (M=4096 and M=128) over a
 * list of configurations and logs the TFLOP/s of each and the best, and
 * the Hopper template against cuBLASLt (bench_hopper; with
 * STOF_GEMM_BENCH_ALONE=1 each launch runs on an idle GPU, with
 * STOF_GEMM_BENCH_ENERGY=1 the energy of a launch is logged too; more
 * knobs at bench_verbose), and RoPE fused into the Hopper template's QKV
 * epilogue against cuBLASLt or the template's plain GEMM followed by the
 * rope kernel on Llama-class shapes (bench_rope).
 * Without a usable GPU the program prints why and exits 77 (skip).
 */
#include <criterion/criterion.h>
#include <criterion/logging.h>
#include <dlfcn.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_shim.h"
#include "blaslt.h"
#include "gemm.h"
#include "internal.h"
#include "testutil.h"

/* Open a context or skip the test. */
static stof_context *open_or_skip(void)
{
    return tu_open_gpu_or_skip(NULL);
}

static const char *dt_name(stof_dtype dt)
{
    return dt == STOF_DTYPE_FP16 ? "fp16" : "bf16";
}

/* n values uniform in [lo, hi], rounded to dt: raw bits and floats. */
static void fill(tu_rng *r, uint16_t *raw, float *f, size_t n, stof_dtype dt,
                 float lo, float hi)
{
    for (size_t i = 0; i < n; i++) {
        float v = lo + (hi - lo) * (float)tu_uniform(r);
        raw[i] = stof__f32_to_half(v, dt);
        f[i] = stof__half_to_f32(raw[i], dt);
    }
}

typedef struct kernel {
    CUmodule mod;
    CUfunction fn;
} kernel;

static kernel load(stof_context *ctx, stof_dtype dt, const stof_gemm_cfg *c,
                   const stof_gemm_epi *e, int N)
{
    kernel k = {0};
    void *bin = NULL;
    size_t size = 0;
    stof_status st = stof__gemm_compile(ctx, dt, c, e, N, NULL, &bin, &size);
    cr_assert_eq(st, STOF_OK, "compile: %s", stof_errmsg(ctx));
    st = stof__gemm_load_cubin(ctx, c, e, N, bin, &k.mod, &k.fn);
    free(bin);
    cr_assert_eq(st, STOF_OK, "load: %s", stof_errmsg(ctx));
    return k;
}

static void unload(stof_context *ctx, kernel *k)
{
    if (k->mod && stof__ctx_push(ctx) == STOF_OK) {
        ctx->api->cuModuleUnload(k->mod);
        stof__ctx_pop(ctx);
    }
    k->mod = NULL;
}

static CUdeviceptr upload(const stof_api *api, const void *h, size_t bytes)
{
    CUdeviceptr d = 0;
    cr_assert_eq(api->cuMemAlloc(&d, bytes ? bytes : 16), CUDA_SUCCESS);
    if (h && bytes)
        cr_assert_eq(api->cuMemcpyHtoD(d, h, bytes), CUDA_SUCCESS);
    return d;
}

/* One GEMM on the GPU against the reference; `pad` extra elements per row
 * of A, W and C. */
/* The Hopper template's configuration c with as many stages as fit with
 * epilogue e: a residual takes 32 KB more (its C rings hold whole tiles),
 * so the lists' 4-stage 128x256 and 6-stage ping-pong tiles run with one
 * stage less there. */
static stof_gemm_cfg fit_stages(const stof_context *ctx,
                                const stof_gemm_cfg *c,
                                const stof_gemm_epi *e, int N, int K)
{
    stof_gemm_cfg f = *c;
    while (f.wgmma && !f.cslot && f.stages > 2 &&
           !stof__gemm_cfg_valid(&ctx->device, &f, e, N, K, NULL, 0))
        f.stages--;
    return f;
}

/* The Hopper template's grid in check(): 0, the salt's choice (below). */
static int check_ctas;

/* RoPE in check() (seq 0: none). With e->rope: the fused epilogue's table
 * of seq positions (base theta; row m at position m % seq) and rotated
 * columns [0, cols). With split: e (without rope) runs, then the rope
 * kernel (stof_rope) in place on its output with rope and hd from here;
 * the reference rotates as the epilogue does (before the rounding). */
typedef struct rope_setup {
    int seq, cols;
    float theta;
    int split, rope, hd;
} rope_setup;
static rope_setup check_rope;

/* The rope kernel's module (stof_rope). */
static kernel load_rope(stof_context *ctx, stof_dtype dt, int hd, int rope)
{
    kernel k = {0};
    void *bin = NULL;
    size_t size = 0;
    stof_status st = stof__rope_compile(ctx, dt, hd, rope, NULL, &bin,
                                        &size);
    cr_assert_eq(st, STOF_OK, "rope compile: %s", stof_errmsg(ctx));
    st = (stof_status)stof__module_load(ctx, bin, "stof_rope", 0, &k.mod,
                                        &k.fn);
    free(bin);
    cr_assert_eq(st, STOF_OK, "rope load: %s", stof_errmsg(ctx));
    return k;
}

static void check(stof_context *ctx, stof_dtype dt, const stof_gemm_cfg *cfg,
                  const stof_gemm_epi *e, int M, int N, int K, int pad,
                  uint64_t salt)
{
    const stof_gemm_cfg fitted = fit_stages(ctx, cfg, e, N, K);
    const stof_gemm_cfg *c = &fitted;
    /* The reference's epilogue: e, or with split RoPE e with the rope
     * kernel's rotation. */
    stof_gemm_epi er = *e;
    if (check_rope.split) {
        er.rope = check_rope.rope;
        er.rope_hd = check_rope.hd;
    }
    const int rope = er.rope, rseq = rope ? check_rope.seq : 0;
    char rtag[96] = "";
    if (rope)
        snprintf(rtag, sizeof(rtag), " rope=%d/%d%s seq=%d cols=%d", rope,
                 er.rope_hd, check_rope.split ? " (kernel)" : "", rseq,
                 check_rope.cols);
    char tag[320];
    snprintf(tag, sizeof(tag),
             "[%s%s %dx%dx%d w%dx%d s%d%s%s bias=%d act=%d res=%d norm=%d "
             "pre=%d gated=%d%s] M=%d N=%d K=%d pad=%d",
             dt_name(dt), c->wgmma ? " wgmma" : "", c->block_m, c->block_n,
             c->block_k, c->warps_m, c->warps_n, c->stages,
             c->cluster > 1 ? " pairs" : "", c->cslot ? " c-in-slots" : "",
             e->bias, e->act, e->residual, e->norm, e->write_pre, e->gated,
             rtag, M, N, K, pad);
    char why[256];
    cr_assert(stof__gemm_cfg_valid(&ctx->device, c, e, N, K, why,
                                   sizeof(why)),
              "%s: not valid: %s", tag, why);
    const stof_api *api = ctx->api;
    tu_rng rng = {tu_seed() ^ salt};
    const int64_t lda = K + pad, ldw = K + pad, ldc = N + pad;
    const int wn = e->gated ? 2 * N : N; /* W's rows, bias's length */
    const size_t na = (size_t)M * lda, nw = (size_t)wn * ldw,
                 nc = (size_t)M * ldc;
    uint16_t *ha = malloc(na * 2), *hw = malloc(nw * 2), *hb = malloc(wn * 2u),
             *hr = malloc(nc * 2), *hg = malloc(N * 2u), *hbe = malloc(N * 2u),
             *ho = malloc(nc * 2), *hp = malloc(nc * 2);
    float *fa = malloc(na * 4), *fw = malloc(nw * 4), *fb = malloc(wn * 4u),
          *fr = malloc(nc * 4), *fg = malloc(N * 4u), *fbe = malloc(N * 4u),
          *fo = calloc(nc, 4), *fp = calloc(nc, 4);
    cr_assert(ha && hw && hb && hr && hg && hbe && ho && hp && fa && fw &&
              fb && fr && fg && fbe && fo && fp);
    const float wamp = 2.0f / sqrtf((float)K);
    fill(&rng, ha, fa, na, dt, -1.0f, 1.0f);
    fill(&rng, hw, fw, nw, dt, -wamp, wamp);
    fill(&rng, hb, fb, wn, dt, -0.5f, 0.5f);
    fill(&rng, hr, fr, nc, dt, -1.0f, 1.0f);
    fill(&rng, hg, fg, N, dt, 0.5f, 1.5f);
    fill(&rng, hbe, fbe, N, dt, -0.5f, 0.5f);
    const float eps = 1e-5f;
    /* RoPE's table (rows m % seq) and the reference's positions. */
    float *tab = NULL;
    int *rpos = NULL;
    if (rope) {
        cr_assert(rseq > 0 && check_rope.cols % er.rope_hd == 0 &&
                  check_rope.cols <= N);
        tab = malloc(sizeof(float) * (size_t)rseq * (size_t)rope);
        rpos = malloc(sizeof(int) * (size_t)M);
        cr_assert(tab && rpos);
        stof__rope_table(tab, NULL, rseq, rope, check_rope.theta);
        for (int m = 0; m < M; m++)
            rpos[m] = m % rseq;
    }

    kernel k = load(ctx, dt, c, e, N);
    kernel rk = {0};
    if (check_rope.split)
        rk = load_rope(ctx, dt, er.rope_hd, rope);
    cr_assert_eq(stof__ctx_push(ctx), STOF_OK);
    stof_gemm_args a;
    memset(&a, 0, sizeof(a));
    a.a = upload(api, ha, na * 2);
    a.w = upload(api, hw, nw * 2);
    a.c = upload(api, NULL, nc * 2);
    a.bias = e->bias ? upload(api, hb, wn * 2u) : 0;
    a.residual = e->residual ? upload(api, hr, nc * 2) : 0;
    a.gamma = e->norm ? upload(api, hg, N * 2u) : 0;
    a.beta = e->norm == 1 ? upload(api, hbe, N * 2u) : 0;
    a.pre = e->write_pre ? upload(api, NULL, nc * 2) : 0;
    const size_t ws = stof__gemm_ws_bytes(c, e, M, N);
    if (ws) {
        a.ws = upload(api, NULL, ws);
        cr_assert_eq(api->cuMemsetD8(a.ws, 0, ws), CUDA_SUCCESS);
    }
    a.M = M;
    a.N = N;
    a.K = K;
    a.lda = lda;
    a.ldw = ldw;
    a.ldc = ldc;
    a.eps = eps;
    if (rope) {
        a.rope_tab = upload(api, tab, sizeof(float) * (size_t)rseq * rope);
        a.rope_seq = rseq;
        a.rope_cols = check_rope.cols;
    }
    /* The Hopper template: a few CTAs on odd salts (each walks many
     * tiles), one per SM otherwise. With a workspace (a norm) twice: the
     * first launch must leave it ready for the second. */
    const int ctas = check_ctas  ? check_ctas
                     : salt % 2 ? 3
                                : ctx->device.sm_count;
    for (int run = 0; run < (a.ws ? 2 : 1); run++) {
        /* Poison: 0xffff is a NaN in fp16 and bf16. */
        cr_assert_eq(api->cuMemsetD8(a.c, 0xff, nc * 2), CUDA_SUCCESS);
        if (a.pre)
            cr_assert_eq(api->cuMemsetD8(a.pre, 0xff, nc * 2),
                         CUDA_SUCCESS);
        stof_status st = stof__gemm_launch(k.fn, c, e, &a, ctas, NULL, api);
        cr_assert_eq(st, STOF_OK, "%s: launch: %s", tag,
                     stof_status_str(st));
        if (rk.fn) { /* split RoPE: the rope kernel on the output */
            st = stof__rope_launch(rk.fn, a.c, M, ldc, check_rope.cols,
                                   er.rope_hd, rope, a.rope_tab, rseq, NULL,
                                   api);
            cr_assert_eq(st, STOF_OK, "%s: rope launch: %s", tag,
                         stof_status_str(st));
        }
        const char *failed = tu_sync_error();
        cr_assert(!failed, "%s: kernel failed: %s", tag, failed);
        if (a.ws) { /* each launch leaves its workspace zero (the row
                       counters and the statistics' words, which are
                       their own flags) */
            unsigned *w = malloc(ws);
            cr_assert_not_null(w);
            cr_assert_eq(api->cuMemcpyDtoH(w, a.ws, ws), CUDA_SUCCESS);
            const size_t n_ctr = (size_t)(M + 127) / 128 * WG_ROW_SLICES;
            size_t ctr_set = 0, words_set = 0;
            for (size_t i = 0; i < ws / 4u; i++)
                if (w[i])
                    (*(i < n_ctr ? &ctr_set : &words_set))++;
            free(w);
            cr_expect_eq(ctr_set + words_set, 0,
                         "%s: %zu row counters and %zu statistics words "
                         "left set",
                         tag, ctr_set, words_set);
        }
    }
    cr_assert_eq(api->cuMemcpyDtoH(ho, a.c, nc * 2), CUDA_SUCCESS);
    if (a.pre)
        cr_assert_eq(api->cuMemcpyDtoH(hp, a.pre, nc * 2), CUDA_SUCCESS);
    CUdeviceptr ptrs[] = {a.a,    a.w,   a.c,   a.bias,    a.residual,
                          a.gamma, a.beta, a.pre, a.ws, a.rope_tab};
    for (size_t i = 0; i < sizeof(ptrs) / sizeof(*ptrs); i++)
        if (ptrs[i])
            api->cuMemFree(ptrs[i]);
    stof__ctx_pop(ctx);
    unload(ctx, &k);
    unload(ctx, &rk);

    const stof_ref_rope rr = {tab, rpos, check_rope.cols, NULL, 0, 0.0f};
    stof__ref_gemm_rope(fa, fw, fb, fr, fg, fbe, M, N, K, lda, ldw, ldc, &er,
                        eps, dt, rope ? &rr : NULL, fo,
                        e->write_pre ? fp : NULL);

    const size_t n = (size_t)M * N;
    double *got = malloc(n * sizeof(double) * 2), *want = got + n;
    cr_assert(got);
    /* The rope kernel rotates the rounded product (the reference the
     * unrounded one): a little more error. */
    const double tol = (dt == STOF_DTYPE_FP16 ? 3e-3 : 1.5e-2) *
                       (check_rope.split ? 1.5 : 1.0);
    /* With RoPE each element too, against 4 ulps of |ref| + 1 (twice
     * that split): a wrong angle, pair, position or head is far off. */
    const double el_tol = (dt == STOF_DTYPE_FP16 ? 0x1p-8 : 0x1p-5) *
                          (check_rope.split ? 2.0 : 1.0);
    for (int pass = 0; pass < (e->write_pre ? 2 : 1); pass++) {
        const uint16_t *h = pass ? hp : ho;
        const float *f = pass ? fp : fo;
        size_t nan_count = 0, pad_written = 0, t = 0, far = 0;
        for (int i = 0; i < M; i++)
            for (int j = 0; j < (int)ldc; j++) {
                const size_t off = (size_t)i * ldc + j;
                if (j >= N) {
                    pad_written += h[off] != 0xffffu;
                    continue;
                }
                got[t] = stof__half_to_f32(h[off], dt);
                want[t] = f[off];
                if (isnan(got[t]) && nan_count++ < 3)
                    cr_log_error("%s: %s NaN at row %d col %d", tag,
                                 pass ? "pre" : "out", i, j);
                if (rope && !isnan(got[t]) &&
                    !(fabs(got[t] - want[t]) <=
                      el_tol * (fabs(want[t]) + 1.0)) &&
                    far++ < 3)
                    cr_log_error("%s: row %d (position %d) col %d: %.6g, "
                                 "reference %.6g",
                                 tag, i, i % rseq, j, got[t], want[t]);
                t++;
            }
        const double err = tu_rel_err(got, want, n);
        cr_log_info("%s: %s rel err %.2e", tag, pass ? "pre" : "out", err);
        cr_expect_eq(nan_count, 0, "%s: %zu %s elements not written", tag,
                     nan_count, pass ? "pre" : "out");
        cr_expect_eq(pad_written, 0, "%s: %zu padding elements written", tag,
                     pad_written);
        cr_expect(err < tol, "%s: %s relative error %.3e >= %.1e", tag,
                  pass ? "pre" : "out", err, tol);
        cr_expect_eq(far, 0, "%s: %zu elements far from the reference", tag,
                     far);
    }
    free(got);
    free(tab), free(rpos);
    free(ha), free(hw), free(hb), free(hr), free(hg), free(hbe), free(ho);
    free(hp);
    free(fa), free(fw), free(fb), free(fr), free(fg), free(fbe), free(fo);
    free(fp);
}

static const stof_gemm_cfg cfg_64 = {64, 64, 32, 2, 2, 3, 0, 1, 0};

/* Every activation, with and without bias / residual, on tails. */
static void epilogues(stof_dtype dt)
{
    stof_context *ctx = open_or_skip();
    for (int act = 0; act <= STOF_ACT_SILU; act++)
        for (int v = 0; v < 2; v++) {
            stof_gemm_epi e = {v == 0 || act == 0, act, v == 1 || act == 0,
                               0, 0, 0, 0, 0};
            check(ctx, dt, &cfg_64, &e, 100, 200, 72, v ? 8 : 0,
                  (uint64_t)(act * 2 + v));
        }
    stof_gemm_epi none = {0, 0, 0, 0, 0, 0, 0, 0};
    check(ctx, dt, &cfg_64, &none, 1, 8, 8, 0, 99);
    stof_close(&ctx);
}

Test(gpu, epilogues_fp16, .timeout = 300) { epilogues(STOF_DTYPE_FP16); }
Test(gpu, epilogues_bf16, .timeout = 300) { epilogues(STOF_DTYPE_BF16); }

/* Every tile shape of the candidate lists on awkward sizes. */
Test(gpu, tiles, .timeout = 600)
{
    stof_context *ctx = open_or_skip();
    static const stof_gemm_cfg cfgs[] = {
        {128, 256, 32, 2, 4, 3, 0, 1, 0}, {256, 128, 32, 4, 2, 3, 0, 1, 0},
        {128, 128, 32, 2, 4, 4, 0, 1, 0}, {128, 128, 64, 2, 4, 3, 0, 1, 0},
        {64, 128, 32, 2, 2, 4, 0, 1, 0},  {128, 64, 32, 2, 2, 2, 0, 1, 0},
        {64, 64, 64, 2, 2, 5, 0, 1, 0},   {32, 64, 32, 1, 2, 4, 0, 1, 0},
        {32, 128, 32, 1, 4, 3, 0, 1, 0},  {16, 64, 64, 1, 4, 3, 0, 1, 0},
    };
    stof_gemm_epi e = {1, STOF_ACT_GELU_TANH, 1, 0, 0, 0, 0, 0};
    for (size_t i = 0; i < sizeof(cfgs) / sizeof(*cfgs); i++)
        check(ctx, i % 2 ? STOF_DTYPE_BF16 : STOF_DTYPE_FP16, &cfgs[i], &e,
              300, 264, 200, 0, 1000 + i);
    stof_close(&ctx);
}

/* Row-complete LayerNorm / RMSNorm, with and without pre. */
static void norms(stof_dtype dt)
{
    stof_context *ctx = open_or_skip();
    static const stof_gemm_cfg cfgs[] = {
        {16, 64, 64, 1, 4, 3, 0, 1, 0},
        {32, 128, 32, 2, 4, 3, 0, 1, 0},
        {64, 64, 32, 2, 2, 3, 0, 1, 0}};
    int i = 0;
    for (int norm = 1; norm <= 2; norm++)
        for (int pre = 0; pre < 2; pre++, i++) {
            stof_gemm_epi e = {pre, 0, 1, norm, pre, 0, 0, 0};
            check(ctx, dt, &cfgs[i % 3], &e, 100, 200, 72, pre ? 8 : 0,
                  (uint64_t)(2000 + i));
        }
    stof_gemm_epi ln = {1, 0, 1, 1, 1, 0, 0, 0};
    check(ctx, dt, &cfgs[1], &ln, 128, 768, 3072, 0, 2100);
    stof_close(&ctx);
}

Test(gpu, norms_fp16, .timeout = 300) { norms(STOF_DTYPE_FP16); }
Test(gpu, norms_bf16, .timeout = 300) { norms(STOF_DTYPE_BF16); }

/* Layer shapes with the planner's first candidate. */
Test(gpu, layer_shapes, .timeout = 600)
{
    stof_context *ctx = open_or_skip();
    static const int shapes[][3] = {{512, 2304, 768}, {128, 768, 3072}};
    for (int s = 0; s < 2; s++) {
        stof_gemm_epi e = {1, s ? STOF_ACT_NONE : STOF_ACT_GELU_ERF, s,
                           0, 0, 0, 0, 0};
        stof_gemm_cfg c[32];
        int n = stof__gemm_candidates(&ctx->device, &e, shapes[s][0],
                                      shapes[s][1], shapes[s][2], c, 32);
        cr_assert_gt(n, 0);
        check(ctx, s ? STOF_DTYPE_BF16 : STOF_DTYPE_FP16, &c[0], &e,
              shapes[s][0], shapes[s][1], shapes[s][2], 0, 3000 + s);
    }
    stof_close(&ctx);
}

/* ------------------------------------------------------------------------ */
/* Timing (STOF_GEMM_BENCH=1)                                                */
/* ------------------------------------------------------------------------ */

/* The arguments of a plain M x N x K GEMM over contiguous A, W and C. */
static stof_gemm_args plain_args(CUdeviceptr a, CUdeviceptr w, CUdeviceptr c,
                                 int M, int N, int K)
{
    stof_gemm_args g;
    memset(&g, 0, sizeof(g));
    g.a = a;
    g.w = w;
    g.c = c;
    g.M = M;
    g.N = N;
    g.K = K;
    g.lda = g.ldw = K;
    g.ldc = N;
    return g;
}

static void bench_or_skip(void)
{
    const char *b = getenv("STOF_GEMM_BENCH");
    if (!b || !b[0] || strcmp(b, "0") == 0)
        cr_skip_test("set STOF_GEMM_BENCH=1 to time the GEMM");
}

/* Benchmark knobs for profiling runs: STOF_GEMM_BENCH=2 logs every
 * configuration's time; STOF_GEMM_BENCH_SHAPES="1,4" times only those
 * shapes (indices of the test's list); STOF_GEMM_BENCH_TILES="0,9" only
 * those of bench_hopper's tile list; STOF_GEMM_BENCH_REPS launches a
 * timing (default `def`; for the template's configurations and each of
 * cuBLASLt's algorithms alike: thousands keep the GPU at its sustained
 * clock and power for seconds); STOF_GEMM_BENCH_ACT (bench_hopper's
 * second epilogue's activation). */
static int bench_verbose(void)
{
    const char *b = getenv("STOF_GEMM_BENCH");
    return b && atoi(b) >= 2;
}

/* Whether index s is in the comma-separated list in environment variable
 * `var` (every index when it is unset or empty). */
static int bench_listed(const char *var, int s)
{
    const char *l = getenv(var);
    if (!l || !l[0])
        return 1;
    for (const char *p = l; *p;) {
        char *end;
        const long v = strtol(p, &end, 10);
        if (end == p)
            break;
        if (v == s)
            return 1;
        p = *end ? end + 1 : end;
    }
    return 0;
}

static int bench_shape_on(int s)
{
    return bench_listed("STOF_GEMM_BENCH_SHAPES", s);
}

static int bench_reps(int def)
{
    const char *r = getenv("STOF_GEMM_BENCH_REPS");
    return r && atoi(r) > 0 ? atoi(r) : def;
}

/* The inputs (A, W, bias, residual) hold random values (A and the
 * residual uniform in [-1, 1], W in [-0.07, 0.07], the bias in [-0.5,
 * 0.5]), as a model's do; STOF_GEMM_BENCH_RANDOM=0 fills each with one
 * repeated constant (0x1111, ~3e-4), the protocol of the entries before
 * 2026-11-25's fifth session. The data matters: on an H100 at the same
 * 1980 MHz, random operands made both the template and cuBLASLt 6-14%
 * slower than constant ones, cuBLASLt more (bench/RESULTS.md). */
static int bench_random(void)
{
    const char *v = getenv("STOF_GEMM_BENCH_RANDOM");
    return !v || !v[0] || atoi(v) > 0;
}

/* n 16-bit values uniform in [-amp, amp] into device memory at d. */
static void upload_random(const stof_api *api, CUdeviceptr d, size_t n,
                          float amp, uint64_t salt)
{
    uint16_t *h = malloc(n * 2);
    cr_assert_not_null(h);
    tu_rng rng = {tu_seed() ^ salt};
    for (size_t i = 0; i < n; i++)
        h[i] = tu_f32_to_f16(amp * (float)(2.0 * tu_uniform(&rng) - 1.0));
    cr_assert_eq(api->cuMemcpyHtoD(d, h, n * 2), CUDA_SUCCESS);
    free(h);
}

/* A benchmark's device operands (the caller's context current): A, W, C
 * and a residual of na, nw, nc, nc 16-bit elements and a vector (bias,
 * gamma, beta) of nv, random as a model's (upload_random) or, random 0,
 * each one small constant (0x1111, ~3e-4 in fp16: no overflow, no
 * denormals); and a zeroed workspace of ws bytes. */
typedef struct bench_ops {
    CUdeviceptr a, w, c, res, vec, ws;
} bench_ops;

static bench_ops bench_ops_new(const stof_api *api, size_t na, size_t nw,
                               size_t nc, size_t nv, size_t ws, int random)
{
    bench_ops b;
    cr_assert_eq(api->cuMemAlloc(&b.a, na * 2), CUDA_SUCCESS);
    cr_assert_eq(api->cuMemAlloc(&b.w, nw * 2), CUDA_SUCCESS);
    cr_assert_eq(api->cuMemAlloc(&b.c, nc * 2), CUDA_SUCCESS);
    cr_assert_eq(api->cuMemAlloc(&b.res, nc * 2), CUDA_SUCCESS);
    cr_assert_eq(api->cuMemAlloc(&b.vec, nv * 2), CUDA_SUCCESS);
    cr_assert_eq(api->cuMemAlloc(&b.ws, ws), CUDA_SUCCESS);
    cr_assert_eq(api->cuMemsetD8(b.ws, 0, ws), CUDA_SUCCESS);
    if (random) {
        upload_random(api, b.a, na, 1.0f, 1);
        upload_random(api, b.w, nw, 0.07f, 2);
        upload_random(api, b.res, nc, 1.0f, 3);
        upload_random(api, b.vec, nv, 0.5f, 4);
    } else {
        cr_assert_eq(api->cuMemsetD8(b.a, 0x11, na * 2), CUDA_SUCCESS);
        cr_assert_eq(api->cuMemsetD8(b.w, 0x11, nw * 2), CUDA_SUCCESS);
        cr_assert_eq(api->cuMemsetD8(b.res, 0x11, nc * 2), CUDA_SUCCESS);
        cr_assert_eq(api->cuMemsetD8(b.vec, 0x11, nv * 2), CUDA_SUCCESS);
    }
    return b;
}

static void bench_ops_free(const stof_api *api, bench_ops *b)
{
    const CUdeviceptr p[] = {b->a, b->w, b->c, b->res, b->vec, b->ws};
    for (size_t i = 0; i < sizeof(p) / sizeof(*p); i++)
        api->cuMemFree(p[i]);
    memset(b, 0, sizeof(*b));
}

/* STOF_GEMM_BENCH_ALONE=1: time_ms times each launch alone, the host
 * waiting for the GPU to be idle first; =2: launches back to back with an
 * event between each two, the median interval (a launch's time in the
 * stream, whatever it overlaps). */
static int bench_alone(void)
{
    const char *v = getenv("STOF_GEMM_BENCH_ALONE");
    return v ? atoi(v) : 0;
}

/* STOF_GEMM_BENCH_ENERGY=1: time_ms also reads the GPU's energy counter
 * (NVML, loaded at run time; device 0) around the timed launches and its
 * SM clock after them: energy_mj (a launch) and energy_mhz of the last
 * timing, NAN when NVML is not there. Energy per launch is what sets the
 * speed of a kernel that keeps the GPU at its power limit. NVML's counter
 * moves in coarse steps: time seconds (STOF_GEMM_BENCH_REPS) for it. */
static double energy_mj = NAN, energy_mhz = NAN;
typedef struct nvml_fns {
    int tried, ok;
    void *dev;
    int (*energy)(void *, unsigned long long *);
    int (*clock)(void *, int, unsigned *);
} nvml_fns;
static nvml_fns nvml;

static int bench_energy(void)
{
    const char *v = getenv("STOF_GEMM_BENCH_ENERGY");
    if (!v || atoi(v) <= 0)
        return 0;
    if (!nvml.tried) {
        nvml.tried = 1;
        void *h = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
        int (*init)(void) = h ? (int (*)(void))dlsym(h, "nvmlInit_v2") : NULL;
        int (*get)(unsigned, void **) =
            h ? (int (*)(unsigned, void **))dlsym(
                    h, "nvmlDeviceGetHandleByIndex_v2")
              : NULL;
        nvml.energy = h ? (int (*)(void *, unsigned long long *))dlsym(
                              h, "nvmlDeviceGetTotalEnergyConsumption")
                        : NULL;
        nvml.clock = h ? (int (*)(void *, int, unsigned *))dlsym(
                             h, "nvmlDeviceGetClockInfo")
                       : NULL;
        nvml.ok = init && get && nvml.energy && nvml.clock && init() == 0 &&
                  get(0, &nvml.dev) == 0;
        if (!nvml.ok)
            cr_log_warn("STOF_GEMM_BENCH_ENERGY: no NVML (%s)",
                        h ? "symbols or init" : dlerror());
    }
    return nvml.ok;
}

static unsigned long long energy_now(void)
{
    unsigned long long mj = 0;
    nvml.energy(nvml.dev, &mj);
    return mj;
}

static int cmp_float(const void *x, const void *y)
{
    const float a = *(const float *)x, b = *(const float *)y;
    return (a > b) - (a < b);
}

/* A separate activation or gate kernel after the GEMM (the unfused
 * chain): stof_gate over the GEMM's output. */
typedef struct gate_step {
    CUfunction fn;
    CUdeviceptr x, out;
    int rows, n, gated;
    int64_t ld_x, ld_out;
} gate_step;

/* The rope kernel after a GEMM (the chain of a GEMM that cannot fuse
 * RoPE): stof_rope in place on x [rows][ld], heads of hd below cols. */
typedef struct rope_step {
    CUfunction fn;
    CUdeviceptr x, tab;
    int rows, cols, hd, rope, seq;
    int64_t ld;
} rope_step;

/* One GEMM launch to time: the template's kernel (fn) or, with lt set,
 * cuBLASLt's algorithm `algo` (neither: no GEMM); then `after` and `rope`
 * when set. */
typedef struct timed {
    CUfunction fn;
    const stof_gemm_cfg *cfg;
    const stof_gemm_epi *epi;
    const stof_blaslt_gemm *lt;
    int algo;
    CUdeviceptr ws;
    const gate_step *after;
    const rope_step *rope;
} timed;

static stof_status timed_launch(const stof_context *ctx, const timed *t,
                                const stof_gemm_args *a)
{
    stof_status st = STOF_OK;
    if (t->lt)
        st = stof__blaslt_run(t->lt, t->algo, a, t->ws, STOF_BLASLT_WORKSPACE,
                              NULL);
    else if (t->fn)
        st = stof__gemm_launch(t->fn, t->cfg, t->epi, a, ctx->device.sm_count,
                               NULL, ctx->api);
    const gate_step *g = t->after;
    if (st == STOF_OK && g)
        st = stof__gate_launch(g->fn, g->x, g->out, g->rows, g->n, g->ld_x,
                               g->ld_out, g->gated, NULL, ctx->api);
    const rope_step *r = t->rope;
    if (st == STOF_OK && r)
        st = stof__rope_launch(r->fn, r->x, r->rows, r->ld, r->cols, r->hd,
                               r->rope, r->tab, r->seq, NULL, ctx->api);
    return st;
}

/* The gate kernel's module (stof_gate). */
static kernel load_gate(stof_context *ctx, stof_dtype dt, int act, int gated)
{
    kernel k = {0};
    void *bin = NULL;
    size_t size = 0;
    stof_status st = stof__gate_compile(ctx, dt, act, gated, NULL, &bin,
                                        &size);
    cr_assert_eq(st, STOF_OK, "gate compile: %s", stof_errmsg(ctx));
    st = (stof_status)stof__module_load(ctx, bin, "stof_gate", 0, &k.mod,
                                        &k.fn);
    free(bin);
    cr_assert_eq(st, STOF_OK, "gate load: %s", stof_errmsg(ctx));
    return k;
}

/* Mean milliseconds of one launch over `iters` (CUDA events, after 3
 * warm-ups); INFINITY when the launch fails. */
static double time_ms(const stof_context *ctx, const timed *t,
                      const stof_gemm_args *a, int iters, CUevent e0,
                      CUevent e1)
{
    const stof_api *api = ctx->api;
    for (int w = 0; w < 3; w++)
        if (timed_launch(ctx, t, a) != STOF_OK)
            return INFINITY;
    if (bench_alone() == 2) {
        enum { MAXEV = 64 };
        CUevent ev[MAXEV + 1];
        const int n = iters < MAXEV ? iters : MAXEV;
        for (int i = 0; i <= n; i++)
            cr_assert_eq(api->cuEventCreate(&ev[i], 0), CUDA_SUCCESS);
        api->cuEventRecord(ev[0], NULL);
        for (int it = 0; it < n; it++) {
            timed_launch(ctx, t, a);
            api->cuEventRecord(ev[it + 1], NULL);
        }
        cr_assert_eq(api->cuEventSynchronize(ev[n]), CUDA_SUCCESS);
        float d[MAXEV];
        for (int i = 0; i < n; i++)
            api->cuEventElapsedTime(&d[i], ev[i], ev[i + 1]);
        for (int i = 0; i <= n; i++)
            api->cuEventDestroy(ev[i]);
        qsort(d, (size_t)n, sizeof(*d), cmp_float);
        return d[n / 2];
    }
    if (bench_alone() == 1) {
        /* Each launch on an idle GPU (the host waits for the one before):
         * the call's host work and launch latency included. */
        double sum = 0.0;
        for (int it = 0; it < iters; it++) {
            cr_assert_eq(api->cuCtxSynchronize(), CUDA_SUCCESS);
            api->cuEventRecord(e0, NULL);
            timed_launch(ctx, t, a);
            api->cuEventRecord(e1, NULL);
            cr_assert_eq(api->cuEventSynchronize(e1), CUDA_SUCCESS);
            float ms = 0.0f;
            api->cuEventElapsedTime(&ms, e0, e1);
            sum += ms;
        }
        return sum / iters;
    }
    const int energy = bench_energy();
    unsigned long long mj0 = 0;
    if (energy) {
        cr_assert_eq(api->cuCtxSynchronize(), CUDA_SUCCESS);
        mj0 = energy_now();
    }
    api->cuEventRecord(e0, NULL);
    for (int it = 0; it < iters; it++)
        timed_launch(ctx, t, a);
    api->cuEventRecord(e1, NULL);
    cr_assert_eq(api->cuEventSynchronize(e1), CUDA_SUCCESS);
    if (energy) {
        unsigned mhz = 0;
        nvml.clock(nvml.dev, 1 /* NVML_CLOCK_SM */, &mhz);
        energy_mj = (double)(energy_now() - mj0) / iters;
        energy_mhz = mhz;
    }
    float ms = 0.0f;
    api->cuEventElapsedTime(&ms, e0, e1);
    return ms / (float)iters;
}

/* cuBLASLt's best time (of its heuristic's algorithms) for a's GEMM with
 * epilogue e in dt, followed by `after` when set; INFINITY without
 * cuBLASLt. */
static double lt_best_dt(stof_context *ctx, stof_dtype dt,
                         const stof_gemm_args *a, const stof_gemm_epi *e,
                         const gate_step *after, CUdeviceptr ws, CUevent e0,
                         CUevent e1)
{
    char why[256];
    if (!stof__blaslt_available(why, sizeof(why))) {
        cr_log_warn("no cuBLASLt: %s", why);
        return INFINITY;
    }
    double best = INFINITY, best_mj = NAN, best_mhz = NAN;
    stof_blaslt_gemm *lt = NULL;
    if (stof__blaslt_create(ctx, dt, a->M, a->N, a->K, a->lda, a->ldw,
                            a->ldc, e, 8, &lt) != STOF_OK)
        return INFINITY;
    for (int al = 0; al < stof__blaslt_n_algos(lt); al++) {
        const timed t = {NULL, NULL, NULL, lt, al, ws, after, NULL};
        const double ms = time_ms(ctx, &t, a, bench_reps(10), e0, e1);
        if (ms < best) {
            best = ms;
            best_mj = energy_mj;
            best_mhz = energy_mhz;
        }
    }
    stof__blaslt_free(&lt);
    energy_mj = best_mj; /* the fastest algorithm's */
    energy_mhz = best_mhz;
    return best;
}

static double lt_best(stof_context *ctx, const stof_gemm_args *a,
                      const stof_gemm_epi *e, const gate_step *after,
                      CUdeviceptr ws, CUevent e0, CUevent e1)
{
    return lt_best_dt(ctx, STOF_DTYPE_FP16, a, e, after, ws, e0, e1);
}

Test(gpu, bench, .timeout = 600)
{
    bench_or_skip();
    stof_context *ctx = open_or_skip();
    const stof_api *api = ctx->api;
    static const stof_gemm_cfg cfgs[] = {
        {128, 256, 32, 2, 4, 3, 0, 1, 0}, {128, 256, 32, 2, 4, 4, 0, 1, 0},
        {256, 128, 32, 4, 2, 3, 0, 1, 0}, {128, 128, 32, 2, 4, 3, 0, 1, 0},
        {128, 128, 32, 2, 4, 4, 0, 1, 0}, {128, 128, 64, 2, 4, 3, 0, 1, 0},
        {64, 128, 32, 2, 2, 4, 0, 1, 0},  {64, 64, 32, 2, 2, 4, 0, 1, 0},
        {32, 64, 32, 1, 2, 4, 0, 1, 0},
    };
    enum { NC = sizeof(cfgs) / sizeof(*cfgs) };
    static const int shapes[][3] = {
        {4096, 768, 768},  {4096, 2304, 768}, {4096, 3072, 768},
        {4096, 768, 3072}, {4096, 3072, 3072}, {128, 768, 768},
        {128, 2304, 768},  {128, 3072, 768},  {128, 768, 3072}};
    enum { NS = sizeof(shapes) / sizeof(*shapes) };
    const stof_dtype dt = STOF_DTYPE_FP16;
    stof_gemm_epi e = {0, 0, 0, 0, 0, 0, 0, 0};
    kernel k[NC];
    for (int i = 0; i < NC; i++)
        k[i] = load(ctx, dt, &cfgs[i], &e, 8);
    cr_assert_eq(stof__ctx_push(ctx), STOF_OK);
    for (int i = 0; i < NC; i++) {
        int regs = 0, local = 0;
        api->cuFuncGetAttribute(&regs, CU_FUNC_ATTRIBUTE_NUM_REGS, k[i].fn);
        api->cuFuncGetAttribute(&local, CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES,
                                k[i].fn);
        cr_log_info("cfg %dx%dx%d w%dx%d s%d: %d registers, %d B local",
                    cfgs[i].block_m, cfgs[i].block_n, cfgs[i].block_k,
                    cfgs[i].warps_m, cfgs[i].warps_n, cfgs[i].stages, regs,
                    local);
    }
    const size_t maxa = 4096u * 3072u, maxw = 3072u * 3072u,
                 maxc = 4096u * 3072u;
    CUdeviceptr da, dw, dc;
    cr_assert_eq(api->cuMemAlloc(&da, maxa * 2), CUDA_SUCCESS);
    cr_assert_eq(api->cuMemAlloc(&dw, maxw * 2), CUDA_SUCCESS);
    cr_assert_eq(api->cuMemAlloc(&dc, maxc * 2), CUDA_SUCCESS);
    cr_assert_eq(api->cuMemsetD8(da, 0x11, maxa * 2), CUDA_SUCCESS);
    cr_assert_eq(api->cuMemsetD8(dw, 0x11, maxw * 2), CUDA_SUCCESS);
    CUevent e0, e1;
    cr_assert_eq(api->cuEventCreate(&e0, 0), CUDA_SUCCESS);
    cr_assert_eq(api->cuEventCreate(&e1, 0), CUDA_SUCCESS);
    for (int s = 0; s < NS; s++) {
        const int M = shapes[s][0], N = shapes[s][1], K = shapes[s][2];
        stof_gemm_args a = plain_args(da, dw, dc, M, N, K);
        double best = 0.0;
        int best_i = -1;
        for (int i = 0; i < NC; i++) {
            const timed t = {k[i].fn, &cfgs[i], &e, NULL, 0, 0, NULL, NULL};
            const double ms =
                time_ms(ctx, &t, &a, M >= 1024 ? 20 : 50, e0, e1);
            const double tf = 2.0 * M * N * (double)K / (ms * 1e-3) / 1e12;
            const double model =
                stof__gemm_model_ms(&ctx->device, &cfgs[i], &e, M, N, K);
            cr_log_info("M=%d N=%d K=%d cfg %dx%dx%d w%dx%d s%d: %.4f ms "
                        "%.1f TFLOP/s (model %.4f ms)",
                        M, N, K, cfgs[i].block_m, cfgs[i].block_n,
                        cfgs[i].block_k, cfgs[i].warps_m, cfgs[i].warps_n,
                        cfgs[i].stages, ms, tf, model);
            if (tf > best) {
                best = tf;
                best_i = i;
            }
        }
        cr_assert_geq(best_i, 0);
        cr_log_info("BEST M=%d N=%d K=%d: %.1f TFLOP/s with %dx%dx%d w%dx%d "
                    "s%d",
                    M, N, K, best, cfgs[best_i].block_m, cfgs[best_i].block_n,
                    cfgs[best_i].block_k, cfgs[best_i].warps_m,
                    cfgs[best_i].warps_n, cfgs[best_i].stages);
    }
    api->cuEventDestroy(e0);
    api->cuEventDestroy(e1);
    api->cuMemFree(da);
    api->cuMemFree(dw);
    api->cuMemFree(dc);
    stof__ctx_pop(ctx);
    for (int i = 0; i < NC; i++)
        unload(ctx, &k[i]);
    stof_close(&ctx);
}

/* ------------------------------------------------------------------------ */
/* The Hopper template (gemm_wgmma.cu)                                       */
/* ------------------------------------------------------------------------ */

/* Open a context on a compute capability 9.0 GPU or skip. */
static stof_context *open_hopper_or_skip(void)
{
    stof_context *ctx = open_or_skip();
    if (ctx->device.cc_major != 9 || ctx->device.cc_minor != 0) {
        char name[300];
        snprintf(name, sizeof(name), "%.255s (cc %d.%d)", ctx->device.name,
                 ctx->device.cc_major, ctx->device.cc_minor);
        stof_close(&ctx);
        cr_skip_test("the wgmma GEMM needs compute capability 9.0; %s", name);
    }
    return ctx;
}

/* Both consumer warpgroups on each tile (warps 2x1), then ping-pong
 * (1x1: they take whole tiles in turn), then both in pairs of CTAs
 * (cluster 2: tile rows 2i and 2i + 1 share each W tile). */
static const stof_gemm_cfg wg_tiles[] = {
    {128, 256, 64, 2, 1, 3, 1, 1, 0}, {128, 256, 64, 2, 1, 2, 1, 1, 0},
    {128, 128, 64, 2, 1, 4, 1, 1, 0}, {128, 128, 64, 2, 1, 6, 1, 1, 0},
    {128, 64, 64, 2, 1, 6, 1, 1, 0},  {128, 128, 64, 2, 1, 2, 1, 1, 0},
    {128, 128, 64, 1, 1, 4, 1, 1, 0}, {128, 128, 64, 1, 1, 5, 1, 1, 0},
    {128, 64, 64, 1, 1, 6, 1, 1, 0},
    {128, 256, 64, 2, 1, 4, 1, 1, 0}, {128, 128, 64, 1, 1, 6, 1, 1, 0},
    {128, 256, 64, 2, 1, 3, 1, 2, 0}, {128, 128, 64, 2, 1, 5, 1, 2, 0},
    {128, 128, 64, 1, 1, 5, 1, 2, 0}, {128, 64, 64, 1, 1, 6, 1, 2, 0},
    {128, 256, 64, 2, 1, 4, 1, 2, 0},
};
#define WG_FIRST_PAIR 11
#define N_WG_TILES ((int)(sizeof(wg_tiles) / sizeof(*wg_tiles)))

/* Every activation with and without bias / residual, on M, N, K tails and
 * padded rows; one tile shape per case, in turn. */
static void wgmma_epilogues(stof_dtype dt)
{
    stof_context *ctx = open_hopper_or_skip();
    int i = 0;
    for (int act = 0; act <= STOF_ACT_SILU; act++)
        for (int v = 0; v < 2; v++, i++) {
            stof_gemm_epi e = {v == 0 || act == 0, act, v == 1 || act == 0,
                               0, 0, 0, 0, 0};
            check(ctx, dt, &wg_tiles[i % N_WG_TILES], &e, 300, 264, 200,
                  v ? 8 : 0, (uint64_t)(5000 + i));
        }
    stof_gemm_epi none = {0, 0, 0, 0, 0, 0, 0, 0};
    check(ctx, dt, &wg_tiles[2], &none, 1, 8, 8, 0, 5100);
    stof_close(&ctx);
}

Test(gpu, wgmma_epilogues_fp16, .timeout = 300)
{
    wgmma_epilogues(STOF_DTYPE_FP16);
}
Test(gpu, wgmma_epilogues_bf16, .timeout = 300)
{
    wgmma_epilogues(STOF_DTYPE_BF16);
}

/* Every tile shape of the candidate list: tails in every dimension, and a
 * layer shape with many tiles per CTA. */
Test(gpu, wgmma_tiles, .timeout = 600)
{
    stof_context *ctx = open_hopper_or_skip();
    stof_gemm_epi e = {1, STOF_ACT_GELU_ERF, 1, 0, 0, 0, 0, 0};
    for (int i = 0; i < N_WG_TILES; i++)
        check(ctx, i % 2 ? STOF_DTYPE_BF16 : STOF_DTYPE_FP16, &wg_tiles[i],
              &e, 1000, 776, 328, 0, (uint64_t)(5200 + i));
    stof_gemm_epi b = {1, STOF_ACT_NONE, 0, 0, 0, 0, 0, 0};
    check(ctx, STOF_DTYPE_BF16, &wg_tiles[1], &b, 2048, 3072, 768, 0, 5301);
    /* Pairs on an odd number of tile rows (the last pair's second tile
     * lies past M) with a residual, and a layer shape. */
    stof_gemm_epi r = {1, STOF_ACT_GELU_TANH, 1, 0, 0, 0, 0, 0};
    for (int i = WG_FIRST_PAIR; i < N_WG_TILES; i++)
        check(ctx, i % 2 ? STOF_DTYPE_BF16 : STOF_DTYPE_FP16, &wg_tiles[i],
              &r, 1100, 520, 200, 8, (uint64_t)(5310 + i));
    check(ctx, STOF_DTYPE_FP16, &wg_tiles[WG_FIRST_PAIR], &b, 4096, 3072,
          768, 0, 5330);
    stof_close(&ctx);
}

/* Split tails (stof__gemm_split_from): grids whose last round of
 * ping-pong tiles is at most half full, so its tiles run as 64-row halves
 * on separate CTAs; every epilogue kind with a half (bias and
 * activations, a residual loaded by TMA into a half's units, gated), the
 * second half of the last tile row partly or wholly past M, N and K
 * tails, padded rows; and BERT-base's QKV at 4096 tokens on one CTA an
 * SM. */
Test(gpu, wgmma_split_tails, .timeout = 300)
{
    stof_context *ctx = open_hopper_or_skip();
    static const stof_gemm_cfg pp128 = {128, 128, 64, 1, 1, 5, 1, 1, 0},
                               pp64 = {128, 64, 64, 1, 1, 6, 1, 1, 0};
    const stof_gemm_epi erf = {1, STOF_ACT_GELU_ERF, 0, 0, 0, 0, 0, 0},
                        res = {1, 0, 1, 0, 0, 0, 0, 0},
                        silu_res = {0, STOF_ACT_SILU, 1, 0, 0, 0, 0, 0},
                        gated = {1, STOF_ACT_SILU, 0, 0, 0, 1, 0, 0},
                        bias = {1, 0, 0, 0, 0, 0, 0, 0};
    /* 15 tiles on 7 CTAs: 14 whole, then 2 halves (the second past M at
     * 600 rows, wholly past it at 560). */
    check_ctas = 7;
    check(ctx, STOF_DTYPE_FP16, &pp128, &erf, 600, 264, 200, 0, 5601);
    check(ctx, STOF_DTYPE_BF16, &pp128, &res, 560, 296, 136, 8, 5602);
    /* 32 tiles of 128 x 64 on 10 CTAs: 2 split; gated (64 output columns
     * a tile) on 15 tiles. */
    check_ctas = 10;
    check(ctx, STOF_DTYPE_FP16, &pp64, &silu_res, 1000, 200, 328, 0, 5603);
    check_ctas = 7;
    check(ctx, STOF_DTYPE_BF16, &pp128, &gated, 520, 192, 256, 0, 5604);
    /* 4 tiles on 3 CTAs split the last; 3 on 2 too (each CTA's second
     * item a half). */
    check_ctas = 3;
    check(ctx, STOF_DTYPE_FP16, &pp128, &res, 512, 128, 64, 0, 5605);
    check_ctas = 2;
    check(ctx, STOF_DTYPE_FP16, &pp128, &erf, 384, 104, 72, 0, 5606);
    check_ctas = 0;
    check(ctx, STOF_DTYPE_FP16, &pp128, &bias, 4096, 2304, 768, 0, 5607);
    stof_close(&ctx);
}

/* STOF_GEMM_BENCH=1: ping-pong tiles with split tails and without
 * (stof__gemm_split_set), alternating, fp16, with bias and with erf-GELU
 * + bias: BERT-base's QKV at 2048, 4096 and 16384 tokens (on 132 SMs the
 * last round splits), the same at K 3072, and its FFN1 at 4096 tokens (a
 * last round too full to split: the control). One line a shape and
 * kernel: the median time of each over the rounds. */
static int cmp_double(const void *x, const void *y)
{
    const double a = *(const double *)x, b = *(const double *)y;
    return (a > b) - (a < b);
}

Test(gpu, bench_split, .timeout = 600)
{
    bench_or_skip();
    stof_context *ctx = open_hopper_or_skip();
    const stof_api *api = ctx->api;
    static const int shapes[][3] = {
        {4096, 2304, 768}, {2048, 2304, 768}, {16384, 2304, 768},
        {4096, 2304, 3072}, {4096, 3072, 768}};
    enum { NS = sizeof(shapes) / sizeof(*shapes), ROUNDS = 7 };
    const stof_dtype dt = STOF_DTYPE_FP16;
    const stof_gemm_epi epis[2] = {{1, 0, 0, 0, 0, 0, 0, 0},
                                   {1, STOF_ACT_GELU_ERF, 0, 0, 0, 0, 0, 0}};
    static const stof_gemm_cfg pp[2] = {{128, 128, 64, 1, 1, 6, 1, 1, 0},
                                        {128, 128, 64, 1, 1, 5, 1, 1, 0}};
    kernel k[2][2];
    stof_gemm_cfg cf[2][2];
    for (int x = 0; x < 2; x++)
        for (int i = 0; i < 2; i++) {
            cf[x][i] = fit_stages(ctx, &pp[i], &epis[x], 768, 768);
            k[x][i] = load(ctx, dt, &cf[x][i], &epis[x], 8);
        }
    cr_assert_eq(stof__ctx_push(ctx), STOF_OK);
    bench_ops ops = bench_ops_new(api, 16384u * 3072u, 3072u * 3072u,
                                  16384u * 3072u, 16384u, 256, bench_random());
    CUevent e0, e1;
    cr_assert_eq(api->cuEventCreate(&e0, 0), CUDA_SUCCESS);
    cr_assert_eq(api->cuEventCreate(&e1, 0), CUDA_SUCCESS);
    const int64_t sms = ctx->device.sm_count;
    for (int sh = 0; sh < NS; sh++) {
        const int M = shapes[sh][0], N = shapes[sh][1], K = shapes[sh][2];
        const int64_t tiles = (int64_t)((M + 127) / 128) * ((N + 127) / 128);
        const int splits = stof__gemm_split_from(tiles, sms) < tiles;
        stof_gemm_args a = plain_args(ops.a, ops.w, ops.c, M, N, K);
        a.bias = ops.vec;
        for (int x = 0; x < 2; x++)
            for (int i = 0; i < 2; i++) {
                double t[2][ROUNDS];
                const timed tm = {k[x][i].fn, &cf[x][i], &epis[x], NULL, 0,
                                  0,          NULL,      NULL};
                for (int r = 0; r < ROUNDS; r++)
                    for (int on = 0; on < 2; on++) {
                        stof__gemm_split_set((r + on) % 2);
                        t[(r + on) % 2][r] =
                            time_ms(ctx, &tm, &a, bench_reps(20), e0, e1);
                    }
                qsort(t[0], ROUNDS, sizeof(double), cmp_double);
                qsort(t[1], ROUNDS, sizeof(double), cmp_double);
                const double off = t[0][ROUNDS / 2], on = t[1][ROUNDS / 2];
                cr_log_info("split M=%d N=%d K=%d %s 128x128 s%d ping-pong "
                            "(%lld tiles on %lld SMs%s): %.4f ms whole, "
                            "%.4f ms split, %.3f",
                            M, N, K, x ? "erf-GELU+bias" : "bias",
                            cf[x][i].stages, (long long)tiles,
                            (long long)sms, splits ? "" : ", no split", off,
                            on, on / off);
            }
    }
    stof__gemm_split_set(1);
    api->cuEventDestroy(e0);
    api->cuEventDestroy(e1);
    bench_ops_free(api, &ops);
    stof__ctx_pop(ctx);
    for (int x = 0; x < 2; x++)
        for (int i = 0; i < 2; i++)
            unload(ctx, &k[x][i]);
    stof_close(&ctx);
}

/* STOF_GEMM_BENCH=1: the Hopper template against cuBLASLt (the best of its
 * heuristic's algorithms) on the layer GEMMs of BERT-base / large and a
 * Llama-style model at 4096-32768 tokens, fp16: plain, with erf-GELU
 * (which cuBLASLt cannot fuse) and with bias + residual (both fuse it: an
 * FFN2's or an output projection's epilogue). Logs one line per shape. */
Test(gpu, bench_hopper, .timeout = 600)
{
    bench_or_skip();
    stof_context *ctx = open_hopper_or_skip();
    const stof_api *api = ctx->api;
    static const int shapes[][3] = {
        {16384, 2304, 768},  {16384, 3072, 768},  {16384, 768, 3072},
        {8192, 4096, 1024},  {8192, 1024, 4096},  {32768, 768, 768},
        {4096, 11008, 4096}, {4096, 4096, 11008}, {16384, 768, 768}};
    enum { NS = sizeof(shapes) / sizeof(*shapes) };
    const stof_dtype dt = STOF_DTYPE_FP16;
    enum { NE = 3 };
    /* STOF_GEMM_BENCH_ACT=a: the second epilogue's activation (a
     * stof_activation; default erf-GELU), e.g. 3 (ReLU, no FP32
     * arithmetic) to separate an activation's cost from the bias's. */
    const char *act_env = getenv("STOF_GEMM_BENCH_ACT");
    const int act = act_env && act_env[0] >= '0' && act_env[0] <= '4'
                        ? act_env[0] - '0'
                        : STOF_ACT_GELU_ERF;
    static const char *const act_name[5] = {"bias", "tanh-GELU",
                                            "erf-GELU", "ReLU", "SiLU"};
    const stof_gemm_epi epis[NE] = {
        {0, 0, 0, 0, 0, 0, 0, 0}, {1, act, 0, 0, 0, 0, 0, 0}, {1, 0, 1, 0, 0, 0, 0, 0}};
    const char *const epi_name[NE] = {"plain", act_name[act], "bias+res"};
    char act_label[32]; /* the summary's name of the second epilogue */
    snprintf(act_label, sizeof(act_label), "%s%s", act_name[act],
             act ? "+bias" : "");
    kernel k[NE][N_WG_TILES] = {{{0}}};
    /* Each list entry with as many stages as fit the epilogue (a
     * residual's take one stage less at 128x256 s4 / ping-pong s6). */
    stof_gemm_cfg tiles[NE][N_WG_TILES];
    for (int x = 0; x < NE; x++)
        for (int i = 0; i < N_WG_TILES; i++) {
            tiles[x][i] = fit_stages(ctx, &wg_tiles[i], &epis[x], 768, 768);
            if (bench_listed("STOF_GEMM_BENCH_TILES", i))
                k[x][i] = load(ctx, dt, &tiles[x][i], &epis[x], 8);
        }
    cr_assert_eq(stof__ctx_push(ctx), STOF_OK);
    bench_ops ops =
        bench_ops_new(api, 32768u * 4096u, 11008u * 4096u, 32768u * 4096u,
                      16384u, STOF_BLASLT_WORKSPACE, bench_random());
    const CUdeviceptr da = ops.a, dw = ops.w, dc = ops.c, dres = ops.res,
                      dbias = ops.vec, ws = ops.ws;
    if (bench_random())
        cr_log_info("random inputs (STOF_GEMM_BENCH_RANDOM=0: constant)");
    CUevent e0, e1;
    cr_assert_eq(api->cuEventCreate(&e0, 0), CUDA_SUCCESS);
    cr_assert_eq(api->cuEventCreate(&e1, 0), CUDA_SUCCESS);
    const stof_gemm_epi lt_bias = {1, 0, 0, 0, 0, 0, 0, 0};
    kernel gelu_k = load_gate(ctx, dt, STOF_ACT_GELU_ERF, 0);
    for (int s = 0; s < NS; s++) {
        if (!bench_shape_on(s))
            continue;
        const int M = shapes[s][0], N = shapes[s][1], K = shapes[s][2];
        stof_gemm_args a = plain_args(da, dw, dc, M, N, K);
        a.bias = dbias;
        a.residual = dres;
        const double flop = 2.0 * M * N * (double)K;
        double best[NE], coop[NE], alone[NE];
        int best_i[NE];
        for (int x = 0; x < NE; x++) {
            best[x] = coop[x] = alone[x] = INFINITY;
            best_i[x] = -1;
        }
        for (int x = 0; x < NE; x++)
            for (int i = 0; i < N_WG_TILES; i++) {
                if (!k[x][i].fn)
                    continue;
                const timed t = {k[x][i].fn, &tiles[x][i], &epis[x], NULL, 0,
                                 0,          NULL,         NULL};
                const double ms = time_ms(ctx, &t, &a, bench_reps(20), e0, e1);
                if (bench_verbose())
                    cr_log_info("  M=%d N=%d K=%d %s 128x%d s%d%s%s: %.4f ms "
                                "(%.0f TF/s; %.2f mJ, %.0f MHz)",
                                M, N, K, epi_name[x],
                                tiles[x][i].block_n, tiles[x][i].stages,
                                tiles[x][i].warps_m == 1 ? " ping-pong" : "",
                                tiles[x][i].cluster > 1 ? " pairs" : "", ms,
                                flop / (ms * 1e9), energy_mj, energy_mhz);
                if (tiles[x][i].warps_m == 2 && ms < coop[x])
                    coop[x] = ms;
                if (tiles[x][i].cluster < 2 && ms < alone[x])
                    alone[x] = ms;
                if (ms < best[x]) {
                    best[x] = ms;
                    best_i[x] = i;
                }
            }
        /* cuBLASLt, plain, and with its bias epilogue followed by the
         * separate erf-GELU kernel (in place): the best of its heuristic's
         * algorithms each. */
        const gate_step gelu = {gelu_k.fn, dc, dc, M, N, 0, N, N};
        const double lt_ms = lt_best(ctx, &a, &epis[0], NULL, ws, e0, e1);
        if (bench_verbose())
            cr_log_info("  M=%d N=%d K=%d plain cuBLASLt: %.4f ms (%.2f mJ, "
                        "%.0f MHz)",
                        M, N, K, lt_ms, energy_mj, energy_mhz);
        const double lt_gelu_ms = lt_best(ctx, &a, &lt_bias, &gelu, ws, e0,
                                          e1);
        const double lt_res_ms = lt_best(ctx, &a, &epis[2], NULL, ws, e0, e1);
        cr_assert(best_i[0] >= 0 && best_i[1] >= 0 && best_i[2] >= 0);
        const stof_gemm_cfg *b2 = &tiles[2][best_i[2]];
        cr_log_info("HOPPER-RES M=%d N=%d K=%d: bias+residual wgmma %.4f ms "
                    "(128x%d s%d%s%s), cuBLASLt %.4f ms: time %.3f",
                    M, N, K, best[2], b2->block_n, b2->stages,
                    b2->warps_m == 1 ? " ping-pong" : "",
                    b2->cluster > 1 ? " pairs" : "", lt_res_ms,
                    best[2] / lt_res_ms);
        const stof_gemm_cfg *b0 = &tiles[0][best_i[0]],
                            *b1 = &tiles[1][best_i[1]];
        cr_log_info("HOPPER M=%d N=%d K=%d: wgmma %.4f ms (%.0f TF/s, "
                    "128x%d s%d%s%s; shared tiles only %.4f), %s "
                    "%.4f ms (128x%d s%d%s%s; shared tiles only %.4f); "
                    "cuBLASLt %.4f ms (%.0f TF/s); wgmma/cuBLASLt time %.3f "
                    "(without pairs %.3f); "
                    "cuBLASLt+bias then erf-GELU kernel %.4f ms, fused "
                    "speed-up %.2fx%s",
                    M, N, K, best[0], flop / (best[0] * 1e9), b0->block_n,
                    b0->stages, b0->warps_m == 1 ? " ping-pong" : "",
                    b0->cluster > 1 ? " pairs" : "", coop[0], act_label,
                    best[1],
                    b1->block_n, b1->stages,
                    b1->warps_m == 1 ? " ping-pong" : "",
                    b1->cluster > 1 ? " pairs" : "", coop[1], lt_ms,
                    flop / (lt_ms * 1e9), best[0] / lt_ms, alone[0] / lt_ms,
                    lt_gelu_ms, lt_gelu_ms / best[1],
                    act == STOF_ACT_GELU_ERF ? "" : " (against another "
                                                    "activation)");
    }
    api->cuEventDestroy(e0);
    api->cuEventDestroy(e1);
    bench_ops_free(api, &ops);
    stof__ctx_pop(ctx);
    for (int x = 0; x < NE; x++)
        for (int i = 0; i < N_WG_TILES; i++)
            unload(ctx, &k[x][i]);
    unload(ctx, &gelu_k);
    stof_close(&ctx);
}

/* Where a one-round Hopper GEMM's time goes: the template built with
 * GW_TRACE stamps each CTA's phases (gemm_wgmma.cu); the mean and the
 * slowest CTA of each phase, in SM cycles, and the CTAs' start skew and
 * span in ns (global timer). A diagnostic: STOF_GEMM_BENCH=1. */
typedef CUresult (*get_global_fn)(CUdeviceptr *, size_t *, CUmodule,
                                  const char *);

static void trace_gemm(stof_context *ctx, const stof_gemm_cfg *c,
                       const stof_gemm_epi *e, int M, int N, int K,
                       get_global_fn get_global, CUdeviceptr da,
                       CUdeviceptr dw, CUdeviceptr dc, CUdeviceptr dres,
                       CUdeviceptr dvec, CUdeviceptr ws, CUevent e0,
                       CUevent e1)
{
    const stof_api *api = ctx->api;
    char d[14][32];
    snprintf(d[0], 32, "DTYPE=0");
    snprintf(d[1], 32, "BLOCK_N=%d", c->block_n);
    snprintf(d[2], 32, "STAGES=%d", c->stages);
    snprintf(d[3], 32, "BIAS=%d", e->bias);
    snprintf(d[4], 32, "ACT=%d", e->act);
    snprintf(d[5], 32, "RESIDUAL=%d", e->residual);
    snprintf(d[6], 32, "GATED=0");
    snprintf(d[7], 32, "PINGPONG=%d", c->warps_m == 1);
    snprintf(d[8], 32, "CLUSTER=1");
    snprintf(d[9], 32, "NORM=%d", e->norm);
    snprintf(d[10], 32, "WRITE_PRE=%d", e->write_pre);
    snprintf(d[11], 32, "N_TOTAL=%d", e->norm ? N : 0);
    snprintf(d[12], 32, "GW_TRACE=1");
    snprintf(d[13], 32, "CSLOT=%d", c->cslot);
    const char *defs[14];
    for (int i = 0; i < 14; i++)
        defs[i] = d[i];
    void *bin = NULL;
    size_t size = 0;
    cr_assert_eq(stof__jit_compile(ctx, "gemm_wgmma.cu", defs, 14, "sm_90a",
                                   &bin, &size),
                 STOF_OK, "%s", stof_errmsg(ctx));
    kernel k = {0};
    cr_assert_eq(stof__gemm_load_cubin(ctx, c, e, N, bin, &k.mod, &k.fn),
                 STOF_OK, "%s", stof_errmsg(ctx));
    free(bin);
    cr_assert_eq(stof__ctx_push(ctx), STOF_OK);
    enum { MAXCTA = 1024, NK = 16 };
    CUdeviceptr trace, gptr;
    size_t gsize = 0;
    cr_assert_eq(api->cuMemAlloc(&trace, MAXCTA * NK * 8), CUDA_SUCCESS);
    cr_assert_eq(get_global(&gptr, &gsize, k.mod, "stof_gw_trace"),
                 CUDA_SUCCESS);
    cr_assert_eq(gsize, 8u);
    stof_gemm_args a = plain_args(da, dw, dc, M, N, K);
    a.bias = a.gamma = a.beta = dvec;
    a.residual = dres;
    a.eps = 1e-5f;
    a.ws = ws;
    const timed t = {k.fn, c, e, NULL, 0, 0, NULL, NULL};
    const double ms = time_ms(ctx, &t, &a, bench_reps(50), e0, e1);
    cr_assert_eq(api->cuMemsetD8(trace, 0, MAXCTA * NK * 8), CUDA_SUCCESS);
    cr_assert_eq(api->cuMemcpyHtoD(gptr, &trace, 8), CUDA_SUCCESS);
    for (int rep = 0; rep < 3; rep++) /* the last launch's stamps stay */
        cr_assert_eq(stof__gemm_launch(k.fn, c, e, &a, ctx->device.sm_count,
                                       NULL, api),
                     STOF_OK);
    cr_assert_eq(api->cuCtxSynchronize(), CUDA_SUCCESS);
    static unsigned long long h[MAXCTA * NK];
    cr_assert_eq(api->cuMemcpyDtoH(h, trace, sizeof(h)), CUDA_SUCCESS);
    const CUdeviceptr zero = 0;
    cr_assert_eq(api->cuMemcpyHtoD(gptr, &zero, 8), CUDA_SUCCESS);
    api->cuMemFree(trace);
    stof__ctx_pop(ctx);
    unload(ctx, &k);
    /* phases: [from, to] stamps */
    static const int ph[][2] = {{0, 2},  {2, 3},   {3, 4},  {4, 5},
                                {5, 11}, {11, 12}, {12, 13}, {13, 8},
                                {5, 8},  {8, 9}};
    static const char *const name[] = {
        "setup",          "to first load",   "first load's latency",
        "K loop",         "bias + residual", "row statistics, stored",
        "the row's, received", "normalise + stores issued",
        "epilogue (all)", "stores drain"};
    enum { NP = sizeof(ph) / sizeof(*ph) };
    double sum[NP] = {0}, mx[NP] = {0};
    int cnt[NP] = {0}; /* CTAs that went through the phase */
    unsigned long long g0 = ~0ull, g0max = 0, g1 = 0;
    double cyc_per_ns = 0;
    int n = 0;
    for (int b = 0; b < MAXCTA; b++) {
        const unsigned long long *r = h + b * NK;
        if (!r[0] || !r[9])
            continue;
        n++;
        for (int p = 0; p < NP; p++) {
            if (!r[ph[p][0]] || !r[ph[p][1]])
                continue;
            const double v = (double)(r[ph[p][1]] - r[ph[p][0]]);
            sum[p] += v;
            cnt[p]++;
            if (v > mx[p])
                mx[p] = v;
        }
        g0 = r[1] < g0 ? r[1] : g0;
        g0max = r[1] > g0max ? r[1] : g0max;
        g1 = r[10] > g1 ? r[10] : g1;
        if (r[10] > r[1])
            cyc_per_ns += (double)(r[9] - r[0]) / (double)(r[10] - r[1]);
    }
    cr_assert_gt(n, 0, "no stamps");
    cr_log_info("TRACE M=%d N=%d K=%d %s 128x%d s%d%s%s: %d CTAs, %.4f ms a "
                "launch back to back; CTAs start over %.2f us, span %.2f us; "
                "%.2f GHz",
                M, N, K,
                e->norm       ? "bias+res+LN"
                : e->act      ? "bias+act"
                : e->residual ? "residual"
                              : "plain",
                c->block_n, c->stages, c->warps_m == 1 ? " ping-pong" : "",
                c->cslot ? " c-in-slots" : "", n,
                ms, (double)(g0max - g0) * 1e-3, (double)(g1 - g0) * 1e-3,
                cyc_per_ns / n);
    for (int p = 0; p < NP; p++)
        if (cnt[p] > 0)
            cr_log_info("TRACE   %-26s mean %7.0f cycles (%.2f us), slowest "
                        "CTA %7.0f",
                        name[p], sum[p] / cnt[p],
                        sum[p] / cnt[p] / (cyc_per_ns / n) * 1e-3, mx[p]);
}

Test(gpu, trace_hopper, .timeout = 300)
{
    bench_or_skip();
    stof_context *ctx = open_hopper_or_skip();
    const stof_api *api = ctx->api;
    void *lib = dlopen("libcuda.so.1", RTLD_NOW);
    cr_assert_not_null(lib);
    get_global_fn get_global =
        (get_global_fn)(uintptr_t)dlsym(lib, "cuModuleGetGlobal_v2");
    cr_assert_not_null(get_global);
    cr_assert_eq(stof__ctx_push(ctx), STOF_OK);
    /* (the largest shapes' operands: A 16384 x 4096, W 2048 x 5632, C
     * 16384 x 1024; the norm's workspace: 16384 tokens' row counters and
     * statistics) */
    bench_ops ops = bench_ops_new(api, 16384u * 4096u, 2048u * 5632u,
                                  16384u * 1024u, 4096u, 1u << 20, 1);
    const CUdeviceptr da = ops.a, dw = ops.w, dc = ops.c, dres = ops.res,
                      dvec = ops.vec, ws = ops.ws;
    CUevent e0, e1;
    cr_assert_eq(api->cuEventCreate(&e0, 0), CUDA_SUCCESS);
    cr_assert_eq(api->cuEventCreate(&e1, 0), CUDA_SUCCESS);
    stof__ctx_pop(ctx);
    const stof_gemm_epi ln = {1, 0, 1, 1, 0, 0, 0, 0}, plain = {0, 0, 0, 0, 0, 0, 0, 0},
                        erf = {1, STOF_ACT_GELU_ERF, 0, 0, 0, 0, 0, 0};
    const stof_gemm_cfg w192 = {128, 192, 64, 2, 1, 4, 1, 1, 0},
                        w64 = {128, 64, 64, 2, 1, 6, 1, 1, 0},
                        w128 = {128, 128, 64, 2, 1, 4, 1, 1, 0};
    /* BERT-large's FFN2 + LayerNorm (N 1024, K 4096; and its output
     * projection's, K 1024): the wide tile with three stages (a
     * residual's or a norm's C ring leaves no room for a fourth), 128-wide
     * ping-pong tiles, and plain with four and three stages. */
    const stof_gemm_cfg w256s3 = {128, 256, 64, 2, 1, 3, 1, 1, 0},
                        w256s4 = {128, 256, 64, 2, 1, 4, 1, 1, 0},
                        p128s5 = {128, 128, 64, 1, 1, 5, 1, 1, 0};
    /* The same with the C units in the pipeline's slots (four stages for
     * 128 x 256, five for 128 x 192), and a residual alone (a Llama down
     * projection's epilogue, 4096 tokens). */
    const stof_gemm_cfg c256s4 = {128, 256, 64, 2, 1, 4, 1, 1, 1},
                        c192s5 = {128, 192, 64, 2, 1, 5, 1, 1, 1};
    const stof_gemm_epi res = {0, 0, 1, 0, 0, 0, 0, 0};
    const struct {
        const stof_gemm_cfg *c;
        const stof_gemm_epi *e;
        int m, n, k;
    } shapes[] = {
        {&w192, &ln, 4096, 768, 768},       {&w192, &ln, 2048, 768, 768},
        {&w192, &ln, 4096, 768, 3072},      {&w128, &plain, 4096, 768, 768},
        {&w64, &plain, 128, 2304, 768},     {&w64, &erf, 128, 3072, 768},
        {&w256s3, &ln, 4096, 1024, 4096},   {&w256s3, &ln, 4096, 1024, 1024},
        {&p128s5, &ln, 4096, 1024, 4096},   {&w256s4, &plain, 4096, 1024, 4096},
        {&w256s3, &plain, 4096, 1024, 4096}, {&c256s4, &ln, 4096, 1024, 4096},
        {&c256s4, &ln, 4096, 1024, 1024},   {&c192s5, &ln, 4096, 768, 768},
        {&c192s5, &ln, 4096, 768, 3072},    {&w256s3, &res, 4096, 2048, 5632},
        {&c256s4, &res, 4096, 2048, 5632},  {&w256s4, &plain, 4096, 2048, 5632},
        {&c256s4, &ln, 16384, 1024, 4096},  {&w256s3, &ln, 16384, 1024, 4096},
        {&p128s5, &ln, 16384, 1024, 4096}};
    for (size_t i = 0; i < sizeof(shapes) / sizeof(*shapes); i++)
        trace_gemm(ctx, shapes[i].c, shapes[i].e, shapes[i].m, shapes[i].n,
                   shapes[i].k, get_global, da, dw, dc, dres, dvec, ws, e0,
                   e1);
    cr_assert_eq(stof__ctx_push(ctx), STOF_OK);
    api->cuEventDestroy(e0);
    api->cuEventDestroy(e1);
    bench_ops_free(api, &ops);
    stof__ctx_pop(ctx);
    stof_close(&ctx);
    dlclose(lib);
}

/* The gated epilogue (SwiGLU with bias and residual, GeGLU) on M, N, K
 * tails (the last tile's gate rows run into the up rows: their columns
 * must not be stored) and padded rows, with few CTAs and one per SM, on
 * both kinds of tile. */
static void wgmma_gated(stof_dtype dt)
{
    stof_context *ctx = open_hopper_or_skip();
    const stof_gemm_epi swiglu = {0, STOF_ACT_SILU, 0, 0, 0, 1, 0, 0},
                        swiglu_br = {1, STOF_ACT_SILU, 1, 0, 0, 1, 0, 0},
                        geglu = {1, STOF_ACT_GELU_ERF, 0, 0, 0, 1, 0, 0},
                        geglu_t = {0, STOF_ACT_GELU_TANH, 1, 0, 0, 1, 0, 0};
    const stof_gemm_epi *es[] = {&swiglu, &swiglu_br, &geglu, &geglu_t};
    for (int i = 0; i < 4; i++) {
        const stof_gemm_cfg *c = &wg_tiles[i % 4]; /* 256 s3/s2, 128 s4/s6 */
        check(ctx, dt, c, es[i], 300, 264, 200, i % 2 ? 8 : 0,
              (uint64_t)(5400 + i));
        check(ctx, dt, c, es[i], 1000, 1096, 328, 0, (uint64_t)(5410 + i));
    }
    check(ctx, dt, &wg_tiles[5], &swiglu, 1, 8, 8, 0, 5420);
    for (int i = 0; i < 2; i++) /* ping-pong, few CTAs and one per SM */
        check(ctx, dt, &wg_tiles[6 + i], &swiglu_br, 1000, 1096, 328, 0,
              (uint64_t)(5430 + i));
    /* Pairs (rank 0 loads the gate half, rank 1 the up half): both kinds
     * of tile, odd and even tile rows. */
    for (int i = 0; i < 4; i++)
        check(ctx, dt, &wg_tiles[WG_FIRST_PAIR + (i % 2) * 2], es[i],
              i < 2 ? 300 : 1000, 1096, 328, i % 2 ? 8 : 0,
              (uint64_t)(5440 + i));
    stof_close(&ctx);
}

Test(gpu, wgmma_gated_fp16, .timeout = 300)
{
    wgmma_gated(STOF_DTYPE_FP16);
}
Test(gpu, wgmma_gated_bf16, .timeout = 300)
{
    wgmma_gated(STOF_DTYPE_BF16);
}

/* Row norms (a row's tiles exchange their statistics through the
 * workspace): LayerNorm and RMSNorm after bias + residual (post-norm),
 * with pre (pre-norm), and without a residual; on M, K tails, padded
 * rows, N a multiple of the tile and not (the last tile's columns past N
 * must not count), rows of 3 to 16 tiles, both warpgroups on a tile and
 * ping-pong, the grid of one row's tiles walking every row (odd salts)
 * and one CTA per SM, and layer shapes; each launched twice on its
 * workspace. */
static void wgmma_norms(stof_dtype dt)
{
    stof_context *ctx = open_hopper_or_skip();
    static const stof_gemm_cfg cfgs[] = {
        {128, 256, 64, 2, 1, 3, 1, 1, 0}, {128, 128, 64, 1, 1, 5, 1, 1, 0},
        {128, 128, 64, 2, 1, 4, 1, 1, 0}, {128, 256, 64, 2, 1, 2, 1, 1, 0},
        {128, 128, 64, 1, 1, 4, 1, 1, 0}};
    int i = 0;
    for (int norm = 1; norm <= 2; norm++)
        for (int v = 0; v < 3; v++, i++) {
            const int with_pre = v == 1 || (v == 2 && norm == 2);
            const stof_gemm_epi e = {v < 2, 0, v < 2, norm, with_pre, 0, 0, 0};
            check(ctx, dt, &cfgs[i % 5], &e, 300, i % 2 ? 1000 : 768, 200,
                  v == 1 ? 8 : 0, (uint64_t)(5500 + i));
        }
    const stof_gemm_epi post = {1, 0, 1, 1, 0, 0, 0, 0}, pre = {1, 0, 1, 2, 1, 0, 0, 0};
    check(ctx, dt, &cfgs[0], &post, 4096, 768, 3072, 0, 5510);
    check(ctx, dt, &cfgs[1], &post, 4096, 768, 768, 0, 5514);
    check(ctx, dt, &cfgs[0], &pre, 2048, 1024, 1024, 0, 5511);
    check(ctx, dt, &cfgs[4], &post, 1, 1024, 64, 0, 5512);
    check(ctx, dt, &cfgs[3], &pre, 520, 2048, 128, 8, 5513);
    check(ctx, dt, &cfgs[0], &pre, 1000, 4096, 256, 0, 5516);
    check(ctx, dt, &cfgs[1], &pre, 700, 2048, 128, 0, 5517);
    /* 192-wide tiles (a 768-wide row is 4 of them): the norms, a row's
     * last tile mostly past N, and an epilogue without a norm. */
    static const stof_gemm_cfg w192[] = {{128, 192, 64, 2, 1, 4, 1, 1, 0},
                                         {128, 192, 64, 2, 1, 3, 1, 1, 0}};
    check(ctx, dt, &w192[0], &post, 300, 768, 200, 0, 5520);
    check(ctx, dt, &w192[1], &pre, 4096, 768, 3072, 0, 5521);
    check(ctx, dt, &w192[0], &post, 1000, 1000, 328, 8, 5522);
    const stof_gemm_epi erf = {1, STOF_ACT_GELU_ERF, 1, 0, 0, 0, 0, 0},
                        br = {1, 0, 1, 0, 0, 0, 0, 0}, plain = {0, 0, 0, 0, 0, 0, 0, 0};
    check(ctx, dt, &w192[1], &erf, 1000, 776, 328, 0, 5523);
    check(ctx, dt, &w192[0], &br, 300, 2304, 768, 8, 5524);
    check(ctx, dt, &w192[0], &plain, 4096, 3072, 1024, 0, 5525);
    /* 64-wide tiles (short batches): 12 and 16 tiles a row, both kinds,
     * a row's last tile part past N. */
    static const stof_gemm_cfg w64[] = {{128, 64, 64, 2, 1, 6, 1, 1, 0},
                                        {128, 64, 64, 1, 1, 6, 1, 1, 0}};
    check(ctx, dt, &w64[0], &post, 128, 768, 768, 0, 5530);
    check(ctx, dt, &w64[1], &post, 128, 768, 3072, 0, 5531);
    check(ctx, dt, &w64[0], &pre, 300, 1024, 200, 8, 5532);
    check(ctx, dt, &w64[1], &pre, 130, 1000, 328, 0, 5533);
    stof_close(&ctx);
}

/* C units in the pipeline's slots (cslot): every tile width, stages from
 * two (the tile's C slots are the two its last K-steps used) to six, a
 * residual with each activation, with and without bias, and row norms
 * with and without a residual or pre; M, N, K tails and padded rows, on
 * three CTAs (each walks many tiles, so the C slots move round the ring
 * and its phases) and on one CTA an SM; the layer shapes the option is
 * for (BERT-large's FFN2 and output projection with LayerNorm, a Llama
 * down projection with its residual). The stages are exact: check()
 * refuses a configuration that does not fit as given. */
static void wgmma_c_in_slots(stof_dtype dt)
{
    stof_context *ctx = open_hopper_or_skip();
    static const stof_gemm_cfg cs[] = {
        {128, 256, 64, 2, 1, 4, 1, 1, 1}, {128, 128, 64, 2, 1, 6, 1, 1, 1},
        {128, 192, 64, 2, 1, 5, 1, 1, 1}, {128, 64, 64, 2, 1, 6, 1, 1, 1},
        {128, 256, 64, 2, 1, 2, 1, 1, 1}, {128, 128, 64, 2, 1, 3, 1, 1, 1}};
    enum { NCS = sizeof(cs) / sizeof(*cs) };
    int i = 0;
    for (int act = 0; act <= STOF_ACT_SILU; act++)
        for (int b = 0; b < 2; b++, i++) {
            const stof_gemm_epi e = {b, act, 1, 0, 0, 0, 0, 0};
            check(ctx, dt, &cs[i % NCS], &e, 300, 264, 200, i % 3 ? 0 : 8,
                  (uint64_t)(5700 + i));
            check(ctx, dt, &cs[(i + 1) % NCS], &e, 1000, 776, 328, 0,
                  (uint64_t)(5720 + 2 * i + 1));
        }
    const stof_gemm_epi res = {0, 0, 1, 0, 0, 0, 0, 0};
    check(ctx, dt, &cs[0], &res, 512, 2048, 5632, 0, 5740); /* Llama */
    check(ctx, dt, &cs[1], &res, 1, 8, 8, 0, 5741);
    int j = 0;
    for (int norm = 1; norm <= 2; norm++)
        for (int v = 0; v < 4; v++, j++) {
            /* bias + residual; + pre; neither; pre without a residual */
            const stof_gemm_epi e = {v < 2, 0, v < 2, norm, v & 1, 0, 0, 0};
            check(ctx, dt, &cs[j % NCS], &e, 300, j % 2 ? 1000 : 768, 200,
                  v == 1 ? 8 : 0, (uint64_t)(5751 + 2 * j));
            const stof_gemm_cfg *w = &cs[(j + 3) % NCS];
            if (w->block_n == 64) /* (a row of 2048 is 16 tiles at most) */
                w = &cs[4];
            check(ctx, dt, w, &e, 520, 2048, 136, 0,
                  (uint64_t)(5770 + 2 * j));
        }
    const stof_gemm_epi post = {1, 0, 1, 1, 0, 0, 0, 0}, pre = {1, 0, 1, 2, 1, 0, 0, 0};
    check(ctx, dt, &cs[0], &post, 1024, 1024, 4096, 0, 5790);
    check(ctx, dt, &cs[0], &post, 4096, 1024, 1024, 0, 5791);
    check(ctx, dt, &cs[2], &post, 2048, 768, 3072, 0, 5792);
    check(ctx, dt, &cs[1], &pre, 2048, 1024, 1024, 0, 5793);
    check(ctx, dt, &cs[3], &pre, 128, 768, 768, 0, 5794);
    check(ctx, dt, &cs[4], &post, 1, 1024, 64, 0, 5795);
    stof_close(&ctx);
}

Test(gpu, wgmma_c_in_slots_fp16, .timeout = 600)
{
    wgmma_c_in_slots(STOF_DTYPE_FP16);
}
Test(gpu, wgmma_c_in_slots_bf16, .timeout = 600)
{
    wgmma_c_in_slots(STOF_DTYPE_BF16);
}

/* RoPE fused in the Hopper template's epilogue (gemm.h's rope) against
 * stof__ref_gemm_rope: the tile kinds (both consumer warpgroups on a tile,
 * ping-pong, pairs of CTAs, 64-, 192- and 256-wide), heads of 32 to 128
 * with the whole head rotated and part of it, with and without a bias
 * (added before the rotation), V's columns (from rope_cols on, in a tile
 * of their own or sharing one with K's) the plain product, M tails
 * (1000, 1100 rows: the last tile row's positions continue past M), the
 * sequence not dividing M (positions m % seq) or longer than it, N tails
 * and padded rows, ping-pong's split tails (64-row halves), one row; fp16
 * on one CTA an SM, bf16 on three CTAs (each walks many tiles). */
typedef struct rope_case {
    stof_gemm_cfg c;
    int rope, hd, bias;
    int M, N, K, pad, seq, cols, ctas;
} rope_case;

static const rope_case rope_cases[] = {
    /* 128 x 256, two consumer warpgroups: Q 8, K 1, V 1 heads of 128
     * (V from the middle of the last tile) */
    {{128, 256, 64, 2, 1, 4, 1, 1, 0}, 128, 128, 1,
     1000, 1280, 328, 0, 333, 1152, 0},
    /* partial (64 of 128), Q 5 K 1 V 1: N ends in the middle of a tile */
    {{128, 256, 64, 2, 1, 3, 1, 1, 0}, 64, 128, 0,
     1000, 896, 200, 8, 1000, 768, 0},
    /* ping-pong, 32 of 64: Q 6 K 2 V 2 */
    {{128, 128, 64, 1, 1, 5, 1, 1, 0}, 32, 64, 1,
     1000, 640, 328, 0, 300, 512, 0},
    /* ping-pong, every head rotated, N 5.5 tiles, seq > M */
    {{128, 128, 64, 1, 1, 5, 1, 1, 0}, 64, 64, 0,
     1000, 704, 136, 0, 4096, 704, 0},
    /* pairs of CTAs on 9 tile rows (the last pair's second past M) */
    {{128, 256, 64, 2, 1, 3, 1, 2, 0}, 64, 64, 1,
     1100, 1024, 200, 0, 250, 896, 0},
    /* ping-pong pairs, heads of 32 (4 a tile), 16 of them rotated */
    {{128, 128, 64, 1, 1, 5, 1, 2, 0}, 16, 32, 0,
     1000, 512, 200, 8, 77, 448, 0},
    /* 192 wide: heads of 96 (Q 4 K 2 V 2) */
    {{128, 192, 64, 2, 1, 4, 1, 1, 0}, 96, 96, 1,
     1000, 768, 328, 0, 333, 576, 0},
    /* 192 wide, heads of 64 (3 a tile), 32 rotated, V mid-tile */
    {{128, 192, 64, 2, 1, 4, 1, 1, 0}, 32, 64, 0,
     520, 768, 136, 8, 200, 640, 0},
    /* 64 wide: a head a tile */
    {{128, 64, 64, 2, 1, 6, 1, 1, 0}, 64, 64, 1,
     1000, 384, 200, 0, 333, 256, 0},
    /* ping-pong split tails: 15 tiles on 7 CTAs, the last two as 64-row
     * halves (the second past M) */
    {{128, 128, 64, 1, 1, 5, 1, 1, 0}, 64, 64, 1,
     600, 384, 200, 0, 100, 256, 7},
    /* one row */
    {{128, 256, 64, 2, 1, 4, 1, 1, 0}, 128, 128, 1,
     1, 384, 64, 0, 1, 256, 0},
};
#define N_ROPE_CASES ((int)(sizeof(rope_cases) / sizeof(*rope_cases)))

static void wgmma_rope(stof_dtype dt)
{
    stof_context *ctx = open_hopper_or_skip();
    for (int i = 0; i < N_ROPE_CASES; i++) {
        const rope_case *r = &rope_cases[i];
        const stof_gemm_epi e = {.bias = r->bias, .rope = r->rope,
                                 .rope_hd = r->hd};
        check_rope = (rope_setup){.seq = r->seq,
                                  .cols = r->cols,
                                  .theta = i % 2 ? 500000.0f : 10000.0f};
        check_ctas = r->ctas;
        check(ctx, dt, &r->c, &e, r->M, r->N, r->K, r->pad,
              (uint64_t)(5800 + 2 * i + (dt == STOF_DTYPE_BF16)));
    }
    check_rope = (rope_setup){0};
    check_ctas = 0;
    stof_close(&ctx);
}

Test(gpu, wgmma_rope_fp16, .timeout = 300)
{
    wgmma_rope(STOF_DTYPE_FP16);
}
Test(gpu, wgmma_rope_bf16, .timeout = 300)
{
    wgmma_rope(STOF_DTYPE_BF16);
}

/* A fused rope's launch arguments are checked: a table (16-byte aligned),
 * a sequence, rotated columns of whole heads within N; mma.sync has no
 * rope epilogue. Nothing runs. */
Test(gpu, wgmma_rope_arguments, .timeout = 120)
{
    stof_context *ctx = open_hopper_or_skip();
    const stof_api *api = ctx->api;
    const stof_gemm_cfg c = {128, 128, 64, 2, 1, 4, 1, 1, 0},
                        mma = {128, 128, 32, 2, 4, 3, 0, 1, 0};
    const stof_gemm_epi e = {.rope = 64, .rope_hd = 64};
    kernel k = load(ctx, STOF_DTYPE_FP16, &c, &e, 256);
    cr_assert_eq(stof__ctx_push(ctx), STOF_OK);
    CUdeviceptr buf = upload(api, NULL, 1 << 20);
    stof_gemm_args a;
    memset(&a, 0, sizeof(a));
    a.a = a.w = a.c = buf;
    a.M = 128;
    a.N = 256;
    a.K = 64;
    a.lda = a.ldw = 64;
    a.ldc = 256;
    a.rope_tab = buf;
    a.rope_seq = 128;
    a.rope_cols = 128;
    stof_gemm_args b = a;
    b.rope_tab = 0;
    cr_expect_eq(stof__gemm_launch(k.fn, &c, &e, &b, 1, NULL, api),
                 STOF_ERR_INVALID_ARGUMENT, "no table");
    b = a;
    b.rope_tab = buf + 8;
    cr_expect_eq(stof__gemm_launch(k.fn, &c, &e, &b, 1, NULL, api),
                 STOF_ERR_INVALID_ARGUMENT, "a misaligned table");
    b = a;
    b.rope_seq = 0;
    cr_expect_eq(stof__gemm_launch(k.fn, &c, &e, &b, 1, NULL, api),
                 STOF_ERR_INVALID_ARGUMENT, "no sequence");
    b = a;
    b.rope_cols = 96;
    cr_expect_eq(stof__gemm_launch(k.fn, &c, &e, &b, 1, NULL, api),
                 STOF_ERR_INVALID_ARGUMENT, "part of a head");
    b = a;
    b.rope_cols = 320;
    cr_expect_eq(stof__gemm_launch(k.fn, &c, &e, &b, 1, NULL, api),
                 STOF_ERR_INVALID_ARGUMENT, "columns past N");
    cr_expect_eq(stof__gemm_launch(k.fn, &mma, &e, &a, 1, NULL, api),
                 STOF_ERR_INVALID_ARGUMENT, "rope on mma.sync");
    api->cuMemFree(buf);
    stof__ctx_pop(ctx);
    unload(ctx, &k);
    stof_close(&ctx);
}

/* The split path (a GEMM that cannot fuse RoPE: the plain product, then
 * the rope kernel stof_rope in place on its rounded output), against
 * stof__ref_gemm_rope (which rotates before the rounding: a little more
 * error allowed): the mma.sync template on any GPU, and the Hopper
 * template without rope on cc 9.0; heads of 128, 64, 72, 80 and 96 (no
 * Hopper tile holds whole heads of 72 or 80: only this path takes them),
 * whole and partial, rotations of 20, 24 and 72 channels (not of 16:
 * only this path), with and without a bias, M tails, seq not dividing
 * M, padded rows (the padding left alone), V's columns untouched. Then
 * the kernel's argument checks. */
static void rope_kernel(stof_dtype dt)
{
    stof_context *ctx = open_or_skip();
    const int hopper = ctx->device.cc_major == 9 &&
                       ctx->device.cc_minor == 0;
    static const struct {
        stof_gemm_cfg c;
        int rope, hd, bias;
        int M, N, K, pad, seq, cols;
    } cases[] = {
        {{128, 128, 32, 2, 4, 3, 0, 1, 0}, 128, 128, 1,
         1000, 1280, 328, 0, 333, 1152},
        {{64, 128, 32, 2, 2, 4, 0, 1, 0}, 32, 64, 0,
         300, 640, 200, 8, 77, 512},
        {{128, 64, 32, 2, 2, 3, 0, 1, 0}, 64, 72, 1,
         1000, 576, 136, 8, 250, 432},
        {{64, 64, 32, 2, 2, 3, 0, 1, 0}, 32, 80, 1,
         200, 800, 136, 0, 64, 640},
        /* rotations not of 16 channels (2 pairs a thread step): GPT-NeoX
         * 20B's 24 of 96, StableLM 3B's 20 of 80, a whole head of 72 */
        {{64, 128, 32, 2, 2, 4, 0, 1, 0}, 24, 96, 1,
         500, 960, 200, 8, 100, 768},
        {{64, 64, 32, 2, 2, 3, 0, 1, 0}, 20, 80, 0,
         300, 800, 136, 0, 64, 640},
        {{128, 64, 32, 2, 2, 3, 0, 1, 0}, 72, 72, 1,
         400, 576, 136, 8, 250, 432},
        /* the Hopper template's plain product (cc 9.0 only) */
        {{128, 256, 64, 2, 1, 4, 1, 1, 0}, 64, 128, 1,
         1000, 1280, 200, 0, 1000, 1024},
        {{128, 128, 64, 1, 1, 5, 1, 1, 0}, 16, 64, 0,
         520, 640, 200, 8, 100, 512},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(*cases); i++) {
        if (cases[i].c.wgmma && !hopper)
            continue;
        const stof_gemm_epi e = {.bias = cases[i].bias};
        check_rope = (rope_setup){.seq = cases[i].seq,
                                  .cols = cases[i].cols,
                                  .theta = i % 2 ? 10000.0f : 500000.0f,
                                  .split = 1,
                                  .rope = cases[i].rope,
                                  .hd = cases[i].hd};
        check(ctx, dt, &cases[i].c, &e, cases[i].M, cases[i].N, cases[i].K,
              cases[i].pad,
              (uint64_t)(5900 + 2 * i + (dt == STOF_DTYPE_BF16)));
    }
    check_rope = (rope_setup){0};
    /* Arguments: compile refuses a bad dtype or rope; launch refuses
     * misaligned or partial operands. */
    void *bin = NULL;
    size_t size = 0;
    cr_expect_eq(stof__rope_compile(ctx, (stof_dtype)7, 64, 64, NULL, &bin,
                                    &size),
                 STOF_ERR_INVALID_ARGUMENT);
    cr_expect(strstr(stof_errmsg(ctx), "rope"), "%s", stof_errmsg(ctx));
    cr_expect_eq(stof__rope_compile(ctx, dt, 64, 22, NULL, &bin, &size),
                 STOF_ERR_INVALID_ARGUMENT);
    cr_expect_eq(stof__rope_compile(ctx, dt, 64, 80, NULL, &bin, &size),
                 STOF_ERR_INVALID_ARGUMENT);
    cr_expect_eq(stof__rope_compile(ctx, dt, 68, 64, NULL, &bin, &size),
                 STOF_ERR_INVALID_ARGUMENT);
    cr_expect_eq(stof__rope_compile(ctx, dt, 64, 64, NULL, NULL, &size),
                 STOF_ERR_INVALID_ARGUMENT);
    kernel k = load_rope(ctx, dt, 64, 64);
    const stof_api *api = ctx->api;
    cr_assert_eq(stof__ctx_push(ctx), STOF_OK);
    CUdeviceptr x = upload(api, NULL, 1 << 16), tab = upload(api, NULL, 4096);
    static const struct {
        int dx, rows;
        int64_t ld;
        int cols, hd, rope, dtab, seq;
    } bad[] = {
        {2, 8, 256, 128, 64, 64, 0, 4},   /* x misaligned */
        {0, 8, 252, 128, 64, 64, 0, 4},   /* ld not a multiple of 8 */
        {0, 8, 64, 128, 64, 64, 0, 4},    /* ld < cols */
        {0, 8, 256, 96, 64, 64, 0, 4},    /* part of a head */
        {0, 8, 256, 128, 64, 22, 0, 4},   /* rope not of 4 */
        {0, 8, 256, 128, 64, 80, 0, 4},   /* rope > hd */
        {0, 8, 256, 120, 60, 48, 0, 4},   /* hd not of 8 */
        {0, 8, 256, 128, 64, 64, 8, 4},   /* table misaligned */
        {0, 8, 256, 128, 64, 64, 0, 0},   /* no sequence */
        {0, -1, 256, 128, 64, 64, 0, 4},  /* rows < 0 */
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(*bad); i++)
        cr_expect_eq(stof__rope_launch(k.fn, x + bad[i].dx, bad[i].rows,
                                       bad[i].ld, bad[i].cols, bad[i].hd,
                                       bad[i].rope, tab + bad[i].dtab,
                                       bad[i].seq, NULL, api),
                     STOF_ERR_INVALID_ARGUMENT, "bad case %zu", i);
    cr_expect_eq(stof__rope_launch(k.fn, 0, 8, 256, 128, 64, 64, tab, 4,
                                   NULL, api),
                 STOF_ERR_INVALID_ARGUMENT, "no x");
    cr_expect_eq(stof__rope_launch(NULL, x, 8, 256, 128, 64, 64, tab, 4,
                                   NULL, api),
                 STOF_ERR_INVALID_ARGUMENT, "no kernel");
    /* Nothing to do: no rows, or no rotated columns. */
    cr_expect_eq(stof__rope_launch(k.fn, x, 0, 256, 128, 64, 64, tab, 4,
                                   NULL, api),
                 STOF_OK);
    cr_expect_eq(stof__rope_launch(k.fn, x, 8, 256, 0, 64, 64, tab, 4, NULL,
                                   api),
                 STOF_OK);
    cr_expect(!tu_sync_error());
    api->cuMemFree(x);
    api->cuMemFree(tab);
    stof__ctx_pop(ctx);
    unload(ctx, &k);
    stof_close(&ctx);
}

Test(gpu, rope_kernel_fp16, .timeout = 300)
{
    rope_kernel(STOF_DTYPE_FP16);
}
Test(gpu, rope_kernel_bf16, .timeout = 300)
{
    rope_kernel(STOF_DTYPE_BF16);
}

/* Programmatic dependent launch: a slow kernel (stof_fill, one CTA)
 * writes A over its poison while the GEMMs after it in the stream, launched
 * with PDL, may already be resident: each must wait for it (stof_grid_wait)
 * before it reads A. Their outputs equal the same GEMMs run again after a
 * synchronisation, bit for bit: plain, in pairs, with a row norm
 * (cooperative; its second run asks for a grid larger than the GPU holds
 * at once, so the launch falls back to a smaller multiple of the row's
 * tiles), and the mma.sync template. */
Test(gpu, pdl_chain, .timeout = 300)
{
    stof_context *ctx = open_hopper_or_skip();
    const stof_api *api = ctx->api;
    /* (forced on for every launch, then back to STOF_PDL's or the plans'
     * choice) */
    const char *pdl_env = getenv("STOF_PDL");
    const int pdl_was = pdl_env && (pdl_env[0] == '0' || pdl_env[0] == '1') &&
                                pdl_env[1] == '\0'
                            ? pdl_env[0] - '0'
                            : -1;
    stof__pdl_set(1);
    const stof_dtype dt = STOF_DTYPE_FP16;
    const int M = 4096, N = 768, K = 768;
    const stof_gemm_epi plain = {0, 0, 0, 0, 0, 0, 0, 0},
                        ln = {1, 0, 1, 1, 0, 0, 0, 0};
    const stof_gemm_cfg cfgs[] = {{128, 256, 64, 2, 1, 4, 1, 1, 0},
                                  {128, 256, 64, 2, 1, 4, 1, 2, 0},
                                  {128, 128, 64, 1, 1, 5, 1, 1, 0},
                                  {128, 128, 32, 2, 4, 3, 0, 1, 0}};
    const stof_gemm_epi *epis[] = {&plain, &plain, &ln, &plain};
    enum { NC = sizeof(cfgs) / sizeof(*cfgs) };
    kernel k[NC];
    for (int i = 0; i < NC; i++)
        k[i] = load(ctx, dt, &cfgs[i], epis[i], N);
    kernel fk = load_gate(ctx, dt, STOF_ACT_NONE, 0);
    cr_assert_eq(stof__ctx_push(ctx), STOF_OK);
    CUfunction fill = NULL;
    cr_assert_eq(api->cuModuleGetFunction(&fill, fk.mod, "stof_fill"),
                 CUDA_SUCCESS);
    const size_t na = (size_t)M * K, nc = (size_t)M * N;
    CUdeviceptr da, dw, dc, dc2, dres, dvec, ws;
    cr_assert_eq(api->cuMemAlloc(&da, na * 2), CUDA_SUCCESS);
    cr_assert_eq(api->cuMemAlloc(&dw, (size_t)N * K * 2), CUDA_SUCCESS);
    cr_assert_eq(api->cuMemAlloc(&dc, nc * 2), CUDA_SUCCESS);
    cr_assert_eq(api->cuMemAlloc(&dc2, nc * 2), CUDA_SUCCESS);
    cr_assert_eq(api->cuMemAlloc(&dres, nc * 2), CUDA_SUCCESS);
    cr_assert_eq(api->cuMemAlloc(&dvec, (size_t)N * 2), CUDA_SUCCESS);
    const size_t ws_bytes = stof__gemm_ws_bytes(&cfgs[2], &ln, M, N);
    cr_assert_eq(api->cuMemAlloc(&ws, ws_bytes), CUDA_SUCCESS);
    cr_assert_eq(api->cuMemsetD8(ws, 0, ws_bytes), CUDA_SUCCESS);
    cr_assert_eq(api->cuMemsetD8(dw, 0x2c, (size_t)N * K * 2), CUDA_SUCCESS);
    cr_assert_eq(api->cuMemsetD8(dres, 0x3c, nc * 2), CUDA_SUCCESS);
    cr_assert_eq(api->cuMemsetD8(dvec, 0x38, (size_t)N * 2), CUDA_SUCCESS);
    uint16_t *h1 = malloc(nc * 2), *h2 = malloc(nc * 2);
    cr_assert(h1 && h2);
    for (int i = 0; i < NC; i++) {
        stof_gemm_args a = plain_args(da, dw, dc, M, N, K);
        a.bias = a.gamma = a.beta = dvec;
        a.residual = dres;
        a.eps = 1e-5f;
        a.ws = ws;
        for (int rep = 0; rep < 3; rep++) {
            /* Poison (NaN), then the slow fill, then the GEMM at once. */
            cr_assert_eq(api->cuMemsetD8(da, 0x7e, na * 2), CUDA_SUCCESS);
            cr_assert_eq(api->cuMemsetD8(dc, 0x7e, nc * 2), CUDA_SUCCESS);
            int64_t n = (int64_t)na;
            uint64_t seed = 77u + (uint64_t)rep;
            float scale = 1.0f, offset = 0.0f;
            void *fa[] = {&da, &n, &seed, &scale, &offset};
            cr_assert_eq(api->cuLaunchKernel(fill, 1, 1, 1, 256, 1, 1, 0,
                                             NULL, fa, NULL),
                         CUDA_SUCCESS);
            a.c = dc;
            cr_assert_eq(stof__gemm_launch(k[i].fn, &cfgs[i], epis[i], &a,
                                           ctx->device.sm_count, NULL, api),
                         STOF_OK, "cfg %d", i);
            cr_assert_eq(api->cuCtxSynchronize(), CUDA_SUCCESS);
            /* The norm's reference run asks for more CTAs than can be
             * resident: its cooperative launch falls back to fewer. */
            a.c = dc2;
            const int ctas = ctx->device.sm_count * (epis[i]->norm ? 4 : 1);
            cr_assert_eq(stof__gemm_launch(k[i].fn, &cfgs[i], epis[i], &a,
                                           ctas, NULL, api),
                         STOF_OK, "cfg %d, %d CTAs", i, ctas);
            cr_assert_eq(api->cuCtxSynchronize(), CUDA_SUCCESS);
            cr_assert_eq(api->cuMemcpyDtoH(h1, dc, nc * 2), CUDA_SUCCESS);
            cr_assert_eq(api->cuMemcpyDtoH(h2, dc2, nc * 2), CUDA_SUCCESS);
            size_t bad = 0, nan = 0;
            for (size_t j = 0; j < nc; j++) {
                bad += h1[j] != h2[j];
                nan += (h2[j] & 0x7c00) == 0x7c00;
            }
            cr_expect_eq(nan, 0u, "cfg %d: the reference run saw poison",
                         i);
            cr_expect_eq(bad, 0u,
                         "cfg %d rep %d: %zu of %zu outputs differ from the "
                         "run after a synchronisation",
                         i, rep, bad, nc);
        }
    }
    stof__pdl_set(pdl_was);
    free(h1);
    free(h2);
    api->cuMemFree(da);
    api->cuMemFree(dw);
    api->cuMemFree(dc);
    api->cuMemFree(dc2);
    api->cuMemFree(dres);
    api->cuMemFree(dvec);
    api->cuMemFree(ws);
    stof__ctx_pop(ctx);
    for (int i = 0; i < NC; i++)
        unload(ctx, &k[i]);
    unload(ctx, &fk);
    stof_close(&ctx);
}

Test(gpu, wgmma_norms_fp16, .timeout = 300)
{
    wgmma_norms(STOF_DTYPE_FP16);
}
Test(gpu, wgmma_norms_bf16, .timeout = 300)
{
    wgmma_norms(STOF_DTYPE_BF16);
}

/* The separate gate and activation kernel (stof_gate) against the CPU:
 * gated SiLU into another buffer with padded rows, and erf-GELU in
 * place; bad arguments refused. */
Test(gpu, gate_kernel, .timeout = 120)
{
    stof_context *ctx = open_or_skip();
    const stof_api *api = ctx->api;
    const stof_dtype dt = STOF_DTYPE_BF16;
    enum { R = 37, NN = 264, LDX = 2 * NN + 8, LDO = NN + 16 };
    tu_rng rng = {tu_seed() ^ 77};
    uint16_t *hx = malloc(R * LDX * 2), *ho = malloc(R * LDX * 2);
    float *fx = malloc(R * LDX * 4);
    cr_assert(hx && ho && fx);
    fill(&rng, hx, fx, R * LDX, dt, -4.0f, 4.0f);
    for (int gated = 1; gated >= 0; gated--) {
        const int act = gated ? STOF_ACT_SILU : STOF_ACT_GELU_ERF;
        const int64_t ldo = gated ? LDO : LDX;
        kernel k = load_gate(ctx, dt, act, gated);
        cr_assert_eq(stof__ctx_push(ctx), STOF_OK);
        CUdeviceptr dx = upload(api, hx, R * LDX * 2);
        CUdeviceptr dout = gated ? upload(api, NULL, R * LDO * 2) : dx;
        if (gated) {
            cr_assert_eq(api->cuMemsetD8(dout, 0xff, R * LDO * 2),
                         CUDA_SUCCESS);
            cr_expect_eq(stof__gate_launch(k.fn, dx, dout, R, NN, NN, ldo, 1,
                                           NULL, api),
                         STOF_ERR_INVALID_ARGUMENT,
                         "ld_x < 2n must be refused when gated");
            cr_expect_eq(stof__gate_launch(k.fn, dx, dx + 64, R, NN, LDX,
                                           LDX, 1, NULL, api),
                         STOF_ERR_INVALID_ARGUMENT,
                         "an output overlapping a gated input is refused");
        }
        cr_expect_eq(stof__gate_launch(k.fn, dx + 2, dout, R, NN, LDX, ldo,
                                       gated, NULL, api),
                     STOF_ERR_INVALID_ARGUMENT);
        cr_assert_eq(stof__gate_launch(k.fn, dx, dout, R, NN, LDX, ldo,
                                       gated, NULL, api),
                     STOF_OK);
        cr_assert_eq(api->cuCtxSynchronize(), CUDA_SUCCESS);
        cr_assert_eq(api->cuMemcpyDtoH(ho, dout, R * ldo * 2), CUDA_SUCCESS);
        api->cuMemFree(dx);
        if (gated)
            api->cuMemFree(dout);
        stof__ctx_pop(ctx);
        unload(ctx, &k);
        double err = 0.0;
        size_t pad_written = 0, up_changed = 0;
        for (int r = 0; r < R; r++)
            for (int c = 0; c < ldo; c++) {
                const uint16_t h = ho[r * ldo + c];
                if (c >= NN) { /* padding, or (in place) the up half */
                    if (gated)
                        pad_written += h != 0xffffu;
                    else
                        up_changed += h != hx[r * LDX + c];
                    continue;
                }
                float want = stof__ref_act(fx[r * LDX + c], act);
                if (gated)
                    want *= fx[r * LDX + NN + c];
                const double d =
                    fabs(stof__half_to_f32(h, dt) - want) / (fabs(want) + 1);
                err = d > err ? d : err;
            }
        cr_expect(err < 1e-2, "gated=%d: max error %.3e", gated, err);
        cr_expect_eq(pad_written, 0);
        cr_expect_eq(up_changed, 0);
    }
    free(hx), free(ho), free(fx);
    stof_close(&ctx);
}

/* STOF_GEMM_BENCH=1: a gated FFN's first GEMM (SwiGLU, no bias, as in
 * Llama-style layers), fused in the Hopper template, against cuBLASLt's
 * 2N-wide GEMM followed by the separate gate kernel, fp16 and bf16. */
Test(gpu, bench_gated, .timeout = 600)
{
    bench_or_skip();
    stof_context *ctx = open_hopper_or_skip();
    const stof_api *api = ctx->api;
    static const int shapes[][3] = {{4096, 11008, 4096},
                                    {8192, 14336, 4096},
                                    {16384, 5632, 2048},
                                    {16384, 3072, 768}};
    enum { NS = sizeof(shapes) / sizeof(*shapes) };
    const stof_gemm_epi swiglu = {0, STOF_ACT_SILU, 0, 0, 0, 1, 0, 0},
                        plain0 = {0, 0, 0, 0, 0, 0, 0, 0};
    const size_t maxa = 16384u * 4096u, maxw = 2u * 14336u * 4096u,
                 maxc = 16384u * 2u * 14336u;
    CUdeviceptr da, dw, dc, dg, ws;
    cr_assert_eq(stof__ctx_push(ctx), STOF_OK);
    cr_assert_eq(api->cuMemAlloc(&da, maxa * 2), CUDA_SUCCESS);
    cr_assert_eq(api->cuMemAlloc(&dw, maxw * 2), CUDA_SUCCESS);
    cr_assert_eq(api->cuMemAlloc(&dc, maxc * 2), CUDA_SUCCESS);
    cr_assert_eq(api->cuMemAlloc(&dg, maxc * 2), CUDA_SUCCESS);
    cr_assert_eq(api->cuMemAlloc(&ws, STOF_BLASLT_WORKSPACE), CUDA_SUCCESS);
    cr_assert_eq(api->cuMemsetD8(da, 0x11, maxa * 2), CUDA_SUCCESS);
    cr_assert_eq(api->cuMemsetD8(dw, 0x11, maxw * 2), CUDA_SUCCESS);
    CUevent e0, e1;
    cr_assert_eq(api->cuEventCreate(&e0, 0), CUDA_SUCCESS);
    cr_assert_eq(api->cuEventCreate(&e1, 0), CUDA_SUCCESS);
    stof__ctx_pop(ctx);
    for (int x = 0; x < 2; x++) {
        const stof_dtype dt = x ? STOF_DTYPE_BF16 : STOF_DTYPE_FP16;
        kernel k[N_WG_TILES];
        memset(k, 0, sizeof(k));
        for (int i = 0; i < N_WG_TILES; i++)
            if (wg_tiles[i].block_n >= 128)
                k[i] = load(ctx, dt, &wg_tiles[i], &swiglu, 8);
        kernel gk = load_gate(ctx, dt, STOF_ACT_SILU, 1);
        cr_assert_eq(stof__ctx_push(ctx), STOF_OK);
        for (int s = 0; s < NS; s++) {
            const int M = shapes[s][0], N = shapes[s][1], K = shapes[s][2];
            stof_gemm_args a = plain_args(da, dw, dc, M, N, K);
            double best = INFINITY;
            int best_i = -1;
            for (int i = 0; i < N_WG_TILES; i++) {
                if (!k[i].fn)
                    continue;
                const timed t = {k[i].fn, &wg_tiles[i], &swiglu, NULL, 0, 0,
                                 NULL,    NULL};
                const double ms = time_ms(ctx, &t, &a, 10, e0, e1);
                if (ms < best) {
                    best = ms;
                    best_i = i;
                }
            }
            /* The unfused chain: [M][2N] by cuBLASLt into dg, then the
             * gate into dc. */
            stof_gemm_args wide = plain_args(da, dw, dg, M, 2 * N, K);
            const gate_step g = {gk.fn, dg, dc, M, N, 1, 2 * N, N};
            const double lt_ms = lt_best_dt(ctx, dt, &wide, &plain0, &g, ws,
                                            e0, e1);
            const double lt_gemm = lt_best_dt(ctx, dt, &wide, &plain0, NULL,
                                              ws, e0, e1);
            const double flop = 2.0 * M * 2.0 * N * (double)K;
            cr_assert_geq(best_i, 0);
            cr_log_info("GATED %s M=%d N=%d K=%d (SwiGLU): fused wgmma %.4f "
                        "ms (%.0f TF/s, 128x%d s%d%s); cuBLASLt 2N GEMM "
                        "%.4f ms (%.0f TF/s) + gate kernel = %.4f ms; fused "
                        "speed-up %.2fx",
                        dt_name(dt), M, N, K, best, flop / (best * 1e9),
                        wg_tiles[best_i].block_n, wg_tiles[best_i].stages,
                        wg_tiles[best_i].warps_m == 1 ? " ping-pong" : "",
                        lt_gemm, flop / (lt_gemm * 1e9), lt_ms, lt_ms / best);
        }
        stof__ctx_pop(ctx);
        for (int i = 0; i < N_WG_TILES; i++)
            unload(ctx, &k[i]);
        unload(ctx, &gk);
    }
    cr_assert_eq(stof__ctx_push(ctx), STOF_OK);
    api->cuEventDestroy(e0);
    api->cuEventDestroy(e1);
    api->cuMemFree(da);
    api->cuMemFree(dw);
    api->cuMemFree(dc);
    api->cuMemFree(dg);
    api->cuMemFree(ws);
    stof__ctx_pop(ctx);
    stof_close(&ctx);
}

/* STOF_GEMM_BENCH=1: RoPE fused into the QKV projection's epilogue (the
 * Hopper template, stof_gemm_epi.rope) against the chains of a GEMM that
 * cannot fuse it, the plain product and then the rope kernel in place on
 * its output (stof__rope_launch, as a layer runs them): cuBLASLt's, and
 * the template's own plain tiles'. fp16, random operands (bench_ops_new),
 * the QKV projections of TinyLlama-1.1B (32 query heads of 64 and 4 K/V
 * heads, every channel of Q's and K's heads rotated; 4096 tokens as 8
 * sequences of 512, 32768 as 16 of 2048) and Llama-3-8B (32 query heads
 * of 128, 8 K/V; sequences of 4096).
 * The configurations: every Hopper candidate of stof__gemm_candidates
 * with the rope epilogue, and without it (plain, and plain then the rope
 * kernel); each of the algorithms cuBLASLt's heuristic offers (alone, and
 * then the rope kernel); the rope kernel alone. Each is timed by time_ms
 * (bench_reps(20) launches, like bench_hopper) once in each of RB_ROUNDS
 * rounds that take them all in turn, so that the GPU's clock drift falls
 * on all alike; its time is the median of its rounds, and a chain's the
 * best of its configurations'. The fastest fused tile's output is checked
 * against the fastest cuBLASLt algorithm's followed by the rope kernel
 * (the same work; without cuBLASLt, the fastest plain tile's): relative
 * error under 2e-3, every element written. One line a shape ("ROPE");
 * STOF_GEMM_BENCH=2 logs every configuration's median too, and
 * STOF_GEMM_BENCH_SHAPES picks shapes of rope_bench_shapes. */
typedef struct rope_bench_shape {
    const char *model;
    int M, N, K;
    int hd, rope, cols, seq; /* heads of hd, rope rotated, Q and K: cols */
    float theta;
} rope_bench_shape;

static const rope_bench_shape rope_bench_shapes[] = {
    {"TinyLlama-1.1B", 4096, 2048 + 2 * 256, 2048, 64, 64, 2048 + 256, 512,
     10000.0f},
    {"TinyLlama-1.1B", 32768, 2048 + 2 * 256, 2048, 64, 64, 2048 + 256, 2048,
     10000.0f},
    {"Llama-3-8B", 4096, 4096 + 2 * 1024, 4096, 128, 128, 4096 + 1024, 4096,
     500000.0f},
    {"Llama-3-8B", 16384, 4096 + 2 * 1024, 4096, 128, 128, 4096 + 1024, 4096,
     500000.0f},
};

enum {
    RB_ROUNDS = 7,
    RB_TILES = 32, /* Hopper candidates kept a shape and epilogue */
    RB_ALGOS = 8,  /* cuBLASLt's heuristic's algorithms asked for */
    RB_MEMO = 64,
    RB_ENTRIES = 3 * RB_TILES + 2 * RB_ALGOS + 1
};

/* The chains bench_rope times. */
enum {
    RB_FUSED,
    RB_PLAIN,
    RB_PLAIN_ROPE,
    RB_LT,
    RB_LT_ROPE,
    RB_ROPE_ONLY,
    RB_KINDS
};
static const char *const rb_kind_name[RB_KINDS] = {
    "fused wgmma", "plain wgmma", "plain wgmma + rope kernel",
    "cuBLASLt",    "cuBLASLt + rope kernel", "rope kernel alone"};

/* bench_rope's Hopper kernels, each loaded once (the shapes share most
 * of their candidates): by configuration and epilogue, fp16. */
typedef struct kernel_memo {
    int n;
    stof_gemm_cfg c[RB_MEMO];
    stof_gemm_epi e[RB_MEMO];
    kernel k[RB_MEMO];
} kernel_memo;

static CUfunction memo_load(stof_context *ctx, kernel_memo *m,
                            const stof_gemm_cfg *c, const stof_gemm_epi *e)
{
    for (int i = 0; i < m->n; i++)
        if (memcmp(&m->c[i], c, sizeof(*c)) == 0 &&
            memcmp(&m->e[i], e, sizeof(*e)) == 0)
            return m->k[i].fn;
    cr_assert_lt(m->n, RB_MEMO, "more kernels than the memo holds");
    m->c[m->n] = *c;
    m->e[m->n] = *e;
    m->k[m->n] = load(ctx, STOF_DTYPE_FP16, c, e, 8);
    return m->k[m->n++].fn;
}

/* The Hopper template's candidates (stof__gemm_candidates) for M x N x K
 * with epilogue e on ctx's device: up to RB_TILES into out; how many. */
static int wg_candidates(const stof_context *ctx, const stof_gemm_epi *e,
                         int M, int N, int K, stof_gemm_cfg *out)
{
    stof_gemm_cfg all[64];
    const int n = stof__gemm_candidates(&ctx->device, e, M, N, K, all, 64);
    int k = 0;
    for (int i = 0; i < n && k < RB_TILES; i++)
        if (all[i].wgmma)
            out[k++] = all[i];
    return k;
}

/* "128x256 s4", " ping-pong", " pairs": a Hopper tile's name in buf. */
static const char *wg_tile_name(const stof_gemm_cfg *c, char *buf, size_t n)
{
    snprintf(buf, n, "%dx%d s%d%s%s", c->block_m, c->block_n, c->stages,
             c->warps_m == 1 ? " ping-pong" : "",
             c->cluster > 1 ? " pairs" : "");
    return buf;
}

/* One run of t on a C poisoned with NaN (0xffff), its first n elements
 * copied to out (OUT). */
static void run_to_host(const stof_context *ctx, const timed *t,
                        const stof_gemm_args *a, size_t n, uint16_t *out)
{
    const stof_api *api = ctx->api;
    cr_assert_eq(api->cuMemsetD8(a->c, 0xff, n * 2), CUDA_SUCCESS);
    const stof_status st = timed_launch(ctx, t, a);
    cr_assert_eq(st, STOF_OK, "launch: %s", stof_status_str(st));
    const char *failed = tu_sync_error();
    cr_assert(!failed, "kernel failed: %s", failed);
    cr_assert_eq(api->cuMemcpyDtoH(out, a->c, n * 2), CUDA_SUCCESS);
}

/* ||x - ref|| / ||ref|| over n 16-bit values of dt, in double; *bad (OUT)
 * counts the elements not finite in either (then INFINITY). */
static double rel_err_half(const uint16_t *x, const uint16_t *ref, size_t n,
                           stof_dtype dt, size_t *bad)
{
    double d2 = 0.0, r2 = 0.0;
    size_t nb = 0;
    for (size_t i = 0; i < n; i++) {
        const double v = stof__half_to_f32(x[i], dt),
                     w = stof__half_to_f32(ref[i], dt);
        if (!isfinite(v) || !isfinite(w)) {
            nb++;
            continue;
        }
        d2 += (v - w) * (v - w);
        r2 += w * w;
    }
    *bad = nb;
    return nb ? INFINITY : r2 > 0.0 ? sqrt(d2 / r2) : sqrt(d2);
}

Test(gpu, bench_rope, .timeout = 600)
{
    bench_or_skip();
    stof_context *ctx = open_hopper_or_skip();
    const stof_api *api = ctx->api;
    const stof_dtype dt = STOF_DTYPE_FP16;
    enum { NS = sizeof(rope_bench_shapes) / sizeof(*rope_bench_shapes) };
    size_t na = 0, nw = 0, nc = 0;
    for (int s = 0; s < NS; s++) {
        const rope_bench_shape *sh = &rope_bench_shapes[s];
        const size_t sa = (size_t)sh->M * sh->K, sw = (size_t)sh->N * sh->K,
                     sc = (size_t)sh->M * sh->N;
        na = sa > na ? sa : na;
        nw = sw > nw ? sw : nw;
        nc = sc > nc ? sc : nc;
    }
    cr_assert_eq(stof__ctx_push(ctx), STOF_OK);
    bench_ops ops = bench_ops_new(api, na, nw, nc, 8, STOF_BLASLT_WORKSPACE,
                                  bench_random());
    if (bench_random())
        cr_log_info("random inputs (STOF_GEMM_BENCH_RANDOM=0: constant)");
    CUevent e0, e1;
    cr_assert_eq(api->cuEventCreate(&e0, 0), CUDA_SUCCESS);
    cr_assert_eq(api->cuEventCreate(&e1, 0), CUDA_SUCCESS);
    stof__ctx_pop(ctx);
    char why[256];
    const int have_lt = stof__blaslt_available(why, sizeof(why));
    if (!have_lt)
        cr_log_warn("no cuBLASLt: %s", why);
    kernel_memo memo = {0};
    uint16_t *hf = malloc(nc * 2), *hr = malloc(nc * 2);
    cr_assert(hf && hr);
    for (int s = 0; s < NS; s++) {
        if (!bench_shape_on(s))
            continue;
        const rope_bench_shape *sh = &rope_bench_shapes[s];
        const int M = sh->M, N = sh->N, K = sh->K;
        char tag[160];
        snprintf(tag, sizeof(tag),
                 "%s QKV M=%d N=%d K=%d (heads of %d, rope %d, cols %d, "
                 "seq %d)",
                 sh->model, M, N, K, sh->hd, sh->rope, sh->cols, sh->seq);
        const stof_gemm_epi plain = {0, 0, 0, 0, 0, 0, 0, 0},
                            fused = {.rope = sh->rope, .rope_hd = sh->hd};
        stof_gemm_cfg fc[RB_TILES], pc[RB_TILES];
        const int nf = wg_candidates(ctx, &fused, M, N, K, fc),
                  np = wg_candidates(ctx, &plain, M, N, K, pc);
        cr_assert(nf > 0 && np > 0, "%s: %d fused and %d plain candidates",
                  tag, nf, np);
        CUfunction ff[RB_TILES], pf[RB_TILES];
        for (int i = 0; i < nf; i++)
            ff[i] = memo_load(ctx, &memo, &fc[i], &fused);
        for (int i = 0; i < np; i++)
            pf[i] = memo_load(ctx, &memo, &pc[i], &plain);
        kernel rk = load_rope(ctx, dt, sh->hd, sh->rope);
        const size_t tab_bytes = sizeof(float) * (size_t)sh->seq * sh->rope;
        float *tab = malloc(tab_bytes);
        cr_assert_not_null(tab);
        stof__rope_table(tab, NULL, sh->seq, sh->rope, sh->theta);

        cr_assert_eq(stof__ctx_push(ctx), STOF_OK);
        const CUdeviceptr dtab = upload(api, tab, tab_bytes);
        free(tab);
        stof_gemm_args a = plain_args(ops.a, ops.w, ops.c, M, N, K);
        a.rope_tab = dtab;
        a.rope_seq = sh->seq;
        a.rope_cols = sh->cols;
        const rope_step rs = {.fn = rk.fn,
                              .x = ops.c,
                              .tab = dtab,
                              .rows = M,
                              .cols = sh->cols,
                              .hd = sh->hd,
                              .rope = sh->rope,
                              .seq = sh->seq,
                              .ld = N};
        stof_blaslt_gemm *lt = NULL;
        if (have_lt && stof__blaslt_create(ctx, dt, M, N, K, K, K, N, &plain,
                                           RB_ALGOS, &lt) != STOF_OK) {
            cr_log_warn("%s: cuBLASLt: %s", tag, stof_errmsg(ctx));
            lt = NULL;
        }
        int nl = lt ? stof__blaslt_n_algos(lt) : 0;
        if (nl > RB_ALGOS)
            nl = RB_ALGOS;
        /* The configurations: a chain each, its kind, and its tile's or
         * algorithm's index. */
        timed t[RB_ENTRIES];
        int kind[RB_ENTRIES], idx[RB_ENTRIES], ne = 0;
        for (int i = 0; i < nf; i++) {
            t[ne] = (timed){.fn = ff[i], .cfg = &fc[i], .epi = &fused};
            kind[ne] = RB_FUSED;
            idx[ne++] = i;
        }
        for (int i = 0; i < np; i++)
            for (int r = 0; r < 2; r++) {
                t[ne] = (timed){.fn = pf[i],
                                .cfg = &pc[i],
                                .epi = &plain,
                                .rope = r ? &rs : NULL};
                kind[ne] = r ? RB_PLAIN_ROPE : RB_PLAIN;
                idx[ne++] = i;
            }
        for (int al = 0; al < nl; al++)
            for (int r = 0; r < 2; r++) {
                t[ne] = (timed){.lt = lt,
                                .algo = al,
                                .ws = ops.ws,
                                .rope = r ? &rs : NULL};
                kind[ne] = r ? RB_LT_ROPE : RB_LT;
                idx[ne++] = al;
            }
        t[ne] = (timed){.rope = &rs};
        kind[ne] = RB_ROPE_ONLY;
        idx[ne++] = 0;

        double ms[RB_ENTRIES][RB_ROUNDS];
        for (int r = 0; r < RB_ROUNDS; r++)
            for (int j = 0; j < ne; j++)
                ms[j][r] = time_ms(ctx, &t[j], &a, bench_reps(20), e0, e1);
        double best[RB_KINDS];
        int best_j[RB_KINDS];
        for (int x = 0; x < RB_KINDS; x++) {
            best[x] = INFINITY;
            best_j[x] = -1;
        }
        char name[64];
        for (int j = 0; j < ne; j++) {
            qsort(ms[j], RB_ROUNDS, sizeof(double), cmp_double);
            const double med = ms[j][RB_ROUNDS / 2];
            if (bench_verbose()) {
                if (kind[j] == RB_FUSED)
                    wg_tile_name(&fc[idx[j]], name, sizeof(name));
                else if (kind[j] == RB_PLAIN || kind[j] == RB_PLAIN_ROPE)
                    wg_tile_name(&pc[idx[j]], name, sizeof(name));
                else if (kind[j] == RB_ROPE_ONLY)
                    name[0] = '\0';
                else
                    snprintf(name, sizeof(name), "algorithm %d", idx[j]);
                cr_log_info("  %s: %s %s: %.4f ms (rounds %.4f..%.4f)", tag,
                            rb_kind_name[kind[j]], name, med, ms[j][0],
                            ms[j][RB_ROUNDS - 1]);
            }
            if (med < best[kind[j]]) {
                best[kind[j]] = med;
                best_j[kind[j]] = j;
            }
        }
        cr_assert(best_j[RB_FUSED] >= 0 && best_j[RB_PLAIN] >= 0 &&
                      best_j[RB_PLAIN_ROPE] >= 0,
                  "%s: no Hopper configuration ran", tag);

        /* The same work: the fastest fused tile's output against the
         * fastest cuBLASLt algorithm's followed by the rope kernel (the
         * rope kernel rotates the rounded product: a rounding apart). */
        const int ref_j = best_j[RB_LT_ROPE] >= 0 ? best_j[RB_LT_ROPE]
                                                  : best_j[RB_PLAIN_ROPE];
        const size_t n = (size_t)M * N;
        run_to_host(ctx, &t[best_j[RB_FUSED]], &a, n, hf);
        run_to_host(ctx, &t[ref_j], &a, n, hr);
        size_t bad = 0;
        const double err = rel_err_half(hf, hr, n, dt, &bad);
        cr_expect_eq(bad, 0,
                     "%s: %zu elements not finite (unwritten) in the fused "
                     "or the %s output",
                     tag, bad, rb_kind_name[kind[ref_j]]);
        cr_expect(err < 2e-3,
                  "%s: fused output against %s: relative error %.3e >= "
                  "2e-3",
                  tag, rb_kind_name[kind[ref_j]], err);

        char fname[64], pname[64], prname[64];
        wg_tile_name(&fc[idx[best_j[RB_FUSED]]], fname, sizeof(fname));
        wg_tile_name(&pc[idx[best_j[RB_PLAIN]]], pname, sizeof(pname));
        wg_tile_name(&pc[idx[best_j[RB_PLAIN_ROPE]]], prname,
                     sizeof(prname));
        const double flop = 2.0 * M * N * (double)K;
        cr_log_info("ROPE %s: fused %.4f ms (%.0f TF/s, %s), plain %.4f ms "
                    "(%s), cuBLASLt %.4f ms, cuBLASLt+rope %.4f ms; "
                    "fused/(cuBLASLt+rope) %.3f, fused/plain %.3f; "
                    "plain+rope %.4f ms (%s), fused/(plain+rope) %.3f; "
                    "rope kernel alone %.4f ms; fused against %s rel err "
                    "%.2e",
                    tag, best[RB_FUSED], flop / (best[RB_FUSED] * 1e9),
                    fname, best[RB_PLAIN], pname, best[RB_LT],
                    best[RB_LT_ROPE], best[RB_FUSED] / best[RB_LT_ROPE],
                    best[RB_FUSED] / best[RB_PLAIN], best[RB_PLAIN_ROPE],
                    prname, best[RB_FUSED] / best[RB_PLAIN_ROPE],
                    best[RB_ROPE_ONLY], rb_kind_name[kind[ref_j]], err);
        stof__blaslt_free(&lt);
        api->cuMemFree(dtab);
        stof__ctx_pop(ctx);
        unload(ctx, &rk);
    }
    free(hf), free(hr);
    cr_assert_eq(stof__ctx_push(ctx), STOF_OK);
    api->cuEventDestroy(e0);
    api->cuEventDestroy(e1);
    bench_ops_free(api, &ops);
    stof__ctx_pop(ctx);
    for (int i = 0; i < memo.n; i++)
        unload(ctx, &memo.k[i]);
    stof_close(&ctx);
}

/* main() is Criterion's unless told otherwise: this one skips (exit 77)
 * when no GPU is usable. */
__attribute__((visibility("default"))) int main(int argc, char **argv)
{
    return tu_gpu_suite_main("gpu gemm", argc, argv);
}
