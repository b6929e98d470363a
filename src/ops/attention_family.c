/*
 * attention_family.c - attention over a mask family (stof.h): the kernel is
 * chosen once on a sample instance, restricted to the kernels that read the
 * block format (block, wgmma); each run builds its instance's per-sequence
 * formats on the GPU (mask_build.h) into the plan's workspace, which the
 * kernel reads through bf with one row_ptr array per batch element.
 * Planning never makes a bit matrix: the key's statistics and the cost
 * model's tile counts come from the GPU builder run on the sample, and the
 * search (attention_search.c) verifies against a reference that evaluates
 * the family on the GPU.
 */
#define XXH_INLINE_ALL
#include <xxhash.h>

#include "attention_int.h"

#include <jansson.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int block_format_kind(int kind)
{
    return kind == STOF_KERNEL_BLOCK || kind == STOF_KERNEL_WGMMA;
}

void stof__family_mb_data(const stof_mask_data *data, stof_mb_data *md)
{
    memset(md, 0, sizeof(*md));
    if (!data)
        return;
    md->q_len = (CUdeviceptr)(uintptr_t)data->q_len;
    md->k_len = (CUdeviceptr)(uintptr_t)data->k_len;
    md->q_offset = (CUdeviceptr)(uintptr_t)data->q_offset;
    md->prefix = (CUdeviceptr)(uintptr_t)data->prefix;
    md->doc_id = (CUdeviceptr)(uintptr_t)data->doc_id;
    md->doc_stride = data->doc_stride;
    md->seed = (CUdeviceptr)(uintptr_t)data->seed;
    md->cu_q = (CUdeviceptr)(uintptr_t)data->cu_seqlens_q;
    md->cu_k = (CUdeviceptr)(uintptr_t)data->cu_seqlens_k;
    md->total_q = data->total_q;
    md->total_k = data->total_k;
    md->bitmap = (CUdeviceptr)(uintptr_t)data->bitmap;
    md->bitmap_stride = data->bitmap_stride;
    md->bitmap_words = data->bitmap_words;
    md->head_window = (CUdeviceptr)(uintptr_t)data->head_window;
}

/* The kernels' view of a packed descriptor: one sequence of seq_q rows
 * and seq_k keys (batch 1) with the caller's head and row strides. */
static void packed_kernel_desc(const stof_attention_desc *d,
                               stof_attention_desc *kd)
{
    *kd = *d;
    kd->batch = 1;
    kd->layout = STOF_LAYOUT_STRIDED;
    /* (unchecked strides yet: a product that overflows saturates, and the
     * row stride itself is refused by the descriptor's extent check) */
    int64_t *const st[4] = {kd->q_stride, kd->o_stride, kd->k_stride,
                            kd->v_stride};
    for (int i = 0; i < 4; i++) {
        const int64_t rows = i < 2 ? d->seq_q : d->seq_k;
        if (__builtin_mul_overflow(st[i][2], rows, &st[i][0]))
            st[i][0] = INT64_MAX / 8 * 8;
    }
}

/* Whether the GPU evaluates the family (its program fits the builder). */
static int gpu_evaluates(const stof_mask_family *fam)
{
    int32_t prog[4 * STOF_MB_MAX_NODES];
    int depth = 0;
    return stof__spec_program(stof__family_spec(fam), prog, STOF_MB_MAX_NODES,
                              &depth) >= 0 &&
           depth <= STOF_MB_MAX_STACK;
}

/* bf as the block format held by workspace w's arrays (block_m x block_n
 * tiles; rp_stride 0, to be set by the caller for per-sequence lists). */
static void bf_view(stof_block_format *bf, const stof_mb_workspace *w)
{
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
    bf->block_m = w->block_m;
    bf->block_n = w->block_n;
    bf->n_row_blocks = w->n_rb;
    bf->n_col_blocks = w->n_cb;
    bf->bitmap_words_per_row = w->bwpr;
    bf->n_tiles = w->tile_cap;
}

/* Make p build its formats on the GPU with the loaded builder k (taken
 * over by p): the workspace for its tiling, and bf pointing at it. */
static stof_status attach_builder(stof_context *ctx, stof_plan *p,
                                  const stof_mask_family *fam,
                                  stof_mb_kernels *k)
{
    const int bm = p->kind == STOF_KERNEL_WGMMA ? stof__wgmma_block_m(&p->wcfg)
                                                : p->cfg.block_m;
    const int bn = p->kind == STOF_KERNEL_WGMMA ? p->wcfg.block_n
                                                : p->cfg.block_n;
    /* 192-row CTAs need formats checked on the host
     * (stof__wgmma_uniform_triples); a family's are built on the GPU. */
    if (bm == 192)
        return stof__fail(ctx, STOF_ERR_UNSUPPORTED,
                          "wgmma block_m 192 is not available to mask "
                          "families (their formats are built on the GPU, "
                          "unchecked)");
    stof_status st = stof__mb_workspace_heads(ctx, fam, p->desc.batch,
                                              p->desc.heads, p->desc.seq_q,
                                              p->desc.seq_k, bm, bn,
                                              &p->mb_ws);
    if (st != STOF_OK)
        return st;
    p->mb_k = *k;
    memset(k, 0, sizeof(*k));
    p->family = 1;
    p->n_seq = stof__family_n_seq(fam);
    p->formats_gpu = 1;
    bf_view(&p->bf, &p->mb_ws);
    /* One format per element, or per (element, head) for a window per
     * head (the kernels take a negative stride for that). */
    p->bf.rp_stride = p->mb_ws.heads > 1 ? -p->mb_ws.n_rb : p->mb_ws.n_rb;
    snprintf(p->family_spec, sizeof(p->family_spec), "%s",
             stof_mask_family_spec(fam));
    return STOF_OK;
}

