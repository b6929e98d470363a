/*
 * layer_search.c - tuning a Transformer layer through the search engine
 * (search.h). Each GEMM slot the layer may use is an operation whose
 * candidates are stof's template configurations (gemm.cu, ranked by its
 * cost model) and cuBLASLt's heuristic algorithms where it can express the
 * epilogue; each norm slot one whose candidates are the norm kernel's warp
 * counts. They run on scratch data of the real shapes: every candidate is
 * checked against the C reference on sampled rows and timed in isolation
 * (CUDA events, median, L2 flushed). The layer is the engine's client: it
 * picks the fusion scheme whose kernels' measured times sum lowest, times
 * the whole layer, and stores the records (layer_db.c).
 */
#define XXH_INLINE_ALL
#include <xxhash.h>

#include "layer_int.h"
#include "search.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define g_slot stof__layer_g_slot
#define n_slot stof__layer_n_slot
#define j_name stof__layer_j_name

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

/* The gate kernel of a split gated op: reads 2 ffn, writes ffn a row. */
static double gate_model_ms(const stof_layer *L)
{
    return 0.003 + (double)L->M * L->d.ffn * 2.0 * 3.0 / 3.0e9;
}

/* The rope kernel of a split QKV GEMM: reads and writes Q and K. */
static double rope_model_ms(const stof_layer *L)
{
    const double qd = stof__layer_qd(&L->d),
                 cols = qd + (stof__layer_qkv_n(&L->d) - qd) / 2.0;
    return 0.003 + (double)L->M * cols * 2.0 * 2.0 / 3.0e9;
}

static double norm_model_ms(const stof_layer *L, const norm_op *n)
{
    /* Memory-bound: bytes over ~3 TB/s plus a launch. */
    const double row = 2.0 * L->d.hidden;
    const double bytes = (double)L->M * row * (2 + n->res + n->pre);
    return 0.003 + bytes / 3.0e9;
}

#define MAX_TPL 8   /* template candidates timed per GEMM */
#define MAX_LT 8    /* cuBLASLt algorithms timed per GEMM */

static double now_s(void)
{
    return stof__now_ms() * 1e-3;
}

/* --- the layer's operations of the search engine --------------------------- */

enum { KIND_TEMPLATE = 0, KIND_CUBLASLT = 1 };

/* One candidate of a GEMM or norm slot. */
typedef struct slot_cand {
    int kind;              /* KIND_* */
    stof_gemm_cfg cfg;     /* GEMM template */
    int algo;              /* cuBLASLt: index in the heuristic's list */
    int warps;             /* norm kernel */
    double model_ms;
} slot_cand;

/* A GEMM slot (is_norm 0) or a norm slot as an operation. */
typedef struct slot_op {
    stof_layer *L;
    layer_tuner *t;              /* scratch data (NULL when nothing is run) */
    int is_norm, op;
    step s;                /* the step that exercises it */
    slot_cand c[MAX_TPL + MAX_LT];
    int n;
    stof_blaslt_gemm *lt;  /* cuBLASLt's heuristic algorithms, or NULL */
    char name[48];
} slot_op;

static int so_kind(void *user, int i)
{
    return ((slot_op *)user)->c[i].kind;
}

static double so_model_ms(void *user, int i)
{
    return ((slot_op *)user)->c[i].model_ms;
}

static void so_describe(void *user, int i, char *buf, size_t n)
{
    const slot_op *o = user;
    const slot_cand *c = &o->c[i];
    if (o->is_norm)
        snprintf(buf, n, "norm w%d", c->warps);
    else if (c->kind == KIND_CUBLASLT)
        snprintf(buf, n, "cublaslt algo %d", c->algo);
    else if (c->cfg.wgmma)
        snprintf(buf, n, "gemm wgmma %dx%dx%d st%d%s%s%s", c->cfg.block_m,
                 c->cfg.block_n, c->cfg.block_k, c->cfg.stages,
                 c->cfg.warps_m == 1 ? " ping-pong" : "",
                 c->cfg.cluster > 1 ? " pairs" : "",
                 c->cfg.cslot ? " c-in-slots" : "");
    else
        snprintf(buf, n, "gemm %dx%dx%d %dx%d st%d", c->cfg.block_m,
                 c->cfg.block_n, c->cfg.block_k, c->cfg.warps_m,
                 c->cfg.warps_n, c->cfg.stages);
}

