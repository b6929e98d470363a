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
 *              [in a stack, where the scheme's jb is "fused": Y = H + F
 *              W2^T + b2, N = norm1'(Y) in one GEMM, norm1' the next
 *              layer's, which then skips its first norm]
 * The attention reads Q, K and V in place from the QKV projection's
 * [tokens][qd + 2 kvd] output (qd = heads * head_dim, hidden unless
 * desc.head_dim says otherwise; kvd = kv_heads * head_dim) through
 * strides, and writes ATT as [tokens][qd], so no transposes exist.
 * A junction (GEMM, then bias, residual and norm) is cut into kernels in
 * one of three ways, the fusion scheme:
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
 *
 * This file is the chain: the steps of a scheme and planning. The
 * descriptor's defaults and checks: layer_desc.c; launches and runs:
 * layer_run.c; keys and records: layer_db.c;
 * tuning: layer_search.c; describing: layer_describe.c; RoPE tables:
 * rope_cache.c.
 */
#include "layer_int.h"

#include <jansson.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

const char *const stof__layer_g_slot[G_COUNT] = {
    "qkv", "out_res", "out", "out_norm", "ffn1", "ffn2_res", "ffn2",
    "ffn2_norm"};
const char *const stof__layer_n_slot[N_COUNT] = {"norm_in", "norm_a",
                                                 "norm_a_br", "norm_b",
                                                 "norm_b_br"};
const char *const stof__layer_j_name[J_COUNT] = {"res+norm", "bias+res+norm",
                                                 "fused"};
#define g_slot stof__layer_g_slot
#define n_slot stof__layer_n_slot
#define j_name stof__layer_j_name

/* --- the chain ------------------------------------------------------------ */

static void init_ops(stof_layer *L)
{
    const stof_layer_desc *d = &L->d;
    const int M = L->M, h = d->hidden, f = d->ffn, pre = d->pre_norm;
    const int nk = (int)d->norm + 1, qd = stof__layer_qd(d);
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
        g->N = shape[i].n3 ? stof__layer_qkv_n(d) : shape[i].n_is_ffn ? f : h;
        /* (the output projection takes the attention's qd columns) */
        const int att_in = i == G_A_RES || i == G_A_PLAIN || i == G_A_NORM;
        g->K = shape[i].k_is_ffn ? f : att_in ? qd : h;
        g->epi.bias = shape[i].bias && !d->no_bias;
        g->epi.act = shape[i].act ? (int)d->act : STOF_ACT_NONE;
        g->epi.residual = shape[i].res;
        g->epi.norm = shape[i].norm ? nk : 0;
        /* Pre-norm: G_B_NORM is the stack ending (Y kept, N for the next
         * layer). */
        g->epi.write_pre = shape[i].norm && pre;
        g->epi.gated = i == G_FFN1 && d->gated;
        /* RoPE in the QKV epilogue, or with a QK norm after it (the
         * qk kernel normalises, then rotates) */
        if (i == G_QKV && d->qk_norm)
            g->qk_norm = 1;
        else if (i == G_QKV && L->rope) {
            g->epi.rope = L->rope;
            g->epi.rope_hd = L->hd;
        }
        g->used = !pre || i != G_B_PLAIN;
    }
    for (int i = 0; i < N_COUNT; i++) {
        norm_op *n = &L->n[i];
        memset(n, 0, sizeof(*n));
        n->res = (i == N_A_BR || i == N_B_BR);
        n->bias = n->res && !d->no_bias;
        n->pre = pre && i == N_A_BR;
        n->used = pre ? i <= N_A_BR : i != N_IN;
        n->warps = 4;
    }
}

int stof__layer_qkv_n(const stof_layer_desc *d)
{
    const int kvh = d->kv_heads > 0 ? d->kv_heads : d->heads;
    return stof__layer_qd(d) + 2 * kvh * stof__layer_hd(d);
}

int stof__layer_tok_ld(const stof_layer *L, int sym)
{
    if (sym == SYM_G)
        return L->d.gated ? 2 * L->d.ffn : 0;
    return sym == SYM_QKV   ? stof__layer_qkv_n(&L->d)
           : sym == SYM_F   ? L->d.ffn
           : sym == SYM_ATT ? stof__layer_qd(&L->d)
                            : L->d.hidden;
}

