/*
 * test_gpu_wgmma.c - the "gpu" suite for the Hopper block-wise sparse kernel
 * (jit_templates/attn_wgmma.cu, src/kernels/attn_wgmma.c): every configuration of a
 * list covering the template's STOF_VARIANTS runs a set of masks, sizes and
 * layouts on fresh random inputs with the output poisoned first, and is
 * compared with the C reference (stof__ref_attention):
 *   - relative error ||out - ref|| / ||ref|| < 1e-2;
 *   - rows whose mask row allows no key are exactly 0;
 *   - every output element was written (no NaN left from the poison);
 *   - nothing outside the output elements (strided padding) was written.
 * Every other case runs with a heavy-first row order (the kernel's
 * row_order argument). Configurations 12-15 use 64 query rows per CTA. The gather configurations (GATHER=1: row-wise
 * lists, cp.async) run every case too; every other one, and every mask
 * with a row period (dilated), with query rows permuted (QPERM): the
 * format is built on the mask with its rows grouped by residue class
 * (stof__mask_group_rows) or, without a period, shuffled, and the kernel
 * gets the permutation as q_rows; the reference always runs on the
 * original mask and tensors. Without a usable GPU the program prints why and
 * exits 77 (skip); on a GPU other than compute capability 9.0 the kernel
 * tests skip. STOF_TEST_QUICK=1 runs only the cases of at most 300k mask
 * elements (for runs under compute-sanitizer).
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attention_int.h"
#include "attn_wgmma.h"
#include "cuda_shim.h"
#include "attn_block.h"
#include "internal.h"
#include "testutil.h"

/* Open a context or skip the test. */
static stof_context *open_or_skip(void)
{
    return tu_open_gpu_or_skip(NULL);
}

/* ------------------------------------------------------------------------ */
/* Configurations and cases                                                  */
/* ------------------------------------------------------------------------ */

typedef struct wg_cfg {
    int head_dim;
    stof_dtype dtype;
    stof_wgmma_cfg c;
} wg_cfg;

/* The template's STOF_VARIANTS. */
static const wg_cfg configs[] = {
    {64, STOF_DTYPE_FP16, {128, 2, 1, 0, 0, 0, 0, 0}},  /* 0 */
    {64, STOF_DTYPE_BF16, {128, 3, 1, 0, 0, 0, 0, 0}},  /* 1 */
    {128, STOF_DTYPE_FP16, {128, 2, 1, 0, 0, 0, 0, 0}}, /* 2 */
    {128, STOF_DTYPE_BF16, {128, 2, 1, 0, 0, 0, 0, 0}}, /* 3 */
    {64, STOF_DTYPE_FP16, {64, 4, 1, 0, 0, 0, 0, 0}},   /* 4 */
    {128, STOF_DTYPE_BF16, {64, 3, 1, 0, 0, 0, 0, 0}},  /* 5 */
    {64, STOF_DTYPE_BF16, {128, 2, 0, 0, 0, 0, 0, 0}},  /* 6: no overlap */
    {128, STOF_DTYPE_FP16, {64, 2, 0, 0, 0, 0, 0, 0}},  /* 7: no overlap */
    /* gather mode (GATHER=1) */
    {64, STOF_DTYPE_FP16, {128, 2, 1, 1, 0, 0, 0, 0}},  /* 8 */
    {128, STOF_DTYPE_BF16, {128, 2, 1, 1, 0, 0, 0, 0}}, /* 9 */
    {64, STOF_DTYPE_BF16, {64, 4, 1, 1, 0, 0, 0, 0}},   /* 10 */
    {128, STOF_DTYPE_FP16, {64, 2, 0, 1, 0, 0, 0, 0}},  /* 11: no overlap */
    /* 64 query rows per CTA (BLOCK_M=64) */
    {64, STOF_DTYPE_FP16, {64, 4, 1, 0, 64, 0, 0, 0}},   /* 12 */
    {128, STOF_DTYPE_BF16, {64, 2, 1, 0, 64, 0, 0, 0}},  /* 13 */
    {64, STOF_DTYPE_BF16, {128, 2, 1, 1, 64, 0, 0, 0}},  /* 14: gather */
    {128, STOF_DTYPE_FP16, {64, 2, 1, 1, 64, 0, 0, 0}},  /* 15: gather */
    /* head_dim 256: 128-row CTAs, 64-key tiles, two stages */
    {256, STOF_DTYPE_BF16, {64, 2, 1, 0, 0, 0, 0, 0}},   /* 16 */
    {256, STOF_DTYPE_FP16, {64, 2, 0, 0, 0, 0, 0, 0}},   /* 17: no overlap */
    /* persistent (PERSIST=1), launched with a few CTAs only so that each
     * walks many work items, empty row blocks included */
    {64, STOF_DTYPE_FP16, {128, 2, 1, 0, 0, 0, 0, 1}},  /* 18 */
    {128, STOF_DTYPE_BF16, {64, 3, 1, 0, 0, 0, 0, 1}},  /* 19 */
    {64, STOF_DTYPE_BF16, {64, 4, 1, 0, 64, 0, 0, 1}},  /* 20: 64 rows */
    {128, STOF_DTYPE_FP16, {64, 2, 0, 0, 0, 0, 0, 1}},  /* 21: no overlap */
    /* 192 query rows per CTA (BLOCK_M=192, three consumer warpgroups) on
     * 64-row formats: the cases whose formats allow it */
    {64, STOF_DTYPE_FP16, {128, 2, 1, 0, 192, 0, 0, 0}}, /* 22 */
    {64, STOF_DTYPE_BF16, {128, 3, 1, 0, 192, 0, 0, 1}}, /* 23: persistent */
    {64, STOF_DTYPE_BF16, {64, 2, 0, 0, 192, 0, 0, 0}},  /* 24: no overlap */
    /* 64 x 64 at head_dim 64 without the overlap: four CTAs an SM */
    {64, STOF_DTYPE_FP16, {64, 2, 0, 0, 64, 0, 0, 0}},   /* 25 */
    {64, STOF_DTYPE_BF16, {64, 2, 0, 0, 64, 0, 0, 1}},   /* 26: persistent */
    /* persistent 64 x 64 with the overlap at two stages (the tuned
     * attention of the layers' bigbird masks at 512 tokens) */
    {64, STOF_DTYPE_FP16, {64, 2, 1, 0, 64, 0, 0, 1}},   /* 27 */
};

