/*
 * layer.c - Transformer layers: the chain around the sparse attention,
 * fused and tuned (stof_layer_plan / stof_layer_run / stof_layer_stack_run).
 *
 * A layer is a fixed chain of steps over named buffers (X input, Y output,
 * QKV, ATT, H, T, N, F intermediates, and the weights):
 *   post-norm: QKV = X Wqkv^T + b;  ATT = attn(QKV);  H = norm1(X + ATT Wo^T
 *              + bo) [junction A];  F = act(H W1^T + b1);
 *              Y = norm2(H + F W2^T + b2) [junction B]
 *   pre-norm:  N = norm1(X);  QKV = N Wqkv^T + b;  ATT = attn(QKV);
 *              H = X + ATT Wo^T + bo, N = norm2(H) [junction A];
 *              F = act(N W1^T + b1);  Y = H + F W2^T + b2
 * The attention reads Q, K and V in place from the QKV projection's
 * [tokens][3 hidden] output through strides, and writes ATT as
 * [tokens][hidden], so no transposes exist. A junction (GEMM, then bias,
 * residual and norm) is cut into kernels in one of three ways, the fusion
 * scheme:
 *   res+norm       GEMM with bias and residual in its epilogue -> T (or H),
 *                  then the norm kernel
 *   bias+res+norm  plain GEMM -> T, then one memory-bound kernel doing
 *                  bias + residual + norm (lets any GEMM be used)
 *   fused          one row-complete GEMM whose CTAs own whole rows and
 *                  normalise them in the epilogue
 * Every GEMM is a candidate list of stof's template (gemm.cu, ranked by its
 * cost model) plus cuBLASLt's heuristic algorithms where it can express the
 * epilogue. Tuning (stage 2) compiles the template candidates in parallel,
 * checks every candidate against the C reference on sampled rows, times
 * each in isolation (CUDA events, median, L2 flushed) on scratch data of
 * the real shapes, and a scheme costs the sum of its kernels' best times.
 * The winners are stored in the tuning database: one record per kernel
 * (op "gemm"/"norm", with its cubin or cuBLASLt algorithm) and one for the
 * layer (op "layer", the scheme), under keys derived from the layer's.
 */
#define XXH_INLINE_ALL
#include <xxhash.h>

#include "internal.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "blaslt.h"
#include "db.h"
#include "gemm.h"
#include "record_check.h"
#include "search.h"

/* --- buffers, operations, steps ----------------------------------------- */

enum {
    SYM_NONE,
    SYM_X, SYM_Y, SYM_QKV, SYM_ATT, SYM_H, SYM_T, SYM_N, SYM_F,
    SYM_WQKV, SYM_BQKV, SYM_WO, SYM_BO, SYM_W1, SYM_B1, SYM_W2, SYM_B2,
    SYM_G1, SYM_BE1, SYM_G2, SYM_BE2,
    SYM_COUNT
};
#define SYM_FIRST_BUF SYM_QKV
#define SYM_LAST_BUF SYM_F
#define SYM_FIRST_W SYM_WQKV

/* The GEMMs and norm kernels any scheme may use. */
enum { G_QKV, G_A_RES, G_A_PLAIN, G_A_NORM, G_FFN1, G_B_RES, G_B_PLAIN,
       G_B_NORM, G_COUNT };
enum { N_IN, N_A_PLAIN, N_A_BR, N_B_PLAIN, N_B_BR, N_COUNT };
enum { J_RES_NORM, J_BIAS_RES_NORM, J_FUSED, J_COUNT };

static const char *const g_slot[G_COUNT] = {"qkv",  "out_res", "out",
                                            "out_norm", "ffn1", "ffn2_res",
                                            "ffn2", "ffn2_norm"};
static const char *const n_slot[N_COUNT] = {"norm_in", "norm_a", "norm_a_br",
                                            "norm_b", "norm_b_br"};
static const char *const j_name[J_COUNT] = {"res+norm", "bias+res+norm",
                                            "fused"};

typedef struct gemm_op {
    int used;
    int M, N, K;
    stof_gemm_epi epi;
    /* the chosen kernel */
    int ok, lt;
    stof_gemm_cfg cfg;
    CUmodule mod;
    CUfunction fn;
    stof_blaslt_gemm *ltg;
    double ms, model_ms;
    int n_timed, n_rejected;
} gemm_op;

typedef struct norm_op {
    int used;
    int bias, res, pre;
    int warps;
    int ok;
    CUmodule mod;
    CUfunction fn;
    double ms, model_ms;
} norm_op;

enum { STEP_GEMM, STEP_NORM, STEP_ATTN };
/* Operand slots of a step. GEMM: a, w, bias, res, out, pre, gamma, beta.
 * NORM: a = x, res, bias, out, pre, gamma, beta. */
enum { O_A, O_W, O_BIAS, O_RES, O_OUT, O_PRE, O_GAMMA, O_BETA, O_COUNT };
typedef struct step {
    int kind, op;
    int s[O_COUNT];
} step;

#define MAX_STEPS 12

struct stof_layer {
    stof_context *ctx;
    stof_layer_desc d;
    int M, hd;
    float eps;
    stof_plan *attn;
    gemm_op g[G_COUNT];
    norm_op n[N_COUNT];
    int ja, jb;
    step steps[MAX_STEPS];
    int n_steps;
    CUdeviceptr buf[SYM_COUNT]; /* intermediates (QKV..F) */
    CUdeviceptr mem, lt_ws;
    CUstream cap_stream;
    CUgraph graph;
    CUgraphExec gexec;
    uint64_t graph_key;
    char key[33];
    char key_text[1024];
    char source[16];       /* "database", "tuned", "model" */
    double layer_ms, model_ms, tune_s;
    double verify_ms;       /* first use of database kernels here */
    char errmsg[1024];
};

/* --- descriptor ---------------------------------------------------------- */

stof_status stof_layer_desc_init(stof_layer_desc *d, int batch, int seq,
                                 int hidden, int heads, stof_dtype dtype)
{
    if (!d)
        return STOF_ERR_INVALID_ARGUMENT;
    memset(d, 0, sizeof(*d));
    d->batch = batch;
    d->seq = seq;
    d->hidden = hidden;
    d->heads = heads;
    d->ffn = hidden > 0 && hidden <= (1 << 28) ? 4 * hidden : 0;
    d->dtype = dtype;
    d->act = STOF_ACT_GELU_TANH;
    d->norm = STOF_NORM_LAYER;
    d->pre_norm = 0;
    d->norm_eps = 1e-5f;
    return STOF_OK;
}

static stof_status check_desc(stof_context *ctx, const stof_layer_desc *d,
                              const stof_mask *m)
{
    STOF_CHECK_ARG(ctx, d, "desc is NULL");
    STOF_CHECK_ARG(ctx, m, "mask is NULL");
    for (size_t i = 0; i < sizeof(d->reserved); i++)
        STOF_CHECK_ARG(ctx, !d->reserved[i],
                       "desc.reserved[%zu] is not zero (initialise the "
                       "descriptor with stof_layer_desc_init or memset)",
                       i);
    STOF_CHECK_ARG(ctx, d->batch >= 1 && d->seq >= 1,
                   "desc.batch %d, desc.seq %d: both must be at least 1",
                   d->batch, d->seq);
    STOF_CHECK_ARG(ctx, (int64_t)d->batch * d->seq <= (1 << 30),
                   "desc.batch * desc.seq = %lld tokens: at most 2^30",
                   (long long)d->batch * d->seq);
    STOF_CHECK_ARG(ctx, d->hidden >= 8 && d->hidden <= 16384 &&
                            d->hidden % 8 == 0,
                   "desc.hidden %d: a multiple of 8 in [8, 16384]",
                   d->hidden);
    STOF_CHECK_ARG(ctx, d->heads >= 1 && d->hidden % d->heads == 0,
                   "desc.heads %d does not divide desc.hidden %d", d->heads,
                   d->hidden);
    STOF_CHECK_ARG(ctx, d->ffn >= 8 && d->ffn <= 131072 && d->ffn % 8 == 0,
                   "desc.ffn %d: a multiple of 8 in [8, 131072]", d->ffn);
    STOF_CHECK_ARG(ctx,
                   d->dtype == STOF_DTYPE_FP16 || d->dtype == STOF_DTYPE_BF16,
                   "desc.dtype %d is not a stof_dtype", (int)d->dtype);
    STOF_CHECK_ARG(ctx, d->act >= STOF_ACT_NONE && d->act <= STOF_ACT_SILU,
                   "desc.act %d is not a stof_activation", (int)d->act);
    STOF_CHECK_ARG(ctx, d->norm == STOF_NORM_LAYER || d->norm == STOF_NORM_RMS,
                   "desc.norm %d is not a stof_norm_kind", (int)d->norm);
    STOF_CHECK_ARG(ctx, d->pre_norm == 0 || d->pre_norm == 1,
                   "desc.pre_norm %d: 0 (post-norm) or 1 (pre-norm)",
                   d->pre_norm);
    STOF_CHECK_ARG(ctx, isfinite(d->norm_eps) && d->norm_eps >= 0.0f,
                   "desc.norm_eps %g: a finite value >= 0 (0 = 1e-5)",
                   (double)d->norm_eps);
    const int sq = stof_mask_seq_q(m), sk = stof_mask_seq_k(m);
    STOF_CHECK_ARG(ctx, sq == d->seq && sk == d->seq,
                   "mask is %d x %d but desc.seq is %d: the mask must be "
                   "seq x seq",
                   sq, sk, d->seq);
    return STOF_OK;
}

/* --- the chain ------------------------------------------------------------ */

static void init_ops(stof_layer *L)
{
    const stof_layer_desc *d = &L->d;
    const int M = L->M, h = d->hidden, f = d->ffn, pre = d->pre_norm;
    const int nk = (int)d->norm + 1;
    static const struct {
        int n_is_ffn, k_is_ffn, n3, bias, act, res, norm;
    } shape[G_COUNT] = {
        [G_QKV] = {0, 0, 1, 1, 0, 0, 0},     [G_A_RES] = {0, 0, 0, 1, 0, 1, 0},
        [G_A_PLAIN] = {0, 0, 0, 0, 0, 0, 0}, [G_A_NORM] = {0, 0, 0, 1, 0, 1, 1},
        [G_FFN1] = {1, 0, 0, 1, 1, 0, 0},    [G_B_RES] = {0, 1, 0, 1, 0, 1, 0},
        [G_B_PLAIN] = {0, 1, 0, 0, 0, 0, 0}, [G_B_NORM] = {0, 1, 0, 1, 0, 1, 1},
    };
    for (int i = 0; i < G_COUNT; i++) {
        gemm_op *g = &L->g[i];
        memset(g, 0, sizeof(*g));
        g->M = M;
        g->N = shape[i].n3 ? 3 * h : shape[i].n_is_ffn ? f : h;
        g->K = shape[i].k_is_ffn ? f : h;
        g->epi.bias = shape[i].bias;
        g->epi.act = shape[i].act ? (int)d->act : STOF_ACT_NONE;
        g->epi.residual = shape[i].res;
        g->epi.norm = shape[i].norm ? nk : 0;
        g->epi.write_pre = shape[i].norm && pre && i == G_A_NORM;
        g->used = !pre || (i != G_B_PLAIN && i != G_B_NORM);
    }
    for (int i = 0; i < N_COUNT; i++) {
        norm_op *n = &L->n[i];
        memset(n, 0, sizeof(*n));
        n->bias = n->res = (i == N_A_BR || i == N_B_BR);
        n->pre = pre && i == N_A_BR;
        n->used = pre ? i <= N_A_BR : i != N_IN;
        n->warps = 4;
    }
}

static int tok_ld(const stof_layer *L, int sym)
{
    return sym == SYM_QKV ? 3 * L->d.hidden
                          : sym == SYM_F ? L->d.ffn : L->d.hidden;
}

