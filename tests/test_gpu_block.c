/*
 * test_gpu_block.c - the "gpu" suite for the block-wise sparse kernel
 * (jit_templates/attn_block.cu, src/kernels/attn_block.c) and its gather (row-wise)
 * mode: every configuration of a list covering the template's
 * STOF_VARIANTS runs a set of masks, sizes, layouts on fresh random inputs
 * with the output poisoned first, and is compared with the C reference
 * (stof__ref_attention):
 *   - relative error ||out - ref|| / ||ref|| < 1e-2;
 *   - rows whose mask row allows no key are exactly 0;
 *   - every output element was written (no NaN left from the poison);
 *   - nothing outside the output elements (strided padding) was written.
 * The gather configurations run every other case, and every mask with a
 * row period (dilated), with query rows permuted (QPERM): the format is
 * built on the mask with its rows grouped by residue class
 * (stof__mask_group_rows) or, without a period, shuffled, and the kernel
 * gets the permutation as q_rows (stof__rowwise_launch_qperm); the
 * reference always runs on the original mask and tensors.
 * Without a usable GPU the program prints why and exits 77 (skip).
 * STOF_TEST_QUICK=1 runs only the cases of at most 300k mask elements (for
 * runs under compute-sanitizer).
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

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

typedef struct blk_cfg {
    int head_dim;
    stof_dtype dtype;
    stof_block_cfg c;
} blk_cfg;

/* The template's STOF_VARIANTS, and a few more. */
static const blk_cfg configs[] = {
    {64, STOF_DTYPE_FP16, {128, 64, 8, 2, 0, 0, 0}},  /* 0 */
    {64, STOF_DTYPE_BF16, {128, 64, 8, 2, 0, 0, 0}},  /* 1 */
    {128, STOF_DTYPE_FP16, {128, 64, 8, 2, 0, 0, 0}}, /* 2 */
    {128, STOF_DTYPE_BF16, {128, 64, 8, 2, 0, 0, 0}}, /* 3 */
    {64, STOF_DTYPE_FP16, {64, 128, 4, 3, 0, 0, 0}},  /* 4 */
    {128, STOF_DTYPE_BF16, {64, 128, 4, 3, 0, 0, 0}}, /* 5 */
    {64, STOF_DTYPE_FP16, {64, 32, 4, 2, 0, 0, 0}},   /* 6 */
    {128, STOF_DTYPE_BF16, {128, 32, 8, 3, 0, 0, 0}}, /* 7 */
    {128, STOF_DTYPE_FP16, {128, 32, 4, 1, 0, 0, 0}}, /* 8: 2 m16 a warp */
    {64, STOF_DTYPE_BF16, {128, 64, 4, 2, 0, 0, 0}},  /* 9: 2 m16 a warp */
    {32, STOF_DTYPE_FP16, {128, 64, 8, 2, 0, 0, 0}},  /* 10 */
    {32, STOF_DTYPE_BF16, {64, 128, 4, 1, 0, 0, 0}},  /* 11 */
    {256, STOF_DTYPE_FP16, {64, 32, 4, 1, 0, 0, 0}},  /* 12 */
    {256, STOF_DTYPE_BF16, {128, 64, 8, 2, 0, 0, 0}}, /* 13 */
    {64, STOF_DTYPE_FP16, {64, 64, 4, 1, 0, 0, 0}},   /* 14 */
    {128, STOF_DTYPE_FP16, {64, 64, 4, 2, 0, 0, 0}},  /* 15 */
};

