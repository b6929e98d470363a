/*
 * attn_block.h - the host side of jit_templates/attn_block.cu
 * (attn_block.c): the block-wise sparse FlashAttention-2 kernel (mma.sync,
 * sm_80+) and its row-wise gather mode, their configurations, the device
 * forms of the sparse formats they read, compiling, loading and launching.
 */
#ifndef STOF_ATTN_BLOCK_H
#define STOF_ATTN_BLOCK_H

#include "attn_split.h"
#include "internal.h"

/* ------------------------------------------------------------------------ */
/* Block-wise kernel (attn_block.c)                                          */
/* ------------------------------------------------------------------------ */
/* The block-wise sparse FlashAttention-2 kernel, jit_templates/attn_block.cu:
 * one CTA per (query row block, batch * head) walking the non-empty tiles of
 * a stof_format's tile BSR built with the same block_m / block_n. */

/* Tile shape and pipeline of the kernel: BLOCK_M query rows x BLOCK_N keys
 * per tile (64/128 x 32/64/128), WARPS warps (4 or 8; each owns
 * block_m / warps rows, a multiple of 16), STAGES K/V tiles in flight
 * (1..3). gather: 0 = block-wise tiles of the tile BSR (stof_block_format,
 * stof__block_launch); 1 = the row-wise kernel (GATHER=1): each row block
 * gathers the keys of its compacted list into dense tiles
 * (stof_rowwise_format, stof__rowwise_launch). A zero-initialised cfg is
 * block-wise. */
typedef struct stof_block_cfg {
    int block_m, block_n, warps, stages;
    int gather;
    int split; /* 1: the split-KV kernel (SPLIT=1, attn_split.h) */
    int mods;  /* STOF_MOD_* (attn_split.h): SOFTCAP=1 / ALIBI=1 builds */
} stof_block_cfg;

/* 1 when the kernel supports (head_dim, *c): head_dim 32/64/128/256, the
 * sizes above, gather and split 0 or 1, the accumulators fit the
 * registers without spilling, and, when `dev` is given, the shared memory
 * fits its opt-in limit. Otherwise 0 with the reason in why[n] (may be
 * NULL). */
int stof__block_cfg_valid(const stof_device *dev, int head_dim,
                          const stof_block_cfg *c, char *why, size_t n);

/* Dynamic shared memory of one CTA in bytes:
 *   block_m*head_dim*2 (Q) + 2 * stages*block_n*head_dim*2 (K, V)
 *   + stages*block_m*(block_n/32)*4 (bitmaps) + round16(stages*8) (meta)
 *   + gather ? (stages+1)*2*block_n*4 (key row offsets) : 0. */
size_t stof__block_smem_bytes(int head_dim, const stof_block_cfg *c);

/* Device copy of a format's tile BSR, in one allocation (`mem`), each array
 * 256-byte aligned. row_ptr is converted to int32 (it always fits for the
 * kernel's tile sizes: at most 2^14 x 2^15 tiles; upload fails with
 * STOF_ERR_UNSUPPORTED otherwise). Arrays of zero length still get a valid
 * pointer. */
typedef struct stof_block_format {
    CUdeviceptr mem;        /* the allocation; 0 when empty/freed */
    size_t bytes;           /* its size */
    CUdeviceptr row_ptr;    /* int32[n_row_blocks + 1] */
    CUdeviceptr col_idx;    /* int32[n_tiles]: key block of each tile */
    CUdeviceptr kind;       /* uint8[n_tiles]: STOF_TILE_PARTIAL / _FULL */
    CUdeviceptr bitmap_idx; /* int32[n_tiles]: partial index or -1 */
    CUdeviceptr bitmaps;    /* uint32[n_partial * block_m * words_per_row] */
    int seq_q, seq_k, block_m, block_n;
    int n_row_blocks, n_col_blocks, bitmap_words_per_row;
    int64_t n_tiles, n_partial;
    /* 0: one format for every batch element (uploads); n_row_blocks: batch
     * element b's row block i is row_ptr[b * n_row_blocks + i] .. (the GPU
     * builder's workspace, mask_build.h; the block kernels only);
     * -n_row_blocks: element b's head h's at row_ptr[(b * heads + h) *
     * n_row_blocks + i] (families with a window per head). */
    int rp_stride;
} stof_block_format;

