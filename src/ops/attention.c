/*
 * attention.c - attention descriptors and plans. A plan owns everything a
 * launch needs on the device (the mask bits, the loaded module) so that
 * stof_attention_run only enqueues a kernel.
 */
#include "attn_block.h"
#include "internal.h"
#include "cost_model.h"
#include "db.h"
#include "gpu_backend.h"
#include "record_check.h"
#include "search.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* Mirrors struct stof_attn_params in jit_templates/stof_common.cuh. */
typedef struct stof_attn_params {
    CUdeviceptr q, k, v, o;
    CUdeviceptr mask_bits;
    int64_t q_stride[3], k_stride[3], v_stride[3], o_stride[3];
    int batch, heads, seq_q, seq_k;
    int mask_words;
    float scale;
} stof_attn_params;
_Static_assert(sizeof(stof_attn_params) == 5 * 8 + 12 * 8 + 6 * 4,
               "stof_attn_params must match stof_common.cuh");

#define REF_WARPS 4 /* STOF_REF_WARPS in attn_reference.cu */

struct stof_plan {
    stof_context *ctx;
    int kind;                 /* STOF_KERNEL_* */
    stof_block_cfg cfg;       /* block / row-wise kernels */
    stof_wgmma_cfg wcfg;      /* wgmma kernel */
    stof_block_format bf;     /* block / wgmma kernels: the device tile BSR */
    stof_rowwise_format rf;   /* row-wise kernel: compacted key tiles */
    CUdeviceptr d_row_order;  /* wgmma kernels: row blocks, heaviest first */
    int group;                /* row grouping period (row-wise kinds) */
    CUdeviceptr d_q_rows;     /* with group > 1: query row of each format
                                 row (int32[seq_q]) */
    double predicted_ms;      /* cost model; 0 for the reference kernel */
    int n_candidates;         /* candidates ranked (stage 1) / timed */
    const char *source;       /* "compiled", "tuned", "user db", "system db",
                                 "fallback" */
    double time_ms;           /* measured by the search, or 0 */
    double runner_up_ms, model_ms;
    char key[33];             /* tuning-database key */
    stof_attention_desc desc;
    float scale;
    char mask_hex[33];
    double mask_density;
    int mask_words;
    CUdeviceptr d_mask;
    CUmodule module;
    CUfunction fn;
    unsigned grid[3], block[3];
    char arch[16];
    double compile_ms, load_ms;
    double verify_ms;         /* the first use of a record on this host:
                                 the time its check took (0: none) */
    char errmsg[1024];
};

static int all_zero(const uint8_t *p, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (p[i])
            return 0;
    return 1;
}

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec * 1e-6;
}

static void set_layout_strides(int64_t st[3], stof_layout layout, int heads,
                               int seq, int head_dim)
{
    if (layout == STOF_LAYOUT_BHSD) {
        st[2] = head_dim;
        st[1] = (int64_t)seq * head_dim;
        st[0] = (int64_t)heads * seq * head_dim;
    } else {
        st[2] = (int64_t)heads * head_dim;
        st[1] = head_dim;
        st[0] = (int64_t)seq * heads * head_dim;
    }
}

stof_status stof_attention_desc_init(stof_attention_desc *d, int batch,
                                     int heads, int seq_q, int seq_k,
                                     int head_dim, stof_dtype dtype,
                                     stof_layout layout)
{
    if (!d)
        return STOF_ERR_INVALID_ARGUMENT;
    memset(d, 0, sizeof(*d));
    d->batch = batch;
    d->heads = heads;
    d->seq_q = seq_q;
    d->seq_k = seq_k;
    d->head_dim = head_dim;
    d->dtype = dtype;
    d->scale = 0.0f;
    d->layout = layout;
    if (layout != STOF_LAYOUT_BHSD && layout != STOF_LAYOUT_BSHD)
        return STOF_ERR_INVALID_ARGUMENT;
    /* The strides are products of the sizes: refuse sizes whose products
     * do not fit (stof_attention_plan names the bad field; here the
     * strides stay 0). */
    int64_t x;
    if (batch < 1 || heads < 1 || seq_q < 1 || seq_k < 1 || head_dim < 1 ||
        __builtin_mul_overflow((int64_t)heads, (int64_t)head_dim, &x) ||
        __builtin_mul_overflow(x, (int64_t)(seq_q > seq_k ? seq_q : seq_k),
                               &x) ||
        __builtin_mul_overflow(x, (int64_t)batch, &x))
        return STOF_ERR_INVALID_ARGUMENT;
    set_layout_strides(d->q_stride, layout, heads, seq_q, head_dim);
    set_layout_strides(d->o_stride, layout, heads, seq_q, head_dim);
    set_layout_strides(d->k_stride, layout, heads, seq_k, head_dim);
    set_layout_strides(d->v_stride, layout, heads, seq_k, head_dim);
    return STOF_OK;
}

/* The largest element offset reachable through strides st (plus one row),
 * or -1 on overflow. Used to reject descriptors whose indexing would not fit
 * in 64 bits. */
static int64_t extent(const int64_t st[3], int batch, int heads, int seq,
                      int head_dim)
{
    const int64_t lim = INT64_MAX / 4;
    int64_t e = head_dim;
    const int64_t n[3] = {batch, heads, seq};
    for (int i = 0; i < 3; i++) {
        if (st[i] != 0 && (n[i] - 1) > (lim - e) / st[i])
            return -1;
        e += (n[i] - 1) * st[i];
    }
    return e;
}

static stof_status check_strides(stof_context *ctx, const char *name,
                                 const int64_t st[3], int batch, int heads,
                                 int seq, int head_dim)
{
    static const char *const dim[3] = {"batch", "head", "seq"};
    for (int i = 0; i < 3; i++) {
        STOF_CHECK_ARG(ctx, st[i] >= 0,
                       "desc.%s_stride[%d] (%s): %lld is negative", name, i,
                       dim[i], (long long)st[i]);
        STOF_CHECK_ARG(ctx, st[i] % 8 == 0,
                       "desc.%s_stride[%d] (%s): %lld is not a multiple of 8 "
                       "elements (16-byte rows are required)",
                       name, i, dim[i], (long long)st[i]);
    }
    STOF_CHECK_ARG(ctx, st[2] >= head_dim || seq == 1,
                   "desc.%s_stride[2] (seq): %lld is smaller than head_dim %d, "
                   "so rows would overlap",
                   name, (long long)st[2], head_dim);
    STOF_CHECK_ARG(ctx, extent(st, batch, heads, seq, head_dim) > 0,
                   "desc.%s strides: the tensor's extent overflows 64 bits",
                   name);
    return STOF_OK;
}

/* Validate a descriptor against a mask; on success *scale is the scale to
 * use. Messages name the offending field. */