/* CTAs of a persistent test launch: fewer than the work items of most
 * cases (3 and 5 alternate, so the items' Q buffers alternate in both
 * parities per CTA). */
#define PERSIST_TEST_CTAS(i) (3 + 2 * ((i) % 2))
/* The persistent schedule: in order (0), groups of 1 or 2 (batch, head)s
 * by rank (1, 2) or in pairs of ranks (-1, -2): with cases of 2-6
 * (batch, head)s, several groups, the last one short, groups ending
 * inside a round, odd row block counts (a pair of one); 3: the host's
 * list (stof__wgmma_persist_list, groups of 2). */
#define PERSIST_TEST_GROUPS(i) ((i) % 6 - 2)
#define PERSIST_TEST_LIST 3

/* A mask: a spec, or (spec starting with '#') a generated one:
 *   "#single"  each row i allows exactly key (7 i + 3) mod seq_k, so the
 *              output row must be that V row;
 *   "#lastcol" each row allows only the last key, seq_k - 1 (a tile that
 *              hangs past seq_k with one column set);
 *   "#halfempty" even rows dense, odd rows empty (empty rows inside
 *              partial tiles). */
typedef struct wg_case {
    const char *spec;
    int batch, heads, seq_q, seq_k;
    stof_layout layout; /* STRIDED: BSHD with padded rows */
    int pad;
    int growth; /* scores that grow along the row: fill_growing() */
} wg_case;

static const wg_case cases[] = {
    {"dense", 1, 2, 1024, 1024, STOF_LAYOUT_BHSD, 0, 0},
    {"dense", 2, 3, 1000, 1000, STOF_LAYOUT_BSHD, 0, 0},
    {"causal", 1, 1, 1000, 1000, STOF_LAYOUT_BSHD, 0, 0},
    {"causal", 2, 2, 1024, 1024, STOF_LAYOUT_BHSD, 0, 0},
    {"sliding:256", 1, 1, 1000, 3000, STOF_LAYOUT_STRIDED, 8, 0},
    {"dilated:512:2", 1, 1, 3000, 1000, STOF_LAYOUT_BHSD, 0, 0},
    {"longformer:256:64", 1, 1, 1024, 1024, STOF_LAYOUT_BSHD, 0, 0},
    {"bigbird:64:3:2:3:1", 1, 1, 1024, 1024, STOF_LAYOUT_STRIDED, 16, 0},
    {"strided:128", 2, 1, 1000, 1000, STOF_LAYOUT_BHSD, 0, 0},
    {"random:0.05:3", 2, 3, 77, 65, STOF_LAYOUT_BSHD, 0, 0},
    {"none", 1, 2, 77, 65, STOF_LAYOUT_BHSD, 0, 0},
    {"causal&strided:300", 1, 1, 1000, 1000, STOF_LAYOUT_STRIDED, 8, 0},
    {"random:0.002:5", 1, 2, 500, 300, STOF_LAYOUT_BHSD, 0, 0},
    {"random:0.05:3&random:0.05:4", 1, 1, 700, 900, STOF_LAYOUT_BSHD, 0, 0},
    {"dense", 1, 1, 1, 1, STOF_LAYOUT_BHSD, 0, 0},
    {"none", 1, 1, 1, 1, STOF_LAYOUT_BSHD, 0, 0},
    {"dense", 3, 1, 1, 777, STOF_LAYOUT_BSHD, 0, 0},
    {"dense", 1, 1, 200, 1000, STOF_LAYOUT_BSHD, 0, 0},
    {"longformer:128:200", 1, 2, 500, 1000, STOF_LAYOUT_STRIDED, 8, 0},
    {"causal_sliding:64", 2, 2, 129, 4097, STOF_LAYOUT_STRIDED, 16, 0},
    {"sliding:100|strided:37", 1, 1, 300, 1000, STOF_LAYOUT_BHSD, 0, 0},
    {"#single", 1, 2, 333, 197, STOF_LAYOUT_BHSD, 0, 0},
    {"#lastcol", 1, 1, 200, 97, STOF_LAYOUT_STRIDED, 8, 0},
    {"#halfempty", 1, 1, 130, 250, STOF_LAYOUT_BSHD, 0, 0},
    /* Sparse inside the tiles, where the gather mode matters. */
    {"dilated:64:3", 1, 2, 1000, 1000, STOF_LAYOUT_BSHD, 0, 0},
    {"strided:128", 1, 1, 1000, 3000, STOF_LAYOUT_STRIDED, 8, 0},
    {"random:0.05:9", 1, 1, 3000, 1000, STOF_LAYOUT_BHSD, 0, 0},
    {"#colsparse", 1, 1, 1000, 1000, STOF_LAYOUT_BSHD, 0, 0},
    {"dilated:512:2", 2, 1, 1000, 3000, STOF_LAYOUT_STRIDED, 8, 0},
    {"dense", 2, 2, 700, 1500, STOF_LAYOUT_STRIDED, 8, 0},
    /* Rows whose scores grow tile after tile, and once by a jump: the
     * 192-row kernel's conditional rescaling (kept max, then a rescale
     * once a tile passes it by more than 2^8) on every path. */
    {"dense", 1, 2, 256, 1152, STOF_LAYOUT_BSHD, 0, 1},
    {"dense", 1, 1, 250, 1000, STOF_LAYOUT_STRIDED, 8, 2},
};

#define N_CASES ((int)(sizeof(cases) / sizeof(*cases)))