/* Upload `f` (any block sizes; the kernel needs block_m/block_n equal to its
 * cfg's). On failure *out is zeroed and nothing stays allocated. Brackets
 * its driver calls with stof__ctx_push/pop. */
stof_status stof__block_format_upload(stof_context *ctx, const stof_format *f,
                                      stof_block_format *out /* OUT */);
/* Free the device memory (NULL or an already freed one is harmless) and zero
 * *bf. */
void stof__block_format_free(stof_context *ctx, stof_block_format *bf);

/* The two halves of stof__block_load: the NVRTC compile (*cubin malloc'd;
 * no GPU work: pool threads call it with private contexts, and with an
 * explicit arch it needs no device), and loading a cubin (from a compile
 * or the tuning database) with its shared memory limit set. */
stof_status stof__block_compile(stof_context *ctx, int head_dim,
                                stof_dtype dt, const stof_block_cfg *c,
                                const char *arch_or_NULL,
                                void **cubin /* OUT */, size_t *size /* OUT */);
stof_status stof__block_load_cubin(stof_context *ctx, int head_dim,
                                   const stof_block_cfg *c, const void *cubin,
                                   CUmodule *mod /* OUT */,
                                   CUfunction *fn /* OUT */);
/* The same through the context's module cache (its `size` bytes; size 0:
 * loaded apart); give the module back with stof__module_release. hash:
 * the cubin's XXH3-64 when known (0: computed); with cubin NULL only a
 * module the cache holds is used (stof__module_load_shared_hashed). */
stof_status stof__block_load_cubin_shared(stof_context *ctx, int head_dim,
                                          const stof_block_cfg *c,
                                          const void *cubin, size_t size,
                                          uint64_t hash,
                                          CUmodule *mod /* OUT */,
                                          CUfunction *fn /* OUT */);

/* Compile attn_block.cu for (head_dim, dt, *c) (with GATHER=1 when
 * c->gather) with NVRTC for `arch_or_NULL`
 * (NULL = the context's device), load it into the device's primary context
 * and set the function's dynamic shared memory limit. On success the caller
 * owns *mod (cuModuleUnload inside stof__ctx_push/pop). Errors:
 * STOF_ERR_UNSUPPORTED (cfg invalid, message says why), STOF_ERR_NVRTC,
 * STOF_ERR_NO_DEVICE, STOF_ERR_CUDA. */
stof_status stof__block_load(stof_context *ctx, int head_dim, stof_dtype dt,
                             const stof_block_cfg *c, const char *arch_or_NULL,
                             CUmodule *mod /* OUT */, CUfunction *fn /* OUT */);

/* Enqueue the kernel on stream `s`: bf->n_row_blocks x batch * heads CTAs
 * in grid x (stof_cta_rb_bh), warps*32 threads, stof__block_smem_bytes() of dynamic shared memory.
 * `d` must have its strides filled (as stof_attention_desc_init does) and
 * match bf (seq_q, seq_k) and the kernel (head_dim, dtype); `c` must be the
 * cfg fn was loaded with (gather = 0) and match bf's block sizes. scale: the softmax
 * scale (0 = 1/sqrt(head_dim)). The caller makes the device's context
 * current (stof_attention_run pushes it). Touches no context: thread-safe.
 * Returns STOF_ERR_INVALID_ARGUMENT on a mismatch, STOF_ERR_CUDA when the
 * launch fails. */