static int so_compile(void *user, int i, void **art, size_t *size, char *err,
                      size_t errn)
{
    const slot_op *o = user;
    const slot_cand *c = &o->c[i];
    *art = NULL;
    *size = 0;
    if (c->kind == KIND_CUBLASLT)
        return 0; /* the library's own kernel: nothing to compile */
    /* A private context: compiles run concurrently on pool threads. */
    stof_context *tmp = calloc(1, sizeof(*tmp));
    if (!tmp) {
        snprintf(err, errn, "out of memory");
        return 1;
    }
    const stof_layer *L = o->L;
    tmp->api = L->ctx->api;
    tmp->settings.log_fn = stof__log_discard;
    tmp->device = L->ctx->device;
    const stof_gemm_epi e = stof__layer_kernel_epi(&L->g[o->op], 0, &c->cfg);
    stof_status st =
        o->is_norm ? norm_compile(tmp, L, &L->n[o->op], c->warps, art, size)
                   : stof__gemm_compile(tmp, L->d.dtype, &c->cfg, &e,
                                        L->g[o->op].N, NULL, art, size);
    if (st != STOF_OK)
        snprintf(err, errn, "%s", tmp->errmsg);
    free(tmp);
    return st != STOF_OK;
}

/* Equal kernels of different slots (the same epilogue, N and
 * configuration) are compiled once. */
static uint64_t so_art_key(void *user, int i)
{
    const slot_op *o = user;
    const slot_cand *c = &o->c[i];
    if (c->kind == KIND_CUBLASLT)
        return 0;
    const stof_layer *L = o->L;
    uint64_t h;
    if (o->is_norm) {
        const norm_op *n = &L->n[o->op];
        const int v[] = {1, c->warps, n->bias, n->res, n->pre,
                         (int)L->d.norm, L->d.hidden, (int)L->d.dtype};
        h = XXH3_64bits(v, sizeof(v));
    } else {
        const gemm_op *g = &L->g[o->op];
        const stof_gemm_epi e = stof__layer_kernel_epi(g, 0, &c->cfg);
        const int v[] = {2, g->N, (int)L->d.dtype};
        h = XXH3_64bits_withSeed(&c->cfg, sizeof(c->cfg),
                                 XXH3_64bits_withSeed(&e, sizeof(e),
                                                      XXH3_64bits(v,
                                                                  sizeof(v))));
    }
    return h ? h : 1;
}

static int so_load(void *user, int i, const void *art, size_t size,
                   void **handle, char *err, size_t errn)
{
    slot_op *o = user;
    const slot_cand *c = &o->c[i];
    stof_layer *L = o->L;
    stof_status st;
    if (o->is_norm) {
        st = stof__layer_norm_load(L, &L->n[o->op], c->warps, art, size, 0);
    } else if (c->kind == KIND_CUBLASLT) {
        uint8_t bytes[STOF_BLASLT_ALGO_BYTES];
        stof__blaslt_algo_bytes(o->lt, c->algo, bytes);
        st = stof__layer_gemm_load_lt(L, &L->g[o->op], bytes);
    } else {
        st = stof__layer_gemm_load_template(L, &L->g[o->op], &c->cfg, art,
                                            size, 0);
    }
    if (st != STOF_OK) {
        snprintf(err, errn, "%s", stof_errmsg(L->ctx));
        return 1;
    }
    *handle = o;
    return 0;
}

static int so_verify(void *user, void *handle, double *rel, char *err,
                     size_t errn)
{
    slot_op *o = user;
    (void)handle;
    *rel = INFINITY;
    stof_status st = stof__layer_poison_step(o->t, &o->s);
    if (st == STOF_OK)
        st = stof__layer_launch_step(o->t, &o->s);
    if (st == STOF_OK && o->L->ctx->api->cuCtxSynchronize() != CUDA_SUCCESS)
        st = STOF_ERR_CUDA;
    if (st != STOF_OK) {
        snprintf(err, errn, "run failed: %s", stof_status_str(st));
        return 1;
    }
    *rel = stof__layer_verify_step(o->t, &o->s);
    /* (NaNs left by the poison: other slots read this output) */
    if (!isfinite(*rel))
        (void)stof__layer_refill_step(o->t, &o->s);
    return 0;
}

