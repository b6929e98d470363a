/*
 * test_gpu_family_attn.c - attention over mask families on the GPU: a plan
 * made once per family runs instance after instance (random per-sequence
 * lengths, offsets, prefixes, documents), each checked per sequence against
 * the C reference with that sequence's mask, outputs poisoned first; fp16
 * and bf16; nothing compiled after the plan; a run captured in a CUDA graph
 * and replayed with new instance data in the same device buffers; split-KV
 * plans (short queries, long keys) over families, instance after instance.
 */
#include <criterion/criterion.h>
#include <criterion/logging.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "attention_int.h"
#include "cuda_shim.h"
#include "internal.h"
#include "testutil.h"

static void remove_db(void);
TestSuite(gpu_family_attn, .fini = remove_db, .timeout = 900);

#define MAXB 4

/* A user database of this process only (cache-only mode records misses). */
static const char *db_path(void)
{
    return tu_process_db("family-attn");
}

static void remove_db(void)
{
    tu_remove_db(db_path());
}

/* Problems small enough for a bitmap instance (the long ones have none). */
#define SMALL(sq, sk) ((int64_t)(sq) * (sk) <= (1 << 22))

typedef struct problem {
    int batch, heads, seq_q, seq_k, head_dim;
    stof_dtype dt;
    size_t nq, nk;           /* elements of q/o and k/v */
    uint16_t *hq, *hk, *hv, *ho;
    float *fq, *fk, *fv, *fo;
    CUdeviceptr dq, dk, dv, dout, ddata;
    stof_attention_desc d;
} problem;

static void problem_new(problem *p, stof_context *ctx, tu_rng *r, int batch,
                        int heads, int seq_q, int seq_k, int head_dim,
                        stof_dtype dt)
{
    memset(p, 0, sizeof(*p));
    p->batch = batch;
    p->heads = heads;
    p->seq_q = seq_q;
    p->seq_k = seq_k;
    p->head_dim = head_dim;
    p->dt = dt;
    cr_assert_eq(stof_attention_desc_init(&p->d, batch, heads, seq_q, seq_k,
                                          head_dim, dt, STOF_LAYOUT_BHSD),
                 STOF_OK);
    p->nq = (size_t)batch * heads * seq_q * head_dim;
    p->nk = (size_t)batch * heads * seq_k * head_dim;
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
    cr_assert_eq(api->cuMemAlloc(&p->dq, p->nq * 2), CUDA_SUCCESS);
    cr_assert_eq(api->cuMemAlloc(&p->dout, p->nq * 2), CUDA_SUCCESS);
    cr_assert_eq(api->cuMemAlloc(&p->dk, p->nk * 2), CUDA_SUCCESS);
    cr_assert_eq(api->cuMemAlloc(&p->dv, p->nk * 2), CUDA_SUCCESS);
    /* Lengths, offsets, prefixes, seeds, documents and (small problems)
     * the bitmap. */
    const size_t bm = SMALL(seq_q, seq_k) ? (size_t)batch * seq_q *
                                                (size_t)((seq_k + 31) / 32) * 4
                                          : 0;
    cr_assert_eq(api->cuMemAlloc(&p->ddata, 7 * 256 + (size_t)batch * seq_k * 4 +
                                                bm),
                 CUDA_SUCCESS);
    api->cuMemcpyHtoD(p->dq, p->hq, p->nq * 2);
    api->cuMemcpyHtoD(p->dk, p->hk, p->nk * 2);
    api->cuMemcpyHtoD(p->dv, p->hv, p->nk * 2);
    stof__ctx_pop(ctx);
}