stof_status stof__block_launch(CUfunction fn, const stof_block_cfg *c,
                               int head_dim, const stof_attention_desc *d,
                               float scale, const stof_block_format *bf,
                               CUdeviceptr q, CUdeviceptr k, CUdeviceptr v,
                               CUdeviceptr o, CUstream s, const stof_api *api);
/* The same writing what x asks besides O (NULL: nothing): each row's
 * log-sum-exp (natural log of the sum of exp(scale * q.k) over its allowed
 * keys; -inf for none) and, for a split kernel (c->split), the partials
 * of x->n_split CTAs per row block instead of O (grid z = n_split; then
 * stof__split_combine_launch writes O and the log-sum-exps). The _ex
 * variants of the other launchers below do the same. */
stof_status stof__block_launch_ex(CUfunction fn, const stof_block_cfg *c,
                                  int head_dim, const stof_attention_desc *d,
                                  float scale, const stof_block_format *bf,
                                  CUdeviceptr q, CUdeviceptr k, CUdeviceptr v,
                                  CUdeviceptr o, const stof_attn_ext *x,
                                  CUstream s, const stof_api *api);

/* Row-wise (gather) kernel: the device form of a format's row-wise part for
 * the kernel's BLOCK_N (the format's block_n). Row block i's keys are
 * keys[key_ptr[i] .. key_ptr[i+1]-1] (rw_ptr / rw_keys, as int32); its
 * compacted tiles, ceil(keys / block_n) of them, are entries tile_ptr[i] ..
 * tile_ptr[i+1]-1: tile t holds list entries t*block_n .. t*block_n +
 * block_n - 1. A tile is STOF_TILE_FULL when every row of the block inside
 * seq_q allows every listed key of the tile (entries past the list's end do
 * not count), else STOF_TILE_PARTIAL; a partial tile's bitmap is the
 * row-wise bitmap (rw_bitmaps at rw_bitmap_off, rw_words words a row)
 * repacked per tile as in the block format: block_m rows of
 * bitmap_words_per_row = ceil(block_n / 32) words at bitmaps + bitmap_idx[e]
 * * block_m * bitmap_words_per_row, bit (r, j) = word j/32, bit j%32 of row
 * r; bits past the list's end and rows past seq_q are 0. So every tile
 * start is 16-byte aligned and full tiles cost no bitmap. One allocation,
 * each array 256-byte aligned; counts beyond int32 fail with
 * STOF_ERR_UNSUPPORTED. */
typedef struct stof_rowwise_format {
    CUdeviceptr mem;        /* the allocation; 0 when empty/freed */
    size_t bytes;           /* its size */
    CUdeviceptr key_ptr;    /* int32[n_row_blocks + 1] */
    CUdeviceptr keys;       /* int32[n_keys] */
    CUdeviceptr tile_ptr;   /* int32[n_row_blocks + 1] */
    CUdeviceptr kind;       /* uint8[n_tiles]: STOF_TILE_PARTIAL / _FULL */
    CUdeviceptr bitmap_idx; /* int32[n_tiles]: partial index or -1 */
    CUdeviceptr bitmaps;    /* uint32[n_partial * block_m * words_per_row] */
    int seq_q, seq_k, block_m, block_n;
    int n_row_blocks, bitmap_words_per_row;
    int max_tiles;          /* the most compacted tiles of one row block */
    int64_t n_keys, n_tiles, n_partial;
} stof_rowwise_format;

/* The one allocation a row-wise format lives in: byte offsets of its
 * arrays (each 256-byte aligned) and the total, with 256 bytes more so
 * that an empty array still has a valid, distinct pointer. `bitmaps` is
 * the number of block_m x bwpr-word bitmaps it holds. 0 when the size
 * overflows. */
typedef struct stof_rowwise_layout {
    size_t key_ptr, keys, tile_ptr, kind, bitmap_idx, bitmaps, total;
} stof_rowwise_layout;
size_t stof__rowwise_layout(int n_row_blocks, int64_t n_keys, int64_t n_tiles,
                            int64_t bitmaps, int block_m, int bwpr,
                            stof_rowwise_layout *l /* OUT */);
