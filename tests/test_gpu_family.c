/*
 * test_gpu_family.c - the GPU format builder (mask_build.cu) against the
 * CPU builder (stof_format_build_family), bit for bit: every array of every
 * sequence of a batch, on the families the GPU evaluates, with random
 * instance data (odd sizes, empty sequences, seq_q != seq_k, offsets,
 * prefixes, documents), every tile size, a workspace poisoned before the
 * first build and reused for a second instance.
 */
#include <criterion/criterion.h>
#include <criterion/logging.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_shim.h"
#include "internal.h"
#include "mask_build.h"
#include "testutil.h"

TestSuite(gpu_family, .timeout = 900);

typedef struct inst {
    int batch, seq_q, seq_k;
    int32_t *q_len, *k_len, *q_offset, *prefix, *doc;
    uint32_t *bm;              /* `bitmap`: batch (or one, shared) */
    int64_t bm_stride, bm_n;   /* words between sequences (0), in all */
    int bm_words;              /* words a row (wider than needed, odd) */
    uint64_t *seed;            /* per sequence (some 0) */
    int32_t hw[4];             /* head_window of 4 heads */
} inst;

static void inst_random(inst *in, tu_rng *r, int batch, int seq_q, int seq_k)
{
    in->batch = batch;
    in->seq_q = seq_q;
    in->seq_k = seq_k;
    in->q_len = malloc(sizeof(int32_t) * (size_t)batch);
    in->k_len = malloc(sizeof(int32_t) * (size_t)batch);
    in->q_offset = malloc(sizeof(int32_t) * (size_t)batch);
    in->prefix = malloc(sizeof(int32_t) * (size_t)batch);
    in->doc = malloc(sizeof(int32_t) * (size_t)batch * (size_t)seq_k);
    for (int b = 0; b < batch; b++) {
        int kind = (int)tu_below(r, 6);
        in->q_len[b] = kind == 0 ? 0 : (kind == 1 ? seq_q
                                                  : (int)tu_below(r, (uint64_t)seq_q + 1));
        in->k_len[b] = kind == 2 ? seq_k : (int)tu_below(r, (uint64_t)seq_k + 1);
        if (kind == 3)
            in->k_len[b] = 0;
        in->q_offset[b] = tu_below(r, 3) == 0
                              ? (in->k_len[b] > in->q_len[b]
                                     ? in->k_len[b] - in->q_len[b]
                                     : 0)
                              : (int)tu_below(r, 40);
        in->prefix[b] = (int)tu_below(r, (uint64_t)seq_k + 8);
        int d = (int)tu_below(r, 3), run = 1 + (int)tu_below(r, 90);
        for (int k = 0; k < seq_k; k++) {
            if (--run == 0) {
                d += 1 + (int)tu_below(r, 2);
                run = 1 + (int)tu_below(r, 90);
            }
            in->doc[(size_t)b * (size_t)seq_k + (size_t)k] = d;
        }
    }
    /* A bitmap of random density, shared by the batch one time in three. */
    in->bm_words = (seq_k + 31) / 32 + (int)tu_below(r, 2);
    in->bm_stride = tu_below(r, 3) == 0 ? 0
                                        : (int64_t)seq_q * in->bm_words + 3;
    in->bm_n = (in->bm_stride ? (batch - 1) * in->bm_stride : 0) +
               (int64_t)seq_q * in->bm_words;
    in->bm = malloc(sizeof(uint32_t) * (size_t)in->bm_n);
    const int dens = (int)tu_below(r, 3);
    for (int64_t i = 0; i < in->bm_n; i++) {
        uint32_t x = (uint32_t)tu_next(r);
        in->bm[i] = dens == 0 ? x & (uint32_t)tu_next(r)
                    : dens == 1 ? x
                                : x | (uint32_t)tu_next(r) | (uint32_t)tu_next(r);
    }
    static const int32_t wins[] = {0, 1, 3, 37, 64, 100, 129, 600};
    for (int h = 0; h < 4; h++)
        in->hw[h] = wins[tu_below(r, 8)];
    in->seed = malloc(sizeof(uint64_t) * (size_t)batch);
    for (int b = 0; b < batch; b++)
        in->seed[b] = tu_below(r, 4) == 0 ? 0 : tu_next(r);
}

static void inst_free(inst *in)
{
    free(in->q_len);
    free(in->k_len);
    free(in->q_offset);
    free(in->prefix);
    free(in->doc);
    free(in->bm);
    free(in->seed);
}

/* Device copies of the instance arrays, in one allocation. */
typedef struct dev_inst {
    CUdeviceptr mem;
    stof_mb_data d;
} dev_inst;