static step *add_step(stof_layer *L, int kind, int op)
{
    step *s = &L->steps[L->n_steps++];
    memset(s, 0, sizeof(*s));
    s->kind = kind;
    s->op = op;
    return s;
}

static void add_gemm(stof_layer *L, int op, int a, int w, int bias, int res,
                     int out, int pre, int gamma, int beta)
{
    step *s = add_step(L, STEP_GEMM, op);
    s->s[O_A] = a;
    s->s[O_W] = w;
    s->s[O_BIAS] = bias;
    s->s[O_RES] = res;
    s->s[O_OUT] = out;
    s->s[O_PRE] = pre;
    s->s[O_GAMMA] = gamma;
    s->s[O_BETA] = beta;
}

static void add_norm(stof_layer *L, int op, int x, int res, int bias, int out,
                     int pre, int gamma, int beta)
{
    step *s = add_step(L, STEP_NORM, op);
    s->s[O_A] = x;
    s->s[O_RES] = res;
    s->s[O_BIAS] = bias;
    s->s[O_OUT] = out;
    s->s[O_PRE] = pre;
    s->s[O_GAMMA] = gamma;
    s->s[O_BETA] = L->d.norm == STOF_NORM_LAYER ? beta : SYM_NONE;
}

/* GEMM of a (x) w (+ bias + res) followed by the norm, cut as j says: the
 * normalised rows go to `out`, the pre-norm sum to `pre` (SYM_NONE: not
 * kept). g0 is the junction's first GEMM op (res, plain, norm follow), n0
 * its first norm op (plain, bias+res). */
static void add_junction(stof_layer *L, int j, int g0, int n0, int a, int w,
                         int bias, int res, int out, int pre, int gamma,
                         int beta)
{
    if (j == J_RES_NORM) {
        const int tmp = pre != SYM_NONE ? pre : SYM_T;
        add_gemm(L, g0, a, w, bias, res, tmp, SYM_NONE, SYM_NONE, SYM_NONE);
        add_norm(L, n0, tmp, SYM_NONE, SYM_NONE, out, SYM_NONE, gamma, beta);
    } else if (j == J_BIAS_RES_NORM) {
        add_gemm(L, g0 + 1, a, w, SYM_NONE, SYM_NONE, SYM_T, SYM_NONE,
                 SYM_NONE, SYM_NONE);
        add_norm(L, n0 + 1, SYM_T, res, bias, out, pre, gamma, beta);
    } else {
        add_gemm(L, g0 + 2, a, w, bias, res, out, pre, gamma,
                 L->d.norm == STOF_NORM_LAYER ? beta : SYM_NONE);
    }
}

static void build_steps(stof_layer *L, int ja, int jb)
{
    L->n_steps = 0;
    L->ja = ja;
    L->jb = jb;
    if (!L->d.pre_norm) {
        add_gemm(L, G_QKV, SYM_X, SYM_WQKV, SYM_BQKV, SYM_NONE, SYM_QKV,
                 SYM_NONE, SYM_NONE, SYM_NONE);
        add_step(L, STEP_ATTN, 0);
        add_junction(L, ja, G_A_RES, N_A_PLAIN, SYM_ATT, SYM_WO, SYM_BO, SYM_X,
                     SYM_H, SYM_NONE, SYM_G1, SYM_BE1);
        add_gemm(L, G_FFN1, SYM_H, SYM_W1, SYM_B1, SYM_NONE, SYM_F, SYM_NONE,
                 SYM_NONE, SYM_NONE);
        add_junction(L, jb, G_B_RES, N_B_PLAIN, SYM_F, SYM_W2, SYM_B2, SYM_H,
                     SYM_Y, SYM_NONE, SYM_G2, SYM_BE2);
    } else {
        add_norm(L, N_IN, SYM_X, SYM_NONE, SYM_NONE, SYM_N, SYM_NONE, SYM_G1,
                 SYM_BE1);
        add_gemm(L, G_QKV, SYM_N, SYM_WQKV, SYM_BQKV, SYM_NONE, SYM_QKV,
                 SYM_NONE, SYM_NONE, SYM_NONE);
        add_step(L, STEP_ATTN, 0);
        add_junction(L, ja, G_A_RES, N_A_PLAIN, SYM_ATT, SYM_WO, SYM_BO, SYM_X,
                     SYM_N, SYM_H, SYM_G2, SYM_BE2);
        add_gemm(L, G_FFN1, SYM_N, SYM_W1, SYM_B1, SYM_NONE, SYM_F, SYM_NONE,
                 SYM_NONE, SYM_NONE);
        add_gemm(L, G_B_RES, SYM_F, SYM_W2, SYM_B2, SYM_H, SYM_Y, SYM_NONE,
                 SYM_NONE, SYM_NONE);
    }
}

/* The ops junction option j of a junction uses (for its cost). */
static double junction_cost(const stof_layer *L, int j, int g0, int n0,
                            int measured)
{
    const gemm_op *g = &L->g[g0 + j];
    if (!g->ok)
        return INFINITY;
    double t = measured ? g->ms : g->model_ms;
    if (j != J_FUSED) {
        const norm_op *n = &L->n[n0 + j];
        if (!n->ok)
            return INFINITY;
        t += measured ? n->ms : n->model_ms;
    }
    return t > 0 ? t : INFINITY;
}

/* --- kernels: norm -------------------------------------------------------- */

static void norm_defs(const stof_layer *L, const norm_op *n, int warps,
                      char defs[8][32])
{
    snprintf(defs[0], 32, "DTYPE=%d", (int)L->d.dtype);
    snprintf(defs[1], 32, "HIDDEN=%d", L->d.hidden);
    snprintf(defs[2], 32, "NORM=%d", (int)L->d.norm + 1);
    snprintf(defs[3], 32, "WARPS=%d", warps);
    snprintf(defs[4], 32, "BIAS=%d", n->bias);
    snprintf(defs[5], 32, "RESIDUAL=%d", n->res);
    snprintf(defs[6], 32, "WRITE_PRE=%d", n->pre);
}

static stof_status norm_compile(stof_context *ctx, const stof_layer *L,
                                const norm_op *n, int warps, void **cubin,
                                size_t *size)
{
    char defs[8][32];
    norm_defs(L, n, warps, defs);
    const char *p[7];
    for (int i = 0; i < 7; i++)
        p[i] = defs[i];
    return (stof_status)stof__jit_compile(ctx, "layer_ops.cu", p, 7, NULL,
                                          cubin, size);
}

static double norm_model_ms(const stof_layer *L, const norm_op *n)
{
    /* Memory-bound: bytes over ~3 TB/s plus a launch. */
    const double row = 2.0 * L->d.hidden;
    const double bytes = (double)L->M * row * (2 + n->res + n->pre);
    return 0.003 + bytes / 3.0e9;
}

/* --- kernels: fill (scratch data) ------------------------------------------ */

typedef struct aux_kernels {
    CUmodule mod;
    CUfunction fill;
} aux_kernels;

static stof_status fill(stof_layer *L, aux_kernels *aux, CUdeviceptr p,
                        size_t n, uint64_t seed, float scale, float offset)
{
    const stof_api *api = L->ctx->api;
    long long nn = (long long)n;
    void *args[] = {&p, &nn, &seed, &scale, &offset};
    unsigned blocks = (unsigned)((n + 255) / 256);
    if (blocks > 4096)
        blocks = 4096;
    if (!blocks)
        return STOF_OK;
    STOF_CU(L->ctx, api->cuLaunchKernel(aux->fill, blocks, 1, 1, 256, 1, 1, 0,
                                        NULL, args, NULL));
    return STOF_OK;
}

/* --- running -------------------------------------------------------------- */

static CUdeviceptr sym_ptr(const stof_layer *L, const CUdeviceptr *wp,
                           CUdeviceptr x, CUdeviceptr y, int s)
{
    if (s == SYM_NONE)
        return 0;
    if (s == SYM_X)
        return x;
    if (s == SYM_Y)
        return y;
    if (s >= SYM_FIRST_W)
        return wp[s];
    return L->buf[s];
}

static stof_status launch_gemm(stof_layer *L, const gemm_op *g,
                               const step *s, const CUdeviceptr *wp,
                               CUdeviceptr x, CUdeviceptr y, CUstream stream)
{
    stof_gemm_args a;
    memset(&a, 0, sizeof(a));
    a.a = sym_ptr(L, wp, x, y, s->s[O_A]);
    a.w = sym_ptr(L, wp, x, y, s->s[O_W]);
    a.c = sym_ptr(L, wp, x, y, s->s[O_OUT]);
    a.bias = sym_ptr(L, wp, x, y, s->s[O_BIAS]);
    a.residual = sym_ptr(L, wp, x, y, s->s[O_RES]);
    a.pre = sym_ptr(L, wp, x, y, s->s[O_PRE]);
    a.gamma = sym_ptr(L, wp, x, y, s->s[O_GAMMA]);
    a.beta = sym_ptr(L, wp, x, y, s->s[O_BETA]);
    a.M = g->M;
    a.N = g->N;
    a.K = g->K;
    a.lda = tok_ld(L, s->s[O_A]);
    a.ldw = g->K;
    a.ldc = g->N;
    a.eps = L->eps;
    if (g->lt)
        return stof__blaslt_run(g->ltg, 0, &a, L->lt_ws, stream);
    return stof__gemm_launch(g->fn, &g->cfg, &g->epi, &a, stream,
                             L->ctx->api);
}

static stof_status launch_norm(stof_layer *L, const norm_op *n, const step *s,
                               const CUdeviceptr *wp, CUdeviceptr x,
                               CUdeviceptr y, CUstream stream)
{
    CUdeviceptr px = sym_ptr(L, wp, x, y, s->s[O_A]);
    CUdeviceptr pr = sym_ptr(L, wp, x, y, s->s[O_RES]);
    CUdeviceptr pb = sym_ptr(L, wp, x, y, s->s[O_BIAS]);
    CUdeviceptr pg = sym_ptr(L, wp, x, y, s->s[O_GAMMA]);
    CUdeviceptr pe = sym_ptr(L, wp, x, y, s->s[O_BETA]);
    CUdeviceptr po = sym_ptr(L, wp, x, y, s->s[O_OUT]);
    CUdeviceptr pp = sym_ptr(L, wp, x, y, s->s[O_PRE]);
    int rows = L->M;
    long long ld = L->d.hidden;
    float eps = L->eps;
    void *args[] = {&px, &pr, &pb, &pg, &pe, &po, &pp, &rows, &ld, &eps};
    const unsigned grid = (unsigned)((rows + n->warps - 1) / n->warps);
    CUresult r = L->ctx->api->cuLaunchKernel(n->fn, grid, 1, 1,
                                             (unsigned)(32 * n->warps), 1, 1,
                                             0, stream, args, NULL);
    return r == CUDA_SUCCESS ? STOF_OK : STOF_ERR_CUDA;
}

static stof_status launch_attn(stof_layer *L, CUstream stream)
{
    const CUdeviceptr q = L->buf[SYM_QKV];
    const size_t hb = (size_t)L->d.hidden * 2;
    return stof_attention_run(L->attn, (const void *)(uintptr_t)q,
                              (const void *)(uintptr_t)(q + hb),
                              (const void *)(uintptr_t)(q + 2 * hb),
                              (void *)(uintptr_t)L->buf[SYM_ATT], stream);
}

