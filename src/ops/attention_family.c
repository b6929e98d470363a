/*
 * attention_family.c - attention over a mask family (stof.h): the kernel is
 * chosen once on a sample instance, restricted to the kernels that read the
 * block format (block, wgmma); each run builds its instance's per-sequence
 * formats on the GPU (mask_build.h) into the plan's workspace, which the
 * kernel reads through bf with one row_ptr array per batch element.
 */
#define XXH_INLINE_ALL
#include <xxhash.h>

#include "attention_int.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define FAMILY_MAX_ELEMS ((int64_t)1 << 30)
#define FAMILY_MAX_CANDS 512

static int block_format_kind(int kind)
{
    return kind == STOF_KERNEL_BLOCK || kind == STOF_KERNEL_WGMMA;
}

/* The cost model's best block-format candidate for (d, m). */
static stof_status best_block_candidate(stof_context *ctx,
                                        const stof_attention_desc *d,
                                        const stof_mask *m,
                                        stof_candidate *out)
{
    stof_candidate *c = calloc(FAMILY_MAX_CANDS, sizeof(*c));
    if (!c)
        return stof__fail(ctx, STOF_ERR_OUT_OF_MEMORY,
                          "out of memory ranking kernels");
    int n = 0;
    stof_status st = stof__cost_rank(ctx, d, m, c, FAMILY_MAX_CANDS, &n);
    if (st == STOF_OK) {
        st = STOF_ERR_UNSUPPORTED;
        for (int i = 0; i < n; i++) {
            if (block_format_kind(c[i].kind)) {
                *out = c[i];
                st = STOF_OK;
                break;
            }
        }
        if (st != STOF_OK)
            stof__fail(ctx, st, "no block-format kernel supports head_dim "
                                "%d on this device",
                       d->head_dim);
    }
    free(c);
    return st;
}

/* Make p build its formats on the GPU: load the builder, allocate the
 * workspace for its tiling, and point bf at it. */
static stof_status attach_builder(stof_context *ctx, stof_plan *p,
                                  const stof_mask_family *fam)
{
    const int bm = p->kind == STOF_KERNEL_WGMMA ? stof__wgmma_block_m(&p->wcfg)
                                                : p->cfg.block_m;
    const int bn = p->kind == STOF_KERNEL_WGMMA ? p->wcfg.block_n
                                                : p->cfg.block_n;
    stof_status st = stof__mb_load(ctx, &p->mb_k);
    if (st == STOF_OK)
        st = stof__mb_workspace_new(ctx, fam, p->desc.batch, p->desc.seq_q,
                                    p->desc.seq_k, bm, bn, &p->mb_ws);
    if (st != STOF_OK) {
        stof__mb_unload(ctx, &p->mb_k);
        return st;
    }
    /* The sample's uploaded format and row order are not needed. */
    stof__block_format_free(ctx, &p->bf);
    if (p->d_row_order && stof__ctx_push(ctx) == STOF_OK) {
        ctx->api->cuMemFree(p->d_row_order);
        stof__ctx_pop(ctx);
    }
    p->d_row_order = 0;
    const stof_mb_workspace *w = &p->mb_ws;
    stof_block_format *bf = &p->bf;
    memset(bf, 0, sizeof(*bf));
    bf->mem = w->mem;
    bf->bytes = w->bytes;
    bf->row_ptr = w->row_ptr;
    bf->col_idx = w->col_idx;
    bf->kind = w->kind;
    bf->bitmap_idx = w->bitmap_idx;
    bf->bitmaps = w->bitmaps;
    bf->seq_q = w->seq_q;
    bf->seq_k = w->seq_k;
    bf->block_m = bm;
    bf->block_n = bn;
    bf->n_row_blocks = w->n_rb;
    bf->n_col_blocks = w->n_cb;
    bf->bitmap_words_per_row = w->bwpr;
    bf->n_tiles = w->tile_cap;
    bf->rp_stride = w->n_rb;
    p->family = 1;
    snprintf(p->family_spec, sizeof(p->family_spec), "%s",
             stof_mask_family_spec(fam));
    return STOF_OK;
}

/* The length bucket of n: the smallest of 2^j and 3 * 2^(j-1) (j >= 7)
 * that is at least n (128, 192, 256, 384, 512, 768, ...): lengths within
 * a factor 1.5 share a record. */
int stof__family_len_bucket(int n)
{
    int64_t b = 128;
    for (;;) {
        if (b >= n)
            return (int)b;
        if (b + b / 2 >= n)
            return (int)(b + b / 2);
        b *= 2;
    }
}

/* A statistic's bucket: steps of a factor sqrt(2) of a fraction in
 * (0, 1] (0: exactly 1; 40: below 2^-20 or 0). */
static int frac_bucket(double x)
{
    if (!(x > 0.0))
        return 40;
    int b = (int)lround(-2.0 * log2(x));
    return b < 0 ? 0 : (b > 40 ? 40 : b);
}

/* The key of a family problem: the family (canonical spec), the problem
 * with its lengths bucketed, and the buckets of the sample's statistics on
 * 128 x 64 tiles (non-empty tiles over all tiles, partial over non-empty,
 * most tiles of a row block over the key blocks), from the CPU family
 * builder (block part only). */