static stof_status check_desc(stof_context *ctx, const stof_attention_desc *d,
                              const stof_mask *m, float *scale)
{
    STOF_CHECK_ARG(ctx, d, "desc is NULL");
    STOF_CHECK_ARG(ctx, m, "mask is NULL");
    STOF_CHECK_ARG(ctx, all_zero(d->reserved, sizeof(d->reserved)),
                   "desc: reserved bytes are not zero (fill it with "
                   "stof_attention_desc_init() or memset it first)");
    STOF_CHECK_ARG(ctx, d->batch >= 1 && d->batch <= 65535,
                   "desc.batch: %d is outside 1..65535", d->batch);
    STOF_CHECK_ARG(ctx, d->heads >= 1 && d->heads <= 4096,
                   "desc.heads: %d is outside 1..4096", d->heads);
    STOF_CHECK_ARG(ctx, (int64_t)d->batch * d->heads <= 65535,
                   "desc.batch * desc.heads: %lld exceeds 65535",
                   (long long)d->batch * d->heads);
    STOF_CHECK_ARG(ctx, d->seq_q >= 1, "desc.seq_q: %d is not positive",
                   d->seq_q);
    STOF_CHECK_ARG(ctx, d->seq_k >= 1, "desc.seq_k: %d is not positive",
                   d->seq_k);
    STOF_CHECK_ARG(ctx, d->seq_q == m->seq_q && d->seq_k == m->seq_k,
                   "mask is %d x %d but desc.seq_q x desc.seq_k is %d x %d",
                   m->seq_q, m->seq_k, d->seq_q, d->seq_k);
    STOF_CHECK_ARG(ctx,
                   d->head_dim >= 16 && d->head_dim <= 256 &&
                       d->head_dim % 8 == 0,
                   "desc.head_dim: %d is not a multiple of 8 in 16..256",
                   d->head_dim);
    STOF_CHECK_ARG(ctx,
                   d->dtype == STOF_DTYPE_FP16 || d->dtype == STOF_DTYPE_BF16,
                   "desc.dtype: %d is not a stof_dtype", (int)d->dtype);
    STOF_CHECK_ARG(ctx,
                   d->layout == STOF_LAYOUT_BHSD ||
                       d->layout == STOF_LAYOUT_BSHD ||
                       d->layout == STOF_LAYOUT_STRIDED,
                   "desc.layout: %d is not a stof_layout", (int)d->layout);
    STOF_CHECK_ARG(ctx, isfinite(d->scale),
                   "desc.scale: %g is not finite", (double)d->scale);
    stof_status st;
    if ((st = check_strides(ctx, "q", d->q_stride, d->batch, d->heads,
                            d->seq_q, d->head_dim)) ||
        (st = check_strides(ctx, "k", d->k_stride, d->batch, d->heads,
                            d->seq_k, d->head_dim)) ||
        (st = check_strides(ctx, "v", d->v_stride, d->batch, d->heads,
                            d->seq_k, d->head_dim)) ||
        (st = check_strides(ctx, "o", d->o_stride, d->batch, d->heads,
                            d->seq_q, d->head_dim)))
        return st;
    *scale = d->scale != 0.0f ? d->scale : 1.0f / sqrtf((float)d->head_dim);
    return STOF_OK;
}

/* The effective descriptor: for BHSD/BSHD the strides follow the layout,
 * whatever the fields held. */
static void normalise_desc(stof_attention_desc *d)
{
    if (d->layout == STOF_LAYOUT_STRIDED)
        return;
    set_layout_strides(d->q_stride, d->layout, d->heads, d->seq_q,
                       d->head_dim);
    set_layout_strides(d->o_stride, d->layout, d->heads, d->seq_q,
                       d->head_dim);
    set_layout_strides(d->k_stride, d->layout, d->heads, d->seq_k,
                       d->head_dim);
    set_layout_strides(d->v_stride, d->layout, d->heads, d->seq_k,
                       d->head_dim);
}

static void plan_release(stof_plan *p)
{
    if (!p)
        return;
    const stof_api *api = p->ctx->api;
    stof__block_format_free(p->ctx, &p->bf);
    stof__rowwise_format_free(p->ctx, &p->rf);
    if ((p->d_mask || p->module || p->d_row_order || p->d_q_rows) &&
        stof__ctx_push(p->ctx) == STOF_OK) {
        if (p->d_mask)
            api->cuMemFree(p->d_mask);
        if (p->d_q_rows)
            api->cuMemFree(p->d_q_rows);
        if (p->d_row_order)
            api->cuMemFree(p->d_row_order);
        if (p->module)
            api->cuModuleUnload(p->module);
        stof__ctx_pop(p->ctx);
    }
    free(p);
}

static const char *kind_name(int kind)
{
    switch (kind) {
    case STOF_KERNEL_BLOCK:
        return "block";
    case STOF_KERNEL_ROWWISE:
        return "rowwise";
    case STOF_KERNEL_WGMMA:
        return "wgmma";
    case STOF_KERNEL_WGMMA_GATHER:
        return "wgmma-gather";
    default:
        return "reference";
    }
}

/* --- compiling and loading kernels ------------------------------------- */

stof_status stof__kernel_compile(stof_context *ctx, const stof_candidate *c,
                                 int head_dim, stof_dtype dt, void **cubin,
                                 size_t *size)
{
    *cubin = NULL;
    *size = 0;
    switch (c->kind) {
    case STOF_KERNEL_REFERENCE: {
        char hd[32], dd[32];
        snprintf(hd, sizeof(hd), "HEAD_DIM=%d", head_dim);
        snprintf(dd, sizeof(dd), "DTYPE=%d", (int)dt);
        const char *defs[] = {hd, dd};
        return (stof_status)stof__jit_compile(ctx, "attn_reference.cu", defs,
                                              2, NULL, cubin, size);
    }
    case STOF_KERNEL_BLOCK:
    case STOF_KERNEL_ROWWISE: {
        stof_block_cfg cfg = c->cfg;
        cfg.gather = c->kind == STOF_KERNEL_ROWWISE;
        return stof__block_compile(ctx, head_dim, dt, &cfg, NULL, cubin, size);
    }
    case STOF_KERNEL_WGMMA:
    case STOF_KERNEL_WGMMA_GATHER: {
        stof_wgmma_cfg wc = c->wcfg;
        wc.gather = c->kind == STOF_KERNEL_WGMMA_GATHER;
        return stof__wgmma_compile(ctx, head_dim, dt, &wc, cubin, size);
    }
    default:
        return stof__fail(ctx, STOF_ERR_UNSUPPORTED,
                          "kernel kind %d is not available", c->kind);
    }
}

/* Load a cubin into the plan: module, function, its shared memory limit
 * and, for the reference kernel, the launch shape. */
static stof_status plan_attach(stof_context *ctx, stof_plan *p,
                               const void *cubin)
{
    const double t0 = now_ms();
    stof_status st;
    switch (p->kind) {
    case STOF_KERNEL_BLOCK:
    case STOF_KERNEL_ROWWISE:
        st = stof__block_load_cubin(ctx, p->desc.head_dim, &p->cfg, cubin,
                                    &p->module, &p->fn);
        break;
    case STOF_KERNEL_WGMMA:
    case STOF_KERNEL_WGMMA_GATHER:
        st = stof__wgmma_load_cubin(ctx, p->desc.head_dim, &p->wcfg, cubin,
                                    &p->module, &p->fn);
        break;
    default:
        st = (stof_status)stof__module_load(ctx, cubin, "stof_attn_reference",
                                            0, &p->module, &p->fn);
        p->block[0] = 32 * REF_WARPS;
        p->block[1] = p->block[2] = 1;
        p->grid[0] = (unsigned)((p->desc.seq_q + REF_WARPS - 1) / REF_WARPS);
        p->grid[1] = (unsigned)(p->desc.batch * p->desc.heads);
        p->grid[2] = 1;
        break;
    }
    p->load_ms = now_ms() - t0;
    snprintf(p->arch, sizeof(p->arch), "%s",
             p->kind >= STOF_KERNEL_WGMMA ? "sm_90a" : ctx->device.arch);
    return st;
}

/* --- preparing a plan's device data ------------------------------------ */

/* The mask bits (reference kernel). */
static stof_status prepare_reference(stof_context *ctx, stof_plan *p,
                                     const stof_mask *m)
{
    stof_status st = (stof_status)stof__ctx_push(ctx);
    if (st != STOF_OK)
        return st;
    const stof_api *api = ctx->api;
    size_t bytes = (size_t)m->seq_q * (size_t)m->words_per_row * 8u;
    CUresult r = api->cuMemAlloc(&p->d_mask, bytes);
    if (r == CUDA_SUCCESS)
        r = api->cuMemcpyHtoD(p->d_mask, m->bits, bytes);
    if (r != CUDA_SUCCESS)
        st = (stof_status)stof__cuda_fail(ctx, r, "uploading the mask",
                                          __FILE__, __LINE__);
    stof__ctx_pop(ctx);
    return st;
}