static int so_time(void *user, void *handle, double *ms, char *err,
                   size_t errn)
{
    slot_op *o = user;
    (void)handle;
    if (stof__layer_time_it(o->t, &o->s, ms)) {
        snprintf(err, errn, "a timed run failed");
        return 1;
    }
    return 0;
}

static void so_unload(void *user, void *handle)
{
    slot_op *o = user;
    (void)handle;
    if (o->is_norm)
        stof__layer_norm_unload(o->L, &o->L->n[o->op]);
    else
        stof__layer_gemm_unload(o->L, &o->L->g[o->op]);
}

static int cmp_model(const void *a, const void *b)
{
    const slot_cand *x = a, *y = b;
    return (x->model_ms > y->model_ms) - (x->model_ms < y->model_ms);
}

/* The candidates of GEMM slot i: the per_op best template configurations
 * by the cost model, then cuBLASLt's heuristic algorithms (model-only: its
 * first algorithm, measured within about 10% of its best on these shapes,
 * first; the template's cost model has no figure for cuBLASLt). */
static void gemm_candidates(slot_op *o, int per_op, int model_only)
{
    stof_layer *L = o->L;
    gemm_op *g = &L->g[o->op];
    char why[256];
    /* A gated op: cuBLASLt makes the 2N-wide product (then the gate
     * kernel); the Hopper template fuses it; elsewhere the mma.sync
     * template makes the wide product. A RoPE op likewise: the plain
     * product, then the rope kernel, but on the Hopper template (whole
     * heads in its tiles). */
    const stof_gemm_epi wide = stof__layer_kernel_epi(g, 1, NULL);
    const int wn = g->epi.gated ? 2 * g->N : g->N;
    const double gate_ms = g->epi.gated                  ? gate_model_ms(L)
                           : g->epi.rope || g->qk_norm ? rope_model_ms(L)
                                                       : 0.0;
    if (stof__blaslt_available(why, sizeof(why)) &&
        stof__blaslt_epi_ok(&wide) &&
        stof__blaslt_create(L->ctx, L->d.dtype, g->M, wn, g->K, g->K, g->K,
                            wn, &wide, model_only ? 1 : MAX_LT,
                            &o->lt) == STOF_OK) {
        const int na = stof__blaslt_n_algos(o->lt);
        for (int a = 0; a < na && a < MAX_LT; a++)
            o->c[o->n++] = (slot_cand){.kind = KIND_CUBLASLT, .algo = a};
    }
    const int n_lt = o->n;
    stof_gemm_cfg *cands = malloc(sizeof(*cands) * 256);
    slot_cand *ranked = malloc(sizeof(*ranked) * 256);
    int nc = cands && ranked
                 ? stof__gemm_candidates(&L->ctx->device, &g->epi, g->M,
                                         g->N, g->K, cands, 256)
                 : 0;
    int split = 0; /* the templates make the wide product */
    if (nc == 0 && (g->epi.gated || g->epi.rope) && cands && ranked) {
        nc = stof__gemm_candidates(&L->ctx->device, &wide, g->M, wn, g->K,
                                   cands, 256);
        /* The kernels that run split: mma.sync (a gated wgmma kernel
         * fuses its gate), and for RoPE the Hopper tiles that hold no
         * whole heads. */
        int k = 0;
        for (int c = 0; c < nc; c++)
            if (g->epi.rope ? stof__layer_rope_split(g, 0, &cands[c])
                            : !cands[c].wgmma)
                cands[k++] = cands[c];
        nc = k;
        split = 1;
    }
    for (int c = 0; c < nc; c++)
        ranked[c] = (slot_cand){
            .kind = KIND_TEMPLATE,
            .cfg = cands[c],
            .model_ms =
                split ? stof__gemm_model_ms(&L->ctx->device, &cands[c], &wide,
                                            g->M, wn, g->K) +
                            gate_ms
                      : stof__gemm_model_ms(&L->ctx->device, &cands[c],
                                            &g->epi, g->M, g->N, g->K) +
                            (g->qk_norm ? gate_ms : 0.0)};
    /* (a QK norm: every candidate runs the plain product, then the qk
     * kernel, its time counted above) */
    if (nc)
        qsort(ranked, (size_t)nc, sizeof(*ranked), cmp_model);
    g->model_ms = nc ? ranked[0].model_ms : 0;
    /* Templates first (the model's order), then cuBLASLt; model-only
     * runs take the first candidate, so cuBLASLt's first algorithm leads
     * there when it can serve. */
    slot_cand tpl[MAX_TPL];
    int nt = 0;
    for (int c = 0; c < nc && nt < per_op && nt < MAX_TPL; c++)
        tpl[nt++] = ranked[c];
    if (!model_only || n_lt == 0) {
        memmove(&o->c[nt], &o->c[0], sizeof(o->c[0]) * (size_t)n_lt);
        memcpy(&o->c[0], tpl, sizeof(tpl[0]) * (size_t)nt);
    } else {
        memcpy(&o->c[n_lt], tpl, sizeof(tpl[0]) * (size_t)nt);
    }
    o->n = n_lt + nt;
    free(cands);
    free(ranked);
}