static stof_status family_key(stof_context *ctx, const stof_attention_desc *d,
                              const stof_mask_family *fam,
                              const stof_mask_data *sample, char key[33],
                              char *text, size_t text_n)
{
    stof_format *f = NULL;
    stof_status st = stof__format_build_family_parts(
        ctx, fam, d->seq_q, d->seq_k, sample, 0, 128, 64, STOF__FORMAT_BLOCK,
        &f);
    if (st != STOF_OK)
        return st;
    const int64_t tiles = f->row_ptr[f->n_row_blocks];
    int64_t most = 0;
    for (int i = 0; i < f->n_row_blocks; i++)
        if (f->row_ptr[i + 1] - f->row_ptr[i] > most)
            most = f->row_ptr[i + 1] - f->row_ptr[i];
    const double all = (double)f->n_row_blocks * (double)f->n_col_blocks;
    const int b_active = frac_bucket(all > 0 ? (double)tiles / all : 0.0);
    const int b_partial =
        frac_bucket(tiles > 0 ? (double)f->n_partial / (double)tiles : 0.0);
    const int b_most = frac_bucket(
        f->n_col_blocks > 0 ? (double)most / (double)f->n_col_blocks : 0.0);
    stof_format_free(&f);
    stof_attention_desc nd = *d;
    stof__attention_normalise(&nd);
    nd.seq_q = stof__family_len_bucket(d->seq_q);
    nd.seq_k = stof__family_len_bucket(d->seq_k);
    char buf[512];
    int n = snprintf(buf, sizeof(buf),
                     "family;v=1;spec=%s;active=%d;partial=%d;most=%d",
                     stof_mask_family_spec(fam), b_active, b_partial, b_most);
    if (n < 0 || (size_t)n >= sizeof(buf))
        n = (int)sizeof(buf) - 1;
    XXH128_hash_t h = XXH3_128bits(buf, (size_t)n);
    char hex[33];
    snprintf(hex, sizeof(hex), "%016llx%016llx", (unsigned long long)h.high64,
             (unsigned long long)h.low64);
    stof__attention_key(ctx, &nd, hex, key, NULL, 0);
    if (text && text_n)
        snprintf(text, text_n, "%s;seq_q=%d;seq_k=%d", buf, nd.seq_q,
                 nd.seq_k);
    return STOF_OK;
}

stof_status stof_attention_plan_family(stof_context *ctx,
                                       const stof_attention_desc *d,
                                       const stof_mask_family *fam,
                                       const stof_mask_data *sample,
                                       stof_plan **out)
{
    static const char fn[] = "stof_attention_plan_family";
    STOF_CHECK_ARG(ctx, out != NULL, "%s: plan is NULL", fn);
    *out = NULL;
    STOF_CHECK_ARG(ctx, d != NULL, "%s: descriptor is NULL", fn);
    STOF_CHECK_ARG(ctx, fam != NULL, "%s: fam is NULL", fn);
    STOF_CHECK_ARG(ctx, d->seq_q >= 1 && d->seq_k >= 1 &&
                            (int64_t)d->seq_q * d->seq_k <= FAMILY_MAX_ELEMS,
                   "%s: seq_q x seq_k = %d x %d; families plan at most 2^30 "
                   "elements for now",
                   fn, d->seq_q, d->seq_k);
    int32_t prog[4 * STOF_MB_MAX_NODES];
    int depth = 0;
    if (stof__spec_program(stof__family_spec(fam), prog, STOF_MB_MAX_NODES,
                           &depth) < 0 ||
        depth > STOF_MB_MAX_STACK)
        return stof__fail(ctx, STOF_ERR_UNSUPPORTED,
                          "%s: \"%.200s\" is not built on the GPU (random and "
                          "bigbird leaves, or too large a spec); use "
                          "stof_mask_from_spec and stof_attention_plan",
                          fn, stof_mask_family_spec(fam));
    stof_status st = stof_mask_data_check(ctx, fam, d->batch, d->seq_q,
                                          d->seq_k, sample);
    if (st != STOF_OK)
        return st;
    char key[33], key_text[640];
    st = family_key(ctx, d, fam, sample, key, key_text, sizeof(key_text));
    if (st != STOF_OK)
        return st;
    stof_mask *m = NULL;
    st = stof_mask_family_eval(ctx, fam, d->seq_q, d->seq_k, sample, 0, &m);
    if (st != STOF_OK)
        return st;
    stof_plan *p = NULL;
    st = stof__attention_plan_keyed(
        ctx, d, m, key, (1u << STOF_KERNEL_BLOCK) | (1u << STOF_KERNEL_WGMMA),
        &p);
    if (st == STOF_OK && !block_format_kind(p->kind)) {
        /* The sample's best kernel reads row-wise lists: take the best
         * block-format one the cost model sees instead. */
        stof_candidate c;
        stof_plan_free(&p);
        st = best_block_candidate(ctx, d, m, &c);
        if (st == STOF_OK)
            st = stof__attention_plan_kernel(ctx, d, m, &c, &p);
        if (st == STOF_OK)
            p->source = "family cost model";
    }
    stof_mask_free(&m);
    if (st == STOF_OK) {
        st = attach_builder(ctx, p, fam);
        snprintf(p->family_key, sizeof(p->family_key), "%s", key_text);
    }
    if (st != STOF_OK) {
        stof_plan_free(&p);
        return st;
    }
    *out = p;
    return stof__ok(ctx);
}

stof_status stof__attention_family_build(stof_plan *p,
                                         const stof_mask_data *data,
                                         CUstream s)
{
    stof_mb_data md;
    memset(&md, 0, sizeof(md));
    if (data) {
        md.q_len = (CUdeviceptr)(uintptr_t)data->q_len;
        md.k_len = (CUdeviceptr)(uintptr_t)data->k_len;
        md.q_offset = (CUdeviceptr)(uintptr_t)data->q_offset;
        md.prefix = (CUdeviceptr)(uintptr_t)data->prefix;
        md.doc_id = (CUdeviceptr)(uintptr_t)data->doc_id;
        md.doc_stride = data->doc_stride;
    }
    return stof__mb_build(&p->mb_k, &p->mb_ws, &md, s, p->ctx->api);
}
