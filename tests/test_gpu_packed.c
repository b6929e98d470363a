/*
 * test_gpu_packed.c - the packed layout (STOF_LAYOUT_PACKED) on the GPU:
 *  - the GPU format builder over packed sequences (one format of
 *    total_q x total_k holding every sequence's mask on its diagonal
 *    block) against stof_format_build of the same matrix composed on the
 *    CPU from stof_mask_family_eval, bit for bit, on every family the GPU
 *    evaluates: random sequence lengths (empty ones, q length != k length,
 *    cu_seqlens_k NULL), offsets, prefixes, documents per packed key,
 *    per-sequence seeds, rows and keys past the last sequence, workspaces
 *    larger than the run, poisoned and reused for a second instance, five
 *    tilings;
 *  - the padded builder with per-sequence seeds (bigbird) against
 *    stof_format_build_family, with seeds that change the masks;
 *  - attention on packed plans: one plan per family (its sample's totals
 *    below the plan's rows, or 0) runs three instances (new offsets,
 *    totals and seeds) without compiling anything, in
 *    tensors of exactly the run's rows, each row of every head checked
 *    against the C reference with its sequence's mask, rows outside every
 *    sequence exactly 0, outputs poisoned first; fp16 and bf16, head_dim
 *    64 and 128;
 *  - misuse of packed plans refused with messages that say why.
 */
#include <criterion/criterion.h>
#include <criterion/logging.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cuda_shim.h"
#include "internal.h"
#include "mask_build.h"
#include "testutil.h"

static void remove_db(void);
TestSuite(gpu_packed, .fini = remove_db, .timeout = 900);

#define MAXSEQ 8

/* A user database of this process only (cache-only mode records misses). */
static const char *db_path(void)
{
    return tu_process_db("packed");
}

static void remove_db(void)
{
    tu_remove_db(db_path());
}

/* Cache-only tuning into this process's database: the cost model's
 * choice, no search, so plans take seconds. */
static stof_context *open_quick(void)
{
    stof_settings s;
    stof_default_settings(&s);
    s.tuning_mode = STOF_TUNE_CACHE_ONLY;
    s.user_db = db_path();
    return tu_open_gpu_or_skip(&s);
}

/* ------------------------------------------------------------------------ */
/* Packed instances                                                          */
/* ------------------------------------------------------------------------ */

typedef struct pinst {
    int n;                               /* sequences */
    int32_t cu_q[MAXSEQ + 1], cu_k[MAXSEQ + 1]; /* cu_k = cu_q if same_k */
    int same_k;                          /* cu_seqlens_k NULL */
    int32_t q_offset[MAXSEQ], prefix[MAXSEQ];
    uint64_t seed[MAXSEQ];
    int has_seed;                        /* seed NULL when 0 */
    int32_t *doc;                        /* per packed key: n_doc entries */
    int n_doc;                           /* max(cu_k[n], 1) */
    int total_q, total_k;                /* this run's rows (>= 1) */
    stof_mask_data host;
} pinst;

/* n sequences of lengths 0..max_len, rows and keys past the last
 * sequence 0..max_slack. */
static void pinst_random(pinst *in, tu_rng *r, int n, int max_len,
                         int max_slack)
{
    memset(in, 0, sizeof(*in));
    in->n = n;
    in->same_k = tu_below(r, 4) == 0;
    in->has_seed = tu_below(r, 4) != 0;
    for (int b = 0; b < n; b++) {
        const int kind = (int)tu_below(r, 6);
        int lq = kind == 0 ? 0 : (int)tu_below(r, (uint64_t)max_len + 1);
        int lk = kind == 1   ? 0
                 : kind == 2 ? lq
                             : (int)tu_below(r, (uint64_t)max_len + 1);
        if (kind == 3)
            lq = max_len; /* a full-length one */
        if (in->same_k)
            lk = lq;
        in->cu_q[b + 1] = in->cu_q[b] + lq;
        in->cu_k[b + 1] = in->cu_k[b] + lk;
        in->q_offset[b] = tu_below(r, 3) == 0 ? (lk > lq ? lk - lq : 0)
                                              : (int)tu_below(r, 40);
        in->prefix[b] = (int)tu_below(r, (uint64_t)lk + 8);
        in->seed[b] = tu_below(r, 4) == 0 ? 0 : tu_next(r);
    }
    /* Documents: non-decreasing within each sequence, restarting at any
     * id at each sequence's first key. */
    in->n_doc = in->cu_k[n] > 0 ? in->cu_k[n] : 1;
    in->doc = malloc(sizeof(int32_t) * (size_t)in->n_doc);
    in->doc[0] = 0;
    for (int b = 0; b < n; b++) {
        int d = (int)tu_below(r, 6), run = 1 + (int)tu_below(r, 90);
        for (int k = in->cu_k[b]; k < in->cu_k[b + 1]; k++) {
            if (--run == 0) {
                d += 1 + (int)tu_below(r, 2);
                run = 1 + (int)tu_below(r, 90);
            }
            in->doc[k] = d;
        }
    }
    in->total_q = in->cu_q[n] + (tu_below(r, 3) == 0
                                     ? 0
                                     : (int)tu_below(r, (uint64_t)max_slack + 1));
    in->total_k = in->cu_k[n] + (tu_below(r, 3) == 0
                                     ? 0
                                     : (int)tu_below(r, (uint64_t)max_slack + 1));
    if (in->total_q < 1)
        in->total_q = 1;
    if (in->total_k < 1)
        in->total_k = 1;
    stof_mask_data *h = &in->host;
    h->cu_seqlens_q = in->cu_q;
    h->cu_seqlens_k = in->same_k ? NULL : in->cu_k;
    h->q_offset = in->q_offset;
    h->prefix = in->prefix;
    h->doc_id = in->doc;
    h->seed = in->has_seed ? in->seed : NULL;
    h->total_q = in->total_q;
    h->total_k = in->total_k;
}

static void pinst_free(pinst *in)
{
    free(in->doc);
    in->doc = NULL;
}

static int seq_q_len(const pinst *in, int b)
{
    return in->cu_q[b + 1] - in->cu_q[b];
}

static int seq_k_len(const pinst *in, int b)
{
    return in->cu_k[b + 1] - in->cu_k[b];
}

/* Device memory of `bytes` holding src (the context is current); one
 * allocation per array, so an access past one is an error the
 * compute-sanitizer reports. */
static CUdeviceptr dev_copy(const void *src, size_t bytes)
{
    const stof_api *api = stof__api();
    CUdeviceptr p = 0;
    cr_assert_eq(api->cuMemAlloc(&p, bytes), CUDA_SUCCESS);
    cr_assert_eq(api->cuMemcpyHtoD(p, src, bytes), CUDA_SUCCESS);
    return p;
}