static void norm_candidates(slot_op *o, int n_cfgs)
{
    static const int warps[3] = {4, 8, 16};
    norm_op *n = &o->L->n[o->op];
    n->model_ms = norm_model_ms(o->L, n);
    for (int w = 0; w < n_cfgs && w < 3; w++)
        o->c[o->n++] = (slot_cand){.kind = KIND_TEMPLATE,
                                   .warps = warps[w],
                                   .model_ms = n->model_ms};
}

/* The operations of every slot in use. Returns their number. */
static int make_ops(stof_layer *L, layer_tuner *t, int per_op, int model_only,
                    slot_op *so, stof_search_op *ops)
{
    int k = 0;
    for (int is_norm = 0; is_norm < 2; is_norm++) {
        const int count = is_norm ? N_COUNT : G_COUNT;
        for (int i = 0; i < count; i++) {
            if (!(is_norm ? L->n[i].used : L->g[i].used))
                continue;
            slot_op *o = &so[k];
            memset(o, 0, sizeof(*o));
            o->L = L;
            o->t = t;
            o->is_norm = is_norm;
            o->op = i;
            stof__layer_probe_step(L, is_norm, i, &o->s);
            if (is_norm) {
                norm_candidates(o, model_only ? 1 : 3);
                snprintf(o->name, sizeof(o->name), "%s", n_slot[i]);
            } else {
                gemm_candidates(o, per_op, model_only);
                snprintf(o->name, sizeof(o->name), "%s %dx%dx%d", g_slot[i],
                         L->g[i].M, L->g[i].N, L->g[i].K);
            }
            ops[k] = (stof_search_op){.user = o,
                                      .name = o->name,
                                      .n = o->n,
                                      .top_k = o->n,
                                      .kind = so_kind,
                                      .model_ms = so_model_ms,
                                      .describe = so_describe,
                                      .compile = so_compile,
                                      .art_key = so_art_key,
                                      .load = so_load,
                                      .verify = so_verify,
                                      .time = so_time,
                                      .unload = so_unload,
                                      .tolerance = t ? t->tol : 0,
                                      .exclusive = 1};
            k++;
        }
    }
    return k;
}

/* Load slot o's winner (result r) for good and describe it for its
 * record. 0 when it could not be loaded (the slot is then unusable). */