/* Upload n int32 values to a new device array. */
static stof_status upload_i32(stof_context *ctx, const int32_t *x, size_t n,
                              CUdeviceptr *out, const char *what)
{
    stof_status st = (stof_status)stof__ctx_push(ctx);
    if (st != STOF_OK)
        return st;
    const stof_api *api = ctx->api;
    CUresult r = api->cuMemAlloc(out, n * sizeof(int32_t));
    if (r == CUDA_SUCCESS)
        r = api->cuMemcpyHtoD(*out, x, n * sizeof(int32_t));
    if (r != CUDA_SUCCESS)
        st = (stof_status)stof__cuda_fail(ctx, r, what, __FILE__, __LINE__);
    stof__ctx_pop(ctx);
    return st;
}

/* The tile BSR (block-wise kinds) or compacted key tiles (row-wise kinds)
 * for the plan's tile shape, built on the mask with its query rows grouped
 * when the plan groups them (then the permutation goes up as q_rows), and
 * for the wgmma kinds the heavy-first row order. */
static stof_status prepare_tiles(stof_context *ctx, stof_plan *p,
                                 const stof_mask *m)
{
    const int wg = p->kind == STOF_KERNEL_WGMMA ||
                   p->kind == STOF_KERNEL_WGMMA_GATHER;
    const int rowwise = p->kind == STOF_KERNEL_ROWWISE ||
                        p->kind == STOF_KERNEL_WGMMA_GATHER;
    const int bm = wg ? stof__wgmma_block_m(&p->wcfg) : p->cfg.block_m;
    const int bn = wg ? p->wcfg.block_n : p->cfg.block_n;
    stof_status st = STOF_OK;
    stof_mask *grouped = NULL;
    int32_t *perm = NULL, *order = NULL;
    stof_format *f = NULL;
    if (p->group > 1) {
        st = stof__mask_group_rows(ctx, m, p->group, &grouped, &perm);
        if (st == STOF_OK)
            st = upload_i32(ctx, perm, (size_t)m->seq_q, &p->d_q_rows,
                            "uploading the query row order");
        if (st != STOF_OK)
            goto done;
    }
    if ((st = stof__format_build_parts(
             ctx, grouped ? grouped : m, bm, bn,
             rowwise ? STOF__FORMAT_ROWWISE : STOF__FORMAT_BLOCK, &f)) !=
        STOF_OK)
        goto done;
    st = rowwise ? stof__rowwise_format_upload(ctx, f, &p->rf)
                 : stof__block_format_upload(ctx, f, &p->bf);
    if (st != STOF_OK || !wg)
        goto done;
    if (!(order = malloc(sizeof(int32_t) * (size_t)f->n_row_blocks))) {
        st = stof__fail(ctx, STOF_ERR_OUT_OF_MEMORY,
                        "out of memory ordering row blocks");
        goto done;
    }
    if (rowwise)
        stof__wgmma_gather_row_order(f, order);
    else
        stof__wgmma_row_order(f, order);
    st = upload_i32(ctx, order, (size_t)f->n_row_blocks, &p->d_row_order,
                    "uploading the row order");
done:
    free(order);
    free(perm);
    stof_mask_free(&grouped);
    stof_format_free(&f);
    return st;
}

/* Validate, allocate a plan for candidate c and upload its data; no
 * kernel yet. */
static stof_status plan_prepare(stof_context *ctx, const stof_attention_desc *d,
                                const stof_mask *m, const stof_candidate *c,
                                stof_plan **out)
{
    *out = NULL;
    float scale = 0.0f;
    stof_status st = check_desc(ctx, d, m, &scale);
    if (st != STOF_OK)
        return st;
    if (!ctx->device.ok)
        return stof__fail(ctx, STOF_ERR_NO_DEVICE,
                          "stof_attention_plan needs a GPU: %s",
                          ctx->device.why[0] ? ctx->device.why
                                             : "no usable CUDA device");
    if (c->kind < STOF_KERNEL_REFERENCE || c->kind > STOF_KERNEL_WGMMA_GATHER)
        return stof__fail(ctx, STOF_ERR_UNSUPPORTED,
                          "kernel kind %d is not available", c->kind);
    stof_plan *p = calloc(1, sizeof(*p));
    if (!p)
        return stof__fail(ctx, STOF_ERR_OUT_OF_MEMORY,
                          "out of memory allocating a plan");
    p->ctx = ctx;
    p->desc = *d;
    normalise_desc(&p->desc);
    p->scale = scale;
    p->mask_words = m->words_per_row;
    p->mask_density = stof_mask_density(m);
    stof_mask_digest(m, NULL, p->mask_hex);
    p->kind = c->kind;
    p->cfg = c->cfg;
    p->cfg.gather = c->kind == STOF_KERNEL_ROWWISE;
    p->wcfg = c->wcfg;
    p->wcfg.gather = c->kind == STOF_KERNEL_WGMMA_GATHER;
    p->group = c->kind == STOF_KERNEL_ROWWISE ||
                       c->kind == STOF_KERNEL_WGMMA_GATHER
                   ? c->group
                   : 0;
    p->predicted_ms = c->predicted_ms;
    p->source = "compiled";
    st = c->kind == STOF_KERNEL_REFERENCE ? prepare_reference(ctx, p, m)
                                          : prepare_tiles(ctx, p, m);
    if (st != STOF_OK) {
        plan_release(p);
        return st;
    }
    *out = p;
    return STOF_OK;
}

stof_status stof__plan_from_cubin(stof_context *ctx,
                                  const stof_attention_desc *d,
                                  const stof_mask *m, const stof_candidate *c,
                                  const void *cubin, size_t size,
                                  stof_plan **out)
{
    *out = NULL;
    if (!cubin || size < 4)
        return stof__fail(ctx, STOF_ERR_INVALID_ARGUMENT,
                          "no cubin to load");
    stof_plan *p = NULL;
    stof_status st = plan_prepare(ctx, d, m, c, &p);
    if (st != STOF_OK)
        return st;
    if ((st = plan_attach(ctx, p, cubin)) != STOF_OK) {
        plan_release(p);
        return st;
    }
    *out = p;
    return stof__ok(ctx);
}

/* Compile c, or for the reference kernel take the context's copy of an
 * earlier compile (a malloc'd copy either way). */
static stof_status compile_for_plan(stof_context *ctx, const stof_candidate *c,
                                    int head_dim, stof_dtype dt, void **cubin,
                                    size_t *size)
{
    if (c->kind != STOF_KERNEL_REFERENCE)
        return stof__kernel_compile(ctx, c, head_dim, dt, cubin, size);
    for (int i = 0; i < ctx->n_ref_cubins; i++)
        if (ctx->ref_cubins[i].head_dim == head_dim &&
            ctx->ref_cubins[i].dtype == dt) {
            *size = ctx->ref_cubins[i].size;
            if (!(*cubin = malloc(*size)))
                return stof__fail(ctx, STOF_ERR_OUT_OF_MEMORY,
                                  "out of memory");
            memcpy(*cubin, ctx->ref_cubins[i].cubin, *size);
            return STOF_OK;
        }
    stof_status st = stof__kernel_compile(ctx, c, head_dim, dt, cubin, size);
    const int n = ctx->n_ref_cubins;
    void *keep = st == STOF_OK && n < 8 ? malloc(*size) : NULL;
    if (keep) {
        memcpy(keep, *cubin, *size);
        ctx->ref_cubins[n].head_dim = head_dim;
        ctx->ref_cubins[n].dtype = dt;
        ctx->ref_cubins[n].cubin = keep;
        ctx->ref_cubins[n].size = *size;
        ctx->n_ref_cubins = n + 1;
    }
    return st;
}

/* Compile candidate c (NULL = the cost model's first choice, or the
 * reference kernel when no fast kernel supports the problem) and plan it. */