/* The instance's arrays in device memory (0: not given). */
typedef struct dev_pinst {
    CUdeviceptr cu_q, cu_k, q_offset, prefix, doc, seed;
} dev_pinst;

static void dpinst_upload(stof_context *ctx, const pinst *in, dev_pinst *d)
{
    memset(d, 0, sizeof(*d));
    const size_t cu = sizeof(int32_t) * (size_t)(in->n + 1);
    const size_t per = sizeof(int32_t) * (size_t)in->n;
    cr_assert_eq(stof__ctx_push(ctx), STOF_OK);
    d->cu_q = dev_copy(in->cu_q, cu);
    if (!in->same_k)
        d->cu_k = dev_copy(in->cu_k, cu);
    d->q_offset = dev_copy(in->q_offset, per);
    d->prefix = dev_copy(in->prefix, per);
    d->doc = dev_copy(in->doc, sizeof(int32_t) * (size_t)in->n_doc);
    if (in->has_seed)
        d->seed = dev_copy(in->seed, sizeof(uint64_t) * (size_t)in->n);
    stof__ctx_pop(ctx);
}

static void dpinst_free(stof_context *ctx, dev_pinst *d)
{
    const stof_api *api = stof__api();
    const CUdeviceptr all[] = {d->cu_q,   d->cu_k, d->q_offset,
                               d->prefix, d->doc,  d->seed};
    stof__ctx_push(ctx);
    for (size_t i = 0; i < sizeof(all) / sizeof(all[0]); i++)
        if (all[i])
            api->cuMemFree(all[i]);
    stof__ctx_pop(ctx);
    memset(d, 0, sizeof(*d));
}

/* The builder's view of the device instance; total_q / total_k as given
 * (0: the workspace's most). */
static void dpinst_mb(const dev_pinst *d, int total_q, int total_k,
                      stof_mb_data *md)
{
    memset(md, 0, sizeof(*md));
    md->cu_q = d->cu_q;
    md->cu_k = d->cu_k;
    md->q_offset = d->q_offset;
    md->prefix = d->prefix;
    md->doc_id = d->doc;
    md->seed = d->seed;
    md->total_q = total_q;
    md->total_k = total_k;
}

/* The public API's view of the device instance (for runs). */
static void dpinst_data(const pinst *in, const dev_pinst *d,
                        stof_mask_data *md)
{
    memset(md, 0, sizeof(*md));
    md->cu_seqlens_q = (const int32_t *)(uintptr_t)d->cu_q;
    md->cu_seqlens_k = (const int32_t *)(uintptr_t)d->cu_k;
    md->q_offset = (const int32_t *)(uintptr_t)d->q_offset;
    md->prefix = (const int32_t *)(uintptr_t)d->prefix;
    md->doc_id = (const int32_t *)(uintptr_t)d->doc;
    md->seed = (const uint64_t *)(uintptr_t)d->seed;
    md->total_q = in->total_q;
    md->total_k = in->total_k;
}

/* The packed instance's mask composed on the CPU: tq x tk, sequence b's
 * own mask (stof_mask_family_eval at its lengths) on its diagonal block,
 * nothing elsewhere. */
static stof_mask *packed_cpu_mask(stof_context *ctx,
                                  const stof_mask_family *fam,
                                  const pinst *in, int tq, int tk)
{
    uint8_t *dense = calloc((size_t)tq * (size_t)tk, 1);
    cr_assert_not_null(dense);
    for (int b = 0; b < in->n; b++) {
        const int lq = seq_q_len(in, b), lk = seq_k_len(in, b);
        if (lq == 0 || lk == 0)
            continue;
        stof_mask *m = NULL;
        cr_assert_eq(stof_mask_family_eval(ctx, fam, lq, lk, &in->host, b,
                                           &m),
                     STOF_OK, "%s", stof_errmsg(ctx));
        uint8_t *sd = malloc((size_t)lq * (size_t)lk);
        stof_mask_to_dense(m, sd);
        for (int q = 0; q < lq; q++)
            memcpy(dense + (size_t)(in->cu_q[b] + q) * (size_t)tk +
                       (size_t)in->cu_k[b],
                   sd + (size_t)q * (size_t)lk, (size_t)lk);
        free(sd);
        stof_mask_free(&m);
    }
    stof_mask *out = NULL;
    cr_assert_eq(stof_mask_from_dense(ctx, dense, tq, tk, &out), STOF_OK,
                 "%s", stof_errmsg(ctx));
    free(dense);
    return out;
}

/* ------------------------------------------------------------------------ */
/* GPU builds against CPU formats                                            */
/* ------------------------------------------------------------------------ */

/* A build's arrays on the host. */
typedef struct gpu_build {
    int32_t *rp;                  /* the first n_rp row_ptr entries */
    int n_rp;
    int64_t stats[STOF_MB_STATS];
    int64_t nt;                   /* rp[n_rp - 1]: the tiles */
    int32_t *col, *bidx;
    uint8_t *kind;
    uint32_t *bits;               /* the whole pool */
    size_t tw;                    /* words of a tile's bitmap */
    uint8_t *slot_seen;           /* pool slots used so far */
    int64_t pool_cap;
} gpu_build;

/* Build on the GPU, wait, download the first n_rp row_ptr entries and
 * the tiles they index. */
static void gpu_build_run(stof_context *ctx, const stof_mb_kernels *k,
                          const stof_mb_workspace *ws, const stof_mb_data *d,
                          int n_rp, gpu_build *g)
{
    const stof_api *api = stof__api();
    memset(g, 0, sizeof(*g));
    cr_assert_eq(stof__ctx_push(ctx), STOF_OK);
    cr_assert_eq(stof__mb_build(k, ws, d, NULL, api), STOF_OK);
    cr_assert_eq(api->cuCtxSynchronize(), CUDA_SUCCESS, "builder failed");
    g->n_rp = n_rp;
    g->rp = malloc(sizeof(int32_t) * (size_t)n_rp);
    api->cuMemcpyDtoH(g->rp, ws->row_ptr, sizeof(int32_t) * (size_t)n_rp);
    api->cuMemcpyDtoH(g->stats, ws->stats, sizeof(g->stats));
    g->nt = g->rp[n_rp - 1];
    cr_assert(g->nt >= 0 && g->nt <= ws->tile_cap, "%lld tiles of %lld",
              (long long)g->nt, (long long)ws->tile_cap);
    g->tw = (size_t)ws->block_m * (size_t)ws->bwpr;
    g->pool_cap = ws->pool_cap;
    g->col = malloc(sizeof(int32_t) * (size_t)(g->nt + 1));
    g->bidx = malloc(sizeof(int32_t) * (size_t)(g->nt + 1));
    g->kind = malloc((size_t)g->nt + 1);
    g->bits = malloc(sizeof(uint32_t) * ((size_t)ws->pool_cap * g->tw + 1));
    g->slot_seen = calloc((size_t)ws->pool_cap + 1, 1);
    if (g->nt > 0) {
        api->cuMemcpyDtoH(g->col, ws->col_idx, sizeof(int32_t) * (size_t)g->nt);
        api->cuMemcpyDtoH(g->bidx, ws->bitmap_idx,
                          sizeof(int32_t) * (size_t)g->nt);
        api->cuMemcpyDtoH(g->kind, ws->kind, (size_t)g->nt);
    }
    if (ws->pool_cap > 0)
        api->cuMemcpyDtoH(g->bits, ws->bitmaps,
                          sizeof(uint32_t) * (size_t)ws->pool_cap * g->tw);
    stof__ctx_pop(ctx);
}