static const char *dt_name(stof_dtype dt)
{
    return dt == STOF_DTYPE_FP16 ? "fp16" : "bf16";
}

/* A case's format, its mask, the mask the format was built on (when
 * another) and the row permutation. */
static void free_case_masks(stof_format **f, stof_mask *m, stof_mask *fm,
                            int32_t *perm)
{
    stof_format_free(f);
    if (fm != m)
        stof_mask_free(&fm);
    free(perm);
    stof_mask_free(&m);
}

static uint16_t to_dt(stof_dtype dt, float x, float *back)
{
    const uint16_t h = dt == STOF_DTYPE_FP16 ? tu_f32_to_f16(x)
                                             : tu_f32_to_bf16(x);
    *back = dt == STOF_DTYPE_FP16 ? tu_f16_to_f32(h) : tu_bf16_to_f32(h);
    return h;
}

/* Q and K whose scores grow along each row: q in [0.25, 0.75], key j's
 * values in [0, s(j)], so a score is about 2 s(j) (scale 1 / 8, head_dim
 * 64). growth 1: s = j / 128, a ramp of ~2.9 (log2 units) a 128-key tile,
 * which the kept maximum absorbs for two tiles before the third passes it
 * by more than 8; growth 2: s = 0.2, then 6 from key seq_k / 2 on (a jump
 * of ~17). */
static void fill_growing(const wg_case *c, const stof_attention_desc *d,
                         tu_rng *rng, uint16_t *hq, float *fq, uint16_t *hk,
                         float *fk)
{
    const stof_dtype dt = d->dtype;
    for (int b = 0; b < c->batch; b++)
        for (int h = 0; h < c->heads; h++) {
            for (int i = 0; i < c->seq_q; i++)
                for (int e = 0; e < d->head_dim; e++) {
                    const size_t o = (size_t)(b * d->q_stride[0] +
                                              h * d->q_stride[1] +
                                              i * d->q_stride[2] + e);
                    hq[o] = to_dt(dt, 0.25f + 0.5f * (float)tu_uniform(rng),
                                  &fq[o]);
                }
            for (int j = 0; j < c->seq_k; j++) {
                const float sj = c->growth == 1 ? (float)j / 128.0f
                                 : j < c->seq_k / 2 ? 0.2f
                                                    : 6.0f;
                for (int e = 0; e < d->head_dim; e++) {
                    const size_t o = (size_t)(b * d->k_stride[0] +
                                              h * d->k_stride[1] +
                                              j * d->k_stride[2] + e);
                    hk[o] = to_dt(dt, sj * (float)tu_uniform(rng), &fk[o]);
                }
            }
        }
}

/* Run one case on a loaded kernel; fails the test on any mismatch; 0 when
 * the case does not apply to the kernel (192 rows on a mask whose format
 * does not allow them), else 1.
 * with_order: heavy-first row order; qperm (gather only): the format is
 * built on permuted_mask() and the kernel gets the permutation. */