static int layer_fail(stof_layer *L, stof_status st, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;
static int layer_fail(stof_layer *L, stof_status st, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(L->errmsg, sizeof(L->errmsg), fmt, ap);
    va_end(ap);
    return (int)st;
}

/* Enqueue the steps; the context must be current. */
static stof_status run_steps(stof_layer *L, const CUdeviceptr *wp,
                             CUdeviceptr x, CUdeviceptr y, CUstream stream)
{
    for (int i = 0; i < L->n_steps; i++) {
        const step *s = &L->steps[i];
        stof_status st;
        const char *what;
        if (s->kind == STEP_GEMM) {
            st = launch_gemm(L, &L->g[s->op], s, wp, x, y, stream);
            what = g_slot[s->op];
        } else if (s->kind == STEP_NORM) {
            st = launch_norm(L, &L->n[s->op], s, wp, x, y, stream);
            what = n_slot[s->op];
        } else {
            st = launch_attn(L, stream);
            what = "attention";
        }
        if (st != STOF_OK)
            return (stof_status)layer_fail(
                L, st, "stof_layer_run: launching %s failed: %s", what,
                s->kind == STEP_ATTN ? stof_plan_errmsg(L->attn)
                : s->kind == STEP_GEMM && L->g[s->op].lt
                    ? stof_errmsg(L->ctx)
                    : stof_status_str(st));
    }
    return STOF_OK;
}

static stof_status weights_ptrs(stof_layer *L, const stof_layer_weights *w,
                                CUdeviceptr wp[SYM_COUNT])
{
    memset(wp, 0, sizeof(CUdeviceptr) * SYM_COUNT);
    const struct {
        int sym;
        const void *p;
        const char *name;
    } t[] = {
        {SYM_WQKV, w->w_qkv, "w_qkv"},   {SYM_BQKV, w->b_qkv, "b_qkv"},
        {SYM_WO, w->w_o, "w_o"},         {SYM_BO, w->b_o, "b_o"},
        {SYM_W1, w->w_ffn1, "w_ffn1"},   {SYM_B1, w->b_ffn1, "b_ffn1"},
        {SYM_W2, w->w_ffn2, "w_ffn2"},   {SYM_B2, w->b_ffn2, "b_ffn2"},
        {SYM_G1, w->norm1_gamma, "norm1_gamma"},
        {SYM_BE1, w->norm1_beta, "norm1_beta"},
        {SYM_G2, w->norm2_gamma, "norm2_gamma"},
        {SYM_BE2, w->norm2_beta, "norm2_beta"},
    };
    for (size_t i = 0; i < sizeof(t) / sizeof(*t); i++) {
        const int is_beta = t[i].sym == SYM_BE1 || t[i].sym == SYM_BE2;
        if (is_beta && L->d.norm == STOF_NORM_RMS)
            continue;
        if (!t[i].p)
            return (stof_status)layer_fail(L, STOF_ERR_INVALID_ARGUMENT,
                                           "weights.%s is NULL", t[i].name);
        if ((uintptr_t)t[i].p % 16)
            return (stof_status)layer_fail(L, STOF_ERR_INVALID_ARGUMENT,
                                           "weights.%s is not 16-byte aligned",
                                           t[i].name);
        wp[t[i].sym] = (CUdeviceptr)(uintptr_t)t[i].p;
    }
    return STOF_OK;
}

static stof_status check_xy(stof_layer *L, const void *x, const void *y)
{
    if (!x || !y)
        return (stof_status)layer_fail(L, STOF_ERR_INVALID_ARGUMENT,
                                       "%s is NULL", !x ? "x" : "y");
    if ((uintptr_t)x % 16 || (uintptr_t)y % 16)
        return (stof_status)layer_fail(L, STOF_ERR_INVALID_ARGUMENT,
                                       "%s is not 16-byte aligned",
                                       (uintptr_t)x % 16 ? "x" : "y");
    return STOF_OK;
}

stof_status stof_layer_run(stof_layer *L, const stof_layer_weights *w,
                           const void *x, void *y, void *stream)
{
    if (!L)
        return STOF_ERR_INVALID_ARGUMENT;
    if (!w)
        return (stof_status)layer_fail(L, STOF_ERR_INVALID_ARGUMENT,
                                       "weights is NULL");
    CUdeviceptr wp[SYM_COUNT];
    stof_status st = weights_ptrs(L, w, wp);
    if (st == STOF_OK)
        st = check_xy(L, x, y);
    if (st != STOF_OK)
        return st;
    const stof_api *api = L->ctx->api;
    if (api->cuCtxPushCurrent(L->ctx->device.pctx) != CUDA_SUCCESS)
        return (stof_status)layer_fail(
            L, STOF_ERR_CUDA, "cannot make the device's context current");
    st = run_steps(L, wp, (CUdeviceptr)(uintptr_t)x, (CUdeviceptr)(uintptr_t)y,
                   (CUstream)stream);
    CUcontext popped;
    api->cuCtxPopCurrent(&popped);
    if (st == STOF_OK)
        L->errmsg[0] = '\0';
    return st;
}

static void graph_drop(stof_layer *L)
{
    const stof_api *api = L->ctx->api;
    if (L->gexec)
        api->cuGraphExecDestroy(L->gexec);
    if (L->graph)
        api->cuGraphDestroy(L->graph);
    L->gexec = NULL;
    L->graph = NULL;
    L->graph_key = 0;
}

static stof_status stack_enqueue(stof_layer *L, int n_layers,
                                 const CUdeviceptr *wps, const void *x,
                                 void *y, CUstream stream)
{
    for (int i = 0; i < n_layers; i++) {
        stof_status st =
            run_steps(L, wps + (size_t)i * SYM_COUNT,
                      (CUdeviceptr)(uintptr_t)(i ? y : x),
                      (CUdeviceptr)(uintptr_t)y, stream);
        if (st != STOF_OK)
            return st;
    }
    return STOF_OK;
}

stof_status stof_layer_stack_run(stof_layer *L, int n_layers,
                                 const stof_layer_weights *w, const void *x,
                                 void *y, void *stream, unsigned flags)
{
    if (!L)
        return STOF_ERR_INVALID_ARGUMENT;
    if (n_layers < 1 || !w)
        return (stof_status)layer_fail(L, STOF_ERR_INVALID_ARGUMENT,
                                       n_layers < 1 ? "n_layers %d < 1"
                                                    : "weights is NULL (%d)",
                                       n_layers);
    if (flags & ~STOF_STACK_GRAPH)
        return (stof_status)layer_fail(L, STOF_ERR_INVALID_ARGUMENT,
                                       "flags 0x%x: unknown bits", flags);
    stof_status st = check_xy(L, x, y);
    if (st != STOF_OK)
        return st;
    CUdeviceptr *wps = malloc(sizeof(CUdeviceptr) * SYM_COUNT *
                              (size_t)n_layers);
    if (!wps)
        return (stof_status)layer_fail(L, STOF_ERR_OUT_OF_MEMORY,
                                       "out of memory");
    for (int i = 0; i < n_layers && st == STOF_OK; i++) {
        st = weights_ptrs(L, &w[i], wps + (size_t)i * SYM_COUNT);
        if (st != STOF_OK) {
            char m[sizeof(L->errmsg)];
            snprintf(m, sizeof(m), "%s", L->errmsg);
            layer_fail(L, st, "layer %d: %s", i, m);
        }
    }
    const stof_api *api = L->ctx->api;
    if (st == STOF_OK &&
        api->cuCtxPushCurrent(L->ctx->device.pctx) != CUDA_SUCCESS)
        st = (stof_status)layer_fail(L, STOF_ERR_CUDA,
                                     "cannot make the device's context current");
    else if (st == STOF_OK) {
        CUstream s = (CUstream)stream;
        if (!(flags & STOF_STACK_GRAPH)) {
            st = stack_enqueue(L, n_layers, wps, x, y, s);
        } else {
            uint64_t key = XXH3_64bits(wps, sizeof(CUdeviceptr) * SYM_COUNT *
                                                (size_t)n_layers);
            const uintptr_t xy[3] = {(uintptr_t)x, (uintptr_t)y,
                                     (uintptr_t)n_layers};
            key = XXH3_64bits_withSeed(xy, sizeof(xy), key);
            CUstreamCaptureStatus cs = CU_STREAM_CAPTURE_STATUS_NONE;
            if (api->cuStreamIsCapturing(s, &cs) == CUDA_SUCCESS &&
                cs != CU_STREAM_CAPTURE_STATUS_NONE)
                st = (stof_status)layer_fail(
                    L, STOF_ERR_INVALID_ARGUMENT,
                    "STOF_STACK_GRAPH on a stream that is being captured: "
                    "pass flags 0 and let the caller's graph hold the "
                    "launches");
            if (st == STOF_OK && (!L->gexec || L->graph_key != key)) {
                graph_drop(L);
                CUresult r = api->cuStreamBeginCapture(
                    L->cap_stream, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL);
                if (r != CUDA_SUCCESS) {
                    st = (stof_status)stof__cuda_fail(L->ctx, r,
                                                      "cuStreamBeginCapture",
                                                      __FILE__, __LINE__);
                    layer_fail(L, st, "%s", stof_errmsg(L->ctx));
                } else {
                    st = stack_enqueue(L, n_layers, wps, x, y, L->cap_stream);
                    CUgraph g = NULL;
                    r = api->cuStreamEndCapture(L->cap_stream, &g);
                    if (st == STOF_OK && r != CUDA_SUCCESS) {
                        st = (stof_status)stof__cuda_fail(
                            L->ctx, r, "cuStreamEndCapture", __FILE__,
                            __LINE__);
                        layer_fail(L, st, "%s", stof_errmsg(L->ctx));
                    }
                    L->graph = g;
                    if (st == STOF_OK) {
                        r = api->cuGraphInstantiate(&L->gexec, g, 0);
                        if (r != CUDA_SUCCESS) {
                            L->gexec = NULL;
                            st = (stof_status)stof__cuda_fail(
                                L->ctx, r, "cuGraphInstantiate", __FILE__,
                                __LINE__);
                            layer_fail(L, st, "%s", stof_errmsg(L->ctx));
                        }
                    }
                    if (st == STOF_OK)
                        L->graph_key = key;
                    else
                        graph_drop(L);
                }
            }
            if (st == STOF_OK) {
                CUresult r = api->cuGraphLaunch(L->gexec, s);
                if (r != CUDA_SUCCESS) {
                    st = (stof_status)stof__cuda_fail(L->ctx, r,
                                                      "cuGraphLaunch",
                                                      __FILE__, __LINE__);
                    layer_fail(L, st, "%s", stof_errmsg(L->ctx));
                }
            }
        }
        CUcontext popped;
        api->cuCtxPopCurrent(&popped);
    }
    free(wps);
    if (st == STOF_OK)
        L->errmsg[0] = '\0';
    return st;
}

/* --- keys ------------------------------------------------------------------ */

static const char *dtype_str(stof_dtype t)
{
    return t == STOF_DTYPE_FP16 ? "fp16" : "bf16";
}

static void hash_key(const char *text, char key[33])
{
    XXH128_hash_t h = XXH3_128bits(text, strlen(text));
    snprintf(key, 33, "%016llx%016llx", (unsigned long long)h.high64,
             (unsigned long long)h.low64);
}

/* Everything that decides the winners: the layer, the mask, the device,
 * the versions (cuBLASLt's too: its algorithms are stored). */
static void layer_key(stof_layer *L, const char *mask_hex)
{
    const stof_device *dev = &L->ctx->device;
    const stof_layer_desc *d = &L->d;
    snprintf(L->key_text, sizeof(L->key_text),
             "op=layer;v=1;mask=%s;batch=%d;seq=%d;hidden=%d;heads=%d;"
             "ffn=%d;dtype=%s;act=%d;norm=%d;pre=%d;eps=%a;device=%s;"
             "cc=%d.%d;sms=%d;driver=%d;nvrtc=%d.%d;stof=%s;"
             "templates=%016llx;cublaslt=%zu",
             mask_hex, d->batch, d->seq, d->hidden, d->heads, d->ffn,
             dtype_str(d->dtype), (int)d->act, (int)d->norm, d->pre_norm,
             (double)L->eps, dev->name, dev->cc_major, dev->cc_minor,
             dev->sm_count, dev->driver_version, dev->nvrtc_major,
             dev->nvrtc_minor, stof_version_string(),
             (unsigned long long)stof_template_hash(), stof__blaslt_version());
    hash_key(L->key_text, L->key);
}

static void op_key(const stof_layer *L, const char *slot, char key[33])
{
    char text[1100];
    snprintf(text, sizeof(text), "%s;slot=%s", L->key_text, slot);
    hash_key(text, key);
}

/* --- loading kernels -------------------------------------------------------- */

static void gemm_unload(stof_layer *L, gemm_op *g)
{
    if (g->mod)
        L->ctx->api->cuModuleUnload(g->mod);
    stof__blaslt_free(&g->ltg);
    g->mod = NULL;
    g->fn = NULL;
    g->ok = 0;
}

static void norm_unload(stof_layer *L, norm_op *n)
{
    if (n->mod)
        L->ctx->api->cuModuleUnload(n->mod);
    n->mod = NULL;
    n->fn = NULL;
    n->ok = 0;
}

static stof_status gemm_load_template(stof_layer *L, gemm_op *g,
                                      const stof_gemm_cfg *c,
                                      const void *cubin)
{
    gemm_unload(L, g);
    stof_status st = stof__gemm_load_cubin(L->ctx, c, &g->epi, g->N, cubin,
                                           &g->mod, &g->fn);
    if (st == STOF_OK) {
        g->cfg = *c;
        g->lt = 0;
        g->ok = 1;
    }
    return st;
}

static stof_status gemm_load_lt(stof_layer *L, gemm_op *g, const void *algo)
{
    gemm_unload(L, g);
    stof_status st = stof__blaslt_create(L->ctx, L->d.dtype, g->M, g->N, g->K,
                                         g->K, g->K, g->N, &g->epi, 1,
                                         &g->ltg);
    if (st == STOF_OK)
        st = stof__blaslt_set_algo(L->ctx, g->ltg, algo);
    if (st == STOF_OK) {
        g->lt = 1;
        g->ok = 1;
    } else {
        stof__blaslt_free(&g->ltg);
    }
    return st;
}

static stof_status norm_load(stof_layer *L, norm_op *n, int warps,
                             const void *cubin)
{
    norm_unload(L, n);
    stof_status st = (stof_status)stof__module_load(L->ctx, cubin, "stof_norm",
                                                    0, &n->mod, &n->fn);
    if (st == STOF_OK) {
        n->warps = warps;
        n->ok = 1;
    }
    return st;
}

static void unload_unused(stof_layer *L)
{
    int used_g[G_COUNT] = {0}, used_n[N_COUNT] = {0};
    for (int i = 0; i < L->n_steps; i++) {
        if (L->steps[i].kind == STEP_GEMM)
            used_g[L->steps[i].op] = 1;
        else if (L->steps[i].kind == STEP_NORM)
            used_n[L->steps[i].op] = 1;
    }
    for (int i = 0; i < G_COUNT; i++)
        if (!used_g[i])
            gemm_unload(L, &L->g[i]);
    for (int i = 0; i < N_COUNT; i++)
        if (!used_n[i])
            norm_unload(L, &L->n[i]);
}

/* --- the database ------------------------------------------------------------ */

static void record_base(const stof_layer *L, const char *mask_hex,
                        const char *spec, stof_db_record *r)
{
    memset(r, 0, sizeof(*r));
    snprintf(r->mask_digest, sizeof(r->mask_digest), "%s", mask_hex);
    if (spec)
        snprintf(r->mask_spec, sizeof(r->mask_spec), "%s", spec);
    snprintf(r->dtype, sizeof(r->dtype), "%s", dtype_str(L->d.dtype));
    stof__db_record_env(L->ctx, r);
    snprintf(r->arch, sizeof(r->arch), "%s", L->ctx->device.arch);
    r->verified = 1;
}

int stof__layer_record_check(const stof_db_record *r, char *why, size_t n)
{
    if (!strcmp(r->op, "layer")) {
        int ja = -1, jb = -1;
        if (strcmp(r->kernel, "scheme") != 0 ||
            sscanf(r->config, "{\"ja\":%d,\"jb\":%d", &ja, &jb) != 2 ||
            ja < 0 || ja >= J_COUNT || jb < 0 || jb >= J_COUNT)
            return stof__why(why, n, "malformed layer scheme");
        return 1;
    }
    if (!strcmp(r->op, "norm")) {
        int warps = 0;
        if (strcmp(r->kernel, "norm") != 0 ||
            sscanf(r->config, "{\"warps\":%d", &warps) != 1 || warps < 1 ||
            warps > 32)
            return stof__why(why, n, "malformed norm configuration");
        return 1;
    }
    if (strcmp(r->op, "gemm") != 0)
        return stof__why(why, n, "not a layer record");
    if (!strcmp(r->kernel, "cublaslt")) {
        size_t ver = 0;
        if (sscanf(r->config, "{\"lt\":%zu", &ver) != 1 ||
            r->cubin_size != STOF_BLASLT_ALGO_BYTES)
            return stof__why(why, n, "malformed cuBLASLt algorithm");
        return 1;
    }
    stof_gemm_cfg c;
    stof_gemm_epi e;
    char cw[200];
    if (strcmp(r->kernel, "gemm") != 0 ||
        !stof__gemm_cfg_parse(r->config, &c, &e))
        return stof__why(why, n, "malformed GEMM configuration");
    if (r->seq_q < 1 || r->seq_k < 1 ||
        !stof__gemm_cfg_valid(NULL, &c, &e, r->seq_q, r->seq_k, cw,
                              sizeof(cw)))
        return stof__why(why, n, "invalid GEMM configuration: %s",
                         r->seq_q < 1 || r->seq_k < 1 ? "sizes" : cw);
    return 1;
}

static stof_status verify_loaded(stof_layer *L, stof_db *db,
                                 const stof_db_record *recs,
                                 const int *step_of, int n);

/* Load the scheme and its kernels stored under L's keys. STOF_OK, or
 * STOF_ERR_NOT_FOUND (a miss, or something unusable: logged). */
static stof_status from_db(stof_layer *L)
{
    stof_db *db = stof__ctx_db(L->ctx);
    stof_db_record rec;
    if (!db || stof__db_lookup(db, L->key, &rec) != STOF_OK)
        return STOF_ERR_NOT_FOUND;
    int ja = -1, jb = -1;
    const int ok = strcmp(rec.op, "layer") == 0 &&
                   sscanf(rec.config, "{\"ja\":%d,\"jb\":%d", &ja, &jb) == 2 &&
                   ja >= 0 && ja < J_COUNT && jb >= 0 && jb < J_COUNT;
    L->layer_ms = rec.time_ms;
    L->model_ms = rec.model_ms;
    stof__db_record_clear(&rec);
    if (!ok) {
        stof__log(L->ctx, STOF_LOG_WARN,
                  "layer record %s is malformed; tuning again", L->key);
        return STOF_ERR_NOT_FOUND;
    }
    build_steps(L, ja, jb);
    stof_status st = STOF_OK;
    /* The kernels' records that this host has not verified yet. */
    stof_db_record fresh[MAX_STEPS];
    int fresh_step[MAX_STEPS], n_fresh = 0;
    for (int i = 0; i < L->n_steps && st == STOF_OK; i++) {
        const step *s = &L->steps[i];
        if (s->kind == STEP_ATTN)
            continue;
        const char *slot = s->kind == STEP_GEMM ? g_slot[s->op] : n_slot[s->op];
        char key[33];
        op_key(L, slot, key);
        if (stof__db_lookup(db, key, &rec) != STOF_OK) {
            stof__log(L->ctx, STOF_LOG_WARN,
                      "layer %s: the record of its %s kernel is missing; "
                      "tuning again",
                      L->key, slot);
            st = STOF_ERR_NOT_FOUND;
            break;
        }
        if (s->kind == STEP_GEMM) {
            gemm_op *g = &L->g[s->op];
            stof_gemm_cfg c;
            stof_gemm_epi e;
            size_t ver = 0;
            if (strcmp(rec.kernel, "cublaslt") == 0 &&
                sscanf(rec.config, "{\"lt\":%zu", &ver) == 1 &&
                ver == stof__blaslt_version() &&
                rec.cubin_size == STOF_BLASLT_ALGO_BYTES)
                st = gemm_load_lt(L, g, rec.cubin);
            else if (strcmp(rec.kernel, "gemm") == 0 &&
                     stof__gemm_cfg_parse(rec.config, &c, &e) &&
                     memcmp(&e, &g->epi, sizeof(e)) == 0 && rec.cubin)
                st = gemm_load_template(L, g, &c, rec.cubin);
            else
                st = STOF_ERR_NOT_FOUND;
            g->ms = rec.time_ms;
            g->model_ms = rec.model_ms;
            g->n_timed = rec.n_candidates;
        } else {
            norm_op *n = &L->n[s->op];
            int warps = 0;
            if (strcmp(rec.kernel, "norm") == 0 &&
                sscanf(rec.config, "{\"warps\":%d", &warps) == 1 &&
                warps >= 1 && warps <= 32 && rec.cubin)
                st = norm_load(L, n, warps, rec.cubin);
            else
                st = STOF_ERR_NOT_FOUND;
            n->ms = rec.time_ms;
        }
        if (st != STOF_OK)
            stof__log(L->ctx, STOF_LOG_WARN,
                      "layer %s: its stored %s kernel cannot be used (%s); "
                      "tuning again",
                      L->key, slot, stof_status_str(st));
        if (st == STOF_OK && !stof__db_trusted(db, &rec) &&
            n_fresh < MAX_STEPS) {
            fresh[n_fresh] = rec;
            fresh[n_fresh].cubin = NULL;
            fresh_step[n_fresh++] = i;
        }
        stof__db_record_clear(&rec);
    }
    if (st == STOF_OK && n_fresh)
        st = verify_loaded(L, db, fresh, fresh_step, n_fresh);
    if (st != STOF_OK) {
        for (int i = 0; i < G_COUNT; i++)
            gemm_unload(L, &L->g[i]);
        for (int i = 0; i < N_COUNT; i++)
            norm_unload(L, &L->n[i]);
        return STOF_ERR_NOT_FOUND;
    }
    return STOF_OK;
}

/* --- tuning ---------------------------------------------------------------- */

#define FLUSH_BYTES (128u << 20)
#define MAX_TPL 8   /* template candidates timed per GEMM */
#define MAX_LT 8    /* cuBLASLt algorithms timed per GEMM */
#define VROWS 6     /* rows checked against the C reference */

typedef struct cjob {
    const stof_layer *L;
    int is_norm, op;
    stof_gemm_cfg cfg;
    int warps;
    double model_ms;
    void *cubin;
    size_t size;
    stof_status st;
    char err[512];
} cjob;

static void compile_one(void *user, int i)
{
    cjob *j = &((cjob *)user)[i];
    stof_context *tmp = calloc(1, sizeof(*tmp));
    if (!tmp) {
        j->st = STOF_ERR_OUT_OF_MEMORY;
        snprintf(j->err, sizeof(j->err), "out of memory");
        return;
    }
    tmp->api = j->L->ctx->api;
    tmp->device = j->L->ctx->device;
    if (j->is_norm)
        j->st = norm_compile(tmp, j->L, &j->L->n[j->op], j->warps, &j->cubin,
                             &j->size);
    else
        j->st = stof__gemm_compile(tmp, j->L->d.dtype, &j->cfg,
                                   &j->L->g[j->op].epi, j->L->g[j->op].N, NULL,
                                   &j->cubin, &j->size);
    if (j->st != STOF_OK)
        snprintf(j->err, sizeof(j->err), "%.511s", tmp->errmsg);
    free(tmp);
}

typedef struct tuner {
    stof_layer *L;
    CUdeviceptr scratch, flush;
    CUdeviceptr wp[SYM_COUNT];
    CUdeviceptr x, y;
    CUevent e0, e1;
    int reps;
    double deadline;       /* seconds on the monotonic clock; 0 = none */
    int rows[VROWS], n_rows;
    float tol;
    aux_kernels aux;
    float *w_host[G_COUNT]; /* each GEMM's scratch weight, fetched once */
} tuner;

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Rows [rows] of a [*][ld] device matrix, ncols each, as floats. */
static int fetch_rows(const tuner *t, CUdeviceptr p, int64_t ld, int ncols,
                      float *out)
{
    const stof_api *api = t->L->ctx->api;
    uint16_t *h = malloc(sizeof(uint16_t) * (size_t)ncols);
    if (!h)
        return 1;
    int rc = 0;
    for (int r = 0; r < t->n_rows && !rc; r++) {
        rc = api->cuMemcpyDtoH(h, p + (CUdeviceptr)((int64_t)t->rows[r] * ld * 2),
                               (size_t)ncols * 2) != CUDA_SUCCESS;
        for (int i = 0; i < ncols && !rc; i++)
            out[(size_t)r * ncols + i] = stof__half_to_f32(h[i], t->L->d.dtype);
    }
    free(h);
    return rc;
}

static int fetch_vec(const tuner *t, CUdeviceptr p, size_t n, float *out)
{
    if (!p)
        return 0;
    uint16_t *h = malloc(sizeof(uint16_t) * (n ? n : 1));
    if (!h)
        return 1;
    int rc = t->L->ctx->api->cuMemcpyDtoH(h, p, n * 2) != CUDA_SUCCESS;
    for (size_t i = 0; i < n && !rc; i++)
        out[i] = stof__half_to_f32(h[i], t->L->d.dtype);
    free(h);
    return rc;
}

static double rel_err(const float *a, const float *b, size_t n)
{
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        if (!isfinite(a[i]))
            return INFINITY;
        const double d = (double)a[i] - (double)b[i];
        num += d * d;
        den += (double)b[i] * b[i];
    }
    return sqrt(num / (den > 1e-30 ? den : 1e-30));
}