static void gpu_build_free(gpu_build *g)
{
    free(g->rp);
    free(g->col);
    free(g->bidx);
    free(g->kind);
    free(g->bits);
    free(g->slot_seen);
    memset(g, 0, sizeof(*g));
}

/* Row blocks rb0 .. rb0 + f->n_row_blocks of the build against f: row
 * pointers (relative to rb0's), key blocks, kinds, and each partial
 * tile's bitmap in a pool slot of its own. Returns the most tiles of a row
 * block. */
static int64_t compare_format(gpu_build *g, int64_t rb0, const stof_format *f,
                              const char *what)
{
    cr_assert(rb0 + f->n_row_blocks < g->n_rp, "%s: %d row blocks at %lld",
              what, f->n_row_blocks, (long long)rb0);
    const int64_t base = g->rp[rb0];
    int64_t most = 0;
    for (int i = 0; i <= f->n_row_blocks; i++) {
        const int64_t got = g->rp[rb0 + i] - base;
        cr_assert_eq(got, f->row_ptr[i], "%s: row_ptr[%d] gpu %lld cpu %lld",
                     what, i, (long long)got, (long long)f->row_ptr[i]);
        if (i < f->n_row_blocks && f->row_ptr[i + 1] - f->row_ptr[i] > most)
            most = f->row_ptr[i + 1] - f->row_ptr[i];
    }
    const int64_t n = f->row_ptr[f->n_row_blocks];
    cr_assert(base >= 0 && base + n <= g->nt, "%s: tiles %lld + %lld of %lld",
              what, (long long)base, (long long)n, (long long)g->nt);
    int i = 0; /* the row block of entry e */
    for (int64_t e = 0; e < n; e++) {
        while (f->row_ptr[i + 1] <= e)
            i++;
        const int64_t x = base + e;
        cr_assert_eq(g->col[x], f->col_idx[e],
                     "%s: row block %d tile %lld: key block gpu %d cpu %d",
                     what, i, (long long)e, g->col[x], f->col_idx[e]);
        cr_assert_eq(g->kind[x], f->kind[e],
                     "%s: row block %d tile %lld (key block %d): kind gpu %d "
                     "cpu %d",
                     what, i, (long long)e, f->col_idx[e], g->kind[x],
                     f->kind[e]);
        if (f->kind[e] == STOF_TILE_FULL) {
            cr_assert_eq(g->bidx[x], -1, "%s: full tile %lld has slot %d",
                         what, (long long)e, g->bidx[x]);
            continue;
        }
        const int32_t s = g->bidx[x];
        cr_assert(s >= 0 && s < g->pool_cap, "%s: tile %lld: pool slot %d of %lld",
                  what, (long long)e, s, (long long)g->pool_cap);
        cr_assert_eq(g->slot_seen[s]++, 0, "%s: tile %lld: pool slot %d taken "
                                           "twice",
                     what, (long long)e, s);
        cr_assert(memcmp(g->bits + (size_t)s * g->tw,
                         f->bitmaps + (size_t)f->bitmap_idx[e] * g->tw,
                         g->tw * sizeof(uint32_t)) == 0,
                  "%s: row block %d tile %lld (key block %d): bitmaps differ",
                  what, i, (long long)e, f->col_idx[e]);
    }
    return most;
}

static const char *gpu_specs[] = {
    "dense", "causal", "sliding:37", "causal_sliding:100", "dilated:60:3",
    "dilated:300:70", "longformer:40:9", "strided:33", "causal&docs",
    "causal|prefix", "docs&!prefix:10", "!causal", "!(sliding:50)&causal",
    "(causal&docs)|prefix:3", "sliding:20|strided:64&docs", "none", "docs",
    "prefix", "bigbird:64:3:2:3:1", "bigbird:16:3:1:5:77&causal",
    "bigbird:32:1:0:64:9|sliding:10", "!bigbird:8:2:1:1:3&docs",
};
#define N_GPU_SPECS ((int)(sizeof(gpu_specs) / sizeof(gpu_specs[0])))

static const int tilings[][2] = {{64, 64}, {128, 64}, {128, 128}, {64, 32},
                                 {16, 16}};
#define N_TILINGS ((int)(sizeof(tilings) / sizeof(tilings[0])))

/* Build the packed instance in the workspace (data totals as given: 0 is
 * the workspace's most) and compare with the CPU format of want (the
 * composed mask, run rows x run keys). */
static void check_packed(stof_context *ctx, const stof_mb_kernels *k,
                         const stof_mb_workspace *ws, const dev_pinst *di,
                         int data_tq, int data_tk, const stof_mask *want,
                         const char *what, int64_t counts[2])
{
    const int tq = data_tq ? data_tq : ws->seq_q;
    const int nrb = (tq + ws->block_m - 1) / ws->block_m;
    cr_assert(nrb <= ws->n_rb);
    stof_mb_data md;
    dpinst_mb(di, data_tq, data_tk, &md);
    gpu_build g;
    gpu_build_run(ctx, k, ws, &md, nrb + 1, &g);
    stof_format *f = NULL;
    cr_assert_eq(stof_format_build(ctx, want, ws->block_m, ws->block_n, &f),
                 STOF_OK, "%s", stof_errmsg(ctx));
    cr_assert_eq(f->n_row_blocks, nrb);
    cr_assert_eq(g.rp[0], 0, "%s: row_ptr[0] = %d", what, g.rp[0]);
    const int64_t most = compare_format(&g, 0, f, what);
    cr_assert_eq(g.stats[3], 0, "%s: overflow reported", what);
    cr_assert_eq(g.stats[0], g.nt, "%s: stats[0] %lld, %lld tiles", what,
                 (long long)g.stats[0], (long long)g.nt);
    cr_assert_eq(g.stats[0], f->n_full + f->n_partial,
                 "%s: non-empty tiles gpu %lld cpu %lld", what,
                 (long long)g.stats[0], (long long)(f->n_full + f->n_partial));
    cr_assert_eq(g.stats[1], f->n_partial, "%s: partial tiles gpu %lld cpu %lld",
                 what, (long long)g.stats[1], (long long)f->n_partial);
    cr_assert_eq(g.stats[2], most, "%s: most tiles of a row block gpu %lld "
                                   "cpu %lld",
                 what, (long long)g.stats[2], (long long)most);
    cr_assert_eq(g.stats[5], 0, "%s: sorted document ids reported unsorted",
                 what);
    counts[0] += g.nt;
    counts[1] += f->n_partial;
    stof_format_free(&f);
    gpu_build_free(&g);
}

