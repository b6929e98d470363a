/*
 * attn_split.c - the host side of attn_split.h: the split-KV partials'
 * workspace and the launch of the kernel that merges them, the score
 * modifiers' launch values, the option defines of a build.
 */
#include "attn_split.h"

#include <stdint.h>
#include <string.h>

/* Mirrors struct stof_attn_combine_params in jit_templates/attn_split.cuh
 * (same field order and types); both sides check the size. */
typedef struct stof_attn_combine_params {
    CUdeviceptr o_part, lse_part, o, lse;
    int64_t o_stride[3];
    int batch, heads, seq_q, n_split;
} stof_attn_combine_params;
_Static_assert(sizeof(stof_attn_combine_params) == 4 * 8 + 3 * 8 + 4 * 4,
               "stof_attn_combine_params must match attn_split.cuh");

#define ALIGN 256u

/* Rows of all (batch, head) pairs: batch * heads * seq_q. */
static uint64_t bh_rows(const stof_attention_desc *d)
{
    return (uint64_t)d->batch * (uint64_t)d->heads * (uint64_t)d->seq_q;
}

static size_t o_part_bytes(int n_split, const stof_attention_desc *d)
{
    const uint64_t b = (uint64_t)n_split * bh_rows(d) * (uint64_t)d->head_dim *
                       4u;
    return (size_t)((b + ALIGN - 1) / ALIGN * ALIGN);
}

size_t stof__split_bytes(int n_split, const stof_attention_desc *d)
{
    if (!d || n_split < 1 || n_split > STOF_SPLIT_MAX || d->batch < 1 ||
        d->heads < 1 || d->seq_q < 1 || d->head_dim < 1)
        return 0;
    const uint64_t rows = (uint64_t)n_split * bh_rows(d);
    /* At most 64 x 2^31 x 2^31 rows: check before multiplying further. */
    if (rows > ((uint64_t)1 << 40) / ((uint64_t)d->head_dim + 1u))
        return 0;
    return o_part_bytes(n_split, d) + (size_t)rows * 4u;
}

void stof__split_parts(CUdeviceptr ws, int n_split,
                       const stof_attention_desc *d, stof_attn_ext *x)
{
    x->n_split = n_split;
    x->o_part = ws;
    x->lse_part = ws + (CUdeviceptr)o_part_bytes(n_split, d);
}

int stof__attn_mods(const stof_attention_desc *d)
{
    return (d->softcap > 0.0f ? STOF_MOD_SOFTCAP : 0) |
           (d->alibi_slopes ? STOF_MOD_ALIBI : 0) |
           (d->bias ? STOF_MOD_BIAS : 0);
}

int stof__mods_match(int mods, const stof_attention_desc *d,
                     const stof_attn_ext *x)
{
    const int alibi = x && x->alibi, bias = x && x->bias;
    return ((mods & STOF_MOD_SOFTCAP) != 0) == (d->softcap > 0.0f) &&
           ((mods & STOF_MOD_ALIBI) != 0) == alibi &&
           ((mods & STOF_MOD_BIAS) != 0) == bias && bias == (d->bias != 0);
}

int stof__attn_options_valid(int gather, int split, int mods, char *why,
                             size_t n)
{
    if (gather != 0 && gather != 1)
        return stof__why(why, n, "gather %d: must be 0 or 1", gather);
    if (split != 0 && split != 1)
        return stof__why(why, n, "split %d: must be 0 or 1", split);
    if (mods < 0 || mods > STOF_MOD_ALL)
        return stof__why(why, n, "mods %d: must be 0..%d", mods,
                         STOF_MOD_ALL);
    if ((mods & STOF_MOD_BLOCK_ONLY) && gather)
        return stof__why(why, n, "ALiBi and the bias tensor need block mode "
                                 "(gather: the keys' indices are not at "
                                 "hand)");
    return 1;
}

int stof__attn_option_defines(int gather, int split, int mods,
                              const char **defs, int n)
{
    if (gather)
        defs[n++] = "GATHER=1";
    if (split)
        defs[n++] = "SPLIT=1";
    if (mods & STOF_MOD_SOFTCAP)
        defs[n++] = "SOFTCAP=1";
    if (mods & STOF_MOD_ALIBI)
        defs[n++] = "ALIBI=1";
    if (mods & STOF_MOD_BIAS)
        defs[n++] = "BIAS=1";
    return n;
}

void stof__softcap_params(float softcap, float scale, float *cap_in,
                          float *cap_out)
{
    *cap_in = softcap > 0.0f ? scale / softcap : 0.0f;
    *cap_out = softcap > 0.0f ? (float)(softcap * 1.4426950408889634) : 0.0f;
}

unsigned stof__split_grid_z(int split_kernel, const stof_attn_ext *x)
{
    if (!split_kernel)
        return !x || x->n_split <= 1 ? 1u : 0u;
    if (!x || x->n_split < 1 || x->n_split > STOF_SPLIT_MAX || !x->o_part ||
        !x->lse_part || x->o_part % 16u || x->lse_part % 4u)
        return 0u;
    return (unsigned)x->n_split;
}

stof_status stof__split_combine_launch(CUfunction fn,
                                       const stof_attention_desc *d,
                                       const stof_attn_ext *x, CUdeviceptr o,
                                       CUstream s, const stof_api *api)
{
    if (!fn || !d || !x || !api || !api->cuLaunchKernel || !o || o % 16u ||
        x->n_split < 1 || x->n_split > STOF_SPLIT_MAX || !x->o_part ||
        !x->lse_part || x->lse % 4u || d->batch < 1 || d->heads < 1 ||
        d->seq_q < 1)
        return STOF_ERR_INVALID_ARGUMENT;
    stof_attn_combine_params p;
    memset(&p, 0, sizeof(p));
    p.o_part = x->o_part;
    p.lse_part = x->lse_part;
    p.o = o;
    p.lse = x->lse;
    memcpy(p.o_stride, d->o_stride, sizeof(p.o_stride));
    p.batch = d->batch;
    p.heads = d->heads;
    p.seq_q = d->seq_q;
    p.n_split = x->n_split;
    /* One warp per row, four rows per 128-thread CTA. */
    const uint64_t ctas = (bh_rows(d) + 3u) / 4u;
    if (ctas > 0x7fffffffu)
        return STOF_ERR_INVALID_ARGUMENT;
    void *args[] = {&p};
    const stof_launch_opts pdl = {.pdl = STOF_PDL_IF_SM90};
    CUresult r = stof__launch(api, fn, (unsigned)ctas, 1, 1, 128, 0, s, args,
                              &pdl);
    return r == CUDA_SUCCESS ? STOF_OK : STOF_ERR_CUDA;
}