/* Gather mode: the template's GATHER=1 variants, and more. */
static const blk_cfg gather_configs[] = {
    {64, STOF_DTYPE_FP16, {128, 64, 8, 2, 1, 0, 0}},  /* 0 */
    {64, STOF_DTYPE_BF16, {128, 64, 4, 2, 1, 0, 0}},  /* 1: 2 m16 a warp */
    {128, STOF_DTYPE_FP16, {128, 64, 8, 2, 1, 0, 0}}, /* 2 */
    {128, STOF_DTYPE_BF16, {64, 128, 4, 3, 1, 0, 0}}, /* 3 */
    {64, STOF_DTYPE_FP16, {64, 128, 4, 3, 1, 0, 0}},  /* 4 */
    {32, STOF_DTYPE_FP16, {128, 64, 8, 1, 1, 0, 0}},  /* 5 */
    {256, STOF_DTYPE_BF16, {64, 32, 4, 1, 1, 0, 0}},  /* 6 */
    {128, STOF_DTYPE_FP16, {128, 32, 4, 2, 1, 0, 0}}, /* 7: 2 m16 a warp */
    {256, STOF_DTYPE_FP16, {128, 64, 8, 2, 1, 0, 0}}, /* 8 */
    {32, STOF_DTYPE_BF16, {64, 32, 4, 3, 1, 0, 0}},   /* 9 */
    {64, STOF_DTYPE_BF16, {64, 64, 4, 1, 1, 0, 0}},   /* 10 */
    {128, STOF_DTYPE_BF16, {128, 128, 8, 2, 1, 0, 0}}, /* 11 */
};

/* A mask: a spec, or (spec starting with '#') a generated one:
 *   "#single"  each row i allows exactly key (7 i + 3) mod seq_k, so the
 *              output row must be that V row;
 *   "#lastcol" each row allows only the last key, seq_k - 1 (a tile that
 *              hangs past seq_k with one column set);
 *   "#halfempty" even rows dense, odd rows empty (empty rows inside
 *              partial tiles);
 *   "#colsparse" row i allows the keys k with (k * 7 + i / 5) % 11 == 0 and
 *              rows i % 13 == 0 are empty (compacted lists with partial
 *              tiles and empty rows inside them). */
typedef struct blk_case {
    const char *spec;
    int batch, heads, seq_q, seq_k;
    stof_layout layout; /* STRIDED: BSHD with padded rows */
    int pad;
} blk_case;

static const blk_case cases[] = {
    {"dense", 1, 2, 1024, 1024, STOF_LAYOUT_BHSD, 0},
    {"causal", 1, 1, 1000, 1000, STOF_LAYOUT_BSHD, 0},
    {"sliding:256", 1, 1, 1000, 3000, STOF_LAYOUT_STRIDED, 8},
    {"dilated:512:2", 1, 1, 3000, 1000, STOF_LAYOUT_BHSD, 0},
    {"longformer:256:64", 1, 1, 1024, 1024, STOF_LAYOUT_BSHD, 0},
    {"bigbird:64:3:2:3:1", 1, 1, 1024, 1024, STOF_LAYOUT_STRIDED, 16},
    {"strided:128", 2, 1, 1000, 1000, STOF_LAYOUT_BHSD, 0},
    {"random:0.05:3", 2, 3, 77, 65, STOF_LAYOUT_BSHD, 0},
    {"none", 1, 2, 77, 65, STOF_LAYOUT_BHSD, 0},
    {"causal&strided:300", 1, 1, 1000, 1000, STOF_LAYOUT_STRIDED, 8},
    {"random:0.002:5", 1, 2, 500, 300, STOF_LAYOUT_BHSD, 0},
    {"random:0.05:3&random:0.05:4", 1, 1, 700, 900, STOF_LAYOUT_BSHD, 0},
    {"dense", 1, 1, 1, 1, STOF_LAYOUT_BHSD, 0},
    {"none", 1, 1, 1, 1, STOF_LAYOUT_BSHD, 0},
    {"dense", 3, 1, 1, 777, STOF_LAYOUT_BSHD, 0},
    {"dense", 1, 1, 200, 1000, STOF_LAYOUT_BSHD, 0},
    {"longformer:128:200", 1, 2, 500, 1000, STOF_LAYOUT_STRIDED, 8},
    {"causal_sliding:64", 2, 2, 129, 4097, STOF_LAYOUT_STRIDED, 16},
    {"sliding:100|strided:37", 1, 1, 300, 1000, STOF_LAYOUT_BHSD, 0},
    {"#single", 1, 2, 333, 197, STOF_LAYOUT_BHSD, 0},
    {"#lastcol", 1, 1, 200, 97, STOF_LAYOUT_STRIDED, 8},
    {"#halfempty", 1, 1, 130, 250, STOF_LAYOUT_BSHD, 0},
    /* Sparse inside the tiles, where the gather kernel matters. */
    {"strided:128", 1, 1, 1000, 3000, STOF_LAYOUT_STRIDED, 8},
    {"dilated:64:3", 1, 2, 1000, 1000, STOF_LAYOUT_BSHD, 0},
    {"random:0.05:9", 1, 1, 3000, 1000, STOF_LAYOUT_BHSD, 0},
    {"random:0.3:2&causal", 1, 1, 1000, 3000, STOF_LAYOUT_BHSD, 0},
    {"strided:64&causal|none", 1, 1, 77, 65, STOF_LAYOUT_STRIDED, 8},
    {"#colsparse", 1, 1, 1000, 1000, STOF_LAYOUT_BSHD, 0},
};