Test(gpu_packed, packed_formats_match_the_cpu)
{
    stof_context *ctx = tu_open_gpu_or_skip(NULL);
    stof_mb_kernels k;
    cr_assert_eq(stof__mb_load(ctx, &k), STOF_OK, "%s", stof_errmsg(ctx));
    tu_rng r = {tu_seed()};
    static const int batches[] = {1, 3, 7};
    int builds = 0;
    int64_t counts[2] = {0, 0}; /* tiles, partial tiles compared */
    for (int s = 0; s < N_GPU_SPECS; s++) {
        stof_mask_family *fam = NULL, *pfam = NULL;
        cr_assert_eq(stof_mask_family_create(ctx, gpu_specs[s], &fam), STOF_OK);
        for (int bi = 0; bi < 6; bi++) {
            const int B = batches[bi % 3];
            cr_assert_eq(stof__family_packed(ctx, fam, B, &pfam), STOF_OK,
                         "%s", stof_errmsg(ctx));
            cr_assert_eq(stof__family_n_seq(pfam), B);
            /* Two instances in one workspace, sometimes larger than both. */
            pinst in[2];
            pinst_random(&in[0], &r, B, 300, 70);
            pinst_random(&in[1], &r, B, 300, 70);
            int wq = in[0].total_q > in[1].total_q ? in[0].total_q
                                                   : in[1].total_q;
            int wk = in[0].total_k > in[1].total_k ? in[0].total_k
                                                   : in[1].total_k;
            if (tu_below(&r, 2))
                wq += (int)tu_below(&r, 100);
            if (tu_below(&r, 2))
                wk += (int)tu_below(&r, 100);
            /* The totals the builder is given: 0 (the workspace's most)
             * sometimes when they are the most. */
            int dq[2], dk[2];
            stof_mask *want[2];
            dev_pinst di[2];
            for (int t = 0; t < 2; t++) {
                dq[t] = in[t].total_q == wq && tu_below(&r, 2) ? 0
                                                               : in[t].total_q;
                dk[t] = in[t].total_k == wk && tu_below(&r, 2) ? 0
                                                               : in[t].total_k;
                want[t] = packed_cpu_mask(ctx, fam, &in[t], in[t].total_q,
                                          in[t].total_k);
                dpinst_upload(ctx, &in[t], &di[t]);
            }
            for (int ti = 0; ti < N_TILINGS; ti++) {
                const int bm = tilings[ti][0], bn = tilings[ti][1];
                stof_mb_workspace ws;
                cr_assert_eq(stof__mb_workspace_new(ctx, pfam, 1, wq, wk, bm,
                                                    bn, &ws),
                             STOF_OK, "%s", stof_errmsg(ctx));
                cr_assert_eq(ws.n_seq, B);
                cr_assert_eq(ws.batch, 1);
                /* Poison the workspace past the program and stats. */
                stof__ctx_push(ctx);
                stof__api()->cuMemsetD8(ws.cnt, 0xa5,
                                        ws.mem + ws.bytes - ws.cnt);
                stof__ctx_pop(ctx);
                for (int t = 0; t < 2; t++) {
                    char what[256];
                    snprintf(what, sizeof(what),
                             "%s B=%d instance %d (%d x %d of %d x %d, cu_k "
                             "%s, seeds %s) %dx%d",
                             gpu_specs[s], B, t, in[t].total_q, in[t].total_k,
                             wq, wk, in[t].same_k ? "NULL" : "given",
                             in[t].has_seed ? "given" : "NULL", bm, bn);
                    check_packed(ctx, &k, &ws, &di[t], dq[t], dk[t], want[t],
                                 what, counts);
                    builds++;
                }
                stof__mb_workspace_free(ctx, &ws);
            }
            for (int t = 0; t < 2; t++) {
                dpinst_free(ctx, &di[t]);
                stof_mask_free(&want[t]);
                pinst_free(&in[t]);
            }
            stof_mask_family_free(&pfam);
        }
        stof_mask_family_free(&fam);
    }
    cr_log_info("compared %d packed builds: %lld tiles, %lld partial",
                builds, (long long)counts[0], (long long)counts[1]);
    stof__mb_unload(ctx, &k);
    stof_close(&ctx);
}

/* ------------------------------------------------------------------------ */
/* Per-sequence seeds, padded                                                */
/* ------------------------------------------------------------------------ */

typedef struct padinst {
    int batch, seq_q, seq_k;
    int32_t q_len[MAXSEQ], k_len[MAXSEQ], q_offset[MAXSEQ], prefix[MAXSEQ];
    uint64_t seed[MAXSEQ];
    int32_t *doc; /* batch * seq_k */
    stof_mask_data host;
    CUdeviceptr d_q_len, d_k_len, d_q_offset, d_prefix, d_doc, d_seed;
} padinst;

static void padinst_random(padinst *in, tu_rng *r, int batch, int seq_q,
                           int seq_k)
{
    memset(in, 0, sizeof(*in));
    in->batch = batch;
    in->seq_q = seq_q;
    in->seq_k = seq_k;
    in->doc = malloc(sizeof(int32_t) * (size_t)batch * (size_t)seq_k);
    for (int b = 0; b < batch; b++) {
        const int kind = b == 0 ? 1 : (int)tu_below(r, 5);
        in->q_len[b] = kind == 0 ? 0
                       : kind == 1
                           ? seq_q
                           : (int)tu_below(r, (uint64_t)seq_q + 1);
        in->k_len[b] = kind == 1 ? seq_k
                                 : (int)tu_below(r, (uint64_t)seq_k + 1);
        in->q_offset[b] = tu_below(r, 3) == 0
                              ? (in->k_len[b] > in->q_len[b]
                                     ? in->k_len[b] - in->q_len[b]
                                     : 0)
                              : (int)tu_below(r, 40);
        in->prefix[b] = (int)tu_below(r, (uint64_t)seq_k + 8);
        /* Sequence 0: full length with a seed, so seeds show. */
        in->seed[b] = b > 0 && tu_below(r, 4) == 0 ? 0 : (tu_next(r) | 1u);
        int d = (int)tu_below(r, 3), run = 1 + (int)tu_below(r, 90);
        for (int k = 0; k < seq_k; k++) {
            if (--run == 0) {
                d += 1 + (int)tu_below(r, 2);
                run = 1 + (int)tu_below(r, 90);
            }
            in->doc[(size_t)b * (size_t)seq_k + (size_t)k] = d;
        }
    }
    stof_mask_data *h = &in->host;
    h->q_len = in->q_len;
    h->k_len = in->k_len;
    h->q_offset = in->q_offset;
    h->prefix = in->prefix;
    h->doc_id = in->doc;
    h->doc_stride = seq_k;
    h->seed = in->seed;
}

