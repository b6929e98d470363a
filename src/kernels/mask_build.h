/*
 * mask_build.h - the host side of jit_templates/mask_build.cu: the
 * block-wise sparse format of a mask family built on the GPU, per sequence
 * of a batch, from the family's program and instance data in device memory,
 * into a workspace allocated once (at planning) for the largest shape.
 */
#ifndef STOF_MASK_BUILD_H
#define STOF_MASK_BUILD_H

#include "internal.h"
#include "spec.h"

/* The most program nodes and the deepest stack the kernels evaluate
 * (MB_MAX_STACK in mask_build.cu). */
#define STOF_MB_MAX_NODES 128
#define STOF_MB_MAX_STACK 32
/* The workspace's statistics, int64 each: [0] non-empty tiles, [1] partial
 * tiles, [2] most tiles of a row block, [3] overflow (never with a
 * workspace of stof__mb_workspace_new), [5] whether the last build saw
 * document ids that decrease (then it compared them element by element:
 * right, slower). */
#define STOF_MB_STATS 8

/* The -D definitions of the leaf kinds (MB_LEAF_*=n) that every template
 * including mask_eval.cuh is compiled with: into buf, pointed to by defs;
 * returns their number, STOF_MB_N_LEAF_DEFINES. */
#define STOF_MB_N_LEAF_DEFINES 14
int stof__mb_leaf_defines(char (*buf)[48], const char **defs);

/* The loaded kernels (one module). */
typedef struct stof_mb_kernels {
    CUmodule module;
    CUfunction seqs, docs, classify, scan, fill;
    CUfunction rw_or, rw_keys, rw_bits, rw_tiles; /* row-wise formats */
    int shared;                /* the context's module: not unloaded */
} stof_mb_kernels;

/* Compile (NVRTC, for the context's device; once per context: the cubin
 * stays on the context) and load the builder (once per context too: *k is
 * a shared view that stof__mb_unload leaves loaded; stof_close unloads).
 * Errors: STOF_ERR_NVRTC, STOF_ERR_NO_DEVICE, STOF_ERR_CUDA. */
stof_status stof__mb_load(stof_context *ctx, stof_mb_kernels *k /* OUT */);
void stof__mb_unload(stof_context *ctx, stof_mb_kernels *k);

/* A workspace for batch sequences of at most seq_q x seq_k and one tiling:
 * the program, tile classes and counts, the index arrays with room for
 * every tile and the pool of partial-tile bitmaps sized by
 * stof__mb_pool_bound (so a build never overflows). One allocation. */
typedef struct stof_mb_workspace {
    CUdeviceptr mem;
    size_t bytes;
    CUdeviceptr prog, cls, cnt, stats;
    CUdeviceptr doc_lo, doc_hi; /* int32[batch * seq_k], or 0 (no docs) */
    CUdeviceptr row_ptr;    /* int32[batch * n_rb + 1] */
    CUdeviceptr col_idx;    /* int32[tile_cap] */
    CUdeviceptr kind;       /* uint8[tile_cap] */
    CUdeviceptr bitmap_idx; /* int32[tile_cap]: the slot of a partial tile
                               ((b * n_rb + i) * n_cb + j), or -1 */
    CUdeviceptr bitmaps;    /* uint32[pool_cap * block_m * bwpr]: the
                               partial tiles' bitmaps, in pool slots */
    CUdeviceptr tslot;      /* int32[tile_cap]: a partial tile's pool slot
                               by (b * n_rb + i) * n_cb + j (scratch) */
    CUdeviceptr pk;         /* packed: int32[2 * (n_seq + 1)], or 0 */
    int n_prog;
    int n_seq;              /* packed: sequences (batch is 1); 0: padded */
    int row_one;            /* every row is query row 0
                               (stof__family_row_one) */
    int heads;              /* > 1: formats per (element, head): sequence
                               s is element s / heads, head s % heads
                               (batch = elements x heads) */
    int batch, seq_q, seq_k, block_m, block_n, n_rb, n_cb, bwpr;
    int64_t tile_cap;       /* every tile of the batch */
    int64_t pool_cap;       /* partial-tile bitmaps the pool holds */
} stof_mb_workspace;

/* The most partial tiles any instance of a program (n nodes) can have, per
 * sequence, in block_m x block_n tiles: each leaf's boundary lines (a
 * diagonal crosses at most ceil(block_m / block_n) + 1 tiles of a row
 * block, a vertical line one, a horizontal line one per key block) plus
 * those of the length box and of the padded last tiles; a tile partial in
 * a combination is partial in one of its leaves or on the box. Leaves
 * without such lines (strided columns, documents, dilation above 1) may
 * make every tile partial: then n_rb x n_cb. */
int64_t stof__mb_pool_bound(const int32_t *prog, int n, int n_rb, int n_cb,
                            int block_m, int block_n);

