/*
 * attn_wgmma.h - host side of the Hopper (sm_90a) block-wise sparse
 * attention kernel, jit_templates/attn_wgmma.cu: warp-specialised, TMA
 * loads, wgmma for Q K^T and P V. It consumes the same device tile BSR as
 * the mma.sync kernel (stof_block_format, uploaded by
 * stof__block_format_upload from a stof_format built with block_m 128 and
 * the cfg's block_n) and has the same semantics (see attn_block.cu).
 * Runs only on compute capability 9.0 (the cubin is sm_90a).
 */
#ifndef STOF_ATTN_WGMMA_H
#define STOF_ATTN_WGMMA_H

#include "attn_block.h"
#include "internal.h"

/* Query rows per CTA by default (two consumer warpgroups of 64 rows); see
 * stof_wgmma_cfg.block_m for the 64-row mode. */
#define STOF_WGMMA_BLOCK_M 128

/* Kernel configuration: block_n keys per tile (64 or 128), stages K/V slots
 * in flight (2..4), overlap 1 = the softmax of tile t runs while the P V
 * wgmma of tile t-1 does (FlashAttention-3's intra-warpgroup pipelining),
 * 0 = the two GEMMs back to back. gather 0 = block mode: the tile BSR
 * (stof_block_format), TMA loads (stof__wgmma_launch); 1 = gather mode
 * (GATHER=1): each row block's compacted key list (stof_rowwise_format,
 * built with block_m 128), K/V rows copied by key index with cp.async,
 * optional query-row permutation (stof__wgmma_gather_launch).
 * block_m: query rows per CTA, 128 (or 0, the same) = two consumer
 * warpgroups, or 64 = one consumer warpgroup and 256 threads, two CTAs per
 * SM when the shared memory allows (for masks structured in 64-row blocks,
 * e.g. bigbird:64, whose 64 x 64 blocks are exactly full), or 192 = three
 * consumer warpgroups and 512 threads (head_dim 64, block mode, no split,
 * no ALiBi or bias tensor: FlashAttention-3's tile for head_dim 64) on a
 * 64-row format whose every three consecutive row blocks list the same
 * tiles, all full (stof__wgmma_uniform_triples: dense masks), without a
 * row order. The format must be built with
 * stof__wgmma_format_block_m(c) rows. A cfg initialised with only the
 * first three fields is block mode with 128 rows. */
typedef struct stof_wgmma_cfg {
    int block_n, stages, overlap;
    int gather;
    int block_m;
    int split; /* 1: the split-KV kernel (SPLIT=1, attn_split.h) */
    int mods;  /* STOF_MOD_* (attn_split.h): SOFTCAP=1 / ALIBI=1 builds */
    /* 1: the persistent kernel (PERSIST=1; block mode, not split): a grid
     * of at most one CTA per SM slot (stof__wgmma_persist_ctas, passed as
     * stof_attn_ext.ctas) walks the row blocks of every (batch, head), the
     * next one's Q and first K/V tiles loading under the current one's
     * last tiles and epilogue (two Q buffers). */
    int persist;
} stof_wgmma_cfg;

/* The query rows per CTA of c: 64, 128 or 192 (block_m 0 counts as 128). */
int stof__wgmma_block_m(const stof_wgmma_cfg *c);

/* The row blocks of the format c runs on: 64 for block_m 192, else
 * stof__wgmma_block_m(c). */
int stof__wgmma_format_block_m(const stof_wgmma_cfg *c);

/* The CTAs' row blocks of c on a problem of seq_q query rows. */
int stof__wgmma_row_blocks(const stof_wgmma_cfg *c, int seq_q);

/* 1 when a 64-row block format f can serve block_m 192: every tile FULL
 * and row blocks 3g, 3g + 1, 3g + 2 listing the same key blocks (decided
 * without f->col_idx, which may then be NULL, when every row block lists
 * every key block). */
int stof__wgmma_uniform_triples(const stof_format *f);

/* 1 when the kernel supports (head_dim, *c): head_dim 64, 128 or 256
 * (256: block_m 128, block_n 64, 2 stages, block mode), the sizes above,
 * gather and split 0 or 1, block_m 0, 64, 128 or 192 (see above) and,
 * when `dev` is given,
 * its shared memory fits the device's opt-in limit. Otherwise 0 with the
 * reason in why[n] (may be NULL). Says nothing about the
 * device's architecture (see stof__wgmma_device_ok). */