static void padinst_upload(stof_context *ctx, padinst *in, stof_mb_data *md)
{
    const size_t per = sizeof(int32_t) * (size_t)in->batch;
    cr_assert_eq(stof__ctx_push(ctx), STOF_OK);
    in->d_q_len = dev_copy(in->q_len, per);
    in->d_k_len = dev_copy(in->k_len, per);
    in->d_q_offset = dev_copy(in->q_offset, per);
    in->d_prefix = dev_copy(in->prefix, per);
    in->d_doc = dev_copy(in->doc, per * (size_t)in->seq_k);
    in->d_seed = dev_copy(in->seed, sizeof(uint64_t) * (size_t)in->batch);
    stof__ctx_pop(ctx);
    memset(md, 0, sizeof(*md));
    md->q_len = in->d_q_len;
    md->k_len = in->d_k_len;
    md->q_offset = in->d_q_offset;
    md->prefix = in->d_prefix;
    md->doc_id = in->d_doc;
    md->doc_stride = in->seq_k;
    md->seed = in->d_seed;
}

static void padinst_free(stof_context *ctx, padinst *in)
{
    const stof_api *api = stof__api();
    const CUdeviceptr all[] = {in->d_q_len,  in->d_k_len, in->d_q_offset,
                               in->d_prefix, in->d_doc,   in->d_seed};
    stof__ctx_push(ctx);
    for (size_t i = 0; i < sizeof(all) / sizeof(all[0]); i++)
        if (all[i])
            api->cuMemFree(all[i]);
    stof__ctx_pop(ctx);
    free(in->doc);
    memset(in, 0, sizeof(*in));
}

/* Whether sequence b's seed changes its mask (against seed 0). */
static int seed_shows(stof_context *ctx, const stof_mask_family *fam,
                      const padinst *in, int b)
{
    stof_mask_data none = in->host;
    none.seed = NULL;
    stof_mask *a = NULL, *z = NULL;
    cr_assert_eq(stof_mask_family_eval(ctx, fam, in->seq_q, in->seq_k,
                                       &in->host, b, &a),
                 STOF_OK, "%s", stof_errmsg(ctx));
    cr_assert_eq(stof_mask_family_eval(ctx, fam, in->seq_q, in->seq_k, &none,
                                       b, &z),
                 STOF_OK, "%s", stof_errmsg(ctx));
    uint64_t da[2], dz[2];
    stof_mask_digest(a, da, NULL);
    stof_mask_digest(z, dz, NULL);
    stof_mask_free(&a);
    stof_mask_free(&z);
    return da[0] != dz[0] || da[1] != dz[1];
}

Test(gpu_packed, padded_seeds_match_the_cpu)
{
    stof_context *ctx = tu_open_gpu_or_skip(NULL);
    stof_mb_kernels k;
    cr_assert_eq(stof__mb_load(ctx, &k), STOF_OK, "%s", stof_errmsg(ctx));
    tu_rng r = {tu_seed() ^ 0x5eed};
    static const char *specs[] = {"bigbird:64:3:2:3:1",
                                  "bigbird:16:3:1:5:77&causal",
                                  "!bigbird:8:2:1:1:3&docs"};
    static const int sizes[][2] = {{257, 257}, {300, 700}, {1000, 999},
                                   {1, 64}};
    for (int s = 0; s < 3; s++) {
        stof_mask_family *fam = NULL;
        cr_assert_eq(stof_mask_family_create(ctx, specs[s], &fam), STOF_OK);
        int shown = 0, seqs = 0;
        for (int z = 0; z < 4; z++) {
            padinst in;
            padinst_random(&in, &r, 4, sizes[z][0], sizes[z][1]);
            stof_mb_data md;
            padinst_upload(ctx, &in, &md);
            for (int b = 0; b < in.batch; b++)
                shown += in.seed[b] != 0 && seed_shows(ctx, fam, &in, b);
            for (int ti = 0; ti < N_TILINGS; ti++) {
                const int bm = tilings[ti][0], bn = tilings[ti][1];
                stof_mb_workspace ws;
                cr_assert_eq(stof__mb_workspace_new(ctx, fam, in.batch,
                                                    in.seq_q, in.seq_k, bm,
                                                    bn, &ws),
                             STOF_OK, "%s", stof_errmsg(ctx));
                stof__ctx_push(ctx);
                stof__api()->cuMemsetD8(ws.cnt, 0xa5,
                                        ws.mem + ws.bytes - ws.cnt);
                stof__ctx_pop(ctx);
                gpu_build g;
                gpu_build_run(ctx, &k, &ws, &md, in.batch * ws.n_rb + 1, &g);
                int64_t most = 0, partial = 0, tiles = 0;
                for (int b = 0; b < in.batch; b++) {
                    stof_format *f = NULL;
                    cr_assert_eq(stof_format_build_family(
                                     ctx, fam, in.seq_q, in.seq_k, &in.host,
                                     b, bm, bn, &f),
                                 STOF_OK, "%s", stof_errmsg(ctx));
                    char what[256];
                    snprintf(what, sizeof(what),
                             "%s b=%d (%d x %d of %d x %d, seed %llu) %dx%d",
                             specs[s], b, in.q_len[b], in.k_len[b], in.seq_q,
                             in.seq_k, (unsigned long long)in.seed[b], bm, bn);
                    const int64_t m =
                        compare_format(&g, (int64_t)b * ws.n_rb, f, what);
                    most = m > most ? m : most;
                    partial += f->n_partial;
                    tiles += f->n_full + f->n_partial;
                    stof_format_free(&f);
                    seqs++;
                }
                cr_assert_eq(g.stats[3], 0, "%s: overflow reported", specs[s]);
                cr_assert_eq(g.stats[5], 0, "%s: sorted document ids reported "
                                            "unsorted",
                             specs[s]);
                cr_assert_eq(g.stats[0], tiles, "%s: non-empty tiles",
                             specs[s]);
                cr_assert_eq(g.stats[1], partial, "%s: partial tiles",
                             specs[s]);
                cr_assert_eq(g.stats[2], most, "%s: most tiles of a row block",
                             specs[s]);
                gpu_build_free(&g);
                stof__mb_workspace_free(ctx, &ws);
            }
            padinst_free(ctx, &in);
        }
        /* Not vacuous: the seeds changed some sequence's mask. */
        cr_assert(shown > 0, "%s: no seed changed a mask", specs[s]);
        cr_log_info("%s: %d sequences compared, seeds changed %d masks",
                    specs[s], seqs, shown);
        stof_mask_family_free(&fam);
    }
    stof__mb_unload(ctx, &k);
    stof_close(&ctx);
}