#define N_CASES ((int)(sizeof(cases) / sizeof(*cases)))

static const char *dt_name(stof_dtype dt)
{
    return dt == STOF_DTYPE_FP16 ? "fp16" : "bf16";
}

/* Run one case on a loaded kernel; fails the test on any mismatch.
 * qperm (gather only): the format is built on permuted_mask() and the
 * kernel gets the permutation. */
static void run_case(stof_context *ctx, const blk_cfg *k, CUfunction fn,
                     const blk_case *c, int qperm, tu_rng *rng)
{
    const stof_api *api = stof__api();
    char tag[256];
    snprintf(tag, sizeof(tag),
             "[%s d=%d %s bm=%d bn=%d w=%d s=%d%s] %s %dx%dx%dx%d layout=%d",
             k->c.gather ? "gather" : "block", k->head_dim, dt_name(k->dtype),
             k->c.block_m, k->c.block_n, k->c.warps, k->c.stages,
             qperm ? " qperm" : "", c->spec, c->batch, c->heads, c->seq_q,
             c->seq_k, (int)c->layout);

    stof_mask *m = tu_make_mask(ctx, c->spec, c->seq_q, c->seq_k);
    stof_mask *fm = m; /* the mask the format is built on */
    int32_t *perm = NULL;
    int period = 1;
    if (qperm)
        fm = tu_permuted_mask(ctx, m, rng, &perm, &period);
    stof_format *f = NULL;
    stof_status st =
        stof_format_build(ctx, fm, k->c.block_m, k->c.block_n, &f);
    cr_assert_eq(st, STOF_OK, "%s: format: %s", tag, stof_errmsg(ctx));
    stof_block_format bf;
    stof_rowwise_format rf;
    memset(&bf, 0, sizeof(bf));
    memset(&rf, 0, sizeof(rf));
    if (k->c.gather)
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
    tu_fill_random(rng, hv, fv, nk, k->dtype, 1.0f);

    cr_assert_eq(stof__ctx_push(ctx), STOF_OK);
    CUdeviceptr dq, dk, dv, dout, dperm = 0;
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
    /* Poison: 0xffff is a NaN in fp16 and bf16. */
    cr_assert_eq(api->cuMemsetD8(dout, 0xff, nq * 2), CUDA_SUCCESS);
    if (k->c.gather)
        st = stof__rowwise_launch_qperm(fn, &k->c, k->head_dim, &d, 0.0f,
                                        &rf, dperm, dq, dk, dv, dout, NULL,
                                        api);
    else
        st = stof__block_launch(fn, &k->c, k->head_dim, &d, 0.0f, &bf, dq,
                                dk, dv, dout, NULL, api);
    cr_assert_eq(st, STOF_OK, "%s: launch: %s", tag, stof_status_str(st));
    const char *failed = tu_sync_error();
    cr_assert(!failed, "%s: kernel failed: %s", tag, failed);
    cr_assert_eq(api->cuMemcpyDtoH(ho, dout, nq * 2), CUDA_SUCCESS);
    api->cuMemFree(dq);
    api->cuMemFree(dk);
    api->cuMemFree(dv);
    api->cuMemFree(dout);
    if (dperm)
        api->cuMemFree(dperm);
    stof__ctx_pop(ctx);
    stof__block_format_free(ctx, &bf);
    const int64_t g_tiles = rf.n_tiles, g_partial = rf.n_partial;
    stof__rowwise_format_free(ctx, &rf);

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
                (long long)(k->c.gather ? g_tiles
                                        : f->row_ptr[f->n_row_blocks]),
                (long long)(k->c.gather ? g_partial : f->n_partial), period,
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
    stof_format_free(&f);
    if (fm != m)
        stof_mask_free(&fm);
    free(perm);
    stof_mask_free(&m);
}