int stof__layer_gemm_split(const gemm_op *g, int lt, const stof_gemm_cfg *c)
{
    return g->epi.gated && (lt || !c || !c->wgmma);
}

int stof__layer_rope_split(const gemm_op *g, int lt, const stof_gemm_cfg *c)
{
    /* (a Hopper tile fuses it when it holds whole heads and the rotated
     * channels are a multiple of 16; a QK norm always runs after the
     * plain product, in the qk kernel) */
    return g->qk_norm ||
           (g->epi.rope && (g->epi.rope % 16 != 0 || lt || !c || !c->wgmma ||
                            c->block_n % g->epi.rope_hd != 0));
}

stof_gemm_epi stof__layer_kernel_epi(const gemm_op *g, int lt,
                                     const stof_gemm_cfg *c)
{
    stof_gemm_epi e = g->epi;
    if (stof__layer_gemm_split(g, lt, c)) { /* the wide GEMM: bias only */
        e.gated = 0;
        e.act = STOF_ACT_NONE;
    }
    if (stof__layer_rope_split(g, lt, c)) /* the plain GEMM, then rope */
        e.rope = e.rope_hd = 0;
    return e;
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

void stof__layer_build_steps(stof_layer *L, int ja, int jb)
{
    L->n_steps = 0;
    L->ja = ja;
    L->jb = jb;
    /* The projections' biases (none with desc.no_bias). */
    const int nb = L->d.no_bias;
    const int bqkv = nb ? SYM_NONE : SYM_BQKV, bo = nb ? SYM_NONE : SYM_BO,
              b1 = nb ? SYM_NONE : SYM_B1, b2 = nb ? SYM_NONE : SYM_B2;
    if (!L->d.pre_norm) {
        add_gemm(L, G_QKV, SYM_X, SYM_WQKV, bqkv, SYM_NONE, SYM_QKV,
                 SYM_NONE, SYM_NONE, SYM_NONE);
        add_step(L, STEP_ATTN, 0);
        add_junction(L, ja, G_A_RES, N_A_PLAIN, SYM_ATT, SYM_WO, bo, SYM_X,
                     SYM_H, SYM_NONE, SYM_G1, SYM_BE1);
        add_gemm(L, G_FFN1, SYM_H, SYM_W1, b1, SYM_NONE, SYM_F, SYM_NONE,
                 SYM_NONE, SYM_NONE);
        add_junction(L, jb, G_B_RES, N_B_PLAIN, SYM_F, SYM_W2, b2, SYM_H,
                     SYM_Y, SYM_NONE, SYM_G2, SYM_BE2);
    } else {
        add_norm(L, N_IN, SYM_X, SYM_NONE, SYM_NONE, SYM_N, SYM_NONE, SYM_G1,
                 SYM_BE1);
        add_gemm(L, G_QKV, SYM_N, SYM_WQKV, bqkv, SYM_NONE, SYM_QKV,
                 SYM_NONE, SYM_NONE, SYM_NONE);
        add_step(L, STEP_ATTN, 0);
        add_junction(L, ja, G_A_RES, N_A_PLAIN, SYM_ATT, SYM_WO, bo, SYM_X,
                     SYM_N, SYM_H, SYM_G2, SYM_BE2);
        add_gemm(L, G_FFN1, SYM_N, SYM_W1, b1, SYM_NONE, SYM_F, SYM_NONE,
                 SYM_NONE, SYM_NONE);
        add_gemm(L, G_B_RES, SYM_F, SYM_W2, b2, SYM_H, SYM_Y, SYM_NONE,
                 SYM_NONE, SYM_NONE);
        if (jb == J_FUSED) {
            add_gemm(L, G_B_NORM, SYM_F, SYM_W2, b2, SYM_H, SYM_N, SYM_Y,
                     SYM_G1_NEXT,
                     L->d.norm == STOF_NORM_LAYER ? SYM_BE1_NEXT : SYM_NONE);
            L->steps[L->n_steps - 1].stack_end = 1;
        }
    }
}

double stof__layer_junction_cost(const stof_layer *L, int j, int g0, int n0,
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

int stof__layer_pick_junction(const stof_layer *L, int g0, int n0,
                              int measured)
{
    int best_j = -1;
    double best_t = INFINITY;
    for (int j = 0; j < J_COUNT; j++) {
        const double c = stof__layer_junction_cost(L, j, g0, n0, measured);
        if (c < best_t) {
            best_t = c;
            best_j = j;
        }
    }
    return best_j;
}

const char *stof__layer_dtype_str(stof_dtype t)
{
    return t == STOF_DTYPE_FP16 ? "fp16" : "bf16";
}

void stof__layer_gemm_config_json(const gemm_op *g, char *buf, size_t n)
{
    if (g->lt) {
        stof__json_text(json_pack("{s:I, s:i, s:i, s:i}", "lt",
                                  (json_int_t)stof__blaslt_version(), "bias",
                                  g->epi.bias, "act", g->epi.act, "res",
                                  g->epi.residual),
                        buf, n);
        return;
    }
    stof_str s = {0};
    const stof_gemm_epi e = stof__layer_kernel_epi(g, 0, &g->cfg);
    stof__gemm_cfg_json(&g->cfg, &e, &s);
    snprintf(buf, n, "%s", s.p && !s.oom ? s.p : "{}");
    stof__str_free(&s);
}

static void layer_release(stof_layer *L)
{
    stof_context *ctx = L->ctx;
    const stof_api *api = ctx->api;
    if (ctx->device.ok && stof__ctx_push(ctx) == STOF_OK) {
        stof__layer_graph_drop(L);
        for (int i = 0; i < G_COUNT; i++)
            stof__layer_gemm_unload(L, &L->g[i]);
        for (int i = 0; i < N_COUNT; i++)
            stof__layer_norm_unload(L, &L->n[i]);
        stof__module_release(ctx, L->gate_mod);
        stof__module_release(ctx, L->rope_mod);
        stof__rope_dev_put(ctx, L->rope_tab);
        if (L->cap_stream)
            api->cuStreamDestroy(L->cap_stream);
        if (L->mem)
            api->cuMemFree(L->mem);
        if (L->lt_ws && !L->lt_in_mem)
            api->cuMemFree(L->lt_ws);
        if (L->buf[SYM_G])
            api->cuMemFree(L->buf[SYM_G]);
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

static size_t buf_bytes(const stof_layer *L, int sym)
{
    return ((size_t)L->M * (size_t)stof__layer_tok_ld(L, sym) * 2 + 255) /
           256 * 256;
}

/* The intermediates L's steps read or write (bits 1 << SYM_*). */
static unsigned steps_bufs(const stof_layer *L)
{
    unsigned used = 0;
    for (int i = 0; i < L->n_steps; i++) {
        const step *s = &L->steps[i];
        if (s->kind == STEP_ATTN) {
            used |= 1u << SYM_QKV | 1u << SYM_ATT;
            continue;
        }
        const int syms[] = {s->s[O_A], s->s[O_RES], s->s[O_OUT], s->s[O_PRE]};
        for (int k = 0; k < 4; k++)
            if (syms[k] >= SYM_FIRST_BUF && syms[k] < SYM_G)
                used |= 1u << syms[k];
    }
    return used;
}

size_t stof__layer_buf_layout(const stof_layer *L, int all,
                              size_t off[SYM_COUNT])
{
    for (int s = 0; s < SYM_COUNT; s++)
        off[s] = STOF_LAYER_NO_BUF;
    /* QKV and ATT first, F over both: the attention's input is dead once
     * it has run and its output once junction A's GEMM has read it, and
     * F is first written by the FFN GEMM after that, last read by
     * junction B's (which writes T, H's successor or Y, never these). In
     * a stack the next layer's QKV GEMM writes over F after junction B.
     * Every kernel waits for the one before it before it reads or writes
     * (stream order, or stof_grid_wait with PDL), so the kernel before is
     * done, and with it every earlier one. */
    off[SYM_QKV] = 0;
    off[SYM_ATT] = buf_bytes(L, SYM_QKV);
    off[SYM_F] = 0;
    size_t total = off[SYM_ATT] + buf_bytes(L, SYM_ATT);
    if (buf_bytes(L, SYM_F) > total)
        total = buf_bytes(L, SYM_F);
    /* H carries the residual from junction A to junction B and T a split
     * junction's pre-norm sum: alive across F's or ATT's writes. N (the
     * normalised input of a pre-norm layer's GEMMs) only in pre-norm
     * layers; a post-norm layer's junctions write H and Y. A search
     * times every scheme (all); a chosen scheme has only what its steps
     * use (no T when both junctions are fused). */
    const unsigned used =
        all ? (1u << SYM_H | 1u << SYM_T | (L->d.pre_norm ? 1u << SYM_N : 0))
            : steps_bufs(L);
    const int rest[] = {SYM_H, SYM_T, SYM_N};
    for (size_t i = 0; i < sizeof(rest) / sizeof(rest[0]); i++) {
        if (!(used >> rest[i] & 1u))
            continue;
        off[rest[i]] = total;
        total += buf_bytes(L, rest[i]);
    }
    return total;
}

/* Free the buffers' allocation (with the norm workspace and cuBLASLt's
 * when it lies there) and every graph holding their addresses. */
static void drop_buffers(stof_layer *L)
{
    if (!L->mem)
        return;
    stof__layer_graph_drop(L);
    if (L->lt_in_mem) {
        L->lt_ws = 0;
        L->lt_ws_bytes = 0;
        L->lt_in_mem = 0;
    }
    L->ctx->api->cuMemFree(L->mem);
    L->mem = 0;
    L->mem_bytes = 0;
    L->norm_ws = 0;
    L->lt_mem = 0;
    L->lt_mem_bytes = 0;
    for (int s = SYM_FIRST_BUF; s < SYM_G; s++)
        L->buf[s] = 0;
}

stof_status stof__layer_buffers(stof_layer *L, size_t lt_bytes, int all)
{
    if (L->mem && (L->buf_all || !all))
        return STOF_OK;
    const double t0 = stof__now_ms();
    /* (a plan from the database whose records failed is searched: every
     * buffer then) */
    drop_buffers(L);
    stof_context *ctx = L->ctx;
    const stof_api *api = ctx->api;
    size_t off[SYM_COUNT];
    size_t total = stof__layer_buf_layout(L, all, off);
    /* The norm workspace: a search's, for any candidate; the chosen
     * kernels', what their norm GEMMs need (none when no norm is fused
     * into a Hopper GEMM). */
    if (all) {
        L->norm_ws_bytes = L->norm_ws_max;
    } else {
        L->norm_ws_bytes = 0;
        for (int i = 0; i < G_COUNT; i++) {
            const gemm_op *g = &L->g[i];
            const size_t need =
                g->ok && !g->lt
                    ? stof__gemm_ws_bytes(&g->cfg, &g->epi, g->M, g->N)
                    : 0;
            if (need > L->norm_ws_bytes)
                L->norm_ws_bytes = need;
        }
    }
    /* The workspace of a Hopper GEMM with a norm (norm_ws_bytes), zeroed
     * here once; then cuBLASLt's, as much as the caller knows its kernels
     * need (one cuMemAlloc a plan: each costs a warm plan tens of
     * microseconds or more). */
    const size_t norm_off = total;
    total += (L->norm_ws_bytes + 255) / 256 * 256;
    lt_bytes = (lt_bytes + 255) / 256 * 256;
    const size_t lt_off = total;
    total += lt_bytes;
    CUdeviceptr mem = 0;
    STOF_CU(ctx, api->cuMemAlloc(&mem, total));
    if (L->norm_ws_bytes) {
        const CUresult r =
            api->cuMemsetD8(mem + norm_off, 0, L->norm_ws_bytes);
        if (r != CUDA_SUCCESS) { /* nothing half made stays */
            api->cuMemFree(mem);
            return (stof_status)stof__cuda_fail(ctx, r, "cuMemsetD8",
                                                __FILE__, __LINE__);
        }
        L->norm_ws = mem + norm_off;
    }
    L->mem = mem;
    L->mem_bytes = total;
    L->buf_all = all;
    for (int s = SYM_FIRST_BUF; s < SYM_G; s++)
        L->buf[s] = off[s] == STOF_LAYER_NO_BUF ? 0 : L->mem + off[s];
    L->lt_mem = lt_bytes ? L->mem + lt_off : 0;
    L->lt_mem_bytes = lt_bytes;
    if (lt_bytes && !L->lt_ws) {
        L->lt_ws = L->lt_mem;
        L->lt_ws_bytes = lt_bytes;
        L->lt_in_mem = 1;
    }
    L->plan_ms[1] += stof__now_ms() - t0;
    /* (A gated layer's split FFN buffer and gate kernel: only when a split
     * FFN is timed or chosen, stof__layer_gate_ready; the capture stream
     * at the first graph run.) */
    return STOF_OK;
}

size_t stof__layer_lt_need(const stof_layer *L)
{
    size_t need = 0;
    for (int i = 0; i < G_COUNT; i++) {
        const gemm_op *g = &L->g[i];
        const size_t n = g->ok && g->lt ? stof__blaslt_ws_need(g->ltg, 0) : 0;
        if (n > need)
            need = n;
    }
    return need;
}

stof_status stof__layer_lt_ws(stof_layer *L, size_t bytes, int exact)
{
    bytes = (bytes + 255) / 256 * 256;
    if (exact ? bytes == L->lt_ws_bytes : bytes <= L->lt_ws_bytes)
        return STOF_OK;
    const double t0 = stof__now_ms();
    stof_context *ctx = L->ctx;
    const stof_api *api = ctx->api;
    /* A graph of the layer holds the old address. */
    stof__layer_graph_drop(L);
    if (L->lt_ws && !L->lt_in_mem)
        api->cuMemFree(L->lt_ws);
    L->lt_ws = 0;
    L->lt_in_mem = 0;
    L->lt_ws_bytes = 0;
    if (bytes && bytes <= L->lt_mem_bytes) {
        /* the part of the buffers' allocation is enough */
        L->lt_ws = L->lt_mem;
        L->lt_ws_bytes = bytes;
        L->lt_in_mem = 1;
    } else if (bytes) {
        STOF_CU(ctx, api->cuMemAlloc(&L->lt_ws, bytes));
        L->lt_ws_bytes = bytes;
    }
    L->plan_ms[1] += stof__now_ms() - t0;
    return STOF_OK;
}

stof_status stof__layer_gate_ready(stof_layer *L)
{
    stof_context *ctx = L->ctx;
    const stof_api *api = ctx->api;
    if (!L->d.gated)
        return STOF_OK;
    if (!L->buf[SYM_G])
        STOF_CU(ctx, api->cuMemAlloc(&L->buf[SYM_G],
                                     (size_t)L->M *
                                         (size_t)stof__layer_tok_ld(L, SYM_G) *
                                         2));
    if (L->gate_fn)
        return STOF_OK;
    void *cubin = NULL;
    size_t size = 0;
    stof_status st = stof__gate_compile(ctx, L->d.dtype, (int)L->d.act, 1,
                                        NULL, &cubin, &size);
    if (st == STOF_OK)
        st = (stof_status)stof__module_load_shared(
            ctx, cubin, size, "stof_gate", 0, &L->gate_mod, &L->gate_fn);
    free(cubin);
    return st;
}

stof_status stof__layer_rope_ready(stof_layer *L)
{
    stof_context *ctx = L->ctx;
    if (!L->rope && !L->d.qk_norm)
        return STOF_OK;
    if (L->rope_fn)
        return STOF_OK;
    /* The rope kernel (or with a QK norm the qk kernel, stof_qk_norm) is
     * in every layer_ops.cu module of the dtype: a norm kernel's (a
     * pre-norm layer's input norm, loaded from the database or a search)
     * serves, so a database hit compiles nothing. */
    const char *name = L->d.qk_norm ? "stof_qk_norm" : "stof_rope";
    for (int i = 0; i < N_COUNT; i++) {
        const norm_op *n = &L->n[i];
        CUfunction f = NULL;
        if (!n->ok || !n->mod || !stof__module_retain(ctx, n->mod))
            continue;
        if (ctx->api->cuModuleGetFunction(&f, n->mod, name) ==
                CUDA_SUCCESS &&
            f) {
            L->rope_mod = n->mod;
            L->rope_fn = f;
            return STOF_OK;
        }
        stof__module_release(ctx, n->mod);
    }
    void *cubin = NULL;
    size_t size = 0;
    /* (one module a dtype: rope is only checked; a QK norm alone: hd) */
    stof_status st = stof__rope_compile(ctx, L->d.dtype, L->hd,
                                        L->rope ? L->rope : L->hd, NULL,
                                        &cubin, &size);
    if (st == STOF_OK)
        st = (stof_status)stof__module_load_shared(
            ctx, cubin, size, name, 0, &L->rope_mod, &L->rope_fn);
    free(cubin);
    return st;
}

/* A gated layer whose first FFN GEMM runs fused needs no [tokens][2 ffn]
 * buffer (at 32k tokens of a 7B-class FFN, 1.4 GB): freed once the kernel
 * is chosen (the context current). */
static void drop_unused_g(stof_layer *L)
{
    const gemm_op *g = &L->g[G_FFN1];
    if (L->buf[SYM_G] && !stof__layer_gemm_split(g, g->lt, &g->cfg)) {
        L->ctx->api->cuMemFree(L->buf[SYM_G]);
        L->buf[SYM_G] = 0;
    }
}

/* A cache-only plan of a layer missed the database: record what
 * `stof-tune pending` needs to tune it under the layer's key: the
 * descriptor as JSON with the mask's spec and digest (its bits as the
 * blob), or the family's spec (the sample instance, packed for the
 * layer's attention descriptor ad, as the blob: up to 64 MB). */
static void record_layer_miss(stof_layer *L, const stof_mask *m,
                              const stof_mask_family *fam,
                              const stof_mask_data *sample,
                              const stof_attention_desc *ad,
                              const char *mask_hex)
{
    stof_db *db = stof__ctx_db(L->ctx);
    if (!db || !stof__db_writable(db))
        return;
    const stof_layer_desc *d = &L->d;
    json_t *pj = json_pack(
        "{s:s, s:i, s:i, s:i, s:i, s:i, s:i, s:s, s:i, s:i, s:i, s:i, s:i, "
        "s:f}",
        "op", "layer", "batch", d->batch, "seq", d->seq, "hidden", d->hidden,
        "heads", d->heads, "ffn", d->ffn, "kv_heads", d->kv_heads, "dtype",
        stof__layer_dtype_str(d->dtype), "act", (int)d->act, "norm",
        (int)d->norm, "pre_norm", d->pre_norm, "no_bias", d->no_bias, "gated",
        d->gated, "eps", (double)L->eps);
    if (pj && d->rope_theta != 0.0f) /* (only with RoPE) */
        json_object_set_new(pj, "rope_theta", json_real((double)d->rope_theta));
    if (pj && d->rope_freq) /* (the key's: any table) */
        json_object_set_new(pj, "rope_table", json_true());
    if (pj && L->rope)
        json_object_set_new(pj, "rope_dim", json_integer(d->rope_dim));
    if (pj && d->qk_norm)
        json_object_set_new(pj, "qk_norm", json_integer(1));
    if (pj && stof__layer_qd(d) != d->hidden)
        json_object_set_new(pj, "head_dim", json_integer(L->hd));
    stof__record_miss(L->ctx, db, L->key, pj, m, mask_hex, fam, ad, sample);
}

int stof__layer_pdl_rule(const stof_device *dev, int tokens)
{
    return dev->cc_major >= 9 && tokens <= STOF_LAYER_PDL_TOKENS;
}

int stof__layer_pdl_pick(double off_ms, double on_ms, int rule)
{
    if (!(off_ms > 0.0) || !(on_ms > 0.0))
        return rule;
    const double r = on_ms / off_ms;
    return r < 1.0 - STOF_LAYER_PDL_MARGIN   ? 1
           : r > 1.0 + STOF_LAYER_PDL_MARGIN ? 0
                                             : rule;
}

/* stof_layer_plan (m) and stof_layer_plan_family (fam, sample). */
static stof_status layer_plan(stof_context *ctx, const stof_layer_desc *d,
                              const stof_mask *m, const stof_mask_family *fam,
                              const stof_mask_data *sample, stof_layer **out)
{
    stof_status st = stof__layer_check_desc(ctx, d, m);
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
    L->hd = stof__layer_hd(d);
    L->eps = d->norm_eps > 0 ? d->norm_eps : 1e-5f;
    L->pdl = -1; /* (the search or the record decides, else the rule) */
    L->rope = !stof__layer_has_rope(d) ? 0
              : d->rope_dim > 0          ? d->rope_dim
                                         : L->hd;
    /* The frequencies: the descriptor's (copied: L->d's points to the
     * copy, non-NULL as the key and records say "table") or theta's */
    L->rope_scale = d->rope_scale > 0.0f ? d->rope_scale : 1.0f;
    if (d->rope_freq) {
        memcpy(L->rope_freq, d->rope_freq,
               sizeof(float) * (size_t)(L->rope / 2));
        L->d.rope_freq = L->rope_freq;
    } else if (L->rope)
        stof__rope_freqs(L->rope_freq, L->rope, d->rope_theta);
    init_ops(L);
    /* The attention reads Q, K, V from the [tokens][qd + 2 kvd] projection
     * (qd = heads * head_dim, kvd = kv_heads * head_dim) and writes
     * [tokens][qd]. */
    stof_attention_desc ad;
    stof_attention_desc_init(&ad, d->batch, d->heads, d->seq, d->seq, L->hd,
                             d->dtype, STOF_LAYOUT_BSHD);
    ad.layout = STOF_LAYOUT_STRIDED;
    ad.kv_heads = d->kv_heads;
    const int64_t h = stof__layer_qd(d), s = d->seq,
                  qn = stof__layer_qkv_n(d);
    const int64_t qs[3] = {s * qn, L->hd, qn};
    const int64_t os[3] = {s * h, L->hd, h};
    memcpy(ad.q_stride, qs, sizeof(qs));
    memcpy(ad.k_stride, qs, sizeof(qs));
    memcpy(ad.v_stride, qs, sizeof(qs));
    memcpy(ad.o_stride, os, sizeof(os));
    const double t0 = stof__now_ms() * 1e-3;
    double tp = stof__now_ms();
    st = m ? stof_attention_plan(ctx, &ad, m, &L->attn)
           : stof_attention_plan_family(ctx, &ad, fam, sample, &L->attn);
    if (st != STOF_OK) {
        char msg[STOF_ERRMSG_MAX];
        snprintf(msg, sizeof(msg), "%s", stof_errmsg(ctx));
        free(L);
        return stof__fail(ctx, st, "stof_layer_plan: the attention: %s", msg);
    }
    /* The layer's key names the mask's bits, or the family's key (its
     * spec, lengths bucket and statistics). */
    char mask_hex[33];
    if (m)
        stof_mask_digest(m, NULL, mask_hex);
    else
        snprintf(mask_hex, sizeof(mask_hex), "%s", stof__plan_key(L->attn));
    const char *spec = m ? m->spec : stof_mask_family_spec(fam);
    stof__layer_key(L, mask_hex);
    st = stof__ctx_push(ctx);
    if (st != STOF_OK) {
        stof_plan_free(&L->attn);
        free(L);
        return st;
    }
    L->plan_ms[0] = stof__now_ms() - tp;
    tp = stof__now_ms();
    /* The RoPE table (every QKV kernel reads it, the checks too): the
     * context's, uploaded by its first plan of that length and base (its
     * time counts as the buffers'). */
    if (L->rope &&
        (st = stof__rope_dev_get(ctx, d->seq, L->rope, L->rope_freq,
                                 L->rope_scale, &L->rope_tab)) != STOF_OK) {
        stof__ctx_pop(ctx);
        layer_release(L);
        return st;
    }
    L->plan_ms[1] += stof__now_ms() - tp;
    /* The buffers are allocated once the kernels are known (a database
     * hit: with the workspace its cuBLASLt kernels need) or before a
     * search (stof__layer_buffers; their time is plan_ms[1]). The Hopper
     * GEMMs with a norm get a workspace for the largest of the
     * candidates' (their narrowest tile's); a stored tile that needs more
     * (valid but no candidate at this size, e.g. 64 columns at 4096
     * tokens) is refused when loaded (layer_db.c). */
    L->norm_ws_max = stof__gemm_norm_ws_max(&ctx->device, L->M, d->hidden);
    L->norm_ws_bytes = L->norm_ws_max;
    char why[256];
    if (!stof__blaslt_available(why, sizeof(why)))
        stof__log(ctx, STOF_LOG_INFO, "cuBLASLt is not a candidate: %s",
                  why);
    {
        const stof_tuning_mode mode = ctx->settings.tuning_mode;
        if (mode != STOF_TUNE_FORCE && stof__layer_from_db(L) == STOF_OK) {
            snprintf(L->source, sizeof(L->source), "database");
        } else if (mode == STOF_TUNE_CACHE_ONLY || L->db_transient) {
            /* A miss in cache-only mode: recorded, the model's choice
             * runs. Stored kernels this host could not load or check for
             * reasons not theirs (its memory, a compile): the model's
             * choice in every mode (a tune would need more memory still),
             * no miss, and the records stay for the next plan. Nothing is
             * run to choose it: only its scheme's buffers are made, below
             * (what a failed database attempt made goes first). */
            if (!L->db_transient)
                record_layer_miss(L, m, fam, sample, &ad, mask_hex);
            drop_buffers(L);
            st = stof__layer_tune(L, spec, mask_hex, 1);
            snprintf(L->source, sizeof(L->source), "model");
        } else if ((st = stof__layer_buffers(L, 0, 1)) != STOF_OK) {
            /* (out of memory: nothing to run a search with) */
        } else {
            st = stof__layer_tune(L, spec, mask_hex, 0);
            snprintf(L->source, sizeof(L->source), "tuned");
        }
    }
    /* A split first FFN GEMM (chosen, or read from the database) runs
     * with the gate kernel. */
    if (st == STOF_OK && L->d.gated &&
        stof__layer_gemm_split(&L->g[G_FFN1], L->g[G_FFN1].lt,
                               &L->g[G_FFN1].cfg))
        st = stof__layer_gate_ready(L);
    /* A QKV GEMM that cannot fuse RoPE runs with the rope kernel. */
    if (st == STOF_OK &&
        stof__layer_rope_split(&L->g[G_QKV], L->g[G_QKV].lt,
                               &L->g[G_QKV].cfg))
        st = stof__layer_rope_ready(L);
    if (st == STOF_OK)
        drop_unused_g(L);
    /* A search's buffers (every scheme's) down to the chosen scheme's; the
     * model's choice gets its scheme's. */
    if (st == STOF_OK && (L->buf_all || !L->mem)) {
        drop_buffers(L);
        /* The search's own cuBLASLt workspace goes first: the chosen
         * algorithms' part of the new allocation replaces it (kept, it
         * would stay beside that part when their need equals its size). */
        st = stof__layer_lt_ws(L, 0, 1);
        if (st == STOF_OK)
            st = stof__layer_buffers(L, stof__layer_lt_need(L), 0);
    }
    /* cuBLASLt's workspace: what the chosen algorithms need (often none),
     * not the most a candidate could ask for. */
    if (st == STOF_OK)
        st = stof__layer_lt_ws(L, stof__layer_lt_need(L), 1);
    L->plan_ms[2] = stof__now_ms() - tp - L->plan_ms[1];
    if (L->pdl < 0)
        L->pdl = stof__layer_pdl_rule(&ctx->device, L->M);
    /* The norm workspace's zeroing and the plan's uploads have landed
     * before a run on any stream reads them. */
    if (st == STOF_OK)
        st = stof__plan_settle(ctx);
    stof__ctx_pop(ctx);
    if (st != STOF_OK) {
        char msg[STOF_ERRMSG_MAX];
        snprintf(msg, sizeof(msg), "%s", stof_errmsg(ctx));
        layer_release(L);
        return stof__fail(ctx, st, "stof_layer_plan: %s", msg);
    }
    L->tune_s = stof__now_ms() * 1e-3 - t0;
    stof__log(ctx, STOF_LOG_INFO,
              "layer plan (%s) in %.3f s: scheme %s / %s", L->source,
              L->tune_s, j_name[L->ja],
              d->pre_norm ? (L->jb == J_FUSED ? "stack" : "-")
                          : j_name[L->jb]);
    *out = L;
    return stof__ok(ctx);
}

stof_status stof_layer_plan(stof_context *ctx, const stof_layer_desc *d,
                            const stof_mask *m, stof_layer **out)
{
    if (!ctx)
        return STOF_ERR_INVALID_ARGUMENT;
    STOF_CHECK_ARG(ctx, out, "layer (the output pointer) is NULL");
    *out = NULL;
    STOF_CHECK_ARG(ctx, m, "mask is NULL");
    return layer_plan(ctx, d, m, NULL, NULL, out);
}

stof_status stof_layer_plan_family(stof_context *ctx, const stof_layer_desc *d,
                                   const stof_mask_family *fam,
                                   const stof_mask_data *sample,
                                   stof_layer **out)
{
    if (!ctx)
        return STOF_ERR_INVALID_ARGUMENT;
    STOF_CHECK_ARG(ctx, out, "layer (the output pointer) is NULL");
    *out = NULL;
    STOF_CHECK_ARG(ctx, fam, "fam is NULL");
    return layer_plan(ctx, d, NULL, fam, sample, out);
}
