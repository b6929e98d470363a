/*
 * attention_launch.c - enqueueing a plan's kernels (stof_attention_run's
 * last step): the attention kernel of the plan's kind and, for a split-KV
 * plan, the merge of its partials (attn_split.h); and preparing a split
 * plan's merge kernel and workspace.
 */
#include "attention_int.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

stof_status stof__plan_split_prepare(stof_context *ctx, stof_plan *p)
{
    if (p->n_split < 2)
        return STOF_OK;
    const size_t bytes = stof__split_bytes(p->n_split, &p->desc);
    if (!bytes)
        return stof__fail(ctx, STOF_ERR_UNSUPPORTED,
                          "split-KV over %d CTAs: the partials of %d x %d x "
                          "%d rows do not fit (at most %d CTAs)",
                          p->n_split, p->desc.batch, p->desc.heads,
                          p->desc.seq_q, STOF_SPLIT_MAX);
    stof_status st = (stof_status)stof__ctx_push(ctx);
    if (st != STOF_OK)
        return st;
    const stof_api *api = ctx->api;
    CUresult r = api->cuModuleGetFunction(&p->fn_combine, p->module,
                                          "stof_attn_combine");
    if (r != CUDA_SUCCESS)
        st = stof__fail(ctx, STOF_ERR_CUDA,
                        "the split-KV kernel's module has no "
                        "stof_attn_combine (CUDA error %d)",
                        (int)r);
    else if ((r = api->cuMemAlloc(&p->d_split, bytes)) != CUDA_SUCCESS) {
        p->d_split = 0;
        st = stof__fail(ctx, r == CUDA_ERROR_OUT_OF_MEMORY
                                 ? STOF_ERR_OUT_OF_MEMORY
                                 : STOF_ERR_CUDA,
                        "allocating the split-KV workspace (%zu bytes) "
                        "failed (CUDA error %d)",
                        bytes, (int)r);
    }
    stof__ctx_pop(ctx);
    return st;
}

stof_status stof__plan_mods_prepare(stof_context *ctx, stof_plan *p,
                                    const stof_attention_desc *d)
{
    if (!d->alibi_slopes)
        return STOF_OK;
    stof_status st = (stof_status)stof__ctx_push(ctx);
    if (st != STOF_OK)
        return st;
    const stof_api *api = ctx->api;
    const size_t bytes = sizeof(float) * (size_t)d->heads;
    p->alibi_host = malloc(bytes);
    if (!p->alibi_host) {
        stof__ctx_pop(ctx);
        return stof__fail(ctx, STOF_ERR_OUT_OF_MEMORY, "out of memory");
    }
    memcpy(p->alibi_host, d->alibi_slopes, bytes);
    CUresult r = api->cuMemAlloc(&p->d_alibi, bytes);
    if (r == CUDA_SUCCESS)
        r = api->cuMemcpyHtoD(p->d_alibi, d->alibi_slopes, bytes);
    if (r != CUDA_SUCCESS) {
        if (p->d_alibi)
            api->cuMemFree(p->d_alibi);
        p->d_alibi = 0;
        free(p->alibi_host);
        p->alibi_host = NULL;
        st = (stof_status)stof__cuda_fail(ctx, r, "uploading the ALiBi slopes",
                                          __FILE__, __LINE__);
    }
    stof__ctx_pop(ctx);
    return st;
}

/* The reference kernel: one warp per query row, the mask's bits. */
static CUresult launch_reference(const stof_plan *p, CUdeviceptr q,
                                 CUdeviceptr k, CUdeviceptr v, CUdeviceptr o,
                                 CUdeviceptr lse, CUdeviceptr bias,
                                 CUstream s)
{
    stof_attn_params prm;
    memset(&prm, 0, sizeof(prm));
    prm.q = q;
    prm.k = k;
    prm.v = v;
    prm.o = o;
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
    prm.kv_group = stof__kv_group(&p->desc);
    prm.lse = lse;
    prm.softcap = p->desc.softcap;
    prm.alibi = p->d_alibi;
    prm.bias = bias;
    memcpy(prm.bias_stride, p->desc.bias_stride, sizeof(prm.bias_stride));
    void *args[] = {&prm};
    /* The grid of the descriptor launched (a first-use check runs the plan
     * on a smaller one than it was made for): its row blocks times batch *
     * heads in x (stof_cta_rb_bh). */
    const int64_t gx = ((int64_t)p->desc.seq_q + REF_WARPS - 1) / REF_WARPS *
                       p->desc.batch * p->desc.heads;
    if (gx < 1 || gx > INT32_MAX)
        return CUDA_ERROR_INVALID_VALUE;
    return p->ctx->api->cuLaunchKernel(p->fn, (unsigned)gx, 1, 1, p->block[0],
                                       p->block[1], p->block[2], 0, s, args,
                                       NULL);
}