/* Compile and load configuration `idx` of `list`, run every case. */
static void run_config_of(const blk_cfg *list, int idx)
{
    const blk_cfg *k = &list[idx];
    char why[256];
    cr_assert(stof__block_cfg_valid(NULL, k->head_dim, &k->c, why,
                                    sizeof(why)),
              "config %d is not valid: %s", idx, why);
    stof_context *ctx = open_or_skip();
    stof_device *dev = &ctx->device;
    if (!stof__block_cfg_valid(dev, k->head_dim, &k->c, why, sizeof(why))) {
        cr_log_warn("config %d does not fit this device, skipped: %s", idx,
                    why);
        stof_close(&ctx);
        return;
    }
    CUmodule mod = NULL;
    CUfunction fn = NULL;
    stof_status st =
        stof__block_load(ctx, k->head_dim, k->dtype, &k->c, NULL, &mod, &fn);
    cr_assert_eq(st, STOF_OK, "config %d: load: %s", idx, stof_errmsg(ctx));
    cr_log_info("config %d: %s d=%d %s bm=%d bn=%d warps=%d stages=%d, %zu "
                "B shared memory",
                idx, k->c.gather ? "gather" : "block", k->head_dim,
                dt_name(k->dtype), k->c.block_m, k->c.block_n, k->c.warps,
                k->c.stages, stof__block_smem_bytes(k->head_dim, &k->c));
    tu_rng rng = {tu_seed() ^ (0x9e3779b97f4a7c15ull * (uint64_t)(idx + 1)) ^
                  (k->c.gather ? 0x5bd1e995ull : 0u)};
    const char *quick = getenv("STOF_TEST_QUICK");
    const int is_quick = quick && quick[0] && strcmp(quick, "0") != 0;
    for (int i = 0; i < N_CASES; i++)
        if (!is_quick || (int64_t)cases[i].seq_q * cases[i].seq_k <= 300000)
            run_case(ctx, k, fn, &cases[i],
                     k->c.gather && (i % 2 || strncmp(cases[i].spec,
                                                      "dilated", 7) == 0),
                     &rng);
    cr_assert_eq(stof__ctx_push(ctx), STOF_OK);
    ctx->api->cuModuleUnload(mod);
    stof__ctx_pop(ctx);
    stof_close(&ctx);
}

static void run_config(int idx)
{
    run_config_of(configs, idx);
}

static void run_gather_config(int idx)
{
    run_config_of(gather_configs, idx);
}