stof_status stof__attention_plan_kernel(stof_context *ctx,
                                        const stof_attention_desc *d,
                                        const stof_mask *m,
                                        const stof_candidate *choice,
                                        stof_plan **out)
{
    if (!ctx)
        return STOF_ERR_INVALID_ARGUMENT;
    STOF_CHECK_ARG(ctx, out, "plan (the output pointer) is NULL");
    *out = NULL;
    float scale;
    stof_status st = check_desc(ctx, d, m, &scale);
    if (st != STOF_OK)
        return st;
    stof_candidate pick;
    memset(&pick, 0, sizeof(pick));
    int ranked = 0;
    if (choice) {
        pick = *choice;
    } else if (ctx->device.ok) {
        stof_attention_desc nd = *d;
        normalise_desc(&nd);
        st = stof__cost_rank(ctx, &nd, m, &pick, 1, &ranked);
        if (st == STOF_ERR_UNSUPPORTED)
            pick.kind = STOF_KERNEL_REFERENCE; /* e.g. head_dim 40 */
        else if (st != STOF_OK)
            return st;
    }
    stof_plan *p = NULL;
    if ((st = plan_prepare(ctx, d, m, &pick, &p)) != STOF_OK)
        return st;
    p->n_candidates = ranked;
    void *cubin = NULL;
    size_t size = 0;
    const double t0 = now_ms();
    st = compile_for_plan(ctx, &pick, d->head_dim, d->dtype, &cubin, &size);
    p->compile_ms = now_ms() - t0;
    if (st == STOF_OK)
        st = plan_attach(ctx, p, cubin);
    free(cubin);
    if (st != STOF_OK) {
        plan_release(p);
        return st;
    }
    if (pick.kind == STOF_KERNEL_REFERENCE && !choice)
        p->source = "fallback";
    *out = p;
    return stof__ok(ctx);
}

/* --- the tuning database ----------------------------------------------- */

stof_db *stof__ctx_db(stof_context *ctx)
{
    if (!ctx->db_tried) {
        ctx->db_tried = 1;
        if (stof__db_open(ctx, ctx->user_db,
                          (const char *const *)ctx->system_dbs,
                          &ctx->db) != STOF_OK)
            stof__log(ctx, STOF_LOG_WARN, "tuning database unavailable: %s",
                      stof_errmsg(ctx));
    }
    return ctx->db;
}

static const char *dtype_name(stof_dtype t)
{
    return t == STOF_DTYPE_FP16 ? "fp16" : "bf16";
}

static const char *layout_str(stof_layout l)
{
    return l == STOF_LAYOUT_BHSD ? "BHSD" : l == STOF_LAYOUT_BSHD ? "BSHD"
                                                                  : "strided";
}

/* A candidate's configuration as the JSON stored in records, and back. */
static void cand_to_json(const stof_candidate *c, char *buf, size_t n)
{
    snprintf(buf, n,
             "{\"kind\":\"%s\",\"block_m\":%d,\"block_n\":%d,\"warps\":%d,"
             "\"stages\":%d,\"overlap\":%d,\"group\":%d}",
             kind_name(c->kind), c->cfg.block_m, c->cfg.block_n, c->cfg.warps,
             c->cfg.stages, c->wcfg.overlap, c->group);
}

static int json_int(const char *js, const char *name, int *out)
{
    char pat[40];
    snprintf(pat, sizeof(pat), "\"%s\":", name);
    const char *q = strstr(js, pat);
    return q && sscanf(q + strlen(pat), "%d", out) == 1;
}

int stof__attention_record_candidate(const stof_db_record *r,
                                     stof_candidate *c, char *why, size_t n)
{
    memset(c, 0, sizeof(*c));
    if (strcmp(r->op, "attention") != 0)
        return stof__why(why, n, "not an attention record");
    if (!strcmp(r->kernel, "block"))
        c->kind = STOF_KERNEL_BLOCK;
    else if (!strcmp(r->kernel, "rowwise"))
        c->kind = STOF_KERNEL_ROWWISE;
    else if (!strcmp(r->kernel, "wgmma"))
        c->kind = STOF_KERNEL_WGMMA;
    else if (!strcmp(r->kernel, "wgmma-gather"))
        c->kind = STOF_KERNEL_WGMMA_GATHER;
    else if (!strcmp(r->kernel, "reference"))
        c->kind = STOF_KERNEL_REFERENCE;
    else
        return stof__why(why, n, "unknown attention kernel");
    int ok = json_int(r->config, "block_m", &c->cfg.block_m) &&
             json_int(r->config, "block_n", &c->cfg.block_n) &&
             json_int(r->config, "warps", &c->cfg.warps) &&
             json_int(r->config, "stages", &c->cfg.stages) &&
             json_int(r->config, "overlap", &c->wcfg.overlap) &&
             json_int(r->config, "group", &c->group);
    if (!ok)
        return stof__why(why, n, "unreadable kernel configuration");
    c->cfg.gather = c->kind == STOF_KERNEL_ROWWISE;
    c->wcfg.block_n = c->cfg.block_n;
    c->wcfg.stages = c->cfg.stages;
    c->wcfg.block_m = c->cfg.block_m;
    c->wcfg.gather = c->kind == STOF_KERNEL_WGMMA_GATHER;
    c->predicted_ms = r->model_ms;
    /* Parameters in range for the kernel (no device: shared memory is
     * checked when the cubin is loaded). */
    if (c->group < 0 || c->group > 16)
        return stof__why(why, n, "row group %d is out of range", c->group);
    if (r->head_dim < 1 || r->head_dim > 256 || r->batch < 1 ||
        r->heads < 1 || r->seq_q < 1 || r->seq_k < 1)
        return stof__why(why, n, "problem sizes out of range");
    char cw[200];
    switch (c->kind) {
    case STOF_KERNEL_BLOCK:
    case STOF_KERNEL_ROWWISE:
        if (!stof__block_cfg_valid(NULL, r->head_dim, &c->cfg, cw,
                                   sizeof(cw)))
            return stof__why(why, n, "invalid %s configuration: %s",
                             r->kernel, cw);
        break;
    case STOF_KERNEL_WGMMA:
    case STOF_KERNEL_WGMMA_GATHER:
        if (!stof__wgmma_cfg_valid(NULL, r->head_dim, &c->wcfg, cw,
                                   sizeof(cw)))
            return stof__why(why, n, "invalid %s configuration: %s",
                             r->kernel, cw);
        if (strcmp(r->arch, "sm_90a") != 0)
            return stof__why(why, n, "a %s kernel must be built for sm_90a",
                             r->kernel);
        break;
    default:
        break;
    }
    return 1;
}

static void fill_record(stof_context *ctx, const stof_attention_desc *d,
                        const stof_mask *m, const char *key,
                        const char *mask_hex,
                        const stof_search_result *res,
                        const stof_search_opts *o, uint64_t seed,
                        stof_db_record *r)
{
    memset(r, 0, sizeof(*r));
    const stof_device *dev = &ctx->device;
    snprintf(r->key, sizeof(r->key), "%s", key);
    snprintf(r->op, sizeof(r->op), "attention");
    snprintf(r->mask_digest, sizeof(r->mask_digest), "%s", mask_hex);
    if (m->spec)
        snprintf(r->mask_spec, sizeof(r->mask_spec), "%s", m->spec);
    r->batch = d->batch;
    r->heads = d->heads;
    r->seq_q = d->seq_q;
    r->seq_k = d->seq_k;
    r->head_dim = d->head_dim;
    snprintf(r->dtype, sizeof(r->dtype), "%s", dtype_name(d->dtype));
    snprintf(r->layout, sizeof(r->layout), "%s", layout_str(d->layout));
    stof__db_record_env(ctx, r);
    snprintf(r->kernel, sizeof(r->kernel), "%s", kind_name(res->winner.kind));
    cand_to_json(&res->winner, r->config, sizeof(r->config));
    snprintf(r->arch, sizeof(r->arch), "%s",
             res->winner.kind >= STOF_KERNEL_WGMMA ? "sm_90a" : dev->arch);
    r->cubin = res->winner_art;
    r->cubin_size = res->winner_art_size;
    r->time_ms = res->winner_ms;
    r->runner_up_ms = res->runner_up_ms;
    r->model_ms = res->model_ms;
    r->n_candidates = res->n_timed;
    r->verified = 1;
    snprintf(r->measured, sizeof(r->measured),
             "{\"method\":\"cuda events, median, L2 flushed\","
             "\"candidates\":%d,\"rejected\":%d,\"failed\":%d,"
             "\"tolerance\":%g,\"seed\":%llu}",
             res->n_selected, res->n_rejected, res->n_failed, o->tolerance,
             (unsigned long long)seed);
}