stof_status stof__plan_launch(const stof_plan *p, const stof_mask_data *data,
                              CUdeviceptr q, CUdeviceptr k, CUdeviceptr v,
                              CUdeviceptr o, CUdeviceptr lse,
                              CUdeviceptr bias, CUstream s, CUresult *cu)
{
    const stof_api *api = p->ctx->api;
    *cu = CUDA_SUCCESS;
    /* Packed runs cover this call's rows and keys only (the tensors may
     * be no larger): the kernels see seq_q = total_q, seq_k = total_k. */
    stof_attention_desc ld = p->desc;
    stof_block_format lbf = p->bf;
    if (p->n_seq && data) {
        if (data->total_q > 0)
            ld.seq_q = lbf.seq_q = data->total_q;
        if (data->total_k > 0)
            ld.seq_k = lbf.seq_k = data->total_k;
        lbf.n_row_blocks = (ld.seq_q + lbf.block_m - 1) / lbf.block_m;
        lbf.n_col_blocks = (ld.seq_k + lbf.block_n - 1) / lbf.block_n;
    }
    /* A split plan's partials, laid out for this launch's rows (at most
     * the plan's, which sized the workspace). */
    stof_attn_ext x = {.lse = lse, .alibi = p->d_alibi, .bias = bias};
    /* A family instance's key lengths: the V rows past them (a cache's
     * unwritten slots, which may hold NaN) stay out of O. Packed: the
     * builder's clamped cu_seqlens_k[n] (its offsets in pk: n + 1 query
     * offsets, then the key offsets), for the one sequence the kernels
     * see, so rows past the last sequence's keys stay out too. */
    if (p->family && !p->n_seq && data && data->k_len)
        x.k_lim = (CUdeviceptr)(uintptr_t)data->k_len;
    else if (p->family && p->n_seq && p->mb_ws.pk)
        x.k_lim = p->mb_ws.pk + 4u * (2u * (CUdeviceptr)p->n_seq + 1u);
    if (p->n_split > 1)
        stof__split_parts(p->d_split, p->n_split, &ld, &x);
    stof_status st;
    switch (p->kind) {
    case STOF_KERNEL_WGMMA:
        if (p->wcfg.persist) {
            x.ctas = stof__wgmma_persist_ctas(&p->ctx->device,
                                              p->desc.head_dim, &p->wcfg);
            x.persist_heads = p->persist_heads;
            /* The host's list only for the work it was dealt for. */
            x.sched = (int64_t)lbf.n_row_blocks * ld.batch * ld.heads ==
                              p->sched_items
                          ? p->d_sched
                          : 0;
        }
        st = stof__wgmma_launch_ex(p->fn, &p->wcfg, p->desc.head_dim, &ld,
                                   p->scale, &lbf, p->d_row_order, q, k, v,
                                   o, &x, s, api);
        break;
    case STOF_KERNEL_WGMMA_GATHER: /* (never packed: ld is p->desc) */
        st = stof__wgmma_gather_launch_ex(
            p->fn, &p->wcfg, p->desc.head_dim, &ld, p->scale, &p->rf,
            p->d_row_order, p->d_q_rows, q, k, v, o, &x, s, api);
        break;
    case STOF_KERNEL_ROWWISE:
        st = stof__rowwise_launch_qperm_ex(p->fn, &p->cfg, p->desc.head_dim,
                                           &ld, p->scale, &p->rf,
                                           p->d_q_rows, q, k, v, o, &x, s,
                                           api);
        break;
    case STOF_KERNEL_BLOCK:
        st = stof__block_launch_ex(p->fn, &p->cfg, p->desc.head_dim, &ld,
                                   p->scale, &lbf, q, k, v, o, &x, s, api);
        break;
    default:
        *cu = launch_reference(p, q, k, v, o, lse, bias, s);
        return *cu == CUDA_SUCCESS ? STOF_OK : STOF_ERR_CUDA;
    }
    if (st == STOF_OK && p->n_split > 1)
        st = stof__split_combine_launch(p->fn_combine, &ld, &x, o, s, api);
    return st;
}