int stof__wgmma_cfg_valid(const stof_device *dev, int head_dim,
                          const stof_wgmma_cfg *c, char *why, size_t n);

/* 1 when `dev` can run the kernel (usable, compute capability 9.0). */
int stof__wgmma_device_ok(const stof_device *dev);

/* Whether the wgmma kernels' launches take d's strides (as they check
 * them: non-negative multiples of 8 elements under 2^38, none 0 on a
 * dimension of more than one; an expanded K/V, say, has a head stride of
 * 0): planning and ranking leave the kernels out otherwise. */
int stof__wgmma_strides_ok(const stof_attention_desc *d);

/* CTAs of c that one SM holds: two for 64-row CTAs whose shared memory
 * fits twice (the registers allow two), else one. */
int stof__wgmma_ctas_per_sm(int head_dim, const stof_wgmma_cfg *c);

/* The CTAs of a persistent launch of c on dev: stof__wgmma_ctas_per_sm per
 * SM; at least 1. */
int stof__wgmma_persist_ctas(const stof_device *dev, int head_dim,
                             const stof_wgmma_cfg *c);

/* The (batch, head) pairs a group of the persistent schedule takes on dev
 * for problem d (stof_attn_ext.persist_heads): as many as keep their K
 * and V within a third of the L2 (48 MB assumed without a device), whole
 * K/V heads (a multiple of the GQA group), at least one K/V head; 0 when
 * every pair fits (one group: the schedule by row block over all heads). */
int stof__wgmma_persist_group(const stof_device *dev,
                              const stof_attention_desc *d);

/* The largest load of `slots` CTAs under the persistent kernel's deal
 * (attn_wgmma.cu, wg_sched) of nrb row blocks of bh (batch, head)s, the
 * row block of rank r weighing w[r] (w heaviest first) plus `over` an
 * item; hg: the schedule (stof_attn_wgmma_params.persist_hg: 0 in order,
 * G > 0 groups of G heads, -G the same groups in pairs of ranks). t:
 * scratch of `slots` doubles. */
double stof__wgmma_persist_deal_max(const double *w, int nrb, int64_t bh,
                                    int hg, int slots, double over,
                                    double *t);

/* At most this many items (row blocks x (batch, head)s) in a list
 * schedule (4 MB of int32): larger problems keep persist_hg's deal. */
#define STOF_PERSIST_LIST_MAX ((int64_t)1 << 20)

/* The persistent kernel's list schedule (stof_attn_ext.sched): the items,
 * numbered as the kernel's deal numbers them (rank * bh + (batch, head);
 * rank r weighing w[r], w heaviest first, plus `over` an item), a group of
 * hg (batch, head)s after another (hg <= 0: one group), in a group rank by
 * rank then head by head, each to the slot with the least work so far
 * (the lower slot on a tie): the CTAs share a group's K and V in the L2
 * and end about together. A malloc'ed int32 array of slots + 1 offsets
 * (slot x's items are list[off[x]] .. list[off[x + 1] - 1]) then the
 * items, *n its length; NULL (n 0) without memory or past
 * STOF_PERSIST_LIST_MAX items. */
int32_t *stof__wgmma_persist_list(const double *w, int nrb, int64_t bh,
                                  int hg, int slots, double over, size_t *n);

/* stof__wgmma_persist_list for a persistent launch of c on format f (its
 * row blocks weighed as stof__wgmma_row_order weighs them, in groups of
 * stof__wgmma_persist_group), for the launch's CTAs: stof__wgmma_persist_
 * ctas, or the items when fewer (a list is for one CTA count); NULL for
 * 192-row CTAs. */
int32_t *stof__wgmma_format_persist_list(const stof_device *dev,
                                         const stof_attention_desc *d,
                                         const stof_wgmma_cfg *c,
                                         const stof_format *f, size_t *n);

/* The persistent schedule for problem d on dev (persist_hg), row blocks of
 * work row_work[0..nrb-1] (any order, any unit) dealt to `slots` CTAs: the
 * groups of stof__wgmma_persist_group, by rank (G) or in pairs of ranks
 * (-G), whichever leaves the most loaded CTA lighter, where that is
 * within 3% of the in-order deal's; else 0 (in order). */
int stof__wgmma_persist_heads(const stof_device *dev,
                              const stof_attention_desc *d,
                              const double *row_work, int nrb, int slots);

/* stof__wgmma_persist_heads for a persistent launch of c on format f (its
 * row blocks weighed as stof__wgmma_row_order weighs them). */