static void problem_free(problem *p, stof_context *ctx)
{
    const stof_api *api = stof__api();
    stof__ctx_push(ctx);
    api->cuMemFree(p->dq);
    api->cuMemFree(p->dk);
    api->cuMemFree(p->dv);
    api->cuMemFree(p->dout);
    api->cuMemFree(p->ddata);
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

/* Host instance data and its device copy in p->ddata. */
typedef struct inst {
    int32_t q_len[MAXB], k_len[MAXB], q_offset[MAXB], prefix[MAXB];
    uint64_t seed[MAXB];
    int32_t hw[8]; /* head_window per head */
    int32_t *doc;
    uint32_t *bm; /* batch bitmaps of seq_q rows x ceil(seq_k / 32) words */
    stof_mask_data host, dev;
} inst;

static void inst_random(inst *in, const problem *p, tu_rng *r)
{
    memset(&in->host, 0, sizeof(in->host));
    memset(&in->dev, 0, sizeof(in->dev));
    in->doc = malloc(sizeof(int32_t) * (size_t)p->batch * (size_t)p->seq_k);
    for (int b = 0; b < p->batch; b++) {
        int kind = (int)tu_below(r, 5);
        in->q_len[b] = kind == 0 ? 0 : (kind == 1 ? p->seq_q : 1 + (int)tu_below(r, (uint64_t)p->seq_q));
        in->k_len[b] = kind == 2 ? 0 : (kind == 1 ? p->seq_k : 1 + (int)tu_below(r, (uint64_t)p->seq_k));
        in->q_offset[b] = tu_below(r, 2) && in->k_len[b] > in->q_len[b]
                              ? in->k_len[b] - in->q_len[b]
                              : (int)tu_below(r, 20);
        in->prefix[b] = (int)tu_below(r, (uint64_t)p->seq_k + 1);
        int d = 0, left = 1 + (int)tu_below(r, 120);
        for (int k = 0; k < p->seq_k; k++) {
            if (--left == 0) {
                d++;
                left = 1 + (int)tu_below(r, 120);
            }
            in->doc[(size_t)b * (size_t)p->seq_k + (size_t)k] = d;
        }
    }
    in->host.q_len = in->q_len;
    in->host.k_len = in->k_len;
    in->host.q_offset = in->q_offset;
    in->host.prefix = in->prefix;
    in->host.doc_id = in->doc;
    /* Per-sequence seeds (bigbird draws) and bitmaps (a band of random
     * width and density, so tiles of every class occur). */
    const int w = (p->seq_k + 31) / 32;
    in->bm = SMALL(p->seq_q, p->seq_k)
                 ? calloc((size_t)p->batch * p->seq_q * w, sizeof(uint32_t))
                 : NULL;
    for (int b = 0; b < p->batch; b++) {
        in->seed[b] = tu_below(r, 4) ? tu_next(r) : 0;
        if (!in->bm)
            continue;
        const int band = 1 + (int)tu_below(r, 200);
        for (int q = 0; q < p->seq_q; q++)
            for (int k = 0; k < p->seq_k; k++)
                if ((q - k < band && k - q < band) ? tu_below(r, 8) != 0
                                                   : tu_below(r, 50) == 0)
                    in->bm[((size_t)b * p->seq_q + q) * w + k / 32] |=
                        1u << (k % 32);
    }
    for (int h = 0; h < 8; h++)
        in->hw[h] = (int32_t)tu_below(r, 3) == 0 ? (int32_t)tu_below(r, 4)
                                                : 1 + (int32_t)tu_below(r, 300);
    in->host.head_window = in->hw;
    in->host.seed = in->seed;
    in->host.bitmap = in->bm;
    in->host.bitmap_stride = in->bm ? (int64_t)p->seq_q * w : 0;
}

static void inst_free(inst *in)
{
    free(in->doc);
    free(in->bm);
    in->doc = NULL;
    in->bm = NULL;
}

static void inst_upload(inst *in, const problem *p, stof_context *ctx)
{
    const stof_api *api = stof__api();
    stof__ctx_push(ctx);
    CUdeviceptr base = p->ddata;
    api->cuMemcpyHtoD(base, in->q_len, sizeof(in->q_len));
    api->cuMemcpyHtoD(base + 256, in->k_len, sizeof(in->k_len));
    api->cuMemcpyHtoD(base + 512, in->q_offset, sizeof(in->q_offset));
    api->cuMemcpyHtoD(base + 768, in->prefix, sizeof(in->prefix));
    api->cuMemcpyHtoD(base + 1024, in->seed, sizeof(in->seed));
    const size_t docs = sizeof(int32_t) * (size_t)p->batch * (size_t)p->seq_k;
    api->cuMemcpyHtoD(base + 1280, in->hw, sizeof(in->hw));
    api->cuMemcpyHtoD(base + 1536, in->doc, docs);
    const CUdeviceptr bm = base + 1536 + (docs + 255) / 256 * 256;
    const size_t w = (size_t)((p->seq_k + 31) / 32);
    if (in->bm)
        api->cuMemcpyHtoD(bm, in->bm,
                          sizeof(uint32_t) * (size_t)p->batch * p->seq_q * w);
    stof__ctx_pop(ctx);
    in->dev.seed = (const uint64_t *)(uintptr_t)(base + 1024);
    in->dev.bitmap = in->bm ? (const uint32_t *)(uintptr_t)bm : NULL;
    in->dev.bitmap_stride = in->host.bitmap_stride;
    in->dev.q_len = (const int32_t *)(uintptr_t)base;
    in->dev.k_len = (const int32_t *)(uintptr_t)(base + 256);
    in->dev.q_offset = (const int32_t *)(uintptr_t)(base + 512);
    in->dev.prefix = (const int32_t *)(uintptr_t)(base + 768);
    in->dev.doc_id = (const int32_t *)(uintptr_t)(base + 1536);
    in->dev.head_window = (const int32_t *)(uintptr_t)(base + 1280);
}

/* Instance data of lengths and offsets only (and, with_windows, the head
 * windows in in->hw): the host view set from in's arrays, uploaded, the
 * device view's other fields unset (their defaults). */
static void inst_upload_lengths(inst *in, const problem *p, stof_context *ctx,
                                int with_windows)
{
    in->host.q_len = in->q_len;
    in->host.k_len = in->k_len;
    in->host.q_offset = in->q_offset;
    in->host.head_window = with_windows ? in->hw : NULL;
    inst_upload(in, p, ctx);
    in->dev.seed = NULL;
    in->dev.bitmap = NULL;
    in->dev.prefix = NULL;
    in->dev.doc_id = NULL;
    if (!with_windows)
        in->dev.head_window = NULL;
}

/* Poison the output (NaN bits). */
static void poison(problem *p, stof_context *ctx)
{
    stof__ctx_push(ctx);
    stof__api()->cuMemsetD8(p->dout, 0xff, p->nq * 2);
    stof__ctx_pop(ctx);
}

/* Poison the output and run the plan on p's tensors with in's instance
 * data (the run must be accepted). */
static void run_poisoned(problem *p, stof_context *ctx, stof_plan *plan,
                         const inst *in)
{
    poison(p, ctx);
    cr_assert_eq(stof_attention_run_family(plan, &in->dev,
                                           (void *)(uintptr_t)p->dq,
                                           (void *)(uintptr_t)p->dk,
                                           (void *)(uintptr_t)p->dv,
                                           (void *)(uintptr_t)p->dout, NULL),
                 STOF_OK, "%s", stof_plan_errmsg(plan));
}

/* Download the output and check every sequence against the reference with
 * that sequence's mask. Returns the worst relative error. */
static double check(problem *p, stof_context *ctx,
                    const stof_mask_family *fam, const inst *in)
{
    const stof_api *api = stof__api();
    stof__ctx_push(ctx);
    cr_assert_eq(api->cuCtxSynchronize(), CUDA_SUCCESS);
    api->cuMemcpyDtoH(p->ho, p->dout, p->nq * 2);
    stof__ctx_pop(ctx);
    double worst = 0.0;
    const size_t per_q = (size_t)p->heads * p->seq_q * p->head_dim;
    const size_t per_k = (size_t)p->heads * p->seq_k * p->head_dim;
    double *got = malloc(per_q * sizeof(double));
    double *want = malloc(per_q * sizeof(double));
    /* A window per head: each head has its own mask. */
    const int per_head = strstr(stof_mask_family_spec(fam), "head_") != NULL;
    const size_t hq = (size_t)p->seq_q * p->head_dim;
    const size_t hk = (size_t)p->seq_k * p->head_dim;
    for (int b = 0; b < p->batch; b++) {
        stof_mask *m = NULL;
        for (int h = 0; h < (per_head ? p->heads : 1); h++) {
            stof_mask_data hd = in->host;
            hd.head = h;
            stof_mask_free(&m);
            cr_assert_eq(stof_mask_family_eval(ctx, fam, p->seq_q, p->seq_k,
                                               &hd, b, &m),
                         STOF_OK, "%s", stof_errmsg(ctx));
            const int nh = per_head ? 1 : p->heads;
            stof_attention_desc d1;
            stof_attention_desc_init(&d1, 1, nh, p->seq_q, p->seq_k,
                                     p->head_dim, p->dt, STOF_LAYOUT_BHSD);
            const size_t oq = b * per_q + (size_t)h * hq;
            const size_t ok = b * per_k + (size_t)h * hk;
            cr_assert_eq(stof__ref_attention(&d1, m, p->fq + oq, p->fk + ok,
                                             p->fv + ok, p->fo + oq),
                         STOF_OK);
        }
        int bad_zero = 0;
        for (size_t i = 0; i < per_q; i++) {
            const uint16_t h = p->ho[b * per_q + i];
            got[i] = p->dt == STOF_DTYPE_FP16 ? tu_f16_to_f32(h)
                                               : tu_bf16_to_f32(h);
            want[i] = p->fo[b * per_q + i];
            if (want[i] == 0.0 && got[i] != 0.0 && !per_head) {
                /* Rows with no allowed key must be exactly 0. */
                const int row = (int)((i / (size_t)p->head_dim) %
                                      (size_t)p->seq_q);
                int empty = 1;
                for (int kk = 0; kk < p->seq_k && empty; kk++)
                    empty = !stof_mask_get(m, row, kk);
                bad_zero += empty;
            }
        }
        double e = tu_rel_err(got, want, per_q);
        cr_assert_eq(bad_zero, 0, "%s b=%d: %d outputs of empty rows not 0",
                     stof_mask_family_spec(fam), b, bad_zero);
        cr_assert(e < (p->dt == STOF_DTYPE_FP16 ? 2e-3 : 1.6e-2),
                  "%s b=%d (%d x %d, off %d, prefix %d): rel err %g",
                  stof_mask_family_spec(fam), b, in->q_len[b], in->k_len[b],
                  in->q_offset[b], in->prefix[b], e);
        worst = e > worst ? e : worst;
        stof_mask_free(&m);
    }
    free(got);
    free(want);
    return worst;
}

static const char *specs[] = {
    "causal&docs", "dense", "causal", "(causal|prefix)&docs",
    "sliding:40&!prefix:3", "!causal", "docs", "causal&bitmap",
    "bitmap|prefix", "bigbird:32:2:1:2:7", "head_sliding&docs",
    "head_causal_sliding|prefix:5",
};

Test(gpu_family_attn, instances_match_the_reference)
{
    stof_settings s;
    stof_default_settings(&s);
    s.tuning_mode = STOF_TUNE_CACHE_ONLY; /* the cost model's choice */
    s.user_db = db_path();
    stof_context *ctx = tu_open_gpu_or_skip(&s);
    tu_rng r = {tu_seed()};
    static const int dims[][3] = {{300, 300, 64}, {129, 517, 128},
                                  {520, 77, 64}};
    for (size_t si = 0; si < sizeof(specs) / sizeof(specs[0]); si++) {
        for (int z = 0; z < 3; z++) {
            const stof_dtype dt = (si + (size_t)z) % 2 ? STOF_DTYPE_BF16
                                                       : STOF_DTYPE_FP16;
            problem p;
            problem_new(&p, ctx, &r, 3, 2, dims[z][0], dims[z][1], dims[z][2],
                        dt);
            stof_mask_family *fam = NULL;
            cr_assert_eq(stof_mask_family_create(ctx, specs[si], &fam),
                         STOF_OK);
            inst in;
            inst_random(&in, &p, &r);
            stof_plan *plan = NULL;
            cr_assert_eq(stof_attention_plan_family(ctx, &p.d, fam, &in.host,
                                                    &plan),
                         STOF_OK, "%s", stof_errmsg(ctx));
            const long compiles = stof__jit_compile_count();
            for (int it = 0; it < 3; it++) {
                if (it) {
                    inst_free(&in);
                    inst_random(&in, &p, &r);
                }
                inst_upload(&in, &p, ctx);
                run_poisoned(&p, ctx, plan, &in);
                check(&p, ctx, fam, &in);
            }
            cr_assert_eq(stof__jit_compile_count(), compiles,
                         "a run compiled something");
            stof_plan_free(&plan);
            inst_free(&in);
            stof_mask_family_free(&fam);
            problem_free(&p, ctx);
        }
    }
    stof_close(&ctx);
}

/* Split-KV plans (attn_split.h) over families: short queries against long
 * keys, each row block's tiles split over several CTAs, instance after
 * instance (lengths, offsets, documents, bitmaps, a window per head). */
Test(gpu_family_attn, split_kv_plans_match_the_reference)
{
    stof_context *ctx = tu_open_gpu_or_skip(NULL);
    tu_rng r = {tu_seed() ^ 0x5b1e};
    static const char *fspecs[] = {"causal", "sliding:300&docs", "dense",
                                   "bitmap|prefix",
                                   "head_causal_sliding|prefix:5"};
    static const int dims[][3] = {{1, 3000, 64}, {9, 2100, 128}};
    int ran = 0;
    for (size_t si = 0; si < sizeof(fspecs) / sizeof(fspecs[0]); si++) {
        for (int z = 0; z < 2; z++) {
            const stof_dtype dt = (si + (size_t)z) % 2 ? STOF_DTYPE_BF16
                                                       : STOF_DTYPE_FP16;
            problem p;
            problem_new(&p, ctx, &r, 3, 2, dims[z][0], dims[z][1],
                        dims[z][2], dt);
            stof_mask_family *fam = NULL;
            cr_assert_eq(stof_mask_family_create(ctx, fspecs[si], &fam),
                         STOF_OK);
            /* The mma.sync block kernel split 4 ways; on sm_90a, the
             * 64-row wgmma kernel split 7 ways. */
            stof_candidate cs[2] = {
                {.kind = STOF_KERNEL_BLOCK,
                 .cfg = {64, 64, 4, 2, 0, 1, 0},
                 .splits = 4},
                {.kind = STOF_KERNEL_WGMMA,
                 .cfg = {64, 128, 8, 2, 0, 1, 0},
                 .wcfg = {128, 2, 1, 0, 64, 1, 0},
                 .splits = 7},
            };
            const int nc = stof__wgmma_device_ok(&ctx->device) ? 2 : 1;
            for (int ci = 0; ci < nc; ci++) {
                void *cubin = NULL;
                size_t size = 0;
                cr_assert_eq(stof__kernel_compile(ctx, &cs[ci], p.head_dim,
                                                  dt, &cubin, &size),
                             STOF_OK, "%s", stof_errmsg(ctx));
                stof_plan *plan = NULL;
                cr_assert_eq(stof__family_plan_from_cubin(ctx, &p.d, fam,
                                                          &cs[ci], cubin, size,
                                                          0, &plan),
                             STOF_OK, "%s", stof_errmsg(ctx));
                free(cubin);
                for (int it = 0; it < 2; it++) {
                    inst in;
                    inst_random(&in, &p, &r);
                    inst_upload(&in, &p, ctx);
                    run_poisoned(&p, ctx, plan, &in);
                    const double e = check(&p, ctx, fam, &in);
                    cr_log_info("%s %dx%d kind %d split %d: rel err %.2e",
                                fspecs[si], p.seq_q, p.seq_k, cs[ci].kind,
                                cs[ci].splits, e);
                    inst_free(&in);
                    ran++;
                }
                stof_plan_free(&plan);
            }
            stof_mask_family_free(&fam);
            problem_free(&p, ctx);
        }
    }
    cr_assert_geq(ran, 20);
    stof_close(&ctx);
}

/* Keys past a sequence's k_len are padding whose memory may hold anything
 * (a KV cache's unwritten slots, from torch.empty): NaN in V and Inf in K
 * there must not reach O (P is 0 there, but 0 x NaN is NaN in P V). The
 * block and wgmma kinds, split or not, against the reference. */
Test(gpu_family_attn, padding_keys_holding_nan_stay_out_of_the_output)
{
    stof_context *ctx = tu_open_gpu_or_skip(NULL);
    tu_rng r = {tu_seed() ^ 0x9a2d};
    static const char *fspecs[] = {"causal", "dense"};
    static const int dims[][3] = {{200, 520, 64}, {70, 700, 128}};
    const int sm90 = stof__wgmma_device_ok(&ctx->device);
    /* (the family reference kernel reads allowed keys only) */
    const stof_candidate cs[] = {
        {.kind = STOF_KERNEL_BLOCK, .cfg = {64, 64, 4, 2, 0, 0, 0}},
        {.kind = STOF_KERNEL_BLOCK, .cfg = {64, 64, 4, 2, 0, 1, 0},
         .splits = 4},
        {.kind = STOF_KERNEL_WGMMA,
         .cfg = {128, 128, 8, 2, 0, 0, 0},
         .wcfg = {128, 2, 1, 0, 128, 0, 0}},
        {.kind = STOF_KERNEL_WGMMA,
         .cfg = {128, 64, 8, 2, 0, 0, 0},
         .wcfg = {64, 2, 0, 0, 128, 0, 0}},
        {.kind = STOF_KERNEL_WGMMA,
         .cfg = {64, 128, 8, 2, 0, 1, 0},
         .wcfg = {128, 2, 1, 0, 64, 1, 0},
         .splits = 7},
    };
    const int nc = sm90 ? 5 : 2;
    int ran = 0;
    for (size_t si = 0; si < 2; si++)
        for (int z = 0; z < 2; z++) {
            const stof_dtype dt = z ? STOF_DTYPE_BF16 : STOF_DTYPE_FP16;
            problem p;
            problem_new(&p, ctx, &r, 3, 2, dims[z][0], dims[z][1], dims[z][2],
                        dt);
            stof_mask_family *fam = NULL;
            cr_assert_eq(stof_mask_family_create(ctx, fspecs[si], &fam),
                         STOF_OK);
            inst in;
            memset(&in, 0, sizeof(in));
            in.doc = calloc((size_t)p.batch * p.seq_k, sizeof(int32_t));
            for (int b = 0; b < p.batch; b++) {
                /* never a multiple of a tile: a tile straddles it */
                in.k_len[b] = 1 + (int)tu_below(&r, (uint64_t)p.seq_k - 2);
                if (in.k_len[b] % 64 == 0)
                    in.k_len[b]--;
                in.q_len[b] = p.seq_q;
                in.q_offset[b] = in.k_len[b] > p.seq_q ? in.k_len[b] - p.seq_q
                                                       : 0;
            }
            inst_upload_lengths(&in, &p, ctx, 0);
            /* The padding keys of every head: V NaN, K +Inf. */
            {
                const stof_api *api = stof__api();
                const uint16_t vnan = dt == STOF_DTYPE_FP16 ? 0x7e00u : 0x7fc0u;
                const uint16_t kinf = dt == STOF_DTYPE_FP16 ? 0x7c00u : 0x7f80u;
                uint16_t *hk = malloc(p.nk * 2), *hv = malloc(p.nk * 2);
                memcpy(hk, p.hk, p.nk * 2);
                memcpy(hv, p.hv, p.nk * 2);
                for (int b = 0; b < p.batch; b++)
                    for (int h = 0; h < p.heads; h++) {
                        const size_t row0 =
                            ((size_t)(b * p.heads + h) * p.seq_k +
                             (size_t)in.k_len[b]) *
                            (size_t)p.head_dim;
                        const size_t n = (size_t)(p.seq_k - in.k_len[b]) *
                                         (size_t)p.head_dim;
                        for (size_t i = 0; i < n; i++) {
                            hv[row0 + i] = vnan;
                            hk[row0 + i] = kinf;
                        }
                    }
                stof__ctx_push(ctx);
                api->cuMemcpyHtoD(p.dk, hk, p.nk * 2);
                api->cuMemcpyHtoD(p.dv, hv, p.nk * 2);
                stof__ctx_pop(ctx);
                free(hk);
                free(hv);
            }
            for (int ci = 0; ci < nc; ci++) {
                void *cubin = NULL;
                size_t size = 0;
                cr_assert_eq(stof__kernel_cubin(ctx, &cs[ci], p.head_dim, dt,
                                                &cubin, &size),
                             STOF_OK, "%s", stof_errmsg(ctx));
                stof_plan *plan = NULL;
                cr_assert_eq(stof__family_plan_from_cubin(ctx, &p.d, fam,
                                                          &cs[ci], cubin, size,
                                                          0, &plan),
                             STOF_OK, "kind %d: %s", cs[ci].kind,
                             stof_errmsg(ctx));
                free(cubin);
                run_poisoned(&p, ctx, plan, &in);
                const double e = check(&p, ctx, fam, &in);
                cr_log_info("%s %dx%d d %d kind %d split %d, NaN padding: "
                            "rel err %.2e",
                            fspecs[si], p.seq_q, p.seq_k, p.head_dim,
                            cs[ci].kind, cs[ci].splits, e);
                stof_plan_free(&plan);
                ran++;
            }
            inst_free(&in);
            stof_mask_family_free(&fam);
            problem_free(&p, ctx);
        }
    cr_assert_geq(ran, 8);
    stof_close(&ctx);
}

/* A window per head as wide as an int (INT32_MAX: "no limit") with the
 * queries 2^30 positions after the keys: every key is within it, on the
 * GPU's builder as on the host (the GPU clamped windows at 2^30, which
 * masked keys 2^30 or more behind). */
Test(gpu_family_attn, the_widest_head_windows_match_the_host)
{
    stof_settings s;
    stof_default_settings(&s);
    s.tuning_mode = STOF_TUNE_CACHE_ONLY; /* the cost model's choice */
    s.user_db = db_path();
    stof_context *ctx = tu_open_gpu_or_skip(&s);
    tu_rng r = {tu_seed() ^ 0x3c1d};
    problem p;
    problem_new(&p, ctx, &r, 2, 2, 130, 300, 64, STOF_DTYPE_FP16);
    stof_mask_family *fam = NULL;
    cr_assert_eq(stof_mask_family_create(ctx, "head_sliding", &fam), STOF_OK);
    inst in;
    memset(&in, 0, sizeof(in));
    in.doc = calloc((size_t)p.batch * p.seq_k, sizeof(int32_t));
    for (int b = 0; b < p.batch; b++) {
        in.q_len[b] = p.seq_q;
        in.k_len[b] = p.seq_k;
        in.q_offset[b] = 1 << 30;
    }
    in.hw[0] = INT32_MAX;
    in.hw[1] = (1 << 30) + 100; /* keys 0 .. ~ 99 + row of each query */
    inst_upload_lengths(&in, &p, ctx, 1);
    stof_plan *plan = NULL;
    cr_assert_eq(stof_attention_plan_family(ctx, &p.d, fam, &in.host, &plan),
                 STOF_OK, "%s", stof_errmsg(ctx));
    run_poisoned(&p, ctx, plan, &in);
    const double e = check(&p, ctx, fam, &in);
    cr_log_info("head windows INT32_MAX and 2^30 + 100, q_offset 2^30: rel "
                "err %.2e",
                e);
    stof_plan_free(&plan);
    inst_free(&in);
    stof_mask_family_free(&fam);
    problem_free(&p, ctx);
    stof_close(&ctx);
}

Test(gpu_family_attn, graph_replay_with_new_instance_data)
{
    stof_settings s;
    stof_default_settings(&s);
    s.tuning_mode = STOF_TUNE_CACHE_ONLY;
    s.user_db = db_path();
    stof_context *ctx = tu_open_gpu_or_skip(&s);
    tu_rng r = {tu_seed() ^ 0x3c};
    problem p;
    problem_new(&p, ctx, &r, 4, 2, 512, 512, 64, STOF_DTYPE_FP16);
    stof_mask_family *fam = NULL;
    cr_assert_eq(stof_mask_family_create(ctx, "causal&docs", &fam), STOF_OK);
    inst in;
    inst_random(&in, &p, &r);
    stof_plan *plan = NULL;
    cr_assert_eq(stof_attention_plan_family(ctx, &p.d, fam, NULL, &plan),
                 STOF_OK, "%s", stof_errmsg(ctx));
    inst_upload(&in, &p, ctx);
    const stof_api *api = stof__api();
    stof__ctx_push(ctx);
    CUstream st;
    cr_assert_eq(api->cuStreamCreate(&st, 1), CUDA_SUCCESS);
    cr_assert_eq(api->cuStreamBeginCapture(st, CU_STREAM_CAPTURE_MODE_GLOBAL),
                 CUDA_SUCCESS);
    stof_status rs = stof_attention_run_family(
        plan, &in.dev, (void *)(uintptr_t)p.dq, (void *)(uintptr_t)p.dk,
        (void *)(uintptr_t)p.dv, (void *)(uintptr_t)p.dout, st);
    CUgraph g = NULL;
    cr_assert_eq(api->cuStreamEndCapture(st, &g), CUDA_SUCCESS);
    cr_assert_eq(rs, STOF_OK, "%s", stof_plan_errmsg(plan));
    CUgraphExec ge = NULL;
    cr_assert_eq(api->cuGraphInstantiate(&ge, g, 0), CUDA_SUCCESS);
    stof__ctx_pop(ctx);
    for (int it = 0; it < 3; it++) {
        if (it) {
            inst_free(&in);
            inst_random(&in, &p, &r);
            inst_upload(&in, &p, ctx); /* same device buffers */
        }
        poison(&p, ctx);
        stof__ctx_push(ctx);
        cr_assert_eq(api->cuGraphLaunch(ge, st), CUDA_SUCCESS);
        cr_assert_eq(api->cuStreamSynchronize(st), CUDA_SUCCESS);
        stof__ctx_pop(ctx);
        check(&p, ctx, fam, &in);
    }
    stof__ctx_push(ctx);
    api->cuGraphExecDestroy(ge);
    api->cuGraphDestroy(g);
    api->cuStreamDestroy(st);
    stof__ctx_pop(ctx);
    stof_plan_free(&plan);
    inst_free(&in);
    stof_mask_family_free(&fam);
    problem_free(&p, ctx);
    stof_close(&ctx);
}

/* The nodes of family runs captured on stream st into one graph (md2
 * NULL: one run; flags: their stof_run_args.flags): the format builder's,
 * where it ran, and the kernels'. */
static size_t captured_runs(stof_plan *plan, const problem *p,
                            const stof_mask_data *md, uint32_t flags,
                            const stof_mask_data *md2, uint32_t flags2,
                            CUstream st)
{
    const stof_api *api = stof__api();
    stof_run_args a;
    memset(&a, 0, sizeof(a));
    a.q = (const void *)(uintptr_t)p->dq;
    a.k = (const void *)(uintptr_t)p->dk;
    a.v = (const void *)(uintptr_t)p->dv;
    a.o = (void *)(uintptr_t)p->dout;
    a.data = md;
    a.flags = flags;
    cr_assert_eq(api->cuStreamBeginCapture(st, CU_STREAM_CAPTURE_MODE_GLOBAL),
                 CUDA_SUCCESS);
    stof_status rs = stof_attention_run_ex(plan, &a, st);
    if (rs == STOF_OK && md2) {
        a.data = md2;
        a.flags = flags2;
        rs = stof_attention_run_ex(plan, &a, st);
    }
    CUgraph g = NULL;
    cr_assert_eq(api->cuStreamEndCapture(st, &g), CUDA_SUCCESS);
    cr_assert_eq(rs, STOF_OK, "%s", stof_plan_errmsg(plan));
    size_t n = 0;
    cr_assert_eq(api->cuGraphGetNodes(g, NULL, &n), CUDA_SUCCESS);
    api->cuGraphDestroy(g);
    return n;
}

Test(gpu_family_attn, same_data_reuses_the_format)
{
    /* STOF_RUN_SAME_DATA: a run whose instance data are the previous run's
     * (the same device arrays) uses that run's format; the first run, and
     * a run whose arrays differ, build it anyway; outputs match the
     * reference each time. */
    stof_settings s;
    stof_default_settings(&s);
    s.tuning_mode = STOF_TUNE_CACHE_ONLY;
    s.user_db = db_path();
    stof_context *ctx = tu_open_gpu_or_skip(&s);
    tu_rng r = {tu_seed() ^ 0x5d};
    problem p, p2;
    problem_new(&p, ctx, &r, 3, 2, 300, 300, 64, STOF_DTYPE_FP16);
    problem_new(&p2, ctx, &r, 3, 1, 300, 300, 64, STOF_DTYPE_FP16);
    stof_mask_family *fam = NULL;
    cr_assert_eq(stof_mask_family_create(ctx, "causal&docs&!prefix", &fam),
                 STOF_OK);
    inst a, b;
    inst_random(&a, &p, &r);
    inst_random(&b, &p, &r);
    stof_plan *plan = NULL;
    cr_assert_eq(stof_attention_plan_family(ctx, &p.d, fam, NULL, &plan),
                 STOF_OK, "%s", stof_errmsg(ctx));
    inst_upload(&a, &p, ctx);
    /* b's arrays at other addresses (p2's data buffer; same batch). */
    inst_upload(&b, &p2, ctx);
    stof_run_args ra;
    memset(&ra, 0, sizeof(ra));
    ra.q = (const void *)(uintptr_t)p.dq;
    ra.k = (const void *)(uintptr_t)p.dk;
    ra.v = (const void *)(uintptr_t)p.dv;
    ra.o = (void *)(uintptr_t)p.dout;
    ra.flags = STOF_RUN_SAME_DATA;
    const stof_mask_data *order[] = {&a.dev, &a.dev, &b.dev, &b.dev, &a.dev};
    const inst *want[] = {&a, &a, &b, &b, &a};
    for (int i = 0; i < 5; i++) {
        /* The first run has no format to reuse; runs 2 and 4 reuse. */
        ra.data = order[i];
        poison(&p, ctx);
        cr_assert_eq(stof_attention_run_ex(plan, &ra, NULL), STOF_OK, "%s",
                     stof_plan_errmsg(plan));
        check(&p, ctx, fam, want[i]);
    }
    /* Captured: within one capture, a reusing run is the kernels alone,
     * a building run has the builder's nodes too; a run of another capture
     * never reuses a build captured elsewhere (that graph's builder runs
     * only when that graph does). */
    const stof_api *api = stof__api();
    stof__ctx_push(ctx);
    CUstream st;
    cr_assert_eq(api->cuStreamCreate(&st, 1), CUDA_SUCCESS);
    const size_t built = captured_runs(plan, &p, &b.dev, 0, NULL, 0, st);
    const size_t pair = captured_runs(plan, &p, &b.dev, 0, &b.dev,
                                      STOF_RUN_SAME_DATA, st);
    const size_t pair_other = captured_runs(plan, &p, &b.dev, 0, &a.dev,
                                            STOF_RUN_SAME_DATA, st);
    const size_t next = captured_runs(plan, &p, &b.dev, STOF_RUN_SAME_DATA,
                                      NULL, 0, st);
    /* A captured build of b (never run: the graph is dropped) while the
     * workspace holds a's format from the last eager run: an eager run of
     * b asking to reuse must build, not take a's format. */
    const size_t again = captured_runs(plan, &p, &b.dev, 0, NULL, 0, st);
    api->cuStreamDestroy(st);
    stof__ctx_pop(ctx);
    cr_log_info("captured nodes: one run %zu, two runs reusing %zu, two "
                "runs of other data %zu, a reuse asked in a new capture %zu",
                built, pair, pair_other, next);
    cr_assert_lt(pair, 2 * built);
    cr_assert_eq(pair_other, 2 * built);
    cr_assert_eq(next, built);
    cr_assert_eq(again, built);
    ra.flags = STOF_RUN_SAME_DATA;
    ra.data = &b.dev;
    poison(&p, ctx);
    cr_assert_eq(stof_attention_run_ex(plan, &ra, NULL), STOF_OK, "%s",
                 stof_plan_errmsg(plan));
    check(&p, ctx, fam, &b);
    /* The flag is for family plans; unknown bits are refused. */
    ra.flags = 0x80u;
    cr_assert_eq(stof_attention_run_ex(plan, &ra, NULL),
                 STOF_ERR_INVALID_ARGUMENT);
    cr_assert(strstr(stof_plan_errmsg(plan), "unknown bits"), "%s",
              stof_plan_errmsg(plan));
    stof_plan_free(&plan);
    inst_free(&a);
    inst_free(&b);
    stof_mask_family_free(&fam);
    problem_free(&p2, ctx);
    problem_free(&p, ctx);
    stof_close(&ctx);
}

/* In a child: plan the family over seq x seq, report the source, the
 * compiles and the key text. */
static void plan_child(const char *spec, int seq, int *fd)
{
    stof_settings s;
    stof_default_settings(&s);
    s.user_db = db_path();
    stof_context *ctx = NULL;
    char msg[1024] = "";
    if (stof_open(&ctx, &s) == STOF_OK) {
        stof_attention_desc d;
        stof_attention_desc_init(&d, 2, 4, seq, seq, 64, STOF_DTYPE_FP16,
                                 STOF_LAYOUT_BHSD);
        stof_mask_family *fam = NULL;
        stof_plan *plan = NULL;
        stof_mask_family_create(ctx, spec, &fam);
        const long c0 = stof__jit_compile_count();
        if (stof_attention_plan_family(ctx, &d, fam, NULL, &plan) == STOF_OK) {
            char js[8192];
            stof_plan_describe(plan, js, sizeof(js), NULL);
            const char *src = strstr(js, "\"source\"");
            const char *kt = strstr(js, "\"key_text\"");
            snprintf(msg, sizeof(msg), "compiles=%ld %.40s %.200s",
                     stof__jit_compile_count() - c0, src ? src : "?",
                     kt ? kt : "?");
        } else {
            snprintf(msg, sizeof(msg), "error %s", stof_errmsg(ctx));
        }
        stof_plan_free(&plan);
        stof_mask_family_free(&fam);
    }
    stof_close(&ctx);
    if (write(fd[1], msg, strlen(msg) + 1) < 0)
        _exit(2);
    _exit(0);
}

/* Run child(arg, fd) in a forked process (which writes its report to
 * fd[1] and exits 0), and read the report into out. */
static void in_child(void (*child)(const void *arg, int *fd), const void *arg,
                     char *out, size_t n)
{
    int fd[2];
    cr_assert_eq(pipe(fd), 0);
    pid_t pid = fork();
    cr_assert(pid >= 0);
    if (pid == 0)
        child(arg, fd);
    close(fd[1]);
    ssize_t r = read(fd[0], out, n - 1);
    out[r > 0 ? r : 0] = '\0';
    close(fd[0]);
    int status = 0;
    waitpid(pid, &status, 0);
    cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0);
}

