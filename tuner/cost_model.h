/*
 * cost_model.h - the analytical model that predicts the time of an
 * attention kernel candidate from the mask's sparse format and the device,
 * and the candidate list it ranks (stage 1 of the search).
 *
 * The model, for a candidate (kind, cfg) on format f (built with the cfg's
 * BLOCK_M x BLOCK_N):
 *
 *   work of query row block i, in tile units:
 *     block-wise: w_i = full_i + (1 + mu) * partial_i
 *     row-wise:   w_i = gamma * ceil(keys_i / BN) * (1 + mu * (1 - fill))
 *   tile time on a fully occupied SM:
 *     tau = 4 * BM * BN * D / (R_sm * e(cfg, D))
 *   CTA time (one CTA per row block and batch*head, o CTAs share an SM):
 *     t_i = o * (w_i * tau + tau0)
 *   kernel time = makespan of the CTAs in launch order on SMs * o slots
 *                 (greedy list scheduling), plus the launch latency.
 *
 * The wgmma kernel (sm_90a) runs one CTA per SM and is modelled the same
 * way with its own rate and efficiencies; it walks its row blocks heaviest
 * first, so its CTAs are scheduled in that order.
 *
 * A tile costs at least its DRAM traffic: 2 * BN * D 16-bit K/V values
 * divided by the CTAs reading the same key block at about the same time
 * (row blocks listing it x query heads per K/V head), at the SM's share
 * of the bandwidth. This binds decode-like problems (one row block per
 * head), where the tensor-core time of a mostly empty tile does not.
 * Split-KV candidates (splits CTAs per row block, each w_i / splits of the
 * work, plus a merge pass over the partials) are ranked when the unsplit
 * grid fills the GPU less than twice.
 *
 * R_sm is the tensor-core rate per SM for mma.sync or wgmma (by compute
 * capability), e(cfg, D) the fraction a configuration reaches on dense
 * work (calibrated on an H200 and an H100: bench/RESULTS.md), mu the
 * extra cost of a masked tile, gamma that of gathering K/V rows, tau0 the
 * per-CTA cost of loading Q and writing O, o the CTAs per SM that fit
 * (registers, shared memory, threads; for 64-row wgmma CTAs, which have
 * one consumer warpgroup each, o also sets e). The makespan captures
 * waves and imbalance (causal's long last rows, bigbird's global rows).
 */
#ifndef STOF_COST_MODEL_H
#define STOF_COST_MODEL_H

#include "attn_wgmma.h"
#include "attn_block.h"
#include "internal.h"

enum {
    STOF_KERNEL_REFERENCE = 0,
    STOF_KERNEL_BLOCK = 1,
    STOF_KERNEL_ROWWISE = 2,
    STOF_KERNEL_WGMMA = 3,       /* wgmma over the tile BSR */
    STOF_KERNEL_WGMMA_GATHER = 4 /* wgmma over compacted key lists */
};

typedef struct stof_candidate {
    int kind;               /* STOF_KERNEL_* */
    stof_block_cfg cfg;     /* block / row-wise kernels; for wgmma,
                               block_m = 128 and block_n as in wcfg */
    stof_wgmma_cfg wcfg;    /* wgmma kernels (gather set for
                               STOF_KERNEL_WGMMA_GATHER) */
    int group;              /* row-wise kernels: query rows grouped by
                               residue class mod `group` (0/1: not) */
    int splits;             /* split-KV: CTAs sharing each row block's
                               tiles (2..STOF_SPLIT_MAX; 0/1: not split);
                               cfg.split and wcfg.split are set with it */
    double predicted_ms;    /* model time */
    double work_tiles;      /* sum of w_i over row blocks (one batch*head) */
    int ctas_per_sm;        /* o */
} stof_candidate;

/* Predict the time of (kind, cfg) on format f for descriptor d on device
 * dev. f must have been built with cfg's block sizes. Returns the time in
 * ms (fills the other fields of *out when not NULL). */
double stof__cost_predict(const stof_device *dev, const stof_attention_desc *d,
                          const stof_format *f, int kind,
                          const stof_block_cfg *cfg, stof_candidate *out);
/* The same for the wgmma kernels (f built with stof__wgmma_block_m(wc) x
 * wc->block_n; wc->gather selects the gather kernel). */
double stof__cost_predict_wgmma(const stof_device *dev,
                                const stof_attention_desc *d,
                                const stof_format *f, const stof_wgmma_cfg *wc,
                                stof_candidate *out);

/* The prediction of base's kernel (kind, cfg / wcfg, group) with each row
 * block's tiles split over `splits` CTAs (split-KV; 0/1: not split),
 * merged by a second pass; *out (may be base) gets the candidate. */
double stof__cost_predict_split(const stof_device *dev,
                                const stof_attention_desc *d,
                                const stof_format *f,
                                const stof_candidate *base, int splits,
                                stof_candidate *out);

/* The split counts worth ranking for a kernel with ctas_per_sm CTAs per
 * SM on format f (2, 4, 8, ... into counts[], at most 6): none when the
 * unsplit grid already fills the GPU twice; otherwise those that keep at
 * least two tiles per CTA, at most four waves and 256 MB of partials.
 * Returns how many. */
int stof__cost_split_counts(const stof_device *dev,
                            const stof_attention_desc *d, const stof_format *f,
                            int ctas_per_sm, int *counts /* OUT */);

/* Stage 1: enumerate every valid (kind, cfg) for the problem, build the
 * formats they need, predict each and sort by predicted time (fastest
 * first). At most `max` candidates are written to `cands`; *n is set to the
 * number written. Returns STOF_ERR_UNSUPPORTED when no fast kernel supports
 * the problem (the caller falls back to the reference kernel). */
stof_status stof__cost_rank(stof_context *ctx, const stof_attention_desc *d,
                            const stof_mask *m, stof_candidate *cands,
                            int max, int *n /* OUT */);

/* The formats candidates are predicted on, one per tiling (the block-wise
 * part at least), made on demand: a failure is recorded on the context. */
typedef stof_status (*stof_format_fn)(void *user, int block_m, int block_n,
                                      stof_format **f /* OUT */);

/* Stage 1 over the block-format kinds only (block, wgmma) on the formats
 * of make (a mask family's, built on the GPU from a sample instance). */
stof_status stof__cost_rank_formats(stof_context *ctx,
                                   const stof_attention_desc *d,
                                   stof_format_fn make, void *user,
                                   stof_candidate *cands, int max,
                                   int *n /* OUT */);



#endif
