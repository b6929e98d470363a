/*
 * layer_desc.c - a layer's descriptor: its defaults
 * (stof_layer_desc_init) and its checks (stof__layer_check_desc, with the
 * mask's sizes; stof__layer_desc_check, with the attention's shape rules),
 * each bad field named. The chain and planning: layer.c.
 */
#include "layer_int.h"

#include <math.h>
#include <stdint.h>
#include <string.h>

/* --- descriptor ---------------------------------------------------------- */

stof_status stof_layer_desc_init(stof_layer_desc *d, int batch, int seq,
                                 int hidden, int heads, stof_dtype dtype)
{
    if (!d)
        return STOF_ERR_INVALID_ARGUMENT;
    memset(d, 0, sizeof(*d));
    d->batch = batch;
    d->seq = seq;
    d->hidden = hidden;
    d->heads = heads;
    d->ffn = hidden > 0 && hidden <= (1 << 28) ? 4 * hidden : 0;
    d->dtype = dtype;
    d->act = STOF_ACT_GELU_TANH;
    d->norm = STOF_NORM_LAYER;
    d->pre_norm = 0;
    d->norm_eps = 1e-5f;
    return STOF_OK;
}

stof_status stof__layer_check_desc(stof_context *ctx,
                                   const stof_layer_desc *d,
                                   const stof_mask *m)
{
    STOF_CHECK_ARG(ctx, d, "desc is NULL");
    for (size_t i = 0; i < sizeof(d->reserved); i++)
        STOF_CHECK_ARG(ctx, !d->reserved[i],
                       "desc.reserved[%zu] is not zero (initialise the "
                       "descriptor with stof_layer_desc_init or memset)",
                       i);
    STOF_CHECK_ARG(ctx, d->batch >= 1 && d->seq >= 1,
                   "desc.batch %d, desc.seq %d: both must be at least 1",
                   d->batch, d->seq);
    STOF_CHECK_ARG(ctx, (int64_t)d->batch * d->seq <= (1 << 30),
                   "desc.batch * desc.seq = %lld tokens: at most 2^30",
                   (long long)d->batch * d->seq);
    STOF_CHECK_ARG(ctx, d->hidden >= 8 && d->hidden <= 16384 &&
                            d->hidden % 8 == 0,
                   "desc.hidden %d: a multiple of 8 in [8, 16384]",
                   d->hidden);
    STOF_CHECK_ARG(ctx, d->head_dim >= 0,
                   "desc.head_dim %d: 0 (hidden / heads) or the head's size",
                   d->head_dim);
    STOF_CHECK_ARG(ctx,
                   d->heads >= 1 &&
                       (d->head_dim > 0 || d->hidden % d->heads == 0),
                   "desc.heads %d does not divide desc.hidden %d (or give "
                   "desc.head_dim)",
                   d->heads, d->hidden);
    STOF_CHECK_ARG(ctx,
                   d->kv_heads == 0 ||
                       (d->kv_heads >= 1 && d->kv_heads <= d->heads &&
                        d->heads % d->kv_heads == 0),
                   "desc.kv_heads %d does not divide desc.heads %d (0 = "
                   "heads)",
                   d->kv_heads, d->heads);
    if (d->head_dim > 0) {
        STOF_CHECK_ARG(ctx,
                       d->head_dim >= 16 && d->head_dim <= 256 &&
                           d->head_dim % 8 == 0,
                       "desc.head_dim %d: a multiple of 8 in 16..256",
                       d->head_dim);
        STOF_CHECK_ARG(ctx, (int64_t)d->heads * d->head_dim <= 32768,
                       "desc.heads %d x desc.head_dim %d: the attention's "
                       "width at most 32768",
                       d->heads, d->head_dim);
    } else {
        const int hd = d->hidden / d->heads;
        STOF_CHECK_ARG(ctx, hd >= 16 && hd <= 256 && hd % 8 == 0,
                       "desc.hidden %d / desc.heads %d = head_dim %d: a "
                       "multiple of 8 in 16..256",
                       d->hidden, d->heads, hd);
    }
    STOF_CHECK_ARG(ctx, d->no_bias == 0 || d->no_bias == 1,
                   "desc.no_bias %d: 0 (biases) or 1 (none)", d->no_bias);
    STOF_CHECK_ARG(ctx, d->gated == 0 || d->gated == 1,
                   "desc.gated %d: 0 (act(x w1) w2) or 1 (a gated FFN)",
                   d->gated);
    STOF_CHECK_ARG(ctx, d->qk_norm == 0 || d->qk_norm == 1,
                   "desc.qk_norm %d: 0 (none) or 1 (Q and K normalised per "
                   "head)",
                   d->qk_norm);
    STOF_CHECK_ARG(ctx, !d->gated || d->ffn <= 65536,
                   "desc.ffn %d: a gated FFN's is at most 65536 (its first "
                   "projection makes 2 ffn columns)",
                   d->ffn);
    STOF_CHECK_ARG(ctx, d->ffn >= 8 && d->ffn <= 131072 && d->ffn % 8 == 0,
                   "desc.ffn %d: a multiple of 8 in [8, 131072]", d->ffn);
    STOF_CHECK_ARG(ctx,
                   d->dtype == STOF_DTYPE_FP16 || d->dtype == STOF_DTYPE_BF16,
                   "desc.dtype %d is not a stof_dtype", (int)d->dtype);
    STOF_CHECK_ARG(ctx, d->act >= STOF_ACT_NONE && d->act <= STOF_ACT_SILU,
                   "desc.act %d is not a stof_activation", (int)d->act);
    STOF_CHECK_ARG(ctx, d->norm == STOF_NORM_LAYER || d->norm == STOF_NORM_RMS,
                   "desc.norm %d is not a stof_norm_kind", (int)d->norm);
    STOF_CHECK_ARG(ctx, d->pre_norm == 0 || d->pre_norm == 1,
                   "desc.pre_norm %d: 0 (post-norm) or 1 (pre-norm)",
                   d->pre_norm);
    STOF_CHECK_ARG(ctx, isfinite(d->norm_eps) && d->norm_eps >= 0.0f,
                   "desc.norm_eps %g: a finite value >= 0 (0 = 1e-5)",
                   (double)d->norm_eps);
    STOF_CHECK_ARG(ctx,
                   d->rope_theta == 0.0f ||
                       (isfinite(d->rope_theta) && d->rope_theta > 1.0f),
                   "desc.rope_theta %g: 0 (no rotary embeddings) or a "
                   "finite base > 1 (Llama: 10000)",
                   (double)d->rope_theta);
    STOF_CHECK_ARG(ctx, !d->rope_freq || d->rope_theta == 0.0f,
                   "desc.rope_theta %g with desc.rope_freq: a rotary "
                   "embedding has a base or its frequencies (set "
                   "rope_theta 0)",
                   (double)d->rope_theta);
    const int has_rope = stof__layer_has_rope(d);
    STOF_CHECK_ARG(ctx, has_rope || d->rope_dim == 0,
                   "desc.rope_dim %d without RoPE (desc.rope_theta or "
                   "desc.rope_freq)",
                   d->rope_dim);
    STOF_CHECK_ARG(ctx, has_rope || d->rope_scale == 0.0f,
                   "desc.rope_scale %g without RoPE (desc.rope_theta or "
                   "desc.rope_freq)",
                   (double)d->rope_scale);
    /* (at most 16: Hugging Face's attention factors are 1 to about 2.5;
     * a larger one would overflow the rotated Q and K) */
    STOF_CHECK_ARG(ctx,
                   d->rope_scale == 0.0f ||
                       (d->rope_scale > 0.0f && d->rope_scale <= 16.0f),
                   "desc.rope_scale %g: 0 (1) or in (0, 16]",
                   (double)d->rope_scale);
    if (has_rope) {
        const int hd = stof__layer_hd(d);
        /* (head_dim is a multiple of 8: rope_dim 0 qualifies) */
        STOF_CHECK_ARG(ctx,
                       d->rope_dim >= 0 && d->rope_dim <= hd &&
                           d->rope_dim % 4 == 0,
                       "desc.rope_dim %d: 0 (the whole head) or a multiple "
                       "of 4 up to head_dim %d",
                       d->rope_dim, hd);
        /* Each frequency finite, >= 0, and its angle at the last position
         * finite in fp32 (else its cos and sin would be NaN). */
        const int half = (d->rope_dim > 0 ? d->rope_dim : hd) / 2;
        const float last = (float)(d->seq - 1);
        for (int i = 0; d->rope_freq && i < half; i++) {
            const volatile float ang = last * d->rope_freq[i];
            STOF_CHECK_ARG(ctx,
                           isfinite(d->rope_freq[i]) &&
                               d->rope_freq[i] >= 0.0f && isfinite(ang),
                           "desc.rope_freq[%d] %g: the frequencies are "
                           "finite, >= 0, and their angles at position %d "
                           "too",
                           i, (double)d->rope_freq[i], d->seq - 1);
        }
    }
    if (!m)
        return STOF_OK;
    const int sq = stof_mask_seq_q(m), sk = stof_mask_seq_k(m);
    STOF_CHECK_ARG(ctx, sq == d->seq && sk == d->seq,
                   "mask is %d x %d but desc.seq is %d: the mask must be "
                   "seq x seq",
                   sq, sk, d->seq);
    return STOF_OK;
}

stof_status stof__layer_desc_check(stof_context *ctx, const stof_layer_desc *d)
{
    stof_status st = stof__layer_check_desc(ctx, d, NULL);
    if (st != STOF_OK)
        return st;
    return stof__attention_shape_check(ctx, d->batch, d->heads,
                                       d->kv_heads, d->seq, d->seq,
                                       stof__layer_hd(d), d->dtype);
}