enum { MAX_RANKED = 512, MAX_SELECTED = 32 };

/* Stage 1 for one problem: the candidates to time, into sel (at most
 * MAX_SELECTED); *k is their number. */
static stof_status select_candidates(stof_context *ctx,
                                     const stof_attention_desc *d,
                                     const stof_mask *m, int top_k,
                                     stof_candidate *sel, int *k)
{
    *k = 0;
    stof_candidate *ranked = malloc(sizeof(*ranked) * MAX_RANKED);
    if (!ranked)
        return stof__fail(ctx, STOF_ERR_OUT_OF_MEMORY, "out of memory");
    int n = 0;
    stof_status st = stof__cost_rank(ctx, d, m, ranked, MAX_RANKED, &n);
    if (st == STOF_OK) {
        *k = stof__search_select(ranked, n, top_k, sel, MAX_SELECTED);
        stof__log(ctx, STOF_LOG_INFO,
                  "tuning attention %dx%dx%dx%d d=%d %s: %d candidates "
                  "ranked, %d kept",
                  d->batch, d->heads, d->seq_q, d->seq_k, d->head_dim,
                  dtype_name(d->dtype), n, *k);
    }
    free(ranked);
    return st;
}

/* Stage 2 for one problem over sel (o->pre_art may hold precompiled
 * cubins). On success *res owns the winner's cubin. */
static stof_status search_problem(stof_context *ctx,
                                  const stof_attention_desc *d,
                                  const stof_mask *m, const stof_candidate *sel,
                                  int k, const stof_search_opts *o,
                                  uint64_t seed, stof_search_result *res)
{
    stof_gpu_backend *gb = NULL;
    stof_status st = stof__gpu_backend_new(ctx, d, m, seed,
                                           ctx->settings.tuning_reps, &gb);
    if (st != STOF_OK)
        return st;
    stof_search_backend ops = stof__gpu_backend_ops(gb);
    st = stof__search_run(ctx, sel, k, o, &ops, res);
    stof__gpu_backend_free(&gb);
    return st;
}

/* Validate and normalise a problem, compute its key; NO_DEVICE without a
 * GPU. */
static stof_status plan_begin(stof_context *ctx, const stof_attention_desc *d,
                              const stof_mask *m, stof_attention_desc *nd,
                              char mask_hex[33], char key[33])
{
    float scale;
    stof_status st = check_desc(ctx, d, m, &scale);
    if (st != STOF_OK)
        return st;
    if (!ctx->device.ok)
        return stof__fail(ctx, STOF_ERR_NO_DEVICE,
                          "stof_attention_plan needs a GPU: %s",
                          ctx->device.why[0] ? ctx->device.why
                                             : "no usable CUDA device");
    *nd = *d;
    normalise_desc(nd);
    stof_mask_digest(m, NULL, mask_hex);
    stof__attention_key(ctx, nd, mask_hex, key, NULL, 0);
    return STOF_OK;
}

/* Whether candidate c's kernel can run with nd's strides. The key does
 * not name the layout (problem_key.c), so a record tuned with one layout
 * serves others; only the gather kernels limit strides (K/V row offsets
 * in 16-byte units must fit 32 bits), as the cost model does when it
 * ranks them. */
static int kernel_takes_strides(const stof_candidate *c,
                                const stof_attention_desc *nd)
{
    if (c->kind != STOF_KERNEL_ROWWISE && c->kind != STOF_KERNEL_WGMMA_GATHER)
        return 1;
    const int64_t s = nd->k_stride[2] > nd->v_stride[2] ? nd->k_stride[2]
                                                        : nd->v_stride[2];
    return (double)(nd->seq_k - 1) * (double)s / 8.0 < 4294967296.0;
}

/* The search's verification tolerance (relative error). */
#define VERIFY_TOLERANCE 1e-2

/* Check a plan made from a database record on this GPU before its first
 * real use: run it on seeded random inputs for one batch element and up
 * to two heads (the kernel's code is the same for every (batch, head); two
 * heads exercise the head offsets) over the whole sequence, and compare
 * every output row with the reference kernel. 1 when it matches (rel_err
 * within the search's tolerance), else 0 with the reason in why. */
static int verify_here(stof_context *ctx, const stof_plan *p,
                       const stof_mask *m, char *why, size_t n)
{
    stof_attention_desc vd = p->desc;
    vd.batch = 1;
    vd.heads = p->desc.heads < 2 ? p->desc.heads : 2;
    vd.layout = STOF_LAYOUT_BHSD;
    normalise_desc(&vd);
    stof_gpu_backend *gb = NULL;
    stof_status st = stof__gpu_backend_new(ctx, &vd, m, 0x7e57ed5eedull, 1,
                                           &gb);
    if (st != STOF_OK) {
        snprintf(why, n, "the reference could not run: %s",
                 stof_errmsg(ctx));
        return 0;
    }
    /* The plan's kernel, formats and device data, launched for vd: every
     * launch reads batch, heads and strides from the descriptor. */
    stof_plan tmp = *p;
    tmp.desc = vd;
    stof_search_backend ops = stof__gpu_backend_ops(gb);
    double rel = INFINITY;
    char err[256] = "";
    const int failed = ops.verify(ops.user, &tmp, &rel, err, sizeof(err));
    stof__gpu_backend_free(&gb);
    if (failed) {
        snprintf(why, n, "%s", err);
        return 0;
    }
    if (!(rel <= VERIFY_TOLERANCE)) {
        snprintf(why, n, "wrong result: relative error %.3g (tolerance %g)",
                 rel, VERIFY_TOLERANCE);
        return 0;
    }
    return 1;
}

/* Use a record's plan on this host only once it is trusted here (db.h,
 * "Local trust"): verify it at its first use and remember that. Returns
 * 1 when the plan may run; 0 when the record failed (logged; a user
 * database record that fails is deleted, so that tuning can replace it). */
static int trust_record(stof_context *ctx, stof_db *db, stof_plan *p,
                        const stof_mask *m, const stof_db_record *rec)
{
    if (stof__db_trusted(db, rec))
        return 1;
    char why[512];
    const double t0 = now_ms();
    const int ok = verify_here(ctx, p, m, why, sizeof(why));
    p->verify_ms = now_ms() - t0;
    if (ok) {
        stof__db_trust(db, rec);
        stof__log(ctx, STOF_LOG_INFO,
                  "tuning record %s (%s database, made on %s) verified on "
                  "this GPU in %.1f ms",
                  rec->key, rec->source, rec->host, p->verify_ms);
        return 1;
    }
    stof__log(ctx, STOF_LOG_WARN,
              "tuning record %s (%s database, made on %s) failed "
              "verification on this GPU: %s; not used",
              rec->key, rec->source, rec->host, why);
    if (rec->layer == 0)
        stof__db_forget(db, rec->key, rec->content_hash);
    return 0;
}

/* A plan from the database, or NULL (a miss, or an unusable record: logged
 * and treated as a miss). */