/* ------------------------------------------------------------------------ */
/* Attention on packed plans                                                 */
/* ------------------------------------------------------------------------ */

/* One packed run's tensors: exactly total_q rows of q and o, total_k of k
 * and v, each its own allocation. */
typedef struct prun {
    int heads, head_dim;
    stof_dtype dt;
    size_t nq, nk; /* elements */
    uint16_t *hq, *hk, *hv, *ho;
    float *fq, *fk, *fv, *fo;
    CUdeviceptr dq, dk, dv, dout;
} prun;

static void prun_new(prun *p, stof_context *ctx, tu_rng *r, const pinst *in,
                     int heads, int head_dim, stof_dtype dt)
{
    memset(p, 0, sizeof(*p));
    p->heads = heads;
    p->head_dim = head_dim;
    p->dt = dt;
    const size_t row = (size_t)heads * (size_t)head_dim;
    p->nq = (size_t)in->total_q * row;
    p->nk = (size_t)in->total_k * row;
    p->hq = malloc(p->nq * 2);
    p->ho = malloc(p->nq * 2);
    p->hk = malloc(p->nk * 2);
    p->hv = malloc(p->nk * 2);
    p->fq = malloc(p->nq * 4);
    p->fo = malloc(p->nq * 4);
    p->fk = malloc(p->nk * 4);
    p->fv = malloc(p->nk * 4);
    tu_fill_random(r, p->hq, p->fq, p->nq, dt, 1.0f);
    tu_fill_random(r, p->hk, p->fk, p->nk, dt, 1.0f);
    tu_fill_random(r, p->hv, p->fv, p->nk, dt, 1.0f);
    const stof_api *api = stof__api();
    cr_assert_eq(stof__ctx_push(ctx), STOF_OK);
    p->dq = dev_copy(p->hq, p->nq * 2);
    p->dk = dev_copy(p->hk, p->nk * 2);
    p->dv = dev_copy(p->hv, p->nk * 2);
    cr_assert_eq(api->cuMemAlloc(&p->dout, p->nq * 2), CUDA_SUCCESS);
    /* Poison the output (NaN bits). */
    cr_assert_eq(api->cuMemsetD8(p->dout, 0xff, p->nq * 2), CUDA_SUCCESS);
    stof__ctx_pop(ctx);
}

static void prun_free(prun *p, stof_context *ctx)
{
    const stof_api *api = stof__api();
    stof__ctx_push(ctx);
    api->cuMemFree(p->dq);
    api->cuMemFree(p->dk);
    api->cuMemFree(p->dv);
    api->cuMemFree(p->dout);
    stof__ctx_pop(ctx);
    free(p->hq);
    free(p->hk);
    free(p->hv);
    free(p->ho);
    free(p->fq);
    free(p->fk);
    free(p->fv);
    free(p->fo);
}

static double to_f(const prun *p, uint16_t h)
{
    return p->dt == STOF_DTYPE_FP16 ? tu_f16_to_f32(h) : tu_bf16_to_f32(h);
}

/* Download the output and check it: each sequence's rows (every head)
 * against the C reference with that sequence's mask, rows with no allowed
 * key and rows outside every sequence exactly 0. Returns the worst
 * relative error. */
static double check_run(prun *p, stof_context *ctx,
                        const stof_mask_family *fam, const pinst *in,
                        const char *what)
{
    const stof_api *api = stof__api();
    stof__ctx_push(ctx);
    cr_assert_eq(api->cuCtxSynchronize(), CUDA_SUCCESS, "%s: run failed", what);
    api->cuMemcpyDtoH(p->ho, p->dout, p->nq * 2);
    stof__ctx_pop(ctx);
    const size_t row = (size_t)p->heads * (size_t)p->head_dim;
    const double tol = p->dt == STOF_DTYPE_FP16 ? 2e-3 : 1.6e-2;
    /* Rows outside every sequence. */
    for (int q = 0; q < in->total_q; q++) {
        if (q >= in->cu_q[0] && q < in->cu_q[in->n])
            continue;
        for (size_t e = 0; e < row; e++)
            cr_assert(to_f(p, p->ho[(size_t)q * row + e]) == 0.0,
                      "%s: row %d (outside every sequence, %d rows), element "
                      "%zu: %g, not 0",
                      what, q, in->total_q, e,
                      to_f(p, p->ho[(size_t)q * row + e]));
    }
    double worst = 0.0;
    for (int b = 0; b < in->n; b++) {
        const int lq = seq_q_len(in, b), lk = seq_k_len(in, b);
        if (lq == 0)
            continue;
        const size_t o0 = (size_t)in->cu_q[b] * row, n = (size_t)lq * row;
        stof_mask *m = NULL;
        if (lk > 0) {
            cr_assert_eq(stof_mask_family_eval(ctx, fam, lq, lk, &in->host, b,
                                               &m),
                         STOF_OK, "%s", stof_errmsg(ctx));
            stof_attention_desc d1;
            cr_assert_eq(stof_attention_desc_init(&d1, 1, p->heads, lq, lk,
                                                  p->head_dim, p->dt,
                                                  STOF_LAYOUT_PACKED),
                         STOF_OK);
            const size_t k0 = (size_t)in->cu_k[b] * row;
            cr_assert_eq(stof__ref_attention(&d1, m, p->fq + o0, p->fk + k0,
                                             p->fv + k0, p->fo + o0),
                         STOF_OK);
        } else {
            memset(p->fo + o0, 0, n * sizeof(float));
        }
        double *got = malloc(n * sizeof(double));
        double *want = malloc(n * sizeof(double));
        for (size_t i = 0; i < n; i++) {
            got[i] = to_f(p, p->ho[o0 + i]);
            want[i] = p->fo[o0 + i];
        }
        /* Rows with no allowed key: exactly 0. */
        for (int q = 0; q < lq; q++) {
            int empty = 1;
            for (int kk = 0; kk < lk && empty; kk++)
                empty = !stof_mask_get(m, q, kk);
            if (!empty)
                continue;
            for (size_t e = 0; e < row; e++)
                cr_assert(got[(size_t)q * row + e] == 0.0,
                          "%s: sequence %d row %d (no key), element %zu: %g, "
                          "not 0",
                          what, b, q, e, got[(size_t)q * row + e]);
        }
        const double err = tu_rel_err(got, want, n);
        cr_assert(err < tol,
                  "%s: sequence %d (%d x %d at rows %d, keys %d, off %d, "
                  "prefix %d, seed %llu): rel err %g",
                  what, b, lq, lk, in->cu_q[b], in->cu_k[b], in->q_offset[b],
                  in->prefix[b],
                  in->has_seed ? (unsigned long long)in->seed[b] : 0ull, err);
        worst = err > worst ? err : worst;
        free(got);
        free(want);
        stof_mask_free(&m);
    }
    return worst;
}