typedef struct plan_arg {
    const char *spec;
    int seq;
} plan_arg;

static void plan_child_of(const void *arg, int *fd)
{
    const plan_arg *a = arg;
    plan_child(a->spec, a->seq, fd);
}

static void plan_in_child(const char *spec, int seq, char *out, size_t n)
{
    const plan_arg a = {spec, seq};
    in_child(plan_child_of, &a, out, n);
}

Test(gpu_family_attn, nearby_lengths_share_a_record)
{
    /* Children do the planning (CUDA is never initialised in this process,
     * which forks them; the suite's main skips without a GPU). */
    remove_db();
    char a[2048], b[2048], c[2048];
    plan_in_child("causal", 1000, a, sizeof(a)); /* tunes */
    plan_in_child("causal", 1024, b, sizeof(b)); /* the same bucket */
    plan_in_child("causal", 1400, c, sizeof(c)); /* another bucket */
    cr_log_info("1000: %s\n1024: %s\n1400: %s", a, b, c);
    cr_assert(strstr(a, "\"tuned\""), "%s", a);
    cr_assert(strstr(b, "\"user db\""), "%s", b);
    /* Nothing compiled: the kernel comes from the record, the format
     * builder's cubin from the database too. */
    cr_assert(strstr(b, "compiles=0 "), "%s", b);
    cr_assert(strstr(b, "seq_q=1024"), "%s", b);
    cr_assert(strstr(c, "\"tuned\""), "%s", c);
    cr_assert(strstr(c, "seq_q=1536"), "%s", c);
}