int stof__wgmma_format_persist_heads(const stof_device *dev,
                                     const stof_attention_desc *d,
                                     const stof_wgmma_cfg *c,
                                     const stof_format *f);

/* Dynamic shared memory of one CTA in bytes, with bm = stof__wgmma_block_m:
 *   bm*head_dim*2 (Q; twice when persist) + 2 * stages*block_n*head_dim*2
 *   (K, V) + stages*bm*(block_n/32)*4 (bitmaps) + 8*(1 + 4*stages
 *   (+ 3 when persist)) (mbarriers)
 *   + 8*stages (meta) + (gather ? 2*2*block_n*4 : 0) (key row offsets)
 *   + 1024 (alignment slack: the kernel aligns its buffers to 1024 bytes
 * for the 128-byte swizzle). 0 for a NULL cfg. */
size_t stof__wgmma_smem_bytes(int head_dim, const stof_wgmma_cfg *c);

/* Compile attn_wgmma.cu for (head_dim, dt, *c) (with GATHER=1 when
 * c->gather, BLOCK_M=64 for 64-row cfgs) with NVRTC for sm_90a, load
 * it into the device's primary context and set its dynamic shared memory
 * limit. The caller owns *mod (cuModuleUnload inside stof__ctx_push/pop).
 * Errors: STOF_ERR_UNSUPPORTED (cfg invalid, or the device is not cc 9.0;
 * the message says why), STOF_ERR_NVRTC, STOF_ERR_NO_DEVICE, STOF_ERR_CUDA. */
/* The two halves of stof__wgmma_load: the NVRTC compile for sm_90a
 * (*cubin malloc'd; no GPU work, so pool threads may call it with private
 * contexts), and loading a cubin (from a compile or the tuning database)
 * with its shared memory limit set. */
stof_status stof__wgmma_compile(stof_context *ctx, int head_dim,
                                stof_dtype dt, const stof_wgmma_cfg *c,
                                void **cubin /* OUT */, size_t *size /* OUT */);
/* The same with one more define ("NAME=value", or NULL): diagnostic
 * builds (WG_TRACE=1, stof-trace-wgmma), never a search candidate. */
stof_status stof__wgmma_compile_with(stof_context *ctx, int head_dim,
                                     stof_dtype dt, const stof_wgmma_cfg *c,
                                     const char *extra,
                                     void **cubin /* OUT */,
                                     size_t *size /* OUT */);
stof_status stof__wgmma_load_cubin(stof_context *ctx, int head_dim,
                                   const stof_wgmma_cfg *c, const void *cubin,
                                   CUmodule *mod /* OUT */,
                                   CUfunction *fn /* OUT */);
/* The same through the context's module cache (its `size` bytes; size 0:
 * loaded apart); give the module back with stof__module_release. hash:
 * the cubin's XXH3-64 when known (0: computed); with cubin NULL only a
 * module the cache holds is used (stof__module_load_shared_hashed). */
stof_status stof__wgmma_load_cubin_shared(stof_context *ctx, int head_dim,
                                          const stof_wgmma_cfg *c,
                                          const void *cubin, size_t size,
                                          uint64_t hash,
                                          CUmodule *mod /* OUT */,
                                          CUfunction *fn /* OUT */);

stof_status stof__wgmma_load(stof_context *ctx, int head_dim, stof_dtype dt,
                             const stof_wgmma_cfg *c, CUmodule *mod /* OUT */,
                             CUfunction *fn /* OUT */);

/* Enqueue the kernel on stream `s`: n_row_blocks x batch * heads CTAs in
 * grid x (stof_cta_rb_bh) (persistent cfgs: min(x->ctas, n_row_blocks * batch * heads) CTAs, or one
 * per row block and head when x or x->ctas is 0), 128 + 2 * block_m
 * threads, stof__wgmma_smem_bytes() of dynamic shared memory. Builds
 * the three TMA tensor maps (q, k, v over (head_dim, seq, heads, batch))
 * from the pointers and d's strides with cuTensorMapEncodeTiled, resolved
 * from the already loaded libcuda.
 * d: strides filled, dtype and head_dim those fn was loaded with, every
 * stride >= 0 and a multiple of 8 elements; q, k, v, o 16-byte aligned.
 * bf: block_m stof__wgmma_format_block_m(c), block_n c->block_n, seq_q /
 * seq_k as d (block_m 192: a format stof__wgmma_uniform_triples accepted).
 * row_order: 0 (block_m 192: must be), or a device array of
 * bf->n_row_blocks int32 (a permutation
 * of the row blocks): CTA x then computes row block row_order[x %
 * n_row_blocks] (the host
 * puts heavy row blocks first, see stof__wgmma_row_order).
 * scale: softmax scale, 0 = 1/sqrt(head_dim); must be > 0.
 * c->gather must be 0 (gather kernels go through stof__wgmma_gather_launch).
 * The caller makes the device's context current. Touches no context:
 * thread-safe. STOF_ERR_INVALID_ARGUMENT on a mismatch, STOF_ERR_UNSUPPORTED
 * when cuTensorMapEncodeTiled is missing, STOF_ERR_CUDA when encoding a map
 * or the launch fails. */