static void dev_upload(stof_context *ctx, const inst *in, dev_inst *out)
{
    const stof_api *api = stof__api();
    const size_t b4 = sizeof(int32_t) * (size_t)in->batch;
    const size_t docs = sizeof(int32_t) * (size_t)in->batch * (size_t)in->seq_k;
    cr_assert_eq(stof__ctx_push(ctx), STOF_OK);
    const size_t bmb = sizeof(uint32_t) * (size_t)in->bm_n;
    cr_assert_eq(api->cuMemAlloc(&out->mem, 8 * 256 + docs + 6 * b4 + bmb),
                 CUDA_SUCCESS);
    CUdeviceptr p = out->mem;
    out->d.q_len = p;
    api->cuMemcpyHtoD(p, in->q_len, b4);
    p += (b4 + 255) / 256 * 256;
    out->d.k_len = p;
    api->cuMemcpyHtoD(p, in->k_len, b4);
    p += (b4 + 255) / 256 * 256;
    out->d.q_offset = p;
    api->cuMemcpyHtoD(p, in->q_offset, b4);
    p += (b4 + 255) / 256 * 256;
    out->d.prefix = p;
    api->cuMemcpyHtoD(p, in->prefix, b4);
    p += (b4 + 255) / 256 * 256;
    out->d.doc_id = p;
    api->cuMemcpyHtoD(p, in->doc, docs);
    out->d.doc_stride = in->seq_k;
    p += (docs + 255) / 256 * 256;
    out->d.seed = p;
    api->cuMemcpyHtoD(p, in->seed, 2 * b4);
    p += (2 * b4 + 255) / 256 * 256;
    out->d.bitmap = p;
    api->cuMemcpyHtoD(p, in->bm, bmb);
    out->d.bitmap_stride = in->bm_stride;
    out->d.bitmap_words = in->bm_words;
    p += (bmb + 255) / 256 * 256;
    out->d.head_window = p;
    api->cuMemcpyHtoD(p, in->hw, sizeof(in->hw));
    stof__ctx_pop(ctx);
}

static void dev_free(stof_context *ctx, dev_inst *di)
{
    stof__ctx_push(ctx);
    stof__api()->cuMemFree(di->mem);
    stof__ctx_pop(ctx);
}

/* The format the GPU must produce for sequence b: the CPU builder's with
 * the instance's host data, unless `expect` says otherwise. */
typedef stof_format *(*expect_fn)(stof_context *ctx,
                                  const stof_mask_family *fam,
                                  const inst *in, int b, int h, int bm,
                                  int bn);

static stof_format *expect_cpu(stof_context *ctx, const stof_mask_family *fam,
                               const inst *in, int b, int h, int bm, int bn)
{
    stof_mask_data md;
    memset(&md, 0, sizeof(md));
    md.q_len = in->q_len;
    md.k_len = in->k_len;
    md.q_offset = in->q_offset;
    md.prefix = in->prefix;
    md.doc_id = in->doc;
    md.doc_stride = in->seq_k;
    md.seed = in->seed;
    md.bitmap = in->bm;
    md.bitmap_stride = in->bm_stride;
    md.bitmap_words = in->bm_words;
    md.head_window = in->hw;
    md.head = h;
    stof_format *f = NULL;
    cr_assert_eq(stof_format_build_family(ctx, fam, in->seq_q, in->seq_k, &md,
                                          b, bm, bn, &f),
                 STOF_OK, "%s", stof_errmsg(ctx));
    return f;
}

/* Build on the GPU and compare every sequence with `expect` (NULL: the
 * CPU builder). Returns the number of sequences compared; *unsorted: the
 * builder's "document ids decrease" flag. */