static int apply_winner(slot_op *o, const stof_search_result *r,
                        layer_winner *w)
{
    stof_layer *L = o->L;
    memset(w, 0, sizeof(*w));
    if (r->winner < 0)
        return 0;
    const slot_cand *c = &o->c[r->winner];
    stof_status st;
    if (o->is_norm) {
        st = stof__layer_norm_load(L, &L->n[o->op], c->warps, r->winner_art,
                                   r->winner_art_size, 0);
    } else if (c->kind == KIND_CUBLASLT) {
        stof__blaslt_algo_bytes(o->lt, c->algo, w->algo);
        st = stof__layer_gemm_load_lt(L, &L->g[o->op], w->algo);
    } else {
        st = stof__layer_gemm_load_template(L, &L->g[o->op], &c->cfg,
                                            r->winner_art,
                                            r->winner_art_size, 0);
    }
    if (st != STOF_OK)
        return 0;
    w->found = 1;
    w->art = r->winner_art;
    w->size = r->winner_art_size;
    w->ms = r->winner_ms;
    w->runner_up = r->runner_up_ms;
    w->first_ms = r->model_ms;
    w->n_timed = r->n_timed;
    w->n_rejected = r->n_rejected;
    if (o->is_norm) {
        L->n[o->op].ms = r->winner_ms;
        stof__log(L->ctx, STOF_LOG_INFO,
                  "layer tune: %-9s %6d rows x %5d  best %.4f ms of %d timed",
                  n_slot[o->op], L->M, L->d.hidden, r->winner_ms, r->n_timed);
    } else {
        gemm_op *g = &L->g[o->op];
        g->ms = r->winner_ms;
        g->n_timed = r->n_timed;
        g->n_rejected = r->n_rejected;
        char name[96];
        so_describe(o, r->winner, name, sizeof(name));
        stof__log(L->ctx, STOF_LOG_INFO,
                  "layer tune: %-9s %6dx%5dx%5d  best %s %.4f ms of %d timed "
                  "(%d rejected)",
                  g_slot[o->op], g->M, g->N, g->K, name, r->winner_ms,
                  r->n_timed, r->n_rejected);
    }
    return 1;
}

/* --- tuning: the engine's client ------------------------------------------- */

/* A pre-norm layer's jb: J_FUSED (in stacks, the last GEMM also
 * normalises for the next layer, which skips its input norm) when that
 * GEMM costs less than the plain one and the input norm together, else
 * 0. */
static int stack_ending(const stof_layer *L, int measured)
{
    const gemm_op *f = &L->g[G_B_NORM], *g = &L->g[G_B_RES];
    const norm_op *n = &L->n[N_IN];
    if (!f->ok || !g->ok || !n->ok)
        return 0;
    const double fused = measured ? f->ms : f->model_ms,
                 apart = measured ? g->ms + n->ms
                                  : g->model_ms + n->model_ms;
    return fused > 0 && fused < apart ? J_FUSED : 0;
}

/* Pick the scheme from the slots' results; STOF_ERR_UNSUPPORTED when no
 * scheme has a kernel for every step. */
static stof_status pick_scheme(stof_layer *L, int model_only)
{
    /* The scheme: measured costs, or the model's. */
    int ja = stof__layer_pick_junction(L, G_A_RES, N_A_PLAIN, !model_only);
    int jb = L->d.pre_norm
                 ? stack_ending(L, !model_only)
                 : stof__layer_pick_junction(L, G_B_RES, N_B_PLAIN,
                                             !model_only);
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
        stof__layer_build_steps(L, ja, jb);
        for (int i = 0; i < L->n_steps; i++) {
            const step *s = &L->steps[i];
            if ((s->kind == STEP_GEMM && !L->g[s->op].ok) ||
                (s->kind == STEP_NORM && !L->n[s->op].ok))
                missing = 1;
        }
    }
    if (missing)
        return stof__fail(L->ctx, STOF_ERR_UNSUPPORTED,
                          "no kernel could be found for every step of the "
                          "layer (see the log for the rejected candidates)");
    return STOF_OK;
}

/* Timed apart (each kernel after an L2 flush), a junction's options are
 * a guide, not the answer: in a layer the norm kernel reads the GEMM's
 * output from L2 and each kernel more pays a launch. So the options
 * within SETTLE_RATIO of the best are timed as whole layers too, and a
 * layer at least 1% faster than the pick's replaces it (H100, BERT-base
 * 1x128: a norm GEMM of 7.2 us, timed apart before cuBLASLt's 4.0 us and
 * a 2.2 us norm kernel, made its stack slower). Post-norm layers both
 * junctions, pre-norm ones the first (their ending is the stack's). */