/* In a child, cache-only: plan a packed family and a padded one with a
 * bitmap, both with a sample instance; report their sources. */
static void miss_child(const void *arg, int *fd)
{
    (void)arg;
    stof_settings s;
    stof_default_settings(&s);
    s.user_db = db_path();
    s.tuning_mode = STOF_TUNE_CACHE_ONLY;
    stof_context *ctx = NULL;
    char msg[1024] = "open failed";
    if (stof_open(&ctx, &s) == STOF_OK) {
        stof_mask_family *f1 = NULL, *f2 = NULL;
        stof_mask_family_create(ctx, "causal&docs", &f1);
        stof_mask_family_create(ctx, "causal&bitmap", &f2);
        /* Packed: 3 sequences with documents. */
        stof_attention_desc d1;
        stof_attention_desc_init(&d1, 3, 2, 900, 900, 64, STOF_DTYPE_FP16,
                                 STOF_LAYOUT_PACKED);
        static const int32_t cu[4] = {0, 300, 310, 777};
        static int32_t doc[900];
        for (int k = 0; k < 900; k++)
            doc[k] = k / 100;
        stof_mask_data m1;
        memset(&m1, 0, sizeof(m1));
        m1.cu_seqlens_q = cu;
        m1.doc_id = doc;
        /* Padded, with a bitmap per sequence (a band). */
        stof_attention_desc d2;
        stof_attention_desc_init(&d2, 2, 2, 256, 256, 64, STOF_DTYPE_FP16,
                                 STOF_LAYOUT_BHSD);
        static uint32_t bm[2 * 256 * 8];
        for (int b = 0; b < 2; b++)
            for (int q = 0; q < 256; q++)
                for (int k = 0; k < 256; k++)
                    if (q - k < 40 + 30 * b && k - q < 40)
                        bm[(b * 256 + q) * 8 + k / 32] |= 1u << (k % 32);
        stof_mask_data m2;
        memset(&m2, 0, sizeof(m2));
        m2.bitmap = bm;
        m2.bitmap_stride = 256 * 8;
        stof_plan *p1 = NULL, *p2 = NULL;
        char js[8192];
        msg[0] = '\0';
        if (stof_attention_plan_family(ctx, &d1, f1, &m1, &p1) == STOF_OK &&
            stof_attention_plan_family(ctx, &d2, f2, &m2, &p2) == STOF_OK) {
            for (int i = 0; i < 2; i++) {
                stof_plan_describe(i ? p2 : p1, js, sizeof(js), NULL);
                /* The value after "source": */
                const char *src = strstr(js, "\"source\"");
                const char *v = src ? strchr(src + 8, '"') : NULL;
                const char *e = v ? strchr(v + 1, '"') : NULL;
                snprintf(msg + strlen(msg), sizeof(msg) - strlen(msg),
                         "%d:%.*s ", i, e ? (int)(e - v - 1) : 1,
                         e ? v + 1 : "?");
            }
        } else {
            snprintf(msg, sizeof(msg), "error %s", stof_errmsg(ctx));
        }
        stof_plan_free(&p1);
        stof_plan_free(&p2);
        stof_mask_family_free(&f1);
        stof_mask_family_free(&f2);
    }
    stof_close(&ctx);
    if (write(fd[1], msg, strlen(msg) + 1) < 0)
        _exit(2);
    _exit(0);
}