static int check_build_vs(stof_context *ctx, const stof_mb_kernels *k,
                          const stof_mask_family *fam,
                          const stof_mb_workspace *ws, const inst *in,
                          const dev_inst *di, expect_fn expect,
                          int *unsorted)
{
    if (!expect)
        expect = expect_cpu;
    const stof_api *api = stof__api();
    cr_assert_eq(stof__ctx_push(ctx), STOF_OK);
    cr_assert_eq(stof__mb_build(k, ws, &di->d, NULL, api), STOF_OK);
    cr_assert_eq(api->cuCtxSynchronize(), CUDA_SUCCESS, "builder failed");
    const int64_t nrb_all = (int64_t)ws->batch * ws->n_rb;
    int32_t *rp = malloc(sizeof(int32_t) * (size_t)(nrb_all + 1));
    int64_t stats[STOF_MB_STATS];
    api->cuMemcpyDtoH(rp, ws->row_ptr, sizeof(int32_t) * (size_t)(nrb_all + 1));
    api->cuMemcpyDtoH(stats, ws->stats, sizeof(stats));
    cr_assert_eq(stats[3], 0, "overflow reported");
    const int64_t nt = rp[nrb_all];
    cr_assert_eq(stats[0], nt);
    int32_t *col = malloc(sizeof(int32_t) * (size_t)(nt + 1));
    int32_t *bidx = malloc(sizeof(int32_t) * (size_t)(nt + 1));
    uint8_t *kind = malloc((size_t)nt + 1);
    const size_t tw = (size_t)ws->block_m * (size_t)ws->bwpr;
    uint32_t *bits = malloc(sizeof(uint32_t) * (size_t)ws->pool_cap * tw + 1);
    api->cuMemcpyDtoH(col, ws->col_idx, sizeof(int32_t) * (size_t)nt);
    api->cuMemcpyDtoH(bidx, ws->bitmap_idx, sizeof(int32_t) * (size_t)nt);
    api->cuMemcpyDtoH(kind, ws->kind, (size_t)nt);
    if (ws->pool_cap > 0)
        api->cuMemcpyDtoH(bits, ws->bitmaps,
                          sizeof(uint32_t) * (size_t)ws->pool_cap * tw);
    stof__ctx_pop(ctx);

    if (unsorted)
        *unsorted = (int)stats[5];
    int64_t most = 0, partial = 0;
    uint8_t *slot_seen = calloc((size_t)ws->pool_cap + 1, 1);
    /* The workspace's sequences: batch elements, or (element, head) pairs
     * for a window per head. */
    for (int sq = 0; sq < ws->batch; sq++) {
        const int b = sq / ws->heads, h = sq % ws->heads;
        stof_format *f = expect(ctx, fam, in, b, h, ws->block_m, ws->block_n);
        const char *sp = stof_mask_family_spec(fam);
        cr_assert_eq(f->n_row_blocks, ws->n_rb);
        const int64_t base = rp[(int64_t)sq * ws->n_rb];
        partial += f->n_partial;
        for (int i = 0; i <= ws->n_rb; i++) {
            const int64_t g = rp[(int64_t)sq * ws->n_rb + i] - base;
            cr_assert_eq(g, f->row_ptr[i],
                         "%s b=%d (%d x %d of %d x %d, off %d) %dx%d: "
                         "row_ptr[%d] gpu %lld cpu %lld",
                         sp, b, in->q_len[b], in->k_len[b], in->seq_q,
                         in->seq_k, in->q_offset[b], ws->block_m, ws->block_n,
                         i, (long long)g, (long long)f->row_ptr[i]);
            if (i < ws->n_rb && f->row_ptr[i + 1] - f->row_ptr[i] > most)
                most = f->row_ptr[i + 1] - f->row_ptr[i];
        }
        const int64_t n = f->row_ptr[f->n_row_blocks];
        int i = 0; /* the row block of entry e */
        for (int64_t e = 0; e < n; e++) {
            while (f->row_ptr[i + 1] <= e)
                i++;
            cr_assert_eq(col[base + e], f->col_idx[e], "%s b=%d col_idx[%lld]",
                         sp, b, (long long)e);
            cr_assert_eq(kind[base + e], f->kind[e],
                         "%s b=%d %dx%d tile %lld (key block %d): kind gpu %d "
                         "cpu %d",
                         sp, b, ws->block_m, ws->block_n, (long long)e,
                         f->col_idx[e], kind[base + e], f->kind[e]);
            if (f->kind[e] == STOF_TILE_FULL) {
                cr_assert_eq(bidx[base + e], -1);
                continue;
            }
            /* A partial tile's bitmap is in a pool slot of its own. */
            cr_assert(bidx[base + e] >= 0 && bidx[base + e] < ws->pool_cap,
                      "%s b=%d tile %lld: pool slot %d of %lld", sp, b,
                      (long long)e, bidx[base + e], (long long)ws->pool_cap);
            cr_assert_eq(slot_seen[bidx[base + e]]++, 0,
                         "%s b=%d tile %lld: pool slot %d taken twice", sp,
                         b, (long long)e, bidx[base + e]);
            cr_assert(memcmp(bits + (size_t)bidx[base + e] * tw,
                             f->bitmaps + (size_t)f->bitmap_idx[e] * tw,
                             tw * sizeof(uint32_t)) == 0,
                      "%s b=%d %dx%d tile %lld: bitmaps differ", sp, b,
                      ws->block_m, ws->block_n, (long long)e);
        }
        stof_format_free(&f);
    }
    cr_assert_eq(stats[1], partial, "partial tiles");
    cr_assert_eq(stats[2], most, "most tiles of a row block");
    free(rp);
    free(col);
    free(bidx);
    free(kind);
    free(bits);
    free(slot_seen);
    return ws->batch;
}

