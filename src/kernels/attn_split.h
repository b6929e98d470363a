/*
 * attn_split.h - what the attention kernels' launches share beyond the
 * tensors (attn_split.c): split-KV for short queries against long keys
 * (jit_templates/attn_split.cuh: the kernels built with SPLIT=1 run
 * n_split CTAs per row block, each over a share of its tiles, and write
 * normalised partial outputs and log-sum-exps to a workspace;
 * stof_attn_combine, in the same module, merges them into O), the score
 * modifiers (SOFTCAP=1, ALIBI=1, BIAS=1) and the option defines of a
 * build.
 */
#ifndef STOF_ATTN_SPLIT_H
#define STOF_ATTN_SPLIT_H

#include "internal.h"

/* The most CTAs a row block's tiles are split over. */
#define STOF_SPLIT_MAX 64

/* What an attention launch reads and writes besides q, k, v and O: each
 * row's log-sum-exp (lse: 0, or float[batch][heads][seq_q]); for a
 * SPLIT=1 kernel, the partials: n_split >= 1 CTAs per row block (0 for an
 * unsplit kernel), o_part float[n_split][batch * heads][seq_q][head_dim]
 * and lse_part float[n_split][batch * heads][seq_q] (see
 * stof__split_parts); for an ALIBI=1 kernel, the heads' slopes (alibi:
 * float[heads] on the device); for a BIAS=1 kernel, the additive bias
 * (16-bit, the dtype; its strides are the descriptor's bias_stride). The
 * soft-cap comes from the descriptor. A NULL stof_attn_ext: O only. */
typedef struct stof_attn_ext {
    CUdeviceptr lse;
    int n_split;
    CUdeviceptr o_part, lse_part;
    CUdeviceptr alibi;
    CUdeviceptr bias;
    int ctas; /* persistent kernels: CTAs to launch (0: one per work item) */
    int persist_heads; /* persistent kernels: the schedule, 0 in order, G
                        * groups of G (batch, head)s, -G the same in pairs
                        * of row blocks (stof__wgmma_persist_heads) */
    CUdeviceptr sched; /* persistent wgmma kernels: 0, or the list schedule
                        * for `ctas` CTAs (stof__wgmma_persist_list),
                        * which replaces persist_heads' deal */
    CUdeviceptr k_lim; /* 0, or int32[batch] (a family instance's k_len):
                        * V rows of sequence b at or past k_lim[b] (clamped
                        * to 0..seq_k) are never read into O, whatever they
                        * hold (block and wgmma kernels; gather kernels
                        * read listed keys only) */
} stof_attn_ext;

/* Score modifiers (stof_block_cfg.mods, stof_wgmma_cfg.mods): the kernel
 * built with SOFTCAP=1 (descriptor softcap > 0), ALIBI=1 (slopes per
 * head) and / or BIAS=1 (descriptor bias = 1). ALiBi and the bias need
 * the key indices: block mode only (STOF_MOD_BLOCK_ONLY). */
enum {
    STOF_MOD_SOFTCAP = 1,
    STOF_MOD_ALIBI = 2,
    STOF_MOD_BIAS = 4,
    STOF_MOD_ALL = 7,
    STOF_MOD_BLOCK_ONLY = STOF_MOD_ALIBI | STOF_MOD_BIAS
};

/* The modifiers a problem needs. */
int stof__attn_mods(const stof_attention_desc *d);

/* A kernel built for `mods` launched on problem d with x: 1 when its
 * soft-cap matches d's and it gets ALiBi slopes and a bias exactly when
 * built for them. */
int stof__mods_match(int mods, const stof_attention_desc *d,
                     const stof_attn_ext *x);

/* Whether a build's options are valid: gather and split 0 or 1, mods
 * within STOF_MOD_ALL, ALiBi and the bias only in block mode (gather 0).
 * 1, or 0 with the reason in why (n bytes). */
int stof__attn_options_valid(int gather, int split, int mods, char *why,
                             size_t n);

/* Append the attention templates' option defines that are set (GATHER=1,
 * SPLIT=1, SOFTCAP=1, ALIBI=1, BIAS=1) to defs[0 .. n-1] (room for 5
 * more); returns the new count. */
int stof__attn_option_defines(int gather, int split, int mods,
                              const char **defs, int n);

/* The soft-cap's launch values for softmax scale `scale`: cap_in = scale /
 * softcap, cap_out = softcap * log2(e) (both 0 without a soft-cap). */
void stof__softcap_params(float softcap, float scale, float *cap_in,
                          float *cap_out);

/* Bytes of the workspace n_split partials of problem d need (d's batch,
 * heads, seq_q and head_dim); 0 when n_split < 1 or the size overflows. */
size_t stof__split_bytes(int n_split, const stof_attention_desc *d);

/* x's partials inside the workspace `ws` (stof__split_bytes(n_split, d)
 * bytes or more) for problem d: o_part at ws, lse_part after it. */
void stof__split_parts(CUdeviceptr ws, int n_split,
                       const stof_attention_desc *d, stof_attn_ext *x);

/* The grid's z size of an attention launch: 1 for an unsplit kernel
 * (split_kernel 0; x NULL or x->n_split 0 or 1), x->n_split for a SPLIT=1
 * kernel (x with n_split 1..STOF_SPLIT_MAX and both partials); 0 when they
 * do not match. */
unsigned stof__split_grid_z(int split_kernel, const stof_attn_ext *x);

/* Enqueue stof_attn_combine (fn, from the SPLIT=1 kernel's module) for
 * problem d (the attention launch's descriptor) on stream s: merges x's
 * n_split partials into o (d's o_stride, 16-bit) and x->lse when not 0.
 * Contract as the attention launchers (thread-safe, no context touched);
 * STOF_ERR_INVALID_ARGUMENT on bad arguments, STOF_ERR_CUDA when the
 * launch fails. */
stof_status stof__split_combine_launch(CUfunction fn,
                                       const stof_attention_desc *d,
                                       const stof_attn_ext *x, CUdeviceptr o,
                                       CUstream s, const stof_api *api);

#endif