/* Check the last output of a step on the sampled rows against the C
 * reference; returns the relative error (INFINITY when it cannot tell). */
static double verify_step(tuner *t, const step *s)
{
    stof_layer *L = t->L;
    const int R = t->n_rows;
    const CUdeviceptr *wp = t->wp;
    CUdeviceptr pa = sym_ptr(L, wp, t->x, t->y, s->s[O_A]);
    CUdeviceptr pr = sym_ptr(L, wp, t->x, t->y, s->s[O_RES]);
    CUdeviceptr pb = sym_ptr(L, wp, t->x, t->y, s->s[O_BIAS]);
    CUdeviceptr pg = sym_ptr(L, wp, t->x, t->y, s->s[O_GAMMA]);
    CUdeviceptr pe = sym_ptr(L, wp, t->x, t->y, s->s[O_BETA]);
    CUdeviceptr po = sym_ptr(L, wp, t->x, t->y, s->s[O_OUT]);
    CUdeviceptr pp = sym_ptr(L, wp, t->x, t->y, s->s[O_PRE]);
    const int N = s->kind == STEP_GEMM ? L->g[s->op].N : L->d.hidden;
    const int K = s->kind == STEP_GEMM ? L->g[s->op].K : L->d.hidden;
    float *A = calloc((size_t)R * K, sizeof(float));
    float *W = NULL;
    if (s->kind == STEP_GEMM) {
        /* The weight is the same for every candidate of an op. */
        if (!t->w_host[s->op]) {
            float *w = malloc(sizeof(float) * (size_t)N * K);
            if (w && fetch_vec(t, sym_ptr(L, wp, t->x, t->y, s->s[O_W]),
                               (size_t)N * K, w)) {
                free(w);
                w = NULL;
            }
            t->w_host[s->op] = w;
        }
        W = t->w_host[s->op];
    }
    float *res = calloc((size_t)R * N, sizeof(float));
    float *vec = calloc((size_t)N * 3, sizeof(float));
    float *out = calloc((size_t)R * N, sizeof(float));
    float *pre = calloc((size_t)R * N, sizeof(float));
    float *ref = calloc((size_t)R * N, sizeof(float));
    float *ref_pre = calloc((size_t)R * N, sizeof(float));
    double err = INFINITY;
    if (!A || (s->kind == STEP_GEMM && !W) || !res || !vec || !out || !pre ||
        !ref || !ref_pre)
        goto done;
    float *bias = pb ? vec : NULL, *gamma = pg ? vec + N : NULL,
          *beta = pe ? vec + 2 * N : NULL;
    if (fetch_rows(t, pa, K, K, A) || (pr && fetch_rows(t, pr, N, N, res)) ||
        fetch_vec(t, pb, (size_t)N, vec) ||
        fetch_vec(t, pg, (size_t)N, vec + N) ||
        fetch_vec(t, pe, (size_t)N, vec + 2 * N) ||
        fetch_rows(t, po, N, N, out) || (pp && fetch_rows(t, pp, N, N, pre)))
        goto done;
    if (s->kind == STEP_GEMM) {
        stof__ref_gemm(A, W, bias, pr ? res : NULL, gamma, beta, R, N, K, K,
                       K, N, &L->g[s->op].epi, L->eps, L->d.dtype, ref,
                       pp ? ref_pre : NULL);
    } else {
        float *v = malloc(sizeof(float) * (size_t)N);
        if (!v)
            goto done;
        for (int r = 0; r < R; r++) {
            for (int i = 0; i < N; i++) {
                float x = A[(size_t)r * N + i];
                if (bias)
                    x += bias[i];
                if (pr)
                    x += res[(size_t)r * N + i];
                v[i] = stof__half_to_f32(stof__f32_to_half(x, L->d.dtype),
                                         L->d.dtype);
                ref_pre[(size_t)r * N + i] = v[i];
            }
            stof__ref_norm_row(v, gamma, beta, N, (int)L->d.norm, L->eps,
                               ref + (size_t)r * N);
        }
        free(v);
    }
    err = rel_err(out, ref, (size_t)R * N);
    if (pp) {
        double e2 = rel_err(pre, ref_pre, (size_t)R * N);
        if (!(e2 <= err))
            err = e2;
    }
done:
    free(A);
    free(res);
    free(vec);
    free(out);
    free(pre);
    free(ref);
    free(ref_pre);
    return err;
}