static int check_build(stof_context *ctx, const stof_mb_kernels *k,
                       const stof_mask_family *fam, const stof_mb_workspace *ws,
                       const inst *in, const dev_inst *di)
{
    int unsorted = -1;
    int n = check_build_vs(ctx, k, fam, ws, in, di, NULL, &unsorted);
    cr_assert_eq(unsorted, 0, "sorted ids reported as unsorted");
    return n;
}

static const char *gpu_specs[] = {
    "dense", "causal", "sliding:37", "causal_sliding:100", "dilated:60:3",
    "dilated:300:70", "longformer:40:9", "strided:33", "causal&docs",
    "causal|prefix", "docs&!prefix:10", "!causal", "!(sliding:50)&causal",
    "(causal&docs)|prefix:3", "sliding:20|strided:64&docs", "none", "docs",
    "prefix", "bigbird:64:3:2:3:1", "bigbird:16:3:1:5:77&causal",
    "bigbird:32:1:0:64:9|sliding:10", "!bigbird:8:2:1:1:3&docs",
    "bitmap", "causal&bitmap", "bitmap|prefix", "!bitmap&sliding:40",
};
#define N_GPU_SPECS ((int)(sizeof(gpu_specs) / sizeof(gpu_specs[0])))

Test(gpu_family, matches_cpu_builder_every_tiling)
{
    stof_context *ctx = tu_open_gpu_or_skip(NULL);
    stof_mb_kernels k;
    cr_assert_eq(stof__mb_load(ctx, &k), STOF_OK, "%s", stof_errmsg(ctx));
    tu_rng r = {tu_seed()};
    static const int sizes[][2] = {{1, 1}, {17, 100}, {100, 17}, {257, 257},
                                   {300, 700}, {1000, 999}};
    static const int bs[] = {16, 32, 64, 128, 256};
    int seqs = 0;
    for (int s = 0; s < N_GPU_SPECS; s++) {
        stof_mask_family *fam = NULL;
        cr_assert_eq(stof_mask_family_create(ctx, gpu_specs[s], &fam), STOF_OK);
        for (int z = 0; z < 6; z++) {
            inst in;
            inst_random(&in, &r, 3, sizes[z][0], sizes[z][1]);
            dev_inst di;
            dev_upload(ctx, &in, &di);
            /* Every tiling for one size, the kernels' tilings for all. */
            for (int a = 0; a < 5; a++) {
                for (int c = 0; c < 5; c++) {
                    if (z != 3 && !((bs[a] == 64 || bs[a] == 128) &&
                                    bs[c] >= 32 && bs[c] <= 128))
                        continue;
                    stof_mb_workspace ws;
                    cr_assert_eq(stof__mb_workspace_new(ctx, fam, in.batch,
                                                        in.seq_q, in.seq_k,
                                                        bs[a], bs[c], &ws),
                                 STOF_OK, "%s", stof_errmsg(ctx));
                    /* Poison the workspace past the program and stats. */
                    stof__ctx_push(ctx);
                    stof__api()->cuMemsetD8(ws.cnt, 0xa5,
                                            ws.mem + ws.bytes - ws.cnt);
                    stof__ctx_pop(ctx);
                    seqs += check_build(ctx, &k, fam, &ws, &in, &di);
                    stof__mb_workspace_free(ctx, &ws);
                }
            }
            dev_free(ctx, &di);
            inst_free(&in);
        }
        stof_mask_family_free(&fam);
    }
    cr_log_info("compared %d sequences", seqs);
    stof__mb_unload(ctx, &k);
    stof_close(&ctx);
}

/* A window per head: one format per (element, head), each the CPU
 * builder's with that head's window; the other leaves still per element. */