#define SETTLE_RATIO 1.25
static void settle_scheme(stof_layer *L, layer_tuner *t)
{
    int best[2] = {L->ja, L->jb};
    double best_ms;
    stof__layer_build_steps(L, best[0], best[1]);
    if (stof__layer_time_it(t, NULL, &best_ms))
        return;
    for (int which = 0; which < (L->d.pre_norm ? 1 : 2); which++) {
        const int g0 = which ? G_B_RES : G_A_RES,
                  n0 = which ? N_B_PLAIN : N_A_PLAIN;
        double least = INFINITY;
        for (int j = 0; j < J_COUNT; j++) {
            const double c = stof__layer_junction_cost(L, j, g0, n0, 1);
            if (c < least)
                least = c;
        }
        const int pick = best[which];
        for (int j = 0; j < J_COUNT; j++) {
            if (j == pick || !(stof__layer_junction_cost(L, j, g0, n0, 1) <=
                               SETTLE_RATIO * least))
                continue;
            int o[2] = {best[0], best[1]};
            o[which] = j;
            stof__layer_build_steps(L, o[0], o[1]);
            double ms;
            if (stof__layer_time_it(t, NULL, &ms))
                break;
            stof__log(L->ctx, STOF_LOG_DEBUG,
                      "layer tune: junction %c as %s: %.4f ms a layer, "
                      "%.4f as %s",
                      'a' + which, j_name[j], ms, best_ms,
                      j_name[best[which]]);
            if (ms < 0.99 * best_ms) {
                best[which] = j;
                best_ms = ms;
            }
        }
    }
    stof__layer_build_steps(L, best[0], best[1]);
}

/* The measured time of the model's scheme and first choices. */
static double model_scheme_ms(stof_layer *L, const layer_winner *wg,
                              const layer_winner *wn)
{
    const int mja = stof__layer_pick_junction(L, G_A_RES, N_A_PLAIN, 0);
    const int mjb = L->d.pre_norm
                        ? 0
                        : stof__layer_pick_junction(L, G_B_RES, N_B_PLAIN, 0);
    double model = 0;
    const int keep_ja = L->ja, keep_jb = L->jb;
    stof__layer_build_steps(L, mja < 0 ? 0 : mja, mjb < 0 ? 0 : mjb);
    for (int i = 0; i < L->n_steps; i++) {
        const step *s = &L->steps[i];
        const layer_winner *w = s->kind == STEP_GEMM   ? &wg[s->op]
                                : s->kind == STEP_NORM ? &wn[s->op]
                                                       : NULL;
        if (w)
            model += w->first_ms ? w->first_ms : w->ms;
    }
    stof__layer_build_steps(L, keep_ja, keep_jb);
    return model;
}

/* Programmatic launches or not: the scheme as a stack runs it, timed both
 * ways in CUDA graphs (stof__layer_time_pdl), the choice stored with the
 * scheme (stof__layer_pdl_pick). Not timed where the choice cannot matter
 * or is not the plan's (before compute capability 9.0; STOF_PDL set) or
 * when the tuning budget is spent: the rule decides at plan time then. */
static void choose_pdl(stof_layer *L, layer_tuner *t)
{
    stof_context *ctx = L->ctx;
    double ms[2];
    if (ctx->device.cc_major < 9 || stof__pdl_for(0) == stof__pdl_for(1) ||
        (t->deadline > 0 && now_s() > t->deadline))
        return;
    if (stof__layer_time_pdl(t, ms) != 0) {
        stof__log(ctx, STOF_LOG_INFO,
                  "layer tune: the stack graphs that time programmatic "
                  "launches did not run (a CUDA error); the rule decides");
        return;
    }
    L->pdl = stof__layer_pdl_pick(ms[0], ms[1],
                                  stof__layer_pdl_rule(&ctx->device, L->M));
    L->pdl_ms[0] = ms[0];
    L->pdl_ms[1] = ms[1];
    stof__log(ctx, STOF_LOG_INFO,
              "layer tune: programmatic launches %s: %.4f ms a layer with, "
              "%.4f without (a stack graph of 8 layers)",
              L->pdl ? "on" : "off", ms[1], ms[0]);
}