Test(gpu_packed, packed_attention_matches_the_reference)
{
    stof_context *ctx = open_quick();
    tu_rng r = {tu_seed() ^ 0xa77};
    static const char *specs[] = {"causal", "causal&docs", "sliding:64|prefix",
                                  "bigbird:32:2:1:3:5"};
    enum { NSEQ = 4, MAXLEN = 256, SLACK = 40 };
    /* The plan's most rows: every instance fits. */
    const int max_rows = NSEQ * MAXLEN + SLACK + 23;
    for (int si = 0; si < 4; si++) {
        for (int z = 0; z < 2; z++) {
            /* Every spec with both head sizes, each dtype with each head
             * size over the specs. */
            const stof_dtype dt = (si + z) % 2 ? STOF_DTYPE_BF16
                                               : STOF_DTYPE_FP16;
            const int D = z ? 128 : 64;
            const int H = 2 + (int)tu_below(&r, 3);
            stof_mask_family *fam = NULL;
            cr_assert_eq(stof_mask_family_create(ctx, specs[si], &fam),
                         STOF_OK);
            stof_attention_desc d;
            cr_assert_eq(stof_attention_desc_init(&d, NSEQ, H, max_rows,
                                                  max_rows, D, dt,
                                                  STOF_LAYOUT_PACKED),
                         STOF_OK);
            pinst sample;
            pinst_random(&sample, &r, NSEQ, MAXLEN, SLACK);
            /* The sample's totals: its own rows (fewer than the plan's),
             * or 0 (the plan's most). */
            if (z == 1)
                sample.host.total_q = sample.host.total_k = 0;
            stof_plan *plan = NULL;
            cr_assert_eq(stof_attention_plan_family(ctx, &d, fam,
                                                    &sample.host, &plan),
                         STOF_OK, "%s", stof_errmsg(ctx));
            pinst_free(&sample);
            char desc[4096];
            cr_assert_eq(stof_plan_describe(plan, desc, sizeof(desc), NULL),
                         STOF_OK);
            cr_assert(strstr(desc, "packed_sequences"), "%s", desc);
            const long compiles = stof__jit_compile_count();
            double worst = 0.0;
            for (int it = 0; it < 3; it++) {
                pinst in;
                pinst_random(&in, &r, NSEQ, MAXLEN, SLACK);
                dev_pinst di;
                dpinst_upload(ctx, &in, &di);
                prun p;
                prun_new(&p, ctx, &r, &in, H, D, dt);
                /* The third run: keys past the last sequence hold V NaN
                 * and K +Inf (a packed buffer of the most rows, partly
                 * written): they stay out of every output (0 x NaN in
                 * P V made whole row blocks NaN). */
                const int poisoned = it == 2 && in.total_k > in.cu_k[in.n];
                if (poisoned) {
                    const size_t row = (size_t)H * (size_t)D;
                    const uint16_t vnan = dt == STOF_DTYPE_FP16 ? 0x7e00u
                                                                : 0x7fc0u;
                    const uint16_t kinf = dt == STOF_DTYPE_FP16 ? 0x7c00u
                                                                : 0x7f80u;
                    for (size_t e = (size_t)in.cu_k[in.n] * row; e < p.nk; e++) {
                        p.hv[e] = vnan;
                        p.hk[e] = kinf;
                    }
                    const stof_api *api = stof__api();
                    cr_assert_eq(stof__ctx_push(ctx), STOF_OK);
                    cr_assert_eq(api->cuMemcpyHtoD(p.dk, p.hk, p.nk * 2),
                                 CUDA_SUCCESS);
                    cr_assert_eq(api->cuMemcpyHtoD(p.dv, p.hv, p.nk * 2),
                                 CUDA_SUCCESS);
                    stof__ctx_pop(ctx);
                }
                stof_mask_data md;
                dpinst_data(&in, &di, &md);
                char what[256];
                snprintf(what, sizeof(what),
                         "%s %s D=%d H=%d run %d (%d x %d rows of %d, cu_k "
                         "%s, seeds %s%s)",
                         specs[si], dt == STOF_DTYPE_FP16 ? "fp16" : "bf16",
                         D, H, it, in.total_q, in.total_k, max_rows,
                         in.same_k ? "NULL" : "given",
                         in.has_seed ? "given" : "NULL",
                         poisoned ? ", NaN/Inf keys after the last" : "");
                cr_assert_eq(stof_attention_run_family(
                                 plan, &md, (void *)(uintptr_t)p.dq,
                                 (void *)(uintptr_t)p.dk,
                                 (void *)(uintptr_t)p.dv,
                                 (void *)(uintptr_t)p.dout, NULL),
                             STOF_OK, "%s: %s", what, stof_plan_errmsg(plan));
                const double e = check_run(&p, ctx, fam, &in, what);
                worst = e > worst ? e : worst;
                prun_free(&p, ctx);
                dpinst_free(ctx, &di);
                pinst_free(&in);
            }
            cr_assert_eq(stof__jit_compile_count(), compiles,
                         "%s: a run compiled something", specs[si]);
            cr_log_info("%s %s D=%d H=%d: worst rel err %g", specs[si],
                        dt == STOF_DTYPE_FP16 ? "fp16" : "bf16", D, H, worst);
            stof_plan_free(&plan);
            stof_mask_family_free(&fam);
        }
    }
    stof_close(&ctx);
}

/* ------------------------------------------------------------------------ */
/* Misuse                                                                    */
/* ------------------------------------------------------------------------ */

static void expect_msg(const char *msg, const char *part)
{
    cr_assert(msg && strstr(msg, part), "expected \"%s\" in: %s", part,
              msg ? msg : "(null)");
}

