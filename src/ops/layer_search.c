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

#define FLUSH_BYTES (128u << 20)
#define MAX_TPL 8   /* template candidates timed per GEMM */
#define MAX_LT 8    /* cuBLASLt algorithms timed per GEMM */
#define VROWS 6     /* rows checked against the C reference */

/* A GEMM's reference on the sampled rows, with the inputs it was computed
 * from: every candidate of an op reads the same inputs, so the reference
 * (a large share of a wide FFN's tuning time on the CPU) is computed once
 * and reused while the inputs are bit-identical. */
typedef struct ref_entry {
    float *in, *ref, *ref_pre; /* one allocation: inputs, then outputs */
    size_t n_in;
} ref_entry;

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
    ref_entry ref_cache[G_COUNT];
} tuner;

static double now_s(void)
{
    return stof__now_ms() * 1e-3;
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
    CUdeviceptr pa = stof__layer_sym_ptr(L, wp, t->x, t->y, s->s[O_A]);
    CUdeviceptr pr = stof__layer_sym_ptr(L, wp, t->x, t->y, s->s[O_RES]);
    CUdeviceptr pb = stof__layer_sym_ptr(L, wp, t->x, t->y, s->s[O_BIAS]);
    CUdeviceptr pg = stof__layer_sym_ptr(L, wp, t->x, t->y, s->s[O_GAMMA]);
    CUdeviceptr pe = stof__layer_sym_ptr(L, wp, t->x, t->y, s->s[O_BETA]);
    CUdeviceptr po = stof__layer_sym_ptr(L, wp, t->x, t->y, s->s[O_OUT]);
    CUdeviceptr pp = stof__layer_sym_ptr(L, wp, t->x, t->y, s->s[O_PRE]);
    const int N = s->kind == STEP_GEMM ? L->g[s->op].N : L->d.hidden;
    const int K = s->kind == STEP_GEMM ? L->g[s->op].K : L->d.hidden;
    /* W's rows and the bias's length: 2N for a gated op. */
    const int WN = s->kind == STEP_GEMM && L->g[s->op].epi.gated ? 2 * N : N;
    float *A = calloc((size_t)R * K, sizeof(float));
    float *W = NULL;
    if (s->kind == STEP_GEMM) {
        /* The weight is the same for every candidate of an op. */
        if (!t->w_host[s->op]) {
            float *w = malloc(sizeof(float) * (size_t)WN * K);
            if (w && fetch_vec(t, stof__layer_sym_ptr(L, wp, t->x, t->y, s->s[O_W]),
                               (size_t)WN * K, w)) {
                free(w);
                w = NULL;
            }
            t->w_host[s->op] = w;
        }
        W = t->w_host[s->op];
    }
    float *res = calloc((size_t)R * N, sizeof(float));
    float *vec = calloc((size_t)N * 2 + WN, sizeof(float));
    float *out = calloc((size_t)R * N, sizeof(float));
    float *pre = calloc((size_t)R * N, sizeof(float));
    float *ref = calloc((size_t)R * N, sizeof(float));
    float *ref_pre = calloc((size_t)R * N, sizeof(float));
    double err = INFINITY;
    if (!A || (s->kind == STEP_GEMM && !W) || !res || !vec || !out || !pre ||
        !ref || !ref_pre)
        goto done;
    float *bias = pb ? vec : NULL, *gamma = pg ? vec + WN : NULL,
          *beta = pe ? vec + WN + N : NULL;
    if (fetch_rows(t, pa, K, K, A) || (pr && fetch_rows(t, pr, N, N, res)) ||
        fetch_vec(t, pb, (size_t)WN, vec) ||
        fetch_vec(t, pg, (size_t)N, vec + WN) ||
        fetch_vec(t, pe, (size_t)N, vec + WN + N) ||
        fetch_rows(t, po, N, N, out) || (pp && fetch_rows(t, pp, N, N, pre)))
        goto done;
    if (s->kind == STEP_GEMM) {
        const size_t na = (size_t)R * K, nr = (size_t)R * N,
                     nv = (size_t)N * 2 + WN, no = (size_t)R * N;
        const size_t n_in = na + nr + nv;
        ref_entry *c = &t->ref_cache[s->op];
        int hit = c->in && c->n_in == n_in &&
                  !memcmp(c->in, A, na * sizeof(float)) &&
                  !memcmp(c->in + na, res, nr * sizeof(float)) &&
                  !memcmp(c->in + na + nr, vec, nv * sizeof(float));
        if (hit) {
            memcpy(ref, c->ref, no * sizeof(float));
            memcpy(ref_pre, c->ref_pre, no * sizeof(float));
        } else {
            stof__ref_gemm(A, W, bias, pr ? res : NULL, gamma, beta, R, N, K,
                           K, K, N, &L->g[s->op].epi, L->eps, L->d.dtype, ref,
                           pp ? ref_pre : NULL);
            free(c->in);
            c->n_in = n_in;
            c->in = malloc(sizeof(float) * (n_in + 2 * no));
            if (c->in) {
                c->ref = c->in + n_in;
                c->ref_pre = c->ref + no;
                memcpy(c->in, A, na * sizeof(float));
                memcpy(c->in + na, res, nr * sizeof(float));
                memcpy(c->in + na + nr, vec, nv * sizeof(float));
                memcpy(c->ref, ref, no * sizeof(float));
                memcpy(c->ref_pre, ref_pre, no * sizeof(float));
            }
        }
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
        return stof__layer_launch_gemm(L, &L->g[s->op], s, t->wp, t->x, t->y, NULL);
    return stof__layer_launch_norm(L, &L->n[s->op], s, t->wp, t->x, t->y, NULL);
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
                           : stof__layer_run_steps(L, t->wp, t->x, t->y, NULL);
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
        stof__layer_build_steps(L, j, j);
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

static stof_status tuner_start(stof_layer *L, tuner *t)
{
    memset(t, 0, sizeof(*t));
    t->L = L;
    stof_context *ctx = L->ctx;
    const stof_api *api = ctx->api;
    const stof_layer_desc *d = &L->d;
    const size_t h = (size_t)d->hidden, f = (size_t)d->ffn,
                 M = (size_t)L->M, qn = (size_t)stof__layer_qkv_n(d),
                 f1 = d->gated ? 2 * f : f; /* the first FFN GEMM's N */
    /* Scratch weights, X and Y, each 256-byte aligned. */
    const size_t sizes[SYM_COUNT] = {
        [SYM_X] = M * h, [SYM_Y] = M * h, [SYM_WQKV] = qn * h,
        [SYM_BQKV] = qn, [SYM_WO] = h * h, [SYM_BO] = h,
        [SYM_W1] = f1 * h, [SYM_B1] = f1, [SYM_W2] = h * f, [SYM_B2] = h,
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
        st = fill(L, &t->aux, L->buf[s], M * (size_t)stof__layer_tok_ld(L, s),
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
    for (int i = 0; i < G_COUNT; i++) {
        free(t->w_host[i]);
        free(t->ref_cache[i].in);
    }
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
stof_status stof__layer_verify_loaded(stof_layer *L, stof_db *db,
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
    tuner *t;              /* scratch data (NULL when nothing is run) */
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
        snprintf(buf, n, "gemm wgmma %dx%dx%d st%d", c->cfg.block_m,
                 c->cfg.block_n, c->cfg.block_k, c->cfg.stages);
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
    (void)size;
    stof_status st;
    if (o->is_norm) {
        st = stof__layer_norm_load(L, &L->n[o->op], c->warps, art);
    } else if (c->kind == KIND_CUBLASLT) {
        uint8_t bytes[STOF_BLASLT_ALGO_BYTES];
        stof__blaslt_algo_bytes(o->lt, c->algo, bytes);
        st = stof__layer_gemm_load_lt(L, &L->g[o->op], bytes);
    } else {
        st = stof__layer_gemm_load_template(L, &L->g[o->op], &c->cfg, art);
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
    stof_status st = launch_step(o->t, &o->s);
    if (st == STOF_OK && o->L->ctx->api->cuCtxSynchronize() != CUDA_SUCCESS)
        st = STOF_ERR_CUDA;
    if (st != STOF_OK) {
        snprintf(err, errn, "run failed: %s", stof_status_str(st));
        return 1;
    }
    *rel = verify_step(o->t, &o->s);
    return 0;
}

static int so_time(void *user, void *handle, double *ms, char *err,
                   size_t errn)
{
    slot_op *o = user;
    (void)handle;
    if (time_it(o->t, &o->s, ms)) {
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
     * template makes the wide product. */
    const stof_gemm_epi wide = stof__layer_kernel_epi(g, 1, NULL);
    const int wn = g->epi.gated ? 2 * g->N : g->N;
    const double gate_ms = g->epi.gated ? gate_model_ms(L) : 0.0;
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
    if (nc == 0 && g->epi.gated && cands && ranked) {
        nc = stof__gemm_candidates(&L->ctx->device, &wide, g->M, wn, g->K,
                                   cands, 256);
        int k = 0; /* mma.sync only: a wide wgmma kernel would be split */
        for (int c = 0; c < nc; c++)
            if (!cands[c].wgmma)
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
                                            &g->epi, g->M, g->N, g->K)};
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
static int make_ops(stof_layer *L, tuner *t, int per_op, int model_only,
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
            probe_step(L, is_norm, i, &o->s);
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
        st = stof__layer_norm_load(L, &L->n[o->op], c->warps, r->winner_art);
    } else if (c->kind == KIND_CUBLASLT) {
        stof__blaslt_algo_bytes(o->lt, c->algo, w->algo);
        st = stof__layer_gemm_load_lt(L, &L->g[o->op], w->algo);
    } else {
        st = stof__layer_gemm_load_template(L, &L->g[o->op], &c->cfg,
                                            r->winner_art);
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
    } else {
        gemm_op *g = &L->g[o->op];
        g->ms = r->winner_ms;
        g->n_timed = r->n_timed;
        g->n_rejected = r->n_rejected;
        stof__log(L->ctx, STOF_LOG_INFO,
                  "layer tune: %-9s %6dx%5dx%5d  best %s %.4f ms of %d timed "
                  "(%d rejected)",
                  g_slot[o->op], g->M, g->N, g->K,
                  g->lt ? "cublaslt" : "template", r->winner_ms, r->n_timed,
                  r->n_rejected);
    }
    return 1;
}

/* --- tuning: the engine's client ------------------------------------------- */

/* Pick the scheme from the slots' results; STOF_ERR_UNSUPPORTED when no
 * scheme has a kernel for every step. */
static stof_status pick_scheme(stof_layer *L, int model_only)
{
    /* The scheme: measured costs, or the model's. */
    int ja = stof__layer_pick_junction(L, G_A_RES, N_A_PLAIN, !model_only);
    int jb = L->d.pre_norm
                 ? 0
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
    tuner t;
    stof_status st = STOF_OK;
    if (model_only) {
        /* Nothing is run: no scratch data, no timing. */
        memset(&t, 0, sizeof(t));
        t.L = L;
    } else {
        st = tuner_start(L, &t);
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
    if (st == STOF_OK) {
        const double model = model_scheme_ms(L, wg, wn);
        stof__layer_unload_unused(L);
        L->model_ms = model_only ? 0 : model;
        if (!model_only) {
            double ms = 0;
            if (time_it(&t, NULL, &ms) == 0)
                L->layer_ms = ms;
            L->tune_s = now_s() - t0;
            stof__log(ctx, STOF_LOG_INFO,
                      "layer tune: scheme %s / %s: %.4f ms a layer (%.1f s "
                      "of tuning)",
                      j_name[L->ja], L->d.pre_norm ? "-" : j_name[L->jb],
                      L->layer_ms, L->tune_s);
            stof__layer_store(L, spec, mask_hex, wg, wn, t.reps, t.n_rows,
                              (double)t.tol);
        }
    }
    for (int k = 0; k < n_ops; k++)
        stof__blaslt_free(&so[k].lt);
    if (n_ops)
        stof__search_results_free(res, n_ops);
    tuner_stop(&t);
    return st;
}