Test(gpu_family, per_head_windows_match_the_cpu)
{
    stof_context *ctx = tu_open_gpu_or_skip(NULL);
    stof_mb_kernels k;
    cr_assert_eq(stof__mb_load(ctx, &k), STOF_OK, "%s", stof_errmsg(ctx));
    tu_rng r = {tu_seed() ^ 0x4ead};
    static const char *specs[] = {"head_sliding", "head_causal_sliding&docs",
                                  "head_sliding|prefix", "!head_sliding",
                                  "causal&head_sliding&bitmap"};
    static const int sizes[][2] = {{300, 300}, {129, 517}, {700, 90}};
    int seqs = 0;
    for (size_t si = 0; si < sizeof(specs) / sizeof(specs[0]); si++) {
        stof_mask_family *fam = NULL;
        cr_assert_eq(stof_mask_family_create(ctx, specs[si], &fam), STOF_OK);
        for (int z = 0; z < 3; z++) {
            inst in;
            inst_random(&in, &r, 3, sizes[z][0], sizes[z][1]);
            dev_inst di;
            dev_upload(ctx, &in, &di);
            static const int tiles[][2] = {{64, 64}, {128, 64}, {128, 128}};
            for (int t = 0; t < 3; t++) {
                stof_mb_workspace ws;
                cr_assert_eq(stof__mb_workspace_heads(
                                 ctx, fam, in.batch, 4, in.seq_q, in.seq_k,
                                 tiles[t][0], tiles[t][1], &ws),
                             STOF_OK, "%s", stof_errmsg(ctx));
                cr_assert_eq(ws.heads, 4);
                cr_assert_eq(ws.batch, 12);
                stof__ctx_push(ctx);
                stof__api()->cuMemsetD8(ws.cnt, 0xa5, ws.mem + ws.bytes - ws.cnt);
                stof__ctx_pop(ctx);
                seqs += check_build(ctx, &k, fam, &ws, &in, &di);
                stof__mb_workspace_free(ctx, &ws);
            }
            dev_free(ctx, &di);
            inst_free(&in);
        }
        stof_mask_family_free(&fam);
    }
    /* Families without head_* leaves stay per element. */
    stof_mask_family *fam = NULL;
    cr_assert_eq(stof_mask_family_create(ctx, "sliding:9", &fam), STOF_OK);
    stof_mb_workspace ws;
    cr_assert_eq(stof__mb_workspace_heads(ctx, fam, 3, 4, 100, 100, 64, 64, &ws),
                 STOF_OK);
    cr_assert(ws.heads == 1 && ws.batch == 3, "heads %d batch %d", ws.heads,
              ws.batch);
    stof__mb_workspace_free(ctx, &ws);
    stof_mask_family_free(&fam);
    cr_log_info("compared %d (sequence, head) formats", seqs);
    stof__mb_unload(ctx, &k);
    stof_close(&ctx);
}

Test(gpu_family, workspace_reused_across_instances)
{
    stof_context *ctx = tu_open_gpu_or_skip(NULL);
    stof_mb_kernels k;
    cr_assert_eq(stof__mb_load(ctx, &k), STOF_OK, "%s", stof_errmsg(ctx));
    tu_rng r = {tu_seed() ^ 0x77};
    stof_mask_family *fam = NULL;
    cr_assert_eq(stof_mask_family_create(ctx, "causal&docs", &fam), STOF_OK);
    stof_mb_workspace ws;
    cr_assert_eq(stof__mb_workspace_new(ctx, fam, 8, 2048, 2048, 128, 64, &ws),
                 STOF_OK, "%s", stof_errmsg(ctx));
    for (int it = 0; it < 4; it++) {
        inst in;
        inst_random(&in, &r, 8, 2048, 2048);
        dev_inst di;
        dev_upload(ctx, &in, &di);
        check_build(ctx, &k, fam, &ws, &in, &di);
        dev_free(ctx, &di);
        inst_free(&in);
    }
    stof__mb_workspace_free(ctx, &ws);
    stof_mask_family_free(&fam);
    stof__mb_unload(ctx, &k);
    stof_close(&ctx);
}

/* causal & same document, element by element, from ids in any order. */
static stof_format *expect_unsorted(stof_context *ctx,
                                    const stof_mask_family *fam,
                                    const inst *in, int b, int h, int bm,
                                    int bn)
{
    (void)fam;
    const int sq = in->seq_q, sk = in->seq_k;
    uint8_t *dense = calloc((size_t)sq * (size_t)sk, 1);
    const int32_t *doc = in->doc + (size_t)b * (size_t)sk;
    for (int q = 0; q < in->q_len[b]; q++) {
        const int p = q + in->q_offset[b];
        for (int kk = 0; kk < in->k_len[b] && p < in->k_len[b]; kk++)
            dense[(size_t)q * (size_t)sk + (size_t)kk] =
                kk <= p && doc[kk] == doc[p];
    }
    stof_mask *m = NULL;
    cr_assert_eq(stof_mask_from_dense(ctx, dense, sq, sk, &m), STOF_OK);
    stof_format *f = NULL;
    cr_assert_eq(stof_format_build(ctx, m, bm, bn, &f), STOF_OK);
    stof_mask_free(&m);
    free(dense);
    return f;
}

