/*
 * internal.h - definitions shared by the modules of libstof. Not installed.
 */
#ifndef STOF_INTERNAL_H
#define STOF_INTERNAL_H

#include "stof.h"

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include "cuda_shim.h"

#define STOF_ERRMSG_MAX 8192

/* The primary-context state of one device, shared by everything made from a
 * context. Filled by stof__device_init(). */
typedef struct stof_device {
    int ok;                 /* 1 when usable */
    int ordinal;
    CUdevice dev;
    CUcontext pctx;         /* retained primary context */
    char name[256];
    int cc_major, cc_minor;
    int sm_count;
    int max_smem_optin;     /* bytes per block after opt-in */
    int l2_bytes;
    size_t total_mem;
    int driver_version;     /* e.g. 13000 */
    int nvrtc_major, nvrtc_minor;
    char arch[16];          /* NVRTC target, e.g. "sm_90" */
    char why[512];          /* when !ok: why the device is unusable */
} stof_device;

struct stof_db;
/* The context's tuning database, opened at the first call (a failure only
 * logs: stof works without one); NULL when unavailable (attention.c). */
struct stof_db *stof__ctx_db(stof_context *ctx);

struct stof_context {
    stof_settings settings;
    stof_status last_status;
    char errmsg[STOF_ERRMSG_MAX];
    stof_device device;
    const stof_api *api;    /* loaded driver/NVRTC table (may lack either) */
    /* The tuning database, opened at the first plan (stof_db.c). The paths
     * are copies of the settings' (which are borrowed only during
     * stof_open); user_db NULL = the default location, "" = none. */
    char *user_db;
    char **system_dbs;      /* NULL-terminated, or NULL */
    struct stof_db *db;
    int db_tried;           /* the open was attempted (success or not) */
    /* Reference-kernel cubins compiled by this context, by head_dim and
     * dtype: every search and every first use of a record verifies
     * against the reference, and one compile serves them all
     * (attention.c). */
    struct {
        int head_dim;
        stof_dtype dtype;
        void *cubin;
        size_t size;
    } ref_cubins[8];
    int n_ref_cubins;
};

/* Longest spec a mask keeps (the tuning records' mask_spec field). */
#define STOF_MASK_SPEC_MAX 256

struct stof_mask {
    char *spec;             /* the spec it was made from, or NULL (dense, or
                               longer than STOF_MASK_SPEC_MAX - 1) */
    int seq_q, seq_k;
    int words_per_row;      /* 64-bit words per row: ceil(seq_k / 64) */
    uint64_t *bits;         /* seq_q * words_per_row; bits past seq_k are 0 */
    uint64_t count;         /* allowed elements */
};

/* stof_open without a device: the settings are checked and the libraries
 * loaded, but CUDA is not initialised, so the process may fork workers
 * that open GPU contexts of their own (stof-tune). GPU calls fail with
 * STOF_ERR_NO_DEVICE. */
stof_status stof__open_cpu(stof_context **out /* OUT */,
                           const stof_settings *s);

/* Record a failure on the context and return `st`. The message is formatted
 * like printf. ctx may be NULL (then only `st` is returned). Also forwards
 * the message to the log callback at STOF_LOG_ERROR. */