stof_status stof__wgmma_launch(CUfunction fn, const stof_wgmma_cfg *c,
                               int head_dim, const stof_attention_desc *d,
                               float scale, const stof_block_format *bf,
                               CUdeviceptr row_order, CUdeviceptr q,
                               CUdeviceptr k, CUdeviceptr v, CUdeviceptr o,
                               CUstream s, const stof_api *api);
/* The same writing what x asks besides O (the log-sum-exps; a split
 * kernel's partials), as stof__block_launch_ex. */
stof_status stof__wgmma_launch_ex(CUfunction fn, const stof_wgmma_cfg *c,
                                  int head_dim, const stof_attention_desc *d,
                                  float scale, const stof_block_format *bf,
                                  CUdeviceptr row_order, CUdeviceptr q,
                                  CUdeviceptr k, CUdeviceptr v, CUdeviceptr o,
                                  const stof_attn_ext *x, CUstream s,
                                  const stof_api *api);

/* Enqueue the gather kernel (fn loaded with c->gather = 1):
 * rf->n_row_blocks x batch * heads CTAs in grid x, 128 + 2 * block_m threads,
 * stof__wgmma_smem_bytes() of dynamic shared memory. No tensor maps: every
 * load is a cp.async.
 * rf: uploaded by stof__rowwise_format_upload from a format built with
 * block_m stof__wgmma_block_m(c) and block_n c->block_n; seq_q / seq_k as
 * d.
 * row_order: 0 or a device array of rf->n_row_blocks int32 (see
 * stof__wgmma_gather_row_order).
 * q_rows: 0 or a device array of d->seq_q int32: row r of the format is row
 * q_rows[r] of q and o (each tensor row at most once, e.g. the perm of
 * stof__mask_group_rows when the format was built on the grouped mask).
 * d: strides filled, every stride >= 0 and a multiple of 8 elements, and
 * (seq_k - 1) * k/v seq stride / 8 < 2^32 (row offsets are kept in 16-byte
 * units in 32 bits); q, k, v, o 16-byte aligned.
 * Otherwise as stof__wgmma_launch (STOF_ERR_INVALID_ARGUMENT on a
 * mismatch, STOF_ERR_CUDA when the launch fails). */
stof_status stof__wgmma_gather_launch(CUfunction fn, const stof_wgmma_cfg *c,
                                      int head_dim,
                                      const stof_attention_desc *d,
                                      float scale,
                                      const stof_rowwise_format *rf,
                                      CUdeviceptr row_order,
                                      CUdeviceptr q_rows, CUdeviceptr q,
                                      CUdeviceptr k, CUdeviceptr v,
                                      CUdeviceptr o, CUstream s,
                                      const stof_api *api);
stof_status stof__wgmma_gather_launch_ex(
    CUfunction fn, const stof_wgmma_cfg *c, int head_dim,
    const stof_attention_desc *d, float scale, const stof_rowwise_format *rf,
    CUdeviceptr row_order, CUdeviceptr q_rows, CUdeviceptr q, CUdeviceptr k,
    CUdeviceptr v, CUdeviceptr o, const stof_attn_ext *x, CUstream s,
    const stof_api *api);

/* A heavy-first order of f's row blocks: order[0 .. n_row_blocks-1] gets
 * the row block indices sorted by decreasing work (tiles, a partial tile
 * counting 1.25), ties by index. For the kernel's row_order (upload it). */
void stof__wgmma_row_order(const stof_format *f, int32_t *order /* OUT */);

/* The same for the gather kernel: row blocks by decreasing number of listed
 * keys (f's row-wise part; the compacted tiles follow from it), ties by
 * index. Falls back to the identity when f has no row-wise part. */
void stof__wgmma_gather_row_order(const stof_format *f,
                                  int32_t *order /* OUT */);

#endif /* STOF_ATTN_WGMMA_H */