Test(gpu_family, unsorted_document_ids_give_the_right_format)
{
    stof_context *ctx = tu_open_gpu_or_skip(NULL);
    stof_mb_kernels k;
    cr_assert_eq(stof__mb_load(ctx, &k), STOF_OK, "%s", stof_errmsg(ctx));
    tu_rng r = {tu_seed() ^ 0x55};
    stof_mask_family *fam = NULL;
    cr_assert_eq(stof_mask_family_create(ctx, "causal&docs", &fam), STOF_OK);
    inst in;
    inst_random(&in, &r, 4, 300, 300);
    for (int i = 0; i < 4 * 300; i++)
        in.doc[i] = (int32_t)tu_below(&r, 3); /* ids in any order */
    /* The CPU refuses them. */
    stof_mask_data md;
    memset(&md, 0, sizeof(md));
    md.doc_id = in.doc;
    cr_assert_eq(stof_mask_data_check(ctx, fam, 4, 300, 300, &md),
                 STOF_ERR_INVALID_ARGUMENT);
    cr_assert(strstr(stof_errmsg(ctx), "decreases"), "%s", stof_errmsg(ctx));
    dev_inst di;
    dev_upload(ctx, &in, &di);
    stof_mb_workspace ws;
    cr_assert_eq(stof__mb_workspace_new(ctx, fam, 4, 300, 300, 64, 64, &ws),
                 STOF_OK);
    int unsorted = 0;
    check_build_vs(ctx, &k, fam, &ws, &in, &di, expect_unsorted, &unsorted);
    cr_assert_eq(unsorted, 1);
    /* Sorted again: the flag clears. */
    for (int b = 0; b < 4; b++)
        for (int i = 0; i < 300; i++)
            in.doc[b * 300 + i] = i / 37;
    dev_free(ctx, &di);
    dev_upload(ctx, &in, &di);
    check_build(ctx, &k, fam, &ws, &in, &di);
    stof__mb_workspace_free(ctx, &ws);
    dev_free(ctx, &di);
    inst_free(&in);
    stof_mask_family_free(&fam);
    stof__mb_unload(ctx, &k);
    stof_close(&ctx);
}

Test(gpu_family, out_of_range_data_is_clamped)
{
    stof_context *ctx = tu_open_gpu_or_skip(NULL);
    stof_mb_kernels k;
    cr_assert_eq(stof__mb_load(ctx, &k), STOF_OK, "%s", stof_errmsg(ctx));
    tu_rng r = {tu_seed() ^ 0x99};
    stof_mask_family *fam = NULL;
    cr_assert_eq(stof_mask_family_create(ctx, "(causal|prefix)&docs", &fam),
                 STOF_OK);
    inst in;
    inst_random(&in, &r, 4, 200, 250);
    /* What the device gets... */
    in.q_len[0] = 1000;
    in.k_len[0] = -7;
    in.q_len[1] = -1;
    in.k_len[1] = 251;
    in.q_offset[2] = -50;
    in.prefix[2] = -9;
    in.q_len[3] = INT32_MAX;
    in.k_len[3] = INT32_MAX;
    dev_inst di;
    dev_upload(ctx, &in, &di);
    /* ... and the clamped values the CPU is given. */
    in.q_len[0] = 200;
    in.k_len[0] = 0;
    in.q_len[1] = 0;
    in.k_len[1] = 250;
    in.q_offset[2] = 0;
    in.prefix[2] = 0;
    in.q_len[3] = 200;
    in.k_len[3] = 250;
    stof_mb_workspace ws;
    cr_assert_eq(stof__mb_workspace_new(ctx, fam, 4, 200, 250, 128, 64, &ws),
                 STOF_OK);
    check_build(ctx, &k, fam, &ws, &in, &di);
    stof__mb_workspace_free(ctx, &ws);
    dev_free(ctx, &di);
    inst_free(&in);
    stof_mask_family_free(&fam);
    stof__mb_unload(ctx, &k);
    stof_close(&ctx);
}

/* A device row-wise format on the host: its arrays. */
typedef struct rw_host {
    int32_t *key_ptr, *keys, *tile_ptr, *bidx;
    uint8_t *kind;
    uint32_t *bits;
} rw_host;