static stof_status family_plan(stof_context *ctx, const stof_attention_desc *d,
                               const stof_mask_family *fam,
                               const stof_candidate *c, const void *cubin,
                               size_t size, uint64_t hash, stof_mb_kernels *k,
                               stof_plan **out)
{
    *out = NULL;
    float scale;
    stof_status st = stof__attention_check_problem(ctx, d, &scale);
    if (st != STOF_OK)
        return st;
    if (!block_format_kind(c->kind))
        return stof__fail(ctx, STOF_ERR_UNSUPPORTED,
                          "a %s kernel does not read the GPU-built formats "
                          "of a mask family",
                          stof__kernel_kind_name(c->kind));
    if ((!cubin && !hash) || size < 4)
        return stof__fail(ctx, STOF_ERR_INVALID_ARGUMENT, "no cubin to load");
    stof_plan *p = NULL;
    if ((st = stof__plan_new(ctx, d, scale, c, &p)) != STOF_OK)
        return st;
    const double t0 = stof__now_ms();
    st = attach_builder(ctx, p, fam, k);
    p->formats_ms = stof__now_ms() - t0;
    if (st == STOF_OK)
        st = stof__plan_attach(ctx, p, cubin, size, hash);
    if (st != STOF_OK) {
        stof__plan_release(p);
        return st;
    }
    *out = p;
    return STOF_OK;
}