Test(gpu_family_attn, family_misses_are_tuned_by_pending)
{
    /* Cache-only plans of families record their misses with the sample
     * instance; `stof-tune pending` plans them again (tuning) with that
     * instance, so the next cache-only plans hit the database. */
    remove_db();
    const char *tune = getenv("STOF_TUNE");
    if (!tune || !*tune)
        cr_skip_test("STOF_TUNE is not set (run through meson test)");
    char a[1024], b[1024], cmd[1024];
    in_child(miss_child, NULL, a, sizeof(a));
    cr_assert(strstr(a, "0:fallback ") && strstr(a, "1:fallback "), "%s", a);
    snprintf(cmd, sizeof(cmd), "'%s' pending --db '%s' > /dev/null 2>&1",
             tune, db_path());
    const int rc = system(cmd);
    cr_assert(rc == 0, "%s: exit %d", cmd, rc);
    in_child(miss_child, NULL, b, sizeof(b));
    cr_log_info("before pending: %s\nafter: %s", a, b);
    cr_assert(strstr(b, "0:user db ") && strstr(b, "1:user db "), "%s", b);
}

/* In a child, cache-only: plan two families whose canonical specs share
 * their first 560 characters and differ after; report both plans' keys. */
static void long_spec_child(const void *arg, int *fd)
{
    (void)arg;
    stof_settings s;
    stof_default_settings(&s);
    s.user_db = "";
    s.tuning_mode = STOF_TUNE_CACHE_ONLY;
    stof_context *ctx = NULL;
    char msg[256] = "open failed";
    if (stof_open(&ctx, &s) == STOF_OK) {
        char spec[2][1024];
        for (int i = 0; i < 2; i++) {
            size_t o = 0;
            for (int j = 0; j < 28; j++) /* 20 characters each */
                o += (size_t)snprintf(spec[i] + o, sizeof(spec[i]) - o,
                                      "causal_sliding:%04d|", 1000 + j);
            snprintf(spec[i] + o, sizeof(spec[i]) - o, "sliding:%d",
                     i ? 7 : 9);
        }
        stof_attention_desc d;
        stof_attention_desc_init(&d, 1, 2, 256, 256, 64, STOF_DTYPE_FP16,
                                 STOF_LAYOUT_BHSD);
        snprintf(msg, sizeof(msg), "planned:");
        for (int i = 0; i < 2; i++) {
            stof_mask_family *f = NULL;
            stof_plan *p = NULL;
            char js[8192];
            if (stof_mask_family_create(ctx, spec[i], &f) != STOF_OK ||
                stof_attention_plan_family(ctx, &d, f, NULL, &p) != STOF_OK) {
                snprintf(msg, sizeof(msg), "error %.200s", stof_errmsg(ctx));
                stof_mask_family_free(&f);
                break;
            }
            stof_plan_describe(p, js, sizeof(js), NULL);
            const char *k = strstr(js, "\"key\":\"");
            snprintf(msg + strlen(msg), sizeof(msg) - strlen(msg), " %.32s",
                     k ? k + 7 : "?");
            stof_plan_free(&p);
            stof_mask_family_free(&f);
        }
    }
    stof_close(&ctx);
    if (write(fd[1], msg, strlen(msg) + 1) < 0)
        _exit(2);
    _exit(0);
}