static stof_plan *plan_from_db(stof_context *ctx, const stof_attention_desc *nd,
                               const stof_mask *m, const char *key)
{
    stof_db *db = stof__ctx_db(ctx);
    stof_db_record rec;
    if (!db || ctx->settings.tuning_mode == STOF_TUNE_FORCE ||
        stof__db_lookup(db, key, &rec) != STOF_OK)
        return NULL;
    stof_candidate c;
    stof_plan *p = NULL;
    char why[256];
    if (!stof__attention_record_candidate(&rec, &c, why, sizeof(why)))
        stof__log(ctx, STOF_LOG_WARN, "tuning record %s: %s (%s): ignored",
                  key, why, rec.config);
    else if (!kernel_takes_strides(&c, nd))
        stof__log(ctx, STOF_LOG_INFO,
                  "tuning record %s: its %s kernel cannot address these "
                  "strides: planning without it",
                  key, rec.kernel);
    else if (stof__plan_from_cubin(ctx, nd, m, &c, rec.cubin, rec.cubin_size,
                                   &p) != STOF_OK)
        stof__log(ctx, STOF_LOG_WARN,
                  "tuning record %s could not be loaded (%s): ignored", key,
                  stof_errmsg(ctx));
    if (p && !trust_record(ctx, db, p, m, &rec)) {
        plan_release(p);
        p = NULL;
    }
    if (p) {
        p->source = !strcmp(rec.source, "user") ? "user db" : "system db";
        p->time_ms = rec.time_ms;
        p->runner_up_ms = rec.runner_up_ms;
        p->model_ms = rec.model_ms;
        p->n_candidates = rec.n_candidates;
        snprintf(p->key, sizeof(p->key), "%s", key);
    }
    stof__db_record_clear(&rec);
    return p;
}

/* Cache-only mode: record the miss and plan the model's choice. */
static stof_status plan_fallback(stof_context *ctx, const stof_attention_desc *d,
                                 const stof_attention_desc *nd,
                                 const stof_mask *m, const char *mask_hex,
                                 const char *key, stof_plan **out)
{
    stof_db *db = stof__ctx_db(ctx);
    if (db && stof__db_writable(db)) {
        /* Everything `stof-tune pending` needs to plan it again: the
         * problem with its strides, and the mask (spec, and its bits
         * below). Specs never contain quotes or backslashes. */
        char problem[1024];
        const int64_t *st4[4] = {nd->q_stride, nd->k_stride, nd->v_stride,
                                 nd->o_stride};
        snprintf(problem, sizeof(problem),
                 "{\"op\":\"attention\",\"batch\":%d,\"heads\":%d,"
                 "\"seq_q\":%d,\"seq_k\":%d,\"head_dim\":%d,"
                 "\"dtype\":\"%s\",\"layout\":\"%s\",\"scale\":%.9g,"
                 "\"q_s0\":%lld,\"q_s1\":%lld,\"q_s2\":%lld,"
                 "\"k_s0\":%lld,\"k_s1\":%lld,\"k_s2\":%lld,"
                 "\"v_s0\":%lld,\"v_s1\":%lld,\"v_s2\":%lld,"
                 "\"o_s0\":%lld,\"o_s1\":%lld,\"o_s2\":%lld,"
                 "\"mask_spec\":\"%s\",\"mask_digest\":\"%s\"}",
                 nd->batch, nd->heads, nd->seq_q, nd->seq_k, nd->head_dim,
                 dtype_name(nd->dtype), layout_str(nd->layout),
                 (double)nd->scale, (long long)st4[0][0], (long long)st4[0][1],
                 (long long)st4[0][2], (long long)st4[1][0],
                 (long long)st4[1][1], (long long)st4[1][2],
                 (long long)st4[2][0], (long long)st4[2][1],
                 (long long)st4[2][2], (long long)st4[3][0],
                 (long long)st4[3][1], (long long)st4[3][2],
                 m->spec ? m->spec : "", mask_hex);
        if (stof__db_record_miss(db, key, problem, m->bits,
                                 (size_t)m->seq_q * m->words_per_row * 8u) !=
            STOF_OK)
            stof__log(ctx, STOF_LOG_WARN, "could not record the miss: %s",
                      stof_errmsg(ctx));
    }
    stof_status st = stof__attention_plan_kernel(ctx, d, m, NULL, out);
    if (st == STOF_OK) {
        (*out)->source = "fallback";
        snprintf((*out)->key, sizeof((*out)->key), "%s", key);
    }
    return st;
}

/* After a search: store the winner and plan from its cubin (consumed). */
static stof_status plan_tuned(stof_context *ctx, const stof_attention_desc *nd,
                              const stof_mask *m, const char *mask_hex,
                              const char *key, stof_search_result *res,
                              const stof_search_opts *o, uint64_t seed,
                              stof_plan **out)
{
    stof_db *db = stof__ctx_db(ctx);
    if (db && stof__db_writable(db)) {
        stof_db_record rec;
        fill_record(ctx, nd, m, key, mask_hex, res, o, seed, &rec);
        if (stof__db_store(db, &rec,
                           ctx->settings.tuning_mode == STOF_TUNE_FORCE,
                           1) != STOF_OK)
            stof__log(ctx, STOF_LOG_WARN,
                      "could not store the tuning result: %s",
                      stof_errmsg(ctx));
    }
    stof_plan *p = NULL;
    stof_status st = stof__plan_from_cubin(ctx, nd, m, &res->winner,
                                           res->winner_art,
                                           res->winner_art_size, &p);
    free(res->winner_art);
    res->winner_art = NULL;
    if (st != STOF_OK)
        return st;
    p->source = "tuned";
    p->time_ms = res->winner_ms;
    p->runner_up_ms = res->runner_up_ms;
    p->model_ms = res->model_ms;
    p->n_candidates = res->n_timed;
    snprintf(p->key, sizeof(p->key), "%s", key);
    *out = p;
    return STOF_OK;
}

static stof_search_opts search_opts(const stof_context *ctx)
{
    const stof_settings *st = &ctx->settings;
    stof_search_opts o = {.top_k = st->tuning_top_k > 0 ? st->tuning_top_k : 3,
                          .threads = st->compile_threads,
                          .budget_s = st->tuning_budget_s,
                          .tolerance = VERIFY_TOLERANCE};
    return o;
}

#define SEARCH_SEED                                                            \
    (ctx->settings.tuning_seed ? ctx->settings.tuning_seed : 0x5eed0f57ull)

stof_status stof_attention_plan(stof_context *ctx,
                                const stof_attention_desc *d,
                                const stof_mask *m, stof_plan **out)
{
    if (!ctx)
        return STOF_ERR_INVALID_ARGUMENT;
    STOF_CHECK_ARG(ctx, out, "plan (the output pointer) is NULL");
    *out = NULL;
    stof_attention_desc nd;
    char mask_hex[33], key[33];
    stof_status st = plan_begin(ctx, d, m, &nd, mask_hex, key);
    if (st != STOF_OK)
        return st;
    if ((*out = plan_from_db(ctx, &nd, m, key)))
        return stof__ok(ctx);
    if (ctx->settings.tuning_mode == STOF_TUNE_CACHE_ONLY)
        return plan_fallback(ctx, d, &nd, m, mask_hex, key, out);

    stof_search_opts o = search_opts(ctx);
    stof_candidate sel[MAX_SELECTED];
    int k = 0;
    st = select_candidates(ctx, &nd, m, o.top_k, sel, &k);
    if (st == STOF_ERR_UNSUPPORTED) /* no fast kernel: the reference */
        return stof__attention_plan_kernel(ctx, d, m, NULL, out);
    stof_search_result res;
    if (st == STOF_OK)
        st = search_problem(ctx, &nd, m, sel, k, &o, SEARCH_SEED, &res);
    if (st == STOF_OK)
        st = plan_tuned(ctx, &nd, m, mask_hex, key, &res, &o, SEARCH_SEED,
                        out);
    return st == STOF_OK ? stof__ok(ctx) : st;
}