static int run_case(stof_context *ctx, const wg_cfg *k, CUfunction fn,
                     const wg_case *c, int with_order, int qperm, int ctas,
                     int groups, tu_rng *rng)
{
    const stof_api *api = stof__api();
    const int gather = k->c.gather;
    char tag[256];
    snprintf(tag, sizeof(tag),
             "[%s d=%d %s bm=%d bn=%d s=%d ov=%d ctas=%d schedule %d%s%s] "
             "%s %dx%dx%dx%d layout=%d",
             gather ? "gather" : "block", k->head_dim, dt_name(k->dtype),
             stof__wgmma_block_m(&k->c), k->c.block_n, k->c.stages,
             k->c.overlap, ctas, groups,
             with_order ? " ordered" : "", qperm ? " qperm" : "", c->spec,
             c->batch, c->heads, c->seq_q, c->seq_k, (int)c->layout);

    stof_mask *m = tu_make_mask(ctx, c->spec, c->seq_q, c->seq_k);
    stof_mask *fm = m; /* the mask the format is built on */
    int32_t *perm = NULL;
    int period = 1;
    if (qperm)
        fm = tu_permuted_mask(ctx, m, rng, &perm, &period);
    stof_format *f = NULL;
    stof_status st = stof_format_build(
        ctx, fm, stof__wgmma_format_block_m(&k->c), k->c.block_n, &f);
    cr_assert_eq(st, STOF_OK, "%s: format: %s", tag, stof_errmsg(ctx));
    if (stof__wgmma_block_m(&k->c) == 192 && !stof__wgmma_uniform_triples(f)) {
        /* (the plan refuses such masks for 192-row CTAs) */
        cr_log_info("%s: not three-row-block uniform, skipped", tag);
        free_case_masks(&f, m, fm, perm);
        return 0;
    }
    stof_block_format bf;
    stof_rowwise_format rf;
    memset(&bf, 0, sizeof(bf));
    memset(&rf, 0, sizeof(rf));
    if (gather)
        st = stof__rowwise_format_upload(ctx, f, &rf);
    else
        st = stof__block_format_upload(ctx, f, &bf);
    cr_assert_eq(st, STOF_OK, "%s: upload: %s", tag, stof_errmsg(ctx));

    stof_attention_desc d;
    tu_make_desc(&d, c->batch, c->heads, c->seq_q, c->seq_k, k->head_dim,
                 k->dtype, c->layout, c->pad);
    size_t nq = tu_tensor_elems(d.q_stride, c->batch, c->heads, c->seq_q,
                             k->head_dim);
    size_t nk = tu_tensor_elems(d.k_stride, c->batch, c->heads, c->seq_k,
                             k->head_dim);
    uint16_t *hq = malloc(nq * 2), *hk = malloc(nk * 2), *hv = malloc(nk * 2),
             *ho = malloc(nq * 2);
    float *fq = calloc(nq, 4), *fk = calloc(nk, 4), *fv = calloc(nk, 4),
          *fo = calloc(nq, 4);
    cr_assert(hq && hk && hv && ho && fq && fk && fv && fo);
    tu_fill_random(rng, hq, fq, nq, k->dtype, 2.0f);
    tu_fill_random(rng, hk, fk, nk, k->dtype, 2.0f);
    if (c->growth)
        fill_growing(c, &d, rng, hq, fq, hk, fk);
    tu_fill_random(rng, hv, fv, nk, k->dtype, 1.0f);
    int32_t *order = NULL;
    if (with_order) {
        order = malloc((size_t)f->n_row_blocks * sizeof(*order));
        cr_assert(order);
        if (gather)
            stof__wgmma_gather_row_order(f, order);
        else
            stof__wgmma_row_order(f, order);
    }

    cr_assert_eq(stof__ctx_push(ctx), STOF_OK);
    CUdeviceptr dq, dk, dv, dout, dord = 0, dperm = 0;
    if (perm) {
        size_t pb = (size_t)c->seq_q * sizeof(*perm);
        cr_assert_eq(api->cuMemAlloc(&dperm, pb), CUDA_SUCCESS);
        cr_assert_eq(api->cuMemcpyHtoD(dperm, perm, pb), CUDA_SUCCESS);
    }
    cr_assert_eq(api->cuMemAlloc(&dq, nq * 2), CUDA_SUCCESS);
    cr_assert_eq(api->cuMemAlloc(&dk, nk * 2), CUDA_SUCCESS);
    cr_assert_eq(api->cuMemAlloc(&dv, nk * 2), CUDA_SUCCESS);
    cr_assert_eq(api->cuMemAlloc(&dout, nq * 2), CUDA_SUCCESS);
    cr_assert_eq(api->cuMemcpyHtoD(dq, hq, nq * 2), CUDA_SUCCESS);
    cr_assert_eq(api->cuMemcpyHtoD(dk, hk, nk * 2), CUDA_SUCCESS);
    cr_assert_eq(api->cuMemcpyHtoD(dv, hv, nk * 2), CUDA_SUCCESS);
    if (order) {
        size_t ob = (size_t)f->n_row_blocks * sizeof(*order);
        cr_assert_eq(api->cuMemAlloc(&dord, ob), CUDA_SUCCESS);
        cr_assert_eq(api->cuMemcpyHtoD(dord, order, ob), CUDA_SUCCESS);
    }
    /* Poison: 0xffff is a NaN in fp16 and bf16. */
    cr_assert_eq(api->cuMemsetD8(dout, 0xff, nq * 2), CUDA_SUCCESS);
    CUdeviceptr dsched = 0;
    if (groups == PERSIST_TEST_LIST) {
        /* Rank r: row block order[r] (or r), weighed by its tiles. */
        const int nrb = f->n_row_blocks;
        double *w = malloc(sizeof(double) * (size_t)nrb);
        cr_assert(w);
        for (int r = 0; r < nrb; r++) {
            const int rb = order ? order[r] : r;
            w[r] = (double)(f->row_ptr[rb + 1] - f->row_ptr[rb]);
        }
        /* The launch's CTAs: ctas, or one per item when fewer. */
        const int64_t items = (int64_t)nrb * c->batch * c->heads;
        size_t nl = 0;
        int32_t *list = stof__wgmma_persist_list(
            w, nrb, (int64_t)c->batch * c->heads, 2,
            ctas < items ? ctas : (int)items, 1.0, &nl);
        cr_assert(list && nl > 0);
        cr_assert_eq(api->cuMemAlloc(&dsched, nl * 4), CUDA_SUCCESS);
        cr_assert_eq(api->cuMemcpyHtoD(dsched, list, nl * 4), CUDA_SUCCESS);
        free(list);
        free(w);
    }
    if (gather)
        st = stof__wgmma_gather_launch(fn, &k->c, k->head_dim, &d, 0.0f, &rf,
                                       dord, dperm, dq, dk, dv, dout, NULL,
                                       api);
    else {
        const stof_attn_ext x = {.ctas = ctas,
                                 .persist_heads =
                                     groups == PERSIST_TEST_LIST ? 0 : groups,
                                 .sched = dsched};
        st = stof__wgmma_launch_ex(fn, &k->c, k->head_dim, &d, 0.0f, &bf,
                                   dord, dq, dk, dv, dout, &x, NULL, api);
    }
    cr_assert_eq(st, STOF_OK, "%s: launch: %s", tag, stof_status_str(st));
    const char *failed = tu_sync_error();
    cr_assert(!failed, "%s: kernel failed: %s", tag, failed);
    cr_assert_eq(api->cuMemcpyDtoH(ho, dout, nq * 2), CUDA_SUCCESS);
    api->cuMemFree(dq);
    api->cuMemFree(dk);
    api->cuMemFree(dv);
    api->cuMemFree(dout);
    if (dord)
        api->cuMemFree(dord);
    if (dsched)
        api->cuMemFree(dsched);
    if (dperm)
        api->cuMemFree(dperm);
    stof__ctx_pop(ctx);
    stof__block_format_free(ctx, &bf);
    const int64_t g_tiles = rf.n_tiles, g_partial = rf.n_partial;
    stof__rowwise_format_free(ctx, &rf);
    free(order);

    cr_assert_eq(stof__ref_attention(&d, m, fq, fk, fv, fo), STOF_OK);

    /* Which elements of o belong to the tensor (the rest is padding). */
    uint8_t *is_out = calloc(nq, 1);
    cr_assert(is_out);
    size_t n = (size_t)c->batch * c->heads * c->seq_q * k->head_dim;
    double *got = malloc(n * sizeof(double)),
           *want = malloc(n * sizeof(double));
    cr_assert(got && want);
    uint8_t *row_empty = malloc((size_t)c->seq_q);
    cr_assert(row_empty);
    int n_empty_rows = 0;
    for (int i = 0; i < c->seq_q; i++) {
        int e = 1;
        for (int j = 0; j < c->seq_k && e; j++)
            e = !stof_mask_get(m, i, j);
        row_empty[i] = (uint8_t)e;
        n_empty_rows += e;
    }
    size_t t = 0, nan_count = 0, empty_nonzero = 0;
    for (int b = 0; b < c->batch; b++)
        for (int h = 0; h < c->heads; h++)
            for (int i = 0; i < c->seq_q; i++)
                for (int e = 0; e < k->head_dim; e++) {
                    size_t off = (size_t)(b * d.o_stride[0] +
                                          h * d.o_stride[1] +
                                          (int64_t)i * d.o_stride[2] + e);
                    is_out[off] = 1;
                    got[t] = k->dtype == STOF_DTYPE_FP16
                                 ? tu_f16_to_f32(ho[off])
                                 : tu_bf16_to_f32(ho[off]);
                    want[t] = fo[off];
                    if (isnan(got[t])) {
                        if (nan_count < 3)
                            cr_log_error("%s: NaN at b=%d h=%d row=%d "
                                         "col=%d",
                                         tag, b, h, i, e);
                        nan_count++;
                    }
                    if (row_empty[i] && got[t] != 0.0)
                        empty_nonzero++;
                    t++;
                }
    size_t pad_written = 0;
    for (size_t i = 0; i < nq; i++)
        if (!is_out[i] && ho[i] != 0xffffu)
            pad_written++;
    double err = tu_rel_err(got, want, n);
    cr_log_info("%s: %lld tiles (%lld partial), period %d, %d empty rows: "
                "rel err %.2e",
                tag,
                (long long)(gather ? g_tiles : f->row_ptr[f->n_row_blocks]),
                (long long)(gather ? g_partial : f->n_partial), period,
                n_empty_rows, err);
    cr_expect_eq(nan_count, 0, "%s: %zu outputs not written (NaN)", tag,
                 nan_count);
    cr_expect_eq(empty_nonzero, 0,
                 "%s: %zu outputs of rows with no allowed key are not 0", tag,
                 empty_nonzero);
    cr_expect_eq(pad_written, 0, "%s: %zu padding elements written", tag,
                 pad_written);
    cr_expect(err < 1e-2, "%s: relative error %.3e >= 1e-2", tag, err);

    free(row_empty);
    free(is_out);
    free(got);
    free(want);
    free(hq), free(hk), free(hv), free(ho);
    free(fq), free(fk), free(fv), free(fo);
    free_case_masks(&f, m, fm, perm);
    return 1;
}

