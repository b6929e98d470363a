/*
 * bench_wgmma.c - stof-bench-wgmma: kernel time of the Hopper wgmma kernel
 * (attn_wgmma.cu) in block and gather mode against the mma.sync kernels
 * (attn_block.cu, block and gather mode) on the public mask suite
 * (BENCH.md), fp16, BHSD, at 4x16x4096x64 and 1x32x8192x128. CUDA events
 * around each launch, warm-up first, median of the repetitions; the inputs
 * rotate over enough copies to exceed the L2, so every launch reads q, k, v
 * from memory. Effective TF/s counts only the allowed elements: 4 * B * H *
 * N * N * D * density / t. Columns:
 *   mma blk    mma.sync, tile BSR (the problem's block cfg)
 *   wg A, wg B wgmma block mode, two cfgs of 128 rows, heavy-first order
 *   wg64       wgmma block mode with 64 query rows per CTA (BLOCK_M=64)
 *   wg gat     wgmma gather mode (row-wise lists, cp.async), ordered
 *   wg gat+g   the same on the mask with its rows grouped by residue class
 *              (stof__mask_group_rows; q_rows = the permutation); only for
 *              masks with a row period (dilated), else "-"
 *   wg64 gat, wg64 gat+g  wgmma gather with 64 query rows per CTA
 *   mma gat, mma gat+g    the mma.sync gather kernel, likewise
 * The last column is the largest relative difference between the output of
 * any kernel and the mma.sync block kernel's (same inputs).
 *
 * Usage: stof-bench-wgmma [repetitions] [--sweep]   (default 30)
 * --sweep also times every valid wgmma configuration (block_m 128 and 64,
 * block_n, stages, overlap) on the dense, causal and bigbird masks of both
 * problems.
 * Needs a compute capability 9.0 GPU (exits 77 otherwise).
 */
