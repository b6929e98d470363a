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

/* The loaded kernels (one module). */
typedef struct stof_mb_kernels {
    CUmodule module;
    CUfunction docs, classify, scan, fill;
} stof_mb_kernels;

/* Compile (NVRTC, for the context's device; once per context: the cubin
 * stays on the context) and load the builder.
 * Errors: STOF_ERR_NVRTC, STOF_ERR_NO_DEVICE, STOF_ERR_CUDA. */
stof_status stof__mb_load(stof_context *ctx, stof_mb_kernels *k /* OUT */);
void stof__mb_unload(stof_context *ctx, stof_mb_kernels *k);

/* A workspace for batch sequences of at most seq_q x seq_k and one tiling:
 * the program, tile classes and counts, and the format arrays with room for
 * every tile (so a build never overflows). One allocation. */
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
    CUdeviceptr bitmaps;    /* uint32[tile_cap * block_m * bwpr]: a
                               partial tile's bitmap at its slot */
    int n_prog;
    int batch, seq_q, seq_k, block_m, block_n, n_rb, n_cb, bwpr;
    int64_t tile_cap;
} stof_mb_workspace;

/* Allocate a workspace and upload the family's program. Errors:
 * STOF_ERR_UNSUPPORTED (a spec the GPU does not evaluate: random, bigbird,
 * or too long; or more tiles than 32-bit indices hold), STOF_ERR_CUDA. */
stof_status stof__mb_workspace_new(stof_context *ctx,
                                   const stof_mask_family *fam, int batch,
                                   int seq_q, int seq_k, int block_m,
                                   int block_n,
                                   stof_mb_workspace *ws /* OUT */);
void stof__mb_workspace_free(stof_context *ctx, stof_mb_workspace *ws);

/* Instance data in device memory (0 = the default, as in stof_mask_data). */
typedef struct stof_mb_data {
    CUdeviceptr q_len, k_len, q_offset, prefix, doc_id;
    int64_t doc_stride; /* 0 = seq_k */
} stof_mb_data;

/* Enqueue the kernels on `s` (three, four with document ids). Instance
 * data is clamped, not checked: lengths to 0..seq_q / seq_k, offsets and
 * prefixes to 0..2^30; document ids that decrease are compared element by
 * element. The caller makes the device's context
 * current. No allocation, no synchronisation: capturable in a graph. */
stof_status stof__mb_build(const stof_mb_kernels *k,
                           const stof_mb_workspace *ws,
                           const stof_mb_data *data, CUstream s,
                           const stof_api *api);

#endif /* STOF_MASK_BUILD_H */