Test(gpu_family_attn, long_specs_differing_late_have_their_own_keys)
{
    char a[256];
    in_child(long_spec_child, NULL, a, sizeof(a));
    char k1[40] = "", k2[40] = "";
    cr_assert_eq(sscanf(a, "planned: %39s %39s", k1, k2), 2, "%s", a);
    cr_assert_str_neq(k1, k2, "%s", a);
}

/* Sampled rows of sequence b, every head, against a direct evaluation of
 * sliding:W (|p - k| < W with p = q + q_offset, q < q_len, k < k_len):
 * no bit matrix on either side. Returns the worst relative error. */
static double check_sliding_rows(const problem *p, const inst *in, int b,
                                 int W, tu_rng *r)
{
    const int D = p->head_dim;
    const float scale = 1.0f / sqrtf((float)D);
    double *s = malloc(sizeof(double) * (size_t)p->seq_k);
    double worst = 0.0;
    for (int t = 0; t < 160; t++) {
        int q = t < 4 ? (int[]){0, in->q_len[b] - 1, in->q_len[b],
                                p->seq_q - 1}[t]
                      : (int)tu_below(r, (uint64_t)p->seq_q);
        if (q < 0 || q >= p->seq_q)
            continue;
        for (int h = 0; h < p->heads; h++) {
            const size_t ro = (((size_t)b * p->heads + h) * p->seq_q + q) * D;
            const size_t ko = ((size_t)b * p->heads + h) * p->seq_k * D;
            double got[256], want[256];
            const int64_t pos = (int64_t)q + in->q_offset[b];
            int64_t lo = pos - W + 1, hi = pos + W;
            if (lo < 0)
                lo = 0;
            if (hi > in->k_len[b])
                hi = in->k_len[b];
            if (q >= in->q_len[b])
                hi = lo; /* a padding row: no key */
            double mx = -INFINITY, sum = 0.0;
            for (int64_t k = lo; k < hi; k++) {
                double x = 0.0;
                for (int e = 0; e < D; e++)
                    x += (double)p->fq[ro + e] * p->fk[ko + k * D + e];
                s[k] = x * scale;
                mx = s[k] > mx ? s[k] : mx;
            }
            for (int e = 0; e < D; e++)
                want[e] = 0.0;
            for (int64_t k = lo; k < hi; k++) {
                const double w = exp(s[k] - mx);
                sum += w;
                for (int e = 0; e < D; e++)
                    want[e] += w * p->fv[ko + k * D + e];
            }
            for (int e = 0; e < D; e++) {
                want[e] = sum > 0.0 ? want[e] / sum : 0.0;
                const uint16_t x = p->ho[ro + e];
                got[e] = p->dt == STOF_DTYPE_FP16 ? tu_f16_to_f32(x)
                                                  : tu_bf16_to_f32(x);
                if (hi <= lo)
                    cr_assert(got[e] == 0.0, "b=%d h=%d row %d (no key): "
                                             "output %g, not 0",
                              b, h, q, got[e]);
            }
            const double err = tu_rel_err(got, want, (size_t)D);
            cr_assert(err < 1.6e-2, "b=%d h=%d row %d (keys %lld..%lld): "
                                    "rel err %g",
                      b, h, q, (long long)lo, (long long)hi, err);
            worst = err > worst ? err : worst;
        }
    }
    free(s);
    return worst;
}

