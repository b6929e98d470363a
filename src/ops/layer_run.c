/*
 * layer_run.c - running planned layers: the launches of a step (GEMM, norm,
 * attention), a layer (stof_layer_run), a stack (stof_layer_stack_run,
 * with its CUDA graph) and their mask-family forms (the instance data of
 * each call). The chain and planning: layer.c.
 */
#define XXH_INLINE_ALL
#include <xxhash.h>

#include "layer_int.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define g_slot stof__layer_g_slot
#define n_slot stof__layer_n_slot

/* --- running -------------------------------------------------------------- */

CUdeviceptr stof__layer_sym_ptr(const stof_layer *L, const CUdeviceptr *wp,
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

stof_status stof__layer_launch_gemm(stof_layer *L, const gemm_op *g,
                                    const step *s, const CUdeviceptr *wp,
                                    CUdeviceptr x, CUdeviceptr y,
                                    CUstream stream)
{
    stof_gemm_args a;
    memset(&a, 0, sizeof(a));
    a.a = stof__layer_sym_ptr(L, wp, x, y, s->s[O_A]);
    a.w = stof__layer_sym_ptr(L, wp, x, y, s->s[O_W]);
    a.c = stof__layer_sym_ptr(L, wp, x, y, s->s[O_OUT]);
    a.bias = stof__layer_sym_ptr(L, wp, x, y, s->s[O_BIAS]);
    a.residual = stof__layer_sym_ptr(L, wp, x, y, s->s[O_RES]);
    a.pre = stof__layer_sym_ptr(L, wp, x, y, s->s[O_PRE]);
    a.gamma = stof__layer_sym_ptr(L, wp, x, y, s->s[O_GAMMA]);
    a.beta = stof__layer_sym_ptr(L, wp, x, y, s->s[O_BETA]);
    a.M = g->M;
    a.N = g->N;
    a.K = g->K;
    a.lda = stof__layer_tok_ld(L, s->s[O_A]);
    a.ldw = g->K;
    a.ldc = g->N;
    a.eps = L->eps;
    a.ws = L->norm_ws;
    if (g->epi.rope) { /* Q and K: the columns before V's */
        a.rope_tab = L->rope_tab;
        a.rope_seq = L->d.seq;
        a.rope_cols = g->N - (g->N - stof__layer_qd(&L->d)) / 2;
    }
    if (stof__gemm_ws_bytes(&g->cfg, &g->epi, g->M, g->N) > L->norm_ws_bytes)
        return STOF_ERR_INTERNAL; /* (the loads refuse such a kernel) */
    /* A split op: the kernel without the gate (the 2 ffn-wide product
     * into SYM_G, then out = act(gate) * up) or without RoPE (then the
     * rope kernel in place). */
    const int gate = stof__layer_gemm_split(g, g->lt, &g->cfg);
    const int rope = stof__layer_rope_split(g, g->lt, &g->cfg);
    if ((gate && (!L->gate_fn || !L->buf[SYM_G])) ||
        (rope && (!L->rope_fn || (L->rope && !L->rope_tab))))
        return STOF_ERR_INTERNAL; /* (stof__layer_gate_ready or
                                     stof__layer_rope_ready not run) */
    const CUdeviceptr out = a.c;
    if (gate) {
        a.N = 2 * g->N;
        a.ldc = a.N;
        a.c = L->buf[SYM_G];
    }
    const stof_gemm_epi e = stof__layer_kernel_epi(g, g->lt, &g->cfg);
    stof_status st =
        g->lt ? stof__blaslt_run(g->ltg, 0, &a, L->lt_ws, L->lt_ws_bytes,
                                 stream)
              : stof__gemm_launch(g->fn, &g->cfg, &e, &a,
                                  L->ctx->device.sm_count, stream,
                                  L->ctx->api);
    if (st == STOF_OK && gate)
        st = stof__gate_launch(L->gate_fn, a.c, out, g->M, g->N, a.N, g->N,
                               1, stream, L->ctx->api);
    if (st == STOF_OK && rope && g->qk_norm) /* Q and K: norm, RoPE */
        st = stof__qknorm_launch(
            L->rope_fn, a.c, g->M, a.ldc, stof__layer_qd(&L->d),
            g->N - (g->N - stof__layer_qd(&L->d)) / 2, L->hd, L->rope,
            L->rope_tab,
            L->d.seq, a.w + (CUdeviceptr)g->N * (CUdeviceptr)g->K * 2u,
            L->eps, stream, L->ctx->api);
    else if (st == STOF_OK && rope)
        st = stof__rope_launch(L->rope_fn, a.c, g->M, a.ldc, a.rope_cols,
                               L->hd, L->rope, L->rope_tab, L->d.seq, stream,
                               L->ctx->api);
    return st;
}

stof_status stof__layer_launch_norm(stof_layer *L, const norm_op *n,
                                    const step *s, const CUdeviceptr *wp,
                                    CUdeviceptr x, CUdeviceptr y,
                                    CUstream stream)
{
    CUdeviceptr px = stof__layer_sym_ptr(L, wp, x, y, s->s[O_A]);
    CUdeviceptr pr = stof__layer_sym_ptr(L, wp, x, y, s->s[O_RES]);
    CUdeviceptr pb = stof__layer_sym_ptr(L, wp, x, y, s->s[O_BIAS]);
    CUdeviceptr pg = stof__layer_sym_ptr(L, wp, x, y, s->s[O_GAMMA]);
    CUdeviceptr pe = stof__layer_sym_ptr(L, wp, x, y, s->s[O_BETA]);
    CUdeviceptr po = stof__layer_sym_ptr(L, wp, x, y, s->s[O_OUT]);
    CUdeviceptr pp = stof__layer_sym_ptr(L, wp, x, y, s->s[O_PRE]);
    int rows = L->M;
    long long ld = L->d.hidden;
    float eps = L->eps;
    void *args[] = {&px, &pr, &pb, &pg, &pe, &po, &pp, &rows, &ld, &eps};
    /* A CTA a WARPS rows, at most one wave of them (64 warps an SM); the
     * kernel's warps stride over the rows past that and keep the norm's
     * parameters in registers across them. */
    const int sms = L->ctx->device.sm_count > 0 ? L->ctx->device.sm_count
                                                : 132;
    const int per_sm = n->warps < 64 ? 64 / n->warps : 1;
    int grid_n = (rows + n->warps - 1) / n->warps;
    if (grid_n > sms * per_sm)
        grid_n = sms * per_sm;
    const unsigned grid = (unsigned)grid_n;
    const stof_launch_opts pdl = {.pdl = STOF_PDL_IF_SM90};
    CUresult r = stof__launch(L->ctx->api, n->fn, grid, 1, 1,
                              (unsigned)(32 * n->warps), 0, stream, args,
                              &pdl);
    return r == CUDA_SUCCESS ? STOF_OK : STOF_ERR_CUDA;
}

static stof_status launch_attn(stof_layer *L, CUstream stream)
{
    /* K after the qd Q columns, V after K's kvd = kv_heads * head_dim
     * columns (16-bit: 2 bytes each). */
    const CUdeviceptr q = L->buf[SYM_QKV];
    const int qd = stof__layer_qd(&L->d);
    const size_t q_bytes = (size_t)qd * 2;
    const size_t kvd = (size_t)(stof__layer_qkv_n(&L->d) - qd) / 2;
    const CUdeviceptr k = q + q_bytes, v = k + kvd * 2;
    if (L->run_data)
        return stof_attention_run_family(
            L->attn, L->run_data, (const void *)(uintptr_t)q,
            (const void *)(uintptr_t)k, (const void *)(uintptr_t)v,
            (void *)(uintptr_t)L->buf[SYM_ATT], stream);
    return stof_attention_run(L->attn, (const void *)(uintptr_t)q,
                              (const void *)(uintptr_t)k,
                              (const void *)(uintptr_t)v,
                              (void *)(uintptr_t)L->buf[SYM_ATT], stream);
}

int stof__layer_fail(stof_layer *L, stof_status st, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(L->errmsg, sizeof(L->errmsg), fmt, ap);
    va_end(ap);
    return (int)st;
}

int stof__layer_step_runs(const stof_layer *L, int i, int mode)
{
    const step *s = &L->steps[i];
    const int end_fused = (mode & RUN_END_FUSED) != 0;
    /* The stack ending replaces the step before it. */
    if (s->stack_end != end_fused &&
        (s->stack_end || (i + 1 < L->n_steps && L->steps[i + 1].stack_end)))
        return 0;
    return !((mode & RUN_SKIP_NORM_IN) && s->kind == STEP_NORM &&
             s->op == N_IN);
}

/* What a stack's graph records beside the weights (whose hash is seed):
 * x, y, the layer count and every field of a family's instance data that
 * a launch takes (its device pointers, recorded in the graph: a replay
 * reads their current contents; its values, baked into the launches). A
 * call that differs in any of them records again. */
static uint64_t stack_graph_key(uint64_t seed, const void *x, const void *y,
                                int n_layers, const stof_mask_data *md)
{
    const uint64_t v[19] = {
        (uint64_t)(uintptr_t)x,
        (uint64_t)(uintptr_t)y,
        (uint64_t)n_layers,
        md ? 1u : 0u,
        md ? (uint64_t)(uintptr_t)md->q_len : 0,
        md ? (uint64_t)(uintptr_t)md->k_len : 0,
        md ? (uint64_t)(uintptr_t)md->q_offset : 0,
        md ? (uint64_t)(uintptr_t)md->prefix : 0,
        md ? (uint64_t)(uintptr_t)md->doc_id : 0,
        md ? (uint64_t)md->doc_stride : 0,
        md ? (uint64_t)(uintptr_t)md->seed : 0,
        md ? (uint64_t)(uintptr_t)md->cu_seqlens_q : 0,
        md ? (uint64_t)(uintptr_t)md->cu_seqlens_k : 0,
        md ? ((uint64_t)(uint32_t)md->total_q << 32 |
              (uint32_t)md->total_k)
           : 0,
        md ? (uint64_t)(uintptr_t)md->bitmap : 0,
        md ? (uint64_t)md->bitmap_stride : 0,
        md ? (uint64_t)(uint32_t)md->bitmap_words : 0,
        md ? (uint64_t)(uintptr_t)md->head_window : 0,
        0};
    return XXH3_64bits_withSeed(v, sizeof(v), seed);
}

/* Enqueue the steps; the context must be current. */
/* Why a cuBLASLt step failed, from stof__blaslt_run's status (it writes
 * no message: the context's belongs to whatever last failed on it). */
static const char *lt_why(stof_status st)
{
    switch (st) {
    case STOF_ERR_INVALID_ARGUMENT:
        return "cuBLASLt: the call does not match the planned GEMM (its "
               "sizes, a pointer missing or not 16-byte aligned, the "
               "workspace, or no cuBLASLt handle)";
    case STOF_ERR_CUDA:
        return "cuBLASLt: the launch failed (CUBLAS_STATUS_EXECUTION_FAILED)";
    default:
        return "cuBLASLt refused the launch";
    }
}

stof_status stof__layer_run_steps(stof_layer *L, const CUdeviceptr *wp,
                                  CUdeviceptr x, CUdeviceptr y,
                                  CUstream stream, int mode)
{
    for (int i = 0; i < L->n_steps; i++) {
        const step *s = &L->steps[i];
        if (!stof__layer_step_runs(L, i, mode))
            continue;
        stof_status st;
        const char *what;
        if (s->kind == STEP_GEMM) {
            st = stof__layer_launch_gemm(L, &L->g[s->op], s, wp, x, y, stream);
            what = g_slot[s->op];
        } else if (s->kind == STEP_NORM) {
            st = stof__layer_launch_norm(L, &L->n[s->op], s, wp, x, y, stream);
            what = n_slot[s->op];
        } else {
            st = launch_attn(L, stream);
            what = "attention";
        }
        if (st != STOF_OK)
            return (stof_status)stof__layer_fail(
                L, st, "stof_layer_run: launching %s failed: %s", what,
                s->kind == STEP_ATTN ? stof_plan_errmsg(L->attn)
                : s->kind == STEP_GEMM && L->g[s->op].lt ? lt_why(st)
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
        const int is_bias = t[i].sym == SYM_BQKV || t[i].sym == SYM_BO ||
                            t[i].sym == SYM_B1 || t[i].sym == SYM_B2;
        if (is_bias && L->d.no_bias) {
            if (t[i].p)
                return (stof_status)stof__layer_fail(
                    L, STOF_ERR_INVALID_ARGUMENT,
                    "weights.%s is set but the layer was planned without "
                    "biases (desc.no_bias)",
                    t[i].name);
            continue;
        }
        if (!t[i].p)
            return (stof_status)stof__layer_fail(L, STOF_ERR_INVALID_ARGUMENT,
                                           "weights.%s is NULL", t[i].name);
        if ((uintptr_t)t[i].p % 16)
            return (stof_status)stof__layer_fail(L, STOF_ERR_INVALID_ARGUMENT,
                                           "weights.%s is not 16-byte aligned",
                                           t[i].name);
        wp[t[i].sym] = (CUdeviceptr)(uintptr_t)t[i].p;
    }
    return STOF_OK;
}

static stof_status check_xy(stof_layer *L, const void *x, const void *y)
{
    if (!x || !y)
        return (stof_status)stof__layer_fail(L, STOF_ERR_INVALID_ARGUMENT,
                                       "%s is NULL", !x ? "x" : "y");
    if ((uintptr_t)x % 16 || (uintptr_t)y % 16)
        return (stof_status)stof__layer_fail(L, STOF_ERR_INVALID_ARGUMENT,
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
        return (stof_status)stof__layer_fail(L, STOF_ERR_INVALID_ARGUMENT,
                                       "weights is NULL");
    CUdeviceptr wp[SYM_COUNT];
    stof_status st = weights_ptrs(L, w, wp);
    if (st == STOF_OK)
        st = check_xy(L, x, y);
    if (st != STOF_OK)
        return st;
    const stof_api *api = L->ctx->api;
    if (api->cuCtxPushCurrent(L->ctx->device.pctx) != CUDA_SUCCESS)
        return (stof_status)stof__layer_fail(
            L, STOF_ERR_CUDA, "cannot make the device's context current");
    const int pdl_was = stof__pdl_scope(L->pdl);
    st = stof__layer_run_steps(L, wp, (CUdeviceptr)(uintptr_t)x,
                               (CUdeviceptr)(uintptr_t)y, (CUstream)stream,
                               0);
    stof__pdl_scope(pdl_was);
    CUcontext popped;
    api->cuCtxPopCurrent(&popped);
    if (st == STOF_OK)
        L->errmsg[0] = '\0';
    return st;
}

void stof__layer_graph_drop(stof_layer *L)
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
        stof_status st = stof__layer_run_steps(
            L, wps + (size_t)i * SYM_COUNT,
            (CUdeviceptr)(uintptr_t)(i ? y : x), (CUdeviceptr)(uintptr_t)y,
            stream, stof__layer_stack_mode(L, i, n_layers));
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
        return (stof_status)stof__layer_fail(L, STOF_ERR_INVALID_ARGUMENT,
                                       n_layers < 1 ? "n_layers %d < 1"
                                                    : "weights is NULL (%d)",
                                       n_layers);
    if (flags & ~STOF_STACK_GRAPH)
        return (stof_status)stof__layer_fail(L, STOF_ERR_INVALID_ARGUMENT,
                                       "flags 0x%x: unknown bits", flags);
    stof_status st = check_xy(L, x, y);
    if (st != STOF_OK)
        return st;
    CUdeviceptr *wps = malloc(sizeof(CUdeviceptr) * SYM_COUNT *
                              (size_t)n_layers);
    if (!wps)
        return (stof_status)stof__layer_fail(L, STOF_ERR_OUT_OF_MEMORY,
                                       "out of memory");
    for (int i = 0; i < n_layers && st == STOF_OK; i++) {
        st = weights_ptrs(L, &w[i], wps + (size_t)i * SYM_COUNT);
        if (st != STOF_OK) {
            char m[sizeof(L->errmsg)];
            snprintf(m, sizeof(m), "%s", L->errmsg);
            stof__layer_fail(L, st, "layer %d: %s", i, m);
        }
    }
    /* Each layer's view of the next one's input norm (its stack ending). */
    for (int i = 0; i + 1 < n_layers && st == STOF_OK; i++) {
        wps[(size_t)i * SYM_COUNT + SYM_G1_NEXT] =
            wps[(size_t)(i + 1) * SYM_COUNT + SYM_G1];
        wps[(size_t)i * SYM_COUNT + SYM_BE1_NEXT] =
            wps[(size_t)(i + 1) * SYM_COUNT + SYM_BE1];
    }
    const stof_api *api = L->ctx->api;
    if (st == STOF_OK &&
        api->cuCtxPushCurrent(L->ctx->device.pctx) != CUDA_SUCCESS)
        st = (stof_status)stof__layer_fail(L, STOF_ERR_CUDA,
                                     "cannot make the device's context current");
    else if (st == STOF_OK) {
        /* (the plan's choice of programmatic launches, captured into the
         * graph too) */
        const int pdl_was = stof__pdl_scope(L->pdl);
        CUstream s = (CUstream)stream;
        if (!(flags & STOF_STACK_GRAPH)) {
            st = stack_enqueue(L, n_layers, wps, x, y, s);
        } else {
            uint64_t key = XXH3_64bits(wps, sizeof(CUdeviceptr) * SYM_COUNT *
                                                (size_t)n_layers);
            key = stack_graph_key(key, x, y, n_layers, L->run_data);
            CUstreamCaptureStatus cs = CU_STREAM_CAPTURE_STATUS_NONE;
            if (api->cuStreamIsCapturing(s, &cs) == CUDA_SUCCESS &&
                cs != CU_STREAM_CAPTURE_STATUS_NONE)
                st = (stof_status)stof__layer_fail(
                    L, STOF_ERR_INVALID_ARGUMENT,
                    "STOF_STACK_GRAPH on a stream that is being captured: "
                    "pass flags 0 and let the caller's graph hold the "
                    "launches");
            if (st == STOF_OK && (!L->gexec || L->graph_key != key)) {
                stof__layer_graph_drop(L);
                CUresult r = CUDA_SUCCESS;
                const char *what = "cuStreamCreate";
                if (!L->cap_stream) /* the first graph of this layer */
                    r = api->cuStreamCreate(&L->cap_stream,
                                            CU_STREAM_NON_BLOCKING);
                if (r == CUDA_SUCCESS) {
                    what = "cuStreamBeginCapture";
                    r = api->cuStreamBeginCapture(
                        L->cap_stream, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL);
                }
                if (r != CUDA_SUCCESS) {
                    st = (stof_status)stof__cuda_fail(L->ctx, r, what,
                                                      __FILE__, __LINE__);
                    stof__layer_fail(L, st, "%s", stof_errmsg(L->ctx));
                } else {
                    st = stack_enqueue(L, n_layers, wps, x, y, L->cap_stream);
                    CUgraph g = NULL;
                    r = api->cuStreamEndCapture(L->cap_stream, &g);
                    if (st == STOF_OK && r != CUDA_SUCCESS) {
                        st = (stof_status)stof__cuda_fail(
                            L->ctx, r, "cuStreamEndCapture", __FILE__,
                            __LINE__);
                        stof__layer_fail(L, st, "%s", stof_errmsg(L->ctx));
                    }
                    L->graph = g;
                    if (st == STOF_OK) {
                        r = api->cuGraphInstantiate(&L->gexec, g, 0);
                        if (r != CUDA_SUCCESS) {
                            L->gexec = NULL;
                            st = (stof_status)stof__cuda_fail(
                                L->ctx, r, "cuGraphInstantiate", __FILE__,
                                __LINE__);
                            stof__layer_fail(L, st, "%s", stof_errmsg(L->ctx));
                        }
                    }
                    if (st == STOF_OK)
                        L->graph_key = key;
                    else
                        stof__layer_graph_drop(L);
                }
            }
            if (st == STOF_OK) {
                CUresult r = api->cuGraphLaunch(L->gexec, s);
                if (r != CUDA_SUCCESS) {
                    st = (stof_status)stof__cuda_fail(L->ctx, r,
                                                      "cuGraphLaunch",
                                                      __FILE__, __LINE__);
                    stof__layer_fail(L, st, "%s", stof_errmsg(L->ctx));
                }
            }
        }
        stof__pdl_scope(pdl_was);
        CUcontext popped;
        api->cuCtxPopCurrent(&popped);
    }
    free(wps);
    if (st == STOF_OK)
        L->errmsg[0] = '\0';
    return st;
}

/* Run f with the instance data of the call (a family layer only). */
static stof_status with_instance(stof_layer *L, const stof_mask_data *data,
                                 const char *fn)
{
    if (!L)
        return STOF_ERR_INVALID_ARGUMENT;
    if (!stof__plan_is_family(L->attn))
        return (stof_status)stof__layer_fail(L, STOF_ERR_INVALID_ARGUMENT,
                                       "%s: the layer was not planned by "
                                       "stof_layer_plan_family",
                                       fn);
    L->run_data = data;
    return STOF_OK;
}

/* The default instance when a family layer runs without data. */
static const stof_mask_data no_data;

stof_status stof_layer_run_family(stof_layer *L, const stof_mask_data *data,
                                  const stof_layer_weights *w, const void *x,
                                  void *y, void *stream)
{
    stof_status st = with_instance(L, data ? data : &no_data,
                                   "stof_layer_run_family");
    if (st != STOF_OK)
        return st;
    st = stof_layer_run(L, w, x, y, stream);
    L->run_data = NULL;
    return st;
}

stof_status stof_layer_stack_run_family(stof_layer *L,
                                        const stof_mask_data *data,
                                        int n_layers,
                                        const stof_layer_weights *w,
                                        const void *x, void *y, void *stream,
                                        unsigned flags)
{
    stof_status st = with_instance(L, data ? data : &no_data,
                                   "stof_layer_stack_run_family");
    if (st != STOF_OK)
        return st;
    st = stof_layer_stack_run(L, n_layers, w, x, y, stream, flags);
    L->run_data = NULL;
    return st;
}

/* A number for a description; null when it is not finite. */