/* rf's allocation and array pointers: mem laid out as l says. */
void stof__rowwise_format_at(stof_rowwise_format *rf, CUdeviceptr mem,
                             const stof_rowwise_layout *l);

/* The compacted tiling of `f`'s row-wise part for its block_n, without a
 * GPU (for cost models): the number of listed keys, compacted tiles, partial
 * ones among them, and the most tiles of one row block. Any out-pointer may
 * be NULL. Returns STOF_ERR_INVALID_ARGUMENT for a format without row-wise
 * part. */
stof_status stof__rowwise_stats(const stof_format *f, int64_t *n_keys,
                                int64_t *n_tiles, int64_t *n_partial,
                                int *max_tiles);

/* Upload `f`'s row-wise part for the gather kernel (tiles of f->block_n
 * keys; the kernel needs block_m/block_n equal to its cfg's). On failure
 * *out is zeroed and nothing stays allocated. Brackets its driver calls with
 * stof__ctx_push/pop. */
stof_status stof__rowwise_format_upload(stof_context *ctx,
                                        const stof_format *f,
                                        stof_rowwise_format *out /* OUT */);
/* Free the device memory (NULL or an already freed one is harmless) and zero
 * *rf. */
void stof__rowwise_format_free(stof_context *ctx, stof_rowwise_format *rf);

/* Enqueue the gather kernel (fn loaded by stof__block_load with c->gather =
 * 1) on stream `s`: rf->n_row_blocks x batch * heads CTAs in grid x,
 * warps*32 threads, stof__block_smem_bytes() of dynamic shared memory. Contract and
 * errors as stof__block_launch (thread-safe, touches no context); `c` must
 * have gather = 1 and match rf's block sizes, and the K and V sequence
 * strides must be multiples of 8 elements with (seq_k - 1) * stride / 8 <
 * 2^32 (the kernel keeps row offsets in 16-byte units in 32 bits).
 * Query rows in format order (stof__rowwise_launch_qperm with q_rows 0). */
stof_status stof__rowwise_launch(CUfunction fn, const stof_block_cfg *c,
                                 int head_dim, const stof_attention_desc *d,
                                 float scale, const stof_rowwise_format *rf,
                                 CUdeviceptr q, CUdeviceptr k, CUdeviceptr v,
                                 CUdeviceptr o, CUstream s,
                                 const stof_api *api);

/* The same with a query-row permutation (QPERM). q_rows: 0, or a device
 * array of d->seq_q int32 (4-byte aligned): row r of the format is row
 * q_rows[r] of q and o (each tensor row at most once). Use it with a format
 * built on a row-permuted mask, e.g. the perm of stof__mask_group_rows: for
 * dilated:W:D every row block then lists only the keys of one residue class
 * (half the tiles for D = 2). STOF_ERR_INVALID_ARGUMENT also when q_rows is
 * not 4-byte aligned. */
stof_status stof__rowwise_launch_qperm(CUfunction fn, const stof_block_cfg *c,
                                       int head_dim,
                                       const stof_attention_desc *d,
                                       float scale,
                                       const stof_rowwise_format *rf,
                                       CUdeviceptr q_rows, CUdeviceptr q,
                                       CUdeviceptr k, CUdeviceptr v,
                                       CUdeviceptr o, CUstream s,
                                       const stof_api *api);
stof_status stof__rowwise_launch_qperm_ex(
    CUfunction fn, const stof_block_cfg *c, int head_dim,
    const stof_attention_desc *d, float scale, const stof_rowwise_format *rf,
    CUdeviceptr q_rows, CUdeviceptr q, CUdeviceptr k, CUdeviceptr v,
    CUdeviceptr o, const stof_attn_ext *x, CUstream s, const stof_api *api);

#endif