#define BLOCK_CONFIG_TEST(i)                                                   \
    Test(gpu, block_config_##i) { run_config(i); }
#define GATHER_CONFIG_TEST(i)                                                  \
    Test(gpu, gather_config_##i) { run_gather_config(i); }

BLOCK_CONFIG_TEST(0)
BLOCK_CONFIG_TEST(1)
BLOCK_CONFIG_TEST(2)
BLOCK_CONFIG_TEST(3)
BLOCK_CONFIG_TEST(4)
BLOCK_CONFIG_TEST(5)
BLOCK_CONFIG_TEST(6)
BLOCK_CONFIG_TEST(7)
BLOCK_CONFIG_TEST(8)
BLOCK_CONFIG_TEST(9)
BLOCK_CONFIG_TEST(10)
BLOCK_CONFIG_TEST(11)
BLOCK_CONFIG_TEST(12)
BLOCK_CONFIG_TEST(13)
BLOCK_CONFIG_TEST(14)
BLOCK_CONFIG_TEST(15)

_Static_assert(sizeof(configs) / sizeof(*configs) == 16,
               "one BLOCK_CONFIG_TEST per configuration");

GATHER_CONFIG_TEST(0)
GATHER_CONFIG_TEST(1)
GATHER_CONFIG_TEST(2)
GATHER_CONFIG_TEST(3)
GATHER_CONFIG_TEST(4)
GATHER_CONFIG_TEST(5)
GATHER_CONFIG_TEST(6)
GATHER_CONFIG_TEST(7)
GATHER_CONFIG_TEST(8)
GATHER_CONFIG_TEST(9)
GATHER_CONFIG_TEST(10)
GATHER_CONFIG_TEST(11)

_Static_assert(sizeof(gather_configs) / sizeof(*gather_configs) == 12,
               "one GATHER_CONFIG_TEST per configuration");

/* The host-side rules, and the launch's argument checks (no kernel runs). */
Test(gpu, block_cfg_rules_and_launch_checks)
{
    char why[256];
    const stof_block_cfg bad_warps = {64, 64, 8, 2, 0, 0, 0}; /* 8 rows */
    cr_expect_not(stof__block_cfg_valid(NULL, 64, &bad_warps, why,
                                        sizeof(why)));
    cr_expect(strstr(why, "multiple of 16"), "%s", why);
    const stof_block_cfg ok = {128, 64, 8, 2, 0, 0, 0};
    cr_expect_not(stof__block_cfg_valid(NULL, 96, &ok, why, sizeof(why)));
    cr_expect(strstr(why, "head_dim"), "%s", why);
    const stof_block_cfg spill = {128, 128, 4, 2, 0, 0, 0}; /* d=128 */
    cr_expect_not(stof__block_cfg_valid(NULL, 128, &spill, why, sizeof(why)));
    cr_expect(strstr(why, "registers"), "%s", why);
    const stof_block_cfg stages4 = {128, 64, 8, 4, 0, 0, 0};
    cr_expect_not(stof__block_cfg_valid(NULL, 64, &stages4, why, sizeof(why)));
    cr_expect(stof__block_cfg_valid(NULL, 64, &ok, why, sizeof(why)), "%s",
              why);
    /* Q 16 KiB + K,V 2 x 2 x 8 KiB + bitmaps 2 x 1 KiB + meta 16. */
    cr_expect_eq(stof__block_smem_bytes(64, &ok),
                 16384u + 32768u + 2048u + 16u);
    stof_device small;
    memset(&small, 0, sizeof(small));
    small.ok = 1;
    small.max_smem_optin = 48 * 1024;
    cr_expect_not(stof__block_cfg_valid(&small, 64, &ok, why, sizeof(why)));
    cr_expect(strstr(why, "shared memory"), "%s", why);

    /* Mismatched format / descriptor: refused before any launch. */
    stof_context *ctx = open_or_skip();
    stof_mask *m = NULL;
    cr_assert_eq(stof_mask_from_spec(ctx, "causal", 256, 256, &m), STOF_OK);
    stof_format *f = NULL;
    cr_assert_eq(stof_format_build(ctx, m, 64, 64, &f), STOF_OK);
    stof_block_format bf;
    cr_assert_eq(stof__block_format_upload(ctx, f, &bf), STOF_OK, "%s",
                 stof_errmsg(ctx));
    cr_expect_eq(bf.n_tiles, f->row_ptr[f->n_row_blocks]);
    stof_attention_desc d;
    stof_attention_desc_init(&d, 1, 1, 256, 256, 64, STOF_DTYPE_FP16,
                             STOF_LAYOUT_BHSD);
    /* ok has block_m 128, the format 64. */
    cr_expect_eq(stof__block_launch((CUfunction)(uintptr_t)1, &ok, 64, &d,
                                    0.0f, &bf, 256, 256, 256, 256, NULL,
                                    stof__api()),
                 STOF_ERR_INVALID_ARGUMENT);
    stof__block_format_free(ctx, &bf);
    cr_expect_eq(bf.mem, 0);
    stof__block_format_free(ctx, &bf); /* twice is harmless */
    stof_format_free(&f);
    stof_mask_free(&m);
    stof_close(&ctx);
}

/* Brute force from the mask: row block i's keys, its tiles of bn keys and
 * which are full, compared with the row-wise upload (downloaded back) and
 * with stof__rowwise_stats. */
static void check_rowwise_format(stof_context *ctx, const char *spec,
                                 int seq_q, int seq_k, int bm, int bn)
{
    stof_mask *m = NULL;
    cr_assert_eq(stof_mask_from_spec(ctx, spec, seq_q, seq_k, &m), STOF_OK,
                 "%s: %s", spec, stof_errmsg(ctx));
    stof_format *f = NULL;
    cr_assert_eq(stof_format_build(ctx, m, bm, bn, &f), STOF_OK);
    stof_rowwise_format rf;
    cr_assert_eq(stof__rowwise_format_upload(ctx, f, &rf), STOF_OK, "%s",
                 stof_errmsg(ctx));
    uint8_t *h = malloc(rf.bytes);
    cr_assert(h);
    cr_assert_eq(stof__ctx_push(ctx), STOF_OK);
    cr_assert_eq(stof__api()->cuMemcpyDtoH(h, rf.mem, rf.bytes),
                 CUDA_SUCCESS);
    stof__ctx_pop(ctx);
    const int32_t *kptr = (const int32_t *)(h + (rf.key_ptr - rf.mem));
    const int32_t *keys = (const int32_t *)(h + (rf.keys - rf.mem));
    const int32_t *tptr = (const int32_t *)(h + (rf.tile_ptr - rf.mem));
    const uint8_t *kind = h + (rf.kind - rf.mem);
    const int32_t *bidx = (const int32_t *)(h + (rf.bitmap_idx - rf.mem));
    const uint32_t *bits = (const uint32_t *)(h + (rf.bitmaps - rf.mem));
    const int wpr = (bn + 31) / 32;
    int *list = malloc((size_t)seq_k * sizeof(int));
    cr_assert(list);
    int64_t tiles = 0, partial = 0, n_keys = 0;
    int most = 0;
    for (int i = 0; i < f->n_row_blocks; i++) {
        const int r0 = i * bm, rows = seq_q - r0 < bm ? seq_q - r0 : bm;
        int nk = 0;
        for (int k = 0; k < seq_k; k++) {
            int any = 0;
            for (int r = 0; r < rows && !any; r++)
                any = stof_mask_get(m, r0 + r, k);
            if (any)
                list[nk++] = k;
        }
        cr_assert_eq(kptr[i], n_keys, "%s: key_ptr[%d]", spec, i);
        for (int j = 0; j < nk; j++)
            cr_assert_eq(keys[n_keys + j], list[j], "%s: key %d of block %d",
                         spec, j, i);
        n_keys += nk;
        const int nt = (nk + bn - 1) / bn;
        most = nt > most ? nt : most;
        cr_assert_eq(tptr[i], tiles, "%s: tile_ptr[%d]", spec, i);
        for (int t = 0; t < nt; t++, tiles++) {
            int full = 1;
            for (int r = 0; r < rows; r++)
                for (int j = t * bn; j < nk && j < t * bn + bn; j++)
                    full &= stof_mask_get(m, r0 + r, list[j]);
            cr_assert_eq(kind[tiles], full ? STOF_TILE_FULL : STOF_TILE_PARTIAL,
                         "%s: block %d tile %d", spec, i, t);
            if (full) {
                cr_assert_eq(bidx[tiles], -1);
                continue;
            }
            cr_assert_eq(bidx[tiles], partial, "%s: bitmap_idx", spec);
            const uint32_t *b = bits + (size_t)partial * bm * wpr;
            for (int r = 0; r < bm; r++)
                for (int c = 0; c < bn; c++) {
                    const int j = t * bn + c;
                    const int want = r < rows && j < nk &&
                                     stof_mask_get(m, r0 + r, list[j]);
                    const int got = (b[r * wpr + c / 32] >> (c % 32)) & 1;
                    cr_assert_eq(got, want, "%s: block %d tile %d bit (%d, %d)",
                                 spec, i, t, r, c);
                }
            partial++;
        }
    }
    cr_assert_eq(kptr[f->n_row_blocks], n_keys);
    cr_assert_eq(tptr[f->n_row_blocks], tiles);
    cr_expect_eq(rf.n_keys, n_keys);
    cr_expect_eq(rf.n_tiles, tiles);
    cr_expect_eq(rf.n_partial, partial);
    cr_expect_eq(rf.max_tiles, most);
    int64_t sk = -1, st = -1, sp = -1;
    int sm = -1;
    cr_assert_eq(stof__rowwise_stats(f, &sk, &st, &sp, &sm), STOF_OK);
    cr_expect(sk == n_keys && st == tiles && sp == partial && sm == most,
              "%s: stats %lld %lld %lld %d", spec, (long long)sk,
              (long long)st, (long long)sp, sm);
    cr_log_info("row-wise %s %dx%d (%dx%d): %lld keys, %lld tiles, %lld "
                "partial",
                spec, seq_q, seq_k, bm, bn, (long long)n_keys,
                (long long)tiles, (long long)partial);
    free(list);
    free(h);
    stof__rowwise_format_free(ctx, &rf);
    cr_expect_eq(rf.mem, 0);
    stof__rowwise_format_free(ctx, &rf); /* twice is harmless */
    stof_format_free(&f);
    stof_mask_free(&m);
}

/* The gather mode's host side: cfg rules, shared memory, the repacked
 * row-wise format against brute force, the launch's argument checks. */
Test(gpu, gather_format_and_launch_checks)
{
    char why[256];
    const stof_block_cfg g = {128, 64, 8, 2, 1, 0, 0};
    cr_expect(stof__block_cfg_valid(NULL, 64, &g, why, sizeof(why)), "%s",
              why);
    /* The block kernel's bytes + 3 slots of 2 x 64 row offsets. */
    cr_expect_eq(stof__block_smem_bytes(64, &g),
                 16384u + 32768u + 2048u + 16u + 1536u);
    const stof_block_cfg g2 = {128, 64, 8, 2, 2, 0, 0};
    cr_expect_not(stof__block_cfg_valid(NULL, 64, &g2, why, sizeof(why)));
    cr_expect(strstr(why, "gather"), "%s", why);

    stof_context *ctx = open_or_skip();
    check_rowwise_format(ctx, "strided:128", 1000, 3000, 128, 64);
    check_rowwise_format(ctx, "strided:128", 300, 1000, 64, 128);
    check_rowwise_format(ctx, "causal", 200, 200, 64, 32);
    check_rowwise_format(ctx, "dense", 77, 65, 64, 64);
    check_rowwise_format(ctx, "none", 77, 65, 64, 64);
    check_rowwise_format(ctx, "random:0.05:3", 77, 65, 64, 32);
    check_rowwise_format(ctx, "random:0.3:1&causal", 300, 500, 128, 64);
    check_rowwise_format(ctx, "dilated:64:3", 250, 250, 64, 32);
    check_rowwise_format(ctx, "bigbird:16:3:1:2:7", 200, 333, 16, 16);

    /* Launch checks, refused before any launch. */
    stof_mask *m = NULL;
    cr_assert_eq(stof_mask_from_spec(ctx, "causal", 256, 256, &m), STOF_OK);
    stof_format *f = NULL;
    cr_assert_eq(stof_format_build(ctx, m, 128, 64, &f), STOF_OK);
    stof_rowwise_format rf;
    stof_block_format bf;
    cr_assert_eq(stof__rowwise_format_upload(ctx, f, &rf), STOF_OK, "%s",
                 stof_errmsg(ctx));
    cr_assert_eq(stof__block_format_upload(ctx, f, &bf), STOF_OK, "%s",
                 stof_errmsg(ctx));
    stof_attention_desc d;
    stof_attention_desc_init(&d, 1, 1, 256, 256, 64, STOF_DTYPE_FP16,
                             STOF_LAYOUT_BHSD);
    const stof_block_cfg b = {128, 64, 8, 2, 0, 0, 0};
    const stof_block_cfg g64 = {64, 64, 4, 2, 1, 0, 0};
    const CUfunction fake = (CUfunction)(uintptr_t)1;
    /* A gather cfg through the block launch and the other way round. */
    cr_expect_eq(stof__block_launch(fake, &g, 64, &d, 0.0f, &bf, 256, 256,
                                    256, 256, NULL, stof__api()),
                 STOF_ERR_INVALID_ARGUMENT);
    cr_expect_eq(stof__rowwise_launch(fake, &b, 64, &d, 0.0f, &rf, 256, 256,
                                      256, 256, NULL, stof__api()),
                 STOF_ERR_INVALID_ARGUMENT);
    /* block_m 64 against a 128-row format; misaligned pointer. */
    cr_expect_eq(stof__rowwise_launch(fake, &g64, 64, &d, 0.0f, &rf, 256, 256,
                                      256, 256, NULL, stof__api()),
                 STOF_ERR_INVALID_ARGUMENT);
    cr_expect_eq(stof__rowwise_launch(fake, &g, 64, &d, 0.0f, &rf, 256, 264,
                                      256, 256, NULL, stof__api()),
                 STOF_ERR_INVALID_ARGUMENT);
    /* A K row stride that is no multiple of 8 elements. */
    stof_attention_desc d3 = d;
    d3.k_stride[2] = 68;
    cr_expect_eq(stof__rowwise_launch(fake, &g, 64, &d3, 0.0f, &rf, 256, 256,
                                      256, 256, NULL, stof__api()),
                 STOF_ERR_INVALID_ARGUMENT);
    /* q_rows not 4-byte aligned; a block cfg with q_rows. */
    cr_expect_eq(stof__rowwise_launch_qperm(fake, &g, 64, &d, 0.0f, &rf, 258,
                                            256, 256, 256, 256, NULL,
                                            stof__api()),
                 STOF_ERR_INVALID_ARGUMENT);
    cr_expect_eq(stof__rowwise_launch_qperm(fake, &b, 64, &d, 0.0f, &rf, 256,
                                            256, 256, 256, 256, NULL,
                                            stof__api()),
                 STOF_ERR_INVALID_ARGUMENT);

    /* Grouping dilated:512:2's rows by parity nearly halves the gathered
     * tiles: a grouped block of 128 rows spans 256 query positions, so it
     * lists (1024 + 256) / 2 keys instead of 1024 + 128 (measured 296 of
     * 536 tiles at 128 x 64). */
    stof_mask *dm = NULL, *gm = NULL;
    int32_t *perm = NULL;
    cr_assert_eq(stof_mask_from_spec(ctx, "dilated:512:2", 4096, 4096, &dm),
                 STOF_OK);
    cr_assert_eq(stof__mask_row_period(dm), 2);
    cr_assert_eq(stof__mask_group_rows(ctx, dm, 2, &gm, &perm), STOF_OK);
    int64_t tiles[2], keys[2];
    for (int i = 0; i < 2; i++) {
        stof_format *df = NULL;
        cr_assert_eq(stof_format_build(ctx, i ? gm : dm, 128, 64, &df),
                     STOF_OK);
        cr_assert_eq(stof__rowwise_stats(df, &keys[i], &tiles[i], NULL, NULL),
                     STOF_OK);
        stof_format_free(&df);
    }
    cr_log_info("dilated:512:2 4096: %lld keys / %lld tiles, grouped %lld / "
                "%lld",
                (long long)keys[0], (long long)tiles[0], (long long)keys[1],
                (long long)tiles[1]);
    cr_expect(10 * tiles[1] <= 6 * tiles[0] && 10 * keys[1] <= 6 * keys[0],
              "grouped tiles %lld, ungrouped %lld", (long long)tiles[1],
              (long long)tiles[0]);
    free(perm);
    stof_mask_free(&gm);
    stof_mask_free(&dm);
    stof__rowwise_format_free(ctx, &rf);
    stof__block_format_free(ctx, &bf);
    stof_format_free(&f);
    stof_mask_free(&m);
    stof_close(&ctx);
}

/* Criterion's main, after a probe that reports the suite skipped (exit 77)
 * when no GPU is usable. */
__attribute__((visibility("default"))) int main(int argc, char **argv)
{
    return tu_gpu_suite_main("gpu block", argc, argv);
}