Test(gpu_family_attn, long_sequences_tune_without_a_bit_matrix)
{
    /* 33000 x 33000 is past 2^30 elements: the family is tuned (cost model
     * on tile-by-tile formats, the search's reference on the GPU) and run
     * with no bit matrix anywhere; a second plan is a database hit. */
    remove_db();
    stof_settings s;
    stof_default_settings(&s);
    s.user_db = db_path();
    s.tuning_top_k = 2;
    stof_context *ctx = tu_open_gpu_or_skip(&s);
    tu_rng r = {tu_seed()};
    const int N = 33000, W = 300;
    problem p;
    problem_new(&p, ctx, &r, 2, 2, N, N, 64, STOF_DTYPE_BF16);
    char spec[32];
    snprintf(spec, sizeof(spec), "sliding:%d", W);
    stof_mask_family *fam = NULL;
    cr_assert_eq(stof_mask_family_create(ctx, spec, &fam), STOF_OK);
    inst in;
    memset(&in, 0, sizeof(in));
    in.doc = malloc(sizeof(int32_t) * (size_t)p.batch * (size_t)N);
    memset(in.doc, 0, sizeof(int32_t) * (size_t)p.batch * (size_t)N);
    /* Sequence 1: 17001 queries at the end of 20000 keys. */
    in.q_len[0] = N;
    in.k_len[0] = N;
    in.q_len[1] = 17001;
    in.k_len[1] = 20000;
    in.q_offset[1] = 20000 - 17001;
    in.host.q_len = in.q_len;
    in.host.k_len = in.k_len;
    in.host.q_offset = in.q_offset;
    stof_plan *plan = NULL;
    cr_assert_eq(stof_attention_plan_family(ctx, &p.d, fam, &in.host, &plan),
                 STOF_OK, "%s", stof_errmsg(ctx));
    char desc[4096];
    cr_assert_eq(stof_plan_describe(plan, desc, sizeof(desc), NULL), STOF_OK);
    cr_log_info("%s", desc);
    cr_assert(strstr(desc, "\"tuned\""), "%s", desc);
    inst_upload(&in, &p, ctx);
    run_poisoned(&p, ctx, plan, &in);
    const stof_api *api = stof__api();
    stof__ctx_push(ctx);
    cr_assert_eq(api->cuCtxSynchronize(), CUDA_SUCCESS);
    api->cuMemcpyDtoH(p.ho, p.dout, p.nq * 2);
    stof__ctx_pop(ctx);
    double e0 = check_sliding_rows(&p, &in, 0, W, &r);
    double e1 = check_sliding_rows(&p, &in, 1, W, &r);
    cr_log_info("sampled rows: rel err %g, %g", e0, e1);
    stof_plan_free(&plan);
    /* Warm: the record, nothing compiled. */
    const long compiles = stof__jit_compile_count();
    cr_assert_eq(stof_attention_plan_family(ctx, &p.d, fam, &in.host, &plan),
                 STOF_OK, "%s", stof_errmsg(ctx));
    cr_assert_eq(stof_plan_describe(plan, desc, sizeof(desc), NULL), STOF_OK);
    cr_assert(strstr(desc, "\"user db\""), "%s", desc);
    cr_assert_eq(stof__jit_compile_count(), compiles, "a warm plan compiled");
    stof_plan_free(&plan);
    inst_free(&in);
    stof_mask_family_free(&fam);
    problem_free(&p, ctx);
    stof_close(&ctx);
}