/* The batch warm-up's shared compile: every distinct kernel once. */
typedef struct batch_kernel {
    stof_candidate c;
    int head_dim;
    stof_dtype dtype;
    void *cubin;
    size_t size;
    stof_context *tmp; /* private context: its errmsg holds a failure */
} batch_kernel;

static int same_kernel(const batch_kernel *k, const stof_candidate *c,
                       int head_dim, stof_dtype dt)
{
    return k->c.kind == c->kind && k->head_dim == head_dim &&
           k->dtype == dt && k->c.cfg.block_m == c->cfg.block_m &&
           k->c.cfg.block_n == c->cfg.block_n &&
           k->c.cfg.warps == c->cfg.warps &&
           k->c.cfg.stages == c->cfg.stages &&
           k->c.wcfg.overlap == c->wcfg.overlap &&
           k->c.wcfg.block_m == c->wcfg.block_m;
}

static void batch_compile_one(void *user, int i)
{
    batch_kernel *k = (batch_kernel *)user + i;
    if (k->tmp)
        stof__kernel_compile(k->tmp, &k->c, k->head_dim, k->dtype, &k->cubin,
                             &k->size);
}

stof_status stof_attention_plan_batch(stof_context *ctx, int n,
                                      const stof_attention_desc *descs,
                                      const stof_mask *const *masks,
                                      stof_plan **plans)
{
    if (!ctx)
        return STOF_ERR_INVALID_ARGUMENT;
    STOF_CHECK_ARG(ctx, n >= 0, "n: %d is negative", n);
    STOF_CHECK_ARG(ctx, n == 0 || (descs && masks && plans),
                   "descs, masks and plans must not be NULL");
    for (int i = 0; i < n; i++)
        plans[i] = NULL;
    stof_status first = STOF_OK;
    char first_msg[1024] = "";
#define BATCH_FAIL(i, st)                                                      \
    do {                                                                       \
        if (first == STOF_OK) {                                                \
            first = (st);                                                      \
            snprintf(first_msg, sizeof(first_msg), "problem %d: %s", (i),      \
                     stof_errmsg(ctx));                                        \
        }                                                                      \
    } while (0)

    typedef struct miss {
        int i;
        stof_attention_desc nd;
        char mask_hex[33], key[33];
        stof_candidate sel[MAX_SELECTED];
        int k;
    } miss;
    miss *ms = calloc((size_t)(n > 0 ? n : 1), sizeof(*ms));
    batch_kernel *ks = calloc((size_t)(n > 0 ? n : 1) * MAX_SELECTED,
                              sizeof(*ks));
    if (!ms || !ks) {
        free(ms);
        free(ks);
        return stof__fail(ctx, STOF_ERR_OUT_OF_MEMORY, "out of memory");
    }
    int n_miss = 0, n_k = 0;

    /* Lookups, fallbacks, and stage 1 for the misses. */
    stof_search_opts o = search_opts(ctx);
    for (int i = 0; i < n; i++) {
        miss *x = &ms[n_miss];
        stof_status st = plan_begin(ctx, &descs[i], masks[i], &x->nd,
                                    x->mask_hex, x->key);
        if (st != STOF_OK) {
            BATCH_FAIL(i, st);
            continue;
        }
        if ((plans[i] = plan_from_db(ctx, &x->nd, masks[i], x->key)))
            continue;
        if (ctx->settings.tuning_mode == STOF_TUNE_CACHE_ONLY) {
            st = plan_fallback(ctx, &descs[i], &x->nd, masks[i], x->mask_hex,
                               x->key, &plans[i]);
            if (st != STOF_OK)
                BATCH_FAIL(i, st);
            continue;
        }
        st = select_candidates(ctx, &x->nd, masks[i], o.top_k, x->sel, &x->k);
        if (st == STOF_ERR_UNSUPPORTED) {
            st = stof__attention_plan_kernel(ctx, &descs[i], masks[i], NULL,
                                             &plans[i]);
            if (st != STOF_OK)
                BATCH_FAIL(i, st);
            continue;
        }
        if (st != STOF_OK) {
            BATCH_FAIL(i, st);
            continue;
        }
        x->i = i;
        for (int j = 0; j < x->k; j++) {
            int found = 0;
            for (int t = 0; t < n_k && !found; t++)
                found = same_kernel(&ks[t], &x->sel[j], x->nd.head_dim,
                                    x->nd.dtype);
            if (!found) {
                ks[n_k].c = x->sel[j];
                ks[n_k].head_dim = x->nd.head_dim;
                ks[n_k].dtype = x->nd.dtype;
                if ((ks[n_k].tmp = calloc(1, sizeof(stof_context)))) {
                    ks[n_k].tmp->api = ctx->api;
                    ks[n_k].tmp->device = ctx->device;
                }
                n_k++;
            }
        }
        n_miss++;
    }

    /* Every distinct kernel of every miss, compiled in one pool. */
    if (n_k > 0) {
        stof__log(ctx, STOF_LOG_INFO,
                  "batch warm-up: %d problems to tune, %d distinct kernels",
                  n_miss, n_k);
        stof__pool_run(ctx->settings.compile_threads, n_k, batch_compile_one,
                       ks);
    }

    /* Stage 2 per miss, on the precompiled kernels. */
    for (int x = 0; x < n_miss; x++) {
        miss *mm = &ms[x];
        void *pre[MAX_SELECTED] = {0};
        size_t pre_size[MAX_SELECTED] = {0};
        for (int j = 0; j < mm->k; j++)
            for (int t = 0; t < n_k; t++)
                if (same_kernel(&ks[t], &mm->sel[j], mm->nd.head_dim,
                                mm->nd.dtype)) {
                    pre[j] = ks[t].cubin; /* NULL if it failed: recompiled,
                                             and the failure reported */
                    pre_size[j] = ks[t].size;
                    break;
                }
        stof_search_opts po = o;
        po.pre_art = pre;
        po.pre_size = pre_size;
        stof_search_result res;
        const stof_mask *m = masks[mm->i];
        stof_status st = search_problem(ctx, &mm->nd, m, mm->sel, mm->k, &po,
                                        SEARCH_SEED, &res);
        if (st == STOF_OK)
            st = plan_tuned(ctx, &mm->nd, m, mm->mask_hex, mm->key, &res, &po,
                            SEARCH_SEED, &plans[mm->i]);
        if (st != STOF_OK)
            BATCH_FAIL(mm->i, st);
    }
    for (int t = 0; t < n_k; t++) {
        free(ks[t].cubin);
        free(ks[t].tmp);
    }
    free(ks);
    free(ms);
#undef BATCH_FAIL
    if (first != STOF_OK)
        return stof__fail(ctx, first, "%s", first_msg);
    return stof__ok(ctx);
}

static stof_status plan_fail(stof_plan *p, stof_status st, const char *fmt,
                             const char *arg)
{
    snprintf(p->errmsg, sizeof(p->errmsg), fmt, arg);
    return st;
}