/* Allocate a workspace and upload the family's program. Errors:
 * STOF_ERR_UNSUPPORTED (a spec the GPU does not evaluate: random, bigbird
 * with more than STOF_PROG_MAX_RANDOM random blocks a row, or too long; or
 * more tiles than 32-bit indices hold), STOF_ERR_CUDA. */
stof_status stof__mb_workspace_new(stof_context *ctx,
                                   const stof_mask_family *fam, int batch,
                                   int seq_q, int seq_k, int block_m,
                                   int block_n,
                                   stof_mb_workspace *ws /* OUT */);
/* stof__mb_workspace_new for `batch` elements of `heads` heads: for a
 * family with head_* leaves (a window per head) the formats are per
 * (element, head) (batch x heads sequences, ws->heads = heads), else per
 * element. */
stof_status stof__mb_workspace_heads(stof_context *ctx,
                                     const stof_mask_family *fam, int batch,
                                     int heads, int seq_q, int seq_k,
                                     int block_m, int block_n,
                                     stof_mb_workspace *ws /* OUT */);
void stof__mb_workspace_free(stof_context *ctx, stof_mb_workspace *ws);
/* block_m = block_n = 0 makes a workspace with the program and the
 * statistics only (n_rb = n_cb = 0): what the family reference kernel
 * reads. A packed family (stof__family_n_seq) makes a packed workspace:
 * batch 1, one format of at most seq_q x seq_k rows and keys holding its
 * n_seq sequences where each run's cu_q / cu_k say (clamped on the GPU by
 * stof__mb_prepare), the pool sized for every sequence's lines. */

/* Instance data in device memory (0 = the default, as in stof_mask_data). */
typedef struct stof_mb_data {
    CUdeviceptr q_len, k_len, q_offset, prefix, doc_id;
    int64_t doc_stride; /* 0 = seq_k */
    CUdeviceptr seed;   /* uint64 per sequence */
    CUdeviceptr cu_q, cu_k; /* packed workspaces: the offsets (required;
                               cu_k 0 = cu_q) */
    int total_q, total_k;   /* packed: this run's rows (0 = the most) */
    CUdeviceptr bitmap;     /* `bitmap` leaves: uint32 words, or 0 */
    int64_t bitmap_stride;  /* words between sequences (0: shared) */
    int bitmap_words;       /* words per row (0: ceil(seq_k / 32)) */
    CUdeviceptr head_window; /* int32 per head, or 0 (no limit) */
} stof_mb_data;

/* Packed workspaces: enqueue the clamping of the run's offsets (what
 * stof__mb_build does first, and what the family reference kernel reads);
 * nothing for others. STOF_ERR_INVALID_ARGUMENT without offsets. */
stof_status stof__mb_prepare(const stof_mb_kernels *k,
                             const stof_mb_workspace *ws,
                             const stof_mb_data *data, CUstream s,
                             const stof_api *api);

/* Enqueue the kernels on `s` (three, four with document ids). Instance
 * data is clamped, not checked: lengths to 0..seq_q / seq_k, offsets and
 * prefixes to 0..2^30; document ids that decrease are compared element by
 * element. The caller makes the device's context
 * current. No allocation, no synchronisation: capturable in a graph. */
stof_status stof__mb_build(const stof_mb_kernels *k,
                           const stof_mb_workspace *ws,
                           const stof_mb_data *data, CUstream s,
                           const stof_api *api);

/* Launch fn(first, params) on grid (gx, gy) of `threads` threads, where
 * params is the builder's parameter block for ws and data (a kernel of
 * another template that evaluates the family through mask_eval.cuh, such
 * as attn_reference.cu's stof_attn_reference_family; `first` points to its
 * first argument). */
stof_status stof__mb_launch_with(CUfunction fn, const void *first,
                                 const stof_mb_workspace *ws,
                                 const stof_mb_data *data, unsigned gx,
                                 unsigned gy, unsigned threads, CUstream s,
                                 const stof_api *api);

/* The row-wise format (the gather kernels' compacted key lists, as
 * stof__rowwise_format_upload makes from stof_format_build's row-wise part)
 * of the family's default instance at seq_q x seq_k, in block_m x block_n
 * tiles (block_n a multiple of 32), rows grouped by residue class mod
 * `group` when it is above 1 (as stof__mask_group_rows orders them), built
 * on the GPU with the loaded builder k; waits for it. *nk (malloc'd, may
 * be NULL): the listed keys of each row block. Partial tiles' bitmap
 * slots are in any order. */
#include "attn_block.h"
stof_status stof__mb_rowwise_build(stof_context *ctx, const stof_mb_kernels *k,
                                   const stof_mask_family *fam, int seq_q,
                                   int seq_k, int block_m, int block_n,
                                   int group, stof_rowwise_format *rf /* OUT */,
                                   int32_t **nk /* OUT */);

#endif /* STOF_MASK_BUILD_H */
