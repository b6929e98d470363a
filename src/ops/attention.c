/*
 * attention.c - attention descriptors and the plan object: checking a
 * descriptor, preparing a plan's device data (formats, mask bits), loading
 * its kernel. A plan owns everything a launch needs on the device so that
 * a run (attention_run.c) only checks its arguments and enqueues its
 * kernels (attention_launch.c). How a plan's kernel is chosen (the
 * database, the search) is in attention_plan.c; its description in
 * attention_describe.c.
 */
#include "attention_int.h"

#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>


_Static_assert(sizeof(stof_attention_desc) == 192 &&
                   offsetof(stof_attention_desc, softcap) == 132 &&
                   offsetof(stof_attention_desc, alibi_slopes) == 136 &&
                   offsetof(stof_attention_desc, bias_stride) == 144 &&
                   offsetof(stof_attention_desc, bias) == 168,
               "stof_attention_desc keeps its size and layout (the Python "
               "binding mirrors it)");

static int all_zero(const uint8_t *p, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (p[i])
            return 0;
    return 1;
}


static void set_layout_strides(int64_t st[3], stof_layout layout, int heads,
                               int seq, int head_dim)
{
    if (layout == STOF_LAYOUT_BHSD) {
        st[2] = head_dim;
        st[1] = (int64_t)seq * head_dim;
        st[0] = (int64_t)heads * seq * head_dim;
    } else if (layout == STOF_LAYOUT_PACKED) {
        st[2] = (int64_t)heads * head_dim;
        st[1] = head_dim;
        st[0] = 0; /* sequences start where cu_seqlens say */
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
    if (layout != STOF_LAYOUT_BHSD && layout != STOF_LAYOUT_BSHD &&
        layout != STOF_LAYOUT_PACKED)
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
stof_status stof__attention_check_desc(stof_context *ctx,
                                       const stof_attention_desc *d,
                                       const stof_mask *m, float *scale)
{
    STOF_CHECK_ARG(ctx, d, "desc is NULL");
    STOF_CHECK_ARG(ctx, m, "mask is NULL");
    stof_status st = stof__attention_check_problem(ctx, d, scale);
    if (st != STOF_OK)
        return st;
    STOF_CHECK_ARG(ctx, d->seq_q == m->seq_q && d->seq_k == m->seq_k,
                   "mask is %d x %d but desc.seq_q x desc.seq_k is %d x %d",
                   m->seq_q, m->seq_k, d->seq_q, d->seq_k);
    return STOF_OK;
}

stof_status stof__attention_shape_check(stof_context *ctx, int batch,
                                        int heads, int kv_heads, int seq_q,
                                        int seq_k, int head_dim,
                                        stof_dtype dt)
{
    stof_attention_desc d;
    if (stof_attention_desc_init(&d, batch, heads, seq_q, seq_k, head_dim, dt,
                                 STOF_LAYOUT_BHSD) != STOF_OK)
        return stof__fail(ctx, STOF_ERR_INVALID_ARGUMENT,
                          "%d x %d heads of %d x %d x %d: sizes out of range",
                          batch, heads, seq_q, seq_k, head_dim);
    d.kv_heads = kv_heads;
    float scale;
    return stof__attention_check_problem(ctx, &d, &scale);
}

stof_status stof__attention_check_problem(stof_context *ctx,
                                          const stof_attention_desc *d,
                                          float *scale)
{
    STOF_CHECK_ARG(ctx, d, "desc is NULL");
    STOF_CHECK_ARG(ctx, all_zero(d->reserved, sizeof(d->reserved)),
                   "desc: reserved bytes are not zero (fill it with "
                   "stof_attention_desc_init() or memset it first)");
    STOF_CHECK_ARG(ctx, d->batch >= 1 && d->batch <= 65535,
                   "desc.batch: %d is outside 1..65535", d->batch);
    STOF_CHECK_ARG(ctx, d->heads >= 1 && d->heads <= 4096,
                   "desc.heads: %d is outside 1..4096", d->heads);
    STOF_CHECK_ARG(ctx, d->seq_q >= 1, "desc.seq_q: %d is not positive",
                   d->seq_q);
    /* The kernels' grids hold a CTA per (row block, batch, head) in x (at
     * most 2^31 - 1; the reference kernel's row blocks are 4 rows). */
    STOF_CHECK_ARG(ctx,
                   (int64_t)d->batch * d->heads *
                           (((int64_t)d->seq_q + 3) / 4) <=
                       INT32_MAX,
                   "desc.batch %d x desc.heads %d x seq_q %d: more query "
                   "rows than one launch takes (batch * heads * seq_q / 4 "
                   "at most 2^31 - 1)",
                   d->batch, d->heads, d->seq_q);
    STOF_CHECK_ARG(ctx, d->seq_k >= 1, "desc.seq_k: %d is not positive",
                   d->seq_k);
    STOF_CHECK_ARG(ctx,
                   d->head_dim >= 16 && d->head_dim <= 256 &&
                       d->head_dim % 8 == 0,
                   "desc.head_dim: %d is not a multiple of 8 in 16..256",
                   d->head_dim);
    STOF_CHECK_ARG(ctx,
                   d->dtype == STOF_DTYPE_FP16 || d->dtype == STOF_DTYPE_BF16,
                   "desc.dtype: %d is not a stof_dtype", (int)d->dtype);
    STOF_CHECK_ARG(ctx, d->layout != STOF_LAYOUT_PACKED,
                   "desc.layout: STOF_LAYOUT_PACKED is planned by "
                   "stof_attention_plan_family (its sequences are a mask "
                   "family's instance)");
    STOF_CHECK_ARG(ctx,
                   d->layout == STOF_LAYOUT_BHSD ||
                       d->layout == STOF_LAYOUT_BSHD ||
                       d->layout == STOF_LAYOUT_STRIDED,
                   "desc.layout: %d is not a stof_layout", (int)d->layout);
    STOF_CHECK_ARG(ctx, isfinite(d->scale),
                   "desc.scale: %g is not finite", (double)d->scale);
    STOF_CHECK_ARG(ctx,
                   d->softcap == 0.0f ||
                       (d->softcap > 0.0f && isfinite(d->softcap) &&
                        isfinite(1.0f / d->softcap)),
                   "desc.softcap: %g is not 0 (no soft-cap) or a finite "
                   "value > 0 whose inverse is finite",
                   (double)d->softcap);
    for (int h = 0; d->alibi_slopes && h < d->heads; h++)
        STOF_CHECK_ARG(ctx, isfinite(d->alibi_slopes[h]),
                       "desc.alibi_slopes[%d]: %g is not finite", h,
                       (double)d->alibi_slopes[h]);
    STOF_CHECK_ARG(ctx, d->bias == 0 || d->bias == 1,
                   "desc.bias: %d is not 0 (none) or 1 (an additive bias "
                   "tensor)",
                   d->bias);
    for (int i = 0; i < 3; i++) {
        STOF_CHECK_ARG(ctx, d->bias || d->bias_stride[i] == 0,
                       "desc.bias_stride[%d]: %lld is set but desc.bias is "
                       "0 (set bias = 1 to add the bias tensor)",
                       i, (long long)d->bias_stride[i]);
        STOF_CHECK_ARG(ctx,
                       d->bias_stride[i] >= 0 && d->bias_stride[i] % 8 == 0,
                       "desc.bias_stride[%d]: %lld is not a multiple of 8 "
                       "elements >= 0 (0 broadcasts)",
                       i, (long long)d->bias_stride[i]);
    }
    STOF_CHECK_ARG(ctx,
                   !d->bias || extent(d->bias_stride, d->batch, d->heads,
                                      d->seq_q, d->seq_k) > 0,
                   "desc.bias_stride: the bias tensor's extent overflows 64 "
                   "bits");
    STOF_CHECK_ARG(ctx,
                   d->kv_heads == 0 ||
                       (d->kv_heads >= 1 && d->kv_heads <= d->heads &&
                        d->heads % d->kv_heads == 0),
                   "desc.kv_heads: %d does not divide heads = %d (0 = heads)",
                   d->kv_heads, d->heads);
    const int kvh = d->kv_heads > 0 ? d->kv_heads : d->heads;
    stof_status st;
    if ((st = check_strides(ctx, "q", d->q_stride, d->batch, d->heads,
                            d->seq_q, d->head_dim)) ||
        (st = check_strides(ctx, "k", d->k_stride, d->batch, kvh,
                            d->seq_k, d->head_dim)) ||
        (st = check_strides(ctx, "v", d->v_stride, d->batch, kvh,
                            d->seq_k, d->head_dim)) ||
        (st = check_strides(ctx, "o", d->o_stride, d->batch, d->heads,
                            d->seq_q, d->head_dim)))
        return st;
    const float sc = d->scale != 0.0f ? d->scale : 1.0f / sqrtf((float)d->head_dim);
    /* The kernels fold log2(e) (and 1 / softcap) into these constants: each
     * product must stay finite, or a score would be inf * 0 = NaN. */
    const float l2e = 1.4426950408889634f;
    STOF_CHECK_ARG(ctx, isfinite(sc * l2e),
                   "desc.scale: %g overflows fp32 once multiplied by log2(e)",
                   (double)sc);
    STOF_CHECK_ARG(ctx,
                   d->softcap == 0.0f ||
                       (isfinite(d->softcap * l2e) && isfinite(sc / d->softcap)),
                   "desc.softcap: %g with scale %g overflows fp32 in the "
                   "kernels' constants (softcap * log2(e), scale / softcap)",
                   (double)d->softcap, (double)sc);
    for (int h = 0; d->alibi_slopes && h < d->heads; h++)
        STOF_CHECK_ARG(ctx, isfinite(d->alibi_slopes[h] * l2e),
                       "desc.alibi_slopes[%d]: %g overflows fp32 once "
                       "multiplied by log2(e)",
                       h, (double)d->alibi_slopes[h]);
    *scale = sc;
    return STOF_OK;
}

stof_status stof__attention_check_ready(stof_context *ctx,
                                        const stof_attention_desc *d,
                                        const stof_mask *m, float *scale)
{
    stof_status st = stof__attention_check_desc(ctx, d, m, scale);
    if (st != STOF_OK)
        return st;
    if (!ctx->device.ok)
        return stof__fail(ctx, STOF_ERR_NO_DEVICE,
                          "stof_attention_plan needs a GPU: %s",
                          ctx->device.why[0] ? ctx->device.why
                                             : "no usable CUDA device");
    return STOF_OK;
}

/* The effective descriptor: for BHSD/BSHD the strides follow the layout,
 * whatever the fields held. */
void stof__attention_normalise(stof_attention_desc *d)
{
    /* kv_heads equal to heads is the same problem as 0. */
    if (d->kv_heads == d->heads)
        d->kv_heads = 0;
    const int kvh = d->kv_heads > 0 ? d->kv_heads : d->heads;
    if (d->layout == STOF_LAYOUT_PACKED && d->kv_heads > 0) {
        /* K/V rows of stof_attention_desc_init's packed strides hold
         * kv_heads heads (strides set otherwise are the caller's). */
        const int64_t dflt = (int64_t)d->heads * d->head_dim;
        if (d->k_stride[2] == dflt && d->k_stride[1] == d->head_dim)
            d->k_stride[2] = (int64_t)kvh * d->head_dim;
        if (d->v_stride[2] == dflt && d->v_stride[1] == d->head_dim)
            d->v_stride[2] = (int64_t)kvh * d->head_dim;
    }
    if (d->layout == STOF_LAYOUT_STRIDED || d->layout == STOF_LAYOUT_PACKED)
        return;
    set_layout_strides(d->q_stride, d->layout, d->heads, d->seq_q,
                       d->head_dim);
    set_layout_strides(d->o_stride, d->layout, d->heads, d->seq_q,
                       d->head_dim);
    set_layout_strides(d->k_stride, d->layout, kvh, d->seq_k, d->head_dim);
    set_layout_strides(d->v_stride, d->layout, kvh, d->seq_k, d->head_dim);
}

int stof__kv_group(const stof_attention_desc *d)
{
    return d->kv_heads > 0 ? d->heads / d->kv_heads : 1;
}

void stof__plan_release(stof_plan *p)
{
    if (!p)
        return;
    const stof_api *api = p->ctx->api;
    if (p->family) {
        memset(&p->bf, 0, sizeof(p->bf)); /* a view of mb_ws */
        stof__mb_workspace_free(p->ctx, &p->mb_ws);
        stof__mb_unload(p->ctx, &p->mb_k);
    }
    if (p->fmt_ref) { /* the context's shared format: released */
        if (p->order_shared)
            stof__fmtcache_release_array(p->ctx, p->fmt_ref, p->d_row_order);
        if (p->sched_shared)
            stof__fmtcache_release_array(p->ctx, p->fmt_ref, p->d_sched);
        stof__fmtcache_unref(p->ctx, p->fmt_ref);
        memset(&p->bf, 0, sizeof(p->bf));
    }
    stof__block_format_free(p->ctx, &p->bf);
    stof__rowwise_format_free(p->ctx, &p->rf);
    if ((p->d_mask || p->module || p->d_row_order || p->d_q_rows ||
         p->d_split || p->d_alibi || p->d_sched) &&
        stof__ctx_push(p->ctx) == STOF_OK) {
        if (p->d_sched && !p->sched_shared)
            api->cuMemFree(p->d_sched);
        if (p->d_mask)
            api->cuMemFree(p->d_mask);
        if (p->d_alibi)
            api->cuMemFree(p->d_alibi);
        if (p->d_split)
            api->cuMemFree(p->d_split);
        if (p->d_q_rows)
            api->cuMemFree(p->d_q_rows);
        if (p->d_row_order && !p->order_shared)
            api->cuMemFree(p->d_row_order);
        stof__module_release(p->ctx, p->module);
        stof__ctx_pop(p->ctx);
    }
    free(p->alibi_host);
    free(p);
}

const char *stof__kernel_kind_name(int kind)
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
        char buf[STOF_MB_N_LEAF_DEFINES + 2][48];
        const char *defs[STOF_MB_N_LEAF_DEFINES + 2];
        const int n = stof__mb_leaf_defines(buf, defs);
        snprintf(buf[n], 48, "HEAD_DIM=%d", head_dim);
        snprintf(buf[n + 1], 48, "DTYPE=%d", (int)dt);
        defs[n] = buf[n];
        defs[n + 1] = buf[n + 1];
        return (stof_status)stof__jit_compile(ctx, "attn_reference.cu", defs,
                                              n + 2, NULL, cubin, size);
    }
    case STOF_KERNEL_BLOCK:
    case STOF_KERNEL_ROWWISE: {
        stof_block_cfg cfg = c->cfg;
        cfg.gather = c->kind == STOF_KERNEL_ROWWISE;
        cfg.split = c->splits > 1;
        return stof__block_compile(ctx, head_dim, dt, &cfg, NULL, cubin, size);
    }
    case STOF_KERNEL_WGMMA:
    case STOF_KERNEL_WGMMA_GATHER: {
        stof_wgmma_cfg wc = c->wcfg;
        wc.gather = c->kind == STOF_KERNEL_WGMMA_GATHER;
        wc.split = c->splits > 1;
        return stof__wgmma_compile(ctx, head_dim, dt, &wc, cubin, size);
    }
    default:
        return stof__fail(ctx, STOF_ERR_UNSUPPORTED,
                          "kernel kind %d is not available", c->kind);
    }
}