static stof_status launch_step(tuner *t, const step *s)
{
    stof_layer *L = t->L;
    if (s->kind == STEP_GEMM)
        return launch_gemm(L, &L->g[s->op], s, t->wp, t->x, t->y, NULL);
    return launch_norm(L, &L->n[s->op], s, t->wp, t->x, t->y, NULL);
}

static int cmp_float(const void *a, const void *b)
{
    const float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

/* Median time of `reps` runs of s (or of the whole layer when s is NULL),
 * each after flushing L2. 0 on success. */
static int time_it(tuner *t, const step *s, double *ms)
{
    stof_layer *L = t->L;
    const stof_api *api = L->ctx->api;
    float v[64];
    const int reps = t->reps < 64 ? t->reps : 64;
    for (int i = 0; i < reps + 2; i++) {
        if (i >= 2 &&
            api->cuMemsetD8(t->flush, (unsigned char)i, FLUSH_BYTES) !=
                CUDA_SUCCESS)
            return 1;
        if (api->cuEventRecord(t->e0, NULL) != CUDA_SUCCESS)
            return 1;
        stof_status st = s ? launch_step(t, s)
                           : run_steps(L, t->wp, t->x, t->y, NULL);
        if (st != STOF_OK || api->cuEventRecord(t->e1, NULL) != CUDA_SUCCESS ||
            api->cuEventSynchronize(t->e1) != CUDA_SUCCESS)
            return 1;
        if (i >= 2 && api->cuEventElapsedTime(&v[i - 2], t->e0, t->e1) !=
                          CUDA_SUCCESS)
            return 1;
    }
    qsort(v, (size_t)reps, sizeof(float), cmp_float);
    *ms = reps % 2 ? v[reps / 2] : 0.5 * (v[reps / 2 - 1] + v[reps / 2]);
    return 0;
}

/* The step that exercises op (gemm or norm) on scratch buffers, from the
 * scheme that uses it. */
static int probe_step(stof_layer *L, int is_norm, int op, step *out)
{
    for (int j = 0; j < J_COUNT; j++) {
        build_steps(L, j, j);
        for (int i = 0; i < L->n_steps; i++) {
            const step *s = &L->steps[i];
            if (s->kind == (is_norm ? STEP_NORM : STEP_GEMM) && s->op == op) {
                *out = *s;
                return 1;
            }
        }
    }
    return 0;
}

typedef struct best {
    int found, lt, lt_index, job;
    double ms, runner_up, first_ms;
    int n_timed, n_rejected;
} best;

static void consider(best *b, double ms, int lt, int lt_index, int job)
{
    if (!b->found || ms < b->ms) {
        if (b->found)
            b->runner_up = b->ms;
        b->found = 1;
        b->ms = ms;
        b->lt = lt;
        b->lt_index = lt_index;
        b->job = job;
    } else if (b->runner_up == 0 || ms < b->runner_up) {
        b->runner_up = ms;
    }
}

/* Verify and time one loaded candidate of a step; logs rejections. */
static void try_candidate(tuner *t, const step *s, const char *what,
                          best *b, int lt, int lt_index, int job)
{
    stof_layer *L = t->L;
    double err = INFINITY, ms = 0;
    stof_status st = launch_step(t, s);
    if (st == STOF_OK &&
        L->ctx->api->cuCtxSynchronize() != CUDA_SUCCESS)
        st = STOF_ERR_CUDA;
    if (st == STOF_OK)
        err = verify_step(t, s);
    if (st != STOF_OK || !(err <= t->tol)) {
        b->n_rejected++;
        stof__log(L->ctx, STOF_LOG_WARN,
                  "layer tune: %s rejected: %s (relative error %.3g, "
                  "tolerance %.3g)",
                  what, st != STOF_OK ? stof_status_str(st) : "wrong result",
                  err, (double)t->tol);
        return;
    }
    if (time_it(t, s, &ms)) {
        b->n_rejected++;
        stof__log(L->ctx, STOF_LOG_WARN, "layer tune: %s: timing failed",
                  what);
        return;
    }
    b->n_timed++;
    stof__log(L->ctx, STOF_LOG_DEBUG, "layer tune: %s %.4f ms (err %.2g)",
              what, ms, err);
    if (!lt && job >= 0 && b->first_ms == 0)
        b->first_ms = ms;
    consider(b, ms, lt, lt_index, job);
}

static int cmp_model(const void *a, const void *b)
{
    const cjob *x = a, *y = b;
    return (x->model_ms > y->model_ms) - (x->model_ms < y->model_ms);
}

/* The template candidates of every GEMM and norm op in use: ranked by the
 * cost model, the best few of each. */
static int collect_jobs(stof_layer *L, int per_op, int norm_cfgs,
                        cjob **out)
{
    const stof_device *dev = &L->ctx->device;
    const int cap = G_COUNT * MAX_TPL + N_COUNT * 3;
    cjob *jobs = calloc((size_t)cap, sizeof(*jobs));
    stof_gemm_cfg *cands = malloc(sizeof(*cands) * 256);
    cjob *ranked = malloc(sizeof(*ranked) * 256);
    int n = 0;
    if (!jobs || !cands || !ranked) {
        free(jobs);
        free(cands);
        free(ranked);
        return -1;
    }
    for (int i = 0; i < G_COUNT; i++) {
        gemm_op *g = &L->g[i];
        if (!g->used)
            continue;
        const int nc = stof__gemm_candidates(dev, &g->epi, g->M, g->N, g->K,
                                             cands, 256);
        for (int c = 0; c < nc; c++) {
            memset(&ranked[c], 0, sizeof(ranked[c]));
            ranked[c].L = L;
            ranked[c].op = i;
            ranked[c].cfg = cands[c];
            ranked[c].model_ms =
                stof__gemm_model_ms(dev, &cands[c], &g->epi, g->M, g->N, g->K);
        }
        qsort(ranked, (size_t)nc, sizeof(*ranked), cmp_model);
        g->model_ms = nc ? ranked[0].model_ms : 0;
        for (int c = 0; c < nc && c < per_op && n < cap; c++)
            jobs[n++] = ranked[c];
    }
    for (int i = 0; i < N_COUNT; i++) {
        norm_op *nn = &L->n[i];
        if (!nn->used)
            continue;
        nn->model_ms = norm_model_ms(L, nn);
        static const int warps[3] = {4, 8, 16};
        for (int w = 0; w < norm_cfgs && w < 3 && n < cap; w++) {
            memset(&jobs[n], 0, sizeof(jobs[n]));
            jobs[n].L = L;
            jobs[n].is_norm = 1;
            jobs[n].op = i;
            jobs[n].warps = warps[w];
            n++;
        }
    }
    free(cands);
    free(ranked);
    *out = jobs;
    return n;
}

static void free_jobs(cjob *jobs, int n)
{
    for (int i = 0; i < n; i++)
        free(jobs[i].cubin);
    free(jobs);
}

static stof_status tuner_start(stof_layer *L, tuner *t)
{
    memset(t, 0, sizeof(*t));
    t->L = L;
    stof_context *ctx = L->ctx;
    const stof_api *api = ctx->api;
    const stof_layer_desc *d = &L->d;
    const size_t h = (size_t)d->hidden, f = (size_t)d->ffn,
                 M = (size_t)L->M;
    /* Scratch weights, X and Y, each 256-byte aligned. */
    const size_t sizes[SYM_COUNT] = {
        [SYM_X] = M * h, [SYM_Y] = M * h, [SYM_WQKV] = 3 * h * h,
        [SYM_BQKV] = 3 * h, [SYM_WO] = h * h, [SYM_BO] = h,
        [SYM_W1] = f * h, [SYM_B1] = f, [SYM_W2] = h * f, [SYM_B2] = h,
        [SYM_G1] = h, [SYM_BE1] = h, [SYM_G2] = h, [SYM_BE2] = h};
    size_t total = 0;
    for (int s = 0; s < SYM_COUNT; s++)
        total += (sizes[s] * 2 + 255) / 256 * 256;
    STOF_CU(ctx, api->cuMemAlloc(&t->scratch, total));
    CUdeviceptr p = t->scratch;
    for (int s = 0; s < SYM_COUNT; s++) {
        if (!sizes[s])
            continue;
        if (s == SYM_X)
            t->x = p;
        else if (s == SYM_Y)
            t->y = p;
        else
            t->wp[s] = p;
        p += (sizes[s] * 2 + 255) / 256 * 256;
    }
    if (d->norm == STOF_NORM_RMS)
        t->wp[SYM_BE1] = t->wp[SYM_BE2] = 0;
    STOF_CU(ctx, api->cuMemAlloc(&t->flush, FLUSH_BYTES));
    STOF_CU(ctx, api->cuEventCreate(&t->e0, CU_EVENT_DEFAULT));
    STOF_CU(ctx, api->cuEventCreate(&t->e1, CU_EVENT_DEFAULT));
    /* The fill kernel. */
    char dt[32];
    snprintf(dt, sizeof(dt), "DTYPE=%d", (int)d->dtype);
    const char *defs[] = {dt};
    void *cubin = NULL;
    size_t size = 0;
    stof_status st = (stof_status)stof__jit_compile(ctx, "layer_ops.cu", defs,
                                                    1, NULL, &cubin, &size);
    if (st == STOF_OK)
        st = (stof_status)stof__module_load(ctx, cubin, "stof_fill", 0,
                                            &t->aux.mod, &t->aux.fill);
    free(cubin);
    if (st != STOF_OK)
        return st;
    uint64_t seed = ctx->settings.tuning_seed ? ctx->settings.tuning_seed
                                              : 0x5eed0f57ull;
    /* Weights ~ U(-1, 1) / sqrt(K) keep the GEMM outputs near unit scale;
     * gamma near 1. */
    for (int s = SYM_FIRST_W; s < SYM_COUNT && st == STOF_OK; s++) {
        if (!t->wp[s])
            continue;
        float scale = 0.1f, offset = 0.0f;
        if (s == SYM_WQKV || s == SYM_WO || s == SYM_W1)
            scale = 1.7f / sqrtf((float)h);
        else if (s == SYM_W2)
            scale = 1.7f / sqrtf((float)f);
        else if (s == SYM_G1 || s == SYM_G2)
            offset = 1.0f;
        st = fill(L, &t->aux, t->wp[s], sizes[s], seed + (uint64_t)s, scale,
                  offset);
    }
    if (st == STOF_OK)
        st = fill(L, &t->aux, t->x, M * h, seed + 100, 1.0f, 0.0f);
    for (int s = SYM_FIRST_BUF; s <= SYM_LAST_BUF && st == STOF_OK; s++)
        st = fill(L, &t->aux, L->buf[s], M * (size_t)tok_ld(L, s),
                  seed + 200 + (uint64_t)s, 1.0f, 0.0f);
    if (st == STOF_OK && api->cuCtxSynchronize() != CUDA_SUCCESS)
        st = stof__fail(ctx, STOF_ERR_CUDA, "filling the scratch data failed");
    /* Sampled rows: the first, the last and a few in between. */
    uint64_t r = seed;
    t->rows[t->n_rows++] = 0;
    if (L->M > 1)
        t->rows[t->n_rows++] = L->M - 1;
    while (t->n_rows < VROWS && t->n_rows < L->M) {
        r = r * 6364136223846793005ull + 1442695040888963407ull;
        t->rows[t->n_rows++] = (int)((r >> 33) % (uint64_t)L->M);
    }
    t->reps = ctx->settings.tuning_reps > 0 ? ctx->settings.tuning_reps : 15;
    t->tol = d->dtype == STOF_DTYPE_FP16 ? 1e-2f : 2.5e-2f;
    if (ctx->settings.tuning_budget_s > 0)
        t->deadline = now_s() + ctx->settings.tuning_budget_s;
    return st;
}

static void tuner_stop(tuner *t)
{
    for (int i = 0; i < G_COUNT; i++)
        free(t->w_host[i]);
    const stof_api *api = t->L->ctx->api;
    if (t->aux.mod)
        api->cuModuleUnload(t->aux.mod);
    if (t->e0)
        api->cuEventDestroy(t->e0);
    if (t->e1)
        api->cuEventDestroy(t->e1);
    if (t->flush)
        api->cuMemFree(t->flush);
    if (t->scratch)
        api->cuMemFree(t->scratch);
}

/* The first use of layer kernels from the database on this host (db.h,
 * "Local trust"): run each loaded kernel of recs (step step_of[i]) on the
 * tuner's seeded scratch data and check its sampled rows against the C
 * reference, as tuning does. Trusted records are remembered; a record
 * that fails is logged (and deleted from the user database) and the
 * layer is tuned again (STOF_ERR_NOT_FOUND). */
static stof_status verify_loaded(stof_layer *L, stof_db *db,
                                 const stof_db_record *recs,
                                 const int *step_of, int n)
{
    const double t0 = now_s();
    tuner t;
    stof_status st = tuner_start(L, &t);
    int failed = 0;
    for (int i = 0; i < n && st == STOF_OK && !failed; i++) {
        const step *s = &L->steps[step_of[i]];
        double err = INFINITY;
        stof_status rs = launch_step(&t, s);
        if (rs == STOF_OK && L->ctx->api->cuCtxSynchronize() != CUDA_SUCCESS)
            rs = STOF_ERR_CUDA;
        if (rs == STOF_OK)
            err = verify_step(&t, s);
        if (rs == STOF_OK && err <= t.tol) {
            stof__db_trust(db, &recs[i]);
            continue;
        }
        failed = 1;
        stof__log(L->ctx, STOF_LOG_WARN,
                  "layer %s: tuning record %s (%s database, made on %s) "
                  "failed verification on this GPU: %s (relative error "
                  "%.3g); tuning again",
                  L->key, recs[i].key, recs[i].source, recs[i].host,
                  rs != STOF_OK ? stof_status_str(rs) : "wrong result", err);
        if (recs[i].layer == 0)
            stof__db_forget(db, recs[i].key, recs[i].content_hash);
    }
    tuner_stop(&t);
    L->verify_ms = (now_s() - t0) * 1e3;
    if (st != STOF_OK) {
        stof__log(L->ctx, STOF_LOG_WARN,
                  "layer %s: its stored kernels could not be verified (%s); "
                  "tuning again",
                  L->key, stof_errmsg(L->ctx));
        return STOF_ERR_NOT_FOUND;
    }
    if (!failed)
        stof__log(L->ctx, STOF_LOG_INFO,
                  "layer %s: %d stored kernel(s) verified on this GPU in "
                  "%.1f ms",
                  L->key, n, L->verify_ms);
    return failed ? STOF_ERR_NOT_FOUND : STOF_OK;
}

typedef struct winner {
    void *cubin;           /* template / norm: borrowed from the job */
    size_t size;
    uint8_t algo[STOF_BLASLT_ALGO_BYTES];
    best b;
} winner;

static void gemm_config_json(const gemm_op *g, char *buf, size_t n)
{
    if (g->lt) {
        snprintf(buf, n,
                 "{\"lt\":%zu,\"bias\":%d,\"act\":%d,\"res\":%d}",
                 stof__blaslt_version(), g->epi.bias, g->epi.act,
                 g->epi.residual);
        return;
    }
    stof_str s = {0};
    stof__gemm_cfg_json(&g->cfg, &g->epi, &s);
    snprintf(buf, n, "%s", s.p && !s.oom ? s.p : "{}");
    stof__str_free(&s);
}

static void store_records(stof_layer *L, const stof_mask *m,
                          const char *mask_hex, const winner *wg,
                          const winner *wn, const tuner *t)
{
    stof_db *db = stof__ctx_db(L->ctx);
    if (!db || !stof__db_writable(db)) {
        stof__log(L->ctx, STOF_LOG_WARN,
                  "layer tuned but not stored: no writable tuning database");
        return;
    }
    const int replace = L->ctx->settings.tuning_mode == STOF_TUNE_FORCE;
    const char *spec = m->spec;
    stof_db_record r;
    int fails = 0;
    for (int i = 0; i < L->n_steps; i++) {
        const step *s = &L->steps[i];
        if (s->kind == STEP_ATTN)
            continue;
        record_base(L, mask_hex, spec, &r);
        const winner *w = s->kind == STEP_GEMM ? &wg[s->op] : &wn[s->op];
        if (s->kind == STEP_GEMM) {
            const gemm_op *g = &L->g[s->op];
            op_key(L, g_slot[s->op], r.key);
            snprintf(r.op, sizeof(r.op), "gemm");
            r.batch = g->M;
            r.seq_q = g->N;
            r.seq_k = g->K;
            snprintf(r.layout, sizeof(r.layout), "rows");
            snprintf(r.kernel, sizeof(r.kernel), "%s",
                     g->lt ? "cublaslt" : "gemm");
            gemm_config_json(g, r.config, sizeof(r.config));
            r.cubin = g->lt ? (void *)w->algo : w->cubin;
            r.cubin_size = g->lt ? STOF_BLASLT_ALGO_BYTES : w->size;
            r.model_ms = w->b.first_ms;
        } else {
            const norm_op *n = &L->n[s->op];
            op_key(L, n_slot[s->op], r.key);
            snprintf(r.op, sizeof(r.op), "norm");
            r.batch = L->M;
            r.seq_q = L->d.hidden;
            snprintf(r.layout, sizeof(r.layout), "rows");
            snprintf(r.kernel, sizeof(r.kernel), "norm");
            snprintf(r.config, sizeof(r.config),
                     "{\"warps\":%d,\"bias\":%d,\"res\":%d,\"pre\":%d,"
                     "\"norm\":%d}",
                     n->warps, n->bias, n->res, n->pre, (int)L->d.norm);
            r.cubin = w->cubin;
            r.cubin_size = w->size;
            r.model_ms = w->b.first_ms;
        }
        r.time_ms = w->b.ms;
        r.runner_up_ms = w->b.runner_up;
        r.n_candidates = w->b.n_timed;
        snprintf(r.measured, sizeof(r.measured),
                 "{\"method\":\"cuda events, median, L2 flushed\","
                 "\"reps\":%d,\"rejected\":%d,\"checked_rows\":%d,"
                 "\"tolerance\":%g}",
                 t->reps, w->b.n_rejected, t->n_rows, (double)t->tol);
        fails += stof__db_store(db, &r, replace, 1) != STOF_OK;
    }
    record_base(L, mask_hex, spec, &r);
    snprintf(r.key, sizeof(r.key), "%s", L->key);
    snprintf(r.op, sizeof(r.op), "layer");
    r.batch = L->d.batch;
    r.heads = L->d.heads;
    r.seq_q = r.seq_k = L->d.seq;
    r.head_dim = L->hd;
    snprintf(r.layout, sizeof(r.layout), "layer");
    snprintf(r.kernel, sizeof(r.kernel), "scheme");
    snprintf(r.config, sizeof(r.config),
             "{\"ja\":%d,\"jb\":%d,\"pre\":%d,\"hidden\":%d,\"ffn\":%d,"
             "\"act\":%d,\"norm\":%d}",
             L->ja, L->jb, L->d.pre_norm, L->d.hidden, L->d.ffn, (int)L->d.act,
             (int)L->d.norm);
    r.time_ms = L->layer_ms;
    r.model_ms = L->model_ms;
    r.n_candidates = J_COUNT;
    snprintf(r.measured, sizeof(r.measured),
             "{\"method\":\"cuda events, median, L2 flushed\",\"reps\":%d,"
             "\"what\":\"one layer, scratch weights\"}",
             t->reps);
    if (!fails)
        fails += stof__db_store(db, &r, replace, 1) != STOF_OK;
    if (fails)
        stof__log(L->ctx, STOF_LOG_WARN,
                  "layer %s: %d tuning record(s) could not be stored: %s",
                  L->key, fails, stof_errmsg(L->ctx));
}

static int pick_junction(const stof_layer *L, int g0, int n0, int measured)
{
    int best_j = -1;
    double best_t = INFINITY;
    for (int j = 0; j < J_COUNT; j++) {
        const double c = junction_cost(L, j, g0, n0, measured);
        if (c < best_t) {
            best_t = c;
            best_j = j;
        }
    }
    return best_j;
}

/* Stage 2: compile, check and time every candidate, keep the best of each
 * op, choose the scheme, time the layer, store. With model_only (cache-only
 * mode) cuBLASLt's heuristic choice, or else the cost model's first
 * template choice, of each op is loaded and nothing is timed. */
static stof_status tune(stof_layer *L, const stof_mask *m,
                        const char *mask_hex, int model_only)
{
    stof_context *ctx = L->ctx;
    const double t0 = now_s();
    const int top_k = ctx->settings.tuning_top_k > 0
                          ? ctx->settings.tuning_top_k
                          : 3;
    const int per_op = model_only ? 1 : (top_k + 1 < MAX_TPL ? top_k + 1
                                                             : MAX_TPL);
    cjob *jobs = NULL;
    const int nj = collect_jobs(L, per_op, model_only ? 1 : 3, &jobs);
    if (nj < 0)
        return stof__fail(ctx, STOF_ERR_OUT_OF_MEMORY, "out of memory");
    stof__log(ctx, STOF_LOG_INFO,
              "layer tune: %d tokens, hidden %d, ffn %d: compiling %d "
              "template kernels",
              L->M, L->d.hidden, L->d.ffn, nj);
    cjob *todo = jobs;
    stof__pool_run(ctx->settings.compile_threads, nj, compile_one, todo);
    winner wg[G_COUNT], wn[N_COUNT];
    memset(wg, 0, sizeof(wg));
    memset(wn, 0, sizeof(wn));
    tuner t;
    stof_status st = STOF_OK;
    if (model_only) {
        /* Nothing is run: no scratch data, no timing. */
        memset(&t, 0, sizeof(t));
        t.L = L;
    } else {
        st = tuner_start(L, &t);
    }
    for (int i = 0; i < G_COUNT && st == STOF_OK; i++) {
        gemm_op *g = &L->g[i];
        if (!g->used)
            continue;
        step s;
        probe_step(L, 0, i, &s);
        best *b = &wg[i].b;
        char what[128];
        /* Without timing, cuBLASLt's own heuristic choice (measured within
         * about 10% of its best on these shapes) beats the template's cost
         * model wherever it can express the epilogue. */
        char why_lt[256];
        stof_blaslt_gemm *first = NULL;
        if (model_only && stof__blaslt_available(why_lt, sizeof(why_lt)) &&
            stof__blaslt_epi_ok(&g->epi) &&
            stof__blaslt_create(ctx, L->d.dtype, g->M, g->N, g->K, g->K, g->K,
                                g->N, &g->epi, 1, &first) == STOF_OK) {
            stof__blaslt_algo_bytes(first, 0, wg[i].algo);
            stof__blaslt_free(&first);
            consider(b, 0.0, 1, 0, -1);
        }
        for (int j = 0; j < nj && !(model_only && b->found); j++) {
            cjob *jb = &jobs[j];
            if (jb->is_norm || jb->op != i)
                continue;
            if (jb->st != STOF_OK) {
                b->n_rejected++;
                stof__log(ctx, STOF_LOG_WARN,
                          "layer tune: %s template failed to compile: %s",
                          g_slot[i], jb->err);
                continue;
            }
            if (b->found && t.deadline > 0 && now_s() > t.deadline)
                break;
            if (gemm_load_template(L, g, &jb->cfg, jb->cubin) != STOF_OK)
                continue;
            snprintf(what, sizeof(what), "%s gemm %dx%dx%d %dx%d st%d",
                     g_slot[i], jb->cfg.block_m, jb->cfg.block_n,
                     jb->cfg.block_k, jb->cfg.warps_m, jb->cfg.warps_n,
                     jb->cfg.stages);
            if (model_only) {
                consider(b, 0.0, 0, 0, j);
                break;
            }
            try_candidate(&t, &s, what, b, 0, 0, j);
        }
        /* cuBLASLt: its heuristic's algorithms. */
        stof_blaslt_gemm *lt = NULL;
        char why[256];
        if (!model_only && stof__blaslt_available(why, sizeof(why)) &&
            stof__blaslt_epi_ok(&g->epi) &&
            stof__blaslt_create(ctx, L->d.dtype, g->M, g->N, g->K, g->K, g->K,
                                g->N, &g->epi, MAX_LT, &lt) == STOF_OK) {
            const int na = stof__blaslt_n_algos(lt);
            gemm_unload(L, g);
            g->ltg = lt;
            g->lt = 1;
            g->ok = 1;
            for (int a = 0; a < na; a++) {
                if (b->found && t.deadline > 0 && now_s() > t.deadline)
                    break;
                /* Run algorithm a through index 0: swap it to the front. */
                uint8_t bytes[STOF_BLASLT_ALGO_BYTES];
                stof__blaslt_algo_bytes(lt, a, bytes);
                stof_blaslt_gemm *one = NULL;
                if (stof__blaslt_create(ctx, L->d.dtype, g->M, g->N, g->K,
                                        g->K, g->K, g->N, &g->epi, 1,
                                        &one) != STOF_OK)
                    break;
                if (stof__blaslt_set_algo(ctx, one, bytes) != STOF_OK) {
                    stof__blaslt_free(&one);
                    continue;
                }
                g->ltg = one;
                snprintf(what, sizeof(what), "%s cublaslt algo %d", g_slot[i],
                         a);
                const int before = b->found ? b->job : -2;
                const double before_ms = b->ms;
                try_candidate(&t, &s, what, b, 1, a, -1);
                if (b->found && b->lt && b->lt_index == a &&
                    (before != b->job || before_ms != b->ms))
                    memcpy(wg[i].algo, bytes, sizeof(bytes));
                stof__blaslt_free(&one);
            }
            g->ltg = NULL;
            g->ok = 0;
            g->lt = 0;
            stof__blaslt_free(&lt);
        }
        /* Load the winner. */
        if (!b->found) {
            g->ok = 0;
            stof__log(ctx, STOF_LOG_INFO,
                      "layer tune: %s %dx%dx%d: no usable kernel%s", g_slot[i],
                      g->M, g->N, g->K,
                      i == G_A_NORM || i == G_B_NORM
                          ? " (the row-complete variant may not fit)"
                          : "");
            gemm_unload(L, g);
            continue;
        }
        stof_status ls;
        if (b->lt) {
            ls = gemm_load_lt(L, g, wg[i].algo);
        } else {
            wg[i].cubin = jobs[b->job].cubin;
            wg[i].size = jobs[b->job].size;
            ls = gemm_load_template(L, g, &jobs[b->job].cfg, wg[i].cubin);
        }
        if (ls != STOF_OK) {
            b->found = 0;
            gemm_unload(L, g);
            continue;
        }
        g->ms = b->ms;
        g->n_timed = b->n_timed;
        g->n_rejected = b->n_rejected;
        stof__log(ctx, STOF_LOG_INFO,
                  "layer tune: %-9s %6dx%5dx%5d  best %s %.4f ms of %d "
                  "timed (%d rejected)",
                  g_slot[i], g->M, g->N, g->K,
                  g->lt ? "cublaslt" : "template", b->ms, b->n_timed,
                  b->n_rejected);
    }
    for (int i = 0; i < N_COUNT && st == STOF_OK; i++) {
        norm_op *n = &L->n[i];
        if (!n->used)
            continue;
        step s;
        probe_step(L, 1, i, &s);
        best *b = &wn[i].b;
        for (int j = 0; j < nj; j++) {
            cjob *jb = &jobs[j];
            if (!jb->is_norm || jb->op != i)
                continue;
            if (jb->st != STOF_OK) {
                stof__log(ctx, STOF_LOG_WARN,
                          "layer tune: norm kernel failed to compile: %s",
                          jb->err);
                continue;
            }
            if (norm_load(L, n, jb->warps, jb->cubin) != STOF_OK)
                continue;
            if (model_only) {
                consider(b, 0.0, 0, 0, j);
                break;
            }
            char what[64];
            snprintf(what, sizeof(what), "%s w%d", n_slot[i], jb->warps);
            try_candidate(&t, &s, what, b, 0, 0, j);
        }
        if (b->found && norm_load(L, n, jobs[b->job].warps,
                                  jobs[b->job].cubin) == STOF_OK) {
            wn[i].cubin = jobs[b->job].cubin;
            wn[i].size = jobs[b->job].size;
            n->ms = b->ms;
        } else {
            norm_unload(L, n);
        }
    }
    if (st == STOF_OK) {
        /* The scheme: measured costs, or the model's. */
        int ja = pick_junction(L, G_A_RES, N_A_PLAIN, !model_only);
        int jb = L->d.pre_norm
                     ? 0
                     : pick_junction(L, G_B_RES, N_B_PLAIN, !model_only);
        /* The model has no figure for cuBLASLt: where it serves the
         * bias+residual GEMM, keep that GEMM and a norm kernel. */
        if (model_only && L->g[G_A_RES].ok && L->g[G_A_RES].lt &&
            L->n[N_A_PLAIN].ok)
            ja = J_RES_NORM;
        if (model_only && !L->d.pre_norm && L->g[G_B_RES].ok &&
            L->g[G_B_RES].lt && L->n[N_B_PLAIN].ok)
            jb = J_RES_NORM;
        int missing = ja < 0 || jb < 0;
        if (!missing) {
            build_steps(L, ja, jb);
            for (int i = 0; i < L->n_steps; i++) {
                const step *s = &L->steps[i];
                if ((s->kind == STEP_GEMM && !L->g[s->op].ok) ||
                    (s->kind == STEP_NORM && !L->n[s->op].ok))
                    missing = 1;
            }
        }
        if (missing)
            st = stof__fail(ctx, STOF_ERR_UNSUPPORTED,
                            "no kernel could be found for every step of the "
                            "layer (see the log for the rejected candidates)");
    }
    if (st == STOF_OK) {
        /* The model's scheme and first choices, as measured. */
        const int mja = pick_junction(L, G_A_RES, N_A_PLAIN, 0);
        const int mjb = L->d.pre_norm ? 0
                                      : pick_junction(L, G_B_RES, N_B_PLAIN, 0);
        double model = 0;
        const int keep_ja = L->ja, keep_jb = L->jb;
        build_steps(L, mja < 0 ? 0 : mja, mjb < 0 ? 0 : mjb);
        for (int i = 0; i < L->n_steps; i++) {
            const step *s = &L->steps[i];
            if (s->kind == STEP_GEMM)
                model += wg[s->op].b.first_ms ? wg[s->op].b.first_ms
                                              : wg[s->op].b.ms;
            else if (s->kind == STEP_NORM)
                model += wn[s->op].b.first_ms ? wn[s->op].b.first_ms
                                              : wn[s->op].b.ms;
        }
        build_steps(L, keep_ja, keep_jb);
        unload_unused(L);
        L->model_ms = model_only ? 0 : model;
        if (!model_only) {
            double ms = 0;
            if (time_it(&t, NULL, &ms) == 0)
                L->layer_ms = ms;
            L->tune_s = now_s() - t0;
            stof__log(ctx, STOF_LOG_INFO,
                      "layer tune: scheme %s / %s: %.4f ms a layer (%.1f s "
                      "of tuning)",
                      j_name[L->ja],
                      L->d.pre_norm ? "-" : j_name[L->jb], L->layer_ms,
                      L->tune_s);
            store_records(L, m, mask_hex, wg, wn, &t);
        }
    }
    tuner_stop(&t);
    free_jobs(jobs, nj);
    return st;
}

/* --- plan, describe, free -------------------------------------------------- */

static void layer_release(stof_layer *L)
{
    stof_context *ctx = L->ctx;
    const stof_api *api = ctx->api;
    if (ctx->device.ok && stof__ctx_push(ctx) == STOF_OK) {
        graph_drop(L);
        for (int i = 0; i < G_COUNT; i++)
            gemm_unload(L, &L->g[i]);
        for (int i = 0; i < N_COUNT; i++)
            norm_unload(L, &L->n[i]);
        if (L->cap_stream)
            api->cuStreamDestroy(L->cap_stream);
        if (L->lt_ws)
            api->cuMemFree(L->lt_ws);
        if (L->mem)
            api->cuMemFree(L->mem);
        stof__ctx_pop(ctx);
    }
    stof_plan_free(&L->attn);
    free(L);
}

void stof_layer_free(stof_layer **pl)
{
    if (!pl || !*pl)
        return;
    layer_release(*pl);
    *pl = NULL;
}

const char *stof_layer_errmsg(const stof_layer *L)
{
    return L ? L->errmsg : "layer is NULL";
}

static stof_status alloc_buffers(stof_layer *L)
{
    stof_context *ctx = L->ctx;
    const stof_api *api = ctx->api;
    size_t total = 0, off[SYM_COUNT] = {0};
    for (int s = SYM_FIRST_BUF; s <= SYM_LAST_BUF; s++) {
        off[s] = total;
        total += ((size_t)L->M * (size_t)tok_ld(L, s) * 2 + 255) / 256 * 256;
    }
    STOF_CU(ctx, api->cuMemAlloc(&L->mem, total));
    for (int s = SYM_FIRST_BUF; s <= SYM_LAST_BUF; s++)
        L->buf[s] = L->mem + off[s];
    char why[256];
    if (stof__blaslt_available(why, sizeof(why)))
        STOF_CU(ctx, api->cuMemAlloc(&L->lt_ws, STOF_BLASLT_WORKSPACE));
    else
        stof__log(ctx, STOF_LOG_INFO,
                  "cuBLASLt is not a candidate: %s", why);
    STOF_CU(ctx, api->cuStreamCreate(&L->cap_stream, CU_STREAM_NON_BLOCKING));
    return STOF_OK;
}

stof_status stof_layer_plan(stof_context *ctx, const stof_layer_desc *d,
                            const stof_mask *m, stof_layer **out)
{
    if (!ctx)
        return STOF_ERR_INVALID_ARGUMENT;
    STOF_CHECK_ARG(ctx, out, "layer (the output pointer) is NULL");
    *out = NULL;
    stof_status st = check_desc(ctx, d, m);
    if (st != STOF_OK)
        return st;
    if (!ctx->device.ok)
        return stof__fail(ctx, STOF_ERR_NO_DEVICE,
                          "stof_layer_plan needs a GPU: %s",
                          ctx->device.why[0] ? ctx->device.why
                                             : "no usable CUDA device");
    stof_layer *L = calloc(1, sizeof(*L));
    if (!L)
        return stof__fail(ctx, STOF_ERR_OUT_OF_MEMORY, "out of memory");
    L->ctx = ctx;
    L->d = *d;
    L->M = d->batch * d->seq;
    L->hd = d->hidden / d->heads;
    L->eps = d->norm_eps > 0 ? d->norm_eps : 1e-5f;
    init_ops(L);
    /* The attention reads Q, K, V from the [tokens][3 hidden] projection
     * and writes [tokens][hidden]. */
    stof_attention_desc ad;
    stof_attention_desc_init(&ad, d->batch, d->heads, d->seq, d->seq, L->hd,
                             d->dtype, STOF_LAYOUT_BSHD);
    ad.layout = STOF_LAYOUT_STRIDED;
    const int64_t h = d->hidden, s = d->seq;
    const int64_t qs[3] = {s * 3 * h, L->hd, 3 * h};
    const int64_t os[3] = {s * h, L->hd, h};
    memcpy(ad.q_stride, qs, sizeof(qs));
    memcpy(ad.k_stride, qs, sizeof(qs));
    memcpy(ad.v_stride, qs, sizeof(qs));
    memcpy(ad.o_stride, os, sizeof(os));
    const double t0 = now_s();
    st = stof_attention_plan(ctx, &ad, m, &L->attn);
    if (st != STOF_OK) {
        char msg[STOF_ERRMSG_MAX];
        snprintf(msg, sizeof(msg), "%s", stof_errmsg(ctx));
        free(L);
        return stof__fail(ctx, st, "stof_layer_plan: the attention: %s", msg);
    }
    char mask_hex[33];
    stof_mask_digest(m, NULL, mask_hex);
    layer_key(L, mask_hex);
    st = stof__ctx_push(ctx);
    if (st != STOF_OK) {
        stof_plan_free(&L->attn);
        free(L);
        return st;
    }
    st = alloc_buffers(L);
    if (st == STOF_OK) {
        const stof_tuning_mode mode = ctx->settings.tuning_mode;
        if (mode != STOF_TUNE_FORCE && from_db(L) == STOF_OK) {
            snprintf(L->source, sizeof(L->source), "database");
        } else if (mode == STOF_TUNE_CACHE_ONLY) {
            st = tune(L, m, mask_hex, 1);
            snprintf(L->source, sizeof(L->source), "model");
        } else {
            st = tune(L, m, mask_hex, 0);
            snprintf(L->source, sizeof(L->source), "tuned");
        }
    }
    stof__ctx_pop(ctx);
    if (st != STOF_OK) {
        char msg[STOF_ERRMSG_MAX];
        snprintf(msg, sizeof(msg), "%s", stof_errmsg(ctx));
        layer_release(L);
        return stof__fail(ctx, st, "stof_layer_plan: %s", msg);
    }
    L->tune_s = now_s() - t0;
    stof__log(ctx, STOF_LOG_INFO,
              "layer plan (%s) in %.3f s: scheme %s / %s", L->source,
              L->tune_s, j_name[L->ja], d->pre_norm ? "-" : j_name[L->jb]);
    *out = L;
    return stof__ok(ctx);
}

stof_status stof_layer_describe(const stof_layer *L, char *buf, size_t n,
                                size_t *needed)
{
    if (!L)
        return STOF_ERR_INVALID_ARGUMENT;
    const stof_layer_desc *d = &L->d;
    static const char *const acts[] = {"none", "gelu_tanh", "gelu_erf",
                                       "relu", "silu"};
    stof_str s = {0};
    stof__str_printf(&s,
                     "{\"desc\":{\"batch\":%d,\"seq\":%d,\"hidden\":%d,"
                     "\"heads\":%d,\"ffn\":%d,\"dtype\":\"%s\",\"act\":\"%s\","
                     "\"norm\":\"%s\",\"pre_norm\":%d,\"eps\":%g},"
                     "\"key\":\"%s\",\"source\":\"%s\",\"plan_s\":%.4f,"
                     "\"verify_ms\":%.3f,\"layer_ms\":%.5f,\"model_ms\":%.5f,"
                     "\"scheme\":{\"junction_a\":\"%s\",\"junction_b\":\"%s\","
                     "\"kernels\":%d},\"kernels\":[",
                     d->batch, d->seq, d->hidden, d->heads, d->ffn,
                     dtype_str(d->dtype), acts[d->act],
                     d->norm == STOF_NORM_LAYER ? "layernorm" : "rmsnorm",
                     d->pre_norm, (double)L->eps, L->key, L->source, L->tune_s,
                     L->verify_ms, L->layer_ms, L->model_ms, j_name[L->ja],
                     d->pre_norm ? "none" : j_name[L->jb], L->n_steps);
    for (int i = 0; i < L->n_steps; i++) {
        const step *st = &L->steps[i];
        if (i)
            stof__str_printf(&s, ",");
        if (st->kind == STEP_ATTN) {
            char a[4096];
            size_t need = 0;
            if (stof_plan_describe(L->attn, a, sizeof(a), &need) != STOF_OK)
                snprintf(a, sizeof(a), "{}");
            stof__str_printf(&s, "{\"op\":\"attention\",\"plan\":%s}", a);
        } else if (st->kind == STEP_GEMM) {
            const gemm_op *g = &L->g[st->op];
            char cfg[256];
            gemm_config_json(g, cfg, sizeof(cfg));
            stof__str_printf(&s,
                             "{\"op\":\"%s\",\"kernel\":\"%s\",\"m\":%d,"
                             "\"n\":%d,\"k\":%d,\"config\":%s,\"ms\":%.5f}",
                             g_slot[st->op], g->lt ? "cublaslt" : "gemm",
                             g->M, g->N, g->K, cfg, g->ms);
        } else {
            const norm_op *nn = &L->n[st->op];
            stof__str_printf(&s,
                             "{\"op\":\"%s\",\"kernel\":\"norm\",\"warps\":%d,"
                             "\"bias\":%d,\"residual\":%d,\"write_pre\":%d,"
                             "\"ms\":%.5f}",
                             n_slot[st->op], nn->warps, nn->bias, nn->res,
                             nn->pre, nn->ms);
        }
    }
    stof__str_printf(&s, "]}");
    stof_status r = stof__str_out(&s, buf, n, needed);
    stof__str_free(&s);
    return r;
}