/* Compile and load configuration `idx`, run every case. */
static void run_config(int idx)
{
    const wg_cfg *k = &configs[idx];
    char why[256];
    cr_assert(stof__wgmma_cfg_valid(NULL, k->head_dim, &k->c, why,
                                    sizeof(why)),
              "config %d is not valid: %s", idx, why);
    stof_context *ctx = open_or_skip();
    stof_device *dev = &ctx->device;
    if (!stof__wgmma_device_ok(dev)) {
        char name[320];
        snprintf(name, sizeof(name), "%.255s (cc %d.%d)", dev->name,
                 dev->cc_major, dev->cc_minor);
        stof_close(&ctx);
        cr_skip_test("the wgmma kernel needs compute capability 9.0; %s",
                     name);
    }
    if (!stof__wgmma_cfg_valid(dev, k->head_dim, &k->c, why, sizeof(why))) {
        cr_log_warn("config %d does not fit this device, skipped: %s", idx,
                    why);
        stof_close(&ctx);
        return;
    }
    CUmodule mod = NULL;
    CUfunction fn = NULL;
    stof_status st =
        stof__wgmma_load(ctx, k->head_dim, k->dtype, &k->c, &mod, &fn);
    cr_assert_eq(st, STOF_OK, "config %d: load: %s", idx, stof_errmsg(ctx));
    cr_log_info("config %d: %s d=%d %s bm=%d bn=%d stages=%d overlap=%d, "
                "%zu B shared memory",
                idx, k->c.gather ? "gather" : "block", k->head_dim,
                dt_name(k->dtype), stof__wgmma_block_m(&k->c), k->c.block_n,
                k->c.stages, k->c.overlap,
                stof__wgmma_smem_bytes(k->head_dim, &k->c));
    tu_rng rng = {tu_seed() ^ (0x9e3779b97f4a7c15ull * (uint64_t)(idx + 1))};
    const char *quick = getenv("STOF_TEST_QUICK");
    const int is_quick = quick && quick[0] && strcmp(quick, "0") != 0;
    int ran = 0;
    for (int i = 0; i < N_CASES; i++)
        if (!is_quick || (int64_t)cases[i].seq_q * cases[i].seq_k <= 300000)
            ran += run_case(ctx, k, fn, &cases[i],
                     stof__wgmma_block_m(&k->c) == 192 ? 0 : i % 2,
                     k->c.gather &&
                         ((i / 2) % 2 || strncmp(cases[i].spec, "dilated",
                                                 7) == 0),
                     k->c.persist ? PERSIST_TEST_CTAS(i) : 0,
                     !k->c.persist ? 0
                     : stof__wgmma_block_m(&k->c) == 192 &&
                             PERSIST_TEST_GROUPS(i) == PERSIST_TEST_LIST
                         ? 0 /* (no list for 192-row CTAs) */
                         : PERSIST_TEST_GROUPS(i),
                     &rng);
    /* 192 rows: the dense and empty cases (five even in quick mode). */
    if (stof__wgmma_block_m(&k->c) == 192)
        cr_expect_geq(ran, 5, "config %d ran only %d cases", idx, ran);
    cr_assert_eq(stof__ctx_push(ctx), STOF_OK);
    ctx->api->cuModuleUnload(mod);
    stof__ctx_pop(ctx);
    stof_close(&ctx);
}