Test(gpu_family_attn, bad_use_is_refused)
{
    stof_context *ctx = tu_open_gpu_or_skip(NULL);
    stof_attention_desc d;
    stof_attention_desc_init(&d, 2, 2, 128, 128, 64, STOF_DTYPE_FP16,
                             STOF_LAYOUT_BHSD);
    stof_mask_family *fam = NULL;
    cr_assert_eq(stof_mask_family_create(ctx, "random:0.5:1", &fam), STOF_OK);
    stof_plan *plan = NULL;
    cr_assert_eq(stof_attention_plan_family(ctx, &d, fam, NULL, &plan),
                 STOF_ERR_UNSUPPORTED);
    cr_assert(strstr(stof_errmsg(ctx), "stof_mask_from_spec"), "%s",
              stof_errmsg(ctx));
    cr_assert_null(plan);
    stof_mask_family_free(&fam);
    cr_assert_eq(stof_mask_family_create(ctx, "causal", &fam), STOF_OK);
    int32_t bad[2] = {129, 5};
    stof_mask_data md;
    memset(&md, 0, sizeof(md));
    md.q_len = bad;
    cr_assert_eq(stof_attention_plan_family(ctx, &d, fam, &md, &plan),
                 STOF_ERR_INVALID_ARGUMENT);
    cr_assert(strstr(stof_errmsg(ctx), "q_len[0]"), "%s", stof_errmsg(ctx));
    stof_mask_family_free(&fam);
    stof_close(&ctx);
}

__attribute__((visibility("default"))) int main(int argc, char **argv)
{
    return tu_gpu_suite_main("gpu_family_attn", argc, argv);
}