static void rw_download(const stof_rowwise_format *rf, rw_host *h)
{
    const stof_api *api = stof__api();
    const size_t nrp = (size_t)rf->n_row_blocks + 1;
    const size_t tw = (size_t)rf->block_m * (size_t)rf->bitmap_words_per_row;
    h->key_ptr = malloc(nrp * 4);
    h->tile_ptr = malloc(nrp * 4);
    h->keys = malloc((size_t)rf->n_keys * 4 + 4);
    h->bidx = malloc((size_t)rf->n_tiles * 4 + 4);
    h->kind = malloc((size_t)rf->n_tiles + 1);
    h->bits = malloc((size_t)rf->n_partial * tw * 4 + 4);
    cr_assert(h->key_ptr && h->tile_ptr && h->keys && h->bidx && h->kind &&
              h->bits);
    api->cuMemcpyDtoH(h->key_ptr, rf->key_ptr, nrp * 4);
    api->cuMemcpyDtoH(h->tile_ptr, rf->tile_ptr, nrp * 4);
    if (rf->n_keys)
        api->cuMemcpyDtoH(h->keys, rf->keys, (size_t)rf->n_keys * 4);
    if (rf->n_tiles) {
        api->cuMemcpyDtoH(h->bidx, rf->bitmap_idx, (size_t)rf->n_tiles * 4);
        api->cuMemcpyDtoH(h->kind, rf->kind, (size_t)rf->n_tiles);
    }
    if (rf->n_partial)
        api->cuMemcpyDtoH(h->bits, rf->bitmaps,
                          (size_t)rf->n_partial * tw * 4);
}

static void rw_free(rw_host *h)
{
    free(h->key_ptr);
    free(h->keys);
    free(h->tile_ptr);
    free(h->bidx);
    free(h->kind);
    free(h->bits);
}