#define WGMMA_CONFIG_TEST(i)                                                   \
    Test(gpu, wgmma_config_##i) { run_config(i); }

WGMMA_CONFIG_TEST(0)
WGMMA_CONFIG_TEST(1)
WGMMA_CONFIG_TEST(2)
WGMMA_CONFIG_TEST(3)
WGMMA_CONFIG_TEST(4)
WGMMA_CONFIG_TEST(5)
WGMMA_CONFIG_TEST(6)
WGMMA_CONFIG_TEST(7)
WGMMA_CONFIG_TEST(8)
WGMMA_CONFIG_TEST(9)
WGMMA_CONFIG_TEST(10)
WGMMA_CONFIG_TEST(11)
WGMMA_CONFIG_TEST(12)
WGMMA_CONFIG_TEST(13)
WGMMA_CONFIG_TEST(14)
WGMMA_CONFIG_TEST(15)
WGMMA_CONFIG_TEST(16)
WGMMA_CONFIG_TEST(17)
WGMMA_CONFIG_TEST(18)
WGMMA_CONFIG_TEST(19)
WGMMA_CONFIG_TEST(20)
WGMMA_CONFIG_TEST(21)
WGMMA_CONFIG_TEST(22)
WGMMA_CONFIG_TEST(23)
WGMMA_CONFIG_TEST(24)
WGMMA_CONFIG_TEST(25)
WGMMA_CONFIG_TEST(26)
WGMMA_CONFIG_TEST(27)

_Static_assert(sizeof(configs) / sizeof(*configs) == 28,
               "one WGMMA_CONFIG_TEST per configuration");

/* The host-side rules, the row order, and the launch's argument checks (no
 * kernel runs). */
Test(gpu, wgmma_cfg_rules_and_launch_checks)
{
    char why[256];
    const stof_wgmma_cfg ok = {128, 2, 1, 0, 0, 0, 0, 0};
    cr_expect(stof__wgmma_cfg_valid(NULL, 64, &ok, why, sizeof(why)), "%s",
              why);
    cr_expect_not(stof__wgmma_cfg_valid(NULL, 96, &ok, why, sizeof(why)));
    cr_expect(strstr(why, "head_dim"), "%s", why);
    /* head_dim 256: 128 x 64 tiles, two stages, block mode only. */
    const stof_wgmma_cfg d256 = {64, 2, 1, 0, 0, 0, 0, 0};
    cr_expect(stof__wgmma_cfg_valid(NULL, 256, &d256, why, sizeof(why)),
              "%s", why);
    cr_expect_not(stof__wgmma_cfg_valid(NULL, 256, &ok, why, sizeof(why)));
    cr_expect(strstr(why, "head_dim 256"), "%s", why);
    const stof_wgmma_cfg d256g = {64, 2, 1, 1, 0, 0, 0, 0};
    cr_expect_not(stof__wgmma_cfg_valid(NULL, 256, &d256g, why, sizeof(why)));
    const stof_wgmma_cfg d256m = {64, 2, 1, 0, 64, 0, 0, 0};
    cr_expect_not(stof__wgmma_cfg_valid(NULL, 256, &d256m, why, sizeof(why)));
    const stof_wgmma_cfg bn32 = {32, 2, 1, 0, 0, 0, 0, 0};
    cr_expect_not(stof__wgmma_cfg_valid(NULL, 64, &bn32, why, sizeof(why)));
    cr_expect(strstr(why, "block_n"), "%s", why);
    const stof_wgmma_cfg st1 = {128, 1, 1, 0, 0, 0, 0, 0};
    cr_expect_not(stof__wgmma_cfg_valid(NULL, 64, &st1, why, sizeof(why)));
    cr_expect(strstr(why, "stages"), "%s", why);
    /* d=128: 3 x 64 KiB of K/V */
    const stof_wgmma_cfg big = {128, 3, 1, 0, 0, 0, 0, 0};
    cr_expect_not(stof__wgmma_cfg_valid(NULL, 128, &big, why, sizeof(why)));
    cr_expect(strstr(why, "shared memory"), "%s", why);
    /* Q 16 KiB + K,V 2 x 2 x 16 KiB + bitmaps 2 x 2 KiB + 9 barriers +
     * meta 16 + 1024 of alignment slack. */
    cr_expect_eq(stof__wgmma_smem_bytes(64, &ok),
                 16384u + 65536u + 4096u + 72u + 16u + 1024u);
    /* Gather: + 2 slots x (K, V) x 128 row offsets. */
    const stof_wgmma_cfg g = {128, 2, 1, 1, 0, 0, 0, 0};
    cr_expect(stof__wgmma_cfg_valid(NULL, 64, &g, why, sizeof(why)), "%s",
              why);
    cr_expect_eq(stof__wgmma_smem_bytes(64, &g),
                 16384u + 65536u + 4096u + 72u + 16u + 2048u + 1024u);
    const stof_wgmma_cfg g2 = {128, 2, 1, 2, 0, 0, 0, 0};
    cr_expect_not(stof__wgmma_cfg_valid(NULL, 64, &g2, why, sizeof(why)));
    cr_expect(strstr(why, "gather"), "%s", why);
    /* 64 rows: Q 8 KiB, bitmaps 2 x 1 KiB; block_m 32 is refused. */
    const stof_wgmma_cfg m64 = {128, 2, 1, 0, 64, 0, 0, 0};
    cr_expect_eq(stof__wgmma_block_m(&m64), 64);
    cr_expect_eq(stof__wgmma_block_m(&ok), 128);
    cr_expect_eq(stof__wgmma_smem_bytes(64, &m64),
                 8192u + 65536u + 2048u + 72u + 16u + 1024u);
    const stof_wgmma_cfg m32 = {128, 2, 1, 0, 32, 0, 0, 0};
    cr_expect_not(stof__wgmma_cfg_valid(NULL, 64, &m32, why, sizeof(why)));
    cr_expect(strstr(why, "block_m"), "%s", why);
    /* Persistent: a second Q buffer and three more barriers; block mode
     * without split only; at d=256 it does not fit. */
    const stof_wgmma_cfg pe = {128, 2, 1, 0, 0, 0, 0, 1};
    cr_expect(stof__wgmma_cfg_valid(NULL, 64, &pe, why, sizeof(why)), "%s",
              why);
    cr_expect_eq(stof__wgmma_smem_bytes(64, &pe),
                 2u * 16384u + 65536u + 4096u + 72u + 24u + 32u + 16u +
                     1024u);
    const stof_wgmma_cfg peg = {128, 2, 1, 1, 0, 0, 0, 1};
    cr_expect_not(stof__wgmma_cfg_valid(NULL, 64, &peg, why, sizeof(why)));
    cr_expect(strstr(why, "persistent"), "%s", why);
    const stof_wgmma_cfg pes = {128, 2, 1, 0, 0, 1, 0, 1};
    cr_expect_not(stof__wgmma_cfg_valid(NULL, 64, &pes, why, sizeof(why)));
    cr_expect(strstr(why, "persistent"), "%s", why);
    const stof_wgmma_cfg pe2 = {128, 2, 1, 0, 0, 0, 0, 2};
    cr_expect_not(stof__wgmma_cfg_valid(NULL, 64, &pe2, why, sizeof(why)));
    cr_expect(strstr(why, "persist"), "%s", why);
    const stof_wgmma_cfg pe256 = {64, 2, 1, 0, 0, 0, 0, 1};
    cr_expect_not(
        stof__wgmma_cfg_valid(NULL, 256, &pe256, why, sizeof(why)));
    cr_expect(strstr(why, "shared memory"), "%s", why);
    /* CTAs of a persistent launch: one per SM, two for 64-row CTAs that
     * fit twice (d=64, 64 keys, 4 stages: 85 KB), three for d=64 64-row
     * 64-key CTAs that fit three times. */
    stof_device dv132 = {.ok = 1, .sm_count = 132};
    cr_expect_eq(stof__wgmma_persist_ctas(&dv132, 64, &pe), 132);
    const stof_wgmma_cfg pm = {64, 4, 1, 0, 64, 0, 0, 1};
    cr_expect_eq(stof__wgmma_persist_ctas(&dv132, 64, &pm), 264);
    /* Three where the registers allow it (d=64, 64 keys: 80 a thread at
     * launch) and three fit (2 stages: 43 KB); 128-key tiles keep two. */
    const stof_wgmma_cfg pm3 = {64, 2, 1, 0, 64, 0, 0, 1},
                         pm128 = {128, 2, 1, 0, 64, 0, 0, 1};
    cr_expect_eq(stof__wgmma_persist_ctas(&dv132, 64, &pm3), 396);
    cr_expect_eq(stof__wgmma_persist_ctas(&dv132, 64, &pm128), 264);
    cr_expect_eq(stof__wgmma_persist_ctas(&dv132, 128, &pm3), 264);
    /* d=128, 128 keys, 2 stages: 164 KB, once per SM. */
    const stof_wgmma_cfg pmb = {128, 2, 1, 0, 64, 0, 0, 1};
    cr_expect(stof__wgmma_cfg_valid(NULL, 128, &pmb, why, sizeof(why)), "%s",
              why);
    cr_expect_eq(stof__wgmma_persist_ctas(&dv132, 128, &pmb), 132);
    cr_expect_eq(stof__wgmma_persist_ctas(NULL, 64, &pe), 1);

    /* Heavy-first order of a causal mask: the last row block first. */
    stof_context *ctx = open_or_skip();
    stof_mask *m = NULL;
    cr_assert_eq(stof_mask_from_spec(ctx, "causal", 1000, 1000, &m), STOF_OK);
    stof_format *f = NULL;
    cr_assert_eq(stof_format_build(ctx, m, 128, 128, &f), STOF_OK);
    int32_t order[8];
    cr_assert_eq(f->n_row_blocks, 8);
    stof__wgmma_row_order(f, order);
    int seen = 0;
    for (int i = 0; i < 8; i++) {
        cr_expect_eq(order[i], 7 - i, "order[%d] = %d", i, order[i]);
        seen |= 1 << order[i];
    }
    cr_expect_eq(seen, 0xff);

    /* Mismatched format / descriptor: refused before any launch. */
    stof_block_format bf;
    cr_assert_eq(stof__block_format_upload(ctx, f, &bf), STOF_OK, "%s",
                 stof_errmsg(ctx));
    stof_attention_desc d;
    stof_attention_desc_init(&d, 1, 1, 1000, 1000, 64, STOF_DTYPE_FP16,
                             STOF_LAYOUT_BHSD);
    const CUfunction fake = (CUfunction)(uintptr_t)1;
    const stof_api *api = stof__api();
    /* ok has block_n 128 = the format's: only the other checks fail. */
    const stof_wgmma_cfg bn64 = {64, 2, 1, 0, 0, 0, 0, 0};
    cr_expect_eq(stof__wgmma_launch(fake, &bn64, 64, &d, 0.0f, &bf, 0, 256,
                                    256, 256, 256, NULL, api),
                 STOF_ERR_INVALID_ARGUMENT);
    cr_expect_eq(stof__wgmma_launch(fake, &ok, 128, &d, 0.0f, &bf, 0, 256,
                                    256, 256, 256, NULL, api),
                 STOF_ERR_INVALID_ARGUMENT); /* head_dim mismatch */
    cr_expect_eq(stof__wgmma_launch(fake, &ok, 64, &d, 0.0f, &bf, 0, 264,
                                    256, 256, 256, NULL, api),
                 STOF_ERR_INVALID_ARGUMENT); /* q not 16-byte aligned */
    cr_expect_eq(stof__wgmma_launch(fake, &ok, 64, &d, -1.0f, &bf, 0, 256,
                                    256, 256, 256, NULL, api),
                 STOF_ERR_INVALID_ARGUMENT); /* negative scale */
    stof_attention_desc odd = d;
    odd.layout = STOF_LAYOUT_STRIDED;
    odd.k_stride[2] = 68; /* not a multiple of 8 elements */
    cr_expect_eq(stof__wgmma_launch(fake, &ok, 64, &odd, 0.0f, &bf, 0, 256,
                                    256, 256, 256, NULL, api),
                 STOF_ERR_INVALID_ARGUMENT);
    /* A gather cfg through the block launch; a 64-row cfg on the 128-row
     * format. */
    cr_expect_eq(stof__wgmma_launch(fake, &g, 64, &d, 0.0f, &bf, 0, 256,
                                    256, 256, 256, NULL, api),
                 STOF_ERR_INVALID_ARGUMENT);
    cr_expect_eq(stof__wgmma_launch(fake, &m64, 64, &d, 0.0f, &bf, 0, 256,
                                    256, 256, 256, NULL, api),
                 STOF_ERR_INVALID_ARGUMENT);

    /* Gather launch: the row-wise format of the same mask. */
    stof_rowwise_format rf;
    cr_assert_eq(stof__rowwise_format_upload(ctx, f, &rf), STOF_OK, "%s",
                 stof_errmsg(ctx));
    /* A block cfg; q_rows / row_order not 4-byte aligned; k misaligned. */
    cr_expect_eq(stof__wgmma_gather_launch(fake, &ok, 64, &d, 0.0f, &rf, 0,
                                           0, 256, 256, 256, 256, NULL, api),
                 STOF_ERR_INVALID_ARGUMENT);
    cr_expect_eq(stof__wgmma_gather_launch(fake, &g, 64, &d, 0.0f, &rf, 0,
                                           258, 256, 256, 256, 256, NULL, api),
                 STOF_ERR_INVALID_ARGUMENT);
    cr_expect_eq(stof__wgmma_gather_launch(fake, &g, 64, &d, 0.0f, &rf, 2, 0,
                                           256, 256, 256, 256, NULL, api),
                 STOF_ERR_INVALID_ARGUMENT);
    cr_expect_eq(stof__wgmma_gather_launch(fake, &g, 64, &d, 0.0f, &rf, 0, 0,
                                           256, 264, 256, 256, NULL, api),
                 STOF_ERR_INVALID_ARGUMENT);
    /* block_n 64 against the 128-key format; a k stride of 68. */
    const stof_wgmma_cfg g64 = {64, 2, 1, 1, 0, 0, 0, 0};
    cr_expect_eq(stof__wgmma_gather_launch(fake, &g64, 64, &d, 0.0f, &rf, 0,
                                           0, 256, 256, 256, 256, NULL, api),
                 STOF_ERR_INVALID_ARGUMENT);
    cr_expect_eq(stof__wgmma_gather_launch(fake, &g, 64, &odd, 0.0f, &rf, 0,
                                           0, 256, 256, 256, 256, NULL, api),
                 STOF_ERR_INVALID_ARGUMENT);
    stof__rowwise_format_free(ctx, &rf);

    /* Gather row order: most listed keys first (causal: the last block). */
    stof__wgmma_gather_row_order(f, order);
    for (int i = 0; i < 8; i++)
        cr_expect_eq(order[i], 7 - i, "gather order[%d] = %d", i, order[i]);

    stof__block_format_free(ctx, &bf);
    stof_format_free(&f);
    stof_mask_free(&m);
    stof_close(&ctx);
}

/* A plan for 192-row CTAs: made for a dense mask (its 64-row format's
 * every three row blocks alike), refused with a reason for a causal one
 * (as a database record naming it for such a mask would be). */
Test(gpu, wgmma_192_rows_plan_rules)
{
    stof_context *ctx = open_or_skip();
    if (!stof__wgmma_device_ok(&ctx->device)) {
        stof_close(&ctx);
        cr_skip_test("the wgmma kernel needs compute capability 9.0");
    }
    stof_candidate c;
    memset(&c, 0, sizeof(c));
    c.kind = STOF_KERNEL_WGMMA;
    c.cfg.block_m = 192;
    c.cfg.block_n = 128;
    c.cfg.warps = 16;
    c.cfg.stages = 2;
    c.group = 1;
    c.wcfg = (stof_wgmma_cfg){128, 2, 1, 0, 192, 0, 0, 0};
    void *cubin = NULL;
    size_t size = 0;
    cr_assert_eq(stof__kernel_cubin(ctx, &c, 64, STOF_DTYPE_FP16, &cubin,
                                    &size),
                 STOF_OK, "%s", stof_errmsg(ctx));
    static const struct {
        const char *spec;
        stof_status want;
    } want[] = {{"dense", STOF_OK}, {"causal", STOF_ERR_UNSUPPORTED}};
    for (int i = 0; i < 2; i++) {
        stof_mask *m = tu_make_mask(ctx, want[i].spec, 1000, 1000);
        stof_attention_desc d;
        tu_make_desc(&d, 1, 2, 1000, 1000, 64, STOF_DTYPE_FP16,
                     STOF_LAYOUT_BHSD, 0);
        stof_plan *p = NULL;
        const stof_status st =
            stof__plan_from_cubin(ctx, &d, m, &c, cubin, size, 0, &p);
        cr_expect_eq(st, want[i].want, "%s: %s", want[i].spec,
                     stof_errmsg(ctx));
        if (st != STOF_OK)
            cr_expect(strstr(stof_errmsg(ctx), "192") != NULL, "%s",
                      stof_errmsg(ctx));
        if (p)
            stof__plan_release(p);
        stof_mask_free(&m);
    }
    free(cubin);
    stof_close(&ctx);
}

/* Criterion's main, after a probe that reports the suite skipped (exit 77)
 * when no GPU is usable. */
__attribute__((visibility("default"))) int main(int argc, char **argv)
{
    return tu_gpu_suite_main("gpu wgmma", argc, argv);
}