stof_status stof_attention_run(stof_plan *p, const void *q, const void *k,
                               const void *v, void *o, void *stream)
{
    if (!p)
        return STOF_ERR_INVALID_ARGUMENT;
    const void *ptrs[4] = {q, k, v, o};
    static const char *const names[4] = {"q", "k", "v", "o"};
    for (int i = 0; i < 4; i++) {
        if (!ptrs[i])
            return plan_fail(p, STOF_ERR_INVALID_ARGUMENT,
                             "stof_attention_run: %s is NULL", names[i]);
        if ((uintptr_t)ptrs[i] % 16u)
            return plan_fail(p, STOF_ERR_INVALID_ARGUMENT,
                             "stof_attention_run: %s is not 16-byte aligned",
                             names[i]);
    }
    const stof_api *api = p->ctx->api;
    CUcontext pctx = p->ctx->device.pctx;
    CUresult r = api->cuCtxPushCurrent(pctx);
    if (r != CUDA_SUCCESS)
        return plan_fail(p, STOF_ERR_CUDA, "stof_attention_run: %s",
                         "cannot make the device's primary context current");
    stof_status st = STOF_OK;
    if (p->kind == STOF_KERNEL_WGMMA) {
        st = stof__wgmma_launch(p->fn, &p->wcfg, p->desc.head_dim, &p->desc,
                                p->scale, &p->bf, p->d_row_order,
                                (CUdeviceptr)(uintptr_t)q,
                                (CUdeviceptr)(uintptr_t)k,
                                (CUdeviceptr)(uintptr_t)v,
                                (CUdeviceptr)(uintptr_t)o, (CUstream)stream, api);
    } else if (p->kind == STOF_KERNEL_WGMMA_GATHER) {
        st = stof__wgmma_gather_launch(
            p->fn, &p->wcfg, p->desc.head_dim, &p->desc, p->scale, &p->rf,
            p->d_row_order, p->d_q_rows, (CUdeviceptr)(uintptr_t)q,
            (CUdeviceptr)(uintptr_t)k, (CUdeviceptr)(uintptr_t)v,
            (CUdeviceptr)(uintptr_t)o, (CUstream)stream, api);
    } else if (p->kind == STOF_KERNEL_ROWWISE) {
        st = stof__rowwise_launch_qperm(
            p->fn, &p->cfg, p->desc.head_dim, &p->desc, p->scale, &p->rf,
            p->d_q_rows, (CUdeviceptr)(uintptr_t)q, (CUdeviceptr)(uintptr_t)k,
            (CUdeviceptr)(uintptr_t)v, (CUdeviceptr)(uintptr_t)o,
            (CUstream)stream, api);
    } else if (p->kind == STOF_KERNEL_BLOCK) {
        st = stof__block_launch(p->fn, &p->cfg, p->desc.head_dim, &p->desc,
                                p->scale, &p->bf, (CUdeviceptr)(uintptr_t)q,
                                (CUdeviceptr)(uintptr_t)k,
                                (CUdeviceptr)(uintptr_t)v,
                                (CUdeviceptr)(uintptr_t)o, (CUstream)stream, api);
    } else {
        stof_attn_params prm;
        memset(&prm, 0, sizeof(prm));
        prm.q = (CUdeviceptr)(uintptr_t)q;
        prm.k = (CUdeviceptr)(uintptr_t)k;
        prm.v = (CUdeviceptr)(uintptr_t)v;
        prm.o = (CUdeviceptr)(uintptr_t)o;
        prm.mask_bits = p->d_mask;
        memcpy(prm.q_stride, p->desc.q_stride, sizeof(prm.q_stride));
        memcpy(prm.k_stride, p->desc.k_stride, sizeof(prm.k_stride));
        memcpy(prm.v_stride, p->desc.v_stride, sizeof(prm.v_stride));
        memcpy(prm.o_stride, p->desc.o_stride, sizeof(prm.o_stride));
        prm.batch = p->desc.batch;
        prm.heads = p->desc.heads;
        prm.seq_q = p->desc.seq_q;
        prm.seq_k = p->desc.seq_k;
        prm.mask_words = p->mask_words;
        prm.scale = p->scale;
        void *args[] = {&prm};
        r = api->cuLaunchKernel(p->fn, p->grid[0], p->grid[1], p->grid[2],
                                p->block[0], p->block[1], p->block[2], 0,
                                (CUstream)stream, args, NULL);
        if (r != CUDA_SUCCESS)
            st = STOF_ERR_CUDA;
    }
    CUcontext popped;
    api->cuCtxPopCurrent(&popped);
    if (st != STOF_OK) {
        const char *name = NULL;
        if (r == CUDA_SUCCESS || !api->cuGetErrorName ||
            api->cuGetErrorName(r, &name) != CUDA_SUCCESS)
            name = stof_status_str(st);
        return plan_fail(p, st, "stof_attention_run: kernel launch failed: %s",
                         name);
    }
    p->errmsg[0] = '\0';
    return STOF_OK;
}

const char *stof_plan_errmsg(const stof_plan *p)
{
    return p ? p->errmsg : "plan is NULL";
}

stof_status stof_plan_describe(const stof_plan *p, char *buf, size_t n,
                               size_t *needed)
{
    if (!p)
        return STOF_ERR_INVALID_ARGUMENT;
    const stof_attention_desc *d = &p->desc;
    static const char *const layouts[] = {"BHSD", "BSHD", "strided"};
    const char *dt = d->dtype == STOF_DTYPE_FP16 ? "fp16" : "bf16";
    stof_str s = {0};
    stof__str_printf(&s, "{\"op\":\"attention\",\"kernel\":\"%s\",",
                     kind_name(p->kind));
    if (p->kind == STOF_KERNEL_REFERENCE)
        stof__str_printf(&s,
                         "\"template\":\"attn_reference.cu\",\"params\":{"
                         "\"HEAD_DIM\":%d,\"DTYPE\":\"%s\",\"WARPS\":%d},",
                         d->head_dim, dt, REF_WARPS);
    else if (p->kind >= STOF_KERNEL_WGMMA)
        stof__str_printf(&s,
                         "\"template\":\"attn_wgmma.cu\",\"params\":{"
                         "\"HEAD_DIM\":%d,\"DTYPE\":\"%s\",\"BLOCK_M\":%d,"
                         "\"BLOCK_N\":%d,\"STAGES\":%d,\"OVERLAP\":%d,"
                         "\"GATHER\":%d,\"ROW_GROUP\":%d},",
                         d->head_dim, dt, stof__wgmma_block_m(&p->wcfg),
                         p->wcfg.block_n, p->wcfg.stages, p->wcfg.overlap,
                         p->wcfg.gather, p->group > 1 ? p->group : 1);
    else
        stof__str_printf(&s,
                         "\"template\":\"attn_block.cu\",\"params\":{"
                         "\"HEAD_DIM\":%d,\"DTYPE\":\"%s\",\"BLOCK_M\":%d,"
                         "\"BLOCK_N\":%d,\"WARPS\":%d,\"STAGES\":%d,"
                         "\"GATHER\":%d,\"ROW_GROUP\":%d},",
                         d->head_dim, dt, p->cfg.block_m, p->cfg.block_n,
                         p->cfg.warps, p->cfg.stages, p->cfg.gather,
                         p->group > 1 ? p->group : 1);
    stof__str_printf(
        &s,
        "\"source\":\"%s\",\"key\":\"%s\",\"arch\":\"%s\","
        "\"problem\":{\"batch\":%d,\"heads\":%d,\"seq_q\":%d,\"seq_k\":%d,"
        "\"head_dim\":%d,\"dtype\":\"%s\",\"layout\":\"%s\",\"scale\":%.9g},"
        "\"mask\":{\"digest\":\"%s\",\"density\":%.6f},"
        "\"template_hash\":\"%016llx\",\"candidates\":%d,"
        "\"predicted_ms\":%.6g,\"compile_ms\":%.3f,\"load_ms\":%.3f,"
        "\"verify_ms\":%.3f,",
        p->source ? p->source : "compiled", p->key, p->arch, d->batch,
        d->heads, d->seq_q, d->seq_k, d->head_dim, dt, layouts[d->layout],
        (double)p->scale, p->mask_hex, p->mask_density,
        (unsigned long long)stof_template_hash(), p->n_candidates,
        p->predicted_ms, p->compile_ms, p->load_ms, p->verify_ms);
    if (p->time_ms > 0)
        stof__str_printf(&s,
                         "\"time_ms\":%.6g,\"runner_up_ms\":%.6g,"
                         "\"model_choice_ms\":%.6g}",
                         p->time_ms, p->runner_up_ms, p->model_ms);
    else
        stof__str_printf(&s, "\"time_ms\":null}");
    stof_status st = stof__str_out(&s, buf, n, needed);
    stof__str_free(&s);
    return st;
}

void stof_plan_free(stof_plan **pp)
{
    if (!pp || !*pp)
        return;
    plan_release(*pp);
    *pp = NULL;
}