stof_status stof__layer_tune(stof_layer *L, const char *spec,
                             const char *mask_hex, int model_only)
{
    stof_context *ctx = L->ctx;
    const double t0 = now_s();
    const int top_k = ctx->settings.tuning_top_k > 0
                          ? ctx->settings.tuning_top_k
                          : 3;
    const int per_op = model_only ? 1 : (top_k + 1 < MAX_TPL ? top_k + 1
                                                             : MAX_TPL);
    /* (stopped at the end whatever happens before it starts) */
    layer_tuner t;
    memset(&t, 0, sizeof(t));
    t.L = L;
    stof_status st = STOF_OK;
    if (model_only) {
        /* Nothing is run: no scratch data, no timing. */
    } else {
        /* The split FFN candidates of a gated layer run with the gate,
         * the split QKV candidates of a RoPE layer with the rope kernel. */
        st = stof__layer_gate_ready(L);
        if (st == STOF_OK)
            st = stof__layer_rope_ready(L);
        /* Any cuBLASLt candidate's workspace while they are timed (the
         * plan keeps what its choice needs: layer.c). */
        char why[256];
        if (st == STOF_OK && stof__blaslt_available(why, sizeof(why)))
            st = stof__layer_lt_ws(L, STOF_BLASLT_WORKSPACE, 0);
        if (st == STOF_OK)
            st = stof__layer_tuner_start(L, &t);
    }
    slot_op so[G_COUNT + N_COUNT];
    stof_search_op ops[G_COUNT + N_COUNT];
    stof_search_result res[G_COUNT + N_COUNT];
    memset(so, 0, sizeof(so));
    int n_ops = 0;
    if (st == STOF_OK)
        n_ops = make_ops(L, model_only ? NULL : &t, per_op, model_only, so,
                         ops);
    stof__log(ctx, STOF_LOG_INFO,
              "layer tune: %d tokens, hidden %d, ffn %d: %d kernel slots",
              L->M, L->d.hidden, L->d.ffn, n_ops);
    if (st == STOF_OK) {
        stof_search_opts o = {.top_k = top_k,
                              .threads = ctx->settings.compile_threads,
                              .budget_s = ctx->settings.tuning_budget_s,
                              .model_only = model_only};
        /* A slot without a usable kernel (a row-complete GEMM that does
         * not fit, say) is not an error: the scheme goes without it. */
        (void)stof__search_run(ctx, ops, n_ops, &o, res);
    }
    layer_winner wg[G_COUNT], wn[N_COUNT];
    memset(wg, 0, sizeof(wg));
    memset(wn, 0, sizeof(wn));
    for (int k = 0; st == STOF_OK && k < n_ops; k++) {
        slot_op *o = &so[k];
        layer_winner *w = o->is_norm ? &wn[o->op] : &wg[o->op];
        if (apply_winner(o, &res[k], w))
            continue;
        if (o->is_norm) {
            stof__layer_norm_unload(L, &L->n[o->op]);
        } else {
            stof__layer_gemm_unload(L, &L->g[o->op]);
            stof__log(ctx, STOF_LOG_INFO,
                      "layer tune: %s: no usable kernel%s", o->name,
                      o->op == G_A_NORM || o->op == G_B_NORM
                          ? " (the row-complete variant may not fit)"
                          : "");
        }
    }
    if (st == STOF_OK)
        st = pick_scheme(L, model_only);
    if (st == STOF_OK && !model_only)
        settle_scheme(L, &t);
    if (st == STOF_OK) {
        const double model = model_scheme_ms(L, wg, wn);
        stof__layer_unload_unused(L);
        L->model_ms = model_only ? 0 : model;
        if (!model_only) {
            double ms = 0;
            if (stof__layer_time_it(&t, NULL, &ms) == 0)
                L->layer_ms = ms;
            choose_pdl(L, &t);
            L->tune_s = now_s() - t0;
            stof__log(ctx, STOF_LOG_INFO,
                      "layer tune: scheme %s / %s: %.4f ms a layer (%.1f s "
                      "of tuning)",
                      j_name[L->ja],
                      L->d.pre_norm ? (L->jb == J_FUSED ? "stack" : "-")
                                    : j_name[L->jb],
                      L->layer_ms, L->tune_s);
            stof__layer_store(L, spec, mask_hex, wg, wn, t.reps, t.n_rows,
                              (double)t.tol);
        }
    }
    for (int k = 0; k < n_ops; k++)
        stof__blaslt_free(&so[k].lt);
    if (n_ops)
        stof__search_results_free(res, n_ops);
    stof__layer_tuner_stop(&t);
    return st;
}