Test(gpu_packed, packed_errors)
{
    stof_context *ctx = open_quick();
    const int S = 256, H = 2, D = 64;
    stof_attention_desc d;
    cr_assert_eq(stof_attention_desc_init(&d, 2, H, S, S, D, STOF_DTYPE_FP16,
                                          STOF_LAYOUT_PACKED),
                 STOF_OK);
    stof_mask_family *fam = NULL;
    cr_assert_eq(stof_mask_family_create(ctx, "causal", &fam), STOF_OK);
    stof_plan *plan = NULL;

    /* Planning: a packed layout needs a sample with its offsets. */
    cr_assert_eq(stof_attention_plan_family(ctx, &d, fam, NULL, &plan),
                 STOF_ERR_INVALID_ARGUMENT);
    expect_msg(stof_errmsg(ctx), "cu_seqlens_q");
    cr_assert_null(plan);
    int32_t off[2] = {0, 3};
    stof_mask_data bad;
    memset(&bad, 0, sizeof(bad));
    bad.q_offset = off;
    cr_assert_eq(stof_attention_plan_family(ctx, &d, fam, &bad, &plan),
                 STOF_ERR_INVALID_ARGUMENT);
    expect_msg(stof_errmsg(ctx), "cu_seqlens_q");
    cr_assert_null(plan);
    /* ... and the offsets mean nothing to other layouts. */
    int32_t cu[3] = {0, 100, 230};
    stof_mask_data sample;
    memset(&sample, 0, sizeof(sample));
    sample.cu_seqlens_q = cu;
    stof_attention_desc dp;
    cr_assert_eq(stof_attention_desc_init(&dp, 2, H, S, S, D, STOF_DTYPE_FP16,
                                          STOF_LAYOUT_BHSD),
                 STOF_OK);
    cr_assert_eq(stof_attention_plan_family(ctx, &dp, fam, &sample, &plan),
                 STOF_ERR_INVALID_ARGUMENT);
    expect_msg(stof_errmsg(ctx), "STOF_LAYOUT_PACKED");
    cr_assert_null(plan);
    /* stof_attention_plan does not plan the packed layout. */
    stof_mask *m = NULL;
    cr_assert_eq(stof_mask_from_spec(ctx, "causal", S, S, &m), STOF_OK);
    cr_assert_eq(stof_attention_plan(ctx, &d, m, &plan),
                 STOF_ERR_INVALID_ARGUMENT);
    expect_msg(stof_errmsg(ctx), "stof_attention_plan_family");
    cr_assert_null(plan);
    stof_mask_free(&m);

    /* A packed plan, and tensors of its most rows (twice: room for the
     * padded plan's batch of 2 below too). */
    cr_assert_eq(stof_attention_plan_family(ctx, &d, fam, &sample, &plan),
                 STOF_OK, "%s", stof_errmsg(ctx));
    const stof_api *api = stof__api();
    const size_t bytes = 2 * (size_t)S * H * D * 2;
    CUdeviceptr t[4], dcu = 0, dlen = 0;
    cr_assert_eq(stof__ctx_push(ctx), STOF_OK);
    for (int i = 0; i < 4; i++) {
        cr_assert_eq(api->cuMemAlloc(&t[i], bytes), CUDA_SUCCESS);
        api->cuMemsetD8(t[i], 0, bytes);
    }
    dcu = dev_copy(cu, sizeof(cu));
    dlen = dev_copy(cu + 1, 2 * sizeof(int32_t));
    stof__ctx_pop(ctx);
    void *q = (void *)(uintptr_t)t[0], *k = (void *)(uintptr_t)t[1],
         *v = (void *)(uintptr_t)t[2], *o = (void *)(uintptr_t)t[3];

    cr_assert_eq(stof_attention_run(plan, q, k, v, o, NULL),
                 STOF_ERR_INVALID_ARGUMENT);
    expect_msg(stof_plan_errmsg(plan), "cu_seqlens");
    cr_assert_eq(stof_attention_run_family(plan, NULL, q, k, v, o, NULL),
                 STOF_ERR_INVALID_ARGUMENT);
    expect_msg(stof_plan_errmsg(plan), "cu_seqlens");
    stof_mask_data md;
    memset(&md, 0, sizeof(md));
    cr_assert_eq(stof_attention_run_family(plan, &md, q, k, v, o, NULL),
                 STOF_ERR_INVALID_ARGUMENT);
    expect_msg(stof_plan_errmsg(plan), "cu_seqlens");
    md.cu_seqlens_q = (const int32_t *)(uintptr_t)dcu;
    md.q_len = (const int32_t *)(uintptr_t)dlen;
    cr_assert_eq(stof_attention_run_family(plan, &md, q, k, v, o, NULL),
                 STOF_ERR_INVALID_ARGUMENT);
    expect_msg(stof_plan_errmsg(plan), "q_len");
    md.q_len = NULL;
    md.k_len = (const int32_t *)(uintptr_t)dlen;
    cr_assert_eq(stof_attention_run_family(plan, &md, q, k, v, o, NULL),
                 STOF_ERR_INVALID_ARGUMENT);
    expect_msg(stof_plan_errmsg(plan), "k_len");
    md.k_len = NULL;
    md.total_q = S + 1;
    cr_assert_eq(stof_attention_run_family(plan, &md, q, k, v, o, NULL),
                 STOF_ERR_INVALID_ARGUMENT);
    expect_msg(stof_plan_errmsg(plan), "total_q");
    md.total_q = 0;
    md.total_k = S + 1;
    cr_assert_eq(stof_attention_run_family(plan, &md, q, k, v, o, NULL),
                 STOF_ERR_INVALID_ARGUMENT);
    expect_msg(stof_plan_errmsg(plan), "total_k");
    md.total_k = -1;
    cr_assert_eq(stof_attention_run_family(plan, &md, q, k, v, o, NULL),
                 STOF_ERR_INVALID_ARGUMENT);
    /* The same plan still runs when asked properly. */
    md.total_k = 0;
    cr_assert_eq(stof_attention_run_family(plan, &md, q, k, v, o, NULL),
                 STOF_OK, "%s", stof_plan_errmsg(plan));
    stof__ctx_push(ctx);
    cr_assert_eq(api->cuCtxSynchronize(), CUDA_SUCCESS);
    stof__ctx_pop(ctx);
    stof_plan_free(&plan);

    /* A padded family plan refuses offsets. */
    cr_assert_eq(stof_attention_plan_family(ctx, &dp, fam, NULL, &plan),
                 STOF_OK, "%s", stof_errmsg(ctx));
    cr_assert_eq(stof_attention_run_family(plan, &md, q, k, v, o, NULL),
                 STOF_ERR_INVALID_ARGUMENT);
    expect_msg(stof_plan_errmsg(plan), "cu_seqlens");
    stof_plan_free(&plan);

    stof__ctx_push(ctx);
    for (int i = 0; i < 4; i++)
        api->cuMemFree(t[i]);
    api->cuMemFree(dcu);
    api->cuMemFree(dlen);
    stof__ctx_pop(ctx);
    stof_mask_family_free(&fam);
    stof_close(&ctx);
}

__attribute__((visibility("default"))) int main(int argc, char **argv)
{
    return tu_gpu_suite_main("gpu_packed", argc, argv);
}