/* Load a cubin into the plan: module, function, its shared memory limit
 * and, for the reference kernel, the launch shape. */
stof_status stof__plan_attach(stof_context *ctx, stof_plan *p,
                              const void *cubin, size_t size, uint64_t hash)
{
    const double t0 = stof__now_ms();
    stof_status st;
    switch (p->kind) {
    /* Through the context's module cache: a plan made again (or another
     * plan of the same kernel) shares the module (stof__module_release at
     * the plan's free). */
    case STOF_KERNEL_BLOCK:
    case STOF_KERNEL_ROWWISE:
        st = stof__block_load_cubin_shared(ctx, p->desc.head_dim, &p->cfg,
                                           cubin, size, hash, &p->module,
                                           &p->fn);
        break;
    case STOF_KERNEL_WGMMA:
    case STOF_KERNEL_WGMMA_GATHER:
        st = stof__wgmma_load_cubin_shared(ctx, p->desc.head_dim, &p->wcfg,
                                           cubin, size, hash, &p->module,
                                           &p->fn);
        break;
    default:
        st = (stof_status)stof__module_load_shared_hashed(
            ctx, cubin, size, hash, "stof_attn_reference", 0, &p->module,
            &p->fn);
        p->block[0] = 32 * REF_WARPS;
        p->block[1] = p->block[2] = 1;
        /* (row blocks times batch * heads in x: stof_cta_rb_bh) */
        p->grid[0] = (unsigned)((p->desc.seq_q + REF_WARPS - 1) / REF_WARPS *
                                p->desc.batch * p->desc.heads);
        p->grid[1] = 1;
        p->grid[2] = 1;
        break;
    }
    if (st == STOF_OK)
        st = stof__plan_split_prepare(ctx, p);
    p->load_ms = stof__now_ms() - t0;
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

/* What a persistent wgmma launch's schedule on a given format depends on
 * besides the format (stof__wgmma_format_persist_heads / _list): the
 * (batch, head)s, the K/V group, the lengths, head_dim, the kernel's
 * configuration (its CTAs an SM) and the device's SMs and L2. */
static void sched_key_of(const stof_context *ctx, const stof_plan *p,
                         int32_t key[STOF_FMTCACHE_KEY])
{
    const stof_wgmma_cfg *c = &p->wcfg;
    const int32_t k[STOF_FMTCACHE_KEY] = {
        2, /* a schedule (1: the row order) */
        p->desc.batch, p->desc.heads, stof__kv_group(&p->desc),
        p->desc.seq_q, p->desc.seq_k, p->desc.head_dim,
        c->block_n, c->stages, c->overlap, c->gather, c->block_m, c->split,
        c->persist, c->mods,
        ctx->device.sm_count, ctx->device.l2_bytes};
    memcpy(key, k, sizeof(k));
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
    const int bm = wg ? stof__wgmma_format_block_m(&p->wcfg) : p->cfg.block_m;
    const int bn = wg ? p->wcfg.block_n : p->cfg.block_n;
    const int rows192 = wg && stof__wgmma_block_m(&p->wcfg) == 192;
    stof_status st = STOF_OK;
    stof_mask *grouped = NULL;
    int32_t *perm = NULL, *order = NULL;
    stof_format *f = NULL;
    /* Where a first plan of a size spends its time (debug log): the
     * format, the row order, the persistent schedule. */
    double t_fmt = stof__now_ms(), t_order = 0.0, t_sched = 0.0, t_deal = 0.0;
    int fmt_hit = 0;
    /* The block format of these mask bits and tiles, if a plan of this
     * context built it before (format_cache.c): shared, not rebuilt. */
    const int cacheable = !rowwise && p->group <= 1;
    if (cacheable &&
        (p->fmt_ref = stof__fmtcache_get(ctx, p->mask_hex, m->seq_q,
                                         m->seq_k, bm, bn, &p->bf,
                                         &p->formats_gpu, wg ? &f : NULL))) {
        fmt_hit = 1;
        if (!wg)
            goto done;
        goto order;
    }
    if (m->spec) {
        /* A spec the GPU evaluates: its formats built there (tens of
         * microseconds), not from the bits on the host (milliseconds). */
        const int g = p->group > 1 ? p->group : 1;
        st = rowwise ? stof__spec_rowwise_format_gpu(ctx, m->spec, m->seq_q,
                                                     m->seq_k, bm, bn, g,
                                                     &p->rf, wg ? &f : NULL)
                     : stof__spec_block_format_gpu(
                           ctx, m->spec, m->seq_q, m->seq_k, bm, bn, &p->bf,
                           wg || cacheable ? &f : NULL);
        if (st == STOF_OK && g > 1) {
            /* The query row of each format row, by residue class. */
            if (!(perm = malloc(sizeof(int32_t) * (size_t)m->seq_q)))
                st = stof__fail(ctx, STOF_ERR_OUT_OF_MEMORY, "out of memory");
            for (int r = 0, n = 0; st == STOF_OK && r < g; r++)
                for (int q = r; q < m->seq_q; q += g)
                    perm[n++] = q;
            if (st == STOF_OK)
                st = upload_i32(ctx, perm, (size_t)m->seq_q, &p->d_q_rows,
                                "uploading the query row order");
            if (st != STOF_OK)
                goto done;
        }
        p->formats_gpu = st == STOF_OK;
        if (st == STOF_OK && cacheable)
            p->fmt_ref = stof__fmtcache_put(ctx, p->mask_hex, m->seq_q,
                                            m->seq_k, bm, bn, &p->bf, 1, f);
        if (st == STOF_OK && !wg)
            goto done;
        if (st == STOF_OK)
            goto order;
        /* Not evaluated there, or a GPU failure (say, the worst-case pool
         * does not fit): the host builds it, as for any mask. */
        stof__rowwise_format_free(ctx, &p->rf);
        stof__block_format_free(ctx, &p->bf);
        st = STOF_OK;
    }
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
    if (st == STOF_OK && cacheable)
        p->fmt_ref = stof__fmtcache_put(ctx, p->mask_hex, m->seq_q, m->seq_k,
                                        bm, bn, &p->bf, 0, f);
    if (st != STOF_OK || !wg)
        goto done;
order:
    if (rows192) {
        /* 192-row CTAs read row block 3 rb of the 64-row format: only
         * where its three row blocks list the same full tiles; no row
         * order (they all weigh the same). */
        const int64_t nt = f->row_ptr[f->n_row_blocks];
        if (!f->col_idx && nt > 0 && p->bf.col_idx && p->bf.n_tiles == nt &&
            !stof__wgmma_uniform_triples(f)) {
            /* Built on the GPU (f holds the counts, which did not decide):
             * its key blocks. */
            if (!(f->col_idx = malloc(sizeof(int32_t) * (size_t)nt))) {
                st = stof__fail(ctx, STOF_ERR_OUT_OF_MEMORY, "out of memory");
                goto done;
            }
            if ((st = stof__ctx_push(ctx)) != STOF_OK)
                goto done;
            const CUresult r = ctx->api->cuMemcpyDtoH(
                f->col_idx, p->bf.col_idx, sizeof(int32_t) * (size_t)nt);
            stof__ctx_pop(ctx);
            if (r != CUDA_SUCCESS) {
                st = (stof_status)stof__cuda_fail(ctx, r,
                                                  "reading the format's tiles",
                                                  __FILE__, __LINE__);
                goto done;
            }
        }
        if (p->group > 1 || !stof__wgmma_uniform_triples(f)) {
            st = stof__fail(ctx, STOF_ERR_UNSUPPORTED,
                            "wgmma block_m 192 needs a mask whose every "
                            "three 64-row blocks list the same full tiles "
                            "(a dense mask); this one does not");
            goto done;
        }
        if (p->wcfg.persist)
            p->persist_heads = stof__wgmma_format_persist_heads(
                &ctx->device, &p->desc, &p->wcfg, f);
        goto done;
    }
    /* The row order depends on the format alone, a persistent launch's
     * schedule also on the problem's (batch, head)s and the launch: with a
     * shared format both are made once and kept with it. */
    t_fmt = stof__now_ms() - t_fmt;
    t_order = stof__now_ms();
    const int share = p->fmt_ref && !rowwise;
    const int persist = !rowwise && p->wcfg.persist;
    int32_t order_key[STOF_FMTCACHE_KEY] = {1}, sched_key[STOF_FMTCACHE_KEY];
    sched_key_of(ctx, p, sched_key);
    if (share &&
        (p->d_row_order = stof__fmtcache_find_array(ctx, p->fmt_ref,
                                                    order_key, NULL)))
        p->order_shared = 1;
    if (persist)
        p->sched_items = (int64_t)f->n_row_blocks * p->desc.batch *
                         p->desc.heads;
    int32_t heads = 0;
    if (share && persist &&
        (p->d_sched = stof__fmtcache_find_array(ctx, p->fmt_ref, sched_key,
                                                &heads))) {
        p->sched_shared = 1;
        p->persist_heads = heads;
    }
    if (!p->d_row_order) {
        if (!(order = malloc(sizeof(int32_t) * (size_t)f->n_row_blocks))) {
            st = stof__fail(ctx, STOF_ERR_OUT_OF_MEMORY,
                            "out of memory ordering row blocks");
            goto done;
        }
        if (rowwise)
            stof__wgmma_gather_row_order(f, order);
        else
            stof__wgmma_row_order(f, order);
        st = upload_i32(ctx, order, (size_t)f->n_row_blocks,
                        &p->d_row_order, "uploading the row order");
        if (st == STOF_OK && share)
            p->order_shared = (unsigned char)stof__fmtcache_keep_array(
                ctx, p->fmt_ref, order_key, p->d_row_order,
                sizeof(int32_t) * (size_t)f->n_row_blocks, 0);
    }
    t_order = stof__now_ms() - t_order;
    t_sched = stof__now_ms();
    if (st == STOF_OK && persist && !p->sched_shared) {
        p->persist_heads = stof__wgmma_format_persist_heads(
            &ctx->device, &p->desc, &p->wcfg, f);
        /* The items dealt on the host, each to the least loaded CTA (else
         * the kernel's own deal, persist_heads). */
        size_t nl = 0;
        int32_t *list = stof__wgmma_format_persist_list(
            &ctx->device, &p->desc, &p->wcfg, f, &nl);
        t_deal = stof__now_ms() - t_sched;
        if (list)
            st = upload_i32(ctx, list, nl, &p->d_sched,
                            "uploading the persistent schedule");
        free(list);
        if (st == STOF_OK && share && p->d_sched)
            p->sched_shared = (unsigned char)stof__fmtcache_keep_array(
                ctx, p->fmt_ref, sched_key, p->d_sched,
                sizeof(int32_t) * nl, p->persist_heads);
    }
    stof__log(ctx, STOF_LOG_DEBUG,
              "attention formats: the format %.3f ms (%s), row order %.3f "
              "(%s), persistent schedule %.3f (%s; its deal %.3f)",
              t_fmt,
              fmt_hit ? "kept" : p->formats_gpu ? "built on the GPU"
                                                : "built on the host",
              t_order,
              p->order_shared ? "shared" : "own", stof__now_ms() - t_sched,
              !persist ? "none" : p->sched_shared ? "shared" : "own", t_deal);
done:
    free(order);
    free(perm);
    stof_mask_free(&grouped);
    stof_format_free(&f);
    return st;
}

stof_status stof__plan_new(stof_context *ctx, const stof_attention_desc *d,
                           float scale, const stof_candidate *c,
                           stof_plan **out)
{
    *out = NULL;
    if (c->kind < STOF_KERNEL_REFERENCE || c->kind > STOF_KERNEL_WGMMA_GATHER)
        return stof__fail(ctx, STOF_ERR_UNSUPPORTED,
                          "kernel kind %d is not available", c->kind);
    stof_plan *p = calloc(1, sizeof(*p));
    if (!p)
        return stof__fail(ctx, STOF_ERR_OUT_OF_MEMORY,
                          "out of memory allocating a plan");
    p->ctx = ctx;
    p->desc = *d;
    stof__attention_normalise(&p->desc);
    p->scale = scale;
    p->kind = c->kind;
    p->cfg = c->cfg;
    p->cfg.gather = c->kind == STOF_KERNEL_ROWWISE;
    p->wcfg = c->wcfg;
    p->wcfg.gather = c->kind == STOF_KERNEL_WGMMA_GATHER;
    if (c->kind != STOF_KERNEL_REFERENCE && c->splits > 1) {
        if (c->splits > STOF_SPLIT_MAX) {
            free(p);
            return stof__fail(ctx, STOF_ERR_UNSUPPORTED,
                              "split-KV over %d CTAs: at most %d",
                              c->splits, STOF_SPLIT_MAX);
        }
        p->n_split = c->splits;
    }
    p->cfg.split = p->wcfg.split = p->n_split > 1;
    /* Score modifiers: the kernel must have been built for the problem's
     * (records name theirs; the search builds what the problem needs). */
    const int mods = stof__attn_mods(d);
    const int cmods = c->kind >= STOF_KERNEL_WGMMA ? c->wcfg.mods
                                                   : c->cfg.mods;
    if (c->kind != STOF_KERNEL_REFERENCE && cmods != mods) {
        free(p);
        return stof__fail(ctx, STOF_ERR_UNSUPPORTED,
                          "the %s kernel was built for score modifiers %d, "
                          "the problem needs %d (soft-cap 1, ALiBi 2, "
                          "bias 4)",
                          stof__kernel_kind_name(c->kind), cmods, mods);
    }
    p->mods = mods;
    p->cfg.mods = p->wcfg.mods = mods;
    p->desc.alibi_slopes = NULL; /* the caller's memory: p->d_alibi */
    stof_status mst = stof__plan_mods_prepare(ctx, p, d);
    if (mst != STOF_OK) {
        free(p);
        return mst;
    }
    p->group = c->kind == STOF_KERNEL_ROWWISE ||
                       c->kind == STOF_KERNEL_WGMMA_GATHER
                   ? c->group
                   : 0;
    p->predicted_ms = c->predicted_ms;
    p->source = "compiled";
    *out = p;
    return STOF_OK;
}

/* Validate, allocate a plan for candidate c and upload its data; no
 * kernel yet. */
static stof_status plan_prepare(stof_context *ctx, const stof_attention_desc *d,
                                const stof_mask *m, const stof_candidate *c,
                                stof_plan **out)
{
    *out = NULL;
    float scale = 0.0f;
    stof_status st = stof__attention_check_ready(ctx, d, m, &scale);
    if (st != STOF_OK)
        return st;
    stof_plan *p = NULL;
    if ((st = stof__plan_new(ctx, d, scale, c, &p)) != STOF_OK)
        return st;
    p->mask_words = m->words_per_row;
    p->mask_density = stof_mask_density(m);
    stof_mask_digest(m, NULL, p->mask_hex);
    const double t0 = stof__now_ms();
    st = c->kind == STOF_KERNEL_REFERENCE ? prepare_reference(ctx, p, m)
                                          : prepare_tiles(ctx, p, m);
    p->formats_ms = stof__now_ms() - t0;
    if (st != STOF_OK) {
        stof__plan_release(p);
        return st;
    }
    *out = p;
    return STOF_OK;
}

stof_status stof__plan_from_cubin(stof_context *ctx,
                                  const stof_attention_desc *d,
                                  const stof_mask *m, const stof_candidate *c,
                                  const void *cubin, size_t size,
                                  uint64_t hash, stof_plan **out)
{
    *out = NULL;
    if ((!cubin && !hash) || size < 4)
        return stof__fail(ctx, STOF_ERR_INVALID_ARGUMENT,
                          "no cubin to load");
    stof_plan *p = NULL;
    stof_status st = plan_prepare(ctx, d, m, c, &p);
    if (st != STOF_OK)
        return st;
    if ((st = stof__plan_attach(ctx, p, cubin, size, hash)) != STOF_OK) {
        stof__plan_release(p);
        return st;
    }
    *out = p;
    return stof__ok(ctx);
}

stof_status stof__kernel_cubin(stof_context *ctx, const stof_candidate *c,
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
    stof_status st = stof__attention_check_desc(ctx, d, m, &scale);
    if (st != STOF_OK)
        return st;
    stof_candidate pick;
    memset(&pick, 0, sizeof(pick));
    int ranked = 0;
    if (choice) {
        pick = *choice;
    } else if (ctx->device.ok) {
        stof_attention_desc nd = *d;
        stof__attention_normalise(&nd);
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
    const double t0 = stof__now_ms();
    st = stof__kernel_cubin(ctx, &pick, d->head_dim, d->dtype, &cubin, &size);
    p->compile_ms = stof__now_ms() - t0;
    if (st == STOF_OK)
        st = stof__plan_attach(ctx, p, cubin, size, 0);
    free(cubin);
    if (st != STOF_OK) {
        stof__plan_release(p);
        return st;
    }
    if (pick.kind == STOF_KERNEL_REFERENCE && !choice)
        p->source = "fallback";
    *out = p;
    return stof__ok(ctx);
}

void stof_plan_free(stof_plan **pp)
{
    if (!pp || !*pp)
        return;
    stof__plan_release(*pp);
    *pp = NULL;
}