stof_status stof__family_plan_from_cubin(stof_context *ctx,
                                         const stof_attention_desc *d,
                                         const stof_mask_family *fam,
                                         const stof_candidate *c,
                                         const void *cubin, size_t size,
                                         uint64_t hash, stof_plan **out)
{
    stof_mb_kernels k;
    stof_status st = stof__mb_load(ctx, &k);
    if (st != STOF_OK)
        return st;
    st = family_plan(ctx, d, fam, c, cubin, size, hash, &k, out);
    stof__mb_unload(ctx, &k); /* nothing when the plan took it */
    return st;
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

/* Build ws with the loaded builder k for instance md (NULL: the default)
 * on the default stream and wait: the per-row-block counts of sequence 0
 * into cnt (2 * ws->n_rb ints) and the statistics into stats. */
static stof_status build_counts(stof_context *ctx, const stof_mb_kernels *k,
                                const stof_mb_workspace *ws,
                                const stof_mb_data *md, int32_t *cnt,
                                int64_t stats[STOF_MB_STATS])
{
    stof_status st = (stof_status)stof__ctx_push(ctx);
    if (st != STOF_OK)
        return st;
    const stof_api *api = ctx->api;
    if ((st = stof__mb_build(k, ws, md, NULL, api)) != STOF_OK)
        stof__fail(ctx, st, "the GPU format builder failed to launch");
    else {
        STOF_CU_GOTO(ctx, st, pop,
                     api->cuMemcpyDtoH(stats, ws->stats,
                                       sizeof(int64_t) * STOF_MB_STATS));
        STOF_CU_GOTO(ctx, st, pop,
                     api->cuMemcpyDtoH(cnt, ws->cnt,
                                       sizeof(int32_t) * 2 * (size_t)ws->n_rb));
    }
pop:
    stof__ctx_pop(ctx);
    if (st == STOF_OK && stats[3])
        st = stof__fail(ctx, STOF_ERR_INTERNAL,
                        "the GPU format builder overflowed its workspace");
    return st;
}

/* The sample instance in device memory: one allocation, NULL fields stay
 * NULL. */
typedef struct dev_sample {
    CUdeviceptr mem;
    stof_mask_data d;
} dev_sample;

/* The arrays of host instance data h for d (the kernels' view; packed
 * with n_seq sequences): each field's pointer (NULL when not given) and
 * size in bytes, in the order of stof_mask_data. */
#define SAMPLE_FIELDS 10
static void sample_fields(const stof_attention_desc *d, int n_seq,
                          const stof_mask_data *h,
                          const void *src[SAMPLE_FIELDS],
                          size_t n[SAMPLE_FIELDS])
{
    /* Packed (n_seq > 0): d is the kernels' view (batch 1); the arrays
     * are per sequence, doc_id per packed key. */
    const int nb = n_seq > 0 ? n_seq : d->batch;
    const int64_t stride = h->doc_stride ? h->doc_stride : d->seq_k;
    const void *f[SAMPLE_FIELDS] = {h->q_len,  h->k_len,        h->q_offset,
                                    h->prefix, h->doc_id,       h->seed,
                                    h->cu_seqlens_q, h->cu_seqlens_k,
                                    h->bitmap, h->head_window};
    /* The bitmap's words: sequence b's rows (seq_q, or packed its own)
     * from b * bitmap_stride (0: one bitmap), up to the last one read. */
    const int64_t bm_words =
        h->bitmap_words ? h->bitmap_words : ((int64_t)d->seq_k + 31) / 32;
    int64_t bm_end = 0;
    for (int b = 0; b < nb && h->bitmap; b++) {
        const int64_t rows = n_seq > 0 ? (int64_t)h->cu_seqlens_q[b + 1] -
                                             h->cu_seqlens_q[b]
                                       : d->seq_q;
        const int64_t end = (int64_t)b * h->bitmap_stride + rows * bm_words;
        bm_end = end > bm_end ? end : bm_end;
    }
    const size_t bm_n = (size_t)bm_end * 4u;
    for (int i = 0; i < SAMPLE_FIELDS; i++) {
        src[i] = f[i];
        n[i] = !f[i]     ? 0
               : i < 4   ? (size_t)nb * 4u
               : i == 4  ? (n_seq > 0 ? (size_t)(h->cu_seqlens_k
                                                     ? h->cu_seqlens_k
                                                     : h->cu_seqlens_q)[nb]
                                      : (size_t)((int64_t)(d->batch - 1) *
                                                     stride +
                                                 d->seq_k)) *
                              4u
               : i == 5  ? (size_t)nb * 8u
               : i == 8  ? bm_n
               : i == 9  ? (size_t)d->heads * 4u
                         : ((size_t)nb + 1u) * 4u;
    }
}

/* The kernels' view of a user descriptor for sample_fields: packed
 * descriptors become batch 1 with d->batch sequences. */
static int sample_view(const stof_attention_desc *d, stof_attention_desc *kd)
{
    *kd = *d;
    if (d->layout != STOF_LAYOUT_PACKED)
        return 0;
    kd->batch = 1;
    return d->batch;
}

#define SAMPLE_MAGIC 0x31504d5346544f53ull /* "STOFSMP1" */
#define SAMPLE_HEAD (8u * (1u + SAMPLE_FIELDS + 3u))

void *stof__family_sample_pack(const stof_attention_desc *d,
                               const stof_mask_data *h, size_t max_bytes,
                               size_t *n)
{
    *n = 0;
    if (!d || !h)
        return NULL;
    stof_attention_desc kd;
    const int n_seq = sample_view(d, &kd);
    const void *src[SAMPLE_FIELDS];
    size_t sz[SAMPLE_FIELDS], total = SAMPLE_HEAD;
    sample_fields(&kd, n_seq, h, src, sz);
    for (int i = 0; i < SAMPLE_FIELDS; i++)
        total += (sz[i] + 7u) & ~(size_t)7u;
    if (total > max_bytes)
        return NULL;
    unsigned char *b = calloc(1, total);
    if (!b)
        return NULL;
    uint64_t head[1 + SAMPLE_FIELDS + 3];
    head[0] = SAMPLE_MAGIC;
    for (int i = 0; i < SAMPLE_FIELDS; i++)
        head[1 + i] = sz[i];
    head[1 + SAMPLE_FIELDS] = (uint64_t)h->doc_stride;
    head[2 + SAMPLE_FIELDS] = (uint64_t)h->bitmap_stride;
    head[3 + SAMPLE_FIELDS] = (uint64_t)(int64_t)h->bitmap_words;
    memcpy(b, head, SAMPLE_HEAD);
    size_t at = SAMPLE_HEAD;
    for (int i = 0; i < SAMPLE_FIELDS; i++) {
        if (sz[i])
            memcpy(b + at, src[i], sz[i]);
        at += (sz[i] + 7u) & ~(size_t)7u;
    }
    *n = total;
    return b;
}

void stof__record_miss(stof_context *ctx, stof_db *db, const char *key,
                       json_t *pj, const stof_mask *m, const char *mask_hex,
                       const stof_mask_family *fam,
                       const stof_attention_desc *d,
                       const stof_mask_data *host)
{
    /* Specs never contain quotes or backslashes. */
    size_t blob_n = 0;
    void *blob = NULL;
    if (pj && m) {
        json_object_set_new(pj, "mask_spec",
                            json_string(m->spec ? m->spec : ""));
        json_object_set_new(pj, "mask_digest", json_string(mask_hex));
    } else if (pj && fam) {
        json_object_set_new(pj, "family_spec",
                            json_string(stof_mask_family_spec(fam)));
        blob = host ? stof__family_sample_pack(d, host, (size_t)64 << 20,
                                               &blob_n)
                    : NULL;
        json_object_set_new(pj, "family_sample",
                            json_string(!host ? "default"
                                        : blob ? "kept"
                                               : "too large"));
    }
    char *problem = pj ? json_dumps(pj, JSON_COMPACT) : NULL;
    json_decref(pj);
    if (!problem ||
        stof__db_record_miss(
            db, key, problem, m ? (const void *)m->bits : blob,
            m ? (size_t)m->seq_q * m->words_per_row * 8u : blob_n) != STOF_OK)
        stof__log(ctx, STOF_LOG_WARN, "could not record the miss: %s",
                  problem ? stof_errmsg(ctx) : "out of memory");
    free(problem);
    free(blob);
}

int stof__family_sample_unpack(const stof_attention_desc *d, const void *blob,
                               size_t n, stof_mask_data *out)
{
    memset(out, 0, sizeof(*out));
    uint64_t head[1 + SAMPLE_FIELDS + 3];
    if (!d || !blob || n < SAMPLE_HEAD || ((uintptr_t)blob & 7u))
        return 0;
    memcpy(head, blob, SAMPLE_HEAD);
    if (head[0] != SAMPLE_MAGIC)
        return 0;
    const unsigned char *b = blob;
    const void **dst[SAMPLE_FIELDS] = {
        (const void **)&out->q_len,        (const void **)&out->k_len,
        (const void **)&out->q_offset,     (const void **)&out->prefix,
        (const void **)&out->doc_id,       (const void **)&out->seed,
        (const void **)&out->cu_seqlens_q, (const void **)&out->cu_seqlens_k,
        (const void **)&out->bitmap,       (const void **)&out->head_window};
    size_t at = SAMPLE_HEAD;
    for (int i = 0; i < SAMPLE_FIELDS; i++) {
        const uint64_t sz = head[1 + i];
        if (sz > n - at || ((sz + 7u) & ~(uint64_t)7u) > n - at)
            goto bad;
        if (sz)
            *dst[i] = b + at;
        at += (size_t)((sz + 7u) & ~(uint64_t)7u);
    }
    out->doc_stride = (int64_t)head[1 + SAMPLE_FIELDS];
    out->bitmap_stride = (int64_t)head[2 + SAMPLE_FIELDS];
    const int64_t bw = (int64_t)head[3 + SAMPLE_FIELDS];
    /* (Strides no blob could hold are refused before any size uses
     * them.) */
    if (bw < 0 || bw > (int64_t)n || out->doc_stride < 0 ||
        out->doc_stride > (int64_t)n || out->bitmap_stride < 0 ||
        out->bitmap_stride > (int64_t)n)
        goto bad;
    out->bitmap_words = (int32_t)bw;
    /* The offsets first (the other sizes depend on them), each array then
     * at least as long as d needs. */
    stof_attention_desc kd;
    const int n_seq = sample_view(d, &kd);
    const int nb = n_seq > 0 ? n_seq : d->batch;
    for (int i = 6; i < 8; i++)
        if (*dst[i] && head[1 + i] < ((uint64_t)nb + 1u) * 4u)
            goto bad;
    if (n_seq > 0 && !out->cu_seqlens_q)
        goto bad;
    for (int i = 6; i < 8 && n_seq > 0; i++) { /* in range, for the sizes */
        const int32_t *cu = *dst[i];
        for (int j = 0; cu && j <= nb; j++)
            if (cu[j] < 0 || (j && cu[j] < cu[j - 1]) ||
                cu[j] > (i == 6 ? d->seq_q : d->seq_k))
                goto bad;
    }
    const void *src[SAMPLE_FIELDS];
    size_t need[SAMPLE_FIELDS];
    sample_fields(&kd, n_seq, out, src, need);
    for (int i = 0; i < SAMPLE_FIELDS; i++)
        if (src[i] && head[1 + i] < need[i])
            goto bad;
    return 1;
bad:
    memset(out, 0, sizeof(*out));
    return 0;
}

static stof_status sample_upload(stof_context *ctx, const stof_attention_desc *d,
                                 int n_seq, const stof_mask_data *h,
                                 dev_sample *out)
{
    memset(out, 0, sizeof(*out));
    if (!h)
        return STOF_OK;
    const void *src[SAMPLE_FIELDS];
    size_t n[SAMPLE_FIELDS], off[SAMPLE_FIELDS], total = 0;
    sample_fields(d, n_seq, h, src, n);
    for (int i = 0; i < SAMPLE_FIELDS; i++) {
        off[i] = total;
        total += (n[i] + 255u) & ~(size_t)255u;
    }
    out->d.doc_stride = h->doc_stride;
    /* The sample is planned over all the plan's rows (its totals only
     * bound its offsets, checked): formats, statistics and the search
     * cover seq_q x seq_k. */
    out->d.bitmap_stride = h->bitmap_stride;
    out->d.bitmap_words = h->bitmap_words;
    if (total == 0)
        return STOF_OK;
    stof_status st = (stof_status)stof__ctx_push(ctx);
    if (st != STOF_OK)
        return st;
    const stof_api *api = ctx->api;
    STOF_CU_GOTO(ctx, st, pop, api->cuMemAlloc(&out->mem, total));
    const void **dst[SAMPLE_FIELDS] = {
        (const void **)&out->d.q_len,        (const void **)&out->d.k_len,
        (const void **)&out->d.q_offset,     (const void **)&out->d.prefix,
        (const void **)&out->d.doc_id,       (const void **)&out->d.seed,
        (const void **)&out->d.cu_seqlens_q, (const void **)&out->d.cu_seqlens_k,
        (const void **)&out->d.bitmap,       (const void **)&out->d.head_window};
    for (int i = 0; i < SAMPLE_FIELDS; i++) {
        if (!src[i])
            continue;
        STOF_CU_GOTO(ctx, st, pop,
                     api->cuMemcpyHtoD(out->mem + off[i], src[i], n[i]));
        *dst[i] = (const void *)(uintptr_t)(out->mem + off[i]);
    }
pop:
    stof__ctx_pop(ctx);
    return st;
}

static void sample_free(stof_context *ctx, dev_sample *s)
{
    if (s->mem && stof__ctx_push(ctx) == STOF_OK) {
        ctx->api->cuMemFree(s->mem);
        stof__ctx_pop(ctx);
    }
    memset(s, 0, sizeof(*s));
}

/* The statistics of the sample on 128 x 64 tiles, from the GPU builder
 * (k): non-empty tiles, partial tiles, most tiles of a row block, and the
 * tiles of the batch (n_rb x n_cb x batch), n_cb in st[4]. */
static stof_status sample_stats(stof_context *ctx, const stof_attention_desc *d,
                                const stof_mask_family *fam,
                                const stof_mb_kernels *k,
                                const stof_mask_data *dev, int64_t st_out[5])
{
    stof_mb_workspace ws;
    stof_status st = stof__mb_workspace_heads(ctx, fam, d->batch, d->heads,
                                              d->seq_q, d->seq_k, 128, 64,
                                              &ws);
    if (st != STOF_OK)
        return st;
    int64_t stats[STOF_MB_STATS];
    stof_mb_data md;
    stof__family_mb_data(dev, &md);
    int32_t *cnt = malloc(sizeof(int32_t) * 2 * (size_t)ws.n_rb);
    st = cnt ? build_counts(ctx, k, &ws, &md, cnt, stats)
             : stof__fail(ctx, STOF_ERR_OUT_OF_MEMORY, "out of memory");
    free(cnt);
    if (st == STOF_OK) {
        st_out[0] = stats[0];
        st_out[1] = stats[1];
        st_out[2] = stats[2];
        st_out[3] = (int64_t)ws.batch * ws.n_rb * ws.n_cb;
        st_out[4] = ws.n_cb;
    }
    stof__mb_workspace_free(ctx, &ws);
    return st;
}

/* The formats of the sample's sequence 0 for the cost model, from the GPU
 * builder: per row block, its non-empty and partial tiles (no tile lists,
 * no bitmaps: the model reads row_ptr and kind only). */
typedef struct gpu_formats {
    stof_context *ctx;
    const stof_mask_family *fam;
    const stof_attention_desc *d;
    const stof_mask_data *dev;
    stof_mb_kernels k;
} gpu_formats;

/* A format holding only what the cost model and the wgmma row order read
 * (row_ptr, and kind with each row block's full tiles first), from the
 * builder's per-row-block counts cnt (non-empty, partial) and statistics,
 * of workspace ws's first sequence. */
static stof_status counts_format(stof_context *ctx, const stof_mb_workspace *ws,
                                 const int32_t *cnt, const int64_t *stats,
                                 stof_format **out)
{
    stof_format *f = calloc(1, sizeof(*f));
    if (f) {
        f->row_ptr = malloc(sizeof(int64_t) * ((size_t)ws->n_rb + 1));
        f->kind = malloc((size_t)stats[0] + 1);
    }
    if (!f || !f->row_ptr || !f->kind) {
        stof_format_free(&f);
        return stof__fail(ctx, STOF_ERR_OUT_OF_MEMORY, "out of memory");
    }
    f->seq_q = ws->seq_q;
    f->seq_k = ws->seq_k;
    f->block_m = ws->block_m;
    f->block_n = ws->block_n;
    f->n_row_blocks = ws->n_rb;
    f->n_col_blocks = ws->n_cb;
    f->bitmap_words_per_row = ws->bwpr;
    f->n_full = stats[0] - stats[1];
    f->n_partial = stats[1];
    f->n_empty = (int64_t)ws->n_rb * ws->n_cb - stats[0];
    f->row_ptr[0] = 0;
    for (int i = 0; i < ws->n_rb; i++) {
        const int64_t e = f->row_ptr[i], nt = cnt[2 * i], np = cnt[2 * i + 1];
        memset(f->kind + e, STOF_TILE_FULL, (size_t)(nt - np));
        memset(f->kind + e + nt - np, STOF_TILE_PARTIAL, (size_t)np);
        f->row_ptr[i + 1] = e + nt;
    }
    *out = f;
    return STOF_OK;
}

static stof_status gpu_format(void *user, int block_m, int block_n,
                              stof_format **out)
{
    gpu_formats *g = user;
    stof_context *ctx = g->ctx;
    *out = NULL;
    stof_mb_workspace ws;
    stof_status st = stof__mb_workspace_new(ctx, g->fam, 1, g->d->seq_q,
                                            g->d->seq_k, block_m, block_n, &ws);
    if (st != STOF_OK)
        return st;
    int32_t *cnt = malloc(sizeof(int32_t) * 2 * (size_t)ws.n_rb);
    int64_t stats[STOF_MB_STATS];
    stof_mb_data md;
    stof__family_mb_data(g->dev, &md);
    st = cnt ? build_counts(ctx, &g->k, &ws, &md, cnt, stats)
             : stof__fail(ctx, STOF_ERR_OUT_OF_MEMORY, "out of memory");
    if (st == STOF_OK)
        st = counts_format(ctx, &ws, cnt, stats, out);
    free(cnt);
    stof__mb_workspace_free(ctx, &ws);
    return st;
}

stof_status stof__family_rank(stof_context *ctx, const stof_attention_desc *d,
                              const stof_attn_problem *pr,
                              stof_candidate *cands, int max, int *n)
{
    *n = 0;
    gpu_formats g = {.ctx = ctx, .fam = pr->fam, .d = d, .dev = pr->dev};
    stof_status st = stof__mb_load(ctx, &g.k);
    if (st != STOF_OK)
        return st;
    st = stof__cost_rank_formats(ctx, d, gpu_format, &g, cands, max, n);
    stof__mb_unload(ctx, &g.k);
    return st;
}

/* The family of a spec the GPU evaluates (its program fits), else NULL
 * (a parse error may leave its message on the context; callers fall back
 * to the host and end with their own status). */
static stof_mask_family *gpu_spec_family(stof_context *ctx, const char *spec)
{
    stof_mask_family *fam = NULL;
    if (!spec || !ctx->device.ok ||
        stof__family_builder_cubin(ctx, !ctx->hit_no_compile) != STOF_OK ||
        stof_mask_family_create(ctx, spec, &fam) != STOF_OK)
        return NULL;
    if (!gpu_evaluates(fam))
        stof_mask_family_free(&fam);
    return fam;
}

stof_status stof__spec_block_format_gpu(stof_context *ctx, const char *spec,
                                        int seq_q, int seq_k, int block_m,
                                        int block_n, stof_block_format *bf,
                                        stof_format **counts)
{
    memset(bf, 0, sizeof(*bf));
    if (counts)
        *counts = NULL;
    if ((int64_t)((seq_q + block_m - 1) / block_m) *
            ((seq_k + block_n - 1) / block_n) >
        INT32_MAX)
        return STOF_ERR_UNSUPPORTED;
    stof_mask_family *fam = gpu_spec_family(ctx, spec);
    if (!fam)
        return STOF_ERR_UNSUPPORTED;
    stof_mb_kernels k;
    stof_mb_workspace ws;
    memset(&ws, 0, sizeof(ws));
    int32_t *cnt = NULL;
    int64_t stats[STOF_MB_STATS];
    stof_status st = stof__mb_load(ctx, &k);
    if (st == STOF_OK)
        st = stof__mb_workspace_new(ctx, fam, 1, seq_q, seq_k, block_m,
                                    block_n, &ws);
    if (st == STOF_OK &&
        !(cnt = malloc(sizeof(int32_t) * 2 * (size_t)ws.n_rb)))
        st = stof__fail(ctx, STOF_ERR_OUT_OF_MEMORY, "out of memory");
    if (st == STOF_OK)
        st = build_counts(ctx, &k, &ws, NULL, cnt, stats);
    if (st == STOF_OK && counts)
        st = counts_format(ctx, &ws, cnt, stats, counts);
    if (st == STOF_OK) {
        /* The workspace becomes the plan's format memory (its scratch
         * arrays stay unused). */
        bf_view(bf, &ws);
        bf->n_tiles = stats[0];
        bf->n_partial = stats[1];
        memset(&ws, 0, sizeof(ws));
    }
    free(cnt);
    stof__mb_workspace_free(ctx, &ws);
    stof__mb_unload(ctx, &k);
    stof_mask_family_free(&fam);
    return st;
}

stof_status stof__spec_rowwise_format_gpu(stof_context *ctx, const char *spec,
                                          int seq_q, int seq_k, int block_m,
                                          int block_n, int group,
                                          stof_rowwise_format *rf,
                                          stof_format **counts)
{
    memset(rf, 0, sizeof(*rf));
    if (counts)
        *counts = NULL;
    if (block_n % 32 != 0)
        return STOF_ERR_UNSUPPORTED;
    stof_mask_family *fam = gpu_spec_family(ctx, spec);
    if (!fam)
        return STOF_ERR_UNSUPPORTED;
    stof_mb_kernels k;
    int32_t *nk = NULL;
    stof_status st = stof__mb_load(ctx, &k);
    if (st == STOF_OK) {
        st = stof__mb_rowwise_build(ctx, &k, fam, seq_q, seq_k, block_m,
                                    block_n, group, rf, &nk);
        stof__mb_unload(ctx, &k);
    }
    stof_mask_family_free(&fam);
    if (st == STOF_OK && counts) {
        const int n_rb = rf->n_row_blocks;
        stof_format *f = calloc(1, sizeof(*f));
        if (f && (f->rw_ptr = malloc(sizeof(int64_t) * ((size_t)n_rb + 1)))) {
            f->n_row_blocks = n_rb;
            f->rw_ptr[0] = 0;
            for (int i = 0; i < n_rb; i++)
                f->rw_ptr[i + 1] = f->rw_ptr[i] + nk[i];
            *counts = f;
        } else {
            stof_format_free(&f);
            stof__rowwise_format_free(ctx, rf);
            st = stof__fail(ctx, STOF_ERR_OUT_OF_MEMORY, "out of memory");
        }
    }
    free(nk);
    return st;
}

/* The key of a family problem: the family (canonical spec), the problem
 * with its lengths bucketed, and the buckets of the sample's statistics on
 * 128 x 64 tiles over the batch (non-empty tiles over all tiles, partial
 * over non-empty, most tiles of a row block over the key blocks), computed
 * on the GPU. */
static void family_key(stof_context *ctx, const stof_attention_desc *d,
                       const stof_mask_family *fam, const int64_t stats[5],
                       char key[33], char *text, size_t text_n)
{
    const double all = (double)stats[3];
    const int b_active = frac_bucket(all > 0 ? (double)stats[0] / all : 0.0);
    const int b_partial = frac_bucket(
        stats[0] > 0 ? (double)stats[1] / (double)stats[0] : 0.0);
    const int b_most = frac_bucket(
        stats[4] > 0 ? (double)stats[2] / (double)stats[4] : 0.0);
    stof_attention_desc nd = *d;
    stof__attention_normalise(&nd);
    nd.seq_q = stof__family_len_bucket(d->seq_q);
    nd.seq_k = stof__family_len_bucket(d->seq_k);
    char small[512], *buf = small;
    const char *fmt = "family;v=2;spec=%s;%s%sactive=%d;partial=%d;most=%d";
    const char *spec = stof_mask_family_spec(fam);
    const char *packed = stof__family_n_seq(fam) ? "packed;" : "";
    const char *rows1 = stof__family_rows_one(fam) ? "rows1;" : "";
    int n = snprintf(small, sizeof(small), fmt, spec, packed, rows1, b_active,
                     b_partial, b_most);
    /* A long spec: the whole text is hashed (cut, two families sharing
     * their first 500 characters, or the statistics past them, would
     * share a record); short ones hash as they always did. */
    if (n >= (int)sizeof(small) && (buf = malloc((size_t)n + 1)) != NULL)
        snprintf(buf, (size_t)n + 1, fmt, spec, packed, rows1, b_active,
                 b_partial, b_most);
    if (!buf) { /* (out of memory: the hash of the spec stands in for it) */
        buf = small;
        const XXH64_hash_t hs = XXH3_64bits(spec, strlen(spec));
        n = snprintf(small, sizeof(small),
                     "family;v=2;spec#=%016llx;%s%sactive=%d;partial=%d;"
                     "most=%d",
                     (unsigned long long)hs, packed, rows1, b_active,
                     b_partial, b_most);
    }
    if (n < 0)
        n = 0;
    XXH128_hash_t h = XXH3_128bits(buf, (size_t)n);
    char hex[33];
    snprintf(hex, sizeof(hex), "%016llx%016llx", (unsigned long long)h.high64,
             (unsigned long long)h.low64);
    stof__attention_key(ctx, &nd, hex, key, NULL, 0);
    if (text && text_n)
        snprintf(text, text_n, "%s;seq_q=%d;seq_k=%d", buf, nd.seq_q,
                 nd.seq_k);
    if (buf != small)
        free(buf);
}

/* The grouped-query row view of a family problem with one query row
 * (decode): kd becomes kv_heads heads of `group` rows, row g being query
 * head kvh * group + g (q and o rows one head stride apart), K/V as they
 * are. Returns the group, or 0 (kd untouched) when d is not such a problem:
 * packed, no grouping, several query rows, ALiBi or a bias (per query head),
 * or leaves with per-row data the view cannot repeat (a window per head,
 * a bitmap). */
static int gqa_one_row_view(const stof_attention_desc *d,
                            const stof_mask_family *fam, int packed,
                            stof_attention_desc *kd)
{
    stof_attention_desc nd = *d;
    stof__attention_normalise(&nd);
    const int group = stof__kv_group(&nd);
    if (packed || group < 2 || nd.seq_q != 1 || nd.alibi_slopes || nd.bias ||
        (stof__family_spec(fam)->uses &
         (STOF_SPEC_USES_HEAD | STOF_SPEC_USES_BITMAP)))
        return 0;
    *kd = nd;
    kd->layout = STOF_LAYOUT_STRIDED;
    kd->heads = nd.kv_heads;
    kd->kv_heads = 0;
    kd->seq_q = group;
    for (int t = 0; t < 2; t++) {
        int64_t *st = t ? kd->o_stride : kd->q_stride;
        st[2] = st[1];
        st[1] *= group;
    }
    return group;
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
    float scale;
    /* The packed layout: the kernels see one sequence of seq_q rows (kd)
     * holding d->batch sequences (a packed family). */
    const int packed = d->layout == STOF_LAYOUT_PACKED;
    stof_attention_desc kd = *d;
    if (packed) {
        stof_attention_desc ud = *d; /* packed K/V strides with kv_heads */
        stof__attention_normalise(&ud);
        packed_kernel_desc(&ud, &kd);
    }
    stof_status st = stof__attention_check_problem(ctx, &kd, &scale);
    if (st != STOF_OK)
        return st;
    if (!gpu_evaluates(fam))
        return stof__fail(ctx, STOF_ERR_UNSUPPORTED,
                          "%s: \"%.200s\" is not built on the GPU (random "
                          "leaves, bigbird with more than %d random blocks, "
                          "or too large a spec); use stof_mask_from_spec and "
                          "stof_attention_plan",
                          fn, stof_mask_family_spec(fam), STOF_PROG_MAX_RANDOM);
    STOF_CHECK_ARG(ctx, !packed || (sample && sample->cu_seqlens_q),
                   "%s: a packed layout needs a sample with cu_seqlens_q "
                   "(the offsets of a typical batch, host memory)",
                   fn);
    STOF_CHECK_ARG(ctx, packed || !sample || !sample->cu_seqlens_q,
                   "%s: cu_seqlens_q is set, but desc.layout is not "
                   "STOF_LAYOUT_PACKED",
                   fn);
    st = stof_mask_data_check(ctx, fam, d->batch, d->seq_q, d->seq_k, sample);
    if (st != STOF_OK)
        return st;
    const int per_head = (stof__family_spec(fam)->uses & STOF_SPEC_USES_HEAD) != 0;
    if (packed && d->alibi_slopes)
        return stof__fail(ctx, STOF_ERR_UNSUPPORTED,
                          "%s: ALiBi (desc.alibi_slopes) with the packed "
                          "layout is not supported (its key and query rows "
                          "are packed rows); plan the padded layout",
                          fn);
    if (packed && d->bias)
        return stof__fail(ctx, STOF_ERR_UNSUPPORTED,
                          "%s: a bias tensor (desc.bias) with the packed "
                          "layout is not supported; plan the padded layout",
                          fn);
    if (per_head && packed)
        return stof__fail(ctx, STOF_ERR_UNSUPPORTED,
                          "%s: a window per head (head_sliding, "
                          "head_causal_sliding) with the packed layout is "
                          "not supported; plan the padded layout",
                          fn);
    for (int h = 0; sample && sample->head_window && h < d->heads; h++)
        STOF_CHECK_ARG(ctx, sample->head_window[h] >= 0,
                       "%s: head_window[%d] = %d is negative", fn, h,
                       (int)sample->head_window[h]);
    if (!ctx->device.ok)
        return stof__fail(ctx, STOF_ERR_NO_DEVICE, "%s needs a GPU: %s", fn,
                          ctx->device.why[0] ? ctx->device.why
                                             : "no usable CUDA device");
    stof_mb_kernels k;
    dev_sample ds;
    memset(&ds, 0, sizeof(ds));
    stof_mask_family *pfam = NULL;
    /* Grouped-query decode (one query row): planned with each K/V head's
     * query heads as the rows of one head, every row being the query row
     * (stof__family_row_one), so each K/V tile is read once per group. */
    const int group = gqa_one_row_view(d, fam, packed, &kd);
    if (packed)
        st = stof__family_packed(ctx, fam, d->batch, &pfam);
    else if (group)
        st = stof__family_row_one(ctx, fam, &pfam);
    if (st != STOF_OK)
        return st;
    const stof_mask_family *f = pfam ? pfam : fam;
    if ((st = stof__family_builder_cubin(ctx, 1)) != STOF_OK ||
        (st = stof__mb_load(ctx, &k)) != STOF_OK) {
        stof_mask_family_free(&pfam);
        return st;
    }
    int64_t stats[5] = {0, 0, 0, 0, 0};
    char key[33], key_text[640];
    const double t0 = stof__now_ms();
    st = sample_upload(ctx, &kd, packed ? d->batch : 0, sample, &ds);
    if (st == STOF_OK)
        st = sample_stats(ctx, &kd, f, &k, &ds.d, stats);
    const double key_ms = stof__now_ms() - t0;
    stof_plan *p = NULL;
    if (st == STOF_OK) {
        family_key(ctx, &kd, f, stats, key, key_text, sizeof(key_text));
        stof_attn_problem pr = {.fam = f, .dev = &ds.d, .host = sample,
                                .user = d};
        st = stof__attention_plan_problem(
            ctx, &kd, &pr, key,
            (1u << STOF_KERNEL_BLOCK) | (1u << STOF_KERNEL_WGMMA), &p);
    }
    stof__mb_unload(ctx, &k);
    sample_free(ctx, &ds);
    stof_mask_family_free(&pfam);
    if (st != STOF_OK) {
        stof_plan_free(&p);
        return st;
    }
    p->key_ms += key_ms;
    p->gqa_rows = group;
    snprintf(p->family_key, sizeof(p->family_key), "%s", key_text);
    snprintf(p->mask_hex, sizeof(p->mask_hex), "%s", p->key);
    p->mask_density = stats[3] > 0 ? (double)stats[0] / (double)stats[3] : 0.0;
    if ((st = stof__plan_settle(ctx)) != STOF_OK) {
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
    stof__family_mb_data(data, &md);
    return stof__mb_build(&p->mb_k, &p->mb_ws, &md, s, p->ctx->api);
}