Test(gpu_family, rowwise_format_matches_the_cpu_upload)
{
    /* The gather kernels' format of spec masks built on the GPU against
     * stof_format_build's row-wise part uploaded, every kernel tiling,
     * rows in order and grouped mod 2 and 3, odd sizes. */
    stof_context *ctx = tu_open_gpu_or_skip(NULL);
    stof_mb_kernels k;
    cr_assert_eq(stof__mb_load(ctx, &k), STOF_OK, "%s", stof_errmsg(ctx));
    static const char *specs[] = {
        "dilated:512:2", "strided:128", "causal", "sliding:100", "dense",
        "longformer:64:16", "bigbird:64:3:2:3:1", "dilated:60:3|causal",
        "!causal&sliding:300", "strided:33&!prefix:40"};
    static const int sizes[][2] = {{1000, 1000}, {777, 1333}, {1, 257},
                                   {300, 31}};
    static const int bms[] = {64, 128}, bns[] = {32, 64, 128},
                     groups[] = {1, 2, 3};
    int n = 0;
    cr_assert_eq(stof__ctx_push(ctx), STOF_OK);
    for (size_t si = 0; si < sizeof(specs) / sizeof(specs[0]); si++) {
        stof_mask_family *fam = NULL;
        cr_assert_eq(stof_mask_family_create(ctx, specs[si], &fam), STOF_OK);
        for (int z = 0; z < 4; z++) {
            const int sq = sizes[z][0], sk = sizes[z][1];
            stof_mask *m = NULL;
            cr_assert_eq(stof_mask_from_spec(ctx, specs[si], sq, sk, &m),
                         STOF_OK, "%s", stof_errmsg(ctx));
            for (int a = 0; a < 2; a++)
                for (int b = 0; b < 3; b++)
                    for (int gi = 0; gi < 3; gi++) {
                        const int g = groups[gi];
                        stof_mask *gm = NULL;
                        int32_t *perm = NULL;
                        if (g > 1)
                            cr_assert_eq(stof__mask_group_rows(ctx, m, g, &gm,
                                                               &perm),
                                         STOF_OK);
                        stof_format *f = NULL;
                        cr_assert_eq(stof__format_build_parts(
                                         ctx, gm ? gm : m, bms[a], bns[b],
                                         STOF__FORMAT_ROWWISE, &f),
                                     STOF_OK);
                        stof_rowwise_format cpu, gpu;
                        cr_assert_eq(stof__rowwise_format_upload(ctx, f, &cpu),
                                     STOF_OK, "%s", stof_errmsg(ctx));
                        int32_t *nk = NULL;
                        cr_assert_eq(stof__mb_rowwise_build(
                                         ctx, &k, fam, sq, sk, bms[a], bns[b],
                                         g, &gpu, &nk),
                                     STOF_OK, "%s", stof_errmsg(ctx));
                        const char *sp = specs[si];
                        cr_assert_eq(gpu.n_keys, cpu.n_keys,
                                     "%s %dx%d %dx%d g%d: keys %lld vs %lld",
                                     sp, sq, sk, bms[a], bns[b], g,
                                     (long long)gpu.n_keys,
                                     (long long)cpu.n_keys);
                        cr_assert_eq(gpu.n_tiles, cpu.n_tiles, "%s tiles", sp);
                        cr_assert_eq(gpu.n_partial, cpu.n_partial,
                                     "%s %dx%d %dx%d g%d: partial %lld vs "
                                     "%lld",
                                     sp, sq, sk, bms[a], bns[b], g,
                                     (long long)gpu.n_partial,
                                     (long long)cpu.n_partial);
                        cr_assert_eq(gpu.max_tiles, cpu.max_tiles);
                        rw_host hg, hc;
                        rw_download(&gpu, &hg);
                        rw_download(&cpu, &hc);
                        const size_t nrp = (size_t)cpu.n_row_blocks + 1;
                        const size_t tw = (size_t)cpu.block_m *
                                          (size_t)cpu.bitmap_words_per_row;
                        cr_assert(!memcmp(hg.key_ptr, hc.key_ptr, nrp * 4),
                                  "%s key_ptr", sp);
                        cr_assert(!memcmp(hg.tile_ptr, hc.tile_ptr, nrp * 4),
                                  "%s tile_ptr", sp);
                        cr_assert(!cpu.n_keys ||
                                      !memcmp(hg.keys, hc.keys,
                                              (size_t)cpu.n_keys * 4),
                                  "%s %dx%d %dx%d g%d: keys differ", sp, sq,
                                  sk, bms[a], bns[b], g);
                        for (int64_t e = 0; e < cpu.n_tiles; e++) {
                            cr_assert_eq(hg.kind[e], hc.kind[e],
                                         "%s %dx%d %dx%d g%d tile %lld: "
                                         "kind %d vs %d",
                                         sp, sq, sk, bms[a], bns[b], g,
                                         (long long)e, hg.kind[e], hc.kind[e]);
                            if (hc.kind[e] != STOF_TILE_PARTIAL)
                                continue;
                            cr_assert(hg.bidx[e] >= 0 &&
                                      hg.bidx[e] < gpu.n_partial);
                            cr_assert(!memcmp(hg.bits + (size_t)hg.bidx[e] * tw,
                                              hc.bits + (size_t)hc.bidx[e] * tw,
                                              tw * 4),
                                      "%s %dx%d %dx%d g%d tile %lld: bitmaps "
                                      "differ",
                                      sp, sq, sk, bms[a], bns[b], g,
                                      (long long)e);
                        }
                        for (int i = 0; i < cpu.n_row_blocks; i++)
                            cr_assert_eq(nk[i],
                                         hc.key_ptr[i + 1] - hc.key_ptr[i]);
                        rw_free(&hg);
                        rw_free(&hc);
                        free(nk);
                        stof__rowwise_format_free(ctx, &gpu);
                        stof__rowwise_format_free(ctx, &cpu);
                        stof_format_free(&f);
                        stof_mask_free(&gm);
                        free(perm);
                        n++;
                    }
            stof_mask_free(&m);
        }
        stof_mask_family_free(&fam);
    }
    stof__ctx_pop(ctx);
    cr_log_info("compared %d row-wise formats", n);
    stof__mb_unload(ctx, &k);
    stof_close(&ctx);
}

Test(gpu_family, random_and_wide_bigbird_are_refused_clearly)
{
    /* random draws each row from a sequential generator; bigbird is
     * evaluated on the GPU up to 64 random blocks a row. */
    stof_context *ctx = tu_open_gpu_or_skip(NULL);
    static const char *specs[] = {"random:0.5:1", "causal|bigbird:16:3:1:65:2"};
    for (int i = 0; i < 2; i++) {
        stof_mask_family *fam = NULL;
        cr_assert_eq(stof_mask_family_create(ctx, specs[i], &fam), STOF_OK);
        stof_mb_workspace ws;
        cr_assert_eq(stof__mb_workspace_new(ctx, fam, 1, 64, 64, 64, 64, &ws),
                     STOF_ERR_UNSUPPORTED);
        cr_assert(strstr(stof_errmsg(ctx), "built on the CPU"), "%s",
                  stof_errmsg(ctx));
        cr_assert_eq(ws.mem, 0);
        stof_mask_family_free(&fam);
    }
    stof_close(&ctx);
}

__attribute__((visibility("default"))) int main(int argc, char **argv)
{
    return tu_gpu_suite_main("gpu_family", argc, argv);
}