stof_status stof__fail(stof_context *ctx, stof_status st, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;

/* Mark the last call on ctx as successful (clears the message). */
stof_status stof__ok(stof_context *ctx);

/* Log through the settings' callback when the level is enabled. */
void stof__log(stof_context *ctx, stof_log_level level, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;

/* Check a public argument: `cond` must hold, else fail with
 * STOF_ERR_INVALID_ARGUMENT naming the argument. */
#define STOF_CHECK_ARG(ctx, cond, ...)                                         \
    do {                                                                       \
        if (!(cond))                                                           \
            return stof__fail((ctx), STOF_ERR_INVALID_ARGUMENT, __VA_ARGS__);  \
    } while (0)

/* Small helpers for JSON/text output into caller buffers: append to a
 * growable string. */
typedef struct stof_str {
    char *p;
    size_t len, cap;
    int oom;
} stof_str;
void stof__str_printf(stof_str *s, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;
void stof__str_free(stof_str *s);
/* Write a reason into why[n] (either may be NULL/0) and return 0: the
 * "not valid, because ..." of the *_cfg_valid checks. */
int stof__why(char *why, size_t n, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;
/* Copy s into a caller buffer with the size-then-fetch convention. */
stof_status stof__str_out(const stof_str *s, char *buf, size_t n,
                          size_t *needed);

/* Mask internals (mask.c). */
stof_status stof__mask_alloc(stof_context *ctx, int seq_q, int seq_k,
                             stof_mask **out);
void stof__mask_recount(stof_mask *m);

/* stof_format_build with either part optional (a kernel needs one): a part
 * left out is empty (block-wise: no tiles, row_ptr all 0, counts 0;
 * row-wise: no keys, rw_ptr all 0, rowwise_fill 0). Skipping the part a
 * kernel does not read makes warm plans of large masks several times
 * cheaper. */
enum { STOF__FORMAT_BLOCK = 1, STOF__FORMAT_ROWWISE = 2 };
stof_status stof__format_build_parts(stof_context *ctx, const stof_mask *m,
                                     int block_m, int block_n, int parts,
                                     stof_format **fmt /* OUT */);

/* The tuning-database key of an attention problem on ctx's device
 * (problem_key.c): 32 hex digits into key; the hashed canonical text into
 * text[text_n] when text is not NULL. */
void stof__attention_key(const stof_context *ctx, const stof_attention_desc *d,
                         const char *mask_hex, char key[33], char *text,
                         size_t text_n);

/* fp16 / bf16 on the host (half.c): round to nearest even. */
uint16_t stof__f32_to_half(float f, stof_dtype dt);
float stof__half_to_f32(uint16_t h, stof_dtype dt);

/* Query-row grouping (mask_group.c). The smallest period D in 2..16 such
 * that every allowed (q, k) has (q - k) % D == 0, or 1 when there is none
 * (or the mask is tiny or empty). */
int stof__mask_row_period(const stof_mask *m);
/* A copy of m with its rows ordered by residue class mod `period` (row q's
 * class is q % period; within a class, ascending q), and the permutation:
 * row i of *out is row (*perm)[i] of m. Both are owned by the caller
 * (stof_mask_free, free). */
stof_status stof__mask_group_rows(stof_context *ctx, const stof_mask *m,
                                  int period, stof_mask **out /* OUT */,
                                  int32_t **perm /* OUT */);

/* The C reference for masked attention (ref_cpu.c): inputs and output are
 * fp32 arrays laid out with the descriptor's strides (call it with a
 * descriptor whose strides are filled, e.g. by stof_attention_desc_init).
 * Rows with no allowed key give zeros. */
stof_status stof__ref_attention(const stof_attention_desc *d,
                                const stof_mask *m, const float *q,
                                const float *k, const float *v, float *o);

/* Templates embedded at build time (templates_gen.c, made by
 * scripts/embed_templates.py). */
typedef struct stof_template {
    const char *name;      /* file name, e.g. "attn_reference.cu" */
    const char *source;    /* NUL-terminated */
    size_t size;
} stof_template;
extern const stof_template stof__templates[];
extern const int stof__n_templates;
const stof_template *stof__template_find(const char *name);

/* ------------------------------------------------------------------------ */
/* Block-wise kernel (attn_block.c)                                          */
/* ------------------------------------------------------------------------ */
/* The block-wise sparse FlashAttention-2 kernel, jit_templates/attn_block.cu:
 * one CTA per (query row block, batch * head) walking the non-empty tiles of
 * a stof_format's tile BSR built with the same block_m / block_n. */
#ifndef STOF_ATTN_BLOCK_DECLS
#define STOF_ATTN_BLOCK_DECLS

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
} stof_block_cfg;

/* 1 when the kernel supports (head_dim, *c): head_dim 32/64/128/256, the
 * sizes above, gather 0 or 1, the accumulators fit the registers without
 * spilling, and, when `dev` is given, the shared memory fits its opt-in
 * limit. Otherwise 0 with the reason in why[n] (may be NULL). */
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

/* Enqueue the kernel on stream `s`: grid (bf->n_row_blocks, batch * heads),
 * warps*32 threads, stof__block_smem_bytes() of dynamic shared memory.
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
 * 1) on stream `s`: grid (rf->n_row_blocks, batch * heads), warps*32
 * threads, stof__block_smem_bytes() of dynamic shared memory. Contract and
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

#endif /* STOF_ATTN_BLOCK_DECLS */
/* ---------------------- end of block-wise kernel ------------------------ */

#endif /* STOF_INTERNAL_H */