#include "bench_hopper.h"
#include "attn_block.h"
#include "internal.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int cmp_float(const void *a, const void *b)
{
    float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

static const struct {
    const char *name, *spec;
} suite[] = {
    {"none", "dense"},
    {"causal", "causal"},
    {"sliding", "sliding:256"},
    {"dilated", "dilated:512:2"},
    {"longformer", "longformer:256:64"},
    {"bigbird", "bigbird:64:3:2:3:1"},
    {"strided", "strided:128"},
};
#define N_MASKS ((int)(sizeof(suite) / sizeof(suite[0])))

/* The wgmma cfgs of a problem: block mode A, B (128 rows), block mode 64
 * rows, gather 128 rows, gather 64 rows. */
#define N_WG 5
enum { WG_A, WG_B, WG_M64, WG_GAT, WG_GAT64 };

typedef struct problem {
    int batch, heads, seq, head_dim;
    stof_block_cfg block;  /* the mma.sync kernel's cfg */
    stof_wgmma_cfg wg[N_WG];
    stof_block_cfg mg;     /* mma.sync gather cfg */
    double sdpa_dense_ms, sdpa_causal_ms; /* PyTorch SDPA, H200 (brief) */
    /* FlexAttention on the H200 (brief): dilated, strided, bigbird ms */
    double flex_ms[3];
} problem;

static const problem problems[] = {
    {4, 16, 4096, 64, {128, 64, 4, 2, 0, 0, 0},
     {{128, 2, 1, 0, 0, 0, 0, 0},
      {64, 4, 1, 0, 0, 0, 0, 0},
      {64, 4, 1, 0, 64, 0, 0, 0},
      {128, 2, 1, 1, 0, 0, 0, 0},
      {128, 2, 1, 1, 64, 0, 0, 0}},
     {128, 64, 4, 2, 1, 0, 0},
     4.0 * 4 * 16 * 4096.0 * 4096.0 * 64 / 452e12 * 1e3, 0.340,
     {0.334, 1.136, 0.445}},
    {1, 32, 8192, 128, {128, 32, 4, 2, 0, 0, 0},
     {{128, 2, 1, 0, 0, 0, 0, 0},
      {64, 3, 1, 0, 0, 0, 0, 0},
      {64, 2, 1, 0, 64, 0, 0, 0},
      {128, 2, 1, 1, 0, 0, 0, 0},
      {64, 2, 1, 1, 64, 0, 0, 0}},
     {128, 32, 4, 2, 1, 0, 0},
     4.0 * 1 * 32 * 8192.0 * 8192.0 * 128 / 593e12 * 1e3, 1.059,
     {0.517, 3.70, 0.666}},
};

enum { K_MMA_BLOCK, K_WG_BLOCK, K_WG_GATHER, K_MMA_GATHER };

/* One kernel to time: which, its format on the device, its row order and
 * query-row permutation. */
typedef struct kern {
    int kind; /* K_* */
    const stof_wgmma_cfg *wc;
    const stof_block_cfg *bc;
    CUfunction fn;
    const stof_block_format *bf;
    const stof_rowwise_format *rf;
    CUdeviceptr order, q_rows;
} kern;

#define MAX_REPS 200
#define MAX_SETS 8

typedef struct bufs {
    int nsets;
    CUdeviceptr q[MAX_SETS], k[MAX_SETS], v[MAX_SETS], o[MAX_SETS];
    size_t elems;
} bufs;

static stof_status launch(const kern *kn, int head_dim,
                          const stof_attention_desc *d, const bufs *b, int set,
                          const stof_api *api)
{
    switch (kn->kind) {
    case K_WG_BLOCK:
        return stof__wgmma_launch(kn->fn, kn->wc, head_dim, d, 0.0f, kn->bf,
                                  kn->order, b->q[set], b->k[set], b->v[set],
                                  b->o[set], NULL, api);
    case K_WG_GATHER:
        return stof__wgmma_gather_launch(kn->fn, kn->wc, head_dim, d, 0.0f,
                                         kn->rf, kn->order, kn->q_rows,
                                         b->q[set], b->k[set], b->v[set],
                                         b->o[set], NULL, api);
    case K_MMA_GATHER:
        return stof__rowwise_launch_qperm(kn->fn, kn->bc, head_dim, d, 0.0f,
                                          kn->rf, kn->q_rows, b->q[set],
                                          b->k[set], b->v[set], b->o[set],
                                          NULL, api);
    default:
        return stof__block_launch(kn->fn, kn->bc, head_dim, d, 0.0f, kn->bf,
                                  b->q[set], b->k[set], b->v[set], b->o[set],
                                  NULL, api);
    }
}

/* Median milliseconds of `reps` launches (after 3 warm-up ones); -1 on
 * failure. */
static double time_kernel(const kern *kn, int head_dim,
                          const stof_attention_desc *d, const bufs *b,
                          int reps, const stof_api *api)
{
    CUevent ev[2 * MAX_REPS];
    for (int i = 0; i < 2 * reps; i++)
        if (api->cuEventCreate(&ev[i], 0) != CUDA_SUCCESS)
            return -1.0;
    double res = -1.0;
    for (int i = 0; i < 3; i++)
        if (launch(kn, head_dim, d, b, i % b->nsets, api) != STOF_OK)
            goto done;
    for (int i = 0; i < reps; i++) {
        api->cuEventRecord(ev[2 * i], NULL);
        if (launch(kn, head_dim, d, b, (i + 3) % b->nsets, api) != STOF_OK)
            goto done;
        api->cuEventRecord(ev[2 * i + 1], NULL);
    }
    if (api->cuCtxSynchronize() != CUDA_SUCCESS)
        goto done;
    float ms[MAX_REPS];
    for (int i = 0; i < reps; i++)
        api->cuEventElapsedTime(&ms[i], ev[2 * i], ev[2 * i + 1]);
    qsort(ms, (size_t)reps, sizeof(float), cmp_float);
    res = reps % 2 ? ms[reps / 2] : 0.5 * (ms[reps / 2 - 1] + ms[reps / 2]);
done:
    for (int i = 0; i < 2 * reps; i++)
        api->cuEventDestroy(ev[i]);
    return res;
}

static float h2f(uint16_t h)
{
    const uint32_t s = (uint32_t)(h >> 15) << 31, e = (h >> 10) & 31u,
                   m = h & 1023u;
    uint32_t x;
    if (e == 0) {
        if (!m) {
            x = s;
        } else { /* subnormal */
            int k = 0;
            uint32_t mm = m;
            while (!(mm & 1024u)) {
                mm <<= 1;
                k++;
            }
            x = s | ((uint32_t)(113 - k) << 23) | ((mm & 1023u) << 13);
        }
    } else if (e == 31) {
        x = s | 0x7f800000u | (m << 13);
    } else {
        x = s | ((e + 112u) << 23) | (m << 13);
    }
    float f;
    memcpy(&f, &x, 4);
    return f;
}

/* Uniform in [-1, 1) as fp16 bits (exact: 1/1024 steps). */
static uint16_t rand_h(uint64_t *s)
{
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    const int v = (int)((*s >> 33) % 2048u) - 1024; /* -1024..1023 */
    if (v == 0)
        return 0;
    const uint16_t sign = v < 0 ? 0x8000u : 0u;
    uint32_t a = (uint32_t)(v < 0 ? -v : v); /* 1..1024, value a/1024 */
    int e = 0;
    while (a < 1024u) {
        a <<= 1;
        e++;
    }
    /* a/1024 * 2^-e with a in [1024, 2048): exponent 15 - e. */
    return (uint16_t)(sign | (uint16_t)((15 - e) << 10) | (a & 1023u));
}

static double out_rel_diff(const uint16_t *a, const uint16_t *ref, size_t n)
{
    double num = 0.0, den = 0.0;
    for (size_t i = 0; i < n; i++) {
        const double x = h2f(a[i]), y = h2f(ref[i]);
        if (isnan(x))
            return INFINITY;
        num += (x - y) * (x - y);
        den += y * y;
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

#define N_KERNS 10

/* One mask's device data for every kernel of a problem. */
typedef struct mask_dev {
    stof_block_format bfb;             /* mma.sync block */
    stof_block_format bfw[3];          /* wgmma A, B, 64 rows */
    stof_rowwise_format rfw[2][2];     /* wgmma gather 128 / 64 rows:
                                          plain, grouped */
    stof_rowwise_format rfm[2];        /* mma.sync gather: plain, grouped */
    CUdeviceptr ordw[3], ordg[2][2];   /* heavy-first row orders */
    CUdeviceptr perm;                  /* grouped: the permutation, or 0 */
} mask_dev;

static int upload_i32(stof_context *ctx, const int32_t *h, size_t n,
                      CUdeviceptr *out)
{
    const stof_api *api = ctx->api;
    int rc = 0;
    stof__ctx_push(ctx);
    if (api->cuMemAlloc(out, n * 4u) != CUDA_SUCCESS) {
        *out = 0;
        rc = 1;
    } else if (api->cuMemcpyHtoD(*out, h, n * 4u) != CUDA_SUCCESS) {
        rc = 1;
    }
    stof__ctx_pop(ctx);
    return rc;
}

/* A heavy-first order of f's row blocks (block or gather kernel), on the
 * device. */
static int upload_order(stof_context *ctx, const stof_format *f, int gather,
                        CUdeviceptr *out)
{
    int32_t *o = malloc((size_t)f->n_row_blocks * 4u);
    if (!o)
        return 1;
    if (gather)
        stof__wgmma_gather_row_order(f, o);
    else
        stof__wgmma_row_order(f, o);
    const int rc = upload_i32(ctx, o, (size_t)f->n_row_blocks, out);
    free(o);
    return rc;
}

/* The row-wise format of m for a bm x bn tiling, and (order != NULL) its
 * gather row order. */
static int rowwise_for(stof_context *ctx, const stof_mask *m, int bm, int bn,
                       stof_rowwise_format *rf, CUdeviceptr *order)
{
    stof_format *f = NULL;
    if (stof_format_build(ctx, m, bm, bn, &f) != STOF_OK)
        return 1;
    int rc = stof__rowwise_format_upload(ctx, f, rf) != STOF_OK;
    if (!rc && order)
        rc = upload_order(ctx, f, 1, order);
    stof_format_free(&f);
    return rc;
}

/* The gather formats of mask m (grouped: 1) for every gather kernel. */
static int gather_dev(stof_context *ctx, const problem *pb,
                      const stof_mask *m, int grouped, mask_dev *md)
{
    int rc = 0;
    for (int w = 0; w < 2 && !rc; w++) {
        const stof_wgmma_cfg *c = &pb->wg[w ? WG_GAT64 : WG_GAT];
        rc = rowwise_for(ctx, m, stof__wgmma_block_m(c), c->block_n,
                         &md->rfw[w][grouped], &md->ordg[w][grouped]);
    }
    if (!rc)
        rc = rowwise_for(ctx, m, pb->mg.block_m, pb->mg.block_n,
                         &md->rfm[grouped], NULL);
    return rc;
}

static int mask_dev_make(stof_context *ctx, const problem *pb,
                         const stof_mask *m, mask_dev *md)
{
    stof_format *f = NULL;
    int rc = 0;
    if (stof_format_build(ctx, m, pb->block.block_m, pb->block.block_n,
                          &f) != STOF_OK ||
        stof__block_format_upload(ctx, f, &md->bfb) != STOF_OK)
        rc = 1;
    stof_format_free(&f);
    for (int w = 0; w < 3 && !rc; w++) {
        const stof_wgmma_cfg *c = &pb->wg[w];
        if (stof_format_build(ctx, m, stof__wgmma_block_m(c), c->block_n,
                              &f) != STOF_OK ||
            stof__block_format_upload(ctx, f, &md->bfw[w]) != STOF_OK ||
            upload_order(ctx, f, 0, &md->ordw[w]) != 0)
            rc = 1;
        stof_format_free(&f);
    }
    if (!rc)
        rc = gather_dev(ctx, pb, m, 0, md);
    const int period = rc ? 1 : stof__mask_row_period(m);
    if (period > 1) {
        stof_mask *g = NULL;
        int32_t *perm = NULL;
        if (stof__mask_group_rows(ctx, m, period, &g, &perm) != STOF_OK)
            return 1;
        rc = upload_i32(ctx, perm, (size_t)stof_mask_seq_q(m), &md->perm);
        if (!rc)
            rc = gather_dev(ctx, pb, g, 1, md);
        free(perm);
        stof_mask_free(&g);
    }
    return rc;
}

static void mask_dev_free(stof_context *ctx, mask_dev *md)
{
    stof__block_format_free(ctx, &md->bfb);
    for (int i = 0; i < 3; i++)
        stof__block_format_free(ctx, &md->bfw[i]);
    for (int i = 0; i < 2; i++) {
        stof__rowwise_format_free(ctx, &md->rfw[i][0]);
        stof__rowwise_format_free(ctx, &md->rfw[i][1]);
        stof__rowwise_format_free(ctx, &md->rfm[i]);
    }
    CUdeviceptr p[8] = {md->ordw[0],    md->ordw[1],    md->ordw[2],
                        md->ordg[0][0], md->ordg[0][1], md->ordg[1][0],
                        md->ordg[1][1], md->perm};
    stof__ctx_push(ctx);
    for (int i = 0; i < 8; i++)
        if (p[i])
            ctx->api->cuMemFree(p[i]);
    stof__ctx_pop(ctx);
    memset(md, 0, sizeof(*md));
}

static int run_problem(stof_context *ctx, const problem *pb, int reps)
{
    const stof_api *api = ctx->api;
    const int D = pb->head_dim;
    stof_attention_desc d;
    stof_attention_desc_init(&d, pb->batch, pb->heads, pb->seq, pb->seq, D,
                             STOF_DTYPE_FP16, STOF_LAYOUT_BHSD);
    bufs b;
    memset(&b, 0, sizeof(b));
    b.elems = (size_t)pb->batch * pb->heads * pb->seq * D;
    /* Enough copies that q, k, v of one launch are out of the L2 by the
     * time the same set comes again: at least 256 MB in all. */
    const size_t set_bytes = 4u * b.elems * 2u;
    b.nsets = (int)((256u << 20) / set_bytes) + 1;
    if (b.nsets < 2)
        b.nsets = 2;
    if (b.nsets > MAX_SETS)
        b.nsets = MAX_SETS;

    uint16_t *h = malloc(b.elems * 2u), *h_ref = malloc(b.elems * 2u),
             *h_out = malloc(b.elems * 2u);
    if (!h || !h_ref || !h_out) {
        fprintf(stderr, "out of memory\n");
        return 1;
    }
    uint64_t seed = 0x5eedull + (uint64_t)D;
    int rc = 0;
    if (stof__ctx_push(ctx) != STOF_OK)
        return 1;
    for (int s = 0; s < b.nsets && !rc; s++) {
        CUdeviceptr *p[4] = {&b.q[s], &b.k[s], &b.v[s], &b.o[s]};
        for (int t = 0; t < 4 && !rc; t++) {
            if (api->cuMemAlloc(p[t], b.elems * 2u) != CUDA_SUCCESS) {
                fprintf(stderr, "cuMemAlloc of %zu bytes failed\n",
                        b.elems * 2u);
                rc = 1;
                break;
            }
            if (t < 3 && s < 3) { /* three distinct input sets, reused */
                for (size_t i = 0; i < b.elems; i++)
                    h[i] = rand_h(&seed);
            }
            if (t < 3)
                api->cuMemcpyHtoD(*p[t], h, b.elems * 2u);
            else
                api->cuMemsetD8(*p[t], 0, b.elems * 2u);
        }
    }
    stof__ctx_pop(ctx);

    /* Load the kernels once per problem: mma.sync block, the wgmma cfgs,
     * mma.sync gather. */
    CUmodule mods[2 + N_WG] = {0};
    CUfunction fns[2 + N_WG] = {0};
    if (!rc && stof__block_load(ctx, D, STOF_DTYPE_FP16, &pb->block, NULL,
                                &mods[0], &fns[0]) != STOF_OK) {
        fprintf(stderr, "block kernel: %s\n", stof_errmsg(ctx));
        rc = 1;
    }
    for (int w = 0; w < N_WG && !rc; w++)
        if (stof__wgmma_load(ctx, D, STOF_DTYPE_FP16, &pb->wg[w],
                             &mods[1 + w], &fns[1 + w]) != STOF_OK) {
            fprintf(stderr, "wgmma kernel: %s\n", stof_errmsg(ctx));
            rc = 1;
        }
    if (!rc && stof__block_load(ctx, D, STOF_DTYPE_FP16, &pb->mg, NULL,
                                &mods[1 + N_WG], &fns[1 + N_WG]) != STOF_OK) {
        fprintf(stderr, "gather kernel: %s\n", stof_errmsg(ctx));
        rc = 1;
    }

    printf("\n%dx%dx%dx%d fp16 BHSD, %d input sets, median of %d; "
           "ms and effective TF/s\n",
           pb->batch, pb->heads, pb->seq, D, b.nsets, reps);
    printf("  mma blk bm%d bn%d w%d s%d;", pb->block.block_m,
           pb->block.block_n, pb->block.warps, pb->block.stages);
    static const char *const wname[N_WG] = {"wg A", "wg B", "wg64",
                                            "wg gat", "wg64 gat"};
    for (int w = 0; w < N_WG; w++)
        printf(" %s bm%d bn%d s%d ov%d;", wname[w],
               stof__wgmma_block_m(&pb->wg[w]), pb->wg[w].block_n,
               pb->wg[w].stages, pb->wg[w].overlap);
    printf(" mma gat bm%d bn%d w%d s%d\n", pb->mg.block_m, pb->mg.block_n,
           pb->mg.warps, pb->mg.stages);
    printf("  +g: rows grouped by residue class (q_rows), masks with a row "
           "period only\n");
    static const char *const col[N_KERNS] = {
        "mma blk", "wg A",    "wg B",     "wg64",    "wg gat",
        "wg gat+g", "wg64 gat", "wg64 gat+g", "mma gat", "mma gat+g"};
    printf("%-10s %7s |", "mask", "density");
    for (int c = 0; c < N_KERNS; c++)
        printf(" %-13s|", col[c]);
    printf(" %8s\n", "max diff");
    const double flop_dense =
        4.0 * pb->batch * pb->heads * (double)pb->seq * pb->seq * D;
    double best_ms[N_MASKS];
    int best_k[N_MASKS];

    for (int mi = 0; mi < N_MASKS && !rc; mi++) {
        best_ms[mi] = -1.0;
        best_k[mi] = -1;
        mask_dev md;
        memset(&md, 0, sizeof(md));
        stof_mask *m = NULL;
        if (stof_mask_from_spec(ctx, suite[mi].spec, pb->seq, pb->seq, &m) !=
            STOF_OK) {
            fprintf(stderr, "%s: %s\n", suite[mi].spec, stof_errmsg(ctx));
            rc = 1;
            break;
        }
        const double dens = stof_mask_density(m);
        if (mask_dev_make(ctx, pb, m, &md) != 0) {
            fprintf(stderr, "%s: formats: %s\n", suite[mi].name,
                    stof_errmsg(ctx));
            mask_dev_free(ctx, &md);
            stof_mask_free(&m);
            rc = 1;
            break;
        }
        const kern kerns[N_KERNS] = {
            {K_MMA_BLOCK, NULL, &pb->block, fns[0], &md.bfb, NULL, 0, 0},
            {K_WG_BLOCK, &pb->wg[WG_A], NULL, fns[1 + WG_A], &md.bfw[0], NULL,
             md.ordw[0], 0},
            {K_WG_BLOCK, &pb->wg[WG_B], NULL, fns[1 + WG_B], &md.bfw[1], NULL,
             md.ordw[1], 0},
            {K_WG_BLOCK, &pb->wg[WG_M64], NULL, fns[1 + WG_M64], &md.bfw[2],
             NULL, md.ordw[2], 0},
            {K_WG_GATHER, &pb->wg[WG_GAT], NULL, fns[1 + WG_GAT], NULL,
             &md.rfw[0][0], md.ordg[0][0], 0},
            {K_WG_GATHER, &pb->wg[WG_GAT], NULL, fns[1 + WG_GAT], NULL,
             &md.rfw[0][1], md.ordg[0][1], md.perm},
            {K_WG_GATHER, &pb->wg[WG_GAT64], NULL, fns[1 + WG_GAT64], NULL,
             &md.rfw[1][0], md.ordg[1][0], 0},
            {K_WG_GATHER, &pb->wg[WG_GAT64], NULL, fns[1 + WG_GAT64], NULL,
             &md.rfw[1][1], md.ordg[1][1], md.perm},
            {K_MMA_GATHER, NULL, &pb->mg, fns[1 + N_WG], NULL, &md.rfm[0], 0,
             0},
            {K_MMA_GATHER, NULL, &pb->mg, fns[1 + N_WG], NULL, &md.rfm[1], 0,
             md.perm},
        };
        double ms[N_KERNS];
        double maxdiff = 0.0;
        stof__ctx_push(ctx);
        for (int kI = 0; kI < N_KERNS; kI++) {
            ms[kI] = -2.0; /* not run */
            if ((kI == 5 || kI == 7 || kI == 9) && !md.perm)
                continue;
            ms[kI] = time_kernel(&kerns[kI], D, &d, &b, reps, api);
            /* Output of set 0 (the same inputs for every kernel). */
            api->cuMemsetD8(b.o[0], 0xff, b.elems * 2u);
            if (launch(&kerns[kI], D, &d, &b, 0, api) != STOF_OK ||
                api->cuCtxSynchronize() != CUDA_SUCCESS ||
                api->cuMemcpyDtoH(kI ? h_out : h_ref, b.o[0],
                                  b.elems * 2u) != CUDA_SUCCESS) {
                ms[kI] = -1.0;
                continue;
            }
            if (kI) {
                const double df = out_rel_diff(h_out, h_ref, b.elems);
                if (df > maxdiff)
                    maxdiff = df;
            }
            if (ms[kI] > 0 && (best_ms[mi] < 0 || ms[kI] < best_ms[mi])) {
                best_ms[mi] = ms[kI];
                best_k[mi] = kI;
            }
        }
        stof__ctx_pop(ctx);
        printf("%-10s %7.4f |", suite[mi].name, dens);
        for (int kI = 0; kI < N_KERNS; kI++) {
            if (ms[kI] == -2.0)
                printf(" %-13s|", "-");
            else if (ms[kI] < 0)
                printf(" %-13s|", "failed");
            else
                printf(" %6.3f %6.1f|", ms[kI],
                       flop_dense * dens / (ms[kI] * 1e-3) / 1e12);
        }
        printf(" %8.1e\n", maxdiff);
        if (mi == 0)
            printf("%-10s %7s | SDPA (H200) %7.3f ms = %5.1f TF/s; 75%%: "
                   "%.3f ms\n",
                   "", "", pb->sdpa_dense_ms,
                   flop_dense / (pb->sdpa_dense_ms * 1e-3) / 1e12,
                   pb->sdpa_dense_ms / 0.75);
        if (mi == 1)
            printf("%-10s %7s | SDPA is_causal (H200) %.3f ms; 1.3x: %.3f "
                   "ms\n",
                   "", "", pb->sdpa_causal_ms, pb->sdpa_causal_ms * 1.3);
        fflush(stdout);
        mask_dev_free(ctx, &md);
        stof_mask_free(&m);
    }

    /* The FlexAttention comparison (brief: reach half its time). */
    static const char *const flex_mask[3] = {"dilated", "strided", "bigbird"};
    for (int i = 0; i < 3 && !rc; i++)
        for (int mi = 0; mi < N_MASKS; mi++)
            if (!strcmp(suite[mi].name, flex_mask[i]) && best_ms[mi] > 0)
                printf("vs Flex %-8s best %.3f ms (%s), Flex %.3f ms: %.2fx; "
                       "target %.3f ms %s\n",
                       flex_mask[i], best_ms[mi], col[best_k[mi]],
                       pb->flex_ms[i], pb->flex_ms[i] / best_ms[mi],
                       pb->flex_ms[i] / 2,
                       best_ms[mi] <= pb->flex_ms[i] / 2 ? "met" : "missed");

    stof__ctx_push(ctx);
    for (int i = 0; i < 2 + N_WG; i++)
        if (mods[i])
            api->cuModuleUnload(mods[i]);
    for (int s = 0; s < b.nsets; s++) {
        CUdeviceptr p[4] = {b.q[s], b.k[s], b.v[s], b.o[s]};
        for (int t = 0; t < 4; t++)
            if (p[t])
                api->cuMemFree(p[t]);
    }
    stof__ctx_pop(ctx);
    free(h);
    free(h_ref);
    free(h_out);
    return rc;
}

/* Time every valid wgmma cfg (block_m 128 and 64, block_n, stages,
 * overlap; not persistent) on the dense, causal and bigbird masks of `pb`. */
static int sweep_problem(stof_context *ctx, const problem *pb, int reps)
{
    const stof_api *api = ctx->api;
    const int D = pb->head_dim;
    stof_attention_desc d;
    stof_attention_desc_init(&d, pb->batch, pb->heads, pb->seq, pb->seq, D,
                             STOF_DTYPE_FP16, STOF_LAYOUT_BHSD);
    bufs b;
    memset(&b, 0, sizeof(b));
    b.elems = (size_t)pb->batch * pb->heads * pb->seq * D;
    b.nsets = 2;
    uint16_t *h = malloc(b.elems * 2u);
    if (!h)
        return 1;
    uint64_t seed = 0x5eedull;
    for (size_t i = 0; i < b.elems; i++)
        h[i] = rand_h(&seed);
    int rc = 0;
    stof__ctx_push(ctx);
    for (int s = 0; s < b.nsets && !rc; s++) {
        CUdeviceptr *p[4] = {&b.q[s], &b.k[s], &b.v[s], &b.o[s]};
        for (int t = 0; t < 4 && !rc; t++) {
            if (api->cuMemAlloc(p[t], b.elems * 2u) != CUDA_SUCCESS)
                rc = 1;
            else
                api->cuMemcpyHtoD(*p[t], h, b.elems * 2u);
        }
    }
    stof__ctx_pop(ctx);
    free(h);
    const double flop_dense =
        4.0 * pb->batch * pb->heads * (double)pb->seq * pb->seq * D;
    printf("\nsweep %dx%dx%dx%d fp16: ms (TF/s of the allowed elements), "
           "dense | causal | bigbird:64:3:2:3:1, ordered\n",
           pb->batch, pb->heads, pb->seq, D);
    static const char *specs[3] = {"dense", "causal", "bigbird:64:3:2:3:1"};
    for (int bm = 128; bm >= 64 && !rc; bm /= 2)
    for (int bn = 64; bn <= 128 && !rc; bn *= 2)
        for (int st = 2; st <= 4 && !rc; st++)
            for (int ov = 0; ov <= 1 && !rc; ov++) {
                const stof_wgmma_cfg c = {bn, st, ov, 0, bm == 128 ? 0 : bm,
                                          0, 0, 0};
                if (!stof__wgmma_cfg_valid(&ctx->device, D, &c, NULL, 0))
                    continue;
                CUmodule mod = NULL;
                CUfunction fn = NULL;
                if (stof__wgmma_load(ctx, D, STOF_DTYPE_FP16, &c, &mod,
                                     &fn) != STOF_OK) {
                    fprintf(stderr, "load: %s\n", stof_errmsg(ctx));
                    rc = 1;
                    break;
                }
                printf("bm%-3d bn%-3d s%d ov%d |", bm, bn, st, ov);
                for (int mi = 0; mi < 3 && !rc; mi++) {
                    stof_mask *m = NULL;
                    stof_format *f = NULL;
                    stof_block_format bf;
                    memset(&bf, 0, sizeof(bf));
                    CUdeviceptr ord = 0;
                    int32_t *o = NULL;
                    if (stof_mask_from_spec(ctx, specs[mi], pb->seq, pb->seq,
                                            &m) != STOF_OK ||
                        stof_format_build(ctx, m,
                                          stof__wgmma_format_block_m(&c), bn,
                                          &f) != STOF_OK ||
                        stof__block_format_upload(ctx, f, &bf) != STOF_OK ||
                        !(o = malloc((size_t)f->n_row_blocks * 4u))) {
                        rc = 1;
                    } else {
                        stof__wgmma_row_order(f, o);
                        stof__ctx_push(ctx);
                        if (api->cuMemAlloc(&ord, (size_t)f->n_row_blocks *
                                                      4u) != CUDA_SUCCESS)
                            rc = 1;
                        else
                            api->cuMemcpyHtoD(ord, o,
                                              (size_t)f->n_row_blocks * 4u);
                        const kern kn = {K_WG_BLOCK, &c, NULL, fn, &bf,
                                         NULL, ord, 0};
                        const double ms =
                            rc ? -1.0 : time_kernel(&kn, D, &d, &b, reps, api);
                        if (ord)
                            api->cuMemFree(ord);
                        stof__ctx_pop(ctx);
                        printf(" %7.3f (%5.1f) |", ms,
                               flop_dense * stof_mask_density(m) /
                                   (ms * 1e-3) / 1e12);
                    }
                    free(o);
                    stof__block_format_free(ctx, &bf);
                    stof_format_free(&f);
                    stof_mask_free(&m);
                }
                printf("\n");
                fflush(stdout);
                stof__ctx_push(ctx);
                api->cuModuleUnload(mod);
                stof__ctx_pop(ctx);
            }
    stof__ctx_push(ctx);
    for (int s = 0; s < b.nsets; s++) {
        CUdeviceptr p[4] = {b.q[s], b.k[s], b.v[s], b.o[s]};
        for (int t = 0; t < 4; t++)
            if (p[t])
                api->cuMemFree(p[t]);
    }
    stof__ctx_pop(ctx);
    return rc;
}

int main(int argc, char **argv)
{
    const int reps = argc > 1 ? atoi(argv[1]) : 30;
    const int sweep = argc > 2 && strcmp(argv[2], "--sweep") == 0;
    if (reps < 1 || reps > MAX_REPS || (argc > 2 && !sweep)) {
        fprintf(stderr, "usage: %s [repetitions 1..%d] [--sweep]\n",
                argv[0], MAX_REPS);
        return 2;
    }
    stof_context *ctx = bench_open_hopper();
    if (!ctx)
        return 77;
    printf("stof-bench-wgmma on %s (%d SMs)\n", ctx->device.name,
           ctx->device.sm_count);
    int rc = 0;
    for (size_t i = 0; i < sizeof(problems) / sizeof(problems[0]) && !rc; i++)
        rc = run_problem(ctx, &problems[i], reps);
    for (size_t i = 0; sweep && i < sizeof(problems) / sizeof(problems[0]) &&
                       !rc;
         i++)
        rc = sweep_problem(ctx, &problems[i], reps);
    stof_close(&ctx);
    return rc;
}
